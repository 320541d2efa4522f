"""Deterministic shuffling, host sharding and resumable batching (host side, numpy).

`shuffled_order` gives one permutation per (seed, epoch), identical on every host;
`host_shard` cuts it into equal disjoint per-host shards; `EpochIterator` reads
fixed-size batches from this host's shard and records its position for checkpoints.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def shuffled_order(n: int, seed: int, epoch: int = 0) -> np.ndarray:
    """Permutation of range(n) for one epoch.

    `np.random.default_rng(np.random.SeedSequence([seed, epoch])).permutation(n)`:
    a fresh order per (seed, epoch), identical on every host and every run.
    (Seeding from the pair rather than seed + epoch keeps (seed=1, epoch=0) and
    (seed=0, epoch=1) different.)

    Args:
      n: int >= 0; seed, epoch: ints >= 0.

    Returns:
      int64[n].

    Raises:
      ValueError: negative seed or epoch.
    """
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got {seed}, {epoch}")
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch)])).permutation(n)


def host_shard(n: int, seed: int, epoch: int, host_id: int = 0, num_hosts: int = 1) -> np.ndarray:
    """Row indices host `host_id` reads in `epoch`.

    The epoch's shuffled order is cut to a multiple of num_hosts (the last
    n % num_hosts rows of that order sit out this epoch, a different set each
    epoch) and host h takes positions h::num_hosts. All hosts get the same
    count, so their step counts agree; the shards are disjoint and together
    cover the kept rows.

    Returns:
      int64[n // num_hosts].

    Raises:
      ValueError: num_hosts < 1 or host_id outside 0..num_hosts-1.
    """
    if num_hosts < 1 or not 0 <= host_id < num_hosts:
        raise ValueError(f"need 0 <= host_id < num_hosts, got {host_id}, {num_hosts}")
    # The same order on every host; each takes its own stride of it.
    order = shuffled_order(n, seed, epoch)
    return order[: n - n % num_hosts][host_id::num_hosts]


class EpochIterator:
    """Resumable iterator over fixed-size per-host batches, reshuffled every epoch.

    Epoch e uses `host_shard(len(items), seed, e, host_id, num_hosts)`; batches
    are consecutive slices of `batch_size` rows of that shard; the incomplete
    tail batch is dropped. After the last batch of an epoch the next call moves
    to epoch e + 1 (a new order). `state()` / `restore()` record and recreate
    the exact position for checkpoints.

    Args:
      items: sequence of rows (Records, AnchorLists, PromptItems, ...).
      batch_size: int >= 1, rows per batch on this host.
      seed: int >= 0.
      host_id, num_hosts: this host and the host count.
      num_epochs: stop after this many epochs (None: never stop).
      name: what the rows are ("anchors", "prompts"), named in errors.

    Raises:
      ValueError: batch_size < 1, or a host's shard holds fewer than
        batch_size rows (no batch could ever be formed).
    """

    def __init__(self, items: Sequence, batch_size: int, seed: int, host_id: int = 0,
                 num_hosts: int = 1, num_epochs: Optional[int] = None, name: str = ""):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_hosts < 1 or not 0 <= host_id < num_hosts:
            raise ValueError(f"need 0 <= host_id < num_hosts, got {host_id}, {num_hosts}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.items = items
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.host_id = int(host_id)
        self.num_hosts = int(num_hosts)
        self.num_epochs = num_epochs
        # The same on every host, so all hosts take the same number of steps per epoch.
        self.steps_per_epoch = (len(items) // self.num_hosts) // self.batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"{name + ': ' if name else ''}{len(items)} rows over {num_hosts} "
                             f"hosts cannot fill one batch of {batch_size}")
        self.epoch = 0
        self.position = 0
        # This host's rows for the current epoch, computed once per epoch (`_indices`).
        self._shard = None
        self._shard_epoch = -1

    def _indices(self) -> np.ndarray:
        if self._shard_epoch != self.epoch:
            self._shard = host_shard(len(self.items), self.seed, self.epoch,
                                     self.host_id, self.num_hosts)
            self._shard_epoch = self.epoch
        return self._shard

    def __iter__(self):
        return self

    def __next__(self) -> list:
        """Next batch: list of `batch_size` items. Raises StopIteration after num_epochs."""
        # Epochs advance on the next call, so a state taken after an epoch's last batch
        # (position = steps_per_epoch) is valid and resumes into the next epoch.
        if self.position >= self.steps_per_epoch:
            self.epoch += 1
            self.position = 0
        if self.num_epochs is not None and self.epoch >= self.num_epochs:
            raise StopIteration
        idx = self._indices()[self.position * self.batch_size:
                              (self.position + 1) * self.batch_size]
        self.position += 1
        return [self.items[int(i)] for i in idx]

    def state(self) -> dict:
        """dict {"epoch", "position" (batches already read in the epoch), "seed",
        "batch_size", "host_id", "num_hosts", "num_items"} -- JSON-serialisable."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "batch_size": self.batch_size, "host_id": self.host_id,
                "num_hosts": self.num_hosts, "num_items": len(self.items)}

    def restore(self, state: dict) -> None:
        """Continues exactly where `state()` was taken (same following batches).

        Raises:
          ValueError: a recorded layout key (batch_size, host_id, num_hosts,
            num_items) differs from this iterator's, or position/epoch is out of range.
        """
        # A changed layout would read other rows: refused rather than silently different.
        for key in ("batch_size", "host_id", "num_hosts"):
            if key in state and int(state[key]) != getattr(self, key):
                raise ValueError(f"state has {key}={state[key]}, iterator has "
                                 f"{getattr(self, key)}")
        if "num_items" in state and int(state["num_items"]) != len(self.items):
            raise ValueError(f"state has num_items={state['num_items']}, iterator has "
                             f"{len(self.items)}")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.steps_per_epoch:
            raise ValueError(f"bad state epoch={epoch} position={position} "
                             f"(steps_per_epoch={self.steps_per_epoch})")
        # The saved seed wins: it defines the orders already read; the shard is then recomputed.
        self.seed = int(state["seed"])
        self.epoch, self.position = epoch, position
        self._shard_epoch = -1
