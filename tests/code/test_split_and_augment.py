from collections import Counter
from pathlib import Path

import pytest

from tqc.schema import LabeledQuestion
from tqc.stages.augment import class_targets, oversample, rebalance_target
from tqc.stages.ingest import stratified_split


def questions(counts: dict[str, int]) -> list[LabeledQuestion]:
    return [LabeledQuestion(f"{label} question {i}", label, f"f:{i}") for label, n in counts.items() for i in range(n)]


def at_least(rows: list[LabeledQuestion], count: int) -> dict[str, int]:
    """Every class of `rows` raised to `count` (the `count` rebalancing)."""
    return class_targets(Counter(q.class_id for q in rows), "count", count)


def test_stratified_split_is_seeded_and_covers_every_class():
    rows = questions({"a": 50, "b": 10, "c": 3, "d": 2})
    train, validation = stratified_split(rows, 0.1, seed=0)
    assert stratified_split(rows, 0.1, seed=0) == (train, validation)
    assert Counter(q.class_id for q in validation) == {"a": 5, "b": 1, "c": 1}
    assert sorted(train + validation, key=lambda q: q.source + q.class_id) == sorted(rows, key=lambda q: q.source + q.class_id)


def test_the_split_depends_on_the_seed_and_not_on_the_order_classes_come_in():
    """A seed that changed nothing (or a draw of each class's first rows) and a draw that followed the file's order
    of classes both kept every test above."""
    rows = questions({"a": 50, "b": 10, "c": 3})
    texts = lambda split: sorted(q.text for q in split[1])  # noqa: E731
    assert texts(stratified_split(rows, 0.1, seed=0)) != texts(stratified_split(rows, 0.1, seed=1))
    c_first = sorted(rows, key=lambda q: q.class_id != "c")  # stable: each class's rows keep their order
    assert texts(stratified_split(c_first, 0.1, seed=0)) == texts(stratified_split(rows, 0.1, seed=0))


def test_oversampling_lifts_every_class_to_the_mean_and_marks_copies():
    rows = questions({"head": 30, "mid": 9, "tail": 3})
    target = rebalance_target(Counter(q.class_id for q in rows))
    assert target == 14
    augmented = oversample(rows, class_targets(Counter(q.class_id for q in rows)), seed=0)
    counts = Counter(q.class_id for q in augmented)
    assert counts == {"head": 30, "mid": 14, "tail": 14}
    copies = [q for q in augmented if q.generated]
    assert len(copies) == 16 and all(q.source.startswith("oversample:") for q in copies)
    tail_texts = Counter(q.text for q in augmented if q.class_id == "tail")
    assert max(tail_texts.values()) - min(tail_texts.values()) <= 1  # originals repeated evenly


def test_eda_rows_are_perturbed_with_words_of_their_own_class_and_marked_generated():
    import random

    from tqc.eda import random_delete, random_insert, random_swap

    rng = random.Random(0)
    assert sorted(random_swap("a b c d".split(), 2, rng)) == ["a", "b", "c", "d"]
    assert len(random_delete("a b c d".split(), 10, rng)) == 1  # never deletes every word
    assert random_insert(["a"], 2, ["x"], rng).count("x") == 2

    questions = [LabeledQuestion(f"where is the river {i}", "LOC") for i in range(8)] + \
                [LabeledQuestion("who wrote the book", "HUM"), LabeledQuestion("who painted the wall", "HUM")]
    augmented = oversample(questions, at_least(questions, 8), seed=0, explicit="eda", alpha=0.3)
    generated = [q for q in augmented if q.generated]
    assert len(generated) == 6 and all(q.class_id == "HUM" and q.source.startswith("eda:") for q in generated)
    hum_words = {"who", "wrote", "the", "book", "painted", "wall"}
    assert all(set(q.text.split()) <= hum_words for q in generated)  # no LOC word leaks in
    assert any(q.text not in {"who wrote the book", "who painted the wall"} for q in generated)  # texts really change
    copies = oversample(questions, at_least(questions, 8), seed=0)
    assert {q.text for q in copies if q.generated} <= {"who wrote the book", "who painted the wall"}


def test_eda_draws_again_where_an_operation_would_leave_the_question_as_it_was():
    """A one-word question's swap and deletion, and any swap of equal words, changed nothing: a third of the rows
    made from such questions were copies, reported as EDA rows."""
    import random

    from tqc.eda import augment_text

    rng = random.Random(0)
    one_word = [augment_text("Hello", ["Hello", "there"], rng) for _ in range(50)]
    assert all(text != "Hello" for text in one_word) and all("Hello" in text.split() for text in one_word)
    assert all(augment_text("why why why", ["why", "how"], rng) != "why why why" for _ in range(50))
    assert augment_text("why", [], rng) == "why"  # nothing can change it: it stays, and is counted as a copy
    # a swap of words equal but for case is no change either (the questions compare alike), nor is one of two equal words
    from tqc.text import compared_text

    for seed in range(50):
        swapped = augment_text("Why WHY why", [], random.Random(seed))
        assert swapped == "Why WHY why" or compared_text(swapped) != compared_text("Why WHY why")
    assert all(augment_text("hello hello", [], random.Random(seed), attempts=1) == "hello" for seed in range(50))


