"""The GRPO batch layouts (`rl.train_step` trains on either), and how a rollout becomes one.

Axis legend (docs/CONVENTIONS.md): R rows (one sampled response or rubric list each),
T = P + N tokens of a row (prompt bucket + completion); Gn groups of R rows that share a
prefix.

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
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax.types import Rollout


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


def rows_per_pass(rows: int, groups: int, shards: int, cap: int = 0) -> int:
    """R', the rows of a group that one packed row [prefix | R' rows] holds: the largest
    divisor of R (at most `cap` when given: `TrainConfig.group_rows`, for memory) at which
    the step's groups x R / R' packed rows fill the row shards, so no device holds only
    filler; 1 when even single rows cannot fill them. A group of R rows then runs as R / R'
    packed rows, each with its own copy of the prefix: the prefix is computed R / R' times
    instead of once, and R times in the per-row update.

    Args:
        rows: R, rows of a group; groups: the step's groups; shards: row shards of the
            devices the batch is split over (data x fsdp, this process's); cap: 0 = none.
    """
    fits = [d for d in range(rows, 0, -1) if rows % d == 0 and (not cap or d <= cap)]
    return next((d for d in fits if groups * (rows // d) >= shards), fits[-1])


def group_batch(rollout: Rollout, advantages, live, num_groups: Optional[int] = None,
                rows_per_group: Optional[int] = None) -> GroupBatch:
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
        rows_per_group: R' (`rows_per_pass`): each group enters as R / R' groups of R'
            consecutive rows, each with the prefix; None: whole groups.

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
    if rows_per_group:
        r = len(groups[0])
        if r % rows_per_group:
            raise ValueError(f"rows_per_group={rows_per_group} does not divide the groups' "
                             f"{r} rows")
        groups = [g[i:i + rows_per_group] for g in groups for i in range(0, r, rows_per_group)]
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
