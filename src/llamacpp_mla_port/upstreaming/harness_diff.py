"""Base against patched: upstream's own tests run on the pinned base and on a patched tree,
each built with the same flags, so a change to shared code is shown not to change its other
users.

- test-llama-archs over every architecture it knows (not only dflash/eagle3);
- test-backend-ops -b CPU for the ops the series touches (HARNESS_OPS), in three builds of
  ggml-cpu (ISA_BUILDS): native, AVX2 without AVX-512 and scalar.

A case that passes on the base and not on the patched tree is a regression, and a case only
the patched tree runs (the series' own) that fails is one too. The count of cases each side
ran is reported beside them, so a side that ran nothing is seen (and refused).

`harness-diff` runs one sweep (the series, or --stack NAME); `make pr` runs one per PR stack,
scoped by stack_scope, and EVIDENCE.md carries its table (evidence_section).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable

from llamacpp_mla_port.build import ensure_build
from llamacpp_mla_port.errors import BuildError, ProofError
from llamacpp_mla_port import process
from llamacpp_mla_port.process import git
from llamacpp_mla_port.project import bin_dir, build_in, tree_in
from llamacpp_mla_port.jsonfile import write_json

#: CMake options of each ggml-cpu build; every option not named keeps its default on both sides
ISA_BUILDS: dict[str, tuple[str, ...]] = {
    "native": (),
    # x86 without GGML_NATIVE turns SSE4.2, AVX, AVX2, BMI2, FMA and F16C on, AVX-512 off
    "avx2": ("-DGGML_NATIVE=OFF", "-DGGML_AVX512=OFF"),
    "scalar": ("-DGGML_NATIVE=OFF", "-DGGML_SSE42=OFF", "-DGGML_AVX=OFF", "-DGGML_AVX2=OFF",
               "-DGGML_BMI2=OFF", "-DGGML_FMA=OFF", "-DGGML_F16C=OFF", "-DGGML_AVX512=OFF"),
}
#: the ops whose CPU code the series edits (sgemm.cpp: MUL_MAT; ops.cpp: FLASH_ATTN_EXT)
HARNESS_OPS: tuple[str, ...] = ("MUL_MAT", "FLASH_ATTN_EXT")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: a verdict cell of test-llama-archs' table: "OK (1.2e-05)", "FAIL", "SKIP"
_VERDICT = re.compile(r"^\s*(?P<word>OK|FAIL|SKIP)\b")
#: test-backend-ops' console lines: "  OP(params): ... OK|FAIL", "not supported [...]", "skipping ..."
_OPS_CASE = re.compile(r"^  (?P<case>[A-Z][A-Z0-9_]*\(.*\)): (?P<rest>.*)$", re.M)


def archs_results(stdout: str) -> dict[str, str]:
    """test-llama-archs' table as {"arch|device|config": status}; status OK, FAIL or SKIP.
    Rows are | arch | device | config | then one cell per check (NMSE, roundtrip and, since
    b11434, mixed batch): a FAIL in any of them is FAIL, else the first cell's verdict."""
    out: dict[str, str] = {}
    for line in _ANSI.sub("", stdout).splitlines():
        line = line.strip()
        if not (line.startswith("|") and line.endswith("|")):
            continue
        cells = line[1:-1].split("|")
        verdicts = [m["word"] for c in cells[3:] if (m := _VERDICT.match(c))]
        if len(cells) < 5 or len(verdicts) != len(cells) - 3:
            continue                    # the header, the rule, or not a row of the table
        status = "FAIL" if "FAIL" in verdicts else verdicts[0]
        out[f"{cells[0].strip()}|{cells[1].strip()}|{cells[2].strip()}"] = status
    return out


def backend_ops_results(stdout: str) -> dict[str, str]:
    """test-backend-ops' cases as {"OP(params)": status}: OK, FAIL, UNSUPPORTED or SKIP."""
    out: dict[str, str] = {}
    for m in _OPS_CASE.finditer(_ANSI.sub("", stdout)):
        rest = m["rest"].strip()
        status = ("OK" if rest.endswith("OK") else "FAIL" if rest.endswith("FAIL")
                  else "UNSUPPORTED" if rest.startswith("not supported") else "SKIP" if rest.startswith("skipping")
                  else None)
        if status is not None:
            out[m["case"]] = status
    return out


