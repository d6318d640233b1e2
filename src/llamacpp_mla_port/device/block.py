"""The real-size draft block on the device: 7 tokens over 512 cached rows (FA on, F16 cache)
timed by draft-bench against the HBM floor (bench.floors' bytes / the copy bandwidth measured
in the same run), with a per-node profile grouped as the CPU's (device.profile); and, as a
stage of its own, the other `v_b` form (a 4-D broadcast matvec after the attention, the
bundle's overlay of dflash.cpp) built, proven and timed beside the series' form.
Stage functions over a device.context.CheckRun (True: checks passed)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from pathlib import Path

from llamacpp_mla_port.bench.floors import block_work
from llamacpp_mla_port.build import ensure_build
from llamacpp_mla_port.device import bundle
from llamacpp_mla_port.device.backend import fallback_verdict
from llamacpp_mla_port.device.context import CheckRun
from llamacpp_mla_port.device.crossparity import cpu_parity, run_cross_parity
from llamacpp_mla_port.device.judge import judge_cpu_mode
from llamacpp_mla_port.device.profile import block_profile, group_bytes
from llamacpp_mla_port.errors import DeviceCheckError
from llamacpp_mla_port.proof.parity import MODES, PARITY_CONFIGS
from llamacpp_mla_port import process
from llamacpp_mla_port.proof.splits import draft_graphs, fallback_report, node_ops, parse_sched_log

#: the callback name of v_b's product in each form: build_attn's fattn_mla-IL with flash
#: attention on (the series, deepseek2's form), the overlay's attn_out_v_b-IL
V_B_NODE = {"permuted": "fattn_mla", "broadcast": "attn_out_v_b"}
BLOCK, BLOCK_CTX = 7, 512


def v_b_form_ops(sched_log: str, form: str) -> list[str]:
    """The ops of v_b's product node in the draft graphs of one scheduler log (GGML_SCHED_DEBUG=2)."""
    return node_ops(draft_graphs(parse_sched_log(sched_log)), V_B_NODE[form])


def check_v_b_form(form: str, ops: list[str]) -> None:
    """v_b's product must be one MUL_MAT node in each form, or the timing compares the wrong graphs."""
    if ops != ["MUL_MAT"]:
        raise DeviceCheckError(f"the {form} v_b form did not build as meant: the ops of its {V_B_NODE[form]}-IL "
                               f"nodes are {ops}, one MUL_MAT expected",
                               hint="the draft graph (src/models/dflash.cpp) or the overlay moved: "
                                    "update device.block.V_B_NODE and device.bundle's overlay")


def copy_bandwidth(cuda: bool, mib: int, repeats: int = 20) -> dict:
    """Device-to-device (or host) copy bandwidth through PyTorch: bytes read + written / the
    median time of `repeats` copies after warm-up, on random data."""
    import torch                      # the device's image has it; only this measurement needs it

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


