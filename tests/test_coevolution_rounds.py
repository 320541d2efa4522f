"""Co-evolved vs stale over R rounds from the runs' own logs (issue 41, Q3;
`evaluation.coevolution_rounds`): the values read back by hand from written metrics, the
unpaired bootstrap against its normal limit, the config checks, and
`experiments/coevolution.py` in the rounds evaluation end to end on tiny models."""
import json
import math
import os

import numpy as np
import pytest

from drubric_jax.evaluation import coevolution_rounds as cr
from helpers import run_module

NAN = float("nan")


def _write(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _gold(rnd, step, values):
    # As the metrics writer stores them: nan as the string "nan".
    vals = ["nan" if isinstance(v, float) and math.isnan(v) else v for v in values]
    return {"kind": "heldout_gold", "round": rnd, "phase": "policy", "step": step,
            "global_step": 10 * rnd + step, "heldout_gold_rows": len(values),
            "heldout_gold_greedy_values": vals, "heldout_gold_sampled_values": vals[::-1]}


def _train(rnd, step, proxy, gold, phase="policy"):
    return {"kind": "train", "round": rnd, "phase": phase, "step": step,
            "global_step": 10 * rnd + step, "group_proxy": proxy, "group_gold": gold}


def _world(tmp_path):
    """Metrics of a 3-round run: round0/ (P0 before, P1 after), and the arms' copies of it
    continued for rounds 1 and 2, the co-evolved one with a row repeated by a resume."""
    round0 = [_gold(0, 0, [0.0, 1.0, 0.5, NAN]), _train(0, 1, [0.2], [0.1], "generator"),
              _train(0, 1, [0.5, 0.25], [0.25, 0.25]), _train(0, 2, [1.0, 0.0], [0.5, 0.0]),
              _gold(0, 2, [0.5, 1.0, 0.5, NAN])]
    coevolved = round0 + [
        _train(1, 1, [0.75, 0.5], [0.5, 0.5]), _train(1, 2, [1.0, 1.0], [1.0, 0.0]),
        _gold(1, 2, [0.0, 0.0, 0.0, 0.0]),
        _gold(1, 2, [1.0, 1.0, 0.5, 0.0]),  # the resumed run's row replaces the first
        _train(2, 1, [0.5, 0.5], [0.5, 0.5]), _train(2, 2, [0.5, 0.5], [0.5, 0.5]),
        _gold(2, 2, [1.0, 1.0, 1.0, 0.0])]
    stale = round0 + [
        _train(1, 1, [1.0, 1.0], [0.0, 0.5]), _train(1, 2, [1.0, 1.0], [0.5, 0.5]),
        _gold(1, 2, [0.5, 1.0, 0.5, 1.0]),
        _train(2, 1, [1.0, 0.5], [0.0, 0.0]), _train(2, 2, [1.0, 1.0], [0.5, 0.0]),
        _gold(2, 2, [0.5, 0.5, 0.5, 1.0])]
    for stage, rows in (("round0", round0), ("coevolved", coevolved), ("stale", stale)):
        _write(str(tmp_path / stage / "metrics.jsonl"), rows)
    return str(tmp_path)


def test_round_values_read_each_rounds_gold_point_and_training_gap(tmp_path):
    """Every policy state's per-prompt held-out gold, the last row of a (round, step)
    winning; each round's training gap, proxy minus gold per prompt in step order (the
    generator's rows left out); the paired gold differences over the prompts every state
    scored (the nan prompt dropped) and the unpaired gap differences, by hand."""
    v = cr.round_values(_world(tmp_path))
    assert v["rounds"] == 3 and v["heldout_rows"] == 4
    g = v["gold_greedy"]
    assert sorted(g) == ["P0", "P1", "P2", "P3", "~P2", "~P3"]
    assert g["P2"] == [1.0, 1.0, 0.5, 0.0] and g["~P3"] == [0.5, 0.5, 0.5, 1.0]
    assert math.isnan(g["P0"][3]) and v["gold_sampled"]["P2"] == [0.0, 0.5, 1.0, 1.0]
    gap = v["train_gap"]
    assert gap["round0"] == [0.25, 0.0, 0.5, 0.0]
    assert gap["coevolved 1"] == [0.25, 0.0, 0.0, 1.0] and gap["stale 1"] == [1.0, 0.5, 0.5, 0.5]
    assert gap["coevolved 2"] == [0.0] * 4 and gap["stale 2"] == [1.0, 0.5, 0.5, 1.0]

    s = cr.summarize(v, n_boot=2000, seed=0)
    d = s["gold_greedy"]["differences"]
    assert set(d) == {"P2 - ~P2", "P3 - ~P3", "P1 - P0", "P3 - P0", "~P3 - P0"}
    assert s["gold_greedy"]["n"] == 3  # the prompt P0 could not score is dropped everywhere
    assert d["P3 - ~P3"]["diff"] == pytest.approx(((1 + 1 + 1) - (0.5 * 3)) / 3)
    assert d["P2 - ~P2"]["diff"] == pytest.approx((2.5 - 2.0) / 3)
    t = s["train_gap"]["differences"]["stale 2 - coevolved 2"]
    assert t["diff"] == pytest.approx(0.75) and t["n"] == [4, 4]
    assert s["train_gap"]["means"]["round0"]["mean"] == pytest.approx(0.1875)
    heads = cr.headlines(s)
    assert list(heads) == ["held-out gold (greedy): P3 - ~P3",
                           "training proxy - gold: stale 2 - coevolved 2"]
    text = cr.markdown(s, "cmd", {"round0": 60.0}, "note")
    assert text.startswith("# Co-evolved vs stale evaluator over 3 rounds (Figure 2)\n\nShown")
    table = [line for line in text.splitlines() if line.startswith("| 2 (P3, ~P3)")]
    assert len(table) == 1 and table[0].count("|") == 8
    cr.plot(s, str(tmp_path / "f.png"))
    assert (tmp_path / "f.png").stat().st_size > 0
    spread = cr.across_seeds({"a": {**s, "seed": 0}, "b": {**s, "seed": 1}})
    assert "Across 2 runs: mean +0.500, sd 0.000" in spread
    with pytest.raises(ValueError, match="different round counts"):
        cr.across_seeds({"a": s, "b": {**s, "rounds": 2}})


def test_headlines_pool_over_runs_by_the_two_stage_bootstrap(tmp_path):
    """Two runs: the held-out gold headline pooled over them paired per prompt, a prompt
    of the same held-out file drawn once for both runs (exact two-stage distribution); the
    training gap pooled unpaired (`intervals.two_stage_unpaired`, the same seeds for both
    arms); both named, with the smallest detectable difference beside a CI holding 0."""
    from drubric_jax.evaluation import intervals
    from helpers import assert_ci_in_exact_band, two_stage_resamples

    a = cr.round_values(_world(tmp_path / "a"))
    b = cr.round_values(_world(tmp_path / "b"))
    b["gold_greedy"]["P3"] = [0.0, 1.0, 0.0, 0.5]   # run b: P3 - ~P3 = -0.5, +0.5, -0.5
    for run in ("a", "b"):
        os.makedirs(tmp_path / run / "round0", exist_ok=True)
        (tmp_path / run / "round0" / "config.json").write_text(json.dumps(
            {"rounds": {"heldout_gold_path": "/data/checks_world_v2/heldout.jsonl"}}))
    ids = {n: cr.heldout_ids(str(tmp_path / n), 4) for n in ("a", "b")}
    assert ids["a"] == [f"checks_world_v2/heldout.jsonl:{i}" for i in range(4)]
    assert cr.heldout_ids(str(tmp_path / "none"), 4) is None
    pooled = cr.pooled_headlines({"a": a, "b": b}, 4000, 3, ids)
    gold = pooled["held-out gold (greedy): P3 - ~P3"]
    # Run a: P3 - ~P3 = +0.5 on each of its 3 scored prompts; run b: -0.5, +0.5, -0.5.
    assert gold["diff"] == pytest.approx((0.5 - 1 / 6) / 2)
    assert gold["interval"] == "two-stage bootstrap: seeds, then prompts"
    w, prob = two_stage_resamples([3, 3], ids["a"][:3] * 2)
    assert_ci_in_exact_band(gold["ci"], w @ np.array([0.5] * 3 + [-0.5, 0.5, -0.5]), prob,
                            4000)
    gap = pooled["training proxy - gold: stale 2 - coevolved 2"]
    same = intervals.two_stage_unpaired([a["train_gap"]["stale 2"], b["train_gap"]["stale 2"]],
                                        [a["train_gap"]["coevolved 2"],
                                         b["train_gap"]["coevolved 2"]], 4000, 3)
    assert gap["diff"] == pytest.approx(0.75) and gap["ci"] == same["ci"]
    s = cr.summarize(a, 200, 0)
    text = cr.across_seeds({"a": {**s, "seed": 0}, "b": {**cr.summarize(b, 200, 0), "seed": 1}},
                           pooled)
    line = next(ln for ln in text.splitlines() if ln.startswith("Pooled over 2 runs"))
    assert line.startswith("Pooled over 2 runs (two-stage bootstrap: seeds, then prompts; "
                           f"METHOD 15): {gold['diff']:+.3f} [{gold['ci'][0]:+.3f}, "
                           f"{gold['ci'][1]:+.3f}]")
    assert gold["zero_inside_ci"] and (
        f"the smallest difference this design detects (80% power, two-sided 5%) is "
        f"{gold['minimal_detectable']:.3f}.") in line
    with pytest.raises(ValueError, match="two or more runs"):
        cr.pooled_headlines({"a": a}, 10, 0)


def test_round_values_name_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="round0"):
        cr.round_values(str(tmp_path))
    work = _world(tmp_path)
    path = os.path.join(work, "round0", "metrics.jsonl")
    del_row = {k: v for k, v in _gold(0, 0, [1.0]).items() if k != "heldout_gold_greedy_values"}
    _write(path, [del_row])
    with pytest.raises(ValueError, match="per-prompt values"):
        cr.round_values(work)
    _write(path, [_gold(0, 0, [1.0])])
    with pytest.raises(ValueError, match="before and after round 0"):
        cr.round_values(work)


