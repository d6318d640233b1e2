"""The table: what a draft of length k buys over the target alone, and where it breaks even.

For draft length k, one speculative step costs the draft's pass (its block of k tokens and the
injection of the accepted tokens' features) plus the target's verify of k + 1 tokens (with the
rollback of what was rejected), and yields E(k) tokens on average (acceptance.Curve):

    speedup(k) = E(k) x T(1) / (T_draft(k) + T(k + 1) + T_rollback(k + 1))

where T(1) is the target alone, one token. Break-even: the tokens per step that make the speedup
1, and the one conditional per-position acceptance that gives them. Greedy, one sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamacpp_mla_port.bench.acceptance import K_MAX, Curve, break_even_rate


@dataclass
class StepCosts:
    """Seconds: the target alone at one token, the verify of N tokens, its rollback, the draft."""
    t1: float
    verify: dict[int, float]           # N -> T(N), speculative context
    rollback: dict[int, float]         # N -> seq_rm of the rejected N - 1 tokens
    block: dict[int, float]            # k -> the draft's block of k tokens
    inject: dict[int, float]           # rows -> the draft's injection of that many target rows

    def inject_for(self, rows: float) -> float:
        """Linear between the measured row counts (rows per step is fractional: E(k))."""
        pts = sorted(self.inject.items())
        if not pts:
            return 0.0
        if rows <= pts[0][0] or len(pts) == 1:
            return pts[0][1]
        for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
            if rows <= n1:
                return t0 + (t1 - t0) * (rows - n0) / (n1 - n0)
        return pts[-1][1]

    def draft(self, k: int, tokens_per_step: float) -> float:
        return self.block[k] + self.inject_for(tokens_per_step)

    def step(self, k: int, tokens_per_step: float) -> float:
        return self.draft(k, tokens_per_step) + self.verify[k + 1] + self.rollback.get(k + 1, 0.0)


def table(costs: StepCosts, curves: list[Curve]) -> dict:
    """Rows per k, the best k per curve, the break-even."""
    ks = [k for k in range(1, K_MAX + 1) if k in costs.block and k + 1 in costs.verify]
    rows = []
    for k in ks:
        # break-even with the injection of k + 1 rows (the most a step can inject): a bound from above
        step_hi = costs.step(k, k + 1)
        need = step_hi / costs.t1
        rate = break_even_rate(need, k)
        row = {"k": k, "draft_s": costs.draft(k, 1.0), "block_s": costs.block[k], "verify_s": costs.verify[k + 1],
               "rollback_s": costs.rollback.get(k + 1, 0.0), "verify_ratio": costs.verify[k + 1] / costs.t1,
               "break_even_tokens": need, "break_even_rate": rate, "speedup": {}, "tokens_per_step": {}}
        for c in curves:
            e = c.tokens_per_step(k)
            row["tokens_per_step"][c.name] = e
            row["speedup"][c.name] = e * costs.t1 / costs.step(k, e)
        rows.append(row)
    best = {}
    for c in curves:
        k_best = max(ks, key=lambda k: rows[ks.index(k)]["speedup"][c.name]) if ks else None
        s = rows[ks.index(k_best)]["speedup"][c.name] if ks else 0.0
        best[c.name] = {"k": k_best if s > 1.0 else 0, "speedup": s, "pays": s > 1.0}
    return {"t1_s": costs.t1, "rows": rows, "best": best,
            "curves": [{"name": c.name, "source": c.source, "cum": list(c.cum), "measured": c.measured}
                       for c in curves]}


def recommended(tab: dict) -> tuple[str, int]:
    """(the curve the advice rests on, the draft length): the measured curve when there is one,
    else the production figure (vLLM), else the first."""
    names = [c["name"] for c in tab["curves"]]
    name = "measured" if "measured" in names else ("vLLM production" if "vLLM production" in names else names[0])
    return name, tab["best"][name]["k"]


def _ms(s: float) -> str:
    return f"{s * 1000:.1f}" if s < 10 else f"{s * 1000:.0f}"


def render(tab: dict, unit_note: str = "") -> list[str]:
    names = [c["name"] for c in tab["curves"]]
    L = [f"T(1), the target alone, one token: {_ms(tab['t1_s'])} ms{unit_note}.", "",
         "| k | draft (ms) | verify k+1 (ms) | T(k+1)/T(1) | rollback (ms) | break-even tokens/step | break-even "
         "acceptance | " + " | ".join(f"speedup, {n}" for n in names) + " |",
         "|---|---|---|---|---|---|---|" + "---|" * len(names)]
    for r in tab["rows"]:
        rate = "never (even all accepted)" if r["break_even_rate"] is None else f"{r['break_even_rate']:.2f}"
        cells = [f"{r['speedup'][n]:.2f}x ({r['tokens_per_step'][n]:.2f})" for n in names]
        L.append(f"| {r['k']} | {_ms(r['draft_s'])} | {_ms(r['verify_s'])} | {r['verify_ratio']:.2f} | "
                 f"{r['rollback_s'] * 1000:.3f} | {r['break_even_tokens']:.2f} | {rate} | " + " | ".join(cells) + " |")
    L += ["", "Speedup over the target alone, with E[tokens per step] in brackets. Break-even: the tokens per "
          "step at which the pair only matches the target alone, and the one per-position acceptance rate that "
          "gives them (the draft injecting k + 1 rows). Greedy, one sequence.", ""]
    for n in names:
        b = tab["best"][n]
        src = next(c["source"] for c in tab["curves"] if c["name"] == n)
        verdict = (f"best length {b['k']} ({b['speedup']:.2f}x)" if b["pays"] else
                   f"**the draft does not pay here** (best {b['speedup']:.2f}x): run the target alone")
        L.append(f"- {n}: {verdict}. Acceptance: {src}.")
    return L + [""]


def plot(tab: dict, path: Path, title: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ks = [r["k"] for r in tab["rows"]]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for c in tab["curves"]:
        ax.plot(ks, [r["speedup"][c["name"]] for r in tab["rows"]], marker="o",
                linestyle="-" if c["measured"] else "--", label=c["name"])
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xlabel("draft length k (--spec-draft-n-max)")
    ax.set_ylabel("speedup over the target alone")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
