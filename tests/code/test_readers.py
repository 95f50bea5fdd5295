import codecs
import logging
import re
from pathlib import Path

import pytest

from tqc.config import DataParams
from tqc.readers import (
    ReaderError,
    ReadResult,
    RejectedRow,
    added_standard_questions,
    csv_record,
    decode_file,
    label_in_words,
    read_catalog_file,
    read_dataset,
    read_headerless_pairs,
    read_table,
    read_trec,
    require_rows,
    shipped_catalog,
    with_added_classes,
    with_derived_classes,
)
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, file_and_line, split_source

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_trec_coarse_and_fine_labels(tmp_path):
    path = write(tmp_path, "t.label", b"DESC:manner How did serfdom develop ?\nLOC:city What city is it ?\n")
    assert [(q.class_id, q.text) for q in read_trec(path, "coarse").rows] == [("DESC", "How did serfdom develop ?"), ("LOC", "What city is it ?")]
    assert [q.class_id for q in read_trec(path, "fine").rows] == ["DESC:manner", "LOC:city"]
    assert read_trec(path, "fine").rows[1].source == f"{path}:2"


def test_a_stray_carriage_return_in_a_trec_line_is_a_space_not_a_line_break(tmp_path, caplog):
    path = write(tmp_path, "t.label", b"DESC:def What is a\r golden parachute ?\nLOC:city What city is the Louvre in ?\n")
    with caplog.at_level(logging.WARNING):
        result = read_trec(path, "coarse")
    assert [(q.text, q.source) for q in result.rows] == [("What is a  golden parachute ?", f"{path}:1"),
                                                         ("What city is the Louvre in ?", f"{path}:2")]
    assert not result.rejected and "line(s) 1 hold a carriage return" in caplog.text
    old_mac = write(tmp_path, "mac.label", b"DESC:def What is X ?\rgarbage line with no label\rNUM:count How many ?\r")
    result = read_trec(old_mac, "coarse")  # lines end in CR: each is a line break, and the garbage line is rejected
    assert [q.source for q in result.rows] == [f"{old_mac}:1", f"{old_mac}:3"] and [r.line for r in result.rejected] == [2]


def test_trec_malformed_lines_are_rejected_with_line_and_reason(tmp_path):
    path = write(tmp_path, "t.label", b"NUM:How count many innings ?\nno label here\nHUM:ind Who ?\n")
    result = read_trec(path, "fine")
    assert [q.text for q in result.rows] == ["Who ?"]
    assert [(r.line, r.content) for r in result.rejected] == [(1, "NUM:How count many innings ?"), (2, "no label here")]
    assert all("TREC" in r.reason for r in result.rejected)


def test_latin1_bom_and_crlf_are_read(tmp_path, caplog):
    latin = write(tmp_path, "latin.label", "HUM:ind Who is Beyoncé ?\r\n".encode("latin-1"))
    with caplog.at_level(logging.WARNING):
        assert read_trec(latin, "coarse").rows[0].text == "Who is Beyoncé ?"
    assert "latin.label" in caplog.text and "Latin-1" in caplog.text


@pytest.mark.parametrize("text", ["Où est la boîte à lettres ? À été ?", "Wie ändere ich meine Größe ?",
                                  "¿Cuál es el límite? ¡¿Qué?!", "«\xa0Déjà vu\xa0» : œuvre naïve", "Hvað þýðir þetta ?",
                                  "“Wait…”—“No.”"])
def test_western_windows_1252_files_are_read_with_their_accents(tmp_path, caplog, text):
    """Excel's "CSV (Comma delimited)" on a Western Windows, typography as Word writes it. The warning names the line
    and says what a file in another encoding (Chinese Excel's GBK) becomes: bytes cannot tell that one from this."""
    path = write(tmp_path, "faq.csv", f"question,label\n{text},a\n".encode("cp1252"))
    with caplog.at_level(logging.WARNING):
        assert [row.text for row in read_table(path, "question", "label").rows] == [text]
    assert "faq.csv: line(s) 2 not valid UTF-8" in caplog.text and "another encoding (GBK" in caplog.text


def test_one_latin1_line_does_not_garble_the_utf8_lines_around_it(tmp_path, caplog):
    mixed = write(tmp_path, "mixed.label", "HUM:ind Who is Beyoncé ?\n".encode("utf-8") + "LOC:city Where is Malmö ?\n".encode("latin-1")
                  + "ENTY:food What is crème brûlée ?\n".encode("utf-8"))
    with caplog.at_level(logging.WARNING):
        texts = [q.text for q in read_trec(mixed, "coarse").rows]
    assert texts == ["Who is Beyoncé ?", "Where is Malmö ?", "What is crème brûlée ?"]
    assert "mixed.label: line(s) 2 not valid UTF-8" in caplog.text
    bom = write(tmp_path, "bom.csv", "\ufeffwhat is covid,Origin\r\nis it safe,Prevention\r\n".encode("utf-8"))
    assert [(q.text, q.class_id) for q in read_headerless_pairs(bom).rows] == [("what is covid", "Origin"), ("is it safe", "Prevention")]


def test_headerless_pairs_reject_wrong_column_counts_and_keep_quoted_newlines(tmp_path):
    path = write(tmp_path, "p.csv", b'"a question, with a comma",Origin\njust one column\n"multi\nline",Testing\n')
    result = read_headerless_pairs(path)
    assert [(q.text, q.class_id) for q in result.rows] == [("a question, with a comma", "Origin"), ("multi\nline", "Testing")]
    assert [(r.line, "2 columns" in r.reason) for r in result.rejected] == [(2, True)]
    assert result.rows[1].source.endswith(":3")


def test_headerless_pairs_quarantine_a_record_of_empty_fields_and_skip_blank_lines(tmp_path):
    result = read_headerless_pairs(write(tmp_path, "p.csv", b"is it safe,Prevention\n\n  \n,\n"))
    assert [q.text for q in result.rows] == ["is it safe"]
    assert [(r.line, r.reason) for r in result.rejected] == [(4, "empty label")]


def test_empty_file_is_a_clear_error(tmp_path):
    with pytest.raises(ReaderError, match="empty"):
        read_headerless_pairs(write(tmp_path, "e.csv", b""))


def test_custom_csv_and_jsonl_through_a_column_mapping(tmp_path):
    csv_path = write(tmp_path, "q.csv", b"id,question,intent\n1,how do i pay,billing\n2,lost my card\n3,,cards\n")
    result = read_table(csv_path, "question", "intent")
    assert [(q.text, q.class_id) for q in result.rows] == [("how do i pay", "billing"), ("", "cards")]
    assert [(r.line, r.reason) for r in result.rejected] == [(3, "expected 3 columns as in the header, found 2")]
    jsonl = write(tmp_path, "q.jsonl", b'{"question": "reset pin", "intent": "cards"}\nnot json\n{"question": "x", "intent": null}\n')
    result = read_table(jsonl, "question", "intent")
    assert [(q.text, q.class_id) for q in result.rows] == [("reset pin", "cards")]
    assert [(r.line, r.reason.split(":")[0]) for r in result.rejected] == [(2, "not valid JSON"), (3, "empty label")]


def rows_labeled(*labels: str) -> list[LabeledQuestion]:
    return [LabeledQuestion(f"question {i}", label, f"train.csv:{i + 2}") for i, label in enumerate(labels)]


def test_missing_catalog_texts_are_derived_with_a_warning(caplog):
    catalog = Catalog()
    with caplog.at_level(logging.WARNING):
        derived = with_derived_classes(catalog, rows_labeled("lost_card", "lost_card", "billing-question"))
    assert [(q.class_id, q.text, q.derived) for q in derived.questions] == [
        ("billing-question", "billing question", True), ("lost_card", "lost card", True)]
    assert "train.csv, line 2: class 'lost_card' has no catalog text; using the derived text 'lost card'" in caplog.text
    assert "train.csv, line 4: class 'billing-question'" in caplog.text  # where each label is first used
    assert label_in_words("ENTY:dismed") == "ENTY dismed"
    # camel case is words too: `lostCard` was derived as itself, while `lost_card` became `lost card`
    assert [label_in_words(label) for label in ("lostCard", "HTTPError", "card2Lost", "ABBR", "lost_card")] == [
        "lost Card", "HTTP Error", "card2 Lost", "ABBR", "lost card"]


def test_with_no_catalog_file_every_class_derives_in_one_line_not_a_warning_each(tmp_path, caplog):
    """data.custom.catalog unset is a documented choice: each class warned "a label missing from the catalog, or
    misspelt there?" of a catalog nobody gave."""
    write(tmp_path, "train.csv", b"question,label\nwhere is rome,LOC\nwho was he,HUM\n")
    write(tmp_path, "test.csv", b"question,label\nwhere is paris,LOC\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), custom={
        "train": "train.csv", "test": "test.csv", "catalog": None, "text_column": "question"})
    with caplog.at_level(logging.INFO, logger="tqc.readers"):
        splits = read_dataset(params)
    assert [(q.class_id, q.text) for q in splits.catalog.questions] == [("HUM", "HUM"), ("LOC", "LOC")]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "data.custom.catalog is not set: 2 classes take their labels in words as standard questions: 'HUM' → 'HUM', " \
           "'LOC' → 'LOC'" in caplog.text


@pytest.mark.parametrize("labels,catalog,message", [
    (("lost_card", "billing", "lost-card"), Catalog(), r"train.csv, line 2: class 'lost_card' .* 'lost card', is the text of class 'lost-card' \(derived too, its label first at train.csv, line 4\)"),
    (("billing", "lost_card"), Catalog([StandardQuestion("faq", "Lost  CARD")]), r"train.csv, line 3: class 'lost_card' .* is the text of class 'faq' in the catalog"),
    (("billing", "___"), Catalog(), r"train.csv, line 3: class '___' has no catalog text and no words to derive one from"),
    (("1", "billing", "1.0"), Catalog(), r"train.csv, line 4: labels '1' \(first at train.csv, line 2\) and '1.0' are alike "
                                         r"but for case, width or a float's .0, and the catalog has neither"),
])
def test_a_derived_text_that_is_empty_or_another_classes_is_an_error_naming_the_first_row(labels, catalog, message):
    with pytest.raises(ReaderError, match=message):
        with_derived_classes(catalog, rows_labeled(*labels))


