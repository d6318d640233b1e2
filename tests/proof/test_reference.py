"""The float64 draft reference: YaRN against published numbers, the absorbed attention
against the decompressed one, non-causality, the Markov/confidence heads, checkpoint I/O."""

from __future__ import annotations

import dataclasses
import json
import math
import struct

import numpy as np
import pytest

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.proof.reference import yarn
from llamacpp_mla_port.proof.reference.precision import EXACT, Precision, cpu_precision
from llamacpp_mla_port.proof.reference.model import (
    DraftReference,
    nmse,
    read_checkpoint,
    read_safetensors,
    stage_outputs,
    stream_taps,
)

REAL_ROPE = {
    "qk_rope_head_dim": 64,
    "rope_theta": 50000,
    "rope_parameters": {
        "rope_type": "yarn", "factor": 32, "original_max_position_embeddings": 32768,
        "rope_theta": 50000, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
    },
}


def tiny_config(**over) -> dict:
    cfg = {
        "architectures": ["K3DSparkModel"], "model_type": "k3_dspark",
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6,
        "vocab_size": 64, "draft_vocab_size": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 16,
                            "rope_theta": 50000.0, "beta_fast": 32.0, "beta_slow": 1.0,
                            "mscale": 1.0, "mscale_all_dim": 1.0},
        "target_hidden_size": 32, "target_layer_ids": [0, 2, 3], "mask_token_id": 61,
        "markov_rank": 8, "markov_head_type": "vanilla", "enable_confidence_head": True,
        "mla_use_nope": False, "mla_use_output_gate": False,
    }
    cfg.update(over)
    return cfg


def random_tensors(cfg: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    E, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, qr, kr = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    V, R, T = cfg["vocab_size"], cfg["markov_rank"], len(cfg["target_layer_ids"])

    def mat(o, i):
        return rng.normal(0.0, 1.0 / math.sqrt(i), size=(o, i))

    def norm(n):
        return 1.0 + 0.1 * rng.normal(size=n)

    t = {
        "context_proj.weight": mat(E, T * E), "context_norm.weight": norm(E), "final_norm.weight": norm(E),
        "markov_head.markov_w1.weight": mat(V, R), "markov_head.markov_w2.weight": mat(V, R),
        "confidence_head.proj.weight": mat(1, E + R), "confidence_head.proj.bias": rng.normal(size=1),
    }
    for il in range(L):
        p = f"layers.{il}."
        t.update({
            p + "input_layernorm.weight": norm(E), p + "post_attention_layernorm.weight": norm(E),
            p + "self_attn.q_a_proj.weight": mat(qr, E), p + "self_attn.q_a_layernorm.weight": norm(qr),
            p + "self_attn.q_b_proj.weight": mat(H * (dn + dr), qr),
            p + "self_attn.kv_a_proj_with_mqa.weight": mat(kr + dr, E),
            p + "self_attn.kv_a_layernorm.weight": norm(kr),
            p + "self_attn.kv_b_proj.weight": mat(H * (dn + dv), kr),
            p + "self_attn.o_proj.weight": mat(E, H * dv),
            p + "mlp.gate_proj.weight": mat(F, E), p + "mlp.up_proj.weight": mat(F, E),
            p + "mlp.down_proj.weight": mat(E, F),
        })
    return t


def make_reference(seed=0, **over) -> tuple[DraftReference, dict]:
    cfg = tiny_config(**over)
    rng = np.random.default_rng(seed)
    tensors = random_tensors(cfg, rng)
    V, E = cfg["vocab_size"], cfg["hidden_size"]
    ref = DraftReference(cfg, tensors, rng.normal(size=(V, E)), rng.normal(size=(V, E)) / math.sqrt(E))
    return ref, cfg


def features(cfg, n_ctx, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n_ctx, len(cfg["target_layer_ids"]) * cfg["target_hidden_size"]))


# --- YaRN -------------------------------------------------------------------------------

def test_attention_scale_real_config():
    rope = yarn.RopeConfig.from_hf_config(REAL_ROPE)
    assert yarn.attention_scale(rope, 128 + 64) == pytest.approx(0.1308608, abs=5e-8)
    assert yarn.get_mscale(32.0, 1.0) == pytest.approx(1.3465735902799727, rel=1e-15)
    assert yarn.cos_sin_magnitude(rope) == 1.0      # DeepSeek-YaRN: cos/sin not scaled


