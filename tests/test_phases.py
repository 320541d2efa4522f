"""The phase plumbing checked by hand: with a stub generator and a stub verifier whose
verdicts are known, every reward, score and advantage a phase returns must equal the
paper's formulas recomputed here with plain Python loops (Eq. 12, 13, 15, 2, 21, 24-25;
METHOD 11 conventions), for every variant.

The policy samples come from the tiny random-weight model; the rubric lists and the verdicts
are fixed by the stubs, so nothing here depends on what a 135M model happens to write.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax.rl import generator_rewards, rewards
from drubric_jax.rounds import heldout, loop, phases, settings
from drubric_jax.rounds.context import Timer
from drubric_jax.types import Role, RubricBatch, Rollout
from helpers import StubVerifier, p_yes_of, tiny_config

ADV_EPS, FLAT_RTOL = 1e-6, 1e-6


# ----------------------------------------------------------------------------- stubs


# Items per (input, list): the second list of input 0 has no valid item (floor of Eq. 15).
ITEMS = [["clear answer", "cites a source", "polite tone"], ["", "", ""],
         ["short", "mentions Paris", "no typos"], ["uses lists", "on topic", ""]]
WEIGHTS = [[5, 2, 3], [0, 0, 0], [1, 4, 2], [3, 3, 0]]


class StubGenerator:
    """Returns fixed rubric lists (ITEMS, cycled) and records the calls."""

    def __init__(self):
        self.calls = []

    def generate_batch(self, params, key, inputs, *, num_lists, temperature, static=False):
        self.calls.append(dict(n=len(inputs), num_lists=num_lists, static=static))
        b, g = len(inputs), num_lists
        texts = [[ITEMS[(i * g + j) % len(ITEMS)] for j in range(g)] for i in range(b)]
        weights = np.array([[WEIGHTS[(i * g + j) % len(WEIGHTS)] for j in range(g)]
                            for i in range(b)], np.int32)
        mask = weights > 0
        r = b * g
        rollout = Rollout(
            prompt_tokens=np.ones((r, 4), np.int32), prompt_mask=np.ones((r, 4), bool),
            tokens=np.ones((r, 3), np.int32), logprobs=np.zeros((r, 3), np.float32),
            mask=np.ones((r, 3), bool), lengths=np.full(r, 3, np.int32),
            truncated=np.zeros(r, bool), invalid=np.zeros(r, bool),
            group_ids=np.repeat(np.arange(b, dtype=np.int32), g))
        return RubricBatch(texts=texts, weights=weights, item_mask=mask,
                           list_valid=mask.any(-1), finish_reasons=[["stop"] * g] * b,
                           raw_texts=[[""] * g] * b, orders=np.zeros((b, g, 1), np.int32),
                           response_cut=np.zeros((b, g, 1), bool),
                           prompt_cut=np.zeros((b, g), bool), rollout=rollout,
                           temperature=1.0, counters={})


# ----------------------------------------------------------------------------- the paper by hand


def verdict(resp, item, mode):
    """v of Eq. 12-13: 0/1 (P(yes) > 0.5) for mode "hard", P(yes) for "soft" (METHOD 12)."""
    p = np.float32(p_yes_of(resp, item))
    return float(p > 0.5) if mode == "hard" else float(p)


def score(resp, items, weights, mode):
    """Eq. 12."""
    total = sum(w for t, w in zip(items, weights) if w > 0)
    if total == 0:
        return 0.0
    return sum(w * verdict(resp, t, mode) for t, w in zip(items, weights) if w > 0) / total


def r_disc(responses, items, weights, mode):
    """Eq. 13, generalised: the population variance of each item's verdicts."""
    total = sum(w for w in weights if w > 0)
    if total == 0:
        return 0.0
    acc = 0.0
    for t, w in zip(items, weights):
        if w > 0:
            acc += w * np.var([verdict(y, t, mode) for y in responses])
    return acc / total


def r_anchor(scores, gold, valid):
    """Eq. 15 (positions = 1 + number strictly better), floor for an invalid list."""
    n = len(gold)
    out = 0.0
    for a in range(n):
        for b in range(n):
            if gold[a] < gold[b]:
                i = 1 + sum(g < gold[a] for g in gold)
                j = 1 + sum(g < gold[b] for g in gold)
                d = (scores[a] - scores[b]) if valid else -1.0
                out += -math.log1p(math.exp(-d)) / ((j - i) * 2 ** (i - 1))
    return out


