"""The whole proof: build, make every fixture offline, run parity, the target side and
lossless speculative decoding, and return ONE report (the verb `smoke`,
commands/smoke.py, prints it as JSON and exits non-zero on any failure).

Stages (each is recorded in the report; a failing stage fails the run, later stages still run):
  build      build.ensure_build on the patched tree (the targets the proof needs)
  parity     proof.parity: 3 draft shapes x 5 precision modes against the float64 reference (F32)
             and the reference emulating the CPU backend's roundings (the others); per mode the
             headroom of its bound on this machine (report["parity_modes"])
  target     proof.target_features: the Kimi-K3 layer inputs == the block-local prefix stream
  lossless   proof.lossless: llama-speculative-simple and llama-server (-np 2) == target alone
The tree and build default to the tool's work tree; MLA_PORT_TREE / MLA_PORT_BUILD
(or --tree/--build) point elsewhere.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from llamacpp_mla_port.build import TARGET_SETS
from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.stages import Stages

SMOKE_TARGETS = TARGET_SETS["smoke"]       # build.TARGET_SETS: the one table


def _log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def _logged(name: str, entry: dict) -> None:
    if not entry["ok"]:
        _log(f"smoke: stage {name} FAILED: {entry['error']}")


def target_side_check(tree: Path, build: Path, work: Path, base_target: Path) -> dict:
    """The numbers of tests/proof/test_target_features.py, for the report."""
    from llamacpp_mla_port.proof.run.programs import compile_program
    from llamacpp_mla_port.proof.reference.model import nmse, read_target_head
    from llamacpp_mla_port.proof.run.target_features import (
        dump_target_features,
        full_residual_stream,
        prefix_stream,
        sublayer_tensor_names,
    )
    from llamacpp_mla_port.fixtures.target_variants import write_deep_kimi_k3_target

    binary = compile_program("target-features", tree, build)
    prompt = [1, 5, 9, 33, 70, 2, 5, 9, 100, 17, 17, 64]
    out: dict = {}
    for types, bs in (("MK", 12), ("MKKMKK", 2)):
        target = base_target if types == "MK" else write_deep_kimi_k3_target(base_target, work / f"t-{types}.gguf",
                                                                             types, bs)
        attn, ffn = sublayer_tensor_names(types, bs)
        got = dump_target_features(binary, target, prompt, work / f"tf-{types}", layers=list(range(len(types))),
                                   dump=attn + ffn)
        embd, _ = read_target_head(target)
        want = prefix_stream(embd[prompt], [got.dumps[n] for n in attn], [got.dumps[n] for n in ffn], bs)
        full = full_residual_stream(embd[prompt], [got.dumps[n] for n in attn], [got.dumps[n] for n in ffn])
        worst = max(nmse(got.tap(il), want[il]) for il in range(len(types)))
        vs_full = max(nmse(got.tap(il), full[il]) for il in range(1, len(types)))
        out[f"{types}-block{bs}"] = {"worst_nmse_vs_prefix_stream": worst, "max_nmse_vs_plain_residual": vs_full}
        if worst > 1e-12:
            raise ProofError(f"target {types}: layer inputs differ from the prefix stream (NMSE {worst:.3g})")
    return out


def _parity_summary(entry: dict) -> dict:
    """One shape's parity figures for the report (parity-report.json in the work dir has all)."""
    modes = {}
    for name, m in entry["modes"].items():
        if "skipped" in m:
            modes[name] = {"skipped": m["skipped"]}
            continue
        modes[name] = {k: m[k] for k in ("threshold", "worst_nmse", "headroom", "compared", "worst_nmse_end_to_end",
                                         "cost_bound", "worst_nmse_vs_float64", "controls",
                                         "gross_control_margin", "kq_scale_1pct_caught")}
        modes[name] |= {"chains_equal": all(c["chain_equal"] for c in m["cases"]),
                        "max_ctx_rows": max(c["n_ctx"] for c in m["cases"]),
                        "pass": all(c["pass"] for c in m["cases"])}
    return {"modes": modes,
            "draft_kv_bytes_per_token_f32": entry["modes"]["f32"]["cases"][0]["kv_bytes_per_token"],
            "draft_kv_bytes_per_token_f16": entry["modes"]["f16-cache"]["cases"][0]["kv_bytes_per_token"]}


def run_smoke(tree: Path | None = None, build: Path | None = None, work: Path | None = None,
              no_build: bool = False, server: bool = True, quick: bool = False, threads: int = 2) -> dict:
    """Every stage; the report's "ok" says whether all passed (see the module doc)."""
    from llamacpp_mla_port import build as build_mod
    from llamacpp_mla_port.series.worktree import locate_build

    started = time.monotonic()
    report: dict = {"stages": {}}
    stages = Stages(report["stages"], log=_logged)
    tree, build = locate_build(tree, build)
    work = Path(work) if work else Path(tempfile.mkdtemp(prefix="mla-port-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    report["tree"], report["build"], report["work"] = str(tree), str(build), str(work)

    if not no_build:
        stages.run("build", lambda: build_mod.ensure_build(tree, build, SMOKE_TARGETS, echo=False))

    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
    target = stages.run("fixtures", lambda: write_kimi_k3_target(build, work / "kimi-k3-target.gguf"))

    if target is not None:
        from llamacpp_mla_port.proof.parity import run_parity
        from llamacpp_mla_port.proof.reference.model import read_target_head
        embd, _ = read_target_head(target)
        vocab, hidden = embd.shape
        from llamacpp_mla_port.fixtures.target_variants import target_with_layers
        parity = stages.run("parity", lambda: run_parity(
            tree, build, work / "parity", lambda h, v, n: target_with_layers(target, work / "parity", n),
            hidden, vocab, threads=threads, log=_log))
        if parity is not None:
            report["parity"] = {name: _parity_summary(entry) for name, entry in parity.report["configs"].items()}
            # per mode, on the machine that ran: bound / measured, and how far the controls land
            report["parity_modes"] = {"system_info": parity.report.get("system_info"),
                                      "modes": parity.report["modes"]}
            if not parity.passed:
                stages.fail("parity", "a parity case is over its threshold")

        report["target_side"] = stages.run("target", lambda: target_side_check(tree, build, work, target))

        from llamacpp_mla_port.proof.lossless import run_lossless
        lengths = (3,) if quick else (1, 3, 7)
        lossless = stages.run("lossless", lambda: run_lossless(tree, build, work / "lossless", target,
                                                               server=server,
                                                               draft_lengths=lengths, threads=threads,
                                                               log=_log))
        if lossless is not None:
            report["lossless"] = lossless
            bigram_accepted = sum(r["accepted"] for r in lossless["speculative_simple"] if r["draft"] == "bigram")
            if lossless["n_mismatches"]:
                stages.fail("lossless", f"{lossless['n_mismatches']} outputs differ from the target alone")
            elif bigram_accepted == 0:
                stages.fail("lossless", "the bigram draft was never accepted: acceptance and rollback untested")

    report["ok"] = stages.ok
    report["seconds"] = round(time.monotonic() - started, 1)
    return report
