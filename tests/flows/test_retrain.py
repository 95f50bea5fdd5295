"""The retrain flow under Prefect's test harness, on a tiny model and synthetic data."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flows.retrain import retrain
from tests.flows.conftest import REPO, added_rows, drop, unseen_questions
from tqc.config import read_yaml

pytestmark = pytest.mark.usefixtures("prefect_harness")


def registry(project: Path):
    """An MLflow client on the project's own local store, where its retrains record and register."""
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{project / 'mlflow.db'}")


def champion_version(project: Path) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return str(registry(project).get_model_version_by_alias("tqc-admc", "champion").version)
    except MlflowException:
        return None


def manifest(project: Path) -> list[dict]:
    path = project / "data" / "archive" / "manifest.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def latest_artifact_markdown(contains: str, timeout: float = 30.0) -> str:
    """The newest `retrain-summary` artifact that mentions `contains`, read through the REST API
    (this Prefect client's read_artifacts sends nulls its server rejects); artifacts land
    asynchronously, so poll briefly."""
    from prefect.client.orchestration import get_client

    deadline = time.time() + timeout
    with get_client(sync_client=True) as client:
        while True:
            response = client.request("POST", "/artifacts/filter", json={
                "artifacts": {"key": {"any_": ["retrain-summary"]}}, "sort": "CREATED_DESC", "limit": 5, "offset": 0})
            response.raise_for_status()
            found = [a["data"] for a in response.json() if contains in a["data"]]
            if found or time.time() > deadline:
                return found[0] if found else ""
            time.sleep(0.5)


def test_a_file_is_merged_trained_judged_then_nothing_then_a_repeat_adds_nothing(project):
    rows = [(q, "LOC") for q in unseen_questions(project, "LOC", 4)] + [(q, "HUM") for q in unseen_questions(project, "HUM", 4)]
    drop(project, "batch-1.csv", rows)

    first = retrain(params_path="params.yaml")
    assert first["status"] == "retrained" and first["accepted"] == 8 and first["promoted"]
    assert sorted(r["text"] for r in added_rows(project)) == sorted(t for t, _ in rows)  # grew by exactly the accepted rows
    assert champion_version(project) == "1"
    assert (project / "data" / "raw" / "labeled.jsonl.dvc").exists()  # the data version DVC recorded
    assert not (project / "data" / "incoming" / "batch-1.csv").exists() and manifest(project)[0]["accepted"] == 8
    markdown = latest_artifact_markdown("batch-1.csv")
    assert "batch-1.csv" in markdown and "Promoted" in markdown
    assert not (project / "data" / "retrain").exists()  # the staging folder (copies, models) goes with the run

    assert retrain(params_path="params.yaml") == {"status": "nothing to do"}

    archived = Path(manifest(project)[0]["archived_as"])
    drop(project, "batch-1-again.csv", [])
    (project / "data" / "incoming" / "batch-1-again.csv").write_bytes(archived.read_bytes())  # the same file, redelivered
    again = retrain(params_path="params.yaml")
    assert again["status"] == "no rows accepted" and len(added_rows(project)) == 8
    assert again["new_files"] == 0 and again["repeats"] == 1  # a repeat only: `python flows/retrain.py` exits 0
    assert manifest(project)[-1]["outcome"] == "repeat" and champion_version(project) == "1"


def test_the_retrain_runs_record_the_params_the_commit_and_each_epochs_curves(project):
    """A retrain's MLflow runs held no params and only stage two's best figure: nothing told what its challenger was
    trained with, nor how its stages' epochs went, where a `dvc repro`'s runs have both."""
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    assert retrain(params_path="params.yaml")["status"] == "retrained"

    client = registry(project)
    runs = {run.info.run_name: run for run in client.search_runs([client.get_experiment_by_name("flows").experiment_id])}
    params = read_yaml((project / "params.yaml").read_text())
    flow_run = runs["retrain"].data
    assert flow_run.params["stage_one.epochs"] == str(params["stage_one"]["epochs"])
    assert flow_run.params["seed"] == str(params["seed"]) and not any(k.startswith("tune.") for k in flow_run.params)
    assert flow_run.tags["tqc.git_commit"] and flow_run.tags["tqc.retrain.mode"] == "train"
    trained = runs["train"].info.run_id
    for stage in ("stage_one", "stage_two"):
        steps = [point.step for point in client.get_metric_history(trained, f"{stage}.validation_macro_f1")]
        assert steps == list(range(params[stage]["epochs"] + 1)), stage  # epoch 0 (the start) to the last
    # and the challenger's figure, the epoch it kept, as a `dvc repro`'s stage two logs it
    curve = {point.value for point in client.get_metric_history(trained, "stage_two.validation_macro_f1")}
    assert runs["train"].data.metrics["stage_two.best_validation_macro_f1"] in curve


