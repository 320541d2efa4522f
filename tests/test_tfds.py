"""Tests for TFDS as a data source (drubric_jax/data/tfds_source.py, tfds_build.py,
experiments/build_tfds.py): a tiny dataset built in a temporary data_dir reads back equal to
its JSONL rows, and a run's data fingerprint is the same from TFDS as from the JSONL files.

The tests that build or read a dataset need tensorflow_datasets (the `tfds` extra:
pip install -e ".[tfds]"); without it they skip, saying so. The spec parsing and --jsonl
expansion tests need nothing beyond the package. TensorFlow is never needed.
"""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from configs.base import base_config
from drubric_jax.rounds.settings import data_spec
from drubric_jax import data
from drubric_jax.data.tfds_build import build_tfds, expand_jsonl_entries
from drubric_jax.data.tfds_source import parse_tfds_spec, records_from_tfds

REPO = Path(__file__).resolve().parent.parent
NEEDS_EXTRA = ("tensorflow_datasets or array_record is not installed: this test needs the "
               "`tfds` extra (pip install -e \".[tfds]\")")


@pytest.fixture
def tfds():
    """tensorflow_datasets (and array_record), or a skip that names the extra to install."""
    pytest.importorskip("array_record", reason=NEEDS_EXTRA)
    return pytest.importorskip("tensorflow_datasets", reason=NEEDS_EXTRA)


def _long(i: int) -> str:
    """A distinct response of more than 50 characters."""
    return (f"Response {i}: evaporation lifts water, condensation forms clouds and "
            f"precipitation returns it to the land ({i}).")


