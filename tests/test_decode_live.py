"""Decode that reads only what is live (drubric_jax/models/paged.py): the paged cache's
attention equals the dense decode step's, in XLA and in JAX's Pallas kernels (interpret
mode on CPU), and rows that share a prefix read one stored copy of it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax import models
from drubric_jax.models import decode_attention, paged

EPS32 = float(np.finfo(np.float32).eps)


def _sum_atol(terms: int, scale: float) -> float:
    """Two float32 evaluations of a softmax-weighted sum over `terms` keys of values of
    size <= `scale`, summed in other orders: each is within ~terms * eps * scale of the
    exact sum (recursive summation's bound, gamma_n ~ n eps; the probabilities carry a few
    eps of relative error each, already inside it), so they differ by at most twice that."""
    return 2.0 * terms * EPS32 * scale


def _pool(seed, hkv, pages, ps, dh):
    kk, kv = jax.random.split(jax.random.PRNGKey(seed))
    return (jax.random.normal(kk, (hkv, pages, ps, dh), jnp.float32),
            jax.random.normal(kv, (hkv, pages, ps, dh), jnp.float32))


def _dense(q, k_pages, v_pages, tables, lengths):
    """The dense decode step's attention (`decode_attention.attend_one`) over each slot's
    table pages laid out as one contiguous cache [E, Hkv, Pt * Ps, Dh]."""
    e, h, dh = q.shape
    hkv = k_pages.shape[0]
    k = jnp.transpose(k_pages[:, tables], (1, 0, 2, 3, 4)).reshape(e, hkv, -1, dh)
    v = jnp.transpose(v_pages[:, tables], (1, 0, 2, 3, 4)).reshape(e, hkv, -1, dh)
    visible = (jnp.arange(k.shape[2])[None, :] < lengths[:, None])[:, None, None]
    out = decode_attention.attend_one(q[:, None], (k,), (v,), visible, -1e30)
    return out.reshape(e, h, dh)


def _bf16_products_atol(q, k_pages, v_pages) -> float:
    """A bound on the TPU kernel's error against float32 when its two products round their
    inputs to bfloat16 (unit roundoff u = 2^-9): each score moves by <= ds = 2u sum_d
    |q_d k_d| / sqrt(Dh) (both factors rounded), so each probability by a factor within
    exp(+-2 ds) (numerator and normaliser), sum |dp| <= expm1(2 ds); the rounded values
    and probabilities add 2u |v|."""
    import math

    u = 2.0 ** -9
    dh = q.shape[-1]
    ds = 2 * u * float(jnp.abs(q).max()) * float(jnp.abs(k_pages).max()) * dh * dh ** -0.5
    return float(jnp.abs(v_pages).max()) * (math.expm1(2 * ds) + 2 * u)


@pytest.mark.parametrize("impl,interpret,kernel", [("xla", False, None),
                                                   ("pallas", True, "gpu"),
                                                   ("pallas", True, "tpu")])
def test_live_length_attention_equals_dense(impl, interpret, kernel):
    """Slots of different live lengths, at and around the page edges (0, 1, Ps - 1, Ps,
    Ps + 1, the whole table), over pages in a shuffled order: the paged attention (XLA, and
    JAX's Pallas GPU and TPU kernels in interpret mode) equals the dense step over the same
    keys, within float32 summation error (the TPU kernel: within its bfloat16 products'
    bound); a slot with nothing live gives 0; keys past a slot's length are not read."""
    hkv, h, dh, ps, pt = 2, 8, 16, 8, 4
    lengths = jnp.array([0, 1, ps - 1, ps, ps + 1, 2 * ps + 3, pt * ps], jnp.int32)
    e = lengths.shape[0]
    num_pages = 1 + e * pt
    k_pages, v_pages = _pool(0, hkv, num_pages, ps, dh)
    # Each slot's pages: a shuffle of the pool's (never the scratch page 0).
    order = np.random.default_rng(0).permutation(np.arange(1, num_pages))
    tables = jnp.asarray(order[:e * pt].reshape(e, pt), jnp.int32)
    q = jax.random.normal(jax.random.PRNGKey(1), (e, h, dh), jnp.float32)
    got = paged.attend_pages(q, k_pages, v_pages, tables, lengths, impl=impl,
                             interpret=interpret, kernel=kernel)
    want = _dense(q, k_pages, v_pages, tables, lengths)
    assert got.shape == (e, h, dh) and got.dtype == jnp.float32
    atol = (_bf16_products_atol(q, k_pages, v_pages) if kernel == "tpu"
            else _sum_atol(pt * ps, float(jnp.abs(v_pages).max())))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=atol)
    np.testing.assert_array_equal(np.asarray(got[0]), 0.0)
    # Keys past a slot's length do not count: changing them leaves its output as it is.
    junk = k_pages.at[:, tables[2, 0], ps - 1].set(1e3)   # slot 2 (Ps - 1 live) past its end
    again = paged.attend_pages(q, junk, v_pages, tables, lengths, impl=impl,
                               interpret=interpret, kernel=kernel)
    np.testing.assert_array_equal(np.asarray(again[2]), np.asarray(got[2]))


