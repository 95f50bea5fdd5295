"""Times the code paths that grow with the catalog and the data, at a user's scale rather than TREC's: 2,000 classes,
50,000 training questions, 5,000 validation questions (random figures; no model, no training). It prints each
figure's seconds and a digest of its result, so two commits can be compared in one sitting, result and time:

    git worktree add /tmp/before <commit>
    for tree in /tmp/before .; do PYTHONPATH=$tree/src python scripts/bench_catalog_scale.py; done

Equal digests say the two commits compute the same result; these machines are noisy, so read the times as ratios
between runs of the same sitting.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from tqc.metrics import per_class_prf
from tqc.prior import fit
from tqc.promotion import paired_bootstrap_macro_f1
from tqc.schema import Catalog, StandardQuestion
from tqc.warmup_triplets import ranked_candidates

CLASSES, VALIDATION, TRAINING = 2000, 5000, 50000


def timed(work, repeats: int = 1):
    start = time.perf_counter()
    for _ in range(repeats):
        result = work()
    return (time.perf_counter() - start) / repeats, result


def main() -> None:
    rng = np.random.default_rng(0)
    catalog = Catalog([StandardQuestion(f"c{i}", f"standard question number {i}") for i in range(CLASSES)])
    negatives = rng.integers(0, CLASSES, size=(TRAINING, 5))  # mine.k = 5
    gold = rng.integers(0, CLASSES, VALIDATION)
    challenger = np.where(rng.random(VALIDATION) < 0.80, gold, rng.integers(0, CLASSES, VALIDATION))
    champion = np.where(rng.random(VALIDATION) < 0.78, gold, rng.integers(0, CLASSES, VALIDATION))
    pool_scores = np.round(rng.standard_normal((200, TRAINING)), 2)  # 200 titles against the pool; ties
    validation_scores = rng.standard_normal((VALIDATION, CLASSES)).astype(np.float32)
    log_pi = np.log(rng.dirichlet(np.ones(CLASSES)))
    figures = {
        "mine: each training row's negative ids": timed(
            lambda: [[catalog.class_ids[c] for c in row] for row in negatives]),
        "stage one, all classes: a step's standard questions": timed(
            lambda: [catalog.texts[c] for c in range(CLASSES)], 3),
        "per-class figures over every class": timed(lambda: per_class_prf(gold, challenger, np.arange(CLASSES)), 3),
        "promote's tail bootstrap (2,000 samples, a third of the classes)": timed(
            lambda: paired_bootstrap_macro_f1(gold, challenger, champion, np.arange(0, CLASSES, 3), 2000, 0.95)),
        "warm-up: 200 titles' best 20 of the pool": timed(lambda: ranked_candidates(pool_scores, 20)),
    }
    seconds, shift = timed(lambda: fit(validation_scores, gold, log_pi, temperature=0.05,
                                       weights=[w / 10 for w in range(-10, 11)]))
    figures["prior: λ over 21 weights"] = (seconds, (shift.weight, shift.validation_by_weight))
    for name, (seconds, result) in figures.items():
        print(f"{seconds:9.4f} s  {hashlib.sha1(repr(result).encode()).hexdigest()[:12]}  {name}")


if __name__ == "__main__":
    main()
