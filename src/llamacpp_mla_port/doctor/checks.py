"""The checks `doctor` runs on a DFlash/DSpark draft GGUF: a table of small functions.

Each check takes the `Context` (the validated header of the draft, optionally the
target's, and the hyperparameters derived once) and returns zero or more `Finding`s:
a verdict (ok / warning / error), the evidence read from the file, and the fix.

What the loader insists on (the keys it reads as required, the tensors it creates, the
tokenizer models and which of them need merges, the per-token arrays, the rope scaling
types) comes from the loader itself: `loader_table` reads it from the patched tree's
sources into data/loader_table.json, and the checks below read that table. CONDITIONS says
how the doctor reads each `if` of the loader that the table carries. The rest are the
doctor's own semantic checks (wrong taps, YaRN, the Kimi-K3 specifics), which the runtime
cannot see; tests/proof/test_differential.py lists where they make the doctor stricter.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

from gguf.constants import GGUFValueType

from llamacpp_mla_port.doctor.findings import (ARCH, ERROR, K3_BLOCK, K3_N_EMBD, K3_VOCAB, OK, SEVERITY, WARNING,
                                               Context, TOK, Finding, _int, _num, _shape, key)
from llamacpp_mla_port.doctor.layout import detect, expected_tensors, optional_shapes
from llamacpp_mla_port.doctor.loader_rules import loader, loader_required_keys, loader_tensors
from llamacpp_mla_port.doctor.pairing import check_target, check_target_layers
from llamacpp_mla_port.gguf.header import GGUFHeader


# --- the checks ---------------------------------------------------------------------------

def check_arch(ctx: Context) -> Iterable[Finding]:
    d, hp = ctx.draft, ctx.hp
    arch = d.arch
    if arch is None:
        yield Finding("arch", ERROR, "no general.architecture",
                      "the file has no (string) general.architecture key: llama.cpp cannot load it",
                      "reconvert the checkpoint with a current converter")
        return
    if ctx.layout == "not-a-draft":
        extra = (" (that is a Kimi-K3 TARGET: pass it as --target)" if arch == "kimi-k3" else "")
        yield Finding("arch", ERROR, f"not a DFlash/DSpark draft: architecture {arch!r}{extra}",
                      f"general.architecture = {arch!r}, {len(d.tensors)} tensors; a draft has "
                      f"architecture {ARCH!r} and fc / markov_w1 tensors",
                      "pass the draft GGUF (converted with the DSpark converter) as the first argument")
        return
    dspark = "markov_w1.weight" in d.tensors
    kind = "DSpark" if dspark else "DFlash (no Markov head)"
    n_layer = hp["block_count"]
    if ctx.layout == "mla":
        desc = f"MLA {kind} draft ({n_layer} layers): the Kimi-K3 DSpark layout this port adds"
        variant = _variant_note(ctx)
        yield Finding("arch", OK if dspark else WARNING, desc,
                      f"general.architecture = 'dflash'; *_mla keys / attn_kv_a_mqa tensors present"
                      f"{variant}. Needs the patched llama.cpp (this port): the unpatched base fails with "
                      "a missing blk.0.attn_q.weight",
                      None if dspark else "a K3 DSpark draft has markov_w1/markov_w2: wrong checkpoint?")
    elif ctx.layout == "qwen3":
        yield Finding("arch", OK if dspark else WARNING,
                      f"Qwen3-style {kind} draft ({n_layer} layers, GQA attn_q/attn_k/attn_v)",
                      "general.architecture = 'dflash' with blk.0.attn_q.weight: the backbone upstream "
                      "llama.cpp already runs (e.g. RadixArk's Kimi-K3 DSpark); not the MLA draft this "
                      "port adds, and it does not need the port's MLA path",
                      None if dspark else "a DSpark draft has markov_w1/markov_w2: is this plain DFlash?")
    elif ctx.layout == "dsv4":
        yield Finding("arch", OK, f"DeepSeek-V4 {kind} draft (hyper-connections)",
                      f"dflash.hyper_connection.count = {hp['hyper_connection.count']}: upstream's DSV4 path", None)
    else:
        yield Finding("arch", ERROR, "dflash draft with an unknown attention backbone",
                      "neither blk.0.attn_q.weight (Qwen3-style) nor blk.0.attn_kv_a_mqa.weight (MLA) "
                      "nor dflash.hyper_connection.count (DeepSeek-V4)",
                      "reconvert with a converter that knows this checkpoint")


def _variant_note(ctx: Context) -> str:
    hp = ctx.hp
    url = ctx.draft.get("general.source.url")      # the converter names the published checkpoint from its hashes
    source = (f"; converted from the published Inferact/Kimi-K3-DSpark, revision {url.rsplit('/', 1)[-1][:8]}"
              if isinstance(url, str) and "Inferact/Kimi-K3-DSpark/tree/" in url else
              "; not named the published Inferact/Kimi-K3-DSpark revision (no general.source.url from its hashes)")
    if hp["block_count"] == 3 and hp["attention.head_count"] == 96:
        return "; 3 layers x 96 heads looks like Inferact's Block5 variant, not Kimi-K3-DSpark" + source
    if hp["embedding_length"] == K3_N_EMBD and hp["n_vocab"] == K3_VOCAB:
        return f"; n_embd {K3_N_EMBD} and vocab {K3_VOCAB} match Kimi-K3" + source
    return source


def _short(names: list[str], n: int = 8) -> str:
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def check_tensors(ctx: Context) -> Iterable[Finding]:
    d, hp = ctx.draft, ctx.hp
    for k in ("embedding_length", "block_count", "attention.head_count", "feed_forward_length"):
        if hp[k] is None:
            yield Finding("tensors", ERROR, f"{key(k)} missing or not an integer",
                          f"{key(k)} = {d.get(key(k))!r}: llama.cpp reads it to size every tensor",
                          "reconvert: the converter writes it from config.json")
    exp = expected_tensors(ctx)
    loader_required, loader_optional = loader_tensors(ctx)
    # the loader's tensors, plus what this port's layout needs on top (the K3 DSpark heads)
    required = loader_required + [n for n in exp if n not in loader_required]
    present = set(d.tensors)
    missing = [n for n in required if n not in present]
    unknown = sorted(present - set(required) - loader_optional)
    count = f"{len(present)} tensors ({len(required)} required for this layout)"
    if missing:
        yield Finding("tensors", ERROR, f"{len(missing)} required tensors missing",
                      f"{count}; missing: {_short(missing)}. llama.cpp stops at the first one",
                      "reconvert with the converter of this port")
    if unknown:
        verdict = ERROR if ctx.layout == "mla" else WARNING
        why = ("blk.*.attn_kv_b: the unsplit kv_b must be split into attn_k_b/attn_v_b. "
               if any(n.endswith("attn_kv_b.weight") for n in unknown) else "")
        yield Finding("tensors", verdict, f"{len(unknown)} tensors the runtime does not know",
                      f"{why}unknown: {_short(unknown)}. llama.cpp refuses files with unused tensors, "
                      "and engines that skip unknown names silently lose acceptance",
                      "reconvert with the converter of this port (names from the GGUF contract)")
    layer_ids = {int(n.split(".")[1]) for n in present if n.startswith("blk.") and n.split(".")[1].isdigit()}
    if hp["block_count"] is not None and layer_ids and max(layer_ids) + 1 != hp["block_count"]:
        yield Finding("tensors", ERROR, "block_count disagrees with the blk.* tensors",
                      f"{key('block_count')} = {hp['block_count']}, tensors go up to blk.{max(layer_ids)}",
                      "reconvert (num_hidden_layers in config.json)")
    if not missing and not unknown:
        yield Finding("tensors", OK, "all required tensors present, none unknown", count)


def check_shapes(ctx: Context) -> Iterable[Finding]:
    bad = []
    for name, want in {**expected_tensors(ctx), **optional_shapes(ctx)}.items():
        got = _shape(ctx.draft, name)
        if got is None or want is None:
            continue
        if tuple(got) != want and not (len(want) == 1 and len(got) == 1 and got == want):
            bad.append(f"{name} {list(got)} != {list(want)}")
    if bad:
        yield Finding("shapes", ERROR, f"{len(bad)} tensors have the wrong shape (ggml ne order)",
                      "; ".join(bad[:6]) + (f" (+{len(bad) - 6} more)" if len(bad) > 6 else ""),
                      "the metadata and the weights disagree: reconvert from the checkpoint")
    else:
        yield Finding("shapes", OK, "tensor shapes agree with the metadata",
                      f"n_embd {ctx.hp['embedding_length']}, n_ff {ctx.hp['feed_forward_length']}, "
                      f"heads {ctx.hp['attention.head_count']}, markov rank {ctx.hp['markov_rank']}, "
                      f"vocab {ctx.hp['n_vocab']} ({ctx.hp['n_vocab_source']})")


def check_loader_keys(ctx: Context) -> Iterable[Finding]:
    want = loader_required_keys(ctx)
    missing = [k for k in want if k["key"] not in ctx.draft.kvs]
    if missing:
        names = [k["key"] for k in missing]
        many = len(missing) > 1
        yield Finding("loader_keys", ERROR, f"{len(missing)} key{'s' if many else ''} llama.cpp requires "
                      f"{'are' if many else 'is'} missing",
                      f"{_short(names)}: the loader stops with \"key not found in model: {names[0]}\" "
                      f"(read in {missing[0]['in']})",
                      "reconvert with a current converter (it writes them from config.json)")
    else:
        yield Finding("loader_keys", OK, f"the {len(want)} keys llama.cpp requires are present",
                      ", ".join(k["key"] for k in want))


def check_tensor_types(ctx: Context) -> Iterable[Finding]:
    rule = loader()["f32_only"]
    bad = [f"{t.name} ({t.type_name})" for t in ctx.draft.tensors.values()
           if (len(t.shape) <= rule["max_dims"] or t.name.endswith(rule["suffix"])) and t.type_name != "F32"]
    if bad:
        yield Finding("tensor_types", ERROR, f"{len(bad)} vector or norm weight tensor{'s' if len(bad) > 1 else ''} "
                      "not F32",
                      f"{_short(bad)}: llama.cpp's converter always writes 1-D tensors and *{rule['suffix']} as "
                      "F32 (\"most of the codebase that takes in 1D tensors or norms only handles F32\"); the CPU "
                      "backend aborts multiplying by an F16 norm", "reconvert (or requantize) with llama.cpp's tools")
    else:
        yield Finding("tensor_types", OK, "vectors and norm weights are F32", f"rule: {rule}")


def check_mla_dims(ctx: Context) -> Iterable[Finding]:
    hp = ctx.hp
    need = ("attention.q_lora_rank", "attention.kv_lora_rank", "attention.key_length_mla", "attention.value_length_mla",
            "rope.dimension_count", "attention.key_length", "attention.value_length", "attention.head_count_kv")
    problems = [f"{key(k)} missing" for k in need if hp[k] is None]
    if not problems:
        kv_lora, rope = hp["attention.kv_lora_rank"], hp["rope.dimension_count"]
        k_mla, v_mla = hp["attention.key_length_mla"], hp["attention.value_length_mla"]
        if hp["attention.head_count_kv"] != 1:
            problems.append(f"head_count_kv = {hp['attention.head_count_kv']}, MLA stores one big head: 1")
        if hp["attention.key_length"] != kv_lora + rope:
            problems.append(f"key_length = {hp['attention.key_length']}, expected {kv_lora + rope} "
                            f"(kv_lora_rank {kv_lora} + rope.dimension_count {rope})")
        if hp["attention.value_length"] != kv_lora:
            problems.append(f"value_length = {hp['attention.value_length']}, expected kv_lora_rank {kv_lora}")
        if not 0 < rope < k_mla or rope % 2:
            problems.append(f"rope.dimension_count = {rope} must be even and below key_length_mla {k_mla}")
        if hp["attention.q_lora_rank"] <= 0 or kv_lora <= 0 or v_mla <= 0:
            problems.append("q_lora_rank, kv_lora_rank and value_length_mla must be > 0")
    if problems:
        yield Finding("mla_dims", ERROR, "MLA dimensions are inconsistent",
                      "; ".join(problems) + ". The patched runtime refuses the file naming the key",
                      "reconvert with this port's converter (GGUF contract: head_count_kv 1, "
                      "key_length = kv_lora + rope, value_length = kv_lora)")
    else:
        nope = hp["attention.key_length_mla"] - hp["rope.dimension_count"]
        yield Finding("mla_dims", OK, "MLA dimensions coherent",
                      f"{hp['attention.head_count']} heads x (nope {nope}"
                      f" + rope {hp['rope.dimension_count']}), v {hp['attention.value_length_mla']}, "
                      f"q_lora {hp['attention.q_lora_rank']}, kv_lora {hp['attention.kv_lora_rank']}; "
                      f"cache row {hp['attention.key_length']} (K only)")


def check_block_size(ctx: Context) -> Iterable[Finding]:
    kv = ctx.draft.kvs.get(key("block_size"))
    markov = "markov_w1.weight" in ctx.draft.tensors
    fix = f"{ctx.fix_hint} --block-size 7 (Kimi-K3-DSpark drafts 7 tokens: anchor + 6 masks)"
    if kv is None:
        yield Finding("block_size", ERROR if markov else WARNING, "dflash.block_size missing",
                      "the HF config has no block_size; the converter must write it"
                      + (" and the Markov head asserts it at runtime" if markov else "")
                      + " (upstream's converter falls back to 16, wrong for this draft)", fix)
        return
    if not kv.is_int() or not 1 < kv.value <= 64:
        yield Finding("block_size", ERROR, f"dflash.block_size = {kv.value!r} ({kv.type_name})",
                      "must be an integer in 2..64", fix)
        return
    if ctx.layout == "mla" and ctx.hp["embedding_length"] == K3_N_EMBD and kv.value != K3_BLOCK:
        yield Finding("block_size", WARNING, f"dflash.block_size = {kv.value}",
                      f"Kimi-K3-DSpark was trained with blocks of {K3_BLOCK}; a block longer than "
                      "block_size silently skips the Markov head", fix)
        return
    yield Finding("block_size", OK, f"dflash.block_size = {kv.value}", f"anchor + {kv.value - 1} masks per draft step")


def check_mask_token(ctx: Context) -> Iterable[Finding]:
    d = ctx.draft
    kv = d.kvs.get(TOK.MASK_ID)
    n_vocab = ctx.hp["n_vocab"]
    fix = f"{ctx.fix_hint} --from-config config.json (reads mask_token_id)"
    if kv is None:
        yield Finding("mask_token", ERROR, "tokenizer.ggml.mask_token_id missing",
                      "the block is [anchor, MASK x (block_size-1)]; llama.cpp does not check the "
                      "id and drafts garbage without it", fix)
        return
    if not kv.is_int():
        yield Finding("mask_token", ERROR, f"mask_token_id has the wrong type ({kv.type_name})",
                      "must be an unsigned integer", fix)
        return
    if n_vocab is None or not 0 <= kv.value < n_vocab:
        yield Finding("mask_token", ERROR, f"mask token {kv.value} is outside the vocabulary",
                      f"vocab size {n_vocab} ({ctx.hp['n_vocab_source']})", fix)
        return
    tokens = d.kvs.get(TOK.LIST)
    text = f" = {tokens.value[kv.value]!r}" if tokens is not None and tokens.item_type == GGUFValueType.STRING else ""
    yield Finding("mask_token", OK, f"mask token {kv.value}{text}",
                  f"inside the vocabulary of {n_vocab} ({ctx.hp['n_vocab_source']})")


def check_rope(ctx: Context) -> Iterable[Finding]:
    d, hp = ctx.draft, ctx.hp
    stype = d.get(key("rope.scaling.type"))
    if stype is not None and stype not in loader()["rope_scaling_types"]:
        yield Finding("rope", ERROR, f"rope.scaling.type = {stype!r} is not a type llama.cpp knows",
                      f"llama.cpp knows {loader()['rope_scaling_types']} and aborts on anything else "
                      "(GGML_ASSERT in llama_model_base::load_hparams)", "reconvert; YaRN drafts write 'yarn'")
        return
    if ctx.layout == "qwen3":
        n_rot = hp["rope.dimension_count"]
        head = hp["attention.key_length"]
        if head is None and hp["embedding_length"] and hp["attention.head_count"]:
            head = hp["embedding_length"] // hp["attention.head_count"]
        n_rot = head if n_rot is None else n_rot
        if n_rot is None or head is None or not (0 < n_rot <= head and n_rot % 2 == 0):
            yield Finding("rope", ERROR, f"rope.dimension_count = {n_rot} does not fit the head ({head})",
                          "the rotated dimensions must be even and 1..key_length; the upstream DFlash path "
                          "does not check and aborts (GGML_ASSERT in ggml_rope) or hangs at the first decode",
                          "reconvert: rope.dimension_count is the head dimension for Qwen3-style drafts")
            return
        yield Finding("rope", OK, "RoPE: NeoX rotation (upstream DFlash default)",
                      f"rope.freq_base = {d.get(key('rope.freq_base'))}, scaling "
                      f"{d.get(key('rope.scaling.type'), 'none')}, {n_rot} of {head} dimensions rotated")
        return
    if ctx.layout != "mla":
        return
    problems, warnings = [], []
    base = _num(d, key("rope.freq_base"))
    if base is None:
        warnings.append("rope.freq_base missing (llama.cpp falls back to 10000; Kimi-K3-DSpark uses 50000)")
    factor = _num(d, key("rope.scaling.factor"))
    logmul = _num(d, key("rope.scaling.yarn_log_multiplier"))
    orig = _int(d, key("rope.scaling.original_context_length"))
    m = 1.0
    if stype is None:
        warnings.append("no rope.scaling.type: no YaRN (the pinned config has YaRN factor 32 over 32768)")
    elif stype == "yarn":
        if factor is None:
            problems.append("rope.scaling.factor missing")
        elif factor > 1:
            if orig is None:
                problems.append("rope.scaling.original_context_length missing")
            if logmul is None:
                problems.append("rope.scaling.yarn_log_multiplier missing: ggml then scales cos/sin and "
                                "the attention scale lacks mscale^2 (measured NMSE 0.09)")
            elif abs(logmul - 0.1) < 1e-6:
                problems.append("yarn_log_multiplier = 0.1: DeepSeek-V2's x0.1 form; this runtime takes "
                                "mscale_all_dim verbatim (1.0)")
            else:
                m = 1 + 0.1 * logmul * math.log(factor)
    elif stype not in ("none", "linear"):
        warnings.append(f"rope.scaling.type = {stype!r}, expected 'yarn'")
    k_mla = hp["attention.key_length_mla"]
    style = ("INTERLEAVED pairs (LLAMA_ROPE_TYPE_NORM): the patched runtime selects it for the MLA "
             "backbone, no key in the file; an unpatched dflash uses NeoX (measured NMSE 0.37, no error)")
    ev = (f"type {stype}, factor {factor}, original ctx {orig}, log multiplier {logmul}, "
          f"freq_base {base}; attention scale m^2/sqrt({k_mla}) with m = {m:.7g}; rotation {style}")
    if problems:
        yield Finding("rope", ERROR, "RoPE/YaRN metadata incomplete or wrong", "; ".join(problems) + ". " + ev,
                      "reconvert with this port's converter (writes the DeepSeek-YaRN keys)")
    elif warnings:
        yield Finding("rope", WARNING, "RoPE/YaRN metadata unusual", "; ".join(warnings) + ". " + ev,
                      "check the config.json revision the file was converted from")
    else:
        yield Finding("rope", OK, "DeepSeek-YaRN keys present", ev)


#: the scales the Qwen3-style DFlash graph applies and the MLA graph does not: the loader
#: refuses an MLA draft that sets one (dflash.cpp, dflash_load_mla_hparams)
MLA_REFUSED_SCALES = ("embedding_scale", "attention.scale", "attention.value_scale")


def check_scales(ctx: Context) -> Iterable[Finding]:
    d = ctx.draft
    found = [(k, v) for k in MLA_REFUSED_SCALES if (v := _num(d, key(k))) not in (None, 0.0)]
    if found:
        yield Finding("scales", ERROR, f"{key(found[0][0])} = {found[0][1]:.7g}: llama.cpp refuses the file",
                      "the MLA graph applies no embedding, attention or attention-value scale (its attention "
                      "scale comes from the YaRN keys and the context's attn_factor, as deepseek2's); set: "
                      + ", ".join(f"{key(k)} = {v:.7g}" for k, v in found),
                      "remove the key(s): reconvert with this port's converter, which writes none")
        return
    yield Finding("scales", OK, "no embedding, attention or attention-value scale",
                  "none is applied by the MLA graph, and the loader refuses a file that sets one")


def check_embeddings(ctx: Context) -> Iterable[Finding]:
    d = ctx.draft
    if "token_embd.weight" not in d.tensors:
        yield Finding("embeddings", OK, "embeddings stripped (no token_embd)",
                      "the block (anchor + MASK tokens) is embedded with the TARGET's token table "
                      "through the target context (ctx_other); the draft does see token ids, "
                      "it just borrows the table (the seed card is wrong on this)")
        return
    s = _shape(d, "token_embd.weight")
    yield Finding("embeddings", OK, f"embeddings kept: token_embd {list(s or ())}",
                  "the draft embeds the block with its OWN table instead of the target's; "
                  "give --target to measure how far the two tables are apart")


def check_tied_head(ctx: Context) -> Iterable[Finding]:
    ts = ctx.draft.tensors
    if "token_embd.weight" in ts and "output.weight" not in ts:
        yield Finding("tied_head", WARNING, "tied-head trap: token_embd kept, no output",
                      "upstream dflash ties the missing output head to token_embd (the MLA path too); "
                      "Kimi-K3's lm_head is untied, so the draft would score with the embedding matrix",
                      "strip token_embd (the target's head and table are used) or add output.weight")
    elif "output.weight" in ts:
        yield Finding("tied_head", OK, "draft ships its own output head",
                      "output.weight is used instead of the target's lm_head")
    else:
        yield Finding("tied_head", OK, "no token_embd, no output: lm_head from the target", "untied, as Kimi-K3")


def check_tokenizer(ctx: Context) -> Iterable[Finding]:
    d = ctx.draft
    model = d.get(TOK.MODEL)
    tokens = d.kvs.get(TOK.LIST)
    if tokens is not None and tokens.item_type != GGUFValueType.STRING:
        yield Finding("tokenizer", ERROR, f"tokenizer.ggml.tokens has the wrong type ({tokens.type_name})",
                      "llama.cpp reads an array of strings", "reconvert with the target's tokenizer")
        return
    if model is None or tokens is None:
        yield Finding("tokenizer", ERROR, "the draft carries no tokenizer",
                      "tokenizer.ggml.model / tokenizer.ggml.tokens missing: llama.cpp needs a vocab in "
                      "the draft and reads the mask id from it",
                      "reconvert with --target-model-dir pointing at the target (tokenizer inheritance)")
        return
    vocab = loader()["vocab"]
    spec = vocab["models"].get(model) if isinstance(model, str) else None
    pre = d.get(TOK.PRE) if isinstance(d.get(TOK.PRE), str) else None
    problems = []
    if spec is None:
        problems.append(f"tokenizer.ggml.model {model!r} is not one llama.cpp knows "
                        f"({', '.join(sorted(vocab['models']))}): \"unknown tokenizer\"")
    else:
        if spec["needs_merges"] and TOK.MERGES not in d.kvs and pre not in spec["merges_exempt_pre"]:
            exempt = f" (only pre {spec['merges_exempt_pre']} goes without)" if spec["merges_exempt_pre"] else ""
            problems.append(f"a {model!r} tokenizer needs tokenizer.ggml.merges{exempt}"
                            + ": \"cannot find tokenizer merges in model file\"")
        if spec["type"] == "BPE" and pre and pre not in vocab["bpe_pre"]:
            problems.append(f"tokenizer.ggml.pre {pre!r} is not a pre-tokenizer llama.cpp knows: "
                            "\"unknown pre-tokenizer type\"")
    for arr in vocab["per_token_arrays"]:
        kv = d.kvs.get(arr)
        if kv is not None and isinstance(kv.value, list) and len(kv.value) < len(tokens.value):
            problems.append(f"{arr} has {len(kv.value)} entries for {len(tokens.value)} tokens: "
                            "\"Index out of array bounds\"")
    if problems:
        yield Finding("tokenizer", ERROR, "the vocabulary loader refuses this tokenizer", "; ".join(problems),
                      "reconvert with --target-model-dir pointing at the target (tokenizer inheritance)")
        return
    w1 = _shape(d, "markov_w1.weight")
    if w1 and len(w1) == 2 and w1[1] != len(tokens.value):
        yield Finding("tokenizer", ERROR, "vocabulary size disagrees with the Markov head",
                      f"{len(tokens.value)} tokens, markov_w1 has {w1[1]} rows",
                      "reconvert with the target's tokenizer")
        return
    yield Finding("tokenizer", OK, f"tokenizer {model!r}, {len(tokens.value)} tokens",
                  f"pre {d.get('tokenizer.ggml.pre')!r}; bos {d.get('tokenizer.ggml.bos_token_id')}, "
                  f"eos {d.get('tokenizer.ggml.eos_token_id')}")


#: the layouts a check applies to (Context.layout): every draft, the two backbones, MLA only
DRAFTS, BACKBONES, MLA = ("mla", "qwen3", "dsv4", "unknown"), ("mla", "qwen3"), ("mla",)
#: the checks, in the order of the report, each with the layouts it runs for (None: every file)
CHECKS: tuple[tuple[Callable[[Context], Iterable[Finding]], tuple[str, ...] | None], ...] = (
    (check_arch, None), (check_loader_keys, DRAFTS), (check_tensors, BACKBONES), (check_shapes, BACKBONES),
    (check_tensor_types, DRAFTS), (check_mla_dims, MLA), (check_target_layers, DRAFTS), (check_block_size, DRAFTS),
    (check_mask_token, DRAFTS), (check_rope, None), (check_scales, MLA), (check_embeddings, BACKBONES),
    (check_tied_head, BACKBONES), (check_tokenizer, DRAFTS), (check_target, DRAFTS))


def run_checks(draft: GGUFHeader, target: GGUFHeader | None = None,
               fix_hint: str | None = None) -> tuple[Context, list[Finding]]:
    ctx = Context(draft, target)
    if fix_hint:
        ctx.fix_hint = fix_hint
    detect(ctx)
    return ctx, [f for check, layouts in CHECKS if layouts is None or ctx.layout in layouts for f in check(ctx)]


def exit_code(findings: list[Finding]) -> int:
    return max((SEVERITY[f.verdict] for f in findings), default=0)
