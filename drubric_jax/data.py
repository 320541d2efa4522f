"""Data loading: the shared JSONL schema, anchor lists, prompt sets and batching.

Pure Python + numpy, host side (METHOD = ../shared/docs/METHOD.md).

- `load_jsonl` reads the one-row-per-line schema of ../shared/data/README.md
  (pairwise / listwise rows and prompt-only rows) and validates every field,
  raising `ValueError("<path>:<line>: field '<name>' ...")` on the first bad one.
- `gold_ranks` turns `ranking` (+ `scores`/`ties`) into per-response rank
  positions (METHOD 11: 1 + number of strictly better responses).
- `AnchorList` is one anchor example (x, C_anchor best first) for Eq. 15;
  `anchor_lists_from_jsonl` and `anchor_lists_from_hf` (Nectar, network) build
  them, with the Appendix B filters of METHOD section 9 as small heuristic
  functions.
- `prompts_from_jsonl` builds policy prompt sets (METHOD 5).
- `shuffled_order`, `host_shard` and `EpochIterator` give deterministic,
  per-host, resumable batching.
- `demo_anchor_path` / `demo_prompt_path`: a tiny hand-written DEMO set
  (not real data) for smoke runs without ../shared.
"""
from __future__ import annotations

import json
import math
import re
import unicodedata
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np

PathLike = Union[str, Path]

_ROLES = ("user", "assistant")
_KNOWN_KEYS = {"id", "source", "prompt", "responses", "ranking", "scores", "ties",
               "history", "reference", "meta"}


# ----------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------

@dataclass
class Record:
    """One validated row of the shared JSONL schema (../shared/data/README.md).

    Attributes:
      id: str, unique row id.
      source: str, "<dataset>:<split>".
      prompt: str, the (last) user turn.
      responses: list[str], K responses; [] for prompt-only rows.
      ranking: list[int], indices into `responses`, best first; [] for prompt-only rows.
      scores: list[float] or None, one per response (same order as `responses`).
      ties: bool, True when some responses are tied (equal `scores`).
      history: list[{"role": "user"|"assistant", "content": str}], earlier turns.
      reference: str or None, a strong model's answer (prompt-only sets; not gold).
      meta: dict, upstream metadata (never needed to score a judge).
      extra: dict, unknown top-level keys, kept as they were.
      path: str, file the row came from; line: int, 1-based line number.
    """

    id: str
    source: str
    prompt: str
    responses: list = field(default_factory=list)
    ranking: list = field(default_factory=list)
    scores: Optional[list] = None
    ties: bool = False
    history: list = field(default_factory=list)
    reference: Optional[str] = None
    meta: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    path: str = ""
    line: int = 0

    @property
    def kind(self) -> str:
        """"prompt" (no responses), "pairwise" (2 responses) or "listwise" (3+)."""
        if not self.responses:
            return "prompt"
        return "pairwise" if len(self.responses) == 2 else "listwise"


