"""A tune worker stops once the process that started it has ended (tqc.tuning.parent_watch)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tqc.tuning import parent_watch


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    monkeypatch.setattr(parent_watch, "POLL_SECONDS", 0.05)


def test_a_worker_whose_parent_is_another_process_stops_as_ctrl_c_stops_it():
    """The pid given is not this process's parent (the flow's process ended, this one was handed on): the main thread
    gets a KeyboardInterrupt, cutting a sleep short, and the signal's own handler is back afterwards."""
    before = signal.getsignal(parent_watch.STOP_SIGNAL)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="process that started this worker has ended"):
        with parent_watch.ending_with(os.getppid() + 1_000_000):
            time.sleep(30)
    assert time.monotonic() - started < 20
    assert signal.getsignal(parent_watch.STOP_SIGNAL) == before


def test_a_worker_whose_parent_lives_goes_on_and_nothing_is_watched_without_a_pid():
    finished = []
    for parent in (os.getppid(), None):
        with parent_watch.ending_with(parent):
            time.sleep(0.3)  # six polls
            finished.append(parent)
    assert finished == [os.getppid(), None]


def test_a_parent_that_ends_as_the_block_ends_leaves_the_handler_restored_and_the_block_done(monkeypatch):
    """The watcher saw the parent gone as the block was ending (its signal came while the block's own clean-up ran):
    the KeyboardInterrupt came out of the clean-up, after the work was done, and the handler was left installed, so
    a later SIGUSR1 (of anything else in the process) raised "the process that started this worker has ended"."""
    before = signal.getsignal(parent_watch.STOP_SIGNAL)
    watching, block_done, real_parent = threading.Event(), threading.Event(), os.getppid()

    def parent_gone_once_the_block_is_done():
        watching.set()
        block_done.wait(30)  # bounded: a block that never ends (it failed) must not hang its clean-up
        time.sleep(0.2)  # the main thread is in the clean-up, joining the watcher
        return real_parent + 1_000_000

    monkeypatch.setattr(parent_watch.os, "getppid", parent_gone_once_the_block_is_done)
    try:
        with parent_watch.ending_with(1):
            assert watching.wait(10)
            block_done.set()
        time.sleep(0.2)  # a pending signal would be handled here
    except KeyboardInterrupt:
        pytest.fail("interrupted after the block was done")
    finally:
        after = signal.getsignal(parent_watch.STOP_SIGNAL)
        signal.signal(parent_watch.STOP_SIGNAL, before)  # for the rest of the suite, whatever happened
    assert after == before


WITHOUT_SIGUSR1 = """
import os, signal, sys, time
del signal.SIGUSR1, signal.pthread_kill  # as on Windows
from tqc.tuning import parent_watch
parent_watch.POLL_SECONDS = 0.05
try:
    with parent_watch.ending_with(os.getppid() + 1_000_000):
        for _ in range(600):
            time.sleep(0.05)
except KeyboardInterrupt:
    print("stopped")
"""


def test_where_there_is_no_sigusr1_a_worker_still_stops_as_ctrl_c_stops_it():
    """On Windows (no SIGUSR1, no pthread_kill) the module failed at its import: every `tqc tune` (the tune flow's
    workers included) was an AttributeError, --parent-pid or not."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WITHOUT_SIGUSR1], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "stopped", done.stderr
