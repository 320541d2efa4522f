"""IFEval of every seed of an arm, paired against P_0 (drubric_jax.evaluation.ifeval_seeds,
`experiments.report`'s ifeval-seeds[-<arm>].md): every run given is a column, the pooled
figures are the two-stage bootstrap's (seeds, then prompt ids), and runs that cannot be
pooled are refused by name.

The run directories are written as experiments.eval_ifeval writes them (`_write_run`), from
hand-made verdicts (`ifeval.judge`'s tuples) on U synthetic prompts; the last test runs
eval_ifeval itself on real IFEval rows."""
import json
import subprocess
import sys

import numpy as np
import pytest

from drubric_jax.evaluation import ifeval, ifeval_seeds, intervals
from helpers import REPO, run_module

CHECK = "punctuation:no_comma"
N_BOOT = 300


def _verdicts(rng, n_scored, p_strict, unscored=()):
    """`ifeval.judge`-style verdicts: prompt u has n_scored[u] scored instructions, each
    followed strictly with probability p_strict (loosely when strictly, or by a coin of
    0.3); the prompts in `unscored` get one instruction that is not scored instead."""
    out = []
    for u, n in enumerate(n_scored):
        if u in unscored:
            out.append([(CHECK, False, None, None, "not scorable here")])
            continue
        strict = rng.random(n) < p_strict
        loose = strict | (rng.random(n) < 0.3)
        out.append([(CHECK, True, bool(s), bool(lo), "") for s, lo in zip(strict, loose)])
    return out


def _write_run(d, rows, before, after, baseline, *, arm=None, seed=None, model=None):
    """A run directory as experiments.eval_ifeval --baseline writes it: report.json with the
    report, the per-prompt counts, the paired comparison and the run's identity."""
    d.mkdir(parents=True)
    rep = ifeval.report(after, n_boot=N_BOOT, seed=0)
    rep["per_prompt"] = ifeval.per_prompt(rows, after)
    rep["run"] = ifeval_seeds.run_identity(model, arm or "", seed)
    rep["paired"] = ifeval.paired(before, after, N_BOOT, 0)
    rep["paired"].update(baseline=str(baseline), baseline_sha256=ifeval.file_sha256(baseline),
                         baseline_per_prompt=ifeval.per_prompt(rows, before))
    rep["setup"] = {"model": model, "responses": None, "decoding": "greedy",
                    "max_new_tokens": 256, "truncated_responses": 3, "dtype": "float32"}
    rep["command"] = f"python -m experiments.eval_ifeval --model={model} --baseline={baseline}"
    rep["kind"] = "ifeval"
    (d / "report.json").write_text(json.dumps(rep))
    return d


def _baseline_file(path, text="P_0"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "response": f"{text} {i}"}) + "\n"
                            for i in range(3)))
    return path


@pytest.fixture()
def arm_runs(tmp_path):
    """Three seeds of arm "gold" (their models laid out as experiments.checks_policy exports
    them) on 40 prompts, each paired against the same P_0 file; returns (dirs, rows, P_0
    verdicts, each seed's verdicts, the baseline file)."""
    rng = np.random.default_rng(0)
    u = 40
    rows = [{"key": 1000 + 7 * i} for i in range(u)]
    n_scored = rng.integers(1, 4, u)
    before = _verdicts(rng, n_scored, 0.35)
    afters = [_verdicts(rng, n_scored, p) for p in (0.45, 0.35, 0.6)]
    base = _baseline_file(tmp_path / "ifeval_p0" / "responses.jsonl")
    dirs = [_write_run(tmp_path / f"ifeval_gold_s{s}", rows, before, a, base,
                       model=f"runs/cp/seed{s}/gold/export/policy")
            for s, a in enumerate(afters)]
    return dirs, rows, before, afters, base


