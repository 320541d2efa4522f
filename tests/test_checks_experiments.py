"""The checks-world experiments of issue 32: the policy-reward experiment
(`experiments.checks_policy`, `evaluation.checks_policy`), the ablation's constraint
recovery (`evaluation.ablation.constraint_per_anchor`), anchor rows' meta, and their
report."""
import dataclasses
import json
import os

import numpy as np
import pytest

from drubric_jax.data import fingerprint
from drubric_jax.data.schema import AnchorList, anchor_from_record, record_from_dict
from drubric_jax.evaluation import ablation
from drubric_jax.evaluation import checks_policy as cp
from drubric_jax.evaluation import checks_policy_report as cpr
from drubric_jax.evaluation.intervals import resample_weights
from drubric_jax.evaluator.check_rubrics import item_text
from helpers import (assert_ci_in_exact_band, assert_percentile_ci, run_module,
                     two_stage_resamples, write_checks_policy_workdir,
                     write_checks_world)

NO_COMMA = {"check": "punctuation:no_comma", "args": {}}
LOWER = {"check": "change_case:english_lowercase", "args": {}}
WORDS_100 = {"check": "length_constraints:number_words",
             "args": {"num_words": 100, "relation": "less than"}}
WORDS_50 = {"check": "length_constraints:number_words",
            "args": {"num_words": 50, "relation": "less than"}}


def _text(t):
    return item_text(t["check"], t["args"])


def test_constraint_per_anchor_by_hand():
    # Anchor 0, T = {no_comma, words < 100}: list 0 has no_comma and words < 50 (one hit of
    # two items: P = R = 1/2, F1 = 1/2; ids alone both hit: F1 = 1); list 1 is invalid
    # (no kept item: 0, 0, 0). Anchor 1, T = {lowercase}: list 0 = {lowercase} (all 1),
    # list 1 = {lowercase, no_comma} (P = 1/2, R = 1, F1 = 2/3).
    texts = [[[_text(NO_COMMA), _text(WORDS_50)], ["", ""]],
             [[_text(LOWER), ""], [_text(LOWER), _text(NO_COMMA)]]]
    mask = np.array([[[True, True], [False, False]], [[True, False], [True, True]]])
    out = ablation.constraint_per_anchor(texts, mask, [[NO_COMMA, WORDS_100], [LOWER]])
    np.testing.assert_allclose(out["constraint_precision"], [0.25, 0.75])
    np.testing.assert_allclose(out["constraint_recall"], [0.25, 1.0])
    np.testing.assert_allclose(out["constraint_f1"], [0.25, (1 + 2 / 3) / 2])
    np.testing.assert_allclose(out["constraint_f1_check_id"], [0.5, (1 + 2 / 3) / 2])
    with pytest.raises(ValueError, match="anchor list 1"):
        ablation.constraint_per_anchor(texts, mask, [[NO_COMMA], []])


def _per_list(rng, u, with_checks):
    out = {"delta_gap": rng.uniform(-1, 1, u), "r_anchor": rng.uniform(-1, 0, u),
           "pairs": np.full(u, 6.0), "correct": rng.integers(0, 7, u).astype(float),
           "ties": np.zeros(u), "valid": np.full(u, 2.0), "ids": [f"a{i}" for i in range(u)],
           "num_lists": 2}
    if with_checks:
        out["constraint_f1"] = rng.uniform(0, 1, u)
        out["constraint_f1_check_id"] = rng.uniform(0, 1, u)
    return out


def test_ablation_summary_reports_constraint_f1_only_when_every_generator_has_it():
    rng = np.random.default_rng(0)
    per = {"zero_shot": _per_list(rng, 7, True), "full": _per_list(rng, 7, True)}
    s = ablation.summarize(per, "zero_shot", [], 200, 0)
    assert s["metrics"] == list(ablation.METRICS + ablation.CHECK_METRICS)
    d = s["vs_baseline"]["full"]["constraint_f1"]
    assert d["diff"] == pytest.approx(per["full"]["constraint_f1"].mean()
                                      - per["zero_shot"]["constraint_f1"].mean())
    # Paired: the CI is the percentile interval of the replicate-wise differences.
    x = per["full"]["constraint_f1"] - per["zero_shot"]["constraint_f1"]
    assert_percentile_ci(d["ci"], lambda w: w @ x / 7, 7, 200)
    table = ablation.markdown_table(s, "cmd", {}, "note")
    assert "constraint F1 [95% CI]" in table and "constraint F1 (ids)" in table
    del per["full"]["constraint_f1"]
    s = ablation.summarize(per, "zero_shot", [], 200, 0)
    assert s["metrics"] == list(ablation.METRICS)
    assert "constraint F1" not in ablation.markdown_table(s, "cmd", {}, "note")


