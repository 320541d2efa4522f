"""Supervised pairs of the generator's warm start G_sft (checks world III, METHOD 13).

A pair is (the generator's input for a training prompt x and K sampled responses shown in
a drawn order, the prompt's true checks T(x) written as the constrained JSON the generator
of checks emits). The target text is exactly what the constrained decoder can produce
(`checks.schema.items_json_schema` with the generator's fixed separators ", " and ": "):

    {"rubrics": [{"check": "<id>", "args": {<args in the checker's order>}, "weight": 5}, ...]}

Every item gets weight `SFT_WEIGHT` (5, "essential": the checks the request asks for), so a
warm-started generator starts from equal weights, as the oracle's lists do.

Pairs come from training-split prompts only: `sft_examples` refuses a row whose id or
prompt text is a held-out prompt's. Every random choice comes from the caller's
`numpy.random.Generator`.
"""
from __future__ import annotations

import json
from typing import Iterable, Mapping, Sequence

import numpy as np

from drubric_jax.checks.table import CHECKS
from drubric_jax.checks.verify import validate

SFT_WEIGHT = 5
# The generator's JSON separators (`evaluator.rubric_generator.JSON_SEPARATORS`, which
# llguidance enforces): item ", ", key ": ".
_SEPARATORS = (", ", ": ")


def target_json(true_checks: Sequence[Mapping], pool: Sequence[str] = ()) -> str:
    """The generator output that names exactly `true_checks` (module docstring).

    Args:
        true_checks: T(x), {"check", "args"} mappings (>= 1).
        pool: the check ids the generator may emit (`config.generator.check_pool`); () =
            any scorable check.

    Returns:
        the JSON text, arguments in the checker's order (`CHECKS[id].arg_names`, the JSON
        schema's property order).

    Raises:
        ValueError: no checks, or a check outside `pool` (the constrained generator could
            never write it; names the check).
        checks.InvalidCheck: invalid arguments.
    """
    if not true_checks:
        raise ValueError("target_json needs at least one true check")
    items = []
    for t in true_checks:
        check = t["check"]
        if pool and check not in pool:
            raise ValueError(f"true check {check!r} is not in the generator's check pool "
                             f"{tuple(pool)}: the constrained generator cannot write it")
        args = validate(check, t["args"])
        ordered = {name: args[name] for name in CHECKS[check].arg_names}
        items.append({"check": check, "args": ordered, "weight": SFT_WEIGHT})
    return json.dumps({"rubrics": items}, separators=_SEPARATORS, ensure_ascii=False)


def heldout_keys(heldout_rows: Iterable) -> tuple[set, set]:
    """(ids, prompt texts) of the held-out prompts (rows with `.id` and `.prompt`)."""
    rows = list(heldout_rows)
    return {r.id for r in rows}, {r.prompt.strip() for r in rows}


def sft_examples(rows: Sequence, heldout_rows: Iterable, rng: np.random.Generator, *,
                 pairs_per_prompt: int = 1, pool: Sequence[str] = (), where: str = "") -> list:
    """The supervised examples of anchor rows of training prompts.

    Args:
        rows: records with `.id`, `.prompt`, `.responses` (K >= 1 texts, sample order),
            `.history`, `.meta["checks"]` and `.line` (an anchors.jsonl of
            `experiments.make_checks_anchors` on train.jsonl, read by `data.load_jsonl`).
        heldout_rows: the held-out prompts (heldout.jsonl's records).
        rng: draws each pair's response order.
        pairs_per_prompt: pairs per row, each with its own order (>= 1).
        pool: as `target_json`.
        where: the rows' file, for messages.

    Returns:
        list of {"id", "prompt", "history", "responses" (sample order), "order" (the
        permutation shown: position i shows responses[order[i]]), "true_checks",
        "target"}, rows in file order, each row's pairs together.

    Raises:
        ValueError: pairs_per_prompt < 1; a row of a held-out prompt (same id or the same
            prompt text), a row without responses or without valid true checks (each names
            `where`, the row's line and id).
    """
    from drubric_jax.checks.gold import true_checks_of

    if pairs_per_prompt < 1:
        raise ValueError(f"pairs_per_prompt must be >= 1, got {pairs_per_prompt}")
    ids, texts = heldout_keys(heldout_rows)
    out = []
    for r in rows:
        at = f"{where}:{getattr(r, 'line', '?')}: row {r.id!r}"
        if r.id in ids or r.prompt.strip() in texts:
            raise ValueError(f"{at}: a held-out prompt; supervised pairs come from training "
                             "prompts only")
        if not r.responses:
            raise ValueError(f"{at}: field 'responses' is empty (the generator's input needs "
                             "K responses)")
        truth = true_checks_of(r.meta, at)
        target = target_json(truth, pool)
        for _ in range(int(pairs_per_prompt)):
            order = rng.permutation(len(r.responses)).tolist()
            out.append({"id": r.id, "prompt": r.prompt, "history": list(r.history or ()),
                        "responses": list(r.responses), "order": order,
                        "true_checks": truth, "target": target})
    return out
