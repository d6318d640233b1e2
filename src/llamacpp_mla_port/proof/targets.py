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
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == T.ARRAY else None
        value = field.contents()
        if name == f"{ARCH}.block_count":
            value = n_layer
        elif name == f"{ARCH}.attn_res.block_size":
            value = attn_res_block_size
        elif name in per_layer:
            value = [per_layer[name](ty) for ty in layer_types]
        elif vtype == T.ARRAY and isinstance(value, list) and len(value) == n_base and name.startswith(ARCH):
            raise GGUFError(f"{base_gguf}: per-layer key {name} is not handled; extend targets.per_layer")
        if vtype == T.ARRAY and len(value) == 0:
            continue
        writer.add_key_value(name, value, vtype, sub_type)

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
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out_path)
    return out_path
