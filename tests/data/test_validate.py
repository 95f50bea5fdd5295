"""Data contracts: the Great Expectations suite quarantines bad rows and stops on wholesale failure."""

import logging
import pytest

from tqc.config import ValidateParams
from tqc.io import read_json, read_jsonl
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, save_questions
from tqc.stages.validate import ValidationFailed, run


def write_splits(directory, train, validation, test, catalog=(("a", "Question a?"), ("b", "Question b?"))):
    directory.mkdir(parents=True, exist_ok=True)
    Catalog([StandardQuestion(c, t) for c, t in catalog]).save(directory / "catalog.jsonl")
    for name, rows in (("train", train), ("validation", validation), ("test", test)):
        save_questions(directory / f"{name}.jsonl", [LabeledQuestion(t, c, f"{name}.csv:{i + 1}") for i, (t, c) in enumerate(rows)])


def run_validate(tmp_path, params=None, docs=False):
    return run(tmp_path / "in", params or ValidateParams(max_quarantined_fraction=0.5, min_examples_per_class=1),
               tmp_path / "out", tmp_path / "quarantine.jsonl", tmp_path / "validation.json",
               tmp_path / "docs" if docs else None)


def test_bad_rows_are_quarantined_with_file_line_expectation_and_content(tmp_path):
    train = [("good one", "a"), ("", "a"), ("unknown label", "zzz"), ("Shared  WITH test", "b"), ("good two", "b"),
             ("good three", "a"), ("GOOD one", "a"), ("bell\x07", "b"), ("x" * 1001, "a"), ("in validation", "a")]
    write_splits(tmp_path / "in", train, [("fine", "a"), ("in validation", "a")], [("shared with test", "b"), ("held out", "a")])
    report = run_validate(tmp_path)
    quarantined = read_jsonl(tmp_path / "quarantine.jsonl")
    reasons = {(q["file"], q["line"]): q["expectations"] for q in quarantined}
    assert reasons == {
        ("train.csv", 2): ["non_empty_text"],
        ("train.csv", 3): ["label_in_catalog"],
        ("train.csv", 4): ["no_leakage"],
        ("train.csv", 7): ["no_duplicates"],
        ("train.csv", 8): ["no_control_characters"],
        ("train.csv", 9): ["text_length"],
        ("train.csv", 10): ["no_leakage"],
    }
    assert quarantined[0]["content"] == {"text": "", "class_id": "a"}
    # each reason names the other row at stake; no record named the copy kept, nor where a row leaked to
    said = {(q["file"], q["line"]): q["reason"] for q in quarantined}
    assert said[("train.csv", 7)] == "no_duplicates: duplicate of train.csv, line 1"
    assert said[("train.csv", 4)] == "no_leakage: also in test at test.csv, line 1"
    assert said[("train.csv", 10)] == "no_leakage: also in validation at validation.csv, line 2"
    assert said[("train.csv", 3)] == "label_in_catalog: 'zzz' is no class of the catalog"
    assert said[("train.csv", 2)] == "non_empty_text"
    assert said[("train.csv", 8)] == "no_control_characters: U+0007 at character 5"  # which one, and where: "bell\x07"
    assert said[("train.csv", 9)] == "text_length: 1001 characters, over validate.max_text_chars"
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "train.jsonl")] == ["good one", "good two", "good three"]
    for split in ("train", "validation", "test"):  # nothing silently lost
        assert report["accepted"][split] + report["quarantined"][split] == report["read"][split]
    assert read_json(tmp_path / "validation.json") == report


def test_a_label_conflict_keeps_neither_row(tmp_path):
    write_splits(tmp_path / "in", [("is it safe", "a"), ("Is it  safe", "b"), ("other", "b")], [("fine", "a")], [("held out", "a")])
    report = run_validate(tmp_path)
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "train.jsonl")] == ["other"]
    assert report["quarantined_by_expectation"]["no_label_conflicts"] == 2
    assert [q["reason"] for q in read_jsonl(tmp_path / "quarantine.jsonl")] == [
        "no_label_conflicts: conflicts with train.csv, line 2, labeled 'b'",
        "no_duplicates: duplicate of train.csv, line 1; no_label_conflicts: conflicts with train.csv, line 1, labeled 'a'"]


def test_a_validation_row_labeled_otherwise_in_train_names_the_training_row_and_a_near_miss_label_its_id(tmp_path):
    write_splits(tmp_path / "in", [("is it safe", "a"), ("other", "b")], [("Is it safe", "b"), ("fine", "a")],
                 [("held out", "a"), ("a test row", "B")])
    run_validate(tmp_path)
    said = {(q["split"], q["line"]): q["reason"] for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    assert said[("validation", 1)] == "no_label_conflicts: conflicts with train.csv, line 1 (train), labeled 'a'"
    assert said[("test", 2)] == "label_in_catalog: 'B' is no class of the catalog (the catalog has 'b', alike but for case, width or a float's .0)"


def test_a_test_row_labeled_otherwise_in_train_is_flagged_and_its_training_copy_names_the_other_label(tmp_path):
    """The train copy went as leakage, its reason naming no label, and the test row stayed with its disputed gold
    label unflagged, though the same conflict within test, or between validation and train, is said."""
    write_splits(tmp_path / "in", [("is it safe", "a"), ("other", "b")], [("fine", "a")],
                 [("held out", "a"), ("Is it  safe", "b")])
    report = run_validate(tmp_path)
    said = {(q["split"], q["line"]): q["reason"] for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    assert said == {("train", 1): "no_leakage: also in test at test.csv, line 2, labeled 'b'"}
    assert [(q["split"], q["line"], q["reason"]) for q in report["test_rows_kept_with_warnings"]] == [
        ("test", 2, "no_label_conflicts: conflicts with train.csv, line 1 (train), labeled 'a'")]
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "test.jsonl")] == ["held out", "Is it  safe"]


