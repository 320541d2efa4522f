"""The gold score of a response against its prompt's true checks (METHOD 13).

g(x, y) = |{t in T(x): t accepts y}| / |T(x)|: IFEval's instruction-level accuracy for one
prompt (Zhou et al. 2023, arXiv:2311.07911). It is what a gold reward trains on (the RLVR
upper bound) and what ranks anchor responses. The checks of T(x) are written in a prompt
row as {"check": instruction id, "args": {...}} objects.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from drubric_jax.checks.verify import InvalidCheck, follows, scorable_checker


def _pair(t):
    if isinstance(t, Mapping):
        if set(t) != {"check", "args"}:
            raise InvalidCheck(t.get("check"), "check", f"a true check is {{check, args}}, got "
                                                        f"keys {sorted(t)}")
        return t["check"], t["args"]
    check, args = t
    return check, args


def gold_score(true_checks, response: str, loose: bool = False) -> float:
    """g(x, y), the fraction of the prompt's true checks that `response` meets.

    Args:
        true_checks: T(x), a sequence of {"check", "args"} mappings or (check, args) pairs.
        response: y.
        loose: IFEval's loose verdict per check instead of the strict one.

    Returns:
        float in [0, 1]; nan when T(x) is empty (nothing to score: a rule reward's mark of
        an unscorable row, METHOD 11).

    Raises:
        InvalidCheck: a malformed or invalid true check; NotScorable: a check that cannot be
            scored here (data generation never writes one).
    """
    pairs = [_pair(t) for t in true_checks]
    if not pairs:
        return math.nan
    met = sum(follows(scorable_checker(c, a), response, loose) for c, a in pairs)
    return met / len(pairs)
