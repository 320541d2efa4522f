"""The GRPO train step (Eq. 23): log-probs at the sampling temperature, micro-batched
gradients, AdamW with warm-up, and its sharded `jax.jit` wrapper.

Axis legend: B rows (one sampled response each; prompts x K flattened), T tokens of the
whole sequence (prompt bucket + completion), P prompt bucket, N completion length,
V vocab, D model dim, n micro-batches, b rows per micro-batch (B = n * b).

Batch layout (`Batch`, one row per response):
    tokens        int32[B, T]    [left-padded prompt (P) | completion (N), right-padded]
    token_mask    bool[B, T]     real tokens: the prompt's, then the completion up to and
                                 including its first stop token (`SampleOutput.mask`)
    loss_mask     bool[B, T]     completion tokens only (incl. EOS, METHOD 11); False over
                                 the prompt bucket and the filler after EOS
    old_logprobs  float32[B, T]  sampler log-probs (pi_old) aligned to `tokens`; anything
                                 (0 in practice) where loss_mask is False
    ref_logprobs  float32[B, T]  frozen reference's `sequence_logprobs`; zeros if beta = 0
    advantages    float32[B]     Eq. 21 / Eq. 25 advantages, one per response
    truncated     bool[B]        the completion hit max_new_tokens without a stop id

RoPE positions come from `token_mask` (`positions_from_mask`), so the left padding of the
prompt bucket never shifts a row and the completion continues the prompt's positions
exactly as the sampler's KV cache did. `logp[:, t]` scores tokens[:, t] given
tokens[:, :t]; position 0 has no context and gets 0.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from drubric_jax import grpo, sharding
from drubric_jax.models import llama
from drubric_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of one GRPO trainee (policy or rubric generator).

    Validated on construction (ValueError on a bad value).
    """

    learning_rate: float = 1e-6     # peak AdamW step size (paper: 1e-6 policy, 5e-6 generator)
    warmup_steps: int = 0           # optimizer updates of linear warm-up; 0 = none
    weight_decay: float = 0.0       # decoupled AdamW decay (not applied to norm scales)
    b1: float = 0.9                 # Adam first-moment decay
    b2: float = 0.999               # Adam second-moment decay
    eps: float = 1e-8               # Adam denominator epsilon
    max_grad_norm: float = 1.0      # global-norm clip of the accumulated gradient
    clip_eps: float = 0.2           # PPO epsilon of Eq. 23
    beta: float = 0.01              # KL coefficient beta of Eq. 23 (k3 estimator)
    aggregation: str = "seq_mean_token_mean"  # grpo.AGGREGATIONS; paper: per-response mean
    micro_batch_size: int = 8       # rows per forward/backward; B % micro_batch_size == 0
    temperature: float = 1.0        # sampler temperature; log-probs use it; 0 (greedy) -> 1
    logits_chunk: int = 512         # tokens per logits chunk (bounds the [B, chunk, V] buffer)
    mu_dtype: str = "float32"       # storage of Adam's first moment: float32 | bfloat16

    def __post_init__(self):
        if self.learning_rate < 0:
            raise ValueError(f"learning_rate must be >= 0, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("b1", "b2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.aggregation not in grpo.AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {grpo.AGGREGATIONS}, "
                             f"got {self.aggregation!r}")
        if self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.logits_chunk < 1:
            raise ValueError(f"logits_chunk must be >= 1, got {self.logits_chunk}")
        if self.mu_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"mu_dtype must be float32 or bfloat16, got {self.mu_dtype!r}")

    @property
    def scoring_temperature(self) -> float:
        """Temperature of the log-probs: the sampler's, or 1.0 for greedy (METHOD 11)."""
        return self.temperature if self.temperature > 0 else 1.0


# ----------------------------------------------------------------------------- optimizer


def learning_rate_schedule(cfg: TrainConfig) -> optax.Schedule:
    """lr(count) = learning_rate * min(1, (count + 1) / warmup_steps), count = updates done.

    The first update already moves (lr / warmup_steps); constant after warm-up. `count` is
    the optimizer state's own counter, so a restored state resumes the schedule (case-21).
    """
    peak, warmup = float(cfg.learning_rate), int(cfg.warmup_steps)

    def schedule(count):
        if warmup == 0:
            return jnp.full((), peak, jnp.float32)
        frac = (jnp.asarray(count, jnp.float32) + 1.0) / warmup
        return peak * jnp.minimum(1.0, frac)

    return schedule


