"""Evidence in upstream's own format: llama-bench and `test-backend-ops perf` on the pinned base
and on a PR stack, built with identical flags, into one SQLite file per stack and build, tabled
by the tree's own scripts/compare-llama-bench.py (the form ggml maintainers read: #6414,
#10714, #19012); where the stack asks for them, llama-batched-bench (several sequences, one
table of ours, base against stack) and a KL divergence of the stack's logits against the base's
(llama-perplexity --kl-divergence on a fixed text).

A stack asks for it in templates/port.toml [stacks.NAME.bench] (series/spec.Bench): the GGUF
types it touches, the model shapes, llama-bench's batch sizes and options, the test-backend-ops
ops, the batched-bench and perplexity options. The models have the shapes of a standard model
and random weights (fixtures/standard_model.py), which every table's caption says, with the
layers, the threads and the machine. The trees and builds are harness-diff's
(work/harness-diff/base and <stack>, one build dir per ISA), so the same flags build both sides.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import sqlite3
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from llamacpp_mla_port.build import ensure_build
from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.fixtures.standard_model import SHAPES, write_standard_model
from llamacpp_mla_port.project import bin_dir, tree_in
from llamacpp_mla_port.upstreaming import harness_diff as hd
from llamacpp_mla_port.jsonfile import write_json

#: what a maintainer has to run where this machine cannot (CHECKLIST.md asks for it)
NOT_MEASURED = ("ARM (NEON, SVE)", "AMX (Sapphire Rapids and later)", "16 or more threads",
                "another compiler (Clang, MSVC)")
TARGETS = ("llama-bench", "test-backend-ops")
BATCHED, PERPLEXITY = "llama-batched-bench", "llama-perplexity"
#: one SQL statement of llama-bench / test-backend-ops `--output sql` (both print only these)
_STATEMENT = re.compile(r"^(CREATE TABLE|INSERT INTO)\b.*?;\s*$", re.S | re.M)
#: the fixed text of the KL divergence: the base tree's own README (the pin fixes it)
KLD_TEXT = "README.md"
#: llama-perplexity's summary lines after --kl-divergence, by the key they are stored under
_KLD_LINES = {"ppl_q": r"Mean PPL\(Q\)\s*:\s*([\d.]+)", "ppl_base": r"Mean PPL\(base\)\s*:\s*([\d.]+)",
              "mean_kld": r"Mean    KLD:\s*([-\d.]+)", "max_kld": r"Maximum KLD:\s*([-\d.]+)",
              "kld_99_9": r"99\.9%\s+KLD:\s*([-\d.]+)", "rms_dp": r"RMS \u0394p\s*:\s*([\d.]+)",
              "same_top_p": r"Same top p:\s*([\d.]+)"}


@dataclass(frozen=True)
class Settings:
    isas: tuple[str, ...] = ("native", "avx2")
    threads: str = "1,2"          # llama-bench -t (batched-bench and perplexity: the largest)
    reps: int = 3                 # llama-bench -r
    rounds: int = 2               # runs of each side, interleaved base/patched (ABBA)
    n_layer: int = 4              # layers of the standard-shape model
    jobs: int | None = None

    def for_bench(self, bench) -> "Settings":
        """These settings with the stack's own on top (port.toml [stacks.NAME.bench] n_layer, reps)."""
        return replace(self, **{k: v for k in ("n_layer", "reps") if (v := getattr(bench, k)) is not None})

    @property
    def max_threads(self) -> str:
        return str(max(int(x) for x in self.threads.split(",") if x.strip()))


