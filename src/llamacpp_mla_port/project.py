"""Every place the tool reads or writes, decided here and nowhere else.

The checkout (a folder holding `templates/pin.toml` and `templates/series/`) is found from
the current directory like git, never from where the package is installed; `--project DIR`
/ `$MLA_PORT_PROJECT` name another. `Places` resolves the rest from it: for each place the
verb's flag, else the environment (`env()`: MLA_PORT_*, the old LLAMACPP_MLA_PORT_* still
read), else the checkout's default. `cli.main` builds one per run (`Places.of`) and hands it
to the verb; nothing here holds run state.

    Places.of(flags, project)   the run's places, from the verb's parsed flags (cli.main)
    places.with_flags(**flags)  the same with these flags on top (a sub-run, library callers)
    places.build / .owned       a `Build` (tree, build dir, bin(name), lib_dir)
    checkout_root(project)      the checkout (raises ProjectError outside one)
    find(start)                 the nearest checkout at or above `start`, or None
    base_cache(), sdist_cache(), proof_bin_dir()   the per-user caches (environment only)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from llamacpp_mla_port.errors import ProjectError, WorkTreeError

#: the one environment prefix; OLD_ENV_PREFIX names are still read (after the new ones)
ENV_PREFIX, OLD_ENV_PREFIX = "MLA_PORT_", "LLAMACPP_MLA_PORT_"


def env(name: str, default: str | None = None) -> str | None:
    """$MLA_PORT_<name>, else the old $LLAMACPP_MLA_PORT_<name>, else `default` (empty = unset)."""
    return os.environ.get(ENV_PREFIX + name) or os.environ.get(OLD_ENV_PREFIX + name) or default


ENV_VAR = "MLA_PORT_PROJECT"
#: what makes a folder a checkout of this project
MARKERS = ("templates/pin.toml", "templates/series")


def is_checkout(path: Path) -> bool:
    return all((Path(path) / m).exists() for m in MARKERS)


def find(start: Path | None = None) -> Path | None:
    """The nearest folder at or above `start` (default: the current directory) that is a checkout."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if is_checkout(folder):
            return folder
    return None


def checkout_root(given: Path | str | None = None) -> Path:
    """The checkout to act on: `given` (--project), else $MLA_PORT_PROJECT, else found from
    the cwd upward."""
    if given is not None:
        path = Path(given).resolve()
        if not is_checkout(path):
            raise ProjectError(f"{path} is not a llamacpp-mla-port checkout (no {' and '.join(MARKERS)})",
                               "pass the folder that holds templates/ and patches/ (the repository root)")
        return path
    env_value = os.environ.get(ENV_VAR)
    if env_value:
        path = Path(env_value).resolve()
        if not is_checkout(path):
            raise ProjectError(f"${ENV_VAR}={env_value} is not a llamacpp-mla-port checkout",
                               f"unset {ENV_VAR} or point it at the repository root")
        return path
    root = find()
    if root is None:
        raise ProjectError(
            f"not inside a llamacpp-mla-port checkout ({Path.cwd()} and its parents hold no "
            f"{' and '.join(MARKERS)})",
            "cd into your checkout of the project, or pass --project DIR")
    return root


# ------------------------------------------------------------------------------ the places
#: the flags that name a place (argparse dests), shared by the verbs (commands/common.py)
PLACE_FLAGS = ("templates_dir", "patches_dir", "work_dir", "tree", "build_dir", "canary_dir")


def tree_in(work_dir: Path) -> Path:
    """The llama.cpp work tree inside a tool-owned work dir (work/, a canary dir, ...)."""
    return Path(work_dir) / "llama.cpp"


def build_in(work_dir: Path) -> Path:
    """Its CMake build dir, beside it."""
    return Path(work_dir) / "build"


def _user_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"))


# ------------------------------------------------------------------ the caches (per user)
def cache_dir() -> Path:
    """$MLA_PORT_CACHE (or the old $LLAMACPP_MLA_PORT_CACHE), else $XDG_CACHE_HOME/llamacpp-mla-port."""
    given = env("CACHE")
    return Path(given) if given else _user_cache() / "llamacpp-mla-port"


