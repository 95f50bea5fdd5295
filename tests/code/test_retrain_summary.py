"""The retrain flow's summary artifact, with and without a registry to judge in."""

from pathlib import Path

from tqc.retraining.inbox import FileOutcome, Incoming, quarantine_record
from tqc.retraining.pending import Trained
from tqc.retraining.staging import Staged
from tqc.retraining.summary import summary_markdown

STAGED = Staged(Path("raw"), [FileOutcome("inbox/a.csv", "0" * 64, "labeled", "merged", read=3, accepted=3)])
TRAINED = Trained(Path("data"), Path("model"), Path("prior.json"), 0.9)
PROMOTED = {"promoted": True, "reasons": ["better"], "challenger_version": "2", "champion_version_after": "2",
            "validation": {"challenger_accuracy": 0.9, "champion_accuracy": 0.8},
            "challenger_tail_macro_f1": 0.7, "champion_tail_macro_f1": 0.6}


def test_the_summary_says_why_nothing_was_judged_when_tracking_is_off(tmp_path):
    from tqc.config import PromoteParams
    from tqc.stages import promote
    from tqc.tracking import Tracker

    # promote's own report with tracking off: its usual keys, no version (a hand-made dict without them hid a crash)
    promotion = promote.run(tmp_path, tmp_path, None, PromoteParams(), tmp_path / "promotion.json", Tracker(None))
    text = summary_markdown(STAGED, promotion, TRAINED)
    assert "| a.csv | labeled | merged | 3 | 3 | 0 |  |" in text
    assert "**Not promoted**" in text and "tracking is disabled" in text


def test_the_summary_compares_challenger_and_champion():
    text = summary_markdown(STAGED, PROMOTED, TRAINED)
    assert "| accuracy | 0.8000 | 0.9000 | +0.1000 |" in text and "champion is now version 2" in text
    assert "| tail macro-F1 | 0.6000 | 0.7000 | +0.1000 |" in text  # the tail classes compared as accuracy is, signed


def test_the_summary_lists_the_classes_that_moved_most_on_validation():
    promotion = {**PROMOTED, "class_changes": [
        {"class_id": "LOC", "support": 4, "champion_f1": 0.9, "challenger_f1": 0.5, "difference": -0.4},
        {"class_id": "HUM", "support": 3, "champion_f1": 0.5, "challenger_f1": 0.75, "difference": 0.25}]}
    text = summary_markdown(STAGED, promotion, TRAINED)
    assert "## Classes that moved most (validation F1)" in text and "| LOC | 4 | 0.900 | 0.500 | -0.400 |" in text
    assert "| HUM | 3 | 0.500 | 0.750 | +0.250 |" in text  # a gain signed as a loss is, with its +
    assert "Classes that moved" not in summary_markdown(STAGED, {**promotion, "class_changes": []}, TRAINED)


def test_the_summary_tells_a_first_version_from_a_champion_it_cannot_compare_with():
    judged_alone = {"promoted": False, "reasons": ["not comparable: …"], "challenger_version": "2",
                    "champion_version_before": "1", "champion_version_after": "1",
                    "validation": {"challenger_accuracy": 0.9, "champion_accuracy": None}}
    assert "| accuracy | (not comparable) | 0.9000 | |" in summary_markdown(STAGED, judged_alone, TRAINED)
    first = {**judged_alone, "promoted": True, "champion_version_before": None, "champion_version_after": "2"}
    assert "| accuracy | (none) | 0.9000 | |" in summary_markdown(STAGED, first, TRAINED)


def test_the_summary_says_why_a_file_was_unusable():
    unusable = FileOutcome("inbox/catalog-x.csv", "1" * 64, "catalog", "unusable",
                           reason="inbox/catalog-x.csv: missing column(s) ['intent_id']\n| a pipe")
    text = summary_markdown(Staged(Path("raw"), [unusable]), None, None)
    assert "| catalog-x.csv | catalog | unusable | 0 | 0 | 0 | inbox/catalog-x.csv: missing column(s) ['intent_id'] \\| a pipe |" in text


def test_a_delivery_with_nothing_accepted_says_why_in_one_line():
    from tqc.retrain import Incoming, why_nothing_was_accepted

    staged = Staged(Path("raw"), [FileOutcome("inbox/b.csv", "2" * 64, "labeled", "merged", read=2, quarantined=2)],
                    [quarantine_record("inbox/b.csv", "2" * 64, {"line": 2, "expectations": ["no_duplicates"]}),
                     quarantine_record("inbox/b.csv", "2" * 64, {"line": 3, "expectations": ["no_leakage"]})])
    line = why_nothing_was_accepted(staged, [Incoming(Path("inbox/a.csv"), "3" * 64)], Path("data/quarantine/incoming.jsonl"))
    assert line == ("1 repeat(s); 2 row(s) quarantined to data/quarantine/incoming.jsonl, "
                    "e.g. inbox/b.csv, line 2: no_duplicates")

    known = Staged(Path("raw"), [FileOutcome("inbox/catalog-y.csv", "4" * 64, "catalog", "merged", read=1,
                                             reason="1 class id(s) already in the catalog kept their text")])
    assert why_nothing_was_accepted(known, [], Path("q.jsonl")) == "catalog-y.csv: 1 class id(s) already in the catalog kept their text"


