"""Tests for drubric_jax.data.loading: config.data -> (train anchors, held-out anchors,
prompts), on tiny JSONL files written to tmp_path and a fake Nectar (no network)."""

import sys
import types

from configs.base import base_config
from drubric_jax import data


def _long(i: int, what: str = "answer") -> str:
    """A distinct, useful, > 50 character response (passes every Appendix B heuristic)."""
    return (f"This {what} number {i} explains the water cycle: evaporation lifts water, "
            f"condensation forms clouds and precipitation returns it to the land {i}.")


def _nectar_row(i: int, n: int = 7) -> dict:
    return {"prompt": f"\n\nHuman: Please explain the water cycle in detail, version {i}, "
                      "for a school project on weather.\n\nAssistant: ",
            "answers": [{"answer": _long(10 * i + r), "model": "m", "rank": r + 1}
                        for r in range(n)],
            "source": ["anthropic-hh"]}


def _fake_datasets(monkeypatch, rows):
    """Installs a `datasets` module whose load_dataset returns `rows` (no network)."""
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda dataset_id, split, streaming: list(rows)
    monkeypatch.setitem(sys.modules, "datasets", fake)


def _anchor_row(i: int, n: int = 4) -> dict:
    return {"id": f"a/{i}", "source": "t:a", "prompt": f"Explain topic {i} in detail.",
            "responses": [_long(10 * i + r) for r in range(n)], "ranking": list(range(n))}


def _custom_config(anchor_paths, prompt_paths, **data_fields):
    c = base_config()
    c.data.name = "custom"
    c.data.anchor_paths = tuple(str(p) for p in anchor_paths)
    c.data.prompt_paths = tuple(str(p) for p in prompt_paths)
    c.data.heldout_anchor_rows = 1
    for k, v in data_fields.items():
        c.data[k] = v
    return c


def test_hf_prompts_keep_the_nectar_source(write_jsonl, monkeypatch):
    _fake_datasets(monkeypatch, [_nectar_row(i) for i in range(3)])
    anchors = write_jsonl([_anchor_row(i) for i in range(3)], name="anchors.jsonl")
    c = _custom_config([anchors], ["hf:fake/Nectar"])
    train, heldout, prompts = data.load_data(c)
    assert len(train) == 2 and len(heldout) == 1
    assert [p.id for p in prompts] == [f"fake/Nectar/train/{i}" for i in range(3)]
    assert all(p.source == "anthropic-hh" for p in prompts)
    assert prompts[0].prompt.startswith("Please explain the water cycle in detail, version 0")
