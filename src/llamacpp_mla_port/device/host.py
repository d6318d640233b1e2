"""The device host's CPU, in the same visit: what it is (lscpu, the ISA flags, AMX), the
upstream #18099 reproducer (the loader-probe stack) on CPU builds of the base and the branch
(device.variants), and llama-bench rows of the CPU stacks' bench tables against the base at
THREADS, ABBA, prompts trimmed to THREAD_PROMPTS, into one JSON-lines file for
scripts/compare-llama-bench.py. docs/device-check.md ("The host CPU").
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import statistics
import time
from pathlib import Path
from typing import Callable

from llamacpp_mla_port import process
from llamacpp_mla_port.device.context import CheckRun
from llamacpp_mla_port.errors import PortError, ProcessError
from llamacpp_mla_port.proof.run.programs import ggml_cpu_features

AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni",
             *AMX_FLAGS)
ABORT_18099 = "GGML_ASSERT(*cur_backend_id != -1)"
#: the reproducer's benchmark (upstream review: llama-bench -p 512 -n 128 before and after)
REPRO_BENCH = ("-p", "512", "-n", "128")
#: branch / base at --repack 0 (the same code on both sides) beyond a 2-core VM's noise
CONTROL_RANGE = (0.8, 1.25)
THREADS = (16, 8, 4, 1)
ROUNDS = 2
#: prompts of the thread rows (the stacks' own lists without the sizes that take minutes at one
#: thread): the odd column counts the Q0 tail serves, and the tiles' row counts
THREAD_PROMPTS = {"cpu-q0-odd-columns": "1,2,3,4,5,6,7,8,16,64", "cpu-fa-kv-head-tiles": "1,4,7,8,16,64"}
#: a dry run's context depth at most (a 4096-row refill takes minutes on 2 cores)
DRY_DEPTH = 256


def variants_manifest(bundle: Path) -> dict:
    """The bundle's variants/variants.json (device.variants); empty when the bundle has none."""
    path = Path(bundle) / "variants" / "variants.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def host_stage(run: CheckRun) -> bool:
    """lscpu, the ISA flags and AMX, what the run's own build compiled in, then the #18099
    reproducer on the CPU builds of the base and the loader-probe stack."""
    cpu = cpu_description()
    rep: dict = {"cpu": cpu}
    run.report["host"] = rep
    try:
        rep["build_features"] = ggml_cpu_features(run.tree, run.build)
    except PortError as err:
        rep["build_features"] = {"error": str(err)[:500]}
    run.save()
    base, branch = run.variant_bench("base"), run.variant_bench("loader-probe")
    model = Path(run.model("repro")["path"])
    with run.quiet():
        rep["repro"] = reproduce_18099(base, branch, model, cpu["amx"], run.threads, reps=3 if run.cuda else 1)
    rep["amx_verdict"] = amx_verdict(cpu, rep.get("build_features", {}), rep["repro"])
    return bool(rep["repro"]["ok"])


def amx_verdict(cpu: dict, features: dict, repro: dict) -> str:
    """One line: does this CPU have AMX, does the native build use it, what the reproducer showed."""
    if not cpu["amx"]:
        return "no AMX on this CPU (amx_tile/amx_int8 absent): #18099 cannot happen here"
    compiled = features.get("amx_int8")
    used = "AMX" in repro["branch_default"]["model_buffers"]
    return (f"AMX on this CPU; the native build {'compiles it in' if compiled else 'does NOT compile it in'}; "
            f"the branch's default load {'puts weights in the AMX buffer' if used else 'uses no AMX buffer'}; "
            f"{repro['verdict']}")


