"""proof/rpc.py without a build: the placement arguments and the -v log reader."""

from __future__ import annotations

import pytest

from llamacpp_mla_port.proof.rpc import draft_args, placement, rpc_devices, target_split_args

# the shape of llama.cpp's -v log of a speculative run (load_tensors lines, then the draft's)
LOG = """\
load_tensors: layer   0 assigned to device RPC0, is_swa = 0
load_tensors: layer   1 assigned to device RPC0, is_swa = 0
load_tensors: layer   2 assigned to device RPC1, is_swa = 0
load_tensors: layer   3 assigned to device RPC1, is_swa = 0
llama_context: constructing llama_context
common_speculative_init_result: loading draft model 'draft.gguf'
load_tensors: layer   0 assigned to device CPU, is_swa = 0
load_tensors: layer   1 assigned to device CPU, is_swa = 0
load_tensors: layer   0 assigned to device RPC0, is_swa = 0
"""


def test_placement_reads_each_models_first_run_of_layers():
    assert placement(LOG) == {"target": {"RPC0": 2, "RPC1": 2}, "draft": {"CPU": 2}}
    assert placement(LOG.split("common_speculative")[0]) == {"target": {"RPC0": 2, "RPC1": 2}, "draft": {}}


def test_placement_args():
    assert rpc_devices(2) == ["RPC0", "RPC1"]
    assert target_split_args(["h1:1", "h2:2"]) == ["--rpc", "h1:1,h2:2", "-dev", "RPC0,RPC1", "-ngl", "99",
                                                   "-ts", "1,1"]
    assert draft_args("local", 2) == ["-ngld", "0"]
    assert draft_args("remote", 3) == ["-devd", "RPC2", "-ngld", "99"]
    with pytest.raises(ValueError, match="local, remote"):
        draft_args("none", 2)


def test_docs_rpc_figures_are_the_computed_ones():
    from pathlib import Path

    from llamacpp_mla_port.proof.rpc import draft_cache_bytes_per_token, figures_markdown
    doc = (Path(__file__).resolve().parents[2] / "docs" / "rpc.md").read_text()
    assert figures_markdown() in doc, "docs/rpc.md's RPC figures are stale: paste `python -m llamacpp_mla_port.proof.rpc`"
    # the arithmetic the table rests on: 5 layers x 576 values, K only
    assert draft_cache_bytes_per_token("f16") == 5 * 576 * 2 == 5760
    assert draft_cache_bytes_per_token("q8_0") == 5 * 18 * 34 == 3060
