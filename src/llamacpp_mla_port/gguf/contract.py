"""The draft's GGUF naming contract, once: the arch name, its keys, the tensor names per
layout (MLA, Qwen3-style) and the Kimi-K3 dimensions. tests/gguf/test_contract.py checks it
against the patched tree's gguf-py/gguf/constants.py (proof/reference reads HF names on its own).
"""

from __future__ import annotations

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
DSPARK_HEADS: tuple[str, ...] = ("markov_w1.weight", "markov_w2.weight", "conf_proj.weight",
                                 "conf_proj.bias")
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


# Kimi-K3 (the target) and its DSpark draft: n_embd, vocabulary, target layers, block size
K3_N_EMBD = 7168
K3_VOCAB = 163840
K3_TARGET_LAYERS = 93
K3_BLOCK = 7
#: published target_layer_ids (HF, 0-based) of checkpoints called "Kimi-K3 DSpark"
#: (docs/spec/draft-model.md); the GGUF stores them +1
KNOWN_TAPS: dict[str, list[int]] = {
    "Inferact/Kimi-K3-DSpark (MLA)": [2, 23, 47, 71, 89],
    "RadixArk Kimi-K3 DSpark (Qwen3-style)": [7, 23, 51, 67, 83],
}
