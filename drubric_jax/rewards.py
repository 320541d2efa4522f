"""Rubric scores, generator rewards and group advantages (METHOD sections 3, 4, 11).

Axis legend: K responses per prompt, G rubric lists (or responses) in one GRPO
group, M rubric items, N anchor-list length, R flat rows of a batch. A leading
`...` is any number of batch axes (B, or B x G) shared by all arguments.

Layouts fixed for the whole module:
- verdicts are responses-by-items, `float32[..., K, M]`, values in {0, 1} (the paper) or
    in [0, 1] (soft verdicts, METHOD 12);
- gold ranks are numbers per item, smaller is better, equal means tied
    (`0, 1, 2, ...` for a strict best-first list);
- masks are bool and mark real entries; padded entries may hold any value,
    NaN and inf included, and never reach the arithmetic.

Every function is pure and jittable and returns finite values for finite
inputs at unmasked positions (no 0/0 for empty rubrics, empty lists or flat
groups).
"""

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax.text.rubric_format import MAX_WEIGHT, MIN_WEIGHT
ADV_EPS = 1e-6  # added to the group std in Eq. 21 (METHOD 11)
FLAT_RTOL = 1e-6  # group is flat when max - min <= FLAT_RTOL * max(1, |mean|)


def _all_true(x, drop_last=0):
    """bool array of ones shaped like x without its last `drop_last` axes."""
    return jnp.ones(x.shape[: x.ndim - drop_last], dtype=bool)


def valid_items(weights, item_mask):
    """Items that count towards a score (METHOD 11: invalid items are dropped).

    Args:
        weights: int or float[..., M], the rubric weights w_m.
        item_mask: bool[..., M], True for real (non-padding) items.

    Returns:
        bool[..., M]: masked in and weight an integer in 1..5. Weights outside
        that range or non-integers are dropped, never clamped.
    """
    w = jnp.asarray(weights, jnp.float32)
    return (jnp.asarray(item_mask, bool) & (w >= MIN_WEIGHT) & (w <= MAX_WEIGHT)
            & (w == jnp.floor(w)))


def _item_weights(weights, item_mask):
    """float32[..., M] weights with dropped items set to 0, and their mask."""
    keep = valid_items(weights, item_mask)
    return jnp.where(keep, jnp.asarray(weights, jnp.float32), 0.0), keep


def rubric_scores(verdicts, weights, item_mask):
    """Weighted rubric score of every response, Eq. 12.

        E(x, y_k | C) = sum_m w_m v_m(y_k) / sum_m w_m

    Args:
        verdicts: float32[..., K, M] (or bool/int), v_m(y_k) in {0, 1}.
        weights: int or float[..., M], w_m; see `valid_items` for which count.
        item_mask: bool[..., M], True for real items.

    Returns:
        scores: float32[..., K] in [0, 1].
        valid: bool[...], False when no item is valid (sum w = 0); such a rubric
            gives every response the score 0 (METHOD 3 and 11), never NaN.
    """
    w, keep = _item_weights(weights, item_mask)
    v = jnp.where(keep[..., None, :], jnp.asarray(verdicts, jnp.float32), 0.0)
    total = jnp.sum(w, axis=-1)
    valid = total > 0
    weighted = jnp.sum(v * w[..., None, :], axis=-1)
    scores = weighted / jnp.where(valid, total, 1.0)[..., None]
    return jnp.where(valid[..., None], scores, 0.0), valid


def discriminability_reward(verdicts, weights, item_mask, response_mask=None):
    """Weighted variance of item outcomes over the responses, Eq. 13 (generalised).

        vbar_m = (1/K) sum_k v_m(y_k)
        R_disc = sum_m w_m Var_k[v_m(y_k)] / sum_m w_m            in [0, 0.25]

    with the population variance (no Bessel correction). For 0/1 verdicts Var_k =
    vbar_m (1 - vbar_m), the paper's Eq. 13, and an item whose verdicts are all 0 or 1 is
    computed that way, bit for bit; soft verdicts v in [0, 1] (METHOD 12) use the two-pass
    (1/K) sum_k (v - vbar)^2, which is 0 when every response gets the same P(yes).

    Args:
        verdicts: float32[..., K, M], v_m(y_k) in [0, 1] ({0, 1} in the paper).
        weights: int or float[..., M], w_m.
        item_mask: bool[..., M], True for real items.
        response_mask: bool[..., K] or None (all real), True for real responses.

    Returns:
        float32[...]; 0 for an invalid rubric (sum w = 0) or no real response.
    """
    w, keep = _item_weights(weights, item_mask)
    v = jnp.asarray(verdicts, jnp.float32)
    if response_mask is None:
        response_mask = _all_true(v, drop_last=1)
    resp = jnp.asarray(response_mask, bool)
    v = jnp.where(keep[..., None, :] & resp[..., :, None], v, 0.0)
    n = jnp.sum(resp, axis=-1)
    nf = jnp.maximum(n, 1)[..., None].astype(jnp.float32)
    vbar = jnp.sum(v, axis=-2) / nf                                       # [..., M]
    dev = jnp.where(resp[..., :, None], v - vbar[..., None, :], 0.0)
    binary = jnp.all((v == 0.0) | (v == 1.0), axis=-2)
    var = jnp.where(binary, vbar * (1.0 - vbar), jnp.sum(dev * dev, axis=-2) / nf)
    total = jnp.sum(w, axis=-1)
    ok = (total > 0) & (n > 0)
    r = jnp.sum(w * var, axis=-1) / jnp.where(ok, total, 1.0)
    return jnp.where(ok, r, 0.0)


