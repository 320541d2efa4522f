r"""Does a rubric reward raise the gold score? Policy-only GRPO in the checks world (issue 32,
question 1; METHOD 13), one run per arm and seed.

    python -m experiments.checks_policy --config=configs/checks_policy.py --workdir=runs/checks_policy
    python -m experiments.checks_policy --config=configs/checks_policy.py \
        --config.experiment.arms=gold,rubric_g0,rubric_trained \
        --config.experiment.trained_generator=runs/gen_trained/export/generator ...
    python -m experiments.checks_policy --config=configs/checks_policy.py:tiny --workdir=/tmp/cp

Arms (`drubric_jax.evaluation.checks_policy.ARMS`), each from P_0 with the same seed:
    gold            config.policy.reward = "checks_gold": the gold score (upper bound)
    oracle          config.policy.reward = "checks_oracle": Eq. 12 of the prompt's true
                    checks as a rubric list of equal weights (the rubric reward's upper bound)
    rubric_sft      config.policy.reward = "rubric" with `experiment.sft_generator` (G_sft,
                    the export of experiments.sft_generator)
    rubric_g0       config.policy.reward = "rubric" with the untrained generator G_0
    rubric_trained  the same with `experiment.trained_generator` (a Hugging Face directory,
                    e.g. the export/generator of a generator-only run on the anchor lists;
                    `{seed}` in it is each run's seed, so seed S can read the generator
                    that experiments.ablation's seed S trained)
The arms differ only in their reward (METHOD 15): config.policy.reward and, for a rubric
arm, config.model.generator. Every other setting is the experiment's, the list temperature
included: `experiment.list_temperature` (default `LIST_TEMPERATURE`, 0 = greedy) is the
config.policy.rubric_temperature of every arm (`arm_config`; no arm overrides it; the gold
and oracle arms load no generator and leave it unread), and the experiment's setup line
prints it. Each arm's run writes its resolved settings to settings.json in its directory.
The checks world's files come from `checks_dir` (configs/checks_world.py `checks_world`);
held-out prompts are its heldout.jsonl, never trained on.
Switches after ':': scale=smollm2_cpu (default) | qwen3_8b, tiny, checks_dir=DIR,
world_version=2 (default) | 1.
World v2 (issues 40 and 53; data in ../checks_world_v2_splits): the policy trains on the
policy split (policy.jsonl), the held-out evaluation reads the heldout split
(heldout.jsonl) and the gold curve logged while it trains the dev split (dev.jsonl); a file
of another split stops the run (`data.splits`). SmolLM2-135M with rank-16 LoRA, beta = 0,
V2_PROMPTS_PER_STEP prompts x K = 8 responses of <= 64 tokens a step for V2_POLICY_STEPS
steps; held-out answers greedy and 1 sample per prompt at temperature 1; the gold curve on
the first 64 dev prompts every 10 steps (`rounds.gold_curve`).
World v1 (`world_version=1`, the runs of results/checks_world): 2 prompts x K = 4 a step,
`experiment.policy_steps` = 20 steps of full fine-tuning at learning rate 1e-5, held-out
answers greedy.
"""
import os

from configs.base import checks_experiment_base


# World v2's gold-arm schedule (results/checks_world_v2/sweep.md chose it).
V2_PROMPTS_PER_STEP, V2_POLICY_STEPS = 2, 20
# The list temperature of every rubric arm (experiment.list_temperature's default; also
# the co-evolution's policy reward lists, configs/coevolution.py): greedy, as G_sft's
# held-out recovery was measured (configs/sft_generator.py sft.eval_temperature). To be
# chosen on the development split; a second level is a factor of its own (METHOD 15).
LIST_TEMPERATURE = 0.0