@pytest.mark.parametrize("content,line", [(b"class_id,text\na,one\nb,two\na,three\n", 4),
                                          (b"class_id,text\na,one\n a ,two\n", 3)])
def test_catalog_file_with_duplicate_ids_is_an_error_naming_the_line(tmp_path, content, line):
    path = write(tmp_path, "c.csv", content)
    with pytest.raises(ReaderError, match=rf"c.csv, line {line}: .* class 'a' is already given at line 2"):
        read_catalog_file(path)
    jsonl = write(tmp_path, "c.jsonl", b'{"class_id": 1, "text": "one"}\n{"class_id": "1", "text": "two"}\n')
    with pytest.raises(ReaderError, match=r"c.jsonl, line 2: .* class '1' is already given at line 1"):
        read_catalog_file(jsonl)


def test_jsonl_lines_that_json_parses_but_no_row_can_hold_are_rejected_by_line(tmp_path):
    """A repeated key (which json keeps the last of), an integer past Python's 4300-digit limit and half a
    surrogate pair (which no UTF-8 output can hold) are each a rejected line with its reason."""
    lines = [b'{"text": "first", "text": "second", "label": "a"}', b'{"text": "big", "label": ' + b"9" * 5000 + b"}",
             b'{"text": "bad \\ud800 text", "label": "a"}', b'{"text": "fine", "label": "a"}']
    result = read_table(write(tmp_path, "q.jsonl", b"\n".join(lines) + b"\n"), "text", "label")
    assert [(q.text, q.source.rsplit(":", 1)[1]) for q in result.rows] == [("fine", "4")]
    reasons = {r.line: r.reason for r in result.rejected}
    assert set(reasons) == {1, 2, 3}
    assert "repeats key(s) ['text']" in reasons[1]
    assert "4300" in reasons[2]
    assert "'text' holds a lone surrogate" in reasons[3]


def test_a_stray_carriage_return_in_a_jsonl_file_is_whitespace_not_a_line_break(tmp_path):
    path = write(tmp_path, "q.jsonl", b'{"text": "a b",\r "label": "x"}\n{"text": "c", "label": "y"}\n')
    result = read_table(path, "text", "label")
    assert [(q.text, q.class_id, q.source.rsplit(":", 1)[1]) for q in result.rows] == [("a b", "x", "1"), ("c", "y", "2")]
    assert not result.rejected


def test_a_line_that_is_not_utf8_is_read_as_windows_1252_and_numbered_with_any_line_break(tmp_path, caplog):
    path = write(tmp_path, "q.csv", b"text,label\rwhat\x92s the fee,a\rok,b\r")
    with caplog.at_level(logging.WARNING):
        result = read_table(path, "text", "label")
    assert [q.text for q in result.rows] == ["what\u2019s the fee", "ok"]
    assert "line(s) 2 not valid UTF-8" in caplog.text


@pytest.mark.parametrize("dataset,classes", [("trec6", 6), ("trec50", 50), ("covidq-categories", 15), ("covidq-classes", 90)])
def test_shipped_catalogs_have_natural_texts(dataset, classes):
    catalog = shipped_catalog(dataset)
    assert len(catalog) == classes
    assert all(q.text and not q.derived for q in catalog.questions)


def test_custom_dataset_paths_are_relative_to_data_dir(tmp_path):
    from tests.conftest import write_custom_dataset

    write_custom_dataset(tmp_path)
    params = DataParams(dataset="custom", data_dir=str(tmp_path),
                        custom={"train": "train.csv", "test": "test.csv", "catalog": "catalog.csv", "text_column": "question"})
    splits = read_dataset(params)
    assert len(splits.catalog) == 3 and splits.train.rows and splits.test.rows


def test_custom_files_in_a_declared_encoding_are_read_in_it_and_an_undecodable_byte_names_its_line(tmp_path, caplog):
    """A Chinese Excel saves its CSVs in GBK. Read as UTF-8, each question became Windows-1252 mojibake ("ÊÇÀÏʦ") with
    a warning alone; `data.custom.encoding: gbk` reads them as written, train, test, catalog and a JSONL alike."""
    write(tmp_path, "train.csv", "question,label\n谁是老师？,hum\n在哪里？,loc\n".encode("gbk"))
    write(tmp_path, "test.jsonl", '{"question": "银行在哪里？", "label": "loc"}\n'.encode("gbk"))
    write(tmp_path, "catalog.csv", "class_id,text\nhum,这个人是谁？\nloc,这个地方在哪里？\n".encode("gbk"))
    custom = {"train": "train.csv", "test": "test.jsonl", "catalog": "catalog.csv", "text_column": "question",
              "encoding": "GBK"}
    with caplog.at_level(logging.WARNING):
        splits = read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), custom=custom))
    assert [q.text for q in splits.train.rows] == ["谁是老师？", "在哪里？"] and splits.test.rows[0].text == "银行在哪里？"
    assert splits.catalog.texts == ["这个人是谁？", "这个地方在哪里？"] and "not valid UTF-8" not in caplog.text

    write(tmp_path, "train.csv", "question,label\n谁是老师？,hum\n".encode("gbk") + b"where\xff,loc\n")
    with pytest.raises(ReaderError, match=r"train.csv, line 3: not gbk, the encoding declared for it \(data.custom.encoding, .*\): .* at b'\\xff'"):
        read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), custom=custom))
    write(tmp_path, "train.csv", codecs.BOM_UTF8 + "question,label\nwhat’s this,hum\n".encode("utf-8"))  # its mark wins
    splits = read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), custom=custom))
    assert [q.text for q in splits.train.rows] == ["what’s this"]


def test_a_misspelt_encoding_is_an_error_when_params_are_read():
    from tqc.config import CustomData

    with pytest.raises(ValueError, match=r"data.custom.encoding 'gbk2312': no codec of that name"):
        DataParams(dataset="custom", custom={"train": "t.csv", "test": "e.csv", "encoding": "gbk2312"})
    assert CustomData(encoding="Shift-JIS").encoding == "shift_jis"  # as Python names it


def test_a_label_the_catalog_lacks_is_a_derived_class_or_with_unknown_labels_quarantine_a_rejected_row(tmp_path):
    from tests.conftest import write_custom_dataset
    from tqc.config import ConfigError, Params

    write_custom_dataset(tmp_path)
    with (tmp_path / "train.csv").open("a") as train:
        train.write("where is the louvre,LOCATION\n")  # the catalog's class is loc: a misspelt label
    custom = {"train": "train.csv", "test": "test.csv", "catalog": "catalog.csv", "text_column": "question"}
    line = len((tmp_path / "train.csv").read_text().splitlines())

    derived = read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), custom=custom))
    assert "LOCATION" in derived.catalog and not derived.train.rejected

    strict = read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), custom={**custom, "unknown_labels": "quarantine"}))
    assert "LOCATION" not in strict.catalog and len(strict.train.rows) == len(derived.train.rows) - 1
    [rejected] = strict.train.rejected
    assert (rejected.file, rejected.line, rejected.content) == (str(tmp_path / "train.csv"), line, "where is the louvre,LOCATION")  # its label kept
    assert rejected.reason.startswith("label 'LOCATION' is not in the catalog")
    with (tmp_path / "train.csv").open("a") as train:  # 4 rows of 40: past the 5% data.max_rejected_fraction
        train.write("where is the prado,LOCATION\nwhere is the hermitage,LOCATION\nwhere is the uffizi,LOCATION\n")
    with pytest.raises(ReaderError, match=r"4 of \d+ rows rejected.*add the labels to data.custom.catalog, set "
                                          r"data.custom.unknown_labels: derive, or raise the fraction"):
        read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), custom={**custom, "unknown_labels": "quarantine"}))
    (tmp_path / "train.csv").write_text("".join((tmp_path / "train.csv").read_text().splitlines(keepends=True)[:-3]))

    additions = tmp_path / "raw"  # the retrain flow's new class: a known label, with its own standard question
    additions.mkdir()
    (additions / "catalog.jsonl").write_text('{"class_id": "LOCATION", "text": "Where is this place?"}\n')
    for mode in ("quarantine", "derive"):
        grown = read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), additions=str(additions),
                                        custom={**custom, "unknown_labels": mode}))
        assert not grown.train.rejected and "LOCATION" not in grown.catalog  # not derived: ingest appends it, as before
        served = with_added_classes(grown.catalog, added_standard_questions(additions))  # as ingest does
        assert served.class_ids == ["LOC", "HUM", "NUM", "LOCATION"]  # no class index moved
        assert served.texts[-1] == "Where is this place?"
    with (tmp_path / "train.csv").open("a") as train:
        train.write("what does dna stand for,DEF\n")  # a derived class keeps its index before the added one
    grown = read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), additions=str(additions), custom=custom))
    assert with_added_classes(grown.catalog, added_standard_questions(additions)).class_ids == [
        "LOC", "HUM", "NUM", "DEF", "LOCATION"]

    (tmp_path / "lower.csv").write_text("question,label\nwhere is it,loc\nwho is it,hum\n")  # the catalog's ids are LOC, HUM
    with pytest.raises(ReaderError, match=r"lower.csv: no usable rows \(2 rejected; rejected line 2: label 'loc' is not"):
        read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path),
                                custom={**custom, "train": "lower.csv", "unknown_labels": "quarantine"}))

    with pytest.raises(ConfigError, match="unknown_labels is 'quarantine' but data.custom.catalog is not set"):
        Params().with_overrides({"data": {"dataset": "custom", "custom": {"train": "t.csv", "test": "u.csv",
                                                                          "unknown_labels": "quarantine"}}})