def compare(base: dict[str, str], patched: dict[str, str], what: str) -> dict:
    """Counts per status on each side, the cases that pass on the base but not patched, and the
    patched side's new cases that fail."""
    if not base or not patched:
        side = "base" if not base else "patched"
        raise ProofError(f"{what}: the {side} side ran no case",
                         hint="the binary printed nothing a parser knows: see its log")
    regressions = sorted(k for k, v in base.items() if v == "OK" and patched.get(k) != "OK")
    new_failures = sorted(k for k, v in patched.items() if k not in base and v == "FAIL")
    return {"what": what, "base": dict(Counter(base.values())), "patched": dict(Counter(patched.values())),
            "base_cases": len(base), "patched_cases": len(patched), "new_cases": len(set(patched) - set(base)),
            "regressions": regressions, "new_failures": new_failures, "ok": not regressions and not new_failures}


def run_tool(cmd: list[str], timeout: float, ok: tuple[int, ...] = (0,), env: dict | None = None) -> str:
    """The stdout of one of upstream's tools (`env`: its whole environment, else ours); an exit
    status outside `ok` is a ProofError with the stderr tail."""
    proc = process.run(cmd, timeout=timeout, env=env)
    if proc.returncode not in ok:
        raise ProofError(f"{Path(cmd[0]).name} exited {proc.returncode}: {(proc.stderr or '')[-1500:]}",
                         hint=" ".join(map(str, cmd)))
    return proc.stdout


#: test-llama-archs' last line. Its log thread is not flushed when it returns (upstream leaks
#: the logger, #22142), so a log can end early, mid-row; one without this line is run again.
_ARCHS_SUMMARY = re.compile(r"^Summary: ", re.M)
#: runs of test-llama-archs on one side before a log cut short every time is an error
ARCHS_TRIES = 3


def archs_table(binary: Path, logs: Path, side: str) -> tuple[dict[str, str], int]:
    """test-llama-archs -s 1's table (archs_results) from the first of ARCHS_TRIES runs whose
    log is whole (ends with its Summary line), and the runs it took. Each log goes to `logs`."""
    logs.mkdir(parents=True, exist_ok=True)
    for run in range(1, ARCHS_TRIES + 1):
        # a failing case makes the binary exit 1: its table still says which
        text = run_tool([str(binary), "-s", "1"], 1800, ok=(0, 1))
        log_path = logs / f"test-llama-archs-{side}{'' if run == 1 else f'-run{run}'}.txt"
        log_path.write_text(text)
        if _ARCHS_SUMMARY.search(_ANSI.sub("", text)):
            return archs_results(text), run
    raise ProofError(f"test-llama-archs ({side}): its log ended before its Summary line in "
                     f"{ARCHS_TRIES} runs ({log_path})",
                     hint="its log thread is not flushed at exit (upstream #22142): rerun, or "
                          "look for a crash at the end of the log")


def build_dir_of(side_dir: Path, isa: str) -> Path:
    """project.build_in(SIDE) for the native build, SIDE/build-ISA for the others (the tree is
    project.tree_in(SIDE): the same layout on both sides lets ccache share the unchanged files)."""
    native = build_in(side_dir)
    return native if isa == "native" else native.with_name(f"{native.name}-{isa}")


def run_diff(base_dir: Path, patched_dir: Path,
             isas: Iterable[str] = tuple(ISA_BUILDS), ops: Iterable[str] = HARNESS_OPS,
             archs: bool = True, jobs: int | None = None,
             log: Callable[[str], None] = lambda m: None) -> dict:
    """The differential of two work dirs, each a tree and its builds (project.tree_in, build_dir_of;
    module doc). Builds what is missing, incrementally."""
    report: dict = {"isas": list(isas), "ops": list(ops), "results": []}
    sides = {"base": (tree_in(base_dir), Path(base_dir)), "patched": (tree_in(patched_dir), Path(patched_dir))}
    t0 = time.monotonic()
    for isa in isas:
        if isa not in ISA_BUILDS:
            raise BuildError(f"unknown ISA build {isa!r}", hint="one of " + ", ".join(ISA_BUILDS))
        targets = ("test-backend-ops",) + (("test-llama-archs",) if archs and isa == "native" else ())
        bins = {}
        for side, (tree, sdir) in sides.items():
            log(f"{side}: building {', '.join(targets)} ({isa})")
            bins[side] = bin_dir(ensure_build(tree, build_dir_of(sdir, isa), targets, ISA_BUILDS[isa], jobs=jobs,
                                              echo=False))
        if archs and isa == "native":
            tables = {s: archs_table(b / "test-llama-archs", Path(patched_dir) / "logs", s) for s, b in bins.items()}
            result = compare(tables["base"][0], tables["patched"][0], "test-llama-archs")
            report["results"].append({"isa": isa, **result, "runs": {s: n for s, (_, n) in tables.items()}})
            log(_line(report["results"][-1]))
        for op in ops:
            res = {s: backend_ops_results(run_tool([str(b / "test-backend-ops"), "-b", "CPU", "-o", op], 3600,
                                                   ok=(0, 1)))
                   for s, b in bins.items()}
            report["results"].append({"isa": isa, **compare(res["base"], res["patched"], f"test-backend-ops -o {op}")})
            log(_line(report["results"][-1]))
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["ok"] = all(r["ok"] for r in report["results"])
    return report


