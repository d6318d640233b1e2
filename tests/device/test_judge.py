"""The device check's verdicts and tables without a build: the parity judge (the CPU's bounds,
like with like on a GPU: bounds, the controls' separation, every FAIL path), the figure of a
device run against the CPU's, the per-node profile's groups (on a profile the CPU build wrote),
the host stages' classification and row plan, and the model writer's plan."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llamacpp_mla_port.device import crossparity, host, judge, models, profile
from llamacpp_mla_port.proof.run.draft_logits import DraftLogits

DATA = Path(__file__).parent / "data"


def _row(threshold, worst, gross, subtle, cost_bound=None, vs64=0.0):
    return {"threshold": threshold, "worst_nmse": worst, "cost_bound": cost_bound, "worst_nmse_vs_float64": vs64,
            "nearest_gross_control": {"name": "causal_block", "nmse": gross}, "kq_scale_1pct": subtle,
            "compared": "staged", "worst_nmse_end_to_end": worst}


# docs/bounds.md's parity table (f16-cache, bf16): bound, worst CPU figure, nearest gross control, 1 % control
F16 = dict(threshold=1e-6, worst=3.8e-9, gross=2.4e-2, subtle=4.2e-5, cost_bound=2e-5, vs64=1.1e-6)
BF16 = dict(threshold=1e-5, worst=2.9e-7, gross=2.4e-2, subtle=4.9e-5, cost_bound=2e-3, vs64=1.1e-4)


# ---------------------------------------------------------------------------------------
# the CPU's own bounds

@pytest.mark.parametrize("mode", [F16, BF16], ids=["f16-cache", "bf16"])
def test_cpu_bounds_and_every_control_fails(mode):
    row = _row(**mode)
    j = judge.judge_cpu_mode(row)
    assert j["ok"] and j["bound"] == mode["threshold"]
    assert j["headroom"] == pytest.approx(mode["threshold"] / mode["worst"])
    for figure in (mode["gross"], mode["subtle"], mode["gross"] / 100, mode["threshold"] * 1.01):
        assert not judge.judge_cpu_mode(row, figure)["ok"], figure
    assert not judge.judge_cpu_mode(_row(**{**mode, "vs64": mode["cost_bound"] * 1.5}))["ok"]     # over the cost
    # a bound the controls do not clear by their margins is no bound: the subtle control at 1.5x the bound
    assert not judge.judge_cpu_mode(_row(**{**mode, "subtle": mode["threshold"] * 1.5}))["ok"]


def test_cpu_parity_counts_chains_and_controls():
    case = {"chain_ok": True, "chain_equal": True}
    report = {"modes": {"f16-cache": _row(**F16)},
              "configs": {"a": {"modes": {"f16-cache": {"cases": [case, dict(case)]}}}}}
    judged = judge.judge_cpu_parity(report)["f16-cache"]
    assert judged["ok"] and judged["cases"] == 2 and all(judged["controls_fail"].values())
    report["configs"]["a"]["modes"]["f16-cache"]["cases"][1] = {"chain_ok": False, "chain_equal": False}
    assert not judge.judge_cpu_parity(report)["f16-cache"]["ok"]


# ---------------------------------------------------------------------------------------
# like with like on a GPU

#: the first H200 run's flash-attention figures (docs/device/h200-2026-12-04.md): CUDA's rounding
#: 6.05e-06, the causal-block control 5.0e-04 (83x), the gross ones of this check far above
CONTROLS = {"mscale_dropped": 2.8e-2, "latent_rope_swapped": 1.4, "k_b_v_b_swapped": 1.9}


def test_like_with_like_bound_and_separation():
    j = judge.judge_like(6.05e-6, 1.5e-6, CONTROLS)
    assert j["ok"] and j["bound"] == pytest.approx(1.5e-5) and j["headroom"] == pytest.approx(1.5e-5 / 6.05e-6)
    assert j["separation"]["mscale_dropped"] == pytest.approx(2.8e-2 / 6.05e-6)
    assert all(j["controls_fail"].values()) and j["why"] == []


def test_like_with_like_fail_paths():
    # over 10x deepseek2's deviation: FAIL, whatever the controls
    over = judge.judge_like(2e-5, 1.5e-6, CONTROLS)
    assert not over["ok"] and "> 10 x deepseek2" in over["why"][0]
    # a control only 83x above the draft (the first run's causal block): FAIL inside the bound
    near = judge.judge_like(6.05e-6, 1.5e-6, {**CONTROLS, "causal_block": 5.0e-4})
    assert not near["ok"] and near["within"] and any("only 83x" in w for w in near["why"])
    # a bound widened by a noisy yardstick does not pass alone: the controls no longer fail it
    wide = judge.judge_like(1e-4, 1e-2, CONTROLS)
    assert not wide["ok"] and wide["within"] and not wide["controls_fail"]["mscale_dropped"]
    # deepseek2 exact, the draft not: FAIL; both exact: ok (the dry run)
    assert not judge.judge_like(1e-12, 0.0, CONTROLS)["ok"]
    exact = judge.judge_like(0.0, 0.0, CONTROLS)
    assert exact["ok"] and all(math.isinf(s) for s in exact["separation"].values())
    # no control ran, or a flipped chain away from a near-tie: FAIL
    assert not judge.judge_like(0.0, 0.0, {"mscale_dropped": None})["ok"]
    assert not judge.judge_like(6.05e-6, 1.5e-6, CONTROLS, chains_ok=False)["ok"]


def _logits(rng, chain, n=4, v=16) -> DraftLogits:
    biased = rng.normal(size=(n, v)).astype(np.float32)
    return DraftLogits(biased, np.array(chain, dtype=np.int32), np.zeros((n, 8), np.float32),
                       biased.astype(np.float64), None, {}, Path("."))


def test_figure_stops_the_biased_logits_at_the_first_chain_difference():
    rng = np.random.default_rng(0)
    cpu = _logits(rng, [1, 2, 3, 4])
    dev = DraftLogits(cpu.biased_logits.copy(), np.array([1, 2, 9, 9], np.int32), cpu.hidden, cpu.base_logits,
                      None, {}, Path("."))
    dev.biased_logits[3] += 100.0          # conditioned on another token: not compared
    f = crossparity.figure(dev, cpu)
    assert f["worst"] == 0.0 and not f["chain_equal"] and f["chain_first_difference"] == 2
    dev.biased_logits[2] += 1.0            # the first differing row is compared
    assert crossparity.figure(dev, cpu)["nmse_biased_logits"] > 0


def test_summary_of_a_mode_allows_a_flip_only_at_a_near_tie():
    case = {"draft": {"worst": 6e-6, "chain_equal": True}, "twin": 1.5e-6, "controls": dict(CONTROLS),
            "draft_fallback_ops": [], "twin_fallback_ops": ["FLASH_ATTN_EXT"]}
    flip_tie = {**case, "draft": {"worst": 6e-6, "chain_equal": False, "cpu_margin": 1e-4}}
    flip_far = {**case, "draft": {"worst": 6e-6, "chain_equal": False, "cpu_margin": 0.5}}
    assert crossparity.summarize([case, flip_tie])["ok"]
    s = crossparity.summarize([case, flip_far])
    assert not s["ok"] and s["chains_equal"] == 1 and s["twin_fallback_ops"] == ["FLASH_ATTN_EXT"]


# ---------------------------------------------------------------------------------------
# the profile's groups

def test_profile_groups_on_a_block_the_cpu_build_profiled():
    nodes = json.loads((DATA / "block-profile-cpu.json").read_text())["profile"]
    groups = profile.node_groups(nodes)
    by = {(n["op"], n["name"]): g for n, g in zip(nodes, groups)}
    assert by[("MUL_MAT", "result_output")] == "lm_head" and groups.count("lm_head") == 1
    assert by[("MUL_MAT", "ffn_up-0")] == "ffn" and by[("MUL_MAT", "fattn_mla-1")] == "attention"
    assert by[("GET_ROWS", "inp_noise_embd")] == "other" and by[("ADD", "l_out-1")] == "other"
    head = groups.index("lm_head")
    assert set(groups[head + 1:]) == {"markov_head"} and "markov_head" not in groups[:head]
    # unnamed nodes take the next named node's part: the q_a product before q-0, the norm before ffn_norm-0
    i = next(k for k, n in enumerate(nodes) if n["name"] == "ffn_norm-0")
    assert nodes[i - 1]["op"] == "RMS_NORM" and groups[i - 1] == "ffn"
    assert groups[[n["name"] for n in nodes].index("node_3")] == "attention"
    prof = profile.block_profile(nodes, dict.fromkeys(profile.GROUPS, 10**6), 10.0)
    assert sum(g["nodes"] for g in prof["groups"].values()) == len(nodes)
    assert prof["per_node_sync_s"] > 0 and prof["noop_nodes"] > 0
    assert prof["groups"]["lm_head"]["floor_s"] == pytest.approx(1e-4)


# ---------------------------------------------------------------------------------------
# the host stages

def _proc(code: str, out: str = "") -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    p.stdout += out
    p.seconds = 0.1
    return p


def test_a_real_abort_and_a_run_are_told_apart():
    aborted = host.classify(_proc("import os, sys; sys.stderr.write('ggml.c:1: GGML_ASSERT(*cur_backend_id != -1) "
                                  "failed\\\\n'); sys.stderr.flush(); os.abort()"))
    assert aborted["outcome"] == "aborted" and host.ABORT_18099 in aborted["assert"] and aborted["returncode"] == -6
    ran = host.classify(_proc("import sys; sys.stderr.write('load_tensors:   AMX model buffer size = 1.00 MiB\\\\n')",
                              json.dumps({"n_prompt": 512, "n_gen": 0, "avg_ts": 10.0}) + "\n"))
    assert ran["outcome"] == "ran" and ran["model_buffers"] == ["AMX"]
    assert host.classify(_proc("import sys; sys.exit(3)"))["outcome"] == "failed"
    # ggml's AMX Q8_0 tile bug as GCC 12 builds it dies of SIGILL (issue 33): a crash, not an abort
    assert host.classify(_proc("import os, signal; os.kill(os.getpid(), signal.SIGILL)"))["outcome"] == \
        "crashed (SIGILL)"


def test_thread_rows_run_the_cheap_groups_first_and_cap_a_dry_depth():
    stacks = {"cpu-q0-odd-columns": {"bench": {"types": ["q8_0", "q4_0"], "prompts": "1,2", "args": ["--repack", "0"]}},
              "cpu-fa-kv-head-tiles": {"bench": {"types": ["q8_0"], "prompts": "1", "reps": 1,
                                                 "args": ["-fa", "1", "-d", "0,4096"]}}}
    mods = {"cpu-q0-odd-columns:q8_0": "a", "cpu-q0-odd-columns:q4_0": "b", "cpu-fa-kv-head-tiles:q8_0": "c"}
    groups = host.thread_row_groups(stacks, mods)
    assert [g["threads"] for g in groups[:3]] == [16, 16, 16] and groups[-1]["args"][-1] == "4096"
    assert all(g["args"][-1] == "0" for g in groups[:12]) and len(groups) == 4 * 3 + 4
    assert groups[0]["args"][:2] == ["-p", host.THREAD_PROMPTS["cpu-q0-odd-columns"]]
    assert "--repack" in groups[0]["args"] and groups[2]["args"][groups[2]["args"].index("-r") + 1] == "1"
    dry = host.thread_row_groups(stacks, mods, (2,), max_depth=256, prompts="1,7")
    assert {g["args"][-1] for g in dry} == {"0", "256"} and all(g["args"][1] == "1,7" for g in dry)


def test_ratios_are_the_stacks_median_over_the_bases():
    rows = [{"model_filename": "/m/x-q8_0.gguf", "n_prompt": 7, "avg_ts": ts, "side": side}
            for side, ts in (("base", 10.0), ("s", 12.0), ("s", 14.0), ("base", 10.0))]
    assert host.ratios(rows, "s") == {"x-q8_0 pp7": pytest.approx(1.3)}


def test_the_model_plan_follows_the_stages(tmp_path):
    variants = {"stacks": {"cpu-q0-odd-columns": {"bench": {"types": ["q8_0", "q4_0"], "shape": "llama-3.2-3b"}},
                           "loader-probe": {"bench": None}}}
    jobs = models.plan_jobs(("build", "realsize", "host", "threads"), tmp_path, tmp_path / "fx", False, variants)
    assert list(jobs) == ["realsize", "repro", "cpu-q0-odd-columns:q8_0", "cpu-q0-odd-columns:q4_0"]
    assert jobs["repro"] == {"kind": "standard", "shape": "deepseek-v2-lite", "qtype": "q8_0", "n_layer": 1,
                             "out": str(tmp_path / "models" / "deepseek-v2-lite-1L-q8_0.gguf")}
    assert jobs["cpu-q0-odd-columns:q4_0"]["n_layer"] == 4 and not jobs["realsize"]["reduced"]
    dry = models.plan_jobs(("parity", "host"), tmp_path, tmp_path / "fx", True, variants)
    assert list(dry) == ["repro"] and dry["repro"]["kind"] == "twin"


def test_a_group_is_estimated_from_the_same_rows_at_more_threads():
    g = {"model": "m", "threads": 4, "args": ["-d", "0"]}
    assert host.estimate({}, g) == pytest.approx(5.0 * 16 / 4)
    measured = {(("m", "0"), 16): 2.0, (("m", "0"), 8): 3.0, (("other", "0"), 16): 0.1, (("m", "4096"), 16): 9.0}
    assert host.estimate(measured, g) == pytest.approx(min(2.0 * 16 / 4, 3.0 * 8 / 4))
    assert host.estimate(measured, {**g, "threads": 16}) == pytest.approx(2.0)


#: a stand-in for llama-bench: SPEED tokens/s per row of -p and -n; ABORT_DEFAULT=1 aborts as
#: #18099 does unless the command says --repack 0
FAKE_BENCH = """#!{python}
import json, os, sys
argv = sys.argv[1:]
if os.environ.get("ABORT_DEFAULT_{side}") == "1" and "--repack" not in argv:
    sys.stderr.write("ggml-backend.cpp:1434: GGML_ASSERT(*cur_backend_id != -1) failed\\n"); sys.stderr.flush()
    os.abort()