@pytest.mark.parametrize("source, parts, said", [
    ("data/train.csv:12", ("data/train.csv", 12), "data/train.csv, line 12"),
    (r"C:\data\train.csv:3", (r"C:\data\train.csv", 3), r"C:\data\train.csv, line 3"),
    (r"C:\data\train.csv", (r"C:\data\train.csv", None), r"C:\data\train.csv"),
    ("generated", ("generated", None), "generated"),
    (":7", (":7", None), ":7"),
])
def test_a_rows_source_splits_into_its_file_and_line_only_at_a_trailing_line_number(source, parts, said):
    """Every stage that quarantines a row, or names it in an error, splits its "file:line" source this one way."""
    assert split_source(source) == parts
    assert file_and_line(source) == said


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared datasets not present")
@pytest.mark.parametrize("dataset,train,test,classes", [
    ("trec6", 5444, 499, 6), ("trec50", 5444, 499, 50), ("covidq-categories", 300, 668, 15), ("covidq-classes", 267, 460, 90)])
def test_real_datasets_read_every_line(dataset, train, test, classes):
    splits = read_dataset(DataParams(dataset=dataset, data_dir=str(SHARED)))
    assert len(splits.train.rows) + len(splits.train.rejected) == train  # nothing silently lost
    assert len(splits.test.rows) + len(splits.test.rejected) == test
    assert {q.class_id for q in splits.train.rows} <= set(splits.catalog.class_ids)
    assert len(splits.catalog) == classes


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared datasets not present")
@pytest.mark.parametrize("dataset", ["trec6", "trec50", "covidq-categories", "covidq-classes"])
def test_no_shipped_standard_question_is_a_test_question(dataset):
    """COVID-Q classes' catalog took each class's first train3 question, and two of them are testA questions word for
    word ("how covid spreads"): those test rows were scored against themselves (1.0 for the zero-shot encoder)."""
    from tqc.text import compared_text

    splits = read_dataset(DataParams(dataset=dataset, data_dir=str(SHARED)))
    tested = {compared_text(q.text) for q in splits.test.rows}
    assert [q for q in splits.catalog.questions if compared_text(q.text) in tested] == []


def test_fetch_verifies_checksums_and_never_keeps_a_bad_download(tmp_path):
    import hashlib
    import io

    from tqc.fetch import ChecksumMismatch, RemoteFile, fetch, verify

    good = b"DESC:def What is it ?\n"
    files = [RemoteFile("trec/x.label", "https://example.invalid/x", hashlib.sha256(good).hexdigest())]
    assert fetch(tmp_path, files, opener=lambda url, timeout: io.BytesIO(good) if timeout == 60.0 else None) == [tmp_path / "trec/x.label"]
    assert verify(tmp_path, files) == {"trec/x.label": True}
    assert fetch(tmp_path, files, opener=lambda url, timeout: pytest.fail("no download when the checksum matches")) == []
    (tmp_path / "trec/x.label").write_bytes(b"tampered")
    with pytest.raises(ChecksumMismatch):
        fetch(tmp_path, files, opener=lambda url, timeout: io.BytesIO(b"also wrong"))
    assert (tmp_path / "trec/x.label").read_bytes() == b"tampered"  # the atomic write left nothing half-done
    assert [p.name for p in (tmp_path / "trec").iterdir()] == ["x.label"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared datasets not present")
def test_shared_datasets_match_the_recorded_checksums():
    from tqc.fetch import verify

    assert all(verify(SHARED).values())


@pytest.mark.parametrize("train, said", [(b"question,label\n", r"no rows to read \(a header and nothing under it\?\)$"),
                                         (b"question,label\nonly one column\n", r"no usable rows \(1 rejected")])
def test_a_split_with_no_usable_row_is_a_clear_error(tmp_path, train, said):
    write(tmp_path, "train.csv", train)
    write(tmp_path, "test.csv", b"question,label\nhi,a\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), custom={"train": "train.csv", "test": "test.csv", "text_column": "question"})
    with pytest.raises(ReaderError, match=rf"train\.csv: {said}"):
        read_dataset(params)


def test_a_unicode_line_separator_inside_a_question_does_not_split_its_line(tmp_path):
    jsonl = write(tmp_path, "q.jsonl", '{"question": "reset\u2028pin", "intent": "cards"}\n{"question": "x\u0085y", "intent": "b"}\n'.encode())
    result = read_table(jsonl, "question", "intent")
    assert [(q.text, q.source.rsplit(":", 1)[1]) for q in result.rows] == [("reset\u2028pin", "1"), ("x\u0085y", "2")]
    trec = write(tmp_path, "t.label", b"DESC:def What is a\x85b ?\r\nHUM:ind Who wrote it ?\rLOC:city Where ?\n")
    assert [(q.class_id, q.source.rsplit(":", 1)[1]) for q in read_trec(trec, "coarse").rows] == [("DESC", "1"), ("HUM", "2"), ("LOC", "3")]


@pytest.mark.parametrize("data", [b"question,label\nwhat is x,\nwhat is y,  \nwhat is z,Origin\nwhat is w,\xe2\x80\x8b\n"])
def test_an_empty_label_is_rejected_with_its_line_not_made_a_class(tmp_path, data):
    """A zero-width space (line 5) is no label either: it became a class, which validate then stopped on, naming
    no file or line."""
    table = read_table(write(tmp_path, "q.csv", data), "question", "label")
    assert [q.class_id for q in table.rows] == ["Origin"]
    assert [(r.line, r.reason) for r in table.rejected] == [(2, "empty label"), (3, "empty label"), (5, "empty label")]
    pairs = read_headerless_pairs(write(tmp_path, "p.csv", data.split(b"\n", 1)[1]))
    assert [q.class_id for q in pairs.rows] == ["Origin"]
    assert [(r.line, r.reason) for r in pairs.rejected] == [(1, "empty label"), (2, "empty label"), (4, "empty label")]
    jsonl = write(tmp_path, "q.jsonl", '{"question": "what is v", "label": "\u200b"}\n'.encode())
    assert [(r.line, r.reason) for r in read_table(jsonl, "question", "label").rejected] == [(1, "empty label")]


def test_data_too_small_for_a_validation_split_is_a_clear_error(tmp_path):
    from tqc.stages import ingest

    write(tmp_path, "train.csv", b"text,label\na one,a\na two,a\nb one,b\nb two,b\n")
    write(tmp_path, "test.csv", b"text,label\na three,a\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None,
                        custom={"train": "train.csv", "test": "test.csv"})
    with pytest.raises(ReaderError, match="validation split carved from train is empty") as too_small:
        ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")
    assert not (tmp_path / "out").exists() and "none could be drawn" not in str(too_small.value)


def test_a_test_file_that_copies_train_is_said_to_leave_nothing_to_draw_for_validation(tmp_path):
    """Every training question also a test one: the error said only "add labeled questions", though there were
    enough; the reason is that no question in test is ever drawn for validation."""
    from tqc.stages import ingest

    rows = b"text,label\n" + b"".join(f"{c} question {i},{c}\n".encode() for c in "ab" for i in range(4))
    write(tmp_path, "train.csv", rows)
    write(tmp_path, "test.csv", rows)
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None,
                        custom={"train": "train.csv", "test": "test.csv"})
    with pytest.raises(ReaderError, match=r"none could be drawn from 2 class\(es\) of 3 or more \('a', 'b'\): each of "
                                          r"their training rows repeats, is empty, is a test or standard question"):
        ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")


def test_a_validation_file_is_the_validation_split_whole_and_train_trains_whole(tmp_path):
    from tqc.schema import load_questions
    from tqc.stages import ingest

    write(tmp_path, "train.csv", b"text,label\na one,a\na two,a\nb one,b\nb two,b\n")
    write(tmp_path, "dev.csv", b"text,label\na dev,a\nb bad,\nb dev,b\n")  # line 3: no label
    write(tmp_path, "test.csv", b"text,label\na three,a\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None, validation_file="dev.csv",
                        custom={"train": "train.csv", "test": "test.csv"}, max_rejected_fraction=0.5)
    report = ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")
    assert [q.text for q in load_questions(tmp_path / "out" / "train.jsonl")] == ["a one", "a two", "b one", "b two"]
    assert [q.text for q in load_questions(tmp_path / "out" / "validation.jsonl")] == ["a dev", "b dev"]
    assert report["rows"] == {"train": 4, "validation": 2, "test": 1} and report["validation_from"] == "dev.csv"
    quarantined = (tmp_path / "q.jsonl").read_text()
    assert "dev.csv" in quarantined and '"line": 3' in quarantined  # the bad row is quarantined, not lost


def test_rows_left_out_by_the_imbalance_ratio_are_counted_in_the_report(tmp_path):
    """The long tail drops rows on purpose; the report says how many, and what each class kept."""
    from tqc.stages import ingest

    rows = b"".join(b"a%d,a\n" % i for i in range(40)) + b"".join(b"b%d,b\n" % i for i in range(20))
    write(tmp_path, "train.csv", b"text,label\n" + rows)
    write(tmp_path, "test.csv", b"text,label\nheld out,a\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None, imbalance_ratio=10,
                        custom={"train": "train.csv", "test": "test.csv"})
    report = ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")
    assert report["imbalance"] == {"ratio": 10, "train_rows_left_out": 16, "per_class": {"a": 40, "b": 4}}
    assert report["read"]["train"] - report["imbalance"]["train_rows_left_out"] == sum(
        report["rows"][split] for split in ("train", "validation"))  # every read row is kept or counted
    balanced = ingest.run(params.model_copy(update={"imbalance_ratio": None}), 0, tmp_path / "out2",
                          tmp_path / "q2.jsonl", tmp_path / "r2.json")
    assert "imbalance" not in balanced


def test_a_validation_split_far_over_the_asked_fraction_is_warned_and_reported(tmp_path, caplog):
    """With 3 rows a class, one row each is a third of train, not validation_fraction's 0.1: said, not silent."""
    from tqc.stages import ingest

    rows = b"".join(b"%s question %d,%s\n" % (label, i, label) for label in (b"a", b"b", b"c") for i in range(3))
    write(tmp_path, "train.csv", b"text,label\n" + rows)
    write(tmp_path, "test.csv", b"text,label\nheld out,a\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None, validation_fraction=0.1,
                        custom={"train": "train.csv", "test": "test.csv"})
    with caplog.at_level(logging.WARNING, logger="tqc.stages.ingest"):
        report = ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")
    assert report["rows"]["validation"] == 3 and report["validation_share_of_train"] == round(3 / 9, 4)
    assert "the validation split took 3 of the 9 training rows (33%), more than data.validation_fraction 0.1" in caplog.text

    caplog.clear()  # at 20 rows a class the split takes what was asked: no warning
    rows = b"".join(b"%s question %d,%s\n" % (label, i, label) for label in (b"a", b"b") for i in range(20))
    write(tmp_path, "train.csv", b"text,label\n" + rows)
    with caplog.at_level(logging.WARNING, logger="tqc.stages.ingest"):
        report = ingest.run(params, 0, tmp_path / "out2", tmp_path / "q2.jsonl", tmp_path / "r2.json")
    assert report["validation_share_of_train"] == 0.1 and "validation split took" not in caplog.text


def test_the_retrain_flows_added_rows_are_counted_as_read_so_every_row_read_is_kept_or_quarantined(tmp_path):
    """The report read 120 + 15 rows, kept 137 and quarantined 2: the additions' 4 rows were in no count."""
    from tqc.stages import ingest

    rows = b"".join(b"a%d,a\n" % i for i in range(20)) + b"".join(b"b%d,b\n" % i for i in range(20))
    write(tmp_path, "train.csv", b"text,label\n" + rows)
    write(tmp_path, "test.csv", b"text,label\nheld out,a\n")
    (tmp_path / "added").mkdir()
    write(tmp_path / "added", "labeled.jsonl",
          b'{"text": "added one", "class_id": "a"}\n{"text": "added two"}\n[1]\n{"text": "added three", "class_id": "b"}\n')
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=str(tmp_path / "added"),
                        custom={"train": "train.csv", "test": "test.csv"})
    report = ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")
    assert report["read"] == {"train": 40, "test": 1, "additions": 4}
    assert sum(report["read"].values()) == sum(report["rows"].values()) + report["quarantined"] == 45
    plain = ingest.run(params.model_copy(update={"additions": None}), 0, tmp_path / "out2", tmp_path / "q2.jsonl",
                       tmp_path / "r2.json")
    assert plain["read"] == {"train": 40, "test": 1}  # no additions, no count


