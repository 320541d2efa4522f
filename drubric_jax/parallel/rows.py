"""Process rows: host values crossing to and from the devices under several processes.

Multi-process runs (`jax.distributed`, one process per host): every process runs the same
program over the global mesh. Two kinds of host values cross to the devices:
- global values (every process holds the same numpy array): `put` makes a global
  `jax.Array` of one (each process transfers only the shards its own devices hold), and
  `fetch` brings a global array back to every process as numpy;
- process rows (the sampler's and the train step's batches): each process holds only the
  rows its devices hold, a contiguous block (`process_rows`); `put_process_rows` assembles
  the global array from every process's block (`jax.make_array_from_process_local_data`),
  `fetch_process_rows` reads this process's block back (from its own shards, no
  collective, when the array keeps the batch's row layout), and
  `gather_rows` / `gather_texts` give every process all blocks when another role needs
  them (e.g. the verifier reads every response).
A numpy array handed straight to a jitted function with a non-replicated in_sharding is an
error under several processes; these are the crossing points.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from drubric_jax.parallel.mesh import batch_sharding, fetch, row_shards


def process_block(n: int) -> slice:
    """This process's block of n items (prompts, anchor lists) when every process takes an
    equal contiguous share in process order: items [p n / P, (p + 1) n / P).

    Raises:
        ValueError: n is not a multiple of the number of processes.
    """
    p, count = jax.process_index(), jax.process_count()
    if n % count:
        raise ValueError(f"{n} items cannot be split evenly over {count} processes "
                         "(make the batch a multiple of the process count)")
    return slice(p * n // count, (p + 1) * n // count)


def process_share(*columns) -> tuple:
    """This process's block of equal-length item columns (prompts, histories, ...), each
    padded with copies of its last item to a multiple of the process count first:
    (block of the padded batch, [local column, ...]). Rows past the real count are filler
    to drop after a gather. One process: (slice(0, n), the columns as lists)."""
    n, count = len(columns[0]), jax.process_count()
    padded = -(-n // count) * count
    block = process_block(padded)
    return block, [(list(c) + [c[-1]] * (padded - n))[block] for c in columns]


def process_rows(n: int, mesh: Mesh) -> slice:
    """Rows of a [n, ...] batch (`batch_sharding`) that this process's devices hold.

    Raises:
        ValueError: n is not a multiple of data x fsdp, or the rows are not one
            contiguous block (a mesh whose row devices are not grouped by process).
    """
    shards = row_shards(mesh)
    if n % shards:
        raise ValueError(f"{n} rows cannot be split over data x fsdp = {shards} devices")
    return row_span(batch_sharding(mesh), n)


def row_span(rows: jax.sharding.Sharding, n: int) -> slice:
    """The contiguous block of an n-row array's rows that `rows` puts on this process."""
    spans = sorted({(s[0].start or 0, n if s[0].stop is None else s[0].stop)
                    for s in rows.addressable_devices_indices_map((n,)).values()})
    lo, hi = spans[0]
    for a, b in spans[1:]:
        if a != hi:
            raise ValueError(f"this process's rows of a {n}-row batch are not contiguous "
                             f"({spans}); order the mesh's devices by process")
        hi = b
    return slice(lo, hi)


def put_process_rows(tree: Any, mesh: Mesh, n: int) -> Any:
    """A global batch of n rows from each process's own rows (every leaf [n_p, ...] holds
    rows `process_rows(n, mesh)`), rows over ("data", "fsdp").

    Every process must call it at the same point with the same n (a collective
    program: the leaves' trailing shapes and dtypes must agree).

    Raises:
        ValueError: a leaf's row count is not this process's share of n.
    """
    rows = batch_sharding(mesh)
    block = process_rows(n, mesh)

    def one(x):
        x = np.asarray(x)
        if x.shape[0] != block.stop - block.start:
            raise ValueError(f"{x.shape[0]} local rows, expected {block.stop - block.start} "
                             f"(rows {block.start}:{block.stop} of {n})")
        return jax.make_array_from_process_local_data(rows, x, (n,) + x.shape[1:])

    return jax.tree.map(one, tree)


def fetch_process_rows(tree: Any, rows: jax.sharding.Sharding) -> Any:
    """Host numpy of this process's rows of every array leaf [n, ...]: the block that the
    row sharding `rows` (e.g. `batch_sharding(mesh)`) puts on this process's devices; the
    whole array on one process.

    A leaf laid out as `rows` says is read from this process's own shards (no
    collective); a leaf the compiler laid out otherwise (the decision is the same on every
    process: it depends on the shardings only) is gathered with `fetch` and cut.
    """
    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x  # read below, every leaf in one transfer
        block = row_span(rows, x.shape[0])
        if not x.sharding.is_equivalent_to(rows, x.ndim):
            return fetch(x)[block]
        shards = {}
        for s in x.addressable_shards:  # replicas (tensor axis) are read once
            shards.setdefault(s.index[0].start or 0, s)
        return np.concatenate([np.asarray(shards[k].data) for k in sorted(shards)])

    return jax.device_get(jax.tree.map(one, tree))


def agree_max(value: int) -> int:
    """The largest of every process's `value` (a collective under several processes): for
    shapes that every process must share, such as a prompt bucket."""
    if jax.process_count() == 1:
        return int(value)
    from jax.experimental import multihost_utils

    return int(np.max(multihost_utils.process_allgather(np.asarray(value, np.int64))))


def gather_rows(x) -> np.ndarray:
    """Every process's block of rows, concatenated in process order (`process_block`'s
    order): [n_p, ...] on each process -> [P n_p, ...] on every process. A collective; the
    blocks must have the same shape. One process: x itself."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def gather_texts(texts) -> list:
    """`gather_rows` for strings: every process's list (the same length on each), joined
    in process order. The texts travel as UTF-8 bytes padded to the longest."""
    texts = list(texts)
    if jax.process_count() == 1:
        return texts
    raw = [t.encode("utf-8") for t in texts]
    width = agree_max(max((len(r) for r in raw), default=0))
    buf = np.zeros((len(raw), max(width, 1)), np.uint8)
    for i, r in enumerate(raw):
        buf[i, :len(r)] = np.frombuffer(r, np.uint8)
    lengths = gather_rows(np.array([len(r) for r in raw], np.int64))
    buf = gather_rows(buf)
    return [bytes(row[:n]).decode("utf-8") for row, n in zip(buf, lengths)]


def gather_ragged(x) -> list:
    """Every process's array, whatever its shape (the same ndim and dtype on each):
    [x_0, ..., x_{P-1}] in process order, on every process. Each process's array is padded
    with zeros to the largest shape, gathered (`gather_rows`, two collectives with the
    shapes), and cut back. One process: [x]."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return [x]
    shapes = gather_rows(np.asarray([x.shape], np.int64))            # [P, ndim]
    top = np.maximum(shapes.max(axis=0), 1)  # no zero-size collective
    padded = np.zeros(tuple(int(d) for d in top), x.dtype)
    padded[tuple(slice(0, d) for d in x.shape)] = x
    # [P * top_0, ...] -> process q's block, cut to its own shape.
    blocks = gather_rows(padded[None]) if x.ndim == 0 else gather_rows(padded)
    blocks = blocks.reshape((len(shapes),) + tuple(int(d) for d in top))
    return [b[tuple(slice(0, int(d)) for d in s)] for b, s in zip(blocks, shapes)]

