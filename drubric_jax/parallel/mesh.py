"""Device mesh, and the sharding of parameters and batches on it.

One small place: a mesh with three named axes, and PartitionSpecs keyed by parameter
names, which each model family declares next to its parameters (`PARAM_SPECS`, gathered by
`models.param_specs`). Arrays are created already sharded by
`jax.jit(f, out_shardings=param_shardings(jax.eval_shape(f, ...), mesh))`.

Mesh axes:
    data    pure data parallelism (params replicated across it).
    fsdp    data parallelism whose members also split the model dim D of every matrix
            (ZeRO-3 style; XLA all-gathers a layer's weights when it is used).
    tensor  Megatron-style model parallelism over heads (H*Dh), the MLP width F and V.

Multi-process row crossing is in `parallel.rows`.

Axis legend (parameter shapes): V vocab, D model dim, L layers, H query heads, Hkv KV heads,
Dh head dim, F MLP width, B batch rows. L is never sharded (layers run in a `lax.scan`).
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the leading (row) axis of every batch array


def axis_sizes(n: int, data: int = -1, fsdp: int = 1, tensor: int = 1) -> tuple:
    """(data, fsdp, tensor) of a mesh over n devices: at most one axis may be -1, meaning
    "the remaining devices"; the product must equal n.

    Raises:
        ValueError: more than one -1, a size < 1 (other than -1), a -1 that does not divide
            evenly, or a product different from n.
    """
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got data={data}, fsdp={fsdp}, "
                         f"tensor={tensor}")
    for name, s in zip(MESH_AXES, sizes):
        if s != -1 and s < 1:
            raise ValueError(f"mesh axis {name!r} must be >= 1 or -1, got {s}")
    if -1 in sizes:
        known = int(np.prod([s for s in sizes if s != -1]))
        if n % known:
            raise ValueError(f"{n} devices cannot be split into data={data}, fsdp={fsdp}, "
                             f"tensor={tensor}: {n} is not a multiple of {known}")
        sizes[sizes.index(-1)] = n // known
    if int(np.prod(sizes)) != n:
        raise ValueError(f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} = "
                         f"{int(np.prod(sizes))} devices, but {n} are available")
    return tuple(sizes)


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1,
              devices: Optional[list] = None) -> Mesh:
    """Mesh with axes ("data", "fsdp", "tensor") over all (or the given) devices.

    Args:
        data, fsdp, tensor: axis sizes; at most one may be -1, meaning "the remaining
            devices". The product must equal the number of devices.
        devices: defaults to `jax.devices()`.

    Returns:
        jax.sharding.Mesh of shape (data, fsdp, tensor).

    Raises:
        ValueError: as `axis_sizes`.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = axis_sizes(len(devices), data, fsdp, tensor)
    # Auto axes: shardings are propagated by XLA inside jit (not JAX's explicit-sharding mode).
    return jax.make_mesh(tuple(sizes), MESH_AXES, devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)


def spec_for(rule: Optional[P], shape: tuple, mesh: Mesh) -> P:
    """The PartitionSpec `rule` adapted to a leaf of `shape` on `mesh`.

    No rule, or one whose rank differs from the leaf's, gives P() (replicated). A dim whose
    size does not divide by its mesh axes is replicated (that dim only).
    """
    if rule is None or len(rule) != len(shape):
        return P()
    dims = []
    for size, axes in zip(shape, rule):
        ways = 1 if axes is None else int(np.prod(
            [mesh.shape[a] for a in (axes if isinstance(axes, tuple) else (axes,))]))
        # Uneven dims are replicated, not padded: the result is the same, only less split.
        dims.append(axes if size % ways == 0 else None)
    return P(*dims)


