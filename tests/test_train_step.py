"""Tests of the GRPO train step, its log-probs, micro-batching and sharding (METHOD 4, 11).

All on the `tiny` preset (random weights). One sampled batch (B = 8 rows, prompt bucket
P = 16, N = 8 new tokens at temperature 0.7) is shared by the module; the jitted steps are
built once per config. Sharded tests run on the 8 fake CPU devices from conftest.py.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from drubric_jax import models, sampling, parallel
from drubric_jax.rl import grpo
from drubric_jax.rl import logprobs
from drubric_jax.rl import train_config
from drubric_jax.rl import train_step as ts
from tolerances import close, logprob_atol

TEMPERATURE = 0.7
N_NEW = 8
# Every 5th vocabulary id stops a row, so completions have varied lengths (some truncated).
STOP_IDS = list(range(3, 49152, 5))
CFG = train_config.TrainConfig(learning_rate=1e-4, warmup_steps=0, max_grad_norm=1.0, clip_eps=0.2,
                     beta=0.01, micro_batch_size=8, temperature=TEMPERATURE, logits_chunk=8)
CFG_MICRO = dataclasses.replace(CFG, micro_batch_size=2)


def copy_tree(tree):
    return jax.tree.map(jnp.copy, tree)


def jit_step(model_cfg, train_cfg, optimizer):
    """Single-device jitted `train_step`, donating the state."""
    return jax.jit(functools.partial(ts.train_step, model_cfg=model_cfg, train_cfg=train_cfg,
                                     optimizer=optimizer), donate_argnums=(0,))


def jit_grads(model_cfg, train_cfg):
    return jax.jit(functools.partial(ts.accumulate_gradients, model_cfg=model_cfg,
                                     train_cfg=train_cfg))


# Two float32 evaluations of the same gradient that sum in another order (micro-batches,
# sharding, another CPU's XLA) differ by a few ulps of the accumulated terms: measured here
# up to 5e-7 of each leaf's largest entry. 1e-5 of that scale leaves 20x headroom and is
# still far below any real error (a wrong rescaling is off by tens of percent).
GRAD_RTOL = 1e-5


def grad_tolerance(g) -> float:
    return GRAD_RTOL * float(np.abs(np.asarray(g)).max())


def assert_grads_close(ga, gb):
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ga), jax.tree.leaves(gb)):
        d = float(np.abs(np.asarray(a) - np.asarray(b)).max())
        assert d <= grad_tolerance(a), (jax.tree_util.keystr(path), d, grad_tolerance(a))


def assert_adam_first_steps_close(pa, pb, grads, cfg, grad_norm, extra=0.0):
    """Params after one AdamW step (from the same fresh state, weight decay 0) whose
    gradients agree within `grad_tolerance`.

    Adam's first update is u(g) = lr * g / (|g| + eps) (the bias-corrected moments are g and
    g^2), applied to the clipped gradient c g, c = min(1, max_grad_norm / |g|). Its slope
    lr * eps / (|g| + eps)^2 reaches lr / eps at g = 0, so float noise dg on a near-zero
    gradient entry legitimately moves that entry by up to lr (this is why comparing
    params at a fixed atol fails on some CPUs). Per entry, by the mean-value theorem,
    |u(a) - u(b)| <= lr * dg * eps / (max(|g| - dg, 0) + eps)^2, and never more than 2 lr;
    plus the float32 rounding of u itself (a few ulps of lr; 8 allowed) and of p - u
    (2 ulps of the parameter), plus `extra` (e.g. the rounding of a bfloat16 first moment).
    """
    lr, eps = cfg.learning_rate, cfg.eps
    c = min(1.0, cfg.max_grad_norm / float(grad_norm))
    for (path, a), b, g in zip(jax.tree_util.tree_leaves_with_path(pa), jax.tree.leaves(pb),
                               jax.tree.leaves(grads)):
        a, b, g = np.asarray(a), np.asarray(b), np.asarray(g)
        dg = c * grad_tolerance(g)
        m = np.maximum(c * np.abs(g) - dg, 0.0)
        rounding = 8 * np.spacing(np.float32(lr)) + 2 * np.spacing(np.abs(a).astype(np.float32))
        bound = np.minimum(lr * dg * eps / (m + eps) ** 2, 2 * lr) + rounding + extra
        excess = np.abs(a - b) - bound
        assert excess.max() <= 0, (jax.tree_util.keystr(path), float(excess.max()))


@pytest.fixture(scope="module")
def setup(tiny_model):
    """(cfg, params, batch, optimizer, steps, sample, ref): steps[train_cfg] is the jitted
    step; ref is a reference model near params (so the KL term is not 0)."""
    cfg, params = tiny_model
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 49000, size=n).tolist() for n in (3, 5, 7, 9, 11, 12, 4, 6)]
    sample = sampling.generate(params, cfg, prompts, key=jax.random.PRNGKey(1),
                               max_new_tokens=N_NEW, method=sampling.Temperature(TEMPERATURE),
                               stop_ids=STOP_IDS)
    adv = np.array([1.5, -1.0, 0.5, -0.5, 1.0, -1.5, 0.25, -0.25], np.float32)
    batch = ts.batch_from_rollout(sample, adv, np.ones(len(adv), bool))
    noise = models.init_params(cfg, jax.random.PRNGKey(7))
    ref = jax.tree.map(lambda p, n: p + 0.05 * n, params, noise)
    optimizer = train_config.make_optimizer(CFG)
    steps = {c: jit_step(cfg, c, optimizer) for c in (CFG, CFG_MICRO)}
    return cfg, params, batch, optimizer, steps, sample, ref


@pytest.fixture(scope="module")
def one_step(setup):
    """(state after one step of CFG, metrics) from a fresh state."""
    cfg, params, batch, optimizer, steps, _, ref = setup
    state = ts.init_train_state(copy_tree(params), optimizer)
    return steps[CFG](state, batch, ref)


# --------------------------------------------------------------------------- log-probs


@pytest.mark.slow
def test_sequence_logprobs_match_sampler(setup):
    cfg, params, batch, _, _, sample, _ = setup
    assert sample.lengths.min() < N_NEW and sample.truncated.any()  # varied lengths
    fn = jax.jit(logprobs.sequence_logprobs, static_argnames=("cfg", "temperature", "chunk",
                                                        "return_entropy", "start"))
    logp, ent = fn(params, cfg, batch.tokens, batch.token_mask, TEMPERATURE, chunk=8,
                   return_entropy=True)
    assert logp.shape == ent.shape == batch.tokens.shape
    m = batch.loss_mask
    # The sampler's cached decode and this full forward compute the logits on different
    # paths; 1e-4 is ~100 ulps of these |log p| <= 16 (a wrong temperature is off by > 1e-3).
    np.testing.assert_allclose(np.where(m, logp, 0.0), batch.old_logprobs, rtol=0, atol=1e-4)
    assert np.all(np.asarray(logp)[:, 0] == 0) and np.all(np.asarray(logp)[~batch.token_mask] == 0)
    assert np.all(np.asarray(ent)[m] > 0) and np.all(np.isfinite(ent))
    # Unchunked gives the same numbers; temperature matters.
    whole = fn(params, cfg, batch.tokens, batch.token_mask, TEMPERATURE, chunk=4096)
    tol = logprob_atol(logp, cfg.vocab_size)  # same logits, other chunks: log-softmax rounding
    np.testing.assert_allclose(whole, logp, rtol=0, atol=tol)
    # Scoring only the completion (start = prompt bucket) gives the same completion values.
    p = batch.prompt_len
    assert p == 16
    completion_only = np.asarray(fn(params, cfg, batch.tokens, batch.token_mask, TEMPERATURE,
                                    chunk=8, start=p))
    assert np.all(completion_only[:, :p] == 0)
    np.testing.assert_allclose(completion_only[:, p:], np.asarray(logp)[:, p:], rtol=0, atol=tol)
    at_one = fn(params, cfg, batch.tokens, batch.token_mask, 1.0, chunk=8)
    assert np.abs(np.asarray(at_one - logp)[m]).max() > 1e-3


# --------------------------------------------------------------------------- train step


def test_train_step_pinned_first_step(setup, one_step):
    cfg, params, batch, _, _, _, ref = setup
    state, metrics = one_step
    adv = batch.advantages
    # On-policy first step: ratio 1, so pg_loss = -(1/R) sum_i A_i (Eq. 23, every row has
    # tokens); KL: the per-response mean of k3(logp, ref_logp), averaged over responses.
    lp = [np.asarray(logprobs.sequence_logprobs(p, cfg, batch.tokens, batch.token_mask,
                                                TEMPERATURE, chunk=8)) for p in (params, ref)]
    d = np.where(batch.loss_mask, lp[1] - lp[0], 0.0)
    k3 = np.where(batch.loss_mask, np.exp(d) - d - 1, 0.0)
    kl = np.mean(k3.sum(-1) / batch.loss_mask.sum(-1))
    assert kl > 1e-4  # the reference differs from the policy
    close(metrics["pg_loss"], -adv.mean(), atol=1e-5)
    np.testing.assert_allclose(metrics["kl"], kl, rtol=1e-4)
    close(metrics["loss"], -adv.mean() + CFG.beta * kl, atol=1e-5)
    close(metrics["ratio_mean"], 1.0, atol=1e-5)
    assert float(metrics["clip_fraction"]) == 0.0
    lengths = batch.loss_mask.sum(-1)
    close(metrics["response_length_mean"], lengths.mean())
    close(metrics["truncated_fraction"], batch.truncated.mean())
    close(metrics["num_tokens"], lengths.sum())
    close(metrics["advantage_mean"], adv.mean())
    close(metrics["advantage_max"], 1.5)
    close(metrics["advantage_min"], -1.5)
    close(metrics["learning_rate"], CFG.learning_rate, atol=1e-9)
    assert 0 < float(metrics["entropy"]) < np.log(49152) + 1e-3
    assert float(metrics["grad_norm"]) > 0 and float(metrics["update_norm"]) > 0
    assert int(state.step) == 1
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert set(metrics) >= {"loss", "pg_loss", "kl", "clip_fraction", "grad_norm",
                            "update_norm", "entropy", "learning_rate"}


def test_repeated_steps_raise_positive_advantage_logprobs(setup, one_step):
    cfg, params, batch, optimizer, steps, _, ref = setup
    seq_logp = jax.jit(lambda p: jnp.sum(jnp.where(
        batch.loss_mask, logprobs.sequence_logprobs(p, cfg, batch.tokens, batch.token_mask,
                                              TEMPERATURE, chunk=8), 0.0), axis=-1))
    before = np.asarray(seq_logp(params))
    state, metrics = one_step
    state = copy_tree(state)
    losses = [float(metrics["loss"])]
    for _ in range(3):
        state, metrics = steps[CFG](state, batch, ref)
        losses.append(float(metrics["loss"]))
    after = np.asarray(seq_logp(state.params))
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    pos, neg = batch.advantages > 0, batch.advantages < 0
    assert np.all(after[pos] > before[pos]), (before, after)
    assert np.all(after[neg] < before[neg]), (before, after)
    assert float(metrics["clip_fraction"]) >= 0 and int(state.step) == 4
    assert steps[CFG]._cache_size() == 1  # no retrace across steps (STYLE 15)


@pytest.mark.slow
def test_micro_batches_equal_single_batch(setup, one_step):
    """4 micro-batches of 2 rows give the gradient of the whole batch (before the
    optimizer, tightly), the same metrics, and params that agree within what one AdamW step
    makes of that float noise (`assert_adam_first_steps_close`)."""
    cfg, params, batch, optimizer, steps, _, ref = setup
    g_full, s_full = jit_grads(cfg, CFG)(params, batch, ref)
    g_micro, s_micro = jit_grads(cfg, CFG_MICRO)(params, batch, ref)
    assert_grads_close(g_full, g_micro)
    for k in s_full:
        close(s_micro[k], s_full[k], atol=1e-5)
    state_full, m_full = one_step
    state = ts.init_train_state(copy_tree(params), optimizer)
    state_micro, m_micro = steps[CFG_MICRO](state, batch, ref)
    for k in ("loss", "pg_loss", "kl", "clip_fraction", "entropy", "grad_norm", "num_tokens"):
        close(m_micro[k], m_full[k], atol=1e-5)
    assert_adam_first_steps_close(state_micro.params, state_full.params, g_full, CFG,
                                  m_full["grad_norm"])


def test_no_remat_gives_the_remat_gradients(setup):
    """train.remat=False keeps each layer's activations instead of recomputing them: the
    same loss and gradients (recomputation repeats the same float ops; the tolerance is the
    float32 summation one of `assert_grads_close`, as fusion may differ)."""
    cfg, params, batch, _, _, _, ref = setup
    g_remat, s_remat = jit_grads(cfg, CFG)(params, batch, ref)
    g_keep, s_keep = jit_grads(cfg, dataclasses.replace(CFG, remat=False))(params, batch, ref)
    assert_grads_close(g_remat, g_keep)
    for k in s_remat:
        close(s_keep[k], s_remat[k], atol=1e-6)
    with pytest.raises(ValueError, match="remat"):
        train_config.TrainConfig(remat="no")


@pytest.mark.slow
def test_bfloat16_first_moment_matches_float32_step(setup, one_step):
    """mu_dtype="bfloat16" (the CPU default config's memory saving): mu is stored in
    bfloat16, nu in float32, and the first update equals the float32 one to bf16 rounding
    (after one step mu = (1 - b1) g, so only mu's 8-bit mantissa differs)."""
    cfg, params, batch, _, _, _, ref = setup
    state_f32, _ = one_step
    cfg_bf16 = dataclasses.replace(CFG, mu_dtype="bfloat16")
    opt = train_config.make_optimizer(cfg_bf16)
    state = ts.init_train_state(copy_tree(params), opt)
    dtypes = {str(x.dtype) for x in jax.tree.leaves(state.opt_state) if x.ndim > 0}
    assert dtypes == {"bfloat16", "float32"}, dtypes
    new, metrics = jit_step(cfg, cfg_bf16, opt)(state, batch, ref)
    assert np.isfinite(float(metrics["loss"]))
    # bfloat16 keeps 8 mantissa bits: mu is off by at most 2^-8 of itself, so the update
    # lr * mu / sqrt(nu) by at most lr / 256; 1e-2 lr covers it.
    grads, _ = jit_grads(cfg, CFG)(params, batch, ref)
    assert_adam_first_steps_close(new.params, state_f32.params, grads, CFG,
                                  metrics["grad_norm"], extra=CFG.learning_rate * 1e-2)
    moved = sum(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(params)))
    assert moved > 0
    with pytest.raises(ValueError, match="mu_dtype"):
        train_config.TrainConfig(mu_dtype="float16")


@pytest.mark.parametrize("aggregation", grpo.AGGREGATIONS)
def test_micro_batch_rescaling_sums_to_full_batch_loss(aggregation):
    """The rescaling `train_step` applies: sum over micro-batches of
    aggregate(micro) * divisor(micro) / divisor(batch) == aggregate(batch), rows strided."""
    rng = np.random.default_rng(1)
    values = rng.normal(size=(8, 6)).astype(np.float32)
    mask = rng.random((8, 6)) < 0.5
    mask[3] = False  # an empty row must not count as a response
    full = grpo.aggregate_tokens(jnp.where(mask, values, 0.0), mask, aggregation)
    denom = grpo.loss_denominator(jnp.asarray(mask), aggregation)
    total = 0.0
    for i in range(4):  # micro-batch i = rows i, i + 4
        v, m = values[i::4], mask[i::4]
        part = grpo.aggregate_tokens(jnp.where(m, v, 0.0), m, aggregation)
        total += part * grpo.loss_denominator(jnp.asarray(m), aggregation) / denom
    close(total, full, atol=1e-6)


def test_garbage_at_masked_positions_gives_finite_identical_step(setup, one_step):
    _, params, batch, optimizer, steps, _, ref = setup
    outside = ~batch.loss_mask
    bad = batch.replace(
        old_logprobs=np.where(outside, -1e9, batch.old_logprobs).astype(np.float32))
    bad = bad.replace(old_logprobs=np.where(outside & (np.arange(24) % 2 == 0), -np.inf,
                                            bad.old_logprobs).astype(np.float32))
    bad = bad.replace(old_logprobs=np.where(outside & (np.arange(24) % 3 == 0), np.nan,
                                            bad.old_logprobs).astype(np.float32))
    state = ts.init_train_state(copy_tree(params), optimizer)
    new_state, metrics = steps[CFG](state, bad, ref)
    ts.check_finite(metrics, step=1)
    # The same executable on inputs that differ only where they are masked: bit for bit.
    state_ref, m_ref = one_step
    assert float(metrics["loss"]) == float(m_ref["loss"])
    assert float(metrics["grad_norm"]) == float(m_ref["grad_norm"])
    jax.tree.map(np.testing.assert_array_equal, new_state.params, state_ref.params)


def test_batch_not_multiple_of_micro_batch_raises(setup):
    cfg, params, batch, optimizer, _, _, ref = setup
    c = dataclasses.replace(CFG, micro_batch_size=3)
    state = ts.init_train_state(params, optimizer)
    with pytest.raises(ValueError, match="micro_batch_size=3"):
        ts.train_step(state, batch, ref, model_cfg=cfg, train_cfg=c, optimizer=optimizer)
    with pytest.raises(ValueError, match="reference params"):
        ts.train_step(state, batch, None, model_cfg=cfg, train_cfg=CFG, optimizer=optimizer)


def test_donation_consumes_state(setup):
    _, params, batch, optimizer, steps, _, ref = setup
    state = ts.init_train_state(copy_tree(params), optimizer)
    new_state, _ = steps[CFG](state, batch, ref)
    assert state.params["embed"].is_deleted()
    assert not new_state.params["embed"].is_deleted()


# --------------------------------------------------------------------------- sharding


@pytest.mark.slow
def test_sharded_step_matches_unsharded(setup, one_step):
    cfg, params, batch, optimizer, _, _, ref = setup
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    c = dataclasses.replace(CFG, micro_batch_size=4)  # 2 micro-batches, 4 rows = data*fsdp
    opt, step = ts.make_sharded_train_step(cfg, c, mesh)
    state = ts.shard_train_state(ts.init_train_state(copy_tree(params), opt), mesh)
    ref_sharded = jax.device_put(ref, models.param_shardings(ref, mesh))
    wq = state.params["layers"]["wq"]
    assert wq.sharding.spec == P(None, "fsdp", "tensor")
    assert state.opt_state[1][0].mu["embed"].sharding.spec == P("tensor", "fsdp")
    # The gradient computed under the mesh equals the 1-device one, before the optimizer.
    g_ref, _ = jit_grads(cfg, CFG)(params, batch, ref)
    g_sharded, _ = jit_grads(cfg, c)(state.params, jax.device_put(
        batch, parallel.batch_sharding(mesh)), ref_sharded)
    assert_grads_close(g_ref, g_sharded)
    new_state, metrics = step(state, batch, ref_sharded)
    assert wq.is_deleted()  # donated
    assert new_state.params["layers"]["wq"].sharding.spec == P(None, "fsdp", "tensor")
    assert ts.make_sharded_train_step(cfg, c, mesh)[1] is step  # memoised
    state_ref, m_ref = one_step
    for k in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
        close(metrics[k], m_ref[k], atol=1e-5)
    assert_adam_first_steps_close(new_state.params, state_ref.params, g_ref, CFG,
                                  m_ref["grad_norm"])


@pytest.mark.parametrize("micro", [8, 2])
def test_zero_advantages_at_the_reference_give_exactly_no_update(setup, micro):
    """Policy = reference and every advantage 0 (all groups flat): the pg term is 0 and the
    KL gradient is 0, so AdamW must leave every parameter exactly as it was; float noise
    between the reference's and the trainee's log-probs would become lr-sized steps."""
    cfg, params, batch, _, _, _, _ = setup
    flat = batch.replace(advantages=np.zeros_like(batch.advantages))
    c = dataclasses.replace(CFG, micro_batch_size=micro)
    mesh = parallel.make_mesh(data=2, fsdp=1, tensor=1, devices=jax.devices()[:2])
    opt, step = ts.make_sharded_train_step(cfg, c, mesh)
    state = ts.shard_train_state(ts.init_train_state(copy_tree(params), opt), mesh)
    new_state, metrics = step(state, flat, params)
    assert float(metrics["grad_norm"]) == 0.0 and float(metrics["update_norm"]) == 0.0
    assert float(metrics["kl"]) == 0.0
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(new_state.params),
                 jax.device_get(params))


