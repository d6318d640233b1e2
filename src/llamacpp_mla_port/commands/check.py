"""`check`: exit 1 and print the drift when patches/ differ from a fresh render."""

import sys

from llamacpp_mla_port.commands.common import add_source_args, options
from llamacpp_mla_port.series import pipeline


def configure(parser):
    add_source_args(parser)
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="colour the drift diff (pygments)")


def run(args, places) -> int:
    diff = pipeline.check(options(args, places))
    if not diff:
        print("patches/ match a fresh render")
        return 0
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    if color:
        from pygments import highlight
        from pygments.formatters import TerminalFormatter
        from pygments.lexers import DiffLexer
        diff = highlight(diff, DiffLexer(), TerminalFormatter())
    sys.stdout.write(diff)
    print("error: patches/ drifted from templates/: run `make patch` and commit patches/", file=sys.stderr)
    return 1
