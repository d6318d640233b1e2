"""CPU builds of the pinned base and of single PR stacks on the device host, alike: the host
CPU stages' llama-bench binaries (the #18099 reproducer, the thread rows).

PREPARE (here, `prepare_variants`): the bundle's variants/ folder holds the base's version of
every file of the pruned tree that the series changes (`base/`; the files the series adds are
listed to delete) and, per stack, its version of the files its patches touch (the exported
patches/ of its commits, applied with `git apply` onto the base's files: a stack's commits
apply alone on the base). variants.json lists them, with each stack's bench table.

RUN (the device, in the background: `python -m llamacpp_mla_port.device.variants BUNDLE WORK
JOBS NAME...`, at the lowest CPU priority while the GPU stages run): one copy of the patched
tree, turned into the base, then into each stack in turn (only the files that differ are
rewritten, so Ninja recompiles only those), one build dir with CPU_CMAKE_ARGS (native, static:
the copied binary needs no library of the build dir). Each variant's llama-bench lands in
WORK/cpu-bins/NAME/ with done.json (or failed.json), which the stages wait for.
"""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from llamacpp_mla_port.build import ensure_build
from llamacpp_mla_port.errors import DeviceCheckError, PortError, ProcessError
from llamacpp_mla_port.process import git
from llamacpp_mla_port.series.spec import load_series
from llamacpp_mla_port.jsonfile import write_json

#: the stacks whose builds the host stages use (stack -> the stage), in the order the builder makes them
STACK_STAGE = {"loader-probe": "host", "cpu-q0-odd-columns": "threads", "cpu-fa-kv-head-tiles": "threads"}
VARIANT_STACKS = tuple(STACK_STAGE)
BASE = "base"
#: every variant alike: native ISA (AVX-512, AMX where the CPU has them), CPU only, static
CPU_CMAKE_ARGS = ("-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                  "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF")
CPU_TARGETS = ("llama-bench",)


# ------------------------------------- prepare (this machine: git, the exported patches)

def _git(tree: Path, *args: str, text: bool = True):
    try:
        return git.run(tree, *args, timeout=120, text=text)
    except ProcessError as err:
        raise DeviceCheckError(f"git {' '.join(args)} in {tree} failed: {err.stderr_tail.strip()[-500:]}",
                               hint="the host CPU stages need the work tree of `make patch` (branch mla-port-base)")


def stack_patches(templates_dir: Path, patches_dir: Path, stack: str) -> list[Path]:
    """The exported patch files of `stack`'s commits, in series order."""
    series = load_series(templates_dir)
    names = (Path(patches_dir) / "series").read_text().split()
    slugs = list(series.slugs())
    if len(names) != len(slugs):
        raise DeviceCheckError(f"{patches_dir}/series lists {len(names)} patches, the templates {len(slugs)} commits",
                               hint="run `make patch` (patches/ and templates/ disagree)")
    return [Path(patches_dir) / names[slugs.index(slug)] for slug in series.stack(stack).commits]


def prepare_variants(tree: Path, templates_dir: Path, patches_dir: Path, dest: Path, keep,
                     stacks=VARIANT_STACKS) -> dict:
    """variants/ (module doc) in dest; `keep(rel)` says which paths the pruned tree has."""
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    base_sha = _git(tree, "rev-parse", "mla-port-base").strip()
    diff = _git(tree, "diff", "--name-status", "--no-renames", base_sha, "HEAD")
    changed = [ln.split("\t") for ln in diff.splitlines()]
    manifest: dict = {"base_sha": base_sha, BASE: {"files": [], "delete": []}, "stacks": {}}
    for status, rel in changed:
        if not keep(rel):
            continue
        if status == "A":
            manifest[BASE]["delete"].append(rel)
            continue
        out = dest / BASE / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(_git(tree, "show", f"{base_sha}:{rel}", text=False))
        manifest[BASE]["files"].append(rel)
    series = load_series(templates_dir)
    for name in stacks:
        patches = stack_patches(templates_dir, patches_dir, name)
        with tempfile.TemporaryDirectory() as tmp:        # outside any repository: git apply as patch(1)
            for rel in manifest[BASE]["files"]:
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(dest / BASE / rel, Path(tmp) / rel)
            touched = set()
            for p in patches:
                touched |= {ln[len("+++ b/"):].strip() for ln in p.read_text(errors="replace").splitlines()
                            if ln.startswith("+++ b/")}
                try:
                    git.run(tmp, "apply", "-p1", str(p.resolve()), timeout=120)
                except ProcessError as err:
                    raise DeviceCheckError(f"{p.name} does not apply on the base's files: {err.stderr_tail[-800:]}",
                                           hint="run `make check` (a stack's commits must apply alone on the base)")
            files = sorted(rel for rel in touched if keep(rel))
            for rel in files:
                out = dest / name / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(tmp) / rel, out)
        bench = series.stack(name).bench
        manifest["stacks"][name] = {"files": files, "patches": [p.name for p in patches],
                                    "bench": None if bench is None else {
                                        k: (list(v) if isinstance(v, tuple) else v)
                                        for k, v in bench.__dict__.items() if v is not None}}
    write_json(dest / "variants.json", manifest, indent=1)
    return manifest


