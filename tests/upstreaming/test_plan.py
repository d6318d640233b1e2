"""`make pr`'s plan (upstreaming/plan.py): PLAN.md in port.toml's `order`, the issue skeleton
from upstream's feature-request form, the comment kit for a stack that becomes a comment on an
open upstream PR, and the plan keys' validation (series/spec.py). No builds, no network."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from llamacpp_mla_port.process import git
from llamacpp_mla_port.errors import PortDescriptionError
from llamacpp_mla_port.series.spec import Bench, Evidence, Overlap, Series, Stack, load_series
from llamacpp_mla_port.upstreaming import plan

REPO = Path(__file__).resolve().parents[2]
IDENT = git.identity_env("t", "t@t", "2026-01-01T00:00:00Z")

FORM = """name: Enhancement
description: Used to request enhancements for llama.cpp.
title: "Feature Request: "
labels: ["enhancement"]
body:
  - type: markdown
    attributes:
      value: |
        Please fill out this template yourself.
  - type: checkboxes
    id: prerequisites
    attributes:
      label: Prerequisites
      options:
        - label: I am running the latest code.
          required: true
        - label: I searched for an existing issue.
          required: true
  - type: textarea
    id: feature-description
    attributes:
      label: Feature Description
      placeholder: Detailed description of the enhancement
    validations:
      required: true
  - type: textarea
    id: motivation
    attributes:
      label: Motivation
    validations:
      required: true
  - type: textarea
    id: possible-implementation
    attributes:
      label: Possible Implementation
    validations:
      required: false
