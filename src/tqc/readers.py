"""Readers for each supported dataset layout. Each returns parsed rows and rejected rows.

A reader never drops a line silently: a line it cannot parse becomes a `RejectedRow`
with its file, line number, reason and original content, which ingest quarantines.
Checks on rows that *do* parse (labels, duplicates, leakage) belong to the validate stage.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import logging
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache, partial
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from tqc.config import CustomData, DataParams
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, file_and_line, split_source
from tqc.text import ALIKE, catalog_label_key, first_of, has_words, ids_by_label_key, normalise

log = logging.getLogger(__name__)
T = TypeVar("T")  # what a reader wrapped by `_naming_settings` returns

JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson"})
TABLE_SUFFIXES = frozenset({".csv", *JSONL_SUFFIXES})  # files read through a column mapping: a user's CSV or JSONL
TREC_LINE = re.compile(r"^(?P<coarse>[A-Z]+):(?P<fine>[a-z]+)\s+(?P<text>\S.*)$")
TREC_STRAY_CR = re.compile(r"\r(?!\n)(?![A-Z]+:[a-z]+\s)")  # a lone CR that no label follows


class ReaderError(ValueError):
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


def decode_file(path: Path, content: bytes | None = None) -> str:
    """Text of `path` (or of `content`, its bytes as a caller read them, named `path` in messages) as UTF-8, with every
    byte-order mark that starts a line dropped (files joined with `cat` each bring theirs: a second header must read
    as the header). In a line that is not valid UTF-8, the invalid bytes are read as Windows-1252 (what such files
    mostly are: `what\x92s` is "what’s"), or as Latin-1 where Windows-1252 leaves a byte undefined, with a warning
    naming the line, so one stray byte garbles neither the rest of its line nor the file's other lines. Lines are
    numbered as `split_lines` numbers them (\n, \r\n or \r)."""
    if content is not None:
        return decode_bytes(content, str(path))
    if path.is_dir():
        raise ReaderError(f"{path}: a folder, not a file")
    if not path.is_file():
        raise ReaderError(f"{path}: file not found")
    try:
        raw = path.read_bytes()
    except OSError as exc:  # no permission, an I/O error: said as the file's problem, not a traceback
        raise ReaderError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return decode_bytes(raw, str(path))


def decode_bytes(raw: bytes, name: str) -> str:
    """`raw` (a file's or standard input's bytes, called `name` in messages) as `decode_file` decodes a file."""
    return _without_line_boms(_decoded(raw, name))


def decode_argument(argument: str, name: str) -> str:
    """A command-line argument (called `name` in the warning) as a file's line is decoded: UTF-8, an invalid stretch
    as Windows-1252. argv hands bytes that are not UTF-8 over as lone surrogates (surrogateescape), which the tokenizer
    refuses; a valid argument comes back as it was. No byte-order mark is sought: an argument's "ÿþ" is its text."""
    text, had_invalid_bytes = _utf8_with_single_byte_strays(argument.encode("utf-8", "surrogateescape"))
    if had_invalid_bytes:
        log.warning("%s: not valid UTF-8; read its invalid bytes as Windows-1252 (Latin-1 where it has no character), "
                    "the rest as UTF-8", name)
    return text


