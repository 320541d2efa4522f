"""Readers that turn data files into anchor lists and prompt sets (METHOD 3, 5, 9).

- `anchor_lists_from_jsonl`: ranked rows of shared-schema JSONL files.
- `anchor_lists_from_hf`: Nectar on the Hugging Face hub (network), through
  `nectar_row_to_anchor` and `split_hh_transcript`.
- `prompts_from_jsonl`: policy prompt sets (prompt-only or ranked rows).
- `anchor_lists_from_records`, `prompts_from_records`: the same rules on `Record`s read
  elsewhere (a TFDS split: `tfds_source`).
- `demo_anchor_path` / `demo_prompt_path`: a tiny hand-written DEMO set
  (not real data) for smoke runs without ../shared.

Axis legend (docs/CONVENTIONS.md): A responses of an anchor list (best first).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from drubric_jax.data.filters import APPENDIX_B_FILTERS, AnchorFilterConfig, PolicyFilterConfig
from drubric_jax.data.schema import (AnchorList, PathLike, PromptItem, Record, _is_number,
                                     anchor_from_record, load_jsonl_files)


def _count(stats: Optional[dict], outcome: str) -> None:
    if stats is not None:
        stats[outcome] = stats.get(outcome, 0) + 1


def _keep_anchor(a: AnchorList, min_responses: int, filters, stats) -> bool:
    """`filters`: AnchorFilterConfig, PolicyFilterConfig (anything with `drop_reason`) or None."""
    reason = None
    if len(a.responses) < min_responses:
        reason = "few_responses"
    elif filters is not None:
        reason = filters.drop_reason(a.prompt, a.responses)
    _count(stats, reason or "kept")
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
      min_responses: int, smallest A kept.
      filters: AnchorFilterConfig or None (no content filters).
      stats: optional dict, incremented per outcome ("kept", "few_responses",
        or a filter reason).

    Returns:
      list[AnchorList] in file order.

    Raises:
      ValueError / FileNotFoundError: as `load_jsonl`.
    """
    return anchor_lists_from_records(load_jsonl_files(paths), min_responses, filters=filters,
                                     stats=stats)


def anchor_lists_from_records(records: Iterable[Record], min_responses: int = 2, *,
                              filters: Optional[AnchorFilterConfig] = None,
                              stats: Optional[dict] = None) -> list:
    """Anchor lists from validated `Record`s, whatever they were read from (JSONL files,
    a TFDS split: `tfds_source`); the rules of `anchor_lists_from_jsonl`.

    Args:
      records: iterable of Record, in reading order.
      min_responses, filters, stats: as `anchor_lists_from_jsonl`.

    Returns:
      list[AnchorList] in record order.
    """
    out = []
    for rec in records:
        # Prompt-only rows have no ranking to anchor on.
        if not rec.responses:
            continue
        a = anchor_from_record(rec)
        if _keep_anchor(a, min_responses, filters, stats):
            out.append(a)
    return out


# A marker at the start or after a blank line; the captured role interleaves with the parts.
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
    # parts[0] is the text before the first marker (ignored).
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
    # The transcript ends in an empty "Assistant:" turn, the slot the answers fill.
    if turns and turns[-1]["role"] == "assistant" and not turns[-1]["content"]:
        turns = turns[:-1]
    if not turns or turns[-1]["role"] != "user" or not turns[-1]["content"]:
        return None
    answers = [a for a in (row.get("answers") or [])
               if isinstance(a, dict) and isinstance(a.get("answer"), str)
               and _is_number(a.get("rank"))]
    if not answers:
        return None
    # Stable: equal ranks keep Nectar's order.
    answers = sorted(answers, key=lambda a: a["rank"])
    ranks = [a["rank"] for a in answers]
    src = row.get("source")
    src = ",".join(src) if isinstance(src, list) else str(src or "")
    return AnchorList(id=row_id, source=src, prompt=turns[-1]["content"], history=turns[:-1],
                      responses=[a["answer"] for a in answers],
                      gold_ranks=[1 + sum(1 for q in ranks if q < r) for r in ranks])


