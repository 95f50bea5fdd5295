"""The data model: a catalog of standard questions and labeled user questions."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tqc.errors import InputError
from tqc.io import DataFileError, numbered_jsonl, write_jsonl


@dataclass(frozen=True)
class StandardQuestion:
    class_id: str
    text: str
    derived: bool = False  # True when no catalog text existed and one was made from the label


@dataclass(frozen=True, slots=True)  # slots: a file's rows are held all at once, and a __dict__ each doubled them
class LabeledQuestion:
    text: str
    class_id: str
    source: str = ""  # "file:line" it was read from, for quarantine and error messages
    generated: bool = False  # True for rows made by augmentation (never in validation or test)
    # A row made offline (data.generated): the sources of the training question(s) it was made
    # from. Augment uses it only when all of them are in train, so nothing made from a
    # validation question is trained on.
    origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "origins", tuple(self.origins))  # JSON gives a list


def split_source(source: str) -> tuple[str, int | None]:
    """A row's `source` ("file:line") as (file, line); a source with no line number after its last colon is all file
    (a Windows drive's colon included), with line None."""
    file, _, line = source.rpartition(":")
    return (file, int(line)) if file and line.isdigit() else (source, None)


def quarantine_reason(expectations: list[str], reason: str | None = None) -> str:
    """A quarantined row's reason: what its check said of it, or where nothing more is known than the expectations it
    fails, their names (validate's rows and the retrain inbox's alike)."""
    return reason or ", ".join(expectations)


def file_and_line(source: str | None, unnamed: str = "training rows") -> str:
    """A row's `source` ("file:line") as errors and quarantine reasons write it: "file, line N"; `unnamed` for a row
    of no file."""
    if not source:
        return unnamed
    file, line = split_source(source)
    return f"{file}, line {line}" if line is not None else source


def usable_generated(questions: list[LabeledQuestion], generated: list[LabeledQuestion]) -> list[LabeledQuestion]:
    """The rows made offline whose every origin is one of these training rows: a row that may have
    been made from a validation question (after any re-split) is never trained on."""
    in_train = {q.source for q in questions}
    return [row for row in generated if row.origins and set(row.origins) <= in_train]


class UnknownClass(InputError, ValueError):
    """A question whose class the catalog lacks: the two were made by different runs or for different data."""


class StaleNegatives(InputError, ValueError):
    """A mined-negatives file that does not fit the training rows or the catalog it is used with."""


class StaleClassifier(InputError, ValueError):
    """A classifier whose output rows are another catalog's classes, or in another order."""


@dataclass
class Catalog:
    """Class id → standard-question text, in a fixed order that defines class indices."""

    questions: list[StandardQuestion] = field(default_factory=list)

    def __post_init__(self) -> None:
        ids = [q.class_id for q in self.questions]
        duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
        if duplicates:
            raise ValueError(f"catalog has duplicate class ids: {duplicates}")
        self._index = {q.class_id: i for i, q in enumerate(self.questions)}
        # Built once, not at each read: callers index them in loops (each mined row's negatives, each served answer's
        # top k, each stage-two batch's candidates), where a list rebuilt per read cost O(P) an index. A catalog is not
        # changed after it is made, and these lists are not to be changed either.
        self._class_ids = ids
        self._texts = [q.text for q in self.questions]

    def __len__(self) -> int:
        return len(self.questions)

    def __contains__(self, class_id: str) -> bool:
        return class_id in self._index

    @property
    def class_ids(self) -> list[str]:
        return self._class_ids

    @property
    def texts(self) -> list[str]:
        return self._texts

    def index(self, class_id: str) -> int:
        return self._index[class_id]

    def save(self, path: str | Path) -> None:
        write_jsonl(path, (asdict(q) for q in self.questions))

    @classmethod
    def load(cls, path: str | Path) -> "Catalog":
        """A catalog file (`save`'s JSONL); a line that is no standard question, or a class id given twice, is an
        error naming the file and the line."""
        questions, first_line = [], {}
        for line, row in numbered_jsonl(path):
            question = _standard_question(row, f"{path}, line {line}")
            if question.class_id in first_line:
                raise DataFileError(f"{path}, line {line}: class id {question.class_id!r} again (first on line "
                                    f"{first_line[question.class_id]}); a catalog has one standard question a class")
            first_line[question.class_id] = line
            questions.append(question)
        return cls(questions)


CATALOG_ROW = {"class_id": str, "text": str, "derived": bool}  # a catalog line's keys and their types; derived optional


def _standard_question(row: object, where: str) -> StandardQuestion:
    return StandardQuestion(**_checked_row(row, where, CATALOG_ROW, ("class_id", "text"), "catalog line",
                                           "is this a file of labeled questions?"))


QUESTION_ROW = {"text": str, "class_id": str, "source": str, "generated": bool, "origins": list}  # a labeled line's keys


def _labeled_question(row: object, where: str) -> LabeledQuestion:
    return LabeledQuestion(**_checked_row(row, where, QUESTION_ROW, ("text", "class_id"), "labeled question",
                                          "is this a catalog?"))


def _checked_row(row: object, where: str, fields: dict[str, type], required: tuple[str, ...], what: str, guess: str) -> dict:
    """A JSONL line with the `required` keys and no others than `fields`, each of its type, or an error naming the
    file and the line."""
    if not isinstance(row, dict):
        raise DataFileError(f"{where}: a {what} is a JSON object with {' and '.join(required)}, not {type(row).__name__}")
    unknown, missing = sorted(set(row) - set(fields)), [k for k in required if k not in row]
    if unknown or missing:
        said = "; ".join(part for part in (f"no {', '.join(missing)}" if missing else "",
                                           f"unexpected {', '.join(unknown)}" if unknown else "") if part)
        optional = [key for key in fields if key not in required]
        raise DataFileError(f"{where}: not a {what} ({said}); a {what} has {', '.join(required)} and optionally "
                            f"{', '.join(optional)} ({guess})")
    wrong = [key for key, value in row.items() if not isinstance(value, fields[key])]
    if wrong:
        raise DataFileError(f"{where}: " + ", ".join(f"{key} is {type(row[key]).__name__}, not {fields[key].__name__}"
                                                     for key in wrong))
    return row


def _record(question: LabeledQuestion) -> dict:
    record = asdict(question)
    if not record["origins"]:  # most rows have none; their files stay as they were before the field existed
        del record["origins"]
    return record


def save_questions(path: str | Path, questions: list[LabeledQuestion]) -> int:
    return write_jsonl(path, (_record(q) for q in questions))


def load_questions(path: str | Path) -> list[LabeledQuestion]:
    """A file of labeled questions (`save_questions`' JSONL); a line that is no labeled question is an error naming
    the file and the line."""
    return [_labeled_question(row, f"{path}, line {line}") for line, row in numbered_jsonl(path)]


def gold_indices(questions: list[LabeledQuestion], catalog: Catalog) -> np.ndarray:
    """(N,) catalog index of each question's class; a class the catalog lacks is an error naming the first such row."""
    unknown = next((i for i, q in enumerate(questions) if q.class_id not in catalog), None)
    if unknown is not None:
        question = questions[unknown]
        raise UnknownClass(
            f"question {unknown + 1} of {len(questions)} ({question.source or 'no source recorded'}: {question.text!r}) "
            f"is class {question.class_id!r}, which the catalog of {len(catalog)} classes lacks: the questions and the "
            "catalog come from different runs or datasets (re-run the stages before this one)")
    return np.array([catalog.index(q.class_id) for q in questions], dtype=np.int64)
