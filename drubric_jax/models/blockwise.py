"""Blockwise (flash-attention style) attention with a hand-written backward: the
"blockwise" implementation of `models.attention.attend`, and its variant that returns each
query's log-sum-exp (`blockwise_with_lse`, for the shared-prefix update's join).

Axis legend: B batch, T queries of this call, S key slots, H query heads, Hkv key/value
heads, G = H // Hkv, Dh head dim; Q and C the query- and key-block lengths, nQ and nC the
block counts (T and S padded up to nQ * Q and nC * C). Visibility as in
`models.attention`: query t, at slot start + t, sees key slot s iff valid[b, s] and
s <= start + t.

Sources: online softmax, Milakov & Gimelshein 2018 (arXiv:1805.02867); the forward and
backward are Algorithms 1 and 2 of FlashAttention-2 (Dao 2023, arXiv:2307.08691), with the
backward's dq accumulated over key blocks in a scan carry.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


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


def blockwise_with_lse(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array,
                       start: int, block_q: int = 512, block_kv: int = 512):
    """`blockwise` that also returns each query's log-sum-exp, differentiable: what joins
    two attentions over disjoint key sets (`attention.join_parts`).

    Args: as `blockwise`, with a static `start` (a Python int).
    Returns:
        (out [B, T, H, Dh] in v's dtype, lse float32[B, T, H]: -inf for a query that sees
        no key, its out 0).
    """
    b, t, h, dh = q.shape
    hkv, s = k.shape[1], k.shape[2]
    bq, bc = min(block_q, t), min(block_kv, s)
    # start >= S: every slot is in every query's view, so no block pair can be skipped, and
    # the loops run as scans (no static start) instead of one unrolled loop per query block
    # (the compile of the shared-prefix update at the paper's shapes: 334 -> 144 s).
    static = None if start >= s else int(start)
    out, lse = _flash_lse(bq, bc, static, q.reshape(b, t, hkv, h // hkv, dh), k, v, valid,
                          jnp.asarray(start, jnp.int32))
    return out.reshape(b, t, h, dh), lse.reshape(b, t, h)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _flash_lse(bq, bc, static_start, q, k, v, valid, start):
    """`_flash` that also returns each query's log-sum-exp float32[B, T, Hkv, G] (-inf
    for a query that sees no key)."""
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
