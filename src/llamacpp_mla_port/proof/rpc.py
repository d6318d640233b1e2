"""The pair over llama.cpp's RPC backend: the target split across ggml-rpc-servers, the draft
on this host or on a server, and where each model's layers landed (read from a -v log).
The servers themselves are processes.RpcServer (one per host in a real deployment).
"""

from __future__ import annotations

import re
from typing import Sequence

from llamacpp_mla_port.gguf import contract

DRAFT_PLACEMENTS = ("local", "remote")

# common's speculative init logs this before it loads the draft: what follows is the draft's
_DRAFT_MARK = "loading draft model"
_ASSIGNED = re.compile(r"load_tensors: layer\s+(\d+) assigned to device (\S+?),")


def rpc_devices(n_servers: int) -> list[str]:
    """llama.cpp's names for the devices of `--rpc a,b,...` (one CPU device per rpc-server)."""
    return [f"RPC{i}" for i in range(n_servers)]


def target_split_args(endpoints: Sequence[str]) -> list[str]:
    """Every target layer on the servers' devices, split evenly between them by layer."""
    devices = rpc_devices(len(endpoints))
    return ["--rpc", ",".join(endpoints), "-dev", ",".join(devices), "-ngl", "99",
            "-ts", ",".join("1" for _ in devices)]


def draft_args(where: str, n_servers: int) -> list[str]:
    """The draft's placement. A draft on this host keeps the RPC devices in its scheduler
    (`-ngld 0`, not `-devd none`): it embeds its block and projects its logits with the
    target's token table and lm_head, which live where the target's first and last layers do."""
    if where == "local":
        return ["-ngld", "0"]
    if where == "remote":
        return ["-devd", rpc_devices(n_servers)[-1], "-ngld", "99"]
    raise ValueError(f"draft placement {where!r}: one of {', '.join(DRAFT_PLACEMENTS)}")


def _first_model(text: str) -> dict[str, int]:
    """Layers per device of the first model loaded in `text` (its run of layer 0, 1, 2, ...)."""
    counts: dict[str, int] = {}
    expected = 0
    for m in _ASSIGNED.finditer(text):
        layer, device = int(m.group(1)), m.group(2)
        if layer != expected:
            break
        counts[device] = counts.get(device, 0) + 1
        expected += 1
    return counts


def placement(log: str) -> dict[str, dict[str, int]]:
    """Where the target's and the draft's layers went, from a `-v` log of a speculative run."""
    target_part, mark, draft_part = log.partition(_DRAFT_MARK)
    return {"target": _first_model(target_part), "draft": _first_model(draft_part) if mark else {}}


# ---------------------------------------------------------------------------------------
# the real pair across hosts: memory and network figures, computed (docs/rpc.md)

K3_PARAMS = 2.8e12              # Kimi-K3, all parameters
K3_EMBD = contract.K3_N_EMBD
K3_VOCAB = contract.K3_VOCAB
DRAFT_PARAMS = 2_387_907_841    # Kimi-K3-DSpark without embed_tokens (the converter strips it)
DRAFT_LAYERS = 5
DRAFT_TAPS = 5
MLA_ROW = 512 + 64              # the draft's cache row per token and layer: kv_lora + rope, K only
TARGET_TYPES = ("Q8_0", "Q4_K", "Q2_K")   # the main type of Q8_0, Q4_K_M, Q2_K files
HOSTS = (4, 8, 16)
CONTEXT = 131072


def bytes_per_value(type_name: str) -> float:
    """ggml's storage per value of a type (block bytes / block values, from gguf-py)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return size / block


def draft_cache_bytes_per_token(cache_type: str) -> int:
    """The MLA draft's KV cache per token of context (one slot): layers x row, K only."""
    return int(DRAFT_LAYERS * MLA_ROW * bytes_per_value(cache_type.upper()))


def figures_markdown() -> str:
    """docs/rpc.md's figures, computed here (python -m llamacpp_mla_port.proof.rpc prints them)."""
    gb = 1e9
    lines = ["| target weights | bits/weight | all hosts | " + " | ".join(f"per host, {n} hosts" for n in HOSTS) + " |",
             "|---|---|---|" + "---|" * len(HOSTS)]
    for t in TARGET_TYPES:
        total = K3_PARAMS * bytes_per_value(t)
        lines.append(f"| {t} | {8 * bytes_per_value(t):g} | {total / gb:,.0f} GB | "
                     + " | ".join(f"{total / n / gb:,.0f} GB" for n in HOSTS) + " |")
    draft = DRAFT_PARAMS * bytes_per_value("BF16")
    f16, q8 = draft_cache_bytes_per_token("f16"), draft_cache_bytes_per_token("q8_0")
    tap = DRAFT_TAPS * K3_EMBD * 4
    verify = 7 + 1
    lines += [
        "",
        f"- draft weights: {DRAFT_PARAMS:,} parameters x 2 B (BF16) = {draft / gb:.2f} GB",
        f"- draft cache per token of context and slot: {DRAFT_LAYERS} layers x {MLA_ROW} values = "
        f"{f16:,} B at F16, {DRAFT_LAYERS} x {MLA_ROW // 32} blocks x 34 B = {q8:,} B at q8_0; "
        f"{CONTEXT:,} tokens: {f16 * CONTEXT / gb:.2f} GB (F16), {q8 * CONTEXT / gb:.2f} GB (q8_0)",
        f"- taps, per target token (prompt tokens included): {DRAFT_TAPS} x {K3_EMBD} floats x 4 B = {tap:,} B "
        f"from the hosts holding the tap layers to the client, and the same rows again to a draft on another "
        f"host (they are injected into its cache); a verification of {verify} positions: {verify * tap / 1e6:.2f} MB",
        f"- hidden state at each host boundary, per target token: {K3_EMBD} x 4 B = {K3_EMBD * 4:,} B, twice "
        f"(host -> client -> next host); {verify} positions: {2 * verify * K3_EMBD * 4 / 1e6:.2f} MB",
        f"- the target's logits of a verification: {verify} x {K3_VOCAB:,} x 4 B = "
        f"{verify * K3_VOCAB * 4 / 1e6:.2f} MB from the last host to the client",
        f"- the first load sends every weight from the client: Q4_K {K3_PARAMS * bytes_per_value('Q4_K') / gb:,.0f} GB "
        f"at 10 Gb/s (1.25 GB/s) = {K3_PARAMS * bytes_per_value('Q4_K') / 1.25e9 / 60:.0f} min",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(figures_markdown(), end="")
