"""One process of tests/test_process_rows.py's verifier test (not a test itself): the
tiny random-weight verifier (SmolLM2's tokenizer) on a (data, fsdp, tensor) = (2, 2, 2)
mesh of every process's fake CPU devices.

    python tests/verifier_rows_driver.py --num_processes=2 --process_id=0 --port=P
    python tests/verifier_rows_driver.py --num_processes=1 --devices=8

Prints one JSON line (P(yes) of every call, the counters, and how many rows this process
tokenised) for the test to compare.
"""
import argparse
import json
import os
import sys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num_processes", type=int, default=1)
    ap.add_argument("--process_id", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--devices", type=int, default=8, help="fake CPU devices per process")
    args = ap.parse_args()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import jax

    if args.num_processes > 1:
        jax.distributed.initialize(f"127.0.0.1:{args.port}", args.num_processes,
                                   args.process_id)
    from drubric_jax import models, parallel
    from drubric_jax.text import tokenizer as tok_lib
    from drubric_jax.evaluator import verifier as ver_lib
    from drubric_jax.evaluation import judges
    from drubric_jax.models import config

    cfg = config.TINY
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    params = jax.device_put(params, models.param_shardings(params, mesh))
    tok = tok_lib.tokenizer_from_gguf(models.default_gguf_path())
    ver = ver_lib.Verifier(cfg, tok, 192, 48, mesh=mesh, max_rows=4, item_chunk=2)
    prepared = []
    prepare = ver.text.prepare  # the verifier's text part tokenises every row

    def counted(*a, **kw):  # the rows this process tokenises
        prepared.append(a[1])
        return prepare(*a, **kw)

    ver.text.prepare = counted
    # Six rows of different lengths (prefix buckets 64 to 256) and ragged item lists with a
    # blank in the middle; max_rows=4 and item_chunk=2 make several passes and item blocks.
    prompts = ["What is the capital of France?", "Write a haiku about rain.",
               "List two prime numbers.", "Name a colour.", "Say hello.",
               "Explain photosynthesis in one sentence."]
    responses = ["Paris.", "Rain on the roof\nsoft drums in the night\nsleep comes slowly",
                 "2 and 3 are prime. " * 12, "Blue.", "Hello there, friend! " * 6,
                 "Plants turn light, water and carbon dioxide into sugar and oxygen."]
    items = [["The response is correct.", "", "The response is short."],
             ["The response is a haiku."],
             ["The response lists numbers.", "The response is polite.", "It uses digits.",
              "It repeats itself."],
             ["It names a colour."], ["It greets.", "It is friendly."],
             ["It is one sentence.", "It mentions light."]]
    stats: dict = {}
    out = {"process": jax.process_index()}
    out["shared"] = ver.p_yes(params, prompts, responses, items, stats=stats).tolist()
    out["stats"] = stats
    out["naive"] = ver.p_yes(params, prompts, responses, items, shared_prefix=False).tolist()
    out["calibrated"] = ver.p_yes(params, prompts, responses, items,
                                  calibration="contextual").tolist()
    ids = [tok.encode(f"Is {x} blue? Answer Yes or No.", add_special_tokens=False)
           for x in ("the sky", "grass", "the deep blue sea at night")]
    out["ids"] = ver.p_yes_ids(params, ids).tolist()
    # The pairwise judge (policy evaluation): each process renders its share of questions.
    questions = [(prompts[i], [], responses[i], responses[(i + 1) % 6]) for i in range(5)]
    out["pairwise"] = judges.pairwise_p_yes(ver, params, questions, 192).tolist()
    # Uneven own rows: process 0 holds the first five rows, process 1 the last (with one
    # process: all six), so the two processes' shares differ in count and length.
    p, count = jax.process_index(), jax.process_count()
    mine = slice(0, 5) if (count > 1 and p == 0) else slice(5, 6) if count > 1 else slice(0, 6)
    out["own_rows"] = ver.p_yes(params, prompts[mine], responses[mine], items[mine],
                                process_rows=True).tolist()
    # A process with no rows still takes part in the passes of the others.
    none = slice(0, 0) if (count > 1 and p == 1) else slice(0, 6)
    out["empty_share"] = ver.p_yes(params, prompts[none], responses[none], items[none],
                                   process_rows=True).tolist()
    out["tokenised_rows"] = len(prepared)
    # Sampling with per-row draws: 8 prompts, each process its block of 4, 2 rows per
    # sampler call (one process: 4 calls of 2 rows + 2 filler rows each; two: 2 calls of
    # 2 rows per process).
    from drubric_jax import sampling

    block = parallel.process_block(8)
    ids = [[5 + i, 17 + 3 * i, 40 + i][: 1 + i % 3] for i in range(8)][block]
    got = sampling.generate_chunked(
        params, cfg, ids, 2, key=jax.random.PRNGKey(7), max_new_tokens=5,
        method=sampling.method_from_flags(1.0), stop_ids=[0], mesh=mesh,
        row_ids=list(range(block.start, block.stop)))
    out["sampled"] = parallel.gather_rows(got.tokens).tolist()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