def test_a_label_alike_two_catalog_ids_is_said_to_match_neither_not_to_be_a_misspelling_of_one(tmp_path):
    """`hum` and `HUM` both ids: ingest reads a `Hum` as neither, and the hint named only the last of them."""
    catalog = (("a", "Question a?"), ("hum", "Who is it?"), ("HUM", "Which person?"), ("ＬＯＣ", "Where is it?"))
    write_splits(tmp_path / "in", [("is it safe", "a"), ("who wrote it", "hum"), ("who sang it", "HUM")], [("fine", "a")],
                 [("a test row", "Hum"), ("where is it now", "loc"), ("which one", "zzz"), ("held out", "a")], catalog)
    run_validate(tmp_path, ValidateParams(max_quarantined_fraction=0.8, min_examples_per_class=1))
    said = {(q["split"], q["line"]): q["reason"] for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    assert said[("test", 1)] == ("label_in_catalog: 'Hum' is no class of the catalog (the catalog has 'hum' and 'HUM', each "
                                 "alike but for case, width or a float's .0, so it was read as neither)")
    assert said[("test", 2)] == ("label_in_catalog: 'loc' is no class of the catalog (the catalog has 'ＬＯＣ', alike but for "
                                 "case, width or a float's .0)")  # width too, as ingest matches labels
    assert said[("test", 3)] == "label_in_catalog: 'zzz' is no class of the catalog"


def test_a_row_that_is_another_classs_standard_question_is_a_label_conflict(tmp_path):
    """`Question a?,b` was accepted unsaid: a training row teaching b with a's own standard question. A row that
    is its own class's standard question (COVID-Q classes' catalog texts are training questions) is no conflict."""
    write_splits(tmp_path / "in", [("question  A?", "b"), ("Question b?", "b"), ("other", "b"), ("more", "a")],
                 [("fine", "a")], [("held out", "a")])
    report = run_validate(tmp_path)
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "train.jsonl")] == ["Question b?", "other", "more"]
    assert [(q["line"], q["reason"]) for q in read_jsonl(tmp_path / "quarantine.jsonl")] == [
        (1, "no_label_conflicts: conflicts with the standard question of class 'a'")]
    assert report["quarantined_by_expectation"] == {"no_label_conflicts": 1}


@pytest.mark.parametrize("label", ["c", "a", "b"])
def test_a_row_of_a_third_class_with_the_standard_question_twins_share_is_a_label_conflict(tmp_path, label):
    """Twins a and b (catalog_unique_texts demoted) share a standard question: validate counted it as no class's, so a
    row of c with it trained c on a's and b's text unsaid, where augment drops a made row of c with it. A row of either
    twin with it is no conflict."""
    catalog = (("a", "What is covid?"), ("b", "what is  COVID?"), ("c", "Question c?"))
    write_splits(tmp_path / "in", [("other", "c"), ("WHAT is covid?", label), ("more", "a"), ("again", "b")],
                 [("fine", "a")], [("held out", "a")], catalog=catalog)
    demoted = [name for name in ValidateParams().critical if name != "catalog_unique_texts"]
    run_validate(tmp_path, ValidateParams(critical=demoted, max_quarantined_fraction=0.5, min_examples_per_class=1))
    quarantined = [(q["file"], q["line"], q["reason"]) for q in read_jsonl(tmp_path / "quarantine.jsonl")]
    if label == "c":
        assert quarantined == [("train.csv", 2, "no_label_conflicts: conflicts with the standard question of classes 'a', 'b'")]
    else:
        assert quarantined == []
        assert "WHAT is covid?" in [q["text"] for q in read_jsonl(tmp_path / "out" / "train.jsonl")]


def test_a_critical_expectation_failing_wholesale_stops_the_stage_and_names_it(tmp_path):
    write_splits(tmp_path / "in", [("x", "zzz"), ("y", "zzz"), ("z", "a")], [("fine", "a")], [("held out", "a")])
    with pytest.raises(ValidationFailed, match="label_in_catalog on train"):
        run_validate(tmp_path, ValidateParams(max_quarantined_fraction=0.1, min_examples_per_class=1))


def test_a_stopped_stage_names_the_failing_rows_and_leaves_the_last_validated_data_as_it_was(tmp_path):
    write_splits(tmp_path / "in", [("x", "a"), ("y", "b")], [("fine", "a")], [("held out", "a")])
    run_validate(tmp_path)
    before = {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()}
    write_splits(tmp_path / "in", [("x", "zzz"), ("y", "zzz"), ("z", "a")], [("fine", "a")], [("held out", "a")])
    with pytest.raises(ValidationFailed, match=r"label_in_catalog on train \(2 row\(s\), 66.7%, more than validate.max_quarantined_fraction "
                                               r"\(0.1\), e.g. train.csv line 1 \(label_in_catalog: 'zzz' is no class of "
                                               r"the catalog\), train.csv line 2\); every failing row, with its reasons, is in .*quarantine.jsonl"):
        run_validate(tmp_path, ValidateParams(max_quarantined_fraction=0.1, min_examples_per_class=1))
    assert {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()} == before  # `tqc validate FILE` judges against it
    assert len(read_jsonl(tmp_path / "quarantine.jsonl")) == 2  # the diagnosis is written all the same


