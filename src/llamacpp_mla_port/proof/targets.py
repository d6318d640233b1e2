"""A deeper tiny Kimi-K3 target, derived from llama.cpp's own 2-layer test model.

fixtures.target writes `test-llama-archs -a kimi-k3`'s model: layer 0 is MLA + dense FFN,
layer 1 is KDA + latent MoE, attention-residual blocks of 12. With two layers every tap
sits in the first residual block, so neither the block-local restart of the "prefix"
stream nor taps in several blocks would be exercised. This writes the same model with N
layers whose types follow a pattern ("M" = the MLA attention of layer 0, "K" = the KDA
attention of layer 1; layers >= 1 take layer 1's MoE FFN, layer 0 stays dense) and a
small residual block size, so the prefix stream restarts inside the model.

    write_deep_kimi_k3_target(base_gguf, out_path, layer_types="MKKMKK", attn_res_block_size=2) -> Path
    target_with_layers(base_gguf, out_dir, n_layer) -> Path
        the base when it has n_layer layers or more, else a deeper copy ("M" then "K"s): a draft
        context is paired with its target when it is created, so every tap must be a layer the
        target exposes, even where the target only lends its embeddings and lm_head

Every tensor is a verbatim copy of a base tensor (the layers differ by their inputs only);
per-layer metadata arrays (head counts, recurrent flags, clamps) are rebuilt for N layers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llamacpp_mla_port.errors import GGUFError

ARCH = "kimi-k3"


def _is_ffn(name: str) -> bool:
    return name.startswith(("ffn_", "exp_probs_b")) and not name.startswith("ffn_res_score")


def target_with_layers(base_gguf: Path, out_dir: Path, n_layer: int) -> Path:
    from llamacpp_mla_port.fixtures.target import kimi_k3_target_n_layer

    if n_layer <= kimi_k3_target_n_layer:
        return Path(base_gguf)
    return write_deep_kimi_k3_target(base_gguf, Path(out_dir) / f"kimi-k3-{n_layer}-layers.gguf",
                                     "M" + "K" * (n_layer - 1))


def write_deep_kimi_k3_target(base_gguf: Path, out_path: Path, layer_types: str = "MKKMKK",
                              attn_res_block_size: int = 2) -> Path:
    import gguf
    from gguf import GGUFReader, GGUFValueType as T

    out_path = Path(out_path)
    if out_path.is_file() and out_path.stat().st_size > 0:
        return out_path
    if not layer_types or layer_types[0] != "M" or set(layer_types) - {"M", "K"}:
        raise GGUFError(f"layer_types {layer_types!r}: use M/K letters, starting with M (the dense MLA layer 0)")
    reader = GGUFReader(str(base_gguf))
    if reader.fields["general.architecture"].contents() != ARCH:
        raise GGUFError(f"{base_gguf} is not a {ARCH} model")
    n_base = int(reader.fields[f"{ARCH}.block_count"].contents())
    if n_base != 2 or list(reader.fields[f"{ARCH}.attention.head_count_kv"].contents()) != [1, 0]:
        raise GGUFError(f"{base_gguf}: expected test-llama-archs' 2-layer kimi-k3 (MLA, then KDA)")

    tensors = {t.name: t for t in reader.tensors}
    blk = {i: {n[len(f"blk.{i}."):]: t for n, t in tensors.items() if n.startswith(f"blk.{i}.")} for i in (0, 1)}
    n_layer = len(layer_types)

    per_layer = {
        f"{ARCH}.attention.head_count": lambda ty: 1 if ty == "M" else 0,
        f"{ARCH}.attention.head_count_kv": lambda ty: 1 if ty == "M" else 0,
        f"{ARCH}.attention.recurrent_layers": lambda ty: 0 if ty == "M" else 1,
        f"{ARCH}.swiglu_clamp_exp": lambda ty: 0.0,
        f"{ARCH}.swiglu_clamp_shexp": lambda ty: 0.0,
    }

    tmp = out_path.with_name(out_path.name + ".tmp")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(tmp), arch=ARCH)

    def edit(name: str, value, vtype):
        if name == f"{ARCH}.block_count":
            return n_layer
        if name == f"{ARCH}.attn_res.block_size":
            return attn_res_block_size
        if name in per_layer:
            return [per_layer[name](ty) for ty in layer_types]
        if vtype == T.ARRAY and isinstance(value, list) and len(value) == n_base and name.startswith(ARCH):
            raise GGUFError(f"{base_gguf}: per-layer key {name} is not handled; extend targets.per_layer")
        return value

    _copy_keys(reader, writer, edit)

    def add(name: str, t) -> None:
        # ggml ne [a, b, ...] is numpy shape reversed; t.data is already laid out that way
        writer.add_tensor(name, np.ascontiguousarray(t.data), raw_shape=tuple(int(x) for x in reversed(t.shape)),
                          raw_dtype=t.tensor_type)

    for name, t in tensors.items():
        if not name.startswith("blk."):
            add(name, t)
    for il, ty in enumerate(layer_types):
        attn_src = blk[0] if ty == "M" else blk[1]
        ffn_src = blk[0] if il == 0 else blk[1]
        for sub, t in attn_src.items():
            if not _is_ffn(sub):
                add(f"blk.{il}.{sub}", t)
        for sub, t in ffn_src.items():
            if _is_ffn(sub):
                add(f"blk.{il}.{sub}", t)
    return _finish(writer, tmp, out_path)


# ---------------------------------------------------------------------------------------
# real width: the draft-facing parts of Kimi-K3 at n_embd 7168 and vocab 163840

#: which axes of which Kimi-K3 tensors are n_embd / n_vocab (llama_model_kimi_k3::load_arch_tensors),
#: in ggml order (ne0 first). Every other width (heads, LoRA ranks, FFN, KDA) stays the base's.
_EMBD_NE0 = ("token_embd", "output", "attn_q_a", "attn_kv_a_mqa", "attn_gate", "ffn_gate", "ffn_up", "attn_q",
             "attn_k", "attn_v", "ssm_f_a", "ssm_beta", "ssm_g", "ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp",
             "ffn_routed_down")
_EMBD_NE1 = ("attn_output", "ffn_down", "ffn_down_shexp", "ffn_routed_up")
_EMBD_VEC = ("output_norm", "output_res_score", "attn_norm", "ffn_norm", "attn_res_score", "ffn_res_score")
_VOCAB_NE1 = ("token_embd", "output")


class _RandomRows:
    """A tensor written chunk by chunk (never whole in memory): gguf's writer only needs
    .dtype, .nbytes and .tofile(fout). Values mean + std * N(0, 1), seeded per tensor; torch
    draws them (several times faster than numpy for the 2 x 1.17B values of a real-size head)."""

    def __init__(self, ne: tuple[int, ...], mean: float, std: float, seed: int, qtype,
                 chunk_elems: int = 16 * 1024 * 1024):
        from gguf import GGMLQuantizationType as Q
        self.ne, self.mean, self.std, self.seed, self.qtype = ne, mean, std, seed, qtype
        self.dtype = np.dtype(np.uint16 if qtype == Q.BF16 else np.float32)
        self.n = int(np.prod(ne))
        self.nbytes = self.n * self.dtype.itemsize
        self.rows_per_chunk = max(1, chunk_elems // ne[0])

    def tofile(self, fout) -> None:
        import torch
        from gguf import GGMLQuantizationType as Q

        gen = torch.Generator().manual_seed(self.seed)
        n_rows = self.n // self.ne[0]
        for r0 in range(0, n_rows, self.rows_per_chunk):
            rows = min(self.rows_per_chunk, n_rows - r0)
            x = torch.randn(rows, self.ne[0], generator=gen).mul_(self.std).add_(self.mean)
            if self.qtype == Q.BF16:     # round to nearest even, as ggml's fp32 -> bf16
                x.to(torch.bfloat16).view(torch.int16).numpy().tofile(fout)
            else:
                x.numpy().tofile(fout)


def _widened(name: str, ne: tuple[int, ...], old_embd: int, n_embd: int, n_vocab: int) -> tuple[int, ...]:
    stem = name.rsplit(".", 1)[0].split(".")[-1] if name.startswith("blk.") else name.split(".")[0]
    ne = list(ne)
    if stem in _EMBD_VEC and name.endswith(".weight"):
        if ne[0] != old_embd:
            raise GGUFError(f"{name}: expected {old_embd} wide, got {ne}")
        ne[0] = n_embd
    if stem in _EMBD_NE0 and name.endswith(".weight"):
        if ne[0] != old_embd:
            raise GGUFError(f"{name}: expected ne0 = n_embd {old_embd}, got {ne}")
        ne[0] = n_embd
    if stem in _EMBD_NE1 and name.endswith(".weight"):
        if len(ne) < 2 or ne[1] != old_embd:
            raise GGUFError(f"{name}: expected ne1 = n_embd {old_embd}, got {ne}")
        ne[1] = n_embd
    if stem in _VOCAB_NE1:
        ne[1] = n_vocab
    return tuple(ne)


def write_wide_kimi_k3_target(base_gguf: Path, out_path: Path, n_embd: int = 7168, n_vocab: int = 163840,
                              seed: int = 0, head_type: str = "bf16") -> Path:
    """A Kimi-K3 GGUF like base_gguf (e.g. write_deep_kimi_k3_target's) at another n_embd and vocab.

    Every tensor with an n_embd or vocab axis is regenerated at the new size (seeded normal
    values with the base tensor's mean and std; a fan-in that grows scales the std by
    sqrt(old / new) so activations keep their size), written chunk by chunk so the 2 x 1.17B
    token_embd/output never sit in memory; the other tensors are copied verbatim. The
    token_embd and output go in `head_type` (bf16 like a converted checkpoint, or f32),
    the rest stays F32. The TEST tokenizer gets `n_vocab` tokens (ids print as hex).
    """
    import gguf
    from gguf import GGMLQuantizationType as Q, GGUFReader

    out_path = Path(out_path)
    if out_path.is_file() and out_path.stat().st_size > 0:
        return out_path
    head_qtype = {"bf16": Q.BF16, "f32": Q.F32}.get(head_type)
    if head_qtype is None:
        raise GGUFError(f"head_type {head_type!r}: use bf16 or f32")
    reader = GGUFReader(str(base_gguf))
    if reader.fields["general.architecture"].contents() != ARCH:
        raise GGUFError(f"{base_gguf} is not a {ARCH} model")
    old_embd = int(reader.fields[f"{ARCH}.embedding_length"].contents())
    old_vocab = int(reader.fields[f"{ARCH}.vocab_size"].contents())

    tmp = out_path.with_name(out_path.name + ".tmp")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(tmp), arch=ARCH)

    def edit(name: str, value, vtype):
        if name == f"{ARCH}.embedding_length":
            return n_embd
        if name == f"{ARCH}.vocab_size":
            return n_vocab
        if name == "tokenizer.ggml.tokens":
            return [f"tok_{i}" for i in range(n_vocab)]
        if name in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            if len(value) != old_vocab:
                raise GGUFError(f"{base_gguf}: {name} has {len(value)} entries, vocab is {old_vocab}")
            return [value[0]] * n_vocab
        return value

    _copy_keys(reader, writer, edit)

    for idx, t in enumerate(reader.tensors):
        ne = tuple(int(x) for x in t.shape)
        new_ne = _widened(t.name, ne, old_embd, n_embd, n_vocab)
        if new_ne == ne:
            writer.add_tensor(t.name, np.ascontiguousarray(t.data), raw_shape=tuple(reversed(ne)),
                              raw_dtype=t.tensor_type)
            continue
        if t.tensor_type != Q.F32:
            raise GGUFError(f"{base_gguf}: {t.name} is {t.tensor_type.name}; widening expects F32 tensors")
        data = np.asarray(t.data, dtype=np.float32)
        std = float(data.std())
        if new_ne[0] != ne[0] and t.name.split(".")[0] not in ("token_embd",) and len(ne) > 1:
            std *= (ne[0] / new_ne[0]) ** 0.5          # ne0 is the fan-in of a ggml weight
        qtype = head_qtype if t.name.split(".")[0] in _VOCAB_NE1 else Q.F32
        rows = _RandomRows(new_ne, float(data.mean()), std, seed * 1_000_003 + idx, qtype)
        writer.add_tensor(t.name, rows, raw_shape=tuple(reversed(new_ne)), raw_dtype=qtype)  # type: ignore[arg-type]
    return _finish(writer, tmp, out_path)


def _copy_keys(reader, writer, edit) -> None:
    """Every key of `reader` but GGUF.* and the architecture into `writer`, each value through
    edit(name, value, vtype); empty arrays are dropped (gguf cannot write their element type)."""
    from gguf import GGUFValueType as T

    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == T.ARRAY else None
        value = edit(name, field.contents(), vtype)
        if vtype == T.ARRAY and len(value) == 0:
            continue
        writer.add_key_value(name, value, vtype, sub_type)


def _finish(writer, tmp: Path, out_path: Path) -> Path:
    """Write the file next to its destination, then move it into place (no half-written GGUF)."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out_path)
    return out_path
