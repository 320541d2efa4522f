"""Co-evolved vs stale evaluator (issue 13, Figure 2): paired summaries by hand, the
frozen-generator rounds of the loop, and `experiments/coevolution.py` end to end on tiny
models."""
import json

import numpy as np
import pytest

from drubric_jax.evaluation import coevolution as co
from helpers import assert_percentile_ci, run_module


def test_paired_summary_against_the_exact_bootstrap():
    """Means by hand; CIs against the exact bootstrap distribution (every resample of the
    9 prompts, `helpers.assert_percentile_ci`). "b" is "a" minus a small amount per
    prompt, so the paired difference has a narrow distribution that two independent
    resamples would widen."""
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 0.2, 9)
    values = {"a": a, "b": a - rng.uniform(0.01, 0.03, 9)}
    n_boot = 20000
    s = co.paired_summary(values, [("a", "b")], n_boot=n_boot, seed=2)
    assert s["n"] == 9
    assert s["means"]["a"]["mean"] == pytest.approx(values["a"].mean())
    assert_percentile_ci(s["means"]["b"]["ci"], lambda w: w @ values["b"] / 9, 9, n_boot)
    d = s["differences"]["a - b"]
    diff = values["a"] - values["b"]
    assert d["diff"] == pytest.approx(diff.mean())
    assert_percentile_ci(d["ci"], lambda w: w @ diff / 9, 9, n_boot)
    assert d["ci"][0] > 0 and not d["zero_inside_ci"]
    with pytest.raises(ValueError, match="same prompts"):
        co.paired_summary({"a": [1.0], "b": [1.0, 2.0]}, [], 10, 0)
    with pytest.raises(ValueError, match="unknown entry"):
        co.paired_summary({"a": [1.0]}, [("a", "c")], 10, 0)


def test_markdown_tables_keep_their_columns_and_small_rdisc_digits(tmp_path):
    """Every table row has its header's column count (the "G1 | P1" keys are written
    "G1 on P1"), and R_disc near 1e-3 (soft verdicts at 135M) keeps 3 significant digits
    where a fixed 3 decimals would print 0.001 for all of them."""
    rng = np.random.default_rng(0)
    values = {"r_disc": {f"{g} | {p}": rng.uniform(0.0005, 0.002, 6)
                         for g in ("G1", "G2") for p in ("P1", "P2", "~P2")},
              "win_rate": {p: rng.uniform(0, 1, 6) for p in ("P0", "P1", "P2", "~P2")},
              "preference": {p: rng.uniform(0, 1, 6) for p in ("P0", "P1", "P2", "~P2")}}
    summary = {key: co.paired_summary(values[key], pairs, 100, 0)
               for key, pairs in co.COMPARISONS.items()}
    text = co.markdown(summary, "cmd", {"round0": 60.0}, "note")
    rows = [line for line in text.splitlines() if line.startswith("|")]
    width = None
    for line in rows:
        if line.startswith("|---"):
            continue
        n = line.count("|")
        if line.startswith("| generator") or line.startswith("| policy") or \
                line.startswith("| paired"):
            width = n
        assert n == width, line
    mean = summary["r_disc"]["means"]["G1 | P1"]["mean"]
    assert f"| G1 on P1 | {mean:.5f} [" in text
    co.plot(summary, str(tmp_path / "f.png"))
    assert (tmp_path / "f.png").stat().st_size > 0


