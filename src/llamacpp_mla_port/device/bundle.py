"""The GPU check (`make device-check`): prepared here, run on a device machine.

A device machine has no network, 64 MiB of carried files and 15 minutes of device time, so the
check is made in two halves. PREPARE (this machine, `prepare_bundle`): one self-contained
folder, work/device-bundle/ (ignored by git, carried as it is): the pruned patched tree, the CPU
variants, the v_b overlay, the wheels the device lacks, this package, the fixtures made with the
pinned converter, and the driver run.sh. RUN (the device, or this machine with CUDA off:
DRY_RUN=1; device.check.run_check): the STAGES offline inside a time budget, writing report.json
and report.md after every stage. What each part and stage is: docs/device-check.md ("Prepare:
the bundle", "Run: the stages").
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import sys
import tarfile
import time
from importlib.metadata import version
from pathlib import Path

from llamacpp_mla_port.build import TARGET_SETS
from llamacpp_mla_port.device.variants import prepare_variants
from llamacpp_mla_port.errors import DeviceCheckError, ProcessError
from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
from llamacpp_mla_port.process import git, run
from llamacpp_mla_port.proof.lossless import ALL_DRAFTS, prepare_pair
from llamacpp_mla_port.proof.parity import MODES, PARITY_CONFIGS, make_draft
from llamacpp_mla_port.proof.reference.model import read_target_head
from llamacpp_mla_port.jsonfile import write_json

# the bundle and the dry run's report: project.Places.device_bundle / device_dry_out
#: what one device call carries at most: the working tree and the carried folders together
CARRY_LIMIT = 64 * 2**20
DEVICE_COMMAND = "bash work/device-bundle/run.sh"
DEVICE_CALL = f'run(command="{DEVICE_COMMAND}", carry=["work/device-bundle"], timeout_s=560)'
#: the device's wall-clock budget for the whole driver (the call's 560 s leave room to stop)
DEVICE_BUDGET_S = 540
#: the second call, at once while the machine is warm: the stages the first could not fit
SECOND_CALL = (f'run(command="MLA_STAGES=STAGES MLA_BUDGET_S=B {DEVICE_COMMAND}", carry=["work/device-bundle"], '
               'timeout_s=B+20)')

#: libllama and its ggml libraries: every proof program links them
BASE_TARGETS = ("llama",)
#: what a stage runs besides the proof programs
STAGE_TARGETS = {"archs": ("test-llama-archs",), "lossless": TARGET_SETS["smoke"]}
CUDA_CMAKE_ARGS = ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=native")
#: offline: no UI download at build time (the server runs --no-webui)
COMMON_CMAKE_ARGS = ("-DLLAMA_USE_PREBUILT_UI=OFF",)
GPU_DEVICE = "CUDA0"
PLACEMENT_ARGS = ("-ngl", "99", "-ngld", "99")
#: the draft K/V cache type the lossless stage also runs (upstream #25725: a quantized draft
#: cache lost almost all acceptance on other drafts)
QUANTIZED_DRAFT_CACHE = "q8_0"
#: the check's stages in the order it runs them (device.check.run_check; module doc)
STAGES = ("build", "fallback", "archs", "parity", "realsize", "host", "threads", "vb-forms", "lossless")
#: the stages of a plain run, in priority order (issue 46): parity and the block's profile, the
#: host CPU, the thread rows
DEFAULT_STAGES = ("build", "fallback", "archs", "parity", "realsize", "host", "threads")
NOT_CHOSEN_WHY = {"vb-forms": "answered on 2026-12-04 (the series' form 7 % faster on the H200)",
                  "lossless": "answered on 2026-12-04 (0 mismatches in 24 settings)"}
#: about how long each stage after the build needs: one with less of the budget left is skipped
STAGE_NEEDS_S = {"fallback": 15, "archs": 10, "parity": 60, "realsize": 40, "host": 40, "threads": 30,
                 "vb-forms": 60, "lossless": 60}

# ----------------------------------------------------------------------- the pruned tree

#: top-level entries of the patched tree the check reads (CMake, sources, the converter)
TREE_KEEP = ("CMakeLists.txt", "CMakePresets.json", "LICENSE", "licenses", "cmake", "common", "examples", "pocs", "app",
             "ggml", "include", "src", "tests", "tools", "vendor", "scripts", "gguf-py", "conversion",
             "convert_hf_to_gguf.py", "requirements", "requirements.txt", "pyproject.toml")
#: below those, what no configure or build of the check reads: other backends (their options
#: are off), the web UI's sources (LLAMA_BUILD_UI is off), tests' data, benchmark outputs
TREE_DROP = tuple(f"ggml/src/ggml-{b}/" for b in (
    "sycl", "vulkan", "opencl", "hexagon", "metal", "cann", "openvino", "webgpu", "et", "virtgpu",
    "musa", "hip", "zdnn", "zendnn", "kompute")) + (
    "tools/server/tests/", "tools/server/webui/", "scripts/snapdragon/", "examples/model-conversion/")
#: kept inside a dropped folder: CMake reads it at configure time
TREE_DROP_EXCEPT = ("tools/ui/CMakeLists.txt", "tools/ui/ui.h.in", "tools/ui/ui.cpp.in", "tools/ui/sources.cmake")
TREE_DROP_DIRS_BUT_CMAKE = ("tools/ui/",)

#: the series' attention call: v_b and wo inside build_attn (deepseek2.cpp's MLA form)
SERIES_V_B = ("        cur = build_attn(inp_attn, layer.wo, nullptr, layer.wo_s, Qcur, Kcur, Vcur, nullptr, nullptr, "
              "layer.wv_b, kq_scale, il);\n")
#: the other form, timed beside it: v_b as a 4-D broadcast matvec after the attention, then wo
BROADCAST_V_B = ("        // device check only (not the series): v_b as a 4-D broadcast matvec per (head, token)\n"
                 "        cur = build_attn(inp_attn, nullptr, nullptr, nullptr, Qcur, Kcur, Vcur, nullptr, nullptr, "
                 "nullptr, kq_scale, il);\n"
                 "        cur = ggml_reshape_4d(ctx0, cur, kv_lora_rank, 1, n_head, n_tokens);\n"
                 "        cur = ggml_mul_mat(ctx0, layer.wv_b, cur);\n"
                 "        cb(cur, \"attn_out_v_b\", il);\n"
                 "        cur = ggml_reshape_2d(ctx0, cur, cur->ne[0] * n_head, n_tokens);\n"
                 "        cur = build_lora_mm(layer.wo, cur, layer.wo_s);\n")
DFLASH_SOURCE = "src/models/dflash.cpp"


def tree_files(tree: Path) -> list[str]:
    """Relative paths of the pruned copy: tracked files (git) or every file, filtered."""
    tree = Path(tree)
    try:
        listed = git.run(tree, "ls-files", "-z", timeout=120, text=False)
    except ProcessError:
        listed = b""
    if listed:
        names = [n for n in listed.decode().split("\0") if n]
    else:
        names = [str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file() and ".git" not in p.parts]
    return sorted(n for n in names if keep_in_tree(n) and (tree / n).is_file())


def keep_in_tree(rel: str) -> bool:
    if rel in TREE_DROP_EXCEPT:
        return True
    top = rel.split("/", 1)[0]
    if top not in TREE_KEEP or "/.git/" in f"/{rel}" or rel.startswith(".git"):
        return False
    return not any(rel.startswith(d) for d in TREE_DROP + TREE_DROP_DIRS_BUT_CMAKE)


def _tar_add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def write_tree_tarball(tree: Path, out: Path) -> dict:
    """The pruned tree as a deterministic tar.gz (sorted, mtime 0); its sizes."""
    files = tree_files(tree)
    if "CMakeLists.txt" not in files or DFLASH_SOURCE not in files:
        raise DeviceCheckError(f"{tree}: not a patched llama.cpp tree (no CMakeLists.txt or {DFLASH_SOURCE})",
                               hint="run `make patch` (or point MLA_PORT_TREE at a patched tree)")
    raw = 0
    by_top: dict[str, int] = {}
    with open(out, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        for rel in files:
            data = (Path(tree) / rel).read_bytes()
            mode = 0o755 if os.access(Path(tree) / rel, os.X_OK) else 0o644
            _tar_add_bytes(tar, f"llama.cpp/{rel}", data, mode)
            raw += len(data)
            top = rel.split("/")[0] if "/" in rel else "."
            if rel.startswith("ggml/src/") and rel.count("/") > 2:
                top = "/".join(rel.split("/")[:3])
            by_top[top] = by_top.get(top, 0) + len(data)
    return {"files": len(files), "bytes_uncompressed": raw, "bytes": out.stat().st_size,
            "uncompressed_by_folder": dict(sorted(by_top.items(), key=lambda kv: -kv[1]))}


def broadcast_dflash_source(text: str) -> str:
    """dflash.cpp with v_b in the 4-D broadcast form; the series' build_attn call must occur exactly once."""
    n = text.count(SERIES_V_B)
    if n != 1:
        raise DeviceCheckError(f"{DFLASH_SOURCE}: the MLA graph's build_attn call occurs {n} times (1 expected)",
                               hint="the MLA graph moved: update device/bundle.py's SERIES_V_B to the new line")
    return text.replace(SERIES_V_B, BROADCAST_V_B)


