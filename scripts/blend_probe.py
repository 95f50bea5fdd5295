"""A probe, no training: does a blend of the two serving rules beat either?

For one trained workspace, scores every validation and test question by
`(1 − w) · standard-question cosine + w · exemplar-rule score` for w = 0, 0.1, …, 1 (w = 0 is the
standard-question rule before its class-prior shift, w = 1 the exemplar rule), with the evaluate stage's
own scorers. Validation would choose w; test is printed beside it to see whether that choice carries.

    python scripts/blend_probe.py --workspace . [--k 2] > blend.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tqc.exemplars import ExemplarBank, catalog_indices
from tqc.metrics import summary
from tqc.model.encoder import LastEncodings, catalog_scores
from tqc.schema import Catalog, gold_indices, load_questions
from tqc.scoring import trained_models

WEIGHTS = np.round(np.linspace(0.0, 1.0, 11), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, required=True, help="a pipeline's folder: data/validated, models/")
    parser.add_argument("--k", type=int, default=2, help="the exemplar rule's k (evaluate.exemplar_k)")
    parser.add_argument("--batch-size", type=int, default=256)
    arguments = parser.parse_args()

    data = arguments.workspace / "data" / "validated"
    catalog = Catalog.load(data / "catalog.jsonl")
    models = arguments.workspace / "models"
    admc = trained_models(models / "stage_one", models / "stage_two", None)["admc"]
    questions_encoder = LastEncodings(admc.question)  # the exemplar rule reuses the questions' encodings
    train = load_questions(data / "train.jsonl")
    bank = ExemplarBank(questions_encoder.encode([q.text for q in train], arguments.batch_size, "encoding exemplars"),
                        catalog_indices(train, catalog, "training rows"), len(catalog), arguments.k)
    figures = {}
    for split in ("validation", "test"):
        questions = load_questions(data / f"{split}.jsonl")
        gold = gold_indices(questions, catalog)
        standard = catalog_scores(admc, questions, catalog, arguments.batch_size, questions_encoder)  # (N, P)
        # (N, P): the encodings catalog_scores just made, kept by LastEncodings
        nearest = bank.scores(questions_encoder.encode([q.text for q in questions], arguments.batch_size), arguments.batch_size)
        figures[split] = {f"{w:.1f}": {key: summary((1 - w) * standard + w * nearest, gold)[key]
                                       for key in ("accuracy", "macro_f1")} for w in WEIGHTS}
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
