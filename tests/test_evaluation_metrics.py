"""Tests for drubric_jax.evaluation.metrics: strict accuracy, strict top-1, nDCG, RM-Bench
(METHOD 7, 11)."""

import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from drubric_jax import data
from drubric_jax.rl import rewards
from drubric_jax.evaluation import metrics
from tolerances import close

PROPERTY = settings(max_examples=30, deadline=None)
# Jitted once for the fixed property-test shapes (one compile, fast examples).
NDCG, TOP1, PAIRWISE = (jax.jit(f) for f in (metrics.ndcg, metrics.strict_top1,
                                             metrics.pairwise_accuracy))
D2, D3 = 1 / math.log2(3), 1 / math.log2(4)  # discounts at ranks 2 and 3


def test_metrics_take_data_gold_ranks():
    strict = data.Record(id="a", source="s", prompt="p", responses=list("abc"),
                         ranking=[2, 0, 1])
    assert data.gold_ranks(strict) == [2, 3, 1]
    # RM-Bench style: scores define the tie blocks.
    tied = data.Record(id="b", source="s", prompt="p", responses=list("abcdef"),
                       ranking=[3, 2, 4, 5, 1, 0], scores=[0, 0, 1, 1, 1, 0], ties=True)
    gold = np.array(data.gold_ranks(tied))
    assert gold.tolist() == [4, 4, 1, 1, 1, 4]
    # Only the order of gold ranks matters: 1-based ranks score as 0-based ones.
    s = np.array([0.1, 0.7, 0.7, 0.2, 0.9, 0.3], np.float32)
    for a, b in zip(jax.tree.leaves((metrics.pairwise_accuracy(s, gold), metrics.ndcg(s, gold),
                                     metrics.strict_top1(s, gold))),
                    jax.tree.leaves((metrics.pairwise_accuracy(s, gold - 1),
                                     metrics.ndcg(s, gold - 1), metrics.strict_top1(s, gold - 1)))):
        close(a, b, 0)


def test_case_18_strict_pairwise_and_top1(load_case):
    case = load_case("case-18")
    pairs = [[0.8, 0.5], [0.6, 0.6], [0.4, 0.7], [0.9, 0.2]]
    top_scores = [[0.8, 0.8, 0.3], [0.9, 0.5, 0.1], [0.2, 0.6, 0.6]]
    gold_best = [0, 0, 1]
    want = {"strict_ties_wrong": 0.5, "strict_ties_excluded": 0.666667, "n_ties": 1}
    want_top1 = 0.333333
    if case is not None:
        pairs = case["input"]["pairwise"]["pairs"]
        top_scores = case["input"]["top1"]["scores"]
        gold_best = case["input"]["top1"]["gold_best_index"]
        want, want_top1 = case["expected"]["pairwise"], case["expected"]["top1"]["strict_top1"]
    p = np.array(pairs, np.float32)  # (preferred, other) per pair
    acc = metrics.pairwise_accuracy(p, np.tile([0, 1], (len(p), 1)))
    close(acc["strict"], want["strict_ties_wrong"], 1e-6)
    close(acc["ties_excluded"], want["strict_ties_excluded"], 1e-6)
    assert int(acc["n_ties"]) == want["n_ties"] and int(acc["n_pairs"]) == 4
    close(acc["tie_rate"], 0.25)
    s = np.array(top_scores, np.float32)
    gold = np.where(np.arange(s.shape[1])[None] == np.array(gold_best)[:, None], 0, 1)
    top1 = metrics.strict_top1(s, gold)
    assert np.asarray(top1).tolist() == [False, True, False]
    close(np.mean(np.asarray(top1)), want_top1, 1e-6)
    # The same tie rule holds for nDCG: list 1 ties gold-best with a worse item.
    score, _ = metrics.ndcg(s[0], gold[0])
    assert float(score) < 1.0