def test_eda_moves_the_characters_of_chinese_and_japanese_questions_which_have_no_spaces():
    """`text.split()` made a whole Chinese question one word: no swap or deletion could change it, and an insertion
    glued another question of its class onto it."""
    import random

    from tqc.eda import augment_text, class_vocabularies, joined, words_of
    from tqc.text import normalise

    assert words_of("我的银行卡丢了怎么办") == list("我的银行卡丢了怎么办")
    assert words_of("where is 北京 now?") == ["where", "is", "北", "京", "now?"]
    for text in ("我的银行卡丢了怎么办", "カードをなくした", "where is 北京 now?", "what is a card", "บัตรหาย", "你好，我的卡丢了吗？",
                 "「カード」をなくした。"):
        assert joined(words_of(text)) == " ".join(text.split())  # units back into the text they came from
    assert normalise(joined(words_of("where is 北京, now?"))) == normalise("where is 北京, now?")  # as validate compares
    # a deletion that gives a held-out question gives it as validate compares texts, punctuation and all
    deleted = joined([unit for unit in words_of("你好，我的卡丢了吗") if unit != "吗"])
    assert deleted == "你好，我的卡丢了"
    assert augment_text("why", [], random.Random(0)) == "why" and augment_text("好", [], random.Random(0)) == "好"
    rows = [LabeledQuestion("我的银行卡丢了怎么办", "lost"), LabeledQuestion("银行卡被偷了怎么挂失", "lost")]
    vocabulary = class_vocabularies(rows)["lost"]
    assert "银" in vocabulary and len(vocabulary) == len(set("我的银行卡丢了怎么办银行卡被偷了怎么挂失"))
    rng = random.Random(0)
    made = [augment_text(rows[0].text, vocabulary, rng, alpha=0.2) for _ in range(30)]
    assert all(" " not in text and set(text) <= set(vocabulary) for text in made)  # characters of its class, no spaces
    assert all(abs(len(text) - len(rows[0].text)) <= 2 for text in made)  # an edit, not a second question glued on
    assert len(set(made)) > 5 and rows[0].text not in made


def test_an_eda_edit_keeps_its_questions_spacing_full_width_words_and_never_comes_back_empty():
    """Re-spaced ("我有3张卡吗" edited to "我有 3 张卡"), an edit escaped augment's comparison with a test question
    "我有3张卡"; full-width Latin ("Ｗｈａｔ ｉｓ") was cut into letters with the spaces lost; and an edit could leave
    a zero-width space alone, a row validate would refuse as empty."""
    import random

    from tqc.eda import Spacing, augment_text, joined, spacing_of, words_of
    from tqc.text import normalise

    assert spacing_of("我有3张卡吗") == Spacing(between_unspaced=False, across_scripts=False)
    assert spacing_of("我 有 三 张 卡") == Spacing(between_unspaced=True, across_scripts=True)  # a segmented corpus
    for text in ("我有3张卡吗", "我 有 三 张 卡", "where is 北京 now?", "我用 iPhone 吗", "Ｗｈａｔ ｉｓ ｍｙ ｂａｌａｎｃｅ"):
        assert joined(words_of(text), spacing_of(text)) == text
    assert joined(["我", "有", "3", "张", "卡"], spacing_of("我有3张卡吗")) == "我有3张卡"  # a deletion: the test question
    assert words_of("Ｗｈａｔ ｉｓ ｍｙ") == ["Ｗｈａｔ", "ｉｓ", "ｍｙ"] and words_of("か\u3099き") == ["か\u3099", "き"]
    rng = random.Random(0)
    made = [augment_text("我有3张卡吗", list("我有3张卡吗的"), rng) for _ in range(20)]
    assert all(" " not in text for text in made)
    made = [augment_text("Ｗｈａｔ ｉｓ ｍｙ ｂａｌａｎｃｅ", [], rng) for _ in range(10)]
    assert all(set(text.split()) <= {"Ｗｈａｔ", "ｉｓ", "ｍｙ", "ｂａｌａｎｃｅ"} and " " in text for text in made)
    for seed in range(20):  # a deletion down to the zero-width space alone is no edit: an original's copy instead
        edited = augment_text("balance \u200b", [], random.Random(seed))
        assert normalise(edited) != ""


def test_an_eda_edit_never_leaves_only_characters_a_tokenizer_reads_as_nothing():
    """A word of U+FFFD (a byte a decoder could not read), a private-use character or a lone accent is text to
    `normalise` but none to the tokenizer, and validate refuses a row of it alone as empty: a deletion down to it was
    written as a training row the encoder reads as the empty question."""
    import random

    from tqc.eda import augment_text
    from tqc.text import has_words

    for text in ("what \ufffd", "card \ue000", "where \u0301"):
        made = [augment_text(text, [], random.Random(seed), alpha=0.5) for seed in range(30)]
        assert all(has_words(edited) for edited in made), text


def test_an_eda_edit_never_leaves_a_question_without_a_letter_or_digit():
    """A deletion cut the two-word "Why ?" to "?", which validate accepts and which teaches nothing: such an edit is
    drawn again, and the original's copy stands where every draw would be one."""
    import random

    from tqc.eda import augment_text

    made = [augment_text("Why ?", [], random.Random(seed)) for seed in range(30)]
    assert all(any(ch.isalnum() for ch in text) for text in made) and {"Why", "? Why"} <= set(made)
    assert augment_text("? !", [], random.Random(0)) == "? !"  # no edit of it keeps a word: it stays as it came
    assert "银行?" not in {augment_text("银行?", [], random.Random(seed)) for seed in range(10)}  # a letter of any script


