"""The verifier's jitted passes over a model (METHOD 11): prefill shared prefixes into a KV
cache, score item suffixes against the cached prefixes, or score full prompts.

`verifier.Verifier` turns texts into token ids and chunks; these functions are its device
side. Shapes are bucketed (`budgets`: powers of two for prefixes and full prompts,
multiples of 16 for the short item suffixes) so a new text length reuses a compiled
program.

Axis legend (drubric_jax/types.py): R (prompt, response) rows, P prefix tokens (bucket),
S cache slots, V vocab, T full-prompt tokens; here also Mc items per pass, Ts suffix tokens.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from drubric_jax import models
from drubric_jax.models.config import ModelConfig
from drubric_jax.evaluator.verdicts import p_yes_from_logits


@functools.partial(jax.jit, static_argnames=("cfg", "num_slots"))
def prefill(params, cfg: ModelConfig, tokens, token_mask, num_slots: int):
    """Prefills left-padded prefixes int32[R, P] into a cache of S = num_slots slots.

    Returns (cache with index P, prefix lengths int32[R]).
    """
    # num_slots = P + Ts: room for the item suffixes scored after the prefix.
    cache = models.init_cache(cfg, tokens.shape[0], num_slots)
    positions = models.positions_from_mask(token_mask)
    _, cache = models.forward_hidden(params, cfg, tokens, positions, token_mask, cache)
    # Real prefix lengths: each suffix's RoPE positions continue from its prefix's.
    return cache, jnp.sum(token_mask, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg",))
def score_suffixes(params, cfg: ModelConfig, cache: models.KVCache, prefix_len,
                    suffix_tokens, suffix_len, yes_ids, no_ids):
    """P(yes) of Mc suffixes per cached prefix, in one batched pass.

    Args:
        cache: KVCache of R prefixes (index = P); rows are repeated Mc times here.
        prefix_len: int32[R] real prefix tokens (RoPE position of the first suffix token).
        suffix_tokens: int32[R, Mc, Ts] right-padded.  suffix_len: int32[R, Mc] (>= 1 for
            real items; 0 rows give an unused value).
        yes_ids, no_ids: int32 variant ids.

    Returns:
        float32[R, Mc].
    """
    r, mc, ts = suffix_tokens.shape
    # Row r's cache copied Mc times: row r * Mc + m scores item m against prefix r.
    rows = models.repeat_rows(cache, mc)
    tokens = suffix_tokens.reshape(r * mc, ts)
    lens = suffix_len.reshape(r * mc)
    steps = jnp.arange(ts, dtype=jnp.int32)
    # Right-padded suffixes: their padding is never attended to.
    mask = steps[None, :] < lens[:, None]
    positions = jnp.repeat(prefix_len, mc)[:, None] + steps[None, :]
    hidden, _ = models.forward_hidden(params, cfg, tokens, positions, mask, rows)
    # The answer token is predicted after each row's last real suffix token (right padding).
    last = jnp.take_along_axis(hidden, jnp.maximum(lens - 1, 0)[:, None, None], axis=1)[:, 0]
    logits = models.logits_from_hidden(params, cfg, last)
    return p_yes_from_logits(logits, yes_ids, no_ids).reshape(r, mc)


@functools.partial(jax.jit, static_argnames=("cfg",))
def score_full(params, cfg: ModelConfig, tokens, token_mask, yes_ids, no_ids):
    """P(yes) after left-padded full prompts int32[N, T] (no cache, causal). float32[N]."""
    positions = models.positions_from_mask(token_mask)
    hidden, _ = models.forward_hidden(params, cfg, tokens, positions, token_mask)
    # Left padding: the last column is every row's last real token.
    logits = models.logits_from_hidden(params, cfg, hidden[:, -1])
    return p_yes_from_logits(logits, yes_ids, no_ids)


@functools.partial(jax.jit, static_argnames=("cfg",))
def router_load(params, cfg: ModelConfig, tokens, token_mask):
    """Router load counts of a mixture-of-experts verifier (`family(cfg).router_load_counts`)
    over left-padded prompts int32[R, P] (token_mask bool[R, P]): the routing that `prefill`
    of the same tokens makes. {"pairs": int32[L, E], "dropped": int32[L], "routed":
    int32[L]}, summed over the rows (padding not counted)."""
    positions = models.positions_from_mask(token_mask)
    return models.family(cfg).router_load_counts(params, cfg, tokens, positions, token_mask)
