"""A paged KV cache for decode steps that read only what is live (the rollout engine's).

Every layer's keys and values live in one pool of pages, [Hkv, num_pages, page, Dh]. A
decode slot owns no positions of its own: its page table (int32[pages_per_slot]) lists the
pages that hold its tokens in order, and its length says how many of them are live. So:

- **A step reads a slot's live pages only.** On a GPU or a TPU the attention is JAX's
  Pallas paged-attention kernel (`jax.experimental.pallas.ops.gpu.paged_attention`,
  `jax.experimental.pallas.ops.tpu.paged_attention`): a slot's pages past its length are
  neither loaded nor scored, so a step's cache bytes follow the live tokens, not the
  slot's capacity. On CPU the same function runs in XLA (`impl="xla"`): it gathers the
  table's pages and masks past the length (the CPU path reads the whole table; the Pallas
  kernels are tested on CPU in interpret mode, `interpret=True`).
- **Rows that share a prefix share its pages.** The K answers of a prompt (or the G lists
  of a generator input) list the same prefix pages first; each holds only its own suffix
  pages. The prefix's last, partly filled page is the one page a row copies (its suffix
  continues in it), as in vLLM's paged attention (Kwon et al. 2023, arXiv:2309.06180),
  whose layout the kernels follow. One attention runs over [prefix | suffix]: no join is
  needed, since the pages hold the tokens in order.

Positions: a slot's token j (prefix and suffix alike, no padding) is its position j, so
its RoPE position is j too and the next token's is the slot's length.

Axis legend (docs/CONVENTIONS.md): E slots, H query heads, Hkv key/value heads, G = H / Hkv,
Dh head dim, Np pages in the pool, Ps tokens a page, Pt pages a slot's table holds.
"""
from __future__ import annotations

from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

# Page 0 of every pool is scratch: a step of a slot that writes nothing (free, or its row
# ended) writes there, and no table of a live slot lists it.
SCRATCH_PAGE = 0
_MASK_VALUE = -1e30  # finite, as `attention._MASK_VALUE`: a slot with length 0 outputs 0
IMPLS = ("auto", "xla", "pallas")


@flax.struct.dataclass
class PagedKV:
    """The paged cache of E decode slots.

    Attributes:
        k, v: per layer, [Hkv, Np, Ps, Dh] in the compute dtype: a tuple of L arrays
            (the per-layer decode form) or one stacked [L, Hkv, Np, Ps, Dh] array.
        tables: int32[E, Pt] each slot's pages in token order (entries past its live
            pages are ignored; they may repeat SCRATCH_PAGE).
        lengths: int32[E] live tokens of each slot (its prefix and what it has written).
        impl: static, the attention implementation (`IMPLS`; "auto": Pallas on GPU and
            TPU, XLA on CPU).
        interpret: static, run the Pallas kernel in interpret mode (CPU tests).
        shards: static, R: the slots and the pool's pages split R ways (a mesh's row
            shards), each shard's tables listing its own pages by local id
            (`local_map`).
    """

    k: object
    v: object
    tables: jax.Array
    lengths: jax.Array
    impl: str = flax.struct.field(pytree_node=False, default="auto")
    interpret: bool = flax.struct.field(pytree_node=False, default=False)
    shards: int = flax.struct.field(pytree_node=False, default=1)

    @property
    def page_size(self) -> int:
        return (self.k[0] if isinstance(self.k, tuple) else self.k).shape[-2]

    @property
    def num_pages(self) -> int:
        return (self.k[0] if isinstance(self.k, tuple) else self.k).shape[-3]


