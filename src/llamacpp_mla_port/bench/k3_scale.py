"""`make bench`'s draft_length stage: what the draft buys a Kimi-K3 user on this machine.

Kimi-K3 (93 layers, 896 experts of 3 x 3072 x 3584 each) does not fit here, so its verify cost
is measured on Kimi-K3-shaped targets (fixtures.k3_shaped: real shapes and types, few layers,
the routed experts' FFN 32 wide instead of 3072) and scaled to 93 layers:

    T(N, file) = F(N) + n_K a_K(N) + n_M a_M(N)          three files (FILES) give the three terms
    T_93(N)    = F + 68 a_K + 24 a_M + 92 D(N) (B_real - B_file) / R

F: what every file has (embedding, lm_head, Kimi-K3's dense layer 0 with KDA attention); a_K /
a_M: one KDA / MLA layer with its LatentMoE, as measured (experts 32 wide). The routed experts'
missing width is scaled by its bytes: D(N) distinct experts per MoE layer and step (measured,
random routing), B the bytes of one expert, R the bytes the pair file reads at one token over its
measured T(1) (the rate this machine streamed this file's weights). A time slope over the
experts' width was not used: its extrapolation to 3072 multiplies a difference of a few ms by
about 2000.

verify-bench runs each file (process rounds A B C C B A). The draft's cost is the real-size Q8_0
draft's block of k tokens (draft-bench, paired with the 6-layer file), the acceptance the
published curves; the table is bench.speedup's.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from llamacpp_mla_port.bench import acceptance as acc
from llamacpp_mla_port.bench import speedup
from llamacpp_mla_port.bench.context import BenchRun, log
from llamacpp_mla_port.bench.draft_length import DRAFT_KS, INJECT_ROWS, check_pair
from llamacpp_mla_port.bench.passes import run_draft_bench
from llamacpp_mla_port.bench.verify import VERIFY_N, expert_bounds, run_verify_bench, summarize
from llamacpp_mla_port.fixtures.k3_shaped import K3_SHAPE, layer_bytes, routed_expert_bytes, write_k3_shaped_target

#: the files of the fit: name -> layers (D: layer 0, K: KDA + LatentMoE, M: MLA + LatentMoE). F2 has
#: six layers: it also pairs with the real-size draft, whose taps are layers 1-5
FILES = {"F1": "DKM", "F2": "DKKKKM", "F3": "DKMMMM"}
N_FF_EXP = 32
PAIR_FILE = "F2"
DEPTH = 512                 # tokens in the target's cache (its MLA layers attend over them)
FILE_ROUNDS = 2             # process rounds over the files, A B C then C B A
VERIFY_ROUNDS = 3
DRAFT_ROUNDS = 2
REAL_KDA_MOE = K3_SHAPE.n_kda - 1       # layer 0 is KDA with the dense FFN: part of F
REAL_MLA = K3_SHAPE.n_mla
REAL_MOE = REAL_KDA_MOE + REAL_MLA


def file_bytes(layers: str, f: int = N_FF_EXP) -> int:
    head = 2 * K3_SHAPE.n_embd * K3_SHAPE.n_vocab * 34 // 32
    return head + sum(layer_bytes(K3_SHAPE, k, f) for k in layers)


def step_bytes(layers: str, distinct: float, f: int = N_FF_EXP) -> float:
    """Weight bytes one step reads: every layer but its unrouted experts, and the lm_head (Q8_0)."""
    moe = sum(1 for k in layers if k != "D")
    unrouted = moe * (K3_SHAPE.n_expert - distinct) * routed_expert_bytes(K3_SHAPE, f)
    lm_head = K3_SHAPE.n_embd * K3_SHAPE.n_vocab * 34 // 32
    return lm_head + sum(layer_bytes(K3_SHAPE, k, f) for k in layers) - unrouted


#: free disk the stage needs: its targets
DISK_BYTES = sum(file_bytes(layers) for layers in FILES.values())


def fit(per_file: dict[str, dict[int, float]]) -> dict[int, dict]:
    """Per N: F, a_K and a_M from the three files' medians (exact: three files, three unknowns)."""
    design = np.array([[1.0, FILES[n].count("K"), FILES[n].count("M")] for n in FILES])
    out = {}
    for n in sorted(next(iter(per_file.values()))):
        c = [float(x) for x in np.linalg.solve(design, np.array([per_file[name][n] for name in FILES]))]
        out[n] = {"F": c[0], "a_K": c[1], "a_M": c[2],
                  "negative_terms": [k for k, v in zip(("F", "a_K", "a_M"), c) if v < 0]}
    return out


