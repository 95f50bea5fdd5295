"""Augment / rebalance: oversample tail classes up to the mean count per class (ADMC §3.2.1).

The implicit augmentations (dropout and feature cutoff on token embeddings) act inside the
encoder during training; this stage records them and writes the explicit training set.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

from tqc.config import AugmentParams
from tqc.io import write_json
from tqc.schema import LabeledQuestion, load_questions, save_questions

log = logging.getLogger(__name__)


def rebalance_target(counts: Counter) -> int:
    """The count every class is raised to: the mean count per class, rounded up."""
    return math.ceil(sum(counts.values()) / len(counts)) if counts else 0


def oversample(questions: list[LabeledQuestion], target: int, seed: int, explicit: str = "none",
               alpha: float = 0.1) -> list[LabeledQuestion]:
    """Add seeded rows to each class until it has at least `target` rows.

    Each new row starts from an original, cycling through a shuffled order so every original
    is used about equally often; with `explicit: eda` its text is then perturbed (swap,
    delete, or insert a word of the same class). New rows are marked `generated`.
    """
    from tqc.eda import augment_text, class_vocabularies

    vocabularies = class_vocabularies(questions) if explicit == "eda" else {}
    by_class: dict[str, list[LabeledQuestion]] = defaultdict(list)
    for question in questions:
        by_class[question.class_id].append(question)
    rng = random.Random(seed)
    extra = []
    for class_id in sorted(by_class):
        members = by_class[class_id]
        order = list(members)
        rng.shuffle(order)
        for i in range(max(0, target - len(members))):
            original = order[i % len(order)]
            if explicit == "eda":
                text = augment_text(original.text, vocabularies[class_id], rng, alpha)
                extra.append(replace(original, text=text, generated=True, source=f"eda:{original.source}"))
            else:
                extra.append(replace(original, generated=True, source=f"oversample:{original.source}"))
    return questions + extra


def run(train_path: Path, params: AugmentParams, seed: int, out_path: Path, report_path: Path) -> dict:
    started = time.perf_counter()
    questions = load_questions(train_path)
    before = Counter(q.class_id for q in questions)
    target = rebalance_target(before) if params.rebalance == "mean" else 0
    augmented = oversample(questions, target, seed, params.explicit, params.eda_alpha) if target else questions
    after = Counter(q.class_id for q in augmented)

    save_questions(out_path, augmented)
    report = {
        "rebalance": params.rebalance,
        "explicit": params.explicit,
        "target_per_class": target,
        "implicit": list(params.implicit),
        "rate": params.rate,
        "rows": {"before": len(questions), "after": len(augmented), "generated": len(augmented) - len(questions)},
        "per_class": {c: {"before": before[c], "after": after[c], "generated": after[c] - before[c]} for c in sorted(after)},
        "seconds": round(time.perf_counter() - started, 2),
    }
    write_json(report_path, report)
    log.info(
        "augment: %d → %d training rows (%d generated, target %d per class); implicit %s at %.2f; wrote %s",
        len(questions), len(augmented), len(augmented) - len(questions), target, params.implicit, params.rate, out_path,
    )
    return report
