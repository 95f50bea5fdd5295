"""The tables of TREC-50 at twice the budget (docs/results.md), from the committed records, and the ADMC rule's verdict.

    python scripts/budget_table.py

Prints NC at 6 epochs against the default's 3, then ADMC at 4 / 2 against the default's 2 / 1. Reads, per seed: `scripts/rescore.py`'s output for ADMC at 4 / 2 (reports/trec50-admc-4-2/seed<S>-rescore.txt), the
default budget's `dvc exp run` record (reports/trec50-9b77167/metrics-seed<S>.json, unshifted figures) and NC at 6
epochs (`scripts/nc_score.py`'s lines in reports/trec50-nc-protocol-probe/*scores*.jsonl, model `s<S>/nc-E`).
The rule (scripts/trec50_admc_budget_seeds.sh): the mean over seeds 0-4 of ADMC's validation macro-F1 at the checkpoint
it keeps must beat the default's by at least 1 point. Test figures are printed and choose nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

RULE_POINTS = 1.0
RULE_SEEDS = (0, 1, 2, 3, 4)
RESCORE_LINE = re.compile(
    r"(?P<model>\w+)\s+(?P<split>\w+)\s+accuracy\s+(?P<accuracy>[\d.]+)\s+macro-F1\s+(?P<macro_f1>[\d.]+)"
    r"\s+macro-F1 over gold classes\s+(?P<gold>[\d.]+)\s+\(n=\d+\)"
)
Figures = tuple[float, float, float]  # accuracy, macro-F1, macro-F1 over the classes the split holds; in percent
FIGURE_KEYS = ("accuracy", "macro_f1", "macro_f1_gold_classes")


def percent(metrics: dict) -> Figures:
    """A metrics record's three figures (fractions) in percent."""
    return tuple(100 * metrics[key] for key in FIGURE_KEYS)


def parse_rescore(text: str, source: str = "<text>") -> dict[tuple[str, str], Figures]:
    """(model, split) → figures, from scripts/rescore.py's printout; a line that is not a figure line is an error."""
    figures = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = RESCORE_LINE.fullmatch(line.strip())
        if match is None:
            raise ValueError(f"{source}, line {number}: not a rescore.py figure line: {line!r}")
        figures[match["model"], match["split"]] = (float(match["accuracy"]), float(match["macro_f1"]), float(match["gold"]))
    return figures


def nc_scores(paths: list[Path]) -> dict[tuple[int, str], Figures]:
    """(seed, split) → NC at 6 epochs' figures, from nc_score.py's JSON lines (the model folder names the seed)."""
    scores = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            match = re.search(r"/s(\d+)/nc-E$", row["model"])
            if match is None:
                continue  # another variant of the protocol probe (A-D)
            scores[int(match[1]), row["split"]] = percent(row)
    return scores


def read_metrics(default_dir: Path, seed: int) -> dict:
    """The default budget's dvc exp run record of one seed (its reports/metrics.json)."""
    return json.loads((default_dir / f"metrics-seed{seed}.json").read_text(encoding="utf-8"))


def unshifted(metrics: dict, model: str = "admc") -> dict[str, Figures]:
    """One model's (admc, stage_one, nc) figures before its class-prior shift, by split, from a metrics.json record."""
    shift = metrics["prior_shift"][model]
    return {split: percent(shift[f"{split}_unshifted"]) for split in ("validation", "test")}


def rows(admc_dir: Path, default_dir: Path, nc: dict[tuple[int, str], Figures]) -> list[dict]:
    table = []
    for rescore in sorted(admc_dir.glob("seed*-rescore.txt")):
        seed = int(re.match(r"seed(\d+)-", rescore.name)[1])
        admc = parse_rescore(rescore.read_text(encoding="utf-8"), str(rescore))
        default = unshifted(read_metrics(default_dir, seed))
        table.append({
            "seed": seed,
            "default_validation": default["validation"][1],
            "validation": admc["admc", "validation"][1],
            "stage_two_minus_one_validation": admc["admc", "validation"][1] - admc["stage_one", "validation"][1],
            "stage_two_minus_one_test": admc["admc", "test"][1] - admc["stage_one", "test"][1],
            "admc_test": admc["admc", "test"], "ac_test": admc["stage_one", "test"],
            "exemplar_test": admc["exemplars", "test"], "default_test": default["test"],
            "nc6_test": nc.get((seed, "test")),
        })
    return sorted(table, key=lambda row: row["seed"])


def pair(figures: Figures | None, gold: bool = False) -> str:
    if figures is None:
        return "—"
    return f"{figures[0]:.2f} / {figures[1]:.2f}" + (f" ({figures[2]:.2f})" if gold else "")


def values_of(table: list[dict], key: str, index: int | None = None) -> list[float]:
    return [row[key] if index is None else row[key][index] for row in table if row[key] is not None]


def mean_of(table: list[dict], key: str, index: int | None = None) -> float:
    return statistics.mean(values_of(table, key, index))


def mean_std(table: list[dict], key: str, index: int) -> str:
    values = values_of(table, key, index)
    return f"{statistics.mean(values):.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")