# ---------------------------------------------------------------------- run (the device)

def _file_of(variants: Path, manifest: dict, name: str, rel: str) -> Path | None:
    """The content `rel` has in variant `name` (None: absent there)."""
    if name != BASE and rel in manifest["stacks"][name]["files"]:
        return variants / name / rel
    if rel in manifest[BASE]["delete"]:
        return None
    return variants / BASE / rel


def set_variant(tree: Path, variants: Path, manifest: dict, name: str, current: str | None) -> list[str]:
    """Turn `tree` (the patched tree, current=None, or variant `current`) into variant `name`;
    the files rewritten (a rewrite is newer than its object: Ninja recompiles exactly those)."""
    if current is None:
        files = set(manifest[BASE]["files"]) | set(manifest[BASE]["delete"])
    else:
        files = {rel for v in {current, name} - {BASE} for rel in manifest["stacks"][v]["files"]}
    written = []
    for rel in sorted(files):
        src, dst = _file_of(variants, manifest, name, rel), tree / rel
        if src is None:
            if dst.exists():
                dst.unlink()
                written.append(rel)
        elif not dst.is_file() or dst.read_bytes() != src.read_bytes():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            written.append(rel)
    return written


def bins_dir(work: Path, name: str) -> Path:
    return Path(work) / "cpu-bins" / name


def build_variants(bundle: Path, work: Path, jobs: int, names, log=print) -> None:
    """The background builder (module doc): base first, then each stack of `names`."""
    variants, work = Path(bundle) / "variants", Path(work)
    manifest = json.loads((variants / "variants.json").read_text())
    tree, build = work / "cpu" / "llama.cpp", work / "cpu" / "build"
    state = work / "cpu" / "variant.txt"
    if not (tree / "CMakeLists.txt").is_file():
        with tarfile.open(Path(bundle) / "llama.cpp.tar.gz") as tar:
            tar.extractall(work / "cpu", filter="data")
        state.unlink(missing_ok=True)
    current = state.read_text().strip() if state.is_file() else None
    for name in [BASE, *[n for n in names if n != BASE]]:
        out = bins_dir(work, name)
        if (out / "done.json").is_file():
            continue
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            written = set_variant(tree, variants, manifest, name, current)
            current = name
            state.write_text(name)
            ensure_build(tree, build, CPU_TARGETS, cmake_args=CPU_CMAKE_ARGS, jobs=jobs, echo=False, rpc=False)
            shutil.copy2(build / "bin" / "llama-bench", out / "llama-bench")
        except PortError as err:
            write_json(out / "failed.json", {"error": str(err), "seconds": round(time.monotonic() - t0, 1)})
            raise
        write_json(out / "done.json", {"seconds": round(time.monotonic() - t0, 1), "rewritten": written,
                                       "cmake_args": list(CPU_CMAKE_ARGS)})
        log(f"variant {name}: built in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit("usage: python -m llamacpp_mla_port.device.variants BUNDLE WORK JOBS [STACK...]")
    build_variants(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
