"""`tqc validate FILE…`: check a new delivery of labeled questions (and catalog files) before it enters the pipeline.

By default the files are judged as the retrain flow would judge them in its inbox (`check_delivery`, through the
flow's own staging step): against the current data with the flow's merged additions, catalog files' new classes
included, and each file against the delivery's others. With `--against DIR` each file is judged alone against a
validated folder (`main`). Either way a batch is judged by the validate stage's own contract: the new rows join the
current training rows (so a repeat of a known question or a label conflicting with one is caught), and leakage into
validation or test is checked. Exit code 0: clean; 1: some rows would be quarantined; 2: a file is unusable, or the
current data cannot be read.
"""

from __future__ import annotations

import logging
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from tqc.errors import InputError
from tqc.retraining import inbox, staging
from tqc.config import ConfigError, Params
from tqc.readers import ReaderError, labels_read_as_catalog, read_custom_table, require_rows
from tqc.schema import Catalog, LabeledQuestion, load_questions, split_source
from tqc.stages.validate import ValidationFailed, check, raise_on_critical, summarise

log = logging.getLogger(__name__)

CLEAN, QUARANTINED, UNUSABLE = 0, 1, 2


class UnreadableReference(InputError):
    """The current data a batch is checked against cannot be read: no fault of the batch's."""


@dataclass(frozen=True)
class Reference:
    """The current data a batch is judged against: the validate stage's catalog and splits."""

    catalog: Catalog
    splits: dict[str, list[LabeledQuestion]]  # train, validation, test


def load_reference(against: Path) -> Reference:
    """The current catalog and splits (the validate stage's output), or UnreadableReference naming what is wrong."""
    try:
        catalog = Catalog.load(against / "catalog.jsonl")
        return Reference(catalog, {split: load_questions(against / f"{split}.jsonl")
                                   for split in ("train", "validation", "test")})
    except (OSError, ValueError) as exc:  # each names the file (and the line) at fault
        raise UnreadableReference(f"{against}: the current data to check against cannot be read: {exc}") from None


def check_batch(path: Path, against: Path | Reference, params: Params, content: bytes | None = None) -> dict:
    """What would be accepted and what quarantined, and why. Raises ReaderError or ValidationFailed for a bad
    batch, UnreadableReference for a bad `against`. `against` is the validate stage's folder, or a Reference
    loaded from it once for several batches (the retrain flow's delivery). `content`: the file's bytes, where the
    caller read them itself (as `read_table`).

    The rows are judged as the training rows they would become: a critical row-level expectation makes
    the file unusable when it would fail for more than `max_quarantined_fraction` of the grown training
    set (a wholesale failure the validate stage would stop on); below that the failing rows are
    quarantined, each with its line, and the others accepted."""
    reference = against if isinstance(against, Reference) else load_reference(against)
    catalog, current = reference.catalog, reference.splits
    parsed = require_rows(read_custom_table(path, params.data.custom, content=content), path)
    # `b` is the catalog's `B`, not a stray label, as ingest reads a custom dataset's labels under `derive`; a shipped
    # dataset's ids are fixed, so a delivery's label alike one is read as it too. `quarantine` reads labels exactly.
    if params.data.dataset != "custom" or params.data.custom.unknown_labels == "derive":
        parsed = labels_read_as_catalog(parsed, catalog)
    splits = {"train": current["train"] + parsed.rows, "validation": current["validation"], "test": current["test"]}
    accepted, quarantined, _, outcomes = check(splits, catalog, params.validate_)
    batch_quarantined = [_with_new_class_hint(q) for q in _batch_records(quarantined, parsed.rows)]
    report = summarise(catalog, splits, accepted, quarantined, outcomes, params.validate_, 0.0)
    raise_on_critical(report, params.validate_, batch_quarantined)  # the error names the file's failing lines
    rejected = [{"file": r.file, "line": r.line, "expectations": ["parse"], "reason": r.reason, "content": r.content}
                for r in parsed.rejected]
    rejected += batch_quarantined
    batch_ids = {id(row) for row in parsed.rows}
    return {
        "file": str(path),
        "read": len(parsed.rows) + len(parsed.rejected),
        # the batch's own rows, by identity (check keeps the objects): by source, the current rows ingested from a
        # file of the same path (an edited data/questions.csv checked again) were counted as the batch's
        "accepted": [asdict(q) for q in accepted["train"] if id(q) in batch_ids],
        "quarantined": sorted(rejected, key=lambda q: q["line"] or 0),
    }


