"""scripts/budget_table.py: the TREC-50 budget table is read from the committed records, not typed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
LINE = "{model:10s} {split:10s} accuracy {a:6.2f}  macro-F1 {f:6.2f}  macro-F1 over gold classes {g:6.2f}  (n=499)"


@pytest.fixture(scope="module")
def budget_table():
    return load_script("budget_table")


def rescore_text(figures: dict[tuple[str, str], tuple[float, float, float]]) -> str:
    return "\n".join(LINE.format(model=m, split=s, a=a, f=f, g=g) for (m, s), (a, f, g) in figures.items()) + "\n"


def test_a_rescore_printout_parses_to_its_figures(budget_table):
    figures = {("admc", "test"): (90.18, 81.7, 85.59), ("stage_one", "validation"): (91.19, 83.21, 84.91)}
    assert budget_table.parse_rescore(rescore_text(figures)) == figures


def test_a_line_that_is_not_a_figure_line_names_the_file_and_line(budget_table):
    text = rescore_text({("admc", "test"): (1.0, 2.0, 3.0)}) + "Traceback (most recent call last):\n"
    with pytest.raises(ValueError, match=r"seed9-rescore.txt, line 2: not a rescore.py figure line"):
        budget_table.parse_rescore(text, "seed9-rescore.txt")


def test_rows_pair_each_seed_with_its_default_and_nc_at_6_epochs(budget_table, tmp_path):
    admc_dir, default_dir = tmp_path / "admc", tmp_path / "default"
    admc_dir.mkdir(), default_dir.mkdir()
    (admc_dir / "seed7-rescore.txt").write_text(rescore_text({
        ("admc", "test"): (90.0, 80.0, 85.0), ("admc", "validation"): (91.0, 86.0, 86.0),
        ("stage_one", "test"): (91.0, 81.0, 86.0), ("stage_one", "validation"): (90.0, 84.5, 84.5),
        ("exemplars", "test"): (92.0, 83.0, 87.0),
    }))
    unshifted = {"accuracy": 0.9, "macro_f1": 0.85, "macro_f1_gold_classes": 0.86}
    (default_dir / "metrics-seed7.json").write_text(json.dumps(
        {"prior_shift": {"admc": {"test_unshifted": unshifted, "validation_unshifted": unshifted}}}))
    nc_lines = tmp_path / "scores.jsonl"
    nc_lines.write_text("\n".join(json.dumps({"model": f"/tmp/p/s7/nc-{v}", "split": "test", "accuracy": 0.5,
                                              "macro_f1": acc, "macro_f1_gold_classes": 0.5})
                                  for v, acc in (("A", 0.1), ("E", 0.8))) + "\n")

    [row] = budget_table.rows(admc_dir, default_dir, budget_table.nc_scores([nc_lines]))

    assert row["seed"] == 7 and row["default_validation"] == pytest.approx(85.0)
    assert row["validation"] == 86.0 and row["stage_two_minus_one_validation"] == pytest.approx(1.5)
    assert row["stage_two_minus_one_test"] == pytest.approx(-1.0)
    assert row["nc6_test"][1] == pytest.approx(80.0)  # variant E, not A


def test_the_committed_records_all_parse(budget_table):
    reports = ROOT / "reports"
    nc = budget_table.nc_scores(sorted((reports / "trec50-nc-protocol-probe").glob("*scores*.jsonl")))
    table = budget_table.rows(reports / "trec50-admc-4-2", reports / "trec50-9b77167", nc)
    assert [row["seed"] for row in table] == list(range(len(table))) and len(table) >= 4
    assert all(row["nc6_test"] is not None for row in table)
    nc_table = budget_table.nc_rows(reports / "trec50-9b77167", nc)
    assert [row["seed"] for row in nc_table] == [0, 1, 2, 3, 4]
    assert all(0 < row["nc3_validation"] <= 100 and 0 < row["nc6_validation"] <= 100 for row in nc_table)
