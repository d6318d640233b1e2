"""What the patched llama.cpp loader requires of a DFlash/DSpark draft, read from its sources.

The doctor must not pass a file the loader refuses. Rather than a second hand-kept list of
required keys, tensors and tokenizer rules, this module reads them from the loader's own
code in a patched tree and writes them as data (`data/loader_table.json`, shipped in the
package, read by the doctor's checks at run time: the doctor needs no llama.cpp tree). A
golden-file test regenerates the table from the current patched tree and fails on any
drift, the way gguf-py's constants follow llama-arch.cpp.

What is read, and from where:
  keys       every `ml.get_key` / `get_arr` / `get_key_or_arr` of the generic hyperparameter
             loader (src/llama-model.cpp llama_model_base::load_hparams), the DFlash loader
             (src/models/dflash.cpp llama_model_dflash::load_arch_hparams, with the MLA
             helper it calls) and the vocabulary loader (src/llama-vocab.cpp), with whether
             it is required (true / false / the C++ expression that decides) and the `if`
             conditions around it, verbatim (an early `return` negates its condition for
             what follows); key names from src/llama-arch.cpp LLM_KV_NAMES
  tensors    every `create_tensor(tn(...), ..., flags)` of llama_model_dflash::load_arch_tensors:
             GGUF name, per layer or not, required or not, and its conditions (tensor names
             from LLM_TENSOR_NAMES)
  vocab      the tokenizer models the vocabulary loader knows, which of them need
             tokenizer.ggml.merges (and the pre-tokenizers exempt from that), the
             pre-tokenizer names a BPE vocabulary accepts, and the per-token arrays that must
             cover every token
  rope       the rope scaling type names (LLAMA_ROPE_SCALING_TYPES)
  limits     LLAMA_MAX_LAYERS
  f32_only   which tensors the converter always writes as F32 (conversion/base.py: "Most of
             the codebase that takes in 1D tensors or norms only handles F32 tensors")

Conditions stay C++ text: the doctor interprets each one (doctor/loader_rules.CONDITIONS), and a
test fails when the table holds a condition the doctor does not know.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

from llamacpp_mla_port.errors import PortError

TABLE_NAME = "loader_table.json"
SOURCES = ("src/llama-arch.cpp", "src/llama-model.cpp", "src/models/dflash.cpp", "src/llama-vocab.cpp",
           "src/llama-hparams.h", "conversion/base.py")


class SourceError(PortError):
    """The loader sources do not have the shape this reader expects."""


# ----------------------- a small C++ block scanner: enough for straight-line loader code

@dataclass
class Block:
    header: str                                   # text before '{' ('' for a function body)
    items: list["Block | str"] = field(default_factory=list)

    def statements(self) -> list[str]:
        return [i for i in self.items if isinstance(i, str)]

    def ends_with_return(self) -> bool:
        last = [i for i in self.items if not (isinstance(i, str) and not i.strip())]
        return bool(last) and isinstance(last[-1], str) and re.match(r"return\b", last[-1].strip()) is not None

    def text(self) -> str:
        return " ".join(i if isinstance(i, str) else i.header + " { " + i.text() + " }" for i in self.items)


def _literal_end(src: str, i: int) -> int:
    """Index just past the string or char literal that opens at src[i] (escapes skipped)."""
    quote, j, n = src[i], i + 1, len(src)
    while j < n and src[j] != quote:
        j += 2 if src[j] == "\\" else 1
    return j + 1


def _strip_comments(src: str) -> str:
    """Comments out, string and char literals kept (a '//' inside a string stays)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if c in "\"'":
            j = _literal_end(src, i)
            out.append(src[i:j])
            i = j
        elif src.startswith("//", i):
            i = src.find("\n", i)
            i = n if i < 0 else i
        elif src.startswith("/*", i):
            i = src.find("*/", i + 2)
            i = n if i < 0 else i + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_body(src: str, signature: str, path: str) -> str:
    """The text between the braces of the function whose definition starts with `signature`."""
    at = src.find(signature)
    if at < 0 or src.find(signature, at + 1) >= 0:
        raise SourceError(f"{path}: {signature!r} found {src.count(signature)} times, expected once",
                          "the loader moved: update loader_table.py's reader")
    start = src.index("{", at)
    depth, i = 0, start
    while i < len(src):
        if src[i] in "\"'":
            i = _literal_end(src, i) - 1
        elif src[i] == "{":
            depth += 1
        elif src[i] == "}":
            depth -= 1
            if depth == 0:
                return src[start + 1:i]
        i += 1
    raise SourceError(f"{path}: unbalanced braces after {signature!r}", "the loader moved")


