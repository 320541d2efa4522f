"""Group-normalised advantages, Eq. 21 and Eq. 24-25 (METHOD sections 3, 4, 11).

    A_g = (R_g - mean) / (std + 1e-6),   std with ddof = 1,

per GRPO group: the K responses of a prompt (policy), or the G rubric lists of one
(x, C) (generator: each reward, R_disc, R_anchor, ..., is normalised on its own and the
advantage is their weighted sum, Eq. 24-25). Groups are formed by id (`*_by_id`, METHOD
11: never by reshaping a batch whose layout may have been interleaved or sharded) or over
the last axis of an array whose layout is known.

Axis legend (docs/CONVENTIONS.md): G members of a group, R flat rows; a leading `...` is
any number of batch axes.
"""

import jax
import jax.numpy as jnp
import numpy as np

ADV_EPS = 1e-6  # added to the group std in Eq. 21 (METHOD 11)
FLAT_RTOL = 1e-6  # group is flat when max - min <= FLAT_RTOL * max(1, |mean|)


def _normalise_groups(r, m, ids, num_groups):
    """Eq. 21 over segments: (advantages float32[R], flat bool[S], std float32[S]).

    The one implementation behind `group_advantages` and `group_advantages_by_id`. A
    non-finite reward is treated as masked (the caller counts it as unscorable). Each group
    is first divided by a power of two of about its largest |R| (1 for groups within
    [-1, 1]): scaling by 2^k is exact in float arithmetic, so the result is the unscaled
    formula's, yet sums and squared deviations stay finite for rewards near the float32
    limit. std is the ddof = 1 spread the group was divided by (0 for flat groups).
    """
    m = m & jnp.isfinite(r)
    r = jnp.where(m, r, 0.0)

    def seg_sum(x):
        return jax.ops.segment_sum(x, ids, num_segments=num_groups)

    # The largest |R| of each group picks its power-of-two scale.
    peak = jax.ops.segment_max(jnp.abs(r), ids, num_segments=num_groups)
    _, exp = jnp.frexp(jnp.where(jnp.isfinite(peak), peak, 0.0))
    # 2^k, k in [0, 126], built from its exponent bits (exact; ldexp is not under jit).
    # k <= 126 because XLA CPU divides by multiplying with the reciprocal, and 2^-127 is
    # subnormal (flushed to 0); |R| / 2^126 < 4 stays harmless.
    k = jnp.clip(exp - 1, 0, 126).astype(jnp.int32)
    scale = jax.lax.bitcast_convert_type((k + 127) << 23, jnp.float32)   # [S]
    rs = r / scale[ids]
    n = seg_sum(m.astype(jnp.float32))
    mean = seg_sum(rs) / jnp.maximum(n, 1.0)                             # two passes:
    dev = jnp.where(m, rs - mean[ids], 0.0)                              # mean first,
    var = seg_sum(dev * dev) / jnp.maximum(n - 1.0, 1.0)                 # then deviations
    hi = jax.ops.segment_max(jnp.where(m, rs, -jnp.inf), ids, num_segments=num_groups)
    lo = jax.ops.segment_min(jnp.where(m, rs, jnp.inf), ids, num_segments=num_groups)
    # A group of one has no spread; it is flat below.
    spread = jnp.where(n > 1, hi - lo, 0.0)
    # Flat: max - min <= FLAT_RTOL * max(1, |mean|), in the scaled units.
    flat = (n <= 1) | (spread <= FLAT_RTOL * jnp.maximum(1.0 / scale, jnp.abs(mean)))
    std = jnp.sqrt(jnp.where(flat, 1.0, var))  # 1 for flat groups: no 0/0, no NaN gradient
    # eps / scale: in unscaled units this is (R - mean) / (std + 1e-6) exactly (Eq. 21).
    adv = dev / (std + ADV_EPS / scale)[ids]
    # Flat groups give exactly 0, not float32 residue (METHOD 11).
    return (jnp.where(m & ~flat[ids], adv, 0.0), flat,
            jnp.where(flat, 0.0, std * scale))


