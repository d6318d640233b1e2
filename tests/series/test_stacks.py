"""PR stacks (templates/port.toml [stacks], commit.toml `stack`, templates/stacks/<name>.md)
and upstream's style rules for the series (style.py): every stack renders and applies alone on
the pinned base, in both forms, byte-reproducibly; a commit outside every stack is an error
naming it; port.toml is configuration (short strings), the prose lives in one file per stack
and cites measured figures only by a link to docs/bench.md."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest

from llamacpp_mla_port.process import git
from llamacpp_mla_port.errors import AnchorError, PortDescriptionError
from llamacpp_mla_port.series import stacks
from llamacpp_mla_port.series.spec import Evidence, load_series
from llamacpp_mla_port.source import obtain as upstream
from llamacpp_mla_port.upstreaming import style

REPO = Path(__file__).resolve().parents[2]
TEMPLATES_DIR, PATCHES_DIR = REPO / "templates", REPO / "patches"


@pytest.fixture(scope="module")
def base(pin, sdist_tarball):
    return upstream.obtain(pin, "sdist", sdist_file=sdist_tarball, log=lambda *_: None)


def _render_all(base, pin, out: Path, templates: Path = TEMPLATES_DIR) -> list:
    repo = upstream.cache_repo()
    series = load_series(templates)
    done = []
    for rs in stacks.render_stacks(repo, series, base.sha, pin.tag, {"pin": pin}):
        folder = out / rs.stack.name
        folder.mkdir(parents=True)
        stacks.export_stack(repo, rs, folder, pin, series)
        stacks.verify(repo, rs, folder)
        done.append(rs)
    return done


# -------------------------------------------------------------------------------- stacks
def test_every_commit_is_in_one_stack_and_the_stacks_cover_the_series():
    series = load_series(TEMPLATES_DIR)
    assert len(series.stacks) > 1 and all(s.commits for s in series.stacks)
    members = [slug for s in series.stacks for slug in s.commits]
    assert sorted(members) == sorted(c.slug for c in series.commits)
    assert len(members) == len(set(members))
    for s in series.stacks:
        assert style.subject_findings(s.title) == [], s.title
        assert s.evidence, f"stack {s.name} lists no evidence"


def test_each_stack_applies_alone_on_the_pin_in_both_forms(base, pin, tmp_path):
    rendered = _render_all(base, pin, tmp_path / "a")
    repo = upstream.cache_repo()
    for rs in rendered:
        folder = tmp_path / "a" / rs.stack.name
        squashed = (folder / stacks.SQUASHED).read_text()
        assert squashed.count("\nSubject: ") == 1
        assert style.split_patch(squashed)[0] == rs.stack.title
        assert len((folder / "patches" / "series").read_text().split()) \
            == len(rs.stack.commits)
        # the squashed commit and the stack's head hold the same tree, on the base
        assert git.run(repo, "rev-parse", f"{rs.squashed}^{{tree}}") == \
            git.run(repo, "rev-parse", f"{rs.head}^{{tree}}")
        # on the pin, or on the head of the stacks it is based on (a stacked PR)
        assert git.run(repo, "rev-parse", f"{rs.squashed}^") == rs.base
        if rs.stack.depends:    # its base changes the files that the stacks it is based on change
            under = {r.stack.name: r for r in rendered}
            changed = lambda head: set(git.run(repo, "diff", "--name-only", base.sha, head).split())  # noqa: E731
            assert changed(rs.base) == set().union(*(changed(under[d].head) for d in rs.stack.depends))
        else:
            assert rs.base == base.sha
        # upstream's style, the mid-sentence comment rule included, on every stack's patches
        for p in sorted((folder / "patches").glob("*.patch")) + [folder / stacks.SQUASHED]:
            found = [str(f) for f in style.patch_findings(p.read_text())]
            assert found == [], (rs.stack.name, p.name, found)
    # the stacks together touch what the series touches, and nothing twice the same way
    got = sorted(f for rs in rendered for f in stacks.diffstat(repo, rs.base, rs.head)["files"])
    series_files = set()
    for c in load_series(TEMPLATES_DIR).commits:
        series_files |= {ch.file for ch in c.changes}
    assert set(got) == series_files


@pytest.mark.slow
def test_stacks_render_byte_identically_twice(base, pin, tmp_path):
    _render_all(base, pin, tmp_path / "a")
    _render_all(base, pin, tmp_path / "b")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_a_commit_in_no_stack_is_an_error_naming_it(tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, templates)
    new = templates / "series" / "01-ggml-cpu-something"
    shutil.copytree(templates / "series" / "20-graph-k-only-mask-check", new)
    toml = new / "commit.toml"
    toml.write_text(toml.read_text().replace('stack = "mla-draft"\n', ""))
    with pytest.raises(PortDescriptionError, match="series/01-ggml-cpu-something belongs to no "
                                                   "PR stack") as err:
        load_series(templates)
    assert ", ".join(s.name for s in load_series(TEMPLATES_DIR).stacks) in err.value.hint   # every stack, in order
    toml.write_text('stack = "ggml-cpu"\n' + toml.read_text())
    with pytest.raises(PortDescriptionError, match="stack 'ggml-cpu' is not defined"):
        load_series(templates)
    # a new stack in port.toml makes it a fourth PR of its own, in port.toml's order
    port = templates / "port.toml"
    port.write_text(port.read_text() + '\n[stacks.ggml-cpu]\ntitle = "ggml-cpu : a demo"\n')
    series = load_series(templates)
    assert [s.name for s in series.stacks][-1] == "ggml-cpu"
    assert series.stack("ggml-cpu").commits == ("01-ggml-cpu-something",)


def test_a_stack_that_leans_on_another_fails_naming_the_stack(base, pin, tmp_path):
    """Put the K-only mask guard (mla-draft) into the rpc stack, and make the MLA backbone
    anchor on it: the mla-draft stack (based on the Kimi-K3 fix only) no longer renders."""
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, templates)
    toml = templates / "series" / "20-graph-k-only-mask-check" / "commit.toml"
    toml.write_text(toml.read_text().replace('stack = "mla-draft"', 'stack = "rpc"'))
    guard = (templates / "series" / "20-graph-k-only-mask-check" / "attn-k-set-input-mask.cpp.j2") \
        .read_text()
    lean = templates / "series" / "21-model-dflash-mla-backbone" / "commit.toml"
    lean.write_text(lean.read_text() + f'''
[[change]]
file = "src/llama-graph.cpp"
anchor = """
{guard}"""
placement = "after"
template = "models-h-graph-mla.h.j2"
''')
    repo = upstream.cache_repo()
    series = load_series(templates)
    with pytest.raises(AnchorError, match="PR stack 'mla-draft' does not render alone"):
        stacks.render_stack(repo, series, series.stack("mla-draft"), base.sha, pin.tag,
                            {"pin": pin})
    # the canary's view: one entry per stack, the failing one names why
    tried = {t["stack"]: t for t in stacks.try_stacks(repo, series, base.sha, pin.tag, {"pin": pin}, pin)}
    assert tried["rpc"]["ok"] and tried["pair-check"]["ok"] and not tried["mla-draft"]["ok"]
    assert "does not render alone" in tried["mla-draft"]["message"]
    # the control: based on rpc, the stacked PR renders on rpc
    port = templates / "port.toml"
    port.write_text(port.read_text().replace('depends = ["kimi-k3-layer-inputs", "pair-check"]',
                                             'depends = ["rpc", "kimi-k3-layer-inputs", "pair-check"]'))
    series = load_series(templates)
    rs = stacks.render_stack(repo, series, series.stack("mla-draft"), base.sha, pin.tag, {"pin": pin})
    assert len(rs.shas) == len(series.stack("mla-draft").commits)


MLA_TITLE = 'title = "model : add an MLA backbone to the DFlash draft"\n'


def test_depends_names_an_earlier_stack(tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, templates)
    port = templates / "port.toml"
    text = port.read_text().replace('depends = ["kimi-k3-layer-inputs", "pair-check"]', 'depends = ["pair-check"]')
    for bad in ('["mla-draft"]', '["nope"]', '"pair-check"', '["cpu-fa-kv-head-tiles"]'):
        port.write_text(text.replace('depends = ["pair-check"]', f"depends = {bad}"))
        with pytest.raises(PortDescriptionError, match=r"\[stacks.mla-draft\] depends = .*must name a stack "
                                                       "defined before it"):
            load_series(templates)
    port.write_text(text)
    series = load_series(templates)
    assert [s.name for s in series.base_of(series.stack("mla-draft"))] == ["pair-check"]
    # every PR of the real series stands alone on the base, but mla-draft on the Kimi-K3 crash fix
    # and on pair-check, whose test harness its test is one row of
    real = load_series(TEMPLATES_DIR)
    assert {st.name: [b.name for b in real.base_of(st)] for st in real.stacks if real.base_of(st)} == {
        "mla-draft": ["pair-check", "kimi-k3-layer-inputs"]}


def test_the_canary_tries_every_stack_of_the_real_series(base, pin):
    tried = stacks.try_stacks(upstream.cache_repo(), load_series(TEMPLATES_DIR), base.sha, pin.tag,
                              {"pin": pin}, pin)
    assert [t["stack"] for t in tried] == [st.name for st in load_series(TEMPLATES_DIR).stacks]
    assert all(t["ok"] and t["added"] > 0 for t in tried), tried


# ------------------------------------------------------------------ the port description as data
#: port.toml's longest string: a title, a one-line relation (prose, issue facts and evidence go
#: to templates/stacks/<name>.md)
MAX_TOML_STRING = 300
#: all of port.toml's strings together (issue 57): configuration, not prose
TOML_STRINGS_BUDGET = 6000
#: a measured ratio ("1.5x", "0.80-0.88x"): docs/bench.md holds those, the prose links there
RATIO = re.compile(r"\b\d+\.\d+x\b")


def long_strings(data, path: str = "") -> list[str]:
    """Every string of a TOML document over MAX_TOML_STRING characters, by its key path."""
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in long_strings(v, f"{path}.{k}" if path else k)]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in long_strings(v, f"{path}[{i}]")]
    return [f"{path} ({len(data)} characters)"] if isinstance(data, str) and len(data) > MAX_TOML_STRING else []


def string_chars(data) -> int:
    """The characters of every string of a TOML document, together."""
    if isinstance(data, str):
        return len(data)
    return sum(map(string_chars, data.values() if isinstance(data, dict) else
                   data if isinstance(data, list) else ()))


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings (lowercase; punctuation dropped, spaces to dashes)."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", markdown, re.M)}


def prose_problems(name: str, text: str, docs: Path) -> list[str]:
    """A stack's prose: no measured ratio of its own, and every link to a local file resolves,
    its #anchor to a heading there."""
    out = [f"{name}: the ratio {m} (link to docs/bench.md instead)" for m in RATIO.findall(text)]
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        file, _, anchor = target.partition("#")
        path = (docs / file).resolve()
        if not path.is_file():
            out.append(f"{name}: {target}: no such file")
        elif anchor and anchor not in heading_anchors(path.read_text()):
            out.append(f"{name}: {target}: no such heading")
    return out


