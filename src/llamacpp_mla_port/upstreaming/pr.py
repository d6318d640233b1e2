"""`pr` (make pr): what a maintainer needs before proposing the series upstream.

It checks and collects; it never pushes, never opens anything, and never writes a PR
description (llama.cpp requires the description, the commit messages and the AI-use
disclosure to be the contributor's own). Steps:

1. The series is the tool's branch in the work tree (`make patch`), and patches/ match a
   fresh render (`check`).
2. Every commit on its own, in a tool-owned linked worktree (<work-dir>/pr/llama.cpp),
   checked out commit after commit so that Ninja and ccache rebuild only what a commit
   touched: the CMake build (build.ensure_build into <work-dir>/pr/build, warnings as errors), and on the files
   the commit touches the tree's own flake8 config (.flake8, plus the flake8-no-print
   plugin upstream CI uses) and the tree's .editorconfig / .ecrc whitespace rules.
3. The proof (`smoke`, llamacpp_mla_port.proof.smoke) on the series head; its JSON is kept.
4. An evidence folder (default <work-dir>/evidence/): the series (patches/), the upstream it
   applies to, every check result, the proof's figures, and CHECKLIST.md mirroring the
   tree's .github/pull_request_template.md, with the AI-use disclosure left for the author.
5. One folder per pull request (<work-dir>/pr/<stack>/, templates/port.toml [stacks]): the
   stack rendered alone on the base (patches/ and squashed.patch, both re-applied), its
   commits checked and built in order from the base, upstream's style rules on its
   messages and added lines, EVIDENCE.md (each claim, the command behind it, its result),
   DESCRIPTION-SKELETON.md (the PR template's sections with placeholders: the words are the
   author's) and CHECKLIST.md; plan.py: COMMENT-KIT.md, ISSUE-SKELETON.md, pr/PLAN.md.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from llamacpp_mla_port import process, project
from llamacpp_mla_port.process import git
from llamacpp_mla_port.build import LOG_NAME as BUILD_LOG, TARGET_SETS
from llamacpp_mla_port.errors import PortError, ProcessError, SeriesError, WorkTreeError
from llamacpp_mla_port.project import Build, Places
from llamacpp_mla_port.proof.smoke import proof_summary, prove_into
from llamacpp_mla_port.series import pipeline, stacks as stacks_mod
from llamacpp_mla_port.series.gitseries import read_series
from llamacpp_mla_port.series.spec import Stack, load_series
from llamacpp_mla_port.series.worktree import Workspace
from llamacpp_mla_port.source.pin import load_pin
from llamacpp_mla_port.upstreaming import harness_diff, plan, style, upstream_bench, walkthrough
from llamacpp_mla_port.upstreaming.upstream_bench import Settings as BenchSettings
from llamacpp_mla_port.upstreaming.pr_docs import (DESCRIPTION, EVIDENCE, checklist, description_skeleton,
                                                   evidence_markdown, stack_checklist)
from llamacpp_mla_port.upstreaming.lint import (EditorConfig, Finding, flake8_findings, introduced, tree_checks,
                                                whitespace_findings)
from llamacpp_mla_port.jsonfile import write_json

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

    def to_json(self) -> dict:
        return {**asdict(self), "ok": self.ok, "findings": [asdict(f) for f in self.findings]}


BuildFn = Callable[[Path, Path, list[str]], object]
#: upstream CI's CPU build (.github/workflows/build-cpu.yml, with the RPC backend): not native,
#: so a compiler's own header warnings on this CPU (GCC 12 avx512fintrin.h) fail no stack
PR_CMAKE_ARGS = ("-DGGML_NATIVE=OFF", "-DLLAMA_FATAL_WARNINGS=ON")
#: upstream's own tools a commit must build as well when it edits what they build or test
TOOL_TARGETS = (("ggml/", "test-backend-ops"), ("tests/test-backend-ops.cpp", "test-backend-ops"),
                ("tools/llama-bench/", "llama-bench"))


def commit_build(jobs: int | None) -> BuildFn:
    def build(tree: Path, build_dir: Path, targets: list[str]) -> object:
        from llamacpp_mla_port.build import ensure_build
        # with the RPC backend, so that a commit touching ggml-rpc is compiled as well, and
        # warnings as errors, as upstream's models-check workflow builds test-llama-archs
        return ensure_build(tree, build_dir, targets, PR_CMAKE_ARGS, jobs=jobs, echo=False, rpc=True)
    return build


def series_commits(repo: Path, base: str, head: str) -> list[tuple[str, str]]:
    out = git.run(repo, "log", "--reverse", "--format=%H %s", f"{base}..{head}")
    return [tuple(line.split(" ", 1)) for line in out.splitlines() if line.strip()]


def touched_files(repo: Path, sha: str) -> list[str]:
    out = git.run(repo, "diff-tree", "--no-commit-id", "--name-only", "--diff-filter=d", "-r", sha)
    return [f for f in out.splitlines() if f]


def touched_warnings(log_path: Path, files: list[str]) -> list[str]:
    """Compiler warnings of the last build that point into one of `files`."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return []
    hits = (ln.strip() for ln in text.splitlines()
            if ": warning:" in ln and any(f"/{f}:" in ln or ln.startswith(f"{f}:") for f in files))
    return list(dict.fromkeys(hits))