def test_the_long_tail_follows_sharprecl_counts():
    from tqc.stages.ingest import long_tail

    questions = [LabeledQuestion(f"q{c}{i}", c) for c, n in (("A", 100), ("B", 90), ("C", 80)) for i in range(n)]
    counts = Counter(q.class_id for q in long_tail(questions, ratio=10, seed=0))
    assert counts == {"A": 100, "B": int(100 * 10 ** -0.5), "C": 10}  # n·ir^(−i/(C−1)), i = 0, 1, 2
    assert Counter(q.class_id for q in long_tail(questions, ratio=10, seed=0)) == counts  # seeded


def test_rebalance_targets_none_mean_max_and_a_fixed_count():
    counts = Counter({"head": 30, "mid": 9, "tail": 3})
    assert rebalance_target(counts, "none") == 0
    assert rebalance_target(counts, "mean") == 14
    assert rebalance_target(counts, "max") == 30
    assert rebalance_target(counts, "count", 20) == 20
    augmented = oversample(questions(dict(counts)), class_targets(counts, "max"), seed=0, explicit="eda")
    assert set(Counter(q.class_id for q in augmented).values()) == {30}  # the target applies to eda rows too


def test_the_augment_stage_reports_generated_rows_per_class(tmp_path):
    from tqc.config import AugmentParams
    from tqc.schema import load_questions, save_questions
    from tqc.stages.augment import run

    save_questions(tmp_path / "train.jsonl", questions({"head": 10, "tail": 2}))
    report = run(tmp_path / "train.jsonl", AugmentParams(rebalance="max", explicit="eda"), 0, tmp_path / "out.jsonl",
                 tmp_path / "augment.json")
    assert report["per_class"]["tail"] == {"before": 2, "after": 10, "generated": 8}
    assert report["per_class"]["head"]["generated"] == 0 and report["explicit"] == "eda"
    written = load_questions(tmp_path / "out.jsonl")
    assert sum(q.generated for q in written) == 8 == report["rows"]["generated"]


def test_sqrt_rebalancing_raises_each_class_to_the_root_of_its_size_times_the_largest():
    counts = Counter({"head": 400, "mid": 100, "tail": 4})
    assert class_targets(counts, "sqrt") == {"head": 400, "mid": 200, "tail": 40}
    assert class_targets(counts, "mean") == {"head": 400, "mid": 168, "tail": 168}
    assert class_targets(Counter(a=4, b=1)) == {"a": 4, "b": 3}  # a mean of 2.5: at least the mean is 3
    augmented = oversample(questions(dict(counts)), class_targets(counts, "sqrt"), seed=0)
    assert Counter(q.class_id for q in augmented) == {"head": 400, "mid": 200, "tail": 40}


def test_each_seed_augments_its_train_again_and_resplit_draws_a_new_validation_split(tmp_path):
    from tqc.config import Params
    from tqc.schema import Catalog, StandardQuestion, load_questions, save_questions
    from tqc.stages.evaluate import augmented_again, resplit

    validated = tmp_path / "validated"
    train, validation = stratified_split(questions({"a": 30, "b": 10, "c": 4}), 0.2, seed=0)
    save_questions(validated / "train.jsonl", train)
    save_questions(validated / "validation.jsonl", validation)
    save_questions(validated / "test.jsonl", questions({"a": 2, "b": 2, "c": 1}))
    Catalog([StandardQuestion(c, f"standard {c}?") for c in "abc"]).save(validated / "catalog.jsonl")
    params = Params.model_validate({"data": {"validation_fraction": 0.2}, "augment": {"rebalance": "mean"}})

    seed_dir = resplit(params, validated, seed=1, out_dir=tmp_path / "seed1")
    seed_train = augmented_again(params, seed_dir, validated, seed=1, out_dir=tmp_path / "seed1")

    new_train, new_validation = load_questions(seed_dir / "train.jsonl"), load_questions(seed_dir / "validation.jsonl")
    assert set(new_validation) != set(validation)  # another draw ...
    assert Counter(q.class_id for q in new_validation) == Counter(q.class_id for q in validation)  # ... as stratified
    assert set(new_train) | set(new_validation) == set(train) | set(validation) and not set(new_train) & set(new_validation)
    assert Catalog.load(seed_dir / "catalog.jsonl").class_ids == ["a", "b", "c"]
    # test as it was: the warm-up reads it to keep its questions out of the pool (its absence failed the seed)
    assert (seed_dir / "test.jsonl").read_bytes() == (validated / "test.jsonl").read_bytes()
    augmented = load_questions(seed_train)  # the augment stage ran on the new train: tail classes lifted, originals kept
    assert Counter(q.class_id for q in augmented)["c"] > Counter(q.class_id for q in new_train)["c"]
    assert [q for q in augmented if not q.generated] == new_train

    # without a new split, each seed still draws its own augmentation (it reused seed 0's rows)
    seed_2 = load_questions(augmented_again(params, validated, validated, seed=2, out_dir=tmp_path / "seed2"))
    seed_3 = load_questions(augmented_again(params, validated, validated, seed=3, out_dir=tmp_path / "seed3"))
    assert [q for q in seed_2 if not q.generated] == [q for q in seed_3 if not q.generated] == train
    assert [q.source for q in seed_2 if q.generated] != [q.source for q in seed_3 if q.generated]


