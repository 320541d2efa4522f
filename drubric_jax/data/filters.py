"""Appendix B data filters (METHOD section 9) as small text heuristics.

Each `is_*` function flags one kind of bad response (broken, repetitive, plain refusal,
greeting-only, clarification-only, mostly boilerplate); `anchor_drop_reason`
(`AnchorFilterConfig`) applies the generator-training filter to one anchor set and
`policy_prompt_drop_reason` (`PolicyFilterConfig`) the policy-training filter to one
ranked prompt. They are heuristics: the docstrings name
known misses and false alarms.

Axis legend (docs/CONVENTIONS.md): A responses of an anchor list (best first).
"""
from __future__ import annotations

import re
import unicodedata
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Optional, Sequence


def _norm_apostrophes(text: str) -> str:
    # Curly apostrophes as ', so "I can’t" matches the same patterns as "I can't".
    return text.replace("\u2019", "'").replace("\u2018", "'")


def is_broken_text(text: str) -> bool:
    """Heuristic: the text is empty or garbled (METHOD 9 "broken text").

    True when the stripped text is empty; or it holds U+FFFD replacement
    characters (3 or more, or over 1% of characters); or over 1% of its
    characters are control characters other than tab / newline / CR; or it is
    at least 20 characters long and under 25% of its characters are letters or
    digits (any script). A heuristic: it misses fluent nonsense and can flag
    symbol-heavy content.
    """
    t = text.strip()
    if not t:
        return True
    n = len(t)
    # U+FFFD is what a decoder writes for bytes it could not decode.
    bad = t.count("\ufffd")
    if bad >= 3 or bad > 0.01 * n:
        return True
    ctrl = sum(1 for ch in t if unicodedata.category(ch) == "Cc" and ch not in "\t\n\r")
    if ctrl > 0.01 * n:
        return True
    return n >= 20 and sum(ch.isalnum() for ch in t) < 0.25 * n


# List markers ("1." "2)" "-" "*" "•"), stripped so numbered copies of one line compare equal.
_LIST_PREFIX = re.compile(r"^\s*(?:\d+[.)]|[-*\u2022])\s*")


def is_repetitive(text: str) -> bool:
    """Heuristic: the text loops (METHOD 9 "repetitive generations").

    True when any of: (a) 4+ lines with at least two letters or digits (so
    "\\[" or "```" lines do not count), after removing list numbering /
    bullets, with one line occurring 3+ times and under half of them
    distinct; (b) 40+ words with under 40% of the word 4-grams distinct;
    (c) 300+ UTF-8 bytes that zlib compresses to under 15% of their size.
    A heuristic: deliberately repetitive content (a requested list of identical
    lines) is flagged too.
    """
    lines = [_LIST_PREFIX.sub("", ln).strip().lower() for ln in text.splitlines()]
    lines = [ln for ln in lines if sum(ch.isalnum() for ch in ln) >= 2]
    if len(lines) >= 4:
        counts = Counter(lines)
        if counts.most_common(1)[0][1] >= 3 and len(counts) < 0.5 * len(lines):
            return True
    words = text.lower().split()
    if len(words) >= 40:
        grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
        if len(set(grams)) < 0.4 * len(grams):
            return True
    data = text.encode("utf-8")
    # Text that loops compresses to a few percent of its size; ordinary prose stays far above.
    return len(data) >= 300 and len(zlib.compress(data, 9)) < 0.15 * len(data)


# An inability phrase followed by an assistance verb, or a leading "as an ai". The patterns
# of this module run on lower-cased text with straight apostrophes (`_norm_apostrophes`).
_REFUSAL = re.compile(
    r"\b(?:i can'?t|i cannot|i can not|i'?m (?:not able|unable) to|i am (?:not able|unable) to"
    r"|i won'?t|i will not|not something i can)\s+(?:help|assist|provide|answer|comply|support"
    r"|do|fulfil|fulfill|engage|create|write|generate|give|share|discuss)\b|^as an ai\b")


def is_plain_refusal(text: str) -> bool:
    """Heuristic: a short refusal with no substance (METHOD 9 "plain refusal").

    True when the stripped text is at most 400 characters and its first 150
    characters hold an inability phrase followed by an assistance verb ("I
    can't help", "I cannot provide", "I'm unable to answer", "I won't write",
    "not something I can support", ...), or the text opens with "As an AI". A
    heuristic: "I can't make it on Friday" (a declining email the user asked
    for) is not flagged, a long refusal is not flagged, and a short answer that
    says "I can't give medical advice, but ..." is.
    """
    t = _norm_apostrophes(text.strip().lower())
    # Only the opening counts: a refusal leads the reply, a later "I can't" is usually a caveat.
    return 0 < len(t) <= 400 and _REFUSAL.search(t[:150]) is not None


