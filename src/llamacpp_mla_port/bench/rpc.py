"""Local vs RPC, side by side (not a test: prints numbers, asserts nothing).

The tiny Kimi-K3 target + bigram MLA DSpark draft of the lossless proof, greedy, draft
length 7, every process on one thread (2-core machines): llama-speculative-simple with
everything on this host, then with the target split over two ggml-rpc-servers on loopback
(draft on this host / on a server), and llama-server -np 2 the same way. The runs are
interleaved prompt by prompt so machine load hits all of them alike. Wall time includes
model load (over RPC the weights travel to the servers); "decode" is the tool's own
figure for the generated tokens.

    .venv/bin/python -m llamacpp_mla_port.bench.rpc [--prompts 8] [--n-predict 64]   (or: make bench-rpc)

Loopback has no network latency: across hosts every RPC round trip adds the link's.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

from llamacpp_mla_port.project import program
from llamacpp_mla_port import project
from llamacpp_mla_port.build import DEFAULT_TARGETS, ensure_build
from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
from llamacpp_mla_port.proof import lossless
from llamacpp_mla_port.proof.rpc import draft_args, target_split_args
from llamacpp_mla_port import process
from llamacpp_mla_port.proof.run.processes import RpcServer

DRAFT_MAX = 7


def spec_run(build: Path, pair, prompt: str, n_predict: int, extra: list[str]) -> tuple[float, float]:
    """(wall seconds, decode seconds) of one greedy speculative run."""
    cmd = [program(build, "llama-speculative-simple"), "-m", pair.target, "-md", pair.drafts["bigram"],
           "--spec-type", "draft-dspark", "--spec-draft-n-max", DRAFT_MAX, "-p", prompt, "-n", n_predict,
           "--temp", 0, "--top-k", 1, "-s", 1, "-c", 512, "-t", 1, "-td", 1, *extra]
    t0 = time.perf_counter()
    proc = process.run(cmd, timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    m = re.search(r"decoded\s+\d+ tokens in\s+([0-9.]+) seconds", proc.stderr)
    return wall, float(m.group(1)) if m else float("nan")


def server_run(build: Path, pair, work: Path, n_predict: int, extra: list[str], name: str) -> float:
    """Seconds for every prompt through llama-server -np 2 (two requests in flight)."""
    with lossless.Server(build, pair.target, pair.drafts["bigram"], DRAFT_MAX, False, 0.0, work / f"{name}.log",
                         parallel=2, threads=1, extra=["-td", "1", *extra]) as srv:
        t0 = time.perf_counter()
        srv.complete_all(pair.prompts, n_predict)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: <work dir>/bench-rpc)")
    args = ap.parse_args()

    places = project.Places()           # this entry point's run: the checkout's defaults and the env
    tree, build = places.work_tree, places.work_build
    ensure_build(tree, build, DEFAULT_TARGETS, rpc=True, echo=False)
    work = (args.work or places.bench_rpc_dir).resolve()
    base = write_kimi_k3_target(build, work / "kimi-k3.gguf")
    pair = lossless.prepare_pair(tree, build, work / "pair", base, args.prompts, draft_names=("bigram",))

    servers = [RpcServer(build, work / f"rpc{i}.log", threads=1) for i in range(2)]
    try:
        endpoints = [s.endpoint for s in servers]
        configs = {
            "local": [],
            "rpc, draft local": [*target_split_args(endpoints), *draft_args("local", 2)],
            "rpc, draft remote": [*target_split_args(endpoints), *draft_args("remote", 2)],
        }
        walls: dict[str, list[float]] = {k: [] for k in configs}
        decodes: dict[str, list[float]] = {k: [] for k in configs}
        for prompt in pair.prompts:
            for name, extra in configs.items():
                wall, decode = spec_run(build, pair, prompt, args.n_predict, extra)
                walls[name].append(wall)
                decodes[name].append(decode)
        server = {name: server_run(build, pair, work, args.n_predict, extra, name.replace(", ", "-").replace(" ", "-"))
                  for name, extra in (("local", []), ("rpc, draft remote", configs["rpc, draft remote"]))}
    finally:
        for s in servers:
            s.stop()

    print(f"llama-speculative-simple, {len(pair.prompts)} prompts x {args.n_predict} tokens, draft max {DRAFT_MAX}, "
          f"medians (one thread per process, loopback):")
    w0, d0 = statistics.median(walls["local"]), statistics.median(decodes["local"])
    for name in configs:
        w, d = statistics.median(walls[name]), statistics.median(decodes[name])
        print(f"  {name:<18} wall {w:6.2f} s ({w / w0:4.2f}x local)   decode {d:6.3f} s ({d / d0:4.2f}x local)")
    s0 = server["local"]
    print(f"llama-server -np 2, all {len(pair.prompts)} prompts:")
    for name, s in server.items():
        print(f"  {name:<18} {s:6.2f} s ({s / s0:4.2f}x local)")


if __name__ == "__main__":
    main()