# Every field of the schema at least once: ties with scores, history, reference ("" and
# absent), nested meta, an unknown top-level key, non-ASCII text and U+2028 in a prompt.
# The pairwise row has too few responses for the anchor filter (4 useful): dropped alike.
ANCHOR_ROWS = [
    {"id": "t/anchors/0", "source": "t:anchors", "prompt": "Explain the water cycle.\u2028Briefly.",
     "responses": [_long(0), _long(1), _long(2), _long(9)], "ranking": [2, 0, 3, 1],
     "scores": [0.5, 0.1, 1.0, 0.25],  # 0.1 is no float32: must come back exact
     "meta": {"checks": [{"id": "x", "kwargs": {"n": 3}}]}},
    {"id": "t/anchors/1", "source": "t:anchors", "prompt": "Café au lait, ou thé ? 日本語",
     "responses": [_long(3), _long(4), _long(5), _long(6)], "ranking": [0, 1, 2, 3],
     "scores": [1.0, 1.0, 0.0, 0.0], "ties": True,
     "history": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
    {"id": "t/anchors/2", "source": "t:anchors", "prompt": "Pick one.",
     "responses": [_long(7), _long(8)], "ranking": [1, 0], "upstream_label": "B"},
] + [{"id": f"t/anchors/{i}", "source": "t:anchors", "prompt": f"Topic {i}, explained.",
      "responses": [_long(10 * i + r) for r in range(4)], "ranking": [0, 1, 2, 3]}
     for i in range(3, 7)]
PROMPT_ROWS = [
    {"id": "t/prompts/0", "source": "t:prompts", "prompt": "Write a haiku.", "reference": ""},
    {"id": "t/prompts/1", "source": "t:prompts", "prompt": "Name a river.",
     "reference": "The Nile.", "meta": {"category": "geo", "n": 1.5}},
    {"id": "t/prompts/2", "source": "t:prompts", "prompt": "Name a river."},  # a duplicate
] + [{"id": f"t/prompts/{i}", "source": "t:prompts", "prompt": f"Question {i}?"}
     for i in range(3, 8)]


@pytest.fixture
def jsonl_files(tmp_path):
    """(anchors.jsonl, prompts.jsonl) of the rows above, written as the shared files are."""
    paths = []
    for name, rows in (("anchors", ANCHOR_ROWS), ("prompts", PROMPT_ROWS)):
        p = tmp_path / "jsonl" / f"{name}.jsonl"
        p.parent.mkdir(exist_ok=True)
        p.write_text("".join(data.jsonl_line(r) for r in rows), encoding="utf-8")
        paths.append(p)
    return paths


def _content(records):
    """Records without where they came from (path, line)."""
    return [dataclasses.replace(r, path="", line=0) for r in records]


def test_tiny_dataset_reads_back_equal_to_its_jsonl_rows(tfds, jsonl_files, tmp_path):
    tf_before = "tensorflow" in sys.modules
    data_dir = tmp_path / "tfds"
    summary = build_tfds(jsonl_files, "tiny_rows", data_dir)
    assert list(summary) == ["anchors", "prompts"]
    assert [v["rows"] for v in summary.values()] == [len(ANCHOR_ROWS), len(PROMPT_ROWS)]
    assert (data_dir / "tiny_rows" / "1.0.0" / "dataset_info.json").is_file()
    for split, path in zip(("anchors", "prompts"), jsonl_files):
        got = records_from_tfds(f"tfds:tiny_rows:{split}", str(data_dir))
        assert _content(got) == _content(data.load_jsonl(path))  # same rows, same order
        assert [(r.path, r.line) for r in got] == [(f"tfds:tiny_rows:{split}", i + 1)
                                                   for i in range(len(got))]
    rec = records_from_tfds("tfds:tiny_rows:anchors", str(data_dir))[2]
    assert rec.extra == {"upstream_label": "B"} and rec.scores is None
    refs = [r.reference for r in records_from_tfds("tfds:tiny_rows:prompts", str(data_dir))]
    assert refs[:3] == ["", "The Nile.", None]
    # A TFDS split expression after the name.
    assert len(records_from_tfds("tfds:tiny_rows:prompts[:2]", str(data_dir))) == 2
    if not tf_before:  # building and reading never import TensorFlow
        assert "tensorflow" not in sys.modules


def _run_config(anchors, prompts, **fields):
    c = base_config()
    c.data.name = "custom"
    c.data.anchor_paths, c.data.prompt_paths = (str(anchors),), (str(prompts),)
    c.data.heldout_anchor_rows = 1
    c.data.max_responses = 2  # caps apply to TFDS rows as to JSONL rows
    for k, v in fields.items():
        c.data[k] = v
    return c


def test_data_fingerprint_from_tfds_equals_the_jsonl_one(tfds, jsonl_files, tmp_path):
    data_dir = str(tmp_path / "tfds")
    build_tfds(jsonl_files, "tiny_rows", data_dir)
    from_jsonl = data.load_data(data_spec(_run_config(*jsonl_files)))
    tfds_config = _run_config("tfds:tiny_rows:anchors", "tfds:tiny_rows:prompts",
                              tfds_data_dir=data_dir)
    from_tfds = data.load_data(data_spec(tfds_config))
    fj, ft = from_jsonl.fingerprint, from_tfds.fingerprint
    # The content hash ignores paths: equal; the files list names each source.
    assert ft["sha256"] == fj["sha256"] and ft["rows"] == fj["rows"]
    assert [(f["kind"], f["rows"], f["sha256"]) for f in ft["files"]] == \
        [(f["kind"], f["rows"], f["sha256"]) for f in fj["files"]]
    assert [f["path"] for f in ft["files"]] == ["tfds:tiny_rows:anchors",
                                                "tfds:tiny_rows:prompts"]
    assert from_tfds.train_anchors == from_jsonl.train_anchors
    assert from_tfds.heldout_anchors == from_jsonl.heldout_anchors
    assert from_tfds.prompts == from_jsonl.prompts
    assert len(from_tfds.prompts) == len(PROMPT_ROWS) - 1  # the duplicate dropped as in JSONL
    assert data.check_data_sources(data_spec(tfds_config)) == {"tfds:tiny_rows:anchors": len(ANCHOR_ROWS),
                                                    "tfds:tiny_rows:prompts": len(PROMPT_ROWS)}


def test_errors_name_the_dataset_file_and_field(tfds, jsonl_files, write_jsonl, tmp_path):
    data_dir = str(tmp_path / "tfds")
    c = _run_config("tfds:absent", "tfds:absent:prompts", tfds_data_dir=data_dir)
    with pytest.raises(FileNotFoundError, match=r"config\.data\.anchor_paths\[0\]: "
                       r"tfds:absent: no TFDS dataset 'absent' with split 'train'.*build_tfds"):
        data.check_data_sources(data_spec(c))
    build_tfds(jsonl_files, "tiny_rows", data_dir)
    with pytest.raises(FileNotFoundError, match=r"split 'test'.*Unknown split"):
        records_from_tfds("tfds:tiny_rows:test", data_dir)
    with pytest.raises(FileExistsError, match=r"tiny_rows/1\.0\.0 exists.*--overwrite"):
        build_tfds(jsonl_files, "tiny_rows", data_dir)
    bad = write_jsonl([ANCHOR_ROWS[0], {**ANCHOR_ROWS[1], "ranking": [0, 0, 1, 2]}],
                      name="bad.jsonl")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: field 'ranking'"):
        build_tfds([bad], "bad_rows", data_dir)
    with pytest.raises(ValueError, match=r"both give split 'anchors'"):
        build_tfds([jsonl_files[0], jsonl_files[0]], "twice", data_dir)
    # --overwrite rebuilds from the new rows.
    build_tfds([jsonl_files[1]], "tiny_rows", data_dir, splits=["anchors"], overwrite=True)
    assert len(records_from_tfds("tfds:tiny_rows:anchors", data_dir)) == len(PROMPT_ROWS)


def test_build_command_builds_a_directory_of_files(tfds, jsonl_files, tmp_path):
    data_dir = tmp_path / "tfds"
    out = subprocess.run(
        [sys.executable, "-m", "experiments.build_tfds", f"--jsonl={jsonl_files[0].parent}",
         "--name=world", f"--data_dir={data_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert {s: v["rows"] for s, v in summary.items()} == {"anchors": len(ANCHOR_ROWS),
                                                          "prompts": len(PROMPT_ROWS)}
    assert len(records_from_tfds("tfds:world:anchors", str(data_dir))) == len(ANCHOR_ROWS)


def test_parse_tfds_spec():
    assert parse_tfds_spec("tfds:checks_world_v2") == ("checks_world_v2", "train")
    assert parse_tfds_spec("tfds:w:heldout") == ("w", "heldout")
    assert parse_tfds_spec("tfds:w:train[:64]") == ("w", "train[:64]")
    for bad in ("w:train", "tfds:", "tfds:Bad-Name", "tfds:w:"):
        with pytest.raises(ValueError, match=repr(bad).replace("[", r"\[")):
            parse_tfds_spec(bad)


def test_jsonl_entries_expand_to_splits(tmp_path):
    for rel in ("rm_bench/chat.jsonl", "alpaca_eval/eval.jsonl", "ifeval/input_data.jsonl",
                "top-level.jsonl"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text("")
    paths, splits = expand_jsonl_entries([tmp_path], exclude=["ifeval/*"])
    assert splits == ["alpaca_eval_eval", "rm_bench_chat", "top_level"]
    assert paths == [str(tmp_path / p) for p in ("alpaca_eval/eval.jsonl",
                                                 "rm_bench/chat.jsonl", "top-level.jsonl")]
    assert expand_jsonl_entries([tmp_path / "rm_bench" / "chat.jsonl"])[1] == ["chat"]
    with pytest.raises(FileNotFoundError, match="absent"):
        expand_jsonl_entries([tmp_path / "absent"])
