"""Tests of the per-row metrics with bootstrap CIs (evaluation.aggregate), the verdict
variants of one verifier pass (evaluation.judges.rubric_samples, METHOD 12) and the seeded
row subset (evaluation.benchmark.load_rows); hand-computed numbers, no model."""
import json
import types

import numpy as np
import pytest

from drubric_jax import data
from drubric_jax.evaluator import verdicts
from drubric_jax.evaluation import aggregate, benchmark, intervals, judges


def _rows(golds):
    recs = [data.Record(id=f"r{i}", source="t:t", prompt=f"p{i}",
                        responses=[f"y{i}_{j}" for j in range(len(g))],
                        ranking=sorted(range(len(g)), key=lambda j: g[j]),
                        scores=[-float(x) for x in g], ties=len(set(g)) < len(g))
            for i, g in enumerate(golds)]
    return [benchmark.Row(r, 0) for r in recs]


def test_row_counts_and_statistics_by_hand():
    rows = _rows([[1, 2], [1, 2], [1, 2, 3]])
    # sample 0: row 0 right, row 1 tie, row 2 (3 pairs): a>b right, a>c right, b=c tie
    s0 = [[0.9, 0.1], [0.5, 0.5], [0.8, 0.3, 0.3]]
    # sample 1: row 0 wrong, row 1 right, row 2 all right
    s1 = [[0.1, 0.9], [0.6, 0.4], [0.9, 0.5, 0.1]]
    c0, c1 = aggregate.row_counts(rows, s0), aggregate.row_counts(rows, s1)
    assert c0["pairs"].tolist() == [1, 1, 3] and c0["ties"].tolist() == [0, 1, 1]
    assert c0["correct"].tolist() == [1, 0, 2] and c1["correct"].tolist() == [0, 1, 3]
    assert c0["top1"].tolist() == [1, 0, 1] and c1["top1"].tolist() == [0, 1, 1]
    stats = aggregate.statistics([c0, c1], np.ones((1, 3)))
    np.testing.assert_allclose(stats["strict_acc"], [[3 / 5, 4 / 5]], atol=1e-12)
    np.testing.assert_allclose(stats["tie_rate"], [[2 / 5, 0]], atol=1e-12)
    np.testing.assert_allclose(stats["acc_ties_excluded"], [[3 / 3, 4 / 5]], atol=1e-12)
    np.testing.assert_allclose(stats["top1"], [[2 / 3, 2 / 3]], atol=1e-12)
    # a replicate that draws row 0 twice and row 2 once: sample 0 -> (2 + 2) / (2 + 3)
    rep = aggregate.statistics([c0, c1], np.array([[2.0, 0, 1]]))
    np.testing.assert_allclose(rep["strict_acc"], [[4 / 5, 3 / 5]], atol=1e-12)
    entries, reps = aggregate.summarise([c0, c1], intervals.resample_weights(3, 300, 0))
    assert entries["strict_acc"]["mean"] == pytest.approx(0.7, abs=1e-12)
    assert entries["strict_acc"]["per_sample"] == pytest.approx([0.6, 0.8])
    assert entries["strict_acc"]["std"] == pytest.approx(np.std([0.6, 0.8], ddof=1))
    lo, hi = entries["strict_acc"]["ci95"]
    assert 0 <= lo <= 0.7 <= hi <= 1 and reps["strict_acc"].shape == (300,)


def test_all_tied_rows_have_no_top1_and_no_pairs():
    rows = _rows([[1, 1], [1, 2]])
    c = aggregate.row_counts(rows, [[0.2, 0.9], [0.5, 0.5]])
    assert c["pairs"].tolist() == [0, 1] and c["top1_valid"].tolist() == [0, 1]
    stats = aggregate.statistics([c], np.ones((1, 2)))
    assert stats["strict_acc"][0, 0] == 0 and np.isnan(stats["acc_ties_excluded"][0, 0])


def test_macro_mean_and_stratified_interval():
    reps = {"a": np.array([0.5, 0.6, 0.7]), "b": np.array([0.1, 0.2, 0.3]),
            "c": np.array([np.nan] * 3)}
    out = aggregate.macro(reps, {"a": 0.6, "b": 0.2, "c": float("nan")})
    assert out["mean"] == pytest.approx(0.4) and out["n_files"] == 2
    assert out["ci95"] == pytest.approx(intervals.percentile_interval([0.3, 0.4, 0.5]))


