"""The process funnel (llamacpp_mla_port.process): a time-out always, the whole group killed,
seconds and peak RSS, one error carrying the command, exit status and stderr tail; git through
it (process.git); and no process started in src/ outside it but the streaming build and the
proof's long-lived processes: read from the source, and watched at run time."""

from __future__ import annotations

import ast
import io
import json
import resource
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from llamacpp_mla_port.errors import PortError, ProcessError, WorkTreeError
from llamacpp_mla_port.process import git, run

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "llamacpp_mla_port"


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


@pytest.mark.slow
def test_peak_rss_is_the_childs_when_it_outgrows_this_process():
    # a child bigger than this process: its own peak (a smaller one reads as this process's
    # size when it was started, the image its exec replaced: the module doc); in make test-slow,
    # as this process has grown to gigabytes by then
    ours = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    size = ours + 200 * 2**20
    script = f"import time; b = bytearray({size}); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.3)"
    done = run([sys.executable, "-c", script], timeout=60)
    assert done.returncode == 0
    assert size <= done.peak_rss_bytes < size + 100 * 2**20
    assert 0.3 <= done.seconds < 60


def test_seconds_and_peak_rss_are_the_childs():
    done = run([sys.executable, "-c", "import time; time.sleep(0.3)"], timeout=60)
    assert done.returncode == 0 and 0.3 <= done.seconds < 60 and done.peak_rss_bytes > 0
    small = run(["true"], timeout=10)
    assert 0 < small.peak_rss_bytes <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert 0 < small.seconds < 10


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


# ------------------------------------------------------------------ no process outside it
#: where src/ may start a process itself: (module, outermost function or class; "*": anywhere)
ALLOWED_STARTS = {
    ("llamacpp_mla_port.process", "*"): "the funnel (run) and the long-lived processes' start (spawn)",
    ("llamacpp_mla_port.process.git", "run"): "git's argv, built once in the git funnel",
    ("llamacpp_mla_port.build", "_run_logged"): "the streaming build: its output shown as it comes",
}
#: what starts a process besides the subprocess module
OS_STARTS = ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "spawnl", "spawnle", "spawnlp",
             "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "execl", "execle", "execlp", "execlpe",
             "execv", "execve", "execvp", "execvpe")


#: libraries that start processes of their own, unbounded: GitPython (`git version` when
#: imported, `git cat-file` kept running) and its object database
PROCESS_LIBRARIES = ("git", "gitdb")


def process_starts(sources: dict[str, str]) -> list[tuple[str, str, int, str]]:
    """(module, outermost def/class or "", line, call) of every subprocess.* call, every
    `from subprocess import`, every os.system / os.popen / os.spawn* / os.exec* / os.fork, every
    import of GitPython (or gitdb), every GitPython command call (`repo.git.archive(...)`), and
    every git argv (a list or tuple that starts with "git": git goes through process.git)."""
    out = []
    for module, text in sources.items():
        tree = ast.parse(text)
        for top in tree.body:
            scope = top.name if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else ""
            for node in ast.walk(top):
                if isinstance(node, ast.ImportFrom) and node.module == "subprocess":
                    out.append((module, scope, node.lineno, "from subprocess import"))
                elif isinstance(node, ast.ImportFrom) and not node.level \
                        and (node.module or "").split(".")[0] in PROCESS_LIBRARIES:
                    out.append((module, scope, node.lineno, f"from {node.module} import"))
                elif isinstance(node, ast.Import) and any(a.name.split(".")[0] in PROCESS_LIBRARIES
                                                          for a in node.names):
                    out.append((module, scope, node.lineno, "import " + ", ".join(a.name for a in node.names)))
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and isinstance(node.func.value, ast.Name):
                    base, attr = node.func.value.id, node.func.attr
                    if base == "subprocess" or (base == "os" and attr in OS_STARTS):
                        out.append((module, scope, node.lineno, f"{base}.{attr}"))
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "git":
                    out.append((module, scope, node.lineno, f"{ast.unparse(node.func)} (GitPython)"))
                elif isinstance(node, (ast.List, ast.Tuple)) and node.elts \
                        and isinstance(node.elts[0], ast.Constant) and node.elts[0].value == "git":
                    out.append((module, scope, node.lineno, "a git argv"))
    return out