def test_anchor_rows_keep_meta_and_hash_as_before():
    row = {"id": "r", "source": "s", "prompt": "p", "responses": ["a", "b"],
           "ranking": [1, 0], "meta": {"checks": [NO_COMMA]}}
    a = anchor_from_record(record_from_dict(row, "f.jsonl:1"))
    assert a.meta == {"checks": [NO_COMMA]} and a.responses == ["b", "a"]
    bare = dataclasses.replace(a, meta={})
    # The hash of a meta-less row is that of the row before AnchorList had meta.
    fields = {k: v for k, v in dataclasses.asdict(bare).items() if k != "meta"}
    old = json.dumps(fields, sort_keys=True, ensure_ascii=False,
                     separators=(",", ":")).encode("utf-8")
    # Anchor meta trains nothing: rows hash as before AnchorList had meta (runs resume).
    assert fingerprint._row_bytes(bare) == fingerprint._row_bytes(a) == old
    assert isinstance(a, AnchorList)


def test_paired_difference_and_seed_spread_by_hand():
    after, before = [1.0, 0.5, 0.0, float("nan")], [0.5, 0.5, 0.5, 1.0]
    d = cp.paired_difference(after, before, 200, 0)
    # The nan prompt is dropped from both: means over 3 prompts.
    assert d["prompts"] == 3 and d["after"] == pytest.approx(0.5)
    assert d["before"] == pytest.approx(0.5) and d["difference"] == pytest.approx(0.0)
    assert_percentile_ci(d["ci"], lambda w: w @ np.array([0.5, 0.0, -0.5]) / 3, 3, 200)
    with pytest.raises(ValueError, match="length"):
        cp.paired_difference([1.0], [1.0, 0.0], 10, 0)
    s = cp.seed_spread([0.1, 0.3, float("nan"), 0.2])
    assert s["seeds"] == 3 and s["mean"] == pytest.approx(0.2)
    assert s["sd"] == pytest.approx(0.1) and (s["min"], s["max"]) == (0.1, 0.3)
    assert np.isnan(cp.seed_spread([0.4])["sd"])


def test_arm_versus_arm_per_seed_and_pooled_by_hand():
    after = {("gold", 0): [1.0, 0.5, 1.0], ("gold", 1): [0.0, 1.0, 0.5],
             ("rubric", 0): [0.5, 0.5, 0.0], ("rubric", 1): [1.0, 1.0, 1.0],
             ("rubric", 2): [0.0, 0.0, 0.0]}
    out = cp.arm_versus_arm(after, "rubric", "gold", [0, 1, 2], 2000, 0)
    assert set(out) == {"0", "1", "pooled"}  # seed 2 has no gold run
    assert out["0"]["difference"] == pytest.approx(-0.5)  # (-0.5 + 0 - 1) / 3
    # Seed means of the differences: -0.5 and +0.5; pooled: their mean.
    p = out["pooled"]
    assert p["difference"] == pytest.approx(0.0) and p["seeds"] == 2
    assert p["interval"] == "two-stage bootstrap: seeds, then prompts"
    # Without prompt ids the seeds' prompts are drawn apart (METHOD 15's two stages).
    d = np.array([-0.5, 0.0, -1.0, 1.0, 0.0, 0.5])
    w, prob = two_stage_resamples([3, 3])
    assert_ci_in_exact_band(p["ci"], w @ d, prob, 2000)
    # With the ids (the same prompts in both seeds) a prompt is drawn once for both.
    p = cp.arm_versus_arm(after, "rubric", "gold", [0, 1], 2000, 0, ids=["a", "b", "c"])
    w, prob = two_stage_resamples([3, 3], ["a", "b", "c"] * 2)
    assert_ci_in_exact_band(p["pooled"]["ci"], w @ d, prob, 2000)
    assert p["pooled"]["minimal_detectable"] == pytest.approx(2.8016 * p["pooled"]["se"],
                                                              rel=1e-4)
    assert "pooled" not in cp.arm_versus_arm(after, "rubric", "gold", [0, 2], 200, 0)


