"""report.md of the device check: what ran (and what did not, and why), each stage's verdict and
every figure, in tables."""

from __future__ import annotations

import math


def _fmt(x, spec=".2e") -> str:
    return "-" if x is None else ("inf" if isinstance(x, float) and math.isinf(x) else format(x, spec))


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.3f} ms"


def format_report(r: dict) -> str:
    """report.md (module doc)."""
    gpu = r.get("figures_from_gpu")
    lines = [f"# GPU check report ({r['kind']})", ""]
    if not gpu:
        lines += ["**Dry run with CUDA off: no figure here comes from a GPU.** The \"device\" side of every "
                  "comparison is this machine's CPU build, so each like-with-like deviation is exactly 0; the "
                  "run proves the steps end to end. On a device machine run:", "", f"    {r['device_call']}", ""]
    env = r.get("environment", {})
    budget = f"a budget of {r['budget_s']} s" if r.get("budget_s") else "no budget"
    lines += [f"- started {r.get('started_utc', '?')}, {r.get('seconds', 0)} s ({budget}); {env.get('cpus')} CPUs; "
              f"GPU: {env.get('nvidia_smi') or 'none'}; nvcc: {env.get('nvcc') or 'none'}; torch {env.get('torch')}",
              "", "| stage | verdict | seconds |", "|---|---|---|"]
    for name, st in r.get("stages", {}).items():
        verdict = st.get("skipped") or ("ok" if st.get("ok") else "FAILED: " + st.get("error", "see report.json")[:200])
        lines.append(f"| {name} | {verdict} | {st.get('seconds', '-')} |")
    dropped = [n for n, st in r.get("stages", {}).items() if st.get("skipped")]
    lines += ["", "Not run for lack of time (run them in a second call): " + (", ".join(dropped) or "none") + ".",
              "Not asked for: " + ("; ".join(f"{k} ({v})" for k, v in r.get("not_chosen", {}).items()) or "none")
              + ".", ""]
    if "build" in r:
        b = r["build"]
        lines += [f"Build: {' '.join(b['cmake_args'])}; targets {', '.join(b['targets'])}; "
                  f"{b.get('seconds', '-')} s.", ""]
    for section in (_fallback, _parity, _realsize, _host, _threads, _lossless):
        lines += section(r, gpu)
    lines.append(f"Overall: {'ok' if r.get('ok') else 'NOT ok'}.")
    return "\n".join(lines) + "\n"


def _fallback(r: dict, gpu: bool) -> list[str]:
    if "fallback" not in r and "fallback_problems" not in r:
        return []
    lines = ["## CPU fallback (the scheduler's splits, GGML_SCHED_DEBUG=2)", "",
             "| run | draft graphs | splits (backends) | nodes per backend | CPU fallback ops |",
             "|---|---|---|---|---|"]
    runs = dict(r.get("fallback", {}).get("runs", {}))
    if "fallback" in r.get("realsize", {}):
        runs["real-size, FA on, F16"] = r["realsize"]["fallback"]
    for key, fr in runs.items():
        for g in fr["graphs"]:
            lines.append(f"| {key} {g['kind']} | {fr['n_draft_graphs']} | {g['n_splits']} "
                         f"({', '.join(g['split_backends'])}) | {g['nodes_per_backend']} | "
                         f"{', '.join(fr['fallback_ops']) or 'none'} |")
    probs = r.get("fallback_problems") or []
    return lines + ["", "Problems: " + ("; ".join(probs) if probs else "none") +
                    ("" if gpu else " (CPU only: there is no GPU to fall back from)"), ""]


