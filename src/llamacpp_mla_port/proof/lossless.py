"""Lossless speculative decoding: greedy output with the MLA DSpark draft == target alone.

Design and bounds: docs/proof.md#lossless.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamacpp_mla_port.project import program
from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port import process
from llamacpp_mla_port.proof.run.processes import LOCALHOST, Owned, free_port

N_PREDICT = 24
PROMPTS: tuple[str, ...] = tuple(
    f"{w} {i}" for i, w in enumerate([
        "the draft model proposes", "latent attention keeps", "rotary position embedding",
        "speculative decoding accepts", "markov head confidence", "context projection final",
        "mask token anchor block", "the target verifies them", "one compressed row per token",
        "interleaved pairs of rope", "the longest prefix that", "hybrid linear attention",
        "residual blocks of twelve", "greedy output must equal", "partial acceptance and",
        "rollback of the recurrent", "two parallel slots share", "flash attention on and off",
        "confidence cut off", "draft lengths one three seven", "a biased markov fixture",
        "tiny kimi k3 target", "the converter writes", "parity against the reference",
    ]))


@dataclass
class SpecRun:
    text: str
    n_drafted: int
    n_accepted: int
    peak_rss_bytes: int | None = None
    seconds: float = 0.0
    log: str = ""


def _run(cmd: list[str], timeout: float = 300) -> process.Completed:
    proc = process.run(cmd, timeout=timeout)
    if proc.returncode != 0:
        raise ProofError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}):\n{proc.stderr[-2500:]}",
                         hint=" ".join(cmd))
    return proc


def target_alone(build: Path, target: Path, prompt: str, n_predict: int = N_PREDICT, measured: bool = False,
                 timeout: float = 300):
    """llama-simple's greedy text (the prompt's own rendering, then the continuation);
    with `measured`, (text, the finished run with its peak RSS)."""
    proc = _run([str(program(build, "llama-simple")), "-m", str(target), "-n", str(n_predict), prompt], timeout)
    return (proc.stdout.strip(), proc) if measured else proc.stdout.strip()


def speculative_simple(build: Path, target: Path, draft: Path, prompt: str, draft_max: int, flash_attn: bool,
                       p_min: float, n_predict: int = N_PREDICT, threads: int = 2, extra=(),
                       timeout: float = 300) -> SpecRun:
    """One greedy llama-speculative-simple run; `extra` args go last (placement: --rpc, -dev, -devd ...)."""
    exe = str(program(build, "llama-speculative-simple"))
    cmd = [exe, "-m", str(target), "-md", str(draft),
           "--spec-type", "draft-dspark", "--spec-draft-n-max", str(draft_max), "--spec-draft-p-min", str(p_min),
           "-p", prompt, "-n", str(n_predict), "--temp", "0", "--top-k", "1", "-s", "1", "-c", "512",
           "-fa", "on" if flash_attn else "off", "-t", str(threads), *[str(a) for a in extra]]
    # the statistics come through common's asynchronous logger; under heavy load a run has
    # been seen to exit 0 without them, so a run without statistics is repeated (twice at most)
    for _ in range(3):
        proc = _run(cmd, timeout)
        err = proc.stderr + proc.stdout
        drafted = re.search(r"n_drafted\s*=\s*(\d+)", err)
        accepted = re.search(r"n_accept\s*=\s*(\d+)", err)
        if drafted and accepted:
            break
    else:
        raise ProofError("llama-speculative-simple printed no n_drafted/n_accept (3 runs)", hint=" ".join(cmd))
    return SpecRun(proc.stdout.strip(), int(drafted.group(1)), int(accepted.group(1)), proc.peak_rss_bytes,
                   proc.seconds, err)


#: common's debug line for each drafted token (-lv 5): the sequence, its position, the token
DRAFTED = re.compile(r"seq_id (\d+), draft candidate\s+0, pos\s+(\d+):\s+(-?\d+)")


def drafted_chains(log: str) -> dict[int, list[list[int]]]:
    """Each sequence's drafted chains in order, from a -lv 5 log."""
    chains: dict[int, list[list[int]]] = {}
    last: dict[int, int] = {}
    for seq, pos, tok in (map(int, m.groups()) for m in DRAFTED.finditer(log)):
        if pos <= last.get(seq, -1) or seq not in chains:       # a new draft of this sequence
            chains.setdefault(seq, []).append([])
        chains[seq][-1].append(tok)
        last[seq] = pos
    return chains


