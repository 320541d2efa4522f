"""What every compiled-memory measurement shares (`memory.compiled`,
`memory.compiled_engine`): a lowered function's `memory_analysis()` (`analyse`, `Compiled`),
structs carrying shardings, a tree's bytes per device, and the rollout copy's program.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from drubric_jax import parallel
from drubric_jax.models import rollout
from drubric_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Compiled:
    """`memory_analysis()` of one compiled function, bytes per device."""

    argument: int
    output: int
    alias: int
    temp: int
    outputs: object = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def extra(self) -> int:
        """Bytes beyond the arguments: temporaries + outputs not written into donated ones."""
        return self.temp + self.output - self.alias


def analyse(lowered) -> Compiled:
    """Compiles a `jax.stages.Lowered` and returns its memory analysis; `outputs` holds
    structs of its outputs with the shardings the compiler chose (inputs of the next call)."""
    compiled = lowered.compile()
    m = compiled.memory_analysis()
    # With the shardings XLA chose, so the next function of a chain is lowered on them.
    outputs = _structs(lowered.out_info, compiled.output_shardings)
    return Compiled(int(m.argument_size_in_bytes), int(m.output_size_in_bytes),
                    int(m.alias_size_in_bytes), int(m.temp_size_in_bytes), outputs)


def _structs(shapes, shardings=None):
    """ShapeDtypeStructs of `shapes` (carrying `shardings`, a matching tree, when given)."""
    if shardings is None:
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), shapes)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                        shapes, shardings)


def rollout_copy(params, cfg: ModelConfig, mesh) -> tuple:
    """(structs of the rollout copy of `params`, its Compiled or None when nothing is
    copied): the program `models.rollout.rollout_copy` runs before a sampler call."""
    program = rollout.copy_program(params, cfg, mesh)
    if program is None:
        return params, None
    copy = analyse(program.lower(params))
    return copy.outputs, copy


def _row_structs(mesh, rows: int, *shapes_dtypes):
    """Structs of [rows, ...] inputs split over the row shards, as `parallel.put_process_rows`
    lays them out (rows a multiple of data x fsdp)."""
    sh = parallel.batch_sharding(mesh)
    return [jax.ShapeDtypeStruct((rows, *shape), dtype, sharding=sh)
            for shape, dtype in shapes_dtypes]


class _NoCopy:
    """The analysis of a copy not made: 0 bytes out."""
    output = 0


def device_bytes(tree) -> int:
    """Bytes per device of a tree of sharded structs (one shard of each leaf)."""
    return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
               for x in jax.tree.leaves(tree))