def base_cache() -> Path:
    """The obtain cache: a bare git repo holding every base fetched or imported."""
    return cache_dir() / "base.git"


def sdist_cache() -> Path:
    return cache_dir() / "sdist"


def proof_bin_dir() -> Path:
    """The compiled proof programs: $MLA_PORT_PROOF_BIN, else
    $XDG_CACHE_HOME/llamacpp-mla-port/proof-bin (not under $MLA_PORT_CACHE, as before)."""
    given = env("PROOF_BIN")
    return Path(given) if given else _user_cache() / "llamacpp-mla-port" / "proof-bin"


def bin_dir(build_dir: Path) -> Path:
    """Where a llama.cpp CMake build dir puts its programs."""
    return Path(build_dir) / "bin"


def program(build_dir: Path, name: str) -> Path:
    """The program `name` of the build dir `build_dir` (Build.bin, for a bare build dir)."""
    return bin_dir(build_dir) / name


def lib_dirs(build_dir: Path) -> tuple[Path, ...]:
    """Where a build dir's shared libraries land (ggml's under ggml/src, the rest in bin/)."""
    return (Path(build_dir) / "ggml" / "src", bin_dir(build_dir))


@dataclass(frozen=True)
class Build:
    """A llama.cpp tree and its CMake build dir: where its programs and libraries are."""

    tree: Path
    dir: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "tree", Path(self.tree))
        object.__setattr__(self, "dir", Path(self.dir))

    def bin(self, name: str) -> Path:
        """A program of the build (bin/<name>)."""
        return program(self.dir, name)

    def require_tree(self) -> "Build":
        """This build, refused when no patched llama.cpp tree is at `tree`."""
        if not (self.tree / "include" / "llama.h").is_file():
            raise WorkTreeError(f"no patched llama.cpp tree at {self.tree}",
                                "run `make patch` and `make build` first, or pass --tree/--build-dir")
        return self


