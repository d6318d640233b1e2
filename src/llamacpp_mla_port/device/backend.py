"""The draft graph on the device's backend: the build, where the scheduler puts each node (no
CPU fallback), upstream's DFlash cases of test-llama-archs, and the lossless runs with target
and draft on the GPU. Stage functions over a device.context.CheckRun (True: checks passed)."""

from __future__ import annotations

import json
import os
import re
import time

import numpy as np

from llamacpp_mla_port.build import ensure_build
from llamacpp_mla_port.device import bundle
from llamacpp_mla_port.device.context import CheckRun
from llamacpp_mla_port.fixtures.draft_gguf import write_mla_draft_gguf
from llamacpp_mla_port.process import run as run_cmd
from llamacpp_mla_port.project import program
from llamacpp_mla_port.proof.lossless import run_lossless
from llamacpp_mla_port.proof.reference.model import read_target_head
from llamacpp_mla_port.proof.run.draft_logits import run_draft_logits
from llamacpp_mla_port.proof.splits import fallback_report


def build_targets(stages) -> tuple[str, ...]:
    """libllama (the proof programs link it) and what the chosen stages run."""
    return tuple(dict.fromkeys([*bundle.BASE_TARGETS, *(t for s in stages for t in bundle.STAGE_TARGETS.get(s, ()))]))


def build_stage(run: CheckRun) -> bool:
    """The pruned tree with CUDA (native architecture only), or CPU-only in a dry run."""
    args, targets = run.cmake_args(), build_targets(run.stages)
    run.report["build"] = {"cmake_args": args, "targets": list(targets)}
    t = time.monotonic()
    ensure_build(run.tree, run.build, targets, cmake_args=args, jobs=run.threads, echo=False)
    run.report["build"]["seconds"] = round(time.monotonic() - t, 1)
    return True


def ensure_targets(run: CheckRun, stage: str) -> None:
    """The stage's own targets, built when a run chose the stage without the build stage (a
    second call on a warm machine): an up-to-date build is a no-op."""
    ensure_build(run.tree, run.build, bundle.STAGE_TARGETS[stage], cmake_args=run.cmake_args(), jobs=run.threads,
                 echo=False)


def fallback_verdict(run: CheckRun, runs: dict) -> bool:
    problems = [f"{k}: no draft graph in the scheduler log" for k, r in runs.items() if r["n_draft_graphs"] == 0]
    if run.cuda:
        problems += [f"{k}: the draft graph has no GPU node" for k, r in runs.items() if not r["gpu_in_graph"]]
        problems += [f"{k}: CPU fallback of {', '.join(r['fallback_ops'])}" for k, r in runs.items()
                     if r["fallback_nodes"]]
    run.report.setdefault("fallback_problems", []).extend(problems)
    return not problems


def fallback_stage(run: CheckRun) -> bool:
    """A draft with the real 512 + 64 latent: where the scheduler put each node of its graphs
    (GGML_SCHED_DEBUG=2), flash attention off/on, F16 and Q8_0 cache."""
    target = run.fixtures / "kimi-k3-target.gguf"
    draft = write_mla_draft_gguf(run.work / "fallback" / "mla576.gguf", target)
    binary = run.program("draft-logits")
    embd, _ = read_target_head(target)
    feats = np.random.default_rng(7).normal(size=(40, 2 * embd.shape[1]))
    mask = embd.shape[0] - 1          # the draft writer's mask token: the last id
    runs = {}
    for fa, cache in ((False, "f16"), (True, "f16"), (True, "q8_0")):
        key = f"fa-{'on' if fa else 'off'}-{cache}"
        out = run.work / "fallback" / key
        run_draft_logits(binary, draft, target, feats, [3, mask, mask, mask], out, ctx_pos0=100, flash_attn=fa,
                         cache_type=cache, threads=min(run.threads, 4), draft_devices=run.devices,
                         target_devices=run.devices, env={**os.environ, "GGML_SCHED_DEBUG": "2"})
        runs[key] = fallback_report((out / "llama.log").read_text(errors="replace"))
    run.report["fallback"] = {"draft": "fixtures.draft_gguf MLA draft: kv_lora 512 + rope 64, 2 layers, "
                                       "Markov + confidence heads", "devices": run.devices or "CPU", "runs": runs}
    return fallback_verdict(run, runs)


def archs_stage(run: CheckRun) -> bool:
    """test-llama-archs' DFlash cases (the series' tests in upstream's harness): each device vs the CPU."""
    ensure_targets(run, "archs")
    res = run_cmd([program(run.build, "test-llama-archs"), "-a", "dflash", "-s", "1"], timeout=600)
    rows = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", res.stdout).splitlines()
            if ln.startswith("|") and "dflash" in ln]
    run.report["archs"] = {"rc": res.returncode, "rows": rows, "log_tail": res.stderr[-2000:]}
    status = [r.split("|")[4].split()[0] for r in rows if len(r.split("|")) > 5 and r.split("|")[4].strip()]
    return res.returncode == 0 and "OK" in status and set(status) <= {"OK", "SKIP"}


def lossless_stage(run: CheckRun) -> bool:
    """proof.lossless with `-ngl 99 -ngld 99` (answered on 2026-12-04; not in the default run):
    draft lengths 3 and 7 (dry run: 3), flash attention and the confidence cut-off on/off, the
    prompts the bigram draft learned from and unlearned ones, and a Q8_0 draft cache."""
    ensure_targets(run, "lossless")
    manifest = json.loads((run.bundle / "MANIFEST.json").read_text())
    learned = manifest.get("lossless_prompts", 8) // 2
    rep = run_lossless(run.tree, run.build, run.fixtures / "lossless", run.fixtures / "kimi-k3-target.gguf",
                       draft_lengths=(3,) if run.dry_run else (3, 7), n_prompts=learned + (1 if run.dry_run else 2),
                       threads=min(run.threads, 4), log=run.log, extra=bundle.PLACEMENT_ARGS,
                       draft_cache=bundle.QUANTIZED_DRAFT_CACHE)
    rep["bigram_accepted"] = sum(r["accepted"] for r in rep["speculative_simple"] + rep["server"]
                                 if r["draft"] == "bigram")
    run.report["lossless"] = rep
    return rep["n_mismatches"] == 0 and rep["bigram_accepted"] > 0
