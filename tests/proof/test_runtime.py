"""The patched llama.cpp runtime: tiny MLA DSpark draft against a tiny Kimi-K3 target.

Everything is offline and seeded: the target is written by llama.cpp's own
test-llama-archs, the drafts by fixtures/draft_gguf.py (not by the converter). Numbers
asserted here come from llama.cpp's own output (its log lines and generated text), never
from a value the test computed and then "checked" against itself.
"""

from __future__ import annotations

import collections
import math
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from llamacpp_mla_port.fixtures.draft_gguf import (mla_draft_config, write_mla_draft_gguf,
                                                   write_qwen3_draft_gguf)
from llamacpp_mla_port.fixtures.target import write_kimi_k3_target

pytestmark = pytest.mark.build

PROMPT = "hello world"
N_PREDICT = 48
CTX = 512


@dataclass
class Run:
    rc: int
    text: str          # generated text (prompt echo + tokens), whitespace-stripped
    log: str           # stderr
    draft_log: str     # the part of the log after the draft model starts loading

    def stat(self, name: str) -> int:
        m = re.search(rf"\b{name}\s*=\s*(\d+)", self.log)
        assert m, f"llama-speculative-simple printed no {name}:\n{self.log[-3000:]}"
        return int(m.group(1))

    def target_ids(self) -> list[int]:
        """The target's tokens, one per speculative step (printed at -v)."""
        return [int(x) for x in re.findall(r"the last target token is: \((\d+)\)", self.log)]


def _bin(build: Path, name: str) -> Path:
    exe = build / "bin" / name
    assert exe.is_file(), f"{exe} missing: the build fixture must build {name}"
    return exe


def run_speculative(build: Path, target: Path, draft: Path, verbose: bool = False, timeout: int = 300) -> Run:
    cmd = [str(_bin(build, "llama-speculative-simple")), "-m", str(target), "-md", str(draft),
           "--spec-type", "draft-dspark", "-p", PROMPT, "-n", str(N_PREDICT), "--temp", "0",
           "-c", str(CTX), "-t", "2"]
    if verbose:
        cmd.append("-v")
    # common's asynchronous logger can lose the closing statistics under load (proof/lossless.py
    # repeats such a run too): a run that exits 0 without them is repeated, twice at most
    for _ in range(3):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or re.search(r"\bn_drafted\s*=", proc.stderr):
            break
    i = proc.stderr.find("loading draft model")
    return Run(proc.returncode, proc.stdout.strip(), proc.stderr, proc.stderr[i:] if i >= 0 else "")


