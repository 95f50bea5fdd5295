"""The retrain flow's steps, as plain functions (flows/retrain.py makes them Prefect tasks).

New labeled questions arrive as files in an inbox. A retrain:

1. `pick_up`: lists the inbox; a file that the archive manifest records, by sha256, as having
   added rows or classes is a repeat delivery and is archived as such, adding nothing. One that
   nothing was taken from (unusable, or every row quarantined) is judged again: its reason may
   have been fixed since, and rows it shares with the current data are quarantined as duplicates.
   So is a labeled file some of whose rows were quarantined, when a catalog file comes with it:
   the quarantine asks for the classes its rows lacked in just that way.
2. `stage`: copies the current additions (data/raw) into a staging folder and merges the new
   files into the copy: catalog files first (new standard questions, i.e. new classes), then
   labeled files, each judged by the validate stage's own contract against the current data
   (`tqc.incoming.check_batch`). Rejected rows go to quarantine with file, line and reason.
   Each file is read once: the bytes parsed are the bytes hashed, which `commit` archives by.
3. `train` / `judge`: the pipeline's stage functions on the staged data, then the promotion
   gate against the registry's champion. With `retrain.mode: refresh` (it serves the exemplar rule; promote.rule exemplars or auto)
   `refresh` replaces `train`: the champion's encoder, untrained, serves the grown data's
   labeled questions, and the same gate judges it.
4. `commit`: the staged additions replace data/raw atomically, `dvc add` records the new data
   version (`dvc push` when a remote is configured, tried again a few times; a push that still fails
   is left to be redone, the commit kept, and with `retrain.on_push_failure: fail` the flow fails the run once
   its challenger is judged: `push_failure`), then the inbox files move to the archive and the manifest, and
   last the challenger is marked for the gate (`PENDING_JUDGE`; an unpushed version with it, which the next run
   pushes again first: `push_pending_version`). Refused,
   changing nothing, when data/raw changed since `stage` copied it (an edit or a checkout during
   the run), which writing the copy back would undo. Until this
   step nothing outside the staging folder has changed, so a failed or killed retrain leaves
   the raw data as it was; a commit that fails is rolled back at once, and one killed midway
   from its journal when the next run starts. The champion
   alias moves only in `judge`, after a model is fully trained.

A label is never lost: a file stays in the inbox until its rows are committed. A label is
never counted twice: a repeated file is recognised by hash, and a repeated row is
quarantined as a duplicate of the current data by the validate contract.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from tqc.config import ConfigError, Params, RetrainParams, redact_text
from tqc.io import (DataFileError, atomic_directory, atomic_path, file_digest, read_json, read_jsonl, write_jsonl,
                    write_text)
from tqc.locks import exclusive
from tqc.readers import (ADDED_CATALOG, ADDED_QUESTIONS, TABLE_SUFFIXES, MissingColumns, ReaderError, RejectedRow,
                          catalog_label_key, read_catalog_rows)
from tqc.schema import Catalog, StandardQuestion

if TYPE_CHECKING:
    from tqc.pipeline import EpochHook

log = logging.getLogger(__name__)

MANIFEST = "manifest.jsonl"
SUFFIXES = TABLE_SUFFIXES
DVC = (sys.executable, "-m", "dvc")  # the dvc beside this Python, whatever PATH a worker starts with


class RetrainCommitError(RuntimeError):
    """A dvc step of the data commit failed; the commit was rolled back."""


class RetrainBusy(RuntimeError):
    pass


class JudgeFailedUnpushed(RuntimeError):
    """The gate raised in a run whose data version is not on the DVC remote either (`push_failure`): the message is
    the gate's error and that line, where the gate's alone hid the unpushed data from cron; `__cause__` is the gate's
    error. The challenger's mark keeps both for the next run (`mark_judge_pending`)."""


class PushFailed(RuntimeError):
    """A run that committed its new data version, and judged its challenger, but could not push the data to the DVC
    remote, or could not push again the version the last run left unpushed (`push_failure`'s line is the message;
    `retrain.on_push_failure: fail`). `result` is what the run did, as a run that completes returns it: the commit and
    the gate's decision stand."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result

    def __reduce__(self):  # pickled as a failed run's data: the default would call __init__ without `result`
        return type(self), (str(self), self.result)


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


def _rows(path: Path) -> list[dict]:
    """A JSONL file's rows; none when it does not exist yet."""
    return read_jsonl(path) if path.exists() else []


def manifest(params: RetrainParams) -> list[dict]:
    return _rows(Path(params.archive) / MANIFEST)


def pick_up(params: RetrainParams) -> tuple[list[Incoming], list[Incoming]]:
    """(new files, repeat deliveries): the inbox's files in name order, split by the manifest."""
    inbox = Path(params.inbox)
    if inbox.exists() and not inbox.is_dir():  # was read as an empty inbox, each run "nothing to do", never a delivery
        raise ConfigError(f"retrain.inbox {inbox}: a file; the inbox is the folder deliveries are put in")
    if not inbox.is_dir():  # not in git: made by the first delivery
        log.info("retrain: %s: no such folder yet, so nothing was delivered", inbox)
        return [], []
    listed = sorted(inbox.iterdir())
    present = [p for p in listed if p.is_file()]
    others = [p.name for p in present if p.suffix.lower() not in SUFFIXES]
    if others:  # left in the inbox, and said each run, rather than read as some format they may not be
        log.warning("retrain: %s: not read (only %s files are): %s", inbox, ", ".join(sorted(SUFFIXES)), ", ".join(others))
    folders = [p.name for p in listed if p.is_dir()]
    if folders:  # a delivery unpacked into a folder would otherwise wait there unseen
        log.warning("retrain: %s: folders are not read (deliver their files into the inbox itself): %s", inbox,
                    ", ".join(folders))
    return split_repeats([incoming for p in present if p.suffix.lower() in SUFFIXES for incoming in _hashed(p)], params)


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
        return [Incoming(path, sha256(path))]
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


@dataclass
class Staged:
    raw: Path  # the staged additions folder (labeled.jsonl, catalog.jsonl)
    outcomes: list[FileOutcome] = field(default_factory=list)
    quarantined_rows: list[dict] = field(default_factory=list)
    # each additions file's sha256 as `stage` copied it (None: there was none): `commit` refuses to write over a change
    base: dict[str, str | None] = field(default_factory=dict)

    @property
    def accepted(self) -> int:
        return sum(o.accepted for o in self.outcomes)

    @property
    def new_classes(self) -> int:
        return sum(o.accepted for o in self.outcomes if o.kind == "catalog")

    @property
    def rows_quarantined(self) -> list[dict]:
        """The quarantine's row records, an unusable file's own record (which has no line) left out."""
        return [q for q in self.quarantined_rows if q.get("line") is not None]

    @property
    def unusable(self) -> list[FileOutcome]:
        return [o for o in self.outcomes if o.outcome == "unusable"]