# ---------------------------------------------------------------------- wheels and sizes

#: Python distributions the device lacks (its image has numpy, torch, safetensors,
#: sentencepiece, pyyaml, tqdm, jinja2; not gguf, not GitPython: the check imports no git)
DEVICE_MISSING = ("gguf",)
PIP_PLATFORM_ARGS = ("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                     "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                     "--platform", "manylinux2014_x86_64", "--platform", "any")


def fetch_wheels(dest: Path, cache: Path, log=print) -> list[dict]:
    """The wheels of DEVICE_MISSING at the versions installed here: pip download into `cache`
    (kept between runs), copied into dest. No network and no cached wheel: DeviceCheckError."""
    dest.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for name in DEVICE_MISSING:
        want = f"{name}=={version(name)}"
        pattern = f"{name.replace('-', '_')}-{version(name)}-*.whl"
        have = sorted(cache.glob(pattern))
        if not have:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *PIP_PLATFORM_ARGS, "-d", str(cache), want]
            proc = run(cmd, timeout=300)
            have = sorted(cache.glob(pattern))
            if proc.returncode != 0 or not have:
                raise DeviceCheckError(f"pip could not download {want}: {proc.stderr.strip()[-800:]}",
                                       hint=f"put the wheel into {cache} (pip download {want} elsewhere)")
        shutil.copy2(have[0], dest / have[0].name)
        out.append({"requirement": want, "wheel": have[0].name, "bytes": have[0].stat().st_size})
        log(f"device-check: wheel {have[0].name} ({have[0].stat().st_size} B)")
    return out


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