def test_ingest_replaces_its_output_folder_whole_or_not_at_all(tmp_path, monkeypatch):
    """A failure while writing (a full disk, say) leaves the last run's folder as it was: never new
    train and validation files beside an old test file."""
    from tqc.stages import ingest

    write(tmp_path, "train.csv", b"text,label\n" + b"".join(b"q%d,%s\n" % (i, b"ab"[i % 2 : i % 2 + 1]) for i in range(12)))
    write(tmp_path, "test.csv", b"text,label\nheld out,a\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None,
                        custom={"train": "train.csv", "test": "test.csv"})
    ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")
    before = {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()}
    write(tmp_path, "test.csv", b"text,label\nanother held out,b\n")
    save = ingest.save_questions

    def fail_on_test(path, rows):
        if Path(path).name == "test.jsonl":
            raise OSError("No space left on device")
        save(path, rows)

    monkeypatch.setattr(ingest, "save_questions", fail_on_test)
    with pytest.raises(OSError, match="No space left"):
        ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")
    assert {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()} == before
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".out")] == []  # no staging folder left behind


@pytest.mark.parametrize("named,split", [("./test.csv", "test"), ("train.csv", "training")])
def test_neither_the_train_nor_the_test_file_can_be_the_validation_file(tmp_path, named, split):
    from tqc.stages import ingest

    write(tmp_path, "train.csv", b"text,label\na one,a\na two,a\na four,a\n")
    write(tmp_path, "test.csv", b"text,label\na three,a\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None, validation_file=named,
                        custom={"train": "train.csv", "test": "test.csv"})
    with pytest.raises(ReaderError, match=f"validation_file .*{named.lstrip('./')} is the {split} split"):
        ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")


def test_a_generated_row_made_from_a_validation_file_question_is_never_trained_on(tmp_path):
    from tqc.stages import ingest
    from tqc.schema import usable_generated
    from tqc.schema import load_questions

    write(tmp_path, "train.csv", b"text,label\nhow do masks stop the virus spreading,a\nb one,b\nb two,b\n")
    write(tmp_path, "dev.csv", b"text,label\ndo masks stop the virus spreading to others,a\nb dev,b\n")
    write(tmp_path, "test.csv", b"text,label\na three,a\n")
    # Closer to the validation question (Jaccard 0.89) than to the training one (0.60)
    write(tmp_path, "gen.csv", b"text,label\ndo face masks stop the virus spreading to others,a\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None, validation_file="dev.csv",
                        custom={"train": "train.csv", "test": "test.csv"}, generated={"path": "gen.csv"})
    report = ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")
    train = load_questions(tmp_path / "out" / "train.jsonl")
    assert not usable_generated(train, load_questions(tmp_path / "out" / "generated.jsonl"))
    assert report["generated"]["made_from_held_out_questions"] == 1
    assert report["read"]["validation"] == 2


def test_generated_and_validation_file_labels_are_read_as_train_labels_are(tmp_path):
    """Train's `hum` reads as the catalog's `HUM`; the offline rows' and validation file's `hum` did not, so every
    offline row was quarantined (no training question of class 'hum') and every validation row failed validate."""
    from tqc.schema import load_questions
    from tqc.stages import ingest

    write(tmp_path, "catalog.csv", b"class_id,text\nHUM,Who is it?\nLOC,Where is it?\n")
    write(tmp_path, "train.csv", b"text,label\nwho wrote the song,hum\nwho built the tower,hum\nwhere is paris,loc\n"
                                 b"where is rome,loc\nmy bill is high,Billing\nwhy is my bill so high,Billing\n")
    # Billing is no catalog class: derived from train's labels, and `billing` elsewhere is it too
    write(tmp_path, "dev.csv", b"text,label\nwho painted it,hum\nwhere is oslo,loc\nmy bill doubled,billing\n")
    write(tmp_path, "test.csv", b"text,label\nwho sang it,hum\n")
    write(tmp_path, "gen.csv", b"text,label\nwho wrote this song,hum\nwhy is my bill so very high,BILLING\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None, validation_file="dev.csv",
                        custom={"train": "train.csv", "test": "test.csv", "catalog": "catalog.csv"},
                        generated={"path": "gen.csv"})
    report = ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")

    assert [q.class_id for q in load_questions(tmp_path / "out" / "validation.jsonl")] == ["HUM", "LOC", "Billing"]
    generated = load_questions(tmp_path / "out" / "generated.jsonl")
    assert [(q.class_id, q.origins) for q in generated] == [("HUM", (f"{tmp_path / 'train.csv'}:2",)),
                                                            ("Billing", (f"{tmp_path / 'train.csv'}:7",))]
    assert report["generated"]["quarantined"] == 0


def test_a_fixed_validation_file_cannot_be_resplit():
    from tqc.config import ConfigError, Params

    with pytest.raises((ValueError, ConfigError), match="evaluate.resplit is true but data.validation_file"):
        Params.model_validate({"data": {"validation_file": "dev.csv"}, "evaluate": {"resplit": True}})


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared datasets not present")
def test_covidq_testB_reads_as_a_validation_file():
    from tqc.readers import read_validation

    params = DataParams(dataset="covidq-categories", data_dir=str(SHARED), validation_file="covid-q/categories/testB.csv")
    result = read_validation(params)
    assert len(result.rows) == 238 and not result.rejected
    assert {q.class_id for q in result.rows} == set(read_dataset(params).catalog.class_ids)


@pytest.mark.parametrize("content,line", [
    ('text,label\n"Jaws is by whom?,HUM\nWhat does "LOL" mean?,DESC\nok,a\n', 2),  # a quote never closed: would swallow rows
    ('text,label\nok,a\n"Jaws" was directed by whom?,HUM\n', 3),                  # a stray quote: would vanish from the text
])
def test_a_stray_quote_is_an_error_naming_its_line_not_rows_merged_or_quotes_dropped(tmp_path, content, line):
    path = tmp_path / "stray.csv"
    path.write_text(content)
    with pytest.raises(ReaderError, match=rf"stray.csv, line {line}: malformed CSV") as raised:
        read_table(path, "text", "label")
    if line == 2:  # it read "line 2 (the record starting there, at line 3)", as though the record began at line 3
        assert str(raised.value).endswith("malformed CSV: the record that starts on this line runs on to line 3, where the "
                                          "parser stopped (',' expected after '\"'): a quote opened on line 2 and not closed there, or stray "
                                          "text after a closing quote?")


