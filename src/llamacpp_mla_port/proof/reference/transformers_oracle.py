"""An oracle nobody here wrote: the draft's forward built from transformers' DeepSeek-V3 modules.

Design and bounds: docs/proof.md#oracle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.proof.reference.model import DraftOutputs, DraftReference


def deepseek_v3_config(config: dict, **changes):
    """The draft's config.json as a transformers DeepseekV3Config (eager attention, dense MLP in
    every layer). `changes` replace DeepseekV3Config arguments; a `rope_scaling` dict is merged
    into the config's own (controls: {"mscale_all_dim": 0.0}, rope_interleave=False)."""
    from transformers import DeepseekV3Config

    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", config.get("rope_theta", 10000.0)))
    if rope.get("rope_type", rope.get("type", "default")) == "default":
        rope = {}
    rope.update(changes.pop("rope_scaling", {}))
    n_layers = int(config["num_hidden_layers"])
    kwargs = dict(
        vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]), num_hidden_layers=n_layers,
        num_attention_heads=int(config["num_attention_heads"]),
        num_key_value_heads=int(config.get("num_key_value_heads", config["num_attention_heads"])),
        q_lora_rank=config.get("q_lora_rank") or None, kv_lora_rank=int(config["kv_lora_rank"]),
        qk_nope_head_dim=int(config["qk_nope_head_dim"]), qk_rope_head_dim=int(config["qk_rope_head_dim"]),
        v_head_dim=int(config["v_head_dim"]), rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        hidden_act=config.get("hidden_act", "silu"),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        rope_theta=theta, rope_scaling=rope or None, first_k_dense_replace=n_layers,
        attention_bias=False, attn_implementation="eager")
    if "rope_interleave" in config:      # absent from the real config: transformers' default (True) holds
        kwargs["rope_interleave"] = bool(config["rope_interleave"])
    kwargs.update(changes)
    return DeepseekV3Config(**kwargs)


def read_torch_checkpoint(checkpoint_dir: Path) -> tuple[dict, dict]:
    """config.json and every tensor as float64 torch tensors, read by safetensors itself."""
    import json

    import torch
    from safetensors.torch import load_file

    checkpoint_dir = Path(checkpoint_dir)
    tensors = {}
    for f in sorted(checkpoint_dir.glob("*.safetensors")):
        tensors.update({k.removeprefix("model."): v.to(torch.float64) for k, v in load_file(str(f)).items()})
    if not tensors:
        raise ProofError(f"{checkpoint_dir}: no .safetensors file")
    return json.loads((checkpoint_dir / "config.json").read_text()), tensors