def _batch_records(quarantined: list[dict], batch: list[LabeledQuestion]) -> list[dict]:
    """The quarantine records of the batch's rows: each row's (file, line, text, label) taken once, so a current
    row from a file of the batch's path is not counted as the batch's (the records carry no row index; a current
    row alike in all four is the batch row's duplicate, and its record reads the same)."""
    waiting = Counter((*split_source(row.source), row.text, row.class_id) for row in batch)
    mine = []
    for record in (q for q in quarantined if q["split"] == "train"):
        key = (record["file"], record["line"], record["content"]["text"], record["content"]["class_id"])
        if waiting[key] > 0:
            waiting[key] -= 1
            mine.append(record)
    return mine


NEW_CLASS_HINT = "a delivery adds a class with a catalog*.csv file of its standard question beside the rows"


def _with_new_class_hint(record: dict) -> dict:
    """A delivered row's unknown label: how a delivery makes a class, which its own rows never do."""
    if "label_in_catalog" not in record["expectations"] or "alike but for case" in record["reason"]:
        return record  # a near-miss of a catalog id wants its spelling fixed, not a new class
    return {**record, "reason": record["reason"].replace("is no class of the catalog", f"is no class of the catalog ({NEW_CLASS_HINT})", 1)}


def main(path: Path, against: Path, params: Params) -> int:
    try:
        with quiet(*_CURRENT_DATA_LOGGERS):
            report = check_batch(path, against, params)
    except UnreadableReference as exc:  # exit 2, not an uncaught error's 1, which says QUARANTINED here
        print(f"{exc} (the validate stage writes it: `dvc repro validate`)")
        return UNUSABLE
    except (ReaderError, ValidationFailed, OSError) as exc:  # OSError: missing, a folder, not readable
        print(f"{path}: unusable: {exc}")
        return UNUSABLE
    print(f"{path}: {report['read']} rows read, {len(report['accepted'])} would be accepted, "
          f"{len(report['quarantined'])} quarantined")
    for row in report["quarantined"]:
        why = row.get("reason") or ", ".join(row["expectations"])
        print(f"  line {row['line']}: {why}: {row['content']!r}")
    return QUARANTINED if report["quarantined"] else CLEAN


def check_delivery(paths: list[Path], params: Params) -> int:
    """The files judged as the retrain flow's staging step judges an inbox delivery (`staging.stage`, in a scratch
    folder: nothing is merged), printed a file at a time with each quarantined row; the exit code as `main`'s."""
    paths = list({path.resolve(): path for path in paths}.values())  # a file given twice, or spelt two ways, is one
    unread, digests = _unread_and_hashed(paths)
    for path, why in unread.items():
        print(f"{path}: unusable: {why}")
    staged = _staged(_new_files(digests, params), params)
    if staged is None:
        return UNUSABLE
    worst = UNUSABLE if unread else CLEAN
    for outcome in staged.outcomes:
        worst = max(worst, _say_outcome(outcome, staged))
    return worst


def _unread_and_hashed(paths: list[Path]) -> tuple[dict[Path, str], dict[Path, str]]:
    """({file: why the flow would not read it}, {file: its sha256}) of `paths`: a folder or missing file, another
    suffix, a second file of a name, a file that cannot be read."""
    unread = {path: "not a file" if path.exists() else "no such file" for path in paths if not path.is_file()}
    unread |= {path: f"the retrain flow reads only {', '.join(sorted(inbox.SUFFIXES))} files" for path in paths
               if path not in unread and path.suffix.lower() not in inbox.SUFFIXES}
    unread |= _same_names([path for path in paths if path not in unread])
    digests = {}
    for path in (path for path in paths if path not in unread):
        try:
            digests[path] = inbox.sha256(path)
        except OSError as exc:  # the flow leaves such a file in the inbox, said each run
            unread[path] = f"cannot be read ({exc.strerror or exc})"
    return unread, digests