"""
SECTIONS = [("Feature Description", True), ("Motivation", True), ("Possible Implementation", False)]


def _stack(name: str, order: int, **kw) -> Stack:
    return Stack(name=name, title=f"{name} : do it", commits=(f"0{order}-{name}",), order=order, **kw)


def _series(*stacks: Stack) -> Series:
    return Series(root=REPO / "templates", vars={}, author_name="a", author_email="a@a", date="d",
                  branch="b", commits=(), stacks=stacks)


# ------------------------------------------------------------------------------ PLAN.md
def test_plan_lists_the_stacks_in_order_with_what_to_open(tmp_path):
    series = _series(
        _stack("late", 3, issue_first=True, depends=("first-pr",)),
        _stack("first-pr", 2, overlaps=(Overlap("#27478", "reworks the same path"),)),
        _stack("rpc", 1, upstream="comment", comment_on=26724,
               overlaps=(Overlap("#26724", "does the same"), Overlap("#25938", "the abort"))),
        _stack("unbuilt", 4))
    results = {"rpc": {"ok": True, "checks": {"builds": True}, "added": 242, "removed": 36,
                       "commits": ["rpc : a", "tests : b"]},
               "first-pr": {"ok": False, "checks": {"builds": False, "evidence": None}, "added": 5,
                            "removed": 0, "commits": ["llama : c"]},
               "late": {"ok": True, "checks": {}, "added": 578, "removed": 23, "commits": ["m : d"]}}
    text = plan.plan_markdown(series, results)
    heads = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert heads == ["## 1. rpc: a comment on #26724 (rpc/COMMENT-KIT.md), not a PR of ours",
                     "## 2. first-pr: a PR", "## 3. late: an issue, then a PR", "## 4. unbuilt: a PR"]
    assert "one pull request open at a time" in text and "never submits" in text
    assert "words of every issue, PR and comment are yours" in text
    rpc, first, late, unbuilt = text.split("\n## ")[1:]
    assert "- overlaps #26724: does the same" in rpc and "- overlaps #25938: the abort" in rpc
    assert "- size: 2 commit(s), +242/-36" in rpc and "all that ran pass" in rpc
    assert "- overlaps #27478: reworks the same path" in first
    assert "SOME FAIL (first-pr/checks.json); not run: evidence" in first
    assert "- first: an upstream issue (late/ISSUE-SKELETON.md)" in late
    assert "- based on: first-pr" in late and "- overlaps: none known" in late
    assert "+578/-23" in late
    assert "not built in this run" in unbuilt
    out = plan.write_plan(series, results, tmp_path)
    assert out == tmp_path / "PLAN.md" and out.read_text() == text


def test_a_kept_stack_is_listed_apart_with_why_and_never_as_a_step():
    """A stack kept in the series and not sent has no step of the one-PR-at-a-time sequence:
    PLAN.md lists it after the steps, with why; a comment stack says why it is not a PR."""
    series = _series(_stack("wide", 2, upstream="kept", why="the draft's own fc needs it"),
                     _stack("first", 1), _stack("fa", 3, upstream="comment", comment_on=27478,
                                                     why="#27478 reworks the same path"))
    text = plan.plan_markdown(series, {"wide": {"ok": True, "checks": {}, "added": 9, "removed": 1,
                                                "commits": ["ggml-cpu : x"]}})
    heads = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert heads[1:] == ["## 1. first: a PR",
                         "## 2. fa: a comment on #27478 (fa/COMMENT-KIT.md), not a PR of ours",
                         "## Kept back: in the series, not sent", "### wide: kept in the series, not sent"]
    kept = text.split("## Kept back")[1]
    assert "- why it is kept back: the draft's own fc needs it" in kept and "+9/-1" in kept
    assert "- why not a PR of ours: #27478 reworks the same path" in text.split("## 2.")[1]
    assert "why" not in text.split("## 1.")[1].split("## 2.")[0]


def test_the_ports_plan_follows_the_review():
    """templates/port.toml: Kimi-K3's crash fix is the first PR, the rpc stack is a comment on #26724, the flash-attention stack one on
    #27478 (its fallback covers the rows the stack tiles), the column blocks are kept back (the
    review: do not open), the feature stacks start with an issue, and the overlaps the review
    names are there; the plan keys stay out of patches/."""
    series = load_series(REPO / "templates")
    rpc = series.stack("rpc")
    assert rpc.upstream == "comment" and rpc.comment_on == 26724
    fa = series.stack("cpu-fa-kv-head-tiles")
    assert fa.upstream == "comment" and fa.comment_on == 27478 and "2..63 query rows" in fa.why
    blocks = series.stack("cpu-q0-column-blocks")
    assert blocks.upstream == "kept" and "docs/bench.md" in blocks.why and "twice" in blocks.why
    text = plan.plan_markdown(series, {})
    assert "cpu-q0-column-blocks" not in text.split("## Kept back")[0]
    assert [st.name for st in series.in_order()][:2] == ["kimi-k3-layer-inputs", "rpc"]
    assert series.stack("pair-check").issue_first and series.stack("mla-draft").issue_first
    refs = {st.name: {o.ref for o in st.overlaps} for st in series.stacks}
    assert "#26724" in refs["rpc"] and "#27478" in refs["cpu-fa-kv-head-tiles"]
    assert "#18099" in refs["loader-probe"]
    assert "cpu-gemv-tiles" not in refs       # it reversed #9330: out of the series, not offered
    # every PR stands alone on the base but mla-draft, based on the Kimi-K3 crash fix (its test's target)
    # and on pair-check (its test is one row of pair-check's harness)
    assert {st.name: st.depends for st in series.stacks if st.depends} == {
        "mla-draft": ("kimi-k3-layer-inputs", "pair-check")}
    taps = series.stack("kimi-k3-layer-inputs")
    assert taps.commits == ("22-model-kimi-k3-layer-inputs", "24-tests-kimi-k3-layer-inputs")
    assert not taps.issue_first and taps.first_step is None
    plan_text = plan.plan_markdown(series, {})
    assert plan_text.index("## 1. kimi-k3-layer-inputs: a PR") < plan_text.index("## 2. rpc: a comment on #26724")
    assert "- based on: kimi-k3-layer-inputs, pair-check (open it once they have merged)" in plan_text
    facts = " ".join(series.stack("mla-draft").issue_facts)
    for fact in ("five Multi-head Latent Attention layers", "Markov head", "confidence head",
                 "7 tokens per pass", "vLLM", "SGLang", "TensorRT-LLM",
                 # the external engines that agree, and those that differ with the reason
                 "dspark_mla.py", "ATOM", "tokenspeed", "vllm-ascend", "_oracle_mla_block_decode",
                 "SGLang #35901", "192^-0.5", "attn_res mixture", "own embed_tokens",
                 "copied from deepseek2.cpp", "num_speculative_tokens"):
        assert fact in facts, fact
    patches = "".join(p.read_text() for p in (REPO / "patches").glob("*.patch"))
    assert all(o.relation not in patches for st in series.stacks for o in st.overlaps)


# ------------------------------------------------------------------------------ ISSUE-SKELETON.md
@pytest.mark.parametrize("with_yaml", [True, False])
def test_the_feature_form_parses_with_and_without_pyyaml(with_yaml, monkeypatch):
    if not with_yaml:
        monkeypatch.setitem(sys.modules, "yaml", None)        # import yaml -> ImportError
    form = plan.parse_form(FORM)
    assert form["sections"] == SECTIONS and form["labels"] == ["enhancement"]
    assert form["checkboxes"] == ["I am running the latest code.", "I searched for an existing issue."]
    assert form["title"] == "Feature Request: " and form["name"] == "Enhancement"


def test_feature_form_is_read_from_the_base_tree(tmp_path):
    repo = tmp_path / "repo"
    forms = repo / ".github" / "ISSUE_TEMPLATE"
    forms.mkdir(parents=True)
    (forms / "010-bug.yml").write_text('name: Bug\nlabels: ["bug-unconfirmed"]\nbody: []\n')
    (forms / "020-enhancement.yml").write_text(FORM)
    (forms / "config.yml").write_text("blank_issues_enabled: false\n")
    (repo / "README.md").write_text("x\n")
    git.run(repo, "init", "-q", ".")
    git.run(repo, "add", "-A")
    git.run(repo, "commit", "-q", "-m", "base", env=IDENT)
    with_form = git.run(repo, "rev-parse", "HEAD")
    git.run(repo, "rm", "-q", "-r", ".github")
    git.run(repo, "commit", "-q", "-m", "no forms", env=IDENT)
    r = git.Repo(repo)
    path, form = plan.feature_form(r, with_form)
    assert path == ".github/ISSUE_TEMPLATE/020-enhancement.yml" and form["sections"] == SECTIONS
    assert plan.feature_form(r, "HEAD") is None


def test_the_issue_skeleton_has_the_forms_sections_and_the_facts():
    st = _stack("mla-draft", 6, issue_first=True, summary="an MLA backbone",
                issue_facts=("five MLA layers, a Markov head", "engines: vLLM, SGLang"),
                overlaps=(Overlap("#25549", "another per-family draft"),),
                evidence=(Evidence("logits match", "make smoke"),))
    evidence = [{"claim": "logits match", "command": "make smoke", "status": "pass"}]
    text = plan.issue_skeleton(st, (".github/ISSUE_TEMPLATE/020-enhancement.yml", plan.parse_form(FORM)),
                               evidence)
    assert "Form: `.github/ISSUE_TEMPLATE/020-enhancement.yml` (Enhancement)" in text
    assert "Title: Feature Request: <your title; the stack's subject is `mla-draft : do it`>" in text
    assert "- [ ] I am running the latest code." in text
    for label, required in SECTIONS:
        assert f"## {label}" + (" (required)" if required else "") + "\n\n<your words>" in text
    facts = text.split("## Facts to cite")[1]
    assert "- summary (templates/stacks/mla-draft.md): an MLA backbone" in facts
    assert "- five MLA layers, a Markov head" in facts and "- engines: vLLM, SGLang" in facts
    assert "- overlaps #25549: another per-family draft" in facts
    assert "  - logits match [pass]" in facts
    # no form in the base tree: a fixed minimal list, said so
    bare = plan.issue_skeleton(st, None, evidence)
    assert "Form: none in the base tree" in bare
    assert [ln for ln in bare.splitlines() if ln.startswith("## ") and "Facts" not in ln] == [
        "## Feature Description (required)", "## Motivation (required)", "## Possible Implementation"]


# ------------------------------------------------------------------------------ COMMENT-KIT.md
def _patch(subject: str, files: dict[str, list[str]]) -> str:
    """A format-patch text: per file, hunks given as their text from the @@ line on."""
    out = [f"From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] {subject}\n\nbody\n---\n"]
    for path, hunks in files.items():
        out.append(f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n" + "".join(hunks))
    return "".join(out)


DEFINE = ("@@ -10,3 +10,8 @@ static int x;\n ctx\n+#ifdef MSG_NOSIGNAL\n"
          "+static constexpr int SEND_FLAGS = MSG_NOSIGNAL;\n+#else\n"
          "+static constexpr int SEND_FLAGS = 0;\n+#endif\n ctx\n ctx\n")
USE = ("@@ -40,3 +45,3 @@ bool send_data() {\n ctx\n-    n = send(fd, p, n, 0);\n"
       "+    n = send(fd, p, n, SEND_FLAGS);\n ctx\n")
TIMEOUT = "@@ -80,2 +85,3 @@ bool connect() {\n ctx\n+    set_timeouts(fd, 10);\n ctx\n"
LATCH = "@@ -5,2 +5,3 @@ void work() {\n ctx\n+    lost = true;\n ctx\n"
ELSEWHERE = "@@ -1,2 +1,3 @@\n ctx\n+// MSG_NOSIGNAL is the rpc backend's business\n ctx\n"
LOST = ("@@ -4,2 +4,5 @@\n ctx\n+    if (strcmp(argv[1], \"--lost\") == 0) {\n"
        "+        return test_lost_server(argv[2]);\n+    }\n ctx\n")


def _kit_folder(tmp_path: Path, fix: dict[str, list[str]]) -> Path:
    folder = tmp_path / "rpc"
    (folder / "patches").mkdir(parents=True)
    (folder / "patches" / "0001-rpc.patch").write_text(_patch("rpc : report a lost server", fix))
    (folder / "patches" / "0002-tests.patch").write_text(_patch(
        "tests : kill an RPC server", {"tests/test-rpc-multi-server.cpp": [LOST]}))
    (folder / "patches" / "series").write_text("0001-rpc.patch\n0002-tests.patch\n")
    (folder / "DESCRIPTION-SKELETON.md").write_text("skeleton\n")
    (folder / "CHECKLIST.md").write_text("# checklist\n")
    return folder


RPC = Stack(name="rpc", title="rpc : report a lost server", order=1, upstream="comment", comment_on=26724,
            commits=("05-ggml-rpc-lost-connection", "06-tests-rpc-lost"),
            overlaps=(Overlap("#26724", "does the same"), Overlap("#26884", "speculative-simple")),
            evidence=(Evidence("a killed server ends the client with exit 1", "pytest -k killed"),
                      Evidence("on the pin the client dies of SIGPIPE", "pytest -k sigpipe"),
                      Evidence("a foreign peer is refused", "pytest -k foreign")))
EVIDENCE = [{"claim": "a killed server ends the client with exit 1", "command": "pytest -k killed",
             "status": "pass", "rc": 0, "output_tail": "noise\n1 passed in 3.2s\n"},
            {"claim": "on the pin the client dies of SIGPIPE", "command": "pytest -k sigpipe",
             "status": "not run", "note": "--skip-evidence: run the command yourself"},
            {"claim": "a foreign peer is refused", "command": "pytest -k foreign", "status": "pass"}]
SUBJECTS = ["rpc : report a lost server", "tests : kill an RPC server"]


def test_the_comment_kit_picks_exactly_the_msg_nosignal_hunks(tmp_path):
    folder = _kit_folder(tmp_path, {"ggml/src/ggml-rpc/transport.cpp": [DEFINE, USE, TIMEOUT],
                                    "ggml/src/ggml-rpc/ggml-rpc.cpp": [LATCH],
                                    "common/arg.cpp": [ELSEWHERE]})
    patches = [folder / "patches" / "0001-rpc.patch", folder / "patches" / "0002-tests.patch"]
    got = plan.nosignal_hunks(patches)
    assert [(p, h.splitlines()[0]) for p, h in got] == [
        ("ggml/src/ggml-rpc/transport.cpp", "@@ -10,3 +10,8 @@ static int x;"),
        ("ggml/src/ggml-rpc/transport.cpp", "@@ -40,3 +45,3 @@ bool send_data() {")]
    written = plan.write_stack_docs(None, "", RPC, folder, EVIDENCE, SUBJECTS)
    assert written == ["COMMENT-KIT.md"]
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["CHECKLIST.md", "COMMENT-KIT.md", "patches"]       # no PR description
    assert (folder / "CHECKLIST.md").read_text().startswith("> Not a PR: this stack becomes a comment on #26724")
    kit = (folder / "COMMENT-KIT.md").read_text()
    assert kit.startswith("# A comment on upstream PR #26724")
    assert "expected to replace `rpc : report a lost server` (series/05-ggml-rpc-lost-connection)" in kit
    assert "tests : kill" not in kit.split("## 1.")[0]
    section = {s.split("\n", 1)[0]: s for s in kit.split("\n## ")[1:]}
    repro, nosig, test, output, later = section.values()
    assert "pytest -k killed" in repro and "pytest -k sigpipe" in repro and "foreign" not in repro
    assert "--- a/ggml/src/ggml-rpc/transport.cpp" in nosig and "SEND_FLAGS = MSG_NOSIGNAL" in nosig
    assert "send(fd, p, n, SEND_FLAGS)" in nosig
    assert "set_timeouts" not in nosig and "lost = true" not in nosig and "rpc backend's business" not in nosig
    assert "--- a/tests/test-rpc-multi-server.cpp" in test and "test_lost_server(argv[2])" in test
    assert "**pass** (exit 0)" in output and "1 passed in 3.2s" in output
    assert "**not run**; --skip-evidence" in output
    assert "GGML_RPC_CONNECT_TIMEOUT" in later and "foreign peer" in later and "- #26884: speculative-simple" in later


def test_the_comment_kit_says_when_msg_nosignal_is_not_found(tmp_path):
    folder = _kit_folder(tmp_path, {"ggml/src/ggml-rpc/transport.cpp": [TIMEOUT],
                                    "common/arg.cpp": [ELSEWHERE]})
    patches = [folder / "patches" / "0001-rpc.patch"]
    assert plan.nosignal_hunks(patches) == []
    kit = plan.comment_kit(RPC, patches, EVIDENCE, SUBJECTS)
    nosig = kit.split("## 2.")[1].split("## 3.")[0]
    assert "Not found: no hunk of this stack's patches/ carries MSG_NOSIGNAL" in nosig
    assert "```diff" not in nosig
    assert "Not found: no hunk of this stack's patches/ carries the test-rpc-multi-server case" in kit


def test_the_comment_kit_of_the_real_rpc_patches():
    """On the series' own rpc commit the kit finds the MSG_NOSIGNAL definition and the send that
    passes it, in ggml-rpc's transport, and nothing else."""
    patches = sorted((REPO / "patches").glob("0001-rpc-*.patch"))
    assert patches, "the rpc stack's first patch moved"
    got = plan.nosignal_hunks(patches)
    assert got and all(p.startswith("ggml/src/ggml-rpc/") for p, _ in got)
    assert any("MSG_NOSIGNAL" in h for _, h in got)
    assert any(ln.startswith("+") and "send(" in ln for _, h in got for ln in h.splitlines())


