"""What a tqc command launched under torchrun tells the process that launched it (pipeline.train_chain).

torchrun exits 1 whatever stopped its processes, so an input error (the same on every retry) would read as a crash
(retried): each process that stops on one writes it to a file the launcher named, and the launcher raises it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ERROR_FILE_ENV = "TQC_INPUT_ERROR_FILE"  # the launcher's path; each process writes it + ".rank<RANK>"


class LaunchedInputError(RuntimeError):
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
    written = sorted(path.parent.glob(f"{path.name}.rank*"))
    if not written:
        return None
    said = json.loads(written[0].read_text(encoding="utf-8"))
    return LaunchedInputError(f"{said['error']}: {said['message']}")
