"""The generator's reward path can teach (issue 53, item 8): GRPO on R_anchor alone
(Eq. 15) or R_disc alone (Eq. 13) moves a tiny random generator's rubric lists toward the
items the reward prefers, and the same run with the reward's sign flipped moves them away.

Q2's null result (trained generators scoring like G_sft) cannot tell a broken training
path from too few updates unless such a test passes. So everything between a sampled list
and the next sample is the real code: `phases.generator_rollout` (constrained decoding of
the checks format, the checks world's parser, the checkers' exact verdicts, METHOD 13;
`rl.generator_rewards`; the advantages of Eq. 24-25 with their flat flags;
`train_step.live_rows`) and `phases.update` (the `train_step.group_batch` layout and the
compiled GRPO step of Eq. 23) on a LoRA trainee as world v2's (rank 16, beta 0). A step
here is exactly a generator step of `rounds.loop`.

Two things are synthetic, and why:
- The response set C. The policy's K answers are given (`phases.sample_responses`
  replaced) instead of sampled: which items split C must be known, and a random-weight
  policy writes noise. The generator still sees C in its prompt, and the verdicts on C are
  the checkers'.
- The tiny model's embeddings, scaled by EMBED_SCALE. The `tiny` preset draws its tied
  embedding (64 wide) with std 0.02, so after the final norm (|h| = sqrt(64) = 8) every
  logit lies within |h| |e| ~ 8 x 0.16 = 1.3 nats of uniform, and LoRA adapters (layer
  matrices only) cannot change that (while this test was written, 20 steps at lr 3e-2
  and G = 16 left a check id's share where it started). Scaled by 8 (std 0.16) the
  logits can spread over ~10 nats, as a trained model's do, and the adapters can
  express a preference (4 steps at lr 1e-2 take the share from ~0.4 to ~1).

The generator writes one item per list (max_items = 1) from a pool of three checks that
take no arguments, so a list is {"rubrics": [{"check": <id>, "args": {}, "weight": w}]}:
the choice that matters is the check id (with one item the weight cancels in Eq. 12), and
the measured quantity is the target id's share of the generator's lists.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax.checks import gold_score
from drubric_jax.data.schema import AnchorList
from drubric_jax.evaluator.check_rubrics import item_of_text
from drubric_jax.evaluator.rubric_generator import RubricInput
from drubric_jax.rl import generator_rewards, train_step
from drubric_jax.rounds import loop, phases, settings
from drubric_jax.types import Role
from helpers import tiny_config, write_checks_world

pytestmark = pytest.mark.usefixtures("smollm2_gguf")

NO_COMMA, TITLE, QUOTE = "punctuation:no_comma", "detectable_format:title", "startend:quotation"
POOL = (NO_COMMA, TITLE, QUOTE)
TARGET = NO_COMMA  # the check id each test's reward prefers

# Two generator inputs a step (two groups of G lists: Eq. 24-25 normalise within each).
PROMPTS = ("Describe a rainy day.", "Write two lines about the weather.")
G = 8                # lists per input: 16 sampled lists a step
STEPS = 4            # generator updates per run
LEARNING_RATE = 1e-2  # AdamW on the LoRA adapters
EMBED_SCALE = 8.0    # why: the module docstring
MEASURE_CALLS = 4    # sampler calls of B x G = 16 lists a share: N = 64 lists
Z = 3.0              # the move each run must make, in sd of the no-learning spread
SEED = 0

# R_anchor: anchor lists (best first, two tiers) that no_comma ranks perfectly (both top
# responses pass, both bottom ones fail), title half right and half wrong, quotation worst.
ANCHOR_RESPONSES = ["Rain falls on the hills", "<<Clouds>> drift by slowly",
                    '"Yes, it rains"', "<<Well>>, maybe not"]
ANCHOR_RANKS = [1, 1, 3, 3]  # METHOD 11: 1 + the number strictly better
# R_disc: a response set that no_comma splits (2 pass, 2 fail), every response passes
# title and every response fails quotation.
SPLIT_SET = ["<<Rain>> Rain falls on the hills", "<<Rain>> Yes, it rains",
             "<<Sky>> Clouds drift by slowly", "<<Sky>> Well, maybe not"]
# The anchor test's C: one answer K times (C does not enter R_anchor). Every list of an
# input then has one prompt whatever order it shows C in, so its G lists share a prefix.
SAME_SET = ["It rains and the sky is grey"] * 4


def _config(data_dir: str, variant: str):
    """`helpers.tiny_config` in the checks world (world v2: LoRA rank 16, beta 0) on one
    device, the generator writing one item from POOL, at LEARNING_RATE."""
    c = tiny_config(variant, extra=f"world=checks,checks_dir={data_dir}")
    c.mesh.num_devices, c.mesh.data = 1, 1
    c.verifier.check_workers = 1
    c.policy.num_responses = len(SPLIT_SET)
    c.generator.check_pool = POOL
    c.generator.max_items = 1
    c.generator.max_new_tokens = 48  # a list of one item is 26-32 tokens
    c.generator.num_lists = G
    c.generator.train.learning_rate = LEARNING_RATE
    return c


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A run set up once (`loop.setup`), its generator's base embedding scaled, and the
    generator trainee's initial state kept on the host (each run starts from it)."""
    data = tmp_path_factory.mktemp("generator_learns_data")
    write_checks_world(str(data))
    c = _config(str(data), "full")
    run = loop.setup(c, str(tmp_path_factory.mktemp("generator_learns_run")))
    trainee = run.ctx.roles.trainee(Role.GENERATOR)
    assert trainee.cfg.lora_rank > 0 and trainee.train_config.beta == 0.0  # world v2's
    base = trainee.model.params
    # A new dict: the arrays other roles share are left as they are.
    trainee.model = dataclasses.replace(
        trainee.model, params={**base, "embed": base["embed"] * EMBED_SCALE})
    run.initial_state = jax.tree.map(np.array, trainee.state)
    run.data_dir = str(data)
    yield run
    loop.close(run)


