"""Grouped-query attention: materialised, blockwise (flash-attention style) or cuDNN.

All three compute the same function and differ in memory. `materialized` builds float32
scores [B, Hkv, G, T, S]; `blockwise` (`models.blockwise`) walks key blocks with an online
softmax and keeps O(T) statistics, in the forward and in its hand-written backward; `cudnn`
calls cuDNN's fused kernel through `jax.nn.dot_product_attention`. `attend` picks one from
`ModelConfig.attention`. `attend_shared_prefix` is the attention of the shared-prefix
update: a group's rows read its prefix's keys in place (METHOD 15).

Axis legend: B batch, T queries of this call, S key slots, H query heads, Hkv key/value
heads, G = H // Hkv, Dh head dim; Gn groups, P prefix tokens, R rows of N tokens a group.

Visibility (the mask, built as bool[B, T, S] only by `materialized`): query t, at slot
start + t, sees key slot s iff valid[b, s] and s <= start + t. A call without a cache has
start = 0 and S = T (causal over the T tokens, padding keys hidden), and so does a prefill
into a fresh cache (`KVCache.empty`: no earlier slot to read); a cached call has
start = cache.index. A query that sees no key (a left-padding row) outputs 0 and passes no
gradient.

Sources: online softmax, Milakov & Gimelshein 2018 (arXiv:1805.02867), whose merge of two
partial softmaxes by their log-sum-exp joins a shared prefix's part to a row's own
(`join_parts`); the blockwise forward and backward: `models.blockwise`.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from drubric_jax.models import decode_attention
from drubric_jax.models.blockwise import blockwise, blockwise_with_lse

# "auto" goes blockwise above this many scores per (row, head): 2^20 float32 scores are
# 4 MiB per head, 128 MiB per row of a 32-head layer.
AUTO_BLOCKWISE_MIN_SCORES = 2 ** 20
_MASK_VALUE = -1e30  # finite, so a row with no visible key has a finite softmax (zeroed)
_CUDNN_KEY_PAD_LOGIT = -2.0 ** 20  # see `cudnn`; exact in bfloat16


def choose(attention: str, t: int, s: int, cached: bool, dtype=None, backend: str = "cpu",
           head_dim: int = 0) -> str:
    """The implementation `attend` runs for a call with T queries over S slots.

    "auto" on a GPU, for a call without a cache (training, a prefill into a fresh cache)
    in a 16-bit `dtype` whose head dim, padded as `cudnn` pads it, is at most 256, is
    "cudnn": on one H200 (jax 0.11.2, Qwen3-8B, `experiments.device_check
    --attention=...`) its prefill ran at 55% MFU at 8K tokens and 52% at 24K, blockwise
    at 29% and 18%. Otherwise "auto" (and "cudnn" on a cached call, whose causal mask
    starts at a traced cache index that cuDNN's mask cannot express) is "blockwise" when
    T * S exceeds AUTO_BLOCKWISE_MIN_SCORES, else "materialized".
    """
    if attention == "cudnn" and not cached:
        return "cudnn"
    if attention in ("materialized", "blockwise"):
        return attention
    if (attention == "auto" and not cached and backend == "gpu"
            and dtype in (jnp.bfloat16, jnp.float16) and head_dim + 8 - head_dim % 8 <= 256):
        return "cudnn"
    return "blockwise" if t * s > AUTO_BLOCKWISE_MIN_SCORES else "materialized"


def attend(cfg, q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array,
           start: Optional[jax.Array] = None) -> jax.Array:
    """Grouped-query attention with the implementation `cfg.attention` selects (`choose`).

    Args:
        cfg: ModelConfig (attention, attention_block_q, attention_block_kv).
        q: [B, T, H, Dh]; k, v: [B, Hkv, S, Dh] (the KV-cache layout), or with T = 1 and
            a cache, tuples of chunks [B, Hkv, S_c, Dh] whose slots follow one another
            (`models.cache.add_chunk`; "materialized" only).
        valid: bool[B, S], False for slots that hold padding or nothing yet.
        start: int32[] cache slot of the first query, or None for a call without a cache
            (S == T, query t at slot t).

    Returns:
        [B, T, H * Dh] in v's dtype.

    Raises:
        ValueError: (cudnn) not a 16-bit compute dtype, or not on a GPU backend; chunked
            k, v with T > 1, without a cache or beyond AUTO_BLOCKWISE_MIN_SCORES.
    """
    chunked = isinstance(k, tuple)
    t, s = q.shape[1], sum(c.shape[2] for c in k) if chunked else k.shape[2]
    impl = choose(cfg.attention, t, s, cached=start is not None, dtype=q.dtype,
                  backend=jax.default_backend(), head_dim=q.shape[-1])
    if chunked:
        if t != 1 or start is None or impl != "materialized":
            raise ValueError(f"chunked keys are read by one-token decode steps on a cache "
                             f"(materialized attention), got T={t}, S={s}, {impl}")
        return materialized(q, k, v, valid, start)
    if impl == "cudnn":
        return cudnn(q, k, v, valid)
    start = 0 if start is None else start
    if impl == "blockwise":
        return blockwise(q, k, v, valid, start, cfg.attention_block_q, cfg.attention_block_kv)
    return materialized(q, k, v, valid, start)


def attend_with_lse(cfg, q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array,
                    start: int) -> tuple[jax.Array, jax.Array]:
    """Attention and each query's log-sum-exp, for joining attentions over disjoint key
    sets (`join_parts`). Blockwise or materialized as `choose` picks for a cached call
    (cuDNN returns no log-sum-exp).

    Args:
        cfg: ModelConfig (attention, attention_block_q, attention_block_kv).
        q: [B, T, H, Dh]; k, v: [B, Hkv, S, Dh]; valid: bool[B, S].
        start: static int, the slot of the first query (query t sees slot s iff valid and
            s <= start + t; start >= S: every valid slot).

    Returns:
        (out [B, T, H, Dh] in v's dtype, lse float32[B, T, H]: log sum_s exp(q.k_s /
        sqrt(Dh)) over the visible slots, -inf for a query that sees none, its out 0).
    """
    t, s = q.shape[1], k.shape[2]
    impl = choose(cfg.attention, t, s, cached=True)
    if impl == "blockwise":
        return blockwise_with_lse(q, k, v, valid, int(start), cfg.attention_block_q,
                                  cfg.attention_block_kv)
    causal = jnp.arange(s)[None, :] <= start + jnp.arange(t)[:, None]          # [T, S]
    out, lse = _scores_and_values(q, k, v, (causal[None] & valid[:, None, :])[:, None, None])
    return out.astype(v.dtype), lse


def join_parts(out_a: jax.Array, lse_a: jax.Array, out_b: jax.Array,
               lse_b: jax.Array) -> jax.Array:
    """Attention over the union of two disjoint key sets from each set's attention and
    log-sum-exp (`attend_with_lse`): softmax weights exp(lse_x - lse), lse = log(exp(lse_a)
    + exp(lse_b)) (the merge step of FlashAttention's online softmax, Dao 2023, and of
    Milakov & Gimelshein 2018).

    Args:
        out_a, out_b: [..., H, Dh]; lse_a, lse_b: float32[..., H] (-inf: that set holds no
            visible key).

    Returns:
        float32[..., H, Dh]; 0 where neither set holds a visible key.
    """
    # The shift is a constant of the result (stop_gradient); finite where a key was seen.
    top = jax.lax.stop_gradient(jnp.maximum(lse_a, lse_b))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    w_a, w_b = jnp.exp(lse_a - top), jnp.exp(lse_b - top)   # exp(-inf) = 0: no NaN
    total = w_a + w_b
    out = (w_a[..., None] * out_a.astype(jnp.float32)
           + w_b[..., None] * out_b.astype(jnp.float32))
    return out / jnp.where(total > 0, total, 1.0)[..., None]


def attend_shared_prefix(cfg, q: jax.Array, k: jax.Array, v: jax.Array,
                         prefix_valid: jax.Array, suffix_valid: jax.Array) -> jax.Array:
    """Attention of a batch of groups, each one prefix and R suffixes packed in a row as
    [prefix (P) | suffix 1 (N) | ... | suffix R (N)]: the prefix attends to itself
    causally; each suffix to the whole prefix and to itself causally, never to another
    suffix. The function of attention over each [prefix; suffix] row on its own, with the
    prefix's keys and values read in place by all R suffixes (one matmul per group and
    head, no copy per suffix); autodiff sums the suffixes' gradients into the prefix
    (METHOD 15, "Shared prefixes").

    Args:
        cfg: ModelConfig (attention and its block lengths).
        q: [Gn, P + R*N, H, Dh]; k, v: [Gn, P + R*N, Hkv, Dh] (this call's keys, RoPE
            applied).
        prefix_valid: bool[Gn, P] real prefix tokens (the prompt bucket's left padding is
            False); suffix_valid: bool[Gn, R, N] real suffix tokens.

    Returns:
        [Gn, P + R*N, H * Dh] in v's dtype.

    The prefix's self-attention goes through `attend` (cuDNN on a GPU where it applies);
    each suffix's two parts through `attend_with_lse` and are joined by `join_parts`.
    """
    gn, p = prefix_valid.shape
    r, n = suffix_valid.shape[1:]
    h, dh = q.shape[2:]
    hkv = k.shape[2]
    k_p, v_p = (x[:, :p].transpose(0, 2, 1, 3) for x in (k, v))             # [Gn,Hkv,P,Dh]
    out_p = attend(cfg, q[:, :p], k_p, v_p, prefix_valid)                     # [Gn,P,H*Dh]
    q_s = q[:, p:]                                                            # [Gn,R*N,H,Dh]
    # Every query of the group's R suffixes against the one prefix (start = P: no causal
    # cut inside the prefix).
    out_a, lse_a = attend_with_lse(cfg, q_s, k_p, v_p, prefix_valid, p)
    # Each suffix against its own keys, causally: rows of [Gn * R, N].
    own = [x[:, p:].reshape(gn * r, n, hkv, dh).transpose(0, 2, 1, 3) for x in (k, v)]
    out_b, lse_b = attend_with_lse(cfg, q_s.reshape(gn * r, n, h, dh), *own,
                                   suffix_valid.reshape(gn * r, n), 0)
    out_s = join_parts(out_a, lse_a, out_b.reshape(gn, r * n, h, dh),
                       lse_b.reshape(gn, r * n, h))
    return jnp.concatenate([out_p, out_s.astype(v.dtype).reshape(gn, r * n, h * dh)], axis=1)


def materialized(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array,
                 start=0) -> jax.Array:
    """Attention through float32 scores [B, Hkv, G, T, S]; arguments as `attend`.

    For T > 1 the softmax is normalised after the value product: out = (e @ v) / sum(e),
    e = exp(scores - max) where visible, else 0 (a row that sees no key has sum 0 and
    outputs 0). The division then runs over [.., T, Dh], not over the [.., T, S] scores,
    and the scores are read by one fused pass fewer: 1.3-1.5x faster here (SmolLM2-135M
    shapes, T = 128: 30 layers' prefill attention 27 -> 18 ms at B = 1, 183 -> 122 ms at
    B = 8; forward + backward at B = 2, T = 512: 3.0 -> 1.9 s). The max is a constant of
    the gradient (`stop_gradient`): the result does not depend on it.
    """
    b, t, h, dh = q.shape
    chunks_k = k if isinstance(k, tuple) else (k,)
    chunks_v = v if isinstance(v, tuple) else (v,)
    s = sum(c.shape[2] for c in chunks_k)
    causal = jnp.arange(s)[None, :] <= start + jnp.arange(t)[:, None]          # [T, S]
    vis = (causal[None] & valid[:, None, :])[:, None, None]                     # [B,1,1,T,S]
    if t == 1:  # one query per row (decode), over the cache's chunks
        return decode_attention.attend_one(q, chunks_k, chunks_v, vis[:, :, :, 0],
                                           _MASK_VALUE)
    out, _ = _scores_and_values(q, k, v, vis)
    return out.astype(v.dtype).reshape(b, t, h * dh)


def _scores_and_values(q, k, v, vis):
    """The T > 1 path of `materialized`: (out float32[B, T, H, Dh], lse float32[B, T, H]),
    lse = log sum_s exp(score) over the visible slots, -inf for a query that sees none
    (its out is 0). q [B, T, H, Dh], k, v [B, Hkv, S, Dh], vis bool[B, 1, 1, T, S]."""
    b, t, h, dh = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    # The G query heads of a key/value head as G*T rows of one [G*T, Dh] x [Dh, S] matmul
    # per (row, key head): plain matmuls, where the 5-axis einsums made XLA CPU transpose
    # the scores and the output.
    q = q.reshape(b, t, hkv, g, dh).transpose(0, 2, 3, 1, 4).reshape(b, hkv, g * t, dh)
    scores = jnp.einsum("bkmd,bksd->bkms", q, k,
                        preferred_element_type=jnp.float32).reshape(b, hkv, g, t, s)
    scores = jnp.where(vis, scores * (dh ** -0.5), _MASK_VALUE)
    top = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    e = jnp.where(vis, jnp.exp(scores - top), 0.0)           # unnormalised probabilities
    total = jnp.sum(e, axis=-1, keepdims=True).reshape(b, hkv, g * t, 1)
    out = jnp.einsum("bkms,bksd->bkmd", e.reshape(b, hkv, g * t, s).astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    # total >= 1 for a row that sees a key (its max term is exp(0)); 0, and out 0, if none.
    # (`where`, not `maximum(total, 1)`: maximum would halve the gradient at total == 1.)
    seen = total > 0
    safe = jnp.where(seen, total, 1.0)
    out = out / safe
    # d lse / d score = the softmax row: `top` is a constant of the gradient.
    lse = jnp.where(seen, top.reshape(b, hkv, g * t, 1) + jnp.log(safe), -jnp.inf)
    out = out.reshape(b, hkv, g, t, dh).transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh)
    return out, lse.reshape(b, hkv, g, t).transpose(0, 3, 1, 2).reshape(b, t, h)


def cudnn(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array,
          implementation: str = "cudnn") -> jax.Array:
    """Causal attention of a call without a cache (S == T) through cuDNN's fused kernel.

    `jax.nn.dot_product_attention` masks padding only as right-padding lengths or as a
    [B, H, T, S] bias; rows here are left-padded, so the key padding travels as one more
    head dimension instead: q gets a 1 there, k gets 0 (valid) or -2^20 (padding), which
    adds -2^20 * scale to every score of a padding key (its softmax weight underflows to
    0). Head dims are padded to a multiple of 8 (cuDNN). A query that sees no valid key
    is zeroed afterwards, as in `materialized`.

    Args: as `attend` with start None; `implementation` "xla" runs the same encoding on
    any backend (the tests use it).
    Raises:
        ValueError: S != T; with "cudnn", q not bfloat16/float16 or no GPU backend.
    """
    b, t, h, dh = q.shape
    hkv, s = k.shape[1], k.shape[2]
    if s != t:
        raise ValueError(f"cudnn attention runs calls without a cache (S == T), got T={t}, "
                         f"S={s}")
    if implementation == "cudnn":
        if q.dtype not in (jnp.bfloat16, jnp.float16):
            raise ValueError(f"ModelConfig.attention='cudnn' needs dtype bfloat16 or "
                             f"float16, got {q.dtype}; use 'auto' or 'blockwise'")
        if jax.default_backend() != "gpu":
            raise ValueError(f"ModelConfig.attention='cudnn' needs a GPU backend, got "
                             f"{jax.default_backend()!r}; use 'auto' or 'blockwise'")
    extra = 8 - dh % 8  # >= 1 free dimension, total a multiple of 8
    key_pad = jnp.where(valid, 0.0, _CUDNN_KEY_PAD_LOGIT).astype(k.dtype)      # [B, S]
    q = jnp.concatenate([q, jnp.ones((b, t, h, 1), q.dtype),
                         jnp.zeros((b, t, h, extra - 1), q.dtype)], axis=-1)
    k = jnp.concatenate([k.transpose(0, 2, 1, 3),                              # [B, S, Hkv, Dh]
                         jnp.broadcast_to(key_pad[:, :, None, None], (b, s, hkv, 1)),
                         jnp.zeros((b, s, hkv, extra - 1), k.dtype)], axis=-1)
    # v's extra dims are zeros, and [..., :dh] drops them from the output.
    v = jnp.pad(v.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, 0), (0, extra)))
    out = jax.nn.dot_product_attention(q, k, v, scale=dh ** -0.5, is_causal=True,
                                       implementation=implementation)[..., :dh]
    # Causal with S == T: query t sees a valid key iff some slot <= t is valid.
    sees_a_key = jnp.cumsum(valid, axis=1) > 0                                 # [B, T]
    return jnp.where(sees_a_key[:, :, None, None], out, 0).reshape(b, t, h * dh)
