"""Qwen3 mixture-of-experts decoder (Qwen3-30B-A3B, the paper's verifier), as pure functions.

The same pre-norm blocks as the `llama` family with Qwen3's q/k-norm (attention, RoPE, KV
cache, per-layer decode form: `models.llama`), except that each layer's feed-forward part is
a mixture of E SwiGLU experts, following transformers' `Qwen3MoeSparseMoeBlock`:

    p = softmax(h W_router)                      float32[N, E], one row per token
    (w, e) = top-k of p                          k = cfg.num_experts_per_tok
    w = w / sum(w)                               when cfg.norm_topk_prob
    y = sum_j w_j * SwiGLU_{e_j}(h)

The k (token, expert) pairs of every token are sorted by expert, so each expert's rows are
contiguous, and reach the experts one of two ways (`ModelConfig.moe_dispatch`):
- "capacity" (default): each expert takes at most C rows (`capacity`), laid out in an
  [E, C, D] buffer that goes through the experts as one batched matmul. Temporaries and
  FLOPs grow with the routed rows (E * C ~ factor * N * k), on every backend; the pairs
  past an expert's C rows are dropped (GShard, Lepikhin et al. 2020, arXiv:2006.16668;
  Switch, Fedus et al. 2021, arXiv:2101.03961) and counted by `dropped_pairs`. As in
  GShard, the tokens are dispatched in G groups: under a mesh context
  (`parallel.rows_on`) each row shard's rows are one group with its own capacity
  (`parallel.row_groups`; G = 1 without one), so a device sorts and buffers only its own
  tokens and the expert weights are gathered as a dense layer's are (FSDP). Without the
  groups XLA's partitioner replicated the dispatch of all devices' tokens on every
  device: 4x the temporaries per token of one device's program at 8 devices.
- "ragged": one grouped matmul (`jax.lax.ragged_dot`): a grouped GEMM on TPU, but XLA's
  CPU and GPU compilers expand it into a dense masked product over all E experts. Every layer is
sparse (Qwen3-30B-A3B: `decoder_sparse_step` 1, no `mlp_only_layers`; other layouts are
refused when the config is read). Only the forward pass is needed: the verifier is frozen.

Router load (`router_load` of one layer, `router_load_counts` of a forward, `load_summary`):
the share of the real tokens' (token, expert) pairs each expert is routed, the busiest
expert against a uniform router, the pairs the capacity drops and the experts that get
none; the verifier logs them per step (`evaluator.chunked`, `rounds.step_metrics`).

Axis legend (docs/CONVENTIONS.md): N tokens of a call (B * T), E experts, k experts per
token, C rows per expert (capacity), D width, F expert width, L layers.

Parameter tree: the `llama` one with q/k norms, and instead of w_gate / w_up / w_down:
    layers/router [L, D, E]
    layers/we_gate, we_up [L, E, D, F]           layers/we_down [L, E, F, D]
"""
from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from drubric_jax import parallel
from drubric_jax.models import blocks, hf_config, llama
from drubric_jax.models.cache import KVCache
from drubric_jax.models.config import ModelConfig

# The registry's row (`models.llama` lists what each of these is for).
NAME = "qwen3_moe"
HF_MODEL_TYPE = "qwen3_moe"
HF_ARCHITECTURE = "Qwen3MoeForCausalLM"
# Attention goes through `lora.linear` (`blocks.layer`); the experts' grouped matmuls do not.
LORA_TARGETS = ("wq", "wk", "wv", "wo")
_EXPERT = "mlp.experts.{e}."
# ours -> (Hugging Face suffix under model.layers.{i}. ("{e}": one tensor per expert,
# stacked on the E axis), GGUF name: none, this family loads from safetensors only)
LAYER_WEIGHT_NAMES = {
    **{k: v for k, v in llama.LAYER_WEIGHT_NAMES.items()
       if k not in ("w_gate", "w_up", "w_down")},
    "router": ("mlp.gate.weight", None),
    "we_gate": (_EXPERT + "gate_proj.weight", None),
    "we_up": (_EXPERT + "up_proj.weight", None),
    "we_down": (_EXPERT + "down_proj.weight", None),
}
TOP_WEIGHT_NAMES = llama.TOP_WEIGHT_NAMES
# Experts over fsdp (each device holds E / fsdp experts of every layer), their width F over
# tensor; attention as in `llama`.
PARAM_SPECS = {
    **{k: v for k, v in llama.PARAM_SPECS.items() if not k.startswith(("w_gate", "w_up",
                                                                         "w_down"))},
    "router": P(None, "fsdp", None),                # [L, D, E]
    "we_gate": P(None, "fsdp", None, "tensor"),     # [L, E, D, F]
    "we_up": P(None, "fsdp", None, "tensor"),       # [L, E, D, F]
    "we_down": P(None, "fsdp", "tensor", None),     # [L, E, F, D]
}
# Checkpoints store [out, in] per matrix (per expert); ours are [in, out].
TRANSPOSED = frozenset({"wq", "wk", "wv", "wo", "router", "we_gate", "we_up", "we_down",
                        "lm_head"})
