"""`rebase --onto`: the upstream named (a commit, a clone, a plain folder, or a PyPI sdist
tree), imported into the cache repository, and how it relates to the pinned commit."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from llamacpp_mla_port.process import git
from llamacpp_mla_port.errors import PinError, ProcessError
from llamacpp_mla_port.source import newer as newer_mod, obtain
from llamacpp_mla_port.source.obtain import Base
from llamacpp_mla_port.source.pin import SHA1, Pin, Sdist


@dataclass
class Target:
    """The upstream to rebase onto, imported into the cache repository."""
    base: Base
    commit: str | None           # upstream commit id (None for a plain tree or an sdist)
    tag: str
    url: str | None              # where it was fetched from (None for a plain tree)
    local_repo: Path | None      # a local clone holding its history, for ancestry checks
    build: int | None = None     # llama.cpp build number (bN), when known
    origin: dict = field(default_factory=dict)   # where the tree came from, for the report
    sdist: Sdist | None = None   # the recorded PyPI sdist it came from (a pin can name it)

    @property
    def label(self) -> str:
        if self.origin.get("kind") == "pypi-sdist":
            return f"{self.tag} ({self.origin['spec']})"
        short = (self.commit or self.base.sha)[:12]
        return short if self.tag == short else f"{self.tag} ({short})"


# ------------------------------------------------------------------------------ targets
def _is_repo(path: Path) -> bool:
    try:
        top = git.run(path, "rev-parse", "--show-toplevel")
    except ProcessError:
        return False
    return Path(top).resolve() == path.resolve()


def _is_bare(path: Path) -> bool:
    try:
        return git.run(path, "rev-parse", "--is-bare-repository") == "true" and \
            Path(git.run(path, "rev-parse", "--absolute-git-dir")).resolve() == path.resolve()
    except ProcessError:
        return False


def _local_git(url: str | None) -> Path | None:
    if url and os.path.isdir(url):
        p = Path(url).resolve()
        if _is_repo(p) or _is_bare(p):
            return p
    return None


def _describe(repo: Path | None, commit: str) -> str:
    if repo is not None:
        with contextlib.suppress(ProcessError):
            return git.run(repo, "describe", "--tags", "--exact-match", commit)
    return commit[:12]


def resolve_target(onto: str, git_url: str | None, pin: Pin, templates_dir: Path, tag: str | None = None,
                   sdist_file: Path | None = None, log=print) -> Target:
    """Fetch (or import) what --onto names into the cache repo: a commit (of --git-url or
    the pin's URL), a clone, a plain folder, or a PyPI sdist tree (source/newer.py)."""
    if git_url is None and os.path.isdir(onto):
        if (clone := _local_git(onto)) is None:
            return _import_tree(Path(onto).resolve(), tag)
        git_url, onto = str(clone), "HEAD"
    if git_url is None:
        newer = newer_mod.resolve(onto, templates_dir)
        if newer is not None:
            return _import_newer(newer, tag, sdist_file, log)
    url = git_url or pin.url
    local = _local_git(url)
    if local is not None:
        try:
            commit = git.run(local, "rev-parse", "--verify", "-q", f"{onto}^{{commit}}")
        except ProcessError:
            raise PinError(f"--onto {onto!r} is not a commit in {local}",
                           "pass a commit id, tag or branch of that clone") from None
    elif SHA1.match(onto):
        commit = onto
    else:
        try:
            out = git.run(Path.cwd(), "ls-remote", url, onto, timeout=git.NETWORK_TIMEOUT_S)
        except ProcessError as err:
            raise PinError(f"cannot list {url}: {git.error_text(err)}",
                           "pass the full 40-hex commit id, or --git-url PATH of a local clone") from None
        shas = sorted({line.split()[0] for line in out.splitlines() if line.strip()})
        if len(shas) != 1:
            raise PinError(f"--onto {onto!r} names {len(shas)} refs in {url}", "pass the full 40-hex commit id")
        commit = shas[0]
    base = obtain.fetch_git(pin.with_commit(commit, url), url)
    described = _describe(local, commit)
    return Target(base=base, commit=commit, tag=tag or described, url=url, local_repo=local,
                  build=_build_number(local, commit, described), origin={"kind": "git", "url": url})


def _build_number(repo: Path | None, commit: str, described: str) -> int | None:
    """bN of a tag, else what llama.cpp's cmake/build-info.cmake counts (`git rev-list
    --count`), in a clone with the full history only."""
    if re.fullmatch(r"b\d+", described):
        return int(described[1:])
    if repo is None or git.run(repo, "rev-parse", "--is-shallow-repository") == "true":
        return None
    try:
        return int(git.run(repo, "rev-list", "--count", commit))
    except (ProcessError, ValueError):
        return None


def _import_newer(newer: newer_mod.NewerTree, tag: str | None, sdist_file: Path | None,
                  log) -> Target:
    got = obtain.import_newer_tree(newer.sdist, newer.tag, newer.build, sdist_file, log)
    if got.pkg_version is not None and got.pkg_version != newer.sdist.version:
        raise PinError(f"{newer.sdist.filename} says it is version {got.pkg_version} (PKG-INFO), "
                       f"not {newer.sdist.version}", "the archive is not the release named; "
                       "check the [[tree]] row in templates/upstreams.toml")
    origin = {"kind": "pypi-sdist", "spec": newer.spec, "filename": newer.sdist.filename,
              "sha256": newer.sdist.sha256, "sha256_from": "templates/upstreams.toml"
              if newer.recorded else "PyPI's JSON API (not recorded in templates/upstreams.toml)",
              "subdir": got.subdir, "pkg_info_version": got.pkg_version,
              "build_from": newer.build_from}
    if not newer.recorded:
        origin["record_with"] = newer_mod.row_text(newer, got.base.tree, got.subdir)
    recorded = dataclasses.replace(newer.sdist, subdir=got.subdir, tree=got.base.tree) if newer.recorded else None
    return Target(base=got.base, commit=None, tag=tag or newer.tag, url=None, local_repo=None,
                  build=newer.build, origin=origin, sdist=recorded)


def _import_tree(path: Path, tag: str | None) -> Target:
    """A plain directory (no git) as one commit in the cache repo; .gitignore is honoured."""
    missing = obtain.missing_llama_files(path)
    if missing:
        raise PinError(f"--onto {path} is neither a git clone nor a llama.cpp tree "
                       f"(no {', '.join(missing)})", "pass a llama.cpp source directory or a clone")
    repo = obtain.cache_repo()
    with tempfile.TemporaryDirectory(prefix="mla-port-tree-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(path), "GIT_DIR": repo.git_dir}
        git.run(path, "add", "-A", ".", env=env)
        tree = git.run(path, "write-tree", env=env)
    ref = f"refs/mla-port/tree/{tree}"
    sha = git.run(repo, "commit-tree", tree, "-m", f"plain tree {path}\n", env=obtain.IMPORT_IDENTITY)
    git.run(repo, "update-ref", ref, sha)
    base = Base(sha=sha, tree=tree, source="tree", ref=ref)
    return Target(base=base, commit=None, tag=tag or f"tree {tree[:12]}", url=None,
                  local_repo=None, origin={"kind": "folder", "path": str(path)})


def relation(pin: Pin, target: Target) -> str:
    """same | descendant | older | unrelated | unknown (a plain tree has no history)."""
    if pin.commit is None and target.base.tree == pin.tree:
        return "same"          # a tag pin is its tree
    if target.commit is None or pin.commit is None:
        return _relation_by_build(pin, target)
    if target.commit == pin.commit:
        return "same"
    if target.local_repo is not None:
        return _relation_in(target.local_repo, pin.commit, target.commit)
    with tempfile.TemporaryDirectory(prefix="mla-port-history-") as tmp:
        # commits only (no trees, no blobs): enough for merge-base, small even for llama.cpp
        git.run(Path(tmp), "init", "-q", "--bare", ".")
        try:
            git.run(Path(tmp), "fetch", "-q", "--no-tags", "--filter=tree:0", target.url,
                    target.commit, timeout=git.NETWORK_TIMEOUT_S)
        except ProcessError:
            return "unknown"
        return _relation_in(Path(tmp), pin.commit, target.commit)


def _relation_by_build(pin: Pin, target: Target) -> str:
    """Two release tags bN: N counts master's commits, so the higher one descends."""
    old = int(pin.tag[1:]) if re.fullmatch(r"b\d+", pin.tag) else None
    if old is None or target.build is None or not re.fullmatch(r"b\d+", target.tag):
        return "unknown"
    if target.build == old:
        return "same"
    return "descendant" if target.build > old else "older"


def _relation_in(repo: Path, old: str, new: str) -> str:
    def ok(*args) -> bool:
        try:
            git.run(repo, *args)
            return True
        except ProcessError:
            return False
    if not ok("cat-file", "-e", f"{old}^{{commit}}"):
        return "unrelated"          # the pinned commit is not in that history at all
    if ok("merge-base", "--is-ancestor", old, new):
        return "descendant"
    if ok("merge-base", "--is-ancestor", new, old):
        return "older"
    return "unrelated"
