"""Grouped-query attention: materialised, blockwise (flash-attention style) or cuDNN.

All three compute the same function and differ in memory. `materialized` builds float32
scores [B, Hkv, G, T, S]; `blockwise` walks key blocks with an online softmax and keeps
O(T) statistics, in the forward and in its hand-written backward; `cudnn` calls cuDNN's
fused kernel through `jax.nn.dot_product_attention`. `attend` picks one from
`ModelConfig.attention`.

Axis legend: B batch, T queries of this call, S key slots, H query heads, Hkv key/value
heads, G = H // Hkv, Dh head dim; here also Q and C the query- and key-block lengths, nQ
and nC the block counts (T and S padded up to nQ * Q and nC * C).

Visibility (the mask, built as bool[B, T, S] only by `materialized`): query t, at slot
start + t, sees key slot s iff valid[b, s] and s <= start + t. A call without a cache has
start = 0 and S = T (causal over the T tokens, padding keys hidden), and so does a prefill
into a fresh cache (`KVCache.empty`: no earlier slot to read); a cached call has
start = cache.index. A query that sees no key (a left-padding row) outputs 0 and passes no
gradient.

Sources: online softmax, Milakov & Gimelshein 2018 (arXiv:1805.02867); the blockwise
forward and backward are Algorithms 1 and 2 of FlashAttention-2 (Dao 2023,
arXiv:2307.08691), with the backward's dq accumulated over key blocks in a scan carry.
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from drubric_jax.models import decode_attention

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
    b, t, h, dh = q.shape
    hkv, s = k.shape[1], k.shape[2]
    impl = choose(cfg.attention, t, s, cached=True)
    if impl == "blockwise":
        bq, bc = min(cfg.attention_block_q, t), min(cfg.attention_block_kv, s)
        out, lse = _flash_lse(bq, bc, int(start), q.reshape(b, t, hkv, h // hkv, dh), k, v,
                              valid, jnp.asarray(start, jnp.int32))
        return out.reshape(b, t, h, dh), lse.reshape(b, t, h)
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


def blockwise(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array, start=0,
              block_q: int = 512, block_kv: int = 512) -> jax.Array:
    """Attention over key blocks of `block_kv` slots and query blocks of `block_q` tokens.

    Arguments and result as `attend`. Temporaries are one block of float32 scores
    [B, Hkv, G, Q, C] plus O(T) statistics; the gradient (a custom VJP) recomputes the
    blocks instead of storing them.

    No conditional runs inside the loops (on GPU each `lax.cond` copies its predicate to
    the host and waits). With a static `start` (a Python int: a call without a cache, a
    prefill into a fresh one, every training forward) block pairs wholly in a query
    block's causal future are skipped through the loop bounds: query block i scans only
    its visible key blocks, key block j only the query blocks that see it. With a traced
    `start` (a cached call) every pair is computed, and pairs out of view add exactly
    nothing (their scores are -inf: p = 0, the running max unchanged, alpha = 1), so the
    result is the same bits as skipping them.
    """
    b, t, h, dh = q.shape
    hkv = k.shape[1]
    # A call shorter than a block runs as one block (no padding past T or S).
    bq, bc = min(block_q, t), min(block_kv, k.shape[2])
    static_start = int(start) if isinstance(start, int) else None
    out = _flash(bq, bc, static_start, q.reshape(b, t, hkv, h // hkv, dh), k, v, valid,
                 jnp.asarray(start, jnp.int32))
    return out.reshape(b, t, h * dh)


def _q_blocks(x, bq):
    """[B, T, Hkv, G, ...] -> [nQ, B, Hkv, G, Q, ...], T padded with zeros (queries that
    are computed and dropped; zero output gradients)."""
    b, t = x.shape[:2]
    nq = -(-t // bq)
    x = jnp.pad(x, ((0, 0), (0, nq * bq - t)) + ((0, 0),) * (x.ndim - 2))
    x = x.reshape(b, nq, bq, *x.shape[2:])
    # [B, nQ, Q, Hkv, G, ...] -> [nQ, B, Hkv, G, Q, ...]: blocks lead, for the scan.
    return jnp.moveaxis(x.swapaxes(0, 1), 2, 4)


def _kv_blocks(bc, k, v, valid):
    """k, v [B, Hkv, S, Dh] -> [nC, B, Hkv, C, Dh]; valid bool[B, S] -> [nC, B, C].

    Padded slots are invalid, so no query sees them.
    """
    b, hkv, s, dh = k.shape
    nc = -(-s // bc)

    def split(x):
        x = jnp.pad(x, ((0, 0), (0, 0), (0, nc * bc - s), (0, 0)))
        return x.reshape(b, hkv, nc, bc, dh).transpose(2, 0, 1, 3, 4)

    valid = jnp.pad(valid, ((0, 0), (0, nc * bc - s))).reshape(b, nc, bc).swapaxes(0, 1)
    return split(k), split(v), valid


def _unblock_q(x, t):
    """[nQ, B, Hkv, G, Q, ...] -> [B, T, Hkv, G, ...] (padding dropped)."""
    x = jnp.moveaxis(x, 4, 2).swapaxes(0, 1)                    # [B, nQ, Q, Hkv, G, ...]
    return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :t]


def _kv_blocks_in_view(i: int, bq: int, bc: int, nc: int, start: int) -> int:
    """How many key blocks (0, 1, ...) hold a slot at or before the last query of query
    block i: key block j is in view iff j * C <= start + i * Q + Q - 1."""
    return max(0, min(nc, (start + i * bq + bq - 1) // bc + 1))


def _first_q_block_in_view(j: int, bq: int, bc: int, nq: int, start: int) -> int:
    """The first query block whose last query sees a slot of key block j (nQ if none)."""
    # The smallest i with start + i * Q + Q - 1 >= j * C.
    return max(0, min(nq, -(-(j * bc - start - bq + 1) // bq)))


def _scores(qi, kj, valid_j, i, j, start):
    """float32[B, Hkv, G, Q, C] scaled scores of query block i and key block j, -inf where
    the key is invisible to the query."""
    bq, bc = qi.shape[-2], kj.shape[-2]
    s = jnp.einsum("bkgqd,bkcd->bkgqc", qi, kj,
                   preferred_element_type=jnp.float32) * (qi.shape[-1] ** -0.5)
    causal = (j * bc + jnp.arange(bc))[None, :] <= (start + i * bq + jnp.arange(bq))[:, None]
    vis = causal[None] & valid_j[:, None, :]                                   # [B, Q, C]
    # -inf, not a large finite value: exp() gives exact zeros, and the running max stays -inf
    # until a query sees its first key.
    return jnp.where(vis[:, None, None], s, -jnp.inf)


def _forward(bq, bc, static_start, q, k, v, valid, start):
    """Online-softmax forward: (out [B, T, Hkv, G, Dh] in v's dtype, lse float32[nQ, B, Hkv,
    G, Q]).

    lse is the log-sum-exp of each query's visible scores, +inf for a query that sees no
    key, so exp(score - lse) is its softmax row (all 0 for such a query).
    """
    qb, (kb, vb, validb) = _q_blocks(q, bq), _kv_blocks(bc, k, v, valid)
    nq, nc = qb.shape[0], kb.shape[0]

    def q_block(qi, i, num_kv):
        stats = qi.shape[:-1]                                         # [B, Hkv, G, Q]

        def kv_block(carry, j):
            # Block j read in place (a slice kb[:n] would be a copy per query block).
            kj, vj, valid_j = kb[j], vb[j], validb[j]
            m, l, acc = carry
            s = _scores(qi, kj, valid_j, i, j, start)
            m_new = jnp.maximum(m, s.max(-1))
            m_ref = jnp.where(jnp.isneginf(m_new), 0.0, m_new)  # no key seen yet
            p = jnp.exp(s - m_ref[..., None])
            # Rescales what was accumulated under the previous running max (0 while m is -inf).
            alpha = jnp.exp(m - m_ref)
            acc = alpha[..., None] * acc + jnp.einsum(
                "bkgqc,bkcd->bkgqd", p.astype(vj.dtype), vj, preferred_element_type=jnp.float32)
            return (m_new, alpha * l + p.sum(-1), acc), None

        # Running max m, normaliser l and unnormalised output acc of each query.
        init = (jnp.full(stats, -jnp.inf), jnp.zeros(stats), jnp.zeros(qi.shape, jnp.float32))
        (m, l, acc), _ = jax.lax.scan(kv_block, init, jnp.arange(num_kv))
        seen = l > 0
        out = (acc / jnp.where(seen, l, 1.0)[..., None]).astype(v.dtype)
        return out, jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), jnp.inf)

    if static_start is None:  # every pair; out-of-view pairs add exact zeros
        _, (out, lse) = jax.lax.scan(lambda _, xs: (None, q_block(*xs, nc)), None,
                                     (qb, jnp.arange(nq)))
    else:  # query block i scans its visible key blocks only (static bounds)
        parts = [q_block(qb[i], i, _kv_blocks_in_view(i, bq, bc, nc, static_start))
                 for i in range(nq)]
        out, lse = (jnp.stack(x) for x in zip(*parts))
    return _unblock_q(out, q.shape[1]), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _flash(bq, bc, static_start, q, k, v, valid, start):
    """q [B, T, Hkv, G, Dh] -> [B, T, Hkv, G, Dh] in v's dtype; see `blockwise`."""
    return _forward(bq, bc, static_start, q, k, v, valid, start)[0]


