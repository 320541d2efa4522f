r"""Verifier check: does the verifier's P(yes) follow criteria whose truth is known?

    python -m experiments.check_verifier                       # packaged SmolLM2-135M
    python -m experiments.check_verifier --model=tiny --responses=4   # smoke run
    python -m experiments.check_verifier --model=Qwen/Qwen3-0.6B --json_out=/tmp/check.json

Items (language, word presence, length bound, list format, and their negations; see
drubric_jax/evaluation/verifier_check.py) are asked on real responses: the AlpacaEval
reference answers in ../shared/data/alpaca_eval/eval.jsonl, or, when ../shared is absent,
the packaged DEMO responses (hand-written, said so in the output). Prints a table per item
family and polarity, then one line: the overall AUC with its 95% bootstrap CI.
"""
import os
import time

# transformers prints a "PyTorch was not found" notice at import; tokenizers are all we use.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from absl import flags  # noqa: E402
from experiments import cli  # noqa: E402

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "verifier model source")
_DATA = flags.DEFINE_string("data", "", "shared-schema JSONL whose references / responses are "
                            "checked (default: ../shared/data/alpaca_eval/eval.jsonl)")
_RESPONSES = flags.DEFINE_integer("responses", 24, "responses checked (14 items each); 24 "
                                  "keep the default model under 3 minutes on 2 CPU cores")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the response and item draws and bootstrap")
_PREFIX = flags.DEFINE_integer("max_prefix_tokens", 448, "verifier prefix budget; responses "
                               "whose prompt + response does not fit it are skipped")
_JSON = flags.DEFINE_string("json_out", "", "also write the summary here")


def _data_path() -> tuple:
    """(path, note): the requested file, else the shared AlpacaEval file, else the demo."""
    from drubric_jax.data import sources

    if _DATA.value:
        return _DATA.value, ""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shared = os.path.join(repo, "..", "shared", "data", "alpaca_eval", "eval.jsonl")
    if os.path.isfile(shared):
        return os.path.normpath(shared), ""
    return str(sources.demo_anchor_path()), (
        "NOTE: ../shared not found; using the packaged DEMO responses (hand-written, "
        "not real data)")


def main(argv):
    del argv
    from drubric_jax import data, models
    from drubric_jax.evaluation import verifier_check as vc
    from drubric_jax.evaluator.verifier import Verifier

    t0 = time.time()
    path, note = _data_path()
    cfg, params, tok = models.load_model(_MODEL.value)
    verifier = Verifier(cfg, tok, _PREFIX.value, 64)
    pairs = vc.fitting(verifier, vc.select_responses(data.load_jsonl(path), 0, _SEED.value),
                       _RESPONSES.value)
    items = vc.build_items([y for _, y in pairs], _SEED.value)
    p, p_cal = vc.ask(verifier, params, pairs, items)
    summary = vc.summarise(items, p, p_cal, seed=_SEED.value)
    if note:
        print(note)
    print(f"verifier {_MODEL.value}; {len(pairs)} responses from {path}; "
          f"{time.time() - t0:.0f} s")
    print(vc.format_table(summary))
    line = vc.verdict_line(summary)
    print(line)
    if _JSON.value:
        from drubric_jax.data import write_json

        write_json(_JSON.value, {"model": _MODEL.value, "data": path, "summary": summary,
                                 "line": line, "wall_s": round(time.time() - t0, 1)})


if __name__ == "__main__":
    cli.run(main)
