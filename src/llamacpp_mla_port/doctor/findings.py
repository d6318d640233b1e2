"""What a doctor check returns (`Finding`, its verdicts) and what it reads (`Context`: the
draft's header, the target's, the hyperparameters), with the header accessors the checks share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gguf.constants import GGUFValueType

from llamacpp_mla_port.gguf.header import GGUFHeader


OK, WARNING, ERROR = "ok", "warning", "error"
SEVERITY = {OK: 0, WARNING: 1, ERROR: 2}

ARCH = "dflash"
# Published target_layer_ids (HF, 0-based) of checkpoints called "Kimi-K3 DSpark"
# (shared/spec/draft-model.md). The GGUF stores them +1.
KNOWN_TAPS = {
    "Inferact/Kimi-K3-DSpark (MLA)": [2, 23, 47, 71, 89],
    "RadixArk Kimi-K3 DSpark (Qwen3-style)": [7, 23, 51, 67, 83],
}
K3_N_EMBD, K3_VOCAB, K3_TARGET_LAYERS, K3_BLOCK = 7168, 163840, 93, 7


@dataclass
class Finding:
    check: str
    verdict: str
    title: str
    evidence: str
    fix: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "verdict": self.verdict, "title": self.title,
                "evidence": self.evidence, "fix": self.fix}


@dataclass
class Context:
    draft: GGUFHeader
    target: GGUFHeader | None = None
    hp: dict[str, Any] = field(default_factory=dict)
    layout: str = "unknown"          # mla | qwen3 | dsv4 | unknown | not-a-draft
    fix_hint: str = "llamacpp-mla-port doctor DRAFT.gguf --fix-metadata OUT.gguf"


def key(name: str) -> str:
    return f"{ARCH}.{name}"


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
    kv = h.kvs.get("tokenizer.ggml.tokens")
    if kv is not None and kv.item_type == GGUFValueType.STRING:
        return len(kv.value), "len(tokenizer.ggml.tokens)"
    if arch and (v := _int(h, f"{arch}.vocab_size")) is not None:
        return v, f"{arch}.vocab_size"
    for name in ("token_embd.weight", "markov_w1.weight", "output.weight"):
        s = _shape(h, name)
        if s is not None and len(s) == 2:
            return s[1], f"{name} ne1"
    return None, "no tokenizer, vocab_size key or vocabulary-sized tensor"
