"""Sampling methods: how one token is drawn from next-token logits (greedy, temperature,
top-k, top-p), as small frozen dataclasses, and the draw itself (`sample_logits`).

Log-probs: the log-prob of a drawn token is log softmax(logits / temperature) over the full
vocabulary (before top-k / top-p truncation), the quantity the GRPO ratio uses (METHOD
section 11); greedy decoding reports temperature-1 log-probs; logits are never divided by 0.

Axis legend (docs/CONVENTIONS.md): B rows, V vocab.
"""
from __future__ import annotations

import dataclasses
from typing import Union

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Greedy:
    """Argmax decoding."""

    @property
    def temperature(self) -> float:
        # 0 marks greedy; `scoring_temperature` reports its log-probs at 1.
        return 0.0


@dataclasses.dataclass(frozen=True)
class Temperature:
    """Ancestral sampling from softmax(logits / temperature); temperature 0 means greedy."""

    temperature: float = 1.0


@dataclasses.dataclass(frozen=True)
class TopK:
    """Sampling restricted to the k largest logits."""

    k: int
    temperature: float = 1.0


@dataclasses.dataclass(frozen=True)
class TopP:
    """Nucleus sampling: the smallest set of tokens whose mass reaches p (ties: by id)."""

    p: float
    temperature: float = 1.0


Method = Union[Greedy, Temperature, TopK, TopP]


def method_from_flags(temperature: float, top_k: int = 0, top_p: float = 1.0) -> Method:
    """Maps the usual (temperature, top_k, top_p) flags to a sampling method.

    Raises:
        ValueError: negative temperature, top_p outside (0, 1], negative top_k.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    # Greedy ignores top_k / top_p (the argmax survives every truncation); top_p wins over
    # top_k when both are set.
    if temperature == 0:
        return Greedy()
    if top_p < 1:
        return TopP(top_p, temperature)
    if top_k > 0:
        return TopK(top_k, temperature)
    return Temperature(temperature)


def scoring_temperature(method: Method) -> float:
    """Temperature at which log-probs are reported: the sampling one, 1.0 for greedy."""
    return temperature_for_scoring(method.temperature)


def temperature_for_scoring(temperature: float) -> float:
    """The one rule of METHOD 11: log-probs are taken at the sampling temperature, and at
    1.0 for greedy decoding (temperature 0), so logits are never divided by 0."""
    return temperature if temperature > 0 else 1.0


def truncated_logits(logits: jax.Array, method: Method) -> jax.Array:
    """Applies temperature and top-k/top-p truncation; removed tokens get -inf.

    Args:
        logits: float32[B, V]; -inf marks disallowed tokens.
        method: Temperature, TopK or TopP (not Greedy).

    Returns:
        float32[B, V] logits whose softmax is the sampling distribution.
    """
    scaled = logits / method.temperature
    if isinstance(method, TopK):
        # Every logit tied with the k-th is kept (>=), so a row may keep more than k tokens.
        kth = jax.lax.top_k(scaled, method.k)[0][:, -1:]
        return jnp.where(scaled >= kth, scaled, -jnp.inf)
    if isinstance(method, TopP):
        # Stable sort: equal logits stay in id order (the tie rule of `TopP`).
        order = jnp.argsort(-scaled, axis=-1, stable=True)
        sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # A token is kept while the mass before it is < p, so the top token always survives.
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep_sorted = mass_before < method.p
        # The sorted decisions scattered back to vocabulary order.
        keep = jnp.zeros_like(keep_sorted).at[
            jnp.arange(scaled.shape[0])[:, None], order].set(keep_sorted)
        return jnp.where(keep, scaled, -jnp.inf)
    return scaled


def _argmax(x: jax.Array) -> jax.Array:
    """int32[B] first index of the row maximum of x: float[B, V] without NaN (= jnp.argmax).

    A max and a min-of-index reduction; XLA CPU runs them faster than argmax's
    (value, index) reduction.
    """
    top = jnp.max(x, axis=-1, keepdims=True)
    ids = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    return jnp.min(jnp.where(x == top, ids, x.shape[-1]), axis=-1)


def row_keys(key: jax.Array, row_ids: jax.Array) -> jax.Array:
    """The key of each row's draw: fold_in(key, row_ids[b]) for int32[B] ids (a batch of B
    keys, each a key of `key`'s kind). `key` may be one key, or B keys (one per row: the
    rollout engine's rows are at different steps)."""
    if jnp.ndim(key) > (1 if jnp.issubdtype(key.dtype, jnp.uint32) else 0):
        return jax.vmap(jax.random.fold_in)(key, row_ids)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, row_ids)


def sample_logits(key: jax.Array, logits: jax.Array, method: Method, row_ids=None,
                  score_logits=None, forced=None):
    """Draws one token per row and scores it, with one full-vocabulary log-softmax.

    Args:
        key: PRNG key.
        logits: float32[B, V]; -inf for disallowed tokens.
        method: sampling method.
        row_ids: None: one draw over the [B, V] batch from `key` (a row's numbers depend on
            its position in the batch); int32[B]: row b draws from fold_in(key,
            row_ids[b]) alone, whatever the batch around it (`key` may then be B keys,
            one per row: `row_keys`).
        score_logits: None, or float32[B, V] the logits the token's log-prob is taken from
            (a constrained draw passes the model's unconstrained logits: the log-prob the
            training forward pass computes, METHOD 11); None = `logits`.
        forced: None, or int32[B] a token id that replaces row b's draw where >= 0 (a
            complete constraint ends its row with the stop id); such a row is never
            invalid and its log-prob is the forced token's.

    Returns:
        (tokens int32[B], logprobs float32[B] of the token under softmax(score_logits / T)
        over all tokens (T: `scoring_temperature`), invalid bool[B]: the row had no finite
        logit, or a NaN or +inf one, and was not forced; its token is then 0 and its
        log-prob 0, and must not be used — callers raise or stop the row).
    """
    invalid = (~jnp.any(jnp.isfinite(logits), axis=-1)
               | jnp.any(jnp.isnan(logits) | (logits == jnp.inf), axis=-1))
    # Invalid rows get flat logits so the draw and the softmax stay finite; their token is
    # replaced by 0 and flagged below.
    safe = jnp.where(invalid[:, None], 0.0, logits)
    if isinstance(method, Greedy) or method.temperature == 0:
        tokens = _argmax(safe)
        temp = temperature_for_scoring(0.0)
    else:
        truncated = truncated_logits(safe, method)
        if row_ids is None:
            tokens = jax.random.categorical(key, truncated, axis=-1)
        else:
            tokens = jax.vmap(lambda k, x: jax.random.categorical(k, x))(
                row_keys(key, row_ids), truncated)
        temp = method.temperature
    if forced is not None:
        tokens = jnp.where(forced >= 0, forced, tokens)
        invalid = invalid & (forced < 0)
    if score_logits is not None:
        safe = jnp.where(invalid[:, None], 0.0, score_logits)
    # Over the full vocabulary at the sampling temperature, before top-k / top-p truncation
    # and before any constraint mask (score_logits): the step's only log-softmax.
    logp_all = jax.nn.log_softmax(safe / temp, axis=-1)
    logp = jnp.take_along_axis(logp_all, tokens[:, None], axis=-1)[:, 0]
    tokens = jnp.where(invalid, 0, tokens).astype(jnp.int32)
    return tokens, jnp.where(invalid, 0.0, logp), invalid
