"""A probe, no training: does averaging several trained ADMC models' scores rank better than each model alone?

For trained workspaces of one dataset (one per seed: each holds `models/stage_two` and `data/validated`, as a
`dvc exp run` leaves them), scores every validation and test question by the standard-question rule (before any
class-prior shift) and by the exemplar rule, model by model, then by the ensemble: the mean of the models' softmax
probabilities over the catalog (the standard rule's scores are already divided by τ) and the mean of their exemplar
cosines. The test questions and the catalog must be the same in every workspace; each model's exemplars are its own
workspace's training rows. Validation is shared only where the workspaces share it (a named validation file such as
COVID-Q's `testB`); otherwise each model's own validation split is scored alone and the ensemble has none.

    python scripts/ensemble_probe.py WORKSPACE [WORKSPACE ...] > ensemble.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tqc.config import load_params
from tqc.exemplars import exemplar_scorer
from tqc.metrics import summary
from tqc.model.encoder import BiEncoder, catalog_scores
from tqc.schema import Catalog, gold_indices, load_questions


def softmax(logits: np.ndarray) -> np.ndarray:
    """(N, P) logits → (N, P) probabilities, row by row."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def figures(scores: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    metrics = summary(scores, gold)
    return {key: round(metrics[key], 6) for key in ("accuracy", "macro_f1", "macro_f1_gold_classes")}


def workspace_scores(workspace: Path, params, catalog: Catalog, splits: dict) -> dict[str, dict[str, np.ndarray]]:
    """{split: {rule: (N, P) scores}} of one workspace's stage-two model."""
    model = BiEncoder.load(workspace / "models" / "stage_two").eval()
    exemplars = load_questions(workspace / "data" / "validated" / "train.jsonl")
    nearest = exemplar_scorer(model.question, exemplars, params.evaluate.exemplar_k, params.evaluate.batch_size)
    return {split: {"standard": softmax(catalog_scores(model, questions, catalog, params.evaluate.batch_size)),
                    "exemplars": nearest(questions, catalog)}
            for split, questions in splits.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspaces", type=Path, nargs="+")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="for evaluate.exemplar_k and batch_size")
    args = parser.parse_args()
    params = load_params(args.params)
    folders = [workspace / "data" / "validated" for workspace in args.workspaces]
    catalog = Catalog.load(folders[0] / "catalog.jsonl")
    test = load_questions(folders[0] / "test.jsonl")
    for folder in folders[1:]:
        if Catalog.load(folder / "catalog.jsonl").texts != catalog.texts or load_questions(folder / "test.jsonl") != test:
            raise SystemExit(f"{folder}: its catalog or test split differs from {folders[0]}'s")
    validations = [load_questions(folder / "validation.jsonl") for folder in folders]
    shared = {"test": test} | ({"validation": validations[0]} if all(v == validations[0] for v in validations) else {})

    singles, totals = [], {}
    for workspace, validation in zip(args.workspaces, validations):
        splits = {"test": test, "validation": validation}
        scores = workspace_scores(workspace, params, catalog, splits)
        singles.append({"workspace": str(workspace),
                        **{split: {rule: figures(s, gold_indices(splits[split], catalog)) for rule, s in by_rule.items()}
                           for split, by_rule in scores.items()}})
        for split in shared:
            for rule, s in scores[split].items():
                totals[(split, rule)] = totals.get((split, rule), 0) + s / len(args.workspaces)
    ensemble = {split: {rule: figures(totals[(split, rule)], gold_indices(questions, catalog))
                        for rule in ("standard", "exemplars")}
                for split, questions in shared.items()}
    print(json.dumps({"models": singles, "ensemble": ensemble}, indent=2))


if __name__ == "__main__":
    main()
