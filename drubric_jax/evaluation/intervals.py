"""Seeded bootstrap intervals for the evaluator metrics (METHOD 7 reports them per file).

A bootstrap replicate is a vector of counts: unit u (a row of a benchmark file, or a
response of the verifier check) is drawn w[b, u] times in replicate b. A statistic that is
a ratio of weighted sums then costs one matrix product per replicate set, and every
method scored on the same file sees the same replicates (paired differences are valid).

A figure pooled over S seeds uses the two-stage bootstrap of METHOD 15 instead
(`two_stage_weights`: draw S seeds with replacement, then units within each drawn seed),
which counts the seeds' spread as well as the units'; beside a difference whose interval
holds 0 the reports print the smallest difference the design could have detected
(`minimal_detectable`: about 2.8 standard errors, 80% power at two-sided 5%).

Axis legend (docs/CONVENTIONS.md): here U units resampled (distinct unit ids in the
two-stage bootstrap), N = sum_s n_s units of S seeds laid out seed-major, Bt bootstrap
replicates.
"""
from __future__ import annotations

from statistics import NormalDist

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


# ----------------------------------------------------------------------------- seeds pooled
#
# METHOD 15 ("Two-stage bootstrap", "Power"). A figure pooled over S seeds (runs of the same
# arm that differ only in config.seed) has two sources of spread: the units (held-out prompts,
# or anchor lists) and the seeds. A bootstrap of the units alone, on each unit's seed mean,
# hides the second. A two-stage replicate draws S seeds with replacement, then units within
# each drawn seed, and takes the mean of the drawn seeds' unit means.

POWER_FACTOR = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.80)
"""z_{0.975} + z_{0.80} = 2.80: a true difference of POWER_FACTOR standard errors is
detected (its two-sided 95% interval excludes 0) 80% of the time (METHOD 15, "Power")."""


def two_stage_name(unit: str = "prompts") -> str:
    """The interval's name as every table header and pooled line prints it: "two-stage
    bootstrap: seeds, then <unit>" (METHOD 15)."""
    return f"two-stage bootstrap: seeds, then {unit}"


def _seed_offsets(sizes) -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(sizes, np.int64).reshape(-1)
    if n.size < 1 or np.any(n < 1):
        raise ValueError(f"need one or more seeds, each with >= 1 unit; got sizes {n.tolist()}")
    return n, np.concatenate([[0], np.cumsum(n)[:-1]])


def two_stage_point_weights(sizes) -> np.ndarray:
    """The weights of the pooled point estimate: unit i of seed s weighs 1 / (S n_s), so
    that `w @ x` is the mean over the seeds of each seed's unit mean (METHOD 15).

    Args:
        sizes: S ints, n_s >= 1 units of seed s; the units are laid out seed-major
            (seed 0's n_0 units, then seed 1's, ...), N = sum n_s.

    Returns:
        float64[N], summing to 1.

    Raises:
        ValueError: no seed, or a seed with no unit.
    """
    n, _ = _seed_offsets(sizes)
    return np.repeat(1.0 / (n.size * n), n)


def draw_seeds(n_seeds: int, n_boot: int, seed) -> np.ndarray:
    """Stage one of the two-stage bootstrap: S seeds drawn with replacement per replicate.

    Args:
        n_seeds: S (>= 1); n_boot: Bt (>= 1); seed: an int or numpy Generator.

    Returns:
        int64[Bt, S]: drawn[b, j] is the seed in slot j of replicate b.

    Raises:
        ValueError: n_seeds or n_boot < 1.
    """
    if n_seeds < 1 or n_boot < 1:
        raise ValueError(f"need n_seeds >= 1 and n_boot >= 1, got {n_seeds}, {n_boot}")
    return np.random.default_rng(seed).integers(0, n_seeds, size=(n_boot, n_seeds))