def _reshape_groups(rewards, group_mask):
    """float[..., G] -> flat rows, masks and segment ids (one segment per group)."""
    r = jnp.asarray(rewards, jnp.float32)
    m = jnp.ones(r.shape, bool) if group_mask is None else jnp.asarray(group_mask, bool)
    groups = int(np.prod(r.shape[:-1], dtype=np.int64))
    # Group g is row g of the [..., G] array, flattened.
    ids = jnp.repeat(jnp.arange(groups, dtype=jnp.int32), r.shape[-1])
    return r.reshape(-1), m.reshape(-1), ids, groups


def group_advantages(rewards, group_mask=None):
    """Group-normalised advantages over the last axis, Eq. 21 (METHOD 11).

        A_g = (R_g - mean) / (std + 1e-6),  std with ddof = 1,

    in float32 with two passes (mean first, then squared deviations). A group
    is flat when max R - min R <= 1e-6 max(1, |mean R|); every advantage in a
    flat group, in a group of one and at masked members is exactly 0. A
    non-finite reward counts as masked: its advantage is 0 and the rest of the
    group is normalised without it. Rewards near the float32 limit give finite
    advantages (see `_normalise_groups`).

    Args:
        rewards: float[..., G]; masked members may hold anything (NaN, inf).
        group_mask: bool[..., G] or None (all real).

    Returns:
        advantages: float32[..., G].
        flat: bool[...], True for flat groups (and groups of zero or one member);
            its mean over real groups is the logged flat fraction.
    """
    shape = np.shape(rewards)
    r, m, ids, groups = _reshape_groups(rewards, group_mask)
    adv, flat, _ = _normalise_groups(r, m, ids, groups)
    return adv.reshape(shape), flat.reshape(shape[:-1])


def group_std(rewards, group_mask=None):
    """float32[...]: the ddof = 1 std each group of `group_advantages` was divided by
    (Eq. 21), 0 for flat groups; the number to log beside the advantages."""
    shape = np.shape(rewards)
    r, m, ids, groups = _reshape_groups(rewards, group_mask)
    return _normalise_groups(r, m, ids, groups)[2].reshape(shape[:-1])


def _id_groups(rewards, group_ids, num_groups, mask):
    """Rows, mask (ids out of range masked) and safe segment ids of a by-id grouping."""
    r = jnp.asarray(rewards, jnp.float32)
    ids = jnp.asarray(group_ids, jnp.int32)
    m = jnp.ones(r.shape, bool) if mask is None else jnp.asarray(mask, bool)
    # Out-of-range ids are masked (segment ops would drop or clip them silently); masked rows
    # then take the safe id 0, their values being zeroed anyway.
    m = m & (ids >= 0) & (ids < num_groups)
    return r, m, jnp.where(m, ids, 0)


def group_std_by_id(rewards, group_ids, num_groups, mask=None):
    """float32[num_groups]: `group_std` with groups formed by id."""
    return _normalise_groups(*_id_groups(rewards, group_ids, num_groups, mask), num_groups)[2]


def group_advantages_by_id(rewards, group_ids, num_groups, mask=None):
    """Eq. 21 with groups formed by prompt id, not by reshape (METHOD 11).

    Same rule as `group_advantages` (ddof = 1, two passes, flat groups and
    groups of one get exactly 0, non-finite rewards masked), using segment sums
    over `group_ids`, so the rows of a batch may come in any order
    (interleaved, sharded, shuffled).

    Args:
        rewards: float[R]; masked rows may hold anything.
        group_ids: int[R], the group (prompt) of each row, in [0, num_groups).
            Rows with an id outside that range are treated as masked.
        num_groups: static int, the number of segments.
        mask: bool[R] or None (all real).

    Returns:
        advantages: float32[R], 0 at masked rows.
        flat: bool[num_groups], True for flat groups and groups of <= 1 row.
    """
    adv, flat, _ = _normalise_groups(*_id_groups(rewards, group_ids, num_groups, mask),
                                     num_groups)
    return adv, flat


