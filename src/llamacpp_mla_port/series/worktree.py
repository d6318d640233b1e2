"""The tool-owned work tree: <work-dir>/llama.cpp, a git repo the tool created.

The tool only ever touches this directory (and its build dir beside it). It records what
it did in .git/llamacpp-mla-port.json; a tree it did not create, or one with changes it did
not make, is refused with a message saying how to proceed. Every step can be interrupted
and simply rerun.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from llamacpp_mla_port import project
from llamacpp_mla_port.process import git
from llamacpp_mla_port.errors import PatchApplyError, SeriesError, WorkTreeError
from llamacpp_mla_port.series import gitseries
from llamacpp_mla_port.series.spec import Series
from llamacpp_mla_port.source.obtain import Base, cache_repo
from llamacpp_mla_port.jsonfile import write_json

STATE_FILE = "llamacpp-mla-port.json"
BASE_BRANCH = "mla-port-base"


@dataclass
class Workspace:
    work_dir: Path

    def __post_init__(self) -> None:
        # absolute: git runs in several directories (the clone in the work dir's parent), so a
        # relative --work-dir / --canary-dir would name a different place for each of them
        object.__setattr__(self, "work_dir", Path(self.work_dir).absolute())

    @property
    def tree(self) -> Path:
        return project.tree_in(self.work_dir)

    @property
    def build_dir(self) -> Path:
        return project.build_in(self.work_dir)

    @property
    def state_path(self) -> Path:
        return self.tree / ".git" / STATE_FILE

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        try:
            return json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError:
            raise WorkTreeError(f"{self.state_path} is corrupt",
                                f"delete {self.tree} (`make clean-work`) and rerun") from None

    def save_state(self, **updates) -> None:
        write_json(self.state_path, {**self.state(), **updates}, sort_keys=True)

    def repo(self) -> git.Repo:
        return git.Repo(str(self.tree))

    # ------------------------------------------------------------------ create
    def ensure(self, base: Base, upstream_commit: str, log=print) -> git.Repo:
        """A tool-owned work tree whose base branch is `base`; created if absent."""
        if not self.tree.exists():
            self._create(base, upstream_commit, log)
        elif not self.state_path.is_file():
            raise WorkTreeError(f"{self.tree} exists but was not created by llamacpp-mla-port",
                                "move it away, or pass --work-dir DIR (MLA_PORT_WORK_DIR) to use another place")
        repo = self.repo()
        state = self.state()
        if state.get("base") != base.sha:
            # a new pin (or the other source): bring its commit in, keep the tree otherwise
            self.require_clean(repo)
            self._fetch_base(repo, base)
            # clean and tool-made: leave the old series branch, stand on the new base
            git.run(repo, "checkout", "-q", "-f", "-B", BASE_BRANCH, base.sha)
            self.save_state(base=base.sha, upstream_commit=upstream_commit,
                            source=base.source, tree=base.tree, head=None, status="base")
            log(f"work tree {self.tree}: base moved to {upstream_commit[:12]} ({base.source})")
        return repo

    def _create(self, base: Base, upstream_commit: str, log) -> None:
        # built under a name of this run's own, renamed into place when whole: a git that an
        # interrupted earlier run left behind (its own session) may still write into its folder
        for stale in self.tree.parent.glob(f".{self.tree.name}.partial*"):
            shutil.rmtree(stale, ignore_errors=True)
        partial = self.tree.with_name(f".{self.tree.name}.partial-{os.getpid()}")
        partial.parent.mkdir(parents=True, exist_ok=True)
        cache = cache_repo()
        if (Path(cache.git_dir) / "shallow").exists():
            # a git-source cache is shallow (depth-1 fetches): `clone --local` cannot copy a
            # shallow repository, a fetch of the one commit can
            partial.mkdir()
            git.run(partial, "init", "-q", ".")
            self._fetch_base(git.Repo(str(partial)), base)
        else:
            # --local hard-links the cache's objects (a copy across filesystems): fast, and
            # the work tree stays valid if the cache is deleted later
            git.run(partial.parent, "clone", "-q", "--local", "--no-checkout", cache.git_dir, str(partial))
            git.run(partial, "remote", "remove", "origin")
            git.run(partial, "update-ref", "refs/mla-port/base", base.sha)
        git.run(partial, "checkout", "-q", "-b", BASE_BRANCH, base.sha)
        write_json(partial / ".git" / STATE_FILE, {
            "base": base.sha, "upstream_commit": upstream_commit, "source": base.source,
            "tree": base.tree, "head": None, "status": "base"}, sort_keys=True)
        os.replace(partial, self.tree)
        log(f"work tree {self.tree}: llama.cpp {upstream_commit[:12]} from {base.source}")

    @staticmethod
    def _fetch_base(repo: git.Repo, base: Base) -> None:
        cache = cache_repo()
        depth = ["--depth", "1"] if (Path(cache.git_dir) / "shallow").exists() else []
        git.run(repo, "fetch", "-q", "--no-tags", *depth, cache.git_dir, f"+{base.ref}:refs/mla-port/base")

    # ------------------------------------------------------------------ checks
    def _drop_stale_index_lock(self, repo: git.Repo) -> None:
        """A git killed mid-command (an interrupted earlier run) leaves .git/index.lock behind
        and every later git command refuses the tree. In the tool's own tree, a lock no live
        process can hold (none runs inside the tree) is that leftover: remove it."""
        lock = Path(repo.git_dir) / "index.lock"
        if not lock.exists():
            return
        if _process_inside(self.tree):
            raise WorkTreeError(f"{lock} exists and a process is running inside {self.tree}",
                                "wait for that git (or llamacpp-mla-port) command to finish, then rerun")
        lock.unlink(missing_ok=True)

    def require_clean(self, repo: git.Repo) -> None:
        """Refuse changes the tool did not make (edits, untracked files, user commits)."""
        state = self.state()
        self._drop_stale_index_lock(repo)
        if (Path(repo.git_dir) / "rebase-apply").exists():
            if state.get("status") == "applying":
                git.run(repo, "am", "--abort")       # our own interrupted `git am`
            else:
                raise WorkTreeError(f"{self.tree} has a `git am` in progress that the tool did not start",
                                    f"finish or abort it (`git -C {self.tree} am --abort`), then rerun")
        if state.get("status") == "applying":
            # interrupted mid-apply: whatever is there was written by the tool
            git.run(repo, "reset", "-q", "--hard")
            git.run(repo, "checkout", "-q", "-f", BASE_BRANCH)
            self.save_state(status="base", head=None)
            return
        dirty = git.run(repo, "status", "--porcelain", "--untracked-files=normal")
        if dirty:
            lines = dirty.splitlines()
            shown = "; ".join(ln.strip() for ln in lines[:8]) + (" ..." if len(lines) > 8 else "")
            raise WorkTreeError(
                f"{self.tree} has changes the tool did not make: {shown}",
                f"keep them with `git -C {self.tree} stash -u` (or commit them on a branch of "
                "your own), or discard the whole work tree with `make clean-work`; then rerun")
        head = git.run(repo, "rev-parse", "HEAD")
        known = {state.get("base"), state.get("head")}
        if head not in known:
            raise WorkTreeError(
                f"{self.tree} is at {head[:12]}, a commit the tool did not make",
                f"your work is safe on that commit: put it on a branch (`git -C {self.tree} "
                f"branch my-work {head[:12]}`), then rerun; the tool will reset its own "
                "branch only")


def require_applied(tree: Path) -> None:
    """Refuse to build a tool-owned tree whose series is not fully applied (its recorded
    state is `applying` or `base`): the build would compile a half-applied series. A tree the
    tool does not own (no state file, e.g. `--tree` on a clone of your own) is built as is."""
    ws = Workspace(Path(tree).absolute().parent)
    if Path(tree).absolute() != ws.tree or not ws.state_path.is_file():
        return
    status = ws.state().get("status")
    if status != "applied":
        raise WorkTreeError(f"{ws.tree} is not patched: its recorded state is {status!r} "
                            "(the series is not, or only partly, applied)",
                            "run `make patch` (it re-applies the series), then `make build`")


def apply_series(ws: Workspace, repo: git.Repo, base_sha: str, series: Series,
                 patches: list[Path], touched: set[str], want_tree: str) -> str:
    """The one apply transaction (`make patch` and the canary): `git am -3` the patches onto
    the base, keeping the mtimes of files that come out unchanged; return the new HEAD.

    touched files -> content stamps -> state applying -> git am -3 -> restore unchanged
    mtimes -> compare the tree with `want_tree` (the rendered series') -> state applied.
    On a rejected patch (PatchApplyError, with the hunk) or a tree that differs
    (SeriesError) the work tree is back at the base and its state says so."""
    touched = set(touched) | set(git.run(repo, "diff", "--name-only", f"{base_sha}..HEAD").split())
    kept = content_stamps(ws.tree, touched)
    ws.save_state(status="applying", head=None)
    try:
        head = gitseries.apply(repo, base_sha, series.branch, patches, series)
    except PatchApplyError:
        ws.save_state(status="base", head=None)
        raise
    restore_unchanged_mtimes(ws.tree, kept)
    got = git.run(repo, "rev-parse", f"{head}^{{tree}}")
    if got != want_tree:
        git.run(repo, "checkout", "-q", "-f", "-B", series.branch, base_sha)
        ws.save_state(status="base", head=None)
        raise SeriesError(f"the applied series gives tree {got}, the rendered one {want_tree}",
                          "patches/ is stale or edited: rerun `make patch`")
    ws.save_state(status="applied", head=head)
    return head


def content_stamps(tree: Path, paths: set[str]) -> dict[str, tuple[bytes, int]]:
    """(content, mtime) of the files a re-apply rewrites, before it rewrites them."""
    return {rel: ((tree / rel).read_bytes(), (tree / rel).stat().st_mtime_ns)
            for rel in paths if (tree / rel).is_file()}


def restore_unchanged_mtimes(tree: Path, stamps: dict[str, tuple[bytes, int]]) -> None:
    """Re-applying the series resets and rewrites every file it touches; give the files whose
    content came out the same their old mtime back, so an incremental build recompiles only
    what a template edit really changed."""
    for rel, (data, mtime) in stamps.items():
        path = tree / rel
        if path.is_file() and path.read_bytes() == data:
            os.utime(path, ns=(path.stat().st_atime_ns, mtime))


def _process_inside(tree: Path) -> bool:
    """Whether a live process (other than this one) has its working directory in `tree`: a git
    command runs there. Without /proc (not Linux) a lock younger than a minute counts as live."""
    tree = Path(tree).resolve()
    proc = Path("/proc")
    if not (proc / "self" / "cwd").exists():
        lock = tree / ".git" / "index.lock"
        try:
            return time.time() - lock.stat().st_mtime < 60
        except OSError:
            return False
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if cwd == tree or tree in cwd.parents:
            return True
    return False
