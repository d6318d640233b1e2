"""The GPU check (`make device-check`): the pair on a CUDA device, prepared here, run there.

No figure of this project comes from a GPU yet. The accelerator machine a task may be lent
has no network, 64 MiB of carried files and 15 minutes of device time, so the check is
made in two halves:

PREPARE (this machine, `prepare_bundle`): one self-contained folder, work/device-bundle/
(ignored by git, carried as it is):
  llama.cpp.tar.gz   a pruned copy of the patched tree: what CMake needs to configure and
                     build the check's targets with CUDA (no .git, docs, models, media, other
                     GPU backends' sources, the web UI's sources)
  overlay/permuted/  the same tree's src/models/dflash.cpp with v_b in the permuted-GEMM form
                     (upstream build_attn's; the series keeps the 4-D broadcast matvec form,
                     faster on the CPU): built only for the timing, the series is unchanged
  wheels/            the Python packages the device lacks (gguf), as wheels
  src/               this project's package (the driver, the reference, the generators)
  fixtures/          the tiny fixtures the CPU made with the pinned converter (its
                     transformers pin is not on the device): the Kimi-K3 target, the parity
                     checkpoints and drafts, the lossless drafts; the rest is made there
  run.sh             the driver; MANIFEST.json the sizes; README.md the call to make

RUN (the device, or this machine with CUDA off: DRY_RUN=1; `run_check`), offline, inside a
time budget (9 minutes on 16 cores and one H200), writing report.json and report.md under
$OUT (device) or work/device-check/ (dry run) after every stage:
  build     the pruned tree, -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native (dry run:
            CUDA off), only CHECK_TARGETS
  fallback  the scheduler's splits (GGML_SCHED_DEBUG=2, proof.splits) of the draft's graphs
            on the GPU, with a draft of the real 512 + 64 latent (flash attention off/on,
            F16 and Q8_0 cache) and, in `realsize`, the real-size draft: any node on the CPU
            except the host-side token/Markov row lookups is a fallback
  parity    proof.parity's whole matrix with draft and target on the GPU; judged per mode by
            `judge_mode` (the CPU bound where the run meets it, like with like; else the
            largest bound the controls allow, with its measured headroom)
  lossless  proof.lossless with `-ngl 99 -ngld 99` (llama-speculative-simple, llama-server -np 2)
  realsize  the real-size draft block (random weights written there) timed by draft-bench on
            the GPU against the HBM floor (bench.floors' bytes / the copy bandwidth measured
            in the same run), for both v_b forms; the permuted build also passes the F32
            parity of one shape before its time counts
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

from llamacpp_mla_port.errors import DeviceCheckError, PortError

BUNDLE_REL = Path("work") / "device-bundle"
DRY_OUT_REL = Path("work") / "device-check"
#: what one device call carries at most: the working tree and the carried folders together
CARRY_LIMIT = 64 * 2**20
DEVICE_COMMAND = "bash work/device-bundle/run.sh"
DEVICE_CALL = f'run(command="{DEVICE_COMMAND}", carry=["work/device-bundle"], timeout_s=560)'
#: the device's wall-clock budget for the whole driver (the call's 560 s leave room to stop)
DEVICE_BUDGET_S = 540

CHECK_TARGETS = ("llama-server", "llama-simple", "llama-speculative-simple", "test-llama-archs")
CUDA_CMAKE_ARGS = ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=native")
#: offline: no UI download at build time (the server runs --no-webui)
COMMON_CMAKE_ARGS = ("-DLLAMA_USE_PREBUILT_UI=OFF",)
GPU_DEVICE = "CUDA0"
PLACEMENT_ARGS = ("-ngl", "99", "-ngld", "99")
STAGES = ("build", "fallback", "parity", "lossless", "realsize")

# ---------------------------------------------------------------------------------------
# the pruned tree

#: top-level entries of the patched tree the check reads (CMake, sources, the converter)
TREE_KEEP = ("CMakeLists.txt", "CMakePresets.json", "LICENSE", "licenses", "cmake", "common", "examples", "pocs",
             "app", "ggml",
             "include", "src", "tests", "tools", "vendor", "scripts", "gguf-py", "conversion",
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

BROADCAST_V_B = ("        cur = ggml_reshape_4d(ctx0, cur, kv_lora_rank, 1, n_head, n_tokens);\n"
                 "        cur = ggml_mul_mat(ctx0, layer.wv_b, cur);\n")
PERMUTED_V_B = ("        // device check only (not the series): build_attn's permuted-GEMM form, n_tokens in dim 1\n"
                "        cur = ggml_reshape_3d(ctx0, cur, kv_lora_rank, n_head, n_tokens);\n"
                "        cur = ggml_mul_mat(ctx0, layer.wv_b, ggml_permute(ctx0, cur, 0, 2, 1, 3));\n"
                "        cur = ggml_cont(ctx0, ggml_permute(ctx0, cur, 0, 2, 1, 3));\n")
DFLASH_SOURCE = "src/models/dflash.cpp"


def tree_files(tree: Path) -> list[str]:
    """Relative paths of the pruned copy: tracked files (git) or every file, filtered."""
    tree = Path(tree)
    proc = subprocess.run(["git", "-C", str(tree), "ls-files", "-z"], capture_output=True)
    if proc.returncode == 0 and proc.stdout:
        names = [n for n in proc.stdout.decode().split("\0") if n]
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
    import gzip
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


def permuted_dflash_source(text: str) -> str:
    """dflash.cpp with v_b in the permuted-GEMM form; the broadcast form must occur exactly once."""
    n = text.count(BROADCAST_V_B)
    if n != 1:
        raise DeviceCheckError(f"{DFLASH_SOURCE}: the 4-D broadcast v_b product occurs {n} times (1 expected)",
                               hint="the MLA graph moved: update proof/device.py's BROADCAST_V_B to the new lines")
    return text.replace(BROADCAST_V_B, PERMUTED_V_B)


# ---------------------------------------------------------------------------------------
# wheels and sizes

#: Python distributions the device lacks (its image has numpy, torch, safetensors,
#: sentencepiece, pyyaml, tqdm, jinja2; not gguf, not GitPython: the check imports no git)
DEVICE_MISSING = ("gguf",)
PIP_PLATFORM_ARGS = ("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                     "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                     "--platform", "manylinux2014_x86_64", "--platform", "any")


def fetch_wheels(dest: Path, cache: Path, log=print) -> list[dict]:
    """The wheels of DEVICE_MISSING at the versions installed here: pip download into `cache`
    (kept between runs), copied into dest. No network and no cached wheel: DeviceCheckError."""
    from importlib.metadata import version

    dest.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for name in DEVICE_MISSING:
        want = f"{name}=={version(name)}"
        pattern = f"{name.replace('-', '_')}-{version(name)}-*.whl"
        have = sorted(cache.glob(pattern))
        if not have:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *PIP_PLATFORM_ARGS, "-d", str(cache), want]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
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
    proc = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
                          capture_output=True)
    if proc.returncode != 0:
        return None
    total = 0
    for n in proc.stdout.decode().split("\0"):
        p = Path(root) / n
        if n and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


# ---------------------------------------------------------------------------------------
# prepare

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
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
    from llamacpp_mla_port.proof.lossless import prepare_pair
    from llamacpp_mla_port.proof.parity import MODES, PARITY_CONFIGS, make_draft
    from llamacpp_mla_port.proof.reference import read_target_head

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
    pair = prepare_pair(tree, build, scratch, target, n_prompts)
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
    lines = [
        "# The GPU check bundle (made by `make device-check`)",
        "",
        "Run it on a device machine with exactly this call (one call, ~9 minutes of device time):",
        "",
        "```",
        DEVICE_CALL,
        "```",
        "",
        "It builds the pruned patched tree with CUDA (native architecture only), runs the parity",
        "matrix and the lossless runs with target and draft on the GPU, checks the scheduler's",
        "splits for CPU fallbacks and times the real-size draft block against the HBM floor for",
        "both v_b forms. It writes report.json and report.md under $OUT; the reply's tail shows",
        "the markdown report (logs.tar.gz beside it). A stage the budget could not fit is listed",
        "as not run; rerun it at once, while the machine is warm (its build in /tmp is reused):",
        "",
        "```",
        f'run(command="MLA_STAGES=lossless {DEVICE_COMMAND}", carry=["work/device-bundle"], timeout_s=300)',
        "```",
        "",
        "On a CPU machine: `make device-check DRY_RUN=1` runs the same steps with CUDA off.",
        "",
        "| part | bytes |",
        "|---|---|",
    ]
    for key, value in s.items():
        lines.append(f"| {key} | {value:,} |")
    lines.append("")
    return "\n".join(lines)


def prepare_bundle(tree: Path, build: Path, bundle: Path, repo_root: Path | None = None,
                   wheel_cache: Path | None = None, n_prompts: int = 8, fixtures: bool = True, log=print) -> dict:
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
    overlay = bundle / "overlay" / "permuted" / DFLASH_SOURCE
    overlay.parent.mkdir(parents=True)
    overlay.write_text(permuted_dflash_source((tree / DFLASH_SOURCE).read_text()))
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
    tree_head = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%H %s"], capture_output=True,
                               text=True).stdout.strip()
    sizes = {"llama.cpp.tar.gz": tar["bytes"], "overlay": folder_bytes(bundle / "overlay"),
             "wheels": folder_bytes(bundle / "wheels"), "src": pkg, "fixtures": fixtures["bytes"],
             "run.sh": (bundle / "run.sh").stat().st_size}
    manifest = {"tree": str(tree), "tree_head": tree_head, "build_used_for_fixtures": str(build),
                "tree_tarball": tar, "wheels": wheels, "fixtures": fixtures, "sizes": sizes,
                "device_call": DEVICE_CALL, "lossless_prompts": n_prompts}
    (bundle / "README.md").write_text(bundle_readme(manifest))
    (bundle / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    others = travelling_tree_bytes(repo_root) if repo_root else None
    manifest.update(checkout_travelling_bytes=others, carry_limit_bytes=CARRY_LIMIT,
                    seconds=round(time.monotonic() - t0, 1))
    total = -1
    while total != folder_bytes(bundle):       # the manifest counts itself: write until it is stable
        total = folder_bytes(bundle)
        manifest.update(bundle_bytes=total, carried_total_bytes=total + (others or 0))
        (bundle / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if manifest["carried_total_bytes"] > CARRY_LIMIT:
        raise DeviceCheckError(f"the device call would carry {manifest['carried_total_bytes']:,} B "
                               f"(bundle {total:,} + checkout {others or 0:,}), over {CARRY_LIMIT:,}",
                               hint="prune more of the tree (TREE_DROP) or ignore large untracked files")
    return manifest


# ---------------------------------------------------------------------------------------
# judging a parity mode on another backend

#: a gross control must land this far above a bound; a bound the 1 % control is judged by
#: sits at least SUBTLE_MARGIN below it
GROSS_MARGIN = 100.0
SUBTLE_MARGIN = 2.0


def control_limit(row: dict) -> float:
    """The largest bound under which the controls are still caught: the nearest gross control
    / 100 and the attention scale 1 % off / 2 (parity.mode_table row)."""
    return min(row["nearest_gross_control"]["nmse"] / GROSS_MARGIN, row["kq_scale_1pct"] / SUBTLE_MARGIN)


def judge_mode(row: dict, backend: str, figure: float | None = None) -> dict:
    """Judge one mode's worst figure (or `figure`, e.g. a control's, which must fail).

    CPU: the README's bound. Another backend: the same bound where the figure meets it
    (like with like: that backend rounds as the CPU emulation does, within the CPU's own
    headroom); otherwise the bound is the control limit (measured in the same run), and the
    figure passes only under it: the controls are then still caught. `suggested_bound` is
    10x the figure (the project's rule for a bound measured on one machine), `suggested_ok`
    whether that bound still catches the controls.
    """
    worst = row["worst_nmse"] if figure is None else figure
    limit = control_limit(row)
    cpu_bound = row["threshold"]
    if backend == "cpu" or worst <= cpu_bound:
        bound, basis = cpu_bound, "the CPU bound (like with like)"
    else:
        bound, basis = limit, "control limit: min(nearest gross / 100, 1 % scale / 2), measured in this run"
    cost_ok = row.get("cost_bound") is None or row["worst_nmse_vs_float64"] <= row["cost_bound"]
    ok = bool(worst <= bound and bound <= limit and cost_ok)
    return {"figure": worst, "bound": bound, "basis": basis, "control_limit": limit,
            "headroom": (bound / worst) if worst > 0 else None, "cost_ok": cost_ok,
            "suggested_bound": 10 * worst, "suggested_ok": bool(10 * worst <= limit), "ok": ok}


def judge_parity(report: dict, backend: str) -> dict:
    """Every mode of a parity report (proof.parity) on `backend`; the chains' verdicts from
    the cases (a flipped near-tie is allowed, as on the CPU)."""
    out = {}
    for name, row in report["modes"].items():
        j = judge_mode(row, backend)
        cases = [c for cfg in report["configs"].values() for c in cfg["modes"].get(name, {}).get("cases", [])]
        j["chains_ok"] = all(c["chain_ok"] for c in cases)
        j["chains_equal"] = sum(c["chain_equal"] for c in cases)
        j["cases"] = len(cases)
        j["controls_fail"] = {k: not judge_mode(row, backend, v)["ok"]
                              for k, v in (("nearest_gross", row["nearest_gross_control"]["nmse"]),
                                           ("kq_scale_1pct", row["kq_scale_1pct"]))}
        j["ok"] = bool(j["ok"] and j["chains_ok"] and all(j["controls_fail"].values()))
        j.update({k: row[k] for k in ("compared", "worst_nmse_end_to_end", "worst_nmse_vs_float64",
                                      "nearest_gross_control", "kq_scale_1pct")})
        j["cpu_bound"] = row["threshold"]
        out[name] = j
    return out


# ---------------------------------------------------------------------------------------
# the real-size models and the floor

#: the real config's DeepSeek-YaRN factor (fixtures.checkpoint.K3_DSPARK_REAL_CONFIG)
REAL_YARN_FACTOR = 32.0


def realsize_config(reduced: bool) -> dict:
    """fixtures.draft_gguf config of the real draft (or the dry run's reduced one: the real
    latent 512 + 64, everything else smaller) and the target's width and vocabulary."""
    if not reduced:
        return {"n_embd": 7168, "n_vocab": 163840, "draft": {
            "num_hidden_layers": 5, "num_attention_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 14336,
            "markov_rank": 256, "block_size": 7, "target_layers": [1, 2, 3, 4, 5], "rope_theta": 50000.0,
            "rope_scaling_factor": REAL_YARN_FACTOR, "original_max_position_embeddings": 32768, "std": 0.02}}
    return {"n_embd": 1024, "n_vocab": 16384, "draft": {
        "num_hidden_layers": 5, "num_attention_heads": 16, "q_lora_rank": 384, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 2048,
        "markov_rank": 256, "block_size": 7, "target_layers": [1, 2, 3, 4, 5], "rope_theta": 50000.0,
        "rope_scaling_factor": REAL_YARN_FACTOR, "original_max_position_embeddings": 32768, "std": 0.02}}


def write_realsize_models(tiny_target: Path, out_dir: Path, reduced: bool) -> dict:
    """The widened 6-layer Kimi-K3 target and the MLA draft, BF16, random (seeded), written
    directly (no converter). Reused when present."""
    from llamacpp_mla_port.fixtures.draft_gguf import write_mla_draft_gguf
    from llamacpp_mla_port.proof.realsize import REAL_TARGET_LAYERS, REAL_TARGET_RES_BLOCK
    from llamacpp_mla_port.proof.targets import write_deep_kimi_k3_target, write_wide_kimi_k3_target

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = realsize_config(reduced)
    t0 = time.monotonic()
    deep = write_deep_kimi_k3_target(tiny_target, out_dir / "target-deep.gguf", REAL_TARGET_LAYERS,
                                     REAL_TARGET_RES_BLOCK)
    target = write_wide_kimi_k3_target(deep, out_dir / "target.gguf", n_embd=cfg["n_embd"], n_vocab=cfg["n_vocab"])
    t1 = time.monotonic()
    draft = out_dir / "draft.gguf"
    if not draft.is_file():
        write_mla_draft_gguf(draft, target, config=cfg["draft"], weight_type="bf16")
    return {"target": str(target), "draft": str(draft), "target_seconds": round(t1 - t0, 1),
            "draft_seconds": round(time.monotonic() - t1, 1), "config": cfg,
            "draft_bytes": draft.stat().st_size, "target_bytes": Path(target).stat().st_size}


def copy_bandwidth(cuda: bool, mib: int, repeats: int = 20) -> dict:
    """Device-to-device (or host) copy bandwidth through PyTorch: bytes read + written / the
    median time of `repeats` copies after warm-up, on random data."""
    import torch

    n = mib * 2**20 // 4
    dev = "cuda" if cuda else "cpu"
    a = torch.randn(n, device=dev)
    b = torch.empty_like(a)
    times = []
    for i in range(repeats + 3):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            b.copy_(a)
            end.record()
            torch.cuda.synchronize()
            s = start.elapsed_time(end) / 1000.0
        else:
            t = time.perf_counter()
            b.copy_(a)
            s = time.perf_counter() - t
        if i >= 3:
            times.append(s)
    if not torch.equal(a, b):
        raise DeviceCheckError("the bandwidth copy did not copy")
    med = statistics.median(times)
    return {"device": torch.cuda.get_device_name(0) if cuda else "host", "mib": mib, "repeats": repeats,
            "median_s": med, "gbps": 2 * n * 4 / med / 1e9, "torch_threads": torch.get_num_threads()}


# ---------------------------------------------------------------------------------------
# the CUDA toolkit as the device has it

def _first(paths) -> Path | None:
    for p in paths:
        if p and Path(p).is_file():
            return Path(p)
    return None


def _python_nvidia_dirs() -> list[Path]:
    """Folders of the `nvidia` namespace package (pip's nvidia-cublas & co., as torch uses)."""
    import importlib.util
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
                ldconfig_text = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
            except (OSError, subprocess.TimeoutExpired):
                ldconfig_text = ""
        cached = re.findall(r"libcuda\.so(?:\.1)? \(.*?\) => (\S+)", ldconfig_text)
        driver = _first([*cached, "/usr/local/nvidia/lib64/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                         "/usr/lib64/libcuda.so.1"])
        if driver is None:
            raise DeviceCheckError("no libcuda (the CUDA driver library) found",
                                   hint="run on a machine with a GPU driver")
        args.append(f"-DCUDA_cuda_driver_LIBRARY={driver}")
    return args


# ---------------------------------------------------------------------------------------
# the driver

class Check:
    """One run of the check: stages in order, each inside the time budget, the report
    written after every stage (a run stopped by its time limit still leaves one)."""

    def __init__(self, bundle: Path, out: Path, work: Path, dry_run: bool, budget_s: float | None,
                 stages=STAGES, threads: int | None = None, log=None):
        self.bundle, self.out, self.work = Path(bundle).resolve(), Path(out).resolve(), Path(work).resolve()
        self.dry_run, self.cuda = dry_run, not dry_run
        self.budget_s = budget_s
        self.t0 = time.monotonic()
        self.stages = tuple(stages)
        # the device's 16 cores; a dry run keeps to this project's 2-core budget
        self.threads = threads or (min(os.cpu_count() or 2, 2) if dry_run else (os.cpu_count() or 2))
        self.tree, self.build = self.work / "llama.cpp", self.work / "build"
        self.devices = GPU_DEVICE if self.cuda else None
        self.report: dict = {"kind": "cuda" if self.cuda else "dry run (CUDA off)", "device_call": DEVICE_CALL,
                             "budget_s": budget_s, "threads": self.threads, "stages": {}, "figures_from_gpu": self.cuda}
        self._log = log or (lambda m: (sys.stderr.write(m + "\n"), sys.stderr.flush()))
        self.models_proc: subprocess.Popen | None = None

    def log(self, msg: str) -> None:
        self._log(f"device-check [{time.monotonic() - self.t0:6.1f} s] {msg}")

    def remaining(self) -> float:
        return float("inf") if self.budget_s is None else self.budget_s - (time.monotonic() - self.t0)

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.report["seconds"] = round(time.monotonic() - self.t0, 1)
        self.report["ok"] = bool(self.report["stages"]) and all(
            s.get("ok") for s in self.report["stages"].values() if not s.get("skipped"))
        (self.out / "report.json").write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        (self.out / "report.md").write_text(format_report(self.report))

    def stage(self, name: str, fn, needs_s: float = 0.0) -> None:
        if name not in self.stages:
            return
        if self.remaining() < needs_s:
            self.report["stages"][name] = {"ok": False, "skipped": f"not run: {self.remaining():.0f} s of the "
                                                                   f"budget left, the stage needs ~{needs_s:.0f} s"}
            self.log(f"stage {name}: skipped (time)")
            self.save()
            return
        t = time.monotonic()
        self.log(f"stage {name} ...")
        try:
            ok = fn()
            self.report["stages"][name] = {"ok": bool(ok), "seconds": round(time.monotonic() - t, 1)}
        except PortError as err:
            self.report["stages"][name] = {"ok": False, "error": str(err), "seconds": round(time.monotonic() - t, 1)}
        except Exception as err:   # a bug: keep the traceback in the report
            self.report["stages"][name] = {"ok": False, "error": f"{type(err).__name__}: {err}",
                                           "traceback": traceback.format_exc()[-3000:],
                                           "seconds": round(time.monotonic() - t, 1)}
        st = self.report["stages"][name]
        self.log(f"stage {name}: {'ok' if st['ok'] else 'FAILED ' + st.get('error', '(see report)')[:300]} "
                 f"({st['seconds']} s)")
        self.save()

    # ------------------------------------------------------------------ setup
    def environment(self) -> None:
        env: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
        for key, cmd in (("nvidia_smi", ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.sm",
                                         "--format=csv,noheader"]),
                         ("nvcc", ["nvcc", "--version"]), ("cmake", ["cmake", "--version"])):
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                env[key] = (proc.stdout.strip().splitlines() or [""])[-1] if proc.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired):
                env[key] = None
        try:
            import torch
            env["torch"] = torch.__version__
            env["torch_cuda"] = bool(torch.cuda.is_available())
        except ImportError:
            env["torch"] = None
        self.report["environment"] = env
        if self.cuda and not env.get("nvidia_smi"):
            raise DeviceCheckError("no GPU here (nvidia-smi answers nothing)",
                                   hint="run on the device machine, or DRY_RUN=1 for the CPU dry run")

    def unpack(self) -> None:
        if (self.tree / "CMakeLists.txt").is_file() and (self.work / "unpacked.sha256").is_file() and \
                (self.work / "unpacked.sha256").read_text() == _sha256(self.bundle / "llama.cpp.tar.gz"):
            return
        # another tree: a build of the old one would look newer than the sources (mtime 0)
        for stale in (self.tree, self.build):
            if stale.exists():
                shutil.rmtree(stale)
        self.work.mkdir(parents=True, exist_ok=True)
        with tarfile.open(self.bundle / "llama.cpp.tar.gz") as tar:
            tar.extractall(self.work, filter="data")
        (self.work / "unpacked.sha256").write_text(_sha256(self.bundle / "llama.cpp.tar.gz"))
        fx = self.work / "fixtures"
        if fx.exists():
            shutil.rmtree(fx)
        shutil.copytree(self.bundle / "fixtures", fx)

    def start_models(self) -> None:
        """The real-size models, written by a background process while the build runs."""
        if "realsize" not in self.stages:
            return
        out = self.work / ("realsize-reduced" if self.dry_run else "realsize")
        cmd = [sys.executable, "-m", "llamacpp_mla_port.proof.device", "models",
               str(self.work / "fixtures" / "kimi-k3-target.gguf"), str(out)] + (["--reduced"] if self.dry_run else [])
        self.models_log = self.work / "models.log"
        self.models_out = out
        self.models_proc = subprocess.Popen(cmd, stdout=open(self.models_log, "w"), stderr=subprocess.STDOUT,
                                            env={**os.environ}, start_new_session=True)
        self.log(f"real-size models: writing in the background into {out}")

    # ------------------------------------------------------------------ stages
    def cmake_args(self) -> list[str]:
        if not self.cuda:
            return list(COMMON_CMAKE_ARGS)
        if not hasattr(self, "_cuda_args"):
            self._cuda_args = cuda_toolkit_args()
        return [*CUDA_CMAKE_ARGS, *self._cuda_args, *COMMON_CMAKE_ARGS]

    def do_build(self) -> bool:
        from llamacpp_mla_port.build import ensure_build

        args = self.cmake_args()
        self.report["build"] = {"cmake_args": args, "targets": list(CHECK_TARGETS)}
        t = time.monotonic()
        ensure_build(self.tree, self.build, CHECK_TARGETS, cmake_args=args, jobs=self.threads, echo=False)
        self.report["build"]["seconds"] = round(time.monotonic() - t, 1)
        return True

    def _program(self, name: str) -> Path:
        from llamacpp_mla_port.proof.programs import compile_program
        return compile_program(name, self.tree, self.build, out_dir=self.work / "proof-bin" / _lib_key(self.build))

    def do_fallback(self) -> bool:
        """The 576-latent draft's graphs: where the scheduler put each node (module doc)."""
        import numpy as np

        from llamacpp_mla_port.fixtures.draft_gguf import write_mla_draft_gguf
        from llamacpp_mla_port.proof.draft_logits import run_draft_logits
        from llamacpp_mla_port.proof.splits import fallback_report

        target = self.work / "fixtures" / "kimi-k3-target.gguf"
        draft = write_mla_draft_gguf(self.work / "fallback" / "mla576.gguf", target)
        binary = self._program("draft-logits")
        runs = {}
        rng = np.random.default_rng(7)
        from llamacpp_mla_port.proof.reference import read_target_head
        embd, _ = read_target_head(target)
        feats = rng.normal(size=(40, 2 * embd.shape[1]))
        for fa, cache in ((False, "f16"), (True, "f16"), (True, "q8_0")):
            key = f"fa-{'on' if fa else 'off'}-{cache}"
            out = self.work / "fallback" / key
            mask = embd.shape[0] - 1          # the draft writer's mask token: the last id
            run_draft_logits(binary, draft, target, feats, [3, mask, mask, mask], out, ctx_pos0=100, flash_attn=fa,
                             cache_type=cache, threads=min(self.threads, 4), draft_devices=self.devices,
                             target_devices=self.devices, env={**os.environ, "GGML_SCHED_DEBUG": "2"})
            runs[key] = fallback_report((out / "llama.log").read_text(errors="replace"))
        self.report["fallback"] = {"draft": "fixtures.draft_gguf MLA draft: kv_lora 512 + rope 64, 2 layers, "
                                            "Markov + confidence heads", "devices": self.devices or "CPU", "runs": runs}
        return self._fallback_verdict(runs)

    def _fallback_verdict(self, runs: dict) -> bool:
        problems = [f"{k}: no draft graph in the scheduler log" for k, r in runs.items() if r["n_draft_graphs"] == 0]
        if self.cuda:
            problems += [f"{k}: the draft graph has no GPU node" for k, r in runs.items() if not r["gpu_in_graph"]]
            problems += [f"{k}: CPU fallback of {', '.join(r['fallback_ops'])}" for k, r in runs.items()
                         if r["fallback_nodes"]]
        self.report.setdefault("fallback_problems", []).extend(problems)
        return not problems

    def do_parity(self) -> bool:
        from llamacpp_mla_port.proof.parity import run_parity
        from llamacpp_mla_port.proof.reference import read_target_head
        from llamacpp_mla_port.proof.targets import target_with_layers

        target = self.work / "fixtures" / "kimi-k3-target.gguf"
        embd, _ = read_target_head(target)
        vocab, hidden = embd.shape
        pdir = self.work / "fixtures" / "parity"
        result = run_parity(self.tree, self.build, pdir, lambda h, v, n: target_with_layers(target, pdir, n),
                            hidden, vocab, threads=min(self.threads, 4), log=self.log, devices=self.devices)
        backend = "cuda" if self.cuda else "cpu"
        judged = judge_parity(result.report, backend)
        self.report["parity"] = {"devices": self.devices or "CPU", "system_info": result.report.get("system_info"),
                                 "modes": judged}
        return all(j["ok"] for j in judged.values())

    def do_lossless(self) -> bool:
        from llamacpp_mla_port.proof.lossless import run_lossless

        manifest = json.loads((self.bundle / "MANIFEST.json").read_text())
        ldir = self.work / "fixtures" / "lossless"
        # inside the budget: the CPU runs the whole matrix (make smoke); here draft lengths 3
        # and 7 (dry run: 3), flash attention and the confidence cut-off on/off, the prompts
        # the bigram draft learned from and unlearned ones (it learned from the first half of
        # the prepare step's prompts)
        lengths = (3,) if self.dry_run else (3, 7)
        learned = manifest.get("lossless_prompts", 8) // 2
        rep = run_lossless(self.tree, self.build, ldir, self.work / "fixtures" / "kimi-k3-target.gguf",
                           draft_lengths=lengths, n_prompts=learned + (1 if self.dry_run else 2),
                           threads=min(self.threads, 4), log=self.log, extra=PLACEMENT_ARGS)
        bigram_accepted = sum(r["accepted"] for r in rep["speculative_simple"] + rep["server"]
                              if r["draft"] == "bigram")
        rep["bigram_accepted"] = bigram_accepted
        self.report["lossless"] = rep
        return rep["n_mismatches"] == 0 and bigram_accepted > 0

    def do_realsize(self) -> bool:
        from llamacpp_mla_port.bench.floors import block_work

        if self.models_proc is None:
            self.start_models()
        rc = self.models_proc.wait(timeout=max(10.0, min(self.remaining(), 1800)))
        log_text = self.models_log.read_text(errors="replace")
        if rc != 0:
            raise DeviceCheckError(f"writing the real-size models failed (exit {rc}): {log_text[-1500:]}")
        models = json.loads((self.models_out / "models.json").read_text())
        rs: dict = {"models": models, "forms": {}}
        self.report["realsize"] = rs
        rs["bandwidth"] = copy_bandwidth(self.cuda, 4096 if self.cuda else 256, repeats=20 if self.cuda else 5)
        work = block_work(Path(models["draft"]), Path(models["target"]), n_block=7, n_ctx=512,
                          cache_bytes_per_value=2.0)
        rs["block_work"] = work.as_dict()
        rs["hbm_floor_s" if self.cuda else "memory_floor_s"] = work.bytes_total / (rs["bandwidth"]["gbps"] * 1e9)
        # where the real-size graph runs (one extra run with the scheduler's report)
        rs["fallback"], ops = self._probe(models, "broadcast")
        ok = self._fallback_verdict({"realsize-fa-on-f16": rs["fallback"]})
        rs["v_b_ops"] = {"broadcast": ops}
        rs["forms"]["broadcast"] = self._time_form(models, "broadcast")
        self.save()
        # the permuted-GEMM form: rebuild libllama with the overlay, prove it, time it, restore
        original = (self.tree / DFLASH_SOURCE).read_text()
        try:
            # copyfile, not copy2: the source must look newer than its object to be recompiled
            shutil.copyfile(self.bundle / "overlay" / "permuted" / DFLASH_SOURCE, self.tree / DFLASH_SOURCE)
            self._rebuild_llama()
            # the graph must show the other form: v_b's output is the CONT of the permuted product
            _, rs["v_b_ops"]["permuted"] = self._probe(models, "permuted")
            if rs["v_b_ops"]["permuted"] != ["CONT"] or rs["v_b_ops"]["broadcast"] != ["MUL_MAT"]:
                raise DeviceCheckError(f"the v_b forms did not build as meant: attn_out_v_b ops {rs['v_b_ops']} "
                                       "(broadcast: MUL_MAT, permuted: CONT expected)")
            rs["permuted_parity_f32"] = self._permuted_parity()
            rs["forms"]["permuted"] = self._time_form(models, "permuted")
        finally:
            (self.tree / DFLASH_SOURCE).write_text(original)
            self._rebuild_llama()
        b, p = rs["forms"]["broadcast"]["block_median_s"], rs["forms"]["permuted"]["block_median_s"]
        rs["permuted_over_broadcast"] = p / b
        rs["faster_form"] = "broadcast" if b <= p else "permuted"
        return ok and rs["permuted_parity_f32"]["ok"]

    def _probe(self, models: dict, form: str) -> tuple[dict, list[str]]:
        """One untimed draft-bench run with the scheduler's report: the draft graphs' splits
        and the ops of the v_b output node (attn_out_v_b-N)."""
        from llamacpp_mla_port.proof.splits import draft_graphs, fallback_report, node_ops, parse_sched_log

        probe = self._bench(models, f"probe-{form}", repeats=1, env={"GGML_SCHED_DEBUG": "2"})
        text = Path(str(probe["json"]) + ".log").read_text(errors="replace")
        return fallback_report(text), node_ops(draft_graphs(parse_sched_log(text)), "attn_out_v_b-")

    def _rebuild_llama(self) -> None:
        from llamacpp_mla_port.build import ensure_build
        t = time.monotonic()
        ensure_build(self.tree, self.build, ("llama",), cmake_args=self.cmake_args(), jobs=self.threads, echo=False)
        self.report.setdefault("rebuilds_s", []).append(round(time.monotonic() - t, 1))

    def _permuted_parity(self) -> dict:
        from llamacpp_mla_port.proof.parity import MODES, PARITY_CONFIGS, run_parity
        from llamacpp_mla_port.proof.reference import read_target_head
        from llamacpp_mla_port.proof.targets import target_with_layers

        target = self.work / "fixtures" / "kimi-k3-target.gguf"
        embd, _ = read_target_head(target)
        pdir = self.work / "fixtures" / "parity"
        f32 = [m for m in MODES if m.name == "f32"]
        res = run_parity(self.tree, self.build, pdir, lambda h, v, n: target_with_layers(target, pdir, n),
                         embd.shape[1], embd.shape[0], configs=PARITY_CONFIGS[:1], modes=f32,
                         threads=min(self.threads, 4), log=self.log, devices=self.devices)
        row = res.report["modes"]["f32"]
        return {"config": PARITY_CONFIGS[0].name, "worst_nmse": row["worst_nmse"], "bound": row["threshold"],
                "ok": bool(res.passed)}

    def _bench(self, models: dict, tag: str, repeats: int, env: dict | None = None) -> dict:
        from llamacpp_mla_port.proof.processes import run_bounded

        exe = self._program("draft-bench")
        out = self.work / "bench" / f"{tag}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [exe, "--draft", models["draft"], "--target", models["target"], "--out", out, "--inject", "",
               "--block", 7, "--block-ctx", 512, "--repeats", repeats, "--threads", self.threads,
               "--flash-attn", "on", "--cache-type", "f16"]
        if self.devices:
            cmd += ["--draft-devices", self.devices, "--target-devices", self.devices]
        proc = run_bounded([str(c) for c in cmd], max(60.0, min(self.remaining(), 900)),
                           env={**os.environ, **(env or {})})
        if proc.returncode != 0:
            raise DeviceCheckError(f"draft-bench {tag} failed (exit {proc.returncode}): {proc.stderr[-2000:]}",
                                   hint=" ".join(str(c) for c in cmd))
        data = json.loads(out.read_text())
        data["json"] = str(out)
        data["command"] = " ".join(str(c) for c in cmd)
        return data

    def _time_form(self, models: dict, form: str) -> dict:
        data = self._bench(models, form, repeats=20 if self.cuda else 3)
        med = statistics.median(data["block_seconds"])
        floor = self.report["realsize"].get("hbm_floor_s") or self.report["realsize"].get("memory_floor_s")
        return {"block_seconds": data["block_seconds"], "block_median_s": med,
                "block_min_s": min(data["block_seconds"]),
                "floor_s": floor, "over_floor": med / floor, "load_seconds": data.get("load_seconds"),
                "system_info": data.get("system_info"), "command": data["command"]}

    # ------------------------------------------------------------------ all
    def run(self) -> dict:
        self.report["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            self.environment()
            self.unpack()
            self.start_models()
            self.save()
            self.stage("build", self.do_build)
            built = self.report["stages"].get("build", {}).get("ok", "build" not in self.stages)
            if built:
                self.stage("fallback", self.do_fallback, needs_s=20)
                self.stage("parity", self.do_parity, needs_s=60)
                self.stage("realsize", self.do_realsize, needs_s=90)
                self.stage("lossless", self.do_lossless, needs_s=60)
        except PortError as err:
            self.report["stages"]["setup"] = {"ok": False, "error": str(err)}
        finally:
            if self.models_proc is not None and self.models_proc.poll() is None:
                os.killpg(self.models_proc.pid, 9)
                self.models_proc.wait()
            self.save()
            self.pack_logs()
        return self.report

    def pack_logs(self, limit: int = 12 * 2**20) -> None:
        """logs.tar.gz beside the report: the build log, the model writer's, every scheduler
        log and bench output (a device call returns files, not the machine's scratch)."""
        picks = [self.build / "llamacpp-mla-port-build.log", self.work / "models.log",
                 *sorted((self.work / "fallback").glob("*/llama.log")), *sorted((self.work / "bench").glob("*"))]
        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tar:
            for p in picks:
                if p.is_file() and p.stat().st_size < limit:
                    tar.add(p, arcname=str(p.relative_to(self.work)))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _lib_key(build: Path) -> str:
    """Proof programs are compiled per libllama (a rebuilt one gets fresh binaries)."""
    from llamacpp_mla_port.proof.programs import library_dir
    lib = (library_dir(build) / "libllama.so").resolve()
    st = lib.stat()
    return hashlib.sha256(f"{lib}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]


def run_check(bundle: Path, out: Path, work: Path, dry_run: bool, budget_s: float | None = None,
              stages=STAGES, log=None) -> dict:
    return Check(bundle, out, work, dry_run, budget_s, stages, log=log).run()


# ---------------------------------------------------------------------------------------
# the markdown report

def _fmt(x, spec=".2e") -> str:
    return "-" if x is None else format(x, spec)


def format_report(r: dict) -> str:
    """report.md: what ran, the verdict per stage and every figure, in tables."""
    lines = [f"# GPU check report ({r['kind']})", ""]
    if not r.get("figures_from_gpu"):
        lines += ["**Dry run with CUDA off: no figure here comes from a GPU.** It proves the steps run end to "
                  "end; on a device machine run:", "", f"    {r['device_call']}", ""]
    env = r.get("environment", {})
    budget = f"a budget of {r['budget_s']} s" if r.get("budget_s") else "no budget"
    lines += [f"- started {r.get('started_utc', '?')}, {r.get('seconds', 0)} s ({budget}); {env.get('cpus')} CPUs; "
              f"GPU: {env.get('nvidia_smi') or 'none'}; "
              f"nvcc: {env.get('nvcc') or 'none'}; torch {env.get('torch')}", "",
              "| stage | verdict | seconds |", "|---|---|---|"]
    for name, st in r.get("stages", {}).items():
        verdict = st.get("skipped") or ("ok" if st.get("ok") else "FAILED: " + st.get("error", "see report.json")[:200])
        lines.append(f"| {name} | {verdict} | {st.get('seconds', '-')} |")
    lines.append("")
    if "build" in r:
        b = r["build"]
        lines += [f"Build: {' '.join(b['cmake_args'])}; targets {', '.join(b['targets'])}; "
                  f"{b.get('seconds', '-')} s.", ""]
    if "fallback" in r or "fallback_problems" in r:
        lines += ["## CPU fallback (the scheduler's splits, GGML_SCHED_DEBUG=2)", "",
                  "| run | draft graphs | splits (backends) | nodes per backend | CPU fallback ops |",
                  "|---|---|---|---|---|"]
        runs = dict(r.get("fallback", {}).get("runs", {}))
        if "realsize" in r and "fallback" in r["realsize"]:
            runs["real-size, FA on, F16"] = r["realsize"]["fallback"]
        for key, fr in runs.items():
            for g in fr["graphs"]:
                lines.append(f"| {key} {g['kind']} | {fr['n_draft_graphs']} | {g['n_splits']} "
                             f"({', '.join(g['split_backends'])}) | {g['nodes_per_backend']} | "
                             f"{', '.join(fr['fallback_ops']) or 'none'} |")
        probs = r.get("fallback_problems") or []
        lines += ["", "Problems: " + ("; ".join(probs) if probs else "none") +
                  ("" if r.get("figures_from_gpu") else " (CPU only: there is no GPU to fall back from)"), ""]
    if "parity" in r:
        lines += [f"## Parity (draft and target on {r['parity']['devices']})", "",
                  "| mode | compared | worst NMSE | CPU bound | bound used | basis | headroom | control limit | "
                  "suggested (10x) | nearest gross control | 1 % scale | controls fail | chains | ok |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, j in r["parity"]["modes"].items():
            near = j["nearest_gross_control"]
            lines.append(
                f"| {name} | {j['compared']} | {_fmt(j['figure'])} | {_fmt(j['cpu_bound'], '.0e')} | "
                f"{_fmt(j['bound'])} | {j['basis']} | {_fmt(j['headroom'], '.0f')}x | {_fmt(j['control_limit'])} | "
                f"{_fmt(j['suggested_bound'])} ({'ok' if j['suggested_ok'] else 'too loose'}) | "
                f"{near['name']} {_fmt(near['nmse'], '.1e')} | {_fmt(j['kq_scale_1pct'], '.1e')} | "
                f"{'yes' if all(j['controls_fail'].values()) else 'NO'} | {j['chains_equal']}/{j['cases']} equal | "
                f"{'ok' if j['ok'] else 'FAIL'} |")
        lines.append("")
    if "lossless" in r:
        ls = r["lossless"]
        lines += [f"## Lossless (placement `{ls.get('placement')}`)", "",
                  "| program | draft | k | FA | p_min | identical | drafted | accepted |",
                  "|---|---|---|---|---|---|---|---|"]
        for prog in ("speculative_simple", "server"):
            for row in ls.get(prog, []):
                lines.append(f"| {prog.replace('_', '-')} | {row['draft']} | {row['draft_max']} | "
                             f"{'on' if row['flash_attn'] else 'off'} | {row['p_min']} | "
                             f"{row['identical']}/{row['of']} | "
                             f"{row['drafted']} | {row['accepted']} |")
        lines += ["", f"Mismatches: {ls.get('n_mismatches')}; bigram draft accepted "
                      f"{ls.get('bigram_accepted')} tokens.", ""]
    if "realsize" in r:
        rs = r["realsize"]
        cfg = rs.get("models", {}).get("config", {})
        bw = rs.get("bandwidth", {})
        bw_bytes = rs.get("block_work", {}).get("bytes_weights", 0) + rs.get("block_work", {}).get("bytes_cache", 0)
        floor_key = "HBM floor" if r.get("figures_from_gpu") else "memory floor (host)"
        lines += ["## Real-size draft block (7 tokens over 512 cached rows, FA on, F16 cache)", "",
                  f"Draft n_embd {cfg.get('n_embd')}, vocab {cfg.get('n_vocab')}, {cfg.get('draft', {})}; "
                  f"bytes read {bw_bytes:,}; "
                  f"copy bandwidth {_fmt(bw.get('gbps'), '.1f')} GB/s ({bw.get('device')}, read + write)", "",
                  f"| v_b form | block median | min | {floor_key} | over the floor |", "|---|---|---|---|---|"]
        for form, f in rs.get("forms", {}).items():
            lines.append(f"| {form} | {f['block_median_s'] * 1e3:.3f} ms | {f['block_min_s'] * 1e3:.3f} ms | "
                         f"{f['floor_s'] * 1e3:.3f} ms | {f['over_floor']:.2f}x |")
        if "permuted_over_broadcast" in rs:
            pp = rs.get("permuted_parity_f32", {})
            lines += ["", f"Permuted / broadcast = {rs['permuted_over_broadcast']:.3f} (faster: {rs['faster_form']}); "
                          f"the permuted build's F32 parity ({pp.get('config')}): NMSE {_fmt(pp.get('worst_nmse'))} "
                          f"<= {_fmt(pp.get('bound'), '.0e')}: {'ok' if pp.get('ok') else 'FAIL'}."]
        lines.append("")
    lines.append(f"Overall: {'ok' if r.get('ok') else 'NOT ok'}.")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# background entry: python -m llamacpp_mla_port.proof.device models TINY_TARGET OUT [--reduced]

def _models_main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "models":
        sys.stderr.write("usage: python -m llamacpp_mla_port.proof.device models TINY_TARGET OUT_DIR [--reduced]\n")
        return 2
    res = write_realsize_models(Path(argv[1]), Path(argv[2]), reduced="--reduced" in argv)
    (Path(argv[2]) / "models.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(_models_main(sys.argv[1:]))