def test_bad_rows_go_to_quarantine_and_the_good_ones_are_used(project, tmp_path):
    subprocess.run(["dvc", "remote", "add", "-q", "-d", "store", str(tmp_path / "remote")], check=True)
    good = [(q, "NUM") for q in unseen_questions(project, "NUM", 3)]
    bad = [("   ", "NUM"), (unseen_questions(project, "LOC", 1)[0], "NOT_A_CLASS")]
    drop(project, "mixed.csv", good + bad)

    result = retrain(params_path="params.yaml")
    assert result["status"] == "retrained" and result["accepted"] == 3
    assert sorted(r["text"] for r in added_rows(project)) == sorted(t for t, _ in good)
    quarantined = [json.loads(line) for line in (project / "data" / "quarantine" / "incoming.jsonl").read_text().splitlines()]
    assert sorted(q["line"] for q in quarantined) == [5, 6]  # header is line 1: the two bad rows, by file line
    assert all(q["file"].endswith("mixed.csv") for q in quarantined)
    assert result["dvc"]["pushed"] and any((tmp_path / "remote").rglob("*"))  # the new data version is on the remote


def refusing_remote(project: Path, tmp_path: Path, monkeypatch) -> None:
    """A default DVC remote whose every `dvc push` fails, as an unreachable one's does, with no waits between tries."""
    from tqc import retrain as steps
    from tqc.retraining import data_versions as retrain_dvc

    subprocess.run(["dvc", "remote", "add", "-q", "-d", "store", str(tmp_path / "remote")], check=True)
    real_dvc = retrain_dvc._dvc

    def dvc(command, *arguments):
        if command == "push":
            raise steps.RetrainCommitError("dvc push failed (exit 1): ERROR: failed to push data to the cloud - 403")
        return real_dvc(command, *arguments)

    monkeypatch.setattr(retrain_dvc, "_dvc", dvc)
    monkeypatch.setattr(retrain_dvc, "PUSH_RETRY_WAITS", (0.0, 0.0))