def test_unpaired_difference_meets_its_normal_limit():
    """Two independent samples of 400: the bootstrap replicates of the difference of means
    are near normal with sd sqrt(var_a / n_a + var_b / n_b) (population variances: the
    bootstrap's). The percentile CI's ends are then diff -/+ 1.96 sd, up to the Monte
    Carlo error of a 2.5% quantile of 20,000 replicates (about 0.02 sd) and the skew of a
    mean of 400 uniforms (smaller): a tolerance of 0.06 sd."""
    rng = np.random.default_rng(3)
    a, b = rng.uniform(0, 1, 400), rng.uniform(0.1, 1.1, 400) ** 2
    d = cr.unpaired_difference(a, b, n_boot=20000, seed=5)
    sd = math.sqrt(a.var() / a.size + b.var() / b.size)
    assert d["diff"] == pytest.approx(a.mean() - b.mean())
    assert d["ci"][0] == pytest.approx(d["diff"] - 1.959964 * sd, abs=0.06 * sd)
    assert d["ci"][1] == pytest.approx(d["diff"] + 1.959964 * sd, abs=0.06 * sd)
    empty = cr.unpaired_difference([NAN], b, 10, 0)
    assert math.isnan(empty["diff"]) and empty["n"] == [0, 400]


def test_coevolution_config_picks_and_checks_its_evaluation():
    """World v2's checks config evaluates by rounds (R = 3, a gold point before round 0 and
    after each round); world v1 keeps the samples evaluation at R = 2; a config the
    evaluation cannot run is refused, naming the field."""
    from configs.coevolution import get_config
    from experiments.coevolution import check_evaluation

    c = get_config("world=checks")
    assert check_evaluation(c) == "rounds" and c.rounds.num_rounds == 3
    assert c.rounds.heldout_gold_rows == 64 and c.rounds.heldout_gold_path.endswith(
        "heldout.jsonl") and c.rounds.heldout_gold_split == "heldout"
    assert c.data.prompt_paths[0].endswith("policy.jsonl")
    assert c.data.anchor_paths[0].endswith("gen_rl_anchors.jsonl")
    assert c.policy.train.learning_rate == 3e-4 and c.generator.train.learning_rate == 1e-4
    old = get_config("world=checks,world_version=1")
    assert check_evaluation(old) == "samples" and old.rounds.num_rounds == 2
    old.rounds.num_rounds = 3
    with pytest.raises(ValueError, match="num_rounds must be 2"):
        check_evaluation(old)
    c.rounds.heldout_gold_every = 0
    with pytest.raises(ValueError, match="heldout_gold_every"):
        check_evaluation(c)
    llm = get_config("tiny")
    llm.experiment.evaluation = "rounds"
    with pytest.raises(ValueError, match="checks world"):
        check_evaluation(llm)
    llm.experiment.evaluation = "later"
    with pytest.raises(ValueError, match="experiment.evaluation"):
        check_evaluation(llm)


