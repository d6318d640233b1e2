"""Parity on another backend, like with like (the device check's `parity` stage; judge.py has
the rule): per parity shape, mode and case (proof.parity's) the draft on the CPU and on the
device, deepseek2's MLA at the draft's geometry (fixtures.deepseek2_twin) the same, and gross
controls (CONTROLS) on the device; docs/device-check.md ("Parity like with like").
`devices=None` runs the "device" side on the CPU too (the dry run): every deviation is then 0.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from llamacpp_mla_port.device.context import CheckRun
from llamacpp_mla_port.device.judge import LIKE_MARGIN, judge_cpu_parity, judge_like
from llamacpp_mla_port.fixtures.deepseek2_twin import write_deepseek2_twin
from llamacpp_mla_port.fixtures.target_variants import target_with_layers
from llamacpp_mla_port.proof.differential import Draft
from llamacpp_mla_port.proof.parity import MODES, PARITY_CONFIGS, Mode, ParityConfig, hf_config, run_parity
from llamacpp_mla_port.proof.reference.model import nmse, read_target_head
from llamacpp_mla_port.proof.run.draft_logits import DraftLogits, run_draft_logits
from llamacpp_mla_port import process
from llamacpp_mla_port.proof.splits import cpu_fallbacks, draft_graphs, parse_sched_log
from llamacpp_mla_port.errors import DeviceCheckError

#: gross controls: a draft GGUF with one known mistake, as a converter or a graph could make it
CONTROLS = {"latent_rope_swapped": "the K row's two parts in the wrong order: attn_kv_a_mqa's rope rows first",
            "k_b_v_b_swapped": "K's and V's per-head up-projections exchanged (shapes with qk_nope = v_head)",
            "mscale_dropped": "YaRN's mscale^2 missing from the attention scale (yarn_log_multiplier 0)"}
_WEIGHTS = {"float32": "f32", "bfloat16": "bf16"}


def _rows(t: np.ndarray) -> np.ndarray:
    """A tensor's data as elements (BF16 rows come as bytes)."""
    return t.view(np.uint16) if t.dtype == np.uint8 else t


