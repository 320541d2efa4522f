"""Seeded arguments for a check, for data generation.

The library draws missing arguments from Python's global `random`; here every choice comes
from the caller's `numpy.random.Generator`, so a dataset is a function of its seed. The
ranges follow IFEval's `instructions.py` constants (table.py lists them per argument),
except that `nth_paragraph` is drawn from 1..num_paragraphs (IFEval's own draw can fall one
past the last paragraph, an item no response can meet).
"""
from __future__ import annotations

import numpy as np

from drubric_jax.checks.table import CHECKS, WORD_LIST
from drubric_jax.checks.verify import InvalidCheck, NotScorable

_N_KEYWORDS = 2  # IFEval's _NUM_KEYWORDS


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _words(rng: np.random.Generator, k: int) -> list:
    return [WORD_LIST[i] for i in rng.choice(len(WORD_LIST), size=k, replace=False)]


def draw_args(check: str, rng: np.random.Generator, prompt: str | None = None) -> dict:
    """Arguments for `check` drawn from `rng` (each valid for `validate`).

    Args:
        check: a scorable instruction id (`table.SCORABLE_CHECKS`).
        rng: the only source of randomness.
        prompt: the prompt the item is attached to; required by a check whose argument is
            the prompt itself (`combination:repeat_prompt`).

    Returns:
        {argument name: value} (ints, strs, lists of str).

    Raises:
        InvalidCheck: unknown id, or a check that needs `prompt` without one.
        NotScorable: a check that cannot be scored here (a generator must not emit it).
    """
    spec = CHECKS.get(check)
    if spec is None:
        raise InvalidCheck(check, "check", "not one of the 25 IFEval instruction ids")
    if not spec.scorable:
        raise NotScorable(check, "check", f"not scorable on this machine: {spec.reason}")
    out = {}
    for a in spec.args:
        if a.name == "prompt_to_repeat":
            if not prompt:
                raise InvalidCheck(check, "prompt_to_repeat", "draw_args needs the prompt")
            out[a.name] = prompt
        elif a.name == "nth_paragraph":
            out[a.name] = int(rng.integers(1, out["num_paragraphs"] + 1))
        elif a.kind == "int":
            out[a.name] = int(rng.integers(a.draw[0], a.draw[1] + 1))
        elif a.kind == "choice":
            out[a.name] = _pick(rng, a.choices)
        elif a.kind == "str_list":
            out[a.name] = _words(rng, _N_KEYWORDS)
        elif a.name == "letter":
            out[a.name] = _pick(rng, "abcdefghijklmnopqrstuvwxyz")
        elif a.draw:
            out[a.name] = _pick(rng, a.draw)
        else:  # keyword, first_word: one word of IFEval's pool
            out[a.name] = _words(rng, 1)[0]
    return out