def test_rows_swallowed_by_a_quote_that_a_comma_closes_are_rejected_not_read_as_one_question(tmp_path):
    """csv's strict mode misses a stray quote followed by a comma (`12",NUM`): the rows since the quote opened read
    as one question labeled as the last. A line inside a quoted field that is a whole row of its own says so."""
    table = tmp_path / "table.csv"
    table.write_text('text,label\n"Jaws is by whom?,HUM\nWhat does LOL mean?,DESC\nHow big is a pizza of 12",NUM\n'
                     'ok,a\n"How are you,\nfriend?",HUM\n')  # HUM and DESC only in the swallowed lines
    result = read_table(table, "text", "label")
    assert [(q.text, q.source) for q in result.rows] == [("ok", f"{table}:5"), ("How are you,\nfriend?", f"{table}:6")]
    rejected, = result.rejected
    assert rejected.line == 2 and rejected.reason.startswith("a quoted field runs from line 2 to 4, and its line 2 reads "
                                                             "as a row of its own ('Jaws is by whom?,HUM')")
    pairs = tmp_path / "pairs.csv"
    pairs.write_text('ok,a\n"Jaws is by whom?,HUM\nHow big is 12",NUM\n')
    result = read_headerless_pairs(pairs)
    assert [q.text for q in result.rows] == ["ok"] and [r.line for r in result.rejected] == [2]
    # a question over two lines whose first line holds a comma: no label there, so one real question
    fever = tmp_path / "fever.csv"
    fever.write_text('question,label\nwho is it,Testing\n"Hi, I have a fever\nshould I get tested?",Testing\n')
    result = read_table(fever, "question", "label")
    assert [q.text for q in result.rows] == ["who is it", "Hi, I have a fever\nshould I get tested?"] and not result.rejected
    # ... or a single word after it, as a greeting has: in a file whose labels repeat, only a label they use marks a
    # swallowed row (it quarantined these as "a quote never closed?", and two such rows in 20 stopped ingest)
    greetings = tmp_path / "greetings.csv"
    greetings.write_text('text,label\nwho is it,billing\nhow do I pay,billing\n"Hi, there\nI lost my card, what now?",lost\n'
                         '"Hello, team\nhow do I pay my bill?",billing\n')
    result = read_table(greetings, "text", "label")
    assert [q.source for q in result.rows] == [f"{greetings}:{line}" for line in (2, 3, 4, 6)] and not result.rejected
    # ... while a swallowed line that asks a question still marks one, though no other row ends in its label (a file
    # sorted by label, a class whose every row fell inside the quote)
    by_label = tmp_path / "by_label.csv"
    by_label.write_text('question,label\nWhat is a bat?,DESC\nWhat is a cat?,DESC\n"Who wrote Jaws?,HUM\n'
                        'Who directed Alien?,HUM\nHow big is a pizza of 12",NUM\nWhat is a dog?,DESC\n')
    result = read_table(by_label, "question", "label")
    assert [q.text for q in result.rows] == ["What is a bat?", "What is a cat?", "What is a dog?"]
    assert [r.line for r in result.rejected] == [4]
    # a catalog: each class id once, so no one-line row names a swallowed line's id; ids are single words
    catalog = tmp_path / "catalog.csv"
    catalog.write_text('class_id,text\nA,"What is the quoted start\nB,What is b?\nC,What is a 12"\nD,What is d?\n')
    with pytest.raises(ReaderError, match=r"catalog.csv, line 2: .*a quoted field runs from line 2 to 4"):
        read_catalog_file(catalog, "class_id", "text")


def test_a_record_of_an_empty_quoted_field_is_a_row_rejected_not_a_blank_line_skipped(tmp_path):
    """`""` and `"  "` read as the fields a blank line reads as; they were skipped with no trace, and not counted."""
    table = tmp_path / "table.csv"
    table.write_text('text,label\nwhere is it,LOC\n""\n\n   \n"  "\nwho is it,HUM\n')
    result = read_table(table, "text", "label")
    assert [q.source for q in result.rows] == [f"{table}:2", f"{table}:7"]
    assert [(r.line, r.reason) for r in result.rejected] == [(3, "expected 2 columns as in the header, found 1"),
                                                              (6, "expected 2 columns as in the header, found 1")]
    pairs = tmp_path / "pairs.csv"
    pairs.write_text('where is it,LOC\n""\n\n')
    assert [r.line for r in read_headerless_pairs(pairs).rejected] == [2]


def test_a_rejected_records_content_keeps_its_quoting(tmp_path):
    table = tmp_path / "table.csv"
    table.write_text('text,label\n"Where is Paris, France?",LOC,extra\n')
    rejected, = read_table(table, "text", "label").rejected
    assert rejected.content == '"Where is Paris, France?",LOC,extra'  # three fields, not four
    # a field over two lines stays one quoted field (the writer quotes only its own terminator's line breaks)
    table.write_text('text,label\n"Where is it,\nor was it?",LOC,extra\n')
    rejected, = read_table(table, "text", "label").rejected
    assert rejected.content == '"Where is it,\nor was it?",LOC,extra'
    assert csv_record(["one\rtwo", "x"]) == '"one\rtwo",x'


def test_the_header_is_the_first_line_that_is_not_blank_and_may_not_repeat_a_column(tmp_path):
    leading_blank = tmp_path / "blank.csv"
    leading_blank.write_text("\ntext,label\nhi,a\n")
    result = read_table(leading_blank, "text", "label")
    assert [(q.text, q.class_id, q.source) for q in result.rows] == [("hi", "a", f"{leading_blank}:3")] and not result.rejected

    repeated = tmp_path / "repeated.csv"
    repeated.write_text("text,label,text\nreal question,a,other\n")
    with pytest.raises(ReaderError, match=r"repeated.csv, line 1: the header repeats column\(s\) \['text'\]"):
        read_table(repeated, "text", "label")


def test_jsonl_values_must_be_what_a_csv_cell_holds(tmp_path):
    path = tmp_path / "values.jsonl"
    path.write_text("\n".join([
        '{"text": "integer id", "label": 3}',
        '{"text": "float", "label": 1.5}',
        '{"text": "boolean", "label": true}',
        '{"text": "list", "label": ["a"]}',
        '"just a string"',
        '{"text": 0, "label": "a"}',
        "[" * 100_000,
        '{"text": "a whole float, as pandas writes an integer column with a gap", "label": 4.0}',
        '{"text": "a whole float, as JSON may spell it", "label": 5e0}',
    ]) + "\n")
    result = read_table(path, "text", "label")
    assert [q.class_id for q in result.rows] == ["3", "4.0", "5.0"]  # as a CSV holds them: 4.0 takes a catalog's 4
    assert [(r.line, r.reason) for r in result.rejected] == [
        (2, "label 'label' is a JSON float (1.5), not a string or a whole number"),
        (3, "label 'label' is a JSON bool (True), not a string or a whole number"),
        (4, "label 'label' is a JSON list (['a']), not a string or a whole number"),
        (5, "not a JSON object"),
        (6, "'text' is a JSON int, not a string"),
        (7, "not valid JSON: nested too deeply"),
    ]


