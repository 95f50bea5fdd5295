"""The exemplar rule: classes scored by their nearest labeled questions through the question encoder."""

import numpy as np
import pytest
import torch

from tqc.config import ModelParams
from tqc.exemplars import exemplar_scorer, exemplar_scores
from tqc.model.encoder import BiEncoder
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion


def unit(*angles_in_degrees: float) -> torch.Tensor:
    """Unit vectors (n, 2) at the given angles."""
    radians = torch.tensor(angles_in_degrees, dtype=torch.float64) * np.pi / 180
    return torch.stack([radians.cos(), radians.sin()], dim=1)


def test_each_class_scores_the_mean_cosine_of_its_k_nearest_exemplars():
    question = unit(0.0)  # (1, 2)
    exemplars = torch.cat([unit(0.0, 60.0, 90.0), unit(30.0)]) * torch.tensor([[2.0], [1.0], [3.0], [0.5]])  # lengths differ: cosine
    classes = np.array([0, 0, 0, 1])
    scores = exemplar_scores(question, exemplars, classes, n_classes=3, k=2)  # (1, 3)
    assert scores.shape == (1, 3)
    assert scores[0, 0] == pytest.approx((1.0 + 0.5) / 2)  # the two nearest of class 0: 0° and 60°, not 90°
    assert scores[0, 1] == pytest.approx(np.cos(np.pi / 6))  # one exemplar only: k larger than the class
    assert scores[0, 2] == -np.inf  # no exemplar: never predicted


def test_k_one_is_the_nearest_neighbour_and_a_larger_k_can_overrule_it():
    question = unit(0.0)
    exemplars = unit(5.0, 80.0, 85.0, 20.0, 25.0)  # class 0: one close and two far; class 1: two fairly close
    classes = np.array([0, 0, 0, 1, 1])
    assert exemplar_scores(question, exemplars, classes, 2, k=1).argmax() == 0
    assert exemplar_scores(question, exemplars, classes, 2, k=3).argmax() == 1


def test_classes_scattered_through_the_exemplars_score_as_their_own_columns_alone_to_the_last_digit():
    """The rule groups exemplar columns by class once (a slice per class, not a mask per class); each class's columns
    keep their order, so its score is the mean of the same k values in the same order as a mask would give."""
    generator = torch.Generator().manual_seed(0)
    questions, exemplars = torch.randn(7, 5, generator=generator), torch.randn(40, 5, generator=generator)
    classes = np.random.default_rng(0).choice([4, 0, 2, 5], size=40)  # out of order; 1 and 3 have none
    from tqc.model.similarity import CosineScorer

    similarity = CosineScorer()(questions, exemplars)  # (7, 40), as the rule computes it
    for k in (1, 3, 50):
        scores = exemplar_scores(questions, exemplars, classes, n_classes=6, k=k)  # (7, 6)
        for c in range(6):
            own = similarity.numpy()[:, classes == c]  # (7, M_c) in the exemplars' order (a mask: the former rule)
            if own.shape[1] == 0:
                assert np.all(scores[:, c] == -np.inf)
                continue
            nearest = min(k, own.shape[1])
            expected = np.partition(own, own.shape[1] - nearest, axis=1)[:, -nearest:].mean(axis=1)
            assert np.array_equal(scores[:, c], expected), (k, c)


def test_the_scorer_ranks_a_question_first_for_the_class_of_its_own_text(tiny_model_dir):
    torch.manual_seed(0)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
    catalog = Catalog([StandardQuestion("a", "first"), StandardQuestion("b", "second"), StandardQuestion("c", "third")])
    exemplars = [LabeledQuestion("where is paris", "a"), LabeledQuestion("who invented chess", "b"),
                 LabeledQuestion("how many people like tea", "b")]
    score = exemplar_scorer(model.question, exemplars, k=1, batch_size=2)
    asked = [LabeledQuestion("who invented chess", "b"), LabeledQuestion("where is paris", "a"),
             LabeledQuestion("how many people like tea", "b")]
    scores = score(asked, catalog)  # (3, 3), scored in chunks of 2 questions
    assert scores.shape == (3, 3)
    assert list(scores.argmax(axis=1)) == [1, 0, 1]  # cosine 1 with its own text, whatever the random weights
    assert scores[0, 1] == pytest.approx(1.0, abs=1e-5)
    assert np.all(scores[:, 2] == -np.inf)  # class c has no labeled question


def test_last_encodings_let_the_exemplar_rule_reuse_the_standard_rules_encodings_of_a_split(tiny_model_dir, monkeypatch):
    """LastEncodings answers the same texts from its last call: the exemplar rule reuses ADMC's encodings of a
    split, and the scores are those of encoding afresh."""
    from tqc.model.encoder import LastEncodings, catalog_scores

    torch.manual_seed(0)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir), tied=False))  # the catalog: another encoder
    catalog = Catalog([StandardQuestion("a", "where is it"), StandardQuestion("b", "who did it")])
    exemplars = [LabeledQuestion("where is paris", "a"), LabeledQuestion("who invented chess", "b")]
    split = [LabeledQuestion("where is rome", "a"), LabeledQuestion("who wrote hamlet", "b")]
    calls = []
    encode = model.question.encode
    monkeypatch.setattr(model.question, "encode", lambda texts, *args: calls.append(list(texts)) or encode(texts, *args))
    shared = LastEncodings(model.question)
    exemplar_rule = exemplar_scorer(shared, exemplars, k=1, batch_size=8)  # encodes the exemplars
    standard = catalog_scores(model, split, catalog, 8, shared)  # encodes the split ...
    nearest = exemplar_rule(split, catalog)  # ... which this reuses
    assert calls == [[q.text for q in exemplars], [q.text for q in split]]
    monkeypatch.undo()
    assert np.allclose(standard, catalog_scores(model, split, catalog, 8))
    assert np.allclose(nearest, exemplar_scorer(model.question, exemplars, k=1, batch_size=8)(split, catalog))


def test_an_empty_exemplar_file_is_an_error(tmp_path):
    from tqc.exemplars import load_exemplars

    path = tmp_path / "ex.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no labeled questions"):
        load_exemplars(path)
