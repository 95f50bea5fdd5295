"""Ingest: read the raw dataset, carve a stratified validation split, quarantine unparseable rows."""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from tqc.config import DataParams, GeneratedData
from tqc.io import atomic_directory, write_json, write_jsonl
from tqc.readers import (DatasetSplits, ReaderError, RejectedRow, ReadResult, RowsRejected, read_additions, read_dataset,
                         read_generated, read_validation, row_as_csv, with_added_classes)
from tqc.schema import Catalog, LabeledQuestion, save_questions, split_source, usable_generated
from tqc.text import compared_text, fails_alone, first_of, normalise

log = logging.getLogger(__name__)


def stratified_split(
    questions: list[LabeledQuestion], fraction: float, seed: int, held_out_texts: frozenset[str] = frozenset(),
    max_text_chars: int | None = None) -> tuple[list[LabeledQuestion], list[LabeledQuestion]]:
    """Seeded per-class split into (train, validation).

    Each class with at least 3 rows gives max(1, round(fraction·n)) rows to validation, so
    early stopping sees every class; rarer classes stay whole in train. A row whose text (`compared_text`)
    is in `held_out_texts` is never drawn for validation: a test question (validate would quarantine it
    there as leakage and leave its class with fewer validation rows, or none), or a standard question of
    the catalog (COVID-Q classes' texts are training questions: matched word for word, such a validation
    row would judge nothing, and a third of that validation split was one). Nor is a text that repeats in
    `questions` (its copy left in train would be quarantined as leakage, and a user whose file only repeated
    rows was stopped for "leakage"; 15 of TREC-6's validation rows had such a copy), nor one with no text (validate
    quarantines it: one such row among a dozen validation rows stopped validate), nor one validate quarantines
    wherever it stands (`fails_alone`: a control character, no letter or digit, over `max_text_chars`; a class's one
    validation row so drawn left it none, with clean rows in train). Where no drawn row is one,
    the split is the one drawn without them. A class left so without validation rows is said in a warning (ingest
    says it in its warning of classes without validation rows instead: `_drawn_split`).
    """
    train, validation, undrawable = _drawn_split(questions, fraction, seed, held_out_texts, max_text_chars)
    for class_id, rows in undrawable.items():  # said: validate names only classes that lost their validation rows
        log.warning("ingest: class %r has no validation row: %s", class_id, _undrawable(rows))
    return train, validation


def _drawn_split(questions: list[LabeledQuestion], fraction: float, seed: int, held_out_texts: frozenset[str],
                 max_text_chars: int | None = None) -> tuple[list[LabeledQuestion], list[LabeledQuestion], dict[str, int]]:
    """`stratified_split`'s (train, validation), and the classes that were to give validation rows but had none it
    may draw (class → its rows), unsaid: ingest says each in its one warning of classes without validation rows."""
    keys = [compared_text(question.text) for question in questions]  # once a row: for the repeats, then the draw
    texts = Counter(keys)
    never_drawn = held_out_texts | {text for text, count in texts.items() if count > 1 or not text}
    by_class: dict[str, list[tuple[LabeledQuestion, str]]] = defaultdict(list)
    for question, key in zip(questions, keys):
        by_class[question.class_id].append((question, key))
    rng = random.Random(seed)
    train, validation, undrawable = [], [], {}
    for class_id in sorted(by_class):
        members = list(by_class[class_id])
        rng.shuffle(members)  # the same draw as of the rows alone: a shuffle depends only on the length
        n_validation = max(1, round(fraction * len(members))) if len(members) >= 3 else 0
        drawn = [question for question, key in members
                 if key not in never_drawn and not fails_alone(question.text, key, max_text_chars)][:n_validation]
        if n_validation and not drawn:
            undrawable[class_id] = len(members)
        drawn_ids = {id(m) for m in drawn}  # by identity: two rows may share a text and class
        validation.extend(drawn)
        train.extend(question for question, _ in members if id(question) not in drawn_ids)
    return train, validation, undrawable


def _undrawable(rows: int) -> str:
    return (f"each of its {rows} training rows repeats, is empty, is a test or standard question, or fails a check of "
            "validate's on its own (a control character, no letter or digit, too long), none of which is drawn for "
            "validation")


