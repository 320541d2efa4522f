"""Host-side text handling for rubrics: schema, parsing, padding and prompts.

Pure Python (plus numpy for the padded arrays); nothing here touches a model.

Contents (METHOD = ../shared/docs/METHOD.md):
- `RUBRIC_JSON_SCHEMA`: the JSON schema of a generator output, for
  constrained decoding (METHOD section 8: "Output is JSON").
- `parse_rubric_output`: free text -> `ParsedRubric` (METHOD section 11
  "Rubric items" and "An invalid rubric list"; cases 11 and 13).
- `pad_rubrics`: a batch of parsed lists -> padded weights / masks for the
  jitted scoring code (Eq. 12, 13 in `drubric_jax.rewards`).
- `parse_text_verdict`: a verifier's generated yes/no text -> v in {0, 1}
  (case 14; the probability route lives with the verifier).
- prompt builders for the generator (dynamic and static / RaR), the
  verifier (shared prefix + per-item suffix), and the direct / pairwise
  judge baselines (METHOD sections 6 and 8). The wording is this project's
  own; it follows the principles listed in METHOD section 8.
- `fit_responses` / `truncate_to_caps`: equal-share (water-filling) token
  budgets for putting K responses into a fixed input length.
"""
from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

MIN_WEIGHT = 1  # smallest valid rubric weight (METHOD 2)
MAX_WEIGHT = 5  # largest valid rubric weight (METHOD 2)

TRUNCATION_MARKER = " [...truncated]"
"""Visible marker appended to a response that was cut to fit the input budget."""

COUNTER_KEYS = (
    "unparseable",      # no rubric-shaped JSON value found in the text
    "truncated",        # finish_reason == "length", or the text ends inside a JSON value
    "no_valid_items",   # parsed, but zero items survived (e.g. "[]", all weights 0)
    "non_object_item",  # list element that is not a JSON object
    "empty_text",       # "rubric" missing, not a string, or blank
    "invalid_weight",   # "weight" missing, bool, float (3.0 too), string, or outside 1..5
    "duplicate",        # same text as an earlier item (case/whitespace-insensitive)
    "over_limit",       # valid item beyond max_items
)
"""Names of the `ParsedRubric.counters` entries (always all present)."""

# Candidate start positions tried before giving up (bounds the work on long prose).
_MAX_CANDIDATES = 256


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
        return sum(self.counters[k] for k in ("non_object_item", "empty_text",
                                              "invalid_weight", "duplicate", "over_limit"))


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


def _rubric_items(value) -> Optional[list]:
    """The item list if `value` is rubric-shaped, else None.

    Rubric-shaped: an object with a list under "rubrics", or a list that is
    empty or holds at least one object. (A list of plain numbers or strings,
    such as "[1]" in prose, is not a rubric.)
    """
    if isinstance(value, dict):
        items = value.get("rubrics")
        return items if isinstance(items, list) else None
    if isinstance(value, list):
        if not value or any(isinstance(x, dict) for x in value):
            return value
    return None