def test_a_catalog_row_without_text_or_with_another_class_text_is_an_error_naming_its_line(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("class_id,text\nA,Where is it?\nB,\n")
    with pytest.raises(ReaderError, match=r"empty.csv, line 3: .*class 'B' has an empty standard question"):
        read_catalog_file(empty)
    invisible = tmp_path / "invisible.csv"
    invisible.write_text("class_id,text\nA,Where is it?\nB,\u200b\n")
    with pytest.raises(ReaderError, match=r"invisible.csv, line 3: .*class 'B' has an empty standard question"):
        read_catalog_file(invisible)
    header_only = tmp_path / "header.csv"
    header_only.write_text("class_id,text\n")  # was read as a catalog of no classes: every one derived, no error
    with pytest.raises(ReaderError, match=r"header.csv: the catalog file has no rows, only its header"):
        read_catalog_file(header_only)
    shared = tmp_path / "shared.csv"
    shared.write_text("class_id,text\nA,Where is it?\nB,where is  IT?\n")
    with pytest.raises(ReaderError, match=r"shared.csv, line 3: .*class 'B' has the standard question of class 'A'"):
        read_catalog_file(shared)
    again = tmp_path / "again.csv"
    again.write_text("class_id,text\nA,Where is it?\nC,Who is it?\n")
    assert read_catalog_file(again, taken={"where is it?": "A"}).class_ids == ["A", "C"]  # A keeps its own text
    with pytest.raises(ReaderError, match=r"again.csv, line 3: .*class 'C' has the standard question of class 'Z'"):
        read_catalog_file(again, taken={"who is it?": "Z"})  # a class already in the catalog has C's text


# No word a tokenizer reads (`has_words`): a private-use character, control characters, a lone accent, U+FFFD. Read, it
# passed ingest and stopped validate's catalog_non_empty_texts, which names the class but not the file and line.
@pytest.mark.parametrize("text", ["\ue000", "\x01\x02", "\u0301", "\ufffd", "\u200b\ue000"])
def test_a_catalog_row_whose_text_no_tokenizer_reads_is_an_error_naming_its_line(tmp_path, text):
    path = tmp_path / "catalog.csv"
    path.write_text(f"class_id,text\nA,Where is it?\nB,{text}\n", encoding="utf-8")
    with pytest.raises(ReaderError, match=r"catalog.csv, line 3: catalog row unusable: class 'B' has an empty standard "
                                          r"question \(no character a tokenizer reads"):
        read_catalog_file(path)


def test_a_label_whose_derived_text_no_tokenizer_reads_is_an_error_naming_its_first_row():
    with pytest.raises(ReaderError, match=r"train.csv, line 3: class '\\ue000' has no catalog text and no words to derive "
                                          r"one from"):
        with_derived_classes(Catalog(), rows_labeled("billing", "\ue000"))


def test_a_validation_file_that_is_not_there_names_the_param_and_where_it_was_looked_for(tmp_path):
    from tqc.stages import ingest

    write(tmp_path, "train.csv", b"text,label\na one,a\na two,a\na four,a\n")
    write(tmp_path, "test.csv", b"text,label\na three,a\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None, validation_file="dev.csv",
                        custom={"train": "train.csv", "test": "test.csv"})
    with pytest.raises(ReaderError, match=r"^data.validation_file 'dev.csv': no file .*dev.csv \(the path is relative to data.data_dir"):
        ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")


def test_a_repeated_header_row_is_quarantined_and_unnamed_spreadsheet_columns_are_ignored(tmp_path):
    joined = write(tmp_path, "joined.csv", b"text,label,,\nhow do i pay,billing,,\ntext,label,,\nlost my card,cards,,note\n")
    result = read_table(joined, "text", "label")
    # two exports joined: the second header is no question of a class called "label"
    assert [(q.text, q.class_id) for q in result.rows] == [("how do i pay", "billing"), ("lost my card", "cards")]
    assert [(r.line, r.reason) for r in result.rejected] == [(3, "the header again (line 1): two files joined?")]


@pytest.mark.parametrize("stray_byte", [b"", b"\x92"])  # the UTF-8 path, and the line-by-line one a stray byte takes
def test_files_joined_with_their_byte_order_marks_read_as_the_files_did(tmp_path, stray_byte):
    """Excel's "CSV UTF-8" starts every file with a BOM: `cat a.csv b.csv` puts one before the second header."""
    bom = codecs.BOM_UTF8
    joined = write(tmp_path, "joined.csv", bom + b"text,label\r\nhow do i pay" + stray_byte + b",billing\r\n"
                   + bom + b"text,label\r\nlost my card,cards\r\n")
    result = read_table(joined, "text", "label")
    assert [q.class_id for q in result.rows] == ["billing", "cards"]  # no class "label" with a question "\ufefftext"
    assert [(r.line, r.reason) for r in result.rejected] == [(3, "the header again (line 1): two files joined?")]


def test_a_byte_order_mark_is_dropped_from_a_line_read_as_windows_1252_too(tmp_path):
    bom = codecs.BOM_UTF8
    mixed = write(tmp_path, "mixed.txt", bom + b"what\x92s new\n" + bom + b"caf\xc3\xa9\n")
    assert decode_file(mixed) == "what\u2019s new\ncaf\u00e9\n"


def test_a_stray_byte_leaves_the_valid_utf8_of_its_line_as_it_was(tmp_path):
    """Text pasted from two sources: the "é" and "–" stay, only the stray Windows-1252 byte is read as such."""
    mixed = write(tmp_path, "mixed.csv", b"text,label\nCaf\xc3\xa9 menu \xe2\x80\x93 what\x92s new,a\nok,b\n")
    assert [q.text for q in read_table(mixed, "text", "label").rows] == ["Caf\u00e9 menu \u2013 what\u2019s new", "ok"]


def test_a_label_that_is_a_catalog_id_but_for_case_width_or_a_floats_point_zero_takes_that_id(tmp_path, caplog):
    """A spreadsheet's `hum` or pandas' `1.0` beside the catalog's `HUM` and `1` would otherwise be a class of its own,
    with a derived standard question, while the catalog's class kept no rows and its test questions went unanswered."""
    (tmp_path / "catalog.csv").write_text("class_id,text\nHUM,Who is it?\n1,Is it the first?\nloc,Where?\nLOC,Where is it?\n")
    (tmp_path / "train.csv").write_text("question,label\nwho wrote it,hum\nwho sang it, HUM\u200b\nwhich first,1.0\n"
                                        "where is it,Loc\nwho else,HUM\nwhich first again,1.00\nwhich one,1.5\n")
    (tmp_path / "test.csv").write_text("question,label\nwho built it,Hum\nwhat comes first,1\n")
    custom = {"train": "train.csv", "test": "test.csv", "catalog": "catalog.csv", "text_column": "question"}

    with caplog.at_level(logging.WARNING, logger="tqc.readers"):
        splits = read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), custom=custom))
    assert [q.class_id for q in splits.train.rows] == ["HUM", "HUM", "1", "Loc", "HUM", "1", "1.5"]
    assert [q.class_id for q in splits.test.rows] == ["HUM", "1"]
    # loc and LOC alike: Loc is neither, derived; 1.5 is no whole number
    assert splits.catalog.class_ids == ["HUM", "1", "loc", "LOC", "1.5", "Loc"]
    assert "train.csv, line 2: label 'hum' read as class 'HUM' (1 row(s))" in caplog.text
    assert "label '1.0' read as class '1'" in caplog.text

    # unknown_labels: quarantine stays exact, and names the id the label is like
    strict = read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), max_rejected_fraction=1.0,
                                     custom={**custom, "unknown_labels": "quarantine"}))
    reasons = {r.line: r.reason for r in strict.train.rejected}
    assert reasons[2].endswith("; the catalog has 'HUM', alike but for case, width or a float's .0")
    assert reasons[4].endswith("; the catalog has '1', alike but for case, width or a float's .0")
    assert reasons[5].endswith("(data.custom.unknown_labels: quarantine)")  # Loc: two ids alike, no hint


def test_a_file_most_of_whose_rows_are_rejected_stops_ingest_instead_of_training_on_the_rest(tmp_path):
    """Unquoted commas in hand-made CSV texts reject each such row (a column too many): past
    data.max_rejected_fraction the run stops, naming the file, the count and the first reason."""
    from tests.conftest import write_custom_dataset

    write_custom_dataset(tmp_path)
    lines = (tmp_path / "train.csv").read_text().splitlines()
    lines[1:4] = [f"{line.split(',')[0]}, and more,{line.split(',')[1]}" for line in lines[1:4]]  # 3 of 36 rows
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    custom = {"train": "train.csv", "test": "test.csv", "catalog": "catalog.csv", "text_column": "question"}

    with pytest.raises(ReaderError, match=r"train.csv: 3 of 36 rows rejected, more than data.max_rejected_fraction "
                                          r"\(0.05\) of the file; rejected line 2: .*; line 3: .*; line 4: ") as stopped:
        read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), custom=custom))
    assert "more" not in str(stopped.value).split("line 4")[1]  # every rejected line named (the first alone was)
    many = ReadResult([LabeledQuestion("q", "a", "f:1")], [RejectedRow("f", line, "bad", "") for line in range(2, 14)])
    with pytest.raises(ReaderError, match=r"line 11: bad; and 2 more: fix the file, or raise the fraction$"):
        require_rows(many, Path("f"), 0.5)
    kept = read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), custom=custom, max_rejected_fraction=0.1))
    assert len(kept.train.rows) == 33 and [r.line for r in kept.train.rejected] == [2, 3, 4]


def test_ingest_stopped_by_rejected_rows_quarantines_every_one_of_them(tmp_path):
    """The error names the first few rejected lines; the quarantine file holds them all, so the file can be fixed
    from one list."""
    from tests.conftest import write_custom_dataset
    from tqc.io import read_jsonl
    from tqc.stages import ingest

    write_custom_dataset(tmp_path)
    lines = (tmp_path / "train.csv").read_text().splitlines()
    lines[1:14] = [f"{line.split(',')[0]}, and more,{line.split(',')[1]}" for line in lines[1:14]]  # 13 of 36 rows
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None,
                        custom={"train": "train.csv", "test": "test.csv", "catalog": "catalog.csv", "text_column": "question"})
    quarantine = tmp_path / "quarantine" / "ingest.jsonl"

    with pytest.raises(ReaderError, match=r"train.csv: 13 of 36 rows rejected.*and 3 more: fix the file, or raise the "
                                          rf"fraction\. All 13 of its rejected rows are in {re.escape(str(quarantine))}$"):
        ingest.run(params, 0, tmp_path / "validated", quarantine, tmp_path / "ingest.json")
    rows = read_jsonl(quarantine)
    assert [row["line"] for row in rows] == list(range(2, 15))
    assert {row["stage"] for row in rows} == {"ingest"} and all(row["file"].endswith("train.csv") for row in rows)
    assert all("expected 2 columns" in row["reason"] for row in rows)
    assert not (tmp_path / "validated").exists() and not (tmp_path / "ingest.json").exists()  # nothing else written

    # A file all of whose rows are rejected: the same
    (tmp_path / "train.csv").write_text("question,label\n" + "".join(f"q{i}, x,a\n" for i in range(3)))
    with pytest.raises(ReaderError, match=r"train.csv: no usable rows \(3 rejected.*All 3 of its rejected rows are in"):
        ingest.run(params, 0, tmp_path / "validated", quarantine, tmp_path / "ingest.json")
    assert [row["line"] for row in read_jsonl(quarantine)] == [2, 3, 4]
    # A header alone has no row to list: its error as it was, and the quarantine file left alone
    (tmp_path / "train.csv").write_text("question,label\n")
    with pytest.raises(ReaderError, match=r"train.csv: no rows to read \(a header and nothing under it\?\)$"):
        ingest.run(params, 0, tmp_path / "validated", quarantine, tmp_path / "ingest.json")
    assert len(read_jsonl(quarantine)) == 3


def test_a_stopping_files_rejected_rows_survive_pickling_with_its_error():
    """A Prefect task's failure, or a process pool's, is pickled: the rows must come along, and the type."""
    import pickle

    from tqc.readers import RowsRejected

    rows = [RejectedRow("f.csv", 2, "bad", "x,y")]
    restored = pickle.loads(pickle.dumps(RowsRejected("f.csv: 1 of 1 rows rejected", rows)))
    assert isinstance(restored, RowsRejected) and str(restored) == "f.csv: 1 of 1 rows rejected" and restored.rejected == rows


def test_stray_carriage_returns_are_numbered_by_line_in_one_pass():
    from tqc.readers.decoding import _line_numbers

    text = "a\rb\nc\nd\re\rf\n\ng\r"
    offsets = [i for i, ch in enumerate(text) if ch == "\r"]
    assert _line_numbers(text, offsets) == sorted({text.count("\n", 0, o) + 1 for o in offsets}) == [1, 3, 5]


def test_one_file_as_train_and_test_is_refused_and_a_file_outside_data_dir_is_named(tmp_path, caplog):
    from tests.conftest import write_custom_dataset

    write_custom_dataset(tmp_path / "data")
    custom = {"train": "train.csv", "test": "train.csv", "catalog": "catalog.csv", "text_column": "question"}
    with pytest.raises(ReaderError, match=r"data.custom.train and data.custom.test are one file, .*train.csv: test "
                                          r"questions must be ones the model never trains on"):
        read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path / "data"), custom=custom))

    (tmp_path / "data" / "test.csv").rename(tmp_path / "elsewhere.csv")  # beside data_dir, not under it
    with caplog.at_level(logging.WARNING, logger="tqc.readers"):
        read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path / "data"), custom={**custom, "test": "../elsewhere.csv"}))
    assert "elsewhere.csv is outside data.data_dir" in caplog.text and "train.csv is outside" not in caplog.text

    # a link under data_dir is tracked there wherever it points (DVC hashes what it reads): no warning
    (tmp_path / "data" / "linked.csv").symlink_to(tmp_path / "elsewhere.csv")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tqc.readers"):
        read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path / "data"), custom={**custom, "test": "linked.csv"}))
    assert "is outside data.data_dir" not in caplog.text


