"""Supervised fine-tuning by maximum likelihood: the loss and the jitted step of the
generator's warm start G_sft (checks world III; a deviation for scale, not the paper's
method: it stands in for the zero-shot competence of the paper's 8B generator).

    NLL = - sum_{r, t} m[r, t] log pi_theta(tokens[r, t] | tokens[r, :t]) / sum_{r, t} m[r, t]

a token mean over the target tokens of every row (prompt tokens and padding masked out by
`m`), at temperature 1 (METHOD 11's scoring convention for a target nobody sampled). The
log-probs are `rl.logprobs.sequence_logprobs`, the function the GRPO loss (Eq. 23) scores
with, so both losses see one forward.

Axis legend (docs/CONVENTIONS.md): R rows (one (input, target) pair each), T = P + N
tokens of a row (left-padded input bucket P, right-padded target N), V vocab.

Batch layout (`SFTBatch`):
    tokens       int32[R, T]  [left-padded generator input (P) | target, right-padded]
    token_mask   bool[R, T]   real tokens (positions come from it)
    target_mask  bool[R, T]   the target's tokens (its stop token included); False over
                              the input bucket and the padding
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from drubric_jax.models import lora
from drubric_jax.models.config import ModelConfig
from drubric_jax.rl.logprobs import sequence_logprobs
from drubric_jax.rl.train_config import TrainConfig, learning_rate_schedule, schedule_count
from drubric_jax.rl.train_step import TrainState


@flax.struct.dataclass
class SFTBatch:
    """One supervised batch; layout in the module docstring."""

    tokens: jax.Array       # int32[R, T]
    token_mask: jax.Array   # bool[R, T]
    target_mask: jax.Array  # bool[R, T]
    # Input bucket P (static): positions < P are never scored, so the output head skips them.
    prompt_len: int = flax.struct.field(pytree_node=False, default=0)


def token_nll(logp, target_mask) -> tuple[jax.Array, jax.Array]:
    """The token-mean negative log-likelihood of the targets (module docstring).

    Args:
        logp: float32[R, T] log-probs of the tokens (`sequence_logprobs`); anything where
            target_mask is False (NaN included: it is replaced before the sum).
        target_mask: bool[R, T] the target tokens.

    Returns:
        (nll float32[], target tokens float32[]); nll is 0 when there is no target token
        (no 0/0).
    """
    m = jnp.asarray(target_mask, bool)
    n = jnp.sum(m).astype(jnp.float32)
    total = -jnp.sum(jnp.where(m, jnp.asarray(logp, jnp.float32), 0.0))
    return total / jnp.maximum(n, 1.0), n


def sft_loss(params: dict, batch: SFTBatch, base: Optional[dict], *, model_cfg: ModelConfig,
             train_cfg: TrainConfig) -> tuple[jax.Array, dict]:
    """`token_nll` of the batch's targets under the trainee (module docstring).

    Args:
        params: the trainee's params: its LoRA adapters when model_cfg.lora_rank > 0, else
            the full params.
        batch: SFTBatch.
        base: the frozen base the adapters sit on (LoRA only; ignored otherwise).
        model_cfg, train_cfg: static configs (train_cfg: logits_chunk, remat).

    Returns:
        (nll float32[], {"nll", "target_tokens", "token_accuracy"}); token_accuracy is the
        fraction of target tokens whose log-prob exceeds log(1/2), so the argmax (no
        gradient).

    Raises:
        ValueError: a LoRA trainee without `base`.
    """
    if model_cfg.lora_rank and base is None:
        raise ValueError("a LoRA trainee (lora_rank > 0) needs the base params")
    model = lora.attach(base, params) if model_cfg.lora_rank else params
    # Temperature 1: the target was written, not sampled (METHOD 11 scores greedy at 1).
    logp = sequence_logprobs(model, model_cfg, batch.tokens, batch.token_mask, 1.0,
                             chunk=train_cfg.logits_chunk, start=batch.prompt_len,
                             remat=train_cfg.remat)
    nll, n = token_nll(logp, batch.target_mask)
    sure = jnp.sum(jnp.where(batch.target_mask, jax.lax.stop_gradient(logp) > jnp.log(0.5),
                             False))
    return nll, {"nll": nll, "target_tokens": n,
                 "token_accuracy": sure.astype(jnp.float32) / jnp.maximum(n, 1.0)}


def sft_step(state: TrainState, batch: SFTBatch, base: Optional[dict], *,
             model_cfg: ModelConfig, train_cfg: TrainConfig,
             optimizer: optax.GradientTransformation) -> tuple[TrainState, dict]:
    """One AdamW update on `sft_loss` (`train_config.make_optimizer`: global-norm clip, then
    AdamW with the warm-up schedule).

    Returns:
        (new state, metrics): float32 scalars nll, target_tokens, token_accuracy (of the
        batch before the update), grad_norm (before clipping), update_norm, learning_rate.
    """
    grad_fn = jax.grad(functools.partial(sft_loss, model_cfg=model_cfg, train_cfg=train_cfg),
                       has_aux=True)
    grads, metrics = grad_fn(state.params, batch, base)
    count = schedule_count(state.opt_state)
    lr = learning_rate_schedule(train_cfg)(state.step if count is None else count)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics.update(grad_norm=optax.tree.norm(grads), update_norm=optax.tree.norm(updates),
                   learning_rate=lr)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


@functools.lru_cache(maxsize=4)
def make_sft_step(model_cfg: ModelConfig, train_cfg: TrainConfig):
    """`(optimizer, step)`: `sft_step` jitted, the state donated (params and moments are not
    held twice). One device: the warm start runs where the generator is 135M parameters; an
    8B generator writes checks zero-shot and needs no warm start (module docstring)."""
    from drubric_jax.rl.train_config import make_optimizer

    optimizer = make_optimizer(train_cfg)
    step = jax.jit(functools.partial(sft_step, model_cfg=model_cfg, train_cfg=train_cfg,
                                     optimizer=optimizer), donate_argnums=(0,))
    return optimizer, step


def pack_batch(inputs: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], pad_id: int,
               input_bucket: int, target_bucket: int) -> SFTBatch:
    """Host arrays of an SFTBatch: each input left-padded to `input_bucket`, each target
    right-padded to `target_bucket` (fixed buckets: one compiled step for every batch).

    Args:
        inputs: R token-id lists (the generator's chat prompt, generation prompt included).
        targets: R token-id lists (the output and its stop token).
        pad_id: the id written in padding (masked out everywhere).
        input_bucket, target_bucket: P and N.

    Returns:
        SFTBatch of numpy arrays, T = P + N, prompt_len = P.

    Raises:
        ValueError: R differs between inputs and targets, a row is empty, or a row is
            longer than its bucket (names the row).
    """
    if len(inputs) != len(targets) or not inputs:
        raise ValueError(f"{len(inputs)} inputs and {len(targets)} targets (need equal, >= 1)")
    r, p, n = len(inputs), int(input_bucket), int(target_bucket)
    tokens = np.full((r, p + n), int(pad_id), np.int32)
    token_mask = np.zeros((r, p + n), bool)
    target_mask = np.zeros((r, p + n), bool)
    for i, (x, y) in enumerate(zip(inputs, targets)):
        if not x or not y or len(x) > p or len(y) > n:
            raise ValueError(f"row {i}: input of {len(x)} tokens (bucket {p}) and target of "
                             f"{len(y)} (bucket {n}); both must be non-empty and fit")
        tokens[i, p - len(x):p] = x
        tokens[i, p:p + len(y)] = y
        token_mask[i, p - len(x):p + len(y)] = True
        target_mask[i, p:p + len(y)] = True
    return SFTBatch(tokens=tokens, token_mask=token_mask, target_mask=target_mask, prompt_len=p)
