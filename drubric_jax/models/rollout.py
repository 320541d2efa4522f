"""The rollout copy of a trainee's weights: laid out for decode, in the compute dtype.

Training keeps params FSDP-split over the mesh ("fsdp" splits D of every matrix); a decode
step on those weights all-gathers every matrix on every token, the output head included.
Before a rollout, `rollout_copy` reshards the params once into the decode layout
(`parallel.decode_rules`: replicated over "data" and "fsdp", split over "tensor") and casts
the matrices to the compute dtype (the forward casts them there anyway, so the tokens are
the same), by one jitted program: the weight sync of a trainer and its sampler, once per
optimizer step instead of once per token. The copy lives while the rollout runs and is
freed with it. Where the layout and dtypes already match (one device, or no "fsdp" axis,
in the compute dtype) the params themselves are returned: no program, no copy.

Where decode loops run on per-layer weights (`models.per_layer_decode`: CPU and GPU), the
copy is made in that form directly: its block weights are a tuple of L per-layer dicts, so
the sampler's own per-layer copy (`sampling.decode_params`) has nothing left to do and the
decode holds one copy of the weights, not two.

Memory: the copy holds the whole model per tensor group (Qwen3-8B in bfloat16: 16.4 GB on
each device of a data x fsdp mesh; 1/tensor of it with a tensor axis).
"""
from __future__ import annotations

import functools
from typing import Optional

import jax

from drubric_jax import parallel
from drubric_jax.models.config import ModelConfig
from drubric_jax.models.llama import unstack_layers
from drubric_jax.models.registry import param_specs


def _keeps_dtype(path) -> bool:
    # Norm scales stay as stored: the forward reads them in their own dtype.
    return (parallel.leaf_name(path) or "").endswith("norm")


def target_dtype(path, leaf, compute):
    """The dtype of `leaf` (at pytree `path`) in the rollout copy: the compute dtype, except
    norm scales, which keep their own."""
    return leaf.dtype if _keeps_dtype(path) else compute


def _per_layer_sharding(sharding):
    """The sharding of one layer's slice of a stacked [L, ...] leaf split by `sharding`."""
    spec = tuple(sharding.spec)
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec[1:]))


@functools.lru_cache(maxsize=16)
def _copy_program(treedef, shardings: tuple, compute, num_layers: int):
    """One jitted cast-and-reshard program per (tree, target shardings, compute dtype,
    output form): `num_layers` > 0 returns the block weights as that many per-layer dicts."""
    target = jax.tree_util.tree_unflatten(treedef, shardings)

    def copy(params):
        def one(path, x):
            return x.astype(target_dtype(path, x, compute))

        out = jax.tree_util.tree_map_with_path(one, params)
        return unstack_layers(out) if num_layers else out

    if num_layers:
        layer = {k: _per_layer_sharding(sh) for k, sh in target["layers"].items()}
        target = {**target, "layers": tuple(layer for _ in range(num_layers))}
    return jax.jit(copy, out_shardings=target)


def copy_program(params: dict, cfg: ModelConfig, mesh, per_layer: Optional[bool] = None):
    """The jitted cast-and-reshard program that makes the rollout copy of `params` (arrays or
    structs carrying shardings) on `mesh`, or None when every leaf is already in the decode
    layout and its rollout dtype (nothing to copy). The planner lowers it on structs.

    per_layer: make the copy in the per-layer form (None: `models.decode_per_layer(cfg)`),
    when `params["layers"]` is stacked."""
    from drubric_jax.models.registry import decode_per_layer

    target = parallel.param_shardings(params, mesh, parallel.decode_rules(param_specs()))
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    wanted = jax.tree_util.tree_leaves(target)
    if all(x.dtype == target_dtype(path, x, cfg.compute_dtype)
           and x.sharding.is_equivalent_to(sh, x.ndim)
           for (path, x), sh in zip(flat, wanted)):
        return None
    per_layer = decode_per_layer(cfg) if per_layer is None else per_layer
    stacked = isinstance(params.get("layers"), dict)
    num_layers = (int(jax.tree.leaves(params["layers"])[0].shape[0])
                  if per_layer and stacked else 0)
    return _copy_program(treedef, tuple(wanted), cfg.compute_dtype, num_layers)


def rollout_copy(params: dict, cfg: ModelConfig, mesh, per_layer: Optional[bool] = None) -> dict:
    """`params` (a trainee's full params, or base + adapters) in the decode layout and the
    compute dtype `cfg.dtype`, for the sampler (`sampling.generate(..., mesh=mesh)`).

    Args:
        params: pytree of jax.Arrays on `mesh` (any layout).
        cfg: the trainee's ModelConfig (its compute dtype).
        mesh: the run's mesh; None = no mesh (the params are returned).
        per_layer: the copy's block weights as a tuple of per-layer dicts, the form decode
            loops run on (None: `models.decode_per_layer(cfg)`: by default CPU and GPU).

    Returns:
        A new copy when a leaf's layout or dtype differs from the decode layout (per-layer
        block weights where `per_layer`), else `params` itself (its stacked form: the
        sampler then makes the per-layer copy, still one copy).
    """
    if mesh is None:
        return params
    program = copy_program(params, cfg, mesh, per_layer)
    return params if program is None else program(params)