def _weighted_sum(parts: dict, weights: dict):
    """sum_n w_n parts[n], added left to right in the order of `parts`.

    With two parts this is `w_1 * p_1 + w_2 * p_2`: the same float32 products and the one
    addition, in the same order, as the two-reward formula of Eq. 24-25, so its results are
    bitwise those of that formula (`tests/test_generator_rewards.py`).

    Raises:
        ValueError: no parts, or the names of parts and weights differ.
    """
    if not parts or set(parts) != set(weights):
        raise ValueError(f"rewards {sorted(parts)} and weights {sorted(weights)} must name "
                         "the same rewards, at least one")
    total = None
    for name, part in parts.items():
        term = weights[name] * part
        total = term if total is None else total + term
    return total


def generator_advantages(rewards: dict, weights: dict, mask=None):
    """Generator advantage, Eq. 24-25 generalised to any number of rewards:

        A_g = sum_n w_n z(R^n)_g,    z = `group_advantages` (Eq. 21) of one reward

    Each reward is group-normalised on its own (never sum-then-normalise); a flat reward
    contributes 0 and leaves the others intact (case-17). The paper's objective is
    {disc: 1, anchor: lambda} (A_disc + lambda A_anchor); the objective ablations of METHOD
    6 set the weight of one of them to 0 (`rl.generator_rewards.variant_weights`).

    Args:
        rewards: {name: float[..., G]}, the rewards of the G rubric lists of each group
            (e.g. R_disc of Eq. 13, R_anchor of Eq. 15 with its floor for invalid lists),
            all of one shape; their terms are added in this order.
        weights: {name: float} w_n, one per reward.
        mask: bool[..., G] or None (all real).

    Returns:
        advantages: float32[..., G].
        flat: {name: bool[...]}, the flat indicator of each reward's groups.

    Raises:
        ValueError: no rewards, or rewards and weights name different rewards.
    """
    parts, flat = {}, {}
    for name, r in rewards.items():
        parts[name], flat[name] = group_advantages(r, mask)
    return _weighted_sum(parts, weights), flat


def generator_advantages_by_id(rewards: dict, weights: dict, group_ids, num_groups,
                               mask=None):
    """`generator_advantages` with groups formed by id, Eq. 24-25 (METHOD 11).

    Args:
        rewards: {name: float[R]}, in the order their terms are added.
        weights: {name: float} w_n, one per reward.
        group_ids: int[R], the (x, C) group of each rubric list.
        num_groups: static int.
        mask: bool[R] or None.

    Returns:
        advantages float32[R], flat {name: bool[num_groups]}.

    Raises:
        ValueError: no rewards, or rewards and weights name different rewards.
    """
    parts, flat = {}, {}
    for name, r in rewards.items():
        parts[name], flat[name] = group_advantages_by_id(r, group_ids, num_groups, mask)
    return _weighted_sum(parts, weights), flat


def combined_flat(flat: dict, weights: dict):
    """bool[num_groups]: the groups whose combined advantage (Eq. 24-25) is 0 by the flags,
    every reward of nonzero weight flat there (a reward of weight 0 adds nothing).

    Args:
        flat: {name: bool[num_groups]}, each reward's flat flags
            (`generator_advantages_by_id`).
        weights: {name: float} w_n.

    Raises:
        ValueError: the names differ, or no reward.
    """
    if not flat or set(flat) != set(weights):
        raise ValueError(f"flags {sorted(flat)} and weights {sorted(weights)} must name the "
                         "same rewards, at least one")
    out = None
    for name, f in flat.items():
        f = jnp.asarray(f, bool) | (weights[name] == 0)
        out = f if out is None else out & f
    return out