def test_the_checkers_find_long_strings_ratios_and_dead_links(tmp_path):
    assert long_strings({"stacks": {"a": {"title": "t", "summary": "x" * 301, "facts": ["y" * 300, "z" * 400]}}}) \
        == ["stacks.a.summary (301 characters)", "stacks.a.facts[1] (400 characters)"]
    (tmp_path / "bench.md").write_text("# Benchmarks\n\n## 2026-12-04 (night): Zen 4, a tile dropped\n")
    good = "slower than the base ([docs](bench.md#2026-12-04-night-zen-4-a-tile-dropped)); 4x2 tiles"
    assert prose_problems("a", good, tmp_path) == []
    assert prose_problems("a", "0.80-0.88x of the base, about 1.5x ([x](bench.md#night)) [y](gone.md)",
                          tmp_path) == ["a: the ratio 0.88x (link to docs/bench.md instead)",
                                        "a: the ratio 1.5x (link to docs/bench.md instead)",
                                        "a: bench.md#night: no such heading", "a: gone.md: no such file"]


def test_port_toml_holds_configuration_and_each_stack_its_prose():
    port = tomllib.loads((TEMPLATES_DIR / "port.toml").read_text())
    assert long_strings(port) == [], f"strings over {MAX_TOML_STRING} characters in templates/port.toml"
    series = load_series(TEMPLATES_DIR)
    problems = []
    for st in series.stacks:
        path = TEMPLATES_DIR / "stacks" / f"{st.name}.md"
        assert path.is_file() and st.summary, f"{st.name}: no prose in {path}"
        assert "\n" not in st.summary.split("\n\n")[0]          # a paragraph reads as one line
        sections = path.read_text().partition("\n## ")[2]      # facts and claims may cite others' ratios
        problems += prose_problems(st.name, st.summary, path.parent) + [
            p for p in prose_problems(st.name, sections, path.parent) if ": the ratio " not in p]
    assert problems == [], "\n".join(problems)