def write_train_lines(directory, rows):
    """Training rows read from the given lines of train.csv, in this order (ingest shuffles each class)."""
    write_splits(directory, [], [("fine", "a")], [("held out", "a")])
    save_questions(directory / "train.jsonl", [LabeledQuestion(t, c, f"train.csv:{line}") for line, t, c in rows])


def test_a_stop_names_the_setting_it_exceeds_and_the_files_first_failing_lines(tmp_path):
    """A user's 30 empty texts stopped validate with "non_empty_text on train (30 rows, 10.1%, e.g. train.csv line
    322, train.csv line 319, train.csv line 320)": neither the knob that decides (nor its value) nor the file's first
    failing lines, which came in ingest's shuffled order."""
    write_train_lines(tmp_path / "in", [(5, "x", "zzz"), (1, "ok", "a"), (9, "w", "zzz"), (2, "y", "zzz"), (3, "b", "b")])
    with pytest.raises(ValidationFailed, match=r"label_in_catalog on train \(3 row\(s\), 60.0%, more than "
                                               r"validate.max_quarantined_fraction \(0.1\), e.g. train.csv line 2 "
                                               r"\(label_in_catalog: 'zzz' is no class of the catalog\), "
                                               r"train.csv line 5, train.csv line 9\)"):
        run_validate(tmp_path, ValidateParams(max_quarantined_fraction=0.1, min_examples_per_class=1))


def test_rows_quarantined_under_the_threshold_are_named_in_the_warning(tmp_path, caplog):
    """"expectation non_empty_text on train failed for 2 rows: rows quarantined" named no file or line."""
    write_train_lines(tmp_path / "in", [(7, "", "a"), (1, "ok", "a"), (4, "  ", "b"), (2, "b one", "b"), (3, "a two", "a")])
    with caplog.at_level(logging.WARNING):
        run_validate(tmp_path, ValidateParams(max_quarantined_fraction=0.5, min_examples_per_class=1))
    assert ("expectation non_empty_text on train failed for 2 row(s), e.g. train.csv line 4, train.csv line 7: "
            "rows quarantined" in caplog.text)


def test_c1_control_characters_from_mis_decoded_bytes_are_quarantined(tmp_path):
    write_splits(tmp_path / "in", [("what\x92s the fee", "a"), ("fine question", "b"), ("tab\tand line ok", "a")],
                 [("fine", "a")], [("held out", "a")])
    run_validate(tmp_path)
    assert [(q["line"], q["expectations"]) for q in read_jsonl(tmp_path / "quarantine.jsonl")] == [(1, ["no_control_characters"])]


@pytest.mark.parametrize("control", ["\x0b", "\x0c", "\x1f", "\x7f", "\x85"])  # VT, FF, US, DEL, C1's NEL
def test_each_control_character_but_tab_and_line_breaks_is_quarantined(tmp_path, control):
    write_splits(tmp_path / "in", [(f"bell{control}ring", "a"), ("fine question", "b"), ("another one", "a")],
                 [("fine", "a")], [("held out", "a")])
    run_validate(tmp_path)
    assert [(q["line"], q["expectations"]) for q in read_jsonl(tmp_path / "quarantine.jsonl")] == [(1, ["no_control_characters"])]


def test_text_length_is_the_raw_texts_and_an_underscore_is_no_letter_or_digit(tmp_path):
    """A text over max_text_chars as written but under it normalised (its spaces collapsed) is too long: the tokenizer
    and the first-copy rule read the raw text. `_` is a word character to a regex's \\w, not a letter or digit."""
    train = [("what" + " " * 20 + "is it", "a"), ("___", "b"), ("fine question", "b"), ("another one", "a"),
             ("a third one", "a"), ("a fourth one", "b")]
    write_splits(tmp_path / "in", train, [("fine", "a")], [("held out", "a")])
    run_validate(tmp_path, ValidateParams(max_text_chars=20, max_quarantined_fraction=0.5, min_examples_per_class=1))
    assert [(q["line"], q["expectations"]) for q in read_jsonl(tmp_path / "quarantine.jsonl")] == [
        (1, ["text_length"]), (2, ["has_letter_or_digit"])]


