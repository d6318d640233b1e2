"""`make bench`: the draft at Kimi-K3's real dimensions against floors measured in the same run,
and what it buys a Kimi-K3 user.

Stages (each timed; a failing stage is recorded and the others still run), in this order:

  models        the real-size pair, BF16 and Q8_0 (bench.models)
  floors        read bandwidth and ggml's MUL_MAT rate per weight type and K (bench.models)
  kv            the draft's KV bytes per token, F16 / q8_0 cache NMSE against F32 (bench.models)
  passes        draft-bench: injections and the 7-token block against their floors (bench.passes)
  sweep         MUL_MAT over N at the draft's largest shapes against each floor (bench.passes)
  torch         the same block through PyTorch (bench.passes)
  spec          the speculative step split on the tiny pair (bench.spec)
  draft_length  the Kimi-K3-shaped target's verify cost scaled to 93 layers, the real-size draft's
                cost per length, the speedup / break-even table (bench.k3_scale)
  tool          `make patch` / `make build` timings (bench.tool)

Each stage is a function of the run (bench.context.BenchRun); the one stage runner
(stages.Stages) runs them and the report is saved after each. Everything lands in work/bench/:
report.md, report.json, plots/*.png (bench.report).
"""

from __future__ import annotations

import os
import shutil
import time
from functools import partial
from pathlib import Path

from llamacpp_mla_port.bench import k3_scale, models, passes, spec, tool
from llamacpp_mla_port.bench.context import BenchRun, log
from llamacpp_mla_port.bench.report import write_report
from llamacpp_mla_port.build import TARGET_SETS, ensure_build
from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.stages import Stages

#: the stages in the order run_bench runs them (the verb's --stages choices)
STAGE_FUNCTIONS = {
    "models": models.models, "floors": models.floors, "kv": models.kv, "passes": passes.passes,
    "sweep": passes.sweep, "torch": passes.torch, "spec": spec.spec, "draft_length": k3_scale.draft_length,
    "tool": tool.tool,
}
STAGES = tuple(STAGE_FUNCTIONS)
#: what a stage needs from earlier ones (a --stages subset runs these too)
NEEDS = {"floors": {"models"}, "kv": {"models"}, "passes": {"models", "floors"},
         "torch": {"models", "kv", "passes"}, "draft_length": {"models"}}
LAST_CHECKPOINT_USE = "torch"                   # the checkpoint (PyTorch path) is deleted after it
BENCH_TARGETS = TARGET_SETS["bench"]       # build.TARGET_SETS: the one table


def with_needs(stages: tuple[str, ...]) -> tuple[str, ...]:
    wanted = set(stages)
    while True:
        more = set().union(*(NEEDS.get(st, set()) for st in wanted)) - wanted
        if not more:
            return tuple(st for st in STAGES if st in wanted)
        wanted |= more


def _stage_line(name: str, entry: dict) -> None:
    state = "ok" if entry.get("ok") else ("skipped: " + entry.get("skipped", "") if entry.get("ok") is None
                                          else "FAILED: " + entry.get("error", ""))
    log(f"stage {name}: {state} ({entry.get('seconds', 0)} s)")


def _cleanup(run: BenchRun) -> None:
    """The checkpoint (4.8 GB) only serves the PyTorch path."""
    ckpt = run.files.get("checkpoint")
    if ckpt and ckpt.exists() and not run.reuse_models:
        shutil.rmtree(ckpt)


def run_bench(tree: Path, build: Path, out: Path, threads: int | None = None, repeats: int = 3,
              reuse_models: bool = False, stages: tuple[str, ...] | None = None,
              baseline: Path | None = None, root: Path | None = None) -> dict:
    """`root`: the checkout, for the tool stage (not needed without it)."""
    t0 = time.monotonic()
    threads = threads or max(1, os.cpu_count() or 1)
    chosen = STAGES if stages is None else with_needs(stages)
    run = BenchRun.start(tree, build, out, threads, repeats, reuse_models, baseline, root, partial=stages is not None)
    free = shutil.disk_usage(run.out.parent if run.out.parent.exists() else Path.cwd()).free
    need = (22e9 if "models" in chosen else 0) + (k3_scale.DISK_BYTES if "draft_length" in chosen else 0)
    if free < need + 3e9 and not reuse_models:
        raise ProofError(f"make bench writes ~{need / 1e9:.0f} GB of real-size models under {run.out}; "
                         f"{free / 1e9:.1f} GB free", hint="free disk space, or pass --out DIR on a larger disk")
    ensure_build(tree, build, BENCH_TARGETS, echo=False)
    runner = Stages(run.report["stages"], log=_stage_line, save=run.save)     # saved after each stage
    for name in chosen:
        log(f"stage {name} ...")
        runner.run(name, partial(STAGE_FUNCTIONS[name], run))
        if name == LAST_CHECKPOINT_USE:
            _cleanup(run)
    run.report["total_seconds" if stages is None else "last_partial_run_seconds"] = round(time.monotonic() - t0, 1)
    run.save()
    write_report(run.report, run.out)
    return run.report
