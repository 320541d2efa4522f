"""The GRPO train step (Eq. 23): log-probs at the sampling temperature, micro-batched
gradients, AdamW with warm-up, and its sharded `jax.jit` wrapper.

Axis legend (docs/CONVENTIONS.md): R rows (one sampled response or rubric list each),
T = P + N tokens of a row (prompt bucket + completion), V vocab, D model dim; here also
Gn groups of R rows that share a prefix (`GroupBatch`), n micro-batches.

Two batch layouts, one loss. Every row of this method belongs to a group that shares a
prefix: a prompt's K answers, the G rubric lists of one generator input (METHOD 15).

`GroupBatch` (the default, `TrainConfig.shared_prefix`): each group's prefix once, its R
suffixes beside it; the prefix runs forward and backward once per group
(`logprobs.shared_prefix_logprobs`). Built by `group_batch` from the live groups only.
    prefix_tokens int32[Gn, P]     the group's prompt, left-padded in the sampler's bucket
    prefix_mask   bool[Gn, P]      its real tokens
    tokens        int32[Gn, R, N]  completions, right-padded
    mask          bool[Gn, R, N]   completion tokens up to and including the first stop
                                   token (`Rollout.mask`, METHOD 11)
    old_logprobs  float32[Gn, R, N] sampler log-probs (pi_old); anything where mask is False
    advantages    float32[Gn, R]   Eq. 21 / Eq. 25 advantages
    truncated     bool[Gn, R]      the completion hit max_new_tokens without a stop id
    live          bool[Gn]         the group enters the update (not flat, not padding)

`Batch` (per row, `batch_from_rollout`): each row [prompt | completion] on its own, the
prefix run again for every row; the reference the grouped update is tested against
(tests/test_shared_prefix.py) and what `experiments.bench_update` compares it with.
    tokens        int32[R, T]    [left-padded prompt (P) | completion (N), right-padded]
    token_mask    bool[R, T]     real tokens: the prompt's, then the completion's
    loss_mask     bool[R, T]     completion tokens only (incl. EOS); False over the prompt
    old_logprobs  float32[R, T]  sampler log-probs aligned to `tokens`
    advantages    float32[R]     Eq. 21 / Eq. 25 advantages, one per response
    truncated     bool[R]        as above
    live          bool[R]        the row's group enters the update

Flat groups. A group whose rewards are all equal (the `flat` flag of
`rl.advantages.group_advantages_by_id`, METHOD 11) teaches nothing; its rows leave the
update, and only they: a row of a live group whose advantage happens to be exactly 0 (at
its group's mean) stays, in the loss divisors and the KL term. The flag, never a test of
the advantage against 0, says which rows leave (a zero test would drop rows at the mean,
and on another sharding a rounding residue would keep them). `group_batch` cuts them from
the batch; in a `Batch` they are masked (`live`). A batch with no live row leaves the
state as it was (`train_step`).

RoPE positions come from the masks (`positions_from_mask`, `shared_prefix_positions`), so
the left padding of the prompt bucket never shifts a row and the completion continues the
prompt's positions exactly as the sampler's KV cache did. Completion token n is scored
given the prompt and completion tokens before it; the prompt is never scored.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional

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
    """One GRPO batch, a row per response; see the module docstring for every field."""

    tokens: jax.Array        # int32[R, T]
    token_mask: jax.Array    # bool[R, T]
    loss_mask: jax.Array     # bool[R, T]
    old_logprobs: jax.Array  # float32[R, T]
    advantages: jax.Array    # float32[R]
    truncated: jax.Array     # bool[R]
    live: jax.Array          # bool[R]
    # Prompt bucket P (static): positions < P are never scored, so the output head skips
    # them. 0 = score every position.
    prompt_len: int = flax.struct.field(pytree_node=False, default=0)


@flax.struct.dataclass
class GroupBatch:
    """One GRPO batch of groups that share a prefix; see the module docstring."""

    prefix_tokens: jax.Array  # int32[Gn, P]
    prefix_mask: jax.Array    # bool[Gn, P]
    tokens: jax.Array         # int32[Gn, R, N]
    mask: jax.Array           # bool[Gn, R, N]
    old_logprobs: jax.Array   # float32[Gn, R, N]
    advantages: jax.Array     # float32[Gn, R]
    truncated: jax.Array      # bool[Gn, R]
    live: jax.Array           # bool[Gn]


class Rows(NamedTuple):
    """A batch seen as rows over their completion tokens (what Eq. 23 sums over):
    loss_mask bool[R, N] (live rows' completion tokens only), old_logprobs float32[R, N],
    advantages float32[R], truncated bool[R], live bool[R]."""

    loss_mask: jax.Array
    old_logprobs: jax.Array
    advantages: jax.Array
    truncated: jax.Array
    live: jax.Array


def rows_of(batch) -> Rows:
    """The `Rows` view of a Batch (its completion columns [P:]) or a GroupBatch (groups
    flattened, row g * R + r), dead rows out of the loss mask."""
    if isinstance(batch, GroupBatch):
        gn, r, n = batch.tokens.shape
        live = jnp.repeat(jnp.asarray(batch.live, bool), r)
        mask = jnp.asarray(batch.mask, bool).reshape(gn * r, n) & live[:, None]
        return Rows(mask, batch.old_logprobs.reshape(gn * r, n),
                    batch.advantages.reshape(gn * r), batch.truncated.reshape(gn * r), live)
    p, live = batch.prompt_len, jnp.asarray(batch.live, bool)
    return Rows(jnp.asarray(batch.loss_mask, bool)[:, p:] & live[:, None],
                batch.old_logprobs[:, p:], batch.advantages, batch.truncated, live)


def batch_from_rollout(rollout: Rollout, advantages, live) -> Batch:
    """The per-row Batch layout of a Rollout: [its left-padded prompts | its completions].

    The prompt bucket is the sampler's own (no re-padding), so positions and log-probs line
    up with what the sampler computed.

    Args:
        rollout: R sampled rows (`sampling.generate`, or a RubricBatch's rollout).
        advantages: float32[R], Eq. 21 / Eq. 25.
        live: bool[R], the rows whose group is not flat (`live_rows`).

    Returns:
        Batch of host numpy arrays, T = P + N.

    Raises:
        ValueError: advantages or live flags are not one per row.
    """
    r, p = rollout.prompt_tokens.shape
    for name, x in (("advantages", advantages), ("live", live)):
        if np.shape(x) != (r,):
            raise ValueError(f"{r} rollout rows but {name} of shape {np.shape(x)}")
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
        truncated=np.asarray(rollout.truncated, bool), live=np.asarray(live, bool),
        prompt_len=p)


def live_rows(group_ids, flat) -> np.ndarray:
    """bool[R]: the rows whose group is not flat.

    Args:
        group_ids: int[R], each row's group id (`Rollout.group_ids`).
        flat: bool[num_groups], the flat flag of each group (`rl.advantages`'s
            `group_advantages_by_id`, or for the generator every weighted reward's flag).
    """
    return ~np.asarray(flat, bool)[np.asarray(group_ids, np.int64)]


def _groups(rollout: Rollout) -> list:
    """Row indices of each group of `rollout`, groups in order of first appearance.

    Raises:
        ValueError: groups of unequal size, or rows of one group whose prompts differ (they
            cannot share a prefix).
    """
    ids = np.asarray(rollout.group_ids)
    order = list(dict.fromkeys(ids.tolist()))
    rows = [np.flatnonzero(ids == g) for g in order]
    sizes = {len(r) for r in rows}
    if len(sizes) > 1:
        raise ValueError(f"groups of unequal sizes {sorted(sizes)}: a GroupBatch holds R rows "
                         "per group")
    pt, pm = np.asarray(rollout.prompt_tokens), np.asarray(rollout.prompt_mask, bool)
    for g, r in zip(order, rows):
        same = (pm[r] == pm[r[0]]).all() and (np.where(pm[r], pt[r], 0)
                                               == np.where(pm[r[0]], pt[r[0]], 0)).all()
        if not same:
            raise ValueError(f"group {g}: its rows {r.tolist()} have different prompts, so "
                             "they share no prefix")
    return rows


def group_buckets(max_groups: int, unit: int = 1) -> tuple:
    """The group counts a GroupBatch is padded to: unit, 2 unit, 4 unit, ... below the
    largest, and the largest, `max_groups` rounded up to a multiple of `unit` (each a
    compiled program of the update; a step's live groups take the smallest that holds them).

    Args:
        max_groups: the groups of a whole step (every group live).
        unit: a multiple every count must be (the mesh's row shards, the groups of a
            micro-batch).
    """
    top = max(unit, -(-max_groups // unit) * unit)
    counts, c = [], unit
    while c < top:
        counts.append(c)
        c *= 2
    return tuple(counts + [top])


def group_batch(rollout: Rollout, advantages, live, num_groups: Optional[int] = None
                ) -> GroupBatch:
    """The live groups of a rollout as a GroupBatch (module docstring), padded to
    `num_groups` groups with flagged-dead copies of a group (their rows enter no loss, no
    divisor and no metric).

    Args:
        rollout: R sampled rows whose `group_ids` group them (a prompt's K answers, an
            input's G lists), every group of one size and one prompt.
        advantages: float32[R] (Eq. 21 / Eq. 25).
        live: bool[R], the rows whose group is not flat (`live_rows`).
        num_groups: the groups of the batch (a `group_buckets` count); None: the live
            groups' count (at least 1).

    Returns:
        GroupBatch of host numpy arrays.

    Raises:
        ValueError: unequal groups or differing prompts within a group (`_groups`); a group
            whose rows disagree on `live`; more live groups than num_groups.
    """
    r_total = rollout.prompt_tokens.shape[0]
    for name, x in (("advantages", advantages), ("live", live)):
        if np.shape(x) != (r_total,):
            raise ValueError(f"{r_total} rollout rows but {name} of shape {np.shape(x)}")
    live = np.asarray(live, bool)
    groups = _groups(rollout)
    mixed = [i for i, r in enumerate(groups) if live[r].any() != live[r].all()]
    if mixed:
        raise ValueError(f"groups {mixed[:3]} have live and dead rows: the flat flag is a "
                         "group's")
    keep = [r for r in groups if live[r[0]]]
    n = max(1, len(keep)) if num_groups is None else int(num_groups)
    if len(keep) > n:
        raise ValueError(f"{len(keep)} live groups do not fit a batch of {n} groups")
    # Filler: a copy of a real group (finite values, the same shapes), flagged dead.
    filler = (keep or groups)[0]
    idx = np.stack(keep + [filler] * (n - len(keep)))                         # [Gn, R]
    flags = np.arange(n) < len(keep)
    first = idx[:, 0]
    return GroupBatch(
        prefix_tokens=np.asarray(rollout.prompt_tokens, np.int32)[first],
        prefix_mask=np.asarray(rollout.prompt_mask, bool)[first],
        tokens=np.asarray(rollout.tokens, np.int32)[idx],
        mask=np.asarray(rollout.mask, bool)[idx],
        old_logprobs=np.asarray(rollout.logprobs, np.float32)[idx],
        advantages=np.asarray(advantages, np.float32)[idx],
        truncated=np.asarray(rollout.truncated, bool)[idx], live=flags)


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