def init_pool(num_layers: int, num_kv_heads: int, head_dim: int, num_pages: int,
              page_size: int, dtype, per_layer: bool = True):
    """Zero k and v pools: per layer [Hkv, Np, Ps, Dh] (a tuple of L arrays when
    `per_layer`, else one [L, Hkv, Np, Ps, Dh] array each).

    Raises:
        ValueError: fewer than 2 pages (page 0 is scratch), or a page size < 1.
    """
    if num_pages < 2 or page_size < 1:
        raise ValueError(f"a page pool needs >= 2 pages (page {SCRATCH_PAGE} is scratch) "
                         f"of >= 1 token, got {num_pages} pages of {page_size}")
    shape = (num_kv_heads, num_pages, page_size, head_dim)
    if per_layer:
        return (tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
                tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)))
    return jnp.zeros((num_layers, *shape), dtype), jnp.zeros((num_layers, *shape), dtype)


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold `tokens` tokens."""
    return -(-tokens // page_size)


def choose(impl: str, backend: Optional[str] = None) -> str:
    """The implementation `attend_pages` runs: "pallas" on GPU and TPU under "auto", "xla"
    on CPU (and wherever asked).

    Raises:
        ValueError: `impl` not in IMPLS.
    """
    if impl not in IMPLS:
        raise ValueError(f"paged attention impl must be one of {IMPLS}, got {impl!r}")
    backend = backend or jax.default_backend()
    if impl == "auto":
        return "pallas" if backend in ("gpu", "tpu") else "xla"
    return impl


def write_token(pages: jax.Array, x: jax.Array, tables: jax.Array, lengths: jax.Array,
                write: jax.Array) -> jax.Array:
    """One layer's pool [Hkv, Np, Ps, Dh] with each slot's new key (or value) x
    [E, Hkv, Dh] at its position `lengths[e]`: page tables[e, lengths[e] // Ps], offset
    lengths[e] % Ps. A slot with `write[e]` False (bool[E]) writes SCRATCH_PAGE instead.
    In place when the pool is donated; the caller keeps lengths[e] < Pt * Ps."""
    ps = pages.shape[-2]
    page = jnp.take_along_axis(tables, (lengths // ps)[:, None], axis=1)[:, 0]
    page = jnp.where(write, page, SCRATCH_PAGE)
    offset = jnp.where(write, lengths % ps, 0)
    return pages.at[:, page, offset].set(jnp.swapaxes(x, 0, 1).astype(pages.dtype))


def attend_pages(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, tables: jax.Array,
                 lengths: jax.Array, impl: str = "auto", interpret: bool = False,
                 kernel: Optional[str] = None) -> jax.Array:
    """One query per slot over its live tokens: softmax(q k^T / sqrt(Dh)) v.

    Args:
        q: [E, H, Dh] (RoPE applied).
        k_pages, v_pages: one layer's pool [Hkv, Np, Ps, Dh].
        tables: int32[E, Pt] the slot's pages in token order.
        lengths: int32[E] live tokens (keys 0..lengths-1 are read; 0: the output is 0).
        impl: "auto" | "xla" | "pallas" (`choose`). "pallas" is JAX's GPU kernel on a GPU
            or under `interpret`, its TPU kernel on a TPU.
        interpret: run the Pallas kernel in interpret mode (CPU).
        kernel: "gpu" or "tpu", whose Pallas kernel "pallas" runs (None: the TPU's on a
            TPU, else the GPU's). The TPU kernel in interpret mode computes its products
            as a TPU does at default precision (bfloat16 passes).

    Returns:
        [E, H, Dh] in v's dtype (float32 accumulation).

    Source: paged attention (Kwon et al. 2023) through JAX's Pallas kernels; GQA: the G
    query heads of a key head read it once.
    """
    impl = choose(impl)
    if impl == "xla":
        return _attend_xla(q, k_pages, v_pages, tables, lengths)
    dh = q.shape[-1]
    # Neither kernel scales the scores: q carries 1/sqrt(Dh).
    qs = (q.astype(jnp.float32) * dh ** -0.5).astype(q.dtype)
    lengths = lengths.astype(jnp.int32)
    kernel = kernel or ("tpu" if jax.default_backend() == "tpu" else "gpu")
    if kernel == "tpu":
        import contextlib

        from jax.experimental.pallas import tpu as pltpu
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
        with pltpu.force_tpu_interpret_mode() if interpret else contextlib.nullcontext():
            out = paged_attention(qs, k_pages, v_pages, lengths, tables,
                                  pages_per_compute_block=_divisor(tables.shape[1], 8))
        # A slot with nothing live: the TPU kernel's output there is not defined as 0.
        return jnp.where((lengths > 0)[:, None, None], out, 0).astype(v_pages.dtype)
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention
    pt = tables.shape[1]
    splits = _divisor(pt, 16)
    out = paged_attention(qs, k_pages, v_pages, tables, lengths, k_splits=splits,
                          pages_per_compute_block=_divisor(pt // splits, 8),
                          interpret=interpret)
    # The kernel divides by (sum + eps): a slot with nothing live comes out 0 already.
    return out.astype(v_pages.dtype)


def _row_mesh(shards: int):
    """The mesh context (`parallel.rows_on`) when its row shards ("data" x "fsdp") are
    `shards` > 1, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if shards == 1 or mesh.empty or not {"data", "fsdp"} <= set(mesh.axis_names):
        return None
    return mesh if mesh.shape["data"] * mesh.shape["fsdp"] == shards else None


def local_map(fn, shards: int, pools: tuple, rows: tuple, per_shard: tuple = (),
              pools_out: int = 0, rows_out: int = 0, head_rows: int = 0,
              heads: tuple = ()):
    """Runs `fn(*pools, *rows, *per_shard, *heads)` on each row shard's part: pools
    [Hkv, R * Np_l, ...] split by pages, rows [E, ...] by rows, per_shard [R, ...] one
    entry a shard, heads [Hkv, ...] the same for every shard; `fn` sees local pools (page
    ids 0..Np_l-1, as the tables hold them) and returns `pools_out` pools then `rows_out`
    row arrays. The first `head_rows` rows (and every row output) have a heads axis after
    the rows ([E, heads, ...]).

    On a mesh context with R row shards: a shard_map, each device alone on its pages (the
    KV heads split over "tensor" when they divide). Otherwise (one shard, or R shards
    without a mesh, as in a shape analysis) the same function over each shard's slices in
    turn, so the results do not depend on the layout.
    """
    mesh = _row_mesh(shards)
    if mesh is None:
        outs = []
        for d in range(shards):
            def part(x, n):
                size = x.shape[n] // shards
                return jax.lax.slice_in_dim(x, d * size, (d + 1) * size, axis=n)
            outs.append(fn(*(part(x, 1) for x in pools), *(part(x, 0) for x in rows),
                           *(x[d] for x in per_shard), *heads))
        if shards == 1:
            return outs[0]
        return tuple(jnp.concatenate([o[j] for o in outs], axis=1 if j < pools_out else 0)
                     for j in range(pools_out + rows_out))
    from jax.sharding import PartitionSpec as P

    batch = ("data", "fsdp")
    hkv = pools[0].shape[0]
    split = ("tensor" if "tensor" in mesh.axis_names and hkv % mesh.shape["tensor"] == 0
             else None)
    n, m, r = len(pools), len(rows), len(per_shard)

    def body(*args):  # each shard's per_shard entry arrives as [1, ...]
        return fn(*args[:n + m], *(x[0] for x in args[n + m:n + m + r]),
                  *args[n + m + r:])

    specs_in = ((P(split, batch),) * n
                + tuple(P(batch, split) if j < head_rows else P(batch) for j in range(m))
                + (P(batch),) * r + (P(split),) * len(heads))
    specs_out = (P(split, batch),) * pools_out + (P(batch, split),) * rows_out
    return jax.shard_map(body, mesh=mesh, in_specs=specs_in, out_specs=specs_out,
                         check_vma=False)(*pools, *rows, *per_shard, *heads)


def write_pages(pool: jax.Array, x: jax.Array, pages: jax.Array) -> jax.Array:
    """A pool [Hkv, R * Np_l, Ps, Dh] with x [Hkv, Pp, Ps, Dh] (a prompt's pages) written
    at local pages pages[d] (int32[R, Pp]) of each shard d (SCRATCH_PAGE: not written)."""
    def fn(pool, pages, x):
        return (pool.at[:, pages].set(x.astype(pool.dtype)),)
    return local_map(fn, pages.shape[0], (pool,), (), (pages,), pools_out=1, heads=(x,))[0]


def copy_pages(pool: jax.Array, copy: jax.Array) -> jax.Array:
    """A pool [Hkv, R * Np_l, Ps, Dh] with each shard d's local page copy[d, 0] copied to
    its page copy[d, 1] (int32[R, 2]; SCRATCH_PAGE to SCRATCH_PAGE: nothing)."""
    def fn(pool, pair):
        return (pool.at[:, pair[1]].set(pool[:, pair[0]]),)
    return local_map(fn, copy.shape[0], (pool,), (), (copy,), pools_out=1)[0]


def step_attention(cache: "PagedKV", k_pool: jax.Array, v_pool: jax.Array, q: jax.Array,
                   k: jax.Array, v: jax.Array, write: jax.Array) -> tuple:
    """One decode step of one layer on a paged cache: each slot's new key and value
    (k, v [E, Hkv, Dh]) written at its length where `write` (bool[E]), then its query
    q [E, H, Dh] over its live tokens, this one included (`attend_pages`). Per row shard
    (`local_map`): no device reads another's pages.

    Returns:
        (out [E, H, Dh], k_pool, v_pool).
    """
    def fn(kp, vp, q, k, v, tables, lengths, write):
        kp = write_token(kp, k, tables, lengths, write)
        vp = write_token(vp, v, tables, lengths, write)
        # At most the table's tokens: a freed slot keeps its last length, which may pass
        # the columns a step reads (`engine.read_bucket`); a kernel must not read past them.
        seen = jnp.minimum(lengths + write.astype(lengths.dtype),
                           tables.shape[1] * kp.shape[-2])
        return kp, vp, attend_pages(q, kp, vp, tables, seen, cache.impl, cache.interpret)

    kp, vp, out = local_map(fn, cache.shards, (k_pool, v_pool),
                            (q, k, v, cache.tables, cache.lengths, write),
                            pools_out=2, rows_out=1, head_rows=3)
    return out, kp, vp


def _divisor(n: int, most: int) -> int:
    """The largest divisor of n that is <= most (the kernels' split and block counts must
    divide the table)."""
    return max(d for d in range(1, min(n, most) + 1) if n % d == 0)


def _attend_xla(q, k_pages, v_pages, tables, lengths):
    e, h, dh = q.shape
    hkv, _, ps, _ = k_pages.shape
    # [Hkv, E, Pt, Ps, Dh] -> [Hkv, E, S = Pt * Ps, Dh]: the table's pages gathered.
    k = k_pages[:, tables].reshape(hkv, e, -1, dh)
    v = v_pages[:, tables].reshape(hkv, e, -1, dh)
    qg = q.reshape(e, hkv, h // hkv, dh)
    scores = jnp.einsum("ekgd,kesd->ekgs", qg, k,
                        preferred_element_type=jnp.float32) * (dh ** -0.5)
    live = jnp.arange(k.shape[2])[None, :] < lengths[:, None]          # [E, S]
    scores = jnp.where(live[:, None, None], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(live[:, None, None], probs, 0.0)
    out = jnp.einsum("ekgs,kesd->ekgd", probs.astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    return out.reshape(e, h, dh).astype(v_pages.dtype)


def forward_step(params, cfg, x, positions, token_mask, cache: "PagedKV", inv_freq, mlp,
                 layer_slice):
    """`models.forward_hidden`'s decode step on a paged cache: x [E, 1, D] embedded tokens,
    one a slot, written at the slot's length (where token_mask is True; else to the
    scratch page), attending over the slot's live tokens with it (`step_attention`);
    `layer_slice(layers, i)` is the family's slice of stacked layer weights. Returns
    (final-norm hidden [E, 1, D], the cache with the written pools and lengths +
    token_mask)."""
    from drubric_jax.models.blocks import layer, rms_norm

    b, t, _ = x.shape
    if t != 1:
        raise ValueError(f"a paged cache takes one token a slot a call, got T={t}")
    write = token_mask[:, 0]
    lengths = cache.lengths

    def attention_over(kc, vc):
        def attention(q, k, v):
            out, kc2, vc2 = step_attention(cache, kc, vc, q[:, 0], k[:, 0], v[:, 0], write)
            return out.reshape(b, 1, -1), (kc2, vc2)
        return attention

    layers = params["layers"]
    if isinstance(cache.k, tuple):  # per-layer pools: a layer loop
        k_new, v_new = [], []
        for i in range(cfg.num_layers):
            p = layers[i] if isinstance(layers, (list, tuple)) else layer_slice(layers, i)
            x, (kc, vc) = layer(cfg, p, x, positions, inv_freq,
                                attention_over(cache.k[i], cache.v[i]), mlp)
            k_new.append(kc)
            v_new.append(vc)
        k_new, v_new = tuple(k_new), tuple(v_new)
    else:  # stacked pools [L, ...]: a scan whose carry is the pools (TPU's decode form)
        def body(carry, xs):
            x, k_all, v_all = carry
            p, i = xs
            x, (kc, vc) = layer(cfg, p, x, positions, inv_freq,
                                attention_over(k_all[i], v_all[i]), mlp)
            return (x, k_all.at[i].set(kc), v_all.at[i].set(vc)), None

        if isinstance(layers, (list, tuple)):
            carry = (x, cache.k, cache.v)
            for i, p in enumerate(layers):
                carry, _ = body(carry, (p, i))
            x, k_new, v_new = carry
        else:
            (x, k_new, v_new), _ = jax.lax.scan(body, (x, cache.k, cache.v),
                                                (layers, jnp.arange(cfg.num_layers)))
    # A slot's length grows by the token it wrote (`step_attention`'s query read it).
    new_cache = cache.replace(k=k_new, v=v_new, lengths=lengths + write.astype(lengths.dtype))
    return rms_norm(x, params["final_norm"], cfg.norm_eps), new_cache
