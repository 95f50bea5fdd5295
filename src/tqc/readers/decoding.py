"""A file's bytes as text, and its lines: encodings, byte-order marks, stray bytes and carriage returns.

Every reader (and `tqc predict --file`) decodes a file and numbers its lines so, whatever wrote it.
"""

from __future__ import annotations

import codecs
import logging
import re
from pathlib import Path
from typing import Iterator

from tqc.readers.results import ReaderError
from tqc.text import first_of

log = logging.getLogger(__package__)  # "tqc.readers" for every reader: incoming filters that one logger


def decode_file(path: Path, content: bytes | None = None) -> str:
    """Text of `path` (or of `content`, its bytes as a caller read them, named `path` in messages) as UTF-8, with every
    byte-order mark that starts a line dropped (files joined with `cat` each bring theirs: a second header must read
    as the header). In a line that is not valid UTF-8, the invalid bytes are read as Windows-1252 (what such files
    mostly are: `what\x92s` is "what’s"), or as Latin-1 where Windows-1252 leaves a byte undefined, with a warning
    naming the line, so one stray byte garbles neither the rest of its line nor the file's other lines. A file whose
    non-UTF-8 lines read as another encoding (GBK, Shift-JIS, Windows-1251, …) is an error naming its file and line
    (`_refuse_another_encoding`). Lines are numbered as `split_lines` numbers them (\n, \r\n or \r)."""
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
    text, invalid_runs = _utf8_with_single_byte_strays(argument.encode("utf-8", "surrogateescape"))
    if invalid_runs:
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
        text, invalid_runs = _utf8_with_single_byte_strays(piece)
        decoded.append(text)
        if invalid_runs:
            misread.append((index // 2 + 1, piece, invalid_runs))
    _refuse_another_encoding(misread, path)
    misread = [line for line, _, _ in misread]
    log.warning("%s: line(s) %s not valid UTF-8; read their invalid bytes as Windows-1252 (Latin-1 where it has no "
                "character), the rest as UTF-8", path, first_of(misread))
    return "".join(decoded)


def _utf8_with_single_byte_strays(line: bytes) -> tuple[str, list[int]]:
    """(text, the lengths of its runs of invalid bytes): the line's valid UTF-8 as UTF-8, so text pasted from two
    sources keeps its "é" beside a stray `\x92`, and each invalid stretch as Windows-1252 (`_single_byte`)."""
    pieces, start, runs, run_end = [], 0, [], -1
    while True:
        try:
            pieces.append(line[start:].decode("utf-8"))
            return "".join(pieces), runs
        except UnicodeDecodeError as exc:
            pieces.append(line[start:start + exc.start].decode("utf-8"))
            pieces.append(_single_byte(line[start + exc.start:start + exc.end]))
            if start + exc.start == run_end:  # the decoder says one run of invalid bytes in pieces of one to three
                runs[-1] += exc.end - exc.start
            else:
                runs.append(exc.end - exc.start)
            start += exc.end
            run_end = start


# Windows-1252 text has its accented letters one at a time, or two ("Größe", "¿Qué"), among ASCII letters, spaces and
# punctuation. Chinese, Japanese and Korean in their older encodings are two bytes a character, and Cyrillic or Greek
# (Windows-1251, 1253, KOI8-R) whole words of bytes over 127: read as Windows-1252 they would be trained on as
# mojibake ("ÊÇÀÏʦ"), so such a file is refused rather than read with a warning.
LONGEST_STRAY_RUN = 2  # invalid bytes in a row a Western stray may have
MOST_HIGH_BYTES = 0.5  # the share of bytes over 127 in a file's non-UTF-8 lines that Western text stays within


def _refuse_another_encoding(misread: list[tuple[int, bytes, list[int]]], path: Path | str) -> None:
    """A ReaderError naming the file and its first telling line when its non-UTF-8 lines (line, bytes, runs of invalid
    bytes) read as another encoding rather than UTF-8 with stray Windows-1252 bytes."""
    long_run = next((line for line, _, runs in misread if max(runs) > LONGEST_STRAY_RUN), None)
    high = sum(sum(byte > 127 for byte in piece) for _, piece, _ in misread)
    share = high / max(1, sum(len(piece) for _, piece, _ in misread))
    if long_run is None and share <= MOST_HIGH_BYTES:
        return
    why = (f"more than {LONGEST_STRAY_RUN} bytes in a row that are not UTF-8" if long_run is not None else
           f"{share:.0%} of the bytes of its {len(misread)} non-UTF-8 line(s) over 127")
    raise ReaderError(f"{path}, line {long_run or misread[0][0]}: not UTF-8 ({why}): written in another encoding, such "
                      "as GBK, Big5, Shift-JIS or Windows-1251, not UTF-8 with a stray Windows-1252 byte; save it as "
                      "UTF-8 (Excel: \"CSV UTF-8\")")


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
    return list(iter_lines(text))


def iter_lines(text: str) -> Iterator[str]:
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


BARE_CR = re.compile(r"\r(?!\n)")
HEADER_BREAK = re.compile(r"[\r\n]+")


def stray_carriage_returns_as_spaces(text: str, path: Path, header: bool = False, stray: re.Pattern = BARE_CR) -> str:
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
