"""Independent float64 reference of the K3 DSpark draft forward pass.

Design and bounds: docs/proof.md#reference.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.proof.reference.precision import EXACT, Precision, flash_attention_f16, round_to
from llamacpp_mla_port.proof.reference.yarn import RopeConfig, attention_scale, rotate


# ---------------------------------------------------------------------------------------
# checkpoint reading

_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of one .safetensors file as float64 (BF16 decoded by bit shift).

    A minimal reader (8-byte little-endian header size, JSON header, raw data) so the
    reference needs neither torch nor safetensors' framework bindings for BF16.
    """
    path = Path(path)
    raw = path.read_bytes()
    (n_header,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n_header])
    data = memoryview(raw)[8 + n_header:]
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        shape = tuple(meta["shape"])
        dtype = meta["dtype"]
        chunk = data[begin:end]
        if dtype == "BF16":
            bits = np.frombuffer(chunk, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif dtype in _ST_DTYPES:
            arr = np.frombuffer(chunk, dtype=np.dtype(_ST_DTYPES[dtype]).newbyteorder("<"))
        else:
            raise ProofError(f"{path}: tensor {name} has dtype {dtype}, the reference reads F64/F32/F16/BF16")
        out[name] = arr.reshape(shape).astype(np.float64)
    return out


def read_checkpoint(checkpoint_dir: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """config.json and every tensor of an HF checkpoint directory (single file or sharded)."""
    checkpoint_dir = Path(checkpoint_dir)
    config_path = checkpoint_dir / "config.json"
    if not config_path.is_file():
        raise ProofError(f"{checkpoint_dir}: no config.json", hint="pass an HF checkpoint directory")
    config = json.loads(config_path.read_text())
    files = sorted(checkpoint_dir.glob("*.safetensors"))
    if not files:
        raise ProofError(f"{checkpoint_dir}: no .safetensors file")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        tensors.update(read_safetensors(f))
    # tolerate a leading "model." (some exporters add it); the real checkpoint has none
    return config, {(k[len("model."):] if k.startswith("model.") else k): v for k, v in tensors.items()}


def read_target_head(target_gguf: Path) -> tuple[np.ndarray, np.ndarray]:
    """The target's token embedding [V, E] and lm_head [V, E] from its GGUF, as float64."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(target_gguf))
    found: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.name in ("token_embd.weight", "output.weight"):
            arr = dequantize(t.data, t.tensor_type)
            # GGUF lists dims fastest-first: ne = [E, V] is a numpy [V, E] array
            found[t.name] = np.asarray(arr, dtype=np.float64).reshape(int(t.shape[1]), int(t.shape[0]))
    if "token_embd.weight" not in found:
        raise ProofError(f"{target_gguf}: no token_embd.weight")
    if "output.weight" not in found:
        raise ProofError(f"{target_gguf}: no output.weight (Kimi-K3's lm_head is untied)")
    return found["token_embd.weight"], found["output.weight"]


# ---------------------------------------------------------------------------------------
# config

@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    eps: float
    rope: RopeConfig
    target_layer_ids: tuple[int, ...]
    target_hidden_size: int
    mask_token_id: int
    markov_rank: int
    has_confidence: bool

    @classmethod
    def from_hf(cls, config: dict) -> "DraftConfig":
        if config.get("mla_use_nope") or config.get("mla_use_output_gate"):
            raise ProofError("the reference implements mla_use_nope=false, mla_use_output_gate=false only")
        if config.get("markov_head_type", "vanilla") != "vanilla":
            raise ProofError(f"markov_head_type {config.get('markov_head_type')!r}: only 'vanilla' is implemented")
        return cls(
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            n_layers=int(config["num_hidden_layers"]),
            n_heads=int(config["num_attention_heads"]),
            q_lora_rank=(int(config["q_lora_rank"]) if config.get("q_lora_rank") else None),
            kv_lora_rank=int(config["kv_lora_rank"]),
            nope_dim=int(config["qk_nope_head_dim"]),
            rope_dim=int(config["qk_rope_head_dim"]),
            v_dim=int(config["v_head_dim"]),
            eps=float(config.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf_config(config),
            target_layer_ids=tuple(int(i) for i in config["target_layer_ids"]),
            target_hidden_size=int(config.get("target_hidden_size", config["hidden_size"])),
            mask_token_id=int(config["mask_token_id"]),
            markov_rank=int(config.get("markov_rank", 0)),
            has_confidence=bool(config.get("enable_confidence_head", False)),
        )

    @property
    def qk_dim(self) -> int:
        return self.nope_dim + self.rope_dim

    @property
    def n_taps(self) -> int:
        return len(self.target_layer_ids)


# ---------------------------------------------------------------------------------------
# building blocks

def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class Weights:
    """Checkpoint tensors by real name; a missing name is an error naming it."""

    def __init__(self, tensors: dict[str, np.ndarray], source: str = "checkpoint"):
        self.tensors = tensors
        self.source = source

    def __call__(self, name: str) -> np.ndarray:
        try:
            return self.tensors[name]
        except KeyError:
            raise ProofError(f"{self.source}: tensor {name} is missing") from None

    def has(self, name: str) -> bool:
        return name in self.tensors


def latent_rows(cfg: DraftConfig, w: Weights, il: int, x: np.ndarray, positions: np.ndarray,
                prec: Precision = EXACT) -> np.ndarray:
    """kv_a_proj_with_mqa -> [kv_a_layernorm(latent) | RoPE(rope part)], one (lora+rope)-wide row per input."""
    p = f"layers.{il}.self_attn."
    kv = prec.act(f"blk.{il}.attn_kv_a_mqa.weight", x) @ w(p + "kv_a_proj_with_mqa.weight").T   # [n, lora + rope]
    latent = rms_norm(kv[:, :cfg.kv_lora_rank], w(p + "kv_a_layernorm.weight"), cfg.eps)
    k_pe = rotate(kv[:, cfg.kv_lora_rank:], positions, cfg.rope, prec.f32_angles)
    return np.concatenate([latent, k_pe], axis=1)


def queries(cfg: DraftConfig, w: Weights, il: int, x: np.ndarray,
            positions: np.ndarray, prec: Precision = EXACT) -> tuple[np.ndarray, np.ndarray]:
    """q_nope [H, n, nope] and rotated q_pe [H, n, rope]."""
    p = f"layers.{il}.self_attn."
    if cfg.q_lora_rank:
        q_a = prec.act(f"blk.{il}.attn_q_a.weight", x) @ w(p + "q_a_proj.weight").T
        q_a = rms_norm(q_a, w(p + "q_a_layernorm.weight"), cfg.eps)
        q = prec.act(f"blk.{il}.attn_q_b.weight", q_a) @ w(p + "q_b_proj.weight").T
    else:
        q = prec.act(f"blk.{il}.attn_q.weight", x) @ w(p + "q_proj.weight").T
    q = q.reshape(x.shape[0], cfg.n_heads, cfg.qk_dim).transpose(1, 0, 2)
    return q[..., :cfg.nope_dim], rotate(q[..., cfg.nope_dim:], positions, cfg.rope, prec.f32_angles)


def kv_b_split(cfg: DraftConfig, w: Weights, il: int) -> tuple[np.ndarray, np.ndarray]:
    """kv_b_proj [H*(nope+v), lora] -> k_b [H, nope, lora], v_b [H, v, lora]."""
    kv_b = w(f"layers.{il}.self_attn.kv_b_proj.weight").reshape(cfg.n_heads, cfg.nope_dim + cfg.v_dim, cfg.kv_lora_rank)
    return kv_b[:, :cfg.nope_dim, :], kv_b[:, cfg.nope_dim:, :]


def attention_mask(n_query: int, n_ctx: int, causal: bool) -> np.ndarray:
    """Additive mask [n_query, n_ctx + n_query]: context always visible; block rows all visible
    unless `causal` (which the real draft is NOT: kept to measure what a causal runtime would lose)."""
    mask = np.zeros((n_query, n_ctx + n_query))
    if causal:
        mask[:, n_ctx:] = np.triu(np.full((n_query, n_query), -np.inf), k=1)
    return mask


def mla_absorbed(cfg: DraftConfig, w: Weights, il: int, x: np.ndarray, positions: np.ndarray,
                 ctx_rows: np.ndarray, causal: bool = False, prec: Precision = EXACT,
                 kq_scale_factor: float = 1.0) -> np.ndarray:
    """MLA attention in the latent space: scores q_nope.k_b^T . latent + q_pe . k_pe, output v_b . (p . latent).

    The cache rows are the context rows then the block's own, the order a runtime's cache has them.
    """
    lora = cfg.kv_lora_rank
    rows = np.concatenate([ctx_rows, latent_rows(cfg, w, il, x, positions, prec)], axis=0)    # [Nc+B, lora+rope]
    rows = round_to(rows, prec.cache)
    q_nope, q_pe = queries(cfg, w, il, x, positions, prec)
    k_b, v_b = kv_b_split(cfg, w, il)
    q_lat = np.einsum("hnd,hdl->hnl", prec.act(f"blk.{il}.attn_k_b.weight", q_nope), k_b)   # [H, B, lora]
    q_full = round_to(np.concatenate([q_lat, q_pe], axis=-1), prec.query)                  # [H, B, lora+rope]
    scale = attention_scale(cfg.rope, cfg.qk_dim) * kq_scale_factor
    scores = np.einsum("hnk,mk->hnm", q_full, rows) * scale
    scores = scores + attention_mask(x.shape[0], ctx_rows.shape[0], causal)[None]
    if prec.v_accumulator == "f16":
        out_lat = flash_attention_f16(scores, rows[:, :lora])
    elif prec.v_accumulator is None:
        probs = round_to(softmax(scores), prec.probs)
        out_lat = np.einsum("hnm,ml->hnl", probs, rows[:, :lora])                          # [H, B, lora]
    else:
        raise ProofError(f"no emulation of a {prec.v_accumulator} attention accumulator")
    out_lat = prec.act(f"blk.{il}.attn_v_b.weight", out_lat)
    out = np.einsum("hnl,hvl->nhv", out_lat, v_b).reshape(x.shape[0], cfg.n_heads * cfg.v_dim)
    return prec.act(f"blk.{il}.attn_output.weight", out) @ w(f"layers.{il}.self_attn.o_proj.weight").T


def mla_decompressed(cfg: DraftConfig, w: Weights, il: int, x: np.ndarray, positions: np.ndarray,
                     ctx_rows: np.ndarray, causal: bool = False, prec: Precision = EXACT,
                     kq_scale_factor: float = 1.0) -> np.ndarray:
    """The same attention with per-head K = [k_nope | k_pe], V rebuilt from the latent by kv_b_proj
    (float64 only: no runtime computes this form, so there is nothing to emulate)."""
    if not prec.exact:
        raise ProofError("the decompressed attention is float64 only; emulate a backend with the absorbed one")
    lora = cfg.kv_lora_rank
    rows = np.concatenate([ctx_rows, latent_rows(cfg, w, il, x, positions)], axis=0)
    kv = rows[:, :lora] @ w(f"layers.{il}.self_attn.kv_b_proj.weight").T                   # [M, H*(nope+v)]
    kv = kv.reshape(rows.shape[0], cfg.n_heads, cfg.nope_dim + cfg.v_dim).transpose(1, 0, 2)
    k_nope, v = kv[..., :cfg.nope_dim], kv[..., cfg.nope_dim:]
    k_pe = np.broadcast_to(rows[None, :, lora:], (cfg.n_heads, rows.shape[0], cfg.rope_dim))
    k = np.concatenate([k_nope, k_pe], axis=-1)                                              # [H, M, nope+rope]
    q_nope, q_pe = queries(cfg, w, il, x, positions)
    q = np.concatenate([q_nope, q_pe], axis=-1)                                              # [H, B, nope+rope]
    scale = attention_scale(cfg.rope, cfg.qk_dim) * kq_scale_factor
    scores = np.einsum("hnd,hmd->hnm", q, k) * scale
    probs = softmax(scores + attention_mask(x.shape[0], ctx_rows.shape[0], causal)[None])
    out = np.einsum("hnm,hmv->nhv", probs, v).reshape(x.shape[0], cfg.n_heads * cfg.v_dim)
    return out @ w(f"layers.{il}.self_attn.o_proj.weight").T


def swiglu_mlp(w: Weights, il: int, x: np.ndarray, prec: Precision = EXACT) -> np.ndarray:
    p, g = f"layers.{il}.mlp.", f"blk.{il}."
    gate = prec.act(g + "ffn_gate.weight", x) @ w(p + "gate_proj.weight").T
    up = prec.act(g + "ffn_up.weight", x) @ w(p + "up_proj.weight").T
    return prec.act(g + "ffn_down.weight", silu(gate) * up) @ w(p + "down_proj.weight").T


# ---------------------------------------------------------------------------------------
# the draft

#: residual-stream taps: the runtime graph's tensor names (without the "-il" layer suffix)
TAP_CONTEXT_ROWS = "Kcur_injected"   # a layer's context K rows before the cache stores them
TAP_EMBEDDINGS = "inp_noise_embd"    # the block's token embeddings
TAP_AFTER_ATTN = "ffn_inp"           # the stream after a layer's attention
TAP_AFTER_FFN = "l_out"              # the stream after a layer's FFN (the layer's output)


@dataclass
class DraftOutputs:
    context: np.ndarray            # [C, E] fused context (after context_norm)
    context_rows: list[np.ndarray]  # per layer [C, lora + rope]
    hidden: np.ndarray             # [B, E] after final_norm
    base_logits: np.ndarray        # [B, V] target lm_head on `hidden`
    biased_logits: np.ndarray      # [B, V] base + Markov bias (== base without a Markov head)
    chain: np.ndarray              # [B] greedy tokens (argmax of the biased rows)
    confidence_logit: np.ndarray | None = None  # [B] before the sigmoid
    confidence: np.ndarray | None = None        # [B] sigmoid(confidence_logit)
    extras: dict = field(default_factory=dict)


class DraftReference:
    def __init__(self, config: dict, tensors: dict[str, np.ndarray], token_embd: np.ndarray,
                 lm_head: np.ndarray, source: str = "checkpoint"):
        self.config = DraftConfig.from_hf(config)
        self.w = Weights(tensors, source)
        self.token_embd = np.asarray(token_embd, dtype=np.float64)
        self.lm_head = np.asarray(lm_head, dtype=np.float64)
        # the context part of recent forwards (shared with variant()s; the rope is in the key)
        self._context_memo: dict = {}
        cfg = self.config
        if self.token_embd.shape[1] != cfg.hidden_size or self.lm_head.shape[1] != cfg.hidden_size:
            raise ProofError(f"target embedding/lm_head width {self.token_embd.shape[1]}/{self.lm_head.shape[1]} "
                             f"!= draft hidden_size {cfg.hidden_size}")

    @classmethod
    def load(cls, checkpoint_dir: Path, target_gguf: Path) -> "DraftReference":
        config, tensors = read_checkpoint(checkpoint_dir)
        token_embd, lm_head = read_target_head(target_gguf)
        return cls(config, tensors, token_embd, lm_head, source=str(checkpoint_dir))

    def fuse_context(self, features: np.ndarray, prec: Precision = EXACT) -> np.ndarray:
        cfg, w = self.config, self.w
        features = np.asarray(features, dtype=np.float64)
        width = cfg.n_taps * cfg.target_hidden_size
        if features.ndim != 2 or features.shape[1] != width:
            raise ProofError(f"features must be [n_ctx, {width}] (taps x target hidden), got {features.shape}")
        fused = prec.act("fc.weight", features) @ w("context_proj.weight").T
        return rms_norm(fused, w("context_norm.weight"), cfg.eps)

    def context_rows(self, context: np.ndarray, positions: np.ndarray, prec: Precision = EXACT) -> list[np.ndarray]:
        """Per layer the (lora + rope)-wide rows of the context before the cache stores them:
        no input_layernorm, no query."""
        return [latent_rows(self.config, self.w, il, context, positions, prec) for il in range(self.config.n_layers)]

    def _context(self, features: np.ndarray, positions: np.ndarray, prec: Precision) -> tuple[np.ndarray, list]:
        """fuse_context + context_rows, remembered for the last few inputs: a parity case runs
        a dozen forwards (emulated, exact, forced chains, controls) over the same context."""
        key = (hashlib.sha1(np.ascontiguousarray(features).tobytes()).hexdigest(), features.shape,
               np.asarray(positions).tobytes(), repr(prec), self.config.rope)
        if key not in self._context_memo:
            context = self.fuse_context(features, prec)
            if len(self._context_memo) >= 8:
                self._context_memo.pop(next(iter(self._context_memo)))
            self._context_memo[key] = (context, self.context_rows(context, positions, prec))
        context, rows = self._context_memo[key]
        return context, list(rows)

    def variant(self, **rope_changes) -> "DraftReference":
        """The same weights with other rotary parameters (yarn=False, style="neox": controls)."""
        other = DraftReference.__new__(DraftReference)
        other.__dict__.update(self.__dict__)
        other.config = dataclasses.replace(self.config, rope=dataclasses.replace(self.config.rope, **rope_changes))
        return other

    def forward(self, features: np.ndarray, block_ids, ctx_positions=None, block_pos0: int | None = None,
                attention: str = "absorbed", causal: bool = False, chain=None,
                precision: Precision = EXACT, kq_scale_factor: float = 1.0,
                feed: Mapping[str, np.ndarray] | None = None) -> DraftOutputs:
        """One draft step for one sequence.

        features:      [C, taps * target_hidden] target hidden states at the context positions
        block_ids:     [B] anchor then MASK ids (any ids are accepted)
        ctx_positions: [C] positions of the context rows (default 0..C-1)
        block_pos0:    position of the anchor (default: one past the last context position)
        chain:         [B] tokens to condition the Markov head on instead of the greedy chain
                       (to compare logits row by row with a runtime whose chain differs)
        precision:     where to round as a reduced-precision backend does (precision.py)
        kq_scale_factor: multiplies the attention scale (1.0; else a control: a wrong scale)
        feed:          a runtime's own values at the stream taps (STREAM_TAPS names): each stage
                       then starts from them instead of from the reference's previous stage

        extras["taps"] holds the reference's values at the stream taps, extras["stages"] what
        each stage added (per layer "attn-i" and "ffn-i", computed from the fed input when fed).
        """
        cfg, w = self.config, self.w
        features = np.asarray(features, dtype=np.float64)
        block_ids = np.asarray(block_ids, dtype=np.int64)
        n_ctx = features.shape[0]
        ctx_positions = np.arange(n_ctx) if ctx_positions is None else np.asarray(ctx_positions)
        if block_pos0 is None:
            block_pos0 = int(ctx_positions.max()) + 1 if n_ctx else 0
        block_positions = block_pos0 + np.arange(block_ids.shape[0])
        attend = {"absorbed": mla_absorbed, "decompressed": mla_decompressed}[attention]

        taps: dict[str, np.ndarray] = {}
        stages: dict[str, np.ndarray] = {}

        def tap(name: str, value: np.ndarray) -> np.ndarray:
            taps[name] = value
            if feed is None:
                return value
            if name not in feed:
                raise ProofError(f"the runtime's values at {name} are missing", hint="dump every STREAM_TAPS name")
            return np.asarray(feed[name], dtype=np.float64)

        context, own_rows = self._context(features, ctx_positions, precision)
        ctx_rows = [tap(f"{TAP_CONTEXT_ROWS}-{il}", rows) for il, rows in enumerate(own_rows)]

        h = tap(TAP_EMBEDDINGS, self.token_embd[block_ids])
        for il in range(cfg.n_layers):
            p = f"layers.{il}."
            x = rms_norm(h, w(p + "input_layernorm.weight"), cfg.eps)
            stages[f"attn-{il}"] = attend(cfg, w, il, x, block_positions, ctx_rows[il], causal=causal, prec=precision,
                                          kq_scale_factor=kq_scale_factor)
            h = tap(f"{TAP_AFTER_ATTN}-{il}", h + stages[f"attn-{il}"])
            x = rms_norm(h, w(p + "post_attention_layernorm.weight"), cfg.eps)
            stages[f"ffn-{il}"] = swiglu_mlp(w, il, x, precision)
            h = tap(f"{TAP_AFTER_FFN}-{il}", h + stages[f"ffn-{il}"])
        hidden = rms_norm(h, w("final_norm.weight"), cfg.eps)
        # base logits as the runtime's driver rebuilds them (hidden x head in double); the
        # logits the graph returns see the head's matmul rounding
        base = hidden @ self.lm_head.T
        graph = precision.act("output.weight", hidden) @ self.lm_head.T
        out = self._heads(context, own_rows, hidden, base, graph, block_ids, chain, precision)
        out.extras.update(taps=taps, stages=stages)
        return out

    def _heads(self, context, ctx_rows, hidden, base, graph, block_ids, forced=None,
               prec: Precision = EXACT) -> DraftOutputs:
        w = self.w
        if not w.has("markov_head.markov_w1.weight"):
            chain = np.argmax(graph, axis=1)
            return DraftOutputs(context, ctx_rows, hidden, base, graph.copy(), chain)
        w1, w2 = w("markov_head.markov_w1.weight"), w("markov_head.markov_w2.weight")
        has_conf = w.has("confidence_head.proj.weight")
        biased = np.empty_like(base)
        chain = np.empty(base.shape[0], dtype=np.int64)
        conf_logit = np.empty(base.shape[0]) if has_conf else None
        prev = int(block_ids[0])                       # the anchor conditions the first row
        for k in range(base.shape[0]):
            m = w1[prev]
            biased[k] = graph[k] + w2 @ prec.act("markov_w2.weight", m)
            if has_conf:
                feat = prec.act("conf_proj.weight", np.concatenate([hidden[k], m]))
                conf_logit[k] = float(w("confidence_head.proj.weight")[0] @ feat)
                if w.has("confidence_head.proj.bias"):
                    conf_logit[k] += float(w("confidence_head.proj.bias")[0])
            chain[k] = int(np.argmax(biased[k]))
            prev = int(chain[k]) if forced is None else int(forced[k])   # greedy: the token just drafted
        conf = sigmoid(conf_logit) if has_conf else None
        return DraftOutputs(context, ctx_rows, hidden, base, biased, chain, conf_logit, conf)


def stream_taps(n_layers: int) -> list[str]:
    """Names of the residual-stream taps, as the runtime's graph names its tensors
    (dflash-graph-mla.cpp.j2: cb(..., name, il) -> "name-il"), for `forward(feed=...)`."""
    return ([f"{TAP_CONTEXT_ROWS}-{il}" for il in range(n_layers)] + [TAP_EMBEDDINGS]
            + [f"{t}-{il}" for il in range(n_layers) for t in (TAP_AFTER_ATTN, TAP_AFTER_FFN)])


def stage_outputs(taps: Mapping[str, np.ndarray], n_layers: int) -> dict[str, np.ndarray]:
    """What each stage added to the residual stream, from a run's taps (forward's extras["stages"] layout)."""
    out = {}
    h = np.asarray(taps[TAP_EMBEDDINGS], dtype=np.float64)
    for il in range(n_layers):
        after_attn = np.asarray(taps[f"{TAP_AFTER_ATTN}-{il}"], dtype=np.float64)
        after_ffn = np.asarray(taps[f"{TAP_AFTER_FFN}-{il}"], dtype=np.float64)
        out[f"attn-{il}"], out[f"ffn-{il}"] = after_attn - h, after_ffn - after_attn
        h = after_ffn
    return out


def nmse(actual: np.ndarray, expected: np.ndarray) -> float:
    """Normalised mean squared error: sum((a-e)^2) / sum(e^2)."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise ProofError(f"shape mismatch {actual.shape} vs {expected.shape}")
    denom = float(np.sum(expected * expected))
    return float(np.sum((actual - expected) ** 2) / denom) if denom else float(np.sum((actual - expected) ** 2))
