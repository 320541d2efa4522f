"""Device mesh and the sharding spec of the decoder's parameters and batches.

One small place: a mesh with three named axes, and PartitionSpecs keyed by parameter
names, which each model family declares next to its parameters (`PARAM_SPECS`). Arrays are created already sharded by
`jax.jit(f, out_shardings=param_shardings(jax.eval_shape(f, ...), mesh))`.

Mesh axes:
    data    pure data parallelism (params replicated across it).
    fsdp    data parallelism whose members also split the model dim D of every matrix
            (ZeRO-3 style; XLA all-gathers a layer's weights when it is used).
    tensor  Megatron-style model parallelism over heads (H*Dh), the MLP width F and V.

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
        ValueError: more than one -1, a size < 1 (other than -1), a -1 that does not divide
            evenly, or a product different from the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
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


def param_specs() -> dict:
    """{leaf name: PartitionSpec} of every registered model family (`PARAM_SPECS` of each
    family module; a name two families share must have one spec).

    fsdp splits D, tensor splits heads / F / V; the stacked layer axis L stays whole; norms
    (and anything not named, e.g. optimizer counters) are replicated. The same rules apply
    to optimizer moments, whose tree mirrors the params.

    Raises:
        ValueError: two families give the same leaf name different specs.
    """
    from drubric_jax.models import registry

    specs: dict = {}
    for name, module in registry.FAMILIES.items():
        for leaf, spec in module.PARAM_SPECS.items():
            if specs.setdefault(leaf, spec) != spec:
                raise ValueError(f"family {name!r} gives {leaf!r} the spec {spec}, another "
                                 f"family {specs[leaf]}")
    return specs


def leaf_name(path) -> Optional[str]:
    """The last dict key on a pytree path (e.g. "wq" for params["layers"]["wq"]), or None."""
    # The nearest dict key: Adam's mu / nu subtrees end in the same keys as the params, so
    # they find the same rule through the optax state's sequence and attribute entries.
    for entry in reversed(path):
        if isinstance(entry, jax.tree_util.DictKey):
            return str(entry.key)
    return None


def param_shardings(tree: Any, mesh: Mesh, rules: Optional[dict] = None) -> Any:
    """Pytree of NamedSharding matching `tree` (params, a TrainState, or their shapes).

    Args:
        tree: pytree whose leaves have `.shape` (arrays or `jax.eval_shape` output).
            A leaf's rule is found from the nearest dict key on its path, so params,
            Adam moments and a whole TrainState all work; scalars are replicated.
        mesh: from `make_mesh`.
        rules: {leaf name: PartitionSpec}; default `param_specs()`.

    Returns:
        Pytree of `NamedSharding` with the structure of `tree`.
    """
    rules = param_specs() if rules is None else rules

    def one(path, leaf):
        return NamedSharding(mesh, spec_for(rules.get(leaf_name(path)), tuple(leaf.shape),
                                            mesh))

    return jax.tree_util.tree_map_with_path(one, tree)


def leaf_sharder(mesh: Mesh, rules: Optional[dict] = None):
    """`(path, shape) -> NamedSharding` for loaders that place one tensor at a time
    (`models.load_model(..., shardings=leaf_sharder(mesh))`): the rule of the path's last
    name, as `param_shardings` would give it."""
    rules = param_specs() if rules is None else rules

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


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding (metrics, scalars)."""
    return NamedSharding(mesh, P())


# ------------------------------------------------------------------ process rows


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
    shards = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
    if n % shards:
        raise ValueError(f"{n} rows cannot be split over data x fsdp = {shards} devices")
    return _row_span(batch_sharding(mesh), n)


def _row_span(rows: jax.sharding.Sharding, n: int) -> slice:
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
        block = _row_span(rows, x.shape[0])
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