CASES = ("@@ -11310,0 +11310,4 @@ static std::vector<std::unique_ptr<test_case>> make_test_cases_eval(\n"
         "+    for (int nb : { 16, 63 }) {\n+        test_cases.emplace_back(new test_flash_attn_ext(128, 128, 8, {4, 1}));\n"
         "+    }\n+\n")
OPS = "@@ -9563,1 +9563,1 @@ static void ggml_compute_forward_flash_attn_ext_f16(\n-    neq1 >= Q;\n+    neq1*group >= Q;\n"
FA = Stack(name="fa", title="ggml-cpu : tile", order=3, upstream="comment", comment_on=27478,
           why="#27478 adds a fallback for 2..63 query rows", commits=("85-ggml-cpu-fa",),
           overlaps=(Overlap("#27478", "reworks the one-row path"),), bench=Bench(types=("q8_0",)),
           evidence=(Evidence("the new cases take the tiled path", "pytest -k flash"),))


def test_a_measurement_kit_offers_the_tables_and_the_test_cases(tmp_path):
    """A comment stack with upstream benchmarks offers the open PR its measurements (EVIDENCE.md's
    upstream sections, captions included) and its test cases, not its change."""
    folder = tmp_path / "fa"
    (folder / "patches").mkdir(parents=True)
    (folder / "patches" / "0001-fa.patch").write_text(_patch("ggml-cpu : tile", {
        "ggml/src/ggml-cpu/ops.cpp": [OPS], "tests/test-backend-ops.cpp": [CASES]}))
    (folder / "patches" / "series").write_text("0001-fa.patch\n")
    (folder / "DESCRIPTION-SKELETON.md").write_text("skeleton\n")
    (folder / "CHECKLIST.md").write_text("# checklist\n")
    measured = "## Upstream's benchmarks\n\n_Random weights; Llama-3.1-8B shapes_\n\n| pp16 | 1.20 |\n"
    evidence = [{"claim": "the new cases take the tiled path", "command": "pytest -k flash", "status": "pass"}]
    assert plan.write_stack_docs(None, "", FA, folder, evidence, ["ggml-cpu : tile"], measured) == ["COMMENT-KIT.md"]
    kit = (folder / "COMMENT-KIT.md").read_text()
    assert kit.startswith("# A comment on upstream PR #27478: the `fa` stack's kit")
    section = {s.split("\n", 1)[0]: s for s in kit.split("\n## ")[1:]}
    relate, cases, tables, checks, change = section.values()
    assert "- why a comment: #27478 adds a fallback for 2..63 query rows" in relate
    assert "- #27478: reworks the one-row path" in relate
    assert "--- a/tests/test-backend-ops.cpp" in cases and "{4, 1}" in cases and "neq1*group" not in kit
    assert "_Random weights; Llama-3.1-8B shapes_" in tables and "| pp16 | 1.20 |" in tables
    assert "\n### Upstream's benchmarks\n" in tables          # one level down, under the kit's heading
    assert "- the new cases take the tiled path: **pass**" in checks and "`pytest -k flash`" in checks
    assert "squashed.patch" in change
    assert not (folder / "DESCRIPTION-SKELETON.md").exists()
    assert (folder / "CHECKLIST.md").read_text().startswith("> Not a PR: this stack becomes a comment on #27478")
    # without measurements (upstream-bench not run) the kit says how to make them
    assert "Not run: `make upstream-bench`" in plan.comment_kit(FA, [], evidence, [])


