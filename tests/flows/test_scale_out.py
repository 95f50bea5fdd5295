"""The scale-out path of docs/retrain.md, end to end on one machine: Prefect's server on
PostgreSQL, the process work pool `gpu`, `prefect deploy`, a deployment run, and a worker that picks it up and
runs the retrain flow in the checkout that TQC_PROJECT_DIR names (marker `server`; tests/servers.py)."""

from __future__ import annotations

import subprocess

import pytest

from tests.flows.conftest import PREFECT, added_rows, deploy_retrain_for_a_worker, drop, unseen_questions
from tests.servers import create_database, prefect_server

pytestmark = pytest.mark.server


def test_a_worker_runs_the_retrain_deployment_against_prefect_on_postgresql(postgres, project, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    rows = [(q, "LOC") for q in unseen_questions(project, "LOC", 3)]
    drop(project, "delivery.csv", rows)

    database = create_database(postgres, f"prefect_{tmp_path.name}").replace("postgresql://", "postgresql+asyncpg://")
    with prefect_server(database, tmp_path) as api_url:
        env = deploy_retrain_for_a_worker(project, tmp_path, api_url)

        with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("retrain/retrain-nightly")
            run = client.create_flow_run_from_deployment(deployment.id)
            worker = subprocess.run(PREFECT + ["worker", "start", "--pool", "gpu", "--run-once"], cwd=tmp_path, env=env,
                                    capture_output=True, text=True, timeout=600)
            state = client.read_flow_run(run.id).state

    assert state.is_completed(), f"{state}\n{worker.stdout[-3000:]}\n{worker.stderr[-3000:]}"
    assert completed_in_postgres(database, run.id)  # the server kept it there, not in a SQLite file of its own
    assert sorted(r["text"] for r in added_rows(project)) == sorted(t for t, _ in rows)  # the flow ran in the checkout
    assert not (project / "data" / "incoming" / "delivery.csv").exists()  # and archived the delivery there


def completed_in_postgres(database_url: str, flow_run_id) -> bool:
    import psycopg2

    with psycopg2.connect(database_url.replace("postgresql+asyncpg://", "postgresql://")) as connection:
        with connection.cursor() as cursor:
            cursor.execute("SELECT state_type FROM flow_run WHERE id = %s", (str(flow_run_id),))
            return cursor.fetchone() == ("COMPLETED",)
