"""`make bench`'s tool stage: how long `make patch` and `make build` take (bench.run runs it last).

  tool     `make patch` cold/warm, `make build` cold and after a one-template change
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from llamacpp_mla_port import process
from llamacpp_mla_port.bench.context import BenchRun, log
from llamacpp_mla_port.errors import ProofError


def _timed(argv, env=None, cwd=None, timeout=3600) -> float:
    proc = process.run(argv, env=env, cwd=cwd, timeout=timeout)
    if proc.returncode != 0:
        raise ProofError(f"{' '.join(map(str, argv))} failed: {proc.stderr[-2000:]}")
    return proc.seconds


def tool_timings(work: Path, threads: int, root: Path, log=print) -> dict:
    """`make patch` into a fresh work dir (cold: clone from the download cache, render, apply) and
    again (warm); `make build` of that tree into an empty build dir with ccache off (cold) and
    after one template changed (a comment added to the MLA graph template: re-render, re-apply,
    rebuild what changed). Each with the equivalent CLI line (the Makefile calls the same)."""
    work = Path(work).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    tool = [sys.executable, "-m", "llamacpp_mla_port"]
    wd = work / "w"
    patches = work / "patches"
    res: dict = {"commands": {}}
    try:
        patch = tool + ["patch", "--work-dir", wd, "--patches-dir", patches]
        res["patch_cold_s"] = round(_timed(patch, cwd=root), 1)
        res["patch_warm_s"] = round(_timed(patch, cwd=root), 1)
        res["commands"]["patch"] = "make patch PATCH_ARGS=\"--work-dir DIR --patches-dir DIR2\"  (run twice)"
        log(f"make patch: cold {res['patch_cold_s']} s, warm {res['patch_warm_s']} s")

        env = dict(os.environ, CCACHE_DISABLE="1")
        build = tool + ["build", "--work-dir", wd, "--quiet", "-j", threads]
        res["build_cold_s"] = round(_timed(build, env=env, cwd=root), 1)
        res["commands"]["build_cold"] = (f"CCACHE_DISABLE=1 make build BUILD_ARGS=\"--work-dir DIR -j {threads}\""
                                         "  (empty build dir)")
        log(f"make build cold: {res['build_cold_s']} s")

        # one template changed, in a copy of the project so the checkout's patches/ stay untouched
        proj = work / "project"
        shutil.copytree(root / "templates", proj / "templates")
        shutil.copytree(root / "patches", proj / "patches")
        tpl = proj / "templates" / "series" / "21-model-dflash-mla-backbone" / "dflash-graph-mla.cpp.j2"
        text = tpl.read_text()
        if "// KV cache injection" not in text:
            raise ProofError(f"{tpl}: the line the bench edits is gone", hint="update bench.run.tool_timings")
        tpl.write_text(text.replace("// KV cache injection", "// KV cache injection (bench: a one-line change)", 1))
        repatch = tool + ["--project", proj, "patch", "--work-dir", wd, "--patches-dir", patches]
        res["patch_after_template_change_s"] = round(_timed(repatch, cwd=root), 1)
        res["build_after_template_change_s"] = round(_timed(build, env=env, cwd=root), 1)
        res["commands"]["build_incremental"] = ("edit one template; make patch; CCACHE_DISABLE=1 make build "
                                                "(ninja recompiles what changed)")
        log(f"one template changed: patch {res['patch_after_template_change_s']} s, "
            f"build {res['build_after_template_change_s']} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return res


def tool(run: BenchRun) -> None:
    run.report["tool"] = tool_timings(run.out / "tool", run.threads, run.root, log=log)
    run.report["commands"].update(run.report["tool"].pop("commands", {}))
