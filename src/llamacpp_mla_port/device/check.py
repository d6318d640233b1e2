"""The device check's driver (RUN): over one run context (device.context.CheckRun), the stages
in order through the one stage runner inside the time budget, the report saved after every
stage (a run stopped by its time limit still leaves one), and the background processes it owns:
the model writer (device.models) and the CPU variants' builder (device.variants, lowest
priority), both paused while a stage times something (`CheckRun.quiet`).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable

from llamacpp_mla_port import process
from llamacpp_mla_port.device import backend, block, bundle, crossparity, host
from llamacpp_mla_port.device.context import CheckRun
from llamacpp_mla_port.device.models import plan_jobs
from llamacpp_mla_port.device.variants import STACK_STAGE
from llamacpp_mla_port.errors import DeviceCheckError, PortError, ProcessError
from llamacpp_mla_port.proof.run.processes import Owned
from llamacpp_mla_port.source.obtain import file_sha256
from llamacpp_mla_port.jsonfile import write_json
from llamacpp_mla_port.stages import StageFailed, Stages

#: stage name -> its function (True: its checks passed; False: they failed, figures in the report)
STAGE_FUNCS: dict[str, Callable] = {
    "build": backend.build_stage, "fallback": backend.fallback_stage, "archs": backend.archs_stage,
    "parity": crossparity.parity_stage, "realsize": block.realsize_stage, "host": host.host_stage,
    "threads": host.threads_stage, "vb-forms": block.vb_forms_stage, "lossless": backend.lossless_stage,
}


# --------------------------------------------------------------------------------- setup

def environment(run: CheckRun) -> None:
    env: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    for key, cmd in (("nvidia_smi", ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.sm",
                                     "--format=csv,noheader"]),
                     ("nvcc", ["nvcc", "--version"]), ("cmake", ["cmake", "--version"])):
        try:
            proc = process.run(cmd, timeout=30)
            env[key] = (proc.stdout.strip().splitlines() or [""])[-1] if proc.returncode == 0 else None
        except ProcessError:          # not installed, or no answer within 30 s
            env[key] = None
    try:
        import torch                  # the device's image has it; a dry run may not
        env["torch"], env["torch_cuda"] = torch.__version__, bool(torch.cuda.is_available())
    except ImportError:
        env["torch"] = None
    run.report["environment"] = env
    if run.cuda and not env.get("nvidia_smi"):
        raise DeviceCheckError("no GPU here (nvidia-smi answers nothing)",
                               hint="run on the device machine, or DRY_RUN=1 for the CPU dry run")


def unpack(run: CheckRun) -> None:
    """The bundle's tree and fixtures into the work folder (kept while it is the same tree)."""
    stamp, tarball = run.work / "unpacked.sha256", run.bundle / "llama.cpp.tar.gz"
    if (run.tree / "CMakeLists.txt").is_file() and stamp.is_file() and stamp.read_text() == file_sha256(tarball):
        return
    # another tree: a build of the old one would look newer than the sources (mtime 0)
    for stale in (run.tree, run.build, run.work / "cpu", run.work / "cpu-bins"):
        if stale.exists():
            shutil.rmtree(stale)
    run.work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(run.work, filter="data")
    stamp.write_text(file_sha256(tarball))
    if run.fixtures.exists():
        shutil.rmtree(run.fixtures)
    shutil.copytree(run.bundle / "fixtures", run.fixtures)


def start_models(run: CheckRun) -> None:
    """The model writer: the files the chosen stages need, in their order (device.models)."""
    jobs = plan_jobs(run.stages, run.work, run.fixtures, run.dry_run, host.variants_manifest(run.bundle))
    if not jobs:
        return
    spec = run.work / "models-jobs.json"
    write_json(spec, jobs, indent=1)
    (run.work / "models-done.json").unlink(missing_ok=True)
    run.background["models"] = Owned([sys.executable, "-m", "llamacpp_mla_port.device.models", spec,
                                      run.work / "models-done.json"], run.work / "models.log",
                                     env={**os.environ}, name="the model writer")
    run.log(f"models: writing {', '.join(jobs)} in the background")


