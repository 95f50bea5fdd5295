"""Hardened ingest: hand-written awkward files, generated files, and `tqc validate FILE`."""

from __future__ import annotations

import logging
import csv
import io
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tqc.config import Params
from tqc.incoming import CLEAN, QUARANTINED, UNUSABLE, check_batch, main
from tqc.readers import ReaderError, read_headerless_pairs, read_table
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, load_questions, save_questions

LABELS = ["a", "b", "", "zzz"]
# A bare CR inside an unquoted field (Python's writer does not quote it under a "\n" terminator) is read
# as a space in a file whose lines end in LF, so it never cuts a row in two.
# C1 controls (U+0080–U+009F) are left out: in a file that is not UTF-8 those bytes are read as Windows-1252
# punctuation (0x85 "…"), which is what such files hold, so the text would not come back as written.
texts = st.text(alphabet=st.characters(codec="latin-1", exclude_categories=["Cs"],
                                       exclude_characters="".join(map(chr, range(0x80, 0xA0)))), max_size=40)
fields = st.one_of(texts, st.sampled_from(LABELS))
records = st.lists(st.lists(fields, min_size=1, max_size=4), max_size=30)


def encode(rows: list[list[str]], header: list[str] | None, encoding: str, newline: str) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator=newline)
    if header:
        writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue().encode(encoding)


def non_blank(rows: list[list[str]], newline: str) -> int:
    """Records that must come back as a row or a rejection: all but blank lines, one field of only spaces that the
    writer leaves unquoted. It quotes a lone empty field (`""`) and one holding a character of its line terminator,
    so that those records are not read as blank lines."""
    def blank(r: list[str]) -> bool:
        return len(r) == 1 and not r[0].strip() and r[0] != "" and not any(c in newline for c in r[0])

    return sum(1 for r in rows if not blank(r))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=records, encoding=st.sampled_from(["utf-8", "utf-8-sig", "latin-1"]), newline=st.sampled_from(["\n", "\r\n"]),
       headerless=st.booleans())
def test_generated_files_never_crash_and_never_lose_a_row(tmp_path, rows, encoding, newline, headerless):
    path = tmp_path / "generated.csv"
    content = encode(rows, None if headerless else ["question", "label"], encoding, newline)
    path.write_bytes(content)
    try:
        result = read_headerless_pairs(path) if headerless else read_table(path, "question", "label")
    except ReaderError as exc:
        assert str(path) in str(exc)  # a clear, file-naming error, e.g. an empty file
        if "NUL" in str(exc):  # a file a quarter NUL bytes is UTF-16 or not text, as the error says
            assert content.count(b"\x00") * 4 >= len(content)
            return
        # only a file with no record may be refused whole: every other one reads, its bad rows rejected one by one
        assert (headerless and non_blank(rows, newline) == 0 or not headerless and not rows), str(exc)
        return
    # With no header, a file whose texts hold more lone CRs than it has LFs reads as CR-ended, as the reader's
    # docstring says: bytes alone cannot tell it from an old-Mac file, so its records are the CR-ended lines.
    if not (headerless and len(re.findall(rb"\r(?!\n)", content)) > content.count(b"\n")):
        assert len(result.rows) + len(result.rejected) == non_blank(rows, newline)
    for rejected in result.rejected:
        assert rejected.file == str(path) and rejected.line >= 1 and rejected.reason


