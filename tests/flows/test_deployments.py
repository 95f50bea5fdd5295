"""prefect.yaml: every deployment names a real flow, and retrains never overlap across workers."""

from __future__ import annotations

import importlib
import os

import pytest
import yaml
from prefect import Flow
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

from tests.flows.conftest import REPO, deploy_from_a_checkout
from tqc.deployments import DeploymentParametersError, check_parameters


def deployments() -> dict[str, dict]:
    config = yaml.safe_load((REPO / "prefect.yaml").read_text())
    return {d["name"]: d for d in config["deployments"]}


def test_every_deployment_entrypoint_is_a_prefect_flow():
    assert set(deployments()) == {"retrain-nightly", "tune-weekly"}
    for name, deployment in deployments().items():
        path, function = deployment["entrypoint"].split(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert isinstance(getattr(module, function), Flow), name


def test_the_nightly_retrain_runs_one_at_a_time_and_queues_the_next():
    limit = ConcurrencyLimitConfig(**deployments()["retrain-nightly"]["concurrency_limit"])
    assert limit.limit == 1 and limit.collision_strategy == ConcurrencyLimitStrategy.ENQUEUE


def test_the_shipped_deployments_give_their_flows_parameters_they_take_and_each_is_checked_on_deploy(monkeypatch):
    monkeypatch.chdir(REPO)  # prefect.yaml's entrypoints are the project root's
    monkeypatch.setattr("sys.argv", ["prefect", "deploy", "--all"])
    assert check_parameters() == {"checked": "prefect.yaml"}
    config = yaml.safe_load((REPO / "prefect.yaml").read_text())
    assert config["build"] == [{"tqc.deployments.check_parameters": {}}]
    # a deployment's own build: (even an empty one) replaces the file's, and its parameters would go unchecked
    assert not [d["name"] for d in config["deployments"] if "build" in d]


def test_the_file_checked_is_the_one_prefect_deploy_was_given(tmp_path, monkeypatch):
    """Prefect tells a step nothing of the file it deploys: the step read ./prefect.yaml, so `--prefect-file other.yaml`
    with a misspelt mode deployed beside a correct prefect.yaml, and failed where no prefect.yaml was."""
    other = tmp_path / "other.yaml"
    other.write_text((REPO / "prefect.yaml").read_text().replace("mode: train ", "mode: trian "))
    monkeypatch.chdir(REPO)
    monkeypatch.setattr("sys.argv", ["prefect", "--no-prompt", "deploy", "--name", "retrain-nightly",
                                     "--prefect-file", str(other)])
    with pytest.raises(DeploymentParametersError, match=f"^{other}: deployment 'retrain-nightly', schedule "
                                                        "train-nightly: parameter mode: 'trian' is not one of"):
        check_parameters()


def test_parameters_a_flow_does_not_take_are_said_by_deployment_schedule_and_parameter(tmp_path, monkeypatch):
    config = yaml.safe_load((REPO / "prefect.yaml").read_text())
    retrain, tune = config["deployments"]
    retrain["schedules"][0]["parameters"] = {"mode": "trian"}
    retrain["schedules"][1]["parameters"] = {"mdoe": "refresh"}
    tune["parameters"] = {**tune["parameters"], "workers": "two", "overrides": "tune.trials=3"}
    bad = tmp_path / "prefect.yaml"
    bad.write_text(yaml.safe_dump(config))
    monkeypatch.chdir(REPO)
    with pytest.raises(DeploymentParametersError) as refused:
        check_parameters(str(bad))
    assert str(refused.value).splitlines() == [
        f"{bad}: deployment 'retrain-nightly', schedule train-nightly: parameter mode: 'trian' is not one of "
        "['train', 'refresh']",
        f"{bad}: deployment 'retrain-nightly', schedule refresh-hourly: parameter 'mdoe': the flow takes no such "
        "parameter (it takes params_path, mode)",
        f"{bad}: deployment 'tune-weekly': parameter workers: 'two' is not of type 'integer'",
        f"{bad}: deployment 'tune-weekly': parameter overrides: 'tune.trials=3' is not of type 'array'",
    ]


def test_what_prefect_fills_in_or_loads_itself_is_left_to_it_and_a_broken_entrypoint_names_its_deployment(
        tmp_path, monkeypatch):
    config = yaml.safe_load((REPO / "prefect.yaml").read_text())
    retrain, tune = config["deployments"]
    tune["parameters"]["workers"] = "{{ prefect.variables.tune_workers }}"  # filled in by Prefect after the step
    retrain["schedule"] = {"cron": "0 3 * * *", "parameters": {"mode": "nightly"}}  # Prefect 2's single schedule
    config["deployments"] += [{"name": "entrypoint-on-the-command-line"},
                              {"name": "misspelt", "entrypoint": "flows/tuen.py:tune"},
                              {"name": "listed", "entrypoint": "flows/tune.py:tune", "parameters": ["workers", 2]}]
    bad = tmp_path / "prefect.yaml"
    bad.write_text(yaml.safe_dump(config))
    monkeypatch.chdir(REPO)
    with pytest.raises(DeploymentParametersError) as refused:
        check_parameters(str(bad))
    lines = str(refused.value).splitlines()
    assert lines[0] == (f"{bad}: deployment 'retrain-nightly', schedule 2: parameter mode: 'nightly' is not one of "
                        "['train', 'refresh']")
    assert lines[1].startswith(f"{bad}: deployment 'misspelt': entrypoint 'flows/tuen.py:tune' does not load (")
    assert lines[2:] == [f"{bad}: deployment 'listed': parameters must be a mapping of name to value, not list"]


def test_prefect_deploy_refuses_a_misspelt_schedule_parameter(prefect_harness, tmp_path):
    """prefect.yaml's build step, as `prefect deploy` runs it: without it the deployment was made, and the schedule's
    run failed when it fired."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    def deployments_as_they_are() -> dict:  # the session's server may hold them from another test's deploy
        with get_client(sync_client=True) as client:
            return {d.name: (d.updated, d.parameters) for d in client.read_deployments()}

    before = deployments_as_they_are()
    with pytest.raises(AssertionError, match="schedule train-nightly: parameter mode: 'trian' is not one of"):
        deploy_from_a_checkout(tmp_path / "checkout", {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
                               "--all", edit=lambda text: text.replace("mode: train ", "mode: trian "))
    assert deployments_as_they_are() == before  # nothing deployed, nothing changed


def test_prefect_deploy_puts_the_nightly_training_and_the_hourly_refresh_on_one_limited_deployment(prefect_harness, tmp_path):
    """`prefect deploy --all`, docs/retrain.md's command, against a real (temporary) Prefect server: the refresh is a
    schedule of the retrain deployment, so the deployment's limit of one run keeps it apart from a training."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    checkout = tmp_path / "checkout"  # a copy: `prefect deploy` must not write into the repository
    # set where deploying (the deploying machine's own checkout): the pull step names no path, so none is baked in
    deploying = {**os.environ, "TQC_PROJECT_DIR": str(tmp_path / "the-deployers-checkout")}
    deploy_from_a_checkout(checkout, {**deploying, "PREFECT_API_URL": PREFECT_API_URL.value()}, "--all")
    assert sorted(p.name for p in checkout.iterdir()) == ["flows", "prefect.yaml"]

    with get_client(sync_client=True) as client:
        retrain = client.read_deployment_by_name("retrain/retrain-nightly")
    schedules = {s.slug: s for s in retrain.schedules}
    assert set(schedules) == {"train-nightly", "refresh-hourly"}
    assert schedules["train-nightly"].active and schedules["train-nightly"].parameters == {"mode": "train"}
    assert schedules["train-nightly"].schedule.cron == "0 2 * * *"
    # Off until the user serves the exemplar rule; when on, its runs pass the flow's own `mode` parameter.
    assert not schedules["refresh-hourly"].active and schedules["refresh-hourly"].parameters == {"mode": "refresh"}
    assert schedules["refresh-hourly"].schedule.cron == "0 * * * *"
    assert "mode" in retrain.parameter_openapi_schema["properties"]
    limit = retrain.global_concurrency_limit
    assert limit.limit == 1 and retrain.concurrency_options.collision_strategy == ConcurrencyLimitStrategy.ENQUEUE
    # no path: each worker's TQC_PROJECT_DIR names its checkout when it runs the flow
    assert retrain.pull_steps == [{"tqc.worker.project_checkout": {}}]


def test_a_worker_without_tqc_project_dir_is_told_in_one_line_to_set_it(prefect_harness, tmp_path, monkeypatch):
    """prefect.yaml's pull step, run as a worker runs it: with TQC_PROJECT_DIR unset, Prefect's own step went into the
    run's temporary folder, and the run crashed on "No such file or directory: '/tmp/tmp…prefect/flows/retrain.py'"."""
    import asyncio

    import pytest
    from prefect.deployments.steps.core import StepExecutionError, run_steps

    pull = yaml.safe_load((REPO / "prefect.yaml").read_text())["pull"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TQC_PROJECT_DIR", raising=False)
    with pytest.raises(StepExecutionError) as unset:
        asyncio.run(run_steps(pull))
    assert str(unset.value.__cause__) == (
        "TQC_PROJECT_DIR is not set: set TQC_PROJECT_DIR on this worker to the tqc checkout the flows run in (the "
        "folder with params.yaml and flows/), e.g. `TQC_PROJECT_DIR=$PWD prefect worker start --pool gpu` from it")
    monkeypatch.setenv("TQC_PROJECT_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(StepExecutionError) as missing:
        asyncio.run(run_steps(pull))
    assert str(missing.value.__cause__).startswith(f"TQC_PROJECT_DIR={tmp_path / 'nowhere'}: No such file or directory: ")
    checkout = tmp_path / "checkout"
    (checkout / "flows").mkdir(parents=True)
    monkeypatch.setenv("TQC_PROJECT_DIR", str(checkout))
    assert asyncio.run(run_steps(pull))["directory"] == os.getcwd() == str(checkout)


def test_a_run_whose_worker_lacks_tqc_project_dir_says_why_in_its_state(prefect_harness, tmp_path):
    """The pull step's one line reached only the worker's console (Prefect 3.8 runs pull steps in a supervisor process
    that prints their traceback to its stderr): the run's state, which the UI and an automation show, said "Process
    exited with status code: 1. Process exited with a general error.", naming no variable."""
    import subprocess

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    from tests.flows.conftest import PREFECT, deploy_retrain_for_a_worker

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    env = deploy_retrain_for_a_worker(checkout, tmp_path, PREFECT_API_URL.value())
    del env["TQC_PROJECT_DIR"]  # the worker's: unset
    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(client.read_deployment_by_name("retrain/retrain-nightly").id)
        worker = subprocess.run(PREFECT + ["worker", "start", "--pool", "gpu", "--run-once"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        state = client.read_flow_run(run.id).state
    assert state.is_crashed(), f"{state}\n{worker.stdout[-3000:]}\n{worker.stderr[-3000:]}"
    assert state.message == (  # the runner's own Crashed state, proposed when the process exited, refused
        "TQC_PROJECT_DIR is not set: set TQC_PROJECT_DIR on this worker to the tqc checkout the flows run in (the "
        "folder with params.yaml and flows/), e.g. `TQC_PROJECT_DIR=$PWD prefect worker start --pool gpu` from it")


def test_a_server_that_does_not_answer_holds_up_the_pull_steps_error_only_briefly(tmp_path):
    """Marking the run Crashed went through Prefect's client retries: 6 tries of 60 s against a server that accepts
    connections but never answers, so the worker's one line came some 6 minutes late. One try, MARK_SECONDS long."""
    import socket
    import subprocess
    import sys

    silent = socket.socket()  # the kernel completes connections to a listening socket; nothing ever reads them
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    env = {key: value for key, value in os.environ.items() if key != "TQC_PROJECT_DIR"}
    env.update(PREFECT_API_URL=f"http://127.0.0.1:{silent.getsockname()[1]}/api",
               PREFECT__FLOW_RUN_ID="8b5e6a3c-0000-4000-8000-000000000001", PYTHONPATH=str(REPO / "src"))
    # timed in the child, after its imports: a loaded machine's slow import of prefect is not the wait under test
    step = ("import time\nimport prefect.client.orchestration, prefect.deployments.steps, prefect.runtime, prefect.states\n"
            "import tqc.worker as worker\nworker.MARK_SECONDS = 2.0\nstarted = time.monotonic()\n"
            "try:\n    worker.project_checkout()\nexcept worker.ProjectDirError as error:\n    print('raised:', error)\n"
            "print('seconds:', time.monotonic() - started)")
    try:
        done = subprocess.run([sys.executable, "-c", step], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)
    finally:
        silent.close()
    assert done.stdout.startswith("raised: TQC_PROJECT_DIR is not set"), done.stderr[-2000:]
    assert "could not mark flow run 8b5e6a3c-0000-4000-8000-000000000001 crashed: ReadTimeout" in done.stderr
    seconds = float(done.stdout.rsplit("seconds:", 1)[1])
    assert seconds < 20, seconds  # one try of MARK_SECONDS, not six of Prefect's client retries