def test_a_kept_stacks_folder_has_no_pr_description(tmp_path):
    folder = tmp_path / "wide"
    folder.mkdir()
    (folder / "DESCRIPTION-SKELETON.md").write_text("skeleton\n")
    (folder / "CHECKLIST.md").write_text("# checklist\n")
    st = _stack("wide", 7, upstream="kept", why="the draft's fc needs it")
    assert plan.write_stack_docs(None, "", st, folder, [], []) == []
    assert sorted(p.name for p in folder.iterdir()) == ["CHECKLIST.md"]
    assert (folder / "CHECKLIST.md").read_text().startswith(
        "> Not sent: this stack stays in the series and is not opened upstream (the draft's fc needs it).")


# ------------------------------------------------------------------------------ port.toml validation
@pytest.fixture
def templates(tmp_path) -> Path:
    out = tmp_path / "templates"
    shutil.copytree(REPO / "templates", out)
    return out


def _edit(templates: Path, old: str, new: str) -> None:
    port = templates / "port.toml"
    text = port.read_text()
    assert text.count(old) == 1, old
    port.write_text(text.replace(old, new))


@pytest.mark.parametrize("old,new,match", [
    ('upstream = "comment"\ncomment_on = 26724\n', 'upstream = "issue"\ncomment_on = 26724\n',
     r'\[stacks.rpc\] upstream = .issue.(.|\n)*one of .pr., .comment., .kept.'),
    ("comment_on = 26724\n", "",
     r"\[stacks.rpc\] comment_on = None(.|\n)*names the upstream PR it comments on"),
    ("[stacks.pair-check]\n", "[stacks.pair-check]\ncomment_on = 1\n",
     r"\[stacks.pair-check\] comment_on = 1(.|\n)*only a stack with upstream = .comment."),
    ("order = 4\n", "order = 3\n", r"\[stacks.cpu-fa-kv-head-tiles\] order = 3 is also \[stacks.loader-probe\]"),
    ("order = 7\n", "order = 0\n", r"\[stacks.mla-draft\] order = 0(.|\n)*a whole number from 1"),
    ("order = 5\n", "order = 5\nissue_first = 1\n",
     r"\[stacks.cpu-q0-odd-columns\] issue_first = 1(.|\n)*true or false"),
    ('{ref = "#27478",', '{ref = "27478",', r"\[stacks.cpu-fa-kv-head-tiles\] overlaps = (.|\n)*ref an upstream"),
    ("[stacks.rpc]\n", "[stacks.rpc]\nissue_first = true\n", r"\[stacks.rpc\] issue_first = True(.|\n)*needs no issue"),
    ('upstream = "kept"\n', 'upstream = "kept"\ncomment_on = 1\n',
     r"\[stacks.cpu-q0-column-blocks\] comment_on = 1(.|\n)*only a stack with upstream = .comment."),
    ("[stacks.pair-check]\n", '[stacks.pair-check]\nwhy = "a reason"\n',
     r"\[stacks.pair-check\] why = .a reason.(.|\n)*only on a stack that is not a PR of ours"),
    ('upstream = "kept"\n', 'upstream = "kept"\nissue_first = true\n',
     r"\[stacks.cpu-q0-column-blocks\] issue_first = True(.|\n)*needs no issue"),
])