def _parity(r: dict, gpu: bool) -> list[str]:
    p = r.get("parity")
    if not p:
        return []
    lines = []
    like = p.get("like_with_like")
    if like:
        lines += [f"## Parity like with like (draft and target on {like['devices']} against the CPU)", "",
                  "Bound: 10x what the same mode does to deepseek2's MLA at the draft's geometry between the same "
                  "device and the CPU in this run; gross controls (drafts with a known mistake, on the device, against "
                  "the right draft's CPU logits) must land 100x above the draft's deviation and fail the bound.", "",
                  "| mode | draft (worst NMSE) | deepseek2 | bound | headroom | chains | nearest control | separation "
                  "| fallback ops (draft / deepseek2) | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
        for name, m in like["modes"].items():
            near = min(m["controls"].items(), key=lambda kv: kv[1], default=("none", None))
            lines.append(f"| {name} | {_fmt(m['draft'])} | {_fmt(m['twin'])} | {_fmt(m['bound'])} | "
                         f"{_fmt(m['headroom'], '.0f')}x | {m['chains_equal']}/{m['cases']} equal | {near[0]} "
                         f"{_fmt(near[1], '.1e')} | {_fmt(m['separation'].get(near[0]), '.0f')}x | "
                         f"{', '.join(m['draft_fallback_ops']) or 'none'} / "
                         f"{', '.join(m['twin_fallback_ops']) or 'none'}"
                         f" | {'ok' if m['ok'] else 'FAIL: ' + '; '.join(m['why'])} |")
        names = sorted({c for m in like["modes"].values() for c in m["controls"]})
        lines += ["", "Each gross control's separation (its smallest figure / the draft's deviation):", "",
                  "| mode | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for name, m in like["modes"].items():
            lines.append(f"| {name} | " + " | ".join(
                f"{_fmt(m['controls'].get(c), '.1e')} ({_fmt(m['separation'].get(c), '.0f')}x)" for c in names) + " |")
        lines.append("")
    cpu = p.get("cpu")
    if cpu:
        lines += ["## Parity of the host CPU against float64 (the CPU bounds)", "",
                  "| mode | compared | worst NMSE | bound | headroom | vs float64 | nearest gross control | 1 % scale "
                  "| controls fail | chains | ok |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, j in cpu["modes"].items():
            near = j["nearest_gross_control"]
            lines.append(f"| {name} | {j['compared']} | {_fmt(j['figure'])} | {_fmt(j['bound'], '.0e')} | "
                         f"{_fmt(j['headroom'], '.0f')}x | {_fmt(j['worst_nmse_vs_float64'])} | {near['name']} "
                         f"{_fmt(near['nmse'], '.1e')} | {_fmt(j['kq_scale_1pct'], '.1e')} | "
                         f"{'yes' if all(j['controls_fail'].values()) else 'NO'} | {j['chains_equal']}/{j['cases']} "
                         f"equal | {'ok' if j['ok'] else 'FAIL'} |")
        lines.append("")
    return lines


def _realsize(r: dict, gpu: bool) -> list[str]:
    rs = r.get("realsize")
    if not rs:
        return []
    cfg, bw = rs.get("models", {}).get("config", {}), rs.get("bandwidth", {})
    floor_key = "HBM floor" if gpu else "memory floor (host)"
    lines = ["## Real-size draft block (7 tokens over 512 cached rows, FA on, F16 cache)", ""]
    if not gpu:
        lines += ["Dry run: a reduced config on this CPU, whatever else it runs; these times prove the stage runs, "
                  "they compare nothing.", ""]
    lines += [f"Draft n_embd {cfg.get('n_embd')}, vocab {cfg.get('n_vocab')}, {cfg.get('draft', {})}; bytes read "
              f"{rs.get('block_work', {}).get('bytes_weights', 0) + rs.get('block_work', {}).get('bytes_cache', 0):,}; "
              f"copy bandwidth {_fmt(bw.get('gbps'), '.1f')} GB/s ({bw.get('device')}, read + write)", "",
              f"| v_b form | block median | min | {floor_key} | over the floor |", "|---|---|---|---|---|"]
    for form, f in rs.get("forms", {}).items():
        lines.append(f"| {form} | {_ms(f['block_median_s'])} | {_ms(f['block_min_s'])} | {_ms(f['floor_s'])} | "
                     f"{f['over_floor']:.2f}x |")
    if "permuted_over_broadcast" in rs:
        pp = rs.get("broadcast_parity", {})
        lines += ["", f"Permuted (the series) / broadcast = {rs['permuted_over_broadcast']:.3f} (faster: "
                      f"{rs['faster_form']}); the broadcast build's parity ({pp.get('config')}): "
                      f"{'ok' if pp.get('ok') else 'FAIL'}."]
    prof = rs.get("profile")
    if prof:
        lines += ["", f"Where the block's time goes: one profiled block, {prof['n_nodes']} nodes synchronised one by "
                      f"one, {_ms(prof['profiled_s'])} in all ({_ms(prof['net_s'])} net of "
                      f"{_ms(prof['per_node_sync_s'])} per node, the median of the {prof['noop_nodes']} nodes that "
                      f"compute nothing), against {_ms(prof['block_median_s'])} for a timed block and a floor of "
                      f"{_ms(prof['floor_s'])}:", "",
                  "| part | nodes | time | net | bytes read | floor | net over the floor |",
                  "|---|---|---|---|---|---|---|"]
        for g, row in prof["groups"].items():
            lines.append(f"| {g} | {row['nodes']} | {_ms(row['seconds'])} | {_ms(row['net_seconds'])} | "
                         f"{row['bytes']:,} | {_ms(row['floor_s'])} | {_fmt(row['over_floor'], '.2f')}x |")
        lines += ["", "Heaviest nodes: " + "; ".join(f"{n['node']} x{n['count']} {_ms(n['seconds'])}"
                                                     for n in prof["top_nodes"][:8]) + "."]
    return lines + [""]


def _host(r: dict, gpu: bool) -> list[str]:
    h = r.get("host")
    if not h:
        return []
    cpu = h["cpu"]
    lines = ["## The host CPU", "", f"Model: {cpu.get('model')}; {cpu.get('cpus')} CPUs; ISA flags: "
             f"{', '.join(cpu['flags']) or 'none of those asked'}; the run's own build compiled: "
             f"{', '.join(k for k, v in h.get('build_features', {}).items() if v == 1) or '-'}.", "",
             f"AMX: {h.get('amx_verdict', 'not judged (the reproducer did not run)')}", "",
             "<details><summary>lscpu</summary>",
             "", "```", cpu.get("lscpu", "").strip(), "```", "", "</details>", ""]
    rep = h.get("repro")
    if rep:
        lines += [f"#18099 reproducer ({rep['model']}): {rep['verdict']}", "",
                  "| build | settings | outcome | model buffers | assert |", "|---|---|---|---|---|"]
        for key, label in (("base_default", "base, default"), ("branch_default", "base + loader-probe, default"),
                           ("before", "base, --repack 0"), ("after", "base + loader-probe, --repack 0"),
                           ("after_amx", "base + loader-probe, --repack 1")):
            x = rep[key]
            lines.append(f"| {label} | `{x['command'].split(' ', 1)[1]}` | {x['outcome']} | "
                         f"{', '.join(x.get('model_buffers', [])) or '-'} | {x.get('assert') or '-'} |")
        b, a = rep["before_ts"], rep["after_ts"]
        lines += ["", "llama-bench, tokens/s (the branch changes only where weights load: at --repack 0 both sides "
                      "run the same code, a control):", "",
                  "| test | base, --repack 0 | branch, --repack 0 | branch / base | branch, --repack 1 (default) |",
                  "|---|---|---|---|---|"]
        for test in sorted({k.split(" repack")[0] for k in (*b, *a)}):
            b0, a0, a1 = b.get(f"{test} repack 0"), a.get(f"{test} repack 0"), a.get(f"{test} repack 1")
            lines.append(f"| {test} | {_fmt(b0, '.2f')} | {_fmt(a0, '.2f')} | "
                         f"{_fmt(a0 / b0 if a0 and b0 else None, '.3f')} | {_fmt(a1, '.2f')} |")
        lines.append("")
    return lines


def _threads(r: dict, gpu: bool) -> list[str]:
    t = r.get("thread_rows")
    if not t:
        return []
    lines = ["## Thread rows: each CPU stack against the base, built alike (llama-bench, ABBA)", "",
             f"Every row: {t['jsonl']} (here: thread-rows.jsonl; `scripts/compare-llama-bench.py -i "
             "thread-rows.jsonl -b base -c STACK` tables them).", "",
             "| stack | model type | threads | depth | stack / base (median t/s) |", "|---|---|---|---|---|"]
    if not gpu:
        lines[4:4] = ["Dry run: every model is the reduced DeepSeek-V2-Lite Q8_0 stand-in (device.models), whatever "
                      "the type column says; these ratios prove the stage runs, they compare nothing.", ""]
    for g in t["groups"]:
        lines.append(f"| {g['stack']}{' (--repack 0)' if g.get('note') else ''} | {g.get('type', '-')} | "
                     f"{g['threads']} | {g['args'][-1]} | "
                     + ", ".join(f"{k} {v:.2f}x" for k, v in g["ratios"].items()) + " |")
    notes = sorted({g["note"] for g in t["groups"] if g.get("note")})
    if notes:
        lines += ["", "At --repack 0 where marked so: " + "; ".join(notes) + "."]
    dropped = "; ".join(f"{d['stack']} -t {d['threads']} -d {d['args'][-1]} ({d['why']})" for d in t["dropped"])
    lines += ["", f"Dropped for lack of time: {dropped or 'none'}.", ""]
    return lines


def _lossless(r: dict, gpu: bool) -> list[str]:
    ls = r.get("lossless")
    if not ls:
        return []
    lines = [f"## Lossless (placement `{ls.get('placement')}`)", "",
             "| program | draft | k | FA | p_min | identical | drafted | accepted |",
             "|---|---|---|---|---|---|---|---|"]
    for prog in ("speculative_simple", "server"):
        for row in ls.get(prog, []):
            lines.append(f"| {prog.replace('_', '-')} | {row['draft']} | {row['draft_max']} | "
                         f"{'on' if row['flash_attn'] else 'off'} | {row['p_min']} | {row['identical']}/{row['of']} | "
                         f"{row['drafted']} | {row['accepted']} |")
    if ls.get("draft_cache"):
        lines += ["", "Quantized draft K/V cache (the bigram-blocks draft, speculative-simple, FA on, p_min 0):", "",
                  "| draft cache | k | identical | drafted | accepted | F16 cache: identical | drafted | accepted |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in ls["draft_cache"]:
            lines.append(f"| {row['cache']} | {row['draft_max']} | {row['identical']}/{row['of']} | {row['drafted']} | "
                         f"{row['accepted']} | {row['f16_identical']}/{row['of']} | {row['f16_drafted']} | "
                         f"{row['f16_accepted']} |")
    return lines + ["", f"Mismatches: {ls.get('n_mismatches')}; bigram draft accepted {ls.get('bigram_accepted')} "
                        "tokens.", ""]
