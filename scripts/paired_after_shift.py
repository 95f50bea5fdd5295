"""A grid's figures after the class-prior shift, per seed, and a variant's paired difference from its reference.

`tqc ablate`'s report tabulates each cell before the shift (the grids compare training). The rules that decide a
grid read `metrics.json` as `dvc repro` writes it, after the shift: this reads each done cell's `reports/metrics.json`
out of its experiment's git commit (the `rev` the report records) and prints, per variant, mean ± sample std and the
per-seed values, then the variant minus the reference paired by seed with a 95% t-interval. Run it in the clone that
ran the grid (the experiments' commits live in its git refs):

    python scripts/paired_after_shift.py reports/covidq-standard-contrast covidq_standard_contrast none standard-contrast-1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

from tqc.ablate import dig, paired_difference

FIGURES = {  # name → its path in metrics.json
    "validation macro-F1": ("validation", "macro_f1"), "validation accuracy": ("validation", "accuracy"),
    "test accuracy": ("test", "accuracy"), "test macro-F1": ("test", "macro_f1"),
    "AC test accuracy": ("stage_one", "test", "accuracy"), "AC test macro-F1": ("stage_one", "test", "macro_f1"),
    "exemplars test accuracy": ("exemplars", "test", "accuracy"),
    "exemplars test macro-F1": ("exemplars", "test", "macro_f1"),
    "exemplars validation accuracy": ("exemplars", "validation", "accuracy"),
    "exemplars validation macro-F1": ("exemplars", "validation", "macro_f1"),
}


def cell_figures(rev: str) -> dict[str, float]:
    """One experiment's figures in percent, from the metrics.json of its commit."""
    metrics = json.loads(subprocess.check_output(["git", "show", f"{rev}:reports/metrics.json"]))
    return {name: 100 * dig(metrics, path) for name, path in FIGURES.items()}


def figures_by_variant(report: dict, grid: str) -> dict[str, dict[int, dict[str, float]]]:
    """variant → seed → figures, for the grid's done cells."""
    return {row["variant"]: {cell["seed"]: cell_figures(cell["rev"]) for cell in row["cells"] if cell["status"] == "done"}
            for row in report["rows"] if row["grid"] == grid}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report_folder", type=Path, help="the grid's --out folder, holding ablations.json")
    parser.add_argument("grid")
    parser.add_argument("reference")
    parser.add_argument("variant")
    args = parser.parse_args()
    by_variant = figures_by_variant(json.loads((args.report_folder / "ablations.json").read_text()), args.grid)
    for variant, seeds in by_variant.items():
        print(f"{variant}, seeds {sorted(seeds)}")
        for name in FIGURES:
            values = [seeds[s][name] for s in sorted(seeds)]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            print(f"  {name:30s} {statistics.mean(values):6.2f} ± {spread:4.2f}   " + " ".join(f"{v:6.2f}" for v in values))
    reference, variant = by_variant[args.reference], by_variant[args.variant]
    common = sorted(set(reference) & set(variant))
    print(f"{args.variant} minus {args.reference}, paired over seeds {common} (95% t-interval; tqc ablate's own)")
    if len(common) < 2:
        raise SystemExit("fewer than two seeds done in both: no interval")
    for name in FIGURES:
        paired = paired_difference({s: variant[s][name] for s in common}, {s: reference[s][name] for s in common})
        low, high = paired["ci95"]
        print(f"  {name:30s} {paired['mean']:+6.2f} [{low:+6.2f}, {high:+6.2f}]   higher in {paired['higher_in']} of "
              f"{len(common)}, per seed " + " ".join(f"{variant[s][name] - reference[s][name]:+.2f}" for s in common))


if __name__ == "__main__":
    main()
