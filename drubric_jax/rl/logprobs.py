"""Log-probabilities of token sequences under a model, at the sampler's temperature.

    logp[r, t] = log softmax(logits(tokens[r, :t]) / temperature)[tokens[r, t]]

These are the pi_theta, pi_old and pi_ref terms of Eq. 23 (METHOD section 4), computed
with the conventions of METHOD section 11: the temperature is the one the sampler used,
and temperature 0 (greedy) is scored at 1 (logits are never divided by 0).

Axis legend (docs/CONVENTIONS.md): R rows, T tokens, V vocab, D width.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from drubric_jax import models, parallel
from drubric_jax.models.config import ModelConfig


def _effective_temperature(temperature, ndim):
    """float32 temperature broadcastable to [R, T, V]; 0 (greedy) becomes 1."""
    t = jnp.asarray(temperature, jnp.float32)
    t = jnp.where(t > 0, t, 1.0)
    return t.reshape(t.shape + (1,) * (ndim - t.ndim))


def token_logprobs_from_logits(logits, targets, temperature=1.0):
    """Log-probs of the sampled tokens at the sampler's temperature (METHOD 11).

        logp_t = log_softmax(logits_t / temperature)[targets_t]

    Temperature 0 means greedy decoding; its log-probs are taken at
    temperature 1 (logits are never divided by 0).

    Args:
        logits: float[R, T, V], the model's next-token logits aligned with
            targets (logits[:, t] predicts targets[:, t]).
        targets: int32[R, T], sampled token ids.
        temperature: float scalar or float32[R]; <= 0 is treated as 1.

    Returns:
        float32[R, T]. Garbage at padded positions is left to the loss's mask.
    """
    # float32 before the softmax: the ratio of Eq. 23 needs log-probs finer than bfloat16's.
    x = jnp.asarray(logits, jnp.float32) / _effective_temperature(temperature, 3)
    logp = jax.nn.log_softmax(x, axis=-1)
    idx = jnp.asarray(targets, jnp.int32)[..., None]
    return jnp.take_along_axis(logp, idx, axis=-1)[..., 0]


def entropy_from_logits(logits, temperature=1.0):
    """Entropy of the next-token distribution, -sum_v p_v log p_v, in nats.

    Args:
        logits: float[R, T, V]; -inf entries (masked vocabulary) are allowed.
        temperature: float scalar or float32[R]; <= 0 is treated as 1.

    Returns:
        float32[R, T].
    """
    x = jnp.asarray(logits, jnp.float32) / _effective_temperature(temperature, 3)
    logp = jax.nn.log_softmax(x, axis=-1)
    p = jnp.exp(logp)
    # A -inf logit gives p = 0 and logp = -inf; 0 * -inf would be NaN.
    safe_logp = jnp.where(p > 0, logp, 0.0)
    return -jnp.sum(p * safe_logp, axis=-1)


def sequence_logprobs(params: dict, cfg: ModelConfig, tokens: jax.Array,
                      token_mask: jax.Array, temperature: float = 1.0, *,
                      chunk: int = 512, return_entropy: bool = False, start: int = 0,
                      remat: bool = True):
    """Per-token log-probs of a sequence under the model at `temperature` (METHOD 11).

        logp[r, t] = log softmax(logits(tokens[r, :t]) / temperature)[tokens[r, t]]

    One causal forward pass (no cache); the output head and softmax run over time chunks
    of `chunk` tokens under `jax.checkpoint`, so neither the forward nor the backward pass
    holds more than one float32[R, chunk, V] logits buffer.

    Args:
        params, cfg: the model.
        tokens: int32[R, T] ([prompt bucket | completion] rows, `train_step.Batch`).
        token_mask: bool[R, T] real tokens; positions come from it.
        temperature: the sampler's temperature, float or float32[R]; 0 (greedy) is
            scored at 1 (logits are never divided by 0).
        chunk: tokens per logits chunk (static).
        return_entropy: also return the entropy of each next-token distribution.
        start: first position scored (static); earlier positions get 0 and the output
            head runs only on [start, T), e.g. the completion of a [prompt | completion]
            row (start = prompt bucket P), which skips the prompt's [R, P, V] logits.
        remat: under differentiation, recompute each layer's activations in the backward
            pass (`jax.checkpoint` per layer: only the L layer inputs stay live) instead of
            keeping them (`TrainConfig.remat`); the values are the same either way.

    Returns:
        logp float32[R, T] (0 at t = 0 and wherever token_mask is False), and, with
        return_entropy, entropy float32[R, T] in nats (same zeros; no gradient).
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    token_mask = jnp.asarray(token_mask, bool)
    b, t = tokens.shape
    # From the mask, as the sampler did: left padding never shifts a row's positions.
    positions = models.positions_from_mask(token_mask)
    hidden, _ = models.forward_hidden(params, cfg, tokens, positions, token_mask, remat=remat)
    # First scored position: >= 1 (position 0 has no context) and <= T - 1.
    s0 = min(max(int(start), 1), t - 1) if t > 1 else 1
    # Hidden states at s0 - 1 .. T - 2 predict the targets at s0 .. T - 1.
    logp, ent = _score(params, cfg, hidden[:, s0 - 1:-1], tokens[:, s0:], temperature, chunk)

    def full(x):  # [R, T - s0] -> [R, T]: 0 before s0 and at masked tokens
        x = jnp.concatenate([jnp.zeros((b, s0), jnp.float32), x], axis=1)
        return jnp.where(token_mask, x, 0.0)

    if return_entropy:
        return full(logp), jax.lax.stop_gradient(full(ent))
    return full(logp)


