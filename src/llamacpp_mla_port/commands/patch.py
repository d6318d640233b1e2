"""`patch`: render templates/, export patches/, apply the series with `git am -3`."""

from llamacpp_mla_port import engine
from llamacpp_mla_port.commands.common import add_source_args, options


def configure(parser):
    add_source_args(parser)


def run(args) -> int:
    engine.patch(options(args))
    return 0
