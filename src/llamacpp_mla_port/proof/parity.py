"""Logit parity of the patched llama.cpp draft against the float64 reference.

Design and bounds: docs/proof.md#parity.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.proof.run.draft_logits import run_draft_logits
from llamacpp_mla_port.proof.reference.precision import (EXACT, Q8_0_BLOCK, Precision, cpu_precision, gguf_tensor_types,
                                                         round_to)
from llamacpp_mla_port.proof.reference.model import (TAP_CONTEXT_ROWS, TAP_EMBEDDINGS, DraftOutputs, DraftReference,
                                                     nmse, stage_outputs, stream_taps)
from llamacpp_mla_port.jsonfile import write_json


@dataclass(frozen=True)
class ParityConfig:
    """One tiny draft shape: overrides of fixtures.checkpoint.k3_dspark_config + block size."""

    name: str
    overrides: dict
    block_size: int


# hidden_size and vocab_size stay those of the tiny target; everything else varies
PARITY_CONFIGS: tuple[ParityConfig, ...] = (
    ParityConfig("h4-n8r32v8-l2-t3-b7", {
        "num_attention_heads": 4, "qk_nope_head_dim": 8, "qk_rope_head_dim": 32, "v_head_dim": 8,
        "q_lora_rank": 32, "kv_lora_rank": 64, "num_hidden_layers": 2, "target_layer_ids": [0, 1, 2],
        "rope_parameters": {"factor": 4.0, "original_max_position_embeddings": 64},
    }, block_size=7),
    ParityConfig("h2-n16r4v12-l3-t2-b4", {
        "num_attention_heads": 2, "qk_nope_head_dim": 16, "qk_rope_head_dim": 4, "v_head_dim": 12,
        "q_lora_rank": 24, "kv_lora_rank": 32, "num_hidden_layers": 3, "target_layer_ids": [0, 2],
        "intermediate_size": 80,
        "rope_parameters": {"factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 16.0},
    }, block_size=4),
    ParityConfig("h8-n4r64v4-l1-t4-b6", {
        "num_attention_heads": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 64, "v_head_dim": 4,
        "q_lora_rank": 16, "kv_lora_rank": 96, "num_hidden_layers": 1, "target_layer_ids": [0, 1, 2, 3],
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
    threshold: float       # NMSE bound of the checked comparison (`compared`)
    cost_bound: float | None   # NMSE bound end to end against the float64 reference (the precision's cost)
    cases: tuple[tuple[int, int], ...]   # (first context position, number of context rows)
    compared: str = "staged"   # "end_to_end" (the F32 proof) or "staged" (module doc)

    def unsupported(self, overrides: dict) -> str | None:
        """Why llama.cpp refuses this mode for a shape (None: it runs). A quantized cache needs
        its block size to divide the MLA K row (kv_lora + rope) and the V view (kv_lora):
        llama_init_from_model's checks."""
        if self.cache_type != "q8_0":
            return None
        lora, rope = overrides["kv_lora_rank"], overrides["qk_rope_head_dim"]
        if lora % Q8_0_BLOCK or (lora + rope) % Q8_0_BLOCK:
            return (f"q8_0 blocks of {Q8_0_BLOCK} must divide kv_lora {lora} and kv_lora + rope {lora + rope} "
                    f"(llama.cpp refuses the cache otherwise)")
        return None


#: Bounds: each >= 10x the worst value measured on every build of docs/bounds.md's parity
#: table (native, portable, SSE4.2-only) and >= 100x below the gross controls in every case;
#: cost bounds >= 10x the worst cost measured (module doc).
MODES: tuple[Mode, ...] = (
    Mode("f32", "float32", "f32", False, 1e-9, None, ((0, 6), (200, 48)), compared="end_to_end"),
    Mode("f16-cache", "float32", "f16", False, 1e-6, 2e-5, ((0, 6), (200, 48))),
    Mode("flash-attn", "float32", "f16", True, 1e-6, 2e-3, ((0, 48), (300, 1000))),
    Mode("bf16", "bfloat16", "f16", False, 1e-5, 2e-3, ((0, 6), (200, 48))),
    Mode("q8_0-cache", "float32", "q8_0", True, 1e-6, 5e-3, ((0, 48), (300, 1000))),
)

#: controls: runtimes with a known mistake (module doc); the gross ones and the subtle one
GROSS_CONTROLS = ("causal_block", "no_yarn", "neox_rotation")
SUBTLE_CONTROL = "kq_scale_1pct"

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
    write_json(out_dir / "config.json", cfg, indent=2)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return out_dir


