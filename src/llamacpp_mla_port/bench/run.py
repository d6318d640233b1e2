"""`make bench`: the draft at Kimi-K3's real dimensions against floors measured in the same run.

Stages (each timed; a failing stage is recorded and the others still run):

  models     the real-size pair (proof.realsize): target and draft in BF16, both quantized to
             Q8_0 by llama-quantize; the BF16 draft's checkpoint is kept for the PyTorch path
  floors     ggml-floor: read bandwidth and ggml's MUL_MAT rate per weight type and K
  kv         llama.cpp's own draft KV bytes per token (F32, F16, q8_0 cache) and the draft
             logits' NMSE of the F16 and q8_0 caches against the F32 cache (draft-logits)
  passes     draft-bench: injection of N = 1, 64, 512 rows and one 7-token block over 512
             cached rows, BF16 and Q8_0 pairs, each run after a bandwidth read (the paired
             ratio), with per-op profiles of the block and the 1- and 512-row injections
  torch      the same block through bench.torch_draft (BF16, same threads, same inputs),
             and its logits against llama.cpp's
  sweep      ggml-cpu's MUL_MAT over N = 1-8, 12, 16, 17, 32, 64 at the draft's largest
             shapes (BF16, Q8_0) against each product's floor (bench.sweep)
  spec       speculative step split on the tiny pair (draft vs target time, acceptance per position)
  tool       `make patch` cold/warm, `make build` cold and after a one-template change

Everything lands in work/bench/: report.md, report.json, plots/*.png (bench.report).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from llamacpp_mla_port.project import program
from llamacpp_mla_port import process
from llamacpp_mla_port.build import TARGET_SETS
from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.stages import Stages, write_json

#: what a stage needs from earlier ones (a --stages subset runs these too)
#: the stages in the order run_bench runs them (the verb's --stages choices)
STAGES = ("models", "floors", "kv", "passes", "sweep", "torch", "spec", "tool")
STAGE_METHODS = {"models": "make_models"}      # the Bench method of a stage (default: its name)
LAST_CHECKPOINT_USE = "torch"                   # the checkpoint (PyTorch path) is deleted after it
NEEDS = {"floors": {"models"}, "kv": {"models"}, "passes": {"models", "floors"}, "torch": {"models", "kv", "passes"}}

BENCH_TARGETS = TARGET_SETS["bench"]       # build.TARGET_SETS: the one table
INJECT_SIZES = (1, 64, 512)
BLOCK = 7
BLOCK_CTX = 512
PASS_MIN_SECONDS = 5     # each pass repeats until its timed runs add up to this (inject 1: ~200, block: ~6)


def _stage_line(name: str, st: dict) -> None:
    _log(f"stage {name}: {'ok' if st['ok'] else 'FAILED: ' + st['error']} ({st['seconds']} s)")


def _log(msg: str) -> None:
    sys.stderr.write(f"bench: {msg}\n")
    sys.stderr.flush()


class Bench:
    def __init__(self, tree: Path, build: Path, out: Path, threads: int, repeats: int = 3,
                 reuse_models: bool = False, stages: tuple[str, ...] | None = None, baseline: Path | None = None,
                 root: Path | None = None):
        self.root = root            # the checkout (the tool stage times `make patch` / `make build` in it)
        self.tree, self.build, self.out = Path(tree).resolve(), Path(build).resolve(), Path(out).resolve()
        self.baseline = Path(baseline).resolve() if baseline else None
        self.models = self.out / "models"
        self.threads, self.repeats, self.reuse = threads, repeats, reuse_models
        self.stages = stages
        self.report: dict = {"threads": threads, "repeats": repeats, "block": BLOCK, "block_ctx": BLOCK_CTX,
                             "stages": {}, "commands": {}}
        earlier = self.out / "report.json"
        if stages is not None and earlier.is_file():
            # a subset of stages updates the last full report instead of replacing it
            self.report = {**json.loads(earlier.read_text()), "threads": threads, "repeats": repeats}
        self.files: dict[str, Path] = {}

    # ------------------------------------------------------------------ plumbing
    def stage(self, name: str, fn) -> None:
        if self.stages is not None and name not in self.stages:
            return
        _log(f"stage {name} ...")
        Stages(self.report["stages"], log=_stage_line).run(name, fn)
        self.save()

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(self.out / "report.json", self.report, indent=1, default=str)

    def cmd(self, key: str, argv) -> None:
        """Record the command that reproduces a figure."""
        self.report["commands"][key] = " ".join(str(a) for a in argv)

    def _program(self, name: str) -> Path:
        from llamacpp_mla_port.proof.run.programs import compile_program
        return compile_program(name, self.tree, self.build)

    # ------------------------------------------------------------------ models
    def make_models(self) -> None:
        from llamacpp_mla_port.proof.run.processes import run_bounded
        from llamacpp_mla_port.proof.realsize import real_draft_config, write_real_draft, write_real_target

        if not self.reuse and self.models.exists():
            shutil.rmtree(self.models)
        self.models.mkdir(parents=True, exist_ok=True)
        times: dict = {}
        t0 = time.monotonic()
        target = write_real_target(self.build, self.models / "target")
        times["target_write_s"] = round(time.monotonic() - t0, 1)
        draft_path = self.models / "draft" / "k3-dspark-real-bf16.gguf"
        ckpt = self.models / "draft" / "checkpoint"
        if not (draft_path.is_file() and (ckpt / "model.safetensors").is_file()):
            d = write_real_draft(self.tree, self.models / "draft", real_draft_config(), keep_checkpoint=True)
            times.update(checkpoint_write_s=round(d.write_seconds, 1), convert_s=round(d.convert_seconds, 1),
                         convert_peak_rss_bytes=d.convert_peak_rss_bytes)
        self.files.update(target_bf16=target, draft_bf16=draft_path, checkpoint=ckpt)
        quantize = program(self.build, "llama-quantize")
        for key, src in (("draft_q8_0", draft_path), ("target_q8_0", target)):
            dst = src.with_name(src.stem.replace("-bf16", "") + "-q8_0.gguf")
            if not dst.is_file():
                argv = [quantize, src, dst, "q8_0", str(self.threads)]
                t1 = time.monotonic()
                proc = run_bounded(argv, 1800)
                if proc.returncode != 0:
                    raise ProofError(f"llama-quantize failed: {proc.stderr[-2000:]}", hint=" ".join(map(str, argv)))
                times[f"quantize_{key}_s"] = round(time.monotonic() - t1, 1)
                self.cmd(f"quantize_{key}", argv)
            self.files[key] = dst
        self.report["models"] = {"files": {k: {"path": str(v), "bytes": v.stat().st_size}
                                           for k, v in self.files.items() if v.is_file()}, **times}

    # ------------------------------------------------------------------ floors
    def floors(self) -> None:
        from llamacpp_mla_port.bench import floors as fl

        works = []
        for wt in ("bf16", "q8_0"):
            d, t = self.files[f"draft_{wt}"], self.files[f"target_{wt}"]
            tables = (fl.tensor_table(d), fl.tensor_table(t))
            works.append(fl.block_work(d, t, BLOCK, BLOCK_CTX, tables=tables))
            works += [fl.inject_work(d, n, table=tables[0]) for n in INJECT_SIZES]
        specs = fl.gemm_specs(works, stream_n=BLOCK)
        m = None
        self.floor_notes = {}
        for wt in ("bf16", "q8_0"):
            wt_specs = [sp for sp in specs if sp.startswith(wt + ":")]
            out = self.out / f"floors-{wt}.json"
            # the same fallback as the passes: an extra buffer type (AMX) that crashes on this machine
            part, extra, note = fl.measure_default_bufts(self.tree, self.build, out, wt_specs, self.threads,
                                                         repeats=self.repeats)
            if note:
                self.floor_notes[wt] = note
            self.cmd(f"floors_{wt}", [self._program("ggml-floor"), "--threads", self.threads, "--out", out,
                                      "--bw-mib", fl.BW_MIB, "--gemm", ",".join(wt_specs), "--repeats", self.repeats]
                     + ([] if extra else ["--no-extra-bufts"]))
            if m is None:
                m = part
            else:   # one bandwidth figure: the best pass of both runs
                if part.bandwidth_gbps > m.bandwidth_gbps:
                    m.bandwidth_gbps, m.bandwidth_cpu_share = part.bandwidth_gbps, part.bandwidth_cpu_share
                m.bandwidth_1_thread_gbps = max(m.bandwidth_1_thread_gbps, part.bandwidth_1_thread_gbps)
                m.gemm.update(part.gemm)
        self.measured = m
        self.report["floors"] = {
            "bandwidth_gbps": round(m.bandwidth_gbps, 2), "bandwidth_cpu_share": round(m.bandwidth_cpu_share, 2),
            "bandwidth_1_thread_gbps": round(m.bandwidth_1_thread_gbps, 2),
            "gemm": [{"type": ty, "k": k, "m": rows, "n": n,
                      **{kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in g.items()}}
                     for (ty, k, rows, n), g in sorted(m.gemm.items())],
            "notes": self.floor_notes,
        }

    # ------------------------------------------------------------------ KV cache + q8_0 NMSE
    def kv(self) -> None:
        from llamacpp_mla_port.proof.run.draft_logits import run_draft_logits
        from llamacpp_mla_port.proof.reference.model import nmse
        from llamacpp_mla_port.proof.realsize import real_draft_config

        cfg = real_draft_config()
        exe = self._program("draft-logits")
        rng = np.random.default_rng(7)
        n_ctx = BLOCK_CTX
        feats = rng.standard_normal((n_ctx, len(cfg["target_layer_ids"]) * cfg["target_hidden_size"]), dtype=np.float32)
        ids = [int(rng.integers(0, cfg["vocab_size"] - 8))] + [cfg["mask_token_id"]] * (BLOCK - 1)
        np.save(self.out / "kv-features.npy", feats)
        self.kv_inputs = (feats, ids)
        # llama.cpp quantizes a V cache only with flash attention, and MLA's V is a view of K:
        # -ctk q8_0 needs -fa on. The F32 cache without flash attention is the exact reference;
        # F16 + flash attention separates the cache's rounding from flash attention's.
        runs = {}
        for ct, fa in (("f32", False), ("f16", False), ("f16", True), ("q8_0", True)):
            key = f"{ct}{'-fa' if fa else ''}"
            d = self.out / "kv" / key
            runs[key] = run_draft_logits(exe, self.files["draft_bf16"], self.files["target_bf16"],
                                         self.out / "kv-features.npy", ids, d, ctx_pos0=40000, cache_type=ct,
                                         flash_attn=fa, threads=self.threads, timeout=1800, base_logits=False)
            self.cmd(f"kv_{key}", [exe, "--draft", self.files["draft_bf16"], "--target", self.files["target_bf16"],
                                   "--features", self.out / "kv-features.npy", "--tokens", ",".join(map(str, ids)),
                                   "--out", d, "--ctx-pos0", 40000, "--cache-type", ct, "--flash-attn",
                                   "on" if fa else "off", "--threads", self.threads, "--no-base-logits"])
        ref = runs["f32"]

        def versus(r, base) -> dict:
            return {"biased_logits": nmse(r.biased_logits, base.biased_logits), "hidden": nmse(r.hidden, base.hidden),
                    "chain_equal": bool(np.array_equal(r.chain, base.chain))}

        n_layer, width = cfg["num_hidden_layers"], cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
        head_values = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] + cfg["v_head_dim"]
        decompressed = n_layer * cfg["num_attention_heads"] * head_values
        self.report["kv"] = {
            "n_ctx": n_ctx, "ctx_pos0": 40000, "layers": n_layer, "latent_width": width,
            "values_per_token": {"mla_latent": n_layer * width, "decompressed": decompressed},
            "bytes_per_token": {ct: runs[key].kv_bytes_per_token for ct, key in
                                (("f32", "f32"), ("f16", "f16"), ("q8_0", "q8_0-fa"))},
            "bytes_per_token_decompressed_f16": 2 * decompressed,
            "v_cache_empty": {key: r.v_cache_empty for key, r in runs.items()},
            "nmse_vs_f32_cache": {key: versus(r, ref) for key, r in runs.items() if key != "f32"},
            "nmse_q8_0_vs_f16_same_kernel": versus(runs["q8_0-fa"], runs["f16-fa"]),
        }
        self.kv_reference = ref

    # ------------------------------------------------------------------ llama.cpp passes
    def _draft_bench(self, wt: str, tag: str, args: list, extra_bufts: bool) -> dict:
        from llamacpp_mla_port.proof.run.processes import run_bounded

        exe = self._program("draft-bench")
        out = self.out / f"passes-{wt}-{tag}.json"
        argv = [exe, "--draft", self.files[f"draft_{wt}"], "--target", self.files[f"target_{wt}"], "--out", out,
                "--block", BLOCK, "--block-ctx", BLOCK_CTX, *args] + ([] if extra_bufts else ["--no-extra-bufts"])
        proc = run_bounded(argv, 1800)
        if proc.returncode != 0:
            raise ProofError(f"draft-bench ({wt}) failed (exit {proc.returncode}): {proc.stderr[-1500:]}",
                             hint=" ".join(map(str, argv)))
        self.cmd(f"passes_{wt}_{tag}", argv)
        res = json.loads(out.read_text())
        res["peak_rss_bytes"] = proc.peak_rss_bytes
        return res

    def passes(self) -> None:
        """Timed passes at the benchmark's threads with flash attention on (llama.cpp's CPU default,
        what llama-server and llama-speculative-simple run) and the BF16 block also with it off;
        then a profile of one block and of a 1-row and a 512-row injection on ONE thread, per node
        in CPU time (the node's own work, however busy the machine is).

        Every timed pass comes with the read bandwidth sampled just before it (draft-bench
        --bw-mib): the floor takes the best bandwidth seen anywhere in the run, and the paired
        ratio sets each pass against the bandwidth of its own moment (this VM's neighbours move
        the bandwidth by +-30 % within minutes)."""
        from llamacpp_mla_port.bench import floors as fl

        timed = ["--inject", ",".join(map(str, INJECT_SIZES)), "--repeats", self.repeats, "--threads", self.threads,
                 "--flash-attn", "on", "--min-seconds", PASS_MIN_SECONDS, "--bw-mib", fl.BW_MIB]
        runs: dict[str, dict] = {}
        for wt in ("bf16", "q8_0"):
            extra, note = True, None
            try:
                res = self._draft_bench(wt, "timed", timed, extra)
            except ProofError as err:
                # upstream: on this machine an extra buffer type (AMX) takes Q8_0 weights no kernel of the
                # MLA graph can then run (scheduler assert), or its kernel faults: the user's -nr / --no-repack
                extra = False
                note = (f"default buffer types failed ({str(err).splitlines()[0][:300]}); "
                        "measured with extra buffer types off (llama.cpp's --no-repack)")
                res = self._draft_bench(wt, "timed", timed, extra)
            run = {"extra": extra, "note": note, "timed": res}
            if wt == "bf16":
                run["fa-off"] = self._draft_bench(wt, "fa-off", ["--inject", "", "--repeats", self.repeats,
                                                                 "--threads", self.threads, "--flash-attn", "off",
                                                                 "--min-seconds", PASS_MIN_SECONDS,
                                                                 "--bw-mib", fl.BW_MIB], extra)
            run["profile"] = self._draft_bench(wt, "profile", ["--profile-only", "--profile-inject",
                                                               f"{INJECT_SIZES[0]},{INJECT_SIZES[-1]}",
                                                               "--threads", 1, "--flash-attn", "on"], extra)
            runs[wt] = run

        m = self.measured
        probes = [g for run in runs.values() for res in (run["timed"], run.get("fa-off")) if res
                  for g in res["block_bw_gbps"] + [x for v in res["inject_bw_gbps"].values() for x in v]]
        if probes and max(probes) > m.bandwidth_gbps:
            m.bandwidth_gbps = max(probes)      # the best read this run saw is the floor's bandwidth
        self.report.setdefault("floors", {})["bandwidth_floor_gbps"] = round(m.bandwidth_gbps, 2)
        self.report["floors"]["bandwidth_passes_gbps"] = {
            "best": round(max(probes), 2), "median": round(statistics.median(probes), 2), "samples": len(probes),
        } if probes else {}

        self.report["passes"] = {}
        for wt, run in runs.items():
            res = run["timed"]
            d, t = self.files[f"draft_{wt}"], self.files[f"target_{wt}"]
            tables = (fl.tensor_table(d), fl.tensor_table(t))
            entry: dict = {"extra_bufts": run["extra"], "note": run["note"], "flash_attn": "on",
                           "load_seconds": res["load_seconds"], "peak_rss_bytes": res["peak_rss_bytes"],
                           "file_bytes": d.stat().st_size + t.stat().st_size}
            bw = fl.block_work(d, t, BLOCK, BLOCK_CTX, tables=tables)
            rows = [("block", bw, res["block_seconds"], res["block_cpu"], res["block_bw_gbps"])]
            for n in INJECT_SIZES:
                rows.append((f"inject {n}", fl.inject_work(d, n, table=tables[0]), res["inject"][str(n)],
                             res["inject_cpu"][str(n)], res["inject_bw_gbps"][str(n)]))
            if "fa-off" in run:
                off = run["fa-off"]
                rows.append(("block, flash attn off", bw, off["block_seconds"], off["block_cpu"],
                             off["block_bw_gbps"]))
            for name, work, secs, cpu, bws in rows:
                entry[name] = fl.pass_entry(work, fl.floor_seconds(work, m), secs, cpu, bws, self.threads)
            prof = run["profile"]
            entry["profile"] = summarize_profile(prof["profile"], prof["profiled_block_seconds"])
            entry["profile_inject"] = {n: summarize_profile(p["nodes"], p["seconds"])
                                       for n, p in prof["profile_inject"].items()}
            self.report["passes"][wt] = entry

    # ------------------------------------------------------------------ N sweep
    def sweep(self) -> None:
        """ggml-cpu's MUL_MAT over N at the draft's largest shapes against its floor (bench.sweep)."""
        from llamacpp_mla_port.bench import sweep as sw

        out = self.out / "sweep.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        # small products: more repeats than the passes, for the same noise
        self.report["sweep"] = sw.run_sweep(self.tree, self.build, out, self.threads, repeats=max(5, self.repeats),
                                            baseline=self.baseline)
        self.cmd("sweep", [self._program("ggml-floor"), "--threads", self.threads, "--out", out,
                           "--repeats", max(5, self.repeats), "--gemm", "(bench.sweep: TYPES x SHAPES x N_VALUES, 512)"]
                 + (["(and against --baseline-build", self.baseline, ", interleaved)"] if self.baseline else []))

    # ------------------------------------------------------------------ PyTorch
    def torch(self) -> None:
        import torch

        from llamacpp_mla_port.bench.torch_draft import TorchDraft
        from llamacpp_mla_port.proof.reference.model import nmse

        torch.set_num_threads(self.threads)
        feats, ids = self.kv_inputs
        t0 = time.monotonic()
        draft = TorchDraft.load(self.files["checkpoint"], self.files["target_bf16"])
        load_s = time.monotonic() - t0
        positions = 40000 + np.arange(feats.shape[0])
        t1 = time.monotonic()
        draft.inject(feats, positions)
        inject_s = time.monotonic() - t1
        times, logits = [], None
        for r in range(self.repeats + 1):
            draft.truncate(feats.shape[0])
            t1 = time.monotonic()
            logits, hidden, chain = draft.block(ids, 40000 + feats.shape[0])
            if r:
                times.append(time.monotonic() - t1)
        ref = self.kv_reference
        llama_block = self.report.get("passes", {}).get("bf16", {}).get("block", {}).get("seconds")
        self.report["torch"] = {
            "torch_version": torch.__version__, "threads": torch.get_num_threads(), "load_seconds": round(load_s, 1),
            "inject_512_seconds": round(inject_s, 3),
            "block_seconds": round(min(times), 4), "block_seconds_median": round(statistics.median(times), 4),
            "ratio_torch_over_llama": round(min(times) / llama_block, 3) if llama_block else None,
            "nmse_vs_llama_f32_cache": {"biased_logits": nmse(logits, ref.biased_logits),
                                        "hidden": nmse(hidden, ref.hidden),
                                        "chain_equal": list(chain) == [int(c) for c in ref.chain]},
        }
        self.cmd("torch", ["llamacpp-mla-port bench --stages models,kv,torch  (bench.torch_draft.TorchDraft on",
                           self.files["checkpoint"], "+", self.files["target_bf16"], f"torch threads {self.threads})"])
        del draft

    # ------------------------------------------------------------------ speculative step split (tiny pair)
    def spec(self) -> None:
        self.report["spec"] = spec_split(self.tree, self.build, self.out / "spec", self.threads, log=_log)
        self.report["commands"].update(self.report["spec"].pop("commands", {}))

    # ------------------------------------------------------------------ the tool itself
    def tool(self) -> None:
        self.report["tool"] = tool_timings(self.out / "tool", self.threads, self.root, log=_log)
        self.report["commands"].update(self.report["tool"].pop("commands", {}))

    def cleanup(self) -> None:
        """The checkpoint (4.8 GB) only serves the PyTorch path."""
        ckpt = self.files.get("checkpoint")
        if ckpt and ckpt.exists() and not self.reuse:
            shutil.rmtree(ckpt)


# ---------------------------------------------------------------------------------------
# per-op profile

def _op_class(node: dict) -> str:
    op = node["op"]
    if op == "MUL_MAT":
        return f"MUL_MAT {node['type0']}"
    return op


def summarize_profile(nodes: list[dict], total: float) -> dict:
    """Per op kind and per node name (all layers together), from draft-bench's per-node timings of
    one pass: process CPU time per node (on one thread: the node's own work), wall time beside it."""
    if not nodes:
        return {}
    by_op: dict[str, float] = {}
    by_name: dict[str, list] = {}
    for n in nodes:
        cpu = n.get("cpu_seconds", n["seconds"])
        by_op[_op_class(n)] = by_op.get(_op_class(n), 0.0) + cpu
        base = re.sub(r"-\d+$", "", n["name"])      # per-layer names end in -il
        if re.fullmatch(r"node_\d+", base):         # unnamed: by shape
            base = f"{n['ne0'][:3]} x {n['ne1'][:3]}"
        key = f"{n['op']} {base}"
        e = by_name.setdefault(key, [0.0, 0, n["ne0"], n["ne1"], n["type0"]])
        e[0] += cpu
        e[1] += 1
    s = sum(by_op.values())
    return {
        "profiled_seconds": round(total, 4), "sum_of_nodes_cpu_seconds": round(s, 4), "n_nodes": len(nodes),
        "by_op": [{"op": k, "seconds": round(v, 5), "share": round(v / s, 4)}
                  for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])],
        "top_nodes": [{"node": k, "seconds": round(v[0], 5), "share": round(v[0] / s, 4), "count": v[1],
                       "src0": v[2], "src1": v[3], "type0": v[4]}
                      for k, v in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]],
    }


