"""The tune flow: two `tqc tune` workers as parallel Prefect tasks on one shared study."""

from __future__ import annotations

import json

import optuna
import pytest
import yaml

from flows.tune import tune

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_the_tune_flow_runs_workers_in_parallel_on_one_study(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["tune"].update(study="in-the-file", trials=3, storage=f"sqlite:///{project / 'optuna.db'}", pruner="none",
                          enqueue_defaults=False, space={"stage_one.temperature": {"low": 0.05, "high": 0.5, "log": True}})
    params["tracking"]["enabled"] = False
    (project / "params.yaml").write_text(yaml.safe_dump(params))

    # the flow's own settings follow the overrides as the workers' do (before, tune.trials came from the file)
    results = tune(params_path="params.yaml", workers=2, overrides=["tune.trials=1", "tune.study=flow"])

    assert len(results) == 2 and all(r.startswith("best validation macro-F1") for r in results)
    study = optuna.load_study(study_name="flow", storage=params["tune"]["storage"])
    assert len(study.trials) == 2 and len({t.user_attrs["worker"] for t in study.trials}) == 2
    summary = json.loads((project / "reports" / "tuning" / "summary.json").read_text())
    assert summary["trials"]["COMPLETE"] == 2