def two_stage_weights(sizes, n_boot: int, seed, unit_ids=None, drawn=None) -> np.ndarray:
    """Weights of the two-stage bootstrap replicates (METHOD 15): replicate b of a linear
    statistic is `W[b] @ x`, of a ratio `ratio(W @ num, W @ den)`.

    Stage one draws S seeds with replacement (`draw_seeds`; seed s drawn m_bs times).
    Stage two:
      - unit_ids None: each drawn seed (each of its m_bs copies) draws its own n_s units
        with replacement; W[b, (s, i)] = (unit i's draws over the copies of s) / (S n_s).
        Units of different seeds are different units.
      - unit_ids given: units with the same id are one unit seen in several seeds (the same
        held-out prompt answered by every seed's policy; the same anchor list drawn into
        several seeds' held-out lists). The ids are drawn instead: U draws with replacement
        from the U distinct ids, once per replicate and shared by every drawn seed; a drawn
        seed's mean is over its own units weighted by their ids' counts c_b (a seed drawn
        twice counts twice, with the same id draw):
        W[b, (s, i)] = m_bs / S * c_b[id(s, i)] / sum_{j in s} c_b[id(s, j)]. Drawing the
        ids apart for each seed would treat a unit's shared difficulty as independent
        noise in each seed and count it about S times too little (METHOD 15: lists are
        resampled by list id, not by (seed, list) pairs). A replicate in which a drawn
        seed got none of its ids has no mean: its row is nan (`percentile_interval`
        drops it).
    Every random choice comes from `seed`; the same arguments give the same W, so figures
    computed with the same sizes, ids and seed are paired replicate by replicate.

    Args:
        sizes: S ints, n_s >= 1 units of seed s, laid out seed-major (seed 0's units, then
            seed 1's, ...), N = sum n_s.
        n_boot: Bt replicates (>= 1).
        seed: an int or a numpy Generator (`np.random.default_rng` accepts both; a
            Generator is advanced, so two calls on one Generator draw independently).
        unit_ids: None, or N hashable ids in the seed-major layout (ids may repeat within
            a seed: those units are drawn together).
        drawn: None, or int[Bt, S] the stage-one draw to use (`draw_seeds`; e.g. the same
            seeds for two independent samples of each seed, `two_stage_unpaired`).

    Returns:
        float64[Bt, N]; each finite row sums to 1.

    Raises:
        ValueError: no seed, a seed with no unit, n_boot < 1, unit_ids of a length other
            than N, or `drawn` of another shape than [Bt, S].
    """
    n, offsets = _seed_offsets(sizes)
    s_count, total = n.size, int(n.sum())
    rng = np.random.default_rng(seed)
    if drawn is None:
        drawn = draw_seeds(s_count, n_boot, rng)
    drawn = np.asarray(drawn, np.int64)
    if drawn.shape != (n_boot, s_count) or n_boot < 1:
        raise ValueError(f"drawn seeds of shape {drawn.shape}; need ({n_boot}, {s_count}) "
                         "with n_boot >= 1")
    if unit_ids is None:
        # Seed by seed (a loop over the S seeds, not the replicates): the slots that drew
        # seed s each draw n_s of its units; every draw of a unit of s weighs 1 / (S n_s).
        where = []
        for k in range(s_count):
            b_of, _ = np.nonzero(drawn == k)                              # [slots]
            units = rng.integers(0, n[k], size=(b_of.size, n[k]))         # [slots, n_k]
            where.append((b_of[:, None] * total + (offsets[k] + units)).ravel())
        counts = np.bincount(np.concatenate(where), minlength=n_boot * total)
        return counts.reshape(n_boot, total) * two_stage_point_weights(n)
    ids = list(unit_ids)
    if len(ids) != total:
        raise ValueError(f"unit_ids: {len(ids)} ids for {total} units (sizes {n.tolist()})")
    index: dict = {}
    gid = np.array([index.setdefault(u, len(index)) for u in ids], np.int64)  # [N]
    u_count = len(index)
    seed_of = np.repeat(np.arange(s_count), n)                            # [N]
    rows = np.arange(n_boot)[:, None]
    m = np.bincount((rows * s_count + drawn).ravel(), minlength=n_boot * s_count)
    m = m.reshape(n_boot, s_count).astype(np.float64)                     # [Bt, S]
    picks = rng.integers(0, u_count, size=(n_boot, u_count))
    c = np.bincount((rows * u_count + picks).ravel(), minlength=n_boot * u_count)
    c = c.reshape(n_boot, u_count).astype(np.float64)                    # [Bt, U]
    raw = c[:, gid]                                                       # [Bt, N]
    per_seed = np.add.reduceat(raw, offsets, axis=1)                      # [Bt, S]
    share = np.divide(m, s_count * per_seed, out=np.zeros_like(m), where=per_seed > 0)
    w = raw * share[:, seed_of]
    w[np.any((m > 0) & (per_seed == 0), axis=1)] = np.nan
    return w