def test_bad_plan_keys_are_refused_naming_the_stack_and_the_key(templates, old, new, match):
    _edit(templates, old, new)
    with pytest.raises(PortDescriptionError, match=match):
        load_series(templates)

def test_a_kept_stack_says_why(templates):
    port = templates / "port.toml"
    port.write_text("".join(ln for ln in port.read_text().splitlines(keepends=True)
                            if not ln.startswith('why = "kept in the series')))
    with pytest.raises(PortDescriptionError, match=r"\[stacks.cpu-q0-column-blocks\] why = None(.|\n)*why it stays"):
        load_series(templates)


def test_a_stack_opens_after_what_it_is_based_on(templates):
    series = load_series(templates)
    mla, pair = series.stack("mla-draft").order, series.stack("pair-check").order
    last = max(s.order for s in series.stacks)          # past every order the port description uses
    assert series.stack("mla-draft").depends == ("kimi-k3-layer-inputs", "pair-check")
    _edit(templates, f"order = {mla}\n", f"order = {last + 1}\n")       # mla-draft after pair-check: fine
    assert load_series(templates).stack("mla-draft").order == last + 1
    _edit(templates, f"order = {pair}\n", f"order = {last + 2}\n")      # pair-check after mla-draft: refused
    with pytest.raises(PortDescriptionError, match=rf"\[stacks.mla-draft\] order = {last + 1} comes before pair-check"):
        load_series(templates)


