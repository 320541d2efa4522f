"""Verifier check: does P(yes) follow criteria whose truth is known by construction?

The verifier (METHOD 1, 11) is asked yes/no items about REAL responses; the text of each
response decides each item's truth, so no annotator is needed:

    family    true item (of the response y)                 false item
    language  The response is written in English.           ... written entirely in French.
    word      The response contains the word "X".           "Z" (a word y lacks)
    length    The response is at most N words long (N >= 2n)    N <= n / 2
    list      contains a numbered or bulleted list          (truth: >= 2 `LIST_LINE` lines)

with n the whitespace word count, X a word of y, Z a word of another response that is not
even a substring of y, and the negation of each ("is not written in French", "does not
contain the word", "is longer than N words", "does not contain a ... list"), whose truth
flips. Each family gives every response as many true items as false ones.

Responses are kept only where the truth is unambiguous: English prose (ASCII letters,
English function words, no French ones, no code block), 25..150 words (every threshold
is a round number at least a factor 2 from n), and for the list family either >= 2 list
lines or none. The verifier must see the whole response: a cut prefix raises.

`summarise` reports per family, per polarity and overall: AUC of P(yes) between true and
false items (Mann-Whitney, ties half; `metrics.auc`), the yes-rate (P > 0.5), the mean
P(yes), and the accuracy of hard verdicts without and with contextual calibration
(METHOD 12); the overall AUC gets a crossed bootstrap CI that resamples responses and
item templates (the 10 phrasings every response is asked, word and number blanked).

Axis legend (docs/CONVENTIONS.md): here Y responses checked, I items (all responses).
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from drubric_jax.evaluation import intervals, metrics
from drubric_jax.evaluation.judges import p_yes_raw_and_contextual

FAMILIES = ("language", "word", "length", "list")
LIST_LINE = re.compile(r"^[ \t]*(?:\d{1,2}[.)]|[-*\u2022+])[ \t]+\S", re.MULTILINE)
MIN_WORDS, MAX_WORDS = 25, 150
_ENGLISH = frozenset("the a an and or of to in is are for on with that this it as be by".split())
_FRENCH = frozenset("le la les des est une et du que pour dans sont avec pas".split())
_WORD = re.compile(r"[A-Za-z]{5,}")
_TEMPLATE = re.compile(r'"[^"]*"|\d+')  # what varies between items of one phrasing
_STOP = frozenset("about after again being below could every first other their there these "
                  "those through under until where which while would should".split())


@dataclasses.dataclass(frozen=True)
class Item:
    """One check item: `text` asked of response `response`; `truth` holds by construction."""

    response: int  # index into the checked responses
    family: str    # one of FAMILIES
    negated: bool  # the negated form of the family's statement
    text: str
    truth: bool


def word_count(text: str) -> int:
    """n, the number of whitespace-separated words."""
    return len(text.split())


def list_lines(text: str) -> int:
    """Lines that open a numbered ("1.", "2)") or bulleted ("-", "*", "+", bullet) item."""
    return len(LIST_LINE.findall(text))


def is_english_prose(text: str) -> bool:
    """True for text whose language is English beyond doubt: every letter ASCII, >= 15%
    English function words, < 2% French ones, and no code block."""
    if "```" in text or any(c.isalpha() and not c.isascii() for c in text):
        return False
    words = re.findall(r"[a-z]+", text.lower())
    if not words:
        return False
    en = sum(w in _ENGLISH for w in words) / len(words)
    fr = sum(w in _FRENCH for w in words) / len(words)
    return en >= 0.15 and fr < 0.02


def usable(text: str) -> bool:
    """The response can carry every family's items with their truth unambiguous."""
    n = word_count(text)
    return (MIN_WORDS <= n <= MAX_WORDS and is_english_prose(text) and list_lines(text) != 1
            and len(_words(text)) >= 2)


def _words(text: str) -> list:
    return sorted({w for w in _WORD.findall(text) if w.lower() not in _STOP})


