"""The tune flow: two `tqc tune` workers as parallel Prefect tasks on one shared study."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import optuna
import pytest
import yaml

from flows.tune import tune
from tests.flows.conftest import REPO

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


def _pids_running_in(folder) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(folder) in (entry / "cmdline").read_text().replace("\0", " "):
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":  # zombies have ended
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_a_tune_worker_ends_with_the_flow_process_that_started_it(project, tmp_path):
    # Prefect cancels a flow run by signalling its process alone (PrefectHQ/prefect#20979): were the workers it
    # started to go on, they would keep writing trials into the study and holding the cores. They do not: a worker
    # is given the flow process's pid (`tqc tune --parent-pid`) and, once that process is no longer its parent, stops
    # as Ctrl-C stops it, so Optuna marks the running trial failed. (A write to the dead process's pipe ended it once,
    # but with no progress bars into a pipe a worker got to the end of its trial first.)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["tune"].update(study="orphans", trials=50, storage=f"sqlite:///{project / 'optuna.db'}", pruner="none",
                          enqueue_defaults=False, space={"stage_one.temperature": {"low": 0.05, "high": 0.5, "log": True}})
    params["tracking"]["enabled"] = False
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    work = tmp_path / "tune-work"
    flow_process = subprocess.Popen(
        [sys.executable, "-c", "import sys; from flows.tune import tune_worker; "
         f"tune_worker.fn('params.yaml', 0, 50, [], 'reports/tuning', {str(work)!r})"],
        cwd=project, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})
    study = lambda: optuna.load_study(study_name="orphans", storage=params["tune"]["storage"])
    try:
        assert _wait_for(lambda: _has_trials(project / "optuna.db"), 180), "no trial started"
        os.kill(flow_process.pid, signal.SIGKILL)  # what Prefect's cancellation comes to when the process does not end
        flow_process.wait()
        # the worker ends at its next line written, a step or two away: 30 s was not always enough on a loaded machine
        # (the suite beside helpers' tests), which failed it with the worker still training, not outliving anything
        assert _wait_for(lambda: not _pids_running_in(work), 120), "the tune worker outlived the flow's process"
        states = [trial.state for trial in study().trials]
        assert optuna.trial.TrialState.RUNNING not in states and optuna.trial.TrialState.FAIL in states
        assert len(states) < 50
    finally:
        flow_process.kill()
        for pid in _pids_running_in(work):
            os.kill(pid, signal.SIGKILL)


def _has_trials(database: Path) -> bool:
    """Read with sqlite3, not optuna: optuna's storage creates the tables it misses, and doing that while the worker
    creates them fails one side with "table studies already exists" (the product's workers retry that race; a
    poll from the test need not take part in it)."""
    if not database.exists():
        return False
    try:
        with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
            return connection.execute("SELECT count(*) FROM trials").fetchone()[0] > 0
    except sqlite3.OperationalError:  # no trials table yet, or locked by the worker's write
        return False


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def test_a_workers_lines_are_logged_as_they_come_and_a_progress_bar_only_by_its_last_frame(caplog):
    """The flow run's log shows each worker's epochs and trials while it runs (its output was held until it ended)."""
    import logging

    from tqc.launched import run_logging_lines

    script = ("import sys, time\n"
              "print('trial 0 started', flush=True)\n"
              "sys.stderr.write('\\rstage one 1/10\\rstage one 10/10\\r              \\r'); sys.stderr.flush()\n"
              "sys.stderr.write('INFO epoch 1: validation macro-F1 0.5\\n'); sys.stderr.flush()\n"
              "time.sleep(0.5)\n"
              "print('best validation macro-F1 0.5000', flush=True)\n"
              "sys.exit(3)\n")
    log = logging.getLogger("test.tune.worker")
    with caplog.at_level(logging.INFO, logger="test.tune.worker"):
        returncode, stdout, stderr = run_logging_lines([sys.executable, "-c", script], log, "tune worker 1")

    assert returncode == 3
    assert stdout == ["trial 0 started", "best validation macro-F1 0.5000"]
    assert stderr == ["INFO epoch 1: validation macro-F1 0.5"]  # not the bar's frames
    logged = [r.getMessage() for r in caplog.records if r.name == "test.tune.worker"]
    assert sorted(logged) == sorted(["tune worker 1: trial 0 started", "tune worker 1: INFO epoch 1: validation macro-F1 0.5",
                                     "tune worker 1: best validation macro-F1 0.5000"])
    when = {r.getMessage(): r.created for r in caplog.records if r.name == "test.tune.worker"}
    assert when["tune worker 1: best validation macro-F1 0.5000"] - when["tune worker 1: trial 0 started"] > 0.3  # live


def test_workers_spread_over_the_machines_gpus(monkeypatch):
    from flows.tune import worker_environment

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [worker_environment(worker, gpus=2)["CUDA_VISIBLE_DEVICES"] for worker in range(3)] == ["0", "1", "0"]
    assert worker_environment(1, gpus=1) is None and worker_environment(1, gpus=0) is None  # the environment as it is
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # the worker's starter chose: kept
    assert worker_environment(1, gpus=2) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU, chosen: kept
    assert worker_environment(1, gpus=2) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 5")  # the starter gave the run two GPUs: the workers spread over them
    assert [worker_environment(worker)["CUDA_VISIBLE_DEVICES"] for worker in range(3)] == ["2", "5", "2"]


def test_the_flow_script_takes_the_flows_parameters_on_its_command_line():
    """`python flows/tune.py` took none: 2 workers × tune.trials on params.yaml, heavy for a first try."""
    from flows.tune import _arguments

    given = _arguments(["--workers", "1", "--trials", "2", "--set", "stage_one.epochs=1", "--params", "team.yaml"])
    assert (given.workers, given.trials, given.overrides, given.params) == (1, 2, ["stage_one.epochs=1"], "team.yaml")
    default = _arguments([])
    assert (default.workers, default.trials, default.overrides, default.out) == (2, None, [], "reports/tuning")
    with pytest.raises(SystemExit):
        _arguments(["--workers", "0"])


def test_bad_params_fail_the_run_with_the_key_and_the_reason_and_the_script_says_it_in_one_line(project):
    """A --set value the params refuse failed the run as "Flow run encountered an exception: ConfigError: …" with
    Prefect's traceback, and `python flows/tune.py` ended in a traceback of its own; the retrain flow says it in a line."""
    from flows.tune import main
    from tqc.config import ConfigError

    state = tune(params_path="params.yaml", workers=1, overrides=["stage_one.epochs=abc"], return_state=True)
    assert state.is_failed() and state.message.startswith(
        "params.yaml with {'stage_one.epochs': 'abc'} set on top: invalid parameters")
    assert "stage_one.epochs: Input should be a valid integer (got 'abc')" in state.message
    assert isinstance(state.result(raise_on_failure=False), ConfigError)
    with pytest.raises(SystemExit) as exited:
        main(["--workers", "1", "--set", "stage_one.epochs=abc"])
    assert str(exited.value).startswith("tune failed: params.yaml with {'stage_one.epochs': 'abc'} set on top")
    assert not (project / "reports").exists()  # no worker started