def anchor_lists_from_hf(dataset_id: str = "berkeley-nest/Nectar", split: str = "train", *,
                         min_responses: int = 7,
                         filters: Union[AnchorFilterConfig, PolicyFilterConfig,
                                        None] = APPENDIX_B_FILTERS,
                         exclude_sources: Sequence[str] = ("lmsys-chat-1m",),
                         only_sources: Optional[Sequence[str]] = None,
                         limit: Optional[int] = None, streaming: bool = False,
                         stats: Optional[dict] = None) -> list:
    """Anchor lists from Nectar on the Hugging Face hub (METHOD 9). NEEDS NETWORK.

    Uses `datasets.load_dataset(dataset_id, split=split, streaming=streaming)`
    and `nectar_row_to_anchor`; the tests pass a fake `datasets` module (no network).
    Appendix B: the LMSYS-Chat-1M subset is held out for evaluation, so it is
    excluded by default; pass `exclude_sources=(), only_sources=("lmsys-chat-1m",)`
    to build the held-out listwise evaluation set instead (with filters=None).

    Args:
      dataset_id, split: hub dataset and split.
      min_responses: smallest A kept (7 in Appendix B).
      filters: AnchorFilterConfig, PolicyFilterConfig (for policy prompts) or None.
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
        # A lone string is one source name.
        srcs = [srcs] if isinstance(srcs, str) else list(srcs)
        if any(s in exclude_sources for s in srcs) or (
                only_sources is not None and not any(s in only_sources for s in srcs)):
            _count(stats, "excluded_source")
            continue
        a = nectar_row_to_anchor(row, f"{dataset_id}/{split}/{i}")
        if a is None:
            _count(stats, "bad_row")
            continue
        if _keep_anchor(a, min_responses, filters, stats):
            out.append(a)
            # `limit` counts kept lists: filtered rows do not use it up.
            if limit is not None and len(out) >= limit:
                break
    return out


def prompts_from_jsonl(paths: Union[PathLike, Iterable[PathLike]], dedupe: bool = True, *,
                       filters: Optional[PolicyFilterConfig] = None,
                       stats: Optional[dict] = None) -> list:
    """Prompt set from shared-schema files (prompt-only or ranked rows).

    Args:
      paths: one path or several.
      dedupe: keep only the first kept row of each identical (history, prompt)
        conversation (pairwise files repeat questions).
      filters: the Appendix B policy-training filter (METHOD 9), applied to ranked
        rows (responses best first); prompt-only rows have no responses to judge and
        are kept. None: no filter.
      stats: optional dict, incremented per outcome ("kept", "duplicate", or a
        filter reason).

    Returns:
      list[PromptItem] in file order.

    Raises:
      ValueError / FileNotFoundError: as `load_jsonl`.
    """
    return prompts_from_records(load_jsonl_files(paths), dedupe, filters=filters, stats=stats)


def prompts_from_records(records: Iterable[Record], dedupe: bool = True, *,
                         filters: Optional[PolicyFilterConfig] = None,
                         stats: Optional[dict] = None) -> list:
    """Prompt set from validated `Record`s, whatever they were read from (JSONL files, a
    TFDS split: `tfds_source`); the rules of `prompts_from_jsonl`.

    Args:
      records: iterable of Record, in reading order.
      dedupe, filters, stats: as `prompts_from_jsonl`.

    Returns:
      list[PromptItem] in record order.
    """
    out, seen = [], set()
    for rec in records:
        # The whole conversation is the key: the same request after other turns is another prompt.
        key = json.dumps([rec.history, rec.prompt], ensure_ascii=False)
        outcome = "kept"
        if dedupe and key in seen:
            outcome = "duplicate"
        elif filters is not None and rec.responses:
            best_first = [rec.responses[i] for i in rec.ranking]
            outcome = filters.drop_reason(rec.prompt, best_first) or "kept"
        _count(stats, outcome)
        if outcome != "kept":
            continue
        # Only kept rows count as seen: a filtered copy does not hide a later one that passes.
        seen.add(key)
        out.append(PromptItem(id=rec.id, source=rec.source, prompt=rec.prompt,
                              history=list(rec.history), reference=rec.reference,
                              meta=dict(rec.meta)))
    return out


# demo_data/ stays beside the package modules (setup.py package_data).
_DEMO_DIR = Path(__file__).resolve().parent.parent / "demo_data"


def demo_anchor_path() -> Path:
    """Path of the hand-written DEMO anchor set (not real data; ~24 ranked lists of 4-5)."""
    return _DEMO_DIR / "anchors.jsonl"


def demo_prompt_path() -> Path:
    """Path of the hand-written DEMO prompt set (not real data; ~32 short prompts)."""
    return _DEMO_DIR / "prompts.jsonl"