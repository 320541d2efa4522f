r"""Sensitivity in the checks world (issue 32, question 4; METHOD 13): lambda of Eq. 24-25 at
three values including the paper's (1), and K in {4, 8}, one seed each.

    python -m experiments.sensitivity --config=configs/sensitivity.py --workdir=runs/sensitivity
    python -m experiments.sensitivity --config=configs/sensitivity.py \
        --config.experiment.settings=lam1,k8 --workdir=runs/sensitivity   # some of them
    python -m experiments.sensitivity --config=configs/sensitivity.py:tiny --workdir=/tmp/se

Each setting of `experiment.settings` (`SETTINGS`: config overrides) is one round of the
co-evolution loop (`rounds.generator_steps` generator steps, then `rounds.policy_steps`
policy steps with the adapted generator) from G_0 and P_0 with the same seed, in
`<workdir>/<setting>/`. Then, as the ablation does, the trained generator writes
`experiment.eval_lists` lists per held-out anchor list (one fixed key for every setting:
paired), scored for constraint F1 (with arguments and on check ids), Delta_gap, R_anchor
and pairwise accuracy; and the trained policy answers the held-out prompts greedily
(gold score, paired against P_0 and against the paper's setting `lam1`).
Switches after ':': scale=smollm2_cpu (default) | qwen3_8b, tiny, checks_dir=DIR.
CPU size: 3 generator steps and 10 policy steps a setting at learning rate 1e-5 (as the
ablation's and grpo_learns'), 16 held-out anchor lists. Measured on 2026-12-05 on 2 cores
shared with two other jobs: lam1 41 min (training 31, generator scoring 9, policy 1),
lam0.5 34 min; alone an estimated ~15-20 (a generator step ~2.2 min, a policy step ~0.5
min at K = 4). A process that ran two settings held 11.6 GB: run one setting a command,
then all of them in one command to write the table (finished parts are skipped).
"""
from configs.base import checks_experiment_base

# setting -> config overrides (dotted field -> value). lam1 is the paper's lambda at K = 4
# (this scale's K; the paper: 8); k8 is K = 8 at the paper's lambda.
SETTINGS = {
    "lam0.5": {"generator.lam": 0.5},
    "lam1": {"generator.lam": 1.0},
    "lam2": {"generator.lam": 2.0},
    "k8": {"policy.num_responses": 8},
}
BASELINE = "lam1"


def get_config(arg: str = ""):
    c, opts, scale = checks_experiment_base(arg, "configs/sensitivity.py")
    c.experiment = dict(
        settings="lam0.5,lam1,lam2,k8",  # run in this order, each in DIR/<setting>
        eval_lists=2,           # rubric lists per held-out anchor list (AVG@n)
        eval_temperature=1.0,   # their sampling temperature
        heldout_rows=0,         # held-out prompts answered by the policy (0 = all)
        eval_batch=32,          # held-out prompts per sampler call
        n_bootstrap=1000,       # replicates of every 95% CI
    )
    c.rounds.num_rounds = 1
    c.rounds.heldout_eval = False
    c.data.heldout_anchor_rows = 16
    c.export = True  # the trained policy is read back from DIR/<setting>/export/policy
    if scale == "smollm2_cpu" and not opts.get("tiny"):
        c.rounds.generator_steps, c.rounds.policy_steps = 3, 10
        c.generator.train.learning_rate = c.policy.train.learning_rate = 1e-5
        c.checkpoint.every_steps = 13  # one save, at the end of a setting's round
    if opts.get("tiny"):
        c.rounds.generator_steps = c.rounds.policy_steps = 1
        c.data.heldout_anchor_rows = 1
        c.experiment.heldout_rows, c.experiment.eval_batch = 2, 2
        c.experiment.n_bootstrap = 200
        c.generator.max_items, c.generator.max_new_tokens = 2, 96
    return c


def setting_config(c, name: str):
    """The loop config of one setting (`configs.sensitivity.SETTINGS`).

    Raises:
        ValueError: an unknown setting.
    """
    if name not in SETTINGS:
        raise ValueError(f"config.experiment.settings: {name!r} is not one of {list(SETTINGS)}")
    cfg = c.copy_and_resolve_references()
    for field, value in SETTINGS[name].items():
        section, key = field.split(".")
        cfg[section][key] = value
    return cfg