#: ggml-cpu files whose series edits reach one op only (every other ggml-cpu file: HARNESS_OPS)
OPS_OF_FILE: dict[str, tuple[str, ...]] = {
    "ggml/src/ggml-cpu/llamafile/sgemm.cpp": ("MUL_MAT",),          # tinyBLAS
    "ggml/src/ggml-cpu/ops.cpp": ("FLASH_ATTN_EXT",),               # the series edits its FA kernel
}


def stack_scope(files: Iterable[str]) -> tuple[list[str], list[str]]:
    """(isas, ops) of a stack's differential: every ISA build, for the ops its ggml-cpu files
    reach (OPS_OF_FILE), when it edits ggml-cpu; otherwise test-llama-archs on the native build
    (nothing else of test-backend-ops -b CPU runs its code)."""
    cpu = [f for f in files if f.startswith("ggml/src/ggml-cpu/")]
    if not cpu:
        return ["native"], []
    ops = {op for f in cpu for op in OPS_OF_FILE.get(f, HARNESS_OPS)}
    return list(ISA_BUILDS), [op for op in HARNESS_OPS if op in ops]


def export_commit(repo, sha: str, dest: Path) -> Path:
    """The tree of commit `sha` in dest (kept while it is the same commit)."""
    stamp = dest.parent / "commit.txt"
    if (dest / "CMakeLists.txt").is_file() and stamp.is_file() and stamp.read_text().strip() == sha:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    data = git.archive(repo, sha)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    # the archive dates every file at its commit: newer than the side's last build, or make
    # would keep the objects of the tree exported before
    now = time.time()
    for path in dest.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.utime(path, (now, now))
    stamp.write_text(sha + "\n")
    return dest


def standing_report(out: Path, identity: dict) -> dict | None:
    """out/report.json when it holds every value of `identity` (compared as JSON stores them):
    a run of the same commits and settings, which a rerun reuses; else None."""
    try:
        old = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return None
    wanted = json.loads(json.dumps(identity))
    return old if all(old.get(k) == v for k, v in wanted.items()) else None


def _counts_new_failures(report: dict) -> bool:
    """The report judged the patched side's new cases too (one written before that cannot stand)."""
    return all("new_failures" in r for r in report.get("results", ()))


