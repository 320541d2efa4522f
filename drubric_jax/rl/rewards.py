"""Rubric scores and generator rewards (METHOD sections 3, 11, 12): Eq. 12, 13, 15, 2.

Group advantages (Eq. 21, 24-25) are in `drubric_jax.rl.advantages`; the generator's rewards,
as one registry, in `drubric_jax.rl.generator_rewards`.

Axis legend (docs/CONVENTIONS.md): K responses per prompt, G rubric lists (or responses)
in one GRPO group, M rubric items, A responses of an anchor list (or of any ranked list),
R flat rows of a batch. A leading `...` is any number of batch axes (B, or B x G) shared
by all arguments.

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

from drubric_jax.text.rubric_format import MAX_WEIGHT, MIN_WEIGHT


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
    # Dropped and padded items may hold any verdict (NaN included): zeroed before the sums.
    v = jnp.where(keep[..., None, :], jnp.asarray(verdicts, jnp.float32), 0.0)
    total = jnp.sum(w, axis=-1)
    valid = total > 0
    weighted = jnp.sum(v * w[..., None, :], axis=-1)
    # An empty rubric divides by 1 (no 0/0) and then scores 0 (METHOD 3, 11).
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
    # Padded responses and dropped items contribute nothing to the means below.
    v = jnp.where(keep[..., None, :] & resp[..., :, None], v, 0.0)
    n = jnp.sum(resp, axis=-1)
    # Population variance: divide by K, not K - 1 (Eq. 13 is vbar (1 - vbar)).
    nf = jnp.maximum(n, 1)[..., None].astype(jnp.float32)
    vbar = jnp.sum(v, axis=-2) / nf                                       # [..., M]
    dev = jnp.where(resp[..., :, None], v - vbar[..., None, :], 0.0)
    # 0/1 items take the paper's closed form (bit for bit); soft items the two-pass variance.
    binary = jnp.all((v == 0.0) | (v == 1.0), axis=-2)
    var = jnp.where(binary, vbar * (1.0 - vbar), jnp.sum(dev * dev, axis=-2) / nf)
    total = jnp.sum(w, axis=-1)
    # An empty rubric or no real response: R_disc = 0 (METHOD 3), not 0/0.
    ok = (total > 0) & (n > 0)
    r = jnp.sum(w * var, axis=-1) / jnp.where(ok, total, 1.0)
    return jnp.where(ok, r, 0.0)


def ordered_pairs(gold_ranks, mask=None):
    """Pairs with strictly different gold rank (METHOD 11).

    Args:
        gold_ranks: int or float[..., A], smaller is better, equal is tied.
        mask: bool[..., A] or None (all real).

    Returns:
        bool[..., A, A]: entry [a, b] is True when a and b are both real and a is
        strictly better than b. Tied pairs are False both ways.
    """
    g = jnp.asarray(gold_ranks, jnp.float32)
    m = _all_true(g) if mask is None else jnp.asarray(mask, bool)
    # A padded rank may be NaN: zeroed, and `both` drops its pairs anyway.
    g = jnp.where(m, g, 0.0)
    both = m[..., :, None] & m[..., None, :]
    # Strict <: gold-tied items form no pair in either direction (METHOD 11).
    return both & (g[..., :, None] < g[..., None, :])


def _anchor_pair_weights(gold_ranks, mask):
    """float32[..., A, A] Eq. 15 pair weights 1 / ((j - i) 2^(i - 1)), 0 off-pairs.

    With ties, the position of an item is 1 + the number of items strictly
    better than it (METHOD 11).
    """
    better = ordered_pairs(gold_ranks, mask)
    # Column sums: for each item, how many items are strictly better than it.
    pos = 1.0 + jnp.sum(better, axis=-2).astype(jnp.float32)  # [..., A]
    gap = pos[..., None, :] - pos[..., :, None]  # pos_b - pos_a
    # (j - i) 2^(i - 1), i the better item's position; off-pairs get 1 (no 1/0, masked after).
    denom = jnp.where(better, gap, 1.0) * jnp.exp2(pos - 1.0)[..., :, None]
    return jnp.where(better, 1.0 / denom, 0.0)


def anchor_reward(scores, gold_ranks, anchor_mask=None):
    """Anchor ranking reward, Eq. 15.

        R_anchor = sum_{i<j} log sigmoid(S_i - S_j) / ((j - i) 2^(i - 1))    <= 0

    summed over pairs with strictly different gold rank only; i, j are the
    1-indexed positions (1 + number of strictly better items).

    Args:
        scores: float32[..., A], S = E(x, y^0 | C) of the anchor responses.
        gold_ranks: int or float[..., A], smaller is better, equal is tied.
        anchor_mask: bool[..., A] or None (all real).

    Returns:
        float32[...]; 0 when the list has no ordered pair.
    """
    s = jnp.asarray(scores, jnp.float32)
    m = _all_true(s) if anchor_mask is None else jnp.asarray(anchor_mask, bool)
    # A NaN score at a padded slot would survive its 0 pair weight (0 * NaN = NaN).
    s = jnp.where(m, s, 0.0)
    weights = _anchor_pair_weights(gold_ranks, m)
    diff = s[..., :, None] - s[..., None, :]
    # diff[a, b] = S_a - S_b; only pairs with a strictly better than b carry weight.
    return jnp.sum(weights * jax.nn.log_sigmoid(diff), axis=(-2, -1))


def anchor_reward_floor(gold_ranks, anchor_mask=None):
    """Worst achievable Eq. 15 value: every S_i - S_j = -1 (METHOD 11, case-13).

    Given to a rubric list that is invalid (unparseable, truncated, no valid
    item). It is strictly below the value of a valid rubric that ties every
    anchor (-2 ln 2 for A = 3), so an empty rubric is never rewarded as a tie.

    Args:
        gold_ranks: int or float[..., A], smaller is better, equal is tied.
        anchor_mask: bool[..., A] or None (all real).

    Returns:
        float32[...]; log sigmoid(-1) times the sum of Eq. 15 pair weights.
    """
    weights = _anchor_pair_weights(gold_ranks, anchor_mask)
    return jax.nn.log_sigmoid(-1.0) * jnp.sum(weights, axis=(-2, -1))


def anchor_reward_or_floor(scores, gold_ranks, anchor_mask, rubric_valid):
    """Eq. 15 for valid rubric lists, `anchor_reward_floor` for invalid ones.

    Args:
        scores: float32[..., A] anchor scores (any value where rubric_valid is
            False, NaN included).
        gold_ranks: int or float[..., A].
        anchor_mask: bool[..., A] or None.
        rubric_valid: bool[...], e.g. the `valid` output of `rubric_scores` and'ed
            with the parser's validity flag.

    Returns:
        float32[...].
    """
    valid = jnp.asarray(rubric_valid, bool)
    # Zeroed first: an invalid list's scores may be NaN, and a NaN in the branch jnp.where
    # does not select still poisons gradients and trips jax_debug_nans.
    s = jnp.where(valid[..., None], jnp.asarray(scores, jnp.float32), 0.0)
    return jnp.where(valid, anchor_reward(s, gold_ranks, anchor_mask),
                     anchor_reward_floor(gold_ranks, anchor_mask))


def delta_gap(scores, gold_ranks, mask=None):
    """Mean score gap over strictly ordered pairs of a ranked list, Eq. 2.

        Delta_gap = mean over (y+, y-) with y+ strictly better of E(y+) - E(y-)

    Gold-tied pairs are skipped.

    Args:
        scores: float32[..., A], evaluator scores.
        gold_ranks: int or float[..., A], smaller is better, equal is tied.
        mask: bool[..., A] or None (all real).

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
    # No ordered pair: 0, not 0/0.
    return total / jnp.maximum(count, 1).astype(jnp.float32), count