@pytest.mark.slow  # 10-21 s on 2 cores (make test-fast leaves it out)
def test_flat_group_rows_leave_the_update(setup, one_step):
    """Rows of flat groups (the flag of Eq. 21's groups, METHOD 11) do not enter the update
    (Eq. 23).

    A batch whose groups are all flat makes no update: from a state with non-zero AdamW
    moments (after one step, where AdamW on zero gradients would still move every param
    through its momentum and weight decay), params, opt_state and step come back bit for
    bit. A mixed batch gives the gradient and the update of the same batch with the flat
    groups removed, for every aggregation (dr_grpo divides by the live rows x N) and
    with beta > 0 (a flat row's KL term must not pull toward pi_ref either); the tolerance
    is the float32 summation one of `assert_grads_close` / `assert_adam_first_steps_close`
    (the two batches sum their rows in another order)."""
    cfg, params, batch, optimizer, steps, _, ref = setup
    # Groups of 2 rows; groups 1 and 3 (rows 2, 3, 6, 7) are flat: advantage 0, flag down.
    flat_rows = np.array([0, 0, 1, 1, 0, 0, 1, 1], bool)
    mixed = batch.replace(advantages=np.where(flat_rows, 0.0, batch.advantages)
                          .astype(np.float32), live=~flat_rows)
    keep = np.flatnonzero(~flat_rows)
    reduced = jax.tree.map(lambda x: np.asarray(x)[keep], batch)

    # All flat, from a state with momentum: nothing changes, not even the step counter.
    state, _ = one_step
    before = jax.device_get(state)
    all_flat = batch.replace(advantages=np.zeros_like(batch.advantages),
                             live=np.zeros_like(batch.live))
    new_state, metrics = steps[CFG](copy_tree(state), all_flat, ref)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(new_state), before)
    assert float(metrics["active_rows"]) == 0 and float(metrics["update_skipped"]) == 1
    assert float(metrics["update_norm"]) == 0 and float(metrics["grad_norm"]) == 0

    # Mixed = reduced: gradients and sums, for every aggregation (whole batch in one
    # micro-batch, and the mixed batch in 4 micro-batches of 2).
    for agg in grpo.AGGREGATIONS:
        c_reduced = dataclasses.replace(CFG, aggregation=agg, micro_batch_size=4)
        g_reduced, s_reduced = jit_grads(cfg, c_reduced)(params, reduced, ref)
        for micro in (8, 2):
            c_mixed = dataclasses.replace(CFG, aggregation=agg, micro_batch_size=micro)
            g_mixed, s_mixed = jit_grads(cfg, c_mixed)(params, mixed, ref)
            assert_grads_close(g_reduced, g_mixed)
            for k in s_reduced:
                close(s_mixed[k], s_reduced[k], atol=1e-5)
    assert float(s_reduced["kl"]) > 0  # beta > 0 and pi_ref != pi_theta: the KL term is live

    # Mixed = reduced: the params after one AdamW step from a fresh state.
    c_reduced = dataclasses.replace(CFG, micro_batch_size=4)
    g_reduced, _ = jit_grads(cfg, c_reduced)(params, reduced, ref)
    s_reduced, m_reduced = jit_step(cfg, c_reduced, optimizer)(
        ts.init_train_state(copy_tree(params), optimizer), reduced, ref)
    s_mixed, m_mixed = steps[CFG](ts.init_train_state(copy_tree(params), optimizer), mixed, ref)
    assert_adam_first_steps_close(s_mixed.params, s_reduced.params, g_reduced, CFG,
                                  m_reduced["grad_norm"])
    assert int(s_mixed.step) == 1 and float(m_mixed["update_skipped"]) == 0
    assert float(m_mixed["active_rows"]) == 4
    close(m_mixed["num_tokens"], m_reduced["num_tokens"], atol=0)