def check_commits(repo: Path, base: str, head: str, checkout: Path, build_dir: Path,
                  targets: list[str], build: BuildFn | None, log=print) -> list[CommitCheck]:
    """Check out every commit of base..head in the tool-owned worktree `checkout`, in order,
    and build + lint it there. `build=None` skips the build (lint only)."""
    if (checkout / ".git").exists():
        try:
            git.run(checkout, "rev-parse", "--git-dir")
        except ProcessError:     # its main repository was re-created: start again
            shutil.rmtree(checkout)
    if not (checkout / ".git").exists():
        checkout.parent.mkdir(parents=True, exist_ok=True)
        git.run(repo, "worktree", "prune")
        git.run(repo, "worktree", "add", "-q", "--detach", "-f", str(checkout), base)
    results = []
    for sha, title in series_commits(repo, base, head):
        git.run(checkout, "checkout", "-q", "-f", "--detach", sha)
        git.run(checkout, "clean", "-q", "-fdx")   # tool-owned: no leftovers between commits
        files = touched_files(repo, sha)
        config = EditorConfig.load(checkout)
        check = CommitCheck(sha=sha, title=title, files=files,
                            findings=flake8_findings(checkout, files) + whitespace_findings(checkout, files, config))
        if build is not None:
            log(f"pr: building {sha[:12]} {title}")
            t0 = time.monotonic()
            (build_dir / BUILD_LOG).unlink(missing_ok=True)   # never read a stale log
            try:
                build(checkout, build_dir, list(targets) + sorted(
                    {t for pre, t in TOOL_TARGETS if any(f.startswith(pre) for f in files)} - set(targets)))
                check.build_ok = True
            except PortError as err:
                check.build_ok = False
                check.build_error = str(err)[-4000:]
            check.build_seconds = round(time.monotonic() - t0, 1)
            check.warnings = touched_warnings(build_dir / BUILD_LOG, files)
        log(f"pr: {sha[:12]} {'ok' if check.ok else 'FAILED'} {title}")
        results.append(check)
    return results


# ------------------------------------------------------------------------- PR folders
SMOKE_COMMAND = ".venv/bin/llamacpp-mla-port smoke"


def run_evidence(stack: Stack, cwd: Path, proof: dict | None, skip: bool, log=print) -> list[dict]:
    """Each claim of the stack with the command behind it, run from the project checkout:
    exit status, seconds and the output's tail. The proof's own command is the `smoke` run
    make_pr already did (its report is proof.json)."""
    out = []
    for ev in stack.evidence:
        entry = {"claim": ev.claim, "command": ev.command}
        if ev.command.strip() == SMOKE_COMMAND:
            if proof is None or proof.get("status") == "skipped":
                entry.update(status="not run", note="the proof was skipped (--skip-smoke)")
            else:
                entry.update(status="pass" if proof.get("ok") else "FAIL",
                             note="the proof of this run: proof.json, figures in evidence.json",
                             figures=proof_summary(proof))
        elif skip:
            entry.update(status="not run", note="--skip-evidence: run the command yourself")
        else:
            log(f"pr: evidence for {stack.name}: {ev.command}")
            proc = process.run(ev.command, shell=True, cwd=cwd, timeout=3600)
            entry.update(status="pass" if proc.returncode == 0 else "FAIL", rc=proc.returncode,
                         seconds=round(proc.seconds, 1), output_tail=(proc.stdout + proc.stderr)[-2000:])
        out.append(entry)
    return out


