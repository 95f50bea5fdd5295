"""augment.explicit: file — rows made offline, attributed to the training questions they came from."""

import json
from collections import Counter

import pytest

from tqc.config import AugmentParams, ConfigError, GeneratedData, load_params
from tqc.schema import LabeledQuestion, load_questions, save_questions
from tqc.stages import augment
from tqc.stages.ingest import attribute_generated

ORIGINALS = [
    LabeledQuestion("how does the virus spread between people", "transmission", "train.csv:1"),
    LabeledQuestion("can my dog give me covid", "transmission", "train.csv:2"),
    LabeledQuestion("what are the first symptoms of covid", "symptoms", "train.csv:3"),
    LabeledQuestion("is losing smell a symptom", "symptoms", "train.csv:4"),
]


def generated(*rows: tuple[str, str]) -> list[LabeledQuestion]:
    return [LabeledQuestion(text, label, f"aug.csv:{i}") for i, (text, label) in enumerate(rows, start=1)]


def test_each_row_is_attributed_to_the_question_it_was_made_from():
    rows = generated(
        ("how does the virus spread among people", "transmission"),   # synonym swap of line 1
        ("can my dog give covid", "transmission"),                    # deletion from line 2
        ("is losing smell a symptom", "symptoms"),                   # the original itself: not a new row
        ("Is losing  smell a SYMPTOM", "symptoms"),                  # ... whatever its case and spacing
    )
    attribution = attribute_generated(rows, ORIGINALS, GeneratedData())
    assert [(r.text, r.origins) for r in attribution.rows] == [
        ("how does the virus spread among people", ("train.csv:1",)),
        ("can my dog give covid", ("train.csv:2",)),
    ]
    assert all(r.generated for r in attribution.rows)
    assert attribution.copies == 2 and attribution.rejected == []


def test_a_tokenised_original_and_its_typed_copy_or_paraphrase_share_their_words_as_validate_reads_them():
    """Split raw, "What 's the annual fee of the gold card ?" and "What's the annual fee of the gold card?" shared
    a third of their words: the copy and the paraphrase were quarantined as made from no training question."""
    originals = [LabeledQuestion("What 's the annual fee of the gold card ?", "fee", "train.label:1"),
                 LabeledQuestion("How do I close my account ?", "close", "train.label:2")]
    rows = generated(("What's the annual fee of the gold card?", "fee"), ("What's the yearly fee of the gold card?", "fee"))
    attribution = attribute_generated(rows, originals, GeneratedData())
    assert attribution.rejected == [] and attribution.copies == 1
    assert [(r.text, r.origins) for r in attribution.rows] == [("What's the yearly fee of the gold card?", ("train.label:1",))]


def test_a_row_no_question_of_its_class_explains_is_quarantined_with_file_line_and_reason():
    rows = generated(("what are the first symptoms of covid", "transmission"),  # a symptoms question labelled otherwise
                     ("", "symptoms"))
    attribution = attribute_generated(rows, ORIGINALS, GeneratedData())
    assert attribution.rows == [] and attribution.copies == 0
    (first, second) = attribution.rejected
    assert (first.file, first.line) == ("aug.csv", 1)
    assert "cannot tell which training question of class 'transmission'" in first.reason and "min_overlap 0.5" in first.reason
    assert (second.line, second.reason) == (2, "empty text")


def test_a_row_close_to_two_questions_keeps_every_near_best_one_as_an_origin():
    originals = [LabeledQuestion("when will covid end", "speculation", "t:1"),
                 LabeledQuestion("when will covid end soon", "speculation", "t:2")]
    rows = generated(("when covid end", "speculation"))  # word overlap 3/4 with t:1, 3/5 with t:2
    assert attribute_generated(rows, originals, GeneratedData(margin=0.1)).rows[0].origins == ("t:1",)
    assert attribute_generated(rows, originals, GeneratedData(margin=0.2)).rows[0].origins == ("t:1", "t:2")


def offline(text: str, label: str, line: int, *origins: str) -> LabeledQuestion:
    return LabeledQuestion(text, label, f"aug.csv:{line}", generated=True, origins=origins)


