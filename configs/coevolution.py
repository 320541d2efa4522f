r"""Co-evolved vs stale evaluator (Figure 2; METHOD 5-6): does re-adapting the generator to
the current policy matter?

    python -m experiments.coevolution --config=configs/coevolution.py --workdir=runs/coevo
    python -m experiments.coevolution --config=configs/coevolution.py:tiny --workdir=/tmp/co
    python -m experiments.coevolution --config=configs/coevolution.py:scale=qwen3_8b ...
    python -m experiments.coevolution --config=configs/coevolution.py:world=checks \
        --config.seed=1 --workdir=runs/coevo_checks_s1     # one seed a command; then
    python -m experiments.report runs/coevo_checks_s0 runs/coevo_checks_s1 ... --out=results
        # also writes coevolution-seeds.md, the runs' headline differences and their spread

Stages, each a run of the co-evolution loop (resumable) under the experiment's workdir:
    round0/     round 0 of Algorithm 1: G_0 -> G_1 on P_0's samples, P_0 -> P_1 with G_1
    coevolved/  a copy of round0/ continued for round 1: G_1 -> G_2 on P_1's samples,
                P_1 -> P_2 with G_2
    stale/      a copy of round0/ continued for round 1 with the generator frozen
                (rounds.generator_rounds = 1): P_1 -> ~P_2 with G_1
Both arms start from the same checkpoint and use the same seeds, so they differ only in
the generator's round-1 phase. Evaluation, on `experiment.eval_prompts` prompts that no
policy step used (rows after the first data.max_prompt_rows of `experiment.eval_file`,
a seeded subset): R_disc (Eq. 13) of G_1 and G_2 on the samples of P_1, P_2 and ~P_2
(paired: the same samples for both generators), and the win rate of P_0, P_1, P_2 and
~P_2 against the file's reference answers with the verifier as pairwise judge (paired:
the same prompts), all with bootstrap 95% CIs over prompts.
Switches after ':':
    scale=smollm2_cpu (default) | qwen3_8b   the base config (configs/<scale>.py)
    tiny                                     random-weight tiny models (tests, smoke runs)
CPU size (the default): SmolLM2-135M in every role on the shared data (policy prompts:
the first 64 AlpacaEval rows; evaluation: 8 of the rows after them), 2 generator and 2
policy steps per round as the default run, learning rate 1e-5 for both roles as the
ablation's and grpo_learns' (the paper's 5e-6 / 1e-6 are for 8B models over 100 steps; at
1e-6 two policy steps left every answer unchanged), soft verdicts, one rubric list per
prompt and generator in the R_disc evaluation, answers of <= 128 tokens. Measured alone
on 2026-12-02 (2 cores): round0 6.2 min, coevolved 5.9, stale 1.7 and, with 12
evaluation prompts, an evaluation of 18.7 min (32.5 min in all, over the 30-minute
budget); with the 8 prompts set here the evaluation took 12.5 min, 26.3 min in
all. It can only show large effects.
`world=checks` (METHOD 13; `checks_dir=DIR`): items are checks judged by their checkers,
the evaluation prompts are 16 of the world's held-out prompts drawn with
`experiment.eval_seed` (the same 16 for every `seed`: seeds are compared on one set), and the win rates
give way to exact figures: the gold score of each policy's greedy answers (P0, P1, P2,
~P2) and, on each arm's samples, the proxy (the Eq. 12 score of the generator it trained
against) minus the samples' gold. 2 generator and 6 policy steps a round (world v1,
`world_version=1`).
World v2 (the default world_version; checks world III's Q3, from G_sft), the "rounds"
evaluation over R = 3 rounds (`world_v2_rounds`):
    python -m experiments.coevolution --config=configs/coevolution.py:world=checks \
        --config.model.generator=runs/g_sft192/export/generator --config.seed=0 \
        --workdir=runs/q3/seed0
"""
import os

from configs.base import experiment_base