def _err(where: str, name: str, msg: str) -> ValueError:
    return ValueError(f"{where}: field '{name}' {msg}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _validate_history(history, where: str) -> list:
    if not isinstance(history, list):
        raise _err(where, "history", "must be a list of {'role', 'content'} objects")
    for t, turn in enumerate(history):
        if not isinstance(turn, dict):
            raise _err(where, "history", f"entry {t} must be an object")
        if turn.get("role") not in _ROLES:
            raise _err(where, "history", f"entry {t} 'role' must be 'user' or 'assistant', "
                                         f"got {turn.get('role')!r}")
        if not isinstance(turn.get("content"), str):
            raise _err(where, "history", f"entry {t} 'content' must be a string")
    return [{"role": t["role"], "content": t["content"]} for t in history]


def record_from_dict(obj, where: str = "<record>") -> Record:
    """Validates one decoded row and returns a `Record`.

    Rules: `id`, `source` strings (id non-empty), `prompt` a non-empty string;
    `responses` (optional) a non-empty list of non-empty strings, and then
    `ranking` required and a permutation of range(len(responses)); `ranking`
    without `responses` is an error; `scores` optional, one finite number per
    response and non-increasing along `ranking`; `ties` optional bool, `true`
    requires `scores`; `history` optional list of {role: user|assistant,
    content: str}; `reference` optional string; `meta` optional object.
    Unknown keys go to `Record.extra`.

    Args:
      obj: the decoded JSON value of one line.
      where: location used in error messages, e.g. "path/x.jsonl:17".

    Returns:
      Record.

    Raises:
      ValueError: "<where>: field '<name>' <what is wrong>" for the first bad field.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: row must be a JSON object, got {type(obj).__name__}")
    for name in ("id", "source", "prompt"):
        if name not in obj:
            raise _err(where, name, "is required")
        if not isinstance(obj[name], str):
            raise _err(where, name, f"must be a string, got {type(obj[name]).__name__}")
    if not obj["id"]:
        raise _err(where, "id", "must be non-empty")
    if not obj["prompt"]:
        raise _err(where, "prompt", "must be non-empty")

    responses, ranking = [], []
    if "responses" in obj:
        responses = obj["responses"]
        if not isinstance(responses, list) or not responses:
            raise _err(where, "responses", "must be a non-empty list of strings")
        for i, r in enumerate(responses):
            if not isinstance(r, str) or not r:
                raise _err(where, "responses", f"entry {i} must be a non-empty string")
        if "ranking" not in obj:
            raise _err(where, "ranking", "is required when 'responses' is present")
        ranking = obj["ranking"]
        if (not isinstance(ranking, list) or not all(_is_int(i) for i in ranking)
                or sorted(ranking) != list(range(len(responses)))):
            raise _err(where, "ranking", "must be a permutation of range(len(responses))")
    elif "ranking" in obj:
        raise _err(where, "ranking", "given without 'responses'")

    scores = obj.get("scores")
    if scores is not None:
        if not responses:
            raise _err(where, "scores", "given without 'responses'")
        if (not isinstance(scores, list) or len(scores) != len(responses)
                or not all(_is_number(s) for s in scores)):
            raise _err(where, "scores", "must be a list of finite numbers, one per response")
        if any(scores[a] < scores[b] for a, b in zip(ranking, ranking[1:])):
            raise _err(where, "scores", "must be non-increasing along 'ranking'")
        scores = [float(s) for s in scores]
    ties = obj.get("ties", False)
    if not isinstance(ties, bool):
        raise _err(where, "ties", "must be a boolean")
    if ties and scores is None:
        raise _err(where, "ties", "is true but 'scores' is missing")
    history = _validate_history(obj.get("history", []), where)
    reference = obj.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise _err(where, "reference", "must be a string")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise _err(where, "meta", "must be an object")
    return Record(id=obj["id"], source=obj["source"], prompt=obj["prompt"],
                  responses=list(responses), ranking=list(ranking), scores=scores,
                  ties=ties, history=history, reference=reference, meta=meta,
                  extra={k: v for k, v in obj.items() if k not in _KNOWN_KEYS})


def load_jsonl(path: PathLike) -> list:
    """Loads and validates a JSONL file of the shared schema.

    Lines are split on "\\n" only (the files escape U+2028/U+2029/U+0085);
    blank lines are skipped. Ids must be unique within the file.

    Args:
      path: file path.

    Returns:
      list[Record] in file order.

    Raises:
      FileNotFoundError: no such file.
      ValueError: "<path>:<line>: ..." for undecodable UTF-8, invalid JSON, a bad
        field (see `record_from_dict`) or a duplicate id.
    """
    path = Path(path)
    raw = path.read_bytes()
    records, seen = [], {}
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        where = f"{path}:{lineno}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{where}: not valid UTF-8 ({e.reason})") from None
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        rec = record_from_dict(obj, where)
        rec.path, rec.line = str(path), lineno
        if rec.id in seen:
            raise _err(where, "id", f"{rec.id!r} repeats line {seen[rec.id]}")
        seen[rec.id] = lineno
        records.append(rec)
    return records


def load_jsonl_files(paths: Union[PathLike, Iterable[PathLike]]) -> list:
    """`load_jsonl` over several files, concatenated, ids unique across files.

    Args:
      paths: one path or an iterable of paths.

    Returns:
      list[Record].

    Raises:
      ValueError: as `load_jsonl`, or an id repeated across files.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out, seen = [], {}
    for p in paths:
        for rec in load_jsonl(p):
            if rec.id in seen:
                raise _err(f"{rec.path}:{rec.line}", "id", f"{rec.id!r} repeats {seen[rec.id]}")
            seen[rec.id] = f"{rec.path}:{rec.line}"
            out.append(rec)
    return out


def gold_ranks(record: Record) -> list:
    """Gold rank position of every response, in `responses` order (METHOD 11).

    rank_i = 1 + number of responses strictly better than response i. With
    `ties` true, "strictly better" means a strictly higher `scores` entry, so
    tied responses share a rank (e.g. RM-Bench: three chosen at 1, three
    rejected at 4). Otherwise the `ranking` order is strict: rank = 1 +
    position in `ranking`. Smaller is better, as `drubric_jax.rewards` expects.

    Args:
      record: a Record with responses.

    Returns:
      list[int] of length K, values in 1..K.

    Raises:
      ValueError: a prompt-only record.
    """
    if not record.responses:
        raise ValueError(f"record {record.id!r} has no responses to rank")
    if record.ties:
        s = record.scores
        return [1 + sum(1 for t in s if t > si) for si in s]
    ranks = [0] * len(record.responses)
    for pos, i in enumerate(record.ranking):
        ranks[i] = pos + 1
    return ranks


# ----------------------------------------------------------------------------
# Appendix B filters (heuristics)
# ----------------------------------------------------------------------------

def _norm_apostrophes(text: str) -> str:
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
    bad = t.count("\ufffd")
    if bad >= 3 or bad > 0.01 * n:
        return True
    ctrl = sum(1 for ch in t if unicodedata.category(ch) == "Cc" and ch not in "\t\n\r")
    if ctrl > 0.01 * n:
        return True
    return n >= 20 and sum(ch.isalnum() for ch in t) < 0.25 * n


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
    return len(data) >= 300 and len(zlib.compress(data, 9)) < 0.15 * len(data)


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
                              min_responses: int = 7, min_chars: int = 50) -> Optional[str]:
    """Why a prompt fails the Appendix B policy-training filter, or None (METHOD 9).

    Keep when there are >= min_responses responses, prompt and top response
    are longer than min_chars, and the top response is not broken, repetitive,
    a plain refusal, greeting-only or clarification-only (heuristics above).

    Returns:
      str reason ("few_responses", "short_prompt", "short_top_response",
      "bad_top_response") or None.
    """
    rs = list(responses_best_first)
    if len(rs) < min_responses:
        return "few_responses"
    if len(prompt.strip()) <= min_chars:
        return "short_prompt"
    if len(rs[0].strip()) <= min_chars:
        return "short_top_response"
    if is_degenerate(rs[0]) or is_repetitive(rs[0]):
        return "bad_top_response"
    return None


