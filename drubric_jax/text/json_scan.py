"""Finding the rubric JSON value inside a generator's free-text output (METHOD 11, case 11).

Pure Python. `find_rubric_value(text)` returns the first rubric-shaped JSON value of the
text (prose, ```json fences and trailing commas around or inside it are tolerated);
`text.rubric_format.parse_rubric_output` then applies the item rules to it. Objects in
which a key occurs twice come back as `RepeatedKeys` so the caller can reject them.

The search does a bounded amount of work whatever the text (a few ms; degenerate outputs
such as 40 KB of "[{" took seconds before the bounds): it stops, and says so, after
`MAX_TEXT_CHARS`, `MAX_CANDIDATES`, `MAX_SCAN_STEPS` or `MAX_JSON_CHARS`. Real outputs
stay far below them (a generator writes at most a few 10K characters).
"""
from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

MAX_TEXT_CHARS = 1 << 20   # longer texts are not searched at all
MAX_CANDIDATES = 256       # candidate starts tried
MAX_SCAN_STEPS = 1 << 16   # brackets, quotes and backslashes visited by the matcher, in all
MAX_JSON_CHARS = 1 << 20   # characters handed to json.loads, in all

_SPECIAL = re.compile(r'[\[\]{}"\\]')
_CLOSER = {"[": "]", "{": "}"}
_RUNOFF = -1    # reached the end of the text inside the value
_MISMATCH = -2  # a closing bracket of the wrong kind
_NO_STEPS = -3  # `max_steps` used up before the value closed


def _match_value(text: str, start: int, max_steps: int) -> tuple[int, int]:
    """(end, steps): end index (exclusive) of the bracketed value opening at text[start].

    String-aware: brackets and backticks inside JSON strings (with backslash
    escapes) do not count. `end` is `_RUNOFF` when the text ends before the value
    closes, `_MISMATCH` for a wrongly nested closer and `_NO_STEPS` when more than
    `max_steps` special characters would be visited; `steps` is how many were.
    """
    stack: list = []
    in_str = False
    pos = start
    for step in range(1, max_steps + 1):
        m = _SPECIAL.search(text, pos)
        if m is None:
            return _RUNOFF, step
        c, i = m.group(), m.start()
        pos = i + 1
        if in_str:
            if c == "\\":
                # Skip the escaped character: an escaped quote does not close the string.
                pos = i + 2
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            stack.append(c)
        elif c in "]}":
            if not stack or _CLOSER[stack.pop()] != c:
                return _MISMATCH, step
            if not stack:
                return i + 1, step
        # a backslash outside a string is invalid JSON; json.loads will say so
    return _NO_STEPS, max_steps


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


class Search(NamedTuple):
    """Result of `find_rubric_value`."""

    value: Any       # the parsed {"rubrics": [...]} object or bare list; None if none found
    ran_off: bool    # a candidate value was still open at the end of the text (cut off)
    work_limit: bool  # the search stopped at a work bound before it had looked everywhere


def find_rubric_value(text: str) -> Search:
    """The first rubric-shaped JSON value in `text` (rules: `parse_rubric_output`, step 2).

    Work bounds: a text longer than `MAX_TEXT_CHARS` is not searched; the search stops
    after `MAX_CANDIDATES` candidate starts, after the bracket matcher has visited
    `MAX_SCAN_STEPS` special characters in all, or before `json.loads` would have read
    more than `MAX_JSON_CHARS` characters in all. Stopping sets `work_limit`.

    Args:
      text: str, a generator's completion.

    Returns:
      Search(value, ran_off, work_limit); value is None when nothing rubric-shaped was
      found (within the bounds).

    Raises:
      RecursionError, MemoryError: absurdly deep nesting (the caller counts the output as
        unparseable).
    """
    if len(text) > MAX_TEXT_CHARS:
        return Search(None, False, True)
    ran_off = False
    pos = 0
    steps, json_chars = MAX_SCAN_STEPS, MAX_JSON_CHARS
    for _ in range(MAX_CANDIDATES):
        m = _CANDIDATE.search(text, pos)
        if m is None:
            return Search(None, ran_off, False)
        start = m.start()
        end, used = _match_value(text, start, steps)
        steps -= used
        if end == _NO_STEPS:
            return Search(None, ran_off, True)
        if end == _RUNOFF:
            # An unclosed value may still hold a complete one: retry from the next character.
            ran_off = True
            pos = start + 1
            continue
        if end == _MISMATCH:
            pos = start + 1
            continue
        json_chars -= end - start
        if json_chars < 0:
            return Search(None, ran_off, True)
        segment = _drop_trailing_commas(text[start:end])
        try:
            value = json.loads(segment, strict=False, object_pairs_hook=_json_object)
        except ValueError:
            pos = start + 1
            continue
        if _is_rubric_shaped(value):
            return Search(value, False, False)
        pos = end  # valid JSON but not a rubric: skip it whole
    # Candidates left over: the MAX_CANDIDATES bound stopped the search.
    return Search(None, ran_off, _CANDIDATE.search(text, pos) is not None)
