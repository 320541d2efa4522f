"""The known-answer curve: held-out gold score of the policy against its step (checks world,
METHOD 13; issue 40).

Every `config.rounds.heldout_gold_every` policy steps of a round (and after its last; a
round after the first skips its step 0, whose policy the last round's final point scored),
the loop has the current policy answer the first `config.rounds.heldout_gold_rows` prompts of
`config.rounds.heldout_gold_path` (never trained on: world v2's dev.jsonl while the policy
trains, its heldout.jsonl where the curve is the reported result; world v1's heldout.jsonl),
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

from drubric_jax import parallel, sampling
from drubric_jax.data.splits import require_split
from drubric_jax.rounds.phases import decode, policy_prompt_ids
from drubric_jax.text import tokenizer as tok_lib
from drubric_jax.types import Role


def load_items(rounds, require_splits: bool) -> list:
    """The first `rounds.heldout_gold_rows` prompts of `rounds.heldout_gold_path` (0 = all);
    [] when the curve is off (`heldout_gold_every` 0).

    Under config.data.require_splits every row of the file must be of
    `rounds.heldout_gold_split` ("dev" while settings are chosen from the curve, "heldout"
    where it is reported).

    Args:
        rounds: the run's `settings_types.RoundsSettings` (config.rounds).
        require_splits: config.data.require_splits (`DataSpec.require_splits`).

    Raises:
        FileNotFoundError / ValueError: a missing file or a row without true checks
            (`meta.checks`), naming the config field, file and row.
        data.splits.SplitError (a ValueError): a row of another split (names the file, row,
            the split found and the one wanted).
    """
    r = rounds
    if not r.heldout_gold_every:
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
    want = r.heldout_gold_split
    if require_splits and want:
        # Each stage reads its own split (issue 53): the curve's file is dev's while the
        # policy trains, heldout's where the curve is the reported result. Every row of
        # the file, read with its line numbers.
        from drubric_jax.data.schema import load_jsonl

        require_split(load_jsonl(path), want, f"config.rounds.heldout_gold_path: {path}",
                      stage="the held-out gold curve (config.rounds.heldout_gold_split)")
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
         "heldout_gold_greedy_values", "heldout_gold_sampled_values": the U per-prompt
         scores (lists in the items' order, nan where no check is scorable: paired CIs
         between runs on the same items, `evaluation.coevolution_rounds`),
         "heldout_gold_rows": U}.
    """
    params = ctx.roles.rollout_params(Role.POLICY, ctx.mesh)
    model = ctx.roles.policy.model
    out = {"heldout_gold_rows": len(items)}
    for name, t in (("greedy", 0.0), ("sampled", float(temperature))):
        answers, _ = policy_answers(
            ctx.roles.rollout_cfg(Role.POLICY), params, model.tokenizer,
            [it.prompt for it in items],
            key=jax.random.fold_in(key, 1 if t else 0), max_prompt_tokens=max_prompt_tokens,
            max_new_tokens=max_new_tokens, temperature=t, rows_per_call=rows_per_call,
            histories=[list(it.history) for it in items], mesh=ctx.mesh,
            per_row_keys=True)
        values = gold_of(items, answers)
        out[f"heldout_gold_{name}"] = float(np.nanmean(values))
        out[f"heldout_gold_{name}_values"] = values
    return out


def gold_of(items: Sequence, answers: Sequence[str]) -> list:
    """g(x, y) (METHOD 13) of each answer against its item's true checks (`meta["checks"]`);
    nan where no check is scorable."""
    from drubric_jax.checks import gold_score

    return [float(gold_score(it.meta["checks"], y)) for it, y in zip(items, answers)]


def policy_answers(cfg, params, tokenizer, requests: Sequence[str], *, key, max_prompt_tokens: int,
            max_new_tokens: int, temperature: float, rows_per_call: int = 0,
            histories=None, mesh=None, per_row_keys: bool = False) -> tuple[list, np.ndarray]:
    """The policy's answer to each request (one sample each), prompts rendered as the policy
    phase renders them (`phases.policy_prompt_ids`). `evaluation.policy_eval.answers` is
    this function.

    Args:
        cfg, params, tokenizer: the policy (`models.load_model`).
        requests: U user messages; histories: U earlier-turn lists or None.
        key: PRNG key of the sampler; temperature 0 is greedy.
        max_prompt_tokens: chat prompt budget (`phases.policy_prompt_ids` cuts to it).
        max_new_tokens: answer budget; rows_per_call: sampler micro-batch (0 = all).
        per_row_keys: request u draws by its index u (`sampling.generate` row_ids), so the
            answers do not depend on rows_per_call or the number of processes.

    Returns:
        (U answer strings, truncated bool[U]: the answer hit max_new_tokens).
    """
    histories = histories or [[] for _ in requests]
    n = len(requests)
    # Under several processes each samples its block of the requests (padded with copies
    # of the last to a multiple of the process count) and the answers are gathered.
    block, rows = parallel.process_share(requests, histories)
    ids = [policy_prompt_ids(tokenizer, r, list(h), max_prompt_tokens) for r, h in zip(*rows)]
    stop = tok_lib.stop_ids(tokenizer)
    out = sampling.generate_chunked(
        params, cfg, ids, rows_per_call, key=key, max_new_tokens=max_new_tokens,
        method=sampling.method_from_flags(float(temperature)), stop_ids=stop,
        pad_id=int(stop[0]), mesh=mesh,
        row_ids=list(range(block.start, block.stop)) if per_row_keys else None)
    texts = decode(tokenizer, out, set(stop.tolist()))
    return (parallel.gather_texts(texts)[:n],
            parallel.gather_rows(np.asarray(out.truncated, bool))[:n])