def nc_rows(default_dir: Path, nc: dict[tuple[int, str], Figures]) -> list[dict]:
    """NC at 3 epochs (the default run's) against NC at 6 epochs, with ADMC's default-budget test figures beside."""
    table = []
    for seed in sorted({seed for seed, _ in nc}):
        metrics = read_metrics(default_dir, seed)
        nc3, admc = unshifted(metrics, "nc"), unshifted(metrics)
        table.append({
            "seed": seed, "nc3_validation": nc3["validation"][1], "nc6_validation": nc[seed, "validation"][1],
            "nc3_test": nc3["test"], "nc6_test": nc[seed, "test"], "admc_test": admc["test"],
            "admc_test_shifted": percent(metrics["test"]),
        })
    return table


def print_nc_table(table: list[dict]) -> None:
    print("| seed | NC validation macro-F1: 3 epochs | 6 epochs | gain | NC test, 3 epochs | NC test, 6 epochs"
          " | ADMC test, unshifted | ADMC test, shifted |")
    print("| --- " * 8 + "|")
    for row in table:
        print(f"| {row['seed']} | {row['nc3_validation']:.2f} | {row['nc6_validation']:.2f}"
              f" | {row['nc6_validation'] - row['nc3_validation']:+.2f} | {pair(row['nc3_test'], gold=True)}"
              f" | {pair(row['nc6_test'], gold=True)} | {pair(row['admc_test'], gold=True)} | {pair(row['admc_test_shifted'])} |")
    gain = mean_of(table, "nc6_validation") - mean_of(table, "nc3_validation")
    print(f"\nNC validation {mean_of(table, 'nc3_validation'):.2f} → {mean_of(table, 'nc6_validation'):.2f} ({gain:+.2f})")
    for label, key in (("NC at 3 epochs", "nc3_test"), ("NC at 6 epochs", "nc6_test"),
                       ("ADMC, unshifted", "admc_test"), ("ADMC, shifted", "admc_test_shifted")):
        print(f"test, {label}: {mean_std(table, key, 0)} / {mean_std(table, key, 1)} ({mean_of(table, key, 2):.2f})")
    above = sum(row["nc6_test"][1] > row["admc_test"][1] for row in table)
    print(f"NC at 6 epochs above ADMC (default budget, unshifted) on test macro-F1 at {above} of {len(table)} seeds\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admc", type=Path, default=Path("reports/trec50-admc-4-2"))
    parser.add_argument("--default", type=Path, default=Path("reports/trec50-9b77167"))
    parser.add_argument("--nc", type=Path, nargs="*", default=sorted(Path("reports/trec50-nc-protocol-probe").glob("*scores*.jsonl")))
    arguments = parser.parse_args()
    nc = nc_scores(arguments.nc)
    print_nc_table(nc_rows(arguments.default, nc))
    table = rows(arguments.admc, arguments.default, nc)

    print("| seed | validation: default | 4 / 2 | gain | stage two − stage one (validation) | ADMC test | AC test"
          " | exemplar rule test | ADMC test at the default budget | NC at 6 epochs test |")
    print("| --- " * 10 + "|")
    for row in table:
        gain = row["validation"] - row["default_validation"]
        print(f"| {row['seed']} | {row['default_validation']:.2f} | {row['validation']:.2f} | {gain:+.2f}"
              f" | {row['stage_two_minus_one_validation']:+.2f} | {pair(row['admc_test'], gold=True)} | {pair(row['ac_test'])}"
              f" | {pair(row['exemplar_test'])} | {pair(row['default_test'])} | {pair(row['nc6_test'])} |")

    seeds = [row["seed"] for row in table]
    gain = mean_of(table, "validation") - mean_of(table, "default_validation")
    print(f"\nseeds {seeds}: validation {mean_of(table, 'default_validation'):.2f} → {mean_of(table, 'validation'):.2f}"
          f" ({gain:+.2f}); stage two − stage one {mean_of(table, 'stage_two_minus_one_validation'):+.2f} on validation,"
          f" {mean_of(table, 'stage_two_minus_one_test'):+.2f} on test")
    for label, key in (("ADMC", "admc_test"), ("AC", "ac_test"), ("exemplar rule", "exemplar_test"),
                       ("ADMC at the default budget", "default_test"), ("NC at 6 epochs", "nc6_test")):
        print(f"test, {label}: {mean_std(table, key, 0)} / {mean_std(table, key, 1)} ({mean_of(table, key, 2):.2f})")
    nc_ahead = sum(row["nc6_test"] is not None and row["nc6_test"][1] > row["admc_test"][1] for row in table)
    print(f"NC at 6 epochs above ADMC at 4 / 2 on test macro-F1 at {nc_ahead} of {len(table)} seeds")
    if tuple(seeds) != RULE_SEEDS:
        print(f"rule: not judged, it needs seeds {list(RULE_SEEDS)}")
    else:
        print(f"rule: {'passes' if gain >= RULE_POINTS else 'fails'} ({gain:+.2f} against {RULE_POINTS:+.2f})")


if __name__ == "__main__":
    main()
