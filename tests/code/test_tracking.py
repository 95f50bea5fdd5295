"""Where tracked runs land in the MLflow store."""

from __future__ import annotations

import pytest

from tqc.config import TrackingParams
from tqc.tracking import _process_gone, nested_run, standalone_run, this_process


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


KILLED_MID_RUN = """
import os, signal, sys
from tqc.config import TrackingParams
from tqc.tracking import nested_run, standalone_run

with standalone_run("retrain", TrackingParams(uri=sys.argv[1], experiment="orphans")):
    with nested_run("train") as tracker:
        tracker.log_metrics({"loss": 0.5}, step=0)  # its last sign of life
        os.kill(os.getpid(), signal.SIGKILL)  # no `finally` runs: MLflow would keep both runs RUNNING
"""


def test_runs_of_a_killed_process_are_ended_as_killed_when_the_next_run_starts(tmp_path):
    """A SIGKILLed retrain (or a lost machine) left its runs RUNNING in MLflow for good."""
    import signal
    import subprocess
    import sys

    import mlflow

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_RUN, store], capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    client = mlflow.MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("orphans").experiment_id
    assert {r.info.status for r in client.search_runs([experiment])} == {"RUNNING"}
    # a run of a live process on another host (a shared server): nothing here can tell, so it stays
    elsewhere = client.create_run(experiment, tags={"tqc.process": "another-host:1:1"}).info.run_id
    alive = client.create_run(experiment, tags={"tqc.process": this_process()}).info.run_id  # this host, still running
    # the same hostname in another container or boot (another pid namespace): its pids are not ours to check
    host, _, pid, start = this_process().rsplit(":", 3)
    twin = client.create_run(experiment, tags={"tqc.process": f"{host}:another-boot.1:{pid}9:{start}"}).info.run_id

    with standalone_run("retrain", TrackingParams(uri=store, experiment="orphans")):
        mine = mlflow.active_run().info.run_id

    statuses = {r.info.run_name: r.info.status for r in client.search_runs([experiment])
                if r.info.run_id not in (mine, elsewhere, alive, twin)}
    assert statuses == {"retrain": "KILLED", "train": "KILLED"}
    # ended when they last showed life (the metric, or the start), not when the next run found them
    killed = {r.info.run_name: r.info for r in client.search_runs([experiment]) if r.info.status == "KILLED"}
    [loss] = client.get_metric_history(killed["train"].run_id, "loss")
    assert killed["train"].end_time == loss.timestamp and killed["retrain"].end_time == killed["retrain"].start_time
    assert {client.get_run(run).info.status for run in (elsewhere, alive, twin)} == {"RUNNING"}
    assert client.get_run(mine).info.status == "FINISHED"


def test_a_reused_pid_is_told_from_the_process_that_owned_the_run():
    host, space, pid, start = this_process().rsplit(":", 3)
    assert not _process_gone(this_process())
    # the pid now belongs to a later process (10 ticks on Linux; 10 s elsewhere, past the clock-step slack)
    assert _process_gone(f"{host}:{space}:{pid}:{int(start) + 10}")
    assert not _process_gone("a tag of another form")  # nothing it can tell: left alone


def test_a_store_that_refuses_the_housekeeping_stops_no_run(tmp_path, monkeypatch, caplog):
    import logging

    import mlflow

    from tqc import tracking

    def refused(client, experiment_id):
        raise RuntimeError("INVALID_PARAMETER_VALUE: LIKE is not supported here")

    monkeypatch.setattr(tracking, "end_orphaned_runs", refused)
    with caplog.at_level(logging.WARNING, logger="tqc.tracking"):
        with standalone_run("retrain", TrackingParams(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="e")) as tracker:
            assert tracker.active and mlflow.active_run() is not None
    assert "could not end the runs of killed processes: INVALID_PARAMETER_VALUE" in caplog.text


