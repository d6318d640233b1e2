"""Obtain the pinned llama.cpp base, verified, into a per-user cache repository.

Two sources give the same base:
- `git`: a shallow fetch of exactly the pinned commit from the upstream URL or a local
  clone; the fetched commit id is checked against the pin.
- `sdist`: the PyPI source distribution that vendors the same tree; its sha256 is checked,
  `vendor/llama.cpp/` is imported as one commit whose message records the upstream commit,
  and its tree id is checked against the pin.
`auto` tries git and falls back to the sdist on a network failure, saying so in one line.

Everything lands in one bare cache repository (~/.cache/llamacpp-mla-port/base.git, refs
`refs/mla-port/<source>/<commit>`), so a second run is offline and fast; work trees are
filled from it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git

from llamacpp_mla_port import gitutil
from llamacpp_mla_port.errors import NetworkError, ObtainError
from llamacpp_mla_port.pin import Pin

SOURCES = ("auto", "git", "sdist")
#: fixed identity of an imported sdist base commit: the same tarball gives the same commit id
IMPORT_IDENTITY = gitutil.identity_env("llamacpp-mla-port", "llamacpp-mla-port@localhost",
                                       "2000-01-01T00:00:00+00:00")
_NETWORK_MARKERS = ("could not resolve host", "failed to connect", "unable to access",
                    "connection timed out", "connection refused", "network is unreachable",
                    "temporary failure in name resolution", "operation timed out",
                    "could not read from remote", "no route to host", "proxy")


@dataclass(frozen=True)
class Base:
    """A verified base commit in the cache repository."""
    sha: str          # commit id in the cache repo (== pin.commit for git)
    tree: str         # its tree id
    source: str       # "git" or "sdist"
    ref: str          # refs/mla-port/<source>/<upstream commit>


def cache_dir() -> Path:
    root = os.environ.get("LLAMACPP_MLA_PORT_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "llamacpp-mla-port"


def cache_repo() -> git.Repo:
    path = cache_dir() / "base.git"
    if not (path / "HEAD").exists():
        path.mkdir(parents=True, exist_ok=True)
        gitutil.run(path, "init", "--bare", "-q", ".")
    return git.Repo(str(path))


def _ref(source: str, commit: str) -> str:
    return f"refs/mla-port/{source}/{commit}"


def _lookup(repo: git.Repo, ref: str) -> Base | None:
    try:
        sha = gitutil.run(repo, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
        tree = gitutil.run(repo, "rev-parse", f"{ref}^{{tree}}")
    except git.GitCommandError:
        return None
    return Base(sha=sha, tree=tree, source=ref.split("/")[2], ref=ref)


def cached(pin: Pin, source: str) -> Base | None:
    return _lookup(cache_repo(), _ref(source, pin.commit))


def _is_network_error(text: str) -> bool:
    low = text.lower()
    return any(m in low for m in _NETWORK_MARKERS)


# ---------------------------------------------------------------------------- git source
def fetch_git(pin: Pin, url: str | None = None) -> Base:
    """Shallow-fetch exactly pin.commit from `url` (default pin.url; a local path works)."""
    repo = cache_repo()
    ref = _ref("git", pin.commit)
    hit = _lookup(repo, ref)
    if hit:
        return hit
    url = url or pin.url
    if os.path.isdir(url):
        url = str(Path(url).resolve())
    try:
        gitutil.run(repo, "fetch", "--depth", "1", "--no-tags", "-q", url,
                    f"+{pin.commit}:{ref}",
                    env={"GIT_HTTP_LOW_SPEED_LIMIT": "1000", "GIT_HTTP_LOW_SPEED_TIME": "30"})
    except git.GitCommandError as err:
        text = gitutil.error_text(err)
        if _is_network_error(text):
            raise NetworkError(f"cannot reach {url}: {text}",
                               "check the network, pass --git-url PATH of a local llama.cpp "
                               "clone, or use --source sdist") from None
        raise ObtainError(f"commit {pin.commit} could not be fetched from {url}: {text}",
                          "the pinned commit is not in that repository: check --git-url, or "
                          "fetch it there first (`git fetch origin "
                          f"{pin.commit}`)") from None
    base = _lookup(repo, ref)
    if base is None or base.sha != pin.commit:
        got = base.sha if base else "nothing"
        gitutil.run(repo, "update-ref", "-d", ref)
        raise ObtainError(f"{url} gave commit {got}, not the pinned {pin.commit}",
                          "the source is not the pinned upstream; check --git-url")
    return base


# -------------------------------------------------------------------------- sdist source
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sdist_archive(pin: Pin, sdist_file: Path | None = None, log=print) -> Path:
    """The verified sdist tarball: the user's file, the cache, or a pip download."""
    sd = pin.sdist
    if sd is None:
        raise ObtainError(f"the pin {pin.short} names no sdist",
                          "use --source git, or pin a commit that a PyPI sdist vendors")
    if sdist_file is not None:
        path = Path(sdist_file)
        if not path.is_file():
            raise ObtainError(f"--sdist-file {path} does not exist", "pass the downloaded tarball")
        _verify_sha(path, sd.sha256, remove=False)
        return path
    dest = cache_dir() / "sdist"
    path = dest / sd.filename
    if path.is_file():
        _verify_sha(path, sd.sha256, remove=True)
        return path
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmp:
        log(f"downloading {sd.package}=={sd.version} sdist with pip (once; cached in {dest})")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--quiet", "-d", tmp, f"{sd.package}=={sd.version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / sd.filename
        if not got.is_file():
            text = (proc.stderr or "") + (proc.stdout or "")
            last = text.strip().splitlines()[-1] if text.strip() else f"exit {proc.returncode}"
            cls = NetworkError if _is_network_error(text) else ObtainError
            raise cls(f"pip could not download {sd.package}=={sd.version}: {last}",
                      "check that PyPI is reachable, or download the file elsewhere and pass "
                      "--sdist-file PATH")
        _verify_sha(got, sd.sha256, remove=True)
        os.replace(got, path)
    return path


def _verify_sha(path: Path, expected: str, remove: bool) -> None:
    got = _sha256(path)
    if got != expected:
        if remove:
            path.unlink()
        raise ObtainError(f"sha256 mismatch for {path.name}: expected {expected}, got {got}"
                          + (" (the bad file was removed)" if remove else ""),
                          "the file is not the pinned sdist: download it again, or fix the "
                          "pin only if upstream re-published on purpose")


def import_sdist(pin: Pin, sdist_file: Path | None = None, log=print) -> Base:
    """Import the sdist's vendored tree as one commit in the cache repo; verify its tree."""
    repo = cache_repo()
    ref = _ref("sdist", pin.commit)
    hit = _lookup(repo, ref)
    if hit:
        return hit
    archive = sdist_archive(pin, sdist_file, log)
    sd = pin.sdist
    with tempfile.TemporaryDirectory(prefix="llamacpp-mla-port-sdist-") as tmp:
        root = Path(tmp) / "tree"
        prefix = f"{sd.filename.removesuffix('.tar.gz')}/{sd.subdir}/"
        with tarfile.open(archive, "r:gz") as tar:
            members = []
            for m in tar.getmembers():
                if not m.name.startswith(prefix):
                    continue
                rel = m.name[len(prefix):]
                if rel == ".git":   # the submodule pointer of the sdist's own repo
                    continue
                m.name = rel
                members.append(m)
            if not members:
                raise ObtainError(f"{archive.name} has no {sd.subdir}/",
                                  "the pin's sdist.subdir is wrong for this archive")
            root.mkdir()
            tar.extractall(root, members=members, filter="data")
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(root),
               "GIT_DIR": repo.git_dir}
        gitutil.run(repo, "add", "-A", "-f", ".", env=env)
        tree = gitutil.run(repo, "write-tree", env=env)
        if tree != sd.tree:
            raise ObtainError(f"the sdist tree is {tree}, the pin expects {sd.tree}",
                              "the archive passed its checksum but imports differently: "
                              "report a bug (git version?)")
        message = (f"llama.cpp {pin.commit} ({pin.tag}) from the PyPI sdist\n\n"
                   f"Imported from {sd.filename} ({sd.subdir}/), sha256 {sd.sha256}.\n\n"
                   f"Upstream-Commit: {pin.commit}\n")
        sha = gitutil.run(repo, "commit-tree", tree, "-m", message, env=IMPORT_IDENTITY)
        gitutil.run(repo, "update-ref", ref, sha)
    return _lookup(repo, ref)


