"""`harness-diff`: upstream's own tests on the pinned base and on the patched tree, built with
the same flags (upstreaming/harness_diff.py): every case that passes on the base must pass
patched. Default: the whole series (the work tree); --stack NAME: that PR stack alone.

    llamacpp-mla-port harness-diff [--stack NAME] [--isa native,avx2,scalar]
                                   [--ops MUL_MAT,FLASH_ATTN_EXT] [--no-archs] [-j N]

Writes work/harness-diff/<series|stack>/report.json and report.md; exit 1 on a regression.
"""

from __future__ import annotations

import sys

from llamacpp_mla_port.commands.common import add_source_args, options, shared


def configure(parser) -> None:
    from llamacpp_mla_port.upstreaming.harness_diff import HARNESS_OPS, ISA_BUILDS

    add_source_args(parser)
    shared(parser, "--stack", action="store", dest="stack", default=None,
           help="one PR stack alone on the base (default: the whole series)")
    shared(parser, "--isa", help="ggml-cpu builds to compare, of " + ",".join(ISA_BUILDS) + " (default: all for "
                                 "the series; for a stack, all when it edits ggml-cpu, else native)")
    parser.add_argument("--ops", default=None,
                        help="test-backend-ops ops (default: " + ",".join(HARNESS_OPS) + "; none for a "
                             "stack that leaves ggml-cpu alone)")
    parser.add_argument("--no-archs", action="store_true", help="leave out test-llama-archs")
    shared(parser, "--jobs")


def run(args, places) -> int:
    from llamacpp_mla_port import project
    from llamacpp_mla_port.series import stacks
    from llamacpp_mla_port.source import obtain
    from llamacpp_mla_port.series.spec import load_series
    from llamacpp_mla_port.series.worktree import require_applied
    from llamacpp_mla_port.upstreaming import harness_diff as hd

    opts = options(args, places)
    pin = opts.pin()
    # the base from the obtain cache: a read-only verb never moves the work tree
    base = obtain.obtain(pin, opts.source, opts.git_url, opts.sdist_file)
    repo = obtain.cache_repo()
    root = places.harness_diff_dir

    def listed(text: str | None, default: list[str]) -> list[str]:
        return default if text is None else [s for s in text.split(",") if s]

    if args.stack:
        series = load_series(places.templates_dir)
        rs = stacks.render_stack(repo, series, series.stack(args.stack), base.sha, pin.tag, {"pin": pin})
        isas, ops = hd.stack_scope(stacks.diffstat(repo, base.sha, rs.head)["files"])
        report = hd.sweep(repo, root, args.stack, base.sha, rs.head, pin.short, listed(args.isa, isas),
                          listed(args.ops, ops), archs=not args.no_archs, jobs=args.jobs, reuse=False, log=print)
    else:
        if not (places.work_tree / "CMakeLists.txt").is_file():
            print("error: no patched work tree: run `make patch` first", file=sys.stderr)
            return 1
        require_applied(places.work_tree)
        hd.export_commit(repo, base.sha, project.tree_in(root / "base"))
        report = hd.run_diff(root / "base", places.work_dir, isas=listed(args.isa, list(hd.ISA_BUILDS)),
                             ops=listed(args.ops, list(hd.HARNESS_OPS)), archs=not args.no_archs,
                             jobs=args.jobs, log=print)
        report.update({"target": "series", "base": pin.short, "base_sha": base.sha})
        hd.write_report(root / "series", report)
    out = root / report["target"]
    print(f"{'ok' if report['ok'] else 'REGRESSIONS'}: {out / 'report.md'}")
    return 0 if report["ok"] else 1