def decode_rules(rules: dict) -> dict:
    """The rollout (decode) layout of parameter rules: each spec with the "fsdp" axis taken
    out, so the weights are replicated over "data" and "fsdp" and split over "tensor" only.

    A decode step under the training layout all-gathers every fsdp-split matrix on every
    token (the whole model into each device per step); under this one it gathers nothing
    weight-sized. The rows of a rollout stay split over ("data", "fsdp"), so each device
    decodes its own rows with whole (or tensor-split) weights.
    """
    def drop(axes):
        if axes == "fsdp":
            return None
        if isinstance(axes, tuple):
            kept = tuple(a for a in axes if a != "fsdp")
            return kept if len(kept) > 1 else (kept[0] if kept else None)
        return axes

    return {name: P(*(drop(a) for a in spec)) for name, spec in rules.items()}


def leaf_name(path) -> Optional[str]:
    """The last dict key on a pytree path (e.g. "wq" for params["layers"]["wq"]), or None."""
    # The nearest dict key: Adam's mu / nu subtrees end in the same keys as the params, so
    # they find the same rule through the optax state's sequence and attribute entries.
    for entry in reversed(path):
        if isinstance(entry, jax.tree_util.DictKey):
            return str(entry.key)
    return None


def param_shardings(tree: Any, mesh: Mesh, rules: dict) -> Any:
    """Pytree of NamedSharding matching `tree` (params, a TrainState, or their shapes).

    Args:
        tree: pytree whose leaves have `.shape` (arrays or `jax.eval_shape` output).
            A leaf's rule is found from the nearest dict key on its path, so params,
            Adam moments and a whole TrainState all work; scalars are replicated. A leaf
            of the per-layer form (`models.decode_params`: "layers" is a tuple of L
            dicts) gets its stacked rule without the layer axis.
        mesh: from `make_mesh`.
        rules: {leaf name: PartitionSpec} (`models.param_specs()` for the model
            families).

    Returns:
        Pytree of `NamedSharding` with the structure of `tree`.
    """
    def one(path, leaf):
        rule = rules.get(leaf_name(path))
        if rule is not None and len(rule) == len(leaf.shape) + 1 and _per_layer(path):
            rule = P(*tuple(rule)[1:])  # one layer of a stacked [L, ...] rule
        return NamedSharding(mesh, spec_for(rule, tuple(leaf.shape), mesh))

    return jax.tree_util.tree_map_with_path(one, tree)


def _per_layer(path) -> bool:
    """Whether a leaf's path runs through one layer of the per-layer form ("layers" then a
    sequence index: `models.decode_params`), whose leaves lack the stacked layer axis."""
    keys = list(path)
    return any(getattr(a, "key", None) == "layers" and isinstance(b, jax.tree_util.SequenceKey)
               for a, b in zip(keys, keys[1:]))


def leaf_sharder(mesh: Mesh, rules: dict):
    """`(path, shape) -> NamedSharding` for loaders that place one tensor at a time
    (`models.load_model(..., shardings=leaf_sharder(mesh, rules))`): the rule of the path's last
    name, as `param_shardings` would give it."""
    def sharder(path: str, shape: tuple) -> NamedSharding:
        # The leaf name is the path's last component, as `leaf_name` finds it in a pytree.
        return NamedSharding(mesh, spec_for(rules.get(path.split("/")[-1]), tuple(shape),
                                            mesh))

    return sharder


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of batch arrays [B, ...]: rows over ("data", "fsdp"), the rest replicated.

    B must be a multiple of data * fsdp. As a pytree prefix it covers a whole batch.
    """
    # Dim 0 split over data and fsdp jointly (data-major); the other dims replicated.
    return NamedSharding(mesh, P(BATCH_AXES))


def constrain_rows(x: jax.Array) -> jax.Array:
    """`x` [B, ...] held with its rows over ("data", "fsdp") and the rest replicated, when
    traced under a mesh context (`rows_on(mesh)`) whose row shards divide B; else `x`.

    Why: with the weights' D split over "fsdp" (`models.param_specs`) and the rows split over
    the same axis, XLA's partitioner may all-gather every row's activations and all-reduce
    the [B, T, F] products instead of gathering the layer's weights (seen in the compiled
    train step of a 2-layer Qwen3-8B on 8 devices: f32[8, 2048, 12288] all-reduces and
    8.2 GB of temporaries a device). Pinning the residual stream to its rows leaves the
    weights as the only operand it can gather: the FSDP pattern (ZeRO-3).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
        return x
    shards = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
    if shards == 1 or x.ndim == 0 or x.shape[0] % shards:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(BATCH_AXES)))


