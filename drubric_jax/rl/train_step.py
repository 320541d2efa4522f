"""The GRPO train step (Eq. 23): log-probs at the sampling temperature, micro-batched
gradients, AdamW with warm-up, and its sharded `jax.jit` wrapper.

Axis legend (docs/CONVENTIONS.md): R rows (one sampled response or rubric list each),
T = P + N tokens of a row (prompt bucket + completion), V vocab, D model dim; here also
Gn groups of R rows that share a prefix (`GroupBatch`), n micro-batches.

Two batch layouts, one loss (`rl.batches`): `GroupBatch` (the default,
`TrainConfig.shared_prefix`) runs each group's shared prefix (a prompt, a generator input)
forward and backward once beside its R rows (`logprobs.shared_prefix_logprobs`); `Batch`
runs every row [prompt | completion] on its own (the reference the grouped update is tested
against). The rows of flat groups leave the update by the flat flag (`live`), never by a
test of the advantage against 0.

RoPE positions come from the masks (`positions_from_mask`, `shared_prefix_positions`), so
the left padding of the prompt bucket never shifts a row and the completion continues the
prompt's positions exactly as the sampler's KV cache did. Completion token n is scored
given the prompt and completion tokens before it; the prompt is never scored.
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
from drubric_jax.rl.logprobs import sequence_logprobs, shared_prefix_logprobs
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling.lengths import length_metrics
# The batch layouts, re-exported: callers build batches through this module.
from drubric_jax.rl.batches import (Batch, GroupBatch, Rows, batch_from_rollout,  # noqa: F401
                                    group_batch, group_buckets, live_rows, rows_of,
                                    rows_per_pass)


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


# ----------------------------------------------------------------------------- step


def micro_batches(batch, train_cfg: TrainConfig) -> int:
    """n, the micro-batches a batch's gradient is accumulated over: R / micro_batch_size
    for a Batch; for a GroupBatch, whole groups, max(1, micro_batch_size // R) of them a
    micro-batch (micro_batch_size counts rows), one micro-batch when the batch holds no more.

    Raises:
        ValueError: the rows (groups) are not a multiple of a micro-batch's.
    """
    if isinstance(batch, GroupBatch):
        gn, r = batch.tokens.shape[:2]
        per = max(1, train_cfg.micro_batch_size // r)
        if gn <= per:
            return 1
        if gn % per:
            raise ValueError(f"batch of {gn} groups of {r} rows is not a multiple of "
                             f"{per} groups a micro-batch (micro_batch_size="
                             f"{train_cfg.micro_batch_size})")
        return gn // per
    b, mb = batch.tokens.shape[0], train_cfg.micro_batch_size
    if b % mb:
        raise ValueError(f"batch of {b} rows is not a multiple of micro_batch_size={mb}")
    return b // mb


def logprobs_of(params: dict, batch, model_cfg: ModelConfig, train_cfg: TrainConfig,
                return_entropy: bool = False):
    """Log-probs (and entropy) float32[R, N] of a batch's completion tokens, rows as
    `rows_of` orders them: per row (`sequence_logprobs`) for a Batch, each group's prefix
    once (`shared_prefix_logprobs`) for a GroupBatch; 0 at masked tokens."""
    kw = dict(chunk=train_cfg.logits_chunk, return_entropy=return_entropy,
              remat=train_cfg.remat)
    temperature = train_cfg.scoring_temperature
    if isinstance(batch, GroupBatch):
        gn, r, n = batch.tokens.shape
        out = shared_prefix_logprobs(params, model_cfg, batch.prefix_tokens,
                                     batch.prefix_mask, batch.tokens, batch.mask,
                                     temperature, **kw)
        flat = (lambda x: x.reshape(gn * r, n))
    else:
        out = sequence_logprobs(params, model_cfg, batch.tokens, batch.token_mask,
                                temperature, start=batch.prompt_len, **kw)
        flat = (lambda x: x[:, batch.prompt_len:])
    return tuple(map(flat, out)) if return_entropy else flat(out)


def accumulate_gradients(params: dict, batch: Batch, ref_params: Optional[dict] = None, *,
                         model_cfg: ModelConfig, train_cfg: TrainConfig) -> tuple[dict, dict]:
    """Gradient of the negative of Eq. 23 over the batch, accumulated over micro-batches.

    Micro-batch normalisation: each micro-batch's `grpo.grpo_loss` is rescaled by
    (its own aggregation divisor) / (the whole batch's divisor), so the micro-batch losses
    SUM to the full-batch loss and the accumulated gradient equals the one-big-batch
    gradient for every aggregation (per-response mean: divisor = non-empty rows of the
    batch, not of the micro-batch; token mean: real tokens of the batch; Dr.GRPO: R' * T,
    R' the live rows, N the completion budget). Rows of flat groups are taken out of the
    loss mask first (`rows_of`, module docstring), for the loss, the divisors, the KL term
    and the token-weighted metrics alike.
    Micro-batch i holds rows (a GroupBatch: groups) i, i + n, i + 2n, ... so, with rows
    sharded in blocks over ("data", "fsdp"), every micro-batch stays spread over all
    devices (`micro_batches`: a GroupBatch's micro-batches are whole groups).

    The reference log-probs (pi_ref of Eq. 23) are computed here, per micro-batch, by the
    same function on the same shapes as the trainee's: while the trainee still equals its
    reference the two agree bit for bit, so the KL gradient is exactly 0 and AdamW cannot
    turn float noise of two differently-shaped evaluations into lr-sized steps.
    With beta == 0 (a Python 0) the reference forward is not traced at all: the compiled
    step holds one forward (and its backward), not two.

    Args:
        params: the trainee's params (its LoRA adapters when model_cfg.lora_rank > 0).
        batch: Batch or GroupBatch (layouts in the module docstring).
        ref_params: the frozen reference's params: the base the adapters sit on, for LoRA
            (always needed then); needed for the KL term when train_cfg.beta > 0.
        model_cfg, train_cfg: static configs.

    Returns:
        (grads: float32 pytree like params, sums: float32 scalars loss, pg_loss, kl,
        clip_fraction, ratio_mean, entropy of the whole batch's live rows; all 0 and
        zero gradients when no row is live).

    Raises:
        ValueError: rows (groups) not a multiple of a micro-batch (`micro_batches`);
            beta > 0 or LoRA without ref_params.
    """
    # LoRA needs the base even at beta = 0: the adapters sit on it.
    if (train_cfg.beta > 0 or model_cfg.lora_rank) and ref_params is None:
        raise ValueError(f"beta={train_cfg.beta} / lora_rank={model_cfg.lora_rank} needs "
                         "the reference params (ref_params)")
    n = micro_batches(batch, train_cfg)
    agg = train_cfg.aggregation
    # Flat groups' rows (and filler groups) are out of the loss mask: every use below sees
    # only the rows that teach something.
    rows = rows_of(batch)
    # Divisors of the WHOLE batch; each micro-batch's loss is rescaled to them below.
    denom = grpo.loss_denominator(rows.loss_mask, agg, rows.live)
    # Token-weighted metrics (clip fraction, ratio, entropy) are averaged over these.
    total_tokens = jnp.maximum(jnp.sum(rows.loss_mask), 1).astype(jnp.float32)

    def loss_fn(p, mbatch):
        # A LoRA trainee's params are its adapters, on the frozen base (= the reference).
        model = lora.attach(ref_params, p) if model_cfg.lora_rank else p
        logp, ent = logprobs_of(model, mbatch, model_cfg, train_cfg, return_entropy=True)
        # beta = 0 skips the reference forward; stop_gradient marks pi_ref a constant of the loss.
        ref = (None if train_cfg.beta == 0 else jax.lax.stop_gradient(
            logprobs_of(ref_params, mbatch, model_cfg, train_cfg)))
        m_rows = rows_of(mbatch)
        loss, m = grpo.grpo_loss(logp, m_rows.old_logprobs, ref, m_rows.advantages,
                                 m_rows.loss_mask, train_cfg.clip_eps, train_cfg.beta, agg,
                                 train_cfg.kl_estimator)
        # (own divisor / batch divisor): the micro-batch losses sum to the full-batch loss.
        # The own divisor is the one `grpo.aggregate_tokens` used (dr_grpo: all its rows * N).
        scale = grpo.loss_denominator(m_rows.loss_mask, agg) / denom
        # Each micro-batch's per-token mean, weighted by its share of the batch's tokens.
        tok = m["num_tokens"] / total_tokens
        sums = {"loss": m["loss"] * scale, "pg_loss": m["pg_loss"] * scale,
                "kl": m["kl"] * scale, "clip_fraction": m["clip_fraction"] * tok,
                "ratio_mean": m["ratio_mean"] * tok,
                "entropy": jnp.sum(jnp.where(m_rows.loss_mask, ent, 0.0)) / total_tokens}
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

    # [R, ...] -> [n, R / n, ...] (rows, or groups): micro-batch i holds rows i, i + n, ...
    # (strided, see above).
    micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(-1, n, *x.shape[1:]), 0, 1), batch)
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
        batch: Batch or GroupBatch (layouts in the module docstring).
        ref_params: the frozen reference (pi_ref); needed when train_cfg.beta > 0.
        model_cfg, train_cfg: static configs.
        optimizer: `train_config.make_optimizer(train_cfg)` (the lr metric reads its
            schedule counter).

    Rows of flat groups (Eq. 21, METHOD 11) do not enter the update
    (`accumulate_gradients`). When no row is live the step makes no update at all: params,
    opt_state and step come back exactly as they were (AdamW on zero gradients would still
    move the params through its momentum and weight decay, and count a schedule step).

    Returns:
        (new state, metrics): float32 scalars loss, pg_loss, kl, clip_fraction, ratio_mean,
        entropy (mean over the active rows' completion tokens, nats), grad_norm (before
        clipping), update_norm (0 when skipped), advantage_{mean,min,max},
        response_length_{mean,p10,p50,p90} (tokens incl. EOS) and truncated_fraction (the
        rows that entered the update; a filler group of a GroupBatch is none of them, a
        flat row of a Batch is), num_tokens (tokens that entered the loss), active_rows
        (rows that entered it), update_skipped (1.0 when no row was live), learning_rate
        (of this update). The
        group std that Eq. 21 divided the rewards by, and the flat-group fraction, are
        logged by the phase that computed the advantages (`phases`: reward_std,
        flat_group_fraction, r_disc_std, r_anchor_std).

    Raises:
        ValueError: rows (groups) not a multiple of a micro-batch; beta > 0 without
            ref_params.
    """
    grads, metrics = accumulate_gradients(state.params, batch, ref_params,
                                          model_cfg=model_cfg, train_cfg=train_cfg)
    # In the params' dtype, so the optimizer state keeps the dtypes it was created with.
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)

    # The lr this update uses: the schedule at its counter before the update increments it.
    count = schedule_count(state.opt_state)
    lr = learning_rate_schedule(train_cfg)(state.step if count is None else count)
    rows = rows_of(batch)
    any_active = jnp.any(rows.live)

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

    # The rows the metrics describe: every row of a Batch (flat ones included, as before
    # the flag), the real groups' rows of a GroupBatch (the filler is nobody's row).
    real = rows.live if isinstance(batch, GroupBatch) else jnp.ones_like(rows.live)
    count = jnp.maximum(jnp.sum(real), 1).astype(jnp.float32)
    adv = jnp.asarray(rows.advantages, jnp.float32)
    completion = (batch.mask.reshape(rows.live.shape[0], -1) if isinstance(batch, GroupBatch)
                  else jnp.asarray(batch.loss_mask, bool))
    # grad_norm is taken before clipping (the clip is the optimizer chain's first step).
    metrics.update(
        grad_norm=optax.tree.norm(grads), update_norm=optax.tree.norm(updates),
        advantage_mean=jnp.sum(jnp.where(real, adv, 0.0)) / count,
        # 0 when no row is real (a batch of filler only): finite, as check_finite wants.
        advantage_min=jnp.where(jnp.any(real), jnp.min(jnp.where(real, adv, jnp.inf)), 0.0),
        advantage_max=jnp.where(jnp.any(real), jnp.max(jnp.where(real, adv, -jnp.inf)), 0.0),
        **length_metrics(jnp.sum(completion, axis=-1), real),
        truncated_fraction=jnp.sum(jnp.asarray(rows.truncated, bool) & real) / count,
        num_tokens=jnp.sum(rows.loss_mask).astype(jnp.float32),
        active_rows=jnp.sum(rows.live).astype(jnp.float32),
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