def test_a_row_at_its_group_mean_stays_in_the_update(setup):
    """A row of a live group whose advantage is exactly 0 (its reward at its group's mean,
    graded scores) stays in the update: it counts in the per-response divisor, in the
    tokens and in the KL term (Eq. 23); only the flat flag takes rows out (METHOD 11).

    On the first (on-policy) step the ratio is 1, so pg_loss = -(1/R) sum_i A_i over the
    R live rows, the zero row included: -sum(A) / 8, not / 7."""
    cfg, params, batch, _, _, _, ref = setup
    adv = np.array([1.5, 0.0, 0.5, -0.5, 1.0, -1.5, 0.25, -0.25], np.float32)
    at_mean = batch.replace(advantages=adv)
    _, m = jit_grads(cfg, CFG)(params, at_mean, ref)
    close(m["pg_loss"], -adv.sum() / 8, atol=1e-5)
    state, metrics = jit_step(cfg, CFG, train_config.make_optimizer(CFG))(
        ts.init_train_state(copy_tree(params), train_config.make_optimizer(CFG)), at_mean, ref)
    assert float(metrics["active_rows"]) == 8
    close(metrics["num_tokens"], batch.loss_mask.sum(), atol=0)
    # The same row flagged flat leaves: the divisor is 7 and its tokens are gone.
    dead = at_mean.replace(live=np.arange(8) != 1)
    _, m_dead = jit_grads(cfg, CFG)(params, dead, ref)
    close(m_dead["pg_loss"], -adv.sum() / 7, atol=1e-5)


