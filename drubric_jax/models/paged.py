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

import math
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
    """

    k: object
    v: object
    tables: jax.Array
    lengths: jax.Array
    impl: str = flax.struct.field(pytree_node=False, default="auto")
    interpret: bool = flax.struct.field(pytree_node=False, default=False)

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
        ValueError: `impl` not in IMPLS, or "pallas" on a backend without a kernel and not
            in interpret mode (the caller decides; see `attend_pages`).
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
                 lengths: jax.Array, impl: str = "auto", interpret: bool = False) -> jax.Array:
    """One query per slot over its live tokens: softmax(q k^T / sqrt(Dh)) v.

    Args:
        q: [E, H, Dh] (RoPE applied).
        k_pages, v_pages: one layer's pool [Hkv, Np, Ps, Dh].
        tables: int32[E, Pt] the slot's pages in token order.
        lengths: int32[E] live tokens (keys 0..lengths-1 are read; 0: the output is 0).
        impl: "auto" | "xla" | "pallas" (`choose`). "pallas" is JAX's GPU kernel on a GPU
            or under `interpret`, its TPU kernel on a TPU.
        interpret: run the Pallas kernel in interpret mode (CPU).

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
    if jax.default_backend() == "tpu" and not interpret:
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
        return paged_attention(qs, k_pages, v_pages, lengths, tables,
                               pages_per_compute_block=_divisor(tables.shape[1], 8))
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention
    pt = tables.shape[1]
    splits = _divisor(pt, 16)
    out = paged_attention(qs, k_pages, v_pages, tables, lengths, k_splits=splits,
                          pages_per_compute_block=_divisor(pt // splits, 8),
                          interpret=interpret)
    # The kernel divides by (sum + eps): a slot with nothing live comes out 0 already.
    return out.astype(v_pages.dtype)


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


def cache_bytes(num_slots: int, prompt_tokens: float, new_tokens: int, rows_per_prefix: float,
                page_size: int, kv_bytes_per_token: float) -> float:
    """Bytes a paged pool needs for `num_slots` slots whose rows share a prefix of
    `prompt_tokens` in groups of `rows_per_prefix` and write up to `new_tokens`: the
    prefixes once per group (E / rows_per_prefix of them), a slot's own pages (its
    suffix, plus the prefix's partial last page it copies) per slot, and the scratch page.
    `kv_bytes_per_token`: 2 * L * Hkv * Dh * dtype bytes (every layer's key and value)."""
    prefixes = math.ceil(num_slots / max(rows_per_prefix, 1.0))
    prefix_pages = prefixes * pages_for(int(math.ceil(prompt_tokens)), page_size)
    own_pages = num_slots * pages_for(new_tokens + page_size - 1, page_size)
    return (prefix_pages + own_pages + 1) * page_size * kv_bytes_per_token
