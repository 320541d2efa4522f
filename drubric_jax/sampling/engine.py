"""The rollout engine: continuous batching over E decode slots on a paged KV cache.

`generate` decodes a static batch: every row of a call waits for the call's longest row.
The engine keeps E rows decoding at once; when a row stops (a stop id, or its N tokens),
its slot takes the next pending row at once, so a step's work goes to rows still writing.

The cache is paged (`models.paged`): every layer's keys and values sit in one pool of
pages, each slot has a page table and a live length, and a decode step reads a slot's
live pages only (JAX's Pallas paged-attention kernels on GPU and TPU; XLA on CPU). So:
- **A prompt is stored once.** It is prefilled once (its bucket's program) and its keys
  written to prefix pages (`store_prefix`); each of its rows (a prompt's K samples, the G
  lists of a generator input) lists those pages first in its table and holds only its own
  pages: the prompt's partial last page, copied, and room for its N new tokens.
- **A slot turns over without a recompile:** `insert` writes the slot's table, length,
  next-token logits and output row (one program for every slot, row and bucket).
- **Memory counts suffixes.** A slot's own pages are fixed (`PagePlan`); prefix pages are
  lent to prompts by the host (`engine_host`) while a row of theirs is live, so the pool
  holds E suffixes plus the prefixes of the prompts being decoded, not E copies of P_max.
- Each row draws its step-t token from fold_in(fold_in(key, t), row_id), the key
  `generate` gives row `row_id` at its step t, so a row's tokens do not depend on the slot
  or on the rows around it. Its log-prob comes from the draw's own normalisation.
- The device runs up to `steps_per_call` steps a call, and returns early when a slot frees
  while rows wait; the host then reads E flags and inserts. Tokens go straight into the
  [B, N] output on the device (row `out_row`), fetched once at the end.

Programs: one decode program for (E, pool, B, N, method) (or, under a constraint, a sample
and a forward program), one insert program, one prefix store per prompt bucket and one
prefill per prompt bucket. The host loop that drives them is `engine_host.generate_engine`.

Under a host-side constraint (llguidance's JSON schema) each slot has its own matcher,
renewed when a row is inserted, and the engine runs one step a call: the host fills the
next masks while the device runs the forward (as `constrained.decode`).

On a mesh the slots split over ("data", "fsdp") (R row shards) and so does the pool: shard
d holds its slots' pages, its own scratch page and its own prefix pages (tables hold page
ids local to the shard), and the step's cache write and attention run per shard
(`paged.step_attention`, a shard_map); the KV heads split over "tensor". A prompt whose
rows land on several shards is stored once on each. Under several processes each
process's host runs the same loop over all the rows (`engine_host.generate_engine`).
The memory planner counts the engine's programs (`memory.inference_terms.engine_terms`,
compiled in `memory.compiled_engine.engine_peaks`).

Axis legend (docs/CONVENTIONS.md): E decode slots, B rows of the rollout (prompts x their
samples), P prompt bucket, N max new tokens, V vocab, R row shards, Ps tokens a page, Pt
pages a table, Pp pages of a prompt bucket.
"""
from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from jax.sharding import NamedSharding, PartitionSpec

from drubric_jax import models, parallel
from drubric_jax.models import paged
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling.constrained import unpack_bitmask
from drubric_jax.sampling.engine_pages import PAGE_SIZE, PagePlan  # noqa: F401
from drubric_jax.sampling.methods import Method, sample_logits



@flax.struct.dataclass
class PromptKV:
    """One prefilled prompt, its real tokens first (the engine's store before paging).

    Attributes:
        k, v: [L, Hkv, Pp * Ps, Dh] keys (RoPE applied) and values, compute dtype; token j
            of the prompt at position j, zeros after its length.
        length: int32[] real tokens of the prompt.
        logits: float32[V] next-token logits after the prompt.
    """

    k: jax.Array
    v: jax.Array
    length: jax.Array
    logits: jax.Array


