"""The generator-objective ablation (issue 13, Table 3): the paired bootstrap summary by
hand, and `experiments/ablation.py` end to end on tiny random-weight models."""
import json

import numpy as np
import pytest

from drubric_jax.rounds.settings import data_spec
from drubric_jax.evaluation import ablation, ablation_seeds
from helpers import (assert_ci_in_exact_band, assert_percentile_ci, run_module,
                     two_stage_resamples)


U = 8  # anchor lists: every bootstrap resample of 8 can be enumerated (6435 of them)
N_BOOT = 20000  # replicates: the percentile bounds land within ~2% (in probability) of exact


def _per_list(seed, u=U, g=2):
    rng = np.random.default_rng(seed)
    pairs = rng.integers(1, 7, u).astype(np.float64) * g
    correct = np.floor(pairs * rng.uniform(0, 1, u))
    return {"delta_gap": rng.normal(0.05, 0.1, u), "r_anchor": rng.normal(-2, 0.3, u),
            "pairs": pairs, "correct": correct, "ties": pairs - correct,
            "valid": np.full(u, float(g)), "ids": [f"a{i}" for i in range(u)],
            "num_lists": g}


def test_summary_means_and_cis_against_the_exact_bootstrap():
    """Means by hand; every CI against the exact bootstrap distribution of its statistic
    (`helpers.assert_percentile_ci`: all resamples of the U lists enumerated, not the
    library's resampler). "full" is "zero_shot" plus a small shift per list, so the paired
    difference has a narrow distribution that two independent resamples would widen."""
    per = {"zero_shot": _per_list(0), "disc_only": _per_list(2)}
    per["full"] = dict(per["zero_shot"], delta_gap=per["zero_shot"]["delta_gap"]
                       + np.random.default_rng(1).uniform(0.01, 0.03, U))
    s = ablation.summarize(per, "zero_shot", [("full", "disc_only")], n_boot=N_BOOT, seed=4)
    for name, p in per.items():
        g = s["generators"][name]
        assert g["delta_gap"]["mean"] == pytest.approx(p["delta_gap"].mean())
        assert g["strict_acc"]["mean"] == pytest.approx(p["correct"].sum() / p["pairs"].sum())
        assert g["tie_rate"] == pytest.approx(p["ties"].sum() / p["pairs"].sum())
        assert g["valid_rate"] == 1.0
        assert_percentile_ci(g["r_anchor"]["ci"], lambda w: w @ p["r_anchor"] / U, U, N_BOOT)
    # Paired: the mean difference on the same resample, not two independent intervals.
    d = per["full"]["delta_gap"] - per["zero_shot"]["delta_gap"]
    got = s["vs_baseline"]["full"]["delta_gap"]
    assert got["diff"] == pytest.approx(d.mean())
    assert_percentile_ci(got["ci"], lambda w: w @ d / U, U, N_BOOT)
    assert got["ci"][0] > 0 and not got["zero_inside_ci"]  # every list shifted up

    def acc_difference(w):
        a, b = per["full"], per["disc_only"]
        return (w @ a["correct"]) / (w @ a["pairs"]) - (w @ b["correct"]) / (w @ b["pairs"])

    assert_percentile_ci(s["comparisons"]["full - disc_only"]["strict_acc"]["ci"],
                         acc_difference, U, N_BOOT)
    assert set(s["vs_baseline"]) == {"full", "disc_only"}


def test_a_generator_against_itself_differs_by_exactly_zero():
    p = _per_list(3)
    s = ablation.summarize({"zero_shot": p, "full": dict(p)}, "zero_shot", [], 200, 0)
    for m in ablation.METRICS:
        d = s["vs_baseline"]["full"][m]
        assert d["diff"] == 0.0 and d["ci"] == [0.0, 0.0] and d["zero_inside_ci"]


def test_summary_refuses_generators_scored_on_other_lists():
    a, b = _per_list(0), _per_list(1)
    b["ids"] = list(reversed(b["ids"]))
    with pytest.raises(ValueError, match="other anchor lists"):
        ablation.summarize({"zero_shot": a, "full": b}, "zero_shot", [], 100, 0)
    with pytest.raises(ValueError, match="unknown generator"):
        ablation.summarize({"zero_shot": a}, "zero_shot", [("full", "zero_shot")], 100, 0)


