"""Finding the rubric JSON value inside a generator's free-text output (METHOD 11, case 11).

Pure Python. `find_rubric_value(text)` returns the first rubric-shaped JSON value of the
text (prose, ```json fences and trailing commas around or inside it are tolerated);
`text.rubric_format.parse_rubric_output` then applies the item rules to it. Objects in
which a key occurs twice come back as `RepeatedKeys` so the caller can reject them.
"""
from __future__ import annotations

import json
import re

# Candidate start positions tried before giving up (bounds the work on long prose).
_MAX_CANDIDATES = 256

_SPECIAL = re.compile(r'[\[\]{}"\\]')
_CLOSER = {"[": "]", "{": "}"}
_RUNOFF = -1    # reached the end of the text inside the value
_MISMATCH = -2  # a closing bracket of the wrong kind


def _match_value(text: str, start: int) -> int:
    """End index (exclusive) of the bracketed value opening at text[start].

    String-aware: brackets and backticks inside JSON strings (with backslash
    escapes) do not count. Returns `_RUNOFF` when the text ends before the value
    closes and `_MISMATCH` for a wrongly nested closer.
    """
    stack: list = []
    in_str = False
    pos = start
    while True:
        m = _SPECIAL.search(text, pos)
        if m is None:
            return _RUNOFF
        c, i = m.group(), m.start()
        pos = i + 1
        if in_str:
            if c == "\\":
                pos = i + 2
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            stack.append(c)
        elif c in "]}":
            if not stack or _CLOSER[stack.pop()] != c:
                return _MISMATCH
            if not stack:
                return i + 1
        # a backslash outside a string is invalid JSON; json.loads will say so


_STRING_OR_TRAILING_COMMA = re.compile(r'"(?:[^"\\]|\\.)*"|,(\s*[\]}])', re.DOTALL)


def _drop_trailing_commas(segment: str) -> str:
    """Removes commas outside strings that directly precede `]` or `}`."""
    return _STRING_OR_TRAILING_COMMA.sub(
        lambda m: m.group(1) if m.group(1) is not None else m.group(0), segment)


class RepeatedKeys(dict):
    """A JSON object in which some key occurs twice (holding the last value, as `json` does)."""


def _json_object(pairs: list) -> dict:
    """`object_pairs_hook` of json.loads: marks objects with a repeated key."""
    obj = dict(pairs)
    return RepeatedKeys(obj) if len(obj) < len(pairs) else obj


def _is_rubric_shaped(value) -> bool:
    """An object with a list under "rubrics", or a list that is empty or holds an object.

    (A list of plain numbers or strings, such as "[1]" in prose, is not a rubric.)
    """
    if isinstance(value, dict):
        return isinstance(value.get("rubrics"), list)
    return isinstance(value, list) and (not value or any(isinstance(x, dict) for x in value))


_CANDIDATE = re.compile(r'\[\s*[{\]"]|\{\s*["}]')


def find_rubric_value(text: str):
    """The first rubric-shaped JSON value in `text` (rules: `parse_rubric_output`, step 2).

    Args:
      text: str, a generator's completion.

    Returns:
      (value, ran_off): value is the parsed `{"rubrics": [...]}` object or bare list, or
      None when there is none; ran_off is True when some candidate value was still open
      at the end of the text (the output was cut off).

    Raises:
      RecursionError, MemoryError: absurdly deep nesting (the caller counts the output as
        unparseable).
    """
    ran_off = False
    pos = 0
    for _ in range(_MAX_CANDIDATES):
        m = _CANDIDATE.search(text, pos)
        if m is None:
            break
        start = m.start()
        end = _match_value(text, start)
        if end == _RUNOFF:
            ran_off = True
            pos = start + 1
            continue
        if end == _MISMATCH:
            pos = start + 1
            continue
        segment = _drop_trailing_commas(text[start:end])
        try:
            value = json.loads(segment, strict=False, object_pairs_hook=_json_object)
        except ValueError:
            pos = start + 1
            continue
        if _is_rubric_shaped(value):
            return value, False
        pos = end  # valid JSON but not a rubric: skip it whole
    return None, ran_off
