"""A lock that refuses a second holder, at once (two retrains, two tune workers with one index) or after a wait (the
tune workers' reports): OS-level, so the kernel releases it even when its holder is killed."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def exclusive(path: Path, refusal: Exception, setting: str = "lock", timeout_s: float = 0) -> Iterator[None]:
    """Hold the lock file `path` for the block, or raise `refusal` when another process holds it past `timeout_s` (at
    once by default). A `path` that is a folder, or under a file, is a ConfigError naming `setting`: it was the OS's
    error, in two tracebacks."""
    from filelock import FileLock, Timeout

    from tqc.config import ConfigError

    if path.is_dir():
        raise ConfigError(f"{setting} {path}: a folder; a lock is a file, made in a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file, or a link to nothing, where one of its folders should be; or no permission
        raise ConfigError(f"{setting} {path}: {_why_no_folder(path, exc)}; a lock is a file, made in a folder") from None
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=timeout_s)
    except Timeout:
        raise refusal from None
    try:
        yield
    finally:
        lock.release()


def _why_no_folder(path: Path, exc: OSError) -> str:
    for folder in reversed(path.absolute().parents):  # the outermost at fault: the one to fix
        if folder.is_symlink() and not folder.exists():
            return f"{folder} is a link to {folder.readlink()}, which does not exist"
        if folder.is_file():
            return f"{folder} is a file"
    return f"{path.parent} cannot be made: {exc.strerror or exc}"
