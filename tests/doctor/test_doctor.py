"""`doctor` on tiny, well-formed GGUFs: the seed card's file, correct drafts, wrong metadata."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGUFValueType

from tests.helpers.doctor_gguf import (write_mla_draft, write_plain_model, write_qwen3_draft,
                                       write_seed_card_file, write_target)
from llamacpp_mla_port.cli import main
from llamacpp_mla_port.doctor.checks import run_checks
from llamacpp_mla_port.gguf.header import read_header


def doctor(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["doctor", *map(str, argv), "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def by_check(findings: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in findings:
        out.setdefault(f["check"], []).append(f)
    return out


def verdicts(findings: list[dict], check: str) -> set[str]:
    return {f["verdict"] for f in by_check(findings).get(check, [])}


# --- the seed card -------------------------------------------------------------------

def test_seed_card_file_is_diagnosed_with_the_exact_cause(tmp_path, capsys):
    seed = write_seed_card_file(tmp_path / "seed.gguf")
    assert len(read_header(seed).tensors) == 72
    code, rep = doctor(capsys, seed)
    assert code == 2
    errors = [f for f in rep["findings"] if f["verdict"] == "error"]
    assert [f["check"] for f in errors] == ["target_layers"], errors
    ev = errors[0]["evidence"]
    assert "7 ids but fc.weight takes 5 taps" in ev
    assert "7 x 32 = 224" in ev
    assert "--fix-metadata" in errors[0]["fix"] and "--target-layers" in errors[0]["fix"]
    # everything else about the file is fine: layout, tensors, MLA dims, stripped embeddings
    f = by_check(rep["findings"])
    assert rep["layout"] == "mla"
    for check in ("arch", "tensors", "shapes", "mla_dims", "block_size", "mask_token", "rope", "scales", "embeddings"):
        assert verdicts(rep["findings"], check) == {"ok"}, (check, f.get(check))


def test_fix_metadata_makes_the_seed_file_pass(tmp_path, capsys):
    seed = write_seed_card_file(tmp_path / "seed.gguf")
    out = tmp_path / "fixed.gguf"
    code, rep = doctor(capsys, seed, "--fix-metadata", out, "--target-layers", "2,5,8,11,14")
    assert code == 0
    assert rep["exit_code"] == 2  # the input itself is still broken
    assert rep["fixed"]["exit_code"] == 0
    assert rep["fixed"]["changes"] == {"dflash.target_layers": [3, 6, 9, 12, 15]}
    # re-check the output independently, and through the upstream reader
    code2, rep2 = doctor(capsys, out)
    assert code2 == 0 and all(f["verdict"] == "ok" for f in rep2["findings"])
    a, b = GGUFReader(seed), GGUFReader(out)
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for ta, tb in zip(a.tensors, b.tensors):
        assert np.array_equal(ta.data, tb.data), ta.name
    assert b.fields["dflash.target_layers"].contents() == [3, 6, 9, 12, 15]
    assert b.fields["dflash.target_layers"].types == [GGUFValueType.ARRAY, GGUFValueType.INT32]
    assert seed.read_bytes() != out.read_bytes()
    assert read_header(seed).get("dflash.target_layers") == [3, 4, 5, 6, 7, 8, 9]  # never in place


def test_fix_from_config_json(tmp_path, capsys):
    seed = write_seed_card_file(tmp_path / "seed.gguf")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"target_layer_ids": [2, 5, 8, 11, 14], "mask_token_id": 62,
                               "model_type": "k3_dspark"}))
    out = tmp_path / "fixed.gguf"
    code, rep = doctor(capsys, seed, "--fix-metadata", out, "--from-config", cfg)
    assert code == 0
    assert rep["fixed"]["changes"] == {"dflash.target_layers": [3, 6, 9, 12, 15],
                                       "tokenizer.ggml.mask_token_id": 62}


def test_fix_adds_a_missing_block_size(tmp_path, capsys):
    draft = write_mla_draft(tmp_path / "d.gguf", block_size=None)
    code, rep = doctor(capsys, draft)
    assert code == 2 and verdicts(rep["findings"], "block_size") == {"error"}
    code, rep = doctor(capsys, draft, "--fix-metadata", tmp_path / "o.gguf", "--block-size", "7")
    assert code == 0 and read_header(tmp_path / "o.gguf").get("dflash.block_size") == 7


def test_fix_refuses_in_place_and_existing_output(tmp_path, capsys):
    seed = write_seed_card_file(tmp_path / "seed.gguf")
    before = seed.read_bytes()
    assert main(["doctor", str(seed), "--fix-metadata", str(seed), "--target-layers", "1,2,3,4,5"]) == 2
    assert "is the input file" in capsys.readouterr().err
    link = tmp_path / "alias.gguf"
    link.symlink_to(seed)
    assert main(["doctor", str(seed), "--fix-metadata", str(link), "--target-layers", "1,2,3,4,5"]) == 2
    assert "is the input file" in capsys.readouterr().err
    assert seed.read_bytes() == before
    other = tmp_path / "exists.gguf"
    other.write_bytes(b"x")
    assert main(["doctor", str(seed), "--fix-metadata", str(other), "--target-layers", "1,2,3,4,5"]) == 2
    assert "exists" in capsys.readouterr().err and other.read_bytes() == b"x"
    assert main(["doctor", str(seed), "--target-layers", "1,2"]) == 2
    assert "need --fix-metadata" in capsys.readouterr().err
    assert main(["doctor", str(seed), "--fix-metadata", str(tmp_path / "n.gguf"),
                 "--target-layers", "5,3"]) == 2
    assert "strictly increasing" in capsys.readouterr().err
    assert not (tmp_path / "n.gguf").exists()


# --- the right verdict for each kind of file ----------------------------------------------

def test_correct_mla_draft_passes(tmp_path, capsys):
    code, rep = doctor(capsys, write_mla_draft(tmp_path / "d.gguf"))
    assert code == 0 and rep["layout"] == "mla"
    assert {f["verdict"] for f in rep["findings"]} == {"ok"}
    assert "MLA DSpark" in by_check(rep["findings"])["arch"][0]["title"]


def test_qwen3_style_dspark_draft(tmp_path, capsys):
    code, rep = doctor(capsys, write_qwen3_draft(tmp_path / "q.gguf"))
    assert code == 0 and rep["layout"] == "qwen3"
    assert "Qwen3-style DSpark" in by_check(rep["findings"])["arch"][0]["title"]
    assert "mla_dims" not in by_check(rep["findings"])
    assert "NeoX" in by_check(rep["findings"])["rope"][0]["title"]


def test_plain_model_is_not_a_draft(tmp_path, capsys):
    code, rep = doctor(capsys, write_plain_model(tmp_path / "p.gguf"))
    assert code == 2 and rep["layout"] == "not-a-draft"
    assert [f["check"] for f in rep["findings"]] == ["arch"]
    assert "not a DFlash/DSpark draft" in rep["findings"][0]["title"]


def test_target_passed_as_draft_is_named(tmp_path, capsys):
    code, rep = doctor(capsys, write_target(tmp_path / "t.gguf"))
    assert code == 2 and "pass it as --target" in rep["findings"][0]["title"]


# --- single defects ----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, check, needle", [
    (dict(mask=200), "mask_token", "outside the vocabulary"),
    (dict(mask=None), "mask_token", "missing"),
    (dict(omit_keys=("dflash.rope.scaling.yarn_log_multiplier",)), "rope", "yarn_log_multiplier missing"),
    (dict(extra_keys={"dflash.rope.scaling.yarn_log_multiplier": (0.1, GGUFValueType.FLOAT32)}),
     "rope", "x0.1 form"),
    (dict(extra_keys={"dflash.attention.scale": (0.2887, GGUFValueType.FLOAT32)}), "scales", "refuses the file"),
    (dict(extra_keys={"dflash.embedding_scale": (2.0, GGUFValueType.FLOAT32)}), "scales", "embedding_scale = 2"),
    (dict(extra_keys={"dflash.attention.value_scale": (2.0, GGUFValueType.FLOAT32)}), "scales",
     "attention.value_scale = 2"),
    (dict(extra_keys={"dflash.attention.head_count_kv": (4, GGUFValueType.UINT32)}), "mla_dims", "head_count_kv = 4"),
    (dict(extra_keys={"dflash.attention.key_length": (12 + 1, GGUFValueType.UINT32)}), "mla_dims", "key_length = 13"),
    (dict(omit_keys=("dflash.attention.q_lora_rank",)), "mla_dims", "q_lora_rank missing"),
    (dict(omit_tensors=("blk.3.attn_k_b.weight",)), "tensors", "blk.3.attn_k_b.weight"),
    (dict(extra_tensors={"blk.0.attn_kv_b.weight": np.zeros((64, 8), np.float32)}), "tensors", "unsplit kv_b"),
    (dict(extra_tensors={"blk.1.attn_q_b.weight": np.zeros((40, 16), np.float32)}), "shapes",
     "blk.1.attn_q_b.weight [16, 40] != [16, 48]"),
    (dict(target_layers=[3, 9, 6, 12, 15]), "target_layers", "not strictly increasing"),
    (dict(extra_keys={"dflash.target_layers": ("3,6,9", GGUFValueType.STRING)}), "target_layers", "wrong type"),
    (dict(omit_keys=("dflash.target_layers",)), "target_layers", "missing"),
    (dict(block_size=1000), "block_size", "2..64"),
])
def test_single_defect_is_an_error(tmp_path, capsys, kwargs, check, needle):
    code, rep = doctor(capsys, write_mla_draft(tmp_path / "d.gguf", **kwargs))
    assert code == 2
    bad = [f for f in rep["findings"] if f["verdict"] == "error"]
    assert any(f["check"] == check and needle in (f["title"] + " " + f["evidence"]) for f in bad), bad


def test_tap_zero_is_a_warning_not_an_error(tmp_path, capsys):
    """Layer 0's input (the embeddings) loads in llama.cpp, but no trained draft taps it."""
    code, rep = doctor(capsys, write_mla_draft(tmp_path / "d.gguf", target_layers=[0, 5, 8, 11, 14]))
    assert code == 1
    tl = by_check(rep["findings"])["target_layers"][0]
    assert tl["verdict"] == "warning" and "was the +1 forgotten" in tl["evidence"]


