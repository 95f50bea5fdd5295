"""Launching a tqc command under torchrun (`run_torchrun`), for both launchers: a stage command's own relaunch
(`cli._join_or_launch`) and the retrain chain's (`pipeline._Launcher`); and what the launched command tells them.

torchrun exits 1 whatever stopped its processes, so an input error (the same on every retry) would read as a crash
(retried): each process that stops on one writes it to a file the launcher named, and the launcher raises it. Its
lines (each epoch's figures, where it wrote) are logged by the launcher as they come (`FollowedOutput`), so they
reach whatever the launcher's log reaches: a Prefect flow run's logs, not only the worker's console.
"""

from __future__ import annotations

import contextvars
import json
import signal
import logging
import os
import re
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tqc.errors import InputError

ERROR_FILE_ENV = "TQC_INPUT_ERROR_FILE"  # the launcher's path; each process writes it + ".rank<RANK>"


class LaunchedInputError(InputError, RuntimeError):
    """An input error that stopped a command launched under torchrun, as its processes said it."""


def record_input_error(error: BaseException) -> None:
    """Under a launcher that asked for it, write this process's input error where the launcher reads it."""
    path = os.environ.get(ERROR_FILE_ENV)
    if path:
        from tqc.io import write_text

        write_text(f"{path}.rank{os.environ.get('RANK', '0')}",
                   json.dumps({"error": type(error).__name__, "message": str(error)}) + "\n")


def clear_input_errors(path: Path) -> None:
    for stale in path.parent.glob(f"{path.name}.rank*"):
        stale.unlink()


def launched_input_error(path: Path) -> LaunchedInputError | None:
    """The input error a launched command's processes recorded at `path` (the lowest rank's), if any."""
    written = path.parent.glob(f"{path.name}.rank*")
    lowest = min(written, key=lambda file: int(file.name.rsplit(".rank", 1)[1]), default=None)  # by number: 2 before 10
    if lowest is None:
        return None
    said = json.loads(lowest.read_text(encoding="utf-8"))
    return LaunchedInputError(f"{said['error']}: {said['message']}")


class FollowedOutput:
    """A process's stdout and stderr (pipes), each line logged as `name: line` as it comes (a line in the tqc CLI's
    log format at its own level, with its message alone); the last `kept` of each, and the first error lines
    (`…Error: …`, which under torchrun come before its own summary, and ERROR records), are kept for an error
    message. The readers run in a copy of the caller's context, so a Prefect run's log handler knows whose lines they
    are. The process's pipes stay this process's: were it killed, the child's next write fails and the child ends,
    instead of running on unseen."""

    def __init__(self, process: subprocess.Popen, log: logging.Logger | logging.LoggerAdapter, name: str, kept: int = 40):
        self.tails: dict[str, deque[str]] = {"stdout": deque(maxlen=kept), "stderr": deque(maxlen=kept)}
        self.errors: list[str] = []
        # A process started with stderr=STDOUT has one stream, read in the order it was written (its stderr tail stays
        # empty)
        self._readers = [threading.Thread(target=contextvars.copy_context().run, daemon=True,
                                          args=(_log_lines, stream, log, name, self.tails[label], self.errors))
                         for label, stream in (("stdout", process.stdout), ("stderr", process.stderr)) if stream is not None]
        for reader in self._readers:
            reader.start()

    def join(self, timeout: float | None = None) -> tuple[list[str], list[str]]:
        """Once the process ended: (the last lines of stdout, the last lines of stderr). `timeout`: how long to wait
        for the pipes to close; a child that outlived the process (a rank of a SIGKILLed torchrun, in a session of its
        own, where it cannot ask to end with it: off Linux, or killed with it while starting up) keeps them open, and
        what it writes after that is not waited for."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return list(self.tails["stdout"]), list(self.tails["stderr"])

    @property
    def cut_short(self) -> bool:
        return any(reader.is_alive() for reader in self._readers)


def run_logging_lines(command: list[str], log: logging.Logger | logging.LoggerAdapter, name: str,
                      env: dict[str, str] | None = None, kept: int = 40) -> tuple[int, list[str], list[str]]:
    """Runs `command`, logging each line it writes as it comes (a flow run shows its workers' trials and epochs while
    they run, not after); → the exit status and the last `kept` lines of stdout and of stderr."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    output = FollowedOutput(process, log, name, kept)
    returncode = process.wait()
    return (returncode, *output.join())


ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b.*:")  # an exception's last line: `RuntimeError: …`
ERRORS_KEPT = 5
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # the tqc CLI's (cli.main), which RECORD_LINE reads back
# A record of that format: its time is the launcher's own record's to say; its level is kept, so a launched stage's
# warning is a warning in the launcher's log (a flow run's), not an INFO line that holds the word. Not anchored at the
# start: a progress bar that cleared itself with no "\r" after it leaves its frame before the record.
RECORD_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ([^\s:]+): (.*)$")


