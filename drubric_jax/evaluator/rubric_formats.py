"""The rubric format a `RubricGenerator` writes in, one per `config.verifier.kind`.

    RubricFormat  the JSON schema, the prompt, the parser, the counters and the display
    LLM_FORMAT    free-text criteria (METHOD 2, 8, 11), the format the generator has always
                  written
    get_format    "llm" -> LLM_FORMAT, "checks" -> the format of `check_rubrics` (METHOD 13;
                  imported on first use: the checkers take a second to import)
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from drubric_jax.text import rubric_format
from drubric_jax.text.prompts import generator_messages

KINDS = ("llm", "checks")  # config.verifier.kind


@dataclasses.dataclass(frozen=True)
class RubricFormat:
    """What a rubric generator writes: `schema(max_items, max_item_chars) -> dict`,
    `messages(prompt, responses, history, order=, max_items=) -> chat messages`,
    `parse(text, finish_reason, max_items) -> ParsedRubric`, `counter_keys` (its counters),
    `display(item text) -> str` (an item as traces show it)."""

    name: str
    schema: Callable
    messages: Callable
    parse: Callable
    counter_keys: tuple
    display: Callable


LLM_FORMAT = RubricFormat("llm", rubric_format.RUBRIC_JSON_SCHEMA, generator_messages,
                          rubric_format.parse_rubric_output, rubric_format.COUNTER_KEYS,
                          lambda text: text)


def get_format(kind: str, pool: tuple = ()) -> RubricFormat:
    """The format of `config.verifier.kind`; for "checks", `pool` (check ids,
    `config.generator.check_pool`) limits the prompt's list of checks, the JSON schema and
    the parser to those ids (() = every scorable check).

    Raises:
        ValueError: a kind not in `KINDS`; a pool with "llm" or with an unknown check id.
    """
    if kind == "llm":
        if pool:
            raise ValueError("config.generator.check_pool applies to verifier.kind='checks' only")
        return LLM_FORMAT
    if kind == "checks":
        import functools

        from drubric_jax.evaluator import check_rubrics as cr
        pool = tuple(pool)
        bad = [c for c in pool if c not in cr.checks.SCORABLE_CHECKS]
        if bad:
            raise ValueError(f"config.generator.check_pool: {bad} are not scorable check ids")
        if not pool:
            return RubricFormat("checks", cr.schema, cr.messages, cr.parse_checks_output,
                                cr.CHECK_COUNTER_KEYS, cr.display)
        return RubricFormat("checks", functools.partial(cr.schema, pool=pool),
                            functools.partial(cr.messages, pool=pool), cr.parse_in_pool(pool),
                            cr.CHECK_COUNTER_KEYS, cr.display)
    raise ValueError(f"verifier kind {kind!r} not in {KINDS}")
