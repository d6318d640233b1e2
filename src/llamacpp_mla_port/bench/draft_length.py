"""What the draft buys on this machine: the target's verify cost, the draft's cost and the
acceptance, measured together, and the best draft length (`llamacpp-mla-port draft-length`).

    measure_pair(tree, build, target, draft, out, settings, prompts=None, log=print) -> dict

1. The pair is checked first (doctor: taps, width, vocabulary), then, in process rounds A B ... B A:
   verify-bench on the target (T(N), N = 1..8, over `depth` cached tokens, bench.verify) and
   draft-bench on the pair for each draft length k = 1..7 (its block of k tokens over 512 cached
   rows; with k = 7 also the injection of 1 and 8 target rows). Medians over all runs.
2. Acceptance per position: with prompts, greedy llama-speculative-simple at draft length 7 on
   each (bench.spec); without, the published curves (bench.acceptance), each with its source.
3. The table (bench.speedup), written to OUT/report.md, report.json and plots/draft_length.png.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from llamacpp_mla_port.bench import acceptance as acc
from llamacpp_mla_port.bench import speedup
from llamacpp_mla_port.bench.passes import run_draft_bench
from llamacpp_mla_port.bench.spec import run_speculative
from llamacpp_mla_port.bench.verify import VERIFY_N, VerifyCost, run_verify_bench, summarize
from llamacpp_mla_port.doctor.diagnose import diagnose
from llamacpp_mla_port.doctor.findings import ERROR, OK
from llamacpp_mla_port.errors import GGUFError, PortError
from llamacpp_mla_port.proof.run.programs import compile_program
from llamacpp_mla_port.jsonfile import write_json

DRAFT_KS = tuple(range(1, acc.K_MAX + 1))
INJECT_ROWS = (1, 8)
#: the doctor's checks whose errors llama.cpp refuses the pair for (the others it leaves to the loader);
#: its target_layers check also judges the taps' values, so it counts only when a tap is out of the
#: target's range (no target_taps ok: the doctor's own rule; tap 0, the embeddings, is in range)
PAIRING_CHECKS = {"arch", "target", "target_n_embd", "target_vocab"}


@dataclass
class Settings:
    threads: int
    depth: int = 1024              # tokens in the target's cache when it verifies
    rounds: int = 2                # process rounds (A B ... B A)
    verify_rounds: int = 3         # timed passes per N inside one verify-bench process
    draft_repeats: int = 3         # timed blocks per k inside one draft-bench process
    draft_min_seconds: float = 2.0
    block_ctx: int = 512           # the draft's cached context rows
    expert_blocks: int = 8
    n_predict: int = 64            # tokens generated per prompt for the acceptance
    ctx_size: int = 4096


def check_pair(target: Path, draft: Path) -> None:
    """Stop before any process when a file is missing or the draft cannot pair with the target."""
    for what, p in (("target", target), ("draft", draft)):
        if not Path(p).is_file():
            raise PortError(f"--{what} {p}: no such file", hint=f"give the {what} GGUF's path")
    try:
        _, findings = diagnose(Path(draft), Path(target))
    except (GGUFError, OSError) as err:
        raise PortError(f"cannot read the pair ({err})", hint="both files must be GGUF: the target model and its "
                        "DSpark draft") from err
    taps_ok = any(f.check == "target_taps" and f.verdict == OK for f in findings)
    errors = [f"{f.check}: {f.title} ({f.evidence})" for f in findings if f.verdict == ERROR and
              (f.check in PAIRING_CHECKS or f.check == "target_layers" and not taps_ok)]
    if errors:
        raise PortError(f"{draft} does not pair with {target}:\n" + "\n".join(f"  {e}" for e in errors),
                        hint=f"`llamacpp-mla-port doctor {draft} --target {target}` explains each finding")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def measure_costs(tree: Path, build: Path, target: Path, draft: Path, out: Path, st: Settings,
                  text: Path | None = None, log=print) -> tuple[VerifyCost, dict, dict, dict]:
    """(verify cost, draft block medians per k, injection medians per row count, commands); `text`:
    what the target's cache holds and verifies, through its tokenizer (default: random token ids)."""
    vb, db = compile_program("verify-bench", tree, build), compile_program("draft-bench", tree, build)
    out = Path(out)
    verify_runs, blocks, inject = [], {k: [] for k in DRAFT_KS}, {n: [] for n in INJECT_ROWS}
    commands: dict = {}
    jobs = [("verify", 0)] + [("draft", k) for k in DRAFT_KS]
    for r in range(st.rounds):
        for kind, k in (jobs if r % 2 == 0 else list(reversed(jobs))):
            if kind == "verify":
                log(f"draft-length: round {r + 1}/{st.rounds}: verify-bench, N = 1..8 over {st.depth} tokens")
                res, argv = run_verify_bench(vb, target, out / f"verify-{r}.json", st.threads, st.depth,
                                             st.verify_rounds, VERIFY_N, draft=draft, text=text,
                                             expert_blocks=st.expert_blocks if r == 0 else 0,
                                             state_dir=out / "states" / Path(target).stem)
                verify_runs.append(res)
                commands["verify"] = _shown(argv, res["note"])
                continue
            args = ["--block", k, "--block-ctx", st.block_ctx, "--repeats", st.draft_repeats, "--threads",
                    st.threads, "--flash-attn", "on", "--min-seconds", st.draft_min_seconds,
                    "--inject", ",".join(map(str, INJECT_ROWS)) if k == DRAFT_KS[-1] else ""]
            res, argv = run_draft_bench(db, draft, target, out / f"draft-k{k}-{r}.json", args)
            blocks[k] += res["block_seconds"]
            for n in INJECT_ROWS:
                inject[n] += res["inject"].get(str(n), [])
            commands[f"draft_k{k}"] = _shown(argv, res["note"])
    verify = summarize(verify_runs)
    return verify, {k: _median(v) for k, v in blocks.items()}, {n: _median(v) for n, v in inject.items() if v}, \
        commands