def write_report(out: Path, report: dict) -> None:
    """report.json and report.md of one sweep in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "report.json", report, indent=1)
    (out / "report.md").write_text(f"Base {report['base']} against {report['target']}, the same flags "
                                   "on both sides:\n\n" + markdown(report))


def sweep(repo, root: Path, name: str, base_sha: str, head_sha: str, base_label: str,
          isas: Iterable[str], ops: Iterable[str], archs: bool = True, jobs: int | None = None,
          reuse: bool = True, log: Callable[[str], None] = lambda m: None) -> dict:
    """Base `base_sha` against `head_sha` (a PR stack's head), exported in root/base and
    root/<name> with their builds; the report in root/<name>/. A report of the same commits and
    scope is reused (`make pr` reruns cost nothing)."""
    isas, ops = list(isas), list(ops)
    out = root / name
    old = standing_report(out, {"head": head_sha, "base_sha": base_sha, "isas": isas, "ops": ops,
                                "archs": archs}) if reuse else None
    if old is not None and _counts_new_failures(old):
        log(f"harness-diff {name}: the report of {head_sha[:12]} stands ({out / 'report.md'})")
        return old
    export_commit(repo, base_sha, tree_in(root / "base"))
    export_commit(repo, head_sha, tree_in(out))
    report = run_diff(root / "base", out, isas=isas, ops=ops, archs=archs, jobs=jobs, log=log)
    report.update({"target": name, "base": base_label, "base_sha": base_sha, "head": head_sha, "archs": archs})
    write_report(out, report)
    return report


def sweep_stack(repo, root: Path, rs, base_sha: str, base_label: str, jobs: int | None = None,
                log: Callable[[str], None] = lambda m: None) -> dict:
    """sweep() of a rendered PR stack (series.stacks.RenderedStack), scoped by stack_scope."""
    from llamacpp_mla_port.series.stacks import diffstat

    isas, ops = stack_scope(diffstat(repo, base_sha, rs.head)["files"])
    return sweep(repo, root, rs.stack.name, base_sha, rs.head, base_label, isas, ops, jobs=jobs, log=log)


def stack_report(report_dir: Path, name: str, base: str, head: str | None) -> tuple[dict | None, str]:
    """(report_dir/<name>/report.json, "") when it is of `base` (and `head`), else (None, why not:
    "absent", or a line that starts "Stale")."""
    path = report_dir / name / "report.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, "absent"
    if report.get("base") != base or (head and report.get("head") not in (None, head)):
        return None, (f"Stale: {path} compares {str(report.get('head', '?'))[:12]} against "
                      f"{report.get('base')}, not this PR against {base}")
    if not _counts_new_failures(report):
        return None, f"Stale: {path} predates the count of new cases that fail"
    return report, ""


def verdict(report_dir: Path, name: str, base: str, head: str | None = None) -> bool | None:
    """The stack's differential: True (no regression), False, or None (not run, or stale)."""
    report, _ = stack_report(report_dir, name, base, head)
    return None if report is None else bool(report.get("ok"))


def _line(r: dict) -> str:
    ok_b, ok_p = r["base"].get("OK", 0), r["patched"].get("OK", 0)
    regressed = f": {', '.join(r['regressions'][:5])}" if r["regressions"] else ""
    new_failures = r["new_failures"]
    failed = f", {len(new_failures)} new cases failing: {', '.join(new_failures[:5])}" if new_failures else ""
    return (f"{r['what']} ({r['isa']}): base {ok_b}/{r['base_cases']} OK, patched {ok_p}/{r['patched_cases']} OK, "
            f"{len(r['regressions'])} regressions{regressed}{failed}"
            + "".join(f"; {s}: {n} runs (a log cut short)" for s, n in r.get("runs", {}).items() if n > 1))


def markdown(report: dict) -> str:
    """The table for EVIDENCE.md: base / patched counts per test and build."""
    lines = ["| test | build | base OK / run | patched OK / run | new cases (failing) | passes on base, not patched |",
             "|---|---|---|---|---|---|"]
    for r in report["results"]:
        lines.append(f"| `{r['what']}` | {r['isa']} | {r['base'].get('OK', 0)} / {r['base_cases']} | "
                     f"{r['patched'].get('OK', 0)} / {r['patched_cases']} | "
                     f"{r['new_cases']} ({len(r['new_failures'])}) | {len(r['regressions'])} |")
    failing = [f"{k} ({r['what']}, {r['isa']})" for r in report["results"] for k in r["new_failures"]]
    if failing:
        lines += ["", "New cases that fail: " + "; ".join(failing[:10]) + "."]
    rerun = [f"{side} {r['what']} ({r['isa']}): {n} runs" for r in report["results"]
             for side, n in r.get("runs", {}).items() if n > 1]
    if rerun:
        lines += ["", "Run again because a log ended before its Summary line (upstream's "
                  "test-llama-archs does not flush its log at exit, #22142): " + "; ".join(rerun) + "."]
    return "\n".join(lines) + "\n"


def evidence_section(report_dir: Path, name: str, base: str, head: str | None = None) -> str:
    """EVIDENCE.md's section of upstream's own tests for `name` (a stack): the counts of its
    `harness-diff` run against `base` (of commit `head` when given), or the command that makes them."""
    command = f'make harness-diff HARNESS_ARGS="--stack {name}"'
    head_lines = ["", "## Upstream's tests, base against this PR", ""]
    report, why = stack_report(report_dir, name, base, head)
    if report is None and why == "absent":
        return "\n".join(head_lines + [f"Not run: `{command}` (or `make pr`) builds the base and this "
                                       "PR with the same flags and compares test-llama-archs and "
                                       "test-backend-ops.", ""])
    if report is None:
        return "\n".join(head_lines + [f"{why}: rerun `{command}`.", ""])
    ok = "no case that passes on the base fails here, and no new case fails" if report.get("ok") else "REGRESSIONS"
    return "\n".join(head_lines + [f"`{command}` ({report.get('seconds')} s): {ok}.", "", markdown(report)])
