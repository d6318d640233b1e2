"""The process funnel (llamacpp_mla_port.process): a time-out always, the whole group killed,
seconds and peak RSS, one error carrying the command, exit status and stderr tail (issue 31)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from llamacpp_mla_port.errors import PortError, ProcessError
from llamacpp_mla_port.process import run


def _group_alive(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies (a zombie is dead, only not yet reaped)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rpartition(")")[2].split()      # after "pid (comm)": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _until_gone(pgid: int, seconds: float = 10) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := _group_alive(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_a_time_out_kills_the_whole_group(tmp_path):
    pids = tmp_path / "pids"
    # the child starts a grandchild sleep and waits on it: both must be gone after the time-out
    script = f"sleep 600 & echo $$ $! > {pids}; wait"
    t0 = time.monotonic()
    with pytest.raises(ProcessError, match="did not finish within 1 s") as info:
        run(["bash", "-c", script], timeout=1)
    assert time.monotonic() - t0 < 10
    err = info.value
    assert err.timed_out and err.returncode is None and err.cmd == ["bash", "-c", script]
    assert isinstance(err, PortError) and "bash -c" in err.hint
    leader, grandchild = map(int, pids.read_text().split())
    assert _until_gone(leader) == []
    assert not Path(f"/proc/{grandchild}").exists() or "Z" == \
        Path(f"/proc/{grandchild}/stat").read_text().rpartition(")")[2].split()[0]


def test_what_a_command_leaves_in_its_group_is_killed_when_it_exits(tmp_path):
    pids = tmp_path / "pids"
    done = run(["bash", "-c", f"sleep 600 & echo $$ > {pids}"], timeout=30)
    assert done.returncode == 0
    assert _until_gone(int(pids.read_text())) == []


def test_a_failing_command_with_check_raises_with_its_command_status_and_stderr_tail():
    cmd = [sys.executable, "-c", "import sys; sys.stderr.write('x' * 5000 + 'the end'); sys.exit(3)"]
    with pytest.raises(ProcessError, match=r"failed \(exit 3\)") as info:
        run(cmd, timeout=60, check=True)
    err = info.value
    assert err.cmd == cmd and err.returncode == 3 and not err.timed_out
    assert err.stderr_tail.endswith("the end") and len(err.stderr_tail) == 2000
    assert "the end" in str(err) and "hint: the command:" in str(err)
    # without check, the caller reads the exit status (several accept non-zero codes)
    done = run(cmd, timeout=60)
    assert done.returncode == 3 and done.stderr.endswith("the end") and done.args == cmd


def test_a_command_that_cannot_start_raises_the_same_error(tmp_path):
    with pytest.raises(ProcessError, match="cannot start no-such-program") as info:
        run([tmp_path / "no-such-program"], timeout=10)
    assert info.value.cmd == [str(tmp_path / "no-such-program")]


def test_seconds_and_peak_rss_are_the_childs():
    script = "import time; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.3)"
    done = run([sys.executable, "-c", script], timeout=60)
    assert done.returncode == 0
    assert done.peak_rss_bytes >= 200 * 2**20
    assert 0.3 <= done.seconds < 60
    small = run(["true"], timeout=10)
    assert 0 < small.peak_rss_bytes < 200 * 2**20 and small.seconds < 10


def test_shell_commands_bytes_input_env_and_cwd(tmp_path):
    (tmp_path / "a.txt").write_text("")
    done = run("echo $((6 * 7)) | tr 4 x; ls; echo \"$WHO\" >&2", shell=True, timeout=30, cwd=tmp_path,
               env={"PATH": "/usr/bin:/bin", "WHO": "me"})
    assert done.stdout == "x2\na.txt\n" and done.stderr == "me\n" and done.args[:2] == ["bash", "-c"]
    raw = run(["printf", "a\\0b\\0"], timeout=30, text=False)
    assert raw.stdout == b"a\0b\0"
    assert run(["cat"], timeout=30, input="fed in").stdout == "fed in"
    assert run(["cat"], timeout=30).stdout == ""            # stdin is /dev/null, not this terminal
    with pytest.raises(ProcessError, match="`exit 4` failed"):
        run("exit 4", shell=True, timeout=30, check=True)
    with pytest.raises(TypeError):
        run("echo a", timeout=30)