def test_pooled_over_seeds_pairs_each_seed_with_p0_by_prompt_id():
    p0 = {"gold": [0.0, 0.5, 1.0], "gold_sampled": [0.0, 0.0, 1.0], "ids": ["a", "b", "c"]}
    after = {("gold", 0): [1.0, 0.5, 1.0], ("gold", 1): [0.0, 1.0, 0.5]}
    sampled = {("gold", 0): [0.5, 0.0, 1.0], ("gold", 1): [0.5, 1.0, 1.0]}
    per_seed = {"0": {}, "1": {}}
    out = cp.pooled_over_seeds("gold", per_seed, after, sampled, p0, 2000, 0)
    # Differences: seed 0 [1, 0, 0] (mean 1/3), seed 1 [0, 0.5, -0.5] (mean 0).
    pooled = out["pooled"]
    assert pooled["difference"] == pytest.approx(1 / 6) and pooled["seeds"] == 2
    assert pooled["after"] == pytest.approx((2.5 / 3 + 1.5 / 3) / 2)
    assert pooled["before"] == pytest.approx(0.5) and pooled["prompts"] == 3
    w, prob = two_stage_resamples([3, 3], ["a", "b", "c"] * 2)
    assert_ci_in_exact_band(pooled["ci"], w @ np.array([1.0, 0, 0, 0, 0.5, -0.5]), prob, 2000)
    # The pooled mean is the mean of the seeds' own differences (a linear statistic).
    per = [cp.paired_difference(after[("gold", s)], p0["gold"], 200, 0)["difference"]
           for s in (0, 1)]
    assert pooled["difference"] == pytest.approx(np.mean(per))
    assert out["pooled_sampled"]["difference"] == pytest.approx((1 / 6 + 1 / 2) / 2)
    # One seed: nothing to pool; a seed without samples: no sampled pool.
    assert cp.pooled_over_seeds("gold", {"0": {}}, after, sampled, p0, 200, 0) == {}
    assert "pooled_sampled" not in cp.pooled_over_seeds(
        "gold", per_seed, after, {("gold", 0): [0.0] * 3}, p0, 200, 0)


def test_pooled_difference_and_share_leave_out_a_prompt_per_seed():
    """A nan score leaves its prompt out of its own seed only (ragged seeds); the pooled
    share of the gold arm's gain is a ratio of seed-weighted sums with the same two-stage
    replicates for both sums."""
    out = cp.pooled_difference([[1.0, np.nan, 0.0], [0.5, 0.5, 1.0]],
                               [[0.0, 0.0, 0.0], [0.0, np.nan, 0.0]], 2000, 1)
    # Seed 0 keeps prompts 0, 2 (mean diff 0.5); seed 1 keeps 0, 2 (mean diff 0.75).
    assert out["difference"] == pytest.approx(0.625) and out["prompts"] == 4
    w, prob = two_stage_resamples([2, 2])
    assert_ci_in_exact_band(out["ci"], w @ np.array([1.0, 0.0, 0.5, 1.0]), prob, 2000)
    with pytest.raises(ValueError, match="seed 1: paired scores differ in length"):
        cp.pooled_difference([[1.0], [1.0]], [[1.0], [1.0, 0.0]], 10, 0)
    p0 = np.array([0.0, 0.5, 0.0])
    arm = [np.array([0.5, 0.5, 0.5]), np.array([1.0, 0.5, 0.0])]
    gold = [np.array([1.0, 1.0, 0.5]), np.array([0.5, 1.0, 0.5])]
    share = cp.pooled_share_of_gold(arm, gold, p0, 2000, 2, [["a", "b", "c"]] * 2)
    # Numerators 1 and 1, denominators 2 and 1.5, each seed 1 / (2 * 3): share 2 / 3.5.
    assert share["share"] == pytest.approx(2 / 3.5) and share["seeds"] == 2
    w, prob = two_stage_resamples([3, 3], ["a", "b", "c"] * 2)
    num, den = np.concatenate([a - p0 for a in arm]), np.concatenate([g - p0 for g in gold])
    reps = np.where(w @ den > 0, (w @ num) / np.where(w @ den > 0, w @ den, 1), np.nan)
    assert_ci_in_exact_band(share["ci"], reps, prob, int(round(share["kept"] * 2000)))


def test_verdict_names_each_arm_by_its_cis():
    def arm(cis):
        return {"seeds": {str(i): {"heldout": {"ci": ci}} for i, ci in enumerate(cis)}}

    s = {"arms": {"gold": arm([[0.1, 0.3], [0.05, 0.2]]),
                  "rubric_g0": arm([[-0.1, 0.1], [-0.2, 0.0]]),
                  "rubric_trained": arm([[0.1, 0.2], [-0.3, -0.1]])}}
    v = cpr.verdict(s)
    assert "`gold` raised the held-out gold score above P_0 in all 2 seeds" in v
    assert "`rubric_g0` moved it by no more than chance in any of 2 seeds" in v
    assert "`rubric_trained` raised it in 1, lowered it in 1" in v
    one = cpr.verdict({"arms": {"gold": arm([[-0.1, 0.2]]), "rubric_g0": arm([[0.1, 0.2]])}})
    assert "`gold` moved it by no more than chance in its 1 seed (its CI holds 0)" in one
    assert "`rubric_g0` raised the held-out gold score above P_0 in its 1 seed" in one


