"""How the doctor reads the loader table (data/loader_table.json): the conditions of the
patched loader as predicates on a draft, and the keys and tensors it requires of that draft."""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

from llamacpp_mla_port.doctor import loader_table
from llamacpp_mla_port.doctor.findings import Context, _int, _num, key
from llamacpp_mla_port.doctor.layout import _layers_to_check


# --- the loader table -------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def loader() -> dict[str, Any]:
    """What the patched loader requires (data/loader_table.json, see loader_table.py)."""
    return loader_table.load()


def _yarn_scaled(c: "Context") -> bool:
    factor = _num(c.draft, key("rope.scaling.factor"))
    return c.draft.get(key("rope.scaling.type")) == "yarn" and factor is not None and factor > 1.0


def _positive(c: "Context", name: str) -> bool:
    return (_int(c.draft, key(name)) or 0) > 0


#: How the doctor reads each C++ condition the loader table carries (text -> predicate on the
#: draft). `!(...)` and `arch == LLM_ARCH_X` are read generically; a condition the table holds
#: and this does not know fails tests/doctor/test_loader_table.py.
CONDITIONS: dict[str, Callable[["Context"], bool]] = {
    "hparams.vocab_only || ml.get_arch() == LLM_ARCH_CLIP": lambda c: False,
    "hparams.dsv4_hc_mult > 0": lambda c: _positive(c, "hyper_connection.count"),
    "hparams.n_embd_head_k_mla_impl > 0 || hparams.n_embd_head_v_mla_impl > 0":
        lambda c: _positive(c, "attention.key_length_mla") or _positive(c, "attention.value_length_mla"),
    "hparams.is_mla()":
        lambda c: _positive(c, "attention.key_length_mla") and _positive(c, "attention.value_length_mla"),
    "ml.get_key(LLM_KV_ATTENTION_SLIDING_WINDOW, hparams.n_swa, false) && hparams.n_swa > 0":
        lambda c: _positive(c, "attention.sliding_window"),
    "d2t_meta": lambda c: "d2t" in c.draft.tensors,
    "markov_meta": lambda c: "markov_w1.weight" in c.draft.tensors,
    "selector_meta": lambda c: "selector_hidden.weight" in c.draft.tensors,
    # a `required` argument that is an expression: DeepSeek-YaRN needs the log multiplier
    "yarn && hparams.rope_freq_scale_train < 1.0f": _yarn_scaled,
}


def _negated(cond: str) -> str | None:
    """X for a condition `!(X)` whose parenthesis closes at the end, else None."""
    if not (cond.startswith("!(") and cond.endswith(")")):
        return None
    depth = 0
    for i, ch in enumerate(cond[1:], 1):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i != len(cond) - 1:
            return None
    return cond[2:-1]


def known_condition(cond: str) -> bool:
    cond = cond.strip()
    if cond in ("true", "false"):
        return True
    inner = _negated(cond)
    if inner is not None:
        return known_condition(inner)
    return bool(re.fullmatch(r"(?:arch|ml\.get_arch\(\)) == LLM_ARCH_\w+", cond)) or cond in CONDITIONS


def holds(cond: str, ctx: "Context") -> bool:
    """Whether a loader condition is true for this draft (an unknown one is assumed true)."""
    cond = cond.strip()
    if cond in ("true", "false"):
        return cond == "true"
    inner = _negated(cond)
    if inner is not None:
        return not holds(inner, ctx)
    m = re.fullmatch(r"(?:arch|ml\.get_arch\(\)) == LLM_ARCH_(\w+)", cond)
    if m:
        return m.group(1).lower() == loader()["arch"]
    fn = CONDITIONS.get(cond)
    return True if fn is None else fn(ctx)


def loader_required_keys(ctx: "Context") -> list[dict]:
    """The table's keys the loader reads as required for this draft (conditions and all)."""
    seen, out = set(), []
    for k in loader()["keys"]:
        if k["key"] in seen or not holds(k["required"], ctx):
            continue
        if all(holds(c, ctx) for c in k["conditions"]):
            seen.add(k["key"])
            out.append(k)
    return out


def loader_tensors(ctx: "Context") -> tuple[list[str], set[str]]:
    """(required names in load order, optional names) the loader creates for this draft."""
    n_layer = _layers_to_check(ctx)
    required: list[str] = []
    optional: set[str] = set()
    for t in loader()["tensors"]:
        if not all(holds(c, ctx) for c in t["conditions"]):
            continue
        names = [t["name"].format(i=i) for i in range(n_layer)] if t["per_layer"] else [t["name"]]
        if t["required"]:
            required += [n for n in names if n not in required]
        else:
            optional.update(names)
    return required, optional
