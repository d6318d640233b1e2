"""The exported series' index (patches/README.md): which template folder each patch is rendered
from, and its PR stack; written by every export, so it never drifts from the folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamacpp_mla_port.errors import SeriesError
from llamacpp_mla_port.series import gitseries
from llamacpp_mla_port.series.spec import load_series

REPO = Path(__file__).resolve().parents[2]
TEMPLATES_DIR, PATCHES_DIR = REPO / "templates", REPO / "patches"


def test_the_checked_in_index_maps_each_patch_to_its_folder_and_stack():
    series = load_series(TEMPLATES_DIR)
    names = (PATCHES_DIR / gitseries.SERIES).read_text().split()
    slugs = [c.slug for c in series.commits]
    text = (PATCHES_DIR / gitseries.INDEX).read_text()
    assert text == gitseries.index_text(series, names, slugs), "patches/README.md is stale: run `make patch`"
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| 0")]
    assert [(r[0][2:], r[1]) for r in rows] == list(zip(names, slugs))
    # each patch number is its folder's place in name order, and each stack its commit.toml's
    assert [int(r[0][2:6]) for r in rows] == list(range(1, len(slugs) + 1))
    assert [r[2].rstrip(" |") for r in rows] == [c.stack for c in series.commits]
    # controls: a swapped pair of folders reads differently; a count that does not match is refused
    swapped = [slugs[1], slugs[0], *slugs[2:]]
    assert gitseries.index_text(series, names, swapped) != text
    with pytest.raises(SeriesError, match=rf"wrote {len(names)} patches for {len(names) - 1} commits"):
        gitseries.index_text(series, names, slugs[:-1])