def stage(files: list[Incoming], params: Params, staging: Path, checking: bool = False) -> Staged:
    """Merge the new files into a staged copy of the additions; the real ones are untouched. `checking`: `tqc validate
    FILE`'s judging of a delivery in a scratch folder, which empties and archives nothing: the flow's layout
    (`additions_dir`) is not asked of it, only data.additions, the current data it judges against."""
    # first: the flow's layout refused before emptying `raw` could delete the additions
    current = merged_additions(params) if checking else additions_dir(params)
    raw = staging / "raw"
    if raw.exists():
        shutil.rmtree(raw)
    raw.mkdir(parents=True)
    for name in (ADDED_QUESTIONS, ADDED_CATALOG):
        if (current / name).exists():
            shutil.copy2(current / name, raw / name)
    staged = Staged(raw, base=_additions_digests(raw))
    read = [_read_once(incoming) for incoming in files]
    contents = {incoming.path: content for incoming, content in read}
    files = [incoming for incoming, _ in read]  # each with the sha256 of the bytes read, which it is archived by
    with _naming_kept(raw, current):
        _merge_files(files, contents, params, raw, staging, staged)
    for outcome in staged.outcomes:
        if outcome.outcome == "unusable":  # said here, in the quarantine and in the summary, not only in the manifest
            log.warning("retrain: %s is unusable: %s", outcome.file, outcome.reason)
            staged.quarantined_rows.append(quarantine_record(outcome.file, outcome.sha256, {
                "line": None, "expectations": ["usable_file"], "reason": f"unusable file: {outcome.reason}"}))
        elif outcome.kind == "labeled" and outcome.quarantined:  # a catalog file's rows are said one by one, as merged
            log.warning("retrain: %s: %d of %d row(s) quarantined to %s, %s", outcome.file, outcome.quarantined,
                        outcome.read, params.retrain.quarantine, _file_reason(outcome, staged))
    return staged


def _merge_files(files: list[Incoming], contents: dict[Path, bytes | None], params: Params, raw: Path, staging: Path,
                 staged: Staged) -> None:
    """The catalog files' classes, then the labeled files' rows, merged into the staged copy `raw`; each outcome in
    `staged`."""
    from tqc.pipeline import ingested_data

    for incoming in (f for f in files if f.is_catalog):
        staged.outcomes.append(_merge_catalog(incoming, params, raw, staged, contents[incoming.path]))
    labeled = [f for f in files if not f.is_catalog]
    if labeled:
        from tqc.incoming import CURRENT_DATA_STAGES, quiet

        # Each new file is judged against the current data (with the new classes) as ingested: the rows the training
        # run's validate stage will judge the grown set by. Its validated output lacks the rows validate quarantined,
        # so a delivered copy of a question the data holds under two labels was accepted there, then quarantined
        # unreported by training's validate. Not augmented, which would only cost time. What ingest and validate log
        # here counts the current data's rows too ("no_duplicates on train failed for 72 rows" for a clean file), so
        # it is held back, as tqc validate holds it; each file's own quarantined rows are said below.
        with quiet(*CURRENT_DATA_STAGES):
            reference = ingested_data(_with_additions(params, raw), staging / "reference")
            staged.outcomes.extend(_merge_labeled(labeled, params, raw, reference, staged, contents))


@contextmanager
def _naming_kept(copy: Path, kept: Path) -> Iterator[None]:
    """A reader's error about the staged copy of the merged questions (data.additions' files, read in `copy`) names
    them where they are kept, the file to mend, not the copy: `tqc validate FILE`'s copy is deleted by the time its
    line prints. Re-raised as the same type with the same arguments but the path: a reader's error carries more
    (MissingColumns its columns, RowsRejected each rejected row, which names its file too). Other errors, a failed
    write to the copy say, name what failed."""
    inside, kept_inside = f"{copy}{os.sep}", f"{kept}{os.sep}"  # the folder's files, not a path it is a prefix of

    def renamed(value):
        if isinstance(value, str):
            return value.replace(inside, kept_inside)
        if isinstance(value, RejectedRow):
            return replace(value, file=renamed(value.file))
        return [renamed(item) for item in value] if isinstance(value, list) else value

    try:
        yield
    except (DataFileError, ReaderError) as exc:
        if inside not in str(exc):
            raise
        kind, args, *state = exc.__reduce__()
        try:
            error = kind(*map(renamed, args))
        except TypeError:  # a constructor that does not take its own arguments back
            error = None
        if error is None:
            raise  # as it was
        if state and isinstance(state[0], dict):  # its attributes, renamed too
            error.__dict__.update({key: renamed(value) for key, value in state[0].items()})
        if hasattr(exc, "__notes__"):  # and its notes, which a __reduce__ of its own leaves out
            error.__notes__ = renamed(list(exc.__notes__))
        raise error.with_traceback(exc.__traceback__) from exc.__cause__


def _read_once(incoming: Incoming) -> tuple[Incoming, bytes | None]:
    """(the file with the sha256 of the bytes read now, those bytes): what is parsed is what is hashed, so a file
    written again since it was picked up (a copy made over it, half done as it is read) is merged as read and, since
    it no longer holds those bytes, stays in the inbox (`archive`). None where it cannot be read: the reader says why."""
    try:
        content = incoming.path.read_bytes()
    except OSError:
        return incoming, None
    digest = hashlib.sha256(content).hexdigest()
    if digest != incoming.sha256:
        log.warning("retrain: %s changed after it was picked up: merged as it reads now, and left in the inbox unless it "
                    "still reads so when archived", incoming.path)
    return Incoming(incoming.path, digest), content


def _additions_digests(folder: Path) -> dict[str, str | None]:
    return {name: sha256(folder / name) if (folder / name).exists() else None for name in (ADDED_QUESTIONS, ADDED_CATALOG)}


def additions_dir(params: Params) -> Path:
    """data.additions, where the flow merges. Not retrain.work_dir nor inside it, which each run empties (`stage`
    its staged copy `raw` first): the questions merged before, and their .dvc files, went with it. Not a check of
    Params: the flow's own staged params put data.additions there. Not retrain.inbox either, whose files are
    deliveries: labeled.jsonl was judged as one, and archived away where nothing of the delivery was accepted."""
    from tqc.config import ConfigError

    additions, work_dir = merged_additions(params).resolve(), Path(params.retrain.work_dir).resolve()
    if additions == work_dir or work_dir in additions.parents:
        raise ConfigError(f"data.additions {params.data.additions!r} is inside retrain.work_dir {params.retrain.work_dir!r}, "
                          "which each retrain empties: keep it outside")
    if additions == Path(params.retrain.inbox).resolve():
        raise ConfigError(f"data.additions {params.data.additions!r} is retrain.inbox, whose files are read as deliveries: "
                          "the merged questions would be judged and archived as one; give the inbox a folder of its own")
    return Path(params.data.additions)


def merged_additions(params: Params) -> Path:
    """data.additions, the questions the flow merged, which the current data includes."""
    from tqc.config import ConfigError

    if not params.data.additions:
        raise ConfigError("the retrain flow merges into data.additions, which is not set in params.yaml")
    return Path(params.data.additions)


def _with_additions(params: Params, raw: Path) -> Params:
    return params.with_overrides({"data": {"additions": str(raw)}})


