"""`harness-diff`: upstream's own tests on the pinned base and on the patched tree, built with
the same flags (upstreaming/harness_diff.py): every case that passes on the base must pass
patched. Default: the whole series (the work tree); --stack NAME: that PR stack alone.

    llamacpp-mla-port harness-diff [--stack NAME] [--isa native,avx2,scalar]
                                   [--ops MUL_MAT,FLASH_ATTN_EXT] [--no-archs] [-j N]

Writes work/harness-diff/<series|stack>/report.json and report.md; exit 1 on a regression.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

from llamacpp_mla_port.commands.common import add_source_args, options


def configure(parser) -> None:
    from llamacpp_mla_port.upstreaming.harness_diff import HARNESS_OPS, ISA_BUILDS

    add_source_args(parser)
    parser.add_argument("--stack", default=None, help="one PR stack alone on the base (default: the whole series)")
    parser.add_argument("--isa", default=",".join(ISA_BUILDS),
                        help="ggml-cpu builds to compare, of " + ",".join(ISA_BUILDS) + " (default: all)")
    parser.add_argument("--ops", default=",".join(HARNESS_OPS),
                        help="test-backend-ops ops (default: " + ",".join(HARNESS_OPS) + ")")
    parser.add_argument("--no-archs", action="store_true", help="leave out test-llama-archs")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="parallel build jobs")


def _export(repo, sha: str, dest: Path) -> Path:
    """The tree of commit `sha` in dest (kept while it is the same commit)."""
    stamp = dest.parent / "commit.txt"
    if (dest / "CMakeLists.txt").is_file() and stamp.is_file() and stamp.read_text().strip() == sha:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    data = repo.git.archive(sha, stdout_as_string=False)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    # the archive dates every file at its commit: newer than the side's last build, or make
    # would keep the objects of the tree exported before
    now = time.time()
    for path in dest.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.utime(path, (now, now))
    stamp.write_text(sha + "\n")
    return dest


def run(args) -> int:
    from llamacpp_mla_port import project
    from llamacpp_mla_port.series import stacks
    from llamacpp_mla_port.source import obtain
    from llamacpp_mla_port.series.spec import load_series
    from llamacpp_mla_port.series.worktree import require_applied
    from llamacpp_mla_port.upstreaming.harness_diff import markdown, run_diff

    opts = options(args)
    pin = opts.pin()
    # the base from the obtain cache: a read-only verb never moves the work tree
    base = obtain.obtain(pin, opts.source, opts.git_url, opts.sdist_file)
    repo = obtain.cache_repo()
    places = project.places()
    root = places.harness_diff_dir
    base_dir = root / "base"
    _export(repo, base.sha, project.tree_in(base_dir))
    if args.stack:
        series = load_series(places.templates_dir)
        rs = stacks.render_stack(repo, series, series.stack(args.stack), base.sha, pin.tag, {"pin": pin})
        name, side = args.stack, root / args.stack
        _export(repo, rs.head, project.tree_in(side))
    else:
        name, side = "series", places.work_dir
        if not (places.work_tree / "CMakeLists.txt").is_file():
            print("error: no patched work tree: run `make patch` first", file=sys.stderr)
            return 1
        require_applied(places.work_tree)
    report = run_diff(base_dir, side,
                      isas=[s for s in args.isa.split(",") if s], ops=[s for s in args.ops.split(",") if s],
                      archs=not args.no_archs, jobs=args.jobs, log=print)
    report.update({"target": name, "base": pin.short})
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(f"Base {report['base']} against {name}, the same flags on both sides:\n\n"
                                   + markdown(report))
    print(f"{'ok' if report['ok'] else 'REGRESSIONS'}: {out / 'report.md'}")
    return 0 if report["ok"] else 1
