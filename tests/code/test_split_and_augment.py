from collections import Counter

from tqc.schema import LabeledQuestion
from tqc.stages.augment import oversample, rebalance_target
from tqc.stages.ingest import stratified_split


def questions(counts: dict[str, int]) -> list[LabeledQuestion]:
    return [LabeledQuestion(f"{label} question {i}", label, f"f:{i}") for label, n in counts.items() for i in range(n)]


def test_stratified_split_is_seeded_and_covers_every_class():
    rows = questions({"a": 50, "b": 10, "c": 3, "d": 2})
    train, validation = stratified_split(rows, 0.1, seed=0)
    assert stratified_split(rows, 0.1, seed=0) == (train, validation)
    assert Counter(q.class_id for q in validation) == {"a": 5, "b": 1, "c": 1}
    assert sorted(train + validation, key=lambda q: q.source + q.class_id) == sorted(rows, key=lambda q: q.source + q.class_id)


def test_oversampling_lifts_every_class_to_the_mean_and_marks_copies():
    rows = questions({"head": 30, "mid": 9, "tail": 3})
    target = rebalance_target(Counter(q.class_id for q in rows))
    assert target == 14
    augmented = oversample(rows, target, seed=0)
    counts = Counter(q.class_id for q in augmented)
    assert counts == {"head": 30, "mid": 14, "tail": 14}
    copies = [q for q in augmented if q.generated]
    assert len(copies) == 16 and all(q.source.startswith("oversample:") for q in copies)
    tail_texts = Counter(q.text for q in augmented if q.class_id == "tail")
    assert max(tail_texts.values()) - min(tail_texts.values()) <= 1  # originals repeated evenly
