"""A tune worker stops once the process that started it has ended (tqc.tuning.parent_watch)."""

from __future__ import annotations

import os
import signal
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
