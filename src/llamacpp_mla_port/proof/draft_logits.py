"""`draft-logits`: run the patched llama.cpp draft on given target features and block ids.

    llamacpp-mla-port draft-logits --draft draft.gguf --target target.gguf \\
        --features feats.npy --tokens 163837,163837,... --out outdir/ [--reference ckpt_dir]

Writes outdir/{biased_logits,chain,hidden,base_logits[,confidence]}.npy and meta.json
(see cpp/draft-logits.cpp). With --reference the float64 reference of the same HF
checkpoint runs on the same inputs and the NMSE per output is printed, which is the check
llama.cpp asks of a model port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamacpp_mla_port.errors import ProofError

CACHE_TYPES = ("f16", "f32", "bf16", "q8_0")


@dataclass
class DraftLogits:
    """What the llama.cpp draft returned for one block (see cpp/draft-logits.cpp)."""

    biased_logits: np.ndarray      # [B, V] float32
    chain: np.ndarray              # [B] int32
    hidden: np.ndarray             # [B, E] float32
    base_logits: np.ndarray        # [B, V] float64 (llama.cpp hidden x target lm_head)
    confidence: np.ndarray | None  # [B] float32 (after the sigmoid)
    meta: dict
    out_dir: Path

    @property
    def kv_bytes_per_token(self) -> float | None:
        """Draft KV cache bytes per cached token: the context's memory (llama_get_memory_breakdown) / cells."""
        if self.meta.get("kv_cells"):
            return self.meta["kv_cache_bytes"] / self.meta["kv_cells"]
        return parse_kv_bytes_per_token(self.meta.get("kv_cache_line", ""))

    @property
    def v_cache_empty(self) -> bool:
        """llama.cpp's cache line says V takes 0.00 MiB (MLA: V is a view of K)."""
        import re
        m = re.search(r"V \(\w+\):\s*([0-9.]+) MiB", self.meta.get("kv_cache_line", ""))
        return bool(m) and float(m.group(1)) == 0.0


def parse_kv_bytes_per_token(line: str) -> float | None:
    # llama_kv_cache: size = 0.56 MiB (512 cells, 2 layers, 1/1 seqs), K (f16): 0.56 MiB, V (f16): 0.00 MiB
    import re
    m = re.search(r"size\s*=\s*([0-9.]+)\s*MiB\s*\(\s*(\d+)\s*cells", line)
    if not m:
        return None
    return float(m.group(1)) * 1024 * 1024 / int(m.group(2))


def resolve_tree_and_build(tree: str | Path | None = None, build: str | Path | None = None) -> tuple[Path, Path]:
    """Explicit paths, else MLA_PORT_TREE/MLA_PORT_BUILD, else the tool-owned work tree and build."""
    tree = tree or os.environ.get("MLA_PORT_TREE")
    build = build or os.environ.get("MLA_PORT_BUILD")
    if tree and build:
        return Path(tree), Path(build)
    from llamacpp_mla_port import engine
    ws = engine.Options().workspace()
    tree = Path(tree) if tree else ws.tree
    build = Path(build) if build else ws.build_dir
    if not (tree / "include" / "llama.h").is_file():
        raise ProofError(f"no patched llama.cpp tree at {tree}", hint="run `make patch` and `make build` first")
    return tree, build


def run_draft_logits(binary: Path, draft: Path, target: Path, features: np.ndarray | Path, tokens,
                     out_dir: Path, ctx_pos0: int = 0, block_pos0: int | None = None,
                     flash_attn: bool = False, cache_type: str = "f16", threads: int = 2,
                     timeout: float = 600) -> DraftLogits:
    """Run the compiled draft-logits program; features may be an array (saved next to the outputs)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
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
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("draft-logits: error:")]
        raise ProofError(f"draft-logits failed (exit {proc.returncode}): {' '.join(errors) or proc.stderr[-3000:]}",
                         hint=f"rerun with --verbose: {' '.join(cmd)} --verbose")
    return load_outputs(out_dir)


def load_outputs(out_dir: Path) -> DraftLogits:
    out_dir = Path(out_dir)
    conf = out_dir / "confidence.npy"
    return DraftLogits(
        biased_logits=np.load(out_dir / "biased_logits.npy"),
        chain=np.load(out_dir / "chain.npy"),
        hidden=np.load(out_dir / "hidden.npy"),
        base_logits=np.load(out_dir / "base_logits.npy"),
        confidence=np.load(conf) if conf.exists() else None,
        meta=json.loads((out_dir / "meta.json").read_text()),
        out_dir=out_dir,
    )


def configure(parser) -> None:
    parser.add_argument("--draft", required=True, type=Path, help="draft GGUF (dflash arch)")
    parser.add_argument("--target", required=True, type=Path, help="target GGUF (token embeddings and lm_head)")
    parser.add_argument("--features", required=True, type=Path,
                        help=".npy [n_ctx, taps * target_n_embd]: target features at the context positions")
    parser.add_argument("--tokens", required=True,
                        help="block token ids, comma-separated: anchor then MASK ids")
    parser.add_argument("--out", required=True, type=Path, help="output folder for the .npy files")
    parser.add_argument("--ctx-pos0", type=int, default=0, help="position of the first context row")
    parser.add_argument("--block-pos0", type=int, default=None,
                        help="position of the anchor (default: right after the context)")
    parser.add_argument("--flash-attn", choices=("on", "off"), default="off")
    parser.add_argument("--cache-type", choices=CACHE_TYPES, default="f16", help="draft KV cache type")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tree", type=Path, default=None, help="patched llama.cpp tree (default: the work tree)")
    parser.add_argument("--build", type=Path, default=None, help="its CMake build dir (default: the work build)")
    parser.add_argument("--reference", type=Path, default=None,
                        help="HF checkpoint dir of the draft: also run the float64 reference and print NMSE")


def run(args) -> int:
    from llamacpp_mla_port.proof.programs import compile_program

    tree, build = resolve_tree_and_build(args.tree, args.build)
    binary = compile_program("draft-logits", tree, build)
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    got = run_draft_logits(binary, args.draft, args.target, args.features, tokens, args.out,
                           ctx_pos0=args.ctx_pos0, block_pos0=args.block_pos0,
                           flash_attn=args.flash_attn == "on", cache_type=args.cache_type, threads=args.threads)
    report = {"out": str(args.out), "chain": got.chain.tolist(),
              "confidence": None if got.confidence is None else got.confidence.tolist(),
              "kv_bytes_per_token": got.kv_bytes_per_token}
    if args.reference:
        from llamacpp_mla_port.proof.parity import compare
        from llamacpp_mla_port.proof.reference import DraftReference
        ref = DraftReference.load(args.reference, args.target)
        feats = np.load(args.features)
        n_ctx = feats.shape[0]
        want = ref.forward(feats, tokens, ctx_positions=args.ctx_pos0 + np.arange(n_ctx),
                           block_pos0=args.block_pos0)
        report["parity"] = compare(got, want)
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0
