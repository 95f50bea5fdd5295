"""The retrain flow's steps called directly (no Prefect, no training): how a delivery is judged and committed."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tqc import retrain as steps
from tqc.config import RetrainParams, load_params
from tqc.io import DataFileError, read_jsonl
from tqc.readers import MissingColumns, ReaderError, RejectedRow, RowsRejected
from tqc.retraining import commit as retrain_commit, data_versions as retrain_dvc, inbox as retrain_inbox
from tqc.retraining import pending as retrain_pending, staging as retrain_staging, summary as retrain_summary
from tests.flows.conftest import added_rows, drop, unseen_questions


def deliver(project: Path) -> tuple[steps.Staged, list[steps.Incoming]]:
    params = load_params(project / "params.yaml")
    files, repeats = steps.pick_up(params.retrain)
    assert not repeats
    return steps.stage(files, params, Path(params.retrain.work_dir)), files


def outcome_of(staged: steps.Staged, name: str) -> retrain_inbox.FileOutcome:
    return next(o for o in staged.outcomes if o.file.endswith(name))


def test_a_file_nothing_was_taken_from_may_be_delivered_again_and_one_that_added_rows_is_a_repeat(project):
    params = load_params(project / "params.yaml").retrain
    drop(project, "all-quarantined.csv", [(q, "FOOD") for q in unseen_questions(project, "LOC", 2)])
    drop(project, "merged.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])
    inbox = Path(params.inbox)
    archive = Path(params.archive)
    archive.mkdir(parents=True, exist_ok=True)
    (archive / retrain_inbox.MANIFEST).write_text("".join(json.dumps(entry) + "\n" for entry in [
        {"sha256": retrain_inbox.sha256(inbox / "all-quarantined.csv"), "outcome": "merged", "accepted": 0, "quarantined": 2},
        {"sha256": retrain_inbox.sha256(inbox / "merged.csv"), "outcome": "merged", "accepted": 2, "quarantined": 0}]))

    new, repeats = steps.pick_up(params)

    assert [f.path.name for f in new] == ["all-quarantined.csv"]  # FOOD's standard question may have arrived since
    assert [f.path.name for f in repeats] == ["merged.csv"]


def test_a_file_delivered_again_unchanged_adds_no_second_copy_of_its_quarantined_rows(project):
    params = load_params(project / "params.yaml")
    rows = [(q, "FOOD") for q in unseen_questions(project, "LOC", 2)]  # FOOD: not in the catalog
    for _ in range(2):  # nothing was taken from it, so it may come again (its reason fixed, or not)
        path = drop(project, "food.csv", rows)
        staged, files = deliver(project)
        assert outcome_of(staged, "food.csv").quarantined == 2
        steps.commit(params, staged, files, [])
        assert not path.exists()

    quarantined = read_jsonl(params.retrain.quarantine)
    assert sorted(q["line"] for q in quarantined) == [2, 3]
    assert len(read_jsonl(Path(params.retrain.archive) / retrain_inbox.MANIFEST)) == 2  # each delivery is recorded


# no text; or none a tokenizer reads (a private-use character): merged, it failed validate's catalog_non_empty_texts
@pytest.mark.parametrize("text", ["", "\ue000"])
def test_a_catalog_file_without_text_is_unusable_by_line_and_blocks_nothing_else(project, caplog, text):
    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True)
    (inbox / "catalog-new.csv").write_text(f"class_id,text\nFOOD,{text}\n")
    drop(project, "batch.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])

    with caplog.at_level(logging.WARNING, logger="tqc.retrain"):
        staged, _ = deliver(project)  # before: the merged empty text failed the validate contract here, on every retrain

    assert "catalog-new.csv is unusable: " in caplog.text and "catalog-new.csv, line 2" in caplog.text  # said in the log

    catalog = outcome_of(staged, "catalog-new.csv")
    assert catalog.outcome == "unusable" and "catalog-new.csv, line 2" in catalog.reason and "'FOOD'" in catalog.reason
    assert outcome_of(staged, "batch.csv").accepted == 2
    # in the quarantine too, as an unusable labeled file is: one row for the whole file
    [row] = [q for q in staged.quarantined_rows if q["file"].endswith("catalog-new.csv")]
    assert row["line"] is None and row["reason"] == f"unusable file: {catalog.reason}"


def test_a_new_class_may_not_take_the_standard_question_of_another(project):
    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True)
    (inbox / "catalog-new.csv").write_text("class_id,text\nLOC,Where is the place?\nPLACE,where is  THE place?\n")

    staged, _ = deliver(project)

    catalog = outcome_of(staged, "catalog-new.csv")  # LOC again with its own text is fine; PLACE copies LOC's
    assert catalog.outcome == "unusable" and "line 3" in catalog.reason and "of class 'LOC'" in catalog.reason


def test_a_new_class_may_not_take_the_standard_question_of_a_catalog_class_the_file_does_not_name(project):
    """The file above restates LOC; this one gives only the new class, whose text is the catalog's LOC question."""
    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True)
    (inbox / "catalog-new.csv").write_text("class_id,text\nPLACE,where is  THE place?\n")

    staged, _ = deliver(project)

    catalog = outcome_of(staged, "catalog-new.csv")
    assert catalog.outcome == "unusable" and "line 2" in catalog.reason and "of class 'LOC'" in catalog.reason
    assert staged.new_classes == 0 and not (staged.raw / "catalog.jsonl").exists()


def test_a_catalog_file_adds_its_classes_to_those_merged_before_it(project):
    """Each catalog file's classes go after those data.additions holds and those of the delivery's files before it:
    written alone, they replaced them, and the labeled questions of those classes then matched none."""
    params = load_params(project / "params.yaml")
    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True)
    (inbox / "catalog-food.csv").write_text("class_id,text\nFOOD,Which food is it?\n")
    steps.commit(params, *deliver(project), [])
    (inbox / "catalog-drink.csv").write_text("class_id,text\nDRINK,Which drink is it?\n")
    (inbox / "catalog-game.csv").write_text("class_id,text\nGAME,Which game is it?\n")

    staged, _ = deliver(project)

    assert [r["class_id"] for r in read_jsonl(staged.raw / "catalog.jsonl")] == ["FOOD", "DRINK", "GAME"]
    assert staged.new_classes == 2


def test_a_class_an_earlier_catalog_file_of_the_delivery_added_is_known_to_the_next_one(project):
    """A class merged before (by data.additions or an earlier file of the delivery) is known like the dataset's: a
    later file restating it with another text keeps the first text, quarantined, rather than adding the class twice."""
    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True)
    (inbox / "catalog-a.csv").write_text("class_id,text\nFOOD,Which food is it?\n")
    (inbox / "catalog-b.csv").write_text("class_id,text\nFOOD,What dish is this?\nDRINK,Which drink is it?\n")

    staged, _ = deliver(project)

    later = outcome_of(staged, "catalog-b.csv")
    assert (later.outcome, later.read, later.accepted, later.quarantined) == ("merged", 2, 1, 1)
    assert [(r["class_id"], r["text"]) for r in read_jsonl(staged.raw / retrain_staging.ADDED_CATALOG)] == [
        ("FOOD", "Which food is it?"), ("DRINK", "Which drink is it?")]
    assert staged.new_classes == 2


def test_a_new_class_id_alike_another_but_for_case_or_width_is_quarantined_not_merged(project, caplog):
    """`hum` beside the catalog's `HUM`, or `Veh` and `veh` in one delivery, were merged as classes: every label written
    either way then matched neither, and was quarantined with a hint naming one of them."""
    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True)
    (inbox / "catalog-new.csv").write_text("class_id,text\nhum,Which famous person wrote this book?\n"
                                           "Veh,Which vehicle is it?\nveh,What kind of car is it?\nFOOD,What food is it?\n")

    with caplog.at_level("WARNING", logger="tqc.retrain"):
        staged, _ = deliver(project)

    catalog = outcome_of(staged, "catalog-new.csv")
    assert (catalog.outcome, catalog.read, catalog.accepted, catalog.quarantined) == ("merged", 4, 2, 2)
    assert catalog.reason == "2 new class id(s) alike but for case or width to another (quarantined)"
    assert [row["class_id"] for row in read_jsonl(staged.raw / retrain_staging.ADDED_CATALOG)] == ["Veh", "FOOD"]
    alike = {q["line"]: q for q in staged.quarantined_rows if q["expectations"] == ["new_class"]}
    assert sorted(alike) == [2, 4]
    assert alike[2]["reason"].startswith("class 'hum' is alike but for case or width to class 'HUM': one class written two ways")
    assert alike[4]["content"] == {"class_id": "veh", "text": "What kind of car is it?"}
    assert "class 'veh' is alike but for case or width to class 'Veh'" in alike[4]["reason"]
    assert "catalog-new.csv, line 2: class 'hum' is alike but for case or width to class 'HUM'; quarantined" in caplog.text


def test_a_missing_inbox_is_nothing_delivered_said_as_a_warning_with_the_folder_it_resolved_to(tmp_path, monkeypatch,
                                                                                              caplog):
    """A misspelt retrain.inbox, or a worker in another checkout than the deliveries', read as an info line, "nothing
    was delivered", each night: the warning gives the absolute folder looked in."""
    from tqc.config import RetrainParams

    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tqc"):
        assert steps.pick_up(RetrainParams(inbox="data/incomming")) == ([], [])
    said = [r for r in caplog.records if r.levelno == logging.WARNING and "nothing was delivered" in r.getMessage()]
    assert len(said) == 1 and f"data/incomming ({tmp_path / 'data' / 'incomming'}): no such folder" in said[0].getMessage()


def test_an_inbox_or_lock_that_cannot_be_one_is_a_config_error_naming_its_setting(tmp_path):
    """An inbox that is a file was read as an empty one, "nothing to do" each run, forever; a lock that is a folder, or
    under a file, was the OS's IsADirectoryError or FileExistsError in two tracebacks."""
    from tqc.config import ConfigError, RetrainParams

    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=rf"^retrain.inbox {tmp_path / 'afile'}: a file; the inbox is the folder"):
        steps.pick_up(RetrainParams(inbox=str(tmp_path / "afile")))
    assert steps.pick_up(RetrainParams(inbox=str(tmp_path / "not-yet"))) == ([], [])  # not in git: made by a delivery
    for lock, said in ((tmp_path, "a folder"), (tmp_path / "afile" / "x.lock", f"{tmp_path / 'afile'} is a file")):
        with pytest.raises(ConfigError, match=rf"^retrain.lock {lock}: {said}; a lock is a file, made in a folder$"):
            with steps.retrain_lock(RetrainParams(lock=str(lock))):
                pass
    with steps.retrain_lock(RetrainParams(lock=str(tmp_path / "locks" / "retrain.lock"))):
        pass
    from tqc.locks import exclusive  # the check is the lock's own, so a tune worker's lock has it too

    with pytest.raises(ConfigError, match=rf"^lock {tmp_path}: a folder; a lock is a file, made in a folder$"):
        with exclusive(tmp_path, RuntimeError("held")):
            pass
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")  # a folder on another disk, not mounted: was a StopIteration
    dangling = tmp_path / "gone" / "x.lock"
    with pytest.raises(ConfigError, match=rf"^lock {dangling}: {tmp_path / 'gone'} is a link to {tmp_path / 'nowhere'}, "
                                          "which does not exist; a lock is a file, made in a folder$"):
        with exclusive(dangling, RuntimeError("held")):
            pass


