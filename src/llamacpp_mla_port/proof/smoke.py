"""The whole proof: build, make every fixture offline, run parity, the target side and
lossless speculative decoding, and return ONE report (the verb `smoke`,
commands/smoke.py, prints it as JSON and exits non-zero on any failure).

Stages (each is recorded in the report; a failing stage fails the run, later stages still run):
  build      build.ensure_build on the patched tree (the targets the proof needs)
  fixtures   the tiny Kimi-K3 target (fixtures.target, written by the tree's test-llama-archs)
  parity     proof.parity: 3 draft shapes x 5 precision modes against the float64 reference (F32)
             and the reference emulating the CPU backend's roundings (the others); per mode the
             headroom of its bound on this machine (report["parity_modes"])
  oracle     transformers' DeepSeek-V3 modules wired as the draft (reference.transformers_oracle)
             against our reference and llama.cpp's run of every parity case
  target     proof.target_features: the Kimi-K3 layer inputs == the block-local prefix stream
  lossless   proof.lossless: llama-speculative-simple and llama-server (-np 2) == target alone,
             draft lengths 1/3/7 x flash attention x p_min (--quick: each length and each
             flash attention / p_min pair once, 5 runs of each program instead of 14); the tokens
             both loops drafted (-lv 5) follow the bigram draft's Markov table
The tree and build default to the tool's work tree; MLA_PORT_TREE / MLA_PORT_BUILD
(or --tree/--build-dir) point elsewhere.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

from llamacpp_mla_port.build import TARGET_SETS
from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.project import Build
from llamacpp_mla_port.jsonfile import write_json
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


def run_smoke(where: Build, work: Path | None = None, no_build: bool = False, server: bool = True,
              quick: bool = False, threads: int = 2) -> dict:
    """Every stage on the patched tree and build `where` (project.Places.build); the report's
    "ok" says whether all passed (see the module doc)."""
    from llamacpp_mla_port import build as build_mod

    started = time.monotonic()
    report: dict = {"stages": {}}
    stages = Stages(report["stages"], log=_logged)
    where.require_tree()
    tree, build = where.tree, where.dir
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
            from llamacpp_mla_port.proof.reference.transformers_oracle import oracle_figures
            report["oracle"] = stages.run("oracle", lambda: oracle_figures(work / "parity", target))
            if report["oracle"] and report["oracle"]["problems"]:
                stages.fail("oracle", "; ".join(report["oracle"]["problems"][:3]))

        report["target_side"] = stages.run("target", lambda: target_side_check(tree, build, work, target))

        from llamacpp_mla_port.proof.lossless import run_lossless
        lossless = stages.run("lossless", lambda: run_lossless(tree, build, work / "lossless", target,
                                                               server=server, every_combination=not quick,
                                                               threads=threads, log=_log))
        if lossless is not None:
            report["lossless"] = lossless
            bigram_accepted = sum(r["accepted"] for r in lossless["speculative_simple"] if r["draft"] == "bigram")
            if lossless["n_mismatches"]:
                stages.fail("lossless", f"{lossless['n_mismatches']} outputs differ from the target alone")
            elif bigram_accepted == 0:
                stages.fail("lossless", "the bigram draft was never accepted: acceptance and rollback untested")
            elif lossless["chain"]["n_breaks"] or not lossless["chain"]["checked"]:
                stages.fail("lossless", f"drafted chains that do not follow the Markov head: {lossless['chain']}")

    report["ok"] = stages.ok
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


# ------------------------------------------------------------------ the proof as a stage of a kit
#: the report's name in the folder of prove_into
REPORT_NAME = "smoke.json"


def prove_into(folder: Path, where: Build, build: bool = True, server: bool = True, quick: bool = False,
               threads: int = 2) -> dict:
    """The proof as `make pr` and the canary run it: fixtures and runs in `folder` (emptied
    first), the progress lines in folder/proof.log, the report in folder/smoke.json (and
    returned). `build`: build the proof's targets first (the canary has built them)."""
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with open(folder / "proof.log", "w") as progress, contextlib.redirect_stderr(progress):
        report = run_smoke(where, folder, no_build=not build, server=server, quick=quick, threads=threads)
    write_json(folder / REPORT_NAME, report, indent=2)
    return report


