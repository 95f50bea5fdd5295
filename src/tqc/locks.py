"""A lock that refuses a second holder at once (two retrains, two tune workers with one index): OS-level, so the
kernel releases it even when its holder is killed."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def exclusive(path: Path, refusal: Exception, setting: str = "lock") -> Iterator[None]:
    """Hold the lock file `path` for the block, or raise `refusal` at once when another process holds it. A `path` that
    is a folder, or under a file, is a ConfigError naming `setting`: it was the OS's error, in two tracebacks."""
    from filelock import FileLock, Timeout

    from tqc.config import ConfigError

    if path.is_dir():
        raise ConfigError(f"{setting} {path}: a folder; a lock is a file, made in a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file where one of its folders should be
        blocking = next(folder for folder in path.absolute().parents if folder.is_file())
        raise ConfigError(f"{setting} {path}: {blocking} is a file; a lock is a file, made in a folder") from None
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise refusal from None
    try:
        yield
    finally:
        lock.release()
