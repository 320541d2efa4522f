"""The rollout engine: continuous batching over E decode slots, one prefill per prompt.

`generate` decodes a static batch: every row of a call waits for the call's longest row.
The engine keeps E rows decoding at once; when a row stops (a stop id, or its N tokens),
its slot takes the next pending row at once, so a step's work goes to rows still writing.

How a slot turns over without a recompile or a per-row cache index:
- The KV cache is a ring of S = P_max + N positions per slot with one write index for
  every slot, as in `generate` (`models.KVCache`). Keys carry their RoPE rotation and
  attention reads a validity mask, so where in the ring a token sits does not change what
  a query attends over.
- A row inserted when the index is i gets its prompt's keys in positions [i - P_max, i)
  (mod S, right-aligned, the bucket's left padding invalid) and writes its new tokens from
  i on: P_max + N positions, so nothing of the row is overwritten while it lives. Every
  other position of the slot is cleared.
- A prompt is prefilled once (its bucket's program) into a one-prompt store; each of its
  rows is then copied from the store into a free slot (one program). Rows are placed in
  order, so only the prompt at the head of the queue can be partly placed: one store.
- Each row draws its step-t token from fold_in(fold_in(key, t), row_id), the key
  `generate` gives row `row_id` at its step t, so a row's tokens do not depend on the slot
  or on the rows around it. Its log-prob comes from the draw's own normalisation.
- The device runs up to `steps_per_call` steps a call, and returns early when a slot frees
  while rows wait; the host then reads E flags and inserts. Tokens go straight into the
  [B, N] output on the device (row `out_row`), fetched once at the end.

Programs: one decode program for (E, S, B, N, method) (or, under a constraint, a sample
and a forward program), one insert program, and one prefill per prompt bucket. The host
loop that drives them is `engine_host.generate_engine`.

Under a host-side constraint (llguidance's JSON schema) each slot has its own matcher,
renewed when a row is inserted, and the engine runs one step a call: the host fills the
next masks while the device runs the forward (as `constrained.decode`).

On a mesh the slots split over ("data", "fsdp") of every process's devices; under several
processes each process's host runs the same loop over all the rows
(`engine_host.generate_engine`).
The memory planner counts the engine's programs (`memory.inference_terms.engine_terms`,
compiled in `memory.compiled.engine_peaks`).

Axis legend (docs/CONVENTIONS.md): E decode slots, B rows of the rollout (prompts x their
samples), P prompt bucket, N max new tokens, S KV-cache slots (positions) of a row, V vocab.
"""
from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from jax.sharding import NamedSharding, PartitionSpec

from drubric_jax import models, parallel
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling.constrained import unpack_bitmask
from drubric_jax.sampling.methods import Method, sample_logits


@flax.struct.dataclass
class PromptKV:
    """One prefilled prompt, right-aligned in P_max positions (the engine's store).

    Attributes:
        k, v: [L, Hkv, P_max, Dh] keys (RoPE applied) and values, compute dtype.
        valid: bool[P_max] real prompt tokens (the bucket's left padding and the positions
            before the bucket are False).
        logits: float32[V] next-token logits after the prompt.
        position: int32[] RoPE position of the first new token.
    """

    k: jax.Array
    v: jax.Array
    valid: jax.Array
    logits: jax.Array
    position: jax.Array


@flax.struct.dataclass
class EngineState:
    """The engine's device state.

    Attributes:
        cache: KVCache of E slots x S positions (a ring; `cache.index` in [0, S)), in the
            decode form (`models.decode_cache`).
        logits: float32[E, V] each slot's next-token logits.
        positions: int32[E] RoPE position of each slot's next token.
        steps: int32[E] tokens the slot's row has made.
        live: bool[E] the slot holds a row still writing.
        out_rows: int32[E] the output row of each slot's row.
        draw_ids: int32[E] the row id of its draws (`sample_logits` row_ids).
        tokens, logprobs, mask: [B, N] the rollout's outputs, filled as rows write.
        done: bool[B] the row ended on a stop id (else it reached N: truncated).
        invalid: bool[B] the row met a step with no valid logit.
        key: the rollout's PRNG key.
    """

    cache: models.KVCache
    logits: jax.Array
    positions: jax.Array
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


