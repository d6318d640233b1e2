"""`parity`: the draft's logit-parity matrix (3 shapes x 5 precision modes) against one build,
and the per-mode threshold table (the work is proof/parity.py).

    llamacpp-mla-port parity [--build-dir DIR] [--tree DIR] [--scratch-dir DIR] [--json]

Any build of the patched tree that has libllama and test-llama-archs will do, e.g. a
portable one: `llamacpp-mla-port build --build-dir work/build-portable
--cmake-arg=-DGGML_NATIVE=OFF --cmake-target llama --cmake-target test-llama-archs`. Exit 1 when a case
is over its bound.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from llamacpp_mla_port.commands.common import add_scratch_arg, add_tree_args, log, shared
from llamacpp_mla_port.proof.parity import format_mode_table, run_matrix


def configure(parser) -> None:
    add_tree_args(parser, build_help="the CMake build dir to test (default: the work build, or $MLA_PORT_BUILD)")
    add_scratch_arg(parser, "folder for checkpoints, runs and parity-report.json (default: a fresh temporary folder)")
    shared(parser, "--threads")
    shared(parser, "--json", help="print the mode table as JSON instead of text")


def run(args, places) -> int:
    tree, build = places.build.require_tree().tree, places.build.dir
    work = args.scratch_dir or Path(tempfile.mkdtemp(prefix="mla-port-parity-"))
    result = run_matrix(tree.resolve(), build.resolve(), work.resolve(), threads=args.threads, log=log)
    table = result.report["modes"]
    if args.json:
        sys.stdout.write(json.dumps({"build": str(build), "system_info": result.report.get("system_info"),
                                     "modes": table}, indent=2) + "\n")
    else:
        sys.stdout.write(f"build {build}: {result.report.get('system_info', '')}\n{format_mode_table(table)}\n"
                         f"every figure per case: {work / 'parity' / 'parity-report.json'}\n")
    return 0 if result.passed else 1
