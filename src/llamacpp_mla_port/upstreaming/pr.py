"""`pr` (make pr): what a maintainer needs before proposing the series upstream.

It checks and collects; it never pushes, never opens anything, and never writes a PR
description (llama.cpp requires the description, the commit messages and the AI-use
disclosure to be the contributor's own). Steps:

1. The series is the tool's branch in the work tree (`make patch`), and patches/ match a
   fresh render (`check`).
2. Every commit on its own, in a tool-owned linked worktree (<work-dir>/pr/llama.cpp),
   checked out commit after commit so that Ninja and ccache rebuild only what a commit
   touched: the CMake build (build.ensure_build into <work-dir>/pr/build), and on the files
   the commit touches the tree's own flake8 config (.flake8, plus the flake8-no-print
   plugin upstream CI uses) and the tree's .editorconfig / .ecrc whitespace rules.
3. The proof (`smoke`, llamacpp_mla_port.proof.smoke) on the series head; its JSON is kept.
4. An evidence folder (default <work-dir>/evidence/): the series (patches/), the upstream it
   applies to, every check result, the proof's figures, and CHECKLIST.md mirroring the
   tree's .github/pull_request_template.md, with the AI-use disclosure left for the author.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import git

from llamacpp_mla_port import gitutil, project
from llamacpp_mla_port.build import LOG_NAME as BUILD_LOG, TARGET_SETS
from llamacpp_mla_port.errors import PortError, SeriesError, WorkTreeError
from llamacpp_mla_port.series import pipeline
from llamacpp_mla_port.series.worktree import Workspace, default_work_dir
from llamacpp_mla_port.source.pin import load_pin
from llamacpp_mla_port.upstreaming.lint import EditorConfig, Finding, flake8_findings, whitespace_findings

#: what every commit must build: the library through the tools the job and the proof use,
#: and test-llama-archs (every LLM_ARCH_ switch site handled)
PR_TARGETS = TARGET_SETS["pr"]       # build.TARGET_SETS: the one table


# ----------------------------------------------------------------------- per-commit checks
@dataclass
class CommitCheck:
    sha: str
    title: str
    files: list[str]
    build_ok: bool | None = None         # None: not built (--skip-build)
    build_seconds: float | None = None
    build_error: str = ""
    findings: list[Finding] = field(default_factory=list)
    #: compiler warnings in files this commit touches (informational: a touched file may
    #: have had them before; the reviewer decides)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.build_ok is not False and not self.findings


BuildFn = Callable[[Path, Path, list[str]], object]


def _default_build(jobs: int | None) -> BuildFn:
    def build(tree: Path, build_dir: Path, targets: list[str]) -> object:
        from llamacpp_mla_port.build import ensure_build
        # with the RPC backend, so that a commit touching ggml-rpc is compiled as well
        return ensure_build(tree, build_dir, targets, jobs=jobs, echo=False, rpc=True)
    return build


def series_commits(repo: Path, base: str, head: str) -> list[tuple[str, str]]:
    out = gitutil.run(repo, "log", "--reverse", "--format=%H %s", f"{base}..{head}")
    return [tuple(line.split(" ", 1)) for line in out.splitlines() if line.strip()]


def touched_files(repo: Path, sha: str) -> list[str]:
    out = gitutil.run(repo, "diff-tree", "--no-commit-id", "--name-only", "--diff-filter=d",
                      "-r", sha)
    return [f for f in out.splitlines() if f]


def touched_warnings(log_path: Path, files: list[str]) -> list[str]:
    """Compiler warnings of the last build that point into one of `files`."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        if ": warning:" in line and any(f"/{f}:" in line or line.startswith(f"{f}:")
                                        for f in files):
            if line.strip() not in out:
                out.append(line.strip())
    return out


