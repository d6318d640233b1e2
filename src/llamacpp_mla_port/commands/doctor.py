"""`doctor`: diagnose (and repair) a K3 DSpark draft GGUF from its header and metadata.

Arguments, exit code and the human-readable printout; the checks are doctor/checks.py and
the diagnosis and repair doctor/diagnose.py (its module doc lists the exit codes and what can be fixed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from llamacpp_mla_port.commands.common import shared
from llamacpp_mla_port.doctor.diagnose import diagnose, fix_metadata
from llamacpp_mla_port.doctor.findings import ERROR, OK, WARNING, Finding
from llamacpp_mla_port.errors import PortError

EPILOG = """exit codes: 0 all checks ok, 1 warnings only, 2 errors (or unreadable GGUF).
With --fix-metadata: the exit code of the re-check of OUT.gguf."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("draft", type=Path, metavar="DRAFT.gguf", help="the draft GGUF to diagnose")
    shared(parser, "--target", help="the target GGUF: compare n_embd, vocabulary, tokenizer, taps and embeddings")
    shared(parser, "--json", help="machine-readable output on stdout")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the evidence of passing checks too")
    fix = parser.add_argument_group("repair (writes a corrected copy, never in place)")
    fix.add_argument("--fix-metadata", type=Path, metavar="OUT.gguf",
                     help="write a corrected copy to OUT.gguf and re-run the checks on it")
    src = fix.add_mutually_exclusive_group()
    src.add_argument("--target-layers", metavar="IDS",
                     help="HF target_layer_ids, 0-based, comma-separated (e.g. 2,23,47,71,89); +1 is applied")
    src.add_argument("--from-config", type=Path, metavar="config.json",
                     help="take target_layer_ids, mask_token_id (and block_size if present) from a config.json")
    fix.add_argument("--block-size", type=int, metavar="N", help="set dflash.block_size")
    shared(fix, "--force", help="overwrite OUT.gguf if it exists")


def run(args: argparse.Namespace, places) -> int:
    fixing = args.fix_metadata is not None
    if not fixing and (args.target_layers or args.from_config or args.block_size is not None):
        raise PortError("--target-layers, --from-config and --block-size need --fix-metadata OUT.gguf",
                        "add --fix-metadata OUT.gguf (the input is never modified)")
    report, findings = diagnose(args.draft, args.target)
    code = report["exit_code"]
    if fixing:
        changes = fix_metadata(args.draft, args.fix_metadata, args.target_layers, args.from_config,
                               args.block_size, args.force)
        fixed, ffindings = diagnose(args.fix_metadata, args.target)
        code = fixed["exit_code"]
        report["fixed"] = {**fixed, "changes": changes}
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        out = _Printer(sys.stdout, args.verbose)
        out.section(report, findings)
        if fixing:
            out.changes(report["fixed"]["changes"], args.fix_metadata)
            out.section(report["fixed"], ffindings)
    return code


# --- human output ------------------------------------------------------------------------

class _Printer:
    COLOURS = {OK: "\x1b[32m", WARNING: "\x1b[33m", ERROR: "\x1b[31m"}
    MARKS = {OK: "ok  ", WARNING: "WARN", ERROR: "FAIL"}

    def __init__(self, stream: Any, verbose: bool = False):
        self.stream = stream
        self.verbose = verbose
        self.colour = hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR")

    def _c(self, verdict: str, text: str) -> str:
        return f"{self.COLOURS[verdict]}{text}\x1b[0m" if self.colour else text

    def _bold(self, text: str) -> str:
        return f"\x1b[1m{text}\x1b[0m" if self.colour else text

    def section(self, report: dict[str, Any], findings: list[Finding]) -> None:
        w = self.stream.write
        w(self._bold(f"{report['file']}") + f"  ({report['architecture']}, {report['layout']} layout, "
          f"GGUF v{report['gguf_version']}, {report['tensors']} tensors, {report['kv']} keys, "
          f"{report['file_size']:,} bytes)\n")
        for f in findings:
            w(f"  [{self._c(f.verdict, self.MARKS[f.verdict])}] {f.check:<18} {f.title}\n")
            if f.verdict != OK or self.verbose:
                w(f"         {'':<18} {f.evidence}\n")
            if f.fix and f.verdict != OK:
                w(f"         {'':<18} fix: {f.fix}\n")
        n = {v: sum(1 for f in findings if f.verdict == v) for v in (OK, WARNING, ERROR)}
        code = report["exit_code"]
        verdict = {0: OK, 1: WARNING, 2: ERROR}[code]
        words = {0: "fine", 1: "loads, with warnings", 2: "will not work as is"}[code]
        w(self._c(verdict, f"  => {words}: {n[OK]} ok, {n[WARNING]} warnings, {n[ERROR]} errors "
                  f"(exit {code})") + "\n\n")

    def changes(self, changes: dict[str, Any], out: Path) -> None:
        self.stream.write(self._bold(f"wrote {out}") + " with " +
                          ", ".join(f"{k} = {v}" for k, v in changes.items()) + "; re-checking:\n")