def threads_stage(run: CheckRun) -> bool:
    """The thread rows (module doc) of the CPU stacks with a bench table, base against each."""
    stacks = {n: st for n, st in variants_manifest(run.bundle).get("stacks", {}).items()
              if n in THREAD_PROMPTS and st.get("bench")}
    bins = {"base": run.variant_bench("base"), **{n: run.variant_bench(n) for n in stacks}}
    keys = [f"{n}:{q}" for n, st in stacks.items() for q in st["bench"]["types"]]
    models = {k: Path(run.model(k)["path"]) for k in keys}
    threads = THREADS if run.cuda else (run.threads,) if run.quick else (run.threads, 1)
    groups = thread_row_groups(stacks, models, threads, max_depth=None if run.cuda else DRY_DEPTH,
                               prompts="1,7" if run.quick else None)
    jsonl = run.work / "host" / "thread-rows.jsonl"

    def save(rep: dict) -> None:          # after every group: a call cut by its limit keeps the rows
        run.report["thread_rows"] = rep
        run.save()
        shutil.copyfile(jsonl, run.out / "thread-rows.jsonl")

    with run.quiet():
        rep = thread_rows(bins, groups, jsonl, run.remaining, log=run.log, save=save)
    save(rep)
    return all(r["outcome"] == "ran" for g in rep["groups"] for r in g["runs"])


def cpu_description() -> dict:
    """lscpu's text and the CPU's ISA flags (/proc/cpuinfo)."""
    try:
        proc = process.run(["lscpu"], timeout=30)
        text = proc.stdout if proc.returncode == 0 else ""
    except ProcessError:
        text = ""
    fields = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in text.splitlines() if ":" in ln)}
    try:                              # the first CPU's entries (no lscpu: its model name from here too)
        info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        info = ""
    cpuinfo = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in info.splitlines() if ":" in ln)}
    flags = set(cpuinfo.get("flags", "").split())
    return {"lscpu": text, "model": fields.get("Model name") or cpuinfo.get("model name"), "cpus": fields.get("CPU(s)"),
            "flags": [f for f in ISA_FLAGS if f in flags], "amx": all(f in flags for f in AMX_FLAGS[:2])}


def classify(proc) -> dict:
    """A llama-bench run: ran (rows), aborted (the assert line), crashed (another signal: SIGILL
    is ggml's AMX Q8_0 tile path as GCC 12 builds it, upstream PR #26954) or failed."""
    text = proc.stdout + "\n" + proc.stderr
    asserts = [ln.strip() for ln in text.splitlines() if "GGML_ASSERT" in ln]
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and rows:
        outcome = "ran"
    elif asserts or proc.returncode in (-6, 134):
        outcome = "aborted"
    elif proc.returncode < 0:
        outcome = f"crashed ({signal.Signals(-proc.returncode).name})"
    else:
        outcome = "failed"
    buffers = sorted(set(re.findall(r"(\S+) model buffer size", proc.stderr)))
    return {"outcome": outcome, "returncode": proc.returncode, "assert": asserts[0] if asserts else None,
            "model_buffers": buffers, "rows": rows, "seconds": round(proc.seconds, 2),
            "stderr_tail": proc.stderr[-1500:] if outcome != "ran" else ""}


def llama_bench(binary: Path, model: Path, args, timeout: float = 600, verbose: bool = False) -> dict:
    cmd = [str(binary), "-m", str(model), *map(str, args), "-o", "jsonl"] + (["-v"] if verbose else [])
    try:
        res = classify(process.run(cmd, timeout=timeout))
    except ProcessError as err:
        res = {"outcome": "failed", "returncode": None, "assert": None, "model_buffers": [], "rows": [],
               "stderr_tail": str(err)[-1500:]}
    res["command"] = " ".join(cmd)
    return res


def _speed(rows: list[dict]) -> dict:
    return {f"{'pp' if r['n_prompt'] else 'tg'}{r['n_prompt'] or r['n_gen']} repack {int(r.get('repack', 1))}":
            round(r["avg_ts"], 2) for r in rows}


