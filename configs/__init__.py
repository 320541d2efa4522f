"""ml_collections config files for experiments/run.py and experiments/eval_evaluator.py."""