def hf_config(pcfg: ParityConfig, hidden: int, vocab: int) -> dict:
    """The config.json of a parity draft: its block size in the config, where the converter reads it."""
    from llamacpp_mla_port.fixtures.checkpoint import k3_dspark_config
    return k3_dspark_config(hidden_size=hidden, vocab_size=vocab, block_size=pcfg.block_size, **pcfg.overrides)


def make_draft(tree: Path, work: Path, pcfg: ParityConfig, hidden: int, vocab: int, weights: str,
               seed: int = 0) -> tuple[Path, Path]:
    """(checkpoint dir, converted draft GGUF) for one config and weight dtype; reused when present."""
    from llamacpp_mla_port.fixtures.checkpoint import write_target_tokenizer_dir
    from llamacpp_mla_port.proof.run.convert import convert_checkpoint

    base = Path(work) / f"{pcfg.name}-{weights}"
    ckpt, gguf_path, tok = base / "checkpoint", base / "draft.gguf", base / "target-tokenizer"
    if gguf_path.is_file() and (ckpt / "model.safetensors").is_file():
        return ckpt, gguf_path
    config = hf_config(pcfg, hidden, vocab)
    write_parity_checkpoint(ckpt, config, seed=seed, dtype=weights)
    write_target_tokenizer_dir(tok, config, seed=seed)
    convert_checkpoint(tree, ckpt, gguf_path, tok, extra_args=["--outtype", _OUTTYPE[weights]])
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
    res["worst_nmse"] = worst_nmse(res)
    if threshold is not None:
        tie_tol = 4.0 * math.sqrt(threshold)
        res["chain_ok"] = res["chain_equal"] or res["chain_reference_margin"] < tie_tol
        res["pass"] = bool(res["worst_nmse"] <= threshold and res["chain_ok"])
    return res


def worst_nmse(res: dict) -> float:
    """The largest NMSE of a compare() result: what a bound is checked against."""
    return max(v for k, v in res.items() if k.startswith("nmse_"))


def compare_staged(taps: Mapping[str, np.ndarray], got, fed: DraftOutputs, n_layers: int) -> dict:
    """Stage by stage: each stage of the reference starts from the run's own values (`fed` =
    the reference fed `taps`, conditioned on got.chain) and its output is compared with what
    the run's stage added. A rounding that went the other way in the run then stays in its
    stage instead of being carried, and amplified by later roundings, to the logits.

    Stages: the context K rows (against the reference's own), the block embeddings, per layer
    the attention and the FFN (what each added to the residual stream), the head (hidden
    state, base and Markov-biased logits, confidence, from the run's last layer output).
    """
    own_rows = np.concatenate([np.asarray(r) for r in fed.context_rows], axis=0)
    run_rows = np.concatenate([np.asarray(taps[f"{TAP_CONTEXT_ROWS}-{il}"]) for il in range(n_layers)], axis=0)
    res = {"nmse_context_rows": nmse(run_rows, own_rows),
           "nmse_embeddings": nmse(taps[TAP_EMBEDDINGS], fed.extras["taps"][TAP_EMBEDDINGS])}
    run_stages = stage_outputs(taps, n_layers)
    for name, value in fed.extras["stages"].items():
        res[f"nmse_{name}"] = nmse(run_stages[name], value)
    head = compare(got, fed, fed)
    res.update({f"nmse_head_{k[len('nmse_'):]}": v for k, v in head.items() if k.startswith("nmse_")})
    res["worst_nmse"] = worst_nmse(res)
    return res


def controls(ref: DraftReference, feats: np.ndarray, ids, positions, want: DraftOutputs,
             precision: Precision = EXACT, staged: bool = False) -> dict[str, float]:
    """How far runtimes with a known mistake land from the reference, as the figure the mode's
    check computes: causal block attention, no YaRN, NeoX-style rotation (gross), the
    attention scale 1 % off (subtle). Each wrong runtime is the reference itself with that
    mistake and the same precision; end to end it is conditioned on want's chain, staged it
    is compared exactly as a llama.cpp run is (its own taps fed to the right reference)."""
    variants = {
        "causal_block": (ref, {"causal": True}),
        "no_yarn": (ref.variant(yarn=False), {}),
        "neox_rotation": (ref.variant(style="neox"), {}),
        SUBTLE_CONTROL: (ref, {"kq_scale_factor": 1.01}),
    }
    out = {}
    for name, (variant, mistake) in variants.items():
        if staged:
            wrong = variant.forward(feats, ids, ctx_positions=positions, precision=precision, **mistake)
            taps = wrong.extras["taps"]
            fed = ref.forward(feats, ids, ctx_positions=positions, precision=precision, feed=taps, chain=wrong.chain)
            out[name] = compare_staged(taps, wrong, fed, ref.config.n_layers)["worst_nmse"]
        else:
            wrong = variant.forward(feats, ids, ctx_positions=positions, chain=want.chain, precision=precision,
                                    **mistake)
            out[name] = compare(wrong, want)["worst_nmse"]
    return out


