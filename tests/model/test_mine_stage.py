"""The mine stage on a tiny model: the file it writes holds, for each training row in order, the K wrong classes
nearest that row's own question, nearest first (mining.py's unit tests check `mine()` alone)."""

from __future__ import annotations

import json

import torch

from tests.conftest import CLASSES, synthetic_questions
from tqc.config import MineParams, ModelParams
from tqc.model.encoder import BiEncoder
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, save_questions
from tqc.stages import mine


def test_each_rows_negatives_are_the_wrong_classes_nearest_its_own_question_nearest_first(tiny_model_dir, tmp_path):
    """A stage that gave each row another text's vector (repeated texts are encoded once), listed the negatives in
    another order, or encoded the catalog with the question encoder wrote a file every check of `load_negatives`
    passes: each row K distinct wrong classes."""
    catalog = Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()]
                      + [StandardQuestion("COL", "What colour is it?"), StandardQuestion("WHEN", "When did it happen?")])
    rows = [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 6)]
    rows = rows + rows[:5]  # oversampled copies repeat texts
    catalog.save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "train.jsonl", rows)
    torch.manual_seed(0)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir), tied=False))
    with torch.no_grad():  # two encoders that differ, as after training: mining reads each with its own
        for weight in model.standard.parameters():
            weight.add_(0.05 * torch.randn_like(weight))
    model.save(tmp_path / "model")
    k = 2
    mine.run(tmp_path, tmp_path / "train.jsonl", tmp_path / "model", MineParams(k=k), tmp_path / "negatives.jsonl",
             tmp_path / "mining.json")

    loaded = BiEncoder.load(tmp_path / "model")
    standards = torch.nn.functional.normalize(loaded.standard.encode(catalog.texts), dim=-1)  # (P, D)
    expected = []
    for row in rows:  # each row's own text, encoded alone
        similarity = standards @ torch.nn.functional.normalize(loaded.question.encode([row.text]), dim=-1)[0]  # (P,)
        order = [catalog.class_ids[c] for c in torch.argsort(similarity, descending=True).tolist()]
        expected.append([class_id for class_id in order if class_id != row.class_id][:k])
    written = [json.loads(line) for line in (tmp_path / "negatives.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(r["row"], r["class_id"]) for r in written] == [(i, row.class_id) for i, row in enumerate(rows)]
    assert [r["negatives"] for r in written] == expected
    question_only = torch.nn.functional.normalize(loaded.question.encode(catalog.texts), dim=-1)
    assert not torch.allclose(question_only, standards, atol=1e-3)  # the check can tell the two encoders apart
