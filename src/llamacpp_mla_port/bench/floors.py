"""Floors for the draft's two passes: what they must read and compute, and what this machine allows.

`pass_work(draft_gguf, target_gguf, ...)` counts, from the GGUF tensor tables alone, the bytes of
weights a pass reads (in the files' own types: BF16, Q8_0, ...) and its FLOPs:

  block of B tokens over C cached rows: every per-layer tensor, final norm, markov_w2, the
  confidence projection and the target's lm_head, read once; B rows of the token table and
  of markov_w1; the cache rows (C + B) x (kv_lora + rope) per layer. FLOPs 2 x B x (weights
  of the matmuls) + the absorbed attention (q_nope . k_b, scores over C + B rows in the
  576-wide latent, probabilities . latent, v_b).
  injection of N rows: context_proj, the context norm, per layer kv_a_mqa and its norm;
  N cache rows written. FLOPs 2 x N x (context_proj + kv_a_mqa weights).

`measure(build, tree, ...)` runs the ggml-floor program (proof/run/cpp/ggml-floor.cpp): the read
bandwidth of this machine with the benchmark's threads, and the MUL_MAT rate ggml reaches for
each weight matrix of the draft, at its own shape [K, M] (M capped at 16384 rows: the lm_head
is measured on a 16384-row slice of itself), type and buffer type (the one llama.cpp's loader
picks), with N = 64 and 512 activation columns (compute bound; the faster of the two).

`floor_seconds(work, measured)`: max(bytes / bandwidth, sum over matmuls of FLOPs / the rate
measured for that matrix's shape); the attention's own FLOPs count at the best measured rate.

`pass_entry(work, floor, seconds, ...)`: a pass's timed runs against that floor, best run and
paired with the bandwidth read before each run.
"""

from __future__ import annotations

import functools
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llamacpp_mla_port.errors import ProcessError, ProofError
from llamacpp_mla_port.gguf import contract

if TYPE_CHECKING:
    from llamacpp_mla_port.gguf.header import TensorInfo

