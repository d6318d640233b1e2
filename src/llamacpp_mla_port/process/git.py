"""Git, through the process funnel, with a fixed, user-independent configuration.

Everything the tool writes with git (imported bases, series commits, format-patch output) must
be byte-reproducible, so every command runs with the user's global and system config switched
off and the few settings that shape output pinned here. Every command is one `process.run`:
a time-out always (TIMEOUT_S, NETWORK_TIMEOUT_S for a fetch from a URL), the whole process
group killed past it, and one error type, ProcessError (its message names git's last line).
GitPython is not used here: it starts `git version` when imported and keeps `git cat-file`
processes running with no time bound.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path

from llamacpp_mla_port.errors import ProcessError, WorkTreeError
from llamacpp_mla_port.process import STDERR_TAIL_CHARS, run as run_process

#: seconds a git command on a local repository may take (about 10x a cold checkout of
#: llama.cpp's tree on a slow disk); past it the command is killed with its process group
TIMEOUT_S = 600
#: a command that talks to a remote (fetch, ls-remote from a URL): a slow network
NETWORK_TIMEOUT_S = 1800

#: settings that change format-patch / diff output; pinned for reproducibility
PINNED_CONFIG = (
    "core.abbrev=12",
    "core.quotePath=true",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.relative=false",
    "diff.algorithm=myers",
    "diff.renames=true",
    "diff.suppressBlankEmpty=false",
    "format.thread=false",
    "format.numbered=auto",
    "format.coverLetter=false",
    "format.signOff=false",
    "am.threeWay=false",
    "gc.auto=0",
    "advice.detachedHead=false",
    "init.defaultBranch=main",
)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
        "TZ": "UTC",
    })
    for i, kv in enumerate(PINNED_CONFIG):
        k, v = kv.split("=", 1)
        env[f"GIT_CONFIG_KEY_{i}"] = k
        env[f"GIT_CONFIG_VALUE_{i}"] = v
    env["GIT_CONFIG_COUNT"] = str(len(PINNED_CONFIG))
    # the user's identity is switched off with their config; git still needs one (am --abort)
    env.update(identity_env("llamacpp-mla-port", "llamacpp-mla-port@localhost",
                            "2000-01-01T00:00:00+00:00"))
    if extra:
        env.update(extra)
    return env


def identity_env(name: str, email: str, date: str) -> dict[str, str]:
    return {
        "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email, "GIT_COMMITTER_DATE": date,
    }


class Repo:
    """A git repository by its folders: `git_dir`, and `working_tree_dir` (None when bare), the
    names GitPython gives them. `path` is a work tree's top folder (its `.git` a folder, or a
    `gitdir:` file as `git worktree` writes) or a bare repository; opening one reads files only."""

    def __init__(self, path: str | Path):
        top = Path(os.path.abspath(path))
        dotgit = top / ".git"
        if dotgit.is_dir():
            git_dir, tree = dotgit, top
        elif dotgit.is_file() and dotgit.read_text(errors="replace").startswith("gitdir:"):
            linked = Path(dotgit.read_text(errors="replace").split(":", 1)[1].strip())
            git_dir, tree = (linked if linked.is_absolute() else top / linked), top
        elif (top / "HEAD").is_file() and (top / "objects").is_dir():
            git_dir, tree = top, None
        else:
            raise WorkTreeError(f"{top} is not a git repository (no .git there, and not a bare one)",
                                "name the top folder of a git work tree, or a bare repository")
        self.git_dir = str(git_dir)
        self.working_tree_dir = str(tree) if tree is not None else None

    def __repr__(self) -> str:
        return f"Repo({self.working_tree_dir or self.git_dir!r})"


def _cwd(repo) -> str:
    """Where a command runs: a folder, or a repository's work tree (its git dir when bare).
    A GitPython Repo works too (the same two names)."""
    if isinstance(repo, (str, Path)):
        return str(repo)
    return str(repo.working_tree_dir or repo.git_dir)


def _subcommand(args) -> str:
    """The git command's name in `args` (after the options of git itself)."""
    it = iter(args)
    for a in it:
        if a in ("-c", "-C"):
            next(it, None)
        elif not str(a).startswith("-"):
            return str(a)
    return ""


