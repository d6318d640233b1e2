"""The series' converter (templates/series/30-convert-k3-dspark) on random K3DSparkModel checkpoints.

Every test runs the PATCHED tree's own convert_hf_to_gguf.py (the `patched_tree` fixture;
MLA_PORT_TREE points it at a development tree) with the tree's gguf-py, and reads the GGUF
back with the PyPI gguf reader by explicit key and tensor names. The expected names,
shapes and values are those of docs/spec/draft-model.md and the GGUF contract
(scratch notes gguf-contract.md): 7 global + 13 per layer tensors, kv_b split per head.

--target-model-dir is satisfied offline by fixtures.checkpoint.write_target_tokenizer_dir:
a Llama-style target directory whose SentencePiece tokenizer.model is trained here.

One owner per check: the converter refuses only what never reaches the GGUF (a YaRN mscale,
an attn_res tap stream, mla_use_nope, an output gate); missing and misshaped tensors are the
loader's to refuse (the `build` tests here show it), unknown ones map_tensor_name's. The series'
DeepseekV2Model refactor is shown harmless: DeepSeek-V2-Lite- and Kimi-K2-shaped checkpoints
convert byte-identically with the base's converter and the patched one.

The real-size run is marked `slow` (`make test-slow`): ~7 GB of checkpoint on disk.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader, GGMLQuantizationType
from safetensors.torch import load_file, save_file

from llamacpp_mla_port.errors import ConversionError
from llamacpp_mla_port.fixtures.checkpoint import (
    K3_DSPARK_REAL_CONFIG,
    k3_dspark_config,
    k3_dspark_tensor_shapes,
    write_k3_dspark_checkpoint,
    write_k3_dspark_checkpoint_streaming,
    write_target_tokenizer_dir,
)
from llamacpp_mla_port.proof.run.convert import convert_checkpoint, run_converter

REPO = Path(__file__).resolve().parents[2]

# two tiny shapes: the fixture default, and one with other head dims, 3 layers, 5 taps
SHAPES = {
    "default": {},
    "wide": dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=2,
                 q_lora_rank=40, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=4, v_head_dim=12,
                 vocab_size=160, markov_rank=6, target_num_hidden_layers=12, target_layer_ids=[0, 2, 5, 8, 10]),
}

GLOBAL_NAMES = {  # GGUF name -> checkpoint name
    "fc.weight": "context_proj.weight",
    "enc.output_norm.weight": "context_norm.weight",
    "output_norm.weight": "final_norm.weight",
    "markov_w1.weight": "markov_head.markov_w1.weight",
    "markov_w2.weight": "markov_head.markov_w2.weight",
    "conf_proj.weight": "confidence_head.proj.weight",
    "conf_proj.bias": "confidence_head.proj.bias",
}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def expected_tensors(cfg: dict) -> dict[str, tuple[int, ...]]:
    """GGUF name -> numpy shape, from the config alone."""
    n_head = cfg["num_attention_heads"]
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    ckpt = k3_dspark_tensor_shapes(cfg, keep_embeddings=True)
    out = {g: ckpt[c] for g, c in GLOBAL_NAMES.items()}
    for il in range(cfg["num_hidden_layers"]):
        out.update({f"blk.{il}.{g}": ckpt[f"layers.{il}.{c}"] for g, c in LAYER_NAMES.items()})
        out[f"blk.{il}.attn_k_b.weight"] = (n_head, cfg["kv_lora_rank"], nope)
        out[f"blk.{il}.attn_v_b.weight"] = (n_head, v, cfg["kv_lora_rank"])
    return out


def field(reader: GGUFReader, key: str):
    f = reader.get_field(key)
    assert f is not None, f"GGUF lacks {key}"
    return f.contents()


def tensors_of(reader: GGUFReader) -> dict:
    return {t.name: t for t in reader.tensors}


def as_f32(t, shape: tuple[int, ...]) -> np.ndarray:
    """A read-back tensor as float32 in numpy shape (BF16 widened bit-exactly)."""
    data = np.asarray(t.data)
    if t.tensor_type == GGMLQuantizationType.BF16:
        data = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return data.astype(np.float32).reshape(shape)


def np_shape(t) -> tuple[int, ...]:
    return tuple(int(x) for x in reversed(t.shape.tolist()))


@pytest.fixture(scope="module")
def tree(patched_tree) -> Path:
    assert (patched_tree / "convert_hf_to_gguf.py").is_file()
    return patched_tree


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Memoised (checkpoint dir, target dir) per (shape, dtype)."""
    root = tmp_path_factory.mktemp("k3ckpt")
    cache: dict = {}

    def make(shape: str = "default", dtype: str = "float32", **overrides):
        key = (shape, dtype, json.dumps(overrides, sort_keys=True))
        if key not in cache:
            cfg = k3_dspark_config(**{**SHAPES[shape], "torch_dtype": dtype, **overrides})
            d = root / f"{shape}-{dtype}-{len(cache)}"
            write_k3_dspark_checkpoint(d / "ckpt", cfg, seed=len(cache) + 1, dtype=dtype)
            write_target_tokenizer_dir(d / "target", cfg)
            cache[key] = (cfg, d / "ckpt", d / "target")
        return cache[key]
    return make


