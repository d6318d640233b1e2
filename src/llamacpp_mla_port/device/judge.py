"""Verdicts of the device check's parity stage: the host CPU against float64 with the bounds
of docs/bounds.md (`judge_cpu_parity`), a GPU like with like, bounded by LIKE_MARGIN x what
the same mode does to deepseek2's MLA, its gross controls GROSS_MARGIN x above (`judge_like`).
The rule: docs/device-check.md ("Parity like with like"). A bound is never widened to pass.
"""

from __future__ import annotations

import math

#: the like-with-like bound: this many times what the mode does to deepseek2's MLA
LIKE_MARGIN = 10.0
#: a gross control must land this far above the draft's deviation (and the CPU bounds)
GROSS_MARGIN = 100.0
#: a bound the CPU's 1 % attention-scale control is judged by sits this far below it
SUBTLE_MARGIN = 2.0


def judge_cpu_mode(row: dict, figure: float | None = None) -> dict:
    """One mode of proof.parity's mode table on the CPU: its worst figure (or `figure`, e.g. a
    control's, which must fail) against the mode's bound; the bound must sit GROSS_MARGIN below
    the nearest gross control and SUBTLE_MARGIN below the 1 % control, the cost within its bound."""
    worst = row["worst_nmse"] if figure is None else figure
    limit = min(row["nearest_gross_control"]["nmse"] / GROSS_MARGIN, row["kq_scale_1pct"] / SUBTLE_MARGIN)
    bound = row["threshold"]
    cost_ok = row.get("cost_bound") is None or row["worst_nmse_vs_float64"] <= row["cost_bound"]
    return {"figure": worst, "bound": bound, "control_limit": limit, "headroom": (bound / worst) if worst > 0 else None,
            "cost_ok": cost_ok, "ok": bool(worst <= bound and bound <= limit and cost_ok)}


def judge_cpu_parity(report: dict) -> dict:
    """Every mode of a CPU parity report (proof.parity.run_parity): the bound, the chains (a
    flipped near-tie is allowed, as in proof.parity), and that each control fails the bound."""
    out = {}
    for name, row in report["modes"].items():
        j = judge_cpu_mode(row)
        cases = [c for cfg in report["configs"].values() for c in cfg["modes"].get(name, {}).get("cases", [])]
        j["chains_ok"] = all(c["chain_ok"] for c in cases)
        j["chains_equal"] = sum(c["chain_equal"] for c in cases)
        j["cases"] = len(cases)
        j["controls_fail"] = {k: not judge_cpu_mode(row, v)["ok"]
                              for k, v in (("nearest_gross", row["nearest_gross_control"]["nmse"]),
                                           ("kq_scale_1pct", row["kq_scale_1pct"]))}
        j["ok"] = bool(j["ok"] and j["chains_ok"] and all(j["controls_fail"].values()))
        j.update({k: row[k] for k in ("compared", "worst_nmse_vs_float64", "nearest_gross_control", "kq_scale_1pct")})
        out[name] = j
    return out


def separation(control: float, deviation: float) -> float:
    """How many times the draft's deviation a control lands (inf where the draft matched exactly)."""
    if deviation > 0:
        return control / deviation
    return math.inf if control > 0 else 0.0


def judge_like(draft: float, twin: float, controls: dict[str, float | None], chains_ok: bool = True) -> dict:
    """One mode on a GPU, like with like (module doc): `draft` and `twin` are the worst NMSE of
    GPU against CPU logits over the mode's cases, `controls` the smallest figure of each gross
    control over its cases (None: not applicable to any shape of the run)."""
    bound = LIKE_MARGIN * twin
    ran = {k: v for k, v in controls.items() if v is not None}
    sep = {k: separation(v, draft) for k, v in ran.items()}
    fail = {k: v > bound for k, v in ran.items()}
    within = draft <= bound
    ok = bool(within and ran and chains_ok and all(s >= GROSS_MARGIN for s in sep.values()) and all(fail.values()))
    why = []
    if not within:
        why.append(f"draft {draft:.2e} > {LIKE_MARGIN:g} x deepseek2's {twin:.2e}")
    if not ran:
        why.append("no gross control ran")
    why += [f"control {k} only {s:.0f}x the draft's deviation" for k, s in sep.items() if s < GROSS_MARGIN]
    why += [f"control {k} ({ran[k]:.2e}) passes the bound" for k, f in fail.items() if not f]
    if not chains_ok:
        why.append("a chain differs from the CPU's where the CPU's top two were not a near-tie")
    return {"draft": draft, "twin": twin, "bound": bound, "within": within,
            "headroom": (bound / draft) if draft > 0 else None, "controls": ran,
            "separation": sep, "controls_fail": fail, "chains_ok": chains_ok, "ok": ok, "why": why}