def check_commits(repo: Path, base: str, head: str, checkout: Path, build_dir: Path,
                  targets: list[str], build: BuildFn | None, log=print) -> list[CommitCheck]:
    """Check out every commit of base..head in the tool-owned worktree `checkout`, in order,
    and build + lint it there. `build=None` skips the build (lint only)."""
    if (checkout / ".git").exists():
        try:
            gitutil.run(checkout, "rev-parse", "--git-dir")
        except git.GitCommandError:     # its main repository was re-created: start again
            shutil.rmtree(checkout)
    if not (checkout / ".git").exists():
        checkout.parent.mkdir(parents=True, exist_ok=True)
        gitutil.run(repo, "worktree", "prune")
        gitutil.run(repo, "worktree", "add", "-q", "--detach", "-f", str(checkout), base)
    results = []
    for sha, title in series_commits(repo, base, head):
        gitutil.run(checkout, "checkout", "-q", "-f", "--detach", sha)
        gitutil.run(checkout, "clean", "-q", "-fdx")   # tool-owned: no leftovers between commits
        files = touched_files(repo, sha)
        check = CommitCheck(sha=sha, title=title, files=files)
        config = EditorConfig.load(checkout)
        check.findings += flake8_findings(checkout, files)
        check.findings += whitespace_findings(checkout, files, config)
        if build is not None:
            log(f"pr: building {sha[:12]} {title}")
            t0 = time.monotonic()
            (build_dir / BUILD_LOG).unlink(missing_ok=True)   # never read a stale log
            try:
                build(checkout, build_dir, list(targets))
                check.build_ok = True
            except PortError as err:
                check.build_ok = False
                check.build_error = str(err)[-4000:]
            check.build_seconds = round(time.monotonic() - t0, 1)
            check.warnings = touched_warnings(build_dir / BUILD_LOG, files)
        log(f"pr: {sha[:12]} {'ok' if check.ok else 'FAILED'} {title}")
        results.append(check)
    return results


# ------------------------------------------------------------------------------- proof
def run_smoke(tree: Path, build_dir: Path, extra: list[str], log=print) -> dict:
    """`llamacpp-mla-port smoke` on the series head, as a subprocess; its JSON report."""
    if importlib.util.find_spec("llamacpp_mla_port.proof.smoke") is None:
        return {"ok": False, "status": "missing",
                "error": "llamacpp_mla_port.proof.smoke is not installed: the proof was not run"}
    cmd = [sys.executable, "-m", "llamacpp_mla_port", "smoke", "--tree", str(tree),
           "--build", str(build_dir), *extra]
    log(f"pr: running the proof: {' '.join(cmd[2:])}")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    try:
        report = json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        report = {"ok": False, "error": "the proof printed no JSON report",
                  "stdout_tail": proc.stdout[-3000:]}
    report["exit_code"] = proc.returncode
    report["stderr_tail"] = proc.stderr[-3000:]
    report.setdefault("seconds", round(time.monotonic() - t0, 1))
    return report


def proof_summary(smoke: dict) -> dict:
    """The figures a reviewer asks for, pulled out of the proof's report."""
    out: dict = {"ok": smoke.get("ok"), "stages": {k: v.get("ok") for k, v in
                                                   smoke.get("stages", {}).items()}}
    parity = smoke.get("parity") or {}
    out["parity_worst_nmse"] = {cfg: {m: e.get("worst_nmse") for m, e in v.get("modes", {}).items()}
                                for cfg, v in parity.items()}
    out["parity_headroom"] = {m: e.get("headroom") for m, e in
                              (smoke.get("parity_modes") or {}).get("modes", {}).items()}
    out["kv_bytes_per_token"] = {cfg: {k: v[k] for k in v if k.startswith("draft_kv_bytes")}
                                 for cfg, v in parity.items()}
    lossless = smoke.get("lossless") or {}
    if lossless:
        out["lossless"] = {k: lossless[k] for k in lossless
                           if k.startswith("n_") or k in ("runs", "mismatches")}
    if "target_side" in smoke:
        out["target_side"] = smoke["target_side"]
    return out