def minimal_detectable(se: float, factor: float = POWER_FACTOR) -> float:
    """The smallest true difference the design detects with 80% power at two-sided 5%:
    `factor` (z_{0.975} + z_{0.80} = 2.80) standard errors (METHOD 15, "Power"); nan for a
    nan standard error."""
    return float(factor * se)


def replicate_summary(point: float, reps, level: float = 0.95) -> dict:
    """A pooled figure from its point value and bootstrap replicates float[Bt].

    Returns:
        {"mean": point, "ci": `percentile_interval`, "se": the finite replicates' sd (ddof
        1; nan for fewer than 2), "minimal_detectable": `minimal_detectable(se)`,
        "zero_inside_ci" (True when the CI is nan), "kept": the finite replicates'
        fraction}.
    """
    reps = np.asarray(reps, np.float64)
    finite = reps[np.isfinite(reps)]
    se = float(np.std(finite, ddof=1)) if finite.size > 1 else float("nan")
    lo, hi = percentile_interval(reps, level)
    return {"mean": float(point), "ci": [lo, hi], "se": se,
            "minimal_detectable": minimal_detectable(se),
            "zero_inside_ci": bool(lo <= 0.0 <= hi) if np.isfinite(lo) else True,
            "kept": float(finite.size / max(reps.size, 1))}


def seed_major(values, ids=None, keep=None) -> tuple:
    """Per-seed values laid out seed-major, non-finite entries left out.

    Args:
        values: S sequences (ragged), values[s] float[n_s] or a tuple of such arrays of
            equal length (several statistics of the same units, e.g. a numerator and a
            denominator); a unit is kept where every one of them is finite.
        ids: None or S sequences of ids matching values[s].
        keep: None or S bool sequences: further units to leave out (False).

    Returns:
        (flat: a tuple of float64[N] (one per statistic), sizes: S kept counts, flat_ids:
        N ids or None).

    Raises:
        ValueError: ids or keep not matching values.
    """
    if ids is not None and len(ids) != len(values):
        raise ValueError(f"ids for {len(ids)} seeds, values for {len(values)}")
    parts, sizes, flat_ids = [], [], ([] if ids is not None else None)
    for s, v in enumerate(values):
        arrs = tuple(np.asarray(x, np.float64).reshape(-1)
                     for x in (v if isinstance(v, tuple) else (v,)))
        ok = np.all([np.isfinite(a) for a in arrs], axis=0)
        if keep is not None:
            ok &= np.asarray(keep[s], bool)
        if ids is not None:
            if len(ids[s]) != ok.size:
                raise ValueError(f"seed {s}: {len(ids[s])} ids for {ok.size} values")
            flat_ids += [u for u, k in zip(ids[s], ok) if k]
        parts.append(tuple(a[ok] for a in arrs))
        sizes.append(int(ok.sum()))
    flat = tuple(np.concatenate([p[k] for p in parts]) for k in range(len(parts[0])))
    return flat, sizes, flat_ids


def _empty(sizes, unit: str) -> dict:
    nan = float("nan")
    return {"mean": nan, "ci": [nan, nan], "se": nan, "minimal_detectable": nan,
            "zero_inside_ci": True, "kept": 0.0, "seeds": len(sizes), "units": sizes,
            "distinct_units": 0, "interval": two_stage_name(unit)}


def two_stage_bootstrap(values, n_boot: int, seed, level: float = 0.95, ids=None,
                        unit: str = "prompts") -> dict:
    """The mean over seeds of each seed's unit mean, with its two-stage bootstrap interval,
    standard error and minimal detectable difference (METHOD 15).

    Args:
        values: S sequences, values[s] float[n_s] (ragged): e.g. the per-prompt paired
            differences d[s, i] of seed s. Non-finite entries are left out (with their ids).
        n_boot: Bt replicates; seed: an int or numpy Generator (`two_stage_weights`).
        level: the interval's coverage (percentile bootstrap).
        ids: None (the units of different seeds are different units), or S sequences of
            unit ids matching `values` (a unit in several seeds is drawn once for all:
            `two_stage_weights`).
        unit: what a unit is, for the interval's name ("prompts", "lists").

    Returns:
        {"mean", "ci": [lo, hi] (the (1 -+ level) / 2 percentiles), "se" (the replicates'
        sd, ddof 1), "minimal_detectable" (POWER_FACTOR x se), "zero_inside_ci", "kept" (the
        fraction of replicates with a value), "seeds": S, "units": [n_s] kept,
        "distinct_units" (distinct ids, or N), "interval": `two_stage_name(unit)`}; nan
        figures when a seed has no finite value.

    Raises:
        ValueError: no seed, or ids that do not match values.
    """
    if len(values) < 1:
        raise ValueError("two_stage_bootstrap needs one or more seeds")
    (x,), sizes, flat_ids = seed_major(values, ids)
    if min(sizes) < 1:
        return _empty(sizes, unit)
    w = two_stage_weights(sizes, n_boot, seed, flat_ids)
    out = replicate_summary(two_stage_point_weights(sizes) @ x, w @ x, level)
    return {**out, "seeds": len(sizes), "units": sizes,
            "distinct_units": len(set(flat_ids)) if flat_ids is not None else int(x.size),
            "interval": two_stage_name(unit)}


