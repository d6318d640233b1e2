"""ggml-cpu's MUL_MAT over N activation columns against its own floor, at the draft's largest shapes.

ggml-floor (proof/run/cpp) measures the read bandwidth and each (type, shape, N) product, N = 1-8,
12, 16, 17 around the 7-token block and 32, 64, 512 beyond it (once, or per round and build
with a baseline). The floor of one product is
max(weight bytes / that bandwidth, FLOPs / the best rate ggml reaches on the same shape at
N >= 32, where the small-N path is not used), the same two terms as bench.floors; the ratio to it
shows where the small-N path leaves time.
Shapes keep the draft's K; the 163840-row lm_head is measured on a 16384-row slice (235 MB in
BF16, far above the caches, like the whole matrix).

    make bench BENCH_ARGS="--stages sweep"      (bench.run's `sweep` stage; report.md, plots/)
"""

from __future__ import annotations

from pathlib import Path

from llamacpp_mla_port.bench import floors as fl
from llamacpp_mla_port.gguf.contract import K3_DSPARK_REAL_CONFIG as _CFG

#: name -> (K, M): the draft's largest weight shapes (K kept; M of lm_head cut to 16384)
SHAPES = {"lm_head": (_CFG["hidden_size"], 16384), "ffn_down": (_CFG["intermediate_size"], _CFG["hidden_size"])}
TYPES = ("bf16", "q8_0")
N_VALUES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 17, 32, 64)
#: compute-bound column counts: the best rate among them is the floor's second term
#: (512: bench.floors.GEMM_N)
N_COMPUTE = (32, 64, 512)


def run_sweep(tree: Path, build: Path, out: Path, threads: int, repeats: int = 3, shapes: dict | None = None,
              n_values=N_VALUES, bw_mib: int = fl.BW_MIB, baseline: Path | None = None, rounds: int = 3) -> dict:
    """Seconds, GB/s, GFLOP/s and the ratio to the floor per (type, shape, N). With `baseline`
    (a build of the same tree without the commit under test), before and after alternate over
    `rounds` rounds and each figure is the best over them: a busy machine slows both alike."""
    shapes = shapes or SHAPES
    specs = [f"{t}:{k}:{m}:{n}" for t in TYPES for (k, m) in shapes.values() for n in sorted({*n_values, *N_COMPUTE})]
    sides = {"after": Path(build)} | ({"before": Path(baseline)} if baseline else {})
    runs: dict[str, list] = {side: [] for side in sides}
    notes: list[str] = []
    for r in range(rounds if baseline else 1):
        for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            m, _, note = fl.measure_default_bufts(tree, sides[side], out, specs, threads, bw_mib=bw_mib,
                                                  repeats=repeats)
            runs[side].append(m)
            if note and note not in notes:
                notes.append(note)

    def best_seconds(side: str, key: tuple) -> float:
        return min(2.0 * key[1] * key[2] * key[3] / (m.gemm[key]["gflops"] * 1e9) for m in runs[side])

    bandwidth = max(m.bandwidth_gbps for ms in runs.values() for m in ms)
    rows = []
    for t in TYPES:
        for name, (k, mm) in shapes.items():
            flops = {n: 2.0 * k * mm * n for n in (*n_values, *N_COMPUTE)}
            rate = max(flops[n] / best_seconds("after", (t, k, mm, n)) for n in N_COMPUTE)
            for n in n_values:
                seconds = best_seconds("after", (t, k, mm, n))
                weight_bytes = k * mm * fl.WEIGHT_BYTES[t]
                memory_s = weight_bytes / (bandwidth * 1e9)
                compute_s = flops[n] / rate
                row = {"type": t, "shape": name, "k": k, "m": mm, "n": n, "seconds": round(seconds, 9),
                       "gbps": round(weight_bytes / seconds / 1e9, 2), "gflops": round(flops[n] / seconds / 1e9, 1),
                       "memory_s": round(memory_s, 9), "compute_s": round(compute_s, 9),
                       "ratio_to_floor": round(seconds / max(memory_s, compute_s), 3)}
                if baseline:
                    before = best_seconds("before", (t, k, mm, n))
                    row |= {"before_seconds": round(before, 9), "speedup": round(before / seconds, 3)}
                rows.append(row)
    return {"threads": threads, "repeats": repeats, "rounds": rounds if baseline else 1,
            "baseline": str(baseline) if baseline else None, "bandwidth_gbps": round(bandwidth, 2),
            "n_compute": list(N_COMPUTE), "rows": rows, "notes": notes}


def table(sweep: dict) -> list[str]:
    before = bool(sweep.get("baseline"))
    L = ["| type | shape | N | measured (best) | weights GB/s | GFLOP/s | memory floor | compute floor | "
         "ratio to floor |"
         + (" before | before / after |" if before else ""),
         "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if before else "")]
    for r in sweep["rows"]:
        L.append(f"| {r['type']} | {r['shape']} | {r['n']} | {r['seconds'] * 1000:.1f} ms | {r['gbps']:.1f} | "
                 f"{r['gflops']:.1f} | {r['memory_s'] * 1000:.1f} ms | {r['compute_s'] * 1000:.1f} ms | "
                 f"{r['ratio_to_floor']:.2f}x |"
                 + (f" {r['before_seconds'] * 1000:.1f} ms | {r['speedup']:.2f}x |" if before else ""))
    return L


def plot(sweep: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    types = [t for t in TYPES if any(r["type"] == t for r in sweep["rows"])]
    fig, axes = plt.subplots(1, len(types), figsize=(6 * len(types), 4), squeeze=False)
    for ax, t in zip(axes[0], types):
        for shape in dict.fromkeys(r["shape"] for r in sweep["rows"]):
            rows = [r for r in sweep["rows"] if r["type"] == t and r["shape"] == shape]
            line, = ax.plot([r["n"] for r in rows], [r["ratio_to_floor"] for r in rows], marker="o", label=shape)
            if sweep.get("baseline"):
                ax.plot([r["n"] for r in rows], [r["ratio_to_floor"] * r["speedup"] for r in rows], marker="x",
                        linestyle="--", color=line.get_color(), label=f"{shape}, before")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("activation columns N")
        ax.set_ylabel("time / floor")
        ax.set_title(f"{t} MUL_MAT vs its floor, {sweep['threads']} threads")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
