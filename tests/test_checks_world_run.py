"""A one-round run in the checks world (METHOD 13) on tiny random-weight models:
`configs/smollm2_cpu.py:tiny,world=checks` on hand-written checks-world rows (prompts with
meta.checks, anchor lists ranked by their gold score), with no verifier model loaded; the
metrics rows hold the gold and proxy scores, the constraint recovery and the item rates."""
import json
import os

import numpy as np
import pytest

from drubric_jax.rounds import loop
from helpers import tiny_config

pytestmark = pytest.mark.usefixtures("smollm2_gguf")

NO_COMMA = {"check": "punctuation:no_comma", "args": {}}
LOWER = {"check": "change_case:english_lowercase", "args": {}}
WORDS = {"check": "length_constraints:number_words",
         "args": {"num_words": 100, "relation": "less than"}}
TITLE = {"check": "detectable_format:title", "args": {}}
PROMPTS = [
    ("Describe a rainy day. Do not use any commas. Answer with less than 100 words.",
     [NO_COMMA, WORDS]),
    ("Write a short note to a friend. Your entire response should be in English, and in all "
     "lowercase letters.", [LOWER]),
    ("Explain what a river is. Your answer must contain a title, wrapped in double angular "
     "brackets, such as <<poem of joy>>.", [TITLE, NO_COMMA]),
]
# Four useful responses per anchor list: the anchor filter (data.filters, Appendix B) drops
# lists with fewer.
ANSWERS = ["<<rivers>> a river is water that flows to the sea", "Rain, rain and more rain.",
           "it was grey and wet all day", "Dear Sam, see you on Friday at the lake.",
           "A river carries fresh water downhill through its valley."]


def _write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def write_checks_world(directory) -> None:
    """train.jsonl, heldout.jsonl and anchors.jsonl in the layout the checks world's data
    scripts write (prompt rows with meta.checks; anchor lists ranked best first)."""
    rows = [{"id": f"cw/{i}", "source": "checks_world", "prompt": p, "meta": {"checks": t}}
            for i, (p, t) in enumerate(PROMPTS)]
    _write(os.path.join(directory, "train.jsonl"), rows)
    _write(os.path.join(directory, "heldout.jsonl"), rows[:1])
    from drubric_jax.checks import gold_score

    anchors = []
    for i, (p, t) in enumerate(PROMPTS):
        g = [gold_score(t, y) for y in ANSWERS]
        ranking = sorted(range(len(ANSWERS)), key=lambda j: -g[j])  # best first
        anchors.append({"id": f"cw/a{i}", "source": "checks_world", "prompt": p,
                        "responses": ANSWERS, "ranking": ranking, "meta": {"checks": t}})
    _write(os.path.join(directory, "anchors.jsonl"), anchors)


def checks_config(directory):
    """`helpers.tiny_config` in the checks world, one round, the generator sized for JSON
    checks (its prompt lists the 25 checks: ~1,400 tokens)."""
    c = tiny_config(extra=f"world=checks,checks_dir={directory}")
    c.rounds.num_rounds = 1
    c.generator.max_items = 2
    c.generator.max_item_chars = 24
    c.generator.max_new_tokens = 96
    c.generator.input_budget = 1536
    c.verifier.check_workers = 1
    return c


@pytest.mark.slow
def test_one_round_in_the_checks_world_logs_gold_proxy_and_constraint_recovery(tmp_path):
    data = tmp_path / "checks_world"
    data.mkdir()
    write_checks_world(str(data))
    c = checks_config(str(data))
    workdir = str(tmp_path / "run")
    run = loop.setup(c, workdir)
    try:
        assert run.ctx.roles.verifier is None  # no verifier model is loaded
        assert run.ctx.verifier.kind == "checks"
        assert set(run.ctx.true_checks) == {p for p, _ in PROMPTS}
    finally:
        loop.close(run)
    loop.run(c, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    train = {r["phase"]: r for r in rows if r["kind"] == "train"}
    assert set(train) == {"generator", "policy"}
    unit = ("gold_score", "gold_all_met_fraction", "constraint_precision", "constraint_recall",
            "constraint_f1", "constraint_f1_check_id", "invalid_item_rate",
            "duplicate_item_rate", "invalid_list_rate")
    for phase, row in train.items():
        for key in unit + (("proxy_score", "policy_reward") if phase == "policy" else ()):
            assert key in row, (phase, key)
            assert 0.0 <= row[key] <= 1.0, (phase, key, row[key])
        # Exact verdicts: the yes-rate of a valid list's items is a mean of 0/1 values.
        assert 0.0 <= row["yes_rate"] <= 1.0
    pol = train["policy"]
    assert pol["proxy_score"] == pytest.approx(pol["policy_reward"])
    # One prompt of 1 or 2 true checks, K = 2 samples: the mean g is a multiple of 1/4.
    assert (pol["gold_score"] * 4) % 1 == 0
    held = [r for r in rows if r["kind"] == "heldout"]
    assert held and all(np.isfinite(r["delta_gap"]) for r in held)
    trace = open(os.path.join(workdir, "trace", "round_0.html"), encoding="utf-8").read()
    assert '{"args"' not in trace  # items are shown as the checkers' sentences