def test_augment_draws_offline_rows_only_when_all_their_origins_are_in_train():
    train = [LabeledQuestion(f"tail question {i}", "tail", f"t:{i}") for i in range(2)] + \
            [LabeledQuestion(f"head question {i}", "head", f"t:{10 + i}") for i in range(6)]
    pool = [offline(f"tail rewrite {i}", "tail", i, "t:0") for i in range(3)] + [
        offline("made from a validation question", "tail", 3, "v:7"),
        offline("made from train or validation", "tail", 4, "t:1", "v:7"),
        offline("head rewrite", "head", 5, "t:10"),
    ]
    rows = augment.oversample(train, {"tail": 6, "head": 6}, seed=0, explicit="file", generated=pool)
    extra = rows[len(train):]
    assert Counter(q.class_id for q in rows) == {"tail": 6, "head": 6}
    drawn = sorted(q.text for q in extra if q.source.startswith("file:"))
    assert drawn == ["tail rewrite 0", "tail rewrite 1", "tail rewrite 2"]  # never the rows tied to v:7
    copies = [q for q in extra if q.source.startswith("oversample:")]
    assert len(copies) == 1 and copies[0].text in {"tail question 0", "tail question 1"}  # too few offline rows
    assert all(q.generated for q in extra)
    assert augment.oversample(train, {"tail": 6, "head": 6}, seed=0, explicit="file", generated=pool) == rows
    # `tqc augment --generated` takes any file: a row it draws is marked generated whatever the file said
    unmarked = [LabeledQuestion("tail rewrite", "tail", "mine.jsonl:1", origins=("t:0",))]
    drawn = augment.oversample(train, {"tail": 3, "head": 6}, seed=0, explicit="file", generated=unmarked)[len(train):]
    assert [(q.text, q.generated) for q in drawn] == [("tail rewrite", True)]


def test_the_augment_stage_reads_the_validated_offline_rows_and_reports_what_it_used(tmp_path):
    train = [LabeledQuestion(f"question {i}", "a" if i < 4 else "b", f"t:{i}") for i in range(6)]
    save_questions(tmp_path / "train.jsonl", train)
    save_questions(tmp_path / "generated.jsonl", [offline("question zero again", "b", 1, "t:4"),
                                                   offline("from validation", "b", 2, "v:1")])
    params = AugmentParams(rebalance="mean", explicit="file", implicit=[])
    report = augment.run(tmp_path / "train.jsonl", params, 0, tmp_path / "out.jsonl", tmp_path / "augment.json",
                         tmp_path / "generated.jsonl")
    assert report["file"] == {"offline_rows": 2, "usable": 1, "made_from_held_out_questions": 1,
                              "usable_but_a_held_out_question": 0, "drawn": 1, "copies_where_too_few": 0}
    assert [q.text for q in load_questions(tmp_path / "out.jsonl") if q.generated] == ["question zero again"]
    assert json.loads((tmp_path / "augment.json").read_text())["per_class"]["b"] == {"before": 2, "after": 3, "generated": 1}
    with pytest.raises(FileNotFoundError, match="data.generated.path"):
        augment.run(tmp_path / "train.jsonl", params, 0, tmp_path / "out.jsonl", tmp_path / "augment.json",
                    tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="no file of offline rows was given"):
        augment.run(tmp_path / "train.jsonl", params, 0, tmp_path / "out.jsonl", tmp_path / "augment.json")


def test_an_offline_row_that_is_a_held_out_question_is_not_drawn_while_others_are_left(tmp_path):
    """After evaluate.resplit an offline row can be a question of the new validation split: drawn, it was dropped and a
    copy took its place, though the class had offline rows to spare, and the report said the class ran out."""
    train = [LabeledQuestion("how do I pay", "A", "t:0"), LabeledQuestion("can I pay by card", "A", "t:1"),
             *(LabeledQuestion(f"where is branch {i}", "B", f"t:{2 + i}") for i in range(6))]
    pool = [offline(f"how can I pay {word}", "A", i, "t:0") for i, word in enumerate(["now", "today", "online", "later",
                                                                                       "here"])]
    save_questions(tmp_path / "train.jsonl", train)
    save_questions(tmp_path / "generated.jsonl", pool)
    params = AugmentParams(rebalance="max", explicit="file", implicit=[])
    for held_out in (q.text for q in pool):  # 4 of A's 5 offline rows are drawn: whichever is held out
        save_questions(tmp_path / "validation.jsonl", [LabeledQuestion(held_out.upper(), "A", "v:1")])
        report = augment.run(tmp_path / "train.jsonl", params, 0, tmp_path / "out.jsonl", tmp_path / "augment.json",
                             tmp_path / "generated.jsonl", [tmp_path / "validation.jsonl"])
        made = [q for q in load_questions(tmp_path / "out.jsonl") if q.generated]
        assert sorted(q.text for q in made) == sorted(q.text for q in pool if q.text != held_out)
        assert report["rows"]["copies_in_place_of_dropped"] == 0 and report["rows"]["generated_dropped_as_held_out"] == 0
        assert report["file"] == {"offline_rows": 5, "usable": 5, "made_from_held_out_questions": 0,
                                  "usable_but_a_held_out_question": 1, "drawn": 4, "copies_where_too_few": 0}


