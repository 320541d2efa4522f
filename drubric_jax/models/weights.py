"""Loading and exporting decoder weights: GGUF files, Hugging Face safetensors directories.

Every loader returns `(ModelConfig, params)` with params in the layout of the config's
model family (`drubric_jax.models.registry`), whose module also names the checkpoint
tensors. Tensors are read one at a time and placed on device (with an optional target
sharding per leaf) as soon as a stacked leaf is complete, so the host never holds a second
full copy of the model.

Sources followed: the GGUF format and `gguf` reader of llama.cpp (tensor names, the Q/K
row permutation done by llama.cpp's `convert_hf_to_gguf.py` for the `llama` architecture),
and the Hugging Face `LlamaForCausalLM` / `Qwen3ForCausalLM` parameter names.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Iterator, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax.models import registry
from drubric_jax.models.config import ModelConfig, RopeScaling

Shardings = Union[None, dict, Callable[[str], Optional[jax.sharding.Sharding]]]


def _to_ours(fam, key: str, w: np.ndarray) -> np.ndarray:
    """Checkpoint linear weights are [out, in]; ours are [in, out] (`fam.TRANSPOSED`)."""
    return np.ascontiguousarray(w.T) if key in fam.TRANSPOSED else w


def _sharding_for(shardings: Shardings, path: str):
    if shardings is None:
        return None
    if callable(shardings):
        return shardings(path)
    node = shardings
    for part in path.split("/"):
        node = node[part]
    return node


def _place(arr: np.ndarray, dtype, shardings: Shardings, path: str) -> jax.Array:
    return jax.device_put(arr.astype(jnp.dtype(dtype), copy=False),
                          _sharding_for(shardings, path))


def _assemble(cfg: ModelConfig, read: Callable[[str, Optional[int]], np.ndarray],
              shardings: Shardings) -> dict:
    """Builds the param tree leaf by leaf; `read(key, layer)` returns one [out, in] tensor."""
    dt = cfg.weight_dtype
    fam = registry.family(cfg)
    params: dict = {"layers": {}}
    for key in fam.top_keys(cfg):
        params[key] = _place(_to_ours(fam, key, read(key, None)), dt, shardings, key)
    for key in fam.layer_keys(cfg):
        first = _to_ours(fam, key, read(key, 0))
        stacked = np.empty((cfg.num_layers,) + first.shape, np.float32)
        stacked[0] = first
        for i in range(1, cfg.num_layers):
            stacked[i] = _to_ours(fam, key, read(key, i))
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
    head_dim = int(get("attention.key_length", dim // heads))
    vocab = int(meta.get(f"{arch}.vocab_size", 0)) or len(
        reader.fields["tokenizer.ggml.tokens"].data)
    return ModelConfig(
        vocab_size=vocab, dim=dim, num_layers=int(get("block_count")), num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)), head_dim=head_dim,
        hidden_dim=int(get("feed_forward_length")),
        rope_theta=_f32_value(get("rope.freq_base", 10000.0)),
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
            params, or a callable `path -> Sharding` (paths like "layers/wq").
        reader: an already-open `gguf.GGUFReader` (saves a re-read).

    Returns:
        (ModelConfig, params).

    Raises:
        FileNotFoundError: no such file.  ValueError: unsupported architecture/tensor.
    """
    import gguf  # imported here: only needed for this format

    if not os.path.exists(path):
        raise FileNotFoundError(f"GGUF file not found: {path}")
    reader = reader or gguf.GGUFReader(path)
    cfg = config_from_gguf(reader, dtype)
    permute = gguf_metadata(reader)["general.architecture"] == "llama"
    tensors = {t.name: t for t in reader.tensors}
    fam = registry.family(cfg)

    def read(key, layer):
        name = (fam.TOP_WEIGHT_NAMES[key][1] if layer is None
                else f"blk.{layer}.{fam.LAYER_WEIGHT_NAMES[key][1]}")
        if name not in tensors:
            raise ValueError(f"{path}: tensor {name!r} missing")
        t = tensors[name]
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if permute and key == "wq":
            w = _unpermute_rows(w, cfg.num_heads)
        elif permute and key == "wk":
            w = _unpermute_rows(w, cfg.num_kv_heads)
        return w

    return cfg, _assemble(cfg, read, shardings)


# --------------------------------------------------------------------------- Hugging Face