class _StubVerifier:
    """P(yes) from a table keyed by (response, item); counts calls (one pass expected)."""

    TABLE = {("A", "i1"): 0.7, ("A", "i2"): 0.2, ("B", "i1"): 0.4, ("B", "i2"): 0.6,
             (verdicts.NULL_RESPONSE, "i1"): 0.4, (verdicts.NULL_RESPONSE, "i2"): 0.5}

    def __init__(self):
        self.calls = 0

    def p_yes(self, params, prompts, responses, items, histories, stats=None):
        self.calls += 1
        out = np.zeros((len(responses), max(len(x) for x in items)), np.float32)
        for r, (y, lst) in enumerate(zip(responses, items)):
            for m, t in enumerate(lst):
                out[r, m] = self.TABLE[(y, t)]
        return out


def _lists(texts, weights):
    """A one-row, one-list stand-in of a RubricBatch."""
    m = len(texts)
    return types.SimpleNamespace(
        texts=[[texts]], weights=np.array([[weights]]), item_mask=np.ones((1, 1, m), bool),
        orders=np.array([[[0, 1]]]), list_valid=np.array([[True]]),
        finish_reasons=[["stop"]], raw_texts=[["{}"]], response_cut=np.zeros((1, 1, 2), bool))


def test_hard_soft_and_calibrated_from_one_verifier_pass():
    row = benchmark.Row(data.Record(id="x", source="t:t", prompt="p", responses=["A", "B"],
                                    ranking=[1, 0]), 0)
    ver = _StubVerifier()
    out = judges.rubric_samples(ver, None, [row], {"dynamic": _lists(["i1", "i2"], [1, 3])}, 1,
                                calibrate=True)
    assert ver.calls == 1
    sc = out[0]["dynamic"][0]["variant_scores"]
    # Eq. 12 with weights (1, 3): hard A (1, 0) -> 1/4, B (0, 1) -> 3/4
    np.testing.assert_allclose(sc["hard"], [0.25, 0.75], atol=1e-7)
    # soft A (0.7 + 3 * 0.2) / 4, B (0.4 + 3 * 0.6) / 4
    np.testing.assert_allclose(sc["soft"], [0.325, 0.55], atol=1e-6)
    cal = verdicts.contextual_calibration(np.array([[0.7, 0.2], [0.4, 0.6]]),
                                          np.array([[0.4, 0.5]]))
    # calibrated: A (0.778, 0.2), B (0.5, 0.6): hard A (1, 0), B (0, 1) as "0.5 is No"
    np.testing.assert_allclose(sc["soft_ctx"], (cal * [1, 3]).sum(1) / 4, atol=1e-6)
    np.testing.assert_allclose(sc["hard_ctx"], [0.25, 0.75], atol=1e-7)
    d = out[0]["dynamic"][0]
    assert d["verdicts"] == [[1, 0], [0, 1]] and np.allclose(d["p_yes_ctx"], cal, atol=1e-4)
    json.dumps(d["p_yes"])  # trace-ready
    plain = judges.rubric_samples(_StubVerifier(), None, [row],
                                  {"dynamic": _lists(["i1", "i2"], [1, 3])}, 1)
    assert set(plain[0]["dynamic"][0]["variant_scores"]) == {"hard", "soft"}


def test_random_row_subset_is_seeded_and_in_file_order(tmp_path):
    path = tmp_path / "d" / "f.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"id": f"r{i}", "source": "t:t", "prompt": "p",
                                        "responses": ["a", "b"], "ranking": [0, 1]}) + "\n"
                            for i in range(50)))
    ids = [r.rec.id for r in benchmark.load_rows(str(path), 6, 0, "random", seed=1)]
    assert ids == [r.rec.id for r in benchmark.load_rows(str(path), 6, 0, "random", seed=1)]
    assert ids != [r.rec.id for r in benchmark.load_rows(str(path), 6, 0, "random", seed=2)]
    assert len(set(ids)) == 6 and ids == sorted(ids, key=lambda s: int(s[1:]))
    assert ids != [f"r{i}" for i in range(6)]
    first = [r.rec.id for r in benchmark.load_rows(str(path), 6, 0, "first")]
    assert first == [f"r{i}" for i in range(6)]
