"""Run the patched llama.cpp draft on given target features and block ids.

`run_draft_logits` drives the compiled cpp/draft-logits.cpp program, which writes
out_dir/{biased_logits,chain,hidden,base_logits[,confidence]}.npy and meta.json; the
verb `draft-logits` (commands/draft_logits.py) is its command line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port import process

CACHE_TYPES = ("f16", "f32", "bf16", "q8_0")


@dataclass
class DraftLogits:
    """What the llama.cpp draft returned for one block (see cpp/draft-logits.cpp)."""

    biased_logits: np.ndarray      # [B, V] float32
    chain: np.ndarray              # [B] int32
    hidden: np.ndarray             # [B, E] float32
    base_logits: np.ndarray | None  # [B, V] float64 (llama.cpp hidden x target lm_head); None when skipped
    confidence: np.ndarray | None  # [B] float32 (after the sigmoid)
    meta: dict
    out_dir: Path
    dumps: dict = field(default_factory=dict)   # graph tensor name -> float32 rows (--dump)

    @property
    def kv_bytes_per_token(self) -> float | None:
        """Draft KV cache bytes per cached token: the context's memory (llama_get_memory_breakdown) / cells."""
        if self.meta.get("kv_cells"):
            return self.meta["kv_cache_bytes"] / self.meta["kv_cells"]
        return parse_kv_bytes_per_token(self.meta.get("kv_cache_line", ""))

    @property
    def v_cache_empty(self) -> bool:
        """llama.cpp's cache line says V takes 0.00 MiB (MLA: V is a view of K)."""
        m = re.search(r"V \(\w+\):\s*([0-9.]+) MiB", self.meta.get("kv_cache_line", ""))
        return bool(m) and float(m.group(1)) == 0.0


def parse_kv_bytes_per_token(line: str) -> float | None:
    # llama_kv_cache: size = 0.56 MiB (512 cells, 2 layers, 1/1 seqs), K (f16): 0.56 MiB, V (f16): 0.00 MiB
    m = re.search(r"size\s*=\s*([0-9.]+)\s*MiB\s*\(\s*(\d+)\s*cells", line)
    if not m:
        return None
    return float(m.group(1)) * 1024 * 1024 / int(m.group(2))


def run_draft_logits(binary: Path, draft: Path, target: Path, features: np.ndarray | Path, tokens,
                     out_dir: Path, ctx_pos0: int = 0, block_pos0: int | None = None,
                     flash_attn: bool = False, cache_type: str = "f16", threads: int = 2,
                     timeout: float = 600, rpc: str | None = None, draft_devices: str | None = None,
                     target_devices: str | None = None, env: dict | None = None,
                     dump: list[str] | tuple[str, ...] = (), base_logits: bool = True,
                     yarn_attn_factor: float | None = None) -> DraftLogits:
    """Run the compiled draft-logits program; features may be an array (saved next to the outputs).

    rpc ("host:port,...") registers llama.cpp RPC servers; draft_devices / target_devices
    ("RPC0,RPC1", llama.cpp's device names) place each model's layers there (default: CPU).
    `dump` names graph tensors to copy out (DraftLogits.dumps). `yarn_attn_factor` is the draft
    context's (llama.cpp's --yarn-attn-factor; None: the model's).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("dump-*.npy"):
        stale.unlink()
    if not isinstance(features, (str, Path)):
        feats_path = out_dir / "features.npy"
        np.save(feats_path, np.ascontiguousarray(features, dtype=np.float32))
        features = feats_path
    tokens_arg = ",".join(str(int(t)) for t in tokens)
    cmd = [str(binary), "--draft", str(draft), "--target", str(target), "--features", str(features),
           "--tokens", tokens_arg, "--out", str(out_dir), "--ctx-pos0", str(ctx_pos0),
           "--flash-attn", "on" if flash_attn else "off", "--cache-type", cache_type, "--threads", str(threads)]
    if block_pos0 is not None:
        cmd += ["--block-pos0", str(block_pos0)]
    for flag, value in (("--rpc", rpc), ("--draft-devices", draft_devices), ("--target-devices", target_devices)):
        if value:
            cmd += [flag, value]
    if dump:
        cmd += ["--dump", ",".join(dump)]
    if yarn_attn_factor is not None:
        cmd += ["--yarn-attn-factor", repr(float(yarn_attn_factor))]
    if not base_logits:
        cmd.append("--no-base-logits")
        (out_dir / "base_logits.npy").unlink(missing_ok=True)     # no stale file from an earlier run
    proc = process.run(cmd, timeout=timeout, env=env)
    if proc.returncode != 0:
        errors = "\n  ".join(dict.fromkeys(    # the program's error and the loader's reason, once (the log repeats)
            ln for ln in proc.stderr.splitlines()
            if ln.startswith("draft-logits: error:") or ": error loading model:" in ln))
        raise ProofError(f"draft-logits failed (exit {proc.returncode}): {errors or proc.stderr[-3000:]}",
                         hint=f"rerun with --verbose: {' '.join(cmd)} --verbose")
    return load_outputs(out_dir)


def load_outputs(out_dir: Path) -> DraftLogits:
    out_dir = Path(out_dir)
    conf = out_dir / "confidence.npy"
    base = out_dir / "base_logits.npy"
    return DraftLogits(
        biased_logits=np.load(out_dir / "biased_logits.npy"),
        chain=np.load(out_dir / "chain.npy"),
        hidden=np.load(out_dir / "hidden.npy"),
        base_logits=np.load(base) if base.exists() else None,
        confidence=np.load(conf) if conf.exists() else None,
        meta=json.loads((out_dir / "meta.json").read_text()),
        out_dir=out_dir,
        dumps={p.name[len("dump-"):-len(".npy")]: np.load(p) for p in sorted(out_dir.glob("dump-*.npy"))},
    )