def _decoded(raw: bytes, path: Path | str) -> str:
    if raw.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):  # before UTF-16: FF FE 00 00 starts with FF FE
        return _unicode(raw, "utf-32", path)
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # Excel's "Unicode text", Notepad's "Unicode"
        return _unicode(raw, "utf-16", path)
    if raw.count(b"\x00") * 4 >= len(raw) > 0:
        raise ReaderError(f"{path}: a quarter or more of its bytes are NUL: UTF-16 with no byte-order mark, or not a "
                          "text file; save it as UTF-8")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    pieces = LINE_BREAK_BYTES.split(raw)  # lines, each followed by its own line break
    decoded, misread = [], []
    for index, piece in enumerate(pieces):
        text, had_invalid_bytes = _utf8_with_single_byte_strays(piece)
        decoded.append(text)
        if had_invalid_bytes:
            misread.append(index // 2 + 1)
    log.warning("%s: line(s) %s not valid UTF-8; read their invalid bytes as Windows-1252 (Latin-1 where it has no "
                "character), the rest as UTF-8", path, first_of(misread))
    return "".join(decoded)


def _utf8_with_single_byte_strays(line: bytes) -> tuple[str, bool]:
    """(text, whether any byte was invalid): the line's valid UTF-8 as UTF-8, so text pasted from two sources
    keeps its "é" beside a stray `\x92`, and each invalid stretch as Windows-1252 (`_single_byte`)."""
    pieces, start = [], 0
    while True:
        try:
            pieces.append(line[start:].decode("utf-8"))
            return "".join(pieces), start > 0
        except UnicodeDecodeError as exc:
            pieces.append(line[start:start + exc.start].decode("utf-8"))
            pieces.append(_single_byte(line[start + exc.start:start + exc.end]))
            start += exc.end


LINE_START_BOM = re.compile("(^|\r\n|\r|\n)\ufeff")


def _without_line_boms(text: str) -> str:
    if "\ufeff" not in text:  # nearly every file: a scan for one character, not the pattern's at every line
        return text
    return LINE_START_BOM.sub(r"\1", text)


def _unicode(raw: bytes, encoding: str, path: Path | str) -> str:
    name = encoding.upper()
    try:
        text = raw.decode(encoding)  # the byte-order mark says which end first, and is dropped
    except UnicodeDecodeError as exc:
        raise ReaderError(f"{path}: starts with a {name} byte-order mark but is not {name} ({exc.reason} at byte "
                          f"{exc.start}); save it as UTF-8") from None
    log.info("%s: read as %s (its byte-order mark)", path, name)
    return text


def _single_byte(line: bytes) -> str:
    try:
        return line.decode("cp1252")
    except UnicodeDecodeError:  # 0x81, 0x8d, 0x8f, 0x90, 0x9d: C1 controls, which validate quarantines
        return line.decode("latin-1")


LINE_BREAK_BYTES = re.compile(rb"(\r\n|\r|\n)")


LINE_BREAK = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list[str]:
    """A text's lines as every reader (and `tqc predict --file`) numbers them."""
    return list(_iter_lines(text))


def _iter_lines(text: str) -> Iterator[str]:
    """`split_lines(text)` one line at a time: a reader holds the text, not a list of its lines as well. A line break
    that ends the text ends its last line, and starts no empty one."""
    # \n, \r\n and \r alike, and nothing else: str.splitlines also breaks at U+2028, U+0085 and the
    # like, which a question may hold (and JSONL written with ensure_ascii=False keeps raw).
    start = 0
    for match in LINE_BREAK.finditer(text):
        yield text[start:match.start()]
        start = match.end()
    if start < len(text):
        yield text[start:]


def read_trec(path: Path, granularity: str) -> ReadResult:
    """TREC `COARSE:fine question text` lines; TREC-6 keeps the coarse label, TREC-50 the full one."""
    result = ReadResult()
    # In a file whose lines end in LF, a lone CR before a label ends a line (an old-Mac line pasted in); one inside a
    # question is a stray, read as a space: a line break there would keep half a question and shift every later line
    # number. A file whose lines end in CR keeps each CR as its line break.
    text = _stray_carriage_returns_as_spaces(decode_file(path), path, stray=TREC_STRAY_CR)
    for line_number, line in enumerate(_iter_lines(text), start=1):
        if not line.strip():
            continue
        match = TREC_LINE.match(line.strip())
        if match is None:
            result.rejected.append(RejectedRow(str(path), line_number, "not a 'COARSE:fine question' TREC line", line))
            continue
        label = match["coarse"] if granularity == "coarse" else f"{match['coarse']}:{match['fine']}"
        result.rows.append(LabeledQuestion(match["text"].strip(), label, f"{path}:{line_number}"))
    return result


def _file_text(path: Path, header: bool = False, content: bytes | None = None) -> str:
    """The text a CSV or JSONL reader parses: the file decoded, its stray carriage returns read as spaces (in JSONL they
    may be JSON whitespace, never a line break); blank is an error."""
    text = _stray_carriage_returns_as_spaces(decode_file(path, content), path, header)
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


BARE_CR = re.compile(r"\r(?!\n)")
HEADER_BREAK = re.compile(r"[\r\n]+")


def _stray_carriage_returns_as_spaces(text: str, path: Path, header: bool = False, stray: re.Pattern = BARE_CR) -> str:
    """In a file whose lines end in LF (or CRLF), a carriage return alone is a stray, not a line break (a CSV
    reader would cut its row in two, keeping half as data; in JSONL it may be JSON whitespace): read as a
    space, with a warning naming the lines. A file whose lines end in CR alone (old Mac) is left as it is,
    even with an LF in a quoted field or at its end. Which one a file is: with a header, the header's own line
    break (column names hold no stray CR); without one, LF when there are at least as many LFs as lone CRs
    (a tiny file whose texts hold more lone CRs than it has lines reads as CR-ended: bytes cannot tell).
    `stray`: which lone CRs are strays there (TREC: those no label follows; one before a label ends a line)."""
    lone = len(BARE_CR.findall(text))
    if not lone or not _lines_end_in_lf(text, lone, header):
        return text
    offsets = [match.start() for match in stray.finditer(text)]
    if not offsets:
        return text
    text = stray.sub(" ", text)  # the same length: the offsets hold
    log.warning("%s: line(s) %s hold a carriage return inside the line, and the file ends its lines with LF (or CRLF): "
                "read as a space", path, first_of(_line_numbers(text, offsets, LINE_BREAK)))  # a kept CR ends a line
    return text


def _line_numbers(text: str, offsets: list[int], line_break: re.Pattern = re.compile("\n")) -> list[int]:
    """The distinct line numbers of ascending `offsets` in `text`, counting its line breaks (LFs, or `line_break`'s)
    once through the text."""
    lines, line, counted_to = [], 1, 0
    for offset in offsets:
        line += len(line_break.findall(text, counted_to, offset))
        counted_to = offset
        if not lines or lines[-1] != line:
            lines.append(line)
    return lines


def _lines_end_in_lf(text: str, lone_crs: int, header: bool) -> bool:
    # the header's line break: the whole run of CRs and LFs after it (`\r\r\n`, a CRLF file converted twice, is LF)
    after_header = HEADER_BREAK.search(text, len(text) - len(text.lstrip("\r\n")))  # blank lines before it aside
    if header and after_header is not None:
        return "\n" in after_header.group()
    return text.count("\n") >= lone_crs


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
               content: bytes | None = None) -> ReadResult:
    """A user's CSV (with header) or JSONL file, through a column mapping; `source_column`, for
    rows made offline, names the question each row was made from (kept in `named_sources`). `content`: the file's
    bytes, where the caller read them itself (the retrain flow parses the very bytes it hashed)."""
    columns = [c for c in (text_column, label_column, source_column) if c is not None]
    records = _jsonl_records(path, content) if is_jsonl(path) else _csv_dict_records(path, columns, content)
    result, labels = ReadResult(), {}  # labels: each one string, however many rows name it
    keys = _KeysSeen(columns)  # a JSONL file has no header: a column no record has is found only at the end
    for line_number, record, original in records:
        keys.see(line_number, record)
        reason = record.reason if isinstance(record, _Unusable) else _unusable_values(record, text_column, label_column,
                                                                                      source_column)
        if reason:  # a CSV record's content is written out only here, for the few rows rejected
            result.rejected.append(RejectedRow(str(path), line_number, reason,
                                               csv_record(original) if isinstance(original, list) else original))
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


