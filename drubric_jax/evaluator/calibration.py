"""Contextual calibration of the verifier's P(yes) (METHOD 12; Zhao et al. 2021).

Every P(yes) of (prompt x, response y, item) is calibrated against the same item on the
content-free response `verdicts.NULL_RESPONSE` for the same (x, history):
`verdicts.contextual_calibration`. The null rows, one per distinct (prompt, history),
holding that prompt's distinct items, are appended to the SAME verifier call as the real
rows, so they share its chunks and compiled shapes.

Axis legend (drubric_jax/types.py): R (prompt, response) rows, M rubric items.
"""
from __future__ import annotations

import json
from typing import Callable

import numpy as np

from drubric_jax.evaluator.verdicts import NULL_RESPONSE, contextual_calibration


def _key(prompt: str, history) -> tuple:
    # JSON text makes the history (a list of dicts) part of a hashable key.
    return prompt, json.dumps(history, sort_keys=True)


def contextual_p_yes(p_yes: Callable, prompts: list, responses: list, items: list,
                     histories: list) -> np.ndarray:
    """Calibrated P(yes) of every real (row, item), from one call of `p_yes`.

    Args:
        p_yes: (prompts, responses, items, histories) -> float32[R', M'] raw P(yes) (the
            uncalibrated verifier call; R' = R + the null rows).
        prompts, responses, histories: R entries each; items: R lists of item texts
            ("" or blank = padding).

    Returns:
        float32[R, M_max], M_max the longest item list; 0.0 at padding.
    """
    null_rows: dict = {}  # (prompt, history) -> {item: column}
    for p, h, lst in zip(prompts, histories, items):
        cols = null_rows.setdefault(_key(p, h), {})
        for it in lst:
            if it.strip():
                cols.setdefault(it, len(cols))
    keys = list(null_rows)
    # Each key's null row is appended after the R real rows.
    key_row = {k: len(prompts) + n for n, k in enumerate(keys)}
    p_all = p_yes(prompts + [p for p, _ in keys], responses + [NULL_RESPONSE] * len(keys),
                  items + [list(null_rows[k]) for k in keys],
                  histories + [json.loads(h) for _, h in keys])
    out = np.zeros((len(responses), max((len(x) for x in items), default=0)), np.float32)
    for i, (p, h, lst) in enumerate(zip(prompts, histories, items)):
        key = _key(p, h)
        row, cols = key_row[key], null_rows[key]
        for m, it in enumerate(lst):
            if it.strip():
                out[i, m] = contextual_calibration(p_all[i, m], p_all[row, cols[it]])
    return out