def test_resplit_never_draws_a_standard_question_for_validation_at_any_seed(tmp_path):
    """Ingest holds the catalog's standard questions out of validation (matched word for word, such a row judges
    nothing); each extra seed's resplit draws again from the same rows and must hold them out as ingest does."""
    from tqc.config import Params
    from tqc.schema import Catalog, StandardQuestion, load_questions, save_questions
    from tqc.stages.evaluate import resplit

    rows = questions({"a": 6, "b": 6})
    validated = tmp_path / "validated"
    save_questions(validated / "train.jsonl", rows[1:])
    save_questions(validated / "validation.jsonl", rows[:1])
    save_questions(validated / "test.jsonl", questions({"a": 1, "b": 1}))
    # compared as ingest compares texts: case and spacing aside
    Catalog([StandardQuestion("a", rows[0].text.upper()), StandardQuestion("b", f"  {rows[6].text}")]).save(
        validated / "catalog.jsonl")
    params = Params.model_validate({"data": {"validation_fraction": 0.4}})
    for seed in range(10):
        drawn = load_questions(resplit(params, validated, seed, tmp_path / f"seed{seed}") / "validation.jsonl")
        assert Counter(q.class_id for q in drawn) == {"a": 2, "b": 2}
        assert rows[0] not in drawn and rows[6] not in drawn


def test_max_factor_caps_each_class_at_a_multiple_of_its_own_count(tmp_path):
    from tqc.config import AugmentParams
    from tqc.schema import load_questions, save_questions
    from tqc.stages.augment import run

    counts = Counter({"head": 400, "mid": 100, "tail": 4})
    # the mean (168) would copy the tail's 4 questions 42 times; ×4 stops it at 16, and the mid class at 168 < 400
    assert class_targets(counts, "mean", max_factor=4) == {"head": 400, "mid": 168, "tail": 16}
    assert class_targets(counts, "sqrt", max_factor=2.5) == {"head": 400, "mid": 200, "tail": 10}
    save_questions(tmp_path / "train.jsonl", questions(dict(counts)))
    report = run(tmp_path / "train.jsonl", AugmentParams(rebalance="mean", explicit="eda", max_factor=4), 0,
                 tmp_path / "out.jsonl", tmp_path / "augment.json")
    assert {c: v["after"] for c, v in report["per_class"].items()} == {"head": 400, "mid": 168, "tail": 16}
    assert Counter(q.class_id for q in load_questions(tmp_path / "out.jsonl") if q.generated) == {"mid": 68, "tail": 12}


def test_the_validation_split_never_draws_a_test_question_and_is_unchanged_where_it_drew_none():
    rows = questions({"a": 30, "b": 3})
    train, validation = stratified_split(rows, 0.1, seed=0)
    drawn_b = next(q for q in validation if q.class_id == "b")
    # that question is also in test: drawn for validation, validate would quarantine it and b would have none
    avoided = frozenset({" ".join(drawn_b.text.casefold().split())})
    train2, validation2 = stratified_split(rows, 0.1, seed=0, held_out_texts=avoided)
    assert Counter(q.class_id for q in validation2) == Counter(q.class_id for q in validation)
    assert drawn_b not in validation2 and drawn_b in train2
    assert [q for q in validation2 if q.class_id == "a"] == [q for q in validation if q.class_id == "a"]
    assert sorted(q.source + q.class_id for q in train2 + validation2) == sorted(q.source + q.class_id for q in rows)
    a_train = next(q for q in train if q.class_id == "a")  # a test question that was not drawn changes nothing
    assert stratified_split(rows, 0.1, seed=0, held_out_texts=frozenset({a_train.text})) == (train, validation)


@pytest.mark.parametrize("doomed", ["b question\x02 with a stray control byte", "???", "b question " + "x" * 60])
def test_a_row_validate_quarantines_wherever_it_stands_is_passed_over_by_the_draw(doomed):
    """A control character, no letter or digit, or over validate.max_text_chars (50 here): drawn as class b's one
    validation row, validate took it out and left b none, with clean rows in train."""
    rows = questions({"a": 30, "b": 5})
    _, validation = stratified_split(rows, 0.1, seed=0)
    drawn_b = next(q for q in validation if q.class_id == "b")
    rows = [LabeledQuestion(doomed, "b", q.source) if q is drawn_b else q for q in rows]  # the same draw's place
    train, validation = stratified_split(rows, 0.1, seed=0, max_text_chars=50)
    b_validation = [q for q in validation if q.class_id == "b"]
    assert len(b_validation) == 1 and b_validation[0].text != doomed  # a clean one of b's rows instead
    assert any(q.text == doomed for q in train)  # kept in train, where validate judges it
    assert [q for q in validation if q.class_id == "a"] == [q for q in stratified_split(rows, 0.1, seed=0)[1]
                                                            if q.class_id == "a"]


@pytest.mark.parametrize("seed", range(8))
def test_a_repeated_or_empty_text_is_never_drawn_for_validation(seed):
    """A copy drawn for validation left its twin in train, which validate quarantined as leakage (critical: a file
    that only repeated rows stopped the pipeline); an empty text drawn there was a quarantined row among a dozen,
    over max_quarantined_fraction for some seeds."""
    unique = questions({"a": 20, "b": 20})
    repeated = [LabeledQuestion(f"Repeated {i}?", "a", f"r:{i}") for i in range(10)]
    again = [LabeledQuestion(f"repeated  {i} ?", "a", f"s:{i}") for i in range(10)]  # the same text, normalised
    # no text, or none a tokenizer reads (validate quarantines both as non_empty_text, a critical expectation)
    empty = [LabeledQuestion(text, "b", f"e:{i}") for i, text in enumerate(["\u200b", "  ", "\ufffd", "\x01", "\u0301"])]
    train, validation = stratified_split(unique + repeated + again + empty, 0.2, seed)
    assert len(validation) == 8 + 5 and all(q in unique for q in validation)  # round(0.2 · 40), round(0.2 · 25)
    assert len(train) + len(validation) == 65