def test_labeled_questions_in_a_file_named_catalog_say_why_they_were_read_as_a_catalog(project):
    drop(project, "catalog_additions.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])

    staged, _ = deliver(project)

    catalog = outcome_of(staged, "catalog_additions.csv")
    assert catalog.outcome == "unusable" and "missing column(s)" in catalog.reason
    assert "a file whose name begins with 'catalog' is read as a catalog" in catalog.reason


def test_the_same_question_in_two_files_of_a_delivery_is_compared_as_validate_compares_it(project):
    where, who = unseen_questions(project, "LOC", 2)
    drop(project, "1.csv", [(where, "LOC"), (who, "LOC")])
    drop(project, "2.csv", [(f"  {where.upper()} ", "HUM"), (who.title(), "LOC")])  # case and spacing differ

    staged, _ = deliver(project)

    # The duplicate's later copy goes; both copies of the conflict go, as validate quarantines a conflict in one file.
    assert outcome_of(staged, "1.csv").accepted == 1 and outcome_of(staged, "2.csv").accepted == 0
    reasons = {(Path(q["file"]).name, q["line"]): q["reason"] for q in staged.quarantined_rows}
    assert reasons == {("1.csv", 2): "conflicts with 2.csv, line 2, labeled 'HUM' (every copy quarantined)",
                       ("2.csv", 2): "conflicts with 1.csv, line 2, labeled 'LOC' (every copy quarantined)",
                       ("2.csv", 3): "duplicate of 1.csv, line 3"}
    assert [r["text"] for r in read_jsonl(staged.raw / "labeled.jsonl")][-1:] == [who]


def test_every_quarantined_row_has_one_shape_whichever_check_rejected_it(project):
    where, who = unseen_questions(project, "LOC", 2)
    drop(project, "a.csv", [(where, "LOC"), (who, "FOOD")])  # FOOD: the contract's label_in_catalog
    drop(project, "b.csv", [(where, "LOC")])  # a duplicate of a.csv's row
    (project / "data" / "incoming" / "c.csv").write_text("q,l\nwhere is rome,LOC\n")  # unusable: no such columns

    staged, _ = deliver(project)

    assert {tuple(q) for q in staged.quarantined_rows} == {("file", "sha256", "line", "expectations", "reason", "content")}
    by_file = {Path(q["file"]).name: q for q in staged.quarantined_rows}
    assert by_file["a.csv"]["expectations"] == ["label_in_catalog"]
    assert by_file["a.csv"]["reason"] == ("label_in_catalog: 'FOOD' is no class of the catalog (a delivery adds a class with "
                                          "a catalog*.csv file of its standard question beside the rows)")
    assert by_file["b.csv"]["expectations"] == ["no_duplicates"] and by_file["b.csv"]["reason"] == "duplicate of a.csv, line 2"
    assert by_file["b.csv"]["content"] == {"text": where, "class_id": "LOC"}
    assert by_file["c.csv"]["expectations"] == ["usable_file"] and by_file["c.csv"]["line"] is None
    assert all(len(q["sha256"]) == 64 for q in staged.quarantined_rows)


def test_a_delivery_in_data_custom_encoding_merges_its_catalog_and_rows_as_written(project):
    """data.custom.encoding reads the inbox's files too: a Chinese Excel's GBK catalog file and rows merge as written."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["data"]["custom"]["encoding"] = "gbk"
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True, exist_ok=True)
    (inbox / "catalog-food.csv").write_bytes("class_id,text\nFOOD,这是什么食物？\n".encode("gbk"))
    (inbox / "food.csv").write_bytes("question,label\n饺子是什么？,FOOD\n米饭好吃吗？,FOOD\n".encode("gbk"))

    staged, _ = deliver(project)

    assert [(o.outcome, o.accepted) for o in staged.outcomes] == [("merged", 1), ("merged", 2)], staged.outcomes
    assert [(r["class_id"], r["text"]) for r in read_jsonl(staged.raw / "catalog.jsonl")] == [("FOOD", "这是什么食物？")]
    assert [r["text"] for r in read_jsonl(staged.raw / "labeled.jsonl")] == ["饺子是什么？", "米饭好吃吗？"]


def test_a_duplicate_of_a_merged_question_names_it_where_it_is_kept_not_in_the_deleted_staged_copy(project):
    """The reason read "duplicate of data/retrain/raw/labeled.jsonl, line 1": the staged copy the current data was
    ingested from, which the run deletes. The line is the same in data/raw/labeled.jsonl, the file a person opens."""
    where, = unseen_questions(project, "LOC", 1)
    (project / "data" / "raw" / "labeled.jsonl").write_text(json.dumps({"text": where, "class_id": "LOC",
                                                                        "source": "a.csv:2"}) + "\n")
    drop(project, "b.csv", [(where, "LOC")])

    staged, _ = deliver(project)

    [row] = staged.quarantined_rows
    assert row["reason"] == "no_duplicates: duplicate of data/raw/labeled.jsonl, line 1"  # data.additions, as set


def test_a_delivery_that_adds_nothing_commits_no_data_whatever_staging_holds(project):
    params = load_params(project / "params.yaml")
    raw = project / "data" / "raw"
    (raw / "labeled.jsonl").write_text(json.dumps({"text": "committed row", "class_id": "LOC", "source": "a.csv:2"}) + "\n")
    leftover = Path(params.retrain.work_dir) / "raw"  # a failed earlier run's staging
    leftover.mkdir(parents=True)
    (leftover / "labeled.jsonl").write_text(json.dumps({"text": "never accepted", "class_id": "LOC", "source": "x:2"}) + "\n")
    repeat = steps.Incoming(drop(project, "again.csv", [("where is paris", "LOC")]), "0" * 64)

    result = steps.commit(params, steps.Staged(leftover), [], [repeat])

    assert [r["text"] for r in added_rows(project)] == ["committed row"]
    assert result["committed"] == [] and result["archived"][0]["outcome"] == "repeat"


def test_files_of_other_kinds_and_folders_in_the_inbox_are_named_in_a_warning(project, caplog):
    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True)
    (inbox / "batch.tsv").write_text("question\tlabel\nwhere is paris\tLOC\n")
    (inbox / "monday").mkdir()  # a delivery unpacked into a folder
    (inbox / "monday" / "questions.csv").write_text("question,label\nwhere is paris,LOC\n")
    with caplog.at_level(logging.WARNING, logger="tqc.retrain"):
        assert steps.pick_up(load_params(project / "params.yaml").retrain) == ([], [])
    assert "batch.tsv" in caplog.text and "not read" in caplog.text
    assert "folders are not read" in caplog.text and "monday" in caplog.text


def test_a_link_in_the_inbox_is_not_read_and_a_file_swapped_for_one_after_pick_up_is_not_either(project, tmp_path,
                                                                                                   caplog):
    """A shared inbox: a link to a file only the flow's user can read (~/.pgpass) was read as a delivery, its lines
    echoed in the log and the quarantine and those with a label merged. Links are named and left; a file swapped for
    a link once picked up is not read through it."""
    secret = tmp_path / "secret.csv"
    secret.write_text("question,label\nDB_PASSWORD=hunter2 is the password,LOC\n")
    secret.chmod(0o600)
    ok = drop(project, "ok.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])
    (ok.parent / "delivery.csv").symlink_to(secret)
    with caplog.at_level(logging.WARNING, logger="tqc.retrain"):
        staged, files = deliver(project)
    assert [f.path.name for f in files] == ["ok.csv"] and outcome_of(staged, "ok.csv").accepted == 2
    assert "links are not read (deliver the file itself, not a link to it): delivery.csv" in caplog.text
    assert "hunter2" not in caplog.text and "hunter2" not in json.dumps([vars(o) for o in staged.outcomes])

    # picked up as a file, then a link in its place with the same bytes behind it: not read through the link
    (ok.parent / "delivery.csv").unlink()
    swapped = drop(project, "swapped.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    params = load_params(project / "params.yaml")
    picked, _ = steps.pick_up(params.retrain)
    assert [p.path.name for p in picked] == ["ok.csv", "swapped.csv"]
    (tmp_path / "behind.csv").write_bytes(swapped.read_bytes())
    swapped.unlink()
    swapped.symlink_to(tmp_path / "behind.csv")
    with caplog.at_level(logging.WARNING, logger="tqc.retrain"):
        staged = steps.stage(picked, params, Path(params.retrain.work_dir))
    # left for a later run, as a file still being written is, which then names it among the links
    assert [o.file for o in staged.outcomes] == ["data/incoming/ok.csv"]
    assert staged.still_changing == ["data/incoming/swapped.csv"]
    assert "data/incoming/swapped.csv is a link (or not a file) since it was picked up: not read, left in the inbox" in \
        caplog.text


def test_a_file_whose_name_is_not_utf8_is_left_in_the_inbox_and_the_others_go_on(project, caplog):
    """A Latin-1 name (a Windows share's `café`) failed every run in the quarantine's write, a UnicodeEncodeError
    naming no file, and no other file of the delivery merged."""
    import os

    drop(project, "ok.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])
    latin1 = project / "data" / "incoming" / os.fsdecode(b"caf\xe9-questions.csv")
    latin1.write_text("question,label\nwho is he,HUM\n")

    with caplog.at_level(logging.WARNING, logger="tqc.retrain"):
        staged, files = deliver(project)

    assert [f.path.name for f in files] == ["ok.csv"] and outcome_of(staged, "ok.csv").accepted == 2
    assert "not read, its name is not UTF-8 ('caf\\udce9-questions.csv'); rename it" in caplog.text
    steps.commit(load_params(project / "params.yaml"), staged, files, [])
    assert latin1.exists()


def test_the_push_command_given_by_hand_quotes_a_path_with_a_space():
    assert retrain_dvc.push_command(["my data/raw/labeled.jsonl.dvc", "data/raw/catalog.jsonl.dvc"]) == (
        "dvc push 'my data/raw/labeled.jsonl.dvc' data/raw/catalog.jsonl.dvc")


def test_a_file_whose_suffix_is_in_capitals_is_read_as_a_delivery(project, caplog):
    """`BATCH.CSV`, as some tools name a CSV file, is one: neither read nor named among the files of other kinds, it
    would wait in the inbox unsaid."""
    drop(project, "BATCH.CSV", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])

    with caplog.at_level(logging.WARNING, logger="tqc.retrain"):
        staged, files = deliver(project)

    assert [f.path.name for f in files] == ["BATCH.CSV"] and outcome_of(staged, "BATCH.CSV").accepted == 2
    assert "not read" not in caplog.text


def test_rows_appended_to_a_file_during_a_run_are_read_by_the_next_one(project):
    """The file stays in the inbox when its bytes changed after pick-up; archiving it would have hidden the
    appended rows for good (the archived copy looks processed)."""
    params = load_params(project / "params.yaml")
    first, late = unseen_questions(project, "LOC", 3), unseen_questions(project, "LOC", 2, skip=3)
    path = drop(project, "growing.csv", [(q, "LOC") for q in first])
    staged, files = deliver(project)
    with path.open("a") as appending:  # a courier still writing, or a second delivery to the same name
        appending.write("".join(f"{q},LOC\n" for q in late))
    entry, = steps.commit(params, staged, files, [])["archived"]

    assert path.exists() and entry["archived_as"] is None and "next run reads it again" in entry["not_archived"]
    staged_again, _ = deliver(project)  # a new sha256: not a repeat
    assert outcome_of(staged_again, "growing.csv").accepted == 2  # the first three are in the data already
    steps.commit(params, staged_again, steps.pick_up(params.retrain)[0], [])
    assert sorted(r["text"] for r in added_rows(project)) == sorted(first + late) and not path.exists()


def test_a_file_copied_again_over_itself_while_read_is_not_judged_and_stays_in_the_inbox(project):
    """Picked up whole, read while the same export is copied over it again (cp truncates, then writes), whole again
    when archived. Once merged as read (one row) and archived on its pick-up hash, the other rows were lost; then
    merged as read and left in the inbox, where a row cut inside its label could merge as another class (below).
    Now it is not judged this run: nothing merged, nothing archived, and the next run reads it whole."""
    params = load_params(project / "params.yaml")
    questions = unseen_questions(project, "LOC", 6)
    path = drop(project, "export.csv", [(q, "LOC") for q in questions])
    whole = path.read_bytes()
    files, _ = steps.pick_up(params.retrain)
    path.write_bytes(whole[: whole.index(b"\n", whole.index(b"\n") + 1) + 1])  # the copy so far: header, one row
    staged = steps.stage(files, params, Path(params.retrain.work_dir))
    path.write_bytes(whole)  # the copy is done: the bytes picked up

    assert staged.outcomes == [] and staged.still_changing == [str(files[0].path)]
    said = "1 file(s) changed after pick-up, left in the inbox for the next run: export.csv"
    assert retrain_summary.why_nothing_was_accepted(staged, [], Path("q.jsonl")) == said
    assert "| export.csv | | left in the inbox |" in retrain_summary.summary_markdown(staged, None, None)
    assert steps.commit(params, staged, files, [])["archived"] == [] and path.read_bytes() == whole
    staged_again, again = deliver(project)
    assert outcome_of(staged_again, "export.csv").accepted == 6
    steps.commit(params, staged_again, again, [])
    assert sorted(r["text"] for r in added_rows(project)) == sorted(questions) and not path.exists()


def test_a_row_cut_inside_its_label_by_a_copy_in_progress_never_merges_as_another_class(project):
    """`HUMAN` cut to `HUM` by a read mid-copy: both are classes, so the row was merged as HUM, and the whole row
    quarantined as a conflict on the next run, the wrong label kept."""
    params = load_params(project / "params.yaml")
    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True, exist_ok=True)
    (inbox / "catalog.csv").write_text("class_id,text\nHUMAN,Which human being is it?\n")
    questions = unseen_questions(project, "HUM", 3)
    path = drop(project, "export.csv", [(q, "HUMAN") for q in questions])
    whole = path.read_bytes()
    files, _ = steps.pick_up(params.retrain)
    path.write_bytes(whole[: whole.rindex(b"HUMAN") + 3])  # the copy so far ends inside the last row's label
    staged = steps.stage(files, params, Path(params.retrain.work_dir))
    path.write_bytes(whole)
    steps.commit(params, staged, files, [])
    steps.commit(params, *deliver(project), [])

    assert {r["text"]: r["class_id"] for r in added_rows(project)} == dict.fromkeys(questions, "HUMAN")


def test_a_commit_refuses_to_write_over_data_raw_changed_during_the_run(project):
    """A label fixed by hand in data/raw while a retrain trains: the staged copy holds the old one, and writing it
    back would undo the fix (and `dvc add` would record the undoing). Nothing is committed and the delivery waits."""
    params = load_params(project / "params.yaml")
    drop(project, "first.csv", [(q, "HUM") for q in unseen_questions(project, "LOC", 3)])  # LOC questions, mislabeled
    staged, files = deliver(project)
    steps.commit(params, staged, files, [])
    path = drop(project, "second.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    staged, files = deliver(project)
    raw = project / "data" / "raw" / "labeled.jsonl"
    fixed = "".join(json.dumps({**row, "class_id": "LOC"}) + "\n" for row in added_rows(project))
    raw.write_text(fixed)  # the fix, made during the second run
    manifest = (Path(params.retrain.archive) / retrain_inbox.MANIFEST).read_bytes()

    with pytest.raises(steps.RetrainCommitError, match=r"labeled\.jsonl changed during this run"):
        steps.commit(params, staged, files, [])

    assert raw.read_text() == fixed and path.exists()  # the fix stands; the delivery stays for the next run
    assert (Path(params.retrain.archive) / retrain_inbox.MANIFEST).read_bytes() == manifest
    assert not retrain_commit.journal_dir(params.retrain).exists()
    with pytest.raises(ReaderError, match=r"labeled\.jsonl: not the version .* If you edited it, record the edit with "
                                          r"`dvc add .*labeled\.jsonl`"):
        deliver(project)  # the fix is not recorded yet: docs/retrain.md's `dvc add` first
    subprocess.run([sys.executable, "-m", "dvc", "add", str(raw)], check=True, capture_output=True)
    staged, files = deliver(project)
    steps.commit(params, staged, files, [])
    assert [row["class_id"] for row in added_rows(project)] == ["LOC"] * 3 + ["HUM"] * 2 and not path.exists()


def test_a_run_refuses_to_merge_onto_an_older_copy_than_the_data_version_git_brought(project):
    """Another checkout committed a data version; here `git pull` brought its .dvc file, not its data (`dvc pull`).
    The run staged the older file it found, and its commit recorded a version without the other checkout's rows,
    saying nothing. Now staging stops, naming the dvc pull."""
    import hashlib

    from dvc.repo import Repo

    params = load_params(project / "params.yaml")
    drop(project, "ours.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    steps.commit(params, *deliver(project), [])
    raw = project / "data" / "raw" / "labeled.jsonl"
    ours = raw.read_bytes()
    theirs = ours + (json.dumps({"text": unseen_questions(project, "NUM", 1)[0], "class_id": "NUM"}) + "\n").encode()
    raw.write_bytes(theirs)  # the other checkout's version: recorded, its data not fetched here
    subprocess.run([sys.executable, "-m", "dvc", "add", str(raw)], check=True, capture_output=True)
    with Repo(project) as repo:  # as in a checkout that never had it
        Path(repo.cache.local.oid_to_path(hashlib.md5(theirs).hexdigest())).unlink()
    raw.write_bytes(ours)
    drop(project, "next.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])

    with pytest.raises(ReaderError, match=r"labeled\.jsonl: not the version data/raw/labeled\.jsonl\.dvc records .*"
                                          r"`dvc pull data/raw/labeled\.jsonl\.dvc`"):
        deliver(project)
    raw.unlink()
    with pytest.raises(ReaderError, match=r"labeled\.jsonl: missing, though data/raw/labeled\.jsonl\.dvc records"):
        deliver(project)
    assert (project / "data" / "incoming" / "next.csv").exists()  # the delivery waits for the next run


def test_a_run_refuses_to_merge_onto_an_older_copy_though_the_cache_holds_the_recorded_version(project):
    """`git checkout` of an older commit with `dvc checkout`, then back without one: the file is the older version,
    and the cache holds the recorded one. Taken for a hand edit, it was merged onto: the new version lost the
    recorded one's rows, and the manifest still listed their delivery as merged, so it never merged again."""
    params = load_params(project / "params.yaml")
    raw = project / "data" / "raw" / "labeled.jsonl"
    steps.commit(params, *deliver_rows(project, "a.csv", "LOC"), [])
    first = raw.read_bytes()
    steps.commit(params, *deliver_rows(project, "b.csv", "HUM"), [])
    recorded = raw.read_bytes()
    raw.write_bytes(first)
    drop(project, "c.csv", [(q, "NUM") for q in unseen_questions(project, "NUM", 2)])

    with pytest.raises(ReaderError, match=r"labeled\.jsonl: not the version data/raw/labeled\.jsonl\.dvc records "
                                          r".*`dvc checkout data/raw/labeled\.jsonl\.dvc`"):
        deliver(project)
    assert (project / "data" / "incoming" / "c.csv").exists()  # the delivery waits for the next run
    raw.write_bytes(recorded)  # the `dvc checkout` the message names
    steps.commit(params, *deliver(project), [])
    assert sorted(row["class_id"] for row in added_rows(project)) == ["HUM"] * 2 + ["LOC"] * 2 + ["NUM"] * 2


def deliver_rows(project: Path, name: str, label: str) -> tuple[steps.Staged, list[steps.Incoming]]:
    drop(project, name, [(q, label) for q in unseen_questions(project, label, 2)])
    return deliver(project)


def test_a_run_refuses_to_merge_onto_nothing_where_a_recorded_file_is_gone_though_the_cache_holds_its_version(project):
    """The cache holding the recorded version excuses a file edited here since it was recorded, not a file that is
    gone (deleted by hand, a `git clean`): merged onto nothing, the new version would hold none of its rows."""
    params = load_params(project / "params.yaml")
    drop(project, "ours.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    steps.commit(params, *deliver(project), [])  # its version is in this checkout's DVC cache
    (project / "data" / "raw" / "labeled.jsonl").unlink()
    drop(project, "next.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])

    with pytest.raises(ReaderError, match=r"labeled\.jsonl: missing, though data/raw/labeled\.jsonl\.dvc records .*"
                                          r"`dvc checkout data/raw/labeled\.jsonl\.dvc`"):
        deliver(project)
    assert (project / "data" / "incoming" / "next.csv").exists()


def test_a_partly_quarantined_file_delivered_again_beside_a_catalog_file_merges_the_new_classs_rows(project):
    """The quarantine's hint for a label the catalog lacks: a catalog file of its standard question beside the rows.
    Followed with the same file, whose other rows were merged, it is judged again rather than taken for a repeat."""
    params = load_params(project / "params.yaml")
    loc, food = unseen_questions(project, "LOC", 2), unseen_questions(project, "HUM", 3)
    path = drop(project, "mixed.csv", [(q, "LOC") for q in loc] + [(q, "FOOD") for q in food])
    delivered = path.read_bytes()
    staged, files = deliver(project)
    assert (outcome_of(staged, "mixed.csv").accepted, outcome_of(staged, "mixed.csv").quarantined) == (2, 3)
    steps.commit(params, staged, files, [])
    path.write_bytes(delivered)
    (path.parent / "catalog-food.csv").write_text("class_id,text\nFOOD,Which food is it?\n")
    assert steps.pick_up(params.retrain)[1] == []  # with a catalog file beside it: judged again, not a repeat

    staged, files = deliver(project)
    steps.commit(params, staged, files, [])

    mixed = outcome_of(staged, "mixed.csv")
    assert (mixed.accepted, mixed.quarantined) == (3, 2)  # the LOC rows, merged before, are duplicates now
    assert sorted(r["text"] for r in added_rows(project) if r["class_id"] == "FOOD") == sorted(food)
    path.write_bytes(delivered)  # the same bytes alone, later: a repeat again
    assert [f.path.name for f in steps.pick_up(params.retrain)[1]] == ["mixed.csv"]


def test_rows_appended_between_the_archive_check_and_the_move_are_not_archived_unread(project, monkeypatch):
    """The file is hashed again once moved: a write that lands after the last check but before the move puts it back
    in the inbox, and the next run reads the late rows."""
    params = load_params(project / "params.yaml")
    first, late = unseen_questions(project, "LOC", 3), unseen_questions(project, "LOC", 2, skip=3)
    path = drop(project, "racing.csv", [(q, "LOC") for q in first])
    staged, files = deliver(project)
    real_sha256 = retrain_inbox.sha256

    def hash_then_a_write_lands(checked):
        digest = real_sha256(checked)
        if Path(checked).resolve() == path.resolve():  # the check in the inbox passes; the courier's last rows arrive just after it
            with path.open("a") as appending:
                appending.write("".join(f"{q},LOC\n" for q in late))
        return digest

    monkeypatch.setattr(retrain_inbox, "sha256", hash_then_a_write_lands)
    entry, = steps.commit(params, staged, files, [])["archived"]
    monkeypatch.setattr(retrain_inbox, "sha256", real_sha256)

    assert path.exists() and entry["archived_as"] is None and "next run reads it again" in entry["not_archived"]
    assert not list(Path(params.retrain.archive).glob("*racing.csv"))
    staged_again, _ = deliver(project)
    assert outcome_of(staged_again, "racing.csv").accepted == 2


def test_a_file_whose_second_hash_fails_after_the_move_goes_back_to_the_inbox(project, monkeypatch):
    """The move was recorded for the roll-back only once its hash matched: a failure in between (an I/O error, a
    Ctrl-C while hashing) left the file in the archive and in no record, gone from the inbox for good."""
    params = load_params(project / "params.yaml")
    path = drop(project, "stranded.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 3)])
    staged, files = deliver(project)
    real_sha256, calls = retrain_inbox.sha256, []

    def fails_once_moved(checked):
        calls.append(checked)
        if len(calls) == 2:  # the hash after the move
            raise OSError("I/O error while reading")
        return real_sha256(checked)

    monkeypatch.setattr(retrain_inbox, "sha256", fails_once_moved)
    with pytest.raises(OSError, match="I/O error"):
        steps.commit(params, staged, files, [])
    assert path.exists() and not list(Path(params.retrain.archive).glob("*stranded.csv"))


def test_a_commit_that_fails_while_archiving_puts_everything_back(project, monkeypatch):
    """dvc add has run, the quarantine is written, one file is archived, then the disk is full: the data, its .dvc
    files (and their git index entries), the quarantine, the manifest and the inbox are all as they were."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "dvc", "config", "core.autostage", "true"], check=True)
    params = load_params(project / "params.yaml")
    drop(project, "a.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)] + [("", "HUM")])
    drop(project, "b.csv", [(q, "NUM") for q in unseen_questions(project, "NUM", 2)])
    staged, files = deliver(project)
    assert staged.quarantined_rows  # the empty row: the quarantine would be written
    watched = [project / "data" / "raw" / name for name in ("labeled.jsonl", "labeled.jsonl.dvc", ".gitignore")]
    watched += [Path(params.retrain.quarantine), Path(params.retrain.archive) / retrain_inbox.MANIFEST]
    before = {path: path.read_bytes() if path.exists() else None for path in watched}
    archive = retrain_commit.archive

    def disk_full_at_the_second(incoming, *args):
        if incoming.path.name == "b.csv":
            raise OSError(28, "No space left on device")
        return archive(incoming, *args)

    monkeypatch.setattr(retrain_commit, "archive", disk_full_at_the_second)
    with pytest.raises(OSError, match="No space left"):
        steps.commit(params, staged, files, [])

    assert {path: path.read_bytes() if path.exists() else None for path in watched} == before
    assert sorted(p.name for p in (project / "data" / "incoming").iterdir()) == ["a.csv", "b.csv"]
    staged_index = subprocess.run(["git", "diff", "--cached", "--name-only"], capture_output=True, text=True).stdout
    assert "labeled.jsonl.dvc" not in staged_index


def test_a_move_to_the_archive_cut_short_leaves_no_part_copy_there_and_the_file_in_the_inbox(project, monkeypatch):
    """A move to an archive on another disk is a copy, then a delete: one cut short (the disk full) leaves part of a
    copy there. Journaled before it is made, the move is undone by the roll-back: the part copy deleted, the file
    whole in the inbox, for the next run."""
    import shutil

    params = load_params(project / "params.yaml")
    path = drop(project, "a.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 3)])
    delivered = path.read_bytes()
    staged, files = deliver(project)
    archive, move = Path(params.retrain.archive).resolve(), shutil.move

    def disk_full_in_the_archive(source, target):
        if archive in Path(target).resolve().parents:
            Path(target).write_bytes(Path(source).read_bytes()[:10])
            raise OSError(28, "No space left on device")
        return move(source, target)

    monkeypatch.setattr(retrain_inbox.shutil, "move", disk_full_in_the_archive)
    with pytest.raises(OSError, match="No space left"):
        steps.commit(params, staged, files, [])
    assert path.read_bytes() == delivered and not list(archive.glob("*a.csv"))


def test_a_file_whose_name_is_near_the_limit_is_archived_and_a_journal_naming_an_impossible_name_rolls_back(project):
    """The archive's name adds a stamp and a digest to the delivered name: a name of 227 to 255 bytes failed the move
    (ENAMETOOLONG), and the roll-back's exists() raised the same, so the data kept the uncommitted rows and every
    later run failed."""
    params = load_params(project / "params.yaml")
    name = "质" * 80 + ".csv"  # 244 bytes: a name the inbox takes
    drop(project, name, [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    staged, files = deliver(project)
    steps.commit(params, staged, files, [])

    [entry] = read_jsonl(Path(params.retrain.archive) / retrain_inbox.MANIFEST)
    archived = Path(entry["archived_as"])
    assert archived.exists() and len(archived.name.encode()) <= 255 and archived.name.endswith(".csv")
    assert len(added_rows(project)) == 2

    inbox = Path(params.retrain.inbox)
    data = project / "scratch.txt"
    data.write_text("new")
    impossible = Path(params.retrain.archive) / ("x" * 300)
    with pytest.raises(OSError):
        with retrain_commit._journaled(retrain_commit.journal_dir(params.retrain), {data: b"old"}, []) as moves:
            moves.append((inbox / "y.csv", impossible, "0" * 64))
            raise OSError(36, "File name too long")
    assert data.read_text() == "old" and not retrain_commit.journal_dir(params.retrain).exists()


def test_a_roll_back_that_cannot_set_gits_index_fails_saying_both_and_the_next_run_finishes_it(project, monkeypatch):
    """git's index.lock held by another process (an editor's `git status`, a killed git) while a failed commit rolls
    back: the `git add` that un-stages the new .dvc files failed unchecked, and the log said all was as it was, while
    the rolled-back data version stayed staged for the next `git commit`. Now the failure names both causes, the
    journal stays, and the next run's roll-back, the lock gone, leaves the index as it was."""
    import subprocess
    import sys

    from tqc.retraining.errors import RetrainCommitError

    subprocess.run([sys.executable, "-m", "dvc", "config", "core.autostage", "true"], check=True)
    params = load_params(project / "params.yaml")
    drop(project, "a.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    staged, files = deliver(project)
    index_lock = project / ".git" / "index.lock"
    monkeypatch.setattr(retrain_commit, "INDEX_LOCK_WAITS", (0.0,))

    def disk_full_with_the_index_locked(*args):
        index_lock.write_text("")  # another git process, from here until after the roll-back
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(retrain_commit, "archive", disk_full_with_the_index_locked)
    with pytest.raises(RetrainCommitError, match=r"No space left on device.*; and the roll-back put the files back but "
                                                 r"could not set git's index to match \(git (add|rm): .*index\.lock"):
        steps.commit(params, staged, files, [])
    assert retrain_commit.journal_dir(params.retrain).exists()
    staged_index = subprocess.run(["git", "diff", "--cached", "--name-only"], capture_output=True, text=True).stdout
    assert "labeled.jsonl.dvc" in staged_index  # what the journal is kept for

    index_lock.unlink()
    assert steps.roll_back_interrupted_commit(params.retrain)
    staged_index = subprocess.run(["git", "diff", "--cached", "--name-only"], capture_output=True, text=True).stdout
    assert "labeled.jsonl.dvc" not in staged_index and not retrain_commit.journal_dir(params.retrain).exists()


def test_a_file_put_back_by_a_failed_commit_keeps_a_same_named_file_delivered_meanwhile(project, monkeypatch):
    """a.csv is archived, a new a.csv arrives, then the commit fails: both are in the inbox for the next run."""
    drop(project, "a.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    drop(project, "b.csv", [(q, "NUM") for q in unseen_questions(project, "NUM", 2)])
    params = load_params(project / "params.yaml")
    staged, files = deliver(project)
    inbox, archive = project / "data" / "incoming", retrain_commit.archive
    first = (inbox / "a.csv").read_bytes()

    def new_a_then_disk_full(incoming, *args):
        if incoming.path.name == "b.csv":
            (inbox / "a.csv").write_text("question,label\nwho is new here,HUM\n")  # delivered during the run
            raise OSError(28, "No space left on device")
        return archive(incoming, *args)

    monkeypatch.setattr(retrain_commit, "archive", new_a_then_disk_full)
    with pytest.raises(OSError, match="No space left"):
        steps.commit(params, staged, files, [])
    assert sorted(p.name for p in inbox.iterdir()) == ["a.csv", "a.rolled-back-1.csv", "b.csv"]
    assert (inbox / "a.rolled-back-1.csv").read_bytes() == first and "who is new here" in (inbox / "a.csv").read_text()


def test_a_commit_marks_its_challenger_for_the_gate_as_its_last_change_and_a_rolled_back_one_leaves_no_mark(
        project, monkeypatch):
    """The flow marked the challenger only after the commit returned: a run killed in between left the data committed
    and no challenger for the next run to judge. Inside the commit, the mark is rolled back with the data."""
    params = load_params(project / "params.yaml")
    drop(project, "a.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    staged, files = deliver(project)
    challenger = steps.Trained(data=staged.raw, model=staged.raw, prior=None, validation_macro_f1=0.5)
    mark = retrain_pending.mark_judge_pending

    def marked_then_failed(*args):
        mark(*args)
        raise OSError("disk full")

    monkeypatch.setattr(retrain_commit, "mark_judge_pending", marked_then_failed)
    with pytest.raises(OSError, match="disk full"):
        steps.commit(params, staged, files, [], challenger)
    assert steps.pending_judge(params.retrain) is None and (project / "data" / "incoming" / "a.csv").exists()

    monkeypatch.setattr(retrain_commit, "mark_judge_pending", mark)
    steps.commit(params, staged, files, [], challenger)
    assert steps.pending_judge(params.retrain) == challenger and not retrain_commit.journal_dir(params.retrain).exists()



def test_a_commit_journals_the_manifest_first_and_makes_its_changes_in_order(project, monkeypatch):
    """The commit's order, which its roll-back relies on: the journal holds the manifest first (a roll-back stopped by
    a full disk after it records no file as merged whose rows are not in the data), then the data, what dvc add
    writes, the quarantine and the mark; the data is replaced before dvc add records it, then come the quarantine,
    the deliveries' archiving, the repeats', and the mark last."""
    params = load_params(project / "params.yaml")
    inbox, raw = project / "data" / "incoming", retrain_staging.additions_dir(params)
    food = unseen_questions(project, "HUM", 2)
    drop(project, "food.csv", [(q, "FOOD") for q in food] + [("", "FOOD")])
    (inbox / "catalog-food.csv").write_text("class_id,text\nFOOD,Which food is it?\n")
    staged, files = deliver(project)
    again = drop(project, "again.csv", [("where is paris", "LOC")])
    repeat = steps.Incoming(again, retrain_inbox.sha256(again))
    challenger = steps.Trained(data=staged.raw, model=staged.raw, prior=None, validation_macro_f1=0.5)
    events, begin, record, quarantine, archive, mark = ([], retrain_commit.CommitJournal.begin, retrain_dvc.dvc_record,
                                                        retrain_commit._quarantine, retrain_commit.archive, retrain_pending.mark_judge_pending)

    def journaled(directory, before, dvc_written):
        events.append(("journal", list(before), dvc_written))
        return begin(directory, before, dvc_written)

    def recorded(paths, push):
        replaced = all(path.read_bytes() == (staged.raw / path.name).read_bytes() for path in paths)
        events.append(("dvc", paths, replaced))
        return record(paths, push)

    monkeypatch.setattr(retrain_commit.CommitJournal, "begin", staticmethod(journaled))
    monkeypatch.setattr(retrain_commit, "dvc_record", recorded)
    monkeypatch.setattr(retrain_commit, "_quarantine", lambda *args: (events.append(("quarantine", len(args[1]))), quarantine(*args)))
    monkeypatch.setattr(retrain_commit, "archive", lambda f, o, *args: (events.append(("archive", f.path.name, o.outcome)),
                                                               archive(f, o, *args))[1])
    monkeypatch.setattr(retrain_commit, "mark_judge_pending", lambda *args: (events.append(("mark",)), mark(*args)))

    result = steps.commit(params, staged, files, [repeat], challenger)

    data = [raw / "labeled.jsonl", raw / "catalog.jsonl"]
    written = [raw / "labeled.jsonl.dvc", raw / "catalog.jsonl.dvc", raw / ".gitignore"]
    assert events == [
        ("journal", [Path(params.retrain.archive) / retrain_inbox.MANIFEST, *data, *written, Path(params.retrain.quarantine),
                     steps.pending_judge_path(params.retrain)], written),
        ("dvc", data, True), ("quarantine", 1),
        ("archive", "catalog-food.csv", "merged"), ("archive", "food.csv", "merged"), ("archive", "again.csv", "repeat"),
        ("mark",)]
    assert list(result) == ["committed", "dvc", "archived"] and result["committed"] == [str(p) for p in data]
    assert [Path(e["file"]).name for e in result["archived"]] == ["catalog-food.csv", "food.csv", "again.csv"]
    assert steps.pending_judge(params.retrain) == challenger and not retrain_commit.journal_dir(params.retrain).exists()

KILLED_COMMIT = """
import os, sys
from pathlib import Path
from tqc import retrain as steps
from tqc.retraining import commit as retrain_commit
from tqc.config import load_params

params = load_params("params.yaml")
if sys.argv[1] == "dvc":  # the data replaced, then killed in dvc add / push (which can take minutes)
    retrain_commit.dvc_record = lambda *args: os._exit(137)
else:  # killed while archiving the second file, the first one archived
    archive = retrain_commit.archive
    retrain_commit.archive = lambda incoming, *args: os._exit(137) if incoming.path.name == "b.csv" else archive(incoming, *args)
files, repeats = steps.pick_up(params.retrain)
steps.commit(params, steps.stage(files, params, Path(params.retrain.work_dir)), files, repeats)
"""


@pytest.mark.parametrize("killed_in", ["dvc", "archive"])
def test_a_commit_killed_midway_is_rolled_back_by_the_next_run_and_its_rows_then_merge(project, killed_in):
    """A kill runs no except clause: the next run found the rows in data/raw, quarantined them as duplicates of
    themselves, archived their files as 'nothing accepted' and never versioned the data."""
    import subprocess
    import sys

    params = load_params(project / "params.yaml")
    drop(project, "a.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    drop(project, "b.csv", [(q, "NUM") for q in unseen_questions(project, "NUM", 2)])
    watched = [project / "data" / "raw" / name for name in ("labeled.jsonl", "labeled.jsonl.dvc", ".gitignore")]
    watched += [Path(params.retrain.quarantine), Path(params.retrain.archive) / retrain_inbox.MANIFEST]
    before = {path: path.read_bytes() if path.exists() else None for path in watched}
    inbox = {path.name: path.read_bytes() for path in Path(params.retrain.inbox).iterdir()}

    killed = subprocess.run([sys.executable, "-c", KILLED_COMMIT, killed_in], capture_output=True, text=True)
    assert killed.returncode == 137, killed.stderr
    assert (project / "data" / "raw" / "labeled.jsonl").exists()  # the kill left the commit half made

    assert steps.roll_back_interrupted_commit(params.retrain)
    assert {path: path.read_bytes() if path.exists() else None for path in watched} == before
    assert {path.name: path.read_bytes() for path in Path(params.retrain.inbox).iterdir()} == inbox
    assert not retrain_commit.journal_dir(params.retrain).exists() and not steps.roll_back_interrupted_commit(params.retrain)

    staged, files = deliver(project)
    assert staged.accepted == 4 and not staged.quarantined_rows  # judged as new, not as copies of themselves
    result = steps.commit(params, staged, files, [])
    assert result["dvc"]["added"] and len(added_rows(project)) == 4
    assert not retrain_commit.journal_dir(params.retrain).exists()


def test_a_failed_dvc_command_says_dvcs_reason_in_one_line(project):
    with pytest.raises(steps.RetrainCommitError) as failure:
        retrain_dvc._dvc("push", "no-such-file.dvc")
    message = str(failure.value)
    assert message.startswith("dvc push failed (exit") and "ERROR" in message and "\n" not in message


@pytest.mark.parametrize("output, said", [
    ("ERROR: failed to transfer 'md5: 1a2b' - 403 Forbidden\nsome detail\n"
     "ERROR: failed to push data to the cloud - 1 files failed to upload\n", "ERROR: failed to push data to the cloud"),
    ("WARNING: the remote is slow\nsomething went wrong\n\n", "something went wrong"),  # no ERROR line: the last line
    ("", "no output")])
def test_a_failed_dvc_command_says_its_last_error_line_else_its_last_line(monkeypatch, output, said):
    """DVC prints an error for each file it could not send, then what failed: the line said is its last ERROR line."""
    import subprocess

    monkeypatch.setattr(retrain_dvc.subprocess, "run",
                        lambda command, **kwargs: subprocess.CompletedProcess(command, 1, stdout="", stderr=output))
    with pytest.raises(steps.RetrainCommitError) as failure:
        retrain_dvc._dvc("push", "data/raw/labeled.jsonl.dvc")
    assert str(failure.value).startswith(f"dvc push failed (exit 1): {said}")


def test_the_summary_names_why_a_delivered_files_rows_were_quarantined(project):
    fresh = unseen_questions(project, "LOC", 1)
    drop(project, "mixed.csv", [(fresh[0], "LOC"), (fresh[0], "LOC"), ("", "LOC")])  # a duplicate, an empty text
    staged, _ = deliver(project)
    row = next(line for line in steps.summary_markdown(staged, None, None).splitlines() if line.startswith("| mixed.csv"))
    assert row.split("|")[4:7] == [" 3 ", " 1 ", " 2 "] and "e.g. line " in row


def test_the_log_names_each_files_quarantined_rows_and_not_the_current_datas_own_failures(project, caplog):
    """Judging a delivery logged validate's counts over the grown set: "no_duplicates on train failed for 5 rows" for a
    clean file (the synthetic train's own repeats), and a file's parse rejections nowhere; tqc validate held them back."""
    fresh = unseen_questions(project, "LOC", 2)
    drop(project, "clean.csv", [(fresh[0], "LOC")])
    drop(project, "mixed.csv", [(fresh[1], "LOC"), ("what is a thing", "NOPE")])
    with (project / "data" / "incoming" / "mixed.csv").open("a") as mixed:
        mixed.write('"a,b",LOC,extra\n')  # line 4: a parse rejection
    with caplog.at_level(logging.INFO, logger="tqc"):
        deliver(project)
    assert not [r for r in caplog.records if r.name.startswith("tqc.stages")], caplog.text
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("tqc")]
    assert said == ["retrain: data/incoming/mixed.csv: 2 of 3 row(s) quarantined to data/quarantine/incoming.jsonl, e.g. "
                    "line 3: label_in_catalog: 'NOPE' is no class of the catalog (a delivery adds a class with a "
                    "catalog*.csv file of its standard question beside the rows)"]
    assert logging.getLogger("tqc.stages.validate").level == logging.NOTSET  # restored after the check


@pytest.mark.parametrize("overrides", [{"data": {"additions": "data/retrain/raw"}}, {"retrain": {"work_dir": "data/raw"}}])
def test_merged_questions_inside_the_retrain_work_dir_are_refused_before_anything_is_deleted(project, overrides):
    """Each retrain empties retrain.work_dir: stage deleted additions at data/retrain/raw (every question merged
    before, with their .dvc files) as it began, and a run that completed deleted data/raw as its work_dir."""
    from tqc.config import ConfigError

    params = load_params(project / "params.yaml", overrides)
    merged = Path(params.data.additions) / "labeled.jsonl"
    merged.parent.mkdir(parents=True, exist_ok=True)
    merged.write_text('{"text": "where is the merged question", "class_id": "LOC", "source": "old.csv:2"}\n')
    drop(project, "one.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])
    files, _ = steps.pick_up(params.retrain)
    with pytest.raises(ConfigError, match=rf"data.additions '{params.data.additions}' is inside retrain.work_dir "
                                          rf"'{params.retrain.work_dir}', which each retrain empties: keep it outside"):
        steps.stage(files, params, Path(params.retrain.work_dir))
    assert merged.read_text() == '{"text": "where is the merged question", "class_id": "LOC", "source": "old.csv:2"}\n'


def test_an_inbox_that_is_data_additions_is_refused_before_the_merged_questions_are_read_as_a_delivery(project):
    """With retrain.inbox data/raw, labeled.jsonl (columns text, class_id) was an unusable delivery, and a run that
    accepted nothing archived it: the merged questions left data.additions."""
    from tqc.config import ConfigError

    params = load_params(project / "params.yaml", {"retrain": {"inbox": "data/raw"}})
    merged = Path(params.data.additions) / "labeled.jsonl"
    merged.write_text('{"text": "where is the merged question", "class_id": "LOC", "source": "old.csv:2"}\n')
    files, _ = steps.pick_up(params.retrain)
    with pytest.raises(ConfigError, match=r"data.additions 'data/raw' is retrain.inbox, whose files are read as deliveries"):
        steps.stage(files, params, Path(params.retrain.work_dir))
    assert merged.exists() and not Path(params.retrain.archive).exists()


def test_tqc_validate_judges_a_delivery_where_only_the_flow_refuses_the_inbox_and_work_dir_it_is_set_with(project,
                                                                                                           capsys):
    """An inbox that is data.additions, or a work_dir holding it, stops the flow, which would read the merged questions
    as a delivery or empty them; `tqc validate FILE` (through `stage`) refused as well, exit 2, though in its scratch
    folder it empties and archives nothing."""
    from tqc.cli import main

    outside = project / "to-check"
    outside.mkdir()
    (outside / "new.csv").write_text(f"question,label\n{unseen_questions(project, 'LOC', 1)[0]},LOC\n")
    for setting in ("retrain.inbox=data/raw", "retrain.work_dir=data/raw"):
        with pytest.raises(SystemExit) as ended:
            main(["--set", setting, "validate", str(outside / "new.csv")])
        out = capsys.readouterr().out
        assert ended.value.code == 0 and "new.csv: 1 rows read, 1 would be accepted, 0 quarantined" in out, out
    assert not (project / "data" / "raw" / "labeled.jsonl").exists() and (outside / "new.csv").exists()


def test_judging_a_delivery_validates_the_current_data_without_augmenting_it(project, monkeypatch):
    """New files are judged against the validated data; augmenting it (EDA or a seq2seq model's paraphrases on
    a large set) would only cost time, and training augments the staged data later."""
    from tqc.stages import augment

    def augment_called(*args, **kwargs):
        raise AssertionError("staging a delivery ran the augment stage")

    monkeypatch.setattr(augment, "run", augment_called)
    drop(project, "new.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])
    staged, _ = deliver(project)
    assert outcome_of(staged, "new.csv").outcome == "merged" and outcome_of(staged, "new.csv").accepted == 2


def test_a_delivery_reads_the_current_data_once_and_judges_each_file_as_tqc_validate_would(project, monkeypatch):
    """Loading the validated splits is the slow part of judging a file (every training row parsed), so a delivery
    of many files reads them once; each file's report is still the one `tqc validate FILE` gives it alone."""
    from tqc import incoming

    new = unseen_questions(project, "LOC", 3)
    for number, question in enumerate(new, start=1):
        drop(project, f"{number}.csv", [(question, "LOC"), ("", "LOC")])  # one good row, one quarantined
    params = load_params(project / "params.yaml")
    loads: list[Path] = []  # the folders read
    real_load = incoming.load_reference

    def counted_load(against: Path) -> incoming.Reference:
        loads.append(against)
        return real_load(against)

    monkeypatch.setattr(incoming, "load_reference", counted_load)
    staged, files = deliver(project)

    assert len(files) == 3 and len(loads) == 1
    for file in files:
        alone = incoming.check_batch(file.path, loads[0], params)
        outcome = outcome_of(staged, file.path.name)
        assert outcome.outcome == "merged" and outcome.accepted == len(alone["accepted"]) == 1
        assert [q["line"] for q in staged.quarantined_rows if q["file"].endswith(file.path.name)] == \
            [q["line"] for q in alone["quarantined"]] == [3]


def test_tqc_validate_judges_files_as_the_flow_would_with_its_merged_data_and_a_catalog_file_beside(project, capsys):
    """`tqc validate FILE` judged against data/validated, the last dvc repro's: a question the flow had merged since
    was accepted again there (the flow then quarantined it), and a new class's rows were quarantined though the
    catalog file delivered beside them adds the class (the flow took both)."""
    from tqc.cli import main

    def validate(*paths: Path) -> tuple[int, str]:
        with pytest.raises(SystemExit) as ended:
            main(["validate", *map(str, paths)])
        return ended.value.code, capsys.readouterr().out

    known = unseen_questions(project, "LOC", 1)[0]
    drop(project, "first.csv", [(known, "LOC")])
    staged, files = deliver(project)
    steps.commit(load_params(project / "params.yaml"), staged, files, [])
    merged = (project / "data" / "raw" / "labeled.jsonl").read_bytes()
    outside = project / "to-check"  # not the inbox: checking delivers nothing
    outside.mkdir()
    fresh = unseen_questions(project, "LOC", 2)[1]
    (outside / "again.csv").write_text(f"question,label\n{known},LOC\n{fresh},LOC\n")  # not first.csv's bytes: no repeat
    (outside / "catalog-new.csv").write_text("class_id,text\nFOOD,What should I eat?\n")
    (outside / "food.csv").write_text("question,label\nwhat is good to eat tonight,FOOD\n")

    code, out = validate(outside / "again.csv")
    assert code == 1 and "again.csv: 2 rows read, 1 would be accepted, 1 quarantined" in out and "line 2: no_duplicates" in out
    code, out = validate(outside / "catalog-new.csv", outside / "food.csv")
    assert code == 0, out
    assert "catalog-new.csv: 1 class(es) read, 1 would be accepted as new classes, 0 quarantined" in out
    assert "food.csv: 1 rows read, 1 would be accepted, 0 quarantined" in out
    code, out = validate(outside / "food.csv")  # alone, FOOD is no class
    assert code == 1 and "line 2: label_in_catalog" in out
    code, out = validate(outside / "missing.csv")
    assert code == 2 and "missing.csv: unusable: no such file" in out
    (outside / "notes.txt").write_text("question,label\nwhere is the sea,LOC\n")
    code, out = validate(outside / "notes.txt")  # the flow leaves such a file in the inbox, unread
    assert code == 2 and "notes.txt: unusable: the retrain flow reads only .csv, .jsonl, .ndjson files" in out
    assert (project / "data" / "raw" / "labeled.jsonl").read_bytes() == merged  # nothing was merged by checking
    assert not (project / "data" / "raw" / "catalog.jsonl").exists()


def test_a_jsonl_delivery_whose_records_all_lack_a_mapped_key_is_unusable_naming_the_setting(project, capsys):
    """Records keyed `text` where data.custom.text_column says `question` were every one quarantined with the same
    reason (a CSV whose header lacks the column is one unusable file naming the setting); a record or two without
    the key among others that have it are still quarantined by line, in `tqc validate FILE` and in the flow alike."""
    from tqc.cli import main

    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True)
    keyed_text, mixed = inbox / "keyed-text.jsonl", inbox / "mixed.jsonl"
    keyed_text.write_text("".join(json.dumps({"text": q, "label": "LOC"}) + "\n" for q in unseen_questions(project, "LOC", 3)))
    records = [{"question": q, "label": "LOC"} for q in unseen_questions(project, "LOC", 3, skip=3)]
    records.insert(1, {"text": unseen_questions(project, "LOC", 1, skip=6)[0], "label": "LOC"})
    mixed.write_text("".join(json.dumps(record) + "\n" for record in records))
    said = ("{}: missing column(s) ['question'] in all 3 record(s): line 1 has ['text', 'label'] "
            "(named by data.custom.text_column)")

    with pytest.raises(SystemExit) as ended:
        main(["validate", str(keyed_text), str(mixed)])
    out = capsys.readouterr().out
    assert ended.value.code == 2 and f"{keyed_text}: unusable: {said.format(keyed_text)}\n" in out
    assert "mixed.jsonl: 4 rows read, 3 would be accepted, 1 quarantined" in out
    assert "  line 2: missing column(s) ['question']: the record has ['text', 'label']" in out

    staged, _ = deliver(project)
    assert outcome_of(staged, "keyed-text.jsonl").outcome == "unusable"
    assert outcome_of(staged, "keyed-text.jsonl").reason == said.format(Path("data/incoming/keyed-text.jsonl"))
    assert [q["line"] for q in staged.quarantined_rows if q["file"].endswith("keyed-text.jsonl")] == [None]
    assert (outcome_of(staged, "mixed.jsonl").accepted, outcome_of(staged, "mixed.jsonl").quarantined) == (3, 1)


def test_tqc_validate_is_exit_1_for_a_catalog_files_quarantined_rows_and_says_each_by_line(project, capsys):
    """A catalog file giving a known class another text, or a new id alike another but for case, has those rows
    quarantined by the flow (a delivery adds classes): `tqc validate` says so by line and exits 1, as for rows."""
    from tqc.cli import main

    catalog = retrain_staging._base_catalog(load_params(project / "params.yaml"))
    known = catalog.texts[catalog.index("LOC")]
    outside = project / "to-check"
    outside.mkdir()
    (outside / "catalog-more.csv").write_text("class_id,text\nLOC,Where on earth is it?\nFOOD,What should I eat?\n"
                                             "food,What is there to eat?\n")
    with pytest.raises(SystemExit) as ended:
        main(["validate", str(outside / "catalog-more.csv")])
    out = capsys.readouterr().out
    assert ended.value.code == 1, out
    assert ("catalog-more.csv: 3 class(es) read, 1 would be accepted as new classes, 2 quarantined (1 known class(es) "
            "with another text kept theirs (quarantined); 1 new class id(s) alike but for case or width to another "
            "(quarantined))") in out
    assert (f"  line 2: class 'LOC' already has the standard question {known!r}; a delivery adds classes, it does not "
            "change one's text") in out
    assert "  line 4: class 'food' is alike but for case or width to class 'FOOD'" in out


def test_tqc_validate_refuses_a_second_file_of_the_same_name_from_another_folder(project, capsys):
    """The flow names a row by its file's name and line, and an inbox holds one file of a name: two x.csv from two
    folders were judged as one (each "would be accepted", though the second repeats the first)."""
    from tqc.cli import main

    question = unseen_questions(project, "LOC", 1)[0]
    for folder in ("monday", "tuesday"):
        (project / folder).mkdir()
        (project / folder / "x.csv").write_text(f"question,label\n{question},LOC\n")
    with pytest.raises(SystemExit) as ended:
        main(["validate", str(project / "monday" / "x.csv"), str(project / "tuesday" / "x.csv")])
    out = capsys.readouterr().out
    assert ended.value.code == 2
    assert f"tuesday/x.csv: unusable: named as {project / 'monday' / 'x.csv'}: an inbox holds one file of a name" in out
    assert "monday/x.csv: 1 rows read, 1 would be accepted, 0 quarantined" in out


def test_tqc_validate_takes_one_file_spelt_two_ways_as_one(project, capsys):
    """x.csv and monday/../x.csv are one file, not a second file of its name."""
    from tqc.cli import main

    question = unseen_questions(project, "LOC", 1)[0]
    (project / "monday").mkdir()
    (project / "x.csv").write_text(f"question,label\n{question},LOC\n")
    with pytest.raises(SystemExit) as ended:
        main(["validate", str(project / "x.csv"), str(project / "monday" / ".." / "x.csv")])
    out = capsys.readouterr().out
    assert ended.value.code == 0 and "named as" not in out
    assert out.count("1 rows read, 1 would be accepted, 0 quarantined") == 1


def test_tqc_validate_warns_of_a_checked_files_labels_not_of_the_current_datas_derived_classes(project, capsys, caplog):
    """The grown data is built again for each check, and readers warned each time of every class the current data
    derives (a label its catalog lacks): lines about no file checked. A checked file's own label read as a catalog
    id is still said."""
    import yaml

    from tqc.cli import main

    dataset = Path(yaml.safe_load((project / "params.yaml").read_text())["data"]["data_dir"])
    catalog = dataset / "catalog.csv"
    catalog.write_text("".join(line for line in catalog.read_text().splitlines(keepends=True) if not line.startswith("NUM,")))
    batch = project / "batch.csv"
    batch.write_text(f"question,label\n{unseen_questions(project, 'LOC', 1)[0]},loc\n")
    with caplog.at_level(logging.WARNING, logger="tqc"), pytest.raises(SystemExit) as ended:
        main(["validate", str(batch)])
    assert ended.value.code == 0, capsys.readouterr().out
    said = [record.getMessage() for record in caplog.records if record.name == "tqc.readers"]
    assert said == [f"{batch}, line 2: label 'loc' read as class 'LOC' (1 row(s)): labels are matched to the classes' "
                    "ids case- and width-insensitively, and 1.0 as 1"], said
    assert not logging.getLogger("tqc.readers").filters  # the filter is gone after the check


def test_tqc_validate_says_a_repeat_delivery_adds_nothing_as_the_flow_would_and_an_unreadable_file_is_unusable(
        project, capsys, monkeypatch):
    """A file whose bytes the flow merged (or another given alongside has) is a repeat: the flow archives it adding
    nothing, so it is not judged row by row (every row a "duplicate"). A file that cannot be read is unusable, exit 2,
    not a traceback."""
    from tqc.cli import main

    def validate(*paths: Path) -> tuple[int, str]:
        with pytest.raises(SystemExit) as ended:
            main(["validate", *map(str, paths)])
        return ended.value.code, capsys.readouterr().out

    merged = drop(project, "first.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])
    outside = project / "to-check"
    outside.mkdir()
    (outside / "first-again.csv").write_bytes(merged.read_bytes())
    (outside / "copy.csv").write_bytes(merged.read_bytes())
    code, out = validate(outside / "copy.csv", outside / "first-again.csv", outside / "./copy.csv")  # copy.csv given twice
    assert code == 0, out
    assert f"first-again.csv: a repeat of {outside / 'copy.csv'} (the same bytes): the flow would archive it" in out
    assert out.count("copy.csv: 2 rows read, 2 would be accepted, 0 quarantined") == 1

    staged, files = deliver(project)
    steps.commit(load_params(project / "params.yaml"), staged, files, [])
    code, out = validate(outside / "copy.csv")
    assert code == 0 and "copy.csv: a repeat of a file the flow merged (the same bytes)" in out, out

    real_sha256 = retrain_inbox.sha256
    monkeypatch.setattr(retrain_inbox, "sha256", lambda path: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
                        if path.name == "theirs.csv" else real_sha256(path))
    (outside / "theirs.csv").write_text("question,label\nwhere is the sea,LOC\n")
    code, out = validate(outside / "theirs.csv")
    assert code == 2 and "theirs.csv: unusable: cannot be read (Permission denied)" in out


def test_tqc_validate_says_a_delivery_file_by_file_unusable_ones_then_repeats_then_each_judged_file_and_its_rows(
        project, capsys, monkeypatch):
    """The whole of what `tqc validate FILE…` prints for a delivery with every kind of file, in its order: the files
    the flow would not read (a folder, a missing file, another suffix, a second file of a name, an unreadable one),
    then the repeats, then each judged file as the flow stages it (catalogs first, then by name), each with its
    quarantined rows by line. Any file unusable: exit 2."""
    from tqc.cli import main

    outside = project / "to-check"
    (outside / "a-folder.csv").mkdir(parents=True)
    (outside / "notes.txt").write_text("question,label\nwhere is the sea,LOC\n")
    who = unseen_questions(project, "HUM", 1)[0]
    for folder in ("monday", "tuesday"):
        (outside / folder).mkdir()
        (outside / folder / "x.csv").write_text(f"question,label\n{who},HUM\n")
    (outside / "theirs.csv").write_text("question,label\nwhere is the sea,LOC\n")
    first, kept, unknown = unseen_questions(project, "LOC", 3)
    (outside / "copy.csv").write_text(f"question,label\n{first},LOC\n")
    (outside / "copy-again.csv").write_bytes((outside / "copy.csv").read_bytes())
    (outside / "catalog-more.csv").write_text("class_id,text\nLOC,Where is the place?\nFOOD,What should I eat?\n")
    (outside / "mixed.csv").write_text(f"question,label\n{kept},LOC\n{unknown},NOPE\n{kept},LOC\n")
    (outside / "keyed-text.jsonl").write_text(json.dumps({"text": "where is it", "label": "LOC"}) + "\n")
    real_sha256 = retrain_inbox.sha256
    monkeypatch.setattr(retrain_inbox, "sha256", lambda path: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
                        if path.name == "theirs.csv" else real_sha256(path))
    given = ["mixed.csv", "a-folder.csv", "missing.csv", "notes.txt", "monday/x.csv", "tuesday/x.csv", "theirs.csv",
             "copy.csv", "copy-again.csv", "catalog-more.csv", "keyed-text.jsonl"]

    with pytest.raises(SystemExit) as ended:
        main(["validate", *(str(outside / name) for name in given)])

    assert ended.value.code == 2
    assert capsys.readouterr().out.splitlines() == [
        f"{outside}/a-folder.csv: unusable: not a file",
        f"{outside}/missing.csv: unusable: no such file",
        f"{outside}/notes.txt: unusable: the retrain flow reads only .csv, .jsonl, .ndjson files",
        f"{outside}/tuesday/x.csv: unusable: named as {outside}/monday/x.csv: an inbox holds one file of a name, so "
        "rename one to deliver both",
        f"{outside}/theirs.csv: unusable: cannot be read (Permission denied)",
        # the inbox's order is by name: copy-again.csv comes first, so copy.csv is its repeat
        f"{outside}/copy.csv: a repeat of {outside}/copy-again.csv (the same bytes): the flow would archive it, adding "
        "nothing",
        f"{outside}/catalog-more.csv: 2 class(es) read, 1 would be accepted as new classes, 0 quarantined (1 known "
        "class(es) as the catalog has them)",
        f"{outside}/copy-again.csv: 1 rows read, 1 would be accepted, 0 quarantined",
        f"{outside}/keyed-text.jsonl: unusable: {outside}/keyed-text.jsonl: missing column(s) ['question'] in all 1 "
        "record(s): line 1 has ['text', 'label'] (named by data.custom.text_column)",
        f"{outside}/mixed.csv: 3 rows read, 1 would be accepted, 2 quarantined",
        f"  line 3: label_in_catalog: 'NOPE' is no class of the catalog (a delivery adds a class with a catalog*.csv "
        f"file of its standard question beside the rows): {{'text': {unknown!r}, 'class_id': 'NOPE'}}",
        f"  line 4: no_duplicates: duplicate of {outside}/mixed.csv, line 2: {{'text': {kept!r}, 'class_id': 'LOC'}}",
        f"{outside}/monday/x.csv: 1 rows read, 1 would be accepted, 0 quarantined",
    ]


def test_tqc_validate_without_data_additions_or_with_unreadable_current_data_is_exit_2_saying_so(project, capsys):
    """What the files are judged against cannot be built: data.additions unset (the flow merges there), or its
    merged questions unreadable. One line says why, after the files already found unusable; exit 2."""
    import yaml

    from tqc.cli import main

    def validate(*paths: Path) -> tuple[int, str]:
        with pytest.raises(SystemExit) as ended:
            main(["validate", *map(str, paths)])
        return ended.value.code, capsys.readouterr().out

    batch, notes = project / "batch.csv", project / "notes.txt"
    batch.write_text(f"question,label\n{unseen_questions(project, 'LOC', 1)[0]},LOC\n")
    notes.write_text(batch.read_text())
    params = yaml.safe_load((project / "params.yaml").read_text())
    (project / "params.yaml").write_text(yaml.safe_dump({**params, "data": {**params["data"], "additions": None}}))
    assert validate(batch, notes) == (2, f"{notes}: unusable: the retrain flow reads only .csv, .jsonl, .ndjson files\n"
                                         "the retrain flow merges into data.additions, which is not set in params.yaml; "
                                         "--against data/validated checks against the last dvc repro's data instead\n")
    # no file to judge: nothing needs data.additions
    assert validate(notes) == (2, f"{notes}: unusable: the retrain flow reads only .csv, .jsonl, .ndjson files\n")

    (project / "params.yaml").write_text(yaml.safe_dump(params))
    (project / "data" / "raw" / "labeled.jsonl").write_text('{"text": "where is it", "class_id": "LOC"}\nnot json\n')
    code, out = validate(batch)
    # named where it is kept, not as the scratch folder's copy that was read, deleted once the check ends
    additions = load_params(project / "params.yaml").data.additions
    assert (code, out) == (2, f"the current data to check against cannot be read: {Path(additions) / 'labeled.jsonl'}, "
                              "line 2: not valid JSON: Expecting value: line 1 column 1 (char 0)\n")


@pytest.mark.parametrize("name, merged, error, delivered", [
    ("labeled.jsonl", '{"text": "where is it", "class_id": "LOC"}\nnot json\n', DataFileError, "batch.csv"),
    ("labeled.jsonl", '{"question": "where is it", "class_id": "LOC"}\n', MissingColumns, "batch.csv"),
    # a catalog delivery reads the merged classes before any labeled file is judged
    ("catalog.jsonl", '{"class_id": "FOOD", "text": "What is on the menu?"}\nnot json\n', DataFileError, "catalog-new.csv")])
def test_merged_data_that_cannot_be_read_is_named_where_it_is_kept_not_as_the_staged_copy(project, name, merged, error,
                                                                                          delivered):
    """The flow reads a staged copy of data.additions (retrain.work_dir/raw); the file to mend is the kept one. The
    reader's error keeps its type and what it carries, named so too."""
    params = load_params(project / "params.yaml")
    kept, copy = Path(params.data.additions) / name, Path(params.retrain.work_dir) / "raw" / name
    kept.write_text(merged)
    if delivered == "catalog-new.csv":
        (project / "data" / "incoming").mkdir(parents=True)
        (project / "data" / "incoming" / delivered).write_text("class_id,text\nDRINK,What can I drink?\n")
    else:
        drop(project, delivered, [(q, "LOC") for q in unseen_questions(project, "LOC", 1)])

    with pytest.raises(error) as raised:
        deliver(project)

    assert str(raised.value).startswith(f"{kept}") and str(copy) not in str(raised.value)
    if error is MissingColumns:
        assert raised.value.columns == ["text"]
    assert copy.exists()  # what was read: the message is about the kept file, not a copy that is gone


def test_a_failed_write_to_the_staged_copy_names_the_copy_it_failed_to_write(project, monkeypatch):
    """Only a reader's errors are renamed: a write that failed names what failed, not the DVC-tracked data."""
    import errno

    params = load_params(project / "params.yaml")
    copy = Path(params.retrain.work_dir) / "raw" / "labeled.jsonl"
    drop(project, "batch.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 1)])

    def full_disk(path, rows):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(retrain_staging, "write_jsonl", full_disk)
    with pytest.raises(OSError) as raised:
        deliver(project)
    assert raised.value.filename == str(copy)


def test_rows_rejected_from_the_staged_copy_name_the_kept_file_each_and_keep_their_cause_and_notes(tmp_path):
    copy, kept = tmp_path / "staging" / "raw", tmp_path / "kept"
    rejected = [RejectedRow(str(copy / "labeled.jsonl"), line, "empty label", "{}") for line in (2, 5)]
    cause = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    with pytest.raises(RowsRejected) as raised, retrain_staging._naming_kept(copy, kept):
        error = RowsRejected(f"{copy / 'labeled.jsonl'}: 2 of 5 rows rejected", rejected)
        error.add_note(f"see {copy / 'labeled.jsonl'}")
        raise error from cause
    assert str(raised.value) == f"{kept / 'labeled.jsonl'}: 2 of 5 rows rejected"
    assert raised.value.rejected == [RejectedRow(str(kept / "labeled.jsonl"), line, "empty label", "{}") for line in (2, 5)]
    assert raised.value.__notes__ == [f"see {kept / 'labeled.jsonl'}"] and raised.value.__cause__ is cause


def test_an_error_about_another_file_or_whose_constructor_does_not_take_its_arguments_back_is_raised_as_it_was(tmp_path):
    class Odd(ReaderError):
        def __init__(self, path: str, extra: int):
            super().__init__(f"{path}: odd ({extra})")

    copy = tmp_path / "staging" / "raw"
    odd = Odd(str(copy / "labeled.jsonl"), 1)
    with pytest.raises(Odd) as raised, retrain_staging._naming_kept(copy, tmp_path / "kept"):
        raise odd
    assert raised.value is odd and str(odd) == f"{copy / 'labeled.jsonl'}: odd (1)"
    # a path the copy's is a prefix of is another file
    for other in (DataFileError(f"{copy}_old/labeled.jsonl, line 2: not valid JSON"),
                  DataFileError(f"{tmp_path / 'elsewhere.csv'}, line 2: not valid JSON")):
        with pytest.raises(DataFileError) as raised, retrain_staging._naming_kept(copy, tmp_path / "kept"):
            raise other
        assert raised.value is other


def test_an_attribute_an_error_about_the_staged_copy_carries_beyond_its_arguments_is_kept_and_names_the_kept_file(tmp_path):
    """An error without a `__reduce__` of its own is made again from its arguments alone; an attribute set on it
    besides (the file a caller attached, say) would be lost, or name the copy the run deletes, were its state not
    carried over and renamed too."""
    copy, kept = tmp_path / "staging" / "raw", tmp_path / "kept"
    error = DataFileError(f"{copy / 'labeled.jsonl'}, line 2: not valid JSON")
    error.file, error.line = str(copy / "labeled.jsonl"), 2
    with pytest.raises(DataFileError) as raised, retrain_staging._naming_kept(copy, kept):
        raise error
    assert str(raised.value) == f"{kept / 'labeled.jsonl'}, line 2: not valid JSON"
    assert (raised.value.file, raised.value.line) == (str(kept / "labeled.jsonl"), 2)


def test_a_delivered_copy_of_a_question_the_data_holds_under_two_labels_is_quarantined_when_judged(project):
    """The training run's validate quarantines every copy of a contested question, the delivered one too: the
    delivery is judged against the ingested rows it will be validated with, not validate's output (which lacks both)."""
    params = load_params(project / "params.yaml")
    train = Path(params.data.data_dir) / "train.csv"
    train.write_text(train.read_text() + "where is atlantis,LOC\nwhere is atlantis,HUM\n")
    fresh = unseen_questions(project, "LOC", 1)[0]
    drop(project, "new.csv", [("where is atlantis", "LOC"), (fresh, "LOC")])
    staged, _ = deliver(project)
    assert outcome_of(staged, "new.csv").accepted == 1 and [r["text"] for r in added_rows_of(staged)] == [fresh]
    contested, = [q for q in staged.quarantined_rows if q["content"]["text"] == "where is atlantis"]
    assert contested["line"] == 2 and "no_label_conflicts" in contested["expectations"]


def test_a_label_conflict_within_one_file_also_rules_out_another_files_copy(project):
    """b.csv holds a question as HUM and as LOC (both quarantined there); a.csv's LOC copy is quarantined too, as
    validate over the delivery's rows would: nothing says which label is right."""
    question = unseen_questions(project, "LOC", 1)[0]
    drop(project, "a.csv", [(question, "LOC")])
    drop(project, "b.csv", [(question, "HUM"), (question, "LOC")])
    staged, _ = deliver(project)
    assert outcome_of(staged, "a.csv").accepted == 0 and outcome_of(staged, "a.csv").quarantined == 1
    assert not staged.accepted and not (staged.raw / "labeled.jsonl").exists()  # no empty additions file: ingest refuses one


def test_a_delivery_that_adds_nothing_writes_no_empty_additions_file_that_ingest_would_refuse(project, caplog):
    from tqc.pipeline import ingested_data

    known = unseen_questions(project, "LOC", 1)[0]
    drop(project, "first.csv", [(known, "LOC")])
    staged, files = deliver(project)
    steps.commit(load_params(project / "params.yaml"), staged, files, [])
    drop(project, "again.csv", [(known, "LOC")])  # a duplicate only: nothing accepted
    drop(project, "catalog-known.csv", [])
    (project / "data" / "incoming" / "catalog-known.csv").write_text(  # the whole catalog again, with one text changed
        "class_id,text\nHUM,who is it?\nLOC,Where is the place?\nNUM,how many are there?\n")
    params = load_params(project / "params.yaml")
    files, _ = steps.pick_up(params.retrain)
    with caplog.at_level("WARNING", logger="tqc.retrain"):
        staged = steps.stage(files, params, Path(params.retrain.work_dir))
    assert not staged.accepted
    assert "catalog-known.csv, line 2: class 'HUM' already has the standard question" in caplog.text  # said, not only counted
    known_class, = [q for q in staged.quarantined_rows if q["expectations"] == ["new_class"]]
    assert known_class["content"] == {"class_id": "HUM", "text": "who is it?"} and "already has the standard" in known_class["reason"]
    assert known_class["line"] == 2  # the file's line, as every other quarantined row has
    assert outcome_of(staged, "catalog-known.csv").reason == ("2 known class(es) as the catalog has them; 1 known class(es) "
                                                             "with another text kept theirs (quarantined)")
    assert ingested_data(retrain_staging.with_additions(params, staged.raw), Path(params.retrain.work_dir) / "check").exists()


def test_an_inbox_file_that_cannot_be_read_is_left_there_and_the_others_go_on(project, monkeypatch, caplog):
    drop(project, "theirs.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 1)])
    drop(project, "ours.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 1)])
    real = retrain_inbox._delivered_sha256

    def not_ours(path):  # as root runs the tests, a mode would not stop the read
        if path.name == "theirs.csv":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(retrain_inbox, "_delivered_sha256", not_ours)
    with caplog.at_level(logging.WARNING, logger="tqc.retrain"):
        new, repeats = steps.pick_up(load_params(project / "params.yaml").retrain)
    assert [f.path.name for f in new] == ["ours.csv"] and not repeats
    assert "theirs.csv: cannot be read, left in the inbox: Permission denied" in caplog.text


def added_rows_of(staged: steps.Staged) -> list[dict]:
    path = staged.raw / "labeled.jsonl"
    return read_jsonl(path) if path.exists() else []


def test_a_journal_is_gone_at_once_when_closed_and_a_copy_cut_short_is_not_put_back_as_a_delivery(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    directory = tmp_path / "work" / "commit-journal"
    journal = retrain_commit.CommitJournal.begin(directory, {tmp_path / "absent.jsonl": None}, [])
    (tmp_path / "work" / "commit-journal.closed").mkdir()  # what a kill while deleting an earlier one leaves
    journal.close()
    assert not directory.exists() and not (tmp_path / "work" / "commit-journal.closed").exists()

    inbox, archive = tmp_path / "inbox", tmp_path / "archive"
    inbox.mkdir(), archive.mkdir()
    (inbox / "a.csv").write_text("question,label\nwho is it,HUM\nwhere is it,LOC\n")
    (archive / "a.csv").write_text("question,label\nwho is it,HU")  # a copy to another disk, killed midway
    retrain_commit._roll_back({}, [(inbox / "a.csv", archive / "a.csv", retrain_inbox.sha256(inbox / "a.csv"))], [])
    assert [p.name for p in inbox.iterdir()] == ["a.csv"] and not any(archive.iterdir())


def test_a_journal_written_before_moves_carried_their_sha256_still_rolls_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    directory = tmp_path / "work" / "commit-journal"
    retrain_commit.CommitJournal.begin(directory, {}, [])
    (tmp_path / "inbox").mkdir(), (tmp_path / "archive").mkdir()
    (tmp_path / "archive" / "a.csv").write_text("question,label\nwho is it,HUM\n")
    (directory / "moves.jsonl").write_text(json.dumps({"inbox": "inbox/a.csv", "archived_as": "archive/a.csv"}) + "\n")
    params = load_params(Path(__file__).resolve().parents[2] / "params.yaml").retrain.model_copy(
        update={"work_dir": str(tmp_path / "work")})
    assert steps.roll_back_interrupted_commit(params)  # a KeyError named nothing, and stopped every later run
    assert (tmp_path / "inbox" / "a.csv").exists() and not directory.exists()


def test_a_journal_still_there_is_never_written_over_by_the_next_commit(tmp_path):
    """An interrupted commit's journal holds the only copy of the data as it was: a second commit that wrote its own
    journal over it (its "before" being the half-committed data) would make that state unrecoverable."""
    directory = tmp_path / "work" / "commit-journal"
    retrain_commit.CommitJournal.begin(directory, {tmp_path / "labeled.jsonl": b"as it was\n"}, [])
    with pytest.raises(steps.RetrainCommitError, match="an interrupted commit's journal is still there"):
        retrain_commit.CommitJournal.begin(directory, {tmp_path / "labeled.jsonl": b"half committed\n"}, [])
    assert retrain_commit.CommitJournal.found(directory).before == {tmp_path / "labeled.jsonl": b"as it was\n"}


def test_a_journal_whose_last_move_was_cut_by_the_kill_still_rolls_back_the_moves_before_it(tmp_path, monkeypatch):
    """A kill while a move's line was written leaves it cut: that move was never made, and the ones before it are
    undone; a JSONDecodeError would stop this and every later run until someone edited the journal."""
    monkeypatch.chdir(tmp_path)
    directory = tmp_path / "work" / "commit-journal"
    for folder in ("data", "inbox", "archive"):
        (tmp_path / folder).mkdir()
    (tmp_path / "data" / "labeled.jsonl").write_text("committed\n")
    retrain_commit.CommitJournal.begin(directory, {Path("data/labeled.jsonl"): b"as it was\n"}, [])
    (tmp_path / "archive" / "a.csv").write_text("question,label\nwho is it,HUM\n")
    move = json.dumps({"inbox": "inbox/a.csv", "archived_as": "archive/a.csv", "sha256": None})
    (directory / "moves.jsonl").write_text(move + "\n" + '{"inbox": "inbox/b.csv", "archived_a')
    params = load_params(Path(__file__).resolve().parents[2] / "params.yaml").retrain.model_copy(
        update={"work_dir": str(tmp_path / "work")})
    assert steps.roll_back_interrupted_commit(params)
    assert (tmp_path / "inbox" / "a.csv").exists() and not (tmp_path / "archive" / "a.csv").exists()
    assert (tmp_path / "data" / "labeled.jsonl").read_text() == "as it was\n" and not directory.exists()


def test_a_roll_back_waits_for_gits_index_lock_and_fails_at_once_on_any_other_git_error(monkeypatch):
    """Another git process (an editor's `git status`) holds .git/index.lock for a moment: the roll-back's git command
    is tried again after each wait, and given up once the waits are spent; any other failure is not waited on."""
    import subprocess

    locked = "fatal: Unable to create '/repo/.git/index.lock': File exists."
    outcomes, sleeps = [], []
    monkeypatch.setattr(retrain_commit.subprocess, "run",
                        lambda args, **_: subprocess.CompletedProcess(args, *outcomes.pop(0)))
    monkeypatch.setattr(retrain_commit.time, "sleep", sleeps.append)

    outcomes[:] = [(128, "", locked), (128, "", locked), (0, "", "")]
    retrain_commit._git_index("add", "--", "data/raw/labeled.jsonl.dvc")
    assert sleeps == [0.5, 1.0] and not outcomes

    sleeps.clear()
    outcomes[:] = [(128, "", "fatal: not a git repository")]
    with pytest.raises(steps.RetrainCommitError, match="could not set git's index to match \\(git add: fatal: not a git"):
        retrain_commit._git_index("add", "--", "data/raw/labeled.jsonl.dvc")
    assert sleeps == []

    outcomes[:] = [(128, "", locked)] * 5  # held past every wait
    with pytest.raises(steps.RetrainCommitError, match="index.lock"):
        retrain_commit._git_index("rm", "-q", "--cached", "--", "data/raw/labeled.jsonl.dvc")
    assert sleeps == list(retrain_commit.INDEX_LOCK_WAITS) and not outcomes


def test_a_retrain_trains_no_nc_baseline_and_fits_the_prior_on_the_staged_data(tmp_path, monkeypatch):
    """The gate judges stage two alone: an NC baseline trained in a retrain is a third model's training for nothing.
    The chain and its prior run on the staged data (data.additions the staged folder), with the run's seed."""
    from types import SimpleNamespace

    import tqc.mining
    import tqc.pipeline
    from tqc.config import Params
    from tqc.retraining import renew
    from tqc.stages import prior

    chains, priors = [], []

    def train_chain(params, data_dir, train, work, seed, with_nc=True, on_epoch=None):
        chains.append((params.data.additions, data_dir, train, work, seed, with_nc))
        return tqc.pipeline.ChainOutputs(work / "stage_one", work / "stage_two", work / "nc" if with_nc else None,
                                         fits={"stage_two": SimpleNamespace(best_validation_macro_f1=0.75)})

    monkeypatch.setattr(tqc.mining, "check_faiss_for", lambda similarity: None)
    monkeypatch.setattr(tqc.pipeline, "prepare_data", lambda params, work: SimpleNamespace(
        directory=work / "validated", train=work / "augmented.jsonl"))
    monkeypatch.setattr(tqc.pipeline, "train_chain", train_chain)
    monkeypatch.setattr(prior, "run", lambda data, one, two, nc, params, out: priors.append((data, one, two, nc, out)))
    staging = tmp_path / "staging"
    trained = renew.train(Params(seed=9), SimpleNamespace(raw=staging / "raw"), staging)
    models = staging / "models"
    assert chains == [(str(staging / "raw"), staging / "data" / "validated", staging / "data" / "augmented.jsonl", models,
                       9, False)]
    assert priors == [(staging / "data" / "validated", models / "stage_one", models / "stage_two", None,
                       models / "prior.json")]
    assert trained == steps.Trained(staging / "data" / "validated", models / "stage_two", models / "prior.json", 0.75)


def test_the_champion_to_refresh_is_read_with_its_rule_and_k_into_a_folder_emptied_first(tmp_path, monkeypatch):
    """A version registered before versions carried a rule tag serves the standard rule; the exemplar k is the one it
    was registered with. The folder it downloads into is emptied first: a failed earlier download's files stayed."""
    from types import SimpleNamespace

    import mlflow

    import tqc.registry
    from tqc.retraining import renew

    versions = {"tqc-admc": SimpleNamespace(version=4, tags={})}
    config = {}

    def registered_artifacts(name, version, destination):
        destination.mkdir(parents=True, exist_ok=True)
        return {"model": destination / "model"}, config

    monkeypatch.setattr(mlflow, "MlflowClient", lambda *args, **kwargs: None)
    monkeypatch.setattr(tqc.registry, "alias_version", lambda client, name, alias: versions.get(name))
    monkeypatch.setattr(tqc.registry, "registered_artifacts", registered_artifacts)
    destination = tmp_path / "champion"
    destination.mkdir()
    (destination / "left-over.bin").write_text("an earlier download's")
    champion = renew.champion_model("tqc-admc", "champion", destination)
    assert champion == retrain_pending.Champion("4", destination / "model", "standard", None)
    assert not (destination / "left-over.bin").exists()
    versions["tqc-admc"], config["exemplar_k"] = SimpleNamespace(version=5, tags={"rule": "exemplars"}), "3"
    assert renew.champion_model("tqc-admc", "champion", destination) == retrain_pending.Champion(
        "5", destination / "model", "exemplars", 3)
    with pytest.raises(steps.RefreshError, match="has no other@champion to refresh"):
        renew.champion_model("other", "champion", destination)


def test_a_refresh_says_when_it_changes_the_exemplar_k_the_champion_serves(tmp_path, monkeypatch, caplog):
    """A refresh serves evaluate.exemplar_k: a champion registered with another k is a change of rule the gate judges,
    and the log says so; one with the same k and rule is said nothing of."""
    from types import SimpleNamespace

    import tqc.pipeline
    from tqc.config import Params
    from tqc.retraining import renew

    champion = retrain_pending.Champion("1", tmp_path / "model", "exemplars", 3)
    monkeypatch.setattr(renew, "champion_model", lambda *args: champion)
    monkeypatch.setattr(tqc.pipeline, "validated_data", lambda params, work: work / "validated")
    params = Params.model_validate({"promote": {"rule": "exemplars"}, "evaluate": {"exemplar_k": 2}})
    with caplog.at_level(logging.WARNING, logger="tqc.retrain"):
        refreshed = renew.refresh(params, SimpleNamespace(raw=tmp_path / "raw"), tmp_path / "staging")
    assert "tqc-admc v1 serves the exemplars rule with k = 3; this refresh serves the exemplar rule with k = 2, so the " \
           "gate also judges that change" in caplog.text
    assert refreshed == steps.Trained(tmp_path / "staging" / "data" / "validated", champion.model, None, None,
                                      refreshed_from=champion)
    caplog.clear()
    champion = retrain_pending.Champion("1", tmp_path / "model", "exemplars", 2)
    with caplog.at_level(logging.WARNING, logger="tqc.retrain"):
        renew.refresh(params, SimpleNamespace(raw=tmp_path / "raw"), tmp_path / "staging")
    assert "serves the" not in caplog.text


def test_the_data_version_is_recorded_only_in_a_dvc_project_and_pushed_only_where_a_remote_is_named(tmp_path, monkeypatch, caplog):
    import subprocess

    from tests.conftest import dvc_init

    data = tmp_path / "labeled.jsonl"
    data.write_text('{"text": "where is paris", "class_id": "LOC"}\n')
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tqc.retrain"):
        assert retrain_dvc.dvc_record([data], push=True) == {"added": [], "pushed": False}  # not a DVC project
    assert "not inside a DVC repository" in caplog.text and not Path(f"{data}.dvc").exists()

    subprocess.run(["git", "init", "-q"], check=True)
    dvc_init(tmp_path)
    assert retrain_dvc.dvc_record([data], push=True) == {"added": [f"{data}.dvc"], "pushed": False}  # no remote named
    (tmp_path / "remote").mkdir()
    # named in the local config, which `dvc remote list` reads too
    (tmp_path / ".dvc" / "config.local").write_text(f"[core]\n    remote = store\n['remote \"store\"']\n    url = {tmp_path / 'remote'}\n")
    data.write_text(data.read_text() + '{"text": "who is the person", "class_id": "HUM"}\n')
    assert retrain_dvc.dvc_record([data], push=True)["pushed"] and any((tmp_path / "remote").rglob("*"))

    # remotes, none of them the default: refused before anything is added, saying how to choose one
    (tmp_path / ".dvc" / "config.local").write_text(f"['remote \"store\"']\n    url = {tmp_path / 'remote'}\n")
    before = Path(f"{data}.dvc").read_text()
    data.write_text(data.read_text() + '{"text": "how many are there", "class_id": "NUM"}\n')
    with pytest.raises(steps.RetrainCommitError, match=r"names remote\(s\) store but no default one.*dvc remote default NAME"):
        retrain_dvc.dvc_record([data], push=True)
    assert Path(f"{data}.dvc").read_text() == before  # not added
    assert retrain_dvc.dvc_record([data], push=False)["added"]  # never pushing, the remotes do not matter

    # a default named in the project's config, defined in a config.local this checkout lacks: it added without
    # pushing, unsaid, and retrain.on_push_failure never fired
    (tmp_path / ".dvc" / "config.local").unlink()
    (tmp_path / ".dvc" / "config").write_text("[core]\n    remote = store\n")
    before = Path(f"{data}.dvc").read_text()
    data.write_text(data.read_text() + '{"text": "what is it", "class_id": "DESC"}\n')
    with pytest.raises(steps.RetrainCommitError, match=r"default remote is 'store', which no DVC config here defines, so "
                                                       r"dvc push would fail: define it \(`dvc remote add --local store"):
        retrain_dvc.dvc_record([data], push=True)
    assert Path(f"{data}.dvc").read_text() == before  # not added

    (tmp_path / ".dvc" / "config.local").write_text("[core\n")  # unreadable: one line naming the command, no traceback
    with pytest.raises(steps.RetrainCommitError, match=r"^dvc remote list failed: ") as failure:
        retrain_dvc._has_default_remote()
    assert "\n" not in str(failure.value)


def test_a_dvc_push_that_fails_is_tried_again_and_one_that_keeps_failing_leaves_the_commit_made(project, monkeypatch,
                                                                                                    caplog):
    """A push that failed once (a network blip) failed the commit, and its roll-back threw the run's training away."""
    (project / "remote").mkdir()
    (project / ".dvc" / "config.local").write_text(f"[core]\n    remote = store\n['remote \"store\"']\n"
                                                   f"    url = {project / 'remote'}\n")
    monkeypatch.setattr(retrain_dvc, "PUSH_RETRY_WAITS", (0.0, 0.0), raising=False)  # no waits here
    real_dvc, pushes = retrain_dvc._dvc, []

    def remote(down_for: int):
        def dvc(command, *arguments):
            if command == "push":
                pushes.append(arguments)
                if len(pushes) <= down_for:
                    raise steps.RetrainCommitError("dvc push failed (exit 1): ERROR: failed to push data to the cloud")
            return real_dvc(command, *arguments)
        return dvc

    params = load_params(project / "params.yaml")
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    monkeypatch.setattr(retrain_dvc, "_dvc", remote(down_for=1))
    staged, files = deliver(project)
    result = steps.commit(params, staged, files, [])
    assert len(pushes) == 2 and result["dvc"] == {"added": ["data/raw/labeled.jsonl.dvc"], "pushed": True}
    assert any((project / "remote").rglob("*")) and len(added_rows(project)) == 2

    pushes.clear()
    drop(project, "two.csv", [(q, "NUM") for q in unseen_questions(project, "NUM", 2)])
    monkeypatch.setattr(retrain_dvc, "_dvc", remote(down_for=10))  # down longer than the tries
    staged, files = deliver(project)
    with caplog.at_level(logging.WARNING, logger="tqc.retrain"):
        result = steps.commit(params, staged, files, [])
    assert len(pushes) == 3 and not result["dvc"]["pushed"] and "failed to push" in result["dvc"]["push_failed"]
    assert len(added_rows(project)) == 4 and not (project / "data" / "incoming" / "two.csv").exists()  # committed
    assert "push it by hand with `dvc push data/raw/labeled.jsonl.dvc`" in caplog.text
    assert "`dvc push data/raw/labeled.jsonl.dvc`" in steps.closing_line(staged, {"promoted": False, "reasons": []},
                                                                          result, Path(params.retrain.quarantine))

    # The remote back: the next commit pushes the version its .dvc file names then, which holds the unpushed rows too,
    # but not the unpushed version's own file (docs/retrain.md: push it before another retrain, or --all-commits)
    unpushed = dvc_md5_of(project / "data" / "raw" / "labeled.jsonl.dvc")
    monkeypatch.setattr(retrain_dvc, "_dvc", real_dvc)
    drop(project, "three.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])
    staged, files = deliver(project)
    assert steps.commit(params, staged, files, [])["dvc"]["pushed"] and len(added_rows(project)) == 6
    on_remote = {f"{path.parent.name}{path.name}" for path in (project / "remote").rglob("*") if path.is_file()}
    assert dvc_md5_of(project / "data" / "raw" / "labeled.jsonl.dvc") in on_remote and unpushed not in on_remote


def test_a_pending_challengers_unpushed_data_version_is_marked_and_pushed_again_by_the_next_run(project, monkeypatch):
    """The challenger's mark did not record that its data version was unpushed: a run whose gate also failed left the
    next one nothing to push again, or to name."""
    (project / "remote").mkdir()
    (project / ".dvc" / "config.local").write_text(f"[core]\n    remote = store\n['remote \"store\"']\n"
                                                   f"    url = {project / 'remote'}\n")
    monkeypatch.setattr(retrain_dvc, "PUSH_RETRY_WAITS", (0.0, 0.0))
    real_dvc = retrain_dvc._dvc

    def remote_down(command, *arguments):
        if command == "push":
            raise steps.RetrainCommitError("dvc push failed (exit 1): ERROR: failed to push data to the cloud")
        return real_dvc(command, *arguments)

    params = load_params(project / "params.yaml")
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    staged, files = deliver(project)
    challenger = steps.Trained(data=staged.raw, model=staged.raw, prior=None, validation_macro_f1=0.5)
    assert steps.push_pending_version(params.retrain) is None  # nothing pending
    monkeypatch.setattr(retrain_dvc, "_dvc", remote_down)
    steps.commit(params, staged, files, [], challenger)
    assert steps.pending_judge(params.retrain) == challenger  # the record beside it leaves the challenger as it was

    again = steps.push_pending_version(params.retrain)  # still down: said, and kept for the run after
    assert again == {"added": ["data/raw/labeled.jsonl.dvc"], "pushed": False,
                     "push_failed": "dvc push failed (exit 1): ERROR: failed to push data to the cloud"}
    assert "was pushed again, but it is still not on the DVC remote" in steps.push_failure({"pending_dvc": again})
    assert steps.push_failure({"pending_dvc": again, "dvc": {"added": ["data/raw/labeled.jsonl.dvc"], "pushed": True}}
                              ) is None  # a newer version pushed holds its rows; that run says its own push

    monkeypatch.setattr(retrain_dvc, "_dvc", real_dvc)  # the remote back
    assert steps.push_pending_version(params.retrain) == {"added": ["data/raw/labeled.jsonl.dvc"], "pushed": True}
    on_remote = {f"{path.parent.name}{path.name}" for path in (project / "remote").rglob("*") if path.is_file()}
    assert dvc_md5_of(project / "data" / "raw" / "labeled.jsonl.dvc") in on_remote
    assert steps.push_pending_version(params.retrain) is None  # pushed once: the mark no longer records it
    assert steps.pending_judge(params.retrain) == challenger  # still awaiting the gate


@pytest.mark.parametrize("gone", ["data", "model"])
def test_a_marked_challenger_whose_data_or_model_is_gone_is_refused_naming_it_and_the_mark(tmp_path, gone):
    """The next run judges the marked challenger first: with its staged data or its model deleted since (the work
    folder emptied by hand), it stops saying which is gone and which mark to delete, rather than failing in the gate."""
    params = RetrainParams(work_dir=str(tmp_path / "work"))
    folders = {name: tmp_path / name for name in ("data", "model")}
    for folder in folders.values():
        folder.mkdir()
    challenger = steps.Trained(data=folders["data"], model=folders["model"], prior=None, validation_macro_f1=0.5)
    retrain_pending.mark_judge_pending(params, challenger)
    assert steps.pending_judge(params) == challenger

    folders[gone].rmdir()
    with pytest.raises(steps.RetrainCommitError, match="did not judge its challenger") as refused:
        steps.pending_judge(params)
    assert f"{folders[gone]} is gone" in str(refused.value)
    assert str(steps.pending_judge_path(params)) in str(refused.value)


def test_a_marked_unpushed_data_version_is_not_pushed_again_where_retrain_push_is_off(tmp_path, monkeypatch):
    """retrain.push false: a run pushes no data version, neither its own nor the one a run before it left unpushed."""
    params = RetrainParams(work_dir=str(tmp_path / "work"), push=False)
    challenger = steps.Trained(data=tmp_path, model=tmp_path, prior=None, validation_macro_f1=0.5)
    retrain_pending.mark_judge_pending(params, challenger, {"added": ["data/raw/labeled.jsonl.dvc"], "pushed": False,
                                                            "push_failed": "dvc push failed (exit 1): ERROR: unreachable"})
    pushes = []
    monkeypatch.setattr(retrain_dvc, "_dvc", lambda command, *arguments: pushes.append((command, *arguments)) or "")

    assert steps.push_pending_version(params) is None and not pushes
    assert steps.push_pending_version(params.model_copy(update={"push": True})) == {
        "added": ["data/raw/labeled.jsonl.dvc"], "pushed": True}  # set on again, it is pushed
    assert pushes == [("push", "data/raw/labeled.jsonl.dvc")]


def test_a_marked_refresh_comes_back_with_the_champion_whose_encoder_it_serves(tmp_path):
    """A refresh's mark holds its champion (the gate and the version's tags need it): read back without it, the next
    run judged the refresh as a training."""
    params = RetrainParams(work_dir=str(tmp_path / "work"))
    champion = retrain_pending.Champion("3", tmp_path / "champion", "exemplars", 5)
    refresh = steps.Trained(data=tmp_path, model=tmp_path, prior=None, validation_macro_f1=None, refreshed_from=champion)
    retrain_pending.mark_judge_pending(params, refresh)
    assert steps.pending_judge(params) == refresh


def test_a_judged_challengers_mark_is_cleared_and_clearing_no_mark_is_no_error(tmp_path):
    """Once judged (or given up) the mark goes: left, every later run would judge that challenger again first."""
    params = RetrainParams(work_dir=str(tmp_path / "work"))
    retrain_pending.mark_judge_pending(params, steps.Trained(data=tmp_path, model=tmp_path, prior=None,
                                                             validation_macro_f1=0.5))
    steps.clear_pending_judge(params)
    assert steps.pending_judge(params) is None and not steps.pending_judge_path(params).exists()
    steps.clear_pending_judge(params)  # nothing marked: nothing to do


def dvc_md5_of(dvc_file: Path) -> str:
    """The md5 a .dvc file records for its one output."""
    from tqc.config import read_yaml

    return read_yaml(dvc_file.read_text())["outs"][0]["md5"]


def test_the_data_version_waits_for_dvc_s_lock_where_another_dvc_command_holds_it(tmp_path, monkeypatch):
    """A dvc command in the same checkout (a `dvc status`, an editor's DVC extension, a `dvc repro`) holding DVC's lock
    for more than DVC's 3 s made `dvc add` fail, and the commit threw that run's training away."""
    import subprocess
    import sys
    import threading
    import time

    from tests.conftest import dvc_init

    data = tmp_path / "labeled.jsonl"
    data.write_text('{"text": "where is paris", "class_id": "LOC"}\n')
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q"], check=True)
    dvc_init(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom dvc.repo import Repo\nwith Repo('.').lock:\n"
                               "    print('held', flush=True)\n    sys.stdin.read()\n"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        outcome: dict = {}
        adding = threading.Thread(target=lambda: outcome.update(retrain_dvc.dvc_record([data], push=False)), daemon=True)
        adding.start()
        time.sleep(10)  # DVC gives up on a held lock after 3 s, a dvc process starting included
        assert adding.is_alive() and not Path(f"{data}.dvc").exists()  # waiting, not failed
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    adding.join(timeout=60)
    assert outcome == {"added": [f"{data}.dvc"], "pushed": False} and Path(f"{data}.dvc").exists()


def test_free_name_skips_every_taken_rolled_back_name(tmp_path):
    for name in ("a.csv", "a.rolled-back-1.csv", "a.rolled-back-2.csv"):
        (tmp_path / name).write_text("x")
    assert retrain_inbox.free_name(tmp_path / "a.csv").name == "a.rolled-back-3.csv"


def test_a_catalog_file_is_known_whatever_its_case():
    assert retrain_inbox.Incoming(Path("CATALOG_new.csv"), "0" * 64).is_catalog
    assert retrain_inbox.Incoming(Path("Catalog.jsonl"), "0" * 64).is_catalog
    assert not retrain_inbox.Incoming(Path("questions.csv"), "0" * 64).is_catalog


def test_a_delivery_swapped_for_a_pipe_is_refused_not_waited_on(tmp_path):
    """A pipe in a delivery's place is not a delivered file: opening it waited for a writer, forever, before the
    check that it is a regular file, and the retrain run with it."""
    import os
    import threading

    pipe = tmp_path / "delivery.csv"
    os.mkfifo(pipe)
    said: list[BaseException] = []

    def read() -> None:
        try:
            retrain_inbox.delivered_bytes(pipe)
        except OSError as exc:
            said.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # let the stuck open return, so the test process can end
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
    assert len(said) == 1 and isinstance(said[0], retrain_inbox.NotADeliveredFile)
