"""Tests for drubric_jax.data.loading: config.data -> (train anchors, held-out anchors,
prompts), on tiny JSONL files written to tmp_path and a fake Nectar (no network)."""

import json
import sys
import types

import pytest

from configs.base import base_config
from drubric_jax.rounds.settings import data_spec
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
    return {"id": f"a/{i}", "source": "t:a",
            "prompt": f"Explain topic {i} in detail, with one example, for a curious reader.",
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
    loaded = data.load_data(data_spec(c))
    train, heldout, prompts = loaded.train_anchors, loaded.heldout_anchors, loaded.prompts
    assert len(train) == 2 and len(heldout) == 1
    assert [p.id for p in prompts] == [f"fake/Nectar/train/{i}" for i in range(3)]
    assert all(p.source == "anthropic-hh" for p in prompts)
    assert prompts[0].prompt.startswith("Please explain the water cycle in detail, version 0")


def _prompt_row(i: int, prompt: str) -> dict:
    return {"id": f"p/{i}", "source": "t:p", "prompt": prompt}


def test_duplicate_prompts_are_counted_logged_and_named_in_the_batch_error(
        write_jsonl, caplog):
    anchors = write_jsonl([_anchor_row(i) for i in range(3)], name="anchors.jsonl")
    prompts = write_jsonl([_prompt_row(0, "Same?"), _prompt_row(1, "Same?")],
                          name="prompts.jsonl")
    stats = {}
    assert len(data.prompts_from_jsonl(prompts, stats=stats)) == 1
    assert stats == {"kept": 1, "duplicate": 1}
    c = _custom_config([anchors], [prompts])
    assert c.policy.prompts_per_step == 2
    with caplog.at_level("INFO"), pytest.raises(ValueError) as e:
        data.load_data(data_spec(c))
    msg = str(e.value)
    assert msg.startswith("prompts: 1 rows left over 1 host(s) cannot fill one batch of "
                          "config.policy.prompts_per_step=2"), msg
    assert f"{prompts} (duplicate=1, kept=1; 1 used)" in msg
    assert "config.data.max_prompt_rows=0" in msg
    assert f"{prompts}: 1 duplicate prompts dropped" in caplog.text


def test_too_few_anchors_error_names_files_filters_and_fields(write_jsonl):
    rows = [_anchor_row(0), _anchor_row(1), _anchor_row(2, n=3)]  # 3 responses: few_useful
    anchors = write_jsonl(rows, name="anchors.jsonl")
    prompts = write_jsonl([_prompt_row(i, f"Question {i}?") for i in range(4)],
                          name="prompts.jsonl")
    c = _custom_config([anchors], [prompts])
    c.generator.anchors_per_step = 1
    loaded = data.load_data(data_spec(c))
    train, heldout = loaded.train_anchors, loaded.heldout_anchors
    assert len(train) == 1 and len(heldout) == 1
    with pytest.raises(ValueError) as e:
        data.load_data(data_spec(c), num_hosts=2)
    msg = str(e.value)
    assert msg.startswith("anchors: 1 rows left after config.data.heldout_anchor_rows=1 held "
                          "out over 2 host(s) cannot fill one batch of "
                          "config.generator.anchors_per_step=1"), msg
    assert f"{anchors} (few_useful=1, kept=2; 2 used)" in msg
    assert "config.data.max_anchor_rows=0 (0 = all)" in msg


def test_policy_filter_applies_to_ranked_prompts_when_the_paper_filters_are_asked(
        write_jsonl, monkeypatch):
    long_q = "Please explain in detail how the water cycle works for a school project."
    ranked = lambda i, prompt, top: {  # noqa: E731
        "id": f"r/{i}", "source": "t:r", "prompt": prompt,
        "responses": [top] + [_long(10 * i + r) for r in range(3)], "ranking": [0, 1, 2, 3]}
    rows = [ranked(0, long_q, _long(0)),
            ranked(1, "Too short?", _long(1)),                              # short_prompt
            ranked(2, long_q + " Again.", "I'm sorry, but I can't help with that request "
                                          "today, it is not something I can do."),  # refusal
            _prompt_row(3, "Short prompt-only row?")]                     # no responses: kept
    anchors = write_jsonl([_anchor_row(i, n=7) for i in range(3)], name="anchors.jsonl")
    prompts = write_jsonl(rows, name="prompts.jsonl")
    off = _custom_config([anchors], [prompts], min_responses=4)
    assert [p.id for p in data.load_data(data_spec(off)).prompts] == ["r/0", "r/1", "r/2", "p/3"]
    paper = _custom_config([anchors], [prompts], min_responses=4, min_prompt_chars=50,
                           min_top_response_chars=50)
    assert [p.id for p in data.load_data(data_spec(paper)).prompts] == ["r/0", "p/3"]
    stats = {}
    data.prompts_from_jsonl(prompts, filters=data.PolicyFilterConfig(4, 50, 50), stats=stats)
    assert stats == {"kept": 2, "short_prompt": 1, "bad_top_response": 1}
    # Nectar prompts: the policy filter, not the generator filter.
    nectar = [_nectar_row(i) for i in range(3)]
    nectar[1]["answers"][0]["answer"] = "Hello! How can I help you today?"
    nectar[2]["answers"][3]["answer"] = "the cat sat on the mat " * 30  # only rank 4 loops
    _fake_datasets(monkeypatch, nectar)
    paper.data.prompt_paths = ("hf:fake/Nectar",)
    paper.data.min_responses = 7
    assert [p.id for p in data.load_data(data_spec(paper)).prompts] == ["fake/Nectar/train/0",
                                                        "fake/Nectar/train/2"]


def test_fingerprint_hashes_the_rows_used_not_the_paths(write_jsonl, tmp_path):
    anchors = write_jsonl([_anchor_row(i) for i in range(4)], name="anchors.jsonl")
    prompts = write_jsonl([_prompt_row(i, f"Question {i}?") for i in range(3)],
                          name="prompts.jsonl")
    fp = data.load_data(data_spec(_custom_config([anchors], [prompts]))).fingerprint
    assert [(f["kind"], f["path"], f["rows"]) for f in fp["files"]] == [
        ("anchors", str(anchors), 4), ("prompts", str(prompts), 3)]
    assert fp["rows"] == {"anchors": 4, "prompts": 3}
    assert json.loads(json.dumps(fp)) == fp
    again = data.load_data(data_spec(_custom_config([anchors], [prompts], heldout_anchor_rows=2)))
    assert again.fingerprint == fp  # the held-out split is config, not data
    moved = tmp_path / "moved"
    moved.mkdir()
    copies = [moved / p.name for p in (anchors, prompts)]
    for src, dst in zip((anchors, prompts), copies):
        dst.write_bytes(src.read_bytes())
    assert data.load_data(data_spec(_custom_config([copies[0]], [copies[1]]))).fingerprint["sha256"] == (
        fp["sha256"])
    capped = data.load_data(data_spec(_custom_config([anchors], [prompts], max_prompt_rows=2)))
    assert capped.fingerprint["sha256"] != fp["sha256"]
    assert capped.fingerprint["files"][0] == fp["files"][0]
    edited = _prompt_row(2, "Question 2, edited?")
    write_jsonl([_prompt_row(0, "Question 0?"), _prompt_row(1, "Question 1?"), edited],
                name="prompts.jsonl")
    changed = data.load_data(data_spec(_custom_config([anchors], [prompts]))).fingerprint
    assert changed["files"][1]["sha256"] != fp["files"][1]["sha256"]
    assert changed["files"][0] == fp["files"][0] and changed["sha256"] != fp["sha256"]


def test_data_fingerprint_is_order_and_kind_sensitive():
    a = data.PromptItem(id="1", source="s", prompt="x")
    b = data.PromptItem(id="2", source="s", prompt="y")
    fp = data.data_fingerprint([("prompts", "p.jsonl", [a, b])])
    assert fp["files"][0]["rows"] == 2 and fp["rows"] == {"prompts": 2}
    assert data.data_fingerprint([("prompts", "p.jsonl", [b, a])])["sha256"] != fp["sha256"]
    assert data.data_fingerprint([("anchors", "p.jsonl", [a, b])])["sha256"] != fp["sha256"]
    assert data.data_fingerprint([("prompts", "q.jsonl", [a, b])])["sha256"] == fp["sha256"]


def test_check_data_sources_names_the_config_field_and_file(write_jsonl, tmp_path):
    anchors = write_jsonl([_anchor_row(i) for i in range(3)], name="anchors.jsonl")
    prompts = write_jsonl([_prompt_row(i, f"Question {i}?") for i in range(3)],
                          name="prompts.jsonl")
    c = _custom_config([anchors, "hf:fake/Nectar"], [prompts])
    assert data.check_data_sources(data_spec(c)) == {str(anchors): 3, str(prompts): 3}  # hf: skipped
    missing = tmp_path / "missing.jsonl"
    c.data.prompt_paths = (str(prompts), str(missing))
    with pytest.raises(FileNotFoundError, match=r"^config\.data\.prompt_paths\[1\]: no such "
                                                r"file .*missing\.jsonl$"):
        data.check_data_sources(data_spec(c))
    bad = write_jsonl([_prompt_row(0, "ok?"), dict(_prompt_row(1, "x"), prompt=5)],
                      name="bad.jsonl")
    c.data.prompt_paths = (str(bad),)
    with pytest.raises(ValueError, match=r"^config\.data\.prompt_paths\[0\]: .*bad\.jsonl:2: "
                                         r"field 'prompt' must be a string"):
        data.check_data_sources(data_spec(c))
    c.data.prompt_paths = (str(prompts),)
    c.data.anchor_paths = (str(prompts),)  # prompt-only rows cannot be anchors
    with pytest.raises(ValueError, match=r"^config\.data\.anchor_paths\[0\]: .*prompts\.jsonl "
                                         r"has no ranked rows"):
        data.check_data_sources(data_spec(c))


def test_check_data_sources_demo_and_shared(tmp_path):
    c = base_config()
    assert sorted(data.check_data_sources(data_spec(c)).values()) == [24, 32]
    c.data.name, c.data.shared_dir = "shared", str(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"config\.data\.name=shared needs .*"
                                                r"\(set config\.data\.shared_dir\)"):
        data.check_data_sources(data_spec(c))


def test_heldout_anchor_paths_hold_out_their_own_files_and_refuse_a_trained_prompt(
        write_jsonl, tmp_path):
    """data.heldout_anchor_paths: the held-out lists are the first heldout_anchor_rows of
    those files' seeded shuffle, every list of anchor_paths trains, the fingerprint covers
    both, check_data_sources names the field, and a held-out list whose prompt also trains
    is refused (ValueError naming the list and both files)."""
    anchors = write_jsonl([_anchor_row(i) for i in range(3)], name="anchors.jsonl")
    held = write_jsonl([_anchor_row(i) for i in range(10, 14)], name="held.jsonl")
    prompts = write_jsonl([_prompt_row(i, f"Question {i}?") for i in range(3)],
                          name="prompts.jsonl")
    c = _custom_config([anchors], [prompts], heldout_anchor_rows=2,
                       heldout_anchor_paths=(str(held),))
    loaded = data.load_data(data_spec(c))
    assert sorted(a.id for a in loaded.train_anchors) == ["a/0", "a/1", "a/2"]
    assert len(loaded.heldout_anchors) == 2
    assert {a.id for a in loaded.heldout_anchors} <= {f"a/{i}" for i in range(10, 14)}
    # The same split on a rerun; another seed may draw other held-out lists of the file.
    assert ([a.id for a in data.load_data(data_spec(c)).heldout_anchors]
            == [a.id for a in loaded.heldout_anchors])
    split = data.load_data(data_spec(_custom_config([anchors], [prompts], heldout_anchor_rows=2)))
    assert loaded.fingerprint != split.fingerprint
    assert data.check_data_sources(data_spec(c)) == {str(anchors): 3, str(held): 4,
                                                     str(prompts): 3}
    c.data.heldout_anchor_paths = (str(tmp_path / "none.jsonl"),)
    with pytest.raises(FileNotFoundError, match=r"^config\.data\.heldout_anchor_paths\[0\]: "
                                                r"no such file .*none\.jsonl"):
        data.check_data_sources(data_spec(c))
    # A held-out file with a training prompt (a/1) is refused, whichever lists are drawn.
    leak = write_jsonl([dict(_anchor_row(1), id="h/1")], name="leak.jsonl")
    c.data.heldout_anchor_paths = (str(leak),)
    with pytest.raises(ValueError, match=r"heldout_anchor_paths .*leak\.jsonl.*held-out list "
                                         r"'h/1' has the prompt of a training list"):
        data.load_data(data_spec(c))
