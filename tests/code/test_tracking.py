"""Where tracked runs land in the MLflow store."""

from __future__ import annotations

from tqc.config import TrackingParams
from tqc.tracking import nested_run, standalone_run


def test_a_nested_run_lands_in_its_parents_experiment_whatever_experiment_is_active(tmp_path, monkeypatch):
    """MLflow's `set_experiment`, when another process creates the experiment between its lookup and its
    create (tune workers starting together), returns that experiment without making it active. The
    study run still lands right (it names its experiment); its trials, nested runs, must follow it."""
    import mlflow

    local_store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(local_store)
    mlflow.set_experiment("something else")
    active_before = mlflow.tracking.fluent._active_experiment_id
    study_experiment = mlflow.MlflowClient().create_experiment("tune-test")
    monkeypatch.setattr(mlflow, "set_experiment", lambda name: mlflow.get_experiment_by_name(name))  # the race's path

    with standalone_run("tune study", TrackingParams(uri=local_store, experiment="tune-test")):
        assert mlflow.tracking.fluent._active_experiment_id == active_before  # the race's state: not made active
        study_run = mlflow.active_run()
        with nested_run("trial 0", tags={"optuna.trial": "0"}) as trial:
            assert trial.active
            trial_run = mlflow.active_run()

    assert study_run.info.experiment_id == study_experiment
    assert trial_run.info.experiment_id == study_experiment
    assert trial_run.data.tags["mlflow.parentRunId"] == study_run.info.run_id