def advantages(r):
    """Eq. 21: ddof=1, flat groups 0."""
    r = np.asarray(r, np.float64)
    if len(r) < 2 or r.max() - r.min() <= FLAT_RTOL * max(1.0, abs(r.mean())):
        return np.zeros(len(r))
    return (r - r.mean()) / (r.std(ddof=1) + ADV_EPS)


# ----------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    r = loop.setup(tiny_config(), str(tmp_path_factory.mktemp("phases")))
    r.ctx = dataclasses.replace(r.ctx, verifier=StubVerifier(), generator=StubGenerator())
    yield r
    loop.close(r)


def _ctx(run, variant, mode="hard"):
    config = tiny_config(variant)
    config.verifier.verdict = mode
    return dataclasses.replace(run.ctx, settings=settings.read(config),
                               generator=StubGenerator())


@pytest.mark.parametrize("mode", ["hard", "soft"])
@pytest.mark.parametrize("variant", ["full", "disc_only", "anchor_only"])
def test_generator_phase_rewards_and_advantages_by_hand(run, variant, mode):
    ctx = _ctx(run, variant, mode)
    anchors = run.data.train_anchors[:1]
    key = jax.random.PRNGKey(5)
    step = phases.generator_rollout(ctx, key, anchors)
    c, k = ctx.settings, ctx.settings.policy.num_responses
    # The policy samples the stub lists were asked about: the same key and sampler.
    _, responses = phases.sample_responses(ctx, jax.random.split(key)[0],
                                           [a.prompt for a in anchors],
                                           [list(a.history) for a in anchors], k,
                                           Timer())
    g = c.generator.num_lists
    a = anchors[0]
    lists = [(ITEMS[j % 4], WEIGHTS[j % 4]) for j in range(g)]
    rd = [r_disc(responses[:k], it, w, mode) for it, w in lists]
    ra = [r_anchor([score(y, it, w, mode) for y in a.responses], list(a.gold_ranks), any(w))
          for it, w in lists]
    w_disc, lam = {"full": (1.0, c.generator.reward_weights["anchor"]),  # config.generator.lam
                   "disc_only": (1.0, 0.0), "anchor_only": (0.0, 1.0)}[variant]
    want_adv = w_disc * advantages(rd) + lam * advantages(ra)
    np.testing.assert_allclose(step.metrics["r_disc"], np.mean(rd), atol=1e-6)
    np.testing.assert_allclose(step.metrics["r_anchor"], np.mean(ra), rtol=1e-5)
    np.testing.assert_allclose(step.advantages, want_adv, atol=1e-5)
    assert step.metrics["flat_group_fraction"] == float(np.all(want_adv == 0))
    assert step.rollout.num_rows == g and step.rollout.group_ids.tolist() == [0] * g
    assert ctx.generator.calls == [dict(n=1, num_lists=g, static=False)]
    assert step.metrics["parse_valid_rate"] == np.mean([any(w) for _, w in lists])


@pytest.mark.parametrize("mode", ["hard", "soft"])
@pytest.mark.parametrize("variant", ["full", "static"])
def test_policy_phase_scores_and_advantages_by_hand(run, variant, mode):
    ctx = _ctx(run, variant, mode)
    items = run.data.prompts[:1]
    key = jax.random.PRNGKey(9)
    step = phases.policy_rollout(ctx, key, items)
    k = ctx.settings.policy.num_responses
    _, responses = phases.sample_responses(ctx, jax.random.split(key)[0],
                                           [x.prompt for x in items],
                                           [list(x.history) for x in items], k,
                                           Timer())
    it, w = ITEMS[0], WEIGHTS[0]
    scores = [score(y, it, w, mode) for y in responses]
    np.testing.assert_allclose(step.advantages, advantages(scores), atol=1e-5)
    np.testing.assert_allclose(step.metrics["policy_reward"], np.mean(scores), atol=1e-6)
    assert step.metrics["flat_group_fraction"] == float(np.all(advantages(scores) == 0))
    v = [[verdict(y, t, mode) for y in responses] for t in it]
    np.testing.assert_allclose(step.metrics["yes_rate"], np.mean(v), atol=1e-6)
    assert step.metrics["zero_variance_item_fraction"] == np.mean(
        [max(x) - min(x) <= 1e-6 for x in v])
    assert step.metrics["items_per_list"] == 3.0
    assert ctx.generator.calls == [dict(n=1, num_lists=1, static=variant == "static")]
    assert step.trace[0]["scores"] == pytest.approx(scores)


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_heldout_delta_gap_and_anchor_reward_by_hand(run, mode):
    ctx = _ctx(run, "full", mode)
    anchors = run.data.heldout_anchors
    got = heldout.heldout_metrics(ctx, jax.random.PRNGKey(0), anchors)
    it, w = ITEMS[0], WEIGHTS[0]
    gaps, ras = [], []
    for a in anchors:
        s = [score(y, it, w, mode) for y in a.responses]
        pairs = [(i, j) for i in range(len(s)) for j in range(len(s))
                 if a.gold_ranks[i] < a.gold_ranks[j]]
        gaps.append(np.mean([s[i] - s[j] for i, j in pairs]) if pairs else 0.0)
        ras.append(r_anchor(s, list(a.gold_ranks), True))
    np.testing.assert_allclose(got["delta_gap"], np.mean(gaps), atol=1e-6)
    np.testing.assert_allclose(got["heldout_r_anchor"], np.mean(ras), rtol=1e-5)


