"""The rollout engine's host loop: `generate_engine` fills free decode slots with pending
rows and drives the device programs of `sampling.engine` (its docstring says how the
engine works).

Axis legend (docs/CONVENTIONS.md): E decode slots, B rows of the rollout, P prompt bucket,
N max new tokens, V vocab, W = ceil(V / 32) bitmask words.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax import models, parallel
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling import engine
from drubric_jax.sampling.buckets import bucket_length, left_pad
from drubric_jax.sampling.constrained import bitmask_words
from drubric_jax.sampling.decode import decode_params
from drubric_jax.sampling.methods import Greedy, Method
from drubric_jax.types import Rollout


SAMPLERS = ("static", "engine")


def check_sampler(sampler: str) -> str:
    """`sampler` if it names one of SAMPLERS.

    Raises:
        ValueError: it does not.
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    return sampler


def slot_count(micro_batch: int, rows: int, shards: int) -> int:
    """E for a rollout of `rows` rows: `micro_batch` rows decoding at once (0 = every row, as
    the static sampler's micro-batch), rounded up to a multiple of `shards` (the mesh's
    data x fsdp) so the slots split evenly. The memory planner sizes E with it."""
    e = micro_batch if 0 < micro_batch < rows else rows
    return shards * -(-e // shards)


def engine_slots(micro_batch: int, rows: int, mesh=None) -> int:
    """`slot_count` on `mesh`'s row shards (1 without a mesh) for `rows`, this process's
    rows: under several processes (each holding as many) the rollout has rows x the
    process count, and `micro_batch` counts rows of the whole rollout."""
    if mesh is None:
        return slot_count(micro_batch, rows, 1)
    return slot_count(micro_batch, rows * jax.process_count(), parallel.row_shards(mesh))


def _gather_rows(prompts, row_ids) -> tuple:
    """Every process's rows in process order: (prompts, row ids or None, this process's
    slice of them). One process: the rows as given. A collective under several."""
    if jax.process_count() == 1:
        return list(prompts), row_ids, slice(0, len(prompts))
    lengths = np.array([len(p) for p in prompts], np.int64)
    tokens = np.zeros((len(prompts), int(lengths.max())), np.int64)
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = p
    blocks = parallel.gather_ragged(tokens)
    sizes = parallel.gather_ragged(lengths)
    rows = [[int(t) for t in row[:n]] for block, ns in zip(blocks, sizes)
            for row, n in zip(block, ns)]
    start = sum(len(ns) for ns in sizes[:jax.process_index()])
    ids = (None if row_ids is None else
           [int(i) for block in parallel.gather_ragged(np.asarray(row_ids, np.int64))
            for i in block])
    return rows, ids, slice(start, start + len(prompts))


def generate_engine(params, cfg: ModelConfig, prompts: Sequence[Sequence[int]], *,
                    key: jax.Array, max_new_tokens: int, num_slots: int,
                    stop_ids: Sequence[int], method: Method = Greedy(),
                    pad_id: Optional[int] = None, row_ids: Optional[Sequence[int]] = None,
                    min_bucket: int = 16, steps_per_call: int = 64,
                    stats: Optional[dict] = None, mesh=None, constraint=None,
                    allow_invalid: bool = False, on_row_end=None) -> Rollout:
    """Samples continuations of B token-id prompts with the engine (module docstring).

    Consecutive rows with the same prompt (a prompt's K samples) share one prefill.

    Args:
        params, cfg: the model (stacked params; the decode copy is made here, once).
        prompts: B lists of token ids, each non-empty.
        key: PRNG key.  max_new_tokens: N.  method: Greedy / Temperature / TopK / TopP.
        num_slots: E, rows decoding at once (the KV cache holds E x (P_max + N) positions).
        stop_ids: ids that end a row.  pad_id: filler after the stop (default stop_ids[0]).
        row_ids: B distinct ids >= 0 of the rows' draws (default 0..B-1): row b's tokens
            are those `generate(..., row_ids=...)` gives it, up to float rounding of the
            attention sums (its keys sit in other cache positions).
        min_bucket: smallest prompt bucket.
        steps_per_call: most decode steps one device call runs before the host looks.
        stats: optional dict, filled with "prefills" (prompt prefills run), "inserts",
            "calls" (decode calls) and "steps" (decode steps run).
        mesh: optional mesh (params on it, `models.param_shardings`): the slots split over
            ("data", "fsdp"), the KV heads over "tensor" (`state_shardings`). Under several
            processes each passes its own rows (as to `generate`) and gets them back: the
            rows are gathered (process order), every process runs the same host loop over
            all of them (the same inserts, the live flags gathered after each call, every
            slot's matcher under a constraint), and the outputs are read from their
            replicated copy.
        constraint: optional host-side constraint, one matcher per slot: the contract of
            `constrained.decode` (`reset(E)`, `fill`, `finished`, `advance` over the E
            slots) plus `reset_rows(slots)`, fresh matchers for the slots given (a row was
            inserted there). The engine then runs one step a device call.
        allow_invalid: return rows that met a step with no allowed token (flagged in
            `invalid`) instead of raising.
        on_row_end: optional `f(row, slot)`, called when row `row` (its index in `prompts`)
            has ended in slot `slot`, before the slot takes another row (e.g. to read the
            slot's constraint state, `constraint.finished()[slot]`).

    Returns:
        Rollout of the B rows in the order given (host numpy), with the prompts left-padded
        to the bucket of the longest, as `generate` returns them.

    Raises:
        ValueError: no prompts, an empty prompt, empty stop_ids, num_slots < 1,
            steps_per_call < 1, row_ids not one id >= 0 per prompt; on a mesh, num_slots
            not a multiple of data x fsdp; several processes without a mesh; a row (of any
            process) had no allowed token and allow_invalid is False.
    """
    if mesh is None and jax.process_count() > 1:
        raise ValueError("the rollout engine under several processes needs the mesh")
    if mesh is not None:
        if num_slots % parallel.row_shards(mesh):
            raise ValueError(f"num_slots ({num_slots}) must be a multiple of data x fsdp "
                             f"({parallel.row_shards(mesh)})")
    stop = np.asarray(list(stop_ids), np.int32)
    if stop.size == 0:
        raise ValueError("stop_ids must not be empty")
    if not prompts or min(len(p) for p in prompts) == 0:
        raise ValueError("generate_engine needs prompts, each with at least one token")
    if num_slots < 1 or steps_per_call < 1:
        raise ValueError(f"num_slots ({num_slots}) and steps_per_call ({steps_per_call}) "
                         "must be >= 1")
    if row_ids is not None and (len(row_ids) != len(prompts) or min(row_ids) < 0):
        raise ValueError(f"row_ids must give one id >= 0 per prompt: {len(row_ids)} ids for "
                         f"{len(prompts)} prompts")
    own = len(prompts)
    # Under several processes: every process's rows; `mine` is this process's slice.
    prompts, row_ids, mine = _gather_rows(prompts, row_ids)
    b = len(prompts)
    ids = list(range(b)) if row_ids is None else [int(i) for i in row_ids]
    pad = int(stop[0] if pad_id is None else pad_id)
    p_max = bucket_length(max(len(p) for p in prompts), min_bucket)
    loop_params = decode_params(params, cfg)
    state = engine.init_state(cfg, num_slots, p_max + max_new_tokens, b, max_new_tokens, key,
                              mesh, per_layer=models.is_per_layer(loop_params))
    stop_arr = jnp.asarray(stop)
    counts = {"prefills": 0, "inserts": 0, "calls": 0, "steps": 0}
    free = list(range(num_slots))
    slot_row = np.zeros(num_slots, np.int64)  # the row each slot decodes
    live = np.zeros(num_slots, bool)
    stored, stored_prompt = None, None
    nxt = 0
    if constraint is not None:
        constraint.reset(num_slots)  # one matcher a slot, renewed when a row is inserted
        # -1 sets every bit: a slot's words are written by a fill before its row samples.
        words = np.full((num_slots, bitmask_words(cfg.vocab_size)), -1, np.int32)
        put = (jnp.asarray if mesh is None else functools.partial(
            parallel.put, target=parallel.batch_sharding(mesh)))
    while nxt < b or live.any():
        while free and nxt < b:
            prompt = tuple(prompts[nxt])
            if prompt != stored_prompt:  # a new prompt: its one prefill
                length = bucket_length(len(prompt), min_bucket)
                tokens, mask = left_pad([prompt], length, pad)
                stored = engine.prefill_prompt(params, cfg, jnp.asarray(tokens),
                                               jnp.asarray(mask), p_max)
                stored_prompt = prompt
                counts["prefills"] += 1
            slot = free.pop(0)
            slot_row[slot] = nxt
            state = engine.insert(state, stored, jnp.int32(slot), jnp.int32(nxt),
                                  jnp.int32(ids[nxt]))
            if constraint is not None:
                constraint.reset_rows([slot])
            live[slot] = True
            counts["inserts"] += 1
            nxt += 1
        if constraint is None:
            state, steps = engine.decode_steps(loop_params, cfg, state, method, stop_arr,
                                               pad, steps_per_call, jnp.asarray(nxt < b))
            # One host transfer a call: the step count and the E live flags together
            # (gathered from every process's slots under several).
            steps, now = parallel.fetch((steps, state.live))
            counts["calls"] += 1
            counts["steps"] += int(steps)
            now = np.array(now)
        else:
            # One step a call: the host fills the live slots' masks (while the device runs
            # the previous forward), then feeds each slot's token to its matcher.
            constraint.fill(words, live)
            state, tok, emitted, freed = engine.sample_step(
                state, put(words), put(constraint.finished()), method, stop_arr, pad)
            state = engine.forward_step(loop_params, cfg, state, tok, emitted)
            tok, emitted, freed = parallel.fetch((tok, emitted, freed))
            constraint.advance(tok, emitted)
            counts["calls"] += 1
            counts["steps"] += 1
            now = live & ~freed
        ended = [int(s) for s in np.flatnonzero(live & ~now)]
        if on_row_end is not None:  # this process's rows, by their index in its prompts
            for slot in ended:
                if mine.start <= slot_row[slot] < mine.stop:
                    on_row_end(int(slot_row[slot]) - mine.start, slot)
        free += ended
        live = now
    # Replicated on every device: each process reads its own copy.
    tokens, logprobs, mask, done, invalid = parallel.fetch(
        (state.tokens, state.logprobs, state.mask, state.done, state.invalid))
    if stats is not None:
        stats.update(counts)
    if invalid.any() and not allow_invalid:
        bad = np.flatnonzero(invalid).tolist()
        raise ValueError(f"rows {bad} reached a step with no allowed token (all logits -inf)")
    tokens, logprobs, mask, done, invalid = (x[mine] for x in (tokens, logprobs, mask, done,
                                                                invalid))
    prompt_tokens, prompt_mask = left_pad(prompts[mine], p_max, pad)
    b = own
    return Rollout(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask,
                   tokens=np.where(mask, tokens, pad).astype(np.int32),
                   logprobs=np.asarray(logprobs), mask=np.asarray(mask),
                   lengths=mask.sum(-1).astype(np.int32), truncated=~done,
                   invalid=np.asarray(invalid), group_ids=np.arange(b, dtype=np.int32))


def generate_constrained(sampler: str, params, cfg: ModelConfig, prompts, rows_per_call: int,
                         cache_segments: int, *, constraint, **kw) -> tuple:
    """Constrained rows by `sampler`: "static" (`generate.generate_chunked`, rows_per_call
    rows a call) or "engine" (`generate_engine`, rows_per_call slots), with each row's
    grammar state at its end (the rubric generator's parser reads it).

    Args:
        constraint: the host-side constraint (`constrained.JsonSchemaConstraint`).
        kw: the samplers' other arguments (key, max_new_tokens, method, stop_ids, ...).

    Returns:
        (Rollout, grammar_done bool[R]: the row's `constraint.finished()` when it ended:
        read after each static call, or as the row ends in its engine slot).

    Raises:
        ValueError: an unknown sampler, or as the sampler raises.
    """
    from drubric_jax.sampling.generate import generate_chunked

    if sampler == "engine":
        grammar_done = np.zeros(len(prompts), bool)

        def row_end(row, slot):
            grammar_done[row] = constraint.finished()[slot]

        slots = engine_slots(rows_per_call, len(prompts), kw.get("mesh"))
        out = generate_engine(params, cfg, prompts, num_slots=slots, constraint=constraint,
                              on_row_end=row_end, **kw)
        return out, grammar_done
    check_sampler(sampler)
    done = []  # one finished() array per sampler call, in row order
    # A call's first rows are its prompts; filler rows after them (the padded last call,
    # the mesh's row shards) are dropped from the rollout and here.
    out = generate_chunked(params, cfg, prompts, rows_per_call, constraint=constraint,
                           cache_segments=cache_segments,
                           after_call=lambda rows: done.append(constraint.finished()[:rows]),
                           **kw)
    return out, np.concatenate(done)