def scan(body: str) -> Block:
    """Blocks and statements of a function body. Braces inside parentheses (initializer lists
    in calls) stay text; a brace at statement level opens a block headed by the text before it."""
    root = Block("")
    stack = [root]
    buf: list[str] = []
    paren = 0
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c in "\"'":
            j = _literal_end(body, i)
            buf.append(body[i:j])
            i = j
            continue
        if c == "(":
            paren += 1
        elif c == ")":
            paren -= 1
        if paren == 0 and c == "{" and not re.search(r"[=,(]\s*$", "".join(buf)):
            blk = Block(" ".join("".join(buf).split()))
            stack[-1].items.append(blk)
            stack.append(blk)
            buf = []
        elif paren == 0 and c == "}" and len(stack) > 1 and not _open_init(buf):
            if "".join(buf).strip():
                stack[-1].items.append(" ".join("".join(buf).split()))
            buf = []
            stack.pop()
        elif paren == 0 and c == ";":
            stack[-1].items.append(" ".join("".join(buf).split()))
            buf = []
        else:
            buf.append(c)
        i += 1
    return root


def _open_init(buf: list[str]) -> bool:
    """True while the statement holds an unclosed brace initializer (`x = { a, b }`)."""
    text = "".join(buf)
    return text.count("{") > text.count("}")


def split_args(call: str) -> list[str]:
    """Top-level comma-separated arguments of the first parenthesised group in `call`."""
    i = call.index("(") + 1
    depth, args, cur = 0, [], []
    while i < len(call):
        c = call[i]
        if c in "\"'":
            j = _literal_end(call, i)
            cur.append(call[i:j])
            i = j
            continue
        if c in "({[":
            depth += 1
        elif c in ")}]":
            if depth == 0:
                args.append("".join(cur).strip())
                return args
            depth -= 1
        if c == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    raise SourceError(f"unbalanced call {call[:80]!r}", "the loader moved")


def _calls(text: str, name: str) -> Iterator[str]:
    for m in re.finditer(rf"\b{re.escape(name)}\s*\(", text):
        yield text[m.start():]


def condition(header: str) -> str:
    """The condition of an `if (...)` / `else if (...)` header."""
    return split_args(header[header.index("("):])[0]


def neg(c: str) -> str:
    return c[2:-1] if c.startswith("!(") and c.endswith(")") else f"!({c})"


def walk(block: Block, conds: tuple[str, ...] = (), inline: dict[str, Block] | None = None,
         loop: bool = False) -> Iterator[tuple[str, tuple[str, ...], bool, Block | None]]:
    """(statement or header text, conditions, inside a per-layer loop, the block it heads)."""
    chain: list[str] = []
    for item in block.items:
        if isinstance(item, str):
            chain = []
            yield item, conds, loop, None
            fn = re.match(r"(\w+)\s*\(", item.strip())
            if inline and fn and fn.group(1) in inline:
                yield from walk(inline[fn.group(1)], conds, inline, loop)
            continue
        h = item.header
        if re.match(r"if\b", h):
            c = condition(h)
            yield h, conds, loop, item
            yield from walk(item, conds + (c,), inline, loop)
            if item.ends_with_return():
                conds = conds + (neg(c),)
                chain = []
            else:
                chain = [c]
        elif re.match(r"else\s+if\b", h):
            c = condition(h)
            yield h, conds, loop, item
            yield from walk(item, conds + tuple(neg(x) for x in chain) + (c,), inline, loop)
            chain.append(c)
        elif h == "else":
            yield from walk(item, conds + tuple(neg(x) for x in chain), inline, loop)
            chain = []
        elif re.match(r"for\b", h):
            chain = []
            yield from walk(item, conds, inline, True)
        elif h == "":
            chain = []
            yield from walk(item, conds, inline, loop)
        else:                                     # lambdas, switch bodies: not straight-line code
            chain = []


# ---------------------------------------------------------- the tables of llama-arch.cpp

def _name_map(src: str, table: str, prefix: str, path: str) -> dict[str, str]:
    m = re.search(rf"{table}\s*=\s*\{{(.*?)\n\}};", src, re.S)
    if not m:
        raise SourceError(f"{path}: no {table}", "the loader moved")
    return dict(re.findall(rf"\{{\s*({prefix}\w+)\s*,\s*\"([^\"]*)\"\s*\}}", m.group(1)))


def _key_name(kid: str, kv_names: dict[str, str], arch: str) -> str:
    if kid.startswith('"'):
        return kid.strip('"')
    if kid not in kv_names:
        raise SourceError(f"unknown key id {kid}", "LLM_KV_NAMES has no entry for it")
    return kv_names[kid].replace("%s", arch)


# ---------------------------------------------------------------------------- extraction

