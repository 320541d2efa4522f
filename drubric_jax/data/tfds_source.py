"""TFDS as a data source: shared-schema rows stored as a TFDS dataset, read back as `Record`s.

A data entry `tfds:NAME[:SPLIT]` (in config.data.anchor_paths / prompt_paths, like the
`hf:` entries; SPLIT defaults to "train" and may be a TFDS split expression such as
"train[:64]") names split SPLIT of the TFDS dataset NAME under config.data.tfds_data_dir.
It is read with `tfds.data_source` (array_record files, NumPy records): TensorFlow is
never imported, at read time or at build time (`tfds_build`; docs/CONFIGS.md, "TFDS").
`tensorflow_datasets` is imported inside the functions, so the package imports without it
(the `tfds` extra of setup.py installs it).

One TFDS example per JSONL row, in file order (the builder disables TFDS's shuffling), with
the features of `features()`. Reading rebuilds the row's JSON object and validates it with
`schema.record_from_dict`, so a row from TFDS passes the same checks as a JSONL line and
gives an equal `Record` (path "tfds:NAME:SPLIT", line = 1-based row number in the split).
"""
from __future__ import annotations

import json
import re
from typing import Optional

from drubric_jax.data.schema import Record, record_from_dict

TFDS_PREFIX = "tfds:"
# TFDS dataset names that are also plain directory names (snake_case).
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
FEATURES_VERSION = "1.0.0"  # the layout of `features()`; the builder's dataset version


def is_tfds_spec(entry: str) -> bool:
    """Whether a data entry names a TFDS split ("tfds:NAME[:SPLIT]")."""
    return isinstance(entry, str) and entry.startswith(TFDS_PREFIX)


def parse_tfds_spec(spec: str) -> tuple:
    """("NAME", "SPLIT") of "tfds:NAME[:SPLIT]" (SPLIT "train" when left out).

    Raises:
      ValueError: no "tfds:" prefix, or NAME not snake_case ([a-z][a-z0-9_]*), or an
        empty SPLIT; the message quotes the entry.
    """
    if not is_tfds_spec(spec):
        raise ValueError(f"data entry {spec!r}: expected 'tfds:NAME[:SPLIT]'")
    # Split at the first ':' only: a split expression may hold colons ("train[:64]").
    name, sep, split = spec[len(TFDS_PREFIX):].partition(":")
    if not _NAME.match(name):
        raise ValueError(f"data entry {spec!r}: TFDS dataset name {name!r} must be snake_case "
                         "([a-z][a-z0-9_]*)")
    if sep and not split:
        raise ValueError(f"data entry {spec!r}: empty split after ':'")
    return name, split or "train"


def features():
    """The TFDS `FeaturesDict` of one shared-schema row (../shared/data/README.md).

    Fields (TFDS feature; JSON field it stores):
      id, source, prompt: Text.
      responses: Sequence(Text), A strings; [] on prompt-only rows.
      ranking: Sequence(int32), A indices into `responses`, best first; [].
      scores: Text, the `scores` list as JSON ("null" when absent, as a missing field).
        Not a float feature: TFDS stores rows as tf.train.Example, whose float_list is
        float32, so a float64 Sequence would read 0.1 back as 0.10000000149011612.
      ties: bool.
      history: Sequence({role: Text, content: Text}), earlier turns; [].
      reference: Text ("" when absent); has_reference: bool.
      meta: Text, the `meta` object as JSON; extra: Text, the unknown top-level keys as a
        JSON object ("{}" when none).

    Raises:
      ImportError: tensorflow_datasets is not installed (`pip install -e ".[tfds]"`).
    """
    import numpy as np
    tfds = _import_tfds()
    text = tfds.features.Text()
    return tfds.features.FeaturesDict({
        "id": text, "source": text, "prompt": text,
        "responses": tfds.features.Sequence(tfds.features.Text()),
        "ranking": tfds.features.Sequence(np.int32),
        "scores": text,
        "ties": np.bool_,
        "history": tfds.features.Sequence({"role": tfds.features.Text(),
                                           "content": tfds.features.Text()}),
        "reference": tfds.features.Text(), "has_reference": np.bool_,
        "meta": tfds.features.Text(), "extra": tfds.features.Text(),
    })


def record_to_example(rec: Record) -> dict:
    """The TFDS example (a dict of `features()`) of one validated Record; inverse of
    `record_from_example`."""
    return {
        "id": rec.id, "source": rec.source, "prompt": rec.prompt,
        "responses": list(rec.responses), "ranking": list(rec.ranking),
        "scores": json.dumps(rec.scores),  # exact: JSON floats round-trip float64
        "ties": rec.ties,
        "history": {"role": [t["role"] for t in rec.history],
                    "content": [t["content"] for t in rec.history]},
        "reference": rec.reference or "", "has_reference": rec.reference is not None,
        # ensure_ascii off and the dicts' own key order: the JSONL row's meta, as written.
        "meta": json.dumps(rec.meta, ensure_ascii=False),
        "extra": json.dumps(rec.extra, ensure_ascii=False),
    }


