"""Decoder configuration for the Llama family (Llama 2/3/3.1, SmolLM2) and Qwen3.

One frozen dataclass describes the architecture; presets name the models this
project uses. The same decoder serves as policy, rubric generator and verifier.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax.numpy as jnp

ATTENTION_IMPLEMENTATIONS = ("auto", "materialized", "blockwise", "cudnn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3.1 RoPE frequency scaling (the `rope_type: llama3` of HF configs)."""

    # Defaults: Llama 3.1's published rope_scaling values.
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


MOE_DISPATCHES = ("capacity", "ragged")
# The form decode loops run on (`models.decode_per_layer`): per-layer copies of the block
# weights and the KV cache, the stacked [L, ...] arrays, or "auto": the backend's choice
# (`models.per_layer_decode`: per-layer on CPU and GPU).
DECODE_FORMS = ("auto", "per_layer", "stacked")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of one decoder-only LM.

    Attributes:
        vocab_size: V, rows of the token embedding.
        dim: D, residual width.
        num_layers: L.
        num_heads: H, query heads.
        num_kv_heads: Hkv, key/value heads (grouped-query attention; H % Hkv == 0).
        head_dim: Dh.
        hidden_dim: SwiGLU inner width F (of each expert, in a mixture of experts).
        rope_theta: RoPE base.
        rope_scaling: optional Llama-3.1 frequency scaling.
        norm_eps: RMSNorm epsilon.
        tie_embeddings: output head is the transposed token embedding.
        qk_norm: Qwen3 switch, RMSNorm over Dh on q and k of every head.
        max_seq_len: longest context the model was trained for (tokens).
        dtype: compute dtype name, "float32" or "bfloat16".
        param_dtype: storage dtype of the weights.
        family: the model family that implements this architecture
            (`drubric_jax.models.registry.FAMILIES`).
        lora_rank: r of the LoRA adapters a trainee trains on this model (0 = none; the
            params are then the full weights). `models.lora`.
        lora_alpha: LoRA scale alpha (W + (alpha / r) A B).
        lora_targets: names of the adapted matrices.
        attention: "auto" | "materialized" | "blockwise" | "cudnn", the attention
            implementation (`drubric_jax.models.attention.choose`); "auto" goes
            blockwise when a row's T * S scores pass 2^20. Same numbers, other memory.
        attention_block_q, attention_block_kv: blockwise query / key block lengths
            (tokens, slots).
        num_experts: E, experts per layer of a mixture-of-experts FFN (0 = dense;
            family "qwen3_moe").
        num_experts_per_tok: k, experts each token is routed to (top-k of the router).
        norm_topk_prob: the k routing weights are renormalised to sum to 1 (Qwen3-MoE's
            config field of that name).
        moe_dispatch: how routed rows reach their experts (`models.qwen3_moe.moe_mlp`):
            "capacity", every expert takes at most C rows in one batched matmul (GShard /
            Switch style; temporaries grow with the routed rows, on every backend), or
            "ragged", one grouped matmul (`jax.lax.ragged_dot`; a native grouped GEMM on
            TPU, a dense masked product on CPU and GPU).
        moe_capacity_factor: C = min(N, ceil(factor * N * k / E)) rows per expert for N
            tokens; the (token, expert) pairs past an expert's C rows are dropped (that
            expert adds nothing to that token). 0 = C = N: nothing is ever dropped.
        decode_form: the form decode loops run on (`DECODE_FORMS`): "per_layer" (a tuple
            of L per-layer weight dicts and caches), "stacked" ([L, ...] arrays) or "auto"
            (the backend's, `models.per_layer_decode`). Read on the host when the sampler
            makes its weight copy (`models.decode_per_layer`); the traced loops follow the
            form of the weights they are given.
    """

    vocab_size: int
    dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_dim: int
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    qk_norm: bool = False
    max_seq_len: int = 8192
    dtype: str = "float32"
    param_dtype: str = "float32"
    family: str = "llama"
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
    attention: str = "auto"
    # 512 x 512 blocks: 1 MiB of float32 scores per (row, head) and block pair.
    attention_block_q: int = 512
    attention_block_kv: int = 512
    num_experts: int = 0
    num_experts_per_tok: int = 0
    norm_topk_prob: bool = True
    moe_dispatch: str = "capacity"
    moe_capacity_factor: float = 2.0
    decode_form: str = "auto"

    def __post_init__(self):
        for name in ("vocab_size", "dim", "num_layers", "num_heads", "num_kv_heads",
                                  "head_dim", "hidden_dim", "attention_block_q",
                                  "attention_block_kv"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                    f"ModelConfig.num_heads={self.num_heads} is not a multiple of "
                    f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even for RoPE")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"ModelConfig.attention must be one of "
                             f"{ATTENTION_IMPLEMENTATIONS}, got {self.attention!r}")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"ModelConfig.num_experts_per_tok={self.num_experts_per_tok} "
                             f"must be in 1..num_experts={self.num_experts}")
        if self.decode_form not in DECODE_FORMS:
            raise ValueError(f"ModelConfig.decode_form must be one of {DECODE_FORMS}, got "
                             f"{self.decode_form!r}")
        if self.moe_dispatch not in MOE_DISPATCHES:
            raise ValueError(f"ModelConfig.moe_dispatch must be one of {MOE_DISPATCHES}, "
                             f"got {self.moe_dispatch!r}")
        if self.moe_capacity_factor < 0:
            raise ValueError(f"ModelConfig.moe_capacity_factor must be >= 0, got "
                             f"{self.moe_capacity_factor}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16"):
                raise ValueError(f"ModelConfig.{name} must be 'float32' or 'bfloat16', "
                                                  f"got {getattr(self, name)!r}")

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def weight_dtype(self):
        return jnp.dtype(self.param_dtype)

    @property
    def lora_scale(self) -> float:
        """alpha / r of the LoRA adapters (0 without adapters)."""
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        d, f, l = self.dim, self.hidden_dim, self.num_layers
        # wq, wo: D x H*Dh each; wk, wv: D x Hkv*Dh each; then SwiGLU's three D x F matrices,
        # two RMSNorm scales and, for Qwen3, the q / k norms.
        attn = d * self.head_dim * (self.num_heads * 2 + self.num_kv_heads * 2)
        # A mixture of experts: E SwiGLU experts of width F and a [D, E] router.
        ffn = 3 * d * f * self.num_experts + d * self.num_experts if self.num_experts else 3 * d * f
        per_layer = attn + ffn + 2 * d + (2 * self.head_dim if self.qk_norm else 0)
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + l * per_layer + d + head


# Presets follow the models' own config.json (HuggingFaceTB/SmolLM2-135M-Instruct,
# meta-llama/Llama-3.1-8B, Qwen/Qwen3-8B).
SMOLLM2_135M = ModelConfig(
        vocab_size=49152, dim=576, num_layers=30, num_heads=9, num_kv_heads=3,
        head_dim=64, hidden_dim=1536, rope_theta=100000.0, norm_eps=1e-5,
        tie_embeddings=True, max_seq_len=8192)

LLAMA3_1_8B = ModelConfig(
        vocab_size=128256, dim=4096, num_layers=32, num_heads=32, num_kv_heads=8,
        head_dim=128, hidden_dim=14336, rope_theta=500000.0,
        rope_scaling=RopeScaling(), norm_eps=1e-5, tie_embeddings=False,
        max_seq_len=131072, dtype="bfloat16", param_dtype="bfloat16")

QWEN3_8B = ModelConfig(
        vocab_size=151936, dim=4096, num_layers=36, num_heads=32, num_kv_heads=8,
        head_dim=128, hidden_dim=12288, rope_theta=1000000.0, norm_eps=1e-6,
        tie_embeddings=False, qk_norm=True, max_seq_len=40960,
        dtype="bfloat16", param_dtype="bfloat16")

# Tiny random-weight presets for tests. `tiny` uses the SmolLM2 vocabulary so the
# real tokenizer can drive it; `tiny_qwen3` exercises q/k-norm and untied heads.
TINY = ModelConfig(
        vocab_size=49152, dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, hidden_dim=128, rope_theta=10000.0, max_seq_len=2048)
TINY_QWEN3 = TINY.replace(qk_norm=True, tie_embeddings=False, norm_eps=1e-6)
# A 64-token original context, so the scaled RoPE bands matter at test lengths.
TINY_LLAMA31 = TINY.replace(rope_scaling=RopeScaling(
        factor=8.0, original_max_position_embeddings=64), tie_embeddings=False)
# Qwen/Qwen3-30B-A3B (the paper's verifier): 48 layers of 128 experts, 8 per token.
QWEN3_30B_A3B = ModelConfig(
        vocab_size=151936, dim=2048, num_layers=48, num_heads=32, num_kv_heads=4,
        head_dim=128, hidden_dim=768, rope_theta=1000000.0, norm_eps=1e-6,
        tie_embeddings=False, qk_norm=True, max_seq_len=40960, dtype="bfloat16",
        param_dtype="bfloat16", family="qwen3_moe", num_experts=128, num_experts_per_tok=8)
TINY_QWEN3_MOE = TINY_QWEN3.replace(family="qwen3_moe", hidden_dim=32, num_experts=4,
                                    num_experts_per_tok=2)

PRESETS = {
        "smollm2_135m": SMOLLM2_135M,
        "llama3_1_8b": LLAMA3_1_8B,
        "qwen3_8b": QWEN3_8B,
        "tiny": TINY,
        "tiny_qwen3": TINY_QWEN3,
        "tiny_llama31": TINY_LLAMA31,
        "qwen3_30b_a3b": QWEN3_30B_A3B,
        "tiny_qwen3_moe": TINY_QWEN3_MOE,
}


def preset(name: str) -> ModelConfig:
    """Returns the named preset; raises KeyError listing the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}") from None
