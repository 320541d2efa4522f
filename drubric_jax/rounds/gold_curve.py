"""The known-answer curve: held-out gold score of the policy against its step (checks world,
METHOD 13; issue 40).

Every `config.rounds.heldout_gold_every` policy steps (and before the first), the loop has
the current policy answer the first `config.rounds.heldout_gold_rows` prompts of
`config.rounds.heldout_gold_path` (the checks world's heldout.jsonl: never trained on),
greedy and once at the training temperature, and logs the mean gold score g(x, y) of each
as a `kind = "heldout_gold"` metrics row. The keys are functions of the step (`loop.
phase_key`), so a resumed run draws the same samples. Host-side scoring; the sampler is
the policy phase's (`evaluation.policy_eval.answers` on the rollout copy of the weights).

Axis legend (docs/CONVENTIONS.md): U held-out prompts.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from drubric_jax.types import Role


def load_items(config) -> list:
    """The first `rounds.heldout_gold_rows` prompts of `rounds.heldout_gold_path` (0 = all);
    [] when the curve is off (`heldout_gold_every` 0).

    Raises:
        FileNotFoundError / ValueError: a missing file or a row without true checks
            (`meta.checks`), naming the config field, file and row.
    """
    r = config.rounds
    if not r.get("heldout_gold_every", 0):
        return []
    from drubric_jax.checks import true_checks_of
    from drubric_jax.data.sources import prompts_from_jsonl

    path = r.heldout_gold_path
    if not path:
        raise ValueError("config.rounds.heldout_gold_path: the held-out prompts of the gold "
                         "curve are needed when config.rounds.heldout_gold_every > 0")
    try:
        items = prompts_from_jsonl(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"config.rounds.heldout_gold_path: no such file {path}"
                                ) from None
    items = items[:int(r.heldout_gold_rows)] if r.heldout_gold_rows else items
    for i, it in enumerate(items):
        true_checks_of(it.meta, f"config.rounds.heldout_gold_path: {path}: row {i + 1} "
                                f"{it.id!r}")
    return items


def heldout_gold_point(ctx, key, items: Sequence, *, max_prompt_tokens: int,
                       max_new_tokens: int, temperature: float,
                       rows_per_call: int = 0) -> dict:
    """The current policy's mean held-out gold score, greedy and sampled.

    Args:
        ctx: the run's `rounds.context.Context` (its policy is answered with).
        key: PRNG key of the sampled answers (greedy draws nothing).
        items: U `PromptItem`s with `meta["checks"]`.

    Returns:
        {"heldout_gold_greedy", "heldout_gold_sampled": float means over U,
         "heldout_gold_rows": U}.
    """
    from drubric_jax.evaluation import policy_eval
    from drubric_jax.evaluation.checks_policy import gold_of

    params = ctx.roles.rollout_params(Role.POLICY, ctx.mesh)
    model = ctx.roles.policy.model
    out = {"heldout_gold_rows": len(items)}
    for name, t in (("greedy", 0.0), ("sampled", float(temperature))):
        answers, _ = policy_eval.answers(
            ctx.roles.rollout_cfg(Role.POLICY), params, model.tokenizer,
            [it.prompt for it in items],
            key=jax.random.fold_in(key, 1 if t else 0), max_prompt_tokens=max_prompt_tokens,
            max_new_tokens=max_new_tokens, temperature=t, rows_per_call=rows_per_call,
            histories=[list(it.history) for it in items], mesh=ctx.mesh,
            per_row_keys=True)
        out[f"heldout_gold_{name}"] = float(np.nanmean(gold_of(items, answers)))
    return out