@pytest.mark.parametrize("content,rows,rejected", [
    (b"question,label\n", 0, 0),                                   # header only
    (b"question,label\nhi,a,extra\n", 0, 1),                       # extra column
    (b"question,label\nonly one\n", 0, 1),                         # missing column
    (b'question,label\n"two\nlines",a\n', 1, 0),                   # embedded newline
    (b"question,label\r\nhi,a\r\n", 1, 0),                         # CRLF
    (b"\xef\xbb\xbfquestion,label\nhi,a\n", 1, 0),                 # BOM
    (b"question,label\ncaf\xe9,a\n", 1, 0),                        # Latin-1
    (b"question,label\n" + b"x" * (1 << 20) + b",a\n", 1, 0),      # a 1 MB line
    (b"question,label\nhi,\n", 0, 1),                              # empty label: rejected, not derived as a class ""
    (b"question,label\n,\n", 0, 1),                                # every field empty: a record, rejected, not skipped
    (b"question,label\n\n   \nhi,a\n", 1, 0),                       # blank lines: not records
    (b"question,label\nbare\rcr inside,a\nok,b\n", 2, 0),           # a stray CR in an LF file: a space, not a break
    (b"question,label\rold mac,a\rok,b\r", 2, 0),                    # CR line ends throughout: line breaks
    (b"question,label\rold mac,a\rok,b\r\n", 2, 0),                  # ... also with one LF at the end
    (b'question,label\r"two\nlines",a\rok,b\r', 2, 0),               # ... or in a quoted field
    (b"question,label\nw\rx\ry\rz,a\n", 1, 0),                       # more stray CRs than lines: the header's LF decides
    (b"question,label\n\r,\r,\r0\n", 0, 1),                          # ... and one record of three fields stays one
    (b"question,label\r\r\nw\rx,a\r\r\nok,b\r\r\n", 2, 0),              # a CRLF file converted twice: LF lines
    (b"\n\nquestion,label\rhi,a\rok,b\r", 2, 0),                     # the header's break, after blank lines
    ("question,label\nhi,a\n".encode("utf-32"), 1, 0),              # UTF-32, whose mark starts as UTF-16's does
    ("question,label\r\ncafé,a\r\nok,b\r\n".encode("utf-16"), 2, 0),    # UTF-16 with its byte-order mark (Excel's "Unicode text")
    ("question,label\nhi,a\n".encode("utf-16-be").join([b"\xfe\xff", b""]), 1, 0),  # ... big-endian
])
def test_awkward_csv_files(tmp_path, content, rows, rejected):
    path = tmp_path / "f.csv"
    path.write_bytes(content)
    result = read_table(path, "question", "label")
    assert (len(result.rows), len(result.rejected)) == (rows, rejected)


def test_a_utf16_file_with_no_byte_order_mark_is_named_as_such_not_misread_row_by_row(tmp_path):
    path = tmp_path / "f.csv"
    path.write_bytes("question,label\nhi,a\n".encode("utf-16-le"))
    with pytest.raises(ReaderError, match=rf"{path}: a quarter or more of its bytes are NUL: UTF-16 with no byte-order mark"):
        read_table(path, "question", "label")


@pytest.mark.parametrize("compress, kind", [
    (lambda raw: __import__("gzip").compress(raw), "gzip-compressed data"),
    (lambda raw: __import__("bz2").compress(raw), "bzip2-compressed data"),
    (lambda raw: __import__("lzma").compress(raw), "xz-compressed data"),
    (None, r"a zip archive \(as an .xlsx is\)"),
])
def test_a_compressed_file_is_refused_by_name_not_read_as_mojibake_rows(tmp_path, compress, kind):
    raw = "question,label\nwhere is paris,LOC\nwho wrote it,HUM\n".encode()
    path = tmp_path / "export.csv.packed"
    if compress is None:
        import zipfile

        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("export.csv", raw)
    else:
        path.write_bytes(compress(raw))
        assert path.read_bytes().count(b"\x00") * 4 < path.stat().st_size  # the NUL check alone would have read it
    with pytest.raises(ReaderError, match=rf"{path}: {kind}, not text: decompress it, or export it as CSV"):
        read_table(path, "question", "label")


@pytest.fixture
def current_data(tmp_path):
    against = tmp_path / "validated"
    against.mkdir()
    Catalog([StandardQuestion("a", "Question a?"), StandardQuestion("b", "Question b?")]).save(against / "catalog.jsonl")
    save_questions(against / "train.jsonl", [LabeledQuestion(f"known {i}", "a", f"t:{i}") for i in range(6)]
                   + [LabeledQuestion(f"bee {i}", "b", f"t:{i}") for i in range(6)])
    save_questions(against / "validation.jsonl", [LabeledQuestion("validation question", "a", "v:1")])
    save_questions(against / "test.jsonl", [LabeledQuestion("a test question", "b", "x:1")])
    return against


def params() -> Params:
    return Params.model_validate({"data": {"custom": {"text_column": "question", "label_column": "label"}},
                                  "validate": {"max_quarantined_fraction": 0.9, "min_examples_per_class": 1}})


