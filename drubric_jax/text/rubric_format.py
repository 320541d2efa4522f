"""The rubric-list format: JSON schema, parser of generator output, padding (METHOD 2, 8, 11).

Pure Python plus numpy; nothing here touches a model.

- `RUBRIC_JSON_SCHEMA`: the JSON schema of one generator output, for constrained decoding
  (METHOD section 8: "Output is JSON").
- `parse_rubric_output`: free text -> `ParsedRubric` (METHOD section 11 "Rubric items" and
  "An invalid rubric list"; cases 11 and 13), with one counter per drop reason
  (`COUNTER_KEYS`).
- `pad_rubrics`: B parsed lists -> padded texts, weights and masks with M items, the inputs
  of Eq. 12, 13 in `drubric_jax.rl.rewards`.
- `MIN_WEIGHT` / `MAX_WEIGHT`: the valid weight range of w_m, shared with `rewards`.
- `CRITERION_PLACEHOLDER` / `WEIGHT_PLACEHOLDER`: the placeholders of the generator
  prompt's output format line (`text.prompts` writes them; the parser drops items that only
  echo them).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from drubric_jax.text.json_scan import RepeatedKeys, Search, find_rubric_value

MIN_WEIGHT = 1  # smallest valid rubric weight (METHOD 2)
MAX_WEIGHT = 5  # largest valid rubric weight (METHOD 2)

# Placeholders of the generator prompt's output format line (`text.prompts`):
# {"rubrics": [{"rubric": "<criterion>", "weight": <integer 1-5>}, ...]}
CRITERION_PLACEHOLDER = "<criterion>"
WEIGHT_PLACEHOLDER = f"<integer {MIN_WEIGHT}-{MAX_WEIGHT}>"

COUNTER_KEYS = (
    "unparseable",       # no rubric-shaped JSON value found in the text
    "truncated",         # finish_reason == "length", or the text ends inside a JSON value
    "work_limit",        # the search for the JSON value stopped at a work bound (json_scan)
    "no_valid_items",    # parsed, but zero items survived (e.g. "[]", all weights 0)
    "non_object_item",   # list element that is not a JSON object
    "duplicate_key",     # a key occurs twice in an item, or in the {"rubrics": ...} wrapper
    "empty_text",        # "rubric" missing, not a string, or blank
    "invalid_unicode",   # "rubric" holds a lone surrogate (JSON "\ud800"): not encodable text
    "placeholder_item",  # "rubric" only echoes the prompt's format line ("<criterion>", "...")
    "invalid_weight",    # "weight" missing, bool, float (3.0 too), string, or outside 1..5
    "duplicate",         # same text as an earlier item (case/whitespace-insensitive)
    "over_limit",        # valid item beyond max_items
)
"""Names of the `ParsedRubric.counters` entries (always all present)."""


# ----------------------------------------------------------------------------
# JSON schema
# ----------------------------------------------------------------------------

def RUBRIC_JSON_SCHEMA(max_items: int = 16, max_item_chars: int = 400) -> dict:  # noqa: N802
    """JSON schema of one generator output (METHOD section 8, for constrained decoding).

    The accepted documents are exactly
    `{"rubrics": [{"rubric": <str, 1..max_item_chars chars>, "weight": <int 1..5>}, ...]}`
    with 1..max_items items and no extra keys. Only plain JSON-Schema keywords are
    used (type, properties, required, items, minItems, maxItems, minLength,
    maxLength, minimum, maximum, additionalProperties), so llguidance / outlines /
    xgrammar JSON-schema grammars accept it.

    Args:
      max_items: int >= 1, maxItems of the "rubrics" array.
      max_item_chars: int >= 1, maxLength of each criterion string (characters).

    Returns:
      dict: a fresh schema object (safe to mutate).

    Raises:
      ValueError: max_items or max_item_chars < 1.
    """
    if int(max_items) < 1 or int(max_item_chars) < 1:
        raise ValueError(f"max_items and max_item_chars must be >= 1, got "
                         f"{max_items}, {max_item_chars}")
    item = {
        "type": "object",
        "properties": {
            "rubric": {"type": "string", "minLength": 1, "maxLength": int(max_item_chars)},
            "weight": {"type": "integer", "minimum": MIN_WEIGHT, "maximum": MAX_WEIGHT},
        },
        "required": ["rubric", "weight"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            # minItems 1: an empty list is never a complete document (METHOD 11 counts it invalid).
            "rubrics": {"type": "array", "items": item, "minItems": 1,
                        "maxItems": int(max_items)},
        },
        "required": ["rubrics"],
        "additionalProperties": False,
    }


# ----------------------------------------------------------------------------
# Parsing generator output
# ----------------------------------------------------------------------------

@dataclass
class ParsedRubric:
    """One parsed rubric list R = {(r_m, w_m)} (METHOD 2, 11).

    Attributes:
      texts: list[str], kept criteria r_m in output order (surrounding
        whitespace stripped). Empty when `valid` is False.
      weights: list[int], w_m in 1..5, same length as `texts`.
      valid: bool, True when the output was complete, parseable and kept at
        least one item. An invalid list gets the documented invalid-output
        reward (R_disc = 0, R_anchor = floor; METHOD 11).
      truncated: bool, the output was cut off (finish_reason "length" or the
        text ends inside the JSON value). Implies not valid.
      counters: dict[str, int] with every key of `COUNTER_KEYS`.
    """

    texts: list = field(default_factory=list)
    weights: list = field(default_factory=list)
    valid: bool = False
    truncated: bool = False
    counters: dict = field(default_factory=lambda: {k: 0 for k in COUNTER_KEYS})

    @property
    def items(self) -> list:
        """list[tuple[str, int]]: (text, weight) pairs."""
        return list(zip(self.texts, self.weights))

    @property
    def num_dropped(self) -> int:
        """int: items present in the output but not kept."""
        return sum(self.counters[k] for k in ("non_object_item", "duplicate_key", "empty_text",
                                              "invalid_unicode", "placeholder_item",
                                              "invalid_weight", "duplicate", "over_limit"))


def _norm_key(text: str) -> str:
    """Duplicate key: case-folded, runs of whitespace collapsed, ends stripped."""
    return " ".join(text.split()).casefold()


def _is_utf8_encodable(text: str) -> bool:
    """False for a str holding a lone surrogate (json.loads makes one from "\\ud800")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_WORD = re.compile(r"[^\W\d_]+")  # a run of letters