class ItemOnlyVerifier(StubVerifier):
    """Verdicts that ignore the response: every item splits no set, so R_disc is 0."""

    def p_yes(self, params, prompts, responses, items, history=None, **kw):
        out = super().p_yes(params, prompts, ["same"] * len(responses), items)
        return out


def test_flat_group_fraction_counts_groups_whose_advantage_is_zero(run):
    """disc_only with R_disc flat (0 for every list) and R_anchor not flat (one invalid
    list gets the floor): the combined advantage is 0 everywhere, so the group is flat."""
    ctx = dataclasses.replace(_ctx(run, "disc_only", "soft"), verifier=ItemOnlyVerifier())
    step = phases.generator_rollout(ctx, jax.random.PRNGKey(1), run.data.train_anchors[:1])
    assert step.metrics["r_disc"] == 0.0
    assert np.all(step.advantages == 0)
    assert step.metrics["flat_group_fraction"] == 1.0
    other = _ctx(run, "full", "soft")
    full = dataclasses.replace(ctx, settings=other.settings)
    step = phases.generator_rollout(full, jax.random.PRNGKey(1), run.data.train_anchors[:1])
    assert np.any(step.advantages != 0) and step.metrics["flat_group_fraction"] == 0.0
    assert step.metrics["r_anchor_std"] > 0 and step.metrics["r_disc_std"] == 0.0


def test_rule_reward_phase_advantages_and_group_means_by_hand(run):
    """Plain GRPO (config.policy.reward = word_limit): the rule's rewards of the sampled
    responses, their Eq. 21 advantages, and each prompt group's mean reward."""
    from drubric_jax.rl import rule_rewards

    ctx = _ctx(run, "full")
    items = run.data.prompts[:2]
    key = jax.random.PRNGKey(3)
    rule = rule_rewards.word_limit_reward(3)
    step = phases.rule_policy_rollout(ctx, key, items, rule)
    k = ctx.settings.policy.num_responses
    _, responses = phases.sample_responses(ctx, key, [x.prompt for x in items],
                                           [list(x.history) for x in items], k,
                                           Timer())
    r = [rule(None, y) for y in responses]
    want = np.concatenate([advantages(r[i * k:(i + 1) * k]) for i in range(2)])
    np.testing.assert_allclose(step.advantages, want, atol=1e-5)
    np.testing.assert_allclose(step.metrics["policy_reward"], np.mean(r), atol=1e-6)
    np.testing.assert_allclose(step.metrics["group_mean_rewards"],
                               [np.mean(r[:k]), np.mean(r[k:])], atol=1e-6)
    assert step.trace[0]["scores"] == pytest.approx(r[:k])


