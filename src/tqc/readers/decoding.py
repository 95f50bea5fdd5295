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


def decode_file(path: Path, content: bytes | None = None, encoding: str | None = None) -> str:
    """Text of `path` (or of `content`, its bytes as a caller read them, named `path` in messages) as UTF-8, with every
    byte-order mark that starts a line dropped (files joined with `cat` each bring theirs: a second header must read
    as the header). In a line that is not valid UTF-8, the invalid bytes are read as Windows-1252 (what such files
    mostly are: `what\x92s` is "what’s"), or as Latin-1 where Windows-1252 leaves a byte undefined, with a warning
    naming the line, so one stray byte garbles neither the rest of its line nor the file's other lines. Lines are
    numbered as `split_lines` numbers them (\n, \r\n or \r). `encoding` (data.custom.encoding): the file is in that
    codec instead, and a byte it cannot decode is an error naming the line."""
    if content is not None:
        return decode_bytes(content, str(path), encoding)
    if path.is_dir():
        raise ReaderError(f"{path}: a folder, not a file")
    if not path.is_file():
        raise ReaderError(f"{path}: file not found")
    try:
        raw = path.read_bytes()
    except OSError as exc:  # no permission, an I/O error: said as the file's problem, not a traceback
        raise ReaderError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return decode_bytes(raw, str(path), encoding)


# Archive and compressed formats by their first bytes. None of them starts a text file: each opens with a control
# character, a byte UTF-8 never starts with, or (bzip2) a run no text has; and their bytes hold too few NULs for the
# NUL check, so a `.csv.gz` export read as text was its compressed bytes, each "line" mojibake, answered or quarantined
ARCHIVE_SIGNATURES = {
    "gzip-compressed data": re.compile(rb"\x1f\x8b"),
    "bzip2-compressed data": re.compile(rb"BZh[1-9]1AY&SY"),
    "a zip archive (as an .xlsx is)": re.compile(rb"PK\x03\x04"),
    "xz-compressed data": re.compile(rb"\xfd7zXZ\x00"),
    "zstd-compressed data": re.compile(rb"\x28\xb5\x2f\xfd"),
}


def decode_bytes(raw: bytes, name: str, encoding: str | None = None) -> str:
    """`raw` (a file's or standard input's bytes, called `name` in messages) as `decode_file` decodes a file."""
    _refuse_archive(raw, name)
    return _without_line_boms(_decoded(raw, name) if encoding is None else _declared(raw, encoding, name))


def _refuse_archive(raw: bytes, name: str) -> None:
    for kind, signature in ARCHIVE_SIGNATURES.items():
        if signature.match(raw):
            raise ReaderError(f"{name}: {kind}, not text: decompress it, or export it as CSV (the readers take "
                              "plain CSV, JSONL or text)")


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
    # Bytes alone cannot tell a few words of GBK, Big5, Shift-JIS or EUC-KR (two bytes a character, some pairs of them
    # valid UTF-8) from Windows-1252's accents and quotes ("Hvað þýðir", "«\xa0À", "…”—“"): so the warning says
    # what a file in another encoding becomes, rather than an error refusing Western text
    log.warning("%s: line(s) %s not valid UTF-8; read their invalid bytes as Windows-1252 (Latin-1 where it has no "
                "character), the rest as UTF-8; a file written in another encoding (GBK, Shift-JIS, Windows-1251, …) "
                "reads as mojibake so: save it as UTF-8 (a custom dataset's or the inbox's files: or name it in "
                "data.custom.encoding)",
                path, first_of(misread))
    return "".join(decoded)


def _declared(raw: bytes, encoding: str, path: Path | str) -> str:
    """`raw` in the declared codec; a byte-order mark (UTF-8's, or UTF-16's or 32's) still says what it says."""
    if raw.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return _decoded(raw, path)
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
        encoding = "utf-8"
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        line = len(LINE_BREAK_BYTES.findall(raw, 0, exc.start)) + 1
        raise ReaderError(f"{path}, line {line}: not {encoding}, the encoding declared for it (data.custom.encoding, "
                          f"or tqc predict's --encoding): {exc.reason} at {raw[exc.start:exc.end]!r}; save the file in "
                          f"{encoding}, or declare the encoding it is in") from None


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
