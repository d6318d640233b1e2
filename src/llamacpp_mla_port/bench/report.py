"""The bench report: report.md (tables, the command behind every figure) and plots/*.png.

`write_report(report, out_dir)` renders what bench.run measured; it computes nothing new
except the plotted KV lines (bytes per token x context length, from the measured bytes).
"""

from __future__ import annotations

import datetime
import platform
from pathlib import Path

KV_CONTEXTS = (1024, 4096, 16384, 65536, 131072, 262144, 1048576)
PASS_ROWS = ("block", "block, flash attn off", "inject 1", "inject 64", "inject 512")


def machine() -> dict:
    import os
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model or platform.processor(), "cores": os.cpu_count(), "system": platform.platform()}


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f} GB"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.1f} ms"


def _plots(report: dict, plots: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    plots.mkdir(parents=True, exist_ok=True)
    kv = report.get("kv")
    if kv:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        ctx = list(KV_CONTEXTS)
        lines = [("MLA latent, F16 cache (llama.cpp)", kv["bytes_per_token"].get("f16")),
                 ("MLA latent, q8_0 cache (llama.cpp)", kv["bytes_per_token"].get("q8_0")),
                 ("decompressed K/V, F16 (no absorption)", kv["bytes_per_token_decompressed_f16"])]
        for label, per_tok in lines:
            if per_tok:
                ax.plot(ctx, [per_tok * c / 2**30 for c in ctx], marker="o", label=f"{label}: {per_tok:,.0f} B/token")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("draft KV cache (GiB)")
        ax.set_title("Kimi-K3-DSpark draft KV cache, 5 layers")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(plots / "kv_bytes.png", dpi=110)
        plt.close(fig)
        made.append("kv_bytes.png")
    passes = report.get("passes")
    if passes:
        names = ["block", "inject 1", "inject 64", "inject 512"]
        fig, axes = plt.subplots(1, len(names), figsize=(11, 3.8))
        for ax, name in zip(axes, names):
            wts = [wt for wt in ("bf16", "q8_0") if name in passes.get(wt, {})]
            x = range(len(wts))
            meas = [passes[wt][name]["seconds"] * 1000 for wt in wts]
            mem = [passes[wt][name]["memory_s"] * 1000 for wt in wts]
            comp = [passes[wt][name]["compute_s"] * 1000 for wt in wts]
            ax.bar([i - 0.27 for i in x], meas, 0.27, label="measured", color="tab:blue")
            ax.bar(list(x), mem, 0.27, label="bytes / bandwidth", color="tab:gray")
            ax.bar([i + 0.27 for i in x], comp, 0.27, label="FLOPs / GEMM rate", color="tab:orange")
            for i, wt in enumerate(wts):
                ax.text(i - 0.27, meas[i], f"{passes[wt][name]['ratio_to_floor']:.2f}x", ha="center", va="bottom",
                        fontsize=8)
            ax.set_xticks(list(x))
            ax.set_xticklabels([w.upper() for w in wts])
            ax.set_title(name if name != "block" else f"block of {report.get('block', 7)}")
            ax.set_ylabel("ms")
        axes[0].legend(fontsize=7)
        fig.suptitle("draft passes at real size vs the floor measured in the same run (ratio = measured / floor)")
        fig.tight_layout()
        fig.savefig(plots / "passes_vs_floor.png", dpi=110)
        plt.close(fig)
        made.append("passes_vs_floor.png")
    if report.get("sweep"):
        from llamacpp_mla_port.bench.sweep import plot as sweep_plot
        sweep_plot(report["sweep"], plots / "mul_mat_n_sweep.png")
        made.append("mul_mat_n_sweep.png")
    dl = report.get("draft_length")
    if dl and dl.get("table"):
        from llamacpp_mla_port.bench.speedup import plot as speedup_plot
        speedup_plot(dl["table"], plots / "draft_length.png",
                     f"Kimi-K3 (scaled to 93 layers) + the real-size Q8_0 draft, {dl['threads']} threads")
        made.append("draft_length.png")
    spec = report.get("spec")
    if spec and spec.get("acceptance_per_position"):
        acc = spec["acceptance_per_position"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(range(1, len(acc) + 1), acc, color="tab:green")
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted fraction of steps")
        ax.set_ylim(0, 1)
        ax.set_title(f"acceptance per position (tiny pair, mean accept length {spec['mean_accept_len']})")
        fig.tight_layout()
        fig.savefig(plots / "acceptance.png", dpi=110)
        plt.close(fig)
        made.append("acceptance.png")
    return made


def _passes_bandwidth(fl: dict) -> str:
    bp = fl.get("bandwidth_passes_gbps")
    if not bp:
        return ""
    return (f" Sampled before each timed pass: best {bp['best']:.1f}, median {bp['median']:.1f} GB/s over "
            f"{bp['samples']} reads. The passes' memory floors use the best of all: "
            f"**{fl['bandwidth_floor_gbps']:.1f} GB/s**.")


def _paired(e: dict) -> str:
    if "ratio_paired_median" not in e:
        return "-"
    return f"{e['ratio_paired_median']:.2f}x at {e['bandwidth_paired_gbps_median']:.1f} GB/s"


def _passes_table(report: dict) -> list[str]:
    passes = report.get("passes", {})
    out = ["| weights | pass | bytes read | GFLOP | memory floor | compute floor | measured (best of runs) | median | "
           "ratio to floor | paired ratio (median) | CPU share |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for wt, entry in passes.items():
        for name in PASS_ROWS:
            e = entry.get(name)
            if not e:
                continue
            out.append(f"| {wt.upper()} | {name} | {_gb(e['bytes_weights'] + e['bytes_cache'])} | "
                       f"{e['flops'] / 1e9:.1f} | {_ms(e['memory_s'])} | {_ms(e['compute_s'])} | "
                       f"**{_ms(e['seconds'])}** of {e.get('runs', '?')} | {_ms(e['seconds_median'])} | "
                       f"**{e['ratio_to_floor']:.2f}x** ({e['bound']}) | {_paired(e)} | {e['cpu_share']:.2f} |")
    return out


def _by_n(d: dict) -> dict[int, object]:
    return {int(k): v for k, v in d.items()}


def _draft_length_section(dl: dict) -> list[str]:
    """The Kimi-K3-shaped verify rows (N = 1..8, distinct experts per step) and the table."""
    files = dl["files"]
    L = ["## What the draft buys a Kimi-K3 user (draft_length)", "",
         f"Target cache {dl['depth']} tokens, {dl['threads']} threads, median CPU share of the timed verify passes "
         f"{dl['cpu_share']:.2f}. Verify cost per file (median ms, the target as a speculative run sets it up):", "",
         "| file | layers | expert FFN | " + " | ".join(f"T({n})" for n in range(1, 9)) + " |",
         "|---|---|---|" + "---|" * 8]
    for name, f in files.items():
        med = _by_n(dl["per_file_spec_s"][name])
        L.append(f"| {name} | {f['layers']} | {f['n_ff_exp']} | " +
                 " | ".join(f"{med[n] * 1000:.0f}" for n in range(1, 9) if n in med) + " |")
    sc, alone1 = _by_n(dl["scaled_spec"]), dl["scaled_alone_1"]["total"]
    ident, indep = _by_n(dl["scaled_spec_identical"]), _by_n(dl["scaled_spec_independent"])
    ex = _by_n(dl.get("experts", {}).get("per_n", {}))
    gb = dl["expert_bytes_real"] * dl["moe_layers_real"] / 1e9
    L += ["", f"Scaled to Kimi-K3's 93 layers (69 KDA, 24 MLA; the routed experts 3072 wide, their bytes read at "
          f"the {dl['read_rate_gbps']:.1f} GB/s the pair file streamed at one token). T(1) of the target alone: "
          f"{alone1 * 1000:.0f} ms.", "",
          "| N | T(N) (ms) | T(N)/T(1) | fixed | 68 KDA layers | 24 MLA layers | routed experts | distinct experts "
          "/ layer (random routing) | same token N times | bound: identical | bound: independent | experts read "
          "(GB) | T(N)/T(1) if identical | if independent |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, v in sorted(sc.items()):
        e = ex.get(n, {})
        neg = f" (negative: {', '.join(v['negative_terms'])})" if v["negative_terms"] else ""
        read = f"{e['distinct_mean'] * gb:.0f}" if e else "-"
        L.append(f"| {n} | {v['total'] * 1000:.0f}{neg} | {v['total'] / alone1:.2f} | {v['fixed'] * 1000:.0f} | "
                 f"{v['kda_layers'] * 1000:.0f} | {v['mla_layers'] * 1000:.0f} | {v['routed_experts'] * 1000:.0f} | "
                 f"{e.get('distinct_mean', '-')} | {e.get('same_token_mean', '-')} | {e.get('bound_identical', '-')} | "
                 f"{e.get('bound_independent', '-')} | {read} | {ident[n] / alone1:.2f} | {indep[n] / alone1:.2f} |")
    name, k = dl["recommended"]
    pair = files.get(dl.get("pair", ""), {}).get("layers", "?")
    L += ["", f"Draft: {Path(dl.get('draft', '?')).name}, its block of k tokens over 512 cached rows (draft-bench, "
          f"paired with the {pair} file); acceptance: the published curves.", ""]
    L += dl["table_md"]
    verdict = f"**--spec-draft-n-max {k}**." if k else "**the draft does not pay here**: run the target alone."
    L += [f"Best length here ({name}): {verdict}", ""]
    return L


def render_markdown(report: dict, plots: list[str]) -> str:
    m = report.get("machine", {})
    L = ["# Kimi-K3-DSpark draft at real size: `make bench`",
         "",
         f"{report.get('date', '')} · {m.get('cpu', '')}, {m.get('cores', '?')} cores · "
         f"{report.get('threads')} threads for every pass · total {report.get('total_seconds', '?')} s",
         "",
         "Reproduce everything: `make bench` (= `llamacpp-mla-port bench`); the command behind each figure is "
         "listed at the end. Floors are measured in the same run on the same machine with the same threads. "
         "CPU share = process CPU time / (wall x threads) over the timed pass: well below 1 means other "
         "processes held the cores and the time is not the machine's.",
         ""]
    failed = {k: v for k, v in report.get("stages", {}).items() if not v.get("ok")}
    if failed:
        L += ["**Failed stages:** " + "; ".join(f"{k}: {v.get('error', '')}" for k, v in failed.items()), ""]
    mod = report.get("models")
    if mod:
        L += ["## The pair", "",
              "| file | size |", "|---|---|"]
        L += [f"| {k} | {_gb(v['bytes'])} |" for k, v in mod["files"].items() if k != "checkpoint"]
        L += ["", "Draft: the real config (2,387,907,841 parameters), random weights, converted by the patched "
              "converter; target: synthetic Kimi-K3 at n_embd 7168 with a 163840-token vocabulary (token_embd and "
              "untied lm_head real-size). Q8_0 files by `llama-quantize`.", ""]
    fl = report.get("floors")
    if fl:
        L += ["## Floors", "",
              f"Read bandwidth, {report['threads']} threads: **{fl['bandwidth_gbps']:.1f} GB/s** "
              f"(CPU share {fl['bandwidth_cpu_share']:.2f}; 1 thread {fl['bandwidth_1_thread_gbps']:.1f} GB/s)."
              + _passes_bandwidth(fl), "",
              "MUL_MAT at each weight shape of the passes ([K, M], rows capped at 16384), N = 64 and 512 "
              "activation columns (compute bound: the faster of the two is the compute floor's rate); at N = 7 "
              "(a block) the weight bytes streamed per second, against the read bandwidth above.", "",
              "| weight type | K | M | N | buffer | GFLOP/s | weights GB/s | CPU share |",
              "|---|---|---|---|---|---|---|---|"]
        L += [f"| {g['type']} | {g['k']} | {g['m']} | {g['n']} | {g['buft']} | {g['gflops']:.1f} | "
              f"{g['gbps']:.2f} | {g['cpu_share']:.2f} |" for g in fl["gemm"]]
        L += [""]
    if report.get("sweep"):
        from llamacpp_mla_port.bench.sweep import table as sweep_table
        sw = report["sweep"]
        n_compute = ", ".join(map(str, sw["n_compute"]))
        before = (f"; before = `{sw['baseline']}` (the build without the commit), best of {sw['rounds']} "
                  "interleaved rounds" if sw.get("baseline") else "")
        L += ["## MUL_MAT over N activation columns vs its floor", "",
              f"ggml-floor, {sw['threads']} threads, best of {sw['repeats']}; floor = max(weight bytes / "
              f"{sw['bandwidth_gbps']:.1f} GB/s, FLOPs / ggml's best rate on the same shape at N = {n_compute})"
              f"{before}.", ""]
        L += [f"Note: {n}." for n in sw.get("notes", [])] + ([""] if sw.get("notes") else [])
        L += sweep_table(sw) + [""]
    if report.get("passes"):
        L += ["## Draft passes vs floor", "",
              f"Block: {report.get('block', 7)} tokens over {report.get('block_ctx', 512)} cached rows "
              "(anchor + masks, non-causal, lm_head + Markov + confidence heads). "
              "Injection: N target-feature rows.", ""]
        L += _passes_table(report) + [""]
        for wt, entry in report["passes"].items():
            notes = []
            if entry.get("note"):
                notes.append(entry["note"])
            notes.append(f"peak RSS {_gb(entry['peak_rss_bytes'])} for files of {_gb(entry['file_bytes'])}; "
                         f"extra buffer types {'on' if entry['extra_bufts'] else 'off'}")
            L += [f"- {wt.upper()}: " + "; ".join(notes)]
        L += [""]
        for wt, entry in report["passes"].items():
            profiles = [("block", entry.get("profile") or {})]
            injections = sorted((entry.get("profile_inject") or {}).items(), key=lambda kv: int(kv[0]))
            profiles += [(f"{n}-row injection", p) for n, p in injections]
            for what, prof in profiles:
                if not prof:
                    continue
                L += [f"### Where the {wt.upper()} {what}'s time goes", "",
                      f"One thread, per node CPU time (a node's own work, however busy the machine): "
                      f"{prof['sum_of_nodes_cpu_seconds'] * 1000:.0f} ms over {prof['n_nodes']} nodes.", "",
                      "| op | CPU time | share |", "|---|---|---|"]
                L += [f"| {o['op']} | {o['seconds'] * 1000:.1f} ms | {o['share'] * 100:.1f} % |"
                      for o in prof["by_op"][:8]]
                L += ["", "| node (all layers) | CPU time | share | src0 | src1 |", "|---|---|---|---|---|"]
                L += [f"| {n['node']} x{n['count']} | {n['seconds'] * 1000:.1f} ms | {n['share'] * 100:.1f} % | "
                      f"{n['src0'][:3]} {n['type0']} | {n['src1'][:3]} |" for n in prof["top_nodes"][:12]]
                L += [""]
    tr = report.get("torch")
    if tr:
        L += ["## PyTorch", "",
              f"The same block in PyTorch {tr['torch_version']} (bench/torch_draft.py: BF16 weights and activations, "
              f"absorbed MLA over the same 512 latent rows, {tr['threads']} threads): **{_ms(tr['block_seconds'])}** "
              f"(median {_ms(tr['block_seconds_median'])}); llama.cpp BF16 / PyTorch = "
              f"**{(1 / tr['ratio_torch_over_llama']) if tr.get('ratio_torch_over_llama') else float('nan'):.2f}**"
              f" (PyTorch is {tr.get('ratio_torch_over_llama')}x llama.cpp's time). Same inputs: its logits against "
              f"llama.cpp's (F32 cache) NMSE {tr['nmse_vs_llama_f32_cache']['biased_logits']:.2e}, greedy chain "
              f"{'equal' if tr['nmse_vs_llama_f32_cache']['chain_equal'] else 'different'}.", ""]
    kv = report.get("kv")
    if kv:
        b = kv["bytes_per_token"]
        L += ["## Draft KV cache", "",
              "| cache | bytes per token (llama.cpp) | per layer | vs decompressed F16 |", "|---|---|---|---|"]
        for ct in ("f32", "f16", "q8_0"):
            if b.get(ct):
                L.append(f"| MLA latent {ct} | {b[ct]:,.0f} | {b[ct] / kv['layers']:,.0f} | "
                         f"{kv['bytes_per_token_decompressed_f16'] / b[ct]:.0f}x smaller |")
        dec = kv["bytes_per_token_decompressed_f16"]
        L += [f"| decompressed K/V F16: {kv['layers']} x 64 x (128+64+128) | {dec:,} | {dec // kv['layers']:,} | 1x |",
              "", f"Latent floor: {kv['latent_width']} values per layer "
              f"({kv['values_per_token']['mla_latent']} per token). "
              f"V takes no memory (a view of K): {kv['v_cache_empty']}.", "",
              f"Draft logits against the F32 cache without flash attention ({kv['n_ctx']} context rows at "
              f"positions {kv['ctx_pos0']}+, past YaRN's original context; llama.cpp quantizes the cache only "
              "with flash attention on):", "",
              "| cache, attention | NMSE logits (Markov-biased) | NMSE final hidden | greedy chain |",
              "|---|---|---|---|"]
        for key, v in kv["nmse_vs_f32_cache"].items():
            label = key.replace("-fa", ", flash attn") if "-fa" in key else f"{key}, no flash attn"
            L.append(f"| {label} | {v['biased_logits']:.2e} | {v['hidden']:.2e} | "
                     f"{'equal' if v['chain_equal'] else 'differs'} |")
        q = kv.get("nmse_q8_0_vs_f16_same_kernel")
        if q:
            L.append(f"| q8_0 against F16, both flash attn | {q['biased_logits']:.2e} | {q['hidden']:.2e} | "
                     f"{'equal' if q['chain_equal'] else 'differs'} |")
        L += [""]
    if report.get("draft_length"):
        L += _draft_length_section(report["draft_length"])
    sp = report.get("spec")
    if sp:
        L += ["## Speculative step split (tiny pair)", "",
              f"{sp['pair']}: {sp['steps']} steps over {sp['prompts']} prompts, draft length {sp['draft_max']}; "
              f"draft {sp['draft_ms_per_step']} ms/step, target verification + the rest "
              f"{sp['target_and_rest_ms_per_step']} ms/step (draft share {sp['draft_share'] * 100:.0f} %); "
              f"mean accepted length {sp['mean_accept_len']}; acceptance per position "
              f"{', '.join(f'{a:.2f}' for a in sp['acceptance_per_position'])}.", ""]
    tool = report.get("tool")
    if tool:
        L += ["## The tool", "", "| step | seconds |", "|---|---|"]
        for k in ("patch_cold_s", "patch_warm_s", "build_cold_s", "patch_after_template_change_s",
                  "build_after_template_change_s"):
            if k in tool:
                L.append(f"| {k[:-2].replace('_', ' ')} | {tool[k]} |")
        L += [""]
    if plots:
        L += ["## Plots", ""] + [f"![{p}](plots/{p})" for p in plots] + [""]
    if report.get("commands"):
        L += ["## Commands", ""] + [f"- `{k}`: `{v}`" for k, v in sorted(report["commands"].items())] + [""]
    return "\n".join(L)


def write_report(report: dict, out_dir: Path) -> Path:
    from llamacpp_mla_port.jsonfile import write_json

    out_dir = Path(out_dir)
    report.setdefault("machine", machine())
    report.setdefault("date", datetime.datetime.now().strftime("%Y-%m-%d %H:%M"))
    plots = _plots(report, out_dir / "plots")
    write_json(out_dir / "report.json", report, indent=1, default=str)
    md = out_dir / "report.md"
    md.write_text(render_markdown(report, plots))
    return md