def test_a_class_whose_rows_all_repeat_gets_no_validation_row_and_is_named(caplog):
    rows = questions({"a": 20}) + [LabeledQuestion("Same?", "b", f"b:{i}") for i in range(4)]
    with caplog.at_level("WARNING"):
        train, validation = stratified_split(rows, 0.2, seed=0)
    assert {q.class_id for q in validation} == {"a"} and len(train) == 24 - 4
    assert "class 'b' has no validation row: each of its 4 training rows repeats" in caplog.text


def test_ingest_says_in_one_warning_that_a_class_whose_rows_all_repeat_has_no_validation_row_and_why(tmp_path, caplog):
    """stratified_split's warning, then the one of classes without validation rows, named the class twice."""
    from tqc.config import DataParams
    from tqc.stages import ingest

    rows = [(f"a question {i}", "a") for i in range(20)] + [("Same?", "b")] * 4 + [("one", "c")]
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"{text},{label}\n" for text, label in rows))
    (tmp_path / "test.csv").write_text("text,label\nheld out,a\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None,
                        custom={"train": "train.csv", "test": "test.csv"})
    with caplog.at_level("WARNING", logger="tqc.stages.ingest"):
        report = ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")
    assert report["classes_without_validation_rows"] == ["b", "c"]  # c: under 3 rows, named without a reason
    [said] = [r.getMessage() for r in caplog.records if "'b'" in r.getMessage()]
    assert "2 class(es) have training rows but no validation row" in said
    assert "'b' (each of its 4 training rows repeats, is empty, is a test or standard question, or fails a check" in said
    assert "'c'" in said and "'c' (" not in said


SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared datasets not present")
def test_no_standard_question_is_drawn_for_validation(tmp_path):
    """COVID-Q classes' standard questions are each class's first train3 question: drawn for validation (29 of
    87 with seed 0), they were matched word for word and judged nothing."""
    from tqc.config import DataParams
    from tqc.schema import Catalog, load_questions
    from tqc.stages import ingest
    from tqc.text import normalise

    params = DataParams(dataset="covidq-classes", data_dir=str(SHARED), additions=None)
    ingest.run(params, 0, tmp_path / "out", tmp_path / "quarantine.jsonl", tmp_path / "ingest.json")
    standard = {normalise(text) for text in Catalog.load(tmp_path / "out" / "catalog.jsonl").texts}
    train = [normalise(q.text) for q in load_questions(tmp_path / "out" / "train.jsonl")]
    validation = load_questions(tmp_path / "out" / "validation.jsonl")
    assert len(validation) >= 80 and not standard & {normalise(q.text) for q in validation}
    assert len(standard & set(train)) == 90  # each stays in train, beside the rest of its class


def test_generated_rows_equal_to_a_held_out_question_are_dropped_and_counted(tmp_path):
    from tqc.config import AugmentParams
    from tqc.schema import load_questions, save_questions
    from tqc.stages.augment import run

    save_questions(tmp_path / "train.jsonl", questions({"head": 10, "tail": 2}))
    # rebalancing by copies makes 8 copies of the two tail questions; say one of them is also a test question
    save_questions(tmp_path / "test.jsonl", [LabeledQuestion("TAIL question 0", "tail", "t:1")])
    save_questions(tmp_path / "validation.jsonl", [LabeledQuestion("head question 99", "head", "v:1")])
    report = run(tmp_path / "train.jsonl", AugmentParams(rebalance="max"), 0, tmp_path / "out.jsonl", tmp_path / "augment.json",
                 held_out_paths=[tmp_path / "validation.jsonl", tmp_path / "test.jsonl"])
    written = load_questions(tmp_path / "out.jsonl")
    made = [q for q in written if q.generated]
    assert made and all(q.text == "tail question 1" for q in made)
    dropped = report["rows"]["generated_dropped_as_held_out"]
    assert dropped > 0 and report["rows"]["copies_in_place_of_dropped"] == dropped  # of the question that is no test one
    assert report["per_class"]["tail"] == {"before": 2, "after": 10, "generated": 8}  # the target held


def test_made_rows_whose_text_another_class_has_are_dropped_counted_and_replaced_by_copies(tmp_path, monkeypatch):
    """EDA deleting "what is a card" down to "what a card", which class B asks: train would hold one text under two
    labels. Validate refuses that of offline rows; augment now refuses it of its own."""
    from tqc.config import AugmentParams
    from tqc.schema import load_questions, save_questions
    from tqc.stages import augment
    from tqc.text import normalise

    train = [LabeledQuestion("what is a card", "A", "t:0"), *(LabeledQuestion(f"what a card {i}" if i else "what a card",
                                                                               "B", f"t:{1 + i}") for i in range(9))]
    made = [LabeledQuestion("what a card", "A", "eda:t:0", generated=True),  # B's training question
            LabeledQuestion("what is card", "A", "eda:t:0", generated=True),
            LabeledQuestion("What  is card", "B", "eda:t:1", generated=True),  # made for A too, as validate compares
            LabeledQuestion("a card", "A", "eda:t:0", generated=True)]
    assert augment.label_conflicts(train, made) == {normalise("what a card"), normalise("what is card")}
    save_questions(tmp_path / "train.jsonl", train)
    # the stage, with EDA's draws replaced by known texts: the first of A's 8 rows is B's question
    monkeypatch.setattr(augment, "make_texts", lambda originals, *_: ["What a card"] + [f"what is a card {i}" for i in
                                                                                       range(1, len(originals))])
    report = augment.run(tmp_path / "train.jsonl", AugmentParams(rebalance="max", explicit="eda", implicit=[]), 0,
                         tmp_path / "out.jsonl", tmp_path / "augment.json")
    written = load_questions(tmp_path / "out.jsonl")
    labels: dict[str, set[str]] = {}
    for q in written:
        labels.setdefault(normalise(q.text), set()).add(q.class_id)
    assert all(len(ids) == 1 for ids in labels.values())  # no text under two labels
    assert report["rows"]["generated_dropped_as_label_conflict"] == 1 and report["rows"]["copies_in_place_of_dropped"] == 1
    assert report["per_class"]["A"] == {"before": 1, "after": 9, "generated": 8}  # the target held, by copies