def _norm_key(text: str) -> str:
    """Duplicate key: case-folded, runs of whitespace collapsed, ends stripped."""
    return " ".join(text.split()).casefold()


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
       prose brackets like "(v2)", "[1]" or "[see note 1]" are never tried
       (at most 256 candidates). From a start, find the matching closer with
       string-aware bracket matching (brackets and backticks inside JSON strings
       do not count); remove commas outside strings that directly precede `]`
       or `}`; `json.loads(strict=False)` (raw control characters inside
       strings are tolerated). A candidate that does not parse (prose such as
       `["draft"] notes]`) is skipped and the search goes on at the next character;
       a value that parses but is not rubric-shaped (an object without a
       "rubrics" list, a list without objects such as "[1]") is skipped whole.
       Prose before and after the value, and a ```json fence around it, are
       therefore ignored without being edited (backticks inside strings stay).
       Accepted shapes: `{"rubrics": [...]}` (other keys ignored) and a bare
       list `[...]`.
    3. Nothing found: `truncated` when a candidate runs to the end of the
       text unclosed, else `unparseable`.
    4. Items, in order: a non-object -> dropped (`non_object_item`); "rubric"
       missing / not a string / blank -> dropped (`empty_text`); "weight" not a
       JSON integer in 1..5 (bools, floats including 3.0, strings, out of range)
       -> dropped, never clamped (`invalid_weight`); a text equal to an earlier
       kept one up to case and whitespace runs -> dropped (`duplicate`, first
       kept); valid items beyond `max_items` -> dropped (`over_limit`; counted
       after de-duplication). Extra keys in an item are ignored. Each dropped
       item is counted once, by the first failing rule in this order.
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
    if finish_reason == "length":
        out.truncated = True
        c["truncated"] = 1
        return out
    if not isinstance(text, str):
        c["unparseable"] = 1
        return out
    try:
        items, ran_off = _find_rubric_value(text)
    except (RecursionError, MemoryError):  # absurdly deep nesting: not a rubric
        items, ran_off = None, False
    if items is None:
        if ran_off:
            out.truncated = True
            c["truncated"] = 1
        else:
            c["unparseable"] = 1
        return out

    seen = set()
    limit = max(int(max_items), 0)
    for item in items:
        if not isinstance(item, dict):
            c["non_object_item"] += 1
            continue
        r = item.get("rubric")
        if not isinstance(r, str) or not r.strip():
            c["empty_text"] += 1
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
    if not out.texts:
        c["no_valid_items"] = 1
        return out
    out.valid = True
    return out


_CANDIDATE = re.compile(r'\[\s*[{\]"]|\{\s*["}]')


def _find_rubric_value(text: str):
    """(items or None, ran_off) for the first rubric-shaped JSON value in text."""
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
            value = json.loads(segment, strict=False)
        except ValueError:
            pos = start + 1
            continue
        items = _rubric_items(value)
        if items is not None:
            return items, False
        pos = end  # valid JSON but not a rubric: skip it whole
    return None, ran_off


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


# ----------------------------------------------------------------------------
# Verifier text verdicts
# ----------------------------------------------------------------------------

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_LEAD_MARKUP = "*_`\"'"
_TRAIL_PUNCT = string.punctuation  # includes * _ ` . , ! ? : ; ) ] " '


def parse_text_verdict(completion: str):
    """Reads a verifier's generated answer as v in {0, 1} (case 14).

    Rule: drop every `<think>...</think>` block (and, if a closing `</think>`
    is left without an opening tag because the template opened it, everything
    up to it; an unclosed `<think>` drops everything after it); strip
    whitespace and markdown `*`, `_`, backtick (and quotes) from the start;
    take the first whitespace-separated word; lowercase; strip trailing
    punctuation. "yes" -> (1, False), "no" -> (0, False), anything else
    (including "" and "Yesterday's") -> (0, True): parse failure, counted by
    the caller.

    Only the completion is parsed, never the decoded prompt + completion (the
    prompt's "Answer Yes or No" would be read instead).

    Args:
      completion: str, the generated text only. Non-strings count as failure.

    Returns:
      tuple (v: int in {0, 1}, parse_failure: bool).
    """
    if not isinstance(completion, str):
        return 0, True
    t = _THINK_BLOCK.sub(" ", completion)
    low = t.lower()
    if "</think>" in low:
        t = t[low.rfind("</think>") + len("</think>"):]
        low = t.lower()
    if "<think>" in low:
        t = t[:low.find("<think>")]
    t = t.strip().lstrip(_LEAD_MARKUP).strip()
    words = t.split()
    if not words:
        return 0, True
    word = words[0].lower().rstrip(_TRAIL_PUNCT)
    if word == "yes":
        return 1, False
    if word == "no":
        return 0, False
    return 0, True


# ----------------------------------------------------------------------------
# Prompt builders (METHOD sections 6 and 8; wording is this project's own)
# ----------------------------------------------------------------------------

