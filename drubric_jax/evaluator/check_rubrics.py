"""Rubric lists whose items are checks (`verifier.kind = "checks"`, METHOD 13): their item
texts, parser, schema and prompt.

    item_text / item_of_text  an item (check, args) <-> its text in a `RubricBatch`: the
                              canonical JSON {"args": ..., "check": ...} (sorted keys), what
                              `ChecksVerifier` reads back; `display` renders it as the
                              checker's sentence (traces)
    parse_checks_output       a generator completion -> `ParsedRubric` of item texts
    schema, messages          the JSON schema and the prompt of a generator of checks
                              (`rubric_formats.get_format("checks")` gathers them)

Counters: a check item is dropped and counted as a free-text item is (METHOD 11,
`rubric_format.COUNTER_KEYS`), with one more reason, `invalid_check`: the check id is not
a scorable one, or `checks.validate` rejects its args (`InvalidCheck`). Duplicates are
items with the same `checks.recovery.match_key` (check id and args equal; keywords and
words compared ignoring case), counted under `duplicate`.
"""
from __future__ import annotations

import functools
import json
from typing import Optional

from drubric_jax import checks
from drubric_jax.checks.recovery import constraint_prf, match_key
from drubric_jax.checks.schema import check_lines, items_json_schema
from drubric_jax.text import rubric_format
from drubric_jax.text.check_prompts import checks_generator_messages
from drubric_jax.text.json_scan import RepeatedKeys, Search, find_rubric_value
from drubric_jax.text.rubric_format import MAX_WEIGHT, MIN_WEIGHT, ParsedRubric

CHECK_COUNTER_KEYS = rubric_format.COUNTER_KEYS + ("invalid_check",)
"""`ParsedRubric.counters` keys of a list of checks."""


def item_text(check: str, args) -> str:
    """The canonical text of a check item: JSON {"args": ..., "check": ...}, sorted keys."""
    return json.dumps({"args": dict(args), "check": check}, sort_keys=True, ensure_ascii=False)


def item_of_text(text: str) -> tuple[str, dict]:
    """(check, args) of an `item_text`.

    Raises:
        checks.InvalidCheck: not an item text (field "text").
    """
    try:
        obj = json.loads(text)
        return obj["check"], obj["args"]
    except (ValueError, TypeError, KeyError) as e:
        raise checks.InvalidCheck(None, "text", f"not a check item text: {text!r}") from e


def list_recovery(texts, kept, true_checks) -> tuple[list, tuple[float, float, float, float]]:
    """The kept items of one generated list of checks, and how well they recover the prompt's
    true checks (METHOD 13; the one loop the held-out evaluations share).

    Args:
        texts: the list's M item texts (`RubricBatch.texts[u][g]`).
        kept: M bools, the items kept (`RubricBatch.item_mask[u, g]`); an invalid list keeps
            none and scores 0 (METHOD 11).
        true_checks: T(x), (check, args) pairs or {"check", "args"} mappings (non-empty).

    Returns:
        (items, (precision, recall, f1, f1 on check ids alone)): items are the kept
        (check, args) pairs; the four floats are `checks.recovery.constraint_prf`'s.

    Raises:
        ValueError: `true_checks` is empty.
    """
    items = [item_of_text(t) for t, on in zip(texts, kept) if on]
    p, r, f = constraint_prf(items, true_checks)
    return items, (p, r, f, constraint_prf(items, true_checks, ids_only=True)[2])


def display(text: str) -> str:
    """The checker's own sentence for an item text (METHOD 13: an item's text in traces);
    "" stays "", a text that is not a valid item is shown as it is."""
    if not text:
        return text
    try:
        return checks.render(*item_of_text(text))
    except checks.InvalidCheck:
        return text


class CheckParsed(ParsedRubric):
    """A `ParsedRubric` of item texts with the `invalid_check` counter."""

    def __init__(self):
        super().__init__(counters={k: 0 for k in CHECK_COUNTER_KEYS})

    @property
    def num_dropped(self) -> int:
        return super().num_dropped + self.counters["invalid_check"]


