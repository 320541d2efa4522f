r"""Policy evaluation (METHOD 7; issue 13): win rate against reference answers with a local
pairwise judge (both presentation orders, ties, length-controlled), and HumanEval pass@1
(answers executed in a sandbox: drubric_jax/evaluation/code_exec.py).

    python -m experiments.eval_policy --config=configs/eval_policy.py --workdir=runs/evalp_p0
    python -m experiments.eval_policy --config=configs/eval_policy.py \
        --config.policy_model=runs/default/export/policy --workdir=runs/evalp_p1

Fields and the CPU-size defaults: configs/eval_policy.py. Statistics:
drubric_jax/evaluation/policy_eval.py. Writes to the workdir: answers.jsonl (every prompt
and problem: the answer, the judge's probabilities or the test result), report.json
(command, config, per file and overall statistics with bootstrap 95% CIs, wall times)
and results.md, and prints the table.
"""
import json
import os
import shlex
import sys
import time

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from absl import flags, logging  # noqa: E402
from experiments import cli  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/eval_policy.py[:tiny]",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    import jax
    import numpy as np

    from configs import eval_policy as cfg_lib
    from drubric_jax import models, parallel
    from drubric_jax.evaluation import code_exec, policy_eval
    from drubric_jax.evaluator.verifier import Verifier
    from drubric_jax.rounds import compilation

    c, workdir = _CONFIG.value, _WORKDIR.value
    cfg_lib.validate(c)
    tasks = [t.strip() for t in c.tasks.split(",") if t.strip()]
    compilation.enable_persistent_cache(c.jax_cache_dir, min_compile_seconds=1.0)
    # Every data row is read (and has a reference) before any model loads.
    files = {}
    if "winrate" in tasks:
        for p in [p.strip() for p in c.winrate_data.split(",") if p.strip()]:
            files[p] = policy_eval.load_prompt_rows(p, c.winrate_rows, c.seed)
    problems = code_exec.read_problems() if "humaneval" in tasks else []
    problems = problems[:c.humaneval_problems or None]
    os.makedirs(workdir, exist_ok=True)
    t_start = time.time()
    mesh = parallel.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
    # Each tensor goes straight to its shards on the mesh (no full copy on device 0).
    pcfg, pparams, ptok = models.load_model(c.policy_model, c.dtype,
                                            shardings=models.leaf_sharder(mesh))
    report = {"command": shlex.join(["python", "-m", "experiments.eval_policy"] + sys.argv[1:]),
              "config": c.to_dict(), "seconds": {}}
    key = policy_eval.eval_key(c.seed)
    log = open(os.path.join(workdir, "answers.jsonl"), "w", encoding="utf-8")
    if files:
        t0 = time.time()
        rows = [r for rs in files.values() for r in rs]
        texts, cut = policy_eval.answers(
            pcfg, pparams, ptok, [r.prompt for r in rows], key=key,
            max_prompt_tokens=c.max_prompt_tokens, max_new_tokens=c.max_new_tokens,
            temperature=c.temperature, rows_per_call=c.rows_per_call,
            histories=[r.history for r in rows], mesh=mesh)
        report["seconds"]["winrate_answers"] = time.time() - t0
        t0 = time.time()
        if c.judge_model == c.policy_model:
            jcfg, jparams, jtok = pcfg, pparams, ptok  # one set of weights for both
        else:
            jcfg, jparams, jtok = models.load_model(c.judge_model, c.dtype,
                                                    shardings=models.leaf_sharder(mesh))
        judge = Verifier(jcfg, jtok, mesh=mesh)
        refs = [policy_eval.reference_of(r) for r in rows]
        p1, p2 = policy_eval.judge_pairs(judge, jparams, [r.prompt for r in rows], texts,
                                         refs, c.judge_max_tokens,
                                         [r.history for r in rows])
        report["seconds"]["winrate_judge"] = time.time() - t0
        report["winrate"], start = {}, 0
        for path, rs in list(files.items()) + [("all", rows)]:
            sl = slice(0, len(rows)) if path == "all" else slice(start, start + len(rs))
            if path != "all":
                start += len(rs)
            ya, yr = [len(t) for t in texts[sl]], [len(t) for t in refs[sl]]
            name = path if path == "all" else "/".join(path.split(os.sep)[-2:])
            report["winrate"][name] = {
                **policy_eval.win_rate_summary(p1[sl], p2[sl], ya, yr, c.n_bootstrap, c.seed),
                "mean_answer_chars": float(np.mean(ya)),
                "mean_reference_chars": float(np.mean(yr)),
                "truncated_fraction": float(np.mean(cut[sl]))}
        for r, y, a, b, t in zip(rows, texts, p1, p2, cut):
            log.write(json.dumps({"task": "winrate", "id": r.id, "prompt": r.prompt,
                                  "answer": y, "truncated": bool(t), "p_policy_first": float(a),
                                  "p_policy_second": float(b)}) + "\n")
    if problems:
        t0 = time.time()
        texts, cut = policy_eval.answers(
            pcfg, pparams, ptok, [code_exec.humaneval_request(p) for p in problems],
            key=jax.random.fold_in(key, 1), max_prompt_tokens=c.max_prompt_tokens,
            max_new_tokens=c.humaneval_max_new_tokens, temperature=c.temperature,
            rows_per_call=c.rows_per_call, mesh=mesh)
        report["seconds"]["humaneval_answers"] = time.time() - t0
        t0 = time.time()
        results = [code_exec.check(p, code_exec.completion_from_answer(y, p), c.timeout_s)
                   for p, y in zip(problems, texts)]
        report["seconds"]["humaneval_tests"] = time.time() - t0
        report["humaneval"] = {
            **policy_eval.pass_at_1_summary([r["passed"] for r in results], c.n_bootstrap,
                                            c.seed),
            "isolation": results[0]["isolation"], "truncated_fraction": float(np.mean(cut))}
        for p, y, r in zip(problems, texts, results):
            log.write(json.dumps({"task": "humaneval", "id": p["task_id"], "answer": y,
                                  "result": r["result"], "passed": r["passed"]}) + "\n")
    log.close()
    report["wall_s"] = time.time() - t_start
    report["kind"] = "eval_policy"  # what experiments.report renders it as
    from drubric_jax.data import write_json

    write_json(os.path.join(workdir, "report.json"), report, indent=2)
    table = policy_eval.results_markdown(report)
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(table)
    logging.info("wrote %s", os.path.join(workdir, "report.json"))
    print(table, flush=True)


if __name__ == "__main__":
    cli.run(main)
