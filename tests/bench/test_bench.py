"""The benchmark's parts at tiny size (the real-size run itself is `make bench`, a script):
the PyTorch draft computes the draft (against the float64 reference), the work counts match
an independent count from the config, the C++ timing programs run and report what they
measured, the speculative statistics line of this llama.cpp parses, the report renders."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from llamacpp_mla_port.bench import floors as fl
from llamacpp_mla_port.bench.report import render_markdown, write_report
from llamacpp_mla_port.bench.passes import summarize_profile
from llamacpp_mla_port.bench.spec import _STATS
from llamacpp_mla_port.errors import ProofError


@pytest.fixture(scope="module")
def target(llama_build, tmp_path_factory):
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
    from llamacpp_mla_port.proof import parity
    from llamacpp_mla_port.fixtures.target_variants import target_with_layers
    d = tmp_path_factory.mktemp("target")
    # deep enough for the parity drafts' taps (the runtime refuses a tap past the target's layers)
    return target_with_layers(write_kimi_k3_target(llama_build, d / "kimi-k3.gguf"), d, parity.TARGET_LAYERS_NEEDED)


@pytest.fixture(scope="module")
def tiny_pair(patched_tree, target, tmp_path_factory):
    """(config, checkpoint dir, BF16 draft GGUF, target) of the first parity shape."""
    from llamacpp_mla_port.proof import parity
    from llamacpp_mla_port.proof.reference.model import read_target_head

    embd, _ = read_target_head(target)
    pcfg = parity.PARITY_CONFIGS[0]
    ckpt, draft = parity.make_draft(patched_tree, tmp_path_factory.mktemp("bench-pair"), pcfg, embd.shape[1],
                                    embd.shape[0], "bfloat16")
    return parity.hf_config(pcfg, embd.shape[1], embd.shape[0]), ckpt, draft, target


#: the PyTorch draft in float64 against the float64 reference (the same on every CPU), and the
#: BF16 run the bench times: a sanity bound (its rounding depends on the CPU's BF16 kernels)
TORCH_F64_BOUND = 1e-12
TORCH_BF16_SANITY = 0.1


def _torch_block(ckpt, target, ref, dtype=None):
    from llamacpp_mla_port.bench.torch_draft import TorchDraft

    draft = TorchDraft.load(ckpt, target, dtype)
    rng = np.random.default_rng(3)
    feats = rng.standard_normal((40, ref.config.n_taps * ref.config.target_hidden_size)).astype(np.float32)
    pos = 100 + np.arange(40)
    draft.inject(feats[:25], pos[:25])          # two injections append to the cache
    draft.inject(feats[25:], pos[25:])
    ids = [5] + [ref.config.mask_token_id] * 6
    logits, hidden, chain = draft.block(ids, 140)
    return draft, feats.astype(np.float64), pos, ids, logits, hidden, chain


@pytest.mark.build
@pytest.mark.slow
def test_torch_draft_is_the_draft(tiny_pair):
    import torch

    from llamacpp_mla_port.proof.reference.model import DraftReference, nmse

    torch.set_num_threads(1)
    cfg, ckpt, _, target = tiny_pair
    ref = DraftReference.load(ckpt, target)
    _, feats, pos, ids, logits, hidden, chain = _torch_block(ckpt, target, ref, torch.float64)
    want = ref.forward(feats, ids, ctx_positions=pos, chain=chain)
    causal = ref.forward(feats, ids, ctx_positions=pos, chain=chain, causal=True)
    f64 = (nmse(logits, want.biased_logits), nmse(hidden, want.hidden))
    draft, _, _, _, logits, hidden, chain = _torch_block(ckpt, target, ref)
    want_bf16 = ref.forward(feats, ids, ctx_positions=pos, chain=chain)
    bf16 = (nmse(logits, want_bf16.biased_logits), nmse(hidden, want_bf16.hidden))
    print(f"\ntorch draft vs float64 reference: float64 logits {f64[0]:.2e} hidden {f64[1]:.2e} "
          f"(bound {TORCH_F64_BOUND:.0e}); bf16 logits {bf16[0]:.2e} hidden {bf16[1]:.2e}; causal control "
          f"{nmse(causal.biased_logits, want.biased_logits):.2e}")
    assert max(f64) < TORCH_F64_BOUND
    assert nmse(causal.biased_logits, want.biased_logits) > TORCH_F64_BOUND     # the control must fail
    assert max(bf16) < TORCH_BF16_SANITY
    # the cache rolls back like llama.cpp's: the same block twice gives the same logits
    draft.truncate(40)
    again, _, _ = draft.block(ids, 140)
    assert np.array_equal(again, logits)


@pytest.mark.build
def test_work_counts_match_the_config(tiny_pair):
    cfg, _, draft, target = tiny_pair
    h, n_head, nope, rope, v = (cfg[k] for k in ("hidden_size", "num_attention_heads", "qk_nope_head_dim",
                                                 "qk_rope_head_dim", "v_head_dim"))
    q_lora, lora, ff, vocab, rank = (cfg[k] for k in ("q_lora_rank", "kv_lora_rank", "intermediate_size",
                                                      "vocab_size", "markov_rank"))
    B, C = 7, 33
    w = fl.block_work(draft, target, B, C)
    per_layer = h * q_lora + q_lora * n_head * (nope + rope) + h * (lora + rope) + n_head * v * h + 3 * h * ff
    assert w.matmul_flops == 2 * B * (cfg["num_hidden_layers"] * per_layer + vocab * h + vocab * rank)
    rows = C + B
    attn = 2 * B * n_head * (nope * lora + v * lora + rows * (2 * lora + rope))
    assert w.attention_flops == cfg["num_hidden_layers"] * attn
    # BF16 matrices (2 bytes), F32 norms; the target head is F32 in this fixture
    assert w.bytes_weights > 2 * cfg["num_hidden_layers"] * per_layer + 4 * vocab * h
    inj = fl.inject_work(draft, 64)
    n_taps = len(cfg["target_layer_ids"])
    assert inj.matmul_flops == 2 * 64 * (h * n_taps * h + cfg["num_hidden_layers"] * h * (lora + rope))
    specs = fl.gemm_specs([w, inj])
    # every weight shape once, rows as they are (all below the cap here)
    assert f"bf16:{h}:{ff}:{fl.GEMM_N}" in specs and f"bf16:{n_taps * h}:{h}:{fl.GEMM_N}" in specs
    assert f"bf16:{ff}:{h}:{fl.GEMM_N}" in specs and len(specs) == len(set(specs))
    assert {f"bf16:{ff}:{h}:{n}" for n in fl.COMPUTE_NS} <= set(specs)      # each shape at every compute N
    # the two largest shapes per weight type once more at the block's width (the tiny target's head is F32)
    stream = {sp for sp in fl.gemm_specs([w, inj], stream_n=7) if sp.endswith(":7")}
    assert stream == {f"bf16:{n_taps * h}:{h}:7", f"bf16:{ff}:{h}:7", f"f32:{h}:{vocab}:7"}


@pytest.mark.build
def test_ggml_floor_measures(patched_tree, llama_build, tmp_path):
    m = fl.measure(patched_tree, llama_build, tmp_path / "f.json", ["bf16:256:64:16", "q8_0:256:64:16"], threads=1,
                   bw_mib=64, repeats=1, extra_bufts=False)
    # the CPU share is reported, not judged: a loaded machine lowers it, and a ~10 ms run at the
    # clock's granularity can read above 1
    assert m.bandwidth_gbps > 0 and m.bandwidth_cpu_share > 0
    assert set(m.gemm) == {("bf16", 256, 64, 16), ("q8_0", 256, 64, 16)}
    assert all(g["gflops"] > 0 and g["buft"] == "CPU" for g in m.gemm.values())
    # the compute floor looks rates up at N = GEMM_N: measure that shape too
    m.gemm[("bf16", 256, 64, fl.GEMM_N)] = m.gemm[("bf16", 256, 64, 16)]
    floor = fl.floor_seconds(fl.PassWork("x", 10**9, 0, [("w", "bf16", 256, 64, 10**9)], 0), m)
    assert math.isclose(floor["memory_s"], 1.0 / m.bandwidth_gbps)
    assert floor["floor_s"] == max(floor["memory_s"], floor["compute_s"])
    # the rate is the best over the compute column counts: a faster N = 64 sets it
    fast = {**m.gemm[("bf16", 256, 64, 16)], "gflops": 2 * m.gemm[("bf16", 256, 64, 16)]["gflops"]}
    m.gemm[("bf16", 256, 64, 64)] = fast
    assert m.rate("bf16", 256, 64) == fast["gflops"] * 1e9
    with pytest.raises(ProofError, match="no GEMM rate"):
        m.rate("bf16", 512, 64)


@pytest.mark.build
def test_n_sweep_measures_each_product_against_its_floor(patched_tree, llama_build, tmp_path):
    from llamacpp_mla_port.bench import sweep

    sw = sweep.run_sweep(patched_tree, llama_build, tmp_path / "s.json", threads=1, repeats=1,
                         shapes={"w": (256, 64)}, n_values=(1, 7), bw_mib=64)
    assert [(r["type"], r["n"]) for r in sw["rows"]] == [("bf16", 1), ("bf16", 7), ("q8_0", 1), ("q8_0", 7)]
    # where llama.cpp's own buffer choice dies (AMX built by GCC 12), the sweep says so and goes on
    assert all("measured with extra buffer types off" in n for n in sw["notes"]), sw["notes"]
    for r in sw["rows"]:
        assert r["seconds"] > 0 and r["compute_s"] > 0 and r["memory_s"] > 0
        assert math.isclose(r["ratio_to_floor"], r["seconds"] / max(r["memory_s"], r["compute_s"]), rel_tol=1e-2)
    # the compute floor is FLOPs at the best N >= 32 rate: 7 columns cost 7x one column's
    by_n = {(r["type"], r["n"]): r for r in sw["rows"]}
    assert math.isclose(by_n[("bf16", 7)]["compute_s"], 7 * by_n[("bf16", 1)]["compute_s"], rel_tol=1e-2)
    assert sweep.table(sw)[2].startswith("| bf16 | w | 1 |")
    assert sweep.plot(sw, tmp_path / "p.png").stat().st_size > 1000

    # against a baseline build (here the same build: before and after measure alike)
    sw2 = sweep.run_sweep(patched_tree, llama_build, tmp_path / "s.json", threads=1, repeats=1,
                          shapes={"w": (256, 64)}, n_values=(7,), bw_mib=64, baseline=llama_build, rounds=2)
    assert sw2["rounds"] == 2 and all(r["before_seconds"] > 0 and r["speedup"] > 0 for r in sw2["rows"])
    assert "before / after" in sweep.table(sw2)[0]
    assert sweep.plot(sw2, tmp_path / "p2.png").stat().st_size > 1000


def _draft_bench(tree, build, pair, out, *args, timeout: float = 300):
    """draft-bench on the tiny pair, writing OUT: the finished process."""
    from llamacpp_mla_port import process
    from llamacpp_mla_port.proof.run.programs import compile_program

    _, _, draft, target = pair
    exe = compile_program("draft-bench", tree, build)
    return process.run([exe, "--draft", draft, "--target", target, "--out", out, *args], timeout=timeout)


@pytest.mark.build
def test_draft_bench_times_both_passes_and_profiles(patched_tree, llama_build, tiny_pair, tmp_path):
    out = tmp_path / "b.json"
    proc = _draft_bench(patched_tree, llama_build, tiny_pair, out, "--inject", "1,16", "--block-ctx", 16,
                        "--repeats", 2, "--threads", 1, "--profile", "--profile-inject", "1,16", "--bw-mib", 8)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert len(res["block_seconds"]) == 2 and all(s > 0 for s in res["block_seconds"])
    assert set(res["inject"]) == {"1", "16"}
    # one bandwidth read before every timed pass, each over the whole buffer (its sum is checked)
    assert res["bw_bytes"] == 8 << 20
    assert len(res["block_bw_gbps"]) == 2 and all(g > 0 for g in res["block_bw_gbps"])
    assert all(len(res["inject_bw_gbps"][n]) == len(res["inject"][n]) == 2 for n in ("1", "16"))
    # one profile per injection size, the fc product in each
    assert set(res["profile_inject"]) == {"1", "16"}
    for n, p in res["profile_inject"].items():
        fc = [nd for nd in p["nodes"] if nd["op"] == "MUL_MAT" and nd["ne1"][1] == int(n)]
        assert p["seconds"] > 0 and fc, n
    ops = {n["op"] for n in res["profile"]}
    assert {"MUL_MAT", "RMS_NORM", "ROPE", "SOFT_MAX"} <= ops
    names = {n["name"] for n in res["profile"]}
    assert "q_nope_absorbed-0" in names and "result_output" in names
    prof = summarize_profile(res["profile"], res["profiled_block_seconds"])
    assert math.isclose(sum(o["share"] for o in prof["by_op"]), 1.0, abs_tol=1e-3)


@pytest.mark.build
def test_draft_bench_repeats_a_pass_until_min_seconds(patched_tree, llama_build, tiny_pair, tmp_path):
    out = tmp_path / "b.json"
    # --min-seconds S on tiny passes: more runs than --repeats, until they add up to S (or 200 runs).
    # Here 2 block runs took <= 1.2 ms and 199 took 80-120 ms: S = 20 ms stops the block by S, so
    # a loop that ignored S (always 200 runs) fails the second assertion
    s = 0.02
    proc = _draft_bench(patched_tree, llama_build, tiny_pair, out, "--inject", "1", "--block-ctx", 4,
                        "--repeats", 2, "--threads", 1, "--min-seconds", s)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    for runs in (res["inject"]["1"], res["block_seconds"]):
        # the JSON keeps microseconds: each run is rounded by up to 0.5 us
        assert len(runs) > 2 and (sum(runs) + 5e-7 * len(runs) >= s or len(runs) == 200)
        assert sum(runs[:-1]) < s      # and no run past the first that reached it
    assert res["block_bw_gbps"] == [] and res["bw_bytes"] == 0     # no --bw-mib: no reads
    bad = _draft_bench(patched_tree, llama_build, tiny_pair, out, "--min-seconds", -1, timeout=60)
    assert bad.returncode != 0 and "--min-seconds" in bad.stderr


def test_pass_entry_pairs_each_run_with_its_bandwidth():
    work = fl.PassWork("x", 10**9, 0, [], 0)           # 1 GB read, no FLOPs
    floor = {"memory_s": 0.05, "compute_s": 0.0, "floor_s": 0.05, "bound": "memory"}    # at 20 GB/s
    # the slow runs met a slow machine: each run at 1.1x the floor of its own moment
    e = fl.pass_entry(work, floor, [0.055, 0.11, 0.11], [0.055, 0.1, 0.1], [20.0, 10.0, 10.0], threads=1)
    assert e["runs"] == 3 and e["seconds"] == 0.055 and e["ratio_to_floor"] == 1.1
    assert e["ratio_paired_median"] == 1.1 and e["bandwidth_paired_gbps_median"] == 10.0
    # the control: the same times at a steady bandwidth pair as they are
    e = fl.pass_entry(work, floor, [0.055, 0.11, 0.11], [0.055, 0.1, 0.1], [20.0, 20.0, 20.0], threads=1)
    assert e["ratio_paired_median"] == 2.2
    # a compute-bound pass: the bandwidth does not move its floor
    e = fl.pass_entry(work, {**floor, "compute_s": 0.2, "floor_s": 0.2}, [0.22], [0.22], [5.0], threads=1)
    assert e["ratio_paired_median"] == 1.1
    assert "ratio_paired_median" not in fl.pass_entry(work, floor, [0.055], [0.055], [], threads=1)
    with pytest.raises(ProofError, match="bandwidth samples"):
        fl.pass_entry(work, floor, [0.055, 0.06], [0.055, 0.06], [20.0], threads=1)


def test_speculative_statistics_line_parses():
    # llama-speculative-simple -lv 4 at the pinned llama.cpp
    line = ("spec common_specu: statistics     draft-dspark: #calls(b,g,a) =    1     22     22, #gen drafts =     22, "
            "#acc drafts =    15, #gen tokens =    138, #acc tokens =    43, #mean acc len = 2.95, "
            "#acc rate/pos = (0.682, 0.545, 0.273, 0.136, 0.136, 0.136, 0.045), dur(b,g,a) = 0.007, 2187.468, 0.028 ms")
    m = _STATS.search(line)
    assert m and m.group(2) == "22" and m.group(5) == "43" and m.group(9) == "2187.468"
    assert [float(x) for x in m.group(7).split(",")][0] == 0.682


def _draft_length_entry() -> dict:
    """The draft_length stage's report entry for made-up costs, through JSON (keys become strings)."""
    from llamacpp_mla_port.bench import acceptance as acc
    from llamacpp_mla_port.bench import speedup

    scaled = {n: {"total": 0.3 * (1 + (n - 1) * 2 / 7), "fixed": 0.1, "kda_layers": 0.1, "mla_layers": 0.05,
                  "routed_experts": 0.05, "negative_terms": []} for n in range(1, 9)}
    costs = speedup.StepCosts(0.3, {n: v["total"] for n, v in scaled.items()}, {}, {k: 0.05 for k in range(1, 8)},
                              {1: 0.01, 8: 0.02})
    tab = speedup.table(costs, list(acc.PUBLISHED))
    per_n = {n: {"distinct_mean": 16.0 * n, "bound_identical": 16.0, "bound_independent": 15.0 * n}
             for n in range(1, 9)}
    entry = {"files": {"F2": {"layers": "DKKKKM", "n_ff_exp": 32, "path": "f", "bytes": 1}}, "depth": 512,
             "threads": 2, "cpu_share": 0.9, "per_file_spec_s": {"F2": {n: 0.2 for n in range(1, 9)}},
             "scaled_spec": scaled, "scaled_alone_1": {"total": 0.3}, "experts": {"per_n": per_n},
             "scaled_spec_identical": {n: 0.3 for n in range(1, 9)}, "read_rate_gbps": 20.0,
             "scaled_spec_independent": {n: 0.3 * n for n in range(1, 9)},
             "expert_bytes_real": 17547264, "moe_layers_real": 92, "pair": "F2", "draft": "d/draft-q8_0.gguf",
             "table": tab, "table_md": speedup.render(tab), "recommended": speedup.recommended(tab)}
    return json.loads(json.dumps(entry))


