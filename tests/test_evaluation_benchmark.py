"""End-to-end tests of drubric_jax.evaluation.benchmark.evaluate on the tiny random model
(real tokenizer): pairwise, RM-Bench, listwise and history rows; report / trace outputs; the
random floor's determinism; file:line:field errors."""
import json
import os

import pytest

from configs import eval_evaluator as cfg_lib
from drubric_jax.evaluation import benchmark, judges

FILES = ("judgebench/gpt.jsonl", "rm_bench/chat.jsonl", "alpaca_eval_listwise/test.jsonl",
         "hh_rlhf_harmless/test.jsonl")


@pytest.fixture(scope="module")
def loader():
    """One model loader for the module: the tiny model is built once."""
    return benchmark.ModelLoader()


def _config(data, **overrides):
    c = cfg_lib.get_config("tiny")
    c.data = data
    c.progress = False
    for k, v in overrides.items():
        setattr(c, k, v)
    return c


# ~40 s on 2 cores: every test that uses it is marked slow.
@pytest.fixture(scope="module")
def e2e(shared_file, smollm2_gguf, tmp_path_factory, loader):
    paths = [str(shared_file("data", *f.split("/"))) for f in FILES]
    workdir = str(tmp_path_factory.mktemp("eval"))
    config = _config(",".join(paths), max_rows=2, max_k=4, calibration="contextual",
                     methods="dynamic,static,direct,direct_set,random")
    return paths, workdir, benchmark.evaluate(config, workdir, loader, command="cmd --x=1")


RUBRIC_NAMES = [f"{m}_{v}" for m in ("dynamic", "static")
                for v in ("hard", "soft", "hard_ctx", "soft_ctx")]


def _in01(x):
    return 0.0 <= x <= 1.0


@pytest.mark.slow
def test_report_fields_and_ranges(e2e):
    paths, workdir, report = e2e
    with open(os.path.join(workdir, "report.json")) as f:
        on_disk = json.load(f)
    assert on_disk["total_rows"] == report["total_rows"] == 8
    assert on_disk["command"] == "cmd --x=1" and on_disk["wall_s"] > 0
    assert on_disk["config"]["n_samples"] == 2
    assert on_disk["s_per_row"] > 0
    for path in paths:
        section = on_disk["files"][path]
        assert section["n_rows"] == 2 and section["s_per_row"] > 0
        methods = section["methods"]
        for m in RUBRIC_NAMES + ["direct", "direct_set", "random"]:
            entry = methods[m]
            for key in ("strict_acc", "acc_ties_excluded", "tie_rate", "top1", "ndcg"):
                assert len(entry[key]["per_sample"]) == 2
                assert entry[key]["std"] == "nan" or entry[key]["std"] >= 0
                if key != "acc_ties_excluded":  # nan when every pair is a predicted tie
                    lo, hi = entry[key]["ci95"]
                    assert _in01(entry[key]["mean"]) and 0 <= lo <= hi <= 1
            assert -1 <= entry["delta_gap"]["mean"] <= 1
            assert section["timing"][m]["s_per_row"] >= 0
            if m in RUBRIC_NAMES:
                assert _in01(entry["parse_failure_rate"])
                assert _in01(entry["invalid_item_rate"])
                assert entry["counters"]["lists"] == 4
        # the verdict variants of one evaluator come from one pass: same seconds
        assert len({section["timing"][m]["s_per_row"] for m in RUBRIC_NAMES[:4]}) == 1
        # strict accuracy never exceeds ties-excluded accuracy
        for entry in methods.values():
            if entry["acc_ties_excluded"]["mean"] != "nan":
                assert entry["strict_acc"]["mean"] <= entry["acc_ties_excluded"]["mean"] + 1e-9
        assert set(section["differences"]) == {
            f"{m}_{a} - {m}_{b}" for m in ("dynamic", "static")
            for a, b in (("soft", "hard"), ("hard_ctx", "hard"), ("soft_ctx", "soft"))}
    pair = on_disk["files"][paths[0]]["methods"]
    for name in judges.PAIRWISE_VARIANTS:
        assert _in01(pair[name]["strict_acc"]["mean"])
    assert _in01(pair["direct_pairwise_avg"]["first_position_win_rate"])
    rm = on_disk["files"][paths[1]]["methods"]["dynamic_hard"]
    for split in ("rmbench_hard", "rmbench_normal", "rmbench_easy", "rmbench_all"):
        assert _in01(rm[split]["mean"])
    assert "direct_pairwise_ab" not in on_disk["files"][paths[2]]["methods"]
    assert [on_disk["files"][p]["listwise"] for p in paths] == [False, True, True, False]
    macro = on_disk["macro"]
    assert macro["dynamic_soft"]["strict_acc"]["n_files"] == 4
    assert macro["dynamic_soft"]["top1"]["n_files"] == 2  # listwise files only
    assert macro["direct_pairwise_avg"]["strict_acc"]["n_files"] == 2
    mean = sum(on_disk["files"][p]["methods"]["random"]["strict_acc"]["mean"]
               for p in paths) / 4
    assert macro["random"]["strict_acc"]["mean"] == pytest.approx(mean, abs=1e-12)
    assert "dynamic_soft - dynamic_hard" in on_disk["macro_differences"]


