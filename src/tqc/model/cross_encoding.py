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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tqc.eda import joined, words_of


@dataclass(frozen=True)
class JoinedInputs:
    texts: list[str]  # (J,) "question [SEP] standard question"
    relevant: list[bool]  # (J,) the gold target: is relevant / is not relevant
    rows: list[int]  # (J,) the batch row each joined input came from


def joined_inputs(questions: list[str], gold: list[int], batch_classes: list[int], catalog_texts: list[str], separator: str,
                  share: float, negatives: int, rng: random.Random,
                  fit: Callable[[str, str], str] | None = None, groups: Sequence[int] | None = None) -> JoinedInputs:
    """For round(share·B) rows (at least one): one join with the gold standard question and
    up to `negatives` joins with other classes among `batch_classes`. `fit(question, " [SEP] standard question")`
    shortens a question that would push its standard question past the encoder's length (`question_that_fits`).
    `groups` (P,): classes that share a standard question (`twins.standard_text_groups`); a class of the gold's
    group is never joined as "is not relevant", since its join is the very text whose target is "is relevant"."""
    group = (lambda c: c) if groups is None else (lambda c: groups[c])  # noqa: E731
    chosen = sorted(rng.sample(range(len(questions)), max(1, round(share * len(questions)))))
    texts, relevant, rows = [], [], []
    for row in chosen:
        others = [c for c in batch_classes if group(c) != group(gold[row])]
        pairs = [(gold[row], True)] + [(c, False) for c in rng.sample(others, min(negatives, len(others)))]
        for class_index, is_relevant in pairs:
            tail = f" {separator} {catalog_texts[class_index]}"
            texts.append((fit(questions[row], tail) if fit else questions[row]) + tail)
            relevant.append(is_relevant)
            rows.append(row)
    return JoinedInputs(texts, relevant, rows)


def question_that_fits(count_tokens: Callable[[str], int], max_length: int) -> Callable[[str, str], str]:
    """(question, tail) → the question, cut word by word from its end (a character at a time in Chinese and Japanese,
    as EDA's `words_of` splits them) until question + tail fits in `max_length` tokens (`count_tokens` counts them as the encoder does, special tokens included). The encoder truncates from the
    right, so a long question would otherwise lose the standard question its "is relevant" target is about; CEAA
    shortens the question and keeps what it is joined with."""
    def shortened(question: str, tail: str) -> str:
        if count_tokens(question + tail) <= max_length:
            return question
        words = words_of(question)
        while len(words) > 1 and count_tokens(joined(words) + tail) > max_length:
            words.pop()
        return joined(words)

    return shortened
