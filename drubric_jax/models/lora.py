"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

A trainee with `ModelConfig.lora_rank = r > 0` trains only low-rank adapters on a frozen
base: for each adapted matrix W [L, in, out] of the base,

    W' = W + (alpha / r) A B,    A [L, in, r] (small random),  B [L, r, out] (zeros),

so at initialisation W' = W exactly and the adapted model gives the base model's logits
bit for bit. The adapter leaves sit beside their matrix in the layer dict
("wq_lora_a", "wq_lora_b"), so `attach(base, adapters)` is a dict merge (no copy) and the
layer scan carries them with the base weights; the reference model of Eq. 23 is the base
with no adapter attached. `merge` folds the adapters into the weights for export.

Axis legend (docs/CONVENTIONS.md): L layers; here also r the adapter rank.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from drubric_jax.models.config import ModelConfig


def names(target: str) -> tuple[str, str]:
    """Leaf names of the adapter of matrix `target`: (A, B)."""
    return f"{target}_lora_a", f"{target}_lora_b"


def init_adapters(cfg: ModelConfig, base_shapes: dict, key: jax.Array) -> dict:
    """Fresh adapters {"layers": {name: array}} in `cfg.param_dtype` for cfg.lora_targets.

    A is uniform in +-1/sqrt(in) (the PEFT default, Kaiming-uniform with a = sqrt(5)), B is
    0, so the adapted model starts as the base model.

    Args:
        cfg: the trainee's config (lora_rank > 0).
        base_shapes: the base params or their `jax.eval_shape` structs.
        key: PRNG key (from the config seed).
    """
    dt = cfg.weight_dtype
    out = {}
    for i, target in enumerate(cfg.lora_targets):
        n_layers, d_in, d_out = base_shapes["layers"][target].shape
        a, b = names(target)
        bound = 1.0 / (d_in ** 0.5)
        # fold_in(key, i): each target matrix draws its own A.
        out[a] = jax.random.uniform(jax.random.fold_in(key, i), (n_layers, d_in, cfg.lora_rank),
                                    jnp.float32, -bound, bound).astype(dt)
        # B = 0: the trainee starts bit-exact on its reference, so KL and its gradient start at 0.
        out[b] = jnp.zeros((n_layers, cfg.lora_rank, d_out), dt)
    return {"layers": out}


def attach(base: dict, adapters: dict) -> dict:
    """The params a forward pass of the adapted model takes: base + adapter leaves."""
    return {**base, "layers": {**base["layers"], **adapters["layers"]}}


def linear(p: dict, name: str, h: jax.Array, cfg: ModelConfig) -> jax.Array:
    """h @ W in the compute dtype, plus (alpha / r) (h @ A) @ B when W has an adapter."""
    dt = cfg.compute_dtype
    y = h @ p[name].astype(dt)
    a, b = names(name)
    if a in p:
        # (h A) B: the [in, out] product A B is never formed.
        y = y + cfg.lora_scale * ((h @ p[a].astype(dt)) @ p[b].astype(dt))
    return y


def merge(base: dict, adapters: dict, cfg: ModelConfig) -> dict:
    """Base params with every adapter folded in, W + (alpha / r) A B, in float32 (export)."""
    layers = dict(base["layers"])
    for target in cfg.lora_targets:
        a, b = names(target)
        # In float32 and added to a float32 copy of W: the small update is not rounded away.
        delta = jnp.einsum("lir,lro->lio", adapters["layers"][a].astype(jnp.float32),
                           adapters["layers"][b].astype(jnp.float32))
        layers[target] = layers[target].astype(jnp.float32) + cfg.lora_scale * delta
    merged = {**base, "layers": layers}
    return jax.tree.map(lambda x: x.astype(jnp.float32), merged)


def adapter_specs(base_specs: dict) -> dict:
    """PartitionSpecs of the adapters from their matrices' (W [L, in, out] split (None, X, Y)
    gives A (None, X, None) and B (None, None, Y): r is small and stays whole)."""
    out = {}
    for target, spec in base_specs.items():
        # Only the stacked [L, in, out] matrices can carry adapters (not embed / lm_head).
        if len(spec) == 3:
            a, b = names(target)
            out[a] = P(spec[0], spec[1], None)
            out[b] = P(spec[0], None, spec[2])
    return out