def ordered_pairs(gold_ranks, mask=None):
    """Pairs with strictly different gold rank (METHOD 11).

    Args:
        gold_ranks: int or float[..., N], smaller is better, equal is tied.
        mask: bool[..., N] or None (all real).

    Returns:
        bool[..., N, N]: entry [a, b] is True when a and b are both real and a is
        strictly better than b. Tied pairs are False both ways.
    """
    g = jnp.asarray(gold_ranks, jnp.float32)
    m = _all_true(g) if mask is None else jnp.asarray(mask, bool)
    g = jnp.where(m, g, 0.0)
    both = m[..., :, None] & m[..., None, :]
    return both & (g[..., :, None] < g[..., None, :])


def _anchor_pair_weights(gold_ranks, mask):
    """float32[..., N, N] Eq. 15 pair weights 1 / ((j - i) 2^(i - 1)), 0 off-pairs.

    With ties, the position of an item is 1 + the number of items strictly
    better than it (METHOD 11).
    """
    better = ordered_pairs(gold_ranks, mask)
    pos = 1.0 + jnp.sum(better, axis=-2).astype(jnp.float32)  # [..., N]
    gap = pos[..., None, :] - pos[..., :, None]  # pos_b - pos_a
    denom = jnp.where(better, gap, 1.0) * jnp.exp2(pos - 1.0)[..., :, None]
    return jnp.where(better, 1.0 / denom, 0.0)


def anchor_reward(scores, gold_ranks, anchor_mask=None):
    """Anchor ranking reward, Eq. 15.

        R_anchor = sum_{i<j} log sigmoid(S_i - S_j) / ((j - i) 2^(i - 1))    <= 0

    summed over pairs with strictly different gold rank only; i, j are the
    1-indexed positions (1 + number of strictly better items).

    Args:
        scores: float32[..., N], S = E(x, y^0 | C) of the anchor responses.
        gold_ranks: int or float[..., N], smaller is better, equal is tied.
        anchor_mask: bool[..., N] or None (all real).

    Returns:
        float32[...]; 0 when the list has no ordered pair.
    """
    s = jnp.asarray(scores, jnp.float32)
    m = _all_true(s) if anchor_mask is None else jnp.asarray(anchor_mask, bool)
    s = jnp.where(m, s, 0.0)
    weights = _anchor_pair_weights(gold_ranks, m)
    diff = s[..., :, None] - s[..., None, :]
    return jnp.sum(weights * jax.nn.log_sigmoid(diff), axis=(-2, -1))


def anchor_reward_floor(gold_ranks, anchor_mask=None):
    """Worst achievable Eq. 15 value: every S_i - S_j = -1 (METHOD 11, case-13).

    Given to a rubric list that is invalid (unparseable, truncated, no valid
    item). It is strictly below the value of a valid rubric that ties every
    anchor (-2 ln 2 for N = 3), so an empty rubric is never rewarded as a tie.

    Args:
        gold_ranks: int or float[..., N], smaller is better, equal is tied.
        anchor_mask: bool[..., N] or None (all real).

    Returns:
        float32[...]; log sigmoid(-1) times the sum of Eq. 15 pair weights.
    """
    weights = _anchor_pair_weights(gold_ranks, anchor_mask)
    return jax.nn.log_sigmoid(-1.0) * jnp.sum(weights, axis=(-2, -1))


def anchor_reward_or_floor(scores, gold_ranks, anchor_mask, rubric_valid):
    """Eq. 15 for valid rubric lists, `anchor_reward_floor` for invalid ones.

    Args:
        scores: float32[..., N] anchor scores (any value where rubric_valid is
            False, NaN included).
        gold_ranks: int or float[..., N].
        anchor_mask: bool[..., N] or None.
        rubric_valid: bool[...], e.g. the `valid` output of `rubric_scores` and'ed
            with the parser's validity flag.

    Returns:
        float32[...].
    """
    valid = jnp.asarray(rubric_valid, bool)
    s = jnp.where(valid[..., None], jnp.asarray(scores, jnp.float32), 0.0)
    return jnp.where(valid, anchor_reward(s, gold_ranks, anchor_mask),
                     anchor_reward_floor(gold_ranks, anchor_mask))