def load_sql(db: Path, sql_text: str, label: str) -> int:
    """Run the statements of `sql_text` into `db` and label the rows they add with `label`
    (build_commit): an exported tree has no git, so the binaries cannot name their commit."""
    statements = [m.group(0) for m in _STATEMENT.finditer(sql_text)]
    inserts = [s for s in statements if s.startswith("INSERT")]
    if not inserts:
        raise ProofError("the benchmark printed no result row", hint=sql_text[-1500:])
    table = re.match(r"INSERT INTO\s+(\w+)", inserts[0]).group(1)
    with sqlite3.connect(db) as con:
        for s in statements:
            if not s.startswith("INSERT"):
                con.execute(s)
        before = con.execute(f"SELECT COALESCE(MAX(rowid), 0) FROM {table}").fetchone()[0]
        for s in inserts:
            con.execute(s)
        con.execute(f"UPDATE {table} SET build_commit = ? WHERE rowid > ?", (label, before))
    return len(inserts)


def compare_table(tree: Path, db: Path, tool: str, base: str, head: str) -> str:
    """scripts/compare-llama-bench.py's markdown table of `db`, base against head."""
    script = tree / "scripts" / "compare-llama-bench.py"
    cmd = [sys.executable, str(script), "-i", str(db), "--tool", tool, "-b", base, "-c", head]
    return hd.run_tool(cmd, 600).strip()


def commands(bench, model: Path, settings: Settings) -> dict[str, list[str]]:
    """The timed command lines (binary name first) of one side, keyed by what they measure."""
    out = {f"llama-bench {model.name}": ["llama-bench", "-m", str(model), "-p", bench.prompts, "-n", "0",
                                         "-t", settings.threads, "-r", str(settings.reps), *bench.args,
                                         "-o", "sql"]}
    for op in bench.ops:
        out[f"test-backend-ops perf {op}"] = (["test-backend-ops", "perf", "-b", "CPU", "-o", op]
                                              + (["-p", bench.params] if bench.params else [])
                                              + ["--output", "sql"])
    if bench.batched:
        out[f"{BATCHED} {model.name}"] = [BATCHED, "-m", str(model), "-t", settings.max_threads, *bench.batched,
                                          "--output-format", "jsonl"]
    return out


