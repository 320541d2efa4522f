"""The decode primitives of the sampler: prefill, one sampled token, one forward token,
and the jitted decode loop, on a static-shape KV cache.

A step is `sample_token` then `forward_token`; `decode_loop` runs them in a
`lax.while_loop` until every row has emitted a stop id or N tokens were generated. With a
per-row token constraint the two run as separate jitted calls from a host loop
(`sampling.constrained.decode`).

Axis legend (docs/CONVENTIONS.md): B rows, P padded prompt length, N max new tokens,
S = P + N cache slots, V vocab.

Log-probs: `logprobs[b, t]` is log softmax(logits / temperature) of the sampled token over
the full vocabulary (before top-k/top-p truncation and before any constraint mask), the
quantity the GRPO ratio uses (METHOD section 11). Greedy decoding reports temperature-1
log-probs; logits are never divided by 0.
"""
from __future__ import annotations

import functools
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from drubric_jax import models, parallel
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling.methods import Method, sample_logits


# ----------------------------------------------------------------------------- state


@flax.struct.dataclass
class SamplerState:
    """Decode-loop carry.

    Attributes:
        cache: KVCache with S = P + N slots.
        logits: float32[B, V] logits for the next token.
        positions: int32[B] RoPE position of the next token.
        tokens: int32[B, N] generated ids (stop token included; `pad_id` after it).
        logprobs: float32[B, N] log-probs of generated tokens (0 where masked).
        mask: bool[B, N] True up to and including the first stop token (False at a step
            with no allowed token).
        done: bool[B] row has stopped.
        invalid: bool[B] row met a step with no allowed token.
        step: int32[] tokens generated so far.
        key: PRNG key of this call.
        row_ids: None, or int32[B] each row's id for its own draws (`sample_logits`).
    """

    cache: models.KVCache
    logits: jax.Array
    positions: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array
    done: jax.Array
    invalid: jax.Array
    step: jax.Array
    key: jax.Array
    row_ids: Optional[jax.Array] = None


def _shard_cache(cache, cfg: ModelConfig, mesh):
    """Cache rows over ("data", "fsdp") and KV heads over "tensor" (when they divide)."""
    if mesh is None:
        return cache
    # KV heads that do not divide over "tensor" stay whole (replicated over it).
    heads = "tensor" if cfg.num_kv_heads % mesh.shape["tensor"] == 0 else None
    # The cache k / v layout is [L, B, Hkv, S, Dh].
    kv = NamedSharding(mesh, P(None, parallel.BATCH_AXES, heads, None, None))
    return cache.replace(k=jax.lax.with_sharding_constraint(cache.k, kv),
                         v=jax.lax.with_sharding_constraint(cache.v, kv),
                         valid=jax.lax.with_sharding_constraint(
                             cache.valid, parallel.batch_sharding(mesh)))


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "mesh", "num_slots"))
def prefill(params, cfg: ModelConfig, tokens, token_mask, key, max_new_tokens: int,
            mesh=None, row_ids=None, num_slots: Optional[int] = None):
    """Prefills left-padded prompts and returns the initial SamplerState.

    Args:
        params: model params.  cfg: static model config.
        tokens: int32[B, P] left-padded prompts.  token_mask: bool[B, P].
        key: PRNG key for the whole generation.
        max_new_tokens: N.
        mesh: optional mesh: the KV cache [L, B, Hkv, S, Dh] is laid out rows over
            ("data", "fsdp") and heads over "tensor" (the decode loop keeps that layout).
        row_ids: None, or int32[B] row ids for per-row draws (`generate`).
        num_slots: S of the cache, P < S <= P + N (default P + N: the whole generation
            fits); smaller for a segmented decode (`cache_schedule`), which grows it.

    Raises:
        ValueError: num_slots outside (P, P + N].
    """
    b, p = tokens.shape
    num_slots = p + max_new_tokens if num_slots is None else num_slots
    if not p < num_slots <= p + max_new_tokens:
        raise ValueError(f"num_slots must be in ({p}, {p + max_new_tokens}] for a prompt "
                         f"bucket of {p} and {max_new_tokens} new tokens, got {num_slots}")
    cache = _shard_cache(models.init_cache(cfg, b, num_slots), cfg, mesh)
    positions = models.positions_from_mask(token_mask)
    hidden, cache = models.forward_hidden(params, cfg, tokens, positions, token_mask, cache)
    cache = _shard_cache(cache, cfg, mesh)
    # Left padding: column -1 is every row's last real prompt token.
    logits = models.logits_from_hidden(params, cfg, hidden[:, -1])
    return SamplerState(
        # The first new token continues each prompt's own positions (padding does not count).
        cache=cache, logits=logits, positions=positions[:, -1] + 1,
        tokens=jnp.zeros((b, max_new_tokens), jnp.int32),
        logprobs=jnp.zeros((b, max_new_tokens), jnp.float32),
        mask=jnp.zeros((b, max_new_tokens), bool), done=jnp.zeros((b,), bool),
        invalid=jnp.zeros((b,), bool), step=jnp.zeros((), jnp.int32), key=key,
        row_ids=row_ids)


