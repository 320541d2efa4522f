"""The rubric generator G_phi(x, C): prompts, constrained sampling, parsing (METHOD 1, 2, 8).

For an input (prompt x, response set C) the generator writes G rubric lists, each a set of
weighted items {(r_m, w_m)} (METHOD 2), as JSON. The lists are sampled from a chat prompt in
which the K responses appear as "Response 1..K" in an order drawn from the key
(`response_orders`), so the generator cannot learn the sampling order. By default the G
lists of an input share one drawn order, so they share one prompt: the GRPO update runs
that input once for its G lists (`rl.train_step.GroupBatch`, METHOD 15); with
`orders_per_list` each list draws its own order (the lists then share only the template
and the request, and the update must run per row: `train.shared_prefix = False`). Decoding is
constrained to `rubric_format.RUBRIC_JSON_SCHEMA` with llguidance (the paper uses SGLang
structured output, METHOD 8); the text is then parsed by `rubric_format.parse_rubric_output`
(METHOD 11 item rules) and padded to M = max_items.

`static=True` gives the RaR-style static baseline (METHOD 6): the same code with no
responses shown.

The output (`types.RubricBatch`) also carries what a GRPO step on the generator needs
(Eq. 21-23): its `rollout` holds the left-padded prompts, completions, the sampler's
per-token log-probs (at the sampling temperature) and the completion mask (up to and
including the stop token), grouped by input.

Axis legend (docs/CONVENTIONS.md): B inputs (x, C), G rubric lists per input, K responses
per input (padded to the longest), M rubric items (= max_items), R = B * G rows (one
rubric list each).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence, Union

import jax
import numpy as np

from drubric_jax import sampling, parallel
from drubric_jax.text import tokenizer as tok_lib
from drubric_jax.sampling.constrained import JsonSchemaConstraint
from drubric_jax.models.config import ModelConfig
from drubric_jax.text import rubric_format
from drubric_jax.text.budget import fit_prompt
from drubric_jax.evaluator.rubric_formats import LLM_FORMAT, RubricFormat
from drubric_jax.types import RubricBatch


JSON_SEPARATORS = {"item_separator": ", ", "key_separator": ": "}
"""llguidance JSON options added to the schema as "x-guidance" (see RubricGenerator)."""


# The smallest prompt-length bucket of the generator's sampler (tokens); the planner reads it.
MIN_PROMPT_BUCKET = 64


@dataclasses.dataclass(frozen=True)
class RubricInput:
    """One generator input: the request x, earlier turns and the response set C (K texts)."""

    prompt: str
    responses: Sequence[str] = ()
    history: Sequence[dict] = ()


class RubricGenerator:
    """Samples weighted yes/no rubric lists from a (prompt, response set) (METHOD 1, 8).

    Input budget: the whole generator prompt (template + instructions + request + history
    + K labelled responses) must fit `input_budget` tokens. `text.budget.fit_prompt`
    measures the fixed template part, then splits the rest with
    `text.budget.fit_responses` (water-filling) over the request (unless keep_prompt),
    each history turn and each response: texts under the equal share keep every token, the
    longer ones share the rest equally. A cut text keeps its first tokens and the visible
    `text.budget.TRUNCATION_MARKER`, so the generator sees that the response went on.

    Args:
        cfg, tokenizer: the generator model (params are passed to each call, so the
            current generator weights are always the caller's `Roles.params("generator")`).
        max_items: M, most items per list (JSON schema maxItems; padded width).
        max_item_chars: most characters per criterion (schema maxLength).
        max_new_tokens: N, output budget; a list cut by it is invalid (finish "length").
        input_budget: most prompt tokens.  min_bucket: the sampler's smallest prompt bucket.
        mesh: optional mesh the sampler splits its rows over (`sampling.generate`).
        rows_per_call: rubric lists per sampler call (0 = all B x G at once; the rollout
            micro-batch of `sampling.generate_chunked`).  cache_segments: its KV-cache
            segments (`sampling.generate`; 0 = auto).  keep_prompt: never cut the request.
        sampler: "static" | "engine" (rows_per_call slots), `sampling.generate_constrained`.
        fmt: the lists' `rubric_formats.RubricFormat` (free text or checks, METHOD 13).

    Raises:
        ValueError: bad sizes, or llguidance rejects the schema.
    """

    def __init__(self, cfg: ModelConfig, tokenizer, max_items: int = 8,
                 max_item_chars: int = 200, max_new_tokens: int = 512, input_budget: int = 2048,
                 min_bucket: int = MIN_PROMPT_BUCKET, mesh=None, rows_per_call: int = 0,
                 per_row_keys: bool = False, fmt=LLM_FORMAT, cache_segments: int = 0,
                 keep_prompt: bool = False, sampler: str = "static",
                 orders_per_list: bool = False):
        if max_new_tokens < 8 or input_budget < 64:
            raise ValueError(f"max_new_tokens ({max_new_tokens}) must be >= 8 and "
                             f"input_budget ({input_budget}) >= 64")
        self.cfg, self.tokenizer, self.mesh = cfg, tokenizer, mesh
        self.rows_per_call, self.cache_segments, self.keep_prompt = (
            int(rows_per_call), int(cache_segments), bool(keep_prompt))
        self.sampler = sampling.check_sampler(sampler)
        # orders_per_list: an order per list, not per input (module docstring);
        # per_row_keys: list (b, g) draws from its global row id b * G + g.
        self.orders_per_list, self.per_row_keys = bool(orders_per_list), bool(per_row_keys)
        self.max_items, self.max_item_chars = int(max_items), int(max_item_chars)
        self.max_new_tokens, self.input_budget, self.min_bucket = (
            int(max_new_tokens), int(input_budget), int(min_bucket))
        self.fmt, self.schema = fmt, fmt.schema(self.max_items, self.max_item_chars)
        # Fixed separators ", " and ": " (no other whitespace): the spacing chat models
        # write by themselves in one-line JSON, so the constraint does not push the model
        # off its usual token sequences (compact "," / ":" made SmolLM2 emit noise).
        self.schema["x-guidance"] = dict(JSON_SEPARATORS)
        self.stop_ids = tok_lib.stop_ids(tokenizer)
        # One constraint for every call (`reset` makes fresh per-row matchers); its vocabulary is
        # the logits' width, which may exceed the tokenizer's.
        self.constraint = JsonSchemaConstraint(tokenizer, self.schema, cfg.vocab_size,
                                               int(self.stop_ids[0]))

    def prompt_ids(self, prompt: str, responses: Optional[Sequence[str]],
                   history: Optional[Sequence[dict]] = None,
                   order: Optional[Sequence[int]] = None) -> tuple[list, list, bool]:
        """Generator chat prompt ids under the input budget (METHOD 8).

        Args:
            prompt: user request x.  responses: K texts, or None / [] for the static prompt.
            history: earlier turns.  order: presentation permutation of range(K).

        Returns:
            (ids list[int], response_cut list[bool] per ORIGINAL response index,
            prompt_cut bool).

        Raises:
            ValueError: the template alone exceeds the budget; a bad `order`.
        """
        def render(p, hist, resp):
            msgs = self.fmt.messages(p, resp or None, hist, order=order if resp else None,
                                     max_items=self.max_items)
            return tok_lib.chat_ids(self.tokenizer, msgs)

        fit = fit_prompt(self.tokenizer, render, prompt, history, responses,
                         max_tokens=self.input_budget, keep_prompt=self.keep_prompt)
        # A cut history turn counts as a cut prompt.
        return fit.ids, list(fit.response_cut), fit.prompt_cut or any(fit.history_cut)

    def generate(self, params, key: jax.Array, prompt: str,
                 responses: Optional[Sequence[str]], history: Optional[Sequence[dict]] = None,
                 *, num_lists: int = 4, temperature: float = 1.0,
                 static: bool = False) -> RubricBatch:
        """G = num_lists rubric lists for one (x, C); arrays without the B axis.

        See `generate_batch`.
        """
        inp = RubricInput(prompt, tuple(responses or ()), tuple(history or ()))
        return self.generate_batch(params, key, [inp], num_lists=num_lists,
                                   temperature=temperature, static=static).first()

    def generate_batch(self, params, key: jax.Array, inputs: Sequence[RubricInput], *,
                       num_lists: int = 4, temperature: float = 1.0,
                       static: Union[bool, Sequence[bool]] = False) -> RubricBatch:
        """G rubric lists for each of B inputs, sampled in one constrained batch.

        Randomness: `key` splits into an order key (input b's lists show the responses in
        `jax.random.permutation(fold_in(order_key, b), K)`; with `orders_per_list`, list
        (b, g) in `permutation(fold_in(order_key, b * G + g), K)`) and the sampler key.
        Temperature 0 is greedy.

        Args:
            params: the generator's current params.
            key: PRNG key.
            inputs: B `RubricInput`s (responses ignored when `static`).
            num_lists: G.
            temperature: sampling temperature (>= 0).
            static: prompt-only (RaR) lists: no responses shown, identity orders; one bool
                for all inputs or one per input.

        Returns:
            RubricBatch with a leading B axis. Under several processes (a mesh spanning
            them) every process decodes only its block of the inputs
            (`parallel.process_block`, the inputs padded with copies of the last to a
            multiple of the process count) and the lists are then gathered, so every
            field holds all B inputs except `rollout`, which holds this process's rows
            (what its devices train on).

        Raises:
            ValueError: no inputs, num_lists < 1, negative temperature, a dynamic input
                without responses, or an input the budget cannot hold.
        """
        if not inputs:
            raise ValueError("no inputs")
        if num_lists < 1:
            raise ValueError(f"num_lists must be >= 1, got {num_lists}")
        b = len(inputs)
        statics = ([bool(static)] * b if isinstance(static, (bool, np.bool_))
                   else [bool(x) for x in static])
        if len(statics) != b:
            raise ValueError(f"{len(statics)} static flags for {b} inputs")
        # `orders` is padded (-1) to the largest K; at least 1 so an all-static batch has the axis.
        k_max = max(1, max(len(x.responses) for x in inputs))
        if jax.process_count() == 1:
            return self._generate_rows(params, key, list(inputs), statics, 0, k_max,
                                       int(num_lists), float(temperature))
        # Copies of the last input fill the batch to a multiple of the process count:
        # decoded, not counted, then dropped.
        block, (mine, my_statics) = parallel.process_share(inputs, statics)
        local = self._generate_rows(
            params, key, mine, my_statics, block.start, k_max, int(num_lists),
            float(temperature), real=max(0, min(block.stop, b) - block.start))
        return gather_rubrics(local, b)

    def _generate_rows(self, params, key, inputs: list, statics: list, first: int,
                       k_max: int, g: int, temperature: float,
                       real: Optional[int] = None) -> RubricBatch:
        """`generate_batch` of inputs first .. first + len(inputs) - 1 of the batch (their
        global indices set the response orders) on this process's rows; `counters` count
        the first `real` inputs (default all: the rest are filler)."""
        # Temperature 0 is Greedy; rubric lists use no top-k / top-p truncation.
        method = sampling.method_from_flags(temperature)
        b = len(inputs)
        order_key, sample_key = jax.random.split(key)
        orders = np.full((b, g, k_max), -1, np.int32)
        response_cut = np.zeros((b, g, k_max), bool)
        prompt_cut = np.zeros((b, g), bool)
        for i, inp in enumerate(inputs):
            if not statics[i] and not inp.responses:
                raise ValueError(f"input {first + i} has no responses (use static=True)")
        perm_of = _list_orders(order_key, [len(x.responses) for x in inputs], statics, first,
                               g, self.orders_per_list)
        prompts = []
        for i, inp in enumerate(inputs):
            k = len(inp.responses)
            for j in range(g):
                if statics[i]:
                    # Static lists show no responses: identity order, nothing cut.
                    orders[i, j, :k] = np.arange(k)
                    ids, _, pcut = self.prompt_ids(inp.prompt, None, inp.history)
                else:
                    perm = perm_of[i, j]
                    orders[i, j, :k] = perm
                    ids, rcut, pcut = self.prompt_ids(inp.prompt, inp.responses, inp.history,
                                                      perm.tolist())
                    response_cut[i, j, :k] = rcut
                prompt_cut[i, j] = pcut
                prompts.append(ids)

        # allow_invalid: a grammar dead end becomes an invalid list (counted), not an error.
        kw = dict(key=sample_key, max_new_tokens=self.max_new_tokens, method=method,
                  stop_ids=self.stop_ids, constraint=self.constraint,
                  min_bucket=self.min_bucket, allow_invalid=True, mesh=self.mesh,
                  row_ids=(list(range(first * g, (first + b) * g)) if self.per_row_keys
                           else None))
        out, grammar_done = sampling.generate_constrained(
            self.sampler, params, self.cfg, prompts, self.rows_per_call, self.cache_segments,
            **kw)
        real = b if real is None else real
        return _lists_from_rows(
            self.tokenizer, out, grammar_done, set(self.stop_ids.tolist()), self.max_items,
            np.arange(first, first + b), g, real * g,
            temperature=sampling.scoring_temperature(method), orders=orders,
            response_cut=response_cut, prompt_cut=prompt_cut, fmt=self.fmt)


def _lists_from_rows(tokenizer, out, grammar_done, stops: set, max_items: int,
                     input_index, g: int, real_rows: int, fmt: RubricFormat = LLM_FORMAT,
                     **prompt_side) -> RubricBatch:
    """The `RubricBatch` of the sampler's R = B * G rows (row b * G + g: list g of the
    input with batch index input_index[b], its group id): each row decoded, its finish
    reason set, parsed (METHOD 11 item rules) and padded to M = max_items; the counters
    count the first `real_rows` rows (the rest are filler). `prompt_side`: the RubricBatch
    fields set before sampling (orders, response_cut, prompt_cut, temperature)."""
    b = len(input_index)
    parsed, reasons, raws = [], [], []
    for row in range(b * g):
        ids = out.tokens[row][out.mask[row]].tolist()
        # The stop token is not part of the JSON text.
        if ids and ids[-1] in stops:
            ids = ids[:-1]
        text = tokenizer.decode(ids)
        if out.invalid[row]:
            reason = "invalid"
        # Out of tokens with the JSON value still open; a row whose grammar completed on
        # its last token is complete, not cut.
        elif out.truncated[row] and not grammar_done[row]:
            reason = "length"
        else:
            reason = "stop"
        parsed.append(fmt.parse(text, "length" if reason == "length" else "stop", max_items))
        reasons.append(reason)
        raws.append(text)
    texts, weights, item_mask, valid = rubric_format.pad_rubrics(parsed, max_items)

    counters = dict.fromkeys(fmt.counter_keys, 0)
    for p in parsed[:real_rows]:
        for name, v in p.counters.items():
            counters[name] += int(v)
    counters.update(lists=real_rows, valid_lists=int(valid[:real_rows].sum()),
                    items_kept=int(item_mask[:real_rows].sum()),
                    items_dropped=sum(p.num_dropped for p in parsed[:real_rows]),
                    constraint_dead_end=int(out.invalid[:real_rows].sum()))

    # Flat row b * G + g -> [B, G, ...] arrays (grid) and [b][g] lists (nested).
    def grid(x):
        return x.reshape((b, g) + x.shape[1:])

    def nested(xs):
        return [xs[i * g:(i + 1) * g] for i in range(b)]

    # A list is truncated only when the budget ran out before its JSON value closed (a
    # row the grammar completed is ended by the sampler, not cut).
    rollout = out.replace(group_ids=np.repeat(np.asarray(input_index, np.int32), g),
                          truncated=np.array([x == "length" for x in reasons]))
    return RubricBatch(
        texts=nested(texts), weights=grid(weights), item_mask=grid(item_mask),
        list_valid=grid(valid), finish_reasons=nested(reasons), raw_texts=nested(raws),
        rollout=rollout, counters=counters, **prompt_side)


def _list_orders(order_key: jax.Array, sizes: Sequence[int], statics: Sequence[bool],
                 first: int, g: int, per_list: bool) -> dict:
    """{(b, j): int32[K_b] permutation} for list j of each dynamic (not static) input b of
    a batch whose first input is the global input `first` (`response_orders`): one order
    per input, drawn by its global index, shown to its G lists; with `per_list`, one per
    list, drawn by its global row id b * G + j."""
    dynamic = [(i, j) for i in range(len(sizes)) if not statics[i] for j in range(g)]
    if per_list:
        perms = response_orders(order_key, [(first + i) * g + j for i, j in dynamic],
                                [sizes[i] for i, _ in dynamic])
        return dict(zip(dynamic, perms))
    shown = [i for i in range(len(sizes)) if not statics[i]]
    per_input = dict(zip(shown, response_orders(order_key, [first + i for i in shown],
                                                [sizes[i] for i in shown])))
    return {(i, j): per_input[i] for i, j in dynamic}


def response_orders(order_key: jax.Array, row_ids: Sequence[int],
                    sizes: Sequence[int]) -> list:
    """The order in which each rubric-list row shows its input's responses:
    `jax.random.permutation(jax.random.fold_in(order_key, row_id), size)` for each row.

    One vmapped call (and one transfer to the host) per distinct size instead of one per
    row; `jax.vmap` of `fold_in` and `permutation` draws, per key, the bits the unbatched
    calls draw, so the orders equal a per-row loop's
    (`tests/test_rubric_generator.py::test_response_orders_equal_the_per_row_loop`).

    Args:
        order_key: PRNG key of the orders.
        row_ids: R global row ids b * G + g, in [0, 2^31).
        sizes: R response counts K_r (>= 1).

    Returns:
        R arrays int32[K_r], permutations of range(K_r).
    """
    row_ids, sizes = np.asarray(row_ids, np.int64), np.asarray(sizes, np.int64)
    out = [None] * len(row_ids)
    for size in np.unique(sizes):
        rows = np.flatnonzero(sizes == size)
        keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(order_key, row_ids[rows])
        perms = np.asarray(jax.vmap(functools.partial(jax.random.permutation,
                                                      x=int(size)))(keys))   # [R_k, K]
        for row, perm in zip(rows, perms):
            out[row] = perm
    return out


def gather_rubrics(local: RubricBatch, n: int) -> RubricBatch:
    """Every process's block of a RubricBatch joined in process order and cut to the
    first n inputs; `rollout` stays this process's rows. A collective."""
    b, g, m = local.weights.shape

    def texts(nested, depth):
        flat = [t for row in nested for t in (row if depth == 1 else
                                               [u for lst in row for u in lst])]
        flat = parallel.gather_texts(flat)
        per = g if depth == 1 else g * m
        rows = [flat[i * per:(i + 1) * per] for i in range(len(flat) // per)][:n]
        if depth == 1:
            return rows
        return [[row[j * m:(j + 1) * m] for j in range(g)] for row in rows]

    keys = sorted(local.counters)  # each process counted its real inputs only
    summed = parallel.gather_rows(np.array([[local.counters[k] for k in keys]], np.int64))
    counters = dict(zip(keys, (int(x) for x in summed.sum(0))))

    def arr(x):
        return parallel.gather_rows(x)[:n]

    return dataclasses.replace(
        local, texts=texts(local.texts, 2), weights=arr(local.weights),
        item_mask=arr(local.item_mask), list_valid=arr(local.list_valid),
        finish_reasons=texts(local.finish_reasons, 1), raw_texts=texts(local.raw_texts, 1),
        orders=arr(local.orders), response_cut=arr(local.response_cut),
        prompt_cut=arr(local.prompt_cut), counters=counters)