def batched_rows(text: str) -> list[dict]:
    """llama-batched-bench --output-format jsonl: one dict per (pp, tg, pl) it ran."""
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{") and '"speed_tg"' in line]
    if not rows:
        raise ProofError(f"{BATCHED} printed no result row", hint=text[-1500:])
    return rows


def batched_table(rows: list[dict], base: str, head: str, groups: dict[str, int]) -> str:
    """Our table of llama-batched-bench, base against the stack: each side's tokens per second
    averaged over its rounds. TG steps decode one row per sequence (pl rows of each head)."""
    acc: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        acc.setdefault((r["model"], r["pp"], r["tg"], r["pl"]), {}).setdefault(r["label"], []).append(r)
    lines = [f"| Model | PP | TG | B | TG rows x heads per K/V head | S_PP t/s {base} | S_PP t/s {head} | PP speedup "
             f"| S_TG t/s {base} | S_TG t/s {head} | TG speedup |", "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for (model, pp, tg, pl), sides in acc.items():
        if base not in sides or head not in sides:
            continue
        b, h = ({k: statistics.mean(x[k] for x in sides[s]) for k in ("speed_pp", "speed_tg")} for s in (base, head))
        lines.append(f"| {model} | {pp} | {tg} | {pl} | {pl * groups.get(model, 1)} | {b['speed_pp']:.2f} | "
                     f"{h['speed_pp']:.2f} | {h['speed_pp'] / b['speed_pp']:.2f} | {b['speed_tg']:.2f} | "
                     f"{h['speed_tg']:.2f} | {h['speed_tg'] / b['speed_tg']:.2f} |")
    return "\n".join(lines)


def kld_figures(text: str) -> dict:
    """The summary of `llama-perplexity --kl-divergence`: KLD, token probability, PPL."""
    out = {k: float(m.group(1)) for k, rx in _KLD_LINES.items() if (m := re.search(rx, text))}
    if "mean_kld" not in out:
        raise ProofError(f"{PERPLEXITY} printed no KL divergence", hint=text[-1500:])
    return out


def kld_runs(bins: dict[str, Path], model: Path, text: Path, bench, settings: Settings, work: Path,
             log: Callable[[str], None]) -> dict:
    """The stack's logits against the base's on `text`, both with bench.kld's batches, and the
    control: the base's run again (must read 0). With bench.kld_reference, the stack's logits also
    against the base's with those options added (batches the base tiles too: 0 where the stack
    computes what the base's tiled path does)."""
    common = ["-m", str(model), "-f", str(text), "-t", settings.max_threads, *bench.kld]
    files = {"base": work / f"{model.stem}.kld", "reference": work / f"{model.stem}-reference.kld"}
    writes = {"base": [PERPLEXITY, *common, "--kl-divergence-base", str(files["base"])]}
    if bench.kld_reference:
        writes["reference"] = [PERPLEXITY, *common, *bench.kld_reference, "--kl-divergence-base",
                               str(files["reference"])]
    against = {what: ["--kl-divergence-base", str(f), "--kl-divergence"] for what, f in files.items()}
    runs = {"stack": ("patched", [PERPLEXITY, *common, *against["base"]]),
            "control": ("base", [PERPLEXITY, *common, *against["base"]])}
    if bench.kld_reference:
        runs["reference"] = ("patched", [PERPLEXITY, *common, *against["reference"]])
    out: dict = {"commands": {}}
    try:
        for what, cmd in writes.items():
            log(f"upstream-bench: {model.name}: the base's logits, {what} ({PERPLEXITY})")
            hd.run_tool([str(bins["base"] / cmd[0]), *cmd[1:]], 7200)
            out["commands"][f"{what} logits"] = "(base) " + " ".join(cmd)
        for what, (side, cmd) in runs.items():
            log(f"upstream-bench: {model.name}: KL divergence, {what}")
            out[what] = kld_figures(hd.run_tool([str(bins[side] / cmd[0]), *cmd[1:]], 7200))
            out["commands"][what] = f"({side}) " + " ".join(cmd)
    finally:
        for f in files.values():
            f.unlink(missing_ok=True)       # vocabulary x tokens x 2 bytes: hundreds of MB each
    return out


def layers_note(shape, n_layer: int) -> str:
    """Which kind of layer the first `n_layer` of an MoE model are (its dense lead, its experts)."""
    if shape.mla is None:
        return ""
    dense = min(n_layer, shape.mla.n_dense_lead)
    return (f"{dense} dense-FFN layer{'s' if dense > 1 else ''}" +
            (f" and {n_layer - dense} MoE layer{'s' if n_layer - dense > 1 else ''} ({shape.mla.n_expert} "
             f"experts, {shape.mla.n_expert_used} used)" if n_layer > dense else ", no MoE layer"))


def machine() -> dict:
    """The CPU the figures come from and how busy the machine was (1-minute load average)."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    return {"cpu": cpu, "cpus": os.cpu_count(), "load": round(os.getloadavg()[0], 1)}


def _table(bench) -> dict:
    """The stack's [bench] table as a report records it: a key the table leaves unset (or empty)
    is left out, so a report from before that key existed still stands."""
    return {k: v for k, v in asdict(bench).items() if v is not None and v != ()}


def run_stack(repo, rs, base_sha: str, base_label: str, places, settings: Settings = Settings(),
              log: Callable[[str], None] = lambda m: None) -> dict:
    """Base `base_sha` against the stack's head: builds (harness-diff's trees), models, the
    SQLite files, compare-llama-bench's tables, batched-bench and KL divergence; report.json /
    report.md in places.upstream_bench_dir/<stack>."""
    bench = rs.stack.bench
    if bench is None:
        raise ProofError(f"stack {rs.stack.name} has no [stacks.{rs.stack.name}.bench] table",
                         hint="name the GGUF types and ops it touches in templates/port.toml")
    settings = settings.for_bench(bench)
    t0 = time.monotonic()
    hd_root, out = places.harness_diff_dir, places.upstream_bench_dir / rs.stack.name
    out.mkdir(parents=True, exist_ok=True)
    old = hd.standing_report(out, {"base_sha": base_sha, "head": rs.head, "bench": _table(bench),
                                   "settings": asdict(settings)})
    if old is not None:
        log(f"upstream-bench {rs.stack.name}: the report of {rs.head[:12]} stands ({out / 'report.md'})")
        return old
    kept = earlier_builds(out, base_sha, rs.head, bench, settings)
    sides = {"base": (hd_root / "base", base_sha), "patched": (hd_root / rs.stack.name, rs.head)}
    for sdir, sha in sides.values():
        hd.export_commit(repo, sha, tree_in(sdir))
    models, groups = [], {}
    for shape in bench.shapes:
        for t in bench.types:
            name = f"{shape}-{settings.n_layer}L-{t}.gguf"
            log(f"upstream-bench: model {name}")
            models.append(write_standard_model(shape, t, places.upstream_bench_dir / "models" / name, settings.n_layer))
            groups[models[-1].name] = SHAPES[shape].group
    targets = TARGETS + ((BATCHED,) if bench.batched else ()) + ((PERPLEXITY,) if bench.kld else ())
    labels = {"base": base_sha[:8], "patched": rs.head[:8]}
    report: dict = {"stack": rs.stack.name, "base": base_label, "base_sha": base_sha, "head": rs.head,
                    "settings": asdict(replace(settings, isas=tuple(kept) + settings.isas)),
                    "bench": _table(bench),
                    "models": [{"shape": SHAPES[s].model, "n_layer": settings.n_layer, "of_layers": SHAPES[s].n_layer,
                                "heads": f"{SHAPES[s].n_head} query heads over {SHAPES[s].n_head_kv} K/V",
                                "files": [m.name for m in models if m.name.startswith(f"{s}-")],
                                "layers": layers_note(SHAPES[s], settings.n_layer)} for s in bench.shapes],
                    "builds": dict(kept)}
    for isa in settings.isas:
        started, t_isa = machine(), time.monotonic()
        db = out / f"{isa}.sqlite"
        db.unlink(missing_ok=True)
        ran: dict[str, list[str]] = {}
        bins = {}
        batched: list[dict] = []
        for side, (sdir, _) in sides.items():
            log(f"upstream-bench {rs.stack.name}: {side} ({isa}): building {', '.join(targets)}")
            bins[side] = bin_dir(ensure_build(tree_in(sdir), hd.build_dir_of(sdir, isa), targets, hd.ISA_BUILDS[isa],
                                              jobs=settings.jobs, echo=False))
        # rounds in ABBA order: a drift of the machine (clock, another load) falls on both sides,
        # and compare-llama-bench averages each side's rounds
        for r in range(settings.rounds):
            for side in (("base", "patched") if r % 2 == 0 else ("patched", "base")):
                for model in models:
                    for what, cmd in commands(bench, model, settings).items():
                        if what.startswith("test-backend-ops") and model is not models[0]:
                            continue            # the op cases do not depend on the model
                        log(f"upstream-bench {rs.stack.name}: {side} ({isa}, round {r + 1}): {what}")
                        exe, env = bins[side] / cmd[0], None
                        if cmd[0] == "test-backend-ops":
                            # the stack's perf cases (those it adds too) on each side's ggml: the
                            # stack's binary with this side's libraries
                            exe, env = bins["patched"] / cmd[0], {**os.environ, "LD_LIBRARY_PATH": str(bins[side])}
                        text = hd.run_tool([str(exe), *cmd[1:]], 7200, env=env)
                        if cmd[0] == BATCHED:
                            batched += [{**row, "model": model.name, "label": labels[side], "round": r + 1}
                                        for row in batched_rows(text)]
                        else:
                            load_sql(db, text, labels[side])
                        ran.setdefault(what, [" ".join(cmd)])
        tree = tree_in(sides["base"][0])
        tables = {tool: compare_table(tree, db, tool, labels["base"], labels["patched"])
                  for tool in ("llama-bench", *(("test-backend-ops",) if bench.ops else ()))}
        if batched:
            tables[BATCHED] = batched_table(batched, labels["base"], labels["patched"], groups)
        build = {"cmake": list(hd.ISA_BUILDS[isa]), "sqlite": str(db), "tables": tables,
                 "commands": [c for cs in ran.values() for c in cs], "machine": started}
        if batched:
            build["batched_rows"] = batched
        if bench.kld:
            build["kld"] = {m.name: kld_runs(bins, m, tree / KLD_TEXT, bench, settings, out, log) for m in models}
        build["machine"]["load_end"] = round(os.getloadavg()[0], 1)
        build["seconds"] = round(time.monotonic() - t_isa, 1)
        report["builds"][isa] = build
    report["seconds"] = round(time.monotonic() - t0 + sum(b.get("seconds", 0) for b in kept.values()), 1)
    write_json(out / "report.json", report, indent=1)
    (out / "report.md").write_text(markdown(report))
    return report


def earlier_builds(out: Path, base_sha: str, head: str, bench, settings: Settings) -> dict:
    """The builds of out/report.json that this run leaves alone: a report of the same commits,
    bench table and settings but for other ISAs (`--isa avx2` after `--isa native` adds to it)."""
    try:
        old = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return {}
    same = json.loads(json.dumps({"base_sha": base_sha, "head": head, "bench": _table(bench),
                                  "settings": {**asdict(settings), "isas": None}}))
    if {**{k: old.get(k) for k in ("base_sha", "head", "bench")},
            "settings": {**old.get("settings", {}), "isas": None}} != same:
        return {}
    return {isa: b for isa, b in old.get("builds", {}).items() if isa not in settings.isas}


def _models(report: dict) -> list[dict]:
    """The report's models: a list; a report of one shape (before several) held one dict."""
    m = report["models"]
    return m if isinstance(m, list) else [m]


def caption(report: dict, tool: str, build: dict | None = None) -> str:
    """The caveat line every table carries, so that a pasted table keeps it: the weights, the
    layers, the threads, the machine (the build's run, else the report's)."""
    st, mach = report["settings"], (build or {}).get("machine") or report.get("machine") or {}
    busy = mach and max(mach["load"], mach.get("load_end", 0)) > 0.5 * (mach["cpus"] or 1)
    where = (f"{mach['cpu']}, {mach['cpus']} CPUs, load average {mach['load']}"
             + (f"-{mach['load_end']}" if "load_end" in mach and mach["load_end"] != mach["load"] else "")
             + (" (busy: other work shared the CPUs, so the figures are noisy)" if busy else "")
             if mach else "machine not recorded")
    if tool == "test-backend-ops":
        return (f"_Op cases alone (no model): the PR's test-backend-ops perf -b CPU, its cases on each side's "
                f"ggml libraries, at its default threads; {where}._")
    models = "; ".join(f"{m['shape']} shapes ({m.get('heads', '') + ', ' if m.get('heads') else ''}"
                       f"{m['n_layer']} of {m['of_layers']} layers{', ' + m['layers'] if m.get('layers') else ''})"
                       for m in _models(report))
    rounds = st.get("rounds", 1)
    how = {"llama-bench": f"llama-bench -t {st['threads']} -r {st['reps']}, {rounds} round(s) per side in ABBA order",
           BATCHED: f"{BATCHED} -t {max(int(x) for x in str(st['threads']).split(','))}, {rounds} round(s) per side "
                    "in ABBA order",
           "kld": f"{PERPLEXITY} -t {max(int(x) for x in str(st['threads']).split(','))} on the base tree's "
                  f"{KLD_TEXT}"}[tool]
    return f"_Random weights; {models}; {how}; {where}._"


def _kld_table(kld: dict) -> list[str]:
    lines = ["| Model | run | mean KLD | 99.9% KLD | max KLD | RMS dp % | same top p % |",
             "|:--|:--|--:|--:|--:|--:|--:|"]
    names = {"stack": "this PR against the base, the same batches", "control": "the base against itself (must read 0)",
             "reference": "this PR against the base at the reference batches"}
    for model, runs in kld.items():
        for what in (w for w in names if w in runs):      # stack, control, reference
            f = {k: runs[what].get(k, float("nan")) for k in ("kld_99_9", "max_kld", "rms_dp", "same_top_p")}
            lines.append(f"| {model} | {names[what]} | {runs[what]['mean_kld']:.6f} | {f['kld_99_9']:.6f} | "
                         f"{f['max_kld']:.6f} | {f['rms_dp']:.3f} | {f['same_top_p']:.3f} |")
    return lines


def markdown(report: dict) -> str:
    """The section EVIDENCE.md opens with: the tables per build, each with its caveat line, the
    models, what was not measured."""
    st = report["settings"]
    lines = [f"Base {report['base']} ({report['base_sha'][:8]}) against this PR ({report['head'][:8]}), "
             "built with the same flags; tables by the tree's `scripts/compare-llama-bench.py`"
             + (f", {BATCHED}'s by this tool" if any(BATCHED in b["tables"] for b in report["builds"].values())
                else "") + ".", "",
             "Models, **random weights**: " + "; ".join(
                 f"the shapes of {m['shape']} ({m['n_layer']} of its {m['of_layers']} layers, its full vocabulary"
                 f"{'; ' + m['layers'] if m.get('layers') else ''}): {', '.join(m['files'])}" for m in _models(report))
             + f". llama-bench `-t {st['threads']} -r {st['reps']}`, "
             + (f"{st['rounds']} rounds per side in ABBA order (the tables average them)."
                if st.get("rounds", 1) > 1 else "one round per side."), ""]
    for isa, b in report["builds"].items():
        flags = " ".join(b["cmake"]) or "GGML_NATIVE=ON, the default"
        lines += [f"### {isa} build ({flags})", ""]
        for tool, table in b["tables"].items():
            lines += [f"`{tool}`:", "", caption(report, tool, b), "", table, ""]
        if b.get("kld"):
            lines += [f"KL divergence of the logits (`{PERPLEXITY} --kl-divergence`, base logits as the reference):",
                      "", caption(report, "kld", b), "", *_kld_table(b["kld"]), ""]
        lines += ["Commands (each side):", "", "```sh", *b["commands"],
                  *[c for runs in (b.get("kld") or {}).values() for c in runs["commands"].values()], "```", ""]
    lines += ["Not measured here: " + "; ".join(NOT_MEASURED) + ". Run the same commands on such a "
              "machine before the PR (CHECKLIST.md).", ""]
    return "\n".join(lines)


def evidence_section(report_dir: Path, name: str, base: str, head: str | None = None,
                     wanted: bool = True) -> str:
    """EVIDENCE.md's opening section for `name`: its tables, or the command that makes them."""
    command = f'make upstream-bench UPSTREAM_BENCH_ARGS="--stack {name}"'
    lines = ["## Upstream's benchmarks, base against this PR", ""]
    if not wanted:
        return "\n".join(lines + ["No performance claim: the stack has no "
                                  f"`[stacks.{name}.bench]` table, so none was run.", ""])
    report, why = hd.stack_report(report_dir, name, base, head)
    if report is None:
        return "\n".join(lines + [f"Not run: `{command}` (or `make pr`)." if why == "absent"
                                  else f"{why}: rerun `{command}`.", ""])
    return "\n".join(lines + [f"`{rerun_command(name, report.get('settings', {}))}` ({report.get('seconds')} s).",
                              "", markdown(report)])


def rerun_command(name: str, st: dict) -> str:
    """The command that makes these tables again, with the settings they were made with."""
    args = [f"--stack {name}"]
    for flag, key in (("--isa", "isas"), ("-t", "threads"), ("-r", "reps"), ("--rounds", "rounds"),
                      ("--layers", "n_layer")):
        if key in st:
            args.append(f"{flag} {','.join(st[key]) if isinstance(st[key], list) else st[key]}")
    return f'make upstream-bench UPSTREAM_BENCH_ARGS="{" ".join(args)}"'
