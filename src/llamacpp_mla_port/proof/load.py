"""llama-server -np 2 with the MLA DSpark draft under concurrent load, on loopback.

The same request plan runs against a server with the draft and one without it (the
target alone): `clients` threads keep requests in flight, over a mix of prompt lengths
(short, medium, long), of plain and streaming requests, and of streaming requests the
client closes after the first chunks (the server must cancel them and go on). Meanwhile a
thread polls /health. After every finished request the server's resident memory is read
from /proc/<pid>/status. Each server first serves WARMUP requests of the same kind, outside
the measured plan: memory is compared once the server has reached its working size.

What it checks (`check_load` lists every failure):
  * every completed greedy response equals the target-alone greedy continuation of its
    prompt (ids from the target-features program, one sequence at a time), and every
    cancelled stream is a prefix of it;
  * every /health poll answered 200 and the server was still running at the end;
  * memory does not grow: the largest RSS over the last 50 measured requests is at most
    the largest over the first 50 plus RSS_SLACK_KIB (the allocator's noise allowance,
    see its comment);
  * the draft drafted (its acceptance is reported with the rest).
Requests per second with and without the draft are reported as a ratio, never asserted.
Flash attention is on in both servers, as in the reference program: with it off, a long
prompt of the tiny target meets a near-tie and the greedy text differs from the on-run.

    run_load_test(tree, build, work, base_target, ...) -> report dict
    check_load(report) -> list of failures (empty: all held)
"""

from __future__ import annotations

import http.client
import json
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
#: (prompt-cache entries, per-thread malloc arenas, buffers reaching their working size; measured
#: +10 MiB, flat after ~70-90 requests) and only then can a leak be told from warm-up
WARMUP = 100
MODES = ("json", "stream", "cancel")
#: share of the plan per mode: most requests complete, about one in six is cancelled mid-stream
MODE_WEIGHTS = (0.6, 0.25, 0.15)
#: allowance for allocator noise between the first and the last 50 measured requests: after the
#: warm-up the largest RSS of the last 50 exceeded that of the first 50 by 4 KiB (with the draft)
#: and 36 KiB (target alone) on the 2-core Sapphire Rapids build; 1 MiB is 28x the worst. A leak
#: of ~7 KiB per request over the ~150 requests between the two windows exceeds it
RSS_SLACK_KIB = 1024
WINDOW = 50


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
                conn = http.client.HTTPConnection(LOCALHOST, server.port, timeout=5)
                conn.request("GET", "/health")
                run.health.append(conn.getresponse().status)
                conn.close()
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
    return {
        "requests": len(run.results),
        "completed": len(completed),
        "cancelled": len(cancelled),
        "streamed_complete": sum(r.mode == "stream" for r in completed),
        "errors": [f"request {r.index} ({r.mode}): {r.error}" for r in run.results if r.error],
        "mismatches": mismatches,
        "health_polls": len(run.health),
        "health_failures": [h for h in run.health if h != 200],
        "alive_at_end": run.alive_at_end,
        "rss_first50_max_kib": max(first) if first else None,
        "rss_last50_max_kib": max(last) if last else None,
        "rss_first50_median_kib": sorted(first)[len(first) // 2] if first else None,
        "rss_last50_median_kib": sorted(last)[len(last) // 2] if last else None,
        "seconds": round(run.seconds, 2),
        "requests_per_second": round(len(run.results) / run.seconds, 3) if run.seconds else None,
        "drafted": sum(r.draft_n for r in run.results),
        "accepted": sum(r.draft_accepted for r in run.results),
        "prompt_chars": sorted({len(prompts[r.prompt]) for r in run.results}),
        "rss_kib": run.rss,
    }


def run_load_test(tree: Path, build: Path, work: Path, base_target: Path, n_requests: int = 200,
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
                    "rss_slack_kib": RSS_SLACK_KIB}
    for name, dft in (("with_draft", draft), ("target_alone", None)):
        srv = Server(build, target, dft, draft_max, True, 0.0, work / f"server-{name}.log", parallel=2,
                     threads=threads, extra=["-td", str(threads)] if dft is not None else [])
        try:
            warm = run_load(srv, prompts, request_plan(warmup, len(prompts), seed=1400), clients)
            run = run_load(srv, prompts, plan, clients)
        finally:
            srv.close()
        report[name] = summarize(run, reference, prompts)
        report[name]["warmup"] = {k: v for k, v in summarize(warm, reference, prompts).items() if k != "rss_kib"}
        log(f"load {name}: {report[name]['requests']} requests ({report[name]['completed']} completed, "
            f"{report[name]['cancelled']} cancelled) in {report[name]['seconds']} s, "
            f"{report[name]['requests_per_second']} req/s; RSS max first 50 {report[name]['rss_first50_max_kib']} "
            f"KiB, last 50 {report[name]['rss_last50_max_kib']} KiB; health {report[name]['health_polls']} polls")
    with_d, alone = report["with_draft"]["requests_per_second"], report["target_alone"]["requests_per_second"]
    report["req_per_s_ratio_draft_vs_alone"] = round(with_d / alone, 3) if with_d and alone else None
    report["seconds"] = round(time.monotonic() - t0, 1)
    log(f"load: req/s with the draft / target alone = {report['req_per_s_ratio_draft_vs_alone']}; "
        f"{report['seconds']} s in all, {report['setup_seconds']} s of it fixtures")
    return report


def check_load(report: dict, min_requests: int = 200) -> list[str]:
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
        if r["rss_last50_max_kib"] > r["rss_first50_max_kib"] + RSS_SLACK_KIB:
            failures.append(f"{name}: RSS grew: max {r['rss_first50_max_kib']} KiB over the first {WINDOW} requests, "
                            f"{r['rss_last50_max_kib']} KiB over the last {WINDOW} (slack {RSS_SLACK_KIB} KiB)")
    if report["with_draft"]["drafted"] == 0:
        failures.append("with_draft: the draft drafted nothing")
    return failures
