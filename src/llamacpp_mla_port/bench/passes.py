"""`make bench`'s timed stages of the real-size draft, each against its floor: passes, sweep
and torch (bench.run says what each measures).

`run_draft_bench` is draft-bench's one driver (the passes here, the draft's cost per block
length in bench.draft_length); `summarize_profile` reads its per-node profile.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import numpy as np

from llamacpp_mla_port.bench import floors as fl
from llamacpp_mla_port.bench import sweep as sw
from llamacpp_mla_port.bench.context import BLOCK, BLOCK_CTX, BenchRun
from llamacpp_mla_port.bench.models import INJECT_SIZES, KV_POS0
from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.proof.reference.model import nmse
from llamacpp_mla_port.proof.run.programs import NO_EXTRA_BUFTS, run_with_default_bufts

PASS_MIN_SECONDS = 5     # each pass repeats until its timed runs add up to this (inject 1: ~200, block: ~6)


def run_draft_bench(exe: Path, draft: Path, target: Path, out: Path, args: list, extra_bufts: bool = True,
                    timeout: float = 1800) -> tuple[dict, list]:
    """draft-bench once: (its JSON plus the peak RSS and `note`, the command line); run again with
    extra buffer types off where it dies of a signal (programs.run_with_default_bufts)."""
    argv = [exe, "--draft", draft, "--target", target, "--out", out, *args]
    if not extra_bufts:
        argv.append(NO_EXTRA_BUFTS)
    proc, argv, note = run_with_default_bufts(argv, timeout)
    if proc.returncode != 0:
        raise ProofError(f"draft-bench failed (exit {proc.returncode}): {proc.stderr[-1500:]}",
                         hint=" ".join(map(str, argv)))
    res = json.loads(Path(out).read_text())
    res["peak_rss_bytes"] = proc.peak_rss_bytes
    res["note"] = note
    return res, argv


def _draft_bench(run: BenchRun, wt: str, tag: str, args: list, extra_bufts: bool) -> dict:
    res, argv = run_draft_bench(run.program("draft-bench"), run.files[f"draft_{wt}"], run.files[f"target_{wt}"],
                                run.out / f"passes-{wt}-{tag}.json",
                                ["--block", BLOCK, "--block-ctx", BLOCK_CTX, *args], extra_bufts)
    run.cmd(f"passes_{wt}_{tag}", argv)
    return res


def passes(run: BenchRun) -> None:
    """Timed passes at the benchmark's threads with flash attention on (llama.cpp's CPU default,
    what llama-server and llama-speculative-simple run) and the BF16 block also with it off;
    then a profile of one block and of a 1-row and a 512-row injection on ONE thread, per node
    in CPU time (the node's own work, however busy the machine is).

    Every timed pass comes with the read bandwidth sampled just before it (draft-bench
    --bw-mib): the floor takes the best bandwidth seen anywhere in the run, and the paired
    ratio sets each pass against the bandwidth of its own moment (this VM's neighbours move
    the bandwidth by +-30 % within minutes)."""
    timed = ["--inject", ",".join(map(str, INJECT_SIZES)), "--repeats", run.repeats, "--threads", run.threads,
             "--flash-attn", "on", "--min-seconds", PASS_MIN_SECONDS, "--bw-mib", fl.BW_MIB]
    runs: dict[str, dict] = {}
    for wt in ("bf16", "q8_0"):
        # an extra buffer type (AMX) whose kernel faults on this machine: the rest of the block
        # runs as the first pass did, extra buffer types off (run_draft_bench)
        res = _draft_bench(run, wt, "timed", timed, True)
        extra, note = res["extra_bufts"], res["note"]
        one: dict = {"extra": extra, "note": note, "timed": res}
        if wt == "bf16":
            one["fa-off"] = _draft_bench(run, wt, "fa-off", ["--inject", "", "--repeats", run.repeats,
                                                             "--threads", run.threads, "--flash-attn", "off",
                                                             "--min-seconds", PASS_MIN_SECONDS,
                                                             "--bw-mib", fl.BW_MIB], extra)
        one["profile"] = _draft_bench(run, wt, "profile", ["--profile-only", "--profile-inject",
                                                           f"{INJECT_SIZES[0]},{INJECT_SIZES[-1]}",
                                                           "--threads", 1, "--flash-attn", "on"], extra)
        runs[wt] = one

    m = run.measured
    probes = [g for one in runs.values() for res in (one["timed"], one.get("fa-off")) if res
              for g in res["block_bw_gbps"] + [x for v in res["inject_bw_gbps"].values() for x in v]]
    if probes and max(probes) > m.bandwidth_gbps:
        m.bandwidth_gbps = max(probes)      # the best read this run saw is the floor's bandwidth
    run.report.setdefault("floors", {})["bandwidth_floor_gbps"] = round(m.bandwidth_gbps, 2)
    run.report["floors"]["bandwidth_passes_gbps"] = {
        "best": round(max(probes), 2), "median": round(statistics.median(probes), 2), "samples": len(probes),
    } if probes else {}

    run.report["passes"] = {}
    for wt, one in runs.items():
        res = one["timed"]
        d, t = run.files[f"draft_{wt}"], run.files[f"target_{wt}"]
        tables = (fl.tensor_table(d), fl.tensor_table(t))
        entry: dict = {"extra_bufts": one["extra"], "note": one["note"], "flash_attn": "on",
                       "load_seconds": res["load_seconds"], "peak_rss_bytes": res["peak_rss_bytes"],
                       "file_bytes": d.stat().st_size + t.stat().st_size}
        bw = fl.block_work(d, t, BLOCK, BLOCK_CTX, tables=tables)
        rows = [("block", bw, res["block_seconds"], res["block_cpu"], res["block_bw_gbps"])]
        for n in INJECT_SIZES:
            rows.append((f"inject {n}", fl.inject_work(d, n, table=tables[0]), res["inject"][str(n)],
                         res["inject_cpu"][str(n)], res["inject_bw_gbps"][str(n)]))
        if "fa-off" in one:
            off = one["fa-off"]
            rows.append(("block, flash attn off", bw, off["block_seconds"], off["block_cpu"], off["block_bw_gbps"]))
        for name, work, secs, cpu, bws in rows:
            entry[name] = fl.pass_entry(work, fl.floor_seconds(work, m), secs, cpu, bws, run.threads)
        prof = one["profile"]
        entry["profile"] = summarize_profile(prof["profile"], prof["profiled_block_seconds"])
        entry["profile_inject"] = {n: summarize_profile(p["nodes"], p["seconds"])
                                   for n, p in prof["profile_inject"].items()}
        run.report["passes"][wt] = entry


def sweep(run: BenchRun) -> None:
    """ggml-cpu's MUL_MAT over N at the draft's largest shapes against its floor (bench.sweep)."""
    out = run.out / "sweep.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    # small products: more repeats than the passes, for the same noise
    run.report["sweep"] = sw.run_sweep(run.tree, run.build, out, run.threads, repeats=max(5, run.repeats),
                                       baseline=run.baseline)
    run.cmd("sweep", [run.program("ggml-floor"), "--threads", run.threads, "--out", out,
                      "--repeats", max(5, run.repeats), "--gemm", "(bench.sweep: TYPES x SHAPES x N_VALUES, 512)"]
            + (["(and against --baseline-build", run.baseline, ", interleaved)"] if run.baseline else []))


def torch(run: BenchRun) -> None:
    """The kv stage's block through PyTorch (bench.torch_draft), BF16, same threads and inputs."""
    import torch as th      # heavy: only this stage needs it

    from llamacpp_mla_port.bench.torch_draft import TorchDraft

    th.set_num_threads(run.threads)
    feats, ids = run.kv_inputs
    t0 = time.monotonic()
    draft = TorchDraft.load(run.files["checkpoint"], run.files["target_bf16"])
    load_s = time.monotonic() - t0
    positions = KV_POS0 + np.arange(feats.shape[0])
    t1 = time.monotonic()
    draft.inject(feats, positions)
    inject_s = time.monotonic() - t1
    times, logits = [], None
    for r in range(run.repeats + 1):
        draft.truncate(feats.shape[0])
        t1 = time.monotonic()
        logits, hidden, chain = draft.block(ids, KV_POS0 + feats.shape[0])
        if r:
            times.append(time.monotonic() - t1)
    ref = run.kv_reference
    llama_block = run.report.get("passes", {}).get("bf16", {}).get("block", {}).get("seconds")
    run.report["torch"] = {
        "torch_version": th.__version__, "threads": th.get_num_threads(), "load_seconds": round(load_s, 1),
        "inject_512_seconds": round(inject_s, 3),
        "block_seconds": round(min(times), 4), "block_seconds_median": round(statistics.median(times), 4),
        "ratio_torch_over_llama": round(min(times) / llama_block, 3) if llama_block else None,
        "nmse_vs_llama_f32_cache": {"biased_logits": nmse(logits, ref.biased_logits),
                                    "hidden": nmse(hidden, ref.hidden),
                                    "chain_equal": list(chain) == [int(c) for c in ref.chain]},
    }
    run.cmd("torch", ["llamacpp-mla-port bench --stages models,kv,torch  (bench.torch_draft.TorchDraft on",
                      run.files["checkpoint"], "+", run.files["target_bf16"], f"torch threads {run.threads})"])
    del draft


# ---------------------------------------------------------------------------------------
# per-op profile

def _op_class(node: dict) -> str:
    op = node["op"]
    if op == "MUL_MAT":
        return f"MUL_MAT {node['type0']}"
    return op


def summarize_profile(nodes: list[dict], total: float) -> dict:
    """Per op kind and per node name (all layers together), from draft-bench's per-node timings of
    one pass: process CPU time per node (on one thread: the node's own work), wall time beside it."""
    if not nodes:
        return {}
    by_op: dict[str, float] = {}
    by_name: dict[str, list] = {}
    for n in nodes:
        cpu = n.get("cpu_seconds", n["seconds"])
        by_op[_op_class(n)] = by_op.get(_op_class(n), 0.0) + cpu
        base = re.sub(r"-\d+$", "", n["name"])      # per-layer names end in -il
        if re.fullmatch(r"node_\d+", base):         # unnamed: by shape
            base = f"{n['ne0'][:3]} x {n['ne1'][:3]}"
        key = f"{n['op']} {base}"
        e = by_name.setdefault(key, [0.0, 0, n["ne0"], n["ne1"], n["type0"]])
        e[0] += cpu
        e[1] += 1
    s = sum(by_op.values())
    return {
        "profiled_seconds": round(total, 4), "sum_of_nodes_cpu_seconds": round(s, 4), "n_nodes": len(nodes),
        "by_op": [{"op": k, "seconds": round(v, 5), "share": round(v / s, 4)}
                  for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])],
        "top_nodes": [{"node": k, "seconds": round(v[0], 5), "share": round(v[0] / s, 4), "count": v[1],
                       "src0": v[2], "src1": v[3], "type0": v[4]}
                      for k, v in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]],
    }