def test_checks_policy_config_validates_for_every_arm(tmp_path):
    from configs import checks_policy
    from drubric_jax import config_check
    from configs.checks_policy import arm_config

    for arg, devices in (("", 1), ("tiny", 1), ("scale=qwen3_8b", 8)):
        c = checks_policy.get_config(arg)
        assert c.verifier.kind == "checks" and c.rounds.generator_steps == 0
        c.experiment.trained_generator = os.path.dirname(os.path.abspath(__file__))
        c.experiment.sft_generator = c.experiment.trained_generator
        for a in cp.ARMS:
            config_check.validate(arm_config(c, a), device_count=devices, process_count=1)
    assert arm_config(c, "gold").policy.reward == "checks_gold"
    assert arm_config(c, "oracle").policy.reward == "checks_oracle"
    sft_arm = arm_config(c, "rubric_sft")
    assert sft_arm.policy.reward == "rubric" and sft_arm.model.generator == c.experiment.sft_generator
    # One list temperature, the experiment's, for every arm (METHOD 15).
    assert {arm_config(c, a, seed=0).policy.rubric_temperature for a in cp.ARMS} == {
        c.experiment.list_temperature} == {checks_policy.LIST_TEMPERATURE}
    c.experiment.list_temperature = 0.7
    assert {arm_config(c, a, seed=0).policy.rubric_temperature for a in cp.ARMS} == {0.7}
    # `{seed}` in a generator path is filled with the run's seed (seed S of Q1 reads the
    # generator the ablation's seed S trained); without a seed it cannot be filled.
    (tmp_path / "seed2").mkdir()
    c.experiment.trained_generator = str(tmp_path / "seed{seed}")
    assert arm_config(c, "rubric_trained", seed=2).model.generator == str(tmp_path / "seed2")
    with pytest.raises(ValueError, match="needs the seed"):
        arm_config(c, "rubric_trained")
    with pytest.raises(ValueError, match="trained_generator"):
        arm_config(c, "rubric_trained", seed=3)  # seed3 is no directory
    c.experiment.trained_generator = ""
    with pytest.raises(ValueError, match="trained_generator"):
        arm_config(c, "rubric_trained")
    with pytest.raises(ValueError, match="arms"):
        arm_config(c, "bogus")
    with pytest.raises(ValueError, match="checks world"):
        checks_policy.get_config("world=llm")


@pytest.mark.slow
@pytest.mark.usefixtures("smollm2_gguf")
def test_checks_policy_experiment_end_to_end_resumes_and_reports(tmp_path):
    data = tmp_path / "world"
    data.mkdir()
    write_checks_world(str(data))
    work = tmp_path / "cp"
    # Round 1: the gold arm; its exported generator (G_0, untrained) stands in for a
    # trained one in round 2, which adds the rubric arms in the same workdir.
    base = ["experiments.checks_policy", f"--config=configs/checks_policy.py:tiny,"
            f"checks_dir={data}", f"--workdir={work}", "--config.experiment.heldout_rows=0"]
    run_module(*base, "--config.experiment.arms=gold", timeout=600)
    p0 = json.loads((work / cp.P0_FILE).read_text())
    # heldout.jsonl: the heldout split's 3 rows (tests/helpers.py write_checks_world).
    assert p0["ids"] == [f"cw/heldout/{i}" for i in range(3)] and len(p0["gold"]) == 3
    gold_eval = work / "seed0" / "gold" / cp.HELDOUT_FILE
    stamp = gold_eval.stat().st_mtime_ns
    # World v2 (the default): greedy and sampled held-out scores, the held-out gold curve
    # (before each step and after the last), and a checkpoint of the policy alone (the gold
    # arm loads no generator, so it exports none).
    h = json.loads(gold_eval.read_text())
    assert len(h["gold_sampled"]) == 3 and h["samples"] == 1 and h["by_check"]
    assert not (work / "seed0" / "gold" / "export" / "generator").exists()
    # The gold curve while the policy trains reads the dev split (3 rows), not heldout.
    curve = cp.gold_curve(str(work / "seed0" / "gold" / "metrics.jsonl"))
    assert curve["steps"] == [0, 1, 2] and curve["rows"] == [3, 3, 3]
    cfg = json.loads((work / "seed0" / "gold" / "config.json").read_text())
    assert cfg["rounds"]["heldout_gold_path"] == str(data / "dev.jsonl")
    assert cfg["data"]["prompt_paths"] == [str(data / "policy.jsonl")]
    # An untrained tiny generator (G_0 itself) stands in for a trained one in round 2.
    from drubric_jax import models
    gen = tmp_path / "gen"
    cfg, params, tok = models.load_model("tiny")
    models.export_hf_dir(params, cfg, str(gen), tok)
    out = run_module(*base, "--config.experiment.arms=gold,rubric_g0,rubric_trained",
                     f"--config.experiment.trained_generator={gen}", timeout=600)
    assert gold_eval.stat().st_mtime_ns == stamp  # finished work is not redone
    s = json.loads((work / "summary.json").read_text())
    assert s["arms_run"] == ["gold", "rubric_g0", "rubric_trained"]
    for arm in s["arms_run"]:
        h = s["arms"][arm]["seeds"]["0"]["heldout"]
        after = json.loads((work / "seed0" / arm / cp.HELDOUT_FILE).read_text())["gold"]
        assert h["after"] == pytest.approx(np.nanmean(after))
        assert h["difference"] == pytest.approx(h["after"] - h["before"])
        assert len(s["arms"][arm]["seeds"]["0"]["curves"]["gold"]) == 2  # policy steps
    trained = json.loads((work / "seed0" / "rubric_trained" / "config.json").read_text())
    assert trained["model"]["generator"] == str(gen)
    # Each arm's resolved settings, flat; the list temperature is the setup line's.
    flat = {a: json.loads((work / "seed0" / a / "settings.json").read_text())
            for a in s["arms_run"]}
    assert flat["rubric_trained"]["model.generator"] == str(gen)
    assert {f["policy.rubric_temperature"] for f in flat.values()} == {0.0}
    assert "lists at temperature 0.0 (experiment.list_temperature)" in s["setup"]
    assert "rubric_trained - gold" in s["versus"] and "Shown:" in out
    assert "heldout_sampled" in s["arms"]["gold"]["seeds"]["0"] and "step 2" in out
    # --summarize_only trains nothing: seed 1 has no run, each arm keeps the seed it has.
    run_module(*base, "--config.experiment.arms=gold,rubric_g0", "--config.experiment.seeds=0,1",
               "--summarize_only", timeout=300)
    assert not (work / "seed1").exists()
    part = json.loads((work / "summary.json").read_text())
    assert part["seeds"] == [0, 1] and list(part["arms"]["gold"]["seeds"]) == ["0"]
    assert part["arms"]["gold"]["seeds"]["0"] == s["arms"]["gold"]["seeds"]["0"]
    run_module(*base, "--config.experiment.arms=gold,rubric_g0,rubric_trained",
               f"--config.experiment.trained_generator={gen}", "--summarize_only", timeout=300)
    res = tmp_path / "results"
    run_module("experiments.report", str(work), f"--out={res}", timeout=120)
    md = (res / "checks_policy-cp.md").read_text()
    assert "| rubric_trained | 0 |" in md and (res / "checks_policy-cp.png").stat().st_size