def _commit_checks(commits: list[CommitCheck], opts: "PrOptions", how: str) -> dict:
    """What the per-commit builds and lint found: builds, build_note, flake8, whitespace."""
    findings = [f for c in commits for f in c.findings]
    return {
        "builds": None if opts.skip_build else all(c.build_ok for c in commits),
        "build_note": ("skipped (--skip-build)" if opts.skip_build else
                       f"{len(commits)} {how}, targets {' '.join(opts.targets)}"),
        "flake8": not any(f.check == "flake8" for f in findings),
        "whitespace": not any(f.check == "editorconfig" for f in findings),
    }


def write_stack_folder(repo: git.Repo, rs: "stacks_mod.RenderedStack", places: Places, pin,
                       series, commits: list[CommitCheck], proof: dict, template: str | None,
                       opts: "PrOptions", patches_match: bool, upstream: dict | None, log=print) -> dict:
    """<work-dir>/pr/<stack>/ (rewritten whole): patches/, squashed.patch, checks.json, EVIDENCE.md,
    evidence.json, DESCRIPTION-SKELETON.md, CHECKLIST.md, WALKTHROUGH.md and plan.write_stack_docs'."""
    folder = places.pr_stack_dir(rs.stack.name)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    stacks_mod.export_stack(repo, rs, folder, pin, series)
    applied = stacks_mod.verify(repo, rs, folder)
    stat = stacks_mod.diffstat(repo, rs.base, rs.head)
    patch_files = read_series(folder / "patches") + [folder / stacks_mod.SQUASHED]
    style_findings = {p.name: [str(f) for f in style.patch_findings(p.read_text())] for p in patch_files}
    based_on = [s.name for s in series.base_of(rs.stack)]
    facts = {"base": f"{pin.tag} ({pin.commit or 'tree ' + pin.tree}), work-tree base {rs.base}"
                     + (f" (the head of {' + '.join(based_on)})" if based_on else ""),
             "based_on": based_on,
             "commits": [c.message.split("\n", 1)[0] for c in rs.commits],
             "applies_alone": applied["applies_alone"], **stat}
    entries = run_evidence(rs.stack, opts.places.templates_dir.parent, proof, opts.skip_evidence, log)
    checks = {
        "patches_match": patches_match,
        **_commit_checks(commits, opts, "commits alone on the base"),
        "proof": (proof.get("ok") if any(e["command"].strip() == SMOKE_COMMAND for e in entries)
                  else None),
        "style": not any(style_findings.values()),
        "applies_alone": applied["applies_alone"],
        "evidence": (None if all(e["status"] == "not run" for e in entries) else
                     not any(e["status"] == "FAIL" for e in entries)),
        "upstream_checks": (None if not upstream else
                            not any(v.get("introduced") for v in upstream.values())),
        "upstream_tests": harness_diff.verdict(places.harness_diff_dir, rs.stack.name, pin.short, rs.head),
    }
    ok = all(v is not False for k, v in checks.items() if k != "build_note")
    result = {"ok": ok, "stack": rs.stack.name, "title": rs.stack.title, "folder": str(folder),
              "checks": checks, "facts": facts, "style": style_findings, "commits": [c.to_json() for c in commits],
              "head": rs.head, "squashed": rs.squashed, "upstream_checks": upstream}
    write_json(folder / "checks.json", result)
    write_json(folder / "evidence.json", entries)
    lead = (upstream_bench.evidence_section(places.upstream_bench_dir, rs.stack.name, pin.short, rs.head,
                                            wanted=rs.stack.bench is not None)
            + harness_diff.evidence_section(places.harness_diff_dir, rs.stack.name, pin.short, rs.head))
    (folder / EVIDENCE).write_text(evidence_markdown(rs.stack, entries, facts, upstream, lead))
    (folder / DESCRIPTION).write_text(description_skeleton(template, rs.stack, facts))
    (folder / "CHECKLIST.md").write_text(stack_checklist(template, rs.stack, checks))
    walkthrough.write(folder, rs.stack, repo, rs.base)
    plan.write_stack_docs(repo, rs.base, rs.stack, folder, entries, facts["commits"], lead)
    log(f"pr: {folder} ({'ok' if ok else 'SOME CHECKS FAIL'}): {len(rs.shas)} commits, "
        f"+{stat['added']}/-{stat['removed']}")
    return {"ok": ok, "folder": str(folder), "checks": checks, "added": stat["added"],
            "removed": stat["removed"], "commits": facts["commits"],
            "evidence": [{k: e[k] for k in ("claim", "command", "status")} for e in entries]}


