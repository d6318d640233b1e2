"""Run a patched llama.cpp tree's own converter on a checkpoint.

`convert_checkpoint(tree, checkpoint_dir, out_gguf, target_model_dir, extra_args=())`
runs `<tree>/convert_hf_to_gguf.py` with this interpreter and PYTHONPATH=<tree>/gguf-py
(the PyPI gguf lags the tree: no DFLASH arch), and returns out_gguf. A failure raises
errors.ConversionError carrying the converter's last stderr lines, which name the tensor
or config key at fault. `peak_rss_bytes` in the returned run record is the child's peak
resident memory (ru_maxrss from wait4 on that child alone, llamacpp_mla_port.process), which the
real-size test checks. The converter runs under a time-out (`timeout`, 2 h by default).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from llamacpp_mla_port.errors import ConversionError
from llamacpp_mla_port.process import run

STDERR_TAIL_LINES = 15


@dataclass(frozen=True)
class ConversionRun:
    out_gguf: Path
    seconds: float
    peak_rss_bytes: int
    stderr: str


def run_converter(tree: Path, checkpoint_dir: Path, out_gguf: Path, target_model_dir: Path | None,
                  extra_args: Sequence[str] = (), timeout: float = 7200) -> ConversionRun:
    """Like convert_checkpoint, but returns time, peak RSS and the log."""
    # the converter runs with cwd=tree: every path it is given must be absolute
    tree, checkpoint_dir, out_gguf = Path(tree).resolve(), Path(checkpoint_dir).resolve(), Path(out_gguf).resolve()
    target_model_dir = Path(target_model_dir).resolve() if target_model_dir is not None else None
    script = tree / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise ConversionError(f"no convert_hf_to_gguf.py in {tree}",
                              hint="point at a patched llama.cpp tree (`llamacpp-mla-port patch`)")
    if not (checkpoint_dir / "config.json").is_file():
        raise ConversionError(f"{checkpoint_dir} has no config.json", hint="pass the checkpoint directory")

    cmd = [sys.executable, str(script), str(checkpoint_dir), "--outfile", str(out_gguf)]
    if target_model_dir is not None:
        cmd += ["--target-model-dir", str(target_model_dir)]
    cmd += list(extra_args)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "gguf-py")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")

    proc = run(cmd, env=env, cwd=tree, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.rstrip().splitlines()[-STDERR_TAIL_LINES:])
        raise ConversionError(
            f"convert_hf_to_gguf.py failed (exit {proc.returncode}) on {checkpoint_dir}:\n{tail}",
            hint="the last lines name the tensor or config key; see the converter's options with --help")
    if not out_gguf.is_file():
        raise ConversionError(f"convert_hf_to_gguf.py exited 0 but wrote no {out_gguf}")
    return ConversionRun(out_gguf, proc.seconds, proc.peak_rss_bytes, proc.stderr)


def convert_checkpoint(tree: Path, checkpoint_dir: Path, out_gguf: Path, target_model_dir: Path | None,
                       extra_args: Sequence[str] = ()) -> Path:
    """Convert checkpoint_dir to out_gguf with the tree's converter; returns out_gguf."""
    return run_converter(tree, checkpoint_dir, out_gguf, target_model_dir, extra_args).out_gguf
