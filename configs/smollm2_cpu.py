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
                       ../checks_world next to the repo)
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
group flat), against 0 of 6 sampled at temperature 1.
"""
import os

from configs.base import base_config, parse_switches

# The files of the checks world in its directory (experiments/make_checks_data.py and
# make_checks_anchors.py write them): policy prompts, held-out prompts, anchor lists.
CHECKS_FILES = {"prompts": "train.jsonl", "heldout": "heldout.jsonl", "anchors": "anchors.jsonl"}
WORLDS = ("llm", "checks")


def checks_dir(given: str = "") -> str:
    """The checks world's directory: `given`, else $DRUBRIC_CHECKS_DIR, else ../checks_world
    next to the repository (absolute)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    d = given or os.environ.get("DRUBRIC_CHECKS_DIR") or os.path.join(repo, "..",
                                                                       "checks_world")
    return os.path.abspath(d)


def checks_world(c, directory: str = ""):
    """Turns a run config into the checkable-item world (METHOD 13), in place, and returns it:
    `verifier.kind = "checks"` (the checkers' exact 0/1 verdicts, strict; no verifier model
    is loaded), data from `checks_dir(directory)` (train.jsonl prompts with meta.checks,
    anchors.jsonl lists ranked by the gold score; `data.checks_dir` records the directory:
    changing that field later does not move the paths, pass `checks_dir=DIR` or set
    data.prompt_paths / data.anchor_paths), hard verdicts (exact already), and a generator
    sized for up to 5 checks: about 40 tokens a JSON item (256 new tokens), and its prompt's
    template with the list of checks is ~1,400 SmolLM2 tokens (input budget 1,792)."""
    d = checks_dir(directory)
    c.data.name = "custom"
    c.data.checks_dir = d
    c.data.prompt_paths = (os.path.join(d, CHECKS_FILES["prompts"]),)
    c.data.anchor_paths = (os.path.join(d, CHECKS_FILES["anchors"]),)
    c.verifier.kind = "checks"
    c.verifier.verdict = "hard"
    c.verifier.calibration = "none"
    c.generator.max_items = 5
    c.generator.max_item_chars = 200  # longest free string argument (the prompt to repeat)
    c.generator.max_new_tokens = 256
    c.generator.input_budget = max(c.generator.input_budget, 1792)
    return c


def get_config(arg: str = ""):
    opts = parse_switches(arg, {"data", "variant", "tiny", "world", "checks_dir"})
    c = base_config()
    c.data.name = opts.get("data", "demo")
    # Host memory (peak RSS <= 6 GB on CPU; README "Memory"). One generator row per
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
        c.generator.input_budget = 1024
        c.verifier.max_prefix_tokens = 512
        c.verifier.max_suffix_tokens = 32
        c.generator.train.micro_batch_size = c.policy.train.micro_batch_size = 0
        c.export = False
    world = opts.get("world", "llm")
    if world not in WORLDS:
        raise ValueError(f"world={world!r} not in {WORLDS}")
    if world == "checks":
        checks_world(c, opts.get("checks_dir", ""))
        if opts.get("tiny"):
            c.generator.max_items, c.generator.max_new_tokens = 3, 128
    return c


def get_sweep(hyper=None):
    """The paper's generator ablation as override dicts (METHOD section 6); run them with
    `python -m experiments.sweep --config=configs/smollm2_cpu.py --workdir=runs/ablation`
    (4 default runs of ~15 min each; add `:tiny` for a smoke sweep)."""
    del hyper
    return [{"config.variant": v} for v in ("full", "disc_only", "anchor_only", "static")]