@flax.struct.dataclass
class EngineState:
    """The engine's device state.

    Attributes:
        cache: `paged.PagedKV` of E slots (tables int32[E, Pt], lengths int32[E]: a
            slot's next token's position too) over pools of R x Np_l pages, in the decode
            form (`models.decode_per_layer`: per-layer tuples or stacked).
        logits: float32[E, V] each slot's next-token logits.
        steps: int32[E] tokens the slot's row has made.
        live: bool[E] the slot holds a row still writing.
        out_rows: int32[E] the output row of each slot's row.
        draw_ids: int32[E] the row id of its draws (`sample_logits` row_ids).
        tokens, logprobs, mask: [B, N] the rollout's outputs, filled as rows write.
        done: bool[B] the row ended on a stop id (else it reached N: truncated).
        invalid: bool[B] the row met a step with no valid logit.
        key: the rollout's PRNG key.
    """

    cache: paged.PagedKV
    logits: jax.Array
    steps: jax.Array
    live: jax.Array
    out_rows: jax.Array
    draw_ids: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array
    done: jax.Array
    invalid: jax.Array
    key: jax.Array


@functools.partial(jax.jit, static_argnames=("cfg", "page_size"))
def prefill_prompt(params, cfg: ModelConfig, tokens: jax.Array, token_mask: jax.Array,
                   page_size: int = PAGE_SIZE) -> PromptKV:
    """Prefills one left-padded prompt (one program per bucket P) into the store's form.

    Args:
        params: stacked model params.  cfg: static model config.
        tokens: int32[1, P] left-padded prompt.  token_mask: bool[1, P].
        page_size: Ps; the store holds Pp = ceil(P / Ps) pages' positions.

    Returns:
        PromptKV with the prompt's real tokens at positions [0, length).
    """
    p = tokens.shape[1]
    positions = models.positions_from_mask(token_mask)
    hidden, cache = models.forward_hidden(params, cfg, tokens, positions, token_mask,
                                          models.init_cache(cfg, 1, p))
    length = jnp.sum(token_mask[0]).astype(jnp.int32)
    room = paged.pages_for(p, page_size) * page_size

    def stored(x):  # [L, 1, Hkv, P, Dh] -> [L, Hkv, Pp * Ps, Dh], the padding moved last
        x = jnp.roll(x[:, 0], length - p, axis=2)
        x = jnp.where(jnp.arange(p)[:, None] < length, x, 0)
        return jnp.pad(x, ((0, 0), (0, 0), (0, room - p), (0, 0)))

    return PromptKV(k=stored(cache.k), v=stored(cache.v), length=length,
                    logits=models.logits_from_hidden(params, cfg, hidden[0, -1]))


def _heads_axis(cfg: ModelConfig, mesh) -> str | None:
    return "tensor" if cfg.num_kv_heads % mesh.shape["tensor"] == 0 else None


def state_shardings(state: EngineState, cfg: ModelConfig, mesh) -> EngineState:
    """The engine state's layout on `mesh`: slots over ("data", "fsdp") as `generate`'s
    rows, the pools' pages over the same axes (each shard its slots' pages) and their KV
    heads over "tensor" (when they divide), the [B, N] outputs and the key replicated (a
    slot writes any output row)."""
    rows = parallel.batch_sharding(mesh)
    heads = _heads_axis(cfg, mesh)
    every = NamedSharding(mesh, PartitionSpec())

    def pool(x):  # [Hkv, Np, Ps, Dh] a layer, or [L, Hkv, Np, Ps, Dh]
        lead = (None,) * (x.ndim - 4)
        return NamedSharding(mesh, PartitionSpec(*lead, heads, parallel.BATCH_AXES))

    cache = state.cache.replace(k=jax.tree.map(pool, state.cache.k),
                                v=jax.tree.map(pool, state.cache.v), tables=rows,
                                lengths=rows)
    return state.replace(cache=cache, logits=rows, steps=rows, live=rows, out_rows=rows,
                         draw_ids=rows, tokens=every, logprobs=every, mask=every,
                         done=every, invalid=every, key=every)


