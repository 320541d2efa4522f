"""Model families behind one interface: the only way sampling, verification and training
reach a model.

A family is one module that implements, over a plain parameter pytree:

    init_params(cfg, key) -> params
    forward_hidden(params, cfg, tokens, positions, token_mask, cache, remat) -> (hidden, cache)
    forward_shared_hidden(params, cfg, prefix_tokens, prefix_mask, tokens, token_mask, remat)
        -> (prefix hidden, suffix hidden): groups of one prefix and R suffixes, the prefix
        run once (the shared-prefix update)
    logits_from_hidden(params, cfg, hidden) -> float32[..., V]
    unstack_layers(params) -> params in the per-layer form used by decode loops

uses the shared `models.cache.KVCache`, and declares everything else the package reads of
it, so that nothing outside the module names a family:

    NAME                       `ModelConfig.family`
    HF_MODEL_TYPE, HF_ARCHITECTURE   config.json `model_type` and transformers class
    config_from_hf(hf) -> dict       ModelConfig fields of a config.json (`models.weights`)
    config_to_hf(cfg, bos_id, eos_id) -> dict   config.json fields of an export
                                     (`models.export`)
    LAYER_WEIGHT_NAMES, TOP_WEIGHT_NAMES, TRANSPOSED, layer_keys(cfg), top_keys(cfg)
                               checkpoint tensor names (loading and export)
    LORA_TARGETS               the matrices LoRA may adapt (`lora_targets`, `config_check`)
    PARAM_SPECS                {leaf name: PartitionSpec} over the mesh axes (`param_specs`)
    activation_widths(cfg)     (D, F, H*Dh) per-token widths (the planner, `memory.terms`)

`FAMILIES` lists the family modules by `NAME`; `ALIASES` adds Hugging Face model types that
are a family with some ModelConfig fields fixed (dense Qwen3: the `llama` family with
q/k-norm). Adding a family = its module + its row in `FAMILIES`; adding an alias = a row
in `ALIASES` (docs/CONVENTIONS.md has both recipes).

The functions below dispatch on `cfg.family`; `cfg` is a static (hashable) argument under
`jax.jit`, so the dispatch costs nothing at run time.

Axis legend (docs/CONVENTIONS.md): R rows, T tokens, S cache slots, D width, V vocab.
"""
from __future__ import annotations

import types
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from drubric_jax import parallel
from drubric_jax.models import cache as cache_lib
from drubric_jax.models import llama, qwen3_moe
from drubric_jax.models.cache import KVCache
from drubric_jax.models.config import ModelConfig

FAMILIES: dict[str, types.ModuleType] = {module.NAME: module for module in (
    llama,  # Llama 2/3/3.1, SmolLM2, dense Qwen3 (alias "qwen3")
    qwen3_moe,  # Qwen3 mixture of experts (Qwen3-30B-A3B)
)}


class Alias(NamedTuple):
    """A Hugging Face `model_type` served by a family with some ModelConfig fields fixed:
    loading sets `fields` over what config.json says; export writes this model type and
    `architecture` for a config whose fields match."""

    family: str        # a key of FAMILIES
    architecture: str  # the transformers class named in config.json "architectures"
    fields: dict       # {ModelConfig field: value}


ALIASES: dict[str, Alias] = {
    "qwen3": Alias("llama", "Qwen3ForCausalLM", {"qk_norm": True}),
}


def family(cfg: ModelConfig) -> types.ModuleType:
    """The module implementing `cfg.family`.

    Raises:
        KeyError: an unknown family, listing the known ones.
    """
    try:
        return FAMILIES[cfg.family]
    except KeyError:
        raise KeyError(f"unknown model family {cfg.family!r}; known: {sorted(FAMILIES)}") \
            from None


def from_hf_model_type(model_type: str) -> tuple[types.ModuleType, dict]:
    """(family module, fixed ModelConfig fields) of a config.json `model_type`: a family's
    own `HF_MODEL_TYPE` (no fixed fields) or an alias.

    Raises:
        ValueError: an unknown model type, listing the supported ones.
    """
    for module in FAMILIES.values():
        if module.HF_MODEL_TYPE == model_type:
            return module, {}
    if model_type in ALIASES:
        alias = ALIASES[model_type]
        return FAMILIES[alias.family], dict(alias.fields)
    known = sorted([m.HF_MODEL_TYPE for m in FAMILIES.values()] + list(ALIASES))
    raise ValueError(f"config.json model_type {model_type!r} is not supported "
                     f"({', '.join(known)})")