def test_every_seed_is_listed_and_pooled_by_the_two_stage_bootstrap(arm_runs):
    dirs, rows, before, afters, _ = arm_runs
    runs = [ifeval_seeds.load_run(str(d)) for d in dirs]
    assert [(r["arm"], r["seed"], r["source"]["seed"]) for r in runs] == [
        ("gold", s, "model path") for s in range(3)]
    s = ifeval_seeds.summarize(runs)
    ids = [[r["key"] for r in rows]] * 3
    n_sc = np.array([sum(v[1] for v in p) for p in before], np.float64)

    def followed(judged, mode):  # per prompt: instructions followed
        i = 2 if mode == "strict" else 3
        return np.array([sum(bool(v[i]) for v in p if v[1]) for p in judged], np.float64)

    for mode in ("strict", "loose"):
        # Prompt level (every prompt has a scored instruction): the pooled difference is
        # two_stage_bootstrap of the per-prompt differences, prompt ids shared by the seeds.
        all_b = (followed(before, mode) == n_sc).astype(float)
        d_prompt = [(followed(a, mode) == n_sc).astype(float) - all_b for a in afters]
        want = intervals.two_stage_bootstrap(d_prompt, N_BOOT, 0, ids=ids, unit="prompts")
        got = s["differences"][f"prompt_{mode}"]
        assert got["mean"] == pytest.approx(want["mean"], abs=1e-12)
        assert got["ci"] == pytest.approx(want["ci"], abs=1e-12)
        assert got["se"] == pytest.approx(want["se"], abs=1e-12)
        assert got["interval"] == "two-stage bootstrap: seeds, then prompts"
        # Instruction level: the ratio of the drawn prompts' followed to scored instructions
        # (each prompt weighed by its instructions), from the same replicates.
        d_inst = [followed(a, mode) - followed(before, mode) for a in afters]
        want = intervals.two_stage_ratio(d_inst, [n_sc] * 3, N_BOOT, 0, ids=ids)
        got = s["differences"][f"instruction_{mode}"]
        assert (got["mean"], got["ci"]) == (want["mean"], want["ci"])
        assert got["mean"] == pytest.approx(np.mean([x.sum() / n_sc.sum() for x in d_inst]))
        # The policy's level pooled the same way; P_0's is its accuracy.
        lv = intervals.two_stage_ratio([followed(a, mode) for a in afters], [n_sc] * 3,
                                       N_BOOT, 0, ids=ids)
        assert s["levels"][f"instruction_{mode}"]["ci"] == lv["ci"]
        assert s["p0"][f"instruction_{mode}"]["value"] == pytest.approx(
            followed(before, mode).sum() / n_sc.sum())
    # Each seed's row is that run's own paired comparison (recomputed from the counts).
    for r, a in zip(s["runs"], afters):
        assert r["paired"] == ifeval.paired(before, a, N_BOOT, 0)
    text = ifeval_seeds.markdown(s)
    assert text.startswith("# IFEval across seeds: arm `gold`")
    assert "3 runs, every run given (none chosen by a score)" in text
    lines = text.splitlines()
    for k in ifeval.METRICS:
        head = [x for x in lines if x.startswith(f"| {k} | ")]
        assert len(head) == 2  # its accuracies and its differences
        acc, diff = (x.split(" | ") for x in head)
        # metric, P_0, 3 seeds, mean (sd), pooled / metric, 3 seeds, mean (sd), counts, pooled
        assert len(acc) == 7 and len(diff) == 7
        for j, r in enumerate(s["runs"]):
            assert diff[1 + j].startswith(f"{r['paired'][k]['difference']:+.3f} [")
        pooled = s["differences"][k]
        assert ("detectable >=" in diff[-1]) == pooled["zero_inside_ci"]
        assert diff[-1].startswith(f"{pooled['mean']:+.3f} [{pooled['ci'][0]:+.3f}, ")
    for d, label in zip(dirs, ("seed 0", "seed 1", "seed 2")):
        assert f"{label} (`{d}`)" in text and f"| {label} | `{d}` | gold (model path)" in text
    assert "| metric | P_0 [95% CI, prompts] | seed 0 | seed 1 | seed 2 |" in text


def test_pooled_point_is_the_mean_of_the_seeds_with_an_unscored_prompt(tmp_path):
    """A prompt with no scored instruction stays out of the prompt-level denominator in
    every seed; each pooled point is the mean over the seeds of each seed's paired
    difference (P_0's accuracy is the same in every row)."""
    rng = np.random.default_rng(1)
    rows = [{"key": i} for i in range(12)]
    n_scored = rng.integers(1, 3, 12)
    before = _verdicts(rng, n_scored, 0.4, unscored=(3,))
    rng_a = np.random.default_rng(2)
    afters = [_verdicts(rng_a, n_scored, p, unscored=(3,)) for p in (0.5, 0.7)]
    base = _baseline_file(tmp_path / "p0.jsonl")
    runs = [ifeval_seeds.load_run(str(_write_run(tmp_path / f"r{i}", rows, before, a, base,
                                                 arm="gold", seed=i)))
            for i, a in enumerate(afters)]
    s = ifeval_seeds.summarize(runs)
    assert s["n_prompts"] == 12 and s["n_prompts_scored"] == 11
    for k in ifeval.METRICS:
        per_seed = [ifeval.paired(before, a, N_BOOT, 0)[k] for a in afters]
        assert s["differences"][k]["mean"] == pytest.approx(
            np.mean([p["difference"] for p in per_seed]), abs=1e-12)
        assert s["levels"][k]["mean"] == pytest.approx(
            np.mean([p["after"] for p in per_seed]), abs=1e-12)
        assert s["p0"][k]["value"] == per_seed[0]["before"]
        lo, hi = s["differences"][k]["ci"]
        assert lo <= s["differences"][k]["mean"] <= hi


