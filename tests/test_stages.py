"""The stage runner: one report shape for the proof, the bench and the canary."""

from __future__ import annotations

from llamacpp_mla_port.errors import BuildError
from llamacpp_mla_port.stages import StageFailed, Stages


def _boom():
    raise KeyError("bug")


def _port():
    raise BuildError("no compiler", "install one")


def test_every_stage_runs_and_a_bug_keeps_its_traceback():
    entries, seen = {}, []
    st = Stages(entries, log=lambda name, e: seen.append((name, e["ok"])))
    assert st.run("a", lambda: 42) == 42
    assert st.run("b", _port) is None
    assert st.run("c", _boom) is None
    assert st.run("d", lambda: "x") == "x"
    assert seen == [("a", True), ("b", False), ("c", False), ("d", True)]
    assert set(entries["a"]) == {"ok", "seconds"} and isinstance(entries["a"]["seconds"], float)
    assert entries["b"]["error"] == "no compiler\n  hint: install one" and "traceback" not in entries["b"]
    assert entries["b"]["kind"] == "BuildError" and entries["b"]["hint"] == "install one"
    assert entries["c"]["error"] == "KeyError: 'bug'" and "_boom" in entries["c"]["traceback"]
    assert st.failed == "b" and not st.ok


def test_stop_on_failure_skips_the_rest_and_merges_evidence():
    entries = {}
    st = Stages(entries, stop_on_failure=True, merge=True)
    st.run("a", lambda: {"found": 3})
    st.run("b", lambda: (_ for _ in ()).throw(StageFailed({"message": "bad hunk", "line": 7})))
    ran = []
    st.run("c", lambda: ran.append(1))
    st.skip_rest(["a", "b", "c"])
    assert ran == [] and st.failed == "b"
    assert entries["a"]["found"] == 3 and entries["a"]["ok"] is True
    assert entries["b"]["ok"] is False and entries["b"]["line"] == 7 and entries["b"]["error"] == "bad hunk"
    assert entries["c"] == {"ok": None, "skipped": "the b stage failed"}


def test_a_check_after_the_stage_can_fail_it():
    entries = {}
    st = Stages(entries)
    st.run("parity", lambda: {"x": 1})
    st.fail("parity", "a parity case is over its threshold")
    assert entries["parity"]["ok"] is False and "seconds" in entries["parity"] and not st.ok


def test_the_report_is_saved_after_every_stage_run_failed_or_skipped():
    entries, saved = {}, []
    st = Stages(entries, budget_s=100.0, save=lambda: saved.append(sorted(entries)))
    st.run("a", lambda: None)
    st.run("b", lambda: 1 / 0)
    st.run("c", lambda: None, needs_s=1e9)            # does not fit the budget: skipped, still saved
    assert saved == [["a"], ["a", "b"], ["a", "b", "c"]]
    assert entries["c"]["ok"] is None and "not run" in entries["c"]["skipped"]
