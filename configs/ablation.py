r"""Generator objective ablation (Table 3; METHOD 6): full vs disc_only vs anchor_only, and
the untrained (zero-shot) generator, scored on held-out anchor lists.

    python -m experiments.ablation --config=configs/ablation.py --workdir=runs/ablation
    python -m experiments.ablation --config=configs/ablation.py:tiny --workdir=/tmp/abl
    python -m experiments.ablation --config=configs/ablation.py:scale=qwen3_8b ...

Each variant of `experiment.variants` is one round of the co-evolution loop with only the
generator phase (`rounds.generator_steps` GRPO steps, no policy steps) in
`<workdir>/<variant>/`. All variants start from the same G_0 and P_0 with the same seed,
so they see the same anchor batches and the same policy samples (the policy is fixed in a
generator phase and its sampling keys depend on (round, phase, step) only); only the
advantage (Eq. 24-25 weights of the variant) differs. The zero-shot generator is G_0.
Then each generator writes `experiment.eval_lists` rubric lists per held-out anchor list
(the config's `data.heldout_anchor_rows` lists, split off by the seeded shuffle of
`data.load_data` and never used in training), sampled at `experiment.eval_temperature`
with one fixed key for every generator (paired), and is scored there (Delta_gap Eq. 2,
R_anchor Eq. 15, strict pairwise accuracy), with bootstrap CIs over anchor lists.
Switches after ':':
    scale=smollm2_cpu (default) | qwen3_8b   the base config (configs/<scale>.py)
    tiny                                     random-weight tiny models (tests, smoke runs)
CPU size (the default): SmolLM2-135M in every role on the shared data (anchor lists from
RM-Bench chat and AlpacaEval listwise, <= 4 responses each; 16 held out), 2 generator
steps of 1 anchor list x G = 4 lists per variant at learning rate 1e-5 (the paper's 5e-6
is for 8B models over 100 steps; a few steps barely move a 135M model at it), soft
verdicts (METHOD 12), 2 lists per held-out anchor list. Sized to the 30-minute budget:
24 held-out lists and 3 steps took about 35-40 min alone. Measured alone on 2026-12-02
(2 cores): 29.8 min (full 13.3 with G_0's scoring, disc_only 8.8, anchor_only 7.7; each
generator step about 1.9 min). It can only show large effects. The qwen3_8b scale keeps
that config's settings (100 generator steps, 256 held-out Nectar lists, hard verdicts).
`world=checks` (METHOD 13): the checks world's anchor lists (16 of them held out), the
checkers' exact verdicts, 3 generator steps a variant (about 2.2 min each alone: the
generator writes 4 JSON lists of <= 256 tokens from a ~1,400-token prompt), and the
held-out constraint F1 of each generator beside Delta_gap, R_anchor and pairwise accuracy.
In world v2 (the default world_version; checks world III's Q2, from G_sft with
`--config.model.generator=runs/g_sft192/export/generator`): the world's LoRA learning rate
(1e-4), lists of K = 8 responses, all 64 anchor lists of the gen_rl split
(gen_rl_anchors.jsonl), and 16 held-out lists drawn from the heldout split's
heldout_anchors.jsonl (`data.heldout_anchor_paths`); a file of another split stops the run
(`data.splits`, issue 53).
"""
from configs.base import experiment_base
from configs.checks_world import V2_LORA, world_files


def get_config(arg: str = ""):
    c, opts, scale = experiment_base(arg, "shared")
    c.experiment = dict(
        variants="full,disc_only,anchor_only",  # trained one after another, DIR/<variant>
        baseline="zero_shot",  # G_0, scored too; differences are taken against it
        eval_lists=2,          # rubric lists per held-out anchor list (AVG@n)
        eval_temperature=1.0,  # their sampling temperature (0 = greedy)
        n_bootstrap=1000,      # replicates of every 95% CI (held-out lists resampled)
    )
    # Generator phase only; the experiment scores the held-out lists itself.
    c.rounds.num_rounds, c.rounds.policy_steps = 1, 0
    c.rounds.heldout_eval = False
    c.export = False
    if scale == "smollm2_cpu" and not opts.get("tiny"):
        c.rounds.generator_steps = 2
        c.data.heldout_anchor_rows = 16
        c.generator.train.learning_rate = 1e-5
        c.checkpoint.every_steps = 2  # one save, at the end of a variant's steps
        if opts.get("world") == "checks":
            c.rounds.generator_steps = c.checkpoint.every_steps = 3
        if c.data.checks_world_version == 2:
            # World v2 (checks world III's Q2, from G_sft: --config.model.generator=DIR):
            # the world's LoRA learning rate (1e-5 is for full fine-tuning), lists of K = 8
            # responses as G_sft saw, every anchor list of the gen_rl split, and held-out
            # lists of the heldout split (heldout_anchors.jsonl: prompts neither G_sft nor
            # the generator's RL ever saw, nor used to choose a setting; issue 53).
            c.generator.train.learning_rate = V2_LORA["generator_lr"]
            c.data.max_responses, c.data.max_anchor_rows = 8, 0
            c.data.heldout_anchor_paths = (
                world_files(2, c.data.checks_dir)["heldout_anchors"],)
    if opts.get("tiny"):
        c.rounds.generator_steps = 1
        c.data.heldout_anchor_rows = 4 if scale == "smollm2_cpu" else 2
        c.experiment.n_bootstrap = 200
    return c
