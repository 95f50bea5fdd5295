"""Catalogs of standard questions: a catalog file's rows, the shipped catalogs, texts derived for classes a catalog
lacks, and labels read as the catalog's ids where they differ only in how they are written."""

from __future__ import annotations

import logging
import re
from importlib import resources
from pathlib import Path
from typing import Callable

from tqc.readers.results import MissingColumns, ReaderError, ReadResult
from tqc.readers.tables import read_table
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, file_and_line
from tqc.text import ALIKE, catalog_label_key, first_of, has_words, ids_by_label_key, normalise

log = logging.getLogger(__package__)  # "tqc.readers" for every reader: incoming filters that one logger


def label_in_words(class_id: str) -> str:
    """A derived standard question for a class with no catalog text: its label name in words, split at punctuation
    and at camel case (`lostCard`, `HTTPError`: `lost Card`, `HTTP Error`), the case kept."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", class_id)
    return re.sub(r"[_\-:/.\s]+", " ", spaced).strip()


def read_catalog_file(path: Path, id_column: str = "class_id", text_column: str = "text",
                      taken: dict[str, str] | None = None, encoding: str | None = None) -> Catalog:
    """A catalog file; an error naming the file and line for a row without text, or whose text repeats
    another class's (within the file, or one of `taken`: normalised text → the class id that has it)."""
    return Catalog([question for question, _ in read_catalog_rows(path, id_column, text_column, taken,
                                                                  encoding=encoding)])


def read_catalog_rows(path: Path, id_column: str = "class_id", text_column: str = "text",
                      taken: dict[str, str] | None = None, content: bytes | None = None,
                      encoding: str | None = None) -> list[tuple[StandardQuestion, int]]:
    """`read_catalog_file`'s standard questions, each with the file line it was read from (`content`, `encoding`: as
    `read_table`)."""
    result = read_table(path, text_column=text_column, label_column=id_column, content=content, encoding=encoding)
    if result.rejected:
        bad = result.rejected[0]
        message = f"{bad.file}, line {bad.line}: catalog row unusable: {bad.reason}"
        missing = list(bad.missing_columns)
        raise MissingColumns(message, missing) if missing else ReaderError(message)
    if not result.rows:  # a header alone: every class would get a derived text, one warning each, and no error
        raise ReaderError(f"{path}: the catalog file has no rows, only its header: each row gives a class its standard "
                          "question")
    owners, id_lines = dict(taken or {}), {}
    for row in result.rows:
        line = int(row.source.rsplit(":", 1)[1])
        first = id_lines.setdefault(row.class_id, line)
        if first != line:
            raise ReaderError(f"{path}, line {line}: catalog row unusable: class {row.class_id!r} is already given at "
                              f"line {first}; each class id once")
        if not has_words(row.text):  # zero-width, control or private-use characters alone too: validate would stop
            raise ReaderError(f"{path}, line {line}: catalog row unusable: class {row.class_id!r} has an empty standard "
                              "question (no character a tokenizer reads; leave the class out to get a text derived from "
                              "its label)")
        owner = owners.setdefault(normalise(row.text), row.class_id)
        if owner != row.class_id:
            raise ReaderError(f"{path}, line {line}: catalog row unusable: class {row.class_id!r} has the standard question "
                              f"of class {owner!r} ({row.text!r}); each class needs its own")
    return [(StandardQuestion(class_id=row.class_id, text=row.text), id_lines[row.class_id]) for row in result.rows]


def load_catalog(path: Path, csv_encoding: str | None = None) -> Catalog:
    """A catalog as a matcher answers with one: a CSV read as ingest reads `data.custom.catalog`, with its default
    columns class_id and text, in `csv_encoding` (None: UTF-8, as `decode_file`); any other file
    (data/validated/catalog.jsonl, or that file under another name) as the pipeline's JSONL (`Catalog.load`), which
    the pipeline writes in UTF-8. A bad row is an error naming the file and the line either way."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return read_catalog_file(path, encoding=csv_encoding)
    catalog = Catalog.load(path)
    _require_words(catalog, path)
    return catalog


def _require_words(catalog: Catalog, path: Path) -> None:
    """A JSONL catalog's class ids and standard questions each hold a character a tokenizer reads, as a CSV's must
    (`read_catalog_rows`): a hand-made file's empty text was served as an answer, and an empty id as a class."""
    for position, question in enumerate(catalog.questions):
        empty = [field for field in ("class_id", "text") if not has_words(getattr(question, field))]
        if empty:
            from tqc.io import numbered_jsonl

            line = numbered_jsonl(path)[position][0]  # read again only to name the line: Catalog keeps the order
            raise ReaderError(f"{path}, line {line}: catalog row unusable: {' and '.join(empty)} empty (no character "
                              f"a tokenizer reads): {question.class_id!r}, {question.text!r}")


