"""Tests of the verifier check (drubric_jax/evaluation/verifier_check.py), the AUC and the
bootstrap helpers it uses, and the one-pass raw + calibrated P(yes) (evaluation.judges)."""
import re

import numpy as np
import pytest

from drubric_jax import data
from drubric_jax.evaluator import verifier as ver_lib
from drubric_jax.data import sources
from drubric_jax.evaluation import intervals, judges, metrics
from drubric_jax.evaluation import verifier_check as vc

PROSE = [
    "The quick answer is that plants need light, water and air to grow. Most of them also "
    "need soil that holds nutrients, and a steady temperature helps as well. Without light "
    "the leaves turn pale and the plant slowly weakens.",
    "Here are three tips for better sleep:\n\n1. Keep a regular schedule every day.\n"
    "2. Avoid screens for an hour before bed.\n3. Keep the bedroom cool, dark and quiet so "
    "that the body can rest and the mind can settle down for the night.",
    "A budget is a plan for your money. You write down what comes in and what goes out, "
    "then decide in advance how much to spend on rent, food, transport and savings. "
    "Checking it every month shows where the money really went.",
]


def test_auc_hand_numbers():
    s, y = [0.9, 0.8, 0.4, 0.3], [True, False, True, False]
    # positive-negative pairs: 0.9>0.8, 0.9>0.3, 0.4<0.8, 0.4>0.3 -> 3 of 4
    assert metrics.auc(s, y) == pytest.approx(0.75, abs=1e-12)
    assert metrics.auc([0.5, 0.5, 0.5], [True, False, False]) == 0.5  # ties count half
    assert metrics.auc([0.5, 0.5, 0.2], [True, False, False]) == 0.75
    assert metrics.auc([1, 2], [False, True]) == 1.0 and metrics.auc([2, 1], [False, True]) == 0
    # weights (bootstrap counts): positive 0.9 twice -> (2*2 + 1*1) / (3*2)
    w = np.array([[2.0, 1, 1, 1], [1, 1, 1, 1], [0, 1, 0, 1]])
    got = metrics.auc(s, y, w)
    assert got[0] == pytest.approx(5 / 6, abs=1e-12) and got[1] == pytest.approx(0.75)
    assert np.isnan(got[2])  # no positive drawn


def test_resample_weights_and_percentile_interval():
    w = intervals.resample_weights(7, 50, seed=3)
    assert w.shape == (50, 7) and (w.sum(1) == 7).all() and (w >= 0).all()
    np.testing.assert_array_equal(w, intervals.resample_weights(7, 50, seed=3))
    assert not np.array_equal(w, intervals.resample_weights(7, 50, seed=4))
    lo, hi = intervals.percentile_interval(np.arange(101.0))
    assert lo == pytest.approx(2.5, abs=1e-9) and hi == pytest.approx(97.5, abs=1e-9)
    assert intervals.percentile_interval([np.nan, 1.0, 1.0]) == [1.0, 1.0]
    with pytest.raises(ValueError):
        intervals.resample_weights(0, 5, 0)


def _truth_from_text(item, text):
    """The item's truth recomputed independently of build_items' bookkeeping."""
    neg = item.negated
    if item.family == "language":
        says_english = "English" in item.text
        return says_english != neg  # every checked response is English
    if item.family == "word":
        word = re.search(r'"(.+)"', item.text).group(1)
        present = re.search(rf"\b{word}\b", text) is not None
        if not present:
            assert word.lower() not in text.lower()  # absent: not even a substring
        return present != neg
    if item.family == "length":
        bound = int(re.search(r"(\d+) words", item.text).group(1))
        n = len(text.split())
        assert bound >= 2 * n or bound <= n / 2  # a factor-2 margin either way
        return (n > bound) if neg else (n <= bound)
    has_list = len(re.findall(r"(?m)^\s*(\d+[.)]|[-*+])\s+\S", text)) >= 2
    return has_list != neg


def test_items_true_and_false_by_construction():
    items = vc.build_items(PROSE, seed=0)
    assert len(items) == 14 * len(PROSE)
    for it in items:
        assert it.truth == _truth_from_text(it, PROSE[it.response]), it
    for r in range(len(PROSE)):
        for fam in vc.FAMILIES:
            truths = [it.truth for it in items if it.response == r and it.family == fam]
            assert truths.count(True) == truths.count(False) > 0
    assert [it.text for it in items] == [it.text for it in vc.build_items(PROSE, seed=0)]
    # the list family follows the text: PROSE[1] has a list, the others none
    lists = {it.response: it.truth for it in items if it.family == "list" and not it.negated}
    assert lists == {0: False, 1: True, 2: False}


def test_usable_rejects_ambiguous_responses():
    assert all(vc.usable(y) for y in PROSE)
    french = ("La réponse est simple : les plantes ont besoin de lumière et d'eau pour "
              "pousser, et la plupart ont aussi besoin d'un sol riche. " * 2)
    assert not vc.usable(french)
    assert not vc.usable("Too short to bound.")
    assert not vc.usable(PROSE[0] + "\n```python\nprint(1)\n```")
    assert not vc.usable(PROSE[0] + "\n- one bullet only")  # a list of one is ambiguous
    assert not vc.usable(" ".join([PROSE[0]] * 5))         # over MAX_WORDS
    with pytest.raises(ValueError, match="not usable"):
        vc.build_items([PROSE[0], "Too short."], 0)


