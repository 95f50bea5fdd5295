"""Score NC models (the baseline's encoder + linear head) on a validated data folder, with no class-prior shift.

    python scripts/nc_score.py DATA NC_FOLDER [NC_FOLDER ...]

DATA is a validated folder (catalog.jsonl, validation.jsonl, test.jsonl) as the validate stage writes it. Each model
is scored by its raw head (argmax of the logits): the figure a plain "encoder + linear head" script reports, and the
one NC's history records on validation. Prints one JSON line per model and split with accuracy, macro_f1 (gold ∪
predicted classes, scikit-learn's default) and macro_f1_gold_classes. Used by scripts/trec50_nc_protocol_probe.sh.
"""
import argparse
import json
import sys
from pathlib import Path

from tqc import metrics
from tqc.model.linear import LinearClassifier
from tqc.schema import Catalog, gold_indices, load_questions
from tqc.scoring import scorer_for

SPLITS = ("validation", "test")
KEYS = ("accuracy", "macro_f1", "macro_f1_gold_classes", "n")


def scores(data: Path, folder: Path, batch_size: int) -> list[dict]:
    catalog = Catalog.load(data / "catalog.jsonl")
    score = scorer_for(LinearClassifier.load(folder), batch_size)
    rows = []
    for split in SPLITS:
        questions = load_questions(data / f"{split}.jsonl")
        figures = metrics.summary(score(questions, catalog), gold_indices(questions, catalog))  # (N, C) logits
        rows.append({"model": str(folder), "split": split, **{key: figures[key] for key in KEYS}})
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="a validated data folder")
    parser.add_argument("models", type=Path, nargs="+", help="NC model folders (tqc baseline-nc --out)")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    for folder in args.models:
        for row in scores(args.data, folder, args.batch_size):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