# ----------------------------------------------------------------------------
# Anchor lists
# ----------------------------------------------------------------------------

@dataclass
class AnchorList:
    """One anchor example (x, C_anchor = y^0_1 > ... > y^0_n) for Eq. 15 (METHOD 2, 3).

    Attributes:
      id: str; source: str.
      prompt: str, user request x.
      history: list of earlier turns (may be empty).
      responses: list[str], N responses, best first.
      gold_ranks: list[int], N rank positions aligned with `responses`
        (non-decreasing; equal = tied; 1 + number strictly better).
    """

    id: str
    source: str
    prompt: str
    history: list
    responses: list
    gold_ranks: list


def anchor_from_record(record: Record) -> AnchorList:
    """AnchorList from a ranked Record: responses reordered best first with their ranks.

    Raises:
      ValueError: a prompt-only record.
    """
    ranks = gold_ranks(record)
    return AnchorList(id=record.id, source=record.source, prompt=record.prompt,
                      history=list(record.history),
                      responses=[record.responses[i] for i in record.ranking],
                      gold_ranks=[ranks[i] for i in record.ranking])


def _keep_anchor(a: AnchorList, min_responses: int, filters, stats) -> bool:
    reason = None
    if len(a.responses) < min_responses:
        reason = "few_responses"
    elif filters is not None:
        reason = anchor_drop_reason(a.prompt, a.responses, filters)
    key = reason or "kept"
    if stats is not None:
        stats[key] = stats.get(key, 0) + 1
    return reason is None