def validation_split(params: DataParams, official_train: list[LabeledQuestion], seed: int,
                     test: list[LabeledQuestion] = (), standard_questions: list[str] = (), catalog: Catalog | None = None,
                     max_text_chars: int | None = None
                     ) -> tuple[list[LabeledQuestion], list[LabeledQuestion], list[RejectedRow], dict[str, int]]:
    """(train, validation, the validation file's rejected rows, the classes of 3 or more rows none of which could be
    drawn (class → rows)): `data.validation_file` whole when set, the official train then training whole; otherwise a
    stratified split carved out of train, never drawing a question that is also in `test` or is one of the catalog's
    `standard_questions`, nor one validate quarantines wherever it stands (`max_text_chars`: validate's bound)."""
    given = read_validation(params, catalog)
    if given is None:
        held_out = frozenset(compared_text(text) for text in [*(q.text for q in test), *standard_questions])
        train, validation, undrawable = _drawn_split(official_train, params.validation_fraction, seed, held_out,
                                                     max_text_chars)
        return train, validation, [], undrawable
    return official_train, given.rows, given.rejected, {}


def long_tail(questions: list[LabeledQuestion], ratio: float, seed: int) -> list[LabeledQuestion]:
    """SharpReCL's imbalanced version: classes ranked by size (then id), the i-th keeps
    ⌊n · ratio^(−i/(C−1))⌋ rows (at least one), n being the largest class; seeded choice."""
    by_class: dict[str, list[LabeledQuestion]] = defaultdict(list)
    for question in questions:
        by_class[question.class_id].append(question)
    ranked = sorted(by_class, key=lambda c: (-len(by_class[c]), c))
    largest, rng, kept = len(by_class[ranked[0]]), random.Random(seed), []
    for i, class_id in enumerate(ranked):
        exponent = i / (len(ranked) - 1) if len(ranked) > 1 else 0.0
        keep = max(1, min(len(by_class[class_id]), int(largest * ratio ** -exponent)))
        kept.extend(rng.sample(by_class[class_id], keep))
    return kept


def _class_counts(questions: list[LabeledQuestion]) -> dict[str, int]:
    """Rows per class, largest first (then id): the long tail reads top to bottom."""
    counts = Counter(question.class_id for question in questions)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def stable_split(questions: list[LabeledQuestion], fraction: float, seed: int) -> tuple[list, list]:
    """Each added question's split is a hash of its text: it never changes as more data arrives,
    so a champion is never judged on validation questions it was trained on. The text as validate compares it
    (`compared_text`), as the carved split draws: "Where is Paris?" and "where is paris ?" go to one split, never
    one to train and its copy to validation."""
    def in_validation(question: LabeledQuestion) -> bool:
        digest = hashlib.sha256(f"{seed}:{compared_text(question.text)}".encode("utf-8")).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < fraction

    return [q for q in questions if not in_validation(q)], [q for q in questions if in_validation(q)]


@dataclass
class Attribution:
    """Generated rows with their origins, and what could not be used."""

    rows: list[LabeledQuestion]
    copies: int  # rows that were their original's own text: no new row, left out
    rejected: list[RejectedRow]


def _rejected(row: LabeledQuestion, reason: str) -> RejectedRow:
    """A generated row quarantined at its own file and line ("file:line" in its source)."""
    file, line = split_source(row.source)
    return RejectedRow(file, line or 0, reason, row_as_csv(row))


def _words(text: str) -> frozenset[str]:
    """The words of `text` as validate compares texts (`normalise`): "What 's the fee ?" has the words of "What's the
    fee?" (split raw, a tokenised dataset's copy of its original overlapped it by a third, and was quarantined)."""
    return frozenset(normalise(text).split())


