"""proof/run/processes.py: owned processes stop with their whole group, every wait is bounded."""

from __future__ import annotations

import os
import sys
import time

import pytest

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.proof.run.processes import Owned, RpcServer, free_port

# a parent that listens on a port and leaves a child behind in its process group
SERVER = """
import socket, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0): read its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_owned_waits_for_its_port_and_stops_its_whole_group(tmp_path):
    port = free_port()
    with Owned([sys.executable, "-c", SERVER, str(port)], tmp_path / "log") as srv:
        srv.wait_port(port, seconds=30)
        child = int(srv.log_tail().split()[0])
        assert not _gone(child)
    assert not srv.alive()
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)


def test_a_process_that_dies_before_listening_is_reported(tmp_path):
    srv = Owned([sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"], tmp_path / "log")
    with pytest.raises(ProofError, match="exited with 3"):
        srv.wait_port(free_port(), seconds=30)
    srv.stop()


def test_waits_are_bounded(tmp_path):
    with Owned([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "log") as srv:
        t0 = time.monotonic()
        with pytest.raises(ProofError, match="did not listen"):
            srv.wait_port(free_port(), seconds=1)
        assert time.monotonic() - t0 < 30
        assert not srv.alive()          # a time-out stops it


def test_wait_log_sees_output_and_is_bounded(tmp_path):
    script = ("import time; print('loading', flush=True); time.sleep(0.5); print('tok 7f3a', flush=True); "
              "time.sleep(600)")
    with Owned([sys.executable, "-c", script], tmp_path / "log") as proc:
        assert proc.wait_log(r"tok ([0-9a-f]+)", seconds=30).group(1) == "7f3a"
        t0 = time.monotonic()
        with pytest.raises(ProofError, match="did not match"):
            proc.wait_log("never printed", seconds=1)
        assert time.monotonic() - t0 < 30
        assert not proc.alive()            # a time-out stops it
    with Owned([sys.executable, "-c", "print('bye')"], tmp_path / "log2") as proc:
        with pytest.raises(ProofError, match="exited with 0 before its output matched"):
            proc.wait_log("never printed", seconds=30)


def test_kill_is_a_crash_of_the_whole_group(tmp_path):
    port = free_port()
    with Owned([sys.executable, "-c", SERVER, str(port)], tmp_path / "log") as srv:
        srv.wait_port(port, seconds=30)
        child = int(srv.log_tail().split()[0])
        srv.kill()
        assert srv.wait(30) == -9
        deadline = time.monotonic() + 10
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(child)


def test_rpc_server_without_the_rpc_build_says_how_to_get_it(tmp_path):
    (tmp_path / "bin").mkdir()
    with pytest.raises(ProofError, match="no RPC backend") as err:
        RpcServer(tmp_path, tmp_path / "rpc.log")
    assert "make build (not RPC=0)" in err.value.hint