def anchor_lists_from_jsonl(paths: Union[PathLike, Iterable[PathLike]], min_responses: int = 2,
                            *, filters: Optional[AnchorFilterConfig] = None,
                            stats: Optional[dict] = None) -> list:
    """Anchor lists from ranked rows of shared-schema JSONL files (METHOD 3, 9).

    Prompt-only rows are skipped silently; ranked rows with fewer than
    `min_responses` responses are dropped; with `filters` the Appendix B content
    filters also apply (`anchor_drop_reason`).

    Args:
      paths: one path or several.
      min_responses: int, smallest N kept.
      filters: AnchorFilterConfig or None (no content filters).
      stats: optional dict, incremented per outcome ("kept", "few_responses",
        or a filter reason).

    Returns:
      list[AnchorList] in file order.

    Raises:
      ValueError / FileNotFoundError: as `load_jsonl`.
    """
    out = []
    for rec in load_jsonl_files(paths):
        if not rec.responses:
            continue
        a = anchor_from_record(rec)
        if _keep_anchor(a, min_responses, filters, stats):
            out.append(a)
    return out


_TURN_SPLIT = re.compile(r"(?:^|\n\n)(Human|Assistant):")


def split_hh_transcript(text: str) -> list:
    """Splits a "\\n\\nHuman: ...\\n\\nAssistant: ..." transcript into turns.

    Turn contents are stripped of surrounding whitespace; text before the first
    marker is ignored.

    Args:
      text: str transcript (Nectar / HH-RLHF style).

    Returns:
      list[{"role": "user"|"assistant", "content": str}] (may end with an empty
      assistant turn, the slot a response fills).
    """
    parts = _TURN_SPLIT.split(text)
    turns = []
    for role, content in zip(parts[1::2], parts[2::2]):
        turns.append({"role": "user" if role == "Human" else "assistant",
                      "content": content.strip()})
    return turns


def nectar_row_to_anchor(row: dict, row_id: str) -> Optional[AnchorList]:
    """Converts one Nectar row to an AnchorList, or None if its shape is unusable.

    Nectar rows: `prompt` is a "\\n\\nHuman: ...\\n\\nAssistant: " transcript,
    `answers` a list of {"answer": str, "model": str, "rank": number (1 = best)},
    `source` a list of source names. The last Human turn becomes the prompt,
    earlier turns the history; answers are sorted by rank (stable) and
    gold_ranks = 1 + number of answers with a strictly smaller rank.

    Args:
      row: dict with the fields above.
      row_id: id for the AnchorList.

    Returns:
      AnchorList or None (no final user turn, or no usable answers).
    """
    turns = split_hh_transcript(row.get("prompt") or "")
    if turns and turns[-1]["role"] == "assistant" and not turns[-1]["content"]:
        turns = turns[:-1]
    if not turns or turns[-1]["role"] != "user" or not turns[-1]["content"]:
        return None
    answers = [a for a in (row.get("answers") or [])
               if isinstance(a, dict) and isinstance(a.get("answer"), str)
               and _is_number(a.get("rank"))]
    if not answers:
        return None
    answers = sorted(answers, key=lambda a: a["rank"])
    ranks = [a["rank"] for a in answers]
    src = row.get("source")
    src = ",".join(src) if isinstance(src, list) else str(src or "")
    return AnchorList(id=row_id, source=src, prompt=turns[-1]["content"], history=turns[:-1],
                      responses=[a["answer"] for a in answers],
                      gold_ranks=[1 + sum(1 for q in ranks if q < r) for r in ranks])


