"""Training prompts of the checks world (METHOD 13): base prompts with 1-3 checkable
constraints appended in the checkers' own words, the true checks in each row's meta.

    python -m experiments.make_checks_data --out=../checks_world --seed=0 \\
        --train=256 --heldout=64

World v1 (the default --version=1) writes OUT/train.jsonl and OUT/heldout.jsonl (shared data
schema, prompt-only rows; world v2's five split files: below) and
OUT/manifest.json (the arguments and counts), once: an existing file is an error unless
--force. Base prompts come from the shared prompt-only sets (--sources, under
../shared/data; never IFEval's own prompts: a source under ifeval/ is refused and a base
prompt equal to an IFEval prompt is skipped). Base prompts longer than --max_base_chars, or
repeating an earlier one, are skipped. The kept ones are shuffled by --seed; the first
--train are the training rows, the next --heldout the held-out rows (disjoint by base
prompt). Row j of the shuffled order draws its constraints from
`numpy.random.default_rng([seed, j])` (`checks.world.draw_constraints`), so the same seed
gives byte-identical files. A row:

    {"id": "checks_world/<split>/<base id>", "source": "checks_world:<split>",
     "prompt": base + "\\n\\n" + the rendered sentences joined by "\\n",
     "meta": {"checks": [{"check": id, "args": {...}}, ...], "base_id", "base_source",
              "base_prompt", "seed"}}

(world v2 adds "world_version": 2 and "split" to the meta.)

World v2 (`--version=2`, issues 40 and 53): constraints come only from the calibrated
pool (`--pool`, the table `experiments.calibrate_checks` writes; `checks.pool.load_pool`),
1 per prompt by default (`--checks=1-3` for 1..3), and a row is kept only if no role would
cut a constraint from its input (`checks.fit`: the policy's chat prompt within 128 tokens,
the generator's input keeps the prompt whole next to K = 8 responses of 64 tokens within
1,536 tokens, its list of checks naming only the pool); skipped rows are counted in the
manifest. The last --calibration base prompts of the shuffled order are the calibration
prompts (`calibration_bases`): never in a split. The rest are cut, in the order heldout,
dev, policy, gen_rl, gen_sft, into five disjoint splits (`drubric_jax.data.splits`), one
file each, every row tagged `meta["split"]` (its id `checks_world/<split>/<base id>`):

    gen_sft.jsonl   --gen_sft (192)  the generator's supervised stage G_sft
    gen_rl.jsonl    --gen_rl (64)    the generator's RL (Q2, Q3)
    policy.jsonl    --policy (128)   the policy's RL
    dev.jsonl       --dev (64)       development: settings are chosen here
    heldout.jsonl   --heldout (256)  the reported held-out split

Each base prompt is used once, so no two splits share a prompt or a base prompt (checked,
`splits.check_disjoint`); manifest.json lists each split's file, rows, seed, positions in
the shuffled order and sha256. Then the anchor lists, one file per split that needs them
(docs/CHECKS_WORLD.md; `configs.checks_world.build_commands` prints every command):

    python -m experiments.make_checks_data --version=2 --out=../checks_world_v2_splits
    python -m experiments.make_checks_anchors --split=gen_sft \
        --prompts=../checks_world_v2_splits/gen_sft.jsonl \
        --out=../checks_world_v2_splits/gen_sft_anchors.jsonl --k=8 --temperature=1.0 \
        --max_new_tokens=64
    (the same for gen_rl; dev and heldout with --limit=64)

The checks are IFEval's (Zhou et al. 2023, arXiv:2311.07911) from if-verifiable.
"""

from __future__ import annotations

import json

from absl import app, flags
from experiments import cli  # noqa: E402

from drubric_jax.checks.world_data import (DEFAULT_MAX_BASE_CHARS, DEFAULT_SOURCES,
                                           V2_CALIBRATION, V2_MAX_BASE_CHARS,
                                           V2_SPLIT_SIZES, make)

V1_TRAIN, V1_HELDOUT = 256, 64


def _default_tokenizer():
    """SmolLM2's tokenizer (the default policy's): world v2's rows are measured with it."""
    from drubric_jax.models.default import default_gguf_path
    from drubric_jax.text.tokenizer import tokenizer_from_gguf

    return tokenizer_from_gguf(default_gguf_path())