def start_violations(sources: dict[str, str], allowed: dict[tuple[str, str], str]) -> list[str]:
    """Every start outside the allowed places, and every allowed place that starts nothing."""
    starts = process_starts(sources)
    out = [f"{m}:{line}: {call} (in {scope or 'the module'}): use llamacpp_mla_port.process."
           + ("git" if call == "a git argv" else "run")
           for m, scope, line, call in starts if (m, scope) not in allowed and (m, "*") not in allowed]
    used = {(m, s) for m, s, _, _ in starts} | {(m, "*") for m, _, _, _ in starts}
    out += [f"stale allow-list entry {m} {s}" for m, s in sorted(allowed) if (m, s) not in used]
    return out


def test_the_start_checker_finds_direct_calls():
    old = {
        "pr": "import subprocess\ndef run_evidence(c):\n    return subprocess.run(c, shell=True)\n",
        "bundle": "from subprocess import run\n",
        "shell": "import os\nclass A:\n    def f(self):\n        os.system('ls')\n",
        "gitutil": "import git\ndef run(p, *a):\n    return git.Git(str(p)).execute(['git', *a])\n",
        "harness_diff": "def export_commit(repo, sha):\n    return repo.git.archive(sha, stdout_as_string=False)\n",
        "obtain": "from git import Repo\n",
        "variants": "from llamacpp_mla_port.process import run\ndef _git(t, *a):\n"
                    "    return run([\"git\", \"-C\", t, *a], timeout=120)\nHEAD = (\"git\", \"log\")\n",
        "fine": "import os\nos.path.join('a')\nfrom llamacpp_mla_port.process import run\nrun(['ls'], timeout=1)\n"
                "from llamacpp_mla_port.process import git\ngit.run('.', 'status', timeout=5)\n",
    }
    assert start_violations(old, {}) == [
        "pr:3: subprocess.run (in run_evidence): use llamacpp_mla_port.process.run",
        "bundle:1: from subprocess import (in the module): use llamacpp_mla_port.process.run",
        "shell:4: os.system (in A): use llamacpp_mla_port.process.run",
        "gitutil:1: import git (in the module): use llamacpp_mla_port.process.run",
        "gitutil:3: a git argv (in run): use llamacpp_mla_port.process.git",
        "harness_diff:2: repo.git.archive (GitPython) (in export_commit): use llamacpp_mla_port.process.run",
        "obtain:1: from git import (in the module): use llamacpp_mla_port.process.run",
        "variants:3: a git argv (in _git): use llamacpp_mla_port.process.git",
        "variants:4: a git argv (in the module): use llamacpp_mla_port.process.git"]
    allowed = {("pr", "run_evidence"): "", ("bundle", ""): "", ("shell", "*"): "", ("gitutil", "*"): "",
               ("harness_diff", "export_commit"): "", ("obtain", ""): "", ("variants", "_git"): "",
               ("variants", ""): ""}
    assert start_violations(old, allowed) == []
    assert start_violations({}, {("pr", "run_evidence"): ""}) == ["stale allow-list entry pr run_evidence"]


def test_no_process_is_started_outside_the_funnel():
    sources = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        sources[".".join(parts)] = path.read_text()
    assert "llamacpp_mla_port.process" in sources and "llamacpp_mla_port.build" in sources
    problems = start_violations(sources, ALLOWED_STARTS)
    assert problems == [], "\n".join(problems)