def test_yarn_correction_range_real_config():
    # c(32) = 64 ln(32768 / (2 pi 32)) / (2 ln 50000) = 15.0645, c(1) = 25.3146
    rope = yarn.RopeConfig.from_hf_config(REAL_ROPE)
    assert yarn.correction_dim(32, 64, 50000, 32768) == pytest.approx(15.0645, abs=1e-4)
    assert yarn.correction_dim(1, 64, 50000, 32768) == pytest.approx(25.3146, abs=1e-4)
    assert yarn.correction_range(rope) == (15, 26)


def test_yarn_inv_freq_matches_published_values():
    # golden values: transformers 4.57 `_compute_yarn_parameters` on the real config (float32)
    golden = {0: 1.0, 1: 7.1311110258102417e-01, 14: 8.7942862883210182e-03,
              15: 6.2713036313652992e-03, 16: 4.0782829746603966e-03, 20: 6.4724287949502468e-04,
              25: 2.5446977815590799e-05, 26: 4.7526614253001753e-06, 31: 8.7644127688690787e-07}
    inv = yarn.inv_freq(yarn.RopeConfig.from_hf_config(REAL_ROPE))
    assert inv.shape == (32,)
    for i, v in golden.items():
        assert inv[i] == pytest.approx(v, rel=1e-6), i


def test_yarn_keeps_fast_dims_and_interpolates_slow_ones():
    rope = yarn.RopeConfig.from_hf_config(REAL_ROPE)
    base = 50000.0 ** (-np.arange(0, 64, 2) / 64)
    inv = yarn.inv_freq(rope)
    rotations = 32768 * base / (2 * math.pi)         # turns over the original context
    fast, slow = rotations >= 32, rotations <= 1
    assert fast.any() and slow.any()
    np.testing.assert_allclose(inv[fast], base[fast], rtol=1e-15)
    np.testing.assert_allclose(inv[slow], base[slow] / 32, rtol=1e-15)


def test_plain_rope_without_yarn_block():
    rope = yarn.RopeConfig.from_hf_config({"qk_rope_head_dim": 8, "rope_theta": 10000})
    assert not rope.yarn
    assert yarn.attention_scale(rope, 24) == pytest.approx(24 ** -0.5)
    np.testing.assert_allclose(yarn.inv_freq(rope), 10000.0 ** (-np.arange(0, 8, 2) / 8))


def test_interleaved_rotation_is_relative_and_pairwise():
    rope = yarn.RopeConfig.from_hf_config(REAL_ROPE)
    rng = np.random.default_rng(3)
    q, k = rng.normal(size=64), rng.normal(size=64)
    pos = np.array([5, 40000, 40035, 70000])           # beyond the original 32768 as well
    rq = yarn.rotate_interleaved(np.tile(q, (4, 1)), pos, rope)
    rk = yarn.rotate_interleaved(np.tile(k, (4, 1)), pos, rope)
    np.testing.assert_allclose(np.linalg.norm(rq, axis=1), np.linalg.norm(q), rtol=1e-12)
    # q(p+d) . k(p) depends on d only (magnitude 1)
    assert rq[2] @ rk[1] == pytest.approx(yarn.rotate_interleaved(q[None], np.array([35]), rope)[0] @ k, rel=1e-9)
    # interleaved: pair (0, 1) rotates at the fastest frequency, pair (32, 33) is a NeoX pair and must not
    one = np.zeros((1, 64))
    one[0, 0] = 1.0
    r = yarn.rotate_interleaved(one, np.array([1]), rope)[0]
    assert r[0] == pytest.approx(math.cos(1.0)) and r[1] == pytest.approx(math.sin(1.0))
    assert np.count_nonzero(r) == 2


def test_neox_rotation_is_the_interleaved_one_on_permuted_dims():
    # the control's rotation: pair i is (x[i], x[i + d/2]) instead of (x[2i], x[2i+1])
    rope = yarn.RopeConfig.from_hf_config(REAL_ROPE)
    neox = dataclasses.replace(rope, style="neox")
    x = np.random.default_rng(4).normal(size=(3, 64))
    pos = np.array([0, 700, 50000])
    halves = np.stack([np.arange(32), np.arange(32, 64)], axis=1).reshape(-1)   # interleave the halves
    want = yarn.rotate_interleaved(x[:, halves], pos, rope)
    got = yarn.rotate(x, pos, neox)
    np.testing.assert_allclose(got[:, halves], want, rtol=1e-12, atol=1e-12)
    assert not np.allclose(got, yarn.rotate(x, pos, rope))


