"""Base against patched with upstream's own tests (upstreaming/harness_diff.py, `harness-diff`).

Fast: the parsers on text in the binaries' own formats (a failing case and a roundtrip failure
must be read as FAIL), the comparison (a case passing on the base and failing patched is a
regression; a side that ran nothing is refused), and test-llama-archs over every architecture
on the patched build. Slow (`make test-slow`): the whole differential for the series, base and
patched built alike, in the native, AVX2-only and scalar builds.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.upstreaming import harness_diff as hd

ARCHS_OUT = """\
|     Model arch.|                    Device|Config|   NMSE vs. CPU|Roundtrip|
|----------------|--------------------------|------|---------------|---------|
|           llama|Intel(R) Xeon(R) Processor| Dense|  \x1b[1;32mOK\x1b[0m (0.00e+00)|       \x1b[1;32mOK\x1b[0m|
|           llama|                      Meta| Dense|\x1b[1;33mSKIP\x1b[0m           |     \x1b[1;33mSKIP\x1b[0m|
|           qwen3|Intel(R) Xeon(R) Processor|   MoE|  \x1b[1;31mFAIL\x1b[0m (3.10e-01)|       \x1b[1;32mOK\x1b[0m|
|          eagle3|Intel(R) Xeon(R) Processor|own width|  \x1b[1;32mOK\x1b[0m           |     \x1b[1;33mSKIP\x1b[0m|
|          gemma2|Intel(R) Xeon(R) Processor| Dense|  \x1b[1;32mOK\x1b[0m (0.00e+00)|       \x1b[1;31mFAIL\x1b[0m|
Summary: 4 test(s) executed, 2 failed
"""

OPS_OUT = """\
Testing 1 devices

Backend 1/1: CPU
  Device description: Intel(R) Xeon(R) Processor
  MUL_MAT(type_a=f16,type_b=f32,m=16,n=1,k=256,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1): \x1b[1;32mOK\x1b[0m
  MUL_MAT(type_a=q8_0,type_b=f32,m=16,n=7,k=256,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1): [MUL_MAT] NMSE = 0.010000000 > 0.000500000 \x1b[1;31mFAIL\x1b[0m
  MUL_MAT(type_a=iq2_xxs,type_b=f32,m=16,n=1,k=256,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1): not supported [CPU]
  MUL_MAT(type_a=f32,type_b=f32,m=4096,n=4096,k=4096,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1): skipping large tensors for speed
  2/3 tests passed
  Backend CPU: \x1b[1;31mFAIL\x1b[0m
"""


def test_archs_table_is_read_per_case():
    res = hd.archs_results(ARCHS_OUT)
    assert res == {"llama|Intel(R) Xeon(R) Processor|Dense": "OK", "llama|Meta|Dense": "SKIP",
                   "qwen3|Intel(R) Xeon(R) Processor|MoE": "FAIL",
                   "eagle3|Intel(R) Xeon(R) Processor|own width": "OK",
                   "gemma2|Intel(R) Xeon(R) Processor|Dense": "FAIL"}     # the roundtrip failed


#: b11434's table: a "Mixed batch" column after the roundtrip
ARCHS_OUT_MIXED = """\
|     Model arch.|                    Device|Config|   NMSE vs. CPU|Roundtrip|    Mixed batch|
|----------------|--------------------------|------|---------------|---------|---------------|
|           qwen3|Intel(R) Xeon(R) Processor| Dense|  \x1b[1;32mOK\x1b[0m (0.00e+00)|       \x1b[1;32mOK\x1b[0m|  \x1b[1;32mOK\x1b[0m (0.00e+00)|
|           qwen3|                      Meta| Dense|\x1b[1;33mSKIP\x1b[0m           |     \x1b[1;33mSKIP\x1b[0m|\x1b[1;33mSKIP\x1b[0m           |
|           llama|Intel(R) Xeon(R) Processor| Dense|  \x1b[1;32mOK\x1b[0m (0.00e+00)|       \x1b[1;32mOK\x1b[0m|  \x1b[1;31mFAIL\x1b[0m (2.00e-01)|
Summary: 2 test(s) executed, 1 failed
"""


def test_archs_table_with_a_mixed_batch_column_is_read_per_case():
    assert hd.archs_results(ARCHS_OUT_MIXED) == {
        "qwen3|Intel(R) Xeon(R) Processor|Dense": "OK", "qwen3|Meta|Dense": "SKIP",
        "llama|Intel(R) Xeon(R) Processor|Dense": "FAIL"}                  # the mixed batch failed


def test_backend_ops_lines_are_read_per_case():
    res = hd.backend_ops_results(OPS_OUT)
    assert list(res.values()) == ["OK", "FAIL", "UNSUPPORTED", "SKIP"]
    assert all(k.startswith("MUL_MAT(type_a=") and k.endswith(")") for k in res)


def test_a_case_passing_on_the_base_and_failing_patched_is_a_regression():
    base = hd.backend_ops_results(OPS_OUT.replace("[MUL_MAT] NMSE = 0.010000000 > 0.000500000 \x1b[1;31mFAIL",
                                                  "\x1b[1;32mOK"))
    patched = hd.backend_ops_results(OPS_OUT)
    r = hd.compare(base, patched, "test-backend-ops -o MUL_MAT")
    assert not r["ok"] and len(r["regressions"]) == 1 and "type_a=q8_0" in r["regressions"][0]
    # the other way round (a fix) is not one, and neither is a case the patched side adds
    r = hd.compare(patched, {**base, "MUL_MAT(new)": "OK"}, "x")
    assert r["ok"] and r["new_cases"] == 1 and r["base"]["FAIL"] == 1
    assert "| `x` | native |" in hd.markdown({"results": [{**r, "isa": "native"}]})


def test_a_new_case_that_fails_on_the_patched_side_is_not_ok():
    """The series' own cases: a failing one (an EAGLE3 draft refused where the case expects it to
    run) is no regression of the base, but the differential must not read ok."""
    base = hd.backend_ops_results(OPS_OUT)
    r = hd.compare(base, {**base, "MUL_MAT(new)": "FAIL", "MUL_MAT(other)": "SKIP"}, "x")
    assert not r["ok"] and not r["regressions"] and r["new_failures"] == ["MUL_MAT(new)"]
    table = hd.markdown({"results": [{**r, "isa": "native"}]})
    assert "| 2 (1) | 0 |" in table and "New cases that fail: MUL_MAT(new) (x, native)." in table
    assert "1 new cases failing: MUL_MAT(new)" in hd._line({**r, "isa": "native"})


#: a stand-in for test-llama-archs: prints the table of its ROWS file; its first CUT runs end
#: mid-row, before the Summary line, as upstream's test does when its log thread is not flushed
FAKE_ARCHS = """\
import sys
from pathlib import Path
rows, count, cut = Path(sys.argv[1]).read_text(), Path(sys.argv[2]), int(sys.argv[3])
runs = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(runs))
sys.stdout.write(rows if runs > cut else rows[:rows.rindex("|  ") + 20])
"""


def fake_archs(tmp_path: Path, side: str, cut: int) -> Path:
    """An executable printing ARCHS_OUT_MIXED as FAKE_ARCHS does, cut short `cut` times."""
    import sys
    (tmp_path / "rows").write_text(ARCHS_OUT_MIXED)
    (tmp_path / "fake.py").write_text(FAKE_ARCHS)
    exe = tmp_path / f"archs-{side}"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'fake.py'} {tmp_path / 'rows'} "
                   f"{tmp_path / f'count-{side}'} {cut} \"$@\"\n")
    exe.chmod(0o755)
    return exe


def test_a_log_cut_short_at_exit_is_run_again_and_never_read_as_a_result(tmp_path):
    """Upstream's test-llama-archs can end its log mid-row (its log thread is not flushed at
    exit): such a run is run again, the runs are said, and a side cut short every time is an
    error, not a table with rows missing."""
    cut = ARCHS_OUT_MIXED[:ARCHS_OUT_MIXED.rindex("|  ") + 20]        # as FAKE_ARCHS cuts it
    assert len(hd.archs_results(cut)) < len(hd.archs_results(ARCHS_OUT_MIXED))  # read alone: a row lost
    table, runs = hd.archs_table(fake_archs(tmp_path, "base", 1), tmp_path / "logs", "base")
    assert table == hd.archs_results(ARCHS_OUT_MIXED) and runs == 2
    assert "Summary" not in (tmp_path / "logs" / "test-llama-archs-base.txt").read_text()
    assert (tmp_path / "logs" / "test-llama-archs-base-run2.txt").read_text() == ARCHS_OUT_MIXED
    r = {"isa": "native", **hd.compare(table, table, "test-llama-archs"), "runs": {"base": runs, "patched": 1}}
    assert "base test-llama-archs (native): 2 runs" in hd.markdown({"results": [r]})
    assert "base: 2 runs (a log cut short)" in hd._line(r)
    with pytest.raises(ProofError, match=f"ended before its Summary line in {hd.ARCHS_TRIES} runs"):
        hd.archs_table(fake_archs(tmp_path, "patched", hd.ARCHS_TRIES), tmp_path / "logs", "patched")


def test_a_side_that_ran_nothing_is_refused():
    with pytest.raises(ProofError, match="the patched side ran no case"):
        hd.compare(hd.backend_ops_results(OPS_OUT), hd.backend_ops_results("garbage"), "x")


@pytest.mark.build
def test_evidence_md_gets_the_stacks_counts_or_the_command_that_makes_them(tmp_path):
    import json
    base = {"MUL_MAT(a)": "OK", "MUL_MAT(b)": "OK"}
    result = hd.compare(base, {**base, "MUL_MAT(c)": "OK"}, "test-backend-ops -o MUL_MAT")
    report = {"results": [{"isa": "native", **result}],
              "ok": True, "seconds": 12.5, "base": "b11434 (tree 27d5f643d32b)", "target": "cpu-demo"}
    absent = hd.evidence_section(tmp_path, "cpu-demo", report["base"])
    assert 'Not run: `make harness-diff HARNESS_ARGS="--stack cpu-demo"`' in absent
    (tmp_path / "cpu-demo").mkdir()
    (tmp_path / "cpu-demo" / "report.json").write_text(json.dumps(report))
    fresh = hd.evidence_section(tmp_path, "cpu-demo", report["base"])
    assert "no case that passes on the base fails here" in fresh
    assert "| `test-backend-ops -o MUL_MAT` | native | 2 / 2 | 3 / 3 | 1 (0) | 0 |" in fresh
    assert "Stale" in hd.evidence_section(tmp_path, "cpu-demo", "b11500 (tree 0123456789ab)")
    # a report from before new cases' failures were counted does not stand
    older = {**report, "results": [{k: v for k, v in r.items() if k != "new_failures"} for r in report["results"]]}
    (tmp_path / "cpu-demo" / "report.json").write_text(json.dumps(older))
    assert "predates the count of new cases that fail" in hd.evidence_section(tmp_path, "cpu-demo", report["base"])
    report["ok"] = False
    (tmp_path / "cpu-demo" / "report.json").write_text(json.dumps(report))
    assert "REGRESSIONS" in hd.evidence_section(tmp_path, "cpu-demo", report["base"])


def test_a_stack_is_swept_in_the_builds_its_files_reach():
    """A stack that edits ggml-cpu runs test-backend-ops in every ISA build; one that does not
    runs test-llama-archs alone (test-backend-ops -b CPU never reaches its code)."""
    assert hd.stack_scope(["ggml/src/ggml-cpu/ops.cpp", "tests/test-backend-ops.cpp"]) == (
        list(hd.ISA_BUILDS), ["FLASH_ATTN_EXT"])
    assert hd.stack_scope(["ggml/src/ggml-cpu/llamafile/sgemm.cpp"]) == (list(hd.ISA_BUILDS), ["MUL_MAT"])
    assert hd.stack_scope(["ggml/src/ggml-cpu/vec.h", "ggml/src/ggml-cpu/llamafile/sgemm.cpp"]) == (
        list(hd.ISA_BUILDS), list(hd.HARNESS_OPS))         # a file the table does not know: every op
    assert hd.stack_scope(["src/llama-context.cpp", "ggml/src/ggml-rpc/ggml-rpc.cpp"]) == (["native"], [])


def test_a_sweep_of_the_same_commits_is_reused_and_a_new_head_reruns(tmp_path, monkeypatch):
    """make pr reruns cost nothing while the stack's head, the base and the scope are the same;
    any of them moving runs the differential again, and EVIDENCE.md calls the old report stale."""
    runs = []

    def fake_run_diff(base_dir, side, isas, ops, archs, jobs, log):
        runs.append((Path(base_dir).name, Path(side).name, tuple(isas), tuple(ops)))
        return {"isas": list(isas), "ops": list(ops), "ok": True, "seconds": 1.0,
                "results": [{"isa": "native", **hd.compare({"a": "OK"}, {"a": "OK"}, "test-llama-archs")}]}

    monkeypatch.setattr(hd, "run_diff", fake_run_diff)
    monkeypatch.setattr(hd, "export_commit", lambda repo, sha, dest: dest)
    args = dict(isas=["native"], ops=[])
    r1 = hd.sweep(None, tmp_path, "demo", "b" * 40, "1" * 40, "b1 (tree x)", **args)
    r2 = hd.sweep(None, tmp_path, "demo", "b" * 40, "1" * 40, "b1 (tree x)", **args)
    assert r1 == r2 and runs == [("base", "demo", ("native",), ())]
    assert hd.verdict(tmp_path, "demo", "b1 (tree x)", "1" * 40) is True
    assert "| `test-llama-archs` | native | 1 / 1 | 1 / 1 | 0 (0) | 0 |" in (tmp_path / "demo" / "report.md").read_text()
    assert hd.verdict(tmp_path, "demo", "b1 (tree x)", "2" * 40) is None
    assert "Stale" in hd.evidence_section(tmp_path, "demo", "b1 (tree x)", "2" * 40)
    hd.sweep(None, tmp_path, "demo", "b" * 40, "2" * 40, "b1 (tree x)", **args)
    hd.sweep(None, tmp_path, "demo", "b" * 40, "2" * 40, "b1 (tree x)", isas=["native", "avx2"], ops=["MUL_MAT"])
    assert len(runs) == 3 and runs[-1][2:] == (("native", "avx2"), ("MUL_MAT",))


def test_a_new_base_is_exported_newer_than_the_last_build(tmp_path):
    """The archive dates files at their commit (2000 for an imported sdist): a re-export for a
    moved pin must still look newer than the objects built from the tree before, or the build
    is silently stale. The control: the same commit is not exported again."""
    import os
    import time
    from llamacpp_mla_port.process import git
    from llamacpp_mla_port.upstreaming.harness_diff import export_commit as _export
    src = tmp_path / "src"
    src.mkdir()
    git.run(src, "init", "-q", ".")
    ident = git.identity_env("a", "a@a", "2000-01-01T00:00:00Z")
    shas = []
    for text in ("one\n", "two\n"):
        (src / "CMakeLists.txt").write_text(text)
        git.run(src, "add", "-A")
        git.run(src, "commit", "-q", "-m", text, env=ident)
        shas.append(git.run(src, "rev-parse", "HEAD"))
    repo = git.Repo(src)
    dest = tmp_path / "side" / "llama.cpp"
    _export(repo, shas[0], dest)
    built = tmp_path / "side" / "object.o"
    built.write_text("x")
    os.utime(built, (time.time() - 5, time.time() - 5))     # built after the first export
    _export(repo, shas[1], dest)
    assert (dest / "CMakeLists.txt").read_text() == "two\n"
    assert (dest / "CMakeLists.txt").stat().st_mtime > built.stat().st_mtime
    before = (dest / "CMakeLists.txt").stat().st_mtime_ns
    _export(repo, shas[1], dest)
    assert (dest / "CMakeLists.txt").stat().st_mtime_ns == before


@pytest.mark.build
@pytest.mark.slow
def test_every_architecture_passes_test_llama_archs_patched(llama_build):
    """The fast subset: upstream's harness over every architecture it knows, on the patched
    build (the series must not fail a case of any other model)."""
    proc = subprocess.run([str(llama_build / "bin" / "test-llama-archs"), "-s", "1"], capture_output=True,
                          text=True, timeout=900)
    res = hd.archs_results(proc.stdout)
    failed = sorted(k for k, v in res.items() if v == "FAIL")
    archs = {k.split("|")[0] for k, v in res.items() if v == "OK"}
    print(f"\ntest-llama-archs: {sum(v == 'OK' for v in res.values())} OK of {len(res)} rows, "
          f"{len(archs)} architectures")
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-2000:])
    assert len(archs) > 50 and {"dflash", "eagle3", "kimi-k3", "deepseek2", "qwen3"} <= archs, sorted(archs)


@pytest.mark.slow
@pytest.mark.build
def test_the_series_changes_no_case_of_upstreams_tests(patched_tree, llama_build):
    """The whole series against the pin, every ISA build: no case that passes on the base fails."""
    from llamacpp_mla_port.cli import main

    assert main(["harness-diff"]) == 0