def sample_token(state: SamplerState, method: Method, stop_ids, pad_id: int, allowed=None,
                 force_stop=None):
    """Samples one token per row from `state.logits` and records it (no model call).

    The token is drawn from the constrained logits (`allowed: bool[B, V]`), but its log-prob
    is taken from the unconstrained ones, so it equals what a full forward pass of the model
    gives (module docstring). A row with no allowed token is stopped without a token:
    filler, mask False, flagged `invalid`. `force_stop: bool[B]` ends rows with
    `stop_ids[0]` (their constraint is complete).

    Returns:
        (state with the step recorded, tok int32[B] the recorded ids, emitted bool[B] rows
        that produced a real token this step).
    """
    logits = state.logits if allowed is None else jnp.where(allowed, state.logits, -jnp.inf)
    # One key per step, from (key, step) alone: `decode_loop` and the host-driven constrained
    # loop use the same keys. A constrained token's log-prob is taken from the unconstrained
    # logits: what the training forward pass computes (pi_old, METHOD 11). A completed
    # grammar may allow nothing more: its row ends with the stop id, not `invalid`.
    tok, logp, bad = sample_logits(
        jax.random.fold_in(state.key, state.step), logits, method, state.row_ids,
        score_logits=None if allowed is None else state.logits,
        forced=None if force_stop is None else jnp.where(force_stop, stop_ids[0], -1))
    live = ~state.done
    emitted = live & ~bad
    tok = jnp.where(emitted, tok, pad_id)
    logp = jnp.where(emitted, logp, 0.0)
    stopped = live & (jnp.isin(tok, stop_ids) | bad)
    state = state.replace(
        tokens=state.tokens.at[:, state.step].set(tok),
        logprobs=state.logprobs.at[:, state.step].set(logp),
        mask=state.mask.at[:, state.step].set(emitted),
        done=state.done | stopped, invalid=state.invalid | (live & bad),
        step=state.step + 1)
    return state, tok, emitted


def forward_token(params, cfg: ModelConfig, state: SamplerState, tok: jax.Array,
                  emitted: jax.Array) -> SamplerState:
    """Runs the model on the step's tokens `tok: int32[B]` (cache slots of rows that did not
    emit, `emitted: bool[B]` False, are masked out) and stores the next logits."""
    hidden, cache = models.forward_hidden(
        params, cfg, tok[:, None], state.positions[:, None], emitted[:, None], state.cache)
    return state.replace(
        cache=cache, logits=models.logits_from_hidden(params, cfg, hidden[:, 0]),
        positions=state.positions + 1)


@functools.partial(jax.jit, static_argnames="cfg")
def layer_copy(layers, cfg: ModelConfig):
    """The per-layer copy of stacked block weights `layers` ([L, ...] leaves): a tuple of L
    per-layer dicts (`models.decode_params`), as a program of its own (the planner lowers
    it). Only the blocks: the embedding, head and final norm would be copied too if they
    went through the program (XLA does not return an input as an output without copying
    it), 2.5 GB more for Qwen3-8B in bfloat16."""
    return models.family(cfg).unstack_layers({"layers": layers})["layers"]


def decode_params(params, cfg: ModelConfig):
    """The weights in the form a decode loop of `cfg` runs on (`models.decode_per_layer`:
    `cfg.decode_form`, "auto" = per-layer on CPU and GPU): a per-layer copy of the block
    weights (`models.decode_params`), made by a program of its own; else `params` itself
    (no copy; also when they are per-layer already, e.g. the rollout copy).

    `generate` and `constrained.decode` make this copy once per call, before the loop. Made
    inside `decode_loop`'s program instead, the same copy took 40-165 ms longer per call
    (SmolLM2-135M float32, B = 1 and 8, 2-core CPU; the copy alone takes 36 ms).
    """
    if models.is_per_layer(params) or not models.decode_per_layer(cfg):
        return params
    # The other leaves are the caller's arrays, not copies.
    return {**params, "layers": layer_copy(params["layers"], cfg)}


