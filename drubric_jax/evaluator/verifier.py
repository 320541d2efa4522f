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

`Verifier` is a composition of parts with one job each: the texts are normalised, rendered,
fitted and tokenised by a `verifier_prompts.VerifierText`; token ids become passes in a
`chunked.ChunkedPasses`, whose token buckets and rows and items per pass come from a
`budgets.PassBudgets` (the memory planner uses the same object), whose rows are scheduled
by `schedule.plan_passes` and live where a `placement.RowPlacement` puts them (one process
or all of them), and whose jitted functions are `passes`. Shapes are bucketed so a new
text length reuses a compiled program.
Under several processes (`jax.distributed`) each process tokenises and schedules only its
own rows, and every pass is one program over all processes' rows (`p_yes(process_rows=)`;
rows every process holds alike are split by `shares.judge_shares`). Contextual calibration
(METHOD 12, `calibration`) appends one content-free row per prompt to the same call.

Counters (cut prefixes and items, prefixes, judgements: `counters.STATS`) go into a dict
the caller passes as `stats=` (nothing is kept on the object between calls).

Axis legend (drubric_jax/types.py): R (prompt, response) pairs, M rubric items, P prefix
tokens (bucket), S cache slots, V vocab, T full-prompt tokens; here also Mc items per
pass, Ts suffix tokens (bucket).
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax.evaluator.budgets import DEFAULT_BUDGETS, PassBudgets
from drubric_jax.evaluator.calibration import contextual_p_yes
from drubric_jax.evaluator.chunked import ChunkedPasses
from drubric_jax.evaluator.counters import add_count
from drubric_jax.evaluator.placement import RowPlacement
from drubric_jax.evaluator.shares import judge_shares
from drubric_jax.evaluator.verdicts import CALIBRATIONS, yes_no_token_ids
from drubric_jax.evaluator.verifier_prompts import VerifierText, normalise_queries
from drubric_jax.models.config import ModelConfig

Items = Union[Sequence[str], Sequence[Sequence[str]]]