def test_port_toml_strings_stay_within_their_budget():
    total = string_chars(tomllib.loads((TEMPLATES_DIR / "port.toml").read_text()))
    assert total <= TOML_STRINGS_BUDGET, (f"templates/port.toml holds {total} characters of strings, over "
                                          f"{TOML_STRINGS_BUDGET}: move prose to templates/stacks/<name>.md")
    assert string_chars({"a": ["xy", {"b": "z", "n": 3}], "t": "uvw"}) == 6


def test_a_summary_in_port_toml_or_a_stray_prose_file_is_refused(tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, templates)
    (templates / "stacks" / "rpc.md").write_text("First paragraph,\nwrapped.\n\n\nSecond  one.\n")
    assert load_series(templates).stack("rpc").summary == "First paragraph, wrapped.\n\nSecond one."
    (templates / "stacks" / "rpc.md").unlink()
    assert load_series(templates).stack("rpc").summary == ""
    (templates / "stacks" / "rcp.md").write_text("a typo\n")
    with pytest.raises(PortDescriptionError, match=r"rcp.md names no stack of port.toml"):
        load_series(templates)
    (templates / "stacks" / "rcp.md").unlink()
    port = templates / "port.toml"
    text = port.read_text()
    for key, value in (("summary", '"old"'), ("issue_facts", '["a fact"]'),
                       ("evidence", '[{claim = "c", command = "true"}]')):
        port.write_text(text.replace('[stacks.pair-check]\n', f'[stacks.pair-check]\n{key} = {value}\n'))
        with pytest.raises(PortDescriptionError, match=rf"\[stacks.pair-check\] {key}: moved to "
                                                       r"templates/stacks/pair-check.md"):
            load_series(templates)


