"""The checks world's five prompt splits (METHOD 15, "Splits"; issue 53) and the check that
every stage reads its own.

World v2 (`experiments.make_checks_data --version=2`) cuts its base prompts into five
disjoint splits, one file each in the world's directory, every row tagged
`meta["split"]`:

    gen_sft    gen_sft.jsonl   the generator's supervised stage G_sft (its pairs)
    gen_rl     gen_rl.jsonl    the generator's RL (the anchor lists it trains on; Q2, Q3)
    policy     policy.jsonl    the policy's RL (the prompts its GRPO draws)
    dev        dev.jsonl       development: settings are chosen here (the gold curve logged
                               while the policy trains, G_sft's per-epoch F1)
    heldout    heldout.jsonl   the reported held-out split: read once per checkpoint, never
                               to choose anything

and the anchor lists of a split (`experiments.make_checks_anchors` on its file) are
`<split>_anchors.jsonl`; an anchor row keeps its prompt's meta, so its split too.

A stage that reads a split calls `require_split(rows, want, where)`: a row of another split,
or one without a split, stops it with an error naming the file, the row, the split found
and the split wanted. Which stage wants which split is `STAGE_SPLITS`.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping

SPLITS = ("gen_sft", "gen_rl", "policy", "dev", "heldout")
"""The five splits, in file-listing order."""

CUT_ORDER = ("heldout", "dev", "policy", "gen_rl", "gen_sft")
"""The order the builder cuts the splits from the seed's shuffled base prompts: the
reported held-out split first, so it depends only on the seed and its own size (a training
split grown later never changes it)."""

ANCHORED = ("gen_sft", "gen_rl", "dev", "heldout")
"""The splits that have anchor lists (`anchor_file`): G_sft's pairs, the generator's RL,
G_sft's development F1 and Q2's reported held-out lists."""

PURPOSE = {
    "gen_sft": "the generator's supervised stage (G_sft)",
    "gen_rl": "the generator's RL",
    "policy": "the policy's RL",
    "dev": "the development split (settings are chosen here)",
    "heldout": "the reported held-out split",
}

# Which split each stage reads (the field that names its file in the config, then the
# split). The gold curve's split is a config field (`config.rounds.heldout_gold_split`):
# "dev" while the policy trains, "heldout" where the curve is the reported result (Q3).
STAGE_SPLITS = {
    "policy_prompts": "policy",     # config.data.prompt_paths (the policy's GRPO)
    "generator_anchors": "gen_rl",  # config.data.anchor_paths (the generator's GRPO)
    "heldout_anchors": "heldout",   # config.data.heldout_anchor_paths (Delta_gap, Q2)
    "sft_pairs": "gen_sft",         # config.sft.train_anchors
    "sft_eval": "dev",              # config.sft.eval_anchors (G_sft's per-epoch F1)
    "policy_heldout": "heldout",    # the policy's held-out evaluation (Q1, Q4)
}

# What each stage is, in error messages.
STAGE_NAMES = {
    "policy_prompts": "the policy's RL",
    "generator_anchors": "the generator's RL",
    "heldout_anchors": "the held-out anchor lists (Delta_gap, Q2)",
    "sft_pairs": "G_sft's pairs",
    "sft_eval": "G_sft's per-epoch recovery",
    "policy_heldout": "the policy's held-out evaluation",
}

SPLIT_FIELD = "meta.split"


class SplitError(ValueError):
    """A row of another split (or of none) given to a stage; the message names the file,
    the row, the split found and the split wanted."""


def prompt_file(split: str) -> str:
    """The prompt file of a split in the world's directory, e.g. "policy.jsonl".

    Raises:
        ValueError: not one of SPLITS.
    """
    _known(split)
    return f"{split}.jsonl"


def anchor_file(split: str) -> str:
    """The anchor-list file of a split, e.g. "gen_rl_anchors.jsonl".

    Raises:
        ValueError: not one of ANCHORED.
    """
    if split not in ANCHORED:
        raise ValueError(f"split {split!r} has no anchor lists (those of {ANCHORED})")
    return f"{split}_anchors.jsonl"


def _known(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS}")


def split_of(meta: Mapping | None):
    """The row's `meta["split"]`, or None when the row has none."""
    return (meta or {}).get("split")


def require_split(rows: Iterable, want: str, where: str, stage: str = "") -> None:
    """Stops a stage given rows of another split.

    Args:
        rows: records with `.meta` (dict), `.id` and optionally `.line` (the file's line,
            `data.load_jsonl`); a row without `.line` is named by its 1-based position
            among `rows` ("row 3 read").
        want: the split this stage reads (one of SPLITS).
        where: the file (with the config field that named it, e.g.
            "config.data.prompt_paths[0]: /w/policy.jsonl").
        stage: what reads it, for the message (e.g. `STAGE_NAMES[key]`; "" = "this
            stage").

    Raises:
        SplitError: a row whose `meta["split"]` is not `want` (or absent), naming `where`,
            the row's line and id, the split found and the split wanted.
        ValueError: `want` not one of SPLITS.
    """
    _known(want)
    for i, r in enumerate(rows):
        got = split_of(getattr(r, "meta", None))
        if got == want:
            continue
        line = getattr(r, "line", None)
        at = f"{where}:{line}" if line else f"{where}: row {i + 1} read"
        found = (f"is {got!r}" if got is not None else
                 "is missing (a file written before the splits: rebuild the world with "
                 "experiments.make_checks_data --version=2)")
        raise SplitError(
            f"{at}: row {getattr(r, 'id', '?')!r}: field '{SPLIT_FIELD}' {found}, "
            f"but {stage or 'this stage'} reads the {want!r} split ({prompt_file(want)}"
            + (f" or {anchor_file(want)}" if want in ANCHORED else "") + ")")


def base_key(text: str) -> str:
    """The key two base prompts share when they are the same request: lower case, runs of
    non-word characters as one space, stripped."""
    return re.sub(r"\W+", " ", text.lower()).strip()


def check_disjoint(rows: Mapping[str, list]) -> None:
    """Checks that splits share no prompt text and no base prompt (`base_key` of
    `meta["base_prompt"]`, so a base prompt with other constraints counts as shared), and
    that every row is tagged with its split.

    Args:
        rows: {split: list of row dicts (the builder's: "id", "prompt", "meta")}.

    Raises:
        ValueError: a row tagged with another split, or a prompt text or base prompt in two
            splits (names both rows).
    """
    seen_text, seen_base = {}, {}
    for split, rs in rows.items():
        for r in rs:
            if r["meta"].get("split") != split:
                raise ValueError(f"row {r['id']!r} of split {split!r}: field '{SPLIT_FIELD}' "
                                 f"is {r['meta'].get('split')!r}")
            for seen, key, what in ((seen_text, r["prompt"].strip(), "prompt text"),
                                    (seen_base, base_key(r["meta"]["base_prompt"]),
                                     "base prompt")):
                other = seen.get(key)
                if other is not None and other[0] != split:
                    raise ValueError(f"row {r['id']!r} ({split}) and row {other[1]!r} "
                                     f"({other[0]}) share a {what}: the splits must never meet")
                seen.setdefault(key, (split, r["id"]))
