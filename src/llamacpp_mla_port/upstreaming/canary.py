"""The full canary (`rebase --onto X --canary --prove`, `make canary`): does the series
render, apply, build and prove on a newer upstream? Nothing of the project is touched
(work/, patches/, the pin): everything happens in a canary dir of its own, by default
<project>/work-canary ($MLA_PORT_CANARY_DIR): llama.cpp/ (the new upstream with the series,
a tool-owned work tree), build/, patches/ (the series as rendered there) and proof/.

Stages, in order; the first that fails ends the run and names its evidence:
  obtain   the new upstream into the cache (a commit, a clone, a folder, or a PyPI sdist
           tree from templates/upstreams.toml): where it came from, sha256, build number
  anchor   every change located again and rendered (upstreaming/rebase.py's analysis): the failing
           anchor and the closest candidate lines, or the change already merged upstream; when
           it passes, what it leaves to review: changes probably merged in upstream's own words
           and the tree-identity check's regions (these do not stop the run)
  apply    the rendered series applied with `git am -3`, as `make patch` does: the rejected
           patch, file, line and hunk
  build    build.ensure_build of the targets the proof needs: the first compiler (or CMake,
           or linker) error with file and line, and the series patch that wrote that line
  proof    proof.smoke.run_smoke: the failing checks, and the figures either way
  stacks   run whatever the series did (one stale stack never hides the others): each PR stack
           rendered ALONE on the new upstream (on the stacks it depends on), then with
           --build-stacks its head built as `pr` builds a commit (its targets, GGML_NATIVE=OFF,
           LLAMA_FATAL_WARNINGS) in <canary-dir>/stacks/ and, unless --no-proof, proved there by
           upstream's own tests with the stack's cases (test-llama-archs; test-backend-ops -b CPU
           for the ops its ggml-cpu files reach): a row per stack (renders, builds, proves) and
           why it failed. A stack writing a file the tree's packager changed is not judged there.
Every stage records its time. A rerun reuses the canary dir (incremental build).

The verdict: "failed" (a stage failed), "review" (every stage passed, but the anchor stage left
something to review) or "ok"; `report["ok"]` is true for "ok" only. `summary_lines` gives the
text, its one-line verdict first.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from llamacpp_mla_port import build as build_mod
from llamacpp_mla_port.process import git
from llamacpp_mla_port.project import Build, Places, bin_dir, build_in, tree_in
from llamacpp_mla_port.errors import PatchApplyError, PortError, ProcessError, SeriesError
from llamacpp_mla_port.series import gitseries as series_mod, stacks as stacks_mod
from llamacpp_mla_port.series.spec import load_series
from llamacpp_mla_port.series.worktree import Workspace, apply_series
from llamacpp_mla_port.source import newer as newer_mod
from llamacpp_mla_port.source.obtain import cache_repo
from llamacpp_mla_port.stages import StageFailed, Stages
from llamacpp_mla_port.source.pin import load_pin
from llamacpp_mla_port.upstreaming.rebase import (MERGED, PROBABLE, RebaseOptions, identity_lines, probable_lines,
                                                  rebase, review_text)
from llamacpp_mla_port.upstreaming.targets import Target

STAGES = ("obtain", "anchor", "apply", "build", "proof", "stacks")
ENV_DIR = "MLA_PORT_CANARY_DIR"      # read by project.Places.canary_dir; named in messages
REPORT_NAME = "canary.json"


@dataclass
class CanaryOptions:
    onto: str
    places: Places                  # templates/, patches/ and the canary dir (project.Places)
    git_url: str | None = None
    tag: str | None = None
    cmake_args: tuple[str, ...] = ()
    jobs: int | None = None
    # the configuration of the tests' build (RPC backend on): the canary's compiles then hit
    # the ccache entries of that build, and the new upstream's ggml-rpc is compiled too
    rpc: bool = True
    prove: bool = True              # False: stop after the build (and the stacks' builds)
    build_stacks: bool = False      # the stacks stage: each PR stack built alone
    quick: bool = False             # smoke --quick
    server: bool = True             # smoke without --no-server
    threads: int = 2
    baseline: Path | None = None    # a smoke report (e.g. of the pin) to compare the figures with

    @property
    def canary_dir(self) -> Path:
        # absolute: git runs inside the canary tree, where a relative path names something else
        return self.places.canary_dir.absolute()


def run_canary(opts: CanaryOptions, log=print, on_stage=None) -> dict:
    """Every stage until the first failure; the report (see the module doc). `on_stage(name,
    entry)` is called as each stage ends (the verb prints one line per stage)."""
    started = time.monotonic()
    ws = Workspace(opts.canary_dir)
    pin = load_pin(opts.places.pin_file)
    report: dict = {"ok": False, "stage": None, "onto": None, "old": {"commit": pin.commit, "tag": pin.tag},
                    "canary_dir": str(opts.canary_dir), "tree": str(ws.tree),
                    "build_dir": str(ws.build_dir), "stages": {}, "failure": None}
    state: dict = {}
    steps = [("obtain", lambda: _obtain(opts, pin, state, log)), ("anchor", lambda: _anchor(opts, state, log)),
             ("apply", lambda: _apply(opts, ws, state, log)), ("build", lambda: _build(opts, ws, state))]
    if opts.prove:
        steps.append(("proof", lambda: _prove(opts, ws, log)))

    def ended(name: str, entry: dict) -> None:
        if name == "obtain" and "target" in state:
            report["onto"] = state["onto"]
        if on_stage:
            on_stage(name, entry)

    runner = Stages(report["stages"], stop_on_failure=True, merge=True, log=ended)
    for name, fn in steps:
        runner.run(name, fn)
    if "target" in state:       # obtained: every stack on its own, whatever the series did
        Stages(report["stages"], merge=True, log=ended).run("stacks", lambda: _stacks(opts, state, log))
        if runner.failed is None and not report["stages"]["stacks"]["ok"]:
            runner.failed = "stacks"
    steps.append(("stacks", None))
    anchor = report["stages"].get("anchor") or {}
    report["review"] = {"probably_merged": anchor.get("probably_merged", []),
                        "tree_identity": anchor.get("tree_identity")}
    if runner.failed is None:
        review = report["review"]["probably_merged"] or (report["review"]["tree_identity"] or {}).get("regions")
        report["verdict"] = "review" if review else "ok"
        report["ok"] = not review
        report["stage"] = "ok"
    else:
        report["verdict"] = "failed"
        name = runner.failed
        report["stage"] = name
        evidence = {k: v for k, v in report["stages"][name].items() if k not in ("ok", "seconds", "figures")}
        report["failure"] = {"stage": name, **evidence}
    runner.skip_rest(name for name, _ in steps)
    not_asked = {"proof": "not asked (--no-proof)"}
    for name in STAGES:
        if name not in report["stages"]:
            report["stages"][name] = {"ok": None, "skipped": not_asked[name]}
    report["seconds"] = round(time.monotonic() - started, 1)
    report["verdict_line"] = verdict_line(report, (report.get("onto") or {}).get("tag") or opts.onto)
    return report


# ------------------------------------------------------------------------------ stages
def _obtain(opts: CanaryOptions, pin, state: dict, log) -> dict:
    ropts = RebaseOptions(onto=opts.onto, places=opts.places.with_flags(work_dir=opts.canary_dir), git_url=opts.git_url,
                          canary=True, tag=opts.tag, patches_out=opts.places.canary_patches.absolute())
    target: Target = ropts.target(pin, log)
    state.update(target=target, ropts=ropts)
    state["onto"] = {"commit": target.commit, "tag": target.tag, "url": target.url,
                     "source": target.base.source, "tree": target.base.tree, "build": target.build,
                     "origin": target.origin}
    out = {"label": target.label, "build": target.build, "source": target.base.source,
           "tree": target.base.tree, "pin": pin.tag, "newest": newer_mod.newest_published(opts.places.templates_dir)}
    if "sha256" in target.origin:
        out["sha256"] = target.origin["sha256"]
    return out


def _anchor(opts: CanaryOptions, state: dict, log) -> dict:
    outcome = rebase(state["ropts"], log=log, target=state["target"])
    state["outcome"] = outcome
    n = len(outcome.changes)
    moved = sum(1 for c in outcome.changes if c.status in ("ok", PROBABLE) and c.old_line not in (None, c.line))
    summary = {"changes": n, "found": sum(1 for c in outcome.changes if not c.failed and c.status != MERGED),
               "moved": moved, "relation": outcome.relation, "notes": outcome.notes, "stacks": outcome.stacks,
               "verdict": outcome.verdict, "probably_merged": [dataclasses.asdict(c) for c in outcome.probably_merged],
               "tree_identity": outcome.tree_identity.to_json()}
    if outcome.status == "stack-conflict":
        bad = next(t for t in outcome.stacks if not t["ok"])
        raise StageFailed({**summary, "outcome": outcome.status, "status": "stack-conflict",
                           "stack": bad["stack"], "message": f"PR stack {bad['stack']}: {bad['message']}",
                           "hint": bad.get("hint")})
    if outcome.verdict == "failed":
        first = outcome.first_failure
        evidence = dataclasses.asdict(first) if first else {}
        bad = [dataclasses.asdict(c) for c in outcome.changes if c.failed or c.status == MERGED]
        raise StageFailed({**summary, "outcome": outcome.status, "status": evidence.get("status"),
                           "message": first.message if first else outcome.status,
                           "file": evidence.get("file"), "anchor": evidence.get("anchor"),
                           "candidates": evidence.get("candidates", []), "change": evidence.get("change"),
                           "patch": evidence.get("patch"), "failures": bad})
    return {**summary, "patches": outcome.patches, "range_diff": outcome.range_diff}


def _apply(opts: CanaryOptions, ws: Workspace, state: dict, log) -> dict:
    target: Target = state["target"]
    outcome = state["outcome"]
    series = load_series(opts.places.templates_dir)
    patches = series_mod.read_series(opts.places.canary_patches)
    if ws.tree.exists() and not ws.state_path.is_file():
        raise PortError(f"{ws.tree} exists but was not created by llamacpp-mla-port",
                        f"move it away, or pass another --canary-dir (${ENV_DIR})")
    repo = ws.ensure(target.base, target.commit or target.tag, log)
    ws.require_clean(repo)
    touched = {f["path"] for p in _manifest(opts.places.canary_patches) for f in p["files"]}
    want = git.run(cache_repo(), "rev-parse", f"{outcome.head}^{{tree}}")
    try:
        head = apply_series(ws, repo, target.base.sha, series, patches, touched, want)
    except PatchApplyError as err:
        d = err.details
        raise StageFailed({"message": f"`git am -3` rejected {d.get('patch', 'a patch')}"
                                      + (f" at {d['file']}:{d['line']}" if "file" in d and "line" in d else ""),
                           "patch": d.get("patch"), "subject": d.get("subject"), "file": d.get("file"),
                           "line": d.get("line"), "hunk": d.get("hunk"), "output": d.get("output")})
    except SeriesError as err:
        raise StageFailed({"message": err.message, "patch": None, "file": None, "line": None, "hunk": None})
    return {"patches": len(patches), "head": head}


def _build(opts: CanaryOptions, ws: Workspace, state: dict) -> dict:
    targets = build_mod.TARGET_SETS["smoke"]     # the proof's targets
    try:
        build_mod.ensure_build(ws.tree, ws.build_dir, targets, opts.cmake_args, opts.jobs, echo=False, rpc=opts.rpc)
    except PortError as err:
        log_path, first, where = _first_build_error(ws.build_dir, ws.tree)
        evidence = {"message": where or err.message.splitlines()[0], "log": str(log_path), "error": first,
                    "file": first and first["file"], "line": first and first["line"]}
        if where:
            evidence["written_by"] = _blame(ws, first["file"], first["line"])
        raise StageFailed(evidence) from None
    return {"targets": list(targets)}


def _first_build_error(build_dir: Path, tree: Path) -> tuple[Path, dict | None, str | None]:
    """The build log, its first error (build.first_error) and that error as `file:line: message`
    (None when the error names no file and line)."""
    log_path = build_dir / build_mod.LOG_NAME
    first = build_mod.first_error(log_path.read_text(errors="replace") if log_path.is_file() else "", tree)
    named = first is not None and first["file"] and first["line"]
    where = f"{first['file']}:{first['line']}: {first['message']}" if named else None
    return log_path, first, where


def _stacks(opts: CanaryOptions, state: dict, log) -> dict:
    """Each PR stack alone on the new upstream: rendered, then (--build-stacks) built and proved
    in one tool-owned worktree and build dir; a row per stack (module doc)."""
    from llamacpp_mla_port.upstreaming.pr import PR_CMAKE_ARGS, PR_TARGETS, check_commits, commit_build
    target: Target = state["target"]
    pin = load_pin(opts.places.pin_file)
    series = load_series(opts.places.templates_dir)
    extra = {"pin": dataclasses.replace(pin, commit=target.commit, tag=target.tag, sdist=target.sdist)}
    packager = set(target.sdist.packager_paths if target.sdist else ())
    stacks_dir = opts.places.canary_stacks_dir.absolute()
    checkout, build_dir = tree_in(stacks_dir), build_in(stacks_dir)
    rows = []
    for stack in series.stacks:
        row = {"stack": stack.name, "renders": None, "builds": None, "proves": None, "message": ""}
        rows.append(row)
        files = sorted(series.only(stack).files())
        if packager & set(files):
            row["message"] = (f"not judged on {target.label}: its packager changed "
                              f"{', '.join(sorted(packager & set(files)))}")
            continue
        try:
            head = stacks_mod.render_stack(cache_repo(), series, stack, target.base.sha, target.label, extra).head
        except PortError as err:
            row.update(renders=False, message=err.message)
            continue
        row.update(renders=True, head=head)
        if not opts.build_stacks:
            continue
        check = check_commits(cache_repo(), f"{head}~1", head, checkout, build_dir, list(PR_TARGETS),
                              commit_build(opts.jobs), log)[0]
        row.update(builds=bool(check.build_ok), seconds=check.build_seconds,
                   warnings_in_touched_files=check.warnings, lint_findings=len(check.findings))
        if not check.build_ok:
            _, _, where = _first_build_error(build_dir, checkout)
            last = (check.build_error.strip().splitlines() or ["the build failed"])[-1]
            row["message"] = f"does not build alone: {where or last}"
            continue
        if opts.prove:
            failed = _prove_stack(bin_dir(build_dir), files, stacks_dir / "logs" / stack.name)
            row.update(proves=not failed, failing_cases=failed[:20])
            if failed:
                row["message"] = f"{len(failed)} case(s) of upstream's tests fail, first {failed[0]}"
    out = {"stacks": rows, "targets": list(PR_TARGETS), "cmake_args": list(PR_CMAKE_ARGS)}
    bad = next((r for r in rows if False in (r["renders"], r["builds"], r["proves"])), None)
    if bad is not None:
        raise StageFailed({**out, "stack": bad["stack"],
                           "message": f"PR stack {bad['stack']} on {target.label}: {bad['message']}"})
    return out


def _prove_stack(bins: Path, files: list[str], logs: Path) -> list[str]:
    """The cases of upstream's own tests that fail on a stack's build: test-llama-archs (the stack's
    cases among them), and test-backend-ops -b CPU for the ops its ggml-cpu files reach."""
    from llamacpp_mla_port.upstreaming.harness_diff import archs_table, backend_ops_results, run_tool, stack_scope
    table, _ = archs_table(bins / "test-llama-archs", logs, "stack")
    failed = sorted(k for k, v in table.items() if v == "FAIL")
    for op in stack_scope(files)[1]:
        cases = backend_ops_results(run_tool([str(bins / "test-backend-ops"), "-b", "CPU", "-o", op], 3600, ok=(0, 1)))
        failed += sorted(k for k, v in cases.items() if v == "FAIL")
    return failed


def _prove(opts: CanaryOptions, ws: Workspace, log) -> dict:
    from llamacpp_mla_port.proof.smoke import (REPORT_NAME as SMOKE_REPORT, compare_figures, failing_checks,
                                               lossless_counts, proof_summary, prove_into)
    work = opts.places.canary_proof_dir.absolute()
    # the proof's progress lines go to its log: the terminal gets one line per stage
    report = prove_into(work, Build(ws.tree, ws.build_dir), build=False, server=opts.server,
                        quick=opts.quick, threads=opts.threads)
    figures = proof_summary(report)
    figures["lossless_runs"] = lossless_counts(report.get("lossless") or {})
    figures["target_side"] = report.get("target_side")
    where = {"figures": figures, "work": str(work), "smoke_report": str(work / SMOKE_REPORT)}
    if opts.baseline is not None:
        where["vs_baseline"] = compare_figures(json.loads(Path(opts.baseline).read_text()), report)
    if not report["ok"]:
        checks = failing_checks(report)
        raise StageFailed({"message": checks[0]["message"], "checks": checks, **where})
    return where


# ------------------------------------------------------------------------------ helpers
def _manifest(patches_dir: Path) -> list[dict]:
    return json.loads((patches_dir / series_mod.MANIFEST).read_text())["patches"]


def _blame(ws: Workspace, file: str, line: int) -> dict | None:
    """Which commit wrote `file:line` in the canary tree: a patch of the series, or upstream."""
    try:
        out = git.run(ws.tree, "blame", "--porcelain", "-L", f"{line},{line}", "HEAD", "--", file)
    except ProcessError:
        return None
    sha = out.split(" ", 1)[0]
    summary = next((ln[len("summary "):] for ln in out.splitlines() if ln.startswith("summary ")), "")
    text = next((ln[1:] for ln in out.splitlines() if ln.startswith("\t")), "")
    base = ws.state().get("base")
    if sha == base:
        return {"by": "upstream", "commit": sha, "text": text}
    return {"by": "series", "commit": sha, "subject": summary, "text": text}


# ------------------------------------------------------------------------------ text
def stage_line(name: str, entry: dict) -> str:
    """One line per stage, for the terminal (`make canary`)."""
    secs = f"{entry.get('seconds', 0):7.1f} s"
    if entry.get("ok") is None:
        return f"  {name:<7} --      {'':>9}  skipped: {entry.get('skipped', '')}"
    if not entry["ok"]:
        return f"  {name:<7} FAILED  {secs}  {entry.get('message', '')}"
    if name == "obtain":
        what = f"{entry['label']} ({entry['source']}, tree {entry['tree'][:12]}"
        what += f", build {entry['build']}" if entry.get("build") is not None else ""
        what += f", sha256 {entry['sha256'][:16]}..." if entry.get("sha256") else ""
        what += ")"
        newest = entry.get("newest") or {}
        if newest.get("build") is not None:
            what += f"; pin {entry['pin']}, newest build a source shows b{newest['build']} ({newest['from']})"
    elif name == "anchor":
        what = f"{entry['found']}/{entry['changes']} changes found ({entry['moved']} moved)"
        if entry.get("stacks"):
            what += f"; {len(entry['stacks'])} PR stacks apply alone"
        ident, probable = entry.get("tree_identity") or {}, entry.get("probably_merged")
        review = ([f"{len(probable)} probably merged upstream"] if probable else []) + \
            ([f"tree identity differs in {len(ident['regions'])} region(s)"] if ident.get("regions") else [])
        what += f"; REVIEW: {', '.join(review)}" if review else ""
        if ident.get("checked") and not ident["regions"]:
            what += f"; tree identity holds ({ident['files']} files)"
    elif name == "apply":
        what = f"{entry['patches']} patches applied with git am -3"
    elif name == "build":
        what = f"built {' '.join(entry['targets'])}"
    elif name == "stacks":
        rows = entry["stacks"]
        done = [w for w, k in (("render", "renders"), ("build", "builds"), ("prove", "proves"))
                if any(r[k] for r in rows)]
        what = f"{len(rows)} PR stacks {', '.join(done) or 'judged'} alone (table below)"
    else:
        f = entry["figures"]
        worst = {m: max((v.get(m) or 0.0) for v in f["parity_worst_nmse"].values())
                 for m in next(iter(f["parity_worst_nmse"].values()), {})}
        runs = f["lossless_runs"]
        what = ("parity worst NMSE " + ", ".join(f"{m} {v:.3g}" for m, v in worst.items())
                + f"; lossless {runs['identical']}/{runs['runs']} runs identical; target taps == prefix stream")
        vs = entry.get("vs_baseline")
        if vs is not None:
            what += ("; all printed figures equal the baseline's" if vs["equal"] else
                     f"; {len(vs['differences'])} printed figures differ from the baseline's")
    return f"  {name:<7} ok      {secs}  {what}"


def progress_line(name: str, entry: dict) -> str:
    """A stage as it ends, short (stderr: the summary comes at the end)."""
    state = {True: "ok", False: "FAILED", None: "skipped"}[entry.get("ok")]
    return f"canary: {name} {state}" + (f" ({entry['seconds']:.1f} s)" if "seconds" in entry else "")


def verdict_line(report: dict, onto: str) -> str:
    """The run in one line: OK, REVIEW (what to review) or FAILED (at which stage, why)."""
    stages = report["stages"]
    done = "builds and proves" if stages["proof"].get("ok") else "builds (no proof)"
    if stages["stacks"].get("ok"):
        rows = stages["stacks"]["stacks"]
        done += ", and each PR stack renders" + (", builds" if any(r["builds"] for r in rows) else "") + \
            (" and proves" if any(r["proves"] for r in rows) else "") + " alone"
    secs = f" ({report['seconds']:.1f} s)"
    if report["verdict"] == "failed":
        failure = report.get("failure") or {}
        why = f": {failure['message']}" if failure.get("message") else ""
        return f"canary: FAILED at {report['stage']} on {onto}{why}{secs}"
    ident = report["review"]["tree_identity"] or {}
    if report["verdict"] == "review":
        what = review_text(report["review"]["probably_merged"], ident.get("regions") or [])
        return f"canary: REVIEW on {onto}: the series renders, applies, {done}, but {what}{secs}"
    held = f"; tree identity holds ({ident['files']} files)" if ident.get("checked") else ""
    return f"canary: OK on {onto}: the series renders, applies, {done}{held}{secs}"


def summary_lines(report: dict, onto: str, path: Path) -> list[str]:
    """What `make canary` prints at the end: the one-line verdict first, one line per stage, what
    to review (each probable merge, the tree-identity check), then where the report is."""
    out = [verdict_line(report, onto)]
    out += [stage_line(name, report["stages"][name]) for name in STAGES]
    out += stacks_table(report)
    review = report["review"]
    out += probable_lines(review["probably_merged"])
    if review["tree_identity"] is not None:
        out += identity_lines(review["tree_identity"], show_not_run=report["verdict"] != "failed")
    out.append(f"report: {path}")
    return out


def stacks_table(report: dict) -> list[str]:
    """The verdict table: a row per PR stack alone, then the whole series: renders, builds,
    proves (ok, FAILED, or -- where not judged), and why a row failed."""
    st = report["stages"]
    rows = list(st["stacks"].get("stacks") or [])
    if not rows:
        return []
    cell = {True: "ok", False: "FAILED", None: "--"}
    series = {"stack": "(whole series)", "renders": st["anchor"].get("ok"), "builds": st["build"].get("ok"),
              "proves": st["proof"].get("ok"), "message": (report.get("failure") or {}).get("message", "")
              if report.get("stage") in ("anchor", "apply", "build", "proof") else ""}
    out = [f"  {'stack':<24} {'renders':<8} {'builds':<8} proves"]
    for r in rows + [series]:
        why = f"  {r['message']}" if r.get("message") else ""
        out.append(f"  {r['stack']:<24} {cell[r['renders']]:<8} {cell[r['builds']]:<8} {cell[r['proves']]:<8}{why}"
                   .rstrip())
    return out
