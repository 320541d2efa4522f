"""Which items and rows of a step are this process's, and joining every process's values.

Under several processes (`jax.distributed`) each process samples, judges and rewards its own
block of a step's items (prompts, anchor lists; `parallel.process_share`), while the
advantages (Eq. 21, 24-25) and the metrics need every item. One process: its block is
everything, and these functions are the identity.

    own_items     indices of this process's items among a step's n
    gather_items  every process's per-item values, joined in item order
    process_part  the entries of a whole-batch per-row array for this process's rows
"""
from __future__ import annotations

import jax
import numpy as np

from drubric_jax import parallel
from drubric_jax.types import Rollout


def own_items(n: int) -> np.ndarray:
    """Indices of this process's items among a step's n (prompts, anchor lists): the real
    ones of its `parallel.process_share` block, the block it sampled and generated rubric
    lists for. One process: all n. int64[n_p]."""
    count = jax.process_count()
    # The block of the batch padded to a multiple of the process count, as process_share.
    block = parallel.process_block(-(-n // count) * count)
    return np.arange(block.start, min(block.stop, n))


def gather_items(x) -> np.ndarray:
    """Every process's per-item values [n_p, ...] (its `own_items`), joined in item order:
    [n, ...] on every process (`parallel.gather_ragged`; the trailing shape must agree)."""
    return np.concatenate(parallel.gather_ragged(np.asarray(x)))


def process_part(values, rollout: Rollout, per_group: int) -> np.ndarray:
    """The entries of a per-row array of the whole batch (row b * per_group + j: the j-th
    row of group b) for the rows of `rollout` (this process's rows, grouped, group id =
    b): the advantages this process trains on. One process: all of them."""
    j = np.arange(rollout.num_rows) % per_group
    return np.asarray(values)[rollout.group_ids * per_group + j]