def _loop(params, cfg: ModelConfig, state: SamplerState, method: Method, stop_ids, pad_id: int,
          cache_slots: tuple = ()) -> SamplerState:
    """The decode loop of `decode_loop` (`cache_slots` empty) and `decode_segments`."""
    max_new = state.tokens.shape[1]

    def cond(s):
        return (s.step < max_new) & ~jnp.all(s.done)

    def body(s):
        return forward_token(params, cfg, *sample_token(s, method, stop_ids, pad_id))

    # The cache takes the weights' form (a static fact of their pytree, no global).
    state = state.replace(cache=models.decode_cache(state.cache, models.is_per_layer(params)))
    if not cache_slots:
        return jax.lax.while_loop(cond, body, state)
    for j, slots in enumerate(cache_slots):
        if j:
            # Added whether or not rows are left: no conditional (on GPU a `lax.cond` waits
            # on the host), and a chunk of zeros costs one write.
            state = state.replace(cache=models.add_chunk(state.cache, slots))
        # The step writes slot `index`, so the segment runs while index < S_j.
        state = jax.lax.while_loop(
            lambda s, slots=slots: cond(s) & (s.cache.index < slots), body, state)
    return state


# The state is donated: the returned cache reuses its buffers (no second cache alive).
@functools.partial(jax.jit, static_argnames=("cfg", "method", "pad_id"), donate_argnums=(2,))
def decode_loop(params, cfg: ModelConfig, state: SamplerState, method: Method,
                stop_ids: jax.Array, pad_id: int) -> SamplerState:
    """Decodes until every row stopped or N tokens were generated (`lax.while_loop`), on
    the state's cache as it is (P + N slots; `decode_segments` grows a smaller one).

    The loop runs in the form of `params`: given per-layer weights (`decode_params(params,
    cfg)`, as `generate` passes them: on CPU and GPU by default) it makes a per-layer copy
    of the cache (`models.decode_cache`) and returns it stacked again; given stacked
    weights (TPU, or `ModelConfig.decode_form = "stacked"`) it runs on the stacked arrays.
    """
    state = _loop(params, cfg, state, method, stop_ids, pad_id)
    return state.replace(cache=models.stack_cache(state.cache))  # into the donated buffers


# The cache is an argument of its own and not donated: the returned one is larger and
# per-layer, so its buffers could not be reused (jax would warn); the caller's reference
# frees it.
@functools.partial(jax.jit, static_argnames=("cfg", "method", "pad_id", "cache_slots"),
                   donate_argnums=(2,))
def decode_segments(params, cfg: ModelConfig, state: SamplerState, cache: models.KVCache,
                    method: Method, stop_ids: jax.Array, pad_id: int,
                    cache_slots: tuple) -> SamplerState:
    """`decode_loop` in segments over a growing cache: each step reads the slots of its
    segment, not all P + N (`sampling.cache_schedule`).

    Segment j is a `lax.while_loop` of its own over a cache of S_j slots, run while the
    next slot to write is below S_j (and rows are left, and fewer than N tokens were
    made); then a chunk of S_{j+1} - S_j empty slots is added (`models.add_chunk`: on CPU
    and GPU the per-layer cache is a tuple of chunks per layer, nothing already written
    is copied; the stacked form of TPUs is padded, a copy). A step attends over the chunks
    so far (`models.attention.materialized`): with 4 segments at P = 1,024 and
    N = 8,192 the steps read 6,528 slots on average instead of 9,216. Tokens are those of
    `decode_loop`; log-probs agree to float32 rounding (the softmax runs over fewer
    masked slots).

    Memory (per-layer form): the prefill's cache (S_0 slots, stacked, an argument) stays
    alive beside the per-layer chunks, P + N slots at the end: S_0 + P + N slots, where
    `decode_loop` holds 2 (P + N) (a stacked and a per-layer copy).

    Args:
        state: `prefill`'s state with `cache=None` (donated).  cache: its cache, S_0 slots.
        cache_slots: (S_0, S_1, ..., S_{m-1}), increasing (`sampling.cache_schedule`).
        Others as `decode_loop`.

    Returns:
        The final state; its cache has S_{m-1} slots in the decode form (per-layer
        chunks on CPU and GPU, `models.stack_cache` joins them).

    Raises:
        ValueError: cache_slots does not start at the cache's size or does not increase.
    """
    if (not cache_slots or cache_slots[0] != cache.num_slots
            or list(cache_slots) != sorted(set(cache_slots))):
        raise ValueError(f"cache_slots must increase from the cache's {cache.num_slots} "
                         f"slots, got {cache_slots}")
    return _loop(params, cfg, state.replace(cache=cache), method, stop_ids, pad_id,
                 cache_slots)