def _decay_mask(params):
    """True for matrices, False for norm scales (`*norm` keys)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: not (sharding._leaf_name(path) or "").endswith("norm"), params)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """clip_by_global_norm(max_grad_norm) then AdamW with `learning_rate_schedule(cfg)`.

    `cfg.mu_dtype="bfloat16"` stores Adam's first moment in bfloat16 (optax `mu_dtype`; the
    update is still computed in float32): half the memory of that moment. The second
    moment stays in the params' dtype. The schedule reads the `ScaleByScheduleState.count` inside the optimizer state (not a
    separate counter), so restoring `opt_state` restores the warm-up position.
    """
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                    weight_decay=cfg.weight_decay, mask=_decay_mask,
                    mu_dtype=jnp.dtype(cfg.mu_dtype)))


def _schedule_count(opt_state) -> Optional[jax.Array]:
    """The schedule's own update counter inside `opt_state` (None if there is none)."""
    for leaf in jax.tree.leaves(opt_state,
                                is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState)):
        if isinstance(leaf, optax.ScaleByScheduleState):
            return leaf.count
    return None


@flax.struct.dataclass
class TrainState:
    """Everything the step updates.

    Attributes:
        step: int32[] optimizer updates applied so far.
        params: model parameter pytree.
        opt_state: optax state (Adam moments mirror params; counters are int32[]).
    """

    step: jax.Array
    params: dict
    opt_state: optax.OptState


