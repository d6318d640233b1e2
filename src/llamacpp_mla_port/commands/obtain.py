"""`obtain`: the pinned base in the tool-owned work tree, nothing applied yet."""

from llamacpp_mla_port.commands.common import add_source_args, options
from llamacpp_mla_port.series import pipeline


def configure(parser):
    add_source_args(parser)


def run(args, places) -> int:
    ws, repo, pin, base = pipeline.prepare(options(args, places))
    print(f"base {pin.tag} {pin.commit or 'tree ' + pin.tree} ({base.source}, tree {base.tree[:12]}) in {ws.tree}")
    return 0
