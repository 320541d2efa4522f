"""Validating a check's arguments, rendering it, and its verdict on a response.

Strict and loose verdicts are IFEval's (Zhou et al. 2023, arXiv:2311.07911, Section 2 and
its `evaluation_main.py`): strict = the checker accepts the response (an all-whitespace
response fails); loose = it accepts any of eight variants of the response (as is, with
`*` removed, without its first line, last line or both, each with and without `*`), the
variants being `if_verifiable.common.get_loose_transformations`. The checker is
`if_verifiable.ifeval`'s instruction class; nothing of it is copied here.
"""
from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Mapping

import langdetect
from if_verifiable.common import get_loose_transformations

from drubric_jax.checks import punkt
from drubric_jax.checks.table import CHECKER_CLASSES, CHECKS

# langdetect draws from its own unseeded generator unless this is set: with it the
# language checks give the same verdict on every run (it is not global `random`).
langdetect.DetectorFactory.seed = 0


class UndetectedLanguage(logging.Filter):
    """Drops IFEval's ERROR for a text langdetect cannot read (digits, symbols): its
    language checkers log it through the root logger, with the whole response, and count
    the text as followed (IFEval's rule, kept; the verdict is in the metrics). The line
    repeats thousands of times in a checks-world run."""

    MESSAGE = "Unable to detect language for text %s due to %s"

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == self.MESSAGE
                    and f"{os.sep}if_verifiable{os.sep}" in record.pathname)


# On the root logger itself, so the record is dropped in every process that imports the
# checkers (a verdict worker process has no handler of ours to filter it).
if not any(isinstance(f, UndetectedLanguage) for f in logging.getLogger().filters):
    logging.getLogger().addFilter(UndetectedLanguage())


class InvalidCheck(ValueError):
    """A check id or argument the checker cannot take. `.check` and `.field` name them."""

    def __init__(self, check, field: str, why: str):
        self.check, self.field = check, field
        super().__init__(f"invalid check {check!r}, field {field!r}: {why}")


class NotScorable(InvalidCheck):
    """A check that exists but cannot be scored on this machine (see `CheckSpec.reason`)."""


def _arg_error(check, spec, value):
    """The reason `value` is not a valid `spec` argument, or None."""
    if spec.kind == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            return f"must be an int, got {type(value).__name__}"
        if value < spec.minimum:
            return f"must be >= {spec.minimum}, got {value}"
    elif spec.kind == "choice":
        if not isinstance(value, str) or value not in spec.choices:
            shown = spec.choices if len(spec.choices) < 10 else f"{len(spec.choices)} codes"
            return f"must be one of {shown}, got {value!r}"
    elif spec.kind == "str":
        if not isinstance(value, str) or not value.strip():
            return f"must be a non-empty str, got {value!r}"
    elif spec.kind == "str_list":
        if (not isinstance(value, (list, tuple)) or not value
                or not all(isinstance(v, str) and v.strip() for v in value)):
            return f"must be a non-empty list of non-empty str, got {value!r}"
    if spec.regex:
        for v in (value if spec.kind == "str_list" else [value]):
            try:
                re.compile(v)
            except re.error as e:
                return f"{v!r} is used as a regular expression and does not compile ({e})"
    if spec.name == "letter" and not (len(value) == 1 and "a" <= value.lower() <= "z"):
        return f"must be one ASCII letter, got {value!r}"
    return None


def validate(check: str, args) -> dict:
    """The arguments of `check`, checked against its schema (`table.CHECKS`).

    Args:
        check: an IFEval instruction id, e.g. "punctuation:no_comma".
        args: {argument name: value}, every argument of the check and no other.

    Returns:
        a new dict of the same arguments (lists copied).

    Raises:
        InvalidCheck: unknown id (field "check"), args not a mapping (field "args"), a
            missing, extra or wrongly typed argument, a value out of range, or a regex
            argument that does not compile (field: the argument's name).
    """
    spec = CHECKS.get(check)
    if spec is None:
        raise InvalidCheck(check, "check", "not one of the 25 IFEval instruction ids")
    if not isinstance(args, Mapping):
        raise InvalidCheck(check, "args", f"must be a mapping, got {type(args).__name__}")
    for name in args:
        if name not in spec.arg_names:
            raise InvalidCheck(check, str(name), f"unexpected argument (takes {spec.arg_names})")
    out = {}
    for a in spec.args:
        if a.name not in args:
            raise InvalidCheck(check, a.name, "missing argument")
        why = _arg_error(check, a, args[a.name])
        if why:
            raise InvalidCheck(check, a.name, why)
        out[a.name] = list(args[a.name]) if a.kind == "str_list" else args[a.name]
    if "nth_paragraph" in out and out["nth_paragraph"] > out["num_paragraphs"]:
        raise InvalidCheck(check, "nth_paragraph", "must be <= num_paragraphs")
    return out


def build(check: str, args):
    """The library's checker for (check, args), its description built, plus the sentence.

    Returns:
        (checker, sentence): the `if_verifiable.ifeval` instruction object and the string
        `build_description(**args)` returned.

    Raises:
        InvalidCheck: as `validate`, or the checker rejected a value (field "args"), or it
            drew a value from Python's global `random` (which a validated value should
            never let it do; the generator's state is restored).
    """
    args = validate(check, args)
    checker = CHECKER_CLASSES[check](check)
    state = random.getstate()
    try:
        sentence = checker.build_description(**args)
    except (ValueError, TypeError, KeyError) as e:
        raise InvalidCheck(check, "args", f"the checker rejected {args!r}: {e}") from e
    if random.getstate() != state:
        random.setstate(state)
        raise InvalidCheck(check, "args", f"the checker drew a random value for {args!r}")
    return checker, sentence


def render(check: str, args) -> str:
    """The checker's own sentence for the item: `build_description(**args)`.

    Raises:
        InvalidCheck: as `build`. A not-scorable check still renders.
    """
    return build(check, args)[1]


def follows(checker, response: str, loose: bool = False) -> bool:
    """Whether a built checker accepts `response`: strict, or loose as IFEval defines it."""
    variants = get_loose_transformations(response) if loose else [response]
    return any(bool(v.strip()) and bool(checker.check_following(v)) for v in variants)


def scorable_checker(check: str, args):
    """`build(check, args)[0]`, refusing a check that cannot be scored here.

    Raises:
        NotScorable: `CHECKS[check].scorable` is False, or the check needs punkt and
            `punkt.ensure_punkt` cannot provide it (field "check").
        InvalidCheck: as `build`.
    """
    spec = CHECKS.get(check)
    if spec is not None and not spec.scorable:
        raise NotScorable(check, "check", f"not scorable on this machine: {spec.reason}")
    if spec is not None and spec.needs_punkt:
        try:
            punkt.ensure_punkt()
        except RuntimeError as e:
            raise NotScorable(check, "check", f"not scorable on this machine: {e}") from e
    return build(check, args)[0]


def verdict(check: str, args, response: str, loose: bool = False) -> bool:
    """v(y) of METHOD 13: True when the checker accepts `response`.

    Args:
        check, args: the item (see `validate`).
        response: the response text y.
        loose: False for IFEval's strict verdict, True for its loose one (module docstring).

    Raises:
        NotScorable: the check cannot be scored on this machine (`scorable_checker`).
        InvalidCheck: as `validate` / `build`.
    """
    return follows(scorable_checker(check, args), response, loose)