def _shown(argv: list, note: str | None) -> str:
    """A command line as the report lists it, with why extra buffer types were off, if they were."""
    return " ".join(map(str, argv)) + (f"   ({note})" if note else "")


def acceptance_curves(build: Path, target: Path, draft: Path, prompts: list[str] | None, st: Settings,
                      log=print) -> tuple[list[acc.Curve], dict]:
    if not prompts:
        return list(acc.PUBLISHED), {}
    log(f"draft-length: acceptance on {len(prompts)} prompt(s), draft length {acc.K_MAX}")
    tot = run_speculative(build, target, draft, prompts, acc.K_MAX, st.n_predict, st.threads, st.ctx_size,
                          flash_attn="on")
    src = (f"this pair, greedy llama-speculative-simple at --spec-draft-n-max {acc.K_MAX} on {len(prompts)} "
           f"prompt(s), {tot.accept_calls} steps, {tot.accepted} of {tot.drafted} drafted tokens accepted")
    return [acc.measured(tot.acceptance, src), *acc.PUBLISHED], {
        "steps": tot.accept_calls, "drafted": tot.drafted, "accepted": tot.accepted, "per_position": tot.acceptance,
        "command": " ".join(map(str, tot.argv)) + "   (per prompt)"}


def costs_of(verify: VerifyCost, blocks: dict, inject: dict) -> speedup.StepCosts:
    return speedup.StepCosts(verify.t1, dict(verify.spec), dict(verify.rollback), dict(blocks), dict(inject))


#: a Rust engine running Kimi-K3 with its experts streamed from SSD (64 GB M1 Max, issue 56): one verify
#: of 1 and of 8 tokens in seconds; T(N)/T(1) between them read as linear in N
DELTAFIN_T = (7.48, 14.82)


def deltafin_ratio(n: int) -> float:
    return 1.0 + (DELTAFIN_T[1] / DELTAFIN_T[0] - 1.0) * (n - 1) / 7