def _merge_catalog(incoming: Incoming, params: Params, raw: Path, staged: Staged, content: bytes | None) -> FileOutcome:
    """New classes from a catalog file. A row without text, or whose text is another class's, makes the
    file unusable here, by file and line: merged, it would fail the validate contract on every retrain."""
    from tqc.text import normalise

    outcome = FileOutcome(str(incoming.path), incoming.sha256, "catalog", "merged")
    staged_rows = _rows(raw / ADDED_CATALOG)
    current = [(q.class_id, q.text) for q in _base_catalog(params).questions] + [(r["class_id"], r["text"]) for r in staged_rows]
    try:
        rows = read_catalog_rows(incoming.path, params.data.custom.catalog_id_column, params.data.custom.catalog_text_column,
                                 taken={normalise(text): class_id for class_id, text in current}, content=content)
    except (ReaderError, ValueError) as exc:
        outcome.outcome, outcome.reason = "unusable", str(exc)
        if isinstance(exc, MissingColumns):  # labeled questions, say, in a file whose name made it a catalog
            outcome.reason += (f" (a file whose name begins with 'catalog' is read as a catalog: columns "
                               f"{params.data.custom.catalog_id_column!r}, {params.data.custom.catalog_text_column!r}; "
                               "labeled questions go in a file named otherwise)")
        return outcome
    added, line_of = [q for q, _ in rows], {q.class_id: line for q, line in rows}
    known = dict(current)
    new, alike = _new_and_alike([q for q in added if q.class_id not in known], list(known))
    # A class the catalog has keeps its standard question: a delivery adds classes. A row repeating it (a whole catalog
    # delivered again) changes nothing; one giving it another text is quarantined, row by row, so it is not lost unsaid
    kept = [q for q in added if q.class_id in known and normalise(q.text) != normalise(known[q.class_id])]
    outcome.read, outcome.accepted, outcome.quarantined = len(added), len(new), len(kept) + len(alike)
    repeated = len(added) - len(new) - len(kept) - len(alike)
    outcome.reason = "; ".join(([f"{repeated} known class(es) as the catalog has them"] if repeated else []) +
                               ([f"{len(kept)} known class(es) with another text kept theirs (quarantined)"] if kept else []) +
                               ([f"{len(alike)} new class id(s) alike but for case or width to another (quarantined)"]
                                if alike else []))
    for q, twin in alike:
        log.warning("%s, line %s: class %r is alike but for case or width to class %r; quarantined", incoming.path,
                    line_of[q.class_id], q.class_id, twin)
    staged.quarantined_rows.extend(quarantine_record(str(incoming.path), incoming.sha256, {
        "line": line_of[q.class_id], "expectations": ["new_class"],
        "reason": f"class {q.class_id!r} is alike but for case or width to class {twin!r}: one class written two ways, "
                  "or two? a label written either way would then match neither; give a new class an id of its own",
        "content": {"class_id": q.class_id, "text": q.text}}) for q, twin in alike)
    for q in kept:  # said in the run's log too: the manifest's count alone reads like a success
        log.warning("%s, line %s: class %r already has the standard question %r; this row's %r is quarantined (a "
                    "delivery adds classes; edit data/raw/catalog.jsonl or the dataset's catalog to change one)",
                    incoming.path, line_of[q.class_id], q.class_id, known[q.class_id], q.text)
    staged.quarantined_rows.extend(quarantine_record(str(incoming.path), incoming.sha256, {
        "line": line_of[q.class_id], "expectations": ["new_class"],
        "reason": f"class {q.class_id!r} already has the standard question {known[q.class_id]!r}; a delivery adds "
                  "classes, it does not change one's text", "content": {"class_id": q.class_id, "text": q.text}})
        for q in kept)
    if new:
        write_jsonl(raw / ADDED_CATALOG, staged_rows + [asdict(q) for q in new])
    return outcome


def _new_and_alike(candidates: list[StandardQuestion], known_ids: list[str]) -> tuple[list, list]:
    """(the new classes, [(a class, the known or earlier new id it is alike)]): an id alike another but for case or
    width (`catalog_label_key`, as labels are matched to ids) is no new class. Merged, `hum` beside `HUM` left every
    label written either way matching neither, quarantined with a hint naming one of them."""
    first = {catalog_label_key(class_id): class_id for class_id in reversed(known_ids)}
    new, alike = [], []
    for question in candidates:
        twin = first.setdefault(catalog_label_key(question.class_id), question.class_id)
        if twin == question.class_id:
            new.append(question)
        else:
            alike.append((question, twin))
    return new, alike


def _base_catalog(params: Params) -> Catalog:
    from tqc.readers import read_dataset

    return read_dataset(params.data.model_copy(update={"additions": None})).catalog


def _merge_labeled(files: list[Incoming], params: Params, raw: Path, against: Path, staged: Staged,
                   contents: dict[Path, bytes | None]) -> list[FileOutcome]:
    """Each file judged by the validate contract against the current data; then the delivery's files against each
    other, as validate compares the rows of one file: of a question that several files carry with one label the
    first copy is kept, and with two labels every copy is quarantined, since nothing says which label is right."""
    from tqc.incoming import check_batch, load_reference
    from tqc.stages.validate import ValidationFailed

    reference = load_reference(against)  # read once for the delivery, not once a file; nothing below writes it
    reports = {}  # file → check_batch's report, or the exception that made it unusable
    for incoming in files:
        try:
            reports[incoming] = check_batch(incoming.path, reference, params, contents[incoming.path])
        except (ReaderError, ValidationFailed) as exc:
            reports[incoming] = exc
    copies = defaultdict(list)  # normalised text → [(file name, line, label)] over the delivery, in file order
    for incoming, report in reports.items():
        for row in [] if isinstance(report, Exception) else report["accepted"]:
            copies[_text_key(row)].append((incoming.path.name, _line(row), row["class_id"]))
        # a file's own conflicting copies, quarantined there, still conflict with another file's: validate over
        # the delivery as one file would quarantine them all
        for row in [] if isinstance(report, Exception) else report["quarantined"]:
            if "no_label_conflicts" in row["expectations"] and isinstance(row.get("content"), dict):
                copies[_text_key(row["content"])].append((incoming.path.name, row["line"], row["content"]["class_id"]))
    return [FileOutcome(str(incoming.path), incoming.sha256, "labeled", "unusable", reason=str(report))
            if isinstance(report, Exception) else _merge_checked(incoming, report, copies, raw, staged)
            for incoming, report in reports.items()]


def _merge_checked(incoming: Incoming, report: dict, copies: dict[str, list[tuple[str, int, str]]], raw: Path,
                   staged: Staged) -> FileOutcome:
    """One file's rows that `check_batch` accepted, less those the delivery's other files rule out."""
    new_rows, quarantined = [], list(report["quarantined"])
    for row in report["accepted"]:
        here = (incoming.path.name, _line(row), row["class_id"])
        rejected = _cross_file_reason(here, copies[_text_key(row)])
        if rejected:
            quarantined.append({"line": here[1], "expectations": [rejected[0]], "reason": rejected[1],
                                "content": {"text": row["text"], "class_id": row["class_id"]}})
        else:
            new_rows.append({"text": row["text"], "class_id": row["class_id"], "source": f"{here[0]}:{here[1]}"})
    if new_rows:  # an empty file would be no rows to ingest's reader, but an empty file: refused
        write_jsonl(raw / ADDED_QUESTIONS, _rows(raw / ADDED_QUESTIONS) + new_rows)
    staged.quarantined_rows.extend(quarantine_record(str(incoming.path), incoming.sha256, q) for q in quarantined)
    return FileOutcome(str(incoming.path), incoming.sha256, "labeled", "merged", read=report["read"],
                       accepted=len(new_rows), quarantined=len(quarantined))


