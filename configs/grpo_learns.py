r"""Does GRPO learn at all? Policy-only runs, a rule reward first, then DynamicRubric.

    python -m experiments.grpo_learns --config=configs/grpo_learns.py --workdir=runs/grpo_learns
    python -m experiments.grpo_learns --config=configs/grpo_learns.py:tiny --workdir=/tmp/gl
    python -m experiments.grpo_learns --config=configs/grpo_learns.py:scale=qwen3_8b ...

Each part is a run of the co-evolution loop with no generator steps (the generator stays
G_0, the untrained backbone: the zero-shot dynamic rubric of METHOD 6) and
`experiment.policy_steps` policy GRPO steps, in its own workdir under the experiment's:
    rule     `config.policy.reward = experiment.rule` (default `word_limit`, 1..N words,
             N = policy.reward_max_words): a reward a 135M policy can move in minutes
    rubric   `config.policy.reward = "rubric"`: Eq. 12 scores of G_0's list and the frozen
             verifier, with this config's verdict mode (soft at CPU size, METHOD 12)
Switches after ':':
    scale=smollm2_cpu (default) | qwen3_8b   the base config (configs/<scale>.py)
    tiny                                     random-weight tiny models (tests, smoke runs)
CPU size (the default): SmolLM2-135M in every role, 2 prompts x K = 4 responses of <= 64
tokens per step, 30 steps per part, policy learning rate 1e-5 (the paper's 1e-6 is for
8B models with 256 responses a step; 30 steps of 8 responses at 1e-6 barely move a 135M
model), N = 16 words. Held-out evaluation and export are off: the generator never trains.
Measured alone on 2026-12-02 (2 cores): 21.8 min (rule 8.1, rubric 13.7).
The qwen3_8b scale keeps that config's settings (K = 8, 256 responses per step, lr 1e-6).
"""
from configs.base import experiment_base


def get_config(arg: str = ""):
    c, opts, scale = experiment_base(arg, "demo")
    c.experiment = dict(
        parts="rule,rubric",   # comma-separated, run in this order, each in DIR/<part>
        policy_steps=30,       # policy GRPO steps per part
        rule="word_limit",     # the rule part's config.policy.reward (rule_rewards.RULES)
        first_steps=5,         # the learning-curve difference: mean of the last ...
        last_steps=5,          # ... steps minus the mean of the first ones
        n_bootstrap=1000,      # replicates of its 95% CI (prompt groups resampled)
    )
    c.rounds.num_rounds, c.rounds.generator_steps = 1, 0
    c.data.heldout_anchor_rows = 0
    c.export = False
    if scale == "smollm2_cpu":
        c.policy.train.learning_rate = 1e-5
        c.policy.reward_max_words = 16
        c.checkpoint.every_steps = 5
    if opts.get("tiny"):
        c.experiment.policy_steps, c.experiment.first_steps, c.experiment.last_steps = 4, 2, 2
        c.experiment.n_bootstrap = 200
        c.checkpoint.every_steps = 1
    return c
