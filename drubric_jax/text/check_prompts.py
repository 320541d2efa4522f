"""The generator's prompt when rubric items are checks (`verifier.kind = "checks"`, METHOD 13).

The layout is `prompts.generator_messages`'s (request block, then the K responses labelled
"Response 1".."Response K" in the given order; the static variant without them); the
system text asks for checks instead of free-text criteria and lists the checks the output
may use, one line each (`checks.schema.check_lines`, passed in: text/ does not import
checks/). Tests pin the wording, so edit it only on purpose.
"""
from __future__ import annotations

from typing import Optional, Sequence

from drubric_jax.text.prompts import generator_request

_CHECKS_INTRO = (
    "You write grading checklists for answers to user requests. Each item of the checklist "
    "is an automatic check, chosen from the list below, with its arguments. A response "
    "passes a check or fails it.")
_CHECKS_DYNAMIC = (
    " You will see a user's request and a pool of candidate responses to it. Pick the "
    "checks that the request asks for, with the arguments it states, and that separate "
    "the responses that follow the request from those that do not.")
_CHECKS_STATIC = (
    " You will see only a user's request, with no responses. Pick the checks that the "
    "request asks for, with the arguments it states.")
_CHECKS_RULES = (
    "Use each check at most once with the same arguments. Weight each check with an "
    "integer: 5 = essential, 3 or 4 = important, 1 or 2 = nice to have.")
_CHECKS_OUTPUT = ('Reply with a JSON object and nothing else, in this form:\n'
                  '{"rubrics": [{"check": "<check id>", "args": {<arguments>}, '
                  '"weight": <integer 1-5>}, ...]}')


def checks_generator_system(check_lines: str, static: bool,
                            max_items: Optional[int] = None) -> str:
    """The system text: intro, the checks (`check_lines`, one per line), rules, format."""
    text = (_CHECKS_INTRO + (_CHECKS_STATIC if static else _CHECKS_DYNAMIC)
            + "\n\nChecks (id {arguments}: what it checks):\n" + check_lines
            + "\n\n" + _CHECKS_RULES + "\n\n" + _CHECKS_OUTPUT)
    if max_items is not None:
        text += f"\nWrite at most {int(max_items)} checks."
    return text


def checks_generator_messages(prompt: str, responses: Optional[Sequence[str]],
                              history: Optional[Sequence[dict]] = None,
                              order: Optional[Sequence[int]] = None,
                              max_items: Optional[int] = None, *,
                              check_lines: str) -> list:
    """Chat messages of the generator of checks (the arguments of
    `prompts.generator_messages`, plus `check_lines`: the checks it may use).

    Returns:
        [{"role": "system", ...}, {"role": "user", ...}].

    Raises:
        ValueError: `order` is not a permutation of range(K).
    """
    return [{"role": "system", "content": checks_generator_system(check_lines, not responses,
                                                                  max_items)},
            {"role": "user", "content": generator_request(prompt, responses, history, order,
                                                          "the checks")}]