def arg(flag, default):
    return argv[argv.index(flag) + 1] if flag in argv else default
repack = "--repack" not in argv or arg("--repack", "1") == "1"
for p in [int(x) for x in arg("-p", "0").split(",") if x != "0"]:
    print(json.dumps({{"model_filename": arg("-m", "m"), "n_prompt": p, "n_gen": 0, "repack": repack,
                      "avg_ts": float(os.environ["SPEED_{side}"])}}))
for n in [int(x) for x in arg("-n", "0").split(",") if x != "0"]:
    print(json.dumps({{"model_filename": arg("-m", "m"), "n_prompt": 0, "n_gen": n, "repack": repack,
                      "avg_ts": float(os.environ["SPEED_{side}"])}}))
"""


def _fake_benches(tmp_path: Path, monkeypatch, speeds: dict[str, float], abort_default=()) -> dict[str, Path]:
    bins = {}
    for side, speed in speeds.items():
        key = side.upper().replace("-", "_")
        path = tmp_path / side / "llama-bench"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(FAKE_BENCH.format(python=sys.executable, side=key))
        path.chmod(0o755)
        monkeypatch.setenv(f"SPEED_{key}", str(speed))
        monkeypatch.setenv(f"ABORT_DEFAULT_{key}", "1" if side in abort_default else "0")
        bins[side] = path
    return bins


def test_thread_rows_move_to_repack_0_after_an_abort_at_the_default(tmp_path, monkeypatch):
    """#18099 on an AMX host: the base aborts at llama.cpp's default repacking with an MLA model;
    the group (and every later one) runs again at --repack 0 on both sides, and says why."""
    bins = _fake_benches(tmp_path, monkeypatch, {"base": 10.0, "cpu-fa-kv-head-tiles": 12.0}, abort_default=("base",))
    groups = host.thread_row_groups({"cpu-fa-kv-head-tiles": {"bench": {"types": ["q8_0"], "prompts": "1,7",
                                                                        "args": ["-fa", "1", "-d", "0,256"]}}},
                                    {"cpu-fa-kv-head-tiles:q8_0": tmp_path / "m.gguf"}, (2,))
    rep = host.thread_rows(bins, groups, tmp_path / "rows.jsonl", lambda: 600.0, log=lambda m: None)
    assert len(rep["groups"]) == 2 and not rep["dropped"]
    for g in rep["groups"]:
        assert "aborted" in g["note"] and g["args"][g["args"].index("--repack") + 1] == "0", g
        assert g["args"][-2:] in (["-d", "0"], ["-d", "256"]) and all(r["outcome"] == "ran" for r in g["runs"])
        prompts = host.THREAD_PROMPTS["cpu-fa-kv-head-tiles"].split(",")
        assert g["ratios"] == {f"m pp{p}": pytest.approx(1.2) for p in prompts}
    # without the abort nothing moves
    monkeypatch.setenv("ABORT_DEFAULT_BASE", "0")
    rep = host.thread_rows(bins, groups[:1], tmp_path / "rows2.jsonl", lambda: 600.0, log=lambda m: None)
    assert "note" not in rep["groups"][0] and "--repack" not in rep["groups"][0]["args"]


@pytest.mark.parametrize("branch_speed, moved", [(104.0, False), (40.0, True)])
def test_the_reproducers_repack_0_control_says_when_the_machine_was_busy(tmp_path, monkeypatch, branch_speed, moved):
    """At --repack 0 base and branch run the same code: a ratio off 1 beyond a VM's noise is named."""
    bins = _fake_benches(tmp_path, monkeypatch, {"base": 100.0, "loader-probe": branch_speed})
    rep = host.reproduce_18099(bins["base"], bins["loader-probe"], tmp_path / "m.gguf", False, 2, reps=1)
    assert rep["ok"] and rep["control"] == {"pp512": branch_speed / 100, "tg128": branch_speed / 100}
    assert ("the --repack 0 control moved (pp512 0.40x, tg128 0.40x): outside 0.8-1.25" in rep["verdict"]) \
        is moved