@pytest.mark.slow
@pytest.mark.usefixtures("smollm2_gguf")
def test_sensitivity_experiment_end_to_end(tmp_path):
    """configs/sensitivity.py:tiny on hand-written checks-world rows, two settings (the
    paper's lambda and K = 8): each is a round of the loop with its override, its trained
    generator scored on the held-out anchor list (constraint F1 among the values) and its
    policy's held-out gold paired against P_0 and against lam1 (0 for lam1 itself)."""
    from configs.sensitivity import SETTINGS

    data = tmp_path / "world"
    data.mkdir()
    write_checks_world(str(data))
    work = tmp_path / "se"
    out = run_module("experiments.sensitivity",
                     f"--config=configs/sensitivity.py:tiny,checks_dir={data}",
                     f"--workdir={work}", "--config.experiment.settings=lam1,k8",
                     "--config.log.progress=False", timeout=900)
    assert "# Sensitivity" in out
    cfg = json.loads((work / "k8" / "config.json").read_text())
    assert cfg["policy"]["num_responses"] == SETTINGS["k8"]["policy.num_responses"]
    s = json.loads((work / "summary.json").read_text())
    assert s["baseline"] == "lam1" and s["generator"]["n_lists"] == 1
    assert "constraint_f1" in s["generator"]["generators"]["k8"]
    assert s["gold"]["lam1"]["vs_lam1"]["difference"] == 0.0
    gen = json.loads((work / "k8" / "heldout_generator.json").read_text())
    assert len(gen["constraint_f1"]) == 1 and 0 <= gen["constraint_f1"][0] <= 1
    with pytest.raises(ValueError, match="settings"):
        from configs import sensitivity

        sensitivity.setting_config(sensitivity.get_config("tiny"), "lam9")


def test_sensitivity_config_validates_for_every_setting():
    from configs import sensitivity
    from drubric_jax import config_check
    from configs.sensitivity import setting_config

    for arg, devices in (("", 1), ("tiny", 1), ("scale=qwen3_8b", 8)):
        c = sensitivity.get_config(arg)
        assert c.verifier.kind == "checks" and c.rounds.num_rounds == 1
        for name in sensitivity.SETTINGS:
            config_check.validate(setting_config(c, name), device_count=devices,
                                  process_count=1)
    c = sensitivity.get_config("")
    assert (c.rounds.generator_steps + c.rounds.policy_steps) % c.checkpoint.every_steps == 0
    assert setting_config(c, "lam2").generator.lam == 2.0


