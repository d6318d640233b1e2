"""The Kimi-K3-DSpark draft in plain PyTorch: what a user would run on CPU without llama.cpp.

Written from docs/spec/draft-model.md like proof/reference/model.py, but the way a PyTorch user
runs a model: BF16 weights straight from the checkpoint, BF16 activations, torch's own
linear/einsum/softmax kernels, the latent (kv_lora + rope) rows cached per layer and the
absorbed attention (q_nope . k_b against the latent, v_b after the attention), the target's
token embedding and lm_head read from its GGUF without a copy (BF16 or F32 only).

    draft = TorchDraft.load(checkpoint_dir, target_gguf)
    draft.inject(features, positions)          # fills the per-layer latent cache
    logits, hidden, chain = draft.block(ids, block_pos0)   # + the confidence head, as llama.cpp runs it
    draft.truncate(n)                          # roll the cache back to n rows
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.proof.reference.yarn import RopeConfig, attention_scale, cos_sin_magnitude, inv_freq


def _gguf_matrix(reader, name: str):
    """A 2-D GGUF tensor as a torch tensor over the mapped file (no copy): [rows, n_embd]."""
    import warnings

    import torch
    from gguf import GGMLQuantizationType as Q

    for t in reader.tensors:
        if t.name == name:
            rows, cols = int(t.shape[1]), int(t.shape[0])
            data = np.asarray(t.data)
            # the mapped file is read-only and nothing writes to it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            if t.tensor_type == Q.BF16:
                return torch.from_numpy(data.view(np.int16).reshape(rows, cols)).view(torch.bfloat16)
            if t.tensor_type == Q.F32:
                return torch.from_numpy(data.reshape(rows, cols))
            raise ProofError(f"target tensor {name} is {t.tensor_type.name}; the PyTorch draft reads BF16 or F32")
    raise ProofError(f"the target has no {name}")


class TorchDraft:
    def __init__(self, config: dict, tensors: dict, token_embd, lm_head, dtype=None):
        import torch

        # BF16 is what the bench times; float64 shows the draft is the draft on every CPU
        self.dtype = dtype or torch.bfloat16
        self.acc = torch.float32 if self.dtype == torch.bfloat16 else self.dtype
        self.cfg = config
        self.w = tensors
        self.token_embd, self.lm_head = token_embd.to(self.dtype), lm_head.to(self.dtype)
        c = config
        self.h, self.n_head = c["hidden_size"], c["num_attention_heads"]
        self.nope, self.rope_dim, self.v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.lora, self.eps, self.n_layer = c["kv_lora_rank"], float(c["rms_norm_eps"]), c["num_hidden_layers"]
        self.rope = RopeConfig.from_hf_config(c)
        self.scale = attention_scale(self.rope, self.nope + self.rope_dim)
        self.inv_freq = torch.tensor(inv_freq(self.rope), dtype=torch.float64)
        self.mag = cos_sin_magnitude(self.rope)
        self.mask_id = int(c["mask_token_id"])
        # kv_b_proj [H*(nope+v), lora] split per head once: k_b [H, nope, lora], v_b [H, v, lora]
        self.k_b, self.v_b = [], []
        for il in range(self.n_layer):
            kv_b = tensors[f"layers.{il}.self_attn.kv_b_proj.weight"].view(self.n_head, self.nope + self.v, self.lora)
            self.k_b.append(kv_b[:, : self.nope, :])
            self.v_b.append(kv_b[:, self.nope:, :])
        self.cache: list = [None] * self.n_layer

    @classmethod
    def load(cls, checkpoint_dir: Path, target_gguf: Path, dtype=None) -> "TorchDraft":
        import torch
        from gguf import GGUFReader
        from safetensors.torch import load_file

        checkpoint_dir = Path(checkpoint_dir)
        config = json.loads((checkpoint_dir / "config.json").read_text())
        tensors = {}
        for f in sorted(checkpoint_dir.glob("*.safetensors")):
            tensors.update({k: v.to(dtype or torch.bfloat16) for k, v in load_file(str(f)).items()})
        reader = GGUFReader(str(target_gguf))
        return cls(config, tensors, _gguf_matrix(reader, "token_embd.weight"), _gguf_matrix(reader, "output.weight"),
                   dtype)

    # ------------------------------------------------------------------ pieces
    def _norm(self, x, weight):
        import torch
        xf = x.to(self.acc)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * weight

    def _rotate(self, x, positions):
        """Interleaved-pair rotation of the last axis; x [..., n, rope], positions [n]."""
        import torch
        ang = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        cos, sin = (torch.cos(ang) * self.mag).to(self.acc), (torch.sin(ang) * self.mag).to(self.acc)
        xf = x.to(self.acc)
        even, odd = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
        return out.to(x.dtype)

    def _latent_rows(self, il: int, x, positions):
        import torch
        p = f"layers.{il}.self_attn."
        kv = torch.nn.functional.linear(x, self.w[p + "kv_a_proj_with_mqa.weight"])
        latent = self._norm(kv[:, : self.lora], self.w[p + "kv_a_layernorm.weight"])
        return torch.cat((latent, self._rotate(kv[:, self.lora:], positions)), dim=1)

    # ------------------------------------------------------------------ passes
    def inject(self, features: np.ndarray, positions: np.ndarray) -> None:
        """Context injection: fuse the target features, append each layer's latent rows to its cache."""
        import torch
        F = torch.nn.functional
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float64)).to(self.dtype)
            ctx = self._norm(F.linear(x, self.w["context_proj.weight"]), self.w["context_norm.weight"])
            pos = torch.from_numpy(np.asarray(positions, dtype=np.int64))
            for il in range(self.n_layer):
                rows = self._latent_rows(il, ctx, pos)
                self.cache[il] = rows if self.cache[il] is None else torch.cat((self.cache[il], rows), dim=0)

    def truncate(self, n_rows: int) -> None:
        self.cache = [None if c is None or n_rows == 0 else c[:n_rows] for c in self.cache]

    def block(self, ids, block_pos0: int):
        """One block [anchor, MASK...]: (Markov-biased logits [B, V] float32, hidden [B, E], greedy chain)."""
        import torch
        F = torch.nn.functional
        with torch.inference_mode():
            ids_t = torch.tensor(list(ids), dtype=torch.int64)
            pos = block_pos0 + torch.arange(len(ids_t))
            h = self.token_embd[ids_t]
            for il in range(self.n_layer):
                p = f"layers.{il}."
                x = self._norm(h, self.w[p + "input_layernorm.weight"])
                q = F.linear(self._norm(F.linear(x, self.w[p + "self_attn.q_a_proj.weight"]),
                                        self.w[p + "self_attn.q_a_layernorm.weight"]),
                             self.w[p + "self_attn.q_b_proj.weight"])
                q = q.view(len(ids_t), self.n_head, self.nope + self.rope_dim).transpose(0, 1)   # [H, B, nope+rope]
                q_pe = self._rotate(q[..., self.nope:], pos)
                q_lat = torch.matmul(q[..., : self.nope], self.k_b[il])                          # [H, B, lora]
                rows = torch.cat((self.cache[il], self._latent_rows(il, x, pos)), dim=0)          # [C+B, lora+rope]
                scores = (torch.matmul(q_lat, rows[:, : self.lora].T) + torch.matmul(q_pe, rows[:, self.lora:].T))
                probs = torch.softmax(scores.to(self.acc) * self.scale, dim=-1).to(self.dtype)  # non-causal
                out_lat = torch.matmul(probs, rows[:, : self.lora])                               # [H, B, lora]
                out = torch.matmul(out_lat, self.v_b[il].transpose(1, 2))                         # [H, B, v]
                out = out.transpose(0, 1).reshape(len(ids_t), self.n_head * self.v)
                h = h + F.linear(out, self.w[p + "self_attn.o_proj.weight"])
                x = self._norm(h, self.w[p + "post_attention_layernorm.weight"])
                gate = F.linear(x, self.w[p + "mlp.gate_proj.weight"])
                mlp = F.silu(gate) * F.linear(x, self.w[p + "mlp.up_proj.weight"])
                h = h + F.linear(mlp, self.w[p + "mlp.down_proj.weight"])
            hidden = self._norm(h, self.w["final_norm.weight"])
            base = F.linear(hidden, self.lm_head).to(self.acc)
            w1, w2 = self.w["markov_head.markov_w1.weight"], self.w["markov_head.markov_w2.weight"]
            conf_w, conf_b = self.w.get("confidence_head.proj.weight"), self.w.get("confidence_head.proj.bias")
            biased = torch.empty_like(base)
            chain, conf = [], []
            prev = int(ids_t[0])
            for k in range(base.shape[0]):
                m = w1[prev]
                biased[k] = base[k] + F.linear(m, w2).to(self.acc)
                if conf_w is not None:
                    conf.append(float(torch.sigmoid(F.linear(torch.cat((hidden[k], m)), conf_w, conf_b))))
                prev = int(torch.argmax(biased[k]))
                chain.append(prev)
        return biased.numpy(), hidden.to(self.acc).numpy(), chain
