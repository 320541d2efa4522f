r"""Default run: SmolLM2-135M-Instruct in every role, sized so one round fits on 2 CPU cores.

    python -m experiments.run --config=configs/smollm2_cpu.py --workdir=runs/default
    python -m experiments.run --config=configs/smollm2_cpu.py:data=shared --workdir=runs/shared
    python -m experiments.run --config=configs/smollm2_cpu.py:variant=disc_only,tiny ...

The argument after ':' is a comma-separated list of switches:
    data=demo|shared   packaged demo set (default) or the real files in ../shared/data
    variant=full|disc_only|anchor_only|static
    tiny               a random-weight tiny model in every role (tests, smoke runs)
    world=llm|checks   checks: the checkable-item world (METHOD 13, `checks_world` below):
                       items are IFEval checks judged by their checkers, no verifier model;
                       data from checks_dir=DIR (default $DRUBRIC_CHECKS_DIR, else
                       ../checks_world_v2_splits next to the repo)
    world_version=2|1  the checks world's version: 2 (default) the calibrated pool, budgets
                       that cut no constraint, LoRA trainees; 1 the world of the runs in
                       results/checks_world (data in ../checks_world)
Any field can then be overridden with --config.<field>=<value>.

Verdicts are soft here (`verifier.verdict = "soft"`, METHOD 12), not the paper's 0/1: with
SmolLM2-135M as the verifier, P(yes) sits between 0.25 and 0.45 for nearly every item, so
every thresholded verdict is 0, every score 0 and every group flat (policy reward 0.0 and
zero-variance items 0.92-1.0 in the hard-verdict data=shared round; flat-group fraction
0.75 on average over the default run's policy steps). Its P(yes) still carries a signal
(the mean over four generic quality items ranks the preferred LLMBar-natural response
higher in 77% of 30 pairs, where the 0.5 threshold gets 20% right with 77% ties), which
soft verdicts pass on to Eq. 12-15. `--config.verifier.verdict=hard` gives the paper's.

The rubric lists that score the policy and the held-out lists are sampled at temperature 1
(`policy.rubric_temperature`, `policy.heldout_temperature`), not greedy: greedy SmolLM2
copies the JSON format line of its prompt ("<criterion>", "1.1.1.1...", "1", "2", ...), so
4 of 6 greedy lists on three demo prompts had no valid item (every score 0, every policy
group flat), against 0 of 6 sampled at temperature 1. That is the LLM world's list
temperature; the checks-world experiments set their own for every arm alike
(configs/checks_policy.py `experiment.list_temperature`, which configs/coevolution.py's
world v2 rounds share), so no arm keeps this one by omission.
"""
from configs.base import base_config, parse_switches

# The checks world lives in configs/checks_world.py (one transform for every scale and
# route); its names are re-exported here, where the runs and tests have always read them.
from configs.checks_world import (CHECKS_FILES, DEFAULT_WORLD_VERSION, REPO,  # noqa: F401
                                  V2_LORA, V2_POOL, WORLD_VERSIONS, WORLDS, build_commands,
                                  checks_dir, checks_world, pool_ids)


def get_config(arg: str = ""):
    opts = parse_switches(arg, {"data", "variant", "tiny", "world", "checks_dir",
                                "world_version"})
    c = base_config()
    c.data.name = opts.get("data", "demo")
    # Host memory (peak RSS <= 6 GB on CPU; docs/SCALE.md, "Memory of the roles"). One generator row per
    # forward-backward pass bounds the update's activations (1024-token prompts); the
    # policy's 8 short rows take one pass (no accumulator buffer). Adam's first moment is
    # stored in bfloat16 for both roles: 2 x 0.27 GB less for SmolLM2.
    c.generator.train.micro_batch_size = 1
    c.policy.train.micro_batch_size = 0
    c.generator.train.mu_dtype = c.policy.train.mu_dtype = "bfloat16"
    # The idle role's AdamW moments wait on disk during the other role's phase (0.81 GB).
    c.memory.park_idle_optimizer = True
    c.mesh.num_devices = 1  # sized for one CPU device (4 generator rows split over no more)
    c.variant = opts.get("variant", "full")
    c.verifier.verdict = "soft"  # why: the module docstring
    c.policy.rubric_temperature = c.policy.heldout_temperature = 1.0  # why: the docstring
    if c.data.name == "shared":
        # Prompts from AlpacaEval; anchor lists from RM-Bench chat (6 responses, chosen
        # tied above rejected) and AlpacaEval listwise (7 responses ranked by judge score).
        c.data.max_anchor_rows = 64
        c.data.max_prompt_rows = 64
        c.data.max_responses = 4
    if opts.get("tiny"):
        c.model.policy = c.model.generator = c.model.verifier = "tiny"
        c.policy.max_new_tokens = 16
        c.generator.max_new_tokens = 96
        c.generator.max_items = 3
        c.generator.max_item_chars = 40
        c.generator.input_budget, c.generator.keep_prompt = 1536, True
        c.verifier.max_prefix_tokens = 512
        c.verifier.max_suffix_tokens = 32
        c.generator.train.micro_batch_size = c.policy.train.micro_batch_size = 0
        c.export = False
    world = opts.get("world", "llm")
    if world not in WORLDS:
        raise ValueError(f"world={world!r} not in {WORLDS}")
    if world == "checks":
        checks_world(c, opts.get("checks_dir", ""),
                     int(opts.get("world_version", DEFAULT_WORLD_VERSION)))
    return c


def get_sweep(hyper=None):
    """The paper's generator ablation as override dicts (METHOD section 6); run them with
    `python -m experiments.sweep --config=configs/smollm2_cpu.py --workdir=runs/ablation`
    (4 runs of `make run`'s config, each as long as `make run` (README); add `:tiny` for a
    smoke sweep)."""
    del hyper
    return [{"config.variant": v} for v in ("full", "disc_only", "anchor_only", "static")]
