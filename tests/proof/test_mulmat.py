"""ggml-cpu's MUL_MAT against a float64 product (proof/run/cpp/mulmat-check.cpp), on the weight
shapes the real-size draft multiplies (Kimi-K3 width: K kept, rows reduced) and on awkward ones:
N = 1..17 (column counts off the tile take the series' tinyBLAS_Q0 tail, `ggml-cpu : read Q0
weights once for a partial column tile`; N = 1 takes vec_dot, as upstream's #9330 keeps it),
rows off the 4-row tile, strided per-head activations.

Bound, from the accumulation order: |y - y64| <= gamma_n * sum_k |w_k x_k|, u = 2^-24; Q8_0 in
ggml_vec_dot_q8_0_q8_0's block order (which tinyBLAS_Q0_AVX keeps) n = K/32 + 3, any other
order n = K + 1. Where the build has AVX2, FMA and F16C (its compiled features, not the CPU's;
with or without AVX-512: tinyBLAS_Q0_AVX's tiles are 256-bit on both), every
Q8_0 output must also equal that block order bit for bit: an output a tile skipped or computed
twice fails there; and, vec_dot and the tiles sharing that order, every Q8_0 column must equal
the same column multiplied alone (N = 1). Controls: a reference with a perturbed
weight row breaks the bound; one flipped weight bit in the N = 1 products breaks the bit
comparison."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from llamacpp_mla_port.proof.run.programs import compile_program, ggml_cpu_features

pytestmark = pytest.mark.build

#: name -> (K, M, heads): the draft's weight shapes at 7168 width (K kept, M reduced)
DRAFT_SHAPES = {
    "lm_head": (7168, 260, 1),       # 163840 rows in the draft
    "ffn_gate_up": (7168, 132, 1),   # 14336
    "ffn_down": (14336, 68, 1),      # 7168
    "attn_output": (8192, 68, 1),    # 7168
    "q_b": (1536, 196, 1),           # 12288
    "kv_a": (7168, 36, 1),           # 576
    "k_b": (128, 30, 4),             # 512 rows x 64 heads, strided (permuted) activation
    "v_b": (512, 34, 4),             # 128 rows x 64 heads, strided (permuted) activation
}


@pytest.fixture(scope="module")
def mulmat_check(patched_tree, llama_build) -> Path:
    return compile_program("mulmat-check", patched_tree, llama_build)


@pytest.fixture(scope="module")
def q8_order(patched_tree, llama_build) -> bool:
    """Whether this build's ggml-cpu has AVX2, FMA and F16C (its compiled features): there
    Q8_0 outputs must equal the block order bit for bit, at every column count."""
    f = ggml_cpu_features(patched_tree, llama_build)
    return bool(f["avx2"] and f["fma"] and f["f16c"])


def _run(exe: Path, typ: str, k: int, m: int, n: int, heads: int = 1, *, kernel: bool, perturb: bool = False,
         seed: int = 1, perturb_n1: bool = False) -> dict:
    cmd = [str(exe), "--type", typ, "--k", str(k), "--m", str(m), "--n", str(n), "--heads", str(heads),
           "--threads", "2", "--seed", str(seed), "--bound", "kernel" if kernel else "any"]
    cmd += ["--perturb"] if perturb else []
    cmd += ["--perturb-n1"] if perturb_n1 else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _check(exe: Path, q8_order: bool, typ: str, k: int, m: int, n: int, heads: int = 1, seed: int = 1) -> None:
    order = typ == "q8_0" and q8_order
    res = _run(exe, typ, k, m, n, heads, kernel=order, seed=seed)
    print(json.dumps(res))
    assert res["max_ratio"] <= 1.0, f"error above the derived bound: {res}"
    if order:
        assert res["order_mismatch"] == 0, f"outputs not in the block order (skipped or wrong tiles?): {res}"
    if order and heads == 1:
        assert res["n1_mismatch"] == 0, f"a column's result depends on the column count: {res}"


@pytest.mark.parametrize("typ", ["bf16", "f16", "q8_0"])
@pytest.mark.parametrize("shape", sorted(DRAFT_SHAPES))
def test_mulmat_draft_shapes(mulmat_check, q8_order, typ, shape):
    """The draft's shapes at N = 1, 2, 7, 16 and 17."""
    k, m, heads = DRAFT_SHAPES[shape]
    for n in (1, 2, 7, 16, 17):
        _check(mulmat_check, q8_order, typ, k, m, n, heads)


