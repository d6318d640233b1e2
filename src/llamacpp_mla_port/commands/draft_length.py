"""`draft-length`: what a DSpark draft buys over its target alone on this machine, per draft length
(the work is bench/draft_length.py).

    llamacpp-mla-port draft-length --target TARGET.gguf --draft DRAFT.gguf [--prompts FILE] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from llamacpp_mla_port.bench.draft_length import advice, Settings, measure_pair
from llamacpp_mla_port.commands.common import add_tree_args, shared
from llamacpp_mla_port.errors import PortError

DESCRIPTION = """\
Measures, on this machine with these two files, what a draft of length k = 1..7 buys over the
target alone, and prints the table and the --spec-draft-n-max to use.

What it measures (medians over process rounds A B ... B A, each timing side by side):
  T(N)        one verify step of the target for N = 1..8 tokens (logits for all) over --depth cached
              tokens, as llama.cpp's speculative decoding sets the target up for a draft (rollback
              snapshots of recurrent/KDA layers, the draft's taps extracted), each block then rolled
              back whole; and T(1) of the target alone (no snapshots). The cache and the verified
              blocks are the prompts' text when --prompts is given (real routing), else random token ids
  experts     for MoE targets: the distinct experts one verify step reads per layer, beside the bounds
              of identical routing (top-k) and independent routing (random ids route near the latter)
  T_draft(k)  the draft's block of k tokens over 512 cached rows, plus the injection of the accepted
              tokens' target rows (measured at 1 and 8 rows)
  acceptance  with --prompts: greedy llama-speculative-simple at draft length 7 on each prompt (one per
              line), the share of steps accepting positions 1..i; without: the published curves for
              Inferact/Kimi-K3-DSpark, each with its source

What it assumes: greedy decoding, one sequence, the CPU (the builds' defaults, flash attention on);
speedup(k) = E[tokens per step](k) x T(1) / (T_draft(k) + T(k+1) + rollback), E from the
acceptance per position (1 + the sum of the cumulative per-position rates over the first k). The
break-even is the tokens per step (and the one per-position rate) at which the pair only matches
the target alone. Numbers are this machine's: other jobs running meanwhile make them noisy (the
report gives the CPU share the timed passes got).
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    shared(parser, "--target", required=True, help="the target model (GGUF)")
    shared(parser, "--draft", required=True, help="its DSpark draft (GGUF)")
    parser.add_argument("--prompts", type=Path, default=None, metavar="FILE",
                        help="prompts, one per line, for the acceptance (default: the published curves)")
    shared(parser, "--out", default=None,
           help="report folder (default: <work dir>/draft-length): report.md, report.json, plots/")
    shared(parser, "--threads", default=None, help="threads for every pass (default: all cores)")
    parser.add_argument("--depth", type=int, default=1024, help="tokens in the target's cache (default 1024)")
    shared(parser, "--rounds", help="process rounds, A B ... B A (default 2)")
    shared(parser, "--repeats", help="timed passes per N and per draft block inside one process (default 3)")
    parser.add_argument("--min-seconds", type=float, default=2.0,
                        help="each draft block repeats until its timed runs add up to this (default 2)")
    parser.add_argument("--n-predict", type=int, default=64, help="tokens generated per prompt (default 64)")
    add_tree_args(parser)


def _prompts(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    if not path.is_file():
        raise PortError(f"--prompts {path}: no such file", hint="one prompt per line")
    prompts = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    if not prompts:
        raise PortError(f"--prompts {path} holds no prompt", hint="one prompt per line")
    return prompts


def run(args: argparse.Namespace, places) -> int:
    if args.depth < 1 or args.rounds < 1 or args.repeats < 1 or args.min_seconds < 0 or args.n_predict < 8:
        raise PortError("--depth, --rounds and --repeats must be >= 1, --min-seconds >= 0, --n-predict >= 8")
    prompts = _prompts(args.prompts)
    tree, build = places.build.require_tree().tree, places.build.dir
    out = args.out or places.draft_length_dir
    st = Settings(threads=args.threads or max(1, os.cpu_count() or 1), depth=args.depth, rounds=args.rounds,
                  verify_rounds=args.repeats, draft_repeats=args.repeats, draft_min_seconds=args.min_seconds,
                  n_predict=args.n_predict)
    rep = measure_pair(tree, build, args.target, args.draft, out, st, prompts)
    print("\n".join(rep["verify_rows"] + [""] + rep["table_md"] + advice(rep)))
    print(f"report: {Path(out) / 'report.md'}")
    return 0
