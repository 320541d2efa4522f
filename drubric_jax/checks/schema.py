"""What a generator of checkable items may write (METHOD 13): the JSON schema of a list of
items and one line per check for its prompt.

    items_json_schema  {"rubrics": [{"check", "args", "weight"}, ...]}, the args typed per
                       check: an `anyOf` of one object schema per scorable check
    check_lines        "- <id> {<arg>: <type>, ...}: <the checker's sentence, placeholders>"

The argument schemas follow `table.CHECKS` (IFEval's checkers, Zhou et al. 2023,
arXiv:2311.07911, as if-verifiable packages them): an int is an integer in
[minimum, the top of its draw range] (the values a true check of the data can hold), a
choice an enum, a string drawn from fixed options an enum of them, a letter one of a-z,
a keyword (a regex argument, or a first word) one word of letters, a keyword list 1-3
such words, the prompt to repeat a string of at most `max_str_chars`. What JSON schema
cannot say (nth_paragraph <= num_paragraphs) is left to `verify.validate`.
"""
from __future__ import annotations

from drubric_jax.checks.table import CHECKS, SCORABLE_CHECKS, instructions_util
from drubric_jax.checks.verify import render

MAX_KEYWORDS = 3  # most words of a keyword-list argument (IFEval draws 2)
_WORD = {"type": "string", "pattern": "^[A-Za-z][A-Za-z'-]{0,23}$"}  # one word, <= 24 chars
_LETTERS = tuple("abcdefghijklmnopqrstuvwxyz")


def _arg_schema(a, max_str_chars: int) -> dict:
    if a.kind == "int":
        return {"type": "integer", "minimum": int(a.minimum), "maximum": int(a.draw[1])}
    if a.kind == "choice":
        return {"enum": list(a.choices)}
    if a.kind == "str_list":
        return {"type": "array", "items": dict(_WORD), "minItems": 1, "maxItems": MAX_KEYWORDS}
    if a.name == "letter":
        return {"enum": list(_LETTERS)}
    if a.draw:
        return {"enum": list(a.draw)}
    if a.name == "prompt_to_repeat":
        return {"type": "string", "minLength": 1, "maxLength": int(max_str_chars)}
    return dict(_WORD)  # keyword, first_word


def item_schema(check: str, max_str_chars: int = 200) -> dict:
    """The object schema of one item of `check`: {"check": const, "args": {...}, "weight":
    1..5}, keys in that order, nothing else."""
    spec = CHECKS[check]
    args = {"type": "object",
            "properties": {a.name: _arg_schema(a, max_str_chars) for a in spec.args},
            "required": list(spec.arg_names), "additionalProperties": False}
    return {"type": "object",
            "properties": {"check": {"const": check}, "args": args,
                           "weight": {"type": "integer", "minimum": 1, "maximum": 5}},
            "required": ["check", "args", "weight"], "additionalProperties": False}


def items_json_schema(max_items: int, max_str_chars: int = 200,
                      checks=SCORABLE_CHECKS) -> dict:
    """JSON schema of one generator output under `verifier.kind = "checks"`:
    `{"rubrics": [item, ...]}` with 1..max_items items, each an `item_schema` of one of
    `checks` (an `anyOf`; llguidance compiles it in milliseconds).

    Args:
        max_items: int >= 1; max_str_chars: maxLength of a free string argument (>= 1);
        checks: the check ids a list may use (default: every scorable check).

    Returns:
        a fresh dict.

    Raises:
        ValueError: max_items or max_str_chars < 1, or an unknown / unscorable check.
    """
    if int(max_items) < 1 or int(max_str_chars) < 1:
        raise ValueError(f"max_items and max_str_chars must be >= 1, got {max_items}, "
                         f"{max_str_chars}")
    bad = [c for c in checks if c not in SCORABLE_CHECKS]
    if bad or not checks:
        raise ValueError(f"checks must be scorable check ids, got {bad or 'none'}")
    item = {"anyOf": [item_schema(c, max_str_chars) for c in checks]}
    return {"type": "object",
            "properties": {"rubrics": {"type": "array", "items": item, "minItems": 1,
                                       "maxItems": int(max_items)}},
            "required": ["rubrics"], "additionalProperties": False}


def _type_text(a) -> str:
    if a.kind == "int":
        return f"int {a.minimum}-{a.draw[1]}"
    if a.kind == "choice":
        return "language code" if len(a.choices) > 4 else "|".join(f'"{c}"' for c in a.choices)
    if a.kind == "str_list":
        return "list of words"
    if a.draw:
        return "|".join(f'"{c}"' for c in a.draw)
    return "letter" if a.name == "letter" else "text" if a.name == "prompt_to_repeat" else "word"


def _sentinels(spec) -> tuple[dict, dict]:
    """Arguments that render into recognisable strings, and {string: "<arg name>"}."""
    args, subs = {}, {}
    for i, a in enumerate(spec.args):
        if a.kind == "int":
            v = 7100 - i  # decreasing: nth_paragraph (2nd) <= num_paragraphs (1st)
            args[a.name], subs[str(v)] = v, f"<{a.name}>"
        elif a.kind == "choice":
            v = a.choices[0]
            shown = instructions_util.LANGUAGE_CODES.get(v, v)
            args[a.name], subs[shown] = v, f"<{a.name}>"
        elif a.kind == "str_list":
            args[a.name], subs["['QQ']"] = ["QQ"], f"<{a.name}>"
        elif a.name == "letter":
            args[a.name], subs[" q "] = "q", f" <{a.name}> "
        else:
            v = f"qq{i}"
            args[a.name], subs[v] = v, f"<{a.name}>"
    return args, subs


def check_line(check: str) -> str:
    """One prompt line for `check`: its id, its arguments with their types, and the
    checker's own sentence (first line, whitespace collapsed) with each argument shown as
    <name>."""
    spec = CHECKS[check]
    args, subs = _sentinels(spec)
    sentence = " ".join(render(check, args).splitlines()[0].split())
    for shown, name in subs.items():
        sentence = sentence.replace(shown, name)
    typed = ", ".join(f"{a.name}: {_type_text(a)}" for a in spec.args)
    return f"- {check} {{{typed}}}: {sentence}"


def check_lines(checks=SCORABLE_CHECKS) -> str:
    """`check_line` of each check, one a line (the generator prompt's list of checks)."""
    return "\n".join(check_line(c) for c in checks)
