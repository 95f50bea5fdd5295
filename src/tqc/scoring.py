"""Each trained model as a scorer: questions → scores (N, P) against the whole catalog.

Shared by the prior stage (which fits a class-prior shift per model on validation) and
evaluate (which applies it), so both score a model the same way. Also the exemplar rule:
classes scored by their nearest labeled questions instead of their standard question.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch

from tqc.config import Params
from tqc.model.encoder import BiEncoder
from tqc.schema import Catalog, LabeledQuestion
from tqc.stages.baseline_nc import LinearClassifier, is_disabled
from tqc.training import catalog_scores

Scorer = Callable[[list[LabeledQuestion], Catalog], np.ndarray]  # (questions, catalog) → scores (N, P)


def trained_folders(stage_one: Path, stage_two: Path, nc: Path | None) -> dict[str, Path]:
    """The run's trained models by the names metrics.json uses: ADMC (stage two), AC (stage one), and NC
    when it was trained (None, or its disabled marker: not)."""
    folders = {"admc": stage_two, "stage_one": stage_one}
    return {**folders, "nc": nc} if nc is not None and not is_disabled(nc) else folders


def trained_scorers(stage_one: Path, stage_two: Path, nc: Path | None, batch_size: int) -> dict[str, Scorer]:
    """Scorers of the run's trained models (`trained_folders`)."""
    folders = trained_folders(stage_one, stage_two, nc)
    scorers: dict[str, Scorer] = {}
    for name in ("admc", "stage_one"):
        model = BiEncoder.load(folders[name])
        scorers[name] = lambda qs, c, m=model: catalog_scores(m, qs, c, batch_size)
    if "nc" in folders:
        classifier = LinearClassifier.load(folders["nc"])
        scorers["nc"] = lambda qs, c: classifier.logits([q.text for q in qs], batch_size)
    return scorers


def logit_temperatures(params: Params) -> dict[str, float]:
    """τ with which each model's scores became logits in training (scores / τ); NC's are logits already."""
    return {"admc": params.stage_two.temperature, "stage_one": params.stage_one.temperature, "nc": 1.0}


def exemplar_scores(questions: torch.Tensor, exemplars: torch.Tensor, exemplar_classes: np.ndarray, n_classes: int,
                    k: int) -> np.ndarray:
    """questions (N, D), labeled exemplars (M, D) of classes (M,) → scores (N, P): for each class, the mean
    cosine similarity of its k most similar exemplars (all of them where it has fewer). A class without
    exemplars scores −inf: it is never predicted, and ranks last."""
    similarity = (torch.nn.functional.normalize(questions.float(), dim=-1)
                  @ torch.nn.functional.normalize(exemplars.float(), dim=-1).T).numpy()  # (N, M)
    scores = np.full((len(questions), n_classes), -np.inf)
    for c in np.unique(exemplar_classes):
        own = similarity[:, exemplar_classes == c]  # (N, M_c)
        nearest = min(k, own.shape[1])
        scores[:, c] = np.partition(own, own.shape[1] - nearest, axis=1)[:, -nearest:].mean(axis=1)
    return scores


def exemplar_scorer(model: BiEncoder, exemplars: list[LabeledQuestion], k: int, batch_size: int) -> Scorer:
    """A scorer from a trained model's question encoder and labeled questions (the training rows): each
    class by its k nearest exemplars (`exemplar_scores`). Both sides pass the question encoder, so the rule
    compares questions with questions; exemplars are encoded once."""
    encoded = model.question.encode([q.text for q in exemplars], batch_size, "encoding exemplars")  # (M, D)

    def score(questions: list[LabeledQuestion], catalog: Catalog) -> np.ndarray:
        classes = np.array([catalog.index(q.class_id) for q in exemplars], dtype=np.int64)  # (M,)
        asked = model.question.encode([q.text for q in questions], batch_size, "encoding questions")  # (N, D)
        # In chunks of questions: the similarities are (chunk, M), never (N, M) for a large training set
        chunks = [exemplar_scores(asked[start:start + batch_size], encoded, classes, len(catalog), k)
                  for start in range(0, len(asked), batch_size)]
        return np.concatenate(chunks) if chunks else np.empty((0, len(catalog)))

    return score
