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
from drubric_jax.models import paged
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling import engine
from drubric_jax.sampling.engine_pages import PrefixPages, default_prefix_pages  # noqa: F401
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
                    allow_invalid: bool = False, on_row_end=None,
                    page_size: int = engine.PAGE_SIZE,
                    prefix_pages: Optional[int] = None, attention: str = "auto") -> Rollout:
    """Samples continuations of B token-id prompts with the engine (`sampling.engine`).

    Consecutive rows with the same prompt (a prompt's K samples) share one prefill and, on
    each row shard, one stored copy of the prompt's pages.

    Args:
        params, cfg: the model (stacked params; the decode copy is made here, once).
        prompts: B lists of token ids, each non-empty.
        key: PRNG key.  max_new_tokens: N.  method: Greedy / Temperature / TopK / TopP.
        num_slots: E, rows decoding at once (each holds ceil((Ps - 1 + N) / Ps) pages of
            its own; prompts' pages come from the prefix pages).
        stop_ids: ids that end a row.  pad_id: filler after the stop (default stop_ids[0]).
        row_ids: B distinct ids >= 0 of the rows' draws (default 0..B-1): row b's tokens
            are those `generate(..., row_ids=...)` gives it, up to float rounding of the
            attention sums.
        min_bucket: smallest prompt bucket.
        steps_per_call: most decode steps one device call runs before the host looks.
        stats: optional dict, filled with "prefills" (prompt prefills run), "stores"
            (prompts written to a shard's pages), "inserts", "calls" (decode calls),
            "steps" (decode steps run), "waits" (times a free slot waited for prefix
            pages), "read_pages" ({table columns read: decode calls}, `engine.read_bucket`),
            "prefix_pages_peak" (most prefix pages a shard held at once),
            "pool_pages" (the pool's pages, all shards) and "page_size".
        mesh: optional mesh (params on it, `models.param_shardings`): the slots and the
            pool's pages split over ("data", "fsdp"), the KV heads over "tensor"
            (`engine.state_shardings`). Under several processes each passes its own rows
            (as to `generate`) and gets them back: the rows are gathered (process order),
            every process runs the same host loop over all of them, and the outputs are
            read from their replicated copy.
        constraint: optional host-side constraint, one matcher per slot: the contract of
            `constrained.decode` (`reset(E)`, `fill`, `finished`, `advance` over the E
            slots) plus `reset_rows(slots)`, fresh matchers for the slots given (a row was
            inserted there). The engine then runs one step a device call.
        allow_invalid: return rows that met a step with no allowed token (flagged in
            `invalid`) instead of raising.
        on_row_end: optional `f(row, slot)`, called when row `row` (its index in `prompts`)
            has ended in slot `slot`, before the slot takes another row.
        page_size: Ps, tokens a page.
        prefix_pages: pages per row shard lent to prompts (None: `default_prefix_pages`).
            Fewer save memory; a free slot then waits while the pages are held by other
            prompts' live rows.
        attention: the paged attention's implementation (`models.paged.IMPLS`).

    Returns:
        Rollout of the B rows in the order given (host numpy), with the prompts left-padded
        to the bucket of the longest, as `generate` returns them.

    Raises:
        ValueError: no prompts, an empty prompt, empty stop_ids, num_slots < 1,
            steps_per_call < 1, row_ids not one id >= 0 per prompt; on a mesh, num_slots
            not a multiple of data x fsdp; several processes without a mesh; prefix pages
            too few for the longest prompt; a row (of any process) had no allowed token
            and allow_invalid is False.
    """
    if mesh is None and jax.process_count() > 1:
        raise ValueError("the rollout engine under several processes needs the mesh")
    shards = 1 if mesh is None else parallel.row_shards(mesh)
    if num_slots % shards:
        raise ValueError(f"num_slots ({num_slots}) must be a multiple of data x fsdp "
                         f"({shards})")
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
    # The prompt each row decodes from: consecutive equal prompts are one.
    first_row, prompt_of = {}, []
    for r, p in enumerate(prompts):
        if r == 0 or tuple(p) != tuple(prompts[r - 1]):
            first_row[len(first_row)] = r
        prompt_of.append(len(first_row) - 1)
    last_row = {q: r for r, q in enumerate(prompt_of)}
    if prefix_pages is None:
        prefix_pages = default_prefix_pages(num_slots, shards, b, len(first_row), p_max,
                                            page_size)
    plan = engine.PagePlan(slots=num_slots, shards=shards, page_size=page_size,
                           max_new_tokens=max_new_tokens, max_prompt=p_max,
                           prefix_pages=prefix_pages)
    longest = paged.pages_for(max(len(p) for p in prompts), page_size)
    if prefix_pages < longest:
        raise ValueError(f"prefix_pages ({prefix_pages}) cannot hold the longest prompt "
                         f"({longest} pages of {page_size})")
    loop_params = decode_params(params, cfg)
    with parallel.rows_on(mesh):
        state = engine.init_state(cfg, plan, b, max_new_tokens, key, mesh,
                                  per_layer=models.is_per_layer(loop_params), impl=attention)
    stop_arr = jnp.asarray(stop)
    counts = {"prefills": 0, "stores": 0, "inserts": 0, "calls": 0, "steps": 0, "waits": 0,
              "read_pages": {}}
    per_call = 1 if constraint is not None else steps_per_call
    n_new = max_new_tokens
    row_len = np.zeros(num_slots, np.int64)   # each slot's prompt length
    started = np.zeros(num_slots, np.int64)   # the step count when its row started
    ledger = PrefixPages(plan)
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
    with parallel.rows_on(mesh):
        while nxt < b or live.any():
            while free and nxt < b:
                prompt = prompt_of[nxt]
                length = len(prompts[nxt])
                need = paged.pages_for(length, page_size)
                # A free slot on a shard that holds the prompt, else on one with room.
                slot = next((s for s in free if ledger.stored(plan.shard_of(s), prompt)),
                            None)
                if slot is None:
                    slot = next((s for s in free
                                 if ledger.can_store(plan.shard_of(s), need)), None)
                if slot is None:  # every free slot's shard lends its pages: wait
                    if not live.any():
                        raise ValueError(f"prefix_pages ({prefix_pages}) cannot hold prompt "
                                         f"{prompt} ({need} pages) with nothing decoding")
                    counts["waits"] += 1
                    break
                shard = plan.shard_of(slot)
                if prompt != stored_prompt:  # a new prompt: its one prefill
                    bucket = bucket_length(length, min_bucket)
                    tokens, mask = left_pad([prompts[nxt]], bucket, pad)
                    stored = engine.prefill_prompt(params, cfg, jnp.asarray(tokens),
                                                   jnp.asarray(mask), page_size)
                    stored_prompt = prompt
                    counts["prefills"] += 1
                if not ledger.stored(shard, prompt):
                    pages = ledger.store(shard, prompt, need)
                    table = np.full((shards, stored.k.shape[2] // page_size),
                                    paged.SCRATCH_PAGE, np.int32)
                    table[shard, :need] = pages
                    state = engine.store_prefix(state, stored, jnp.asarray(table))
                    counts["stores"] += 1
                prefix = ledger.pages(shard, prompt)
                full, tail = divmod(length, page_size)
                own_pages = plan.own_pages(slot)
                row_table = np.full(plan.table_pages, paged.SCRATCH_PAGE, np.int32)
                row_table[:full] = prefix[:full]
                row_table[full:full + plan.own] = own_pages
                copy = np.full((shards, 2), paged.SCRATCH_PAGE, np.int32)
                if tail:  # the prompt's partial last page continues in the slot's own
                    copy[shard] = (prefix[full], own_pages[0])
                ledger.add_row(shard, prompt)
                free.remove(slot)
                slot_row[slot] = nxt
                state = engine.insert(state, jnp.int32(slot), jnp.asarray(row_table),
                                      jnp.int32(length), jnp.asarray(copy), stored.logits,
                                      jnp.int32(nxt), jnp.int32(ids[nxt]))
                if constraint is not None:
                    constraint.reset_rows([slot])
                live[slot] = True
                row_len[slot], started[slot] = length, counts["steps"]
                counts["inserts"] += 1
                nxt += 1
                if last_row[prompt] < nxt:  # its rows are all placed: free idle copies
                    for d in range(shards):
                        ledger.release_idle(d, prompt)
            # The longest a live row can get in this call: its tokens so far (at most its
            # prompt + the steps run since it started) + the call's steps, at most P + N.
            run = counts["steps"]
            longest = max(min(row_len[s] + run - started[s] + per_call, row_len[s] + n_new)
                          for s in np.flatnonzero(live))
            read = engine.read_bucket(longest, page_size, plan.table_pages)
            counts["read_pages"][read] = counts["read_pages"].get(read, 0) + 1
            if constraint is None:
                state, steps = engine.decode_steps(loop_params, cfg, state, method, stop_arr,
                                                   pad, steps_per_call, jnp.asarray(nxt < b),
                                                   read)
                # One host transfer a call: the step count and the E live flags together
                # (gathered from every process's slots under several).
                steps, now = parallel.fetch((steps, state.live))
                counts["calls"] += 1
                counts["steps"] += int(steps)
                now = np.array(now)
            else:
                # One step a call: the host fills the live slots' masks (while the device
                # runs the previous forward), then feeds each slot's token to its matcher.
                constraint.fill(words, live)
                state, tok, emitted, freed = engine.sample_step(
                    state, put(words), put(constraint.finished()), method, stop_arr, pad)
                state = engine.forward_step(loop_params, cfg, state, tok, emitted, read)
                tok, emitted, freed = parallel.fetch((tok, emitted, freed))
                constraint.advance(tok, emitted)
                counts["calls"] += 1
                counts["steps"] += 1
                now = live & ~freed
            ended = [int(s) for s in np.flatnonzero(live & ~now)]
            for slot in ended:
                row = int(slot_row[slot])
                if on_row_end is not None and mine.start <= row < mine.stop:
                    on_row_end(row - mine.start, slot)  # this process's row index
                ledger.end_row(plan.shard_of(slot), prompt_of[row],
                               waiting=last_row[prompt_of[row]] >= nxt)
            free += ended
            live = now
    # Replicated on every device: each process reads its own copy.
    tokens, logprobs, mask, done, invalid = parallel.fetch(
        (state.tokens, state.logprobs, state.mask, state.done, state.invalid))
    if stats is not None:
        stats.update(counts, prefix_pages_peak=ledger.peak, page_size=page_size,
                     pool_pages=shards * plan.pages_per_shard)
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
