"""Decoder-only LM of the Llama family (with a Qwen3 q/k-norm switch), as pure functions.

The model is a set of functions over a plain parameter pytree (nested dicts of arrays),
so the round loop can swap whole parameter sets between roles and every jit boundary sees
ordinary arrays. Layers are stacked on a leading axis and run with `lax.scan`, which keeps
compile time independent of depth.

Axis legend: B batch, T tokens in this call, S KV-cache slots, D model dim, F MLP width,
H query heads, Hkv key/value heads, G = H // Hkv, Dh head dim, V vocab, L layers.

Parameter tree (shapes; `x @ w` orientation, i.e. [in, out]):
    embed        [V, D]
    layers/attn_norm [L, D]      layers/mlp_norm [L, D]
    layers/wq    [L, D, H*Dh]    layers/wk, wv   [L, D, Hkv*Dh]    layers/wo [L, H*Dh, D]
    layers/w_gate, w_up [L, D, F]                layers/w_down [L, F, D]
    layers/q_norm, k_norm [L, Dh]                (only when cfg.qk_norm, Qwen3)
    final_norm   [D]
    lm_head      [D, V]                          (only when not cfg.tie_embeddings)

Attention: `drubric_jax.models.attention.attend`, materialised, blockwise or cuDNN as
`cfg.attention` selects (same numbers; blockwise keeps long prompts and training rows from
materialising [B, Hkv, G, T, S] scores).

KV cache: `drubric_jax.models.cache.KVCache`. Decode loops use a per-layer form
(`unstack_layers`, `cache.unstack_cache`): the layers run as a Python loop over separate
arrays instead of a `lax.scan` over stacked ones, because on CPU XLA copies each scanned
slice of the weights and of the cache before its matmul on every step. Both forms give the
same numbers.

This file is the `llama` family of `drubric_jax.models.registry` (Llama 2/3/3.1, SmolLM2 and
dense Qwen3, whose q/k-norm is `cfg.qk_norm`: the registry's alias "qwen3"); callers reach it
through that interface. Besides the model it declares what loading, export, LoRA, sharding
and the memory planner read of the family: `NAME`, `HF_MODEL_TYPE`, `HF_ARCHITECTURE`,
`LORA_TARGETS`, the checkpoint names, `PARAM_SPECS`, `config_from_hf`, `config_to_hf` and
`activation_widths`.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from drubric_jax.models import hf_config, lora
from drubric_jax.models.attention import attend_shared_prefix
# The block's pieces; rms_norm and rope_inv_freq are also read as `llama.X` by callers.
from drubric_jax.models.blocks import (attend_over, heads_first, layer,  # noqa: F401
                                       rms_norm, rope_inv_freq, self_attention, swiglu_mlp)
from drubric_jax.models import paged
from drubric_jax.models.cache import KVCache, call_slots, write_layer
from drubric_jax.models.paged import PagedKV
from drubric_jax.models.config import ModelConfig

# The registry's row: `ModelConfig.family`, and the Hugging Face `model_type` and
# transformers class of a plain member (aliases of the family: `registry.ALIASES`).
NAME = "llama"
HF_MODEL_TYPE = "llama"
HF_ARCHITECTURE = "LlamaForCausalLM"
# The matrices `lora.linear` runs (`layer`, `swiglu_mlp`): what `lora.targets` may name.
LORA_TARGETS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
# Checkpoint names, used by `models.weights` (load) and `models.export` for this family.
# ours -> (Hugging Face suffix under model.layers.{i}., GGUF suffix under blk.{i}.)
LAYER_WEIGHT_NAMES = {
    "attn_norm": ("input_layernorm.weight", "attn_norm.weight"),
    "wq": ("self_attn.q_proj.weight", "attn_q.weight"),
    "wk": ("self_attn.k_proj.weight", "attn_k.weight"),
    "wv": ("self_attn.v_proj.weight", "attn_v.weight"),
    "wo": ("self_attn.o_proj.weight", "attn_output.weight"),
    "q_norm": ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    "k_norm": ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    "mlp_norm": ("post_attention_layernorm.weight", "ffn_norm.weight"),
    "w_gate": ("mlp.gate_proj.weight", "ffn_gate.weight"),
    "w_up": ("mlp.up_proj.weight", "ffn_up.weight"),
    "w_down": ("mlp.down_proj.weight", "ffn_down.weight"),
}
# ours -> (Hugging Face name, GGUF name)
TOP_WEIGHT_NAMES = {
    "embed": ("model.embed_tokens.weight", "token_embd.weight"),
    "final_norm": ("model.norm.weight", "output_norm.weight"),
    "lm_head": ("lm_head.weight", "output.weight"),
}
# How each leaf is split over the mesh (`registry.param_specs`): fsdp splits D, tensor
# splits heads / F / V, the stacked layer axis L stays whole; norms are replicated.
PARAM_SPECS = {
    "embed": P("tensor", "fsdp"),          # [V, D]
    "lm_head": P("fsdp", "tensor"),        # [D, V]
    "wq": P(None, "fsdp", "tensor"),       # [L, D, H*Dh]
    "wk": P(None, "fsdp", "tensor"),       # [L, D, Hkv*Dh]
    "wv": P(None, "fsdp", "tensor"),       # [L, D, Hkv*Dh]
    "wo": P(None, "tensor", "fsdp"),       # [L, H*Dh, D]
    "w_gate": P(None, "fsdp", "tensor"),   # [L, D, F]
    "w_up": P(None, "fsdp", "tensor"),     # [L, D, F]
    "w_down": P(None, "tensor", "fsdp"),   # [L, F, D]
}
# LoRA A / B beside their matrix.
PARAM_SPECS.update(lora.adapter_specs({k: PARAM_SPECS[k] for k in LORA_TARGETS}))
# Linear weights: checkpoints store [out, in], ours are [in, out].
TRANSPOSED = frozenset({"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "lm_head"})


def config_from_hf(hf: dict) -> dict:
    """The ModelConfig fields (no dtype, no family) of a Hugging Face `config.json` of this
    family: the dense decoder's (`hf_config.dense_from_hf`, which raises ValueError naming a
    bad field)."""
    return hf_config.dense_from_hf(hf)


def config_to_hf(cfg: ModelConfig, bos_id: int, eos_id: int) -> dict:
    """The `config.json` fields of `cfg` that transformers' `LlamaConfig` (and Qwen3's) read,
    with the token ids, without `model_type` and `architectures`
    (`models.export.hf_config_dict`)."""
    return hf_config.dense_to_hf(cfg, bos_id, eos_id)


def activation_widths(cfg: ModelConfig) -> tuple[int, int, int]:
    """Per-token widths of one layer's activations, (D, F, H*Dh): the units of the memory
    planner's width counts (`memory.terms`)."""
    return cfg.dim, cfg.hidden_dim, cfg.num_heads * cfg.head_dim


