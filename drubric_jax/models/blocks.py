"""The pieces of a pre-norm decoder block that the model families share: RMSNorm, rotary
embeddings (with Llama-3.1 scaling), the SwiGLU MLP and the block itself (`layer`), whose
attention is a function handed in (over a cache, this call's tokens, or a packed group's
prefix and rows). `models.llama` and `models.qwen3_moe` build their decoders from them.

Axis legend: B batch, T tokens in this call, S KV-cache slots, D model dim, F MLP width,
H query heads, Hkv key/value heads, Dh head dim.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from drubric_jax import parallel
from drubric_jax.models import lora
from drubric_jax.models.attention import attend
from drubric_jax.models.config import ModelConfig


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, computed in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> jax.Array:
    """float32[Dh/2] inverse frequencies, with Llama-3.1 scaling when configured.

    Follows the `llama3` rope type of Hugging Face transformers: wavelengths longer than
    original_max / low_freq_factor are divided by `factor`, shorter than
    original_max / high_freq_factor are kept, and the band between is interpolated.
    """
    dh = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))
    sc = cfg.rope_scaling
    if sc is None:
        return inv
    low_wavelen = sc.original_max_position_embeddings / sc.low_freq_factor
    high_wavelen = sc.original_max_position_embeddings / sc.high_freq_factor
    wavelen = 2 * math.pi / inv
    # 0 at the long-wavelength edge of the band (fully scaled), 1 at the short one (unscaled).
    smooth = (sc.original_max_position_embeddings / wavelen - sc.low_freq_factor) / (
        sc.high_freq_factor - sc.low_freq_factor)
    mid = (1 - smooth) * inv / sc.factor + smooth * inv
    return jnp.where(wavelen > low_wavelen, inv / sc.factor,
                     jnp.where(wavelen < high_wavelen, inv, mid))


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotary embedding, half-split ("rotate_half") layout of Hugging Face Llama.

    Args:
        x: [B, T, heads, Dh].
        positions: int32[B, T].
        inv_freq: float32[Dh/2].
    """
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    # rotate_half pairs dims (i, i + Dh/2); GGUF's interleaved rows are undone at load.
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def swiglu_mlp(cfg: ModelConfig, p: dict, h: jax.Array) -> jax.Array:
    """The dense SwiGLU MLP of one layer: (silu(h W_gate) * h W_up) W_down, [B, T, D]."""
    gate = jax.nn.silu(lora.linear(p, "w_gate", h, cfg))
    return lora.linear(p, "w_down", gate * lora.linear(p, "w_up", h, cfg), cfg)


def layer(cfg, p, x, positions, inv_freq, attention, mlp):
    """One pre-norm transformer block; `mlp(cfg, p, h)` is its feed-forward part
    (`swiglu_mlp`, or a mixture of experts: `models.qwen3_moe`).

    `attention(q, k, v)` gets this call's queries [B, T, H, Dh] and keys and values
    [B, T, Hkv, Dh] (RoPE applied) and returns `(out [B, T, H * Dh], extra)`: over a cache
    or this call's tokens (`attend_over`), or a packed group's prefix and suffixes
    (`forward_shared_hidden`); `extra` (e.g. the written cache) is returned beside x.
    """
    b, t, _ = x.shape
    x = parallel.constrain_rows(x)  # rows stay split: the weights are what gets gathered
    # Pre-norm: the residual stream x itself is never normalised.
    h = rms_norm(x, p["attn_norm"], cfg.norm_eps)
    q = (lora.linear(p, "wq", h, cfg)).reshape(b, t, cfg.num_heads, cfg.head_dim)
    k = (lora.linear(p, "wk", h, cfg)).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    v = (lora.linear(p, "wv", h, cfg)).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.norm_eps)
        k = rms_norm(k, p["k_norm"], cfg.norm_eps)
    # After the q/k norm, as Qwen3 orders them.
    q = apply_rope(q, positions, inv_freq)
    k = apply_rope(k, positions, inv_freq)
    out, extra = attention(q, k, v)
    x = parallel.constrain_rows(x + lora.linear(p, "wo", out, cfg))
    x = parallel.constrain_rows(x + mlp(cfg, p, rms_norm(x, p["mlp_norm"], cfg.norm_eps)))
    return x, extra


def attend_over(cfg, start, kv_fn):
    """The `attention` of `_layer` for keys that `kv_fn(k, v)` gives: it returns
    `(k_all, v_all, valid, extra)`, k_all and v_all [B, Hkv, S, Dh], valid bool[B, S] (the
    cache's S slots, or this call's S = T tokens); `start` is the slot of the first query
    (None without a cache), see `attention.attend`."""
    def attention(q, k, v):
        k_all, v_all, valid, extra = kv_fn(k, v)
        return attend(cfg, q, k_all, v_all, valid, start), extra
    return attention


def self_attention(cfg, token_mask):
    """The `attention` of `_layer` without a cache: causal over this call's tokens,
    token_mask bool[B, T] hiding the padding ones."""
    return attend_over(cfg, None, lambda k, v: (heads_first(k), heads_first(v),
                                                 token_mask, None))


def heads_first(x: jax.Array) -> jax.Array:
    """[B, T, heads, Dh] -> [B, heads, T, Dh]."""
    return x.transpose(0, 2, 1, 3)
