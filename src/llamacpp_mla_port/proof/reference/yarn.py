"""DeepSeek-style YaRN rotary embedding, written from the published formulas in float64.

The draft rotates only the `qk_rope_head_dim` part of each query/key, in INTERLEAVED
pairs (x[2i], x[2i+1]) with frequency index i (GPT-J/DeepSeek style, not NeoX halves).
`style="neox"` rotates the pairs (x[i], x[i + d/2]) instead: not the draft, a control for a
runtime that picks the wrong rotation (llama.cpp's DFLASH default).

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

`attn_factor` (1.0 unless a run sets it) is llama.cpp's attention factor as deepseek2.cpp
applies it (`attn_factor_org`: --yarn-attn-factor, rope.scaling.attn_factor): it multiplies
the cos/sin magnitude and, squared, the attention scale. No published config sets one; HF and
vLLM would apply theirs to cos/sin only.
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
    style: str = "interleaved"    # "neox" only for controls: the draft is interleaved
    attn_factor: float = 1.0      # llama.cpp's attention factor (module doc); 1.0 in every config

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
        return rope.attn_factor
    return rope.attn_factor * get_mscale(rope.factor, rope.mscale) / get_mscale(rope.factor, rope.mscale_all_dim)


def attention_scale(rope: RopeConfig, qk_head_dim: int) -> float:
    """Softmax scale of the draft's attention: qk_head_dim^-1/2, times mscale^2 under YaRN, times
    attn_factor^2 (deepseek2.cpp's kq_scale)."""
    scale = qk_head_dim ** -0.5 * rope.attn_factor ** 2
    if rope.yarn and rope.mscale_all_dim:
        m = get_mscale(rope.factor, rope.mscale_all_dim)
        scale *= m * m
    return scale


def rotate(x: np.ndarray, positions: np.ndarray, rope: RopeConfig, f32_angles: bool = False) -> np.ndarray:
    """Rotate the last axis of x in the rope's pair style (interleaved for the draft)."""
    if rope.style == "interleaved":
        return rotate_interleaved(x, positions, rope, f32_angles)
    if rope.style == "neox":
        return rotate_neox(x, positions, rope, f32_angles)
    raise ValueError(f"unknown rotation style {rope.style!r} (interleaved, neox)")


def cos_sin(positions: np.ndarray, rope: RopeConfig, f32_angles: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [n_pos, dim/2] of every position and pair, float64; with `f32_angles` the
    angles are the ones ggml's CPU rope computes in F32 (angles_f32)."""
    if f32_angles:
        angles = angles_f32(positions, rope)
    else:
        angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq(rope)[None, :]
    mag = cos_sin_magnitude(rope)
    return np.cos(angles) * mag, np.sin(angles) * mag


def angles_f32(positions: np.ndarray, rope: RopeConfig) -> np.ndarray:
    """The rotation angles [n_pos, dim/2] as ggml's CPU rope has them (ops.cpp, rope_yarn and
    ggml_rope_cache_init), every step in F32: theta_scale = powf(base, -2/dim); the pair-i
    angle is pos * theta_scale^i, multiplied up pair by pair; YaRN blends freq_scale * that with
    it by the ramp, in one fused multiply-add. Past a few hundred positions an F32 angle is off
    by ~1e-5 rad, which decides F16 roundings of the rotated values; float64 angles (the
    default) are the exact function.
    """
    f32 = np.float32
    half = rope.dim // 2
    theta_scale = f32(np.float64(f32(rope.theta)) ** np.float64(f32(-2.0) / f32(rope.dim)))
    step = np.asarray(positions).astype(f32)
    extrap = np.empty((step.shape[0], half), dtype=f32)
    for i in range(half):
        extrap[:, i] = step
        step = (step * theta_scale).astype(f32)
    if not rope.yarn:
        return extrap.astype(np.float64)
    low, high = correction_range(rope)
    ramp = (np.arange(half).astype(f32) - f32(low)) / f32(max(0.001, high - low))
    mix = (f32(1) - np.minimum(f32(1), np.maximum(f32(0), ramp))).astype(f32)      # 1: extrapolate
    interp = (f32(1.0 / rope.factor) * extrap).astype(f32)
    tail = (extrap * mix).astype(f32)
    blended = interp.astype(np.float64) * (f32(1) - mix).astype(np.float64) + tail.astype(np.float64)
    return blended.astype(f32).astype(np.float64)


def rotate_neox(x: np.ndarray, positions: np.ndarray, rope: RopeConfig, f32_angles: bool = False) -> np.ndarray:
    """Rotate the last axis of x (size rope.dim) in NeoX halves: pair i is (x[i], x[i + dim/2])."""
    if x.shape[-1] != rope.dim:
        raise ValueError(f"rope part has {x.shape[-1]} dims, config says {rope.dim}")
    cos, sin = cos_sin(positions, rope, f32_angles)
    half = rope.dim // 2
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


def rotate_interleaved(x: np.ndarray, positions: np.ndarray, rope: RopeConfig,
                       f32_angles: bool = False) -> np.ndarray:
    """Rotate the last axis of x (size rope.dim) in interleaved pairs.

    x: [..., n_pos, dim] where axis -2 matches `positions` ([n_pos]).
    """
    if x.shape[-1] != rope.dim:
        raise ValueError(f"rope part has {x.shape[-1]} dims, config says {rope.dim}")
    cos, sin = cos_sin(positions, rope, f32_angles)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x, dtype=np.float64)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out