def layer_keys(cfg: ModelConfig) -> list[str]:
    """Names of the stacked per-layer leaves of `cfg`'s parameter tree."""
    keys = ["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down"]
    return keys + (["q_norm", "k_norm"] if cfg.qk_norm else [])


def top_keys(cfg: ModelConfig) -> list[str]:
    """Names of the top-level leaves of `cfg`'s parameter tree."""
    return ["embed", "final_norm"] + ([] if cfg.tie_embeddings else ["lm_head"])


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
    """Random parameters (normal, std 0.02; norms at 1) in `cfg.param_dtype`.

    Used for tiny test models and as the shape template for loaders (via `jax.eval_shape`).
    """
    d, f, l, dh = cfg.dim, cfg.hidden_dim, cfg.num_layers, cfg.head_dim
    # One key per normal() draw below: 7 layer matrices, embed and lm_head.
    keys = iter(jax.random.split(key, 9))
    dt = cfg.weight_dtype

    def normal(shape):
        # Drawn in float32, then cast: both dtypes get the same values up to rounding.
        return (0.02 * jax.random.normal(next(keys), shape, jnp.float32)).astype(dt)

    layers = {
        "attn_norm": jnp.ones((l, d), dt),
        "wq": normal((l, d, cfg.num_heads * dh)),
        "wk": normal((l, d, cfg.num_kv_heads * dh)),
        "wv": normal((l, d, cfg.num_kv_heads * dh)),
        "wo": normal((l, cfg.num_heads * dh, d)),
        "mlp_norm": jnp.ones((l, d), dt),
        "w_gate": normal((l, d, f)),
        "w_up": normal((l, d, f)),
        "w_down": normal((l, f, d)),
    }
    if cfg.qk_norm:
        layers["q_norm"] = jnp.ones((l, dh), dt)
        layers["k_norm"] = jnp.ones((l, dh), dt)
    params = {"embed": normal((cfg.vocab_size, d)), "layers": layers,
              "final_norm": jnp.ones((d,), dt)}
    if not cfg.tie_embeddings:
        params["lm_head"] = normal((d, cfg.vocab_size))
    return params