def _text(x) -> str:
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def _json_object(text: str, where: str, name: str) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: field '{name}' is not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: field '{name}' must hold a JSON object")
    return obj


def record_from_example(ex: dict, where: str = "<tfds example>") -> Record:
    """Validated Record of one decoded TFDS example (`tfds.data_source` item).

    Args:
      ex: dict of `features()` as `tfds.data_source` returns it: Text as bytes, sequences
        as lists of NumPy scalars, `history` as {"role": [bytes], "content": [bytes]}.
      where: location for error messages, e.g. "tfds:name:train (data_dir d) row 7".

    Returns:
      Record (path and line left empty; `records_from_tfds` sets them).

    Raises:
      ValueError: "<where>: field '<name>' ..." for a missing feature, bad JSON in `meta` /
        `extra`, or any rule of `schema.record_from_dict`.
    """
    missing = [k for k in ("id", "source", "prompt", "responses", "ranking", "scores", "ties",
                           "history", "reference", "has_reference", "meta", "extra")
               if k not in ex]
    if missing:
        raise ValueError(f"{where}: field '{missing[0]}' is missing from the TFDS example "
                         f"(not built by experiments/build_tfds.py?)")
    obj = {"id": _text(ex["id"]), "source": _text(ex["source"]), "prompt": _text(ex["prompt"])}
    if len(ex["responses"]):
        obj["responses"] = [_text(r) for r in ex["responses"]]
        obj["ranking"] = [int(i) for i in ex["ranking"]]
    try:
        scores = json.loads(_text(ex["scores"]))
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: field 'scores' is not valid JSON ({e.msg})") from None
    if scores is not None:
        obj["scores"] = scores  # checked by record_from_dict (a list of finite numbers)
    obj["ties"] = bool(ex["ties"])
    obj["history"] = [{"role": _text(r), "content": _text(c)}
                      for r, c in zip(ex["history"]["role"], ex["history"]["content"])]
    if bool(ex["has_reference"]):
        obj["reference"] = _text(ex["reference"])
    obj["meta"] = _json_object(_text(ex["meta"]), where, "meta")
    extra = _json_object(_text(ex["extra"]), where, "extra")
    # Unknown keys of the JSONL row: they cannot shadow a schema field.
    obj.update({k: v for k, v in extra.items() if k not in obj})
    return record_from_dict(obj, where)


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(f"'tfds:' data entries need tensorflow_datasets ({e}); install the "
                          "extra: pip install -e \".[tfds]\"") from None
    return tfds


def records_from_tfds(spec: str, data_dir: Optional[str] = None) -> list:
    """Every row of a TFDS split, validated, in stored (= JSONL file) order.

    Args:
      spec: "tfds:NAME[:SPLIT]".
      data_dir: the TFDS data directory; None or "" = TFDS's default ($TFDS_DATA_DIR or
        ~/tensorflow_datasets).

    Returns:
      list[Record], path = spec, line = 1-based row number in the split.

    Raises:
      ImportError: tensorflow_datasets not installed (names the extra).
      FileNotFoundError: no dataset NAME (or no split SPLIT) under data_dir; the message
        names both and the build command.
      ValueError: "<spec> (data_dir <d>) row <n>: field '<name>' ..." for a bad row, or
        "... field 'id' '<id>' repeats row <m>".
    """
    name, split = parse_tfds_spec(spec)
    tfds = _import_tfds()
    shown = data_dir or "TFDS default"
    try:
        source = tfds.data_source(name, split=split, data_dir=data_dir or None)
    except Exception as e:  # DatasetNotFoundError, an unknown split (ValueError/KeyError)
        if not isinstance(e, (tfds.core.registered.DatasetNotFoundError, ValueError, KeyError,
                              FileNotFoundError)):
            raise
        raise FileNotFoundError(
            f"{spec}: no TFDS dataset {name!r} with split {split!r} under data_dir {shown} "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); build it with "
            f"python -m experiments.build_tfds --jsonl=FILE[,FILE] --name={name} "
            f"--data_dir=DIR") from None
    records, seen = [], {}
    for i in range(len(source)):
        where = f"{spec} (data_dir {shown}) row {i + 1}"
        rec = record_from_example(source[i], where)
        if rec.id in seen:
            raise ValueError(f"{where}: field 'id' {rec.id!r} repeats row {seen[rec.id]}")
        seen[rec.id] = i + 1
        rec.path, rec.line = spec, i + 1
        records.append(rec)
    return records