def _cross_file_reason(here: tuple[str, int, str], copies: list[tuple[str, int, str]]) -> tuple[str, str] | None:
    """(validate's expectation, reason) that quarantine a row for its copies in the delivery's files (its own
    among them); None to keep it."""
    other_label = next((c for c in copies if c[2] != here[2]), None)
    if other_label:
        return ("no_label_conflicts", f"conflicts with {other_label[0]}, line {other_label[1]}, labeled "
                                      f"{other_label[2]!r} (every copy quarantined)")
    if copies[0] != here:
        return "no_duplicates", f"duplicate of {copies[0][0]}, line {copies[0][1]}"
    return None


def quarantine_record(file: str, sha256: str, row: dict) -> dict:
    """One shape for every row of the retrain quarantine, whichever check rejected it: the validate contract
    (its expectations), the reader (`parse`), another file of the delivery, or the whole file (`usable_file`,
    line null). `content` is the row as read ({text, class_id}), or the raw line where it could not be read."""
    expectations = list(row.get("expectations") or [])
    return {"file": file, "sha256": sha256, "line": row.get("line"), "expectations": expectations,
            "reason": row.get("reason") or ", ".join(expectations), "content": row.get("content")}


def _text_key(row: dict) -> str:
    from tqc.text import compared_text

    return compared_text(row["text"])  # as the validate contract compares questions (case, spacing)


def _line(row: dict) -> int:
    return int(row["source"].rsplit(":", 1)[1])


@dataclass(frozen=True)
class Trained:
    data: Path  # the staged validated data
    model: Path  # the stage-two model
    prior: Path | None  # its class-prior shift (the prior stage's file); None for a refresh
    validation_macro_f1: float | None  # stage two's best; None for a refresh, which trains nothing
    refreshed_from: Champion | None = None  # a refresh: the champion whose encoder it serves


# In work_dir, written by the commit as its last change (inside its journal, so a roll-back removes it): the
# challenger trained on the grown data still awaits the gate. A judge that failed (its retries spent, the registry
# down) or a run killed before it leaves the file, and the next run judges that challenger first: its inbox files are
# archived, so nothing else would ever bring the grown data before the gate (on a first delivery, no champion would
# ever exist).
PENDING_JUDGE = "judge-pending.json"


def pending_judge_path(params: RetrainParams) -> Path:
    """The challenger's mark (`PENDING_JUDGE`) in the retrain's work folder."""
    return Path(params.work_dir) / PENDING_JUDGE


def mark_judge_pending(params: RetrainParams, trained: Trained, dvc: dict | None = None) -> None:
    """Mark `trained` for the gate; with `dvc` (`_dvc_record`'s result) where its push failed, the mark also records
    that data version as unpushed, which the next run pushes again (`push_pending_version`)."""
    unpushed = ({"unpushed": {"added": dvc["added"], "push_failed": dvc["push_failed"]}}
                if dvc and dvc.get("push_failed") else {})
    _write_pending(params, {**asdict(trained), **unpushed})  # asdict takes the champion of a refresh along


def _write_pending(params: RetrainParams, record: dict) -> None:
    write_text(pending_judge_path(params), json.dumps(record, default=str, indent=2) + "\n")  # paths as text


def _pending_record(params: RetrainParams) -> dict | None:
    path = pending_judge_path(params)
    return read_json(path) if path.exists() else None


def pending_judge(params: RetrainParams) -> Trained | None:
    """The committed challenger the last run did not judge, or None."""
    path = pending_judge_path(params)
    record = _pending_record(params)
    if record is None:
        return None
    record.pop("unpushed", None)  # push_pending_version's
    champion = record.pop("refreshed_from")
    trained = Trained(**{**record, "data": Path(record["data"]), "model": Path(record["model"]),
                         "prior": Path(record["prior"]) if record["prior"] else None},
                      refreshed_from=Champion(**{**champion, "model": Path(champion["model"])}) if champion else None)
    missing = [str(folder) for folder in (trained.data, trained.model) if not folder.exists()]
    if missing:
        raise RetrainCommitError(f"{path}: the last run committed its data but did not judge its challenger, and "
                                 f"{', '.join(missing)} is gone; retrain the current data (dvc repro, then tqc promote) "
                                 f"and delete {path}")
    return trained


def clear_pending_judge(params: RetrainParams) -> None:
    pending_judge_path(params).unlink(missing_ok=True)


def push_pending_version(params: RetrainParams) -> dict | None:
    """Push again the data version whose push failed in the run that committed it and whose challenger still awaits
    the gate (the mark records it): its .dvc files name it still, since a retrain commits nothing until that challenger
    is judged (a change made to them by hand since is what gets pushed). `{"added", "pushed": True}` and the mark's
    record dropped; `pushed` false with `push_failed` where it fails again (the mark keeps it); None where nothing waits
    (or retrain.push is off)."""
    record = _pending_record(params)
    unpushed = (record or {}).get("unpushed")
    if not unpushed or not params.push:
        return None
    failure = _push(unpushed["added"])
    if failure is not None:
        log.warning("retrain: the data version the last run committed (%s) is still not on the DVC remote: %s",
                    ", ".join(unpushed["added"]), failure)
        return {"added": unpushed["added"], "pushed": False, "push_failed": failure}
    _write_pending(params, {key: value for key, value in record.items() if key != "unpushed"})
    log.info("retrain: the data version the last run committed but could not push (%s) is on the DVC remote now",
             ", ".join(unpushed["added"]))
    return {"added": unpushed["added"], "pushed": True}


def train(params: Params, staged: Staged, staging: Path, on_epoch: EpochHook | None = None) -> Trained:
    """The pipeline's own stage functions on the staged data (ingest → … → stage two → prior); `on_epoch` sees each
    training stage's epochs (the flow's MLflow run logs them)."""
    from tqc.mining import check_faiss_for
    from tqc.pipeline import prepare_data, train_chain
    from tqc.stages import prior

    check_faiss_for(params.model.similarity)
    staged_params = _with_additions(params, staged.raw)
    data = prepare_data(staged_params, staging / "data")
    outputs = train_chain(staged_params, data.directory, data.train, staging / "models", staged_params.seed, with_nc=False,
                          on_epoch=on_epoch)
    prior_path = staging / "models" / "prior.json"
    prior.run(data.directory, outputs.stage_one, outputs.stage_two, None, staged_params, prior_path)
    return Trained(data.directory, outputs.stage_two, prior_path, outputs.fits["stage_two"].best_validation_macro_f1)