def _prose_text(st) -> str:
    """A stack as its templates/stacks/<name>.md would say it."""
    facts = "".join(f"- {f}\n" for f in st.issue_facts)
    evidence = "".join(f"- {e.claim}\n  `{e.command}`\n" for e in st.evidence)
    return (st.summary + "\n" + (f"\n## Issue facts\n\n{facts}" if facts else "")
            + (f"\n## Evidence\n\n{evidence}" if evidence else ""))


def test_a_prose_file_holds_the_summary_then_the_issue_facts_then_the_evidence(tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, templates)
    real = load_series(TEMPLATES_DIR)
    assert real.stack("mla-draft").issue_facts and real.stack("rpc").evidence
    for st in real.stacks:                       # the format round-trips
        (templates / "stacks" / f"{st.name}.md").write_text(_prose_text(st))
    assert load_series(templates).stacks == real.stacks
    (templates / "stacks" / "rpc.md").write_text(
        "A summary,\nwrapped.\n\n## Issue facts\n-   one fact, `quoted`  \n\n- two\n## Evidence\n\n"
        "- a claim\n    `pytest -k 'a or b'`\n- the next\n\t`make smoke`\n")
    rpc = load_series(templates).stack("rpc")
    assert (rpc.summary, rpc.issue_facts) == ("A summary, wrapped.", ("one fact, `quoted`", "two"))
    assert rpc.evidence == (Evidence("a claim", "pytest -k 'a or b'"), Evidence("the next", "make smoke"))
    (templates / "stacks" / "rpc.md").write_text("Only a summary.\n")
    assert load_series(templates).stack("rpc").issue_facts == load_series(templates).stack("rpc").evidence == ()


