"""A real cancel: a retrain deployment run by a worker of the process pool `gpu`, its training launched under
torchrun (`distributed.nproc_per_node: 2`, gloo here), cancelled with `prefect flow-run cancel` mid-training.

torchrun's training processes run in sessions of their own, so a flow run that died alone would leave them training
on the GPUs. Two things stop them, and either suffices: Prefect 3.8's runner sends SIGTERM to the flow run's whole
process group, torchrun included; and the flow process turns that SIGTERM into an exception, on which
`launched.wait_for_torchrun` asks torchrun to stop (for launchers that signal the flow's process alone). Checked by hand on
2026-11-27: with torchrun started in a session of its own and `_wait_for` not passing the stop on, this test failed,
its two ranks still training 120 s after the cancel; with either one back, it passed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import yaml

from tests.flows.conftest import PREFECT, deploy_retrain_for_a_worker, drop, unseen_questions


def _training_processes(project: Path) -> list[psutil.Process]:
    """Every live process of a tqc training command started in `project` (torchrun and its ranks)."""
    found = []
    for process in psutil.process_iter(["cmdline", "cwd", "status"]):
        try:
            command, cwd = process.info["cmdline"] or [], process.info["cwd"] or ""
        except psutil.Error:
            continue
        if "tqc.cli" in command and Path(cwd).is_relative_to(project) and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # it ended between the two questions
        return False


def _kill_all(processes: list[psutil.Process]) -> None:
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def _wait(condition, seconds: float, every: float = 0.5):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    return condition()


def test_a_cancelled_flow_run_stops_the_torchrun_processes_training_for_it(prefect_harness, project, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["distributed"]["nproc_per_node"] = 2
    params["stage_one"].update(epochs=10_000, patience=10_000)  # trains until stopped
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    drop(project, "delivery.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 3)])

    env = deploy_retrain_for_a_worker(project, tmp_path, PREFECT_API_URL.value())

    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(client.read_deployment_by_name("retrain/retrain-nightly").id)
    with open(tmp_path / "worker.log", "w") as log:  # a file, not a pipe nobody reads until the end (it would fill)
        worker = subprocess.Popen(PREFECT + ["worker", "start", "--pool", "gpu"], cwd=tmp_path, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert _wait(lambda: len(_training_processes(project)) >= 3, 300), "torchrun and its two processes never started"
        time.sleep(5)  # mid-epoch
        training = _training_processes(project)
        cancelled = subprocess.run(PREFECT + ["flow-run", "cancel", str(run.id)], cwd=tmp_path, env=env,
                                   capture_output=True, text=True)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr

        stopped = _wait(lambda: not any(_alive(p) for p in training) and not _training_processes(project), 120)
        with get_client(sync_client=True) as client:
            state = _wait(lambda: (s := client.read_flow_run(run.id).state).is_final() and s, 60)
    finally:
        # The flow run's process is in a session of its own (Prefect isolates it): the worker's group is not enough
        try:
            spawned = psutil.Process(worker.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            spawned = []
        os.killpg(worker.pid, 9)
        _kill_all(spawned)
        worker.wait()
        _kill_all(_training_processes(project))  # never leave one behind, whatever the test found

    log = (tmp_path / "worker.log").read_text(errors="replace")
    still = [p.info["cmdline"] for p in training if _alive(p)]
    assert stopped, f"still training 120 s after the cancel: {still}\n{log[-3000:]}"
    assert state and state.is_cancelled(), f"{state}\n{log[-3000:]}"
