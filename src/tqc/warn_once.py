"""Warnings the same at every training of a run (its settings', its catalog's), said once by callers that train chain
after chain in one process: tune's trials, evaluate's seeds."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

# `extra` of a warning about the settings or the catalog, the same at every training: `each_warning_once` says it once.
# Another (an epoch whose validation diverged) is this training's own news, said at every training that has it.
ALIKE_EVERY_TRAINING = {"alike_every_training": True}
# The loggers such warnings come from: training's, mining's (a mine.k above the wrong classes, at every trial), and
# the catalog's classes that share a standard question (tqc.twins).
_ALIKE_LOGGERS = ("tqc.training", "tqc.mining", "tqc.twins")


class _EachOnce(logging.Filter):
    """Lets a warning `ALIKE_EVERY_TRAINING` through the first time its text is logged, and drops it after; every
    other line passes."""

    def __init__(self):
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not getattr(record, "alike_every_training", False):
            return True
        message = record.getMessage()
        if message in self.said:
            return False
        self.said.add(message)
        return True


@contextmanager
def each_warning_once() -> Iterator[None]:
    """Within the block, each of training's warnings about its settings or catalog is said once, not at every
    training: the callers that train chain after chain in one process (tune's trials, evaluate's seeds) would say the
    same cut standard questions, shared standard questions and loss notes twice a chain, and mining its clipped mine.k
    once a chain. A warning whose text differs (another max_length) is said, and so is each training's own (a
    diverged epoch's, whose text repeats)."""
    once, loggers = _EachOnce(), [logging.getLogger(name) for name in _ALIKE_LOGGERS]
    for logger in loggers:  # one filter for all, so a text is said once whichever logger says it
        logger.addFilter(once)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(once)
