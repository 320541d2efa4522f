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


def get_format(kind: str) -> RubricFormat:
    """The format of `config.verifier.kind`.

    Raises:
        ValueError: a kind not in `KINDS`.
    """
    if kind == "llm":
        return LLM_FORMAT
    if kind == "checks":
        from drubric_jax.evaluator import check_rubrics as cr
        return RubricFormat("checks", cr.schema, cr.messages, cr.parse_checks_output,
                            cr.CHECK_COUNTER_KEYS, cr.display)
    raise ValueError(f"verifier kind {kind!r} not in {KINDS}")