def two_stage_ratio(num, den, n_boot: int, seed, level: float = 0.95, ids=None,
                    unit: str = "prompts") -> dict:
    """A ratio of seed-pooled sums, sum(w num) / sum(w den), with the two-stage bootstrap
    (METHOD 15): each seed weighs 1 / S, each of its units 1 / (S n_s)
    (`two_stage_point_weights`); a replicate whose denominator is <= 0 has no ratio and is
    left out (`ratio`; "kept" says how many have one).

    Args:
        num, den: S sequences each, num[s] and den[s] float[n_s]; a unit is kept where both
            are finite.
        n_boot, seed, level, ids, unit: as `two_stage_bootstrap`.

    Returns:
        `two_stage_bootstrap`'s dict, "mean" the point ratio (nan when its denominator is
        <= 0).

    Raises:
        ValueError: num and den of different seed counts, or ids that do not match.
    """
    if len(num) != len(den) or len(num) < 1:
        raise ValueError(f"num for {len(num)} seeds, den for {len(den)}")
    (a, b), sizes, flat_ids = seed_major([(x, y) for x, y in zip(num, den)], ids)
    if min(sizes) < 1:
        return _empty(sizes, unit)
    w = two_stage_weights(sizes, n_boot, seed, flat_ids)
    w0 = two_stage_point_weights(sizes)
    out = replicate_summary(ratio(w0 @ a, w0 @ b), ratio(w @ a, w @ b), level)
    return {**out, "seeds": len(sizes), "units": sizes,
            "distinct_units": len(set(flat_ids)) if flat_ids is not None else int(a.size),
            "interval": two_stage_name(unit)}


def two_stage_unpaired(a, b, n_boot: int, seed, level: float = 0.95,
                       unit: str = "prompts") -> dict:
    """mean_s mean(a[s]) - mean_s mean(b[s]) for two independent samples within each seed
    (e.g. two arms' training prompts, which a redraw can part), with a two-stage bootstrap:
    the same seeds are drawn for both (`draw_seeds`), then each drawn seed's a-units and
    b-units independently (METHOD 15).

    Args:
        a, b: S sequences each (ragged), float[n_s^a] and float[n_s^b]; non-finite entries
            left out.
        n_boot, seed, level, unit: as `two_stage_bootstrap`.

    Returns:
        `two_stage_bootstrap`'s dict (no "distinct_units"), "units": [[n_s^a, n_s^b]].

    Raises:
        ValueError: a and b of different seed counts, or none.
    """
    if len(a) != len(b) or len(a) < 1:
        raise ValueError(f"a for {len(a)} seeds, b for {len(b)}")
    (xa,), na, _ = seed_major(a)
    (xb,), nb, _ = seed_major(b)
    if min(na) < 1 or min(nb) < 1:
        return {k: v for k, v in _empty(list(zip(na, nb)), unit).items()
                if k != "distinct_units"}
    rng = np.random.default_rng(seed)
    drawn = draw_seeds(len(na), n_boot, rng)
    wa = two_stage_weights(na, n_boot, rng, drawn=drawn)
    wb = two_stage_weights(nb, n_boot, rng, drawn=drawn)
    point = two_stage_point_weights(na) @ xa - two_stage_point_weights(nb) @ xb
    out = replicate_summary(point, wa @ xa - wb @ xb, level)
    return {**out, "seeds": len(na), "units": [list(p) for p in zip(na, nb)],
            "interval": two_stage_name(unit)}
