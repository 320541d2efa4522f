"""The gold score of a response against its prompt's true checks (METHOD 13).

g(x, y) = |{t in T(x): t accepts y}| / |T(x)|: IFEval's instruction-level accuracy for one
prompt (Zhou et al. 2023, arXiv:2311.07911). It is what a gold reward trains on (the RLVR
upper bound) and what ranks anchor responses. The checks of T(x) are written in a prompt
row as {"check": instruction id, "args": {...}} objects.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from drubric_jax.checks.verify import InvalidCheck, follows, scorable_checker, validate

# config.policy.reward of the rule that trains on g (rl.rule_rewards); data.check_data_sources
# then requires every prompt row to carry valid true checks.
GOLD_REWARD = "checks_gold"
# The oracle generator's rubric reward (rl.rule_rewards.checks_oracle_reward): it reads the
# true checks too, so the data check requires them under either rule.
ORACLE_REWARD = "checks_oracle"
TRUE_CHECK_REWARDS = (GOLD_REWARD, ORACLE_REWARD)


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


def true_checks_of(meta, where: str) -> list:
    """The true checks T(x) of a prompt row, `meta["checks"]`, each validated.

    Args:
        meta: the row's meta dict (`Record.meta`, `PromptItem.meta`).
        where: the row, for messages (e.g. "file.jsonl:3: row 'x/1'").

    Returns:
        list of {"check": id, "args": {...}} (args validated, `verify.validate`), >= 1 entry.

    Raises:
        ValueError: "<where>: field 'meta.checks' ..." when meta has no "checks", it is not
            a non-empty list, or an entry is malformed or invalid (the entry's index named).
    """
    checks = meta.get("checks") if isinstance(meta, Mapping) else None
    if checks is None:
        raise ValueError(f"{where}: field 'meta.checks' is missing (a checks-world prompt row "
                         "holds its true checks there; see experiments.make_checks_data)")
    if not isinstance(checks, list) or not checks:
        raise ValueError(f"{where}: field 'meta.checks' must be a non-empty list of "
                         f"{{check, args}} objects, got {checks!r}")
    out = []
    for i, t in enumerate(checks):
        try:
            check, args = _pair(t) if isinstance(t, Mapping) else (None, None)
            if check is None:
                raise InvalidCheck(None, "check", f"a true check is {{check, args}}, got {t!r}")
            out.append({"check": check, "args": validate(check, args)})
        except InvalidCheck as e:
            raise ValueError(f"{where}: field 'meta.checks' entry {i}: {e}") from None
    return out
