"""The files of a Hugging Face model directory: config.json, single or sharded safetensors
(`model.safetensors` or `model.safetensors.index.json` and its shards), each checked with
an error that names the file."""
from __future__ import annotations

import json
import os


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
        return safe_open(path, framework="flax")
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
