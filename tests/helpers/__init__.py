"""What the tests share: the checkout they run in and its places."""

from __future__ import annotations

from pathlib import Path

from llamacpp_mla_port import project

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
PIN_FILE = TEMPLATES / "pin.toml"


def run_places(**flags) -> project.Places:
    """The places a verb run from here gets (found from the cwd / $MLA_PORT_PROJECT, as
    cli.main does), with these place flags on top."""
    return project.Places().with_flags(**flags)