def test_empty_texts_are_no_leak_and_a_label_conflict_is_not_also_a_duplicate(tmp_path):
    """An empty train row beside an empty validation row is empty, not a leak of it; a row whose text another row
    has under another label conflicts, and is no repeat of that row (the first copy is the first with a label the
    catalog has)."""
    train = [("", "a"), ("is it safe", "zzz"), ("Is it safe", "a"), ("fine question", "b"), ("another one", "a"),
             ("a third one", "b"), ("a fourth one", "a"), ("a fifth one", "b")]
    write_splits(tmp_path / "in", train, [("", "a"), ("fine", "a"), ("fine too", "b")], [("held out", "a")])
    report = run_validate(tmp_path, ValidateParams(max_quarantined_fraction=0.5, min_examples_per_class=1))
    reasons = {(q["split"], q["line"]): q["expectations"] for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    assert reasons[("train", 1)] == ["non_empty_text"]
    assert reasons[("train", 3)] == ["no_label_conflicts"]
    assert "no_leakage" not in report["quarantined_by_expectation"]


def test_a_warning_expectation_only_quarantines(tmp_path):
    write_splits(tmp_path / "in", [("x", "zzz"), ("y", "zzz"), ("z", "a")], [("fine", "a")], [("held out", "a")])
    params = ValidateParams(critical=["schema"], max_quarantined_fraction=0.1, min_examples_per_class=1)
    report = run_validate(tmp_path, params)
    assert report["accepted"]["train"] == 1
    failed = {(e["name"], e["table"], e["severity"]) for e in report["expectations"] if not e["success"]}
    assert ("label_in_catalog", "train", "warning") in failed


def test_class_counts_and_imbalance_are_reported_and_warn(tmp_path, caplog):
    train = [(f"a question {i}", "a") for i in range(12)] + [("b question", "b")]
    write_splits(tmp_path / "in", train, [("fine", "a")], [("held out", "a")])
    report = run_validate(tmp_path, ValidateParams(min_examples_per_class=2, max_imbalance_ratio=10))
    assert report["class_imbalance_ratio"] == 12.0
    assert report["classes_below_min_examples"] == ["b"]
    failed = {e["name"] for e in report["expectations"] if not e["success"]}
    assert {"min_examples_per_class", "class_imbalance"} <= failed
    assert "class_imbalance" in caplog.text
    assert "expectation min_examples_per_class on class_counts failed (warning)" in caplog.text
    # which class to give more examples, not only how many fail
    assert "min_examples_per_class on class_counts failed (warning): 1 of 2 fail: classes 'b'" in caplog.text


def test_a_table_expectations_observation_is_said_in_words():
    from tqc.stages.validate import _observation

    many = {"element_count": 90, "unexpected_count": 90, "classes": [f"c{i}" for i in range(10)]}
    assert _observation(many) == ("90 of 90 fail: classes 'c0', 'c1', 'c2', 'c3', 'c4', 'c5', 'c6', 'c7', 'c8', 'c9' "
                                  "and 80 more")
    assert _observation({"element_count": 1, "unexpected_count": 1, "observed_value": 12.0}) == "1 of 1 fail; observed 12.0"
    assert _observation({}) == "no observation"


def test_empty_texts_are_empty_not_copies_of_each_other(tmp_path):
    write_splits(tmp_path / "in", [("", "a"), ("", "b"), ("fine", "a"), ("good", "b"), ("great", "a")], [("also fine", "a")], [("", "a"), ("held out", "a")])
    run_validate(tmp_path)
    reasons = {(q["file"], q["line"]): q["expectations"] for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    assert reasons == {("train.csv", 1): ["non_empty_text"], ("train.csv", 2): ["non_empty_text"],
                       ("test.csv", 1): ["non_empty_text"]}


def test_a_text_of_invisible_characters_only_is_empty(tmp_path):
    """Zero-width spaces, a word joiner or a stray byte-order mark are no question: they do not count as text. Nor do
    lone accents or U+FFFD (a byte once mis-decoded), which the tokenizer reads as the empty question: they went into
    training, where the served model refuses them."""
    train = [("\u200b", "a"), ("\u200b \u200b", "b"), ("\ufeff", "a"), ("\u0301\u0301", "b"), ("\ufffd", "a"),
             ("fine", "a"), ("good", "b"), ("great", "a"), ("café", "b"), ("nice", "a"), ("well", "b")]
    write_splits(tmp_path / "in", train, [("also fine", "a")], [("\u2060", "a"), ("\ufffd \ufffd", "b"), ("held out", "a"), ("kept", "b")])
    run_validate(tmp_path)
    reasons = {(q["file"], q["line"]): q["expectations"] for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    assert reasons == {("train.csv", 1): ["non_empty_text"], ("train.csv", 2): ["non_empty_text"],
                       ("train.csv", 3): ["non_empty_text"], ("train.csv", 4): ["non_empty_text"],
                       ("train.csv", 5): ["non_empty_text"], ("test.csv", 1): ["non_empty_text"],
                       ("test.csv", 2): ["non_empty_text"]}
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "test.jsonl")] == ["held out", "kept"]


@pytest.mark.parametrize("catalog,expectation", [
    ((("a", "Same text?"), ("b", "same  TEXT?")), "catalog_unique_texts"),
    ((("a", "Question a?"), ("b", "")), "catalog_non_empty_texts"),
    ((("a", "Question a?"), ("b", "\u200b")), "catalog_non_empty_texts"),
    ((("a", "Question a?"), ("b", "\ufffd")), "catalog_non_empty_texts"),
])
def test_a_broken_catalog_stops_the_stage_naming_the_classes(tmp_path, catalog, expectation):
    write_splits(tmp_path / "in", [("x", "a"), ("y", "b")], [("fine", "a")], [("held out", "a")], catalog=catalog)
    failing = "'a', 'b'" if expectation == "catalog_unique_texts" else "'b'"
    with pytest.raises(ValidationFailed, match=f"{expectation} on catalog \\(\\d of 2 fail: classes {failing}\\)"):
        run_validate(tmp_path)


def test_a_text_of_no_letter_or_digit_is_quarantined_and_a_word_of_any_script_is_not(tmp_path):
    """"???" or a dash alone passed every expectation and went into training as a question of its class."""
    train = [("???", "a"), ("—", "b"), ("?!  ...", "a"), ("🍕?", "b"), ("fine", "a"), ("2+2?", "b"),
             ("¿Qué?", "a"), ("北京在哪里", "b"), ("٣", "a"), ("x²?", "b"), ("", "a")]
    write_splits(tmp_path / "in", train, [("also fine", "a"), ("--", "b")], [("!!", "a"), ("held out", "a")])
    report = run_validate(tmp_path)
    quarantined = {(q["file"], q["line"]): (q["expectations"], q["reason"]) for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    no_word = (["has_letter_or_digit"], "has_letter_or_digit: no letter or digit, so no question to classify")
    assert quarantined == {("train.csv", 1): no_word, ("train.csv", 2): no_word, ("train.csv", 3): no_word,
                           ("train.csv", 4): no_word, ("validation.csv", 2): no_word,
                           ("train.csv", 11): (["non_empty_text"], "non_empty_text")}  # empty: said once, not twice
    # a warning by default: a test row keeps its place in test (it can be scored), flagged
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "test.jsonl")] == ["!!", "held out"]
    assert [(q["line"], q["expectations"]) for q in report["test_rows_kept_with_warnings"]] == [(1, ["has_letter_or_digit"])]
    assert {(e["table"], e["severity"]) for e in report["expectations"] if e["name"] == "has_letter_or_digit"} == {
        ("train", "warning"), ("validation", "warning"), ("test", "warning")}


