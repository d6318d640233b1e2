"""The whole argument tree. Each verb lives in its own module, imported only when used.

A verb module exposes `configure(parser)` (adds its arguments) and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from llamacpp_mla_port import __version__
from llamacpp_mla_port.errors import PortError

#: verb -> (module, one-line help). Order is the order of `--help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "obtain": ("llamacpp_mla_port.commands.obtain",
               "fetch the pinned llama.cpp base into the tool-owned work tree (git or sdist)"),
    "patch": ("llamacpp_mla_port.commands.patch",
              "render templates/, export patches/ and apply the series on the work tree"),
    "check": ("llamacpp_mla_port.commands.check",
              "fail (and print the drift) when patches/ differ from a fresh render"),
    "build": ("llamacpp_mla_port.build",
              "CMake build of the patched tree (only the targets the job and proof need)"),
    "doctor": ("llamacpp_mla_port.doctor",
               "diagnose (and repair) a K3 DSpark draft GGUF from its header and metadata"),
    "fixtures": ("llamacpp_mla_port.fixtures.cli",
                 "write the tiny offline test models (checkpoints and GGUFs)"),
    "draft-logits": ("llamacpp_mla_port.proof.draft_logits",
                     "run the patched llama.cpp draft on given features and tokens, write .npy logits"),
    "target-features": ("llamacpp_mla_port.proof.target_features",
                        "dump the hidden states the patched Kimi-K3 target hands a draft"),
    "smoke": ("llamacpp_mla_port.proof.smoke",
              "build, make fixtures, run parity and lossless checks, print one JSON report"),
    "pr": ("llamacpp_mla_port.upstream_kit",
           "check each commit builds and lints, run the proof, write an evidence folder"),
    "rebase": ("llamacpp_mla_port.rebase",
               "re-render the series against a newer upstream and move the pin forward"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llamacpp-mla-port",
        description="Render, apply and prove the llama.cpp patch series for MLA DSpark drafts.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, description=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] not in COMMANDS:
        parser.parse_args(argv or ["--help"])
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    verb = argparse.ArgumentParser(prog=f"llamacpp-mla-port {name}", description=help_text)
    module.configure(verb)
    args = verb.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except PortError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
