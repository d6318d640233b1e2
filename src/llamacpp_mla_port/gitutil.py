"""Git access with a fixed, user-independent configuration.

Everything the tool writes with git (imported bases, series commits, format-patch output)
must be byte-reproducible, so every call runs with the user's global and system config
switched off and the few settings that shape output pinned here.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import git
from gitdb.base import IStream

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


def run(repo: git.Repo | Path, *args: str, env: dict[str, str] | None = None,
        **kwargs) -> str:
    """`git <args>` in `repo` with the pinned configuration; raises git.GitCommandError."""
    path = repo.working_tree_dir or repo.git_dir if isinstance(repo, git.Repo) else str(repo)
    g = git.Git(str(path))
    return g.execute(["git", *args], env=clean_env(env), **kwargs)


def store_blob(repo: git.Repo, data: bytes) -> str:
    """Write `data` as a blob object; return its hex id."""
    istream = repo.odb.store(IStream(b"blob", len(data), io.BytesIO(data)))
    return istream.hexsha.decode() if isinstance(istream.hexsha, bytes) else istream.hexsha


def read_blob(repo: git.Repo, rev: str, path: str) -> bytes | None:
    """Content of `path` at `rev`, or None when the file does not exist there."""
    try:
        obj = repo.commit(rev).tree / path
    except KeyError:
        return None
    if obj.type != "blob":
        return None
    return obj.data_stream.read()


def file_mode(repo: git.Repo, rev: str, path: str) -> str | None:
    try:
        obj = repo.commit(rev).tree / path
    except KeyError:
        return None
    return f"{obj.mode:06o}"


def error_text(err: git.GitCommandError) -> str:
    """The last meaningful line git printed, without GitPython's decoration."""
    raw = f"{err.stderr or ''}\n{err.stdout or ''}"
    lines = []
    for line in raw.splitlines():
        line = line.strip()
        for prefix in ("stderr: '", "stdout: '"):
            if line.startswith(prefix):
                line = line[len(prefix):]
        line = line.rstrip("'").strip()
        if line:
            lines.append(line)
    return lines[-1] if lines else f"git exited with {err.status}"
