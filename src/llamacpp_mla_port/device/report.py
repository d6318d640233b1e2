"""report.md of the device check: what ran, the verdict per stage and every figure."""

from __future__ import annotations


def _fmt(x, spec=".2e") -> str:
    return "-" if x is None else format(x, spec)


def format_report(r: dict) -> str:
    """report.md: what ran, the verdict per stage and every figure, in tables."""
    lines = [f"# GPU check report ({r['kind']})", ""]
    if not r.get("figures_from_gpu"):
        lines += ["**Dry run with CUDA off: no figure here comes from a GPU.** It proves the steps run end to "
                  "end; on a device machine run:", "", f"    {r['device_call']}", ""]
    env = r.get("environment", {})
    budget = f"a budget of {r['budget_s']} s" if r.get("budget_s") else "no budget"
    lines += [f"- started {r.get('started_utc', '?')}, {r.get('seconds', 0)} s ({budget}); {env.get('cpus')} CPUs; "
              f"GPU: {env.get('nvidia_smi') or 'none'}; "
              f"nvcc: {env.get('nvcc') or 'none'}; torch {env.get('torch')}", "",
              "| stage | verdict | seconds |", "|---|---|---|"]
    for name, st in r.get("stages", {}).items():
        verdict = st.get("skipped") or ("ok" if st.get("ok") else "FAILED: " + st.get("error", "see report.json")[:200])
        lines.append(f"| {name} | {verdict} | {st.get('seconds', '-')} |")
    lines.append("")
    if "build" in r:
        b = r["build"]
        lines += [f"Build: {' '.join(b['cmake_args'])}; targets {', '.join(b['targets'])}; "
                  f"{b.get('seconds', '-')} s.", ""]
    if "fallback" in r or "fallback_problems" in r:
        lines += ["## CPU fallback (the scheduler's splits, GGML_SCHED_DEBUG=2)", "",
                  "| run | draft graphs | splits (backends) | nodes per backend | CPU fallback ops |",
                  "|---|---|---|---|---|"]
        runs = dict(r.get("fallback", {}).get("runs", {}))
        if "realsize" in r and "fallback" in r["realsize"]:
            runs["real-size, FA on, F16"] = r["realsize"]["fallback"]
        for key, fr in runs.items():
            for g in fr["graphs"]:
                lines.append(f"| {key} {g['kind']} | {fr['n_draft_graphs']} | {g['n_splits']} "
                             f"({', '.join(g['split_backends'])}) | {g['nodes_per_backend']} | "
                             f"{', '.join(fr['fallback_ops']) or 'none'} |")
        probs = r.get("fallback_problems") or []
        lines += ["", "Problems: " + ("; ".join(probs) if probs else "none") +
                  ("" if r.get("figures_from_gpu") else " (CPU only: there is no GPU to fall back from)"), ""]
    if "parity" in r:
        lines += [f"## Parity (draft and target on {r['parity']['devices']})", "",
                  "| mode | compared | worst NMSE | CPU bound | bound used | basis | headroom | control limit | "
                  "suggested (10x) | nearest gross control | 1 % scale | controls fail | chains | ok |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, j in r["parity"]["modes"].items():
            near = j["nearest_gross_control"]
            lines.append(
                f"| {name} | {j['compared']} | {_fmt(j['figure'])} | {_fmt(j['cpu_bound'], '.0e')} | "
                f"{_fmt(j['bound'])} | {j['basis']} | {_fmt(j['headroom'], '.0f')}x | {_fmt(j['control_limit'])} | "
                f"{_fmt(j['suggested_bound'])} ({'ok' if j['suggested_ok'] else 'too loose'}) | "
                f"{near['name']} {_fmt(near['nmse'], '.1e')} | {_fmt(j['kq_scale_1pct'], '.1e')} | "
                f"{'yes' if all(j['controls_fail'].values()) else 'NO'} | {j['chains_equal']}/{j['cases']} equal | "
                f"{'ok' if j['ok'] else 'FAIL'} |")
        lines.append("")
    if "lossless" in r:
        ls = r["lossless"]
        lines += [f"## Lossless (placement `{ls.get('placement')}`)", "",
                  "| program | draft | k | FA | p_min | identical | drafted | accepted |",
                  "|---|---|---|---|---|---|---|---|"]
        for prog in ("speculative_simple", "server"):
            for row in ls.get(prog, []):
                lines.append(f"| {prog.replace('_', '-')} | {row['draft']} | {row['draft_max']} | "
                             f"{'on' if row['flash_attn'] else 'off'} | {row['p_min']} | "
                             f"{row['identical']}/{row['of']} | "
                             f"{row['drafted']} | {row['accepted']} |")
        if ls.get("draft_cache"):
            lines += ["", "Quantized draft K/V cache (the bigram-blocks draft, speculative-simple, FA on, p_min 0):", "",
                      "| draft cache | k | identical | drafted | accepted | F16 cache: identical | drafted | accepted |",
                      "|---|---|---|---|---|---|---|---|"]
            for row in ls["draft_cache"]:
                lines.append(f"| {row['cache']} | {row['draft_max']} | {row['identical']}/{row['of']} | "
                             f"{row['drafted']} | {row['accepted']} | {row['f16_identical']}/{row['of']} | "
                             f"{row['f16_drafted']} | {row['f16_accepted']} |")
        lines += ["", f"Mismatches: {ls.get('n_mismatches')}; bigram draft accepted "
                      f"{ls.get('bigram_accepted')} tokens.", ""]
    if "realsize" in r:
        rs = r["realsize"]
        cfg = rs.get("models", {}).get("config", {})
        bw = rs.get("bandwidth", {})
        bw_bytes = rs.get("block_work", {}).get("bytes_weights", 0) + rs.get("block_work", {}).get("bytes_cache", 0)
        floor_key = "HBM floor" if r.get("figures_from_gpu") else "memory floor (host)"
        lines += ["## Real-size draft block (7 tokens over 512 cached rows, FA on, F16 cache)", ""]
        if not r.get("figures_from_gpu"):
            lines += ["Dry run: a reduced config on this CPU, whatever else it runs; these times prove the stage "
                      "runs, they compare nothing.", ""]
        lines += [
                  f"Draft n_embd {cfg.get('n_embd')}, vocab {cfg.get('n_vocab')}, {cfg.get('draft', {})}; "
                  f"bytes read {bw_bytes:,}; "
                  f"copy bandwidth {_fmt(bw.get('gbps'), '.1f')} GB/s ({bw.get('device')}, read + write)", "",
                  f"| v_b form | block median | min | {floor_key} | over the floor |", "|---|---|---|---|---|"]
        for form, f in rs.get("forms", {}).items():
            lines.append(f"| {form} | {f['block_median_s'] * 1e3:.3f} ms | {f['block_min_s'] * 1e3:.3f} ms | "
                         f"{f['floor_s'] * 1e3:.3f} ms | {f['over_floor']:.2f}x |")
        if "permuted_over_broadcast" in rs:
            pp = rs.get("broadcast_parity_f32", {})
            lines += ["", f"Permuted (the series) / broadcast = {rs['permuted_over_broadcast']:.3f} "
                          f"(faster: {rs['faster_form']}); the broadcast build's F32 parity ({pp.get('config')}): NMSE {_fmt(pp.get('worst_nmse'))} "
                          f"<= {_fmt(pp.get('bound'), '.2e')} ({pp.get('basis', 'CPU bound')}): {'ok' if pp.get('ok') else 'FAIL'}."]
        lines.append("")
    lines.append(f"Overall: {'ok' if r.get('ok') else 'NOT ok'}.")
    return "\n".join(lines) + "\n"