def draft_bench(run: CheckRun, models: dict, tag: str, repeats: int, env: dict | None = None,
                profile: bool = False) -> dict:
    """One draft-bench run of the real-size block (and, with `profile`, one profiled block after it)."""
    out = run.work / "bench" / f"{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [run.program("draft-bench"), "--draft", models["draft"], "--target", models["target"], "--out", out,
           "--inject", "", "--block", BLOCK, "--block-ctx", BLOCK_CTX, "--repeats", repeats,
           "--threads", run.threads, "--flash-attn", "on", "--cache-type", "f16"] + (["--profile"] if profile else [])
    if run.devices:
        cmd += ["--draft-devices", run.devices, "--target-devices", run.devices]
    proc = process.run([str(c) for c in cmd], timeout=max(60.0, min(run.remaining(), 900)),
                       env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise DeviceCheckError(f"draft-bench {tag} failed (exit {proc.returncode}): {proc.stderr[-2000:]}",
                               hint=" ".join(str(c) for c in cmd))
    data = json.loads(out.read_text())
    data["json"], data["command"] = str(out), " ".join(str(c) for c in cmd)
    return data


def probe_form(run: CheckRun, models: dict, form: str) -> tuple[dict, list[str]]:
    """One untimed draft-bench run with the scheduler's report: the draft graphs' splits and
    the ops of the v_b product (fattn_mla-N in the series, attn_out_v_b-N in the overlay)."""
    probe = draft_bench(run, models, f"probe-{form}", repeats=1, env={"GGML_SCHED_DEBUG": "2"})
    text = Path(probe["json"] + ".log").read_text(errors="replace")
    return fallback_report(text), v_b_form_ops(text, form)


def time_form(run: CheckRun, models: dict, form: str, profile: bool = False) -> tuple[dict, dict]:
    with run.quiet():
        data = draft_bench(run, models, form, repeats=20 if run.cuda else 3, profile=profile)
    med = statistics.median(data["block_seconds"])
    floor = run.report["realsize"]["floor_s"]
    return {"block_seconds": data["block_seconds"], "block_median_s": med, "block_min_s": min(data["block_seconds"]),
            "floor_s": floor, "over_floor": med / floor, "load_seconds": data.get("load_seconds"),
            "system_info": data.get("system_info"), "command": data["command"]}, data


def realsize_stage(run: CheckRun) -> bool:
    """The series' form of the real-size block: where its graph runs, its time against the floor,
    and where that time goes (device.profile)."""
    models = run.model("realsize")
    rs: dict = {"models": models, "forms": {}}
    run.report["realsize"] = rs
    with run.quiet():
        rs["bandwidth"] = copy_bandwidth(run.cuda, 4096 if run.cuda else 256, repeats=20 if run.cuda else 5)
    draft, target = Path(models["draft"]), Path(models["target"])
    work = block_work(draft, target, n_block=BLOCK, n_ctx=BLOCK_CTX, cache_bytes_per_value=2.0)
    rs["block_work"] = work.as_dict()
    rs["floor_s"] = work.bytes_total / (rs["bandwidth"]["gbps"] * 1e9)
    rs["fallback"], ops = probe_form(run, models, "permuted")
    ok = fallback_verdict(run, {"realsize-fa-on-f16": rs["fallback"]})
    rs["v_b_ops"] = {"permuted": ops}
    check_v_b_form("permuted", ops)
    rs["forms"]["permuted"], data = time_form(run, models, "permuted", profile=True)
    rs["profile"] = block_profile(data["profile"], group_bytes(draft, target, BLOCK, BLOCK_CTX),
                                  rs["bandwidth"]["gbps"], rs["forms"]["permuted"]["block_median_s"])
    return ok


def _rebuild_llama(run: CheckRun) -> None:
    t = time.monotonic()
    ensure_build(run.tree, run.build, ("llama",), cmake_args=run.cmake_args(), jobs=run.threads, echo=False)
    run.report.setdefault("rebuilds_s", []).append(round(time.monotonic() - t, 1))


def overlay_parity(run: CheckRun) -> dict:
    """The broadcast build's graph proven before its time counts: on the CPU against float64 (the
    f32 mode's bound, first parity shape); on a GPU also like with like (device.crossparity)."""
    f32 = tuple(m for m in MODES if m.name == "f32")
    res = cpu_parity(run, PARITY_CONFIGS[:1], f32)
    cpu = judge_cpu_mode(res.report["modes"]["f32"])
    out = {"config": PARITY_CONFIGS[0].name, "cpu": cpu, "ok": cpu["ok"] and bool(res.passed)}
    if run.cuda:
        like = run_cross_parity(run.tree, run.build, run.fixtures, run.work / "overlay-parity", run.program,
                                run.devices, min(run.threads, 4), configs=PARITY_CONFIGS[:1], modes=f32, log=run.log)
        out["like_with_like"] = like["modes"]["f32"]
        out["ok"] = out["ok"] and like["modes"]["f32"]["ok"]
    return out


def vb_forms_stage(run: CheckRun) -> bool:
    """The broadcast v_b form (module doc), timed beside the series' (answered on 2026-12-04:
    the series' form 7 % faster on the H200; not in the default run). Needs the realsize stage."""
    rs = run.report.get("realsize")
    if not rs or "permuted" not in rs.get("forms", {}):
        raise DeviceCheckError("the vb-forms stage needs the realsize stage's figures", hint="run both stages")
    models, original = rs["models"], (run.tree / bundle.DFLASH_SOURCE).read_text()
    try:
        # copyfile, not copy2: the source must look newer than its object to be recompiled
        shutil.copyfile(run.bundle / "overlay" / "broadcast" / bundle.DFLASH_SOURCE, run.tree / bundle.DFLASH_SOURCE)
        _rebuild_llama(run)
        _, rs["v_b_ops"]["broadcast"] = probe_form(run, models, "broadcast")
        check_v_b_form("broadcast", rs["v_b_ops"]["broadcast"])
        rs["broadcast_parity"] = overlay_parity(run)
        rs["forms"]["broadcast"], _ = time_form(run, models, "broadcast")
    finally:
        (run.tree / bundle.DFLASH_SOURCE).write_text(original)
        _rebuild_llama(run)
    b, p = rs["forms"]["broadcast"]["block_median_s"], rs["forms"]["permuted"]["block_median_s"]
    rs["permuted_over_broadcast"] = p / b
    rs["faster_form"] = "broadcast" if b < p else "permuted"
    return bool(rs["broadcast_parity"]["ok"])
