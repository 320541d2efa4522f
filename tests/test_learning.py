"""Training learns: GRPO through the whole path (sampler -> rule reward -> Eq. 21 advantages
-> Eq. 23 update) raises a rule reward on the tiny random-weight model.

The policy is `config.TINY` (random weights, the model of `configs/smollm2_cpu.py:tiny`);
prompts are random token ids, so no tokenizer is involved. Every step samples K responses
per prompt with `sampling.generate` (the sampler the rollouts use), scores them with a rule
reward defined here, turns the scores into group-normalised advantages
(`rl.advantages.group_advantages_by_id`, Eq. 21, groups by prompt id as the policy phase
forms them) and applies one `rl.train_step.train_step` (Eq. 23, AdamW). All randomness
comes from SEED.
"""
import functools

import jax
import numpy as np
import pytest

from drubric_jax import models, sampling
from drubric_jax.models import config as cfg_lib
from drubric_jax.rl import advantages as adv_lib
from drubric_jax.rl import train_config
from drubric_jax.rl import train_step as ts

SEED = 0
CFG = cfg_lib.TINY
B, K = 2, 8            # prompts per step, responses per prompt (R = 16 rows)
PROMPT_LEN, N_NEW = 8, 8
STEPS, WINDOW = 20, 5  # policy steps; the first and last WINDOW steps are compared
NULL_STEPS = 10        # steps of the untrained policy that measure the reward's spread
Z = 6.0                # margin in standard errors of the null difference (the test)
# Target tokens: the lower half of the vocabulary. Near-uniform random logits put about
# half of every response there, so groups start with a spread (Eq. 21 needs one). The stop
# id is outside the target set: stopping at once cannot earn the reward.
TARGET_BELOW = CFG.vocab_size // 2
STOP_ID = CFG.vocab_size - 1
# lr: large for a policy (paper: 1e-6), so that 20 steps of 16 rows move the random model:
# at 7e-2 the reward leaves 0.5 between steps 4 and 12 for seeds 0-5 (at 5e-2 as late as
# step 16). beta 0: no reference forward (the KL term is tested in test_train_step.py).
TRAIN = train_config.TrainConfig(learning_rate=7e-2, beta=0.0, micro_batch_size=B * K,
                                 temperature=1.0)


def target_fraction(tokens, mask) -> np.ndarray:
    """The rule reward, float32[R]: the fraction of a response's tokens (its real ones, up
    to and including a stop token) whose id is below TARGET_BELOW; 0 for an empty one."""
    hit = (np.asarray(tokens) < TARGET_BELOW) & np.asarray(mask, bool)
    return (hit.sum(-1) / np.maximum(np.sum(mask, -1), 1)).astype(np.float32)


@pytest.mark.slow  # 10-21 s on 2 cores (make test-fast leaves it out)
def test_rule_reward_rises():
    """The mean reward of the last WINDOW steps exceeds that of the first WINDOW by a
    margin derived from the reward's spread without learning.

    Margin: with no learning (the hypothesis the test rejects) the policy stays at its
    initialisation, and each step's mean reward is an independent draw (a fresh sampling
    key) with spread sigma. sigma is estimated by the ddof = 1 std of the mean rewards of
    NULL_STEPS steps sampled from the untrained policy with other keys. The difference of
    two means of WINDOW independent steps has std sigma sqrt(2 / WINDOW), so under that
    hypothesis (last - first) / (sigma_hat sqrt(2 / WINDOW)) follows Student's t with
    NULL_STEPS - 1 = 9 degrees of freedom (step means of 128 tokens are near Gaussian):
    P(t_9 > Z = 6) = 1.0e-4. sigma_hat is ~0.035 here (the binomial value for 128
    independent tokens at p = 1/2 is 0.044), a margin of ~0.13 on a reward in [0, 1].
    Training takes the reward from ~0.5 to ~1: for seeds 0-5 the rise was 0.36-0.53
    against margins of 0.11-0.22 (SEED = 0: 0.53 against 0.13).
    """
    key = jax.random.PRNGKey(SEED)
    k_init, k_prompts, k_null, k_steps = jax.random.split(key, 4)
    params = models.init_params(CFG, k_init)
    # Ids 3..V-2: no special low ids, never the stop id.
    prompts = np.asarray(jax.random.randint(k_prompts, (B, PROMPT_LEN), 3, STOP_ID))
    rows = [[int(t) for t in p] for p in prompts for _ in range(K)]  # row b * K + i
    group_ids = np.repeat(np.arange(B, dtype=np.int32), K)

    def rollout(p, k):
        return sampling.generate(p, CFG, rows, key=k, max_new_tokens=N_NEW,
                                 method=sampling.Temperature(TRAIN.temperature),
                                 stop_ids=[STOP_ID])

    null = [float(target_fraction(r.tokens, r.mask).mean())
            for r in (rollout(params, jax.random.fold_in(k_null, i))
                      for i in range(NULL_STEPS))]
    sigma = float(np.std(null, ddof=1))
    margin = Z * sigma * np.sqrt(2.0 / WINDOW)

    optimizer = train_config.make_optimizer(TRAIN)
    step_fn = jax.jit(functools.partial(ts.train_step, model_cfg=CFG, train_cfg=TRAIN,
                                        optimizer=optimizer), donate_argnums=(0,))
    state = ts.init_train_state(params, optimizer)
    curve = []
    for step in range(STEPS):
        r = rollout(state.params, jax.random.fold_in(k_steps, step))
        reward = target_fraction(r.tokens, r.mask)
        curve.append(float(reward.mean()))
        adv, flat = adv_lib.group_advantages_by_id(reward, group_ids, B)
        # The run's layout: each prompt's K rows one group, its prompt run once; flat
        # groups cut (a batch of B groups, filler flagged dead: one compiled step).
        r = r.replace(group_ids=group_ids)
        state, _ = step_fn(state, ts.group_batch(r, np.asarray(adv),
                                                 ts.live_rows(group_ids, flat), B))

    first, last = np.mean(curve[:WINDOW]), np.mean(curve[-WINDOW:])
    assert sigma > 0, null  # a reward with no spread could not be learnt (flat groups)
    assert last - first > margin, (
        f"mean reward {first:.3f} over the first {WINDOW} steps, {last:.3f} over the last "
        f"{WINDOW}: a rise of {last - first:.3f} <= margin {margin:.3f} (sigma {sigma:.4f} "
        f"from {NULL_STEPS} untrained steps); curve {np.round(curve, 3).tolist()}")
