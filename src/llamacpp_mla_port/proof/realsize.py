"""The real-size pair: the Kimi-K3-DSpark draft at its real config against a Kimi-K3 target
at the real n_embd and vocabulary. Everything is generated offline and seeded.

Design and bounds: docs/proof.md#realsize.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.fixtures.realsize import real_draft_config, write_real_width_target
from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
from llamacpp_mla_port.jsonfile import write_json


def write_real_target(build: Path, out_dir: Path, seed: int = 0) -> Path:
    """The widened Kimi-K3 target (fixtures.realsize) from the build's tiny one; reused when present."""
    out = Path(out_dir) / "kimi-k3-real-width.gguf"
    if out.is_file():
        return out
    tiny = write_kimi_k3_target(build, Path(out_dir) / "kimi-k3-tiny.gguf")
    return write_real_width_target(tiny, out_dir, seed=seed)


def bigram_markov_head(bigrams: dict[int, int], vocab: int, rank: int, strength: float = 40.0) -> dict:
    """markov_w1/w2 that add `strength` to the logit of next after prev, one rank slot per prev.

    The vanilla head adds markov_w2 . markov_w1[prev] to every row's logits; with one-hot
    w1 rows and w2 = strength at the successor, the draft proposes the target's own greedy
    bigrams. More distinct prevs than `rank` slots: the first `rank` (by token id) are kept.
    """
    import torch

    w1 = torch.zeros(vocab, rank)
    w2 = torch.zeros(vocab, rank)
    for slot, prev in enumerate(sorted(bigrams)[:rank]):
        w1[prev, slot] = 1.0
        w2[bigrams[prev], slot] = strength
    return {"markov_head.markov_w1.weight": w1, "markov_head.markov_w2.weight": w2}


@dataclass
class RealDraft:
    gguf: Path
    checkpoint: Path | None
    convert_seconds: float
    convert_peak_rss_bytes: int
    write_seconds: float


def write_real_draft(tree: Path, out_dir: Path, config: dict, markov: dict | None = None, outtype: str = "bf16",
                     keep_checkpoint: bool = False, seed: int = 0) -> RealDraft:
    """Write the checkpoint streaming, convert it; the checkpoint is deleted unless kept.
    An existing GGUF (and checkpoint, when kept) in out_dir is reused: the writer is seeded."""
    from llamacpp_mla_port.fixtures.checkpoint import write_k3_dspark_checkpoint_streaming, write_target_tokenizer_dir
    from llamacpp_mla_port.proof.run.convert import run_converter

    out_dir = Path(out_dir)
    ckpt, out = out_dir / "checkpoint", out_dir / f"k3-dspark-real-{outtype}.gguf"
    if out.is_file() and (not keep_checkpoint or (ckpt / "model.safetensors").is_file()):
        return RealDraft(out, ckpt if keep_checkpoint else None, 0.0, 0, 0.0)     # reused
    t0 = time.monotonic()
    write_k3_dspark_checkpoint_streaming(ckpt, config, seed=seed, dtype="bfloat16", overrides=markov)
    write_seconds = time.monotonic() - t0
    tok = write_target_tokenizer_dir(out_dir / "target-tokenizer", config)
    run = run_converter(tree, ckpt, out, tok, extra_args=("--outtype", outtype))
    if not keep_checkpoint:
        shutil.rmtree(ckpt)
    return RealDraft(out, ckpt if keep_checkpoint else None, run.seconds, run.peak_rss_bytes, write_seconds)


# ---------------------------------------------------------------------------------------
# lossless at real size

