"""Builds shared-schema JSONL files into a TFDS dataset (array_record), one split per file,
for `tfds:NAME[:SPLIT]` data entries (docs/CONFIGS.md, "TFDS datasets").

    python -m experiments.build_tfds --jsonl=../checks_world_v2_splits --name=checks_world_v2_splits \\
        --data_dir=$HOME/tensorflow_datasets
    python -m experiments.build_tfds --jsonl=../shared/data --exclude='ifeval/*' \\
        --name=drubric_shared --data_dir=$HOME/tensorflow_datasets

--jsonl takes files (split = the file's stem) and directories (every *.jsonl below, split =
the relative path with "/" as "_", e.g. rm_bench_chat); --splits names the splits of the
listed files instead. Every row is validated first (errors name file:line:field); an
existing NAME/1.0.0 is refused unless --overwrite. Needs the `tfds` extra
(pip install -e ".[tfds]"), not TensorFlow. Prints one JSON line: {split: {path, rows,
sha256 of the file}}.
"""
from __future__ import annotations

import json

from absl import app, flags
from experiments import cli  # noqa: E402


def define_flags():
    """The command's flags (defined only when run as a command, so tests can import
    several experiment modules whose flag names overlap)."""
    flags.DEFINE_list("jsonl", None, "JSONL files and/or directories of them", required=True)
    flags.DEFINE_string("name", None, "TFDS dataset name (snake_case)", required=True)
    flags.DEFINE_string("data_dir", None, "TFDS data directory (written: NAME/1.0.0/)",
                        required=True)
    flags.DEFINE_list("splits", None, "one split name per --jsonl file (default: from the "
                      "file names); only with files, not directories")
    flags.DEFINE_list("exclude", [], "fnmatch patterns of files below a --jsonl directory "
                      "to leave out (relative paths, e.g. 'ifeval/*')")
    flags.DEFINE_bool("overwrite", False, "replace an existing NAME/1.0.0 in --data_dir")


def main(argv):
    del argv
    from drubric_jax.data.tfds_build import build_tfds, expand_jsonl_entries

    f = flags.FLAGS
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise SystemExit(f"{e}: install the tfds extra (pip install -e \".[tfds]\")")
    tfds.disable_progress_bar()  # one line per split in logs, not a bar per row
    paths, splits = expand_jsonl_entries(f.jsonl, f.exclude)
    if f.splits:
        if len(paths) != len(f.jsonl):
            raise app.UsageError("--splits names files one by one: list files in --jsonl, "
                                 "not directories")
        splits = f.splits
    summary = build_tfds(paths, f.name, f.data_dir, splits, overwrite=f.overwrite)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
