"""Tiny GGUF files for the doctor tests, written with the PyPI `gguf` writer.

Shapes follow the MLA draft GGUF contract scaled down (numpy shape = ggml ne reversed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGUFValueType

TINY = dict(n_embd=32, n_ff=48, n_head=4, q_lora=16, kv_lora=8, nope=8, rope=4, v=8,
            n_vocab=64, rank=8, n_layer=5, n_taps=5)


def _tokenizer(w: GGUFWriter, n_vocab: int, mask: int | None) -> None:
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "kimi-k2")
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(n_vocab - 3)] + ["<bos>", "<mask>", "<eos>"])
    w.add_array("tokenizer.ggml.token_type", [1] * (n_vocab - 3) + [3, 3, 3])
    w.add_array("tokenizer.ggml.merges", ["t o", "to k"])
    w.add_uint32("tokenizer.ggml.bos_token_id", n_vocab - 3)
    w.add_uint32("tokenizer.ggml.eos_token_id", n_vocab - 1)
    if mask is not None:
        w.add_uint32("tokenizer.ggml.mask_token_id", mask)


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def write_mla_draft(path: Path, *, target_layers: list[int] | None = None, fc_taps: int | None = None,
                    keep_embd: bool = False, embd: np.ndarray | None = None, mask: int | None = -2,
                    block_size: int | None = 7, omit_keys: tuple[str, ...] = (),
                    extra_keys: dict[str, tuple[Any, GGUFValueType]] | None = None,
                    omit_tensors: tuple[str, ...] = (), extra_tensors: dict[str, np.ndarray] | None = None,
                    seed: int = 0, **dims: int) -> Path:
    d = {**TINY, **dims}
    e, H = d["n_embd"], d["n_head"]
    k_mla = d["nope"] + d["rope"]
    taps = target_layers if target_layers is not None else [3, 6, 9, 12, 15][: d["n_taps"]]
    fc_taps = fc_taps if fc_taps is not None else d["n_taps"]
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "dflash")
    kv: dict[str, tuple[Any, GGUFValueType]] = {
        "dflash.context_length": (4096, GGUFValueType.UINT32),
        "dflash.embedding_length": (e, GGUFValueType.UINT32),
        "dflash.block_count": (d["n_layer"], GGUFValueType.UINT32),
        "dflash.feed_forward_length": (d["n_ff"], GGUFValueType.UINT32),
        "dflash.attention.head_count": (H, GGUFValueType.UINT32),
        "dflash.attention.head_count_kv": (1, GGUFValueType.UINT32),
        "dflash.attention.key_length": (d["kv_lora"] + d["rope"], GGUFValueType.UINT32),
        "dflash.attention.value_length": (d["kv_lora"], GGUFValueType.UINT32),
        "dflash.attention.key_length_mla": (k_mla, GGUFValueType.UINT32),
        "dflash.attention.value_length_mla": (d["v"], GGUFValueType.UINT32),
        "dflash.attention.q_lora_rank": (d["q_lora"], GGUFValueType.UINT32),
        "dflash.attention.kv_lora_rank": (d["kv_lora"], GGUFValueType.UINT32),
        "dflash.rope.dimension_count": (d["rope"], GGUFValueType.UINT32),
        "dflash.attention.layer_norm_rms_epsilon": (1e-5, GGUFValueType.FLOAT32),
        "dflash.rope.freq_base": (50000.0, GGUFValueType.FLOAT32),
        "dflash.rope.scaling.type": ("yarn", GGUFValueType.STRING),
        "dflash.rope.scaling.factor": (4.0, GGUFValueType.FLOAT32),
        "dflash.rope.scaling.original_context_length": (64, GGUFValueType.UINT32),
        "dflash.rope.scaling.yarn_log_multiplier": (1.0, GGUFValueType.FLOAT32),
        "dflash.target_layers": (taps, GGUFValueType.ARRAY),
        "dflash.sample_from_anchor": (True, GGUFValueType.BOOL),
        "dflash.has_confidence_head": (True, GGUFValueType.BOOL),
    }
    if block_size is not None:
        kv["dflash.block_size"] = (block_size, GGUFValueType.UINT32)
    kv.update(extra_keys or {})
    for k, (v, t) in kv.items():
        if k not in omit_keys:
            w.add_key_value(k, v, t, sub_type=GGUFValueType.INT32 if t == GGUFValueType.ARRAY else None)
    _tokenizer(w, d["n_vocab"], None if mask is None else (d["n_vocab"] + mask if mask < 0 else mask))
    tensors: dict[str, np.ndarray] = {}
    if keep_embd:
        tensors["token_embd.weight"] = embd if embd is not None else _rand(rng, d["n_vocab"], e)
    tensors.update({
        "fc.weight": _rand(rng, e, fc_taps * e),
        "enc.output_norm.weight": np.ones(e, np.float32),
        "output_norm.weight": np.ones(e, np.float32),
        "markov_w1.weight": _rand(rng, d["n_vocab"], d["rank"]),
        "markov_w2.weight": _rand(rng, d["n_vocab"], d["rank"]),
        "conf_proj.weight": _rand(rng, 1, e + d["rank"]),
        "conf_proj.bias": np.zeros(1, np.float32),
    })
    for i in range(d["n_layer"]):
        p = f"blk.{i}."
        tensors.update({
            p + "attn_norm.weight": np.ones(e, np.float32),
            p + "attn_q_a.weight": _rand(rng, d["q_lora"], e),
            p + "attn_q_a_norm.weight": np.ones(d["q_lora"], np.float32),
            p + "attn_q_b.weight": _rand(rng, H * k_mla, d["q_lora"]),
            p + "attn_kv_a_mqa.weight": _rand(rng, d["kv_lora"] + d["rope"], e),
            p + "attn_kv_a_norm.weight": np.ones(d["kv_lora"], np.float32),
            p + "attn_k_b.weight": _rand(rng, H, d["kv_lora"], d["nope"]),
            p + "attn_v_b.weight": _rand(rng, H, d["v"], d["kv_lora"]),
            p + "attn_output.weight": _rand(rng, e, H * d["v"]),
            p + "ffn_norm.weight": np.ones(e, np.float32),
            p + "ffn_gate.weight": _rand(rng, d["n_ff"], e),
            p + "ffn_up.weight": _rand(rng, d["n_ff"], e),
            p + "ffn_down.weight": _rand(rng, e, d["n_ff"]),
        })
    tensors.update(extra_tensors or {})
    for name, arr in tensors.items():
        if name not in omit_tensors:
            w.add_tensor(name, arr)
    _finish(w)
    return path


def write_seed_card_file(path: Path) -> Path:
    """The seed card's file scaled down: 72 tensors, target_layers [3..9], fc for 5 taps, no token_embd."""
    return write_mla_draft(path, target_layers=[3, 4, 5, 6, 7, 8, 9], fc_taps=5, n_layer=5)


