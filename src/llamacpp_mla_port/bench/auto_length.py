"""`--spec-draft-auto` (the spec-auto-length stack) against the target alone and every static draft
length, at three acceptance levels: tokens per second of llama-server, one slot, greedy.

The level comes from upstream's synthetic acceptance (`--spec-synth-rates`: each drafted token
is accepted at random with the curve's per-position rate; the output text is not valid, but the
draft, the target's verify of every drafted token and the rollback of the rejected ones run for
real), so one draft stands for three: none (every token rejected), partial (SGLang's published
acceptance, 0.6 drafted tokens per step at 7) and high (InferenceX's per-length curve for this
draft), from bench/acceptance.py. Every configuration runs once per round, the rounds in
alternating order (A B C, C B A); each runs a server that answers three requests in a row and the
figures are of the second and third (auto learns in the first, as a server does once), medians over
rounds, ratios against the target alone.
Request i sends sampling seed i, which seeds the synthetic acceptance: every configuration sees
the same random streams. The CPU share is the server's CPU time over wall time x threads while its request decoded.
Without --target/--draft (`make bench-auto`) the pair is written to --out: the Kimi-K3-shaped
target DKKKKM (fixtures/k3_shaped.py, 7.8 GB) and the draft at the real config tapping its first
three layers (fixtures/draft_gguf.py, BF16, then llama-quantize's Q8_0 as users run it: 2.4 GB).

    python -m llamacpp_mla_port.bench.auto_length [--target T.gguf --draft D.gguf] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from llamacpp_mla_port.bench.acceptance import K_MAX, PUBLISHED
from llamacpp_mla_port.proof.lossless import Server

LEVELS = {"none": (0.0,) * K_MAX, "partial": next(c.cum for c in PUBLISHED if c.name == "SGLang"),
          "high": next(c.cum for c in PUBLISHED if c.name == "InferenceX")}
PROMPT = "the target verifies every drafted token and rolls the rejected ones back " * 4


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0       # utime + stime, clock ticks of 1/100 s


def one_run(build: Path, target: Path, draft: Path | None, k: int, rates, auto: bool, n_predict: int,
            threads: int, log: Path, requests: int = 3) -> dict:
    """One llama-server, `requests` requests in a row (a server's state outlives a request): tokens per
    second of the decodes after the first, drafted and accepted in those, and of the first ("cold_tps")."""
    # --no-repack: ggml's AMX Q8_0 tiles died of SIGILL on the Xeon that ran this (docs/bench.md); one set
    # of buffer types for every configuration
    extra = ["--no-repack"]
    if draft is not None:
        extra += ["--spec-synth-rates", ",".join(f"{r:g}" for r in rates[:k])] + (["--spec-draft-auto"] if auto else [])
    with Server(build, target, draft, k, True, 0.0, log, parallel=1, threads=threads, extra=extra,
                load_timeout=600, request_timeout=3600) as srv:
        cold = srv.complete(PROMPT, n_predict)["timings"]
        cpu0, t0 = _cpu_seconds(srv.owned.pid), time.monotonic()
        t = [srv.complete(PROMPT, n_predict, seed)["timings"] for seed in range(2, requests + 1)]
        share = (_cpu_seconds(srv.owned.pid) - cpu0) / ((time.monotonic() - t0) * threads)
    return {"tps": 1000.0 * sum(x["predicted_n"] for x in t) / sum(x["predicted_ms"] for x in t),
            "cold_tps": cold["predicted_per_second"], "drafted": sum(x.get("draft_n", 0) for x in t),
            "accepted": sum(x.get("draft_n_accepted", 0) for x in t), "cpu_share": share}


def run(build: Path, target: Path, draft: Path, out: Path, rounds: int = 2, n_predict: int = 48,
        threads: int = 2, only: set[str] | None = None) -> dict:
    configs = [("alone", None, 0, False)] + [(f"k={k}", lvl, k, False) for lvl in LEVELS for k in range(1, K_MAX + 1)]
    configs += [("auto", lvl, K_MAX, True) for lvl in LEVELS]
    configs = [c for c in configs if not only or c[0] in only or f"{c[1]}:{c[0]}" in only or c[0] in ("alone", "auto")]
    runs: dict[tuple, list[dict]] = {}
    for r in range(rounds):
        for name, lvl, k, auto in (configs if r % 2 == 0 else configs[::-1]):
            res = one_run(build, target, draft if lvl else None, k, LEVELS.get(lvl, ()), auto, n_predict, threads,
                          out / f"server-{name}-{lvl}-{r}.log")
            runs.setdefault((name, lvl), []).append(res)
            print(f"round {r} {lvl or '-':<8} {name:<6} {res['tps']:8.3f} tok/s  drafted {res['drafted']:4}  "
                  f"accepted {res['accepted']:4}  cpu share {res['cpu_share']:.2f}", flush=True)
    med = {key: {f: statistics.median(x[f] for x in v) for f in v[0]} for key, v in runs.items()}
    alone = med["alone", None]["tps"]
    table = {lvl: {name: {**m, "vs_alone": m["tps"] / alone} for (name, lv), m in med.items() if lv == lvl}
             for lvl in LEVELS}
    for lvl, rows in table.items():
        best = max([(m["tps"], name) for name, m in rows.items() if name != "auto"] + [(alone, "alone")])
        rows["auto"]["best_of"] = sorted(name for name in rows if name != "auto")
        rows["auto"]["vs_best_static"] = rows["auto"]["tps"] / best[0]
        rows["auto"]["best_static"] = best[1]
    shares = [x["cpu_share"] for v in runs.values() for x in v]
    return {"alone_tps": alone, "levels": table, "rates": LEVELS, "rounds": rounds, "n_predict": n_predict,
            "threads": threads, "cpu_share_median": statistics.median(shares), "cpu_share_min": min(shares)}


def markdown(rep: dict) -> str:
    lines = [f"target alone: {rep['alone_tps']:.3f} tok/s; CPU share of the timed requests: median "
             f"{rep['cpu_share_median']:.2f}, min {rep['cpu_share_min']:.2f}", "",
             "| level | " + " | ".join(f"k={k}" for k in range(1, K_MAX + 1)) + " | auto | auto vs the best of "
             "the target alone and k=1..7 | first request: auto vs k=1 |", "|---" * (K_MAX + 4) + "|"]
    for lvl, rows in rep["levels"].items():
        cells = [f"{rows[f'k={k}']['vs_alone']:.2f}x" if f"k={k}" in rows else "-" for k in range(1, K_MAX + 1)]
        a = rows["auto"]
        best = "target alone" if a["best_static"] == "alone" else a["best_static"]
        cold = f"{a['cold_tps'] / rows['k=1']['cold_tps']:.2f}" if "k=1" in rows else "-"
        lines.append(f"| {lvl} | " + " | ".join(cells) + f" | **{a['vs_alone']:.2f}x** (drafted {a['drafted']:.0f}) "
                     f"| {a['vs_best_static']:.2f} (best: {best}) | {cold} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, default=None)
    ap.add_argument("--draft", type=Path, default=None)
    ap.add_argument("--build-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="default: <work dir>/bench-auto")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="static lengths to run, e.g. none:k=1,partial:k=2 or k=3 "
                    "(default: all; the target alone and auto always run)")
    args = ap.parse_args(argv)
    from llamacpp_mla_port import project
    places = project.Places()
    build = (args.build_dir or places.work_build).resolve()
    args.out = args.out or places.bench_auto_dir
    args.out.mkdir(parents=True, exist_ok=True)
    target, draft = args.target, args.draft
    if target is None or draft is None:
        from llamacpp_mla_port.fixtures.draft_gguf import write_mla_draft_gguf
        from llamacpp_mla_port.fixtures.k3_shaped import write_k3_shaped_target
        from llamacpp_mla_port.fixtures.realsize import realsize_config
        from llamacpp_mla_port.build import ensure_build
        from llamacpp_mla_port.process import run as run_process
        target = write_k3_shaped_target(args.out / "k3-DKKKKM.gguf", "DKKKKM")
        bf16, draft = args.out / "draft-real.gguf", args.out / "draft-real-q8_0.gguf"
        if not draft.is_file():
            write_mla_draft_gguf(bf16, target, config={**realsize_config(False)["draft"], "target_layers": [0, 1, 2]},
                                 weight_type="bf16")
            ensure_build(project.Places().work_tree, build, ["llama-quantize"], echo=False)
            argv = [str(build / "bin" / "llama-quantize"), str(bf16), str(draft), "q8_0"]
            if run_process(argv, timeout=3600).returncode:
                raise SystemExit(f"llama-quantize failed: {' '.join(argv)}")
    rep = run(build, target, draft, args.out, args.rounds, args.n_predict, args.threads,
              {x for x in args.only.split(",") if x})
    (args.out / "auto-length.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    print(markdown(rep))


if __name__ == "__main__":
    main()