def _headroom(bound: float, worst: float) -> float | None:
    """bound / measured; None when the run matched exactly (nothing to divide by)."""
    return bound / worst if worst > 0 else None


def summarize_mode(mode: Mode, cases: list[dict]) -> dict:
    """Per mode: the worst figures over its cases, the headroom of its bound, and its controls.

    `controls` holds per control its smallest figure over the cases (where the mistake shows
    least), so a margin or a "caught" holds in every case; `controls_max_case` the largest.
    `gross_control_margin` = the nearest gross control / the bound (>= 100 asked).
    """
    worst = max(c["worst_nmse"] for c in cases)
    kinds = cases[0]["controls"].keys()
    ctl_min = {k: min(c["controls"][k] for c in cases) for k in kinds}
    ctl_max = {k: max(c["controls"][k] for c in cases) for k in kinds}
    nearest = min(GROSS_CONTROLS, key=lambda k: ctl_min[k])
    return {
        "threshold": mode.threshold, "cost_bound": mode.cost_bound, "compared": mode.compared,
        "worst_nmse": worst,
        "headroom": _headroom(mode.threshold, worst),
        "worst_nmse_end_to_end": max(c["end_to_end"]["worst_nmse"] for c in cases),
        "worst_nmse_vs_float64": max(c["nmse_vs_float64"]["worst_nmse"] for c in cases),
        "controls": ctl_min, "controls_max_case": ctl_max,
        "nearest_gross_control": {"name": nearest, "nmse": ctl_min[nearest]},
        "gross_control_margin": ctl_min[nearest] / mode.threshold,
        "kq_scale_1pct_caught": bool(ctl_min[SUBTLE_CONTROL] > mode.threshold),
        "cases": cases,
    }


# ---------------------------------------------------------------------------------------
# driver

def case_inputs(ref: DraftReference, pcfg: ParityConfig, seed: int, ci: int, n_ctx: int,
                vocab: int) -> tuple[np.ndarray, list[int]]:
    """The seeded target features and block ids of case `ci` (a run's inputs, found again from its seed)."""
    rng = np.random.default_rng([seed, ci, n_ctx])
    feats = rng.normal(size=(n_ctx, ref.config.n_taps * ref.config.target_hidden_size))
    return feats, [int(rng.integers(0, vocab))] + [ref.config.mask_token_id] * (pcfg.block_size - 1)


TargetFactory = Callable[[int, int, int], Path]   # (hidden, vocab, n_layer_min) -> target GGUF


@dataclass
class ParityResult:
    report: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(case["pass"] for cfg in self.report["configs"].values()
                   for mode in cfg["modes"].values() for case in mode.get("cases", []))


