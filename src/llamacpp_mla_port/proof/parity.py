"""Logit parity of the patched llama.cpp draft against the float64 reference.

For each tiny draft shape (PARITY_CONFIGS) a random HF checkpoint with the real tensor
names is written (fixtures.checkpoint), converted by the patched tree's own converter (the
real path), and run by the `draft-logits` program on random target features; the
reference runs on the same checkpoint, the same target head and the same inputs.

Modes (thresholds from issue 5, NMSE = sum((a - e)^2) / sum(e^2)):

  f32         F32 weights, F32 KV cache, flash attention off       <= 1e-9
  f16-cache   F32 weights, F16 KV cache (default), FA off          <= 1e-6
  flash-attn  F32 weights, F16 KV cache, FA on (CPU), 1000 rows    <= 1e-4
  bf16        BF16 checkpoint converted to BF16, F16 cache, FA off <= 1e-3

Compared per case: Markov-biased logits (the reference conditioned on llama.cpp's own
chain, so a flipped near-tie does not smear every later row), base logits (llama.cpp's
final hidden x target head, see cpp/draft-logits.cpp), the final hidden state, confidence
values, and the greedy chain (equal, or differing first where the reference's top-2 margin
is a near-tie, which is reported). Positions past the YaRN original context are included.

Control figures: the same reference run CAUSALLY and WITHOUT YaRN, against the real one;
they show how far a wrong runtime would land from the thresholds (a parity figure is only
worth something if the mistakes it must catch move it by orders of magnitude).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.proof.reference import DraftOutputs, DraftReference, nmse


@dataclass(frozen=True)
class ParityConfig:
    """One tiny draft shape: overrides of fixtures.checkpoint.k3_dspark_config + block size."""

    name: str
    overrides: dict
    block_size: int


# hidden_size and vocab_size stay those of the tiny target; everything else varies
PARITY_CONFIGS: tuple[ParityConfig, ...] = (
    ParityConfig("h4-n8r8v8-l2-t3-b7", {
        "num_attention_heads": 4, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
        "q_lora_rank": 32, "kv_lora_rank": 16, "num_hidden_layers": 2, "target_layer_ids": [0, 1, 2],
        "rope_parameters": {"factor": 4.0, "original_max_position_embeddings": 64},
    }, block_size=7),
    ParityConfig("h2-n16r4v12-l3-t2-b4", {
        "num_attention_heads": 2, "qk_nope_head_dim": 16, "qk_rope_head_dim": 4, "v_head_dim": 12,
        "q_lora_rank": 24, "kv_lora_rank": 32, "num_hidden_layers": 3, "target_layer_ids": [0, 2],
        "intermediate_size": 80,
        "rope_parameters": {"factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 16.0},
    }, block_size=4),
    ParityConfig("h8-n4r16v4-l1-t4-b6", {
        "num_attention_heads": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 16, "v_head_dim": 4,
        "q_lora_rank": 16, "kv_lora_rank": 24, "num_hidden_layers": 1, "target_layer_ids": [0, 1, 2, 3],
        "intermediate_size": 112,
        "rope_parameters": {"factor": 32.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0,
                            "mscale_all_dim": 0.707},
        "rope_theta": 10000.0,
    }, block_size=6),
)


#: target layers every parity config's taps need (HF ids + 1 must be inputs of real layers)
TARGET_LAYERS_NEEDED = max(max(c.overrides["target_layer_ids"]) + 2 for c in PARITY_CONFIGS)


@dataclass(frozen=True)
class Mode:
    name: str
    weights: str           # checkpoint dtype and converter --outtype: "float32" or "bfloat16"
    cache_type: str
    flash_attn: bool
    threshold: float
    cases: tuple[tuple[int, int], ...]   # (first context position, number of context rows)


MODES: tuple[Mode, ...] = (
    Mode("f32", "float32", "f32", False, 1e-9, ((0, 6), (200, 48))),
    Mode("f16-cache", "float32", "f16", False, 1e-6, ((0, 6), (200, 48))),
    Mode("flash-attn", "float32", "f16", True, 1e-4, ((0, 48), (300, 1000))),
    Mode("bf16", "bfloat16", "f16", False, 1e-3, ((0, 6), (200, 48))),
)

_OUTTYPE = {"float32": "f32", "bfloat16": "bf16"}


# ---------------------------------------------------------------------------------------
# fixtures

def write_parity_checkpoint(out_dir: Path, config: dict, seed: int, dtype: str) -> Path:
    """fixtures.checkpoint's random checkpoint, rescaled so every part of the draft matters.

    The fixture's N(0, 0.02) weights leave the attention almost without effect at these
    sizes (a causal block then moves the logits by ~1e-5 only), which would let real
    mistakes pass the thresholds. Linear weights are rescaled to std 1/sqrt(fan_in) and
    the Markov rows to O(1) bias; norms stay near 1. The names, shapes and layout stay the
    fixture's.
    """
    import torch
    from safetensors.torch import load_file, save_file

    from llamacpp_mla_port.fixtures.checkpoint import write_k3_dspark_checkpoint

    out_dir = Path(out_dir)
    write_k3_dspark_checkpoint(out_dir, config, seed=seed, dtype="float32", keep_embeddings=False)
    path = out_dir / "model.safetensors"
    tensors = load_file(str(path))
    rank = config["markov_rank"]
    for name, t in tensors.items():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight") or t.ndim < 2:
            continue
        if name == "markov_head.markov_w1.weight":
            std = 1.0
        elif name == "markov_head.markov_w2.weight":
            std = 1.0 / math.sqrt(rank)
        else:
            std = 1.0 / math.sqrt(t.shape[1])
        tensors[name] = t * (std / 0.02)
    tensors = {k: v.to(getattr(torch, dtype)).contiguous() for k, v in tensors.items()}
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["torch_dtype"] = dtype
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(tensors, str(path), metadata={"format": "pt"})
    return out_dir


def hf_config(pcfg: ParityConfig, hidden: int, vocab: int) -> dict:
    from llamacpp_mla_port.fixtures.checkpoint import k3_dspark_config
    return k3_dspark_config(hidden_size=hidden, vocab_size=vocab, **pcfg.overrides)


def make_draft(tree: Path, work: Path, pcfg: ParityConfig, hidden: int, vocab: int, weights: str,
               seed: int = 0) -> tuple[Path, Path]:
    """(checkpoint dir, converted draft GGUF) for one config and weight dtype; reused when present."""
    from llamacpp_mla_port.fixtures.checkpoint import write_target_tokenizer_dir
    from llamacpp_mla_port.proof.convert import convert_checkpoint

    base = Path(work) / f"{pcfg.name}-{weights}"
    ckpt, gguf_path, tok = base / "checkpoint", base / "draft.gguf", base / "target-tokenizer"
    if gguf_path.is_file() and (ckpt / "model.safetensors").is_file():
        return ckpt, gguf_path
    config = hf_config(pcfg, hidden, vocab)
    write_parity_checkpoint(ckpt, config, seed=seed, dtype=weights)
    write_target_tokenizer_dir(tok, config, seed=seed)
    convert_checkpoint(tree, ckpt, gguf_path, tok,
                       extra_args=["--outtype", _OUTTYPE[weights], "--draft-block-size", str(pcfg.block_size)])
    return ckpt, gguf_path


# ---------------------------------------------------------------------------------------
# comparison

def _margin(row: np.ndarray) -> float:
    top = np.partition(row, -2)[-2:]
    return float(top[1] - top[0])


def compare(got, want: DraftOutputs, forced: DraftOutputs | None = None, threshold: float | None = None) -> dict:
    """NMSE of every output and the chain verdict; `forced` = the reference conditioned on got.chain."""
    forced = forced or want
    res = {
        "nmse_biased_logits": nmse(got.biased_logits, forced.biased_logits),
        "nmse_base_logits": nmse(got.base_logits, want.base_logits),
        "nmse_hidden": nmse(got.hidden, want.hidden),
        "chain": [int(t) for t in got.chain],
        "chain_reference": [int(t) for t in want.chain],
    }
    if want.confidence is not None:
        if got.confidence is None:
            raise ProofError("the reference has a confidence head but llama.cpp returned no confidence")
        res["nmse_confidence"] = nmse(got.confidence, forced.confidence)
        res["max_abs_confidence"] = float(np.max(np.abs(got.confidence - forced.confidence)))
    mismatch = [k for k in range(len(want.chain)) if int(got.chain[k]) != int(want.chain[k])]
    res["chain_equal"] = not mismatch
    if mismatch:
        k = mismatch[0]
        rms = float(np.sqrt(np.mean(want.biased_logits[k] ** 2)))
        res["chain_first_mismatch"] = k
        res["chain_reference_margin"] = _margin(want.biased_logits[k]) / rms
    if threshold is not None:
        tie_tol = 4.0 * math.sqrt(threshold)
        res["chain_ok"] = res["chain_equal"] or res["chain_reference_margin"] < tie_tol
        worst = max(v for k, v in res.items() if k.startswith("nmse_"))
        res["worst_nmse"] = worst
        res["pass"] = bool(worst <= threshold and res["chain_ok"])
    return res


def controls(ref: DraftReference, feats: np.ndarray, ids, positions, block_pos0) -> dict:
    """How far typical runtime mistakes move the reference's own logits (see module doc)."""
    want = ref.forward(feats, ids, ctx_positions=positions, block_pos0=block_pos0)
    causal = ref.forward(feats, ids, ctx_positions=positions, block_pos0=block_pos0, causal=True)
    no_yarn = DraftReference.__new__(DraftReference)
    no_yarn.__dict__.update(ref.__dict__)
    no_yarn.config = dataclasses.replace(ref.config, rope=dataclasses.replace(ref.config.rope, yarn=False))
    plain = no_yarn.forward(feats, ids, ctx_positions=positions, block_pos0=block_pos0)
    return {"causal_block": nmse(causal.base_logits, want.base_logits),
            "no_yarn": nmse(plain.base_logits, want.base_logits)}