_GREETING = re.compile(r"^(?:hi|hello|hey|greetings|good (?:morning|afternoon|evening)|howdy)\b"
                       r"(?:\s+there)?[\s,!.]*")
_SMALL_TALK = re.compile(
    r"^(?:how (?:can|may) i (?:help|assist)(?: you)?(?: today)?|what can i do for you(?: today)?"
    r"|how are you(?: doing)?(?: today)?|nice to (?:meet|see) you|i'?m here to help"
    r"|how'?s it going|what'?s up)\W*$")


def is_greeting_only(text: str) -> bool:
    """Heuristic: only a greeting / offer to help (METHOD 9 "greeting-only").

    True when the stripped text is at most 120 characters, starts with a
    greeting word (hi, hello, hey, greetings, good morning/afternoon/evening),
    and every sentence after the greeting is small talk such as "How can I help
    you today?". A heuristic for English chat replies only.
    """
    t = _norm_apostrophes(text.strip().lower())
    if not t or len(t) > 120:
        return False
    m = _GREETING.match(t)
    if not m:
        return False
    rest = t[m.end():]
    # Split after sentence punctuation; an empty rest (a bare "Hi!") counts as greeting-only.
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", rest) if s.strip()]
    return all(_SMALL_TALK.match(s) for s in sentences)


_CLARIFY = re.compile(
    r"(?:could|can|would) you (?:please )?(?:clarify|provide|specify|give|share|tell me more"
    r"|elaborate|explain what)|what do you mean|do you mean|please clarify"
    r"|more (?:details|context|information)|i'?m not sure (?:what|which|whether) you")


def is_clarification_only(text: str) -> bool:
    """Heuristic: only asks the user a clarifying question (METHOD 9).

    True when the stripped text is at most 300 characters, ends with "?", and
    contains a clarification phrase ("could you clarify", "can you provide",
    "what do you mean", "more details", ...). A heuristic: a legitimate short
    clarifying answer to an ambiguous prompt is flagged too (as Appendix B
    intends for training data).
    """
    t = _norm_apostrophes(text.strip().lower())
    return (0 < len(t) <= 300 and t.endswith("?")
            and _CLARIFY.search(t) is not None)


_BOILERPLATE = re.compile(
    r"as an ai\b|i am an ai|i'?m (?:just )?an ai|as a language model|i don'?t have personal"
    r"|i do not have personal|i don'?t have (?:access|the ability)|i do not have (?:access|the ability)"
    r"|it(?:'s| is) important to (?:note|remember)|consult (?:a|an|with a|with an) "
    r"(?:professional|doctor|expert|lawyer)|i hope this helps|let me know if you have any"
    r"|feel free to ask|if you have any (?:other|more|further) questions")


def is_boilerplate(text: str) -> bool:
    """Heuristic: mostly boilerplate (METHOD 9 "mostly-boilerplate responses").

    Splits the text into sentences and returns True when at least half of them
    (and at least one) contain a stock phrase ("As an AI", "I don't have
    personal ...", "it's important to note", "consult a professional", "I hope
    this helps", "feel free to ask", ...). A heuristic for English only.
    """
    t = _norm_apostrophes(text.strip().lower())
    # Sentences and lines (list items often lack end punctuation).
    sentences = [s for s in re.split(r"(?<=[.!?])\s+|\n+", t) if s.strip()]
    if not sentences:
        return False
    hits = sum(1 for s in sentences if _BOILERPLATE.search(s))
    return hits >= 1 and hits >= 0.5 * len(sentences)


def is_degenerate(text: str) -> bool:
    """Heuristic: broken, plain refusal, greeting-only or clarification-only (METHOD 9)."""
    return (is_broken_text(text) or is_plain_refusal(text) or is_greeting_only(text)
            or is_clarification_only(text))


def is_useful(text: str) -> bool:
    """Heuristic: neither degenerate nor repetitive (METHOD 9 "useful responses")."""
    return not is_degenerate(text) and not is_repetitive(text)