def test_without_order_keys_the_port_toml_order_is_the_plan(templates):
    port = templates / "port.toml"
    port.write_text("".join(ln for ln in port.read_text().splitlines(keepends=True)
                            if not ln.startswith("order = ")))
    series = load_series(templates)
    assert [st.order for st in series.stacks] == list(range(1, len(series.stacks) + 1))
    assert series.in_order() == series.stacks


def test_a_stack_without_order_comes_after_the_ordered_ones(templates):
    _edit(templates, "order = 4\n", "")                  # cpu-fa-kv-head-tiles
    port = templates / "port.toml"
    port.write_text(port.read_text() + '\n[stacks.new-one]\ntitle = "ggml-cpu : a demo"\n')
    toml = templates / "series" / "20-graph-k-only-mask-check" / "commit.toml"
    toml.write_text(toml.read_text().replace('stack = "mla-draft"', 'stack = "new-one"'))
    names = [st.name for st in load_series(templates).in_order()]
    assert names[-2:] == ["cpu-fa-kv-head-tiles", "new-one"] and names[0] == "kimi-k3-layer-inputs"


# ------------------------------------------------------------------------------ in make pr
@pytest.fixture(scope="module")
def world(tmp_path_factory, pin, sdist_tarball):
    from tests.helpers.upstream_drift import make_world
    yield from make_world(tmp_path_factory, pin, sdist_tarball)


