"""The file formats read line by line: TREC's label lines, COVID-Q's headerless pairs, and a user's CSV (with a header)
or JSONL through a column mapping. A line that cannot be parsed becomes a `RejectedRow` naming its file and line."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from tqc.readers.decoding import decode_file, iter_lines, stray_carriage_returns_as_spaces
from tqc.readers.results import MissingColumns, ReaderError, ReadResult, RejectedRow
from tqc.schema import LabeledQuestion
from tqc.text import normalise

JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson"})
TABLE_SUFFIXES = frozenset({".csv", *JSONL_SUFFIXES})  # files read through a column mapping: a user's CSV or JSONL
TREC_LINE = re.compile(r"^(?P<coarse>[A-Z]+):(?P<fine>[a-z]+)\s+(?P<text>\S.*)$")
TREC_STRAY_CR = re.compile(r"\r(?!\n)(?![A-Z]+:[a-z]+\s)")  # a lone CR that no label follows


def read_trec(path: Path, granularity: str) -> ReadResult:
    """TREC `COARSE:fine question text` lines; TREC-6 keeps the coarse label, TREC-50 the full one."""
    result = ReadResult()
    # In a file whose lines end in LF, a lone CR before a label ends a line (an old-Mac line pasted in); one inside a
    # question is a stray, read as a space: a line break there would keep half a question and shift every later line
    # number. A file whose lines end in CR keeps each CR as its line break.
    text = stray_carriage_returns_as_spaces(decode_file(path), path, stray=TREC_STRAY_CR)
    for line_number, line in enumerate(iter_lines(text), start=1):
        if not line.strip():
            continue
        match = TREC_LINE.match(line.strip())
        if match is None:
            result.rejected.append(RejectedRow(str(path), line_number, "not a 'COARSE:fine question' TREC line", line))
            continue
        label = match["coarse"] if granularity == "coarse" else f"{match['coarse']}:{match['fine']}"
        result.rows.append(LabeledQuestion(match["text"].strip(), label, f"{path}:{line_number}"))
    return result


def _file_text(path: Path, header: bool = False, content: bytes | None = None, encoding: str | None = None) -> str:
    """The text a CSV or JSONL reader parses: the file decoded (`encoding`: as `decode_file`), its stray carriage returns
    read as spaces (in JSONL they may be JSON whitespace, never a line break); blank is an error."""
    text = stray_carriage_returns_as_spaces(decode_file(path, content, encoding), path, header)
    if not text or text.isspace():  # what `not text.strip()` says, without a copy of the whole file
        raise ReaderError(f"{path}: file is empty")
    return text


def _csv_records(path: Path, text: str) -> Iterator[tuple[int, list[str]]]:
    """(line number of the record's start, fields) for every CSV record of `text` but blank lines, one at a time (a
    file's records are not all held at once); quoted newlines kept."""
    # Long rows (a 1 MB question) are read whole and judged by the validate stage's length bound.
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))
    # strict: a stray quote (`"Jaws" was directed by whom?`, or one never closed) is an error naming its
    # line, where the lenient default would drop the quotes or swallow the next rows into one field.
    lines = _RecordLines(text)
    reader = csv.reader(lines, strict=True)
    try:
        line_number = reader.line_num + 1
        for fields in reader:
            if not _blank(fields, lines.taken()):
                yield line_number, fields
            line_number = reader.line_num + 1
    except csv.Error as exc:
        if reader.line_num == line_number:
            raise ReaderError(f"{path}, line {line_number}: malformed CSV: {exc}") from None
        # a quote that opens a field and never closes runs the record on over the next lines until the parser gives up
        raise ReaderError(f"{path}, line {line_number}: malformed CSV: the record that starts on this line runs on to line "
                          f"{reader.line_num}, where the parser stopped ({exc}): a quote opened on line {line_number} "
                          "and not closed there, or stray text after a closing quote?") from None


# A line with its line break (\n, \r\n or \r), as csv.reader takes lines, or the last one without
LINE_WITH_BREAK = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


