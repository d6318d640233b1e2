"""The real-size pair: the Kimi-K3-DSpark draft at its real config against a Kimi-K3 target
at the real n_embd and vocabulary. Everything is generated offline and seeded.

Design and bounds: docs/proof.md#realsize.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from llamacpp_mla_port.fixtures.realsize import write_real_width_target
from llamacpp_mla_port.fixtures.target import write_kimi_k3_target


def write_real_target(build: Path, out_dir: Path, seed: int = 0) -> Path:
    """The widened Kimi-K3 target (fixtures.realsize) from the build's tiny one; reused when present."""
    out = Path(out_dir) / "kimi-k3-real-width.gguf"
    if out.is_file():
        return out
    tiny = write_kimi_k3_target(build, Path(out_dir) / "kimi-k3-tiny.gguf")
    return write_real_width_target(tiny, out_dir, seed=seed)


def bigram_markov_head(bigrams: dict[int, int], vocab: int, rank: int, strength: float = 40.0) -> dict:
    """markov_w1/w2 that add `strength` to the logit of next after prev, one rank slot per prev.

    The vanilla head adds markov_w2 . markov_w1[prev] to every row's logits; with one-hot
    w1 rows and w2 = strength at the successor, the draft proposes the target's own greedy
    bigrams. More distinct prevs than `rank` slots: the first `rank` (by token id) are kept.
    """
    import torch

    w1 = torch.zeros(vocab, rank)
    w2 = torch.zeros(vocab, rank)
    for slot, prev in enumerate(sorted(bigrams)[:rank]):
        w1[prev, slot] = 1.0
        w2[bigrams[prev], slot] = strength
    return {"markov_head.markov_w1.weight": w1, "markov_head.markov_w2.weight": w2}


@dataclass
class RealDraft:
    gguf: Path
    checkpoint: Path | None
    convert_seconds: float
    convert_peak_rss_bytes: int
    write_seconds: float


def write_real_draft(tree: Path, out_dir: Path, config: dict, markov: dict | None = None, outtype: str = "bf16",
                     keep_checkpoint: bool = False, seed: int = 0) -> RealDraft:
    """Write the checkpoint streaming, convert it; the checkpoint is deleted unless kept.
    An existing GGUF (and checkpoint, when kept) in out_dir is reused: the writer is seeded."""
    from llamacpp_mla_port.fixtures.checkpoint import write_k3_dspark_checkpoint_streaming, write_target_tokenizer_dir
    from llamacpp_mla_port.proof.run.convert import run_converter

    out_dir = Path(out_dir)
    ckpt, out = out_dir / "checkpoint", out_dir / f"k3-dspark-real-{outtype}.gguf"
    if out.is_file() and (not keep_checkpoint or (ckpt / "model.safetensors").is_file()):
        return RealDraft(out, ckpt if keep_checkpoint else None, 0.0, 0, 0.0)     # reused
    t0 = time.monotonic()
    write_k3_dspark_checkpoint_streaming(ckpt, config, seed=seed, dtype="bfloat16", overrides=markov)
    write_seconds = time.monotonic() - t0
    tok = write_target_tokenizer_dir(out_dir / "target-tokenizer", config)
    run = run_converter(tree, ckpt, out, tok, extra_args=("--outtype", outtype))
    if not keep_checkpoint:
        shutil.rmtree(ckpt)
    return RealDraft(out, ckpt if keep_checkpoint else None, run.seconds, run.peak_rss_bytes, write_seconds)
