"""Builds shared-schema JSONL files into one TFDS dataset (array_record), one split per file.

`build_tfds` validates every file with `schema.load_jsonl` (errors name file:line:field),
then writes NAME/1.0.0/ under data_dir through a `tfds.core.GeneratorBasedBuilder` with
the features of `tfds_source.features()`, file_format array_record and TFDS's shuffling
disabled, so a split holds its file's rows in file order. No TensorFlow is needed: the
builder writes tf.train.Example protos through TFDS's own proto classes (TFDS's
`store_as_tfds_dataset` would import TensorFlow, which is why it is not used). The command
is experiments/build_tfds.py; reading is `tfds_source.records_from_tfds`.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Optional, Sequence

from drubric_jax.data.schema import PathLike, load_jsonl
from drubric_jax.data.tfds_source import (_NAME, FEATURES_VERSION, _import_tfds, features,
                                          record_to_example)

_SPLIT = re.compile(r"^[A-Za-z0-9_]+$")  # a plain TFDS split name (no slice, no '+')


def default_split_names(paths: Sequence[PathLike]) -> list:
    """Split names from file names: the stem with every other character than [A-Za-z0-9_]
    turned into "_" ("../checks_world/train.jsonl" -> "train")."""
    return [re.sub(r"[^A-Za-z0-9_]", "_", Path(p).stem) or "_" for p in paths]


def expand_jsonl_entries(entries: Sequence[PathLike], exclude: Sequence[str] = ()) -> tuple:
    """(paths, split names) of --jsonl entries: a file is itself, split = its stem (as
    `default_split_names`); a directory is every *.jsonl below it (sorted), split = the path
    relative to it without ".jsonl", "/" and other characters than [A-Za-z0-9_] turned into
    "_" ("../shared/data" + "rm_bench/chat.jsonl" -> "rm_bench_chat").

    Args:
      entries: file or directory paths.
      exclude: fnmatch patterns; a file below a directory entry whose relative path matches
        one is left out (e.g. "ifeval/*", a file of another layout).

    Returns:
      (list[str] paths, list[str] split names), in entry order.

    Raises:
      FileNotFoundError: an entry does not exist, or a directory holds no *.jsonl file.
    """
    import fnmatch

    paths, splits = [], []
    for entry in entries:
        entry = Path(entry)
        if entry.is_dir():
            found = [p for p in sorted(entry.rglob("*.jsonl"))
                     if not any(fnmatch.fnmatch(p.relative_to(entry).as_posix(), pat)
                                for pat in exclude)]
            if not found:
                raise FileNotFoundError(f"{entry}: no *.jsonl file (exclude={list(exclude)})")
            paths += [str(p) for p in found]
            splits += [re.sub(r"[^A-Za-z0-9_]", "_", p.relative_to(entry).with_suffix("")
                              .as_posix()) for p in found]
        elif entry.is_file():
            paths.append(str(entry))
            splits += default_split_names([entry])
        else:
            raise FileNotFoundError(f"--jsonl entry {entry}: no such file or directory")
    return paths, splits


def _check_names(name: str, paths: Sequence[str], splits: Sequence[str]) -> None:
    if not _NAME.match(name):
        raise ValueError(f"--name={name!r}: a TFDS dataset name must be snake_case "
                         "([a-z][a-z0-9_]*)")
    if not paths:
        raise ValueError("no JSONL file given (--jsonl=PATH[,PATH])")
    if len(splits) != len(paths):
        raise ValueError(f"{len(splits)} split names {list(splits)} for {len(paths)} JSONL "
                         f"files {list(paths)}: give one per file (--splits)")
    first = {}
    for path, split in zip(paths, splits):
        if not _SPLIT.match(split):
            raise ValueError(f"{path}: split name {split!r} must match [A-Za-z0-9_]+")
        if split in first:
            raise ValueError(f"{path} and {first[split]} both give split {split!r}: name the "
                             "splits with --splits=NAME[,NAME]")
        first[split] = path


def build_tfds(jsonl_paths: Sequence[PathLike], name: str, data_dir: PathLike,
               splits: Optional[Sequence[str]] = None, overwrite: bool = False) -> dict:
    """Writes the JSONL files as TFDS dataset `name` (version FEATURES_VERSION) in data_dir.

    Args:
      jsonl_paths: shared-schema JSONL files, one split each.
      name: TFDS dataset name, snake_case; read back as "tfds:<name>:<split>".
      data_dir: TFDS data directory (local path or an etils.epath URL).
      splits: one split name per file; None = `default_split_names(jsonl_paths)`.
      overwrite: replace an existing data_dir/name/version directory; else refuse it.

    Returns:
      dict {split: {"path": str, "rows": int, "sha256": hex of the file's bytes}}, in
      file order (also written into the dataset's description).

    Raises:
      ValueError: a bad name, split names that repeat or are not [A-Za-z0-9_]+, or a bad
        row ("<path>:<line>: field '<name>' ...", from `load_jsonl`).
      FileNotFoundError: a JSONL file is missing.
      FileExistsError: the dataset directory exists and overwrite is False.
      ImportError: tensorflow_datasets is not installed (`pip install -e ".[tfds]"`).
    """
    from etils import epath

    paths = [str(p) for p in jsonl_paths]
    splits = list(splits) if splits else default_split_names(paths)
    _check_names(name, paths, splits)
    # Every file is read and validated before anything is written.
    records = {s: load_jsonl(p) for s, p in zip(splits, paths)}
    summary = {s: {"path": str(Path(p).resolve()), "rows": len(records[s]),
                   "sha256": hashlib.sha256(Path(p).read_bytes()).hexdigest()}
               for s, p in zip(splits, paths)}
    tfds = _import_tfds()
    target = epath.Path(data_dir) / name / FEATURES_VERSION
    if target.exists():
        if not overwrite:
            raise FileExistsError(f"{target} exists: pass --overwrite to rebuild it (TFDS "
                                  "would otherwise keep the old data)")
        target.rmtree()
    description = "drubric_jax shared-schema rows (experiments/build_tfds.py); splits: " + \
        "; ".join(f"{s} <- {v['path']} ({v['rows']} rows, sha256 {v['sha256']})"
                  for s, v in summary.items())

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, description=description,
                                     features=features(), disable_shuffling=True)

    def _split_generators(self, dl_manager):
        del dl_manager
        return {s: self._generate_examples(s) for s in splits}

    def _generate_examples(self, split):
        # Keys are row positions: with shuffling disabled the file order is kept.
        for i, rec in enumerate(records[split]):
            yield i, record_to_example(rec)

    # A builder class per dataset name, kept out of TFDS's registry (a second build in the
    # same process must not clash); reading needs no class (read-only builder from files).
    with tfds.core.registered.skip_registration():
        builder_cls = type("JsonlRows", (tfds.core.GeneratorBasedBuilder,), {
            "name": name, "VERSION": tfds.core.Version(FEATURES_VERSION),
            "RELEASE_NOTES": {FEATURES_VERSION: "Shared-schema rows, one split per file."},
            "_info": _info, "_split_generators": _split_generators,
            "_generate_examples": _generate_examples, "__module__": __name__})
    builder = builder_cls(data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare()
    return summary