@pytest.mark.slow  # ~10 s on 2 cores
def test_flat_groups_are_cut_from_the_batch():
    """The shared-prefix update's batch (`rounds.phases.train_batch`, METHOD 15) holds only
    the live groups: of 4 groups, 2 flat, the compiled update takes a GroupBatch of 2 groups
    (the smallest `group_buckets` count that holds them), so a flat group costs no FLOPs.
    The params after one AdamW step equal those of the per-row update over all 16 rows
    with the flat groups masked by their flag (`assert_adam_first_steps_close`, the
    per-row gradient's float32 tolerance)."""
    from drubric_jax.rounds import phases
    from test_shared_prefix import (TEMPERATURE as T, model_and_rollout, synthetic_rollout,
                                    with_old_logprobs)
    from drubric_jax.types import Rollout

    cfg, params, base, rollout, adv, live = model_and_rollout("tiny", 0, "policy")
    # A 4th group of 4 rows, flat too: groups 1 and 3 flat, groups 0 and 2 live.
    extra = with_old_logprobs(synthetic_rollout((1, 4, 10, 6), cfg.vocab_size, seed=5),
                              params, cfg, seed=6).replace(group_ids=np.full(4, 3, np.int32))
    rollout = Rollout(**{f.name: np.concatenate([getattr(rollout, f.name),
                                                  getattr(extra, f.name)])
                         for f in dataclasses.fields(Rollout)})
    adv = np.concatenate([adv, np.zeros(4, np.float32)])
    live = np.concatenate([live, np.zeros(4, bool)])
    assert live.reshape(4, 4).all(1).tolist() == [True, False, True, False]
    c = dataclasses.replace(CFG, beta=0.05, micro_batch_size=16, temperature=T,
                            logits_chunk=4, shared_prefix=True)
    step = phases.PhaseStep(rollout=rollout, advantages=adv, live=live, metrics={}, timer=None)
    batch, global_rows = phases.train_batch(step, c, None)
    assert isinstance(batch, ts.GroupBatch) and global_rows == 2
    assert batch.tokens.shape[:2] == (2, 4) and batch.live.all()
    np.testing.assert_array_equal(batch.tokens.reshape(8, -1),
                                  rollout.tokens[np.flatnonzero(live)])

    optimizer = train_config.make_optimizer(c)
    grouped_step = jit_step(cfg, c, optimizer)
    lowered = grouped_step.lower(ts.init_train_state(copy_tree(params), optimizer), batch,
                                 base)
    batch_avals = jax.tree.leaves(lowered.args_info[0][1])
    assert {a.shape[0] for a in batch_avals} == {2}  # the compiled batch: 2 groups
    s_grp, m_grp = grouped_step(ts.init_train_state(copy_tree(params), optimizer), batch, base)

    per_row_cfg = dataclasses.replace(c, shared_prefix=False)
    masked = ts.batch_from_rollout(rollout, adv, live)
    assert masked.tokens.shape[0] == 16
    g_row, _ = jit_grads(cfg, per_row_cfg)(params, masked, base)
    s_row, m_row = jit_step(cfg, per_row_cfg, optimizer)(
        ts.init_train_state(copy_tree(params), optimizer), masked, base)
    for k in ("loss", "pg_loss", "kl", "num_tokens", "active_rows"):
        close(m_grp[k], m_row[k], atol=1e-5)
    assert float(m_grp["active_rows"]) == 8
    assert_adam_first_steps_close(s_grp.params, s_row.params, g_row, c, m_row["grad_norm"])


