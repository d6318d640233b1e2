"""The whole argument tree. Every verb is one module in commands/, imported only when used.

A verb module exposes `configure(parser)` (adds its arguments) and `run(args, places) -> int`;
it calls the module that does the work with the run's places (project.Places, built here once
from the verb's flags) and returns the exit code. One global option
comes before the verb: `--project DIR`, the checkout to act on (default: the one holding the
current directory, found upward like git; see project.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from llamacpp_mla_port import __version__, project
from llamacpp_mla_port.errors import PortError

#: verb -> one-line help, in the order of `--help`; the verb's module is commands/<verb>.py
#: (dashes become underscores), see module_of.
COMMANDS: dict[str, str] = {
    "obtain": "fetch the pinned llama.cpp base into the tool-owned work tree (git or sdist)",
    "patch": "render templates/, export patches/ and apply the series on the work tree",
    "check": "fail (and print the drift) when patches/ differ from a fresh render",
    "build": "CMake build of the patched tree (only the targets the job and proof need)",
    "doctor": "diagnose (and repair) a K3 DSpark draft GGUF from its header and metadata",
    "loader-table": "regenerate (or check) the doctor's table of what the loader requires",
    "fixtures": "write the tiny offline test models (checkpoints and GGUFs)",
    "draft-logits": "run the patched llama.cpp draft on given features and tokens, write .npy logits",
    "target-features": "dump the hidden states the patched Kimi-K3 target hands a draft",
    "parity": "the draft's logit-parity matrix against one build, with the per-mode threshold table",
    "smoke": "build, make fixtures, run parity and lossless checks, print one JSON report",
    "prove": "the proof, by the name that says what it does: the same verb as smoke",
    "bench": "the draft at Kimi-K3's real size against measured floors: work/bench/report.md",
    "draft-length": "what a draft buys over its target alone here, per draft length: the --spec-draft-n-max to use",
    "device-check": "the pair on a GPU: the offline bundle for a device machine (--dry-run: run it here, CUDA off)",
    "pr": "upstream kit: one folder per PR stack (patches, evidence, checklist), each commit built and linted",
    "rebase": "re-render the series against a newer upstream and move the pin forward",
    "harness-diff": "upstream's own tests on the base and patched, same flags: no case that passes on the base fails, no new case fails",
    "upstream-bench": "llama-bench and test-backend-ops perf, base against each PR stack: compare-llama-bench tables",
}


#: verbs that are another verb under a second name (the module of the first)
ALIASES = {"prove": "smoke"}


def module_of(verb: str) -> str:
    return "llamacpp_mla_port.commands." + ALIASES.get(verb, verb).replace("-", "_")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llamacpp-mla-port",
        description="Render, apply and prove the llama.cpp patch series for MLA DSpark drafts.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--project", metavar="DIR",
                        help="the project checkout to act on (default: found from the current "
                             f"directory upward; ${project.ENV_VAR} also sets it)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        sub.add_parser(name, help=help_text, description=help_text, add_help=False)
    return parser


def _split_global(argv: list[str]) -> tuple[str | None, list[str]]:
    """(--project value, the rest) for the options before the verb."""
    if argv and argv[0] == "--project" and len(argv) > 1:
        return argv[1], argv[2:]
    if argv and argv[0].startswith("--project="):
        return argv[0].split("=", 1)[1], argv[1:]
    return None, argv


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    project_dir, argv = _split_global(argv)
    if not argv or argv[0] not in COMMANDS:
        parser.parse_args(argv or ["--help"])
        return 2
    name, rest = argv[0], argv[1:]
    help_text = COMMANDS[name]
    module = importlib.import_module(module_of(name))
    verb = argparse.ArgumentParser(prog=f"llamacpp-mla-port {name}", description=help_text)
    module.configure(verb)
    args = verb.parse_args(rest)
    try:
        places = project.Places.of(vars(args), project_dir)    # its flags > env > the checkout
        if project_dir is not None:
            places.root                    # a wrong --project is refused before the verb runs
        return int(module.run(args, places) or 0)
    except PortError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