def test_make_pr_writes_the_plan_the_issue_skeleton_and_the_comment_kit(world, tmp_path):
    """The demo's two stacks, one a comment on an open PR and one issue-first, through make_pr
    (no build, no proof, no evidence commands): the base tree's own feature-request form."""
    from tests.helpers.upstream_drift import Project
    from llamacpp_mla_port.upstreaming.pr import PrOptions, make_pr

    p = Project(world, tmp_path, world.base)
    _edit(p.templates, '[stacks.gguf-demo]\n',
          '[stacks.gguf-demo]\nupstream = "comment"\ncomment_on = 26724\norder = 2\n')
    _edit(p.templates, '[stacks.graph-demo]\n', '[stacks.graph-demo]\norder = 1\nissue_first = true\n')
    prose = p.templates / "stacks" / "graph-demo.md"
    prose.write_text("## Issue facts\n\n- seven tokens a pass\n\n" + prose.read_text())
    make_pr(PrOptions(p.places(), skip_build=True,
                      skip_smoke=True, skip_evidence=True, upstream_checks=False), smoke=None,
            log=lambda *_: None)
    text = (p.work / "pr" / "PLAN.md").read_text()
    assert [ln for ln in text.splitlines() if ln.startswith("## ")] == [
        "## 1. graph-demo: an issue, then a PR",
        "## 2. gguf-demo: a comment on #26724 (gguf-demo/COMMENT-KIT.md), not a PR of ours"]
    graph, gguf = p.work / "pr" / "graph-demo", p.work / "pr" / "gguf-demo"
    issue = (graph / "ISSUE-SKELETON.md").read_text()
    assert "Form: `.github/ISSUE_TEMPLATE/020-enhancement.yml`" in issue
    assert "## Feature Description (required)" in issue and "- seven tokens a pass" in issue
    assert "  - the demo's claim [not run]" in issue
    assert (graph / "DESCRIPTION-SKELETON.md").is_file() and not (graph / "COMMENT-KIT.md").exists()
    assert not (gguf / "DESCRIPTION-SKELETON.md").exists() and not (gguf / "ISSUE-SKELETON.md").exists()
    assert (gguf / "patches" / "series").is_file() and (gguf / "squashed.patch").is_file()
    kit = (gguf / "COMMENT-KIT.md").read_text()
    assert "Not found: no hunk of this stack's patches/ carries MSG_NOSIGNAL" in kit