def _dot_count(compiled) -> int:
    """Dot instructions (matrix products) in a compiled program's HLO text."""
    import re

    return len(re.findall(r"\bdot\(", compiled.as_text()))


def test_beta_zero_compiles_no_reference_forward(setup):
    """beta = 0 drops the KL term of Eq. 23, and with it pi_ref's forward: the compiled
    step has exactly one forward's dots fewer than with beta > 0.

    One forward of the tiny model (its layers under one `lax.scan`, so the layer body is
    one program) has 7 projections (q, k, v, o, gate, up, down), 2 attention products
    (scores, values) and the output head: 10 dots, checked against a compiled forward-only
    program; the step with beta > 0 has its forward, its backward and one more forward."""
    cfg, params, batch, _, _, _, ref = setup

    def compiled_step(beta):
        c = dataclasses.replace(CFG, beta=beta)
        opt = train_config.make_optimizer(c)
        state = ts.init_train_state(params, opt)
        return jit_step(cfg, c, opt).lower(state, batch, ref).compile()

    forward = jax.jit(functools.partial(
        logprobs.sequence_logprobs, cfg=cfg, temperature=TEMPERATURE, chunk=CFG.logits_chunk,
        start=batch.prompt_len)).lower(params, tokens=batch.tokens,
                                       token_mask=batch.token_mask).compile()
    per_forward = 7 + 2 + 1
    assert _dot_count(forward) == per_forward
    with_ref, without_ref = _dot_count(compiled_step(0.01)), _dot_count(compiled_step(0.0))
    assert with_ref - without_ref == per_forward, (with_ref, without_ref)


