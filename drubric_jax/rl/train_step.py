"""The GRPO train step (Eq. 23): log-probs at the sampling temperature, micro-batched
gradients, AdamW with warm-up, and its sharded `jax.jit` wrapper.

Axis legend (docs/CONVENTIONS.md): R rows (one sampled response or rubric list each),
T = P + N tokens of a row (prompt bucket + completion), V vocab, D model dim; here also
n micro-batches of b rows (R = n * b).

Batch layout (`Batch`, one row per response):
    tokens        int32[R, T]    [left-padded prompt (P) | completion (N), right-padded]
    token_mask    bool[R, T]     real tokens: the prompt's, then the completion up to and
                                 including its first stop token (`Rollout.mask`)
    loss_mask     bool[R, T]     completion tokens only (incl. EOS, METHOD 11); False over
                                 the prompt bucket and the filler after EOS
    old_logprobs  float32[R, T]  sampler log-probs (pi_old) aligned to `tokens`; anything
                                 (0 in practice) where loss_mask is False
    advantages    float32[R]     Eq. 21 / Eq. 25 advantages, one per response
    truncated     bool[R]        the completion hit max_new_tokens without a stop id

Zero-advantage rows: a row whose advantage is exactly 0 (every row of a flat group:
`rl.advantages` writes an exact 0 there, METHOD 11) does not enter the update. Its tokens
are removed from the loss mask (`active_loss_mask`), so it counts in no aggregation
divisor, no token-weighted metric and no KL term, and a batch with flat groups gives the
update of the same batch without them. A batch with no active row leaves the state as it
was (`train_step`).

RoPE positions come from `token_mask` (`positions_from_mask`), so the left padding of the
prompt bucket never shifts a row and the completion continues the prompt's positions
exactly as the sampler's KV cache did. `logp[:, t]` scores tokens[:, t] given
tokens[:, :t]; position 0 has no context and gets 0.
"""
from __future__ import annotations

import functools
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from drubric_jax import models, parallel
from drubric_jax.rl import grpo
from drubric_jax.models import lora
from drubric_jax.rl.train_config import (TrainConfig, learning_rate_schedule, make_optimizer,
                                      schedule_count)
from drubric_jax.rl.logprobs import sequence_logprobs
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling.lengths import length_metrics
from drubric_jax.types import Rollout


@flax.struct.dataclass
class TrainState:
    """Everything the step updates.

    Attributes:
        step: int32[] optimizer updates applied so far.
        params: model parameter pytree.
        opt_state: optax state (Adam moments mirror params; counters are int32[]).
    """

    step: jax.Array
    params: dict
    opt_state: optax.OptState