@pytest.mark.slow
def test_coevolution_rounds_end_to_end_rerun_and_report(tmp_path, smollm2_gguf):
    """configs/coevolution.py:tiny,world=checks (world v2: the rounds evaluation, 3 rounds)
    on hand-written checks-world rows: every policy state has its held-out gold point, the
    summary is `round_values` of the stages' logs, a rerun trains nothing and writes the
    same table, and the report regenerates it."""
    from helpers import write_checks_world

    data = tmp_path / "world"
    data.mkdir()
    write_checks_world(str(data))
    work = tmp_path / "co"
    args = ("experiments.coevolution",
            f"--config=configs/coevolution.py:tiny,world=checks,checks_dir={data}",
            f"--workdir={work}", "--config.log.progress=False",
            "--config.generator.max_items=2", "--config.generator.max_new_tokens=96",
            "--config.data.heldout_anchor_rows=0")
    run_module(*args, timeout=900)
    s = json.loads((work / "summary.json").read_text())
    # The curve is Q3's reported result: the heldout split's first 2 rows (tiny config).
    assert s["mode"] == "rounds" and s["rounds"] == 3 and s["heldout_rows"] == 2
    assert set(s["gold_greedy"]["means"]) == {"P0", "P1", "P2", "P3", "~P2", "~P3"}
    fresh = cr.summarize(cr.round_values(str(work)), s["n_bootstrap"], s["seed"])
    assert fresh["gold_greedy"] == s["gold_greedy"]
    # 1 policy step of 2 prompts a round: each round's gap has 2 training prompts an arm.
    assert [m["n"] for m in fresh["train_gap"]["means"].values()] == [2, 2, 2, 2, 2]
    text = (work / "results.md").read_text()
    walls = json.loads((work / "wall_s.json").read_text())
    assert set(walls) == {"round0", "coevolved", "stale"}
    run_module(*args, timeout=600)
    assert json.loads((work / "wall_s.json").read_text()) == walls  # nothing ran again
    report = tmp_path / "report"
    run_module("experiments.report", str(work), f"--out={report}", timeout=300)
    assert (report / f"coevolution-{work.name}.md").read_text() == text