# ------------------------------------------------------------------ reading a report
def proof_summary(smoke: dict) -> dict:
    """The figures a reviewer asks for, pulled out of the proof's report."""
    out: dict = {"ok": smoke.get("ok"), "stages": {k: v.get("ok") for k, v in
                                                   smoke.get("stages", {}).items()}}
    parity = smoke.get("parity") or {}
    out["parity_worst_nmse"] = {cfg: {m: e.get("worst_nmse") for m, e in v.get("modes", {}).items()}
                                for cfg, v in parity.items()}
    out["parity_headroom"] = {m: e.get("headroom") for m, e in
                              (smoke.get("parity_modes") or {}).get("modes", {}).items()}
    out["kv_bytes_per_token"] = {cfg: {k: v[k] for k in v if k.startswith("draft_kv_bytes")}
                                 for cfg, v in parity.items()}
    lossless = smoke.get("lossless") or {}
    if lossless:
        out["lossless"] = {k: lossless[k] for k in lossless
                           if k.startswith("n_") or k in ("runs", "mismatches")}
    if "target_side" in smoke:
        out["target_side"] = smoke["target_side"]
    return out


def lossless_counts(lossless: dict) -> dict:
    runs = lossless.get("speculative_simple", []) + lossless.get("server", [])
    return {"runs": len(runs), "identical": sum(1 for r in runs if r["identical"] == r["of"]),
            "mismatches": lossless.get("n_mismatches")}


def _printed(smoke: dict) -> dict[str, str]:
    """The figures of a smoke report as printed (3 significant digits), by name."""
    out = {}
    for cfg, entry in (smoke.get("parity") or {}).items():
        for mode, m in entry["modes"].items():
            out[f"parity {cfg} {mode} worst NMSE"] = f"{m['worst_nmse']:.3g}"
        for key in ("draft_kv_bytes_per_token_f32", "draft_kv_bytes_per_token_f16"):
            if key in entry:
                out[f"{cfg} {key}"] = str(entry[key])
    for run in (smoke.get("lossless") or {}).get("speculative_simple", []) + \
            (smoke.get("lossless") or {}).get("server", []):
        name = (f"lossless {'server' if 'parallel' in run else 'simple'} {run['draft']} k={run['draft_max']} "
                f"fa={run['flash_attn']} p_min={run['p_min']}")
        out[name] = f"{run['identical']}/{run['of']} identical, drafted {run['drafted']}, accepted {run['accepted']}"
    for name, v in (smoke.get("target_side") or {}).items():
        out[f"target {name} worst NMSE vs prefix stream"] = f"{v['worst_nmse_vs_prefix_stream']:.3g}"
    return out


def compare_figures(baseline: dict, smoke: dict) -> dict:
    """Which printed figures of `smoke` differ from `baseline` (e.g. the pin's own proof)."""
    old, new = _printed(baseline), _printed(smoke)
    diff = [{"figure": k, "baseline": old.get(k), "canary": new.get(k)}
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return {"equal": not diff, "compared": len(set(old) & set(new)), "differences": diff}


def failing_checks(smoke: dict) -> list[dict]:
    """The checks a smoke report failed, most specific first: a parity case over its
    threshold (config, mode, NMSE, threshold), the lossless mismatches, then the stages."""
    checks = []
    for cfg, entry in (smoke.get("parity") or {}).items():
        for mode, m in entry["modes"].items():
            if not m["pass"]:
                checks.append({"check": "parity", "config": cfg, "mode": mode,
                               "worst_nmse": m["worst_nmse"], "threshold": m["threshold"],
                               "chains_equal": m["chains_equal"],
                               "message": f"parity {cfg} {mode}: NMSE {m['worst_nmse']:.3g} over "
                                          f"the threshold {m['threshold']:.0e}"})
    lossless = smoke.get("lossless") or {}
    if lossless.get("n_mismatches"):
        checks.append({"check": "lossless", "mismatches": lossless.get("mismatches", [])[:5],
                       "message": f"lossless: {lossless['n_mismatches']} outputs differ from the "
                                  f"target alone, first: {lossless.get('mismatches', ['?'])[0]}"})
    for name, stage in smoke.get("stages", {}).items():
        if not stage.get("ok"):
            checks.append({"check": name, "error": stage.get("error", ""),
                           "message": f"{name}: {stage.get('error', 'failed')}"})
    return checks or [{"check": "smoke", "message": "the proof failed without naming a check"}]
