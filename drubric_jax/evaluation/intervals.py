"""Seeded bootstrap intervals for the evaluator metrics (METHOD 7 reports them per file).

A bootstrap replicate is a vector of counts: unit u (a row of a benchmark file, or a
response of the verifier check) is drawn w[b, u] times in replicate b. A statistic that is
a ratio of weighted sums then costs one matrix product per replicate set, and every
method scored on the same file sees the same replicates (paired differences are valid).

Axis legend (docs/CONVENTIONS.md): here U units resampled, Bt bootstrap replicates.
"""
from __future__ import annotations

import numpy as np

N_BOOTSTRAP = 1000  # replicates; the 2.5% / 97.5% quantiles move by ~0.01 between seeds


def resample_weights(n_units: int, n_boot: int, seed: int) -> np.ndarray:
    """Counts of each unit in each bootstrap resample (units drawn with replacement).

    Args:
        n_units: U, units in the sample (>= 1).
        n_boot: Bt, replicates (>= 1).
        seed: numpy Generator seed (the same seed gives the same replicates).

    Returns:
        float64[Bt, U]; every row sums to U.

    Raises:
        ValueError: n_units or n_boot < 1.
    """
    if n_units < 1 or n_boot < 1:
        raise ValueError(f"need n_units >= 1 and n_boot >= 1, got {n_units}, {n_boot}")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_units, size=(n_boot, n_units))
    w = np.zeros((n_boot, n_units), np.float64)
    np.add.at(w, (np.arange(n_boot)[:, None], draws), 1.0)
    return w


def percentile_interval(replicates, level: float = 0.95) -> list:
    """[lo, hi], the (1 - level) / 2 and (1 + level) / 2 quantiles of the finite replicates
    (percentile bootstrap); [nan, nan] when none is finite."""
    r = np.asarray(replicates, np.float64)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return [float("nan"), float("nan")]
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(r, [a, 1.0 - a])
    return [float(lo), float(hi)]


def ratio(num, den):
    """num / den elementwise, nan where den == 0 (a statistic with nothing to count)."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