def _unusable_values(record: dict, text_column: str, label_column: str, source_column: str | None) -> str:
    """Why a parsed record's values cannot be a row ("" when they can). JSON values must be what a
    CSV cell would hold: a string (null: empty) or, for the label, an integer id, or a whole number written as a float
    (`3.0`: pandas writes an integer column that holds a missing value so), read as a CSV's `3.0` is, which takes the
    catalog's `3` where there is one. Anything else (2.5, true, a list) is refused rather than turned into a class
    named "2.5" or "True"."""
    missing = [c for c in (text_column, label_column, source_column) if c is not None and c not in record]
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


def _missing_in(reason: str, columns: list[str]) -> list[str]:
    """The columns a rejected row's `reason` says its record lacks ([] when it gives another reason): `_unusable_values`
    names them in `columns`' order."""
    subsets = ([c for i, c in enumerate(columns) if mask >> i & 1] for mask in range(1, 2 ** len(columns)))
    return next((subset for subset in subsets if reason == _missing_columns(subset)
                 or reason.startswith(f"{_missing_columns(subset)}: ")), [])


def _encodable(text: str) -> bool:
    """Whether `text` can be written as UTF-8: JSON's escapes can spell half a surrogate pair, which no
    output file could hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _csv_dict_records(path: Path, columns: list[str],
                      content: bytes | None = None) -> Iterator[tuple[int, dict | _Unusable, list[str]]]:
    """(line, record or the reason it is unusable, its fields, which `csv_record` writes out for a rejected one) for each
    data row, one at a time. A header without one of `columns` is an error about the header, not a rejection of every
    row; it, and a malformed line anywhere, is raised here, before any row is given."""
    text = _file_text(path, header=True, content=content)
    # Two passes over the text, where the records were held all at once: this one reads the labels (and says a
    # malformed line before the header's problems, as before); the second gives the rows
    records = _csv_records(path, text)
    first = next(records, None)
    if first is None:
        raise ReaderError(f"{path}: file is empty")
    header_line, header = first[0], [h.strip() for h in first[1]]  # the first record that is not blank
    # a label column to tell rows swallowed by an unclosed quote from a question over several lines (none: texts only)
    label_index = header.index(columns[1]) if len(columns) > 1 and columns[1] in header else None
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


def read_texts(path: Path, column: str) -> list[tuple[int, str]]:
    """(line, text) of the `column` of every row of a CSV (with a header) or JSONL file: questions to score, with no
    labels. A row that cannot give one is an error naming its line (nothing to quarantine it to: the caller is a
    person)."""
    return [(line, text) for line, text, _ in _texts_and_labels(path, column, None)]


def read_unlabelled(path: Path, column: str, label_column: str) -> tuple[list[tuple[int, str]], int]:
    """(line, text) of the rows of a partly labelled file whose `label_column` is empty (null, blank, or absent from a
    JSONL record), and how many rows carry a label: those belong in the training data, not among unlabelled ones."""
    rows = list(_texts_and_labels(path, column, label_column))
    return [(line, text) for line, text, label in rows if not label], sum(1 for *_, label in rows if label)


def _texts_and_labels(path: Path, column: str, label_column: str | None) -> Iterator[tuple[int, str, str]]:
    """(line, text, label: "" where none) of every row; a row with no text field is an error naming its line."""
    columns = [column] if label_column is None else [column, label_column]
    records = _jsonl_records(path) if is_jsonl(path) else _csv_dict_records(path, columns)
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


def _jsonl_records(path: Path, content: bytes | None = None) -> Iterator[tuple[int, dict | _Unusable, str]]:
    """(line, record or the reason it is unusable, the line) for each line but blank ones, one at a time; an unreadable
    or blank file is an error here, before any line is given."""
    return _jsonl_lines(_file_text(path, content=content))


def _jsonl_lines(text: str) -> Iterator[tuple[int, dict | _Unusable, str]]:
    for line_number, line in enumerate(_iter_lines(text), start=1):
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


def label_in_words(class_id: str) -> str:
    """A derived standard question for a class with no catalog text: its label name in words."""
    return re.sub(r"[_\-:/.]+", " ", class_id).strip()


def read_catalog_file(path: Path, id_column: str = "class_id", text_column: str = "text",
                      taken: dict[str, str] | None = None) -> Catalog:
    """A catalog file; an error naming the file and line for a row without text, or whose text repeats
    another class's (within the file, or one of `taken`: normalised text → the class id that has it)."""
    return Catalog([question for question, _ in read_catalog_rows(path, id_column, text_column, taken)])


