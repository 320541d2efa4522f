"""Batched autoregressive sampling with a static-shape KV cache.

Prompts are left-padded to a length bucket (`bucket_length`), prefilled in one jitted call,
then decoded by a `lax.while_loop` that stops when every row has emitted a stop id or
`max_new_tokens` is reached. A step is `sample_token` then `forward_token`; with a per-row
token constraint (JSON schema via llguidance) the two run as separate jitted calls from a
host loop (`constrained.decode`), because the allowed-token mask is computed on the host
after each token.

Axis legend (docs/CONVENTIONS.md): B rows, P padded prompt length, N max new tokens,
S = P + N cache slots, V vocab. The sampling methods are in `sampling_methods`.

Log-probs: `logprobs[b, t]` is log softmax(logits / temperature) of the sampled token over
the full vocabulary (before top-k/top-p truncation and before any constraint mask), the
quantity the GRPO ratio uses (METHOD section 11). Greedy decoding reports temperature-1
log-probs; logits are never divided by 0.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from drubric_jax import models, sharding
from drubric_jax.models.config import ModelConfig
# The methods are part of this module's API (sampling.Greedy(), ...); they live apart.
from drubric_jax.sampling_methods import (  # noqa: F401
    Greedy, Method, Temperature, TopK, TopP, method_from_flags, sample_logits,
    scoring_temperature, truncated_logits)
from drubric_jax.types import Rollout


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


# Length buckets: powers of two up to BUCKET_POW2_UNTIL, then multiples of BUCKET_STEP. A
# new length reuses a compiled program, and a long prompt wastes at most BUCKET_STEP - 1
# padding tokens instead of up to half the bucket (a 690-token generator prompt: 768, not
# 1024).
BUCKET_POW2_UNTIL = 512
BUCKET_STEP = 128


def bucket_length(n: int, minimum: int = 16, step: int = BUCKET_STEP,
                  pow2_until: int = BUCKET_POW2_UNTIL) -> int:
    """The bucket of a length n: the smallest power of two >= max(n, minimum) while that is
    <= pow2_until, else the smallest multiple of `step` >= n."""
    n = max(int(n), int(minimum))
    # The smallest power of two >= n.
    pow2 = 1 << max(0, n - 1).bit_length()
    return pow2 if pow2 <= pow2_until else step * -(-n // step)


def left_pad(prompts: Sequence[Sequence[int]], length: int, pad_id: int):
    """Left-pads token lists to `length`: (tokens int32[B, length], mask bool[B, length]).

    Raises:
        ValueError: an empty prompt, or one longer than `length`.
    """
    tokens = np.full((len(prompts), length), pad_id, np.int32)
    mask = np.zeros((len(prompts), length), bool)
    for i, p in enumerate(prompts):
        if not 0 < len(p) <= length:
            raise ValueError(f"prompt {i} has {len(p)} tokens; must be 1..{length}")
        # Left padding: every row's last prompt token sits in the last column, so each decode
        # step writes the same cache slot for all rows.
        tokens[i, length - len(p):] = p
        mask[i, length - len(p):] = True
    return tokens, mask


def _shard_cache(cache, cfg: ModelConfig, mesh):
    """Cache rows over ("data", "fsdp") and KV heads over "tensor" (when they divide)."""
    if mesh is None:
        return cache
    # KV heads that do not divide over "tensor" stay whole (replicated over it).
    heads = "tensor" if cfg.num_kv_heads % mesh.shape["tensor"] == 0 else None
    # The cache k / v layout is [L, B, Hkv, S, Dh].
    kv = NamedSharding(mesh, P(None, sharding.BATCH_AXES, heads, None, None))
    return cache.replace(k=jax.lax.with_sharding_constraint(cache.k, kv),
                         v=jax.lax.with_sharding_constraint(cache.v, kv),
                         valid=jax.lax.with_sharding_constraint(
                             cache.valid, sharding.batch_sharding(mesh)))


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "mesh"))
def prefill(params, cfg: ModelConfig, tokens, token_mask, key, max_new_tokens: int,
            mesh=None, row_ids=None):
    """Prefills left-padded prompts and returns the initial SamplerState.

    Args:
        params: model params.  cfg: static model config.
        tokens: int32[B, P] left-padded prompts.  token_mask: bool[B, P].
        key: PRNG key for the whole generation.
        max_new_tokens: N.
        mesh: optional mesh: the KV cache [L, B, Hkv, S, Dh] is laid out rows over
            ("data", "fsdp") and heads over "tensor" (the decode loop keeps that layout).
        row_ids: None, or int32[B] row ids for per-row draws (`generate`).
    """
    b, p = tokens.shape
    # S = P + N slots: the whole generation fits without reallocating the cache.
    cache = _shard_cache(models.init_cache(cfg, b, p + max_new_tokens), cfg, mesh)
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


def _token_logprobs(logits: jax.Array, tokens: jax.Array, temperature: float) -> jax.Array:
    """float32[B] log softmax(logits / temperature)[tokens] over the full vocabulary."""
    # `temperature` is a scoring temperature: never 0 (greedy is scored at 1).
    logp_all = jax.nn.log_softmax(logits / temperature, axis=-1)
    return jnp.take_along_axis(logp_all, tokens[:, None], axis=-1)[:, 0]


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
    # loop use the same keys.
    tok, _, bad = sample_logits(jax.random.fold_in(state.key, state.step), logits, method,
                                state.row_ids)
    live = ~state.done
    if force_stop is not None:
        # A completed grammar may allow nothing more: its row ends with the stop id, not `invalid`.
        tok = jnp.where(force_stop, stop_ids[0], tok)
        bad = bad & ~force_stop
    emitted = live & ~bad
    # Unconstrained logits: the log-prob the training forward pass computes (pi_old, METHOD 11).
    logp = _token_logprobs(state.logits, tok, scoring_temperature(method))
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


# The per-layer weight copy as a program of its own (`decode_params`; the planner lowers it).
layer_copy = jax.jit(models.decode_params, static_argnames="cfg")


def decode_params(params, cfg: ModelConfig):
    """The weights in the form a decode loop runs on: on CPU (`models.per_layer_decode`) a
    per-layer copy of the block weights (`models.decode_params`), made by a program of its
    own; elsewhere `params` itself (no copy).

    `generate` and `constrained.decode` make this copy once per call, before the loop. Made
    inside `decode_loop`'s program instead, the same copy took 40-165 ms longer per call
    (SmolLM2-135M float32, B = 1 and 8, 2-core CPU; the copy alone takes 36 ms).
    """
    return layer_copy(params, cfg) if models.per_layer_decode() else params


# The state is donated: the returned cache reuses its buffers (no second cache alive).
@functools.partial(jax.jit, static_argnames=("cfg", "method", "pad_id"), donate_argnums=(2,))
def decode_loop(params, cfg: ModelConfig, state: SamplerState, method: Method,
                stop_ids: jax.Array, pad_id: int) -> SamplerState:
    """Decodes until every row stopped or N tokens were generated (`lax.while_loop`).

    On CPU the loop runs on per-layer copies of the weights and of the cache
    (`models.decode_params`, `models.decode_cache`); the returned cache is stacked again.
    Pass `decode_params(params, cfg)` (as `generate` does) to make the weight copy outside
    this program, where it is faster; stacked `params` are copied here.
    """
    max_new = state.tokens.shape[1]

    def cond(s):
        return (s.step < max_new) & ~jnp.all(s.done)

    layer_params = models.decode_params(params, cfg)  # one copy per call, not one per step

    def body(s):
        return forward_token(layer_params, cfg, *sample_token(s, method, stop_ids, pad_id))

    # Per-layer cache on CPU (`models.per_layer_decode`), stacked again on the way out.
    state = state.replace(cache=models.decode_cache(state.cache))
    state = jax.lax.while_loop(cond, body, state)
    return state.replace(cache=models.stack_cache(state.cache))  # into the donated buffers


def _finish(state: SamplerState, pad_id: int, prompt_tokens: np.ndarray,
            prompt_mask: np.ndarray, rows) -> Rollout:
    # The results come back to the host in one transfer; each process reads its own rows.
    tokens, logprobs, mask, done, invalid = sharding.fetch_process_rows(
        (state.tokens, state.logprobs, state.mask, state.done, state.invalid), rows)
    tokens = np.where(mask, tokens, pad_id).astype(np.int32)  # steps skipped by an early exit
    lengths = mask.sum(-1).astype(np.int32)
    return Rollout(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, tokens=tokens,
                   logprobs=logprobs, mask=mask, lengths=lengths, truncated=~done,
                   invalid=invalid, group_ids=np.arange(len(tokens), dtype=np.int32))


def generate(params, cfg: ModelConfig, prompts: Sequence[Sequence[int]], *, key: jax.Array,
             max_new_tokens: int, method: Method = Greedy(), stop_ids: Sequence[int],
             pad_id: Optional[int] = None, constraint=None, min_bucket: int = 16,
             allow_invalid: bool = False, mesh=None,
             row_ids: Optional[Sequence[int]] = None) -> Rollout:
    """Samples continuations of token-id prompts.

    Args:
        params, cfg: the model.
        prompts: B lists of token ids (already chat-formatted), each non-empty: all rows
            on one process; under several processes this process's rows (e.g. its
            `sharding.process_block` of the prompts), the same number on every process.
        key: PRNG key; the same key, prompts and params give the same tokens (whatever
            the number of processes, for the same global rows in process order).
        max_new_tokens: N, static (one compile per (B, bucket, N)).
        method: Greedy / Temperature / TopK / TopP.
        stop_ids: ids that end a row (EOS, end of turn); the first is used to end rows whose
            constraint completed.
        pad_id: filler after the stop token (default: stop_ids[0]); the mask, not the id,
            tells real tokens from filler.
        constraint: optional host-side constraint with `reset(batch)`,
            `fill(bitmask int32[B, ceil(V / 32)], rows bool[B])`, `finished() -> bool[B]`
            and `advance(tokens int32[B], live bool[B])`; see `constrained.decode` for the
            contract and `constrained.JsonSchemaConstraint` for the JSON-schema one.
        min_bucket: smallest prompt bucket.
        allow_invalid: return rows that met a step with no allowed token (flagged in
            `invalid`) instead of raising.
        mesh: optional mesh (params on it, `sharding.param_shardings`): rows are split over
            ("data", "fsdp"), padded with copies of the last prompt to a multiple of
            data x fsdp (dropped from the result), and the KV cache heads over "tensor".
            Under several processes each process's rows go to its own devices
            (`sharding.put_process_rows`); the prompt bucket is agreed between them.
        row_ids: None: the draws of a row depend on its position in this call's global
            batch. B distinct ids >= 0 (e.g. each row's index in the step's global batch):
            row b's tokens depend only on (key, row_ids[b], its prompt, the params), not
            on the batch around it, the micro-batch or the number of processes.

    Returns:
        Rollout of the B rows (host numpy; this process's rows), with the left-padded
        prompts it prefilled; group_ids is arange(B) (each row its own group) until the
        caller sets it.

    Raises:
        ValueError: empty stop_ids or prompts; row_ids not one id >= 0 per prompt; a row
            had no allowed token (case-09) and allow_invalid is False; under several
            processes, data x fsdp is not a multiple of the process count.
    """
    stop = np.asarray(list(stop_ids), np.int32)
    if stop.size == 0:
        raise ValueError("stop_ids must not be empty")
    if not prompts:
        raise ValueError("no prompts")
    if row_ids is not None:
        row_ids = [int(i) for i in row_ids]
        if len(row_ids) != len(prompts) or min(row_ids) < 0:
            raise ValueError(f"row_ids must give one id >= 0 per prompt: {len(row_ids)} "
                             f"ids (smallest {min(row_ids, default=None)}) for "
                             f"{len(prompts)} prompts")
    pad = int(stop[0] if pad_id is None else pad_id)
    # A compiled program per (rows, bucket, N): other prompt lengths in the bucket reuse it.
    longest = max(len(p) for p in prompts)
    n, put = len(prompts), jnp.asarray
    if mesh is not None:
        shards = int(np.prod([mesh.shape[a] for a in sharding.BATCH_AXES]))
        count = jax.process_count()
        if shards % count:
            raise ValueError(f"data x fsdp = {shards} row shards cannot split rows over "
                             f"{count} processes")
        # Every process sends the same number of rows (its share of the row shards),
        # filled with copies of its last prompt (dropped), and one bucket for all.
        per = shards // count
        rows = per * -(-sharding.agree_max(n) // per)
        prompts = list(prompts) + [prompts[-1]] * (rows - n)  # filler rows, dropped
        if row_ids is not None:  # filler rows draw as the row they copy (dropped anyway)
            row_ids = list(row_ids) + [row_ids[-1]] * (rows - n)
        longest = sharding.agree_max(longest)
        put = functools.partial(sharding.put_process_rows, mesh=mesh, n=rows * count)
    length = bucket_length(longest, min_bucket)
    tokens, mask = left_pad(prompts, length, pad)
    # The prompts go to the device here; `_finish` brings the results back.
    ids = None if row_ids is None else put(np.asarray(row_ids, np.int32))
    state = prefill(params, cfg, put(tokens), put(mask), key, max_new_tokens, mesh=mesh,
                    row_ids=ids)
    stop_arr = jnp.asarray(stop)
    if constraint is None:
        state = decode_loop(decode_params(params, cfg), cfg, state, method, stop_arr, pad)
    else:
        from drubric_jax import constrained  # imports this module: imported here, not on top

        state = constrained.decode(params, cfg, state, constraint, method, stop_arr, pad,
                                   None if mesh is None else sharding.batch_sharding(mesh))
    # This process's rows: where its prompts went (the whole batch on one process).
    out = _finish(state, pad, tokens, mask,
                  None if mesh is None else sharding.batch_sharding(mesh))
    # Drop the filler rows added for the mesh.
    if out.num_rows != n:
        out = out.take(slice(0, n))
    if out.invalid.any() and not allow_invalid:
        rows = np.flatnonzero(out.invalid).tolist()
        raise ValueError(f"rows {rows} reached a step with no allowed token (all logits -inf)")
    return out


def generate_chunked(params, cfg: ModelConfig, prompts: Sequence[Sequence[int]],
                     rows_per_call: int, *, key: jax.Array, min_bucket: int = 16,
                     after_call=None, **kw) -> Rollout:
    """`generate` over `rows_per_call` rows at a time (0 = all in one call): the rollout
    micro-batch, which bounds the KV cache ([L, rows, Hkv, P + N, Dh]) at paper lengths.

    Every call uses the bucket of the longest prompt of all rows, so the parts share P and
    join into one Rollout. One call uses `key`; call i of several uses fold_in(key, i),
    unless `row_ids` (int[B], passed to `generate` a call's slice at a time) are given:
    then every call uses `key` and each row draws by its id, so the tokens do not depend
    on `rows_per_call` (nor on the number of processes).
    `after_call()` runs after each call (e.g. to read a constraint's `finished()`).
    Under several processes `prompts` are this process's rows (`generate`), the same
    number on every process, and `rows_per_call` counts rows per process.
    """
    n = len(prompts)
    row_ids = kw.pop("row_ids", None)
    # 0 (or >= n) means one call with every row.
    chunk = rows_per_call if 0 < rows_per_call < n else n
    longest = max(len(p) for p in prompts)
    if kw.get("mesh") is not None:
        longest = sharding.agree_max(longest)  # one bucket on every process
    bucket = bucket_length(longest, min_bucket)
    parts = []
    for i, start in enumerate(range(0, n, chunk)):
        parts.append(generate(
            params, cfg, prompts[start:start + chunk],
            key=key if chunk == n or row_ids is not None else jax.random.fold_in(key, i),
            row_ids=None if row_ids is None else row_ids[start:start + chunk],
            min_bucket=bucket, **kw))
        if after_call is not None:
            after_call()
    return Rollout.concat(parts)