def test_the_summary_gives_a_reason_for_a_file_whose_rows_were_quarantined():
    """validate's contract rows carry the expectations they failed, not a reason: the cell said nothing."""
    staged = Staged(Path("raw"), [FileOutcome("inbox/bad.csv", "5" * 64, "labeled", "merged", read=3, accepted=1, quarantined=2)],
                    [quarantine_record("inbox/bad.csv", "5" * 64, {"line": 3, "expectations": ["no_leakage"]}),
                     quarantine_record("inbox/bad.csv", "5" * 64, {"line": 4, "expectations": ["no_duplicates"],
                                                                   "reason": "duplicate of good.csv, line 2"})])
    assert "| bad.csv | labeled | merged | 3 | 1 | 2 | e.g. line 3: no_leakage |" in summary_markdown(staged, None, None)


def test_each_files_reason_cites_a_quarantined_row_of_its_own():
    """Where two files of a delivery had rows quarantined, each file's cell gives one of its own rows, not the first
    file's: the reason said for the second file would otherwise be another file's line."""
    staged = Staged(Path("raw"), [FileOutcome("inbox/a.csv", "5" * 64, "labeled", "merged", read=2, accepted=1, quarantined=1),
                                  FileOutcome("inbox/b.csv", "7" * 64, "labeled", "merged", read=2, accepted=1, quarantined=1)],
                    [quarantine_record("inbox/a.csv", "5" * 64, {"line": 3, "expectations": ["no_leakage"]}),
                     quarantine_record("inbox/b.csv", "7" * 64, {"line": 2, "expectations": ["no_duplicates"]})])
    summary = summary_markdown(staged, None, None)
    assert "| a.csv | labeled | merged | 2 | 1 | 1 | e.g. line 3: no_leakage |" in summary
    assert "| b.csv | labeled | merged | 2 | 1 | 1 | e.g. line 2: no_duplicates |" in summary


def test_the_summary_lists_repeat_deliveries():
    """A delivery of repeats only published a files table with no row."""
    repeat = Incoming(Path("inbox/again.csv"), "6" * 64)
    summary = summary_markdown(Staged(Path("raw")), None, None, [repeat])
    assert "| again.csv | labeled | repeat | 0 | 0 | 0 | the same bytes (sha256) as a file already merged, or as an earlier file of this delivery |" in summary


def test_the_summary_of_a_promotion_that_judged_no_question_says_so():
    """Every validation question was one the champion or the challenger learnt from: promote writes null accuracies."""
    nothing = {"promoted": False, "reasons": ["all 20 validation questions are questions the champion or …"],
               "challenger_version": "2", "champion_version_before": "1", "champion_version_after": "1",
               "validation": {"n": 0, "left_out_as_learnt_from": 20, "challenger_accuracy": None, "champion_accuracy": None}}
    text = summary_markdown(STAGED, nothing, TRAINED)
    assert "| accuracy | (not judged) | (not judged) | |" in text and "all 20 validation questions" in text


def test_the_flows_last_line_counts_what_was_left_out_and_names_the_data_version_to_commit():
    """It said "39 rows and 0 classes added; champion kept" with 11 rows quarantined, and the staged .dvc file that no
    commit recorded (a `dvc exp run` unstages it) went unmentioned."""
    from tqc.retrain import closing_line

    staged = Staged(Path("raw"), [FileOutcome("inbox/a.csv", "0" * 64, "labeled", "merged", read=4, accepted=3, quarantined=1),
                                  FileOutcome("inbox/c.csv", "6" * 64, "labeled", "unusable", reason="empty")],
                    [quarantine_record("inbox/a.csv", "0" * 64, {"line": 5, "expectations": ["no_duplicates"]}),
                     quarantine_record("inbox/c.csv", "6" * 64, {"line": None, "expectations": ["usable_file"]})])
    kept = {"promoted": False, "reasons": ["no better on validation", "tail classes worse"]}
    committed = {"dvc": {"added": ["data/raw/labeled.jsonl.dvc"], "pushed": False}}
    assert closing_line(staged, kept, committed, Path("data/quarantine/incoming.jsonl")) == (
        "retrain: 3 rows and 0 classes added (1 row(s) quarantined to data/quarantine/incoming.jsonl; 1 unusable file(s)); "
        "champion kept: no better on validation; tail classes worse. New data version: data/raw/labeled.jsonl.dvc; "
        "commit it to git: until then no commit records it, and `dvc exp run` unstages it")
    assert closing_line(STAGED, {"promoted": True, "reasons": ["better"]}, {"dvc": {"added": []}}, Path("q.jsonl")) == (
        "retrain: 3 rows and 0 classes added; promoted: better")


