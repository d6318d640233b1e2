"""`make bench`'s first stages: the real-size pair (models: proof.realsize's, BF16, both files
quantized to Q8_0 by llama-quantize), the floors and the draft's KV cache (kv); bench.run says
what each measures.
"""

from __future__ import annotations

import shutil
import time

import numpy as np

from llamacpp_mla_port.bench import floors as fl
from llamacpp_mla_port.bench.context import BLOCK, BLOCK_CTX, BenchRun
from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.project import program
from llamacpp_mla_port.fixtures.realsize import real_draft_config
from llamacpp_mla_port.proof.realsize import write_real_draft, write_real_target
from llamacpp_mla_port.proof.reference.model import nmse
from llamacpp_mla_port.proof.run.draft_logits import run_draft_logits
from llamacpp_mla_port import process

INJECT_SIZES = (1, 64, 512)
#: the kv stage's context: far past YaRN's original context, where the rotation is stretched
KV_POS0 = 40000


def models(run: BenchRun) -> None:
    if not run.reuse_models and run.models_dir.exists():
        shutil.rmtree(run.models_dir)
    run.models_dir.mkdir(parents=True, exist_ok=True)
    times: dict = {}
    t0 = time.monotonic()
    target = write_real_target(run.build, run.models_dir / "target")
    times["target_write_s"] = round(time.monotonic() - t0, 1)
    draft_path = run.models_dir / "draft" / "k3-dspark-real-bf16.gguf"
    ckpt = run.models_dir / "draft" / "checkpoint"
    if not (draft_path.is_file() and (ckpt / "model.safetensors").is_file()):
        d = write_real_draft(run.tree, run.models_dir / "draft", real_draft_config(), keep_checkpoint=True)
        times.update(checkpoint_write_s=round(d.write_seconds, 1), convert_s=round(d.convert_seconds, 1),
                     convert_peak_rss_bytes=d.convert_peak_rss_bytes)
    run.files.update(target_bf16=target, draft_bf16=draft_path, checkpoint=ckpt)
    quantize = program(run.build, "llama-quantize")
    for key, src in (("draft_q8_0", draft_path), ("target_q8_0", target)):
        dst = src.with_name(src.stem.replace("-bf16", "") + "-q8_0.gguf")
        if not dst.is_file():
            argv = [quantize, src, dst, "q8_0", str(run.threads)]
            t1 = time.monotonic()
            proc = process.run(argv, timeout=1800)
            if proc.returncode != 0:
                raise ProofError(f"llama-quantize failed: {proc.stderr[-2000:]}", hint=" ".join(map(str, argv)))
            times[f"quantize_{key}_s"] = round(time.monotonic() - t1, 1)
            run.cmd(f"quantize_{key}", argv)
        run.files[key] = dst
    run.report["models"] = {"files": {k: {"path": str(v), "bytes": v.stat().st_size}
                                      for k, v in run.files.items() if v.is_file()}, **times}


def floors(run: BenchRun) -> None:
    works = []
    for wt in ("bf16", "q8_0"):
        d, t = run.files[f"draft_{wt}"], run.files[f"target_{wt}"]
        tables = (fl.tensor_table(d), fl.tensor_table(t))
        works.append(fl.block_work(d, t, BLOCK, BLOCK_CTX, tables=tables))
        works += [fl.inject_work(d, n, table=tables[0]) for n in INJECT_SIZES]
    specs = fl.gemm_specs(works, stream_n=BLOCK)
    m = None
    run.floor_notes = {}
    for wt in ("bf16", "q8_0"):
        wt_specs = [sp for sp in specs if sp.startswith(wt + ":")]
        out = run.out / f"floors-{wt}.json"
        # the same fallback as the passes: an extra buffer type (AMX) that crashes on this machine
        part, extra, note = fl.measure_default_bufts(run.tree, run.build, out, wt_specs, run.threads,
                                                     repeats=run.repeats)
        if note:
            run.floor_notes[wt] = note
        run.cmd(f"floors_{wt}", [run.program("ggml-floor"), "--threads", run.threads, "--out", out,
                                 "--bw-mib", fl.BW_MIB, "--gemm", ",".join(wt_specs), "--repeats", run.repeats]
                + ([] if extra else ["--no-extra-bufts"]))
        if m is None:
            m = part
        else:   # one bandwidth figure: the best pass of both runs
            if part.bandwidth_gbps > m.bandwidth_gbps:
                m.bandwidth_gbps, m.bandwidth_cpu_share = part.bandwidth_gbps, part.bandwidth_cpu_share
            m.bandwidth_1_thread_gbps = max(m.bandwidth_1_thread_gbps, part.bandwidth_1_thread_gbps)
            m.gemm.update(part.gemm)
    run.measured = m
    run.report["floors"] = {
        "bandwidth_gbps": round(m.bandwidth_gbps, 2), "bandwidth_cpu_share": round(m.bandwidth_cpu_share, 2),
        "bandwidth_1_thread_gbps": round(m.bandwidth_1_thread_gbps, 2),
        "gemm": [{"type": ty, "k": k, "m": rows, "n": n,
                  **{kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in g.items()}}
                 for (ty, k, rows, n), g in sorted(m.gemm.items())],
        "notes": run.floor_notes,
    }


