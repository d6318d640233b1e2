"""`build`: CMake Release build of the patched work tree (the work is in build.py)."""

from __future__ import annotations

import argparse

from llamacpp_mla_port.build import DEFAULT_TARGETS, RPC_TARGETS, ensure_build
from llamacpp_mla_port.commands.common import add_tree_args, old_spelling, shared
from llamacpp_mla_port.series.worktree import require_applied


def configure(parser: argparse.ArgumentParser) -> None:
    add_tree_args(parser, tree_help="llama.cpp source tree (default: <work-dir>/llama.cpp; "
                                    "$MLA_PORT_TREE is for reading, never built)",
                  build_help="CMake build dir (default: <work-dir>/build)")
    shared(parser, "--cmake-target", help=f"build this CMake target (repeatable; default: {' '.join(DEFAULT_TARGETS)})")
    shared(parser, "--cmake-arg")
    # with llama.cpp's RPC backend (-DGGML_RPC=ON) and ggml-rpc-server by default: the one
    # configuration the tests, smoke, bench and the canary share. --rpc (the default) is hidden:
    # in draft-logits --rpc names RPC servers.
    old_spelling(parser, "--rpc", "nothing (the RPC backend is on by default)", dest="rpc", action="store_true")
    parser.add_argument("--no-rpc", dest="rpc", action="store_false",
                        help="without llama.cpp's RPC backend (built by default: -DGGML_RPC=ON and ggml-rpc-server, "
                             "the one configuration the tests, smoke, bench and the canary share; reconfigures "
                             "and recompiles a shared build dir: give it a --build-dir of its own)")
    shared(parser, "--jobs", help="parallel compile jobs (default: all cores)")
    parser.add_argument("--quiet", action="store_true", help="do not stream the build output")


def run(args: argparse.Namespace, places) -> int:
    tree, build_dir = places.owned.tree, places.owned.dir
    require_applied(tree)
    targets = args.targets or list(DEFAULT_TARGETS)
    if not args.rpc:
        targets = [t for t in targets if t not in RPC_TARGETS]
    out = ensure_build(tree, build_dir, targets, args.cmake_args, jobs=args.jobs, echo=not args.quiet, rpc=args.rpc)
    print(f"built {' '.join(targets)} in {out / 'bin'}")
    return 0
