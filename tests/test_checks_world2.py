"""World v2 of the checks world (METHOD 13; issue 40): the calibrated pool and inputs that
never lose a constraint. Host-side only: SmolLM2's tokenizer, no model weights."""
import json
import os

import numpy as np
import pytest

from drubric_jax.rounds.settings import data_spec
from drubric_jax.checks import fit, pool, validate, world
from drubric_jax.checks.schema import check_lines
from drubric_jax.data.schema import PromptItem
from drubric_jax.evaluator import check_rubrics
from drubric_jax.rounds.phases import policy_prompt_ids
from drubric_jax.text import tokenizer as tok_lib
from drubric_jax.text.budget import fit_prompt
from drubric_jax.checks import world_data as make_checks_data
from drubric_jax.evaluation import checks_calibration as calibrate_checks

K, N_TOKENS, POLICY_BUDGET, GEN_BUDGET = 8, 64, 128, 1536


@pytest.fixture(scope="module")
def tok():
    from drubric_jax.models import load_tokenizer
    return load_tokenizer("smollm2-135m-instruct")


def _bases(n, long_every=0):
    out = []
    for i in range(n):
        text = f"Tell me about topic number {i} in a few words."
        if long_every and i % long_every == 0:
            # Distinct texts: the builder skips a repeated base prompt before measuring it.
            text = f"City {i}. " + " ".join(["Describe the history of the city and its "
                                              "people."] * 30)
        out.append(PromptItem(id=f"b{i}", source="t", prompt=text))
    return out


SMALL_POOL = [pool.variant_of("punctuation:no_comma"),
              pool.variant_of("detectable_format:title"),
              pool.variant_of("length_constraints:number_words[num_words=20..40,"
                              "relation=less than]")]


def test_no_constraint_is_cut_from_a_role_input(tok):
    ids = tuple(dict.fromkeys(v.check for v in SMALL_POOL))
    render = fit.generator_render(tok, check_lines(ids), 3)

    def fits(prompt):
        return (fit.policy_prompt_tokens(tok, prompt) <= POLICY_BUDGET and
                fit.generator_keeps_prompt(tok, prompt, k=K, response_tokens=N_TOKENS,
                                           budget=GEN_BUDGET, render=render,
                                           keep_prompt=True)[0])

    # Every third base prompt is ~300 tokens: the builder must skip each of them.
    stats = {}
    rows = make_checks_data.make_rows_v2(_bases(60, long_every=3), 0,
                                         {"policy": 12, "heldout": 8}, SMALL_POOL,
                                         n_calibration=10, fits=fits, stats=stats)
    assert stats["cut"] >= 1
    long_response = " ".join(["word"] * 200)  # cut to N_TOKENS tokens below
    resp = tok.decode(tok.encode(long_response, add_special_tokens=False)[:N_TOKENS])
    for row in rows["policy"] + rows["heldout"]:
        sentences = [check_rubrics.checks.render(t["check"], t["args"])
                     for t in row["meta"]["checks"]]
        # The policy sees every constraint sentence: the real prompt renderer at its budget.
        seen = tok.decode(policy_prompt_ids(tok, row["prompt"], [], POLICY_BUDGET))
        assert all(s in seen for s in sentences), row["id"]
        # The generator's fitted input keeps the prompt whole next to K longest responses
        # (`generator.keep_prompt`, as the run's RubricGenerator fits it).
        fitted = fit_prompt(tok, lambda p, h, r: tok_lib.chat_ids(
            tok, check_rubrics.messages(p, r, h, max_items=3, pool=ids)), row["prompt"],
            [], [resp] * K, max_tokens=GEN_BUDGET, keep_prompt=True)
        assert not fitted.prompt_cut and fitted.prompt == row["prompt"], row["id"]
        assert all(s in fitted.prompt for s in sentences)
    # The run's data check refuses a row a role would cut, naming the file, row and field.
    bad = PromptItem(id="x/long", source="t", prompt=_bases(1, long_every=1)[0].prompt +
                     "\n\nIn your entire response, refrain from the use of any commas.")
    with pytest.raises(ValueError, match=r"train\.jsonl:1: row 'x/long': field 'prompt'.*"
                                         r"max_prompt_tokens=128"):
        fit.check_rows_fit([bad], tok, policy_budget=POLICY_BUDGET, where="train.jsonl")
    # Within the policy's budget but over the generator's: refused for the generator.
    mid = PromptItem(id="x/mid", source="t", prompt=" ".join(["Describe the city."] * 20))
    assert fit.policy_prompt_tokens(tok, mid.prompt) <= POLICY_BUDGET
    for keep in (False, True):
        with pytest.raises(ValueError, match=r"row 'x/mid'.*input_budget=400"):
            fit.check_rows_fit([mid], tok, policy_budget=POLICY_BUDGET, where="f",
                               generator=dict(k=K, response_tokens=N_TOKENS, budget=400,
                                              render=render, keep_prompt=keep))
    assert fit.check_rows_fit(rows["policy"], tok, policy_budget=POLICY_BUDGET, where="f",
                              generator=dict(k=K, response_tokens=N_TOKENS, budget=GEN_BUDGET,
                                             render=render, keep_prompt=True))["rows"] == 12


def test_calibration_prompts_never_train_or_heldout():
    bases = _bases(50)
    cal = {b.id for b in make_checks_data.calibration_bases(bases, 0, 10)}
    rows = make_checks_data.make_rows_v2(bases, 0, {"policy": 25, "heldout": 15}, SMALL_POOL,
                                         n_calibration=10)
    used = {r["meta"]["base_id"] for s in rows.values() for r in s}
    assert len(cal) == 10 and not cal & used
    with pytest.raises(ValueError, match="ran out of base prompts"):
        make_checks_data.make_rows_v2(bases, 0, {"policy": 30, "heldout": 15}, SMALL_POOL,
                                      n_calibration=10)


