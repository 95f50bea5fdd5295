"""A lock that refuses a second holder at once (two retrains, two tune workers with one index): OS-level, so the
kernel releases it even when its holder is killed."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def exclusive(path: Path, refusal: Exception) -> Iterator[None]:
    """Hold the lock file `path` for the block, or raise `refusal` at once when another process holds it."""
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise refusal from None
    try:
        yield
    finally:
        lock.release()
