"""The checkable-item world (METHOD 13) as a config transform, one module for every scale
and route: `checks_world(c, directory, version)` turns any run config (configs/
smollm2_cpu.py, qwen3_8b.py, or an experiment's through `configs.base.experiment_base`)
into the checks world, in place. It imports no other config module.

    world=checks                 the switch that calls it (smollm2_cpu.py, base.py)
    world_version=2|1            2 (default): the calibrated pool, budgets that cut no
                                 constraint, LoRA trainees; 1: the world of results/checks_world
    checks_dir=DIR               its files (default $DRUBRIC_CHECKS_DIR, else
                                 ../checks_world_v2 or ../checks_world next to the repo)
"""
import os

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

    A tiny-model config (`model.generator == "tiny"`, the `tiny` / `local` switches) gets
    lists of 3 items and 128 new tokens at either version, whichever route built it.

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
    if c.model.generator == "tiny":  # random weights: shorter lists, the same at every route
        c.generator.max_items, c.generator.max_new_tokens = 3, 128
    return c


# World v2's trainees (results/checks_world_v2/sweep.md chose them; issue 40).
V2_LORA = {"rank": 16, "alpha": 32.0, "policy_lr": 3e-4, "generator_lr": 1e-4}
