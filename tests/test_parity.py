"""Draft logit parity: the patched llama.cpp (converted GGUF, draft-logits program) against the
float64 reference (HF checkpoint), three tiny shapes x four precision modes (issue 5)."""

from __future__ import annotations

import numpy as np
import pytest

from llamacpp_mla_port.proof import parity
from llamacpp_mla_port.proof.draft_logits import run_draft_logits
from llamacpp_mla_port.proof.programs import compile_program
from llamacpp_mla_port.proof.reference import DraftReference, read_target_head

pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def target(llama_build, tmp_path_factory):
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
    return write_kimi_k3_target(llama_build, tmp_path_factory.mktemp("target") / "kimi-k3.gguf")


@pytest.fixture(scope="module")
def target_dims(target):
    embd, head = read_target_head(target)
    return embd.shape[1], embd.shape[0]


@pytest.fixture(scope="module")
def parity_run(patched_tree, llama_build, target, target_dims, tmp_path_factory):
    hidden, vocab = target_dims
    work = tmp_path_factory.mktemp("parity")
    return parity.run_parity(patched_tree, llama_build, work, lambda h, v, n: target, hidden, vocab,
                             log=lambda *a: None)


def test_configs_differ_in_every_shape_parameter():
    shapes = [c.overrides for c in parity.PARITY_CONFIGS]
    assert len(shapes) >= 3
    for key in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank",
                "q_lora_rank", "num_hidden_layers"):
        assert len({s[key] for s in shapes}) == len(shapes), key
    assert len({len(s["target_layer_ids"]) for s in shapes}) == len(shapes)
    assert len({c.block_size for c in parity.PARITY_CONFIGS}) == len(shapes)


@pytest.mark.parametrize("config", [c.name for c in parity.PARITY_CONFIGS])
@pytest.mark.parametrize("mode", [m.name for m in parity.MODES])
def test_parity(parity_run, config, mode):
    result = parity_run.report["configs"][config]["modes"][mode]
    for case in result["cases"]:
        assert case["worst_nmse"] <= result["threshold"], case
        assert case["chain_ok"], case
        assert case["pass"]
    # positions past the YaRN original context are part of every mode
    assert any(case["beyond_yarn_original_context"] for case in result["cases"])
    if mode == "flash-attn":
        assert max(case["n_ctx"] for case in result["cases"]) >= 1000


def test_parity_would_catch_causal_or_unscaled_attention(parity_run):
    # the controls (reference variants) must land orders of magnitude above the loosest threshold
    for name, entry in parity_run.report["configs"].items():
        assert entry["controls"]["causal_block"] > 1e-3, name
        assert entry["controls"]["no_yarn"] > 1e-3, name


def test_mla_draft_cache_is_k_only(parity_run):
    # 576-style rows: (kv_lora + rope) values per token per layer, V empty
    for name, entry in parity_run.report["configs"].items():
        o = entry["overrides"]
        case = entry["modes"]["f32"]["cases"][0]
        want = o["num_hidden_layers"] * (o["kv_lora_rank"] + o["qk_rope_head_dim"]) * 4   # F32 cache
        assert case["kv_bytes_per_token"] == want, name
        assert case["v_cache_empty"], name


def test_wrong_inputs_change_the_logits(patched_tree, llama_build, target, target_dims, tmp_path):
    """The comparison is sensitive: shifted positions or a different anchor move the NMSE far up."""
    hidden, vocab = target_dims
    pcfg = parity.PARITY_CONFIGS[0]
    ckpt, draft = parity.make_draft(patched_tree, tmp_path, pcfg, hidden, vocab, "float32")
    ref = DraftReference.load(ckpt, target)
    binary = compile_program("draft-logits", patched_tree, llama_build)
    rng = np.random.default_rng(5)
    feats = rng.normal(size=(20, ref.config.n_taps * hidden)).astype(np.float32)
    ids = [3] + [ref.config.mask_token_id] * (pcfg.block_size - 1)
    got = run_draft_logits(binary, draft, target, feats, ids, tmp_path / "run", ctx_pos0=100, cache_type="f32")
    good = ref.forward(feats.astype(np.float64), ids, ctx_positions=100 + np.arange(20))
    assert parity.compare(got, good)["nmse_base_logits"] < 1e-9
    shifted = ref.forward(feats.astype(np.float64), ids, ctx_positions=np.arange(20), block_pos0=27)
    assert parity.compare(got, shifted)["nmse_base_logits"] > 1e-6
