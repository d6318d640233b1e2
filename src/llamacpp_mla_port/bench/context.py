"""What `make bench`'s stage functions share: one run's settings, files and report.

A stage is a function `stage(run: BenchRun) -> None` that measures and writes its part of
`run.report`; bench.run drives them with the one stage runner (stages.Stages), which saves
the report after each stage. What a stage hands a later one (the models' paths, the floors
measured, the KV stage's inputs) lives on the run, never in module globals.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamacpp_mla_port.proof.run.programs import compile_program
from llamacpp_mla_port.jsonfile import write_json

BLOCK = 7
BLOCK_CTX = 512


def log(msg: str) -> None:
    sys.stderr.write(f"bench: {msg}\n")
    sys.stderr.flush()


@dataclass
class BenchRun:
    tree: Path
    build: Path
    out: Path
    threads: int
    repeats: int = 3
    reuse_models: bool = False
    baseline: Path | None = None       # the sweep's build without the commit under test
    root: Path | None = None            # the checkout (the tool stage times `make patch` / `make build` in it)
    report: dict = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    measured: Any = None                 # bench.floors.Measured of the floors stage
    floor_notes: dict = field(default_factory=dict)
    kv_inputs: Any = None                # (features, block ids) of the kv stage, reused by torch
    kv_reference: Any = None             # the F32-cache draft-logits run of the kv stage

    @classmethod
    def start(cls, tree: Path, build: Path, out: Path, threads: int, repeats: int = 3, reuse_models: bool = False,
              baseline: Path | None = None, root: Path | None = None, partial: bool = False) -> "BenchRun":
        """A run whose report starts empty, or, for a subset of stages (`partial`), from the last
        report.json (a subset updates it instead of replacing it)."""
        run = cls(Path(tree).resolve(), Path(build).resolve(), Path(out).resolve(), threads, repeats, reuse_models,
                  Path(baseline).resolve() if baseline else None, root)
        run.report = {"threads": threads, "repeats": repeats, "block": BLOCK, "block_ctx": BLOCK_CTX,
                      "stages": {}, "commands": {}}
        earlier = run.out / "report.json"
        if partial and earlier.is_file():
            run.report = {**json.loads(earlier.read_text()), "threads": threads, "repeats": repeats}
            run.report.setdefault("commands", {})
        return run

    @property
    def models_dir(self) -> Path:
        return self.out / "models"

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(self.out / "report.json", self.report, indent=1, default=str)

    def cmd(self, key: str, argv) -> None:
        """Record the command that reproduces a figure."""
        self.report["commands"][key] = " ".join(str(a) for a in argv)

    def program(self, name: str) -> Path:
        return compile_program(name, self.tree, self.build)
