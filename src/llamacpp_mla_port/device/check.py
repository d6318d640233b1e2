"""The device check's driver (RUN): the stages in order inside the time budget, the report
written after every stage (device.bundle's doc lists the stages); the real-size models, the
copy bandwidth, and the background entry that writes the models while the build runs:

    python -m llamacpp_mla_port.device.check models TINY_TARGET OUT_DIR [--reduced]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import sys
import tarfile
import time
from pathlib import Path

from llamacpp_mla_port.device.bundle import (CHECK_TARGETS, COMMON_CMAKE_ARGS, CUDA_CMAKE_ARGS, DEVICE_CALL,
                                             DFLASH_SOURCE, GPU_DEVICE, PLACEMENT_ARGS, QUANTIZED_DRAFT_CACHE,
                                             STAGE_NEEDS_S, STAGES)
from llamacpp_mla_port.device.judge import judge_parity
from llamacpp_mla_port.device.report import format_report
from llamacpp_mla_port.device.toolkit import cuda_toolkit_args
from llamacpp_mla_port.errors import DeviceCheckError, PortError, ProcessError
from llamacpp_mla_port.gguf.contract import K3_BLOCK, K3_DSPARK_REAL_CONFIG
from llamacpp_mla_port.process import run
from llamacpp_mla_port.project import build_in, program, tree_in
from llamacpp_mla_port.proof.run.processes import Owned
from llamacpp_mla_port.stages import StageFailed, Stages, write_json

#: the real config's DeepSeek-YaRN factor
REAL_YARN_FACTOR = K3_DSPARK_REAL_CONFIG["rope_parameters"]["factor"]
#: the callback name of v_b's product in each form: build_attn's fattn_mla-IL with flash
#: attention on (the series, deepseek2's form), the overlay's attn_out_v_b-IL
V_B_NODE = {"permuted": "fattn_mla", "broadcast": "attn_out_v_b"}


def v_b_form_ops(sched_log: str, form: str) -> list[str]:
    """The ops of v_b's product node in the draft graphs of one scheduler log (GGML_SCHED_DEBUG=2)."""
    from llamacpp_mla_port.proof.splits import draft_graphs, node_ops, parse_sched_log

    return node_ops(draft_graphs(parse_sched_log(sched_log)), V_B_NODE[form])


def check_v_b_form(form: str, ops: list[str]) -> None:
    """v_b's product must be one MUL_MAT node in each form, or the timing compares the wrong graphs."""
    if ops != ["MUL_MAT"]:
        raise DeviceCheckError(f"the {form} v_b form did not build as meant: the ops of its {V_B_NODE[form]}-IL "
                               f"nodes are {ops}, one MUL_MAT expected",
                               hint="the draft graph (src/models/dflash.cpp) or the overlay moved: "
                                    "update device.check.V_B_NODE and device.bundle's overlay")