# ------------------------------------------------------------------ watched at run time
#: a fresh interpreter that records, with an audit hook set before anything is imported, every
#: process started and the first frame outside the standard library that started it; then it
#: imports every module of the package and runs git's paths (process.git, a series committed,
#: exported and applied, a commit archived). Its controls start processes outside the funnel.
PROBE = textwrap.dedent("""
    import json, os, sys, sysconfig

    STDLIB = sysconfig.get_paths()["stdlib"]
    starts, phase = [], ["package"]

    def starter():
        f = sys._getframe(2)
        while f is not None and f.f_code.co_filename.startswith(STDLIB):
            f = f.f_back
        return (f.f_code.co_filename, f.f_code.co_name) if f is not None else ("?", "?")

    def hook(event, args):
        if event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"):
            starts.append({"phase": phase[0], "event": event, "file": starter()[0], "function": starter()[1],
                           "what": str(args[1] if event == "subprocess.Popen" else args[0])[:120]})

    sys.addaudithook(hook)

    import importlib, pkgutil, tempfile
    from pathlib import Path
    import llamacpp_mla_port
    for m in pkgutil.walk_packages(llamacpp_mla_port.__path__, "llamacpp_mla_port."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)

    from llamacpp_mla_port.process import git
    from llamacpp_mla_port.series import gitseries
    from llamacpp_mla_port.series.render import RenderedCommit
    from llamacpp_mla_port.series.spec import Series
    from llamacpp_mla_port.source.pin import Pin
    from llamacpp_mla_port.upstreaming.harness_diff import export_commit

    tmp = Path(tempfile.mkdtemp())
    up = tmp / "up"
    up.mkdir()
    git.run(up, "init", "-q", ".")
    (up / "a.c").write_text("int a;\\n")
    git.run(up, "add", "a.c")
    git.run(up, "commit", "-q", "-m", "base")
    repo = git.Repo(up)
    base = git.run(repo, "rev-parse", "HEAD")
    series = Series(root=tmp, vars={}, author_name="t", author_email="t@t", date="2026-01-01T00:00:00+00:00",
                    branch="mla-port", commits=())
    shas = gitseries.commit_rendered(repo, base, [RenderedCommit("01-x", "x : one\\n", {"a.c": b"int a, b;\\n"})],
                                     series)
    pin = Pin(url="u", commit=base, tag="b1", sdist=None, path=tmp / "pin.toml")
    names = gitseries.export(repo, base, shas[-1], tmp / "patches", pin, series)
    gitseries.apply(repo, base, "mla-port", [tmp / "patches" / n for n in names], series)
    assert git.read_blob(repo, "HEAD", "a.c") == b"int a, b;\\n"
    export_commit(repo, base, tmp / "tree" / "llama.cpp")
    assert (tmp / "tree" / "llama.cpp" / "a.c").read_text() == "int a;\\n"

    phase[0] = "control"
    import subprocess
    subprocess.run(["git", "--version"], capture_output=True)
    os.system("true")
    print(json.dumps(starts))
""")


def _probe() -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_at_run_time_every_process_the_package_starts_comes_from_the_funnel():
    starts = _probe()
    funnel = str(PACKAGE / "process" / "__init__.py")
    package = [s for s in starts if s["phase"] == "package"]
    control = [s for s in starts if s["phase"] == "control"]
    # the probe ran git: init, add, commit, read-tree, ls-tree, hash-object, update-index,
    # write-tree, commit-tree, format-patch, checkout, am, rev-parse, cat-file, archive ...
    assert len(package) >= 15 and all("git" in s["what"] for s in package), package
    outside = [s for s in package if (s["file"], s["function"]) != (funnel, "run")]
    assert outside == [], outside
    # the controls: a direct subprocess.run and an os.system, each seen and named
    assert [(s["event"], Path(s["file"]).name != "__init__.py") for s in control] == \
        [("subprocess.Popen", True), ("os.system", True)], control


