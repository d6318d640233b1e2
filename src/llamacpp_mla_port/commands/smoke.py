"""`smoke`: build, make the fixtures, run parity, the target side and lossless speculative
decoding; print ONE JSON report; exit 1 when any stage fails (the work is proof/smoke.py).

    llamacpp-mla-port smoke [--scratch-dir DIR] [--tree DIR --build-dir DIR] [--no-build] [--no-server] [--quick]
"""

from __future__ import annotations

import json
import sys

from llamacpp_mla_port.commands.common import add_proof_args, add_scratch_arg, add_tree_args, proof_settings
from llamacpp_mla_port.proof.smoke import run_smoke


def configure(parser) -> None:
    add_scratch_arg(parser, "folder for fixtures and runs (default: a fresh temporary folder)")
    add_tree_args(parser)
    parser.add_argument("--no-build", action="store_true", help="use the existing build as it is")
    add_proof_args(parser)


def run(args, places) -> int:
    report = run_smoke(places.build, args.scratch_dir, no_build=args.no_build, **proof_settings(args))
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1