def build_items(responses, seed: int) -> list:
    """The check items of `responses` (each `usable`), seeded.

    Args:
        responses: Y response strings.
        seed: numpy seed of the word and polarity draws.

    Returns:
        list of `Item`; per response 4 language, 4 word, 4 length and 2 list items, half
        of each family true.

    Raises:
        ValueError: a response that is not `usable`, or too few other responses to
            draw 2 words a response lacks from.
    """
    if len(responses) < 2:
        raise ValueError(f"need >= 2 responses, got {len(responses)}")
    for r, y in enumerate(responses):
        if not usable(y):
            raise ValueError(f"response {r} is not usable for the check: {y[:80]!r}")
    rng = np.random.default_rng(seed)
    vocab = [_words(y) for y in responses]
    items = []
    for r, y in enumerate(responses):
        def add(family, negated, text, truth):
            items.append(Item(r, family, negated, text, truth))

        add("language", False, "The response is written in English.", True)
        add("language", False, "The response is written entirely in French.", False)
        add("language", True, "The response is not written in French.", True)
        add("language", True, "The response is not written in English.", False)
        low = y.lower()
        pool = sorted({w for i, v in enumerate(vocab) if i != r for w in v
                       if w.lower() not in low})
        if len(pool) < 2:
            raise ValueError(f"the other responses have < 2 words absent from response {r}")
        present = rng.choice(vocab[r], 2, replace=False)
        absent = rng.choice(pool, 2, replace=False)
        add("word", False, f'The response contains the word "{present[0]}".', True)
        add("word", False, f'The response contains the word "{absent[0]}".', False)
        add("word", True, f'The response does not contain the word "{absent[1]}".', True)
        add("word", True, f'The response does not contain the word "{present[1]}".', False)
        n = word_count(y)
        hi = 10 * math.ceil(2 * n / 10)    # >= 2n
        lo = 10 * math.floor(n / 20)       # <= n / 2, >= 10 since n >= 25
        add("length", False, f"The response is at most {hi} words long.", True)
        add("length", False, f"The response is at most {lo} words long.", False)
        add("length", True, f"The response is longer than {lo} words.", True)
        add("length", True, f"The response is longer than {hi} words.", False)
        has = list_lines(y) >= 2
        add("list", False, "The response contains a numbered or bulleted list.", has)
        add("list", True, "The response does not contain a numbered or bulleted list.", not has)
    return items


def select_responses(records, n: int, seed: int) -> list:
    """Up to n (prompt, response) pairs whose responses are `usable`, seeded (n = 0: all).

    Args:
        records: `data.Record`s; their `reference` (prompt-only rows) and `responses` are
            the candidates, each with its record's prompt.
        n: most pairs returned.
        seed: numpy seed of the draw.

    Returns:
        list of (prompt, response), distinct responses, in draw order.
    """
    seen, cands = set(), []
    for rec in records:
        for y in ([rec.reference] if rec.reference else []) + list(rec.responses):
            if y not in seen and usable(y):
                seen.add(y)
                cands.append((rec.prompt, y))
    order = np.random.default_rng(seed).permutation(len(cands))
    return [cands[i] for i in order[:n or None]]


def fitting(verifier, pairs, n: int) -> list:
    """The first n of `pairs` whose verifier prefix (instructions + prompt + response) fits
    the verifier's budget uncut (`Verifier.prepare` counts cuts; tokenisation only)."""
    out = []
    for prompt, y in pairs:
        if len(out) == n:
            break
        stats = {}
        verifier.prepare(prompt, y, [], None, stats)
        if not stats.get("prefix_cut", 0):
            out.append((prompt, y))
    return out


def ask(verifier, params, pairs, items, stats=None):
    """(raw, calibrated) P(yes) float32[I] of every item, from one verifier pass.

    Each response is judged under its own prompt; its content-free row (METHOD 12) uses
    that prompt and the response's items.

    Raises:
        ValueError: the verifier's budget cut a response or an item (its truth would no
            longer be known).
    """
    per = [[it for it in items if it.response == r] for r in range(len(pairs))]
    stats = {} if stats is None else stats
    raw, cal = p_yes_raw_and_contextual(
        verifier, params, [p for p, _ in pairs], [y for _, y in pairs],
        [[it.text for it in lst] for lst in per], [[] for _ in pairs],
        list(range(len(pairs))), True, stats)
    if stats.get("prefix_cut", 0) or stats.get("item_cut", 0):
        raise ValueError(f"the verifier budget cut {stats.get('prefix_cut', 0)} responses and "
                         f"{stats.get('item_cut', 0)} items; raise max_prefix_tokens")
    index = {id(it): (r, m) for r, lst in enumerate(per) for m, it in enumerate(lst)}
    at = np.array([index[id(it)] for it in items])
    return raw[at[:, 0], at[:, 1]], cal[at[:, 0], at[:, 1]]


def _stats(truth, p, p_cal) -> dict:
    hard, hard_cal = p > 0.5, p_cal > 0.5
    return {"n_items": int(truth.size), "auc": metrics.auc(p, truth),
            "auc_ctx": metrics.auc(p_cal, truth), "yes_rate": float(hard.mean()),
            "yes_rate_ctx": float(hard_cal.mean()), "mean_p_yes": float(p.mean()),
            "acc_hard": float((hard == truth).mean()),
            "acc_hard_ctx": float((hard_cal == truth).mean())}


