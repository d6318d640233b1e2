"""The draft's GGUF naming contract, once: the arch name, its keys, the tensor names per
layout (MLA, Qwen3-style) and the Kimi-K3 dimensions. tests/gguf/test_contract.py checks it
against the patched tree's gguf-py/gguf/constants.py (proof/reference reads HF names on its own).
"""

from __future__ import annotations

from typing import Any

ARCH = "dflash"


def key(name: str) -> str:
    """The GGUF key of a draft hyperparameter: key("block_size") == "dflash.block_size"."""
    return f"{ARCH}.{name}"


#: the draft's hyperparameter keys (without the arch prefix) the doctor and the tools read
HPARAMS: tuple[str, ...] = (
    "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.key_length_mla", "attention.value_length_mla", "attention.q_lora_rank",
    "attention.kv_lora_rank", "rope.dimension_count", "block_size", "hyper_connection.count",
    "target_layers",
)

#: tensors of every DSpark draft outside the blocks
GLOBAL_TENSORS: tuple[str, ...] = ("fc.weight", "enc.output_norm.weight", "output_norm.weight")
#: the DSpark heads (required in the MLA layout, optional in the Qwen3-style one)
DSPARK_HEADS: tuple[str, ...] = ("markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "conf_proj.bias")
#: per-block tensors (names after "blk.{i}.") each layout requires
BLOCK_TENSORS: dict[str, tuple[str, ...]] = {
    "mla": ("attn_norm.weight", "attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight",
            "attn_kv_a_mqa.weight", "attn_kv_a_norm.weight", "attn_k_b.weight", "attn_v_b.weight",
            "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
            "ffn_down.weight"),
    "qwen3": ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_output.weight",
              "attn_q_norm.weight", "attn_k_norm.weight", "ffn_norm.weight", "ffn_gate.weight",
              "ffn_up.weight", "ffn_down.weight"),
}
#: per-block tensors a layout may carry (the loader checks their shape when present)
OPTIONAL_BLOCK_TENSORS: dict[str, tuple[str, ...]] = {"mla": (), "qwen3": ("attn_v.weight",)}


def block(i: int, name: str) -> str:
    return f"blk.{i}.{name}"


# Kimi-K3 (the target) and its DSpark draft: the real config once; the other forms derive from it
K3_DSPARK_ARCH = "K3DSparkModel"
K3_DSPARK_MODEL_TYPE = "k3_dspark"

# config.json of Inferact/Kimi-K3-DSpark at revision cf6b8244 (draft-model.md)
K3_DSPARK_REAL_CONFIG: dict[str, Any] = {
    "architectures": [K3_DSPARK_ARCH],
    "model_type": K3_DSPARK_MODEL_TYPE,
    "hidden_size": 7168,
    "intermediate_size": 14336,
    "num_hidden_layers": 5,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": False,
    "mla_use_output_gate": False,
    "vocab_size": 163840,
    "draft_vocab_size": 163840,
    "rms_norm_eps": 1e-05,
    "max_position_embeddings": 1048576,
    "rope_theta": 50000.0,
    "rope_parameters": {
        "rope_type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 32768,
        "rope_theta": 50000.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "num_target_layers": 5,
    "target_hidden_size": 7168,
    "target_num_hidden_layers": 93,
    "target_layer_ids": [2, 23, 47, 71, 89],
    "mask_token_id": 163837,
    "bos_token_id": 163584,
    "eos_token_id": 163586,
    "pad_token_id": 163839,
    "markov_rank": 256,
    "markov_head_type": "vanilla",
    "enable_confidence_head": True,
    "confidence_head_with_markov": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "_torchspec_version": "0.1.0",
}

K3_N_EMBD = K3_DSPARK_REAL_CONFIG["target_hidden_size"]
K3_VOCAB = K3_DSPARK_REAL_CONFIG["vocab_size"]
K3_TARGET_LAYERS = K3_DSPARK_REAL_CONFIG["target_num_hidden_layers"]
#: the DSpark block (7 drafted tokens per pass; the config has no key for it: docs/spec/draft-model.md)
K3_BLOCK = 7
#: published target_layer_ids (HF, 0-based) of checkpoints called "Kimi-K3 DSpark"
#: (docs/spec/draft-model.md); the GGUF stores them +1
KNOWN_TAPS: dict[str, list[int]] = {
    "Inferact/Kimi-K3-DSpark (MLA)": [2, 23, 47, 71, 89],
    "RadixArk Kimi-K3 DSpark (Qwen3-style)": [7, 23, 51, 67, 83],
}