def _level_and_message(line: str) -> tuple[int, str]:
    """A log record's level and message (a logger outside tqc named before it: a library's warning is not the
    stage's own); any other line (a progress bar's, torchrun's, a traceback's, a record's later lines) as INFO."""
    record = RECORD_LINE.search(line)
    if record is None:
        return logging.INFO, line
    level, logger, message = record.groups()
    return logging.getLevelName(level), message if logger == "tqc" or logger.startswith("tqc.") else f"{logger}: {message}"


def _log_lines(stream: IO[bytes], log: logging.Logger | logging.LoggerAdapter, name: str, tail: deque[str],
               errors: list[str] | None = None) -> None:
    # Split on "\n" alone: a progress bar redraws its line with "\r", and only the text after its last "\r" (the
    # bar's final frame, or a log line written after a bar cleared itself) is worth a log record.
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\r\n").rsplit("\r", 1)[-1].strip()
        if line:
            tail.append(line)
            level, message = _level_and_message(line)
            # Each rank writes its own copy of an error: kept once, so that copies do not crowd out the other errors
            if (errors is not None and len(errors) < ERRORS_KEPT and message not in errors
                    and (level >= logging.ERROR or ERROR_LINE.match(line))):
                errors.append(message)
            log.log(level, "%s: %s", name, message)
    stream.close()


TERMINATE_GRACE_SECONDS = 30  # torchrun's own grace for its processes after SIGTERM is 30 s too


def wait_for_torchrun(launched: subprocess.Popen) -> int:
    """torchrun's exit status (`run_torchrun`). Interrupted (a cancelled flow run, Ctrl-C), it is asked to stop first: torchrun passes SIGTERM on
    to its processes, which run in sessions of their own; killed outright, it would leave them to their own request
    to end with it (`distributed.end_with_launcher`, Linux only)."""
    try:
        return launched.wait()
    except BaseException:
        launched.terminate()
        try:
            launched.wait(timeout=TERMINATE_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            launched.kill()
        raise


OUTPUT_GRACE_SECONDS = 30  # after torchrun ended, for its processes' last lines


@dataclass(frozen=True)
class TorchrunEnded:
    """How a torchrun that stopped on no input error ended: its exit status, and, where its output was followed, the
    last lines its processes wrote (stdout and stderr as one stream, in order) and their first error lines."""
    status: int
    last_lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def run_torchrun(command: list[str], processes: int, error_file: Path,
                 followed_by: logging.Logger | logging.LoggerAdapter | None = None, name: str = "") -> TorchrunEnded:
    """Runs `command` (a torchrun of `processes` processes, `distributed.relaunch_command`) until it ends. An input
    error its processes stopped on (a class the catalog lacks: the same in each, and on every retry) is raised here as
    one (`LaunchedInputError`), not left as torchrun's status 1. `followed_by`: each line the processes write is
    logged there as `name: line` as it comes (a flow run's logs, not only the worker's console); else they write to
    this process's own streams. Stopped itself by SIGTERM (a `kill`, a job scheduler) or Ctrl-C, this process first
    asks torchrun to stop its processes (`wait_for_torchrun`): SIGTERM's default action ended it alone, and torchrun,
    left to init, trained on and wrote the stage's outputs after it."""
    from tqc import distributed

    clear_input_errors(error_file)  # each process writes error_file + ".rank<RANK>" (record_input_error)
    environment = {**distributed.launch_environment(processes), ERROR_FILE_ENV: str(error_file)}  # threads too
    with _sigterm_raises():
        if followed_by is None:
            status, output = wait_for_torchrun(subprocess.Popen(command, env=environment)), None
        else:
            # One pipe for both streams: the lines stay in the order the processes wrote them (two pipes, read by two
            # threads, interleave as the threads happen to run), in the log and in a failure's last lines
            launched = subprocess.Popen(command, env={**environment, "PYTHONUNBUFFERED": "1"},  # lines as they come
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            output = FollowedOutput(launched, followed_by, name)
            status = wait_for_torchrun(launched)
    last_lines = _last_lines(output, followed_by, name, status)
    said = launched_input_error(error_file) if status != 0 else None
    if said is not None:
        raise said
    return TorchrunEnded(status, last_lines, output.errors if output is not None else [])


def _last_lines(output: FollowedOutput | None, log: logging.Logger | logging.LoggerAdapter | None, name: str,
                status: int) -> list[str]:
    if output is None:
        return []
    last_lines, _ = output.join(timeout=OUTPUT_GRACE_SECONDS)
    if output.cut_short:
        log.warning("%s: torchrun ended (status %s) but a process of its still holds its output; not waiting for it",
                    name, status)
    return last_lines


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises SystemExit(128 + SIGTERM), as its default action exits, so that the block's
    `finally` and `except` (`wait_for_torchrun`'s) run first. A handler already set is kept: a Prefect flow run's turns
    SIGTERM into its own exception, which marks the run cancelled; and a SIGTERM this process was told to ignore
    (SIG_IGN, inherited from whatever started it) stays ignored, as it would without a launch. Only the main thread
    may set one; elsewhere (a flow's task thread) the block runs as it is."""
    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    handles = (threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
    previous = signal.signal(signal.SIGTERM, stop) if handles else None
    try:
        yield
    finally:
        if handles:
            signal.signal(signal.SIGTERM, previous)