def test_known_ids_without_plus_one(tmp_path):
    draft = write_mla_draft(tmp_path / "d.gguf", target_layers=[2, 23, 47, 71, 89])
    _ctx, findings = run_checks(read_header(draft))
    tl = [f for f in findings if f.check == "target_layers"][0]
    assert tl.verdict == "error" and "WITHOUT the +1" in tl.evidence


def test_kept_embeddings_and_tied_head(tmp_path, capsys):
    # the MLA path ties a missing output head to token_embd as every DFlash draft does: the trap
    code, rep = doctor(capsys, write_mla_draft(tmp_path / "d.gguf", keep_embd=True))
    assert code == 1
    assert "embeddings kept" in by_check(rep["findings"])["embeddings"][0]["title"]
    tied = by_check(rep["findings"])["tied_head"][0]
    assert tied["verdict"] == "warning" and "(the MLA path too)" in tied["evidence"]


def test_qwen3_tied_head_trap_is_a_warning(tmp_path, capsys):
    code, rep = doctor(capsys, write_qwen3_draft(tmp_path / "q.gguf", keep_embd=True))
    assert code == 1
    tied = by_check(rep["findings"])["tied_head"][0]
    assert tied["verdict"] == "warning" and "ties the missing output head" in tied["evidence"]


# --- with --target ---------------------------------------------------------------------------