def row_groups(b: int) -> int:
    """G, the row shards (data x fsdp) of the mesh context (`rows_on`) when they divide a
    batch of b rows, else 1: a computation that mixes rows (the mixture of experts'
    dispatch, `models.qwen3_moe.moe_mlp`) runs per group of b / G rows, so each device
    works on its own rows."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
        return 1
    shards = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
    return shards if shards > 1 and b % shards == 0 else 1


def rows_on(mesh: Optional[Mesh]):
    """Context under which `constrain_rows` pins activations to `mesh`'s row shards (a
    no-op context for None); enter it around the tracing of a jitted step."""
    import contextlib

    if mesh is None:
        return contextlib.nullcontext()
    return jax.sharding.use_abstract_mesh(mesh.abstract_mesh)


def row_shards(mesh: Mesh) -> int:
    """data x fsdp: how many ways the rows of a batch are split (`batch_sharding`)."""
    return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def put(x, target: Optional[jax.sharding.Sharding]) -> jax.Array:
    """A host value on the devices of `target` (None: the default device).

    Args:
        x: array-like holding the *global* value (every process passes the same one).
        target: the array's sharding; under several processes it may span devices of
            other processes, and each process then transfers only its own shards.

    Returns:
        jax.Array of x's shape and dtype with sharding `target`.
    """
    x = np.asarray(x)
    if target is None:
        return jax.numpy.asarray(x)
    # jax.device_put accepts a global value for a multi-process sharding (every process
    # gives the same x and sends its addressable slices only).
    return jax.device_put(x, target)


def put_rows(tree: Any, mesh: Mesh) -> Any:
    """`put` of every leaf of a batch pytree (host values [B, ...]) with its rows split
    over ("data", "fsdp") (`batch_sharding`)."""
    rows = batch_sharding(mesh)
    return jax.tree.map(lambda x: put(x, rows), tree)


def fetch(tree: Any) -> Any:
    """Host numpy of every array leaf of `tree`, the global value on every process.

    Arrays whose shards all live on this process are read directly; a fully replicated
    array is read from a local copy; any other multi-process array is gathered
    (`multihost_utils.process_allgather`, a collective: every process must call `fetch`
    on it at the same point of the program).
    """
    from jax.experimental import multihost_utils

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.device_get(jax.tree.map(one, tree))


def fetch_on_first(x: Any) -> Optional[np.ndarray]:
    """Host numpy of ONE array on process 0; None on every other process (nothing kept).

    For a writer on process 0 (`models.export`) that reads a model leaf by leaf: host
    memory holds at most this leaf. An array whose shards all live on this process, or a
    fully replicated one, is read on process 0 only; any other multi-process array is
    gathered (`multihost_utils.process_allgather`, a collective: every process must call
    `fetch_on_first` on it at the same point) and the other processes drop their copy on
    return (JAX has no gather onto one process: `process_allgather` lands on every one).
    """
    first = jax.process_index() == 0
    if not isinstance(x, jax.Array):
        return np.asarray(x) if first else None
    if x.is_fully_addressable or x.is_fully_replicated:
        return _host_copy(x) if first else None
    from jax.experimental import multihost_utils

    gathered = np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return gathered if first else None


def _host_copy(x: jax.Array) -> np.ndarray:
    """A new numpy copy of a fully addressable or fully replicated array, assembled from its
    shards. Not `np.asarray(x)`: that caches the host value on x (`jax.device_get` too),
    which would keep every leaf read on the host for as long as x lives."""
    if x.is_fully_replicated:
        return np.array(x.addressable_shards[0].data)
    out = np.empty(x.shape, x.dtype)
    for shard in x.addressable_shards:
        if shard.replica_id == 0:  # each block once
            out[shard.index] = np.asarray(shard.data)
    return out


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding (metrics, scalars)."""
    return NamedSharding(mesh, P())