def test_results_markdown_and_plot(e2e, tmp_path):
    from drubric_jax.evaluation import results

    paths, workdir, _ = e2e
    with open(os.path.join(workdir, "report.json")) as f:
        reports = {workdir: json.load(f)}
    text = results.results_markdown(reports)
    assert "`cmd --x=1`" in text and "## Macro average over files" in text
    for path in paths:
        assert results._name(path) in text
    assert text.count("- **") == 4  # one chance statement per file
    results.plot(reports, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_chance_statement_reads_the_interval():
    from drubric_jax.evaluation import results

    def e(mean, lo, hi):
        return {"mean": mean, "ci95": [lo, hi]}

    section = {"n_rows": 9, "listwise": True, "methods": {
        "random": {"strict_acc": e(0.5, 0.4, 0.6), "top1": e(0.25, 0.1, 0.4),
                   "ndcg": e(0.8, 0.7, 0.9)},
        "a": {"strict_acc": e(0.7, 0.55, 0.8), "top1": e(0.3, 0.2, 0.5), "ndcg": e(0.85, 0.8, 0.9)},
        "b": {"strict_acc": e(0.2, 0.1, 0.3), "top1": e(0.0, 0.0, 0.0), "ndcg": e("nan", "nan",
                                                                                 "nan")}}}
    line = results.chance_statement("f", section)
    assert "strict pairwise accuracy (chance 0.50) - above chance: a; below chance: b" in line
    assert "top-1 (chance 0.25) - at chance: a; below chance: b" in line
    assert "nDCG (chance 0.80) - at chance: a; undefined: b" in line


@pytest.mark.slow
def test_trace_files_written(e2e):
    paths, workdir, _ = e2e
    with open(os.path.join(workdir, "trace.jsonl")) as f:
        records = [json.loads(line) for line in f]
    # 4 files x 2 rows x 5 evaluators x 2 samples
    assert len(records) == 4 * 2 * 5 * 2
    dyn = [r for r in records if r["method"] == "dynamic"]
    for r in dyn:
        k = len(r["gold_ranks"])
        assert set(r["variant_scores"]) == {"hard", "soft", "hard_ctx", "soft_ctx"}
        assert all(len(v) == k for v in r["variant_scores"].values())
        assert k == len(r["verdicts"]) == len(r["p_yes"]) == len(r["p_yes_ctx"])
        assert sorted(r["order"]) == list(range(k))
        assert all(len(v) == len(r["items"]) for v in r["verdicts"])
        assert all(1 <= w <= 5 for _, w in r["items"])
    listwise = [r for r in records if r["file"] == paths[2]]
    assert all(len(r["gold_ranks"]) == 4 for r in listwise)  # max_k = 4
    history = [r for r in records if r["file"] == paths[3]]
    assert history
    with open(os.path.join(workdir, "trace.html"), encoding="utf-8") as f:
        page = f.read()
    assert page.startswith("<!doctype html>") and "gold rank" in page
    assert "<script" not in page.replace("&lt;script", "")


def test_random_method_deterministic_given_seed(shared_file, smollm2_gguf, tmp_path, loader):
    path = str(shared_file("data", *FILES[0].split("/")))
    runs = []
    for i, seed in enumerate((5, 5, 6)):
        c = _config(path, max_rows=4, methods="random", seed=seed)
        report = benchmark.evaluate(c, str(tmp_path / str(i)), loader)
        runs.append(report["files"][path]["methods"]["random"])
    assert runs[0] == runs[1]
    assert runs[0]["delta_gap"] != runs[2]["delta_gap"]


def test_bad_row_names_file_line_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"id": "a", "source": "t:t", "prompt": "p", "responses": ["x", "y"],
            "ranking": [0, 1]}
    bad = dict(good, id="b", ranking=[0, 0])
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: field 'ranking'"):
        benchmark.load_rows(str(path), 0, 0)
    with pytest.raises(ValueError, match=r"config\.methods"):
        cfg_lib.validate(_config(str(path), methods="dynamic,bogus"))
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(dict(good, responses=["x"], ranking=[0])) + "\n")
    with pytest.raises(ValueError, match=r"one\.jsonl:1: field 'responses'"):
        benchmark.load_rows(str(one), 0, 0)


def test_shared_switch_lists_every_ranked_file(shared_dir):
    """`:shared` covers every pairwise and listwise file of ../shared/data, and no other."""
    ranked = set()
    for path in (shared_dir / "data").glob("*/*.jsonl"):
        with open(path, encoding="utf-8") as f:
            if json.loads(f.readline()).get("responses"):
                ranked.add(f"{path.parent.name}/{path.name}")
    assert set(cfg_lib.SHARED_FILES) == ranked
    c = cfg_lib.get_config("shared")
    cfg_lib.validate(c)  # every path exists
    assert len(c.data.split(",")) == len(ranked) and c.max_rows % c.rows_per_batch == 0