def test_a_push_that_keeps_failing_fails_the_run_and_the_script_and_keeps_the_commit(project, tmp_path, monkeypatch):
    """After a `dvc push` that failed its retries the run Completed and `python flows/retrain.py` exited 0: neither
    cron nor a Prefect automation noticed that the remote lacked the data the champion was trained on."""
    from flows.retrain import main
    from tqc import retrain as steps

    refusing_remote(project, tmp_path, monkeypatch)
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    state = retrain(params_path="params.yaml", return_state=True)
    assert state.is_failed(), state
    assert state.message.startswith("the new data version (data/raw/labeled.jsonl.dvc) is committed and its challenger "
                                    "promoted, but it is not on the DVC remote")
    assert "failed to push data to the cloud - 403; push it by hand with `dvc push data/raw/labeled.jsonl.dvc`" in state.message
    failure = state.result(raise_on_failure=False)
    assert isinstance(failure, steps.PushFailed)  # carrying what the run did, as a completed run returns it
    assert failure.result["status"] == "retrained" and failure.result["accepted"] == 3 and failure.result["promoted"]
    assert failure.result["dvc"]["added"] == ["data/raw/labeled.jsonl.dvc"] and not failure.result["dvc"]["pushed"]
    assert "403" in failure.result["dvc"]["push_failed"]
    assert len(added_rows(project)) == 3 and champion_version(project) == "1"  # nothing undone
    assert not (project / "data" / "incoming" / "one.csv").exists()
    assert "**not on the DVC remote**, the push failed" in latest_artifact_markdown("one.csv")

    drop(project, "two.csv", [(q, "NUM") for q in unseen_questions(project, "NUM", 3)])
    with pytest.raises(SystemExit) as exited:  # the script: non-zero, one line
        main([])
    message = str(exited.value)
    assert message.startswith("retrain: the new data version (data/raw/labeled.jsonl.dvc) is committed and its "
                              "challenger") and "\n" not in message and "403" in message
    assert len(added_rows(project)) == 6

    set_params(project, retrain={"on_push_failure": "warn"})  # a remote that is a best-effort copy: the run completes
    drop(project, "three.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 3)])
    result = retrain(params_path="params.yaml")
    assert result["status"] == "retrained" and "403" in result["dvc"]["push_failed"] and len(added_rows(project)) == 9


def test_a_run_whose_push_and_gate_both_fail_names_both_and_the_next_run_pushes_that_version_again(project, tmp_path,
                                                                                                     monkeypatch):
    """A run whose `dvc push` failed its tries and whose gate then raised failed with the gate's message alone, and
    its challenger's mark did not say the data was unpushed: the next run judged the challenger and completed, and cron
    never learnt that the remote lacked the data the champion was trained on."""
    from flows.retrain import main
    from tqc import retrain as steps
    from tqc.stages import promote

    def registry_down(*args, **kwargs):
        raise RuntimeError("the model registry is unreachable")

    real_run = promote.run
    refusing_remote(project, tmp_path, monkeypatch)
    monkeypatch.setattr(promote, "run", registry_down)
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    state = retrain(params_path="params.yaml", return_state=True)
    assert state.is_failed(), state
    assert state.message.startswith("the model registry is unreachable; and the new data version "
                                    "(data/raw/labeled.jsonl.dvc) is committed, but it is not on the DVC remote")
    assert "403; push it by hand with `dvc push data/raw/labeled.jsonl.dvc`" in state.message
    failure = state.result(raise_on_failure=False)
    assert isinstance(failure, steps.JudgeFailedUnpushed) and isinstance(failure.__cause__, RuntimeError)
    assert len(added_rows(project)) == 3 and champion_version(project) is None  # committed, not judged

    with pytest.raises(steps.JudgeFailedUnpushed) as again:  # both still down: the next run says both again
        retrain(params_path="params.yaml")
    assert str(again.value).startswith("the model registry is unreachable; and the data version the last run "
                                       "committed (data/raw/labeled.jsonl.dvc) was pushed again, but it is still not "
                                       "on the DVC remote") and "`dvc push data/raw/labeled.jsonl.dvc`" in str(again.value)

    monkeypatch.setattr(promote, "run", real_run)  # the registry back, the remote still down: judged, and exit 1
    with pytest.raises(SystemExit) as exited:
        main([])
    assert str(exited.value).startswith("retrain: the data version the last run committed (data/raw/labeled.jsonl.dvc) "
                                        "was pushed again, but it is still not on the DVC remote")
    assert champion_version(project) == "1" and retrain(params_path="params.yaml") == {"status": "nothing to do"}


def test_a_new_standard_question_arrives_with_its_examples(project):
    inbox = project / "data" / "incoming"
    inbox.mkdir(parents=True)
    (inbox / "catalog-2026-11.csv").write_text("class_id,text\nDESC,What does it mean?\n")
    drop(project, "new-class.csv", [("what does chess mean", "DESC"), ("what does tea mean", "DESC"),
                                    ("what does gold mean", "DESC"), ("what does music mean", "DESC")])
    result = retrain(params_path="params.yaml")
    assert result["status"] == "retrained" and result["new_classes"] == 1 and result["accepted"] == 4
    catalog = [json.loads(line) for line in (project / "data" / "raw" / "catalog.jsonl").read_text().splitlines()]
    assert catalog == [{"class_id": "DESC", "text": "What does it mean?", "derived": False}]


def test_two_retrains_never_run_at_once(project):
    from tqc.config import load_params
    from tqc.retrain import retrain_lock

    drop(project, "a.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])
    with retrain_lock(load_params("params.yaml").retrain):
        assert retrain(params_path="params.yaml") == {"status": "busy"}  # one warning line, not a failed flow
    assert (project / "data" / "incoming" / "a.csv").exists() and not added_rows(project)


def test_files_arriving_during_a_retrain_are_kept_for_the_next_one(project):
    first = [(q, "LOC") for q in unseen_questions(project, "LOC", 3)]
    late = [(q, "LOC") for q in unseen_questions(project, "LOC", 3, skip=3)]
    drop(project, "first.csv", first)

    retrain_ended = threading.Event()

    def deliver_when_staging_starts():
        while not (project / "data" / "retrain" / "raw").exists():
            if retrain_ended.is_set():
                return  # it ended before staging: the assertion below says so, the test does not hang
            time.sleep(0.05)
        drop(project, "late.csv", late)

    courier = threading.Thread(target=deliver_when_staging_starts, daemon=True)
    courier.start()
    try:
        result = retrain(params_path="params.yaml")
    finally:
        retrain_ended.set()
    courier.join(timeout=10)
    assert (project / "data" / "incoming" / "late.csv").exists(), "the retrain ended before it staged anything"
    assert result["accepted"] == 3

    second = retrain(params_path="params.yaml")
    assert second["accepted"] == 3
    texts = [r["text"] for r in added_rows(project)]
    assert sorted(texts) == sorted(t for t, _ in first + late) and len(texts) == len(set(texts))  # none lost, none twice


def test_a_killed_retrain_leaves_the_champion_and_the_raw_data_as_they_were(project):
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    assert retrain(params_path="params.yaml")["promoted"]
    raw_before = (project / "data" / "raw" / "labeled.jsonl").read_bytes()
    champion_before = champion_version(project)
    drop(project, "two.csv", [(q, "NUM") for q in unseen_questions(project, "NUM", 3)])

    output = project.parent / "flow-output.log"  # why, should the flow end before it is killed
    with output.open("wb") as sink:
        flow = subprocess.Popen([sys.executable, str(REPO / "flows" / "retrain.py")], cwd=project, env=os.environ.copy(),
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    training = project / "data" / "retrain" / "models"
    deadline = time.time() + 300
    while not training.exists() and flow.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert flow.poll() is None, f"the flow ended before training started: {output.read_text(errors='replace')[-3000:]}"
    assert training.exists(), "no training started within 300 s: the kill would not be mid-training"
    os.killpg(flow.pid, signal.SIGKILL)  # mid-training, no chance to clean up
    flow.wait()

    assert (project / "data" / "raw" / "labeled.jsonl").read_bytes() == raw_before
    assert champion_version(project) == champion_before
    assert (project / "data" / "incoming" / "two.csv").exists()
    after = retrain(params_path="params.yaml")  # the lock died with the process; the file is picked up again
    assert after["status"] == "retrained" and after["accepted"] == 3


def test_a_failed_data_commit_leaves_the_raw_data_the_champion_and_the_inbox_as_they_were(project, monkeypatch):
    from tqc.retraining import commit as retrain_commit

    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    assert retrain(params_path="params.yaml")["promoted"]
    raw_before = (project / "data" / "raw" / "labeled.jsonl").read_bytes()
    champion_before = champion_version(project)
    drop(project, "two.csv", [(q, "NUM") for q in unseen_questions(project, "NUM", 3)])

    def disk_full(paths, push):  # a push that fails is tried again, then left to be redone (test_retrain_steps)
        raise OSError(28, "dvc add: No space left on device")

    monkeypatch.setattr(retrain_commit, "dvc_record", disk_full)
    with pytest.raises(OSError, match="No space left"):
        retrain(params_path="params.yaml")
    assert (project / "data" / "raw" / "labeled.jsonl").read_bytes() == raw_before
    assert champion_version(project) == champion_before
    assert (project / "data" / "incoming" / "two.csv").exists()


def test_a_challenger_committed_but_never_judged_is_judged_by_the_next_run(project, monkeypatch):
    """The commit archives the delivery before the gate runs: a gate that failed (the registry down) left the grown
    data untrained and unjudged until another file came, and on a first delivery no champion ever existed."""
    from tqc.stages import promote

    real_run = promote.run
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])

    def registry_down(*args, **kwargs):
        raise RuntimeError("the model registry is unreachable")

    monkeypatch.setattr(promote, "run", registry_down)
    with pytest.raises(RuntimeError, match="registry is unreachable"):
        retrain(params_path="params.yaml")
    assert not (project / "data" / "incoming" / "one.csv").exists() and manifest(project)[0]["accepted"] == 3  # committed
    assert champion_version(project) is None
    assert (project / "data" / "retrain" / "judge-pending.json").exists()

    with pytest.raises(RuntimeError, match="registry is unreachable"):  # still down: kept, and tried first next time
        retrain(params_path="params.yaml")
    assert (project / "data" / "retrain" / "judge-pending.json").exists()

    monkeypatch.setattr(promote, "run", real_run)
    again = retrain(params_path="params.yaml")  # an empty inbox
    assert again == {"status": "nothing to do", "pending_challenger_promoted": True}
    assert champion_version(project) == "1"
    assert not (project / "data" / "retrain").exists()  # the mark, and the judged challenger's folders, gone
    assert retrain(params_path="params.yaml") == {"status": "nothing to do"}
    client = registry(project)  # the runs that judged it say so
    assert client.search_runs([client.get_experiment_by_name("flows").experiment_id],
                              "tags.`tqc.retrain.judge` = 'pending'")


KILLED_AROUND_COMMIT = """
import os, sys
sys.path.insert(0, sys.argv[2])
from flows.retrain import retrain
from tqc import retrain as steps
from tqc.retraining import commit as retrain_commit, data_versions as retrain_dvc, renew as retrain_renew

if sys.argv[1] == "after":  # the commit returned: killed while the task's end is reported, or as the judge starts
    commit = steps.commit
    steps.commit = lambda *args: (commit(*args), os._exit(137))
else:  # killed inside the commit, every change made (the challenger's mark too) but its journal not closed
    retrain_commit.CommitJournal.close = lambda journal: os._exit(137)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
retrain(params_path="params.yaml")
"""


def killed_around_commit(project: Path, when: str) -> None:
    """The flow in a process of its own, on the harness's server, killed (`when`) with no chance to clean up."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    with open(project.parent / f"killed-{when}.log", "w+") as log:  # not a pipe: nothing waits on an orphan holding it
        flow = subprocess.Popen([sys.executable, "-c", KILLED_AROUND_COMMIT, when, str(REPO)], cwd=project, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = flow.wait(timeout=900)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(flow.pid, signal.SIGKILL)  # what the kill left running
        log.seek(0)
        assert code == 137, log.read()[-6000:]


def test_a_run_killed_right_after_its_commit_has_the_next_run_judge_its_challenger(project):
    """The flow marked the challenger pending only after the commit task returned: a run killed between the two
    (Prefect reports the task's end to its server there) left the delivery archived and the grown data committed,
    and no run ever judged it; on a first delivery no champion ever existed."""
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    killed_around_commit(project, "after")
    assert not (project / "data" / "incoming" / "one.csv").exists() and manifest(project)[0]["accepted"] == 3  # committed
    assert champion_version(project) is None

    assert retrain(params_path="params.yaml") == {"status": "nothing to do", "pending_challenger_promoted": True}
    assert champion_version(project) == "1"
    assert not (project / "data" / "retrain" / "judge-pending.json").exists()


def test_a_run_killed_inside_its_commit_is_rolled_back_and_its_challenger_not_judged(project):
    """A commit killed before its journal closed is put back: its challenger, trained on data no longer committed,
    is not judged (its mark goes with the roll-back, which comes before the pending judge), and the delivery is
    merged and trained again."""
    rows = [(q, "HUM") for q in unseen_questions(project, "HUM", 3)]
    drop(project, "one.csv", rows)
    killed_around_commit(project, "inside")
    assert (project / "data" / "retrain" / "commit-journal").exists()

    after = retrain(params_path="params.yaml")
    assert after["status"] == "retrained" and after["accepted"] == 3 and after["promoted"]
    assert "pending_challenger_promoted" not in after  # no challenger of the rolled-back data was judged
    assert sorted(r["text"] for r in added_rows(project)) == sorted(t for t, _ in rows)  # merged once
    assert champion_version(project) == "1" and len(manifest(project)) == 1
    assert not (project / "data" / "retrain" / "judge-pending.json").exists()


def set_params(project: Path, **sections) -> None:
    """Update params.yaml sections in place: set_params(project, promote={"rule": "exemplars"})."""
    import yaml

    path = project / "params.yaml"
    params = read_yaml(path.read_text())
    for section, values in sections.items():
        params[section].update(values)
    path.write_text(yaml.safe_dump(params))


def registered_file(project: Path, version: str, artifact: str) -> Path:
    """A registered version's artifact (its model folder, its exemplars), downloaded."""
    import mlflow

    from tqc.registry import registered_artifacts

    mlflow.set_tracking_uri(f"sqlite:///{project / 'mlflow.db'}")
    return registered_artifacts("tqc-admc", version, project / "downloads" / version)[0][artifact]


def test_a_refresh_serves_the_new_questions_with_the_champions_encoder_and_trains_nothing(project, monkeypatch):
    import tqc.pipeline
    from tqc.registry import folder_digest

    set_params(project, promote={"rule": "exemplars"})
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    first = retrain(params_path="params.yaml")  # trains the champion the refresh starts from
    assert first["mode"] == "train" and first["promoted"] and champion_version(project) == "1"

    def no_training(*args, **kwargs):
        raise AssertionError("a refresh trained a model")

    monkeypatch.setattr(tqc.pipeline, "train_chain", no_training)
    set_params(project, retrain={"mode": "refresh"})
    new = [(q, "LOC") for q in unseen_questions(project, "LOC", 4)]
    drop(project, "two.csv", new)
    second = retrain(params_path="params.yaml")

    assert second["status"] == "retrained" and second["mode"] == "refresh" and second["accepted"] == 4
    assert {t for t, _ in new} <= {r["text"] for r in added_rows(project)}  # the data grew as for a training retrain
    # A new version: version 1's encoder to the byte, and exemplars that now hold the new questions
    # (those the hash split sends to train; the others are in validation, where the gate judges it).
    assert folder_digest(registered_file(project, "2", "model")) == folder_digest(registered_file(project, "1", "model"))
    exemplars_before = {json.loads(line)["text"] for line in registered_file(project, "1", "exemplars").read_text().splitlines()}
    exemplars_after = {json.loads(line)["text"] for line in registered_file(project, "2", "exemplars").read_text().splitlines()}
    assert exemplars_before < exemplars_after and exemplars_after - exemplars_before <= {t for t, _ in new}
    assert registry(project).get_model_version("tqc-admc", "2").tags["refreshed_from"] == "1"
    markdown = latest_artifact_markdown("two.csv")
    assert "Refreshed, not trained: version 1's encoder with the grown labeled questions as its exemplars." in markdown
    # judged as a refresh: its bound is promote.refresh_min_improvement, not a training's min_improvement
    assert "a refresh of the champion's encoder needs only to be no worse" in markdown


def test_a_refresh_without_a_champion_says_what_to_do_changes_nothing_and_is_not_retried(project, monkeypatch):
    from tqc import retrain as steps
    from tqc.retraining import renew as retrain_renew

    set_params(project, promote={"rule": "exemplars"}, retrain={"retries": 2})
    lookups = []
    looked_up = retrain_renew.champion_model
    monkeypatch.setattr(retrain_renew, "champion_model", lambda *args: lookups.append(args) or looked_up(*args))
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    state = retrain(params_path="params.yaml", mode="refresh", return_state=True)  # the parameter, over params.yaml's train
    # The run fails with the reason as its message (no traceback through Prefect's engine), and the caller gets the error
    assert state.is_failed() and state.message.startswith("retrain.mode refresh: the registry (")
    assert "has no tqc-admc@champion to refresh; train one first" in state.message
    assert isinstance(state.result(raise_on_failure=False), steps.RefreshError)
    assert len(lookups) == 1  # a missing champion is permanent: no retry
    assert not added_rows(project) and (project / "data" / "incoming" / "one.csv").exists()


def test_only_a_failure_a_retry_could_change_is_retried():
    from types import SimpleNamespace

    from flows.retrain import retry_unless_permanent
    from tqc import retrain as steps
    from tqc.config import ConfigError
    from tqc.prior import StaleEntry
    from tqc.readers import ReaderError
    from tqc.stages.promote import ChampionUnavailable
    from tqc.stages.validate import ValidationFailed

    def failed_with(exc):
        return SimpleNamespace(result=lambda raise_on_failure: exc)

    permanent = [steps.RefreshError("no champion"), ConfigError("bad key"), ReaderError("bad row"),
                 ValidationFailed("critical expectation"), StaleEntry("prior.json: fitted for earlier weights"),
                 ImportError("FAISS is not installed: `make run` installs it"),  # retried twice, 10 s apart, before
                 ChampionUnavailable("tqc-admc v1, the champion, cannot be read (…); repair the champion's artifacts")]
    assert [retry_unless_permanent(None, None, failed_with(exc)) for exc in permanent] == [False] * len(permanent)
    assert retry_unless_permanent(None, None, failed_with(RuntimeError("registry unreachable"))) is True
    assert retry_unless_permanent(None, None, failed_with(OSError("disk busy"))) is True


def test_bad_params_fail_the_run_with_the_key_and_the_reason(project):
    from tqc.config import ConfigError

    set_params(project, retrain={"mode": "trian"})
    state = retrain(params_path="params.yaml", return_state=True)
    # the run's message is the error's own, not "Flow run encountered an exception: ConfigError: …" with a traceback
    assert state.is_failed() and state.message.startswith("params.yaml: invalid parameters")
    assert "retrain.mode: Input should be 'train' or 'refresh' (got 'trian')" in state.message
    assert isinstance(state.result(raise_on_failure=False), ConfigError)


def test_bad_data_fails_the_run_with_the_file_and_the_reason_and_the_script_says_it_in_one_line(project):
    """An input error (tqc.errors.input_errors: here the dataset's train file gone) failed the run as "Flow run
    encountered an exception: ReaderError: …" with Prefect's traceback, and `python flows/retrain.py` ended in a
    traceback of its own, where bad params were one line."""
    from flows.retrain import main
    from tqc.readers import ReaderError

    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    train_file = Path(read_yaml((project / "params.yaml").read_text())["data"]["data_dir"]) / "train.csv"
    train_file.unlink()
    state = retrain(params_path="params.yaml", return_state=True)
    assert state.is_failed() and state.message.startswith(f"data.custom.train 'train.csv': no file {train_file}")
    assert isinstance(state.result(raise_on_failure=False), ReaderError)
    with pytest.raises(SystemExit) as exited:
        main([])
    assert str(exited.value).startswith("retrain failed: data.custom.train 'train.csv': no file")
    assert (project / "data" / "incoming" / "one.csv").exists() and not added_rows(project)


def test_a_champion_the_gate_cannot_ask_fails_the_run_in_one_line_and_leaves_the_challenger_pending(project, monkeypatch):
    """ChampionUnavailable failed the run as "Flow run encountered an exception: …" with Prefect's traceback, where
    bad params and bad data were one line; it names the version and the way out, so its message is the whole story."""
    from tqc import retrain as steps
    from tqc.config import load_params
    from tqc.stages import promote

    def champion_gone(*args, **kwargs):
        raise promote.ChampionUnavailable("tqc-admc v1, the champion, cannot be read (OSError: gone); challenger v2 "
                                          "is registered and not judged")

    monkeypatch.setattr(promote, "run", champion_gone)
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    state = retrain(params_path="params.yaml", return_state=True)
    assert state.is_failed() and state.message.startswith("tqc-admc v1, the champion, cannot be read (OSError: gone)")
    assert isinstance(state.result(raise_on_failure=False), promote.ChampionUnavailable)
    assert steps.pending_judge(load_params("params.yaml").retrain) is not None  # the next run judges it first


def test_the_flow_script_takes_the_flows_parameters_on_its_command_line(monkeypatch, capsys):
    """`python flows/retrain.py` read no argument: `--mode refresh` trained (params.yaml's mode), `--help` ran a retrain."""
    import flows.retrain as script

    runs = []
    monkeypatch.setattr(script, "retrain", lambda *parameters: runs.append(parameters) or {"status": "nothing to do"})
    script.main(["--mode", "refresh", "--params", "team.yaml"])
    script.main([])
    assert runs == [("team.yaml", "refresh"), ("params.yaml", None)]  # None: the params file's retrain.mode
    for arguments in (["--help"], ["--mode", "refrsh"]):
        with pytest.raises(SystemExit):
            script.main(arguments)
    assert len(runs) == 2 and "--mode {train,refresh}" in capsys.readouterr().out


def test_the_flow_script_serves_the_flow_on_a_schedule_in_its_own_process(monkeypatch, capsys):
    """One machine, no work pool: `--serve` registers the schedule and runs it with Prefect's `serve` (faked here: it
    loops until stopped). The embedded server has no scheduler, so without a server it stops and says what to do."""
    from datetime import timedelta

    from prefect.settings import PREFECT_API_URL, temporary_settings

    import flows.retrain as script

    served = []
    monkeypatch.setattr(script, "serve", lambda *deployments, **options: served.append((deployments, options)),
                        raising=False)
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        script.main(["--serve", "--interval", "3600", "--mode", "refresh"])
        script.main(["--serve", "--cron", "0 2 * * *", "--params", "team.yaml"])
    (hourly,), options = served[0]
    assert options == {"limit": 1} and hourly.name == "retrain-served" and hourly.entrypoint == "flows/retrain.py:retrain"
    assert [s.schedule.interval for s in hourly.schedules] == [timedelta(hours=1)]
    assert hourly.parameters == {"params_path": "params.yaml", "mode": "refresh"}
    (nightly,), _ = served[1]
    assert [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"]
    assert nightly.parameters == {"params_path": "team.yaml"}  # the params file's retrain.mode

    with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(SystemExit) as refused:
        script.main(["--serve", "--interval", "3600"])
    assert "PREFECT_API_URL is not set, and a schedule needs a Prefect server's scheduler" in str(refused.value)
    for arguments in (["--serve"], ["--cron", "0 2 * * *"], ["--serve", "--interval", "0"]):
        with pytest.raises(SystemExit):
            script.main(arguments)
    assert len(served) == 2 and "--serve takes a schedule" in capsys.readouterr().err
    # no seconds a schedule can hold: refused in the usage's line, not a traceback from timedelta
    for interval in ("nan", "inf", "1e300"):
        with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}), pytest.raises(SystemExit) as refused:
            script.main(["--serve", "--interval", interval])
        assert refused.value.code == 2
        assert f"--interval {float(interval):g}: the seconds between runs must be more than 0" in capsys.readouterr().err
    # nor a cron expression Prefect's schedule refuses: its ValidationError was a traceback
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}), pytest.raises(SystemExit) as refused:
        script.main(["--serve", "--cron", "0 2 * *"])
    assert refused.value.code == 2
    assert "--cron '0 2 * *': not a cron expression (five fields, e.g. '0 2 * * *')" in capsys.readouterr().err
    assert len(served) == 2