unstack_layers = llama.unstack_layers
logits_from_hidden = llama.logits_from_hidden


def layer_keys(cfg: ModelConfig) -> list[str]:
    """Names of the stacked per-layer leaves."""
    return ["attn_norm", "wq", "wk", "wv", "wo", "q_norm", "k_norm", "mlp_norm", "router",
            "we_gate", "we_up", "we_down"]


def top_keys(cfg: ModelConfig) -> list[str]:
    return llama.top_keys(cfg)


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
    """Random parameters (normal, std 0.02; norms at 1) in `cfg.param_dtype`: tiny test
    models and the shape template of the loaders."""
    k_dense, k_moe = jax.random.split(key)
    dense = llama.init_params(cfg.replace(qk_norm=True, family="llama"), k_dense)
    layers = {k: v for k, v in dense["layers"].items() if k not in ("w_gate", "w_up", "w_down")}
    l, d, f, e = cfg.num_layers, cfg.dim, cfg.hidden_dim, cfg.num_experts
    keys = iter(jax.random.split(k_moe, 4))

    def normal(shape):
        return (0.02 * jax.random.normal(next(keys), shape, jnp.float32)).astype(
            cfg.weight_dtype)

    layers.update(router=normal((l, d, e)), we_gate=normal((l, e, d, f)),
                  we_up=normal((l, e, d, f)), we_down=normal((l, e, f, d)))
    return {**dense, "layers": layers}