def test_git_runs_bounded_and_fails_with_the_one_error(tmp_path):
    git.run(tmp_path, "init", "-q", ".")
    t0 = time.monotonic()
    with pytest.raises(ProcessError, match="did not finish within 1 s") as info:
        git.run(tmp_path, "-c", "alias.hang=!sleep 600", "hang", timeout=1)
    assert info.value.timed_out and time.monotonic() - t0 < 10
    with pytest.raises(ProcessError, match=r"git rev-parse failed \(exit 128\): ") as info:
        git.run(tmp_path, "rev-parse", "--verify", "no-such-ref")
    err = info.value
    assert err.returncode == 128 and err.cmd[:2] == ["git", "rev-parse"] and "fatal" in err.stderr_tail
    assert git.error_text(err) == err.message.split(": ", 1)[1] and str(tmp_path) in err.hint
    # the user's own git configuration does not reach it
    assert git.run(tmp_path, "config", "core.abbrev") == "12"


def test_git_reads_and_writes_objects_without_a_running_git(tmp_path):
    git.run(tmp_path, "init", "-q", ".")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "run.sh").write_text("echo hi\n")
    (tmp_path / "sub" / "run.sh").chmod(0o755)
    (tmp_path / "a.txt").write_bytes(b"a\r\nb\n")
    git.run(tmp_path, "add", "-A")
    git.run(tmp_path, "commit", "-q", "-m", "one")
    repo = git.Repo(tmp_path)
    assert repo.working_tree_dir == str(tmp_path) and repo.git_dir == str(tmp_path / ".git")
    assert git.read_blob(repo, "HEAD", "a.txt") == b"a\r\nb\n"
    assert git.read_blob(repo, "HEAD", "missing.txt") is None and git.read_blob(repo, "HEAD", "sub") is None
    assert git.file_modes(repo, "HEAD", ["sub/run.sh", "a.txt", "missing.txt"]) == {
        "sub/run.sh": "100755", "a.txt": "100644"}
    ids = git.store_blobs(repo, [b"a\r\nb\n", b"", b"new\n"])
    assert ids[0] == git.run(repo, "rev-parse", "HEAD:a.txt")       # stored as it is, no filters
    assert git.read_blob(repo, ids[2], "") is None and git.run(repo, "cat-file", "-p", ids[2]) == "new"
    with tarfile.open(fileobj=io.BytesIO(git.archive(repo, "HEAD"))) as tar:
        assert sorted(tar.getnames()) == ["a.txt", "sub", "sub/run.sh"]
    bare = tmp_path / "bare.git"
    git.run(tmp_path, "clone", "-q", "--bare", ".", str(bare))
    assert git.Repo(bare).working_tree_dir is None and git.read_blob(git.Repo(bare), "HEAD", "a.txt") == b"a\r\nb\n"
    with pytest.raises(WorkTreeError, match="is not a git repository"):
        git.Repo(tmp_path / "sub")


def test_pause_tree_stops_descendants_in_sessions_of_their_own(tmp_path):
    """The device check's quiet(): its builder's compilers run through `run`, each in a session
    of its own, out of reach of a signal to the builder's group; pause_tree stops them too."""
    from llamacpp_mla_port.process import kill_group, pause_tree, resume_tree
    from llamacpp_mla_port.proof.run.processes import Owned

    ticks = tmp_path / "ticks"
    loop = f"while :; do echo x >> {ticks}; sleep 0.02; done"
    leader = Owned([sys.executable, "-c", "from llamacpp_mla_port.process import run; "
                    f"run(['bash', '-c', {loop!r}], timeout=120)"], tmp_path / "leader.log", name="leader")
    try:
        deadline = time.monotonic() + 30
        while not (ticks.is_file() and ticks.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.05)

        def grows() -> bool:
            before = ticks.stat().st_size
            time.sleep(0.5)
            return ticks.stat().st_size > before

        assert grows()
        kill_group(leader.pid, signal.SIGSTOP)           # the control: the group alone misses the loop
        assert grows()
        stopped = pause_tree(leader.pid)
        assert stopped and not grows()
        resume_tree(leader.pid, stopped)
        assert grows() and leader.alive()
    finally:
        leader.stop(grace=2)
    # stop() ends the loop too, though the leader dies of SIGTERM before `run` can kill it
    size = ticks.stat().st_size
    time.sleep(0.5)
    assert ticks.stat().st_size == size