def _last_line(*texts: str) -> str:
    lines = [ln.strip() for text in texts for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def error_text(err: ProcessError) -> str:
    """The last meaningful line git printed (stderr, then stdout)."""
    return _last_line(err.stderr_tail, err.stdout_tail) or (
        "git did not finish in time" if err.timed_out else f"git exited with {err.returncode}")


def run(repo, *args: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT_S,
        input: str | bytes | None = None, text: bool = True) -> str | bytes:
    """`git <args>` in `repo` (a folder or a Repo) with the pinned configuration, bounded by
    `timeout` seconds. Its stdout: text (UTF-8, undecodable bytes kept as surrogates) without
    one trailing newline, or the raw bytes (`text=False`). A non-zero exit, a time-out or a git
    that cannot start raise ProcessError, with the stderr and stdout tails."""
    cwd = _cwd(repo)
    argv = ["git", *map(str, args)]
    done = run_process(argv, timeout=timeout, env=clean_env(env), cwd=cwd, input=input, text=False)
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace")[-STDERR_TAIL_CHARS:]
        out = done.stdout.decode("utf-8", "replace")[-STDERR_TAIL_CHARS:]
        raise ProcessError(f"git {_subcommand(args)} failed (exit {done.returncode}): "
                           f"{_last_line(err, out) or 'no message'}",
                           hint=f"the command: {shlex.join(argv)} (in {cwd})", cmd=argv,
                           returncode=done.returncode, stderr_tail=err, stdout_tail=out)
    if not text:
        return done.stdout
    out = done.stdout.decode("utf-8", "surrogateescape")
    return out[:-1] if out.endswith("\n") else out


def read_blob(repo, rev: str, path: str) -> bytes | None:
    """Content of `path` at `rev`, or None when the file does not exist there (or is not a file)."""
    out = run(repo, "cat-file", "--batch", input=f"{rev}:{path}\n", text=False)
    header, _, rest = out.partition(b"\n")
    fields = header.split()
    if len(fields) != 3 or fields[1] != b"blob":
        return None                                 # "<rev:path> missing", or a tree
    return rest[:int(fields[2])]


def file_modes(repo, rev: str, paths) -> dict[str, str]:
    """The modes ("100644", "100755", "120000") of the files of `paths` that exist at `rev`."""
    paths = list(paths)
    if not paths:
        return {}
    out = run(repo, "ls-tree", "-z", "--full-tree", rev, "--", *paths, text=False)
    modes = {}
    for entry in out.split(b"\0"):
        meta, _, name = entry.partition(b"\t")
        if name:
            modes[name.decode("utf-8", "surrogateescape")] = meta.split()[0].decode().zfill(6)
    return modes


def store_blobs(repo, blobs: list[bytes]) -> list[str]:
    """Write each of `blobs` as a blob object, as it is (no filters); their hex ids, in order."""
    if not blobs:
        return []
    with tempfile.TemporaryDirectory(prefix="mla-port-blobs-") as tmp:
        files = []
        for i, data in enumerate(blobs):
            files.append(os.path.join(tmp, str(i)))
            Path(files[-1]).write_bytes(data)
        out = run(repo, "hash-object", "-w", "--no-filters", "--stdin-paths", input="".join(f + "\n" for f in files))
    return out.split()


def store_blob(repo, data: bytes) -> str:
    """Write `data` as one blob object; its hex id."""
    return store_blobs(repo, [data])[0]


def archive(repo, rev: str, timeout: float = TIMEOUT_S) -> bytes:
    """The tree of `rev` as a tar archive (`git archive`)."""
    return run(repo, "archive", "--format=tar", rev, timeout=timeout, text=False)
