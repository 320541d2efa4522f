"""Per-file metrics of one evaluator with seeded bootstrap CIs, and their macro average.

METHOD 7 and 11 define the metrics; here they are kept per row so rows can be resampled:

    pairs_r, ties_r, correct_r   strict pairwise counts of row r (`metrics.pairwise_counts`)
    top1_r, top1_valid_r         strict top-1 of row r; valid when its gold is not all tied
    ndcg_r, ndcg_valid_r         nDCG of row r (`metrics.ndcg`)

A statistic of sample s (one of the n lists of AVG@n) on row weights w (1 each, or a
bootstrap replicate's counts, `intervals.resample_weights`):

    strict_acc        = sum_r w_r correct_rs / sum_r w_r pairs_r
    acc_ties_excluded = sum_r w_r correct_rs / sum_r w_r (pairs_r - ties_rs)
    tie_rate          = sum_r w_r ties_rs / sum_r w_r pairs_r
    top1              = sum_r w_r valid_r top1_rs / sum_r w_r valid_r        (same for ndcg)

and the reported value is its mean over the n samples. A replicate resamples rows, so the
n samples of a row travel together (for the ratios whose denominator does not depend on
the sample this is averaging the samples per row first); all methods of a file use the
same replicates, so differences between methods are paired. The 95% CI is the percentile
interval of the replicates. The macro average over files averages the files' replicates
(files resampled independently: a stratified bootstrap).

Axis legend (docs/CONVENTIONS.md): R rows of a file, n samples (AVG@n), Bt replicates.
"""
from __future__ import annotations

import numpy as np

from drubric_jax.evaluation import intervals, metrics

METRICS = ("strict_acc", "acc_ties_excluded", "tie_rate", "top1", "ndcg")
LISTWISE_METRICS = ("top1", "ndcg")  # reported for files with rows of K > 2


def _padded(rows, scores):
    """(scores, gold, mask) float32/float32/bool [R, K_max] of rows of different K."""
    n, kmax = len(rows), max(r.k for r in rows)
    s = np.zeros((n, kmax), np.float32)
    g = np.zeros((n, kmax), np.float32)
    m = np.zeros((n, kmax), bool)
    for i, (row, sc) in enumerate(zip(rows, scores)):
        s[i, :row.k] = sc
        g[i, :row.k] = row.gold
        m[i, :row.k] = True
    return s, g, m


def row_counts(rows, scores) -> dict:
    """Per-row counts of one sample: scores[i] float[K_i] for rows[i] (`benchmark.Row`).

    Returns:
        {"pairs", "ties", "correct", "top1", "top1_valid", "ndcg", "ndcg_valid"}, each
        float64[R].
    """
    s, g, m = _padded(rows, scores)
    pairs, ties, correct = (np.asarray(x, np.float64) for x in metrics.pairwise_counts(s, g, m))
    nd, nd_valid = (np.asarray(x, np.float64) for x in metrics.ndcg(s, g, m))
    return {"pairs": pairs, "ties": ties, "correct": correct,
            "top1": np.asarray(metrics.strict_top1(s, g, m), np.float64),
            # a row whose responses are all gold-tied has no best response
            "top1_valid": np.array([len(set(r.gold)) > 1 for r in rows], np.float64),
            "ndcg": nd, "ndcg_valid": nd_valid}


def statistics(per_sample: list, weights) -> dict:
    """Every metric of every sample on every row weighting.

    Args:
        per_sample: n dicts of `row_counts` (the same rows).
        weights: float[Bt, R] row weights (ones((1, R)) for the point estimate).

    Returns:
        {metric: float64[Bt, n]} for METRICS; nan where a denominator is 0 (no pair, no
        valid row).
    """
    w = np.asarray(weights, np.float64)

    def wsum(key):  # [Bt, n]
        return w @ np.stack([c[key] for c in per_sample], axis=1)

    def wvalid(key):  # the validity of a row does not depend on the sample
        return w @ np.stack([c[key] * c[f"{key}_valid"] for c in per_sample], axis=1)

    pairs, ties, correct = wsum("pairs"), wsum("ties"), wsum("correct")
    return {
        "strict_acc": intervals.ratio(correct, pairs),
        "acc_ties_excluded": intervals.ratio(correct, pairs - ties),
        "tie_rate": intervals.ratio(ties, pairs),
        "top1": intervals.ratio(wvalid("top1"), wsum("top1_valid")),
        "ndcg": intervals.ratio(wvalid("ndcg"), wsum("ndcg_valid")),
    }


def summarise(per_sample: list, weights) -> tuple:
    """Reported entries and bootstrap replicates of one method on one file.

    Args:
        per_sample: n dicts of `row_counts`.
        weights: float[Bt, R] bootstrap replicates of the file's rows.

    Returns:
        (entries, replicates): entries {metric: {"mean", "std", "per_sample", "ci95"}} with
        std over samples (ddof=1 when n > 1; 0 for n = 1) and nan for an undefined metric;
        replicates {metric: float64[Bt]}, the AVG@n statistic per replicate.
    """
    point = statistics(per_sample, np.ones((1, len(per_sample[0]["pairs"]))))
    reps = {k: np.mean(v, axis=1) for k, v in statistics(per_sample, weights).items()}
    entries = over_samples([{k: v[0, s] for k, v in point.items()}
                            for s in range(len(per_sample))])
    for key in METRICS:
        entries[key]["ci95"] = intervals.percentile_interval(reps[key])
    return entries, reps


def macro(file_replicates: dict, file_means: dict) -> dict:
    """Macro average over files of one method's metric, with its stratified-bootstrap CI.

    Args:
        file_replicates: {file: float[Bt]} (the same Bt for every file).
        file_means: {file: float} the per-file values (nan = undefined for that file).

    Returns:
        {"mean", "ci95", "n_files"}; over the files where the metric is defined.
    """
    files = [f for f in file_means if np.isfinite(file_means[f])]
    if not files:
        return {"mean": float("nan"), "ci95": [float("nan")] * 2, "n_files": 0}
    reps = np.mean([file_replicates[f] for f in files], axis=0)
    return {"mean": float(np.mean([file_means[f] for f in files])),
            "ci95": intervals.percentile_interval(reps), "n_files": len(files)}


def sample_extras(rows, scores) -> dict:
    """Metrics of one sample reported without CI: Delta_gap (Eq. 2, pooled over ordered
    pairs), n_pairs, and the RM-Bench splits when every row is an RM-Bench row.

    Args:
        rows: R `benchmark.Row`s; scores: R float[K_i].

    Returns:
        dict of floats.
    """
    s, g, m = _padded(rows, scores)
    gap, cnt = (np.asarray(x) for x in metrics.delta_gap(s, g, m))
    out = {"delta_gap": float((gap * cnt).sum() / max(cnt.sum(), 1)),
           "n_pairs": float(cnt.sum())}
    if all(r.rm_bench for r in rows):
        rb = metrics.rm_bench_accuracy(scores, [r.labels for r in rows],
                                       [r.styles for r in rows])
        for name in ("hard", "normal", "easy", "all"):
            out[f"rmbench_{name}"] = float(rb[name])
    return out


def over_samples(per_sample: list) -> dict:
    """{metric: {"mean", "std", "per_sample"}} over the n samples (std ddof=1 when n > 1)."""
    out = {}
    for key in per_sample[0]:
        vals = np.array([d[key] for d in per_sample], np.float64)
        std = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        out[key] = {"mean": float(vals.mean()), "std": std,
                    "per_sample": [float(v) for v in vals]}
    return out
