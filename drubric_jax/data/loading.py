"""What a run reads: a `DataSpec` -> LoadedData (train anchors, held-out anchors, prompts).

A `DataSpec` is what this layer reads of a run config, read once per run
(`rounds.settings.data_spec`): the data layer never takes the ConfigDict. Its fields keep
the config's names (`config.data.<field>`; the batch sizes and seed of the run), and errors
name those config fields. `resolve_data_paths` maps config.data.name (demo / shared /
custom) to files;
`load_data` reads them with the readers of `sources`, caps anchor lists at
config.data.max_responses, splits off the held-out anchors of Delta_gap (Eq. 2) and
fingerprints the rows it used. `data.checking.check_data_sources` is the fast check, before
any model loads, that every configured file exists and parses. Besides JSONL paths, a data entry may
be "hf:<dataset id>" (Nectar on the hub) or "tfds:NAME[:SPLIT]" (a TFDS split under
config.data.tfds_data_dir, `tfds_source`).

Axis legend (docs/CONVENTIONS.md): A responses of an anchor list (best first).
"""
from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple, Sequence

import numpy as np
from absl import logging

from drubric_jax.data.filters import AnchorFilterConfig, PolicyFilterConfig
from drubric_jax.data.fingerprint import data_fingerprint
from drubric_jax.data.iterators import shuffled_order
from drubric_jax.data.schema import AnchorList, PromptItem
from drubric_jax.data.sources import (anchor_lists_from_hf, anchor_lists_from_jsonl,
                                      anchor_lists_from_records, demo_anchor_path,
                                      demo_prompt_path, prompts_from_jsonl, prompts_from_records)
from drubric_jax.data.splits import STAGE_NAMES, STAGE_SPLITS, require_split
from drubric_jax.data.tfds_source import is_tfds_spec, records_from_tfds


def _spread(items: Sequence, keep: int) -> list:
    """`keep` items spread evenly over a best-first list (first and last kept)."""
    if len(items) <= keep:
        return list(items)
    # Evenly spaced positions, the first (best) and the last (worst) included.
    idx = np.unique(np.round(np.linspace(0, len(items) - 1, keep)).astype(int))
    return [items[i] for i in idx]


def _cap_anchor(a: AnchorList, max_responses: int) -> AnchorList:
    """Keeps at most `max_responses` of a best-first anchor list, spread over its ranks."""
    if len(a.responses) <= max_responses:
        return a
    # Spread, not truncated: the kept list still spans best to worst for Eq. 15.
    idx = _spread(range(len(a.responses)), max_responses)
    return dataclasses.replace(a, responses=[a.responses[i] for i in idx],
                               gold_ranks=[a.gold_ranks[i] for i in idx])