def _flash_fwd(bq, bc, static_start, q, k, v, valid, start):
    out, lse = _forward(bq, bc, static_start, q, k, v, valid, start)
    return out, (q, k, v, valid, start, out, lse)


def _flash_bwd(bq, bc, static_start, res, dout):
    return _backward(bq, bc, static_start, res, dout, None)


def _backward(bq, bc, static_start, res, dout, dlse):
    """FlashAttention-2 backward: per block pair p = exp(s - lse), dv += p^T do,
    ds = p * (do v^T - rowsum(do * out)), dq += ds k, dk += ds^T q (times the scale).

    With a cotangent dlse [B, T, Hkv, G] of the log-sum-exp output (`_flash_lse`), whose
    derivative by a score is that score's p: ds = p * (do v^T - rowsum(do * out) + dlse),
    the same loop with rowsum(do * out) - dlse in place of the row sum."""
    q, k, v, valid, start, out, lse = res
    t, scale = q.shape[1], q.shape[-1] ** -0.5
    qb, (kb, vb, validb) = _q_blocks(q, bq), _kv_blocks(bc, k, v, valid)
    dob = _q_blocks(dout, bq)
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B,T,Hkv,G]
    if dlse is not None:
        delta = delta - dlse.astype(jnp.float32)
    deltab = _q_blocks(delta, bq)
    nq, nc = qb.shape[0], kb.shape[0]

    # Outer loop over key blocks: a block's dk, dv are complete after its inner loop over
    # query blocks; dq accumulates across key blocks in place (one [nQ, ...] buffer).
    def kv_block(kj, vj, valid_j, j, first, dq):
        def q_block(carry, i):
            # Block i read in place (a slice qb[first:] would be a copy per key block).
            qi, doi, lse_i, delta_i = qb[i], dob[i], lse[i], deltab[i]
            dk, dv, dq = carry
            # The forward's softmax, recomputed from the saved log-sum-exp.
            p = jnp.exp(_scores(qi, kj, valid_j, i, j, start) - lse_i[..., None])
            dv = dv + jnp.einsum("bkgqc,bkgqd->bkcd", p.astype(doi.dtype), doi,
                                 preferred_element_type=jnp.float32)
            dp = jnp.einsum("bkgqd,bkcd->bkgqc", doi, vj, preferred_element_type=jnp.float32)
            # Softmax backward: dS = P * (dP - rowsum(dO * O)), times the score scale.
            ds = (p * (dp - delta_i[..., None]) * scale).astype(qi.dtype)
            dk = dk + jnp.einsum("bkgqc,bkgqd->bkcd", ds, qi, preferred_element_type=jnp.float32)
            dq = dq.at[i].add(jnp.einsum("bkgqc,bkcd->bkgqd", ds, kj,
                                         preferred_element_type=jnp.float32))
            return (dk, dv, dq), None

        zeros = jnp.zeros(kj.shape, jnp.float32)
        (dk, dv, dq), _ = jax.lax.scan(q_block, (zeros, zeros, dq), jnp.arange(first, nq))
        return dk, dv, dq

    dq = jnp.zeros(qb.shape, jnp.float32)
    if static_start is None:  # every pair; out-of-view pairs add exact zeros (p = 0)
        def step(dq, xs):
            dk, dv, dq = kv_block(*xs, 0, dq)
            return dq, (dk, dv)

        dq, (dk, dv) = jax.lax.scan(step, dq, (kb, vb, validb, jnp.arange(nc)))
    else:  # key block j scans the query blocks that see it only (static bounds)
        dks, dvs = [], []
        for j in range(nc):
            first = _first_q_block_in_view(j, bq, bc, nq, static_start)
            dk_j, dv_j, dq = kv_block(kb[j], vb[j], validb[j], j, first, dq)
            dks.append(dk_j)
            dvs.append(dv_j)
        dk, dv = jnp.stack(dks), jnp.stack(dvs)
    s = k.shape[2]

    def unblock_kv(x):  # [nC, B, Hkv, C, Dh] -> [B, Hkv, S, Dh]
        return x.transpose(1, 2, 0, 3, 4).reshape(*k.shape[:2], -1, k.shape[-1])[:, :, :s]

    # No cotangents for `valid` (bool) and `start` (int).
    return (_unblock_q(dq, t).astype(q.dtype), unblock_kv(dk).astype(k.dtype),
            unblock_kv(dv).astype(v.dtype), None, None)


