"""The verifier of checkable items (`verifier.kind = "checks"`, METHOD 13): P(yes) is the
checker's verdict, exactly 0 or 1.

An item is a check with arguments, written in a `RubricBatch` as its canonical text
(`check_rubrics.item_text`). Its verdict on a response is IFEval's checker's (Zhou et al.
2023, arXiv:2311.07911; `checks.verdicts`, strict, or loose with `loose=True`), so Eq. 12-15,
the verdict modes of METHOD 12 (hard: 1[1 > 0.5] = 1; soft: the value itself) and every
metric downstream apply unchanged. No model is loaded: the checks run on the host, in the
kept process pool of `checks.batch`.

`ChecksVerifier.p_yes` takes `Verifier.p_yes`'s arguments (params and the prompts are not
read: a check sees the response only).

Axis legend (docs/CONVENTIONS.md): R (prompt, response) rows, M items.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from drubric_jax import checks
from drubric_jax.evaluator.check_rubrics import item_of_text
from drubric_jax.evaluator.counters import add_count
from drubric_jax.evaluator.verifier_prompts import normalise_queries


class ChecksVerifier:
    """P(yes) in {0, 1} of checkable items (module docstring).

    Args:
        loose: IFEval's loose verdict (the response also passes if a variant without its
            first / last line or without "*" passes) instead of the strict one.
        workers: the checks' process pool size (None or 0: the CPU count; 1: inline).
    """

    kind = "checks"

    def __init__(self, loose: bool = False, workers: Optional[int] = None):
        self.loose = bool(loose)
        self.workers = int(workers) if workers else None

    def p_yes(self, params, prompts, responses, items, history=None, *,
              shared_prefix: bool = True, calibration: str = "none",
              stats: Optional[dict] = None, process_rows: bool = False) -> np.ndarray:
        """v[r, m] = 1.0 when item m of row r's list accepts response r (METHOD 13).

        Args:
            params: ignored (no model); prompts, history: checked for their lengths only.
            responses: R response strings.
            items: M item texts shared by all responses, or R lists of them (ragged; ""
                is padding and scores 0).
            shared_prefix, process_rows: ignored (every process computes the rows it is
                given; nothing is collective).
            calibration: must be "none" (P(yes) is exact; `config_check` refuses the rest).
            stats: optional dict counting "prefixes" (rows) and "judgements" (real pairs).

        Returns:
            float32[R, M_max] of 0.0 / 1.0, M_max the longest item list; 0.0 at padding.

        Raises:
            ValueError: mismatched lengths, a non-string item, or calibration != "none".
            checks.InvalidCheck: an item text that is not a valid check (the parser keeps
                only valid ones, so this is a caller's error).
        """
        del params, shared_prefix, process_rows
        if calibration != "none":
            raise ValueError(f"checks verifier: calibration must be 'none', got {calibration!r}")
        _, _, items = normalise_queries(prompts, responses, items, history)
        r, m = len(responses), max((len(x) for x in items), default=0)
        out = np.zeros((r, m), np.float32)
        # Rows with the same item list (a prompt's K responses, an input's set) share a call.
        groups: dict = {}
        for i, lst in enumerate(items):
            groups.setdefault(tuple(lst), []).append(i)
        for lst, rows in groups.items():
            real = sorted({t for t in lst if t})
            if not real:
                continue
            v = checks.verdicts([item_of_text(t) for t in real], [responses[i] for i in rows],
                                loose=self.loose, workers=self.workers)     # [R_g, U]
            col = {t: j for j, t in enumerate(real)}
            for m_idx, t in enumerate(lst):
                if t:
                    out[rows, m_idx] = v[:, col[t]]
        add_count(stats, "prefixes", r)
        add_count(stats, "judgements", sum(1 for lst in items for t in lst if t))
        return out
