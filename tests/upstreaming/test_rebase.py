"""`rebase --onto`: synthetic upstream drift built on the base tree, one commit per case
(tests/helpers/upstream_drift.py builds it). Every failing case asserts that the pin, patches/
and the tool's work tree are untouched.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import PIN_FILE
from llamacpp_mla_port.process import git
from llamacpp_mla_port.series import pipeline
from llamacpp_mla_port.series.spec import load_series
from llamacpp_mla_port.source.pin import load_pin
from llamacpp_mla_port.upstreaming import own_words
from llamacpp_mla_port.upstreaming.analysis import analyse
from tests.helpers.upstream_drift import (ADDED_TENSORS, GGUF, GRAPH, GUARDED_MASK, K_SET_INPUT, MASK,
                                          Q_A_NORM, Project, in_other_words, keyed_lines, make_world,
                                          met_changes, moved_on, moved_to_the_end, renamed, reworded)


@pytest.fixture(scope="module")
def world(tmp_path_factory, pin, sdist_tarball):
    yield from make_world(tmp_path_factory, pin, sdist_tarball)


@pytest.fixture(scope="module")
def project(world, tmp_path_factory):
    """Shared by the failing cases, which must leave it exactly as it is."""
    p = Project(world, tmp_path_factory.mktemp("project"), world.base)
    return p


@pytest.fixture()
def untouched(project):
    before = project.snapshot()
    yield project
    assert project.snapshot() == before, "a failed rebase changed the pin, patches/ or work tree"


def _shift(text: str, marker: str, lines: int) -> str:
    i = text.index(marker)
    block = "".join(f"    // upstream moved on ({n})\n" if marker.startswith("void") else
                    f"# upstream moved on ({n})\n" for n in range(lines))
    at = text.rindex("\n", 0, text.rindex("\n", 0, i)) + 1     # two lines above the marker
    return text[:at] + block + text[at:]


# ------------------------------------------------------------------------------ success
def test_lines_shifted_above_anchors_rebase_moves_the_pin(world, tmp_path, capsys):
    p = Project(world, tmp_path, world.base)
    new = world.commit("shifted", {GGUF: lambda t: _shift(t, "    MODEL_ARCH.DFLASH: [\n", 7),
                                   GRAPH: lambda t: _shift(t, K_SET_INPUT, 3)})
    rc, out, err = p.rebase(capsys, "--onto", new, "--git-url", str(world.up))
    assert rc == 0, out + err
    # each anchor found again, at its new line

    def anchor_line(rev: str) -> int:
        t = world.read(rev, GGUF)
        return t.count("\n", 0, t.index(Q_A_NORM, t.index("    MODEL_ARCH.DFLASH: ["))) + 1
    assert anchor_line(new) == anchor_line(world.base) + 7
    assert f"(line {anchor_line(new)}, was {anchor_line(world.base)})" in out, out
    assert ", was " in out.split(GRAPH)[1].splitlines()[0]
    assert f"pin moved to {new[:12]} ({new})" in out
    # the pin: forward, sdist table dropped with a note saying why
    pin = load_pin(p.templates / "pin.toml")
    assert pin.commit == new and pin.sdist is None and pin.url == load_pin(PIN_FILE).url
    text = (p.templates / "pin.toml").read_text()
    assert "No [sdist]" in text and "vendors that commit, not this one" in text
    # patches/ re-exported against the new base, and the work tree moved with it
    manifest = json.loads((p.patches / "manifest.json").read_text())
    assert manifest["base"]["commit"] == new and len(manifest["patches"]) == 2
    tree = p.work / "llama.cpp"
    assert git.run(tree, "rev-parse", "HEAD~2") == new, out
    assert git.run(tree, "status", "--porcelain") == ""
    assert "# upstream moved on (6)" in (tree / GGUF).read_text()
    assert GUARDED_MASK in (tree / GRAPH).read_text()
    # the range-diff between the two revisions of the series: both commits, unchanged
    assert "git range-diff" in out
    assert "1:" in out and "= 1:" in out and "2:" in out and "= 2:" in out
    assert "gguf-py : list two more DFLASH tensors" in out
    # the tree-identity check ran, and holds: the series did the same on the new base
    assert "tree identity: holds (diff(old base, new base) = diff(old patched, new patched) in 2 files of " \
           "2 commits)" in out and "review" not in out
    # and `check` agrees: patches/ equal a fresh render at the new pin
    assert pipeline.check(pipeline.Options(p.places()), log=lambda *_: None) == ""


def test_canary_passes_and_writes_nothing(world, untouched, capsys):
    new = world.commit("shifted-canary", {GRAPH: lambda t: _shift(t, K_SET_INPUT, 2)})
    rc, out, _ = untouched.rebase(capsys, "--onto", new, "--git-url", str(world.up), "--canary")
    report = json.loads(out)
    assert rc == 0 and report["ok"] and report["status"] == "canary-ok"
    assert report["first_failure"] is None and report["relation"] == "descendant"
    assert [c["status"] for c in report["changes"]] == ["ok", "ok"]
    assert report["verdict"] == "ok" and report["probably_merged"] == []
    assert report["tree_identity"]["checked"] and report["tree_identity"]["regions"] == []


def test_unrelated_history_is_refused_unless_forced(world, tmp_path, untouched, capsys):
    orphan = world.commit("orphan", {GRAPH: lambda t: t + "// elsewhere\n"}, orphan=True)
    rc, _, err = untouched.rebase(capsys, "--onto", orphan, "--git-url", str(world.up))
    assert rc == 2
    assert "does not descend from the pinned" in err and "unrelated history" in err
    assert "--force" in err
    # forced, on a project of its own: it renders, and the pin names the orphan
    p = Project(world, tmp_path, world.base, work_tree=False)
    rc, out, err = p.rebase(capsys, "--onto", orphan, "--git-url", str(world.up), "--force")
    assert rc == 0, out + err
    assert load_pin(p.templates / "pin.toml").commit == orphan
    assert json.loads((p.patches / "manifest.json").read_text())["base"]["commit"] == orphan


# ------------------------------------------------------------------------------ refusals
def test_older_commit_is_refused(world, tmp_path, capsys):
    newer = world.commit("newer", {GRAPH: lambda t: _shift(t, K_SET_INPUT, 1)})
    p = Project(world, tmp_path, newer)
    before = p.snapshot()
    rc, _, err = p.rebase(capsys, "--onto", world.base, "--git-url", str(world.up))
    assert rc == 2 and "is OLDER than the pinned" in err and "forward only" in err
    assert "Traceback" not in err
    assert p.snapshot() == before


def test_same_commit_is_a_no_op(world, untouched, capsys):
    rc, out, _ = untouched.rebase(capsys, "--onto", "main", "--git-url", str(world.up))
    assert rc == 0 and "already at that commit" in out


def test_dirty_work_tree_is_refused_before_anything(world, tmp_path, capsys):
    p = Project(world, tmp_path, world.base)
    new = world.commit("shifted-dirty", {GRAPH: lambda t: _shift(t, K_SET_INPUT, 2)})
    mine = p.work / "llama.cpp" / "my-notes.txt"
    mine.write_text("mine\n")
    before = p.snapshot()
    rc, _, err = p.rebase(capsys, "--onto", new, "--git-url", str(world.up))
    assert rc == 2 and "my-notes.txt" in err and "did not make" in err
    assert p.snapshot() == before and mine.read_text() == "mine\n"


# ------------------------------------------------------------------------------ conflicts
def test_renamed_function_fails_naming_file_anchor_and_candidates(world, untouched, capsys):
    new = world.commit("renamed", {GRAPH: lambda t: t.replace(
        "llm_graph_input_attn_k::set_input(", "llm_graph_input_attn_k::set_input_impl(")})
    rc, out, _ = untouched.rebase(capsys, "--onto", new, "--git-url", str(world.up))
    assert rc == 1
    line = next(ln for ln in out.splitlines() if "FAILED" in ln)
    assert GRAPH in line and "within-missing" in line
    assert "void llm_graph_input_attn_k::set_input(const llama_ubatch * ubatch) {" in line
    assert "closest candidate lines:" in line and "set_input_impl(" in line
    assert "nothing was written" in out
    # the canary says the same, as JSON, first failure first
    rc, out, _ = untouched.rebase(capsys, "--onto", new, "--git-url", str(world.up), "--canary")
    report = json.loads(out)
    first = report["first_failure"]
    assert rc == 1 and not report["ok"] and report["status"] == "conflict"
    assert first["commit"] == "20-graph-demo" and first["file"] == GRAPH
    assert first["patch"] == "0002-graph-guard-the-K-only-mask.patch"
    assert first["anchor"] == K_SET_INPUT and first["status"] == "within-missing"
    assert any("set_input_impl(" in c for c in first["candidates"])
    assert report["changes"][0]["status"] == "ok"


def test_deleted_anchor_fails(world, untouched, capsys):
    def delete(text: str) -> str:
        i = text.index("    MODEL_ARCH.DFLASH: [\n")
        j = text.index(Q_A_NORM, i)
        return text[:j] + text[j + len(Q_A_NORM):]
    new = world.commit("deleted", {GGUF: delete})
    rc, out, _ = untouched.rebase(capsys, "--onto", new, "--git-url", str(world.up), "--json")
    report = json.loads(out)
    assert rc == 1 and report["status"] == "conflict"
    (fail,) = report["failures"]
    assert fail["file"] == GGUF and fail["status"] == "anchor-missing"
    assert fail["anchor"] == Q_A_NORM and fail["commit"] == "10-gguf-py-demo"
    assert fail["candidates"] and all("ATTN_Q_A" in c for c in fail["candidates"])
    assert "anchor not found in gguf-py/gguf/constants.py" in fail["message"]


def test_ambiguous_anchor_fails_with_its_lines(world, untouched, capsys):
    def twice(t: str) -> str:
        j = t.index(MASK, t.index(K_SET_INPUT))
        return t[:j] + MASK + t[j:]
    new = world.commit("ambiguous", {GRAPH: twice})
    rc, out, _ = untouched.rebase(capsys, "--onto", new, "--git-url", str(world.up), "--canary")
    first = json.loads(out)["first_failure"]
    assert rc == 1 and first["status"] == "anchor-ambiguous" and first["file"] == GRAPH
    assert len(first["candidates"]) == 2 and all("set_input_kq_mask" in c for c in first["candidates"])


# ------------------------------------------------------------------------------ merged upstream
def test_change_already_applied_upstream_is_reported_as_merged(world, untouched, capsys):
    new = world.commit("merged-10", {GGUF: _insert_in_dflash})
    rc, out, _ = untouched.rebase(capsys, "--onto", new, "--git-url", str(world.up))
    assert rc == 1
    merged = [ln for ln in out.splitlines() if "MERGED" in ln]
    assert len(merged) == 1 and GGUF in merged[0] and "merged-upstream" in merged[0]
    assert "already present upstream at the anchor" in merged[0]
    assert "already upstream; drop them" in out and "10-gguf-py-demo" in out
    rc, out, _ = untouched.rebase(capsys, "--onto", new, "--git-url", str(world.up), "--canary")
    report = json.loads(out)
    assert rc == 1 and report["status"] == "merged-upstream"
    assert [c["commit"] for c in report["merged_upstream"]] == ["10-gguf-py-demo"]
    assert report["first_failure"]["status"] == "merged-upstream"


def test_replace_merged_upstream_is_not_applied_twice(world, untouched, capsys):
    """Upstream guarded the mask itself: the old anchor still matches (inside the guard),
    so a blind render would nest a second guard; the count of the text tells it apart."""
    def guard(t: str) -> str:
        i = t.index(K_SET_INPUT)
        j = t.index(MASK, i)
        return t[:j] + GUARDED_MASK + t[j + len(MASK):]
    new = world.commit("merged-20", {GRAPH: guard})
    rc, out, _ = untouched.rebase(capsys, "--onto", new, "--git-url", str(world.up), "--canary")
    report = json.loads(out)
    assert rc == 1 and report["status"] == "merged-upstream"
    (m,) = report["merged_upstream"]
    assert m["commit"] == "20-graph-demo" and m["file"] == GRAPH


def _insert_in_dflash(text: str) -> str:
    i = text.index("    MODEL_ARCH.DFLASH: [\n")
    j = text.index(Q_A_NORM, i) + len(Q_A_NORM)
    return text[:j] + ADDED_TENSORS + text[j:]


# ------------------------------------------------------------------------------ plain trees
def test_plain_tree_canary_only(world, untouched, tmp_path, capsys):
    new = world.commit("tree-renamed", {GRAPH: lambda t: t.replace(
        "llm_graph_input_attn_k::set_input(", "llm_graph_input_attn_k::set_input_impl(")})
    tree = tmp_path / "llama.cpp-src"
    tree.mkdir()
    git.run(world.up, "--work-tree", str(tree), "checkout", new, "--", ".",
            env={"GIT_INDEX_FILE": str(tmp_path / "idx")})
    assert (tree / "CMakeLists.txt").is_file() and not (tree / ".git").exists()
    rc, out, _ = untouched.rebase(capsys, "--onto", str(tree), "--canary")
    report = json.loads(out)
    assert rc == 1 and report["onto"]["source"] == "tree" and report["onto"]["commit"] is None
    assert report["first_failure"]["file"] == GRAPH
    rc, _, err = untouched.rebase(capsys, "--onto", str(tree))
    assert rc == 2 and "plain tree" in err and "--canary" in err


def test_unknown_commit_is_a_clear_error(world, untouched, capsys):
    rc, _, err = untouched.rebase(capsys, "--onto", "no-such-branch", "--git-url", str(world.up))
    assert rc == 2 and "is not a commit in" in err


def test_rebase_verb_has_help():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "llamacpp_mla_port", "rebase", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0
    for flag in ("--onto", "--git-url", "--force", "--canary", "--json"):
        assert flag in out.stdout


def test_the_text_report_names_a_tag_pin_by_its_tree():
    """A pin without a commit id is named by its tree on the old side, as the new side is."""
    from llamacpp_mla_port.upstreaming.rebase import Outcome, format_text
    tree = "27d5f643d32b32ff0a28caf6eb53a7612bc5de96"
    o = Outcome(ok=True, status="up-to-date", old={"commit": None, "tag": "b11434", "tree": tree},
                onto={"commit": None, "tag": "b11434", "tree": tree}, relation="same", changes=[])
    assert format_text(o).splitlines()[0] == "rebase b11434 (27d5f643d32b) -> b11434 (27d5f643d32b): same"


# ------------------------------------------------------------------------------ the tree identity
def test_a_hunk_that_lands_elsewhere_breaks_the_tree_identity(world, untouched, capsys):
    """Upstream moved the function holding our replaced line: the anchor is found (in its new
    place) and the series renders, but its lines moved with it: diff(old patched, new patched)
    has lines diff(old base, new base) has not. The canary's verdict is review, naming the commit
    and the file."""
    def move_function(t: str) -> str:
        i = t.index(K_SET_INPUT)
        j = t.index("}\n", i) + 2
        body = t[i:j] + "\n"
        t = t[:i] + t[j + 1:]
        return t + "\n" + body
    new = world.commit("function-moved", {GRAPH: move_function})
    rc, out, _ = untouched.rebase(capsys, "--onto", new, "--git-url", str(world.up), "--canary")
    report = json.loads(out)
    assert rc == 1 and not report["ok"] and report["status"] == "canary-review", out
    assert report["verdict"] == "review" and report["probably_merged"] == []
    assert [c["status"] for c in report["changes"]] == ["ok", "ok"]
    ident = report["tree_identity"]
    assert ident["checked"] and ident["commits"] == 2
    assert {(r["commit"], r["file"]) for r in ident["regions"]} == {("20-graph-demo", GRAPH)}
    series = [ln for r in ident["regions"] if r["side"] == "series" for ln in r["lines"]]
    assert "-    if (self_kq_mask) {" in series and "+    if (self_kq_mask) {" in series
    # the line the commit replaces moved in upstream's diff, and is gone from the series'
    upstream = [ln for r in ident["regions"] if r["side"] == "upstream" for ln in r["lines"]]
    assert upstream == ["-" + MASK.rstrip("\n"), "+" + MASK.rstrip("\n")]
    assert report["verdict_line"].startswith("REVIEW on ") and "[series/20-graph-demo]" in report["verdict_line"]
    # the control, on the same upstream history: lines moved above the anchors only
    shifted = world.commit("function-kept", {GRAPH: lambda t: _shift(t, K_SET_INPUT, 2)})
    rc, out, _ = untouched.rebase(capsys, "--onto", shifted, "--git-url", str(world.up), "--canary")
    report = json.loads(out)
    assert rc == 0 and report["verdict"] == "ok" and report["tree_identity"]["regions"] == []
    assert report["tree_identity"]["checked"] and report["verdict_line"].startswith("OK on ")


# ------------------------------------------------------------------------------ the real series
# Drift of the project's own series, derived from it here (tests/helpers/upstream_drift.py).
@pytest.fixture(scope="module")
def real(world, tmp_path_factory):
    return Project(world, tmp_path_factory.mktemp("real"), world.base, work_tree=False, real=True)


@pytest.fixture(scope="module")
def mets(world, real):
    found = met_changes(real.templates, world)
    assert found, "no change of the series has a one-line anchor of its own: the drift has nothing to move"
    return found


def _canary(project: Project, world, capsys, new: str) -> tuple[int, dict]:
    rc, out, _ = project.rebase(capsys, "--onto", new, "--git-url", str(world.up), "--canary")
    return rc, json.loads(out)


def _edit(world, name: str, met, text: str) -> str:
    return world.commit(name, {met.change.file: lambda _: text})


def test_real_series_moved_anchors_pass_and_the_tree_identity_holds(world, real, mets, capsys):
    """Lines above the anchors (three at the top of every file the series edits, one right above
    each anchor of its own): every change is found, moved, and nothing is left to review."""
    files = sorted({ch.file for c in load_series(real.templates).commits for ch in c.changes
                    if ch.placement != "create"})
    above = {f: [m.anchor_line for m in mets if m.change.file == f] for f in files}
    new = world.commit("real-moved", {f: (lambda t, f=f: moved_on(t, f, above[f])) for f in files})
    rc, report = _canary(real, world, capsys, new)
    assert rc == 0 and report["ok"] and report["status"] == "canary-ok", report["verdict_line"]
    assert report["verdict"] == "ok" and report["verdict_line"].startswith("OK on ")
    located = [c for c in report["changes"] if c["placement"] != "create"]
    assert located and all(c["status"] == "ok" and c["line"] > c["old_line"] for c in located)
    assert report["probably_merged"] == [] and report["merged_upstream"] == []
    ident = report["tree_identity"]
    assert ident["checked"] and ident["regions"] == [] and ident["commits"] == len(load_series(real.templates).commits)


@pytest.mark.slow
def test_real_series_a_change_landed_upstream_in_other_words_is_flagged(world, real, mets, capsys):
    """Upstream lands a change's code line as it would write it (no comment of ours, its own
    spacing) right at the anchor: the canary says review and names the commit and the line.
    The tree identity holds here (both diffs add upstream's line): only own_words sees it."""
    def lands(m):
        return m.change.placement in ("before", "after") and keyed_lines(m) and \
            in_other_words(m)[1] + "\n" != m.rendered.strip() + "\n"
    m = min((m for m in mets if lands(m)), key=lambda m: len(keyed_lines(m)))
    text, theirs = in_other_words(m)
    rc, report = _canary(real, world, capsys, _edit(world, "real-other-words", m, text))
    assert rc == 1 and not report["ok"] and report["status"] == "canary-review"
    (flagged,) = report["probably_merged"]
    assert flagged["change"] == m.change.origin and flagged["commit"] == m.slug
    hit = flagged["upstream_lines"][0]
    assert hit["text"] == theirs and hit["ours"] == keyed_lines(m)[0].strip()
    assert abs(hit["line"] - flagged["line"]) <= 1                    # right at the anchor
    assert f"[series/{m.slug}]" in report["verdict_line"] and repr(theirs) in report["verdict_line"]
    assert [c["status"] for c in report["changes"] if c["change"] != m.change.origin] == \
        ["ok"] * (len(report["changes"]) - 1)
    assert report["merged_upstream"] == []
    assert report["tree_identity"]["checked"] and report["tree_identity"]["regions"] == []


def test_real_series_an_exactly_merged_change_is_reported_merged(world, real, mets, capsys):
    """Upstream takes a change verbatim (a commit with one change, when there is one: the whole
    commit): it is reported merged, not also as probably merged."""
    changes = {c.slug: len(c.changes) for c in load_series(real.templates).commits}
    alone = [m for m in mets if m.change.placement in ("before", "after")]
    m = ([m for m in alone if changes[m.slug] == 1] or alone)[-1]
    i = m.base.index(m.anchor_line)
    at = i if m.change.placement == "before" else i + len(m.anchor_line)
    rc, report = _canary(real, world, capsys, _edit(world, "real-merged", m, m.base[:at] + m.rendered + m.base[at:]))
    assert rc == 1 and report["status"] == "merged-upstream" and report["verdict"] == "failed"
    assert [c["change"] for c in report["merged_upstream"]] == [m.change.origin]
    assert report["probably_merged"] == []                       # an exact merge is not also "probable"
    assert report["first_failure"]["commit"] == m.slug and m.slug in report["verdict_line"]


def test_real_series_a_reworded_anchor_fails_with_the_reworded_line_first(world, real, mets, capsys):
    """Upstream reorders a condition (or swaps the sides of a comparison; with neither in any
    anchor, renames a name): every token, or all but one, is still there, so that line is the
    first candidate the failure names."""
    m, line = next(((m, r) for op in (" && ", " || ", " == ", " != ") for m in mets
                    if op in m.anchor_line and (r := reworded(m.anchor_line))), None) or \
        next((m, r) for m in mets if (r := renamed(m.anchor_line)))
    assert line != m.anchor_line
    rc, report = _canary(real, world, capsys, _edit(world, "real-reworded", m, m.base.replace(m.anchor_line, line)))
    assert rc == 1 and report["status"] == "conflict"
    (fail,) = [f for f in report["failures"] if f["change"] == m.change.origin]
    assert fail["status"] == "anchor-missing" and fail["anchor"] == m.anchor_line
    assert fail["candidates"][0].split(": ", 1)[1] == line.strip(), fail["candidates"]
    assert f"closest candidate lines: {fail['candidates'][0]}" in fail["message"]


@pytest.mark.slow
def test_real_series_a_hunk_that_lands_elsewhere_breaks_the_tree_identity(world, real, mets, capsys):
    """The anchor line moved to the end of its file: the change follows it there, so the series'
    diff has its lines twice (removed, added) where upstream's has the anchor only."""
    m = next(m for m in mets if m.change.placement in ("before", "after") and m.rendered.strip())
    rc, report = _canary(real, world, capsys, _edit(world, "real-landed-elsewhere", m, moved_to_the_end(m)))
    assert rc == 1 and report["status"] == "canary-review", report["verdict_line"]
    regions = report["tree_identity"]["regions"]
    assert regions and {(r["commit"], r["file"]) for r in regions} == {(m.slug, m.change.file)}
    lines = [ln for r in regions if r["side"] == "series" for ln in r["lines"]]
    ours = [ln for ln in m.rendered.splitlines() if ln.strip()]
    assert all(f"-{ln}" in lines and f"+{ln}" in lines for ln in ours), lines
    assert report["probably_merged"] == [] and f"[series/{m.slug}]" in report["verdict_line"]


# ------------------------------------------------------------------------------ in memory
CPP = "src/x.cpp"


def test_own_words_compares_code_lines_not_comments_or_braces():
    key = own_words.key
    assert key("        res->t_layer_inp[il] = inpL;", CPP) == key("res->t_layer_inp[il]=inpL;  // ours", CPP)
    assert key("res->t_layer_inp[il] = inpL;", CPP) != key("res->t_layer_inp[il] = cur;", CPP)
    for trivial in ("}", "} else {", "return false;", "break;", "#endif", "return nullptr;", "x = 0;",
                    "// DFlash/DSpark drafts tap the layer input", "/* a block", " * of comment", ""):
        assert key(trivial, CPP) is None, trivial
    assert key("MODEL_TENSOR.ATTN_KV_A_MQA,  # mla", "gguf-py/gguf/constants.py") == "MODEL_TENSOR . ATTN_KV_A_MQA ,"
    assert key("#include <cstring>", CPP) is None and key("# a comment line", "x.py") is None


def test_own_words_finds_the_line_near_the_anchor_and_only_there():
    """The line upstream added right above the anchor is found; the controls: the same line far
    from the anchor, or already there at the old base, is not."""
    anchor = "        // the residual stream\n"
    ours = ["        // DFlash drafts tap the layer input", "        res->t_layer_inp[il] = inpL;"]
    filler = "".join(f"        step({n});\n" for n in range(40))
    old = filler + anchor + filler
    near_then = own_words.near_keys(CPP, old, old.index(anchor), old.index(anchor) + len(anchor), len(ours))

    def hits(text):
        i = text.index(anchor)
        return own_words.upstream_hits(CPP, ours, text, i, i + len(anchor), near_then)
    new = filler + "        res->t_layer_inp[il]=inpL;\n\n" + anchor + filler
    (hit,) = hits(new)
    assert (hit.line, hit.text, hit.ours) == (41, "res->t_layer_inp[il]=inpL;", "res->t_layer_inp[il] = inpL;")
    assert hits("        res->t_layer_inp[il] = inpL;\n" + filler + anchor + filler) == []     # far away
    assert hits(old) == []                                                                # the pin
    already = filler + "        res->t_layer_inp[il] = inpL;\n" + anchor + filler
    near_before = own_words.near_keys(CPP, already, already.index(anchor),
                                      already.index(anchor) + len(anchor), len(ours))
    i = already.index(anchor)
    assert own_words.upstream_hits(CPP, ours, already, i, i + len(anchor), near_before) == []


def test_the_analysis_of_the_pin_against_itself_reports_nothing(world, real):
    """The unchanged pin: no change is probably merged (every line near an anchor was there)."""
    series = load_series(real.templates)
    pin = load_pin(real.templates / "pin.toml")
    up = git.Repo(world.up)
    seen: dict = {}
    read = lambda p: git.read_blob(up, world.base, p)            # noqa: E731
    analyse(series, read, pin.short, {"pin": pin}, seen=seen)
    again = analyse(series, read, pin.short, {"pin": pin}, baseline=seen)
    assert seen and {r.status for r in again} <= {"ok"}, {r.status for r in again}
    assert sum(1 for s in seen.values() if s.near) > 0