@pytest.mark.parametrize("typ", ["bf16", "f16", "q8_0"])
def test_mulmat_every_n(mulmat_check, q8_order, typ):
    """N = 1..17 with an odd row count: every column count and the rows off the 4-row tile."""
    k, m = (1000 + 13, 37) if typ != "q8_0" else (1024 + 32, 37)
    for n in range(1, 18):
        _check(mulmat_check, q8_order, typ, k, m, n, seed=n)


@pytest.mark.parametrize("typ", ["bf16", "f16", "q8_0"])
def test_mulmat_control_n1_flipped_bit_fails(mulmat_check, typ):
    """The column-count comparison can fail: a flipped weight bit in the N = 1 products."""
    res = _run(mulmat_check, typ, 7168, 20, 7, kernel=False, perturb_n1=True)
    print(json.dumps(res))
    assert res["n1_mismatch"] > 0, res


def test_mulmat_q8_0_few_rows(mulmat_check, q8_order):
    """Fewer 4-row tiles than threads, and a single tile: the tail's row partition."""
    for m in (3, 4, 5, 8, 9):
        for n in (3, 7):
            _check(mulmat_check, q8_order, "q8_0", 7168, m, n)


@pytest.mark.parametrize("typ", ["bf16", "f16", "q8_0"])
def test_mulmat_control_perturbed_weight_fails(mulmat_check, typ):
    """The check can fail: a reference with one row's first 32 weights negated breaks the bound."""
    res = _run(mulmat_check, typ, 7168, 20, 7, kernel=False, perturb=True)
    print(json.dumps(res))
    assert res["max_ratio"] > 1.0, res


def test_mulmat_q8_0_block_order_at_the_draft_block(mulmat_check, q8_order, patched_tree, llama_build):
    """The 7-token block's product in the block order, bit for bit, and each of its columns
    equal to that column alone; says so where it cannot run."""
    if not q8_order:
        features = ggml_cpu_features(patched_tree, llama_build)
        pytest.skip(f"this build's ggml-cpu lacks AVX2, FMA or F16C ({features}): the Q8_0 "
                    "block-order and column-count checks did NOT run here; the float64 bounds did")
    res = _run(mulmat_check, "q8_0", 7168, 64, 7, kernel=True)
    print(json.dumps(res))
    assert res["order_mismatch"] == 0 and res["n1_mismatch"] == 0 and res["max_ratio"] <= 1.0, res


def test_mulmat_q8_0_column_blocks(mulmat_check, q8_order):
    """Activations over several column blocks (`ggml-cpu : tinyBLAS_Q0_AVX over column blocks of
    cached activations`, its block size from the series' own variable): a last block with a
    partial tile (250) and with whole ones (256), three blocks each, rows off the 4-row tile."""
    from llamacpp_mla_port.series.spec import load_series
    from tests.helpers import TEMPLATES

    [commit] = [c for c in load_series(TEMPLATES).commits if c.stack == "cpu-q0-column-blocks"]
    block_bytes = commit.vars["q0_column_block_mib"] * 2**20
    columns = max(4, block_bytes // (32768 // 32 * 34) // 4 * 4)     # Q8_0: 34 bytes per 32 values
    assert 2 * columns < 250 <= 3 * columns and 250 % columns % 4 != 0 and 256 % columns % 4 == 0, columns
    for n in (250, 256):
        _check(mulmat_check, q8_order, "q8_0", 32768, 9, n, seed=n)
