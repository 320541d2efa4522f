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
                       ../checks_world_v2 next to the repo)
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
group flat), against 0 of 6 sampled at temperature 1.
"""
import os

from configs.base import base_config, parse_switches

# The files of the checks world in its directory (experiments/make_checks_data.py and
# make_checks_anchors.py write them): policy prompts, held-out prompts, anchor lists.
CHECKS_FILES = {"prompts": "train.jsonl", "heldout": "heldout.jsonl", "anchors": "anchors.jsonl"}
WORLDS = ("llm", "checks")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# World v2's calibrated pool (experiments/calibrate_checks.py; issue 40), in the repository.
V2_POOL = os.path.join(REPO, "results", "checks_world_v2", "calibration.json")
WORLD_VERSIONS = (1, 2)
DEFAULT_WORLD_VERSION = 2


def checks_dir(given: str = "", version: int = DEFAULT_WORLD_VERSION) -> str:
    """The checks world's directory: `given`, else $DRUBRIC_CHECKS_DIR, else ../checks_world
    (version 1) or ../checks_world_v2 (version 2) next to the repository (absolute)."""
    default = "checks_world" if int(version) == 1 else "checks_world_v2"
    d = given or os.environ.get("DRUBRIC_CHECKS_DIR") or os.path.join(REPO, "..", default)
    return os.path.abspath(d)


def build_commands(version: int, directory: str) -> str:
    """The commands that write a checks world's files into `directory`, one a line, run
    from the repository root (printed when a run starts before they exist)."""
    py = ".venv/bin/python -m"
    if int(version) == 1:
        return (f"{py} experiments.make_checks_data --out={directory} --seed=0 --train=256 "
                f"--heldout=64\n{py} experiments.make_checks_anchors "
                f"--prompts={directory}/train.jsonl --out={directory}/anchors.jsonl --k=4 "
                "--temperature=0.7 --max_new_tokens=256 --limit=64")
    return (f"{py} experiments.make_checks_data --version=2 --out={directory} --train=512 "
            f"--heldout=256\n{py} experiments.make_checks_anchors "
            f"--prompts={directory}/train.jsonl --out={directory}/anchors.jsonl --k=8 "
            "--temperature=1.0 --max_new_tokens=64 --limit=64")


def pool_ids(path: str = V2_POOL) -> tuple:
    """The check ids of world v2's calibrated pool (`checks.pool.load_pool`), in order;
    () when the table is absent (the run's data check then names the command)."""
    if not os.path.exists(path):
        return ()
    from drubric_jax.checks.pool import load_pool

    return tuple(dict.fromkeys(v.check for v in load_pool(path)))


def checks_world(c, directory: str = "", version: int = DEFAULT_WORLD_VERSION):
    """Turns a run config into the checkable-item world (METHOD 13), in place, and returns it:
    `verifier.kind = "checks"` (the checkers' exact 0/1 verdicts, strict; no verifier model
    is loaded), data from `checks_dir(directory)` (train.jsonl prompts with meta.checks,
    anchors.jsonl lists ranked by the gold score; `data.checks_dir` records the directory:
    changing that field later does not move the paths, pass `checks_dir=DIR` or set
    data.prompt_paths / data.anchor_paths), hard verdicts (exact already), and a generator
    sized for up to 5 checks: about 40 tokens a JSON item (256 new tokens), and its prompt's
    template with the list of checks is ~1,400 SmolLM2 tokens (input budget 1,792).

    Version 2 (the default; issue 40) instead: data from ../checks_world_v2, whose
    constraints come from the calibrated pool (`V2_POOL`); no row may have a constraint cut
    from a role's input (`data.refuse_cut_constraints`, `checks.fit`); prompts of <= 128
    tokens, answers of <= 64 tokens, K = 8; the generator lists and may emit only the pool's
    checks (`generator.check_pool`), with an input of <= 1,536 tokens (its template and the
    pool's 14 checks take 995 tokens at K = 8 before any text) and 3 items of <= 96
    tokens; both trainees are rank-16 LoRA adapters (the rank and learning rate of the
    sweep in results/checks_world_v2/sweep.md) with beta = 0 (no reference forward).

    Raises:
        ValueError: a version not in WORLD_VERSIONS."""
    if int(version) not in WORLD_VERSIONS:
        raise ValueError(f"world_version={version!r} not in {WORLD_VERSIONS}")
    d = checks_dir(directory, version)
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
    c.data.checks_world_version = int(version)
    c.data.checks_build = build_commands(version, d)
    if int(version) == 2:
        c.data.refuse_cut_constraints = True
        c.policy.max_prompt_tokens, c.policy.max_new_tokens = 128, 64
        c.policy.num_responses = 8
        c.generator.check_pool = pool_ids()
        c.generator.input_budget, c.generator.keep_prompt = 1536, True
        c.generator.max_items, c.generator.max_new_tokens = 3, 96
        c.generator.max_item_chars = 100
        c.lora.rank, c.lora.alpha = V2_LORA["rank"], V2_LORA["alpha"]
        c.policy.train.learning_rate = V2_LORA["policy_lr"]
        c.generator.train.learning_rate = V2_LORA["generator_lr"]
        c.policy.train.beta = c.generator.train.beta = 0.0
    return c


# World v2's trainees (results/checks_world_v2/sweep.md chose them; issue 40).
V2_LORA = {"rank": 16, "alpha": 32.0, "policy_lr": 3e-4, "generator_lr": 1e-4}


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
        if opts.get("tiny"):
            c.generator.max_items, c.generator.max_new_tokens = 3, 128
    return c


def get_sweep(hyper=None):
    """The paper's generator ablation as override dicts (METHOD section 6); run them with
    `python -m experiments.sweep --config=configs/smollm2_cpu.py --workdir=runs/ablation`
    (4 default runs of ~15 min each; add `:tiny` for a smoke sweep)."""
    del hyper
    return [{"config.variant": v} for v in ("full", "disc_only", "anchor_only", "static")]
