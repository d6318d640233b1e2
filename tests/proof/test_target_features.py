"""The target side: the layer inputs the patched Kimi-K3 hands a draft equal the block-local
"prefix" stream, recomputed independently from the embedding table and the per-layer
sublayer outputs dumped from the graph."""

from __future__ import annotations

import numpy as np
import pytest

from llamacpp_mla_port.proof.reference.model import nmse, read_target_head
from llamacpp_mla_port.proof.run.programs import compile_program
from llamacpp_mla_port.proof.run.target_features import (
    dump_target_features,
    full_residual_stream,
    prefix_stream,
    sublayer_tensor_names,
)
from llamacpp_mla_port.fixtures.target_variants import write_deep_kimi_k3_target

pytestmark = pytest.mark.build

PROMPT = [1, 5, 9, 33, 70, 2, 5, 9, 100, 17, 17, 64]


@pytest.fixture(scope="module")
def base_target(llama_build, tmp_path_factory):
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
    return write_kimi_k3_target(llama_build, tmp_path_factory.mktemp("target") / "kimi-k3.gguf")


@pytest.fixture(scope="module")
def binary(patched_tree, llama_build):
    return compile_program("target-features", patched_tree, llama_build)


@pytest.mark.parametrize("layer_types,block_size", [("MK", 12), ("MKKMKK", 2), ("MKMKKM", 3)])
def test_layer_inputs_are_the_prefix_stream(base_target, binary, tmp_path, layer_types, block_size):
    if layer_types == "MK":
        target = base_target                      # llama.cpp's own test model, as is
    else:
        target = write_deep_kimi_k3_target(base_target, tmp_path / "deep.gguf", layer_types, block_size)
    n_layer = len(layer_types)
    attn_names, ffn_names = sublayer_tensor_names(layer_types, block_size)
    got = dump_target_features(binary, target, PROMPT, tmp_path / "out", layers=list(range(n_layer)),
                               dump=attn_names + ffn_names)
    assert got.features.shape == (len(PROMPT), n_layer * got.tap(0).shape[1])

    embd, _ = read_target_head(target)
    want = prefix_stream(embd[PROMPT], [got.dumps[n] for n in attn_names], [got.dumps[n] for n in ffn_names],
                         block_size)
    for il in range(n_layer):
        assert nmse(got.tap(il), want[il]) < 1e-12, f"layer {il} input is not the prefix stream"

    # the plain residual sum differs wherever a checkpoint restarted the stream
    full = full_residual_stream(embd[PROMPT], [got.dumps[n] for n in attn_names], [got.dumps[n] for n in ffn_names])
    for il in range(1, n_layer):
        if nmse(full[il], want[il]) > 1e-6:
            assert nmse(got.tap(il), full[il]) > 1e-6
    assert any(nmse(full[il], want[il]) > 1e-3 for il in range(1, n_layer))


def test_taps_follow_the_draft_target_layers(base_target, binary, tmp_path):
    """--draft takes dflash.target_layers from a draft GGUF; the rows are those layers' inputs, in order."""
    from llamacpp_mla_port.fixtures.draft_gguf import write_mla_draft_gguf

    target = write_deep_kimi_k3_target(base_target, tmp_path / "deep.gguf", "MKKMKK", 2)
    draft = write_mla_draft_gguf(tmp_path / "draft.gguf", target, config={"target_layers": [5, 1, 3]})
    by_draft = dump_target_features(binary, target, PROMPT, tmp_path / "a", draft=draft)
    by_layer = dump_target_features(binary, target, PROMPT, tmp_path / "b", layers=[5, 1, 3])
    assert by_draft.layers == [5, 1, 3]
    np.testing.assert_array_equal(by_draft.features, by_layer.features)
    all_layers = dump_target_features(binary, target, PROMPT, tmp_path / "c", layers=list(range(6)))
    np.testing.assert_array_equal(by_draft.tap(0), all_layers.tap(5))
    np.testing.assert_array_equal(by_draft.tap(2), all_layers.tap(3))
