"""What a run reads: config.data -> (train anchors, held-out anchors, prompts).

`resolve_data_paths` maps config.data.name (demo / shared / custom) to files;
`load_data` reads them with the readers of `sources`, caps anchor lists at
config.data.max_responses and splits off the held-out anchors of Delta_gap (Eq. 2).

Axis legend (docs/CONVENTIONS.md): A responses of an anchor list (best first).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import numpy as np

from drubric_jax.data.filters import AnchorFilterConfig
from drubric_jax.data.iterators import shuffled_order
from drubric_jax.data.schema import AnchorList, PromptItem
from drubric_jax.data.sources import (anchor_lists_from_hf, anchor_lists_from_jsonl,
                                      demo_anchor_path, demo_prompt_path, prompts_from_jsonl)


def _spread(items: Sequence, keep: int) -> list:
    """`keep` items spread evenly over a best-first list (first and last kept)."""
    if len(items) <= keep:
        return list(items)
    idx = np.unique(np.round(np.linspace(0, len(items) - 1, keep)).astype(int))
    return [items[i] for i in idx]


def _cap_anchor(a: AnchorList, max_responses: int) -> AnchorList:
    """Keeps at most `max_responses` of a best-first anchor list, spread over its ranks."""
    if len(a.responses) <= max_responses:
        return a
    idx = _spread(range(len(a.responses)), max_responses)
    return dataclasses.replace(a, responses=[a.responses[i] for i in idx],
                               gold_ranks=[a.gold_ranks[i] for i in idx])


def resolve_data_paths(config) -> tuple[list, list]:
    """(anchor paths, prompt paths) for config.data.name.

    demo: the packaged demo set. shared: ../shared/data (RM-Bench chat + AlpacaEval
    listwise anchors; AlpacaEval prompts). custom: config.data.*_paths.

    Raises:
        FileNotFoundError: shared data requested but not found.
    """
    d = config.data
    if d.name == "demo":
        return [str(demo_anchor_path())], [str(demo_prompt_path())]
    if d.name == "shared":
        # ../shared next to the repository root (drubric_jax/data/loading.py -> repo).
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        root = d.shared_dir or os.path.join(repo, "..", "shared")
        root = os.path.join(os.path.abspath(root), "data")
        anchors = [os.path.join(root, "rm_bench", "chat.jsonl"),
                   os.path.join(root, "alpaca_eval_listwise", "test.jsonl")]
        prompts = [os.path.join(root, "alpaca_eval", "eval.jsonl")]
        for p in anchors + prompts:
            if not os.path.exists(p):
                raise FileNotFoundError(f"config.data.name=shared needs {p} "
                                        "(set config.data.shared_dir)")
        return anchors, prompts
    return list(d.anchor_paths), list(d.prompt_paths)


def load_data(config) -> tuple[list, list, list]:
    """(train anchors, held-out anchors, prompts), deterministic from config.seed.

    Anchor lists come from JSONL files ("hf:<dataset id>" entries go through
    `anchor_lists_from_hf`, network needed). Each file contributes at most
    data.max_anchor_rows rows (0 = all); lists are capped at data.max_responses responses
    spread over the ranks; the first data.heldout_anchor_rows of a seeded shuffle are held
    out for Delta_gap (Eq. 2).
    """
    d = config.data
    anchor_paths, prompt_paths = resolve_data_paths(config)
    filters = AnchorFilterConfig(min_prompt_chars=d.min_prompt_chars,
                                 min_top_response_chars=d.min_top_response_chars)
    anchors = []
    for path in anchor_paths:
        if path.startswith("hf:"):
            rows = anchor_lists_from_hf(path[3:], min_responses=d.min_responses,
                                        limit=d.max_anchor_rows or None)
        else:
            rows = anchor_lists_from_jsonl([path], min_responses=d.min_responses,
                                           filters=filters)
        anchors += rows[:d.max_anchor_rows] if d.max_anchor_rows else rows
    anchors = [_cap_anchor(a, d.max_responses) for a in anchors]
    order = shuffled_order(len(anchors), config.seed)
    anchors = [anchors[i] for i in order]
    heldout, train = anchors[:d.heldout_anchor_rows], anchors[d.heldout_anchor_rows:]
    prompts = []
    for path in prompt_paths:
        if path.startswith("hf:"):
            rows = [PromptItem(id=a.id, source=a.source, prompt=a.prompt,
                               history=list(a.history))
                    for a in anchor_lists_from_hf(path[3:], limit=d.max_prompt_rows or None)]
        else:
            rows = prompts_from_jsonl([path])
        prompts += rows[:d.max_prompt_rows] if d.max_prompt_rows else rows
    if not train:
        raise ValueError("no anchor lists left for training after the held-out split "
                         f"(config.data.heldout_anchor_rows={d.heldout_anchor_rows})")
    if not prompts:
        raise ValueError(f"no prompts in {prompt_paths}")
    return train, heldout, prompts