class RefreshError(RuntimeError):
    """A refresh that cannot start (no champion): permanent, so the flow does not retry it."""


@dataclass(frozen=True)
class Champion:
    version: str
    model: Path  # its model folder, downloaded
    rule: str  # standard | exemplars (the version's `rule` tag)
    exemplar_k: int | None  # what the exemplar rule served with; None for the standard rule


def refresh(params: Params, staged: Staged, staging: Path) -> Trained:
    """The exemplar rule's light path (`retrain.mode: refresh`): no training. The champion's encoder, as
    registered, with the staged data's validated labeled questions as its exemplars; the gate then judges
    that version against the champion on the grown validation split like any challenger."""
    from tqc.pipeline import validated_data

    champion = champion_model(params.promote.model_name, params.promote.alias, staging / "champion")  # first: it may not exist
    if champion.rule != "exemplars" or champion.exemplar_k != params.evaluate.exemplar_k:
        from tqc.promotion import refresh_changes_rule

        must_win = refresh_changes_rule(params.promote.rule, champion.rule)  # promote's bound for it
        log.warning("retrain: refresh: %s v%s serves the %s rule%s; this refresh serves the exemplar rule with k = %d, "
                    "so the gate also judges that change%s", params.promote.model_name, champion.version, champion.rule,
                    f" with k = {champion.exemplar_k}" if champion.exemplar_k else "", params.evaluate.exemplar_k,
                    f" (promote.rule {params.promote.rule}: a change of rule must win, by promote.min_improvement)"
                    if must_win else "")
    data = validated_data(_with_additions(params, staged.raw), staging / "data")
    log.info("retrain: refresh: the encoder of %s v%s with %s's labeled questions as exemplars, no training",
             params.promote.model_name, champion.version, data / "train.jsonl")
    return Trained(data, champion.model, None, None, refreshed_from=champion)


def champion_model(model_name: str, alias: str, destination: Path) -> Champion:
    """The registry's `alias` version, its model folder downloaded to `destination`."""
    import mlflow

    from tqc.serving import alias_version, registered_artifacts

    version = alias_version(mlflow.MlflowClient(), model_name, alias)
    if version is None:
        raise RefreshError(f"retrain.mode refresh: the registry ({redact_text(mlflow.get_tracking_uri())}) has no {model_name}@{alias} "
                           "to refresh; train one first (retrain.mode: train, or dvc repro)")
    if destination.exists():
        shutil.rmtree(destination)
    artifacts, config = registered_artifacts(model_name, str(version.version), destination)
    return Champion(str(version.version), artifacts["model"], version.tags.get("rule", "standard"),
                    int(config["exemplar_k"]) if "exemplar_k" in config else None)


def tag_refresh(model_name: str, version: str, champion_version: str) -> None:
    """Say in the registry that `version` is a refresh (no training) of `champion_version`'s encoder.

    Nothing when `version` is that champion (the refresh changed nothing it serves) or already says where it
    came from: so a retried judge, which finds its version registered, still tags it, and never re-tags an older one."""
    import mlflow

    client = mlflow.MlflowClient()
    if version == champion_version or "refreshed_from" in client.get_model_version(model_name, version).tags:
        return
    client.set_model_version_tag(model_name, version, "refreshed_from", champion_version)


def commit(params: Params, staged: Staged, files: list[Incoming], repeats: list[Incoming],
           challenger: Trained | None = None) -> dict:
    """The commit point: staged additions → data/raw (atomic), dvc add (+ push), the quarantine, then archive, then
    `challenger` (the model trained on the staged data) marked as awaiting the gate (`PENDING_JUDGE`).

    All or nothing: when a step fails (dvc add, a full disk while archiving), data/raw with its .dvc files
    (and their git index entries), the quarantine and the manifest are put back as they were, archived files
    return to the inbox and no challenger is pending, so the next run sees exactly what this one saw. The mark is the
    commit's last change, made before its journal closes: a commit that completed always leaves its challenger to be
    judged, even when the run is killed the moment after, and one killed before is rolled back with its mark. A dvc
    push that fails after its retries is no failure of the commit (`_dvc_record`): the data is in the DVC cache, and
    the push is left to be redone.
    """
    raw = additions_dir(params)
    raw.mkdir(parents=True, exist_ok=True)
    names = _names_to_commit(raw, staged)
    committed = [raw / name for name in names]
    dvc_written = [*(Path(f"{p}.dvc") for p in committed), raw / ".gitignore"]  # what dvc add writes beside the data
    before = _as_they_are(_touched_by_commit(params.retrain, committed, dvc_written, marks=challenger is not None))
    with _journaled(journal_dir(params.retrain), before, dvc_written) as moves:
        _replace_data(staged.raw, committed)
        dvc = _dvc_record(committed, params.retrain.push)
        if staged.quarantined_rows:
            _quarantine(Path(params.retrain.quarantine), staged.quarantined_rows)
        entries = _archive_delivered(staged, files, repeats, params.retrain, moves)
        if challenger is not None:
            mark_judge_pending(params.retrain, challenger, dvc)
    return {"committed": [str(p) for p in committed], "dvc": dvc, "archived": entries}


@contextmanager
def _journaled(directory: Path, before: dict[Path, bytes | None], dvc_written: list[Path]) -> Iterator[JournaledMoves]:
    """The changes made inside, all or nothing: the journal is written before anything changes, and a failure rolls
    them back. A commit killed midway runs no except clause, and the next run rolls it back from the journal
    (`roll_back_interrupted_commit`) before it judges or picks anything up. → the moves, for `archive` to record."""
    journal = CommitJournal.begin(directory, before, dvc_written)
    try:
        yield journal.moves  # (inbox path, archived as, sha256), to move back; each one journaled before it is made
    except BaseException:
        journal.roll_back()  # if this fails too, the journal stays for the next run
        raise
    journal.close()


def _names_to_commit(raw: Path, staged: Staged) -> list[str]:
    """The staged additions' names to write over data/raw's, refused where data/raw changed since it was staged.
    Nothing accepted (repeats only, or every row quarantined): the data stays as it is. The staging folder may then
    hold anything, a failed earlier run's rows say, and must not be copied."""
    names = [name for name in (ADDED_QUESTIONS, ADDED_CATALOG) if staged.accepted and (staged.raw / name).exists()]
    if names:
        _require_unchanged_since_staged(raw, staged)
    return names


def _touched_by_commit(params: RetrainParams, committed: list[Path], dvc_written: list[Path], marks: bool) -> list[Path]:
    """What a commit may change, in the order its journal restores them: the manifest first, so that a roll-back
    stopped by a full disk after it leaves no file recorded as merged whose rows are not in the data (the next run
    would take it for a repeat)."""
    touched = [Path(params.archive) / MANIFEST, *committed, *dvc_written, Path(params.quarantine)]
    if marks:  # the journal keeps the mark's absence: a roll-back removes it
        touched.append(pending_judge_path(params))
    return touched


def _as_they_are(paths: list[Path]) -> dict[Path, bytes | None]:
    """Each file's bytes, or None where there is none."""
    return {path: path.read_bytes() if path.exists() else None for path in paths}