def test_a_test_row_that_is_its_own_standard_question_is_flagged_and_stays(tmp_path):
    """Such a row is answered by matching its own text and flatters every model: flagged (a warning), so the report
    says how many test rows are free; a train or validation row may be its class's standard question."""
    write_splits(tmp_path / "in", [("Question a?", "a"), ("y", "b")], [("question  A?", "a")],
                 [("held out", "a"), ("QUESTION b?", "b")])
    report = run_validate(tmp_path)
    assert [(q["split"], q["line"], q["reason"]) for q in report["test_rows_kept_with_warnings"]] == [
        ("test", 2, "not_own_standard_question: word for word the standard question of its class 'b', "
                    "so it is scored against its own text")]
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "test.jsonl")] == ["held out", "QUESTION b?"]
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "validation.jsonl")] == ["question  A?"]
    outcome = {e["table"]: e["success"] for e in report["expectations"] if e["name"] == "not_own_standard_question"}
    assert outcome == {"train": True, "validation": True, "test": False}


def test_a_test_row_that_is_its_own_standard_question_leaves_test_when_made_critical(tmp_path):
    write_splits(tmp_path / "in", [("x", "a"), ("y", "b")], [("fine", "a")], [("held out", "a"), ("Question b?", "b")])
    params = ValidateParams(max_quarantined_fraction=0.5, min_examples_per_class=1,
                            critical=[*ValidateParams().critical, "not_own_standard_question"])
    report = run_validate(tmp_path, params)
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "test.jsonl")] == ["held out"]
    assert report["quarantined_by_expectation"] == {"not_own_standard_question": 1}


def test_has_letter_or_digit_made_critical_stops_the_stage_on_wholesale_failure(tmp_path):
    write_splits(tmp_path / "in", [("???", "a"), ("!!!", "b"), ("fine", "a")], [("also fine", "a")], [("held out", "a")])
    params = ValidateParams(max_quarantined_fraction=0.1, min_examples_per_class=1,
                            critical=[*ValidateParams().critical, "has_letter_or_digit"])
    with pytest.raises(ValidationFailed, match=r"has_letter_or_digit on train \(2 row\(s\), 66.7%"):
        run_validate(tmp_path, params)


def test_data_docs_are_built_as_html(tmp_path):
    write_splits(tmp_path / "in", [("x", "a"), ("y", "b")], [("fine", "a")], [("held out", "a")])
    run_validate(tmp_path, docs=True)
    assert (tmp_path / "docs" / "index.html").is_file()
    assert list((tmp_path / "docs" / "validations").rglob("*.html"))


def test_test_rows_leave_test_only_when_they_cannot_be_scored(tmp_path, caplog):
    test = [("held out", "a"), ("Held  out", "a"), ("bell\x07", "b"), ("", "a"), ("unknown label", "zzz"), ("other", "b")]
    write_splits(tmp_path / "in", [("x", "a"), ("y", "b")], [("fine", "a")], test)
    with caplog.at_level("WARNING", logger="tqc.stages.validate"):
        report = run_validate(tmp_path, ValidateParams(max_quarantined_fraction=0.5, min_examples_per_class=1))
    # each expectation's warning says where its rows went: the log said "rows quarantined" of rows kept in test
    said = {m.split(" failed")[0]: m for m in caplog.messages if m.startswith("expectation ")}
    assert said["expectation no_control_characters on test"].endswith(
        "failed for 1 row(s), e.g. test.csv line 3 (no_control_characters: U+0007 at character 5): kept in test "
        "(the report's test_rows_kept_with_warnings) unless another expectation quarantined them")
    assert said["expectation non_empty_text on test"].endswith("failed for 1 row(s), e.g. test.csv line 4: rows quarantined")
    kept = [q["text"] for q in read_jsonl(tmp_path / "out" / "test.jsonl")]
    assert kept == ["held out", "Held  out", "bell\x07", "other"]  # a repeat and a control character are scored
    flagged = {(q["line"], tuple(q["expectations"])) for q in report["test_rows_kept_with_warnings"]}
    assert flagged == {(2, ("no_duplicates",)), (3, ("no_control_characters",))}
    quarantined = {q["line"]: q["expectations"] for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    assert quarantined == {4: ["non_empty_text"], 5: ["label_in_catalog"]}
    assert report["accepted"]["test"] + report["quarantined"]["test"] == report["read"]["test"]


def test_unscorable_test_rows_leave_test_even_where_their_expectations_are_demoted_to_warnings(tmp_path):
    """An empty text or a label the catalog lacks cannot be scored, whatever the expectation's severity: kept in
    test, evaluate would fail on it. No other test demoted them, so the rule could go unnoticed."""
    write_splits(tmp_path / "in", [("x", "a"), ("y", "b")], [("fine", "a")], [("held out", "a"), ("", "a"), ("what", "zzz")])
    report = run_validate(tmp_path, ValidateParams(critical=["schema"], max_quarantined_fraction=0.9, min_examples_per_class=1))
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "test.jsonl")] == ["held out"]
    assert report["test_rows_kept_with_warnings"] == []
    quarantined = {q["line"]: q["expectations"] for q in read_jsonl(tmp_path / "quarantine.jsonl") if q["split"] == "test"}
    assert quarantined == {2: ["non_empty_text"], 3: ["label_in_catalog"]}