def to_hf_model_type(cfg: ModelConfig) -> tuple[str, str]:
    """(config.json `model_type`, transformers class) of `cfg`: the alias of its family
    whose fixed fields `cfg` has (the one fixing most fields when several do), else the
    family's own."""
    module = family(cfg)
    matches = [(len(a.fields), name, a.architecture) for name, a in ALIASES.items()
               if a.family == cfg.family
               and all(getattr(cfg, k) == v for k, v in a.fields.items())]
    if not matches:
        return module.HF_MODEL_TYPE, module.HF_ARCHITECTURE
    _, name, architecture = max(matches)
    return name, architecture


def lora_targets() -> tuple:
    """The matrices LoRA may adapt in some registered family (`LORA_TARGETS` of each, in
    order, without repeats): what `config.lora.targets` may name."""
    return tuple(dict.fromkeys(t for m in FAMILIES.values() for t in m.LORA_TARGETS))


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
    """Random parameters of `cfg` (tiny test models; shape templates via jax.eval_shape)."""
    return family(cfg).init_params(cfg, key)


def init_cache(cfg: ModelConfig, batch: int, num_slots: int) -> KVCache:
    """Empty KV cache of `num_slots` slots for `batch` rows."""
    return cache_lib.init_cache(cfg, batch, num_slots)


def forward_hidden(params: dict, cfg: ModelConfig, tokens: jax.Array, positions: jax.Array,
                   token_mask: Optional[jax.Array] = None, cache: Optional[KVCache] = None,
                   remat: bool = False) -> tuple[jax.Array, Optional[KVCache]]:
    """Final-norm hidden states [R, T, D] (and the updated cache).

    Args:
        tokens: int32[R, T]; positions: int32[R, T] RoPE positions; token_mask: bool[R, T]
            (False = padding, never attended to; default all True).
        cache: None for a causal pass over the T tokens; else the T tokens are written at
            cache.index and attend to every valid earlier slot; or the engine's paged
            cache (`models.paged.PagedKV`, T = 1: each slot's token at its live length).
        remat: recompute each layer in the backward pass (training).
    """
    return family(cfg).forward_hidden(params, cfg, tokens, positions, token_mask, cache,
                                      remat=remat)


def forward_shared_hidden(params: dict, cfg: ModelConfig, prefix_tokens: jax.Array,
                          prefix_mask: jax.Array, tokens: jax.Array, token_mask: jax.Array,
                          remat: bool = False) -> tuple[jax.Array, jax.Array]:
    """Final-norm hidden states of groups of one prefix and R suffixes, each prefix run once:
    (prefix [Gn, P, D], suffixes [Gn, R, N, D]); suffix r's equal the row [prefix | suffix
    r] of `forward_hidden` (`llama.forward_shared_hidden`).

    Args:
        prefix_tokens: int32[Gn, P]; prefix_mask: bool[Gn, P] (left padding False).
        tokens: int32[Gn, R, N]; token_mask: bool[Gn, R, N] (right padding False).
        remat: recompute each layer in the backward pass (training).
    """
    return family(cfg).forward_shared_hidden(params, cfg, prefix_tokens, prefix_mask, tokens,
                                             token_mask, remat=remat)


def logits_from_hidden(params: dict, cfg: ModelConfig, hidden: jax.Array) -> jax.Array:
    """float32[..., V] next-token logits from hidden states [..., D]."""
    return family(cfg).logits_from_hidden(params, cfg, hidden)


def apply(params: dict, cfg: ModelConfig, tokens: jax.Array, positions: jax.Array,
          cache: Optional[KVCache] = None,
          token_mask: Optional[jax.Array] = None) -> tuple[jax.Array, Optional[KVCache]]:
    """Full forward pass: `(logits float32[R, T, V], cache)`.

    For long sequences prefer `forward_hidden` + `logits_from_hidden` on the positions you
    need: [R, T, V] float32 is large.
    """
    hidden, cache = forward_hidden(params, cfg, tokens, positions, token_mask, cache)
    return logits_from_hidden(params, cfg, hidden), cache