def _score(params: dict, cfg: ModelConfig, hidden: jax.Array, targets: jax.Array,
           temperature, chunk: int) -> tuple[jax.Array, jax.Array]:
    """(logp, entropy) float32[R, n] of targets int32[R, n] from the hidden states
    [R, n, D] that predict them, the output head and softmax run over time chunks of
    `chunk` tokens under `jax.checkpoint` (one float32[R, chunk, V] logits buffer live in
    the forward and the backward pass). Entropy carries no gradient."""
    b, n = targets.shape
    c = max(1, min(chunk, n))
    num_chunks = -(-n // c)
    # The scored span padded to whole chunks; the padding is scored, then cut off below.
    pad = num_chunks * c - n
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    h = h.reshape(b, num_chunks, c, -1).swapaxes(0, 1)          # [chunks, R, c, D]
    targets = targets.reshape(b, num_chunks, c).swapaxes(0, 1)  # [chunks, R, c]

    # Recomputed in the backward pass, and lax.map runs the chunks one after another: only one
    # [R, c, V] logits chunk is live at a time.
    @jax.checkpoint
    def score(h_c, tgt_c):
        # Rows stay split (`parallel.constrain_rows`): the head is gathered, not the logits.
        logits = parallel.constrain_rows(
            models.logits_from_hidden(params, cfg, parallel.constrain_rows(h_c)))  # [R, c, V]
        logp = token_logprobs_from_logits(logits, tgt_c, temperature)
        # Entropy is a logged metric, never a loss term: no gradient.
        ent = entropy_from_logits(jax.lax.stop_gradient(logits), temperature)
        return logp, ent

    logp, ent = jax.lax.map(lambda xs: score(*xs), (h, targets))

    def unchunk(x):
        return x.swapaxes(0, 1).reshape(b, num_chunks * c)[:, :n]

    return unchunk(logp), jax.lax.stop_gradient(unchunk(ent))


def shared_prefix_logprobs(params: dict, cfg: ModelConfig, prefix_tokens: jax.Array,
                           prefix_mask: jax.Array, tokens: jax.Array, token_mask: jax.Array,
                           temperature=1.0, *, chunk: int = 512,
                           return_entropy: bool = False, remat: bool = True):
    """Per-token log-probs of groups of R suffixes that share one prefix (METHOD 11, 15):

        logp[g, r, n] = log softmax(logits([prefix_g | suffix_gr[:n]]) / temperature)
                        [suffix_gr[n]]

    the values `sequence_logprobs` gives each row [prefix | suffix] at start = P, with the
    prefix run once per group (`models.forward_shared_hidden`). Suffix token 0 is scored
    from the prefix's last position (P - 1: the prompt bucket is left-padded, so it holds
    the prefix's last real token), token n > 0 from suffix token n - 1.

    Args:
        params, cfg: the model.
        prefix_tokens: int32[Gn, P] (left-padded); prefix_mask: bool[Gn, P].
        tokens: int32[Gn, R, N] (right-padded); token_mask: bool[Gn, R, N].
        temperature: the sampler's, float or float32[Gn, R]; 0 is scored at 1.
        chunk: tokens per logits chunk (static).
        return_entropy: also return the entropy of each next-token distribution.
        remat: recompute each layer in the backward pass (`TrainConfig.remat`).

    Returns:
        logp float32[Gn, R, N] (0 where token_mask is False), and with return_entropy the
        entropy float32[Gn, R, N] in nats (same zeros; no gradient).
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    token_mask = jnp.asarray(token_mask, bool)
    gn, r, n = tokens.shape
    h_prefix, h = models.forward_shared_hidden(params, cfg, jnp.asarray(prefix_tokens, jnp.int32),
                                               prefix_mask, tokens, token_mask, remat=remat)
    # What predicts suffix token n: the prefix's last state (n = 0, one per group, shared by
    # its R suffixes), else the suffix's state n - 1.
    last = jnp.broadcast_to(h_prefix[:, None, -1:], (gn, r, 1, h.shape[-1]))
    h = jnp.concatenate([last, h[:, :, :-1]], axis=2).reshape(gn * r, n, -1)
    temp = jnp.asarray(temperature, jnp.float32)
    temp = temp.reshape(gn * r) if temp.ndim else temp
    logp, ent = _score(params, cfg, h, tokens.reshape(gn * r, n), temp, chunk)

    def grouped(x):
        return jnp.where(token_mask, x.reshape(gn, r, n), 0.0)

    if return_entropy:
        return grouped(logp), grouped(ent)
    return grouped(logp)
