"""Writing params as a Hugging Face directory (config.json + model.safetensors) that
transformers loads (`LlamaForCausalLM`, `Qwen3ForCausalLM`, ...) and `models.weights.load_hf_dir`
loads back bit for bit. The config.json fields and the checkpoint tensor names come from the
model family's module, the model type from the registry (`registry.to_hf_model_type`).
"""
from __future__ import annotations

import json
import os
import tempfile

import jax
import numpy as np
from etils import epath
from jax.sharding import NamedSharding, PartitionSpec

from drubric_jax import parallel
from drubric_jax.models import registry
from drubric_jax.models.config import ModelConfig


def hf_config_dict(cfg: ModelConfig, bos_id: int, eos_id: int) -> dict:
    """A `config.json` dict that transformers reads as the class of `cfg`'s family or alias
    (`registry.to_hf_model_type`; e.g. LlamaForCausalLM, Qwen3ForCausalLM), with the
    family's fields (`config_to_hf` of the family module) and the token ids.

    Raises:
        NotImplementedError: a family without export (`qwen3_moe`).
    """
    fields = registry.family(cfg).config_to_hf(cfg, bos_id, eos_id)
    model_type, architecture = registry.to_hf_model_type(cfg)
    return {"architectures": [architecture], "model_type": model_type, **fields}


# safetensors' dtype codes by numpy dtype name, in the order of its `Dtype` enum: a file
# lays its tensors out by descending code, then by name (`safetensors` 0.4-0.8 `prepare`).
_ST_DTYPES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
              "float16": "F16", "bfloat16": "BF16", "int32": "I32", "uint32": "U32",
              "float32": "F32", "float64": "F64", "int64": "I64", "uint64": "U64"}
_ST_RANK = {code: i for i, code in enumerate(_ST_DTYPES.values())}


def safetensors_layout(specs: dict, metadata: dict) -> tuple[bytes, dict]:
    """The head of a safetensors file (8-byte little-endian header length, then the JSON
    header padded with spaces to 8 bytes) of tensors {name: (numpy dtype name, shape)},
    and each tensor's byte offset in the file: what `safetensors.numpy.save_file(tensors,
    metadata=metadata)` writes, byte for byte (tested), without the tensors' bytes.

    Raises:
        ValueError: a dtype safetensors has no code for here; metadata of more than one
            entry (safetensors writes those in hash order).
    """
    if len(metadata) > 1:
        raise ValueError(f"one metadata entry at most, got {sorted(metadata)}")
    bad = sorted({d for d, _ in specs.values()} - set(_ST_DTYPES))
    if bad:
        raise ValueError(f"dtypes without a safetensors code: {bad}")
    names = sorted(specs, key=lambda n: (-_ST_RANK[_ST_DTYPES[specs[n][0]]], n))
    header, starts, offset = {"__metadata__": dict(metadata)}, {}, 0
    for name in names:
        dtype, shape = specs[name]
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": [int(d) for d in shape],
                        "data_offsets": [offset, offset + size]}
        starts[name], offset = offset, offset + size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = len(text).to_bytes(8, "little") + text
    return head, {name: len(head) + start for name, start in starts.items()}


def _tensor_specs(params: dict, cfg: ModelConfig, fam) -> dict:
    """{Hugging Face name: (dtype name, shape)} of the exported tensors, from the leaves'
    shapes alone (nothing is fetched)."""
    def spec(x, key):
        shape = tuple(x.shape)
        return (np.dtype(x.dtype).name, shape[::-1] if key in fam.TRANSPOSED else shape)

    specs = {fam.TOP_WEIGHT_NAMES[key][0]: spec(params[key], key) for key in fam.top_keys(cfg)}
    for key in fam.layer_keys(cfg):
        leaf = params["layers"][key]
        one = jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype)  # one layer's slice
        for i in range(cfg.num_layers):
            specs[f"model.layers.{i}.{fam.LAYER_WEIGHT_NAMES[key][0]}"] = spec(one, key)
    return specs


def layer_slice(stacked, i: int):
    """Layer i of a stacked [L, ...] leaf, [...], cut where the leaf lives.

    A jax.Array is sliced by one jitted program per leaf shape (the index is traced, not a
    constant, so L layers share one compile); a NamedSharding keeps its spec minus the layer
    axis, so when the layer axis is unsharded (every family's `PARAM_SPECS`) each device
    slices its own block and nothing is communicated. Under several processes every process
    must call it at the same point (a multi-process program). Other values (numpy) are
    indexed on the host.
    """
    if not isinstance(stacked, jax.Array):
        return stacked[i]
    sharding = stacked.sharding
    out = None
    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (stacked.ndim - len(sharding.spec))
        out = NamedSharding(sharding.mesh, PartitionSpec(*spec[1:]))
    return _slice_program(out)(stacked, np.int32(i))


