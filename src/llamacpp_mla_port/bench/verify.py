"""The target's verify cost T(N), read from proof/run/cpp/verify-bench.cpp.

verify-bench decodes N tokens (logits for all) over a cache of `depth` tokens in two contexts
side by side: the target alone (no rollback snapshots) and the target as common_speculative
configures it for a draft of length max(N) - 1 (n_rs_seq snapshots, the draft's taps extracted),
each speculative pass followed by the rollback of a fully rejected block; and, untimed, the
router's choices (distinct experts per MoE layer and step).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.proof.run.programs import run_with_default_bufts

VERIFY_N = tuple(range(1, 9))


def run_verify_bench(exe: Path, target: Path, out: Path, threads: int, depth: int = 1024, rounds: int = 3,
                     n_values=VERIFY_N, draft: Path | None = None, text: Path | None = None,
                     expert_blocks: int = 8, state_dir: Path | None = None, timeout: float = 3600,
                     extra: tuple = ()) -> tuple[dict, list]:
    """One process: (its result, its argv), again with extra buffer types off where it dies of a
    signal (the result's `note` says so)."""
    argv = [exe, "--target", target, "--out", out, "--threads", threads, "--depth", depth, "--rounds", rounds,
            "--n", ",".join(map(str, n_values)), "--expert-blocks", expert_blocks, *extra]
    if draft is not None:
        argv += ["--draft", draft]
    if text is not None:
        argv += ["--text", text]
    if state_dir is not None:
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        argv += ["--state-dir", state_dir]
    proc, argv, note = run_with_default_bufts(argv, timeout)
    if proc.returncode != 0:
        raise ProofError(f"verify-bench failed on {Path(target).name} (exit {proc.returncode}):\n"
                         f"{(proc.stderr or proc.stdout)[-1500:]}", hint=" ".join(map(str, argv)))
    res = json.loads(Path(out).read_text())
    res["peak_rss_bytes"] = proc.peak_rss_bytes
    res["note"] = note
    return res, argv


def expert_bounds(n_expert: int, n_used: int, n: int) -> tuple[float, float]:
    """Distinct experts one MoE layer reads for a step of n tokens: n identical routings (n_used)
    and n independent uniform top-k draws (the expected size of the union)."""
    return float(n_used), n_expert * (1.0 - (1.0 - n_used / n_expert) ** n)


@dataclass
class VerifyCost:
    """Medians per N over every timed run of every process (seconds)."""
    alone: dict[int, float]
    spec: dict[int, float]
    rollback: dict[int, float]
    runs: dict[int, int]
    cpu_share: float                     # median CPU share of the timed passes (1: the threads had the cores)
    experts: dict = field(default_factory=dict)

    @property
    def t1(self) -> float:
        """The target alone, one token: what a step of the pair is measured against."""
        return self.alone[1]

    def ratio(self, n: int) -> float:
        """T(N) / T(1): the speculative context's N tokens against the target alone's one."""
        return self.spec[n] / self.t1


def summarize(results: list[dict]) -> VerifyCost:
    def pooled(key: str) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {}
        for r in results:
            for n, v in r[key].items():
                out.setdefault(int(n), []).extend(v)
        return out

    alone, spec, roll = pooled("alone_seconds"), pooled("spec_seconds"), pooled("rollback_seconds")
    if 1 not in alone or not spec:
        raise ProofError("verify-bench measured no single-token pass", hint="run it with --n including 1")
    shares = [x for r in results for k in ("alone_cpu_share", "spec_cpu_share") for v in r[k].values() for x in v]
    med = {k: {n: statistics.median(v) for n, v in d.items()} for k, d in
           (("alone", alone), ("spec", spec), ("rollback", roll))}
    experts: dict = {}
    ex = results[0].get("experts", {})
    if ex.get("moe_layers"):
        n_expert, n_used = ex["n_expert"], ex["n_expert_used"]
        rows = {}
        for n, per_layer in sorted(((int(k), v) for k, v in ex["distinct_per_layer"].items())):
            same = ex["distinct_per_layer_same_token"].get(str(n), [])
            ident, indep = expert_bounds(n_expert, n_used, n)
            rows[n] = {"distinct_mean": round(statistics.mean(per_layer), 2), "distinct_min": min(per_layer),
                       "distinct_max": max(per_layer),
                       "same_token_mean": round(statistics.mean(same), 2) if same else None,
                       "bound_identical": ident, "bound_independent": round(indep, 2)}
        experts = {"n_expert": n_expert, "n_expert_used": n_used, "moe_layers": ex["moe_layers"],
                   "blocks": ex["blocks"], "tokens": results[0].get("tokens"), "per_n": rows}
    return VerifyCost(med["alone"], med["spec"], med["rollback"], {n: len(v) for n, v in spec.items()},
                      statistics.median(shares) if shares else float("nan"), experts)