def attribute_generated(generated: list[LabeledQuestion], originals: list[LabeledQuestion],
                        params: GeneratedData) -> Attribution:
    """Each generated row's origins: the same-class originals whose word overlap (Jaccard) is within
    `params.margin` of the best, the best being at least `params.min_overlap`.

    Keeping every near-best original, not just one, is what makes the leakage guard safe: when
    a row could have come from a validation question, augment never uses it.
    """
    postings: dict[tuple[str, str], list[int]] = defaultdict(list)  # (class, word) → originals holding it
    original_words = [_words(q.text) for q in originals]
    original_keys = [normalise(q.text) for q in originals]
    for index, (question, words) in enumerate(zip(originals, original_words)):
        for word in words:
            postings[(question.class_id, word)].append(index)
    attribution = Attribution([], 0, [])
    for row in generated:
        words = _words(row.text)
        candidates = {i for word in words for i in postings.get((row.class_id, word), ())}
        overlaps = {i: len(words & original_words[i]) / len(words | original_words[i]) for i in candidates}
        best = max(overlaps.values(), default=0.0)
        if best < params.min_overlap:
            reason = "empty text" if not words else (f"cannot tell which training question of class {row.class_id!r} it was made from: best word "
                      f"overlap {best:.2f} < data.generated.min_overlap {params.min_overlap}")
            attribution.rejected.append(_rejected(row, reason))
        elif normalise(row.text) in {original_keys[i] for i in overlaps}:
            attribution.copies += 1
        else:
            origins = tuple(sorted(originals[i].source for i, o in overlaps.items() if o >= best - params.margin))
            attribution.rows.append(replace(row, generated=True, origins=origins))
    return attribution


def attribute_named(generated: list[LabeledQuestion], originals: list[LabeledQuestion], named: dict[str, str],
                    column: str = "source") -> Attribution:
    """Exact attribution: each row's origins are the same-class originals whose text is the one its
    file names (`data.generated.source_column`), case and spaces aside; several when that text repeats."""
    by_text: dict[tuple[str, str], list[str]] = defaultdict(list)  # (class, normalised text) → sources
    for question in originals:
        by_text[(question.class_id, normalise(question.text))].append(question.source)
    attribution = Attribution([], 0, [])
    for row in generated:
        named_text = named.get(row.source, "")
        named_key = normalise(named_text)
        origins = by_text.get((row.class_id, named_key), [])
        if not row.text.strip():
            attribution.rejected.append(_rejected(row, "empty text"))
        elif not named_text.strip():
            attribution.rejected.append(_rejected(row, f"empty source question (column {column!r})"))
        elif not origins:
            attribution.rejected.append(_rejected(
                row, f"its source question {named_text!r} is not a training question of class {row.class_id!r}"))
        elif normalise(row.text) == named_key:
            attribution.copies += 1
        else:
            attribution.rows.append(replace(row, generated=True, origins=tuple(sorted(origins))))
    return attribution


def _generated_rows(params: DataParams, originals: list[LabeledQuestion], catalog: Catalog) -> tuple[Attribution, int]:
    """(data.generated's rows attributed to the official training questions, rows read)."""
    generated: ReadResult = read_generated(params, catalog)
    if params.generated.source_column:
        attribution = attribute_named(generated.rows, originals, generated.named_sources, params.generated.source_column)
    else:
        attribution = attribute_generated(generated.rows, originals, params.generated)
    attribution.rejected[:0] = generated.rejected
    return attribution, len(generated.rows) + len(generated.rejected)


def _generated_report(generated: Attribution, read: int, train: list[LabeledQuestion],
                      left_out: list[LabeledQuestion] = (), imbalanced: bool = False) -> dict:
    """`left_out`: the training rows data.imbalance_ratio left out on purpose; rows made from them are counted apart
    from those made from held-out (validation) questions, though neither is trained on."""
    usable = len(usable_generated(train, generated.rows))
    from_left_out = len(usable_generated([*train, *left_out], generated.rows)) - usable
    return {"read": read, "attributed": len(generated.rows), "copies_of_their_original": generated.copies,
            "quarantined": len(generated.rejected), "usable_with_this_split": usable,
            "made_from_held_out_questions": len(generated.rows) - usable - from_left_out,
            **({"made_from_rows_left_out_by_imbalance": from_left_out} if imbalanced else {})}


def _left_out(rows: list[LabeledQuestion], kept: list[LabeledQuestion]) -> list[LabeledQuestion]:
    """The rows of `rows` that `kept` (data.imbalance_ratio's long tail) left out."""
    sources = {q.source for q in kept}
    return [q for q in rows if q.source not in sources]


