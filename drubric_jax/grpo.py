"""GRPO loss pieces: completion mask, token log-probs, clipped surrogate, k3 KL.

Implements the per-token objective of Eq. 23 (METHOD section 4) with the
conventions of METHOD section 11.

Axis legend: B rows (one sampled response each; prompts x K flattened),
T completion tokens, V vocab, S stop ids.

Layout: `logp_*` are float32[B, T], the log-probability of the sampled token
at each completion position; `mask` is bool[B, T] from `completion_mask`.
Masked positions may hold garbage (0, -1e9, -inf, NaN): `grpo_loss` replaces
it with `jnp.where` before any exp or subtraction, so it reaches neither the
loss nor its gradient. The building blocks `k3_kl` and `clipped_surrogate`
expect inputs that are already clean.
"""

import numbers

import jax
import jax.numpy as jnp

LOG_RATIO_CLAMP = 20.0  # |log ratio| bound before exp, for KL and PPO ratio
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "dr_grpo")


def completion_mask(tokens, stop_ids, num_generated=None, drop_truncated=False):
    """Mask of real completion tokens: up to AND including the first stop token.

    Never built as `tokens != pad_id`: the pad id may equal the EOS id
    (METHOD 11, case-04).

    Args:
        tokens: int32[B, T], sampled completion ids (prompt excluded).
        stop_ids: int or int32[S], the ids that end a completion (EOS, <|im_end|>).
        num_generated: int32[B] or None. When given, positions >= num_generated
            are filler the sampler never wrote and are excluded.
        drop_truncated: bool (static). If True, truncated rows (no stop token)
            get an all-False mask; by default they are kept with every token.

    Returns:
        mask: bool[B, T].
        lengths: int32[B], tokens in the completion, first stop token included
            (counted before `drop_truncated`).
        truncated: bool[B], True when no stop token was generated.
    """
    tokens = jnp.asarray(tokens)
    stops = jnp.atleast_1d(jnp.asarray(stop_ids, tokens.dtype))
    is_stop = jnp.any(tokens[..., None] == stops, axis=-1)
    written = jnp.ones(tokens.shape, bool)
    if num_generated is not None:
        positions = jnp.arange(tokens.shape[-1])
        written = positions < jnp.asarray(num_generated)[..., None]
    is_stop = is_stop & written
    stops_before = jnp.cumsum(is_stop, axis=-1) - is_stop
    mask = written & (stops_before == 0)
    lengths = jnp.sum(mask, axis=-1).astype(jnp.int32)
    truncated = ~jnp.any(is_stop, axis=-1)
    if drop_truncated:
        mask = mask & ~truncated[..., None]
    return mask, lengths, truncated