def resolve_data_paths(d: DataSpec) -> tuple[list, list]:
    """(anchor paths, prompt paths) for config.data.name.

    demo: the packaged demo set. shared: ../shared/data (RM-Bench chat + AlpacaEval
    listwise anchors; AlpacaEval prompts). custom: config.data.*_paths.

    Raises:
        FileNotFoundError: shared data requested but not found.
    """
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


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """What the data layer reads of a run config (`rounds.settings.data_spec` reads it once).

    Attributes (config.data.<name> unless said):
      name: demo | shared | custom.  anchor_paths, prompt_paths: tuple[str] (custom).
      shared_dir: root of ../shared ("" = beside the repository).
      tfds_data_dir: TFDS data_dir of "tfds:" entries ("" = TFDS's default).
      min_responses, max_responses, min_prompt_chars, min_top_response_chars,
      max_anchor_rows, max_prompt_rows, heldout_anchor_rows: as configs/base.py says.
      heldout_anchor_paths: tuple[str]; when set, the held-out lists come from these files
        (the first heldout_anchor_rows of their seeded shuffle) and every list of
        anchor_paths trains.
      seed: config.seed (the held-out split's shuffle).
      anchors_per_step, prompts_per_step: config.generator.anchors_per_step and
        config.policy.prompts_per_step (one batch per host must fill).
      reads_anchors: the run reads anchor lists (`config_check.uses_anchors`).
      true_checks_reward: config.policy.reward when it reads each prompt's true checks
        (`checks.TRUE_CHECK_REWARDS`), else "".
      checks_build: config.data.checks_build (the commands that write a checks world's
        files, printed when one is missing; "" outside the checks world).
      require_splits: config.data.require_splits: every row of prompt_paths must be the
        "policy" split, of anchor_paths "gen_rl", of heldout_anchor_paths "heldout"
        (`meta["split"]`, `data.splits.STAGE_SPLITS`), and held-out lists come from
        heldout_anchor_paths only (world v2's splits; issue 53).
    """

    name: str
    anchor_paths: tuple = ()
    prompt_paths: tuple = ()
    shared_dir: str = ""
    tfds_data_dir: str = ""
    min_responses: int = 2
    max_responses: int = 8
    min_prompt_chars: int = 0
    min_top_response_chars: int = 0
    max_anchor_rows: int = 0
    max_prompt_rows: int = 0
    heldout_anchor_rows: int = 0
    heldout_anchor_paths: tuple = ()
    seed: int = 0
    anchors_per_step: int = 1
    prompts_per_step: int = 1
    reads_anchors: bool = True
    true_checks_reward: str = ""
    checks_build: str = ""
    require_splits: bool = False


class _FileRows(NamedTuple):
    """What one data file gave: the rows used and the count of every outcome."""

    path: str
    rows: list
    stats: dict  # e.g. {"kept": 5, "few_useful": 2} or {"kept": 3, "duplicate": 1}

    def describe(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(self.stats.items()))
        return f"{self.path} ({counts}; {len(self.rows)} used)"


def _tfds_dir(d: DataSpec) -> str:
    """config.data.tfds_data_dir ("" = TFDS's default)."""
    return d.tfds_data_dir or ""


def _read_anchors(d, paths: Sequence[str]) -> list:
    """list[_FileRows] of anchor lists, capped at d.max_anchor_rows rows per file and
    d.max_responses responses per list."""
    # Only the length rules are configurable; the content rules keep Appendix B's values.
    filters = AnchorFilterConfig(min_prompt_chars=d.min_prompt_chars,
                                 min_top_response_chars=d.min_top_response_chars)
    out = []
    for path in paths:
        stats = {}
        if path.startswith("hf:"):
            rows = anchor_lists_from_hf(path[3:], min_responses=d.min_responses,
                                        limit=d.max_anchor_rows or None, stats=stats)
        elif is_tfds_spec(path):
            rows = anchor_lists_from_records(records_from_tfds(path, _tfds_dir(d)),
                                             min_responses=d.min_responses, filters=filters,
                                             stats=stats)
        else:
            rows = anchor_lists_from_jsonl([path], min_responses=d.min_responses,
                                           filters=filters, stats=stats)
        # 0 = every row (the config's convention for caps).
        rows = rows[:d.max_anchor_rows] if d.max_anchor_rows else rows
        out.append(_FileRows(path, [_cap_anchor(a, d.max_responses) for a in rows], stats))
        logging.info("data: anchors from %s", out[-1].describe())
    return out