def test_a_made_row_that_is_another_classs_standard_question_is_dropped_as_a_conflict(tmp_path, monkeypatch):
    """Validate quarantines a training row that is another class's standard question; augment runs after it and
    let EDA make one."""
    from tqc.config import AugmentParams
    from tqc.schema import Catalog, StandardQuestion, load_questions, save_questions
    from tqc.stages import augment

    catalog = Catalog([StandardQuestion("A", "What is a card?"), StandardQuestion("B", "How do I pay?")])
    catalog.save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "train.jsonl", [LabeledQuestion("what is a card number", "A", "t:0"),
                                              *(LabeledQuestion(f"how do I pay {i}", "B", f"t:{1 + i}") for i in range(4))])
    monkeypatch.setattr(augment, "make_texts", lambda originals, *_: ["what is a  card ?", "how do I pay?", "a card",
                                                                       "the card"][:len(originals)])
    params = AugmentParams(rebalance="max", explicit="eda", implicit=[])
    report = augment.run(tmp_path / "train.jsonl", params, 0, tmp_path / "out.jsonl", tmp_path / "augment.json",
                         catalog_path=tmp_path / "catalog.jsonl")
    made = [q.text for q in load_questions(tmp_path / "out.jsonl") if q.generated]
    assert "how do I pay?" not in made and "what is a  card ?" in made  # B's standard question, made for A: dropped
    assert report["rows"]["generated_dropped_as_label_conflict"] == 1


def test_a_standard_question_twin_classes_share_is_no_conflict_for_a_row_of_either(tmp_path):
    """Validate lets a training row of class A be the standard question A shares with its twin B (catalog_unique_texts
    demoted): it is either's. Augment counted the shared text as two classes', so it dropped A's copies of that row as
    label conflicts and refilled with copies of A's other rows; a row made for a third class with it is still dropped."""
    from tqc.config import AugmentParams
    from tqc.schema import Catalog, StandardQuestion, load_questions, save_questions
    from tqc.stages import augment
    from tqc.text import normalise

    twins = [StandardQuestion("A", "what is covid"), StandardQuestion("B", "What is COVID"), StandardQuestion("C", "where")]
    train = [LabeledQuestion("what is covid", "A", "t:0"), LabeledQuestion("covid meaning", "A", "t:1"),
             *(LabeledQuestion(f"where to test {i}", "C", f"t:{2 + i}") for i in range(6))]
    made = [LabeledQuestion("what is covid", "A", "oversample:t:0", generated=True),
            LabeledQuestion("What is covid", "C", "eda:t:2", generated=True)]
    assert augment.label_conflicts(train, made[:1], twins) == set()
    assert augment.label_conflicts(train, made, twins) == {normalise("what is covid")}  # A's and C's rows: both go
    Catalog(twins).save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "train.jsonl", train)
    report = augment.run(tmp_path / "train.jsonl", AugmentParams(rebalance="max", implicit=[]), 0, tmp_path / "out.jsonl",
                         tmp_path / "augment.json", catalog_path=tmp_path / "catalog.jsonl")
    copies = Counter(q.text for q in load_questions(tmp_path / "out.jsonl") if q.generated)
    assert copies == {"what is covid": 2, "covid meaning": 2}  # each of A's rows copied alike, as with no catalog
    assert report["rows"]["generated_dropped_as_label_conflict"] == 0


def test_a_max_factor_cap_is_not_cut_by_float_rounding():
    assert class_targets(Counter({"a": 100, "b": 1000}), "max", max_factor=1.15)["a"] == 115  # 1.15 × 100 = 114.999…


def test_params_augment_does_not_read_are_said_not_refused(tmp_path, caplog):
    """A leftover target_count after `-S augment.rebalance=mean`, or EDA with no target, was refused at load; each
    is harmless, and said where it is ignored."""
    import logging

    from tqc.config import AugmentParams
    from tqc.schema import save_questions
    from tqc.stages.augment import run

    save_questions(tmp_path / "train.jsonl", questions({"head": 10, "tail": 2}))
    with caplog.at_level(logging.WARNING, logger="tqc.stages.augment"):
        run(tmp_path / "train.jsonl", AugmentParams(rebalance="none", explicit="eda"), 0, tmp_path / "a.jsonl", tmp_path / "a.json")
        run(tmp_path / "train.jsonl", AugmentParams(rebalance="mean", target_count=60), 0, tmp_path / "b.jsonl", tmp_path / "b.json")
        report = run(tmp_path / "train.jsonl", AugmentParams(rebalance="none", max_factor=4), 0, tmp_path / "c.jsonl",
                     tmp_path / "c.json")
    assert "augment.explicit is 'eda', but augment.rebalance is 'none': no class gets a row more" in caplog.text
    assert "augment.target_count (60) is read only by rebalance: count, not 'mean'" in caplog.text
    assert "augment.max_factor (4) caps a rebalance target, and augment.rebalance is 'none': it caps nothing" in caplog.text
    assert report["deferred"] is False and report["rows"]["after"] == 12  # the report says what stage one trains


