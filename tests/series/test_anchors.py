"""In-memory unit tests: anchors.locate/scope and the two modes of the series walk."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from llamacpp_mla_port.errors import AnchorError, RenderError
from llamacpp_mla_port.series import anchors
from llamacpp_mla_port.series.anchors import Located, Miss
from llamacpp_mla_port.series.render import render_series, walk_series
from llamacpp_mla_port.series.spec import Change, Commit, Series
from llamacpp_mla_port.upstreaming.rebase import MERGED, analyse

TEXT = "int a;\nvoid f() {\n    x();\n}\nvoid g() {\n    x();\n}\n"


def _change(anchor, placement="after", template="t/ins.j2", file="src/a.cpp", **kw):
    return Change(file=file, placement=placement, template=template, anchor=anchor,
                  origin=f"series/10-x/commit.toml change {anchor!r}", **kw)


def test_find_all_plain_and_regex_and_bounds():
    x1, x2 = TEXT.index("x();"), TEXT.rindex("x();")
    assert anchors.find_all("x();", TEXT, False) == [(x1, x1 + 4), (x2, x2 + 4)]
    f, g = TEXT.index("void f"), TEXT.index("void g")
    assert anchors.find_all(r"^void \w\(\)", TEXT, True) == [(f, f + 8), (g, g + 8)]
    assert anchors.find_all("x();", TEXT, False, 0, x2 + 3) == [(x1, x1 + 4)]
    assert anchors.find_all("aa", "aaa", False) == [(0, 2), (1, 3)]


def test_locate_unique_anchor_in_scope():
    c = _change("    x();\n", within="void g() {\n", within_end="}")
    where = anchors.locate(c, TEXT)
    assert where == Located(TEXT.rindex("    x();"), TEXT.rindex("    x();") + 9)
    assert anchors.scope(c, TEXT) == (TEXT.index("void g() {\n") + 11, len(TEXT) - 2)


def test_locate_ambiguous_anchor_lists_every_hit():
    miss = anchors.locate(_change("    x();\n"), TEXT)
    assert isinstance(miss, Miss) and miss.status == "anchor-ambiguous" and miss.count == 2
    assert miss.candidates == ["3: x();", "6: x();"]
    err = miss.error(_change("    x();\n"), TEXT, "b1")
    assert isinstance(err, AnchorError) and "matches 2 times" in err.message
    assert "(lines 3, 6)" in err.message


def test_locate_missing_anchor_offers_nearest_lines():
    miss = anchors.locate(_change("void h() {"), TEXT)
    assert isinstance(miss, Miss) and miss.status == "anchor-missing"
    assert miss.candidates[0].endswith("void f() {") or miss.candidates[0].endswith("void g() {")
    err = miss.error(_change("void h() {"), TEXT, "b1")
    assert "not found in src/a.cpp at base b1" in err.message


def test_locate_scope_failures_name_the_scope():
    assert anchors.locate(_change("x();", within="void "), TEXT).status == "within-ambiguous"
    assert anchors.locate(_change("x();", within="void q"), TEXT).status == "within-missing"
    m = anchors.locate(_change("x();", within="void g", within_end="@@"), TEXT)
    assert m.status == "within_end-missing"
    # the lenient scope falls back to the whole text (or the end) instead of failing
    assert anchors.scope(_change("x();", within="void "), TEXT) == (0, len(TEXT))
    c = _change("x();", within="void g", within_end="@@")
    assert anchors.scope(c, TEXT) == (TEXT.index("void g") + 6, len(TEXT))


def _series(tmp_path: Path, changes_per_commit) -> Series:
    (tmp_path / "t").mkdir(exist_ok=True)
    (tmp_path / "t" / "ins.j2").write_text("    y();\n")
    (tmp_path / "t" / "msg.j2").write_text("src : a change\n\nbody\n")
    commits = tuple(Commit(slug=f"{10 + i}-x", message_template="t/msg.j2", changes=tuple(cs))
                    for i, cs in enumerate(changes_per_commit))
    return Series(root=tmp_path, vars={}, author_name="a", author_email="a@b", date="d",
                  branch="b", commits=commits)


def test_strict_walk_applies_and_later_commits_see_earlier_text(tmp_path):
    s = _series(tmp_path, [[_change("    x();\n", within="void f", within_end="}")],
                           [_change("    y();\n", placement="before")]])
    out = render_series(s, {"src/a.cpp": TEXT.encode()}.get, "b1")
    assert out[0].files["src/a.cpp"].decode().count("y();") == 1
    assert out[1].files["src/a.cpp"].decode().count("y();") == 2
    assert out[0].message == "src : a change\n\nbody\n"


def test_strict_walk_raises_on_the_first_miss(tmp_path):
    s = _series(tmp_path, [[_change("    x();\n")], [_change("nowhere")]])
    with pytest.raises(AnchorError, match="matches 2 times"):
        render_series(s, {"src/a.cpp": TEXT.encode()}.get, "b1")
    # a later commit anchors on what an earlier one inserted
    s = _series(tmp_path, [[_change("    x();\n", within="void f", within_end="}")],
                           [_change("    x();\n", within="void f", within_end="}",
                                    placement="replace")]])
    # a commit whose change leaves the file as it was is refused
    s2 = _series(tmp_path, [[_change("    x();\n", within="void f", within_end="}",
                                     placement="replace", template="t/same.j2")]])
    (tmp_path / "t" / "same.j2").write_text("    x();\n")
    with pytest.raises(RenderError, match="changes nothing"):
        render_series(s2, {"src/a.cpp": TEXT.encode()}.get, "b1")
    assert len(render_series(s, {"src/a.cpp": TEXT.encode()}.get, "b1")) == 2


def test_lenient_walk_records_every_change_and_goes_on(tmp_path):
    s = _series(tmp_path, [[_change("    x();\n"), _change("int a;\n")],
                           [_change("nowhere", file="src/missing.cpp"),
                            _change("void g() {\n")]])
    seen = []
    out = walk_series(s, {"src/a.cpp": TEXT.encode()}.get, "b1",
                      decide=lambda step: seen.append(
                          (step.commit_index, type(step.where).__name__)) or True)
    assert seen == [(0, "Miss"), (0, "Located"), (1, "NoneType"), (1, "Located")]
    # the located changes were applied (the ambiguous one and the missing file were not)
    assert out[1].files["src/a.cpp"].decode().count("y();") == 2
    with pytest.raises(AnchorError):
        render_series(s, {"src/a.cpp": TEXT.encode()}.get, "b1")


def test_rebase_report_is_the_lenient_walk(tmp_path):
    merged = TEXT.replace("void g() {\n", "void g() {\n    y();\n")
    s = _series(tmp_path, [[_change("    x();\n"), _change("void g() {\n")],
                           [_change("int a;\n", within="void q")]])
    reports = analyse(s, {"src/a.cpp": merged.encode()}.get, "b2", {})
    assert [r.status for r in reports] == ["anchor-ambiguous", MERGED, "within-missing"]
    assert reports[0].candidates == ["3: x();", "7: x();"]
    assert reports[0].title == "src : a change" and reports[2].patch == "0002"
    assert "not found in src/a.cpp at b2" in reports[2].message


# ------------------------------------------------------------------------------ candidates
#: the anchor 21-model-dflash-mla-backbone replaced once, upstream's reordering of it, and the
#: lines that share most of its characters
REORDERED = ("    if (tok_embd == nullptr) {\n        return;\n    }\n    if (output == nullptr) {\n"
             "        output = tok_embd;\n    }\n    if (tok_embd == nullptr) {\n"
             "    if (tok_embd != nullptr && output == nullptr) {\n")


def test_tokens_are_names_numbers_literals_and_operators():
    assert anchors.tokens("if (output == nullptr && tok_embd != nullptr) {") == [
        "if", "(", "output", "==", "nullptr", "&&", "tok_embd", "!=", "nullptr", ")", "{"]
    assert anchors.tokens('res->t_layer_inp[il]=inpL; // "a b" 1.5f') == [
        "res", "->", "t_layer_inp", "[", "il", "]", "=", "inpL", ";", "//", '"a b"', "1.5f"]
    assert anchors.tokens("a = b") == anchors.tokens("a=b") != anchors.tokens("a == b")


def test_a_reordered_condition_is_the_first_candidate():
    anchor = "    if (output == nullptr && tok_embd != nullptr) {\n"
    miss = anchors.locate(_change(anchor), REORDERED)
    assert isinstance(miss, Miss) and miss.status == "anchor-missing"
    assert miss.candidates[0] == "8: if (tok_embd != nullptr && output == nullptr) {"
    assert len(miss.candidates) == 3
    # the control: by characters alone (difflib, as the candidates were ranked before), the
    # reordered line comes last of the four `if` lines
    by_chars = sorted((ln.strip() for ln in REORDERED.splitlines() if ln.strip().startswith("if")),
                      key=lambda ln: -difflib.SequenceMatcher(None, anchor.strip(), ln, autojunk=False).ratio())
    assert by_chars[-1] == "if (tok_embd != nullptr && output == nullptr) {"


def test_a_renamed_variable_and_respaced_line_is_the_first_candidate():
    text = ("        res->t_embd[il] = inpL;\n        res->t_layer_out[il] = cur;\n"
            "        res->t_layer_inp [il]=inp_l;\n        ggml_tensor * inpSA = inpL;\n")
    miss = anchors.locate(_change("        res->t_layer_inp[il] = inpL;\n"), text)
    assert miss.candidates[0] == "3: res->t_layer_inp [il]=inp_l;"
    # the message render and rebase print names it first too
    assert "nearest candidate lines: 3: res->t_layer_inp [il]=inp_l;" in miss.error(
        _change("        res->t_layer_inp[il] = inpL;\n"), text, "b1").message
