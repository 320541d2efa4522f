"""Constraint recovery: how well a rubric list of checks names a prompt's true checks
(METHOD 13).

    match_key        the normal form two items are compared in (equal keys = the same check)
    constraint_prf   precision, recall and F1 of a list against the true checks T(x)

Two items match when the check id AND the arguments are equal, as METHOD 13 defines it:
numbers equal, keyword sets equal ignoring case and order; a string argument is compared
with its case folded and its ends stripped (the IFEval checkers compare words and phrases
case-insensitively: Zhou et al. 2023, arXiv:2311.07911). The same key is the duplicate
rule of a generated list (two items with one key: the second is a duplicate).
"""
from __future__ import annotations

from collections.abc import Mapping

from drubric_jax.checks.table import CHECKS


def _norm(kind: str, value):
    if kind == "str_list" and isinstance(value, (list, tuple)):
        return frozenset(str(v).strip().casefold() for v in value)
    if kind == "str" and isinstance(value, str):
        return value.strip().casefold()
    return value


def match_key(check: str, args: Mapping | None = None) -> tuple:
    """(check, ((arg name, normal value), ...)) of an item; `args=None` gives the check-id
    key (check,) of a check-id-only comparison.

    Args:
        check: an instruction id; args: its arguments (validated or not: an unknown check
            or argument is compared as written).

    Returns:
        a hashable tuple; equal for two items that match (module docstring).
    """
    if args is None:
        return (check,)
    spec = CHECKS.get(check)
    kinds = {a.name: a.kind for a in spec.args} if spec is not None else {}
    return (check, tuple(sorted((str(k), _norm(kinds.get(k, ""), v))
                                for k, v in args.items())))


def constraint_prf(items, true_checks, ids_only: bool = False) -> tuple[float, float, float]:
    """Precision |C ∩ T| / |C|, recall |C ∩ T| / |T| and F1 = 2PR / (P + R) of one rubric
    list C against the true checks T of its prompt (METHOD 13), items compared by
    `match_key` (as sets: a duplicate counts once).

    Args:
        items: C, (check, args) pairs (the kept items of a list; may be empty).
        true_checks: T, (check, args) pairs or {"check", "args"} mappings (non-empty).
        ids_only: compare check ids alone (arguments ignored).

    Returns:
        (precision, recall, f1) floats in [0, 1]; an empty C (an invalid list, METHOD 11)
        gives (0, 0, 0), as does P = R = 0.

    Raises:
        ValueError: `true_checks` is empty (no recovery to measure).
    """
    def key(c, a):
        return match_key(c, None if ids_only else a)

    truth = {key(*((t["check"], t["args"]) if isinstance(t, Mapping) else t))
             for t in true_checks}
    if not truth:
        raise ValueError("constraint_prf needs at least one true check")
    pred = {key(c, a) for c, a in items}
    hit = len(pred & truth)
    if not pred or not hit:
        return 0.0, 0.0, 0.0
    p, r = hit / len(pred), hit / len(truth)
    return p, r, 2 * p * r / (p + r)