_FORMAT_WORDS = frozenset(_WORD.findall(f"{CRITERION_PLACEHOLDER} {WEIGHT_PLACEHOLDER}")
                          + ["rubric", "rubrics", "weight"])
_ELLIPSES = ("...", "\u2026")


def _is_format_echo(text: str) -> bool:
    """True when an item text only repeats the placeholders / keys of the format line."""
    words = _WORD.findall(text.casefold())
    if words:
        return set(words) <= _FORMAT_WORDS
    return any(e in text for e in _ELLIPSES)


def _is_json_int(w) -> bool:
    """JSON integer: Python int but not bool (3.0 is a float and is rejected)."""
    return isinstance(w, int) and not isinstance(w, bool)


def parse_rubric_output(text: str, finish_reason: Optional[str] = "stop",
                        max_items: int = 16) -> ParsedRubric:
    """Parses a generator's free-text output into a rubric list (METHOD 11, cases 11, 13).

    Never raises. Steps:

    1. `finish_reason == "length"` -> invalid, `truncated` (no salvage of the
       items that happened to be complete; the generator gets the documented
       invalid-output reward).
    2. Find the first rubric-shaped JSON value. Candidate starts, in order, are
       a `[` followed (after optional whitespace) by `{`, `]` or `"`, and a `{`
       followed by `"` or `}` -- the only ways a rubric value can begin, so
       prose brackets like "(v2)", "[1]" or "[see note 1]" are never tried.
       From a start, find the matching closer with string-aware bracket
       matching (brackets and backticks inside JSON strings do not count);
       remove commas outside strings that directly precede `]` or `}`;
       `json.loads(strict=False)` (raw control characters inside strings are
       tolerated). A candidate that does not parse (prose such as
       `["draft"] notes]`) is skipped and the search goes on at the next character;
       a value that parses but is not rubric-shaped (an object without a
       "rubrics" list, a list without objects such as "[1]") is skipped whole.
       Prose before and after the value, and a ```json fence around it, are
       therefore ignored without being edited (backticks inside strings stay).
       Accepted shapes: `{"rubrics": [...]}` (other keys ignored) and a bare
       list `[...]`. A wrapper object in which a key occurs twice is ambiguous
       (`json` keeps the last value, other readers the first): the output is
       invalid (`duplicate_key` and `no_valid_items`).
       The work is bounded (`json_scan.find_rubric_value`: texts over 2^20
       characters are not searched; at most 256 candidates, 2^16 bracket /
       quote characters visited and 2^20 characters given to json.loads);
       where the search stops at a bound, `work_limit` is counted and the
       output is treated as in step 3.
    3. Nothing found: `truncated` when a candidate runs to the end of the
       text unclosed, else `unparseable`.
    4. Items, in order; a dropped item is counted once, by the first rule it
       fails (extra keys in an item are ignored):
       a. not a JSON object -> `non_object_item`;
       b. an object in which any key occurs twice (e.g. two "weight"s: which
          value was meant is unknown) -> `duplicate_key`;
       c. "rubric" missing, not a string or blank -> `empty_text`;
       d. "rubric" holds a lone surrogate code point (the JSON escape
          "\\ud800" without its pair; no tokenizer or UTF-8 writer accepts
          it) -> `invalid_unicode`;
       e. "rubric" only echoes the prompt's format line -> `placeholder_item`:
          its words (letter runs, any case) all come from "<criterion>",
          "<integer 1-5>", "rubric", "rubrics", "weight" (so "<criterion_1",
          "Criterion 2", "weight: 5"), or it has no letters and holds "...";
       f. "weight" not a JSON integer in 1..5 (bools, floats including 3.0,
          strings, out of range; never clamped) -> `invalid_weight`;
       g. the text equals an earlier kept one up to case and whitespace runs
          -> `duplicate` (the first is kept);
       h. a valid item beyond `max_items` -> `over_limit` (counted after
          de-duplication).
    5. No item left -> invalid (`no_valid_items`), e.g. "[]" or all weights 0.

    Args:
      text: str, the decoded completion only (never prompt + completion).
        A non-string counts as unparseable.
      finish_reason: str or None, the sampler's reason for stopping ("stop",
        "length", ...). Only "length" has a meaning here.
      max_items: int >= 1, most items kept.

    Returns:
      ParsedRubric with texts/weights empty whenever `valid` is False.
    """
    out = ParsedRubric()
    c = out.counters
    # Step 1: a list cut by the token budget is invalid; nothing is salvaged.
    if finish_reason == "length":
        out.truncated = True
        c["truncated"] = 1
        return out
    if not isinstance(text, str):
        c["unparseable"] = 1
        return out
    try:
        # Step 2: the first rubric-shaped JSON value (`json_scan`, bounded work).
        value, ran_off, work_limit = find_rubric_value(text)
    except (RecursionError, MemoryError):  # absurdly deep nesting: not a rubric
        value, ran_off, work_limit = Search(None, False, False)
    c["work_limit"] = int(work_limit)
    # Step 3: nothing found: cut off (truncated) or unparseable.
    if value is None:
        if ran_off:
            out.truncated = True
            c["truncated"] = 1
        else:
            c["unparseable"] = 1
        return out
    if isinstance(value, RepeatedKeys):  # e.g. two "rubrics" lists: which one is meant?
        c["duplicate_key"] = 1
        c["no_valid_items"] = 1
        return out

    seen = set()
    limit = max(int(max_items), 0)
    # Step 4: an item is dropped by the first rule (a-h) it fails, and counted there.
    for item in (value["rubrics"] if isinstance(value, dict) else value):
        if not isinstance(item, dict):
            c["non_object_item"] += 1
            continue
        if isinstance(item, RepeatedKeys):
            c["duplicate_key"] += 1
            continue
        r = item.get("rubric")
        if not isinstance(r, str) or not r.strip():
            c["empty_text"] += 1
            continue
        if not _is_utf8_encodable(r):
            c["invalid_unicode"] += 1
            continue
        if _is_format_echo(r):
            c["placeholder_item"] += 1
            continue
        w = item.get("weight")
        if not (_is_json_int(w) and MIN_WEIGHT <= w <= MAX_WEIGHT):
            c["invalid_weight"] += 1
            continue
        key = _norm_key(r)
        if key in seen:
            c["duplicate"] += 1
            continue
        seen.add(key)
        if len(out.texts) >= limit:
            c["over_limit"] += 1
            continue
        out.texts.append(r.strip())
        out.weights.append(int(w))
    # Step 5: no item left.
    if not out.texts:
        c["no_valid_items"] = 1
        return out
    out.valid = True
    return out