def test_a_test_label_like_a_label_derived_from_train_is_read_as_that_class(tmp_path, caplog):
    """With no catalog entry, train's `Billing` is a derived class; test's `billing` stayed a label of its own, and
    validate quarantined the row (label not in the catalog)."""
    (tmp_path / "train.csv").write_text("question,label\n" + "".join(f"my bill {i},Billing\nmy card {i},Cards\n"
                                                                     for i in range(4)))
    (tmp_path / "test.csv").write_text("question,label\nwhy is my bill high,billing\nmy card broke,CARDS\n")
    custom = {"train": "train.csv", "test": "test.csv", "text_column": "question"}
    with caplog.at_level("WARNING"):
        splits = read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), custom=custom))
    assert splits.catalog.class_ids == ["Billing", "Cards"]
    assert [q.class_id for q in splits.test.rows] == ["Billing", "Cards"]
    assert "label 'billing' read as class 'Billing'" in caplog.text  # a derived class: "the catalog's" it was not


def test_generated_rows_made_from_rows_the_long_tail_left_out_are_counted_as_such():
    from tqc.schema import LabeledQuestion
    from tqc.stages.ingest import Attribution, _generated_report

    train = [LabeledQuestion("kept", "a", "t:1")]
    left_out = [LabeledQuestion("left out", "a", "t:2")]
    made = [LabeledQuestion(text, "a", f"g:{i}", generated=True, origins=(origin,))
            for i, (text, origin) in enumerate([("from kept", "t:1"), ("from left out", "t:2"), ("from validation", "v:1")])]
    report = _generated_report(Attribution(made, 0, []), 3, train, left_out, imbalanced=True)
    assert (report["usable_with_this_split"], report["made_from_rows_left_out_by_imbalance"],
            report["made_from_held_out_questions"]) == (1, 1, 1)


def test_a_folder_or_an_unreadable_file_is_said_to_be_so(tmp_path, monkeypatch):
    from pathlib import Path

    from tqc.readers import ReaderError, decode_file

    (tmp_path / "train.csv").mkdir()
    with pytest.raises(ReaderError, match="train.csv: a folder, not a file"):
        decode_file(tmp_path / "train.csv")
    locked = tmp_path / "locked.csv"
    locked.write_text("question,label\n")

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(ReaderError, match=r"locked.csv: cannot be read \(Permission denied\)"):
        decode_file(locked)


@pytest.mark.parametrize("name, content, columns", [
    ("catalog.csv", "class_id,question\nA,What is a?\n", ["text"]),                  # a CSV header without the column
    ("catalog.jsonl", '{"class_id": "A", "question": "What is a?"}\n', ["text"]),  # a JSONL record without it
    ("catalog.jsonl", '{"label": "A"}\n', ["text", "class_id"]),
])
def test_a_catalog_without_a_mapped_column_raises_missing_columns_naming_them(tmp_path, name, content, columns):
    """Callers say which option picks the column on this type, not on the words of the message."""
    from tqc.readers import MissingColumns, read_catalog_rows

    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(MissingColumns, match="missing column") as raised:
        read_catalog_rows(path)
    assert raised.value.columns == columns and str(path) in str(raised.value)


def test_a_catalog_row_unusable_for_another_reason_is_not_missing_columns(tmp_path):
    from tqc.readers import MissingColumns, read_catalog_rows

    path = tmp_path / "catalog.jsonl"
    path.write_text('{"class_id": 1.5, "text": "What is a?"}\n', encoding="utf-8")
    with pytest.raises(ReaderError, match="line 1: catalog row unusable: label 'class_id' is a JSON float") as raised:
        read_catalog_rows(path)
    assert not isinstance(raised.value, MissingColumns)


def test_texts_without_their_column_raise_missing_columns_and_it_pickles_whole(tmp_path):
    import pickle

    from tqc.readers import MissingColumns, read_texts

    path = tmp_path / "questions.jsonl"
    path.write_text('{"text": "Who?"}\n{"question": "Where?"}\n', encoding="utf-8")
    with pytest.raises(MissingColumns, match=r"questions.jsonl, line 2: no 'text' field") as raised:
        read_texts(path, "text")
    restored = pickle.loads(pickle.dumps(raised.value))
    assert isinstance(restored, MissingColumns) and restored.columns == ["text"] and str(restored) == str(raised.value)


def test_a_jsonl_record_without_the_mapped_keys_names_the_keys_it_has(tmp_path):
    """A CSV's error gives the header; a JSONL line's gave only the missing keys, so a misnamed key had to be looked up."""
    from tqc.readers import MissingColumns, read_catalog_file

    path = tmp_path / "test.jsonl"
    path.write_text('{"question": "Where is Paris?", "label": "LOC"}\n{"q_text": "Where is Rome?", "label": "LOC"}\n')
    (rejected,) = read_table(path, "question", "label").rejected
    assert rejected.reason == "missing column(s) ['question']: the record has ['q_text', 'label']"
    assert rejected.missing_columns == ("question",)  # carried, not read back from the reason's words
    assert rejected.quarantined("ingest") == {"file": str(path), "line": 2, "reason": rejected.reason,
                                              "content": '{"q_text": "Where is Rome?", "label": "LOC"}', "stage": "ingest"}
    catalog = tmp_path / "catalog.jsonl"
    catalog.write_text('{"class_id": "PER", "text": "Who is it?"}\n{"id": "LOC", "text": "Where is it?"}\n')
    with pytest.raises(MissingColumns, match=r"line 2: catalog row unusable: missing column\(s\) \['class_id'\]: the record "
                                             r"has \['id', 'text'\]") as raised:
        read_catalog_file(catalog)
    assert raised.value.columns == ["class_id"]  # the retrain flow's hint names the option from them


def test_an_additions_folder_that_is_not_there_adds_nothing_and_is_said(tmp_path, caplog):
    """A misspelt data.additions left the retrain flow's merged questions out of training with no word."""
    from tqc.readers import read_additions

    with caplog.at_level("WARNING", logger="tqc.readers"):
        rows, classes = read_additions(tmp_path / "rawx")
    assert not rows.rows and not classes
    assert f"data.additions {tmp_path / 'rawx'}: no such folder, so no question or class is added" in caplog.text
    caplog.clear()
    (tmp_path / "raw").mkdir()
    with caplog.at_level("WARNING", logger="tqc.readers"):
        read_additions(tmp_path / "raw")  # there, and empty: nothing added yet, nothing to say
    assert not caplog.text


def test_a_class_left_without_training_or_validation_rows_is_named_and_reported(tmp_path, caplog):
    """A class of 2 rows stays whole in train, and an added class whose questions all hash to validation has no
    training row: both were silent (validate names only classes that lost their rows to quarantine)."""
    import json

    from tqc.schema import LabeledQuestion, load_questions
    from tqc.stages import ingest

    rows = b"".join(b"%s question %d,%s\n" % (label, i, label) for label, n in ((b"a", 20), (b"b", 2)) for i in range(n))
    write(tmp_path, "train.csv", b"text,label\n" + rows)
    write(tmp_path, "test.csv", b"text,label\nheld out,a\n")
    raw = tmp_path / "raw"  # the retrain flow's new class `c`, with one question that stable_split puts in validation
    raw.mkdir()
    (raw / "catalog.jsonl").write_text('{"class_id": "c", "text": "Is this class c?"}\n')
    candidates = [LabeledQuestion(f"new question {i}?", "c", "x") for i in range(100)]
    text = ingest.stable_split(candidates, 0.1, 0)[1][0].text
    (raw / "labeled.jsonl").write_text(json.dumps({"text": text, "class_id": "c"}) + "\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=str(raw),
                        custom={"train": "train.csv", "test": "test.csv"})
    with caplog.at_level(logging.WARNING, logger="tqc.stages.ingest"):
        report = ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")
    assert {q.class_id for q in load_questions(tmp_path / "out" / "train.jsonl")} == {"a", "b"}
    assert report["classes_without_validation_rows"] == ["b"] and report["classes_without_train_rows"] == ["c"]
    assert "1 class(es) have training rows but no validation row" in caplog.text and "'b'" in caplog.text
    assert "1 class(es) have validation rows but no training row" in caplog.text and "'c'" in caplog.text


@pytest.mark.parametrize("key,said", [("train", "data.custom.train 'trian.csv': no file .*trian.csv"),
                                      ("test", "data.custom.test 'tset.csv': no file .*tset.csv"),
                                      ("catalog", "data.custom.catalog 'intent.csv': no file .*intent.csv")])
def test_a_custom_file_that_is_not_there_is_named_by_its_setting(tmp_path, key, said):
    """A misspelt `catalog: intent.csv` said "/data/intent.csv: file not found": not which setting, nor that the path
    is relative to data.data_dir, as a missing data.validation_file's message says."""
    write(tmp_path, "train.csv", b"question,label\nwhere is rome,LOC\n")
    write(tmp_path, "test.csv", b"question,label\nwhere is paris,LOC\n")
    write(tmp_path, "catalog.csv", b"class_id,text\nLOC,Where is it?\n")
    custom = {"train": "train.csv", "test": "test.csv", "catalog": "catalog.csv", "text_column": "question",
              key: {"train": "trian.csv", "test": "tset.csv", "catalog": "intent.csv"}[key]}
    with pytest.raises(ReaderError, match=rf"^{said} \(the path is relative to data.data_dir, {re.escape(str(tmp_path))}\)$"):
        read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), additions=None, custom=custom))


