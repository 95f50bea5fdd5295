"""Staging: the current additions copied, and the new files merged into the copy, each judged by the validate stage's
contract against the current data (catalog files first, then labeled ones). Nothing outside the staging folder
changes."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator

from tqc.config import Params
from tqc.io import DataFileError, write_jsonl
from tqc.readers import ADDED_CATALOG, ADDED_QUESTIONS, MissingColumns, ReaderError, RejectedRow, read_catalog_rows
from tqc.retraining.inbox import (FileOutcome, Incoming, NotADeliveredFile, delivered_bytes, quarantine_record, rows_of,
                                  sha256)
from tqc.schema import Catalog, StandardQuestion
from tqc.text import catalog_label_key

log = logging.getLogger("tqc.retrain")  # one logger for the retrain steps, whichever module says it


@dataclass
class Staged:
    raw: Path  # the staged additions folder (labeled.jsonl, catalog.jsonl)
    outcomes: list[FileOutcome] = field(default_factory=list)
    quarantined_rows: list[dict] = field(default_factory=list)
    # each additions file's sha256 as `stage` copied it (None: there was none): `commit` refuses to write over a change
    base: dict[str, str | None] = field(default_factory=dict)
    # the delivered files not judged, their bytes changed since pick-up: left in the inbox, neither merged nor archived
    still_changing: list[str] = field(default_factory=list)

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
    if not checking:
        _require_the_recorded_versions(current)
    raw = staging / "raw"
    if raw.exists():
        shutil.rmtree(raw)
    raw.mkdir(parents=True)
    for name in (ADDED_QUESTIONS, ADDED_CATALOG):
        if (current / name).exists():
            shutil.copy2(current / name, raw / name)
    staged = Staged(raw, base=additions_digests(raw))
    attempts = [(incoming, _read_once(incoming)) for incoming in files]
    staged.still_changing = [str(incoming.path) for incoming, read_now in attempts if read_now is None]
    read = [read_now for _, read_now in attempts if read_now is not None]
    contents = {incoming.path: content for incoming, content in read}
    files = [incoming for incoming, _ in read]
    with _naming_kept(raw, current):
        _merge_files(files, contents, params, raw, staging, staged)
    _name_kept_in_reasons(staged, raw, current)
    for outcome in staged.outcomes:
        if outcome.outcome == "unusable":  # said here, in the quarantine and in the summary, not only in the manifest
            log.warning("retrain: %s is unusable: %s", outcome.file, outcome.reason)
            staged.quarantined_rows.append(quarantine_record(outcome.file, outcome.sha256, {
                "line": None, "expectations": ["usable_file"], "reason": f"unusable file: {outcome.reason}"}))
        elif outcome.kind == "labeled" and outcome.quarantined:  # a catalog file's rows are said one by one, as merged
            log.warning("retrain: %s: %d of %d row(s) quarantined to %s, %s", outcome.file, outcome.quarantined,
                        outcome.read, params.retrain.quarantine, file_reason(outcome, staged))
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
            reference = ingested_data(with_additions(params, raw), staging / "reference")
            staged.outcomes.extend(_merge_labeled(labeled, params, raw, reference, staged, contents))


def _name_kept_in_reasons(staged: Staged, copy: Path, kept: Path) -> None:
    """The quarantine's and the manifest's reasons name a merged question where it is kept ("duplicate of
    data/raw/labeled.jsonl, line 3"), not in the staged copy the current data was ingested from, which the run deletes
    (as `_naming_kept` does for errors); the line numbers are the same in both."""
    inside, kept_inside = f"{copy}{os.sep}", f"{kept}{os.sep}"
    for row in staged.quarantined_rows:
        row["reason"] = row["reason"].replace(inside, kept_inside)
    for outcome in staged.outcomes:
        outcome.reason = outcome.reason.replace(inside, kept_inside)


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


def _read_once(incoming: Incoming) -> tuple[Incoming, bytes | None] | None:
    """(the file, its bytes as picked up), or (the file, None) where it cannot be read (the reader says why). None
    where its bytes are no longer those picked up (a copy still being written, rows being appended): it is not judged
    this run, since a row cut inside its label may read as another class's (`HUMAN` cut to `HUM`), and it stays in
    the inbox for the next run to read whole. What is parsed is what was hashed; `archive` hashes it once more."""
    try:
        content = delivered_bytes(incoming.path)  # never through a link put there since it was picked up
    except NotADeliveredFile:  # None would have the reader open the path, and follow the link
        log.warning("retrain: %s is a link (or not a file) since it was picked up: not read, left in the inbox",
                    incoming.path)
        return None
    except OSError:
        return incoming, None
    if hashlib.sha256(content).hexdigest() != incoming.sha256:
        log.warning("retrain: %s changed after it was picked up (a copy still being written?): not read this run, left "
                    "in the inbox for the next (deliver a file under another name, e.g. .part, and rename it when it "
                    "is whole)", incoming.path)
        return None
    return incoming, content


def additions_digests(folder: Path) -> dict[str, str | None]:
    return {name: sha256(folder / name) if (folder / name).exists() else None for name in (ADDED_QUESTIONS, ADDED_CATALOG)}


def _require_the_recorded_versions(current: Path) -> None:
    """Each merged file is the version its .dvc file records. After a `git pull` that brought another checkout's data
    version (a .dvc file) without its data (`dvc pull`), or a `git checkout` of another commit without `dvc checkout`,
    the file here is another version, or none: merged onto and committed, the new version would drop every row the
    recorded one holds, and say nothing (its deliveries, listed as merged, never merge again). A file edited here by
    hand differs from its record too until `dvc add` records it, as docs/retrain.md asks: refused alike, naming both
    ways out, since the two cannot be told apart when the cache holds the recorded version."""
    import yaml

    from tqc.tracking import dvc_md5

    for name in (ADDED_QUESTIONS, ADDED_CATALOG):
        record, data = current / f"{name}.dvc", current / name
        if not record.is_file():
            continue
        try:
            recorded = yaml.safe_load(record.read_text(encoding="utf-8"))["outs"][0]["md5"]
        except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
            raise ReaderError(f"{record}: not a DVC record of {name} ({type(exc).__name__}: {exc}); restore it "
                              f"(`git checkout -- {record}`)") from None
        found = dvc_md5(data) if data.is_file() else None
        if found == recorded:
            continue
        if found is None:
            raise ReaderError(f"{data}: missing, though {record} records a version of it (md5 {recorded}): fetch it "
                              f"with `dvc pull {record}` (or `dvc checkout {record}`); merged onto nothing, the new "
                              "version would hold none of its rows")
        if _in_dvc_cache(recorded):
            raise ReaderError(f"{data}: not the version {record} records (md5 {recorded}): merged onto this copy, the "
                              "new version would drop whatever rows the recorded one holds and it lacks. If you edited "
                              f"it, record the edit with `dvc add {data}`; if it is an older copy (a `git checkout` "
                              f"without `dvc checkout`), restore the recorded one with `dvc checkout {record}`")
        raise ReaderError(f"{data}: not the version {record} records (md5 {recorded}, which this checkout's DVC cache "
                          f"lacks: a `git pull` brought the record without its data): fetch it with `dvc pull {record}`; "
                          "merged onto this older copy, the new version would drop the rows the recorded one holds")


def _in_dvc_cache(md5: str) -> bool:
    """Whether this checkout's DVC cache holds the file `md5` (False outside a DVC repository)."""
    from dvc.exceptions import DvcException, NotDvcRepoError
    from dvc.repo import Repo

    try:
        with Repo() as repo:
            return bool(repo.cache.local.exists(md5))
    except (NotDvcRepoError, DvcException):
        return False


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


def with_additions(params: Params, raw: Path) -> Params:
    return params.with_overrides({"data": {"additions": str(raw)}})


def _merge_catalog(incoming: Incoming, params: Params, raw: Path, staged: Staged, content: bytes | None) -> FileOutcome:
    """New classes from a catalog file. A row without text, or whose text is another class's, makes the
    file unusable here, by file and line: merged, it would fail the validate contract on every retrain."""
    from tqc.text import normalise

    outcome = FileOutcome(str(incoming.path), incoming.sha256, "catalog", "merged")
    staged_rows = rows_of(raw / ADDED_CATALOG)
    current = [(q.class_id, q.text) for q in _base_catalog(params).questions] + [(r["class_id"], r["text"]) for r in staged_rows]
    try:
        rows = read_catalog_rows(incoming.path, params.data.custom.catalog_id_column, params.data.custom.catalog_text_column,
                                 taken={normalise(text): class_id for class_id, text in current}, content=content,
                                 encoding=params.data.custom.encoding)
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
    restated = [q for q in added if q.class_id in known and normalise(q.text) != normalise(known[q.class_id])]
    outcome.read, outcome.accepted, outcome.quarantined = len(added), len(new), len(restated) + len(alike)
    repeated = len(added) - len(new) - len(restated) - len(alike)
    outcome.reason = "; ".join(([f"{repeated} known class(es) as the catalog has them"] if repeated else []) +
                               ([f"{len(restated)} known class(es) with another text kept theirs (quarantined)"] if restated else []) +
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
    for q in restated:  # said in the run's log too: the manifest's count alone reads like a success
        log.warning("%s, line %s: class %r already has the standard question %r; this row's %r is quarantined (a "
                    "delivery adds classes; edit data/raw/catalog.jsonl or the dataset's catalog to change one)",
                    incoming.path, line_of[q.class_id], q.class_id, known[q.class_id], q.text)
    staged.quarantined_rows.extend(quarantine_record(str(incoming.path), incoming.sha256, {
        "line": line_of[q.class_id], "expectations": ["new_class"],
        "reason": f"class {q.class_id!r} already has the standard question {known[q.class_id]!r}; a delivery adds "
                  "classes, it does not change one's text", "content": {"class_id": q.class_id, "text": q.text}})
        for q in restated)
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
        write_jsonl(raw / ADDED_QUESTIONS, rows_of(raw / ADDED_QUESTIONS) + new_rows)
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


def _text_key(row: dict) -> str:
    from tqc.text import compared_text

    return compared_text(row["text"])  # as the validate contract compares questions (case, spacing)


def _line(row: dict) -> int:
    return int(row["source"].rsplit(":", 1)[1])


def file_reason(outcome: FileOutcome, staged: Staged) -> str:
    """The summary's reason cell: the file's own, or for rows quarantined, the first one's line and reason."""
    if outcome.reason or not outcome.quarantined:
        return outcome.reason
    first = next((q for q in staged.rows_quarantined if q.get("file") == outcome.file), None)
    return f"e.g. line {first['line']}: {first['reason']}" if first else ""