def test_a_refresh_answers_a_new_class_from_its_labeled_questions_alone(project):
    import mlflow.pyfunc
    import pandas as pd

    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    assert retrain(params_path="params.yaml")["promoted"]  # version 1: the standard-question rule, and no DESC
    set_params(project, promote={"rule": "exemplars"})
    inbox = project / "data" / "incoming"
    (inbox / "catalog-2026-11.csv").write_text("class_id,text\nDESC,What does it mean?\n")
    drop(project, "new-class.csv", [(f"what does {noun} mean", "DESC") for noun in ("chess", "tea", "gold", "music", "rain")])
    result = retrain(params_path="params.yaml", mode="refresh")
    assert result["mode"] == "refresh" and result["new_classes"] == 1 and result["accepted"] == 5
    assert "(version 1 serves the standard rule)" in latest_artifact_markdown("new-class.csv")  # the rule switch is said

    exemplars = [json.loads(line) for line in registered_file(project, "2", "exemplars").read_text().splitlines()]
    assert any(row["class_id"] == "DESC" for row in exemplars)  # the hash split kept some in train
    # (registered_file pointed MLflow at the project's registry.) Questions of the new class that no file held:
    unseen = [f"what does {noun} mean" for noun in ("water", "paper", "silver")]
    answers = {version: mlflow.pyfunc.load_model(f"models:/tqc-admc/{version}").predict(
        pd.DataFrame({"question": unseen}), params={"top_k": 10}) for version in ("1", "2")}
    assert "DESC" not in set(answers["1"]["class_id"])  # the old version cannot answer it ...
    assert set(answers["2"][answers["2"]["rank"] == 1]["class_id"]) == {"DESC"}  # ... the refreshed one does, untrained