def get_config(arg: str = ""):
    # arm=NAME: the loop config of that arm (`arm_config`), runnable by experiments.run
    # and experiments.sweep (`get_sweep`); the other switches are experiment_base's.
    parts = [p for p in (arg or "").split(",") if p]
    arm = next((p.partition("=")[2] for p in parts if p.startswith("arm=")), "")
    arg = ",".join(p for p in parts if not p.startswith("arm="))
    c, opts, scale = checks_experiment_base(arg, "configs/checks_policy.py")
    c.experiment = dict(
        arms="gold,rubric_g0",  # comma-separated, run in this order, each in DIR/seed<S>/<arm>
        seeds="0,1,2",          # config.seed of each repeat (data order, sampling, init)
        policy_steps=20,        # policy GRPO steps per run
        trained_generator="",   # model.generator of the rubric_trained arm (an HF directory;
                                # `{seed}` in it is filled with each run's seed)
        sft_generator="",       # model.generator of the rubric_sft arm (G_sft's export)
        list_temperature=LIST_TEMPERATURE,  # every rubric arm's lists (0 = greedy)
        heldout_rows=0,         # held-out prompts answered (0 = all of heldout.jsonl)
        eval_samples=0,         # held-out answers per prompt at the temperature (0 = greedy only)
        eval_batch=32,          # held-out prompts per sampler call
        n_bootstrap=1000,       # replicates of every 95% CI (held-out prompts resampled)
        window=5,               # steps averaged at each end of a training curve
    )
    c.rounds.num_rounds, c.rounds.generator_steps = 1, 0
    c.rounds.heldout_eval = False
    c.data.heldout_anchor_rows = 0
    c.export = True  # the trained policy is read back from DIR/.../export/policy
    v2 = c.data.checks_world_version == 2
    if scale == "smollm2_cpu" and not v2:  # world v1: the settings of results/checks_world
        c.policy.train.learning_rate = 1e-5
        c.checkpoint.every_steps = 5
    if v2:
        # World v2 (issue 40): no generator trains here, so no anchor list is read; LoRA
        # trainees, beta = 0 and K = 8 come from configs/checks_world.py.
        c.data.anchor_paths = c.data.heldout_anchor_paths = ()
        c.policy.prompts_per_step = V2_PROMPTS_PER_STEP
        c.experiment.policy_steps = V2_POLICY_STEPS
        c.experiment.eval_samples = 1       # held-out answers per prompt at the temperature
        c.experiment.eval_batch = 64
        c.checkpoint.every_steps = 10
        c.checkpoint.max_to_keep = 1
        # The gold curve: the first 64 dev prompts every 10 policy steps (dev.jsonl and
        # the dev split, configs/checks_world.py: the sweep chose settings from it; the
        # reported held-out split is read once, by the evaluation after training).
        c.rounds.heldout_gold_every, c.rounds.heldout_gold_rows = 10, 64
    if opts.get("tiny"):
        c.experiment.policy_steps, c.experiment.seeds, c.experiment.window = 2, "0", 1
        c.rounds.heldout_gold_every, c.rounds.heldout_gold_rows = (1, 4) if v2 else (0, 0)
        c.policy.prompts_per_step = 2
        c.experiment.heldout_rows, c.experiment.eval_batch = 4, 4
        c.experiment.n_bootstrap = 200
        c.checkpoint.every_steps = 1
    return arm_config(c, arm, c.seed) if arm else c


# The LoRA sweep of world v2's gold arm (results/checks_world_v2/sweep.md): (rank, policy
# learning rate), each run V2_SWEEP_STEPS policy steps on seed 0.
V2_SWEEP = ((16, 3e-4), (16, 1e-3), (64, 1e-3))
V2_SWEEP_STEPS = 10


def get_sweep(hyper=None):
    """The gold arm's LoRA sweep as override dicts, for
    `python -m experiments.sweep --config=configs/checks_policy.py:arm=gold
    --workdir=runs/v2_sweep` (each run logs the held-out gold curve)."""
    del hyper
    return [{"config.lora.rank": r, "config.policy.train.learning_rate": lr,
             "config.rounds.policy_steps": V2_SWEEP_STEPS,
             "config.rounds.heldout_gold_every": V2_SWEEP_STEPS, "config.export": False}
            for r, lr in V2_SWEEP]


def arm_config(c, arm: str, seed: int | None = None):
    """The loop config of one arm (configs/checks_policy.py): the experiment's run config
    with the arm's reward (config.policy.reward; a rubric arm's generator in
    config.model.generator), its policy steps, and the experiment's list temperature as
    config.policy.rubric_temperature (every arm alike). Nothing else differs between arms
    (tests/test_settings.py::test_arms_differ_only_in_their_reward).

    Args:
        c: the experiment config (`get_config`).
        arm: one of `drubric_jax.evaluation.checks_policy.ARMS`.
        seed: the repeat this config is for. A generator path may hold `{seed}`
            (e.g. `runs/q2/seed{seed}/full/export/generator`: each policy seed reads the
            generator that the ablation's seed of the same number trained); the path is
            filled with it.

    Raises:
        ValueError: an unknown arm; rubric_trained / rubric_sft without its generator
            directory (experiment.trained_generator / sft_generator); a path with `{seed}`
            and no seed given.
    """
    from drubric_jax.checks.gold import GOLD_REWARD, ORACLE_REWARD
    from drubric_jax.evaluation.checks_policy import ARMS
    from drubric_jax.rl import rule_rewards

    if arm not in ARMS:
        raise ValueError(f"config.experiment.arms: {arm!r} is not one of {sorted(ARMS)}")
    cfg = c.copy_and_resolve_references()
    cfg.rounds.policy_steps = int(c.experiment.policy_steps)
    cfg.policy.reward = {"gold": GOLD_REWARD, "oracle": ORACLE_REWARD}.get(
        arm, rule_rewards.RUBRIC)
    field = {"rubric_trained": "trained_generator", "rubric_sft": "sft_generator"}.get(arm)
    if field:
        path = c.experiment[field]
        if "{seed}" in path:
            if seed is None:
                raise ValueError(f"config.experiment.{field}: {path!r} holds {{seed}}; "
                                 f"arm_config needs the seed to fill it")
            path = path.replace("{seed}", str(int(seed)))
        if not path or not os.path.isdir(path):
            raise ValueError(f"config.experiment.{field}: the {arm} arm needs a Hugging Face "
                             f"directory of a generator, got {path!r}")
        cfg.model.generator = os.path.abspath(path)
    # One list temperature for every arm (the experiment's, METHOD 15): configs/smollm2_cpu.py's
    # 1.0 is the LLM world's, where greedy SmolLM2 copies its prompt's format line.
    cfg.policy.rubric_temperature = float(c.experiment.list_temperature)
    return cfg
