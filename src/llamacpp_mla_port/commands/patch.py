"""`patch`: render templates/, export patches/, apply the series with `git am -3`."""

from llamacpp_mla_port.commands.common import add_source_args, options
from llamacpp_mla_port.series import pipeline


def configure(parser):
    add_source_args(parser)


def run(args, places) -> int:
    pipeline.patch(options(args, places))
    return 0