def run_case(binary: Path, draft: Path, target: Path, ref: DraftReference, mode: Mode, precision: Precision,
             feats: np.ndarray, ids: list[int], pos0: int, out_dir: Path, threads: int = 2,
             devices: str | None = None) -> dict:
    """One llama.cpp run of one mode, checked (see the module doc); the case's report.
    `devices` (llama.cpp device names, e.g. "CUDA0") places the draft and its target there;
    None: the CPU, where every bound was measured."""
    n_ctx, n_layers = feats.shape[0], ref.config.n_layers
    staged = mode.compared == "staged"
    got = run_draft_logits(binary, draft, target, feats, ids, out_dir, ctx_pos0=pos0,
                           flash_attn=mode.flash_attn, cache_type=mode.cache_type, threads=threads,
                           dump=stream_taps(n_layers), draft_devices=devices, target_devices=devices)
    # the reference gets exactly the float32 features llama.cpp got
    feats32 = feats.astype(np.float32).astype(np.float64)
    positions = pos0 + np.arange(n_ctx)
    want = ref.forward(feats32, ids, ctx_positions=positions, precision=precision)
    forced = ref.forward(feats32, ids, ctx_positions=positions, chain=got.chain, precision=precision)
    end_to_end = compare(got, want, forced, threshold=mode.threshold)
    # the chain verdict is end to end; the NMSE figures sit in their own sub-reports
    res = {k: v for k, v in end_to_end.items() if k.startswith("chain")}
    res["end_to_end"] = {k: v for k, v in end_to_end.items()
                         if k.startswith("nmse_") or k in ("worst_nmse", "max_abs_confidence")}
    res["worst_nmse"] = end_to_end["worst_nmse"]
    if staged:
        fed = ref.forward(feats32, ids, ctx_positions=positions, chain=got.chain, precision=precision,
                          feed=got.dumps)
        res["staged"] = compare_staged(got.dumps, got, fed, n_layers)
        res["worst_nmse"] = res["staged"]["worst_nmse"]
    if precision.exact:
        res["nmse_vs_float64"] = res["end_to_end"]
    else:
        exact = ref.forward(feats32, ids, ctx_positions=positions)
        exact_forced = ref.forward(feats32, ids, ctx_positions=positions, chain=got.chain)
        vs64 = compare(got, exact, exact_forced)
        res["nmse_vs_float64"] = {k: v for k, v in vs64.items() if k.startswith("nmse_") or k == "worst_nmse"}
    # rounding flips: cache values that the run stored on the other side of a rounding
    # boundary than the reference did (F32 noise meeting a boundary; what the bound absorbs)
    if precision.cache:
        ours = round_to(np.concatenate(want.context_rows, axis=0), precision.cache)
        theirs = round_to(np.concatenate([got.dumps[f"{TAP_CONTEXT_ROWS}-{il}"] for il in range(n_layers)]),
                          precision.cache)
        res["cache_rounding_flips"] = float(np.mean(ours != theirs))
        # one activation that F32 noise rounds the other way on its way into a BF16 product moves
        # its whole token row, and the summation order decides where: judged per row as well
        rows = (ours != theirs).reshape(n_layers, -1, ours.shape[-1]).mean(axis=2)
        res["cache_rounding_flips_worst_row"] = float(rows.max())
        res["cache_rounding_flips_but_worst_row"] = (float(np.sort(rows, axis=1)[:, :-1].mean())
                                                     if rows.shape[1] > 1 else 0.0)
    res["pass"] = bool(res["worst_nmse"] <= mode.threshold and res["chain_ok"]
                       and (mode.cost_bound is None or res["nmse_vs_float64"]["worst_nmse"] <= mode.cost_bound))
    res["controls"] = controls(ref, feats32, ids, positions, want, precision, staged=staged)
    res.update({"ctx_pos0": pos0, "n_ctx": n_ctx, "block": len(ids),
                "beyond_yarn_original_context": bool(pos0 + n_ctx > ref.config.rope.original_context),
                "kv_bytes_per_token": got.kv_bytes_per_token, "v_cache_empty": got.v_cache_empty,
                "system_info": got.meta.get("system_info")})
    return res


def run_parity(tree: Path, build: Path, work: Path, target_for: TargetFactory, hidden: int, vocab: int,
               configs=PARITY_CONFIGS, modes=MODES, threads: int = 2, seed: int = 0, log=print,
               devices: str | None = None) -> ParityResult:
    from llamacpp_mla_port.proof.run.programs import compile_program

    binary = compile_program("draft-logits", tree, build)
    work = Path(work)
    report: dict = {"configs": {}, "devices": devices or "CPU"}
    for pcfg in configs:
        n_layer_min = max(pcfg.overrides["target_layer_ids"]) + 2
        target = target_for(hidden, vocab, n_layer_min)
        target_types = {"output.weight": gguf_tensor_types(target)["output.weight"]}
        entry: dict = {"overrides": pcfg.overrides, "block_size": pcfg.block_size, "modes": {}}
        refs: dict[str, DraftReference] = {}
        for mode in modes:
            reason = mode.unsupported(pcfg.overrides)
            if reason:
                entry["modes"][mode.name] = {"skipped": reason}
                log(f"parity {pcfg.name} {mode.name}: not run, {reason}")
                continue
            ckpt, draft = make_draft(tree, work, pcfg, hidden, vocab, mode.weights, seed=seed)
            if mode.weights not in refs:
                refs[mode.weights] = DraftReference.load(ckpt, target)
            ref = refs[mode.weights]
            precision = cpu_precision(mode.cache_type, mode.flash_attn, pcfg.block_size,
                                      {**gguf_tensor_types(draft), **target_types})
            cases = []
            for ci, (pos0, n_ctx) in enumerate(mode.cases):
                feats, ids = case_inputs(ref, pcfg, seed, ci, n_ctx, vocab)
                res = run_case(binary, draft, target, ref, mode, precision, feats, ids, pos0,
                               work / "runs" / pcfg.name / mode.name / f"case{ci}", threads=threads,
                               devices=devices)
                report.setdefault("system_info", res.pop("system_info"))
                cases.append(res)
                log(f"parity {pcfg.name} {mode.name} ctx {pos0}+{n_ctx}: NMSE {res['worst_nmse']:.3g} "
                    f"(<= {mode.threshold:g}, {mode.compared}), end to end {res['end_to_end']['worst_nmse']:.3g}, "
                    f"vs float64 {res['nmse_vs_float64']['worst_nmse']:.3g}, "
                    f"chain {'=' if res['chain_equal'] else '!='} {'ok' if res['pass'] else 'FAIL'}")
            entry["modes"][mode.name] = {**summarize_mode(mode, cases), "precision": precision.describe()}
        report["configs"][pcfg.name] = entry
    report["modes"] = mode_table(report, modes)
    # every per-output figure, for diagnosis (the smoke report keeps the summary per mode)
    write_json(work / "parity-report.json", report, indent=1, default=str)
    return ParityResult(report)


