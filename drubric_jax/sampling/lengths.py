"""Response-length distributions, and the decode steps each sampler spends on them: a
static call runs to its longest row (`sampling.generate_chunked`), the rollout engine to
its last row's end (`sampling.generate_engine`). The time estimate of a round reads them
(`memory.timing`, `experiments.plan --time`).
"""
from __future__ import annotations

import heapq

import numpy as np


def parse_lengths(spec: str, max_new: int) -> tuple:
    """The response-length distribution of a quantile spec "q:tokens,..." (e.g.
    "0.1:300,0.5:1200,0.9:5000"), as ((0, 1), (q, tokens)..., (1, N)) with tokens capped at
    N = `max_new`; "" gives () (every row runs to N).

    Raises:
        ValueError: a malformed pair, q outside (0, 1), tokens < 1, or values that do not
            increase with q.
    """
    if not spec:
        return ()
    try:
        pairs = sorted((float(q), min(float(t), max_new))
                       for q, t in (p.split(":") for p in spec.split(",")))
    except ValueError as e:
        raise ValueError(f"response lengths {spec!r}: want q:tokens pairs, e.g. "
                         f"0.1:300,0.5:1200,0.9:5000 ({e})") from None
    points = ((0.0, 1.0), *pairs, (1.0, float(max_new)))
    if (any(not 0 < q < 1 or t < 1 for q, t in pairs)
            or any(b[1] < a[1] for a, b in zip(points, points[1:]))):
        raise ValueError(f"response lengths {spec!r}: quantiles in (0, 1), tokens >= 1 and "
                         "not decreasing")
    return points


def row_lengths(points: tuple, rows: int) -> np.ndarray:
    """int64[rows] lengths at the quantiles (i + 1/2) / rows of `points` (linear between
    them), in a fixed shuffled order (a batch's long rows fall anywhere in it)."""
    q = (np.arange(rows) + 0.5) / rows
    lengths = np.ceil(np.interp(q, *zip(*points))).astype(np.int64)
    return lengths[np.random.default_rng(0).permutation(rows)]


def static_steps(lengths: np.ndarray, per_call: int) -> int:
    """Decode steps of static calls of `per_call` rows: each runs to its longest row."""
    return int(sum(lengths[i:i + per_call].max() for i in range(0, len(lengths), per_call)))


def engine_steps(lengths: np.ndarray, slots: int) -> int:
    """Decode steps of the rollout engine with `slots` slots: rows in order, each taking
    the first slot to free (`sampling.generate_engine`); the last row's end."""
    ends = [0] * min(slots, len(lengths))
    for n in lengths:
        heapq.heappush(ends, heapq.heappop(ends) + int(n))
    return max(ends)


def length_metrics(lengths, rows=None) -> dict:
    """{"response_length_mean", "response_length_p10", "_p50", "_p90"} of a step's
    responses' lengths `lengths: int[R]` (tokens; percentiles interpolated linearly), as
    float32 scalars (jittable): the train step logs them, `spec_from_metrics` reads them.
    `rows` (bool[R], optional) keeps only those rows (NaN if none)."""
    import jax.numpy as jnp

    x = jnp.asarray(lengths, jnp.float32)
    if rows is not None:
        x = jnp.where(jnp.asarray(rows, bool), x, jnp.nan)
    p10, p50, p90 = jnp.nanpercentile(x, jnp.array([10.0, 50.0, 90.0]))
    return {"response_length_mean": jnp.nanmean(x), "response_length_p10": p10,
            "response_length_p50": p50, "response_length_p90": p90}


QUANTILE_METRICS = (("response_length_p10", 0.1), ("response_length_p50", 0.5),
                    ("response_length_p90", 0.9))


def spec_from_metrics(rows, max_new: int, source: str = "metrics") -> str:
    """A `parse_lengths` spec from a run's policy rows (metrics.jsonl: the train step's
    response_length_p10 / _p50 / _p90 and truncated_fraction, averaged over the rows),
    plus the truncated share at N when it lies above the 90th percentile.

    Raises:
        ValueError: no row carries the three percentiles (runs from before they were
            logged), naming `source`.
    """
    rows = [r for r in rows if all(k in r for k, _ in QUANTILE_METRICS)]
    if not rows:
        raise ValueError(f"{source}: no row with {[k for k, _ in QUANTILE_METRICS]} (a run "
                         "logged since the train step reports them)")
    pairs = [(q, min(float(np.mean([r[k] for r in rows])), max_new))
             for k, q in QUANTILE_METRICS]
    untruncated = 1.0 - float(np.mean([r.get("truncated_fraction", 0.0) for r in rows]))
    if 0.9 < untruncated < 1.0:
        pairs.append((untruncated, float(max_new)))
    # Percentiles of several steps averaged may dip; keep the spec non-decreasing.
    out, top = [], 1.0
    for q, t in pairs:
        top = max(top, t)
        out.append(f"{q:g}:{top:g}")
    return ",".join(out)


def role_specs(rows, max_new: dict, source: str = "metrics") -> dict:
    """{role: spec} (`spec_from_metrics`) for "policy" and "generator" from a run's
    metrics rows: each role's update logs its own rows' lengths (the policy's answers in
    the "policy" phase, the generator's lists in the "generator" phase). A role with no
    row is left out (a run whose generator never updated).

    Args:
        rows: metrics.jsonl rows.  max_new: {role: N}.

    Raises:
        ValueError: the policy has no row with the percentiles (`spec_from_metrics`).
    """
    out = {}
    for role in ("policy", "generator"):
        mine = [r for r in rows if r.get("phase") == role]
        if role == "generator" and not any(k in r for r in mine for k, _ in QUANTILE_METRICS):
            continue
        out[role] = spec_from_metrics(mine, max_new[role], f"{source} ({role} rows)")
    return out