def delta_gap(scores, gold_ranks, mask=None):
    """Mean score gap over strictly ordered pairs of a ranked list, Eq. 2.

        Delta_gap = mean over (y+, y-) with y+ strictly better of E(y+) - E(y-)

    Gold-tied pairs are skipped.

    Args:
        scores: float32[..., N], evaluator scores.
        gold_ranks: int or float[..., N], smaller is better, equal is tied.
        mask: bool[..., N] or None (all real).

    Returns:
        gap: float32[...], 0 where there is no ordered pair.
        num_pairs: int32[...], the number of ordered pairs (weight for pooling).
    """
    s = jnp.asarray(scores, jnp.float32)
    m = _all_true(s) if mask is None else jnp.asarray(mask, bool)
    s = jnp.where(m, s, 0.0)
    better = ordered_pairs(gold_ranks, m)
    diff = s[..., :, None] - s[..., None, :]
    count = jnp.sum(better, axis=(-2, -1)).astype(jnp.int32)
    total = jnp.sum(jnp.where(better, diff, 0.0), axis=(-2, -1))
    return total / jnp.maximum(count, 1).astype(jnp.float32), count


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
    spread = jnp.where(n > 1, hi - lo, 0.0)
    # Flat: max - min <= FLAT_RTOL * max(1, |mean|), in the scaled units.
    flat = (n <= 1) | (spread <= FLAT_RTOL * jnp.maximum(1.0 / scale, jnp.abs(mean)))
    std = jnp.sqrt(jnp.where(flat, 1.0, var))  # 1 for flat groups: no 0/0, no NaN gradient
    adv = dev / (std + ADV_EPS / scale)[ids]
    return (jnp.where(m & ~flat[ids], adv, 0.0), flat,
            jnp.where(flat, 0.0, std * scale))


def _reshape_groups(rewards, group_mask):
    """float[..., G] -> flat rows, masks and segment ids (one segment per group)."""
    r = jnp.asarray(rewards, jnp.float32)
    m = _all_true(r) if group_mask is None else jnp.asarray(group_mask, bool)
    groups = int(np.prod(r.shape[:-1], dtype=np.int64))
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
    m = _all_true(r) if mask is None else jnp.asarray(mask, bool)
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


def generator_advantages(r_disc, r_anchor, lam=1.0, mask=None, disc_weight=1.0):
    """Generator advantage A = z(R_disc) + lambda z(R_anchor), Eq. 24-25.

    Each reward is group-normalised on its own with `group_advantages` (never
    sum-then-normalise); a flat component contributes 0 and leaves the other
    intact (case-17). The objective ablations of METHOD 6 set the weight of one
    term to 0: disc_only is (disc_weight 1, lam 0), anchor_only (0, 1).

    Args:
        r_disc: float[..., G], Eq. 13 rewards of the G rubric lists of a group.
        r_anchor: float[..., G], Eq. 15 rewards (floor for invalid lists).
        lam: float, lambda in Eq. 17 (paper: 1).
        mask: bool[..., G] or None (all real).
        disc_weight: float, weight of z(R_disc) (1 in the paper's objective).

    Returns:
        advantages: float32[..., G].
        flat_disc: bool[...], flat indicator of the R_disc groups.
        flat_anchor: bool[...], flat indicator of the R_anchor groups.
    """
    a_disc, flat_disc = group_advantages(r_disc, mask)
    a_anchor, flat_anchor = group_advantages(r_anchor, mask)
    return disc_weight * a_disc + lam * a_anchor, flat_disc, flat_anchor


def generator_advantages_by_id(r_disc, r_anchor, lam, group_ids, num_groups,
                               mask=None, disc_weight=1.0):
    """`generator_advantages` with groups formed by id, Eq. 24-25.

    Args:
        r_disc, r_anchor: float[R].
        lam: float, lambda; disc_weight: float, weight of z(R_disc).
        group_ids: int[R], the (x, C) group of each rubric list.
        num_groups: static int.
        mask: bool[R] or None.

    Returns:
        advantages float32[R], flat_disc bool[num_groups], flat_anchor
        bool[num_groups].
    """
    a_disc, flat_disc = group_advantages_by_id(r_disc, group_ids, num_groups, mask)
    a_anchor, flat_anchor = group_advantages_by_id(r_anchor, group_ids,
                                                   num_groups, mask)
    return disc_weight * a_disc + lam * a_anchor, flat_disc, flat_anchor
