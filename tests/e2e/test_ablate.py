"""`tqc ablate`: a grid of DVC experiments on a tiny model, read back into reports/ablations.md."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from tests.e2e.conftest import run

pytestmark = pytest.mark.e2e


def test_ablate_runs_each_cell_as_a_dvc_experiment_and_resumes(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["validate"]["min_examples_per_class"] = 1
    params["ablate"] = {
        "seeds": [0],
        "budget": {"baseline_nc.enabled": False, "tracking.enabled": False},
        "grids": {"tail": {"title": "Rebalancing on a long tail", "base": {"data.imbalance_ratio": 4.0},
                           "variants": {"none": {"augment.rebalance": "none"}, "oversample": {"augment.rebalance": "mean"}}}},
    }
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    run(["git", "add", "-A"], project)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"], project)

    first = run([sys.executable, "-m", "tqc.cli", "ablate"], project)
    assert first.count("Running stage 'stage_one'") == 2
    experiments = run([sys.executable, "-m", "dvc", "exp", "list", "--name-only"], project).split()
    assert len([name for name in experiments if name.startswith("abl-tail-")]) == 2

    report = json.loads((project / "reports" / "ablations.json").read_text())
    rows = {row["variant"]: row for row in report["rows"]}
    assert set(rows) == {"none", "oversample"}
    for row in rows.values():
        assert row["seeds_done"] == [0] and 0.0 <= row["admc_macro_f1"]["mean"] <= 1.0
    # Only the oversampling cell made rows: the -S overrides reached the augment stage.
    assert rows["none"]["generated_rows"] == [0] and rows["oversample"]["generated_rows"][0] > 0
    table = (project / "reports" / "ablations.md").read_text()
    assert "| oversample |" in table and "—" not in table.split("| variant |")[1]
    assert (project / "reports" / "ablations.png").stat().st_size > 0
    assert json.loads((project / "reports" / "metrics.json").read_text() if (project / "reports" / "metrics.json").exists()
                      else "{}") == {}  # the workspace is untouched: cells ran in DVC's temporary copies

    second = run([sys.executable, "-m", "tqc.cli", "ablate"], project)
    assert "Running stage" not in second  # finished cells are read back, never trained again

    # On another machine (no experiments here), the committed report's record stands in for them.
    run([sys.executable, "-m", "dvc", "exp", "remove", "--all-commits"], project)
    third = run([sys.executable, "-m", "tqc.cli", "ablate"], project)
    assert "Running stage" not in third
    again = {row["variant"]: row for row in json.loads((project / "reports" / "ablations.json").read_text())["rows"]}
    assert again["oversample"]["seeds_recorded"] == [0]
    assert again["oversample"]["admc_macro_f1"]["values"] == rows["oversample"]["admc_macro_f1"]["values"]
    assert "| 0† |" in (project / "reports" / "ablations.md").read_text()