def test_pairwise_accuracy_lists_skip_gold_ties():
    acc = metrics.pairwise_accuracy(np.array([0.9, 0.5, 0.5]), np.array([0, 1, 2]))
    close([acc["strict"], acc["ties_excluded"], acc["tie_rate"]], [2 / 3, 1.0, 1 / 3])
    # Gold ranks [0, 0, 1]: the (0, 1) pair is skipped, whatever the scores.
    acc = metrics.pairwise_accuracy(np.array([0.1, 0.9, 0.5]), np.array([0, 0, 1]))
    assert int(acc["n_pairs"]) == 2
    close(acc["strict"], 0.5)
    # Pairs tied in gold (e.g. PandaLM) are skipped.
    acc = metrics.pairwise_accuracy(np.array([[0.3, 0.3], [0.9, 0.1]]),
                                    np.array([[0, 0], [0, 1]]))
    assert int(acc["n_pairs"]) == 1 and float(acc["strict"]) == 1.0
    # Masked padding and no pairs at all: zeros, not NaN.
    acc = metrics.pairwise_accuracy(np.array([0.2, np.nan]), np.array([0, 1]),
                                    np.array([1, 0], bool))
    assert all(float(v) == 0.0 for v in acc.values())


def test_strict_top1_gold_tied_best_and_padding():
    gold = np.array([0, 0, 1])
    assert bool(metrics.strict_top1(np.array([0.2, 0.9, 0.5]), gold))  # any gold-best
    assert not bool(metrics.strict_top1(np.array([0.9, 0.9, 0.5]), gold))  # tied top
    assert not bool(metrics.strict_top1(np.array([0.2, 0.4, 0.5]), gold))
    # A padded entry with a higher garbage score is ignored.
    assert bool(metrics.strict_top1(np.array([0.7, 0.1, 5.0]), np.array([0, 1, 2]),
                                    np.array([1, 1, 0], bool)))
    assert not bool(metrics.strict_top1(np.zeros(3), np.arange(3), np.zeros(3, bool)))


def test_ndcg_hand_computed():
    gold = np.array([0, 1, 2])  # linear gains [2, 1, 0]
    idcg = 2 + D2
    assert float(metrics.ndcg(np.array([0.9, 0.5, 0.1]), gold)[0]) == pytest.approx(1.0)
    close(metrics.ndcg(np.array([0.1, 0.5, 0.9]), gold)[0], (D2 + 2 * D3) / idcg)
    # All tied: every item gets the mean discount of ranks 1..3.
    close(metrics.ndcg(np.full(3, 0.5), gold)[0], 3 * (1 + D2 + D3) / 3 / idcg)
    # Gold-best on top, the other two tied.
    close(metrics.ndcg(np.array([1.0, 0.2, 0.2]), gold)[0], (2 + 1 * (D2 + D3) / 2) / idcg)


def test_ndcg_gold_ties_gains_and_validity():
    # Gold [0, 0, 1]: mid-rank linear gains [1.5, 1.5, 0].
    score, valid = metrics.ndcg(np.array([0.2, 0.9, 0.5]), np.array([0, 0, 1]))
    close(score, (1.5 + 1.5 * D3) / (1.5 + 1.5 * D2))
    assert bool(valid)
    # Explicit gold gains (scores).
    score, _ = metrics.ndcg(np.array([0.1, 0.9]), np.array([0, 1]), gold_gains=np.array([3.0, 1.0]))
    close(score, (1 + 3 * D2) / (3 + 1 * D2))
    # No distinct gold levels: undefined, flagged.
    score, valid = metrics.ndcg(np.array([0.1, 0.9]), np.array([0, 0]))
    assert float(score) == 0.0 and not bool(valid)
    # Padding entries change nothing.
    padded, _ = metrics.ndcg(np.array([0.1, 0.5, 7.0, 0.9]), np.array([0, 1, 0, 2]),
                             np.array([1, 1, 0, 1], bool))
    close(padded, metrics.ndcg(np.array([0.1, 0.5, 0.9]), np.array([0, 1, 2]))[0])