_SLICE_PROGRAMS: dict = {}


def _slice_program(out_sharding):
    """The jitted `x[i]` with this output sharding (None: whatever propagation gives),
    one per sharding so its compiles are cached across calls."""
    if out_sharding not in _SLICE_PROGRAMS:
        _SLICE_PROGRAMS[out_sharding] = jax.jit(
            lambda x, i: jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False),
            out_shardings=out_sharding)
    return _SLICE_PROGRAMS[out_sharding]


def export_hf_dir(params: dict, cfg: ModelConfig, directory: str, tokenizer=None,
                  bos_id: int = 1, eos_id: int = 2) -> None:
    """Writes params as a Hugging Face directory: config.json, model.safetensors and,
    when `tokenizer` (a PreTrainedTokenizerFast) is given, its tokenizer files.

    Weights keep their dtype; `load_hf_dir(export_hf_dir(p))` reproduces p exactly, and the
    file is the one `safetensors.numpy.save_file` writes (byte for byte). Host memory holds
    one piece at a time: the file's header is written first from the leaves' shapes
    (`safetensors_layout`), then each piece is fetched (`parallel.fetch_on_first`) and its
    bytes written at their offset before the next piece is fetched. A piece is a top-level
    leaf (embed, lm_head, the final norm) or ONE layer's slice of a stacked [L, ...] leaf,
    cut on the devices (`layer_slice`, no communication) before it is gathered: at
    Qwen3-8B the host holds at most lm_head (1.2 GB in bfloat16), not a whole stacked w_up
    (3.6 GB). Under several processes every process must call it (each piece is gathered in
    turn, a collective, and lands on every process: JAX has no gather onto one); only
    process 0 keeps the piece and writes.
    `directory` is a local path or a URL (gs://bucket/run/export/policy): a URL's files are
    written to a local temporary directory first (the tokenizer writes local files) and
    then copied there with `etils.epath`.

    Raises:
        NotImplementedError: a family without export (`qwen3_moe`: only trainees are
            exported, and it is the frozen verifier), before any leaf is gathered.
        ValueError: a leaf dtype safetensors has no code for (`safetensors_layout`).
    """
    config_json = hf_config_dict(cfg, bos_id, eos_id)
    fam = registry.family(cfg)
    # metadata "pt": the format tag transformers checks before it loads a safetensors file.
    head, offsets = safetensors_layout(_tensor_specs(params, cfg, fam), {"format": "pt"})
    writer = jax.process_index() == 0

    def leaves():  # (HF name of each piece, the piece) of one fetched leaf at a time
        for key in fam.top_keys(cfg):
            w = parallel.fetch_on_first(params[key])
            if writer:  # checkpoints store linear weights [out, in]; ours are [in, out]
                yield fam.TOP_WEIGHT_NAMES[key][0], (w.T if key in fam.TRANSPOSED else w)
            del w
        for key in fam.layer_keys(cfg):
            # Hugging Face names one tensor per layer: the [L, ...] leaf is fetched a layer
            # at a time, so no process holds the whole stacked leaf.
            for i in range(cfg.num_layers):
                w = parallel.fetch_on_first(layer_slice(params["layers"][key], i))
                if writer:
                    name = f"model.layers.{i}.{fam.LAYER_WEIGHT_NAMES[key][0]}"
                    yield name, (w.T if key in fam.TRANSPOSED else w)
                del w  # before the next layer is fetched

    def write(local: str) -> None:
        os.makedirs(local, exist_ok=True)
        with open(os.path.join(local, "model.safetensors"), "wb") as f:
            f.write(head)
            for name, w in leaves():
                f.seek(offsets[name])
                f.write(np.ascontiguousarray(w).reshape(-1).view(np.uint8))
                del w  # a view of the leaf: released before the next leaf is fetched
        with open(os.path.join(local, "config.json"), "w") as f:
            json.dump(config_json, f, indent=2)
        if tokenizer is not None:
            tokenizer.save_pretrained(local)

    if not writer:
        for _ in leaves():  # the collective gathers, nothing kept
            pass
        return
    if "://" not in str(directory):
        write(str(directory))
        return
    # os.makedirs("gs://b/x") would make a local "gs:" folder and the export would be lost.
    with tempfile.TemporaryDirectory() as tmp:
        write(tmp)
        dest = epath.Path(directory)
        dest.mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(tmp)):
            epath.Path(tmp, name).copy(dest / name, overwrite=True)
