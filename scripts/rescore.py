"""Re-score saved models with today's metrics, no training: the evaluate stage's own scorers.

For runs made before a metric existed (e.g. `macro_f1_gold_classes`), or models kept outside
DVC. Prints accuracy and both macro-F1s per model and split, without class-prior shifts; `exemplars` is
the stage-two encoder deciding by the validated training rows (`evaluate.exemplar_k`).

    python scripts/rescore.py --data data/validated --stage-one models/stage_one \
        --stage-two models/stage_two --nc models/nc [--set data.dataset=trec50]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tqc.arguments import parse_overrides
from tqc.config import load_params
from tqc.pipeline import ChainOutputs
from tqc.schema import Catalog, load_questions
from tqc.stages.evaluate import evaluate_models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a validated folder: catalog.jsonl, train.jsonl, test.jsonl, validation.jsonl")
    parser.add_argument("--stage-one", type=Path, required=True)
    parser.add_argument("--stage-two", type=Path, required=True)
    parser.add_argument("--nc", type=Path, required=True, help="the NC folder (or its disabled marker)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    arguments = parser.parse_args()

    params = load_params(arguments.params, parse_overrides(arguments.set))
    catalog = Catalog.load(arguments.data / "catalog.jsonl")
    splits = {split: load_questions(arguments.data / f"{split}.jsonl") for split in ("test", "validation")}
    models = ChainOutputs(arguments.stage_one, arguments.stage_two, arguments.nc)
    train_path = arguments.data / "train.jsonl"
    exemplars = None
    if params.evaluate.exemplar_k > 0:  # the exemplar rule needs the training rows; without them it is skipped
        if train_path.exists():
            exemplars = load_questions(train_path)
        else:
            print(f"{train_path}: missing, so no `exemplars` figures (evaluate.exemplar_k={params.evaluate.exemplar_k})")
    for name, by_split in evaluate_models(models, params, splits, catalog, shifts={}, exemplars=exemplars)["metrics"].items():
        for split, metrics in by_split.items():
            print(f"{name:10s} {split:10s} accuracy {100 * metrics['accuracy']:6.2f}  macro-F1 {100 * metrics['macro_f1']:6.2f}"
                  f"  macro-F1 over gold classes {100 * metrics['macro_f1_gold_classes']:6.2f}  (n={metrics['n']})")


if __name__ == "__main__":
    main()