def test_copies_that_replace_a_dropped_offline_row_are_not_counted_as_copies_where_too_few(tmp_path):
    """An offline row that is another class's training question is dropped after the draw and a copy takes its place:
    the report counts that copy once, in rows.copies_in_place_of_dropped, not also as one for want of offline rows."""
    train = [LabeledQuestion("how do I pay", "A", "t:0"), LabeledQuestion("can I pay by card", "A", "t:1"),
             *(LabeledQuestion(f"where is branch {i}", "B", f"t:{2 + i}") for i in range(6))]
    save_questions(tmp_path / "train.jsonl", train)
    save_questions(tmp_path / "generated.jsonl", [offline("how can I pay now", "A", 1, "t:0"),
                                                   offline("where is branch 0", "A", 2, "t:0")])  # B's question
    report = augment.run(tmp_path / "train.jsonl", AugmentParams(rebalance="max", explicit="file", implicit=[]), 0,
                         tmp_path / "out.jsonl", tmp_path / "augment.json", tmp_path / "generated.jsonl")
    assert report["rows"]["generated_dropped_as_label_conflict"] == 1 and report["rows"]["copies_in_place_of_dropped"] == 1
    # A: 2 rows + 1 offline row kept of the 2 drawn + 2 copies for want of offline rows + 1 in the dropped one's place
    assert report["file"]["drawn"] == 1 and report["file"]["copies_where_too_few"] == 2
    assert report["per_class"]["A"]["after"] == 6


def test_file_augmentation_without_a_file_is_a_config_error(tmp_path):
    (tmp_path / "params.yaml").write_text("augment: {explicit: file}\n")
    with pytest.raises(ConfigError, match="data.generated.path is not set"):
        load_params(tmp_path / "params.yaml")


def test_ingest_and_validate_carry_offline_rows_in_the_dataset_format(tmp_path):
    from tqc.pipeline import prepare_data

    data = tmp_path / "data"
    (data / "covid-q" / "categories").mkdir(parents=True)
    train = "".join(f"question number {i} about {c},{c}\n" for c in ("Testing", "Origin") for i in range(10))
    (data / "covid-q" / "categories" / "train20.csv").write_text(train)
    (data / "covid-q" / "categories" / "testA.csv").write_text("where did it start,Origin\nhow do i get a test,Testing\n")
    (data / "covid-q" / "categories" / "aug.csv").write_text(
        "question number 3 on Testing,Testing\n"       # from line 4
        "question number 3 about Testing,Testing\n"    # line 4 itself: dropped as a copy
        "how do i get a test,Testing\n"                # cannot be attributed: quarantined
        "question 5 about Origin,Origin\n")            # from line 16
    params = load_params("params.yaml", {
        "data": {"dataset": "covidq-categories", "data_dir": str(data), "additions": None,
                 "generated": {"path": "covid-q/categories/aug.csv"}},
        "augment": {"explicit": "file", "rebalance": "count", "target_count": 12}})
    prepared = prepare_data(params, tmp_path / "work")
    ingest_report = json.loads((tmp_path / "work" / "reports" / "ingest.json").read_text())
    assert ingest_report["generated"]["read"] == 4
    assert ingest_report["generated"]["attributed"] == 2 and ingest_report["generated"]["copies_of_their_original"] == 1
    quarantined = [json.loads(line) for line in (tmp_path / "work" / "quarantine" / "ingest.jsonl").read_text().splitlines()]
    assert [(q["line"], q["content"]) for q in quarantined] == [(3, "how do i get a test,Testing")]
    validated = load_questions(prepared.directory / "generated.jsonl")
    assert {q.origins[0].rsplit(":", 1)[1] for q in validated} == {"4", "16"}
    in_train = {q.source for q in load_questions(prepared.directory / "train.jsonl")}
    used = [q for q in load_questions(prepared.train) if q.source.startswith("file:")]
    usable = [q for q in validated if set(q.origins) <= in_train]
    assert usable and sorted(q.text for q in used) == sorted(q.text for q in usable)  # all of them: 3 needed a class


def test_a_file_that_names_each_rows_source_is_attributed_exactly():
    from tqc.stages.ingest import attribute_named

    originals = ORIGINALS + [LabeledQuestion("Can my dog  give me COVID", "transmission", "train.csv:5")]  # a repeat
    rows = generated(("will my pet infect me", "transmission"),            # no word in common: overlap could not tell
                     ("what are the earliest signs", "symptoms"),
                     ("is losing smell a symptom", "symptoms"),           # its source's own text
                     ("how does it spread", "transmission"),              # names a question of another class
                     ("", "symptoms"),
                     ("how does the virus travel", "transmission"))       # names nothing
    named = {"aug.csv:1": "can my dog give me covid", "aug.csv:2": "What are the first symptoms of COVID",
             "aug.csv:3": "is losing smell a symptom", "aug.csv:4": "what are the first symptoms of covid",
             "aug.csv:5": "is losing smell a symptom", "aug.csv:6": " "}
    attribution = attribute_named(rows, originals, named, "made_from")
    assert [(r.text, r.origins) for r in attribution.rows] == [
        ("will my pet infect me", ("train.csv:2", "train.csv:5")),  # both copies of that text: either may land in validation
        ("what are the earliest signs", ("train.csv:3",)),
    ]
    assert attribution.copies == 1
    assert [(r.line, r.reason) for r in attribution.rejected] == [
        (4, "its source question 'what are the first symptoms of covid' is not a training question of class 'transmission'"),
        (5, "empty text"), (6, "empty source question (column 'made_from')")]


