"""The CUDA toolkit as the device machine has it: the CMake options for what a toolkit
assembled from pip wheels lacks (cuBLAS, the driver library)."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

from llamacpp_mla_port.errors import DeviceCheckError, ProcessError
from llamacpp_mla_port.process import run


def _first(paths) -> Path | None:
    for p in paths:
        if p and Path(p).is_file():
            return Path(p)
    return None


def _python_nvidia_dirs() -> list[Path]:
    """Folders of the `nvidia` namespace package (pip's nvidia-cublas & co., as torch uses)."""
    spec = importlib.util.find_spec("nvidia")
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def cuda_toolkit_args(nvcc: str | None = None, nvidia_dirs: list[Path] | None = None,
                      ldconfig_text: str | None = None) -> list[str]:
    """CMake options for the pieces of the CUDA toolkit ggml-cuda links that a toolkit
    assembled from pip wheels (nvcc, runtime, cccl: this workplace's images) lacks: cuBLAS
    (headers and libraries, from the `nvidia` Python packages) and the driver library
    (libcuda: from the toolkit's stubs, the loader cache or the driver's folder). Empty when
    the toolkit has them itself; DeviceCheckError when nothing provides one."""
    nvcc = nvcc or shutil.which("nvcc")
    if not nvcc:
        raise DeviceCheckError("nvcc not found", hint="the CUDA build needs nvcc on PATH")
    root = Path(nvcc).resolve().parent.parent
    lib_dirs = [root / "lib64", root / "lib", root / "targets" / "x86_64-linux" / "lib"]
    inc_dirs = [root / "include", root / "targets" / "x86_64-linux" / "include"]
    args: list[str] = []
    if not _first(d / "cublas_v2.h" for d in inc_dirs) or not _first(d / "libcublas.so" for d in lib_dirs):
        pkgs = _python_nvidia_dirs() if nvidia_dirs is None else nvidia_dirs
        header = _first(sorted(h for d in pkgs for h in d.rglob("cublas_v2.h")))
        libs = {name: _first(sorted(f for d in pkgs for f in d.rglob(f"lib{name}.so*")))
                for name in ("cublas", "cublasLt")}
        if header is None or None in libs.values():
            raise DeviceCheckError(f"no cuBLAS: not in the toolkit at {root}, nor in the nvidia Python packages {pkgs}",
                                   hint="install the CUDA toolkit's cuBLAS, or pip's nvidia-cublas")
        args += [f"-DCUDA_cublas_LIBRARY={libs['cublas']}", f"-DCUDA_cublasLt_LIBRARY={libs['cublasLt']}",
                 f"-DCMAKE_CUDA_FLAGS=-I{header.parent}", f"-DCMAKE_CXX_FLAGS=-I{header.parent}"]
    if not _first([*(d / "stubs" / "libcuda.so" for d in lib_dirs), *(d / "libcuda.so" for d in lib_dirs)]):
        if ldconfig_text is None:
            try:
                ldconfig_text = run(["ldconfig", "-p"], timeout=30).stdout
            except ProcessError:          # no ldconfig, or no answer within 30 s
                ldconfig_text = ""
        cached = re.findall(r"libcuda\.so(?:\.1)? \(.*?\) => (\S+)", ldconfig_text)
        driver = _first([*cached, "/usr/local/nvidia/lib64/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                         "/usr/lib64/libcuda.so.1"])
        if driver is None:
            raise DeviceCheckError("no libcuda (the CUDA driver library) found",
                                   hint="run on a machine with a GPU driver")
        args.append(f"-DCUDA_cuda_driver_LIBRARY={driver}")
    return args
