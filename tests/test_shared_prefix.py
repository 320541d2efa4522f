"""The shared-prefix update (METHOD 15, "Shared prefixes"; issue 54): a group's prefix runs
forward and backward once, its R suffixes beside it (`train_step.GroupBatch`), and the
loss, the gradients and the update are those of the per-row update (`train_step.Batch`),
where every row runs its prefix again.

Rollouts here are synthetic (no sampler): groups of R rows with one left-padded prompt
each and right-padded completions of varied lengths, pi_old near the model's own
log-probs (so some ratios clip), one group flat. Shapes: the policy's (a short prompt,
K answers) and the generator's (a long input, G short lists).
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax import models, parallel
from drubric_jax.models import lora
from drubric_jax.models.config import preset
from drubric_jax.rl import logprobs, train_config
from drubric_jax.rl import train_step as ts
from drubric_jax.types import Rollout

# (groups, rows a group R, prompt bucket P, completion N): the policy's K answers to a
# short prompt, and the generator's G lists after a long input.
SHAPES = {"policy": (3, 4, 10, 6), "generator": (2, 3, 40, 5)}
FAMILIES = ("tiny", "tiny_qwen3", "tiny_qwen3_moe")
TEMPERATURE = 0.8
EPS32 = float(np.finfo(np.float32).eps)


def synthetic_rollout(shape, vocab: int, seed: int = 0, stop_id: int = 3) -> Rollout:
    """Groups of R rows sharing a left-padded prompt, completions of lengths 1..N (some
    truncated), pi_old filled in later; group g's rows are rows g R .. g R + R - 1."""
    gn, r, p, n = shape
    rng = np.random.default_rng(seed)
    lengths_p = rng.integers(p // 2, p + 1, gn)
    prompt = np.zeros((gn, p), np.int32)
    pmask = np.arange(p)[None] >= (p - lengths_p)[:, None]
    prompt[pmask] = rng.integers(10, vocab, int(pmask.sum()))
    tokens = rng.integers(10, vocab, (gn * r, n)).astype(np.int32)
    lengths = rng.integers(1, n + 1, gn * r)
    mask = np.arange(n)[None] < lengths[:, None]
    ends = lengths < n
    tokens[np.flatnonzero(ends), lengths[ends] - 1] = stop_id  # a stop token ends the row
    tokens[~mask] = 0
    return Rollout(prompt_tokens=np.repeat(prompt, r, 0), prompt_mask=np.repeat(pmask, r, 0),
                   tokens=tokens, logprobs=np.zeros((gn * r, n), np.float32), mask=mask,
                   lengths=lengths.astype(np.int32), truncated=~ends,
                   invalid=np.zeros(gn * r, bool),
                   group_ids=np.repeat(np.arange(gn), r).astype(np.int32))


def with_old_logprobs(rollout: Rollout, params, cfg, seed: int) -> Rollout:
    """pi_old = the model's own log-probs plus noise of sd 0.6 nats (most ratios leave
    [0.8, 1.2]: many clip at clip_eps = 0.2), 0 where masked."""
    b = ts.batch_from_rollout(rollout, np.zeros(rollout.num_rows, np.float32),
                              np.ones(rollout.num_rows, bool))
    lp = np.asarray(logprobs.sequence_logprobs(params, cfg, b.tokens, b.token_mask,
                                               TEMPERATURE, start=b.prompt_len))
    noise = 0.6 * np.random.default_rng(seed).standard_normal(rollout.tokens.shape)
    old = (lp[:, b.prompt_len:] + noise).astype(np.float32)
    return rollout.replace(logprobs=np.where(rollout.mask, old, 0.0).astype(np.float32))


def model_and_rollout(family: str, lora_rank: int, shape_name: str):
    """(trainee cfg, trainee params, reference params (LoRA: the base its adapters sit on;
    full fine-tuning: the params moved a little), rollout, advantages, live)."""
    cfg = preset(family)
    base = models.init_params(cfg, jax.random.PRNGKey(0))
    if lora_rank:
        # A mixture of experts adapts its attention (its experts' matmuls take no LoRA).
        targets = (("wq", "wk", "wv", "wo") if cfg.family == "qwen3_moe"
                   else cfg.lora_targets)
        cfg = cfg.replace(lora_rank=lora_rank, lora_alpha=2.0 * lora_rank,
                          lora_targets=targets)
        adapters = ts.trainable_init(cfg, jax.random.PRNGKey(1), base)
        # B = 0 at init would make the adapters' gradients trivially A-free: move B off 0.
        adapters = jax.tree_util.tree_map_with_path(
            lambda path, x: (0.05 * jax.random.normal(jax.random.PRNGKey(2), x.shape, x.dtype)
                             if str(path[-1].key).endswith("_lora_b") else x), adapters)
        params, model = adapters, lora.attach(base, adapters)
    else:
        # The reference: near the trainee, not equal (the KL term is live).
        params, model = base, base
        base = jax.tree.map(lambda x: x + 0.02 * jax.random.normal(
            jax.random.PRNGKey(3), x.shape, x.dtype), base)
    shape = SHAPES[shape_name]
    rollout = with_old_logprobs(synthetic_rollout(shape, cfg.vocab_size), model, cfg, seed=1)
    gn, r = shape[:2]
    rng = np.random.default_rng(2)
    adv = rng.standard_normal(gn * r).astype(np.float32)
    live = np.ones(gn * r, bool)
    live[r:2 * r] = False                      # group 1 is flat: advantage 0, flag down
    adv[~live] = 0.0
    adv[0] = 0.0                               # a live row at its group's mean stays in
    return cfg, params, base, rollout, adv, live


def grad_tolerance(g, terms: int) -> float:
    """|per-row - grouped| allowed for a gradient leaf: the two updates compute the same
    function and differ only in the order of their float32 sums (METHOD 15). A sum of n
    terms in another order differs by about sqrt(n) rounding errors of eps/2 each, relative
    to the terms' magnitudes (the probabilistic bound of Higham & Mary 2019, "A new
    approach to probabilistic rounding error analysis": lambda sqrt(n) u with lambda a few;
    we take lambda = 16 for the terms' cancellation, which makes the largest entry a loose
    scale of the terms). n = the terms summed into a weight's gradient entry: the batch's
    tokens times the depth of the backward chain (layers x the widest inner dimension)."""
    return 16.0 * np.sqrt(terms) * 0.5 * EPS32 * float(np.abs(np.asarray(g)).max())


def summed_terms(cfg, rollout) -> int:
    """n of `grad_tolerance`: tokens of the per-row batch x layers x widest inner dim."""
    tokens = rollout.num_rows * (rollout.prompt_tokens.shape[1] + rollout.tokens.shape[1])
    return tokens * cfg.num_layers * max(cfg.dim, cfg.hidden_dim, cfg.num_heads * cfg.head_dim)


@functools.lru_cache(maxsize=None)
def grads_fn(cfg, train_cfg):
    return jax.jit(functools.partial(ts.accumulate_gradients, model_cfg=cfg, train_cfg=train_cfg))


# (family, LoRA rank, shapes, aggregation): every family, LoRA and full fine-tuning, both
# shapes and every aggregation, each at least once.
CASES = [("tiny", 0, "policy", "seq_mean_token_mean"),
         ("tiny", 4, "generator", "token_mean"),
         ("tiny_qwen3", 0, "generator", "dr_grpo"),
         ("tiny_qwen3_moe", 4, "policy", "seq_mean_token_mean")]


@pytest.mark.slow
@pytest.mark.parametrize("family,lora_rank,shape_name,agg", CASES)
def test_loss_and_grads_equal_the_per_row_update(family, lora_rank, shape_name, agg):
    """Per-row and grouped updates of the same rows: the same loss and metrics (within
    float32 rounding of sums over the batch) and the same gradients (`grad_tolerance`),
    for each model family, LoRA and full fine-tuning, the policy's and the generator's
    shapes and every aggregation, with a flat group in the batch and beta > 0.
    Micro-batches of whole groups give the one-batch gradient."""
    cfg, params, base, rollout, adv, live = model_and_rollout(family, lora_rank, shape_name)
    gn, r = SHAPES[shape_name][:2]
    per_row = ts.batch_from_rollout(rollout, adv, live)
    grouped = ts.group_batch(rollout, adv, np.ones_like(live))  # every group, flag per group
    grouped = grouped.replace(live=np.asarray([live[g * r] for g in range(gn)]))
    terms = summed_terms(cfg, rollout)
    c = train_config.TrainConfig(beta=0.05, aggregation=agg, micro_batch_size=gn * r,
                                 temperature=TEMPERATURE, logits_chunk=4)
    g_row, m_row = grads_fn(cfg, c)(params, per_row, base)
    g_grp, m_grp = grads_fn(cfg, c)(params, grouped, base)
    for k in m_row:
        # Scalars of O(1) summed over at most a few hundred tokens: 1e-5 is ~80 ulps.
        np.testing.assert_allclose(m_grp[k], m_row[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(m_row["clip_fraction"]) > 0  # the clipped branch is exercised
    assert float(m_row["kl"]) > 0             # and the KL term (LoRA: adapters off the base)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_row), jax.tree.leaves(g_grp)):
        d = float(jnp.abs(a - b).max())
        assert d <= grad_tolerance(a, terms), (jax.tree_util.keystr(path), d,
                                                grad_tolerance(a, terms))
    if shape_name == "policy":  # micro-batches of one whole group each: the same gradient
        g_micro, _ = grads_fn(cfg, dataclasses.replace(c, micro_batch_size=r))(
            params, grouped, base)
        for a, b in zip(jax.tree.leaves(g_grp), jax.tree.leaves(g_micro)):
            assert float(jnp.abs(a - b).max()) <= grad_tolerance(a, terms)


@pytest.mark.slow
def test_shared_prefix_logprobs_equal_the_rows():
    """`shared_prefix_logprobs` gives each suffix token the log-prob `sequence_logprobs`
    gives it in its own [prompt | completion] row (blockwise attention with small blocks,
    so its log-sum-exp join is the one exercised), and its entropy."""
    cfg = preset("tiny_qwen3").replace(attention="blockwise", attention_block_q=4,
                                       attention_block_kv=8)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    rollout = synthetic_rollout(SHAPES["generator"], cfg.vocab_size)
    b = ts.batch_from_rollout(rollout, np.zeros(rollout.num_rows, np.float32),
                              np.ones(rollout.num_rows, bool))
    g = ts.group_batch(rollout, b.advantages, b.live)
    want, want_ent = logprobs.sequence_logprobs(params, cfg, b.tokens, b.token_mask, 0.7,
                                                start=b.prompt_len, return_entropy=True)
    got, got_ent = logprobs.shared_prefix_logprobs(params, cfg, g.prefix_tokens, g.prefix_mask,
                                                   g.tokens, g.mask, 0.7, return_entropy=True)
    p = b.prompt_len
    from tolerances import logprob_atol
    tol = 4 * logprob_atol(want, cfg.vocab_size)  # other sums through the layers: a few x
    np.testing.assert_allclose(np.asarray(got).reshape(rollout.tokens.shape),
                               np.asarray(want)[:, p:], rtol=0, atol=tol)
    np.testing.assert_allclose(np.asarray(got_ent).reshape(rollout.tokens.shape),
                               np.asarray(want_ent)[:, p:], rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got)[~np.asarray(g.mask)] == 0)


def _update_flops(cfg, shape, grouped: bool) -> float:
    """FLOPs (`cost_analysis`) of the compiled gradient of one batch of `shape`."""
    gn, r, p, n = shape
    rollout = synthetic_rollout(shape, cfg.vocab_size)
    adv = np.linspace(-1, 1, gn * r).astype(np.float32)
    live = np.ones(gn * r, bool)
    batch = (ts.group_batch(rollout, adv, live) if grouped
             else ts.batch_from_rollout(rollout, adv, live))
    c = train_config.TrainConfig(beta=0.0, micro_batch_size=gn * r, temperature=1.0,
                                 logits_chunk=n, remat=False)
    params = jax.eval_shape(lambda: models.init_params(cfg, jax.random.PRNGKey(0)))
    fn = jax.jit(functools.partial(ts.accumulate_gradients, model_cfg=cfg, train_cfg=c))
    cost = fn.lower(params, batch, None).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


@pytest.mark.slow
def test_prefix_is_read_once_per_group():
    """The compiled update's FLOPs (`cost_analysis`) follow P + R N tokens a group, not
    R (P + N): the prefix's forward and backward run once per group.

    A model wide enough that the layer matmuls dominate (D = 128, F = 512: 0.44 MFLOP a
    token forward against 16 KFLOP of attention scores at 64 keys) and a small vocabulary.
    (1) Lengthening every prefix by P tokens adds R times less work to the grouped update
    than to the per-row one: the added prefix tokens run once a group, not once a row
    (attention's terms, which the suffixes' reads of the prefix keep at R N P in both
    layouts, stay within the 20% allowed). (2) The whole update's FLOPs stand to the
    per-row update's as the tokens do, (P + R N) / (R (P + N)), within what the output head
    (the same R N scored tokens in both) and attention add."""
    cfg = preset("tiny").replace(vocab_size=512, dim=128, hidden_dim=512, num_layers=1)
    gn, r, p, n = 2, 8, 32, 8
    flops = {(grouped, pp): _update_flops(cfg, (gn, r, pp, n), grouped)
             for grouped in (False, True) for pp in (p, 2 * p)}
    added_grouped = flops[True, 2 * p] - flops[True, p]
    added_per_row = flops[False, 2 * p] - flops[False, p]
    assert 0.8 / r < added_grouped / added_per_row < 1.2 / r, (added_grouped, added_per_row)
    ratio, tokens_ratio = flops[True, p] / flops[False, p], (p + r * n) / (r * (p + n))
    assert 0.8 * tokens_ratio < ratio < 1.25 * tokens_ratio, (ratio, tokens_ratio)


@pytest.mark.slow
def test_sharded_update_equals_one_device():
    """The grouped update on a 2 x 2 x 2 mesh of fake devices (groups over data x fsdp,
    weights over fsdp and tensor) gives the one-device loss, metrics and params after an
    AdamW step (`test_train_step.assert_adam_first_steps_close` bound from the gradient
    tolerance)."""
    from test_train_step import assert_adam_first_steps_close, copy_tree

    cfg, params, base, rollout, adv, live = model_and_rollout("tiny_qwen3", 0, "policy")
    # 4 groups: a multiple of the mesh's row shards (data x fsdp = 4); one flat.
    extra = synthetic_rollout((1, 4, 10, 6), cfg.vocab_size, seed=5)
    extra = with_old_logprobs(extra, params, cfg, seed=6).replace(
        group_ids=np.full(4, 3, np.int32))
    rollout = Rollout(**{f.name: np.concatenate([getattr(rollout, f.name),
                                                  getattr(extra, f.name)])
                         for f in dataclasses.fields(Rollout)})
    adv = np.concatenate([adv, np.array([0.5, -0.5, 1.0, -1.0], np.float32)])
    live = np.concatenate([live, np.ones(4, bool)])
    batch = ts.group_batch(rollout, adv, live, 4)
    c = train_config.TrainConfig(beta=0.05, micro_batch_size=16, temperature=TEMPERATURE,
                                 logits_chunk=4, learning_rate=1e-3)
    optimizer = train_config.make_optimizer(c)
    one = jax.jit(functools.partial(ts.train_step, model_cfg=cfg, train_cfg=c,
                                    optimizer=optimizer))
    state_1, m_1 = one(ts.init_train_state(copy_tree(params), optimizer), batch, base)
    g_1, _ = grads_fn(cfg, c)(params, batch, base)
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    _, step = ts.make_sharded_train_step(cfg, c, mesh)
    state = ts.shard_train_state(ts.init_train_state(copy_tree(params), optimizer), mesh)
    base_sh = jax.device_put(base, models.param_shardings(base, mesh))
    state_8, m_8 = step(state, jax.device_put(batch, parallel.batch_sharding(mesh)), base_sh)
    for k in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "num_tokens", "active_rows"):
        np.testing.assert_allclose(m_8[k], m_1[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(m_8["active_rows"]) == 12  # 3 live groups of 4
    assert_adam_first_steps_close(jax.device_get(state_8.params), state_1.params, g_1, c,
                                  m_1["grad_norm"])


def test_groups_split_into_packed_rows_give_the_same_gradient():
    """`train_step.rows_per_pass`: a step of fewer groups than row shards (or a
    `group_rows` cap) runs each group as R / R' packed rows [prefix | R' rows], each with
    its prefix; the loss and gradients are the whole groups' (and the per-row update's)."""
    assert ts.rows_per_pass(8, 2, 8) == 2 and ts.rows_per_pass(8, 8, 8) == 8
    assert ts.rows_per_pass(8, 1, 16) == 1 and ts.rows_per_pass(8, 8, 1, cap=4) == 4
    assert ts.rows_per_pass(6, 1, 3) == 2  # the largest divisor of R that fills the shards
    cfg, params, base, rollout, adv, live = model_and_rollout("tiny", 0, "policy")
    gn, r = SHAPES["policy"][:2]
    c = train_config.TrainConfig(beta=0.05, micro_batch_size=gn * r, temperature=TEMPERATURE,
                                 logits_chunk=4)
    whole = ts.group_batch(rollout, adv, live)
    split = ts.group_batch(rollout, adv, live, rows_per_group=2)
    assert split.tokens.shape[:2] == (2 * whole.tokens.shape[0], 2)
    np.testing.assert_array_equal(split.prefix_tokens[::2], whole.prefix_tokens)
    g_whole, m_whole = grads_fn(cfg, c)(params, whole, base)
    g_split, m_split = grads_fn(cfg, c)(params, split, base)
    for k in m_whole:
        np.testing.assert_allclose(m_split[k], m_whole[k], rtol=1e-5, atol=1e-6, err_msg=k)
    terms = summed_terms(cfg, rollout)
    for a, b in zip(jax.tree.leaves(g_whole), jax.tree.leaves(g_split)):
        assert float(jnp.abs(a - b).max()) <= grad_tolerance(a, terms)
    with pytest.raises(ValueError, match="does not divide"):
        ts.group_batch(rollout, adv, live, rows_per_group=3)
