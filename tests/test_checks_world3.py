"""Checks world III: the oracle generator's reward (`rl.rule_rewards.checks_oracle`), the
generator's supervised warm start G_sft (`rl.sft`, `checks.sft_data`,
`evaluation.checks_sft`, `rounds.sft_stage`, `experiments.sft_generator`), and world v2's
five disjoint prompt splits, each stage reading its own (`data.splits`; issue 53)."""
import json
import os
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax import models
from drubric_jax.checks import gold_score
from drubric_jax.checks.pool import load_pool
from drubric_jax.checks.sft_data import SFT_WEIGHT, sft_examples, target_json
from drubric_jax.checks.world import draw_from_pool
from drubric_jax.rl import rule_rewards, sft
from drubric_jax.rl.train_config import TrainConfig
from helpers import run_module
from tolerances import logprob_atol

from configs.checks_world import V2_POOL, pool_ids

RESPONSES = [
    "", "Hello.", "I LOVE THIS. IT IS GREAT AND BIG.", "P.S. see you soon",
    "* one\n* two\n* three", "My answer is yes.", "First paragraph.\n\n***\n\nSecond one.",
    "Dear [name], this is a letter with [address] in it, and commas, many, many.",
    "Response 1\n******\nResponse 2", "The quick brown fox jumps over the lazy dog. " * 6,
    "Das ist eine Antwort auf Deutsch, mit vielen Worten und Sätzen.",
    "*highlighted* part and *another* one. It ends here. It does. Really.",
]


def _pool_draws(n: int, seed: int, max_checks: int = 3) -> list:
    pool = load_pool(V2_POOL)
    rng = np.random.default_rng(seed)
    return [draw_from_pool("Write about the sea.", rng, pool, 1, max_checks) for _ in range(n)]


def _item(checks, i=0):
    return types.SimpleNamespace(id=f"x/{i}", source="test", meta={"checks": checks})


def test_oracle_rubric_reward_equals_gold():
    """On the oracle's lists (always valid: >= 1 true check, weights in 1..5), Eq. 12 of the
    checkers' verdicts is the fraction of true checks met: the gold score. Eq. 12 sums
    M <= 3 products in float32 and divides once, so it is within a few float32 ulps of the
    exact fraction gold_score computes in float64 (4 ulps of 1 bounds it)."""
    tol = 4 * float(np.finfo(np.float32).eps)
    seen = set()
    for i, truth in enumerate(_pool_draws(40, seed=0)):
        texts, weights = rule_rewards.oracle_list(truth)
        assert len(texts) == len(truth) and set(weights.tolist()) == {rule_rewards.ORACLE_WEIGHT}
        for y in RESPONSES:
            got = rule_rewards.checks_oracle_reward(_item(truth, i), y)
            want = gold_score(truth, y)
            assert abs(got - want) <= tol, (truth, y, got, want)
            seen.add(round(want, 3))
    # The check is not vacuous: the draws cover failing, partial and full scores.
    assert {0.0, 1.0} <= seen and len(seen) >= 4
    # Registered as a rule, and the data check requires true checks under it too.
    assert rule_rewards.make_rule("checks_oracle") is rule_rewards.checks_oracle_reward
    with pytest.raises(ValueError, match="meta.checks"):
        rule_rewards.checks_oracle_reward(types.SimpleNamespace(id="y", source="t", meta={}), "")


def _row(i, prompt, checks, k=4, line=None):
    return types.SimpleNamespace(id=f"tr/{i}", prompt=prompt, history=[], line=line or i + 1,
                                 responses=[f"answer {j} to {i}" for j in range(k)],
                                 meta={"checks": checks})


