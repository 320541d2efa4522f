"""Evaluator metrics: strict pairwise accuracy, strict top-1, nDCG, Delta_gap, RM-Bench,
and the AUC of a score against binary truth (the verifier check).

METHOD sections 7 and 11. Ties in predicted scores are never broken in the
evaluator's favour (case-18): a tied pair is wrong, a tied top is wrong, and
nDCG averages the gains of a tied block so input order never matters.

Axis legend (docs/CONVENTIONS.md): K responses per list (2 for pair benchmarks,
6 for RM-Bench, 7 for listwise sets); `...` any batch axes (lists).

Layouts: scores are float[..., K] (higher is better); gold ranks are numbers
per response, smaller is better and equal means tied (`data.gold_ranks` gives
them 1-based; only their order matters here); masks are bool[..., K] marking
real responses. Predicted ties are exact float equality: scores from Eq. 12
with integer weights are ratios of small integers, so equal verdict sums
compare equal.
"""

from typing import NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from drubric_jax.rl.rewards import delta_gap, ordered_pairs

__all__ = [
    "auc", "delta_gap", "pairwise_counts", "pairwise_accuracy", "strict_top1", "ndcg",
    "RMBenchPair", "rm_bench_pairs", "rm_bench_accuracy",
]

RM_BENCH_STYLE_ORDER = ("concise", "detailed_plain", "detailed_markdown")


def _mask(scores, mask):
    return jnp.ones(scores.shape, bool) if mask is None else jnp.asarray(mask, bool)


def pairwise_counts(scores, gold_ranks, mask=None):
    """Per-list counts of strict pairwise accuracy (METHOD 7 and 11).

    A pair (a better than b in gold) is correct iff S_a > S_b; a predicted tie
    is wrong. Gold-tied pairs are skipped.

    Args:
        scores: float[..., K].
        gold_ranks: int or float[..., K], smaller is better, equal is tied.
        mask: bool[..., K] or None (all real).

    Returns:
        (n_pairs, n_ties, n_correct), each float32[...] (one count per list).
    """
    s = jnp.asarray(scores, jnp.float32)
    m = _mask(s, mask)
    s = jnp.where(m, s, 0.0)  # padding may hold NaN; keep the differences finite
    pairs = ordered_pairs(gold_ranks, m)
    diff = s[..., :, None] - s[..., None, :]

    def count(x):
        return jnp.sum(x, axis=(-2, -1)).astype(jnp.float32)

    return count(pairs), count(pairs & (diff == 0)), count(pairs & (diff > 0))


def pairwise_accuracy(scores, gold_ranks, mask=None):
    """Strict pairwise accuracy over all gold-ordered pairs (METHOD 7 and 11).

    `pairwise_counts` pooled over all lists.

    Args:
        scores: float[..., K].
        gold_ranks: int or float[..., K], smaller is better, equal is tied.
        mask: bool[..., K] or None (all real).

    Returns:
        dict of float32 scalars: strict (ties wrong), ties_excluded (correct /
        pairs without a predicted tie), tie_rate, n_pairs, n_ties, n_correct.
        Ratios are 0 when their denominator is 0.
    """
    n_pairs, n_ties, n_correct = (jnp.sum(x) for x in pairwise_counts(scores, gold_ranks,
                                                                        mask))
    decided = n_pairs - n_ties
    # No pairs at all (e.g. a fully gold-tied list) gives 0, not NaN.
    return {
        "strict": n_correct / jnp.maximum(n_pairs, 1.0),
        "ties_excluded": n_correct / jnp.maximum(decided, 1.0),
        "tie_rate": n_ties / jnp.maximum(n_pairs, 1.0),
        "n_pairs": n_pairs,
        "n_ties": n_ties,
        "n_correct": n_correct,
    }


def strict_top1(scores, gold_ranks, mask=None):
    """Strict top-1 correctness per list (METHOD 7 and 11, case-18).

    Correct iff exactly one real response has the highest score and that
    response is gold-best (no argmax tie-breaking). When several responses are
    tied for gold-best, the unique predicted maximum may be any of them.

    Args:
        scores: float[..., K].
        gold_ranks: int or float[..., K], smaller is better, equal is tied.
        mask: bool[..., K] or None (all real).

    Returns:
        bool[...]; False for a list with no real response. Average it for the
        accuracy.
    """
    s = jnp.asarray(scores, jnp.float32)
    m = _mask(s, mask)
    s = jnp.where(m, s, -jnp.inf)  # padding is never the maximum ...
    is_max = m & (s == jnp.max(s, axis=-1, keepdims=True))
    g = jnp.where(m, jnp.asarray(gold_ranks, jnp.float32), jnp.inf)  # ... nor gold-best
    is_gold_best = m & (g == jnp.min(g, axis=-1, keepdims=True))
    unique = jnp.sum(is_max, axis=-1) == 1
    return unique & jnp.any(is_max & is_gold_best, axis=-1)