_KEY_CALLS = {"get_key": 2, "get_arr": 2, "get_arr_n": 2, "get_key_or_arr": 3}   # index of `required`


def extract_keys(block: Block, kv_names: dict[str, str], arch: str, where: str,
                 inline: dict[str, Block] | None = None) -> list[dict]:
    out = []
    for text, conds, _loop, blk in walk(block, inline=inline):
        for call_name, req_idx in _KEY_CALLS.items():
            for call in _calls(text, f"ml.{call_name}"):
                args = split_args(call)
                req = args[req_idx] if len(args) > req_idx else "true"
                # `if (!ml.get_x(K, v, false)) { throw ... }` makes an optional read required
                if blk is not None and req == "false" and re.match(r"if\s*\(\s*!\s*ml\." + call_name, text) \
                        and any("throw" in s for s in blk.statements()):
                    req = "true"
                if req in ("false", "0"):
                    continue                      # the doctor only needs what the loader insists on
                out.append({"key": _key_name(args[0], kv_names, arch), "required": req,
                            "conditions": list(conds), "in": where})
    return out


def extract_tensors(block: Block, tensor_names: dict[str, str]) -> list[dict]:
    out = []
    for text, conds, loop, _blk in walk(block):
        for call in _calls(text, "create_tensor"):
            args = split_args(call)
            tn = split_args(args[0])
            tid = tn[0]
            if tid not in tensor_names:
                raise SourceError(f"unknown tensor id {tid}", "LLM_TENSOR_NAMES has no entry for it")
            suffix = next((a.strip('"') for a in tn[1:] if a.startswith('"')), None)
            name = tensor_names[tid].replace("%d", "{i}") + (f".{suffix}" if suffix else "")
            flags = args[2] if len(args) > 2 else "0"
            if "TENSOR_DUPLICATED" in flags and "TENSOR_NOT_REQUIRED" not in flags:
                continue                          # a second view of a tensor already listed
            out.append({"name": name, "per_layer": "{i}" in name,
                        "required": "TENSOR_NOT_REQUIRED" not in flags, "conditions": list(conds)})
    return out


def extract_vocab(src: str, kv_names: dict[str, str], path: str) -> dict:
    body = function_body(src, "void llama_vocab::impl::load(llama_model_loader & ml, const LLM_KV & kv) {", path)
    # the "determine vocab type" block: the first bare block that reads the tokenizer model
    typing = next((b for b in scan(body).items if isinstance(b, Block) and b.header == ""
                   and "LLM_KV_TOKENIZER_MODEL" in b.text()), None)
    if typing is None:
        raise SourceError(f"{path}: no block reading LLM_KV_TOKENIZER_MODEL in llama_vocab::impl::load",
                          "the loader moved")
    models: dict[str, dict] = {}
    for text, _conds, _loop, blk in walk(typing):
        if blk is None or not re.match(r"(else\s+)?if\b", text):
            continue
        cond = condition(text)
        names = re.findall(r'tokenizer_model\s*==\s*"([^"]+)"', cond)
        if not names or re.sub(r'tokenizer_model\s*==\s*"[^"]+"|\|\||\s', "", cond):
            continue
        inner = blk.text()
        vtype = re.search(r"type\s*=\s*LLAMA_VOCAB_TYPE_(\w+)", inner)
        merges = "cannot find tokenizer merges" in inner
        exempt = re.findall(r'tokenizer_pre\s*==\s*"([^"]+)"\s*\)', inner) if merges else []
        for name in names:
            models.setdefault(name, {}).update({"type": vtype.group(1) if vtype else None,
                                                "needs_merges": merges,
                                                "merges_exempt_pre": sorted(set(exempt))})
    if not models or "unknown tokenizer" not in body:
        raise SourceError(f"{path}: no tokenizer model chain in llama_vocab::impl::load", "the loader moved")
    pre_at = body.find("unknown pre-tokenizer type")
    if pre_at < 0:
        raise SourceError(f"{path}: no pre-tokenizer chain", "the loader moved")
    pre_start = body.rfind("tokenizer_pre.empty()", 0, pre_at)
    pre_names = sorted(set(re.findall(r'tokenizer_pre\s*==\s*"([^"]+)"', body[pre_start:pre_at])))
    per_token = []
    for m in re.finditer(r"gguf_find_key\(ctx,\s*kv\((LLM_KV_TOKENIZER_\w+)\)\.c_str\(\)\)", body):
        nxt = body.find("gguf_find_key", m.end())
        span = body[m.end(): nxt if nxt > 0 else len(body)]
        if re.search(r"<\s*n_tokens\)\s*\{\s*throw", span):
            per_token.append(kv_names[m.group(1)])
    # `const int x = gguf_find_key(ctx, kv(K)...)` followed by `if (x == -1) { throw ... }`
    required = []
    items = scan(body).items
    for stmt, nxt in zip(items, items[1:]):
        m = isinstance(stmt, str) and re.match(r"const int (\w+) = gguf_find_key\(ctx, kv\((LLM_KV_\w+)\)", stmt)
        if m and isinstance(nxt, Block) and re.match(rf"if \({m.group(1)} == -1\)", nxt.header) \
                and any("throw" in st for st in nxt.statements()):
            required.append(kv_names[m.group(2)])
    return {"models": dict(sorted(models.items())), "bpe_pre": pre_names, "per_token_arrays": sorted(per_token),
            "required_arrays": sorted(required)}