def _generator_values(rng, ids, f1_scale):
    u = len(ids)
    return {"delta_gap": rng.uniform(-0.1, 0.3, u).tolist(),
            "r_anchor": rng.uniform(-1, 1, u).tolist(),
            "pairs": [6.0] * u, "correct": rng.integers(0, 7, u).astype(float).tolist(),
            "ties": rng.integers(0, 3, u).astype(float).tolist(), "valid": [2.0] * u,
            "constraint_f1": (f1_scale * rng.uniform(0, 1, u)).tolist(),
            "constraint_f1_check_id": (f1_scale * rng.uniform(0, 1, u)).tolist(),
            "ids": ids, "num_lists": 2}


def test_sensitivity_summary_verdict_and_report_from_files(tmp_path):
    """`evaluation.sensitivity.summarize` recomputes every figure from a workdir's files (the
    gold differences equal paired_difference on the same vectors; lam1 against itself is
    0), the verdict names the setting whose constraint F1 CI is above 0 and the settings
    whose gold CIs exclude 0, and experiments.report renders the same workdir as a `sensitivity`
    table."""
    from drubric_jax.evaluation import sensitivity

    rng = np.random.default_rng(0)
    ids, u = [f"a{i}" for i in range(8)], 16
    p0 = rng.uniform(0, 1, u)
    # lam1: every prompt up 0.2 (a CI of one point, above 0); k8: up and down 0.1 in turn
    # (mean 0; every resample's mean lies in [-0.1, 0.1], below lam1's).
    gold = {"lam1": p0 + 0.2, "k8": p0 + np.tile([0.1, -0.1], u // 2)}
    for n, scale in (("lam1", 0.0), ("k8", 1.0)):
        (tmp_path / n).mkdir()
        (tmp_path / n / sensitivity.GENERATOR_FILE).write_text(
            json.dumps(_generator_values(rng, ids, scale)))
        (tmp_path / n / cp.HELDOUT_FILE).write_text(json.dumps({"gold": gold[n].tolist()}))
    (tmp_path / cp.P0_FILE).write_text(json.dumps({"gold": p0.tolist()}))
    s = sensitivity.summarize(str(tmp_path), ["lam1", "k8"], "lam1", 200, 0)
    want = cp.paired_difference(gold["k8"], p0, 200, 0)
    assert s["gold"]["k8"]["vs_p0"] == want
    assert s["gold"]["lam1"]["vs_lam1"]["difference"] == 0.0
    assert s["generator"]["generators"]["lam1"]["constraint_f1"]["mean"] == 0.0
    v = sensitivity.verdict(s)
    assert "held-out constraint F1 above 0 for k8" in v
    assert "moved beyond chance from P_0 for lam1, and differed from lam1 for k8" in v
    md = sensitivity.markdown(s, "cmd", {"lam1": 600.0}, {"k8": {"policy.num_responses": 8}},
                              0)
    assert md.count("| k8 |") == 2 and "| k8 - lam1 |" in md and v in md
    with pytest.raises(ValueError, match="baseline"):
        sensitivity.summarize(str(tmp_path), ["k8"], "lam1", 10, 0)
    with pytest.raises(FileNotFoundError, match="lam2"):
        sensitivity.summarize(str(tmp_path), ["lam1", "lam2"], "lam1", 10, 0)

    (tmp_path / "summary.json").write_text(json.dumps(
        {**s, "command": "cmd", "wall_s": {"lam1": 600.0}, "seed": 0, "n_bootstrap": 200,
         "overrides": {"k8": {"policy.num_responses": 8}}}))
    out = tmp_path / "results"
    run_module("experiments.report", str(tmp_path), f"--out={out}", timeout=120)
    assert (out / f"sensitivity-{tmp_path.name}.md").read_text() == md


def test_coevolution_verdict_reads_the_headline_differences():
    from drubric_jax.evaluation import coevolution as co

    s = {"gold": {"differences": {"P2 - ~P2": {"diff": 0.05, "ci": [-0.01, 0.1],
                                              "zero_inside_ci": True}}},
         "gap": {"differences": {"G1 | ~P2 - G2 | P2": {"diff": 0.2, "ci": [0.1, 0.3],
                                                       "zero_inside_ci": False}}}}
    v = co.verdict(s)
    assert "the co-evolved policy's gold score minus the stale arm's is +0.050 [-0.010, " \
           "+0.100], not shown" in v
    assert "(exploitation) is +0.200 [+0.100, +0.300], shown above 0" in v
    assert co.verdict({}).startswith("Shown: nothing")


def test_coevolution_across_seeds_table_and_spread():
    """Per-run headline differences with their CIs, then the spread of the point values
    (mean, sd with ddof 1, range) and the count of CIs on each side of 0."""
    from drubric_jax.evaluation import coevolution as co

    def run(diff, ci, seed):
        return {"gold": {"differences": {"P2 - ~P2": {"diff": diff, "ci": ci,
                                                     "zero_inside_ci": ci[0] <= 0 <= ci[1]}}},
                "ids": ["h1", "h2"], "seed": seed}

    text = co.across_seeds({"s0": run(0.1, [0.05, 0.2], 0), "s1": run(-0.02, [-0.1, 0.05], 1),
                            "s2": run(0.04, [-0.01, 0.1], 2)})
    assert "evaluation prompts the same in every run" in text
    assert "| s1 | 1 | -0.0200 [-0.1000, +0.0500] |" in text
    sd = float(np.std([0.1, -0.02, 0.04], ddof=1))
    assert (f"Across 3 runs: mean +0.0400, sd {sd:.4f}, range [-0.0200, +0.1000]; CI above 0 "
            "in 1, below 0 in 0, holding 0 in 2.") in text
    assert "exploitation" not in text  # only the headlines the runs have
    with pytest.raises(ValueError, match="two or more"):
        co.across_seeds({"s0": run(0.1, [0.0, 0.2], 0)})


def test_coevolution_headlines_pool_over_runs_by_prompt_id():
    """Each headline of several runs' eval.json pooled by the two-stage bootstrap: runs
    drawn, then prompts by id (h2 is in both runs: one unit); a prompt whose block has a
    nan entry is left out of its run, as in the run's own summary."""
    from drubric_jax.evaluation import coevolution as co

    evals = {"s0": {"ids": ["h1", "h2", "h3"],
                    "gold": {"P2": [1.0, 0.5, 1.0], "~P2": [0.0, 0.5, 0.5],
                             "P1": [0.0, 0.0, float("nan")]}},
             "s1": {"ids": ["h2", "h4"], "gold": {"P2": [0.0, 1.0], "~P2": [0.5, 0.5],
                                                  "P1": [0.0, 0.0]}}}
    vals = co.headline_values(evals["s0"])
    assert list(vals) == [("gold", "P2 - ~P2")] and vals[("gold", "P2 - ~P2")]["ids"] == [
        "h1", "h2"]
    pooled = co.pooled_headlines(evals, 4000, 1)
    d = pooled[("gold", "P2 - ~P2")]
    # Run means: s0 (1 + 0) / 2 = 0.5; s1 (-0.5 + 0.5) / 2 = 0.
    assert d["diff"] == pytest.approx(0.25) and d["distinct_units"] == 3
    w, prob = two_stage_resamples([2, 2], ["h1", "h2", "h2", "h4"])
    assert_ci_in_exact_band(d["ci"], w @ np.array([1.0, 0.0, -0.5, 0.5]), prob,
                            int(round(d["kept"] * 4000)))
    summaries = {n: {"gold": {"differences": {"P2 - ~P2": {
        "diff": 0.0, "ci": [-0.1, 0.1], "zero_inside_ci": True}}}, "ids": e["ids"], "seed": i}
        for i, (n, e) in enumerate(evals.items())}
    text = co.across_seeds(summaries, pooled)
    assert (f"Pooled over 2 runs (two-stage bootstrap: seeds, then prompts; METHOD 15): "
            f"{d['diff']:+.4f} [{d['ci'][0]:+.4f}, {d['ci'][1]:+.4f}]") in text
    with pytest.raises(ValueError, match="two or more runs"):
        co.pooled_headlines({"s0": evals["s0"]}, 10, 0)


def test_share_of_gold_by_hand():
    """The share is sum(arm - P_0) / sum(gold - P_0); its CI comes from the same prompt
    resamples for both sums; a gold gain of 0 gives no share."""
    p0 = np.array([0.0, 0.5, 0.0, 1.0])
    gold = np.array([1.0, 1.0, 0.5, 1.0])   # gains 1, 0.5, 0.5, 0: sum 2
    arm = np.array([0.5, 0.5, 0.5, 1.0])    # gains 0.5, 0, 0.5, 0: sum 1
    s = cp.share_of_gold(arm, gold, p0, n_boot=200, seed=0)
    assert s["share"] == pytest.approx(0.5) and s["prompts"] == 4
    w = resample_weights(4, 200, 0)
    den = w @ (gold - p0)
    reps = (w @ (arm - p0))[den > 0] / den[den > 0]
    assert s["ci"] == pytest.approx(list(np.quantile(reps, [0.025, 0.975])))
    assert s["kept"] == pytest.approx(np.mean(den > 0))
    assert np.isnan(cp.share_of_gold(arm, p0, p0, 50, 0)["share"])


def test_checks_policy_summary_and_report_from_run_files(tmp_path):
    """From hand-written run directories: pooled figures by the two-stage bootstrap and
    named so in the tables, the smallest detectable difference beside a CI that holds 0,
    each run's bookkeeping ('-' where a metric was not logged), and the settings in which
    an arm differs from the gold arm of its seed (or why they could not be compared)."""
    base = {"policy.reward": "checks_gold", "model.generator": "", "seed": 0,
            "policy.rubric_temperature": 1.0}
    settings = {
        (0, "gold"): base,
        # Seed 0: the rubric arm also changed its list temperature (outside its reward).
        (0, "rubric_sft"): {**base, "policy.reward": "rubric", "model.generator": "/g_sft",
                            "policy.rubric_temperature": 0.0, "policy.extra": 1},
        (1, "rubric_sft"): {**base, "policy.reward": "rubric", "model.generator": "/g_sft"}}
    work = tmp_path / "cp"
    write_checks_policy_workdir(work, settings)
    s = cp.summarize(str(work), ["gold", "rubric_sft"], [0, 1], 400, 0, window=1)
    p0 = json.loads((work / cp.P0_FILE).read_text())
    after = {(a, k): json.loads((work / f"seed{k}" / a / cp.HELDOUT_FILE).read_text())["gold"]
             for a in ("gold", "rubric_sft") for k in (0, 1)}
    pooled = s["arms"]["rubric_sft"]["pooled"]
    assert pooled["difference"] == pytest.approx(np.mean(
        [np.mean(np.subtract(after[("rubric_sft", k)], p0["gold"])) for k in (0, 1)]))
    assert pooled["interval"] == "two-stage bootstrap: seeds, then prompts"
    assert pooled["prompts"] == 6 and pooled["seeds"] == 2
    versus = s["versus"]["rubric_sft - gold"]["pooled"]
    assert versus["se"] > 0 and versus["minimal_detectable"] == pytest.approx(
        2.8016 * versus["se"], rel=1e-4)
    assert s["arms"]["rubric_sft"]["share_of_gold"]["pooled"]["interval"].startswith("two-stage")
    # Bookkeeping: seed k's step 0 cut 0.25 + 0.5 k of its update rows; step 1 was skipped.
    b0 = s["arms"]["gold"]["seeds"]["0"]["bookkeeping"]
    assert b0 == {"steps": 2, "truncated_fraction": 0.25, "rollout_truncated_fraction": None,
                  "active_rows": 4.0, "update_skipped": 1.0, "redraws": 3.0,
                  "prompts_drawn": None}
    mean = s["arms"]["gold"]["bookkeeping"]
    assert mean["truncated_fraction"] == pytest.approx(0.5) and mean["prompts_drawn"] is None
    # Settings: seed 0 differs outside the reward and the generator; seed 1 lacks gold's.
    diff = s["settings"]["rubric_sft"]
    assert diff["0"]["outside"] == ["policy.extra", "policy.rubric_temperature"]
    assert diff["0"]["differ"]["policy.extra"] == {"arm": 1}
    assert diff["1"] == {"missing": [os.path.join("seed1", "gold", cp.SETTINGS_FILE)]}

    md = cpr.markdown(s, "cmd", {}, "setup")
    assert ("| arm | seeds | mean | sd | min | max | pooled greedy [95% CI, two-stage "
            "bootstrap: seeds, then prompts] |") in md
    nulls = [d for d in [s["arms"][a]["pooled"] for a in s["arms"]] + [versus]
             if d["zero_inside_ci"]]
    for d in nulls:  # every pooled null carries its power figure
        assert f"detectable >= {d['minimal_detectable']:.3f}" in md
    for d in (d for d in [s["arms"][a]["pooled"] for a in s["arms"]] if not d["zero_inside_ci"]):
        assert f"{cpr._ci(d)}; detectable" not in md
    assert "| rubric_sft - gold | pooled over 2 (two-stage bootstrap: seeds, then prompts) |" in md
    assert "| gold | mean of 2 | 2 | 0.500 | - | 4.0 | 1.0 | 3.0 | - |" in md
    assert "| gold | 1 | 2 | 0.750 | - | 4.0 | 1.0 | 3.0 | - |" in md
    assert ('| rubric_sft | 0 | `model.generator` = "/g_sft" (""); `policy.extra` = 1 '
            '((absent)); `policy.reward` = "rubric" ("checks_gold"); '
            '`policy.rubric_temperature` = 0.0 (1.0); outside the reward and the generator: '
            '`policy.extra`, `policy.rubric_temperature` |') in md
    assert "| rubric_sft | 1 | not compared: no `seed1/gold/settings.json` |" in md
    # Where every differing field is the reward's or the generator's, the table says so.
    (work / "seed1" / "gold" / cp.SETTINGS_FILE).write_text(json.dumps(base))
    md = cpr.markdown(cp.summarize(str(work), ["gold", "rubric_sft"], [0, 1], 100, 0, 1),
                      "cmd", {}, "setup")
    assert ('| rubric_sft | 1 | `model.generator` = "/g_sft" (""); `policy.reward` = '
            '"rubric" ("checks_gold"); none outside the reward and the generator |') in md
    # No gold arm: nothing to compare against, said in the report.
    alone = cp.summarize(str(work), ["rubric_sft"], [0, 1], 100, 0, 1)
    assert "No gold arm ran" in cpr.markdown(alone, "cmd", {}, "setup")