def test_a_pending_challenger_that_can_never_be_judged_is_given_up_and_blocks_no_delivery(project, monkeypatch, caplog):
    from tqc import retrain as steps
    from tqc.prior import PriorFileError
    from tqc.stages import promote

    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    monkeypatch.setattr(promote, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("the registry is unreachable")))
    with pytest.raises(RuntimeError):
        retrain(params_path="params.yaml")
    monkeypatch.setattr(promote, "run", lambda *a, **k: (_ for _ in ()).throw(PriorFileError("prior.json: not a prior")))
    drop(project, "two.csv", [(q, "NUM") for q in unseen_questions(project, "NUM", 3)])
    steps_seen = []
    monkeypatch.setattr(steps, "stage", lambda files, *a: steps_seen.append([f.path.name for f in files]) or
                        (_ for _ in ()).throw(RuntimeError("stop after staging")))
    with pytest.raises(RuntimeError, match="stop after staging"):
        retrain(params_path="params.yaml")
    assert steps_seen == [["two.csv"]]  # the delivery after it was read
    assert not (project / "data" / "retrain" / "judge-pending.json").exists()
    assert "cannot be judged, and is given up: prior.json: not a prior" in caplog.text


def test_the_stages_own_lines_reach_the_flow_runs_logs(project):
    """Under Prefect's logging config the root logger is at WARNING: the stages' INFO lines (rows read, each epoch's
    validation figures) were dropped, so a scheduled retrain's logs said nothing of its training."""
    import logging

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    drop(project, "batch.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 3)])
    state = retrain(params_path="params.yaml", return_state=True)
    assert state.is_completed() and state.result()["status"] == "retrained"

    flow_run_id = state.state_details.flow_run_id
    deadline, lines = time.time() + 30, []
    with get_client(sync_client=True) as client:
        while not all(any(said in line for line in lines) for said in ("stage one: epoch 1", "classes added")) \
                and time.time() < deadline:
            time.sleep(0.5)  # the API's log worker sends in batches
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
            lines = [f"{log.name}: {log.message}" for log in logs]
    assert any(line.startswith("tqc.training: stage one: epoch 1") for line in lines), lines
    assert any(line.startswith("tqc.stages.stage_two: stage two:") for line in lines), lines
    # the gate's decision with its reasons, not only whether it promoted
    assert any(line.startswith("prefect.flow_runs: retrain: 3 rows and 0 classes added; promoted: no champion yet: the "
                               "first model becomes champion") for line in lines), lines
    assert logging.getLogger("tqc").level == logging.NOTSET and not logging.getLogger("tqc").handlers  # for the run only


def test_a_pending_mark_whose_challenger_is_gone_fails_the_run_in_one_line(project):
    """A commit's error (`RetrainCommitError`: here the last run's mark names a challenger whose folders are gone) names
    the file and the way out: the run fails with that message, not "Flow run encountered an exception: …" with
    Prefect's traceback, and `python flows/retrain.py` says it in one line; the delivery waits in the inbox."""
    from flows.retrain import main
    from tqc import retrain as steps
    from tqc.config import load_params
    from tqc.retraining.pending import mark_judge_pending

    retrain_params = load_params("params.yaml").retrain
    work = project / "data" / "retrain"
    mark_judge_pending(retrain_params, steps.Trained(work / "data", work / "models" / "stage_two", None, 0.5))
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    state = retrain(params_path="params.yaml", return_state=True)
    mark = steps.pending_judge_path(retrain_params)
    assert state.is_failed() and state.message.startswith(f"{mark}: the last run committed its data but did not judge "
                                                          "its challenger, and ")
    assert isinstance(state.result(raise_on_failure=False), steps.RetrainCommitError)
    with pytest.raises(SystemExit) as exited:
        main([])
    assert str(exited.value).startswith(f"retrain failed: {mark}: the last run committed") and "\n" not in str(exited.value)
    assert (project / "data" / "incoming" / "one.csv").exists() and not added_rows(project)


def test_a_training_that_fails_for_a_reason_a_retry_may_change_is_tried_again_as_retrain_retries_says(project, monkeypatch):
    """`retrain.retries` is for the steps that can flake (training, the registry): a training that raised an error a
    retry may change (a GPU's, say) was tried once only, were the step's retries not passed to its task."""
    from tqc import retrain as steps

    set_params(project, retrain={"retries": 2})
    tries = []

    def flaky(*args, **kwargs):
        tries.append(args)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(steps, "train", flaky)
    drop(project, "one.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 3)])
    with pytest.raises(RuntimeError, match="illegal memory access"):
        retrain(params_path="params.yaml")
    assert len(tries) == 3  # the first try and retrain.retries more
    assert not added_rows(project) and (project / "data" / "incoming" / "one.csv").exists()  # nothing committed


def test_the_flows_params_file_is_params_yaml_unless_a_run_names_another(project):
    """prefect.yaml's schedules pass only `mode`: their runs read the flow's default params file, the project's."""
    assert retrain() == {"status": "nothing to do"}


def test_a_line_from_a_thread_with_no_run_context_is_the_flow_runs_and_one_with_a_context_keeps_it():
    """The stages' lines from a thread with no run context (the readers of a launched stage's output) carried no flow
    run, and Prefect's API handler dropped them; one logged inside a run (a task's) is left to its own context."""
    import logging

    from prefect import flow

    from flows.retrain import _of_run

    def line() -> logging.LogRecord:
        return logging.LogRecord("tqc.training", logging.INFO, __file__, 1, "stage one: epoch 1", None, None)

    mark = _of_run("the-flow-run")
    outside = line()
    assert mark(outside) and outside.flow_run_id == "the-flow-run"
    marked = line()
    marked.flow_run_id = "another-run"
    assert mark(marked) and marked.flow_run_id == "another-run"

    @flow
    def in_a_run():
        record = line()
        mark(record)
        return getattr(record, "flow_run_id", None)

    assert in_a_run() is None  # the API handler takes the run from the context


def test_the_flow_script_exits_non_zero_for_a_delivery_that_added_nothing_but_not_for_repeats_alone(monkeypatch):
    """New files none of whose rows were accepted want a look (cron sees a non-zero exit); a delivery of files already
    merged (repeats) is no fault."""
    import flows.retrain as script

    outcomes = iter([{"status": "no rows accepted", "new_files": 1, "repeats": 0},
                     {"status": "no rows accepted", "new_files": 0, "repeats": 1}])
    monkeypatch.setattr(script, "retrain", lambda *parameters: next(outcomes))
    with pytest.raises(SystemExit) as exited:
        script.main([])
    assert str(exited.value) == ("retrain: no row of the delivery was accepted; data/archive/manifest.jsonl and the "
                                 "quarantine say why")
    assert script.main([]) is None


def test_the_flow_script_keeps_a_users_own_analytics_setting(monkeypatch):
    """The script turns the embedded server's usage report off (offline it logs an ERROR at each start), but a user's
    own PREFECT_SERVER_ANALYTICS_ENABLED stands."""
    import flows.retrain as script

    monkeypatch.setattr(script, "retrain", lambda *parameters: {"status": "nothing to do"})
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "true")
    script.main([])
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "true"
    monkeypatch.delenv("PREFECT_SERVER_ANALYTICS_ENABLED")
    script.main([])
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"


def test_a_gate_that_raises_is_named_with_the_unpushed_data_only_where_the_data_is_unpushed():
    """`naming_unpushed`: a gate's error in a run whose data version reached the remote (or made none) is the gate's
    own, as it was; only where the push failed does the run fail naming both, with the gate's error as its cause."""
    from flows.retrain import naming_unpushed
    from tqc import retrain as steps

    for result in ({"status": "nothing to do"}, {"dvc": {"added": ["data/raw/labeled.jsonl.dvc"], "pushed": True}}):
        with pytest.raises(RuntimeError) as raised, naming_unpushed(result):
            raise RuntimeError("the model registry is unreachable")
        assert type(raised.value) is RuntimeError and str(raised.value) == "the model registry is unreachable"
    unpushed = {"dvc": {"added": ["data/raw/labeled.jsonl.dvc"], "pushed": False, "push_failed": "403"}}
    with pytest.raises(steps.JudgeFailedUnpushed) as both, naming_unpushed(unpushed):
        raise RuntimeError("the model registry is unreachable")
    assert str(both.value).startswith("the model registry is unreachable; and the new data version "
                                      "(data/raw/labeled.jsonl.dvc) is committed, but it is not on the DVC remote")
    assert isinstance(both.value.__cause__, RuntimeError)
