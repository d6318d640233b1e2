"""A draft that does not fit its target is refused where the pair is made, never aborted.

Each wrong pairing (tiny drafts from fixtures.draft_gguf against the tiny Kimi-K3 target of
2 layers, n_embd 128, 128 tokens) goes through llama-speculative-simple and llama-server:
both must exit 1 (not 134/SIGABRT, no GGML_ASSERT, no signal) and say why, naming the key,
the layer or the values of both models. The pair is checked in common/speculative.cpp before
the draft context exists (common_speculative_check_pair, in common_speculative_init_result). A
fitting draft is the control:
it runs. Drafts of the other kinds keep their own rules: a DFlash draft converted without a
mask token (as conversion/qwen.py writes one when the config has none) is refused for its
block, and EAGLE3 drafts of their own width, without a mask token, with repeated taps and a
d2t vocabulary run against upstream's tiny Qwen3 target and give the target's own text, while
those that would abort in their graph (own width without their own token_embd or output head, a
d2t that is not I64 or maps more tokens than the vocabulary, a wrong target_hidden_size) are
refused with exit 1 and the reason.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from llamacpp_mla_port.fixtures.checkpoint import write_target_tokenizer_dir
from llamacpp_mla_port.fixtures.draft_gguf import (
    _Tensors, _target_info, finish_gguf, write_mla_draft_gguf, write_qwen3_draft_gguf)
from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
from llamacpp_mla_port import process
from llamacpp_mla_port.proof.lossless import same_greedy_output, target_alone
from llamacpp_mla_port.proof.run.convert import run_converter
from llamacpp_mla_port.proof.run.processes import LOCALHOST, Owned, free_port

pytestmark = pytest.mark.build

WHY = "does not fit its target: "
ENV = {"GGML_NO_BACKTRACE": "1", "PATH": "/usr/bin:/bin"}

#: case -> (writer, config, what the refusal must say)
CASES = {
    "tap-past-the-layers": ("mla", {"target_layers": [0, 3]},
                            ["dflash.target_layers reads layer 3, the target has 2 layers"]),
    "tap-not-recorded": ("mla", {"target_layers": [0, 2]},
                         ["the kimi-k3 graph does not record the input of layer 2"]),
    "qwen3-tap-past-the-layers": ("qwen3", {"target_layers": [1, 5]},
                                  ["dflash.target_layers reads layer 5, the target has 2 layers"]),
    "width": ("mla", {"hidden_size": 64}, ["the draft's n_embd = 64, the target's n_embd = 128"]),
    "qwen3-width": ("qwen3", {"hidden_size": 64}, ["the draft's n_embd = 64, the target's n_embd = 128"]),
    "vocabulary": ("mla", {"extra_tokens": 8}, ["the draft's vocabulary has 136 tokens, the target's 128"]),
    "no-mask-token": ("mla", {"drop_keys": ["tokenizer.ggml.mask_token_id"]},
                      ["the draft has no mask token (tokenizer.ggml.mask_token_id)"]),
}


def _write(kind: str, path: Path, target: Path, config: dict) -> Path:
    if kind == "mla":
        return write_mla_draft_gguf(path, target, seed=1, config=config, check_width=False)
    return write_qwen3_draft_gguf(path, target, seed=1, config=config)


@pytest.fixture(scope="module")
def models(llama_build, tmp_path_factory):
    d = tmp_path_factory.mktemp("pairing")
    target = write_kimi_k3_target(llama_build, d / "kimi-k3-tiny.gguf")
    drafts = {name: _write(kind, d / f"{name}.gguf", target, cfg) for name, (kind, cfg, _) in CASES.items()}
    drafts["fits"] = _write("mla", d / "fits.gguf", target, {})
    return {"dir": d, "target": target, "drafts": drafts}


def speculative_simple(build: Path, target: Path, draft: Path, spec_type: str = "draft-dspark",
                       prompt: str = "hello world", extra: tuple = (), said=None):
    """One llama-speculative-simple run of the pair. common's logger is asynchronous and leaked on
    purpose (upstream #22142): a run's last lines may be lost when it returns. With `said` (a text, or
    a test on the log), a run that exits 1 without it is repeated, three runs at most."""
    said = (lambda text, want=said: want in text) if isinstance(said, str) else said
    for _ in range(3 if said else 1):
        proc = process.run([build / "bin" / "llama-speculative-simple", "-m", target, "-md", draft,
                            "--spec-type", spec_type, "-p", prompt, "-n", "8", "--temp", "0", "--top-k", "1",
                            "-c", "256", "-t", "1", *extra], timeout=120, env=ENV)
        if said is None or proc.returncode != 1 or said(proc.stderr):
            break
    return proc


def refusal(build: Path, target: Path, draft: Path, spec_type: str = "draft-dspark"):
    """One refused run, its reason read through the logger (speculative_simple's `said`)."""
    return speculative_simple(build, target, draft, spec_type, said=WHY)


def server_exit(build: Path, target: Path, draft: Path, log: Path, *args) -> tuple[int, str]:
    """llama-server with the pair, expected to exit at start-up: (exit code, its log); stopped either way."""
    srv = Owned([build / "bin" / "llama-server", "-m", target, "-md", draft, "--spec-type", "draft-dspark",
                 "--host", LOCALHOST, "--port", str(free_port()), "-c", "512", "-t", "1", "--no-webui", *args],
                log, env=ENV, name="llama-server")
    try:
        rc = srv.wait(120)
    finally:
        srv.stop()
    return rc, log.read_text(errors="replace")


def assert_clean_refusal(rc: int, log: str, needles: list[str]) -> None:
    assert rc == 1, f"exit {rc} (SIGABRT is {-signal.SIGABRT} / 134):\n{log[-3000:]}"
    assert "GGML_ASSERT" not in log and "core dumped" not in log, log[-3000:]
    assert WHY in log, log[-3000:]
    for needle in needles:
        assert needle in log, f"{needle!r} not in:\n{log[-3000:]}"


def test_a_fitting_draft_runs(llama_build, models):
    proc = speculative_simple(llama_build, models["target"], models["drafts"]["fits"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert WHY not in proc.stderr


def test_a_one_token_prompt_runs(llama_build, models):
    """A one-token prompt ("the": the test tokenizer cuts 5 characters a token, no BOS) leaves an
    empty first batch; that is not a failed decode, and generation goes on as on the base."""
    proc = speculative_simple(llama_build, models["target"], models["drafts"]["fits"], prompt="the")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "failed to decode the prompt" not in proc.stderr and "n_tokens == 0" not in proc.stderr, proc.stderr[-3000:]
    assert "n_predict = " in proc.stderr, proc.stderr[-3000:]       # the run reached its summary


@pytest.mark.parametrize("case", CASES)
def test_speculative_simple_refuses_with_the_reason(llama_build, models, case):
    proc = refusal(llama_build, models["target"], models["drafts"][case])
    assert_clean_refusal(proc.returncode, proc.stderr, CASES[case][2])


@pytest.mark.parametrize("case", CASES)
def test_server_refuses_at_start_up_with_the_reason(llama_build, models, case):
    rc, text = server_exit(llama_build, models["target"], models["drafts"][case], models["dir"] / f"server-{case}.log",
                           "-np", "2")
    assert_clean_refusal(rc, text, CASES[case][2])
    assert "exiting due to model loading error" in text


UBATCH = "n_ubatch = 4 cannot hold the last n_rs_seq + 1 = 4 tokens of a sequence"


def test_a_small_ubatch_is_refused_with_the_reason_never_aborted(llama_build, models):
    """The Kimi-K3 target keeps KDA states for the draft's rollback (n_rs_seq = the draft length, 3
    here): an -ub at or below n_rs_seq + 1 is refused where the context is made (the base aborts in
    split_equal, exit 134), by llama-speculative-simple and llama-server alike; -ub 5 runs, and -b 1
    with no draft tokens gets as far as the example's own prompt check (the base aborted in common's
    sequence-removal probe before it)."""
    small = ("-ub", "4", "-b", "4", "--spec-draft-n-max", "3")
    proc = speculative_simple(llama_build, models["target"], models["drafts"]["fits"], extra=small, said=UBATCH)
    assert proc.returncode == 1 and UBATCH in proc.stderr and "use n_ubatch >= 5" in proc.stderr, proc.stderr[-3000:]
    assert "GGML_ASSERT" not in proc.stderr and "core dumped" not in proc.stderr
    ok = speculative_simple(llama_build, models["target"], models["drafts"]["fits"],
                            extra=("-ub", "5", "-b", "5", "--spec-draft-n-max", "3"))
    assert ok.returncode == 0, ok.stderr[-3000:]
    prompt_check = "the prompt exceeds the batch size (3 tokens, batch 1)"
    one = speculative_simple(llama_build, models["target"], models["drafts"]["fits"],
                             extra=("-ub", "1", "-b", "1", "--spec-draft-n-max", "0"), said=prompt_check)
    assert one.returncode == 1 and prompt_check in one.stderr, \
        one.stderr[-3000:]
    rc, text = server_exit(llama_build, models["target"], models["drafts"]["fits"],
                           models["dir"] / "server-small-ubatch.log", "-np", "2", *small)
    assert rc == 1 and UBATCH in text and "GGML_ASSERT" not in text, text[-3000:]


STEP = re.compile(r"draft candidate\s+([01]), pos\s+0:\s+(-?\d+) \(\s*([\d.]+)\)|accepted (\d+)/(\d+) draft tokens"
                  r"|n_past = (\d+)")


def first_drafts(log: str) -> dict[int, tuple]:
    """llama-speculative-simple -lv 5, one sequence: per step that drafted, by its first position, the
    first drafted token, its probability, the runner-up's and whether the step before did not draft."""
    out, first, acc, idle = {}, [], (0, 0), False
    for cand, tok, p, a, b, n_past in (m.groups() for m in STEP.finditer(log)):
        if cand is not None:
            first = [int(tok), float(p)] if cand == "0" else first + [float(p)]
        elif a is not None:
            acc = (int(a), int(b))
        else:
            if acc[1] > 0 and len(first) == 3:
                out[int(n_past) - acc[0] - 1] = (*first, idle)
            idle, first = acc[1] == 0, []
    return out


def test_auto_stops_drafting_a_draft_the_target_never_accepts(llama_build, models):
    """--spec-draft-auto (spec-auto-length) with a random draft the target does not accept: over 128
    tokens llama-speculative-simple drafts under a quarter of what a static draft of 4 drafts, and
    llama-server (one slot, four requests in a row) drafts in the first request, then a few probe
    tokens in the other three (measured: one each; a probe after 16 steps without a draft, 32, 64
    after rejected ones; the bound leaves room for noisy step times on a loaded machine).
    A probe (one token, so a block of one) drafts from the target rows kept while not drafting and
    injected in one batch: its token and probability are those a static draft of 1 drafted at the same
    position (rows zeroed before the injection: all three probes differ)."""
    from llamacpp_mla_port.proof.lossless import Server
    draft = models["drafts"]["fits"]
    drafted, logs = {}, {}
    for name, extra in (("static", ("--spec-draft-n-max", "4")), ("one", ("--spec-draft-n-max", "1")),
                        ("auto", ("--spec-draft-n-max", "4", "--spec-draft-auto"))):
        for _ in range(3):      # common's asynchronous logger may still hold the statistics at exit
            proc = speculative_simple(llama_build, models["target"], draft, extra=("-n", "128", "-lv", "5", *extra))
            assert proc.returncode == 0, proc.stderr[-3000:]
            if "n_accept" in proc.stderr + proc.stdout:
                break
        logs[name] = proc.stderr + proc.stdout
        drafted[name] = int(re.search(r"n_drafted\s*=\s*(\d+)", logs[name]).group(1))
        accepted = int(re.search(r"n_accept\s*=\s*(\d+)", logs[name]).group(1))
        assert accepted <= drafted[name] // 10, (name, accepted, drafted)
    print("\nllama-speculative-simple, 128 tokens, drafted:", drafted)
    assert drafted["static"] >= 200 and 0 < drafted["auto"] < drafted["static"] / 4, drafted
    static, auto = first_drafts(logs["one"]), first_drafts(logs["auto"])
    probes = {pos: (auto[pos], static.get(pos)) for pos, d in auto.items() if d[3]}
    print("probes (position: auto, a static draft of 1):", probes)
    assert len(probes) >= 2 and "rows kept while not drafting, injected" in logs["auto"], probes
    for pos, (a, s) in probes.items():      # printed to 3 decimals; a near tie may flip the token
        assert s is not None and abs(a[1] - s[1]) <= 0.002 and (a[0] == s[0] or s[1] - s[2] <= 0.005), (pos, a, s)
    with Server(llama_build, models["target"], draft, 4, True, 0.0, models["dir"] / "auto.log", parallel=1,
                threads=1, extra=["--spec-draft-auto"], env=ENV) as srv:
        per_request = [srv.complete("hello world", 48)["timings"].get("draft_n", 0) for _ in range(4)]
    print("llama-server, four requests of 48 tokens, drafted:", per_request)
    assert per_request[0] > 0 and sum(per_request[1:]) <= 6, per_request


def test_a_batch_that_cannot_hold_every_slots_draft_is_refused_by_the_server(llama_build, models):
    """llama-server -np 4 -b 8 with a draft of 3: four slots drafting in one step need 16 places (the
    pin aborts in GGML_ASSERT(add_ok) or in the draft's get_sub_batch); -b 16 -ub 8: the draft's four
    blocks attend non-causally and need one ubatch of 16 (the pin aborts in llama_context::decode);
    both now refused at load. -ub = -b 16 answers four requests at once."""
    from llamacpp_mla_port.proof.lossless import Server
    refusals = {("8", "8"): "n_batch = 8 cannot hold the sampled token and a draft of 3 for each of 4 slots: "
                            "use -b >= 16",
                ("8", "16"): "n_ubatch = 8 cannot hold the DFlash draft blocks of 4 slots at once (a draft of 3 "
                             "each): use -ub >= 16"}
    for name in ("fits", "qwen3-fits"):
        draft = models["drafts"]["fits"] if name == "fits" else _qwen3_fits(models)
        for (ub, b), said in refusals.items():
            rc, text = server_exit(llama_build, models["target"], draft, models["dir"] / f"share-{name}-{ub}-{b}.log",
                                   "--spec-draft-n-max", "3", "-np", "4", "-ub", ub, "-b", b)
            assert rc == 1 and said in text and "GGML_ASSERT" not in text, text[-3000:]
        srv = Server(llama_build, models["target"], draft, 3, True, 0.0, models["dir"] / f"share16-{name}.log",
                     parallel=4, threads=1, extra=["-ub", "16", "-b", "16"], env=ENV)
        try:
            answers = srv.complete_all(["hello world"] * 4, 8, parallel=4)
        finally:
            srv.close()
        assert all(a["tokens_predicted"] > 0 for a in answers), answers


@pytest.mark.slow
def test_the_flags_a_user_combines_with_a_draft_end_in_output_or_a_reason(llama_build, models):
    """The sweep of the 2026-12-06 issue: -ub = -b 1, 3, 4, 5, 8 x -c 16, 64 x --spec-draft-n-max 0, 1,
    4, 9, for the MLA and the Qwen3-style drafts (block 4). Every run exits 0, or 1 with an error line,
    never a signal (on the base 44 of the 80 aborted). Prints the table docs/proof.md shows."""
    drafts = {"mla": models["drafts"]["fits"],
              "qwen3": _qwen3_fits(models)}
    rows, bad = [], []
    for name, draft in drafts.items():
        for ub in (1, 3, 4, 5, 8):
            for ctx in (16, 64):
                cells = []
                for n_max in (0, 1, 4, 9):
                    proc = _sweep_run(llama_build, models["target"], draft, "-c", str(ctx), "-ub", str(ub), "-b",
                                      str(ub), "--spec-draft-n-max", str(n_max))
                    cells.append(str(proc.returncode))
                    clean = proc.returncode == 0 or (proc.returncode == 1 and _said(proc.stderr))
                    if not clean or "GGML_ASSERT" in proc.stderr:
                        bad.append((name, ub, ctx, n_max, proc.returncode, proc.stderr[-600:]))
                rows.append(f"| {name} | {ub} | {ctx} | " + " | ".join(cells) + " |")
    print("\n| draft | -ub = -b | -c | n-max 0 | 1 | 4 | 9 |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    assert not bad, bad[:3]


def _qwen3_fits(models) -> Path:
    """A fitting Qwen3-style draft beside the MLA one (written once per module)."""
    path = models["dir"] / "qwen3-fits.gguf"
    return path if path.is_file() else _write("qwen3", path, models["target"], {})


def _sweep_run(llama_build: Path, target: Path, draft: Path, *flags: str):
    """One llama-speculative-simple run of the flag sweeps; a refusal must say why."""
    return speculative_simple(llama_build, target, draft, extra=flags, said=_said)


def _said(text: str) -> bool:
    return bool(re.search(r"(^|\n)[\d.]+ E ", text)) or "error" in text.lower()


@pytest.mark.slow
def test_the_cache_and_slot_flags_end_in_output_or_a_reason(llama_build, models):
    """The rest of the issue's sweep, over the MLA and the Qwen3-style drafts (block 4): -fa on/off x
    -ctk = -ctv f16, bf16, q8_0 x -ub = -b 4, 5, 8 x --spec-draft-n-max 4, 9 in llama-speculative-simple,
    and llama-server with -np 1-4 x -ub = -b 4, 8 x n-max 3, 9 (with -fa on, q8_0 cache), each slot
    answering one request at once. Every run ends in output, or exit 1 with an error line."""
    drafts = {"mla": models["drafts"]["fits"],
              "qwen3": _qwen3_fits(models)}
    rows, bad = [], []
    for name, draft in drafts.items():
        for fa in ("on", "off"):
            for ctk in ("f16", "bf16", "q8_0"):
                cells = []
                for ub in (4, 5, 8):
                    for n_max in (4, 9):
                        proc = _sweep_run(llama_build, models["target"], draft, "-c", "64", "-fa", fa, "-ctk", ctk,
                                          "-ctv", ctk, "-ub", str(ub), "-b", str(ub), "--spec-draft-n-max", str(n_max))
                        cells.append(str(proc.returncode))
                        if not (proc.returncode == 0 or (proc.returncode == 1 and _said(proc.stderr))) \
                                or "GGML_ASSERT" in proc.stderr:
                            bad.append((name, fa, ctk, ub, n_max, proc.returncode, proc.stderr[-600:]))
                rows.append(f"| speculative-simple | {name} | -fa {fa} -ctk/-ctv {ctk} | " + " ".join(cells) + " |")
        for n_par in (1, 2, 3, 4):
            cells = []
            for ub in (4, 8):
                for n_max in (3, 9):
                    log = models["dir"] / f"sweep-{name}-{n_par}-{ub}-{n_max}.log"
                    cells.append(_server_sweep_run(llama_build, models["target"], draft, log, n_par, ub, n_max, bad))
            rows.append(f"| llama-server | {name} | -np {n_par} | " + " ".join(cells) + " |")
    print("\n| program | draft | flags | exit per -ub 4, 5, 8 x n-max 4, 9 (server: -ub 4, 8 x n-max 3, 9) |"
          "\n|---|---|---|---|\n" + "\n".join(rows))
    assert not bad, bad[:3]


def _server_sweep_run(llama_build, target, draft, log, n_par, ub, n_max, bad) -> str:
    """One llama-server of the sweep: "ok" when every slot answers, else its exit code (1 with an
    error line is a refusal); anything else goes into `bad`."""
    from llamacpp_mla_port.proof.lossless import Server
    from llamacpp_mla_port.errors import ProofError
    try:
        srv = Server(llama_build, target, draft, n_max, True, 0.0, log, parallel=n_par, threads=1,
                     extra=["-ub", str(ub), "-b", str(ub), "-ctk", "q8_0", "-ctv", "q8_0"], load_timeout=120, env=ENV)
    except ProofError as err:
        text = log.read_text(errors="replace")
        rc = re.search(r"exited with (-?\d+)", str(err))
        if rc is None or rc.group(1) != "1" or not _said(text) or "GGML_ASSERT" in text:
            bad.append(("server", n_par, ub, n_max, str(err)[:200], text[-600:]))
        return rc.group(1) if rc else "?"
    try:
        answers = srv.complete_all(["hello world"] * n_par, 8, parallel=n_par)
        if any(not a.get("content") and a.get("tokens_predicted", 0) == 0 for a in answers):
            bad.append(("server", n_par, ub, n_max, "an empty answer"))
        return "ok"
    except Exception as err:      # a failed request is a finding, not a crash of the test
        bad.append(("server", n_par, ub, n_max, str(err)[-600:]))
        return "fail"
    finally:
        srv.close()


# ------------------------------------------------------------------------------------------
# a DFlash draft converted without a mask token, as upstream's converter writes it

def _dflash_checkpoint(out: Path, mask_token_id: int | None) -> Path:
    """A tiny Qwen3-style DFlashDraftModel checkpoint, tapping target layer 0 (GGUF layer 1)."""
    import torch
    from safetensors.torch import save_file

    n_embd, n_head, n_kv, hd, n_ff = 128, 4, 2, 32, 192
    dflash = {"target_layer_ids": [0], "block_size": 4}
    if mask_token_id is not None:
        dflash["mask_token_id"] = mask_token_id
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": n_embd,
              "num_hidden_layers": 1, "num_attention_heads": n_head, "num_key_value_heads": n_kv, "head_dim": hd,
              "intermediate_size": n_ff, "rms_norm_eps": 1e-6, "vocab_size": 128, "rope_theta": 1000000.0,
              "max_position_embeddings": 4096, "tie_word_embeddings": False, "dflash_config": dflash}
    shapes = {"model.fc.weight": (n_embd, n_embd), "model.hidden_norm.weight": (n_embd,),
              "model.norm.weight": (n_embd,)}
    p = "model.layers.0."
    shapes.update({p + "input_layernorm.weight": (n_embd,), p + "post_attention_layernorm.weight": (n_embd,),
                   p + "self_attn.q_proj.weight": (n_head * hd, n_embd), p + "self_attn.k_proj.weight": (n_kv * hd, n_embd),
                   p + "self_attn.v_proj.weight": (n_kv * hd, n_embd), p + "self_attn.o_proj.weight": (n_embd, n_head * hd),
                   p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                   p + "mlp.gate_proj.weight": (n_ff, n_embd), p + "mlp.up_proj.weight": (n_ff, n_embd),
                   p + "mlp.down_proj.weight": (n_embd, n_ff)})
    gen = torch.Generator().manual_seed(3)
    tensors = {name: (torch.ones(shape) if len(shape) == 1 else 0.05 * torch.randn(shape, generator=gen))
               for name, shape in shapes.items()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def converted_dflash(patched_tree, tmp_path_factory):
    d = tmp_path_factory.mktemp("dflash-mask")
    tokenizer = write_target_tokenizer_dir(d / "target-tokenizer", {"vocab_size": 128, "hidden_size": 128})
    out = {}
    for name, mask in (("no-mask", None), ("mask", 127)):
        ckpt = _dflash_checkpoint(d / f"ckpt-{name}", mask)
        out[name] = run_converter(patched_tree, ckpt, d / f"dflash-{name}.gguf", tokenizer).out_gguf
    return out


def test_a_dflash_draft_converted_without_a_mask_token_is_refused_for_its_block(llama_build, models,
                                                                               converted_dflash):
    """conversion/qwen.py writes tokenizer.ggml.mask_token_id only when dflash_config has one; the
    DFlash block puts the mask token at every position after the anchor, so such a pair is refused
    (on the base it ran and every draft decode failed on token -1). The same checkpoint with a mask
    token is the control: it drafts."""
    from gguf import GGUFReader

    assert "tokenizer.ggml.mask_token_id" not in GGUFReader(str(converted_dflash["no-mask"])).fields
    assert GGUFReader(str(converted_dflash["mask"])).fields["tokenizer.ggml.mask_token_id"].contents() == 127
    proc = refusal(llama_build, models["target"], converted_dflash["no-mask"], "draft-dflash")
    assert_clean_refusal(proc.returncode, proc.stderr,
                         ["the draft has no mask token (tokenizer.ggml.mask_token_id) for the block positions"])
    ok = speculative_simple(llama_build, models["target"], converted_dflash["mask"], "draft-dflash")
    assert ok.returncode == 0, ok.stderr[-3000:]
    drafted = re.search(r"n_drafted\s*=\s*(\d+)", ok.stderr)
    assert drafted is None or int(drafted.group(1)) > 0, ok.stderr[-3000:]   # the logger may drop the summary


# ------------------------------------------------------------------------------------------
# EAGLE3 drafts in issue 30's layouts keep their own rules

#: layout -> (draft n_embd or None for the target's, its own token_embd and output, d2t size)
EAGLE3_LAYOUTS = {
    "target-width": (None, False, 0),
    "own-width": (128, True, 0),
    "d2t": (128, True, 64),
}


def _write_eagle3(path: Path, target: Path, n_embd: int | None, own: bool, n_d2t: int, own_output: bool | None = None,
                  d2t_dtype=np.int64, hidden: int | None = None) -> Path:
    """An EAGLE3 GGUF with random weights, no mask token, taps [0, 1, 1] of a 2-layer target;
    `own`: its own token_embd and (unless own_output says otherwise) output head; `hidden`: the
    target_hidden_size it declares (default the target's n_embd)."""
    import gguf

    n_embd_tgt, n_vocab, tok_kvs = _target_info(target)
    n_embd = n_embd or n_embd_tgt
    own_output = own if own_output is None else own_output
    n_head, n_kv, n_ff, n_out = 4, 1, 256, n_d2t or n_vocab
    hd = n_embd // n_head
    writer = gguf.GGUFWriter(str(path) + ".tmp", arch="eagle3")
    for key, value in (("context_length", 4096), ("embedding_length", n_embd), ("block_count", 1),
                       ("feed_forward_length", n_ff), ("attention.head_count", n_head),
                       ("attention.head_count_kv", n_kv), ("target_hidden_size", hidden or n_embd_tgt)):
        writer.add_uint32(f"eagle3.{key}", value)
    writer.add_float32("eagle3.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_array("eagle3.target_layers", [0, 1, 1])
    for key, value, vtype, sub_type in tok_kvs:
        if key != "tokenizer.ggml.mask_token_id":
            writer.add_key_value(key, value, vtype, sub_type)
    t = _Tensors(7, 0.05)
    t.linear("fc.weight", (n_embd, 3 * (hidden or n_embd_tgt)))
    t.norm("output_norm.weight", n_embd)
    if own:
        t.linear("token_embd.weight", (n_vocab, n_embd))
    if own_output:
        t.linear("output.weight", (n_out, n_embd))
    for name in ("attn_norm", "attn_norm_2", "ffn_norm"):
        t.norm(f"blk.0.{name}.weight", n_embd)
    for name, shape in (("attn_q", (n_head * hd, 2 * n_embd)), ("attn_k", (n_kv * hd, 2 * n_embd)),
                        ("attn_v", (n_kv * hd, 2 * n_embd)), ("attn_output", (n_embd, n_head * hd)),
                        ("ffn_gate", (n_ff, n_embd)), ("ffn_up", (n_ff, n_embd)), ("ffn_down", (n_embd, n_ff))):
        t.linear(f"blk.0.{name}.weight", shape)
    for name, arr in t.items:
        writer.add_tensor(name, arr)
    if n_d2t:
        writer.add_tensor("d2t", np.arange(0, 2 * n_d2t, 2).astype(d2t_dtype))
    return finish_gguf(writer, Path(str(path) + ".tmp"), path)


@pytest.fixture(scope="module")
def qwen3_target(llama_build, tmp_path_factory):
    d = tmp_path_factory.mktemp("eagle3")
    proc = process.run([llama_build / "bin" / "test-llama-archs", "-a", "qwen3", "-s", "42", "-o", d], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return d / "qwen3-dense.gguf"


@pytest.mark.parametrize("layout", EAGLE3_LAYOUTS)
def test_eagle3_drafts_keep_their_own_rules(llama_build, qwen3_target, tmp_path, layout):
    """Its own width, no mask token, a repeated tap and a d2t vocabulary: the pair check leaves an
    EAGLE3 draft running as on the base, and speculative decoding gives the target's own text."""
    draft = _write_eagle3(tmp_path / f"eagle3-{layout}.gguf", qwen3_target, *EAGLE3_LAYOUTS[layout])
    prompt = "hello world"
    proc = speculative_simple(llama_build, qwen3_target, draft, "draft-eagle3", prompt)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert WHY not in proc.stderr, proc.stderr[-3000:]
    alone = target_alone(llama_build, qwen3_target, prompt, n_predict=8)
    assert same_greedy_output(proc.stdout.strip(), alone), (proc.stdout, alone)


#: layout -> (_write_eagle3's arguments, what the refusal must say); the Qwen3 target: n_embd 256,
#: 128 tokens. The loader refuses a draft it cannot run; the pair check, one its target cannot
EAGLE3_REFUSED = {
    "own-width-no-token-embd": ((128, False, 0, True), ["EAGLE3 draft: n_embd = 128, eagle3.target_hidden_size = ",
                                                       "needs its own token_embd.weight"]),
    "own-width-no-output": ((128, True, 0, False), ["EAGLE3 draft: n_embd = 128, eagle3.target_hidden_size = ",
                                                   "needs its own output.weight"]),
    "d2t-not-i64": ((128, True, 64, None, np.int32), ["EAGLE3 draft: d2t is i32 with 64 entries, expected I64"]),
    "d2t-past-the-vocabulary": ((128, True, 160), ["EAGLE3 draft: d2t is i64 with 160 entries, expected I64 with "
                                                   "at most 128 (the vocabulary)"]),
    "hidden-size": ((128, True, 0, None, np.int64, 64), ["eagle3.target_hidden_size = 64, the target's n_embd = "]),
}


@pytest.mark.parametrize("layout", EAGLE3_REFUSED)
def test_eagle3_drafts_that_cannot_run_are_refused_with_the_reason(llama_build, qwen3_target, tmp_path, layout):
    """What aborted in the EAGLE3 graph (a shape assert, the d2t asserts) ends in exit 1 and a
    line naming the tensor or key: at load for the draft's own file, at pairing for the pair."""
    args, needles = EAGLE3_REFUSED[layout]
    draft = _write_eagle3(tmp_path / f"eagle3-{layout}.gguf", qwen3_target, *args)
    proc = speculative_simple(llama_build, qwen3_target, draft, "draft-eagle3",
                              said=lambda text: all(n in text for n in needles))
    assert proc.returncode == 1, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert "GGML_ASSERT" not in proc.stderr and "core dumped" not in proc.stderr, proc.stderr[-3000:]
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in:\n{proc.stderr[-3000:]}"