@functools.partial(jax.jit, static_argnames=("cfg", "max_prompt"))
def prefill_prompt(params, cfg: ModelConfig, tokens: jax.Array, token_mask: jax.Array,
                   max_prompt: int) -> PromptKV:
    """Prefills one left-padded prompt (one program per bucket P) into the store's form.

    Args:
        params: stacked model params.  cfg: static model config.
        tokens: int32[1, P] left-padded prompt.  token_mask: bool[1, P].
        max_prompt: P_max >= P, the store's positions.

    Returns:
        PromptKV with the prompt's P positions last of P_max.
    """
    p = tokens.shape[1]
    positions = models.positions_from_mask(token_mask)
    hidden, cache = models.forward_hidden(params, cfg, tokens, positions, token_mask,
                                          models.init_cache(cfg, 1, p))
    pad = max_prompt - p

    def stored(x):  # [L, 1, Hkv, P, Dh] -> [L, Hkv, P_max, Dh]
        return jnp.pad(x[:, 0], ((0, 0), (0, 0), (pad, 0), (0, 0)))

    return PromptKV(k=stored(cache.k), v=stored(cache.v),
                    valid=jnp.pad(token_mask[0], (pad, 0)),
                    logits=models.logits_from_hidden(params, cfg, hidden[0, -1]),
                    position=positions[0, -1] + 1)


def state_shardings(state: EngineState, cfg: ModelConfig, mesh) -> EngineState:
    """The engine state's layout on `mesh`: slots over ("data", "fsdp") as `generate`'s
    rows, the cache's KV heads over "tensor" (when they divide), the [B, N] outputs, the
    write index and the key replicated (a slot writes any output row)."""
    rows = parallel.batch_sharding(mesh)
    heads = "tensor" if cfg.num_kv_heads % mesh.shape["tensor"] == 0 else None
    every = NamedSharding(mesh, PartitionSpec())

    def kv(x):  # [E, Hkv, S, Dh] a layer, or [L, E, Hkv, S, Dh]
        lead = (None,) * (x.ndim - 4)
        return NamedSharding(mesh, PartitionSpec(*lead, parallel.BATCH_AXES, heads))

    cache = state.cache.replace(k=jax.tree.map(kv, state.cache.k),
                                v=jax.tree.map(kv, state.cache.v), valid=rows, index=every)
    return state.replace(cache=cache, logits=rows, positions=rows, steps=rows, live=rows,
                         out_rows=rows, draw_ids=rows, tokens=every, logprobs=every,
                         mask=every, done=every, invalid=every, key=every)


def init_state(cfg: ModelConfig, num_slots: int, cache_positions: int, num_rows: int,
               max_new_tokens: int, key: jax.Array, mesh=None,
               per_layer: bool | None = None) -> EngineState:
    """An engine with E = `num_slots` empty slots of S = `cache_positions` positions and a
    zero [B = `num_rows`, N] output; on `mesh` laid out as `state_shardings` says (made
    there by one program, each device writing its own shard: no whole state on one
    device first, and several processes each make their own). The cache is in the form of
    the decode weights: per-layer when `per_layer` (None: `models.decode_per_layer(cfg)`),
    else stacked."""
    per_layer = models.decode_per_layer(cfg) if per_layer is None else per_layer
    make = functools.partial(_new_state, cfg, num_slots, cache_positions, num_rows,
                             max_new_tokens, per_layer)
    if mesh is None:
        return make(key)
    shardings = state_shardings(jax.eval_shape(make, key), cfg, mesh)
    return jax.jit(make, out_shardings=shardings)(key)


def _new_state(cfg: ModelConfig, e: int, cache_positions: int, b: int, n: int,
               per_layer: bool, key: jax.Array) -> EngineState:
    # A ring (`KVCache.ring`), never `empty`: a step attends over every valid position.
    cache = models.decode_cache(models.init_cache(cfg, e, cache_positions),
                                per_layer).replace(empty=False, ring=True)
    return EngineState(
        cache=cache, logits=jnp.zeros((e, cfg.vocab_size), jnp.float32),
        positions=jnp.zeros((e,), jnp.int32), steps=jnp.zeros((e,), jnp.int32),
        live=jnp.zeros((e,), bool), out_rows=jnp.zeros((e,), jnp.int32),
        draw_ids=jnp.zeros((e,), jnp.int32), tokens=jnp.zeros((b, n), jnp.int32),
        logprobs=jnp.zeros((b, n), jnp.float32), mask=jnp.zeros((b, n), bool),
        done=jnp.zeros((b,), bool), invalid=jnp.zeros((b,), bool),
        key=jnp.array(key, copy=True))  # a copy: the decode calls donate the state


def _placed_row(layer: jax.Array, stored: jax.Array, slot, cells) -> jax.Array:
    """`layer` ([E, Hkv, S, Dh], or [L, E, Hkv, S, Dh] stacked) with slot `slot` cleared and
    `stored` ([Hkv, P_max, Dh], or [L, ...]) written at ring positions `cells` int32[P_max]."""
    stacked = layer.ndim == 5
    row_shape = layer.shape[:1] + layer.shape[2:] if stacked else layer.shape[1:]
    row = jnp.zeros(row_shape, layer.dtype).at[..., cells, :].set(stored.astype(layer.dtype))
    start = (0, slot, 0, 0, 0) if stacked else (slot, 0, 0, 0)
    return jax.lax.dynamic_update_slice(layer, jnp.expand_dims(row, 1 if stacked else 0),
                                        start)