def reproduce_18099(base: Path, branch: Path, model: Path, amx: bool, threads: int, reps: int = 3) -> dict:
    """The reproducer (module doc); `amx`: the CPU has it (else the abort cannot happen here).
    Loading and generating is shown by token generation alone (-p 0: one column per product, the
    path every Q8_0 AMX build runs); the benchmark's AMX run (--repack 1) is separate, so a crash
    there (the GCC 12 tile bug) leaves the rest standing, and is named in the verdict."""
    probe = ("-p", "0", "-n", "8", "-r", "1", "-t", str(threads))
    rep = {"model": str(model), "amx_cpu": amx, "base_default": llama_bench(base, model, probe, verbose=True),
           "branch_default": llama_bench(branch, model, probe, verbose=True)}
    bench = (*REPRO_BENCH, "-r", str(reps), "-t", str(threads))
    # base, branch, base: a drift of the machine falls on both sides
    rep["before"] = llama_bench(base, model, (*bench, "--repack", "0"))
    rep["after"] = llama_bench(branch, model, (*bench, "--repack", "0"))
    rep["after_amx"] = llama_bench(branch, model, (*bench, "--repack", "1"))
    again = llama_bench(base, model, (*bench, "--repack", "0"))
    rep["before_ts"] = {k: round((v + _speed(again["rows"]).get(k, v)) / 2, 2)
                        for k, v in _speed(rep["before"]["rows"]).items()}
    rep["after_ts"] = {**_speed(rep["after"]["rows"]), **_speed(rep["after_amx"]["rows"])}
    # at --repack 0 both sides run the same code: a ratio outside CONTROL_RANGE says the speeds
    # compare nothing (the run's noise or a busy machine)
    rep["control"] = {k.split(" repack")[0]: round(rep["after_ts"][k] / v, 3)
                      for k, v in rep["before_ts"].items() if v and rep["after_ts"].get(k)}
    moved = {k: r for k, r in rep["control"].items() if not CONTROL_RANGE[0] <= r <= CONTROL_RANGE[1]}
    b, br = rep["base_default"], rep["branch_default"]
    ran = all(x["outcome"] == "ran" for x in (rep["before"], rep["after"], again, br))
    crash = "" if rep["after_amx"]["outcome"] == "ran" else \
        f"; the branch's --repack 1 benchmark {rep['after_amx']['outcome']}"
    if moved:
        crash += ("; the --repack 0 control moved (" + ", ".join(f"{k} {r:.2f}x" for k, r in moved.items())
                  + f"): outside {CONTROL_RANGE[0]}-{CONTROL_RANGE[1]}, the run's noise or a busy machine: "
                  "the speeds compare nothing")
    if amx:
        rep["ok"] = bool(ran and b["outcome"] == "aborted" and ABORT_18099 in (b["assert"] or "")
                         and "AMX" in br["model_buffers"])
        rep["verdict"] = ("reproduced: the base aborts with " + ABORT_18099 + ", the branch loads (AMX buffer) and "
                          "generates" if rep["ok"] else "NOT as expected on this AMX CPU: see the runs") + crash
    else:
        rep["ok"] = bool(ran and b["outcome"] == "ran")
        rep["verdict"] = ("no AMX on this CPU: the abort cannot happen here; base and branch both load and "
                          "generate" if rep["ok"] else "a run failed: see the runs") + crash
    return rep


def thread_row_groups(stacks: dict, models: dict[str, Path], threads=THREADS, max_depth: int | None = None,
                      prompts: str | None = None) -> list[dict]:
    """The row groups in the order they run: each (threads, stack, model, depth) one llama-bench
    command per side and round; the cheap groups (no context depth) at every thread count first."""
    groups = []
    for deep in (False, True):
        for t in threads:
            for name, st in stacks.items():
                bench = st["bench"]
                args = list(bench.get("args", ()))
                depths = args[args.index("-d") + 1].split(",") if "-d" in args else ["0"]
                if "-d" in args:
                    del args[args.index("-d"):args.index("-d") + 2]
                for depth in depths:
                    if (depth != "0") != deep:
                        continue
                    if max_depth is not None:
                        depth = str(min(int(depth), max_depth))
                    for qtype in bench["types"]:
                        groups.append({"stack": name, "type": qtype, "threads": t,
                                       "model": str(models[f"{name}:{qtype}"]),
                                       "args": ["-p", prompts or THREAD_PROMPTS.get(name, bench["prompts"]), "-n", "0",
                                                "-t", str(t), "-r", str(bench.get("reps", 2)), *args, "-d", depth]})
    return groups


def estimate(measured: dict, g: dict) -> float:
    """Seconds one llama-bench run of group `g` should take: the same model and depth measured
    at more threads, scaled as if the work were all compute (an upper bound); 5 s x 16/t unseen."""
    key, t = (g["model"], g["args"][-1]), g["threads"]
    seen = [s * t_seen / t for (k, t_seen), s in measured.items() if k == key and t_seen >= t]
    return min(seen) if seen else 5.0 * max(THREADS) / t