def test_a_token_is_written_at_its_slot_length():
    """`write_token` puts a slot's new key at page tables[e, len // Ps], offset len % Ps;
    a slot that does not write leaves every live page as it was (its write goes to the
    scratch page)."""
    hkv, dh, ps = 2, 4, 4
    pool = jnp.zeros((hkv, 6, ps, dh))
    tables = jnp.array([[3, 1], [2, 5]], jnp.int32)
    lengths = jnp.array([5, 2], jnp.int32)
    x = jnp.ones((2, hkv, dh)) * jnp.array([1.0, 2.0])[:, None, None]
    out = paged.write_token(pool, x, tables, lengths, jnp.array([True, False]))
    np.testing.assert_array_equal(np.asarray(out[:, 1, 1]), 1.0)   # slot 0: page 1, offset 1
    assert float(jnp.abs(out[:, 2]).sum()) == 0.0                   # slot 1 wrote nothing
    assert float(jnp.abs(out[:, 1:]).sum()) == hkv * dh


def _prefix_pages(cfg, params, prompt, ps, pages):
    """The prompt's keys and values (a dense prefill) written into `pages` of fresh per-layer
    pools of `num_pages` pages; returns (k pools, v pools, logits after the prompt)."""
    p = len(prompt)
    tokens = jnp.asarray([prompt], jnp.int32)
    hidden, cache = models.forward_hidden(params, cfg, tokens, jnp.arange(p)[None],
                                          None, models.init_cache(cfg, 1, p))
    return cache, models.logits_from_hidden(params, cfg, hidden[0, -1])


def test_group_rows_read_one_prefix_copy(tiny_model):
    """K rows of one prompt decode on a paged cache that holds the prompt's pages once:
    every row's table lists the same full prefix pages (the prompt's partial last page is
    the one page each row copies), the pool holds one prefix copy and K suffixes, and each
    row's logits at every step equal a causal forward over [prompt | its tokens] alone."""
    cfg, params = tiny_model
    ps, k_rows, steps = 8, 3, 5
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, cfg.vocab_size, size=21).tolist()     # 2 full pages + 5 tokens
    row_tokens = rng.integers(3, cfg.vocab_size, size=(k_rows, steps))
    full, tail = divmod(len(prompt), ps)
    own = paged.pages_for(tail + steps, ps)
    prefix_pages = list(range(1, full + 2))                        # the last one partial
    num_pages = 1 + len(prefix_pages) + k_rows * own
    dense, _ = _prefix_pages(cfg, params, prompt, ps, prefix_pages)
    k_pool, v_pool = paged.init_pool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                     num_pages, ps, jnp.float32)

    def stored(pool, x):  # x [L, 1, Hkv, P, Dh] -> the prompt's pages of each layer's pool
        x = jnp.pad(x[:, 0], ((0, 0), (0, 0), (0, len(prefix_pages) * ps - len(prompt)),
                              (0, 0)))
        x = x.reshape(cfg.num_layers, cfg.num_kv_heads, len(prefix_pages), ps, cfg.head_dim)
        return tuple(layer.at[:, jnp.asarray(prefix_pages)].set(x[i])
                     for i, layer in enumerate(pool))

    k_pool, v_pool = stored(k_pool, dense.k), stored(v_pool, dense.v)
    owned = [list(range(1 + len(prefix_pages) + r * own, 1 + len(prefix_pages) + (r + 1) * own))
             for r in range(k_rows)]
    tables = jnp.asarray([prefix_pages[:full] + o for o in owned], jnp.int32)
    # Each row copies the prompt's partial last page into its first own page.
    copy = lambda pool: tuple(x.at[:, tables[:, full]].set(  # noqa: E731
        jnp.broadcast_to(x[:, prefix_pages[-1]][:, None], (x.shape[0], k_rows) + x.shape[2:]))
        for x in pool)
    cache = paged.PagedKV(k=copy(k_pool), v=copy(v_pool), tables=tables,
                          lengths=jnp.full((k_rows,), len(prompt), jnp.int32), impl="xla")
    # One copy of the prefix: its full pages appear in every table, and nowhere else.
    shared = set(np.asarray(tables[:, :full]).ravel().tolist())
    assert shared == set(prefix_pages[:full])
    assert not shared & set(np.asarray(tables[:, full:]).ravel().tolist())
    got = []
    for t in range(steps):
        tok = jnp.asarray(row_tokens[:, t:t + 1], jnp.int32)
        hidden, cache = models.forward_hidden(params, cfg, tok, cache.lengths[:, None],
                                              jnp.ones((k_rows, 1), bool), cache)
        got.append(models.logits_from_hidden(params, cfg, hidden[:, 0]))
    got = jnp.stack(got, axis=1)                                     # [K, steps, V]
    np.testing.assert_array_equal(np.asarray(cache.lengths), len(prompt) + steps)
    for r in range(k_rows):
        seq = jnp.asarray([prompt + row_tokens[r].tolist()], jnp.int32)
        want, _ = models.apply(params, cfg, seq, jnp.arange(seq.shape[1])[None])
        want = want[0, len(prompt):]
        # Float32 sums of the same terms in another order (attention over <= P + steps
        # keys, then D-wide matmuls): the logits' error scales with their size.
        scale = float(jnp.abs(want).max())
        atol = _sum_atol(max(len(prompt) + steps, cfg.dim), scale)
        np.testing.assert_allclose(np.asarray(got[r]), np.asarray(want), rtol=0, atol=atol,
                                   err_msg=f"row {r}")
    # The pool: one prefix (3 pages) + K rows' own pages + scratch, where a cache of
    # contiguous slots would hold K prefixes; the engine's plan for these rows, with one
    # prompt's prefix pages, counts the same pages.
    from drubric_jax.sampling import engine

    assert num_pages == 1 + (full + 1) + k_rows * own
    plan = engine.PagePlan(slots=k_rows, shards=1, page_size=ps, max_new_tokens=steps,
                           max_prompt=len(prompt), prefix_pages=full + 1)
    assert plan.pages_per_shard == num_pages
