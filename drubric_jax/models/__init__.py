"""Decoder LM (Llama family, Qwen3 switch), its loaders and exporter."""

from drubric_jax.models.config import ModelConfig, PRESETS, preset
from drubric_jax.models.llama import (KVCache, apply, forward_hidden, init_cache, init_params,
                                      logits_from_hidden, positions_from_mask)
from drubric_jax.models.weights import export_hf_dir, load_gguf, load_hf_dir
from drubric_jax.models.default import (DEFAULT_MODEL, default_gguf_path, load_default,
                                        load_model)