def read_catalog_rows(path: Path, id_column: str = "class_id", text_column: str = "text",
                      taken: dict[str, str] | None = None, content: bytes | None = None) -> list[tuple[StandardQuestion, int]]:
    """`read_catalog_file`'s standard questions, each with the file line it was read from (`content`: as `read_table`)."""
    result = read_table(path, text_column=text_column, label_column=id_column, content=content)
    if result.rejected:
        bad = result.rejected[0]
        message = f"{bad.file}, line {bad.line}: catalog row unusable: {bad.reason}"
        missing = _missing_in(bad.reason, [text_column, id_column])
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


def official_files(params: DataParams) -> tuple[Path, Path, Callable[[Path], ReadResult]]:
    """(train file, test file, reader) of a shipped dataset."""
    root = Path(params.data_dir)
    if params.dataset in ("trec6", "trec50"):
        granularity = "coarse" if params.dataset == "trec6" else "fine"
        return root / "trec" / "train_5500.label", root / "trec" / "TREC_10.label", partial(read_trec, granularity=granularity)
    folder, train_file = {"covidq-categories": ("categories", "train20.csv"), "covidq-classes": ("classes", "train3.csv")}[params.dataset]
    return root / "covid-q" / folder / train_file, root / "covid-q" / folder / "testA.csv", read_headerless_pairs