#: per-layer draft tensors the block reads whole (GGUF names after blk.N.)
BLOCK_LAYER_TENSORS = ("attn_norm", "attn_q_a", "attn_q_a_norm", "attn_q_b", "attn_kv_a_mqa", "attn_kv_a_norm",
                       "attn_k_b", "attn_v_b", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
#: the weight matmuls of the block, per layer (k_b / v_b are the absorbed attention's, counted there)
BLOCK_MATMULS = ("attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
INJECT_LAYER_TENSORS = ("attn_kv_a_mqa", "attn_kv_a_norm")

#: GEMM shapes measured for the compute floor: every weight shape of the passes, rows capped
#: at GEMM_M_MAX (the 163840-row lm_head is measured on a slice of itself), N columns
GEMM_M_MAX = 16384
GEMM_N = 512
#: the compute floor's rate is the best of these column counts: a pass of 64 rows ran faster
#: than the 512-column rate on this EPYC (Q8_0 injection of 64 rows at 0.68x of that floor)
COMPUTE_NS = (64, GEMM_N)
#: MiB of every bandwidth read (bandwidth.h): far above any CPU's last-level cache per core
#: complex, and on this EPYC 512 MiB reads ran faster than 2 GiB ones (the floor takes the best)
BW_MIB = 512
#: bytes per weight as stored, per GGUF type of the measured products
WEIGHT_BYTES = {"bf16": 2.0, "f16": 2.0, "f32": 4.0, "q8_0": 34 / 32}


@functools.lru_cache(maxsize=8)
def _read(path: str) -> tuple[dict, dict]:
    """(tensor table, metadata) of a GGUF file, from the project's bounded header reader
    (gguf.GGUFReader takes a minute over a 163840-entry vocabulary on a busy machine)."""
    from llamacpp_mla_port.gguf.header import read_header
    h = read_header(path)
    return h.tensors, {k: kv.value for k, kv in h.kvs.items()}


def tensor_table(path: Path) -> dict[str, TensorInfo]:
    return _read(str(Path(path).resolve()))[0]


def _meta(path: Path, key: str):
    meta = _read(str(Path(path).resolve()))[1]
    if key not in meta:
        raise ProofError(f"{path}: no {key}")
    return meta[key]


@dataclass
class PassWork:
    """What one pass reads and computes."""

    name: str
    bytes_weights: int
    bytes_cache: int
    matmuls: list[tuple[str, str, int, int, int]] = field(default_factory=list)   # (tensor, type, K, M, FLOPs)
    attention_flops: int = 0

    @property
    def bytes_total(self) -> int:
        return self.bytes_weights + self.bytes_cache

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.attention_flops

    @property
    def matmul_flops(self) -> int:
        return sum(m[4] for m in self.matmuls)

    def as_dict(self) -> dict:
        return {"bytes_weights": self.bytes_weights, "bytes_cache": self.bytes_cache, "flops": self.flops,
                "matmul_flops": self.matmul_flops, "attention_flops": self.attention_flops}


def _mm(ti: TensorInfo, n: int) -> tuple[str, str, int, int, int]:
    """A weight matmul over n activation columns: (name, type, K = ne0, M = rows, FLOPs)."""
    return (ti.name, ti.type_name.lower(), ti.shape[0], ti.n_elements // ti.shape[0], 2 * n * ti.n_elements)


def row_bytes(t: TensorInfo, rows: int) -> int:
    return t.n_bytes // (t.n_elements // t.shape[0]) * rows


def block_work(draft: Path, target: Path, n_block: int = 7, n_ctx: int = 512, cache_bytes_per_value: float = 2.0,
               tables=None) -> PassWork:
    d, t = tables or (tensor_table(draft), tensor_table(target))
    arch = contract.ARCH
    n_layer = int(_meta(draft, f"{arch}.block_count"))
    n_head = int(_meta(draft, f"{arch}.attention.head_count"))
    kv_width = int(_meta(draft, f"{arch}.attention.key_length"))           # kv_lora + rope
    lora = int(_meta(draft, f"{arch}.attention.kv_lora_rank"))
    w = PassWork(f"block B={n_block} C={n_ctx}", 0, 0)
    for il in range(n_layer):
        for sub in BLOCK_LAYER_TENSORS:
            w.bytes_weights += d[f"blk.{il}.{sub}.weight"].n_bytes
        for sub in BLOCK_MATMULS:
            ti = d[f"blk.{il}.{sub}.weight"]
            w.matmuls.append(_mm(ti, n_block))
        k_b, v_b = d[f"blk.{il}.attn_k_b.weight"], d[f"blk.{il}.attn_v_b.weight"]
        rows = n_ctx + n_block
        w.attention_flops += 2 * n_block * (k_b.n_elements + v_b.n_elements)       # absorb q_nope, decompress out
        w.attention_flops += 2 * n_block * n_head * rows * (kv_width + lora)       # scores, probs . latent
    for name in ("output_norm.weight", "markov_w2.weight", "conf_proj.weight", "conf_proj.bias"):
        if name in d:
            w.bytes_weights += d[name].n_bytes
    if "markov_w2.weight" in d:
        ti = d["markov_w2.weight"]
        w.matmuls.append(_mm(ti, n_block))
        w.bytes_weights += row_bytes(d["markov_w1.weight"], n_block)
    head = d.get("output.weight") or t["output.weight"]
    w.bytes_weights += head.n_bytes
    w.matmuls.append(_mm(head, n_block))
    w.bytes_weights += row_bytes(d.get("token_embd.weight") or t["token_embd.weight"], n_block)
    w.bytes_cache = int(n_layer * (n_ctx + 2 * n_block) * kv_width * cache_bytes_per_value)
    return w


def inject_work(draft: Path, n_rows: int, cache_bytes_per_value: float = 2.0, table=None) -> PassWork:
    d = table or tensor_table(draft)
    n_layer = int(_meta(draft, "dflash.block_count"))
    kv_width = int(_meta(draft, "dflash.attention.key_length"))
    w = PassWork(f"inject N={n_rows}", 0, 0)
    for name in ("fc.weight", "enc.output_norm.weight"):
        w.bytes_weights += d[name].n_bytes
    fc = d["fc.weight"]
    w.matmuls.append(_mm(fc, n_rows))
    for il in range(n_layer):
        for sub in INJECT_LAYER_TENSORS:
            w.bytes_weights += d[f"blk.{il}.{sub}.weight"].n_bytes
        ti = d[f"blk.{il}.attn_kv_a_mqa.weight"]
        w.matmuls.append(_mm(ti, n_rows))
    w.bytes_cache = int(n_layer * n_rows * kv_width * cache_bytes_per_value)
    return w


def gemm_key(ty: str, k: int, m: int, n: int = GEMM_N) -> tuple[str, int, int, int]:
    return ty, k, min(m, GEMM_M_MAX), n


def gemm_specs(works: list[PassWork], stream_n: int | None = None) -> list[str]:
    """TYPE:K:M:N for every weight shape (rows capped) the passes' matmuls have, at each N of
    COMPUTE_NS; with stream_n, also the two largest shapes per type at N = stream_n (how close
    ggml's kernels get to the read bandwidth when a pass is memory bound)."""
    seen = sorted({gemm_key(m[1], m[2], m[3]) for w in works for m in w.matmuls})
    specs = [f"{ty}:{k}:{m}:{n}" for ty, k, m, _ in seen for n in COMPUTE_NS]
    if stream_n:
        for ty in sorted({key[0] for key in seen}):
            biggest = sorted((key for key in seen if key[0] == ty), key=lambda key: -key[1] * key[2])[:2]
            specs += [f"{ty}:{k}:{m}:{stream_n}" for _, k, m, _ in biggest]
    return specs


@dataclass
class Measured:
    threads: int
    bandwidth_gbps: float              # best pass
    bandwidth_cpu_share: float         # CPU time / (wall x threads) of that pass
    bandwidth_1_thread_gbps: float
    gemm: dict = field(default_factory=dict)      # (type, K, M, N) -> {"gflops", "gbps", "buft", "cpu_share"}
    raw: dict = field(default_factory=dict)

    def rate(self, ty: str, k: int, m: int) -> float:
        """FLOP/s ggml reaches on this weight shape, the best over COMPUTE_NS columns (compute bound)."""
        rates = [self.gemm[key]["gflops"] for n in COMPUTE_NS if (key := gemm_key(ty, k, m, n)) in self.gemm]
        if not rates:
            raise ProofError(f"no GEMM rate measured for {ty} K={k} M={m}")
        return max(rates) * 1e9

    @property
    def best_rate(self) -> float:
        return max(g["gflops"] for key, g in self.gemm.items() if key[3] in COMPUTE_NS) * 1e9


def measure_default_bufts(tree: Path, build: Path, out: Path, specs: list[str], threads: int,
                          **kw) -> tuple[Measured, bool, str | None]:
    """measure() with the buffer types llama.cpp picks; where that run dies (ggml's AMX tile
    kernels built by GCC 12 lose their tile config and raise SIGILL, upstream PR #26954), again
    with extra buffer types off. (Measured, extra buffer types on?, the note saying why not)."""
    try:
        return measure(tree, build, out, specs, threads, **kw), True, None
    except (ProofError, ProcessError) as err:
        note = (f"default buffer types failed ({str(err).splitlines()[0][:200]}); "
                "measured with extra buffer types off")
        return measure(tree, build, out, specs, threads, extra_bufts=False, **kw), False, note


def measure(tree: Path, build: Path, out: Path, specs: list[str], threads: int, bw_mib: int = BW_MIB,
            repeats: int = 1, extra_bufts: bool = True, timeout: float = 1800) -> Measured:
    from llamacpp_mla_port import process
    from llamacpp_mla_port.proof.run.programs import compile_program

    exe = compile_program("ggml-floor", tree, build)
    cmd = [exe, "--threads", threads, "--out", out, "--bw-mib", bw_mib, "--gemm", ",".join(specs),
           "--repeats", repeats] + ([] if extra_bufts else ["--no-extra-bufts"])
    proc = process.run(cmd, timeout=timeout)
    if proc.returncode != 0:
        raise ProofError(f"ggml-floor failed (exit {proc.returncode}): {proc.stderr[-2000:]}",
                         hint=" ".join(str(c) for c in cmd))
    raw = json.loads(Path(out).read_text())
    bw = raw["bandwidth"]
    best = max(range(len(bw["gbps"])), key=lambda i: bw["gbps"][i])
    m = Measured(raw["threads"], bw["gbps"][best], bw["cpu_share"][best], max(bw["gbps_1_thread"]), raw=raw)
    for g in raw["gemm"]:
        i = min(range(len(g["seconds"])), key=lambda j: g["seconds"][j])
        flops = 2.0 * g["k"] * g["m"] * g["n"]
        weight_bytes = g["k"] * g["m"] * WEIGHT_BYTES.get(g["type"], 1.0)
        m.gemm[(g["type"], g["k"], g["m"], g["n"])] = {
            "gflops": flops / g["seconds"][i] / 1e9, "gbps": weight_bytes / g["seconds"][i] / 1e9, "buft": g["buft"],
            "cpu_share": g["cpu_seconds"][i] / (g["seconds"][i] * raw["threads"])}
    return m


def floor_seconds(work: PassWork, m: Measured) -> dict:
    """The pass's floor and its two terms (seconds)."""
    t_mem = work.bytes_total / (m.bandwidth_gbps * 1e9)
    t_compute = sum(f / m.rate(ty, k, rows) for _, ty, k, rows, f in work.matmuls) + work.attention_flops / m.best_rate
    return {"memory_s": t_mem, "compute_s": t_compute, "floor_s": max(t_mem, t_compute),
            "bound": "memory" if t_mem >= t_compute else "compute"}


def pass_entry(work: PassWork, floor: dict, seconds: list[float], cpu: list[float], bw_gbps: list[float],
               threads: int) -> dict:
    """A pass's timed runs against its floor. ratio_to_floor: the best run / the floor at the best
    bandwidth of the run. ratio_paired_median: the median over runs of each run / the floor at
    the bandwidth read just before it (the like-with-like figure on a machine whose bandwidth
    moves); absent when no bandwidth was sampled."""
    best = min(range(len(seconds)), key=lambda i: seconds[i])
    e = {**work.as_dict(), **{k: (round(v, 6) if isinstance(v, float) else v) for k, v in floor.items()},
         "runs": len(seconds), "seconds": round(seconds[best], 6),
         "seconds_median": round(statistics.median(seconds), 6),
         "cpu_share": round(cpu[best] / (seconds[best] * threads), 3),
         "ratio_to_floor": round(seconds[best] / floor["floor_s"], 3)}
    if bw_gbps:
        if len(bw_gbps) != len(seconds):
            raise ProofError(f"{len(seconds)} timed runs but {len(bw_gbps)} bandwidth samples",
                             hint="draft-bench samples the bandwidth before every timed pass: rebuild it")
        paired = [s / max(work.bytes_total / (g * 1e9), floor["compute_s"]) for s, g in zip(seconds, bw_gbps)]
        e["bandwidth_paired_gbps_median"] = round(statistics.median(bw_gbps), 2)
        e["ratio_paired_median"] = round(statistics.median(paired), 3)
    return e