def scale(terms: dict[int, dict], distinct: dict[int, float], rate: float) -> dict[int, dict]:
    """T_93(N) from the fit, the distinct experts per step and the read rate (bytes per second)."""
    extra = routed_expert_bytes(K3_SHAPE) - routed_expert_bytes(K3_SHAPE, N_FF_EXP)
    out = {}
    for n, t in terms.items():
        parts = {"fixed": t["F"], "kda_layers": REAL_KDA_MOE * t["a_K"], "mla_layers": REAL_MLA * t["a_M"],
                 "routed_experts": REAL_MOE * distinct[n] * extra / rate}
        out[n] = {**parts, "total": sum(parts.values()), "negative_terms": t["negative_terms"]}
    return out


def _medians(res: list[dict], key: str) -> dict[int, float]:
    pooled: dict[int, list[float]] = {}
    for r in res:
        for n, v in r[key].items():
            pooled.setdefault(int(n), []).extend(v)
    return {n: statistics.median(v) for n, v in pooled.items()}


def analyse(runs: dict[str, list[dict]], blocks: dict[int, list[float]], inject: dict[int, list[float]],
            threads: int) -> dict:
    """The stage's report entry from its raw runs (verify-bench per file, draft-bench per k)."""
    spec_med = {name: _medians(res, "spec_seconds") for name, res in runs.items()}
    alone_med = {name: _medians(res, "alone_seconds") for name, res in runs.items()}
    pair = summarize(runs[PAIR_FILE])
    ex = pair.experts
    measured = {n: row["distinct_mean"] for n, row in ex["per_n"].items()}
    rate = step_bytes(FILES[PAIR_FILE], 16) / alone_med[PAIR_FILE][1]
    spec_terms, alone_terms = fit(spec_med), fit(alone_med)
    scaled = scale(spec_terms, measured, rate)

    def bound(i: int) -> dict[int, float]:       # 0: identical routing, 1: independent
        return {n: expert_bounds(K3_SHAPE.n_expert, K3_SHAPE.n_expert_used, n)[i] for n in spec_terms}

    bounds = {side: scale(spec_terms, bound(i), rate) for i, side in enumerate(("identical", "independent"))}
    alone1 = scale({1: alone_terms[1]}, {1: 16.0}, rate)[1]
    block_med = {k: statistics.median(v) for k, v in blocks.items() if v}
    inject_med = {n: statistics.median(v) for n, v in inject.items() if v}
    costs = speedup.StepCosts(alone1["total"], {n: v["total"] for n, v in scaled.items()}, dict(pair.rollback),
                              block_med, inject_med)
    tab = speedup.table(costs, list(acc.PUBLISHED))
    shares = [x for res in runs.values() for r in res for v in r["spec_cpu_share"].values() for x in v]
    return {
        "files": {name: {"layers": layers, "n_ff_exp": N_FF_EXP, "bytes": file_bytes(layers)}
                  for name, layers in FILES.items()},
        "depth": DEPTH, "threads": threads, "cpu_share": statistics.median(shares),
        "per_file_spec_s": spec_med, "per_file_alone_s": alone_med, "fit_spec": spec_terms,
        "read_rate_gbps": rate / 1e9, "scaled_spec": scaled, "scaled_alone_1": alone1,
        "scaled_spec_identical": {n: v["total"] for n, v in bounds["identical"].items()},
        "scaled_spec_independent": {n: v["total"] for n, v in bounds["independent"].items()},
        "pair": PAIR_FILE, "pair_file": {"spec_s": pair.spec, "alone_s": pair.alone, "rollback_s": pair.rollback},
        "experts": ex, "expert_bytes_real": routed_expert_bytes(K3_SHAPE), "moe_layers_real": REAL_MOE,
        "draft_block_s": block_med, "draft_inject_s": inject_med,
        "table": tab, "table_md": speedup.render(tab, " (scaled to 93 layers)"),
        "recommended": speedup.recommended(tab),
    }