def k3_kl(logp, ref_logp):
    """Per-token k3 estimator of KL(pi_theta || pi_ref) (METHOD 4 and 11).

        d = clip(ref_logp - logp, -20, 20);  KL_t = exp(d) - d - 1  >= 0

    Its gradient w.r.t. logp is 1 - exp(d); it must be computed from the
    current policy's log-probs, not detached ones (case-03).

    Args:
        logp: float[..., T], current policy log-probs of the sampled tokens.
        ref_logp: float[..., T], reference-model log-probs of the same tokens.

    Returns:
        float32[..., T]. Callers must pass sanitised values at masked positions.
    """
    d = jnp.asarray(ref_logp, jnp.float32) - jnp.asarray(logp, jnp.float32)
    d = jnp.clip(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return jnp.exp(d) - d - 1.0


def clipped_surrogate(logp_new, logp_old, advantages, clip_eps):
    """Token-level PPO clipped objective of Eq. 23.

        r_t = exp(logp_new - logp_old),  obj_t = min(r_t A, clip(r_t, 1-eps, 1+eps) A)

    `logp_old` are the log-probs stored by the sampler (pi_old), fixed across
    the inner steps on a batch (case-07). The log-ratio is clamped to
    [-20, 20] before exp.

    Args:
        logp_new: float[B, T], current policy.
        logp_old: float[B, T], sampler log-probs.
        advantages: float[B], one advantage per response, broadcast over T.
        clip_eps: float, epsilon.

    Returns:
        objective: float32[B, T] (to be maximised).
        clipped: bool[B, T], True where the clipped branch is strictly smaller, so
            the token gets no gradient.
    """
    log_ratio = jnp.asarray(logp_new, jnp.float32) - jnp.asarray(logp_old, jnp.float32)
    ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    adv = jnp.asarray(advantages, jnp.float32)[..., None]
    unclipped = ratio * adv
    clipped_obj = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    return jnp.minimum(unclipped, clipped_obj), clipped_obj < unclipped


def aggregate_tokens(values, mask, aggregation="seq_mean_token_mean"):
    """Reduce per-token values to a scalar (case-06).

    - "seq_mean_token_mean" (paper, Eq. 23): (1/B') sum_i (1/|o_i|) sum_t,
        B' = rows with at least one real token (empty rows do not dilute).
    - "token_mean" (DAPO/BNPO): sum over real tokens / number of real tokens.
    - "dr_grpo": sum over real tokens / (B * T), a constant divisor.

    Args:
        values: float32[B, T]; must already be 0 (finite) at masked positions.
        mask: bool[B, T].
        aggregation: one of AGGREGATIONS.

    Returns:
        float32 scalar; 0 when there is no real token.

    Raises:
        ValueError: unknown aggregation.
    """
    m = jnp.asarray(mask, bool)
    v = jnp.where(m, values, 0.0)
    if aggregation == "seq_mean_token_mean":
        lengths = jnp.sum(m, axis=-1).astype(jnp.float32)
        per_row = jnp.sum(v, axis=-1) / jnp.maximum(lengths, 1.0)
        rows = jnp.sum(lengths > 0).astype(jnp.float32)
        return jnp.sum(per_row) / jnp.maximum(rows, 1.0)
    if aggregation == "token_mean":
        return jnp.sum(v) / jnp.maximum(jnp.sum(m).astype(jnp.float32), 1.0)
    if aggregation == "dr_grpo":
        return jnp.sum(v) / float(m.shape[0] * m.shape[1])
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def grpo_loss(logp_new, logp_old, logp_ref, advantages, mask, clip_eps=0.2,
              beta=0.01, aggregation="seq_mean_token_mean"):
    """GRPO loss, the negative of Eq. 23, and its metrics.

        loss_t = -(min(r_t A_i, clip(r_t, 1-eps, 1+eps) A_i) - beta KL_t)

    with KL_t the clamped k3 estimator (`k3_kl`), aggregated by
    `aggregate_tokens`. Inputs are sanitised with `jnp.where` BEFORE the
    arithmetic, so garbage at masked positions gives neither a NaN loss nor a
    NaN gradient (case-05).

    Args:
        logp_new: float32[B, T], current policy log-probs (differentiated).
        logp_old: float32[B, T], log-probs stored at sampling time.
        logp_ref: float32[B, T] or None; may be None only when beta == 0, which
            skips the KL term (no reference model needed).
        advantages: float32[B], e.g. from `rewards.group_advantages_by_id`.
        mask: bool[B, T] from `completion_mask`.
        clip_eps: float, PPO epsilon.
        beta: float, KL coefficient (paper: 0.01).
        aggregation: static str, one of AGGREGATIONS.

    Returns:
        loss: float32 scalar.
        metrics: dict of float32 scalars: loss, pg_loss (aggregated -objective),
            kl (aggregated k3, 0 when skipped), clip_fraction (over real tokens),
            ratio_mean (over real tokens), num_tokens.

    Raises:
        ValueError: unknown aggregation, or logp_ref None with beta != 0.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    m = jnp.asarray(mask, bool)
    new = jnp.where(m, jnp.asarray(logp_new, jnp.float32), 0.0)
    old = jnp.where(m, jnp.asarray(logp_old, jnp.float32), 0.0)
    adv = jnp.where(jnp.any(m, axis=-1), jnp.asarray(advantages, jnp.float32), 0.0)

    objective, clipped = clipped_surrogate(new, old, adv, clip_eps)
    pg_token = jnp.where(m, -objective, 0.0)
    if logp_ref is None:
        if not isinstance(beta, numbers.Real) or beta != 0:
            raise ValueError("logp_ref is None but beta is not 0")
        kl_token = jnp.zeros_like(pg_token)
        per_token = pg_token
    else:
        ref = jnp.where(m, jnp.asarray(logp_ref, jnp.float32), 0.0)
        kl_token = jnp.where(m, k3_kl(new, ref), 0.0)
        per_token = pg_token + beta * kl_token
    loss = aggregate_tokens(per_token, m, aggregation)

    num_tokens = jnp.sum(m).astype(jnp.float32)
    ratio = jnp.exp(jnp.clip(new - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    metrics = jax.lax.stop_gradient({
        "loss": loss,
        "pg_loss": aggregate_tokens(pg_token, m, aggregation),
        "kl": aggregate_tokens(kl_token, m, aggregation),
        "clip_fraction": jnp.sum(clipped & m) / jnp.maximum(num_tokens, 1.0),
        "ratio_mean": jnp.sum(jnp.where(m, ratio, 0.0)) / jnp.maximum(num_tokens, 1.0),
        "num_tokens": num_tokens,
    })
    return loss, metrics


def _effective_temperature(temperature, ndim):
    """float32 temperature broadcastable to [B, T, V]; 0 (greedy) becomes 1."""
    t = jnp.asarray(temperature, jnp.float32)
    t = jnp.where(t > 0, t, 1.0)
    return t.reshape(t.shape + (1,) * (ndim - t.ndim))


def token_logprobs_from_logits(logits, targets, temperature=1.0):
    """Log-probs of the sampled tokens at the sampler's temperature (METHOD 11).

        logp_t = log_softmax(logits_t / temperature)[targets_t]

    Temperature 0 means greedy decoding; its log-probs are taken at
    temperature 1 (logits are never divided by 0).

    Args:
        logits: float[B, T, V], the model's next-token logits aligned with
            targets (logits[:, t] predicts targets[:, t]).
        targets: int32[B, T], sampled token ids.
        temperature: float scalar or float32[B]; <= 0 is treated as 1.

    Returns:
        float32[B, T]. Garbage at padded positions is left to the loss's mask.
    """
    x = jnp.asarray(logits, jnp.float32) / _effective_temperature(temperature, 3)
    logp = jax.nn.log_softmax(x, axis=-1)
    idx = jnp.asarray(targets, jnp.int32)[..., None]
    return jnp.take_along_axis(logp, idx, axis=-1)[..., 0]


def entropy_from_logits(logits, temperature=1.0):
    """Entropy of the next-token distribution, -sum_v p_v log p_v, in nats.

    Args:
        logits: float[B, T, V]; -inf entries (masked vocabulary) are allowed.
        temperature: float scalar or float32[B]; <= 0 is treated as 1.

    Returns:
        float32[B, T].
    """
    x = jnp.asarray(logits, jnp.float32) / _effective_temperature(temperature, 3)
    logp = jax.nn.log_softmax(x, axis=-1)
    p = jnp.exp(logp)
    safe_logp = jnp.where(p > 0, logp, 0.0)
    return -jnp.sum(p * safe_logp, axis=-1)
