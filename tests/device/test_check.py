"""The GPU check (device/, proof/splits.py): what can be proven without a GPU.

The bundle's prepare step (size, contents, the pruned tree configures), the scheduler-log
parser on captured and synthetic text (a CPU split must be caught), the report writer, the
CPU toolkit probe, and that the driver's import closure needs no GitPython (the device has
none). The judge: test_judge.py; the new stages run on this CPU: test_dry_run.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from llamacpp_mla_port.errors import DeviceCheckError
from llamacpp_mla_port.device import block, bundle, judge, report, toolkit
from llamacpp_mla_port.fixtures.realsize import realsize_config
from llamacpp_mla_port.proof import splits


# ---------------------------------------------------------------------------------------
# the scheduler's split report (ggml-backend.cpp, ggml_backend_sched_print_assignments)

def _node(i: int, op: str, name: str, backend: str, srcs=(), size: str = "14K") -> str:
    """One node line exactly as the C format prints it (fixed-width fields)."""
    line = f"node #{i:3d} ({op:>10.10}): {name:>20.20} ({size:>5.5}) [{backend:>5.5} {'':>8.8}] use=1,c=0:"
    for sname, sbackend in srcs:
        line += f" {sname:>20.20} ({'1K':>5.5}) [{sbackend:>5.5} {'':>8.8}]"
    return line


def _split(i: int, backend: str, inputs=()) -> str:
    head = f"## SPLIT #{i}: {backend} # {len(inputs)} inputs"
    if inputs:
        head += ": " + "".join(f"[{n} ({'1K':>5.5})] " for n in inputs)
    return head


def _draft_block_graph(fa_backend: str) -> str:
    """A draft block graph on CUDA0: the token lookup on the host, flash attention on `fa_backend`."""
    lines = [
        "llama_context: graph splits = 3",
        _split(0, "CPU"),
        _node(0, "GET_ROWS", "inp_noise_embd", "CPU", [("token_embd.weight", "CPU"), ("inp_tokens", "NULL")]),
        _split(1, "CUDA0", ["inp_noise_embd"]),
        _node(1, "RMS_NORM", "norm-0", "CUDA0", [("inp_noise_embd", "CUDA0")]),
        _node(2, "MUL_MAT", "q_nope_absorbed-0", "CUDA0",
              [("blk.0.attn_k_b.weight", "CUDA0"), ("q-0 (view)", "CUDA0")]),
    ]
    if fa_backend != "CUDA0":
        lines.append(_split(2, fa_backend, ["Qcur-0", "cache_k_l0 (view)"]))
    lines += [
        _node(3, "FLASH_ATTN_EXT", "__fattn__-0", fa_backend,
              [("Qcur-0", fa_backend), ("cache_k_l0 (view)", fa_backend)]),
        _split(3, "CUDA0", ["__fattn__-0"]) if fa_backend != "CUDA0" else "",
        _node(4, "MUL_MAT", "fattn_mla-0", "CUDA0", [("blk.0.attn_v_b.weight", "CUDA0"), ("__fattn__-0", "CUDA0")]),
        _node(5, "MUL_MAT", "a_very_long_node_name_past_twenty", "CUDA0", [("output.weight", "CUDA0")]),
    ]
    return "\n".join(ln for ln in lines if ln) + "\n"


def test_parser_reads_splits_nodes_and_sources():
    graphs = splits.parse_sched_log(_draft_block_graph("CUDA0"))
    assert len(graphs) == 1
    g = graphs[0]
    assert [s.backend for s in g.splits] == ["CPU", "CUDA0"]
    assert g.kind == "draft-block"
    by_name = {n.name: n for n in g.nodes}
    lookup = by_name["inp_noise_embd"]
    assert lookup.op == "GET_ROWS" and lookup.srcs[0] == ("token_embd.weight", "CPU")
    assert by_name["q_nope_absorbed-0"].srcs[1] == ("q-0 (view)", "CUDA0")      # a name with a space
    assert "a_very_long_node_na" in [n.name[:19] for n in g.nodes]              # truncated to 20 by the C format
    assert splits.cpu_fallbacks(g) == []                                        # the host lookup is by design


def test_parser_catches_a_cpu_split():
    text = _draft_block_graph("CPU")
    report = splits.fallback_report(text)
    assert report["gpu_in_graph"]
    assert report["fallback_ops"] == ["FLASH_ATTN"]          # ggml prints the op in 10 characters
    assert report["fallback_nodes"] == [{"graph": "draft-block", "op": "FLASH_ATTN", "name": "__fattn__-0"}]
    assert report["graphs"][0]["split_backends"] == ["CPU", "CUDA0", "CPU", "CUDA0"]


def test_parser_ignores_other_graphs_and_cpu_only_graphs():
    target = _split(0, "CUDA0") + "\n" + _node(0, "MUL_MAT", "ffn_up-0", "CPU", [("blk.0.ffn_up.weight", "CPU")]) + "\n"
    cpu_only = (_split(0, "CPU") + "\n" + _node(0, "MUL_MAT", "Kcur_injected-0", "CPU", [("fc.weight", "CPU")]) + "\n"
                + _node(1, "FLASH_ATTN_EXT", "__fattn__-0", "CPU") + "\n")
    report = splits.fallback_report(target + cpu_only + _draft_block_graph("CUDA0"))
    assert report["n_draft_graphs"] == 2                 # the target's graph is not the draft's
    assert {g["kind"] for g in report["graphs"]} == {"draft-inject", "draft-block"}
    assert report["fallback_nodes"] == []                # a CPU-only graph has nothing to fall back from
    assert splits.fallback_report(cpu_only)["gpu_in_graph"] is False


def test_parser_on_a_log_the_cpu_build_wrote():
    """Captured from draft-logits with GGML_SCHED_DEBUG=2 on the CPU build (the dry run's log)."""
    text = (Path(__file__).parent / "data" / "sched-debug-cpu.log").read_text()
    report = splits.fallback_report(text)
    assert report["n_draft_graphs"] >= 2
    assert {g["kind"] for g in report["graphs"]} == {"draft-inject", "draft-block"}
    assert report["backends"] == ["CPU"] and report["fallback_nodes"] == []
    # the same graph with its attention moved to a CUDA split: the parser must catch the CPU rest
    moved = text.replace("## SPLIT #0: CPU", "## SPLIT #0: CUDA0")
    graphs = splits.draft_graphs(splits.parse_sched_log(moved))
    assert all(g.splits[0].backend == "CUDA0" for g in graphs)
    assert any(splits.cpu_fallbacks(g) for g in graphs)


def test_v_b_form_ops_name_the_product_not_its_copies():
    """The series' form (deepseek2's): fattn_mla-IL is the MUL_MAT; the permute + CONT after it
    carry the name with suffixes, which the C format cuts to 20 characters."""
    lines = [_split(0, "CPU"),
             _node(0, "GET_ROWS", "inp_noise_embd", "CPU", [("token_embd.weight", "CPU")]),
             _node(1, "MUL_MAT", "fattn_mla-0", "CPU", [("blk.0.attn_v_b.weight", "CPU"), ("__fattn__-0", "CPU")]),
             _node(2, "CONT", "fattn_mla-0 (permuted) (cont)", "CPU", [("fattn_mla-0 (permuted)", "CPU")]),
             _node(3, "MUL_MAT", "attn_out_v_b-12", "CPU", [("blk.12.attn_v_b.weight", "CPU")])]
    text = "\n".join(lines) + "\n"
    assert block.v_b_form_ops(text, "permuted") == ["MUL_MAT"]
    assert block.v_b_form_ops(text, "broadcast") == ["MUL_MAT"]
    # control: the old prefix match took the CONT as part of the product, and the check must refuse that
    graphs = splits.draft_graphs(splits.parse_sched_log(text))
    assert sorted({n.op for g in graphs for n in g.nodes if n.name.startswith("fattn_mla-")}) == ["CONT", "MUL_MAT"]
    with pytest.raises(DeviceCheckError, match="permuted v_b form did not build as meant"):
        block.check_v_b_form("permuted", ["CONT", "MUL_MAT"])
    with pytest.raises(DeviceCheckError, match="broadcast v_b form"):
        block.check_v_b_form("broadcast", [])


@pytest.mark.build
@pytest.mark.slow
def test_lossless_stage_quantized_draft_cache(patched_tree, llama_build, tmp_path):
    """The lossless stage's quantized draft cache rows (`-ctkd q8_0 -ctvd q8_0`) on the CPU, on
    a draft whose K head is whole Q8_0 blocks: greedy output still equals the target's, and
    the F16 cache's counts for the same draft stand beside them."""
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
    from llamacpp_mla_port.proof.lossless import run_lossless

    target = write_kimi_k3_target(llama_build, tmp_path / "kimi-k3-target.gguf")
    rep = run_lossless(patched_tree, llama_build, tmp_path / "lossless", target, server=False,
                       draft_lengths=(3,), n_prompts=2, log=lambda m: None,
                       draft_cache=bundle.QUANTIZED_DRAFT_CACHE)
    assert rep["n_mismatches"] == 0, rep["mismatches"]
    [row] = rep["draft_cache"]
    assert row["cache"] == "q8_0" and row["draft_max"] == 3
    assert row["identical"] == row["f16_identical"] == row["of"] == 2
    assert row["drafted"] > 0 and row["f16_drafted"] > 0 and 0 <= row["accepted"] <= row["drafted"]
    md = report.format_report({"kind": "cuda", "figures_from_gpu": True, "lossless": rep, "stages": {}})
    assert (f"| q8_0 | 3 | 2/2 | {row['drafted']} | {row['accepted']} | 2/2 | {row['f16_drafted']} | "
            f"{row['f16_accepted']} |") in md


# ---------------------------------------------------------------------------------------
# the report

def _row(threshold, worst, gross, subtle, cost_bound=None, vs64=0.0):
    return {"threshold": threshold, "worst_nmse": worst, "cost_bound": cost_bound, "worst_nmse_vs_float64": vs64,
            "nearest_gross_control": {"name": "causal_block", "nmse": gross}, "kq_scale_1pct": subtle,
            "compared": "staged", "worst_nmse_end_to_end": worst}


def _report(dry: bool) -> dict:
    fr = splits.fallback_report(_draft_block_graph("CPU"))
    cpu = judge.judge_cpu_parity({"modes": {"f16-cache": _row(1e-6, 3.8e-9, 2.4e-2, 4.2e-5, 2e-5, 1.1e-6)},
                                  "configs": {"a": {"modes": {"f16-cache": {"cases": [
                                      {"chain_ok": True, "chain_equal": True}]}}}}})
    like = {**judge.judge_like(6.05e-6, 1.5e-6, {"mscale_dropped": 2.8e-2, "latent_rope_swapped": 1.4}),
            "cases": 6, "chains_equal": 6, "draft_fallback_ops": [], "twin_fallback_ops": ["FLASH_ATTN_EXT"]}
    return {
        "kind": "dry run (CUDA off)" if dry else "cuda", "device_call": bundle.DEVICE_CALL, "budget_s": 540,
        "figures_from_gpu": not dry, "environment": {"cpus": 16, "nvidia_smi": None if dry else "NVIDIA H200"},
        "stages": {"build": {"ok": True, "seconds": 1.0}, "fallback": {"ok": False, "seconds": 2.0},
                   "threads": {"ok": None, "skipped": "not run: 10 s of the budget left, the stage needs ~30 s"}},
        "not_chosen": {"lossless": bundle.NOT_CHOSEN_WHY["lossless"]},
        "build": {"cmake_args": list(bundle.CUDA_CMAKE_ARGS), "targets": ["llama"], "seconds": 1.0},
        "fallback": {"runs": {"fa-on-f16": fr}}, "fallback_problems": ["fa-on-f16: CPU fallback of FLASH_ATTN_EXT"],
        "parity": {"like_with_like": {"devices": "CUDA0", "modes": {"flash-attn": like}},
                   "cpu": {"modes": cpu}},
        "realsize": {"models": {"config": realsize_config(False)},
                     "bandwidth": {"gbps": 4300.0, "device": "H200"},
                     "block_work": {"bytes_weights": 6_000_000_000, "bytes_cache": 10_000_000},
                     "forms": {"permuted": {"block_median_s": 2e-3, "block_min_s": 1.9e-3, "floor_s": 1.4e-3,
                                            "over_floor": 2e-3 / 1.4e-3}},
                     "fallback": splits.fallback_report(_draft_block_graph("CUDA0"))},
    }


def test_report_markdown_and_json(tmp_path):
    from llamacpp_mla_port.device.context import CheckRun

    run = CheckRun(tmp_path / "bundle", tmp_path / "out", tmp_path / "work", False, bundle.DEFAULT_STAGES, 16,
                   _report(dry=False), lambda m: None)
    run.save()
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["ok"] is False                     # a failed stage fails the report; a skipped one is listed
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| fallback | FAILED" in md and "not run: 10 s of the budget left" in md
    assert "Not run for lack of time (run them in a second call): threads." in md
    assert "Not asked for: lossless (answered on 2026-12-04" in md
    assert "| FLASH_ATTN |" in md and "Problems: fa-on-f16: CPU fallback of FLASH_ATTN_EXT" in md
    assert "| f16-cache | staged | 3.80e-09 |" in md
    assert ("| flash-attn | 6.05e-06 | 1.50e-06 | 1.50e-05 | 2x | 6/6 equal | mscale_dropped 2.8e-02 | 4628x | "
            "none / FLASH_ATTN_EXT | ok |") in md
    assert "| permuted | 2.000 ms | 1.900 ms | 1.400 ms | 1.43x |" in md
    assert "no figure here comes from a GPU" not in md
    dry = report.format_report(_report(dry=True))
    assert "no figure here comes from a GPU" in dry and bundle.DEVICE_CALL in dry


# ---------------------------------------------------------------------------------------
# the bundle

def test_broadcast_form_source():
    text = "a\n" + bundle.SERIES_V_B + "b\n"
    out = bundle.broadcast_dflash_source(text)
    assert bundle.BROADCAST_V_B in out and bundle.SERIES_V_B not in out
    with pytest.raises(DeviceCheckError, match="occurs 0 times"):
        bundle.broadcast_dflash_source("no anchor")
    with pytest.raises(DeviceCheckError, match="occurs 2 times"):
        bundle.broadcast_dflash_source(text + bundle.SERIES_V_B)


def test_keep_in_tree():
    for rel in ("CMakeLists.txt", "ggml/src/ggml-cuda/fattn.cu", "src/models/dflash.cpp", "tools/ui/CMakeLists.txt",
                "tests/test-llama-archs.cpp", "gguf-py/gguf/constants.py"):
        assert bundle.keep_in_tree(rel), rel
    for rel in ("docs/build.md", "models/ggml-vocab-llama-bpe.gguf", "ggml/src/ggml-vulkan/ggml-vulkan.cpp",
                "tools/ui/src/app.html", ".git/HEAD", "media/llama0-logo.png", "tools/server/tests/unit/test_basic.py"):
        assert not bundle.keep_in_tree(rel), rel


def test_the_driver_needs_no_gitpython():
    """The device has no GitPython: the driver's import closure must not reach it."""
    code = ("import sys; sys.modules['git'] = None; sys.modules['unidiff'] = None\n"
            "import llamacpp_mla_port.cli, llamacpp_mla_port.commands.device_check\n"
            "import llamacpp_mla_port.device.check, llamacpp_mla_port.proof.parity, llamacpp_mla_port.proof.lossless\n"
            "import llamacpp_mla_port.device.models, llamacpp_mla_port.device.variants\n"
            "import llamacpp_mla_port.fixtures.realsize, llamacpp_mla_port.fixtures.deepseek2_twin\n"
            "import llamacpp_mla_port.proof.splits, llamacpp_mla_port.build, llamacpp_mla_port.bench.floors\n"
            "import llamacpp_mla_port.fixtures.draft_gguf, llamacpp_mla_port.fixtures.target\n"
            "import llamacpp_mla_port.fixtures.target_variants, llamacpp_mla_port.proof.realsize\n"
            "import llamacpp_mla_port.proof.run.programs\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.build
def test_prepare_bundle(patched_tree, llama_build, tmp_path):
    """The folder without its converted fixtures (minutes of converter runs; the dry run makes
    them): under the carry limit, no .git, the wheels, the driver, and the pruned tree configures."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake not on PATH")
    repo = Path(__file__).resolve().parents[2]
    folder = tmp_path / "work" / "device-folder"
    manifest = bundle.prepare_bundle(patched_tree, llama_build, folder, repo / "templates", repo / "patches",
                                     repo_root=repo, fixtures=False, wheel_cache=tmp_path / "wheels-cache")
    assert manifest["carried_total_bytes"] <= bundle.CARRY_LIMIT
    assert manifest["bundle_bytes"] == bundle.folder_bytes(folder)
    with tarfile.open(folder / "llama.cpp.tar.gz") as tar:
        names = tar.getnames()
        assert all(n.startswith("llama.cpp/") for n in names)
        assert not [n for n in names if "/.git/" in n or n.startswith("llama.cpp/docs/") or
                    n.startswith("llama.cpp/models/")]
        assert "llama.cpp/src/models/dflash.cpp" in names and "llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt" in names
        tar.extractall(tmp_path / "x", filter="data")
    # the series is in the pruned tree and the overlay differs from it only by the v_b form
    tree_src = (tmp_path / "x" / "llama.cpp" / bundle.DFLASH_SOURCE).read_text()
    overlay = (folder / "overlay" / "broadcast" / bundle.DFLASH_SOURCE).read_text()
    assert tree_src.replace(bundle.SERIES_V_B, bundle.BROADCAST_V_B) == overlay
    wheels = sorted((folder / "wheels").glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == list(bundle.DEVICE_MISSING)
    with zipfile.ZipFile(wheels[0]) as z:
        assert "gguf/__init__.py" in z.namelist()
    run_sh = folder / "run.sh"
    assert run_sh.stat().st_mode & 0o111 and subprocess.run(["bash", "-n", str(run_sh)]).returncode == 0
    assert (folder / "src" / "llamacpp_mla_port" / "device" / "check.py").is_file()
    variants = json.loads((folder / "variants" / "variants.json").read_text())
    assert set(variants["stacks"]) == {"loader-probe", "cpu-q0-odd-columns", "cpu-fa-kv-head-tiles"}
    assert all((folder / "variants" / "base" / rel).is_file() for rel in variants["base"]["files"])
    assert manifest["sizes"]["variants"] == bundle.folder_bytes(folder / "variants")
    assert bundle.DEVICE_CALL in (folder / "README.md").read_text()
    build = tmp_path / "x" / "build"
    proc = subprocess.run(["cmake", "-S", str(tmp_path / "x" / "llama.cpp"), "-B", str(build),
                           "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=ON",
                           "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DGGML_RPC=ON",
                           *bundle.COMMON_CMAKE_ARGS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_cuda_toolkit_args(tmp_path):
    """A toolkit from pip wheels (nvcc, runtime; no cuBLAS, no libcuda stub), as on the device."""
    nvcc = _touch(tmp_path / "cuda" / "bin" / "nvcc")
    _touch(tmp_path / "cuda" / "include" / "cuda_runtime.h")
    nvidia = tmp_path / "site" / "nvidia"
    header = _touch(nvidia / "cu13" / "include" / "cublas_v2.h")
    lib = _touch(nvidia / "cu13" / "lib" / "libcublas.so.13")
    lt = _touch(nvidia / "cu13" / "lib" / "libcublasLt.so.13")
    driver = _touch(tmp_path / "drv" / "libcuda.so.1")
    ld = f"\tlibcudart.so.13 (libc6,x86-64) => /x/libcudart.so.13\n\tlibcuda.so.1 (libc6,x86-64) => {driver}\n"
    args = toolkit.cuda_toolkit_args(str(nvcc), [nvidia], ld)
    assert args == [f"-DCUDA_cublas_LIBRARY={lib}", f"-DCUDA_cublasLt_LIBRARY={lt}",
                    f"-DCMAKE_CUDA_FLAGS=-I{header.parent}", f"-DCMAKE_CXX_FLAGS=-I{header.parent}",
                    f"-DCUDA_cuda_driver_LIBRARY={driver}"]
    # a whole toolkit needs nothing
    _touch(tmp_path / "cuda" / "include" / "cublas_v2.h")
    _touch(tmp_path / "cuda" / "lib64" / "libcublas.so")
    _touch(tmp_path / "cuda" / "lib64" / "stubs" / "libcuda.so")
    assert toolkit.cuda_toolkit_args(str(nvcc), [], "") == []
    # no cuBLAS anywhere: a clear error
    (tmp_path / "cuda" / "include" / "cublas_v2.h").unlink()
    with pytest.raises(DeviceCheckError, match="no cuBLAS"):
        toolkit.cuda_toolkit_args(str(nvcc), [tmp_path / "empty"], "")


@pytest.mark.build
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc: the CUDA configure needs CUDA's compiler")
def test_pruned_tree_configures_with_cuda(patched_tree, tmp_path):
    """The pruned tree holds everything ggml-cuda's CMake reads. Where this machine's toolkit
    lacks cuBLAS or libcuda (no GPU here), empty stand-ins satisfy the configure (nothing is
    compiled or linked)."""
    tar = tmp_path / "tree.tar.gz"
    bundle.write_tree_tarball(patched_tree, tar)
    with tarfile.open(tar) as t:
        t.extractall(tmp_path, filter="data")
    fake = tmp_path / "fake" / "nvidia"
    _touch(fake / "cublas" / "include" / "cublas_v2.h")
    _touch(fake / "cublas" / "lib" / "libcublas.so.13")
    _touch(fake / "cublas" / "lib" / "libcublasLt.so.13")
    driver = _touch(tmp_path / "fake" / "libcuda.so.1")
    extra = toolkit.cuda_toolkit_args(None, [fake], f"\tlibcuda.so.1 (libc6,x86-64) => {driver}\n")
    proc = subprocess.run(["cmake", "-S", str(tmp_path / "llama.cpp"), "-B", str(tmp_path / "build"),
                           "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=ON",
                           "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DGGML_RPC=ON",
                           "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90", *extra, *bundle.COMMON_CMAKE_ARGS],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # whatever the generator, the CUDA backend's sources were taken in (flash attention among them)
    cuda_dir = tmp_path / "build" / "ggml" / "src" / "ggml-cuda"
    generated = [p.read_text(errors="replace") for p in cuda_dir.rglob("*") if p.is_file() and p.stat().st_size < 2**22]
    generated.append((tmp_path / "build" / "build.ninja").read_text() if (tmp_path / "build" / "build.ninja").is_file()
                     else "")
    assert cuda_dir.is_dir() and any("fattn.cu" in text for text in generated)


# ---------------------------------------------------------------------------------------
# the shape of device/

DEVICE = Path(__file__).resolve().parents[2] / "src" / "llamacpp_mla_port" / "device"


def oversized(paths, limit: int = 400) -> list[str]:
    """Modules over `limit` lines, and classes other than plain data holders (no stage drivers)."""
    import ast

    out = [f"{p.name}: {n} lines" for p in paths if (n := len(p.read_text().splitlines())) > limit]
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef) and node.name not in ("CheckRun",):
                out.append(f"{p.name}: class {node.name}")
    return out


def test_device_modules_stay_small_and_drive_stages_as_functions(tmp_path):
    assert oversized(sorted(DEVICE.glob("*.py"))) == []
    # control: a long module and a driver class are both caught
    (tmp_path / "long.py").write_text("x = 1\n" * 401)
    (tmp_path / "drv.py").write_text("class Check:\n    def run(self):\n        pass\n")
    assert oversized([tmp_path / "long.py", tmp_path / "drv.py"]) == ["long.py: 401 lines", "drv.py: class Check"]