class TransformersOracle:
    """The draft wired from transformers' modules (module doc). Per layer a DeepseekV3DecoderLayer
    holds the checkpoint's layer weights by their own names (strict load); its
    input_layernorm, self_attn (DeepseekV3Attention), post_attention_layernorm and mlp
    (DeepseekV3MLP) are called one by one, because the context rows enter the attention
    without input_layernorm. Float64 everywhere transformers lets a caller choose; its
    RMSNorm, RoPE angles and eager softmax compute in float32 by its own design.

    `latent_norm_eps`: DeepseekV3Attention builds q_a_layernorm and kv_a_layernorm with
    RMSNorm's default eps 1e-6 whatever rms_norm_eps says (DeepSeek-V3's own value); None keeps
    that, a number sets both (the config's eps, which the engines running this draft use)."""

    def __init__(self, config: dict, tensors: dict, token_embd: np.ndarray, lm_head: np.ndarray,
                 latent_norm_eps: float | None = None, **changes):
        import torch
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

        self.cfg = deepseek_v3_config(config, **changes)
        c = self.cfg
        tensors = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in tensors.items()}

        def loaded(module, prefix: str):
            # float64 parameters first: load_state_dict copies into the parameters' own dtype
            module.double().load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)},
                                            strict=True)
            return module.eval()

        self.layers = [loaded(ds.DeepseekV3DecoderLayer(c, il), f"layers.{il}.") for il in range(c.num_hidden_layers)]
        self.context_norm = loaded(ds.DeepseekV3RMSNorm(c.hidden_size, c.rms_norm_eps), "context_norm.")
        self.final_norm = loaded(ds.DeepseekV3RMSNorm(c.hidden_size, c.rms_norm_eps), "final_norm.")
        for attn in (layer.self_attn for layer in self.layers if latent_norm_eps is not None):
            attn.kv_a_layernorm.variance_epsilon = float(latent_norm_eps)
            if c.q_lora_rank:
                attn.q_a_layernorm.variance_epsilon = float(latent_norm_eps)
        self.rotary = ds.DeepseekV3RotaryEmbedding(c).double()
        self.context_proj = tensors["context_proj.weight"]
        self.token_embd, self.lm_head = np.asarray(token_embd, np.float64), np.asarray(lm_head, np.float64)
        # the Markov and confidence heads: our reference's own code on the same tensors
        self.heads = DraftReference(config, {k: v.numpy() for k, v in tensors.items()}, self.token_embd,
                                    self.lm_head, source="oracle")

    @classmethod
    def load(cls, checkpoint_dir: Path, token_embd: np.ndarray, lm_head: np.ndarray, **kwargs) -> "TransformersOracle":
        config, tensors = read_torch_checkpoint(checkpoint_dir)
        return cls(config, tensors, token_embd, lm_head, **kwargs)

    def forward(self, features: np.ndarray, block_ids, ctx_positions=None, block_pos0: int | None = None,
                chain=None, causal: bool = False) -> DraftOutputs:
        """One draft step (DraftReference.forward's arguments and outputs; `causal` is a control)."""
        import torch

        block_ids = np.asarray(block_ids, dtype=np.int64)
        n_ctx, n_block = features.shape[0], block_ids.shape[0]
        ctx_positions = np.arange(n_ctx) if ctx_positions is None else np.asarray(ctx_positions)
        if block_pos0 is None:
            block_pos0 = int(ctx_positions.max()) + 1 if n_ctx else 0
        positions = torch.from_numpy(np.concatenate([ctx_positions, block_pos0 + np.arange(n_block)]))[None]
        mask = torch.zeros(1, 1, n_ctx + n_block, n_ctx + n_block, dtype=torch.float64)
        if causal:
            mask[..., n_ctx:, n_ctx:] = torch.full((n_block, n_block), float("-inf"), dtype=torch.float64).triu(1)
        with torch.no_grad():
            context = self.context_norm(torch.from_numpy(np.asarray(features, np.float64)) @ self.context_proj.T)
            h = torch.from_numpy(self.token_embd[block_ids])
            cos_sin = self.rotary(h, positions)
            for layer in self.layers:
                # context rows: keys and values only (their queries are computed and dropped)
                rows = torch.cat([context, layer.input_layernorm(h)])[None]
                attn, _ = layer.self_attn(hidden_states=rows, position_embeddings=cos_sin, attention_mask=mask)
                h = h + attn[0, n_ctx:]
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            hidden = self.final_norm(h).numpy()
        base = hidden @ self.lm_head.T
        return self.heads._heads(context.numpy(), [], hidden, base, base, block_ids, chain)


# ------------------------------------------------------------------ the oracle against the parity matrix
#: NMSE bounds of our float64 reference and llama.cpp F32 against the oracle (docs/bounds.md, oracle
#: rows), as built or with its latent norms at the config's eps: positions up to 1300 (worst measured
#: 4.9e-10), and around 32.9K (test-slow: 2.9e-7, float32 RoPE angles in transformers and in ggml)
ORACLE_BOUND, ORACLE_BOUND_32K = 5e-9, 3e-6
#: the oracle with a known mistake, against our reference (the gross ones >= 100x over ORACLE_BOUND)
ORACLE_CONTROLS = {"causal_block": ({}, {"causal": True}),
                   "no_mscale_all_dim": ({"rope_scaling": {"mscale_all_dim": 0.0}}, {}),
                   "neox_rotation": ({"rope_interleave": False}, {}), "kq_scale_1pct": ({}, {})}