def forward_hidden(params: dict, cfg: ModelConfig, tokens: jax.Array, positions: jax.Array,
                   token_mask: Optional[jax.Array] = None,
                   cache: Optional[KVCache] = None, remat: bool = False,
                   mlp=swiglu_mlp) -> tuple[jax.Array, Optional[KVCache]]:
    """Runs the decoder and returns the final-norm hidden states.

    Args:
        params: parameter pytree (see module docstring).
        cfg: architecture.
        tokens: int32[B, T] token ids.
        positions: int32[B, T] RoPE positions (0 for the first real token of a row).
        token_mask: bool[B, T], False for padding tokens (they are never attended to).
            Defaults to all True.
        cache: optional KVCache; when given, the T new tokens are written to slots
            [cache.index, cache.index + T) and attend to every valid earlier slot (a fresh
            cache, `KVCache.empty`, has none: they attend to each other only).
            Without a cache, attention is causal over the T tokens. A per-layer cache
            (`unstack_cache`) is returned per-layer and runs the layers as a Python loop;
            pair it with `unstack_layers(params)` (stacked params are sliced per call).
            Per-layer params (the rollout copy on CPU and GPU) run as a layer loop with
            either cache form, or none. A `paged.PagedKV` (the rollout engine's, T = 1):
            each slot's token written at its live length where token_mask is True, its
            query over the slot's live pages (`paged.forward_step`).
        remat: recompute each layer in the backward pass (`jax.checkpoint`) instead of
            storing its activations; the training forward uses it (without a cache), so
            backward memory is one layer's intermediates plus [L, B, T, D] layer inputs.
        mlp: the feed-forward part of every layer (`swiglu_mlp`; `models.qwen3_moe` passes
            its mixture of experts).

    Returns:
        (hidden [B, T, D] in the compute dtype, updated cache or None).

    Raises:
        ValueError: tokens/positions shape mismatch.
    """
    if tokens.shape != positions.shape:
        raise ValueError(f"tokens {tokens.shape} and positions {positions.shape} differ")
    b, t = tokens.shape
    if token_mask is None:
        token_mask = jnp.ones((b, t), bool)
    # From the static cfg: a constant under jit.
    inv_freq = rope_inv_freq(cfg)
    x = jnp.take(params["embed"], tokens, axis=0).astype(cfg.compute_dtype)

    if cache is None:
        def body(x, p):
            # No cache: the keys are this call's tokens; token_mask hides the padding ones.
            x, _ = layer(cfg, p, x, positions, inv_freq, self_attention(cfg, token_mask), mlp)
            return x, None

        if isinstance(params["layers"], (list, tuple)):  # per-layer weights: a layer loop
            for p in params["layers"]:
                x, _ = (jax.checkpoint(body) if remat else body)(x, p)
        else:
            x, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, x, params["layers"])
        return rms_norm(x, params["final_norm"], cfg.norm_eps), None

    if isinstance(cache, PagedKV):  # the rollout engine's paged cache (`models.paged`)
        return paged.forward_step(params, cfg, x, positions, token_mask, cache, inv_freq, mlp,
                                  _layer_slice)

    # Every row writes the same slots (left padding), so one index serves the batch.
    start = cache.index
    # The new slots are valid only for real tokens (not padding, not rows that did not emit).
    valid = jax.lax.dynamic_update_slice(cache.valid, token_mask, (0, start))
    # A fresh cache (a prefill): the T tokens attend to each other only, as without a cache,
    # so the S - T empty slots cost no attention (a third of it at P = 128, N = 64), and a
    # "cudnn" attention serves the pass (it cannot mask a cached call).
    fresh = cache.empty
    attend_from, next_index = call_slots(cache, t)

    def attended(k, v, k_all, v_all):
        # What the layer's queries attend over: this call's keys or the whole cache.
        return (heads_first(k), heads_first(v), token_mask) if fresh else (k_all, v_all, valid)

    if isinstance(cache.k, tuple):  # per-layer form: no slicing inside the layer loop
        layers = params["layers"]
        k_new, v_new = [], []
        for i in range(cfg.num_layers):
            p = layers[i] if isinstance(layers, (list, tuple)) else _layer_slice(layers, i)

            # Default arguments bind this layer's arrays now (a closure would read them late).
            def kv_fn(k, v, kc=cache.k[i], vc=cache.v[i]):
                kc = write_layer(kc, heads_first(k), start)
                vc = write_layer(vc, heads_first(v), start)
                return (*attended(k, v, kc, vc), (kc, vc))

            x, (kc, vc) = layer(cfg, p, x, positions, inv_freq,
                                 attend_over(cfg, attend_from, kv_fn), mlp)
            k_new.append(kc)
            v_new.append(vc)
        new_cache = KVCache(k=tuple(k_new), v=tuple(v_new), valid=valid, index=next_index)
        return rms_norm(x, params["final_norm"], cfg.norm_eps), new_cache

    def body(carry, xs):
        x, k_cache, v_cache = carry
        p, i = xs

        def kv_fn(k, v):
            kc = jax.lax.dynamic_update_slice(
                k_cache, heads_first(k)[None].astype(k_cache.dtype), (i, 0, 0, start, 0))
            vc = jax.lax.dynamic_update_slice(
                v_cache, heads_first(v)[None].astype(v_cache.dtype), (i, 0, 0, start, 0))
            # The whole stacked cache is the scan carry; this layer attends over its own slice.
            return (*attended(k, v, kc[i], vc[i]), (kc, vc))

        x, (k_cache, v_cache) = layer(cfg, p, x, positions, inv_freq,
                                       attend_over(cfg, attend_from, kv_fn), mlp)
        return (x, k_cache, v_cache), None

    if isinstance(params["layers"], (list, tuple)):
        # Per-layer weights (the rollout copy on CPU and GPU, `models.rollout`) with a
        # stacked cache (a prefill): the scan's body as a layer loop.
        carry = (x, cache.k, cache.v)
        for i, p in enumerate(params["layers"]):
            carry, _ = body(carry, (p, i))
        x, k_new, v_new = carry
    else:
        (x, k_new, v_new), _ = jax.lax.scan(
            body, (x, cache.k, cache.v), (params["layers"], jnp.arange(cfg.num_layers)))
    new_cache = KVCache(k=k_new, v=v_new, valid=valid, index=next_index)
    return rms_norm(x, params["final_norm"], cfg.norm_eps), new_cache


