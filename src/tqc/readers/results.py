"""What a reader gives back: rows read, rows rejected (never dropped silently), and the errors that stop a file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tqc.errors import InputError
from tqc.schema import Catalog, LabeledQuestion


class ReaderError(InputError, ValueError):
    """The file as a whole is unusable (missing, empty, wrong columns)."""


class MissingColumns(ReaderError):
    """A file without a column its mapping names (a CSV's header, a JSONL record): usually the wrong mapping or the wrong
    file, so callers can say which option picks the column."""

    def __init__(self, message: str, columns: list[str]):
        super().__init__(message)
        self.columns = columns

    def __reduce__(self):
        return type(self), (str(self), self.columns)


class RowsRejected(ReaderError):
    """A file whose rows were rejected, all or too many of them, so the stage stops: `rejected` holds every one, for
    the stage to quarantine (the error itself names only the first few)."""

    def __init__(self, message: str, rejected: list[RejectedRow]):
        super().__init__(message)
        self.rejected = rejected

    def __reduce__(self):  # pickled whole (a Prefect task's failure, a process pool's), not as ValueError(message)
        return type(self), (str(self), self.rejected)


@dataclass(frozen=True)
class RejectedRow:
    file: str
    line: int
    reason: str
    content: str
    # The mapped columns a JSONL record lacks, where that is its `reason` (a catalog reader raises MissingColumns
    # then); not one of a quarantine line's fields, whose reason already names them
    missing_columns: tuple[str, ...] = field(default=(), compare=False)

    def quarantined(self, stage: str) -> dict:
        """The row as a quarantine file's line."""
        return {"file": self.file, "line": self.line, "reason": self.reason, "content": self.content, "stage": stage}


@dataclass
class ReadResult:
    rows: list[LabeledQuestion] = field(default_factory=list)
    rejected: list[RejectedRow] = field(default_factory=list)
    # A row's source ("file:line") → the text in read_table's `source_column` (rows made offline)
    named_sources: dict[str, str] = field(default_factory=dict)

    def extend(self, other: "ReadResult") -> None:
        self.rows.extend(other.rows)
        self.rejected.extend(other.rejected)
        self.named_sources.update(other.named_sources)


@dataclass
class DatasetSplits:
    """What ingest reads: the official train and test splits and the catalog."""

    train: ReadResult
    test: ReadResult
    catalog: Catalog


UNREADABLE_HINT = "fix the file, or raise the fraction"


MAX_REJECTED_SHOWN = 10  # rejected lines a stopping error names (a file in another format rejects every line)


def require_rows(result: ReadResult, path: Path, max_rejected_fraction: float = 1.0, hint: str = UNREADABLE_HINT) -> ReadResult:
    """A split with no usable row (a header only, every line rejected) is an error, not an empty run; so is one with
    more than `max_rejected_fraction` of its rows rejected (a file in another format, or unquoted commas in its
    texts), which would otherwise train and be scored on what is left. `hint`: what to do about it."""
    shown = "; ".join(f"line {r.line}: {r.reason}" for r in result.rejected[:MAX_REJECTED_SHOWN])
    more = f"; and {len(result.rejected) - MAX_REJECTED_SHOWN} more" if len(result.rejected) > MAX_REJECTED_SHOWN else ""
    why = f"; rejected {shown}{more}" if result.rejected else ""
    if not result.rows and not result.rejected:
        raise RowsRejected(f"{path}: no rows to read (a header and nothing under it?)", result.rejected)
    if not result.rows:
        raise RowsRejected(f"{path}: no usable rows ({len(result.rejected)} rejected{why})", result.rejected)
    read = len(result.rows) + len(result.rejected)
    if len(result.rejected) > max_rejected_fraction * read:
        raise RowsRejected(f"{path}: {len(result.rejected)} of {read} rows rejected, more than data.max_rejected_fraction "
                           f"({max_rejected_fraction:g}) of the file{why}: {hint}", result.rejected)
    return result