def per_layer_decode(backend: Optional[str] = None) -> bool:
    """Whether decode loops run on per-layer copies of the weights and the cache, made once
    per loop: on CPU and GPU, where XLA copies a scanned layer's slices before each matmul
    on every step. On one H200 (Qwen3-8B, bfloat16, `experiments.device_check
    --decode_form=...`) the per-layer form decoded 2.1x faster (B = 1: 6.1 vs 12.8 ms a
    step, 53% vs 25% of the HBM roofline; B = 256: 21.1 vs 46.1 ms) for one more copy of
    the block weights and of the KV cache in device memory (peak 115 vs 59 GB at B = 256;
    the planner counts both). TPUs keep the stacked form (not measured here).

    This is the default of `ModelConfig.decode_form = "auto"` (`decode_per_layer`), read on
    the host; no traced function reads it.

    Args:
        backend: "cpu", "gpu" or "tpu" (the planner's target); None: `jax.default_backend()`.
    """
    return (backend or jax.default_backend()) in ("cpu", "gpu")


def decode_per_layer(cfg: ModelConfig, backend: Optional[str] = None) -> bool:
    """Whether decode loops of `cfg` run on per-layer weights and caches:
    `cfg.decode_form`, "auto" being the backend's (`per_layer_decode(backend)`; the planner
    passes its target). Host-side: the sampler entry points read it once, before anything
    is traced, to make their weight copy (`decode_params`); the traced loops follow the
    form of the weights given."""
    if cfg.decode_form == "auto":
        return per_layer_decode(backend)
    return cfg.decode_form == "per_layer"


def is_per_layer(params: dict) -> bool:
    """Whether `params` are in the per-layer form (`decode_params`: "layers" a tuple of L
    dicts). A static fact of the pytree, which traced decode loops dispatch on."""
    return isinstance(params["layers"], (list, tuple))


def decode_params(params: dict, cfg: ModelConfig) -> dict:
    """Params in the form a decode loop of `cfg` runs on (`decode_per_layer`): per-layer
    arrays, else unchanged. Pair with `decode_cache`."""
    if is_per_layer(params) or not decode_per_layer(cfg):
        return params
    return family(cfg).unstack_layers(params)


def decode_cache(cache: KVCache, per_layer: bool) -> KVCache:
    """The cache in the per-layer form when `per_layer` (as the loop's weights are,
    `is_per_layer`), else unchanged."""
    if not per_layer or isinstance(cache.k, tuple):
        return cache
    return cache_lib.unstack_cache(cache)


def positions_from_mask(token_mask: jax.Array) -> jax.Array:
    """int32[R, T] RoPE positions counting only real tokens (left padding gets 0)."""
    # Real tokens count 0, 1, ... from each row's first; left padding (cumsum 0) clamps to 0.
    return jnp.maximum(jnp.cumsum(token_mask.astype(jnp.int32), axis=-1) - 1, 0)


def param_specs() -> dict:
    """{leaf name: PartitionSpec} of every registered model family (`PARAM_SPECS` of each
    family module; a name two families share must have one spec).

    fsdp splits D, tensor splits heads / F / V; the stacked layer axis L stays whole; norms
    (and anything not named, e.g. optimizer counters) are replicated. The same rules apply
    to optimizer moments, whose tree mirrors the params.

    Raises:
        ValueError: two families give the same leaf name different specs.
    """
    specs: dict = {}
    for name, module in FAMILIES.items():
        for leaf, spec in module.PARAM_SPECS.items():
            if specs.setdefault(leaf, spec) != spec:
                raise ValueError(f"family {name!r} gives {leaf!r} the spec {spec}, another "
                                 f"family {specs[leaf]}")
    return specs


def param_shardings(tree, mesh) -> object:
    """`parallel.param_shardings` with the model families' rules (`param_specs`): the
    NamedSharding pytree of params, a TrainState or their shapes on `mesh`."""
    return parallel.param_shardings(tree, mesh, param_specs())


def leaf_sharder(mesh):
    """`parallel.leaf_sharder` with the model families' rules: `(path, shape) ->
    NamedSharding` for loaders that place one tensor at a time."""
    return parallel.leaf_sharder(mesh, param_specs())