def test_a_run_paired_against_another_baseline_is_refused(arm_runs, tmp_path):
    dirs, rows, before, afters, _ = arm_runs
    other = _baseline_file(tmp_path / "ifeval_p0_again" / "responses.jsonl", text="other")
    odd = _write_run(tmp_path / "ifeval_gold_s3", rows, before, afters[0], other,
                     model="runs/cp/seed3/gold/export/policy")
    runs = [ifeval_seeds.load_run(str(d)) for d in dirs + [odd]]
    with pytest.raises(ValueError, match=f"{odd}/report.json: paired.baseline {other}") as e:
        ifeval_seeds.summarize(runs)
    assert str(dirs[0]) in str(e.value)  # and the file the others were paired against
    # From the command line: one error line naming the run, and nothing written.
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "experiments.report", *map(str, dirs + [odd]),
                           f"--out={out}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: ") and f"{odd}/report.json" in proc.stderr
    assert not out.exists()


def test_runs_that_cannot_be_pooled_say_why(arm_runs, tmp_path):
    dirs, rows, before, afters, base = arm_runs
    # The same seed twice.
    twin = _write_run(tmp_path / "twin", rows, before, afters[1], base,
                      model="runs/other/seed0/gold/export/policy")
    with pytest.raises(ValueError, match="both 'seed 0' of arm 'gold'"):
        ifeval_seeds.summarize([ifeval_seeds.load_run(str(d)) for d in (dirs[0], twin)])
    # Other prompts (another --limit).
    short = _write_run(tmp_path / "short", rows[:30], before[:30], afters[1][:30], base,
                       arm="gold", seed=7)
    with pytest.raises(ValueError, match=f"{short}/report.json: per_prompt.key differs"):
        ifeval_seeds.summarize([ifeval_seeds.load_run(str(d)) for d in (dirs[0], short)])
    # Another answer budget (both generated their answers).
    longer = tmp_path / "longer"
    longer.mkdir()
    rep = json.loads((dirs[1] / "report.json").read_text())
    rep["setup"]["max_new_tokens"] = 512
    (longer / "report.json").write_text(json.dumps(rep))
    with pytest.raises(ValueError, match=f"{longer}/report.json: setup.max_new_tokens = 512"):
        ifeval_seeds.summarize([ifeval_seeds.load_run(str(d)) for d in (dirs[0], longer)])
    # A report.json written before the per-prompt counts were kept.
    old = tmp_path / "old"
    old.mkdir()
    rep = json.loads((dirs[1] / "report.json").read_text())
    del rep["per_prompt"]
    (old / "report.json").write_text(json.dumps(rep))
    with pytest.raises(ValueError, match=f'{old}/report.json: no "per_prompt" field.*'
                                         "--responses="):
        ifeval_seeds.load_run(str(old))


