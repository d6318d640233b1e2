"""The doctor's loader table is read from the patched tree's loader, and stays in step with it.

Golden file: doctor/data/loader_table.json must equal a fresh read of the current patched tree
(`llamacpp-mla-port loader-table --write` regenerates it). The reader itself is tested on
small C++ snippets, and the table on facts the issue names.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from llamacpp_mla_port.doctor import loader_table
from llamacpp_mla_port.doctor.loader_rules import known_condition
from llamacpp_mla_port.doctor.loader_table import Block, extract_keys, generate, render, scan, walk


@pytest.mark.build
def test_shipped_table_matches_the_patched_loader(patched_tree):
    fresh = render(generate(patched_tree))
    shipped = (Path(loader_table.__file__).parent / "data" / loader_table.TABLE_NAME).read_text(encoding="utf-8")
    if fresh != shipped:
        diff = "".join(difflib.unified_diff(shipped.splitlines(True), fresh.splitlines(True), "shipped", "fresh"))
        pytest.fail("doctor/data/loader_table.json drifted from the loader: run `llamacpp-mla-port loader-table "
                    f"--write` and commit it\n{diff[:6000]}")


def test_the_doctor_knows_every_condition_of_the_table():
    table = loader_table.load()
    conds = {c for k in table["keys"] for c in k["conditions"] + [k["required"]]}
    conds |= {c for t in table["tensors"] for c in t["conditions"]}
    unknown = sorted(c for c in conds if not known_condition(c))
    assert unknown == [], f"teach doctor/loader_rules.CONDITIONS these loader conditions: {unknown}"


def test_table_holds_what_the_loader_insists_on():
    table = loader_table.load()
    required = {k["key"] for k in table["keys"] if k["required"] == "true"}
    assert {"dflash.context_length", "dflash.embedding_length", "dflash.block_count",
            "dflash.attention.layer_norm_rms_epsilon", "dflash.target_layers",
            "tokenizer.ggml.model"} <= required
    mla = [k["key"] for k in table["keys"] if any("mla_impl" in c for c in k["conditions"])
           and not any(c.startswith("!(hparams.n_embd_head_k_mla") for c in k["conditions"])]
    assert {"dflash.attention.q_lora_rank", "dflash.attention.kv_lora_rank",
            "dflash.rope.dimension_count", "dflash.rope.scaling.yarn_log_multiplier"} <= set(mla)
    vocab = table["vocab"]
    assert vocab["models"]["gpt2"]["needs_merges"] and vocab["models"]["gpt2"]["merges_exempt_pre"] == ["kimi-k2"]
    assert not vocab["models"]["llama"]["needs_merges"] and not vocab["models"]["test"]["needs_merges"]
    assert vocab["per_token_arrays"] == ["tokenizer.ggml.scores", "tokenizer.ggml.token_type"]
    assert vocab["required_arrays"] == ["tokenizer.ggml.tokens"]
    assert "yarn" in table["rope_scaling_types"] and table["max_layers"] >= 256
    names = {(t["name"], t["required"]) for t in table["tensors"]}
    assert {("fc.weight", True), ("blk.{i}.attn_kv_a_mqa.weight", True), ("blk.{i}.attn_v.weight", False),
            ("markov_w1.weight", True), ("conf_proj.weight", False)} <= names


def test_scanner_conditions_else_chains_and_early_returns():
    body = """
        ml.get_key(LLM_KV_A, a);
        if (x > 0) {
            ml.get_key(LLM_KV_B, b);
            return;
        }
        if (y) {
            ml.get_key(LLM_KV_C, c, false);
        } else if (z) {
            ml.get_key(LLM_KV_D, d, cond && w);
        } else {
            int v[] = { 1, 2 };
            ml.get_arr(LLM_KV_E, e);
        }
        if (!ml.get_arr(LLM_KV_F, f, false)) {
            throw std::runtime_error("need F");
        }
        auto check = [&](int v) { ml.get_key(LLM_KV_G, g); };
    """
    names = {f"LLM_KV_{c}": f"%s.{c.lower()}" for c in "ABCDEFG"}
    got = {k["key"]: (k["required"], k["conditions"]) for k in extract_keys(scan(body), names, "arch", "f")}
    assert got == {
        "arch.a": ("true", []),
        "arch.b": ("true", ["x > 0"]),
        "arch.d": ("cond && w", ["!(x > 0)", "!(y)", "z"]),
        "arch.e": ("true", ["!(x > 0)", "!(y)", "!(z)"]),
        "arch.f": ("true", ["!(x > 0)"]),     # read as optional, but the loader throws without it
    }                                         # C is optional; G sits in a lambda, not straight-line code
    assert isinstance(scan(body).items[1], Block) and scan(body).items[1].ends_with_return()
    assert [t for t, *_ in walk(scan("if (a) { f(); } else { g(); }"))] == ["if (a)", "f()", "g()"]