_GUIDELINES = """Guidelines for the criteria:
- Judge how well a response serves what the user actually asked for.
- Do not build in facts, figures or answers that the user did not supply. Every criterion must be checkable by reading the request and a response.
- If the user set any requirement on format, length, style, language or structure, turn each such requirement into its own strict criterion.
- One property per criterion: split anything of the form "X and Y" into two criteria. Each criterion must have a clear yes or no answer.
- Be concrete enough that two careful graders working independently would give the same answer.
- Put substance first (correctness, completeness, sound reasoning, real usefulness). Add criteria about presentation or formatting only if the user asked for them.
- Word each criterion so that "yes" means better. Avoid negations and double negatives.
- Keep criteria distinct from each other and understandable on their own.
- Weight each criterion with an integer: 5 = essential (failing it makes a response unacceptable), 3 or 4 = important, 1 or 2 = nice to have."""

_OUTPUT_SPEC = ('Reply with a JSON object and nothing else, in this form:\n'
                '{"rubrics": [{"rubric": "<criterion>", "weight": <integer 1-5>}, ...]}')

GENERATOR_SYSTEM_DYNAMIC = (
    "You write grading checklists for answers to user requests. You will see a "
    "user's request and a pool of candidate responses to it. Write yes/no "
    "criteria that a grader can apply to any single response and that separate "
    "the stronger responses from the weaker ones.\n\n"
    "Use the candidate pool only to notice which qualities matter for this request "
    "and where the candidates differ; do not grade the candidates yourself. Never "
    "refer to a particular candidate: no response numbers and no quotes taken from "
    "a candidate.\n\n" + _GUIDELINES + "\n\n" + _OUTPUT_SPEC)
"""System text of the dynamic generator G_phi(x, C) (METHOD 1, 8)."""

GENERATOR_SYSTEM_STATIC = (
    "You write grading checklists for answers to user requests. You will see only "
    "a user's request, with no responses. Write yes/no criteria that a grader can "
    "apply to any single response to this request to judge how good it is.\n\n"
    + _GUIDELINES + "\n\n" + _OUTPUT_SPEC)
"""System text of the static (prompt-only, RaR-style) generator baseline (METHOD 6)."""

VERIFIER_SYSTEM = (
    "You check one criterion against one response. Read the user's request and the "
    "response, then decide whether the response meets the criterion. Judge the "
    "response exactly as written, strictly and literally; if it only partly meets "
    "the criterion, the answer is No. Reply with one word: Yes or No.")
"""System text of the frozen verifier (METHOD 1, 11)."""

DIRECT_JUDGE_SYSTEM = (
    "You assess responses to user requests. Decide whether the response is of high "
    "quality: correct, genuinely helpful, complete, and following every instruction "
    "in the request. Reply with one word: Yes or No.")
"""System text of the pointwise yes/no judge baseline (METHOD 6)."""

PAIRWISE_JUDGE_SYSTEM = (
    "You compare two responses to the same user request. Decide whether Response A "
    "serves the user better than Response B: correctness and following the request "
    "come first, then helpfulness and completeness. Ignore the order in which the "
    "responses are shown and their length as such. Reply with one word: Yes or No.")
"""System text of the pairwise yes/no judge baseline (METHOD 6)."""

_ROLE_LABEL = {"user": "User", "assistant": "Assistant", "system": "System"}


def _history_block(history: Optional[Sequence[dict]]) -> str:
    """Earlier turns as a labelled transcript block ("" when there are none)."""
    if not history:
        return ""
    lines = []
    for turn in history:
        role = _ROLE_LABEL.get(turn.get("role"), str(turn.get("role")))
        lines.append(f"{role}: {turn.get('content', '')}")
    return "[Earlier conversation]\n" + "\n\n".join(lines) + "\n[End of earlier conversation]\n\n"


def _request_block(prompt: str, history: Optional[Sequence[dict]]) -> str:
    """History (if any) + the user's request, delimited."""
    return _history_block(history) + f"[User request]\n{prompt}\n[End of user request]"


def _labelled(label: str, text: str) -> str:
    return f"[{label}]\n{text}\n[End of {label}]"


def _check_order(order: Optional[Sequence[int]], k: int) -> list:
    if order is None:
        return list(range(k))
    order = [int(i) for i in order]
    if sorted(order) != list(range(k)):
        raise ValueError(f"order must be a permutation of range({k}), got {order}")
    return order


