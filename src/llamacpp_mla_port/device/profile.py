"""Where the real-size block's time goes, per part of the draft (GROUPS), each part against its
own floor: the bytes it reads over the copy bandwidth of the same run (the groups' bytes add up
to bench.floors.block_work's), and its time net of one synchronisation per node (the median of
the nodes that compute nothing). docs/device-check.md ("Where the block's time goes").
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from llamacpp_mla_port.bench.floors import BLOCK_LAYER_TENSORS, block_work, row_bytes, tensor_table
from llamacpp_mla_port.errors import DeviceCheckError

GROUPS = ("lm_head", "ffn", "attention", "markov_head", "other")
#: node names (without the -IL layer suffix and view suffixes) per group; a node with another
#: name (node_N, norm-IL) takes the group of the next node with one of these names
_NAMED = {
    "attention": ("attn_norm", "q", "q_pe", "q_nope_absorbed", "Qcur", "kv_cmpr_pe", "kv_cmpr", "k_pe", "Kcur",
                  "Vcur", "kq", "kq_soft_max", "kqv", "kqv_out", "__fattn__", "fattn_mla", "attn_out_v_b",
                  "attn_out"),
    "ffn": ("ffn_norm", "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_silu", "ffn_gelu", "ffn_down", "ffn_out"),
    "other": ("inp_noise_embd", "ffn_inp", "l_out", "result_norm"),
    "lm_head": ("result_output",),
}
_GROUP_OF = {name: group for group, names in _NAMED.items() for name in names}
_CACHE = re.compile(r"cache_[kv]_l\d+")
#: ops that compute nothing: their time is the per-node synchronisation and callback
NOOP_OPS = ("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE")


def base_name(name: str) -> str:
    """`fattn_mla-3 (permuted) (cont)` -> `fattn_mla`."""
    return re.sub(r"-\d+$", "", name.split(" (")[0].strip())


def node_groups(nodes: list[dict]) -> list[str]:
    """The group of each node of one block's profile, in graph order (module doc): the lm_head
    product is result_output, and every node after it belongs to the Markov and confidence heads."""
    out: list[str | None] = []
    after_head = False
    for n in nodes:
        base = base_name(n["name"])
        group = "attention" if _CACHE.fullmatch(base) else _GROUP_OF.get(base)
        if after_head:
            group = "markov_head"
        elif group == "lm_head" and n["op"] == "MUL_MAT":
            after_head = True
        elif group == "lm_head":
            group = None
        out.append(group)
    following = "other"
    for i in range(len(out) - 1, -1, -1):
        if out[i] is None:
            out[i] = following
        else:
            following = out[i]
    return out  # type: ignore[return-value]


def group_bytes(draft: Path, target: Path, n_block: int = 7, n_ctx: int = 512,
                cache_bytes_per_value: float = 2.0) -> dict[str, int]:
    """Bytes each group reads in one block (module doc); their sum is block_work's."""
    d, t = tensor_table(draft), tensor_table(target)
    work = block_work(draft, target, n_block, n_ctx, cache_bytes_per_value, tables=(d, t))
    g = dict.fromkeys(GROUPS, 0)
    for name, ti in d.items():
        parts = name.split(".")
        if parts[0] == "blk" and parts[2] in BLOCK_LAYER_TENSORS:
            g["ffn" if parts[2].startswith("ffn_") else "attention"] += ti.n_bytes
    g["attention"] += work.bytes_cache
    g["lm_head"] += (d.get("output.weight") or t["output.weight"]).n_bytes
    for name in ("markov_w2.weight", "conf_proj.weight", "conf_proj.bias"):
        g["markov_head"] += d[name].n_bytes if name in d else 0
    if "markov_w1.weight" in d:
        g["markov_head"] += row_bytes(d["markov_w1.weight"], n_block)
    g["other"] += d["output_norm.weight"].n_bytes if "output_norm.weight" in d else 0
    g["other"] += row_bytes(d.get("token_embd.weight") or t["token_embd.weight"], n_block)
    if sum(g.values()) != work.bytes_total:
        raise DeviceCheckError(f"the profile's groups read {sum(g.values()):,} B, bench.floors' block "
                               f"{work.bytes_total:,} B", hint="a tensor of the block is in no group: "
                               "update device/profile.py's group_bytes with bench/floors.py's block_work")
    return g


def block_profile(nodes: list[dict], bytes_by_group: dict[str, int], gbps: float,
                  block_median_s: float | None = None) -> dict:
    """Per group: the nodes' time, the same net of the per-node synchronisation, its floor
    (bytes / gbps) and the ratio of the net time to it; the heaviest nodes by name."""
    if not nodes:
        raise DeviceCheckError("draft-bench returned no profiled node", hint="run it with --profile")
    groups = node_groups(nodes)
    noop = [n["seconds"] for n in nodes if n["op"] in NOOP_OPS]
    per_node = statistics.median(noop) if noop else 0.0
    rows = {}
    for group in GROUPS:
        mine = [n for n, g in zip(nodes, groups) if g == group]
        seconds = sum(n["seconds"] for n in mine)
        net = max(0.0, seconds - per_node * len(mine))
        floor = bytes_by_group[group] / (gbps * 1e9)
        rows[group] = {"nodes": len(mine), "seconds": seconds, "net_seconds": net, "bytes": bytes_by_group[group],
                       "floor_s": floor, "over_floor": (net / floor) if floor > 0 else None}
    heavy: dict[str, list] = {}
    for n, g in zip(nodes, groups):
        name = base_name(n["name"])
        if re.fullmatch(r"node_\d+", name):            # unnamed: by its first source's shape
            name = f"{n.get('type0', '')} {n.get('ne0', [])[:3]}"
        e = heavy.setdefault(f"{g}: {n['op']} {name}", [0.0, 0])
        e[0] += n["seconds"]
        e[1] += 1
    total = sum(n["seconds"] for n in nodes)
    return {"groups": rows, "n_nodes": len(nodes), "profiled_s": total, "per_node_sync_s": per_node,
            "noop_nodes": len(noop), "net_s": max(0.0, total - per_node * len(nodes)),
            "block_median_s": block_median_s, "floor_s": sum(bytes_by_group.values()) / (gbps * 1e9),
            "top_nodes": [{"node": k, "seconds": v[0], "count": v[1]}
                          for k, v in sorted(heavy.items(), key=lambda kv: -kv[1][0])[:12]]}
