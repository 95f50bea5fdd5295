"""The exemplar rule: each class scored by its nearest labeled questions instead of its standard question.

Evaluate reports it beside ADMC (`exemplars`, `evaluate.exemplar_k`) from ADMC's trained question
encoder. With few labeled questions a class (COVID-Q's 20) they carry more of a class than one
standard question does, and a newly labeled question joins the rule without retraining.
"""

from __future__ import annotations

import numpy as np
import torch

from tqc.model.encoder import TextEncoder
from tqc.model.similarity import CosineScorer
from tqc.schema import Catalog, LabeledQuestion
from tqc.scoring import Scorer


def exemplar_scores(questions: torch.Tensor, exemplars: torch.Tensor, exemplar_classes: np.ndarray, n_classes: int,
                    k: int) -> np.ndarray:
    """questions (N, D), labeled exemplars (M, D) of classes (M,) → scores (N, P): for each class, the mean
    cosine similarity of its k most similar exemplars (all of them where it has fewer). A class without
    exemplars scores −inf: it is never predicted, and ranks last."""
    similarity = CosineScorer()(questions.float(), exemplars.float()).numpy()  # (N, M)
    scores = np.full((len(questions), n_classes), -np.inf)
    for c in np.unique(exemplar_classes):
        own = similarity[:, exemplar_classes == c]  # (N, M_c)
        nearest = min(k, own.shape[1])
        scores[:, c] = np.partition(own, own.shape[1] - nearest, axis=1)[:, -nearest:].mean(axis=1)
    return scores


def exemplar_scorer(encoder: TextEncoder, exemplars: list[LabeledQuestion], k: int, batch_size: int) -> Scorer:
    """A scorer from a trained question encoder and labeled questions (the training rows): each class by
    its k nearest exemplars (`exemplar_scores`). Both sides pass the question encoder, so the rule compares
    questions with questions; exemplars are encoded once."""
    encoded = encoder.encode([q.text for q in exemplars], batch_size, "encoding exemplars")  # (M, D)

    def score(questions: list[LabeledQuestion], catalog: Catalog) -> np.ndarray:
        classes = np.array([catalog.index(q.class_id) for q in exemplars], dtype=np.int64)  # (M,)
        asked = encoder.encode([q.text for q in questions], batch_size, "encoding questions")  # (N, D)
        # In chunks of questions: the similarities are (chunk, M), never (N, M) for a large training set
        return np.concatenate([exemplar_scores(chunk, encoded, classes, len(catalog), k) for chunk in asked.split(batch_size)])

    return score