def init_train_state(params: dict, optimizer: optax.GradientTransformation) -> TrainState:
    """TrainState at step 0. Pure: `jax.jit(..., out_shardings=...)` creates it sharded."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params))


# ----------------------------------------------------------------------------- batch


@flax.struct.dataclass
class Batch:
    """One GRPO batch; see the module docstring for the layout of every field."""

    tokens: jax.Array        # int32[B, T]
    token_mask: jax.Array    # bool[B, T]
    loss_mask: jax.Array     # bool[B, T]
    old_logprobs: jax.Array  # float32[B, T]
    ref_logprobs: jax.Array  # float32[B, T]
    advantages: jax.Array    # float32[B]
    truncated: jax.Array     # bool[B]
    # Prompt bucket P (static): positions < P are never scored, so the output head skips
    # them. 0 = score every position.
    prompt_len: int = flax.struct.field(pytree_node=False, default=0)


def batch_from_samples(prompt_tokens, prompt_mask, sample, advantages,
                       ref_logprobs=None) -> Batch:
    """Builds the Batch layout from left-padded prompts and a `sampling.SampleOutput`.

    Args:
        prompt_tokens: int32[B, P] left-padded prompts (`sampling.left_pad`).
        prompt_mask: bool[B, P].
        sample: SampleOutput with tokens/logprobs/mask int32/float32/bool[B, N], truncated.
        advantages: float32[B].
        ref_logprobs: float32[B, P + N] or None (zeros; fill it later with
            `batch.replace(ref_logprobs=...)`).

    Returns:
        Batch of host numpy arrays, T = P + N.

    Raises:
        ValueError: row counts differ.
    """
    prompt_tokens = np.asarray(prompt_tokens, np.int32)
    prompt_mask = np.asarray(prompt_mask, bool)
    b, p = prompt_tokens.shape
    if sample.tokens.shape[0] != b or np.shape(advantages) != (b,):
        raise ValueError(f"{b} prompt rows, {sample.tokens.shape[0]} sampled rows, "
                         f"advantages shape {np.shape(advantages)}")
    comp_mask = np.asarray(sample.mask, bool)
    tokens = np.concatenate([prompt_tokens, np.asarray(sample.tokens, np.int32)], axis=1)
    zeros = np.zeros((b, p), np.float32)
    if ref_logprobs is None:
        ref_logprobs = np.zeros(tokens.shape, np.float32)
    return Batch(
        tokens=tokens,
        token_mask=np.concatenate([prompt_mask, comp_mask], axis=1),
        loss_mask=np.concatenate([np.zeros((b, p), bool), comp_mask], axis=1),
        old_logprobs=np.concatenate([zeros, np.asarray(sample.logprobs, np.float32)], 1),
        ref_logprobs=np.asarray(ref_logprobs, np.float32),
        advantages=np.asarray(advantages, np.float32),
        truncated=np.asarray(sample.truncated, bool), prompt_len=p)


# ----------------------------------------------------------------------------- log-probs


def sequence_logprobs(params: dict, cfg: ModelConfig, tokens: jax.Array,
                      token_mask: jax.Array, temperature: float = 1.0, *,
                      chunk: int = 512, return_entropy: bool = False, start: int = 0):
    """Per-token log-probs of a sequence under the model at `temperature` (METHOD 11).

        logp[b, t] = log softmax(logits(tokens[b, :t]) / temperature)[tokens[b, t]]

    One causal forward pass (no cache); the output head and softmax run over time chunks
    of `chunk` tokens under `jax.checkpoint`, so neither the forward nor the backward pass
    holds more than one float32[B, chunk, V] logits buffer.

    Args:
        params, cfg: the model.
        tokens: int32[B, T] (layout in the module docstring).
        token_mask: bool[B, T] real tokens; positions come from it.
        temperature: the sampler's temperature, float or float32[B]; 0 (greedy) is
            scored at 1 (logits are never divided by 0).
        chunk: tokens per logits chunk (static).
        return_entropy: also return the entropy of each next-token distribution.
        start: first position scored (static); earlier positions get 0 and the output
            head runs only on [start, T), e.g. the completion of a [prompt | completion]
            row (start = prompt bucket P), which skips the prompt's [B, P, V] logits.

    Returns:
        logp float32[B, T] (0 at t = 0 and wherever token_mask is False), and, with
        return_entropy, entropy float32[B, T] in nats (same zeros; no gradient).
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    token_mask = jnp.asarray(token_mask, bool)
    b, t = tokens.shape
    positions = llama.positions_from_mask(token_mask)
    hidden, _ = llama.forward_hidden(params, cfg, tokens, positions, token_mask, remat=True)
    s0 = min(max(int(start), 1), t - 1) if t > 1 else 1
    n = t - s0  # hidden[:, i] predicts tokens[:, i + 1]
    c = max(1, min(chunk, n))
    num_chunks = -(-n // c)
    pad = num_chunks * c - n
    h = jnp.pad(hidden[:, s0 - 1:-1], ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(tokens[:, s0:], ((0, 0), (0, pad)))
    h = h.reshape(b, num_chunks, c, -1).swapaxes(0, 1)          # [chunks, B, c, D]
    targets = targets.reshape(b, num_chunks, c).swapaxes(0, 1)  # [chunks, B, c]

    @jax.checkpoint
    def score(h_c, tgt_c):
        logits = llama.logits_from_hidden(params, cfg, h_c)     # float32[B, c, V]
        logp = grpo.token_logprobs_from_logits(logits, tgt_c, temperature)
        ent = grpo.entropy_from_logits(jax.lax.stop_gradient(logits), temperature)
        return logp, ent

    logp, ent = jax.lax.map(lambda xs: score(*xs), (h, targets))

    def unchunk(x):
        x = x.swapaxes(0, 1).reshape(b, num_chunks * c)[:, :n]
        x = jnp.concatenate([jnp.zeros((b, s0), jnp.float32), x], axis=1)
        return jnp.where(token_mask, x, 0.0)

    logp = unchunk(logp)
    if return_entropy:
        return logp, jax.lax.stop_gradient(unchunk(ent))
    return logp


# ----------------------------------------------------------------------------- step


def _loss_denominator(loss_mask: jax.Array, aggregation: str) -> jax.Array:
    """The divisor `grpo.aggregate_tokens` uses for this mask (float32 scalar).

    seq_mean_token_mean: rows with a real token; token_mean: real tokens; dr_grpo: B * T.
    """
    if aggregation == "seq_mean_token_mean":
        return jnp.maximum(jnp.sum(jnp.any(loss_mask, axis=-1)), 1).astype(jnp.float32)
    if aggregation == "token_mean":
        return jnp.maximum(jnp.sum(loss_mask), 1).astype(jnp.float32)
    return jnp.asarray(loss_mask.shape[0] * loss_mask.shape[1], jnp.float32)


def train_step(state: TrainState, batch: Batch, *, model_cfg: ModelConfig,
               train_cfg: TrainConfig,
               optimizer: optax.GradientTransformation) -> tuple[TrainState, dict]:
    """One optimizer update on the negative of Eq. 23, accumulated over micro-batches.

    Micro-batch normalisation: each micro-batch's `grpo.grpo_loss` is rescaled by
    (its own aggregation divisor) / (the whole batch's divisor), so the micro-batch losses
    SUM to the full-batch loss and the accumulated gradient equals the one-big-batch
    gradient for every aggregation (per-response mean: divisor = non-empty rows of the
    batch, not of the micro-batch; token mean: real tokens of the batch; Dr.GRPO: B * T).
    Micro-batch i holds rows i, i + n, i + 2n, ... so, with rows sharded in blocks over
    ("data", "fsdp"), every micro-batch stays spread over all devices.

    Args:
        state: TrainState (donated by the jitted wrappers).
        batch: Batch with B rows (layout in the module docstring).
        model_cfg, train_cfg: static configs.
        optimizer: `make_optimizer(train_cfg)` (the lr metric reads its schedule counter).

    Returns:
        (new state, metrics): float32 scalars loss, pg_loss, kl, clip_fraction, ratio_mean,
        entropy (mean over completion tokens, nats), grad_norm (before clipping),
        update_norm, advantage_{mean,std,min,max}, response_length_mean (tokens incl. EOS),
        truncated_fraction, num_tokens, learning_rate (of this update).

    Raises:
        ValueError: B not a multiple of micro_batch_size.
    """
    b = batch.tokens.shape[0]
    mb = train_cfg.micro_batch_size
    if b % mb:
        raise ValueError(f"batch of {b} rows is not a multiple of "
                         f"micro_batch_size={mb}")
    n = b // mb
    agg = train_cfg.aggregation
    loss_mask = jnp.asarray(batch.loss_mask, bool)
    denom = _loss_denominator(loss_mask, agg)
    total_tokens = jnp.maximum(jnp.sum(loss_mask), 1).astype(jnp.float32)
    micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(mb, n, *x.shape[1:]), 0, 1), batch)

    def loss_fn(params, mbatch: Batch):
        logp, ent = sequence_logprobs(params, model_cfg, mbatch.tokens, mbatch.token_mask,
                                      train_cfg.scoring_temperature,
                                      chunk=train_cfg.logits_chunk, return_entropy=True,
                                      start=mbatch.prompt_len)
        ref = None if train_cfg.beta == 0 else mbatch.ref_logprobs
        loss, m = grpo.grpo_loss(logp, mbatch.old_logprobs, ref, mbatch.advantages,
                                 mbatch.loss_mask, train_cfg.clip_eps, train_cfg.beta, agg)
        scale = _loss_denominator(mbatch.loss_mask, agg) / denom
        tok = m["num_tokens"] / total_tokens
        sums = {"loss": m["loss"] * scale, "pg_loss": m["pg_loss"] * scale,
                "kl": m["kl"] * scale, "clip_fraction": m["clip_fraction"] * tok,
                "ratio_mean": m["ratio_mean"] * tok,
                "entropy": jnp.sum(jnp.where(mbatch.loss_mask, ent, 0.0)) / total_tokens}
        return loss * scale, sums

    grad_fn = jax.grad(loss_fn, has_aux=True)

    def accumulate(carry, mbatch):
        grads, sums = carry
        g, s = grad_fn(state.params, mbatch)
        grads = jax.tree.map(lambda a, x: a + x.astype(jnp.float32), grads, g)
        return (grads, jax.tree.map(jnp.add, sums, s)), None

    if n == 1:  # one micro-batch: no accumulator buffer (saves a float32 copy of params)
        grads, metrics = grad_fn(state.params, batch)
    else:
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        zero_sums = {k: jnp.zeros((), jnp.float32) for k in
                     ("loss", "pg_loss", "kl", "clip_fraction", "ratio_mean", "entropy")}
        (grads, metrics), _ = jax.lax.scan(accumulate, (zeros, zero_sums), micro)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)

    count = _schedule_count(state.opt_state)
    lr = learning_rate_schedule(train_cfg)(state.step if count is None else count)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)

    adv = jnp.asarray(batch.advantages, jnp.float32)
    metrics.update(
        grad_norm=optax.tree.norm(grads), update_norm=optax.tree.norm(updates),
        advantage_mean=jnp.mean(adv), advantage_std=jnp.std(adv),
        advantage_min=jnp.min(adv), advantage_max=jnp.max(adv),
        response_length_mean=jnp.mean(jnp.sum(loss_mask, axis=-1).astype(jnp.float32)),
        truncated_fraction=jnp.mean(jnp.asarray(batch.truncated, jnp.float32)),
        num_tokens=jnp.sum(loss_mask).astype(jnp.float32), learning_rate=lr)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