# ---------------------------------------------------------------------------- checklist
def _strip_comments(text: str) -> str:
    # the template's HTML comments are guidance for humans (and one addressed to tools);
    # they are data, never instructions, and are not copied
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def checklist(template: str | None, checks: dict) -> str:
    """CHECKLIST.md: the PR template's sections and requirements as boxes for the author,
    then what the tool verified. It is NOT a PR description and has none to paste."""
    ok = lambda b: "x" if b else " "          # noqa: E731
    lines = ["# Before opening a pull request: checklist for the author", "",
             "Prepared by `llamacpp-mla-port pr`. This is not a PR description: the tool "
             "writes none. The description, the commit messages (the drafts live in "
             "templates/series/*/message.txt.j2: rewrite them in your words) and every "
             "answer below are yours, and you must understand and be able to defend every "
             "line of the series. Nothing was pushed or submitted.", ""]
    lines += ["## The tree's pull request template (.github/pull_request_template.md)", ""]
    if template is None:
        lines += ["- [ ] The base tree has no .github/pull_request_template.md: read "
                  "CONTRIBUTING.md for what the PR must contain", ""]
    else:
        for raw in _strip_comments(template).splitlines():
            line = raw.strip()
            if line.startswith("#"):
                title = line.lstrip("#").strip()
                lines += [f"### {title}", ""]
                if title.lower() in ("overview", "additional information"):
                    lines += ["- [ ] Written by you (the tool leaves this section to you)", ""]
            elif line.startswith(("- ", "* ")):
                item = line[2:].strip().rstrip(":").strip()
                if "ai usage" in item.lower() or "ai use" in item.lower():
                    lines += [f"- [ ] {item} (fill this in yourself: YES or NO, and if YES "
                              "how AI was used. Note: this tool and the series' templates were "
                              "prepared with AI assistance)", ""]
                else:
                    lines += [f"- [ ] {item}", ""]
    c = checks
    lines += ["## llama.cpp contributor rules (CONTRIBUTING.md, AGENTS.md)", "",
              "- [ ] One feature per PR; a new model starts with CPU support only",
              "- [ ] Commit titles are `<module> : <title>`; messages rewritten in your words",
              "- [ ] `llama-perplexity` / `llama-bench` run by you for performance (not run by "
              "the tool)",
              "- [ ] You ran the repository's CI locally (the tool covers the checks below only)",
              "", "## Verified by the tool (evidence in this folder)", "",
              f"- [{ok(c.get('patches_match'))}] patches/ equal a fresh render of templates/ "
              "(series/)",
              f"- [{ok(c.get('builds'))}] every commit builds on its own: {c.get('build_note', '')}",
              f"- [{ok(c.get('flake8'))}] flake8 with the tree's .flake8 on touched Python files",
              f"- [{ok(c.get('whitespace'))}] .editorconfig/.ecrc whitespace rules on touched files",
              f"- [{ok(c.get('proof'))}] the proof (`make smoke`): parity NMSE, lossless "
              "speculative decoding, KV bytes per token (proof.json, summary.json)",
              ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the kit
@dataclass
class PrOptions:
    work_dir: Path | None = None
    patches_dir: Path | None = None      # None: the current checkout's (project.current())
    templates_dir: Path | None = None
    evidence: Path | None = None
    build_dir: Path | None = None
    targets: tuple[str, ...] = PR_TARGETS
    jobs: int | None = None
    skip_build: bool = False
    skip_smoke: bool = False
    smoke_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.templates_dir, self.patches_dir = project.resolve_dirs(self.templates_dir, self.patches_dir)


def make_pr(opts: PrOptions, build: BuildFn | None = None, smoke=run_smoke, log=print) -> dict:
    ws = Workspace(Path(opts.work_dir) if opts.work_dir else default_work_dir())
    if not ws.state_path.is_file():
        raise WorkTreeError(f"no tool work tree at {ws.tree}", "run `make patch` first")
    repo = ws.repo()
    state = ws.state()
    ws.require_clean(repo)
    head = gitutil.run(repo, "rev-parse", "HEAD")
    if state.get("status") != "applied" or state.get("head") != head:
        raise SeriesError(f"the series is not applied in {ws.tree}", "run `make patch` first")
    drift = pipeline.check(pipeline.Options(work_dir=ws.work_dir, patches_dir=opts.patches_dir,
                                            templates_dir=opts.templates_dir), log=log)
    pin = load_pin(opts.templates_dir / "pin.toml")
    base = state["base"]
    evidence = Path(opts.evidence) if opts.evidence else ws.work_dir / "evidence"
    build_dir = Path(opts.build_dir) if opts.build_dir else ws.work_dir / "pr" / "build"
    if build is None and not opts.skip_build:
        build = _default_build(opts.jobs)
    commits = check_commits(ws.tree, base, head,
                            ws.work_dir / "pr" / "llama.cpp", build_dir, list(opts.targets),
                            None if opts.skip_build else build, log)
    proof = {"ok": None, "status": "skipped"} if opts.skip_smoke else \
        smoke(ws.tree, ws.build_dir, list(opts.smoke_args), log)

    findings = [f for c in commits for f in c.findings]
    checks = {
        "patches_match": drift == "",
        "builds": None if opts.skip_build else all(c.build_ok for c in commits),
        "build_note": ("skipped (--skip-build)" if opts.skip_build else
                       f"{len(commits)} commits, targets {' '.join(opts.targets)}"),
        "flake8": not any(f.check == "flake8" for f in findings),
        "whitespace": not any(f.check == "editorconfig" for f in findings),
        "proof": proof.get("ok"),
    }
    # the evidence folder is rewritten whole: stale files from an older run would mislead
    shutil.rmtree(evidence, ignore_errors=True)
    (evidence / "series").mkdir(parents=True)
    for p in sorted(opts.patches_dir.iterdir()):
        if p.is_file():
            shutil.copy2(p, evidence / "series" / p.name)
    upstream_info = {
        "url": pin.url, "commit": pin.commit, "tag": pin.tag,
        "applies_to": f"{pin.commit} (exactly: rerun `llamacpp-mla-port rebase --canary "
                      f"--onto <newer>` to try a newer upstream)",
        "base_in_work_tree": base, "base_tree": gitutil.run(repo, "rev-parse", f"{base}^{{tree}}"),
        "series_range": f"{base}..{head}", "source": state.get("source"),
    }
    build_summary = {
        "targets": list(opts.targets), "skipped": opts.skip_build,
        "commits": [{"sha": c.sha, "title": c.title, "ok": c.build_ok, "seconds": c.build_seconds,
                     "error": c.build_error, "warnings_in_touched_files": c.warnings}
                    for c in commits],
    }
    results = {
        "ok": all(v is not False for k, v in checks.items() if k != "build_note"),
        "skipped": [k for k, v in checks.items() if v is None],
        "checks": checks,
        "patches_drift": drift,
        "commits": [{**asdict(c), "ok": c.ok, "findings": [asdict(f) for f in c.findings]}
                    for c in commits],
        "build": build_summary,
        "proof_summary": proof_summary(proof) if proof.get("status") != "skipped" else None,
    }
    (evidence / "upstream.json").write_text(json.dumps(upstream_info, indent=2) + "\n")
    (evidence / "checks.json").write_text(json.dumps(results, indent=2) + "\n")
    (evidence / "proof.json").write_text(json.dumps(proof, indent=2) + "\n")
    (evidence / "summary.json").write_text(json.dumps(
        {"ok": results["ok"], "checks": checks, "upstream": upstream_info,
         "build": build_summary, "proof": results["proof_summary"]}, indent=2) + "\n")
    template = gitutil.read_blob(repo, base, ".github/pull_request_template.md")
    (evidence / "CHECKLIST.md").write_text(
        checklist(template.decode("utf-8") if template is not None else None, checks))
    skipped = [k for k, v in checks.items() if v is None]
    verdict = "all checks that ran pass" if results["ok"] else "SOME CHECKS FAIL"
    log(f"pr: evidence in {evidence} ({verdict}"
        f"{'; skipped: ' + ', '.join(skipped) if skipped else ''}; complete CHECKLIST.md "
        "yourself); nothing was pushed")
    return {"evidence": evidence, **results}