# A carved validation split this many times the asked fraction is said: the rule of one row a class moved it there
SHARE_WARNED = 1.5


def _carved_share(fraction: float, validation_rows: int, train_rows: int) -> float:
    """The share of the official training rows that the carved validation split took, with a warning where it is well
    over `fraction`: every class of 3 or more rows gives at least one (stratified_split), so with a few rows a class
    validation takes far more than asked, and train keeps that much less."""
    share = validation_rows / train_rows if train_rows else 0.0
    if share > SHARE_WARNED * fraction:
        log.warning("ingest: the validation split took %d of the %d training rows (%.0f%%), more than "
                    "data.validation_fraction %g: each class with at least 3 rows gives at least one. To train on more, "
                    "name a data.validation_file of labeled questions held apart", validation_rows, train_rows,
                    100 * share, fraction)
    return share


# Each way a class can miss a split, with what that costs and why it happens, as ingest's warning says it
MISSING_A_SPLIT = {
    "classes_without_validation_rows": (
        "have training rows but no validation row, so early stopping and every selection never judge them (under 3 "
        "training rows; each row repeated, empty, or a test or standard question; no row in data.validation_file; or "
        "added questions that all went to train)"),
    "classes_without_train_rows": (
        "have validation rows but no training row, so the encoder never trains on them (all their rows are in "
        "data.validation_file, or are added questions that data.additions' split by text put in validation; add more "
        "questions)"),
}


def classes_missing_a_split(train: list[LabeledQuestion], validation: list[LabeledQuestion],
                            undrawable: dict[str, int] | None = None) -> dict[str, list[str]]:
    """The classes with rows in one of train and validation and none in the other, each way said in one warning with
    what it costs (`MISSING_A_SPLIT`). Neither is lost to quarantine, so validate does not name them. `undrawable`:
    the split's classes whose every row was barred from validation (class → rows), each named with that reason."""
    in_train, in_validation = {q.class_id for q in train}, {q.class_id for q in validation}
    missing = {"classes_without_validation_rows": sorted(in_train - in_validation),
               "classes_without_train_rows": sorted(in_validation - in_train)}
    why = {class_id: _undrawable(rows) for class_id, rows in (undrawable or {}).items()}
    for key, consequence in MISSING_A_SPLIT.items():
        if missing[key]:
            log.warning("ingest: %d class(es) %s: %s", len(missing[key]), consequence, _first_classes(missing[key], why))
    return missing


def _first_classes(classes: list[str], why: dict[str, str], shown: int = 10) -> str:
    """The first `shown` of `classes`, each with its own reason where `why` has one: those first, since the reason is
    what the split's own warning used to say of them, and a cut list would lose it."""
    ordered = sorted(classes, key=lambda c: c not in why)  # stable: each group keeps its order
    return first_of([f"{c!r} ({why[c]})" if c in why else repr(c) for c in ordered], shown)


def _write_quarantine(path: Path, rejected: list[RejectedRow]) -> None:
    write_jsonl(path, (r.quarantined("ingest") for r in rejected))


@contextmanager
def _quarantined_if_stopped(quarantine_path: Path):
    """A file that stops ingest for its rejected rows has every one of them quarantined, not only the few its error
    names, so the user can fix the file from the list."""
    try:
        yield
    except RowsRejected as exc:
        if not exc.rejected:  # a header alone: nothing to list
            raise
        _write_quarantine(quarantine_path, exc.rejected)
        raise RowsRejected(f"{exc}. All {len(exc.rejected)} of its rejected rows are in {quarantine_path}", exc.rejected) from None


