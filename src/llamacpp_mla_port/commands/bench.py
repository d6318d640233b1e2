"""`bench`: the draft at Kimi-K3's real dimensions against floors measured in the same run
(the work is bench/run.py; the report bench/report.py). `make bench` runs it.

    llamacpp-mla-port bench [--out DIR] [--threads N] [--repeats R] [--reuse-models] [--stages a,b]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llamacpp_mla_port.project import bin_dir
from llamacpp_mla_port.bench.run import STAGES
from llamacpp_mla_port.commands.common import add_tree_args, shared


def configure(parser: argparse.ArgumentParser) -> None:
    shared(parser, "--out", default=None,
           help="report folder (default: <work dir>/bench): report.md, report.json, plots/, models/")
    add_tree_args(parser)
    shared(parser, "--threads", default=None, help="threads for every measured pass (default: all cores)")
    shared(parser, "--repeats", help="timed repeats per pass, after one warm-up (default 3)")
    parser.add_argument("--reuse-models", action="store_true",
                        help="keep and reuse the real-size models of an earlier run (development)")
    parser.add_argument("--baseline-build", type=Path, default=None, metavar="DIR",
                        help="the sweep stage also times a build of the tree without the commit under test "
                             "(before), interleaved with this one (after)")
    shared(parser, "--stages", help=f"comma-separated subset of {','.join(STAGES)} (default: all; later stages "
                                    "need earlier ones; a subset updates the existing report.json)")


def run(args: argparse.Namespace, places) -> int:
    from llamacpp_mla_port.bench.run import run_bench
    from llamacpp_mla_port.errors import PortError

    stages = None
    if args.stages:
        stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
        unknown = sorted(set(stages) - set(STAGES))
        if unknown:
            raise PortError(f"unknown stage(s) {', '.join(unknown)}", hint=f"choose from {', '.join(STAGES)}")
    tree, build = places.build.require_tree().tree, places.build.dir
    out = args.out or places.bench_dir
    if args.baseline_build is not None and not bin_dir(args.baseline_build).is_dir():
        raise PortError(f"--baseline-build {args.baseline_build}: not a build dir (no bin/)",
                        hint="build the tree without the commit first, e.g. `llamacpp-mla-port build --tree "
                             "DIR --build-dir DIR-build` (docs/bench.md)")
    report = run_bench(tree, build, out, threads=args.threads, repeats=args.repeats, reuse_models=args.reuse_models,
                       stages=stages, baseline=args.baseline_build, root=places.root)
    seconds = report["last_partial_run_seconds"] if stages else report["total_seconds"]
    print(f"report: {Path(out) / 'report.md'} ({seconds} s)")
    failed = [k for k, v in report["stages"].items() if not v["ok"]]
    return 1 if failed else 0
