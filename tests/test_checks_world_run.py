"""A one-round run in the checks world (METHOD 13) on tiny random-weight models:
`configs/smollm2_cpu.py:tiny,world=checks` on hand-written checks-world rows (prompts with
meta.checks, anchor lists ranked by their gold score), with no verifier model loaded; the
metrics rows hold the gold and proxy scores, the constraint recovery and the item rates."""
import json
import os

import numpy as np
import pytest

from drubric_jax.rounds import loop
from helpers import PROMPTS, tiny_config, write_checks_world

pytestmark = pytest.mark.usefixtures("smollm2_gguf")


def checks_config(directory):
    """`helpers.tiny_config` in the checks world, one round, the generator sized for JSON
    checks (its prompt lists the 25 checks: ~1,400 tokens)."""
    c = tiny_config(extra=f"world=checks,checks_dir={directory}")
    c.rounds.num_rounds = 1
    c.generator.max_items = 2
    c.generator.max_item_chars = 24
    c.generator.max_new_tokens = 96
    c.generator.input_budget = 1536
    c.verifier.check_workers = 1
    return c


@pytest.mark.slow
def test_one_round_in_the_checks_world_logs_gold_proxy_and_constraint_recovery(tmp_path):
    data = tmp_path / "checks_world"
    data.mkdir()
    write_checks_world(str(data))
    c = checks_config(str(data))
    workdir = str(tmp_path / "run")
    run = loop.setup(c, workdir)
    try:
        assert run.ctx.roles.verifier is None  # no verifier model is loaded
        assert run.ctx.verifier.kind == "checks"
        assert set(run.ctx.true_checks) == {p for p, _ in PROMPTS}
    finally:
        loop.close(run)
    loop.run(c, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    train = {r["phase"]: r for r in rows if r["kind"] == "train"}
    assert set(train) == {"generator", "policy"}
    unit = ("gold_score", "gold_all_met_fraction", "constraint_precision", "constraint_recall",
            "constraint_f1", "constraint_f1_check_id", "invalid_item_rate",
            "duplicate_item_rate", "invalid_list_rate")
    for phase, row in train.items():
        for key in unit + (("proxy_score", "policy_reward") if phase == "policy" else ()):
            assert key in row, (phase, key)
            assert 0.0 <= row[key] <= 1.0, (phase, key, row[key])
        # Exact verdicts: the yes-rate of a valid list's items is a mean of 0/1 values.
        assert 0.0 <= row["yes_rate"] <= 1.0
    pol = train["policy"]
    assert pol["proxy_score"] == pytest.approx(pol["policy_reward"])
    # One prompt of 1 or 2 true checks, K = 2 samples: the mean g is a multiple of 1/4.
    assert (pol["gold_score"] * 4) % 1 == 0
    held = [r for r in rows if r["kind"] == "heldout"]
    assert held and all(np.isfinite(r["delta_gap"]) for r in held)
    trace = open(os.path.join(workdir, "trace", "round_0.html"), encoding="utf-8").read()
    assert '{"args"' not in trace  # items are shown as the checkers' sentences


@pytest.mark.slow
def test_ablation_heldout_values_carry_constraint_recovery(tmp_path):
    """The ablation's held-out scoring in the checks world adds each anchor list's
    constraint recovery (`evaluation.ablation.constraint_per_anchor`), against the true
    checks the anchor rows carry in their meta; recomputed here from the same lists."""
    import jax

    from drubric_jax.evaluation import ablation
    from drubric_jax.evaluator.rubric_generator import RubricInput
    from drubric_jax.types import Role

    data = tmp_path / "checks_world"
    data.mkdir()
    write_checks_world(str(data))
    c = checks_config(str(data))
    c.data.heldout_anchor_rows = 2
    run = loop.setup(c, str(tmp_path / "run"))
    try:
        anchors = run.data.heldout_anchors
        assert len(anchors) == 2 and all(a.meta["checks"] for a in anchors)
        key = jax.random.PRNGKey(3)
        out = ablation.heldout_per_list(run.ctx, key, anchors, 2, 1.0)
        for k in ablation.CHECK_METRICS + ("constraint_precision", "constraint_recall"):
            assert out[k].shape == (2,) and np.all((0 <= out[k]) & (out[k] <= 1)), k
        # The same lists again (same key): their recovery by hand.
        rb = run.ctx.generator.generate_batch(
            run.ctx.roles.params(Role.GENERATOR), key,
            [RubricInput(a.prompt, tuple(a.responses), tuple(a.history)) for a in anchors],
            num_lists=2, temperature=1.0)
        want = ablation.constraint_per_anchor(
            rb.texts, np.asarray(rb.item_mask).reshape(2, 2, -1),
            [a.meta["checks"] for a in anchors])
        for k, v in want.items():
            np.testing.assert_array_equal(out[k], v)
    finally:
        loop.close(run)