def thread_rows(bins: dict[str, Path], groups: list[dict], out_jsonl: Path, remaining: Callable[[], float],
                log=print, save: Callable[[dict], None] = lambda rep: None) -> dict:
    """Every group of `groups` whose time fits, sides in ABBA order (module doc); rows labelled
    `build_commit` = the side (base or the stack's name) into out_jsonl, the report handed to
    `save` after every group. A run cut by the time left ends the rows. A group at llama.cpp's
    default repacking that dies of a signal (ggml's AMX Q8_0 tile path as GCC 12 builds it raises
    SIGILL, the base too) or aborts (#18099: the base on AMX with an MLA model) runs again with
    --repack 0, and so does every later one: noted."""
    rep: dict = {"groups": [], "dropped": [], "jsonl": str(out_jsonl)}
    measured: dict = {}
    no_repack: str | None = None
    out_jsonl.parent.mkdir(parents=True, exist_ok=True)
    with open(out_jsonl, "a") as fh:
        for i, g in enumerate(groups):
            est = 2 * ROUNDS * estimate(measured, g)
            if remaining() < est * 1.3 + 10:
                rep["dropped"].append({**g, "why": f"{remaining():.0f} s left, ~{est:.0f} s needed"})
                continue
            t0 = time.monotonic()
            if no_repack and "--repack" not in g["args"]:
                g = {**_without_repacking(g), "note": no_repack}
            runs, rows = _abba(bins, g, remaining)
            crashed = [r["outcome"] for r in runs if r["outcome"].startswith(("crashed", "aborted"))]
            if crashed and "--repack" not in g["args"] and remaining() > est + 20:
                no_repack = f"llama.cpp's default repacking {crashed[0]}; rows at --repack 0"
                g = {**_without_repacking(g), "note": no_repack}
                runs, rows = _abba(bins, g, remaining)
            for row in rows:
                fh.write(json.dumps({k: v for k, v in row.items() if k != "side"} | {"build_commit": row["side"]})
                         + "\n")
            fh.flush()
            measured[(g["model"], g["args"][-1]), g["threads"]] = (time.monotonic() - t0) / (2 * ROUNDS)
            rep["groups"].append({**g, "runs": runs, "ratios": ratios(rows, g["stack"])})
            log(f"threads {g['stack']} -t {g['threads']} -d {g['args'][-1]}: "
                + ", ".join(f"{k} {v:.2f}x" for k, v in rep["groups"][-1]["ratios"].items()))
            save(rep)
            if any(r["outcome"] != "ran" for r in runs) and remaining() < 20:
                rep["dropped"] += [{**h, "why": "the time ran out during the group before"} for h in groups[i + 1:]]
                break
    return rep


def _abba(bins: dict[str, Path], g: dict, remaining: Callable[[], float]) -> tuple[list[dict], list[dict]]:
    """One group's runs in ABBA order: (each run's side, outcome and command; its rows, by side)."""
    runs, rows = [], []
    for side in ["base", g["stack"], g["stack"], "base"] * (ROUNDS // 2):
        res = llama_bench(bins[side], Path(g["model"]), g["args"], timeout=max(10.0, remaining() - 10))
        runs.append({"side": side, "outcome": res["outcome"], "command": res["command"]})
        rows += [{**r, "side": side} for r in res["rows"]]
    return runs, rows


def _without_repacking(g: dict) -> dict:
    """Group `g` at --repack 0, the context depth kept last (the rows' key)."""
    args = list(g["args"])
    at = args.index("-d")
    return {**g, "args": [*args[:at], "--repack", "0", *args[at:]]}


def ratios(rows: list[dict], stack: str) -> dict[str, float]:
    """The stack's median tokens/s over the base's, per model file and prompt size."""
    by: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        key = (Path(r["model_filename"]).stem, int(r["n_prompt"]))
        by.setdefault(key, {}).setdefault(r["side"], []).append(r["avg_ts"])
    return {f"{m} pp{p}": statistics.median(v[stack]) / statistics.median(v["base"])
            for (m, p), v in sorted(by.items()) if v.get(stack) and v.get("base")}
