"""The exemplar rule: each class scored by its nearest labeled questions instead of its standard question.

Evaluate reports it beside ADMC (`exemplars`, `evaluate.exemplar_k`) from ADMC's trained question
encoder, and the registry and `tqc predict` can serve it (`promote.rule: exemplars`, `--exemplars`).
With few labeled questions a class (COVID-Q's 20) they carry more of a class than one standard
question does, and a newly labeled question joins the rule without retraining.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tqc.model.encoder import LastEncodings, TextEncoder
from tqc.model.similarity import CosineScorer
from tqc.schema import Catalog, LabeledQuestion
from tqc.scoring import Scorer
from tqc.text import has_words


def exemplar_scores(questions: torch.Tensor, exemplars: torch.Tensor, exemplar_classes: np.ndarray, n_classes: int,
                    k: int) -> np.ndarray:
    """questions (N, D), labeled exemplars (M, D) of classes (M,) → scores (N, P): for each class, the mean
    cosine similarity of its k most similar exemplars (all of them where it has fewer). A class without
    exemplars scores −inf: it is never predicted, and ranks last."""
    similarity = CosineScorer()(questions.float(), exemplars.float()).numpy()  # (N, M)
    scores = np.full((len(questions), n_classes), -np.inf)
    # Each class's columns found once by a stable sort, not by a mask per class (O(P·M) a chunk: 2.2× slower at
    # 10,000 classes). Taken in their order, they give the former mask's array, so the same figures to the last digit.
    order = np.argsort(exemplar_classes, kind="stable")  # (M,)
    classes, starts, counts = np.unique(exemplar_classes[order], return_index=True, return_counts=True)
    for c, start, count in zip(classes, starts, counts):
        own = similarity[:, order[start:start + count]]  # (N, M_c)
        nearest = min(k, count)
        scores[:, c] = np.partition(own, count - nearest, axis=1)[:, -nearest:].mean(axis=1)
    return scores


def load_exemplars(path: Path) -> list[LabeledQuestion]:
    """Labeled questions from a JSONL file of {"text", "class_id"} records (a pipeline's train.jsonl is one);
    blank lines are skipped, and a line that is not such a record is an error naming the file and the line."""
    import json

    from tqc.io import numbered_jsonl

    records = numbered_jsonl(path)  # a line that is not JSON, or not UTF-8, is an error naming it
    for line_number, record in records:
        # has_words: a text of zero-width or control characters alone is none (the served model refuses such a question)
        if not isinstance(record, dict) or not all(isinstance(record.get(key), str) and has_words(record[key])
                                                   for key in ("text", "class_id")):
            raise ValueError(f"{path}, line {line_number}: an exemplar needs non-empty string fields text and class_id, "
                             f"got {json.dumps(record, ensure_ascii=False)[:200]}")
    if not records:
        raise ValueError(f"{path}: no labeled questions, so the exemplar rule has nothing to score classes by")
    return [LabeledQuestion(record["text"], record["class_id"], source=f"{path}:{line_number}")
            for line_number, record in records]


def catalog_indices(exemplars: list[LabeledQuestion], catalog: Catalog, source: str) -> np.ndarray:
    """Each exemplar's class as a catalog index (M,); a class the catalog lacks is an error naming where the
    exemplar was read (its `source`, file:line) or else `source` and its row."""
    for row, question in enumerate(exemplars, start=1):
        if question.class_id not in catalog:
            where = question.source or f"{source}: row {row}"
            raise ValueError(f"{where}: class {question.class_id!r} is not in the catalog, so the exemplar rule cannot "
                             "answer with it")
    return np.array([catalog.index(q.class_id) for q in exemplars], dtype=np.int64)


@dataclass(frozen=True)
class ExemplarBank:
    """Encoded exemplars (M, D), their catalog indices (M,), and k: what the rule needs to score questions."""

    vectors: torch.Tensor
    classes: np.ndarray
    n_classes: int
    k: int

    @property
    def answerable(self) -> int:
        """How many classes have an exemplar: the rule ranks only those."""
        return len(np.unique(self.classes))

    def scores(self, questions: torch.Tensor, batch_size: int = 256) -> np.ndarray:
        """Encoded questions (N, D) → scores (N, P), in chunks: the similarities are (chunk, M), never (N, M)."""
        if len(questions) == 0:
            return np.empty((0, self.n_classes))
        return np.concatenate([exemplar_scores(chunk, self.vectors, self.classes, self.n_classes, self.k)
                               for chunk in questions.split(batch_size)])


def exemplar_scorer(encoder: TextEncoder | LastEncodings, exemplars: list[LabeledQuestion], k: int, batch_size: int) -> Scorer:
    """A scorer from a trained question encoder and labeled questions (the training rows): each class by
    its k nearest exemplars (`exemplar_scores`). Both sides pass the question encoder, so the rule compares
    questions with questions; exemplars are encoded once."""
    encoded = encoder.encode([q.text for q in exemplars], batch_size, "encoding exemplars")  # (M, D)

    def score(questions: list[LabeledQuestion], catalog: Catalog) -> np.ndarray:
        bank = ExemplarBank(encoded, catalog_indices(exemplars, catalog, "training rows"), len(catalog), k)
        return bank.scores(encoder.encode([q.text for q in questions], batch_size, "encoding questions"), batch_size)

    return score
