"""Batched autoregressive sampling of token-id prompts: `generate` and `generate_chunked`.

Prompts are left-padded to a length bucket (`sampling.buckets`), prefilled in one jitted
call, then decoded by the jitted loop (`sampling.decode`), or, with a per-row token
constraint (JSON schema via llguidance), by the host loop of `sampling.constrained`,
because the allowed-token mask is computed on the host after each token.

Axis legend (docs/CONVENTIONS.md): B rows, P padded prompt length, N max new tokens.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax import models, parallel
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling import constrained
from drubric_jax.sampling.buckets import bucket_length, cache_schedule, left_pad
from drubric_jax.sampling.decode import (SamplerState, decode_loop, decode_params,
                                         decode_segments, prefill)
from drubric_jax.sampling.methods import Greedy, Method
from drubric_jax.types import Rollout


def _finish(state: SamplerState, pad_id: int, prompt_tokens: np.ndarray,
            prompt_mask: np.ndarray, rows) -> Rollout:
    # The results come back to the host in one transfer; each process reads its own rows.
    tokens, logprobs, mask, done, invalid = parallel.fetch_process_rows(
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
             row_ids: Optional[Sequence[int]] = None, cache_segments: int = 0,
             pad_rows: int = 0, loop_params=None) -> Rollout:
    """Samples continuations of token-id prompts.

    Args:
        params, cfg: the model.
        prompts: B lists of token ids (already chat-formatted), each non-empty: all rows
            on one process; under several processes this process's rows (e.g. its
            `parallel.process_block` of the prompts), the same number on every process.
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
        mesh: optional mesh (params on it, `models.param_shardings`): rows are split over
            ("data", "fsdp"), padded with copies of the last prompt to a multiple of
            data x fsdp (dropped from the result), and the KV cache heads over "tensor".
            Under several processes each process's rows go to its own devices
            (`parallel.put_process_rows`); the prompt bucket is agreed between them.
        row_ids: None: the draws of a row depend on its position in this call's global
            batch. B distinct ids >= 0 (e.g. each row's index in the step's global batch):
            row b's tokens depend only on (key, row_ids[b], its prompt, the params), not
            on the batch around it, the micro-batch or the number of processes.
        cache_segments: decode segments of the KV cache (`sampling.cache_schedule`): the
            cache starts small and grows, so a step reads the slots filled so far rounded
            up to its segment, not all P + N. 0 = auto (up to 4 when N >= P, on CPU and
            GPU), 1 = one cache of P + N slots. Tokens do not depend on it.
        pad_rows: the call's rows when there are fewer prompts: filled with copies of the
            last prompt (and of its row id), dropped from the result, so a short call
            (`generate_chunked`'s last) runs the program of the full ones instead of
            compiling its own. 0 = the prompts' count.
        loop_params: the weights the decode loop runs on, `decode_params(params, cfg)`
            made by the caller (`generate_chunked` makes the copy once for all its calls);
            None: made here.

    Returns:
        Rollout of the B rows (host numpy; this process's rows), with the left-padded
        prompts it prefilled; group_ids is arange(B) (each row its own group) until the
        caller sets it.

    Raises:
        ValueError: empty stop_ids or prompts; row_ids not one id >= 0 per prompt;
            cache_segments < 0; a row
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
    if pad_rows > n:  # filler rows, dropped: the program of a pad_rows-row call
        prompts = list(prompts) + [prompts[-1]] * (pad_rows - n)
        if row_ids is not None:
            row_ids = list(row_ids) + [row_ids[-1]] * (pad_rows - n)
    if mesh is not None:
        shards = parallel.row_shards(mesh)
        count = jax.process_count()
        if shards % count:
            raise ValueError(f"data x fsdp = {shards} row shards cannot split rows over "
                             f"{count} processes")
        # Every process sends the same number of rows (its share of the row shards),
        # filled with copies of its last prompt (dropped), and one bucket for all.
        per = shards // count
        have = len(prompts)
        rows = per * -(-parallel.agree_max(have) // per)
        prompts = list(prompts) + [prompts[-1]] * (rows - have)  # filler rows, dropped
        if row_ids is not None:  # filler rows draw as the row they copy (dropped anyway)
            row_ids = list(row_ids) + [row_ids[-1]] * (rows - have)
        longest = parallel.agree_max(longest)
        put = functools.partial(parallel.put_process_rows, mesh=mesh, n=rows * count)
    length = bucket_length(longest, min_bucket)
    tokens, mask = left_pad(prompts, length, pad)
    # The prompts go to the device here; `_finish` brings the results back.
    ids = None if row_ids is None else put(np.asarray(row_ids, np.int32))
    # The loop's form: that of `decode_params(params, cfg)` (the weights' own, else
    # `ModelConfig.decode_form`), read here on the host; the copy itself is made after
    # the prefill is dispatched.
    per_layer = (models.is_per_layer(loop_params) if loop_params is not None else
                 models.is_per_layer(params) or models.decode_per_layer(cfg))
    slots = cache_schedule(length, max_new_tokens, cache_segments, per_layer)
    state = prefill(params, cfg, put(tokens), put(mask), key, max_new_tokens, mesh=mesh,
                    row_ids=ids, num_slots=slots[0])
    stop_arr = jnp.asarray(stop)
    if constraint is None:
        loop_params = decode_params(params, cfg) if loop_params is None else loop_params
        if len(slots) == 1:
            state = decode_loop(loop_params, cfg, state, method, stop_arr, pad)
        else:
            state = decode_segments(loop_params, cfg, state.replace(cache=None), state.cache,
                                    method, stop_arr, pad, slots)
    else:
        state = constrained.decode(params if loop_params is None else loop_params, cfg,
                                   state, constraint, method, stop_arr, pad,
                                   None if mesh is None else parallel.batch_sharding(mesh),
                                   cache_slots=slots)
    # This process's rows: where its prompts went (the whole batch on one process).
    out = _finish(state, pad, tokens, mask,
                  None if mesh is None else parallel.batch_sharding(mesh))
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
    `after_call(rows)` runs after each call with the call's number of prompts (its first
    rows; e.g. to read that many of a constraint's `finished()`).
    A last call of fewer rows is padded to `rows_per_call` with copies of its last prompt
    (`generate`'s pad_rows, dropped): every call runs one compiled program. Without
    row_ids its rows draw as that padded call's first rows.
    Under several processes `prompts` are this process's rows (`generate`), the same
    number on every process, and `rows_per_call` counts rows per process.
    The decode loops' weights (`decode_params`: on CPU and GPU a per-layer copy of stacked
    weights) are made once here for every call, not once per call.
    """
    n = len(prompts)
    row_ids = kw.pop("row_ids", None)
    # 0 (or >= n) means one call with every row.
    chunk = rows_per_call if 0 < rows_per_call < n else n
    longest = max(len(p) for p in prompts)
    if kw.get("mesh") is not None:
        longest = parallel.agree_max(longest)  # one bucket on every process
    bucket = bucket_length(longest, min_bucket)
    loop_params = decode_params(params, cfg)  # one copy for every call
    parts = []
    for i, start in enumerate(range(0, n, chunk)):
        rows = prompts[start:start + chunk]
        parts.append(generate(
            params, cfg, rows,
            key=key if chunk == n or row_ids is not None else jax.random.fold_in(key, i),
            row_ids=None if row_ids is None else row_ids[start:start + chunk],
            min_bucket=bucket, pad_rows=chunk, loop_params=loop_params, **kw))
        if after_call is not None:
            after_call(len(rows))
    return Rollout.concat(parts)
