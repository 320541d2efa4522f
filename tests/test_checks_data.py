"""The checks world's data (METHOD 13): seeded constraints (IFEval's conflict table
respected), the composed prompt, `experiments.make_checks_data` (determinism, the split,
write-once, no IFEval prompt), and the gold ranking of anchor responses."""
import json
import os

import numpy as np
import pytest

from drubric_jax import checks, data
from drubric_jax.checks import world
from drubric_jax.checks import world_data as mcd


def test_draws_are_seeded_valid_and_never_conflict():
    for i in range(300):
        a = world.draw_constraints("Write a poem about cats.", np.random.default_rng([0, i]))
        b = world.draw_constraints("Write a poem about cats.", np.random.default_rng([0, i]))
        assert a == b and 1 <= len(a) <= 3
        ids = [t["check"] for t in a]
        assert len(set(ids)) == len(ids)
        for x, t in enumerate(a):
            assert checks.validate(t["check"], t["args"]) == t["args"]
            for u in a[x + 1:]:
                assert u["check"] not in world.CONFLICTS[t["check"]]
                assert world.compatible((t["check"], t["args"]), (u["check"], u["args"]))
    # IFEval's table, made symmetric: json_format conflicts with no_comma both ways.
    assert "punctuation:no_comma" in world.CONFLICTS["detectable_format:json_format"]
    assert "detectable_format:json_format" in world.CONFLICTS["punctuation:no_comma"]


def test_argument_level_contradictions_are_refused():
    forbid = ("keywords:forbidden_words", {"forbidden_words": ["Cat", "dog"]})
    assert not world.compatible(forbid, ("keywords:existence", {"keywords": ["cat", "sun"]}))
    assert world.compatible(forbid, ("keywords:existence", {"keywords": ["cow", "sun"]}))
    few_e = ("keywords:letter_frequency", {"letter": "e", "let_frequency": 3,
                                           "let_relation": "less than"})
    assert not world.compatible(("startend:end_checker", {"end_phrase": "Any other questions?"}),
                                few_e)
    sections = ("detectable_format:multiple_sections", {"section_spliter": "Section",
                                                        "num_sections": 2})
    assert not world.compatible(("change_case:english_lowercase", {}), sections)
    assert not world.compatible(("change_case:english_capital", {}), sections)
    assert not world.compatible(("combination:repeat_prompt", {"prompt_to_repeat": "Hi"}),
                                ("punctuation:no_comma", {}))


def test_repeat_prompt_goes_last_and_repeats_the_prompt_before_it():
    pool = ("combination:repeat_prompt", "keywords:existence")
    for i in range(40):
        t = world.draw_constraints("Say hi.", np.random.default_rng([1, i]), pool=pool)
        if t[-1]["check"] == "combination:repeat_prompt":
            break
    assert t[-1]["check"] == "combination:repeat_prompt"
    assert t[-1]["args"]["prompt_to_repeat"] == world.compose_prompt("Say hi.", t[:-1])


def test_compose_prompt_and_rank_by_gold_by_hand():
    t = [{"check": "punctuation:no_comma", "args": {}},
         {"check": "detectable_format:title", "args": {}}]
    want = ("Base?\n\n" + checks.render("punctuation:no_comma", {}) + "\n"
            + checks.render("detectable_format:title", {}))
    assert world.compose_prompt("Base?  ", t) == want
    assert world.rank_by_gold([0.5, 1.0, 0.5, 0.0]) == ([1, 0, 2, 3], True)
    assert world.rank_by_gold([0.0, 1 / 3, 1.0]) == ([2, 1, 0], False)


