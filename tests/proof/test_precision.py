"""Where ggml's CPU backend rounds (proof/reference/precision.py): the round-trips against independent
implementations, the choice of roundings per run, and CPU flash attention's F16 accumulator."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.proof.reference import precision as P


@pytest.fixture
def values():
    rng = np.random.default_rng(0)
    # magnitudes from 1e-2 to 1e2 per row, as activations and cache rows have them
    return rng.normal(size=(64, 96)) * rng.uniform(0.01, 100.0, size=(64, 1))


def test_f16_rounds_to_nearest_even_as_numpy_half(values):
    assert np.array_equal(P.round_f16(values), values.astype(np.float32).astype(np.float16).astype(np.float64))
    # 1 + 2^-11 is halfway between 1 and the next half: to even, i.e. 1
    assert P.round_f16(np.array([1 + 2.0 ** -11]))[0] == 1.0


@pytest.mark.parametrize("kind,qtype", [("bf16", GGMLQuantizationType.BF16), ("q8_0", GGMLQuantizationType.Q8_0)])
def test_bf16_and_q8_0_equal_gguf_py_quantizers(values, kind, qtype):
    # gguf-py's numpy quantizers are llama.cpp's reference formulas, written independently of ours
    x32 = values.astype(np.float32)
    want = quants.dequantize(quants.quantize(x32, qtype), qtype).astype(np.float64)
    assert np.array_equal(P.round_to(values, kind), want)


def test_q8_0_needs_whole_blocks_and_keeps_zero_blocks():
    with pytest.raises(ProofError, match="multiple of 32"):
        P.round_q8_0(np.ones((2, 40)))
    assert np.array_equal(P.round_q8_0(np.zeros((1, 32))), np.zeros((1, 32)))
    # halves go away from zero (roundf), not to even: 0.5 quanta -> 1 quantum
    x = np.zeros(32)
    x[0], x[1] = 127.0, 0.5
    assert P.round_q8_0(x)[1] == 1.0


def test_the_f32_run_is_exact_and_reduced_runs_say_where_they_round():
    assert P.cpu_precision("f32", False, 7, {"fc.weight": "f32"}) is P.EXACT
    f16 = P.cpu_precision("f16", False, 7)
    assert (f16.cache, f16.query, f16.probs, f16.v_accumulator, f16.f32_angles) == ("f16", "f16", "f16", None, True)
    fa = P.cpu_precision("f16", True, 7)
    assert (fa.cache, fa.query, fa.probs, fa.v_accumulator) == ("f16", "f16", None, "f16")
    # llama-graph casts an F32 cache to F16 for flash attention
    assert P.cpu_precision("f32", True, 7).cache == "f16"
    # 64+ query rows: the tiled kernel keeps Q in F32 and accumulates in F32
    tiled = P.cpu_precision("f16", True, 64)
    assert (tiled.query, tiled.v_accumulator) == (None, None)
    q8 = P.cpu_precision("q8_0", True, 7)
    assert (q8.cache, q8.query, q8.v_accumulator) == ("q8_0", "q8_0", None)
    bf16 = P.cpu_precision("f16", False, 7, {"blk.0.ffn_up.weight": "bf16", "blk.0.ffn_norm.weight": "f32"})
    assert dict(bf16.activations) == {"blk.0.ffn_up.weight": "bf16"}
    x = np.array([1.0 + 2.0 ** -10])
    assert bf16.act("blk.0.ffn_up.weight", x)[0] == 1.0 and bf16.act("blk.0.ffn_norm.weight", x)[0] == x[0]


@pytest.mark.parametrize("args,match", [
    (("q8_0", False, 7), "needs flash attention"),
    (("f16", True, 1), "KV-split kernel"),
    (("q4_0", False, 7), "no emulation for cache type"),
])
def test_runs_the_emulation_does_not_cover_are_refused(args, match):
    with pytest.raises(ProofError, match=match):
        P.cpu_precision(*args)


def test_an_unknown_weight_type_is_refused():
    with pytest.raises(ProofError, match="blk.0.ffn_up.weight has type q4_k"):
        P.cpu_precision("f16", False, 7, {"blk.0.ffn_up.weight": "q4_k"})


def _softmax_attention(scores, values):
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p = np.where(np.isfinite(scores), p, 0.0)
    return (p / p.sum(axis=-1, keepdims=True)) @ values


def test_flash_attention_f16_accumulator_is_attention_with_f16_steps():
    rng = np.random.default_rng(1)
    values = P.round_f16(rng.normal(size=(1000, 24)))
    scores = rng.normal(size=(3, 5, 1000)) * 2.0
    got = P.flash_attention_f16(scores, values)
    want = _softmax_attention(scores, values)
    err = np.sum((got - want) ** 2) / np.sum(want ** 2)
    # the F16 accumulator costs ~2e-5 over 1000 rows (what the CPU kernel costs), far above F32 noise
    assert 1e-6 < err < 1e-4


def test_flash_attention_f16_skips_masked_rows_and_is_exact_when_nothing_rounds():
    values = np.array([[1.0, 2.0], [4.0, 8.0], [100.0, 3.0]])
    scores = np.array([[0.0, 0.0, -np.inf]])            # the third row masked
    assert np.allclose(P.flash_attention_f16(scores, values), [[2.5, 5.0]], rtol=0, atol=0)