@pytest.mark.parametrize("config", [REAL_ROPE, {"qk_rope_head_dim": 16, "rope_theta": 10000}])
def test_f32_angles_are_ggml_s_f32_rounding_of_the_exact_ones(config):
    rope = yarn.RopeConfig.from_hf_config(config)
    pos = np.array([0, 1, 5, 300, 1300, 40000])
    exact = pos[:, None] * yarn.inv_freq(rope)[None, :]
    f32 = yarn.angles_f32(pos, rope)
    np.testing.assert_array_equal(f32[0], 0.0)
    np.testing.assert_array_equal(f32[:, 0], pos)                 # pair 0 is the position itself
    # pos * theta_scale^i multiplied up in F32: off by a few F32 ulps of the angle, not more
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(f32 - exact) <= 32 * ulp + 1e-30)
    assert np.any(f32 != exact)


# --- attention forms --------------------------------------------------------------------

@pytest.mark.parametrize("n_ctx", [0, 1, 9])
def test_absorbed_equals_decompressed(n_ctx):
    ref, cfg = make_reference()
    feats = features(cfg, n_ctx)
    ids = [5, 61, 61, 61, 61]
    a = ref.forward(feats, ids, block_pos0=20, attention="absorbed")
    d = ref.forward(feats, ids, block_pos0=20, attention="decompressed")
    assert nmse(a.hidden, d.hidden) < 1e-26
    np.testing.assert_allclose(a.base_logits, d.base_logits, rtol=1e-11, atol=1e-12)
    np.testing.assert_array_equal(a.chain, d.chain)


def test_attention_is_non_causal():
    ref, cfg = make_reference()
    feats = features(cfg, 6)
    ids = [5, 61, 61, 61]
    out = ref.forward(feats, ids)
    changed = ref.forward(feats, [5, 61, 61, 7])      # only the LAST block row differs
    assert nmse(changed.hidden[0], out.hidden[0]) > 1e-6, "row 0 must see later block rows"
    causal = ref.forward(feats, ids, causal=True)
    assert nmse(causal.base_logits, out.base_logits) > 1e-6
    causal_changed = ref.forward(feats, [5, 61, 61, 7], causal=True)
    np.testing.assert_allclose(causal_changed.hidden[0], causal.hidden[0], rtol=1e-13)