# ---------------------------------------------------------------------------------------
# driver

TargetFactory = Callable[[int, int, int], Path]   # (hidden, vocab, n_layer_min) -> target GGUF


@dataclass
class ParityResult:
    report: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(case["pass"] for cfg in self.report["configs"].values()
                   for mode in cfg["modes"].values() for case in mode["cases"])


def run_parity(tree: Path, build: Path, work: Path, target_for: TargetFactory, hidden: int, vocab: int,
               configs=PARITY_CONFIGS, modes=MODES, threads: int = 2, seed: int = 0, log=print) -> ParityResult:
    from llamacpp_mla_port.proof.draft_logits import run_draft_logits
    from llamacpp_mla_port.proof.programs import compile_program

    binary = compile_program("draft-logits", tree, build)
    work = Path(work)
    report: dict = {"configs": {}}
    for pcfg in configs:
        n_layer_min = max(pcfg.overrides["target_layer_ids"]) + 2
        target = target_for(hidden, vocab, n_layer_min)
        entry: dict = {"overrides": pcfg.overrides, "block_size": pcfg.block_size, "modes": {}}
        refs: dict[str, DraftReference] = {}
        for mode in modes:
            ckpt, draft = make_draft(tree, work, pcfg, hidden, vocab, mode.weights, seed=seed)
            if mode.weights not in refs:
                refs[mode.weights] = DraftReference.load(ckpt, target)
            ref = refs[mode.weights]
            cases = []
            for ci, (pos0, n_ctx) in enumerate(mode.cases):
                rng = np.random.default_rng([seed, ci, n_ctx])
                feats = rng.normal(size=(n_ctx, ref.config.n_taps * ref.config.target_hidden_size))
                ids = [int(rng.integers(0, vocab))] + [ref.config.mask_token_id] * (pcfg.block_size - 1)
                positions = pos0 + np.arange(n_ctx)
                got = run_draft_logits(binary, draft, target, feats, ids,
                                       work / "runs" / pcfg.name / mode.name / f"case{ci}",
                                       ctx_pos0=pos0, flash_attn=mode.flash_attn, cache_type=mode.cache_type,
                                       threads=threads)
                # the reference gets exactly the float32 features llama.cpp got
                feats32 = feats.astype(np.float32).astype(np.float64)
                want = ref.forward(feats32, ids, ctx_positions=positions)
                forced = ref.forward(feats32, ids, ctx_positions=positions, chain=got.chain)
                res = compare(got, want, forced, threshold=mode.threshold)
                res.update({"ctx_pos0": pos0, "n_ctx": n_ctx, "block": len(ids),
                            "beyond_yarn_original_context": bool(pos0 + n_ctx > ref.config.rope.original_context),
                            "kv_bytes_per_token": got.kv_bytes_per_token, "v_cache_empty": got.v_cache_empty})
                if mode.name == "f32" and ci == len(mode.cases) - 1:
                    entry["controls"] = controls(ref, feats32, ids, positions, None)
                cases.append(res)
                log(f"parity {pcfg.name} {mode.name} ctx {pos0}+{n_ctx}: worst NMSE {res['worst_nmse']:.3g} "
                    f"(<= {mode.threshold:g}) chain {'=' if res['chain_equal'] else '!='} "
                    f"{'ok' if res['pass'] else 'FAIL'}")
            entry["modes"][mode.name] = {"threshold": mode.threshold, "cases": cases,
                                         "worst_nmse": max(c["worst_nmse"] for c in cases)}
        report["configs"][pcfg.name] = entry
    # every per-output figure, for diagnosis (the smoke report keeps the worst per mode)
    (work / "parity-report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return ParityResult(report)
