r"""Does a rubric reward raise the gold score? Policy-only GRPO in the checks world (issue 32,
question 1; METHOD 13), one run per arm and seed.

    python -m experiments.checks_policy --config=configs/checks_policy.py --workdir=runs/checks_policy
    python -m experiments.checks_policy --config=configs/checks_policy.py \
        --config.experiment.arms=gold,rubric_g0,rubric_trained \
        --config.experiment.trained_generator=runs/gen_trained/export/generator ...
    python -m experiments.checks_policy --config=configs/checks_policy.py:tiny --workdir=/tmp/cp

Arms (`drubric_jax.evaluation.checks_policy.ARMS`), each from P_0 with the same seed:
    gold            config.policy.reward = "checks_gold": the gold score (upper bound)
    rubric_g0       config.policy.reward = "rubric" with the untrained generator G_0
    rubric_trained  the same with `experiment.trained_generator` (a Hugging Face directory,
                    e.g. the export/generator of a generator-only run on the anchor lists)
The checks world's files come from `checks_dir` (configs/smollm2_cpu.py `checks_world`);
held-out prompts are its heldout.jsonl, never trained on.
Switches after ':': scale=smollm2_cpu (default) | qwen3_8b, tiny, checks_dir=DIR.
CPU size (the default): SmolLM2-135M, 2 prompts x K = 4 responses of <= 64 tokens a step,
`experiment.policy_steps` steps at learning rate 1e-5 (as configs/grpo_learns.py, whose
docstring says why not the paper's 1e-6), held-out answers greedy at the same budgets.
"""
import os

from configs.base import checks_experiment_base


def get_config(arg: str = ""):
    c, opts, scale = checks_experiment_base(arg, "configs/checks_policy.py")
    c.experiment = dict(
        arms="gold,rubric_g0",  # comma-separated, run in this order, each in DIR/seed<S>/<arm>
        seeds="0,1,2",          # config.seed of each repeat (data order, sampling, init)
        policy_steps=20,        # policy GRPO steps per run
        trained_generator="",   # model.generator of the rubric_trained arm (an HF directory)
        heldout_rows=0,         # held-out prompts answered (0 = all of heldout.jsonl)
        eval_batch=32,          # held-out prompts per sampler call
        n_bootstrap=1000,       # replicates of every 95% CI (held-out prompts resampled)
        window=5,               # steps averaged at each end of a training curve
    )
    c.rounds.num_rounds, c.rounds.generator_steps = 1, 0
    c.rounds.heldout_eval = False
    c.data.heldout_anchor_rows = 0
    c.export = True  # the trained policy is read back from DIR/.../export/policy
    if scale == "smollm2_cpu":
        c.policy.train.learning_rate = 1e-5
        c.checkpoint.every_steps = 5
    if opts.get("tiny"):
        c.experiment.policy_steps, c.experiment.seeds, c.experiment.window = 2, "0", 1
        c.experiment.heldout_rows, c.experiment.eval_batch = 4, 4
        c.experiment.n_bootstrap = 200
        c.checkpoint.every_steps = 1
        c.generator.max_items, c.generator.max_new_tokens = 3, 128  # as smollm2_cpu's tiny
    return c


def arm_config(c, arm: str):
    """The loop config of one arm (configs/checks_policy.py).

    Raises:
        ValueError: an unknown arm, or rubric_trained without experiment.trained_generator.
    """
    from drubric_jax.checks import GOLD_REWARD
    from drubric_jax.evaluation.checks_policy import ARMS
    from drubric_jax.rl import rule_rewards

    if arm not in ARMS:
        raise ValueError(f"config.experiment.arms: {arm!r} is not one of {sorted(ARMS)}")
    cfg = c.copy_and_resolve_references()
    cfg.rounds.policy_steps = int(c.experiment.policy_steps)
    cfg.policy.reward = GOLD_REWARD if arm == "gold" else rule_rewards.RUBRIC
    if arm == "rubric_trained":
        path = c.experiment.trained_generator
        if not path or not os.path.isdir(path):
            raise ValueError("config.experiment.trained_generator: the rubric_trained arm needs "
                             f"a Hugging Face directory of a trained generator, got {path!r}")
        cfg.model.generator = os.path.abspath(path)
    return cfg