def test_sft_pairs_never_use_heldout_prompts():
    truths = _pool_draws(6, seed=1)
    train = [_row(i, f"Train prompt {i}.", t) for i, t in enumerate(truths[:4])]
    heldout = [types.SimpleNamespace(id=f"ho/{i}", prompt=f"Held-out prompt {i}.")
               for i in range(2)]
    rng = np.random.default_rng(0)
    ex = sft_examples(train, heldout, rng, pairs_per_prompt=3, pool=pool_ids(), where="a.jsonl")
    assert len(ex) == 12 and [e["id"] for e in ex[:3]] == ["tr/0"] * 3
    held_text = {h.prompt for h in heldout}
    assert not any(e["prompt"] in held_text or e["id"].startswith("ho/") for e in ex)
    for e in ex:
        assert sorted(e["order"]) == list(range(4))
        assert json.loads(e["target"])["rubrics"][0]["weight"] == SFT_WEIGHT
    # Different orders within a prompt's pairs (3 draws of 24 permutations).
    assert len({tuple(e["order"]) for e in ex}) > 4
    # A held-out prompt among the rows is refused, by id or by its text, naming the row.
    by_id = _row(9, "Another prompt.", truths[4], line=7)
    by_id.id = "ho/1"
    with pytest.raises(ValueError, match=r"a\.jsonl:7: row 'ho/1': a held-out prompt"):
        sft_examples(train + [by_id], heldout, rng, where="a.jsonl")
    by_text = _row(10, " Held-out prompt 0.\n", truths[5], line=8)
    with pytest.raises(ValueError, match=r"a\.jsonl:8: row 'tr/10': a held-out prompt"):
        sft_examples(train + [by_text], heldout, rng, where="a.jsonl")
    # A check the constrained generator cannot write (outside its pool) is refused too.
    lower = [{"check": "change_case:english_lowercase", "args": {}}]
    with pytest.raises(ValueError, match="not in the generator's check pool"):
        sft_examples([_row(11, "Lowercase prompt.", lower)], heldout, rng, pool=pool_ids())


def _tiny_tokens(cfg, lengths, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, cfg.vocab_size, n).tolist() for n in lengths]


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_sft_loss_is_the_target_tokens_nll(lora_rank):
    """sft_loss equals -mean log softmax(logits)[target] over the target tokens only,
    computed by hand from the model's full logits (prompt tokens and padding masked out).
    Rows of different input and target lengths share a batch (left / right padding)."""
    cfg, base, _ = models.load_model("tiny")
    inputs = _tiny_tokens(cfg, [5, 9], seed=0)
    targets = _tiny_tokens(cfg, [4, 2], seed=1)
    b = sft.pack_batch(inputs, targets, pad_id=0, input_bucket=12, target_bucket=6)
    tcfg = cfg.replace(lora_rank=lora_rank, lora_alpha=8.0) if lora_rank else cfg
    if lora_rank:  # non-zero adapters, so the LoRA path is exercised
        from drubric_jax.models import lora
        ad = lora.init_adapters(tcfg, base, jax.random.PRNGKey(3))
        params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(
            jax.random.PRNGKey(4), x.shape, x.dtype), ad)
        model = lora.attach(base, params)
    else:
        params = model = base
    tc = TrainConfig(beta=0.0, micro_batch_size=2, logits_chunk=4, remat=False)
    loss, m = sft.sft_loss(params, jax.tree.map(jnp.asarray, b), base,
                           model_cfg=tcfg, train_cfg=tc)
    # By hand: full logits, log-softmax in float64, the target positions only.
    positions = models.positions_from_mask(jnp.asarray(b.token_mask))
    logits, _ = models.apply(model, tcfg, jnp.asarray(b.tokens), positions,
                             token_mask=jnp.asarray(b.token_mask))
    x = np.asarray(logits, np.float64)
    logp = x - x.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    want, n = [], 0
    for r, (inp, tgt) in enumerate(zip(inputs, targets)):
        for j, tok in enumerate(tgt):
            t = 12 + j  # target token j sits at position P + j, predicted from t - 1
            want.append(-logp[r, t - 1, tok])
            n += 1
    want = np.sum(want) / n
    assert float(m["target_tokens"]) == n == 6
    assert abs(float(loss) - want) <= logprob_atol(np.asarray(want), cfg.vocab_size)
    assert float(m["nll"]) == float(loss)
    # The input tokens do not enter the loss: scoring them too changes it.
    all_mask = b.replace(target_mask=np.asarray(b.token_mask) & (np.arange(18) > 0))
    loss_all, _ = sft.sft_loss(params, jax.tree.map(jnp.asarray, all_mask.replace(
        prompt_len=0)), base, model_cfg=tcfg, train_cfg=tc)
    assert abs(float(loss_all) - want) > 1e-3


