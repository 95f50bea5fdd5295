"""The inbox and its archive: new files listed and hashed, repeat deliveries recognised by the manifest, files
archived with their outcome, and quarantine records."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import stat
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from tqc.config import ConfigError, RetrainParams
from tqc.io import file_digest, name_within_limit, read_jsonl, write_jsonl
from tqc.locks import exclusive
from tqc.readers import TABLE_SUFFIXES
from tqc.retraining.errors import RetrainBusy
from tqc.schema import quarantine_reason

log = logging.getLogger("tqc.retrain")  # one logger for the retrain steps, whichever module says it

MANIFEST = "manifest.jsonl"
SUFFIXES = TABLE_SUFFIXES


@contextmanager
def retrain_lock(params: RetrainParams) -> Iterator[None]:
    """Two retrains never run at once (`tqc.locks.exclusive`)."""
    with exclusive(Path(params.lock), RetrainBusy(f"another retrain holds {params.lock}; not starting a second one"),
                   "retrain.lock"):
        yield


@dataclass(frozen=True)
class Incoming:
    path: Path
    sha256: str

    @property
    def is_catalog(self) -> bool:
        return self.path.name.lower().startswith("catalog")


def sha256(path: Path) -> str:
    return file_digest(path, "sha256")


def delivered_bytes(path: Path) -> bytes:
    """A delivered file's bytes, never through a link (`_opened_delivery`)."""
    with _opened_delivery(path) as delivered:
        return delivered.read()


def _delivered_sha256(path: Path) -> str:
    with _opened_delivery(path) as delivered:
        return hashlib.file_digest(delivered, "sha256").hexdigest()


def _opened_delivery(path: Path) -> BinaryIO:
    """A delivered file opened for reading, never through a link: a link put in a shared inbox (`delivery.csv` →
    someone's ~/.pgpass) would have the flow read, as its own user, a file the one who delivered could not, and echo
    its lines in the log and the quarantine. A link (ELOOP) or anything but a regular file is an OSError, so it is left
    unread, as an unreadable file is. Opened without blocking: a pipe put there would else hold the open until a
    writer came, and the run with it."""
    try:
        delivered = os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)), "rb")
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotADeliveredFile(errno.ELOOP, "a link, not a file", str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(delivered.fileno()).st_mode):
        delivered.close()
        raise NotADeliveredFile(errno.EINVAL, "not a regular file", str(path))
    return delivered


class NotADeliveredFile(OSError):
    """What is in the inbox under a delivery's name is a link (or a pipe, a device): never read, not even by the
    readers, which would follow it."""


def rows_of(path: Path) -> list[dict]:
    """A JSONL file's rows; none when it does not exist yet."""
    return read_jsonl(path) if path.exists() else []


def manifest(params: RetrainParams) -> list[dict]:
    return rows_of(Path(params.archive) / MANIFEST)


def pick_up(params: RetrainParams) -> tuple[list[Incoming], list[Incoming]]:
    """(new files, repeat deliveries): the inbox's files in name order, split by the manifest."""
    inbox = Path(params.inbox)
    if inbox.exists() and not inbox.is_dir():  # was read as an empty inbox, each run "nothing to do", never a delivery
        raise ConfigError(f"retrain.inbox {inbox}: a file; the inbox is the folder deliveries are put in")
    if not inbox.is_dir():  # not in git: made by the first delivery
        # a warning with the folder it resolved to: a misspelt retrain.inbox, or a worker's TQC_PROJECT_DIR naming
        # another checkout than the one deliveries go to, read as "nothing delivered" every night, deliveries waiting
        log.warning("retrain: %s (%s): no such folder, so nothing was delivered; the first delivery makes it, so where "
                    "deliveries have been made, check retrain.inbox and the checkout the flow runs in", inbox,
                    inbox.resolve())
        return [], []
    listed = sorted(inbox.iterdir())
    links = [p.name for p in listed if p.is_symlink()]
    if links:  # a link may lead to any file the flow's user can read (`delivered_bytes`); a delivery is the file itself
        log.warning("retrain: %s: links are not read (deliver the file itself, not a link to it): %s", inbox,
                    ", ".join(links))
    present = [p for p in listed if p.is_file() and not p.is_symlink() and _utf8_name(p)]
    others = [p.name for p in present if p.suffix.lower() not in SUFFIXES]
    if others:  # left in the inbox, and said each run, rather than read as some format they may not be
        log.warning("retrain: %s: not read (only %s files are): %s", inbox, ", ".join(sorted(SUFFIXES)), ", ".join(others))
    folders = [p.name for p in listed if p.is_dir() and not p.is_symlink()]
    if folders:  # a delivery unpacked into a folder would otherwise wait there unseen
        log.warning("retrain: %s: folders are not read (deliver their files into the inbox itself): %s", inbox,
                    ", ".join(folders))
    return split_repeats([incoming for p in present if p.suffix.lower() in SUFFIXES for incoming in _hashed(p)], params)


def _utf8_name(path: Path) -> bool:
    """Whether the name is UTF-8 (the manifest, the quarantine and the merged rows' sources write it as such). A name
    in another encoding (Latin-1, from a Windows share) failed the whole run, every night, naming no file; it stays in
    the inbox, said each run."""
    try:
        path.name.encode("utf-8")
    except UnicodeEncodeError:
        log.warning("retrain: %s: not read, its name is not UTF-8 (%s); rename it", path.parent, ascii(path.name))
        return False
    return True


