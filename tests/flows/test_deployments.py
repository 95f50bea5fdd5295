"""prefect.yaml: every deployment names a real flow, and retrains never overlap across workers."""

from __future__ import annotations

import importlib

import yaml
from prefect import Flow
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

from tests.flows.conftest import REPO


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