def test_pack_batch_refuses_rows_that_do_not_fit():
    with pytest.raises(ValueError, match="row 1"):
        sft.pack_batch([[5], [5, 6, 7]], [[1], [2]], 0, input_bucket=2, target_bucket=2)
    with pytest.raises(ValueError, match="row 0"):
        sft.pack_batch([[5]], [[]], 0, input_bucket=2, target_bucket=2)


def test_sft_step_lowers_the_nll_of_its_pair():
    """A few AdamW updates of LoRA adapters on one pair lower its NLL (the adapters start
    at B = 0: step 0's NLL is the base model's)."""
    cfg, base, _ = models.load_model("tiny")
    tcfg = cfg.replace(lora_rank=4, lora_alpha=8.0)
    b = sft.pack_batch(_tiny_tokens(cfg, [6], 2), _tiny_tokens(cfg, [3], 3), 0, 8, 4)
    from drubric_jax.rl.train_step import TrainState, trainable_init
    tc = TrainConfig(learning_rate=1e-2, beta=0.0, micro_batch_size=1, logits_chunk=4,
                     remat=False)
    optimizer, step = sft.make_sft_step(tcfg, tc)
    ad = trainable_init(tcfg, jax.random.PRNGKey(0), base)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=ad, opt_state=optimizer.init(ad))
    nll = []
    for _ in range(6):
        state, m = step(state, b, base)
        nll.append(float(m["nll"]))
    assert int(state.step) == 6 and nll[-1] < nll[0] - 0.1, nll


@pytest.mark.usefixtures("smollm2_gguf")
def test_sft_target_is_what_the_constrained_generator_can_write():
    """Every target's tokens are accepted, in order, by the generator's own constraint
    (the world v2 pool's JSON schema with its separators), and the grammar is complete
    after the last one: teacher forcing trains the sequence the decoder can emit."""
    from drubric_jax.evaluator.rubric_formats import get_format
    from drubric_jax.evaluator.rubric_generator import JSON_SEPARATORS
    from drubric_jax.sampling.constrained import JsonSchemaConstraint
    from drubric_jax.text import tokenizer as tok_lib

    _, _, tok = models.load_model("tiny")
    schema = get_format("checks", pool_ids()).schema(3, 100)
    schema["x-guidance"] = dict(JSON_SEPARATORS)
    con = JsonSchemaConstraint(tok, schema, 49152, int(tok_lib.stop_ids(tok)[0]))
    for truth in _pool_draws(30, seed=2):
        text = target_json(truth, pool_ids())
        con.reset(1)
        m = con.matchers[0]
        assert all(m.consume_token(t) for t in tok.encode(text, add_special_tokens=False)), text
        assert m.is_stopped() and not m.is_error(), text