def shipped_catalog(dataset: str) -> Catalog:
    with resources.as_file(resources.files("tqc") / "catalogs" / f"{dataset}.csv") as path:
        return read_catalog_file(path)


def with_derived_classes(catalog: Catalog, rows: list[LabeledQuestion], catalog_given: bool = True) -> Catalog:
    """Add a derived standard question for each training label the catalog lacks, with a warning (one line for all,
    where no catalog file was given: every class derives by choice). A derived text that is empty (`___`) or another
    class's (`lost_card` and `lost-card`, or a catalog text) is an error naming where the label is first used: the
    validate contract needs each class its own text."""
    first_use = {}
    for row in rows:
        first_use.setdefault(row.class_id, row.source)
    owners = {normalise(q.text): q.class_id for q in catalog.questions}
    derived, alike = [], {}
    for class_id in sorted(set(first_use) - set(catalog.class_ids)):
        text, where = label_in_words(class_id), file_and_line(first_use[class_id])
        twin = alike.setdefault(catalog_label_key(class_id), class_id)
        if twin != class_id:  # `1` and `1.0`: their derived texts differ, but a test `1.00` could be read as neither
            raise ReaderError(f"{where}: labels {twin!r} (first at {file_and_line(first_use[twin])}) and {class_id!r} are "
                              f"{ALIKE}, and the catalog has neither: one class written two ways, or two? write the "
                              "label one way, or give each a standard question in the catalog")
        if not has_words(text):  # `___`, or a label of private-use or control characters: validate would stop
            raise ReaderError(f"{where}: class {class_id!r} has no catalog text and no words to derive one from; "
                              "give it a standard question in the catalog")
        owner = owners.setdefault(normalise(text), class_id)
        if owner != class_id:
            owner_at = f" (derived too, its label first at {file_and_line(first_use[owner])})" if owner in first_use else " in the catalog"
            raise ReaderError(f"{where}: class {class_id!r} has no catalog text, and the one derived from its label, {text!r}, "
                              f"is the text of class {owner!r}{owner_at}; give one of them a standard question in the catalog")
        if catalog_given:
            log.warning("%s: class %r has no catalog text; using the derived text %r (a label missing from the catalog, "
                        "or misspelt there?)", where, class_id, text)
        derived.append(StandardQuestion(class_id, text, derived=True))
    if derived and not catalog_given:
        log.info("data.custom.catalog is not set: %d classes take their labels in words as standard questions: %s",
                 len(derived), first_of([f"{q.class_id!r} → {q.text!r}" for q in derived]))
    return Catalog(catalog.questions + derived)


def with_added_classes(catalog: Catalog, added: list[StandardQuestion]) -> Catalog:
    """New class ids are appended (existing indices never move); a known id keeps its text."""
    return Catalog(catalog.questions + [q for q in added if q.class_id not in catalog])


def alike_id_in(catalog: Catalog) -> Callable[[str], str | None]:
    """label → the catalog id it is like (`catalog_label_key`) when exactly one is; None for none, or for several
    (hum and HUM both ids: neither is chosen)."""
    by_key = ids_by_label_key(catalog.class_ids)

    def alike(label: str) -> str | None:
        matches = by_key.get(catalog_label_key(label), [])
        return matches[0] if len(matches) == 1 else None

    return alike


def labels_read_as_catalog(result: ReadResult, catalog: Catalog) -> ReadResult:
    """Rows whose label is not a catalog id but differs from exactly one only by case, width, invisible characters or
    a float's ".0" take that id, with a warning a label. Else each such label would become a class of its own, with a
    derived standard question, while the catalog's class kept no rows and its test questions went unanswered."""
    from collections import Counter
    from dataclasses import replace

    known, alike, read_as, first = set(catalog.class_ids), alike_id_in(catalog), {}, {}
    for row in result.rows:
        if row.class_id not in known and row.class_id not in read_as and (class_id := alike(row.class_id)):
            read_as[row.class_id], first[row.class_id] = class_id, row.source
    if not read_as:
        return result
    counts = Counter(row.class_id for row in result.rows if row.class_id in read_as)
    for label, class_id in read_as.items():
        # "class", not "the catalog's": a test label may be read as a class derived from train's labels
        log.warning("%s: label %r read as class %r (%d row(s)): labels are matched to the classes' ids case- "
                    "and width-insensitively, and 1.0 as 1", file_and_line(first[label]), label, class_id, counts[label])
    rows = [replace(row, class_id=read_as.get(row.class_id, row.class_id)) for row in result.rows]
    return ReadResult(rows, result.rejected, result.named_sources)