def test_a_push_that_failed_is_said_in_one_line_and_in_the_summary_with_the_command_that_pushes_it():
    """The run's summary artifact said nothing of the data version, so a push that failed showed only in the logs."""
    from tqc.retrain import push_failure

    added = ["data/raw/labeled.jsonl.dvc", "data/raw/catalog.jsonl.dvc"]
    failed = {"status": "retrained", "promoted": False,
              "dvc": {"added": added, "pushed": False, "push_failed": "dvc push failed (exit 1): ERROR: 403 | denied"}}
    assert push_failure(failed) == (
        "the new data version (data/raw/labeled.jsonl.dvc, data/raw/catalog.jsonl.dvc) is committed and its challenger "
        "judged (champion kept), but it is not on the DVC remote, so no other checkout can `dvc pull` it: dvc push "
        "failed (exit 1): ERROR: 403 | denied; push it by hand with `dvc push data/raw/labeled.jsonl.dvc "
        "data/raw/catalog.jsonl.dvc` before another retrain changes those files")
    assert push_failure({**failed, "dvc": {"added": added, "pushed": True}}) is None
    assert push_failure({"status": "no rows accepted", "dvc": {"added": [], "pushed": False}}) is None

    text = summary_markdown(STAGED, None, None, committed=failed)
    assert ("New data version: `data/raw/labeled.jsonl.dvc`, `data/raw/catalog.jsonl.dvc`; **not on the DVC remote**, "
            "the push failed: dvc push failed (exit 1): ERROR: 403 \\| denied. Push it by hand: "
            "`dvc push data/raw/labeled.jsonl.dvc data/raw/catalog.jsonl.dvc`.") in text
    pushed = summary_markdown(STAGED, None, None, committed={"dvc": {"added": added[:1], "pushed": True}})
    assert "New data version: `data/raw/labeled.jsonl.dvc`, on the DVC remote." in pushed
    assert "in this checkout's DVC cache only" in summary_markdown(STAGED, None, None,
                                                                   committed={"dvc": {"added": added[:1], "pushed": False}})
    assert "New data version" not in summary_markdown(STAGED, None, None)


def test_the_summary_and_the_last_line_count_a_catalog_files_classes_apart_from_rows():
    """A catalog file's accepted rows are new classes, not questions: counted as rows too, a delivery of 3 questions
    and 2 classes read "5 rows and 2 classes added"."""
    from tqc.retrain import closing_line

    staged = Staged(Path("raw"), [FileOutcome("inbox/a.csv", "0" * 64, "labeled", "merged", read=3, accepted=3),
                                  FileOutcome("inbox/catalog-new.csv", "7" * 64, "catalog", "merged", read=2, accepted=2)])
    assert "Accepted rows: **3**; new classes: **2**." in summary_markdown(staged, None, None)
    assert closing_line(staged, {"promoted": True, "reasons": ["better"]}, {}, Path("q.jsonl")) == (
        "retrain: 3 rows and 2 classes added; promoted: better")


def test_the_summary_says_a_refresh_trained_nothing_and_names_a_rule_its_champion_served_otherwise():
    """A refresh serves the champion's encoder with the exemplar rule: the summary says so, and where the champion
    served another rule, that the gate judges a change of rule too."""
    from tqc.retraining.pending import Champion

    def refresh_of(rule: str, k: int | None) -> Trained:
        return Trained(Path("data"), Path("model"), None, None, refreshed_from=Champion("3", Path("champion"), rule, k))

    sentence = "Refreshed, not trained: version 3's encoder with the grown labeled questions as its exemplars"
    assert f"{sentence}." in summary_markdown(STAGED, None, refresh_of("exemplars", 5))
    assert f"{sentence} (version 3 serves the standard rule)." in summary_markdown(STAGED, None, refresh_of("standard", None))
    assert "Refreshed" not in summary_markdown(STAGED, None, TRAINED)  # a training


def test_a_file_that_added_nothing_and_gives_no_reason_is_still_said_to_have_added_nothing():
    """The line's last resort, each file's own account, ended in a bare colon for a file with no reason of its own."""
    from tqc.retrain import why_nothing_was_accepted

    quiet = Staged(Path("raw"), [FileOutcome("inbox/empty.csv", "8" * 64, "labeled", "merged")])
    assert why_nothing_was_accepted(quiet, [], Path("q.jsonl")) == "empty.csv: added nothing"