def init_train_state(params: dict, optimizer: optax.GradientTransformation) -> TrainState:
    """TrainState at step 0. Pure: `jax.jit(..., out_shardings=...)` creates it sharded."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params))


# ----------------------------------------------------------------------------- batch


@flax.struct.dataclass
class Batch:
    """One GRPO batch; see the module docstring for the layout of every field."""

    tokens: jax.Array        # int32[R, T]
    token_mask: jax.Array    # bool[R, T]
    loss_mask: jax.Array     # bool[R, T]
    old_logprobs: jax.Array  # float32[R, T]
    advantages: jax.Array    # float32[R]
    truncated: jax.Array     # bool[R]
    # Prompt bucket P (static): positions < P are never scored, so the output head skips
    # them. 0 = score every position.
    prompt_len: int = flax.struct.field(pytree_node=False, default=0)


def batch_from_rollout(rollout: Rollout, advantages) -> Batch:
    """The Batch layout of a Rollout: [its left-padded prompts | its completions].

    The prompt bucket is the sampler's own (no re-padding), so positions and log-probs line
    up with what the sampler computed.

    Args:
        rollout: R sampled rows (`sampling.generate`, or a RubricBatch's rollout).
        advantages: float32[R], Eq. 21 / Eq. 25.

    Returns:
        Batch of host numpy arrays, T = P + N.

    Raises:
        ValueError: advantages are not one per row.
    """
    r, p = rollout.prompt_tokens.shape
    if np.shape(advantages) != (r,):
        raise ValueError(f"{r} rollout rows but advantages of shape {np.shape(advantages)}")
    comp_mask = np.asarray(rollout.mask, bool)
    tokens = np.concatenate([np.asarray(rollout.prompt_tokens, np.int32),
                             np.asarray(rollout.tokens, np.int32)], axis=1)
    # The prompt bucket conditions the completion but is never scored: loss_mask and
    # old_logprobs are False / 0 over it.
    return Batch(
        tokens=tokens,
        token_mask=np.concatenate([np.asarray(rollout.prompt_mask, bool), comp_mask], axis=1),
        loss_mask=np.concatenate([np.zeros((r, p), bool), comp_mask], axis=1),
        old_logprobs=np.concatenate([np.zeros((r, p), np.float32),
                                     np.asarray(rollout.logprobs, np.float32)], axis=1),
        advantages=np.asarray(advantages, np.float32),
        truncated=np.asarray(rollout.truncated, bool), prompt_len=p)


# ----------------------------------------------------------------------------- step


def active_rows(advantages: jax.Array) -> jax.Array:
    """bool[R]: the rows that enter the update, those whose advantage (float32[R], Eq. 21 /
    Eq. 25) is not exactly 0. A flat group's rows are exactly 0 (`rl.advantages`), so they
    drop out; a NaN advantage stays in (and fails `check_finite`)."""
    return jnp.asarray(advantages, jnp.float32) != 0


def active_loss_mask(batch: Batch) -> jax.Array:
    """bool[R, T]: `batch.loss_mask` less the rows with advantage exactly 0 (`active_rows`).

    Why: such a row adds nothing to the policy-gradient term of Eq. 23, yet it would count
    in the per-response and token divisors (diluting the other rows' gradient) and, with
    beta > 0, its KL term would still pull the trainee toward pi_ref.
    """
    return jnp.asarray(batch.loss_mask, bool) & active_rows(batch.advantages)[:, None]


def accumulate_gradients(params: dict, batch: Batch, ref_params: Optional[dict] = None, *,
                         model_cfg: ModelConfig, train_cfg: TrainConfig) -> tuple[dict, dict]:
    """Gradient of the negative of Eq. 23 over the batch, accumulated over micro-batches.

    Micro-batch normalisation: each micro-batch's `grpo.grpo_loss` is rescaled by
    (its own aggregation divisor) / (the whole batch's divisor), so the micro-batch losses
    SUM to the full-batch loss and the accumulated gradient equals the one-big-batch
    gradient for every aggregation (per-response mean: divisor = non-empty rows of the
    batch, not of the micro-batch; token mean: real tokens of the batch; Dr.GRPO: R' * T,
    R' the active rows). Rows with advantage exactly 0 are taken out of the loss mask first
    (`active_loss_mask`, module docstring), for the loss, the divisors, the KL term and the
    token-weighted metrics alike.
    Micro-batch i holds rows i, i + n, i + 2n, ... so, with rows sharded in blocks over
    ("data", "fsdp"), every micro-batch stays spread over all devices.

    The reference log-probs (pi_ref of Eq. 23) are computed here, per micro-batch, by the
    same function on the same shapes as the trainee's: while the trainee still equals its
    reference the two agree bit for bit, so the KL gradient is exactly 0 and AdamW cannot
    turn float noise of two differently-shaped evaluations into lr-sized steps.
    With beta == 0 (a Python 0) the reference forward is not traced at all: the compiled
    step holds one forward (and its backward), not two.

    Args:
        params: the trainee's params (its LoRA adapters when model_cfg.lora_rank > 0).
        batch: Batch with R rows (layout in the module docstring).
        ref_params: the frozen reference's params: the base the adapters sit on, for LoRA
            (always needed then); needed for the KL term when train_cfg.beta > 0.
        model_cfg, train_cfg: static configs.

    Returns:
        (grads: float32 pytree like params, sums: float32 scalars loss, pg_loss, kl,
        clip_fraction, ratio_mean, entropy of the whole batch's active rows; all 0 and
        zero gradients when no row is active).

    Raises:
        ValueError: R not a multiple of micro_batch_size; beta > 0 without ref_params.
    """
    # LoRA needs the base even at beta = 0: the adapters sit on it.
    if (train_cfg.beta > 0 or model_cfg.lora_rank) and ref_params is None:
        raise ValueError(f"beta={train_cfg.beta} / lora_rank={model_cfg.lora_rank} needs "
                         "the reference params (ref_params)")
    b = batch.tokens.shape[0]
    mb = train_cfg.micro_batch_size
    if b % mb:
        raise ValueError(f"batch of {b} rows is not a multiple of "
                         f"micro_batch_size={mb}")
    n = b // mb
    agg = train_cfg.aggregation
    # Zero-advantage rows (flat groups) leave the loss mask: every use below sees only the
    # rows that teach something.
    rows = active_rows(batch.advantages)
    batch = batch.replace(loss_mask=active_loss_mask(batch))
    # Divisors of the WHOLE batch; each micro-batch's loss is rescaled to them below.
    denom = grpo.loss_denominator(batch.loss_mask, agg, rows)
    # Token-weighted metrics (clip fraction, ratio, entropy) are averaged over these.
    total_tokens = jnp.maximum(jnp.sum(batch.loss_mask), 1).astype(jnp.float32)

    def logprobs_of(p, mbatch, return_entropy=False):
        return sequence_logprobs(p, model_cfg, mbatch.tokens, mbatch.token_mask,
                                 train_cfg.scoring_temperature, chunk=train_cfg.logits_chunk,
                                 return_entropy=return_entropy, start=mbatch.prompt_len,
                                 remat=train_cfg.remat)

    def loss_fn(p, mbatch: Batch):
        # A LoRA trainee's params are its adapters, on the frozen base (= the reference).
        model = lora.attach(ref_params, p) if model_cfg.lora_rank else p
        logp, ent = logprobs_of(model, mbatch, return_entropy=True)
        # beta = 0 skips the reference forward; stop_gradient marks pi_ref a constant of the loss.
        ref = (None if train_cfg.beta == 0
               else jax.lax.stop_gradient(logprobs_of(ref_params, mbatch)))
        loss, m = grpo.grpo_loss(logp, mbatch.old_logprobs, ref, mbatch.advantages,
                                 mbatch.loss_mask, train_cfg.clip_eps, train_cfg.beta, agg,
                                 train_cfg.kl_estimator)
        # (own divisor / batch divisor): the micro-batch losses sum to the full-batch loss.
        # The own divisor is the one `grpo.aggregate_tokens` used (dr_grpo: all its b * T).
        scale = grpo.loss_denominator(mbatch.loss_mask, agg) / denom
        # Each micro-batch's per-token mean, weighted by its share of the batch's tokens.
        tok = m["num_tokens"] / total_tokens
        sums = {"loss": m["loss"] * scale, "pg_loss": m["pg_loss"] * scale,
                "kl": m["kl"] * scale, "clip_fraction": m["clip_fraction"] * tok,
                "ratio_mean": m["ratio_mean"] * tok,
                "entropy": jnp.sum(jnp.where(mbatch.loss_mask, ent, 0.0)) / total_tokens}
        return loss * scale, sums

    grad_fn = jax.grad(loss_fn, has_aux=True)
    if n == 1:  # one micro-batch: no accumulator buffer (saves a float32 copy of params)
        grads, sums = grad_fn(params, batch)
        return jax.tree.map(lambda g: g.astype(jnp.float32), grads), sums

    def accumulate(carry, mbatch):
        grads, sums = carry
        g, s = grad_fn(params, mbatch)
        # Accumulated in float32 whatever the params' dtype.
        grads = jax.tree.map(lambda a, x: a + x.astype(jnp.float32), grads, g)
        return (grads, jax.tree.map(jnp.add, sums, s)), None

    # [R, ...] -> [n, b, ...]: micro-batch i holds rows i, i + n, ... (strided, see above).
    micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(mb, n, *x.shape[1:]), 0, 1), batch)
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    zero_sums = {k: jnp.zeros((), jnp.float32) for k in
                 ("loss", "pg_loss", "kl", "clip_fraction", "ratio_mean", "entropy")}
    # One compiled gradient pass, looped n times (compile time independent of n).
    (grads, sums), _ = jax.lax.scan(accumulate, (zeros, zero_sums), micro)
    return grads, sums


def train_step(state: TrainState, batch: Batch, ref_params: Optional[dict] = None, *,
               model_cfg: ModelConfig, train_cfg: TrainConfig,
               optimizer: optax.GradientTransformation) -> tuple[TrainState, dict]:
    """One optimizer update on the negative of Eq. 23 (`accumulate_gradients`, then AdamW).

    Args:
        state: TrainState (donated by the jitted wrappers).
        batch: Batch with R rows (layout in the module docstring).
        ref_params: the frozen reference (pi_ref); needed when train_cfg.beta > 0.
        model_cfg, train_cfg: static configs.
        optimizer: `train_config.make_optimizer(train_cfg)` (the lr metric reads its
            schedule counter).

    Rows with advantage exactly 0 (flat groups, Eq. 21) do not enter the update
    (`accumulate_gradients`). When no row is active the step makes no update at all: params,
    opt_state and step come back exactly as they were (AdamW on zero gradients would still
    move the params through its momentum and weight decay, and count a schedule step).

    Returns:
        (new state, metrics): float32 scalars loss, pg_loss, kl, clip_fraction, ratio_mean,
        entropy (mean over the active rows' completion tokens, nats), grad_norm (before
        clipping), update_norm (0 when skipped), advantage_{mean,min,max} (all rows),
        response_length_{mean,p10,p50,p90} (tokens incl. EOS), truncated_fraction (all rows),
        num_tokens (tokens that entered the loss), active_rows (rows that entered it),
        update_skipped (1.0 when no row was active), learning_rate (of this update). The
        group std that Eq. 21 divided the rewards by, and the flat-group fraction, are
        logged by the phase that computed the advantages (`phases`: reward_std,
        flat_group_fraction, r_disc_std, r_anchor_std).

    Raises:
        ValueError: R not a multiple of micro_batch_size; beta > 0 without ref_params.
    """
    grads, metrics = accumulate_gradients(state.params, batch, ref_params,
                                          model_cfg=model_cfg, train_cfg=train_cfg)
    # In the params' dtype, so the optimizer state keeps the dtypes it was created with.
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)

    # The lr this update uses: the schedule at its counter before the update increments it.
    count = schedule_count(state.opt_state)
    lr = learning_rate_schedule(train_cfg)(state.step if count is None else count)
    rows = active_rows(batch.advantages)
    any_active = jnp.any(rows)

    def apply(_):
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        return optax.apply_updates(state.params, updates), opt_state, updates

    # The updates' dtypes are the optimizer's (float32 for bfloat16 params): zeros of those.
    update_shapes = jax.eval_shape(apply, None)[2]

    def keep(_):
        return (state.params, state.opt_state,
                jax.tree.map(lambda u: jnp.zeros(u.shape, u.dtype), update_shapes))

    # No active row: the old state bit for bit. A cond, not a select of the new state
    # against the old: a select keeps both states alive (the compiled policy update of
    # tests/test_planner.py reached 1.46x its planned bytes), a cond runs one branch on the
    # donated buffers. The host normally skips such a step before it gets here
    # (`rounds.phases.update`).
    params, opt_state, updates = jax.lax.cond(any_active, apply, keep, None)

    loss_mask = jnp.asarray(batch.loss_mask, bool)
    adv = jnp.asarray(batch.advantages, jnp.float32)
    # grad_norm is taken before clipping (the clip is the optimizer chain's first step).
    metrics.update(
        grad_norm=optax.tree.norm(grads), update_norm=optax.tree.norm(updates),
        advantage_mean=jnp.mean(adv), advantage_min=jnp.min(adv), advantage_max=jnp.max(adv),
        **length_metrics(jnp.sum(loss_mask, axis=-1)),
        truncated_fraction=jnp.mean(jnp.asarray(batch.truncated, jnp.float32)),
        num_tokens=jnp.sum(active_loss_mask(batch)).astype(jnp.float32),
        active_rows=jnp.sum(rows).astype(jnp.float32),
        update_skipped=(~any_active).astype(jnp.float32), learning_rate=lr)
    new_state = TrainState(step=state.step + any_active.astype(state.step.dtype),
                           params=params, opt_state=opt_state)
    return new_state, metrics


@functools.lru_cache(maxsize=16)
def make_sharded_train_step(model_cfg: ModelConfig, train_cfg: TrainConfig, mesh):
    """`(optimizer, step)`: the sharded `(state, batch, ref_params) -> (state, metrics)`;
    the state is donated.

    State in/out and ref_params: `models.param_shardings` of the trainee's TrainState /
    params (shapes from `jax.eval_shape`, nothing allocated); batch rows over
    ("data", "fsdp") (R and micro_batch_size should be multiples of data * fsdp); metrics
    replicated. Put the state with `shard_train_state` first.

    Memoised on its (hashable) arguments: a second run in the same process (tests, sweeps)
    reuses the compiled step instead of tracing and compiling it again.
    """
    optimizer = make_optimizer(train_cfg)
    # Shapes only: the shardings are known before any array exists (STYLE 6).
    shapes = jax.eval_shape(lambda: init_train_state(trainable_init(model_cfg), optimizer))
    state_sh = models.param_shardings(shapes, mesh)
    # ref_params: the full base params (for LoRA, the frozen base the adapters sit on).
    base_sh = models.param_shardings(jax.eval_shape(lambda: models.init_params(
        model_cfg, jax.random.PRNGKey(0))), mesh)
    @functools.wraps(train_step)
    def step_on_rows(state, batch, ref_params):
        # Traced under the mesh: the layers keep their activations on the batch's rows
        # (`parallel.constrain_rows`), so FSDP gathers weights, not every row's activations.
        with parallel.rows_on(mesh):
            return train_step(state, batch, ref_params, model_cfg=model_cfg,
                              train_cfg=train_cfg, optimizer=optimizer)

    step = jax.jit(
        step_on_rows,
        in_shardings=(state_sh, parallel.batch_sharding(mesh), base_sh),
        out_shardings=(state_sh, parallel.replicated(mesh)),
        # The old state's buffers are reused for the new one: params and moments are not held twice.
        donate_argnums=(0,))
    return optimizer, step


def trainable_init(model_cfg: ModelConfig, key: Optional[jax.Array] = None,
                   base: Optional[dict] = None) -> dict:
    """The params a trainee of `model_cfg` trains: LoRA adapters on `base` (lora_rank > 0),
    else the full params (a copy of `base` in the master dtype, or random without one).
    Pure: run it under `jax.eval_shape` for shapes, or `jax.jit(out_shardings=...)`."""
    key = jax.random.PRNGKey(0) if key is None else key
    if model_cfg.lora_rank:
        # Adapters need only the base's shapes (arrays or structs).
        shapes = base if base is not None else jax.eval_shape(
            lambda: models.init_params(model_cfg, key))
        return lora.init_adapters(model_cfg, shapes, key)
    if base is None:
        return models.init_params(model_cfg, key)
    return jax.tree.map(lambda x: x.astype(model_cfg.weight_dtype), base)


def shard_train_state(state: TrainState, mesh) -> TrainState:
    """`jax.device_put` of a state onto the shardings `make_sharded_train_step` expects."""
    return jax.device_put(state, models.param_shardings(state, mesh))


def check_finite(metrics: dict, step: int) -> dict:
    """Raises FloatingPointError if any metric is NaN/inf; returns host floats.

    Call it on step N-1's metrics after dispatching step N (STYLE 9), so fetching them
    does not stall the device.

    Raises:
        FloatingPointError: "step S: metric NAME is nan" for the first bad metric.
    """
    host = {k: float(v) for k, v in parallel.fetch(metrics).items()}
    for name, value in host.items():
        if not np.isfinite(value):
            raise FloatingPointError(f"step {step}: metric {name!r} is {value}")
    return host