def travelling_tree_bytes(root: Path) -> int | None:
    """Bytes of what a device call sends besides the carried folders: tracked and untracked,
    not ignored files of the checkout (None: not a git checkout)."""
    try:
        listed = git.run(root, "ls-files", "-z", "-co", "--exclude-standard", timeout=120, text=False)
    except ProcessError:
        return None
    paths = [Path(root) / n for n in listed.decode().split("\0") if n]
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


# ------------------------------------------------------------------------------- prepare

def _copy_package(dest: Path) -> int:
    """This project's package source (the running one) into dest/llamacpp_mla_port."""
    src = Path(__file__).resolve().parents[1]
    target = dest / src.name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return folder_bytes(target)


def make_fixtures(tree: Path, build: Path, dest: Path, n_prompts: int, log=print) -> dict:
    """The tiny fixtures that need the pinned converter, made here (the device reuses them):
    the Kimi-K3 target, every parity checkpoint + draft, the lossless drafts."""
    dest.mkdir(parents=True, exist_ok=True)
    target = write_kimi_k3_target(build, dest / "kimi-k3-target.gguf")
    embd, _ = read_target_head(target)
    vocab, hidden = embd.shape
    for pcfg in PARITY_CONFIGS:
        for weights in sorted({m.weights for m in MODES}):
            make_draft(tree, dest / "parity", pcfg, hidden, vocab, weights)
    # the converter's helper folder is not needed once the draft exists
    for tok in (dest / "parity").glob("*/target-tokenizer"):
        shutil.rmtree(tok)
    scratch = dest.parent / "lossless-scratch"
    pair = prepare_pair(tree, build, scratch, target, n_prompts, draft_names=ALL_DRAFTS)
    for name, draft in pair.drafts.items():
        (dest / "lossless" / f"draft-{name}").mkdir(parents=True, exist_ok=True)
        shutil.copy2(draft, dest / "lossless" / f"draft-{name}" / "draft.gguf")
    shutil.rmtree(scratch)
    log(f"device-check: fixtures in {dest} ({folder_bytes(dest)} B)")
    return {"bytes": folder_bytes(dest), "lossless_prompts": n_prompts, "bigram_entries": pair.bigram_entries}