_flash.defvjp(_flash_fwd, _flash_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _flash_lse(bq, bc, static_start, q, k, v, valid, start):
    """`_flash` that also returns each query's log-sum-exp float32[B, T, Hkv, G] (-inf
    for a query that sees no key), differentiable: what joins two attentions over disjoint
    key sets (`join_parts`)."""
    out, lse = _forward(bq, bc, static_start, q, k, v, valid, start)
    return out, _lse_rows(lse, q.shape[1])


def _lse_rows(lse, t):
    """Blocked lse [nQ, B, Hkv, G, Q] (+inf where no key) -> [B, T, Hkv, G] (-inf there)."""
    lse = _unblock_q(lse[..., None], t)[..., 0]
    return jnp.where(jnp.isposinf(lse), -jnp.inf, lse)


def _flash_lse_fwd(bq, bc, static_start, q, k, v, valid, start):
    out, lse = _forward(bq, bc, static_start, q, k, v, valid, start)
    return (out, _lse_rows(lse, q.shape[1])), (q, k, v, valid, start, out, lse)


def _flash_lse_bwd(bq, bc, static_start, res, cotangents):
    dout, dlse = cotangents
    # A query that sees no key has p = 0 everywhere: its dlse meets only zeros.
    return _backward(bq, bc, static_start, res, dout, jnp.where(jnp.isfinite(dlse), dlse, 0.0))


_flash_lse.defvjp(_flash_lse_fwd, _flash_lse_bwd)


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
