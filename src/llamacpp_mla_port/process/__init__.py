"""The process funnel: every command this package runs to completion goes through `run`.

    run(cmd, timeout=S, env=None, cwd=None, input=None, check=False, shell=False,
        text=True, capture=True) -> Completed      (a subprocess.CompletedProcess)

- `timeout` (seconds) is required. The command runs in its own session (process group); past
  the time-out the whole group is killed and ProcessError raised (`timed_out`): a hang never
  outlives its bound. Whatever the command leaves behind in its group is killed when it
  exits, and on any error here (Ctrl-C included).
- `check=True`: a non-zero exit raises ProcessError carrying the command, the exit status and
  the stderr tail. Without it the caller reads `.returncode` (several accept non-zero codes).
  A command that cannot start (no such program) raises ProcessError either way.
- `shell=True`: `cmd` is one string, run by `bash -c` (the PR stacks' evidence commands).
- `text=False`: stdout and stderr as bytes (`git ls-files -z`). `capture=False`: they go to
  this process's own stdout and stderr (a driver the user watches), and stay empty here.
- stdin is /dev/null unless `input` (str or bytes) is given. Output goes to temporary
  files, not pipes, so a chatty child never blocks on a full pipe.
- The result also has `.seconds` (wall time) and `.peak_rss_bytes`: ru_maxrss from wait4 on
  that child (its peak and its reaped descendants'). Linux also counts there the image an exec
  replaced, here this process as it was when it started the child: the figure is the child's
  own for a child bigger than this tool (the converter, the real-size runs), and for a smaller
  one an upper bound, this process's peak resident size.

`spawn` starts a long-lived process in its own session for an owner that waits on it and stops
it (proof/run/processes.Owned: servers, rpc-servers). `process.git` runs git through `run`, with
the pinned configuration. Outside this folder only the streaming build (build.py, which shows the
build's output line by line as it comes) starts a process.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

from llamacpp_mla_port.errors import ProcessError

#: how much of stderr a ProcessError carries
STDERR_TAIL_CHARS = 2000


class Completed(subprocess.CompletedProcess):
    """A finished command with its wall time and its own peak resident memory."""

    seconds: float = 0.0
    peak_rss_bytes: int = 0


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """`sig` to the process group led by `pid` (gone already: nothing to do)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def descendants(pid: int) -> list[int]:
    """Every descendant of `pid` (zombies too), parents first, whatever session it runs in (each
    `run` starts its own), from /proc; empty where there is no /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue                      # gone since the listing
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo += children.get(child, ())
    return out


def pause_tree(pid: int) -> list[int]:
    """SIGSTOP the group led by `pid` and every descendant (a build's compilers run in sessions
    of their own), until no new one appears; the pids stopped, for `resume_tree`."""
    kill_group(pid, signal.SIGSTOP)
    stopped: list[int] = []
    for _ in range(10):                   # a child forked while the list was read
        new = [d for d in descendants(pid) if d not in stopped]
        if not new:
            break
        for d in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(d, signal.SIGSTOP)
        stopped += new
    return stopped


def resume_tree(pid: int, stopped: list[int]) -> None:
    """SIGCONT what `pause_tree` stopped: the descendants, then the group."""
    for d in reversed(stopped):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(d, signal.SIGCONT)
    kill_group(pid, signal.SIGCONT)


#: what a spawned process's owner waits on and catches
Popen, TimeoutExpired = subprocess.Popen, subprocess.TimeoutExpired


def spawn(argv: Sequence, log, env: dict | None = None) -> subprocess.Popen:
    """A long-lived process in its own session (process group), stdout and stderr into the open
    file `log`, stdin /dev/null; the caller stops it (kill_group). OSError when it cannot start."""
    return subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _argv(cmd: str | Sequence, shell: bool) -> list[str]:
    if shell:
        if not isinstance(cmd, str):
            raise TypeError("shell=True runs one command string")
        return ["bash", "-c", cmd]
    if isinstance(cmd, (str, bytes)):
        raise TypeError("a command is a list of arguments (or one string with shell=True)")
    return [str(c) for c in cmd]


def _name(cmd: str | Sequence, argv: list[str], shell: bool) -> str:
    if shell:
        return f"`{cmd if len(cmd) <= 80 else cmd[:77] + '...'}`"
    return Path(argv[0]).name


def _wait(proc: subprocess.Popen, deadline: float) -> tuple[int, object, bool]:
    """Wait for the child until `deadline`; kill its group and reap it, whatever happens.
    Its exit status, its rusage, and whether it was killed for the time-out."""
    timed_out = False
    pause = 0.001
    status = usage = None
    try:
        # WNOWAIT: the exited leader stays a zombie, so its group id cannot be reused before
        # the group is killed below
        while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
    finally:
        kill_group(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage, timed_out


def _read(f, text: bool) -> str | bytes:
    if f is None:
        return "" if text else b""
    f.seek(0)
    data = f.read()
    return data.decode("utf-8", "replace") if text else data


def run(cmd: str | Sequence, *, timeout: float, env: dict | None = None, cwd: str | Path | None = None,
        input: str | bytes | None = None, check: bool = False, shell: bool = False, text: bool = True,
        capture: bool = True) -> Completed:
    """Run `cmd` to completion under `timeout` seconds (module doc); the finished command."""
    argv = _argv(cmd, shell)
    name = _name(cmd, argv, shell)
    hint = f"the command: {shlex.join(argv)}" + (f" (in {cwd})" if cwd else "")
    with contextlib.ExitStack() as files:
        out_f = files.enter_context(tempfile.TemporaryFile()) if capture else None
        err_f = files.enter_context(tempfile.TemporaryFile()) if capture else None
        in_f = subprocess.DEVNULL
        if input is not None:
            in_f = files.enter_context(tempfile.TemporaryFile())
            in_f.write(input.encode() if isinstance(input, str) else input)
            in_f.seek(0)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=in_f, stdout=out_f, stderr=err_f, env=env, cwd=cwd,
                                    start_new_session=True)
        except OSError as err:
            raise ProcessError(f"cannot start {name}: {err}", hint=hint, cmd=argv) from None
        returncode, usage, timed_out = _wait(proc, start + timeout)
        seconds = time.monotonic() - start
        out, err = _read(out_f, text), _read(err_f, text)
    tail = (err if text else err.decode("utf-8", "replace"))[-STDERR_TAIL_CHARS:]
    if timed_out:
        raise ProcessError(f"{name} did not finish within {timeout:g} s (killed with its process group); "
                           f"stderr tail:\n{tail}", hint=hint, cmd=argv, stderr_tail=tail, timed_out=True)
    if check and returncode != 0:
        raise ProcessError(f"{name} failed (exit {returncode}); stderr tail:\n{tail}", hint=hint, cmd=argv,
                           returncode=returncode, stderr_tail=tail)
    res = Completed(argv, returncode, out, err)
    res.seconds = seconds
    res.peak_rss_bytes = usage.ru_maxrss * 1024 if usage is not None else 0     # KiB on Linux
    return res