def _replace_data(staged_raw: Path, committed: list[Path]) -> None:
    """Each of data/raw's `committed` files replaced, atomically, by its staged copy of the same name."""
    for path in committed:
        with atomic_path(path) as tmp:
            shutil.copy2(staged_raw / path.name, tmp)


def _archive_delivered(staged: Staged, files: list[Incoming], repeats: list[Incoming], params: RetrainParams,
                       archived: list[tuple[Path, Path, str]]) -> list[dict]:
    """Archive the files `staged` judged, then the repeats; each move recorded in `archived` for the roll-back."""
    by_file = {o.file: o for o in staged.outcomes}
    entries = [archive(f, by_file[str(f.path)], params, archived) for f in files]
    return entries + [archive(f, repeat_outcome(f), params, archived) for f in repeats]


def _require_unchanged_since_staged(raw: Path, staged: Staged) -> None:
    """Refuse to write the staged additions over a data/raw that changed during the run (a label fixed by hand, a
    `dvc checkout`): the staged copy holds the old version, and writing it back would undo that change unsaid."""
    if not staged.base:  # a Staged made by hand, with nothing copied to compare
        return
    now = _additions_digests(raw)
    changed = [str(raw / name) for name, digest in staged.base.items() if now.get(name) != digest]
    if changed:
        raise RetrainCommitError(f"{', '.join(changed)} changed during this run (edited, or checked out): nothing is "
                                 "committed, so that change stands; the delivered files stay in the inbox, and the "
                                 "next run merges them into the data as it is then")


def journal_dir(params: RetrainParams) -> Path:
    return Path(params.work_dir) / "commit-journal"


class JournaledMoves(list):
    """The commit's archive moves, (inbox path, archived as, the file's sha256); each appended to the journal's file,
    flushed to disk, before `archive` makes it."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def append(self, move: tuple[Path, Path, str]) -> None:
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps({"inbox": str(move[0]), "archived_as": str(move[1]), "sha256": move[2]}) + "\n")
            file.flush()
            os.fsync(file.fileno())
        super().append(move)


@dataclass
class CommitJournal:
    """What a commit changes, as it was before: each file's bytes (or that it did not exist), the .dvc files
    `dvc add` writes, and the archive moves as they are made. It exists from the commit's first change until
    its last (or its roll-back) is done."""

    directory: Path
    before: dict[Path, bytes | None]
    dvc_written: list[Path]
    moves: JournaledMoves

    @classmethod
    def begin(cls, directory: Path, before: dict[Path, bytes | None], dvc_written: list[Path]) -> "CommitJournal":
        if directory.exists():  # a journal the next run has not rolled back yet: never overwritten
            raise RetrainCommitError(f"{directory}: an interrupted commit's journal is still there; "
                                     "roll_back_interrupted_commit must put its changes back first")
        with atomic_directory(directory) as staging:  # whole or not at all: a kill while writing it changed nothing
            files = []
            for number, (path, content) in enumerate(before.items()):
                if content is not None:
                    (staging / f"before-{number}").write_bytes(content)
                files.append({"path": str(path), "before": None if content is None else f"before-{number}"})
            (staging / "journal.json").write_text(json.dumps({"files": files, "dvc_written": list(map(str, dvc_written))}))
        return cls(directory, before, dvc_written, JournaledMoves(directory / "moves.jsonl"))

    @classmethod
    def found(cls, directory: Path) -> "CommitJournal | None":
        if not (directory / "journal.json").exists():
            return None
        recorded = json.loads((directory / "journal.json").read_text())
        before = {Path(f["path"]): None if f["before"] is None else (directory / f["before"]).read_bytes()
                  for f in recorded["files"]}
        moves = JournaledMoves(directory / "moves.jsonl")
        lines = (directory / "moves.jsonl").read_text(encoding="utf-8").splitlines() if moves.path.exists() else []
        for line in lines:
            try:
                move = json.loads(line)
            except json.JSONDecodeError:  # cut by the kill while it was written: that move was not made yet
                continue
            # a journal written before moves carried their sha256: None, and the roll-back moves the file back
            list.append(moves, (Path(move["inbox"]), Path(move["archived_as"]), move.get("sha256")))
        return cls(directory, before, [Path(p) for p in recorded["dvc_written"]], moves)

    def roll_back(self) -> None:
        """Put back what the commit changed, then close: the journal stays while the roll-back is not done."""
        _roll_back(self.before, self.moves, self.dvc_written)
        self.close()

    def close(self) -> None:
        """Gone at once (renamed, then deleted): a kill while deleting it leaves a folder `found` and `begin` do
        not mistake for a journal, not half of one."""
        closed = self.directory.with_name(f"{self.directory.name}.closed")
        shutil.rmtree(closed, ignore_errors=True)
        self.directory.rename(closed)
        shutil.rmtree(closed)


def roll_back_interrupted_commit(params: RetrainParams) -> bool:
    """Put back what a commit killed midway (SIGKILL, a cancelled flow run, a lost worker) changed, from its journal:
    the data, its .dvc files, the quarantine and the manifest as they were, its files back in the inbox. Else the
    next run would judge the delivered rows against themselves, quarantine them as duplicates and archive their
    files, and no challenger pending for the gate (its data is no longer committed). True when there was one. Call it
    under the retrain lock, before `pending_judge` and `pick_up`."""
    journal = CommitJournal.found(journal_dir(params))
    if journal is None:
        return False
    log.warning("retrain: %s: a commit was interrupted (the process was killed); putting back what it changed",
                journal.directory)
    journal.roll_back()
    return True


def repeat_outcome(incoming: Incoming) -> FileOutcome:
    return FileOutcome(str(incoming.path), incoming.sha256, "catalog" if incoming.is_catalog else "labeled", "repeat",
                       reason="already processed (same sha256)")


def _roll_back(before: dict[Path, bytes | None], archived: list[tuple[Path, Path, str]], dvc_files: list[Path]) -> None:
    for inbox_path, archived_as, digest in reversed(archived):
        if not archived_as.exists():  # the move was journaled and then not made, or already undone
            continue
        if digest and inbox_path.exists() and sha256(inbox_path) == digest:  # a copy to another disk cut short: it stayed
            archived_as.unlink()
        else:
            shutil.move(str(archived_as), _free_name(inbox_path))
    for path, content in before.items():
        if content is None:
            path.unlink(missing_ok=True)
        else:
            with atomic_path(path) as tmp:
                tmp.write_bytes(content)
    _restage(dvc_files)
    log.error("retrain: the commit failed; the data, its .dvc files, the quarantine, the manifest and the inbox are "
              "as they were")


def _free_name(path: Path) -> Path:
    """`path`, or `stem.rolled-back-N.suffix` beside it where a file of that name was delivered during the run:
    both are kept, and the next run reads both."""
    candidate, number = path, 0
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.stem}.rolled-back-{number}{path.suffix}")
    if candidate != path:
        log.warning("retrain: %s arrived during the run; the file put back from the archive is %s", path, candidate.name)
    return candidate


def _restage(paths: list[Path]) -> None:
    """DVC's autostage git-added what `dvc add` wrote: the index follows the files put back."""
    from dvc.config import Config
    from dvc.exceptions import DvcException

    try:
        if not Config.from_cwd()["core"].get("autostage"):
            return
    except DvcException:  # an unreadable config: `dvc add` could not have staged anything either
        return
    present, absent = [str(p) for p in paths if p.exists()], [str(p) for p in paths if not p.exists()]
    if present:
        subprocess.run(["git", "add", "--", *present], capture_output=True)
    if absent:
        subprocess.run(["git", "rm", "-q", "--cached", "--ignore-unmatch", "--", *absent], capture_output=True)