def test_context_enters_through_kv_rows_only():
    ref, cfg = make_reference()
    feats = features(cfg, 5)
    out = ref.forward(feats, [3, 61, 61])
    assert len(out.context_rows) == cfg["num_hidden_layers"]
    assert out.context_rows[0].shape == (5, cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
    # latent part of each row is RMS-normalised with kv_a_layernorm
    lat = out.context_rows[0][:, :cfg["kv_lora_rank"]] / ref.w("layers.0.self_attn.kv_a_layernorm.weight")
    np.testing.assert_allclose(np.mean(lat ** 2, axis=1), 1.0, rtol=1e-3)
    other = ref.forward(features(cfg, 5, seed=9), [3, 61, 61])
    assert nmse(other.hidden, out.hidden) > 1e-6


def test_wrong_feature_width_is_an_error():
    ref, cfg = make_reference()
    with pytest.raises(ProofError, match="features must be"):
        ref.forward(np.zeros((3, 7)), [1, 61])


def test_positions_beyond_original_context_are_finite_and_matter():
    ref, cfg = make_reference()
    feats = features(cfg, 4)
    near = ref.forward(feats, [3, 61, 61], ctx_positions=np.arange(4), block_pos0=4)
    far = ref.forward(feats, [3, 61, 61], ctx_positions=np.arange(100, 104), block_pos0=104)
    assert np.isfinite(far.biased_logits).all()
    # same relative layout: RoPE is relative, so the result is position-shift invariant
    assert nmse(far.hidden, near.hidden) < 1e-24


# --- heads ------------------------------------------------------------------------------

def test_markov_chain_and_confidence():
    ref, cfg = make_reference()
    out = ref.forward(features(cfg, 3), [9, 61, 61, 61, 61, 61, 61])
    w1 = ref.w("markov_head.markov_w1.weight")
    w2 = ref.w("markov_head.markov_w2.weight")
    np.testing.assert_array_equal(out.chain, np.argmax(out.biased_logits, axis=1))
    prevs = [9] + list(out.chain[:-1])
    for k, prev in enumerate(prevs):
        np.testing.assert_allclose(out.biased_logits[k] - out.base_logits[k], w2 @ w1[prev], atol=1e-12)
        feat = np.concatenate([out.hidden[k], w1[prev]])
        logit = ref.w("confidence_head.proj.weight")[0] @ feat + ref.w("confidence_head.proj.bias")[0]
        assert out.confidence_logit[k] == pytest.approx(logit, rel=1e-12)
        assert out.confidence[k] == pytest.approx(1 / (1 + math.exp(-logit)), rel=1e-12)
    np.testing.assert_allclose(out.base_logits, out.hidden @ ref.lm_head.T, rtol=1e-12)


def test_without_markov_head_logits_are_base():
    cfg = tiny_config()
    rng = np.random.default_rng(0)
    t = {k: v for k, v in random_tensors(cfg, rng).items()
         if not k.startswith(("markov_head", "confidence_head"))}
    ref = DraftReference(cfg, t, rng.normal(size=(64, 32)), rng.normal(size=(64, 32)))
    out = ref.forward(features(cfg, 2), [1, 61])
    np.testing.assert_array_equal(out.biased_logits, out.base_logits)
    assert out.confidence is None


def test_missing_tensor_is_named():
    cfg = tiny_config()
    rng = np.random.default_rng(0)
    t = random_tensors(cfg, rng)
    del t["layers.1.self_attn.kv_b_proj.weight"]
    ref = DraftReference(cfg, t, rng.normal(size=(64, 32)), rng.normal(size=(64, 32)))
    with pytest.raises(ProofError, match="layers.1.self_attn.kv_b_proj.weight"):
        ref.forward(features(cfg, 2), [1, 61])


# --- checkpoint I/O ---------------------------------------------------------------------

def _write_safetensors(path, tensors: dict[str, tuple[str, np.ndarray]]):
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        if dtype == "BF16":
            raw = (np.asarray(arr, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            raw = np.asarray(arr, {"F32": "<f4", "F16": "<f2"}[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_read_safetensors_bf16_f16_f32(tmp_path):
    vals = np.array([[1.0, -2.5, 3.140625], [0.0, 1e-3, -65504.0]], dtype=np.float32)
    _write_safetensors(tmp_path / "m.safetensors", {
        "a": ("BF16", vals), "b": ("F16", vals), "c": ("F32", vals)})
    got = read_safetensors(tmp_path / "m.safetensors")
    assert got["a"].dtype == np.float64
    np.testing.assert_allclose(got["a"], vals, rtol=2 ** -7)     # bf16: 8 mantissa bits
    np.testing.assert_allclose(got["b"], vals, rtol=2 ** -10)
    np.testing.assert_array_equal(got["c"], vals)
    assert got["a"][0, 0] == 1.0 and got["a"][0, 1] == -2.5


def test_read_checkpoint_roundtrip(tmp_path):
    cfg = tiny_config()
    t = random_tensors(cfg, np.random.default_rng(0))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _write_safetensors(tmp_path / "model.safetensors", {k: ("F32", v.astype(np.float32)) for k, v in t.items()})
    config, got = read_checkpoint(tmp_path)
    assert config == cfg and set(got) == set(t)
    np.testing.assert_allclose(got["context_proj.weight"], t["context_proj.weight"], rtol=1e-7)


def test_reads_the_fixture_checkpoint_with_real_names(tmp_path):
    """fixtures.checkpoint writes the real 68-name layout (BF16 here); the reference runs on it as is."""
    from llamacpp_mla_port.fixtures.checkpoint import k3_dspark_config, write_k3_dspark_checkpoint

    cfg = k3_dspark_config()
    write_k3_dspark_checkpoint(tmp_path, cfg, seed=3, dtype="bfloat16", keep_embeddings=True)
    config, tensors = read_checkpoint(tmp_path)
    assert "embed_tokens.weight" in tensors and "layers.1.self_attn.kv_b_proj.weight" in tensors
    # BF16 values decode exactly: every value has at most 8 significant bits
    w = tensors["context_proj.weight"].astype(np.float32)
    assert np.all((w.view(np.uint32) & 0xFFFF) == 0)
    rng = np.random.default_rng(0)
    V, E = cfg["vocab_size"], cfg["hidden_size"]
    ref = DraftReference(config, tensors, tensors["embed_tokens.weight"], rng.normal(size=(V, E)))
    feats = rng.normal(size=(5, len(cfg["target_layer_ids"]) * E))
    ids = [4] + [cfg["mask_token_id"]] * 6
    a = ref.forward(feats, ids, ctx_positions=np.arange(100, 105))   # past original_max_position_embeddings 64
    d = ref.forward(feats, ids, ctx_positions=np.arange(100, 105), attention="decompressed")
    assert a.biased_logits.shape == (7, V) and a.confidence.shape == (7,)
    assert nmse(a.biased_logits, d.biased_logits) < 1e-24


# --- emulated precision, stage taps, controls -------------------------------------------

def test_default_is_float64_and_the_control_knobs_change_only_what_they_name():
    ref, cfg = make_reference()
    feats = features(cfg, 7)
    ids = [5, 61, 61, 61]
    out = ref.forward(feats, ids)
    same = ref.forward(feats, ids, precision=EXACT, kq_scale_factor=1.0)
    np.testing.assert_array_equal(out.biased_logits, same.biased_logits)
    scaled = ref.forward(feats, ids, kq_scale_factor=1.01)
    assert 1e-9 < nmse(scaled.base_logits, out.base_logits) < 1e-2
    for other in (ref.variant(yarn=False), ref.variant(style="neox")):
        assert nmse(other.forward(feats, ids).base_logits, out.base_logits) > 1e-6


def test_emulated_precision_rounds_and_stays_close():
    ref, cfg = make_reference()
    feats = features(cfg, 7)
    ids = [5, 61, 61, 61]
    exact = ref.forward(feats, ids, ctx_positions=np.arange(300, 307))
    for prec in (cpu_precision("f16", False, 4), cpu_precision("f16", True, 4),
                 Precision(activations={f"blk.{il}.{t}.weight": "bf16" for il in range(2)
                                        for t in ("attn_q_a", "attn_kv_a_mqa", "ffn_up", "ffn_down")})):
        rounded = ref.forward(feats, ids, ctx_positions=np.arange(300, 307), precision=prec)
        assert 1e-12 < nmse(rounded.base_logits, exact.base_logits) < 1e-3, prec
    with pytest.raises(ProofError, match="float64 only"):
        ref.forward(feats, ids, attention="decompressed", precision=cpu_precision("f16", False, 4))


def test_feeding_the_reference_its_own_taps_changes_nothing():
    ref, cfg = make_reference()
    feats = features(cfg, 6)
    ids = [5, 61, 61]
    prec = cpu_precision("f16", True, 3)
    out = ref.forward(feats, ids, precision=prec)
    taps = out.extras["taps"]
    assert set(taps) == set(stream_taps(cfg["num_hidden_layers"]))
    fed = ref.forward(feats, ids, precision=prec, feed=taps)
    np.testing.assert_array_equal(fed.biased_logits, out.biased_logits)
    stages = stage_outputs(taps, cfg["num_hidden_layers"])
    assert set(stages) == set(out.extras["stages"])
    for name, value in out.extras["stages"].items():
        np.testing.assert_allclose(stages[name], value, rtol=1e-9, atol=1e-12)
    # a stage fed another run's values starts from them: a changed layer-0 output moves layer 1 only
    moved = dict(taps)
    moved["l_out-0"] = taps["l_out-0"] + 0.01 * np.random.default_rng(2).normal(size=taps["l_out-0"].shape)
    refed = ref.forward(feats, ids, precision=prec, feed=moved)
    np.testing.assert_array_equal(refed.extras["stages"]["attn-0"], out.extras["stages"]["attn-0"])
    assert nmse(refed.extras["stages"]["attn-1"], out.extras["stages"]["attn-1"]) > 1e-8
    with pytest.raises(ProofError, match="ffn_inp-1"):
        ref.forward(feats, ids, feed={k: v for k, v in taps.items() if k != "ffn_inp-1"})


def test_attn_factor_scales_cos_sin_and_the_attention_scale_squared():
    """llama.cpp's attention factor as deepseek2.cpp applies it (yarn.py): cos/sin times the factor,
    the softmax scale times its square, under YaRN and without; 1.0 changes nothing."""
    RopeConfig, attention_scale, cos_sin_magnitude = yarn.RopeConfig, yarn.attention_scale, yarn.cos_sin_magnitude
    for rope in (RopeConfig(dim=64, theta=5e4),
                 RopeConfig(dim=64, theta=5e4, yarn=True, factor=32.0, original_context=4096, mscale_all_dim=0.707)):
        scaled = dataclasses.replace(rope, attn_factor=1.3)
        assert attention_scale(scaled, 192) == pytest.approx(1.69 * attention_scale(rope, 192), rel=1e-12)
        assert cos_sin_magnitude(scaled) == pytest.approx(1.3 * cos_sin_magnitude(rope), rel=1e-12)
        assert attention_scale(dataclasses.replace(rope, attn_factor=1.0), 192) == attention_scale(rope, 192)
    # the real config: 0.1308608 with attn_factor 1 (RUNBOOK 3.2, vLLM's mla.py)
    real = RopeConfig(dim=64, theta=5e4, yarn=True, factor=32.0, original_context=32768, mscale_all_dim=1.0)
    assert attention_scale(real, 192) == pytest.approx(0.1308608, rel=1e-6)


# --- transformers' DeepSeek-V3 modules as an oracle (issue 55) ---------------------------

def test_transformers_oracle_computes_the_reference_function(tmp_path):
    """The draft wired from transformers' DeepseekV3Attention/RMSNorm/MLP/rotary embedding
    (proof/reference/transformers_oracle.py) computes our float64 function: to 1e-12 with its
    q_a/kv_a norms at the config's eps (worst over 4 seeds 3.2e-14), to 5e-9 as transformers
    builds them (eps 1e-6 there: 1.5e-10, docs/proof.md#oracle); the oracle with a known mistake
    lands >= 100x over that."""
    from llamacpp_mla_port.fixtures.checkpoint import k3_dspark_config, write_k3_dspark_checkpoint
    from llamacpp_mla_port.proof.parity import compare
    from llamacpp_mla_port.proof.reference.transformers_oracle import TransformersOracle

    ref, cfg = make_reference()
    feats, ids, positions = features(cfg, 9), [5, 61, 61, 61, 61, 61, 61], 40 + np.arange(9)
    want = ref.forward(feats, ids, ctx_positions=positions)

    def figure(causal=False, kq_scale=1.0, **kwargs):
        oracle = TransformersOracle(cfg, ref.w.tensors, ref.token_embd, ref.lm_head, **kwargs)
        for layer in oracle.layers:
            layer.self_attn.scaling *= kq_scale
        return compare(oracle.forward(feats, ids, ctx_positions=positions, chain=want.chain, causal=causal),
                       want)["worst_nmse"]

    aligned, as_built = figure(latent_norm_eps=cfg["rms_norm_eps"]), figure()
    assert aligned < 1e-12 and as_built < 5e-9 and aligned * 100 < as_built, (aligned, as_built)
    controls = {"causal": figure(causal=True), "no mscale_all_dim": figure(rope_scaling={"mscale_all_dim": 0.0}),
                "neox": figure(rope_interleave=False), "kq scale 1 %": figure(kq_scale=1.01)}
    assert min(controls.values()) >= 100 * 5e-9, controls
    # the fixture checkpoint (real names, BF16, config.json with rope_parameters) loads strictly
    ckpt = write_k3_dspark_checkpoint(tmp_path / "ckpt", k3_dspark_config(), dtype="bfloat16")
    config, tensors = read_checkpoint(ckpt)
    rng = np.random.default_rng(0)
    embd, head = rng.normal(size=(2, config["vocab_size"], config["hidden_size"]))
    fixture_ref = DraftReference(config, tensors, embd, head)
    feats = rng.normal(size=(5, len(config["target_layer_ids"]) * config["target_hidden_size"]))
    ids = [1] + [config["mask_token_id"]] * 3
    got = TransformersOracle.load(ckpt, embd, head, latent_norm_eps=config["rms_norm_eps"]).forward(feats, ids)
    assert compare(got, fixture_ref.forward(feats, ids))["worst_nmse"] < 1e-12
