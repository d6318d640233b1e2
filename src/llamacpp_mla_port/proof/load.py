"""llama-server -np 2 with the MLA DSpark draft under concurrent load, on loopback.

Design and bounds: docs/proof.md#load.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from llamacpp_mla_port.proof.lossless import (PROMPTS, Server, bigram_table, greedy_continuations, render,
                                              same_greedy_output, write_lossless_draft)
from llamacpp_mla_port.proof.run.processes import LOCALHOST

N_PREDICT = 16
#: requests before the measured plan: the server's RSS rises over its first ~100 requests
#: (per-thread malloc arenas, buffers reaching their working size) and only then can a leak
#: be told from warm-up
WARMUP = 100
#: measured requests, and how many of the last ones the leak slope is judged over
N_MEASURED = 600
JUDGED = 400
#: parts of the judged requests whose slopes the median is taken over
SEGMENTS = 5
MODES = ("json", "stream", "cancel")
#: share of the plan per mode: most requests complete, about one in six is cancelled mid-stream
MODE_WEIGHTS = (0.6, 0.25, 0.15)
#: the server's caches that grow by design, off for the memory check (llama-server's options):
#: the RAM prompt cache idle slots are saved into (8 GiB by default), idle-slot saving, prompt
#: reuse, context checkpoints. MALLOC_ARENA_MAX bounds glibc's per-thread arenas
CACHE_OFF_ARGS = ("--cache-ram", "0", "--no-cache-idle-slots", "--no-cache-prompt", "--ctx-checkpoints", "0")
CACHE_OFF_ENV = {"MALLOC_ARENA_MAX": "2"}
#: a leak worth catching; see docs/bounds.md for the slopes measured and the leaking controls
LEAK_BOUND_KIB_PER_REQUEST = 1.0
#: a safety bound that turns a hung /health into a failure (latency is reported, not judged)
HEALTH_TIMEOUT_S = 30
#: windows reported (not judged) for reading the series by eye
WINDOW = 50


def theil_sen_slope(ys: list[float]) -> float:
    """The median of the slopes between every pair of samples (x = the sample's index)."""
    import numpy as np
    y = np.asarray(ys, dtype=np.float64)
    i, j = np.triu_indices(len(y), k=1)
    return float(np.median((y[j] - y[i]) / (j - i))) if len(y) > 1 else 0.0


def memory_verdict(rss_kib: list[int], judged: int = JUDGED, segments: int = SEGMENTS,
                   bound: float = LEAK_BOUND_KIB_PER_REQUEST) -> dict:
    """RSS slope in KiB per request over the last `judged` samples: the median of the Theil-Sen
    slopes of `segments` equal parts. A leak tilts every part; a cache filling in up to
    (segments - 1) // 2 steps tilts fewer parts than half and leaves the median flat."""
    tail = list(rss_kib[-judged:])
    size = max(1, len(tail) // segments)
    parts = [theil_sen_slope(tail[k * size:(k + 1) * size]) for k in range(segments)]
    slope = sorted(parts)[segments // 2]
    return {"judged_requests": len(tail), "slope_kib_per_request": round(slope, 4),
            "segment_slopes": [round(x, 4) for x in parts], "bound_kib_per_request": bound,
            "growth_kib": (tail[-1] - tail[0]) if tail else 0, "leak": len(tail) < judged or slope > bound}


def mixed_prompts(n_each: int = 4) -> list[str]:
    """n_each short, medium (3 phrases) and long (12 phrases) prompts, all distinct."""
    words = list(PROMPTS)
    short = [words[i % len(words)] for i in range(n_each)]
    medium = [" ".join(words[(i + k) % len(words)] for k in range(3)) + f" m{i}" for i in range(n_each)]
    long = [" ".join(words[(i + k) % len(words)] for k in range(12)) + f" l{i}" for i in range(n_each)]
    return short + medium + long


def request_plan(n_requests: int, n_prompts: int, seed: int = 14) -> list[tuple[int, str]]:
    """(prompt index, mode) per request, deterministic."""
    rng = random.Random(seed)
    return [(rng.randrange(n_prompts), rng.choices(MODES, MODE_WEIGHTS)[0]) for _ in range(n_requests)]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class Result:
    index: int
    prompt: int
    mode: str
    content: str = ""
    completed: bool = False
    error: str | None = None
    draft_n: int = 0
    draft_accepted: int = 0


@dataclass
class LoadRun:
    results: list[Result]
    rss: list[int]                      # KiB, in the order requests finished
    health: list[int | str] = field(default_factory=list)
    health_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0
    alive_at_end: bool = True


def _post(port: int, body: dict, timeout: float) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection(LOCALHOST, port, timeout=timeout)
    conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    return conn.getresponse()


def one_request(port: int, prompt: str, mode: str, res: Result, n_predict: int, timeout: float = 120) -> None:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "seed": 1,
            "cache_prompt": False, "stream": mode != "json"}
    resp = _post(port, body, timeout)
    try:
        if resp.status != 200:
            res.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            return
        if mode == "json":
            data = json.loads(resp.read())
            res.content, res.completed = data.get("content", ""), True
            timings = data.get("timings", {})
            res.draft_n, res.draft_accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
            return
        chunks = 0
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            data = json.loads(line[len("data: "):])
            res.content += data.get("content", "")
            chunks += data.get("content", "") != ""
            if data.get("stop"):
                res.completed = True
                return
            if mode == "cancel" and chunks >= 2:
                return                  # closing the connection (finally) cancels the request
        res.error = "stream ended without a stop chunk"
    finally:
        resp.close()


def run_load(server: Server, prompts: list[str], plan: list[tuple[int, str]], clients: int = 8,
             n_predict: int = N_PREDICT, health_period: float = 0.25) -> LoadRun:
    results = [Result(i, p, m) for i, (p, m) in enumerate(plan)]
    run = LoadRun(results, [])
    lock = threading.Lock()
    todo = list(range(len(plan)))
    done = threading.Event()
    pid = server.owned.pid

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            r = results[i]
            try:
                one_request(server.port, prompts[r.prompt], r.mode, r, n_predict)
            except Exception as err:                 # recorded, checked by check_load
                r.error = f"{type(err).__name__}: {err}"
            with lock:
                run.rss.append(rss_kib(pid))

    def health() -> None:
        while not done.is_set():
            try:
                t = time.monotonic()
                conn = http.client.HTTPConnection(LOCALHOST, server.port, timeout=HEALTH_TIMEOUT_S)
                conn.request("GET", "/health")
                run.health.append(conn.getresponse().status)
                conn.close()
                run.health_seconds.append(time.monotonic() - t)
            except Exception as err:
                run.health.append(f"{type(err).__name__}: {err}")
            done.wait(health_period)

    poller = threading.Thread(target=health, daemon=True)
    poller.start()
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    run.seconds = time.monotonic() - t0
    done.set()
    poller.join(timeout=10)
    run.alive_at_end = server.owned.alive()
    return run


def summarize(run: LoadRun, reference: list[str], prompts: list[str]) -> dict:
    completed = [r for r in run.results if r.completed]
    cancelled = [r for r in run.results if r.mode == "cancel" and not r.completed and r.error is None]
    mismatches = [f"request {r.index} ({r.mode}, prompt {r.prompt}): {r.content!r} != {reference[r.prompt]!r}"
                  for r in completed if not same_greedy_output(r.content, reference[r.prompt])]
    mismatches += [f"cancelled request {r.index} (prompt {r.prompt}): {r.content!r} is not a prefix of "
                   f"{reference[r.prompt]!r}" for r in cancelled if not reference[r.prompt].startswith(r.content)]
    first, last = run.rss[:WINDOW], run.rss[-WINDOW:]
    memory = memory_verdict(run.rss)
    return {
        "requests": len(run.results),
        "completed": len(completed),
        "cancelled": len(cancelled),
        "streamed_complete": sum(r.mode == "stream" for r in completed),
        "errors": [f"request {r.index} ({r.mode}): {r.error}" for r in run.results if r.error],
        "mismatches": mismatches,
        "health_polls": len(run.health),
        "health_failures": [h for h in run.health if h != 200],
        "health_max_seconds": round(max(run.health_seconds), 3) if run.health_seconds else None,
        "alive_at_end": run.alive_at_end,
        "rss_first50_max_kib": max(first) if first else None,
        "rss_last50_max_kib": max(last) if last else None,
        "rss_first50_median_kib": sorted(first)[len(first) // 2] if first else None,
        "rss_last50_median_kib": sorted(last)[len(last) // 2] if last else None,
        "memory": memory,
        "seconds": round(run.seconds, 2),
        "requests_per_second": round(len(run.results) / run.seconds, 3) if run.seconds else None,
        "drafted": sum(r.draft_n for r in run.results),
        "accepted": sum(r.draft_accepted for r in run.results),
        "prompt_chars": sorted({len(prompts[r.prompt]) for r in run.results}),
        "rss_kib": run.rss,
    }


def run_load_test(tree: Path, build: Path, work: Path, base_target: Path, n_requests: int = N_MEASURED,
                  clients: int = 8, draft_max: int = 4, threads: int = 1, warmup: int = WARMUP,
                  log=print) -> dict:
    """Both runs (with and without the draft) on the same plan, each after its warm-up; the report."""
    from llamacpp_mla_port.proof.run.programs import compile_program
    from llamacpp_mla_port.proof.reference.model import read_target_head
    from llamacpp_mla_port.fixtures.target_variants import write_deep_kimi_k3_target

    t0 = time.monotonic()
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    target = write_deep_kimi_k3_target(base_target, work / "target-deep.gguf", "MKKMKK", 2)
    embd, _ = read_target_head(target)
    vocab, hidden = embd.shape
    prompts = mixed_prompts()
    seqs = greedy_continuations(compile_program("target-features", tree, build), target, prompts,
                                work / "greedy", N_PREDICT)
    reference = [render(s[len(s) - N_PREDICT:]) for s in seqs]
    prompt_tokens = [len(s) - N_PREDICT for s in seqs]
    draft = write_lossless_draft(tree, work, "draft-bigram", hidden, vocab, [0, 2, 4],
                                 bigram_table(seqs[: len(seqs) // 2]))
    plan = request_plan(n_requests, len(prompts))
    report: dict = {"setup_seconds": round(time.monotonic() - t0, 1),
                    "clients": clients, "parallel": 2, "n_predict": N_PREDICT, "draft_max": draft_max,
                    "prompt_tokens": {"min": min(prompt_tokens), "max": max(prompt_tokens)},
                    "cache_off_args": list(CACHE_OFF_ARGS), "cache_off_env": CACHE_OFF_ENV}
    for name, dft in (("with_draft", draft), ("target_alone", None)):
        extra = [*CACHE_OFF_ARGS, *(["-td", str(threads)] if dft is not None else [])]
        srv = Server(build, target, dft, draft_max, True, 0.0, work / f"server-{name}.log", parallel=2,
                     threads=threads, extra=extra, env={**os.environ, **CACHE_OFF_ENV})
        try:
            warm = run_load(srv, prompts, request_plan(warmup, len(prompts), seed=1400), clients)
            run = run_load(srv, prompts, plan, clients)
        finally:
            srv.close()
        report[name] = summarize(run, reference, prompts)
        report[name]["warmup"] = {k: v for k, v in summarize(warm, reference, prompts).items() if k != "rss_kib"}
        log(f"load {name}: {report[name]['requests']} requests ({report[name]['completed']} completed, "
            f"{report[name]['cancelled']} cancelled) in {report[name]['seconds']} s, "
            f"{report[name]['requests_per_second']} req/s; RSS slope {report[name]['memory']['slope_kib_per_request']} "
            f"KiB/request over the last {report[name]['memory']['judged_requests']} (bound "
            f"{LEAK_BOUND_KIB_PER_REQUEST}); health {report[name]['health_polls']} polls")
    with_d, alone = report["with_draft"]["requests_per_second"], report["target_alone"]["requests_per_second"]
    report["req_per_s_ratio_draft_vs_alone"] = round(with_d / alone, 3) if with_d and alone else None
    report["seconds"] = round(time.monotonic() - t0, 1)
    log(f"load: req/s with the draft / target alone = {report['req_per_s_ratio_draft_vs_alone']}; "
        f"{report['seconds']} s in all, {report['setup_seconds']} s of it fixtures")
    return report


def check_load(report: dict, min_requests: int = N_MEASURED) -> list[str]:
    """Every way the load test failed (empty when everything held)."""
    failures = []
    for name in ("with_draft", "target_alone"):
        r = report[name]
        w = r["warmup"]
        failures += [f"{name} warm-up: {e}" for e in w["errors"] + w["mismatches"]]
        if w["health_failures"]:
            failures.append(f"{name} warm-up: /health failed {w['health_failures'][:5]}")
        if r["requests"] < min_requests:
            failures.append(f"{name}: only {r['requests']} requests")
        failures += [f"{name}: {e}" for e in r["errors"]]
        failures += [f"{name}: {m}" for m in r["mismatches"]]
        if r["cancelled"] == 0:
            failures.append(f"{name}: no request was cancelled mid-stream")
        if r["health_polls"] == 0 or r["health_failures"]:
            failures.append(f"{name}: /health failed {r['health_failures'][:5]} of {r['health_polls']} polls")
        if not r["alive_at_end"]:
            failures.append(f"{name}: the server was not running at the end")
        m = r["memory"]
        if m["leak"]:
            failures.append(f"{name}: RSS grows by {m['slope_kib_per_request']} KiB per request over the last "
                            f"{m['judged_requests']} requests (bound {m['bound_kib_per_request']}; "
                            f"{m['growth_kib']} KiB in all), caches off: a leak")
    if report["with_draft"]["drafted"] == 0:
        failures.append("with_draft: the draft drafted nothing")
    return failures
