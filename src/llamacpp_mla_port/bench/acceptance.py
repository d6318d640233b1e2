"""Acceptance per draft position: measured on the user's pair, or the published figures.

A curve holds, for draft positions i = 1..7, the share of steps whose first i drafted tokens
were all accepted (cumulative; common_speculative's "#acc rate/pos"). The expected tokens per
step at draft length k is then 1 + the sum of its first k values: the product of the
conditional per-position rates, summed, plus one.

Published figures for Inferact/Kimi-K3-DSpark give a mean, not a curve. Each is turned into a
curve with ONE conditional acceptance rate a for every position (cum_i = a^i) that gives the
published mean at block 7, except where the source says more (ATOM: the last three positions
add almost nothing). The mean each source gives, and how it was read, is in `source`.
"""

from __future__ import annotations

from dataclasses import dataclass

K_MAX = 7


@dataclass(frozen=True)
class Curve:
    name: str
    source: str
    cum: tuple[float, ...]            # per position 1..7, cumulative
    measured: bool = False

    def tokens_per_step(self, k: int) -> float:
        """E[tokens per step] at draft length k (the target's own token counts)."""
        return 1.0 + sum(self.cum[:k])


def geometric_rate(accepted_per_step: float, k: int = K_MAX) -> float:
    """The one conditional rate a with a + a^2 + ... + a^k = accepted_per_step (bisection)."""
    if not 0 <= accepted_per_step <= k:
        raise ValueError(f"{accepted_per_step} drafted tokens accepted per step is outside 0..{k}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, k + 1)) < accepted_per_step:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def geometric(name: str, source: str, accepted_per_step: float) -> Curve:
    a = geometric_rate(accepted_per_step)
    return Curve(name, source, tuple(round(a ** i, 4) for i in range(1, K_MAX + 1)))


def _atom() -> Curve:
    # 3.8 drafted tokens accepted of 7, positions 5-7 adding almost nothing: 0.1 there
    # (0.05, 0.03, 0.02), the other 3.7 from positions 1-4 at one rate
    a = geometric_rate(3.7, 4)
    cum = tuple(round(a ** i, 4) for i in range(1, 5)) + (0.05, 0.03, 0.02)
    return Curve("ATOM", "ROCm ATOM: about 3.8 of 7 drafted tokens accepted per step, the last three positions "
                 "adding almost nothing (read: 3.7 from positions 1-4 at one rate, 0.1 from 5-7)", cum)


#: InferenceX's golden acceptance of this draft per draft length (issue 56): tokens per step 1.85,
#: 2.51, 3.00, 3.75, 3.84 at lengths 1, 2, 3, 6, 7; positions 4-6 share 0.75 (interpolated)
INFERENCEX_TOKENS = {1: 1.85, 2: 2.51, 3: 3.00, 6: 3.75, 7: 3.84}
_INFERENCEX = Curve("InferenceX", "InferenceX golden acceptance for Inferact Kimi-K3 DSpark (B300, thinking on): "
                    "tokens per step 1.85/2.51/3.00/3.75/3.84 at draft lengths 1/2/3/6/7; positions 4-6 "
                    "interpolated (0.33, 0.24, 0.18)", (0.85, 0.66, 0.49, 0.33, 0.24, 0.18, 0.09))

#: the published figures (issue 47, public reports gathered 2026-12-04; InferenceX's per-length curve
#: first, the default), each with its source
PUBLISHED: tuple[Curve, ...] = (
    _INFERENCEX,
    _atom(),
    geometric("vLLM production", "a vLLM production build: acceptance rate 0.42 of drafted tokens at block 7 "
              "(2.94 accepted per step)", 0.42 * 7),
    geometric("tokenspeed", "tokenspeed: accept length about 2.6 at block 7 (read as tokens per step, the "
              "target's own token included: 1.6 drafted tokens accepted)", 1.6),
    geometric("SGLang", "SGLang: accept length 1.4-1.8 at block 7 and 3 (read as 1.6 tokens per step at block 7: "
              "0.6 drafted tokens accepted)", 0.6),
)


def measured(cum: list[float], source: str) -> Curve:
    """The user's pair, from llama-speculative-simple's statistics (bench.spec)."""
    cum = list(cum)[:K_MAX] + [0.0] * (K_MAX - len(cum))
    return Curve("measured", source, tuple(round(x, 4) for x in cum), measured=True)


def break_even_rate(tokens_needed: float, k: int) -> float | None:
    """The one conditional rate a at which 1 + a + ... + a^k reaches tokens_needed: 0 when even
    no accepted token pays, None when k + 1 tokens per step (all accepted) would not."""
    if tokens_needed <= 1.0:
        return 0.0
    if tokens_needed > k + 1:
        return None
    return geometric_rate(tokens_needed - 1.0, k)
