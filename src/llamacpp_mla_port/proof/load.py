"""llama-server -np 2 with the MLA DSpark draft under concurrent load, on loopback.

Design and bounds: docs/proof.md#load.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from dataclasses import dataclass, field

from llamacpp_mla_port.proof.lossless import PROMPTS, Server
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
