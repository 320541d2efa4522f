"""FLOPs and bytes of the model's device work, and the peak rates of the targets.

What a forward pass computes (`forward_flops`: 2 x matmul weights per token, attention
4 x L x H x Dh per attended (query, key) pair, the head 2 x D x V per scored position) and
what a decode step reads (`weight_bytes` + `kv_bytes`). `experiments/device_check.py`
divides these by measured times; `memory.timing` divides them by the targets' peaks.

Axis legend: L layers, D width, H query heads, Hkv key/value heads, Dh head dim, F MLP (or
expert) width, E experts, k experts per token, V vocabulary.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Target:
    """One accelerator: dense bfloat16 TFLOP/s, HBM TB/s and GB (vendor sheets)."""

    name: str
    tflops: float
    tbps: float
    memory_gb: float


# By a substring of `jax.Device.device_kind`, first match wins.
TARGETS = {
    "H200": Target("NVIDIA H200", 989.0, 4.8, 141.0),
    "H100": Target("NVIDIA H100 SXM", 989.0, 3.35, 80.0),
    "A100": Target("NVIDIA A100", 312.0, 2.04, 80.0),
    "L40S": Target("NVIDIA L40S", 362.0, 0.864, 48.0),
    "B200": Target("NVIDIA B200", 2250.0, 8.0, 192.0),
    "TPU v5 lite": Target("TPU v5e", 197.0, 0.819, 16.0),
    "TPU v5e": Target("TPU v5e", 197.0, 0.819, 16.0),
    "TPU v5p": Target("TPU v5p", 459.0, 2.765, 95.0),
    "TPU v5": Target("TPU v5p", 459.0, 2.765, 95.0),
    "TPU v4": Target("TPU v4", 275.0, 1.2, 32.0),
    "TPU v6": Target("TPU v6e", 918.0, 1.64, 32.0),
}


def target(kind: str):
    """The `TARGETS` entry whose key is a substring of `kind` (or None)."""
    return next((v for k, v in TARGETS.items() if k in kind), None)


def matmul_params(cfg) -> int:
    """Weights one token multiplies with in the decoder layers (no embedding, no head): the
    four attention matrices and the SwiGLU (or the router and k of the E experts)."""
    d, hd, kv = cfg.dim, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    ffn = (d * cfg.num_experts + cfg.num_experts_per_tok * 3 * d * cfg.hidden_dim
           if cfg.num_experts else 3 * d * cfg.hidden_dim)
    return cfg.num_layers * (d * (2 * hd + 2 * kv) + ffn)


def forward_flops(cfg, tokens: float, pairs: float, head_rows: float,
                  adapters: int = 0) -> float:
    """FLOPs of a forward pass over `tokens` tokens: 2 x (matmul params + LoRA adapter
    params) per token, attention 4 x L x H x Dh per attended (query, key) pair, the output
    head 2 x D x V on `head_rows` positions."""
    return (2.0 * (matmul_params(cfg) + adapters) * tokens
            + 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * pairs
            + 2.0 * cfg.dim * cfg.vocab_size * head_rows)


def causal_pairs(t: float) -> float:
    """Attended (query, key) pairs of one causal row of t tokens."""
    return t * (t + 1) // 2


def weight_bytes(cfg) -> int:
    """Bytes of the weights a decode step reads: every leaf but the (untied) embedding,
    whose B looked-up rows are negligible; for a mixture of experts every expert (a batch
    of rows reaches most of them)."""
    embed = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.dim
    return (cfg.num_params() - embed) * cfg.weight_dtype.itemsize


def kv_bytes(cfg, rows: float, slots: float) -> float:
    """Bytes of k and v of `rows` rows x `slots` slots over the L layers."""
    return (2 * cfg.num_layers * rows * cfg.num_kv_heads * slots * cfg.head_dim
            * cfg.compute_dtype.itemsize)
