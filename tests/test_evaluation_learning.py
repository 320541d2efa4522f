"""Rule rewards of plain GRPO and the learning-curve summary (last minus first steps with
a bootstrap CI over prompt groups), by hand."""
import json

import numpy as np
import pytest

from drubric_jax.rounds.settings import data_spec
from drubric_jax.rl import rule_rewards
from drubric_jax.evaluation import learning
from drubric_jax.rounds.run_logging import MetricsWriter


def test_word_limit_reward_values():
    r = rule_rewards.word_limit_reward(3)
    assert r(None, "") == 0.0 and r(None, "   \n") == 0.0  # stopping at once earns nothing
    assert r(None, "Paris.") == 1.0 and r(None, "one two  three") == 1.0
    assert r(None, "a b c d e f") == pytest.approx(0.5)  # graded above N: 3 / 6
    with pytest.raises(ValueError, match="max_words"):
        rule_rewards.word_limit_reward(0)


def test_exact_match_reward_and_make_rule():
    class Item:
        reference = " Paris "

    assert rule_rewards.exact_match_reward(Item(), "paris") == 1.0
    assert rule_rewards.exact_match_reward(Item(), "Paris, France") == 0.0
    assert rule_rewards.exact_match_reward(object(), "") == 0.0  # no reference: 0
    options = rule_rewards.RuleOptions(max_words=2)
    assert rule_rewards.make_rule("word_limit", options)(None, "a b c d") == 0.5
    with pytest.raises(ValueError, match="config.policy.reward='rubric'"):
        rule_rewards.make_rule("rubric", options)


_TRUE_CHECKS = [{"check": "punctuation:no_comma", "args": {}},
                {"check": "change_case:english_lowercase", "args": {}},
                {"check": "keywords:existence", "args": {"keywords": ["cat", "dog"]}}]


def test_checks_gold_reward_by_hand_and_its_missing_field_errors(write_jsonl):
    from configs.base import base_config
    from drubric_jax import checks, data

    item = data.PromptItem(id="w/1", source="t:w", prompt="x", meta={"checks": _TRUE_CHECKS})
    assert checks.GOLD_REWARD == "checks_gold" in rule_rewards.reward_names()  # a config value
    rule = rule_rewards.make_rule("checks_gold")
    assert rule(item, "a cat and a dog") == 1.0  # no comma, lowercase, both keywords
    assert rule(item, "A cat, a dog") == pytest.approx(1 / 3)  # keywords only
    assert rule(item, "a cat, no other pet") == pytest.approx(1 / 3)  # lowercase only
    assert rule(item, "Hello, World") == 0.0
    assert rule(item, "   ") == 0.0  # strict: an all-whitespace answer meets nothing
    bare = data.PromptItem(id="w/2", source="t:w", prompt="x")
    with pytest.raises(ValueError, match=r"^prompt row 'w/2' \(t:w\): field 'meta.checks' is "
                                         r"missing"):
        rule(bare, "a cat and a dog")
    bad = data.PromptItem(id="w/3", source="t:w", prompt="x",
                          meta={"checks": [{"check": "punctuation:no_comma", "args": {"n": 1}}]})
    with pytest.raises(ValueError, match=r"row 'w/3'.*field 'meta.checks' entry 0: .*'n'"):
        rule(bad, "a cat")
    # Under checks_gold the data check, before any weights load, names file, line, row, field.
    prompts = write_jsonl([{"id": "p/0", "source": "t:p", "prompt": "Q?",
                            "meta": {"checks": _TRUE_CHECKS}},
                           {"id": "p/1", "source": "t:p", "prompt": "R?"}], name="p.jsonl")
    c = base_config()
    c.data.name, c.data.prompt_paths = "custom", (str(prompts),)
    c.data.anchor_paths = ()
    assert data.check_data_sources(data_spec(c)) == {str(prompts): 2}  # rubric reward: meta not read
    c.policy.reward = "checks_gold"
    with pytest.raises(ValueError, match=r"prompt_paths\[0\]: .*p\.jsonl:2: row 'p/1' .*field "
                                         r"'meta.checks' is missing"):
        data.check_data_sources(data_spec(c))


def test_first_last_difference_by_hand():
    groups = [[0.0, 0.2], [0.1], [0.5, 0.5], [0.6, 1.0]]
    out = learning.first_last_difference(groups, first=2, last=2, n_boot=2000, seed=3)
    assert out["first_mean"] == pytest.approx(0.1) and out["last_mean"] == pytest.approx(0.65)
    assert out["difference"] == pytest.approx(0.55)
    lo, hi = out["ci"]
    # Resampled means stay inside [min, max] of each window: the difference inside
    # [0.5 - 0.2, 1.0 - 0.0]; the point estimate sits inside its interval.
    assert 0.3 - 1e-12 <= lo <= 0.55 <= hi <= 1.0 + 1e-12
    assert not out["zero_inside_ci"] and (out["first_groups"], out["last_groups"]) == (3, 4)
    assert learning.first_last_difference(groups, 2, 2, 2000, 3) == out  # seeded
    flat = learning.first_last_difference([[0.5, 0.5]] * 4, 2, 2, 100, 0)
    assert flat["difference"] == 0.0 and flat["ci"] == [0.0, 0.0] and flat["zero_inside_ci"]
    with pytest.raises(ValueError, match="first \\+ last"):
        learning.first_last_difference(groups, 3, 2)
    with pytest.raises(ValueError, match="no scorable"):
        learning.first_last_difference([[], [1.0]], 1, 1)


def test_policy_curve_reads_policy_rows_and_drops_nan_groups(tmp_path):
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    w.write(1, {"kind": "train", "phase": "generator", "round": 0, "step": 0,
                "global_step": 1, "r_disc": 0.1})
    for s, groups in enumerate([[0.25, float("nan")], [0.5, 0.75]]):
        w.write(2 + s, {"kind": "train", "phase": "policy", "round": 0, "step": s,
                        "global_step": 2 + s, "policy_reward": float(np.nanmean(groups)),
                        "group_mean_rewards": np.asarray(groups)})
    w.close()
    steps, rewards, groups = learning.policy_curve(str(tmp_path / "metrics.jsonl"))
    assert steps.tolist() == [2, 3] and rewards.tolist() == [0.25, 0.625]
    assert groups == [[0.25], [0.5, 0.75]]
    summary = learning.summarize_parts({"rule": str(tmp_path)}, 1, 1, 100, 0)
    table = learning.markdown_table(summary, "t", "cmd", {"rule": 90.0})
    assert "| rule | 2 | 0.250 | 0.625 | +0.375" in table and "1.5 min" in table
    json.dumps(summary)  # what summary.json holds
    learning.plot_curves(summary, str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").stat().st_size > 0
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="no policy training rows"):
        learning.policy_curve(str(tmp_path / "empty" / "metrics.jsonl"))
