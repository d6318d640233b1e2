"""Golden files (as b4's `samples/`): a human-readable output pinned byte for byte.

`assert_golden(name, text)` compares `text` with tests/golden/<name>. On a mismatch the
failure shows a unified diff and how to regenerate the file: run pytest with
`--update-golden` (tests/conftest.py) or with MLA_PORT_UPDATE_GOLDEN=1. An update rewrites
the file and still fails the test, naming the file, so an update is never silent (in CI
neither: there a missing golden file fails like a changed one). Review the diff
(`git diff tests/golden`), then rerun without the option.

The texts must be deterministic: no timestamps, no temporary paths (`scrub` replaces them
with a placeholder before the comparison).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path, PurePosixPath

import pytest

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
ENV_VAR = "MLA_PORT_UPDATE_GOLDEN"
#: set from `--update-golden` by tests/conftest.py (pytest_configure)
UPDATE = False
HOW_TO_UPDATE = (f"if the change is intended, regenerate with `pytest --update-golden` (or {ENV_VAR}=1), "
                 "review `git diff tests/golden` and commit it")


def updating() -> bool:
    return UPDATE or os.environ.get(ENV_VAR, "") not in ("", "0")


def golden_path(name: str) -> Path:
    rel = PurePosixPath(name)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ValueError(f"golden file name {name!r}: a relative path below tests/golden")
    return GOLDEN_DIR.joinpath(*rel.parts)


def scrub(text: str, places: dict[str | Path, str]) -> str:
    """`text` with every path of `places` (and its resolved form) replaced by its placeholder,
    e.g. {tmp_path: "<tmp>"}; the longest paths first."""
    pairs: dict[str, str] = {}
    for path, placeholder in places.items():
        for form in {str(path), str(Path(path).resolve())}:
            pairs[form] = placeholder
    for form in sorted(pairs, key=len, reverse=True):
        text = text.replace(form, pairs[form])
    return text


def _lines(text: str) -> list[str]:
    """Lines for the diff, each ending in a newline; a last line without one is marked as
    git marks it, and carriage returns are shown, so a byte-only difference is visible."""
    out = []
    for line in text.splitlines(keepends=True):
        body = line[:-1] if line.endswith("\n") else line
        body = body.replace("\r", "\\r")
        out.append(body + "\n" if line.endswith("\n") else body + "\n\\ No newline at end of file\n")
    return out


def diff(expected: str, actual: str, name: str) -> str:
    return "".join(difflib.unified_diff(_lines(expected), _lines(actual),
                                        fromfile=f"tests/golden/{name}", tofile=f"{name} (this run)"))


def assert_golden(name: str, text: str) -> None:
    """`text` must equal tests/golden/<name> byte for byte (UTF-8)."""
    path = golden_path(name)
    data = text.encode("utf-8")
    old = path.read_bytes() if path.is_file() else None
    if old == data:
        return
    if updating():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        what = "created" if old is None else "updated"
        pytest.fail(f"golden file tests/golden/{name} {what} ({ENV_VAR} / --update-golden): review "
                    "`git diff tests/golden`, then rerun without updating", pytrace=False)
    if old is None:
        raise AssertionError(f"golden file tests/golden/{name} is missing: create it with "
                             f"`pytest --update-golden` (or {ENV_VAR}=1), review it and commit it")
    expected = old.decode("utf-8", errors="replace")
    raise AssertionError(f"the output differs from tests/golden/{name}:\n{diff(expected, text, name)}"
                         f"{HOW_TO_UPDATE}")