def test_arm_and_seed_come_from_the_flags_or_the_model_path(tmp_path):
    ident = ifeval_seeds.run_identity
    assert ident("runs/cp/seed2/rubric_sft/export/policy") == {
        "arm": "rubric_sft", "seed": 2, "source": {"arm": "model path", "seed": "model path"}}
    assert ident("runs/cp/seed2/gold/export/policy/", "gold", 2)["source"] == {
        "arm": "flag", "seed": "flag"}
    assert ident(None, "gold", 0) == {"arm": "gold", "seed": 0,
                                      "source": {"arm": "flag", "seed": "flag"}}
    assert ident("smollm2-135m-instruct") == {"arm": None, "seed": None,
                                              "source": {"arm": None, "seed": None}}
    with pytest.raises(ValueError, match="--run_seed=1 contradicts the model path"):
        ident("runs/cp/seed2/gold/export/policy", "", 1)
    # Grouping: a table per arm; runs whose arm is not known go together, named by their
    # directories; P_0's own run (no "paired") is in none.
    rows = [{"key": i} for i in range(5)]
    rng = np.random.default_rng(3)
    v = [_verdicts(rng, [1] * 5, 0.5) for _ in range(4)]
    base = _baseline_file(tmp_path / "p0" / "responses.jsonl")
    (tmp_path / "p0" / "report.json").write_text(json.dumps(
        {"kind": "ifeval", **ifeval.report(v[0], n_boot=10)}))
    a = _write_run(tmp_path / "a", rows, v[0], v[1], base, model="m1")
    b = _write_run(tmp_path / "b", rows, v[0], v[2], base, model="m2")
    c = _write_run(tmp_path / "c", rows, v[0], v[3], base, arm="rubric_sft", seed=0)
    groups = ifeval_seeds.paired_runs_by_arm([str(tmp_path / "p0"), str(a), str(b), str(c)])
    assert groups == {None: [str(a), str(b)], "rubric_sft": [str(c)]}
    assert [ifeval_seeds.seeds_file_name(k) for k in groups] == [
        "ifeval-seeds.md", "ifeval-seeds-rubric_sft.md"]
    text = ifeval_seeds.markdown(ifeval_seeds.summarize(
        [ifeval_seeds.load_run(d) for d in groups[None]]))
    assert text.startswith("# IFEval across seeds: arm not recorded")
    assert "| metric | P_0 [95% CI, prompts] | a | b |" in text
    assert "| a | `" in text and "- (not known), - (not known)" in text


def test_eval_ifeval_records_what_pooling_needs_and_report_writes_the_table(shared_file,
                                                                            tmp_path):
    """End to end on the first 12 IFEval rows: two seeds of arm "gold" scored by
    eval_ifeval (--responses, --arm, --run_seed) against one P_0 file, then
    experiments.report over P_0's run and both: ifeval-seeds-gold.md lists both seeds, each
    with the paired difference its own report.json holds."""
    data = shared_file("data", "ifeval", "input_data.jsonl")
    rows = ifeval.read_rows(str(data), limit=12)
    answers = {"p0": ["Sure."] * 12,
               "s1": [r["prompt"].lower().replace(",", "") for r in rows],
               "s2": ["*one* *two* *three*\n* a\n* b\n* c"] * 12}
    for name, ys in answers.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(
            json.dumps({"prompt": r["prompt"], "response": y}) + "\n" for r, y in zip(rows, ys)))
    base = tmp_path / "p0.jsonl"
    dirs = {"p0": tmp_path / "ifeval_p0"}
    run_module("experiments.eval_ifeval", f"--responses={base}", f"--out={dirs['p0']}",
               f"--data={data}", "--n_boot=100", timeout=300)
    for s in (1, 2):
        dirs[s] = tmp_path / f"ifeval_gold_s{s}"
        run_module("experiments.eval_ifeval", f"--responses={tmp_path / f's{s}.jsonl'}",
                   f"--baseline={base}", "--arm=gold", f"--run_seed={s}", f"--out={dirs[s]}",
                   f"--data={data}", "--n_boot=100", timeout=300)
    reps = {s: json.loads((dirs[s] / "report.json").read_text()) for s in (1, 2)}
    judged_p0 = ifeval.judge(rows, answers["p0"])
    for s, rep in reps.items():
        assert rep["run"] == {"arm": "gold", "seed": s, "source": {"arm": "flag", "seed": "flag"}}
        assert rep["per_prompt"] == ifeval.per_prompt(rows, ifeval.judge(rows, answers[f"s{s}"]))
        assert rep["paired"]["baseline_per_prompt"] == ifeval.per_prompt(rows, judged_p0)
        assert rep["paired"]["baseline_sha256"] == ifeval.file_sha256(str(base))
    out = tmp_path / "results"
    run_module("experiments.report", str(dirs["p0"]), str(dirs[1]), str(dirs[2]),
               f"--out={out}", timeout=120)
    text = (out / "ifeval-seeds-gold.md").read_text()
    assert "2 runs, every run given" in text
    diff_rows = {k: [x for x in text.splitlines() if x.startswith(f"| {k} | ")][-1]
                 for k in ifeval.METRICS}  # each metric's second row: its differences
    for s, rep in reps.items():
        assert f"seed {s} (`{dirs[s]}`)" in text
        for k, row in diff_rows.items():
            d = rep["paired"][k]
            lo, hi = d["ci95"]
            assert row.split(" | ")[s] == f"{d['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    assert "ifeval-seeds-gold.md" in (out / "README.md").read_text()
    assert not (out / "ifeval-seeds.md").exists()