def read_dataset(params: DataParams) -> DatasetSplits:
    """Read the configured dataset's official train and test splits and its catalog."""
    if params.dataset == "custom":
        return _read_custom(params)
    train_path, test_path, reader = official_files(params)
    own = [f"data.custom.{key}" for key in ("train", "test") if getattr(params.custom, key)]
    if own:  # a user's files set, and dataset left at trec6: it trained on TREC-6 without a word
        log.warning("%s set, but data.dataset is %r, so %s and %s are read instead; data.dataset: custom reads your files",
                    " and ".join(own), params.dataset, train_path, test_path)
    for path in (train_path, test_path):
        if not path.exists():  # said as the setting that chose it: own files with dataset left at trec6 end here
            ignored = "; data.custom.train is set, which only data.dataset: custom reads" if params.custom.train else ""
            raise ReaderError(f"{path}: file not found (data.dataset {params.dataset!r} reads it under data.data_dir{ignored})")
    limit = params.max_rejected_fraction
    return DatasetSplits(require_rows(reader(train_path), train_path, limit), require_rows(reader(test_path), test_path, limit),
                         shipped_catalog(params.dataset))


def read_generated(params: DataParams, catalog: Catalog | None = None) -> ReadResult:
    """`data.generated.path`'s rows made offline, read in the dataset's own format; none when unset. `catalog`: the
    classes a label is read as when alike (`_labels_as_train_labels`)."""
    if not params.generated.path:
        return ReadResult()
    path = Path(params.data_dir) / params.generated.path
    return _labels_as_train_labels(params, require_rows(_dataset_reader(params, params.generated.source_column)(path),
                                                        path, params.max_rejected_fraction), catalog)


def read_validation(params: DataParams, catalog: Catalog | None = None) -> ReadResult | None:
    """`data.validation_file`'s labeled questions, read in the dataset's own format; None when unset
    (ingest then carves validation out of train)."""
    if not params.validation_file:
        return None
    path, (train_path, test_path) = Path(params.data_dir) / params.validation_file, _split_files(params)
    resolved = path.resolve()
    if resolved == test_path.resolve():
        raise ReaderError(f"data.validation_file {path} is the test split ({test_path}): selecting checkpoints on it "
                          "would make the test figures meaningless; name another file")
    if resolved == train_path.resolve():
        raise ReaderError(f"data.validation_file {path} is the training split ({train_path}): validation must be "
                          "questions the model is not trained on; name another file, or unset it to carve one from train")
    if not path.is_file():  # named here: the reader's own "file not found" would not say which param, nor that
        raise ReaderError(f"data.validation_file {params.validation_file!r}: no file {path} (the path is relative to "
                          f"data.data_dir, {params.data_dir})")
    return _labels_as_train_labels(params, require_rows(_dataset_reader(params)(path), path, params.max_rejected_fraction),
                                   catalog)


def _labels_as_train_labels(params: DataParams, result: ReadResult, catalog: Catalog | None = None) -> ReadResult:
    """A custom dataset's extra files (data.generated, data.validation_file) read their labels as train and test do:
    under `derive`, `hum` is the catalog's `HUM` there too. Else their rows kept labels that train's had lost, and
    were all quarantined (generated: no training question of class 'hum'; validation: label not in the catalog).
    `catalog`: the dataset's classes, the ones derived from train's labels included (ingest passes them: `billing`
    is then train's derived `Billing`); the catalog file's and the added ones without it."""
    if params.dataset != "custom" or params.custom.unknown_labels != "derive":
        return result
    return labels_read_as_catalog(result, catalog if catalog is not None else _known_classes(params, _custom_catalog(params)))


