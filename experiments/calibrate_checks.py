r"""Which checks can the policy learn? Pass rates of P_0 per check variant (world v2 of
METHOD 13; issue 40).

    python -m experiments.calibrate_checks --out=results/checks_world_v2

For every candidate variant (`checks.pool.CANDIDATES`: a check id with its argument range)
it builds --prompts calibration prompts (base prompts from `checks.world_data
.calibration_bases`, never train or held-out rows; one constraint each, drawn from
`numpy.random.default_rng([seed, 7919, variant index, j])`), samples --samples answers per
prompt from P_0 at --temperature within the world's budgets (--max_prompt_tokens,
--max_new_tokens) and scores each with the variant's checker (strict). The pass rate of a
variant is the mean over its prompts' samples, with a percentile-bootstrap 95% CI over
prompts (the samples of one prompt are not independent). Variants whose rate lies in
--band are kept: the pool of world v2 (`checks.pool.load_pool` reads it).

Writes OUT/calibration.json (the table, the kept labels, the command, wall seconds) and
OUT/calibration.md. The answers go to OUT/calibration_samples.jsonl as each variant
finishes; a rerun reads them back and samples only the variants still missing.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from absl import flags
from experiments import cli  # noqa: E402

from drubric_jax.checks import pool as pool_lib
from drubric_jax.evaluation.checks_calibration import (SAMPLES_FILE, TABLE_JSON, TABLE_MD,
                                                       calibration_prompts, markdown,
                                                       summarize)


def define_flags():
    flags.DEFINE_string("out", None, "output directory", required=True)
    flags.DEFINE_integer("seed", 0, "seed of the base prompt order, the arguments, sampling")
    flags.DEFINE_integer("prompts", 8, "calibration prompts per variant")
    flags.DEFINE_integer("samples", 8, "answers per prompt (K)")
    flags.DEFINE_float("temperature", 1.0, "sampling temperature (the policy's training one)")
    flags.DEFINE_integer("max_prompt_tokens", 128, "policy prompt budget, tokens")
    flags.DEFINE_integer("max_new_tokens", 64, "answer budget, tokens")
    flags.DEFINE_list("band", ["0.05", "0.70"], "kept pass-rate band lo,hi")
    flags.DEFINE_integer("calibration", 240, "calibration base prompts (as make_checks_data)")
    flags.DEFINE_string("shared_dir", "", "the shared folder (default ../shared)")
    flags.DEFINE_string("model", "smollm2-135m-instruct", "P_0 (a models.load_model source)")
    flags.DEFINE_integer("batch", 64, "rows per sampler call")
    flags.DEFINE_integer("n_bootstrap", 1000, "bootstrap replicates of each CI")


def main(argv):
    del argv
    import jax

    from drubric_jax import models
    from drubric_jax.checks import gold_score
    from drubric_jax.evaluation import policy_eval
    from drubric_jax.checks import world_data as mcd

    f = flags.FLAGS
    t0 = time.time()
    os.makedirs(f.out, exist_ok=True)
    band = [float(x) for x in f.band]
    shared = f.shared_dir or os.path.join(mcd.REPO, "..", "shared")
    paths = [os.path.join(shared, "data", p) for p in mcd.DEFAULT_SOURCES]
    bases = mcd.base_prompts(paths, mcd.V2_MAX_BASE_CHARS, mcd.ifeval_prompts(shared))
    cal = mcd.calibration_bases(bases, f.seed, f.calibration)
    samples_path = os.path.join(f.out, SAMPLES_FILE)
    done = {}
    if os.path.exists(samples_path):  # a rerun samples only what is missing
        with open(samples_path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    d = json.loads(line)
                    done[d["label"]] = d
    cfg, params, tok = models.load_model(f.model, "float32")
    key = jax.random.PRNGKey(f.seed)
    for i, v in enumerate(pool_lib.CANDIDATES):
        if v.label in done:
            continue
        ps = calibration_prompts(cal, i, v, f.prompts, f.seed)
        reqs = [p for p, _ in ps for _ in range(f.samples)]
        answers, cut = policy_eval.answers(
            cfg, params, tok, reqs, key=jax.random.fold_in(key, i),
            max_prompt_tokens=f.max_prompt_tokens, max_new_tokens=f.max_new_tokens,
            temperature=f.temperature, rows_per_call=f.batch)
        passed = [[gold_score(t, answers[j * f.samples + s]) for s in range(f.samples)]
                  for j, (_, t) in enumerate(ps)]
        d = {"label": v.label, "passed": passed, "truncated": [bool(x) for x in cut],
             "prompts": [p for p, _ in ps], "answers": answers}
        with open(samples_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(d) + "\n")
        done[v.label] = d
        print(f"{i + 1}/{len(pool_lib.CANDIDATES)} {v.label}: pass "
              f"{np.mean(passed):.3f}, cut {np.mean(cut):.2f}", flush=True)
    table = summarize(done, band, f.n_bootstrap, f.seed)
    table.update(command="python -m experiments.calibrate_checks " + " ".join(sys.argv[1:]),
                 seconds=time.time() - t0, device=f"{jax.devices()[0].platform} "
                 f"({os.cpu_count()} cores)",
                 settings=(f"P_0 = {f.model}, {f.prompts} prompts x {f.samples} samples per "
                           f"variant at temperature {f.temperature}, answers <= "
                           f"{f.max_new_tokens} tokens, prompts <= {f.max_prompt_tokens} "
                           "tokens; seconds count this invocation only (a resumed run "
                           "re-samples nothing it has)"))
    from drubric_jax.data import write_json

    write_json(os.path.join(f.out, TABLE_JSON), table)
    with open(os.path.join(f.out, TABLE_MD), "w", encoding="utf-8") as fh:
        fh.write(markdown(table))
    print(f"kept {len(table['kept'])} of {len(table['rows'])}: {table['kept']}", flush=True)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