def init_state(cfg: ModelConfig, plan: PagePlan, num_rows: int, max_new_tokens: int,
               key: jax.Array, mesh=None, per_layer: bool | None = None,
               impl: str = "auto") -> EngineState:
    """An engine with `plan`'s E empty slots and R x Np_l zero pages, and a zero
    [B = `num_rows`, N] output; on `mesh` laid out as `state_shardings` says (made there by
    one program, each device writing its own shard). The pools are in the form of the
    decode weights: per-layer when `per_layer` (None: `models.decode_per_layer(cfg)`),
    else stacked. `impl`: the paged attention's (`paged.IMPLS`)."""
    per_layer = models.decode_per_layer(cfg) if per_layer is None else per_layer
    make = functools.partial(_new_state, cfg, plan, num_rows, max_new_tokens, per_layer,
                             impl)
    if mesh is None:
        return make(key)
    shardings = state_shardings(jax.eval_shape(make, key), cfg, mesh)
    return jax.jit(make, out_shardings=shardings)(key)


def _new_state(cfg: ModelConfig, plan: PagePlan, b: int, n: int, per_layer: bool, impl: str,
               key: jax.Array) -> EngineState:
    e = plan.slots
    k, v = paged.init_pool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                           plan.shards * plan.pages_per_shard, plan.page_size,
                           cfg.compute_dtype, per_layer)
    cache = paged.PagedKV(k=k, v=v, tables=jnp.zeros((e, plan.table_pages), jnp.int32),
                          lengths=jnp.zeros((e,), jnp.int32), impl=impl,
                          shards=plan.shards)
    return EngineState(
        cache=cache, logits=jnp.zeros((e, cfg.vocab_size), jnp.float32),
        steps=jnp.zeros((e,), jnp.int32), live=jnp.zeros((e,), bool),
        out_rows=jnp.zeros((e,), jnp.int32), draw_ids=jnp.zeros((e,), jnp.int32),
        tokens=jnp.zeros((b, n), jnp.int32), logprobs=jnp.zeros((b, n), jnp.float32),
        mask=jnp.zeros((b, n), bool), done=jnp.zeros((b,), bool),
        invalid=jnp.zeros((b,), bool),
        key=jnp.array(key, copy=True))  # a copy: the decode calls donate the state


def _map_pools(cache: paged.PagedKV, fn):
    """(k, v) with fn(layer_pool, layer_index, which) applied to every layer's pool; a
    stacked pool is updated a layer at a time in place (its buffer donated), not rebuilt."""
    def each(pools, which):
        if isinstance(pools, tuple):
            return tuple(fn(x, i, which) for i, x in enumerate(pools))
        for i in range(pools.shape[0]):
            pools = pools.at[i].set(fn(pools[i], i, which))
        return pools
    return each(cache.k, 0), each(cache.v, 1)


@functools.partial(jax.jit, donate_argnums=(0,))
def store_prefix(state: EngineState, prompt: PromptKV, pages: jax.Array) -> EngineState:
    """Writes a prompt's pages into the pool: its page j (positions [j Ps, (j + 1) Ps)) to
    local page pages[d, j] of every row shard d (SCRATCH_PAGE where a shard does not store
    it). One program per prompt bucket.

    Args:
        state: donated.  prompt: `prefill_prompt`'s.  pages: int32[R, Pp].
    """
    ps = state.cache.page_size
    pp = pages.shape[1]

    def write(pool, i, which):  # pool [Hkv, Np, Ps, Dh] (all shards' pages)
        x = (prompt.k if which == 0 else prompt.v)[i]
        x = x.reshape(x.shape[0], pp, ps, x.shape[-1]).astype(pool.dtype)
        return paged.write_pages(pool, x, pages)

    k, v = _map_pools(state.cache, write)
    return state.replace(cache=state.cache.replace(k=k, v=v))


