"""The tiled flash-attention path's chunks of query rows (series commit `ggml-cpu : tile flash
attention over heads that share a K/V head`): never fewer chunks than threads while there are
rows to split, whole Q tiles where that still leaves a chunk per thread.

The helper is `static` in the patched tree's ggml/src/ggml-cpu/ops.cpp (no other file needs it), so
the test takes its definition out of that file as the tree has it, compiles it into a small
program with ggml-cpu's headers, and asks it for the rows per chunk; the chunk count follows as
ops.cpp derives it. The untiled split it starts from is ops.cpp's: 4 chunks per thread,
dr = ceil(nr / (4 nth)). A count, not a timing: the same on every machine.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.build

PROGRAM = r"""
#include "common.h"
#include <cstdio>
#include <cstdlib>
@HELPER@
int main(int argc, char ** argv) {
    for (int i = 1; i + 2 < argc; i += 3) {
        const int64_t nr = atoll(argv[i]), dr = atoll(argv[i + 1]), nth = atoll(argv[i + 2]);
        printf("%lld\n", (long long) ggml_fa_tiled_chunk_rows(nr, dr, nth));
    }
    return 0;
}
"""

TILE = 64   # GGML_FA_TILE_Q
HELPER = "ggml_fa_tiled_chunk_rows"
#: the helper's definition in ops.cpp: its signature line through the first closing brace at column 0
DEFINITION = re.compile(r"^static int64_t " + HELPER + r"\(.*?^\}\n", re.M | re.S)


def helper_source(ops_cpp: str) -> str:
    """The definition of the helper in ops.cpp's text, exactly once."""
    found = DEFINITION.findall(ops_cpp)
    assert len(found) == 1, f"{HELPER}: {len(found)} definitions in ops.cpp (want 1)"
    return found[0]


@pytest.fixture(scope="module")
def chunk_rows(patched_tree, tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.fail("no C++ compiler on PATH (the build needs one too)")
    d = tmp_path_factory.mktemp("fa-chunks")
    src = d / "fa_chunks.cpp"
    tree = Path(patched_tree)
    src.write_text(PROGRAM.replace("@HELPER@", helper_source((tree / "ggml/src/ggml-cpu/ops.cpp").read_text())))
    exe = d / "fa_chunks"
    inc = [f"-I{tree / p}" for p in ("ggml/include", "ggml/src", "ggml/src/ggml-cpu")]
    proc = subprocess.run([cxx, "-std=c++17", "-O1", *inc, str(src), "-o", str(exe)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    def rows(nr: int, nth: int) -> int:
        dr = math.ceil(nr / (4 * nth))           # ops.cpp's untiled split: 4 chunks per thread
        out = subprocess.run([str(exe), str(nr), str(dr), str(nth)], capture_output=True, text=True,
                             timeout=60, check=True)
        return int(out.stdout.split()[0])
    return rows


def _chunks(nr: int, dr: int) -> int:
    return math.ceil(nr / dr)


@pytest.mark.parametrize("rows,heads", [(7, 64), (8, 128), (2, 64), (16, 64)],
                         ids=["draft-block-7x64", "verify-8x128", "2x64", "16x64"])
@pytest.mark.parametrize("nth", [16, 64])
def test_every_thread_gets_a_chunk(chunk_rows, rows, heads, nth):
    nr = rows * heads
    dr = chunk_rows(nr, nth)
    assert _chunks(nr, dr) == min(nth, nr), (nr, nth, dr)


@pytest.mark.parametrize("nr,nth", [(448, 2), (448, 4), (1024, 8), (4096, 16)])
def test_whole_tiles_where_they_leave_a_chunk_per_thread(chunk_rows, nr, nth):
    dr = chunk_rows(nr, nth)
    assert dr % TILE == 0 and _chunks(nr, dr) >= nth, (nr, nth, dr)


def test_control_whole_tiles_alone_starve_threads():
    """What the padding alone gave (the shipped rule before the floor): 7 chunks for 16 threads."""
    nr, nth = 448, 16
    dr = math.ceil(math.ceil(nr / (4 * nth)) / TILE) * TILE
    assert _chunks(nr, dr) == 7 < nth


def test_the_helper_is_taken_from_ops_cpp_alone(patched_tree):
    """The helper is ops.cpp's own (static, defined once there), in no header that every ggml-cpu
    file includes; the extraction finds exactly its body, so an edit to it reaches the test."""
    tree = Path(patched_tree) / "ggml/src/ggml-cpu"
    src = helper_source((tree / "ops.cpp").read_text())
    assert src.startswith(f"static int64_t {HELPER}(") and src.rstrip().endswith("}")
    assert src.count("return") == 1 and "GGML_PAD" in src
    headers = [p.name for p in tree.rglob("*.h") if HELPER in p.read_text(errors="replace")]
    assert headers == [], headers
    with pytest.raises(AssertionError, match="0 definitions"):          # the control: a file without it
        helper_source("static int64_t other(int64_t x) {\n    return x;\n}\n")
