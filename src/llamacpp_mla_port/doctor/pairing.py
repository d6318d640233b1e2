"""The checks of a draft against its target: the tapped target layers, and with --target the
target's own header and how far the two embedding tables are apart."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from llamacpp_mla_port.doctor.findings import (ARCH, ERROR, K3_N_EMBD, K3_TARGET_LAYERS, KNOWN_TAPS, OK, WARNING,
                                               Context, TOK, Finding, _int, _vocab_size, key)
from llamacpp_mla_port.gguf.header import tensor_rows


def check_target_layers(ctx: Context) -> Iterable[Finding]:
    d, hp = ctx.draft, ctx.hp
    kv = d.kvs.get(key("target_layers"))
    ids_hint = ("2,23,47,71,89" if ctx.layout == "mla" and hp["embedding_length"] == K3_N_EMBD
                else "<config.json target_layer_ids, 0-based>")
    fix = f"{ctx.fix_hint} --target-layers {ids_hint} (or --from-config config.json); the +1 is applied for you"
    if kv is None:
        yield Finding("target_layers", ERROR, "dflash.target_layers missing",
                      "llama.cpp: \"DFlash model requires 'target_layers' in GGUF metadata\"", fix)
        return
    if not kv.is_int_array():
        yield Finding("target_layers", ERROR, f"dflash.target_layers has the wrong type ({kv.type_name})",
                      "llama.cpp reads an integer array", fix)
        return
    ids = list(kv.value)
    n_embd, fc_in = hp["embedding_length"], hp["fc_in"]
    problems, notes = [], []
    if not ids:
        problems.append("the list is empty")
    if n_embd and fc_in is not None:
        if fc_in % n_embd:
            problems.append(f"fc.weight input width {fc_in} is not a multiple of n_embd {n_embd}")
        elif len(ids) != fc_in // n_embd:
            problems.append(
                f"{len(ids)} ids but fc.weight takes {fc_in // n_embd} taps ({fc_in} = {fc_in // n_embd} x {n_embd}): "
                f"llama.cpp sizes fc's input as {len(ids)} x {n_embd} = {len(ids) * n_embd} and the file "
                "fails to load (wrong shape for fc.weight)")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        problems.append("ids are not strictly increasing")
    if any(i < 0 for i in ids):
        problems.append("negative ids")
    if 0 in ids:
        # loadable (layer 0's input is the token embedding), but no trained draft taps it
        notes.append("id 0 taps the token embeddings: llama.cpp accepts it, but under the +1 "
                     "convention (HF id + 1) no trained tap is 0 -- was the +1 forgotten?")
    hf = [i - 1 for i in ids]
    for name, taps in KNOWN_TAPS.items():
        if ids == taps:
            problems.append(f"these are {name}'s HF ids WITHOUT the +1 (llama.cpp stores {[i + 1 for i in taps]})")
        elif hf == taps:
            notes.append(f"= {name}'s published target_layer_ids {taps} + 1")
    if len(ids) > 1 and ids == list(range(ids[0], ids[0] + len(ids))) and len(ids) >= 3:
        notes.append("consecutive shallow ids look like a placeholder, not trained taps")
        if ctx.layout == "mla" and n_embd == K3_N_EMBD:
            problems.append(f"consecutive ids {ids}: Kimi-K3-DSpark taps HF layers "
                            f"{KNOWN_TAPS['Inferact/Kimi-K3-DSpark (MLA)']} (GGUF: [3, 24, 48, 72, 90])")
    if ctx.target is not None:
        t_layers = _int(ctx.target, f"{ctx.target.arch}.block_count")
        if t_layers is not None:
            outside = [i for i in ids if not 0 <= i < t_layers]
            if outside:
                problems.append(f"ids {outside} are outside the target's layer inputs 1..{t_layers - 1} "
                                f"(target has {t_layers} layers)" +
                                ("; the last one is one past the end: +1 applied twice?"
                                 if ids and ids[-1] == t_layers else ""))
    elif ids and max(ids) >= K3_TARGET_LAYERS and n_embd == K3_N_EMBD:
        problems.append(f"id {max(ids)} is past Kimi-K3's {K3_TARGET_LAYERS} layers")
    if problems:
        yield Finding("target_layers", ERROR, f"dflash.target_layers {ids} is wrong", "; ".join(problems + notes), fix)
    elif 0 in ids:
        yield Finding("target_layers", WARNING, f"dflash.target_layers {ids} taps the embeddings",
                      "; ".join(notes), fix)
    else:
        yield Finding("target_layers", OK, f"dflash.target_layers {ids}",
                      f"{len(ids)} taps = fc input {fc_in} / n_embd {n_embd}; strictly increasing; "
                      f"HF ids {hf} (+1 convention)" + ("; " + "; ".join(notes) if notes else "")
                      + ("" if ctx.target else "; give --target to check them against the target's layers"))


# --- with --target --------------------------------------------------------------------

def check_target(ctx: Context) -> Iterable[Finding]:
    t = ctx.target
    if t is None:
        return
    d, hp = ctx.draft, ctx.hp
    tarch = t.arch
    if tarch is None or tarch == ARCH:
        yield Finding("target", ERROR, f"--target is not a target model (architecture {tarch!r})",
                      "the target is the big model the draft speculates for (Kimi-K3: 'kimi-k3')",
                      "pass the target GGUF to --target")
        return
    t_embd = _int(t, f"{tarch}.embedding_length")
    if t_embd != hp["embedding_length"]:
        yield Finding("target_n_embd", ERROR, "n_embd differs between draft and target",
                      f"draft {hp['embedding_length']}, target {t_embd} ({tarch}.embedding_length)",
                      "this draft belongs to another target")
    else:
        yield Finding("target_n_embd", OK, f"n_embd {t_embd} on both sides",
                      f"feature rows are n_taps x {t_embd} floats")
    t_vocab, t_src = _vocab_size(t, tarch)
    sizes = f"draft {hp['n_vocab']} ({hp['n_vocab_source']}), target {t_vocab} ({t_src})"
    if t_vocab is None or hp["n_vocab"] is None or hp["n_vocab"] > t_vocab:
        yield Finding("target_vocab", ERROR, "the draft's vocabulary is not inside the target's",
                      f"{sizes}; the draft would propose tokens the target does not have: llama.cpp "
                      "refuses the pair", "use the draft converted for this target")
    elif hp["n_vocab"] < t_vocab and "token_embd.weight" in d.tensors:
        yield Finding("target_vocab", WARNING, "the draft's token table does not cover the target's ids",
                      f"{sizes}; the target's token ids index the draft's own token_embd: llama.cpp "
                      f"rejects a draft block whose anchor is above {hp['n_vocab'] - 1}, and drafts nothing "
                      "for it", "use the draft converted for this target")
    elif hp["n_vocab"] < t_vocab:
        yield Finding("target_vocab", WARNING, "the draft's vocabulary is smaller than the target's",
                      f"{sizes}; the draft never proposes the target's ids above {hp['n_vocab'] - 1}",
                      "use the draft converted for this target")
    else:
        yield Finding("target_vocab", OK, f"vocabulary {t_vocab} on both sides", f"{t_src}")
    diffs = [f"{k}: draft {d.get(k)!r}, target {t.get(k)!r}" for k in (TOK.MODEL, TOK.PRE, TOK.BOS_ID, TOK.EOS_ID)
             if d.get(k) != t.get(k)]
    minor = []
    for k in (TOK.LIST, TOK.MERGES, TOK.TOKEN_TYPE):
        if d.value_sha256(k) != t.value_sha256(k):
            text = f"{k} differs (sha256 {str(d.value_sha256(k))[:12]} vs {str(t.value_sha256(k))[:12]})"
            # llama.cpp's draft/target compatibility compares vocab type, bos/eos and token
            # texts; merges and token types only matter if the draft's tokenizer is used
            (diffs if k == TOK.LIST else minor).append(text)
    if not diffs and minor:
        yield Finding("target_tokenizer", WARNING, "tokenizers agree on tokens, differ in detail",
                      "; ".join(minor) + "; the draft's own tokenizer is not used to tokenize "
                      "when it drafts for this target",
                      "reconvert the draft with --target-model-dir pointing at this target")
    elif diffs:
        yield Finding("target_tokenizer", ERROR, "tokenizers differ", "; ".join(diffs),
                      "reconvert the draft with --target-model-dir pointing at this target")
    else:
        yield Finding("target_tokenizer", OK, "tokenizers identical",
                      "model, pre, bos/eos, tokens, merges and token types match byte for byte")
    ids = d.get(key("target_layers")) or []
    t_layers = _int(t, f"{tarch}.block_count")
    if isinstance(ids, list) and t_layers is not None:
        if all(isinstance(i, int) and 0 <= i < t_layers for i in ids):     # check_target_layers' range
            note = (" The unpatched kimi-k3 graph never records layer inputs (defect 5): "
                    "needs this port." if tarch == "kimi-k3" else "")
            outputs = [i - 1 if i else "token_embd" for i in ids]
            yield Finding("target_taps", OK, f"taps {ids} exist in the {t_layers}-layer target",
                          f"inputs of target layers {ids} = outputs of {outputs}.{note}")
        # the out-of-range case is reported by check_target_layers
    yield from _embedding_distance(ctx)


def _embedding_distance(ctx: Context) -> Iterable[Finding]:
    d, t = ctx.draft, ctx.target
    assert t is not None
    if "token_embd.weight" not in d.tensors:
        yield Finding("embedding_distance", OK, "no draft embeddings to compare",
                      "the draft is stripped: the target's table is used, nothing can differ")
        return
    if "token_embd.weight" not in t.tensors:
        yield Finding("embedding_distance", WARNING, "the target has no token_embd to compare with",
                      f"target tensors: {len(t.tensors)}", None)
        return
    ds, tshape = d.tensors["token_embd.weight"], t.tensors["token_embd.weight"]
    if ds.shape != tshape.shape:
        yield Finding("embedding_distance", ERROR, "embedding tables have different shapes",
                      f"draft {list(ds.shape)}, target {list(tshape.shape)}", "wrong pairing")
        return
    try:
        max_abs, sum_abs, n = 0.0, 0.0, 0
        for a, b in zip(tensor_rows(d, "token_embd.weight"), tensor_rows(t, "token_embd.weight")):
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            max_abs = max(max_abs, float(diff.max(initial=0.0)))
            sum_abs += float(diff.sum())
            n += diff.size
    except Exception as err:  # a GGUFError for quantized tables
        yield Finding("embedding_distance", WARNING, "embedding tables not compared", str(err), None)
        return
    mean_abs = sum_abs / max(1, n)
    types = f"draft {ds.type_name}, target {tshape.type_name}"
    if max_abs == 0.0:
        yield Finding("embedding_distance", OK, "draft embeddings identical to the target's",
                      f"max |diff| 0, mean |diff| 0 over {n} values ({types}): a frozen copy, "
                      "stripping it loses nothing")
    else:
        yield Finding("embedding_distance", WARNING, "draft embeddings differ from the target's",
                      f"max |diff| {max_abs:.6g}, mean |diff| {mean_abs:.6g} over {n} values ({types}); "
                      "a type conversion alone gives small differences",
                      "keep the draft's table only if it was trained; otherwise strip it")