def archive(incoming: Incoming, outcome: FileOutcome, params: RetrainParams,
            archived: list[tuple[Path, Path, str]] | None = None) -> dict:
    """Move a processed file out of the inbox and record it; the manifest write is atomic. A failure after the move
    (the manifest's write) leaves the move in `archived`, for the commit's roll-back to undo.

    A file whose bytes are not those `outcome` judged (`stage` reads each file once: rows appended during the run,
    or a copy still being written, then or since) stays in the inbox: what this run read is merged, and the next run
    reads the file again, so no row is lost (those merged already are quarantined there as duplicates)."""
    digest = outcome.sha256  # of the bytes judged, which may differ from the pick-up's
    archive_dir = Path(params.archive)
    archive_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = archive_dir / f"{stamp}-{digest[:12]}-{incoming.path.name}"
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
            shutil.move(str(target), _free_name(incoming.path))
            moves.pop()
    if not_moved:
        log.warning("retrain: %s %s", incoming.path, not_moved)
    entry = {**asdict(outcome), "archived_as": None if not_moved else str(target), "at": stamp,
             **({"not_archived": not_moved} if not_moved else {})}
    write_jsonl(archive_dir / MANIFEST, manifest(params) + [entry])  # atomic: a kill leaves the old manifest or the new
    return entry


def _quarantine(path: Path, rows: list[dict]) -> None:
    """Append the rows the quarantine lacks: a file delivered again with nothing taken from it (its reason not yet
    fixed) is judged again to the same rows, which one copy records."""
    existing = _rows(path)
    recorded = {json.dumps(row, sort_keys=True) for row in existing}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(path, existing + [row for row in rows if json.dumps(row, sort_keys=True) not in recorded])


def _dvc_record(paths: list[Path], push: bool) -> dict:
    """`dvc add` the additions (the new data version); `dvc push` them when a remote exists, tried again a few times
    (`_push`). A push that still fails leaves the version committed, `pushed` false and `push_failed` its reason."""
    if not paths:
        return {"added": [], "pushed": False}
    if not _in_dvc_repo():
        log.warning("retrain: not inside a DVC repository; %s not versioned", ", ".join(map(str, paths)))
        return {"added": [], "pushed": False}
    pushing = push and _has_default_remote()  # before the add: a push bound to fail refuses the commit first
    _dvc("add", *map(str, paths))
    added = [f"{p}.dvc" for p in paths]
    failure = _push(added) if pushing else None
    if failure is None:
        return {"added": added, "pushed": pushing}
    log.warning("retrain: %s, %d tries; the new data version is recorded in this checkout and its DVC cache but is not "
                "on the remote: push it by hand with `%s` before another retrain changes those files (a later "
                "retrain pushes its own version, not this one)", failure, len(PUSH_RETRY_WAITS) + 1, _push_command(added))
    return {"added": added, "pushed": False, "push_failed": failure}


# Seconds between `dvc push` tries: a network blip passes in these ~20 s; an outage longer than that leaves the commit
# made and the push to be redone, rather than throwing the run's training away with a roll-back
PUSH_RETRY_WAITS = (5.0, 15.0)


def _push(dvc_files: list[str]) -> str | None:
    """`dvc push` the new data version, tried again after each of PUSH_RETRY_WAITS; None once pushed, else the last
    failure's line. The data is in the DVC cache already (the add), so a push that never got through loses nothing."""
    waits = iter(PUSH_RETRY_WAITS)
    while True:
        try:
            _dvc("push", *dvc_files)
            return None
        except RetrainCommitError as error:
            wait = next(waits, None)
            if wait is None:
                return str(error)
            log.warning("retrain: %s; trying again in %g s", error, wait)
            time.sleep(wait)


def _dvc(command: str, *arguments: str) -> str:
    """One dvc command's output; a failure is one line with DVC's own reason (its last error line), not an exit status.
    It waits for DVC's lock where another dvc command holds it (a `dvc status`, an editor's DVC extension, a `dvc repro`
    in this checkout): DVC's own 3 s and a failure would throw this run's training away. The lock is the OS's, so a
    holder that dies frees it."""
    done = subprocess.run([*DVC, "--wait-for-lock", command, *arguments], capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "no output")
        raise RetrainCommitError(f"dvc {command} failed (exit {done.returncode}): {reason}")
    return done.stdout


# The two checks below, and _restage's, read DVC's files in this process, as `dvc root`, `dvc remote list` and `dvc
# config` would: a dvc process for each took about a second of every data commit. `dvc add` and `dvc push`, which do
# the work, stay processes.
def _in_dvc_repo() -> bool:
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        Repo.find_root()
    except NotDvcRepoError:
        return False
    return True


def _has_default_remote() -> bool:
    """Whether `dvc push` has a remote to send to; False where no remote is named at any of DVC's config levels
    (system, global, project, local). Remotes with none of them the default: `dvc push` would stop on "no remote
    specified" once the data is added, so the commit is refused here, saying how to choose one."""
    from dvc.config import Config
    from dvc.exceptions import DvcException

    try:
        config = Config.from_cwd()
    except DvcException as error:  # an unreadable config: one line, as _dvc says a failed command
        raise RetrainCommitError(f"dvc remote list failed: {error}") from None
    remotes = sorted(config["remote"])
    if remotes and not config["core"].get("remote"):
        raise RetrainCommitError(f"retrain.push is true and DVC names remote(s) {', '.join(remotes)} but no default one, "
                                 "so dvc push would not know where to send the data: make one the default with "
                                 "`dvc remote default NAME`, or set retrain.push: false")
    return bool(remotes)


def why_nothing_was_accepted(staged: Staged, repeats: list[Incoming], quarantine: Path) -> str:
    """One line for the log: repeats, unusable files, and quarantined rows with the first one's line and reason."""
    parts = [f"{len(repeats)} repeat(s)"] if repeats else []
    unusable = staged.unusable
    parts += [f"{len(unusable)} unusable file(s)"] if unusable else []
    rows = staged.rows_quarantined
    if rows:
        first = rows[0]
        parts.append(f"{len(rows)} row(s) quarantined to {quarantine}, e.g. {first['file']}, line {first['line']}: "
                     f"{first['reason']}")
    # otherwise, e.g. a catalog file that repeats known classes as the catalog has them: each file's own account
    return "; ".join(parts or [f"{Path(o.file).name}: {o.reason or 'added nothing'}" for o in staged.outcomes])


def _push_command(versions: list[str]) -> str:
    """The command that pushes a data version whose push failed: its .dvc files, as every message about it gives it."""
    return f"dvc push {' '.join(versions)}"