def parse_checks_output(text: str, finish_reason: Optional[str] = "stop",
                        max_items: int = 16) -> CheckParsed:
    """Parses a generator's output under checks into item texts (`item_text`). Never raises.

    The list is found as `rubric_format.parse_rubric_output` finds it (steps 1-3: a cut
    output is invalid and `truncated`; the first {"rubrics": [...]} or bare list; nothing
    found: `unparseable`). Each element, in order, is dropped and counted by the first rule
    it fails: not an object (`non_object_item`), a repeated key (`duplicate_key`), an
    unknown or unscorable check or args that `checks.validate` rejects (`invalid_check`),
    a weight that is not a JSON integer in 1..5 (`invalid_weight`), the same check and args
    as a kept item (`duplicate`, `checks.recovery.match_key`), beyond max_items
    (`over_limit`). No item left: invalid (`no_valid_items`).

    Returns:
        CheckParsed: `texts` the kept items' `item_text`s (validated args), `weights`.
    """
    out = CheckParsed()
    c = out.counters
    if finish_reason == "length":
        out.truncated, c["truncated"] = True, 1
        return out
    try:
        value, ran_off, work_limit = (find_rubric_value(text) if isinstance(text, str)
                                      else Search(None, False, False))
    except (RecursionError, MemoryError):
        value, ran_off, work_limit = Search(None, False, False)
    c["work_limit"] = int(work_limit)
    if value is None:
        out.truncated = bool(ran_off)
        c["truncated" if ran_off else "unparseable"] = 1
        return out
    if isinstance(value, RepeatedKeys):
        c["duplicate_key"] = c["no_valid_items"] = 1
        return out
    seen = set()
    for item in (value["rubrics"] if isinstance(value, dict) else value):
        if not isinstance(item, dict):
            c["non_object_item"] += 1
            continue
        if isinstance(item, RepeatedKeys) or isinstance(item.get("args"), RepeatedKeys):
            c["duplicate_key"] += 1
            continue
        check = item.get("check")
        try:
            if check not in checks.SCORABLE_CHECKS:
                raise checks.InvalidCheck(check, "check", "not a scorable check id")
            args = checks.validate(check, item.get("args"))
        except checks.InvalidCheck:
            c["invalid_check"] += 1
            continue
        w = item.get("weight")
        if not (isinstance(w, int) and not isinstance(w, bool) and MIN_WEIGHT <= w <= MAX_WEIGHT):
            c["invalid_weight"] += 1
            continue
        key = match_key(check, args)
        if key in seen:
            c["duplicate"] += 1
            continue
        seen.add(key)
        if len(out.texts) >= max(int(max_items), 0):
            c["over_limit"] += 1
            continue
        out.texts.append(item_text(check, args))
        out.weights.append(int(w))
    if not out.texts:
        c["no_valid_items"] = 1
        return out
    out.valid = True
    return out


@functools.lru_cache(maxsize=8)
def _lines(pool: tuple = ()) -> str:
    return check_lines(pool or checks.SCORABLE_CHECKS)


def messages(prompt, responses, history=None, order=None, max_items=None, *,
             pool: tuple = ()) -> list:
    """`text.check_prompts.checks_generator_messages` listing the checks of `pool` (check
    ids; () = every scorable check)."""
    return checks_generator_messages(prompt, responses, history, order, max_items,
                                     check_lines=_lines(tuple(pool)))


def schema(max_items: int, max_item_chars: int, *, pool: tuple = ()) -> dict:
    """`checks.schema.items_json_schema`: string arguments of at most max_item_chars, items
    of the checks of `pool` (check ids; () = every scorable check)."""
    return items_json_schema(max_items, max_item_chars, tuple(pool) or checks.SCORABLE_CHECKS)


def parse_in_pool(pool: tuple):
    """`parse_checks_output` that also drops (as `invalid_check`) an item whose check is
    not in `pool` (check ids; () = every scorable check). The schema already keeps a
    constrained generator inside the pool; this holds for unconstrained text too."""
    allowed = frozenset(pool)

    def parse(text, finish_reason="stop", max_items=16):
        out = parse_checks_output(text, finish_reason, max_items)
        if not allowed:
            return out
        keep = [(t, w) for t, w in zip(out.texts, out.weights) if item_of_text(t)[0] in allowed]
        out.counters["invalid_check"] += len(out.texts) - len(keep)
        out.texts, out.weights = [t for t, _ in keep], [w for _, w in keep]
        if not out.texts and out.valid:
            out.valid, out.counters["no_valid_items"] = False, 1
        return out
    return parse