def test_ingest_reads_the_source_column_of_a_custom_file(tmp_path):
    from tqc.pipeline import prepare_data

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("question,label\n" + "".join(
        f"question number {i} about {c},{c}\n" for c in ("a", "b") for i in range(10)))
    (data / "test.csv").write_text("question,label\nsomething else entirely,a\nand another one,b\n")
    (data / "paraphrases.csv").write_text("question,label,made_from\n"
                                          "a rewrite with no shared word,a,question number 3 about a\n"
                                          "another rewrite,b,not a training question\n"
                                          "a third rewrite,b\n")
    custom = {"train": "train.csv", "test": "test.csv", "catalog": None, "text_column": "question", "label_column": "label"}
    overrides = {"data": {"dataset": "custom", "data_dir": str(data), "additions": None, "custom": custom,
                          "max_rejected_fraction": 0.5,  # 1 of the 3 offline rows is unreadable
                          "generated": {"path": "paraphrases.csv", "source_column": "made_from"}},
                 "augment": {"explicit": "file", "rebalance": "count", "target_count": 12}}
    prepare_data(load_params("params.yaml", overrides), tmp_path / "work")
    report = json.loads((tmp_path / "work" / "reports" / "ingest.json").read_text())["generated"]
    assert (report["read"], report["attributed"], report["quarantined"]) == (3, 1, 2)
    quarantined = sorted((json.loads(line) for line in (tmp_path / "work" / "quarantine" / "ingest.jsonl").read_text().splitlines()),
                         key=lambda q: q["line"])
    assert [q["line"] for q in quarantined] == [3, 4]
    assert "not a training question of class 'b'" in quarantined[0]["reason"] and "columns" in quarantined[1]["reason"]

    overrides["data"]["dataset"] = "covidq-categories"
    with pytest.raises(ConfigError, match="source_column is set but data.dataset is 'covidq-categories'"):
        load_params("params.yaml", overrides)


def test_a_row_made_from_a_held_out_added_question_is_never_trained_on(tmp_path):
    """The retrain flow's added questions are candidate origins too: one that stable_split holds out for
    validation must not have its paraphrase attributed to a look-alike training question and trained on."""
    from tqc.pipeline import prepare_data

    data, additions = tmp_path / "data", tmp_path / "raw"
    (data / "covid-q" / "categories").mkdir(parents=True)
    additions.mkdir()
    train = "".join(f"question number {i} about {c},{c}\n" for c in ("Testing", "Origin") for i in range(10))
    (data / "covid-q" / "categories" / "train20.csv").write_text(train + "where can i get tested today,Testing\n")
    (data / "covid-q" / "categories" / "testA.csv").write_text("where did it start,Origin\nhow do i get a test,Testing\n")
    held_out = "where can i get tested number 11 today"  # stable_split puts it in validation at seed 5, fraction 0.1
    (additions / "labeled.jsonl").write_text(json.dumps({"text": held_out, "class_id": "Testing"}) + "\n")
    paraphrase = "where can i get tested number 11 tomorrow"  # overlap 0.78 with the added question, 0.56 with line 21
    (data / "covid-q" / "categories" / "aug.csv").write_text(f"{paraphrase},Testing\n")
    params = load_params("params.yaml", {
        "seed": 5,  # the carved split leaves line 21, the paraphrase's look-alike, in train
        "data": {"dataset": "covidq-categories", "data_dir": str(data), "additions": str(additions),
                 "generated": {"path": "covid-q/categories/aug.csv"}},
        "augment": {"explicit": "file", "rebalance": "count", "target_count": 12}})
    prepared = prepare_data(params, tmp_path / "work")
    assert held_out in {q.text for q in load_questions(prepared.directory / "validation.jsonl")}
    assert "where can i get tested today" in {q.text for q in load_questions(prepared.directory / "train.jsonl")}
    report = json.loads((tmp_path / "work" / "reports" / "ingest.json").read_text())["generated"]
    assert (report["attributed"], report["made_from_held_out_questions"]) == (1, 1)
    assert paraphrase not in {q.text for q in load_questions(prepared.train)}
