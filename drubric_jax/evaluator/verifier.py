"""The frozen verifier: P(yes) for every (response, rubric item) pair (METHOD 1, 3, 11).

The verifier reads [instructions + user request (+ earlier turns) + response + criterion]
and answers Yes or No. We never sample that answer: one forward pass gives the logits of
the first assistant token, and `verdicts.p_yes_from_logits` gives P(yes) from them
(METHOD 11; `verdicts` also turns P(yes) into the v of Eq. 12, 13 and 15).

Two execution paths give the same numbers (|dP| <= 1e-4, tested):
- prefix sharing (default): the prefix [instructions + request + response] is prefilled
  ONCE per response into a left-padded KV cache; the cache rows are then repeated
  (`jnp.repeat` on the batch axis) once per rubric item and all item suffixes
  ("Criterion: ... Answer Yes or No." + the assistant-turn opener), right-padded to a
  bucket, run in one batched pass that continues after the shared prefix. Logits are read
  at each row's last real suffix token.
- naive: every (response, item) pair is its own full prompt (reference and benchmark).

The texts are rendered, fitted and tokenised by `verifier_text` (the base class); the
jitted passes live in `verifier_passes`; which rows share a pass is `verifier_plan`'s
schedule. Shapes are bucketed (powers of two for prefix and full-prompt lengths, multiples
of 16 for the short item suffixes; row chunks derived from the buckets and a memory
budget) so a new text length reuses a compiled program.
Under several processes (`jax.distributed`) each process tokenises and schedules only its
own rows, and every pass is one program over all processes' rows (`p_yes(process_rows=)`).
Contextual calibration (METHOD 12) appends one content-free row per prompt to the same call.

Counters (cut prefixes and items, prefixes, judgements) go into a dict the caller passes
as `stats=` (nothing is kept on the object between calls).

Axis legend (docs/CONVENTIONS.md): R (prompt, response) pairs, M rubric items, P prefix
tokens (bucket), S cache slots, V vocab; here also Ts suffix tokens (bucket), T
full-prompt tokens.
"""
from __future__ import annotations

import json
from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax import parallel
from drubric_jax.evaluator import passes
from drubric_jax.evaluator import schedule as verifier_plan
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling import bucket_length
from drubric_jax.evaluator.verdicts import (CALIBRATIONS, NULL_RESPONSE, contextual_calibration,
                                  yes_no_token_ids)
from drubric_jax.evaluator.verifier_prompts import VerifierText, add_count

STATS = ("prefix_cut", "item_cut", "prefixes", "judgements")  # the `stats=` counters


# ----------------------------------------------------------------------------- verifier

Items = Union[Sequence[str], Sequence[Sequence[str]]]