def test_group_mean_rewards_skip_unscorable_rows():
    """A non-finite reward is unscorable (METHOD 11): left out of its group's mean; a group
    with none scorable has mean nan."""
    scores = np.array([1.0, np.nan, 0.0, np.nan, np.inf, 3.0], np.float32)
    ids = np.array([0, 0, 0, 1, 1, 2], np.int32)
    adv, flat, m = phases._policy_advantages(scores, ids, 3)
    np.testing.assert_allclose(m["group_mean_rewards"][:1], [0.5])
    assert np.isnan(m["group_mean_rewards"][1]) and m["group_mean_rewards"][2] == 3.0
    assert m["unscorable_fraction"] == pytest.approx(0.5)
    assert m["policy_reward"] == pytest.approx(4.0 / 3.0)
    assert np.all(np.isfinite(adv)) and adv[1] == adv[3] == adv[4] == adv[5] == 0.0
    # Groups 1 (no scorable row) and 2 (one row) are flat; group 0 is live.
    np.testing.assert_array_equal(flat, [False, True, True])


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_ablation_heldout_values_per_list_by_hand(run, mode):
    """`evaluation.ablation.heldout_per_list`: per anchor list, Eq. 2 gap and Eq. 15
    reward averaged over its G lists (an invalid list gets the floor), and the strict
    pairwise counts (a tie is wrong) summed over them, for ragged anchor lists."""
    from drubric_jax.evaluation import ablation

    ctx = _ctx(run, "full", mode)
    anchors = run.data.train_anchors[:3]
    g = 2
    got = ablation.heldout_per_list(ctx, jax.random.PRNGKey(0), anchors, g, 1.0)
    assert ctx.generator.calls == [dict(n=3, num_lists=g, static=False)]
    for i, a in enumerate(anchors):
        gaps, ras, pairs, correct, ties, valid = [], [], 0, 0, 0, 0
        for j in range(g):
            it, w = ITEMS[(i * g + j) % 4], WEIGHTS[(i * g + j) % 4]
            s = [score(y, it, w, mode) for y in a.responses]
            ordered = [(x, y) for x in range(len(s)) for y in range(len(s))
                       if a.gold_ranks[x] < a.gold_ranks[y]]
            gaps.append(np.mean([s[x] - s[y] for x, y in ordered]) if ordered else 0.0)
            ras.append(r_anchor(s, list(a.gold_ranks), any(w)))
            pairs += len(ordered)
            correct += sum(s[x] > s[y] for x, y in ordered)
            ties += sum(s[x] == s[y] for x, y in ordered)
            valid += any(w)
        np.testing.assert_allclose(got["delta_gap"][i], np.mean(gaps), atol=1e-6)
        np.testing.assert_allclose(got["r_anchor"][i], np.mean(ras), rtol=1e-5)
        assert (got["pairs"][i], got["correct"][i], got["ties"][i], got["valid"][i]) == (
            pairs, correct, ties, valid)
    assert got["ids"] == [a.id for a in anchors] and got["num_lists"] == g


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_coevolution_rdisc_on_fixed_samples_by_hand(run, mode):
    """`evaluation.coevolution.rdisc_per_prompt`: Eq. 13 of each of the G lists on a given
    response set (ragged sets: padded responses count for nothing), averaged per prompt."""
    from drubric_jax.evaluation import coevolution as co

    ctx = _ctx(run, "full", mode)
    sets = [["a short answer", "a long answer with a list", "no"], ["yes", "maybe"]]
    prompts, hists = ["q1", "q2"], [[], []]
    g = 2
    got = co.rdisc_per_prompt(ctx, None, jax.random.PRNGKey(0), prompts, hists, sets, g, 1.0)
    for i, cs in enumerate(sets):
        want = [r_disc(cs, ITEMS[(i * g + j) % 4], WEIGHTS[(i * g + j) % 4], mode)
                for j in range(g)]
        np.testing.assert_allclose(got["r_disc"][i], np.mean(want), atol=1e-6)
        assert got["valid"][i] == sum(any(WEIGHTS[(i * g + j) % 4]) for j in range(g))


def test_a_third_generator_reward_is_one_function_and_a_weight(run, monkeypatch):
    """A generator reward is one function plus a config weight (Eq. 24-25 generalised to
    A = sum_n w_n z(R_n)): a toy reward (the number of valid items of each list) registered
    through the public table `GENERATOR_REWARDS` (monkeypatch removes it afterwards), with
    its weight in config.generator, adds w z(R_toy) to the phase's advantages and is logged;
    an objective ablation gives it weight 0."""
    anchors, key = run.data.train_anchors[:1], jax.random.PRNGKey(5)
    two = {v: phases.generator_rollout(_ctx(run, v, "soft"), key, anchors)
           for v in ("full", "disc_only")}

    def valid_items_per_list(inputs):
        return jnp.sum(rewards.valid_items(inputs.weights, inputs.item_mask), axis=-1,
                       dtype=jnp.float32)                                    # [B, G]

    ctx = _ctx(run, "full", "soft")
    monkeypatch.setitem(generator_rewards.GENERATOR_REWARDS, "toy",
                        generator_rewards.GeneratorReward(valid_items_per_list, "toy_weight"))
    config = tiny_config("full")
    config.verifier.verdict = "soft"
    config.generator.toy_weight = 0.5
    ctx = dataclasses.replace(ctx, settings=settings.read(config))  # read once, again
    three = phases.generator_rollout(ctx, key, anchors)
    g = ctx.settings.generator.num_lists
    toy = [sum(w > 0 for w in WEIGHTS[j % 4]) for j in range(g)]  # the stub's lists
    # The toy term's float32 z (|z| <= sqrt(G - 1)) differs from the float64 one by a few
    # rounding steps of Eq. 21 (< 8 ulps of 1); adding it rounds once more (<= 1 ulp of the
    # sum, |sum| < 4): 8 eps + 4 eps bounds |three - two - 0.5 z|.
    tol = 12 * float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(three.advantages - two["full"].advantages,
                               0.5 * advantages(toy), rtol=0, atol=tol)
    assert three.metrics["r_toy"] == np.mean(toy) and three.metrics["r_toy_std"] > 0
    assert {k: three.metrics[k] for k in two["full"].metrics} == two["full"].metrics
    config.variant = "disc_only"
    ctx = dataclasses.replace(ctx, settings=settings.read(config))
    ablation = phases.generator_rollout(ctx, key, anchors)
    np.testing.assert_array_equal(ablation.advantages, two["disc_only"].advantages)


