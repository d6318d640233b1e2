"""Judging a parity mode on another backend than the CPU the bounds were measured on
(the device check's parity stage; proof.parity's report and mode table in, verdicts out)."""

from __future__ import annotations

#: a gross control must land this far above a bound; a bound the 1 % control is judged by
#: sits at least SUBTLE_MARGIN below it
GROSS_MARGIN = 100.0
SUBTLE_MARGIN = 2.0


def control_limit(row: dict) -> float:
    """The largest bound under which the controls are still caught: the nearest gross control
    / 100 and the attention scale 1 % off / 2 (parity.mode_table row)."""
    return min(row["nearest_gross_control"]["nmse"] / GROSS_MARGIN, row["kq_scale_1pct"] / SUBTLE_MARGIN)


def judge_mode(row: dict, backend: str, figure: float | None = None) -> dict:
    """Judge one mode's worst figure (or `figure`, e.g. a control's, which must fail).

    CPU: the bound in docs/bounds.md. Another backend: the same bound where the figure meets it
    (like with like: that backend rounds as the CPU emulation does, within the CPU's own
    headroom); otherwise the bound is the control limit (measured in the same run), and the
    figure passes only under it: the controls are then still caught. `suggested_bound` is
    10x the figure (the project's rule for a bound measured on one machine), `suggested_ok`
    whether that bound still catches the controls.
    """
    worst = row["worst_nmse"] if figure is None else figure
    limit = control_limit(row)
    cpu_bound = row["threshold"]
    if backend == "cpu" or worst <= cpu_bound:
        bound, basis = cpu_bound, "the CPU bound (like with like)"
    else:
        bound, basis = limit, "control limit: min(nearest gross / 100, 1 % scale / 2), measured in this run"
    cost_ok = row.get("cost_bound") is None or row["worst_nmse_vs_float64"] <= row["cost_bound"]
    ok = bool(worst <= bound and bound <= limit and cost_ok)
    return {"figure": worst, "bound": bound, "basis": basis, "control_limit": limit,
            "headroom": (bound / worst) if worst > 0 else None, "cost_ok": cost_ok,
            "suggested_bound": 10 * worst, "suggested_ok": bool(10 * worst <= limit), "ok": ok}


def judge_parity(report: dict, backend: str) -> dict:
    """Every mode of a parity report (proof.parity) on `backend`; the chains' verdicts from
    the cases (a flipped near-tie is allowed, as on the CPU)."""
    out = {}
    for name, row in report["modes"].items():
        j = judge_mode(row, backend)
        cases = [c for cfg in report["configs"].values() for c in cfg["modes"].get(name, {}).get("cases", [])]
        j["chains_ok"] = all(c["chain_ok"] for c in cases)
        j["chains_equal"] = sum(c["chain_equal"] for c in cases)
        j["cases"] = len(cases)
        j["controls_fail"] = {k: not judge_mode(row, backend, v)["ok"]
                              for k, v in (("nearest_gross", row["nearest_gross_control"]["nmse"]),
                                           ("kq_scale_1pct", row["kq_scale_1pct"]))}
        j["ok"] = bool(j["ok"] and j["chains_ok"] and all(j["controls_fail"].values()))
        j.update({k: row[k] for k in ("compared", "worst_nmse_end_to_end", "worst_nmse_vs_float64",
                                      "nearest_gross_control", "kq_scale_1pct")})
        j["cpu_bound"] = row["threshold"]
        out[name] = j
    return out
