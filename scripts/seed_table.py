"""Per-seed test figures of `dvc exp run` records, with mean ± sample std: ADMC, AC, NC, the exemplar rule.

    python scripts/seed_table.py reports/trec50-9b77167/metrics-seed*.json

Each file is one run's reports/metrics.json (after the class-prior shift, as `dvc repro` writes it); figures in percent.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from tqc.ablate import dig

COLUMNS = {  # name → its path in metrics.json
    "ADMC acc": ("test", "accuracy"), "ADMC F1": ("test", "macro_f1"),
    "ADMC F1 gold": ("test", "macro_f1_gold_classes"),
    "AC acc": ("stage_one", "test", "accuracy"), "AC F1": ("stage_one", "test", "macro_f1"),
    "NC acc": ("nc", "test", "accuracy"), "NC F1": ("nc", "test", "macro_f1"),
    "exemplar acc": ("exemplars", "test", "accuracy"), "exemplar F1": ("exemplars", "test", "macro_f1"),
}


def figures(path: Path) -> tuple[int, dict[str, float | None]]:
    metrics = json.loads(path.read_text(encoding="utf-8"))
    values = {name: dig(metrics, keys) for name, keys in COLUMNS.items()}
    return metrics["run"]["params"]["seed"], {name: None if v is None else 100 * v for name, v in values.items()}


def by_seed(paths: list[Path]) -> dict[int, dict[str, float | None]]:
    """Each run's figures by its seed, in seed order; two records of one seed are refused, naming both: one would
    have been dropped from the mean unsaid (or sorting their figures failed)."""
    runs: dict[int, tuple[Path, dict[str, float | None]]] = {}
    for path in paths:
        seed, row = figures(path)
        if seed in runs:
            raise SystemExit(f"{path} and {runs[seed][0]} are both runs of seed {seed}: give one record a seed")
        runs[seed] = (path, row)
    return {seed: runs[seed][1] for seed in sorted(runs)}


def main() -> None:
    runs = by_seed([Path(name) for name in sys.argv[1:]])
    print("seed " + " ".join(f"{name:>13s}" for name in COLUMNS) + "  stage two − one (F1)")
    for seed, row in runs.items():
        gain = row["ADMC F1"] - row["AC F1"]
        print(f"{seed:4d} " + " ".join(f"{row[n]:13.2f}" if row[n] is not None else f"{'—':>13s}" for n in COLUMNS)
              + f"  {gain:+.2f}")
    if len(runs) > 1:
        for label, reduce in (("mean", statistics.mean), ("std", statistics.stdev)):
            cells = []
            for name in COLUMNS:
                values = [row[name] for row in runs.values() if row[name] is not None]
                cells.append(f"{reduce(values):13.2f}" if len(values) > 1 else f"{'—':>13s}")
            print(f"{label:4s} " + " ".join(cells))


if __name__ == "__main__":
    main()
