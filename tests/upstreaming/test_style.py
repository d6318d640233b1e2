"""upstreaming/style.py's comment rules: at most two lines, and never split mid-sentence
(AGENTS.md). tests/series/test_stacks.py runs every rule over patches/ and over each PR stack
rendered alone (all stacks, their alone-only variants included)."""

from __future__ import annotations

import pytest

from llamacpp_mla_port.upstreaming import style


def _patch(path: str, added: list[str]) -> str:
    hunk = "".join(f"+{ln}\n" for ln in added)
    return (f"From 0 Mon Sep 17 00:00:00 2001\nFrom: a <a@b>\nSubject: [PATCH] model : demo\n\nWhy.\n---\n"
            f" {path} | 1 +\n\ndiff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -1,1 +1,{len(added) + 1} @@\n x\n{hunk}")


def _splits(path: str, added: list[str]) -> list[str]:
    return [f.where for f in style.patch_findings(_patch(path, added)) if f.rule == "split"]


@pytest.mark.parametrize("path,split,whole", [
    ("src/a.cpp",
     ["    // the mask is left unallocated when the graph only stores K without attending",
      "    // (e.g. the KV-injection pass of an MLA DFlash draft)", "    x = 1;"],
     ["    // the mask is left unallocated when the graph only stores K without attending.",
      "    // That is the KV-injection pass of an MLA DFlash draft", "    x = 1;"]),
    ("conversion/a.py",
     ["    # standalone draft export options; set by main() before instantiation for",
      "    # classes that opt in", "    x = 1"],
     ["    # standalone draft export options.", "    # main() sets them before instantiation", "    x = 1"]),
    ("src/a.h",
     ["/* one clause that goes on", " * and ends here */", "int x;"],
     ["/* one clause that ends here.", " * another one */", "int x;"]),
    ("src/a.cpp",       # a split at a colon or a semicolon is a split too (the 2026-12-06 review)
     ["// the draft's logits, fed as speculative.cpp feeds them:", "// DFlash decodes them", "int x;"],
     ["// the draft's logits, fed as speculative.cpp feeds them.", "// DFlash decodes them", "int x;"]),
    ("src/b.cpp",
     ["// 0 = forever;", "// established connections have no time-out", "int x;"],
     ["// 0 = forever (a colon or semicolon inside a line: fine; as here).", "// The end", "int x;"]),
])
def test_a_comment_split_mid_sentence_is_found_and_a_whole_one_is_not(path, split, whole):
    assert _splits(path, split) == [f"{path}:2"]
    assert _splits(path, whole) == []


def test_what_the_split_rule_leaves_alone():
    # one line, a closing parenthesis after the clause end, an empty comment line, and code that
    # starts with a `*` (a dereference, not a block comment line)
    assert _splits("a.cpp", ["// one line without a stop", "int x;"]) == []
    assert _splits("a.cpp", ["// it ends here (e.g. this.)", "// and goes on", "int x;"]) == []
    assert _splits("a.cpp", ["//", "// after an empty line", "int x;"]) == []
    assert _splits("a.cpp", ["    *out = kv_cmpr", "    *ptr = x;", "int x;"]) == []
    # not code: markdown headings are not comments
    assert _splits("doc.md", ["# a heading", "# another", "text"]) == []


def test_the_split_finding_names_the_line_and_the_fix():
    found = [f for f in style.patch_findings(_patch("src/a.cpp", ["// one clause that", "// goes on", "int x;"]))
             if f.rule == "split"]
    assert len(found) == 1
    assert str(found[0]) == ("src/a.cpp:2: split: comment split mid-sentence (end the line with . ! or ?, "
                             "or make it one line): // one clause that")
