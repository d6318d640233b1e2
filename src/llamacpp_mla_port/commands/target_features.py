"""`target-features`: dump the hidden states the patched Kimi-K3 target hands a draft.

    llamacpp-mla-port target-features --target T.gguf (--draft D.gguf | --layers 1,3) \\
        --tokens 1,2,3 --out DIR [--dump NAME,...] [--tree ... --build-dir ...]

The work is proof/run/target_features.py (the program and the independent prefix stream).
"""

from __future__ import annotations

import argparse
import json
import sys

from llamacpp_mla_port.commands.common import add_tree_args, shared
from llamacpp_mla_port.proof.run.programs import compile_program
from llamacpp_mla_port.proof.run.target_features import dump_target_features


def configure(parser: argparse.ArgumentParser) -> None:
    shared(parser, "--target", required=True, help="target GGUF (patched Kimi-K3)")
    group = parser.add_mutually_exclusive_group(required=True)
    shared(group, "--draft", help="take the layers from this draft's dflash.target_layers")
    group.add_argument("--layers", help="comma-separated llama.cpp layer indices (their INPUT is dumped)")
    shared(parser, "--tokens", required=True, help="comma-separated prompt token ids")
    shared(parser, "--out", required=True, help="output folder (features.npy, logits.npy, ...)")
    parser.add_argument("--dump", default="", help="comma-separated graph tensor names to dump as well")
    add_tree_args(parser)


def run(args, places) -> int:
    tree, build = places.build.require_tree().tree, places.build.dir
    binary = compile_program("target-features", tree, build)
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    got = dump_target_features(binary, args.target, [int(t) for t in args.tokens.split(",")], args.out,
                               layers=layers, draft=args.draft, dump=[d for d in args.dump.split(",") if d])
    sys.stdout.write(json.dumps({"out": str(args.out), "layers": got.layers,
                                 "features_shape": list(got.features.shape)}) + "\n")
    return 0