RUN_SH = r"""#!/usr/bin/env bash
# The GPU check's driver (written by `llamacpp-mla-port device-check`; see README.md here).
#   on the device:        bash work/device-bundle/run.sh        (report under $OUT)
#   dry run, CUDA off:    DRY_RUN=1 bash work/device-bundle/run.sh   (report under work/device-check)
# Offline: the wheels here are installed into a scratch folder, the package runs from src/.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${MLA_PYTHON:-python3}"
DRY="${DRY_RUN:-0}"
if [ "$DRY" = 1 ]; then
    OUT_DIR="${MLA_DEVICE_OUT:-$HERE/../device-check}"
    WORK="${MLA_DEVICE_WORK:-$OUT_DIR/run}"
else
    OUT_DIR="${OUT:-${MLA_DEVICE_OUT:-$HERE/../device-check}}"
    WORK="${MLA_DEVICE_WORK:-/tmp/mla-device-check}"
fi
mkdir -p "$OUT_DIR" "$WORK/site" || exit 1
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
    "$HERE"/wheels/*.whl || { echo "device-check: installing the wheels failed" >&2; exit 1; }
export PYTHONPATH="$HERE/src:$WORK/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
ARGS=(--run --bundle "$HERE" --out "$OUT_DIR" --work "$WORK")
[ "$DRY" = 1 ] && ARGS+=(--dry-run)
[ -n "${MLA_STAGES:-}" ] && ARGS+=(--stages "$MLA_STAGES")
[ -n "${MLA_BUDGET_S:-}" ] && ARGS+=(--budget "$MLA_BUDGET_S")
exec "$PY" -m llamacpp_mla_port device-check "${ARGS[@]}"
"""


def bundle_readme(manifest: dict) -> str:
    s = manifest["sizes"]
    lines = ["# The GPU check bundle (made by `make device-check`)", "",
             "Run it on a device machine with exactly this call (~9 minutes of device time):", "",
             "```", DEVICE_CALL, "```", "",
             "In priority order it builds the pruned patched tree with CUDA, checks that the draft's graphs",
             "run on the GPU, judges parity like with like (the draft's GPU logits against its CPU logits,",
             "bounded by what the same modes do to deepseek2's MLA, with gross controls), times the",
             "real-size block against the HBM floor with a per-node profile, then describes the host CPU",
             "(lscpu, AMX, the #18099 reproducer) and runs the CPU stacks' llama-bench rows at 16, 8, 4",
             "and 1 threads; the CPU builds those need run in the background meanwhile. report.json,",
             "report.md, logs.tar.gz and thread-rows.jsonl come back under $OUT; the reply's tail shows",
             "the markdown report. A stage the budget could not fit is listed as not run: rerun those",
             "at once, while the machine is warm (its builds in /tmp are reused), with the seconds left",
             "(B, about what `status` gives minus a minute; STAGES as the report lists them):", "",
             "```", SECOND_CALL, "```", "",
             "On a CPU machine: `make device-check DRY_RUN=1` runs the same steps with CUDA off.", "",
             "| part | bytes |", "|---|---|"]
    for key, value in s.items():
        lines.append(f"| {key} | {value:,} |")
    lines.append("")
    return "\n".join(lines)


