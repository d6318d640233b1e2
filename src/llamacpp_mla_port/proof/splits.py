"""Where the scheduler ran each node: llama.cpp's own split report, parsed.

With `GGML_SCHED_DEBUG=2` ggml's scheduler logs every graph it splits (ggml-backend.cpp,
ggml_backend_sched_print_assignments) at debug level, which the proof programs keep in their
log (draft-logits: OUT/llama.log; draft-bench: OUT.json.log):

    ## SPLIT #0: CPU # 0 inputs
    node #  0 (  GET_ROWS):       inp_noise_embd (  14K) [  CPU         ] use=1,c=0:    token_embd.weight ...
                   (   4M) [  CPU         ]           inp_tokens (   0K) [ NULL         ]   (one line)
    ## SPLIT #1: CUDA0 # 1 inputs: [inp_noise_embd (  14K)]
    node #  2 (  RMS_NORM):            norm-0 (  14K) [CUDA0         ] use=1,c=0:  ...

(fixed-width fields: op 10, names 20, sizes 5, backend 5, cause 8; views are not listed).
`parse_sched_log(text)` returns one SchedGraph per printed graph; `draft_graphs` keeps the
draft's (its block graph names `inp_noise_embd`, its injection graph `Kcur_injected-N`);
`cpu_fallbacks(graph)` lists the nodes that ran on the CPU when a GPU was in the graph,
except the one placement llama.cpp makes on purpose: a GET_ROWS of a weight kept in host
memory (the input layer: the target's token table, the draft's Markov rows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SPLIT = re.compile(r"^## SPLIT #(\d+): (\S+) # (\d+) inputs")
_NODE = re.compile(r"^node #\s*(\d+) \((.{10})\): (.{20}) \((.{5})\) \[(.{5}) (.{8})\] use=(\d+),c=(\d+):(.*)$")
_SRC = re.compile(r" (.{20}) \((.{5})\) \[(.{5}) (.{8})\]")

#: node names only the draft's graphs have (dflash.cpp's MLA graph)
DRAFT_BLOCK_MARK = "inp_noise_embd"
DRAFT_INJECT_MARK = "Kcur_injected-"
HOST_BACKENDS = ("CPU",)


@dataclass
class SchedNode:
    index: int
    op: str
    name: str
    backend: str
    srcs: list[tuple[str, str]] = field(default_factory=list)   # (name, backend) of each source

    def as_dict(self) -> dict:
        return {"index": self.index, "op": self.op, "name": self.name, "backend": self.backend,
                "srcs": [list(s) for s in self.srcs]}


@dataclass
class SchedSplit:
    index: int
    backend: str
    n_inputs: int
    nodes: list[SchedNode] = field(default_factory=list)


@dataclass
class SchedGraph:
    splits: list[SchedSplit] = field(default_factory=list)

    @property
    def nodes(self) -> list[SchedNode]:
        return [n for s in self.splits for n in s.nodes]

    @property
    def backends(self) -> list[str]:
        return sorted({s.backend for s in self.splits} | {n.backend for n in self.nodes})

    @property
    def kind(self) -> str:
        names = {n.name for n in self.nodes}
        if any(n.startswith(DRAFT_BLOCK_MARK) for n in names):
            return "draft-block"
        if any(n.startswith(DRAFT_INJECT_MARK) for n in names):
            return "draft-inject"
        return "other"

    def summary(self) -> dict:
        per_backend: dict[str, int] = {}
        for n in self.nodes:
            per_backend[n.backend] = per_backend.get(n.backend, 0) + 1
        return {"kind": self.kind, "n_splits": len(self.splits), "split_backends": [s.backend for s in self.splits],
                "nodes_per_backend": per_backend}


def parse_sched_log(text: str) -> list[SchedGraph]:
    """Every graph the scheduler printed, in log order (a graph starts at its SPLIT #0)."""
    graphs: list[SchedGraph] = []
    for raw in text.splitlines():
        line = raw.rstrip("\n")
        m = _SPLIT.match(line)
        if m:
            index = int(m.group(1))
            if index == 0 or not graphs:
                graphs.append(SchedGraph())
            graphs[-1].splits.append(SchedSplit(index, m.group(2), int(m.group(3))))
            continue
        m = _NODE.match(line)
        if m and graphs and graphs[-1].splits:
            srcs = [(s.group(1).strip(), s.group(3).strip()) for s in _SRC.finditer(m.group(9))]
            graphs[-1].splits[-1].nodes.append(
                SchedNode(int(m.group(1)), m.group(2).strip(), m.group(3).strip(), m.group(5).strip(), srcs))
    return graphs


def draft_graphs(graphs: list[SchedGraph]) -> list[SchedGraph]:
    return [g for g in graphs if g.kind != "other"]


def is_host_weight_lookup(node: SchedNode) -> bool:
    """GET_ROWS of a tensor in host memory: llama.cpp keeps the input layer there by design."""
    return node.op == "GET_ROWS" and bool(node.srcs) and node.srcs[0][1] in HOST_BACKENDS


def cpu_fallbacks(graph: SchedGraph) -> list[SchedNode]:
    """Nodes on the CPU in a graph that also runs on another backend (none: CPU-only graph)."""
    if all(b in HOST_BACKENDS for b in graph.backends):
        return []
    return [n for n in graph.nodes if n.backend in HOST_BACKENDS and not is_host_weight_lookup(n)]


def node_ops(graphs: list[SchedGraph], cb_name: str) -> list[str]:
    """The ops of the nodes a graph callback named `cb_name` (cb_name-IL, one per layer; sorted,
    distinct). Views and copies of such a node ("fattn_mla-0 (permuted) (cont)") are not it."""
    own = re.compile(re.escape(cb_name) + r"-\d+")
    return sorted({n.op for g in graphs for n in g.nodes if own.fullmatch(n.name)})


def fallback_report(text: str) -> dict:
    """The draft graphs of one log: splits, backends, and every CPU fallback node."""
    graphs = draft_graphs(parse_sched_log(text))
    out = {"n_draft_graphs": len(graphs), "graphs": [], "fallback_nodes": [], "backends": []}
    seen: set[tuple] = set()
    backends: set[str] = set()
    for g in graphs:
        s = g.summary()
        key = (s["kind"], s["n_splits"], tuple(s["split_backends"]))
        backends.update(g.backends)
        if key not in seen:          # the same graph is split again on every decode
            seen.add(key)
            out["graphs"].append(s)
        for n in cpu_fallbacks(g):
            entry = {"graph": g.kind, "op": n.op, "name": n.name}
            if entry not in out["fallback_nodes"]:
                out["fallback_nodes"].append(entry)
    out["backends"] = sorted(backends)
    out["gpu_in_graph"] = any(b not in HOST_BACKENDS for b in backends)
    out["fallback_ops"] = sorted({e["op"] for e in out["fallback_nodes"]})
    return out
