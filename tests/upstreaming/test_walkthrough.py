"""WALKTHROUGH.md: every hunk of a PR folder's commits, for the human who will own the PR."""

from __future__ import annotations

from pathlib import Path

from llamacpp_mla_port.process import git
from llamacpp_mla_port.series.spec import Evidence, Stack, load_series
from llamacpp_mla_port.upstreaming import walkthrough

REPO = Path(__file__).resolve().parents[2]
IDENT = git.identity_env("t", "t@t", "2026-01-01T00:00:00Z")


def _repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "src" / "a.cpp").write_text("// a file\nint known_helper(int x) { return x; }\n\nint tail;\n")
    (repo / "tests" / "test-a.cpp").write_text("int main() {\n    return 0;\n}\n")
    git.run(repo, "init", "-q", ".")
    git.run(repo, "add", "-A")
    git.run(repo, "commit", "-q", "-m", "base", env=IDENT)
    return repo, git.run(repo, "rev-parse", "HEAD")


def _commit(repo: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (repo / name).write_text(text)
    git.run(repo, "commit", "-q", "-am", message, env=IDENT)


def _folder(tmp_path: Path) -> tuple[Path, Path, str]:
    repo, base = _repo(tmp_path)
    _commit(repo, {"src/a.cpp": "// a file\nint known_helper(int x) { return x; }\n\n"
                                "// refuse a width the rope cannot take\n"
                                "int check_rope_width(int w) { if (w & 1) throw \"odd rotary width refused\"; "
                                "return known_helper(w); }\nint tail;\n"},
            "model : refuse an odd rope width\n\nggml_rope asserts on it: refuse it at load.")
    _commit(repo, {"src/a.cpp": (repo / "src" / "a.cpp").read_text() + "int unrelated_counter;\n",
                   "tests/test-a.cpp": "int main() {\n    check_rope_width(3); // odd rotary width refused\n"
                                       "    return known_helper(0);\n}\n"},
            "tests : refuse an odd rope width\n\nThe case.")
    folder = tmp_path / "pr"
    git.run(repo, "format-patch", "-q", "--zero-commit", "-o", str(folder / "patches"), f"{base}..HEAD")
    return folder, repo, base


STACK = Stack(name="demo", title="model : refuse an odd rope width", commits=("a", "b"),
              evidence=(Evidence("the case passes", "pytest -k case"),
                        Evidence("the same case fails on the pin without the fix", "pytest -m slow -k fails")))


def test_every_hunk_is_listed_and_followed_to_the_tests_that_use_it(tmp_path):
    folder, repo, base = _folder(tmp_path)
    text = walkthrough.write(folder, STACK, git.Repo(repo), base).read_text()
    assert text.startswith("# Walkthrough: model : refuse an odd rope width")
    assert "not text to post" in text and "2 commit(s), 3 hunk(s)." in text
    assert "## 1. model : refuse an odd rope width" in text and "ggml_rope asserts on it" in text
    first = text.split("### `src/a.cpp`")[1]
    # the name the hunk defines, and its message text, lead to the test; the base's name does not
    assert "`check_rope_width`" in first.split("###")[0] and "known_helper" not in first.split("###")[0]
    assert "its comments say: // refuse a width the rope cannot take" in first.lower()
    assert "The PR's evidence of need: the same case fails on the pin without the fix" in first
    # the second commit's source hunk adds a name no test uses: a question for the owner
    second = text.split("## 2. tests : refuse an odd rope width")[1]
    src = second.split("### `src/a.cpp`")[1].split("###")[0]
    assert "No test hunk of this PR names what it adds: TODO(owner)" in src
    assert "This hunk is a test" in second.split("### `tests/test-a.cpp`")[1]


def test_without_the_base_every_name_counts_and_comments_never_do(tmp_path):
    """The control: without the base file, a name the base has is followed too; words in
    comments (`rope`, `width`) never are, and message text is."""
    folder, _, _ = _folder(tmp_path)
    commits = [walkthrough.parse_patch(p.read_text()) for p in sorted((folder / "patches").glob("*.patch"))]
    names = commits[0].hunks[0].names
    assert {"check_rope_width", "odd rotary width refused"} <= names
    assert not {"refuse", "width", "rope", "known_helper"} & names      # comments; the hunk's context
    with_base = walkthrough.parse_patch(sorted((folder / "patches").glob("*.patch"))[0].read_text(),
                                        lambda path: "int check_rope_width(int w);")
    assert "check_rope_width" not in with_base.hunks[0].names


def test_the_real_stacks_render_one_section_per_hunk():
    stack = load_series(REPO / "templates").stack("pair-check")
    patches = sorted((REPO / "patches").glob("000[345]-*.patch"))
    commits = [walkthrough.parse_patch(p.read_text()) for p in patches]
    assert [c.subject.split(" :")[0] for c in commits] == ["speculative", "model", "tests"]
    text = walkthrough.render(stack, patches)
    n_hunks = sum(len(c.hunks) for c in commits)
    assert text.count("\n### `") == n_hunks > 5
    assert text.count("TODO(owner): which upstream code does it follow") == sum(
        1 for c in commits for h in c.hunks if not h.path.startswith("tests/"))


def test_a_commit_without_a_body_is_a_question_not_its_diffstat(tmp_path):
    repo, base = _repo(tmp_path)
    _commit(repo, {"src/a.cpp": "int only_subject_here;\n"}, "model : a subject alone")
    git.run(repo, "format-patch", "-q", "--zero-commit", "-o", str(tmp_path / "p"), f"{base}..HEAD")
    commit = walkthrough.parse_patch(next((tmp_path / "p").glob("*.patch")).read_text())
    assert commit.subject == "model : a subject alone" and commit.body == ""
    assert "TODO(owner): the commit has no body." in walkthrough.render(STACK, sorted((tmp_path / "p").glob("*.patch")))