@pytest.mark.parametrize("name,data", [
    ("train.json", b'[{"question": "where is rome", "intent": "LOC"}, {"question": "who is he", "intent": "HUM"}]\n'),
    ("train.txt", b'{"question": "where is rome", "intent": "LOC"}\n{"question": "who is he", "intent": "HUM"}\n'),
])
def test_json_under_a_csv_name_is_said_to_be_json_not_blamed_on_its_columns(tmp_path, name, data):
    """A JSON array in train.json said "the header repeats column(s) ['"intent": "LOC"}', ...]", and JSONL named .txt
    "missing column(s) ['question', 'intent']": the file and line, but the wrong reason."""
    path = write(tmp_path, name, data)
    with pytest.raises(ReaderError, match=rf"^{re.escape(str(path))}, line 1: JSON, not a CSV header; .*\.jsonl or \.ndjson"):
        read_table(path, "question", "intent")


def test_a_folder_named_as_a_custom_file_is_named_by_its_setting(tmp_path):
    """`train: sub` (a folder) said "/data/sub: a folder, not a file", naming no setting, where a missing file names it."""
    (tmp_path / "sub").mkdir()
    write(tmp_path, "test.csv", b"question,label\nwhere is paris,LOC\n")
    custom = {"train": "sub", "test": "test.csv", "text_column": "question"}
    with pytest.raises(ReaderError, match=r"^data.custom.train 'sub': a folder, not a file: .*sub \(the path is relative"):
        read_dataset(DataParams(dataset="custom", data_dir=str(tmp_path), additions=None, custom=custom))


@pytest.mark.parametrize("custom,said", [
    ({"text_column": "utterence"}, r"train.csv, line 1: missing column\(s\) \['utterence'\]: the header has "
                                   r"\['question', 'label'\] \(named by data.custom.text_column\)$"),
    ({"text_column": "text"}, r"train.csv, line 1: missing column\(s\) \['text'\]: .* \(named by data.custom.text_column\)$"),
    ({"text_column": "question", "label_column": "intent"}, r"\['intent'\]: .* \(named by data.custom.label_column\)$"),
    ({"text_column": "question", "catalog_id_column": "id"},
     r"catalog.csv, line 1: missing column\(s\) \['id'\]: .* \(named by data.custom.catalog_id_column\)$"),
    ({"text_column": "question", "catalog_text_column": "standard_question"},
     r"catalog.csv, line 1: missing column\(s\) \['standard_question'\]: .* \(named by data.custom.catalog_text_column\)$")])
def test_a_column_the_header_lacks_names_the_setting_that_named_it(tmp_path, custom, said):
    """A misspelt `text_column: utterence` said which column the header lacks and which it has, but not which setting
    to fix: a user who kept the default `text` does not know that data.custom.text_column chose it."""
    from tqc.readers import MissingColumns

    write(tmp_path, "train.csv", b"question,label\nwhere is rome,LOC\n")
    write(tmp_path, "test.csv", b"question,label\nwhere is paris,LOC\n")
    write(tmp_path, "catalog.csv", b"class_id,text\nLOC,Where is it?\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None,
                        custom={"train": "train.csv", "test": "test.csv", "catalog": "catalog.csv", **custom})
    with pytest.raises(MissingColumns, match=said):
        read_dataset(params)


def jsonl(rows: list[dict]) -> bytes:
    import json

    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@pytest.mark.parametrize("custom,said", [
    ({"text_column": "utterance"}, r"train.jsonl: missing column\(s\) \['utterance'\] in all 40 record\(s\): line 1 has "
                                   r"\['text', 'label'\] \(named by data.custom.text_column\)$"),
    ({"label_column": "intent"}, r"train.jsonl: missing column\(s\) \['intent'\] .* \(named by data.custom.label_column\)$"),
    ({"catalog_id_column": "id"},
     r"catalog.jsonl: missing column\(s\) \['id'\] in all 2 record\(s\): .* \(named by data.custom.catalog_id_column\)$")])
def test_a_key_no_jsonl_record_has_is_one_error_naming_the_setting_as_a_csv_header_without_it_is(tmp_path, custom, said):
    """`text_column: utterance` over records keyed `text` rejected every line, each with the same reason, where the
    CSV reader says once which column the header lacks and which setting named it."""
    from tqc.readers import MissingColumns

    write(tmp_path, "train.jsonl", jsonl([{"text": f"where is city {i}?", "label": "LOC"} for i in range(40)]))
    write(tmp_path, "test.jsonl", jsonl([{"text": "where is paris?", "label": "LOC"}]))
    write(tmp_path, "catalog.jsonl", jsonl([{"class_id": "LOC", "text": "Where is it?"},
                                            {"class_id": "HUM", "text": "Who is it?"}]))
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None,
                        custom={"train": "train.jsonl", "test": "test.jsonl", "catalog": "catalog.jsonl", **custom})
    with pytest.raises(MissingColumns, match=said) as raised:
        read_dataset(params)
    assert "\n" not in str(raised.value) and "line 2" not in str(raised.value)


def test_a_few_jsonl_records_without_a_mapped_key_among_many_are_still_rejected_by_line(tmp_path):
    """Only a key that no record has is the mapping's fault; a record or two without it are those rows' own."""
    rows = [{"text": f"where is city {i}?", "label": "LOC"} for i in range(40)]
    rows[7] = {"txt": "where is rome?", "label": "LOC"}
    rows[30] = {"text": "where is oslo?"}
    path = write(tmp_path, "train.jsonl", jsonl(rows))
    result = read_table(path, "text", "label")
    assert len(result.rows) == 38
    assert [(r.line, r.reason) for r in result.rejected] == [
        (8, "missing column(s) ['text']: the record has ['txt', 'label']"),
        (31, "missing column(s) ['label']: the record has ['text']")]


def test_a_jsonl_file_of_no_object_is_rejected_line_by_line_not_said_to_lack_a_key(tmp_path):
    """No record to have a key or not: every line's own reason (not JSON) says what is wrong."""
    path = write(tmp_path, "train.jsonl", b"text,label\nwhere is rome?,LOC\n")
    result = read_table(path, "text", "label")
    assert [r.reason.split(":")[0] for r in result.rejected] == ["not valid JSON", "not valid JSON"]


def test_a_jsonl_file_of_mostly_broken_lines_names_them_not_the_key_its_one_object_lacks(tmp_path):
    """One `{}` among lines that are no JSON was "missing column(s) ['text', 'label'] in all 1 record(s)", named by
    data.custom's settings: the mapping blamed, and not a word of the lines a user must fix."""
    from tqc.readers import RowsRejected

    write(tmp_path, "train.jsonl", b'{"text": "where is rome?", "label" LOC}\nwhere is oslo?,LOC\n{}\n{"text": "who"\n')
    write(tmp_path, "test.jsonl", jsonl([{"text": "where is paris?", "label": "LOC"}]))
    write(tmp_path, "catalog.jsonl", jsonl([{"class_id": "LOC", "text": "Where is it?"}]))
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None,
                        custom={"train": "train.jsonl", "test": "test.jsonl", "catalog": "catalog.jsonl"})
    with pytest.raises(RowsRejected) as raised:
        read_dataset(params)
    said = str(raised.value)
    assert said.startswith(f"{tmp_path / 'train.jsonl'}: no usable rows (4 rejected; rejected line 1: not valid JSON: ")
    assert "; line 2: not valid JSON: " in said and "; line 4: not valid JSON: " in said and "\n" not in said
    assert "line 3: missing column(s) ['text', 'label']: the record has []" in said and "named by" not in said


def test_own_files_set_beside_a_shipped_dataset_are_said_to_be_left_unread(tmp_path, caplog):
    """data.custom.train and test set with `dataset: trec6` left as it was read TREC-6 without a word where its files
    were there (the default data_dir): the user's own files were never trained on."""
    (tmp_path / "trec").mkdir()
    for name in ("train_5500.label", "TREC_10.label"):
        write(tmp_path, f"trec/{name}", b"LOC:city Where is Rome ?\nHUM:ind Who wrote Hamlet ?\n")
    params = DataParams(dataset="trec6", data_dir=str(tmp_path), additions=None,
                        custom={"train": "mine/train.csv", "test": "mine/test.csv"})
    with caplog.at_level("WARNING", logger="tqc.readers"):
        assert len(read_dataset(params).train.rows) == 2
    assert (f"data.custom.train and data.custom.test set, but data.dataset is 'trec6', so {tmp_path}/trec/train_5500.label "
            f"and {tmp_path}/trec/TREC_10.label are read instead; data.dataset: custom reads your files") in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tqc.readers"):
        read_dataset(DataParams(dataset="trec6", data_dir=str(tmp_path), additions=None))
    assert "data.custom" not in caplog.text


def test_a_shipped_datasets_missing_file_names_data_dataset_and_a_custom_file_left_unread(tmp_path):
    """Own files under data_dir with `dataset: trec6` left as it was said "/data/trec/train_5500.label: file not
    found", which names neither the setting that chose TREC nor the data.custom.train it ignored."""
    write(tmp_path, "train.csv", b"question,label\nwhere is rome,LOC\n")
    params = DataParams(dataset="trec6", data_dir=str(tmp_path), custom={"train": "train.csv", "test": "test.csv"})
    with pytest.raises(ReaderError, match=rf"^{re.escape(str(tmp_path))}/trec/train_5500.label: file not found \(data.dataset "
                                          r"'trec6' reads it under data.data_dir; data.custom.train is set, which only "
                                          r"data.dataset: custom reads\)$"):
        read_dataset(params)
    with pytest.raises(ReaderError, match=r"train_5500.label: file not found \(data.dataset 'trec6' reads it under "
                                          r"data.data_dir\)$"):
        read_dataset(DataParams(dataset="trec6", data_dir=str(tmp_path)))
