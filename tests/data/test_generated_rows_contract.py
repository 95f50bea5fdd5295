"""Data contract: generated rows exist only in train, and the long tail shapes train alone."""

from __future__ import annotations

from collections import Counter

import yaml

from tests.conftest import tiny_params, write_custom_dataset
from tqc.config import Params
from tqc.pipeline import prepare_data
from tqc.schema import load_questions


def test_generated_rows_only_ever_join_train(tmp_path, tiny_model_dir):
    write_custom_dataset(tmp_path / "raw", per_class=16)
    raw = tiny_params(tmp_path / "raw", tiny_model_dir)
    raw["data"]["imbalance_ratio"] = 4.0
    raw["validate"]["min_examples_per_class"] = 1
    raw["augment"].update(rebalance="max", explicit="eda")
    raw["tracking"]["enabled"] = False
    params = Params.model_validate(yaml.safe_load(yaml.safe_dump(raw)))
    prepared = prepare_data(params, tmp_path / "work")

    train = load_questions(prepared.train)
    validation = load_questions(prepared.directory / "validation.jsonl")
    test = load_questions(prepared.directory / "test.jsonl")
    assert any(q.generated for q in train)
    assert not any(q.generated for q in validation + test)
    generated_texts = {q.text for q in train if q.generated} - {q.text for q in train if not q.generated}
    assert not generated_texts & {q.text for q in validation + test}  # no EDA row leaks a held-out question
    # max rebalancing: every class ends with as many training rows as the largest
    assert len(set(Counter(q.class_id for q in train).values())) == 1
    assert len(set(Counter(q.class_id for q in load_questions(prepared.directory / "train.jsonl")).values())) > 1
