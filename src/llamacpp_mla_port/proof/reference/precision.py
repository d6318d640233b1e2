"""Where ggml's CPU backend rounds the draft's numbers, and numpy round-trips that do the same.

Design and bounds: docs/proof.md#precision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from llamacpp_mla_port.errors import ProofError

#: block size of Q8_0 (QK8_0)
Q8_0_BLOCK = 32

#: ggml CPU vec_dot_type of a weight type: what the activation is converted to (None: stays F32)
VEC_DOT_TYPE: dict[str, str | None] = {"f32": None, "f16": "f16", "bf16": "bf16", "q8_0": "q8_0"}

#: query rows at or above which CPU flash attention takes the tiled kernel (GGML_FA_TILE_Q)
FA_TILE_Q = 64


def round_f16(x: np.ndarray) -> np.ndarray:
    """x as F16 holds it (F32 first, as the backend has it), back in float64."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float16).astype(np.float64)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """x as BF16 holds it: round to nearest even on the F32 bits (ggml_compute_fp32_to_bf16)."""
    bits = np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(np.float32)).view(np.uint32)
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def round_q8_0(x: np.ndarray) -> np.ndarray:
    """x quantized to Q8_0 along its last axis and dequantized (quantize_row_q8_0_ref)."""
    x32 = np.asarray(x, dtype=np.float64).astype(np.float32)
    n = x32.shape[-1]
    if n % Q8_0_BLOCK:
        raise ProofError(f"Q8_0 rounds rows of a multiple of {Q8_0_BLOCK} values, got {n}")
    blocks = x32.reshape(*x32.shape[:-1], n // Q8_0_BLOCK, Q8_0_BLOCK)
    d = np.max(np.abs(blocks), axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    scaled = (blocks * inv).astype(np.float32)
    whole = np.trunc(scaled)
    # roundf: halves away from zero (numpy's round takes them to even)
    q = np.where(np.abs(scaled - whole) == 0.5, whole + np.sign(scaled), np.round(scaled))
    d16 = d.astype(np.float16).astype(np.float32)
    return (q * d16).astype(np.float32).reshape(x32.shape).astype(np.float64)


_ROUND = {"f16": round_f16, "bf16": round_bf16, "q8_0": round_q8_0}


def round_to(x: np.ndarray, kind: str | None) -> np.ndarray:
    """x rounded as ggml type `kind` holds it; None leaves it as it is."""
    if kind is None:
        return x
    try:
        return _ROUND[kind](x)
    except KeyError:
        raise ProofError(f"no rounding emulated for ggml type {kind!r} (known: {', '.join(_ROUND)})") from None


@dataclass(frozen=True)
class Precision:
    """Where the reference rounds (see the module doc); the default rounds nowhere."""

    cache: str | None = None           # K rows (and the V view) as the cache stores them
    query: str | None = None           # the query as the score kernel takes it
    probs: str | None = None           # softmax probabilities as the V product takes them (no FA)
    v_accumulator: str | None = None   # "f16": CPU flash attention's sequential F16 accumulator
    activations: Mapping[str, str] = field(default_factory=dict)  # weight GGUF name -> activation type
    f32_angles: bool = False           # RoPE angles as ggml computes them in F32

    @property
    def exact(self) -> bool:
        return not (self.cache or self.query or self.probs or self.v_accumulator or self.activations
                    or self.f32_angles)

    def act(self, weight: str, x: np.ndarray) -> np.ndarray:
        """The activation entering a matmul with GGUF weight `weight`, as the backend converts it."""
        return round_to(x, self.activations.get(weight))

    def describe(self) -> dict:
        kinds = sorted(set(self.activations.values()))
        return {"cache": self.cache, "query": self.query, "probs": self.probs,
                "v_accumulator": self.v_accumulator, "f32_angles": self.f32_angles,
                "activations": {k: sorted(n for n, v in self.activations.items() if v == k) for k in kinds}}


EXACT = Precision()


def cpu_precision(cache_type: str, flash_attn: bool, n_query: int,
                  weight_types: Mapping[str, str] | None = None) -> Precision:
    """The roundings of ggml's CPU backend for one draft run (module doc); EXACT when there are
    none (F32 weights, F32 cache, no flash attention: the float64 correctness proof)."""
    if cache_type not in ("f32", "f16", "bf16", "q8_0"):
        raise ProofError(f"no emulation for cache type {cache_type!r} (f32, f16, bf16, q8_0)")
    activations = {}
    for name, wtype in (weight_types or {}).items():
        if wtype not in VEC_DOT_TYPE:
            raise ProofError(f"weight {name} has type {wtype}: its matmul rounding is not emulated "
                             f"(known: {', '.join(VEC_DOT_TYPE)})")
        if VEC_DOT_TYPE[wtype]:
            activations[name] = VEC_DOT_TYPE[wtype]
    if not flash_attn:
        if cache_type == "q8_0":
            raise ProofError("a Q8_0 cache needs flash attention (llama.cpp refuses a quantized V cache without it)")
        vec = VEC_DOT_TYPE[cache_type]
        if vec is None and not activations:
            return EXACT
        return Precision(cache=vec, query=vec, probs=vec, activations=activations, f32_angles=True)
    k_type = "f16" if cache_type == "f32" else cache_type     # llama-graph casts an F32 cache to F16 for FA
    if n_query == 1:
        raise ProofError("a single query row takes CPU flash attention's KV-split kernel, which is not emulated")
    if n_query >= FA_TILE_Q and k_type == "f16":
        return Precision(cache=k_type, activations=activations, f32_angles=True)
    return Precision(cache=k_type, query=VEC_DOT_TYPE[k_type], v_accumulator="f16" if k_type == "f16" else None,
                     activations=activations, f32_angles=True)


def gguf_tensor_types(path: Path) -> dict[str, str]:
    """GGUF tensor name -> ggml type name in lower case ("f32", "bf16", "q8_0", ...)."""
    from gguf import GGUFReader
    return {t.name: t.tensor_type.name.lower() for t in GGUFReader(str(path)).tensors}


def flash_attention_f16(scores: np.ndarray, values: np.ndarray) -> np.ndarray:
    """CPU flash attention's one-chunk kernel with an F16 V: the output for every query row.

    scores [..., M] (scaled, masked with -inf), values [M, DV] (as the F16 cache holds them),
    cache rows in cache order. Online softmax in F32: on a new maximum the accumulator is
    scaled by exp(old - new) (ggml_vec_scale_f16), then every row adds v * exp(s - max)
    (ggml_vec_mad_f16); the accumulator is F16, so both round to F16 every time. The result
    is the accumulator over the sum of the weights.
    """
    s_all = np.asarray(scores, dtype=np.float64).astype(np.float32)
    vals = np.asarray(values, dtype=np.float64).astype(np.float32)
    live = s_all != -np.inf                                   # masked rows are skipped
    # the running maximum before and after each row, hence every scale factor, up front
    top = np.maximum.accumulate(s_all, axis=-1)
    before = np.concatenate([np.full(s_all.shape[:-1] + (1,), -np.inf, np.float32), top[..., :-1]], axis=-1)
    new = live & (s_all > before)
    with np.errstate(invalid="ignore", over="ignore"):
        ms = np.where(new, np.exp(before - s_all), np.float32(1)).astype(np.float32)
        vs = np.where(new, np.float32(1), np.exp(s_all - before)).astype(np.float32)
    vs = np.where(live, vs, np.float32(0))
    acc = np.zeros(s_all.shape[:-1] + (vals.shape[1],), dtype=np.float16)
    for m in range(s_all.shape[-1]):
        if not live[..., m].any():
            continue
        if new[..., m].any():
            scaled = (acc.astype(np.float32) * ms[..., m, None]).astype(np.float16)
            acc = np.where(new[..., m, None], scaled, acc)
        added = (acc.astype(np.float32) + vals[m] * vs[..., m, None]).astype(np.float16)
        acc = np.where(live[..., m, None], added, acc)
    # the F32 running sum of the weights is sum(exp(s - final max)) up to F32 rounding
    with np.errstate(invalid="ignore"):
        total = np.sum(np.where(live, np.exp(s_all.astype(np.float64) - top[..., -1:]), 0.0), axis=-1)
    out = acc.astype(np.float64) / np.where(total == 0, np.inf, total)[..., None]
    return out.astype(np.float32).astype(np.float64)
