"""JSON-schema constrained decoding with llguidance, at batch size.

The grammar state lives on the host, one `llguidance.LLMatcher` per row. Each step the host
fills the rows' packed bitmasks, int32[B, W] with W = ceil(V / 32) (token v is allowed when
bit v % 32 of word v // 32 is set: llguidance's layout, 1/8 of the bytes of a bool[B, V]
mask), on llguidance's threads; the jitted step unpacks it on the device (`unpack_bitmask`).

A step is two jitted calls, `sampler.sample_token` (needs the mask) and
`sampler.forward_token` (needs the token), so the host fills the mask of step t + 1 while
the device runs the forward of step t (`decode`):

    host:    fill m_0 | get y_0, advance, fill m_1 | get y_1, advance, fill m_2 | ...
    device:  sample y_0 | forward y_0 ............ | sample y_1 | forward y_1 ...

The host waits only for the sampled tokens, which the matchers must consume before they can
give the next mask. Rows that are done, or whose grammar has stopped, get no fill.

Axis legend: B rows, V vocabulary (the model's logits), W = ceil(V / 32) bitmask words.
"""
from __future__ import annotations

import functools
import json
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax import models, parallel
from drubric_jax.sampling import decode as sampler
from drubric_jax.sampling.methods import Method


def bitmask_words(vocab_size: int) -> int:
    """W = ceil(V / 32): int32 words of one row's bitmask."""
    return -(-vocab_size // 32)


def pack_bitmask(allowed: np.ndarray) -> np.ndarray:
    """int32[B, W] bitmask of `allowed: bool[B, V]` (bits past V are 0).

    For constraints written as boolean masks; `np.unpackbits(out.view(np.uint8), axis=-1,
    bitorder="little")[:, :V]` gives `allowed` back (on a little-endian host, as llguidance).
    """
    b, v = allowed.shape
    # Padded to whole int32 words; the bits past V stay 0 (never allowed).
    bits = np.zeros((b, 32 * bitmask_words(v)), bool)
    bits[:, :v] = allowed
    # Little bit order in little-endian int32 words: bit v % 32 of word v // 32.
    return np.packbits(bits, axis=-1, bitorder="little").view(np.int32)


def unpack_bitmask(words: jax.Array, vocab_size: int) -> jax.Array:
    """bool[B, V] allowed tokens of a bitmask `words: int32[B, W]` (jittable).

    Token v is allowed when `(words[:, v // 32] >> (v % 32)) & 1`; the arithmetic shift
    copies the sign bit only into bits the `& 1` drops. Bits past V (the last word's
    padding) are ignored, and tokens past 32 * W (a mask narrower than the logits) are
    never allowed.
    """
    b, w = words.shape
    bits = (words[:, :, None] >> jnp.arange(32, dtype=words.dtype)) & 1  # [B, W, 32]
    allowed = bits.reshape(b, 32 * w) == 1
    if 32 * w < vocab_size:
        allowed = jnp.pad(allowed, ((0, 0), (0, vocab_size - 32 * w)))
    return allowed[:, :vocab_size]


# The halves of one step, jitted apart so the host works between them (module docstring);
# the state is donated to each, so the cache is updated in place.
@functools.partial(jax.jit, static_argnames=("method", "pad_id"), donate_argnums=(0,))
def _sample(state, words, force_stop, method, stop_ids, pad_id):
    allowed = unpack_bitmask(words, state.logits.shape[-1])
    state, tok, emitted = sampler.sample_token(state, method, stop_ids, pad_id, allowed,
                                                force_stop)
    # Every row of every process done: the loop's exit, the same on all processes.
    all_done = jnp.all(~emitted | jnp.isin(tok, stop_ids))
    return state, tok, emitted, all_done


_forward = jax.jit(sampler.forward_token, static_argnames="cfg", donate_argnums=(2,))
_decode_cache = jax.jit(models.decode_cache, static_argnames="per_layer")



def decode(params, cfg: models.ModelConfig, state: sampler.SamplerState, constraint,
           method: Method, stop_ids: jax.Array, pad_id: int,
           rows: Optional[jax.parallel.Sharding] = None,
           cache_slots: tuple = ()) -> sampler.SamplerState:
    """Decodes under a host-side constraint until every row stopped or N tokens were made.

    The constraint (duck-typed; `JsonSchemaConstraint` is the JSON-schema one):
    - `reset(B)`: fresh state for B rows;
    - `fill(bitmask int32[B, W], rows bool[B])`: writes the next-token bitmask of each row
      in `rows` into `bitmask`, in place; it may skip rows it has finished, and the other
      rows' words are stale (those rows are done or forced to stop);
    - `finished() -> bool[B]`: rows whose constraint is complete (ended with `stop_ids[0]`);
    - `advance(tokens int32[B], live bool[B])`: consumes each live row's sampled token.

    Args:
        params, cfg: the model.  state: `sampler.prefill`'s state (donated).
        constraint: as above.  method: sampling method.
        stop_ids: int32[K] ids that end a row.  pad_id: filler after the stop token.
        rows: the rows' sharding (`parallel.batch_sharding(mesh)`; default: the state's
            tokens'). Under several processes the constraint holds the rows it puts on
            this process's devices (its prompts) and the masks are assembled from every
            process's rows.
        cache_slots: the cache's segments, as `sampler.decode_segments`: before the
            forward that writes slot S_j a chunk of S_{j+1} - S_j slots is added
            (`models.add_chunk`; nothing is copied); the step programs compile once per
            segment.

    Returns:
        The final SamplerState; its cache is in the decode form (`models.decode_cache`)
        and its logits stale.
    """
    n = state.tokens.shape[1]
    stop = np.asarray(stop_ids)
    rows = state.tokens.sharding if rows is None else rows  # the masks' rows go there
    if state.tokens.is_fully_addressable:
        b = state.tokens.shape[0]

        def put(x):
            return parallel.put(x, rows)
    else:
        # Several processes: the constraint holds this process's rows only, and the masks
        # are assembled from every process's rows.
        block = parallel.row_span(rows, state.tokens.shape[0])
        b = block.stop - block.start

        def put(x):
            return jax.make_array_from_process_local_data(
                rows, x, state.tokens.shape[:1] + x.shape[1:])
    constraint.reset(b)
    # One host buffer: it is refilled only after the sample that read it returned its tokens
    # (`parallel.put` may alias it on CPU; a transfer to a GPU ends before the sample runs).
    # -1 sets every bit: all tokens allowed until the first fill writes the rows' masks.
    mask = np.full((b, bitmask_words(state.logits.shape[-1])), -1, np.int32)
    layer_params = sampler.decode_params(params, cfg)  # one copy per call, not per step
    # The cache in the weights' form, as `sampler.decode_loop` makes it.
    state = state.replace(cache=_decode_cache(state.cache,
                                              per_layer=models.is_per_layer(layer_params)))
    # The forward of step t writes slot P + t, with P = the last segment's end minus N.
    slots = list(cache_slots[1:])
    first_slot = cache_slots[-1] - n if cache_slots else 0
    constraint.fill(mask, np.ones(b, bool))  # while the device runs the prefill
    for step in range(n):
        state, tok, emitted, all_done = _sample(state, put(mask), put(constraint.finished()),
                                                method, stop_ids, pad_id)
        if step + 1 < n:  # dispatched before waiting for `tok`: runs while the host fills
            if slots and first_slot + step >= state.cache.num_slots:
                # Outside a program: the chunks written so far pass through untouched.
                state = state.replace(cache=models.add_chunk(state.cache, slots.pop(0)))
            state = _forward(layer_params, cfg, state, tok, emitted)
        tok, emitted = parallel.fetch_process_rows((tok, emitted), rows)
        constraint.advance(tok, emitted)  # the last token too: `finished()` sees it
        done = ~emitted | np.isin(tok, stop)  # = state.done (a row not emitting is done)
        # One process's rows all done is not the exit: all_done covers every process.
        if step + 1 == n or (done.all() if b == state.tokens.shape[0]
                             else bool(parallel.fetch(all_done))):
            break
        constraint.fill(mask, ~done)
    return state


class JsonSchemaConstraint:
    """Per-row JSON-schema constraint (the `decode` contract).

    Args:
        tokenizer: the model's `PreTrainedTokenizerFast`.
        schema: JSON schema dict.
        vocab_size: V of the model's logits (may exceed the tokenizer's size; llguidance
            never allows the extra ids).
        stop_id: the id that ends a row once its JSON value is complete.
        num_threads: llguidance's mask-filling threads (None: its default, 80% of the CPUs
            up to 32).

    Attributes:
        fills: int64[B] masks computed per row since `reset` (a finished row costs none).

    Raises:
        ValueError: llguidance rejects the schema.
    """

    def __init__(self, tokenizer, schema: dict, vocab_size: int, stop_id: int,
                 num_threads: Optional[int] = None):
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        self._llg, self._np = llguidance, llguidance.numpy
        self.vocab_size = vocab_size
        self.lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                  eos_token=stop_id)
        self.grammar = llguidance.LLMatcher.grammar_from_json_schema(
            # No free whitespace between JSON tokens: the schema's "x-guidance" separators fix it.
            json.dumps(schema), defaults={"whitespace_flexible": False})
        err = llguidance.LLMatcher.validate_grammar(self.grammar, self.lltok)
        if err:
            raise ValueError(f"llguidance rejected the JSON schema: {err}")
        self.executor = llguidance.LLExecutor(num_threads)
        self.matchers = []
        self.fills = np.zeros(0, np.int64)

    def reset(self, batch: int) -> None:
        """Fresh matchers for `batch` rows."""
        self.matchers = [self._llg.LLMatcher(self.lltok, self.grammar) for _ in range(batch)]
        self.fills = np.zeros(batch, np.int64)

    def reset_rows(self, rows) -> None:
        """Fresh matchers for the rows given (the rollout engine's slots that took a new
        row, `engine.generate_engine`)."""
        for i in rows:
            self.matchers[i] = self._llg.LLMatcher(self.lltok, self.grammar)
            self.fills[i] = 0

    def fill(self, bitmask: np.ndarray, rows: np.ndarray) -> None:
        """Writes into `bitmask: int32[B, W]` the next-token masks of the rows in
        `rows: bool[B]` whose grammar has not stopped, in parallel.

        A stopped grammar (value complete, or an error) would allow only the stop id, which
        `decode` forces for `finished()` rows anyway, so it is skipped.

        Raises:
            ValueError: (llguidance's) bitmask is not [B, ceil(vocab_size / 32)].
        """
        todo = [(m, i) for i, m in enumerate(self.matchers) if rows[i] and not m.is_stopped()]
        if todo:
            self._np.fill_next_token_bitmask_par(self.executor, todo, bitmask)
            self.fills[[i for _, i in todo]] += 1

    def finished(self) -> np.ndarray:
        """bool[B] rows whose grammar has stopped (value complete, nothing else allowed)."""
        return np.array([m.is_stopped() for m in self.matchers], bool)

    def advance(self, tokens: np.ndarray, live: np.ndarray) -> None:
        """Feeds each live row's sampled token to its matcher (in parallel); a token the
        grammar rejects puts the matcher in an error state (`errors`)."""
        # A stopped matcher accepts nothing more: the forced stop token is not fed to it.
        todo = [(m, int(tokens[i])) for i, m in enumerate(self.matchers)
                if live[i] and not m.is_stopped()]
        if todo:
            self._np.consume_token_par(self.executor, todo)

    def errors(self) -> list:
        """Matcher error strings per row ('' when fine)."""
        return [m.get_error() if m.is_error() else "" for m in self.matchers]
