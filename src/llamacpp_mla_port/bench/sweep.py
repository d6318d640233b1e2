"""ggml-cpu's MUL_MAT over N activation columns against its own floor, at the draft's largest shapes.

One ggml-floor run (proof/run/cpp) measures the read bandwidth and each (type, shape, N) product,
N = 1..17 around the 7-token block and 32, 64, 512 beyond it. The floor of one product is
max(weight bytes / that bandwidth, FLOPs / the best rate ggml reaches on the same shape at
N >= 32, where the small-N path is not used), the same two terms as bench.floors; the ratio to it
shows where the small-N path leaves time.
Shapes keep the draft's K; the 163840-row lm_head is measured on a 16384-row slice (235 MB in
BF16, far above the caches, like the whole matrix).

    make bench BENCH_ARGS="--stages sweep"      (bench.run's `sweep` stage; report.md, plots/)
"""

from __future__ import annotations

from pathlib import Path

#: name -> (K, M): the draft's largest weight shapes (K kept; M of lm_head cut to 16384)
SHAPES = {"lm_head": (7168, 16384), "ffn_down": (14336, 7168)}
TYPES = ("bf16", "q8_0")
N_VALUES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 17, 32, 64)
#: compute-bound column counts: the best rate among them is the floor's second term
#: (512: bench.floors.GEMM_N)
N_COMPUTE = (32, 64, 512)


def run_sweep(tree: Path, build: Path, out: Path, threads: int, repeats: int = 3, shapes: dict | None = None,
              n_values=N_VALUES, bw_mib: int = 2048) -> dict:
    """Seconds, GB/s, GFLOP/s and the ratio to the floor per (type, shape, N)."""
    from llamacpp_mla_port.bench import floors as fl

    shapes = shapes or SHAPES
    specs = [f"{t}:{k}:{m}:{n}" for t in TYPES for (k, m) in shapes.values() for n in sorted({*n_values, *N_COMPUTE})]
    m = fl.measure(tree, build, out, specs, threads, bw_mib=bw_mib, repeats=repeats)
    rows = []
    for t in TYPES:
        for name, (k, mm) in shapes.items():
            rate = max(m.gemm[(t, k, mm, n)]["gflops"] for n in N_COMPUTE)
            for n in n_values:
                g = m.gemm[(t, k, mm, n)]
                seconds = 2.0 * k * mm * n / (g["gflops"] * 1e9)
                memory_s = g["gbps"] * seconds / m.bandwidth_gbps
                compute_s = 2.0 * k * mm * n / (rate * 1e9)
                rows.append({"type": t, "shape": name, "k": k, "m": mm, "n": n, "seconds": round(seconds, 9),
                             "gbps": round(g["gbps"], 2), "gflops": round(g["gflops"], 1),
                             "memory_s": round(memory_s, 9), "compute_s": round(compute_s, 9),
                             "ratio_to_floor": round(seconds / max(memory_s, compute_s), 3)})
    return {"threads": threads, "repeats": repeats, "bandwidth_gbps": round(m.bandwidth_gbps, 2),
            "n_compute": list(N_COMPUTE), "rows": rows}


def table(sweep: dict) -> list[str]:
    L = ["| type | shape | N | measured (best) | weights GB/s | GFLOP/s | memory floor | compute floor | ratio to floor |",
         "|---|---|---|---|---|---|---|---|---|"]
    for r in sweep["rows"]:
        L.append(f"| {r['type']} | {r['shape']} | {r['n']} | {r['seconds'] * 1000:.1f} ms | {r['gbps']:.1f} | "
                 f"{r['gflops']:.1f} | {r['memory_s'] * 1000:.1f} ms | {r['compute_s'] * 1000:.1f} ms | "
                 f"{r['ratio_to_floor']:.2f}x |")
    return L


def plot(sweep: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TYPES), figsize=(6 * len(TYPES), 4), squeeze=False)
    for ax, t in zip(axes[0], TYPES):
        for shape in dict.fromkeys(r["shape"] for r in sweep["rows"]):
            rows = [r for r in sweep["rows"] if r["type"] == t and r["shape"] == shape]
            ax.plot([r["n"] for r in rows], [r["ratio_to_floor"] for r in rows], marker="o", label=shape)
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
