"""tqc.launched: a launched process's lines, logged as they come, in the launcher's context (FollowedOutput); the one
launcher both a stage command's relaunch and the retrain chain run torchrun through (run_torchrun)."""

from __future__ import annotations

import contextvars
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.processes import ended as _ended
from tqc.launched import FollowedOutput, launched_input_error, run_torchrun

RUN = contextvars.ContextVar("run", default=None)


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seen = []

    def emit(self, record):
        self.seen.append((record.getMessage(), RUN.get()))


def _logger(name: str) -> tuple[logging.Logger, _Capture]:
    log, capture = logging.getLogger(name), _Capture()
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(capture)
    return log, capture


def test_the_lines_are_logged_in_the_launchers_context():
    """A Prefect run's log handler finds its run in the context: the readers' threads once had none, so a launched
    stage's lines were dropped from the run's logs where PREFECT_LOGGING_EXTRA_LOGGERS named tqc."""
    log, capture = _logger("test.launched.context")
    RUN.set("flow run 1")
    process = subprocess.Popen([sys.executable, "-c", "import sys; print('hello'); sys.stderr.write('RuntimeError: x\\n')"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    output = FollowedOutput(process, log, "child")
    process.wait()
    assert output.join(timeout=30) == (["hello"], ["RuntimeError: x"])
    assert sorted(capture.seen) == [("child: RuntimeError: x", "flow run 1"), ("child: hello", "flow run 1")]
    assert output.errors == ["RuntimeError: x"] and not output.cut_short


def test_a_child_that_outlives_the_process_is_not_waited_for():
    """A rank of a SIGKILLed torchrun runs on in a session of its own, holding the pipes: the launcher used to wait
    for it to end, which could be never."""
    log, _ = _logger("test.launched.orphan")
    holder = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)']); print('bye')"
    process = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    output = FollowedOutput(process, log, "child")
    process.wait()
    started = time.monotonic()
    stdout, _ = output.join(timeout=1)
    assert time.monotonic() - started < 10 and output.cut_short and stdout == ["bye"]


class _Levels(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seen = []

    def emit(self, record):
        self.seen.append((record.levelname, record.getMessage()))


def test_a_tqc_log_line_keeps_its_level_and_loses_its_own_time_and_logger():
    """A launched stage's warning was an INFO line in the flow run's logs, its time and logger name written twice."""
    log = logging.getLogger("test.launched.levels")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    levels = _Levels()
    log.addHandler(levels)
    child = ("import logging, sys; from tqc.launched import LOG_FORMAT; "
             "logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stdout); "
             "logging.getLogger('tqc.stages.stage_one').info('stage one: 12 rows'); "
             "logging.getLogger('tqc.training').warning('no validation question for 2 classes'); "
             "logging.getLogger('tqc.cli').error('the store cannot be reached'); "
             "logging.getLogger('tqc.cli').error('the store cannot be reached'); "  # a second rank's copy
             "logging.getLogger('huggingface_hub').warning('offline'); "
             "print('epoch 1/2: 100%|#####| 3/3 [00:01<00:00]')")
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    output = FollowedOutput(process, log, "stage-one")
    process.wait()
    output.join(timeout=30)
    assert levels.seen == [("INFO", "stage-one: stage one: 12 rows"),
                           ("WARNING", "stage-one: no validation question for 2 classes"),
                           ("ERROR", "stage-one: the store cannot be reached"),
                           ("ERROR", "stage-one: the store cannot be reached"),
                           ("WARNING", "stage-one: huggingface_hub: offline"),  # not the stage's own: named
                           ("INFO", "stage-one: epoch 1/2: 100%|#####| 3/3 [00:01<00:00]")]
    assert output.errors == ["the store cannot be reached"]  # once, not a copy per rank


def test_a_record_after_a_progress_bars_frame_is_still_read_as_a_record():
    from tqc.launched import _level_and_message

    bar = "encoding:  50%|#####     | 1/2 [00:00<00:00]"
    assert _level_and_message(bar + "2026-11-28 02:34:45,430 WARNING tqc.training: no gain") == (logging.WARNING, "no gain")
    assert _level_and_message(bar) == (logging.INFO, bar)
    assert _level_and_message("Traceback (most recent call last):") == (logging.INFO, "Traceback (most recent call last):")


def test_the_input_error_raised_is_the_lowest_ranks_by_number(tmp_path):
    """Rank names sorted as text put rank 10 before rank 2: with 11 processes or more, a higher rank's error was
    raised where rank 2's was written."""
    path = tmp_path / "input-error.json"
    for rank in (10, 2, 3):
        (tmp_path / f"input-error.json.rank{rank}").write_text(f'{{"error": "ReaderError", "message": "rank {rank}"}}')
    assert str(launched_input_error(path)) == "ReaderError: rank 2"
    assert launched_input_error(tmp_path / "none.json") is None


# A launcher in a process of its own, following its "torchrun" (a child that sleeps, having written its pid) as the
# retrain chain's does: it is what receives the SIGTERM
LAUNCHER = """
import logging, sys
from pathlib import Path
from tqc.launched import run_torchrun
child = "import os, time; open(%r, 'w').write(str(os.getpid())); time.sleep(600)" % sys.argv[1]
run_torchrun([sys.executable, "-c", child], 2, Path(sys.argv[2]), followed_by=logging.getLogger("launcher"), name="x")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_launcher_stopped_with_sigterm_stops_its_torchrun_first(tmp_path):
    """The retrain chain's launcher (evaluate.seeds > 1 under `dvc repro`, say) had no SIGTERM handler: a `kill` of it
    ended it alone, and its torchrun trained on. Both launchers now run torchrun through `run_torchrun`, which asks it
    to stop first; the launcher then exits 143, as SIGTERM's default action would."""
    pid_file = tmp_path / "child.pid"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(pid_file), str(tmp_path / "input-error")],
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    child = None
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        child = int(pid_file.read_text())
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while not _ended(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _ended(child), "the launched torchrun ran on after its launcher"
    finally:
        launcher.kill()
        if child is not None and not _ended(child):
            os.kill(child, signal.SIGKILL)


def test_a_sigterm_handler_already_set_is_kept_while_torchrun_runs(tmp_path):
    """A Prefect flow run turns SIGTERM into its own exception, which marks the run cancelled: run_torchrun leaves it."""
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        tells_its_parent = "import os, signal; os.kill(os.getppid(), signal.SIGTERM)"
        ended = run_torchrun([sys.executable, "-c", tells_its_parent], 2, tmp_path / "input-error")
        assert ended.status == 0 and seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # still the caller's after
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_input_error_the_processes_recorded_is_raised_through_either_launcher(tmp_path):
    from tqc.launched import ERROR_FILE_ENV, LaunchedInputError

    records = ("import json, os; open(os.environ[%r] + '.rank0', 'w').write(json.dumps("
               "{'error': 'UnknownClass', 'message': 'nowhere'})); raise SystemExit(1)" % ERROR_FILE_ENV)
    for followed_by in (None, logging.getLogger("launcher")):
        with pytest.raises(LaunchedInputError, match="UnknownClass: nowhere"):
            run_torchrun([sys.executable, "-c", records], 2, tmp_path / "input-error", followed_by=followed_by)
    crash = run_torchrun([sys.executable, "-c", "print('RuntimeError: out of memory'); raise SystemExit(1)"], 2,
                         tmp_path / "input-error", followed_by=logging.getLogger("launcher"))
    assert crash.status == 1 and crash.errors == ["RuntimeError: out of memory"]  # a stale record is not read again


def test_a_sigterm_this_process_ignores_stays_ignored_while_torchrun_runs(tmp_path):
    """SIG_IGN inherited from whatever started the command: the launch does not make SIGTERM end it."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        tells_its_parent = "import os, signal; os.kill(os.getppid(), signal.SIGTERM)"
        assert run_torchrun([sys.executable, "-c", tells_its_parent], 2, tmp_path / "input-error").status == 0
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