def _prompt_file(path, n, prefix="Question", extra=()):
    rows = [{"id": f"s/{i}", "source": "t:s", "prompt": f"{prefix} number {i}?"} for i in range(n)]
    rows += list(extra)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_make_checks_data_is_deterministic_disjoint_and_write_once(tmp_path):
    long_row = {"id": "s/long", "source": "t:s", "prompt": "x" * 500}
    dup_row = {"id": "s/dup", "source": "t:s", "prompt": "Question number 3?"}
    src = _prompt_file(tmp_path / "src.jsonl", 30, extra=[long_row, dup_row])
    kw = dict(seed=5, n_train=12, n_heldout=6, sources=[src], shared_dir=str(tmp_path))
    m = mcd.make(str(tmp_path / "a"), **kw)
    assert m["base_prompts"] == {"kept": 30, "too_long": 1, "duplicate": 1}
    mcd.make(str(tmp_path / "b"), **kw)
    for f in ("train.jsonl", "heldout.jsonl", "manifest.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    with pytest.raises(FileExistsError, match="--force"):
        mcd.make(str(tmp_path / "a"), **kw)
    mcd.make(str(tmp_path / "a"), **dict(kw, seed=6), force=True)
    assert (tmp_path / "a" / "train.jsonl").read_bytes() != \
        (tmp_path / "b" / "train.jsonl").read_bytes()
    train = data.load_jsonl(tmp_path / "b" / "train.jsonl")
    held = data.load_jsonl(tmp_path / "b" / "heldout.jsonl")
    assert len(train) == 12 and len(held) == 6
    bases = [r.meta["base_prompt"] for r in train + held]
    assert len(set(bases)) == 18  # disjoint by base prompt
    assert all(r.source == "checks_world:train" for r in train)
    for r in train + held:
        true = checks.true_checks_of(r.meta, r.id)
        assert 1 <= len(true) <= 3
        head = r.meta["base_prompt"] + world.PROMPT_SEP
        assert r.prompt.startswith(head)
        assert r.prompt[len(head):] == world.SENTENCE_SEP.join(
            checks.render(t["check"], t["args"]) for t in true)
    # A row's draw depends on its position and the seed only: a longer file keeps it.
    more = mcd.make(str(tmp_path / "c"), **dict(kw, n_train=13))
    assert more["train"] == 13
    assert (tmp_path / "c" / "train.jsonl").read_text().splitlines()[:12] == \
        (tmp_path / "b" / "train.jsonl").read_text().splitlines()[:12]
    with pytest.raises(ValueError, match="usable base prompts"):
        mcd.make(str(tmp_path / "d"), **dict(kw, n_train=40))


def test_no_ifeval_prompt_is_ever_used(tmp_path):
    os.makedirs(tmp_path / "data" / "ifeval")
    (tmp_path / "data" / "ifeval" / "input_data.jsonl").write_text(
        json.dumps({"key": 1, "prompt": "Question number 2?"}) + "\n", encoding="utf-8")
    src = _prompt_file(tmp_path / "src.jsonl", 8)
    m = mcd.make(str(tmp_path / "o"), seed=0, n_train=5, n_heldout=2, sources=[src],
                 shared_dir=str(tmp_path))
    assert m["base_prompts"] == {"kept": 7, "ifeval": 1}
    used = [r.meta["base_prompt"] for f in ("train", "heldout")
            for r in data.load_jsonl(tmp_path / "o" / f"{f}.jsonl")]
    assert "Question number 2?" not in used
    with pytest.raises(ValueError, match="IFEval's data"):
        mcd.make(str(tmp_path / "p"), n_train=1, n_heldout=1, shared_dir=str(tmp_path),
                 sources=["ifeval/input_data.jsonl"])


def test_real_files_never_hold_an_ifeval_prompt(shared_dir, tmp_path):
    """The default sources under ../shared: no IFEval prompt among the bases, every row's
    checks validate and render."""
    mcd.make(str(tmp_path), n_train=64, n_heldout=16, shared_dir=str(shared_dir))
    ifeval = mcd.ifeval_prompts(str(shared_dir))
    assert len(ifeval) == 541
    rows = data.load_jsonl(tmp_path / "train.jsonl") + data.load_jsonl(tmp_path / "heldout.jsonl")
    assert len(rows) == 80
    for r in rows:
        assert r.meta["base_prompt"].strip() not in ifeval
        assert len(r.meta["base_prompt"]) <= mcd.DEFAULT_MAX_BASE_CHARS
        assert r.prompt == world.compose_prompt(r.meta["base_prompt"], r.meta["checks"])