@functools.partial(jax.jit, donate_argnums=(0,))
def insert(state: EngineState, slot: jax.Array, table: jax.Array, length: jax.Array,
           copy: jax.Array, logits: jax.Array, out_row: jax.Array,
           draw_id: jax.Array) -> EngineState:
    """Starts a row in `slot` (int32[]): its page table `table` (int32[Pt], local page ids:
    the prompt's full pages, then the slot's own), its live length `length` (the prompt's
    tokens), the prompt's partial last page copied within each shard as `copy`
    (int32[R, 2]: source and destination page, SCRATCH_PAGE twice on the other shards),
    its next-token logits float32[V], output row `out_row` and draw id `draw_id`. One
    program, whatever the slot, row or bucket.

    Returns:
        The state (donated buffers reused) with the slot live at step 0.
    """
    def copied(pool, i, which):
        return paged.copy_pages(pool, copy)

    k, v = _map_pools(state.cache, copied)
    cache = state.cache.replace(
        k=k, v=v, tables=jax.lax.dynamic_update_slice(state.cache.tables, table[None],
                                                      (slot, 0)),
        lengths=state.cache.lengths.at[slot].set(length))
    return state.replace(
        cache=cache, logits=state.logits.at[slot].set(logits),
        steps=state.steps.at[slot].set(0), live=state.live.at[slot].set(True),
        out_rows=state.out_rows.at[slot].set(out_row),
        draw_ids=state.draw_ids.at[slot].set(draw_id))


def _sample_rows(state: EngineState, method: Method, stop_ids, pad_id: int, allowed=None,
                 force_stop=None) -> tuple:
    """The sampling half of a step: one token for every live slot, recorded in its output
    row; a slot whose row ends is freed.

    Args:
        allowed: None, or bool[E, V] the tokens each slot's constraint allows.
        force_stop: None, or bool[E] slots whose constraint is complete: they emit
            stop_ids[0].

    Returns:
        (state, tok int32[E], emitted bool[E], freed bool[E]: slots whose row ended).
    """
    b, n = state.tokens.shape
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(state.key, state.steps)
    logits = state.logits if allowed is None else jnp.where(allowed, state.logits, -jnp.inf)
    # A constrained token is scored under the unconstrained logits (METHOD 11); a complete
    # constraint ends its row with stop_ids[0]. One log-softmax a step either way.
    tok, logp, bad = sample_logits(
        keys, logits, method, state.draw_ids,
        score_logits=None if allowed is None else state.logits,
        forced=None if force_stop is None else jnp.where(force_stop, stop_ids[0], -1))
    live = state.live
    emitted = live & ~bad
    tok = jnp.where(emitted, tok, pad_id)
    ended = live & (jnp.isin(tok, stop_ids) | bad)
    freed = ended | (live & (state.steps + 1 >= n))
    # Rows of empty slots write to row B: dropped.
    rows = jnp.where(live, state.out_rows, b)
    steps = jnp.minimum(state.steps, n - 1)
    state = state.replace(
        steps=state.steps + live, live=live & ~freed,
        tokens=state.tokens.at[rows, steps].set(tok, mode="drop"),
        logprobs=state.logprobs.at[rows, steps].set(jnp.where(emitted, logp, 0.0),
                                                    mode="drop"),
        mask=state.mask.at[rows, steps].set(emitted, mode="drop"),
        # A row's last write is at the step it ends (its slot is then not live).
        done=state.done.at[rows].set(ended, mode="drop"),
        invalid=state.invalid.at[rows].set(live & bad, mode="drop"))
    return state, tok, emitted, freed