def _new_files(digests: dict[Path, str], params: Params) -> list[inbox.Incoming]:
    """The files of `digests` the flow would judge, in its order; each repeat (its bytes merged before, or an earlier
    file's) is said, not judged."""
    # in the inbox's order, as the flow reads them: which of two copies is the duplicate or the repeat follows from it
    ordered = [inbox.Incoming(path, digest) for path, digest in sorted(digests.items(), key=lambda item: item[0].name)]
    files, repeats = inbox.split_repeats(ordered, params.retrain)
    first_with = {}
    for incoming in ordered:
        first_with.setdefault(incoming.sha256, incoming.path)
    for incoming in repeats:
        twin = first_with[incoming.sha256]
        print(f"{incoming.path}: a repeat of {twin if twin != incoming.path else 'a file the flow merged'} (the same "
              "bytes): the flow would archive it, adding nothing")
    return files


def _staged(files: list[inbox.Incoming], params: Params) -> staging.Staged | None:
    """`files` staged as the flow stages them, in a scratch folder deleted after; None, said why, where the current
    data they are judged against cannot be built."""
    import tempfile

    with (tempfile.TemporaryDirectory(prefix="tqc-validate-") as scratch, quiet(*_CURRENT_DATA_LOGGERS),
          _only_about([incoming.path for incoming in files], "tqc.readers")):
        try:
            # checking: what the flow's layout guards (an inbox or work_dir holding data.additions) is not at stake
            # here, where nothing is emptied or archived; the flow itself refuses it
            return (staging.stage(files, params, Path(scratch), checking=True) if files
                    else staging.Staged(Path(scratch)))
        except ConfigError as exc:  # data.additions unset: the flow's data cannot be built
            print(f"{exc}; --against data/validated checks against the last dvc repro's data instead")
        except (OSError, ValueError) as exc:  # the current data: its reader names the file and line
            print(f"the current data to check against cannot be read: {exc}")
    return None


def _say_outcome(outcome: inbox.FileOutcome, staged: staging.Staged) -> int:
    """Prints a staged file's outcome, then its quarantined rows by line; its exit code."""
    if outcome.outcome == "unusable":
        print(f"{outcome.file}: unusable: {outcome.reason}")
        return UNUSABLE
    what = "class(es)" if outcome.kind == "catalog" else "rows"
    print(f"{outcome.file}: {outcome.read} {what} read, {outcome.accepted} would be accepted"
          f"{' as new classes' if outcome.kind == 'catalog' else ''}, {outcome.quarantined} quarantined"
          + (f" ({outcome.reason})" if outcome.reason else ""))
    for row in (r for r in staged.rows_quarantined if r["file"] == outcome.file):
        print(f"  line {row['line']}: {row['reason']}: {row['content']!r}")
    return QUARANTINED if outcome.quarantined else CLEAN


def _same_names(paths: list[Path]) -> dict[Path, str]:
    """Files named as an earlier one of `paths` (from another folder): one inbox cannot hold both, and the flow names a
    row by its file's name and line, so two such files would be judged as one."""
    first: dict[str, Path] = {}
    for path in paths:
        first.setdefault(path.name, path)
    return {path: f"named as {first[path.name]}: an inbox holds one file of a name, so rename one to deliver both"
            for path in paths if first[path.name] != path}


# What building and validating the grown data logs concerns all of it (ingest's own quarantined rows, validate's
# "no_duplicates on train failed for 72 rows" over the current data too), not the
# files checked: those are printed file by file, each quarantined row with its line (the retrain flow logs each
# file's count, first line and reason)
CURRENT_DATA_STAGES = ("tqc.stages.ingest", "tqc.stages.validate")
_CURRENT_DATA_LOGGERS = (*CURRENT_DATA_STAGES, "tqc.retrain")


class _AboutFiles(logging.Filter):
    """Passes a record whose message begins with one of `files`, as readers' warnings name their file and line."""

    def __init__(self, files: list[Path]):
        super().__init__()
        self.prefixes = tuple(f"{file}," for file in files) + tuple(f"{file}:" for file in files)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage().startswith(self.prefixes)


@contextmanager
def _only_about(files: list[Path], name: str):
    """Logger `name`'s records about `files` only, for a block. Readers warn of the current data's derived classes
    (a label the catalog lacks) each time the grown data is built; a file's own, such as a label read as a catalog
    id, still show."""
    logger, about = logging.getLogger(name), _AboutFiles(files)
    logger.addFilter(about)
    try:
        yield
    finally:
        logger.removeFilter(about)


@contextmanager
def quiet(*names: str):
    """The loggers `names` held at ERROR for a block."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