def shared_prefix_positions(prefix_mask: jax.Array, suffix_mask: jax.Array) -> jax.Array:
    """int32[Gn, P + R*N] RoPE positions of packed groups (`forward_shared_hidden`): the
    positions each [prefix | suffix r] row would get on its own (`registry.positions_from_mask`
    of the row): the prefix's real tokens 0, 1, ...; suffix r's continue after them.

    Args:
        prefix_mask: bool[Gn, P]; suffix_mask: bool[Gn, R, N].
    """
    gn = prefix_mask.shape[0]
    pre = jnp.cumsum(prefix_mask.astype(jnp.int32), axis=-1)                 # [Gn, P]
    suf = pre[:, -1, None, None] + jnp.cumsum(suffix_mask.astype(jnp.int32), axis=-1)
    return jnp.maximum(jnp.concatenate([pre, suf.reshape(gn, -1)], axis=1) - 1, 0)


def forward_shared_hidden(params: dict, cfg: ModelConfig, prefix_tokens: jax.Array,
                          prefix_mask: jax.Array, tokens: jax.Array, token_mask: jax.Array,
                          remat: bool = False, mlp=swiglu_mlp) -> tuple[jax.Array, jax.Array]:
    """Runs the decoder over groups of one prefix and R suffixes, each prefix token once.

    A group is packed as one row [prefix (P) | suffix 1 (N) | ... | suffix R (N)]; every
    per-token part of a layer (norms, projections, LoRA, the MLP or mixture of experts) runs
    on the packed row as on any row, and attention is `attention.attend_shared_prefix`: the
    prefix causal over itself, each suffix over the whole prefix and causally over itself.
    Suffix r's hidden states equal those of the row [prefix | suffix r] run alone by
    `forward_hidden` (METHOD 15, "Shared prefixes"); the prefix's are computed once for
    the R of them, and in the backward pass autodiff sums their R gradients into it.
    Tokens: Gn (P + R N) against Gn R (P + N) for the rows run one by one.

    Args:
        params: parameter pytree (stacked layers).
        cfg: architecture.
        prefix_tokens: int32[Gn, P], each group's shared prefix (e.g. a prompt, left-padded
            in its bucket); prefix_mask: bool[Gn, P] its real tokens.
        tokens: int32[Gn, R, N], the R suffixes (e.g. completions, right-padded);
            token_mask: bool[Gn, R, N] their real tokens.
        remat: recompute each layer in the backward pass (`jax.checkpoint`).
        mlp: the feed-forward part of every layer (as `forward_hidden`).

    Returns:
        (prefix hidden [Gn, P, D], suffix hidden [Gn, R, N, D]), final-norm, in the
        compute dtype.

    Raises:
        ValueError: prefix and suffix shapes that do not belong together.
    """
    gn, p = prefix_tokens.shape
    if prefix_mask.shape != (gn, p) or tokens.ndim != 3 or tokens.shape[0] != gn \
            or token_mask.shape != tokens.shape:
        raise ValueError(f"prefix tokens {prefix_tokens.shape} / mask {prefix_mask.shape} "
                         f"and suffix tokens {tokens.shape} / mask {token_mask.shape} do not "
                         "form groups [Gn, P] and [Gn, R, N]")
    r, n = tokens.shape[1:]
    prefix_mask, token_mask = jnp.asarray(prefix_mask, bool), jnp.asarray(token_mask, bool)
    packed = jnp.concatenate([prefix_tokens, tokens.reshape(gn, r * n)], axis=1)
    positions = shared_prefix_positions(prefix_mask, token_mask)
    inv_freq = rope_inv_freq(cfg)
    x = jnp.take(params["embed"], packed, axis=0).astype(cfg.compute_dtype)

    def attention(q, k, v):
        return attend_shared_prefix(cfg, q, k, v, prefix_mask, token_mask), None

    def body(x, lp):
        return layer(cfg, lp, x, positions, inv_freq, attention, mlp)[0], None

    body = jax.checkpoint(body) if remat else body
    if isinstance(params["layers"], (list, tuple)):  # per-layer weights: a layer loop
        for lp in params["layers"]:
            x, _ = body(x, lp)
    else:
        x, _ = jax.lax.scan(body, x, params["layers"])
    x = rms_norm(x, params["final_norm"], cfg.norm_eps)
    return x[:, :p], x[:, p:].reshape(gn, r, n, x.shape[-1])


