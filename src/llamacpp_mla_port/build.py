"""`build`: CMake Release build of the patched llama.cpp work tree.

CPU by default; other backends by passing CMake options through, e.g.
`llamacpp-mla-port build --cmake-arg=-DGGML_CUDA=ON`. Ninja and ccache are used when they
are on PATH. Only the targets the job and the proof need are built (DEFAULT_TARGETS), so a
cold build stays a few minutes on two cores and a rebuild after a re-render recompiles only
the changed sources. Progress (CMake/Ninja's own lines) streams to the terminal; the full
log is kept in <build-dir>/llamacpp-mla-port-build.log.

With ccache, CCACHE_BASEDIR is set to the common parent of the tree and the build dir
(unless you set it): builds of alike-laid-out work dirs share the cache (ccache_env).
`first_error` pulls the first compiler/CMake/linker error out of a build log.

Tests use `ensure_build(tree, build_dir, targets)`; the verb is commands/build.py.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Sequence

from llamacpp_mla_port.project import program
from llamacpp_mla_port.errors import BuildError

#: Every set of targets a caller builds, in one table (the views below name them). All of
#: them are built in the one CMake configuration (RPC on), so one build dir serves them all.
TARGET_SETS: dict[str, tuple[str, ...]] = {
    # the job (server/cli), the proof (speculative-simple, simple), the tests (test-llama-archs
    # writes the tiny Kimi-K3 target) and the RPC tests (ggml-rpc-server): `make build`
    "job": ("llama-server", "llama-cli", "llama-speculative-simple", "llama-simple",
            "test-llama-archs", "ggml-rpc-server", "test-rpc-multi-server"),
    # the server each RPC host runs and upstream's RPC harness client (left out without RPC)
    "rpc": ("ggml-rpc-server", "test-rpc-multi-server"),
    # the whole proof (`smoke`) and the canary's build stage
    "smoke": ("llama-server", "llama-simple", "llama-speculative-simple", "test-llama-archs"),
    # the bench: the proof's targets and the quantizer of the real-size draft
    "bench": ("llama-server", "llama-simple", "llama-speculative-simple", "test-llama-archs",
              "llama-quantize"),
    # upstream's op tests: flash attention against ggml-cpu's reference path (tests/proof)
    "backend-ops": ("test-backend-ops",),
    # what every commit of the upstream series must build (`pr`)
    "pr": ("test-llama-archs", "llama-speculative-simple", "llama-server"),
}
DEFAULT_TARGETS: tuple[str, ...] = TARGET_SETS["job"]

#: Options every configure gets; user --cmake-arg values come after and win.
BASE_CMAKE_ARGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=ON",      # test-llama-archs
    "-DLLAMA_BUILD_EXAMPLES=ON",   # llama-simple, llama-speculative-simple
    "-DLLAMA_BUILD_TOOLS=ON",      # llama-server, llama-cli
    # CMake >= 4.0: unity files #include their sources by relative path; older CMake writes
    # absolute ones (and __FILE__ follows), so src/models' unity chunks miss ccache across
    # work dirs whatever CCACHE_BASEDIR says (older CMake ignores this, with a warning)
    "-DCMAKE_UNITY_BUILD_RELOCATABLE=ON",
)

#: llama.cpp's RPC backend (a model spread over hosts, `--rpc host:port,...`) and the server
#: each host runs. GGML_RPC adds a PUBLIC compile definition to ggml, so switching it
#: recompiles everything: it is on in the one configuration that `make build`, the tests,
#: smoke, bench and the canary share (rpc=False, `build --no-rpc`, only for a build dir of its own).
RPC_CMAKE_ARGS: tuple[str, ...] = ("-DGGML_RPC=ON",)
RPC_TARGETS: tuple[str, ...] = TARGET_SETS["rpc"]

LOG_NAME = "llamacpp-mla-port-build.log"
ARGS_NAME = "llamacpp-mla-port-cmake-args.txt"
TAIL_LINES = 40


def default_jobs() -> int:
    return max(1, os.cpu_count() or 1)


def cmake_configure_args(tree: Path, build_dir: Path, cmake_args: Sequence[str] = ()) -> list[str]:
    args = ["cmake", "-S", str(tree), "-B", str(build_dir)]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    if shutil.which("ccache"):
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                 "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"]
    args += list(BASE_CMAKE_ARGS)
    args += list(cmake_args)
    return args


def ccache_env(tree: Path, build_dir: Path) -> dict[str, str] | None:
    """The environment of a ccache build: CCACHE_BASEDIR at the common parent of the tree and
    the build dir, so that ccache hashes the paths below it relative to the build dir. Two
    work dirs laid out alike (X/llama.cpp + X/build, Y/llama.cpp + Y/build: the main build
    and a canary, or a CI checkout anywhere) then share cache hits; without it, every
    absolute path differs and every compile misses. None: not ccache, or the user's own
    CCACHE_BASEDIR (or a parent at the file system root) stands."""
    if shutil.which("ccache") is None or "CCACHE_BASEDIR" in os.environ:
        return None
    base = Path(os.path.commonpath([Path(tree).resolve(), Path(build_dir).resolve()]))
    if base == Path(base.anchor):
        return None
    return {**os.environ, "CCACHE_BASEDIR": str(base)}


#: the first compiler or CMake error of a build log: GCC/Clang `file:line:col: error: ...`
#: (also `fatal error:`), and `CMake Error at file:line (...)`
_COMPILER_ERROR = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*"
                             r"(?:fatal )?error:\s*(?P<message>.*)$")
_CMAKE_ERROR = re.compile(r"^CMake Error at (?P<file>[^:]+):(?P<line>\d+)\s*(?P<message>.*)$")
_LINK_ERROR = re.compile(r"(undefined reference to|multiple definition of|ld returned)")


def first_error(log_text: str, tree: Path | None = None) -> dict | None:
    """The first error of a build log: file (relative to `tree` when inside it), line,
    column, message and the lines after it (the compiler's context); None when none is found."""
    lines = log_text.splitlines()
    for i, raw in enumerate(lines):
        line = raw.strip()
        m = _COMPILER_ERROR.match(line) or _CMAKE_ERROR.match(line)
        kind = "compiler" if _COMPILER_ERROR.match(line) else "cmake"
        if m is None and _LINK_ERROR.search(line):
            return {"kind": "linker", "file": None, "line": None, "column": None,
                    "message": line, "context": lines[max(0, i - 2):i + 4]}
        if m is None:
            continue
        file = m["file"]
        if tree is not None:
            try:
                file = str(Path(file).resolve().relative_to(Path(tree).resolve()))
            except ValueError:
                pass
        col = m.groupdict().get("col")
        return {"kind": kind, "file": file, "line": int(m["line"]),
                "column": int(col) if col else None, "message": m["message"].strip(),
                "context": lines[i:i + 8]}
    return None


def _run_logged(cmd: list[str], log_path: Path, stage: str, echo: bool,
                env: dict[str, str] | None = None) -> None:
    """Run cmd, streaming its output to the terminal (when echo) and to the log."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    # line-buffered: `tail -f` of the log follows a quiet (echo=False) build as it goes
    with open(log_path, "a", encoding="utf-8", errors="replace", buffering=1) as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, errors="replace", bufsize=1, env=env)
        except FileNotFoundError as err:
            raise BuildError(f"{stage}: {cmd[0]} not found", hint="install CMake (>= 3.14) and a C++17 compiler") from err
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            tail.append(line.rstrip("\n"))
            if echo:
                sys.stderr.write(line)
                sys.stderr.flush()
        rc = proc.wait()
    if rc != 0:
        last = "\n".join(tail)
        hint = (f"full log: {log_path}. A stale configure (other backend or compiler) is "
                f"fixed by deleting the build dir; missing CUDA/Metal toolkits show up at configure")
        raise BuildError(f"{stage} failed (exit {rc}); last lines:\n{last}", hint=hint)


def ensure_build(tree: Path, build_dir: Path, targets: Iterable[str] = DEFAULT_TARGETS,
                 cmake_args: Sequence[str] = (), jobs: int | None = None, echo: bool = True,
                 rpc: bool = True) -> Path:
    """Configure (when needed) and build `targets` of `tree` into `build_dir`; returns build_dir.

    Reconfigures only when the build dir has no cache or the CMake options changed, so a
    rerun is an incremental Ninja build. Binaries end up in <build_dir>/bin. `rpc` (the
    default, so every caller shares one configuration) adds the RPC backend (RPC_CMAKE_ARGS,
    before the caller's options); without it ggml-rpc-server is dropped from the targets.
    """
    if rpc:
        cmake_args = [*RPC_CMAKE_ARGS, *cmake_args]
    else:
        targets = [t for t in targets if t not in RPC_TARGETS]
    tree = Path(tree)
    build_dir = Path(build_dir)
    if not (tree / "CMakeLists.txt").is_file():
        raise BuildError(f"no llama.cpp tree at {tree} (CMakeLists.txt missing)",
                         hint="run `llamacpp-mla-port patch` first, or pass --work-dir")
    if shutil.which("cmake") is None:
        raise BuildError("cmake not found on PATH", hint="install CMake (>= 3.14), e.g. `apt-get install cmake ninja-build`")
    build_dir.mkdir(parents=True, exist_ok=True)
    log_path = build_dir / LOG_NAME
    log_path.write_text("")

    configure = cmake_configure_args(tree, build_dir, cmake_args)
    env = ccache_env(tree, build_dir)
    args_file = build_dir / ARGS_NAME
    wanted = "\n".join(configure) + "\n"
    if not (build_dir / "CMakeCache.txt").is_file() or not args_file.is_file() or args_file.read_text() != wanted:
        _run_logged(configure, log_path, "CMake configure", echo, env)
        args_file.write_text(wanted)

    targets = list(targets)
    build = ["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs or default_jobs())]
    for target in targets:
        build += ["--target", target]
    _run_logged(build, log_path, f"build of {', '.join(targets)}", echo, env)

    # an executable lands as bin/T, a library target (llama, ggml) as bin/libT.so
    missing = [t for t in targets if not program(build_dir, t).exists()
               and not program(build_dir, f"lib{t}.so").exists()]
    if missing:
        raise BuildError(f"build finished but {', '.join(missing)} not in {build_dir / 'bin'}",
                         hint=f"check {log_path}; a target name may not exist in this llama.cpp version")
    return build_dir
