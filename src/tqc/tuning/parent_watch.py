"""A tune worker that ends with the process that started it (the tune flow's)."""

from __future__ import annotations

import logging
import os
import _thread
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

log = logging.getLogger("tqc.tune")

POLL_SECONDS = 1.0
# tqc's own, sent by the watcher to this process's main thread alone. None where there is none (Windows): the watcher
# then interrupts the main thread as Ctrl-C does, at its next instruction (a sleep or a wait under way ends first)
STOP_SIGNAL = signal.SIGUSR1 if hasattr(signal, "SIGUSR1") and hasattr(signal, "pthread_kill") else None


@contextmanager
def ending_with(parent_pid: int | None) -> Iterator[None]:
    """Within the block, this process stops as Ctrl-C stops it (KeyboardInterrupt in the main thread, so Optuna marks
    the running trial failed, "interrupted") once `parent_pid` is no longer its parent: that process ended and this
    one was handed to another. Prefect cancels a flow run by signalling its process alone (PrefectHQ/prefect#20979);
    the workers it started went on training, holding the cores or a GPU and writing trials. A write to the dead
    parent's pipe used to end them, but a worker writes no progress bars into a pipe and may say nothing for a whole
    epoch. Checked against the pid the parent gave, not read here, so a parent dead before this line still counts.
    None: nothing watched (a worker started by hand lives as its shell lets it)."""
    if parent_pid is None:
        yield
        return
    stopped = threading.Event()
    if STOP_SIGNAL is None:
        with _watching(parent_pid, stopped):
            yield
        return

    def stop(signum, frame) -> None:
        # The watcher may have sent its signal as the block ended: come now, in the clean-up below, it would stop
        # nothing but the clean-up itself (the handler left installed, the block's work done and said interrupted)
        if not stopped.is_set():
            _stop(signum, frame)

    previous = signal.signal(STOP_SIGNAL, stop)
    try:
        with _watching(parent_pid, stopped):
            yield
    finally:
        signal.signal(STOP_SIGNAL, previous)


@contextmanager
def _watching(parent_pid: int, stopped: threading.Event) -> Iterator[None]:
    """`_watch` in a thread of its own while inside; stopped and joined on the way out, so that its signal, if it sent
    one, has come by the time the block is left (a pending one runs the handler as the caller restores it)."""
    watcher = threading.Thread(target=_watch, args=(parent_pid, stopped), name="tqc-parent-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stopped.set()
        watcher.join()


def _watch(parent_pid: int, stopped: threading.Event) -> None:
    while not stopped.wait(POLL_SECONDS):
        if os.getppid() != parent_pid:
            log.warning("tune: the process that started this worker (pid %d) has ended; stopping", parent_pid)
            if STOP_SIGNAL is None:
                _thread.interrupt_main()
            else:  # a real signal, not _thread.interrupt_main: it also cuts short a sleep or a wait the main thread is in
                signal.pthread_kill(threading.main_thread().ident, STOP_SIGNAL)
            return


def _stop(signum, frame) -> None:
    raise KeyboardInterrupt(f"the process that started this worker has ended (signal {signum})")
