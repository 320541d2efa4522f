"""The checkable-item world (METHOD 13) as a config transform, one module for every scale
and route: `checks_world(c, directory, version)` turns any run config (configs/
smollm2_cpu.py, qwen3_8b.py, or an experiment's through `configs.base.experiment_base`)
into the checks world, in place. It imports no other config module.

    world=checks                 the switch that calls it (smollm2_cpu.py, base.py)
    world_version=2|1            2 (default): the calibrated pool, budgets that cut no
                                 constraint, LoRA trainees; 1: the world of results/checks_world
    checks_dir=DIR               its files (default $DRUBRIC_CHECKS_DIR, else
                                 ../checks_world_v2_splits or ../checks_world next to
                                 the repo)

World v2's directory holds five disjoint prompt splits and the anchor lists of four of
them (`drubric_jax.data.splits`; issue 53); every stage reads its own split and stops on
another's (`data.require_splits`). `world_files` names each file of a version.
"""
import os

from drubric_jax.data import splits as _splits

# World v1's files in its directory (experiments/make_checks_data.py and
# make_checks_anchors.py write them): policy prompts, held-out prompts, anchor lists.
CHECKS_FILES = {"prompts": "train.jsonl", "heldout": "heldout.jsonl", "anchors": "anchors.jsonl"}
# World v2's: the prompts of each split (`<split>.jsonl`) and the anchor lists of the
# splits that have them (`<split>_anchors.jsonl`), keyed by role:
V2_FILES = {
    "prompts": _splits.prompt_file("policy"),            # the policy's RL
    "heldout": _splits.prompt_file("heldout"),           # the reported held-out prompts
    "dev": _splits.prompt_file("dev"),                   # development prompts (gold curve)
    "anchors": _splits.anchor_file("gen_rl"),            # the generator's RL
    "sft_anchors": _splits.anchor_file("gen_sft"),       # G_sft's pairs
    "dev_anchors": _splits.anchor_file("dev"),           # G_sft's per-epoch F1
    "heldout_anchors": _splits.anchor_file("heldout"),   # Q2's held-out lists
}
WORLDS = ("llm", "checks")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# World v2's calibrated pool (experiments/calibrate_checks.py; issue 40), in the repository.
V2_POOL = os.path.join(REPO, "results", "checks_world_v2", "calibration.json")
WORLD_VERSIONS = (1, 2)
DEFAULT_WORLD_VERSION = 2


# The default directory of each version, next to the repository. World v2's splits are a
# new directory: ../checks_world_v2 (one train.jsonl the policy and G_sft shared; the runs of
# results/checks_world_v2 and _v3 read it) stays as it was.
DEFAULT_DIRS = {1: "checks_world", 2: "checks_world_v2_splits"}


def checks_dir(given: str = "", version: int = DEFAULT_WORLD_VERSION) -> str:
    """The checks world's directory: `given`, else $DRUBRIC_CHECKS_DIR, else
    ../checks_world (version 1) or ../checks_world_v2_splits (version 2) next to the
    repository (absolute)."""
    default = DEFAULT_DIRS[1 if int(version) == 1 else 2]
    d = given or os.environ.get("DRUBRIC_CHECKS_DIR") or os.path.join(REPO, "..", default)
    return os.path.abspath(d)


def world_files(version: int, directory: str) -> dict:
    """{role: absolute path} of a checks world's files (`CHECKS_FILES` for version 1,
    `V2_FILES` for version 2) in `directory`."""
    files = CHECKS_FILES if int(version) == 1 else V2_FILES
    return {k: os.path.join(directory, v) for k, v in files.items()}


# World v2's anchor lists (issue 53): K = 8 samples of P_0 at temperature 1, <= 64 tokens
# (the policy's training settings), per split: every gen_sft and gen_rl prompt, the first
# 64 of dev and of heldout (0 = all).
V2_ANCHOR_LIMITS = {"gen_sft": 0, "gen_rl": 0, "dev": 64, "heldout": 64}
V2_ANCHOR_SAMPLING = "--k=8 --temperature=1.0 --max_new_tokens=64"


def anchors_command(directory: str, split: str, limit: int | None = None) -> str:
    """The command that writes (or extends: it resumes) world v2's anchor lists of `split`
    in `directory`, run from the repository root; `limit` None: `V2_ANCHOR_LIMITS`'s."""
    limit = V2_ANCHOR_LIMITS[split] if limit is None else int(limit)
    return (f".venv/bin/python -m experiments.make_checks_anchors --split={split} "
            f"--prompts={directory}/{_splits.prompt_file(split)} "
            f"--out={directory}/{_splits.anchor_file(split)} {V2_ANCHOR_SAMPLING}"
            + (f" --limit={limit}" if limit else ""))


def build_commands(version: int, directory: str) -> str:
    """The commands that write a checks world's files into `directory`, one a line, run
    from the repository root (printed when a run starts before they exist): the prompts,
    then (world v2) the anchor lists of each split that has them."""
    py = ".venv/bin/python -m"
    if int(version) == 1:
        return (f"{py} experiments.make_checks_data --out={directory} --seed=0 --train=256 "
                f"--heldout=64\n{py} experiments.make_checks_anchors "
                f"--prompts={directory}/train.jsonl --out={directory}/anchors.jsonl --k=4 "
                "--temperature=0.7 --max_new_tokens=256 --limit=64")
    return "\n".join([f"{py} experiments.make_checks_data --version=2 --out={directory}"]
                     + [anchors_command(directory, s) for s in _splits.ANCHORED])


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
    is loaded), data from `checks_dir(directory)` (v1: train.jsonl prompts with meta.checks,
    anchors.jsonl lists ranked by the gold score; v2: `V2_FILES`; `data.checks_dir`
    records the directory:
    changing that field later does not move the paths, pass `checks_dir=DIR` or set
    data.prompt_paths / data.anchor_paths), hard verdicts (exact already), and a generator
    sized for up to 5 checks: about 40 tokens a JSON item (256 new tokens), and its prompt's
    template with the list of checks is ~1,400 SmolLM2 tokens (input budget 1,792).

    Version 2 (the default; issues 40 and 53) instead: data from ../checks_world_v2_splits,
    five disjoint splits whose constraints come from the calibrated pool (`V2_POOL`): the
    policy's prompts from policy.jsonl, the generator's anchor lists from
    gen_rl_anchors.jsonl, held-out lists from heldout_anchors.jsonl, the held-out gold curve
    (when on) on dev.jsonl, and every stage refuses a row of another split
    (`data.require_splits`, `data.splits.require_split`); no row may have a constraint cut
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
    files = world_files(version, d)
    c.data.name = "custom"
    c.data.checks_dir = d
    c.data.prompt_paths = (files["prompts"],)
    c.data.anchor_paths = (files["anchors"],)
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
        # Every stage reads its own split (issue 53): the held-out lists are the heldout
        # split's, the gold curve (when a config turns it on) reads the dev split.
        c.data.require_splits = True
        c.data.heldout_anchor_paths = (files["heldout_anchors"],)
        c.rounds.heldout_gold_path = files["dev"]
        c.rounds.heldout_gold_split = "dev"
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