def generator_messages(prompt: str, responses: Optional[Sequence[str]],
                       history: Optional[Sequence[dict]] = None,
                       order: Optional[Sequence[int]] = None,
                       max_items: Optional[int] = None) -> list:
    """Chat messages for the rubric generator (METHOD 1, 8; static baseline METHOD 6).

    Layout: [system: instructions + output format] [user: earlier conversation
    (if any), the user request, the candidate responses labelled "Response 1" ..
    "Response K", a closing request]. Position p (0-based) shows
    `responses[order[p]]` as "Response p+1", so a shuffled `order` hides the
    sampling order from the generator.

    With `responses` None or empty, the STATIC (prompt-only, RaR-style) variant is
    built: its own system text, no response pool.

    Args:
      prompt: str, the last user turn x.
      responses: K strings (the set C) or None / [] for the static variant.
      history: earlier turns [{"role": "user"|"assistant", "content": str}] or None.
      order: a permutation of range(K), or None for the given order.
      max_items: if given, the instructions ask for at most this many criteria.

    Returns:
      list[dict]: [{"role": "system", ...}, {"role": "user", ...}].

    Raises:
      ValueError: `order` is not a permutation of range(K).
    """
    static = not responses
    system = GENERATOR_SYSTEM_STATIC if static else GENERATOR_SYSTEM_DYNAMIC
    if max_items is not None:
        system += f"\nWrite at most {int(max_items)} criteria."
    parts = [_request_block(prompt, history)]
    if static:
        parts.append("Write the grading criteria for responses to this request as JSON.")
    else:
        idx = _check_order(order, len(responses))
        parts.append(f"Candidate responses ({len(idx)}):")
        for p, i in enumerate(idx):
            parts.append(_labelled(f"Response {p + 1}", responses[i]))
        parts.append("Write the grading criteria as JSON.")
    return [{"role": "system", "content": system},
            {"role": "user", "content": "\n\n".join(parts)}]


def verifier_prefix_messages(prompt: str, response: str,
                             history: Optional[Sequence[dict]] = None) -> list:
    """Shared-prefix messages of the verifier prompt for one (x, y) pair (METHOD 1, 11).

    Exact layout. The full verifier conversation for item m is

        [{"role": "system", "content": VERIFIER_SYSTEM},
         {"role": "user",   "content": PREFIX_CONTENT + verifier_item_suffix(r_m)}]

    rendered with the chat template and `add_generation_prompt=True`, where
    PREFIX_CONTENT (the user content returned here) is

        [Earlier conversation] ... [End of earlier conversation]   (only with history)
        [User request]\\n<x>\\n[End of user request]\\n\\n[Response]\\n<y>\\n[End of Response]

    and `verifier_item_suffix(r_m)` is

        \\n\\nCriterion: <r_m>\\n\\nDoes the response meet this criterion? Answer Yes or No.

    The answer is the FIRST token the model generates after the rendered text,
    i.e. the first token of the assistant turn ("Yes" / "No"; with
    `plain_render`, " Yes" / " No" after "Assistant:"). P(yes) sums every yes
    variant against every no variant (METHOD 11).

    Prefix caching: everything up to the end of PREFIX_CONTENT is identical for
    all items of one (x, y); the per-item part starts with "\\n\\n" right after
    the "]" that closes the response block. Byte-level BPE pre-tokenizers always
    split between "]" and "\\n", so tokenizing prefix and suffix separately gives
    the same tokens as tokenizing the whole. `render_verifier_prompts` does the
    split for any renderer (it renders and cuts; it never assumes a template).

    Args:
      prompt: str, user request x (last user turn).
      response: str, the response y being checked.
      history: earlier turns or None.

    Returns:
      list[dict]: [system, user(PREFIX_CONTENT)].
    """
    content = _request_block(prompt, history) + "\n\n" + _labelled("Response", response)
    return [{"role": "system", "content": VERIFIER_SYSTEM},
            {"role": "user", "content": content}]