def test_keys_from_a_users_names_are_made_keys_mlflow_accepts(tmp_path, monkeypatch):
    """An input folder `data (v2)` or an ablation variant `eda+mixup` became an MLflow key it refuses, and the
    stage stopped before doing any work."""
    from pathlib import Path

    import mlflow

    from tqc.config import load_params
    from tqc.tracking import stage_run

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data (v2)"
    data.mkdir()
    (data / "catalog.jsonl").write_text("{}\n")
    grid = {"title": "t", "variants": {"eda+mixup": {"augment.explicit": "eda"}}}
    params = load_params(Path(__file__).resolve().parents[2] / "params.yaml",
                         {"tracking": {"uri": f"sqlite:///{tmp_path / 'm.db'}", "experiment": "keys"},
                          "ablate": {"grids": {"g": grid}}})
    with stage_run("evaluate", params, [data]) as tracker:
        run_id = mlflow.active_run().info.run_id
        tracker.log_metrics({"per class": {"LOC (city)": 0.5}})
    run = mlflow.MlflowClient().get_run(run_id)
    pipeline = mlflow.MlflowClient().get_run(run.data.tags["mlflow.parentRunId"])  # which logs every section
    assert pipeline.data.params["ablate.grids.g.variants.eda_mixup.augment.explicit"] == "eda"
    assert run.data.metrics["per class.LOC _city_"] == 0.5
    assert any(key.endswith("data _v2_") for key in run.data.tags)


def test_a_housekeeping_error_quoting_a_password_is_logged_without_it(tmp_path, monkeypatch, caplog):
    import logging

    from tqc import tracking

    def refused(client, experiment_id):
        raise RuntimeError("API request to http://mlflow:s3cret-pw@127.0.0.1:9/api/2.0/mlflow/runs/search failed")

    monkeypatch.setattr(tracking, "end_orphaned_runs", refused)
    with caplog.at_level(logging.WARNING, logger="tqc.tracking"):
        with standalone_run("retrain", TrackingParams(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="e")):
            pass
    assert "http://mlflow:***@127.0.0.1:9" in caplog.text and "s3cret" not in caplog.text


def test_a_pipeline_run_whose_params_fail_to_log_is_failed_and_owned_not_left_running(tmp_path, monkeypatch):
    """It was created RUNNING with no owner tag, so when logging its params failed (a 503) no later run ended it."""
    import mlflow
    from mlflow import MlflowClient

    from tqc import tracking
    from tqc.config import Params

    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = Params.model_validate({"tracking": {"uri": store, "experiment": "pipeline"}})
    mlflow.set_tracking_uri(store)
    experiment_id = mlflow.set_experiment("pipeline").experiment_id

    def unavailable(self, run_id, **_):
        raise RuntimeError("503 Service Unavailable")

    monkeypatch.setattr(MlflowClient, "log_batch", unavailable)
    with pytest.raises(RuntimeError, match="503"):
        tracking._pipeline_parent(MlflowClient(), experiment_id, params, "abc")
    run, = MlflowClient().search_runs([experiment_id])
    assert run.info.status == "FAILED" and run.data.tags[tracking.OWNER_TAG] == tracking.this_process()


def test_a_training_stages_run_records_the_processes_that_trained_it(tmp_path, monkeypatch):
    """The stage runs logged neither distributed.* nor the world size: a stage trained by a user's torchrun of 4
    processes (whose in-batch negatives come from each process's share) read as one process's in MLflow."""
    from mlflow import MlflowClient

    from tqc import tracking
    from tqc.config import Params

    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = Params.model_validate({"tracking": {"uri": store, "experiment": "pipeline"}})
    for stage in ("warmup", "stage_one"):  # the warm-up too, which trains under torchrun as stage one does
        with tracking.stage_run(stage, params) as tracker:
            assert tracker.active
    with tracking.stage_run("mine", params):
        pass
    runs = {run.info.run_name: run.data.params for run in MlflowClient(store).search_runs(
        [MlflowClient(store).get_experiment_by_name("pipeline").experiment_id])}
    for stage in ("warmup", "stage_one"):
        assert runs[stage]["distributed.world_size"] == "4" and runs[stage]["distributed.nproc_per_node"] == "1", stage
    assert not any(key.startswith("distributed.") for key in runs["mine"])  # one process, whatever torchrun says