class Verifier(VerifierText):
    """Frozen yes/no verifier with prefix sharing (METHOD 1, 11; scores feed Eq. 12-15).

    Args:
        cfg: the verifier model's config (params are passed to each call).
        tokenizer: its tokenizer; the chat template renders the prompt (a tokenizer without
            one uses `text.prompts.plain_render`).
        max_prefix_tokens: budget of [instructions + request (+ history) + response]; longer
            texts are cut by `text.budget.fit_prompt` with the visible `TRUNCATION_MARKER`.
        max_suffix_tokens: budget of one item suffix (criterion + question + assistant
            opener); longer criteria are cut the same way.
        cache_slots_budget: most KV-cache row-slots (rows x S) of one suffix pass; bounds
            memory (SmolLM2-135M: ~46 KB per row-slot in float32).
        prefill_tokens_budget: most rows x tokens of one prefill or naive pass.
        max_rows: most (response) rows per prefill chunk.
        item_chunk: most items scored per prefix per pass (a power of two).
        min_bucket: smallest token bucket.
        mesh: optional device mesh: the rows of every pass are split over its
            ("data", "fsdp") axes (each chunk padded to a multiple of data x fsdp); the
            params should be on the same mesh (`models.param_shardings`).

    Raises:
        ValueError: a budget < 16 tokens, or the tokenizer has no yes/no tokens.
    """

    def __init__(self, cfg: ModelConfig, tokenizer, max_prefix_tokens: int = 2048,
                 max_suffix_tokens: int = 128, *, cache_slots_budget: int = 1 << 15,
                 prefill_tokens_budget: int = 8192, max_rows: int = 8, item_chunk: int = 16,
                 min_bucket: int = 16, mesh=None):
        super().__init__(tokenizer, max_prefix_tokens, max_suffix_tokens)
        self.cfg = cfg
        self.cache_slots_budget = int(cache_slots_budget)
        self.prefill_tokens_budget = int(prefill_tokens_budget)
        # Powers of two: chunk shapes come from a small set, so compiled programs are reused.
        self.max_rows = passes.pow2_floor(max_rows)
        self.item_chunk = passes.pow2_floor(item_chunk)
        self.min_bucket = int(min_bucket)
        # Found from the tokenizer, never hard-coded (METHOD 11).
        yes, no = yes_no_token_ids(tokenizer)
        self.yes_ids, self.no_ids = jnp.asarray(yes), jnp.asarray(no)
        # Any id will do: padded positions are masked out.
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.mesh = mesh
        # Every pass's rows are padded to a multiple of data x fsdp, the mesh's row shards.
        self._row_shards = 1 if mesh is None else int(np.prod(
            [mesh.shape[a] for a in parallel.BATCH_AXES]))

    @staticmethod
    def budgets(cfg: ModelConfig, device_bytes: int, fraction: float) -> dict:
        """cache_slots_budget and prefill_tokens_budget that use `fraction` of a device's
        memory: a KV row-slot holds L x 2 x Hkv x Dh values of the compute dtype, and a
        prefill token, while one layer runs, about 4 D (residual, normed input, queries,
        attention output) + 2 Hkv Dh (keys, values) + 2 F (gate, up) activation values."""
        itemsize = np.dtype(cfg.compute_dtype).itemsize
        slot = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * itemsize
        token = (4 * cfg.dim + 2 * cfg.num_kv_heads * cfg.head_dim
                 + 2 * cfg.hidden_dim) * itemsize
        budget = fraction * device_bytes
        return {"cache_slots_budget": max(1024, int(budget // slot)),
                "prefill_tokens_budget": max(1024, int(budget // (slot + token)))}

    def _collective(self) -> bool:
        # Several processes over one mesh: every pass is one program of all of them.
        return self.mesh is not None and jax.process_count() > 1

    def _put(self, x: np.ndarray) -> jax.Array:
        """This process's rows of a pass input on the device(s): one process's whole pass,
        or under several processes its block of the global pass (rows over ("data",
        "fsdp"), assembled from every process's block: `parallel.put_process_rows`)."""
        if self.mesh is None:
            return jnp.asarray(x)
        if self._collective():
            return parallel.put_process_rows(x, self.mesh, x.shape[0] * jax.process_count())
        return parallel.put(x, parallel.batch_sharding(self.mesh))

    def _take(self, x: jax.Array) -> np.ndarray:
        """This process's rows of a pass output, as numpy (`_put`'s rows)."""
        if self._collective():
            return parallel.fetch_process_rows(x, parallel.batch_sharding(self.mesh))
        return parallel.fetch(x)

    def _tables(self, table: np.ndarray) -> tuple[list, int]:
        """(every process's int64[R_q, W_q] row-length table, this process's index) from
        this process's rows' table: one process's own, or gathered (`verifier_plan`)."""
        if self._collective():
            return verifier_plan.gather_row_lengths(table), jax.process_index()
        return [np.asarray(table, np.int64)], 0

    def _passes(self, tables: list, max_rows_of) -> list:
        """The passes over every process's rows, bucketed by column 0 of their tables."""
        return verifier_plan.plan_passes(
            [t[:, 0] for t in tables], bucket_of=lambda n: bucket_length(n, self.min_bucket),
            max_rows_of=max_rows_of, row_shards=self._row_shards)

    # ------------------------------------------------------------------ scoring

    def p_yes(self, params, prompts: Union[str, Sequence[str]], responses: Sequence[str],
              items: Items, history=None, *, shared_prefix: bool = True,
              calibration: str = "none", stats: Optional[dict] = None,
              process_rows: bool = False) -> np.ndarray:
        """P(yes) for every response and item (METHOD 11; `verdicts` turns it into v).

        Args:
            params: the verifier's params.
            prompts: one user request for all responses, or R of them.
            responses: R response strings.
            items: M criteria shared by all responses, or R lists (ragged allowed; "" is
                padding and is not scored).
            history: None, one history list for all, or R history lists
                ([{"role", "content"}, ...]).
            shared_prefix: True = prefix-sharing path, False = naive path (one full prompt
                per pair); both agree to ~1e-5.
            calibration: "none", or "contextual": every P(yes) is calibrated against the
                same item on the content-free response `verdicts.NULL_RESPONSE` for the
                same prompt (METHOD 12). That costs one extra prefix per distinct
                (prompt, history) and one suffix row per distinct item of it.
            stats: optional dict that counts prefix_cut, item_cut, prefixes, judgements
                (summed over the processes).
            process_rows: under several processes, False: every process passes the same
                R rows and gets all of them back, while each judges (tokenises, schedules,
                reads back) only its block of them (`parallel.process_share`) and the
                results are gathered; True: the rows are this process's own (R may differ
                between processes, or be 0) and so is the result. Either way every process
                must call at the same point: the passes are programs of all processes,
                planned from every process's row lengths (`verifier_plan`). One process:
                no difference.

        Returns:
            float32[R, M_max], M_max the longest item list; 0.0 at padding.

        Raises:
            ValueError: mismatched lengths, or a budget the template cannot meet.
        """
        prompts, histories, items = self._normalise(prompts, responses, items, history)
        if jax.process_count() > 1 and not process_rows:
            return judge_shares(
                lambda cols, st: self.p_yes(params, cols[0], cols[1], cols[2], cols[3],
                                            shared_prefix=shared_prefix,
                                            calibration=calibration, stats=st,
                                            process_rows=True),
                [prompts, list(responses), items, histories],
                max((len(x) for x in items), default=0), stats)
        # `_calibrated` calls back in with calibration "none", on the real and the null rows.
        if calibration == "contextual":
            return self._calibrated(params, prompts, list(responses), items, histories,
                                    shared_prefix, stats)
        if calibration != "none":
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
        r = len(responses)
        m_max = max((len(x) for x in items), default=0)
        out = np.zeros((r, m_max), np.float32)
        # Under several processes an empty share still takes part in every pass.
        if (r == 0 or m_max == 0) and not self._collective():
            return out
        prepared = [self.prepare(p, y, it, h, stats)
                    for p, y, it, h in zip(prompts, responses, items, histories)]
        add_count(stats, "prefixes", r)
        add_count(stats, "judgements", sum(1 for lst in items for s in lst if s.strip()))
        if shared_prefix:
            self._run_shared(params, prepared, out)
        else:
            # Naive path: one full prompt per real (response, item) pair.
            full = [(i, m, pre + suf) for i, (pre, sufs) in enumerate(prepared)
                    for m, suf in enumerate(sufs) if suf]
            values = self.p_yes_ids(params, [ids for _, _, ids in full], process_rows=True)
            for (i, m, _), v in zip(full, values):
                out[i, m] = v
        return out

    def _calibrated(self, params, prompts, responses, items, histories, shared_prefix,
                    stats) -> np.ndarray:
        """`p_yes` with contextual calibration: the null rows are appended to the same call
        (one per distinct (prompt, history), holding that prompt's distinct items)."""
        null_rows: dict = {}  # (prompt, history) -> {item: column}
        for p, h, lst in zip(prompts, histories, items):
            # JSON text makes the history (a list of dicts) part of a hashable key.
            cols = null_rows.setdefault((p, json.dumps(h, sort_keys=True)), {})
            for it in lst:
                if it.strip():
                    cols.setdefault(it, len(cols))
        keys = list(null_rows)
        # Each key's null row is appended after the R real rows.
        key_row = {k: len(prompts) + n for n, k in enumerate(keys)}
        null_hist = [json.loads(h) for _, h in keys]
        # One call: the null rows share the chunks and compiled shapes of the real ones.
        p_all = self.p_yes(params, prompts + [p for p, _ in keys],
                           responses + [NULL_RESPONSE] * len(keys),
                           items + [list(null_rows[k]) for k in keys], histories + null_hist,
                           shared_prefix=shared_prefix, stats=stats, process_rows=True)
        r = len(responses)
        out = np.zeros((r, max((len(x) for x in items), default=0)), np.float32)
        for i, (p, h, lst) in enumerate(zip(prompts, histories, items)):
            key = (p, json.dumps(h, sort_keys=True))
            row, cols = key_row[key], null_rows[key]
            for j, it in enumerate(lst):
                if it.strip():
                    out[i, j] = contextual_calibration(p_all[i, j], p_all[row, cols[it]])
        return out

    def _run_shared(self, params, prepared: list, out: np.ndarray) -> None:
        # Each row: its prefix's tokens, then each item suffix's (0: a blank item).
        table = np.zeros((len(prepared), 1 + out.shape[1]), np.int64)
        for i, (pre, sufs) in enumerate(prepared):
            table[i, 0] = len(pre)
            table[i, 1:1 + len(sufs)] = [len(x) for x in sufs]
        tables, me = self._tables(table)
        m_max = max(t.shape[1] for t in tables) - 1
        longest = max(int(t[:, 1:].max(initial=0)) for t in tables)
        if longest == 0:
            return
        # One suffix bucket for the whole call, set by the longest suffix.
        ts = passes.suffix_bucket(longest)

        def item_chunk(p):
            # Items per pass (a row's cache is repeated mc times) within the slot budget.
            return min(self.item_chunk, bucket_length(m_max, 1),
                       passes.pow2_floor(max(self.cache_slots_budget // (p + ts), 1)))

        def max_rows(p):
            # Rows within the prefill-token budget and the repeated cache's rc * mc x slots.
            return min(self.max_rows, passes.pow2_floor(max(self.prefill_tokens_budget // p, 1)),
                       passes.pow2_floor(max(self.cache_slots_budget
                                             // ((p + ts) * item_chunk(p)), 1)))

        for ps in self._passes(tables, max_rows):
            p, mc, chunk = ps.bucket, item_chunk(ps.bucket), ps.members[me]
            rc = ps.rows // len(tables)  # this process's rows of the pass
            tokens = np.full((rc, p), self.pad_id, np.int32)
            tmask = np.zeros((rc, p), bool)
            for j, i in enumerate(chunk):
                pre = prepared[i][0]
                tokens[j, p - len(pre):] = pre
                tmask[j, p - len(pre):] = True
            tmask[len(chunk):, -1] = True  # filler rows: one pad token
            cache, plen = passes.prefill(params, self.cfg, self._put(tokens),
                                         self._put(tmask), num_slots=p + ts)
            # The chunk's prefilled cache serves every item block (the prefix is computed once).
            for m0 in range(0, m_max, mc):
                # A block no row of the pass has an item in, on any process, is skipped.
                if not any(t[list(ms), 1 + m0:1 + m0 + mc].any()
                           for t, ms in zip(tables, ps.members)):
                    continue
                suf = np.full((rc, mc, ts), self.pad_id, np.int32)
                slen = np.zeros((rc, mc), np.int32)
                for j, i in enumerate(chunk):
                    for dm, x in enumerate(prepared[i][1][m0:m0 + mc]):
                        suf[j, dm, :len(x)] = x
                        slen[j, dm] = len(x)
                vals = self._take(passes.score_suffixes(
                    params, self.cfg, cache, plen, self._put(suf), self._put(slen),
                    self.yes_ids, self.no_ids))
                for j, i in enumerate(chunk):
                    for dm in range(max(min(mc, len(prepared[i][1]) - m0), 0)):
                        if slen[j, dm]:
                            out[i, m0 + dm] = vals[j, dm]

    def p_yes_ids(self, params, prompts_ids: Sequence[Sequence[int]], *,
                  process_rows: bool = False) -> np.ndarray:
        """P(yes) after each full token-id prompt (naive path and the direct judges; one
        pass per chunk).

        Args:
            params: the verifier's params.
            prompts_ids: N non-empty lists of token ids, each ending where the answer token
                is predicted (assistant turn opened).
            process_rows: as in `p_yes` (under several processes, False: the same N
                prompts on every process, each scores its block and the results are
                gathered; True: this process's own prompts).

        Returns:
            float32[N].

        Raises:
            ValueError: an empty prompt (named by its index).
        """
        if jax.process_count() > 1 and not process_rows:
            return judge_shares(
                lambda cols, _: self.p_yes_ids(params, cols[0], process_rows=True),
                [list(prompts_ids)], 1, None)[:, 0]
        n = len(prompts_ids)
        for i, ids in enumerate(prompts_ids):
            if not len(ids):
                raise ValueError(f"prompt {i} is empty")
        out = np.zeros((n,), np.float32)
        if n == 0 and not self._collective():
            return out
        table = np.array([[len(ids)] for ids in prompts_ids], np.int64).reshape(n, 1)
        tables, me = self._tables(table)
        for ps in self._passes(tables, lambda t: min(64, passes.pow2_floor(
                max(self.prefill_tokens_budget // t, 1)))):
            t, chunk, rows = ps.bucket, list(ps.members[me]), ps.rows // len(tables)
            tokens = np.full((rows, t), self.pad_id, np.int32)
            mask = np.zeros((rows, t), bool)
            for j, i in enumerate(chunk):
                ids = prompts_ids[i]
                tokens[j, t - len(ids):] = ids
                mask[j, t - len(ids):] = True
            mask[len(chunk):, -1] = True
            vals = self._take(passes.score_full(params, self.cfg, self._put(tokens),
                                                self._put(mask), self.yes_ids, self.no_ids))
            # Filler rows (mesh padding) are dropped.
            out[chunk] = vals[:len(chunk)]
        return out


def judge_shares(judge, columns: list, width: int, stats: Optional[dict] = None) -> np.ndarray:
    """Rows that every process holds alike, judged by each process for its share only.

    Each process takes its block of the R rows (`parallel.process_share`: padded with
    copies of the last row to a multiple of the process count), calls
    `judge(its columns, its stats) -> float32[R_p, <= width]` (a collective call, e.g.
    `Verifier.p_yes(process_rows=True)`), and the blocks are gathered in row order.

    Args:
        judge: the per-process judge (columns: lists of R_p entries, in `columns`' order).
        columns: equal-length lists of the R rows' fields (prompts, responses, ...).
        width: the result's columns (narrower results are zero-padded).
        stats: optional counters (`STATS`), summed over the processes.

    Returns:
        float32[R, width] on every process.
    """
    r = len(columns[0])
    if r == 0:
        return np.zeros((0, width), np.float32)
    _, mine = parallel.process_share(*columns)
    local_stats: Optional[dict] = {} if stats is not None else None
    got = np.asarray(judge(mine, local_stats), np.float32).reshape(len(mine[0]), -1)
    got = np.pad(got, ((0, 0), (0, width - got.shape[1])))
    if stats is not None:
        summed = parallel.gather_rows(np.array([[local_stats.get(k, 0) for k in STATS]],
                                               np.int64)).sum(axis=0)
        for k, n in zip(STATS, summed):
            add_count(stats, k, int(n))
    # Every process's block has the same row count (process_share pads with copies).
    return parallel.gather_rows(got)[:r]
