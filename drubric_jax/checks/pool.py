"""Check variants and the calibrated pool of world v2 (METHOD 13; issue 40).

A *variant* is one check id with its argument ranges narrowed: e.g.
`length_constraints:number_words[relation=less than,num_words=20..40]`. World v1 drew every
check with IFEval's own ranges, about half of which a 135M policy at a 64-token answer
budget either always meets ("less than 300 words"), never can ("at least 400 words",
Swahili) or cannot see. World v2 draws only from a *calibrated pool*: the variants whose
pass rate under P_0 at the training temperature lies in a band
(`experiments/calibrate_checks.py` measures it and writes the table that `load_pool` reads).

`CANDIDATES` are the variants the calibration measures. A variant's `ranges` map an argument
to an inclusive int range [lo, hi] or to one fixed value; arguments it does not name are
drawn as `draw.draw_args` draws them (IFEval's ranges). `combination:repeat_prompt` is left
out: its argument is the whole prompt, which the generator's JSON schema caps at 200
characters and which a 64-token answer cannot repeat.

Every random choice comes from the caller's `numpy.random.Generator`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping, Sequence

import numpy as np

from drubric_jax.checks.draw import draw_args
from drubric_jax.checks.table import CHECKS

POOL_VERSION = 1  # of the table format `load_pool` reads


@dataclasses.dataclass(frozen=True)
class Variant:
    """A check id with narrowed argument ranges.

    Attributes:
        check: an IFEval instruction id (`table.CHECKS`).
        ranges: ((argument name, value), ...): value is a (lo, hi) int pair (inclusive
            range drawn uniformly) or a fixed value (str, int, list of str).
    """
    check: str
    ranges: tuple = ()

    @property
    def label(self) -> str:
        """`check[arg=value,arg=lo..hi]`, or the bare check id when nothing is narrowed."""
        if not self.ranges:
            return self.check
        parts = []
        for name, v in self.ranges:
            shown = f"{v[0]}..{v[1]}" if _is_range(v) else str(v)
            parts.append(f"{name}={shown}")
        return f"{self.check}[{','.join(parts)}]"

    def draw(self, rng: np.random.Generator, prompt: str | None = None) -> dict:
        """Arguments for this variant: `draw_args`, then each narrowed argument drawn from
        its range (or set to its fixed value). `nth_paragraph` is redrawn within the
        narrowed `num_paragraphs` when only the latter is narrowed.

        Raises:
            InvalidCheck / NotScorable: as `draw_args`.
        """
        args = draw_args(self.check, rng, prompt=prompt)
        for name, v in self.ranges:
            args[name] = int(rng.integers(v[0], v[1] + 1)) if _is_range(v) else v
        named = dict(self.ranges)
        if "nth_paragraph" in args and "nth_paragraph" not in named:
            args["nth_paragraph"] = int(rng.integers(1, args["num_paragraphs"] + 1))
        return args


def matches(variant: Variant, check: str, args: Mapping) -> bool:
    """Whether (check, args) is a draw of `variant`: the same id, each narrowed argument
    inside its range or equal to its fixed value."""
    if check != variant.check:
        return False
    for name, v in variant.ranges:
        if name not in args:
            return False
        ok = (v[0] <= args[name] <= v[1]) if _is_range(v) else args[name] == v
        if not ok:
            return False
    return True


def label_of(check: str, args: Mapping, variants: Sequence[Variant] | None = None) -> str:
    """The label of the first of `variants` (default `CANDIDATES`) that (check, args) is a
    draw of, else the check id."""
    for v in (CANDIDATES if variants is None else variants):
        if matches(v, check, args):
            return v.label
    return check


def _is_range(v) -> bool:
    return isinstance(v, (tuple, list)) and len(v) == 2 and all(
        isinstance(x, int) and not isinstance(x, bool) for x in v)


def _v(check, **ranges) -> Variant:
    if check not in CHECKS:
        raise ValueError(f"unknown check id {check!r}")
    bad = set(ranges) - set(CHECKS[check].arg_names)
    if bad:
        raise ValueError(f"{check}: no argument(s) {sorted(bad)}")
    return Variant(check, tuple(sorted(ranges.items())))


# What the calibration measures: every scorable id but repeat_prompt, with ranges that a
# short answer can meet split from those it cannot (the "less than" / "at least" sides apart).
CANDIDATES = (
    _v("change_case:english_lowercase"),
    _v("change_case:english_capital"),
    _v("change_case:capital_word_frequency", capital_relation="at least",
       capital_frequency=(1, 3)),
    _v("change_case:capital_word_frequency", capital_relation="less than",
       capital_frequency=(1, 3)),
    _v("punctuation:no_comma"),
    _v("keywords:existence"),
    _v("keywords:frequency", relation="at least", frequency=(1, 3)),
    _v("keywords:frequency", relation="less than", frequency=(1, 3)),
    _v("keywords:forbidden_words"),
    _v("keywords:letter_frequency", let_relation="at least", let_frequency=(3, 10)),
    _v("keywords:letter_frequency", let_relation="less than", let_frequency=(1, 5)),
    _v("language:response_language"),
    _v("length_constraints:number_sentences", relation="less than", num_sentences=(2, 4)),
    _v("length_constraints:number_sentences", relation="at least", num_sentences=(3, 6)),
    _v("length_constraints:number_paragraphs", num_paragraphs=(2, 3)),
    _v("length_constraints:number_words", relation="less than", num_words=(20, 40)),
    _v("length_constraints:number_words", relation="at least", num_words=(20, 40)),
    _v("length_constraints:nth_paragraph_first_word", num_paragraphs=1, nth_paragraph=1),
    _v("detectable_content:number_placeholders", num_placeholders=(1, 2)),
    _v("detectable_content:postscript"),
    _v("detectable_format:number_bullet_lists", num_bullets=(2, 4)),
    _v("detectable_format:constrained_response"),
    _v("detectable_format:number_highlighted_sections", num_highlights=(1, 2)),
    _v("detectable_format:multiple_sections", num_sections=(2, 3)),
    _v("detectable_format:json_format"),
    _v("detectable_format:title"),
    _v("combination:two_responses"),
    _v("startend:end_checker"),
    _v("startend:quotation"),
)
CANDIDATE_BY_LABEL = {v.label: v for v in CANDIDATES}


def variant_of(label: str) -> Variant:
    """The candidate variant with this label.

    Raises:
        KeyError: no candidate has it (names the label).
    """
    if label not in CANDIDATE_BY_LABEL:
        raise KeyError(f"{label!r} is not a candidate variant (checks.pool.CANDIDATES)")
    return CANDIDATE_BY_LABEL[label]


def kept_labels(rates: Mapping[str, float], band: Sequence[float]) -> list:
    """The labels whose pass rate lies in [band[0], band[1]] (inclusive), in candidate order.

    Raises:
        ValueError: band not 0 <= lo <= hi <= 1.
    """
    lo, hi = float(band[0]), float(band[1])
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"band must satisfy 0 <= lo <= hi <= 1, got {band}")
    return [v.label for v in CANDIDATES if v.label in rates and lo <= rates[v.label] <= hi]


def load_pool(path: str) -> list:
    """The kept variants of a calibration table (the JSON that `experiments.calibrate_checks`
    writes beside its Markdown table).

    The file is {"version": 1, "band": [lo, hi], "kept": [label, ...], "rows": [...], ...};
    only "version" and "kept" are read here.

    Returns:
        list[Variant], in the file's order (>= 1).

    Raises:
        FileNotFoundError: no such file (names the command that writes it).
        ValueError: a malformed file, an unknown version or label, or an empty pool (each
            names the file and the field or entry).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path}: no calibration table; write it with `python -m "
            f"experiments.calibrate_checks --out={os.path.dirname(path) or '.'}`")
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(table, dict) or table.get("version") != POOL_VERSION:
        raise ValueError(f"{path}: field 'version' must be {POOL_VERSION}, got "
                         f"{table.get('version') if isinstance(table, dict) else table!r}")
    kept = table.get("kept")
    if not isinstance(kept, list) or not kept:
        raise ValueError(f"{path}: field 'kept' must be a non-empty list of variant labels, "
                         f"got {kept!r}")
    out = []
    for i, label in enumerate(kept):
        try:
            out.append(variant_of(label))
        except KeyError as e:
            raise ValueError(f"{path}: field 'kept' entry {i}: {e.args[0]}") from None
    return out