def test_target_pairing_ok_and_taps_checked(tmp_path, capsys):
    draft = write_mla_draft(tmp_path / "d.gguf")
    target = write_target(tmp_path / "t.gguf", n_layer=16)
    code, rep = doctor(capsys, draft, "--target", target)
    assert code == 0, rep
    for check in ("target_n_embd", "target_vocab", "target_tokenizer", "target_taps", "embedding_distance"):
        assert verdicts(rep["findings"], check) == {"ok"}, check
    target = write_target(tmp_path / "t2.gguf", n_layer=12)
    code, rep = doctor(capsys, draft, "--target", target)
    assert code == 2
    tl = by_check(rep["findings"])["target_layers"][0]
    assert tl["verdict"] == "error" and "outside the target's layer inputs 1..11" in tl["evidence"]


def test_target_mismatches(tmp_path, capsys):
    draft = write_mla_draft(tmp_path / "d.gguf")
    # a target with more tokens: the draft's vocabulary lies inside it (llama.cpp takes the pair)
    code, rep = doctor(capsys, draft, "--target", write_target(tmp_path / "t.gguf", n_vocab=80))
    assert code == 2 and verdicts(rep["findings"], "target_vocab") == {"warning"}
    assert verdicts(rep["findings"], "target_tokenizer") == {"error"}
    # a target with fewer tokens: the draft would propose ids the target does not have
    code, rep = doctor(capsys, draft, "--target", write_target(tmp_path / "t1.gguf", n_vocab=48, mask=40))
    assert code == 2 and verdicts(rep["findings"], "target_vocab") == {"error"}
    assert "not inside the target's" in by_check(rep["findings"])["target_vocab"][0]["title"]
    code, rep = doctor(capsys, draft, "--target", write_target(tmp_path / "t2.gguf", n_embd=48))
    assert code == 2 and verdicts(rep["findings"], "target_n_embd") == {"error"}


