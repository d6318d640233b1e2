"""`upstream-bench`: the evidence ggml maintainers read, for the PR stacks whose port.toml
table has a `bench` entry (upstreaming/upstream_bench.py): llama-bench and test-backend-ops
perf on the pinned base and on the stack, the same flags, compare-llama-bench.py tables.

    llamacpp-mla-port upstream-bench [--stack NAME] [--isa native,avx2] [-t 1,2] [-r 3] [--rounds 2]
                                     [--model-layers 4] [-j N]

Writes work/upstream-bench/<stack>/{native,avx2}.sqlite, report.json and report.md.
"""

from __future__ import annotations

import sys

from llamacpp_mla_port.commands.common import add_source_args, old_spelling, options, shared


def configure(parser) -> None:
    from llamacpp_mla_port.upstreaming.harness_diff import ISA_BUILDS
    from llamacpp_mla_port.upstreaming.upstream_bench import Settings

    add_source_args(parser)
    d = Settings()
    shared(parser, "--stack", help="only this stack (repeatable; default: every stack with a bench table)")
    shared(parser, "--isa", default=",".join(d.isas),
           help=f"builds, of {','.join(ISA_BUILDS)} (default: {','.join(d.isas)})")
    # llama-bench's own -t: a list of thread counts (--threads, in the other verbs one count, was its
    # long spelling: still read, hidden)
    parser.add_argument("-t", "--bench-threads", dest="threads", default=d.threads, metavar="N,M",
                        help=f"llama-bench -t: thread counts (default: {d.threads})")
    old_spelling(parser, "--threads", "--bench-threads", dest="threads")
    parser.add_argument("-r", "--reps", type=int, default=d.reps, help=f"llama-bench -r (default: {d.reps})")
    shared(parser, "--rounds", default=d.rounds,
           help=f"runs of each side, interleaved base/patched (default: {d.rounds})")
    parser.add_argument("--model-layers", dest="layers", type=int, default=d.n_layer, metavar="N",
                        help=f"layers of the standard-shape model (default: {d.n_layer})")
    # its old spelling (in target-features --layers names layers to dump), still read, hidden
    old_spelling(parser, "--layers", "--model-layers", dest="layers", type=int)
    shared(parser, "--jobs")


def settings_of(args):
    from llamacpp_mla_port.errors import BuildError
    from llamacpp_mla_port.upstreaming.harness_diff import ISA_BUILDS
    from llamacpp_mla_port.upstreaming.upstream_bench import Settings

    isas = tuple(s for s in args.isa.split(",") if s)
    if not isas or set(isas) - set(ISA_BUILDS):
        raise BuildError(f"--isa {args.isa}: unknown build", hint="of " + ", ".join(ISA_BUILDS))
    return Settings(isas=isas, threads=args.threads, reps=args.reps, rounds=args.rounds, n_layer=args.layers,
                    jobs=args.jobs)


def run(args, places) -> int:
    from llamacpp_mla_port.series import stacks
    from llamacpp_mla_port.series.spec import load_series
    from llamacpp_mla_port.source import obtain
    from llamacpp_mla_port.upstreaming import upstream_bench

    opts = options(args, places)
    pin = opts.pin()
    settings = settings_of(args)
    base = obtain.obtain(pin, opts.source, opts.git_url, opts.sdist_file)
    repo = obtain.cache_repo()
    series = load_series(places.templates_dir)
    chosen = [series.stack(n) for n in args.stacks] or [st for st in series.stacks if st.bench]
    missing = [st.name for st in chosen if st.bench is None]
    if missing:
        print(f"error: no [stacks.NAME.bench] table for {', '.join(missing)} in templates/port.toml", file=sys.stderr)
        return 1
    for st in chosen:
        rs = stacks.render_stack(repo, series, st, base.sha, pin.tag, {"pin": pin})
        report = upstream_bench.run_stack(repo, rs, base.sha, pin.short, places, settings, log=print)
        print(f"{st.name}: {places.upstream_bench_dir / st.name / 'report.md'} ({report['seconds']} s)")
    return 0