def define_flags():
    """The command's flags (defined only when run as a command, so tests can import
    several experiment modules whose flag names overlap)."""
    flags.DEFINE_string("out", None, "output directory", required=True)
    flags.DEFINE_integer("seed", 0, "seed of the split and of every constraint draw")
    flags.DEFINE_integer("train", None, f"version 1: training prompts (default {V1_TRAIN})")
    flags.DEFINE_integer("heldout", None, "held-out prompts (other base prompts; default "
                         f"{V1_HELDOUT} for --version=1, {V2_SPLIT_SIZES['heldout']} for "
                         "--version=2)")
    # Literal names: tests/test_docs_commands.py reads the flags from the source.
    flags.DEFINE_integer("gen_sft", V2_SPLIT_SIZES["gen_sft"],
                         "version 2: prompts of the gen_sft split (the generator's SFT)")
    flags.DEFINE_integer("gen_rl", V2_SPLIT_SIZES["gen_rl"],
                         "version 2: prompts of the gen_rl split (the generator's RL)")
    flags.DEFINE_integer("policy", V2_SPLIT_SIZES["policy"],
                         "version 2: prompts of the policy split (the policy's RL)")
    flags.DEFINE_integer("dev", V2_SPLIT_SIZES["dev"],
                         "version 2: prompts of the dev split (settings are chosen here)")
    flags.DEFINE_list("sources", list(DEFAULT_SOURCES),
                      "prompt files, relative to SHARED/data or absolute")
    flags.DEFINE_string("shared_dir", "", "the shared folder (default ../shared)")
    flags.DEFINE_integer("max_base_chars", DEFAULT_MAX_BASE_CHARS,
                         "longer base prompts are skipped (not given: "
                         f"{DEFAULT_MAX_BASE_CHARS} for --version=1, {V2_MAX_BASE_CHARS} "
                         "for --version=2)")
    flags.DEFINE_integer("max_checks", 3, "constraints per prompt: 1..this")
    flags.DEFINE_bool("force", False, "overwrite existing files")
    flags.DEFINE_integer("version", 1, "1: IFEval's ranges; 2: the calibrated pool (--pool)")
    flags.DEFINE_string("pool", "results/checks_world_v2/calibration.json",
                        "version 2: the calibration table (experiments.calibrate_checks)")
    flags.DEFINE_string("checks", "1", "version 2: constraints per prompt, N or N-M")
    flags.DEFINE_integer("calibration", V2_CALIBRATION,
                         "version 2: base prompts kept apart for the calibration")


def main(argv):
    del argv
    f = flags.FLAGS
    v2 = f.version == 2
    if v2 and f.train is not None:
        raise app.UsageError("--train is world v1's; world v2's splits are --gen_sft, "
                             "--gen_rl, --policy, --dev and --heldout")
    if not v2 and any(f[s].present for s in ("gen_sft", "gen_rl", "policy", "dev")):
        raise app.UsageError("--gen_sft/--gen_rl/--policy/--dev are world v2's splits "
                             "(--version=2)")
    heldout = f.heldout if f.heldout is not None else (
        V2_SPLIT_SIZES["heldout"] if v2 else V1_HELDOUT)
    sizes = dict({s: f[s].value for s in ("gen_sft", "gen_rl", "policy", "dev")},
                 heldout=heldout) if v2 else None
    try:
        m = make(f.out, seed=f.seed, n_train=V1_TRAIN if f.train is None else f.train,
                 n_heldout=heldout, sizes=sizes, sources=f.sources,
                 shared_dir=f.shared_dir,
                 max_checks=f.max_checks, force=f.force, version=f.version, pool=f.pool,
                 checks=f.checks, n_calibration=f.calibration,
                 # Version 2's shorter default base prompts, unless the flag is given.
                 max_base_chars=(V2_MAX_BASE_CHARS if f.version == 2
                                 and not f["max_base_chars"].present else f.max_base_chars),
                 tokenizer=_default_tokenizer() if v2 else None)
    except FileExistsError as e:  # the files are written once: a message, not a traceback
        raise app.UsageError(str(e)) from None
    print(json.dumps(m), flush=True)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