def test_demo_responses_are_a_fallback():
    pairs = vc.select_responses(data.load_jsonl(sources.demo_anchor_path()), 100, seed=0)
    assert len(pairs) >= 8 and len({y for _, y in pairs}) == len(pairs)
    assert vc.select_responses(data.load_jsonl(sources.demo_anchor_path()), 3, 0) == pairs[:3]


@pytest.fixture(scope="module")
def tiny_verifier(tiny_model, smollm2_tokenizer):
    cfg, params = tiny_model
    return ver_lib.Verifier(cfg, smollm2_tokenizer, 256, 64), params


def test_raw_and_calibrated_from_one_pass_match_the_verifier(tiny_verifier):
    ver, params = tiny_verifier
    prompts = ["Say something.", "Say something.", "Another request."]
    items = [["It is short.", "It is kind."]] * 2 + [["It is long."]]
    hist = [[], [], []]
    stats = {}
    raw, cal = judges.p_yes_raw_and_contextual(ver, params, prompts, PROSE, items, hist,
                                               [0, 0, 1], True, stats)
    assert stats["prefixes"] == 3 + 2  # one content-free row per group
    # Same numbers as the verifier's own paths; 1e-5 is the project's prefix-vs-naive
    # agreement (other chunk shapes may sum in another order).
    np.testing.assert_allclose(raw, ver.p_yes(params, prompts, PROSE, items), atol=1e-5)
    np.testing.assert_allclose(
        cal, ver.p_yes(params, prompts, PROSE, items, calibration="contextual"), atol=1e-5)
    assert cal[2, 1] == 0.0 and raw[2, 1] == 0.0  # padding
    none_raw, none_cal = judges.p_yes_raw_and_contextual(ver, params, prompts, PROSE, items,
                                                         hist, [0, 0, 1], False)
    assert none_cal is None
    np.testing.assert_allclose(none_raw, raw, atol=1e-5)
    with pytest.raises(ValueError, match="group"):
        judges.p_yes_raw_and_contextual(ver, params, prompts, PROSE, items, hist,
                                        [0, 0, 0], True)


def test_check_end_to_end_on_tiny_model(tiny_verifier):
    ver, params = tiny_verifier
    pairs = [("Give advice.", y) for y in PROSE]
    items = vc.build_items(PROSE, seed=1)
    p, p_cal = vc.ask(ver, params, pairs, items)
    assert p.shape == p_cal.shape == (len(items),)
    assert ((p > 0) & (p < 1)).all() and ((p_cal > 0) & (p_cal < 1)).all()
    # items are mapped back to their (response, item) cell
    raw = ver.p_yes(params, "Give advice.", PROSE,
                    [[it.text for it in items if it.response == r] for r in range(3)])
    np.testing.assert_allclose(p[-14:], raw[2], atol=1e-5)
    s = vc.summarise(items, p, p_cal, n_boot=50, seed=0)
    g = s["groups"]
    assert set(g) == set(vc.FAMILIES) | {"affirmative", "negated", "overall"}
    assert g["overall"]["n_items"] == len(items) and s["n_responses"] == 3
    assert g["overall"]["auc"] == pytest.approx(metrics.auc(p, [it.truth for it in items]))
    lo, hi = s["auc_ci95"]
    assert 0 <= lo <= hi <= 1
    line = vc.verdict_line(s)
    assert line.startswith("criterion following: AUC") and "\n" not in line
    assert "language" in vc.format_table(s)
    # a pair whose prompt pushes the prefix past the budget is skipped, the rest kept
    assert vc.fitting(ver, [("long " * 300, PROSE[0])] + pairs, 2) == pairs[:2]
    with pytest.raises(ValueError, match="cut"):  # a budget that cuts the response raises
        vc.ask(ver_lib.Verifier(ver.cfg, ver.tokenizer, 128, 64), params, pairs[:1],
               items[:2])


def test_verdict_line_reads_the_interval():
    def summary(auc, ci):
        return {"n_responses": 10, "n_templates": 10, "auc_ci95": ci, "groups": {
            "overall": {"auc": auc, "n_items": 140, "acc_hard": 0.5, "yes_rate": 0.0,
                        "acc_hard_ctx": 0.55},
            "affirmative": {"auc": 0.6}, "negated": {"auc": 0.45}}}

    line = vc.verdict_line(summary(0.53, [0.47, 0.6]))
    assert "indistinguishable from chance" in line and "negated 0.45" in line
    assert "but weak" in vc.verdict_line(summary(0.53, [0.51, 0.56]))
    assert line.count("above chance") == 0
    assert vc.verdict_line(summary(0.7, [0.62, 0.8])).endswith(
        "above chance; hard verdicts 0.50 accurate at yes-rate 0.00, 0.55 with contextual "
        "calibration")
    assert "BELOW chance" in vc.verdict_line(summary(0.4, [0.3, 0.45]))


def test_crossed_bootstrap_is_wider_than_response_bootstrap():
    """Every response gets the same templates; a template-driven AUC must not look sure."""
    items = vc.build_items(PROSE, seed=0)
    # P(yes) set by the template alone (affirmative true items high), same on every response
    p = np.array([0.6 if (it.truth and not it.negated) else 0.4 for it in items])
    s = vc.summarise(items, p, p, n_boot=400, seed=0)
    lo, hi = s["auc_ci95"]
    assert s["n_templates"] == 10 and lo < s["groups"]["overall"]["auc"] < hi
    assert hi - lo > 0.1  # resampling responses alone would give a zero-width interval
