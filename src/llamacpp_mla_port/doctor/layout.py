"""Which draft layout a file holds (MLA, Qwen3-style, DeepSeek-V4, not a draft) and the
tensors with their shapes that layout must or may carry."""

from __future__ import annotations

from typing import Any

from llamacpp_mla_port.doctor.findings import ARCH, Context, _int, _shape, _vocab_size, key
from llamacpp_mla_port.gguf.contract import HPARAMS


def detect(ctx: Context) -> None:
    """Fill ctx.layout and ctx.hp once; the checks read them."""
    d = ctx.draft
    ts = d.tensors
    hp: dict[str, Any] = {}
    for name in HPARAMS:
        if name != "target_layers":          # an array: the pairing check reads it
            hp[name] = _int(d, key(name))
    hp["n_vocab"], hp["n_vocab_source"] = _vocab_size(d, ARCH)
    w1 = _shape(d, "markov_w1.weight")
    hp["markov_rank"] = w1[0] if w1 and len(w1) == 2 else None
    fc = _shape(d, "fc.weight")
    hp["fc_in"] = fc[0] if fc and len(fc) == 2 else None
    ctx.hp = hp
    if d.arch != ARCH:
        ctx.layout = "not-a-draft"
    elif (hp["hyper_connection.count"] or 0) > 0:
        ctx.layout = "dsv4"
    elif (hp["attention.key_length_mla"] is not None or hp["attention.value_length_mla"] is not None
          or "blk.0.attn_kv_a_mqa.weight" in ts or "blk.0.attn_kv_b.weight" in ts):
        ctx.layout = "mla"
    elif "blk.0.attn_q.weight" in ts:
        ctx.layout = "qwen3"
    else:
        ctx.layout = "unknown"


def _layers_to_check(ctx: Context) -> int:
    """block_count, bounded by the blk.* tensors present: a crafted count cannot make us loop."""
    n = ctx.hp["block_count"] or 0
    present = len({name.split(".")[1] for name in ctx.draft.tensors if name.startswith("blk.")})
    return max(0, min(n, present + 1))


def _mul(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a * b


def _qwen3_heads(hp: dict[str, Any], length: str) -> tuple[int | None, int | None]:
    """(head dimension `length` or llama.cpp's default, K/V heads): llama_model_base::load_hparams'
    defaults when a key is absent (a 0 stays 0)."""
    n_embd, n_head = hp["embedding_length"], hp["attention.head_count"]
    default_head = n_embd // n_head if n_embd and n_head and n_head > 0 else None
    n_kv = hp["attention.head_count_kv"] if hp["attention.head_count_kv"] is not None else n_head
    return (hp[length] if hp[length] is not None else default_head), n_kv


def expected_tensors(ctx: Context) -> dict[str, tuple[int, ...] | None]:
    """Required tensor -> expected ggml shape (None when a dimension is unknown)."""
    hp = ctx.hp
    n_embd, n_ff, n_head = hp["embedding_length"], hp["feed_forward_length"], hp["attention.head_count"]
    rank, n_vocab = hp["markov_rank"], hp["n_vocab"]

    def s(*dims: int | None) -> tuple[int, ...] | None:
        return None if any(x is None for x in dims) else tuple(int(x) for x in dims)  # type: ignore[arg-type]

    exp: dict[str, tuple[int, ...] | None] = {
        "fc.weight": s(hp["fc_in"], n_embd),
        "enc.output_norm.weight": s(n_embd),
        "output_norm.weight": s(n_embd),
    }
    if "markov_w1.weight" in ctx.draft.tensors or ctx.layout == "mla":
        exp["markov_w1.weight"] = s(rank, n_vocab)
        exp["markov_w2.weight"] = s(rank, n_vocab)
    if "conf_proj.weight" in ctx.draft.tensors or ctx.layout == "mla":
        exp["conf_proj.weight"] = s(None if n_embd is None or rank is None else n_embd + rank, 1)
        exp["conf_proj.bias"] = (1,)
    if ctx.layout == "mla":
        q_lora, kv_lora = hp["attention.q_lora_rank"], hp["attention.kv_lora_rank"]
        k_mla, v_mla, rope = (hp["attention.key_length_mla"], hp["attention.value_length_mla"],
                              hp["rope.dimension_count"])
        nope = None if k_mla is None or rope is None else k_mla - rope
        attention = {"attn_q_a.weight": s(n_embd, q_lora), "attn_q_a_norm.weight": s(q_lora),
                     "attn_q_b.weight": s(q_lora, _mul(n_head, k_mla)),
                     "attn_kv_a_mqa.weight": s(n_embd, None if kv_lora is None or rope is None else kv_lora + rope),
                     "attn_kv_a_norm.weight": s(kv_lora), "attn_k_b.weight": s(nope, kv_lora, n_head),
                     "attn_v_b.weight": s(kv_lora, v_mla, n_head), "attn_output.weight": s(_mul(n_head, v_mla), n_embd)}
    elif ctx.layout == "qwen3":
        head_dim, n_kv = _qwen3_heads(hp, "attention.key_length")
        attention = {
            "attn_q.weight": s(n_embd, _mul(head_dim, n_head)), "attn_k.weight": s(n_embd, _mul(head_dim, n_kv)),
            "attn_output.weight": s(_mul(head_dim, n_head), n_embd),
            "attn_q_norm.weight": s(head_dim), "attn_k_norm.weight": s(head_dim)}
    else:
        return exp
    # every layer: its norm, the layout's attention, the FFN
    layer = {"attn_norm.weight": s(n_embd), **attention, "ffn_norm.weight": s(n_embd),
             "ffn_gate.weight": s(n_embd, n_ff), "ffn_up.weight": s(n_embd, n_ff), "ffn_down.weight": s(n_ff, n_embd)}
    for i in range(_layers_to_check(ctx)):
        exp.update({f"blk.{i}.{name}": shape for name, shape in layer.items()})
    return exp


def optional_shapes(ctx: Context) -> dict[str, tuple[int, ...] | None]:
    """Tensors the loader takes when present, with the shape it then insists on."""
    if ctx.layout != "qwen3":
        return {}
    n_embd = ctx.hp["embedding_length"]
    head_v, n_kv = _qwen3_heads(ctx.hp, "attention.value_length")
    width = _mul(head_v, n_kv)
    return {f"blk.{i}.attn_v.weight": None if n_embd is None or width is None else (n_embd, width)
            for i in range(_layers_to_check(ctx))}
