"""`draft-logits`: run the patched llama.cpp draft on given target features and block ids.

    llamacpp-mla-port draft-logits --draft draft.gguf --target target.gguf \\
        --features feats.npy --tokens 163837,163837,... --out outdir/ [--reference ckpt_dir]

Writes outdir/{biased_logits,chain,hidden,base_logits[,confidence]}.npy and meta.json
(see proof/run/cpp/draft-logits.cpp). With --reference the float64 reference of the same HF
checkpoint runs on the same inputs and the NMSE per output is printed, which is the check
llama.cpp asks of a model port; in a reduced precision (F16/Q8_0 cache, flash attention,
BF16 weights) also the staged NMSE against the reference emulating the CPU backend's
roundings (proof/parity.py), the figure the parity bounds apply to.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from llamacpp_mla_port.commands.common import add_tree_args, shared
from llamacpp_mla_port.proof.reference.model import stream_taps
from llamacpp_mla_port.proof.run.draft_logits import CACHE_TYPES, run_draft_logits
from llamacpp_mla_port.proof.run.programs import compile_program


def configure(parser) -> None:
    shared(parser, "--draft", required=True, help="draft GGUF (dflash arch)")
    shared(parser, "--target", required=True, help="target GGUF (token embeddings and lm_head)")
    parser.add_argument("--features", required=True, type=Path,
                        help=".npy [n_ctx, taps * target_n_embd]: target features at the context positions")
    shared(parser, "--tokens", required=True, help="block token ids, comma-separated: anchor then MASK ids")
    shared(parser, "--out", required=True, help="output folder for the .npy files")
    parser.add_argument("--ctx-pos0", type=int, default=0, help="position of the first context row")
    parser.add_argument("--block-pos0", type=int, default=None,
                        help="position of the anchor (default: right after the context)")
    parser.add_argument("--flash-attn", choices=("on", "off"), default="off")
    parser.add_argument("--cache-type", choices=CACHE_TYPES, default="f16", help="draft KV cache type")
    shared(parser, "--threads")
    parser.add_argument("--rpc", default=None, metavar="HOST:PORT,...",
                        help="llama.cpp RPC servers (ggml-rpc-server) whose devices the models may use")
    parser.add_argument("--draft-devices", default=None, metavar="DEV,...",
                        help="devices for the draft's layers, llama.cpp's names (RPC0, RPC1, ...; default: CPU)")
    parser.add_argument("--target-devices", default=None, metavar="DEV,...",
                        help="devices for the target (its token embeddings and lm_head serve the draft)")
    add_tree_args(parser)
    parser.add_argument("--reference", type=Path, default=None,
                        help="HF checkpoint dir of the draft: also run the reference and print NMSE "
                             "(float64, and emulating the backend in a reduced precision)")


def run(args, places) -> int:
    tree, build = places.build.require_tree().tree, places.build.dir
    binary = compile_program("draft-logits", tree, build)
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    ref = None
    if args.reference:
        from llamacpp_mla_port.proof.reference.model import DraftReference
        ref = DraftReference.load(args.reference, args.target)
    got = run_draft_logits(binary, args.draft, args.target, args.features, tokens, args.out, ctx_pos0=args.ctx_pos0,
                           block_pos0=args.block_pos0, flash_attn=args.flash_attn == "on", cache_type=args.cache_type,
                           threads=args.threads, rpc=args.rpc, draft_devices=args.draft_devices,
                           target_devices=args.target_devices, dump=stream_taps(ref.config.n_layers) if ref else ())
    report = {"out": str(args.out), "chain": got.chain.tolist(),
              "confidence": None if got.confidence is None else got.confidence.tolist(),
              "kv_bytes_per_token": got.kv_bytes_per_token}
    if ref is not None:
        from llamacpp_mla_port.proof.parity import compare, compare_staged
        from llamacpp_mla_port.proof.reference.precision import cpu_precision, gguf_tensor_types
        feats = np.load(args.features).astype(np.float32).astype(np.float64)
        where = {"ctx_positions": args.ctx_pos0 + np.arange(feats.shape[0]), "block_pos0": args.block_pos0}
        report["parity"] = compare(got, ref.forward(feats, tokens, **where))
        precision = cpu_precision(args.cache_type, args.flash_attn == "on", len(tokens),
                                  {**gguf_tensor_types(args.draft),
                                   "output.weight": gguf_tensor_types(args.target)["output.weight"]})
        if not precision.exact:
            # like with like: the reference rounding where the CPU backend rounds, stage by stage
            fed = ref.forward(feats, tokens, precision=precision, feed=got.dumps, chain=got.chain, **where)
            report["parity_emulated_staged"] = compare_staged(got.dumps, got, fed, ref.config.n_layers)
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0
