"""Loading decoder weights: GGUF files, Hugging Face safetensors directories (the exporter is
`models.export`).

Every loader returns `(ModelConfig, params)` with params in the layout of the config's
model family (`drubric_jax.models.registry`), whose module also names the checkpoint
tensors. Tensors are read one at a time and placed on device (with an optional target
sharding per leaf) as soon as a stacked leaf is complete, so the host never holds a second
full copy of the model.

Sources followed: the GGUF format and `gguf` reader of llama.cpp (tensor names, the Q/K
row permutation done by llama.cpp's `convert_hf_to_gguf.py` for the `llama` architecture),
and the Hugging Face `LlamaForCausalLM` / `Qwen3ForCausalLM` / `Qwen3MoeForCausalLM`
parameter names (a mixture of experts: one tensor per expert, stacked on an E axis here).
"""
from __future__ import annotations

import os
from typing import Callable, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax.models import registry
from drubric_jax.models.safetensors_files import (LazyStack, LazyTensor, json_file,
                                                  open_safetensors, safetensors_files)
from drubric_jax.models.config import ModelConfig, RopeScaling

# A pytree of shardings matching the params, or a callable (path, shape) -> sharding with
# paths like "layers/wq" (e.g. `models.leaf_sharder(mesh)`).
Shardings = Union[None, dict, Callable[[str, tuple], Optional[jax.sharding.Sharding]]]


def _to_ours(fam, key: str, w: np.ndarray) -> np.ndarray:
    """Checkpoint linear weights are [..., out, in] (a leading E axis for stacked experts);
    ours are [..., in, out] (`fam.TRANSPOSED`)."""
    if key not in fam.TRANSPOSED:
        return w
    if isinstance(w, (LazyTensor, LazyStack)):  # swapped as it is read
        return w.swapaxes_last()
    return np.ascontiguousarray(np.swapaxes(w, -1, -2))


def _sharding_for(shardings: Shardings, path: str, shape: tuple):
    if shardings is None:
        return None
    if callable(shardings):
        return shardings(path, shape)
    node = shardings
    for part in path.split("/"):
        node = node[part]
    return node


def _place(arr, dtype, shardings: Shardings, path: str) -> jax.Array:
    """One leaf on its devices. `arr`: numpy, or a lazy HF tensor (`LazyTensor`,
    `LazyStack`) that is read block by block."""
    dt = jnp.dtype(dtype)
    target = _sharding_for(shardings, path, arr.shape)
    if target is None:
        # copy=False: no second host copy when the dtype already matches.
        whole = arr if isinstance(arr, np.ndarray) else arr[(slice(None),) * len(arr.shape)]
        return jax.device_put(whole.astype(dt, copy=False))
    # One device's slice at a time, converted on its own: a process sends only the slices
    # its own devices hold (multi-host), and the full tensor never sits on one device.
    return jax.make_array_from_callback(arr.shape, target,
                                        lambda idx: arr[idx].astype(dt, copy=False))


def _assemble(cfg: ModelConfig, read: Callable[[str, Optional[int]], tuple[str, np.ndarray]],
              shardings: Shardings, source: str,
              fix: Optional[Callable[[str, np.ndarray], np.ndarray]] = None) -> dict:
    """Builds the param tree leaf by leaf; `read(key, layer)` returns one checkpoint tensor
    `(name, [out, in] array)`, checked against the shape `cfg` implies, then passed through
    `fix(key, w)` when given (GGUF's Q/K row order).

    Raises:
        ValueError: a tensor whose shape disagrees with the config (names `source`, the
            tensor, both shapes).
    """
    dt = cfg.weight_dtype
    fam = registry.family(cfg)
    # The shape template the family's own init gives (traced, nothing allocated).
    want = jax.eval_shape(lambda key: fam.init_params(cfg, key), jax.random.PRNGKey(0))

    def checked(key, layer):
        name, w = read(key, layer)
        shape = want[key].shape if layer is None else want["layers"][key].shape[1:]
        if key in fam.TRANSPOSED:  # checkpoint: [..., out, in]
            shape = shape[:-2] + shape[-2:][::-1]
        if w.shape != shape:
            raise ValueError(f"{source}: tensor {name!r} has shape {w.shape}, the config "
                             f"expects {shape}: the file is corrupt or its config is wrong")
        return _to_ours(fam, key, fix(key, w) if fix else w)

    params: dict = {"layers": {}}
    for key in fam.top_keys(cfg):
        params[key] = _place(checked(key, None), dt, shardings, key)
    for key in fam.layer_keys(cfg):
        first = checked(key, 0)
        if isinstance(first, (LazyTensor, LazyStack)):  # read block by block in `_place`
            lazy = LazyStack([first] + [checked(key, i) for i in range(1, cfg.num_layers)])
            params["layers"][key] = _place(lazy, dt, shardings, f"layers/{key}")
            continue
        # One stacked leaf at a time on the host, placed and freed before the next is read.
        stacked = np.empty((cfg.num_layers,) + first.shape, np.float32)
        stacked[0] = first
        for i in range(1, cfg.num_layers):
            stacked[i] = checked(key, i)
        params["layers"][key] = _place(stacked, dt, shardings, f"layers/{key}")
        del stacked
    return params