def test_a_password_in_the_flows_overrides_is_refused_and_not_repeated(project, monkeypatch):
    """A database URL with its password given as an override ran: Prefect kept it among the run's parameters, and each
    worker's `--set` showed it on a command line to every user of the machine. Refused before any worker, redacted."""
    import flows.tune as tune_flow

    class NoWorker:
        def submit(self, *arguments):
            raise AssertionError(f"a worker started: {arguments}")

    monkeypatch.setattr(tune_flow, "tune_worker", NoWorker())
    state = tune(params_path="params.yaml", workers=1, return_state=True,
                 overrides=["stage_one.epochs=1", "tune.storage=postgresql://tuner:s3cret@db/optuna"])
    assert state.is_failed() and state.message.startswith(
        "overrides ['tune.storage=postgresql://tuner:***@db/optuna']: a password or token")
    assert "s3cret" not in state.message and "PGPASSWORD" in state.message
    # a URL naming no password is a fine override, and the run goes on to the params
    state = tune(params_path="params.yaml", workers=1, return_state=True, overrides=["stage_one.epochs=abc",
                 "tune.storage=postgresql://tuner@db/optuna"])
    assert state.is_failed() and "stage_one.epochs: Input should be a valid integer" in state.message


@pytest.mark.parametrize("counts, said", [({"workers": 0}, "workers: 0: must be at least 1"),
                                          ({"trials_per_worker": 0}, "trials_per_worker: 0: must be at least 1"),
                                          ({"workers": -1}, "workers: -1: must be at least 1")])
def test_a_run_with_no_worker_or_no_trial_fails_naming_the_parameter(project, monkeypatch, counts, said):
    """A deployment run with workers 0 did nothing and succeeded, and one with trials_per_worker 0 ran tune.trials
    a worker: `python flows/tune.py` and `tqc tune --trials` refuse both, and so does the flow, before any worker."""
    import flows.tune as tune_flow

    class NoWorker:
        def submit(self, *arguments):
            raise AssertionError(f"a worker started: {arguments}")

    monkeypatch.setattr(tune_flow, "tune_worker", NoWorker())
    state = tune(params_path="params.yaml", **{"workers": 1, **counts}, return_state=True)
    assert state.is_failed() and state.message == said


def test_a_worker_runs_its_own_tqc_tune_on_its_gpu_and_fails_whenever_its_process_does(monkeypatch):
    """What each task starts: `tqc tune` with its worker number, trials, overrides and folders, on GPU i mod count of
    those its starter listed; its result is the process's last line. A status of a process a signal ended (the OOM
    killer's -9) is a failure as much as an exit status of 1 is: the flow run must not succeed without that worker."""
    import flows.tune as tune_flow

    started, outcome = [], {}
    monkeypatch.setattr(tune_flow, "run_logging_lines",
                        lambda command, logger, name, environment: started.append((command, name, environment)) or outcome["now"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    outcome["now"] = (0, ["trial 0 started", "best validation macro-F1 0.5000"], [])
    arguments = ("team.yaml", 1, 3, ["stage_one.epochs=1"], "out", "work")
    assert tune_flow.tune_worker.fn(*arguments) == "best validation macro-F1 0.5000"
    command, name, environment = started[0]
    assert command[1:] == ["-m", "tqc.cli", "--params", "team.yaml", "--set", "stage_one.epochs=1", "tune", "--worker", "1",
                           "--trials", "3", "--out", "out", "--work", "work", "--parent-pid", str(os.getpid())]
    assert name == "tune worker 1" and environment["CUDA_VISIBLE_DEVICES"] == "5"
    for returncode in (1, -9):
        outcome["now"] = (returncode, [], ["Killed"])
        with pytest.raises(RuntimeError, match="^tune worker 1 failed:\nKilled$"):
            tune_flow.tune_worker.fn(*arguments)


def test_the_flow_script_keeps_a_users_own_analytics_setting(monkeypatch):
    """`python flows/tune.py` turns the embedded server's usage report off only where the user has not set it."""
    from flows.tune import main

    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "true")
    with pytest.raises(SystemExit):
        main(["--workers", "0"])  # refused by the command line, after the setting is made
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "true"
    monkeypatch.delenv("PREFECT_SERVER_ANALYTICS_ENABLED")
    with pytest.raises(SystemExit):
        main(["--workers", "0"])
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