@functools.partial(jax.jit, donate_argnums=(0,))
def insert(state: EngineState, prompt: PromptKV, slot: jax.Array, out_row: jax.Array,
           draw_id: jax.Array) -> EngineState:
    """Starts a row in `slot` (int32[]): the prompt's keys right-aligned before the ring's
    write index, every other position of the slot cleared, and the row's output row
    `out_row` and draw id `draw_id`. One program, whatever the slot, row or bucket.

    Returns:
        The state (donated buffers reused) with the slot live at step 0.
    """
    cache = state.cache
    s = cache.valid.shape[1]
    p_max = prompt.valid.shape[0]
    cells = (cache.index - p_max + jnp.arange(p_max)) % s
    if isinstance(cache.k, tuple):  # per-layer form: one [E, Hkv, S, Dh] array a layer
        k = tuple(_placed_row(x, prompt.k[i], slot, cells) for i, x in enumerate(cache.k))
        v = tuple(_placed_row(x, prompt.v[i], slot, cells) for i, x in enumerate(cache.v))
    else:
        k, v = (_placed_row(x, y, slot, cells) for x, y in ((cache.k, prompt.k),
                                                             (cache.v, prompt.v)))
    valid_row = jnp.zeros((s,), bool).at[cells].set(prompt.valid)
    valid = jax.lax.dynamic_update_slice(cache.valid, valid_row[None], (slot, 0))
    return state.replace(
        cache=cache.replace(k=k, v=v, valid=valid),
        logits=state.logits.at[slot].set(prompt.logits),
        positions=state.positions.at[slot].set(prompt.position),
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
                  emitted: jax.Array) -> EngineState:
    """The model half of a step: every slot's token `tok: int32[E]` through the model (a slot
    that did not emit writes an invalid position), the next logits stored."""
    hidden, cache = models.forward_hidden(params, cfg, tok[:, None], state.positions[:, None],
                                          emitted[:, None], state.cache)
    return state.replace(cache=cache, logits=models.logits_from_hidden(params, cfg,
                                                                       hidden[:, 0]),
                         positions=state.positions + 1)


def _step(params, cfg: ModelConfig, state: EngineState, method: Method, stop_ids,
          pad_id: int) -> tuple[EngineState, jax.Array]:
    """One unconstrained step: (state, freed bool[E])."""
    state, tok, emitted, freed = _sample_rows(state, method, stop_ids, pad_id)
    return _forward_rows(params, cfg, state, tok, emitted), freed


# The constrained loop's halves, jitted apart so the host fills the next masks while the
# device runs the forward (as `constrained.decode`); the state is donated to each.
@functools.partial(jax.jit, static_argnames=("method", "pad_id"), donate_argnums=(0,))
def sample_step(state: EngineState, words: jax.Array, force_stop: jax.Array, method: Method,
                stop_ids: jax.Array, pad_id: int) -> tuple:
    """`_sample_rows` under a constraint's packed bitmask `words: int32[E, W]`."""
    allowed = unpack_bitmask(words, state.logits.shape[-1])
    return _sample_rows(state, method, stop_ids, pad_id, allowed, force_stop)


forward_step = jax.jit(_forward_rows, static_argnames="cfg", donate_argnums=(2,))


@functools.partial(jax.jit, static_argnames=("cfg", "method", "pad_id", "max_steps"),
                   donate_argnums=(2,))
def decode_steps(params, cfg: ModelConfig, state: EngineState, method: Method,
                 stop_ids: jax.Array, pad_id: int, max_steps: int,
                 refill: jax.Array) -> tuple[EngineState, jax.Array]:
    """Runs up to `max_steps` engine steps (`lax.while_loop`); stops early when no slot is
    live, or when `refill` (bool[]: rows are waiting) and a slot has freed.

    Args:
        params: the weights in the decode form (`decode.decode_params`).
        state: donated.  stop_ids: int32[...] ids that end a row.

    Returns:
        (state, steps run int32[]).
    """
    def cond(carry):
        s, i, freed = carry
        return (i < max_steps) & jnp.any(s.live) & ~(refill & jnp.any(freed))

    def body(carry):
        s, i, freed = carry
        s, now = _step(params, cfg, s, method, stop_ids, pad_id)
        return s, i + 1, freed | now

    e = state.live.shape[0]
    state, steps, _ = jax.lax.while_loop(
        cond, body, (state, jnp.zeros((), jnp.int32), jnp.zeros((e,), bool)))
    return state, steps