def _linear_gains(gold_ranks, mask):
    """float32[..., K] linear gains: #strictly worse + (#tied others) / 2.

    Best of K untied gets K - 1, worst gets 0; a gold-tied block gets the mean
    of the gains its positions would have had.
    """
    g = jnp.where(mask, jnp.asarray(gold_ranks, jnp.float32), 0.0)
    worse = jnp.sum(ordered_pairs(g, mask), axis=-1)
    both = mask[..., :, None] & mask[..., None, :]
    tied_others = jnp.sum(both & (g[..., :, None] == g[..., None, :]), axis=-1) - 1
    return jnp.where(mask, worse + 0.5 * jnp.maximum(tied_others, 0), 0.0)


def ndcg(scores, gold_ranks, mask=None, gold_gains=None):
    """nDCG of the predicted score ranking against the gold one (METHOD 7, 11).

        DCG = sum_i gain_i * d_i,  discount 1 / log2(rank + 1), rank 1-indexed,

    where, for a block of t responses tied in prediction at ranks h+1..h+t,
    d_i is the mean discount over those ranks (so the block's DCG is its mean
    gain times its summed discount and input order never changes the value).
    IDCG sorts the gains in decreasing order.

    Args:
        scores: float[..., K], predicted scores.
        gold_ranks: int or float[..., K], smaller is better, equal is tied.
        mask: bool[..., K] or None (all real).
        gold_gains: float[..., K] or None. None: linear gains (`_linear_gains`,
            best of K gets K-1 ... worst 0). Otherwise the gold scores are the
            gains (must be >= 0).

    Returns:
        ndcg: float32[...] in [0, 1]; 0 where not valid.
        valid: bool[...], False when the real responses have fewer than two
            distinct gains (every order is ideal, e.g. a fully gold-tied list or a
            list of one) or IDCG is 0; exclude those lists from a mean.
    """
    s = jnp.asarray(scores, jnp.float32)
    m = _mask(s, mask)
    n = s.shape[-1]
    if gold_gains is None:
        gains = _linear_gains(gold_ranks, m)
    else:
        gains = jnp.where(m, jnp.asarray(gold_gains, jnp.float32), 0.0)
    s = jnp.where(m, s, 0.0)
    # Each response sits in a predicted block: `higher` responses above it, `tied` ones
    # (itself included) sharing the block's ranks higher+1..higher+tied.
    both = m[..., :, None] & m[..., None, :]
    higher = jnp.sum(both & (s[..., None, :] > s[..., :, None]), axis=-1)
    tied = jnp.sum(both & (s[..., None, :] == s[..., :, None]), axis=-1)
    discounts = 1.0 / jnp.log2(jnp.arange(1, n + 1, dtype=jnp.float32) + 1.0)
    # cum[r] = sum of the first r discounts, so a block's summed discount is a difference.
    cum = jnp.concatenate([jnp.zeros((1,), jnp.float32), jnp.cumsum(discounts)])
    block = (cum[higher + tied] - cum[higher]) / jnp.maximum(tied, 1)
    dcg = jnp.sum(jnp.where(m, gains * block, 0.0), axis=-1)
    ideal = -jnp.sort(-jnp.where(m, gains, 0.0), axis=-1)
    idcg = jnp.sum(ideal * discounts, axis=-1)
    hi = jnp.max(jnp.where(m, gains, -jnp.inf), axis=-1)
    lo = jnp.min(jnp.where(m, gains, jnp.inf), axis=-1)
    valid = (idcg > 0) & (hi > lo)
    return jnp.where(valid, dcg / jnp.where(valid, idcg, 1.0), 0.0), valid


class RMBenchPair(NamedTuple):
    """One RM-Bench chosen-vs-rejected comparison (indices into the row)."""
    chosen: int
    rejected: int
    difficulty: str  # "hard", "normal" or "easy"