def test_report_renders_tables_and_plots(tmp_path):
    entry = {"bytes_weights": 6_500_000_000, "bytes_cache": 3_000_000, "flops": 46_000_000_000, "memory_s": 0.6,
             "compute_s": 0.3, "floor_s": 0.6, "bound": "memory", "seconds": 0.7, "seconds_median": 0.72,
             "cpu_share": 0.98, "ratio_to_floor": 1.17, "runs": 3, "ratio_paired_median": 1.05,
             "bandwidth_paired_gbps_median": 19.5}
    fc = {"name": "node_0", "op": "MUL_MAT", "type0": "bf16", "type1": "f32", "ne": [7168, 1, 1, 1],
          "ne0": [35840, 7168, 1, 1], "ne1": [35840, 1, 1, 1], "seconds": 0.02, "cpu_seconds": 0.02}
    prof = summarize_profile([fc], 0.021)
    report = {"threads": 2, "total_seconds": 900, "stages": {"tool": {"ok": False, "error": "boom"}},
              "passes": {"bf16": {"block": entry, "inject 512": entry, "note": None, "peak_rss_bytes": 9e9,
                                  "file_bytes": 9.8e9, "extra_bufts": True, "profile": {},
                                  "profile_inject": {"1": prof, "512": prof}}},
              "floors": {"bandwidth_gbps": 20.1, "bandwidth_cpu_share": 0.97, "bandwidth_1_thread_gbps": 11.2,
                         "gemm": [], "bandwidth_floor_gbps": 23.4,
                         "bandwidth_passes_gbps": {"best": 23.4, "median": 17.9, "samples": 90}},
              "kv": {"n_ctx": 512, "ctx_pos0": 40000, "layers": 5, "latent_width": 576,
                     "values_per_token": {"mla_latent": 2880, "decompressed": 102400},
                     "bytes_per_token": {"f32": 11520.0, "f16": 5760.0, "q8_0": 3060.0},
                     "bytes_per_token_decompressed_f16": 204800, "v_cache_empty": {"f16": True},
                     "nmse_vs_f32_cache": {"q8_0-fa": {"biased_logits": 1e-5, "hidden": 1e-5, "chain_equal": True}},
                     "nmse_q8_0_vs_f16_same_kernel": {"biased_logits": 2e-6, "hidden": 1e-6, "chain_equal": True}},
              "spec": {"pair": "tiny", "steps": 10, "prompts": 2, "draft_max": 7, "draft_ms_per_step": 5.0,
                       "target_and_rest_ms_per_step": 10.0, "draft_share": 0.33, "mean_accept_len": 2.5,
                       "acceptance_per_position": [0.7, 0.5, 0.2, 0.1, 0.0, 0.0, 0.0]},
              "sweep": {"threads": 2, "repeats": 5, "rounds": 3, "baseline": "work/build-base", "bandwidth_gbps": 22.8,
                        "n_compute": [32, 64, 512],
                        "rows": [{"type": "q8_0", "shape": "lm_head", "k": 7168, "m": 16384, "n": 7, "seconds": 0.021,
                                  "gbps": 5.9, "gflops": 78.0, "memory_s": 0.0055, "compute_s": 0.0150,
                                  "ratio_to_floor": 1.4, "before_seconds": 0.028, "speedup": 1.333}]},
              "commands": {"passes_bf16": "draft-bench --draft D"}}
    report["draft_length"] = _draft_length_entry()
    md = write_report(report, tmp_path)
    text = md.read_text()
    assert "1.17x" in text and "5,760" in text and "3,060" in text and "204,800" in text
    assert "q8_0, flash attn | 1.00e-05" in text and "2.00e-06" in text
    assert "Failed stages" in text and "draft-bench --draft D" in text
    assert "| 1.05x at 19.5 GB/s |" in text and "**700.0 ms** of 3" in text
    assert "best 23.4, median 17.9 GB/s over 90 reads" in text and "**23.4 GB/s**" in text
    assert text.index("BF16 1-row injection") < text.index("BF16 512-row injection")
    assert "| q8_0 | lm_head | 7 | 21.0 ms |" in text and "28.0 ms | 1.33x |" in text and "work/build-base" in text
    assert "## What the draft buys a Kimi-K3 user" in text and "| 8 | 900 | 3.00 |" in text
    assert "| 1.00 | 8.00 |" in text          # T(8)/T(1) under identical and independent routing
    assert "68 KDA layers" in text and "Best length here (vLLM production)" in text
    for png in ("kv_bytes.png", "passes_vs_floor.png", "acceptance.png", "mul_mat_n_sweep.png", "draft_length.png"):
        assert (tmp_path / "plots" / png).stat().st_size > 1000
    assert "![kv_bytes.png](plots/kv_bytes.png)" in render_markdown(report, ["kv_bytes.png"])