def test_validate_file_exit_codes(tmp_path, current_data, capsys):
    clean = tmp_path / "clean.csv"
    clean.write_text("question,label\nbrand new question,a\nanother one,b\n")
    assert main(clean, current_data, params()) == CLEAN

    mixed = tmp_path / "mixed.csv"
    mixed.write_text("question,label\nfresh question,a\nKNOWN 1,b\nA test question,b\nwho,zzz\nbad\tcontrol\x01,a\n")
    assert main(mixed, current_data, params()) == QUARANTINED
    out = capsys.readouterr().out
    assert "1 would be accepted, 4 quarantined" in out
    for expected in ("line 3: no_duplicates: duplicate of t, line 1; no_label_conflicts: conflicts with t, line 1, labeled 'a'",
                     "line 4: no_leakage: also in test at x, line 1", "line 5: label_in_catalog: 'zzz' is no class of the catalog",
                     "line 6: no_control_characters"):
        assert expected in out

    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert main(empty, current_data, params()) == UNUSABLE
    wrong_columns = tmp_path / "wrong.csv"
    wrong_columns.write_text("text,intent\nhello,a\n")
    assert main(wrong_columns, current_data, params()) == UNUSABLE
    # and which settings named the columns (`tqc validate FILE` reads data.custom's mapping whatever the dataset)
    assert (f"{wrong_columns}, line 1: missing column(s) ['question', 'label']: the header has ['text', 'intent'] "
            "(named by data.custom.text_column, data.custom.label_column)") in capsys.readouterr().out


def test_a_batch_at_the_path_the_current_data_was_ingested_from_counts_only_its_own_rows(tmp_path, current_data, capsys,
                                                                                           monkeypatch):
    """An edited data/questions.csv checked again: the current rows read from it (their source names that path)
    are not the batch's. By source, 7 of 1 row read were accepted."""
    monkeypatch.chdir(tmp_path)
    batch = Path("questions.csv")
    save_questions(current_data / "train.jsonl", [LabeledQuestion(f"known {i}", "a", f"{batch}:{i + 2}") for i in range(6)]
                   + [LabeledQuestion(f"bee {i}", "b", f"t:{i}") for i in range(6)])
    batch.write_text("question,label\nbrand new question,a\nknown 3,a\n")
    assert main(batch, current_data, params()) == QUARANTINED
    out = capsys.readouterr().out
    assert f"{batch}: 2 rows read, 1 would be accepted, 1 quarantined" in out
    assert out.count("  line ") == 1 and "line 3: no_duplicates" in out


def test_validate_file_says_a_key_no_jsonl_record_has_once_naming_the_setting(tmp_path, current_data, capsys):
    """As a CSV header without the column: not every line quarantined for the same missing key."""
    path = tmp_path / "batch.jsonl"
    path.write_text('{"text": "brand new question", "label": "a"}\n{"text": "another one", "label": "b"}\n')
    assert main(path, current_data, params()) == UNUSABLE
    out = capsys.readouterr().out
    assert out == (f"{path}: unusable: {path}: missing column(s) ['question'] in all 2 record(s): line 1 has "
                   "['text', 'label'] (named by data.custom.text_column)\n")


def test_a_few_bad_rows_are_quarantined_by_line_and_a_wholesale_failure_names_its_lines(tmp_path, current_data, capsys):
    """The batch's rows are judged as the training rows they would become: one empty text is quarantined and
    the other rows accepted; a label set the catalog lacks, failing for more than max_quarantined_fraction
    of the grown training set, makes the file unusable, and the message names the failing lines."""
    strict = Params.model_validate({"data": {"custom": {"text_column": "question", "label_column": "label"}},
                                    "validate": {"max_quarantined_fraction": 0.05, "min_examples_per_class": 1}})
    one_bad = tmp_path / "one_bad.csv"
    one_bad.write_text("question,label\n" + "".join(f"new question {i},a\n" for i in range(12)) + "   ,b\n"
                       + "".join(f"other question {i},b\n" for i in range(12)))
    assert main(one_bad, current_data, strict) == QUARANTINED  # 1 of 12 + 25 training rows: 2.7 %
    assert "24 would be accepted, 1 quarantined" in capsys.readouterr().out

    foreign = tmp_path / "foreign.csv"
    foreign.write_text("question,label\nfine question,a\nwho,zzz\nwhat,zzz\n")
    assert main(foreign, current_data, strict) == UNUSABLE  # 2 of 15: 13.3 %
    out = capsys.readouterr().out
    assert "label_in_catalog on train (2 row(s), 13.3%, more than validate.max_quarantined_fraction (0.05), e.g. " in out
    assert (f"{foreign} line 3 (label_in_catalog: 'zzz' is no class of the catalog (a delivery adds a class with a "
            f"catalog*.csv file of its standard question beside the rows)), {foreign} line 4)") in out  # its reason, once