def split_repeats(files: list[Incoming], params: RetrainParams) -> tuple[list[Incoming], list[Incoming]]:
    """(new files, repeat deliveries) of `files`, in their order: a repeat has the bytes of a file the manifest says
    added rows or classes, or of an earlier one of `files`. A file nothing was taken from (unusable, or every row
    quarantined: a label not yet in the catalog, say) may come again once its reason is fixed. So may a labeled file
    that was partly quarantined, beside a catalog file: what the quarantine's hint for a new class asks for (its rows
    merged before are quarantined then as duplicates, the rows of the new classes merge)."""
    brings_classes = any(incoming.is_catalog for incoming in files)
    seen = {entry["sha256"] for entry in manifest(params)
            if entry["outcome"] == "merged" and entry.get("accepted", 0) > 0
            and not (brings_classes and entry.get("kind") == "labeled" and entry.get("quarantined", 0) > 0)}
    new, repeats = [], []
    for incoming in files:
        (repeats if incoming.sha256 in seen else new).append(incoming)
        seen.add(incoming.sha256)
    return new, repeats


def _hashed(path: Path) -> list[Incoming]:
    """[the file, hashed], or none where it cannot be read (another user's file in a shared inbox): it stays there,
    said each run, and the other files go on."""
    try:
        return [Incoming(path, _delivered_sha256(path))]
    except OSError as exc:
        log.warning("retrain: %s: cannot be read, left in the inbox: %s", path, exc.strerror or exc)
        return []


@dataclass
class FileOutcome:
    file: str
    sha256: str
    kind: str  # labeled | catalog
    outcome: str  # merged | unusable | repeat
    read: int = 0
    accepted: int = 0
    quarantined: int = 0
    reason: str = ""


def quarantine_record(file: str, sha256: str, row: dict) -> dict:
    """One shape for every row of the retrain quarantine, whichever check rejected it: the validate contract
    (its expectations), the reader (`parse`), another file of the delivery, or the whole file (`usable_file`,
    line null). `content` is the row as read ({text, class_id}), or the raw line where it could not be read."""
    expectations = list(row.get("expectations") or [])
    return {"file": file, "sha256": sha256, "line": row.get("line"), "expectations": expectations,
            "reason": quarantine_reason(expectations, row.get("reason")), "content": row.get("content")}


def repeat_outcome(incoming: Incoming) -> FileOutcome:
    return FileOutcome(str(incoming.path), incoming.sha256, "catalog" if incoming.is_catalog else "labeled", "repeat",
                       reason="the same bytes (sha256) as a file already merged, or as an earlier file of this delivery")


def free_name(path: Path) -> Path:
    """`path`, or `stem.rolled-back-N.suffix` beside it where a file of that name was delivered during the run:
    both are kept, and the next run reads both."""
    candidate, number = path, 0
    while candidate.exists():
        number += 1
        candidate = path.with_name(name_within_limit(path.parent, f"{path.stem}.rolled-back-{number}{path.suffix}"))
    if candidate != path:
        log.warning("retrain: %s arrived during the run; the file put back from the archive is %s", path, candidate.name)
    return candidate


def archive(incoming: Incoming, outcome: FileOutcome, params: RetrainParams,
            archived: list[tuple[Path, Path, str]] | None = None) -> dict:
    """Move a processed file out of the inbox and record it; the manifest write is atomic. A failure after the move
    (the manifest's write) leaves the move in `archived`, for the commit's roll-back to undo.

    A file whose bytes are not those `outcome` judged (rows appended, or a copy still being written, since `stage`
    read it; one that changed between pick-up and reading is not judged at all) stays in the inbox: what this run read is merged, and the next run
    reads the file again, so no row is lost (those merged already are quarantined there as duplicates)."""
    digest = outcome.sha256  # of the bytes judged, which may differ from the pick-up's
    archive_dir = Path(params.archive)
    archive_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    # within the folder's limit on a name: a delivered name near it failed the move, and with it the commit
    target = archive_dir / name_within_limit(archive_dir, f"{stamp}-{digest[:12]}-{incoming.path.name}")
    changed = ("changed after it was picked up: it stays in the inbox and the next run reads it again (deliver a file "
               "under another name, e.g. .part, and rename it when it is whole)")
    if not incoming.path.exists():
        not_moved = "removed from the inbox during the run: what this run read is recorded, nothing is archived"
    elif sha256(incoming.path) != digest:
        not_moved = changed
    else:
        # Hashed again once moved: rows appended between the check above and the move would else be archived unread.
        # Recorded for the roll-back as soon as it moves, so a failure from here on (the hash, the move back) puts
        # it back in the inbox instead of leaving it in the archive unrecorded.
        moves = archived if archived is not None else []
        moves.append((incoming.path, target, digest))  # before the move: a journal holds every move a kill leaves
        shutil.move(str(incoming.path), target)
        not_moved = None if sha256(target) == digest else changed
        if not_moved:
            shutil.move(str(target), free_name(incoming.path))
            moves.pop()
    if not_moved:
        log.warning("retrain: %s %s", incoming.path, not_moved)
    entry = {**asdict(outcome), "archived_as": None if not_moved else str(target), "at": stamp,
             **({"not_archived": not_moved} if not_moved else {})}
    write_jsonl(archive_dir / MANIFEST, manifest(params) + [entry])  # atomic: a kill leaves the old manifest or the new
    return entry