def generate(tree: Path) -> dict[str, Any]:
    """The loader table of the patched tree at `tree`."""
    tree = Path(tree)
    texts = {}
    for rel in SOURCES:
        p = tree / rel
        if not p.is_file():
            raise SourceError(f"{p} not found", "point at a patched llama.cpp tree (make patch)")
        texts[rel] = _strip_comments(p.read_text(encoding="utf-8")) if rel.endswith((".cpp", ".h")) \
            else p.read_text(encoding="utf-8")
    arch_src, model_src, dflash_src, vocab_src = (texts[s] for s in SOURCES[:4])
    arch_names = _name_map(arch_src, "LLM_ARCH_NAMES", "LLM_ARCH_", SOURCES[0])
    kv_names = _name_map(arch_src, "LLM_KV_NAMES", "LLM_KV_", SOURCES[0])
    tensor_names = _name_map(arch_src, "LLM_TENSOR_NAMES", "LLM_TENSOR_", SOURCES[0])
    arch = arch_names["LLM_ARCH_DFLASH"]

    generic = scan(function_body(model_src, "void llama_model_base::load_hparams(llama_model_loader & ml) {",
                                 SOURCES[1]))
    mla = scan(function_body(dflash_src, "static void dflash_load_mla_hparams(", SOURCES[2]))
    dflash_hp = scan(function_body(dflash_src, "void llama_model_dflash::load_arch_hparams(llama_model_loader & ml) {",
                                   SOURCES[2]))
    dflash_t = scan(function_body(dflash_src, "void llama_model_dflash::load_arch_tensors(llama_model_loader &) {",
                                  SOURCES[2]))
    keys = (extract_keys(generic, kv_names, arch, "llama_model_base::load_hparams")
            + extract_keys(dflash_hp, kv_names, arch, "llama_model_dflash::load_arch_hparams",
                           inline={"dflash_load_mla_hparams": mla})
            + extract_keys(scan(function_body(vocab_src, "void llama_vocab::impl::load(llama_model_loader & ml, "
                                              "const LLM_KV & kv) {", SOURCES[3])), kv_names, arch,
                           "llama_vocab::impl::load"))
    rope = re.search(r"LLAMA_ROPE_SCALING_TYPES\s*=\s*\{(.*?)\};", model_src, re.S)
    max_layers = re.search(r"#define\s+LLAMA_MAX_LAYERS\s+(\d+)", texts["src/llama-hparams.h"])
    f32 = re.search(r"#\s*Most of the codebase that takes in 1D tensors or norms only handles F32 tensors\s*\n"
                    r"\s*if n_dims <= (\d+) or new_name\.endswith\(\"([^\"]+)\"\):", texts["conversion/base.py"])
    if not rope or not max_layers or not f32:
        raise SourceError("LLAMA_ROPE_SCALING_TYPES, LLAMA_MAX_LAYERS or the converter's F32 rule not found",
                          "the loader moved: update loader_table.py's reader")
    return {"about": "generated by llamacpp_mla_port.loader_table from the patched llama.cpp tree; do not edit",
            "arch": arch, "sources": list(SOURCES), "keys": keys, "tensors": extract_tensors(dflash_t, tensor_names),
            "vocab": extract_vocab(vocab_src, kv_names, SOURCES[3]),
            "rope_scaling_types": re.findall(r'"([^"]+)"', rope.group(1)), "max_layers": int(max_layers.group(1)),
            "f32_only": {"max_dims": int(f32.group(1)), "suffix": f32.group(2)}}


def render(table: dict[str, Any]) -> str:
    """Its canonical JSON text (what is shipped)."""
    return json.dumps(table, indent=1, sort_keys=False) + "\n"


def load() -> dict[str, Any]:
    """The table shipped with the package."""
    table = resources.files("llamacpp_mla_port.doctor").joinpath("data", TABLE_NAME)
    return json.loads(table.read_text(encoding="utf-8"))