def kv(run: BenchRun) -> None:
    cfg = real_draft_config()
    exe = run.program("draft-logits")
    rng = np.random.default_rng(7)
    feats = rng.standard_normal((BLOCK_CTX, len(cfg["target_layer_ids"]) * cfg["target_hidden_size"]), dtype=np.float32)
    ids = [int(rng.integers(0, cfg["vocab_size"] - 8))] + [cfg["mask_token_id"]] * (BLOCK - 1)
    np.save(run.out / "kv-features.npy", feats)
    run.kv_inputs = (feats, ids)
    # llama.cpp quantizes a V cache only with flash attention, and MLA's V is a view of K:
    # -ctk q8_0 needs -fa on. The F32 cache without flash attention is the exact reference;
    # F16 + flash attention separates the cache's rounding from flash attention's.
    runs = {}
    for ct, fa in (("f32", False), ("f16", False), ("f16", True), ("q8_0", True)):
        key = f"{ct}{'-fa' if fa else ''}"
        d = run.out / "kv" / key
        runs[key] = run_draft_logits(exe, run.files["draft_bf16"], run.files["target_bf16"],
                                     run.out / "kv-features.npy", ids, d, ctx_pos0=KV_POS0, cache_type=ct,
                                     flash_attn=fa, threads=run.threads, timeout=1800, base_logits=False)
        run.cmd(f"kv_{key}", [exe, "--draft", run.files["draft_bf16"], "--target", run.files["target_bf16"],
                              "--features", run.out / "kv-features.npy", "--tokens", ",".join(map(str, ids)),
                              "--out", d, "--ctx-pos0", KV_POS0, "--cache-type", ct, "--flash-attn",
                              "on" if fa else "off", "--threads", run.threads, "--no-base-logits"])
    ref = runs["f32"]

    def versus(r, base) -> dict:
        return {"biased_logits": nmse(r.biased_logits, base.biased_logits), "hidden": nmse(r.hidden, base.hidden),
                "chain_equal": bool(np.array_equal(r.chain, base.chain))}

    n_layer, width = cfg["num_hidden_layers"], cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    head_values = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] + cfg["v_head_dim"]
    decompressed = n_layer * cfg["num_attention_heads"] * head_values
    run.report["kv"] = {
        "n_ctx": BLOCK_CTX, "ctx_pos0": KV_POS0, "layers": n_layer, "latent_width": width,
        "values_per_token": {"mla_latent": n_layer * width, "decompressed": decompressed},
        "bytes_per_token": {ct: runs[key].kv_bytes_per_token for ct, key in
                            (("f32", "f32"), ("f16", "f16"), ("q8_0", "q8_0-fa"))},
        "bytes_per_token_decompressed_f16": 2 * decompressed,
        "v_cache_empty": {key: r.v_cache_empty for key, r in runs.items()},
        "nmse_vs_f32_cache": {key: versus(r, ref) for key, r in runs.items() if key != "f32"},
        "nmse_q8_0_vs_f16_same_kernel": versus(runs["q8_0-fa"], runs["f16-fa"]),
    }
    run.kv_reference = ref
