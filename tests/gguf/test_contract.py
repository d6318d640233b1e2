"""gguf/contract.py agrees with the patched tree's gguf-py (the names the converter writes and
the loader reads), the way test_loader_table checks the doctor's table against the loader."""

from __future__ import annotations

import importlib.util

import pytest

from llamacpp_mla_port.gguf import contract


@pytest.fixture(scope="module")
def constants(patched_tree):
    path = patched_tree / "gguf-py" / "gguf" / "constants.py"
    spec = importlib.util.spec_from_file_location("patched_gguf_constants", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _keys(constants) -> set[str]:
    out: set[str] = set()

    def walk(cls):
        for name, value in vars(cls).items():
            if isinstance(value, type) and not name.startswith("_"):
                walk(value)
            elif isinstance(value, str) and "{arch}" in value:
                out.add(value.replace("{arch}", contract.ARCH))
    walk(constants.Keys)
    return out


def _tensor_names(constants) -> set[str]:
    arch = next(a for a, n in constants.MODEL_ARCH_NAMES.items() if n == contract.ARCH)
    bases = {constants.TENSOR_NAMES[t].format(bid=0) for t in constants.MODEL_TENSORS[arch]}
    return {f"{b}.{suffix}" for b in bases for suffix in ("weight", "bias")}


def test_the_arch_is_the_patched_gguf_py_s(constants):
    assert contract.ARCH in constants.MODEL_ARCH_NAMES.values()


def test_every_key_is_a_gguf_py_key(constants):
    known = _keys(constants)
    missing = sorted(contract.key(h) for h in contract.HPARAMS if contract.key(h) not in known)
    assert missing == [], f"gguf/contract.HPARAMS names keys gguf-py does not know: {missing}"


def test_every_tensor_of_each_layout_is_a_dflash_tensor(constants):
    names = _tensor_names(constants)
    ours = set(contract.GLOBAL_TENSORS) | set(contract.DSPARK_HEADS)
    for layout in ("mla", "qwen3"):
        ours |= {contract.block(0, t) for t in contract.BLOCK_TENSORS[layout]}
        ours |= {contract.block(0, t) for t in contract.OPTIONAL_BLOCK_TENSORS[layout]}
    assert sorted(ours - names) == [], "gguf/contract names tensors gguf-py's dflash does not list"


def test_the_doctor_expects_exactly_the_contract_s_tensors():
    from llamacpp_mla_port.doctor.findings import Context
    from llamacpp_mla_port.doctor.layout import expected_tensors

    class _Draft:
        tensors: dict = {}

    for layout in ("mla", "qwen3"):
        hp = {name: 8 for name in contract.HPARAMS}
        hp.update(block_count=2, markov_rank=4, fc_in=16, n_vocab=32)
        ctx = Context(draft=_Draft(), hp=hp, layout=layout)
        ctx.draft.tensors = {contract.block(i, "attn_norm.weight"): None for i in range(2)}
        got = set(expected_tensors(ctx))
        want = set(contract.GLOBAL_TENSORS) | {contract.block(i, t) for i in range(2)
                                               for t in contract.BLOCK_TENSORS[layout]}
        if layout == "mla":
            want |= set(contract.DSPARK_HEADS)
        assert got == want, layout