def convert(tree: Path, ckpt: Path, target: Path, out: Path, *args: str) -> GGUFReader:
    convert_checkpoint(tree, ckpt, out, target, extra_args=args)
    return GGUFReader(out)


# ---------------------------------------------------------------------------------------
# the happy path: names, shapes, dtypes, metadata, values
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dtype,outtype", [("default", "float32", "f32"), ("wide", "bfloat16", "bf16")])
def test_tiny_checkpoint_converts_to_the_contract(tree, made, tmp_path, shape, dtype, outtype):
    cfg, ckpt, target = made(shape, dtype)
    r = convert(tree, ckpt, target, tmp_path / "d.gguf", "--outtype", outtype)
    got = tensors_of(r)
    want = expected_tensors(cfg)

    assert sorted(got) == sorted(want)
    assert len(got) == 7 + 13 * cfg["num_hidden_layers"]
    for name, shape_ in want.items():
        assert np_shape(got[name]) == shape_, name
        one_d = len(shape_) == 1 or name.endswith("_norm.weight") or name.endswith(".bias")
        wanted = GGMLQuantizationType.F32 if one_d or outtype == "f32" else GGMLQuantizationType.BF16
        assert got[name].tensor_type == wanted, name
    assert "output.weight" not in got and "token_embd.weight" not in got

    kv_lora, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    rp = cfg["rope_parameters"]
    expect = {
        "general.architecture": "dflash",
        "dflash.block_count": cfg["num_hidden_layers"],
        "dflash.context_length": cfg["max_position_embeddings"],
        "dflash.embedding_length": cfg["hidden_size"],
        "dflash.feed_forward_length": cfg["intermediate_size"],
        "dflash.attention.head_count": cfg["num_attention_heads"],
        "dflash.attention.head_count_kv": 1,
        "dflash.attention.key_length": kv_lora + rope,
        "dflash.attention.value_length": kv_lora,
        "dflash.attention.key_length_mla": cfg["qk_nope_head_dim"] + rope,
        "dflash.attention.value_length_mla": cfg["v_head_dim"],
        "dflash.attention.q_lora_rank": cfg["q_lora_rank"],
        "dflash.attention.kv_lora_rank": kv_lora,
        "dflash.rope.dimension_count": rope,
        "dflash.rope.freq_base": rp["rope_theta"],
        "dflash.rope.scaling.type": "yarn",
        "dflash.rope.scaling.factor": rp["factor"],
        "dflash.rope.scaling.original_context_length": rp["original_max_position_embeddings"],
        "dflash.rope.scaling.yarn_beta_fast": rp["beta_fast"],
        "dflash.rope.scaling.yarn_beta_slow": rp["beta_slow"],
        "dflash.rope.scaling.yarn_log_multiplier": rp["mscale_all_dim"],
        "dflash.target_layers": [i + 1 for i in cfg["target_layer_ids"]],
        "dflash.block_size": 7,
        "dflash.sample_from_anchor": True,
        "dflash.has_confidence_head": True,
        "tokenizer.ggml.mask_token_id": cfg["mask_token_id"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    for key, value in expect.items():
        got_v = field(r, key)
        if isinstance(value, float):
            assert got_v == pytest.approx(value, rel=1e-6), key
        else:
            assert got_v == value, key
    # the runtime computes the scale; a written one would have to agree with it
    assert r.get_field("dflash.attention.scale") is None
    assert r.get_field("dflash.hidden_activation") is None

    # the tokenizer comes from the target directory, padded to the draft's vocab
    tokens = field(r, "tokenizer.ggml.tokens")
    assert len(tokens) == cfg["vocab_size"]
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert field(r, "tokenizer.ggml.model") == "llama"

    # values: every mapped tensor is the checkpoint's, unchanged
    src = load_file(ckpt / "model.safetensors")
    for gname, cname in GLOBAL_NAMES.items():
        assert np.array_equal(as_f32(got[gname], want[gname]), src[cname].float().numpy()), gname
    for il in range(cfg["num_hidden_layers"]):
        for gname, cname in LAYER_NAMES.items():
            g = f"blk.{il}.{gname}"
            assert np.array_equal(as_f32(got[g], want[g]), src[f"layers.{il}.{cname}"].float().numpy()), g


def test_kv_b_split_is_per_head_and_absorbs_exactly(tree, made, tmp_path):
    cfg, ckpt, target = made("wide")
    r = convert(tree, ckpt, target, tmp_path / "d.gguf", "--outtype", "f32")
    got = tensors_of(r)
    src = load_file(ckpt / "model.safetensors")
    n_head, nope, v, kv_lora = (cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank"))
    rng = np.random.default_rng(0)
    for il in range(cfg["num_hidden_layers"]):
        kv_b = src[f"layers.{il}.self_attn.kv_b_proj.weight"].numpy().astype(np.float64)
        k_b = np.asarray(got[f"blk.{il}.attn_k_b.weight"].data, dtype=np.float64).reshape(n_head, kv_lora, nope)
        v_b = np.asarray(got[f"blk.{il}.attn_v_b.weight"].data, dtype=np.float64).reshape(n_head, v, kv_lora)
        for h in range(n_head):
            rows = kv_b[h * (nope + v):(h + 1) * (nope + v)]
            assert np.array_equal(k_b[h], rows[:nope].T)
            assert np.array_equal(v_b[h], rows[nope:])
        # absorbed attention == decompressed attention, for a random query and latent row
        q_nope = rng.standard_normal((n_head, nope))
        latent = rng.standard_normal(kv_lora)
        decompressed = kv_b.reshape(n_head, nope + v, kv_lora) @ latent      # per head [k_nope | v]
        scores_ref = np.einsum("hd,hd->h", q_nope, decompressed[:, :nope])
        scores_abs = np.einsum("hkd,hd->hk", k_b, q_nope) @ latent
        np.testing.assert_allclose(scores_abs, scores_ref, rtol=1e-12)
        np.testing.assert_allclose(v_b @ latent, decompressed[:, nope:], rtol=1e-12)


@pytest.mark.slow
def test_gguf_dump_of_the_tree_reads_the_file(tree, made, tmp_path):
    cfg, ckpt, target = made()
    out = convert_checkpoint(tree, ckpt, tmp_path / "d.gguf", target)
    res = subprocess.run([sys.executable, str(tree / "gguf-py/gguf/scripts/gguf_dump.py"), str(out)],
                         env={"PYTHONPATH": str(tree / "gguf-py"), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "dflash.attention.key_length_mla" in res.stdout
    assert "blk.1.attn_k_b.weight" in res.stdout and "blk.1.attn_v_b.weight" in res.stdout
    assert f"Dumping {7 + 13 * cfg['num_hidden_layers']} tensor(s)" in res.stdout


# ---------------------------------------------------------------------------------------
# no options of its own: embeddings, block size from the checkpoint; rope variants
# ---------------------------------------------------------------------------------------

def test_the_series_adds_no_converter_flags_no_modelbase_state_and_no_mla_exception_in_the_tying():
    """Upstream's code-review skill rejects per-model converter flags and per-model state on
    ModelBase; the shared output tying keeps the base's code (no `!is_mla()`)."""
    from llamacpp_mla_port.series.gitseries import read_series
    import unidiff
    added: dict[str, list[str]] = {}
    for patch in read_series(REPO / "patches"):
        for f in unidiff.PatchSet(patch.read_text()):
            added.setdefault(f.path, []).extend(line.value for h in f for line in h if line.is_added)
    assert "convert_hf_to_gguf.py" not in added and "conversion/base.py" not in added, sorted(added)
    assert not any("add_argument" in ln for lines in added.values() for ln in lines)
    assert not any("is_mla()" in ln and "tok_embd" in ln for ln in added.get("src/models/dflash.cpp", []))
    # the control: the series does add to the converter, in the model classes
    assert any("class K3DSparkModel" in ln for ln in added["conversion/deepseek.py"])


@pytest.mark.slow      # with the table, the contract test already sees it dropped
def test_embed_tokens_is_dropped_whether_or_not_the_checkpoint_has_it(tree, tmp_path):
    cfg = k3_dspark_config()
    names = {}
    for keep in (True, False):
        ckpt = write_k3_dspark_checkpoint(tmp_path / f"ckpt-{keep}", cfg, keep_embeddings=keep)
        assert ("embed_tokens.weight" in load_file(ckpt / "model.safetensors")) == keep
        target = write_target_tokenizer_dir(tmp_path / f"target-{keep}", cfg)
        names[keep] = sorted(tensors_of(convert(tree, ckpt, target, tmp_path / f"d-{keep}.gguf")))
    assert names[True] == names[False] == sorted(expected_tensors(cfg))
    assert "token_embd.weight" not in names[True] and "output.weight" not in names[True]


@pytest.mark.parametrize("flag", [("--draft-block-size", "9"),
                                  pytest.param(("--keep-draft-embeddings",), marks=pytest.mark.slow)])
def test_the_removed_flags_are_unknown_to_the_converter(tree, made, tmp_path, flag):
    _, ckpt, target = made()
    with pytest.raises(ConversionError, match="unrecognized arguments"):
        convert_checkpoint(tree, ckpt, tmp_path / "d.gguf", target, extra_args=list(flag))


def test_yarn_log_multiplier_is_mscale_all_dim_verbatim(tree, made, tmp_path):
    cfg, ckpt, target = made(rope_parameters={"mscale_all_dim": 0.707, "factor": 8.0})
    r = convert(tree, ckpt, target, tmp_path / "d.gguf")
    assert field(r, "dflash.rope.scaling.yarn_log_multiplier") == pytest.approx(0.707, rel=1e-6)
    assert field(r, "dflash.rope.scaling.factor") == pytest.approx(8.0)


def test_config_without_yarn_writes_rope_scaling_none(tree, made, tmp_path):
    _, ckpt, target = made(rope_parameters=None)
    r = convert(tree, ckpt, target, tmp_path / "d.gguf")
    assert field(r, "dflash.rope.scaling.type") == "none"
    assert r.get_field("dflash.rope.scaling.yarn_log_multiplier") is None
    assert r.get_field("dflash.rope.scaling.factor") is None


def test_yarn_mscale_other_than_one_is_rejected(tree, made, tmp_path):
    _, ckpt, target = made(rope_parameters={"mscale": 0.707})
    with pytest.raises(ConversionError, match="mscale"):
        convert_checkpoint(tree, ckpt, tmp_path / "d.gguf", target)
    assert not (tmp_path / "d.gguf").exists()


def test_missing_target_model_dir_is_an_error(tree, made, tmp_path):
    _, ckpt, _ = made()
    with pytest.raises(ConversionError, match="target-model-dir"):
        convert_checkpoint(tree, ckpt, tmp_path / "d.gguf", None)


# ---------------------------------------------------------------------------------------
# errors: unknown / missing / misshaped tensors, inconsistent config, other variants
# ---------------------------------------------------------------------------------------

def _edited_checkpoint(tmp_path: Path, cfg_overrides: dict | None = None, add: dict | None = None,
                       drop: tuple[str, ...] = (), config_edit: dict | None = None):
    cfg = k3_dspark_config(**(cfg_overrides or {}))
    ckpt = write_k3_dspark_checkpoint(tmp_path / "ckpt", cfg)
    target = write_target_tokenizer_dir(tmp_path / "target", cfg)
    if add or drop:
        tensors = load_file(ckpt / "model.safetensors")
        for name in drop:
            del tensors[name]
        tensors.update(add or {})
        save_file(tensors, str(ckpt / "model.safetensors"))
    if config_edit:
        (ckpt / "config.json").write_text(json.dumps({**cfg, **config_edit}))
    return ckpt, target


def _fails(tree: Path, ckpt: Path, target: Path, out: Path, pattern: str) -> str:
    with pytest.raises(ConversionError, match=pattern) as exc:
        convert_checkpoint(tree, ckpt, out, target)
    assert not out.exists(), "a failed conversion must not leave a file"
    return str(exc.value)


def test_unknown_tensor_stops_the_conversion_naming_it(tree, tmp_path):
    # map_tensor_name's refusal, as for every model: a per-tap norm is not a DFlash tensor
    ckpt, target = _edited_checkpoint(tmp_path, add={"context_norms.0.weight": torch.ones(64)})
    _fails(tree, ckpt, target, tmp_path / "d.gguf", r"Can not map tensor 'model\.context_norms\.0\.weight'")


def _load_refusal(build: Path, draft: Path) -> str:
    """What llama.cpp's loader says of a draft GGUF: llama-simple loads it and then needs a
    target context (ctx_other), which it lacks; a loader refusal comes before that."""
    proc = subprocess.run([str(build / "bin" / "llama-simple"), "-m", str(draft), "-n", "1", "hi"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, proc.stderr[-3000:]
    return proc.stderr


@pytest.mark.build
@pytest.mark.parametrize("drop,edit,needle", [
    pytest.param(("layers.1.mlp.up_proj.weight",), None, "tensor 'blk.1.ffn_up.weight' not found",
                 marks=pytest.mark.slow),
    ((), {"q_lora_rank": 40}, "tensor 'blk.0.attn_q_a.weight' has wrong shape"),
])
def test_the_loader_refuses_a_missing_or_misshaped_tensor_naming_it(tree, llama_build, tmp_path, drop, edit, needle):
    """The converter leaves tensor names and shapes to the loader (one owner): the file converts,
    and llama.cpp refuses it naming the tensor; the unedited checkpoint gets past the loader."""
    ckpt, target = _edited_checkpoint(tmp_path / "bad", drop=drop, config_edit=edit)
    bad = _load_refusal(llama_build, convert_checkpoint(tree, ckpt, tmp_path / "bad.gguf", target))
    assert needle in bad, bad[-3000:]
    ckpt, target = _edited_checkpoint(tmp_path / "good")
    good = _load_refusal(llama_build, convert_checkpoint(tree, ckpt, tmp_path / "good.gguf", target))
    assert "ctx_other" in good and "tensor 'blk." not in good, good[-3000:]


def test_config_inconsistent_with_the_weights_stops_the_kv_b_split(tree, tmp_path):
    # the weights have 4 heads, the config says 8: kv_b_proj cannot be split into 8 heads
    ckpt, target = _edited_checkpoint(tmp_path, config_edit={"num_attention_heads": 8, "num_key_value_heads": 8})
    _fails(tree, ckpt, target, tmp_path / "d.gguf", r"split_kv_b|kv_b")


def test_config_missing_a_required_key_is_named(tree, tmp_path):
    cfg = k3_dspark_config()
    ckpt, target = _edited_checkpoint(tmp_path)
    del cfg["q_lora_rank"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    _fails(tree, ckpt, target, tmp_path / "d.gguf", r"q_lora_rank")


@pytest.mark.parametrize("edit,pattern", [
    ({"draft_vocab_size": 64}, "draft_vocab_size 64"),
    ({"mla_use_output_gate": True}, "mla_use_output_gate"),
    ({"mla_use_nope": True}, "mla_use_nope"),
    ({"target_hidden_state": "attn_res"}, "target_hidden_state = 'attn_res' is not supported"),
])
def test_what_never_reaches_the_gguf_is_refused_naming_it(tree, tmp_path, edit, pattern):
    ckpt, target = _edited_checkpoint(tmp_path, config_edit=edit)
    msg = _fails(tree, ckpt, target, tmp_path / "d.gguf", pattern)
    assert msg.isascii() and not any(w in msg for w in ("Inferact", "RedHat", "lightseek", "RadixArk"))


def test_the_stream_the_runtime_reads_and_a_config_without_mla_are_told_apart(tree, tmp_path):
    """target_hidden_state = "prefix" names the stream the runtime hands the draft: it converts;
    a config without kv_lora_rank is not an MLA draft."""
    ckpt, target = _edited_checkpoint(tmp_path, config_edit={"target_hidden_state": "prefix"})
    assert convert_checkpoint(tree, ckpt, tmp_path / "prefix.gguf", target).is_file()
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["kv_lora_rank"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    _fails(tree, ckpt, target, tmp_path / "d.gguf", r"no kv_lora_rank, so this is not an MLA draft .*DSparkDraftModel")


_IDENTITY_DRIVER = '''
import hashlib, sys
from pathlib import Path
tree, ckpt = sys.argv[1], Path(sys.argv[2])
sys.path[:0] = [tree + "/gguf-py", tree]
import convert_hf_to_gguf
from conversion.deepseek import K3DSparkModel
# this checkpoint's own sizes and hashes stand for the published ones (the real files are 7 GB)
K3DSparkModel.published_files = {n: ((ckpt / n).stat().st_size, hashlib.sha256((ckpt / n).read_bytes()).hexdigest())
                                 for n in ("config.json", "model.safetensors")}
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
convert_hf_to_gguf.main()
'''


def test_the_published_checkpoint_is_named_from_its_hashes_and_another_is_not(tree, tmp_path):
    """Another checkpoint of the class converts and says it is not the published revision; the hash
    reader, given this checkpoint's own sizes and sha256 as the published ones, names it in the log,
    in general.source.* and in the doctor's report."""
    from llamacpp_mla_port.doctor.diagnose import diagnose
    ckpt, target = _edited_checkpoint(tmp_path)
    run = run_converter(tree, ckpt, tmp_path / "other.gguf", target)
    assert "K3DSpark: not Inferact/Kimi-K3-DSpark at revision cf6b8244" in run.stderr, run.stderr[-2000:]
    assert GGUFReader(run.out_gguf).get_field("general.source.url") is None
    report, _ = diagnose(run.out_gguf)
    assert "not named the published Inferact/Kimi-K3-DSpark revision" in json.dumps(report)
    driver, out = tmp_path / "identity.py", tmp_path / "published.gguf"
    driver.write_text(_IDENTITY_DRIVER)
    proc = subprocess.run([sys.executable, str(driver), str(tree), str(ckpt), "--outfile", str(out),
                           "--target-model-dir", str(target)], capture_output=True, text=True, timeout=600, cwd=tree,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert proc.returncode == 0 and "K3DSpark: Inferact/Kimi-K3-DSpark at revision cf6b8244620e7ea4" in proc.stderr, \
        proc.stderr[-2000:]
    rd = GGUFReader(out)
    assert field(rd, "general.source.url") == \
        "https://huggingface.co/Inferact/Kimi-K3-DSpark/tree/cf6b8244620e7ea4b0651d214f28e89eac75bed6"
    assert field(rd, "general.source.repo_url") == "https://huggingface.co/Inferact/Kimi-K3-DSpark"
    report, _ = diagnose(out)
    assert "converted from the published Inferact/Kimi-K3-DSpark, revision cf6b8244" in json.dumps(report)


def test_a_causal_config_is_written_for_the_runtime(tree, tmp_path):
    """dflash.attention.causal reaches the GGUF (upstream's DFlash converter writes it), and the
    speculative driver honours it: nothing for the converter to refuse."""
    ckpt, target = _edited_checkpoint(tmp_path, config_edit={"is_causal": True})
    assert field(GGUFReader(convert_checkpoint(tree, ckpt, tmp_path / "d.gguf", target)),
                 "dflash.attention.causal") is True


def test_a_block_size_in_the_config_is_written(tree, tmp_path):
    ckpt, target = _edited_checkpoint(tmp_path, config_edit={"block_size": 5})
    run = run_converter(tree, ckpt, tmp_path / "d.gguf", target)
    assert field(GGUFReader(run.out_gguf), "dflash.block_size") == 5
    assert "has no block_size" not in run.stderr


def test_a_config_without_a_block_size_gets_the_default_with_one_logged_line(tree, made, tmp_path):
    _, ckpt, target = made()
    run = run_converter(tree, ckpt, tmp_path / "d.gguf", target)
    assert field(GGUFReader(run.out_gguf), "dflash.block_size") == 7
    lines = [ln for ln in run.stderr.splitlines() if "has no block_size" in ln]
    assert len(lines) == 1 and "writing 7" in lines[0] and "num_speculative_tokens" in lines[0], run.stderr[-2000:]


@pytest.mark.slow      # its refusal is also the_stream test's; the rest is upstream's DSpark path
def test_qwen3_style_kimi_k3_dspark_takes_the_existing_path(tree, tmp_path):
    """A GQA draft under K3DSparkModel is refused, naming the class that converts it; under
    DSparkDraftModel it takes upstream's Qwen3 DSpark path."""
    h, n_head, n_kv, hd, n_ff, vocab, rank, n_layer = 64, 4, 2, 16, 96, 128, 8, 2
    taps = [1, 3, 6]
    cfg = {
        "architectures": ["K3DSparkModel"], "model_type": "k3_dspark", "hidden_size": h,
        "intermediate_size": n_ff, "num_hidden_layers": n_layer, "num_attention_heads": n_head,
        "num_key_value_heads": n_kv, "head_dim": hd, "vocab_size": vocab, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "rope_theta": 1e6, "target_layer_ids": taps,
        "mask_token_id": vocab - 3, "markov_rank": rank, "markov_head_type": "vanilla",
        "tie_word_embeddings": False, "torch_dtype": "float32",
    }
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return 0.02 * torch.randn(*shape, generator=g)
    t = {"fc.weight": r(h, len(taps) * h), "hidden_norm.weight": torch.ones(h), "norm.weight": torch.ones(h),
         "markov_head.markov_w1.weight": r(vocab, rank), "markov_head.markov_w2.weight": r(vocab, rank)}
    for il in range(n_layer):
        p = f"layers.{il}."
        t.update({p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
                  p + "self_attn.q_proj.weight": r(n_head * hd, h), p + "self_attn.k_proj.weight": r(n_kv * hd, h),
                  p + "self_attn.v_proj.weight": r(n_kv * hd, h), p + "self_attn.o_proj.weight": r(h, n_head * hd),
                  p + "self_attn.q_norm.weight": torch.ones(hd), p + "self_attn.k_norm.weight": torch.ones(hd),
                  p + "mlp.gate_proj.weight": r(n_ff, h), p + "mlp.up_proj.weight": r(n_ff, h),
                  p + "mlp.down_proj.weight": r(h, n_ff)})
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(cfg))
    save_file(t, str(ckpt / "model.safetensors"))
    target = write_target_tokenizer_dir(tmp_path / "target", k3_dspark_config())
    _fails(tree, ckpt, target, tmp_path / "k3.gguf", r"no kv_lora_rank, so this is not an MLA draft .*DSparkDraftModel")
    (ckpt / "config.json").write_text(json.dumps({**cfg, "architectures": ["DSparkDraftModel"]}))

    rd = convert(tree, ckpt, target, tmp_path / "d.gguf")
    names = set(tensors_of(rd))
    assert "blk.0.attn_q.weight" in names and "blk.0.attn_k_norm.weight" in names
    assert not any("attn_k_b" in n or "attn_q_a" in n for n in names)
    assert rd.get_field("dflash.attention.key_length_mla") is None
    assert field(rd, "dflash.target_layers") == [i + 1 for i in taps]


# ---------------------------------------------------------------------------------------
# real size (make test-slow)
# ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_real_size_checkpoint_converts_streaming_with_bounded_memory(tree, tmp_path):
    cfg = k3_dspark_config(**K3_DSPARK_REAL_CONFIG)
    ckpt = tmp_path / "ckpt"
    t0 = time.monotonic()
    write_k3_dspark_checkpoint_streaming(ckpt, cfg, keep_embeddings=True)     # the table is dropped
    t_write = time.monotonic() - t0
    ckpt_bytes = (ckpt / "model.safetensors").stat().st_size
    n_params = sum(math.prod(s) for s in k3_dspark_tensor_shapes(cfg, keep_embeddings=True).values())
    assert n_params == 3_562_312_961
    assert ckpt_bytes > 2 * n_params
    target = write_target_tokenizer_dir(tmp_path / "target", cfg)

    report: dict = {"checkpoint_bytes": ckpt_bytes, "write_seconds": round(t_write, 1)}
    for label, args, n_tensors in (("stripped", (), 72),):
        out = tmp_path / f"{label}.gguf"
        run = run_converter(tree, ckpt, out, target, extra_args=("--outtype", "bf16", *args))
        report[label] = {"seconds": round(run.seconds, 1), "peak_rss_bytes": run.peak_rss_bytes,
                         "gguf_bytes": out.stat().st_size}
        print(f"\nREAL-SIZE CONVERSION ({label}):", json.dumps(report[label]), flush=True)
        reader = GGUFReader(out)
        names = tensors_of(reader)
        assert len(names) == n_tensors
        assert sorted(names) == sorted(expected_tensors(cfg))
        assert np_shape(names["blk.4.attn_k_b.weight"]) == (64, 512, 128)
        assert np_shape(names["blk.4.attn_v_b.weight"]) == (64, 128, 512)
        assert np_shape(names["fc.weight"]) == (7168, 35840)
        assert field(reader, "dflash.attention.key_length") == 576
        assert field(reader, "dflash.attention.value_length") == 512
        assert field(reader, "dflash.target_layers") == [3, 24, 48, 72, 90]
        del reader, names
        out.unlink()
    print("\nREAL-SIZE CONVERSION:", json.dumps(report))
    shutil.rmtree(ckpt)
    # lazy conversion holds about one tensor at a time, staged as float32 by the upstream
    # pipeline (measured: 2.38 GB, largest tensor context_proj; the dropped table is never read)
    assert report["stripped"]["peak_rss_bytes"] < ckpt_bytes / 2, report


# ---------------------------------------------------------------------------------------
# the DeepseekV2Model refactor (add_mla_lengths, split_kv_b): every DeepSeek/Kimi conversion
# ---------------------------------------------------------------------------------------

#: config.json of DeepSeek-V2-Lite and Kimi-K2-Instruct as published, except the sizes the refactor
#: never reads, shrunk so that a conversion takes seconds: hidden, intermediate and expert sizes,
#: expert counts, vocabulary, layers (one dense, one MoE). Real: the head count, q/kv LoRA ranks,
#: nope/rope/v head dims (so kv_b_proj), rope and YaRN parameters, router settings.
DEEPSEEK_SHAPES = {
    "deepseek-v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "attention_bias": False,
        "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
        "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_layer_freq": 1, "n_group": 1,
        "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6,
        "num_key_value_heads": 16, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                                "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                                                "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "tie_word_embeddings": False,
        "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16", "v_head_dim": 128,
        # shrunk (real: 2048, 10944, 1408, 64 experts, 102400, 27 layers)
        "hidden_size": 256, "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 8,
        "vocab_size": 256, "num_hidden_layers": 2,
    },
    "kimi-k2": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "attention_bias": False,
        "bos_token_id": 163584, "eos_token_id": 163585, "first_k_dense_replace": 1, "hidden_act": "silu",
        "kv_lora_rank": 512, "max_position_embeddings": 131072, "moe_layer_freq": 1, "n_group": 1,
        "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 64, "num_experts_per_tok": 8,
        "num_key_value_heads": 64, "num_nextn_predict_layers": 0, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "tie_word_embeddings": False,
        "topk_group": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "v_head_dim": 128,
        # shrunk (real: 7168, 18432, 2048, 384 experts, 163840, 61 layers)
        "hidden_size": 256, "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 8,
        "vocab_size": 256, "num_hidden_layers": 2,
    },
}

#: runs a tree's own converter with a stub vocabulary, the same on both sides: the shapes' real
#: tokenizers cannot be had offline, and the series leaves set_vocab alone. With --swap-kv-b the
#: patched tree's split_kv_b splits [v | nope] instead of [nope | v]: the control, a refactor bug
_DRIVER = '''
import sys
tree, swap, args = sys.argv[1], sys.argv[2] == "--swap-kv-b", sys.argv[3:]
sys.path[:0] = [tree + "/gguf-py", tree]
import torch
import convert_hf_to_gguf
from conversion.deepseek import DeepseekV2Model

def stub_vocab(self):
    n = self.hparams["vocab_size"]
    self.gguf_writer.add_tokenizer_model("gpt2")
    self.gguf_writer.add_tokenizer_pre("default")
    self.gguf_writer.add_token_list([f"t{i}" for i in range(n)])
    self.gguf_writer.add_token_types([1] * n)
    self.gguf_writer.add_token_merges([])

DeepseekV2Model.set_vocab = stub_vocab
if swap:
    def swapped(data_torch, n_head_kv, hparams):
        nope, v = hparams["qk_nope_head_dim"], hparams["v_head_dim"]
        kv_b = data_torch.view(n_head_kv, v + nope, data_torch.shape[-1])
        v_b, k_b = torch.split(kv_b, [v, nope], dim=1)
        return k_b.transpose(1, 2), v_b
    DeepseekV2Model.split_kv_b = staticmethod(swapped)
sys.argv = ["convert_hf_to_gguf.py", *args]
convert_hf_to_gguf.main()
'''


def _deepseek_checkpoint(path: Path, cfg: dict, seed: int) -> Path:
    """A random bf16 checkpoint in the HF layout of DeepseekV2/V3ForCausalLM for `cfg`."""
    g = torch.Generator().manual_seed(seed)
    h, n_head, vocab = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    nope, rope, v, kv_lora = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    for il in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{il}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.kv_a_proj_with_mqa.weight": (kv_lora + rope, h),
                       p + "self_attn.kv_a_layernorm.weight": (kv_lora,),
                       p + "self_attn.kv_b_proj.weight": (n_head * (nope + v), kv_lora),
                       p + "self_attn.o_proj.weight": (h, n_head * v)})
        if cfg["q_lora_rank"] is None:
            shapes[p + "self_attn.q_proj.weight"] = (n_head * (nope + rope), h)
        else:
            shapes.update({p + "self_attn.q_a_proj.weight": (cfg["q_lora_rank"], h),
                           p + "self_attn.q_a_layernorm.weight": (cfg["q_lora_rank"],),
                           p + "self_attn.q_b_proj.weight": (n_head * (nope + rope), cfg["q_lora_rank"])})
        if il < cfg["first_k_dense_replace"]:
            n_ff = cfg["intermediate_size"]
            shapes.update({p + "mlp.gate_proj.weight": (n_ff, h), p + "mlp.up_proj.weight": (n_ff, h),
                           p + "mlp.down_proj.weight": (h, n_ff)})
            continue
        n_ff, n_exp = cfg["moe_intermediate_size"], cfg["n_routed_experts"]
        shapes[p + "mlp.gate.weight"] = (n_exp, h)
        if cfg["topk_method"] == "noaux_tc":
            shapes[p + "mlp.gate.e_score_correction_bias"] = (n_exp,)
        for xid in range(n_exp):
            q = f"{p}mlp.experts.{xid}."
            shapes.update({q + "gate_proj.weight": (n_ff, h), q + "up_proj.weight": (n_ff, h),
                           q + "down_proj.weight": (h, n_ff)})
        n_sh = n_ff * cfg["n_shared_experts"]
        shapes.update({p + "mlp.shared_experts.gate_proj.weight": (n_sh, h),
                       p + "mlp.shared_experts.up_proj.weight": (n_sh, h),
                       p + "mlp.shared_experts.down_proj.weight": (h, n_sh)})
    tensors = {name: torch.randn(*shape, generator=g).to(torch.bfloat16) for name, shape in shapes.items()}
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def base_converter(tmp_path_factory, pin, sdist_tarball) -> Path:
    """The pinned base's converter (convert_hf_to_gguf.py, conversion/, gguf-py), exported with git."""
    import io
    import tarfile
    from llamacpp_mla_port.process import git
    from llamacpp_mla_port.source import obtain
    base = obtain.obtain(pin, "sdist", sdist_file=sdist_tarball, log=lambda *_: None)
    data = git.run(obtain.cache_repo(), "archive", "--format=tar", base.sha, "convert_hf_to_gguf.py", "conversion",
                   "gguf-py", text=False)
    dest = tmp_path_factory.mktemp("base-converter")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _convert_deepseek(tree: Path, ckpt: Path, out: Path, swap: bool = False) -> bytes:
    driver = out.with_suffix(".driver.py")
    driver.write_text(_DRIVER)
    proc = subprocess.run([sys.executable, str(driver), str(tree), "--swap-kv-b" if swap else "-", str(ckpt),
                           "--outfile", str(out), "--outtype", "bf16"],
                          capture_output=True, text=True, timeout=600, cwd=tree,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out.read_bytes()


def _first_difference(a: Path, b: Path) -> str:
    ra, rb = GGUFReader(a), GGUFReader(b)
    keys = sorted(set(ra.fields) | set(rb.fields))
    for k in keys:
        fa, fb = ra.get_field(k), rb.get_field(k)
        if fa is None or fb is None or fa.contents() != fb.contents():
            return f"key {k}: {None if fa is None else fa.contents()} != {None if fb is None else fb.contents()}"
    ta, tb = tensors_of(ra), tensors_of(rb)
    if sorted(ta) != sorted(tb):
        return f"tensors {sorted(set(ta) ^ set(tb))}"
    return next((f"tensor {n}" for n in ta if not np.array_equal(np.asarray(ta[n].data), np.asarray(tb[n].data))),
                "layout only")


# kimi-k2 re-proves deepseek-v2-lite's path at another shape: make test-slow
@pytest.mark.parametrize("shape", [pytest.param(s, marks=pytest.mark.slow) if s == "kimi-k2" else s
                                   for s in sorted(DEEPSEEK_SHAPES)])
def test_deepseek_conversions_are_byte_identical_with_the_base_converter(tree, base_converter, tmp_path, shape):
    cfg = DEEPSEEK_SHAPES[shape]
    ckpt = _deepseek_checkpoint(tmp_path / "ckpt", cfg, seed=len(shape))
    base = _convert_deepseek(base_converter, ckpt, tmp_path / "base.gguf")
    patched = _convert_deepseek(tree, ckpt, tmp_path / "patched.gguf")
    assert base == patched, f"{shape}: {_first_difference(tmp_path / 'base.gguf', tmp_path / 'patched.gguf')}"
    reader = GGUFReader(tmp_path / "patched.gguf")
    n_head, kv_lora = cfg["num_attention_heads"], cfg["kv_lora_rank"]
    assert np_shape(tensors_of(reader)["blk.1.attn_k_b.weight"]) == (n_head, kv_lora, cfg["qk_nope_head_dim"])
    assert field(reader, "deepseek2.attention.key_length_mla") == cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    if shape == "kimi-k2":
        # the control: k_b and v_b swapped inside split_kv_b (same shapes here: nope = v = 128) must show
        swapped = _convert_deepseek(tree, ckpt, tmp_path / "swapped.gguf", swap=True)
        assert swapped != base
        assert _first_difference(tmp_path / "base.gguf", tmp_path / "swapped.gguf").startswith("tensor blk.0.attn_k_b")
