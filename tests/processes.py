"""Helpers for tests that check a launched process ended with its launcher (reads /proc: Linux only)."""

from __future__ import annotations

from pathlib import Path


def ended(pid: int) -> bool:
    """No such process, or a zombie: reparented to a PID 1 that need not reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")