def chain_breaks(log: str, table: dict[int, int]) -> tuple[int, list[str]]:
    """Every drafted chain in a -lv 5 log against the Markov table the bigram draft was given: where
    a token's predecessor in the chain has an entry, the token is that entry (strength 40 outweighs
    the base logits). (positions checked, the chains that break it)."""
    checked, breaks = 0, []
    for chain in (c for chains in drafted_chains(log).values() for c in chains):
        known = [(a, b) for a, b in zip(chain, chain[1:]) if a in table]
        checked += len(known)
        breaks += [str(chain)] if any(table[a] != b for a, b in known) else []
    return checked, breaks


def same_greedy_output(spec_text: str, alone_text: str) -> bool:
    """Equal, allowing the speculative run to overshoot -n (it may emit up to the draft length more)."""
    return spec_text.startswith(alone_text)


# ---------------------------------------------------------------------------------------
# llama-server with two parallel slots

class Server:
    """llama-server on a free loopback port, owned (processes.Owned): `close()` stops it."""

    def __init__(self, build: Path, target: Path, draft: Path | None, draft_max: int, flash_attn: bool,
                 p_min: float, log_path: Path, parallel: int = 2, threads: int = 2, extra: list[str] = (),
                 request_timeout: float = 300, load_timeout: float = 120, env: dict | None = None):
        self.port = free_port()
        self.request_timeout = request_timeout
        cmd = [str(program(build, "llama-server")), "-m", str(target), "--port", str(self.port),
               "--host", LOCALHOST, "-np", str(parallel), "-c", str(512 * parallel), "-t", str(threads),
               "-fa", "on" if flash_attn else "off", "--no-webui"]
        if draft is not None:
            cmd += ["-md", str(draft), "--spec-type", "draft-dspark", "--spec-draft-n-max", str(draft_max),
                    "--spec-draft-p-min", str(p_min)]
        self.cmd = cmd + list(extra)
        self.owned = Owned(self.cmd, log_path, env=env, name="llama-server")
        try:
            self.owned.wait_http(f"http://{LOCALHOST}:{self.port}/health", seconds=load_timeout)
        except BaseException:
            self.owned.stop()
            raise

    def _post(self, path: str, body: dict, timeout: float) -> dict:
        req = urllib.request.Request(f"http://{LOCALHOST}:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def complete(self, prompt: str, n_predict: int, seed: int = 1) -> dict:
        return self._post("/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
                                          "seed": seed, "cache_prompt": False}, self.request_timeout)

    def complete_all(self, prompts, n_predict: int, parallel: int = 2) -> list[dict]:
        """Keep `parallel` requests in flight at once, so both slots decode together."""
        results: list[dict | None] = [None] * len(prompts)
        errors: list[BaseException] = []
        lock = threading.Lock()
        queue = list(enumerate(prompts))

        def worker():
            while True:
                with lock:
                    if not queue:
                        return
                    i, p = queue.pop(0)
                try:
                    results[i] = self.complete(p, n_predict)
                except BaseException as err:      # surfaced below
                    errors.append(err)
                    return

        threads = [threading.Thread(target=worker) for _ in range(parallel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise ProofError(f"llama-server request failed: {errors[0]}", hint=" ".join(self.cmd))
        return results  # type: ignore[return-value]

    def tokenize(self, text: str) -> list[int]:
        """The server's own token ids for text (no special tokens added)."""
        return [int(t) for t in self._post("/tokenize", {"content": text}, 60)["tokens"]]

    def close(self):
        self.owned.stop()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# fixtures

def greedy_continuations(binary: Path, target: Path, prompts, work: Path, n_generate: int,
                         timeout: float = 300) -> list[np.ndarray]:
    """Target-alone greedy token ids (prompt + continuation) from the target-features program."""
    seqs = []
    for i, prompt in enumerate(prompts):
        out = Path(work) / f"gen{i}"
        _run([str(binary), "--target", str(target), "--layers", "0", "--prompt", prompt,
              "--generate", str(n_generate), "--out", str(out)], timeout)
        seqs.append(np.concatenate([np.load(out / "prompt.npy"), np.load(out / "generated.npy")]))
    return seqs


def bigram_table(seqs) -> dict[int, int]:
    """prev -> most frequent successor in the target's own greedy text."""
    counts: dict[int, dict[int, int]] = {}
    for s in seqs:
        for a, b in zip(s[:-1], s[1:]):
            counts.setdefault(int(a), {}).setdefault(int(b), 0)
            counts[int(a)][int(b)] += 1
    return {a: max(nexts, key=nexts.get) for a, nexts in counts.items()}


#: the draft of the quantized draft cache rows: a latent and a rope part of whole Q8_0 / Q4_0
#: blocks (32), which llama.cpp needs of a quantized K cache and of V, its view (the tiny
#: default's K head, 16 + 8, is refused)
BLOCK_DRAFT_CONFIG = {"kv_lora_rank": 32, "qk_rope_head_dim": 32}
#: the lossless drafts: the matrix's two, and with a quantized draft cache the block one
MATRIX_DRAFTS = ("bigram", "random")
ALL_DRAFTS = (*MATRIX_DRAFTS, "bigram-blocks")


def write_lossless_draft(tree: Path, work: Path, name: str, hidden: int, vocab: int, target_layer_ids,
                         bigrams: dict[int, int] | None, strength: float = 40.0, seed: int = 0,
                         overrides: dict | None = None) -> Path:
    """Convert a random K3 DSpark checkpoint (optionally with a bigram Markov head) to GGUF;
    `overrides` replaces keys of the tiny config."""
    import torch
    from safetensors.torch import load_file, save_file

    from llamacpp_mla_port.fixtures.checkpoint import k3_dspark_config, write_target_tokenizer_dir
    from llamacpp_mla_port.proof.run.convert import convert_checkpoint
    from llamacpp_mla_port.proof.parity import write_parity_checkpoint

    base = Path(work) / name
    out = base / "draft.gguf"
    if out.is_file():
        return out
    config = k3_dspark_config(hidden_size=hidden, vocab_size=vocab, target_layer_ids=list(target_layer_ids),
                              markov_rank=vocab if bigrams is not None else 8, **(overrides or {}))
    ckpt = write_parity_checkpoint(base / "checkpoint", config, seed=seed, dtype="float32")
    if bigrams is not None:
        path = ckpt / "model.safetensors"
        t = load_file(str(path))
        w1 = torch.zeros(vocab, vocab)
        w2 = torch.zeros(vocab, vocab)
        for prev, nxt in bigrams.items():
            w1[prev, prev] = 1.0
            w2[nxt, prev] = strength
        t["markov_head.markov_w1.weight"], t["markov_head.markov_w2.weight"] = w1, w2
        save_file(t, str(path), metadata={"format": "pt"})
    tok = write_target_tokenizer_dir(base / "target-tokenizer", config, seed=seed)
    convert_checkpoint(tree, ckpt, out, tok, extra_args=["--outtype", "f32"])
    return out


# ---------------------------------------------------------------------------------------
# the matrix

def render(ids) -> str:
    """The test tokenizer's text for token ids: each id in hex, concatenated."""
    return "".join(format(int(t), "x") for t in ids)


@dataclass
class LosslessPair:
    """The deep tiny Kimi-K3 target, its drafts and the target-alone texts of the prompts."""

    target: Path
    drafts: dict[str, Path]            # "bigram" (partly accepted), "random" (acceptance ~0), "bigram-blocks"
    prompts: list[str]
    alone: dict[str, tuple[str, str]]  # prompt -> (llama-simple's text, the continuation's text)
    bigrams: dict[int, int]            # the bigram draft's Markov table: prev -> next

    @property
    def bigram_entries(self) -> int:
        return len(self.bigrams)


def prepare_pair(tree: Path, build: Path, work: Path, base_target: Path, n_prompts: int = 20,
                 draft_names=MATRIX_DRAFTS) -> LosslessPair:
    """Target, drafts (the bigram draft learns from HALF the prompts) and target-alone texts."""
    from llamacpp_mla_port.proof.run.programs import compile_program
    from llamacpp_mla_port.proof.reference.model import read_target_head
    from llamacpp_mla_port.fixtures.target_variants import write_deep_kimi_k3_target

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    prompts = list(PROMPTS[:n_prompts])
    target = write_deep_kimi_k3_target(base_target, work / "target-deep.gguf", "MKKMKK", 2)
    embd, _ = read_target_head(target)
    vocab, hidden = embd.shape
    tf = compile_program("target-features", tree, build)
    seqs = greedy_continuations(tf, target, prompts, work / "greedy", N_PREDICT)
    n_prompt_ids = [len(s) - N_PREDICT for s in seqs]
    bigrams = bigram_table(seqs[: n_prompts // 2])          # learned from half the prompts only
    taps = [0, 2, 4]            # HF ids: llama.cpp target_layers [1, 3, 5], three residual blocks
    makers = {
        "bigram": lambda: write_lossless_draft(tree, work, "draft-bigram", hidden, vocab, taps, bigrams),
        "random": lambda: write_lossless_draft(tree, work, "draft-random", hidden, vocab, taps, None),
        "bigram-blocks": lambda: write_lossless_draft(tree, work, "draft-bigram-blocks", hidden, vocab, taps, bigrams,
                                                      overrides=BLOCK_DRAFT_CONFIG),
    }
    drafts = {name: makers[name]() for name in draft_names}
    alone = {}
    for p, s, n in zip(prompts, seqs, n_prompt_ids):
        text = target_alone(build, target, p)
        # llama-simple and the program's own greedy loop must agree before anything is compared
        if text != render(s):
            raise ProofError(f"llama-simple's greedy text for {p!r} differs from the target's greedy ids",
                             hint=f"{text!r} vs {render(s)!r}")
        alone[p] = (text, render(s[n:]))
    return LosslessPair(target, drafts, prompts, alone, bigrams)


def _matrix(draft_lengths, p_min_on: float):
    return [(k, fa, p) for k in draft_lengths for fa in (False, True) for p in (0.0, p_min_on)]


def _covering(draft_lengths, p_min_on: float):
    """Every draft length and every (flash attention, p_min) pair at least once: for 1/3/7,
    4 of the matrix's 12 (smoke --quick)."""
    pairs = [(False, 0.0), (True, p_min_on), (True, 0.0), (False, p_min_on)]
    n = max(len(draft_lengths), len(pairs))
    return [(draft_lengths[min(i, len(draft_lengths) - 1)], *pairs[i % len(pairs)]) for i in range(n)]


def run_lossless(tree: Path, build: Path, work: Path, base_target: Path, server: bool = True, simple: bool = True,
                 draft_lengths=(1, 3, 7), p_min_on: float = 0.5, n_prompts: int = 20, threads: int = 2,
                 log=print, extra=(), draft_cache: str | None = None, every_combination: bool = True) -> dict:
    """The whole lossless matrix; every mismatch is listed in the report (`n_mismatches`).
    `every_combination` False: the bigram draft runs each draft length and each (flash
    attention, p_min) pair once (_covering), the random one the longest length only.
    `extra` goes last on every speculative-simple and server command line (placement, e.g.
    `-ngl 99 -ngld 99` for target and draft on a GPU). `draft_cache` (a cache type, e.g.
    q8_0) adds speculative-simple rows of the bigram-blocks draft with that draft K/V cache
    (`-ctkd`/`-ctvd`) and with an F16 one, flash attention on, p_min 0: a quantized draft
    cache must stay lossless, and its acceptance is reported beside the F16 cache's."""
    t0 = time.monotonic()
    pair = prepare_pair(tree, build, work, base_target, n_prompts,
                        draft_names=ALL_DRAFTS if draft_cache else MATRIX_DRAFTS)
    prompts, target, drafts, alone = pair.prompts, pair.target, pair.drafts, pair.alone

    report: dict = {"n_prompts": len(prompts), "n_predict": N_PREDICT, "bigram_entries": pair.bigram_entries,
                    "target": "kimi-k3 MKKMKK (MLA/KDA hybrid), attn_res block 2", "taps_llama": [1, 3, 5],
                    "speculative_simple": [], "server": [], "placement": " ".join(map(str, extra)) or "default",
                    "every_combination": every_combination}
    mismatches: list[str] = []
    chain: tuple[int, list[str]] = (0, [])      # the bigram drafts' chains as the loops drafted them

    def check_chain(log: str) -> None:
        nonlocal chain
        checked, breaks = chain_breaks(log, pair.bigrams)
        chain = (chain[0] + checked, chain[1] + breaks)
    # the bigram draft runs the whole matrix; the random one (acceptance ~0) a corner of it
    combos = _matrix if every_combination else _covering
    plan = [("bigram", c) for c in combos(draft_lengths, p_min_on)]
    plan += [("random", (k, False, 0.0)) for k in draft_lengths[-2 if every_combination else -1:]]
    # --spec-draft-auto (spec-auto-length) up to the longest length: "-auto" names those runs
    plan += [(f"{d}-auto", (draft_lengths[-1], True, 0.0)) for d in MATRIX_DRAFTS]
    auto = {d: ["--spec-draft-auto"] if d.endswith("-auto") else [] for d, _ in plan}

    def simple_over_prompts(draft: Path, k: int, fa: bool, p_min: float, label: str, args=extra):
        """speculative-simple on every prompt: (identical, drafted, accepted); mismatches listed."""
        drafted = accepted = ok = 0
        for p in prompts:
            r = speculative_simple(build, target, draft, p, k, fa, p_min, threads=threads,
                                   extra=(*args, "-lv", "5"))
            if "bigram" in label:
                check_chain(r.log)
            drafted += r.n_drafted
            accepted += r.n_accepted
            if same_greedy_output(r.text, alone[p][0]):
                ok += 1
            else:
                mismatches.append(f"speculative-simple {label}: {p!r}: {r.text!r} != {alone[p][0]!r}")
        return ok, drafted, accepted

    for dname, (k, fa, p_min) in (plan if simple else []):
        ok, drafted, accepted = simple_over_prompts(drafts[dname.removesuffix("-auto")], k, fa, p_min,
                                                    f"{dname} k={k} fa={fa} p_min={p_min}", (*extra, *auto[dname]))
        report["speculative_simple"].append({"draft": dname, "draft_max": k, "flash_attn": fa, "p_min": p_min,
                                             "identical": ok, "of": len(prompts), "drafted": drafted,
                                             "accepted": accepted})
        log(f"lossless speculative-simple {dname} k={k} fa={'on' if fa else 'off'} p_min={p_min}: "
            f"{ok}/{len(prompts)} identical, drafted {drafted}, accepted {accepted}")
    if simple and draft_cache:
        report["draft_cache"] = []
        for k in draft_lengths:
            row: dict = {"draft": "bigram-blocks", "cache": draft_cache, "draft_max": k, "of": len(prompts)}
            for cache, key in (("f16", "f16_"), (draft_cache, "")):
                ok, drafted, accepted = simple_over_prompts(drafts["bigram-blocks"], k, True, 0.0,
                                                            f"bigram-blocks k={k} draft cache {cache}",
                                                            args=(*extra, "-ctkd", cache, "-ctvd", cache))
                row.update({f"{key}identical": ok, f"{key}drafted": drafted, f"{key}accepted": accepted})
            report["draft_cache"].append(row)
            log(f"lossless speculative-simple bigram-blocks k={k} draft cache {draft_cache}: "
                f"{row['identical']}/{len(prompts)} identical, drafted {row['drafted']}, accepted "
                f"{row['accepted']} (f16 cache: {row['f16_identical']} identical, {row['f16_drafted']}, "
                f"{row['f16_accepted']})")
    if server:
        for dname, (k, fa, p_min) in plan:
            log_path = work / f"server-{dname}-k{k}-fa{int(fa)}-p{p_min}.log"
            srv = Server(build, target, drafts[dname.removesuffix("-auto")], k, fa, p_min, log_path, threads=threads,
                         extra=[*extra, *auto[dname], "-lv", "5"])
            try:
                results = srv.complete_all(prompts, N_PREDICT)
            finally:
                srv.close()
            if dname.startswith("bigram"):
                check_chain(log_path.read_text(errors="replace"))
            ok = drafted = accepted = 0
            for p, res in zip(prompts, results):
                text, want = res.get("content", ""), alone[p][1]
                if same_greedy_output(text, want):
                    ok += 1
                else:
                    mismatches.append(f"server {dname} k={k} fa={fa} p_min={p_min}: {p!r}: {text!r} != {want!r}")
                timings = res.get("timings", {})
                drafted += int(timings.get("draft_n", 0))
                accepted += int(timings.get("draft_n_accepted", 0))
            report["server"].append({"draft": dname, "draft_max": k, "flash_attn": fa, "p_min": p_min,
                                     "parallel": 2, "identical": ok, "of": len(prompts), "drafted": drafted,
                                     "accepted": accepted})
            log(f"lossless server(-np 2) {dname} k={k} fa={'on' if fa else 'off'} p_min={p_min}: "
                f"{ok}/{len(prompts)} identical, drafted {drafted}, accepted {accepted}")
    report["chain"] = {"checked": chain[0], "n_breaks": len(chain[1]), "breaks": chain[1][:5]}
    report["mismatches"] = mismatches[:20]
    report["n_mismatches"] = len(mismatches)
    report["seconds"] = round(time.monotonic() - t0, 1)
    return report