def test_an_inbox_batch_is_read_in_data_custom_encoding_as_ingest_reads_the_custom_files(tmp_path, current_data):
    """The retrain flow's deliveries go through check_batch: a GBK batch is read in GBK when data.custom.encoding says
    so, not as the Windows-1252 mojibake a UTF-8 reading makes of it."""
    batch = tmp_path / "batch.csv"
    batch.write_bytes("question,label\n谁是老师？,a\n在哪里？,b\n".encode("gbk"))
    declared = Params.model_validate({**params().model_dump(), "data": {"custom": {
        "text_column": "question", "label_column": "label", "encoding": "gbk"}}})
    assert [row["text"] for row in check_batch(batch, current_data, declared)["accepted"]] == ["谁是老师？", "在哪里？"]
    misread = [row["text"] for row in check_batch(batch, current_data, params())["accepted"]]  # encoding null: UTF-8
    assert misread[0].startswith("\u02edÊÇÀÏ") and "谁" not in "".join(misread)


def test_a_batch_label_alike_a_catalog_id_is_read_as_it_as_ingest_reads_it(tmp_path, current_data, capsys):
    """Ingest reads a training label `B` as the catalog's `b` (with a warning); `tqc validate FILE`, which the retrain
    flow's deliveries go through, quarantined the same row as label_in_catalog."""
    batch = tmp_path / "batch.csv"
    batch.write_text("question,label\na brand new question,B\nanother new one,a\n")
    assert main(batch, current_data, params()) == CLEAN
    assert "2 would be accepted, 0 quarantined" in capsys.readouterr().out
    accepted = check_batch(batch, current_data, params())["accepted"]
    assert [row["class_id"] for row in accepted] == ["b", "a"]
    exact = Params.model_validate({"data": {"dataset": "custom", "custom": {
        "train": "t.csv", "test": "u.csv", "catalog": "c.csv", "unknown_labels": "quarantine", "text_column": "question",
        "label_column": "label"}}, "validate": {"max_quarantined_fraction": 0.9, "min_examples_per_class": 1}})
    assert main(batch, current_data, exact) == QUARANTINED  # unknown_labels: quarantine reads labels exactly, as ingest
    # the near-miss is named, and no new class is suggested for it
    assert "line 2: label_in_catalog: 'B' is no class of the catalog (the catalog has 'b', alike but for case, width or a float's .0):" in capsys.readouterr().out


def test_unreadable_current_data_is_exit_2_naming_its_file_and_line_not_the_batch(tmp_path, current_data, capsys):
    # An uncaught error would exit 1, which `tqc validate FILE` uses for "some rows would be quarantined"
    batch = tmp_path / "batch.csv"
    batch.write_text("question,label\nbrand new question,a\n")
    with (current_data / "catalog.jsonl").open("a") as catalog:
        catalog.write('{"class_id": \n')
    assert main(batch, current_data, params()) == UNUSABLE
    out = capsys.readouterr().out
    assert out.startswith(f"{current_data}: the current data to check against cannot be read: ")
    assert f"{current_data / 'catalog.jsonl'}, line 3: not valid JSON" in out
    assert str(batch) not in out  # the batch is not blamed

    assert main(batch, tmp_path / "nowhere", params()) == UNUSABLE
    assert f"{tmp_path / 'nowhere'}: the current data to check against cannot be read: " in capsys.readouterr().out


@pytest.mark.parametrize("line, said", [
    ('{"question": "x", "class_id": "a"}', "line 13: not a labeled question (no text; unexpected question)"),
    ('{"text": 5, "class_id": "a"}', "line 13: text is int, not str"),
    ('["x", "a"]', "line 13: a labeled question is a JSON object with text and class_id, not list"),
])
def test_a_training_line_that_is_no_labeled_question_is_named_by_line(tmp_path, current_data, capsys, line, said):
    batch = tmp_path / "batch.csv"
    batch.write_text("question,label\nbrand new question,a\n")
    with (current_data / "train.jsonl").open("a") as train:
        train.write(line + "\n")
    assert main(batch, current_data, params()) == UNUSABLE
    assert f"{current_data / 'train.jsonl'}, {said}" in capsys.readouterr().out