def config_from_hf(hf: dict, dtype: str = "float32") -> ModelConfig:
    """ModelConfig from a Hugging Face `config.json` dict (Llama or Qwen3).

    Raises:
        ValueError: unsupported `model_type` or rope scaling type.
    """
    model_type = hf.get("model_type")
    if model_type not in registry.HF_MODEL_TYPES:
        raise ValueError(f"config.json model_type {model_type!r} is not supported "
                         f"({', '.join(sorted(registry.HF_MODEL_TYPES))})")
    scaling = hf.get("rope_scaling") or (hf.get("rope_parameters") or {})
    rope_theta = hf.get("rope_theta", scaling.get("rope_theta", 10000.0))
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ValueError(f"config.json rope_scaling type {rope_type!r} is not supported")
    heads = hf["num_attention_heads"]
    return ModelConfig(
        vocab_size=hf["vocab_size"], dim=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        hidden_dim=hf["intermediate_size"], rope_theta=float(rope_theta),
        rope_scaling=RopeScaling(
            factor=scaling["factor"], low_freq_factor=scaling["low_freq_factor"],
            high_freq_factor=scaling["high_freq_factor"],
            original_max_position_embeddings=scaling["original_max_position_embeddings"],
        ) if rope_type == "llama3" else None,
        norm_eps=hf.get("rms_norm_eps", 1e-6), tie_embeddings=hf.get("tie_word_embeddings", False),
        qk_norm=model_type == "qwen3", max_seq_len=hf.get("max_position_embeddings", 8192),
        dtype=dtype, param_dtype=dtype, family=registry.HF_MODEL_TYPES[model_type])


def _safetensors_files(directory: str) -> Iterator[str]:
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            yield from sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(directory, "model.safetensors")):
        yield "model.safetensors"
    else:
        raise FileNotFoundError(f"{directory}: no model.safetensors or index")


def load_hf_dir(directory: str, dtype: str = "float32",
                shardings: Shardings = None) -> tuple[ModelConfig, dict]:
    """Loads a Hugging Face directory (config.json + single or sharded safetensors).

    Raises:
        FileNotFoundError: missing config.json or weights.  ValueError: missing tensor.
    """
    from safetensors import safe_open

    cfg_path = os.path.join(directory, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"{directory}: config.json not found")
    with open(cfg_path) as f:
        cfg = config_from_hf(json.load(f), dtype)
    handles = [safe_open(os.path.join(directory, name), framework="flax")
               for name in _safetensors_files(directory)]
    where = {k: h for h in handles for k in h.keys()}
    fam = registry.family(cfg)

    def read(key, layer):
        name = (fam.TOP_WEIGHT_NAMES[key][0] if layer is None
                else f"model.layers.{layer}.{fam.LAYER_WEIGHT_NAMES[key][0]}")
        if name not in where:
            raise ValueError(f"{directory}: tensor {name!r} missing")
        return np.asarray(where[name].get_tensor(name).astype(jnp.float32))

    return cfg, _assemble(cfg, read, shardings)


def hf_config_dict(cfg: ModelConfig, bos_id: int, eos_id: int) -> dict:
    """A `config.json` dict that transformers reads as LlamaForCausalLM / Qwen3ForCausalLM."""
    qwen = cfg.qk_norm
    out = {
        "architectures": ["Qwen3ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen3" if qwen else "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "mlp_bias": False, "bos_token_id": bos_id, "eos_token_id": eos_id,
        "torch_dtype": cfg.param_dtype,
    }
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        out["rope_scaling"] = {
            "rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings}
    return out


def export_hf_dir(params: dict, cfg: ModelConfig, directory: str, tokenizer=None,
                  bos_id: int = 1, eos_id: int = 2) -> None:
    """Writes params as a Hugging Face directory: config.json, model.safetensors and,
    when `tokenizer` (a PreTrainedTokenizerFast) is given, its tokenizer files.

    Weights keep their dtype; `load_hf_dir(export_hf_dir(p))` reproduces p exactly.
    """
    from safetensors.flax import save_file

    os.makedirs(directory, exist_ok=True)
    tensors = {}
    fam = registry.family(cfg)
    for key in fam.top_keys(cfg):
        w = params[key]
        tensors[fam.TOP_WEIGHT_NAMES[key][0]] = w.T if key in fam.TRANSPOSED else w
    for key in fam.layer_keys(cfg):
        stacked = params["layers"][key]
        for i in range(cfg.num_layers):
            w = stacked[i]
            name = f"model.layers.{i}.{fam.LAYER_WEIGHT_NAMES[key][0]}"
            tensors[name] = w.T if key in fam.TRANSPOSED else w
    save_file({k: jnp.asarray(v) for k, v in tensors.items()},
              os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config_dict(cfg, bos_id, eos_id), f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