def _write_world3(d):
    """A tiny world v2 (`data.splits`): the gen_sft split's anchor rows (2 prompts), the dev
    split's (2), and a held-out prompt file, each row tagged with its split."""
    truths = _pool_draws(5, seed=5, max_checks=1)
    answers = ["Yes.", "No, never.", "Maybe so. P.S. hi", "* a\n* b"]
    files = {"gen_sft_anchors": [], "dev_anchors": [], "heldout": []}
    for i, t in enumerate(truths):
        split = "gen_sft" if i < 2 else "dev" if i < 4 else "heldout"
        p = f"Say something, number {i}. {t[0]['check']}"
        row = {"id": f"{split}/{i}", "source": "cw", "prompt": p,
               "meta": {"checks": t, "split": split}}
        if split == "heldout":
            files["heldout"].append(row)
            continue
        files[f"{split}_anchors"].append(
            {**row, "responses": answers, "ranking": [0, 1, 2, 3], "ties": False,
             "scores": [gold_score(t, y) for y in answers]})
    for name, rs in files.items():
        with open(os.path.join(d, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rs)


@pytest.mark.slow
@pytest.mark.usefixtures("smollm2_gguf")
def test_sft_stage_end_to_end_resumes_and_reports(tmp_path):
    """The stage on a tiny world: recovery at step 0 and after its epoch, a checkpoint per
    update, the export, the table; a second run resumes and redoes nothing."""
    world, work = tmp_path / "world", tmp_path / "g_sft"
    world.mkdir()
    _write_world3(str(world))
    args = ["experiments.sft_generator",
            f"--config=configs/sft_generator.py:tiny,checks_dir={world}", f"--workdir={work}"]
    out = run_module(*args, timeout=600)
    rec = [json.loads(x) for x in (work / "recovery.jsonl").read_text().splitlines()]
    assert [(r["step"], r["epoch"]) for r in rec] == [(0, 0), (2, 1)]
    assert rec[1]["ids"] == ["dev/2", "dev/3"]  # recovery is measured on the dev split
    summary = json.loads((work / "summary.json").read_text())
    assert summary["kind"] == "checks_sft" and [e["step"] for e in summary["evals"]] == [0, 2]
    for r, e in zip(rec, summary["evals"]):
        f1 = e["summary"]["constraint_f1"]
        assert f1["ci"][0] <= f1["mean"] <= f1["ci"][1]
        assert f1["mean"] == pytest.approx(np.mean(r["per_row"]["constraint_f1"]))
        assert r["means"]["constraint_f1"] == pytest.approx(f1["mean"])
    steps = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all(np.isfinite(s["nll"]) for s in steps)
    assert (work / "export" / "generator" / "config.json").exists()
    assert json.loads((work / "export" / "generator" / "sft_step.json").read_text()) == {
        "step": 2}
    assert "| 2 | 1 |" in out and "| 2 | 1 |" in (work / "results.md").read_text()
    res = tmp_path / "results"
    run_module("experiments.report", str(work), f"--out={res}", timeout=120)
    assert (res / "checks_sft-g_sft.md").read_text() == (work / "results.md").read_text()
    stamp = (work / "recovery.jsonl").stat().st_mtime_ns
    run_module(*args, timeout=600)
    assert (work / "recovery.jsonl").stat().st_mtime_ns == stamp
    assert len((work / "metrics.jsonl").read_text().splitlines()) == 2
    # One more epoch resumes from the checkpoint: 2 more updates, one more evaluation, and
    # the export rewritten with the last update's adapters.
    run_module(*args, "--config.sft.epochs=2", timeout=600)
    rec = [json.loads(x) for x in (work / "recovery.jsonl").read_text().splitlines()]
    assert [(r["step"], r["epoch"]) for r in rec] == [(0, 0), (2, 1), (4, 2)]
    assert json.loads((work / "export" / "generator" / "sft_step.json").read_text()) == {
        "step": 4}
    # The exported generator scored on the dev split at two list temperatures (how the
    # rubric arms' list temperature is chosen): the stage's dev rows, nothing trained.
    out = run_module(*args, "--dev_temperatures=0,1", timeout=600)
    dev = json.loads((work / "dev_temperatures.json").read_text())
    assert set(dev) == {"0.0", "1.0"}
    for d in dev.values():
        assert d["ids"] == ["dev/2", "dev/3"] and d["rows"] == 2
        assert d["ci"][0] <= d["constraint_f1"] <= d["ci"][1]
    assert "dev lists at temperature 1.0" in out
    assert len((work / "metrics.jsonl").read_text().splitlines()) == 4  # nothing trained
    # More training prompts than anchor rows stops before any weight loads, naming the
    # command that extends the file.
    with pytest.raises(AssertionError, match="--limit=5"):
        run_module(*args[:2], f"--workdir={tmp_path / 'more'}", "--config.sft.train_rows=5",
                   timeout=300)
    assert not (tmp_path / "more").exists()
    # A missing world file stops at once, naming the command that builds it.
    os.remove(world / "dev_anchors.jsonl")
    with pytest.raises(AssertionError, match="make_checks_anchors"):
        run_module(*args[:2], f"--workdir={tmp_path / 'other'}", timeout=300)


def test_sft_config_validates_and_names_the_field():
    from configs import sft_generator
    from drubric_jax.rounds.sft_stage import check_sft_config
    from drubric_jax.types import ConfigError

    c = sft_generator.get_config("")
    check_sft_config(c.sft)
    assert c.generator.check_pool and c.data.checks_world_version == 2
    c.sft.epochs = 0
    with pytest.raises(ConfigError, match="config.sft.epochs"):
        check_sft_config(c.sft)
    c = sft_generator.get_config("tiny")
    c.sft.eval_temperature = -1.0
    with pytest.raises(ConfigError, match="config.sft.eval_temperature"):
        check_sft_config(c.sft)
    with pytest.raises(ValueError, match="world_version=2"):
        sft_generator.get_config("world_version=1")


def test_list_recovery_keeps_the_masked_items_and_scores_them_by_hand():
    """`check_rubrics.list_recovery`, the loop the held-out F1 of G_sft and of the ablation
    share: masked-out items are dropped; with arguments 1 of 2 kept items matches 1 of 2
    true checks (P = R = F1 = 1/2); on ids alone both match (F1 = 1); nothing kept
    scores 0 (METHOD 11)."""
    from drubric_jax.evaluator.check_rubrics import item_text, list_recovery

    words = "length_constraints:number_words"
    texts = [item_text(words, {"relation": "less than", "num_words": 50}),
             item_text("detectable_format:title", {}),
             item_text("punctuation:no_comma", {})]
    truth = [{"check": words, "args": {"relation": "less than", "num_words": 60}},
             {"check": "detectable_format:title", "args": {}}]
    items, prf = list_recovery(texts, [True, True, False], truth)
    assert items == [(words, {"relation": "less than", "num_words": 50}),
                     ("detectable_format:title", {})]
    assert prf == (0.5, 0.5, 0.5, 1.0)
    assert list_recovery(texts, [False] * 3, truth) == ([], (0.0, 0.0, 0.0, 0.0))
    with pytest.raises(ValueError):
        list_recovery(texts, [True] * 3, [])


# ----------------------------------------------------------------------------- splits


def _anchors_of(rows_path, out_path):
    """Anchor rows of a split's prompt file without a model: the helpers' fixed responses
    (enough of them pass the anchor filter) ranked by their gold score, the prompt row's id,
    text and meta (split included), as make_checks_anchors writes them."""
    from drubric_jax.data import load_jsonl
    from helpers import ANSWERS

    with open(out_path, "w", encoding="utf-8") as f:
        for r in load_jsonl(rows_path):
            g = [gold_score(r.meta["checks"], y) for y in ANSWERS]
            f.write(json.dumps({"id": r.id, "source": r.source, "prompt": r.prompt,
                                "responses": ANSWERS, "scores": g,
                                "ranking": sorted(range(len(g)), key=lambda j: -g[j]),
                                "meta": r.meta}) + "\n")


def test_prompt_splits_are_disjoint(tmp_path, smollm2_tokenizer):
    """World v2's builder on small synthetic source files: five splits, one file each,
    pairwise disjoint by prompt text and by base prompt (two sources' rows that differ only
    in case and punctuation are one base prompt: it lands in one split at most), every row
    tagged with its split, the manifest listing each split's rows and seed, the same seed
    byte-identical; then a stage given another stage's split stops, naming the file, the
    row, the split it found and the split it wanted."""
    from configs.smollm2_cpu import get_config
    from drubric_jax.checks import world_data
    from drubric_jax.data import check_data_sources, load_data, load_jsonl, splits
    from drubric_jax.evaluation.checks_policy import heldout_setup
    from drubric_jax.rounds import gold_curve
    from drubric_jax.rounds.settings import data_spec
    from drubric_jax.rounds.settings import read as read_settings
    from drubric_jax.rounds.sft_stage import read_sft_rows
    from experiments.make_checks_anchors import check_prompt_split

    topics = ["rivers", "bread", "chess", "owls", "tides", "maps", "bees", "clocks", "salt",
              "kites", "glass", "moss", "caves", "wool", "rain", "ink", "trams", "figs",
              "coral", "lamps", "sand", "bells", "frost", "yarn", "ferns", "boats", "tea",
              "dunes", "reeds", "wells", "hives", "forts", "comets", "pears", "sleds"]
    src_a, src_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    src_a.write_text("".join(json.dumps({"id": f"a/{i}", "source": "t:a", "prompt":
                                         f"Tell me about {w} in a few words."}) + "\n"
                             for i, w in enumerate(topics)), encoding="utf-8")
    # The same requests as a/0..a/4, reworded only in case and punctuation.
    src_b.write_text("".join(json.dumps({"id": f"b/{i}", "source": "t:b", "prompt":
                                         f"tell me about {w.upper()} in a few words!"}) + "\n"
                             for i, w in enumerate(topics[:5])), encoding="utf-8")
    sizes = {"gen_sft": 6, "gen_rl": 4, "policy": 5, "dev": 3, "heldout": 7}
    kw = dict(seed=3, version=2, sources=[str(src_a), str(src_b)], shared_dir=str(tmp_path),
              pool=V2_POOL, n_calibration=4, sizes=sizes, tokenizer=smollm2_tokenizer)
    m = world_data.make(str(tmp_path / "w"), **kw)
    world_data.make(str(tmp_path / "w2"), **kw)
    for s in splits.SPLITS + ("manifest",):
        name = "manifest.json" if s == "manifest" else splits.prompt_file(s)
        assert (tmp_path / "w" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()
    assert list(m["splits"]) == list(splits.SPLITS)
    rows = {}
    for s in splits.SPLITS:
        entry = m["splits"][s]
        assert entry["rows"] == sizes[s] and entry["seed"] == 3
        assert entry["file"] == f"{s}.jsonl"
        rows[s] = load_jsonl(tmp_path / "w" / entry["file"])
        assert len(rows[s]) == sizes[s]
        assert all(r.meta["split"] == s and r.id.startswith(f"checks_world/{s}/")
                   for r in rows[s])
    # The reported held-out split comes first in the seed's order (`splits.CUT_ORDER`).
    assert m["splits"]["heldout"]["positions"][0] == 0
    calibration = {splits.base_key(b.prompt) for b in world_data.calibration_bases(
        world_data.base_prompts([str(src_a), str(src_b)], 300), 3, 4)}
    for i, a in enumerate(splits.SPLITS):
        text_a = {r.prompt for r in rows[a]}
        base_a = {splits.base_key(r.meta["base_prompt"]) for r in rows[a]}
        assert len(base_a) == len(rows[a]) and not base_a & calibration
        for b in splits.SPLITS[i + 1:]:
            assert not text_a & {r.prompt for r in rows[b]}, (a, b)
            assert not base_a & {splits.base_key(r.meta["base_prompt"]) for r in rows[b]}, (a, b)
    # Both spellings of a request were available; at most one of them was used, and the
    # builder counted the other it met.
    used = [r.meta["base_id"] for s in splits.SPLITS for r in rows[s]]
    pairs = [(f"a/{i}", f"b/{i}") for i in range(5)]
    assert all(not (x in used and y in used) for x, y in pairs)
    assert m["base_prompts"].get("near_duplicate", 0) >= 1
    # check_disjoint refuses a base prompt in two splits.
    raw = {s: [{"id": r.id, "prompt": r.prompt, "meta": r.meta} for r in rows[s]]
           for s in ("dev", "heldout")}
    raw["dev"].append({"id": "x", "prompt": "Other text.", "meta": dict(
        raw["heldout"][0]["meta"], split="dev")})
    with pytest.raises(ValueError, match="share a base prompt"):
        splits.check_disjoint(raw)

    # Each stage reads its own split. The anchor lists of the four anchored splits:
    w = tmp_path / "w"
    for s in splits.ANCHORED:
        _anchors_of(w / splits.prompt_file(s), w / splits.anchor_file(s))
    c = get_config(f"world=checks,tiny,checks_dir={w}")
    c.data.heldout_anchor_rows = 2
    check_data_sources(data_spec(c))  # every file its stage's split: passes

    def refused(found, wanted, path):
        return (rf"{re.escape(str(path))}:1: row 'checks_world/{found}/[^']+': field "
                rf"'meta\.split' is '{found}', but .* reads the '{wanted}' split")

    # The policy's RL given the held-out prompts (a path overridden by hand).
    bad = c.copy_and_resolve_references()
    bad.data.prompt_paths = (str(w / "heldout.jsonl"),)
    with pytest.raises(splits.SplitError, match=r"config\.data\.prompt_paths\[0\]: "
                       + refused("heldout", "policy", w / "heldout.jsonl")):
        check_data_sources(data_spec(bad))
    # The loader refuses it too (rows named by their place among those read).
    with pytest.raises(splits.SplitError, match=re.escape(str(w / "heldout.jsonl")) +
                       r": row 1 read: row 'checks_world/heldout/[^']+': field 'meta\.split' "
                       r"is 'heldout', but the policy's RL reads the 'policy' split"):
        load_data(data_spec(bad))
    # The generator's RL given G_sft's anchor lists; Q2's held-out lists given dev's.
    bad = c.copy_and_resolve_references()
    bad.data.anchor_paths = (str(w / "gen_sft_anchors.jsonl"),)
    with pytest.raises(splits.SplitError, match=refused("gen_sft", "gen_rl",
                                                        w / "gen_sft_anchors.jsonl")):
        check_data_sources(data_spec(bad))
    bad = c.copy_and_resolve_references()
    bad.data.heldout_anchor_paths = (str(w / "dev_anchors.jsonl"),)
    with pytest.raises(splits.SplitError, match=refused("dev", "heldout",
                                                        w / "dev_anchors.jsonl")):
        check_data_sources(data_spec(bad))
    # Held-out lists cut from the generator's RL lists are refused in a split world.
    bad = c.copy_and_resolve_references()
    bad.data.heldout_anchor_paths = ()
    with pytest.raises(ValueError, match="config.data.heldout_anchor_paths"):
        check_data_sources(data_spec(bad))
    # The gold curve while the policy trains reads dev, not the reported held-out split.
    c.rounds.heldout_gold_every = 1
    dev_items = gold_curve.load_items(read_settings(c).rounds, c.data.require_splits)
    assert [x.id for x in dev_items] == [r.id for r in rows["dev"]]
    c.rounds.heldout_gold_path = str(w / "heldout.jsonl")
    with pytest.raises(splits.SplitError, match=refused("heldout", "dev", w / "heldout.jsonl")):
        gold_curve.load_items(read_settings(c).rounds, c.data.require_splits)
    # The policy's held-out evaluation reads heldout, not the policy's prompts.
    assert len(heldout_setup(c, str(w / "heldout.jsonl"), 0, 4)[0]) == 7
    with pytest.raises(splits.SplitError, match=refused("policy", "heldout",
                                                        w / "policy.jsonl")):
        heldout_setup(c, str(w / "policy.jsonl"), 0, 4)
    # G_sft: pairs from gen_sft, its per-epoch F1 on dev.
    sft = types.SimpleNamespace(train_anchors=str(w / "gen_sft_anchors.jsonl"),
                                eval_anchors=str(w / "dev_anchors.jsonl"),
                                heldout_prompts=str(w / "heldout.jsonl"),
                                train_rows=0, eval_rows=0)
    train, held, dev = read_sft_rows(sft)
    assert (len(train), len(held), len(dev)) == (6, 7, 3)
    sft.eval_anchors = str(w / "heldout_anchors.jsonl")
    with pytest.raises(splits.SplitError, match=r"config\.sft\.eval_anchors: " + refused(
            "heldout", "dev", w / "heldout_anchors.jsonl")):
        read_sft_rows(sft)
    sft.eval_anchors, sft.train_anchors = str(w / "dev_anchors.jsonl"), str(
        w / "gen_rl_anchors.jsonl")
    with pytest.raises(splits.SplitError, match=refused("gen_rl", "gen_sft",
                                                        w / "gen_rl_anchors.jsonl")):
        read_sft_rows(sft)
    # The anchor lists' command: --split names the file's split, and a split file needs it.
    check_prompt_split(str(w / "gen_rl.jsonl"), "gen_rl")
    with pytest.raises(splits.SplitError, match=refused("gen_sft", "gen_rl",
                                                        w / "gen_sft.jsonl")):
        check_prompt_split(str(w / "gen_sft.jsonl"), "gen_rl")
    with pytest.raises(ValueError, match="pass --split=dev"):
        check_prompt_split(str(w / "dev.jsonl"), "")
    with pytest.raises(ValueError, match="has no anchor lists"):
        check_prompt_split(str(w / "policy.jsonl"), "policy")


def test_docs_give_the_commands_that_build_the_split_world():
    """README.md and docs/CHECKS_WORLD.md show world v2's build commands exactly as
    `configs.checks_world.build_commands` prints them when a run starts without its files
    (the data, then the anchor lists of gen_sft, gen_rl, dev and heldout)."""
    from configs.checks_world import DEFAULT_DIRS, build_commands
    from drubric_jax.data import splits

    lines = build_commands(2, f"../{DEFAULT_DIRS[2]}").splitlines()
    assert len(lines) == 1 + len(splits.ANCHORED)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for doc in ("README.md", os.path.join("docs", "CHECKS_WORLD.md")):
        text = open(os.path.join(repo, doc), encoding="utf-8").read().splitlines()
        for line in lines:
            assert line in text, (doc, line)