def mode_table(report: dict, modes=MODES) -> dict:
    """Per mode over every shape: the bound, the worst figures, the headroom, the controls
    (docs/bounds.md's parity table, for the build that ran)."""
    table = {}
    for mode in modes:
        ran = [cfg["modes"][mode.name] for cfg in report["configs"].values()
               if "skipped" not in cfg["modes"].get(mode.name, {"skipped": True})]
        if not ran:
            continue
        worst = max(m["worst_nmse"] for m in ran)
        nearest = min((m["nearest_gross_control"] for m in ran), key=lambda c: c["nmse"])
        table[mode.name] = {
            "threshold": mode.threshold, "cost_bound": mode.cost_bound, "shapes": len(ran),
            "worst_nmse": worst,
            "headroom": _headroom(mode.threshold, worst),
            "compared": mode.compared,
            "worst_nmse_end_to_end": max(m["worst_nmse_end_to_end"] for m in ran),
            "worst_nmse_vs_float64": max(m["worst_nmse_vs_float64"] for m in ran),
            "nearest_gross_control": nearest,
            "gross_control_margin": nearest["nmse"] / mode.threshold,
            "kq_scale_1pct": min(m["controls"][SUBTLE_CONTROL] for m in ran),
            "kq_scale_1pct_caught": all(m["kq_scale_1pct_caught"] for m in ran),
            "pass": all(c["pass"] for m in ran for c in m["cases"]),
        }
    return table


def run_matrix(tree: Path, build: Path, work: Path, threads: int = 2, log=print) -> ParityResult:
    """The whole parity matrix against one build: the tiny Kimi-K3 target written by that
    build's test-llama-archs, every shape and mode (the verb `parity`)."""
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
    from llamacpp_mla_port.proof.reference.model import read_target_head

    from llamacpp_mla_port.fixtures.target_variants import target_with_layers

    work = Path(work)
    target = write_kimi_k3_target(build, work / "kimi-k3-target.gguf")
    embd, _ = read_target_head(target)
    vocab, hidden = embd.shape
    # the runtime refuses a draft whose taps lie past its target's layers: pair each with one deep enough
    return run_parity(tree, build, work / "parity", lambda h, v, n: target_with_layers(target, work, n),
                      hidden, vocab, threads=threads, log=log)


def format_mode_table(table: dict) -> str:
    """The mode table as text: one row per mode (docs/bounds.md's parity table columns)."""
    head = (f"{'mode':<11} {'compared':<10} {'bound':>7} {'worst':>9} {'headroom':>9} {'end-to-end':>10} "
            f"{'vs f64':>9} {'cost bnd':>8} {'nearest gross control':>28} {'1% scale':>9} caught  pass")
    lines = [head, "-" * len(head)]
    for name, m in table.items():
        near = m["nearest_gross_control"]
        headroom = "exact" if m["headroom"] is None else f"{m['headroom']:.0f}x"
        cost = "-" if m["cost_bound"] is None else f"{m['cost_bound']:.0e}"
        lines.append(
            f"{name:<11} {m['compared']:<10} {m['threshold']:>7.0e} {m['worst_nmse']:>9.2e} {headroom:>9} "
            f"{m['worst_nmse_end_to_end']:>10.2e} {m['worst_nmse_vs_float64']:>9.2e} {cost:>8} "
            f"{near['name'] + ' ' + format(near['nmse'], '.1e'):>28} {m['kq_scale_1pct']:>9.1e} "
            f"{'yes' if m['kq_scale_1pct_caught'] else 'NO':<6}  {'ok' if m['pass'] else 'FAIL'}")
    return "\n".join(lines)