def write_control(draft: Path, name: str, out: Path, kv_lora: int) -> Path | None:
    """The draft with control `name`'s mistake (CONTROLS) at `out`; None where its shapes do not
    allow it. Reused when present."""
    if out.is_file():
        return out
    d = Draft.read(draft)
    tensors = {n: (data, ty) for n, data, ty in d.tensors}
    if name == "latent_rope_swapped":
        for n, (data, ty) in tensors.items():
            if n.endswith(".attn_kv_a_mqa.weight"):
                tensors[n] = (np.concatenate([data[kv_lora:], data[:kv_lora]]), ty)
    elif name == "k_b_v_b_swapped":
        layers = sorted({n.split(".")[1] for n in tensors if n.endswith(".attn_k_b.weight")})
        for il in layers:
            kb, vb = f"blk.{il}.attn_k_b.weight", f"blk.{il}.attn_v_b.weight"
            (k, kty), (v, vty) = tensors[kb], tensors[vb]
            ke, ve = _rows(k), _rows(v)
            if ke.shape != ve.shape[:1] + ve.shape[2:] + ve.shape[1:2]:
                return None                 # qk_nope != v_head: not the same shape transposed
            tensors[kb] = (np.ascontiguousarray(ve.transpose(0, 2, 1)).view(k.dtype), kty)
            tensors[vb] = (np.ascontiguousarray(ke.transpose(0, 2, 1)).view(v.dtype), vty)
    elif name == "mscale_dropped":
        keys = {k: i for i, (k, *_rest) in enumerate(d.kvs)}
        key = f"{d.arch}.rope.scaling.yarn_log_multiplier"
        if key not in keys or dict((k, v) for k, v, *_r in d.kvs).get(f"{d.arch}.rope.scaling.factor", 1.0) <= 1.0:
            return None                     # no YaRN: no mscale to drop
        _, _, vtype, sub = d.kvs[keys[key]]
        d.kvs[keys[key]] = (key, 0.0, vtype, sub)
    else:
        raise DeviceCheckError(f"no control {name!r}", hint=f"one of {', '.join(CONTROLS)}")
    d.tensors = [(n, data, ty) for n, (data, ty) in tensors.items()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    d.write(tmp)
    tmp.replace(out)
    return out


def figure(got: DraftLogits, cpu: DraftLogits) -> dict:
    """NMSE of a device run's logits against the CPU's (module doc) and whether the chains agree."""
    differ = [k for k in range(len(cpu.chain)) if int(got.chain[k]) != int(cpu.chain[k])]
    upto = (differ[0] + 1) if differ else len(cpu.chain)
    out = {"nmse_biased_logits": nmse(got.biased_logits[:upto], cpu.biased_logits[:upto]), "chain_equal": not differ}
    if got.base_logits is not None and cpu.base_logits is not None:
        out["nmse_base_logits"] = nmse(got.base_logits, cpu.base_logits)
    if got.confidence is not None and cpu.confidence is not None:
        out["nmse_confidence"] = nmse(got.confidence[:upto], cpu.confidence[:upto])
    if differ:
        top = np.sort(cpu.biased_logits[differ[0]])[-2:]
        out["chain_first_difference"] = differ[0]
        out["cpu_margin"] = float((top[1] - top[0]) / np.sqrt(np.mean(cpu.biased_logits[differ[0]] ** 2)))
    out["worst"] = max(v for k, v in out.items() if k.startswith("nmse_") and k != "nmse_confidence")
    return out


def fallback_ops(log_path: Path, draft: bool) -> list[str]:
    """Ops that ran on the CPU in a graph that also ran on the device (GGML_SCHED_DEBUG=2 log)."""
    text = Path(log_path).read_text(errors="replace") if Path(log_path).is_file() else ""
    graphs = parse_sched_log(text)
    return sorted({n.op for g in (draft_graphs(graphs) if draft else graphs) for n in cpu_fallbacks(g)})


def twin_logits(binary: Path, model: Path, tokens: list[int], pos0: int, n_out: int, mode: Mode, out: Path,
                threads: int, devices: str | None, env: dict) -> np.ndarray:
    cmd = [str(binary), "--model", str(model), "--tokens", ",".join(map(str, tokens)), "--out", str(out),
           "--pos0", str(pos0), "--n-out", str(n_out), "--flash-attn", "on" if mode.flash_attn else "off",
           "--cache-type", mode.cache_type, "--threads", str(threads)] + (["--devices", devices] if devices else [])
    proc = process.run(cmd, timeout=600, env=env)
    if proc.returncode != 0:
        raise DeviceCheckError(f"model-logits failed (exit {proc.returncode}): {proc.stderr[-1500:]}",
                               hint=" ".join(cmd) + " --verbose")
    return np.load(out / "logits.npy")


def _case_inputs(cfg: dict, pcfg: ParityConfig, seed: int, ci: int, n_ctx: int, hidden: int, vocab: int):
    """The draft's features and block, and deepseek2's tokens (its context and block) of one case."""
    rng = np.random.default_rng([seed, ci, n_ctx])
    feats = rng.normal(size=(n_ctx, len(cfg["target_layer_ids"]) * hidden))
    ids = [int(rng.integers(0, vocab))] + [cfg["mask_token_id"]] * (pcfg.block_size - 1)
    toks = [int(t) for t in np.random.default_rng([seed, ci, n_ctx, 1]).integers(0, vocab, n_ctx + len(ids))]
    return feats, ids, toks


def _draft_run(job: tuple) -> DraftLogits:
    return run_draft_logits(*job[:6], **job[6])


def run_cross_parity(tree: Path, build: Path, fixtures: Path, work: Path, programs: Callable[[str], Path],
                     devices: str | None, threads: int = 4, configs=PARITY_CONFIGS, modes=MODES, seed: int = 0,
                     log=print) -> dict:
    """The like-with-like matrix (module doc): per mode the worst figures, the controls and the
    verdict. The runs of one shape and mode go at once, as many as the cores take at `threads`."""
    target = fixtures / "kimi-k3-target.gguf"
    embd, _ = read_target_head(target)
    vocab, hidden = embd.shape
    dl, ml = programs("draft-logits"), programs("model-logits")
    env = {**os.environ, "GGML_SCHED_DEBUG": "2"} if devices else dict(os.environ)
    place = {"env": env, "draft_devices": devices, "target_devices": devices}
    report: dict = {"devices": devices or "CPU (dry run: the same backend on both sides)", "configs": {}}
    per_mode: dict[str, list] = {}
    pool = ThreadPoolExecutor(max(1, (os.cpu_count() or 1) // max(1, threads)))
    for pcfg in configs:
        cfg = hf_config(pcfg, hidden, vocab)
        tgt = target_with_layers(target, work, max(cfg["target_layer_ids"]) + 2)
        entry = report["configs"].setdefault(pcfg.name, {})
        for mode in modes:
            if mode.unsupported(pcfg.overrides):
                entry[mode.name] = {"skipped": mode.unsupported(pcfg.overrides)}
                continue
            draft = fixtures / "parity" / f"{pcfg.name}-{mode.weights}" / "draft.gguf"
            if not draft.is_file():
                raise DeviceCheckError(f"no parity draft {draft}", hint="the bundle's fixtures (make device-check)")
            twin = write_deepseek2_twin(cfg, _WEIGHTS[mode.weights], work / "twins" / f"{draft.parent.name}.gguf")
            ctl = {c: write_control(draft, c, work / "controls" / f"{draft.parent.name}-{c}.gguf",
                                    cfg["kv_lora_rank"]) for c in CONTROLS}
            runs = []
            for ci, (pos0, n_ctx) in enumerate(mode.cases):
                feats, ids, toks = _case_inputs(cfg, pcfg, seed, ci, n_ctx, hidden, vocab)
                base = work / "runs" / pcfg.name / mode.name / f"case{ci}"
                args = dict(ctx_pos0=pos0, flash_attn=mode.flash_attn, cache_type=mode.cache_type, threads=threads)
                jobs = {"cpu": (dl, draft, tgt, feats, ids, base / "cpu", args),
                        "device": (dl, draft, tgt, feats, ids, base / "device", {**args, **place})}
                # the controls on one case per shape and mode: device time
                jobs.update({c: (dl, path, tgt, feats, ids, base / c, {**args, **place})
                             for c, path in ctl.items() if path is not None and ci == 0})
                futures = {k: pool.submit(_draft_run, j) for k, j in jobs.items()}
                for side, dev in (("twin-cpu", None), ("twin-device", devices)):
                    futures[side] = pool.submit(twin_logits, ml, twin, toks, pos0, len(ids), mode, base / side,
                                                threads, dev, env)
                runs.append((pos0, n_ctx, base, futures))
            cases = [_case(pos0, n_ctx, base, {k: f.result() for k, f in futures.items()})
                     for pos0, n_ctx, base, futures in runs]
            for c in cases:
                log(f"parity {pcfg.name} {mode.name} ctx {c['ctx_pos0']}+{c['n_ctx']}: draft "
                    f"{c['draft']['worst']:.3g}, deepseek2 {c['twin']:.3g}, controls "
                    + ", ".join(f"{k} {v:.2g}" for k, v in c["controls"].items()))
            entry[mode.name] = {"cases": cases}
            per_mode.setdefault(mode.name, []).extend(cases)
    pool.shutdown()
    report["modes"] = {name: summarize(cases) for name, cases in per_mode.items()}
    return report


def _case(pos0: int, n_ctx: int, base: Path, got: dict) -> dict:
    """One case's figures from its finished runs."""
    return {"ctx_pos0": pos0, "n_ctx": n_ctx, "draft": figure(got["device"], got["cpu"]),
            "draft_fallback_ops": fallback_ops(base / "device" / "llama.log", True),
            "controls": {c: figure(got[c], got["cpu"])["worst"] for c in CONTROLS if c in got},
            "twin": nmse(got["twin-device"], got["twin-cpu"]),
            "twin_fallback_ops": fallback_ops(base / "twin-device" / "llama.log", False)}


def summarize(cases: list[dict]) -> dict:
    """One mode over its shapes and cases: the worst draft and deepseek2 figures, each control's
    smallest figure, the chains (a flip only where the CPU's top two were a near-tie), the verdict."""
    draft = max(c["draft"]["worst"] for c in cases)
    twin = max(c["twin"] for c in cases)
    controls = {k: min((c["controls"][k] for c in cases if k in c["controls"]), default=None) for k in CONTROLS}
    tie = 4.0 * float(np.sqrt(max(LIKE_MARGIN * twin, draft)))
    chains_ok = all(c["draft"]["chain_equal"] or c["draft"]["cpu_margin"] < tie for c in cases)
    verdict = judge_like(draft, twin, controls, chains_ok)
    verdict.update({
        "cases": len(cases), "chains_equal": sum(c["draft"]["chain_equal"] for c in cases),
        "draft_fallback_ops": sorted({op for c in cases for op in c["draft_fallback_ops"]}),
        "twin_fallback_ops": sorted({op for c in cases for op in c["twin_fallback_ops"]}),
    })
    return verdict


def parity_stage(run: CheckRun) -> bool:
    """The like-with-like matrix on the device (module doc), then the host CPU's own proof
    against float64 with the CPU bounds (judge.judge_cpu_parity)."""
    configs, modes = quick_matrix() if run.quick else (PARITY_CONFIGS, MODES)
    like = run_cross_parity(run.tree, run.build, run.fixtures, run.work / "cross-parity", run.program, run.devices,
                            threads=min(run.threads, 4), configs=configs, modes=modes, log=run.log)
    run.report["parity"] = {"like_with_like": like}
    run.save()
    cpu = cpu_parity(run, configs, modes)
    run.report["parity"]["cpu"] = {"system_info": cpu.report.get("system_info"), "modes": judge_cpu_parity(cpu.report)}
    return all(m["ok"] for m in like["modes"].values()) and all(
        m["ok"] for m in run.report["parity"]["cpu"]["modes"].values())


def cpu_parity(run: CheckRun, configs, modes):
    """proof.parity's run on the host CPU against float64, over the bundle's parity drafts."""
    target, pdir = run.fixtures / "kimi-k3-target.gguf", run.fixtures / "parity"
    embd, _ = read_target_head(target)
    return run_parity(run.tree, run.build, pdir, lambda h, v, n: target_with_layers(target, pdir, n), embd.shape[1],
                      embd.shape[0], configs=configs, modes=modes, threads=min(run.threads, 4), log=run.log)


def quick_matrix() -> tuple[tuple[ParityConfig, ...], tuple[Mode, ...]]:
    """The dry run in `make test`: the first shape, every mode, its first case."""
    return PARITY_CONFIGS[:1], tuple(Mode(m.name, m.weights, m.cache_type, m.flash_attn, m.threshold, m.cost_bound,
                                          m.cases[:1], m.compared) for m in MODES)
