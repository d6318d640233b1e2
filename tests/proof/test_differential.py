"""The doctor agrees with the patched loader on ~350 one-change mutants of two loadable drafts.

Every mutant goes to both judges: the doctor (with and without --target) and load-check, the
proof program that loads the draft, pairs it with the tiny Kimi-K3 target and drafts one
block through llama.cpp's public API. The doctor never passes a file the loader refuses;
where it fails a file the loader accepts, the case is in proof/differential.DELIBERATE with
the semantic reason, and the finding must come from the check named there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llamacpp_mla_port.fixtures.draft_gguf import write_mla_draft_gguf, write_qwen3_draft_gguf
from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
from llamacpp_mla_port.proof.differential import DELIBERATE, LoaderResult, differential
from llamacpp_mla_port.proof.run.programs import compile_program

pytestmark = pytest.mark.build

#: The aborts of llama.cpp outside the DFlash/DSpark code that mutants still reach (message
#: pattern -> where and why); the doctor refuses all of these files. A new abort, or any hang,
#: fails the test: the DFlash loader and the pairing refuse cleanly.
UPSTREAM_ABORTS: dict[str, str] = {
    r".*GGML_ASSERT\(hparams\.n_layer_all > 0 && hparams\.n_layer_all <= LLAMA_MAX_LAYERS\).*":
        "generic loader (llama_model_base::load_hparams): block_count 0 or above LLAMA_MAX_LAYERS",
    r".*GGML_ASSERT\(hparams\.rope_scaling_type_train != LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED\).*":
        "generic loader: a rope.scaling.type it does not know",
    r".*binary_op: unsupported types: dst: f32, src0: f32, src1: f16.*":
        "CPU backend: a norm weight stored as F16 (converters write them F32)",
    r".*GGML_ASSERT\(\*cur_backend_id != -1\).*": "see proof.differential.KNOWN_LOADER_DEFECTS (AMX extra buffer type)",
}


def upstream_abort(result: LoaderResult) -> str | None:
    if result.verdict != "abort":
        return None
    return next((why for pat, why in UPSTREAM_ABORTS.items() if re.fullmatch(pat, result.message)), None)


def base_drafts(target: Path, work: Path) -> dict[str, Path]:
    """The two loadable drafts the mutants derive from. Their dimensions avoid the loader's
    fallbacks (n_embd / n_head differs from every head width), so a deleted key shows."""
    work = Path(work)
    return {
        "mla": write_mla_draft_gguf(work / "base-mla.gguf", target, seed=1,
                                    config={"kv_lora_rank": 96, "q_lora_rank": 32, "intermediate_size": 64}),
        "qwen3": write_qwen3_draft_gguf(work / "base-qwen3.gguf", target, seed=1,
                                        config={"intermediate_size": 64, "head_dim": 16}),
    }


@pytest.fixture(scope="module")
def report(llama_build, patched_tree, tmp_path_factory):
    d = tmp_path_factory.mktemp("differential")
    target = write_kimi_k3_target(llama_build, d / "kimi-k3-tiny.gguf")
    load_check = compile_program("load-check", patched_tree, llama_build)
    return differential(load_check, target, base_drafts(target, d), d / "mutants")


def test_every_kind_of_mutant_was_tried(report):
    ops = {o.mutant.op for o in report["outcomes"]}
    assert {"delete", "zero", "plus1", "huge", "flip", "empty", "shorten", "lengthen", "shift",
            "=gpt2", "ne0+1", "f16"} <= ops
    assert {o.mutant.base for o in report["outcomes"]} == {"mla", "qwen3"}
    assert report["mutants"] >= 300
    # both judges see something to refuse and something to accept
    assert report["loader_accepts"] >= 50 and report["loader_refuses"] >= 50


def test_the_doctor_never_passes_a_file_the_loader_refuses(report):
    assert report["violations"] == []


def test_the_doctor_is_stricter_only_where_it_names_a_semantic_reason(report):
    assert report["unexpected"] == []
    seen = {line.split(": ", 1)[0] for line in report["deliberate"]}
    assert seen == set(DELIBERATE), "DELIBERATE lists a case that no longer differs: drop it"


def test_the_issue_s_three_cases_are_refused_by_both(report):
    by_id = {o.mutant.id: o for o in report["outcomes"]}
    for case in ("mla:dflash.context_length:delete", "mla:dflash.attention.layer_norm_rms_epsilon:delete",
                 "mla:tokenizer.ggml.model:=gpt2"):
        o = by_id[case]
        assert o.loader.verdict == "refused", (case, o.loader)
        assert o.doctor_exit == 2 and o.doctor_alone_exit == 2, (case, o.doctor_errors)


def test_counts(report):
    print(f"\nmutants {report['mutants']}, agreements {report['agreements']}, deliberate "
          f"{len(report['deliberate'])}, known loader defects {len(report['loader_defects'])}, "
          f"loader aborts/hangs {len(report['loader_aborts'])}, {report['seconds']} s")
    for line in report["deliberate"] + report["loader_defects"]:
        print("  " + line)
    assert report["agreements"] + len(report["deliberate"]) + len(report["loader_defects"]) == report["mutants"]


def test_no_hang_and_no_abort_outside_the_known_upstream_ones(report):
    new = [f"{o.mutant.id}: {o.loader.verdict}: {o.loader.message}" for o in report["outcomes"]
           if o.loader.verdict in ("abort", "hang") and upstream_abort(o.loader) is None]
    assert new == [], "llama.cpp aborts or hangs where it should refuse"