def run_real_lossless(tree: Path, build: Path, work: Path, n_prompts: int = 4, n_predict: int = 16,
                      draft_max: int = 7, threads: int = 2, server: bool = True, log=print) -> dict:
    """Greedy llama-speculative-simple and llama-server (-np 2) with the real-size pair == target alone.

    The report lists every mismatch (`n_mismatches`), the drafted/accepted counts, and the
    peak RSS of each kind of process against the sizes of the two files.

    Flash attention is ON in the speculative runs because the target alone (llama-simple)
    runs with llama.cpp's default, auto = on for CPU: the target's logits must come from the
    same attention kernel in both runs. Among 163840 near-flat random logits the top two are
    often within 1e-3 of each other, and CPU flash attention differs from the plain path by
    about that much (port-map fact 9): measured, FA off against the FA reference flipped one
    such near-tie (margin 3e-4, logit rms 0.12) in 1 of 6 prompts; with FA on, identical.
    """
    from llamacpp_mla_port.proof.lossless import (PROMPTS, Server, bigram_table, greedy_continuations,
                                                  render, same_greedy_output, speculative_simple, target_alone)
    from llamacpp_mla_port.proof.run.programs import compile_program

    t0 = time.monotonic()
    tree, build, work = Path(tree).resolve(), Path(build).resolve(), Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    prompts = list(PROMPTS[:n_prompts])
    target = write_real_target(build, work / "target")
    log(f"real-size target {target.stat().st_size / 1e9:.2f} GB ({time.monotonic() - t0:.0f} s)")

    # the target's own greedy bigrams, learned from half the prompts, bias the draft's Markov head
    tf = compile_program("target-features", tree, build)
    seqs = greedy_continuations(tf, target, prompts[: n_prompts // 2], work / "greedy", n_predict, timeout=900)
    config = real_draft_config()
    bigrams = bigram_table(seqs)
    markov = bigram_markov_head(bigrams, config["vocab_size"], config["markov_rank"])
    draft = write_real_draft(tree, work / "draft", config, markov)
    log(f"real-size draft {draft.gguf.stat().st_size / 1e9:.2f} GB (written {draft.write_seconds:.0f} s, "
        f"converted {draft.convert_seconds:.0f} s)")

    sizes = {"target": target.stat().st_size, "draft": draft.gguf.stat().st_size}
    report: dict = {"files": {"target": str(target), "draft": str(draft.gguf)},
                    "n_prompts": n_prompts, "n_predict": n_predict, "draft_max": draft_max,
                    "bigram_entries": len(bigrams), "file_bytes": sizes, "file_bytes_sum": sum(sizes.values()),
                    "convert_seconds": round(draft.convert_seconds, 1),
                    "convert_peak_rss_bytes": draft.convert_peak_rss_bytes, "speculative_simple": [], "server": None}
    mismatches: list[str] = []
    rss = {"target_alone": 0, "speculative_simple": 0, "server": 0}
    alone = {}
    for i, p in enumerate(prompts):
        text, proc = target_alone(build, target, p, n_predict=n_predict, measured=True, timeout=900)
        rss["target_alone"] = max(rss["target_alone"], proc.peak_rss_bytes)
        if i < len(seqs) and text != render(seqs[i]):
            raise ProofError(f"llama-simple's greedy text for {p!r} differs from the target's greedy ids",
                             hint=f"{text!r} vs {render(seqs[i])!r}")
        alone[p] = text
    drafted = accepted = 0
    for p in prompts:
        r = speculative_simple(build, target, draft.gguf, p, draft_max, True, 0.0, n_predict=n_predict,
                               threads=threads, timeout=900)
        rss["speculative_simple"] = max(rss["speculative_simple"], r.peak_rss_bytes or 0)
        drafted += r.n_drafted
        accepted += r.n_accepted
        ok = same_greedy_output(r.text, alone[p])
        if not ok:
            mismatches.append(f"speculative-simple: {p!r}: {r.text!r} != {alone[p]!r}")
        report["speculative_simple"].append({"prompt": p, "identical": ok, "drafted": r.n_drafted,
                                             "accepted": r.n_accepted, "seconds": round(r.seconds, 1)})
        log(f"real-size speculative-simple {p!r}: {'identical' if ok else 'DIFFERENT'}, "
            f"drafted {r.n_drafted}, accepted {r.n_accepted}, {r.seconds:.0f} s")
    report["speculative_simple_drafted"], report["speculative_simple_accepted"] = drafted, accepted
    if server:
        srv = Server(build, target, draft.gguf, draft_max, True, 0.0, work / "server.log", threads=threads,
                     request_timeout=1800, load_timeout=600)
        try:
            prompt_render = {p: render(srv.tokenize(p)) for p in prompts}
            results = srv.complete_all(prompts, n_predict)
            rss["server"] = srv.owned.peak_rss_bytes() or 0
        finally:
            srv.close()
        ok = s_drafted = s_accepted = 0
        for p, res in zip(prompts, results):
            text = res.get("content", "")
            # llama-simple prints the prompt's rendering before the continuation, the server
            # returns the continuation only
            want = alone[p][len(prompt_render[p]):]
            if alone[p].startswith(prompt_render[p]) and same_greedy_output(text, want):
                ok += 1
            else:
                mismatches.append(f"server: {p!r}: {text!r} != {want!r}")
            timings = res.get("timings", {})
            s_drafted += int(timings.get("draft_n", 0))
            s_accepted += int(timings.get("draft_n_accepted", 0))
        report["server"] = {"parallel": 2, "identical": ok, "of": len(prompts), "drafted": s_drafted,
                            "accepted": s_accepted}
        log(f"real-size server(-np 2): {ok}/{len(prompts)} identical, drafted {s_drafted}, accepted {s_accepted}")
    report["peak_rss_bytes"] = rss
    report["peak_rss_over_files"] = {k: round(v / report["file_bytes_sum"], 3) for k, v in rss.items()}
    report["mismatches"] = mismatches[:20]
    report["n_mismatches"] = len(mismatches)
    report["seconds"] = round(time.monotonic() - t0, 1)
    write_json(work / "realsize-lossless.json", report, indent=1)
    return report