# ---------------------------------------------------------------------------------------
# speculative step split on the tiny pair

_STATS = re.compile(r"statistics\s+draft-dspark: #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+).*?#gen tokens =\s*(\d+), "
                    r"#acc tokens =\s*(\d+)(?:, #mean acc len = ([\d.]+), #acc rate/pos = \(([^)]*)\))?"
                    r".*?dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


def spec_split(tree: Path, build: Path, work: Path, threads: int, n_prompts: int = 6, n_predict: int = 64,
               draft_max: int = 7, log=print) -> dict:
    """Per speculative step: the draft's time (common_speculative's own clock) against the rest of
    the step (target verification, sampling, rollback), and the acceptance rate per draft position,
    on the tiny pair of the lossless proof (bigram draft, partly accepted)."""
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
    from llamacpp_mla_port.proof.lossless import PROMPTS, bigram_table, greedy_continuations, write_lossless_draft
    from llamacpp_mla_port.proof.run.processes import run_bounded
    from llamacpp_mla_port.proof.run.programs import compile_program
    from llamacpp_mla_port.proof.reference.model import read_target_head
    from llamacpp_mla_port.fixtures.target_variants import write_deep_kimi_k3_target

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    base = write_kimi_k3_target(build, work / "kimi-k3-tiny.gguf")
    target = write_deep_kimi_k3_target(base, work / "target-deep.gguf", "MKKMKK", 2)
    embd, _ = read_target_head(target)
    vocab, hidden = embd.shape
    prompts = list(PROMPTS[:n_prompts])
    seqs = greedy_continuations(compile_program("target-features", tree, build), target, prompts[: n_prompts // 2],
                                work / "greedy", n_predict)
    draft = write_lossless_draft(tree, work, "draft-bigram", hidden, vocab, [0, 2, 4], bigram_table(seqs))
    steps = drafted = accepted = 0
    draft_ms = decode_s = 0.0
    pos_acc = np.zeros(draft_max)
    argv = None
    for p in prompts:
        argv = [program(build, "llama-speculative-simple"), "-m", target, "-md", draft, "--spec-type", "draft-dspark",
                "--spec-draft-n-max", draft_max, "--spec-draft-p-min", 0, "-p", p, "-n", n_predict, "--temp", 0,
                "--top-k", 1, "-s", 1, "-c", 1024, "-fa", "off", "-t", threads, "-lv", 4]
        proc = run_bounded(argv, 600)
        log_text = proc.stderr + proc.stdout
        m, dec = _STATS.search(log_text), _DECODED.search(log_text)
        if proc.returncode != 0 or not m or not dec:
            raise ProofError(f"llama-speculative-simple printed no statistics for {p!r} (exit {proc.returncode})",
                             hint=" ".join(map(str, argv)))
        n_steps = int(m.group(2))
        steps += n_steps
        drafted += int(m.group(4))
        accepted += int(m.group(5))
        draft_ms += float(m.group(9))
        decode_s += float(dec.group(2))
        if m.group(7):
            rates = [float(x) for x in m.group(7).split(",")]
            pos_acc[: len(rates)] += np.array(rates) * int(m.group(3))
    n_accept_calls = steps
    per_step_draft = draft_ms / steps
    per_step_rest = (decode_s * 1000.0 - draft_ms) / steps
    return {
        "pair": "tiny: kimi-k3 MKKMKK n_embd 128 vocab 128 target, bigram-biased MLA draft (proof.lossless)",
        "prompts": len(prompts), "n_predict": n_predict, "draft_max": draft_max, "steps": steps,
        "drafted": drafted, "accepted": accepted, "mean_accept_len": round(1 + accepted / steps, 3),
        "draft_ms_per_step": round(per_step_draft, 2), "target_and_rest_ms_per_step": round(per_step_rest, 2),
        "draft_share": round(per_step_draft / (per_step_draft + per_step_rest), 3),
        "acceptance_per_position": [round(float(x) / n_accept_calls, 4) for x in pos_acc],
        "commands": {"spec_split": " ".join(map(str, argv)) + "   (per prompt of proof.lossless.PROMPTS[:6])"},
    }


# ---------------------------------------------------------------------------------------
# the tool: make patch / make build

def _timed(argv, env=None, cwd=None, timeout=3600) -> float:
    proc = process.run(argv, env=env, cwd=cwd, timeout=timeout)
    if proc.returncode != 0:
        raise ProofError(f"{' '.join(map(str, argv))} failed: {proc.stderr[-2000:]}")
    return proc.seconds


def tool_timings(work: Path, threads: int, root: Path, log=print) -> dict:
    """`make patch` into a fresh work dir (cold: clone from the download cache, render, apply) and
    again (warm); `make build` of that tree into an empty build dir with ccache off (cold) and
    after one template changed (a comment added to the MLA graph template: re-render, re-apply,
    rebuild what changed). Each with the equivalent CLI line (the Makefile calls the same)."""
    work = Path(work).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    tool = [sys.executable, "-m", "llamacpp_mla_port"]
    wd = work / "w"
    patches = work / "patches"
    res: dict = {"commands": {}}
    try:
        patch = tool + ["patch", "--work-dir", wd, "--patches-dir", patches]
        res["patch_cold_s"] = round(_timed(patch, cwd=root), 1)
        res["patch_warm_s"] = round(_timed(patch, cwd=root), 1)
        res["commands"]["patch"] = "make patch PATCH_ARGS=\"--work-dir DIR --patches-dir DIR2\"  (run twice)"
        log(f"make patch: cold {res['patch_cold_s']} s, warm {res['patch_warm_s']} s")

        env = dict(os.environ, CCACHE_DISABLE="1")
        build = tool + ["build", "--work-dir", wd, "--quiet", "-j", threads]
        res["build_cold_s"] = round(_timed(build, env=env, cwd=root), 1)
        res["commands"]["build_cold"] = (f"CCACHE_DISABLE=1 make build BUILD_ARGS=\"--work-dir DIR -j {threads}\""
                                         "  (empty build dir)")
        log(f"make build cold: {res['build_cold_s']} s")

        # one template changed, in a copy of the project so the checkout's patches/ stay untouched
        proj = work / "project"
        shutil.copytree(root / "templates", proj / "templates")
        shutil.copytree(root / "patches", proj / "patches")
        tpl = proj / "templates" / "series" / "21-model-dflash-mla-backbone" / "dflash-graph-mla.cpp.j2"
        text = tpl.read_text()
        if "// KV cache injection" not in text:
            raise ProofError(f"{tpl}: the line the bench edits is gone", hint="update bench.run.tool_timings")
        tpl.write_text(text.replace("// KV cache injection", "// KV cache injection (bench: a one-line change)", 1))
        repatch = tool + ["--project", proj, "patch", "--work-dir", wd, "--patches-dir", patches]
        res["patch_after_template_change_s"] = round(_timed(repatch, cwd=root), 1)
        res["build_after_template_change_s"] = round(_timed(build, env=env, cwd=root), 1)
        res["commands"]["build_incremental"] = ("edit one template; make patch; CCACHE_DISABLE=1 make build "
                                                "(ninja recompiles what changed)")
        log(f"one template changed: patch {res['patch_after_template_change_s']} s, "
            f"build {res['build_after_template_change_s']} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return res


# ---------------------------------------------------------------------------------------

def run_bench(tree: Path, build: Path, out: Path, threads: int | None = None, repeats: int = 3,
              reuse_models: bool = False, stages: tuple[str, ...] | None = None,
              baseline: Path | None = None, root: Path | None = None) -> dict:
    """`root`: the checkout, for the tool stage (not needed without it)."""
    from llamacpp_mla_port.bench.report import write_report
    from llamacpp_mla_port.build import ensure_build

    t0 = time.monotonic()
    threads = threads or max(1, os.cpu_count() or 1)
    if stages is not None:
        wanted = set(stages)
        while True:
            more = set().union(*(NEEDS.get(st, set()) for st in wanted)) - wanted
            if not more:
                break
            wanted |= more
        stages = tuple(wanted)
    b = Bench(tree, build, out, threads, repeats, reuse_models, stages, baseline, root)
    free = shutil.disk_usage(b.out.parent if b.out.parent.exists() else Path.cwd()).free
    writes_models = stages is None or "models" in stages   # the sweep alone makes no model
    if free < 25e9 and writes_models and not reuse_models:
        raise ProofError(f"make bench writes ~22 GB of real-size models under {b.out}; {free / 1e9:.1f} GB free",
                         hint="free disk space, or pass --out DIR on a larger disk")
    ensure_build(tree, build, BENCH_TARGETS, echo=False)
    for name in STAGES:
        b.stage(name, getattr(b, STAGE_METHODS.get(name, name)))
        if name == LAST_CHECKPOINT_USE:
            b.cleanup()
    b.report["total_seconds" if stages is None else "last_partial_run_seconds"] = round(time.monotonic() - t0, 1)
    b.save()
    write_report(b.report, b.out)
    return b.report
