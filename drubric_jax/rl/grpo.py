"""GRPO loss pieces: clipped surrogate, KL estimators (k1, k2, k3), token aggregation.

Implements the per-token objective of Eq. 23 (METHOD section 4) with the
conventions of METHOD section 11.

Axis legend (docs/CONVENTIONS.md): R rows (one sampled response each; prompts x K
flattened), T tokens of a row.

Layout: `logp_*` are float32[R, T], the log-probability of the sampled token
at each completion position; `mask` is bool[R, T], True up to and including the
first stop token (the sampler's `Rollout.mask`, METHOD 11).
Masked positions may hold garbage (0, -1e9, -inf, NaN): `grpo_loss` replaces
it with `jnp.where` before any exp or subtraction, so it reaches neither the
loss nor its gradient. The building blocks `k3_kl` and `clipped_surrogate`
expect inputs that are already clean. Log-probs of a sequence come from
`drubric_jax.rl.logprobs`.
"""

import numbers
from typing import Optional

import jax
import jax.numpy as jnp

LOG_RATIO_CLAMP = 20.0  # |log ratio| bound before exp, for KL and PPO ratio
# `train.aggregation` values; the first is the paper's (Eq. 23), the default.
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "dr_grpo")


def _log_ratio_to_ref(logp, ref_logp):
    """d = clip(ref_logp - logp, -20, 20) in float32 (METHOD 11)."""
    d = jnp.asarray(ref_logp, jnp.float32) - jnp.asarray(logp, jnp.float32)
    return jnp.clip(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def k1_kl(logp, ref_logp):
    """Per-token k1 estimator of KL(pi_theta || pi_ref): -d = logp - ref_logp (unbiased,
    can be negative per token). Schulman, "Approximating KL divergence" (2020)."""
    return -_log_ratio_to_ref(logp, ref_logp)


def k2_kl(logp, ref_logp):
    """Per-token k2 estimator: d^2 / 2 (biased, >= 0; its gradient is the one of the
    reverse-KL in expectation). Schulman (2020)."""
    d = _log_ratio_to_ref(logp, ref_logp)
    return 0.5 * d * d


def k3_kl(logp, ref_logp):
    """Per-token k3 estimator of KL(pi_theta || pi_ref) (METHOD 4 and 11; the default).

        d = clip(ref_logp - logp, -20, 20);  KL_t = exp(d) - d - 1  >= 0

    Its gradient w.r.t. logp is 1 - exp(d); it must be computed from the
    current policy's log-probs, not detached ones (case-03).

    Args:
        logp: float[..., T], current policy log-probs of the sampled tokens.
        ref_logp: float[..., T], reference-model log-probs of the same tokens.

    Returns:
        float32[..., T]. Callers must pass sanitised values at masked positions.
    """
    d = _log_ratio_to_ref(logp, ref_logp)
    return jnp.exp(d) - d - 1.0


# The KL term of Eq. 23, selectable by `train.kl_estimator`. Adding one = a function above
# with the signature (logp, ref_logp) -> float32[..., T] and a row here.
KL_ESTIMATORS = {"k1": k1_kl, "k2": k2_kl, "k3": k3_kl}


def clipped_surrogate(logp_new, logp_old, advantages, clip_eps):
    """Token-level PPO clipped objective of Eq. 23.

        r_t = exp(logp_new - logp_old),  obj_t = min(r_t A, clip(r_t, 1-eps, 1+eps) A)

    `logp_old` are the log-probs stored by the sampler (pi_old), fixed across
    the inner steps on a batch (case-07). The log-ratio is clamped to
    [-20, 20] before exp.

    Args:
        logp_new: float[R, T], current policy.
        logp_old: float[R, T], sampler log-probs.
        advantages: float[R], one advantage per response, broadcast over T.
        clip_eps: float, epsilon.

    Returns:
        objective: float32[R, T] (to be maximised).
        clipped: bool[R, T], True where the clipped branch is strictly smaller, so
            the token gets no gradient.
    """
    log_ratio = jnp.asarray(logp_new, jnp.float32) - jnp.asarray(logp_old, jnp.float32)
    # Clamped before exp (METHOD 11): exp(20) ~ 5e8 stays finite in float32.
    ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    # One advantage per response, the same for each of its tokens (Eq. 21).
    adv = jnp.asarray(advantages, jnp.float32)[..., None]
    unclipped = ratio * adv
    clipped_obj = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    # min: the clip binds only where it lowers the objective, and there the clipped ratio is
    # constant, so the token passes no gradient.
    return jnp.minimum(unclipped, clipped_obj), clipped_obj < unclipped


def aggregate_tokens(values, mask, aggregation="seq_mean_token_mean"):
    """Reduce per-token values to a scalar (case-06).

    - "seq_mean_token_mean" (paper, Eq. 23): (1/R') sum_i (1/|o_i|) sum_t,
        R' = rows with at least one real token (empty rows do not dilute).
    - "token_mean" (DAPO/BNPO): sum over real tokens / number of real tokens.
    - "dr_grpo": sum over real tokens / (R * T), a constant divisor.

    Args:
        values: float32[R, T]; must already be 0 (finite) at masked positions.
        mask: bool[R, T].
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
        # 1/|o_i| of Eq. 23; an empty row sums to 0 and is divided by 1, not 0.
        per_row = jnp.sum(v, axis=-1) / jnp.maximum(lengths, 1.0)
        rows = jnp.sum(lengths > 0).astype(jnp.float32)
        return jnp.sum(per_row) / jnp.maximum(rows, 1.0)
    if aggregation == "token_mean":
        return jnp.sum(v) / jnp.maximum(jnp.sum(m).astype(jnp.float32), 1.0)
    if aggregation == "dr_grpo":
        return jnp.sum(v) / float(m.shape[0] * m.shape[1])
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def grpo_loss(logp_new, logp_old, logp_ref, advantages, mask, clip_eps=0.2,
              beta=0.01, aggregation="seq_mean_token_mean", kl_estimator="k3"):
    """GRPO loss, the negative of Eq. 23, and its metrics.

        loss_t = -(min(r_t A_i, clip(r_t, 1-eps, 1+eps) A_i) - beta KL_t)

    with KL_t the clamped estimator `KL_ESTIMATORS[kl_estimator]` (k3 by default), aggregated by
    `aggregate_tokens`. Inputs are sanitised with `jnp.where` BEFORE the
    arithmetic, so garbage at masked positions gives neither a NaN loss nor a
    NaN gradient (case-05).

    Args:
        logp_new: float32[R, T], current policy log-probs (differentiated).
        logp_old: float32[R, T], log-probs stored at sampling time.
        logp_ref: float32[R, T] or None; may be None only when beta == 0, which
            skips the KL term (no reference model needed).
        advantages: float32[R], e.g. from `advantages.group_advantages_by_id` (Eq. 21).
        mask: bool[R, T] real completion tokens (EOS included).
        clip_eps: float, PPO epsilon.
        beta: float, KL coefficient (paper: 0.01).
        aggregation: static str, one of AGGREGATIONS.
        kl_estimator: static str, a key of KL_ESTIMATORS.

    Returns:
        loss: float32 scalar.
        metrics: dict of float32 scalars: loss, pg_loss (aggregated -objective),
            kl (aggregated KL estimate, 0 when skipped), clip_fraction (over real tokens),
            ratio_mean (over real tokens), num_tokens.

    Raises:
        ValueError: unknown aggregation or KL estimator, or logp_ref None with beta != 0.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {sorted(KL_ESTIMATORS)}, "
                         f"got {kl_estimator!r}")
    m = jnp.asarray(mask, bool)
    # Sanitise BEFORE any arithmetic (METHOD 11): a -inf or NaN left at a masked position would
    # reach exp() and, through where's backward pass, turn the gradient into NaN (case-05).
    new = jnp.where(m, jnp.asarray(logp_new, jnp.float32), 0.0)
    old = jnp.where(m, jnp.asarray(logp_old, jnp.float32), 0.0)
    # A row with no real token gets A = 0 whatever the caller passed (it may be NaN too).
    adv = jnp.where(jnp.any(m, axis=-1), jnp.asarray(advantages, jnp.float32), 0.0)

    objective, clipped = clipped_surrogate(new, old, adv, clip_eps)
    pg_token = jnp.where(m, -objective, 0.0)
    if logp_ref is None:
        # A traced beta could be nonzero at run time: only a Python 0 may skip the KL term.
        if not isinstance(beta, numbers.Real) or beta != 0:
            raise ValueError("logp_ref is None but beta is not 0")
        kl_token = jnp.zeros_like(pg_token)
        per_token = pg_token
    else:
        ref = jnp.where(m, jnp.asarray(logp_ref, jnp.float32), 0.0)
        kl_token = jnp.where(m, KL_ESTIMATORS[kl_estimator](new, ref), 0.0)
        # Eq. 23 negated: -(clipped objective - beta KL).
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


def loss_denominator(loss_mask: jax.Array, aggregation: str,
                      rows: Optional[jax.Array] = None) -> jax.Array:
    """The divisor `aggregate_tokens` uses for this mask (float32 scalar); the train step
    rescales each micro-batch's loss by its own divisor over the whole batch's.

    seq_mean_token_mean: rows with a real token; token_mean: real tokens; dr_grpo: R * T,
    or, given `rows` (bool[R], the active rows), (active rows) * T: the divisor of the
    batch without its inactive rows (at least 1 row).
    """
    if aggregation == "seq_mean_token_mean":
        return jnp.maximum(jnp.sum(jnp.any(loss_mask, axis=-1)), 1).astype(jnp.float32)
    if aggregation == "token_mean":
        return jnp.maximum(jnp.sum(loss_mask), 1).astype(jnp.float32)
    # dr_grpo: a constant R * T, whatever the lengths (Dr. GRPO's fixed normaliser).
    r = loss_mask.shape[0] if rows is None else jnp.maximum(jnp.sum(rows), 1)
    return jnp.asarray(r * loss_mask.shape[1], jnp.float32)
