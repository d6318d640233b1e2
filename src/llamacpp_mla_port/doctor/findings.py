"""What a doctor check returns (`Finding`, its verdicts) and what it reads (`Context`: the
draft's header, the target's, the hyperparameters), with the header accessors the checks share."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gguf.constants import GGUFValueType, Keys

# the naming contract and the Kimi-K3 dimensions (re-exported for the checks): gguf/contract.py
from llamacpp_mla_port.gguf.contract import (ARCH, K3_BLOCK, K3_N_EMBD, K3_TARGET_LAYERS,  # noqa: F401
                                             K3_VOCAB, KNOWN_TAPS, key)
from llamacpp_mla_port.gguf.header import GGUFHeader

TOK = Keys.Tokenizer            # the tokenizer keys, as gguf-py names them


OK, WARNING, ERROR = "ok", "warning", "error"
SEVERITY = {OK: 0, WARNING: 1, ERROR: 2}


@dataclass
class Finding:
    check: str
    verdict: str
    title: str
    evidence: str
    fix: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Context:
    draft: GGUFHeader
    target: GGUFHeader | None = None
    hp: dict[str, Any] = field(default_factory=dict)
    layout: str = "unknown"          # mla | qwen3 | dsv4 | unknown | not-a-draft
    fix_hint: str = "llamacpp-mla-port doctor DRAFT.gguf --fix-metadata OUT.gguf"


def _int(h: GGUFHeader, k: str) -> int | None:
    kv = h.kvs.get(k)
    return kv.value if kv is not None and kv.is_int() else None


def _num(h: GGUFHeader, k: str) -> float | None:
    kv = h.kvs.get(k)
    return float(kv.value) if kv is not None and kv.is_number() else None


def _shape(h: GGUFHeader, name: str) -> tuple[int, ...] | None:
    t = h.tensors.get(name)
    return t.shape if t is not None else None


def _vocab_size(h: GGUFHeader, arch: str | None) -> tuple[int | None, str]:
    kv = h.kvs.get(TOK.LIST)
    if kv is not None and kv.item_type == GGUFValueType.STRING:
        return len(kv.value), "len(tokenizer.ggml.tokens)"
    if arch and (v := _int(h, f"{arch}.vocab_size")) is not None:
        return v, f"{arch}.vocab_size"
    for name in ("token_embd.weight", "markov_w1.weight", "output.weight"):
        s = _shape(h, name)
        if s is not None and len(s) == 2:
            return s[1], f"{name} ne1"
    return None, "no tokenizer, vocab_size key or vocabulary-sized tensor"