# --------------------------------------------------------------------------- GGUF


def _unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverts llama.cpp's Q/K row permutation (interleaved -> half-split RoPE layout).

    llama.cpp's converter reshapes [out, in] rows as (n_head, 2, Dh/2) and swaps the last
    two of those axes; this applies the inverse per head.
    """
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def open_gguf(path: str):
    """Opens a GGUF file as a `gguf.GGUFReader` whose every read is checked against the
    file's size: a file cut short or corrupted fails here, before any tensor is read.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a GGUF file, or truncated or corrupt: the message names the file, its
            size and, when a read ran past the end, the size that read needs.
    """
    import gguf  # imported here: only needed for this format

    class Reader(gguf.GGUFReader):
        # The stock reader slices its memmap unchecked: a short file failed later with an
        # unrelated numpy error ("cannot reshape array of size ..."). All its reads go
        # through `_get`; `data_offset` is set once the header (with the tensor table) is read.
        def _get(self, offset, dtype, count=1, override_order=None):
            end = int(offset) + np.dtype(dtype).itemsize * int(count)
            if end > len(self.data):
                raise EOFError(end, "tensor data" if hasattr(self, "data_offset") else "header")
            return super()._get(offset, dtype, count, override_order)

    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if size >= 4 and magic != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (starts with {magic!r}, not b'GGUF')")
    bad = f"{path}: GGUF file is truncated or corrupt ({size} bytes"
    try:
        if size < 4:
            raise EOFError(4, "magic")
        return Reader(path)
    except EOFError as e:
        raise ValueError(f"{bad}; its {e.args[1]} needs at least {e.args[0]} bytes)") from None
    except Exception as e:  # the reader's own checks: unknown type codes, duplicate names
        raise ValueError(f"{bad}): {type(e).__name__}: {e}") from e


def gguf_metadata(reader) -> dict:
    """Scalar and string metadata fields of a `gguf.GGUFReader` as a plain dict."""
    meta = {}
    for name, field in reader.fields.items():
        if name in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                    "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            continue
        try:
            meta[name] = field.contents()
        except Exception:  # fields the reader cannot decode are not needed here
            continue
    return meta


def _f32_value(x) -> float:
    """GGUF stores floats as float32: 1e-5 reads back as 9.99999974e-06. The shortest decimal
    that round-trips in float32 recovers the written value (so configs equal the presets)."""
    return float(str(np.float32(x)))


def config_from_gguf(reader, dtype: str = "float32") -> ModelConfig:
    """ModelConfig from GGUF metadata (architectures `llama` and `qwen3`).

    Raises:
        ValueError: unsupported architecture or a missing metadata key (named).
    """
    meta = gguf_metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in ("llama", "qwen3"):
        raise ValueError(f"GGUF architecture {arch!r} is not supported (llama, qwen3)")

    def get(key, default=None):
        full = f"{arch}.{key}"
        if full not in meta and default is None:
            raise ValueError(f"GGUF metadata lacks {full!r}")
        return meta.get(full, default)

    names = {t.name for t in reader.tensors}
    dim, heads = int(get("embedding_length")), int(get("attention.head_count"))
    # Optional keys default as in llama.cpp (key_length = D / H, head_count_kv = H); vocab_size
    # may be absent, then the token list's length is V.
    head_dim = int(get("attention.key_length", dim // heads))
    vocab = int(meta.get(f"{arch}.vocab_size", 0)) or len(
        reader.fields["tokenizer.ggml.tokens"].data)
    return ModelConfig(
        vocab_size=vocab, dim=dim, num_layers=int(get("block_count")), num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)), head_dim=head_dim,
        hidden_dim=int(get("feed_forward_length")),
        rope_theta=_f32_value(get("rope.freq_base", 10000.0)),
        # Llama 3.1 files carry the scaling as a rope_freqs tensor: RopeScaling's defaults apply.
        rope_scaling=RopeScaling() if "rope_freqs.weight" in names else None,
        norm_eps=_f32_value(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in names, qk_norm=arch == "qwen3",
        max_seq_len=int(get("context_length", 8192)), dtype=dtype, param_dtype=dtype)


def load_gguf(path: str, dtype: str = "float32", shardings: Shardings = None,
              reader=None) -> tuple[ModelConfig, dict]:
    """Loads a GGUF checkpoint, dequantising Q4_0/Q4_1/Q8_0/F16/BF16/F32 tensors.

    Args:
        path: the .gguf file.
        dtype: compute and storage dtype of the returned params ("float32" | "bfloat16").
        shardings: optional target sharding per leaf: a pytree of shardings matching the
            params, or a callable `(path, shape) -> Sharding` (paths like "layers/wq").
        reader: an already-open reader of `path` (from `open_gguf`; saves a re-read).

    Returns:
        (ModelConfig, params).

    Raises:
        FileNotFoundError: no such file.  ValueError: truncated or corrupt file
            (`open_gguf`), unsupported architecture, a missing tensor or one whose shape
            disagrees with the metadata (each names the file).
    """
    import gguf  # imported here: only needed for this format

    reader = reader or open_gguf(path)
    try:
        cfg = config_from_gguf(reader, dtype)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    # Only the llama converter permutes the Q/K rows; qwen3 files keep the Hugging Face order.
    permute = gguf_metadata(reader)["general.architecture"] == "llama"
    tensors = {t.name: t for t in reader.tensors}
    fam = registry.family(cfg)

    def read(key, layer):
        name = (fam.TOP_WEIGHT_NAMES[key][1] if layer is None
                else f"blk.{layer}.{fam.LAYER_WEIGHT_NAMES[key][1]}")
        if name not in tensors:
            raise ValueError(f"{path}: tensor {name!r} missing")
        t = tensors[name]
        # Dequantised on the host one tensor at a time; `_assemble` casts to `dtype` on placing.
        return name, gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)

    def fix(key, w):
        if permute and key in ("wq", "wk"):
            return _unpermute_rows(w, cfg.num_heads if key == "wq" else cfg.num_kv_heads)
        return w

    return cfg, _assemble(cfg, read, shardings, path, fix)


# --------------------------------------------------------------------------- Hugging Face


def config_from_hf(hf: dict, dtype: str = "float32") -> ModelConfig:
    """ModelConfig from a Hugging Face `config.json` dict: the family (or alias) of its
    `model_type` (`registry.from_hf_model_type`) maps the fields (`config_from_hf` of the
    family module), an alias fixes its own.

    Raises:
        ValueError: unsupported `model_type` or rope scaling type; a required field absent or
            a field of the wrong kind (named).
    """
    fam, fixed = registry.from_hf_model_type(hf.get("model_type"))
    return ModelConfig(**{**fam.config_from_hf(hf), **fixed, "dtype": dtype,
                          "param_dtype": dtype, "family": fam.NAME})


def load_hf_dir(directory: str, dtype: str = "float32",
                shardings: Shardings = None) -> tuple[ModelConfig, dict]:
    """Loads a Hugging Face directory (config.json + single or sharded safetensors).

    Raises:
        FileNotFoundError: missing config.json or weight file (named).
        ValueError: a bad config.json field (named), a truncated or corrupt safetensors file,
            a missing tensor or one whose shape disagrees with config.json (each names the
            file or directory).
    """
    cfg_path = os.path.join(directory, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"{directory}: config.json not found")
    hf = json_file(cfg_path)
    try:
        cfg = config_from_hf(hf, dtype)
    except ValueError as e:
        raise ValueError(f"{cfg_path}: {e}") from e
    files = safetensors_files(directory)
    # All shards opened (and checked) before any tensor is read.
    handles = [open_safetensors(path) for path in files]
    # Tensor name -> the open shard that holds it.
    where = {k: h for h in handles for k in h.keys()}
    fam = registry.family(cfg)

    def get(name):
        if name not in where:
            raise ValueError(f"{directory}: tensor {name!r} missing from "
                             f"{', '.join(os.path.basename(p) for p in files)}")
        # Nothing is read yet: each device's block is read when it is placed (`_place`).
        part = where[name].get_slice(name)
        return LazyTensor(part, tuple(part.get_shape()))

    def read(key, layer):
        name = (fam.TOP_WEIGHT_NAMES[key][0] if layer is None
                else f"model.layers.{layer}.{fam.LAYER_WEIGHT_NAMES[key][0]}")
        if "{e}" in name:  # one tensor per expert, stacked on a leading E axis
            return name, LazyStack([get(name.format(e=e)) for e in range(cfg.num_experts)])
        return name, get(name)

    return cfg, _assemble(cfg, read, shardings, directory)