def _custom_catalog(params: DataParams) -> Catalog:
    custom = params.custom
    if not custom.catalog:
        return Catalog()
    read = _naming_settings(partial(read_catalog_file, id_column=custom.catalog_id_column,
                                    text_column=custom.catalog_text_column),
                            {custom.catalog_id_column: "data.custom.catalog_id_column",
                             custom.catalog_text_column: "data.custom.catalog_text_column"})
    return read(_custom_file(params, "catalog"))


def _custom_file(params: DataParams, key: str) -> Path:
    """`data.custom.<key>`'s file. One that is not there is named by its setting, as a missing data.validation_file
    is: the reader's own "file not found" says neither which setting to fix nor that the path is under data_dir."""
    named = getattr(params.custom, key)
    path = Path(params.data_dir) / named
    if not path.exists():
        raise ReaderError(f"data.custom.{key} {named!r}: no file {path} (the path is relative to data.data_dir, "
                          f"{params.data_dir})")
    return path


def _naming_settings(read: Callable[[Path], T], settings: dict[str, str]) -> Callable[[Path], T]:
    """`read`, whose error for a column the file lacks also names the setting that named the column (`settings`:
    column → setting)."""
    def reading(path: Path) -> T:
        try:
            return read(path)
        except MissingColumns as exc:
            named = list(dict.fromkeys(settings[c] for c in exc.columns if c in settings))
            if not named:
                raise
            raise MissingColumns(f"{exc} (named by {', '.join(named)})", exc.columns) from None
    return reading


def _known_classes(params: DataParams, catalog: Catalog) -> Catalog:
    """The catalog's classes and the retrain flow's added ones: what a label is read as when alike."""
    return with_added_classes(catalog, added_standard_questions(Path(params.additions) if params.additions else None))


def _split_files(params: DataParams) -> tuple[Path, Path]:
    """(train file, test file) the dataset is read from."""
    if params.dataset == "custom":
        return Path(params.data_dir) / params.custom.train, Path(params.data_dir) / params.custom.test
    return official_files(params)[:2]


def _dataset_reader(params: DataParams, source_column: str | None = None) -> Callable[[Path], ReadResult]:
    """The reader of the dataset's own file format: a shipped dataset's, or custom's column mapping."""
    if params.dataset == "custom":
        return partial(read_custom_table, custom=params.custom, source_column=source_column)
    return official_files(params)[2]


def read_custom_table(path: Path, custom: CustomData, source_column: str | None = None,
                      content: bytes | None = None) -> ReadResult:
    """`read_table` through data.custom's column mapping (`source_column`: data.generated's). A column the file lacks
    is an error that also names the setting that named it: the header's own columns show the misspelling, not where
    it was made."""
    settings = {custom.text_column: "data.custom.text_column", custom.label_column: "data.custom.label_column"}
    if source_column is not None:
        settings[source_column] = "data.generated.source_column"
    read = partial(read_table, text_column=custom.text_column, label_column=custom.label_column,
                   source_column=source_column, content=content)
    return _naming_settings(read, settings)(path)


ADDED_QUESTIONS, ADDED_CATALOG = "labeled.jsonl", "catalog.jsonl"


def read_additions(directory: Path | None) -> tuple[ReadResult, list[StandardQuestion]]:
    """The retrain flow's accepted labeled questions and new standard questions, if any. A folder that is not there
    adds nothing, and is said: a misspelt `data.additions` would otherwise leave the merged questions out unnoticed."""
    result = ReadResult([], [])
    if directory is not None and not directory.is_dir():
        log.warning("data.additions %s: no such folder, so no question or class is added (the retrain flow merges into "
                    "it; under dvc repro it must exist, as data/raw does)", directory)
    if directory is not None and (directory / ADDED_QUESTIONS).exists():
        result = read_table(directory / ADDED_QUESTIONS, "text", "class_id")
    return result, added_standard_questions(directory)