def make_train_step(model_cfg: ModelConfig, train_cfg: TrainConfig,
                    optimizer: optax.GradientTransformation):
    """`jax.jit` of `train_step` without shardings (single device), donating the state."""
    return jax.jit(functools.partial(train_step, model_cfg=model_cfg, train_cfg=train_cfg,
                                     optimizer=optimizer), donate_argnums=(0,))


def make_sharded_train_step(model_cfg: ModelConfig, train_cfg: TrainConfig,
                            optimizer: optax.GradientTransformation, mesh,
                            state_shapes: TrainState):
    """Sharded `(state, batch) -> (state, metrics)`; the state is donated.

    Args:
        model_cfg, train_cfg, optimizer: as for `train_step`.
        mesh: from `sharding.make_mesh`.
        state_shapes: TrainState of arrays or of `jax.eval_shape` structs, e.g.
            `jax.eval_shape(lambda: init_train_state(init_params(cfg, key), optimizer))`.

    Returns:
        The jitted step. State in/out: `sharding.param_shardings(state_shapes, mesh)`;
        batch rows over ("data", "fsdp") (B and micro_batch_size should be multiples of
        data * fsdp); metrics replicated. Put the state with `shard_train_state` first.
    """
    state_sh = sharding.param_shardings(state_shapes, mesh)
    return jax.jit(
        functools.partial(train_step, model_cfg=model_cfg, train_cfg=train_cfg,
                          optimizer=optimizer),
        in_shardings=(state_sh, sharding.batch_sharding(mesh)),
        out_shardings=(state_sh, sharding.replicated(mesh)),
        donate_argnums=(0,))