class Verifier:
    """Frozen yes/no verifier with prefix sharing (METHOD 1, 11; scores feed Eq. 12-15).

    Args:
        cfg: the verifier model's config (params are passed to each call).
        tokenizer: its tokenizer; the chat template renders the prompt (a tokenizer without
            one uses `text.prompts.plain_render`).
        max_prefix_tokens: budget of [instructions + request (+ history) + response]; longer
            texts are cut by `text.budget.fit_prompt` with the visible `TRUNCATION_MARKER`.
        max_suffix_tokens: budget of one item suffix (criterion + question + assistant
            opener); longer criteria are cut the same way.
        cache_slots_budget, prefill_tokens_budget, max_rows, item_chunk, min_bucket: the
            pass sizes (`budgets.PassBudgets`; defaults there).
        mesh: optional device mesh: the rows of every pass are split over its
            ("data", "fsdp") axes (each chunk padded to a multiple of data x fsdp); the
            params should be on the same mesh (`models.param_shardings`).

    Raises:
        ValueError: a budget < 16 tokens, or the tokenizer has no yes/no tokens.
    """

    def __init__(self, cfg: ModelConfig, tokenizer, max_prefix_tokens: int = 2048,
                 max_suffix_tokens: int = 128, *,
                 cache_slots_budget: int = DEFAULT_BUDGETS.cache_slots_budget,
                 prefill_tokens_budget: int = DEFAULT_BUDGETS.prefill_tokens_budget,
                 max_rows: int = DEFAULT_BUDGETS.max_rows,
                 item_chunk: int = DEFAULT_BUDGETS.item_chunk,
                 min_bucket: int = DEFAULT_BUDGETS.min_bucket, mesh=None):
        self.text = VerifierText(tokenizer, max_prefix_tokens, max_suffix_tokens)
        self.cfg = cfg
        chunking = PassBudgets(int(cache_slots_budget), int(prefill_tokens_budget),
                               int(max_rows), int(item_chunk), int(min_bucket))
        # Found from the tokenizer, never hard-coded (METHOD 11).
        yes, no = yes_no_token_ids(tokenizer)
        # Any id will do for padding: padded positions are masked out.
        pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.runner = ChunkedPasses(cfg, chunking, RowPlacement(mesh), pad_id,
                                    jnp.asarray(yes), jnp.asarray(no))

    # The text side's names, as callers (judges, verifier_check) read them.
    @property
    def tokenizer(self):
        return self.text.tokenizer

    @property
    def max_prefix_tokens(self) -> int:
        return self.text.max_prefix_tokens

    @property
    def max_suffix_tokens(self) -> int:
        return self.text.max_suffix_tokens

    @property
    def mesh(self):
        return self.runner.placement.mesh

    @property
    def chunking(self) -> PassBudgets:
        return self.runner.chunking

    def render(self, messages: Sequence[dict]) -> str:
        """Chat-template text of `messages` with the assistant turn opened."""
        return self.text.render(messages)

    def prepare(self, prompt: str, response: str, items: Sequence[str], history=None,
                stats: Optional[dict] = None) -> tuple[list, list]:
        """(prefix ids, suffix ids per item) of one response: `VerifierText.prepare`."""
        return self.text.prepare(prompt, response, items, history, stats)

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
                same prompt (METHOD 12, `calibration`). That costs one extra prefix per
                distinct (prompt, history) and one suffix row per distinct item of it.
            stats: optional dict that counts prefix_cut, item_cut, prefixes, judgements
                (summed over the processes), and for a mixture-of-experts verifier the
                router load of the call's first pass (`counters.LOAD_COUNTS`).
            process_rows: under several processes, False: every process passes the same
                R rows and gets all of them back, while each judges (tokenises, schedules,
                reads back) only its block of them (`parallel.process_share`) and the
                results are gathered; True: the rows are this process's own (R may differ
                between processes, or be 0) and so is the result. Either way every process
                must call at the same point: the passes are programs of all processes,
                planned from every process's row lengths (`schedule`). One process: no
                difference.

        Returns:
            float32[R, M_max], M_max the longest item list; 0.0 at padding.

        Raises:
            ValueError: mismatched lengths, or a budget the template cannot meet.
        """
        prompts, histories, items = normalise_queries(prompts, responses, items, history)
        if jax.process_count() > 1 and not process_rows:
            return judge_shares(
                lambda cols, st: self.p_yes(params, cols[0], cols[1], cols[2], cols[3],
                                            shared_prefix=shared_prefix,
                                            calibration=calibration, stats=st,
                                            process_rows=True),
                [prompts, list(responses), items, histories],
                max((len(x) for x in items), default=0), stats)
        if calibration == "contextual":
            # The real and the null rows in one uncalibrated call.
            return contextual_p_yes(
                lambda p, y, it, h: self.p_yes(params, p, y, it, h,
                                               shared_prefix=shared_prefix, stats=stats,
                                               process_rows=True),
                prompts, list(responses), items, histories)
        if calibration != "none":
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
        num_rows, num_items = len(responses), max((len(x) for x in items), default=0)
        out = np.zeros((num_rows, num_items), np.float32)
        # Under several processes an empty share still takes part in every pass.
        if (num_rows == 0 or num_items == 0) and not self.runner.placement.collective:
            return out
        prepared = [self.text.prepare(p, y, it, h, stats)
                    for p, y, it, h in zip(prompts, responses, items, histories)]
        add_count(stats, "prefixes", num_rows)
        add_count(stats, "judgements", sum(1 for lst in items for s in lst if s.strip()))
        if shared_prefix:
            self.runner.shared(params, prepared, out, stats)
        else:
            # Naive path: one full prompt per real (response, item) pair.
            full = [(i, m, pre + suf) for i, (pre, sufs) in enumerate(prepared)
                    for m, suf in enumerate(sufs) if suf]
            values = self.p_yes_ids(params, [ids for _, _, ids in full], process_rows=True,
                                    stats=stats)
            for (i, m, _), v in zip(full, values):
                out[i, m] = v
        return out

    def p_yes_ids(self, params, prompts_ids: Sequence[Sequence[int]], *,
                  process_rows: bool = False, stats: Optional[dict] = None) -> np.ndarray:
        """P(yes) after each full token-id prompt (naive path and the direct judges; one
        pass per chunk).

        Args:
            params: the verifier's params.
            prompts_ids: N non-empty lists of token ids, each ending where the answer token
                is predicted (assistant turn opened).
            process_rows: as in `p_yes` (under several processes, False: the same N
                prompts on every process, each scores its block and the results are
                gathered; True: this process's own prompts).
            stats: optional dict: a mixture-of-experts verifier's router load of the first
                pass (`counters.LOAD_COUNTS`).

        Returns:
            float32[N].

        Raises:
            ValueError: an empty prompt (named by its index).
        """
        if jax.process_count() > 1 and not process_rows:
            return judge_shares(
                lambda cols, st: self.p_yes_ids(params, cols[0], process_rows=True,
                                                stats=st),
                [list(prompts_ids)], 1, stats)[:, 0]
        for i, ids in enumerate(prompts_ids):
            if not len(ids):
                raise ValueError(f"prompt {i} is empty")
        # Under several processes an empty share still takes part in every pass.
        if not len(prompts_ids) and not self.runner.placement.collective:
            return np.zeros((0,), np.float32)
        return self.runner.full(params, prompts_ids, stats)