def test_a_test_row_failing_an_expectation_made_critical_is_said_quarantined_not_kept(tmp_path, caplog):
    """Below max_quarantined_fraction a critical expectation's test rows leave test (check's test policy), yet the
    warning said they were kept in test: the "kept" wording is for warning-level failures only."""
    test = [("held out", "a"), ("bell\x07", "b"), ("other", "b")]
    write_splits(tmp_path / "in", [("x", "a"), ("y", "b")], [("fine", "a")], test)
    params = ValidateParams(max_quarantined_fraction=0.5, min_examples_per_class=1,
                            critical=[*ValidateParams().critical, "no_control_characters"])
    with caplog.at_level("WARNING", logger="tqc.stages.validate"):
        report = run_validate(tmp_path, params)
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "test.jsonl")] == ["held out", "other"]
    assert report["test_rows_kept_with_warnings"] == []
    said = [m for m in caplog.messages if m.startswith("expectation no_control_characters on test")]
    assert said == ["expectation no_control_characters on test failed for 1 row(s), e.g. test.csv line 2 "
                    "(no_control_characters: U+0007 at character 5): rows quarantined"]


def test_a_validation_split_emptied_by_quarantine_stops_the_stage(tmp_path):
    write_splits(tmp_path / "in", [("good one", "a"), ("good two", "b")], [("good one", "zzz")], [("held out", "a")])
    with pytest.raises(ValidationFailed, match="no validation rows left in .*validation.jsonl \\(1 read, 1 quarantined"):
        run_validate(tmp_path, ValidateParams(max_quarantined_fraction=1.0, min_examples_per_class=1))


def test_a_train_split_emptied_by_warning_level_quarantine_stops_the_stage(tmp_path):
    """Texts over max_text_chars fail only a warning-level expectation: every train row went to quarantine, validate
    passed, and stage one took no step."""
    write_splits(tmp_path / "in", [("a" * 50, "a"), ("b" * 50, "b")], [("fine", "a")], [("held out", "a")])
    with pytest.raises(ValidationFailed, match="no train rows left in .*train.jsonl \\(2 read, 2 quarantined"):
        run_validate(tmp_path, ValidateParams(max_quarantined_fraction=1.0, min_examples_per_class=1, max_text_chars=20))


def test_a_test_split_emptied_by_quarantine_stops_the_stage(tmp_path):
    write_splits(tmp_path / "in", [("good one", "a"), ("good two", "b")], [("fine", "a")], [("held out", "zzz")])
    with pytest.raises(ValidationFailed, match="no test rows left in .*test.jsonl \\(1 read, 1 quarantined"):
        run_validate(tmp_path, ValidateParams(max_quarantined_fraction=1.0, min_examples_per_class=1))


def test_a_class_that_loses_every_train_row_is_named(tmp_path, caplog):
    write_splits(tmp_path / "in", [("a" * 50, "a"), ("short b", "b")], [("fine", "a")], [("held out", "a")])
    with caplog.at_level(logging.WARNING, logger="tqc.stages.validate"):
        report = run_validate(tmp_path, ValidateParams(max_quarantined_fraction=1.0, min_examples_per_class=1,
                                                       max_text_chars=20))
    assert report["classes_without_train_rows"] == ["a"] and "lost every train row to quarantine: a" in caplog.text
    assert report["test_classes_without_train_rows"] == {"a": 1}  # by quarantine, or by none in the file: the same to test


def test_a_class_with_test_questions_and_no_training_question_is_named_with_its_count(tmp_path, caplog):
    """A catalog class the training file never uses was only a min_examples_per_class count."""
    write_splits(tmp_path / "in", [("good one", "a"), ("good two", "a")], [("fine", "a")],
                 [("held out", "a"), ("bee one", "b"), ("bee two", "b")])
    with caplog.at_level(logging.WARNING, logger="tqc.stages.validate"):
        report = run_validate(tmp_path, ValidateParams(max_quarantined_fraction=1.0, min_examples_per_class=1))
    assert report["classes_without_train_rows"] == [] and report["test_classes_without_train_rows"] == {"b": 2}
    assert "validate: 1 class(es) have test questions but no training question: b (2 test questions)" in caplog.text


def test_offline_rows_are_checked_like_a_split_and_never_equal_a_held_out_question(tmp_path):
    write_splits(tmp_path / "in", [("good one", "a"), ("good two", "b")], [("fine", "a")], [("held out", "a")])
    save_questions(tmp_path / "in" / "generated.jsonl", [
        LabeledQuestion("good one rewritten", "a", "aug.csv:1", generated=True, origins=("train.csv:1",)),
        LabeledQuestion("Held  out", "a", "aug.csv:2", generated=True, origins=("train.csv:1",)),
        LabeledQuestion("fine", "a", "aug.csv:3", generated=True, origins=("train.csv:1",)),
        LabeledQuestion("no class", "zzz", "aug.csv:4", generated=True, origins=("train.csv:1",))])
    report = run_validate(tmp_path, ValidateParams(max_quarantined_fraction=0.8, min_examples_per_class=1))
    assert report["read"]["generated"] == 4 and report["accepted"]["generated"] == 1
    reasons = {q["line"]: q["expectations"] for q in read_jsonl(tmp_path / "quarantine.jsonl") if q["split"] == "generated"}
    assert reasons == {2: ["no_leakage"], 3: ["no_leakage"], 4: ["label_in_catalog"]}
    (kept,) = read_jsonl(tmp_path / "out" / "generated.jsonl")
    assert kept["text"] == "good one rewritten" and kept["origins"] == ["train.csv:1"]


