"""Newer upstream llama.cpp trees the canary can try: one data file, templates/upstreams.toml.

`resolve(onto)` turns what `rebase --onto` names into a tree to import, or None when it
names something else (a commit, a clone, a folder):
    newest              the row with the highest build number
    bNNNNN              the row with that tag
    NAME==VERSION       that row, or any other PyPI release: then its sha256 is the one PyPI
                        lists (shown, so that it can be recorded), its folder is found, and
                        its build number follows the package's rule when the table has one
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from llamacpp_mla_port.errors import PinError, PortError
from llamacpp_mla_port.source.pin import SHA1, SHA256, Sdist, packager_files

FILE = "upstreams.toml"
_SPEC = re.compile(r"^(?P<package>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+)$")
_TAG = re.compile(r"^b\d+$")
#: how a package's version gives the build number N of tag bN: its first field (N.0.0), its last
#: (YYYY.M.N)
RULES = {"version-major": 0, "version-last": -1}


@dataclass(frozen=True)
class NewerTree:
    tag: str                 # e.g. "b11434" (NAME==VERSION when the build is unknown)
    build: int | None        # llama.cpp build number
    sdist: Sdist
    recorded: bool           # a row of upstreams.toml (False: sha256 as PyPI lists it)
    build_from: str          # where the build number comes from, in words

    @property
    def spec(self) -> str:
        return f"{self.sdist.package}=={self.sdist.version}"


def _path(templates_dir: Path) -> Path:
    return Path(templates_dir) / FILE


def load(templates_dir: Path) -> tuple[dict[str, dict], list[NewerTree]]:
    """(package rules, rows) of templates/upstreams.toml; an absent file has neither."""
    path = _path(templates_dir)
    if not path.is_file():
        return {}, []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise PinError(f"{path} is not valid TOML: {err}", "fix the syntax or restore it from git") from None
    rules = data.get("packages", {})
    for name, rule in rules.items():
        if rule.get("build_number") not in (None, *RULES):
            raise PinError(f"{path}: packages.{name}.build_number is {rule.get('build_number')!r}",
                           f"use one of {', '.join(RULES)}, or leave it out")
    rows = []
    for i, row in enumerate(data.get("tree", [])):
        need = ("tag", "build", "package", "version", "filename", "sha256", "size", "subdir", "tree")
        missing = [k for k in need if k not in row]
        if missing:
            raise PinError(f"{path}: [[tree]] #{i + 1} has no {', '.join(missing)}",
                           "every row names tag, build, package, version, filename, sha256, size, subdir and tree")
        if not SHA256.match(row["sha256"]) or not SHA1.match(row["tree"]):
            raise PinError(f"{path}: [[tree]] {row['tag']}: sha256 must be 64 hex digits, tree 40",
                           "copy them from the canary's report of an unrecorded NAME==VERSION")
        sd = Sdist(package=row["package"], version=row["version"], filename=row["filename"],
                   sha256=row["sha256"], size=int(row["size"]), subdir=row["subdir"],
                   tree=row["tree"], packager_files=packager_files(row, f"{path} [[tree]] {row['tag']}"))
        derived = _build_by_rule(rules.get(sd.package, {}), sd.version)
        if derived is not None and derived != int(row["build"]):
            raise PinError(f"{path}: [[tree]] {row['tag']}: build {row['build']}, but "
                           f"{sd.package} {sd.version} is build {derived} by the package's rule",
                           "fix the row")
        rows.append(NewerTree(tag=row["tag"], build=int(row["build"]), sdist=sd, recorded=True,
                              build_from=_build_words(sd, rules[sd.package]["build_number"])
                              if derived is not None else f"recorded in {FILE}"))
    return rules, rows


def _build_by_rule(rule: dict, version: str) -> int | None:
    if rule.get("build_number") not in RULES:
        return None
    field = version.split(".")[RULES[rule["build_number"]]]
    return int(field) if field.isdigit() else None


def _build_words(sd: Sdist, rule: str) -> str:
    shape = "N.0.0" if rule == "version-major" else "YYYY.M.N"
    return f"{sd.filename}: PKG-INFO Version {sd.version} (the package ships tag bN as {shape})"


def newest(templates_dir: Path) -> NewerTree:
    _, rows = load(templates_dir)
    if not rows:
        raise PinError(f"{_path(templates_dir)} lists no newer upstream tree",
                       "add a [[tree]] row, or pass --onto NAME==VERSION / a commit / a folder")
    return max(rows, key=lambda r: r.build or -1)


def newest_published(templates_dir: Path) -> dict:
    """How far the newest known tree is: the highest build number of the table's rows and of the
    releases PyPI lists for each package with a build rule (a package PyPI does not answer for
    is named in "unreached"), with the release that shows it."""
    from llamacpp_mla_port.source.obtain import pypi_releases
    rules, rows = load(templates_dir)
    seen = [(r.build, f"{r.spec} (recorded)") for r in rows if r.build is not None]
    unreached = []
    for package, rule in sorted(rules.items()):
        try:
            versions = list(pypi_releases(package))
        except PortError:
            unreached.append(package)
            continue
        seen += [(b, f"{package}=={v} (PyPI)") for v in versions if (b := _build_by_rule(rule, v)) is not None]
    build, where = max(seen, default=(None, None))
    return {"build": build, "from": where, "unreached": unreached}


def nothing_newer(pin_tag: str, templates_dir: Path) -> str | None:
    """The one line `--onto newest` gives when upstreams.toml knows no tree newer than the pin
    (tag bN); None when it knows one, or the pin's build number is not in its tag."""
    m = _TAG.match(pin_tag)
    _, rows = load(templates_dir)
    if not m or any((r.build or -1) > int(pin_tag[1:]) for r in rows):
        return None
    return (f"canary: no upstream tree newer than the pin ({pin_tag}) is known: add a newer [[tree]] "
            f"row to templates/{FILE}, or pass --onto NAME==VERSION, a commit or a folder")