# ------------------------------------------------------------------------------- obtain
def obtain(pin: Pin, source: str = "auto", git_url: str | None = None,
           sdist_file: Path | None = None, log=print) -> Base:
    if source not in SOURCES:
        raise ObtainError(f"unknown source {source!r}", f"use one of {', '.join(SOURCES)}")
    if source == "git":
        return _checked_git(pin, git_url, log)
    if source == "sdist":
        return import_sdist(pin, sdist_file, log)
    # auto: the cache first (offline), then git, then the sdist on a network failure
    hit = cached(pin, "git") or (None if git_url else cached(pin, "sdist"))
    if hit:
        return hit
    try:
        return _checked_git(pin, git_url, log)
    except NetworkError as err:
        if pin.sdist is None:
            raise
        log(f"git source unreachable ({err.message}); falling back to the PyPI sdist "
            f"{pin.sdist.package}=={pin.sdist.version}")
        return import_sdist(pin, sdist_file, log)


def _checked_git(pin: Pin, git_url: str | None, log) -> Base:
    base = fetch_git(pin, git_url)
    if pin.sdist is not None and base.tree != pin.sdist.tree:
        log(f"note: the git tree {base.tree[:12]} differs from the sdist tree "
            f"{pin.sdist.tree[:12]} recorded in the pin; patches apply by blob id and are "
            "checked when applied")
    return base