def test_embedding_distance(tmp_path, capsys):
    rng = np.random.default_rng(7)
    table = rng.standard_normal((64, 32)).astype(np.float32)
    target = write_target(tmp_path / "t.gguf", n_layer=16, embd=table)
    same = write_mla_draft(tmp_path / "same.gguf", keep_embd=True, embd=table.copy())
    code, rep = doctor(capsys, same, "--target", target)
    dist = by_check(rep["findings"])["embedding_distance"][0]
    assert dist["verdict"] == "ok" and "identical" in dist["title"]
    # the one warning: a kept table without an output head is tied to it (upstream's DFlash rule)
    assert code == 1 and {f["check"] for f in rep["findings"] if f["verdict"] != "ok"} == {"tied_head"}
    other = table.copy()
    other[5, 3] += 0.5
    other[9] -= 0.25
    diff = write_mla_draft(tmp_path / "diff.gguf", keep_embd=True, embd=other)
    code, rep = doctor(capsys, diff, "--target", target)
    dist = by_check(rep["findings"])["embedding_distance"][0]
    assert code == 1 and dist["verdict"] == "warning"
    want_mean = (0.5 + 0.25 * 32) / table.size
    assert "max |diff| 0.5," in dist["evidence"]
    assert f"mean |diff| {want_mean:.6g}" in dist["evidence"]


# --- output ---------------------------------------------------------------------------------

def test_human_output_and_help(tmp_path, capsys):
    seed = write_seed_card_file(tmp_path / "seed.gguf")
    assert main(["doctor", str(seed)]) == 2
    out = capsys.readouterr().out
    assert "[FAIL] target_layers" in out and "\x1b[" not in out  # no colour when not a tty
    assert "exit 2" in out
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    helptext = capsys.readouterr().out
    assert "exit codes: 0 all checks ok, 1 warnings only, 2 errors" in helptext


def test_missing_file_is_a_clean_error(tmp_path, capsys):
    assert main(["doctor", str(tmp_path / "nope.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot open") and "Traceback" not in err


# --- the seed card's file at its real size (sparse: header real, data a hole) ----------------

def test_real_size_seed_file_header_only(tmp_path, capsys):
    from tests.helpers.doctor_gguf import write_real_size_seed_header
    seed = write_real_size_seed_header(tmp_path / "seed-real.gguf")
    assert seed.stat().st_size == 4_779_507_168   # the card's "4.45 GB" (GiB)
    code, rep = doctor(capsys, seed)
    assert code == 2
    tl = by_check(rep["findings"])["target_layers"][0]
    assert "35840 = 5 x 7168" in tl["evidence"] and "7 x 7168 = 50176" in tl["evidence"]
    assert "--target-layers 2,23,47,71,89" in tl["fix"]
    assert [f["check"] for f in rep["findings"] if f["verdict"] != "ok"] == ["target_layers"]
    good = write_real_size_seed_header(tmp_path / "good-real.gguf", target_layers=[3, 24, 48, 72, 90])
    code, rep = doctor(capsys, good)
    assert code == 0
    tl = by_check(rep["findings"])["target_layers"][0]
    assert "published target_layer_ids [2, 23, 47, 71, 89] + 1" in tl["evidence"]


@pytest.mark.slow
def test_real_size_fix_metadata_streams_the_data(tmp_path, capsys):
    """--fix-metadata on the 4.45 GiB file: streamed copy (peak memory one 4 MiB chunk)."""
    import resource
    import time

    from tests.helpers.doctor_gguf import write_real_size_seed_header
    seed = write_real_size_seed_header(tmp_path / "seed-real.gguf")
    out = tmp_path / "fixed-real.gguf"
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    code, rep = doctor(capsys, seed, "--fix-metadata", out, "--target-layers", "2,23,47,71,89")
    elapsed = time.perf_counter() - t0
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"real-size fix: {elapsed:.1f} s, max RSS grew {grown_mib:.0f} MiB")
    assert code == 0 and rep["fixed"]["changes"] == {"dflash.target_layers": [3, 24, 48, 72, 90]}
    assert out.stat().st_size == seed.stat().st_size
    assert grown_mib < 512