def resolve(onto: str, templates_dir: Path) -> NewerTree | None:
    """The tree `onto` names (see the module doc), or None when it names no sdist tree."""
    rules, rows = load(templates_dir)
    if onto == "newest":
        return newest(templates_dir)
    if _TAG.match(onto):
        return next((r for r in rows if r.tag == onto), None)
    m = _SPEC.match(onto)
    if not m:
        return None
    package, version = m["package"], m["version"]
    for r in rows:
        if r.sdist.package.lower() == package.lower() and r.sdist.version == version:
            return r
    from llamacpp_mla_port.source.obtain import pypi_sdist_file
    url, sha256, size = pypi_sdist_file(package, version)
    if not SHA256.match(sha256 or ""):
        raise PinError(f"PyPI lists no sha256 for the sdist of {onto}",
                       "download it, check it yourself and record a [[tree]] row")
    rule = rules.get(package, {})
    build = _build_by_rule(rule, version)
    sd = Sdist(package=package, version=version, filename=url.rsplit("/", 1)[-1], sha256=sha256,
               size=size, subdir=rule.get("subdir", ""), tree=None)
    return NewerTree(tag=f"b{build}" if build is not None else onto, build=build, sdist=sd,
                     recorded=False,
                     build_from=_build_words(sd, rule["build_number"]) if build is not None else
                     f"unknown: {package} has no build_number rule in {FILE}")


def row_text(tree: NewerTree, tree_id: str, subdir: str) -> str:
    """The [[tree]] row that records an unrecorded tree (the canary prints it)."""
    sd = tree.sdist
    return "\n".join([
        "[[tree]]", f'tag = "{tree.tag}"', f"build = {tree.build if tree.build is not None else 0}",
        f'package = "{sd.package}"', f'version = "{sd.version}"', f'filename = "{sd.filename}"',
        f'sha256 = "{sd.sha256}"', f"size = {sd.size}", f'subdir = "{subdir}"', f'tree = "{tree_id}"'])