def _layer_slice(layers: dict, i: int) -> dict:
    return {name: w[i] for name, w in layers.items()}


def unstack_layers(params: dict) -> dict:
    """`params` with `layers` as a tuple of L per-layer dicts (copies of the [L, ...] slices).

    `forward_hidden` with a per-layer cache runs its layer loop over these arrays; see the
    module docstring. Costs one copy of the block weights. Idempotent.
    """
    layers = params["layers"]
    if isinstance(layers, (list, tuple)):
        return params
    num_layers = jax.tree.leaves(layers)[0].shape[0]
    return {**params, "layers": tuple(_layer_slice(layers, i) for i in range(num_layers))}


def logits_from_hidden(params: dict, cfg: ModelConfig, hidden: jax.Array) -> jax.Array:
    """float32[..., V] logits from hidden [..., D] (tied or untied output head)."""
    dt = cfg.compute_dtype
    # Accumulated in float32: the logits feed log-softmax and sampling.
    if cfg.tie_embeddings:
        out = jnp.einsum("...d,vd->...v", hidden, params["embed"].astype(dt),
                         preferred_element_type=jnp.float32)
    else:
        out = jnp.einsum("...d,dv->...v", hidden, params["lm_head"].astype(dt),
                         preferred_element_type=jnp.float32)
    return out.astype(jnp.float32)