def start_builder(run: CheckRun) -> None:
    """The CPU builds of the base and the stacks the host stages need, at the lowest priority."""
    wanted = [s for s, stage in STACK_STAGE.items() if stage in run.stages]
    if not wanted:
        return
    run.background["variants"] = Owned(["nice", "-n", "19", sys.executable, "-m", "llamacpp_mla_port.device.variants",
                                        run.bundle, run.work, run.threads, *wanted], run.work / "variants.log",
                                       env={**os.environ}, name="the CPU variants' builder")
    run.log(f"CPU builds: base, {', '.join(wanted)} in the background (nice 19)")


# ------------------------------------------------------------------------------- the run

def new_report(dry_run: bool, budget_s: float | None, threads: int, chosen) -> dict:
    """The report a run starts with (what it is, what it was asked for and what not)."""
    return {"kind": "dry run (CUDA off)" if dry_run else "cuda", "device_call": bundle.DEVICE_CALL,
            "budget_s": budget_s, "threads": threads, "stages": {}, "figures_from_gpu": not dry_run,
            "not_chosen": {s: bundle.NOT_CHOSEN_WHY.get(s, "not asked for") for s in bundle.STAGES if s not in chosen},
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def run_check(bundle_dir: Path, out: Path, work: Path, dry_run: bool, budget_s: float | None = None,
              stages=bundle.DEFAULT_STAGES, log=None, threads: int | None = None) -> dict:
    """One run of the check (module doc); its report."""
    chosen = tuple(s for s in bundle.STAGES if s in stages)
    unknown = sorted(set(stages) - set(bundle.STAGES))
    if unknown:
        raise DeviceCheckError(f"unknown stage(s) {', '.join(unknown)}", hint="of " + ", ".join(bundle.STAGES))
    # the device's 16 cores; a dry run keeps to this project's 2-core budget
    n = threads or (min(os.cpu_count() or 2, 2) if dry_run else (os.cpu_count() or 2))
    report = new_report(dry_run, budget_s, n, chosen)
    run = CheckRun(Path(bundle_dir).resolve(), Path(out).resolve(), Path(work).resolve(), dry_run, chosen, n, report,
                   log or (lambda m: (sys.stderr.write(m + "\n"), sys.stderr.flush())))
    run.runner = Stages(report["stages"], log=lambda name, st: _ended(run, name, st), budget_s=budget_s, save=run.save)
    try:
        environment(run)
        unpack(run)
        start_models(run)
        start_builder(run)
        run.save()
        drive(run)
    except PortError as err:
        report["stages"]["setup"] = {"ok": False, "error": str(err)}
    finally:
        for proc in run.background.values():
            proc.kill(signal.SIGCONT)
            proc.stop(grace=2)
        run.save()
        pack_logs(run)
    return report


def drive(run: CheckRun) -> None:
    """The chosen stages in order through the run's stage runner (nothing runs without the build)."""
    stages = run.report["stages"]
    for name in run.stages:
        if name != "build" and not stages.get("build", {}).get("ok", "build" not in run.stages):
            stages[name] = {"ok": None, "skipped": "not run: the build failed"}
            continue
        run.log(f"stage {name} ...")
        run.runner.run(name, _checked(run, name), needs_s=bundle.STAGE_NEEDS_S.get(name, 0.0))


def _checked(run: CheckRun, name: str) -> Callable[[], None]:
    def stage() -> None:
        if not STAGE_FUNCS[name](run):
            raise StageFailed({"message": f"the {name} stage's checks failed (its figures are in the report)"})
    return stage


def _ended(run: CheckRun, name: str, st: dict) -> None:
    if st.get("skipped"):
        run.log(f"stage {name}: skipped ({st['skipped']})")
    else:
        run.log(f"stage {name}: {'ok' if st['ok'] else 'FAILED ' + st.get('error', '(see report)')[:300]} "
                f"({st['seconds']} s)")


def pack_logs(run: CheckRun, limit: int = 12 * 2**20) -> None:
    """logs.tar.gz beside the report: the build logs, the background writers', every scheduler
    log and bench output, the thread rows (a device call returns files, not the machine's scratch)."""
    w = run.work
    picks = [run.build / "llamacpp-mla-port-build.log", w / "cpu" / "build" / "llamacpp-mla-port-build.log",
             w / "models.log", w / "variants.log", *sorted((w / "fallback").glob("*/llama.log")),
             *sorted((w / "bench").glob("*")), *sorted((w / "host").glob("*"))]
    run.out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(run.out / "logs.tar.gz", "w:gz") as tar:
        for p in picks:
            if p.is_file() and p.stat().st_size < limit:
                tar.add(p, arcname=str(p.relative_to(w)))