def prepare_bundle(tree: Path, build: Path, bundle: Path, templates_dir: Path, patches_dir: Path,
                   repo_root: Path | None = None, wheel_cache: Path | None = None, n_prompts: int = 8,
                   fixtures: bool = True, log=print) -> dict:
    """Write the bundle (module doc) into `bundle` (replaced); its manifest. Fails when what
    one device call would carry (the bundle + the checkout's travelling files) is over 64 MiB.
    `fixtures=False` leaves out the converted fixtures (minutes of converter runs; tests)."""
    tree, build, bundle = Path(tree).resolve(), Path(build).resolve(), Path(bundle).resolve()
    t0 = time.monotonic()
    if bundle.exists():
        shutil.rmtree(bundle)
    bundle.mkdir(parents=True)
    tar = write_tree_tarball(tree, bundle / "llama.cpp.tar.gz")
    log(f"device-check: pruned tree {tar['files']} files, {tar['bytes_uncompressed']:,} B -> "
        f"{tar['bytes']:,} B compressed")
    variants = prepare_variants(tree, templates_dir, patches_dir, bundle / "variants", keep_in_tree)
    log(f"device-check: CPU variants: base ({len(variants['base']['files'])} files), "
        + ", ".join(f"{k} ({len(v['files'])})" for k, v in variants["stacks"].items()))
    overlay = bundle / "overlay" / "broadcast" / DFLASH_SOURCE
    overlay.parent.mkdir(parents=True)
    overlay.write_text(broadcast_dflash_source((tree / DFLASH_SOURCE).read_text()))
    cache = Path(wheel_cache) if wheel_cache else bundle.parent / "device-wheels"
    wheels = fetch_wheels(bundle / "wheels", cache, log=log)
    pkg = _copy_package(bundle / "src")
    if fixtures:
        fixtures = make_fixtures(tree, build, bundle / "fixtures", n_prompts, log=log)
    else:
        (bundle / "fixtures").mkdir()
        fixtures = {"bytes": 0, "left_out": True}
    (bundle / "run.sh").write_text(RUN_SH)
    (bundle / "run.sh").chmod(0o755)
    try:
        tree_head = git.run(tree, "log", "-1", "--format=%H %s", timeout=120).strip()
    except ProcessError:
        tree_head = ""              # not a git work tree
    sizes = {"llama.cpp.tar.gz": tar["bytes"], "variants": folder_bytes(bundle / "variants"),
             "overlay": folder_bytes(bundle / "overlay"), "wheels": folder_bytes(bundle / "wheels"), "src": pkg,
             "fixtures": fixtures["bytes"], "run.sh": (bundle / "run.sh").stat().st_size}
    manifest = {"tree": str(tree), "tree_head": tree_head, "build_used_for_fixtures": str(build),
                "tree_tarball": tar, "wheels": wheels, "fixtures": fixtures, "sizes": sizes,
                "device_call": DEVICE_CALL, "lossless_prompts": n_prompts}
    (bundle / "README.md").write_text(bundle_readme(manifest))
    write_json(bundle / "MANIFEST.json", manifest, indent=1)
    others = travelling_tree_bytes(repo_root) if repo_root else None
    manifest.update(checkout_travelling_bytes=others, carry_limit_bytes=CARRY_LIMIT,
                    seconds=round(time.monotonic() - t0, 1))
    total = -1
    while total != folder_bytes(bundle):       # the manifest counts itself: write until it is stable
        total = folder_bytes(bundle)
        manifest.update(bundle_bytes=total, carried_total_bytes=total + (others or 0))
        write_json(bundle / "MANIFEST.json", manifest, indent=1)
    if manifest["carried_total_bytes"] > CARRY_LIMIT:
        raise DeviceCheckError(f"the device call would carry {manifest['carried_total_bytes']:,} B "
                               f"(bundle {total:,} + checkout {others or 0:,}), over {CARRY_LIMIT:,}",
                               hint="prune more of the tree (TREE_DROP) or ignore large untracked files")
    return manifest