def closing_line(staged: Staged, promotion: dict, committed: dict, quarantine: Path) -> str:
    """The flow's last log line after a training: what was added and quarantined, the gate's decision with its reasons,
    and the data version's .dvc files, which no commit records until a person commits them."""
    rows, unusable = staged.rows_quarantined, staged.unusable
    left_out = ([f"{len(rows)} row(s) quarantined to {quarantine}"] if rows else []) + (
        [f"{len(unusable)} unusable file(s)"] if unusable else [])
    line = (f"retrain: {staged.accepted - staged.new_classes} rows and {staged.new_classes} classes added"
            + (f" ({'; '.join(left_out)})" if left_out else "")
            + f"; {'promoted' if promotion['promoted'] else 'champion kept'}: {'; '.join(promotion['reasons'])}")
    versions = committed.get("dvc", {}).get("added") or []
    if versions:
        line += (f". New data version: {', '.join(versions)}; commit it to git: until then no commit records it, and "
                 "`dvc exp run` unstages it")
    if committed.get("dvc", {}).get("push_failed"):
        line += f"; not on the DVC remote (the push failed): `{_push_command(versions)}`"
    return line


def push_failure(result: dict) -> str | None:
    """One line for a run whose new data version is committed but not on the DVC remote (`_dvc_record`'s
    `push_failed`), or whose push of the last run's unpushed version failed again (`pending_dvc`,
    `push_pending_version`'s) and which committed no newer one (a newer one holds its rows, and its own push is what
    this run says): what stands, DVC's reason and the command that pushes it; None when no push failed."""
    dvc, pending = result.get("dvc", {}), result.get("pending_dvc", {})
    if dvc.get("push_failed"):
        judged = (f" and its challenger {'promoted' if result['promoted'] else 'judged (champion kept)'}"
                  if "promoted" in result else "")
        return _unpushed_line(f"the new data version ({', '.join(dvc['added'])}) is committed{judged}, but it is not",
                              dvc)
    if pending.get("push_failed") and not dvc.get("added"):
        return _unpushed_line(f"the data version the last run committed ({', '.join(pending['added'])}) was pushed "
                              "again, but it is still not", pending)
    return None


def _unpushed_line(what: str, dvc: dict) -> str:
    return (f"{what} on the DVC remote, so no other checkout can `dvc pull` it: {dvc['push_failed']}; push it by hand "
            f"with `{_push_command(dvc['added'])}` before another retrain changes those files")


def _file_reason(outcome: FileOutcome, staged: Staged) -> str:
    """The summary's reason cell: the file's own, or for rows quarantined, the first one's line and reason."""
    if outcome.reason or not outcome.quarantined:
        return outcome.reason
    first = next((q for q in staged.rows_quarantined if q.get("file") == outcome.file), None)
    return f"e.g. line {first['line']}: {first['reason']}" if first else ""


def _cell(text: str) -> str:
    """Text for a markdown table cell: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _data_version_lines(committed: dict) -> list[str]:
    """The summary's line on the new data version: on the DVC remote, in this checkout's cache only, or not on the
    remote because the push failed (the UI's artifact says it where the run's logs are not read)."""
    dvc = committed.get("dvc", {})
    versions = dvc.get("added") or []
    if not versions:
        return []
    named = ", ".join(f"`{v}`" for v in versions)
    if dvc.get("push_failed"):
        return ["", f"New data version: {named}; **not on the DVC remote**, the push failed: {_cell(dvc['push_failed'])}. "
                    f"Push it by hand: `{_push_command(versions)}`."]
    where = "on the DVC remote" if dvc.get("pushed") else "in this checkout's DVC cache only (no remote, or retrain.push off)"
    return ["", f"New data version: {named}, {where}."]


def _class_changes_table(changes: list[dict]) -> list[str]:
    """The classes whose validation F1 moved most, worst news and best alike (promote's `class_changes`)."""
    if not changes:
        return []
    return ["", "## Classes that moved most (validation F1)", "", "| class | questions | champion | challenger | Δ |",
            "| --- | --- | --- | --- | --- |"] + [
        f"| {_cell(c['class_id'])} | {c['support']} | {c['champion_f1']:.3f} | {c['challenger_f1']:.3f} | "
        f"{c['difference']:+.3f} |" for c in changes]


def summary_markdown(staged: Staged, promotion: dict | None, trained: Trained | None, repeats: list[Incoming] = (),
                     committed: dict | None = None) -> str:
    """The flow's Prefect artifact: what came in (`repeats` too), the data version `committed` made (`commit`'s result)
    and whether the DVC remote has it, and the challenger against the champion."""
    lines = ["# Retrain", "", "| file | kind | outcome | read | accepted | quarantined | reason |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {Path(o.file).name} | {o.kind} | {o.outcome} | {o.read} | {o.accepted} | {o.quarantined} | "
              f"{_cell(_file_reason(o, staged))} |" for o in [*staged.outcomes, *map(repeat_outcome, repeats)]]
    lines += ["", f"Accepted rows: **{staged.accepted - staged.new_classes}**; new classes: **{staged.new_classes}**."]
    lines += _data_version_lines(committed or {})
    if trained and trained.refreshed_from:
        champion = trained.refreshed_from
        lines += ["", f"Refreshed, not trained: version {champion.version}'s encoder with the grown labeled questions "
                      "as its exemplars" + ("." if champion.rule == "exemplars" else
                                            f" (version {champion.version} serves the {champion.rule} rule).")]
    if promotion and trained and promotion.get("challenger_version") is None:  # tracking off: no registry to judge in
        lines += ["", "**Not promoted**:", ""] + [f"- {reason}" for reason in promotion["reasons"]]
    elif promotion and trained:
        validation = promotion.get("validation", {})
        champion = validation.get("champion_accuracy")
        challenger = validation.get("challenger_accuracy")
        lines += ["", "## Challenger vs champion (validation)", "", "| metric | champion | challenger | Δ |", "| --- | --- | --- | --- |"]
        if champion is not None:
            lines.append(f"| accuracy | {champion:.4f} | {challenger:.4f} | {challenger - champion:+.4f} |")
            lines.append(f"| tail macro-F1 | {promotion['champion_tail_macro_f1']:.4f} | "
                         f"{promotion['challenger_tail_macro_f1']:.4f} | "
                         f"{promotion['challenger_tail_macro_f1'] - promotion['champion_tail_macro_f1']:+.4f} |")
        elif challenger is None:  # every validation question was one a model learnt from: nothing was judged
            lines.append("| accuracy | (not judged) | (not judged) | |")
        else:
            absent = "(none)" if promotion.get("champion_version_before") is None else "(not comparable)"
            lines.append(f"| accuracy | {absent} | {challenger:.4f} | |")
        lines += ["", f"**{'Promoted' if promotion['promoted'] else 'Not promoted'}**: "
                  f"version {promotion['challenger_version']}; champion is now version {promotion['champion_version_after']}.", ""]
        lines += [f"- {reason}" for reason in promotion["reasons"]]
        lines += _class_changes_table(promotion.get("class_changes", []))
    return "\n".join(lines) + "\n"