def test_make_mesh_and_rules():
    mesh = parallel.make_mesh(data=-1, fsdp=2, tensor=2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    with pytest.raises(ValueError, match="at most one"):
        parallel.make_mesh(-1, -1, 1)
    with pytest.raises(ValueError, match="16 devices, but 8"):
        parallel.make_mesh(4, 2, 2)
    with pytest.raises(ValueError, match="not a multiple of 3"):
        parallel.make_mesh(-1, 3, 1)
    shapes = {"embed": jax.ShapeDtypeStruct((9, 8), jnp.float32),  # V=9: tensor can't split
              "final_norm": jax.ShapeDtypeStruct((8,), jnp.float32),
              "layers": {"w_down": jax.ShapeDtypeStruct((2, 6, 8), jnp.float32),
                         "mlp_norm": jax.ShapeDtypeStruct((2, 8), jnp.float32)},
              "count": jax.ShapeDtypeStruct((), jnp.int32)}
    sh = models.param_shardings(shapes, mesh)
    assert sh["embed"].spec == P(None, "fsdp")
    assert sh["final_norm"].spec == P() and sh["layers"]["mlp_norm"].spec == P()
    assert sh["layers"]["w_down"].spec == P(None, "tensor", "fsdp")
    assert sh["count"].spec == P()
    assert parallel.batch_sharding(mesh).spec == P(("data", "fsdp"))


def test_config_validation_and_check_finite():
    with pytest.raises(ValueError, match="aggregation"):
        train_config.TrainConfig(aggregation="sum")
    with pytest.raises(ValueError, match="micro_batch_size"):
        train_config.TrainConfig(micro_batch_size=0)
    with pytest.raises(ValueError, match="kl_estimator"):
        train_config.TrainConfig(kl_estimator="k4")
    assert train_config.TrainConfig(temperature=0.0).scoring_temperature == 1.0
    assert ts.check_finite({"loss": jnp.float32(1.0)}, step=3) == {"loss": 1.0}
    with pytest.raises(FloatingPointError, match="step 7: metric 'kl' is nan"):
        ts.check_finite({"loss": jnp.float32(1.0), "kl": jnp.float32(np.nan)}, step=7)


def test_warmup_schedule():
    sched = train_config.learning_rate_schedule(
        train_config.TrainConfig(learning_rate=1.0, warmup_steps=4))
    close([sched(c) for c in range(6)], [0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    close(train_config.learning_rate_schedule(
        train_config.TrainConfig(learning_rate=0.5))(7), 0.5)
