"""The statistics of the policy-reward experiment (`evaluation.checks_policy`): paired
differences over held-out prompts and shares of the gold arm's gain, per seed (a
percentile bootstrap over prompts) and pooled over seeds (the two-stage bootstrap of METHOD
15: seeds, then prompts by id), their spread over seeds, and an arm against an arm.

Axis legend (docs/CONVENTIONS.md): U held-out prompts, Bt bootstrap replicates.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from drubric_jax.evaluation.intervals import (percentile_interval, ratio, resample_weights,
                                              two_stage_bootstrap, two_stage_ratio)


def paired_difference(after: Sequence[float], before: Sequence[float], n_boot: int,
                      seed: int, level: float = 0.95) -> dict:
    """mean(after) - mean(before) over the prompts both scored, with a paired percentile
    bootstrap CI (the same replicate weights for both: prompts are the unit).

    Returns:
        {"before", "after", "difference", "ci": [lo, hi], "prompts": U}; nan values when no
        prompt has both scores.
    """
    a, b = np.asarray(after, np.float64), np.asarray(before, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired scores differ in length: {a.shape} vs {b.shape}")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if a.size == 0:
        nan = float("nan")
        return {"before": nan, "after": nan, "difference": nan, "ci": [nan, nan], "prompts": 0}
    w = resample_weights(a.size, n_boot, seed)
    return {"before": float(b.mean()), "after": float(a.mean()),
            "difference": float(a.mean() - b.mean()),
            "ci": percentile_interval(w @ (a - b) / a.size, level), "prompts": int(a.size)}


def share_of_gold(arm: Sequence[float], gold: Sequence[float], p0: Sequence[float],
                  n_boot: int, seed: int, level: float = 0.95) -> dict:
    """An arm's held-out gain over P_0 as a share of the gold arm's gain on the same prompts:
    sum(arm - p0) / sum(gold - p0), with a paired percentile-bootstrap CI (one set of
    replicate weights over prompts for both sums). A replicate whose gold gain is <= 0 has
    no share and is left out; "kept" is the fraction of replicates that have one (below
    1 - level / 2 the interval says little: the gold arm's own gain is within chance).

    Returns:
        {"share", "ci": [lo, hi], "kept", "prompts"}; nan share when the gold gain is <= 0.
    """
    a, g, b = (np.asarray(x, np.float64) for x in (arm, gold, p0))
    keep = np.isfinite(a) & np.isfinite(g) & np.isfinite(b)
    num, den = (a - b)[keep], (g - b)[keep]
    nan = float("nan")
    if num.size == 0:
        return {"share": nan, "ci": [nan, nan], "kept": 0.0, "prompts": 0}
    w = resample_weights(num.size, n_boot, seed)
    reps = ratio(w @ num, w @ den)
    return {"share": float(ratio(num.sum(), den.sum())), "ci": percentile_interval(reps, level),
            "kept": float(np.mean(np.isfinite(reps))), "prompts": int(num.size)}


def pooled_difference(after: Sequence, before: Sequence, n_boot: int, seed,
                      ids: Sequence | None = None, level: float = 0.95) -> dict:
    """A paired difference pooled over seeds: the mean over seeds of each seed's
    mean(after - before) over the prompts both scored, with the two-stage bootstrap of
    METHOD 15 (`intervals.two_stage_bootstrap`: seeds drawn, then prompts).

    Args:
        after, before: S sequences each; after[s], before[s] float[U_s], seed s's scores of
            the same prompts in the same order (before may be P_0's, the same in every
            seed). A prompt with a nan on either side is left out of its seed.
        n_boot: Bt replicates; seed: their numpy seed (or Generator).
        ids: None, or S sequences of prompt ids matching after[s]: a prompt in several
            seeds is drawn once for all the drawn seeds (`intervals.two_stage_weights`).
        level: the interval's coverage.

    Returns:
        {"before", "after" (the same seed-then-prompt means of each side), "difference",
        "ci": [lo, hi], "se", "minimal_detectable" (2.8 se: the smallest difference the
        design detects with 80% power), "zero_inside_ci", "kept", "prompts" (distinct
        prompts kept), "seeds": S, "interval" (its name)}; nan values when a seed has no
        prompt scored on both sides.

    Raises:
        ValueError: no seed, or after[s] and before[s] (or ids[s]) of different lengths.
    """
    if len(after) != len(before) or not after:
        raise ValueError(f"after for {len(after)} seeds, before for {len(before)}")
    a = [np.asarray(x, np.float64) for x in after]
    b = [np.asarray(x, np.float64) for x in before]
    for s, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape:
            raise ValueError(f"seed {s}: paired scores differ in length: {x.shape} vs {y.shape}")
    d = [x - y for x, y in zip(a, b)]  # nan where either side is
    out = two_stage_bootstrap(d, n_boot, seed, level, ids=ids)
    keep = [np.isfinite(x) for x in d]
    n = [max(int(k.sum()), 1) for k in keep]
    side = {name: float(np.mean([np.sum(np.where(k, v, 0.0)) / m
                                 for v, k, m in zip(vals, keep, n)]))
            for name, vals in (("before", b), ("after", a))}
    return {**side, "difference": out["mean"],
            **{k: out[k] for k in ("ci", "se", "minimal_detectable", "zero_inside_ci",
                                   "kept", "seeds", "interval")},
            "prompts": out["distinct_units"]}


def pooled_share_of_gold(arm: Sequence, gold: Sequence, p0: Sequence[float], n_boot: int,
                         seed, ids: Sequence | None = None, level: float = 0.95) -> dict:
    """An arm's gain over P_0 as a share of the gold arm's, pooled over seeds:
    sum_s sum_i w (arm - p0) / sum_s sum_i w (gold - p0), each seed weighing 1 / S, with the
    two-stage bootstrap of METHOD 15 (`intervals.two_stage_ratio`); a replicate whose gold
    gain is <= 0 has no share and is left out ("kept": the fraction that has one).

    Args:
        arm, gold: S sequences, seed s's held-out scores float[U] (the same prompts as p0).
        p0: P_0's scores float[U]; n_boot, seed, ids, level: as `pooled_difference`.

    Returns:
        {"share", "ci", "kept", "prompts", "seeds", "interval"}.

    Raises:
        ValueError: arm and gold of different seed counts.
    """
    b = np.asarray(p0, np.float64)
    num = [np.asarray(x, np.float64) - b for x in arm]
    den = [np.asarray(x, np.float64) - b for x in gold]
    out = two_stage_ratio(num, den, n_boot, seed, level, ids=ids)
    return {"share": out["mean"], "ci": out["ci"], "kept": out["kept"],
            "prompts": out["distinct_units"], "seeds": out["seeds"],
            "interval": out["interval"]}


def seed_spread(values: Sequence[float]) -> dict:
    """{"mean", "sd" (ddof 1; nan for one seed), "min", "max", "seeds"} of per-seed values."""
    v = np.asarray([x for x in values if np.isfinite(x)], np.float64)
    if v.size == 0:
        nan = float("nan")
        return {"mean": nan, "sd": nan, "min": nan, "max": nan, "seeds": 0}
    return {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if v.size > 1 else float("nan"),
            "min": float(v.min()), "max": float(v.max()), "seeds": int(v.size)}


def arm_versus_arm(after: dict, b: str, a: str, seeds: Sequence[int], n_boot: int,
                   seed: int, ids: Sequence | None = None) -> dict:
    """{seed: paired difference b - a of the held-out gold scores (`paired_difference`)}
    over the seeds both arms have, and "pooled" where they share 2 or more: the two-stage
    bootstrap of METHOD 15 over those seeds (`pooled_difference`; `ids`: the held-out
    prompt ids, the same in every seed, or None). `after`: {(arm, seed): per-prompt
    scores}."""
    both = [s for s in seeds if (a, s) in after and (b, s) in after]
    out = {str(s): paired_difference(after[(b, s)], after[(a, s)], n_boot, seed)
           for s in both}
    if len(both) > 1:
        out["pooled"] = pooled_difference([after[(b, s)] for s in both],
                                          [after[(a, s)] for s in both], n_boot, seed,
                                          None if ids is None else [ids] * len(both))
    return out