def test_the_augment_report_records_where_the_implicit_augmentations_act(tmp_path):
    """The report recorded implicit and rate but not implicit_at: a diff of two runs' reports hid the input / output
    placement the implicit_placement grid compares."""
    from tqc.config import AugmentParams
    from tqc.io import read_json
    from tqc.schema import save_questions
    from tqc.stages.augment import run

    save_questions(tmp_path / "train.jsonl", questions({"head": 10, "tail": 2}))
    for at in ("input", "output"):
        run(tmp_path / "train.jsonl", AugmentParams(implicit_at=at), 0, tmp_path / "out.jsonl", tmp_path / f"{at}.json")
        assert read_json(tmp_path / f"{at}.json")["implicit_at"] == at


def test_tqc_augment_by_hand_needs_the_held_out_files_that_dvc_yaml_passes(tmp_path, capsys):
    """Without --held-out a made row equal to a validation or test question joined train unseen: no later stage compares
    augmented rows with held-out ones. So the command refuses to run without them, and dvc.yaml's command gives both."""
    import shlex

    import yaml

    from tqc import cli

    save = ["--train", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "out.jsonl"), "--report", str(tmp_path / "a.json")]
    with pytest.raises(SystemExit) as exited:
        cli.parse_arguments(["augment", *save])
    assert exited.value.code == 2 and "--held-out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse_arguments(["augment", *save, "--held-out"])  # named, but with no file: the same leak
    stage = yaml.safe_load((Path(__file__).resolve().parents[2] / "dvc.yaml").read_text())["stages"]["augment"]
    args = cli.parse_arguments(shlex.split(stage["cmd"])[1:])
    assert args.held_out == [Path("data/validated/validation.jsonl"), Path("data/validated/test.jsonl")]


def test_a_class_no_row_of_which_could_be_drawn_keeps_its_reason_in_a_long_list(caplog):
    """The warning of classes without validation rows lists ten: a class named with its reason (every row repeats) but
    sorted after ten others lost that reason into "and N more", which the split's own warning used to say."""
    from tqc.stages.ingest import classes_missing_a_split

    train = [LabeledQuestion(f"question {c}?", c) for c in [f"A{i:02d}" for i in range(12)] + ["Z"]]
    with caplog.at_level("WARNING", logger="tqc.stages.ingest"):
        missing = classes_missing_a_split(train, [], undrawable={"Z": 4})
    assert missing["classes_without_validation_rows"][-1] == "Z"  # the report keeps its sorted order
    assert "'Z' (" in caplog.text and "and 3 more" in caplog.text


PINNED_AUGMENT = Path(__file__).parent / "pinned" / "augment"  # each case's outputs as the code wrote them


def _augment_inputs(tmp_path: Path) -> dict[str, dict]:
    """Cases that take every branch of `augment.run`: copies dropped as held-out questions and as label conflicts and
    refilled, a class left under its target, a cap, params it does not read, EDA against a catalog, offline rows
    (usable, made from a held-out question, equal to one, too few), and nothing to make."""
    from tqc.config import AugmentParams
    from tqc.schema import Catalog, StandardQuestion, save_questions

    train = [*questions({"head": 10, "tail": 3}), LabeledQuestion("what is a card", "tail", "f:card"),
             LabeledQuestion("gone question", "gone", "f:gone")]
    save_questions(tmp_path / "train.jsonl", train)
    save_questions(tmp_path / "validation.jsonl", [LabeledQuestion("TAIL question 1", "tail", "v:1")])
    save_questions(tmp_path / "test.jsonl", [LabeledQuestion("gone  question", "gone", "t:1"),
                                             LabeledQuestion("tail rewrite 2", "tail", "t:2")])
    Catalog([StandardQuestion("head", "what is a card"), StandardQuestion("tail", "tail?"),
             StandardQuestion("gone", "gone?")]).save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "generated.jsonl", [
        *(LabeledQuestion(f"tail rewrite {i}", "tail", f"g:{i}", True, ("f:0",)) for i in range(4)),
        LabeledQuestion("made from validation", "tail", "g:4", True, ("v:1",)),
        LabeledQuestion("head rewrite", "head", "g:5", True, ("f:1", "f:2"))])
    held_out = [tmp_path / "validation.jsonl", tmp_path / "test.jsonl"]
    everything = {"held_out_paths": held_out, "catalog_path": tmp_path / "catalog.jsonl"}
    return {
        "copies": {"params": AugmentParams(rebalance="max", target_count=5, max_factor=3.5), **everything},
        "eda": {"params": AugmentParams(rebalance="sqrt", explicit="eda", eda_alpha=0.3, implicit=["dropout"]),
                **everything},
        "file": {"params": AugmentParams(rebalance="max", explicit="file", deferred=True),
                 "generated_path": tmp_path / "generated.jsonl", **everything},
        "nothing": {"params": AugmentParams(rebalance="none", explicit="eda", max_factor=2), "held_out_paths": held_out},
    }