def rm_bench_pairs(labels: Sequence[str], styles: Sequence[str]):
    """The chosen x rejected pairs of one RM-Bench row, with difficulty.

    hard: the chosen response has the plainer style (concise < detailed_plain
    < detailed_markdown); normal: same style; easy: otherwise. A full row (3
    chosen, 3 rejected) gives 9 pairs: 3 hard, 3 normal, 3 easy.

    Args:
        labels: meta.label, "chosen" or "rejected" per response.
        styles: meta.style per response.

    Returns:
        list[RMBenchPair] in (chosen index, rejected index) order.

    Raises:
        ValueError: lengths differ, or an unknown label or style.
    """
    if len(labels) != len(styles):
        raise ValueError(f"{len(labels)} labels but {len(styles)} styles")
    for label in labels:
        if label not in ("chosen", "rejected"):
            raise ValueError(f"unknown RM-Bench label {label!r}")
    level = []  # 0 = plainest style
    for style in styles:
        if style not in RM_BENCH_STYLE_ORDER:
            raise ValueError(f"unknown RM-Bench style {style!r}")
        level.append(RM_BENCH_STYLE_ORDER.index(style))
    pairs = []
    for c, lc in enumerate(labels):
        if lc != "chosen":
            continue
        for r, lr in enumerate(labels):
            if lr != "rejected":
                continue
            if level[c] < level[r]:
                difficulty = "hard"
            elif level[c] == level[r]:
                difficulty = "normal"
            else:
                difficulty = "easy"
            pairs.append(RMBenchPair(c, r, difficulty))
    return pairs


def rm_bench_accuracy(scores, labels, styles):
    """RM-Bench strict accuracy per difficulty, pooled over rows and pairs.

    Args:
        scores: sequence of float[K] per row (predicted scores).
        labels: sequence of meta.label lists per row.
        styles: sequence of meta.style lists per row.

    Returns:
        dict: for each of "hard", "normal", "easy", "all": strict accuracy
        (predicted tie wrong) as float, plus "n_<name>" pair counts and
        "ties_<name>" predicted-tie counts. Accuracy is 0.0 with no pairs.

    Raises:
        ValueError: mismatched row counts, or as `rm_bench_pairs`.
    """
    if not len(scores) == len(labels) == len(styles):
        raise ValueError("scores, labels and styles need one entry per row")
    names = ("hard", "normal", "easy", "all")
    correct = dict.fromkeys(names, 0)
    total = dict.fromkeys(names, 0)
    ties = dict.fromkeys(names, 0)
    for row_scores, row_labels, row_styles in zip(scores, labels, styles):
        s = np.asarray(row_scores, np.float64)
        for pair in rm_bench_pairs(row_labels, row_styles):
            for name in (pair.difficulty, "all"):
                total[name] += 1
                correct[name] += int(s[pair.chosen] > s[pair.rejected])  # a tie is wrong
                ties[name] += int(s[pair.chosen] == s[pair.rejected])
    out = {}
    for name in names:
        out[name] = correct[name] / total[name] if total[name] else 0.0
        out[f"n_{name}"] = total[name]
        out[f"ties_{name}"] = ties[name]
    return out


def auc(scores, labels, weights=None):
    """Area under the ROC curve of `scores` for `labels` (Mann-Whitney U / (n_pos n_neg)).

        AUC = sum_{i pos, j neg} w_i w_j ([s_i > s_j] + [s_i = s_j] / 2)
              / (sum_{pos} w_i  sum_{neg} w_j)

    Ties count half, so constant scores give 0.5; 1 means every positive scores above
    every negative. Weights are bootstrap counts (`intervals.resample_weights`).

    Args:
        scores: float[N].
        labels: bool[N], True = positive.
        weights: None (all 1) or float[..., N] (one AUC per leading index).

    Returns:
        float64 (no weights) or float64[...]; nan when a class has zero weight.
    """
    s = np.asarray(scores, np.float64)
    y = np.asarray(labels, bool)
    w = np.ones(s.shape) if weights is None else np.asarray(weights, np.float64)
    sp, sn = s[y], s[~y]
    wins = (sp[:, None] > sn[None, :]) + 0.5 * (sp[:, None] == sn[None, :])  # [P, N]
    wp, wn = w[..., y], w[..., ~y]
    num = np.einsum("...p,pn,...n->...", wp, wins, wn)
    den = wp.sum(-1) * wn.sum(-1)
    out = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return float(out) if weights is None else out