def get_config(arg: str = ""):
    c, opts, scale = experiment_base(arg, "shared")
    checks = opts.get("world") == "checks"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    c.experiment = dict(
        # Prompts with reference answers for the evaluation; its first
        # data.max_prompt_rows rows are skipped (the policy's training pool).
        eval_file=os.path.normpath(os.path.join(repo, "..", "shared", "data", "alpaca_eval",
                                                "eval.jsonl")),
        eval_prompts=16,        # a seeded subset of the remaining rows
        eval_seed=0,            # the checks world's subset: one set for every run seed
        num_lists=1,            # G rubric lists per prompt in the R_disc evaluation
        list_temperature=1.0,   # their sampling temperature
        answer_tokens=128,      # answer budget of the win-rate evaluation, tokens
        judge_max_tokens=1024,  # pairwise judge prompt budget, tokens
        n_bootstrap=1000,       # replicates of every 95% CI (prompts resampled)
        # samples: after training, R = 2 (the fields above); rounds: the checks world's
        # gold curve and training gaps, logged while the arms train (world v2)
        evaluation="samples",
    )
    c.rounds.num_rounds = 2
    c.rounds.heldout_eval = False
    c.export = False
    if scale == "smollm2_cpu" and not opts.get("tiny"):
        c.generator.train.learning_rate = 1e-5
        c.policy.train.learning_rate = 1e-5  # grpo_learns' rate: 1e-6 left P_2 = P_0
        c.experiment.eval_prompts = 8         # the 30-minute budget (docstring)
    if checks:
        # METHOD 13: exact gold scores instead of judged win rates. The evaluation prompts
        # are the world's held-out prompts (none trains), answers at the policy's budget.
        from configs.checks_world import CHECKS_FILES

        c.experiment.eval_file = os.path.join(c.data.checks_dir, CHECKS_FILES["heldout"])
        c.experiment.answer_tokens = c.policy.max_new_tokens
        v2 = c.data.checks_world_version == 2
        if scale == "smollm2_cpu" and not opts.get("tiny") and not v2:
            c.rounds.policy_steps = 6
            c.experiment.eval_prompts = 16
        if v2:
            world_v2_rounds(c, scale, bool(opts.get("tiny")))
    if opts.get("tiny"):
        c.rounds.generator_steps = c.rounds.policy_steps = 1
        if checks and c.data.checks_world_version == 2:
            c.rounds.heldout_gold_rows = 2
        if not checks:
            c.experiment.eval_file = os.path.join(repo, "drubric_jax", "demo_data",
                                                  "anchors.jsonl")
        c.data.max_prompt_rows = 0
        c.experiment.eval_prompts = 3
        c.experiment.answer_tokens = 16
        c.experiment.judge_max_tokens = 384
        c.experiment.n_bootstrap = 200
    elif scale == "qwen3_8b":
        if not checks:
            c.experiment.eval_file = ""  # set: a JSONL of prompts with "reference" answers
        c.experiment.eval_prompts = 256
        c.experiment.num_lists = 4
        c.experiment.answer_tokens = 2048
        c.experiment.judge_max_tokens = 8192
    return c


# Q3 of checks world III in world v2, sized to 30 minutes a seed alone on 2 cores (about
# 1.5 min a generator step, 0.8 min a policy step and 0.8 min a gold point of 64 prompts).
V2_ROUNDS, V2_GENERATOR_STEPS, V2_POLICY_STEPS, V2_GOLD_ROWS = 3, 1, 4, 64


def world_v2_rounds(c, scale: str, tiny: bool) -> None:
    """World v2's co-evolution (checks world III, Q3; in place): R = 3 rounds evaluated
    from the runs' own logs (`experiment.evaluation = "rounds"`): the held-out gold curve
    on the first V2_GOLD_ROWS held-out prompts before round 0 and after each round, and the
    training samples' proxy-minus-gold gap. The world's LoRA learning rates and K = 8 stay
    (configs/checks_world.py); Q1's policy batch (2 prompts a step); the generator's
    training lists are all anchor lists of the gen_rl split, K = 8 responses each, the
    policy's prompts the policy split; the gold curve is the reported result, so it reads
    the heldout split (`rounds.heldout_gold_split`; issue 53); the policy's reward lists
    are at Q1's list temperature (configs/checks_policy.py LIST_TEMPERATURE, set there
    once: greedy, as G_sft's recovery was measured).
    G_0 is G_sft: pass --config.model.generator=runs/g_sft192/export/generator."""
    from configs.checks_policy import LIST_TEMPERATURE, V2_PROMPTS_PER_STEP

    e = c.experiment
    e.evaluation = "rounds"
    c.rounds.num_rounds = V2_ROUNDS
    c.rounds.heldout_gold_path = e.eval_file
    c.rounds.heldout_gold_split = "heldout"  # the curve is Q3's reported result
    # Far apart: a point before round 0's first policy step and one after each round's last.
    c.rounds.heldout_gold_every = 10 ** 6
    c.rounds.heldout_gold_rows = V2_GOLD_ROWS
    c.policy.rubric_temperature = LIST_TEMPERATURE
    c.data.max_responses, c.data.max_anchor_rows = 8, 0
    # Every prompt of the policy split and every anchor list of the gen_rl split trains:
    # nothing here scores held-out anchor lists (rounds.heldout_eval is off).
    c.data.max_prompt_rows, c.data.heldout_anchor_rows = 0, 0
    c.data.heldout_anchor_paths = ()
    if scale == "smollm2_cpu" and not tiny:
        from configs.checks_world import V2_LORA

        c.generator.train.learning_rate = V2_LORA["generator_lr"]
        c.policy.train.learning_rate = V2_LORA["policy_lr"]
        c.rounds.generator_steps, c.rounds.policy_steps = V2_GENERATOR_STEPS, V2_POLICY_STEPS
        c.policy.prompts_per_step = V2_PROMPTS_PER_STEP