def _run_augment_case(tmp_path: Path, case: str, caplog) -> dict[str, str]:
    """The case's outputs as text: the training rows, the report (its seconds put to 0), the log lines, and whether
    the report returned is the one written, key for key."""
    import json
    import logging
    import re

    from tqc.stages import augment

    inputs = _augment_inputs(tmp_path)[case]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="tqc"):
        report = augment.run(tmp_path / "train.jsonl", inputs.pop("params"), 7, tmp_path / case / "train.jsonl",
                             tmp_path / case / "augment.json", **inputs)
    written = (tmp_path / case / "augment.json").read_text(encoding="utf-8")
    assert written == json.dumps(report, indent=2, ensure_ascii=False) + "\n"  # returned as written, in its order
    return {"train.jsonl": (tmp_path / case / "train.jsonl").read_text(encoding="utf-8"),
            "augment.json": re.sub(r'\n  "seconds": [0-9.e-]+\n', '\n  "seconds": 0\n', written),
            "log.txt": re.sub(r"\(\d+\.\ds\)$", "(0.0s)", "".join(f"{r.name} {r.levelname} {r.getMessage()}\n"
                                                                   for r in caplog.records), flags=re.M).replace(
                str(tmp_path), "TMP")}


@pytest.mark.parametrize("case", ["copies", "eda", "file", "nothing"])
def test_the_augment_stage_is_pinned_file_for_file(tmp_path, case, caplog):
    """Every output of the stage, whole (rows, report in its key order, log lines), for cases that take every branch:
    a refactoring that changes a byte of them fails."""
    outputs = _run_augment_case(tmp_path, case, caplog)
    assert sorted(p.name for p in (tmp_path / case).iterdir()) == ["augment.json", "train.jsonl"]
    for name, text in outputs.items():
        assert text == (PINNED_AUGMENT / case / name).read_text(encoding="utf-8"), f"{case}/{name}"


def test_the_augment_stage_s_refusals_are_pinned_and_write_nothing(tmp_path):
    from tqc.config import AugmentParams
    from tqc.stages import augment

    _augment_inputs(tmp_path)
    out, report = tmp_path / "out" / "train.jsonl", tmp_path / "out" / "augment.json"
    with pytest.raises(FileNotFoundError) as missing:
        augment.run(tmp_path / "train.jsonl", AugmentParams(explicit="file"), 0, out, report)
    assert str(missing.value) == (
        "augment.explicit is 'file' but no file of offline rows was given (tqc augment --generated): ingest writes it "
        "when data.generated.path is set, and validate passes it on (run both again)")
    with pytest.raises(FileNotFoundError) as no_catalog:
        augment.run(tmp_path / "train.jsonl", AugmentParams(), 0, out, report, catalog_path=tmp_path / "nowhere.jsonl")
    assert "nowhere.jsonl" in str(no_catalog.value)
    assert not (tmp_path / "out").exists()


def test_an_added_question_and_its_copy_written_otherwise_go_to_one_split():
    """The retrain flow's added questions are split by a hash of their text: of the raw text, a copy in other case or
    spacing drew its own split, and "where is paris ?" could be trained on while "Where is Paris?" judged the model.
    Hashed as validate compares texts, each pair goes to one split, and a text already in that form keeps its split."""
    from tqc.stages.ingest import stable_split

    originals = [LabeledQuestion(f"Where is place number {i}?", "LOC") for i in range(200)]
    copies = [LabeledQuestion(f"  where IS place number {i} ?", "LOC") for i in range(200)]
    for seed in range(3):
        held_out = {q.text for q in stable_split(originals, 0.3, seed)[1]}
        held_out_copies = {q.text for q in stable_split(copies, 0.3, seed)[1]}
        assert 30 < len(held_out) < 90
        assert {text.strip().lower().replace(" ?", "?") for text in held_out_copies} == {t.lower() for t in held_out}
    normalised = LabeledQuestion("where can i get tested number 11 today", "c")  # test_generated_rows' held-out one
    assert stable_split([normalised], 0.1, 5)[1] == [normalised]


def test_ingest_names_the_first_quarantined_rows_and_counts_the_rest_not_a_warning_a_row(tmp_path, caplog):
    """Each quarantined row was a warning of its own: a file with hundreds of bad rows (under
    data.max_rejected_fraction, or a generated file's unattributable rows) buried the stage's log in them."""
    from tqc.config import DataParams
    from tqc.stages import ingest

    good = "".join(f"question number {i},{'ab'[i % 2]}\n" for i in range(1000))
    bad = "".join(f"a question with no label {i},\n" for i in range(30))  # "empty label": quarantined
    (tmp_path / "train.csv").write_text("text,label\n" + good + bad)
    (tmp_path / "test.csv").write_text("text,label\nheld out,a\n")
    params = DataParams(dataset="custom", data_dir=str(tmp_path), additions=None,
                        custom={"train": "train.csv", "test": "test.csv"})
    with caplog.at_level("WARNING", logger="tqc.stages.ingest"):
        report = ingest.run(params, 0, tmp_path / "out", tmp_path / "q.jsonl", tmp_path / "r.json")
    assert report["quarantined"] == 30 and len((tmp_path / "q.jsonl").read_text().splitlines()) == 30
    named = [r.getMessage() for r in caplog.records if r.getMessage().startswith("quarantined ")]
    assert len(named) == ingest.QUARANTINED_SAID and "train.csv, line 1002: empty label" in named[0]
    assert f"and {30 - ingest.QUARANTINED_SAID} more quarantined row(s)" in caplog.text and str(tmp_path / "q.jsonl") in caplog.text