def verifier_item_suffix(item_text: str) -> str:
    """Per-item text appended to the verifier's user content (see
    `verifier_prefix_messages` for the full layout).

    Args:
      item_text: str, the criterion r_m.

    Returns:
      str: "\\n\\nCriterion: <r_m>\\n\\nDoes the response meet this criterion?
      Answer Yes or No." (the user turn ends here; the answer opens the
      assistant turn).
    """
    return (f"\n\nCriterion: {item_text.strip()}\n\n"
            "Does the response meet this criterion? Answer Yes or No.")


_SPLIT_SENTINEL = "\ue000"  # private-use character, absent from real text


def render_verifier_prompts(render: Callable[[list], str], prefix_messages: list,
                            item_texts: Sequence[str]):
    """Splits rendered verifier prompts into one shared prefix + per-item suffixes.

    `render(messages) -> str` is the chat renderer, e.g.
    `lambda m: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)`
    or `plain_render`. Each full prompt is `render(prefix_messages with
    verifier_item_suffix(item) appended to the last user content)`; the shared
    prefix is the rendered text up to where the suffix begins (found by
    rendering once with a sentinel character), so the prefix can be prefilled
    once and each suffix scored after it. The model's answer token follows
    each `prefix + suffix` directly.

    Args:
      render: callable list[dict] -> str (must open the assistant turn).
      prefix_messages: from `verifier_prefix_messages`.
      item_texts: M criteria.

    Returns:
      (prefix: str, suffixes: list[str]) with `prefix + suffixes[m]` equal to the
      full rendering for item m.

    Raises:
      ValueError: the renderer changes text before the suffix depending on the
        item (the template is not prefix-stable) or drops the sentinel.
    """
    def with_suffix(s):
        msgs = [dict(m) for m in prefix_messages]
        msgs[-1]["content"] = msgs[-1]["content"] + s
        return msgs

    probe = render(with_suffix(_SPLIT_SENTINEL))
    cut = probe.find(_SPLIT_SENTINEL)
    if cut < 0:
        raise ValueError("renderer dropped the split sentinel; cannot find the shared prefix")
    prefix = probe[:cut]
    suffixes = []
    for item in item_texts:
        full = render(with_suffix(verifier_item_suffix(item)))
        if not full.startswith(prefix):
            raise ValueError("rendered verifier prompt does not start with the shared prefix")
        suffixes.append(full[len(prefix):])
    return prefix, suffixes


def plain_render(messages: Sequence[dict]) -> str:
    """Template-free renderer for base models and tests.

    "System: ...\\n\\nUser: ...\\n\\nAssistant:" -- the answer follows "Assistant:"
    (so the yes/no token carries a leading space, " Yes" / " No").

    Args:
      messages: [{"role", "content"}, ...].

    Returns:
      str.
    """
    parts = [f"{_ROLE_LABEL.get(m['role'], m['role'])}: {m['content']}" for m in messages]
    return "\n\n".join(parts) + "\n\nAssistant:"


def direct_judge_messages(prompt: str, response: str,
                          history: Optional[Sequence[dict]] = None,
                          response_set: Optional[Sequence[str]] = None) -> list:
    """Pointwise yes/no judge messages ("is this a high-quality response?"; METHOD 6).

    Layout: [system: DIRECT_JUDGE_SYSTEM] [user: earlier conversation (if any),
    request, optionally all candidate responses labelled "Response 1..K" as
    context (the "w/ responses" variant), then "[Response to judge]" and the
    question ending in "Answer Yes or No."]. The answer is the first assistant
    token, as for the verifier.

    Args:
      prompt: str, user request.
      response: str, the response judged.
      history: earlier turns or None.
      response_set: the whole response set (may include `response`) or None.

    Returns:
      list[dict]: [system, user].
    """
    parts = [_request_block(prompt, history)]
    if response_set:
        parts.append(f"For context, all candidate responses to this request "
                     f"({len(response_set)}):")
        parts.extend(_labelled(f"Response {i + 1}", r) for i, r in enumerate(response_set))
    parts.append(_labelled("Response to judge", response))
    parts.append("Is the response to judge a high-quality response to the user's request? "
                 "Answer Yes or No.")
    return [{"role": "system", "content": DIRECT_JUDGE_SYSTEM},
            {"role": "user", "content": "\n\n".join(parts)}]