def test_a_repro_whose_stage_failed_stays_failed_when_keep_going_runs_another_stage(tmp_path, monkeypatch):
    """Each stage set the pipeline run's status to its own: under `dvc repro --keep-going`, an independent stage that
    ran after a failure (baseline_nc after stage_two) turned the run FINISHED."""
    from mlflow import MlflowClient

    from tqc import tracking
    from tqc.config import Params

    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = Params.model_validate({"tracking": {"uri": store, "experiment": "pipeline"}})
    with tracking.stage_run("stage_one", params):
        pass
    with pytest.raises(RuntimeError, match="out of memory"):
        with tracking.stage_run("stage_two", params):
            raise RuntimeError("out of memory")
    with tracking.stage_run("baseline_nc", params):
        pass
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("pipeline").experiment_id])
    status = {run.info.run_name: run.info.status for run in runs}
    parent, = [run for run in runs if run.data.tags.get(tracking.PIPELINE_TAG) == "pipeline"]
    assert status == {parent.info.run_name: "FAILED", "stage_one": "FINISHED", "stage_two": "FAILED",
                      "baseline_nc": "FINISHED"}
    assert parent.data.tags[tracking.FAILED_STAGE_TAG] == "stage_two"


def test_a_sqlite_stores_artifacts_go_beside_its_database_not_into_the_working_folder(tmp_path, monkeypatch):
    """MLflow's default artifact root is `./mlruns` of the process's folder: every test store (and a second project's
    store) wrote its models into this checkout's mlruns/."""
    import mlflow

    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    report = tmp_path / "report.txt"
    report.write_text("figures\n")
    store = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    with standalone_run("flow", TrackingParams(uri=store, experiment="beside")) as tracker:
        tracker.log_artifact(report)
    assert mlflow.get_experiment_by_name("beside").artifact_location == (tmp_path / "store" / "mlruns" / "beside").as_uri()
    assert list((tmp_path / "store" / "mlruns").rglob("report.txt")) and not (elsewhere / "mlruns").exists()


@pytest.mark.parametrize("users_own", [None, "false"])
def test_the_cli_tells_mlflow_not_to_phone_home_unless_the_user_said_otherwise(monkeypatch, users_own):
    """MLflow 3 sends usage records to its servers by default; tqc never needs the network."""
    import os

    from tqc import cli

    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "placeholder")  # so the test's change is undone afterwards
    if users_own is None:
        monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY")
    else:
        monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", users_own)
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == (users_own or "true")


@pytest.mark.parametrize("users_own", [None, "7"])
def test_the_cli_bounds_how_long_a_silent_tracking_server_is_retried(monkeypatch, users_own):
    """MLflow's default (7 retries, back-off to 120 s) held a command minutes before its one-line error."""
    import os

    from tqc import cli

    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.setenv(name, "placeholder")  # so the test's change is undone afterwards
        monkeypatch.delenv(name)
    if users_own is not None:
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", users_own)
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == (users_own or "2")
    assert os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "1"


def test_a_tracking_server_that_takes_the_connection_and_never_answers_is_said_in_seconds(monkeypatch):
    """MLflow waits 120 s a try for an answer: a server that took the connection and never answered held every
    command for six minutes. The probe before a command's work reads with tracking's bound (CONNECT_SECONDS, 1 s
    here), and leaves MLflow's own timeout as it was for the run's calls."""
    import os
    import time

    from mlflow.exceptions import MlflowException

    from tests.servers import silent_server
    from tqc import tracking

    monkeypatch.setattr(tracking, "CONNECT_SECONDS", 1)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    with silent_server() as port:
        started = time.monotonic()
        with pytest.raises(MlflowException, match=r"^tracking.uri .*http://127.0.0.1:\d+: the store could not be read "
                                                  r"\(.*read timeout=1\)"):
            tracking.check_store(TrackingParams(uri=f"http://127.0.0.1:{port}"))
    assert time.monotonic() - started < 20
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ


def test_a_sqlite_store_in_a_folder_that_is_not_there_is_refused_not_made(tmp_path, monkeypatch):
    """MLflow makes the folders of a SQLite URI: a misspelt path got a new, empty store (and mlruns/) wherever it
    pointed, and the runs went there unseen."""
    from tqc.config import ConfigError

    monkeypatch.chdir(tmp_path)
    store = tmp_path / "misspelt" / "mlflow.db"
    with pytest.raises(ConfigError, match=rf"tracking.uri \(or \$MLFLOW_TRACKING_URI\) sqlite:///{store}: no folder "
                                          rf"{store.parent} to keep"):  # the variable may have chosen it: both named
        with standalone_run("flow", TrackingParams(uri=f"sqlite:///{store}", experiment="nowhere")):
            pass
    assert not store.parent.exists() and not (tmp_path / "mlruns").exists()
    # a database URL with one slash too few reads as a folder: said with its password hidden
    with pytest.raises(ConfigError, match=r"'postgresql:/u:\*\*\*@127.0.0.1/db': a folder, MLflow's file store") as raised:
        with standalone_run("flow", TrackingParams(uri="postgresql:/u:s3cret@127.0.0.1/db", experiment="nowhere")):
            pass
    assert "s3cret" not in str(raised.value)


