"""Verdicts of M items on R responses at once, on the host, in a worker pool.

Axis legend (docs/CONVENTIONS.md): R responses, M items.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import threading

import numpy as np

from drubric_jax.checks import punkt
from drubric_jax.checks.table import PUNKT_CHECKS
from drubric_jax.checks.verify import follows, scorable_checker

_POOL = None  # the process pool, started on first use and kept (its start costs seconds)
_POOL_N = 0  # its number of workers
_POOL_LOCK = threading.Lock()


def _rows(checkers, responses, loose):
    if any(c.id in PUNKT_CHECKS for c in checkers):  # in a worker process too
        punkt.ensure_punkt()
    return [[follows(c, y, loose) for c in checkers] for y in responses]


def _pool(n: int) -> cf.ProcessPoolExecutor:
    """The kept pool of n workers (a new one when n changed). forkserver, not fork: fork is
    unsafe in a process where JAX's threads run; spawn re-imports __main__ in each worker."""
    global _POOL, _POOL_N
    with _POOL_LOCK:
        if _POOL is None or _POOL_N != n:
            if _POOL is not None:
                _POOL.shutdown()
            _POOL = cf.ProcessPoolExecutor(n, mp_context=mp.get_context("forkserver"))
            _POOL_N = n
        return _POOL


def shutdown() -> None:
    """Stops the kept process pool, if any (it also ends with the interpreter)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.shutdown()
            _POOL = None


def verdicts(items, responses, loose: bool = False, workers: int | None = None) -> np.ndarray:
    """v[r, m] = 1 when item m's checker accepts response r (METHOD 13; IFEval strict or
    loose, as `verify.verdict`).

    The M checkers are built once, here (so argument errors surface before any work), and
    the responses are split into one chunk per worker of a process pool that is started on
    the first call and kept (`shutdown` stops it).

    Why processes (`python -m experiments.bench_checks [--loose]`, R=256 responses of
    100-250 words x M=20 items, 2 workers, 5 interleaved rounds, medians; measured
    2026-12-05 on this 2-core machine, load average 1.7-2.1): strict inline 0.760 s,
    2 threads 0.846 s, 2 processes 0.391 s; loose inline 1.480 s, threads 1.618 s,
    processes 0.769 s; the pool's start and first call 2.1-2.5 s, once. The checkers are
    pure Python, so threads share the GIL and only add overhead. With no idle core (load
    average ~5) processes gave no gain (1.35 s vs 1.12 s inline, strict). One check
    dominates: language:response_language (langdetect) costs ~10 ms a response, every
    other check < 0.2 ms.

    Args:
        items: M (check, args) pairs.
        responses: R response strings.
        loose: IFEval's loose verdict instead of the strict one.
        workers: pool size (default: the CPU count); 1, or R < 2, runs inline.

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
    n = workers or os.cpu_count() or 1
    if n == 1 or len(responses) < 2:
        out[:] = _rows(checkers, responses, loose)
        return out
    chunks = min(n, len(responses))
    bounds = np.linspace(0, len(responses), chunks + 1).astype(int)
    pool = _pool(n)
    parts = [pool.submit(_rows, checkers, responses[lo:hi], loose)
             for lo, hi in zip(bounds[:-1], bounds[1:])]
    for lo, hi, f in zip(bounds[:-1], bounds[1:], parts):
        out[lo:hi] = f.result()
    return out
