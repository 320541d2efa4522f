"""Tests of `drubric_jax.models.attention`: blockwise and cuDNN-encoded attention equal the
materialised one (values and gradients), padding rows, selection, memory, model wiring.

Tolerances: every compared number is a sum of products rounded at a few stages (the
probabilities, the output, in the compute dtype); the implementations sum in other orders
and round at other stages. Rounding errors of a sum of n terms grow like sqrt(n) * eps
times the size of the terms (Higham, "Accuracy and Stability of Numerical Algorithms",
probabilistic bound), so `_assert_close` allows 4 * sqrt(n) * eps * max|want| with n the
number of terms summed into one entry.
"""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax import models
from drubric_jax.models import attention, decode_attention
from drubric_jax.models import config as cfg_lib

# (B, T, S, H, Hkv, Dh, start, block_q, block_kv): T and S not multiples of the blocks.
CASES = {
    "causal_no_cache": (3, 11, 11, 4, 2, 8, 0, 4, 3),
    "prefill_into_cache": (2, 7, 13, 4, 2, 8, 0, 3, 4),   # start 0, unwritten slots after T
    "decode": (3, 1, 37, 4, 1, 8, 29, 1, 8),               # T = 1, long cache
    "suffix": (2, 5, 17, 6, 2, 8, 12, 2, 5),               # verifier: T > 1 after a cache
}


def _assert_close(got, want, dtype, n_terms):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.isfinite(got).all()
    tol = 4 * math.sqrt(n_terms) * float(jnp.finfo(dtype).eps) * np.abs(want).max()
    np.testing.assert_allclose(got, want, atol=tol, rtol=0)


def _inputs(case, dtype, seed=0):
    b, t, s, h, hkv, dh, start, _, _ = CASES[case]
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=shape), dtype)
               for shape in ((b, t, h, dh), (b, hkv, s, dh), (b, hkv, s, dh)))
    valid = rng.random((b, s)) > 0.3
    valid[0, :start + t] = np.arange(start + t) >= start + t // 2  # left padding of row 0
    valid[-1] = False                                              # a row that sees no key
    valid[:, start + t:] = False                                   # slots not written yet
    return q, k, v, jnp.asarray(valid), start, rng.normal(size=(b, t, h * dh))