def draft_length(run: BenchRun) -> None:
    k3 = run.out / "k3"
    files = {name: write_k3_shaped_target(k3 / f"kimi-k3-shaped-{layers}-ff{N_FF_EXP}.gguf", layers, N_FF_EXP)
             for name, layers in FILES.items()}
    draft = run.files["draft_q8_0"]
    check_pair(files[PAIR_FILE], draft)
    vb, db = run.program("verify-bench"), run.program("draft-bench")

    runs: dict[str, list[dict]] = {name: [] for name in FILES}
    order = list(FILES)
    for r in range(FILE_ROUNDS):
        for name in (order if r % 2 == 0 else order[::-1]):
            log(f"draft_length: round {r + 1}: verify-bench on {files[name].name}")
            res, argv = run_verify_bench(vb, files[name], k3 / f"verify-{name}-{r}.json", run.threads, DEPTH,
                                         VERIFY_ROUNDS, VERIFY_N, draft=draft if name == PAIR_FILE else None,
                                         expert_blocks=8 if (r == 0 and name == PAIR_FILE) else 0,
                                         state_dir=k3 / "states" / name)
            runs[name].append(res)
            run.cmd(f"draft_length_verify_{name}", argv)

    blocks: dict[int, list[float]] = {k: [] for k in DRAFT_KS}
    inject: dict[int, list[float]] = {n: [] for n in INJECT_ROWS}
    for r in range(DRAFT_ROUNDS):
        for k in (DRAFT_KS if r % 2 == 0 else DRAFT_KS[::-1]):
            args = ["--block", k, "--block-ctx", 512, "--repeats", run.repeats, "--threads", run.threads,
                    "--flash-attn", "on", "--min-seconds", 2, "--inject",
                    ",".join(map(str, INJECT_ROWS)) if k == DRAFT_KS[-1] else ""]
            res, argv = run_draft_bench(db, draft, files[PAIR_FILE], k3 / f"draft-k{k}-{r}.json", args)
            blocks[k] += res["block_seconds"]
            for n in INJECT_ROWS:
                inject[n] += res["inject"].get(str(n), [])
            run.cmd(f"draft_length_draft_k{k}", argv)
    entry = analyse(runs, blocks, inject, run.threads)
    entry["draft"] = str(draft)
    entry["files"] = {name: {**entry["files"][name], "path": str(p)} for name, p in files.items()}
    run.report["draft_length"] = entry


def analyse_folder(k3: Path, threads: int) -> dict:
    """analyse() again from the JSON files a run left in `k3` (a changed analysis, no new measurement)."""
    runs = {name: [json.loads(p.read_text()) for p in sorted(k3.glob(f"verify-{name}-*.json"))] for name in FILES}
    blocks: dict[int, list[float]] = {k: [] for k in DRAFT_KS}
    inject: dict[int, list[float]] = {n: [] for n in INJECT_ROWS}
    for k in DRAFT_KS:
        for p in sorted(k3.glob(f"draft-k{k}-*.json")):
            res = json.loads(p.read_text())
            blocks[k] += res["block_seconds"]
            for n in INJECT_ROWS:
                inject[n] += res["inject"].get(str(n), [])
    return analyse(runs, blocks, inject, threads)