def test_a_generated_row_that_is_another_classs_training_question_is_quarantined_and_the_training_row_kept(tmp_path):
    write_splits(tmp_path / "in", [("what is x", "a"), ("who is y", "b"), ("what is z", "a")], [("fine", "a")], [("held out", "b")])
    save_questions(tmp_path / "in" / "generated.jsonl", [
        LabeledQuestion("What is  X", "b", "aug.csv:1", origins=("train.csv:2",)),   # a's training question, labelled b
        LabeledQuestion("who is Y", "b", "aug.csv:2", origins=("train.csv:2",)),     # its own class's question: kept
        LabeledQuestion("what was z", "a", "aug.csv:3", origins=("train.csv:3",))])
    run_validate(tmp_path)
    quarantined = read_jsonl(tmp_path / "quarantine.jsonl")
    assert [(q["file"], q["line"], q["expectations"]) for q in quarantined] == [("aug.csv", 1, ["no_label_conflicts"])]
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "generated.jsonl")] == ["who is Y", "what was z"]
    assert len(read_jsonl(tmp_path / "out" / "train.jsonl")) == 3


def test_texts_that_read_the_same_are_the_same_question_for_leakage_and_duplicates(tmp_path):
    from tqc.text import normalise

    # composed and decomposed é, full-width letters, a zero-width space, a typographic apostrophe
    for one, other in (("Où est le café ?", "Ou\u0300 est le cafe\u0301 ?"), ("what is ｐｉｎ", "what is pin"),
                       ("reset my\u200b pin", "reset my pin"), ("what’s a pin", "what's a PIN"),
                       # a tokenised corpus (TREC) beside the same question typed
                       ("How far is it from Denver to Aspen ?", "How far is it from Denver to Aspen?"),
                       ("What is Australia 's capital ?", "What is Australia's capital?"),
                       ("Why does n't it ( really ) work ?", "Why doesn't it (really) work?")):
        assert normalise(one) == normalise(other)
    # not one question: NFKC would fold the superscript, subscript or fraction into the digits beside it
    for one, other in (("what is a pin", "what is a pen"), ("What is 10² ?", "What is 102 ?"), ("H₂O", "H2O"),
                       ("1½ cups", "11/2 cups")):
        assert normalise(one) != normalise(other)
    write_splits(tmp_path / "in", [("what’s a pin", "a"), ("reset my\u200b pin", "b"), ("reset my pin", "b"), ("fine", "a")],
                 [("kept", "a")], [("what's a PIN", "a")])
    run_validate(tmp_path)
    reasons = {q["line"]: q["expectations"] for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    assert reasons == {1: ["no_leakage"], 3: ["no_duplicates"]}


def test_a_clean_question_stands_when_its_first_copy_is_quarantined_for_a_fault_of_its_own(tmp_path):
    """`What is X\x85` (a mis-decoded byte, which str.split reads as a space) and `What is X` are one question as
    validate compares texts: the first went for its control character and the clean one as its duplicate, so the
    question was lost. The duplicate is of the first copy that stands, which the reason names."""
    train = [("What is X\x85", "a"), ("What is X", "a"), ("fine", "b"), ("what is x", "a"), ("long " + "y" * 1000, "b"),
             ("long " + "y" * 1000 + "\u200b", "b")]  # the second copy too long as well: a duplicate of none
    write_splits(tmp_path / "in", train, [("kept", "a")], [("held out", "b")])
    run_validate(tmp_path)
    quarantined = {q["line"]: q for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    assert {line: q["expectations"] for line, q in quarantined.items()} == {
        1: ["no_control_characters"], 4: ["no_duplicates"], 5: ["text_length"], 6: ["text_length"]}
    assert quarantined[4]["reason"] == "no_duplicates: duplicate of train.csv, line 2"
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "train.jsonl")] == ["What is X", "fine"]


def test_a_validation_question_labelled_otherwise_in_train_is_quarantined_with_its_train_copy(tmp_path):
    write_splits(tmp_path / "in", [("close my account", "a"), ("fine", "a"), ("also fine", "b")],
                 [("Close my account", "b"), ("kept", "a")], [("held out", "a")])
    run_validate(tmp_path)
    reasons = {(q["split"], q["line"]): q["expectations"] for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    assert reasons == {("train", 1): ["no_leakage"], ("validation", 1): ["no_label_conflicts"]}
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "validation.jsonl")] == ["kept"]


def test_a_class_left_without_validation_rows_is_reported(tmp_path, caplog):
    write_splits(tmp_path / "in", [("fine", "a"), ("also fine", "b")], [("kept", "a"), ("shared with test", "b")],
                 [("Shared with test", "b")])
    with caplog.at_level("WARNING", logger="tqc.stages.validate"):
        report = run_validate(tmp_path)
    assert report["classes_without_validation_rows"] == ["b"]
    assert "1 class(es) lost every validation row to quarantine" in caplog.text


