"""The fast check, before any model loads, that every configured data file exists, parses
and belongs to its stage's split (`check_data_sources`); the data layer's `load_data`
(`data.loading`) reads the same files afterwards.
"""
from __future__ import annotations

from drubric_jax.data.loading import (DataSpec, _check_split_setup, _tfds_dir,
                                      resolve_data_paths)
from drubric_jax.data.schema import load_jsonl
from drubric_jax.data.splits import STAGE_NAMES, STAGE_SPLITS, require_split
from drubric_jax.data.tfds_source import is_tfds_spec, records_from_tfds


def _configured_files(d: DataSpec) -> list:
    """[(kind, config field that names the file, path, stage)] of every configured data
    entry; stage is its key in `data.splits.STAGE_SPLITS` (generator_anchors,
    heldout_anchors, policy_prompts)."""
    anchors, prompts = resolve_data_paths(d)
    heldout = [("anchors", f"config.data.heldout_anchor_paths[{i}]", p, "heldout_anchors")
               for i, p in enumerate(d.heldout_anchor_paths)]
    if d.name == "custom":
        return ([("anchors", f"config.data.anchor_paths[{i}]", p, "generator_anchors")
                 for i, p in enumerate(anchors)]
                + heldout + [("prompts", f"config.data.prompt_paths[{i}]", p, "policy_prompts")
                             for i, p in enumerate(prompts)])
    field = f"config.data.name={d.name}"
    if d.name == "shared":
        field += f" (config.data.shared_dir={d.shared_dir!r})"
    return ([("anchors", field, p, "generator_anchors") for p in anchors] + heldout
            + [("prompts", field, p, "policy_prompts") for p in prompts])


class MissingDataFile(FileNotFoundError):
    """A configured data file does not exist (`check_data_sources`); the message names the
    config field, the path and, for the checks world, the commands that write it. Commands
    print it without a traceback (experiments/run.py)."""


def check_data_sources(d: DataSpec) -> dict:
    """Checks that every configured data file exists and parses; loads no model.

    Fast enough to run before the weights load (experiments/run.py does). Every row is
    validated (`load_jsonl`, or `records_from_tfds` for a "tfds:NAME[:SPLIT]" entry), and
    an anchor file must hold ranked rows. "hf:" entries need the network and are left to
    `load_data`.

    Args:
      d: the run's DataSpec (`rounds.settings.data_spec(config)`).

    Returns:
      dict {path: rows in the file} of the JSONL files (and TFDS splits) checked.

    Under a reward that reads the true checks (`d.true_checks_reward`: checks_gold,
    checks_oracle) every prompt row must carry valid ones in `meta["checks"]`
    (`checks.true_checks_of`).

    Raises:
      MissingDataFile (a FileNotFoundError): a missing file, "<config field>: no such file
        <path>" (and the commands that build a checks world's files), or the
        `resolve_data_paths` error for shared data, or "<config field>: tfds:NAME:SPLIT:
        no TFDS dataset ..." for a TFDS split that is not built.
      ImportError: a "tfds:" entry without tensorflow_datasets installed (names the extra).
      ValueError: "<config field>: <path>:<line>: field '<name>' ..." for a bad row, or an
        anchor file without ranked rows; under d.require_splits a row of another split
        than its stage's, "<config field>: <path>:<line>: row '<id>': field 'meta.split' is
        '<found>', but <stage> reads the '<wanted>' split" (`data.splits.SplitError`), or
        held-out lists with no heldout_anchor_paths (`_check_split_setup`); under
        checks_gold, "<config field>: <path>:<line>: row '<id>' ...: field 'meta.checks'
        ..." for a prompt row without valid true checks.
    """
    rows = {}
    _check_split_setup(d)
    # The checkers (seconds to import) load only when a reward reads the true checks.
    reward = d.true_checks_reward
    gold_rule = bool(reward)
    if gold_rule:
        from drubric_jax import checks
    for kind, field, path, stage in _configured_files(d):
        if path.startswith("hf:"):
            continue
        try:
            records = (records_from_tfds(path, _tfds_dir(d)) if is_tfds_spec(path)
                       else load_jsonl(path))
        except FileNotFoundError as e:
            if is_tfds_spec(path):  # the message names the dataset, data_dir and the build
                raise MissingDataFile(f"{field}: {e}") from None
            # The checks world's files are built by commands: name them (a run started
            # before they exist stops here, before any weights load).
            build = d.checks_build
            hint = ("\nBuild the checks world's files first (from the repository root):\n  "
                    + build.replace("\n", "\n  ") if build else "")
            # from None: the message already names the config field and the path.
            raise MissingDataFile(f"{field}: no such file {path}{hint}") from None
        except ValueError as e:
            raise ValueError(f"{field}: {e}") from None
        if kind == "prompts" and gold_rule:
            # The gold rule reads each prompt's true checks: a row without them fails here,
            # before any weights load, not at its first reward.
            for r in records:
                checks.true_checks_of(r.meta, f"{field}: {path}:{r.line}: row {r.id!r} "
                                              f"(config.policy.reward={reward})")
        if d.require_splits:
            # Each stage reads its own split (issue 53): a file of another split (a path
            # overridden by hand) stops the run here, before any weights load.
            require_split(records, STAGE_SPLITS[stage], f"{field}: {path}",
                          STAGE_NAMES[stage])
        if kind == "anchors" and not any(r.responses for r in records):
            raise ValueError(f"{field}: {path} has no ranked rows ('responses' + 'ranking') "
                             "to build anchor lists from")
        rows[path] = len(records)
    return rows
