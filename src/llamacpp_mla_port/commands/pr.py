"""`pr` (make pr): one folder per pull request (work/pr/<stack>/: patches, squashed patch,
evidence, description skeleton, checklist), per-commit build and lint checks, the proof.

Nothing is pushed and no PR description is written; the work is upstreaming/pr.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llamacpp_mla_port.commands.common import PROOF_FLAGS, add_tree_args, old_spelling, parse_proof_args, shared
from llamacpp_mla_port.project import Places
from llamacpp_mla_port.upstreaming.pr import PR_TARGETS, PrOptions, make_pr


def configure(parser: argparse.ArgumentParser) -> None:
    add_tree_args(parser, tree=False, build=False)
    shared(parser, "--patches-dir")
    shared(parser, "--templates-dir")
    parser.add_argument("--evidence", type=Path, metavar="DIR",
                        help="where the evidence folder goes (default: <work-dir>/evidence)")
    # not the work build (the proof runs on that): the per-commit builds' own dir; it was
    # spelled --build-dir, which in every other verb is the work build
    parser.add_argument("--commit-build-dir", dest="pr_build_dir", type=Path, metavar="DIR",
                        help="build dir of the per-commit builds (default: <work-dir>/pr/build)")
    old_spelling(parser, "--build-dir", "--commit-build-dir", dest="pr_build_dir", type=Path)
    shared(parser, "--cmake-target", help=f"target every commit must build (repeatable; default: "
                                          f"{' '.join(PR_TARGETS)})")
    shared(parser, "--jobs")
    parser.add_argument("--skip-build", action="store_true",
                        help="lint only: do not build each commit (the evidence says so)")
    parser.add_argument("--skip-smoke", action="store_true", help="do not run the proof (the evidence says so)")
    parser.add_argument("--skip-evidence", action="store_true",
                        help="do not run the stacks' evidence commands (EVIDENCE.md says so)")
    parser.add_argument("--skip-upstream-checks", action="store_true",
                        help="do not run ty, the model-naming and the pre-tokenizer checks "
                             "on the base and on each stack")
    parser.add_argument("--skip-harness-diff", action="store_true",
                        help="do not run upstream's tests on the base and on each stack (harness-diff; "
                             "a stack's report of the same commits is reused)")
    parser.add_argument("--skip-upstream-bench", action="store_true",
                        help="do not run llama-bench / test-backend-ops perf on the base and on the stacks "
                             "with a bench table (upstream-bench; a report of the same commits is reused)")
    shared(parser, "--stack")
    parser.add_argument("--smoke-arg", dest="smoke_args", action="append", default=[],
                        metavar="ARG", help="a setting of the proof as `smoke` spells it: "
                                            f"{', '.join(PROOF_FLAGS)}=N (e.g. --smoke-arg=--quick)")


def run(args: argparse.Namespace, places: Places) -> int:
    opts = PrOptions(places, evidence=args.evidence,
                     build_dir=args.pr_build_dir, targets=tuple(args.targets or PR_TARGETS),
                     jobs=args.jobs, skip_build=args.skip_build, skip_smoke=args.skip_smoke,
                     proof_settings=parse_proof_args(args.smoke_args), skip_evidence=args.skip_evidence,
                     stacks=tuple(args.stacks), upstream_checks=not args.skip_upstream_checks,
                     harness_diff=not args.skip_harness_diff, upstream_bench=not args.skip_upstream_bench)
    result = make_pr(opts)
    for c in result["commits"]:
        print(f"{c['sha'][:12]} {'ok    ' if c['ok'] else 'FAILED'} {c['title']}")
        if c["build_ok"] is False:
            print("    build: " + c["build_error"].splitlines()[0])
        for w in c["warnings"]:
            print(f"    warning (touched file): {w}")
        for f in c["findings"]:
            print(f"    {f['check']}: {f['file']}:{f['line'] or ''}: {f['code']} {f['message']}")
    for k, v in result["checks"].items():
        if k != "build_note":
            print(f"{k:14} {'skipped' if v is None else 'ok' if v else 'FAILED'}")
    for name, st in result["stacks"].items():
        bad = [k for k, v in st["checks"].items() if v is False]
        print(f"PR {name:<12} {'ok    ' if st['ok'] else 'FAILED'} {len(st['commits'])} commits, "
              f"+{st['added']}/-{st['removed']}: {st['folder']}"
              + (f" (failing: {', '.join(bad)})" if bad else ""))
    print(f"evidence: {result['evidence']} (CHECKLIST.md is for you to complete; nothing was "
          "pushed and no PR description was written)")
    return 0 if result["ok"] else 1