def run_target_alone(build: Path, target: Path) -> str:
    proc = subprocess.run([str(_bin(build, "llama-simple")), "-m", str(target), "-n", str(N_PREDICT), PROMPT],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def assert_lossless(spec: Run, reference: str) -> None:
    assert spec.rc == 0, spec.log[-4000:]
    assert len(reference) > len(PROMPT) // 2, f"target produced nothing: {reference!r}"
    # speculative decoding may overshoot -n by up to the draft length: compare the prefix
    assert spec.text[:len(reference)] == reference, f"\nspeculative: {spec.text}\ntarget:      {reference}"


@pytest.fixture(scope="module")
def models(llama_build, tmp_path_factory):
    d = tmp_path_factory.mktemp("runtime-models")
    target = write_kimi_k3_target(llama_build, d / "kimi-k3-tiny.gguf")
    plain = write_mla_draft_gguf(d / "mla-draft.gguf", target, seed=1)
    return {"dir": d, "target": target, "mla": plain}


@pytest.fixture(scope="module")
def reference(llama_build, models):
    return run_target_alone(llama_build, models["target"])


@pytest.fixture(scope="module")
def plain_run(llama_build, models):
    return run_speculative(llama_build, models["target"], models["mla"], verbose=True)


@pytest.fixture(scope="module")
def repeated_token(plain_run):
    """The token the target emits most often (from llama.cpp's per-step log)."""
    ids = plain_run.target_ids()
    assert len(ids) >= N_PREDICT // 2, plain_run.log[-3000:]
    token, count = collections.Counter(ids).most_common(1)[0]
    assert count >= 2, f"the tiny target repeats no token: {ids}"
    return token


def test_mla_draft_loads_drafts_and_is_lossless(plain_run, reference):
    assert_lossless(plain_run, reference)
    assert "DFlash MLA backbone" in plain_run.draft_log
    assert plain_run.stat("n_drafted") > 0


def test_mla_draft_kv_cache_is_latent_plus_rope(plain_run):
    cfg = mla_draft_config()
    expected = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    log = plain_run.draft_log
    m = re.search(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers.*?"
                  r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB", log)
    assert m, f"no KV cache report for the draft:\n{log[:4000]}"
    cells, layers, k_type, k_mib, v_mib = int(m.group(2)), int(m.group(3)), m.group(4), float(m.group(5)), float(m.group(7))
    assert layers == cfg["num_hidden_layers"]
    assert v_mib == 0.0, "an MLA cache stores K only"
    width = re.search(r"n_embd_head_k_all = (\d+)", log)
    assert width, log[:4000]
    assert int(width.group(1)) == expected
    bytes_per = {"f16": 2, "bf16": 2, "f32": 4}[k_type]
    assert abs(k_mib - cells * layers * expected * bytes_per / 2**20) < 0.01


def test_mla_draft_uses_interleaved_rope(plain_run):
    # the attention scale depends on the context (attn_factor): test_parity's attn_factor test shows it
    log = plain_run.draft_log
    assert re.search(r"print_info: rope type\s+= 0\b", log), "MLA drafts rotate interleaved pairs (NORM = 0)"


def test_biased_mla_draft_gets_partial_acceptance(llama_build, models, reference, repeated_token):
    draft = write_mla_draft_gguf(models["dir"] / "mla-draft-biased.gguf", models["target"], seed=1,
                                 bias_token=repeated_token)
    run = run_speculative(llama_build, models["target"], draft)
    assert_lossless(run, reference)
    drafted, accepted = run.stat("n_drafted"), run.stat("n_accept")
    print(f"MLA draft biased to {repeated_token}: drafted {drafted}, accepted {accepted}")
    assert 0 < accepted < drafted


def test_mla_draft_with_kept_embeddings_loads(llama_build, models, reference):
    # no converter writes one, but a hand-made MLA draft may carry its own token_embd: it embeds
    # with it, and (since b11549 dropped the tie to token_embd) its head is the target's; lossless still
    draft = write_mla_draft_gguf(models["dir"] / "mla-draft-embd.gguf", models["target"], seed=1,
                                 keep_embeddings=True)
    run = run_speculative(llama_build, models["target"], draft)
    assert_lossless(run, reference)


@pytest.mark.parametrize("key", [None, "dflash.embedding_scale", "dflash.attention.value_scale",
                                 "dflash.attention.scale"])
def test_an_mla_draft_setting_a_scale_key_is_refused_naming_it(llama_build, models, key):
    """The Qwen3-style graph applies these scales and graph_mla none: an MLA draft that sets one is
    refused with the key's name, not run with it ignored. The control (no key) runs."""
    keys = {key: 2.0} if key else {}
    name = (key or "none").replace(".", "-")
    draft = write_mla_draft_gguf(models["dir"] / f"scale-{name}.gguf", models["target"], config={"add_float_keys": keys})
    run = run_speculative(llama_build, models["target"], draft, timeout=120)
    if key is None:
        assert run.rc == 0 and "is not supported" not in run.log, run.log[-3000:]
        return
    assert run.rc != 0
    assert f"DFlash MLA draft: {key} = 2 is not supported (the MLA graph does not apply it)" in run.log, run.log[-3000:]


def test_an_mla_draft_with_rope_sections_is_refused(llama_build, models):
    """graph_mla ropes with ggml_rope_ext, while M-RoPE sections would turn the draft's rope type to
    M-RoPE (llama_model_rope_type): refused, naming the key."""
    draft = write_mla_draft_gguf(models["dir"] / "sections.gguf", models["target"],
                                 config={"add_float_keys": {"dflash.rope.dimension_sections": [2, 0, 0, 0]}})
    run = run_speculative(llama_build, models["target"], draft, timeout=120)
    assert run.rc != 0
    assert "DFlash MLA draft: dflash.rope.dimension_sections is not supported" in run.log, run.log[-3000:]


@pytest.mark.parametrize("key,value,needle", [
    ("dflash.attention.key_length", 96, "dflash.attention.key_length = 96, expected 576"),
    ("dflash.attention.value_length", 576, "dflash.attention.value_length = 576, expected 512"),
    ("dflash.attention.head_count_kv", 2, "dflash.attention.head_count_kv = 2, expected 1"),
])
def test_inconsistent_mla_metadata_names_key_and_expected_value(llama_build, models, key, value, needle):
    draft = write_mla_draft_gguf(models["dir"] / f"bad-{key}.gguf", models["target"],
                                 config={"override_keys": {key: value}})
    run = run_speculative(llama_build, models["target"], draft, timeout=120)
    assert run.rc != 0
    assert needle in run.log


def test_yarn_without_log_multiplier_is_refused(llama_build, models):
    draft = write_mla_draft_gguf(models["dir"] / "bad-yarn.gguf", models["target"],
                                 config={"drop_keys": ["dflash.rope.scaling.yarn_log_multiplier"]})
    run = run_speculative(llama_build, models["target"], draft, timeout=120)
    assert run.rc != 0
    assert "dflash.rope.scaling.yarn_log_multiplier" in run.log


def test_qwen3_dspark_draft_still_runs(llama_build, models, reference, repeated_token):
    draft = write_qwen3_draft_gguf(models["dir"] / "qwen3-draft.gguf", models["target"], seed=2,
                                   bias_token=repeated_token)
    run = run_speculative(llama_build, models["target"], draft, verbose=True)
    assert_lossless(run, reference)
    assert "DFlash MLA backbone" not in run.draft_log
    assert re.search(r"print_info: rope type\s+= 2\b", run.draft_log), "Qwen3-style drafts stay NeoX"
    drafted, accepted = run.stat("n_drafted"), run.stat("n_accept")
    print(f"Qwen3 draft biased to {repeated_token}: drafted {drafted}, accepted {accepted}")
    assert 0 < accepted < drafted
    m = re.search(r"K \(\w+\): +([\d.]+) MiB, V \(\w+\): +([\d.]+) MiB", run.draft_log)
    assert m and float(m.group(2)) > 0, "the Qwen3-style cache keeps V"
