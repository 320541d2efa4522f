"""The files of a Hugging Face model directory: config.json, single or sharded safetensors
(`model.safetensors` or `model.safetensors.index.json` and its shards), each checked with
an error that names the file."""
from __future__ import annotations

import json
import os

import numpy as np


def json_file(path: str):
    """The parsed JSON file; ValueError naming the file when it is not valid JSON."""
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON: {e}") from e


def safetensors_files(directory: str) -> list[str]:
    """Paths of the weight files: the shards of model.safetensors.index.json, or
    model.safetensors."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        weight_map = json_file(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no 'weight_map' object")
        # Every shard the index names must exist: checked before any is opened.
        missing = sorted({n for n in weight_map.values()
                          if not os.path.isfile(os.path.join(directory, n))})
        if missing:
            raise FileNotFoundError(f"{index} lists missing weight files: {', '.join(missing)}")
        return [os.path.join(directory, name) for name in sorted(set(weight_map.values()))]
    if os.path.exists(os.path.join(directory, "model.safetensors")):
        return [os.path.join(directory, "model.safetensors")]
    raise FileNotFoundError(f"{directory}: no model.safetensors or index")


def open_safetensors(path: str):
    """`safe_open(path)`. Raises ValueError naming a truncated or corrupt file, its size and,
    when its header is readable, the size the header gives."""
    from safetensors import safe_open

    try:
        # numpy (bfloat16 through ml_dtypes): tensors stay on the host until `_place` puts
        # each device's slice; nothing passes through device 0.
        return safe_open(path, framework="np")
    except Exception as e:  # SafetensorError: the header and the file's size disagree
        sizes = f"{os.path.getsize(path)} bytes"
        try:  # layout: header length (8 bytes, little-endian), JSON header, tensor data
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                ends = [v["data_offsets"][1] for k, v in json.loads(f.read(n)).items()
                        if k != "__metadata__"]
            sizes += f", its header says {8 + n + max(ends, default=0)}"
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            pass  # the header itself is cut or garbled
        raise ValueError(f"{path}: safetensors file is truncated or corrupt ({sizes}): {e}") \
            from e


def _slices(idx, ndim: int) -> tuple:
    """`idx` (a slice tuple from `jax.make_array_from_callback`, possibly short) as ndim
    slices."""
    idx = tuple(idx) if isinstance(idx, tuple) else (idx,)
    return idx + (slice(None),) * (ndim - len(idx))


class LazyTensor:
    """A tensor of an open safetensors file, read only where it is indexed: `shape`, and
    `x[slices]` reads that block (safetensors' `get_slice`) as numpy in the file's own dtype
    (bfloat16 stays 2 bytes an entry on the host; `weights._place` casts each block). A loader that
    places each device's block on its own (`weights._place`) thus reads from disk only
    what this process's devices hold.

    Args:
        part: `safe_open(...).get_slice(name)` (or anything indexable with slice tuples).
        shape: the tensor's shape in `part`'s layout.
        swapped: present the last two axes swapped (checkpoint [out, in] as our [in, out]).
    """

    def __init__(self, part, shape: tuple, swapped: bool = False):
        self.part, self.swapped = part, swapped
        self.shape = tuple(shape[:-2]) + tuple(shape[-2:][::-1]) if swapped else tuple(shape)

    def swapaxes_last(self) -> "LazyTensor":
        raw = self.shape[:-2] + self.shape[-2:][::-1] if self.swapped else self.shape
        return LazyTensor(self.part, raw, not self.swapped)

    def __getitem__(self, idx):
        idx = _slices(idx, len(self.shape))
        if self.swapped:  # read the block in the file's layout, then swap it
            block = self.part[idx[:-2] + (idx[-1], idx[-2])]
            return np.swapaxes(np.asarray(block), -1, -2)
        return np.asarray(self.part[idx])


class LazyStack:
    """Equal-shaped lazy tensors stacked on a new leading axis (layers, experts); indexing
    reads only the members and blocks asked for."""

    def __init__(self, members: list):
        self.members = list(members)
        self.shape = (len(self.members),) + tuple(self.members[0].shape)

    def swapaxes_last(self) -> "LazyStack":
        return LazyStack([m.swapaxes_last() for m in self.members])

    def __getitem__(self, idx):
        idx = _slices(idx, len(self.shape))
        rows = range(*idx[0].indices(len(self.members)))
        return np.stack([np.asarray(self.members[i][idx[1:]]) for i in rows])
