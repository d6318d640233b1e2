"""`doctor`: diagnose (and repair) a Kimi-K3 DSpark draft GGUF from its header.

    llamacpp-mla-port doctor DRAFT.gguf [--target TARGET.gguf] [--json]
        [--fix-metadata OUT.gguf [--target-layers 2,23,47,71,89 | --from-config config.json]
                                 [--block-size 7] [--force]]

Reads the header and metadata only (the embedding comparison with --target reads the two
`token_embd` tables in bounded chunks). Every header is validated by the bounded reader in
`gguf.header` before anything trusts it: a hostile or broken file gives a one-line
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

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from gguf.constants import GGUFValueType

from llamacpp_mla_port.doctor.checks import exit_code, run_checks
from llamacpp_mla_port.doctor.findings import TOK, Finding, key
from llamacpp_mla_port.errors import GGUFError, PortError
from llamacpp_mla_port.gguf.header import GGUFHeader, read_header, rewrite_metadata


def diagnose(draft_path: Path, target_path: Path | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """Check a draft (and its pairing with a target): the report and the findings."""
    draft = read_header(draft_path)
    target = read_header(target_path) if target_path else None
    ctx, findings = run_checks(draft, target, f"llamacpp-mla-port doctor {draft_path} --fix-metadata OUT.gguf")
    report: dict[str, Any] = {"file": str(draft_path), "target": str(target_path) if target_path else None,
                              **_summary(draft, ctx.layout), "findings": [f.as_dict() for f in findings],
                              "exit_code": exit_code(findings)}
    return report, findings


def fix_metadata(draft_path: Path, out: Path, target_layers: str | None = None, config: Path | None = None,
                 block_size: int | None = None, force: bool = False) -> dict[str, Any]:
    """Write a corrected copy of the draft to `out` (never in place); the planned changes."""
    draft = read_header(draft_path)
    changes = plan_changes(draft, target_layers, config, block_size)
    write_fixed(draft_path, out, draft, changes, force)
    return {k: v[1] for k, v in changes.items()}


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


def plan_changes(draft: GGUFHeader, target_layers: str | None = None, config: Path | None = None,
                 block_size: int | None = None) -> dict[str, tuple[GGUFValueType, Any, Any]]:
    """key -> (type, new value, item type) for what the user asked to fix."""
    changes: dict[str, tuple[GGUFValueType, Any, Any]] = {}
    hf_ids: list[int] | None = None
    block = block_size
    mask = None
    if target_layers:
        hf_ids = _parse_ids(target_layers)
    elif config:
        cfg = _read_config(config)
        sub = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
        if "target_layer_ids" in cfg or "target_layer_ids" in sub:
            hf_ids = cfg.get("target_layer_ids", sub.get("target_layer_ids"))
        elif "aux_hidden_state_layer_ids" in cfg:   # EAGLE3-style: already the layer inputs
            hf_ids = [int(i) - 1 for i in cfg["aux_hidden_state_layer_ids"]]
        mask = cfg.get("mask_token_id", sub.get("mask_token_id"))
        if block is None:
            block = cfg.get("block_size", sub.get("block_size"))
        if hf_ids is None and mask is None and block is None:
            raise PortError(f"{config} has no target_layer_ids, mask_token_id or block_size",
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
        changes[TOK.MASK_ID] = (GGUFValueType.UINT32, mask, None)
    if not changes:
        raise PortError("--fix-metadata: nothing to change",
                        "say what to fix: --target-layers IDS, --from-config config.json or --block-size N")
    return changes


def write_fixed(src: Path, out: Path, draft: GGUFHeader, changes: dict, force: bool = False) -> None:
    same = out.resolve() == src.resolve()
    if not same and out.exists():
        with contextlib.suppress(OSError):
            same = os.path.samefile(out, src)
    if same:
        raise PortError(f"--fix-metadata {out} is the input file",
                        "the repair never writes in place: give another output path")
    if out.exists() and not force:
        raise PortError(f"{out} exists", "choose another path or add --force")
    if not out.parent.is_dir():
        raise PortError(f"directory {out.parent} does not exist", "create it first")
    try:
        rewrite_metadata(draft, out, changes)
    except OSError as err:
        raise GGUFError(f"cannot write {out}: {err.strerror}", "check free space and permissions") from None
