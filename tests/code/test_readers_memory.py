"""What the readers hold while they read: the file's text and the rows they give, not the text again, its lines or
every record besides."""

import pickle
import tracemalloc

import pytest

from tqc.readers import ReaderError, read_table, read_texts, split_lines
from tqc.readers.decoding import iter_lines
from tqc.schema import LabeledQuestion

WORDS = "what where who how many is the of capital river city first largest country name".split()


def _questions(rows: int) -> list[str]:
    return [" ".join(WORDS[(row + k) % len(WORDS)] for k in range(10)) + f" {row}?" for row in range(rows)]


def _held_beyond_the_rows(read) -> tuple[int, int]:
    """(bytes the read held at its peak beyond what it returned, bytes it returned), as tracemalloc counts them."""
    tracemalloc.start()
    try:
        result = read()
        returned, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result  # kept alive until measured
    return peak - returned, returned


@pytest.mark.parametrize("name", ["train.csv", "train.jsonl"])
def test_reading_a_file_holds_little_beyond_its_rows(tmp_path, name):
    """Reading held the bytes, the text, the text again as io.StringIO (four bytes a character) or a list of lines, and
    every record, then every row: about 6 x the file beyond the rows. Now the text, and a record at a time."""
    path = tmp_path / name
    texts = _questions(20000)
    if name.endswith(".csv"):
        path.write_text("question,label\n" + "".join(f"{text},c{row % 50}\n" for row, text in enumerate(texts)))
    else:
        path.write_text("".join(f'{{"question": "{text}", "label": "c{row % 50}"}}\n' for row, text in enumerate(texts)))
    size = path.stat().st_size
    beyond, returned = _held_beyond_the_rows(lambda: read_table(path, "question", "label"))
    assert beyond < 2 * size, f"held {beyond / size:.1f} x the file beyond its rows"
    texts_beyond, _ = _held_beyond_the_rows(lambda: read_texts(path, "question"))
    assert texts_beyond < 2 * size, f"held {texts_beyond / size:.1f} x the file beyond its texts"


def test_rows_name_each_label_once(tmp_path):
    """50 labels over 2,000 rows are 50 strings, not one a row."""
    path = tmp_path / "train.csv"
    path.write_text("question,label\n" + "".join(f"{text},c{row % 50}\n" for row, text in enumerate(_questions(2000))))
    rows = read_table(path, "question", "label").rows
    assert len({id(row.class_id) for row in rows}) == 50


def test_a_labeled_question_has_no_dict_and_still_pickles_and_compares():
    """__slots__: a file's rows are held at once, and each one's __dict__ cost as much again as the row."""
    row = LabeledQuestion("What is it?", "DESC", "f.csv:2", origins=["f.csv:1"])
    assert not hasattr(row, "__dict__")
    assert row.origins == ("f.csv:1",)  # __post_init__ still makes JSON's list a tuple
    assert pickle.loads(pickle.dumps(row)) == row
    with pytest.raises(AttributeError):
        row.text = "changed"  # frozen still


@pytest.mark.parametrize(("text", "lines"), [
    ("", []), ("\n", [""]), ("a", ["a"]), ("a\n", ["a"]), ("a\r\nb\rc\n\nd", ["a", "b", "c", "", "d"]), ("a\r", ["a"]),
    ("\r\n\r\n", ["", ""]), ("x\u2028y\n", ["x\u2028y"]), ("\n\na", ["", "", "a"]), ("a\n\r", ["a", ""])])
def test_lines_break_at_lf_crlf_and_cr_alone_and_a_final_break_starts_no_line(text, lines):
    assert split_lines(text) == lines
    assert list(iter_lines(text)) == lines  # the readers' lazy form


def test_a_malformed_line_is_said_before_the_headers_problem(tmp_path):
    """Records are read in two passes, where they were held: the first still reads the whole file before the header
    is judged, so a file with both says its malformed line, as it did."""
    path = tmp_path / "t.csv"
    path.write_text('text,other\nWhat is it?,DESC\n"Jaws" was directed by whom?,HUM\n')
    with pytest.raises(ReaderError, match=r"t.csv, line 3: malformed CSV"):
        read_table(path, "text", "label")


def test_a_quote_never_closed_is_judged_by_labels_of_the_whole_file(tmp_path):
    """The labels that tell a swallowed row come from every record, those after the swallowing one too."""
    path = tmp_path / "t.csv"
    path.write_text('text,label\n"Who wrote Jaws?,HUM\nWhat is LOL?,DESC\nWhere is Paris?",LOC\nWhat is it?,DESC\n')
    result = read_table(path, "text", "label")
    assert [r.line for r in result.rejected] == [2]
    assert "reads as a row of its own" in result.rejected[0].reason
    assert [(q.text, q.class_id) for q in result.rows] == [("What is it?", "DESC")]