@pytest.mark.parametrize("sections, match", [
    ("## Facts\n- x\n", r"rpc.md:3: the heading '## Facts': only ## Issue facts then ## Evidence, each at most once"),
    ("## Evidence\n- c\n  `x`\n## Issue facts\n- f\n", r"rpc.md:6: the heading '## Issue facts'"),
    ("## Issue facts\n- f\n## Issue facts\n", r"rpc.md:5: the heading '## Issue facts'"),
    ("## Evidence\n- c\n  `x`\n### More\n", r"rpc.md:6: the heading '### More'"),
    ("## Evidence\n- a claim\n- another\n  `x`\n", r"rpc.md:4: the claim 'a claim' has no `command` on the indented"),
    ("## Evidence\n- a claim\n`x`\n", r"rpc.md:4: the claim 'a claim' has no `command`"),
    ("## Evidence\n- a claim\n  x\n", r"rpc.md:4: the claim 'a claim' has no `command`"),
    ("## Evidence\n\n- a claim", r"rpc.md:5: the claim 'a claim' has no `command`"),
    ("## Issue facts\n- f\n-  \n", r"rpc.md:5: an empty bullet"),
    ("## Issue facts\n- f\n  wrapped on\n", r"rpc.md:5: 'wrapped on' is not a `- ` bullet of '## Issue facts'"),
    ("## Evidence\n  `x`\n", r"rpc.md:4: '`x`' is not a `- ` bullet of '## Evidence'"),
])
def test_a_malformed_prose_file_is_refused_naming_its_line(tmp_path, sections, match):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, templates)
    (templates / "stacks" / "rpc.md").write_text("A summary.\n\n" + sections)
    with pytest.raises(PortDescriptionError, match=match) as err:
        load_series(templates)
    assert "hint: after the summary, `## Issue facts`: a `- fact` line each" in str(err.value)


# --------------------------------------------------------------------------------- style
def test_checked_in_series_keeps_upstreams_style():
    names = (PATCHES_DIR / "series").read_text().split()
    assert names
    for name in names:
        found = [str(f) for f in style.patch_findings((PATCHES_DIR / name).read_text())]
        assert found == [], (name, found)


@pytest.mark.parametrize("subject, rule", [
    ("ggml-rpc : exit with a message when a server is lost, refuse foreign peers", "length"),
    ("model : dflash: refuse a draft", "prefix"),
    ("docs : speculative : MLA drafts", "prefix"),
    ("add an MLA backbone", "prefix"),
    ("Model: add an MLA backbone", "prefix"),
    ("model : add an MLA backbone \u2014 for drafts", "ascii"),
])
def test_bad_subjects_are_found(subject, rule):
    assert rule in [f.rule for f in style.subject_findings(subject)]


def test_good_subjects_pass():
    for s in ("rpc : do not abort when the server fails", "gguf-py : add MLA tensors",
              "context : check a DFlash draft against its target"):
        assert style.subject_findings(s) == [], s


def _patch(path: str, added: list[str], body: str = "Why.\n") -> str:
    hunk = "".join(f"+{ln}\n" for ln in added)
    return (f"From 0 Mon Sep 17 00:00:00 2001\nFrom: a <a@b>\nSubject: [PATCH] model : demo\n\n"
            f"{body}---\n {path} | 1 +\n\ndiff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -1,1 +1,{len(added) + 1} @@\n x\n{hunk}")