def _value_and_grads(fn, q, k, v, w):
    """fn(q, k, v) and the gradient of sum(fn * w) with respect to q, k, v (one jit)."""
    def both(q, k, v, w):
        def loss(q, k, v):
            return jnp.sum(fn(q, k, v).astype(jnp.float32) * w)
        return (fn(q, k, v),) + jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    return jax.jit(both)(q, k, v, w)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_blockwise_equals_materialized_values_and_grads(case, dtype):
    q, k, v, valid, start, w = _inputs(case, dtype)
    _, t, s, h, hkv, _, _, block_q, block_kv = CASES[case]
    want = _value_and_grads(lambda q, k, v: attention.materialized(q, k, v, valid, start),
                            q, k, v, w)
    got = _value_and_grads(lambda q, k, v: attention.blockwise(
        q, k, v, valid, start, block_q, block_kv), q, k, v, w)
    # Terms per entry: output and dq sum over S keys; dk and dv over T queries x G heads.
    for name, g, wnt, n in zip(("out", "dq", "dk", "dv"), got, want,
                               (s, s, t * h // hkv, t * h // hkv)):
        assert g.dtype == wnt.dtype == dtype, name
        _assert_close(g, wnt, dtype, n)


def _textbook(q, k, v, valid, start):
    """softmax(q k^T / sqrt(Dh)) v per query head, keys and values repeated per group, the
    probabilities normalised before the value product; rows that see no key output 0."""
    b, t, h, dh = q.shape
    hkv, s = k.shape[1], k.shape[2]
    k, v = (jnp.repeat(x, h // hkv, axis=1).astype(jnp.float32) for x in (k, v))
    vis = (jnp.arange(s)[None, :] <= start + jnp.arange(t)[:, None])[None] & valid[:, None]
    scores = jnp.einsum("bthd,bhsd->bhts", q.astype(jnp.float32), k) / math.sqrt(dh)
    probs = jax.nn.softmax(jnp.where(vis[:, None], scores, -1e30), axis=-1)
    probs = probs * vis[:, None]
    return jnp.einsum("bhts,bhsd->bthd", probs, v).reshape(b, t, h * dh)


@pytest.mark.parametrize("case", sorted(CASES))
def test_materialized_equals_textbook_attention_values_and_grads(case):
    """`materialized` normalises after the value product (and reshapes the GQA groups into
    matmul rows); it must equal the textbook form. Row 0's first real query sees exactly
    one key: its output is that key's value and its scores get no gradient (a `maximum`
    on the normaliser would pass half of one)."""
    q, k, v, valid, start, w = _inputs(case, jnp.float32)
    _, t, s, h, hkv, _, _, _, _ = CASES[case]
    want = _value_and_grads(lambda q, k, v: _textbook(q, k, v, valid, start), q, k, v, w)
    got = _value_and_grads(lambda q, k, v: attention.materialized(q, k, v, valid, start),
                           q, k, v, w)
    for name, g, wnt, n in zip(("out", "dq", "dk", "dv"), got, want,
                               (s, s, t * h // hkv, t * h // hkv)):
        _assert_close(g, wnt, jnp.float32, n)


@pytest.mark.parametrize("impl", ["materialized", "blockwise"])
def test_query_that_sees_no_key_outputs_zero_and_passes_no_gradient(impl):
    """Row -1 of the inputs has no valid slot: finite zeros, no NaN, no gradient to q
    (the old -1e30 fill gave it a uniform softmax over all slots instead)."""
    q, k, v, valid, start, w = _inputs("causal_no_cache", jnp.float32)
    fn = {"materialized": lambda q, k, v: attention.materialized(q, k, v, valid, start),
          "blockwise": lambda q, k, v: attention.blockwise(q, k, v, valid, start, 4, 3)}[impl]
    out, dq, dk, dv = _value_and_grads(fn, q, k, v, w)
    assert np.array_equal(np.asarray(out[-1]), np.zeros_like(out[-1]))
    assert np.array_equal(np.asarray(dq[-1]), np.zeros_like(dq[-1]))
    for g in (dk, dv):
        assert np.isfinite(np.asarray(g)).all()
    # Left padding of row 0: its padding queries see no key either.
    assert np.array_equal(np.asarray(out[0, :5]), np.zeros_like(out[0, :5]))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cudnn_key_padding_encoding_equals_materialized(dtype):
    """The cuDNN path's padding-as-a-head-dimension encoding, run by the XLA implementation
    of `jax.nn.dot_product_attention` (cuDNN itself needs a GPU)."""
    q, k, v, valid, start, w = _inputs("causal_no_cache", dtype)
    _, t, _, h, hkv, _, _, _, _ = CASES["causal_no_cache"]
    want = _value_and_grads(lambda q, k, v: attention.materialized(q, k, v, valid, 0),
                            q, k, v, w)
    got = _value_and_grads(lambda q, k, v: attention.cudnn(q, k, v, valid, "xla"), q, k, v, w)
    for g, wnt, n in zip(got, want, (t, t, t * h // hkv, t * h // hkv)):
        _assert_close(g, wnt, dtype, n)


def test_cudnn_errors_are_clear():
    q, k, v, valid, _, _ = _inputs("causal_no_cache", jnp.bfloat16)
    with pytest.raises(ValueError, match="needs dtype bfloat16 or float16, got float32"):
        attention.cudnn(*(x.astype(jnp.float32) for x in (q, k, v)), valid)
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="needs a GPU backend, got 'cpu'"):
            attention.cudnn(q, k, v, valid)
    with pytest.raises(ValueError, match="without a cache"):
        attention.cudnn(q, k[:, :, :5], v[:, :, :5], valid[:, :5], "xla")


def test_choose():
    limit = attention.AUTO_BLOCKWISE_MIN_SCORES  # 2^20 scores per row
    assert attention.choose("auto", 1024, 1024, cached=False) == "materialized"
    assert attention.choose("auto", 1024, 1025, cached=True) == "blockwise"
    assert attention.choose("auto", 1, limit, cached=True) == "materialized"
    assert attention.choose("auto", 8192, 8192, cached=False) == "blockwise"
    # On a GPU, a call without a cache in 16 bits goes to cuDNN's fused kernel; a cached
    # call, float32 or a head dim cuDNN does not take keeps the portable choice.
    gpu = dict(backend="gpu", head_dim=128)
    assert attention.choose("auto", 8192, 8192, False, jnp.bfloat16, **gpu) == "cudnn"
    assert attention.choose("auto", 8192, 8192, True, jnp.bfloat16, **gpu) == "blockwise"
    assert attention.choose("auto", 8192, 8192, False, jnp.float32, **gpu) == "blockwise"
    assert attention.choose("auto", 64, 64, False, jnp.bfloat16, backend="gpu",
                            head_dim=256) == "materialized"
    assert attention.choose("auto", 8192, 8192, False, jnp.bfloat16, backend="cpu",
                            head_dim=128) == "blockwise"
    assert attention.choose("materialized", 8192, 8192, cached=False) == "materialized"
    assert attention.choose("blockwise", 1, 8, cached=True) == "blockwise"
    assert attention.choose("cudnn", 8, 8, cached=False) == "cudnn"
    # A cached call: cuDNN's causal mask cannot start at a traced cache index.
    assert attention.choose("cudnn", 8, 8, cached=True) == "materialized"
    assert attention.choose("cudnn", 8192, 8192, cached=True) == "blockwise"


def test_config_validates_attention():
    with pytest.raises(ValueError, match="ModelConfig.attention must be one of"):
        cfg_lib.TINY.replace(attention="flash")
    with pytest.raises(ValueError, match="ModelConfig.attention_block_kv must be positive"):
        cfg_lib.TINY.replace(attention_block_kv=0)


def test_blockwise_temporaries_are_linear_not_quadratic():
    """Compiled (never run) temp memory at T = S = 2048, 4 heads: the materialised
    float32 scores alone are 64 MiB; blockwise (64-slot blocks) keeps O(T) state."""
    t, block = 2048, 64
    q = jax.ShapeDtypeStruct((1, t, 4, 16), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, 2, t, 16), jnp.float32)
    valid = jax.ShapeDtypeStruct((1, t), jnp.bool_)

    def temp_bytes(attn, grad):
        fn = attn
        if grad:
            fn = jax.grad(lambda q, k, v, m: jnp.sum(attn(q, k, v, m)), argnums=(0, 1, 2))
        compiled = jax.jit(fn).lower(q, kv, kv, valid).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    blockwise = functools.partial(attention.blockwise, block_q=block, block_kv=block)
    scores_bytes = 4 * t * t * 4
    for grad in (False, True):
        assert temp_bytes(attention.materialized, grad) >= scores_bytes
        assert temp_bytes(blockwise, grad) < scores_bytes / 16, grad


# --------------------------------------------------------------------------- the model


def _model_logits(cfg, params, tokens, mask):
    positions = models.positions_from_mask(mask)
    hidden, _ = models.forward_hidden(params, cfg, tokens, positions, mask)
    return models.logits_from_hidden(params, cfg, hidden)


def test_model_blockwise_equals_materialized_forward_decode_and_grads():
    base = cfg_lib.TINY_QWEN3.replace(vocab_size=256)
    cfgs = {a: base.replace(attention=a, attention_block_q=4, attention_block_kv=3)
            for a in ("materialized", "blockwise")}
    params = models.init_params(base, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    b, t = 3, 10
    tokens = jnp.asarray(rng.integers(3, base.vocab_size, (b, t)), jnp.int32)
    mask = jnp.asarray(np.arange(t)[None, :] >= np.array([0, 3, t])[:, None])  # row 2: padding
    w = jnp.asarray(rng.normal(size=(b, t, base.dim)), jnp.float32)

    positions = models.positions_from_mask(mask)

    @functools.partial(jax.jit, static_argnums=0)
    def full_and_grads(cfg):
        def loss(p):
            hidden, _ = models.forward_hidden(p, cfg, tokens, positions, mask, remat=True)
            return jnp.sum(hidden.astype(jnp.float32) * w)
        return _model_logits(cfg, params, tokens, mask), jax.grad(loss)(params)

    @jax.jit
    def cached_blockwise():
        """Prefill 6 tokens, decode 1, then a 3-token suffix, into a 12-slot cache."""
        cfg, cache, pieces = cfgs["blockwise"], models.init_cache(base, b, 12), []
        for lo, hi in ((0, 6), (6, 7), (7, 10)):
            hidden, cache = models.forward_hidden(params, cfg, tokens[:, lo:hi],
                                                  positions[:, lo:hi], mask[:, lo:hi], cache)
            pieces.append(models.logits_from_hidden(params, cfg, hidden))
        return jnp.concatenate(pieces, axis=1)

    (full_m, grads_m), (full_b, grads_b) = map(full_and_grads, cfgs.values())
    m = np.asarray(mask)
    # Whole-model numbers: many layers of sums; the same eps-scaled bound with n = D * T.
    n = base.dim * t
    _assert_close(np.asarray(full_b)[m], np.asarray(full_m)[m], jnp.float32, n)
    _assert_close(np.asarray(cached_blockwise())[m], np.asarray(full_m)[m], jnp.float32, n)
    for gb, gm in zip(jax.tree.leaves(grads_b), jax.tree.leaves(grads_m)):
        _assert_close(gb, gm, jnp.float32, n)


def test_model_config_selects_the_implementation():
    """`cfg.attention` reaches the layers: blockwise traces its custom VJP, materialised not."""
    cfg = cfg_lib.TINY
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    tokens = jnp.ones((1, 8), jnp.int32)
    mask = jnp.ones((1, 8), bool)
    for impl, want in (("blockwise", True), ("materialized", False), ("auto", False)):
        jaxpr = jax.make_jaxpr(functools.partial(
            _model_logits, cfg.replace(attention=impl)))(params, tokens, mask)
        assert ("custom_vjp_call" in str(jaxpr)) == want, impl


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_decode_values_as_matmul_equal_the_cpu_reduction(dtype):
    """The accelerator path of one-query attention (a matmul) and the CPU path (a fused
    multiply-and-reduce) sum the same S float32 products in other orders: they agree to
    S * eps(float32) * sum|p v| (each partial sum's rounding), the products being exact in
    float32 for 16-bit inputs and for float32 ones up to one rounding each."""
    b, hkv, g, s, dh = 2, 2, 3, 96, 16
    ks = jax.random.split(jax.random.PRNGKey(3), 2)
    probs = jax.nn.softmax(jax.random.normal(ks[0], (b, hkv, g, s)), axis=-1).astype(dtype)
    v = jax.random.normal(ks[1], (b, hkv, s, dh), dtype)
    mm = decode_attention.values(probs, v, as_matmul=True)
    red = decode_attention.values(probs, v, as_matmul=False)
    assert mm.dtype == red.dtype == jnp.float32 and mm.shape == (b, hkv, g, dh)
    bound = 2 * s * np.finfo(np.float32).eps * jnp.einsum(
        "bkgs,bksd->bkgd", jnp.abs(probs.astype(jnp.float32)), jnp.abs(v.astype(jnp.float32)))
    assert bool(jnp.all(jnp.abs(mm - red) <= bound))


@pytest.mark.parametrize("impl", ["materialized", "blockwise"])
def test_shared_prefix_attention_equals_each_row_alone(impl):
    """`attend_shared_prefix` over packed groups [prefix | R suffixes] (METHOD 15) against
    the causal attention of each row [prefix | suffix r] alone (`materialized`): the
    prefix's and every suffix's outputs, and the gradients by q, k, v, the prefix's summed
    over its R rows. Blockwise with blocks of 3 and 4 exercises the log-sum-exp join's
    custom backward (the lse cotangent). Left-padded prefixes, right-padded suffixes, a
    suffix of one real token."""
    gn, p, r, n, h, hkv, dh = 2, 7, 3, 5, 4, 2, 8
    cfg = cfg_lib.TINY.replace(attention=impl, attention_block_q=3, attention_block_kv=4)
    rng = np.random.default_rng(0)
    length = p + r * n
    q = jnp.asarray(rng.normal(size=(gn, length, h, dh)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(gn, length, hkv, dh)), jnp.float32) for _ in range(2))
    pmask = np.ones((gn, p), bool)
    pmask[0, :3] = False
    smask = np.arange(n)[None, None] < rng.integers(1, n + 1, (gn, r))[..., None]
    smask[1, 2] = np.arange(n) < 1
    w = rng.normal(size=(gn, length, h * dh))

    def rows(x):  # packed [Gn, P + R N, ...] -> rows [Gn R, P + N, ...]
        pre = jnp.repeat(x[:, :p], r, axis=0)
        suf = x[:, p:].reshape(gn * r, n, *x.shape[2:])
        return jnp.concatenate([pre, suf], axis=1)

    row_valid = jnp.asarray(np.concatenate([np.repeat(pmask, r, 0),
                                            smask.reshape(gn * r, n)], 1))

    def per_row(q, k, v):
        out = attention.materialized(rows(q), rows(k).transpose(0, 2, 1, 3),
                                     rows(v).transpose(0, 2, 1, 3), row_valid, 0)
        out = out.reshape(gn, r, p + n, h * dh)
        # The prefix's outputs are the same in each of its rows: row 0's stand for them.
        return jnp.concatenate([out[:, 0, :p], out[:, :, p:].reshape(gn, r * n, -1)], 1)

    def grouped(q, k, v):
        return attention.attend_shared_prefix(cfg, q, k, v, jnp.asarray(pmask),
                                              jnp.asarray(smask))

    want = _value_and_grads(per_row, q, k, v, w)
    got = _value_and_grads(grouped, q, k, v, w)
    real = np.concatenate([pmask, smask.reshape(gn, r * n)], 1)[..., None]
    # Terms per entry: at most P + N keys for an output or dq; the R rows' queries for the
    # prefix's dk, dv.
    for name, g, wnt, terms in zip(("out", "dq", "dk", "dv"), got, want,
                                   (p + n, p + n, r * length * h, r * length * h)):
        g, wnt = np.asarray(g), np.asarray(wnt)
        if name == "out":  # outputs at padding positions are no one's: compare real tokens
            g, wnt = g * real, wnt * real
        _assert_close(g, wnt, jnp.float32, terms)
