"""`make bench`'s draft_length stage: what the draft buys a Kimi-K3 user on this machine.

Kimi-K3 (93 layers, 896 experts of 3 x 3072 x 3584 each) does not fit here, so its verify cost
is measured on Kimi-K3-shaped targets (fixtures.k3_shaped: real shapes and types, few layers,
the routed experts' FFN shrunk) and scaled to 93 layers by the measured per-layer costs:

    T(N, file) = F(N) + n_K a_K(N) + n_M a_M(N) + (n_K + n_M) f s(N)

F: what every file has (embedding, lm_head, Kimi-K3's dense layer 0 with KDA attention); a_K /
a_M: a KDA / MLA layer with its LatentMoE at f = 0; s: the routed experts' cost per unit of their
FFN width f. Four files give the four unknowns per N (FILES). Then

    T_93(N) = F + 68 a_K + 24 a_M + 92 x 3072 x s     (69 KDA layers: layer 0 and 68 more; 24 MLA)

verify-bench runs each file (process rounds A B C D D C B A). The draft's cost is the real-size
Q8_0 draft's block of k tokens (draft-bench, paired with the 6-layer file), the acceptance the
published curves; the table is bench.speedup's. Routing is that of random weights: the report
gives the distinct experts per step beside the bounds of identical and independent routing.
"""

from __future__ import annotations

import statistics

import numpy as np

from llamacpp_mla_port.bench import acceptance as acc
from llamacpp_mla_port.bench import speedup
from llamacpp_mla_port.bench.context import BenchRun, log
from llamacpp_mla_port.bench.draft_length import DRAFT_KS, INJECT_ROWS, check_pair
from llamacpp_mla_port.bench.passes import run_draft_bench
from llamacpp_mla_port.bench.verify import VERIFY_N, run_verify_bench, summarize
from llamacpp_mla_port.fixtures.k3_shaped import K3_SHAPE, layer_bytes, routed_expert_bytes, write_k3_shaped_target

#: the files of the fit: name -> (layers, routed experts' FFN width). F2 (6 layers) also pairs with
#: the real-size draft, whose taps are layers 1-5
FILES = {"F1": ("DKM", 32), "F2": ("DKKKKM", 32), "F3": ("DKMMMM", 32), "F4": ("DKM", 96)}
PAIR_FILE = "F2"
DEPTH = 512                 # tokens in the target's cache (its MLA layers attend over them)
FILE_ROUNDS = 2             # process rounds over the files, A B C D then D C B A
VERIFY_ROUNDS = 3
DRAFT_ROUNDS = 2
REAL_KDA_MOE = K3_SHAPE.n_kda - 1       # layer 0 is KDA with the dense FFN: part of F
REAL_MLA = K3_SHAPE.n_mla


def _file_bytes(layers: str, f: int) -> int:
    head = 2 * K3_SHAPE.n_embd * K3_SHAPE.n_vocab * 34 // 32
    return head + sum(layer_bytes(K3_SHAPE, k, f) for k in layers)


#: free disk the stage needs: its four targets
DISK_BYTES = sum(_file_bytes(layers, f) for layers, f in FILES.values())


def fit(per_file: dict[str, dict[int, float]]) -> dict[int, dict]:
    """Per N: the four terms from the four files' medians, and T_93."""
    design = np.array([[1.0, layers.count("K"), layers.count("M"), (layers.count("K") + layers.count("M")) * f]
                       for layers, f in (FILES[n] for n in FILES)])
    real = np.array([1.0, REAL_KDA_MOE, REAL_MLA, (REAL_KDA_MOE + REAL_MLA) * K3_SHAPE.n_ff_exp])
    out = {}
    for n in sorted(next(iter(per_file.values()))):
        y = np.array([per_file[name][n] for name in FILES])
        coef = np.linalg.solve(design, y)
        parts = coef * real
        c, p = [float(x) for x in coef], [float(x) for x in parts]
        out[n] = {"F": c[0], "a_K": c[1], "a_M": c[2], "s_per_ff": c[3], "total": sum(p), "fixed": p[0],
                  "kda_layers": p[1], "mla_layers": p[2], "routed_experts": p[3],
                  "negative_terms": [k for k, v in zip(("F", "a_K", "a_M", "s"), c) if v < 0]}
    return out


def _medians(res: list[dict], key: str) -> dict[int, float]:
    pooled: dict[int, list[float]] = {}
    for r in res:
        for n, v in r[key].items():
            pooled.setdefault(int(n), []).extend(v)
    return {n: statistics.median(v) for n, v in pooled.items()}


def draft_length(run: BenchRun) -> None:
    k3 = run.out / "k3"
    files = {}
    for name, (layers, f) in FILES.items():
        files[name] = write_k3_shaped_target(k3 / f"kimi-k3-shaped-{layers}-ff{f}.gguf", layers, f)
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
    spec_med = {name: _medians(res, "spec_seconds") for name, res in runs.items()}
    alone_med = {name: _medians(res, "alone_seconds") for name, res in runs.items()}
    scaled_spec, scaled_alone = fit(spec_med), fit(alone_med)
    pair = summarize(runs[PAIR_FILE])

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
    block_med = {k: statistics.median(v) for k, v in blocks.items()}
    inject_med = {n: statistics.median(v) for n, v in inject.items() if v}

    costs = speedup.StepCosts(scaled_alone[1]["total"], {n: v["total"] for n, v in scaled_spec.items()},
                              dict(pair.rollback), block_med, inject_med)
    tab = speedup.table(costs, list(acc.PUBLISHED))
    run.report["draft_length"] = {
        "files": {name: {"path": str(p), "layers": FILES[name][0], "n_ff_exp": FILES[name][1],
                         "bytes": p.stat().st_size} for name, p in files.items()},
        "depth": DEPTH, "threads": run.threads,
        "per_file_spec_s": spec_med, "per_file_alone_s": alone_med,
        "scaled_spec": scaled_spec, "scaled_alone": scaled_alone,
        "cpu_share": statistics.median([x for res in runs.values() for r in res for v in r["spec_cpu_share"].values()
                                        for x in v]),
        "pair_file": {"spec_s": pair.spec, "alone_s": pair.alone, "rollback_s": pair.rollback},
        "experts": pair.experts, "expert_bytes_real": routed_expert_bytes(K3_SHAPE),
        "moe_layers_real": REAL_KDA_MOE + REAL_MLA,
        "pair": PAIR_FILE, "draft": str(draft), "draft_block_s": block_med, "draft_inject_s": inject_med,
        "table": tab, "table_md": speedup.render(tab, " (scaled to 93 layers)"),
        "recommended": speedup.recommended(tab),
    }