def realsize_config(reduced: bool) -> dict:
    """fixtures.draft_gguf config of the real draft (or the dry run's reduced one: the real
    latent 512 + 64, everything else smaller) and the target's width and vocabulary."""
    if not reduced:
        cfg = K3_DSPARK_REAL_CONFIG
        keys = ("num_hidden_layers", "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                "qk_rope_head_dim", "v_head_dim", "intermediate_size", "markov_rank", "rope_theta")
        return {"n_embd": cfg["target_hidden_size"], "n_vocab": cfg["vocab_size"], "draft": {
            **{k: cfg[k] for k in keys}, "block_size": K3_BLOCK, "target_layers": [1, 2, 3, 4, 5],
            "rope_scaling_factor": REAL_YARN_FACTOR,
            "original_max_position_embeddings": cfg["rope_parameters"]["original_max_position_embeddings"],
            "std": 0.02}}
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
    from llamacpp_mla_port.fixtures.target_variants import write_deep_kimi_k3_target, write_wide_kimi_k3_target

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
        self.tree, self.build = tree_in(self.work), build_in(self.work)
        self.devices = GPU_DEVICE if self.cuda else None
        self.report: dict = {"kind": "cuda" if self.cuda else "dry run (CUDA off)", "device_call": DEVICE_CALL,
                             "budget_s": budget_s, "threads": self.threads, "stages": {}, "figures_from_gpu": self.cuda}
        self._log = log or (lambda m: (sys.stderr.write(m + "\n"), sys.stderr.flush()))
        self.models_proc: Owned | None = None
        self.runner = Stages(self.report["stages"], log=self._stage_ended, budget_s=budget_s)

    def log(self, msg: str) -> None:
        self._log(f"device-check [{time.monotonic() - self.t0:6.1f} s] {msg}")

    def remaining(self) -> float:
        return self.runner.remaining()

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.report["seconds"] = round(time.monotonic() - self.t0, 1)
        self.report["ok"] = bool(self.report["stages"]) and all(
            s.get("ok") for s in self.report["stages"].values() if not s.get("skipped"))
        write_json(self.out / "report.json", self.report, indent=1, default=str)
        (self.out / "report.md").write_text(format_report(self.report))

    def stage(self, name: str, fn, needs_s: float = 0.0) -> None:
        """One stage of `self.stages` through the one stage runner, inside the time budget; a
        stage that returns False failed its checks (its figures are in the report)."""
        if name not in self.stages:
            return
        self.log(f"stage {name} ...")

        def checked() -> None:
            if not fn():
                raise StageFailed({"message": f"the {name} stage's checks failed (its figures are in the report)"})

        self.runner.run(name, checked, needs_s=needs_s)
        self.save()

    def _stage_ended(self, name: str, st: dict) -> None:
        if st.get("skipped"):
            self.log(f"stage {name}: skipped (time)")
        else:
            self.log(f"stage {name}: {'ok' if st['ok'] else 'FAILED ' + st.get('error', '(see report)')[:300]} "
                     f"({st['seconds']} s)")

    # ------------------------------------------------------------------ setup
    def environment(self) -> None:
        env: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
        for key, cmd in (("nvidia_smi", ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.sm",
                                         "--format=csv,noheader"]),
                         ("nvcc", ["nvcc", "--version"]), ("cmake", ["cmake", "--version"])):
            try:
                proc = run(cmd, timeout=30)
                env[key] = (proc.stdout.strip().splitlines() or [""])[-1] if proc.returncode == 0 else None
            except ProcessError:          # not installed, or no answer within 30 s
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
        cmd = [sys.executable, "-m", "llamacpp_mla_port.device.check", "models",
               str(self.work / "fixtures" / "kimi-k3-target.gguf"), str(out)] + (["--reduced"] if self.dry_run else [])
        self.models_log = self.work / "models.log"
        self.models_out = out
        self.models_proc = Owned(cmd, self.models_log, env={**os.environ}, name="the real-size models' writer")
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
        from llamacpp_mla_port.proof.run.programs import compile_program
        return compile_program(name, self.tree, self.build, out_dir=self.work / "proof-bin" / _lib_key(self.build))

    def do_fallback(self) -> bool:
        """The 576-latent draft's graphs: where the scheduler put each node (module doc)."""
        import numpy as np

        from llamacpp_mla_port.fixtures.draft_gguf import write_mla_draft_gguf
        from llamacpp_mla_port.proof.run.draft_logits import run_draft_logits
        from llamacpp_mla_port.proof.splits import fallback_report

        target = self.work / "fixtures" / "kimi-k3-target.gguf"
        draft = write_mla_draft_gguf(self.work / "fallback" / "mla576.gguf", target)
        binary = self._program("draft-logits")
        runs = {}
        rng = np.random.default_rng(7)
        from llamacpp_mla_port.proof.reference.model import read_target_head
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

    def do_archs(self) -> bool:
        """test-llama-archs' DFlash cases (the series' tests in upstream's harness): each device vs the CPU."""
        import re

        res = run([program(self.build, "test-llama-archs"), "-a", "dflash", "-s", "1"], timeout=600)
        rows = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", res.stdout).splitlines()
                if ln.startswith("|") and "dflash" in ln]
        self.report["archs"] = {"rc": res.returncode, "rows": rows, "log_tail": res.stderr[-2000:]}
        status = [r.split("|")[4].split()[0] for r in rows if len(r.split("|")) > 5 and r.split("|")[4].strip()]
        return res.returncode == 0 and "OK" in status and set(status) <= {"OK", "SKIP"}

    def do_parity(self) -> bool:
        from llamacpp_mla_port.proof.parity import run_parity
        from llamacpp_mla_port.proof.reference.model import read_target_head
        from llamacpp_mla_port.fixtures.target_variants import target_with_layers

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
                           threads=min(self.threads, 4), log=self.log, extra=PLACEMENT_ARGS,
                           draft_cache=QUANTIZED_DRAFT_CACHE)
        bigram_accepted = sum(r["accepted"] for r in rep["speculative_simple"] + rep["server"]
                              if r["draft"] == "bigram")
        rep["bigram_accepted"] = bigram_accepted
        self.report["lossless"] = rep
        return rep["n_mismatches"] == 0 and bigram_accepted > 0

    def do_realsize(self) -> bool:
        from llamacpp_mla_port.bench.floors import block_work

        if self.models_proc is None:
            self.start_models()
        rc = self.models_proc.wait(max(10.0, min(self.remaining(), 1800)))
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
        rs["fallback"], ops = self.probe_form(models, "permuted")
        ok = self._fallback_verdict({"realsize-fa-on-f16": rs["fallback"]})
        rs["v_b_ops"] = {"permuted": ops}
        check_v_b_form("permuted", ops)
        rs["forms"]["permuted"] = self._time_form(models, "permuted")
        self.save()
        # the 4-D broadcast form: rebuild libllama with the overlay, prove it, time it, restore
        original = (self.tree / DFLASH_SOURCE).read_text()
        try:
            # copyfile, not copy2: the source must look newer than its object to be recompiled
            shutil.copyfile(self.bundle / "overlay" / "broadcast" / DFLASH_SOURCE, self.tree / DFLASH_SOURCE)
            self._rebuild_llama()
            # the graph must show the other form: v_b's product is the overlay's own node
            _, rs["v_b_ops"]["broadcast"] = self.probe_form(models, "broadcast")
            check_v_b_form("broadcast", rs["v_b_ops"]["broadcast"])
            rs["broadcast_parity_f32"] = self._overlay_parity()
            rs["forms"]["broadcast"] = self._time_form(models, "broadcast")
        finally:
            (self.tree / DFLASH_SOURCE).write_text(original)
            self._rebuild_llama()
        b, p = rs["forms"]["broadcast"]["block_median_s"], rs["forms"]["permuted"]["block_median_s"]
        rs["permuted_over_broadcast"] = p / b
        rs["faster_form"] = "broadcast" if b < p else "permuted"
        return ok and rs["broadcast_parity_f32"]["ok"]

    def probe_form(self, models: dict, form: str) -> tuple[dict, list[str]]:
        """One untimed draft-bench run with the scheduler's report: the draft graphs' splits
        and the ops of the v_b product (fattn_mla-N in the series, attn_out_v_b-N in the overlay)."""
        from llamacpp_mla_port.proof.splits import fallback_report

        probe = self._bench(models, f"probe-{form}", repeats=1, env={"GGML_SCHED_DEBUG": "2"})
        text = Path(str(probe["json"]) + ".log").read_text(errors="replace")
        return fallback_report(text), v_b_form_ops(text, form)

    def _rebuild_llama(self) -> None:
        from llamacpp_mla_port.build import ensure_build
        t = time.monotonic()
        ensure_build(self.tree, self.build, ("llama",), cmake_args=self.cmake_args(), jobs=self.threads, echo=False)
        self.report.setdefault("rebuilds_s", []).append(round(time.monotonic() - t, 1))

    def _overlay_parity(self) -> dict:
        from llamacpp_mla_port.proof.parity import MODES, PARITY_CONFIGS, run_parity
        from llamacpp_mla_port.proof.reference.model import read_target_head
        from llamacpp_mla_port.fixtures.target_variants import target_with_layers

        target = self.work / "fixtures" / "kimi-k3-target.gguf"
        embd, _ = read_target_head(target)
        pdir = self.work / "fixtures" / "parity"
        f32 = [m for m in MODES if m.name == "f32"]
        res = run_parity(self.tree, self.build, pdir, lambda h, v, n: target_with_layers(target, pdir, n),
                         embd.shape[1], embd.shape[0], configs=PARITY_CONFIGS[:1], modes=f32,
                         threads=min(self.threads, 4), log=self.log, devices=self.devices)
        row = res.report["modes"]["f32"]
        return broadcast_parity_verdict(PARITY_CONFIGS[0].name, row["worst_nmse"], row["threshold"], bool(res.passed),
                                        self.report.get("parity", {}).get("modes", {}).get("f32") if self.cuda else None)

    def _bench(self, models: dict, tag: str, repeats: int, env: dict | None = None) -> dict:
        from llamacpp_mla_port.proof.run.processes import run_bounded

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
            for name in STAGES:
                if name != "build" and not self.report["stages"].get("build", {}).get("ok", "build" not in self.stages):
                    break                   # nothing runs without the build
                self.stage(name, getattr(self, "do_" + name), needs_s=STAGE_NEEDS_S.get(name, 0.0))
        except PortError as err:
            self.report["stages"]["setup"] = {"ok": False, "error": str(err)}
        finally:
            if self.models_proc is not None:
                if self.models_proc.alive():      # still writing: killed at once, its group with it
                    self.models_proc.kill()
                self.models_proc.stop()
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


