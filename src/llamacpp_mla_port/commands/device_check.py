"""`device-check`: the GPU check, prepared here and run on a device machine (the work is
device/; docs/device-check.md).

    llamacpp-mla-port device-check [--dry-run] [--tree DIR --build DIR]
        make work/device-bundle/ (pruned patched tree, wheels, fixtures, driver) and print the
        one device call that runs it; --dry-run then runs the bundle here with CUDA off
        (report in work/device-check/)
    llamacpp-mla-port device-check --run --bundle DIR --out DIR --work DIR [--dry-run]
        the driver itself (what the bundle's run.sh calls, on the device or in the dry run)

Exit 1 when a stage of the check fails.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llamacpp_mla_port import process
from llamacpp_mla_port.commands.common import add_scratch_arg, add_tree_args, log, old_spelling, shared


def configure(parser) -> None:
    from llamacpp_mla_port.device.bundle import DEFAULT_STAGES, STAGES

    parser.add_argument("--dry-run", action="store_true",
                        help="after preparing, run the bundle here with CUDA off (work/device-check/)")
    add_tree_args(parser, build_help="its CPU build, for the fixtures (default: the work build, or $MLA_PORT_BUILD)")
    parser.add_argument("--bundle", type=Path, default=None, help="the bundle folder (default: work/device-bundle)")
    # how many lossless prompts (--prompts, its old spelling, still read: in draft-length --prompts is a file)
    parser.add_argument("--n-prompts", dest="prompts", type=int, default=8, metavar="N",
                        help="lossless prompts (default 8)")
    old_spelling(parser, "--prompts", "--n-prompts", dest="prompts", type=int)
    g = parser.add_argument_group("the driver (run.sh)")
    g.add_argument("--run", action="store_true", help="run the check from --bundle (what run.sh does)")
    shared(g, "--out", default=None, help="report folder")
    add_scratch_arg(g, "scratch folder (tree, build, models)")
    g.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run (default: 540 on the device, none in a dry run)")
    shared(g, "--stages", help="comma-separated, of " + ",".join(STAGES)
           + " (default: " + ",".join(DEFAULT_STAGES) + ")")


def run(args, places) -> int:
    from llamacpp_mla_port.device import bundle as device
    from llamacpp_mla_port.device.check import run_check
    from llamacpp_mla_port.device.report import format_report
    from llamacpp_mla_port.errors import DeviceCheckError

    if args.run:
        if not (args.bundle and args.out and args.scratch_dir):
            raise DeviceCheckError("--run needs --bundle, --out and --scratch-dir (--work)",
                                   hint="run the bundle's run.sh")
        budget = args.budget if args.budget is not None else (None if args.dry_run else device.DEVICE_BUDGET_S)
        stages = tuple(s for s in args.stages.split(",") if s) if args.stages else device.DEFAULT_STAGES
        report = run_check(args.bundle, args.out, args.scratch_dir, args.dry_run, budget, stages)
        sys.stdout.write(format_report(report))
        return 0 if report["ok"] else 1

    root = places.root
    tree, build = places.build.require_tree().tree, places.build.dir
    folder = args.bundle or places.device_bundle
    manifest = device.prepare_bundle(tree, build, folder, places.templates_dir, places.patches_dir, repo_root=root,
                                     n_prompts=args.prompts, log=log)
    sys.stdout.write((folder / "README.md").read_text())
    sys.stdout.write(f"\nbundle {folder}: {manifest['bundle_bytes']:,} B; with the checkout's travelling files "
                     f"{manifest['carried_total_bytes']:,} B of {manifest['carry_limit_bytes']:,}\n")
    if not args.dry_run:
        return 0
    env = {**os.environ, "DRY_RUN": "1", "MLA_PYTHON": sys.executable, "MLA_DEVICE_OUT": str(places.device_dry_out)}
    # its output shown as it comes; a cold build of the pruned tree and every stage, on this CPU
    return process.run(["bash", folder / "run.sh"], env=env, timeout=4 * 3600, capture=False).returncode
