r"""The GRPO update, shared-prefix against per-row, on the same rows (issue 54).

    python -m experiments.bench_update                      # both roles, 3 paired rounds
    python -m experiments.bench_update --roles=policy --reps=5

Workload: the checks world's shapes (configs/smollm2_cpu.py:world=checks, world v2) on the
default model (SmolLM2-135M-Instruct, float32, rank-16 LoRA on every matrix, beta = 0, as
the world's trainees):
    policy      2 prompts x K = 8 answers: a 128-token prompt bucket, answers of <= 64
                tokens (lengths drawn in [16, 64], a quarter cut at 64); one micro-batch
    generator   1 input x G = 4 rubric lists: a 1,536-token input bucket, lists of <= 96
                tokens; one micro-batch a row (per-row) or a group (shared), as the CPU
                config's micro_batch_size = 1 gives
Token ids are random (the cost does not depend on them); the prompt buckets are full.

Implementations, each one jitted `train_step.train_step` on the same rows:
    per_row            `Batch`: every row runs its prompt again (the update before issue 54)
    shared_prefix      `GroupBatch`: each group's prompt once, at the same `remat`
    shared_prefix_run  `GroupBatch` with the remat the run resolves for the role
                       (`--run_remat`, default off: the planner's "auto" on this machine)
`--remat` is the per-row and shared_prefix setting (default on: today's CPU configs).
They alternate call by call (`bench_common.paired_rounds`), so the machine's drift does not
bias their ratios.

Output, one JSON object per line: per implementation and role
    {"impl", "role", "remat", "rows", "groups", "prompt_bucket", "completion",
     "tokens_forward", "seconds_median", "seconds_rounds", "warmup_s", "peak_rss_mb"}
then per role {"impl": "shared_vs_per_row", "role", "speedup_median"} (per-row seconds /
shared-prefix seconds, the median over rounds of each round's ratio; same remat) and
{"impl": "run_vs_per_row", "role", "speedup_median"} (the run's update against today's).
"""
from __future__ import annotations

import functools
import statistics

from absl import flags

from experiments import cli  # noqa: E402
from experiments.bench_common import emit, paired_rounds, peak_rss_mb, timed

_ROLES = flags.DEFINE_list("roles", ["policy", "generator"], "roles to time")
_REPS = flags.DEFINE_integer("reps", 3, "paired rounds after the warm-up (compile) call")
_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "model source")
_REMAT = flags.DEFINE_bool("remat", True, "remat of per_row and shared_prefix")
_RUN_REMAT = flags.DEFINE_bool("run_remat", False, "remat of shared_prefix_run")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the token ids, lengths and advantages")

# (groups, rows a group, prompt bucket, completion budget, rows a micro-batch): the checks
# world's steps (configs/checks_world.py, world v2; configs/smollm2_cpu.py micro-batches).
ROLES = {"policy": (2, 8, 128, 64, 16), "generator": (1, 4, 1536, 96, 1)}
LORA_RANK, LORA_ALPHA = 16, 32.0


def synthetic_rollout(groups: int, rows: int, prompt: int, new: int, vocab: int, seed: int):
    """A Rollout of `groups` groups of `rows` rows: full prompt buckets of random ids, one
    prompt a group; answers of lengths in [new / 4, new], a quarter at the budget."""
    import numpy as np

    from drubric_jax.types import Rollout

    rng = np.random.default_rng(seed)
    r = groups * rows
    prompts = rng.integers(10, vocab, (groups, prompt)).astype(np.int32)
    lengths = rng.integers(new // 4, new + 1, r)
    lengths[rng.random(r) < 0.25] = new
    mask = np.arange(new)[None] < lengths[:, None]
    tokens = np.where(mask, rng.integers(10, vocab, (r, new)), 0).astype(np.int32)
    return Rollout(prompt_tokens=np.repeat(prompts, rows, 0),
                   prompt_mask=np.ones((r, prompt), bool), tokens=tokens,
                   logprobs=np.where(mask, -2.0, 0.0).astype(np.float32), mask=mask,
                   lengths=lengths.astype(np.int32), truncated=lengths == new,
                   invalid=np.zeros(r, bool),
                   group_ids=np.repeat(np.arange(groups), rows).astype(np.int32))


def role_timers(role: str, base: dict, cfg, seed: int) -> dict:
    """{impl: (timer returning (seconds,), description)} of one role's three updates."""
    import jax
    import numpy as np

    from drubric_jax.rl import train_config
    from drubric_jax.rl import train_step as ts

    groups, rows, prompt, new, micro = ROLES[role]
    rollout = synthetic_rollout(groups, rows, prompt, new, cfg.vocab_size, seed)
    r = groups * rows
    adv = np.random.default_rng(seed + 1).standard_normal(r).astype(np.float32)
    live = np.ones(r, bool)
    trainee = cfg.replace(lora_rank=LORA_RANK, lora_alpha=LORA_ALPHA)
    adapters = ts.trainable_init(trainee, jax.random.PRNGKey(seed), base)
    batches = {"per_row": ts.batch_from_rollout(rollout, adv, live),
               "shared_prefix": ts.group_batch(rollout, adv, live),
               "shared_prefix_run": ts.group_batch(rollout, adv, live)}
    remat = {"per_row": _REMAT.value, "shared_prefix": _REMAT.value,
             "shared_prefix_run": _RUN_REMAT.value}
    timers, info = {}, {}
    for impl, batch in batches.items():
        tc = train_config.TrainConfig(learning_rate=1e-4, beta=0.0, micro_batch_size=micro,
                                      temperature=1.0, mu_dtype="bfloat16",
                                      remat=remat[impl])
        optimizer = train_config.make_optimizer(tc)
        state = ts.init_train_state(adapters, optimizer)
        # No donation: every call starts from the same state (the update is what is timed).
        step = jax.jit(functools.partial(ts.train_step, model_cfg=trainee, train_cfg=tc,
                                         optimizer=optimizer))
        batch = jax.device_put(batch)

        def timer(step=step, state=state, batch=batch):
            return (timed(lambda: jax.block_until_ready(step(state, batch, base)))[1],)

        timers[impl] = timer
        tokens = (groups * (prompt + rows * new) if impl != "per_row"
                  else r * (prompt + new))
        info[impl] = dict(remat=remat[impl], rows=r, groups=groups, prompt_bucket=prompt,
                          completion=new, tokens_forward=tokens)
    return timers, info


def main(argv):
    del argv
    from drubric_jax import models

    cfg, params, _ = models.load_model(_MODEL.value)
    for role in _ROLES.value:
        if role not in ROLES:
            raise ValueError(f"--roles: {role!r} is not one of {sorted(ROLES)}")
        timers, info = role_timers(role, params, cfg, _SEED.value)
        out = paired_rounds(timers, _REPS.value)
        for impl, res in out.items():
            secs = [t[0] for t in res["rounds"]]
            emit(impl=impl, role=role, **info[impl], seconds_median=round(
                statistics.median(secs), 3), seconds_rounds=[round(s, 3) for s in secs],
                warmup_s=round(res["first"][0], 3), peak_rss_mb=round(peak_rss_mb()))

        def speedup(impl):
            return round(statistics.median(
                a[0] / b[0] for a, b in zip(out["per_row"]["rounds"], out[impl]["rounds"])), 3)

        emit(impl="shared_vs_per_row", role=role, speedup_median=speedup("shared_prefix"))
        emit(impl="run_vs_per_row", role=role, speedup_median=speedup("shared_prefix_run"))


if __name__ == "__main__":
    cli.run(main)
