"""The proof's helpers: the prefix-stream rule, the lossless bookkeeping, and the
`draft-logits` verb end to end (inputs it must refuse included)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.proof.lossless import bigram_table, render, same_greedy_output
from llamacpp_mla_port.proof.run.draft_logits import parse_kv_bytes_per_token
from llamacpp_mla_port.proof.run.target_features import full_residual_stream, prefix_stream, sublayer_tensor_names


def test_prefix_stream_restarts_at_checkpoints():
    e = np.full((1, 2), 100.0)
    attn = [np.full((1, 2), float(10 ** i)) for i in range(5)]
    ffn = [np.zeros((1, 2))] * 5
    ins = prefix_stream(e, attn, ffn, block_size=2)
    # layer 0 is a checkpoint: the embedding is banked, the stream restarts from attn0
    assert [float(x[0, 0]) for x in ins] == [100.0, 1.0, 11.0, 100.0, 1100.0, 10000.0]
    full = full_residual_stream(e, attn, ffn)
    assert float(full[5][0, 0]) == 100.0 + 11111.0


def test_sublayer_names_follow_the_graph():
    attn, ffn = sublayer_tensor_names("MKKM", 2)
    assert attn == ["prefix_sum_attn-0", "kda_out-1", "prefix_sum_attn-2", "mla_out-3"]
    assert ffn == ["ffn_out-0", "ffn_out-1", "ffn_out-2", "ffn_out-3"]


def test_bigram_table_and_rendering():
    seqs = [np.array([1, 2, 3, 1, 2, 4]), np.array([1, 2, 3])]
    assert bigram_table(seqs) == {1: 2, 2: 3, 3: 1}
    assert render([1, 26, 255]) == "11aff"


def test_same_greedy_output_allows_overshoot_only():
    assert same_greedy_output("abcdef", "abcd")          # speculative ran past -n
    assert not same_greedy_output("abc", "abcd")          # stopped short
    assert not same_greedy_output("abxdef", "abcd")


def test_parse_kv_line():
    line = ("llama_kv_cache: size =    0.56 MiB (   512 cells,   2 layers,  1/1 seqs), "
            "K (f16):    0.56 MiB, V (f16):    0.00 MiB")
    assert parse_kv_bytes_per_token(line) == pytest.approx(0.56 * 1024 * 1024 / 512)
    assert parse_kv_bytes_per_token("nothing") is None


@pytest.mark.build
def test_draft_logits_verb_with_reference(patched_tree, llama_build, tmp_path, capsys, monkeypatch):
    from llamacpp_mla_port.cli import main
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
    from llamacpp_mla_port.proof import parity
    from llamacpp_mla_port.proof.reference.model import read_target_head

    from llamacpp_mla_port.fixtures.target_variants import target_with_layers
    target = target_with_layers(write_kimi_k3_target(llama_build, tmp_path / "target.gguf"), tmp_path,
                                parity.TARGET_LAYERS_NEEDED)
    embd, _ = read_target_head(target)
    pcfg = parity.PARITY_CONFIGS[1]
    ckpt, draft = parity.make_draft(patched_tree, tmp_path, pcfg, embd.shape[1], embd.shape[0], "float32")
    n_taps = len(pcfg.overrides["target_layer_ids"])
    feats = np.random.default_rng(0).normal(size=(9, n_taps * embd.shape[1]))
    np.save(tmp_path / "f.npy", feats)                     # float64: the program converts
    monkeypatch.setenv("MLA_PORT_TREE", str(patched_tree))
    monkeypatch.setenv("MLA_PORT_BUILD", str(llama_build))
    mask = json.loads((ckpt / "config.json").read_text())["mask_token_id"]
    tokens = ",".join(str(t) for t in [7] + [mask] * (pcfg.block_size - 1))
    rc = main(["draft-logits", "--draft", str(draft), "--target", str(target), "--features", str(tmp_path / "f.npy"),
               "--tokens", tokens, "--out", str(tmp_path / "out"), "--ctx-pos0", "40", "--cache-type", "f32",
               "--reference", str(ckpt)])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["parity"]["nmse_biased_logits"] < 1e-9
    assert report["parity"]["nmse_base_logits"] < 1e-9
    assert report["parity"]["chain_equal"]
    for name in ("biased_logits", "base_logits", "hidden", "chain", "confidence"):
        assert (tmp_path / "out" / f"{name}.npy").is_file()
    assert "parity_emulated_staged" not in report          # F32: nothing to emulate

    # the default F16 cache: also compared with the reference rounding as the CPU backend does
    rc = main(["draft-logits", "--draft", str(draft), "--target", str(target), "--features", str(tmp_path / "f.npy"),
               "--tokens", tokens, "--out", str(tmp_path / "out-f16"), "--ctx-pos0", "40", "--reference", str(ckpt)])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    staged, e2e = report["parity_emulated_staged"]["worst_nmse"], report["parity"]["nmse_base_logits"]
    print(f"\ndraft-logits f16 cache: staged {staged:.2e}, end to end vs float64 {e2e:.2e}")
    assert staged < 1e-6
    assert e2e > staged          # the emulation explains more than float64 does (ratio: docs/bounds.md)

    # a block longer than dflash.block_size would silently skip the Markov head: refused
    too_long = ",".join(["7"] + [str(mask)] * pcfg.block_size)
    rc = main(["draft-logits", "--draft", str(draft), "--target", str(target), "--features", str(tmp_path / "f.npy"),
               "--tokens", too_long, "--out", str(tmp_path / "out2")])
    assert rc != 0
    assert "exceeds dflash.block_size" in capsys.readouterr().err

    # features of the wrong width are named, not an abort
    np.save(tmp_path / "bad.npy", np.zeros((3, 5), np.float32))
    rc = main(["draft-logits", "--draft", str(draft), "--target", str(target), "--features", str(tmp_path / "bad.npy"),
               "--tokens", tokens, "--out", str(tmp_path / "out3")])
    assert rc != 0
    assert "features are 5 wide" in capsys.readouterr().err


def test_run_draft_logits_failure_is_a_proof_error(tmp_path):
    from llamacpp_mla_port.proof.run.draft_logits import run_draft_logits
    fake = tmp_path / "fake"
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(ProofError, match="exit 3"):
        run_draft_logits(fake, tmp_path / "d", tmp_path / "t", np.zeros((1, 2)), [1], tmp_path / "o")


def test_run_draft_logits_failure_names_the_loaders_reason(tmp_path):
    # llama.cpp's ERROR line is echoed live and again in the log the program replays: named once
    from llamacpp_mla_port.proof.run.draft_logits import run_draft_logits
    reason = "llama_model_load: error loading model: error loading model hyperparameters: DFlash MLA draft: x = 2"
    fake = tmp_path / "fake"
    fake.write_text(f"#!/bin/sh\necho '{reason}' >&2\necho 'llama: info' >&2\necho '{reason}' >&2\n"
                    "echo 'draft-logits: error: cannot load draft d' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(ProofError) as err:
        run_draft_logits(fake, tmp_path / "d", tmp_path / "t", np.zeros((1, 2)), [1], tmp_path / "o")
    assert err.value.message == f"draft-logits failed (exit 1): {reason}\n  draft-logits: error: cannot load draft d"


@pytest.mark.build
def test_draft_logits_verb_names_why_llama_cpp_refused_the_draft(patched_tree, llama_build, tmp_path, capsys,
                                                                 monkeypatch):
    """Without --verbose the error says which key the loader refused, not only "cannot load draft"."""
    from llamacpp_mla_port.cli import main
    from llamacpp_mla_port.fixtures.draft_gguf import write_mla_draft_gguf
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target

    target = write_kimi_k3_target(llama_build, tmp_path / "target.gguf")
    draft = write_mla_draft_gguf(tmp_path / "scaled.gguf", target,
                                 config={"add_float_keys": {"dflash.attention.value_scale": 2.0}})
    np.save(tmp_path / "f.npy", np.zeros((2, 8), np.float32))
    monkeypatch.setenv("MLA_PORT_TREE", str(patched_tree))
    monkeypatch.setenv("MLA_PORT_BUILD", str(llama_build))
    rc = main(["draft-logits", "--draft", str(draft), "--target", str(target), "--features", str(tmp_path / "f.npy"),
               "--tokens", "7", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc != 0 and "cannot load draft" in err
    assert "dflash.attention.value_scale = 2 is not supported" in err, err


@pytest.mark.build
def test_target_features_command(patched_tree, llama_build, tmp_path, capsys):
    from llamacpp_mla_port.cli import main
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target

    target = write_kimi_k3_target(llama_build, tmp_path / "target.gguf")
    rc = main(["target-features", "--target", str(target), "--layers", "1,0", "--tokens", "4,8,15,16",
                               "--out", str(tmp_path / "tf"), "--tree", str(patched_tree), "--build", str(llama_build)])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["features_shape"] == [4, 2 * 128]
    rows = np.load(tmp_path / "tf" / "features.npy")
    # tap 1 is the input of layer 0: the token embeddings
    assert np.isfinite(rows).all() and np.abs(rows[:, 128:]).max() > 0
    rc = main(["target-features", "--target", str(target), "--layers", "7", "--tokens", "4",
                               "--out", str(tmp_path / "bad"), "--tree", str(patched_tree),
                               "--build", str(llama_build)])
    assert rc != 0
    assert "layer 7 out of range" in capsys.readouterr().err


@pytest.mark.parametrize("death, reruns", [("kill -ILL $$", True), ("kill -ABRT $$", True), ("exit 3", False)])
def test_a_program_killed_by_a_signal_reruns_with_extra_buffer_types_off(tmp_path, death, reruns):
    """Only a death by signal reruns (with --no-extra-bufts, and a note naming the signal); a
    program's own refusal (exit 3) is its answer, and a run that already had the flag is final."""
    from llamacpp_mla_port.proof.run.programs import NO_EXTRA_BUFTS, run_with_default_bufts
    prog = tmp_path / "prog"
    prog.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = {NO_EXTRA_BUFTS} ] && exit 0; done\n{death}\n')
    prog.chmod(0o755)
    proc, argv, note = run_with_default_bufts([prog, "--x"], timeout=30)
    assert (proc.returncode == 0) == reruns and (argv[-1] == NO_EXTRA_BUFTS) == reruns
    assert (note is not None) == reruns
    if reruns:
        assert death.split()[1][1:] in note and "--no-repack" in note
    proc, argv, note = run_with_default_bufts([prog, "--x", NO_EXTRA_BUFTS], timeout=30)
    assert proc.returncode == 0 and note is None and argv.count(NO_EXTRA_BUFTS) == 1