def added_standard_questions(directory: Path | None) -> list[StandardQuestion]:
    """The retrain flow's new standard questions (new classes), if any."""
    if directory is None or not (directory / ADDED_CATALOG).exists():
        return []
    return read_catalog_file(directory / ADDED_CATALOG).questions


def with_added_classes(catalog: Catalog, added: list[StandardQuestion]) -> Catalog:
    """New class ids are appended (existing indices never move); a known id keeps its text."""
    return Catalog(catalog.questions + [q for q in added if q.class_id not in catalog])


def _read_custom(params: DataParams) -> DatasetSplits:
    custom, root = params.custom, Path(params.data_dir)  # relative paths are under data_dir (a DVC dependency)
    train_path, test_path, reader = _custom_file(params, "train"), _custom_file(params, "test"), _dataset_reader(params)
    if train_path.resolve() == test_path.resolve():  # else ingest's later "validation is empty" would be its reason
        raise ReaderError(f"data.custom.train and data.custom.test are one file, {train_path}: test questions must be "
                          "ones the model never trains on; split the file, or name a separate test file")
    _warn_if_untracked(root, [train_path, test_path] + ([root / custom.catalog] if custom.catalog else []))
    limit = params.max_rejected_fraction
    train, test = require_rows(reader(train_path), train_path, limit), require_rows(reader(test_path), test_path, limit)
    # The retrain flow's new classes are known labels with their own standard questions, never derived ones; ingest
    # appends them after the derived classes (with_added_classes), so no class index moves.
    catalog = _custom_catalog(params)
    known = _known_classes(params, catalog)
    if custom.unknown_labels == "derive":  # `quarantine` is exact by choice: it names the likely id in the reason
        train = labels_read_as_catalog(train, known)
    if custom.unknown_labels == "quarantine":
        train = require_rows(_unknown_labels_rejected(train, known, root / custom.catalog), train_path, limit,
                             "add the labels to data.custom.catalog, set data.custom.unknown_labels: "
                             "derive, or raise the fraction")
    # Only training labels may create classes: a test label outside them is the validate stage's business.
    derived = [q for q in with_derived_classes(known, train.rows, catalog_given=bool(custom.catalog)).questions if q.derived]
    if custom.unknown_labels == "derive":  # test's `billing` is train's derived `Billing` too, not a class of its own
        test = labels_read_as_catalog(test, Catalog(known.questions + derived))
    return DatasetSplits(train, test, Catalog(catalog.questions + derived))


def _warn_if_untracked(data_dir: Path, paths: list[Path]) -> None:
    """dvc.yaml tracks data.data_dir: a file named outside it (an absolute or ../ path) can change without `dvc repro`
    noticing, so its results would silently go stale. A link under data_dir counts as under it wherever it points:
    DVC hashes what the link reads, so a change of its target re-runs ingest."""
    def spellings(path: Path) -> tuple[Path, Path]:  # as written (.. collapsed), and with every link followed
        return Path(os.path.abspath(path)), path.resolve()

    roots = spellings(data_dir)
    for path in paths:
        if not any(spelt.is_relative_to(root) for spelt in spellings(path) for root in roots):
            log.warning("%s is outside data.data_dir (%s), which is what DVC tracks: `dvc repro` will not notice when "
                        "it changes; put it under data.data_dir", path, data_dir)


def _alike_in(catalog: Catalog) -> Callable[[str], str | None]:
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

    known, alike, read_as, first = set(catalog.class_ids), _alike_in(catalog), {}, {}
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


def _unknown_labels_rejected(result: ReadResult, catalog: Catalog, catalog_path: Path) -> ReadResult:
    """`unknown_labels: quarantine`: a row whose label the catalog lacks is rejected by file and line."""
    known, alike = set(catalog.class_ids), _alike_in(catalog)
    rejected = []
    for row in result.rows:
        if row.class_id not in known:
            file, line = split_source(row.source)
            like = alike(row.class_id)
            hint = f"; the catalog has {like!r}, {ALIKE}" if like else ""
            rejected.append(RejectedRow(file, line or 0, f"label {row.class_id!r} is not in the catalog {catalog_path} "
                                        f"(data.custom.unknown_labels: quarantine){hint}", row_as_csv(row)))
    return ReadResult([r for r in result.rows if r.class_id in known], result.rejected + rejected, result.named_sources)