def test_a_registry_command_refuses_a_sqlite_store_that_is_not_there(tmp_path, capsys):
    """`tqc set-champion` against a misspelt store made an empty database, then said the version was missing."""
    from tqc import cli

    store = tmp_path / "none" / "mlflow.db"
    assert cli.main(["--set", f"tracking.uri=sqlite:///{store}", "set-champion", "1"]) == 2
    assert f"no registry at sqlite:///{store}: no file {store}" in capsys.readouterr().err
    assert not store.parent.exists()


def test_an_engines_builtin_error_is_one_line_and_tqcs_own_keeps_its_traceback(tmp_path, monkeypatch, capsys):
    """Optuna says an MLflow database given as its storage is "no longer compatible" with a plain RuntimeError, and
    Alembic says the reverse with its own type: both were tracebacks. A RuntimeError of tqc's own stays one."""
    from tqc import cli

    def optuna_schema_check(args):
        exec("raise RuntimeError('The runtime optuna version is no longer compatible with the table schema')",
             {"__name__": "optuna.storages._rdb.storage"})

    monkeypatch.setattr(cli, "dispatch", optuna_schema_check)
    assert cli.main(["--set", "tracking.enabled=false", "tune"]) == 2
    assert "tqc tune: error from optuna: The runtime optuna version is no longer compatible" in capsys.readouterr().err

    def tqcs_own_bug(args):
        raise RuntimeError("a defect of tqc's")

    monkeypatch.setattr(cli, "dispatch", tqcs_own_bug)
    with pytest.raises(RuntimeError, match="a defect of tqc's"):
        cli.main(["--set", "tracking.enabled=false", "tune"])


def test_ctrl_c_is_one_line_and_exit_130_not_a_traceback(monkeypatch, capsys):
    from tqc import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "dispatch", interrupted)
    assert cli.main(["--set", "tracking.enabled=false", "tune"]) == 130
    assert capsys.readouterr().err.strip() == "tqc tune: interrupted"


@pytest.fixture
def no_mlflow_retry(monkeypatch):
    """MLflow's engine retries a database it cannot connect to 10 times over ~100 s: a test reaching that retry fails
    at its first wait instead of waiting."""
    from mlflow.store.db import utils

    def retried(seconds):
        raise AssertionError(f"MLflow's own retry was reached ({seconds} s wait): the store was not probed first")

    monkeypatch.setattr(utils.time, "sleep", retried)


def test_a_store_that_cannot_be_opened_fails_at_once_naming_the_setting_and_how_to_turn_tracking_off(
        tmp_path, capsys, no_mlflow_retry):
    """A SQLite store that cannot be opened (here a folder where the file should be) was retried by MLflow for ~100 s,
    then said in lines naming the engine and the URI, not the setting to change."""
    from tqc import cli

    store = tmp_path / "mlflow.db"
    store.mkdir()
    missing = [f"--{name}={tmp_path / name}" for name in ("data", "train", "model", "out", "report")]
    assert cli.main(["--set", f"tracking.uri=sqlite:///{store}", "mine", *missing]) == 2
    error = capsys.readouterr().err.strip()
    assert f"tracking.uri (or $MLFLOW_TRACKING_URI) sqlite:///{store}: no connection to the database" in error
    assert "tracking.enabled=false" in error and "\n" not in error


def test_a_database_server_that_is_down_fails_at_once_naming_the_setting_and_no_password(no_mlflow_retry):
    """A PostgreSQL store on a closed port held a stage, and a registry command, ~100 s in MLflow's retries."""
    pytest.importorskip("psycopg2")
    from mlflow.exceptions import MlflowException

    from tqc.tracking import existing_registry

    uri = "postgresql://tqc:secret@127.0.0.1:1/mlflow"  # port 1: nothing listens, the connection is refused at once
    with pytest.raises(MlflowException, match=r"tracking.uri \(or \$MLFLOW_TRACKING_URI\) postgresql://tqc:\*\*\*@127"
                                              r".*no connection.*start it.*tracking.enabled=false") as stage:
        with standalone_run("flow", TrackingParams(uri=uri, experiment="down")):
            pass
    # refused at once, not waited on: the message claims no wait, only what tqc allows
    assert "tqc gives a database 10 s to answer: " in str(stage.value) and "waited" not in str(stage.value)
    with pytest.raises(MlflowException, match=r"^tracking.uri postgresql://tqc:\*\*\*@127.*no connection.*start it, or "
                                              r"point tracking.uri at the registry promote registers in$") as registry:
        existing_registry(uri, "tracking.uri")  # the caller names the setting that chose the URI
    assert "secret" not in str(stage.value) + str(registry.value)