def pairwise_judge_messages(prompt: str, a: str, b: str,
                            history: Optional[Sequence[dict]] = None) -> list:
    """Pairwise yes/no judge messages ("is Response A better than Response B?"; METHOD 6).

    Layout: [system: PAIRWISE_JUDGE_SYSTEM] [user: earlier conversation (if any),
    request, "[Response A]", "[Response B]", question ending in "Answer Yes or
    No."]. The answer is the first assistant token. Callers should also ask
    with A and B swapped to cancel position bias.

    Args:
      prompt: str, user request.
      a, b: str, the two responses.
      history: earlier turns or None.

    Returns:
      list[dict]: [system, user].
    """
    parts = [_request_block(prompt, history), _labelled("Response A", a),
             _labelled("Response B", b),
             "Is Response A better than Response B as a reply to the user's request? "
             "Answer Yes or No."]
    return [{"role": "system", "content": PAIRWISE_JUDGE_SYSTEM},
            {"role": "user", "content": "\n\n".join(parts)}]


# ----------------------------------------------------------------------------
# Input budget
# ----------------------------------------------------------------------------

def fit_responses(token_lengths: Sequence[int], budget: int) -> list:
    """Per-response token caps that fit K responses into `budget` tokens (water-filling).

    If the lengths already fit (sum <= budget) every cap equals its length.
    Otherwise the caps are min(len_i, c) for the largest integer level c with
    sum_i min(len_i, c) <= budget: a response shorter than the equal share keeps
    all its tokens and its unused share goes to the longer ones. The remainder
    r = budget - sum_i min(len_i, c) (< number of responses longer than c) is
    handed out as one extra token to each of the first r responses (by index)
    longer than c. Caps never exceed lengths and sum to min(budget, sum len).

    How the caller cuts: for response i with caps[i] < len_i, keep its first
    caps[i] tokens and append the tokens of `TRUNCATION_MARKER`
    (`truncate_to_caps` does this). The marker is NOT counted in `budget`:
    pass `budget = available - K * len(marker_tokens)` to stay within the
    input length.

    Args:
      token_lengths: K ints >= 0, token counts of the responses.
      budget: int >= 0, total tokens available for the response bodies.

    Returns:
      list[int]: K caps.

    Raises:
      ValueError: a negative length or budget, or a non-integer value.
    """
    lengths = [int(x) for x in token_lengths]
    if any(x != y for x, y in zip(lengths, token_lengths)):
        raise ValueError(f"token_lengths must be integers, got {list(token_lengths)}")
    budget = int(budget)
    if budget < 0 or any(x < 0 for x in lengths):
        raise ValueError(f"lengths and budget must be >= 0, got {lengths}, {budget}")
    if sum(lengths) <= budget:
        return lengths
    remaining = budget
    level = 0
    ordered = sorted(lengths)
    n = len(ordered)
    for k, length in enumerate(ordered):
        share = remaining // (n - k)
        if length <= share:
            remaining -= length
        else:
            level = share
            break
    caps = [min(x, level) for x in lengths]
    extra = budget - sum(caps)
    for i, x in enumerate(lengths):
        if extra == 0:
            break
        if x > level:
            caps[i] += 1
            extra -= 1
    return caps


def truncate_to_caps(token_ids: Sequence[Sequence[int]], caps: Sequence[int],
                     marker_ids: Sequence[int]) -> list:
    """Cuts each token list to its cap and appends the marker where something was cut.

    Args:
      token_ids: K lists of token ids.
      caps: K caps from `fit_responses`.
      marker_ids: token ids of `TRUNCATION_MARKER` in the model's tokenizer.

    Returns:
      list[list[int]]: ids[:cap] + marker_ids when cap < len(ids), else ids.

    Raises:
      ValueError: len(caps) != len(token_ids).
    """
    if len(caps) != len(token_ids):
        raise ValueError(f"{len(caps)} caps for {len(token_ids)} responses")
    out = []
    for ids, cap in zip(token_ids, caps):
        ids = list(ids)
        out.append(ids[:cap] + list(marker_ids) if cap < len(ids) else ids)
    return out
