"""A draft that does not fit its target is refused where the two meet, never aborted.

Each wrong pairing (tiny drafts from fixtures.draft_gguf against the tiny Kimi-K3 target of
2 layers, n_embd 128, 128 tokens) goes through llama-speculative-simple and llama-server:
both must exit non-zero (1, not 134/SIGABRT, no GGML_ASSERT) and say why, naming the values
of both models. A fitting draft is the control: it runs.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from llamacpp_mla_port.fixtures.draft_gguf import write_mla_draft_gguf, write_qwen3_draft_gguf
from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
from llamacpp_mla_port import process
from llamacpp_mla_port.proof.run.processes import LOCALHOST, Owned, free_port

pytestmark = pytest.mark.build

WHY = "the DFlash draft does not fit its target: "

#: case -> (writer, config, what the refusal must say)
CASES = {
    "tap-past-the-layers": ("mla", {"target_layers": [0, 3]},
                            ["dflash.target_layers = [0, 3]: layer 3 is outside the target (kimi-k3), "
                             "which has 2 layers"]),
    "tap-not-exposed": ("mla", {"target_layers": [0, 2]},
                        ["dflash.target_layers = [0, 2]: the target (kimi-k3) does not expose the input of layer 2 "
                         "(the output of its last layer)"]),
    "qwen3-tap-past-the-layers": ("qwen3", {"target_layers": [1, 5]},
                                  ["layer 5 is outside the target (kimi-k3), which has 2 layers"]),
    "width": ("mla", {"hidden_size": 64},
              ["draft n_embd = 64, the target (kimi-k3) n_embd = 128",
               "fc.weight takes 128 inputs, the target (kimi-k3) hands the draft 2 taps x 128 = 256"]),
    "qwen3-width": ("qwen3", {"hidden_size": 64}, ["draft n_embd = 64, the target (kimi-k3) n_embd = 128"]),
    "vocabulary": ("mla", {"extra_tokens": 8},
                   ["draft vocabulary = 136 tokens, the target (kimi-k3) vocabulary = 128 tokens: the draft's vocabulary must lie inside the target's",
                    "mask token 135 is outside the target (kimi-k3) vocabulary of 128 tokens"]),
    "no-mask-token": ("mla", {"drop_keys": ["tokenizer.ggml.mask_token_id"]},
                      ["the draft has no mask token (tokenizer.ggml.mask_token_id missing"]),
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


def speculative_simple(build: Path, target: Path, draft: Path):
    return process.run([build / "bin" / "llama-speculative-simple", "-m", target, "-md", draft,
                        "--spec-type", "draft-dspark", "-p", "hello world", "-n", "8", "--temp", "0",
                        "-c", "256", "-t", "1"], timeout=120, env={"GGML_NO_BACKTRACE": "1", "PATH": "/usr/bin:/bin"})


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
    proc = process.run([llama_build / "bin" / "llama-speculative-simple", "-m", models["target"],
                        "-md", models["drafts"]["fits"], "--spec-type", "draft-dspark", "-p", "the", "-n", "8",
                        "--temp", "0", "-c", "256", "-t", "1"], timeout=120, env={"GGML_NO_BACKTRACE": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "failed to decode the prompt" not in proc.stderr and "n_tokens == 0" not in proc.stderr, proc.stderr[-3000:]
    assert "n_predict = " in proc.stderr, proc.stderr[-3000:]       # the run reached its summary


@pytest.mark.parametrize("case", CASES)
def test_speculative_simple_refuses_with_the_reason(llama_build, models, case):
    proc = speculative_simple(llama_build, models["target"], models["drafts"][case])
    assert_clean_refusal(proc.returncode, proc.stderr, CASES[case][2])
    assert "failed to create the draft context" in proc.stderr


@pytest.mark.parametrize("case", CASES)
def test_server_refuses_at_start_up_with_the_reason(llama_build, models, case):
    log = models["dir"] / f"server-{case}.log"
    srv = Owned([llama_build / "bin" / "llama-server", "-m", models["target"], "-md", models["drafts"][case],
                 "--spec-type", "draft-dspark", "--host", LOCALHOST, "--port", str(free_port()), "-np", "2",
                 "-c", "512", "-t", "1", "--no-webui"], log, env={"GGML_NO_BACKTRACE": "1", "PATH": "/usr/bin:/bin"},
                name="llama-server")
    try:
        rc = srv.wait(120)
    finally:
        srv.stop()
    text = log.read_text(errors="replace")
    assert_clean_refusal(rc, text, CASES[case][2])
    assert "exiting due to model loading error" in text