def shard_train_state(state: TrainState, mesh) -> TrainState:
    """`jax.device_put` of a state onto the shardings `make_sharded_train_step` expects."""
    return jax.device_put(state, sharding.param_shardings(state, mesh))


def make_sharded_logprobs_fn(model_cfg: ModelConfig, mesh, param_shapes: dict,
                             temperature: float = 1.0, chunk: int = 512):
    """Sharded `(params, tokens, token_mask) -> logp float32[B, T]` (`sequence_logprobs`).

    For the reference pass (ref_logprobs) or recomputing pi_old; nothing is donated.
    tokens / token_mask / output rows are sharded over ("data", "fsdp").
    """
    rows = sharding.batch_sharding(mesh)
    fn = functools.partial(sequence_logprobs, cfg=model_cfg, temperature=temperature,
                           chunk=chunk)
    return jax.jit(lambda params, tokens, token_mask: fn(params, tokens=tokens,
                                                         token_mask=token_mask),
                   in_shardings=(sharding.param_shardings(param_shapes, mesh), rows, rows),
                   out_shardings=rows)


def check_finite(metrics: dict, step: int) -> dict:
    """Raises FloatingPointError if any metric is NaN/inf; returns host floats.

    Call it on step N-1's metrics after dispatching step N (STYLE 9), so fetching them
    does not stall the device.

    Raises:
        FloatingPointError: "step S: metric NAME is nan" for the first bad metric.
    """
    host = {k: float(v) for k, v in jax.device_get(metrics).items()}
    for name, value in host.items():
        if not np.isfinite(value):
            raise FloatingPointError(f"step {step}: metric {name!r} is {value}")
    return host
