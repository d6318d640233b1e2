"""Processes the proof starts and owns: servers and rpc-servers.

Every process gets its own session (process group), so stopping it stops whatever it
spawned too; every wait is bounded; `stop()` is idempotent and always ends with SIGKILL
of the group when SIGTERM was not enough. Use an `Owned` as a context manager (or call
`stop()` in a `finally`) so nothing outlives the run that started it, passing or failing.
A one-shot run goes through the process funnel itself: llamacpp_mla_port.process.run.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import time
import urllib.request
from pathlib import Path
from typing import Sequence

from llamacpp_mla_port.project import program
from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.process import TimeoutExpired, descendants, kill_group, spawn

LOCALHOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port nothing listens on right now (the OS picks it; bound to loopback only)."""
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


class Owned:
    """One started process (and its group), stopped by `stop()` or at the end of a `with`."""

    def __init__(self, cmd: Sequence[str], log_path: Path, env: dict | None = None, name: str | None = None):
        self.cmd = [str(c) for c in cmd]
        self.name = name or Path(self.cmd[0]).name
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        try:
            self.proc = spawn(self.cmd, self._log, env=env)
        except OSError as err:
            self._log.close()
            raise ProofError(f"cannot start {self.name}: {err}", hint=" ".join(self.cmd)) from None

    # ------------------------------------------------------------------ state
    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n_bytes: int = 3000) -> str:
        if not self._log.closed:
            self._log.flush()
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-n_bytes:].decode("utf-8", "replace")

    def _died(self, what: str) -> ProofError:
        return ProofError(f"{self.name} exited with {self.proc.returncode} {what}; log {self.log_path}:\n"
                          f"{self.log_tail()}", hint=" ".join(self.cmd))

    def peak_rss_bytes(self) -> int | None:
        """The peak resident memory of the process so far (VmHWM; None when not on Linux or gone)."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    # ------------------------------------------------------------------ waits
    def _until(self, probe, seconds: float, before: str, not_within: str, pause: float):
        """probe()'s first true answer, asked until `seconds` pass; ProofError when the process
        exits first (`before`) or on time-out (`not_within`; the process is stopped)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            got = probe()
            if got:
                return got
            if not self.alive():
                raise self._died(before)
            time.sleep(pause)
        self.stop()
        raise ProofError(f"{self.name}{not_within} within {seconds:g} s; log {self.log_path}:\n{self.log_tail()}",
                         hint=" ".join(self.cmd))

    def wait_port(self, port: int, seconds: float = 60, host: str = LOCALHOST) -> None:
        """Until something accepts TCP connections on host:port; ProofError on exit or time-out."""
        def listening() -> bool:
            with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
                return True
            return False
        self._until(listening, seconds, f"before listening on {host}:{port}",
                    f" did not listen on {host}:{port}", 0.1)

    def wait_http(self, url: str, seconds: float = 120) -> None:
        """Until GET url answers 200; ProofError on exit or time-out."""
        def answers() -> bool:
            with contextlib.suppress(Exception), urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
            return False
        self._until(answers, seconds, f"before {url} answered", f": {url} did not answer 200", 0.2)

    def wait_log(self, pattern: str, seconds: float = 60) -> re.Match:
        """Until its output matches the regex; ProofError when it exits first or on time-out."""
        regex = re.compile(pattern)
        return self._until(lambda: regex.search(self.log_tail(1 << 20)), seconds,
                           f"before its output matched {pattern!r}", f": output did not match {pattern!r}", 0.05)

    def wait(self, seconds: float) -> int:
        """Its exit code, waiting at most `seconds` (then it is killed and ProofError raised)."""
        try:
            return self.proc.wait(timeout=seconds)
        except TimeoutExpired:
            self.stop()
            raise ProofError(f"{self.name} did not exit within {seconds:g} s (killed)",
                             hint=" ".join(self.cmd)) from None

    # ------------------------------------------------------------------ stop
    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the whole group now, without waiting: a crash, for fault tests."""
        kill_group(self.proc.pid, sig)

    def stop(self, grace: float = 10) -> int | None:
        """SIGTERM the group, wait up to `grace` s, then SIGKILL it and every descendant (those
        `process.run` started sit in sessions of their own); the exit code. Idempotent."""
        tree = descendants(self.proc.pid) if self.alive() else []
        if self.alive():
            kill_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except TimeoutExpired:
                pass
        # the leader may be gone while children of its group, or of their own sessions, still run
        kill_group(self.proc.pid, signal.SIGKILL)
        for pid in tree:
            kill_group(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=grace)
        except TimeoutExpired:   # pragma: no cover - an unkillable process
            pass
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "Owned":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class RpcServer(Owned):
    """llama.cpp's ggml-rpc-server on a free loopback port with its own thread budget;
    listening once constructed. `endpoint` is what `--rpc` takes."""

    def __init__(self, build: Path, log_path: Path, threads: int = 1, env: dict | None = None,
                 seconds: float = 60):
        binary = program(build, "ggml-rpc-server")
        if not binary.is_file():
            raise ProofError(f"{binary} not found: this llama.cpp build has no RPC backend",
                             hint="build it with the RPC backend: make build (not RPC=0)")
        self.port = free_port()
        super().__init__([binary, "--host", LOCALHOST, "--port", self.port, "--threads", threads], log_path,
                         env=env, name=f"ggml-rpc-server {LOCALHOST}:{self.port}")
        try:
            self.wait_port(self.port, seconds)
        except BaseException:
            self.stop()
            raise

    @property
    def endpoint(self) -> str:
        return f"{LOCALHOST}:{self.port}"