def _context(world, variant: str):
    config = _config(world.data_dir, variant)
    return dataclasses.replace(world.ctx, settings=settings.read(config))


def _anchors():
    return [AnchorList(id=f"learn/{i}", source="synthetic", prompt=p, history=[],
                       responses=list(ANCHOR_RESPONSES), gold_ranks=list(ANCHOR_RANKS),
                       meta={"checks": [{"check": TARGET, "args": {}}]})
            for i, p in enumerate(PROMPTS)]


def _verdict(check: str, response: str) -> int:
    return int(gold_score([{"check": check, "args": {}}], response))


def _given_responses(monkeypatch, responses):
    """The policy's K answers to every prompt are `responses` (module docstring)."""
    def sample_responses(ctx, key, prompts, histories, k, timer, params=None):
        assert k == len(responses)
        return None, [y for _ in prompts for y in responses]

    monkeypatch.setattr(phases, "sample_responses", sample_responses)


def _share(ctx, responses, key) -> float:
    """TARGET's share of N = MEASURE_CALLS x B x G lists the generator samples now for the
    steps' inputs (x, C), at its training temperature; an invalid list counts as not it."""
    inputs = [RubricInput(p, tuple(responses), ()) for p in PROMPTS]
    hits = total = 0
    for i in range(MEASURE_CALLS):
        rb = ctx.generator.generate_batch(
            ctx.roles.rollout_params(Role.GENERATOR, ctx.mesh), jax.random.fold_in(key, i),
            inputs, num_lists=G, temperature=ctx.settings.generator.temperature)
        for texts, valid in zip(rb.texts, rb.list_valid):
            for items, ok in zip(texts, valid):
                total += 1
                hits += bool(ok) and item_of_text(items[0])[0] == TARGET
    return hits / total


def _reset(ctx, state) -> None:
    """The generator trainee back at `state` (host arrays; the step donates its state)."""
    trainee = ctx.roles.trainee(Role.GENERATOR)
    trainee.state = train_step.shard_train_state(jax.tree.map(jnp.asarray, state), ctx.mesh)


def _train(world, ctx, monkeypatch, reward: str, sign: float, responses) -> tuple:
    """STEPS generator steps (rollout, then update) from the initial state with the
    registered reward `reward` times `sign`, then TARGET's share; (share, step log)."""
    _reset(ctx, world.initial_state)
    row = generator_rewards.GENERATOR_REWARDS[reward]
    monkeypatch.setitem(generator_rewards.GENERATOR_REWARDS, reward,
                        generator_rewards.GeneratorReward(lambda x: sign * row.fn(x),
                                                          row.weight_field))
    key = jax.random.fold_in(jax.random.PRNGKey(SEED), 1)
    log = []
    for s in range(STEPS):
        step = phases.generator_rollout(ctx, jax.random.fold_in(key, s), _anchors())
        m = phases.update(ctx, Role.GENERATOR, step, s)
        log.append({k: round(float(v), 3) for k, v in m.items()
                    if k in ("active_rows", "update_skipped", "grad_norm")}
                   | {"r": round(float(step.metrics["r_" + reward]), 3)})
    monkeypatch.setitem(generator_rewards.GENERATOR_REWARDS, reward, row)
    # Draws independent of the untrained share's (key 2), as the threshold assumes.
    share = _share(ctx, responses, jax.random.fold_in(jax.random.PRNGKey(SEED), 3))
    return share, log


