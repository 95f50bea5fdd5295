"""Data contracts: the Great Expectations suite quarantines bad rows and stops on wholesale failure."""

import pytest

from tqc.config import ValidateParams
from tqc.io import read_json, read_jsonl
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, save_questions
from tqc.stages.validate import ValidationFailed, run


def write_splits(directory, train, validation, test):
    directory.mkdir(parents=True, exist_ok=True)
    Catalog([StandardQuestion("a", "Question a?"), StandardQuestion("b", "Question b?")]).save(directory / "catalog.jsonl")
    for name, rows in (("train", train), ("validation", validation), ("test", test)):
        save_questions(directory / f"{name}.jsonl", [LabeledQuestion(t, c, f"{name}.csv:{i + 1}") for i, (t, c) in enumerate(rows)])


def run_validate(tmp_path, params=None):
    return run(tmp_path / "in", params or ValidateParams(max_quarantined_fraction=0.5), tmp_path / "out",
               tmp_path / "quarantine.jsonl", tmp_path / "validation.json")


def test_bad_rows_are_quarantined_with_file_line_and_expectation(tmp_path):
    train = [("good one", "a"), ("", "a"), ("unknown label", "zzz"), ("Shared  WITH test", "b"), ("good two", "b"), ("good three", "a")]
    write_splits(tmp_path / "in", train, [("fine", "a")], [("shared with test", "b"), ("held out", "a")])
    report = run_validate(tmp_path)
    quarantined = read_jsonl(tmp_path / "quarantine.jsonl")
    reasons = {(q["file"], q["line"]): q["expectations"] for q in quarantined}
    assert reasons == {("train.csv", 2): ["non_empty_text"], ("train.csv", 3): ["label_in_catalog"],
                       ("train.csv", 4): ["no_train_test_overlap"]}
    assert [q["text"] for q in read_jsonl(tmp_path / "out" / "train.jsonl")] == ["good one", "good two", "good three"]
    for split in ("train", "validation", "test"):  # nothing silently lost
        assert report["accepted"][split] + report["quarantined"][split] == report["read"][split]
    assert read_json(tmp_path / "validation.json") == report


def test_a_critical_expectation_failing_wholesale_stops_the_stage_and_names_it(tmp_path):
    write_splits(tmp_path / "in", [("x", "zzz"), ("y", "zzz"), ("z", "a")], [("fine", "a")], [("held out", "a")])
    with pytest.raises(ValidationFailed, match="label_in_catalog on train"):
        run_validate(tmp_path, ValidateParams(max_quarantined_fraction=0.1))


def test_a_warning_expectation_only_quarantines(tmp_path):
    write_splits(tmp_path / "in", [("x", "zzz"), ("y", "zzz"), ("z", "a")], [("fine", "a")], [("held out", "a")])
    params = ValidateParams(critical=["schema"], max_quarantined_fraction=0.1)
    report = run_validate(tmp_path, params)
    assert report["accepted"]["train"] == 1
    failed = [e for e in report["expectations"] if not e["success"]]
    assert [(e["name"], e["severity"]) for e in failed] == [("label_in_catalog", "warning")]