def test_an_expectation_that_cannot_be_evaluated_stops_the_stage_naming_it():
    """Great Expectations reports an expectation whose metric raised as a failure with no failing rows; read as such
    it quarantined nothing and only warned, critical or not, and the stage wrote its data as validated."""
    import pandas as pd
    from great_expectations import expectations as gxe

    from tqc.stages.validate import Validator

    broken = gxe.ExpectColumnValuesToBeInSet(column="leaks", value_set=[False], meta={"name": "no_leakage"})
    with pytest.raises(ValidationFailed, match='no_leakage on train could not be evaluated: .*column "leaks"'):
        Validator(None).validate("train", pd.DataFrame({"text": ["a question"]}), [broken], critical=set())


def test_a_conflict_over_a_standard_question_two_classes_share_names_the_row_not_that_text(tmp_path):
    """annotate leaves out a text two classes share (either's, no conflict); the reason named it anyway."""
    write_splits(tmp_path / "in", [("Same text?", "a"), ("same  text?", "b"), ("other", "b"), ("more", "a")],
                 [("fine", "a")], [("held out", "a")], catalog=(("a", "Same text?"), ("b", "Same text?")))
    run_validate(tmp_path, ValidateParams(max_quarantined_fraction=1.0, min_examples_per_class=1, critical=[]))
    said = {q["line"]: q["reason"] for q in read_jsonl(tmp_path / "quarantine.jsonl") if q["split"] == "train"}
    assert said[1] == "no_label_conflicts: conflicts with train.csv, line 2, labeled 'b'"


def test_run_says_each_finding_in_order_then_writes_the_quarantine_the_report_and_the_data(tmp_path, caplog):
    """What `run` logs, in order, and the report's keys in the order they are written: a class left without
    validation rows, one left without train rows, one with test questions and no training question, the test rows
    kept with warnings, then the closing line. An emptied split stops it after the quarantine and the report are
    written, and leaves no validated data."""
    catalog = (("a", "Question a?"), ("b", "Question b?"), ("c", "Question c?"))
    write_splits(tmp_path / "in", [("a" * 50, "a"), ("short b", "b")], [("fine", "a"), ("shared with test", "b")],
                 [("held out", "a"), ("Shared with test", "b"), ("bell\x07", "b"), ("sea one", "c"), ("sea two", "c")],
                 catalog)
    params = ValidateParams(max_quarantined_fraction=1.0, min_examples_per_class=1, max_text_chars=20)
    with caplog.at_level(logging.INFO, logger="tqc.stages.validate"):
        report = run_validate(tmp_path, params)

    said = [m for m in caplog.messages if m.startswith("validate: ")]
    assert said[:4] == [
        "validate: 1 class(es) lost every validation row to quarantine, so no selection sees them: b",
        "validate: 1 class(es) lost every train row to quarantine: a",
        "validate: 1 class(es) have test questions but no training question: c (2 test questions)",
        f"validate: 1 test rows fail a warning-level expectation and stay in test (listed in {tmp_path / 'validation.json'})"]
    assert said[4] == (f"validate: accepted {report['accepted']}, quarantined 2 rows to {tmp_path / 'quarantine.jsonl'}; "
                       f"report {tmp_path / 'validation.json'} ({report['seconds']:.1f}s)") and len(said) == 5
    assert list(report)[-4:] == ["test_rows_kept_with_warnings", "classes_without_validation_rows",
                                 "classes_without_train_rows", "test_classes_without_train_rows"]
    assert (report["classes_without_validation_rows"], report["classes_without_train_rows"]) == (["b"], ["a"])
    assert report["test_classes_without_train_rows"] == {"a": 1, "c": 2}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["catalog.jsonl", "test.jsonl", "train.jsonl",
                                                                    "validation.jsonl"]

    write_splits(tmp_path / "again" / "in", [("good", "a")], [("gone", "zzz")], [("held out", "a")])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tqc.stages.validate"), pytest.raises(ValidationFailed, match="no validation"):
        run_validate(tmp_path / "again", params)
    assert read_json(tmp_path / "again" / "validation.json")["quarantined"]["validation"] == 1
    assert len(read_jsonl(tmp_path / "again" / "quarantine.jsonl")) == 1 and not (tmp_path / "again" / "out").exists()
    assert [m for m in caplog.messages if m.startswith("validate: ")][-1].startswith("validate: accepted ")


def test_a_training_question_stays_when_its_only_test_copy_leaves_test_unscorable(tmp_path):
    """A test row whose label the catalog lacks leaves test; a train row of its text leaked into nothing then, and went
    as leakage all the same, so the clean question was in neither split. A test copy that stays still takes it."""
    write_splits(tmp_path / "in", [("where is it", "a"), ("who is it", "b"), ("good one", "a"), ("good two", "b")],
                 [("fine", "a")],
                 [("where is it", "zzz"), ("Who is  it", "b"), ("who is it", "zzz"), ("held out", "a")])
    report = run_validate(tmp_path)
    said = {(q["split"], q["line"]): q["reason"] for q in read_jsonl(tmp_path / "quarantine.jsonl")}
    assert ("train", 1) not in said  # its test copy left test
    assert said[("train", 2)] == "no_leakage: also in test at test.csv, line 2"  # the copy that stays, not line 3
    assert said[("test", 1)].startswith("label_in_catalog")
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "train.jsonl")] == ["where is it", "good one", "good two"]
    for split in ("train", "validation", "test"):
        assert report["accepted"][split] + report["quarantined"][split] == report["read"][split]
