"""The device check's run context: what every stage function of one run shares (its folders,
report, budget and log, the background processes it owns), with the helpers the stages use.
device/check.py drives the stages over it."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from llamacpp_mla_port import process
from llamacpp_mla_port.device import bundle
from llamacpp_mla_port.device.models import wait_model
from llamacpp_mla_port.device.report import format_report
from llamacpp_mla_port.device.toolkit import cuda_toolkit_args
from llamacpp_mla_port.device.variants import bins_dir
from llamacpp_mla_port.errors import DeviceCheckError
from llamacpp_mla_port.project import build_in, tree_in
from llamacpp_mla_port.proof.run.processes import Owned
from llamacpp_mla_port.proof.run.programs import compile_program
from llamacpp_mla_port.jsonfile import write_json
from llamacpp_mla_port.stages import Stages


@dataclass
class CheckRun:
    """What every stage of one run shares: its folders, its report, its budget and log, the
    background processes."""

    bundle: Path
    out: Path
    work: Path
    dry_run: bool
    stages: tuple[str, ...]
    threads: int
    report: dict
    log_fn: Callable[[str], None]
    #: the dry run in `make test`: one parity shape and case per mode, one thread count, two prompts
    quick: bool = False
    t0: float = field(default_factory=time.monotonic)
    runner: Stages | None = None
    background: dict[str, Owned] = field(default_factory=dict)
    _cuda_args: list[str] | None = None

    @property
    def cuda(self) -> bool:
        return not self.dry_run

    @property
    def devices(self) -> str | None:
        return bundle.GPU_DEVICE if self.cuda else None

    @property
    def tree(self) -> Path:
        return tree_in(self.work)

    @property
    def build(self) -> Path:
        return build_in(self.work)

    @property
    def fixtures(self) -> Path:
        return self.work / "fixtures"

    def log(self, msg: str) -> None:
        self.log_fn(f"device-check [{time.monotonic() - self.t0:6.1f} s] {msg}")

    def remaining(self) -> float:
        return self.runner.remaining() if self.runner else float("inf")

    def cmake_args(self) -> list[str]:
        if not self.cuda:
            return list(bundle.COMMON_CMAKE_ARGS)
        if self._cuda_args is None:
            self._cuda_args = cuda_toolkit_args()
        return [*bundle.CUDA_CMAKE_ARGS, *self._cuda_args, *bundle.COMMON_CMAKE_ARGS]

    def program(self, name: str) -> Path:
        """A proof program compiled against this run's libllama (a rebuilt one gets fresh binaries)."""
        return compile_program(name, self.tree, self.build)

    def model(self, key: str, timeout: float = 1800) -> dict:
        """A file of the background model writer (device.models), once it is written."""
        writer = self.background.get("models")
        if writer is None:
            raise DeviceCheckError(f"no model writer runs for {key}", hint="a stage asked for a model it did not plan")
        return wait_model(self.work / "models-done.json", key, writer.alive, min(timeout, max(10.0, self.remaining())),
                          writer.log_tail)

    def variant_bench(self, name: str, timeout: float = 1800) -> Path:
        """llama-bench of the CPU variant `name` (device.variants), once the builder made it."""
        out, deadline = bins_dir(self.work, name), time.monotonic() + min(timeout, max(10.0, self.remaining()))
        builder = self.background.get("variants")
        while not (out / "done.json").is_file():
            late = time.monotonic() > deadline
            if (out / "failed.json").is_file() or builder is None or not builder.alive() or late:
                tail = builder.log_tail() if builder else "no builder was started"
                why = "not built within the time left" if late else "not built (the builder failed or ended)"
                raise DeviceCheckError(f"the CPU build of {name}: {why}", hint=tail[-1500:])
            time.sleep(1.0)
        return out / "llama-bench"

    @contextlib.contextmanager
    def quiet(self):
        """The background processes stopped (SIGSTOP) while a stage times something, with every
        descendant: the builder's compilers run in sessions of their own."""
        paused = [(p.pid, process.pause_tree(p.pid)) for p in self.background.values() if p.alive()]
        try:
            yield
        finally:
            for pid, stopped in paused:
                process.resume_tree(pid, stopped)

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.report["seconds"] = round(time.monotonic() - self.t0, 1)
        ran = [s for s in self.report["stages"].values() if not s.get("skipped")]
        self.report["ok"] = bool(ran) and all(s.get("ok") for s in ran)
        write_json(self.out / "report.json", self.report, indent=1, default=str)
        (self.out / "report.md").write_text(format_report(self.report))