def oracle_figures(parity_work: Path, target_gguf: Path) -> dict:
    """Per mode, the worst NMSE over every shape and case of the parity matrix in `parity_work`: our
    float64 reference and llama.cpp's run (read back from the matrix's folders) against the oracle,
    as built and with its latent norms at the config's eps; per control the smallest NMSE of the wrong
    oracle against our reference (F32 cases); `problems` lists every figure over its bound."""
    from llamacpp_mla_port.proof import parity
    from llamacpp_mla_port.proof.reference.model import read_target_head
    from llamacpp_mla_port.proof.run.draft_logits import load_outputs

    token_embd, lm_head = read_target_head(target_gguf)
    table, ctl, seen = {}, {}, {}
    for pcfg in parity.PARITY_CONFIGS:
        for weights in ("float32", "bfloat16"):
            ckpt = Path(parity_work) / f"{pcfg.name}-{weights}" / "checkpoint"
            ref = DraftReference.load(ckpt, target_gguf)
            oracles = {"as_built": TransformersOracle.load(ckpt, token_embd, lm_head),
                       "aligned": TransformersOracle.load(ckpt, token_embd, lm_head, latent_norm_eps=ref.config.eps)}
            wrong = {name: TransformersOracle.load(ckpt, token_embd, lm_head, **changes)
                     for name, (changes, _) in ORACLE_CONTROLS.items()} if weights == "float32" else {}
            for layer in (wrong["kq_scale_1pct"].layers if wrong else ()):
                layer.self_attn.scaling *= 1.01
            for mode in (m for m in parity.MODES if m.weights == weights and not m.unsupported(pcfg.overrides)):
                row = table.setdefault(mode.name, {})
                for ci, (pos0, n_ctx) in enumerate(mode.cases):
                    run = Path(parity_work) / "runs" / pcfg.name / mode.name / f"case{ci}"
                    got = load_outputs(run)
                    _, ids = parity.case_inputs(ref, pcfg, 0, ci, n_ctx, token_embd.shape[0])
                    feats = np.load(run / "features.npy").astype(np.float64)      # what llama.cpp was given
                    key, positions = (pcfg.name, weights, ci, pos0, n_ctx), pos0 + np.arange(n_ctx)
                    if key not in seen:      # the same inputs recur across modes: forward them once
                        seen[key] = (ref.forward(feats, ids, ctx_positions=positions),
                                     {n: o.forward(feats, ids, ctx_positions=positions) for n, o in oracles.items()})
                    want, outs = seen[key]
                    for name, oracle in oracles.items():
                        for who, res in (("reference", want), ("llama", got)):
                            forced = outs[name] if np.array_equal(res.chain, outs[name].chain) else \
                                oracle.forward(feats, ids, ctx_positions=positions, chain=res.chain)
                            figure = parity.compare(res, outs[name], forced)["worst_nmse"]
                            row[f"{who}_vs_{name}"] = max(row.get(f"{who}_vs_{name}", 0.0), figure)
                    for cname, oracle in (wrong.items() if mode.name == "f32" else ()):
                        out = oracle.forward(feats, ids, ctx_positions=positions, chain=want.chain,
                                             **ORACLE_CONTROLS[cname][1])
                        ctl[cname] = min(ctl.get(cname, np.inf), parity.compare(out, want)["worst_nmse"])
    # llama.cpp's reduced precisions against the oracle: what the precision costs (the mode's cost bound)
    bound = {m.name: ORACLE_BOUND if m.cost_bound is None else m.cost_bound for m in parity.MODES}
    problems = [f"{mode}: {key} {v:.2e} over {ORACLE_BOUND if key.startswith('reference') else bound[mode]:.0e}"
                for mode, row in table.items() for key, v in row.items()
                if v > (ORACLE_BOUND if key.startswith("reference") else bound[mode])]
    problems += [f"control {name} {ctl.get(name, 0.0):.2e} under {f * ORACLE_BOUND:.0e}"
                 for name, f in (("causal_block", 100), ("no_mscale_all_dim", 100), ("neox_rotation", 100),
                                 ("kq_scale_1pct", 1)) if not ctl.get(name, 0.0) > f * ORACLE_BOUND]
    return {"modes": table, "controls": ctl, "bounds": bound, "problems": problems}