def _z(p0: float, p: float, n: int) -> float:
    """The two-proportion z statistic of shares p0 and p, each of n Bernoulli draws:
    (p - p0) / sqrt(pbar (1 - pbar) 2 / n), pbar = (p0 + p) / 2; 0 when pbar is 0 or 1."""
    pbar = (p0 + p) / 2.0
    sd = math.sqrt(pbar * (1.0 - pbar) * 2.0 / n)
    return (p - p0) / sd if sd > 0 else 0.0


def _assert_learns(world, monkeypatch, variant: str, reward: str, responses) -> list:
    """The untrained share p0, then a run with the reward and one with its sign flipped:
    the first must raise TARGET's share, the second lower it, each by Z sd of the
    no-learning spread. Returns the rows per group of every update's GroupBatch.

    Threshold: p0 and a trained share p are each the mean of N = MEASURE_CALLS x B x G
    = 64 Bernoulli draws (is the list's check TARGET?), p0's and p's independent (keys 2
    and 3). If training did not move the generator, both draw with one probability q,
    and p - p0 has the binomial spread sd = sqrt(2 q (1 - q) / N); with q estimated by
    the pooled share (p0 + p) / 2, z = (p - p0) / sd is then about standard normal (the
    two-proportion z test; N q and N (1 - q) are >= 12 in these runs, enough for the
    normal approximation). The run on the reward must reach z >= Z = 3, the run on its
    negative z <= -3. A generator that training does not move passes each by chance
    with probability ~1.3e-3 (normal tail), and both together not at all: the two runs'
    lists are then the same draws (key 3) of the same generator, so their shares are
    equal. A flipped advantage, a reward on the wrong verdicts or no gradient fails the
    test (the runs are seeded, so the verdict repeats).
    """
    ctx = _context(world, variant)
    _given_responses(monkeypatch, responses)
    rows = []  # each update's batch, built by train_step.group_batch: its rows per group
    group_batch = train_step.group_batch

    def spy(*args, **kw):
        batch = group_batch(*args, **kw)
        rows.append(batch.tokens.shape[1])
        return batch

    monkeypatch.setattr(train_step, "group_batch", spy)
    _reset(ctx, world.initial_state)  # the untrained generator
    n = MEASURE_CALLS * len(PROMPTS) * G
    p0 = _share(ctx, responses, jax.random.fold_in(jax.random.PRNGKey(SEED), 2))
    up, up_log = _train(world, ctx, monkeypatch, reward, 1.0, responses)
    down, down_log = _train(world, ctx, monkeypatch, reward, -1.0, responses)
    z_up, z_down = _z(p0, up, n), _z(p0, down, n)
    report = (f"{TARGET}'s share of {n} lists: untrained {p0:.3f}; after {STEPS} steps on "
              f"+R_{reward} {up:.3f} (z = {z_up:+.2f}), on -R_{reward} {down:.3f} "
              f"(z = {z_down:+.2f}); needed |z| >= {Z}\n"
              f"+R steps: {up_log}\n-R steps: {down_log}")
    assert rows, "no update went through train_step.group_batch\n" + report
    assert z_up >= Z, report
    assert z_down <= -Z, report
    return rows


@pytest.mark.slow  # ~75 s of CPU alone (320 sampled lists, 8 updates)
def test_anchor_reward_teaches_the_ranking_check(world, monkeypatch):
    # The design, by the real checkers: TARGET ranks the anchor list perfectly, the
    # others do not (so R_anchor of a TARGET list is the group's largest).
    v = {c: [_verdict(c, y) for y in ANCHOR_RESPONSES] for c in POOL}
    assert v[TARGET] == [1, 1, 0, 0] and v[TITLE] == [0, 1, 0, 1] and v[QUOTE] == [0, 0, 1, 0]
    rows = _assert_learns(world, monkeypatch, "anchor_only", "anchor", SAME_SET)
    # Each input's G lists entered the update as one group sharing its prefix.
    assert set(rows) == {G}, rows


@pytest.mark.slow  # ~90 s of CPU alone
def test_disc_reward_prefers_items_that_split_the_responses(world, monkeypatch):
    # TARGET splits C (Eq. 13: vbar = 1/2, R_disc = 1/4); every response passes TITLE and
    # fails QUOTE (R_disc = 0).
    v = {c: [_verdict(c, y) for y in SPLIT_SET] for c in POOL}
    assert v[TARGET] == [1, 0, 1, 0] and v[TITLE] == [1] * 4 and v[QUOTE] == [0] * 4
    rows = _assert_learns(world, monkeypatch, "disc_only", "disc", SPLIT_SET)
    # An input's G lists show C in one drawn order: one group sharing its prefix.
    assert set(rows) == {G}, rows