def summarise(items, p, p_cal, n_boot: int = intervals.N_BOOTSTRAP, seed: int = 0) -> dict:
    """Per-group statistics of the check and the overall AUC's bootstrap CI.

    Args:
        items: I `Item`s; p, p_cal: float[I] raw and calibrated P(yes).
        n_boot: bootstrap replicates; seed: their seed.

    Returns:
        {"groups": {name: stats}, "auc_ci95": [lo, hi], "n_responses": Y, "n_templates": T};
        groups are the FAMILIES, "affirmative", "negated" and "overall"; stats hold
        n_items, auc, auc_ctx, yes_rate, yes_rate_ctx, mean_p_yes, acc_hard, acc_hard_ctx.
    """
    truth = np.array([it.truth for it in items])
    p, p_cal = np.asarray(p, np.float64), np.asarray(p_cal, np.float64)
    groups = {f: np.array([it.family == f for it in items]) for f in FAMILIES}
    groups["affirmative"] = np.array([not it.negated for it in items])
    groups["negated"] = ~groups["affirmative"]
    groups["overall"] = np.ones(len(items), bool)
    out = {name: _stats(truth[m], p[m], p_cal[m]) for name, m in groups.items() if m.any()}
    resp = np.array([it.response for it in items])
    n_resp = int(resp.max()) + 1
    # Crossed bootstrap: responses AND item templates (the text with its quoted word and
    # numbers blanked) are resampled (weight = product). Every response is asked the same
    # 10 templates, so resampling responses alone ignores how much the AUC owes to these
    # particular phrasings.
    tmpl_ids: dict = {}
    tmpl = np.array([tmpl_ids.setdefault(_TEMPLATE.sub("#", it.text), len(tmpl_ids))
                     for it in items])
    w = (intervals.resample_weights(n_resp, n_boot, seed)[:, resp]
         * intervals.resample_weights(len(tmpl_ids), n_boot, seed + 1)[:, tmpl])
    return {"groups": out, "n_responses": n_resp, "n_templates": len(tmpl_ids),
            "auc_ci95": intervals.percentile_interval(metrics.auc(p, truth, w))}


def verdict_line(summary: dict) -> str:
    """One line a researcher can act on: the overall AUC, its CI and what it means.

    "weak" is an AUC whose CI excludes 0.5 but whose value is below 0.6: P(yes) then
    ranks a true item above a false one in under 60% of pairs, too little for verdicts.
    """
    g = summary["groups"]
    lo, hi = summary["auc_ci95"]
    auc = g["overall"]["auc"]
    if hi < 0.5:
        what = "BELOW chance (the verifier answers against the criteria)"
    elif lo <= 0.5:
        what = "indistinguishable from chance: its verdicts carry no criterion signal"
    elif auc < 0.6:
        what = "above chance but weak (< 0.6): P(yes) barely tracks the criteria"
    else:
        what = "above chance"
    polarity = ""
    if "affirmative" in g and "negated" in g:
        polarity = (f" (affirmative {g['affirmative']['auc']:.2f}, "
                    f"negated {g['negated']['auc']:.2f})")
    return (f"criterion following: AUC {auc:.2f}{polarity}, 95% CI {lo:.2f}-{hi:.2f} over "
            f"{summary['n_responses']} responses x {summary.get('n_templates', '?')} item "
            f"templates ({g['overall']['n_items']} items): {what}; hard verdicts "
            f"{g['overall']['acc_hard']:.2f} accurate at yes-rate "
            f"{g['overall']['yes_rate']:.2f}, {g['overall']['acc_hard_ctx']:.2f} with "
            "contextual calibration")


def format_table(summary: dict) -> str:
    """The per-group statistics as a fixed-width text table."""
    head = (f"{'group':<12}{'items':>6}{'AUC':>7}{'AUC ctx':>9}{'yes-rate':>10}"
            f"{'mean P':>8}{'acc hard':>10}{'acc ctx':>9}")
    lines = [head, "-" * len(head)]
    for name, s in summary["groups"].items():
        lines.append(f"{name:<12}{s['n_items']:>6}{s['auc']:>7.3f}{s['auc_ctx']:>9.3f}"
                     f"{s['yes_rate']:>10.3f}{s['mean_p_yes']:>8.3f}{s['acc_hard']:>10.3f}"
                     f"{s['acc_hard_ctx']:>9.3f}")
    return "\n".join(lines)

