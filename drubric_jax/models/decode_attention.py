"""Attention of one query per row over a KV cache (a decode step), whole or in chunks.

`models.attention.materialized` calls `attend_one` for T = 1. The cache's k and v come as
one array [B, Hkv, S, Dh] or as chunks [B, Hkv, S_c, Dh] whose slots follow one another
(`models.cache.add_chunk`, a decode in segments): the scores of every chunk are computed
from that chunk in place and joined ([B, Hkv, G, S] float32, H / (Hkv Dh) of the cache's
bytes), one softmax runs over all S slots, and each chunk's values are weighted by its
slice of the probabilities. No chunk is copied or joined.

Axis legend: B rows, Hkv key/value heads, G = H // Hkv query heads per key head, S slots
(S_c of a chunk), Dh head dim.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def attend_one(q: jax.Array, k: tuple, v: tuple, visible: jax.Array,
               mask_value: float) -> jax.Array:
    """[B, 1, H * Dh] in v's dtype: softmax(q k^T / sqrt(Dh)) v over the visible slots.

    Args:
        q: [B, 1, H, Dh] (RoPE applied).
        k, v: tuples of chunks [B, Hkv, S_c, Dh] (one chunk: the whole cache).
        visible: bool[B, 1, 1, S], False for slots the query may not see (padding, not
            yet written, after the query).
        mask_value: the score of an invisible slot before the softmax (finite, so a row
            that sees nothing has a finite softmax; its output is 0).

    Source: GQA (Ainslie et al. 2023, arXiv:2305.13245): the G query heads of a group
    read one key/value head, which is never repeated.
    """
    b, _, h, dh = q.shape
    hkv = k[0].shape[1]
    # Scores with the query axis kept ([B, Hkv, G, 1, S]): XLA CPU runs this form of the
    # product 4% faster than the [B, Hkv, G, S] one (SmolLM2-135M, B = 8 and 32).
    q = q.reshape(b, 1, hkv, h // hkv, dh)
    parts = [jnp.einsum("btkgd,bksd->bkgts", q, kc, preferred_element_type=jnp.float32)
             for kc in k]
    scores = (parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)) * (dh ** -0.5)
    visible = visible[:, :, :, None]                                    # [B, 1, 1, 1, S]
    probs = jax.nn.softmax(jnp.where(visible, scores, mask_value), axis=-1)
    dtype = v[0].dtype
    # Exactly 0 already wherever a row sees some key; zeroes the rows that see none.
    probs = jnp.where(visible, probs, 0.0).astype(dtype)[:, :, :, 0]
    out, first = 0.0, 0
    for vc in v:
        out = out + values(probs[..., first:first + vc.shape[2]], vc,
                           as_matmul=jax.default_backend() != "cpu")
        first += vc.shape[2]
    return out.astype(dtype).reshape(b, 1, h * dh)


def values(probs: jax.Array, v: jax.Array, as_matmul: bool) -> jax.Array:
    """float32[B, Hkv, G, Dh] = probs @ v for one query per row: probs [B, Hkv, G, S] in
    v's dtype, v [B, Hkv, S, Dh] (the cache or one chunk of it).

    As a matmul (accelerators): one [G, S] x [S, Dh] product per (row, key head), the
    cache read once per step in its own dtype. As a multiply-and-reduce over the slots
    (CPU): there the dot is B * Hkv tiny matmuls with a transposed result, which XLA CPU
    runs several times slower than one fused loop; on an accelerator that loop would read
    the cache G times, in float32.
    """
    if as_matmul:
        return jnp.einsum("bkgs,bksd->bkgd", probs, v, preferred_element_type=jnp.float32)
    return jnp.sum(probs[..., None].astype(jnp.float32) * v[:, :, None].astype(jnp.float32),
                   axis=-2)
