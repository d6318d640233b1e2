"""Speculative runs read through llama.cpp's own statistics line (llama-speculative-simple -lv 4),
and `make bench`'s spec stage: the speculative step split on the tiny pair of the lossless proof.

common_speculative counts, per accept call, how many leading draft positions were accepted:
its "#acc rate/pos" value i is the share of steps whose first i + 1 drafted tokens were all
accepted (cumulative, not conditional), so the expected tokens per step at draft length k is
1 + the sum of the first k values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llamacpp_mla_port.bench.context import BenchRun, log
from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
from llamacpp_mla_port.fixtures.target_variants import write_deep_kimi_k3_target
from llamacpp_mla_port.project import program
from llamacpp_mla_port.proof.lossless import PROMPTS, bigram_table, greedy_continuations, write_lossless_draft
from llamacpp_mla_port.proof.reference.model import read_target_head
from llamacpp_mla_port import process
from llamacpp_mla_port.proof.run.programs import compile_program

_STATS = re.compile(r"statistics\s+draft-dspark: #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+).*?#gen tokens =\s*(\d+), "
                    r"#acc tokens =\s*(\d+)(?:, #mean acc len = ([\d.]+), #acc rate/pos = \(([^)]*)\))?"
                    r".*?dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")


@dataclass
class SpecTotals:
    """Speculative runs summed over prompts."""
    draft_max: int
    steps: int = 0                 # draft calls
    accept_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_ms: float = 0.0          # common_speculative's own clock of the draft calls
    decode_s: float = 0.0          # the whole generation, draft and target
    per_position: np.ndarray = field(default=None)   # type: ignore[assignment]   summed rate x accept calls
    argv: list = field(default_factory=list)         # the last prompt's command

    def __post_init__(self):
        if self.per_position is None:
            self.per_position = np.zeros(self.draft_max)

    def add(self, text: str, argv: list) -> bool:
        """Add one run's statistics line; False when the log has none."""
        m, dec = _STATS.search(text), _DECODED.search(text)
        if not m or not dec:
            return False
        self.steps += int(m.group(2))
        self.accept_calls += int(m.group(3))
        self.drafted += int(m.group(4))
        self.accepted += int(m.group(5))
        self.draft_ms += float(m.group(9))
        self.decode_s += float(dec.group(2))
        if m.group(7):
            rates = [float(x) for x in m.group(7).split(",")][: self.draft_max]
            self.per_position[: len(rates)] += np.array(rates) * int(m.group(3))
        self.argv = argv
        return True

    @property
    def acceptance(self) -> list[float]:
        """Per draft position i (from 1): the share of steps whose first i drafted tokens were accepted."""
        n = max(1, self.accept_calls)
        return [round(float(x) / n, 4) for x in self.per_position]


def spec_argv(build: Path, target: Path, draft: Path, prompt: str, draft_max: int, n_predict: int, threads: int,
              ctx_size: int = 1024, flash_attn: str = "off") -> list:
    """llama-speculative-simple, greedy, the draft never cut by its confidence, statistics logged."""
    return [program(build, "llama-speculative-simple"), "-m", target, "-md", draft, "--spec-type", "draft-dspark",
            "--spec-draft-n-max", draft_max, "--spec-draft-p-min", 0, "-p", prompt, "-n", n_predict, "--temp", 0,
            "--top-k", 1, "-s", 1, "-c", ctx_size, "-fa", flash_attn, "-t", threads, "-lv", 4]


def run_speculative(build: Path, target: Path, draft: Path, prompts: list[str], draft_max: int = 7,
                    n_predict: int = 64, threads: int = 2, ctx_size: int = 1024, flash_attn: str = "off",
                    timeout: float = 600) -> SpecTotals:
    tot = SpecTotals(draft_max)
    for p in prompts:
        argv = spec_argv(build, target, draft, p, draft_max, n_predict, threads, ctx_size, flash_attn)
        # the statistics come through common's asynchronous logger: a loaded machine has seen a
        # run exit 0 without them, so such a run is repeated once
        for _ in range(2):
            proc = process.run(argv, timeout=timeout)
            if proc.returncode != 0:
                raise ProofError(f"llama-speculative-simple failed on prompt {p[:60]!r} (exit {proc.returncode}):\n"
                                 f"{(proc.stderr + proc.stdout)[-1500:]}", hint=" ".join(map(str, argv)))
            if tot.add(proc.stderr + proc.stdout, argv):
                break
        else:
            raise ProofError(f"llama-speculative-simple printed no statistics for {p[:60]!r}",
                             hint=" ".join(map(str, argv)))
    if tot.accept_calls == 0:
        raise ProofError("the speculative runs made no draft step", hint="give longer prompts or a larger -n")
    return tot


def tiny_spec_pair(tree: Path, build: Path, work: Path, n_prompts: int = 6, n_predict: int = 64
                   ) -> tuple[Path, Path, list[str]]:
    """(target, draft, prompts): the deep tiny Kimi-K3 target and a draft whose Markov head knows
    the target's greedy bigrams from half the prompts (partly accepted)."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    base = write_kimi_k3_target(build, work / "kimi-k3-tiny.gguf")
    target = write_deep_kimi_k3_target(base, work / "target-deep.gguf", "MKKMKK", 2)
    embd, _ = read_target_head(target)
    vocab, hidden = embd.shape
    prompts = list(PROMPTS[:n_prompts])
    seqs = greedy_continuations(compile_program("target-features", tree, build), target, prompts[: n_prompts // 2],
                                work / "greedy", n_predict)
    draft = write_lossless_draft(tree, work, "draft-bigram", hidden, vocab, [0, 2, 4], bigram_table(seqs))
    return target, draft, prompts


def spec_split(tree: Path, build: Path, work: Path, threads: int, n_prompts: int = 6, n_predict: int = 64,
               draft_max: int = 7) -> dict:
    """Per speculative step: the draft's time (common_speculative's own clock) against the rest of
    the step (target verification, sampling, rollback), and the acceptance rate per draft position,
    on the tiny pair of the lossless proof."""
    target, draft, prompts = tiny_spec_pair(tree, build, work, n_prompts, n_predict)
    tot = run_speculative(build, target, draft, prompts, draft_max, n_predict, threads)
    per_step_draft = tot.draft_ms / tot.steps
    per_step_rest = (tot.decode_s * 1000.0 - tot.draft_ms) / tot.steps
    return {
        "pair": "tiny: kimi-k3 MKKMKK n_embd 128 vocab 128 target, bigram-biased MLA draft (proof.lossless)",
        "prompts": len(prompts), "n_predict": n_predict, "draft_max": draft_max, "steps": tot.steps,
        "drafted": tot.drafted, "accepted": tot.accepted, "mean_accept_len": round(1 + tot.accepted / tot.steps, 3),
        "draft_ms_per_step": round(per_step_draft, 2), "target_and_rest_ms_per_step": round(per_step_rest, 2),
        "draft_share": round(per_step_draft / (per_step_draft + per_step_rest), 3),
        "acceptance_per_position": tot.acceptance,
        "commands": {"spec_split": " ".join(map(str, tot.argv)) + "   (per prompt of proof.lossless.PROMPTS[:6])"},
    }


def spec(run: BenchRun) -> None:
    run.report["spec"] = spec_split(run.tree, run.build, run.out / "spec", run.threads)
    run.report["commands"].update(run.report["spec"].pop("commands", {}))
    log(f"spec: draft share {run.report['spec']['draft_share']}")