def test_a_registry_command_against_a_tracking_server_that_is_down_names_the_setting_in_one_line(
        monkeypatch, capsys, tmp_path):
    """set-champion and trained-on against an MLflow server that is down failed in a version's lookup, with MLflow's
    error naming its endpoint alone, not tracking.uri or $MLFLOW_TRACKING_URI, whichever chose the server."""
    from tqc import cli

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # a closed port refuses at once; no retry to wait on
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "train.jsonl").write_text('{"text": "where is paris", "class_id": "LOC"}\n', encoding="utf-8")
    down = "http://tqc:secret@127.0.0.1:1"  # port 1: nothing listens
    for command in (["set-champion", "1"], ["trained-on", "--version", "1", "--train", str(tmp_path / "train.jsonl")]):
        assert cli.main(["--set", f"tracking.uri={down}", *command]) == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.startswith(f"tqc {command[0]}: error from mlflow: tracking.uri http://tqc:***@127.0.0.1:1: the "
                                "registry could not be read (")
        assert error.endswith("start it, or point tracking.uri at the registry promote registers in")
        assert "secret" not in error

    monkeypatch.setenv("MLFLOW_TRACKING_URI", down)  # params.yaml's tracking.uri is null: the variable chose it
    assert cli.main(["set-champion", "1"]) == 2
    assert "$MLFLOW_TRACKING_URI http://tqc:***@127.0.0.1:1: the registry could not be read" in capsys.readouterr().err


def test_a_database_url_whose_driver_is_not_installed_says_the_setting_and_what_to_install(monkeypatch):
    from tqc.config import ConfigError

    monkeypatch.setitem(__import__("sys").modules, "psycopg2", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"tracking.uri \(or \$MLFLOW_TRACKING_URI\) postgresql://db/mlflow: its "
                                          r"database driver is not installed .*pip install -e '.\[server\]'"):
        with standalone_run("flow", TrackingParams(uri="postgresql://db/mlflow", experiment="nodriver")):
            pass


def test_a_uri_mlflow_has_no_store_for_is_said_naming_the_setting():
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException, match=r"tracking.uri \(or \$MLFLOW_TRACKING_URI\) foo://bar: the store could "
                                              r"not be opened \(.*unsupported URI.*tracking.enabled=false"):
        with standalone_run("flow", TrackingParams(uri="foo://bar", experiment="nowhere")):
            pass


def test_checking_a_store_makes_nothing_so_workers_starting_together_race_no_migration(tmp_path, monkeypatch,
                                                                                      no_mlflow_retry):
    """tune's check before its data is prepared made the store (migrations, the experiment): two workers starting
    together raced MLflow's migrations of a new SQLite file ("duplicate column name"), and a tune that then failed
    left the store behind. The check only reads; what it refuses, it refuses naming the setting."""
    from mlflow.exceptions import MlflowException

    from tqc.config import ConfigError
    from tqc.tracking import check_store

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    fresh = tmp_path / "mlflow.db"
    check_store(TrackingParams(uri=f"sqlite:///{fresh}"))
    assert list(tmp_path.iterdir()) == []  # the run that opens later makes it
    with pytest.raises(ConfigError, match="no folder .*nowhere to keep the MLflow database in"):
        check_store(TrackingParams(uri=f"sqlite:///{tmp_path / 'nowhere' / 'mlflow.db'}"))
    fresh.mkdir()  # a folder where the file should be: it cannot be opened
    with pytest.raises(MlflowException, match=r"^tracking.uri \(or \$MLFLOW_TRACKING_URI\) sqlite:///.*no connection"):
        check_store(TrackingParams(uri=f"sqlite:///{fresh}"))
    with pytest.raises(MlflowException, match=r"^tracking.uri \(or \$MLFLOW_TRACKING_URI\) http://127.0.0.1:1: the "
                                              r"store could not be read \(.*tracking.enabled=false$"):
        check_store(TrackingParams(uri="http://127.0.0.1:1"))  # port 1: nothing listens
    check_store(TrackingParams(enabled=False, uri="http://127.0.0.1:1"))  # off: nothing is checked