def test_checking_a_file_logs_nothing_about_the_current_datas_own_failures(tmp_path, current_data, capsys, caplog):
    """Validate's "no_duplicates on train failed for N rows" over the grown set is mostly about the data already there:
    the check prints the file's own quarantined rows, by line, and nothing else."""
    train = current_data / "train.jsonl"
    save_questions(train, load_questions(train) + [LabeledQuestion("known 1", "a", "t:99")])  # the data's own repeat
    clean = tmp_path / "clean.csv"
    clean.write_text("question,label\nbrand new question,a\n")
    with caplog.at_level(logging.INFO, logger="tqc"):
        assert main(clean, current_data, params()) == CLEAN
    assert not [r for r in caplog.records if r.name.startswith("tqc.stages")], caplog.text
    assert "1 rows read, 1 would be accepted, 0 quarantined" in capsys.readouterr().out
    assert logging.getLogger("tqc.stages.validate").level == logging.NOTSET  # restored after the check
    # Great Expectations' base module sets its logger to INFO at import; the validator gives it back its parent's level,
    # so the CLI's WARNING for "great_expectations" also hides the path of every run's scratch docs folder
    assert logging.getLogger("great_expectations.data_context.types.base").level == logging.NOTSET


def test_validate_file_escapes_what_a_latin1_stdout_cannot_encode_and_keeps_its_exit_codes(tmp_path, current_data,
                                                                                             monkeypatch):
    """Under a Latin-1 locale (PYTHONIOENCODING=latin-1) a row, a column or a file name in Chinese ended `tqc validate`
    in a UnicodeEncodeError and a traceback, exit 1, which it means as "rows quarantined": a clean file in such a
    folder said 1, not 0, and a file it cannot use said 1, not 2. What stdout cannot encode is now a backslash escape."""
    import sys

    from tqc.cli import main as cli_main

    (tmp_path / "params.yaml").write_text("data:\n  custom:\n    text_column: question\n    label_column: label\n"
                                          "validate:\n  max_quarantined_fraction: 0.9\n  min_examples_per_class: 1\n")
    folder = tmp_path / "斑马"
    folder.mkdir()
    (folder / "clean.csv").write_text("question,label\nbrand new question,a\nanother one,b\n")
    (folder / "mixed.csv").write_text("question,label\n斑马在哪里?,zzz\nfresh question,a\n", encoding="utf-8")
    (folder / "unusable.csv").write_text("question,标签\nfresh question,a\n", encoding="utf-8")
    latin1 = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    monkeypatch.setattr(sys, "stdout", latin1)

    codes = []
    for name in ("clean.csv", "mixed.csv", "unusable.csv"):
        with pytest.raises(SystemExit) as exited:
            cli_main(["--params", str(tmp_path / "params.yaml"), "validate", str(folder / name), "--against",
                      str(current_data)])
        codes.append(exited.value.code)
    assert codes == [CLEAN, QUARANTINED, UNUSABLE]
    latin1.flush()
    out = latin1.buffer.getvalue().decode("latin-1")
    assert "\\u6591\\u9a6c/clean.csv: 2 rows read, 2 would be accepted, 0 quarantined" in out
    assert "'zzz' is no class of the catalog" in out and "'\\u6591\\u9a6c\\u5728\\u54ea\\u91cc?'" in out
    assert "missing column(s) ['label']: the header has ['question', '\\u6807\\u7b7e']" in out


def test_a_batch_file_that_cannot_be_opened_is_exit_2_not_a_traceback(monkeypatch, tmp_path, capsys):
    from tqc import incoming
    from tqc.config import Params

    def missing(path, against, params):
        raise FileNotFoundError(2, "No such file or directory", str(path))

    monkeypatch.setattr(incoming, "check_batch", missing)
    assert incoming.main(tmp_path / "gone.csv", tmp_path, Params()) == incoming.UNUSABLE
    assert "unusable" in capsys.readouterr().out
