"""`rebase`: re-render the series onto a newer upstream, move the pin forward; `--canary`
only tries and reports (the work is rebase.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llamacpp_mla_port.errors import PortError
from llamacpp_mla_port.rebase import RebaseOptions, format_text, rebase
from llamacpp_mla_port.upstream import SOURCES


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--onto", required=True, metavar="COMMIT|PATH",
                        help="the newer upstream: a commit/tag/branch (of --git-url, default the "
                             "pin's URL), a local clone (its HEAD), or a plain llama.cpp tree "
                             "(canary only)")
    parser.add_argument("--git-url", metavar="URL|PATH",
                        help="the repository holding --onto (a local clone is fastest)")
    parser.add_argument("--force", action="store_true",
                        help="accept an older or unrelated commit (the pin normally moves "
                             "forward only)")
    parser.add_argument("--canary", action="store_true",
                        help="only try: write nothing, print a JSON report, exit 1 at the "
                             "first failing change")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--tag", help="tag name to record in the pin (default: git describe "
                                      "--exact-match in a local clone, else the short id)")
    parser.add_argument("--templates-dir", type=Path, metavar="DIR",
                        help="the port description (default: ./templates)")
    parser.add_argument("--patches-dir", type=Path, metavar="DIR",
                        help="the exported series (default: ./patches)")
    parser.add_argument("--work-dir", type=Path, metavar="DIR",
                        help="tool-owned work dir, re-applied on success when it exists "
                             "(default: ./work, or $MLA_PORT_WORK_DIR)")
    parser.add_argument("--source", choices=SOURCES, default="auto",
                        help="where the OLD pinned base comes from when not cached")
    parser.add_argument("--sdist-file", type=Path, metavar="PATH",
                        help="the already-downloaded sdist of the old pin")


def run(args: argparse.Namespace) -> int:
    opts = RebaseOptions(onto=args.onto, git_url=args.git_url, force=args.force,
                         canary=args.canary, tag=args.tag, templates_dir=args.templates_dir,
                         patches_dir=args.patches_dir, work_dir=args.work_dir,
                         source=args.source, sdist_file=args.sdist_file)
    as_json = args.json or args.canary
    log = (lambda *a: print(*a, file=sys.stderr)) if as_json else print
    try:
        o = rebase(opts, log=log)
    except PortError as err:
        if not as_json:
            raise
        print(json.dumps({"ok": False, "status": "error", "error": {
            "kind": type(err).__name__, "message": err.message, "hint": err.hint}}, indent=2))
        return err.exit_code
    if as_json:
        print(json.dumps(o.to_json(), indent=2))
    else:
        print(format_text(o))
    return 0 if o.ok else 1