def test_importing_the_served_model_module_sends_mlflow_no_usage_records(tmp_path):
    """`import tqc.serving` from a script or notebook imported MLflow before any entry point had told it to stay
    offline: it wrote ~/.config/mlflow/telemetry.json and was set to send usage records. A user's own setting stands."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")}
    said = subprocess.run([sys.executable, "-c", "import os, tqc.serving; print(os.environ['MLFLOW_DISABLE_TELEMETRY'])"],
                          env={**env, "HOME": str(tmp_path)}, capture_output=True, text=True, check=True)
    assert said.stdout.strip() == "true"
    assert not (tmp_path / ".config" / "mlflow").exists()
    own = subprocess.run([sys.executable, "-c", "import os, tqc.serving; print(os.environ['MLFLOW_DISABLE_TELEMETRY'])"],
                         env={**env, "HOME": str(tmp_path), "MLFLOW_DISABLE_TELEMETRY": "false"}, capture_output=True,
                         text=True, check=True)
    assert own.stdout.strip() == "false"


def test_tracking_uri_is_the_params_then_mlflows_variable_then_the_local_store(monkeypatch):
    from tqc.tracking import tracking_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert tracking_uri(TrackingParams(uri="sqlite:///a.db")) == "sqlite:///a.db"
    assert tracking_uri(TrackingParams()) == "http://env:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking_uri(TrackingParams()) == "sqlite:///mlflow.db"


def test_logged_params_redact_the_database_password_and_leave_out_the_tuners():
    from tqc.config import Params
    from tqc.tracking import run_params

    logged = run_params(Params.model_validate({"tracking": {"uri": "postgresql://u:s3cret@db/mlflow"}}))
    assert logged["tracking"]["uri"] == "postgresql://u:***@db/mlflow" and "tune" not in logged


def test_only_the_main_process_of_a_distributed_run_opens_a_tracking_run(monkeypatch, tmp_path):
    """Every distributed test turns tracking off, so no test held a second rank off the store."""
    from tqc import tracking
    from tqc.config import Params

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(tracking, "_client_and_experiment", lambda *_: pytest.fail("rank 1 opened the store"))
    params = Params.model_validate({"tracking": {"uri": f"sqlite:///{tmp_path}/m.db"}})
    with tracking.stage_run("stage_one", params) as tracker:
        assert not tracker.active


class RecordingMlflow:
    """Stands in for the mlflow module: every call it is given, in order."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


def test_metrics_leave_out_nan_and_flags_and_a_folder_is_logged_under_its_name(tmp_path):
    import math

    from tqc.tracking import Tracker
    from tqc.training import EpochRecord

    fake = RecordingMlflow()
    tracker = Tracker(fake)
    tracker.on_epoch("stage_one")(EpochRecord(0, float("nan"), 0.5, 0.4, 0.0))
    [(name, (metrics,), keywords)] = fake.calls
    assert name == "log_metrics" and keywords["step"] == 0 and not any(math.isnan(v) for v in metrics.values())
    fake.calls.clear()
    tracker.log_metrics({"promoted": True, "accuracy": 1})
    assert fake.calls == [("log_metrics", ({"accuracy": 1.0},), {"step": None})]
    fake.calls.clear()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights").write_text("x")
    tracker.log_artifact(tmp_path / "model")
    assert fake.calls == [("log_artifacts", (str(tmp_path / "model"), "model"), {})]


def test_params_are_logged_in_chunks_that_keep_every_one_and_the_hash_ignores_tracking():
    from tqc.config import Params
    from tqc.tracking import param_chunks, params_hash

    chunks = param_chunks({f"k{i}": i for i in range(250)})
    assert [len(chunk) for chunk in chunks] == [100, 100, 50]
    assert {key for chunk in chunks for key in chunk} == {f"k{i}" for i in range(250)}
    params = Params()
    assert params_hash(params) == params_hash(params.with_overrides({"tracking": {"uri": "sqlite:///other.db"}}))
    assert params_hash(params) != params_hash(params.with_overrides({"seed": 1}))