def verify_rows(verify: VerifyCost) -> list[str]:
    """T(N) per N beside the distinct experts one verify step reads, with the bounds, and beside
    deltafin's T(N)/T(1) on real routing."""
    ex = verify.experts.get("per_n", {})
    L = ["| N | T(N) spec (ms) | T(N)/T(1) | deltafin T(N)/T(1) | target alone T(N) (ms) | KDA/recurrent rollback "
         "cost (ms) | distinct experts / MoE layer | same token | bound: identical | bound: independent |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for n in sorted(verify.spec):
        e = ex.get(n, {})
        snap = verify.spec[n] - verify.alone[n] if n in verify.alone else float("nan")
        roll = verify.rollback.get(n, 0) * 1000
        L.append(f"| {n} | {verify.spec[n] * 1000:.1f} | {verify.ratio(n):.2f} | {deltafin_ratio(n):.2f} | "
                 f"{verify.alone.get(n, float('nan')) * 1000:.1f} | {snap * 1000:+.1f} (+{roll:.3f}) | "
                 f"{e.get('distinct_mean', '-')} | {e.get('same_token_mean', '-')} | {e.get('bound_identical', '-')} | "
                 f"{e.get('bound_independent', '-')} |")
    return L


def report_markdown(rep: dict) -> str:
    v = rep["verify_cost"]
    L = [f"# draft-length: {Path(rep['target']).name} + {Path(rep['draft']).name}", "",
         f"{rep['machine']} · {rep['threads']} threads · target cache {rep['depth']} tokens · median CPU share of "
         f"the timed verify passes {v['cpu_share']:.2f} (1: the threads had the cores)", "",
         "## The target's verify step", ""]
    L += rep["verify_rows"] + ["", "T(N) spec: the target as common_speculative runs it for a draft (rollback "
                               "snapshots, taps extracted), every block then rolled back whole; target alone: no "
                               "snapshots. Their difference is what restoring recurrent (KDA) state costs; the "
                               "rollback call itself in brackets.", "", "## The table", ""]
    L += rep["table_md"] + [""] + advice(rep) + ["", "## Commands", ""]
    L += [f"- `{key}`: `{cmd}`" for key, cmd in sorted(rep["commands"].items())]
    return "\n".join(L) + "\n"


def advice(rep: dict) -> list[str]:
    """The static length to use, --spec-draft-auto beside it, and on a measured pair upstream's own
    figures (tokens per step, acceptance per position, verify steps)."""
    name, k = rep["recommended"]
    lines = [f"use --spec-draft-n-max {k}   (acceptance: {name}; speedup "
             f"{rep['table']['best'][name]['speedup']:.2f}x)" if k else
             f"the draft does not pay on this machine (acceptance: {name}): run the target alone",
             f"or --spec-draft-auto --spec-draft-n-max {acc.K_MAX} (the spec-auto-length stack): the length per step "
             f"from the acceptance and the draft and verify times it measures, no draft while drafting loses"]
    m = rep.get("acceptance") or {}
    if m.get("steps"):
        lines.append(f"this pair as llama.cpp reports it: {1 + m['accepted'] / m['steps']:.2f} tokens per step, "
                     f"acceptance per position {', '.join(f'{x:.2f}' for x in m['per_position'])}, "
                     f"{m['steps']} verify steps")
    return lines


def measure_pair(tree: Path, build: Path, target: Path, draft: Path, out: Path, st: Settings,
                 prompts: list[str] | None = None, log=print) -> dict:
    from llamacpp_mla_port.bench.report import machine

    check_pair(target, draft)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = None
    if prompts:     # the prompts' text fills the cache and the verified blocks: real routing
        text = out / "prompts.txt"
        text.write_text("\n".join(prompts) + "\n")
    verify, blocks, inject, commands = measure_costs(tree, build, target, draft, out, st, text, log)
    curves, measured = acceptance_curves(build, target, draft, prompts, st, log)
    if measured:
        commands["acceptance"] = measured.pop("command")
    tab = speedup.table(costs_of(verify, blocks, inject), curves)
    m = machine()
    rep = {"target": str(target), "draft": str(draft), "threads": st.threads, "depth": st.depth,
           "machine": f"{m['cpu']}, {m['cores']} cores", "verify_cost": {
               "t1_alone_s": verify.t1, "spec_s": verify.spec, "alone_s": verify.alone, "rollback_s": verify.rollback,
               "runs": verify.runs, "cpu_share": verify.cpu_share, "experts": verify.experts},
           "draft_block_s": blocks, "draft_inject_s": inject, "acceptance": measured, "table": tab,
           "recommended": speedup.recommended(tab), "commands": commands}
    rep["verify_rows"] = verify_rows(verify)
    rep["table_md"] = speedup.render(tab)
    speedup.plot(tab, out / "plots" / "draft_length.png", f"{Path(target).name} + {Path(draft).name}, "
                 f"{st.threads} threads")
    write_json(out / "report.json", rep, indent=1, default=str)
    (out / "report.md").write_text(report_markdown(rep))
    return rep