def pad_rubrics(parsed_list: Sequence[ParsedRubric], m_max: int):
    """Pads a batch of parsed rubric lists to M = m_max items (inputs of Eq. 12, 13).

    Invalid lists (METHOD 11) come out with every item masked off, so the
    scoring code sees sum_m w_m = 0 and applies its documented invalid rule.

    Args:
      parsed_list: B `ParsedRubric`s.
      m_max: int >= 1, padded item count M.

    Returns:
      texts: list[list[str]], B lists of exactly m_max strings ("" at padding
        and for invalid lists).
      weights: int32[B, m_max], w_m (0 at padding).
      item_mask: bool[B, m_max], True for real items.
      list_valid: bool[B], `ParsedRubric.valid`.

    Raises:
      ValueError: m_max < 1, or a valid list holds more than m_max items
        (parse with max_items <= m_max).
    """
    m_max = int(m_max)
    if m_max < 1:
        raise ValueError(f"m_max must be >= 1, got {m_max}")
    b = len(parsed_list)
    texts = [[""] * m_max for _ in range(b)]
    weights = np.zeros((b, m_max), np.int32)
    mask = np.zeros((b, m_max), bool)
    valid = np.zeros((b,), bool)
    for i, p in enumerate(parsed_list):
        # An invalid list stays all-masked: sum w = 0, so it scores every response 0 (METHOD 11).
        if not p.valid:
            continue
        n = len(p.texts)
        if n > m_max:
            raise ValueError(f"rubric list {i} has {n} items > m_max={m_max}; "
                             f"parse with max_items <= m_max")
        texts[i][:n] = list(p.texts)
        weights[i, :n] = p.weights
        mask[i, :n] = True
        valid[i] = True
    return texts, weights, mask, valid