def anchor_lists_from_hf(dataset_id: str = "berkeley-nest/Nectar", split: str = "train", *,
                         min_responses: int = 7,
                         filters: Optional[AnchorFilterConfig] = APPENDIX_B_FILTERS,
                         exclude_sources: Sequence[str] = ("lmsys-chat-1m",),
                         only_sources: Optional[Sequence[str]] = None,
                         limit: Optional[int] = None, streaming: bool = False,
                         stats: Optional[dict] = None) -> list:
    """Anchor lists from Nectar on the Hugging Face hub (METHOD 9). NEEDS NETWORK.

    Uses `datasets.load_dataset(dataset_id, split=split, streaming=streaming)`
    and `nectar_row_to_anchor`. Never called by the tests (no network there).
    Appendix B: the LMSYS-Chat-1M subset is held out for evaluation, so it is
    excluded by default; pass `exclude_sources=(), only_sources=("lmsys-chat-1m",)`
    to build the held-out listwise evaluation set instead (with filters=None).

    Args:
      dataset_id, split: hub dataset and split.
      min_responses: smallest N kept (7 in Appendix B).
      filters: AnchorFilterConfig or None.
      exclude_sources: drop rows whose `source` list contains any of these.
      only_sources: if given, keep only rows whose `source` list intersects it.
      limit: stop after this many kept lists.
      streaming: stream instead of downloading the whole split.
      stats: optional dict of outcome counts (adds "excluded_source", "bad_row").

    Returns:
      list[AnchorList], ids "<dataset_id>/<split>/<row index>".
    """
    from datasets import load_dataset  # imported lazily: heavy, and only needed here

    ds = load_dataset(dataset_id, split=split, streaming=streaming)
    out = []
    for i, row in enumerate(ds):
        srcs = row.get("source") or []
        srcs = [srcs] if isinstance(srcs, str) else list(srcs)
        if any(s in exclude_sources for s in srcs) or (
                only_sources is not None and not any(s in only_sources for s in srcs)):
            if stats is not None:
                stats["excluded_source"] = stats.get("excluded_source", 0) + 1
            continue
        a = nectar_row_to_anchor(row, f"{dataset_id}/{split}/{i}")
        if a is None:
            if stats is not None:
                stats["bad_row"] = stats.get("bad_row", 0) + 1
            continue
        if _keep_anchor(a, min_responses, filters, stats):
            out.append(a)
            if limit is not None and len(out) >= limit:
                break
    return out


# ----------------------------------------------------------------------------
# Prompt sets
# ----------------------------------------------------------------------------

@dataclass
class PromptItem:
    """One policy prompt (METHOD 5): id, source, prompt, history, optional reference."""

    id: str
    source: str
    prompt: str
    history: list = field(default_factory=list)
    reference: Optional[str] = None


def prompts_from_jsonl(paths: Union[PathLike, Iterable[PathLike]],
                       dedupe: bool = True) -> list:
    """Prompt set from shared-schema files (prompt-only or ranked rows).

    Args:
      paths: one path or several.
      dedupe: keep only the first row of each identical (history, prompt)
        conversation (pairwise files repeat questions).

    Returns:
      list[PromptItem] in file order.

    Raises:
      ValueError / FileNotFoundError: as `load_jsonl`.
    """
    out, seen = [], set()
    for rec in load_jsonl_files(paths):
        key = json.dumps([rec.history, rec.prompt], ensure_ascii=False)
        if dedupe and key in seen:
            continue
        seen.add(key)
        out.append(PromptItem(id=rec.id, source=rec.source, prompt=rec.prompt,
                              history=list(rec.history), reference=rec.reference))
    return out


# ----------------------------------------------------------------------------
# Deterministic shuffling, host sharding, resumable batching
# ----------------------------------------------------------------------------

def shuffled_order(n: int, seed: int, epoch: int = 0) -> np.ndarray:
    """Permutation of range(n) for one epoch.

    `np.random.default_rng(np.random.SeedSequence([seed, epoch])).permutation(n)`:
    a fresh order per (seed, epoch), identical on every host and every run.
    (Seeding from the pair rather than seed + epoch keeps (seed=1, epoch=0) and
    (seed=0, epoch=1) different.)

    Args:
      n: int >= 0; seed, epoch: ints >= 0.

    Returns:
      int64[n].

    Raises:
      ValueError: negative seed or epoch.
    """
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got {seed}, {epoch}")
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch)])).permutation(n)


def host_shard(n: int, seed: int, epoch: int, host_id: int = 0, num_hosts: int = 1) -> np.ndarray:
    """Row indices host `host_id` reads in `epoch`.

    The epoch's shuffled order is cut to a multiple of num_hosts (the last
    n % num_hosts rows of that order sit out this epoch, a different set each
    epoch) and host h takes positions h::num_hosts. All hosts get the same
    count, so their step counts agree; the shards are disjoint and together
    cover the kept rows.

    Returns:
      int64[n // num_hosts].

    Raises:
      ValueError: num_hosts < 1 or host_id outside 0..num_hosts-1.
    """
    if num_hosts < 1 or not 0 <= host_id < num_hosts:
        raise ValueError(f"need 0 <= host_id < num_hosts, got {host_id}, {num_hosts}")
    order = shuffled_order(n, seed, epoch)
    return order[: n - n % num_hosts][host_id::num_hosts]


