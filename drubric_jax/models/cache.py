"""The static-shape key/value cache shared by every attention model family.

Layout [L, B, Hkv, S, Dh]: heads before slots, so attention reads one layer's keys without
a transpose. Prompts are left-padded, so every row writes the same slot at each step;
`valid` marks the slots that hold real tokens and callers pass explicit RoPE positions, so
padding never shifts a row.

Decode loops may use a per-layer form (`unstack_cache`): k and v as tuples of L arrays.
On CPU, XLA copies each scanned slice of a stacked cache before its matmul on every step;
separate arrays are copied once per loop. Both forms give the same numbers.

A per-layer cache may also be chunked (`add_chunk`): each layer's k and v a tuple of
arrays [B, Hkv, S_c, Dh] whose slots follow one another (S = sum of S_c). A decode in
segments (`sampling.decode_segments`) adds a chunk per segment: the slots already written
are neither copied nor reallocated, each step writes into the last chunk and attends over
all of them (`models.attention`), so it reads the slots of the chunks so far, not S.

The rollout engine keeps its own paged cache (`models.paged.PagedKV`): a pool of pages, a
page table and a live length per slot, rows sharing a prompt's pages.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from drubric_jax.models.config import ModelConfig


@flax.struct.dataclass
class KVCache:
    """Static-shape key/value cache.

    Attributes:
        k: [L, B, Hkv, S, Dh] keys (compute dtype), RoPE already applied; in the per-layer
            form (`unstack_cache`), a tuple of L arrays [B, Hkv, S, Dh], or of L tuples of
            chunks [B, Hkv, S_c, Dh] (`add_chunk`).
        v: values, laid out as k.
        valid: bool[B, S], True where the slot holds a real (non-padding) token.
        index: int32[] next slot to write; the same for every row.
        empty: True (static) for a cache as `init_cache` made it, nothing written yet: a
            forward pass into it attends only over its own T tokens (causal, as without a
            cache) and writes them to slots [0, T); the S - T slots still empty are never
            read. False once anything was written (every cache a forward pass returns).
    """

    k: jax.Array
    v: jax.Array
    valid: jax.Array
    index: jax.Array
    empty: bool = flax.struct.field(pytree_node=False, default=False)

    @property
    def num_slots(self) -> int:
        # S is the second-to-last axis in every form (summed over chunks).
        return layer_slots(self.k[0] if isinstance(self.k, tuple) else self.k)


def layer_slots(k) -> int:
    """S of one layer's keys: an array [..., S, Dh] or a tuple of chunks (their sum)."""
    return sum(c.shape[-2] for c in k) if isinstance(k, tuple) else k.shape[-2]


def call_slots(cache: KVCache, t: int) -> tuple:
    """(start, next index) of a forward call writing T = `t` tokens at `cache.index`: start
    is the slot the causal mask puts the first query at (`attention.attend`; None for an
    `empty` cache), next index the cache's index after the call."""
    return (None if cache.empty else cache.index), cache.index + t


def init_cache(cfg: ModelConfig, batch: int, num_slots: int) -> KVCache:
    """Empty cache with `num_slots` slots per row, in the compute dtype."""
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, num_slots, cfg.head_dim)
    return KVCache(
        k=jnp.zeros(shape, cfg.compute_dtype),
        v=jnp.zeros(shape, cfg.compute_dtype),
        # Nothing written yet: no slot is visible to any query.
        valid=jnp.zeros((batch, num_slots), bool),
        index=jnp.zeros((), jnp.int32), empty=True)


def repeat_rows(cache: KVCache, n: int) -> KVCache:
    """Each row of a stacked cache repeated `n` times in place (row b -> rows b*n..b*n+n-1).

    The verifier scores n rubric items against one prefilled response this way.
    """
    return KVCache(k=jnp.repeat(cache.k, n, axis=1), v=jnp.repeat(cache.v, n, axis=1),
                   valid=jnp.repeat(cache.valid, n, axis=0), index=cache.index)


def unstack_cache(cache: KVCache) -> KVCache:
    """Per-layer form of a cache: k and v as tuples of L arrays [B, Hkv, S, Dh]. Idempotent."""
    if isinstance(cache.k, tuple):
        return cache
    n = cache.k.shape[0]
    # Each layer's slice copied once; a decode loop then slices no stacked array per step.
    return cache.replace(k=tuple(cache.k[i] for i in range(n)),
                         v=tuple(cache.v[i] for i in range(n)))


def add_chunk(cache: KVCache, num_slots: int) -> KVCache:
    """The cache with `num_slots` slots per row: the S current slots kept as they are,
    num_slots - S empty (invalid, zero) slots after them.

    Per-layer form: one more chunk per layer ([B, Hkv, num_slots - S, Dh] zeros); nothing
    already written is copied, and the cache holds exactly num_slots slots. Stacked form
    (TPU decode): the arrays are padded, a copy that holds the old and the new arrays for a
    moment.

    Raises:
        ValueError: `num_slots` is smaller than the cache's S.
    """
    extra = num_slots - cache.num_slots
    if extra < 0:
        raise ValueError(f"cannot shrink a KV cache of {cache.num_slots} slots to {num_slots}")
    if extra == 0:
        return cache

    def grown(x):
        if not isinstance(cache.k, tuple):  # stacked [L, B, Hkv, S, Dh]: padded
            return jnp.pad(x, ((0, 0),) * 3 + ((0, extra), (0, 0)))
        chunks = x if isinstance(x, tuple) else (x,)
        first = chunks[0]
        # Zeros broadcast from a slot of the first chunk, so they take its layout (rows,
        # heads) from the operand, inside a program or outside one.
        return (*chunks, jnp.broadcast_to(jnp.zeros_like(first[:, :, :1]),
                                          (*first.shape[:2], extra, first.shape[-1])))

    k, v = ((tuple(grown(x) for x in c) if isinstance(c, tuple) else grown(c))
            for c in (cache.k, cache.v))
    return cache.replace(k=k, v=v, valid=jnp.pad(cache.valid, ((0, 0), (0, extra))))


def stack_cache(cache: KVCache) -> KVCache:
    """Inverse of `unstack_cache` (k, v back to [L, B, Hkv, S, Dh]; chunks joined).
    Idempotent."""
    if not isinstance(cache.k, tuple):
        return cache

    def whole(x):  # one layer: an array or its chunks
        return jnp.concatenate(x, axis=-2) if isinstance(x, tuple) else x

    return cache.replace(k=jnp.stack([whole(x) for x in cache.k]),
                         v=jnp.stack([whole(x) for x in cache.v]))


def write_layer(cache_layer, x: jax.Array, start: jax.Array):
    """One layer's per-layer cache [B, Hkv, S, Dh] with a call's x [B, Hkv, T, Dh] (heads
    first) at slots [start, start + T). A chunked layer (`add_chunk`) is written in its last
    chunk, at start minus the slots before it: the caller (`sampling.decode_segments`)
    writes only slots that chunk holds."""
    if not isinstance(cache_layer, tuple):
        return jax.lax.dynamic_update_slice(cache_layer, x.astype(cache_layer.dtype),
                                            (0, 0, start, 0))
    *before, last = cache_layer
    offset = sum(c.shape[-2] for c in before)  # static
    return (*before, jax.lax.dynamic_update_slice(last, x.astype(last.dtype),
                                                  (0, 0, start - offset, 0)))
