"""The verifier's pass schedule: which rows go into which pass, at which token bucket.

One schedule serves one process and several. Under `jax.distributed` every process holds
only its own rows (its share of the (response, item list) queries) and tokenises them
itself; every process must still make the same jitted calls with the same shapes. So the
processes first exchange each row's token counts (`gather_row_lengths`: one collective of a
few integers per row), and every process then computes the same schedule from them
(`plan_passes`, pure and deterministic). A pass of `rows` global rows takes
`rows / process count` rows of each process (filler rows where a process has run out),
longest first, so that rows of similar length share a bucket; its bucket is the one of its
longest row over all processes. With one process this is the single-process schedule:
rows sorted by length (longest first, ties in input order), `rows` = the budget's cap, at
most the remaining rows' power-of-two bucket, rounded up to a multiple of the mesh's row
shards.

Axis legend (drubric_jax/types.py): R rows (queries) of one process, M item columns;
processes are named in words (the process count, process q), since P is the legend's
padded prompt length.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from drubric_jax import parallel
from drubric_jax.sampling import bucket_length


@dataclasses.dataclass(frozen=True)
class Pass:
    """One verifier pass.

    bucket: its token bucket (prefix or full-prompt length, left-padded).
    rows: its global row count (a multiple of the row shards; rows / process count per
        process).
    members: per process, the local indices of its real rows (at most rows / process count;
        the rest of that process's rows are filler).
    """

    bucket: int
    rows: int
    members: tuple[tuple[int, ...], ...]


def plan_passes(lengths: Sequence[Sequence[int]], *, bucket_of: Callable[[int], int],
                max_rows_of: Callable[[int], int], row_shards: int) -> list[Pass]:
    """The passes that score every row of every process.

    Args:
        lengths: per process q, int[R_q] token counts of its rows (R_q may be 0).
        bucket_of: a row length -> its bucket.
        max_rows_of: a bucket -> the most global rows of one pass at that bucket (a memory
            budget; >= 1).
        row_shards: data x fsdp devices a pass's rows are split over (1 without a mesh); a
            multiple of the process count.

    Returns:
        The passes in order; each process's rows appear exactly once, longest first.

    Raises:
        ValueError: row_shards is not a multiple of the process count.
    """
    count = len(lengths)
    if row_shards % count:
        raise ValueError(f"row shards ({row_shards}) must be a multiple of the process "
                         f"count ({count})")
    # Longest first; `sorted` is stable, so equal lengths keep their input order.
    orders = [sorted(range(len(x)), key=lambda i, x=x: -int(x[i])) for x in lengths]
    starts = [0] * count
    out = []
    while True:
        left = [len(o) - s for o, s in zip(orders, starts)]
        if max(left) <= 0:
            return out
        bucket = max(bucket_of(int(lengths[q][orders[q][starts[q]]]))
                     for q in range(count) if left[q] > 0)
        # At most the power-of-two bucket of what is left (few compiled row counts), split
        # evenly over the row shards (filler rows where rows run out).
        rows = min(max_rows_of(bucket), bucket_length(count * max(left), 1))
        rows = row_shards * -(-rows // row_shards)
        per = rows // count
        out.append(Pass(bucket, rows, tuple(tuple(o[s:s + per])
                                            for o, s in zip(orders, starts))))
        starts = [s + per for s in starts]


def gather_row_lengths(local: np.ndarray) -> list[np.ndarray]:
    """Every process's int64[R_q, columns] table of row token counts
    (`parallel.gather_ragged`: one collective): the input of `plan_passes` on every process.
    One process: [local]."""
    return parallel.gather_ragged(np.asarray(local, np.int64))