def test_review_verdict_says_yes_only_when_every_ci_is_above_zero():
    def summary(lo1, lo2):
        return {"comparisons": {
            "full - disc_only": {"delta_gap": {"diff": lo1 + 0.1, "ci": [lo1, lo1 + 0.2]}},
            "full - anchor_only": {"delta_gap": {"diff": lo2 + 0.1, "ci": [lo2, lo2 + 0.2]}}}}

    assert ablation.review_verdict(summary(0.01, 0.02)).split("? ")[1].startswith("yes")
    text = ablation.review_verdict(summary(0.01, -0.1))
    assert "? no" in text and "0 inside the CI" in text and "above 0" in text


@pytest.mark.slow
def test_ablation_experiment_end_to_end_and_rerun(tmp_path, smollm2_gguf):
    """configs/ablation.py:tiny through `python -m experiments.ablation`: three variants
    from the same start see the same first rollout; every generator is scored on the
    held-out lists (none of them trained on); a second command changes nothing."""
    from configs import ablation as cfg_lib
    from drubric_jax import data
    from drubric_jax.rounds.run_logging import read_metrics

    args = ("experiments.ablation", "--config=configs/ablation.py:tiny",
            f"--workdir={tmp_path}", "--config.log.progress=False")
    out = run_module(*args, timeout=900)
    assert "Does full raise held-out Delta_gap more than the ablations?" in out, out
    s = json.loads((tmp_path / "summary.json").read_text())
    assert set(s["generators"]) == {"zero_shot", "full", "disc_only", "anchor_only"}
    assert set(s["comparisons"]) == {"full - disc_only", "full - anchor_only"}
    c = cfg_lib.get_config("tiny")
    loaded = data.load_data(data_spec(c))
    assert s["heldout_ids"] == [a.id for a in loaded.heldout_anchors]
    assert s["n_lists"] == c.data.heldout_anchor_rows
    assert not {a.id for a in loaded.train_anchors} & set(s["heldout_ids"])
    # Same start, same anchor batch and policy samples: step 0's rewards agree across
    # variants (only the advantage weights differ).
    first = {v: [r for r in read_metrics(str(tmp_path / v / "metrics.jsonl"))
                 if r["kind"] == "train"] for v in ("full", "disc_only", "anchor_only")}
    assert all(len(rows) == c.rounds.generator_steps for rows in first.values()), first
    for key in ("r_disc", "r_anchor", "yes_rate", "parse_valid_rate"):
        assert len({rows[0][key] for rows in first.values()}) == 1, key
    assert (tmp_path / "ablation.png").exists() and (tmp_path / "results.md").exists()
    # experiments.report recomputes the same table from the run directory's files.
    out = tmp_path / "results"
    run_module("experiments.report", str(tmp_path), f"--out={out}", timeout=300)
    assert (out / f"ablation-{tmp_path.name}.md").read_text() == (
        tmp_path / "results.md").read_text()
    assert "ablation" in (out / "README.md").read_text()
    before = {n: (tmp_path / n / "heldout.json").read_text() for n in s["generators"]}
    run_module(*args, timeout=300)
    assert {n: (tmp_path / n / "heldout.json").read_text() for n in s["generators"]} == before
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again["generators"] == s["generators"] and again["wall_s"] == s["wall_s"]


def test_heldout_note_names_where_the_heldout_lists_come_from():
    """The results header says the held-out lists' source: a split of the training anchor
    rows, or files of their own (`data.heldout_anchor_paths`, recorded in summary.json)."""
    split = ablation.heldout_note({"n_lists": 16, "seed": 2})
    assert split == ("the first 16 anchor lists of the seeded shuffle (seed 2) of the anchor "
                     "rows, never trained on; ids in summary.json")
    own = ablation.heldout_note({"n_lists": 16, "seed": 0, "heldout_paths": [
        "/data/checks_world_v2/heldout_anchors.jsonl"]})
    assert own == ("the first 16 anchor lists of the seeded shuffle (seed 0) of "
                   "heldout_anchors.jsonl (lists of prompts that never train); ids in "
                   "summary.json")


