"""`doctor`: diagnose (and repair) a Kimi-K3 DSpark draft GGUF from its header.

    llamacpp-mla-port doctor DRAFT.gguf [--target TARGET.gguf] [--json]
        [--fix-metadata OUT.gguf [--target-layers 2,23,47,71,89 | --from-config config.json]
                                 [--block-size 7] [--force]]

Reads the header and metadata only (the embedding comparison with --target reads the two
`token_embd` tables in bounded chunks). Every header is validated by the bounded reader in
`gguf_safe` before anything trusts it: a hostile or broken file gives a one-line
GGUFError, never a traceback or a huge allocation.

Exit codes:
    0  every check is ok
    1  warnings only (the file loads; something deserves a look)
    2  at least one error (the file will not load or will draft garbage), or the file is
       not a readable GGUF (GGUFError), or a usage error

With --fix-metadata the exit code is the one of the corrected copy's re-check. The copy is
never written in place: OUT must differ from DRAFT. Fixable metadata:
    dflash.target_layers   --target-layers takes the HF 0-based target_layer_ids (the +1 of
                           llama.cpp's convention is applied); --from-config reads
                           target_layer_ids (top level or dflash_config) from a config.json
    dflash.block_size      --block-size, or block_size from the config
    tokenizer.ggml.mask_token_id   mask_token_id from the config
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from gguf.constants import GGUFValueType

from llamacpp_mla_port.doctor_checks import ERROR, OK, WARNING, Finding, exit_code, key, run_checks
from llamacpp_mla_port.errors import GGUFError, PortError
from llamacpp_mla_port.gguf_safe import GGUFHeader, read_header, rewrite_metadata

EPILOG = """exit codes: 0 all checks ok, 1 warnings only, 2 errors (or unreadable GGUF).
With --fix-metadata: the exit code of the re-check of OUT.gguf."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("draft", type=Path, metavar="DRAFT.gguf", help="the draft GGUF to diagnose")
    parser.add_argument("--target", type=Path, metavar="TARGET.gguf",
                        help="the target GGUF: compare n_embd, vocabulary, tokenizer, taps and embeddings")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")
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
    fix.add_argument("--force", action="store_true", help="overwrite OUT.gguf if it exists")


def run(args: argparse.Namespace) -> int:
    fixing = args.fix_metadata is not None
    if not fixing and (args.target_layers or args.from_config or args.block_size is not None):
        raise PortError("--target-layers, --from-config and --block-size need --fix-metadata OUT.gguf",
                        "add --fix-metadata OUT.gguf (the input is never modified)")
    draft = read_header(args.draft)
    target = read_header(args.target) if args.target else None
    fix_hint = f"llamacpp-mla-port doctor {args.draft} --fix-metadata OUT.gguf"
    _ctx, findings = run_checks(draft, target, fix_hint)
    report: dict[str, Any] = {"file": str(args.draft), "target": str(args.target) if args.target else None,
                              **_summary(draft, _ctx.layout), "findings": [f.as_dict() for f in findings],
                              "exit_code": exit_code(findings)}
    code = report["exit_code"]
    if fixing:
        changes = _planned_changes(args, draft)
        _write_fixed(args, draft, changes)
        fixed = read_header(args.fix_metadata)
        fctx, ffindings = run_checks(fixed, target, fix_hint)
        code = exit_code(ffindings)
        report["fixed"] = {"file": str(args.fix_metadata),
                           "changes": {k: v[1] for k, v in changes.items()},
                           **_summary(fixed, fctx.layout),
                           "findings": [f.as_dict() for f in ffindings], "exit_code": code}
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


def _summary(h: GGUFHeader, layout: str) -> dict[str, Any]:
    return {"architecture": h.arch, "layout": layout, "gguf_version": h.version,
            "tensors": len(h.tensors), "kv": len(h.kvs), "file_size": h.file_size}


# --- repair ------------------------------------------------------------------------------

def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise PortError(f"--target-layers {text!r}: not a comma-separated list of integers",
                        "e.g. --target-layers 2,23,47,71,89 (HF target_layer_ids, 0-based)") from None
    return ids