@dataclass(frozen=True)
class _Read:
    """What ingest read within `_quarantined_if_stopped`: the dataset, data.additions, the validation rows
    (data.validation_file's, or drawn from the official train) and data.generated's rows."""

    splits: DatasetSplits
    added: ReadResult  # data.additions' questions, split by their text later (`_split`)
    catalog: Catalog  # the dataset's, with data.additions' classes
    official_train: list[LabeledQuestion]  # the official train, or data.imbalance_ratio's long tail of it
    train: list[LabeledQuestion]  # official_train less the validation rows drawn from it
    validation: list[LabeledQuestion]  # drawn from official_train, or data.validation_file's
    validation_rejected: list[RejectedRow]  # data.validation_file's
    undrawable: dict[str, int]  # the classes of 3 or more rows none of which could be drawn (class → rows)
    generated: Attribution
    generated_read: int

    @property
    def left_out_count(self) -> int:
        """The official training rows left out by data.imbalance_ratio, on purpose: counted, not quarantined."""
        return len(self.splits.train.rows) - len(self.official_train)

    @property
    def rejected(self) -> list[RejectedRow]:
        return (self.splits.train.rejected + self.splits.test.rejected + self.validation_rejected + self.added.rejected
                + self.generated.rejected)


def _read(params: DataParams, seed: int, max_text_chars: int | None) -> _Read:
    """The validation rows are drawn among the reads: data.validation_file is read there, and the generated rows
    read after are told apart by them."""
    splits = read_dataset(params)
    added, added_classes = read_additions(Path(params.additions) if params.additions else None)
    catalog = with_added_classes(splits.catalog, added_classes)  # what a validation or generated label is read as
    official_train = long_tail(splits.train.rows, params.imbalance_ratio, seed) if params.imbalance_ratio else splits.train.rows
    # the standard questions of data.additions' classes too: validate quarantines a validation row that is one
    train, validation, validation_rejected, undrawable = validation_split(params, official_train, seed,
                                                                          splits.test.rows, catalog.texts, catalog,
                                                                          max_text_chars)
    # The validation file's questions are candidate origins too, and so are the added questions (some of them are
    # held out by stable_split), so a row made from a held-out question is never trained on (usable_generated)
    held_out = validation if params.validation_file else []
    generated, generated_read = _generated_rows(params, splits.train.rows + held_out + added.rows, catalog)
    return _Read(splits, added, catalog, official_train, train, validation, validation_rejected, undrawable, generated,
                 generated_read)


@dataclass(frozen=True)
class _Split:
    """The train and validation rows written: those read, each with its share of data.additions' questions."""

    train: list[LabeledQuestion]
    validation: list[LabeledQuestion]
    carved_share: float | None  # None where data.validation_file was read whole
    missing_a_split: dict[str, list[str]]


def _split(params: DataParams, seed: int, read: _Read) -> _Split:
    """Warns of a carved split well over data.validation_fraction and of classes missing a split; stops on an empty
    validation split."""
    carved_share = None if params.validation_file else _carved_share(params.validation_fraction, len(read.validation),
                                                                       len(read.official_train))
    added_train, added_validation = stable_split(read.added.rows, params.validation_fraction, seed)
    train, validation = read.train + added_train, read.validation + added_validation
    if not validation:
        # a test file that copies train leaves every class so: said, not only "add labeled questions"
        undrawable = (f"; none could be drawn from {len(read.undrawable)} class(es) of 3 or more "
                      f"({first_of([repr(c) for c in sorted(read.undrawable)])}): each of their training rows repeats, is empty, is a "
                      "test or standard question, or fails a check of validate's on its own" if read.undrawable else "")
        raise ReaderError(f"{params.dataset}: the validation split carved from train is empty (only classes with at "
                          f"least 3 training rows give it rows{undrawable}), so early stopping and every selection "
                          "would have nothing to judge by: add labeled questions, or name a data.validation_file")
    missing_a_split = classes_missing_a_split(train, validation, read.undrawable)  # one warning, for both facts
    return _Split(train, validation, carved_share, missing_a_split)


def _write_data(out_dir: Path, params: DataParams, read: _Read, split: _Split) -> None:
    with atomic_directory(out_dir) as staging:  # the folder's files replace the last run's together or not at all
        read.catalog.save(staging / "catalog.jsonl")
        save_questions(staging / "train.jsonl", split.train)
        save_questions(staging / "validation.jsonl", split.validation)
        save_questions(staging / "test.jsonl", read.splits.test.rows)
        if params.generated.path:  # all attributed rows: augment uses those whose origins are all in its train
            save_questions(staging / "generated.jsonl", read.generated.rows)