def _read_prompts(d, paths: Sequence[str]) -> list:
    """list[_FileRows] of PromptItems, capped at d.max_prompt_rows rows per file.

    Ranked rows (Nectar, custom JSONL) pass the Appendix B policy-training filter when
    the config asks for the paper's filters (d.min_prompt_chars or
    d.min_top_response_chars > 0), with d.min_responses responses.
    """
    policy = None
    if d.min_prompt_chars or d.min_top_response_chars:
        policy = PolicyFilterConfig(d.min_responses, d.min_prompt_chars,
                                    d.min_top_response_chars)
    out = []
    for path in paths:
        stats = {}
        if path.startswith("hf:"):
            # Hub prompt sets are Nectar rows: their ranked answers feed only the policy filter.
            rows = [PromptItem(id=a.id, source=a.source, prompt=a.prompt,
                               history=list(a.history))
                    for a in anchor_lists_from_hf(path[3:], min_responses=d.min_responses,
                                                  filters=policy, stats=stats,
                                                  limit=d.max_prompt_rows or None)]
        elif is_tfds_spec(path):
            rows = prompts_from_records(records_from_tfds(path, _tfds_dir(d)), filters=policy,
                                        stats=stats)
        else:
            rows = prompts_from_jsonl([path], filters=policy, stats=stats)
        # Pairwise files repeat a question once per pair: dropped, but said aloud.
        if stats.get("duplicate"):
            logging.warning("data: %s: %d duplicate prompts dropped (same history and prompt; "
                            "the first is kept)", path, stats["duplicate"])
        out.append(_FileRows(path, rows[:d.max_prompt_rows] if d.max_prompt_rows else rows,
                             stats))
        logging.info("data: prompts from %s", out[-1].describe())
    return out


def _check_fills_batch(kind: str, rows: int, files: list, batch_field: str, batch: int,
                       cap_field: str, cap: int, num_hosts: int, note: str = "") -> None:
    """Raises ValueError naming the files, config fields and counts when `rows` cannot fill
    one batch per host (the EpochIterator would fail later without saying why)."""
    # The test `EpochIterator` makes, done early with the files and fields named.
    if rows // num_hosts < batch:
        read = "; ".join(f.describe() for f in files) or "no files"
        raise ValueError(
            f"{kind}: {rows} rows left{note} over {num_hosts} host(s) cannot fill one batch "
            f"of config.{batch_field}={batch}; read {read}; "
            f"config.{cap_field}={cap} (0 = all)")


@dataclasses.dataclass
class LoadedData:
    """The rows of one run (load_data).

    Attributes:
      train_anchors: list[AnchorList], the generator's anchor examples (Eq. 15).
      heldout_anchors: list[AnchorList], held out for Delta_gap (Eq. 2).
      prompts: list[PromptItem], the policy prompts.
      fingerprint: `data_fingerprint` of the rows used, per file (JSON-serialisable).
    """

    train_anchors: list
    heldout_anchors: list
    prompts: list
    fingerprint: dict


