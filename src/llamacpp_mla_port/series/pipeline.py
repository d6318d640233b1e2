"""The engine pipeline: obtain -> render -> commit -> export -> apply.

Each step is its own module; this one only strings them together for the verbs
`obtain`, `patch` and `check` (and for tests and the proof, which call it directly).
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llamacpp_mla_port.errors import SeriesError
from llamacpp_mla_port.process import git
from llamacpp_mla_port.project import Places
from llamacpp_mla_port.series import gitseries as series_mod
from llamacpp_mla_port.series.render import RenderedCommit, render_series
from llamacpp_mla_port.series.spec import Series, load_series
from llamacpp_mla_port.series.worktree import Workspace, apply_series
from llamacpp_mla_port.source.obtain import Base, cache_repo, obtain
from llamacpp_mla_port.source.pin import Pin, load_pin


@dataclass
class Options:
    places: Places                      # templates/, patches/ and the work dir (project.Places)
    source: str = "auto"
    git_url: str | None = None
    sdist_file: Path | None = None
    commit: str | None = None

    def with_flags(self, **flags) -> "Options":
        """These options with the given place flags on top of their places."""
        return dataclasses.replace(self, places=self.places.with_flags(**flags))

    def pin(self) -> Pin:
        pin = load_pin(self.places.pin_file)
        if self.commit:
            pin = pin.with_commit(self.commit)
        return pin

    def workspace(self) -> Workspace:
        return Workspace(self.places.work_dir)


@dataclass
class Rendered:
    pin: Pin
    series: Series
    base: Base
    repo: git.Repo
    commits: list[RenderedCommit]
    shas: list[str]

    @property
    def head(self) -> str:
        return self.shas[-1]


def prepare(opts: Options, log=print) -> tuple[Workspace, git.Repo, Pin, Base]:
    pin = opts.pin()
    base = obtain(pin, opts.source, opts.git_url, opts.sdist_file, log)
    ws = opts.workspace()
    repo = ws.ensure(base, pin.commit or pin.tag, log)
    return ws, repo, pin, base


def render(opts: Options, repo: git.Repo, pin: Pin, base: Base) -> Rendered:
    """Render every commit in memory and as commit objects; writes no files."""
    series = load_series(opts.places.templates_dir)
    ours = sorted(set(pin.sdist.packager_paths if pin.sdist else ()) & series.files())
    if ours:
        raise SeriesError(f"the series changes {', '.join(ours)}, which the pinned tree's packager "
                          f"changed ({pin.sdist.package} {pin.sdist.version}): upstream's tag has "
                          "other contents there", "pin a tree whose packager leaves that file as "
                          "upstream has it (templates/pin.toml), or drop the change")
    commits = render_series(series, lambda p: git.read_blob(repo, base.sha, p), base_label=pin.short,
                            extra_vars={"pin": pin})
    shas = series_mod.commit_rendered(repo, base.sha, commits, series)
    return Rendered(pin, series, base, repo, commits, shas)


def export_fresh(r: Rendered, out_dir: Path) -> list[str]:
    return series_mod.export(r.repo, r.base.sha, r.head, out_dir, r.pin, r.series, [c.slug for c in r.commits])


def patch(opts: Options, log=print) -> dict:
    """`make patch`: the pinned tree with the series applied, and patches/ up to date."""
    ws, repo, pin, base = prepare(opts, log)
    ws.require_clean(repo)
    r = render(opts, repo, pin, base)
    with tempfile.TemporaryDirectory(prefix="mla-port-export-") as tmp:
        names = export_fresh(r, Path(tmp))
        changed = series_mod.install(Path(tmp), opts.places.patches_dir)
    log(f"{opts.places.patches_dir}: {len(names)} patches, {'updated' if changed else 'unchanged'}")
    series_mod.verify_manifest(opts.places.patches_dir)
    state = ws.state()
    head_tree = git.run(repo, "rev-parse", f"{r.head}^{{tree}}")
    current = git.run(repo, "rev-parse", "HEAD")
    if state.get("status") == "applied" and state.get("head") == current and \
            _commits(repo, base.sha, "HEAD") == _commits(repo, base.sha, r.head):
        log(f"{ws.tree}: series already applied on branch {r.series.branch}")
    else:
        touched = {p for c in r.commits for p in c.files}
        apply_series(ws, repo, base.sha, r.series, series_mod.read_series(opts.places.patches_dir), touched, head_tree)
        log(f"{ws.tree}: {len(names)} commits applied with `git am -3` on branch {r.series.branch}")
    return {"tree": ws.tree, "patches": names, "changed": changed, "head": r.head}


def _commits(repo: git.Repo, base: str, head: str) -> str:
    """Each commit's tree and message, base..head: a series that only reworded a commit differs."""
    return git.run(repo, "log", "--format=%T%n%B%x00", f"{base}..{head}")


def check(opts: Options, log=print) -> str:
    """The drift between checked-in patches/ and a fresh render ('' when none). Read-only:
    it renders in the cache repository and never creates or moves the work tree."""
    pin = opts.pin()
    base = obtain(pin, opts.source, opts.git_url, opts.sdist_file, log)
    r = render(opts, cache_repo(), pin, base)
    with tempfile.TemporaryDirectory(prefix="mla-port-check-") as tmp:
        export_fresh(r, Path(tmp))
        return series_mod.drift(Path(tmp), opts.places.patches_dir)
