"""Compile the proof's own C++ programs (cpp/*.cpp) against a patched llama.cpp build.

The programs are ours, not part of the llama.cpp series: they only use libllama's public
API (plus `src/llama-ext.h`, where the DFlash/DSpark entry points live, and for load-check
common's pair check, `common/speculative.h`), so they link
against the build's shared libraries and are compiled here with the system C++ compiler,
never by touching the llama.cpp tree or its build directory. Binaries land in a cache
folder keyed by the source text and the library they link, so a rebuilt libllama or an
edited program gets a fresh binary and an unchanged pair is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

from llamacpp_mla_port import project
from llamacpp_mla_port.errors import BuildError
from llamacpp_mla_port.process import run

CPP_DIR = Path(__file__).parent / "cpp"
PROGRAMS = ("draft-logits", "target-features", "draft-bench", "ggml-floor", "load-check", "cpu-features",
            "mulmat-check", "model-logits", "verify-bench")
#: ggml-floor measures this machine's memory bandwidth with its own loop: vectorised for this CPU
EXTRA_FLAGS = {"ggml-floor": ("-O3", "-march=native", "-pthread")}
#: cpu-features and mulmat-check ask ggml-cpu itself (ggml_cpu_has_*, its type traits); load-check
#: checks a pair with common's own check (common/speculative.h)
EXTRA_LIBS = {"cpu-features": ("-lggml-cpu",), "mulmat-check": ("-lggml-cpu",),
              "load-check": ("-lllama-common",)}


def library_dir(build_dir: Path) -> Path:
    """Where the build put libllama.so (bin/ for recent trees, src/ for older layouts)."""
    for sub in ("bin", "src", "lib", "."):
        if (Path(build_dir) / sub / "libllama.so").exists():
            return (Path(build_dir) / sub).resolve()
    raise BuildError(f"{build_dir}: no libllama.so",
                     hint="build with -DBUILD_SHARED_LIBS=ON (the default of `make build`) and rerun")


def _ggml_dirs(build_dir: Path, lib: Path) -> list[Path]:
    dirs = [lib]
    for cand in project.lib_dirs(build_dir):
        if cand.is_dir() and cand.resolve() not in dirs and any(cand.glob("libggml*.so")):
            dirs.append(cand.resolve())
    return dirs


def compile_program(name: str, tree: Path, build_dir: Path, out_dir: Path | None = None) -> Path:
    """Compile cpp/<name>.cpp against `tree` (headers) and `build_dir` (shared libs); return the binary."""
    if name not in PROGRAMS:
        raise BuildError(f"unknown proof program {name!r}", hint=f"one of {', '.join(PROGRAMS)}")
    tree, build_dir = Path(tree).resolve(), Path(build_dir).resolve()
    for header in ("include/llama.h", "src/llama-ext.h", "ggml/include/gguf.h"):
        if not (tree / header).is_file():
            raise BuildError(f"{tree}: no {header}", hint="point at a patched llama.cpp source tree (make patch)")
    lib = library_dir(build_dir)
    libllama = lib / "libllama.so"
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise BuildError("no C++ compiler found", hint="install g++ (or set CXX)")

    source = CPP_DIR / f"{name}.cpp"
    key = hashlib.sha256()
    for f in sorted(CPP_DIR.glob("*")):
        key.update(f.name.encode() + f.read_bytes())
    st = libllama.resolve().stat()
    key.update(f"{libllama.resolve()}:{st.st_size}:{st.st_mtime_ns}:{tree}".encode())
    out_dir = Path(out_dir) if out_dir else project.proof_bin_dir() / key.hexdigest()[:16]
    binary = out_dir / name
    if binary.is_file():
        return binary
    out_dir.mkdir(parents=True, exist_ok=True)

    lib_dirs = _ggml_dirs(build_dir, lib)
    cmd = [cxx, "-O2", "-std=c++17", "-Wall", "-Wextra",
           f"-I{tree / 'include'}", f"-I{tree / 'ggml' / 'include'}", f"-I{tree / 'src'}", f"-I{tree / 'common'}",
           f"-I{CPP_DIR}",
           *EXTRA_FLAGS.get(name, ()), str(source), "-o", str(binary) + ".tmp"]
    for d in lib_dirs:
        cmd += [f"-L{d}", f"-Wl,-rpath,{d}"]
    cmd += ["-lllama", "-lggml", "-lggml-base", *EXTRA_LIBS.get(name, ())]
    proc = run(cmd, timeout=600)                   # one program: seconds
    if proc.returncode != 0:
        raise BuildError(f"compiling {source.name} failed:\n{proc.stderr[-4000:]}",
                         hint="the program uses the public libllama API of the pinned tree; "
                              "a moved API shows in the first error above")
    os.replace(str(binary) + ".tmp", binary)
    return binary


def ggml_cpu_features(tree: Path, build_dir: Path) -> dict[str, int]:
    """What the build's ggml-cpu was compiled for (ggml_cpu_has_*: avx2, fma, f16c, avx512,
    avx512_bf16, amx_int8), not what the CPU has (cpp/cpu-features.cpp)."""
    exe = compile_program("cpu-features", tree, build_dir)
    proc = run([exe], timeout=60)
    if proc.returncode != 0:
        raise BuildError(f"{exe.name} failed (exit {proc.returncode}): {proc.stderr[-1000:]}",
                         hint=f"rerun `{exe}` to see the error")
    return json.loads(proc.stdout)


#: the flag of draft-bench and verify-bench that puts weights in plain CPU buffers (--no-repack)
NO_EXTRA_BUFTS = "--no-extra-bufts"


def run_with_default_bufts(argv: list, timeout: float):
    """A proof program with llama.cpp's buffer types; where it dies of a signal, again with extra
    buffer types off (ggml's AMX Q8_0 tile path as GCC 12 builds it raises SIGILL, the base too,
    upstream PR #26954). (the finished run, its argv, the note saying why extra types are off)."""
    proc = run(argv, timeout=timeout)
    if proc.returncode >= 0 or NO_EXTRA_BUFTS in map(str, argv):
        return proc, argv, None
    try:
        died = signal.Signals(-proc.returncode).name
    except ValueError:
        died = f"signal {-proc.returncode}"
    argv = [*argv, NO_EXTRA_BUFTS]
    return run(argv, timeout=timeout), argv, (f"default buffer types died of {died}; measured with extra "
                                              "buffer types off (llama.cpp's --no-repack)")
