"""Decoder LMs behind one interface (`registry`), their loaders and exporter.

Callers use the names exported here: `forward_hidden`, `logits_from_hidden`, `apply`,
`init_params`, `init_cache`, `decode_params`, `positions_from_mask` dispatch on
`ModelConfig.family` (`registry.FAMILIES`); `load_model` loads any supported source.
"""

from drubric_jax.models.cache import (KVCache, add_chunk, repeat_rows, stack_cache,
                                      unstack_cache)
from drubric_jax.models.config import ModelConfig, PRESETS, preset
from drubric_jax.models.registry import (FAMILIES, apply, decode_cache, decode_params,
                                         decode_per_layer, family, forward_hidden,
                                         forward_shared_hidden,
                                         init_cache, init_params, is_per_layer,
                                         leaf_sharder, logits_from_hidden, lora_targets,
                                         param_shardings, param_specs, per_layer_decode,
                                         positions_from_mask)
from drubric_jax.models.export import export_hf_dir
from drubric_jax.models.weights import load_gguf, load_hf_dir
from drubric_jax.models.default import (DEFAULT_MODEL, check_source, default_gguf_path,
                                        load_default, load_model, load_tokenizer)