def test_delta_gap_reexported():
    assert metrics.delta_gap is rewards.delta_gap
    gap, n = metrics.delta_gap(np.array([0.9, 0.5, 0.1]), np.array([0, 1, 2]))
    close(gap, 1.6 / 3)
    assert int(n) == 3


def test_rm_bench_pairs_and_accuracy():
    labels = ["rejected", "rejected", "chosen", "chosen", "chosen", "rejected"]
    styles = ["detailed_markdown", "detailed_plain", "detailed_plain", "concise",
              "detailed_markdown", "concise"]
    pairs = metrics.rm_bench_pairs(labels, styles)
    assert len(pairs) == 9
    kinds = {(p.chosen, p.rejected): p.difficulty for p in pairs}
    assert kinds[(3, 0)] == "hard" and kinds[(3, 5)] == "normal" and kinds[(4, 5)] == "easy"
    assert sorted(p.difficulty for p in pairs).count("hard") == 3
    assert [p.difficulty for p in pairs].count("normal") == 3
    # A judge that only likes markdown: wins easy and ties/loses the rest.
    scores = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    acc = metrics.rm_bench_accuracy([scores], [labels], [styles])
    assert acc["n_all"] == 9 and acc["n_hard"] == acc["n_normal"] == acc["n_easy"] == 3
    # chosen 2 (plain): loses to 0, ties 1 and 5; chosen 3 (concise): the same;
    # chosen 4 (markdown): ties 0, beats 1 and 5.
    assert acc["hard"] == 0.0 and acc["easy"] == pytest.approx(2 / 3)
    assert acc["normal"] == 0.0 and acc["all"] == pytest.approx(2 / 9)
    assert acc["ties_all"] == 5
    with pytest.raises(ValueError):
        metrics.rm_bench_pairs(["chosen"], ["fancy"])


def test_rm_bench_shared_rows_have_three_pairs_per_difficulty(shared_file):
    path = shared_file("data", "rm_bench", "chat.jsonl")
    for rec in data.load_jsonl(path)[:20]:
        pairs = metrics.rm_bench_pairs(rec.meta["label"], rec.meta["style"])
        assert [p.difficulty for p in pairs].count("hard") == 3
        assert len(pairs) == 9
        gold = data.gold_ranks(rec)
        for p in pairs:
            assert gold[p.chosen] < gold[p.rejected]


# --- properties ------------------------------------------------------------------------------

K = 6  # responses per list
tied_scores = hnp.arrays(np.float32, (K,), elements=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
gold_levels = hnp.arrays(np.int32, (K,), elements=st.integers(0, 3))


@PROPERTY
@given(tied_scores, gold_levels, hnp.arrays(bool, (K,)), st.randoms(use_true_random=False))
def test_metrics_invariant_to_input_order(s, gold, mask, rnd):
    perm = np.array(rnd.sample(range(K), K))
    score, valid = NDCG(s, gold, mask)
    score_p, valid_p = NDCG(s[perm], gold[perm], mask[perm])
    assert 0.0 <= float(score) <= 1.0 + 1e-6
    close(score_p, score, 1e-6)
    assert bool(valid) == bool(valid_p)
    assert bool(TOP1(s, gold, mask)) == bool(
        TOP1(s[perm], gold[perm], mask[perm]))
    acc = PAIRWISE(s, gold, mask)
    acc_p = PAIRWISE(s[perm], gold[perm], mask[perm])
    for key in acc:
        close(acc_p[key], acc[key], 1e-6)
    assert float(acc["strict"]) <= float(acc["ties_excluded"]) + 1e-6


@PROPERTY
@given(gold_levels, hnp.arrays(bool, (K,)))
def test_ndcg_of_gold_order_is_one(gold, mask):
    score, valid = NDCG(-gold.astype(np.float32), gold, mask)
    if bool(valid):
        close(score, 1.0, 1e-6)