def broadcast_parity_verdict(config: str, worst_nmse: float, cpu_bound: float, cpu_ok: bool,
                             judged_f32: dict | None) -> dict:
    """The broadcast form's F32 parity, judged like the series' own form: against the bound
    the parity stage set for f32 on this backend (`judged_f32`, judge.judge_parity's row;
    CUDA's F32 products are not the CPU's), else against the CPU bound."""
    if judged_f32 is None:
        return {"config": config, "worst_nmse": worst_nmse, "bound": cpu_bound, "basis": "CPU bound", "ok": cpu_ok}
    return {"config": config, "worst_nmse": worst_nmse, "bound": judged_f32["bound"],
            "basis": f"the parity stage's f32 bound ({judged_f32['basis']})",
            "ok": worst_nmse <= judged_f32["bound"]}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _lib_key(build: Path) -> str:
    """Proof programs are compiled per libllama (a rebuilt one gets fresh binaries)."""
    from llamacpp_mla_port.proof.run.programs import library_dir
    lib = (library_dir(build) / "libllama.so").resolve()
    st = lib.stat()
    return hashlib.sha256(f"{lib}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]


def run_check(bundle: Path, out: Path, work: Path, dry_run: bool, budget_s: float | None = None,
              stages=STAGES, log=None) -> dict:
    return Check(bundle, out, work, dry_run, budget_s, stages, log=log).run()


def _models_main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "models":
        sys.stderr.write("usage: python -m llamacpp_mla_port.device.check models TINY_TARGET OUT_DIR [--reduced]\n")
        return 2
    res = write_realsize_models(Path(argv[1]), Path(argv[2]), reduced="--reduced" in argv)
    write_json(Path(argv[2]) / "models.json", res, indent=1)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(_models_main(sys.argv[1:]))