class EpochIterator:
    """Resumable iterator over fixed-size per-host batches, reshuffled every epoch.

    Epoch e uses `host_shard(len(items), seed, e, host_id, num_hosts)`; batches
    are consecutive slices of `batch_size` rows of that shard; the incomplete
    tail batch is dropped. After the last batch of an epoch the next call moves
    to epoch e + 1 (a new order). `state()` / `restore()` record and recreate
    the exact position for checkpoints.

    Args:
      items: sequence of rows (Records, AnchorLists, PromptItems, ...).
      batch_size: int >= 1, rows per batch on this host.
      seed: int >= 0.
      host_id, num_hosts: this host and the host count.
      num_epochs: stop after this many epochs (None: never stop).

    Raises:
      ValueError: batch_size < 1, or a host's shard holds fewer than
        batch_size rows (no batch could ever be formed).
    """

    def __init__(self, items: Sequence, batch_size: int, seed: int, host_id: int = 0,
                 num_hosts: int = 1, num_epochs: Optional[int] = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_hosts < 1 or not 0 <= host_id < num_hosts:
            raise ValueError(f"need 0 <= host_id < num_hosts, got {host_id}, {num_hosts}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.items = items
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.host_id = int(host_id)
        self.num_hosts = int(num_hosts)
        self.num_epochs = num_epochs
        self.steps_per_epoch = (len(items) // self.num_hosts) // self.batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"{len(items)} rows over {num_hosts} hosts cannot fill one "
                             f"batch of {batch_size}")
        self.epoch = 0
        self.position = 0
        self._shard = None
        self._shard_epoch = -1

    def _indices(self) -> np.ndarray:
        if self._shard_epoch != self.epoch:
            self._shard = host_shard(len(self.items), self.seed, self.epoch,
                                     self.host_id, self.num_hosts)
            self._shard_epoch = self.epoch
        return self._shard

    def __iter__(self):
        return self

    def __next__(self) -> list:
        """Next batch: list of `batch_size` items. Raises StopIteration after num_epochs."""
        if self.position >= self.steps_per_epoch:
            self.epoch += 1
            self.position = 0
        if self.num_epochs is not None and self.epoch >= self.num_epochs:
            raise StopIteration
        idx = self._indices()[self.position * self.batch_size:
                              (self.position + 1) * self.batch_size]
        self.position += 1
        return [self.items[int(i)] for i in idx]

    def state(self) -> dict:
        """dict {"epoch", "position" (batches already read in the epoch), "seed",
        "batch_size", "host_id", "num_hosts", "num_items"} -- JSON-serialisable."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "batch_size": self.batch_size, "host_id": self.host_id,
                "num_hosts": self.num_hosts, "num_items": len(self.items)}

    def restore(self, state: dict) -> None:
        """Continues exactly where `state()` was taken (same following batches).

        Raises:
          ValueError: a recorded layout key (batch_size, host_id, num_hosts,
            num_items) differs from this iterator's, or position/epoch is out of range.
        """
        for key in ("batch_size", "host_id", "num_hosts"):
            if key in state and int(state[key]) != getattr(self, key):
                raise ValueError(f"state has {key}={state[key]}, iterator has "
                                 f"{getattr(self, key)}")
        if "num_items" in state and int(state["num_items"]) != len(self.items):
            raise ValueError(f"state has num_items={state['num_items']}, iterator has "
                             f"{len(self.items)}")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.steps_per_epoch:
            raise ValueError(f"bad state epoch={epoch} position={position} "
                             f"(steps_per_epoch={self.steps_per_epoch})")
        self.seed = int(state["seed"])
        self.epoch, self.position = epoch, position
        self._shard_epoch = -1


# ----------------------------------------------------------------------------
# Demo data
# ----------------------------------------------------------------------------

_DEMO_DIR = Path(__file__).resolve().parent / "demo_data"


def demo_anchor_path() -> Path:
    """Path of the hand-written DEMO anchor set (not real data; ~24 ranked lists of 4-5)."""
    return _DEMO_DIR / "anchors.jsonl"


def demo_prompt_path() -> Path:
    """Path of the hand-written DEMO prompt set (not real data; ~32 short prompts)."""
    return _DEMO_DIR / "prompts.jsonl"
