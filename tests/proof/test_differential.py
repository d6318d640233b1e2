"""The doctor agrees with the patched loader on ~350 one-change mutants of two loadable drafts.

Every mutant goes to both judges: the doctor (with and without --target) and load-check, the
proof program that loads the draft, pairs it with the tiny Kimi-K3 target and drafts one
block through llama.cpp's public API. The doctor never passes a file the loader refuses;
where it fails a file the loader accepts, the case is in proof/differential.DELIBERATE with
the semantic reason, and the finding must come from the check named there.
"""

from __future__ import annotations

import pytest

from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
from llamacpp_mla_port.proof.differential import DELIBERATE, base_drafts, differential
from llamacpp_mla_port.proof.run.programs import compile_program

pytestmark = pytest.mark.build


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
    from llamacpp_mla_port.proof.differential import upstream_abort
    new = [f"{o.mutant.id}: {o.loader.verdict}: {o.loader.message}" for o in report["outcomes"]
           if o.loader.verdict in ("abort", "hang") and upstream_abort(o.loader) is None]
    assert new == [], "llama.cpp aborts or hangs where it should refuse"