def test_report_pools_rounds_runs_across_seeds(tmp_path):
    """experiments.report's coevolution-seeds.md of two rounds-mode runs (their stages'
    metrics, the held-out file named in round0/config.json): each run's headlines and
    their values pooled by the two-stage bootstrap, named."""
    from experiments.report import _coevolution_across_seeds

    dirs = []
    for seed in (0, 1):
        d = tmp_path / f"seed{seed}"
        _world(d)
        (d / "round0" / "config.json").write_text(json.dumps(
            {"rounds": {"heldout_gold_path": "/w/checks_world_v2/heldout.jsonl"}}))
        (d / "summary.json").write_text(json.dumps(
            {"kind": "coevolution", "mode": "rounds", "seed": seed, "n_bootstrap": 200,
             "command": "python -m experiments.coevolution ...", "eval_note": "4 rows"}))
        dirs.append(str(d))
    text = _coevolution_across_seeds(dirs)
    assert "## held-out gold (greedy): P3 - ~P3" in text and "| seed1 | 1 |" in text
    values = {f"seed{k}": cr.round_values(dirs[k]) for k in (0, 1)}
    ids = {n: cr.heldout_ids(d, 4) for n, d in zip(values, dirs)}
    pooled = cr.pooled_headlines(values, 200, 0, ids)
    for name, d in pooled.items():
        assert (f"Pooled over 2 runs (two-stage bootstrap: seeds, then prompts; METHOD 15): "
                f"{d['diff']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]") in text
