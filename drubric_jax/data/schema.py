"""The shared JSONL schema (../shared/data/README.md) and the rows built from it.

One row per line: pairwise / listwise rows (`responses` + `ranking`) and prompt-only
rows. `load_jsonl` validates every field and raises
`ValueError("<path>:<line>: field '<name>' ...")` on the first bad one, so a broken
file is found by name, line and field. `gold_ranks` gives METHOD 11's rank positions;
`AnchorList` (one anchor example for Eq. 15) and `PromptItem` (one policy prompt) are
the rows the run reads.

Axis legend (docs/CONVENTIONS.md): A responses of an anchor list (best first).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Union

PathLike = Union[str, Path]

# History turns only: every system text comes from `text.prompts`, never from data.
_ROLES = ("user", "assistant")
# Any other top-level key is kept in `Record.extra`.
_KNOWN_KEYS = {"id", "source", "prompt", "responses", "ranking", "scores", "ties",
               "history", "reference", "meta"}


@dataclass
class Record:
    """One validated row of the shared JSONL schema (../shared/data/README.md).

    Attributes:
      id: str, unique row id.
      source: str, "<dataset>:<split>".
      prompt: str, the (last) user turn.
      responses: list[str], the row's responses (2 pairwise, 3+ listwise); [] for
        prompt-only rows.
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
    # bool is an int subclass: true / false are not JSON integers here.
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
    # Only role and content are kept; other keys of a turn are dropped.
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
        # Scores must agree with the ranking (equal scores allowed: ties).
        if any(scores[a] < scores[b] for a, b in zip(ranking, ranking[1:])):
            raise _err(where, "scores", "must be non-increasing along 'ranking'")
        scores = [float(s) for s in scores]
    ties = obj.get("ties", False)
    if not isinstance(ties, bool):
        raise _err(where, "ties", "must be a boolean")
    # Ties are defined by equal scores, so they need the scores.
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
    # Split on b"\n" only: str.splitlines would also split at U+2028, U+0085 and the like.
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        where = f"{path}:{lineno}"
        try:
            # Decoded line by line, so an encoding error names its line.
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


# Line breaks that str.splitlines would split at, escaped so a row stays on one line.
_LINE_BREAKS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"}


def jsonl_line(row: dict) -> str:
    """One row as a JSONL line of the shared schema, newline included: UTF-8 text as is
    (ensure_ascii off), U+2028, U+2029 and U+0085 written as JSON escapes (as the shared
    files do), keys in the dict's order. Same dict, same bytes."""
    text = json.dumps(row, ensure_ascii=False)
    for ch, esc in _LINE_BREAKS.items():
        text = text.replace(ch, esc)
    return text + "\n"


def write_json(path, obj, indent: int = 1) -> None:
    """Writes `obj` as JSON to `path` (a local path or an etils.epath URL) atomically: the
    text goes to `path`.tmp, which is then renamed over `path`, so a killed process leaves
    the old file or the new one, never half of one. The project's one atomic JSON writer
    (run outputs, summaries, reports).

    Raises:
        TypeError: `obj` is not JSON-serializable (nothing is written to `path`)."""
    from etils import epath

    text = json.dumps(obj, indent=indent)  # before any file is touched
    path = epath.Path(path)
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # overwrites the old file


def load_jsonl_files(paths: Union[PathLike, Iterable[PathLike]]) -> list:
    """`load_jsonl` over several files, concatenated, ids unique across files.

    Args:
      paths: one path or an iterable of paths.

    Returns:
      list[Record].

    Raises:
      ValueError: as `load_jsonl`, or an id repeated across files.
    """
    # One path, not an iterable of its characters.
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
    position in `ranking`. Smaller is better, as `drubric_jax.rl.rewards` expects.

    Args:
      record: a Record with responses.

    Returns:
      list[int], one per response, values in 1..len(responses).

    Raises:
      ValueError: a prompt-only record.
    """
    if not record.responses:
        raise ValueError(f"record {record.id!r} has no responses to rank")
    # With ties the scores decide (equal scores share a rank); the ranking alone would break
    # the tie.
    if record.ties:
        s = record.scores
        return [1 + sum(1 for t in s if t > si) for si in s]
    ranks = [0] * len(record.responses)
    for pos, i in enumerate(record.ranking):
        ranks[i] = pos + 1
    return ranks


@dataclass
class AnchorList:
    """One anchor example (x, C_anchor = y^0_1 > ... > y^0_n) for Eq. 15 (METHOD 2, 3).

    Attributes:
      id: str; source: str.
      prompt: str, user request x.
      history: list of earlier turns (may be empty).
      responses: list[str], A responses, best first.
      gold_ranks: list[int], A rank positions aligned with `responses`
        (non-decreasing; equal = tied; 1 + number strictly better).
      meta: the row's metadata (in the checks world `meta["checks"]`, the prompt's true
        checks: constraint recovery is scored against them; never shown to a model).
    """

    id: str
    source: str
    prompt: str
    history: list
    responses: list
    gold_ranks: list
    meta: dict = field(default_factory=dict)


def anchor_from_record(record: Record) -> AnchorList:
    """AnchorList from a ranked Record: responses reordered best first with their ranks.

    Raises:
      ValueError: a prompt-only record.
    """
    ranks = gold_ranks(record)
    return AnchorList(id=record.id, source=record.source, prompt=record.prompt,
                      history=list(record.history),
                      # Best first, as the positions of Eq. 15 expect.
                      responses=[record.responses[i] for i in record.ranking],
                      gold_ranks=[ranks[i] for i in record.ranking],
                      meta=dict(record.meta))


@dataclass
class PromptItem:
    """One policy prompt (METHOD 5): id, source, prompt, history, optional reference, and
    the row's `meta` (upstream metadata; in the checks world `meta["checks"]`, the prompt's
    true checks, which a rule reward such as `checks_gold` reads; never shown to a model)."""

    id: str
    source: str
    prompt: str
    history: list = field(default_factory=list)
    reference: Optional[str] = None
    meta: dict = field(default_factory=dict)
