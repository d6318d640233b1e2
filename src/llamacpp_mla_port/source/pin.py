"""The pinned upstream base: one data file, templates/pin.toml.

A pin names its tree by an upstream commit id, or, where only a release tag and a PyPI sdist
are known, by the tag and the sdist's git tree id: the tree id is the content itself, so a
git fetch of the tag is checked against it as a commit would be."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from llamacpp_mla_port.errors import PinError

SHA1 = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Sdist:
    package: str
    version: str
    filename: str
    sha256: str
    size: int
    subdir: str       # the llama.cpp folder inside the archive ("": found on import)
    tree: str | None  # git tree id of `subdir` imported as-is (None: not recorded)
    #: (path, blob id in `tree`) of each file the packager's own patches change: upstream's tag
    #: has other contents there, and the series must touch none of them
    packager_files: tuple[tuple[str, str], ...] = ()

    @property
    def packager_paths(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.packager_files)


def packager_files(table: dict, where: str) -> tuple[tuple[str, str], ...]:
    """A table's `packager_files` ({path = blob id}), checked; () when it has none."""
    files = table.get("packager_files", {})
    if not isinstance(files, dict) or not all(isinstance(b, str) and SHA1.match(b) for b in files.values()):
        raise PinError(f"{where}: packager_files must map each path to its 40-hex blob id",
                       "write it as packager_files = { \"path/in/tree\" = \"<blob id>\" } "
                       "(`git ls-tree <tree> -- PATH` gives the id)")
    return tuple(sorted(files.items()))


@dataclass(frozen=True)
class Pin:
    url: str
    commit: str | None    # None: the tag's commit id is not recorded; sdist.tree names the tree
    tag: str
    sdist: Sdist | None
    path: Path

    @property
    def short(self) -> str:
        name = self.commit[:12] if self.commit else f"tree {(self.tree or '?')[:12]}"
        return f"{self.tag} ({name})"

    @property
    def tree(self) -> str | None:
        return self.sdist.tree if self.sdist else None

    @property
    def ident(self) -> str:
        """What names the base in cache refs: the commit id, else the tag and its tree id."""
        return self.commit or f"{self.tag}-{self.tree}"

    @property
    def upstream_ref(self) -> str:
        """What to fetch from the upstream URL: the commit, else the tag."""
        return self.commit or f"refs/tags/{self.tag}"

    def with_commit(self, commit: str, url: str | None = None) -> "Pin":
        """Another commit (e.g. `--commit`): the sdist no longer describes it."""
        if not SHA1.match(commit):
            raise PinError(f"--commit {commit!r} is not a full 40-hex commit id",
                           "pass the full id, e.g. from `git rev-parse <ref>`")
        if commit == self.commit and url in (None, self.url):
            return self
        return replace(self, commit=commit, tag=commit[:12], url=url or self.url, sdist=None)


def _need(table: dict, key: str, where: str, path: Path):
    if key not in table:
        raise PinError(f"{path}: [{where}] has no `{key}`",
                       "restore templates/pin.toml from git (`git checkout templates/pin.toml`)")
    return table[key]


def load_pin(path: Path) -> Pin:
    """The pin of `path` (a checkout's templates/pin.toml: project.Places.pin_file)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PinError(f"pin file {path} is missing",
                       "restore it from git (`git checkout templates/pin.toml`)") from None
    except tomllib.TOMLDecodeError as err:
        raise PinError(f"pin file {path} is not valid TOML: {err}", "fix the syntax or restore it from git") from None
    up = _need(data, "upstream", "upstream", path) if "upstream" in data else None
    if not isinstance(up, dict):
        raise PinError(f"{path}: missing [upstream] table", "restore templates/pin.toml from git")
    commit = str(up["commit"]) if "commit" in up else None
    if commit is not None and not SHA1.match(commit):
        raise PinError(f"{path}: upstream.commit {commit!r} is not a full 40-hex commit id",
                       "pins are full commit ids, never branches; leave `commit` out to pin a tag by its sdist tree id")
    sdist = None
    if "sdist" in data:
        s = data["sdist"]
        sdist = Sdist(**{k: _need(s, k, "sdist", path) for k in
                         ("package", "version", "filename", "sha256", "size", "subdir", "tree")},
                      packager_files=packager_files(s, f"{path} [sdist]"))
        if not SHA256.match(sdist.sha256):
            raise PinError(f"{path}: sdist.sha256 is not a 64-hex digest", "fix the pin")
    if commit is None and (sdist is None or not SHA1.match(str(sdist.tree))):
        raise PinError(f"{path}: [upstream] has no `commit` and no [sdist] tree id names the tree",
                       "add upstream.commit, or the [sdist] table (with `tree`) of the release")
    return Pin(url=str(_need(up, "url", "upstream", path)), commit=commit,
               tag=str(_need(up, "tag", "upstream", path)), sdist=sdist, path=path)