def test_long_comments_and_non_ascii_added_lines_are_found():
    three = ["// one.", "// two.", "// three", "int x = 0;"]
    found = style.patch_findings(_patch("src/a.cpp", three))
    assert [(f.rule, f.where) for f in found] == [("comment", "src/a.cpp:2")]
    assert style.patch_findings(_patch("src/a.cpp", ["// one.", "// two", "int x;"])) == []
    py = style.patch_findings(_patch("a.py", ["    # one.", "    # two.", "    # three", "x = 1"]))
    assert [f.rule for f in py] == ["comment"]
    assert style.patch_findings(_patch("doc.md", ["# a", "# b", "# c"])) == []   # not code
    # ggml's designated-initializer style: inline comments before values are code lines
    init = ["    /* .mem_size   = */ 1,", "    /* .mem_buffer = */ nullptr,", "    /* .no_alloc   = */ true,"]
    assert style.patch_findings(_patch("src/a.cpp", init)) == []
    block = ["/* one.", " * two.", " * three */", "int x;"]
    assert [f.rule for f in style.patch_findings(_patch("src/a.cpp", block))] == ["comment"]
    arrow = style.patch_findings(_patch("src/a.cpp", ["int x; // a \u2192 b"]))
    assert [f.rule for f in arrow] == ["ascii"] and "U+2192" in arrow[0].message
    long_body = style.patch_findings(_patch("src/a.cpp", ["int x;"], "line\n" * 13))
    assert [f.rule for f in long_body] == ["length"]


def test_the_mla_draft_pr_adds_one_row_to_pair_checks_harness(base, pin, tmp_path):
    """mla-draft is based on pair-check (depends): its test is one row of 09's pair cases and its
    MLA keys, a few lines over pair-check's test-llama-archs, never a copy of the harness."""
    from llamacpp_mla_port.process import git
    repo = upstream.cache_repo()
    series = load_series(TEMPLATES_DIR)
    mla = series.stack("mla-draft")
    rs = stacks.render_stack(repo, series, mla, base.sha, pin.tag, {"pin": pin})
    diff = git.run(repo, "diff", "--numstat", f"{rs.shas[0]}~1", rs.head, "--", "tests/test-llama-archs.cpp")
    added, removed = (int(n) for n in diff.split()[:2])
    assert 0 < added <= 60 and removed == 0, diff
    patch = next((PATCHES_DIR).glob("*-tests-run-an-MLA-DFlash-draft-in-test-llama-archs.patch")).read_text()
    assert "to the" in patch and "pair cases" in patch and "skipped LLM_ARCH_DFLASH" not in patch


def test_a_change_for_one_form_names_an_earlier_commit(tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, templates)
    toml = templates / "series" / "24-tests-kimi-k3-layer-inputs" / "commit.toml"
    text = toml.read_text()
    for bad in ("40-docs-speculative-mla-dspark", "99-nope"):
        toml.write_text(text.replace('without_commit = "09-tests-dflash-pair-archs"', f'without_commit = "{bad}"', 1))
        with pytest.raises(PortDescriptionError, match=f"without_commit = '{bad}' is not an earlier commit"):
            load_series(templates)


def test_a_first_step_renders_and_applies_alone_on_the_base(base, pin, tmp_path):
    """PLAN.md offers a stack's first_step as a PR of its own: that commit alone on the pin (the
    real series has none since the Kimi-K3 taps became a stack: a demo one on the K-only mask guard)."""
    import dataclasses
    repo = upstream.cache_repo()
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, templates)
    port = templates / "port.toml"
    port.write_text(port.read_text().replace(MLA_TITLE, MLA_TITLE + 'first_step = {commit = '
                                             '"20-graph-k-only-mask-check", why = "a graph fix of its own"}\n'))
    series = load_series(templates)
    firsts = [st for st in series.stacks if st.first_step]
    assert firsts, "no stack offers a first step"
    for st in firsts:
        one = dataclasses.replace(st, name=f"{st.name}-first", commits=(st.first_step[0],), depends=())
        rs = stacks.render_stack(repo, series, one, base.sha, pin.tag, {"pin": pin})
        folder = tmp_path / one.name
        folder.mkdir()
        stacks.export_stack(repo, rs, folder, pin, series)
        assert stacks.verify(repo, rs, folder)["applies_alone"]
