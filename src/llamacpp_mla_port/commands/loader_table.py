"""`loader-table`: the doctor's table of what the loader requires, read from the patched tree.

Without --write: exit 1 and print the drift when the checkout's table differs from a fresh
read of the tree. With --write: rewrite it (then commit it). The work is doctor/loader_table.py.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from llamacpp_mla_port.commands.common import add_tree_args
from llamacpp_mla_port.doctor.loader_table import TABLE_NAME, generate, render

#: where the table lives in a checkout (shipped as package data)
TABLE_IN_CHECKOUT = Path("src") / "llamacpp_mla_port" / "doctor" / "data" / TABLE_NAME


def configure(parser: argparse.ArgumentParser) -> None:
    add_tree_args(parser, build=False, tree_help="the patched llama.cpp tree (default: <work-dir>/llama.cpp, "
                                                 "after `make patch`, or $MLA_PORT_TREE)")
    parser.add_argument("--write", action="store_true", help=f"rewrite {TABLE_IN_CHECKOUT} from the tree")


def run(args: argparse.Namespace, places) -> int:
    tree = places.tree
    fresh = render(generate(tree))
    path = places.root / TABLE_IN_CHECKOUT
    if args.write:
        path.write_text(fresh, encoding="utf-8")
        print(f"wrote {path}")
        return 0
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    if old == fresh:
        print(f"{TABLE_IN_CHECKOUT} matches {tree}")
        return 0
    sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), fresh.splitlines(True),
                                               str(TABLE_IN_CHECKOUT), f"{tree} (fresh)"))
    print(f"error: {TABLE_IN_CHECKOUT} drifted from the loader: run `llamacpp-mla-port loader-table --write` "
          "and commit it", file=sys.stderr)
    return 1
