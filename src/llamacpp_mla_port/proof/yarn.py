"""DeepSeek-style YaRN rotary embedding, written from the published formulas in float64.

The draft rotates only the `qk_rope_head_dim` part of each query/key, in INTERLEAVED
pairs (x[2i], x[2i+1]) with frequency index i (GPT-J/DeepSeek style, not NeoX halves).

DeepSeek-YaRN (the flavour this draft uses):
  * base frequencies        f_i = theta ** (-2i / d),  i = 0 .. d/2-1
  * correction dims         c(b) = d * ln(L_orig / (2 pi b)) / (2 ln theta)
                            low = floor(c(beta_fast)), high = ceil(c(beta_slow)), clamped to [0, d-1]
  * extrapolation mask      m_i = 1 - clamp((i - low) / (high - low), 0, 1)
                            (m = 1 keeps the original frequency, m = 0 divides it by `factor`)
  * blended frequency       f'_i = f_i / factor * (1 - m_i) + f_i * m_i
  * cos/sin magnitude       get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
                            (1.0 for the real config: the cos/sin are NOT scaled)
  * attention scale         (nope + rope) ** -0.5 * get_mscale(factor, mscale_all_dim) ** 2
  with get_mscale(s, m) = 1 if s <= 1 else 0.1 * m * ln(s) + 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RopeConfig:
    """The rotary parameters of one model, read from its config.json."""

    dim: int                      # number of rotated dims (qk_rope_head_dim), even
    theta: float                  # rope_theta
    yarn: bool = False            # rope_type == "yarn"
    factor: float = 1.0
    original_context: int = 0     # original_max_position_embeddings
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0

    @classmethod
    def from_hf_config(cls, config: dict) -> "RopeConfig":
        """Read `rope_parameters` (new HF layout) or `rope_scaling` (old), theta from either."""
        params = config.get("rope_parameters") or config.get("rope_scaling") or {}
        theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
        dim = int(config["qk_rope_head_dim"])
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type in (None, "default"):
            return cls(dim=dim, theta=theta)
        if rope_type != "yarn":
            raise ValueError(f"unsupported rope_type {rope_type!r} (only default and yarn)")
        return cls(
            dim=dim,
            theta=theta,
            yarn=True,
            factor=float(params["factor"]),
            original_context=int(params["original_max_position_embeddings"]),
            beta_fast=float(params.get("beta_fast", 32.0)),
            beta_slow=float(params.get("beta_slow", 1.0)),
            mscale=float(params.get("mscale", 1.0)),
            mscale_all_dim=float(params.get("mscale_all_dim", 0.0)),
        )


def get_mscale(scale: float, mscale: float = 1.0) -> float:
    if scale <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def correction_dim(n_rotations: float, dim: int, theta: float, original_context: int) -> float:
    """The (fractional) dim index whose wavelength fits `n_rotations` times in the original context."""
    return dim * math.log(original_context / (n_rotations * 2.0 * math.pi)) / (2.0 * math.log(theta))


def correction_range(rope: RopeConfig) -> tuple[int, int]:
    low = math.floor(correction_dim(rope.beta_fast, rope.dim, rope.theta, rope.original_context))
    high = math.ceil(correction_dim(rope.beta_slow, rope.dim, rope.theta, rope.original_context))
    return max(low, 0), min(high, rope.dim - 1)


def inv_freq(rope: RopeConfig) -> np.ndarray:
    """Per-pair angular frequency, shape [dim/2], float64."""
    half = rope.dim // 2
    base = rope.theta ** (-np.arange(0, rope.dim, 2, dtype=np.float64) / rope.dim)
    if not rope.yarn:
        return base
    low, high = correction_range(rope)
    span = (high - low) if high != low else 0.001
    ramp = np.clip((np.arange(half, dtype=np.float64) - low) / span, 0.0, 1.0)
    keep = 1.0 - ramp                          # 1: extrapolate (original freq), 0: interpolate
    return base / rope.factor * (1.0 - keep) + base * keep


def cos_sin_magnitude(rope: RopeConfig) -> float:
    if not rope.yarn:
        return 1.0
    return get_mscale(rope.factor, rope.mscale) / get_mscale(rope.factor, rope.mscale_all_dim)


def attention_scale(rope: RopeConfig, qk_head_dim: int) -> float:
    """Softmax scale of the draft's attention: qk_head_dim^-1/2, times mscale^2 under YaRN."""
    scale = qk_head_dim ** -0.5
    if rope.yarn and rope.mscale_all_dim:
        m = get_mscale(rope.factor, rope.mscale_all_dim)
        scale *= m * m
    return scale


def rotate_interleaved(x: np.ndarray, positions: np.ndarray, rope: RopeConfig) -> np.ndarray:
    """Rotate the last axis of x (size rope.dim) in interleaved pairs.

    x: [..., n_pos, dim] where axis -2 matches `positions` ([n_pos]).
    """
    if x.shape[-1] != rope.dim:
        raise ValueError(f"rope part has {x.shape[-1]} dims, config says {rope.dim}")
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq(rope)[None, :]   # [n_pos, dim/2]
    mag = cos_sin_magnitude(rope)
    cos, sin = np.cos(angles) * mag, np.sin(angles) * mag
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x, dtype=np.float64)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out
