"""Verdicts of M items on R responses at once, on the host, in a worker pool.

Axis legend (docs/CONVENTIONS.md): R responses, M items.
"""
from __future__ import annotations

import concurrent.futures as cf
import os

import numpy as np

from drubric_jax.checks.verify import follows, scorable_checker


def _rows(checkers, responses, loose):
    return [[follows(c, y, loose) for c in checkers] for y in responses]


def verdicts(items, responses, loose: bool = False, workers: int | None = None) -> np.ndarray:
    """v[r, m] = 1 when item m's checker accepts response r (METHOD 13; IFEval strict or
    loose, as `verify.verdict`).

    The M checkers are built once, here (so argument errors surface before any work), and
    the responses are split into one chunk per worker of a thread pool.

    Why threads (measured 2026-12-05 on this 2-core machine, shared, load average ~5;
    /tmp bench of R=256 responses of 100-250 words x M=20 items, the first 20 scorable
    checks, seeded `draw_args`; 5 interleaved repeats, medians): strict inline 1122 ms,
    2 threads 1124 ms, 2 warm processes (forkserver pool) 1354 ms; loose inline 3122 ms,
    2 threads 3061 ms, 2 warm processes 3630 ms; starting the forkserver pool cost 5.7 s,
    and per-call fork/forkserver/spawn pools 0.4-7.8 s. The checkers are pure Python
    (threads share the GIL, so they only match inline), and processes did not pay with
    no idle core; fork, the cheap start, is unsafe in a process running JAX's threads.
    One check dominates: language:response_language (langdetect) takes ~10 ms a response,
    every other check < 0.2 ms.

    Args:
        items: M (check, args) pairs.
        responses: R response strings.
        loose: IFEval's loose verdict instead of the strict one.
        workers: pool size (default: the CPU count, at most R); 1 runs inline.

    Returns:
        float32[R, M] of 0.0 / 1.0; equal to `verdict` looped over (r, m).

    Raises:
        InvalidCheck / NotScorable: the first bad item, as `verify.verdict`.
    """
    checkers = [scorable_checker(c, a) for c, a in items]
    responses = list(responses)
    out = np.zeros((len(responses), len(checkers)), np.float32)
    if not responses or not checkers:
        return out
    n = max(1, min(workers or os.cpu_count() or 1, len(responses)))
    if n == 1:
        out[:] = _rows(checkers, responses, loose)
        return out
    bounds = np.linspace(0, len(responses), n + 1).astype(int)
    with cf.ThreadPoolExecutor(n) as pool:
        parts = [pool.submit(_rows, checkers, responses[lo:hi], loose)
                 for lo, hi in zip(bounds[:-1], bounds[1:])]
        for (lo, hi), f in zip(zip(bounds[:-1], bounds[1:]), parts):
            out[lo:hi] = f.result()
    return out
