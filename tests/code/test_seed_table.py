"""scripts/seed_table.py: the README's per-seed tables are read from the committed metrics.json records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seed_table():
    return load_script("seed_table")


def record(path: Path, seed: int, accuracy: float) -> Path:
    """A metrics.json as evaluate writes it with NC off (`nc: null`)."""
    test = {"accuracy": accuracy, "macro_f1": 0.5, "macro_f1_gold_classes": 0.5}
    path.write_text(json.dumps({"run": {"params": {"seed": seed}}, "test": test, "nc": None, "exemplars": {"test": test},
                                "stage_one": {"test": {"accuracy": 0.5, "macro_f1": 0.25}}}), encoding="utf-8")
    return path


def test_runs_are_in_seed_order_in_percent_with_a_missing_model_as_none(seed_table, tmp_path):
    runs = seed_table.by_seed([record(tmp_path / "b.json", 3, 0.75), record(tmp_path / "a.json", 1, 0.5)])
    assert list(runs) == [1, 3]
    assert runs[3]["ADMC acc"] == 75.0 and runs[3]["AC F1"] == 25.0 and runs[3]["NC acc"] is None


def test_two_records_of_one_seed_are_refused_naming_both(seed_table, tmp_path):
    """Equal figures were collapsed into one row unsaid; different ones failed sorting dicts with a TypeError."""
    first, second = record(tmp_path / "seed1.json", 1, 0.5), record(tmp_path / "seed1-again.json", 1, 0.6)
    with pytest.raises(SystemExit, match=r"seed1-again.json and .*seed1.json are both runs of seed 1"):
        seed_table.by_seed([first, second])


def test_the_committed_trec50_records_give_the_readmes_mean(seed_table):
    runs = seed_table.by_seed(sorted((ROOT / "reports" / "trec50-9b77167").glob("metrics-seed*.json")))
    assert list(runs) == [0, 1, 2, 3, 4]
    assert round(sum(row["ADMC F1"] for row in runs.values()) / 5, 2) == 80.47
