"""The verifier's jitted passes run over chunks of rows (METHOD 11).

`ChunkedPasses` turns token ids into passes: the rows are scheduled into passes by token
bucket (`schedule.plan_passes`, with the rows per pass of `budgets.PassBudgets`),
left-padded (`sampling.buckets.left_pad`), put on the devices (`placement.RowPlacement`),
scored by the jitted functions of `passes`, and read back into place.
- prefix sharing (`shared`): each chunk's prefixes are prefilled once into a KV cache; the
  cache serves every block of Mc item suffixes, right-padded to one bucket Ts per call.
- full prompts (`full`): one causal pass per chunk, P(yes) read at the last token.

A mixture-of-experts verifier (a family with `router_load_counts`) also counts its router
load into the `stats=` dict (`counters.LOAD_COUNTS`), on the FIRST pass of each call only:
one more forward of that pass's prompts (the prefill's tokens, or the full prompts),
without a cache or LM head. It is a sample of the call's routing (one chunk of real
inputs), not the load of every pass: the passes themselves return no router output.

Axis legend (drubric_jax/types.py): R (prompt, response) rows, M rubric items, P prefix
tokens (bucket), T full-prompt tokens (bucket); here also Mc items per pass, Ts suffix
tokens (bucket).
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np

from drubric_jax import models, parallel
from drubric_jax.evaluator import passes, schedule
from drubric_jax.evaluator.budgets import PassBudgets, suffix_bucket
from drubric_jax.evaluator.counters import add_router_load
from drubric_jax.evaluator.placement import RowPlacement
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling.buckets import left_pad


class ChunkedPasses:
    """P(yes) of token-id rows, in passes sized by a `PassBudgets`.

    Args:
        cfg: the verifier model's config.
        chunking: the pass sizes and token buckets.
        placement: where a pass's rows live (one process, or all of them).
        pad_id: the id of padding positions (masked out: any id will do).
        yes_ids, no_ids: int32 arrays of the yes / no token variants (METHOD 11).
    """

    def __init__(self, cfg: ModelConfig, chunking: PassBudgets, placement: RowPlacement,
                 pad_id: int, yes_ids: jax.Array, no_ids: jax.Array):
        self.cfg, self.chunking, self.placement = cfg, chunking, placement
        self.pad_id, self.yes_ids, self.no_ids = pad_id, yes_ids, no_ids

    def _passes(self, tables: list, max_rows_of: Callable[[int], int]) -> list:
        """The passes over every process's rows, bucketed by column 0 of their tables."""
        return schedule.plan_passes(
            [t[:, 0] for t in tables], bucket_of=self.chunking.prefix_bucket,
            max_rows_of=max_rows_of, row_shards=self.placement.row_shards)

    def _router_load(self, params, tokens: jax.Array, mask: jax.Array, stats) -> None:
        """Counts a mixture-of-experts verifier's router load over one pass's placed prompts
        into `stats` (`passes.router_load`); nothing for a dense verifier or stats=None.
        Under several processes a collective: every process calls it at the same pass."""
        if stats is None or not hasattr(models.family(self.cfg), "router_load_counts"):
            return
        add_router_load(stats, parallel.fetch(passes.router_load(params, self.cfg, tokens,
                                                                 mask)))

    def shared(self, params, prepared: list, out: np.ndarray, stats=None) -> None:
        """Fills out float32[R, M] on the prefix-sharing path (one prefill per response).

        Args:
            params: the verifier's params.
            prepared: R (prefix ids, [suffix ids per item]) pairs (`VerifierText.prepare`;
                [] for a blank item); R may be 0 on a process under several processes.
            out: float32[R, M], written at every real (row, item); blanks are left alone.
            stats: optional `stats=` dict: a mixture-of-experts verifier's router load of
                the first pass goes there (module docstring).
        """
        # Traced under the mesh: the verifier's fsdp-split weights are gathered a layer at a
        # time and its rows' activations stay split (`parallel.constrain_rows`).
        with parallel.rows_on(self.placement.mesh):
            self._shared(params, prepared, out, stats)

    def _shared(self, params, prepared: list, out: np.ndarray, stats) -> None:
        # Each row: its prefix's tokens, then each item suffix's (0: a blank item).
        table = np.zeros((len(prepared), 1 + out.shape[1]), np.int64)
        for i, (pre, sufs) in enumerate(prepared):
            table[i, 0] = len(pre)
            table[i, 1:1 + len(sufs)] = [len(x) for x in sufs]
        tables, me = self.placement.tables(table)
        num_items = max(t.shape[1] for t in tables) - 1  # M over every process's rows
        longest = max(int(t[:, 1:].max(initial=0)) for t in tables)
        if longest == 0:
            return
        # One suffix bucket Ts for the whole call, set by the longest suffix.
        suffix = suffix_bucket(longest)
        put, take = self.placement.put, self.placement.take
        for n, ps in enumerate(self._passes(tables, lambda prefix: self.chunking.rows_per_pass(
                prefix, suffix, num_items))):
            prefix, chunk = ps.bucket, ps.members[me]
            items_per_pass = self.chunking.items_per_pass(prefix, suffix, num_items)
            local_rows = ps.rows // len(tables)  # this process's rows of the pass
            tokens, mask = left_pad([prepared[i][0] for i in chunk], prefix, self.pad_id,
                                    local_rows)
            tokens, mask = put(tokens), put(mask)
            cache, prefix_len = passes.prefill(params, self.cfg, tokens, mask,
                                               num_slots=prefix + suffix)
            if n == 0:
                self._router_load(params, tokens, mask, stats)
            # The chunk's prefilled cache serves every item block (the prefix is computed once).
            for first in range(0, num_items, items_per_pass):
                # A block no row of the pass has an item in, on any process, is skipped.
                if not any(t[list(ms), 1 + first:1 + first + items_per_pass].any()
                           for t, ms in zip(tables, ps.members)):
                    continue
                suf, suf_len = _suffix_block([prepared[i][1] for i in chunk], local_rows,
                                             first, items_per_pass, suffix, self.pad_id)
                values = take(passes.score_suffixes(
                    params, self.cfg, cache, prefix_len, put(suf), put(suf_len),
                    self.yes_ids, self.no_ids))
                for j, i in enumerate(chunk):
                    for m in np.flatnonzero(suf_len[j]):  # real items only
                        out[i, first + m] = values[j, m]

    def full(self, params, prompts_ids: Sequence[Sequence[int]], stats=None) -> np.ndarray:
        """P(yes) after each of N non-empty full prompts (this process's rows): float32[N].
        stats: as in `shared` (the router load of the first pass)."""
        with parallel.rows_on(self.placement.mesh):  # as in `shared`
            return self._full(params, prompts_ids, stats)

    def _full(self, params, prompts_ids: Sequence[Sequence[int]], stats) -> np.ndarray:
        out = np.zeros((len(prompts_ids),), np.float32)
        table = np.array([[len(ids)] for ids in prompts_ids], np.int64).reshape(-1, 1)
        tables, me = self.placement.tables(table)
        for n, ps in enumerate(self._passes(tables, self.chunking.rows_per_full_pass)):
            chunk = list(ps.members[me])
            tokens, mask = left_pad([prompts_ids[i] for i in chunk], ps.bucket, self.pad_id,
                                    ps.rows // len(tables))
            tokens, mask = self.placement.put(tokens), self.placement.put(mask)
            values = self.placement.take(passes.score_full(
                params, self.cfg, tokens, mask, self.yes_ids, self.no_ids))
            if n == 0:
                self._router_load(params, tokens, mask, stats)
            # Filler rows (mesh padding) are dropped.
            out[chunk] = values[:len(chunk)]
        return out


def _suffix_block(suffixes: list, rows: int, first: int, items_per_pass: int, suffix: int,
                  pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Items first .. first + Mc - 1 of each row's suffix ids, right-padded.

    Args:
        suffixes: per real row, its list of item suffix ids ([] for a blank item).
        rows: R rows of the pass (rows past `suffixes` are filler).
        first: the block's first item column; items_per_pass: Mc; suffix: Ts.
        pad_id: the id of padding positions.

    Returns:
        (int32[R, Mc, Ts] tokens, int32[R, Mc] lengths; 0 for no item).
    """
    tokens = np.full((rows, items_per_pass, suffix), pad_id, np.int32)
    lengths = np.zeros((rows, items_per_pass), np.int32)
    for j, sufs in enumerate(suffixes):
        for m, ids in enumerate(sufs[first:first + items_per_pass]):
            # Right padding: the answer is read after each row's last real suffix token.
            tokens[j, m, :len(ids)] = ids
            lengths[j, m] = len(ids)
    return tokens, lengths