@dataclass(frozen=True)
class AnchorFilterConfig:
    """Generator-training filters of Appendix B (METHOD 9). None disables a rule.

    Attributes:
      min_prompt_chars: the stripped prompt must be LONGER than this ("> 50 characters").
      min_top_response_chars: the stripped best response must be longer than this.
      max_repetitive: drop the set when more than this many responses are
        repetitive (0: any repetitive generation drops the set).
      max_degenerate: drop when more than this many responses are degenerate
        (3: ">= 4 degenerate" drops).
      min_useful: drop when fewer than this many responses are useful (4).
      max_boilerplate: drop when more than this many responses are mostly
        boilerplate (3: ">= 4" drops).
    """

    min_prompt_chars: Optional[int] = 50
    min_top_response_chars: Optional[int] = 50
    max_repetitive: Optional[int] = 0
    max_degenerate: Optional[int] = 3
    min_useful: Optional[int] = 4
    max_boilerplate: Optional[int] = 3

    def drop_reason(self, prompt: str, responses_best_first: Sequence[str]) -> Optional[str]:
        """`anchor_drop_reason` with these thresholds."""
        return anchor_drop_reason(prompt, responses_best_first, self)


APPENDIX_B_FILTERS = AnchorFilterConfig()
"""Appendix B generator-training filter settings (use with min_responses=7 on Nectar)."""


def anchor_drop_reason(prompt: str, responses_best_first: Sequence[str],
                       cfg: AnchorFilterConfig = APPENDIX_B_FILTERS) -> Optional[str]:
    """Why an anchor set fails the Appendix B filters, or None to keep it (METHOD 9).

    Checks in order: "short_prompt", "short_top_response", "repetitive",
    "degenerate", "few_useful", "boilerplate". All content checks are the
    heuristics above.

    Args:
      prompt: str, the user request.
      responses_best_first: the ranked responses, best first.
      cfg: thresholds.

    Returns:
      str reason or None.
    """
    rs = list(responses_best_first)
    # <=: Appendix B keeps texts strictly longer than the threshold ("> 50 characters").
    if cfg.min_prompt_chars is not None and len(prompt.strip()) <= cfg.min_prompt_chars:
        return "short_prompt"
    if cfg.min_top_response_chars is not None and (
            not rs or len(rs[0].strip()) <= cfg.min_top_response_chars):
        return "short_top_response"
    if cfg.max_repetitive is not None and sum(map(is_repetitive, rs)) > cfg.max_repetitive:
        return "repetitive"
    if cfg.max_degenerate is not None and sum(map(is_degenerate, rs)) > cfg.max_degenerate:
        return "degenerate"
    if cfg.min_useful is not None and sum(map(is_useful, rs)) < cfg.min_useful:
        return "few_useful"
    if cfg.max_boilerplate is not None and sum(map(is_boilerplate, rs)) > cfg.max_boilerplate:
        return "boilerplate"
    return None


def policy_prompt_drop_reason(prompt: str, responses_best_first: Sequence[str],
                              min_responses: int = 7, min_prompt_chars: int = 50,
                              min_top_response_chars: int = 50) -> Optional[str]:
    """Why a prompt fails the Appendix B policy-training filter, or None (METHOD 9).

    Keep when there are >= min_responses responses, the stripped prompt is longer
    than min_prompt_chars and the stripped top response longer than
    min_top_response_chars, and the top response is not broken, repetitive, a
    plain refusal, greeting-only or clarification-only (heuristics above).

    Returns:
      str reason ("few_responses", "short_prompt", "short_top_response",
      "bad_top_response") or None.
    """
    rs = list(responses_best_first)
    if len(rs) < min_responses:
        return "few_responses"
    if len(prompt.strip()) <= min_prompt_chars:
        return "short_prompt"
    if len(rs[0].strip()) <= min_top_response_chars:
        return "short_top_response"
    # Only the top response is judged (Appendix B): policy training uses just the prompt.
    if is_degenerate(rs[0]) or is_repetitive(rs[0]):
        return "bad_top_response"
    return None


@dataclass(frozen=True)
class PolicyFilterConfig:
    """Policy-training filter of Appendix B (METHOD 9): thresholds of
    `policy_prompt_drop_reason` (paper: 7 responses, 50 characters)."""

    min_responses: int = 7
    min_prompt_chars: int = 50
    min_top_response_chars: int = 50

    def drop_reason(self, prompt: str, responses_best_first: Sequence[str]) -> Optional[str]:
        """`policy_prompt_drop_reason` with these thresholds."""
        return policy_prompt_drop_reason(prompt, responses_best_first, self.min_responses,
                                         self.min_prompt_chars, self.min_top_response_chars)