# ------------------------------------------------------------------------------ the kit
@dataclass
class PrOptions:
    places: Places                       # templates/, patches/ and the work dir (project.Places)
    evidence: Path | None = None
    build_dir: Path | None = None
    targets: tuple[str, ...] = PR_TARGETS
    jobs: int | None = None
    skip_build: bool = False
    skip_smoke: bool = False
    proof_settings: dict = field(default_factory=dict)   # prove_into's server / quick / threads
    skip_evidence: bool = False          # do not run the stacks' evidence commands
    upstream_checks: bool = True         # ty, model naming, pre-tokenizer: base vs patched
    harness_diff: bool = False           # upstream's tests, base vs each stack (the CLI's default)
    upstream_bench: bool = False         # llama-bench / test-backend-ops perf tables (the CLI's default)
    bench_settings: BenchSettings = BenchSettings()
    stacks: tuple[str, ...] = ()         # only these stacks (default: all)


def make_pr(opts: PrOptions, build: BuildFn | None = None, smoke=prove_into, log=print) -> dict:
    places = opts.places
    ws = Workspace(places.work_dir)
    if not ws.state_path.is_file():
        raise WorkTreeError(f"no tool work tree at {ws.tree}", "run `make patch` first")
    repo, state = ws.repo(), ws.state()
    ws.require_clean(repo)
    head = git.run(repo, "rev-parse", "HEAD")
    if state.get("status") != "applied" or state.get("head") != head:
        raise SeriesError(f"the series is not applied in {ws.tree}", "run `make patch` first")
    drift = pipeline.check(pipeline.Options(places), log=log)
    pin = load_pin(places.pin_file)
    base = state["base"]
    evidence = Path(opts.evidence) if opts.evidence else places.evidence_dir
    build_dir = Path(opts.build_dir) if opts.build_dir else project.build_in(places.pr_dir)
    if build is None and not opts.skip_build:
        build = commit_build(opts.jobs)
    series = load_series(opts.places.templates_dir)
    unknown = sorted(set(opts.stacks) - {st.name for st in series.stacks})
    if unknown:
        raise SeriesError(f"no PR stack {', '.join(unknown)} in templates/port.toml",
                          f"stacks: {', '.join(st.name for st in series.stacks)}")
    rendered = stacks_mod.render_stacks(repo, series, base, pin.short, {"pin": pin}, list(opts.stacks) or None)
    per_stack: dict[str, list[CommitCheck]] = {}
    upstream_checks: dict[str, dict] = {}
    checkout = project.tree_in(places.pr_dir)
    base_checks: dict[str, dict] = {}    # per base commit: a stacked PR is checked against its own
    for rs in rendered:
        log(f"pr: stack {rs.stack.name}: {len(rs.shas)} commits alone on the base")
        per_stack[rs.stack.name] = check_commits(
            ws.tree, rs.base, rs.head, checkout, build_dir,
            list(opts.targets), None if opts.skip_build else build, log)
        if opts.upstream_checks:
            files = sorted({f for c in per_stack[rs.stack.name] for f in c.files})
            log(f"pr: upstream's checks on {rs.stack.name} (patched)")
            patched = tree_checks(checkout, files)
            git.run(checkout, "checkout", "-q", "-f", "--detach", rs.base)
            log(f"pr: upstream's checks on {rs.stack.name} (base)")
            base_checks[rs.base] = tree_checks(checkout, files, base_checks.get(rs.base))
            upstream_checks[rs.stack.name] = introduced(base_checks[rs.base], patched)
        if opts.harness_diff and not opts.skip_build:
            log(f"pr: upstream's tests on the base and on {rs.stack.name}, the same flags")
            harness_diff.sweep_stack(repo, places.harness_diff_dir, rs, base, pin.short, opts.jobs, log)
        if opts.upstream_bench and rs.stack.bench and not opts.skip_build:
            log(f"pr: upstream's benchmarks on the base and on {rs.stack.name}, the same flags")
            upstream_bench.run_stack(repo, rs, base, pin.short, places, opts.bench_settings, log)
    commits = [c for cs in per_stack.values() for c in cs]
    if opts.skip_smoke:
        proof = {"ok": None, "status": "skipped"}
    else:
        log(f"pr: the proof on the series head; progress in {places.pr_proof_dir / 'proof.log'}")
        proof = smoke(places.pr_proof_dir, Build(ws.tree, ws.build_dir), **opts.proof_settings)

    checks = {"patches_match": drift == "",
              **_commit_checks(commits, opts, "commits, each stack's in order from the base"),
              "proof": proof.get("ok")}
    # the evidence folder is rewritten whole: stale files from an older run would mislead
    shutil.rmtree(evidence, ignore_errors=True)
    (evidence / "series").mkdir(parents=True)
    for p in sorted(opts.places.patches_dir.iterdir()):
        if p.is_file():
            shutil.copy2(p, evidence / "series" / p.name)
    upstream_info = {
        "url": pin.url, "commit": pin.commit, "tag": pin.tag,
        "applies_to": f"{pin.commit or pin.tag} (exactly: rerun `llamacpp-mla-port rebase --canary "
                      f"--onto <newer>` to try a newer upstream)",
        "base_in_work_tree": base, "base_tree": git.run(repo, "rev-parse", f"{base}^{{tree}}"),
        "series_range": f"{base}..{head}", "source": state.get("source"),
    }
    build_summary = {
        "targets": list(opts.targets), "skipped": opts.skip_build,
        "commits": [{"sha": c.sha, "title": c.title, "ok": c.build_ok, "seconds": c.build_seconds,
                     "error": c.build_error, "warnings_in_touched_files": c.warnings}
                    for c in commits],
    }
    results = {"ok": all(v is not False for k, v in checks.items() if k != "build_note"),
               "skipped": [k for k, v in checks.items() if v is None], "checks": checks, "patches_drift": drift,
               "commits": [c.to_json() for c in commits], "build": build_summary,
               "proof_summary": proof_summary(proof) if proof.get("status") != "skipped" else None}
    write_json(evidence / "upstream.json", upstream_info)
    write_json(evidence / "checks.json", results)
    write_json(evidence / "proof.json", proof)
    write_json(evidence / "summary.json", {"ok": results["ok"], "checks": checks, "upstream": upstream_info,
                                           "build": build_summary, "proof": results["proof_summary"]})
    template = git.read_blob(repo, base, ".github/pull_request_template.md")
    template_text = template.decode("utf-8") if template is not None else None
    (evidence / "CHECKLIST.md").write_text(checklist(template_text, checks))
    pr_folders = {rs.stack.name: write_stack_folder(repo, rs, places, pin, series, per_stack[rs.stack.name], proof,
                                                    template_text, opts, drift == "",
                                                    upstream_checks.get(rs.stack.name), log)
                  for rs in rendered}
    results["ok"] = results["ok"] and all(entry["ok"] for entry in pr_folders.values())
    results["stacks"] = pr_folders
    plan_path = plan.write_plan(series, pr_folders, places.pr_dir)
    write_json(evidence / "checks.json", results)
    skipped = [k for k, v in checks.items() if v is None]
    verdict = "all checks that ran pass" if results["ok"] else "SOME CHECKS FAIL"
    log(f"pr: evidence in {evidence} ({verdict}"
        f"{'; skipped: ' + ', '.join(skipped) if skipped else ''}; complete CHECKLIST.md "
        "yourself); PR folders: " + ", ".join(str(places.pr_stack_dir(n)) for n in pr_folders)
        + f"; the order to open them: {plan_path}; nothing was pushed")
    return {"evidence": evidence, **results}