def test_anchor_list_values_equal_the_per_list_loop():
    """`heldout.anchor_list_values` (one batched call per list length) gives, bit for bit,
    what one call per anchor list gives (the loop it replaced), on ragged lists with gold
    ties, hard and soft verdicts and invalid rubrics."""
    rng = np.random.default_rng(0)
    u, m = 12, 4
    lengths = rng.integers(2, 6, u)
    verdicts = [rng.random((a, m)).astype(np.float32) for a in lengths]
    verdicts[::3] = [(v > 0.5).astype(np.float32) for v in verdicts[::3]]
    weights = rng.integers(0, 6, (u, m)).astype(np.int32)
    item_mask = rng.random((u, m)) < 0.8
    list_valid = rng.random(u) < 0.8
    gold = [np.sort(rng.integers(0, a, a)).tolist() for a in lengths]
    gap, r_anchor = heldout.anchor_list_values(verdicts, weights, item_mask, list_valid, gold)
    assert len(set(lengths.tolist())) > 1
    for i in range(u):
        s, _ = rewards.rubric_scores(verdicts[i], weights[i], item_mask[i])
        g = jnp.asarray(gold[i])
        want_gap = np.asarray(rewards.delta_gap(s, g)[0])
        want_r = np.asarray(rewards.anchor_reward_or_floor(s, g, jnp.ones(lengths[i], bool),
                                                           list_valid[i]))
        assert gap[i].tobytes() == want_gap.tobytes(), i
        assert r_anchor[i].tobytes() == want_r.tobytes(), i


def test_policy_sampler_engine_gives_the_static_rows(run):
    """config.policy.sampler = "engine" (`sampling.generate_engine`, 3 slots for 2 prompts x
    K rows) samples the policy rows `generate_chunked` samples, with per-row draws
    (config.per_row_keys): the same tokens, masks and group ids, in the same order, and
    log-probs within float32 rounding."""
    from tolerances import logprob_atol

    items = run.data.prompts[:2]
    k = run.ctx.settings.policy.num_responses
    got = {}
    for sampler in ("static", "engine"):
        config = tiny_config()
        config.per_row_keys = True
        config.policy.sampler = sampler
        config.policy.rollout_micro_batch = 3
        ctx = dataclasses.replace(run.ctx, settings=settings.read(config))
        got[sampler] = phases.sample_responses(ctx, jax.random.PRNGKey(8),
                                               [x.prompt for x in items],
                                               [list(x.history) for x in items], k, Timer())
    (static, static_texts), (engine, engine_texts) = got["static"], got["engine"]
    np.testing.assert_array_equal(engine.tokens, static.tokens)
    np.testing.assert_array_equal(engine.mask, static.mask)
    np.testing.assert_array_equal(engine.group_ids, static.group_ids)
    np.testing.assert_allclose(engine.logprobs, static.logprobs, rtol=0,
                               atol=logprob_atol(static.logprobs,
                                                 ctx.roles.rollout_cfg(Role.POLICY).vocab_size))
    assert engine_texts == static_texts
    # E: the micro-batch (0 = every row), rounded up to the mesh's data x fsdp row shards.
    from drubric_jax import parallel, sampling

    assert sampling.engine_slots(3, 2 * k) == 3 and sampling.engine_slots(0, 8) == 8
    assert sampling.engine_slots(3, 8, parallel.make_mesh(2, 2, 2)) == 4