def test_runs_pool_by_list_id_with_the_two_stage_bootstrap_and_the_across_seeds_table():
    """Two runs (seeds) of 4 held-out lists each, 2 lists drawn by both: the pooled paired
    difference is the mean over runs of each run's mean, its CI the exact two-stage
    bootstrap (runs drawn, then the 6 distinct list ids once for both runs:
    `helpers.two_stage_resamples`); strict accuracy is a ratio of run-weighted sums. The
    table gives each run's difference, their mean and sd (ddof 1) and the pooled figure,
    named by its bootstrap. A generator one run lacks is left out."""
    runs = {}
    for r, shift, ids in (("seed0", 0.02, ["a0", "a1", "a2", "a3"]),
                          ("seed1", -0.01, ["a2", "a3", "a4", "a5"])):
        z = _per_list(10 + len(runs), u=4)
        z["ids"] = ids  # each run draws its lists from the same anchor rows
        runs[r] = {"zero_shot": z, "full": dict(z, delta_gap=z["delta_gap"] + shift
                                                + np.linspace(0, 0.01, 4))}
    runs["seed1"]["disc_only"] = _per_list(9, u=4)  # only one run scored it
    s = ablation_seeds.pooled_summary(runs, "zero_shot", [], n_boot=8000, seed=4)
    assert set(s["generators"]) == {"zero_shot", "full"} and s["n_runs"] == 2
    assert s["n_lists"] == 8 and s["n_distinct_lists"] == 6
    assert s["interval"] == "two-stage bootstrap: seeds, then lists"
    got = s["vs_baseline"]["full"]["delta_gap"]
    assert got["diff"] == pytest.approx((0.02 - 0.01) / 2 + 0.005)
    ids = runs["seed0"]["full"]["ids"] + runs["seed1"]["full"]["ids"]
    w, prob = two_stage_resamples([4, 4], ids)
    d = np.concatenate([runs[r]["full"]["delta_gap"] - runs[r]["zero_shot"]["delta_gap"]
                        for r in runs])
    assert_ci_in_exact_band(got["ci"], w @ d, prob, 8000)
    assert got["minimal_detectable"] == pytest.approx(2.8016 * got["se"], rel=1e-4)
    correct = np.concatenate([runs[r]["full"]["correct"] for r in runs])
    pairs = np.concatenate([runs[r]["full"]["pairs"] for r in runs])
    acc = s["generators"]["full"]["strict_acc"]
    assert acc["mean"] == pytest.approx((correct[:4].sum() / 8 + correct[4:].sum() / 8)
                                        / (pairs[:4].sum() / 8 + pairs[4:].sum() / 8))
    assert_ci_in_exact_band(acc["ci"], (w @ correct) / (w @ pairs), prob, 8000)
    summaries = {r: {**ablation.summarize({g: v[g] for g in ("zero_shot", "full")},
                                          "zero_shot", [], 200, 0), "seed": i}
                 for i, (r, v) in enumerate(runs.items())}
    text = ablation_seeds.across_seeds(summaries, s)
    assert "pooled: 8 held-out anchor lists of the runs (6 distinct list ids)" in text
    assert "| pooled [95% CI, two-stage bootstrap: seeds, then lists] |" in text
    row = next(line for line in text.splitlines()
               if line.startswith("| full - zero_shot | Delta_gap |"))
    per_run = [summaries[r]["vs_baseline"]["full"]["delta_gap"]["diff"] for r in runs]
    assert per_run == pytest.approx([0.025, -0.005])
    assert f"| {np.mean(per_run):+.3f} ({np.std(per_run, ddof=1):.3f}) |" in row
    cell = f"{got['diff']:+.3f} [{got['ci'][0]:+.3f}, {got['ci'][1]:+.3f}]"
    if got["zero_inside_ci"]:  # beside a null, the smallest detectable difference
        cell += f"; detectable >= {got['minimal_detectable']:.3f}"
    assert row.endswith(f"| {cell} |")
    with pytest.raises(ValueError, match="two or more runs"):
        ablation_seeds.pooled_summary({"seed0": runs["seed0"]}, "zero_shot", [], 10, 0)
    with pytest.raises(ValueError, match="num_lists"):
        ablation_seeds.pooled_summary(
            {"a": runs["seed0"], "b": {g: dict(v, num_lists=3)
                                       for g, v in runs["seed1"].items()}}, "zero_shot", [],
            10, 0)
    with pytest.raises(ValueError, match="other anchor lists"):
        ablation_seeds.pooled_summary(
            {"a": runs["seed0"], "b": dict(runs["seed1"], full=dict(
                runs["seed1"]["full"], ids=["x"] * 4))}, "zero_shot", [], 10, 0)
    with pytest.raises(ValueError, match="unknown generator"):
        ablation_seeds.pooled_summary(runs, "zero_shot", [("full", "disc_only")], 10, 0)
