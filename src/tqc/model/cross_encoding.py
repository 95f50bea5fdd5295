"""CEAA: cross-encoding as augmentation for the bi-encoder (METHOD.md, CEAA §3.3).

A share of a batch's questions also enter the question encoder joined with a standard
question, "question [SEP] standard question". A question joined with its own standard
question has the fixed text "is relevant" as its gold target; joined with another class's
standard question from the batch, "is not relevant" (CEAA samples negative tags the same way).
Both target texts are scored beside the batch's standard questions, so the encoder learns a
cross-encoder's question–answer interaction at no cost at inference, where nothing is joined.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class JoinedInputs:
    texts: list[str]  # (J,) "question [SEP] standard question"
    relevant: list[bool]  # (J,) the gold target: is relevant / is not relevant
    rows: list[int]  # (J,) the batch row each joined input came from


def joined_inputs(questions: list[str], gold: list[int], batch_classes: list[int], catalog_texts: list[str], separator: str,
                  share: float, negatives: int, rng: random.Random) -> JoinedInputs:
    """For round(share·B) rows (at least one): one join with the gold standard question and
    up to `negatives` joins with other classes among `batch_classes`."""
    chosen = sorted(rng.sample(range(len(questions)), max(1, round(share * len(questions)))))
    texts, relevant, rows = [], [], []
    for row in chosen:
        others = [c for c in batch_classes if c != gold[row]]
        pairs = [(gold[row], True)] + [(c, False) for c in rng.sample(others, min(negatives, len(others)))]
        for class_index, is_relevant in pairs:
            texts.append(f"{questions[row]} {separator} {catalog_texts[class_index]}")
            relevant.append(is_relevant)
            rows.append(row)
    return JoinedInputs(texts, relevant, rows)
