"""Judge shares: rows that every process holds alike, each process judging only its block.

Under `jax.distributed` the verifier's callers (the round's judging, the evaluation
judges) often hold the same R rows on every process; `judge_shares` gives each process
its block of them, runs the (collective) judge on it, and gathers the results in row
order, with the `stats=` counters summed over the processes.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from drubric_jax import parallel
from drubric_jax.evaluator.counters import LOAD_COUNTS, STATS, add_count


def judge_shares(judge: Callable, columns: list, width: int,
                 stats: Optional[dict] = None) -> np.ndarray:
    """Rows that every process holds alike, judged by each process for its share only.

    Each process takes its block of the R rows (`parallel.process_share`: padded with
    copies of the last row to a multiple of the process count), calls
    `judge(its columns, its stats) -> float32[R_p, <= width]` (a collective call, e.g.
    `Verifier.p_yes(process_rows=True)`), and the blocks are gathered in row order.

    Args:
        judge: the per-process judge (columns: lists of R_p entries, in `columns`' order).
        columns: equal-length lists of the R rows' fields (prompts, responses, ...).
        width: the result's columns (narrower results are zero-padded).
        stats: optional counters (`counters.STATS`), summed over the processes; the
            router load (`counters.LOAD_COUNTS`) is the same on every process and kept.

    Returns:
        float32[R, width] on every process.
    """
    r = len(columns[0])
    if r == 0:
        return np.zeros((0, width), np.float32)
    _, mine = parallel.process_share(*columns)
    local_stats: Optional[dict] = {} if stats is not None else None
    got = np.asarray(judge(mine, local_stats), np.float32).reshape(len(mine[0]), -1)
    got = np.pad(got, ((0, 0), (0, width - got.shape[1])))
    if stats is not None:
        summed = parallel.gather_rows(np.array([[local_stats.get(k, 0) for k in STATS]],
                                               np.int64)).sum(axis=0)
        for k, n in zip(STATS, summed):
            add_count(stats, k, int(n))
        # Router load: counted over a whole (collective) pass, the same on every process.
        for k in LOAD_COUNTS:
            if k in local_stats:
                add_count(stats, k, local_stats[k])
    # Every process's block has the same row count (process_share pads with copies).
    return parallel.gather_rows(got)[:r]