def write_qwen3_draft(path: Path, *, n_layer: int = 2, seed: int = 1, keep_embd: bool = False) -> Path:
    d = TINY
    e, H, hd = d["n_embd"], d["n_head"], 8
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "dflash")
    for k, v in {"context_length": 4096, "embedding_length": e, "block_count": n_layer,
                 "feed_forward_length": d["n_ff"],
                 "attention.head_count": H, "attention.head_count_kv": 2, "attention.key_length": hd,
                 "attention.value_length": hd, "block_size": 7}.items():
        w.add_uint32(f"dflash.{k}", v)
    w.add_float32("dflash.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32("dflash.rope.freq_base", 1e6)
    w.add_key_value("dflash.target_layers", [8, 24, 52], GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
    _tokenizer(w, d["n_vocab"], d["n_vocab"] - 2)
    tensors = {"fc.weight": _rand(rng, e, 3 * e), "enc.output_norm.weight": np.ones(e, np.float32),
               "output_norm.weight": np.ones(e, np.float32),
               "markov_w1.weight": _rand(rng, d["n_vocab"], d["rank"]),
               "markov_w2.weight": _rand(rng, d["n_vocab"], d["rank"])}
    if keep_embd:
        tensors["token_embd.weight"] = _rand(rng, d["n_vocab"], e)
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors.update({
            p + "attn_norm.weight": np.ones(e, np.float32),
            p + "attn_q.weight": _rand(rng, H * hd, e),
            p + "attn_k.weight": _rand(rng, 2 * hd, e),
            p + "attn_v.weight": _rand(rng, 2 * hd, e),
            p + "attn_output.weight": _rand(rng, e, H * hd),
            p + "attn_q_norm.weight": np.ones(hd, np.float32),
            p + "attn_k_norm.weight": np.ones(hd, np.float32),
            p + "ffn_norm.weight": np.ones(e, np.float32),
            p + "ffn_gate.weight": _rand(rng, d["n_ff"], e),
            p + "ffn_up.weight": _rand(rng, d["n_ff"], e),
            p + "ffn_down.weight": _rand(rng, e, d["n_ff"]),
        })
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    _finish(w)
    return path


def write_plain_model(path: Path) -> Path:
    """A non-draft GGUF (a tiny llama)."""
    rng = np.random.default_rng(2)
    w = GGUFWriter(str(path), "llama")
    w.add_uint32("llama.embedding_length", 16)
    w.add_uint32("llama.block_count", 1)
    _tokenizer(w, 32, None)
    w.add_tensor("token_embd.weight", _rand(rng, 32, 16))
    w.add_tensor("blk.0.attn_q.weight", _rand(rng, 16, 16))
    _finish(w)
    return path


def write_target(path: Path, *, n_layer: int = 24, n_embd: int = 32, n_vocab: int = 64,
                 embd: np.ndarray | None = None, mask: int | None = None, seed: int = 3) -> Path:
    """A stand-in Kimi-K3 target: the header keys doctor compares plus token_embd."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "kimi-k3")
    w.add_uint32("kimi-k3.embedding_length", n_embd)
    w.add_uint32("kimi-k3.block_count", n_layer)
    _tokenizer(w, n_vocab, mask)
    w.add_tensor("token_embd.weight", embd if embd is not None else _rand(rng, n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    _finish(w)
    return path


def _finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_real_size_seed_header(path: Path, target_layers: list[int] | None = None) -> Path:
    """The seed card's file at its REAL size (72 tensors, BF16 matrices, F32 vectors, 163840 tokens,
    ~4.78 GB), as a
    sparse file: the header is real, the tensor data is a hole. Only doctor's header path
    may read it in a fast test."""
    import struct

    from llamacpp_mla_port.gguf.header import encode_kv
    e, H, ql, kl, nope, rope, v, ff, nv, rank = 7168, 64, 1536, 512, 128, 64, 128, 14336, 163840, 256
    U, F, S, A = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.STRING, GGUFValueType.ARRAY
    kvs = [encode_kv("general.architecture", S, "dflash")]
    for k, val, t in [("context_length", 1048576, U), ("embedding_length", e, U), ("block_count", 5, U),
                      ("feed_forward_length", ff, U), ("attention.layer_norm_rms_epsilon", 1e-5, F),
                      ("attention.head_count", H, U), ("attention.head_count_kv", 1, U),
                      ("attention.key_length", kl + rope, U), ("attention.value_length", kl, U),
                      ("attention.key_length_mla", nope + rope, U), ("attention.value_length_mla", v, U),
                      ("attention.q_lora_rank", ql, U), ("attention.kv_lora_rank", kl, U),
                      ("rope.dimension_count", rope, U), ("rope.freq_base", 50000.0, F),
                      ("rope.scaling.type", "yarn", S), ("rope.scaling.factor", 32.0, F),
                      ("rope.scaling.original_context_length", 32768, U),
                      ("rope.scaling.yarn_log_multiplier", 1.0, F), ("block_size", 7, U)]:
        kvs.append(encode_kv(f"dflash.{k}", t, val))
    kvs.append(encode_kv("dflash.target_layers", A, target_layers or [3, 4, 5, 6, 7, 8, 9], GGUFValueType.INT32))
    kvs.append(encode_kv("tokenizer.ggml.model", S, "gpt2"))
    kvs.append(encode_kv("tokenizer.ggml.pre", S, "kimi-k2"))     # Kimi's BPE goes without merges
    kvs.append(encode_kv("tokenizer.ggml.tokens", A, [f"<|tok_{i}|>" for i in range(nv)], S))
    kvs.append(encode_kv("tokenizer.ggml.mask_token_id", U, 163837))
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (5 * e, e), "enc.output_norm.weight": (e,), "output_norm.weight": (e,),
        "markov_w1.weight": (rank, nv), "markov_w2.weight": (rank, nv),
        "conf_proj.weight": (e + rank, 1), "conf_proj.bias": (1,)}
    for i in range(5):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (e,), p + "attn_q_a.weight": (e, ql),
                       p + "attn_q_a_norm.weight": (ql,), p + "attn_q_b.weight": (ql, H * (nope + rope)),
                       p + "attn_kv_a_mqa.weight": (e, kl + rope), p + "attn_kv_a_norm.weight": (kl,),
                       p + "attn_k_b.weight": (nope, kl, H), p + "attn_v_b.weight": (kl, v, H),
                       p + "attn_output.weight": (H * v, e), p + "ffn_norm.weight": (e,),
                       p + "ffn_gate.weight": (e, ff), p + "ffn_up.weight": (e, ff), p + "ffn_down.weight": (ff, e)})
    infos, off = [], 0
    for name, shape in shapes.items():
        nb = name.encode()
        ggml_type = 0 if len(shape) == 1 else 30       # F32 vectors, BF16 matrices
        infos.append(struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(shape))
                     + b"".join(struct.pack("<Q", d) for d in shape) + struct.pack("<IQ", ggml_type, off))
        n = 4 if len(shape) == 1 else 2   # converters keep vectors F32, the matrices are BF16
        for d in shape:
            n *= d
        off += n + (-n % 32)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(kvs)) + b"".join(kvs) + b"".join(infos)
    head += b"\0" * (-len(head) % 32)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + off)
    return path