@pytest.mark.slow
def test_coevolution_experiment_end_to_end_and_rerun(tmp_path, smollm2_gguf):
    """configs/coevolution.py:tiny through `python -m experiments.coevolution`: both arms
    branch from round 0's checkpoint, the stale arm trains no generator in round 1, every
    evaluation entry is there, and a second command changes nothing."""
    from drubric_jax.rounds.run_logging import read_metrics

    args = ("experiments.coevolution", "--config=configs/coevolution.py:tiny",
            f"--workdir={tmp_path}", "--config.log.progress=False")
    out = run_module(*args, timeout=900)
    assert "Co-evolved vs stale evaluator" in out, out
    rows = {arm: [(r["round"], r["phase"]) for r in read_metrics(
        str(tmp_path / arm / "metrics.jsonl")) if r["kind"] == "train"]
            for arm in ("round0", "coevolved", "stale")}
    assert rows["round0"] == [(0, "generator"), (0, "policy")]
    assert rows["coevolved"] == rows["round0"] + [(1, "generator"), (1, "policy")]
    assert rows["stale"] == rows["round0"] + [(1, "policy")]  # G_1 frozen in round 1
    values = json.loads((tmp_path / "eval.json").read_text())
    assert set(values["r_disc"]) == {f"{g} | {p}" for g in ("G1", "G2")
                                     for p in ("P1", "P2", "~P2")}
    assert set(values["win_rate"]) == {"P0", "P1", "P2", "~P2"}
    assert all(len(v) == 3 for v in values["win_rate"].values())
    s = json.loads((tmp_path / "summary.json").read_text())
    assert set(s["r_disc"]["differences"]) == {"G2 | P1 - G1 | P1", "G2 | P2 - G1 | P2",
                                               "G1 | ~P2 - G1 | P1"}
    before = (tmp_path / "eval.json").read_text()
    run_module(*args, timeout=300)
    assert (tmp_path / "eval.json").read_text() == before
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again["r_disc"] == s["r_disc"] and again["wall_s"] == s["wall_s"]
    # The wall time of every stage, kept as each ended (a killed command keeps them).
    assert set(json.loads((tmp_path / "wall_s.json").read_text())) == {
        "round0", "coevolved", "stale", "evaluation"}
    assert (tmp_path / "coevolution.png").stat().st_size > 0
    report = tmp_path / "results"
    run_module("experiments.report", str(tmp_path), f"--out={report}", timeout=300)
    assert (report / f"coevolution-{tmp_path.name}.md").read_text() == (
        tmp_path / "results.md").read_text()
    assert (report / f"coevolution-{tmp_path.name}.png").stat().st_size > 0


@pytest.mark.slow
def test_coevolution_in_the_checks_world_scores_gold_and_the_proxy_gap(tmp_path,
                                                                       smollm2_gguf):
    """configs/coevolution.py:tiny,world=checks,world_version=1 (the samples evaluation;
    world v2's rounds evaluation: tests/test_coevolution_rounds.py) on hand-written
    checks-world rows: the win
    rates give way to exact figures, each recomputed here from the evaluation's values:
    the gold score of every policy's greedy answers, and on each arm's samples the proxy
    (its generator's Eq. 12 score) minus the samples' gold."""
    from helpers import write_checks_world

    data = tmp_path / "world"
    data.mkdir()
    write_checks_world(str(data))
    work = tmp_path / "co"
    run_module("experiments.coevolution",
               f"--config=configs/coevolution.py:tiny,world=checks,world_version=1,"
               f"checks_dir={data}",
               f"--workdir={work}", "--config.log.progress=False",
               "--config.experiment.eval_prompts=1", "--config.generator.max_items=2",
               "--config.generator.max_new_tokens=96", "--config.data.heldout_anchor_rows=0",
               timeout=900)
    values = json.loads((work / "eval.json").read_text())
    assert "win_rate" not in values and len(values["ids"]) == 1
    assert values["ids"][0] in {f"cw/heldout/{i}" for i in range(3)}  # heldout.jsonl
    assert set(values["gold"]) == {"P0", "P1", "P2", "~P2"}
    assert all(0 <= v[0] <= 1 for v in values["gold"].values())
    assert set(values["gap"]) == {"G2 | P2", "G1 | ~P2"}
    for (g, p), gap in zip((("G2", "P2"), ("G1", "~P2")), (values["gap"][k] for k in
                                                            ("G2 | P2", "G1 | ~P2"))):
        want = values["proxy"][f"{g} | {p}"][0] - values["gold_samples"][p][0]
        assert gap[0] == pytest.approx(want, nan_ok=True)
    s = json.loads((work / "summary.json").read_text())
    assert set(s["gold"]["differences"]) == {"P2 - ~P2", "P2 - P1", "P1 - P0", "~P2 - P0"}
    text = (work / "results.md").read_text()
    assert "Gold score (METHOD 13)" in text and "1 rows of world/heldout.jsonl" in text
    assert text.startswith("# Co-evolved vs stale evaluator (Figure 2)\n\nShown")
    # Two runs (here the same run twice) also give the across-seeds table.
    import shutil

    shutil.copytree(work, tmp_path / "co_again")
    report = tmp_path / "report"
    run_module("experiments.report", str(work), str(tmp_path / "co_again"), f"--out={report}",
               timeout=300)
    seeds = (report / "coevolution-seeds.md").read_text()
    assert "2 runs; evaluation prompts the same in every run." in seeds
    assert "| co_again |" in seeds and "coevolution-seeds.md" in (report / "README.md").read_text()