def _forward_rows(params, cfg: ModelConfig, state: EngineState, tok: jax.Array,
                  emitted: jax.Array, read_pages: int = 0) -> EngineState:
    """The model half of a step: every slot's token `tok: int32[E]` through the model (a slot
    that did not emit writes the scratch page and keeps its length), the next logits
    stored. `read_pages` (static, 0: all): the table columns a step reads, which the host
    keeps above every live slot's length (`read_bucket`), so on every backend a step
    reads the pages of the longest live row's bucket, not the table's Pt."""
    cache = state.cache
    if read_pages:
        cache = cache.replace(tables=cache.tables[:, :read_pages])
    # A slot's next position is its live length (no padding in a paged slot).
    hidden, cache = models.forward_hidden(params, cfg, tok[:, None], cache.lengths[:, None],
                                          emitted[:, None], cache)
    cache = cache.replace(tables=state.cache.tables)
    return state.replace(cache=cache, logits=models.logits_from_hidden(params, cfg,
                                                                       hidden[:, 0]))


def read_bucket(longest: int, page_size: int, table_pages: int) -> int:
    """The table columns a decode call reads when no live slot will pass `longest` tokens
    during it: the pages they fill, rounded up to a power of two (one program each, at most
    log2(Pt) + 1 of them), at most Pt."""
    need = max(paged.pages_for(int(longest), page_size), 1)
    return min(1 << (need - 1).bit_length(), table_pages)


def _step(params, cfg: ModelConfig, state: EngineState, method: Method, stop_ids,
          pad_id: int, read_pages: int) -> tuple[EngineState, jax.Array]:
    """One unconstrained step: (state, freed bool[E])."""
    state, tok, emitted, freed = _sample_rows(state, method, stop_ids, pad_id)
    return _forward_rows(params, cfg, state, tok, emitted, read_pages), freed


# The constrained loop's halves, jitted apart so the host fills the next masks while the
# device runs the forward (as `constrained.decode`); the state is donated to each.
@functools.partial(jax.jit, static_argnames=("method", "pad_id"), donate_argnums=(0,))
def sample_step(state: EngineState, words: jax.Array, force_stop: jax.Array, method: Method,
                stop_ids: jax.Array, pad_id: int) -> tuple:
    """`_sample_rows` under a constraint's packed bitmask `words: int32[E, W]`."""
    allowed = unpack_bitmask(words, state.logits.shape[-1])
    return _sample_rows(state, method, stop_ids, pad_id, allowed, force_stop)


forward_step = jax.jit(_forward_rows, static_argnames=("cfg", "read_pages"),
                       donate_argnums=(2,))


@functools.partial(jax.jit, static_argnames=("cfg", "method", "pad_id", "max_steps",
                                             "read_pages"),
                   donate_argnums=(2,))
def decode_steps(params, cfg: ModelConfig, state: EngineState, method: Method,
                 stop_ids: jax.Array, pad_id: int, max_steps: int,
                 refill: jax.Array, read_pages: int = 0) -> tuple[EngineState, jax.Array]:
    """Runs up to `max_steps` engine steps (`lax.while_loop`); stops early when no slot is
    live, or when `refill` (bool[]: rows are waiting) and a slot has freed.

    Args:
        params: the weights in the decode form (`decode.decode_params`).
        state: donated.  stop_ids: int32[...] ids that end a row.
        read_pages: static, the table columns each step reads (`_forward_rows`; 0: all).

    Returns:
        (state, steps run int32[]).
    """
    def cond(carry):
        s, i, freed = carry
        return (i < max_steps) & jnp.any(s.live) & ~(refill & jnp.any(freed))

    def body(carry):
        s, i, freed = carry
        s, now = _step(params, cfg, s, method, stop_ids, pad_id, read_pages)
        return s, i + 1, freed | now

    e = state.live.shape[0]
    state, steps, _ = jax.lax.while_loop(
        cond, body, (state, jnp.zeros((), jnp.int32), jnp.zeros((e,), bool)))
    return state, steps