def load_data(d: DataSpec, num_hosts: int = 1) -> LoadedData:
    """Train anchors, held-out anchors and prompts, deterministic from the run's seed.

    Anchor lists come from JSONL files ("hf:<dataset id>" entries go through
    `anchor_lists_from_hf`, network needed; "tfds:NAME[:SPLIT]" entries read a TFDS split
    under data.tfds_data_dir with the JSONL rules, `tfds_source.records_from_tfds`). Each
    file contributes at most data.max_anchor_rows rows (0 = all); lists are capped at
    data.max_responses responses spread over the ranks; the first data.heldout_anchor_rows
    of a seeded shuffle are held out for Delta_gap (Eq. 2). Prompt files are read with
    `prompts_from_jsonl`, which drops repeated (history, prompt) conversations within a file
    (counted and logged); with data.min_prompt_chars or data.min_top_response_chars > 0,
    ranked prompt rows also pass the Appendix B policy-training filter (METHOD 9,
    `PolicyFilterConfig`).

    Args:
      d: the run's DataSpec (`rounds.settings.data_spec(config)`).
      num_hosts: processes that split every batch (jax.process_count()).

    Returns:
      LoadedData; its fingerprint hashes every file's rows as used (after filters and
      caps, in file order), before the seeded shuffle and held-out split.

    Raises:
      ValueError: fewer training anchors than num_hosts * generator.anchors_per_step, or
        fewer prompts than num_hosts * policy.prompts_per_step; the message names the files,
        what each lost (filters, duplicates) and the config fields.
      data.splits.SplitError (a ValueError): under d.require_splits, a row of another split
        than its stage's (`_check_split_setup`, `data.splits.require_split`).
      FileNotFoundError / ValueError: as `resolve_data_paths` and `load_jsonl` (and
        `records_from_tfds` for "tfds:" entries).
    """
    anchor_paths, prompt_paths = resolve_data_paths(d)
    _check_split_setup(d)
    anchor_files = _read_anchors(d, anchor_paths)
    anchors = [a for f in anchor_files for a in f.rows]
    # A seeded shuffle across files: the held-out split is the same on every host and rerun.
    order = shuffled_order(len(anchors), d.seed)
    anchors = [anchors[i] for i in order]
    heldout_files = []
    if d.heldout_anchor_paths:
        # Held-out lists from files of their own (e.g. lists of held-out prompts, which a
        # warm start never saw); every list of anchor_paths trains.
        heldout_files = _read_anchors(d, d.heldout_anchor_paths)
        pool = [a for f in heldout_files for a in f.rows]
        pool = [pool[i] for i in shuffled_order(len(pool), d.seed)]
        heldout, train = pool[:d.heldout_anchor_rows], anchors
        _refuse_shared_prompts(heldout, heldout_files, train, anchor_files)
    else:
        heldout, train = anchors[:d.heldout_anchor_rows], anchors[d.heldout_anchor_rows:]
    if anchor_paths or d.reads_anchors:  # a run that reads no anchor list needs none
        _check_fills_batch("anchors", len(train), anchor_files, "generator.anchors_per_step",
                           d.anchors_per_step, "data.max_anchor_rows", d.max_anchor_rows,
                           num_hosts, f" after config.data.heldout_anchor_rows="
                           f"{d.heldout_anchor_rows} held out")
    prompt_files = _read_prompts(d, prompt_paths)
    if d.require_splits:  # every row its stage's split (check_data_sources names the line)
        for role, files in (("generator_anchors", anchor_files),
                            ("heldout_anchors", heldout_files),
                            ("policy_prompts", prompt_files)):
            for f in files:
                require_split(f.rows, STAGE_SPLITS[role], f.path, STAGE_NAMES[role])
    prompts = [p for f in prompt_files for p in f.rows]
    _check_fills_batch("prompts", len(prompts), prompt_files, "policy.prompts_per_step",
                       d.prompts_per_step, "data.max_prompt_rows", d.max_prompt_rows, num_hosts)
    fingerprint = data_fingerprint([("anchors", f.path, f.rows) for f in anchor_files]
                                   + [("heldout_anchors", f.path, f.rows)
                                      for f in heldout_files]
                                   + [("prompts", f.path, f.rows) for f in prompt_files])
    return LoadedData(train, heldout, prompts, fingerprint)


def _refuse_shared_prompts(heldout: list, heldout_files: list, train: list,
                           train_files: list) -> None:
    """Raises ValueError when a held-out anchor list's prompt (history and text) is also a
    training list's: the held-out score would then measure recall of a trained prompt."""
    seen = {(repr(a.history or []), a.prompt) for a in train}
    for a in heldout:
        if (repr(a.history or []), a.prompt) in seen:
            raise ValueError(
                f"config.data.heldout_anchor_paths ({', '.join(f.path for f in heldout_files)}): "
                f"held-out list {a.id!r} has the prompt of a training list in "
                f"config.data.anchor_paths ({', '.join(f.path for f in train_files)}); "
                "held-out lists must come from prompts that never train")


def _check_split_setup(d: DataSpec) -> None:
    """Under d.require_splits, held-out lists split off the generator's RL lists would score
    prompts of another split: they must come from heldout_anchor_paths.

    Raises:
        ValueError: d.heldout_anchor_rows > 0 with no heldout_anchor_paths (names both
            fields).
    """
    if d.require_splits and d.heldout_anchor_rows and not d.heldout_anchor_paths:
        raise ValueError(
            f"config.data.heldout_anchor_rows={d.heldout_anchor_rows} with no "
            "config.data.heldout_anchor_paths: under config.data.require_splits the "
            "held-out lists are the heldout split's anchor lists (heldout_anchors.jsonl), "
            "never a part of the generator's RL lists (config.data.anchor_paths)")
