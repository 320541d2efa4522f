"""Run outputs and logs (drubric_jax/rounds/run_logging.py)."""
import logging
import os

import drubric_jax
from drubric_jax.rounds import run_logging


def _record(path, level):
    return logging.LogRecord("absl", level, path, 1, "message", None, None)


def test_third_party_info_is_dropped_ours_and_warnings_pass():
    f = run_logging.ThirdPartyFilter()
    orbax = "/venv/lib/python3.11/site-packages/orbax/checkpoint/checkpoint_manager.py"
    ours = os.path.join(os.path.dirname(drubric_jax.__file__), "rounds", "loop.py")
    assert os.path.exists(ours)  # a real file of ours (the layout may move it)
    assert not f.filter(_record(orbax, logging.INFO))
    assert f.filter(_record(orbax, logging.WARNING))
    assert f.filter(_record(ours, logging.INFO))


def test_ifevals_undetected_language_error_is_dropped_and_its_verdict_kept(monkeypatch):
    """The language checkers of IFEval (if_verifiable) log an ERROR for a text langdetect
    cannot read and count it as followed; the filter drops that line, not the verdict, and
    not another ERROR of the same file."""
    from if_verifiable.ifeval import instructions

    # Without the root logger's own filter (`checks.verify.UndetectedLanguage`, tested in
    # test_checks.py), so the record reaches the handlers.
    root = logging.getLogger()
    monkeypatch.setattr(root, "filters", [])
    records, unfiltered = [], []
    handler, plain = logging.Handler(), logging.Handler()
    handler.emit, plain.emit = records.append, unfiltered.append
    handler.addFilter(run_logging.ThirdPartyFilter())
    root.addHandler(handler)
    root.addHandler(plain)
    try:
        checker = instructions.ResponseLanguageChecker("x")
        checker.build_description(language="de")
        assert checker.check_following("123 456")  # undetectable: followed, by IFEval's rule
    finally:
        root.removeHandler(handler)
        root.removeHandler(plain)
    assert records == [] and len(unfiltered) == 1 and unfiltered[0].levelno == logging.ERROR
    other = logging.LogRecord("root", logging.ERROR, instructions.__file__, 1, "other %s",
                              ("x",), None)
    assert run_logging.ThirdPartyFilter().filter(other)


def test_quiet_third_party_logs_installs_once_and_can_be_removed():
    from absl import logging as absl_logging

    handler = absl_logging.get_absl_handler()
    run_logging.quiet_third_party_logs(True)
    run_logging.quiet_third_party_logs(True)
    ours = [f for f in handler.filters if isinstance(f, run_logging.ThirdPartyFilter)]
    assert len(ours) == 1
    run_logging.quiet_third_party_logs(False)
    assert not any(isinstance(f, run_logging.ThirdPartyFilter) for f in handler.filters)


def test_wall_times_add_up_per_stage_and_survive_a_new_process(tmp_path):
    """add_wall_time sums the seconds of a stage over commands (a resumed stage adds its
    restart's time) and keeps the other stages; wall_times reads the file back."""
    assert run_logging.wall_times(str(tmp_path)) == {}
    run_logging.add_wall_time(str(tmp_path), "full", 10.0)
    run_logging.add_wall_time(str(tmp_path), "disc_only", 4.0)
    wall = run_logging.add_wall_time(str(tmp_path), "full", 2.5)
    assert wall == {"full": 12.5, "disc_only": 4.0}
    assert run_logging.wall_times(str(tmp_path)) == wall
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wall_s.json"]  # no .tmp left
