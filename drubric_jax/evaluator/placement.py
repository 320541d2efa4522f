"""Where a verifier pass's rows live: one process's devices, or a block of a pass that
spans every process (`jax.distributed`).

A pass's rows are split over the mesh's ("data", "fsdp") axes, so every pass is padded to
a multiple of those row shards. Under several processes each process tokenises and
schedules only its own rows, and every pass is one program over all processes' rows: the
row-length tables are exchanged (`schedule.gather_row_lengths`) and each process puts its
block of the global pass (`parallel.put_process_rows`).

Axis legend (drubric_jax/types.py): R rows of one process; a table has one row per R.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax import parallel
from drubric_jax.evaluator import schedule


class RowPlacement:
    """Puts a pass's rows on the devices and reads them back.

    Args:
        mesh: None (one device of this process), or the device mesh whose ("data", "fsdp")
            axes split every pass's rows.
    """

    def __init__(self, mesh=None):
        self.mesh = mesh
        # Every pass's rows are padded to a multiple of data x fsdp, the mesh's row shards.
        self.row_shards = 1 if mesh is None else int(np.prod(
            [mesh.shape[a] for a in parallel.BATCH_AXES]))

    @property
    def collective(self) -> bool:
        """Several processes over one mesh: every pass is one program of all of them."""
        return self.mesh is not None and jax.process_count() > 1

    def put(self, x: np.ndarray) -> jax.Array:
        """This process's rows of a pass input on the device(s): one process's whole pass,
        or under several processes its block of the global pass (rows over ("data",
        "fsdp"), assembled from every process's block: `parallel.put_process_rows`)."""
        if self.mesh is None:
            return jnp.asarray(x)
        if self.collective:
            return parallel.put_process_rows(x, self.mesh, x.shape[0] * jax.process_count())
        return parallel.put(x, parallel.batch_sharding(self.mesh))

    def take(self, x: jax.Array) -> np.ndarray:
        """This process's rows of a pass output, as numpy (`put`'s rows)."""
        if self.collective:
            return parallel.fetch_process_rows(x, parallel.batch_sharding(self.mesh))
        return parallel.fetch(x)

    def tables(self, table: np.ndarray) -> tuple[list, int]:
        """(every process's int64[R_q, columns] row-length table, this process's index q) from
        this process's rows' table: one process's own, or gathered (`schedule`)."""
        if self.collective:
            return schedule.gather_row_lengths(table), jax.process_index()
        return [np.asarray(table, np.int64)], 0