def route(cfg: ModelConfig, router: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Top-k routing of tokens x [..., D] (module docstring): (weights [..., k] in x's
    dtype, expert ids int32[..., k]). The softmax is over all E experts in float32, as
    transformers computes it; the weights are then cast to the hidden dtype, as it does."""
    logits = jnp.einsum("...d,de->...e", x, router.astype(x.dtype),
                        preferred_element_type=jnp.float32)
    weights, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), cfg.num_experts_per_tok)
    if cfg.norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights.astype(x.dtype), experts.astype(jnp.int32)


def capacity(cfg: ModelConfig, n: int) -> int:
    """C, rows per expert of the "capacity" dispatch for n tokens: min(n, ceil(factor *
    n * k / E)), n when the factor is 0 (a token routes to an expert at most once, so an
    expert never gets more than n rows: nothing is dropped)."""
    if not cfg.moe_capacity_factor:
        return n
    k, e = cfg.num_experts_per_tok, cfg.num_experts
    return max(1, min(n, math.ceil(cfg.moe_capacity_factor * n * k / e)))


def _sorted_pairs(cfg: ModelConfig, experts: jax.Array):
    """The N * k (token, expert) pairs sorted by expert (stable): (order int32[N * k] into
    the flat pairs, expert of each sorted pair int32[N * k], its position in its expert's
    rows int32[N * k], rows per expert int32[E])."""
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=cfg.num_experts).astype(jnp.int32)
    expert = flat[order]
    starts = jnp.cumsum(sizes) - sizes
    return order, expert, jnp.arange(flat.shape[0]) - starts[expert], sizes


def dispatch_groups(cfg: ModelConfig, b: int) -> int:
    """G, the groups the tokens of a [B, T, D] call are dispatched in (module docstring):
    `parallel.row_groups(B)` under the "capacity" dispatch, 1 under "ragged"."""
    return parallel.row_groups(b) if cfg.moe_dispatch == "capacity" else 1


def _grouped(cfg: ModelConfig, h: jax.Array) -> jax.Array:
    """h [B, T, D] as [G, B / G * T, D], group g holding rows [g B / G, (g + 1) B / G)
    (a row shard's rows), pinned to the row shards."""
    b, t, d = h.shape
    g = dispatch_groups(cfg, b)
    return parallel.constrain_rows(h.reshape(g, (b // g) * t, d))


def dropped_pairs(cfg: ModelConfig, router: jax.Array, h: jax.Array) -> jax.Array:
    """int32[] (token, expert) pairs of h [B, T, D] that the "capacity" dispatch drops at
    this layer's router [D, E] (0 under "ragged"): the router-load figure to log. Counted
    per dispatch group, each with its own capacity, as `moe_mlp` dispatches."""
    if cfg.moe_dispatch != "capacity":
        return jnp.zeros((), jnp.int32)

    def one(x):  # one group's tokens [n, D]
        _, experts = route(cfg, router, x)
        _, _, position, _ = _sorted_pairs(cfg, experts)
        return jnp.sum(position >= capacity(cfg, x.shape[0])).astype(jnp.int32)

    return jnp.sum(jax.vmap(one)(_grouped(cfg, h)))


def _ragged_mlp(cfg: ModelConfig, p: dict, x: jax.Array) -> jax.Array:
    """The "ragged" dispatch of tokens x [N, D] -> float32 [N, D]."""
    k, dt = cfg.num_experts_per_tok, cfg.compute_dtype
    weights, experts = route(cfg, p["router"], x)
    order, _, _, sizes = _sorted_pairs(cfg, experts)
    token = order // k                                       # the token of each sorted row
    xs = jnp.take(x, token, axis=0)                          # [N * k, D]

    def grouped(lhs, w):  # row r times the matrix of the expert it belongs to
        return jax.lax.ragged_dot(lhs, w.astype(dt), sizes,
                                  preferred_element_type=jnp.float32).astype(dt)

    act = jax.nn.silu(grouped(xs, p["we_gate"])) * grouped(xs, p["we_up"])
    y = grouped(act, p["we_down"]) * jnp.take(weights.reshape(-1), order)[:, None]
    # Each token sums its k expert outputs (index_add in transformers), in float32.
    return jnp.zeros(x.shape, jnp.float32).at[token].add(y.astype(jnp.float32))


def _capacity_mlp(cfg: ModelConfig, p: dict, x: jax.Array) -> jax.Array:
    """The "capacity" dispatch of one group's tokens x [n, D] -> float32 [n, D]."""
    (n, d), k, e, dt = x.shape, cfg.num_experts_per_tok, cfg.num_experts, cfg.compute_dtype
    weights, experts = route(cfg, p["router"], x)
    order, expert, position, _ = _sorted_pairs(cfg, experts)
    token = order // k                                       # the token of each sorted row
    c = capacity(cfg, n)
    # Sorted pair r goes to row `position` of its expert's C rows; pairs past C go to a
    # spare row E * C, which no expert reads and whose output is 0.
    slot = jnp.where(position < c, expert * c + position, e * c)
    xe = jnp.zeros((e * c + 1, d), x.dtype).at[slot].set(jnp.take(x, token, axis=0))
    xe = xe[:-1].reshape(e, c, d)

    def batched(lhs, w):  # [E, C, .] times each expert's matrix
        return jnp.einsum("ecd,edf->ecf", lhs, w.astype(dt),
                          preferred_element_type=jnp.float32).astype(dt)

    act = jax.nn.silu(batched(xe, p["we_gate"])) * batched(xe, p["we_up"])
    ye = batched(act, p["we_down"]).reshape(e * c, d)
    y = jnp.concatenate([ye, jnp.zeros((1, d), dt)])[slot]                # [n * k, D]
    y = y * jnp.take(weights.reshape(-1), order)[:, None]
    # Each token sums its k expert outputs (index_add in transformers), in float32.
    return jnp.zeros((n, d), jnp.float32).at[token].add(y.astype(jnp.float32))


def moe_mlp(cfg: ModelConfig, p: dict, h: jax.Array) -> jax.Array:
    """The mixture-of-experts feed-forward part of one layer, h [B, T, D] -> [B, T, D]:
    "ragged" over all B * T tokens at once, "capacity" per dispatch group (module
    docstring; one group without a mesh context)."""
    b, t, d = h.shape
    if cfg.moe_dispatch == "ragged":
        out = _ragged_mlp(cfg, p, h.reshape(b * t, d))
    else:
        out = parallel.constrain_rows(jax.vmap(lambda x: _capacity_mlp(cfg, p, x))(
            _grouped(cfg, h)))
    return out.astype(h.dtype).reshape(b, t, d)


def forward_hidden(params: dict, cfg: ModelConfig, tokens: jax.Array, positions: jax.Array,
                   token_mask: Optional[jax.Array] = None, cache: Optional[KVCache] = None,
                   remat: bool = False) -> tuple[jax.Array, Optional[KVCache]]:
    """`llama.forward_hidden` (same arguments, cache and outputs) with `moe_mlp` as every
    layer's feed-forward part."""
    return llama.forward_hidden(params, cfg, tokens, positions, token_mask, cache,
                                remat=remat, mlp=moe_mlp)


def forward_shared_hidden(params: dict, cfg: ModelConfig, prefix_tokens: jax.Array,
                          prefix_mask: jax.Array, tokens: jax.Array, token_mask: jax.Array,
                          remat: bool = False) -> tuple[jax.Array, jax.Array]:
    """`llama.forward_shared_hidden` with `moe_mlp`: under the "capacity" dispatch a packed
    group is one row of P + R N tokens, whose capacity (`capacity`) counts those tokens;
    with a factor that drops none the outputs are the rows' own."""
    return llama.forward_shared_hidden(params, cfg, prefix_tokens, prefix_mask, tokens,
                                       token_mask, remat=remat, mlp=moe_mlp)


def router_load(cfg: ModelConfig, router: jax.Array, h: jax.Array,
                token_mask: Optional[jax.Array] = None) -> dict:
    """Router load of one layer: where the real tokens of h go, and what the capacity drops.

    The same routing (`route`), dispatch groups and capacity per group C =
    `capacity(cfg, N / G)` as `moe_mlp` over the N = B * T tokens of the call (padding
    tokens are routed by `moe_mlp` too and take expert rows), but only the pairs of real
    tokens are counted: padding never adds to
    a load or to the dropped pairs. Pairs are counted as routed (the router's top-k
    choices, before the capacity); a pair is dropped when its row in its expert's sorted
    rows is >= C (GShard, Lepikhin et al. 2020, arXiv:2006.16668; Switch, Fedus et al.
    2021, arXiv:2101.03961): with an all-True mask, `dropped` is `dropped_pairs`.

    Args:
        router: [D, E] this layer's router.  h: [B, T, D] the feed-forward input.
        token_mask: bool[B, T], False at padding; None: every token is real.

    Returns:
        {"pairs": int32[E] real (token, expert) pairs routed to each expert,
         "dropped": int32[] of them dropped by the capacity (0 under "ragged"),
         "routed": int32[] real pairs, N_real * k}.
    """
    b, t, _ = h.shape
    k = cfg.num_experts_per_tok
    real = jnp.ones((b, t), bool) if token_mask is None else token_mask
    x = _grouped(cfg, h)                                   # [G, n, D], as moe_mlp groups
    real = real.reshape(x.shape[:2])

    def one(x, real):  # one dispatch group: its tokens [n, D] and their mask bool[n]
        _, experts = route(cfg, router, x)
        real_pair = jnp.repeat(real, k)                    # flat pair n * k + j: token n
        pairs = jnp.zeros((cfg.num_experts,), jnp.int32).at[experts.reshape(-1)].add(
            real_pair.astype(jnp.int32))
        dropped = jnp.zeros((), jnp.int32)
        if cfg.moe_dispatch == "capacity":
            order, _, position, _ = _sorted_pairs(cfg, experts)
            dropped = jnp.sum((position >= capacity(cfg, x.shape[0]))
                              & real_pair[order]).astype(jnp.int32)
        return pairs, dropped

    pairs, dropped = jax.vmap(one)(x, real)
    return {"pairs": jnp.sum(pairs, axis=0), "dropped": jnp.sum(dropped),
            "routed": (jnp.sum(real) * k).astype(jnp.int32)}


def router_load_counts(params: dict, cfg: ModelConfig, tokens: jax.Array,
                       positions: jax.Array, token_mask: jax.Array) -> dict:
    """`router_load` of every layer, from one forward without a cache over tokens int32[B, T]
    (positions int32[B, T], token_mask bool[B, T]): the routing a prefill of these tokens
    into a fresh cache makes (the same causal attention over the call's real tokens, the
    same capacity). The layers run as in `llama.forward_hidden`'s scan, with the router
    load as each layer's scan output; the LM head is not run.

    Returns:
        {"pairs": int32[L, E], "dropped": int32[L], "routed": int32[L]} (`load_summary`
        turns them into the figures to log).
    """
    inv_freq = llama.rope_inv_freq(cfg)
    x = jnp.take(params["embed"], tokens, axis=0).astype(cfg.compute_dtype)

    def body(x, p):
        loads = []

        def mlp(cfg_, p_, h):  # the layer's mixture of experts, its load recorded
            loads.append(router_load(cfg_, p_["router"], h, token_mask))
            return moe_mlp(cfg_, p_, h)

        # `blocks.layer`: the block of `forward_hidden` (no cache: keys are this call's).
        x, _ = blocks.layer(cfg, p, x, positions, inv_freq,
                            blocks.self_attention(cfg, token_mask), mlp)
        return x, loads[0]

    _, loads = jax.lax.scan(body, x, params["layers"])
    return loads


def load_summary(counts: dict) -> dict:
    """The router-load figures of `router_load_counts` (or sums of them over calls), host
    numpy. Per layer l, with n_l = routed[l] real (token, expert) pairs and E experts:

        fraction [L, E]   pairs / n_l, the share of the routed pairs each expert received
        max_load [L]      max_e pairs * E / n_l: the busiest expert against a uniform
                          router (1.0 = balanced, E / k = every token on the same k experts)
        dropped_frac [L]  dropped / n_l
        dead [L]          experts that received no pair

    Layers with no real pair (n_l = 0) give fraction and max_load 0 and dropped_frac 0.
    """
    pairs = np.asarray(counts["pairs"], np.float64)
    routed = np.asarray(counts["routed"], np.float64)
    denom = np.maximum(routed, 1.0)
    return {"fraction": pairs / denom[:, None],
            "max_load": pairs.max(axis=-1) * pairs.shape[-1] / denom,
            "dropped_frac": np.asarray(counts["dropped"], np.float64) / denom,
            "dead": np.sum(pairs == 0, axis=-1)}


def config_from_hf(hf: dict) -> dict:
    """The ModelConfig fields (no dtype, no family) of a Hugging Face `qwen3_moe`
    config.json: the dense ones (`hf_config.dense_from_hf`) with F the expert width
    `moe_intermediate_size`, q/k-norm, and E, k and the routing normalisation.

    Raises:
        ValueError: a layout with dense layers (`mlp_only_layers`, `decoder_sparse_step`
            other than 1), which this family does not implement; a required field absent or
            of the wrong kind (named).
    """
    def field(name, kind, default=None):
        return hf_config.hf_field(hf, name, kind, default)

    if hf.get("mlp_only_layers") or field("decoder_sparse_step", int, 1) != 1:
        raise ValueError("config.json: qwen3_moe with dense layers (mlp_only_layers, "
                         "decoder_sparse_step != 1) is not supported; every layer must be "
                         "sparse")
    # transformers 5 writes num_local_experts; the Qwen checkpoints say num_experts.
    experts = field("num_experts", int, hf.get("num_local_experts"))
    moe = dict(hidden_dim=field("moe_intermediate_size", int), num_experts=experts,
               num_experts_per_tok=field("num_experts_per_tok", int),
               norm_topk_prob=field("norm_topk_prob", bool, False), qk_norm=True)
    return {**hf_config.dense_from_hf(hf, hidden_dim=moe["hidden_dim"]), **moe}


def config_to_hf(cfg: ModelConfig, bos_id: int, eos_id: int) -> dict:
    """Export's config.json fields: not implemented (only trainees are exported, and this
    family is the frozen verifier).

    Raises:
        NotImplementedError: always (names the family).
    """
    raise NotImplementedError(f"export of the {cfg.family!r} family is not implemented")


# The planner counts an expert's activations at width F, as a dense layer's (what it
# counted before the families declared their widths).


def activation_widths(cfg: ModelConfig) -> tuple[int, int, int]:
    """Per-token widths of one layer's activations for the memory planner (`memory.terms`):
    `llama.activation_widths` with no dense feed-forward width; the experts' buffers are
    counted per routed row instead (`memory.inference_terms.routed_expert_bytes`)."""
    d, _, q = llama.activation_widths(cfg)
    return d, 0, q