class _RecordLines:
    """A text's lines as csv.reader takes them, keeping those of the record it is reading: a blank line and a record
    of one empty quoted field have the same fields, and only their lines tell them apart (the text is not held a
    second time: neither as a list of lines nor as io.StringIO, which copies it at four bytes a character)."""

    def __init__(self, text: str):
        self._lines, self._taken = (match.group() for match in LINE_WITH_BREAK.finditer(text)), []

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = next(self._lines)
        self._taken.append(line)
        return line

    def taken(self) -> list[str]:
        """The lines taken since the last call: the record just read."""
        taken, self._taken = self._taken, []
        return taken


def _blank(fields: list[str], lines: list[str]) -> bool:
    """A blank line (no field, or one of only spaces) is not a record. A record of empty fields (`,`), or of an
    empty quoted one (`""`, `"  "`: the same fields as a blank line, so its `lines` tell), is one, and is judged
    (quarantined) like any other: skipping it would lose a row silently."""
    return len(fields) <= 1 and not "".join(fields).strip() and not any('"' in line for line in lines)


def row_as_csv(row: LabeledQuestion) -> str:
    """A labeled question as the `text,label` CSV line a quarantine record shows, quoted where a field needs it."""
    return csv_record([row.text, row.class_id])


def csv_record(fields: list) -> str:
    """A record as CSV, with no line terminator, each field quoted where a reader needs it: a quarantined
    `"Paris, France?",LOC,extra` shows its three fields, where joining them with commas read as four, and a field
    holding a line break (`\n` or a lone `\r`) stays one field. The writer quotes only the line-break characters of
    its own terminator, so it is given both and its terminator cut off."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\r\n").writerow(fields)
    return buffer.getvalue()[:-2]


def _swallowed_rows(fields: list[str], columns: int, start_line: int, label_index: int, labels: _FileLabels) -> str:
    """Why a record looks like rows swallowed by a quote never closed ("" when it does not): a line inside one of its
    quoted fields reads as a whole row of `columns` cells whose label cell is a label the file's rows use
    (`What does LOL mean?,DESC`), or a single word as labels are where the rest of the line asks a question
    (`Who wrote Jaws?,HUM`: a class all of whose rows were swallowed, in a file sorted by label) or where the file's
    labels never repeat (a catalog's class ids: `B,What is b?`). csv's strict mode catches a stray quote only where a
    letter follows it; one that a comma follows (`a pizza of 12",NUM`) closes a field that began rows earlier, and
    every row between would become one question with the last one's label. A real question over two lines
    (`"Hi, there\nI lost my card"`) has a greeting there, which neither asks nor ends in a label the file uses."""
    lines_before = 0
    for cell_text in fields:
        segments = cell_text.split("\n")
        for number, segment in enumerate(segments[:-1]):  # the last one goes on with the record's next cell
            cells = next(csv.reader([segment]), [])
            if len(cells) != columns or not all(cell.strip() for cell in cells):
                continue
            label = cells[label_index].strip()
            asks = any(cell.strip().endswith("?") for index, cell in enumerate(cells) if index != label_index)
            if label in labels.seen or ((asks or not labels.repeat) and len(label.split()) == 1):
                end = start_line + sum(f.count("\n") for f in fields)
                return (f"a quoted field runs from line {start_line} to {end}, and its line {start_line + lines_before + number} "
                        f"reads as a row of its own ({segment!r}): a quote never closed? (rejected, not read as one question)")
        lines_before += len(segments) - 1
    return ""


@dataclass(frozen=True)
class _FileLabels:
    """The labels a file's records end in, what a swallowed row would end in too; `repeat`: whether one of them
    labels two records, as labeled questions' do and a catalog's class ids never do."""

    seen: frozenset[str]
    repeat: bool


def _file_labels(records: Iterator[tuple[int, list[str]]], columns: int, label_index: int | None) -> _FileLabels:
    """`records`' labels, read through them all: the first of two passes over a file, which also says a malformed
    line before anything else is judged. `label_index` None: no label column (the pass only parses)."""
    seen, repeat = set(), False
    for _, fields in records:
        if label_index is not None and len(fields) == columns:
            label = fields[label_index].strip()
            repeat = repeat or label in seen
            seen.add(label)
    return _FileLabels(frozenset(seen), repeat)


def read_headerless_pairs(path: Path) -> ReadResult:
    """COVID-Q split files: no header, two columns (question, label)."""
    result = ReadResult()
    text = _file_text(path)
    labels = _file_labels(_csv_records(path, text), 2, 1)
    for line_number, fields in _csv_records(path, text):
        swallowed = _swallowed_rows(fields, 2, line_number, 1, labels)
        if swallowed:
            result.rejected.append(RejectedRow(str(path), line_number, swallowed, csv_record(fields)))
            continue
        if len(fields) != 2:
            result.rejected.append(
                RejectedRow(str(path), line_number, f"expected 2 columns (question, label), found {len(fields)}", csv_record(fields))
            )
            continue
        text, label = (f.strip() for f in fields)
        if not normalise(label):  # a zero-width space alone is no label either
            result.rejected.append(RejectedRow(str(path), line_number, "empty label", csv_record(fields)))
            continue
        result.rows.append(LabeledQuestion(text, label, f"{path}:{line_number}"))
    return result


@dataclass(frozen=True)
class _Unusable:
    """A record that could not be parsed, and why."""

    reason: str


def read_table(path: Path, text_column: str, label_column: str, source_column: str | None = None,
               content: bytes | None = None, encoding: str | None = None) -> ReadResult:
    """A user's CSV (with header) or JSONL file, through a column mapping; `source_column`, for
    rows made offline, names the question each row was made from (kept in `named_sources`). `content`: the file's
    bytes, where the caller read them itself (the retrain flow parses the very bytes it hashed). `encoding`:
    data.custom.encoding (None: UTF-8, stray bytes as Windows-1252)."""
    columns = [c for c in (text_column, label_column, source_column) if c is not None]
    records = (_jsonl_records(path, content, encoding) if is_jsonl(path)
               else _csv_dict_records(path, columns, content, encoding))
    result, labels = ReadResult(), {}  # labels: each one string, however many rows name it
    keys = _KeysSeen(columns)  # a JSONL file has no header: a column no record has is found only at the end
    for line_number, record, original in records:
        keys.see(line_number, record)
        if isinstance(record, _Unusable):
            absent, reason = [], record.reason
        else:
            absent = [c for c in columns if c not in record]  # the mapped columns it lacks
            reason = _unusable_values(record, absent, text_column, label_column, source_column)
        if reason:  # a CSV record's content is written out only here, for the few rows rejected
            result.rejected.append(RejectedRow(str(path), line_number, reason,
                                               csv_record(original) if isinstance(original, list) else original,
                                               tuple(absent)))
            continue
        text, label = record[text_column], str(record[label_column]).strip()
        source = f"{path}:{line_number}"
        result.rows.append(LabeledQuestion((text or "").strip(), labels.setdefault(label, label), source))
        if source_column is not None:
            result.named_sources[source] = (record[source_column] or "").strip()
    keys.raise_if_never_seen(path)
    return result


class _KeysSeen:
    """Which of a mapping's columns some JSONL record has. One that no record has is the mapping's fault or the file's
    (`text_column: utterance` over records keyed `text`), as a CSV header without it is: said once, naming the file,
    not as every line rejected. A few records without it among others that have it are rejected line by line, and so
    are the few objects of a file whose lines are mostly no JSON object: those lines are what is wrong there, and
    each one's rejection names it, where the key would be blamed."""

    def __init__(self, columns: list[str]):
        self.absent, self.records, self.unparsed, self.first = list(columns), 0, 0, None

    def see(self, line_number: int, record: dict | _Unusable) -> None:
        if isinstance(record, dict):  # a CSV record has every column: its header was checked
            self.records += 1
            self.first = self.first or (line_number, list(record))
            if self.absent:
                self.absent = [c for c in self.absent if c not in record]
        else:
            self.unparsed += 1

    def raise_if_never_seen(self, path: Path) -> None:
        if self.records > self.unparsed and self.absent:
            line, has = self.first
            raise MissingColumns(f"{path}: {_missing_columns(self.absent)} in all {self.records} record(s): line {line} "
                                 f"has {has}", self.absent)


def _unusable_values(record: dict, missing: list[str], text_column: str, label_column: str,
                     source_column: str | None) -> str:
    """Why a parsed record's values cannot be a row ("" when they can); `missing`: the mapped columns it lacks. JSON
    values must be what a CSV cell would hold: a string (null: empty) or, for the label, an integer id, or a whole
    number written as a float (`3.0`: pandas writes an integer column that holds a missing value so), read as a CSV's
    `3.0` is, which takes the catalog's `3` where there is one. Anything else (2.5, true, a list) is refused rather
    than turned into a class named "2.5" or "True"."""
    if missing:
        return f"{_missing_columns(missing)}: the record has {list(record)}"
    for column in (text_column, source_column):
        if column is not None and not isinstance(record[column], (str, type(None))):
            return f"{column!r} is a JSON {type(record[column]).__name__}, not a string"
    label = record[label_column]
    whole_float = isinstance(label, float) and label.is_integer()
    if isinstance(label, bool) or not (isinstance(label, (str, int, type(None))) or whole_float):
        return f"label {label_column!r} is a JSON {type(label).__name__} ({label!r}), not a string or a whole number"
    for column in (text_column, label_column, source_column):
        if column is not None and isinstance(record[column], str) and not _encodable(record[column]):
            return f"{column!r} holds a lone surrogate (a JSON \\ud800-\\udfff escape that is half a pair), not text"
    return "" if label is not None and _normalised_label(str(label)) else "empty label"  # a zero-width space alone is none


_normalised_label = lru_cache(maxsize=4096)(normalise)  # a file names a few labels many times over


def _missing_columns(missing: list[str]) -> str:
    return f"missing column(s) {missing}"


def _encodable(text: str) -> bool:
    """Whether `text` can be written as UTF-8: JSON's escapes can spell half a surrogate pair, which no
    output file could hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _csv_dict_records(path: Path, columns: list[str], content: bytes | None = None,
                      encoding: str | None = None) -> Iterator[tuple[int, dict | _Unusable, list[str]]]:
    """(line, record or the reason it is unusable, its fields, which `csv_record` writes out for a rejected one) for each
    data row, one at a time. A header without one of `columns` is an error about the header, not a rejection of every
    row; it, and a malformed line anywhere, is raised here, before any row is given."""
    text = _file_text(path, header=True, content=content, encoding=encoding)
    # Two passes over the text, where the records were held all at once: this one reads the labels (and says a
    # malformed line before the header's problems, as before); the second gives the rows
    records = _csv_records(path, text)
    first = next(records, None)
    if first is None:
        raise ReaderError(f"{path}: file is empty")
    header_line, header = first[0], [h.strip() for h in first[1]]  # the first record that is not blank
    # a label column to tell rows swallowed by an unclosed quote from a question over several lines (none: texts only)
    label_index = header.index(columns[1]) if len(columns) > 1 and columns[1] in header else None
    if header and header[0].startswith(("{", "[")):  # JSON under a .json or .txt name: its keys would be blamed as columns
        raise ReaderError(f"{path}, line {header_line}: JSON, not a CSV header; a file of one JSON object a line is read "
                          f"by its name: {' or '.join(sorted(JSONL_SUFFIXES))} (a JSON array: write it one object a line)")
    labels = _file_labels(records, len(header), label_index)
    # Unnamed columns (a stray cell beside the table, as spreadsheets export it) hold nothing a mapping can name
    repeated = sorted({h for h in header if h and header.count(h) > 1})
    if repeated:
        raise ReaderError(f"{path}, line {header_line}: the header repeats column(s) {repeated}")
    missing = [c for c in columns if c not in header]
    if missing:
        raise MissingColumns(f"{path}, line {header_line}: {_missing_columns(missing)}: the header has {header}", missing)
    return _csv_rows(path, text, header, header_line, label_index, labels)


def _csv_rows(path: Path, text: str, header: list[str], header_line: int, label_index: int | None,
              labels: _FileLabels) -> Iterator[tuple[int, dict | _Unusable, list[str]]]:
    """`_csv_dict_records`' rows: the second pass over `text`, whose checked header is `header`."""
    records = _csv_records(path, text)
    next(records)  # the header
    for line_number, fields in records:
        swallowed = _swallowed_rows(fields, len(header), line_number, label_index, labels) if label_index is not None else ""
        if swallowed:
            yield line_number, _Unusable(swallowed), fields
        elif len(fields) != len(header):
            yield line_number, _Unusable(f"expected {len(header)} columns as in the header, found {len(fields)}"), fields
        elif [f.strip() for f in fields] == header:  # two exports joined: its label would become a class named after the column
            yield line_number, _Unusable(f"the header again (line {header_line}): two files joined?"), fields
        else:
            yield line_number, {h: f for h, f in zip(header, fields) if h}, fields


def read_texts(path: Path, column: str, encoding: str | None = None) -> list[tuple[int, str]]:
    """(line, text) of the `column` of every row of a CSV (with a header) or JSONL file: questions to score, with no
    labels. A row that cannot give one is an error naming its line (nothing to quarantine it to: the caller is a
    person). `encoding`: the file's codec, as `decode_file` takes it (None: UTF-8)."""
    return [(line, text) for line, text, _ in _texts_and_labels(path, column, None, encoding)]


def read_unlabelled(path: Path, column: str, label_column: str,
                    encoding: str | None = None) -> tuple[list[tuple[int, str]], int]:
    """(line, text) of the rows of a partly labelled file whose `label_column` is empty (null, blank, or absent from a
    JSONL record), and how many rows carry a label: those belong in the training data, not among unlabelled ones.
    `encoding`: as `read_texts`'s."""
    rows = list(_texts_and_labels(path, column, label_column, encoding))
    return [(line, text) for line, text, label in rows if not label], sum(1 for *_, label in rows if label)


def _texts_and_labels(path: Path, column: str, label_column: str | None,
                      encoding: str | None = None) -> Iterator[tuple[int, str, str]]:
    """(line, text, label: "" where none) of every row; a row with no text field is an error naming its line."""
    columns = [column] if label_column is None else [column, label_column]
    records = (_jsonl_records(path, encoding=encoding) if is_jsonl(path)
               else _csv_dict_records(path, columns, encoding=encoding))
    for line_number, record, _ in records:
        reason = record.reason if isinstance(record, _Unusable) else _no_text(record, column)
        if reason and isinstance(record, dict) and column not in record:
            raise MissingColumns(f"{path}, line {line_number}: {reason}", [column])
        if reason:
            raise ReaderError(f"{path}, line {line_number}: {reason}")
        label = record.get(label_column) if label_column else None
        yield line_number, (record[column] or "").strip(), "" if label is None else str(label).strip()


def _no_text(record: dict, column: str) -> str:
    """Why `record` has no text in `column` ("" when it has one; null counts as empty text)."""
    if column not in record:
        return f"no {column!r} field"
    if not isinstance(record[column], (str, type(None))):
        return f"{column!r} is a JSON {type(record[column]).__name__}, not a string"
    return ""


def is_jsonl(path: Path) -> bool:
    return path.suffix.lower() in JSONL_SUFFIXES


def _jsonl_records(path: Path, content: bytes | None = None,
                   encoding: str | None = None) -> Iterator[tuple[int, dict | _Unusable, str]]:
    """(line, record or the reason it is unusable, the line) for each line but blank ones, one at a time; an unreadable
    or blank file is an error here, before any line is given."""
    return _jsonl_lines(_file_text(path, content=content, encoding=encoding))


def _jsonl_lines(text: str) -> Iterator[tuple[int, dict | _Unusable, str]]:
    for line_number, line in enumerate(iter_lines(text), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, object_pairs_hook=_object_without_repeated_keys)
        except json.JSONDecodeError as exc:
            record = _Unusable(f"not valid JSON: {exc.msg}")
        except RecursionError:
            record = _Unusable("not valid JSON: nested too deeply")
        except ValueError as exc:  # a repeated key, or an integer too long to convert (Python's 4300-digit limit)
            record = _Unusable(f"not usable JSON: {exc}")
        yield line_number, record if isinstance(record, (dict, _Unusable)) else _Unusable("not a JSON object"), line


def _object_without_repeated_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are distinct: `{"text": "a", "text": "b"}` would otherwise keep "b" and lose
    "a" unseen, where a CSV header that repeats a column is refused."""
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(f"the object repeats key(s) {repeated}")
    return dict(pairs)
