"""`rebase`: re-render the series onto a newer upstream, move the pin forward; `--canary`
only tries and reports; `--canary --prove` also applies, builds and proves it in a canary
dir of its own (the work is upstreaming/rebase.py and canary.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llamacpp_mla_port.commands.common import add_proof_args, add_tree_args, proof_settings, shared
from llamacpp_mla_port.errors import PortError
from llamacpp_mla_port.project import Places
from llamacpp_mla_port.jsonfile import write_json
from llamacpp_mla_port.upstreaming.rebase import RebaseOptions, format_text, rebase


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--onto", required=True, metavar="COMMIT|PATH|NAME==VERSION|bN|newest",
                        help="the newer upstream: a commit/tag/branch (of --git-url, default the "
                             "pin's URL), a local clone (its HEAD), a plain llama.cpp tree (canary "
                             "only), or a PyPI sdist holding one: a tag / `newest` of "
                             "templates/upstreams.toml (the pin then names its tree), or "
                             "NAME==VERSION (canary only)")
    shared(parser, "--git-url", help="the repository holding --onto (a local clone is fastest)")
    shared(parser, "--force", help="accept an older or unrelated commit (the pin normally moves forward only)")
    parser.add_argument("--canary", action="store_true",
                        help="only try: write nothing, print a JSON report (its verdict: ok, "
                             "review or failed), exit 1 unless ok")
    shared(parser, "--json", help="print the report as JSON")
    parser.add_argument("--tag", help="tag name to record in the pin (default: git describe "
                                      "--exact-match in a local clone, else the short id)")
    shared(parser, "--templates-dir")
    shared(parser, "--patches-dir")
    add_tree_args(parser, tree=False, build=False)      # the work dir: re-applied on success when it exists
    shared(parser, "--source", help="where the OLD pinned base comes from when not cached")
    shared(parser, "--sdist-file", help="the already-downloaded sdist of the old pin")
    g = parser.add_argument_group("the full canary (--canary --prove)")
    g.add_argument("--prove", action="store_true",
                   help="after the anchors: apply with git am -3, build and run the proof on the "
                        "new upstream, in the canary dir; at the end the one-line verdict first, "
                        "then one line per stage and what to review; the JSON report in "
                        "<canary-dir>/canary.json (--json: on stdout); exit 1 unless the verdict is ok")
    g.add_argument("--canary-dir", type=Path, metavar="DIR",
                   help="the canary's own work dir (default: ./work-canary, or "
                        "$MLA_PORT_CANARY_DIR); work/, patches/ and the pin are never touched")
    shared(g, "--cmake-arg", help="extra CMake option for the canary build (repeatable)")
    shared(g, "--jobs")
    g.add_argument("--build-stacks", action="store_true",
                   help="after the build: each PR stack alone on the new upstream, built as `pr` "
                        "builds a commit (upstream CI's CPU flags: GGML_NATIVE=OFF, LLAMA_FATAL_WARNINGS), "
                        "in <canary-dir>/stacks/")
    g.add_argument("--no-proof", action="store_true",
                   help="stop after the builds (the proof is not run; the report says so)")
    add_proof_args(g)
    g.add_argument("--baseline", type=Path, metavar="SMOKE_JSON",
                   help="a `smoke` report (e.g. of the pin: `llamacpp-mla-port smoke > pin.json`) "
                        "whose printed figures the proof's are compared with")


def run(args: argparse.Namespace, places: Places) -> int:
    if args.onto == "newest" and (args.canary or args.prove):
        from llamacpp_mla_port.source.newer import nothing_newer
        from llamacpp_mla_port.source.pin import load_pin

        line = nothing_newer(load_pin(places.pin_file).tag, places.templates_dir)
        if line:
            print(line)
            return 0
    if args.prove:
        return _run_full_canary(args, places)
    opts = RebaseOptions(onto=args.onto, places=places, git_url=args.git_url, force=args.force,
                         canary=args.canary, tag=args.tag, source=args.source, sdist_file=args.sdist_file)
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


def _run_full_canary(args: argparse.Namespace, places: Places) -> int:
    from llamacpp_mla_port.upstreaming.canary import (REPORT_NAME, CanaryOptions, progress_line, run_canary,
                                                      summary_lines)
    opts = CanaryOptions(onto=args.onto, places=places, git_url=args.git_url, tag=args.tag,
                         cmake_args=tuple(args.cmake_args), jobs=args.jobs, **proof_settings(args),
                         baseline=args.baseline, build_stacks=args.build_stacks, prove=not args.no_proof)
    out = sys.stderr if args.json else sys.stdout

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    progress(f"canary: {args.onto} in {opts.canary_dir}")
    report = run_canary(opts, log=progress, on_stage=lambda name, entry: progress(progress_line(name, entry)))
    opts.canary_dir.mkdir(parents=True, exist_ok=True)
    path = opts.canary_dir / REPORT_NAME
    write_json(path, report, indent=2)
    onto = (report.get("onto") or {}).get("tag") or args.onto
    # the one-line verdict first (stdout; with --json on stderr, the report on stdout)
    print("\n".join(summary_lines(report, onto, path)), file=out, flush=True)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1
