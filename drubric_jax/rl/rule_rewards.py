"""Rule rewards for plain (rule-based) GRPO: the baseline of the paper's cost table and the
"does GRPO learn at all" check (METHOD 6, 10).

`config.policy.reward` picks the policy's reward:
    rubric       DynamicRubric: Eq. 12 scores of the generator's list and the verifier
                 (`phases.policy_rollout`); not a rule, listed for the config check
    word_limit   1 when the response has 1..N words (N = `config.policy.reward_max_words`),
                 N / words when it has more, 0 when it is empty. Graded above N so that a
                 group of over-long answers still has a spread (Eq. 21 needs one); empty
                 answers get 0 so that stopping at once is no way to satisfy the limit.
    exact_match  1 when the response equals the prompt's reference answer (case and
                 surrounding space ignored), 0 otherwise or without a reference.
    checks_gold  the gold score g(x, y) of METHOD 13: the fraction of the prompt's true
                 checks (`item.meta["checks"]`, written by experiments.make_checks_data)
                 that the response meets, strict verdicts (IFEval's instruction-level
                 accuracy for one prompt; Zhou et al. 2023, arXiv:2311.07911). The RLVR
                 upper bound a rubric reward is compared with. A row without valid
                 `meta.checks` is an error naming the row and the field, raised by
                 `data.check_data_sources` before any weights load, else at first use.
    checks_oracle the rubric score (Eq. 12) of the oracle generator's list: the prompt's
                 true checks written as rubric items of equal weight (`ORACLE_WEIGHT`),
                 judged by their checkers (strict). The upper bound of any rubric reward in
                 the checks world (checks world III); on its always-valid lists it equals
                 checks_gold, computed through the rubric path (verdicts, then Eq. 12).
A rule reward is a host function (prompt item, response text) -> float; the policy phase
turns the K rewards of a prompt into advantages exactly as it does rubric scores (Eq. 21,
`phases.rule_policy_rollout`). A non-finite value marks the row unscorable (METHOD 11).

`RULES` is the registry: name -> a function of `RuleOptions` that returns the rule.
Adding a rule = its function here, a row in `RULES` and, if it has a parameter, a field of
`RuleOptions` read in `rounds.settings` (docs/CONVENTIONS.md); `make_rule` and
`config_check.validate` read the table when called.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

RUBRIC = "rubric"
Rule = Callable[[object, str], float]  # (prompt item, response text) -> reward


def word_limit_reward(max_words: int) -> Rule:
    """The `word_limit` rule for N = max_words (module docstring).

    Raises:
        ValueError: max_words < 1.
    """
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")

    def reward(item, response: str) -> float:
        del item
        n = len(response.split())  # whitespace-separated words
        if n == 0:
            return 0.0
        return 1.0 if n <= max_words else max_words / n

    return reward


def exact_match_reward(item, response: str) -> float:
    """The `exact_match` rule: `item.reference` (stripped, lower-cased) == the response."""
    ref = (getattr(item, "reference", None) or "").strip().lower()
    return float(bool(ref) and response.strip().lower() == ref)


def checks_gold_reward(item, response: str) -> float:
    """The `checks_gold` rule: `checks.gold_score(item.meta["checks"], response)` (strict).

    Args:
        item: a PromptItem (`.id`, `.source`, `.meta`).
        response: the response text.

    Returns:
        float in [0, 1]: the fraction of the prompt's true checks met.

    Raises:
        ValueError: the row has no valid `meta["checks"]` ("prompt row '<id>' (<source>):
            field 'meta.checks' ...").
    """
    from drubric_jax import checks  # the checkers load only when this rule is used

    where = f"prompt row {getattr(item, 'id', None)!r} ({getattr(item, 'source', '?')})"
    true = checks.true_checks_of(getattr(item, "meta", None), where)
    return checks.gold_score(true, response)


ORACLE_WEIGHT = 5  # every item of the oracle's list: "essential" (the generator's scale)


def oracle_list(true_checks) -> tuple[list, np.ndarray]:
    """The oracle generator's rubric list for a prompt: its true checks as items and their
    weights.

    Args:
        true_checks: T(x), {"check", "args"} mappings (validated, `checks.true_checks_of`).

    Returns:
        (M (check, args) items, int32[M] weights, all ORACLE_WEIGHT).
    """
    items = [(t["check"], t["args"]) for t in true_checks]
    return items, np.full(len(items), ORACLE_WEIGHT, np.int32)


def checks_oracle_reward(item, response: str) -> float:
    """The `checks_oracle` rule (module docstring): Eq. 12 (`rewards.rubric_scores`, the
    rubric reward's own function) of `oracle_list`'s items, each judged by its checker
    (strict, `checks.verdict`: the verdict `evaluator.checks_verifier` gives an item).

    Returns:
        float in [0, 1].

    Raises:
        ValueError: the row has no valid `meta["checks"]` (as `checks_gold_reward`).
    """
    from drubric_jax import checks
    from drubric_jax.rl.rewards import rubric_scores

    where = f"prompt row {getattr(item, 'id', None)!r} ({getattr(item, 'source', '?')})"
    items, weights = oracle_list(checks.true_checks_of(getattr(item, "meta", None), where))
    verdicts = np.array([[checks.verdict(c, a, response) for c, a in items]],
                        np.float32)                                                # [K=1, M]
    scores, _ = rubric_scores(verdicts, weights, np.ones(len(items), bool))
    return float(np.asarray(scores)[0])


@dataclasses.dataclass(frozen=True)
class RuleOptions:
    """The rules' parameters (read from config.policy once, `rounds.settings`).

    Attributes:
        max_words: N of `word_limit` (`config.policy.reward_max_words`), >= 1.
    """

    max_words: int = 32


# name -> (RuleOptions -> the rule); the values of config.policy.reward besides RUBRIC.
RULES: dict[str, Callable[[RuleOptions], Rule]] = {
    "word_limit": lambda o: word_limit_reward(int(o.max_words)),
    "exact_match": lambda o: exact_match_reward,
    "checks_gold": lambda o: checks_gold_reward,  # = checks.GOLD_REWARD
    "checks_oracle": lambda o: checks_oracle_reward,  # = checks.ORACLE_REWARD
}


def reward_names() -> tuple:
    """The values `config.policy.reward` may take: RUBRIC and every registered rule."""
    return (RUBRIC,) + tuple(RULES)


def make_rule(name: str, options: RuleOptions = RuleOptions()) -> Rule:
    """The rule reward `name` with `options`.

    Raises:
        ValueError: `name` is not a rule (names config.policy.reward and the choices).
    """
    if name not in RULES:
        raise ValueError(f"config.policy.reward={name!r} is not a rule reward "
                         f"(one of {tuple(RULES)})")
    return RULES[name](options)
