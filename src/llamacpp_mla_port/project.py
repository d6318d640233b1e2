"""The project checkout the tool acts on: found from the current directory, like git.

A checkout is a folder holding `templates/pin.toml` and `templates/series/`. The tool never
takes it from where the package is installed: one installed CLI serves every checkout, and
acts on the one you stand in (or the one `--project DIR` / `$MLA_PORT_PROJECT` names).
Verbs that only read files you name (doctor, draft-logits with explicit paths) need none.

    current()            the selected checkout (raises ProjectError outside one)
    select(path)         what `--project DIR` does (None: back to discovery)
    find(start)          the nearest checkout at or above `start`, or None
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llamacpp_mla_port.errors import ProjectError

#: the one environment prefix; OLD_ENV_PREFIX names are still read (after the new ones)
ENV_PREFIX, OLD_ENV_PREFIX = "MLA_PORT_", "LLAMACPP_MLA_PORT_"


def env(name: str, default: str | None = None) -> str | None:
    """$MLA_PORT_<name>, else the old $LLAMACPP_MLA_PORT_<name>, else `default` (empty = unset)."""
    return os.environ.get(ENV_PREFIX + name) or os.environ.get(OLD_ENV_PREFIX + name) or default


ENV_VAR = "MLA_PORT_PROJECT"
#: what makes a folder a checkout of this project
MARKERS = ("templates/pin.toml", "templates/series")


@dataclass(frozen=True)
class Project:
    root: Path

    @property
    def templates_dir(self) -> Path:
        return self.root / "templates"

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def pin_file(self) -> Path:
        return self.templates_dir / "pin.toml"

    @property
    def work_dir(self) -> Path:
        """The tool-owned work dir: $MLA_PORT_WORK_DIR, else <root>/work."""
        env = os.environ.get("MLA_PORT_WORK_DIR")
        return Path(env) if env else self.root / "work"


_selected: Path | None = None


def is_checkout(path: Path) -> bool:
    return all((Path(path) / m).exists() for m in MARKERS)


def find(start: Path | None = None) -> Path | None:
    """The nearest folder at or above `start` (default: the current directory) that is a checkout."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if is_checkout(folder):
            return folder
    return None


def select(path: Path | str | None) -> None:
    """Use `path` as the checkout from now on (`--project DIR`); None goes back to discovery."""
    global _selected
    if path is None:
        _selected = None
        return
    path = Path(path).resolve()
    if not is_checkout(path):
        raise ProjectError(f"{path} is not a llamacpp-mla-port checkout (no {' and '.join(MARKERS)})",
                           "pass the folder that holds templates/ and patches/ (the repository root)")
    _selected = path


def resolve_dirs(templates_dir: Path | None, patches_dir: Path | None) -> tuple[Path, Path]:
    """(templates_dir, patches_dir): the ones given, the current checkout's for those left None."""
    if templates_dir is None or patches_dir is None:
        here = current()
        templates_dir = here.templates_dir if templates_dir is None else templates_dir
        patches_dir = here.patches_dir if patches_dir is None else patches_dir
    # absolute: git commands run in the work tree, where a relative path names something else
    return Path(templates_dir).absolute(), Path(patches_dir).absolute()


def current() -> Project:
    """The checkout to act on: --project, else $MLA_PORT_PROJECT, else found from the cwd upward."""
    if _selected is not None:
        return Project(_selected)
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env).resolve()
        if not is_checkout(path):
            raise ProjectError(f"${ENV_VAR}={env} is not a llamacpp-mla-port checkout",
                               f"unset {ENV_VAR} or point it at the repository root")
        return Project(path)
    root = find()
    if root is None:
        raise ProjectError(
            f"not inside a llamacpp-mla-port checkout ({Path.cwd()} and its parents hold no "
            f"{' and '.join(MARKERS)})",
            "cd into your checkout of the project, or pass --project DIR")
    return Project(root)