def _report(params: DataParams, read: _Read, split: _Split, started: float) -> dict:
    """reports/ingest.json: what was read, split, quarantined and left out, and how long it took since `started`."""
    splits, added, catalog = read.splits, read.added, read.catalog
    return {
        "dataset": params.dataset,
        "classes": len(catalog),
        "derived_classes": sum(q.derived for q in catalog.questions),
        "added": {"questions": len(added.rows), "classes": len(catalog) - len(splits.catalog)},
        "read": {"train": len(splits.train.rows) + len(splits.train.rejected), "test": len(splits.test.rows) + len(splits.test.rejected),
                 **({"validation": len(read.validation) + len(read.validation_rejected)} if params.validation_file else {}),
                 # the retrain flow's accepted rows (data.additions): train's, test's and these rows read are the rows
                 # kept, quarantined (less generated rows quarantined) or left out by data.imbalance_ratio
                 **({"additions": len(added.rows) + len(added.rejected)} if added.rows or added.rejected else {})},
        "rows": {"train": len(split.train), "validation": len(split.validation), "test": len(splits.test.rows)},
        "validation_from": params.validation_file or f"train ({params.validation_fraction:g})",
        # what the carved split took of the official training rows: more than asked where classes are small
        **({"validation_share_of_train": round(split.carved_share, 4)} if split.carved_share is not None else {}),
        **split.missing_a_split,
        **({"imbalance": {"ratio": params.imbalance_ratio, "train_rows_left_out": read.left_out_count,
                          "per_class": _class_counts(read.official_train)}} if params.imbalance_ratio else {}),
        "quarantined": len(read.rejected),
        **({"generated": _generated_report(read.generated, read.generated_read, split.train,
                                           _left_out(splits.train.rows, read.official_train), bool(params.imbalance_ratio))}
           if params.generated.path else {}),
        "seconds": round(time.perf_counter() - started, 2),
    }


QUARANTINED_SAID = 10  # quarantined rows named one a line in the log; the rest are counted (all are in the file)


def _log_summary(params: DataParams, read: _Read, report: dict, quarantine_path: Path, out_dir: Path) -> None:
    """The report's gist, then the first `QUARANTINED_SAID` quarantined rows, and how many more the file holds."""
    log.info(
        "ingest %s: %d classes; train %d, validation %d, test %d; %d row(s) quarantined to %s; wrote %s in %.1fs",
        params.dataset, report["classes"], report["rows"]["train"], report["rows"]["validation"], report["rows"]["test"],
        len(read.rejected), quarantine_path, out_dir, report["seconds"],
    )
    if params.imbalance_ratio:
        log.info("ingest: data.imbalance_ratio %g left out %d of %d official training rows; kept per class: %s",
                 params.imbalance_ratio, read.left_out_count, len(read.splits.train.rows), report["imbalance"]["per_class"])
    if params.generated.path:
        log.info("ingest: generated rows (%s): %s", params.generated.path,
                 ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in report["generated"].items()))
    for row in read.rejected[:QUARANTINED_SAID]:
        log.warning("quarantined %s, line %d: %s", row.file, row.line, row.reason)
    if len(read.rejected) > QUARANTINED_SAID:  # a line a row was thousands of warnings for a bad generated file
        log.warning("ingest: and %d more quarantined row(s); every one, with its file, line and reason, is in %s",
                    len(read.rejected) - QUARANTINED_SAID, quarantine_path)


def run(params: DataParams, seed: int, out_dir: Path, quarantine_path: Path, report_path: Path,
        max_text_chars: int | None = None) -> dict:
    """`max_text_chars`: validate's bound (validate.max_text_chars), so that the validation draw passes over a row
    validate would take out of validation for its length."""
    started = time.perf_counter()
    with _quarantined_if_stopped(quarantine_path):
        read = _read(params, seed, max_text_chars)
    split = _split(params, seed, read)
    _write_data(out_dir, params, read, split)
    _write_quarantine(quarantine_path, read.rejected)
    report = _report(params, read, split, started)
    write_json(report_path, report)
    _log_summary(params, read, report, quarantine_path, out_dir)
    return report
