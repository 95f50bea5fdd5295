"""A scratch project for the flows: tiny params, git + DVC initialised, Prefect's test harness."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from tests.conftest import CLASSES, NOUNS, dvc_init, tiny_params, write_custom_dataset

REPO = Path(__file__).resolve().parents[2]
PREFECT = [str(Path(sys.executable).parent / "prefect"), "--no-prompt"]


def deploy_from_a_checkout(checkout: Path, env: dict, *deploy: str, edit=lambda text: text) -> None:
    """docs/retrain.md's scale-out commands in `checkout`, given a copy of flows/ and prefect.yaml (its text through
    `edit`): the `gpu` process pool, then `prefect deploy` with `deploy`'s arguments. `env` names the server
    (PREFECT_API_URL); with TQC_PROJECT_DIR unset there, each worker's own names the checkout it runs in."""
    shutil.copytree(REPO / "flows", checkout / "flows")
    (checkout / "prefect.yaml").write_text(edit((REPO / "prefect.yaml").read_text()))
    for command in (["work-pool", "create", "gpu", "--type", "process", "--overwrite"], ["deploy", *deploy]):
        done = subprocess.run(PREFECT + command, cwd=checkout, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def deploy_retrain_for_a_worker(project: Path, tmp_path: Path, api_url: str) -> dict:
    """The retrain deployment on the server at `api_url`, deployed from another checkout, as from another machine,
    with TQC_PROJECT_DIR unset there: the worker's own value names its checkout, read when a run starts
    (tqc.worker.project_checkout). The project gets the flows, as a worker's checkout has them. → the worker's
    environment."""
    env = {**os.environ, "PREFECT_API_URL": api_url, "TQC_PROJECT_DIR": str(project),
           "PREFECT_HOME": str(tmp_path / "client-home")}
    deployer = tmp_path / "deployer"
    deployer.mkdir()
    deploy_from_a_checkout(deployer, {k: v for k, v in env.items() if k != "TQC_PROJECT_DIR"}, "--name", "retrain-nightly")
    shutil.copytree(REPO / "flows", project / "flows")
    return env


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry from the test server
    with contextlib.ExitStack() as harness:
        with _patient_health_checks():  # while the server starts only
            harness.enter_context(prefect_test_harness(server_startup_timeout=180))
        yield


@contextlib.contextmanager
def _patient_health_checks():
    """The harness polls the starting server's /health with httpx's default 5 s read timeout, and retries only a
    refused connection: on a loaded machine (`make test`'s two xdist processes on two cores, the other one training)
    a first answer slower than 5 s raised ReadTimeout, and every flow test of that process errored at setup
    (PrefectHQ/prefect#16397 is the same symptom). Its health checks get 60 s to answer; `server_startup_timeout`
    still bounds the whole wait."""
    import httpx
    from prefect.server.api import server

    class PatientClient(httpx.Client):  # a subclass, so isinstance checks elsewhere still hold
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("timeout", 60.0)
            super().__init__(*args, **kwargs)

    with mock.patch.object(server.httpx, "Client", PatientClient):
        yield


@pytest.fixture
def project(tmp_path, tiny_model_dir, monkeypatch) -> Path:
    project = tmp_path / "project"
    (project / "data" / "raw").mkdir(parents=True)
    shutil.copy(REPO / ".gitignore", project)  # what git and DVC ignore there, as in a checkout
    write_custom_dataset(tmp_path / "dataset")
    params = tiny_params(tmp_path / "dataset", tiny_model_dir)
    params["tracking"] = {"enabled": True, "uri": f"sqlite:///{project / 'mlflow.db'}", "experiment": "flows"}
    params["retrain"] = {**params["retrain"], "retries": 0, "retry_delay_seconds": 0}
    params["validate"]["max_quarantined_fraction"] = 1.0  # the synthetic train has sampled repeats
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(project)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["git", "init", "-q"], check=True)
    dvc_init(project)
    return project  # MLflow's global state is put back by the autouse fixture in tests/conftest.py


def unseen_questions(project: Path, label: str, count: int, skip: int = 0) -> list[str]:
    """Synthetic questions of one class that are in neither the dataset nor the additions yet."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    dataset = Path(params["data"]["data_dir"])
    known = "\n".join((dataset / f).read_text() for f in ("train.csv", "test.csv"))
    candidates = [t.format(n) for t in CLASSES[label][1] for n in NOUNS]
    fresh = [c for c in candidates if f"\n{c}," not in "\n" + known]
    return fresh[skip : skip + count]


def drop(project: Path, name: str, rows: list[tuple[str, str]]) -> Path:
    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True, exist_ok=True)
    path = inbox / name
    path.write_text("question,label\n" + "".join(f"{t},{l}\n" for t, l in rows))
    return path


def added_rows(project: Path) -> list[dict]:
    import json

    path = project / "data" / "raw" / "labeled.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
