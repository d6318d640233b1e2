"""The target side: the hidden states the patched Kimi-K3 target hands a DSpark draft.

`dump_target_features(...)` runs the `target-features` program (cpp/target-features.cpp):
the target decodes a prompt with llama_set_embeddings_layer_inp on the draft's
`target_layers`, exactly what common/speculative.cpp asks of it, and the rows come back
as one [n_tokens, taps * n_embd] array, the draft's feature layout.

`prefix_stream(...)` is the independent side: from the embedding rows and every layer's
attention and FFN outputs (dumped from the graph by name, the eval-callback mechanism),
it rebuilds each layer's input from the definition of Kimi-K3's attention residuals: the
"prefix" stream is the running sum of sublayer outputs since the last residual
checkpoint; a checkpoint layer (il % block_size == 0) banks its input and restarts the
sum from its own attention output.

The verb `target-features` (commands/target_features.py) is the command line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port.process import run


@dataclass
class TargetFeatures:
    features: np.ndarray               # [n_tokens, taps * n_embd] float32
    logits: np.ndarray                 # [n_tokens, n_vocab]
    layers: list[int]                  # llama.cpp layer indices whose INPUT was taken
    dumps: dict[str, np.ndarray]       # graph tensors by name, [n_tokens, ne0]

    def tap(self, k: int) -> np.ndarray:
        n_embd = self.features.shape[1] // len(self.layers)
        return self.features[:, k * n_embd:(k + 1) * n_embd]


def dump_target_features(binary: Path, target: Path, tokens, out_dir: Path, layers=None, draft: Path | None = None,
                         dump=(), threads: int = 2, timeout: float = 600) -> TargetFeatures:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [str(binary), "--target", str(target), "--tokens", ",".join(str(int(t)) for t in tokens),
           "--out", str(out_dir), "--threads", str(threads)]
    if layers is not None:
        cmd += ["--layers", ",".join(str(int(i)) for i in layers)]
    elif draft is not None:
        cmd += ["--draft", str(draft)]
    else:
        raise ProofError("pass the target layers or the draft GGUF that names them")
    if dump:
        cmd += ["--dump", ",".join(dump)]
    proc = run(cmd, timeout=timeout)
    if proc.returncode != 0:
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("target-features: error:")]
        raise ProofError(f"target-features failed (exit {proc.returncode}): {' '.join(errors) or proc.stderr[-3000:]}",
                         hint=f"rerun with --verbose: {' '.join(cmd)} --verbose")
    meta = json.loads((out_dir / "meta.json").read_text())
    return TargetFeatures(
        features=np.load(out_dir / "features.npy"),
        logits=np.load(out_dir / "logits.npy"),
        layers=list(meta["layers"]),
        dumps={name: np.load(out_dir / f"dump-{name}.npy") for name in dump},
    )


def sublayer_tensor_names(layer_types: str, block_size: int) -> tuple[list[str], list[str]]:
    """Graph names of each layer's attention and FFN outputs in llama.cpp's kimi-k3 graph.

    At a checkpoint layer the attention output IS the restarted prefix (the same tensor),
    so it carries the later name `prefix_sum_attn-L`; elsewhere it is `mla_out-L`/`kda_out-L`.
    """
    attn, ffn = [], []
    for il, ty in enumerate(layer_types):
        if block_size > 0 and il % block_size == 0:
            attn.append(f"prefix_sum_attn-{il}")
        else:
            attn.append(f"{'mla' if ty == 'M' else 'kda'}_out-{il}")
        ffn.append(f"ffn_out-{il}")
    return attn, ffn


def prefix_stream(embd_rows: np.ndarray, attn_outs: list[np.ndarray], ffn_outs: list[np.ndarray],
                  block_size: int) -> list[np.ndarray]:
    """Inputs of layers 0..N (N+1 arrays) under block-local attention residuals, in float64."""
    inputs = [np.asarray(embd_rows, dtype=np.float64)]
    for il, (a, f) in enumerate(zip(attn_outs, ffn_outs)):
        restart = block_size > 0 and il % block_size == 0
        carried = 0.0 if restart else inputs[-1]
        inputs.append(carried + np.asarray(a, np.float64) + np.asarray(f, np.float64))
    return inputs


def full_residual_stream(embd_rows: np.ndarray, attn_outs, ffn_outs) -> list[np.ndarray]:
    """The plain (non block-local) residual sum: what the draft was NOT trained on."""
    inputs = [np.asarray(embd_rows, dtype=np.float64)]
    for a, f in zip(attn_outs, ffn_outs):
        inputs.append(inputs[-1] + np.asarray(a, np.float64) + np.asarray(f, np.float64))
    return inputs