def _read_config(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > 16 << 20:
            raise PortError(f"{path} is over 16 MiB: not a config.json", "pass the model's config.json")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise PortError(f"cannot read {path}: {err.strerror}", "check the path") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise PortError(f"{path} is not valid JSON: {err}", "pass the model's config.json") from None
    if not isinstance(data, dict):
        raise PortError(f"{path} does not hold a JSON object", "pass the model's config.json")
    return data


def _planned_changes(args: argparse.Namespace, draft: GGUFHeader) -> dict[str, tuple[GGUFValueType, Any, Any]]:
    changes: dict[str, tuple[GGUFValueType, Any, Any]] = {}
    hf_ids: list[int] | None = None
    block = args.block_size
    mask = None
    if args.target_layers:
        hf_ids = _parse_ids(args.target_layers)
    elif args.from_config:
        cfg = _read_config(args.from_config)
        sub = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
        if "target_layer_ids" in cfg or "target_layer_ids" in sub:
            hf_ids = cfg.get("target_layer_ids", sub.get("target_layer_ids"))
        elif "aux_hidden_state_layer_ids" in cfg:   # EAGLE3-style: already the layer inputs
            hf_ids = [int(i) - 1 for i in cfg["aux_hidden_state_layer_ids"]]
        mask = cfg.get("mask_token_id", sub.get("mask_token_id"))
        if block is None:
            block = cfg.get("block_size", sub.get("block_size"))
        if hf_ids is None and mask is None and block is None:
            raise PortError(f"{args.from_config} has no target_layer_ids, mask_token_id or block_size",
                            "pass the draft checkpoint's config.json (Inferact/Kimi-K3-DSpark)")
    if hf_ids is not None:
        def is_layer(i: Any) -> bool:
            return isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 20
        if not isinstance(hf_ids, list) or not hf_ids or not all(is_layer(i) for i in hf_ids):
            raise PortError(f"target_layer_ids {hf_ids!r} is not a non-empty list of layer numbers",
                            "HF target_layer_ids are 0-based target layers, e.g. 2,23,47,71,89")
        if any(b <= a for a, b in zip(hf_ids, hf_ids[1:])):
            raise PortError(f"target_layer_ids {hf_ids} are not strictly increasing",
                            "list the tapped target layers in order")
        old = draft.kvs.get(key("target_layers"))
        itype = old.item_type if old is not None and old.is_int_array() else GGUFValueType.INT32
        changes[key("target_layers")] = (GGUFValueType.ARRAY, [i + 1 for i in hf_ids], itype)
    if block is not None:
        if not isinstance(block, int) or not 1 < block <= 64:
            raise PortError(f"block size {block!r} is not an integer in 2..64", "Kimi-K3-DSpark uses 7")
        changes[key("block_size")] = (GGUFValueType.UINT32, block, None)
    if mask is not None:
        if not isinstance(mask, int) or not 0 <= mask < 1 << 32:
            raise PortError(f"mask_token_id {mask!r} is not a token id", "check the config.json")
        changes["tokenizer.ggml.mask_token_id"] = (GGUFValueType.UINT32, mask, None)
    if not changes:
        raise PortError("--fix-metadata: nothing to change",
                        "say what to fix: --target-layers IDS, --from-config config.json or --block-size N")
    return changes


def _write_fixed(args: argparse.Namespace, draft: GGUFHeader, changes: dict) -> None:
    out: Path = args.fix_metadata
    src = args.draft
    same = out.resolve() == src.resolve()
    if not same and out.exists():
        try:
            same = os.path.samefile(out, src)
        except OSError:
            same = False
    if same:
        raise PortError(f"--fix-metadata {out} is the input file",
                        "the repair never writes in place: give another output path")
    if out.exists() and not args.force:
        raise PortError(f"{out} exists", "choose another path or add --force")
    if not out.parent.is_dir():
        raise PortError(f"directory {out.parent} does not exist", "create it first")
    try:
        rewrite_metadata(draft, out, changes)
    except OSError as err:
        raise GGUFError(f"cannot write {out}: {err.strerror}", "check free space and permissions") from None


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
