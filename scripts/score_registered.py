"""Score registered model versions on a labeled split, through the pyfunc the registry serves.

What a version would really answer (its rule, its exemplars or class-prior shift), for comparing
versions after a retrain or a refresh. Prints accuracy and macro-F1 (scikit-learn's default, over
gold ∪ predicted) in percent per version. The registry is params.yaml's `tracking`.

    python scripts/score_registered.py --split data/validated/test.jsonl --version 1 --version 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tqc.config import load_params
from tqc.metrics import macro_f1
from tqc.schema import load_questions
from tqc.tracking import offline_mlflow, tracking_uri


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", type=Path, required=True, help="a validated JSONL split (text, class_id)")
    parser.add_argument("--version", action="append", required=True, help="a registered version (repeatable)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = parser.parse_args()

    offline_mlflow()  # before MLflow is imported
    import mlflow

    from tqc.serving import served_first_answers

    params = load_params(args.params)
    mlflow.set_tracking_uri(tracking_uri(params.tracking))
    rows = load_questions(args.split)
    gold_ids = [q.class_id for q in rows]
    for version in args.version:
        uri = f"models:/{params.promote.model_name}/{version}"
        predicted_ids, _ = served_first_answers(uri, [q.text for q in rows])
        names = sorted(set(gold_ids) | set(predicted_ids))  # indices over gold ∪ predicted, as the evaluate stage's
        gold = np.array([names.index(c) for c in gold_ids])
        predicted = np.array([names.index(c) for c in predicted_ids])
        print(f"{params.promote.model_name} v{version} on {args.split} ({len(rows)} questions): "
              f"accuracy {100 * np.mean(gold == predicted):.2f}, macro-F1 {100 * macro_f1(gold, predicted):.2f}")


if __name__ == "__main__":
    main()