def test_calibrated_pool_is_read_from_its_table(tmp_path):
    labels = [v.label for v in pool.CANDIDATES[:6]]
    passes = [0, 2, 4, 26, 44, 60]  # of 64 samples: kept 4, 26 and 44 (band [0.05, 0.70])
    rates = [p / 64 for p in passes]
    done = {}
    for label, n_pass in zip(labels, passes):
        flat = np.zeros(64)
        flat[:n_pass] = 1
        done[label] = {"passed": flat.reshape(8, 8).tolist(), "truncated": [False] * 64}
    table = calibrate_checks.summarize(done, [0.05, 0.70], n_boot=200, seed=0)
    assert table["kept"] == labels[2:5]
    for row, r in zip(table["rows"], rates):
        assert row["rate"] == r  # exact: k / 64 of 0/1 values
        assert row["ci"][0] <= row["rate"] <= row["ci"][1]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(table))
    kept = pool.load_pool(str(path))
    assert [v.label for v in kept] == labels[2:5]
    # The builder draws only the pool's variants, with arguments inside their ranges.
    rows = make_checks_data.make_rows_v2(_bases(40), 3, {"policy": 20, "heldout": 10}, kept,
                                         checks=(1, 3), n_calibration=5)
    for row in rows["policy"] + rows["heldout"]:
        assert 1 <= len(row["meta"]["checks"]) <= 3
        for t in row["meta"]["checks"]:
            validate(t["check"], t["args"])
            assert any(pool.matches(v, t["check"], t["args"]) for v in kept), t
            assert pool.label_of(t["check"], t["args"], kept) in labels[2:5]
        assert row["prompt"] == world.compose_prompt(row["meta"]["base_prompt"],
                                                     row["meta"]["checks"])
    # The config reads the pool's check ids from the same table.
    from configs.smollm2_cpu import pool_ids
    assert pool_ids(str(path)) == tuple(dict.fromkeys(v.check for v in kept))
    # Bad tables: the file and the field are named.
    path.write_text(json.dumps({"version": 1, "kept": ["no_such:check"]}))
    with pytest.raises(ValueError, match=r"calibration\.json: field 'kept' entry 0"):
        pool.load_pool(str(path))
    path.write_text(json.dumps({"version": 1, "kept": []}))
    with pytest.raises(ValueError, match="field 'kept'"):
        pool.load_pool(str(path))
    with pytest.raises(FileNotFoundError, match="experiments.calibrate_checks"):
        pool.load_pool(str(tmp_path / "missing.json"))


def test_every_candidate_draws_valid_arguments():
    for i, v in enumerate(pool.CANDIDATES):
        for j in range(5):
            args = v.draw(np.random.default_rng([i, j]), prompt="Write a poem.")
            validate(v.check, args)
    assert len({v.label for v in pool.CANDIDATES}) == len(pool.CANDIDATES)
    assert "combination:repeat_prompt" not in {v.check for v in pool.CANDIDATES}


def test_generator_format_names_only_the_pool():
    from drubric_jax.evaluator.rubric_formats import get_format

    ids = ("punctuation:no_comma", "detectable_format:title")
    fmt = get_format("checks", ids)
    system = fmt.messages("x", ["a", "b"], None, max_items=3)[0]["content"]
    assert "punctuation:no_comma" in system and "startend:quotation" not in system
    schema = fmt.schema(3, 100)
    consts = {a["properties"]["check"]["const"]
              for a in schema["properties"]["rubrics"]["items"]["anyOf"]}
    assert consts == set(ids)
    out = fmt.parse(json.dumps({"rubrics": [
        {"check": "startend:quotation", "args": {}, "weight": 2},
        {"check": "punctuation:no_comma", "args": {}, "weight": 3}]}), "stop", 3)
    assert out.weights == [3] and out.counters["invalid_check"] == 1
    with pytest.raises(ValueError, match="check_pool"):
        get_format("checks", ("nope",))


def test_world_v2_run_stops_before_its_files_exist(tmp_path):
    from configs.smollm2_cpu import get_config
    from drubric_jax import data

    c = get_config(f"world=checks,tiny,checks_dir={tmp_path}/w")
    assert c.data.checks_world_version == 2 and c.data.refuse_cut_constraints
    with pytest.raises(FileNotFoundError, match=r"make_checks_data --version=2 "
                                                r"--out=.*/w") as e:
        data.check_data_sources(data_spec(c))
    # Every command that builds the world: the prompts, then the four splits' anchor lists.
    for split in ("gen_sft", "gen_rl", "dev", "heldout"):
        assert (f"make_checks_anchors --split={split} --prompts={tmp_path}/w/{split}.jsonl "
                f"--out={tmp_path}/w/{split}_anchors.jsonl") in str(e.value)
    c1 = get_config(f"world=checks,world_version=1,checks_dir={tmp_path}/w1")
    assert c1.data.checks_world_version == 1 and not c1.data.refuse_cut_constraints
    assert c1.lora.rank == 0 and c1.policy.max_prompt_tokens == 128


@pytest.mark.skipif(not os.path.exists(os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "checks_world_v2",
    "calibration.json")), reason="no calibration table in results/checks_world_v2")
def test_committed_calibration_table_loads():
    from configs.smollm2_cpu import V2_POOL, pool_ids

    kept = pool.load_pool(V2_POOL)
    table = json.loads(open(V2_POOL).read())
    band = table["band"]
    for row in table["rows"]:
        assert row["kept"] == (band[0] <= row["rate"] <= band[1])
    assert [v.label for v in kept] == table["kept"] and pool_ids()
