"""A probe, no training of the encoder: does a logistic-regression head on ADMC's question embeddings beat its rules?

SetFit's second step: for each trained workspace, encodes its training, validation and test questions with the
stage-two question encoder (L2-normalised), fits scikit-learn's multinomial logistic regression on the training
rows (optionally with each class's encoded standard question as one more row, an anchor), and picks the inverse
regularisation C on validation macro-F1. The standard-question rule (before any class-prior shift) and the
exemplar rule of the same model are scored beside it. Validation chooses; test is printed to see whether it carries.

    python scripts/linear_probe.py WORKSPACE [WORKSPACE ...] > linear.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from tqc.device import pick_device
from tqc.exemplars import ExemplarBank, catalog_indices
from tqc.metrics import summary
from tqc.model.encoder import BiEncoder, LastEncodings, catalog_scores
from tqc.schema import Catalog, gold_indices, load_questions

INVERSE_REGULARISATION = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)
SPLITS = ("train", "validation", "test")


def figures(scores: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    metrics = summary(scores, gold)
    return {key: round(metrics[key], 6) for key in ("accuracy", "macro_f1")}


def normalised(vectors: torch.Tensor) -> np.ndarray:
    return torch.nn.functional.normalize(vectors.float(), dim=-1).numpy()


def logistic_head(features: dict[str, np.ndarray], gold: dict[str, np.ndarray], n_classes: int,
                  anchors: np.ndarray | None) -> dict:
    """Fits one head per C on the training rows (+ anchors (P, D), one per class) and keeps the best on validation."""
    x, y = features["train"], gold["train"]
    if anchors is not None:
        x, y = np.vstack([x, anchors]), np.concatenate([y, np.arange(n_classes)])
    best = None
    for c in INVERSE_REGULARISATION:
        head = LogisticRegression(C=c, max_iter=5000).fit(x, y)

        def scores(split: str) -> np.ndarray:  # (N, P); a class absent from training is never predicted
            full = np.full((len(features[split]), n_classes), -np.inf)
            full[:, head.classes_] = head.decision_function(features[split])
            return full

        validation = figures(scores("validation"), gold["validation"])
        if best is None or validation["macro_f1"] > best["validation"]["macro_f1"]:
            best = {"C": c, "validation": validation, "test": figures(scores("test"), gold["test"])}
    return best


def probe(workspace: Path, k: int, batch_size: int) -> dict:
    data = workspace / "data" / "validated"
    catalog = Catalog.load(data / "catalog.jsonl")
    splits = {split: load_questions(data / f"{split}.jsonl") for split in SPLITS}
    gold = {split: gold_indices(questions, catalog) for split, questions in splits.items()}
    admc = BiEncoder.load(workspace / "models" / "stage_two").to(pick_device()).eval()  # as evaluate loads it
    encoder = LastEncodings(admc.question)
    with torch.no_grad():
        features = {split: normalised(encoder.encode([q.text for q in questions], batch_size, f"encoding {split}"))
                    for split, questions in splits.items()}  # (N, D) each
        anchors = normalised(admc.standard.encode(list(catalog.texts), batch_size, "encoding the catalog"))  # (P, D)
    bank = ExemplarBank(torch.from_numpy(features["train"]), catalog_indices(splits["train"], catalog, "training rows"),
                        len(catalog), k)
    rules = {"standard": {}, "exemplars": {}}
    for split in ("validation", "test"):
        questions = splits[split]
        rules["standard"][split] = figures(catalog_scores(admc, questions, catalog, batch_size), gold[split])
        rules["exemplars"][split] = figures(bank.scores(torch.from_numpy(features[split]), batch_size), gold[split])
    rules["logistic"] = logistic_head(features, gold, len(catalog), None)
    rules["logistic_with_anchors"] = logistic_head(features, gold, len(catalog), anchors)
    return {"workspace": str(workspace), **rules}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspaces", type=Path, nargs="+", help="pipeline folders: data/validated, models/stage_two")
    parser.add_argument("--k", type=int, default=2, help="the exemplar rule's k (evaluate.exemplar_k)")
    parser.add_argument("--batch-size", type=int, default=256)
    arguments = parser.parse_args()
    models = [probe(workspace, arguments.k, arguments.batch_size) for workspace in arguments.workspaces]
    rules = [rule for rule in models[0] if rule != "workspace"]
    mean = {rule: {split: {key: round(float(np.mean([m[rule][split][key] for m in models])), 6)
                           for key in ("accuracy", "macro_f1")}
                   for split in ("validation", "test")}
            for rule in rules}
    print(json.dumps({"models": models, "mean": mean}, indent=1))


if __name__ == "__main__":
    main()