@dataclass(frozen=True)
class Places:
    """The places of one run. `flags` holds what the verb's flags (or a library caller) gave;
    each property applies flag > environment > checkout default when asked, so the checkout
    is looked up only for a place under it (verbs given explicit paths need none)."""

    flags: Mapping[str, Path] = field(default_factory=dict)
    project: Path | None = None         # --project (None: $MLA_PORT_PROJECT, else found from the cwd)

    @classmethod
    def of(cls, flags: Mapping[str, object], project: Path | str | None = None) -> "Places":
        """The run's places, from the verb's parsed flags (`cli.main`, once per run): the
        place flags among them (PLACE_FLAGS) that were given."""
        return cls({k: Path(v) for k in PLACE_FLAGS if (v := flags.get(k)) is not None},
                   Path(project) if project is not None else None)

    def with_flags(self, **flags: Path | str | None) -> "Places":
        """These places with the given (non-None) flags on top."""
        given = {k: Path(v) for k, v in flags.items() if v is not None}
        unknown = set(given) - set(PLACE_FLAGS)
        if unknown:
            raise TypeError(f"not a place: {', '.join(sorted(unknown))}")
        return replace(self, flags={**self.flags, **given}) if given else self

    def _flag(self, name: str) -> Path | None:
        return self.flags.get(name)

    # ---------------------------------------------------------------- the checkout
    @property
    def root(self) -> Path:
        return checkout_root(self.project)

    @property
    def templates_dir(self) -> Path:
        # absolute: git commands run in the work tree, where a relative path names something else
        return Path(self._flag("templates_dir") or self.root / "templates").absolute()

    @property
    def patches_dir(self) -> Path:
        return Path(self._flag("patches_dir") or self.root / "patches").absolute()

    @property
    def pin_file(self) -> Path:
        return self.templates_dir / "pin.toml"

    # ---------------------------------------------------------------- the work dir
    @property
    def work_dir(self) -> Path:
        """The tool-owned work dir: --work-dir, else $MLA_PORT_WORK_DIR, else <root>/work."""
        given = self._flag("work_dir") or env("WORK_DIR")
        return Path(given) if given else self.root / "work"

    @property
    def work_tree(self) -> Path:
        """What `patch` writes: the work dir's llama.cpp/ (never redirected by the environment)."""
        return tree_in(self.work_dir)

    @property
    def work_build(self) -> Path:
        return build_in(self.work_dir)

    @property
    def owned_tree(self) -> Path:
        """What `build` compiles: --tree, else the work tree ($MLA_PORT_TREE redirects only reads)."""
        return Path(self._flag("tree") or self.work_tree)

    @property
    def owned_build(self) -> Path:
        return Path(self._flag("build_dir") or self.work_build)

    # ---------------------------------------------------------------- what the proof reads
    @property
    def tree(self) -> Path:
        """The patched tree the proof and the tree-reading verbs use: --tree, else the
        --work-dir's, else $MLA_PORT_TREE, else the work tree."""
        return self._read("tree", "TREE", tree_in)

    @property
    def build_dir(self) -> Path:
        """Its build dir: --build-dir, else the --work-dir's, else $MLA_PORT_BUILD, else the work build."""
        return self._read("build_dir", "BUILD", build_in)

    @property
    def build(self) -> Build:
        """The patched tree and build the proof and the tree-reading verbs use (tree, build_dir)."""
        return Build(self.tree, self.build_dir)

    @property
    def owned(self) -> Build:
        """What `build` compiles (owned_tree, owned_build)."""
        return Build(self.owned_tree, self.owned_build)

    def _read(self, flag: str, env_name: str, inside) -> Path:
        if self._flag(flag):
            return Path(self._flag(flag))
        given = None if self._flag("work_dir") else env(env_name)   # an explicit work dir beats the env
        # the work dir (and so the checkout) only when needed: explicit paths need no checkout
        return Path(given) if given else inside(self.work_dir)

    # ---------------------------------------------------------------- other dirs
    @property
    def canary_dir(self) -> Path:
        """The canary's own work dir: --canary-dir, else $MLA_PORT_CANARY_DIR, else <root>/work-canary."""
        given = self._flag("canary_dir") or env("CANARY_DIR")
        return Path(given) if given else self.root / "work-canary"

    @property
    def canary_patches(self) -> Path:
        """The series the canary rendered at the new upstream."""
        return self.canary_dir / "patches"

    @property
    def canary_stacks_dir(self) -> Path:
        """The canary's checkout (llama.cpp/) and build (build/) of each PR stack alone."""
        return self.canary_dir / "stacks"

    @property
    def canary_proof_dir(self) -> Path:
        """The canary's run of the proof (prove_into's folder)."""
        return self.canary_dir / "proof"

    @property
    def bench_dir(self) -> Path:
        return self.work_dir / "bench"

    @property
    def draft_length_dir(self) -> Path:
        return self.work_dir / "draft-length"

    @property
    def bench_rpc_dir(self) -> Path:
        return self.work_dir / "bench-rpc"

    @property
    def bench_auto_dir(self) -> Path:
        return self.work_dir / "bench-auto"

    @property
    def pr_dir(self) -> Path:
        """make pr: one folder per PR stack, PLAN.md, the per-commit checkout (llama.cpp/) and build (build/)."""
        return self.work_dir / "pr"

    @property
    def pr_proof_dir(self) -> Path:
        """make pr's run of the proof on the series head: fixtures, runs, proof.log, smoke.json."""
        return self.pr_dir / "proof"

    def pr_stack_dir(self, stack: str) -> Path:
        """make pr's folder of one PR stack."""
        return self.pr_dir / stack

    @property
    def evidence_dir(self) -> Path:
        """make pr's evidence folder for the whole series (--evidence overrides it)."""
        return self.work_dir / "evidence"

    @property
    def upstream_bench_dir(self) -> Path:
        """upstream-bench: the standard-shape models, one SQLite file per stack and build, reports."""
        return self.work_dir / "upstream-bench"

    @property
    def harness_diff_dir(self) -> Path:
        """The base-against-patched runs of upstream's tests: base/, one folder per stack, reports."""
        return self.work_dir / "harness-diff"

    @property
    def device_bundle(self) -> Path:
        """<root>/work/device-bundle: under the checkout whatever the work dir, because the
        device call carries checkout-relative paths (device/bundle.DEVICE_CALL)."""
        return self.root / "work" / "device-bundle"

    @property
    def device_dry_out(self) -> Path:
        return self.root / "work" / "device-check"
