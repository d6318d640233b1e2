"""Evidence in upstream's own format: llama-bench and `test-backend-ops perf` on the pinned base
and on a PR stack, built with identical flags, into one SQLite file per stack and build, tabled
by the tree's own scripts/compare-llama-bench.py (the form ggml maintainers read: #6414,
#10714, #19012).

A stack asks for it in templates/port.toml [stacks.NAME.bench] (series/spec.Bench): the GGUF
types it touches, llama-bench's batch sizes and options, the test-backend-ops ops. The models
have the shapes of a standard model and random weights (fixtures/standard_model.py), which
EVIDENCE.md says plainly. The trees and builds are harness-diff's (work/harness-diff/base and
<stack>, one build dir per ISA), so the same flags build both sides.

    run_stack(repo, rs, base_sha, base_label, places, settings, log) -> dict
    evidence_section(report_dir, name, base, head) -> str
"""

from __future__ import annotations

import re
import sqlite3
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
#: one SQL statement of llama-bench / test-backend-ops `--output sql` (both print only these)
_STATEMENT = re.compile(r"^(CREATE TABLE|INSERT INTO)\b.*?;\s*$", re.S | re.M)


@dataclass(frozen=True)
class Settings:
    isas: tuple[str, ...] = ("native", "avx2")
    threads: str = "1,2"          # llama-bench -t
    reps: int = 3                 # llama-bench -r
    rounds: int = 2               # runs of each side, interleaved base/patched (ABBA)
    n_layer: int = 4              # layers of the standard-shape model
    jobs: int | None = None

    def for_bench(self, bench) -> "Settings":
        """These settings with the stack's own on top (port.toml [stacks.NAME.bench] n_layer, reps)."""
        return replace(self, **{k: v for k in ("n_layer", "reps") if (v := getattr(bench, k)) is not None})


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
    return hd.run_tool([sys.executable, str(script), "-i", str(db), "--tool", tool, "-b", base, "-c", head],
                600).strip()


def commands(bench, model: Path, settings: Settings) -> dict[str, list[str]]:
    """The command lines (binary name first) of one side, keyed by what they measure."""
    out = {f"llama-bench {model.name}": ["llama-bench", "-m", str(model), "-p", bench.prompts, "-n", "0",
                                         "-t", settings.threads, "-r", str(settings.reps), *bench.args,
                                         "-o", "sql"]}
    for op in bench.ops:
        out[f"test-backend-ops perf {op}"] = (["test-backend-ops", "perf", "-b", "CPU", "-o", op]
                                              + (["-p", bench.params] if bench.params else [])
                                              + ["--output", "sql"])
    return out


def layers_note(shape, n_layer: int) -> str:
    """Which kind of layer the first `n_layer` of an MoE model are (its dense lead, its experts)."""
    if shape.mla is None:
        return ""
    dense = min(n_layer, shape.mla.n_dense_lead)
    return (f"{dense} dense-FFN layer{'s' if dense > 1 else ''}" +
            (f" and {n_layer - dense} MoE layer{'s' if n_layer - dense > 1 else ''} ({shape.mla.n_expert} "
             f"experts, {shape.mla.n_expert_used} used)" if n_layer > dense else ", no MoE layer"))


def _table(bench) -> dict:
    """The stack's [bench] table as a report records it: a key the table leaves unset is left out,
    so a report from before that key existed still stands."""
    return {k: v for k, v in asdict(bench).items() if v is not None}


def run_stack(repo, rs, base_sha: str, base_label: str, places, settings: Settings = Settings(),
              log: Callable[[str], None] = lambda m: None) -> dict:
    """Base `base_sha` against the stack's head: builds (harness-diff's trees), models, the
    SQLite files and compare-llama-bench's tables; report.json / report.md in
    places.upstream_bench_dir/<stack>."""
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
    sides = {"base": (hd_root / "base", base_sha), "patched": (hd_root / rs.stack.name, rs.head)}
    for sdir, sha in sides.values():
        hd.export_commit(repo, sha, tree_in(sdir))
    models = []
    for t in bench.types:
        name = f"{bench.shape}-{settings.n_layer}L-{t}.gguf"
        log(f"upstream-bench: model {name}")
        models.append(write_standard_model(bench.shape, t, places.upstream_bench_dir / "models" / name,
                                           settings.n_layer))
    labels = {"base": base_sha[:8], "patched": rs.head[:8]}
    report: dict = {"stack": rs.stack.name, "base": base_label, "base_sha": base_sha, "head": rs.head,
                    "settings": asdict(settings), "bench": _table(bench),
                    "models": {"shape": SHAPES[bench.shape].model, "n_layer": settings.n_layer,
                               "of_layers": SHAPES[bench.shape].n_layer, "files": [m.name for m in models],
                               "layers": layers_note(SHAPES[bench.shape], settings.n_layer)},
                    "builds": {}}
    for isa in settings.isas:
        db = out / f"{isa}.sqlite"
        db.unlink(missing_ok=True)
        ran: dict[str, list[str]] = {}
        bins = {}
        for side, (sdir, _) in sides.items():
            log(f"upstream-bench {rs.stack.name}: {side} ({isa}): building {', '.join(TARGETS)}")
            bins[side] = bin_dir(ensure_build(tree_in(sdir), hd.build_dir_of(sdir, isa), TARGETS, hd.ISA_BUILDS[isa],
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
                        load_sql(db, hd.run_tool([str(bins[side] / cmd[0]), *cmd[1:]], 7200), labels[side])
                        ran.setdefault(what, [" ".join(cmd)])
        tree = tree_in(sides["base"][0])
        tables = {"llama-bench": compare_table(tree, db, "llama-bench", labels["base"], labels["patched"])}
        if bench.ops:
            tables["test-backend-ops"] = compare_table(tree, db, "test-backend-ops", labels["base"],
                                                       labels["patched"])
        report["builds"][isa] = {"cmake": list(hd.ISA_BUILDS[isa]), "sqlite": str(db), "tables": tables,
                                 "commands": [c for cs in ran.values() for c in cs]}
    report["seconds"] = round(time.monotonic() - t0, 1)
    write_json(out / "report.json", report, indent=1)
    (out / "report.md").write_text(markdown(report))
    return report


def markdown(report: dict) -> str:
    """The section EVIDENCE.md opens with: the tables per build, the models, what was not measured."""
    m, st = report["models"], report["settings"]
    lines = [f"Base {report['base']} ({report['base_sha'][:8]}) against this PR ({report['head'][:8]}), "
             "built with the same flags; tables by the tree's `scripts/compare-llama-bench.py`.", "",
             f"Models: the shapes of {m['shape']} ({m['n_layer']} of its {m['of_layers']} layers, its full "
             f"vocabulary{'; ' + m['layers'] if m.get('layers') else ''}), **random weights**: "
             f"{', '.join(m['files'])}. llama-bench `-t {st['threads']} "
             f"-r {st['reps']}`, " + (f"{st['rounds']} rounds per side in ABBA order (the tables average them)."
                                 if st.get("rounds", 1) > 1 else "one round per side."), ""]
    for isa, b in report["builds"].items():
        flags = " ".join(b["cmake"]) or "GGML_NATIVE=ON, the default"
        lines += [f"### {isa} build ({flags})", ""]
        for tool, table in b["tables"].items():
            lines += [f"`{tool}`:", "", table, ""]
        lines += ["Commands (each side):", "", "```sh", *b["commands"], "```", ""]
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