def test_bench_stages_are_functions_the_one_runner_drives_saving_after_each(monkeypatch, tmp_path):
    from llamacpp_mla_port.bench import run as br
    from llamacpp_mla_port.errors import PortError

    seen = []

    def failing(run):
        raise PortError("boom", hint="h")

    def later(run):
        # the runner saved the report after the failed stage, before this one started
        seen.append(json.loads((run.out / "report.json").read_text())["stages"]["spec"]["ok"])
        run.report["tool"] = {"patch_cold_s": 1.0}

    monkeypatch.setitem(br.STAGE_FUNCTIONS, "spec", failing)
    monkeypatch.setitem(br.STAGE_FUNCTIONS, "tool", later)
    monkeypatch.setattr(br, "ensure_build", lambda *a, **k: None)
    report = br.run_bench(tmp_path, tmp_path, tmp_path / "out", threads=1, stages=("tool", "spec"))
    assert seen == [False] and report["stages"]["spec"]["ok"] is False and report["stages"]["tool"]["ok"]
    assert list(report["stages"]) == ["spec", "tool"]               # the bench's order, not the caller's
    assert "| patch cold | 1.0 |" in (tmp_path / "out" / "report.md").read_text()
    # what a stage needs runs first
    assert br.with_needs(("torch",)) == ("models", "floors", "kv", "passes", "torch")
    assert br.with_needs(("draft_length", "spec")) == ("models", "spec", "draft_length")


def _oversized(folder, limit: int = 400) -> list[str]:
    return [f"{p.name}: {n}" for p in sorted(folder.glob("*.py"))
            if (n := len(p.read_text().splitlines())) > limit]


def test_no_bench_module_over_400_lines_and_no_stage_class(tmp_path):
    import ast

    from llamacpp_mla_port import bench

    folder = __import__("pathlib").Path(bench.__file__).parent
    assert _oversized(folder) == []
    from llamacpp_mla_port.bench.run import STAGE_FUNCTIONS

    # the stages are module functions of the run, not the methods of a driver class
    stage_methods = [(p.name, c.name, f.name) for p in folder.glob("*.py") for c in ast.walk(ast.parse(p.read_text()))
                     if isinstance(c, ast.ClassDef) for f in c.body
                     if isinstance(f, ast.FunctionDef) and f.name in STAGE_FUNCTIONS]
    assert stage_methods == []
    assert all(callable(fn) and fn.__code__.co_argcount == 1 for fn in STAGE_FUNCTIONS.values())
    # the control: the same check sees a long module
    (tmp_path / "long.py").write_text("x = 1\n" * 401)
    assert _oversized(tmp_path) == ["long.py: 401"]
