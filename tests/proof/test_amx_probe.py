"""A DSpark MLA draft whose k_b / v_b are Q8_0 or F16 loads and drafts with llama.cpp's default
buffer types (series commit `llama : probe per-head weights with the strided product graphs
build`).

On an AMX CPU the loader used to place such a k_b in the AMX buffer (its probe multiplied the
weight by a contiguous activation, which AMX takes), while the graph multiplies k_b by a permuted
view of q_nope, which AMX refuses: the scheduler then aborted at context creation
(GGML_ASSERT(*cur_backend_id != -1), upstream #18099). The AMX case runs only on a CPU with AMX;
elsewhere it is skipped with the reason. The same load-and-draft check runs on every CPU, so
the machinery the AMX case depends on is exercised everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llamacpp_mla_port.fixtures.draft_gguf import write_mla_draft_gguf
from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
from llamacpp_mla_port.proof.differential import run_loader
from llamacpp_mla_port.proof.lossless import speculative_simple, target_alone
from llamacpp_mla_port.proof.run.programs import compile_program, ggml_cpu_features

pytestmark = pytest.mark.build

#: k_b [nope, kv_lora, n_head] and v_b [kv_lora, v, n_head]: 32-multiples, so Q8_0 blocks fit
#: and AMX's own shape rules (rows and K multiples of 32) accept the weight in its buffer
CONFIG = {"kv_lora_rank": 64, "qk_nope_head_dim": 32, "v_head_dim": 32, "q_lora_rank": 32,
          "intermediate_size": 64}


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


#: the CPU side of the AMX case; the build must have AMX compiled in too (the `pair` fixture)
CPU_AMX = {"amx_tile", "amx_int8"} <= _cpu_flags()


@pytest.fixture(scope="module")
def pair(llama_build, patched_tree, tmp_path_factory):
    d = tmp_path_factory.mktemp("amx-probe")
    target = write_kimi_k3_target(llama_build, d / "kimi-k3-tiny.gguf")
    per_head = ("attn_k_b.weight", "attn_v_b.weight")
    drafts = {q: write_mla_draft_gguf(d / f"draft-kb-{q}.gguf", target, seed=3, config=CONFIG,
                                      tensor_types=dict.fromkeys(per_head, q)) for q in ("q8_0", "f16")}
    import gguf
    for q, path in drafts.items():
        stored = {t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors if t.name.endswith(per_head)}
        assert stored == {q.upper()}, (q, stored)
    amx = CPU_AMX and bool(ggml_cpu_features(patched_tree, llama_build)["amx_int8"])
    return compile_program("load-check", patched_tree, llama_build), target, drafts, amx


def _load_and_draft(pair, qtype: str):
    load_check, target, drafts, _ = pair
    (res,) = run_loader(load_check, target, [drafts[qtype]])
    return res


def _lossless(llama_build, pair, qtype: str) -> None:
    """Greedy speculative decoding with the draft, default buffer types: the target-alone text."""
    _, target, drafts, _ = pair
    prompt = "the draft model proposes"
    want = target_alone(llama_build, target, prompt)
    got = speculative_simple(llama_build, target, drafts[qtype], prompt, draft_max=7, flash_attn=True, p_min=0.0)
    assert got.n_drafted > 0, got.log[-2000:]
    assert got.text[:len(want)] == want, f"\nspeculative: {got.text}\ntarget:      {want}"


@pytest.mark.parametrize("qtype", ["q8_0", "f16"])
def test_per_head_k_b_draft_loads_and_drafts_with_default_buffer_types(llama_build, pair, qtype):
    """On this CPU, whatever extra buffer types it has: the draft loads, pairs, drafts a block
    and speculative decoding with it gives the target-alone text."""
    res = _load_and_draft(pair, qtype)
    print(qtype, res)
    assert res.verdict == "accepted", res
    _lossless(llama_build, pair, qtype)


@pytest.mark.parametrize("qtype", ["q8_0", "f16"])
def test_per_head_k_b_draft_on_amx(llama_build, pair, qtype):
    """The upstream abort's own case: only meaningful where the AMX buffer type exists."""
    if not pair[3]:
        why = ("this build's ggml-cpu has no AMX compiled in (a portable build?)" if CPU_AMX else
               "this CPU has no AMX (amx_tile/amx_int8 absent from /proc/cpuinfo)")
        pytest.skip(f"{why}: the AMX case of the {qtype} k_b draft with llama.cpp's default buffer "
                    "types did NOT run here")
    res = _load_and_draft(pair, qtype)
    print(qtype, res)
    assert res.verdict == "accepted", res
    _lossless(llama_build, pair, qtype)
