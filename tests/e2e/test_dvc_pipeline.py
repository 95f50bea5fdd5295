"""End to end: `dvc repro` on a tiny random model and tiny synthetic data, in a scratch project."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.e2e.conftest import run

pytestmark = pytest.mark.e2e


def test_dvc_repro_end_to_end_then_nothing_then_only_evaluate(project):
    run([sys.executable, "-m", "dvc", "repro"], project)
    metrics = json.loads((project / "reports" / "metrics.json").read_text())
    assert metrics["dataset"] == "custom"
    # the params evaluate declares: no grids, tuner or flows, nor validate's thresholds or data's paths
    assert set(metrics["run"]["params"]) == {"seed", "data", "augment", "model", "warmup", "stage_one", "mine",
                                             "stage_two", "baseline_nc", "prior", "distributed", "evaluate"}
    # the warm-up is off by default: its folder holds its skip record alone, and stage one started from model.pretrained
    assert [p.name for p in (project / "models" / "warmup").iterdir()] == ["warmup_skipped.json"]
    assert "warmed_up_from" not in json.loads((project / "models" / "stage_one" / "tqc_model.json").read_text())
    assert metrics["run"]["params"]["data"] == {"dataset": "custom", "validation_fraction": 0.1}
    for key in ("test", "stage_one.test", "nc.test", "zero_shot.test", "exemplars.test"):
        node = metrics
        for part in key.split("."):
            node = node[part]
        assert 0.0 <= node["accuracy"] <= 1.0 and 0.0 <= node["macro_f1"] <= 1.0
    assert 0.0 <= metrics["test"]["mrr"] <= 1.0 and metrics["test"]["hits_at_1"] == metrics["test"]["accuracy"]
    # The headline is what the written predictions say: their top-1 against gold, over every test row
    predictions = [json.loads(line) for line in (project / "data" / "predictions" / "test.jsonl").read_text().splitlines()]
    top1 = sum(p["top_k"][0]["class_id"] == p["gold"] for p in predictions) / len(predictions)
    assert metrics["test"]["accuracy"] == pytest.approx(top1) and metrics["test"]["n"] == len(predictions) > 0
    from sklearn.metrics import f1_score

    gold, first = [p["gold"] for p in predictions], [p["top_k"][0]["class_id"] for p in predictions]
    assert metrics["test"]["macro_f1"] == pytest.approx(f1_score(gold, first, average="macro"))
    # classes.json: every model's per-class report, its gold classes' F1 averaging to that model's figure
    classes = json.loads((project / "reports" / "classes.json").read_text())
    assert list(classes) == ["admc", "stage_one", "nc", "zero_shot", "exemplars"]
    for name, report in classes.items():
        figures = metrics["test"] if name == "admc" else metrics[name]["test"]
        gold_f1 = [c["f1"] for c in report["per_class"].values() if c["support"]]
        assert sum(c["support"] for c in report["per_class"].values()) == figures["n"]
        assert np.mean(gold_f1) == pytest.approx(figures["macro_f1_gold_classes"]), name
        assert all(pair["count"] > 0 and pair["gold"] != pair["predicted"] for pair in report["most_confused"])
    fitted = json.loads((project / "models" / "prior.json").read_text())["models"]
    assert set(fitted) == set(metrics["prior_shift"]) == {"admc", "stage_one", "nc"}
    for name, shift in metrics["prior_shift"].items():
        assert shift["weight"] == fitted[name]["weight"] and 0.0 <= shift["test_unshifted"]["macro_f1"] <= 1.0
        assert shift["temperature"] == fitted[name]["temperature"] > 0.0
    for path in ("models/stage_one/tqc_model.json", "models/stage_two/question_encoder/model.safetensors",
                 "data/mined/negatives.jsonl", "reports/plots/confusion.csv", "reports/plots/similarity_profile.png",
                 "reports/training/stage_two.csv", "reports/validation.json", "data/predictions/test.jsonl",
                 "reports/data_docs/index.html", "reports/promotion.json"):
        assert (project / path).exists(), path

    check_predict_ranks_as_evaluate(project)

    second = run([sys.executable, "-m", "dvc", "repro"], project)
    assert "Running stage" not in second

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["evaluate"].update(confused_pairs=3, seeds=2, resplit=True)  # evaluate params only; seed 2 on its own split
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    third = run([sys.executable, "-m", "dvc", "repro"], project)
    assert [line for line in third.splitlines() if line.startswith("Running stage")] == ["Running stage 'evaluate':"]
    seeds = json.loads((project / "reports" / "metrics.json").read_text())["seeds"]
    assert seeds["n"] == 2 and seeds["resplit"] is True
    values = seeds["admc"]["macro_f1"]["values"]
    assert len(values) == 2 and values[0] == pytest.approx(metrics["test"]["macro_f1"])
    assert seeds["admc"]["macro_f1"]["mean"] == pytest.approx(sum(values) / 2)

    check_mlflow_records_both_repros(project)


def check_predict_ranks_as_evaluate(project: Path) -> None:
    """`tqc predict` (the registry's pyfunc code, with the shift in models/prior.json) answers each test
    question as evaluate's predictions do: the served ranking is the measured one."""
    evaluated = [json.loads(line) for line in (project / "data" / "predictions" / "test.jsonl").read_text().splitlines()]
    (project / "questions.txt").write_text("\n".join(r["text"] for r in evaluated) + "\n")
    answered = run([sys.executable, "-m", "tqc.cli", "predict", "--file", "questions.txt", "--top-k", "3"], project)
    served = [json.loads(line) for line in answered.splitlines() if line.startswith("{")]
    assert [[a["class_id"] for a in r["top_k"]] for r in served] == [[a["class_id"] for a in r["top_k"][:3]] for r in evaluated]
    assert [r["top_k"][0]["score"] for r in served] == pytest.approx([r["top_k"][0]["score"] for r in evaluated], abs=1e-4)


def check_mlflow_records_both_repros(project: Path) -> None:
    """Two repros that ran something → two parent runs in the local store, each with its stages nested."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tqc")
    parents = client.search_runs([experiment.experiment_id], "tags.`tqc.kind` = 'pipeline'", order_by=["attributes.start_time ASC"])
    assert len(parents) == 2 and all(p.info.status == "FINISHED" for p in parents)

    def stages(parent) -> dict:
        children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
        return {c.data.tags["tqc.stage"]: c for c in children}

    first, second = stages(parents[0]), stages(parents[1])
    assert set(first) == {"stage_one", "mine", "stage_two", "baseline_nc", "prior", "evaluate", "promote"}
    assert set(second) == {"evaluate"}  # the evaluate-only change re-ran evaluate alone
    assert parents[0].data.params["stage_one.temperature"] == "0.1"
    assert parents[1].data.params["evaluate.seeds"] == "2" and parents[0].data.params["evaluate.seeds"] == "1"

    curve = client.get_metric_history(first["stage_one"].info.run_id, "stage_one.validation_macro_f1")
    assert [m.step for m in curve] == [0, 1]
    final_metrics = json.loads((project / "reports" / "metrics.json").read_text())  # written by the second parent
    assert second["evaluate"].data.metrics["test.accuracy"] == pytest.approx(final_metrics["test"]["accuracy"])
    # the record's params are the run's params, not metrics beside its figures
    assert not any(key.startswith("run.") for key in second["evaluate"].data.metrics)
    assert second["evaluate"].data.params["evaluate.seeds"] == "2"
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    locked = {d["path"]: d["md5"] for d in lock["stages"]["stage_one"]["deps"]}
    assert first["stage_one"].data.tags["dvc.data/validated"] == locked["data/validated"]
    assert first["stage_one"].data.tags["dvc.models/warmup"] == locked["models/warmup"]  # an optional input, given
    # the shift decides the headline figures: evaluate's record names the prior it read, as dvc.lock does
    evaluated = {d["path"]: d["md5"] for d in lock["stages"]["evaluate"]["deps"]}
    assert second["evaluate"].data.tags["dvc.models/prior.json"] == evaluated["models/prior.json"]
    artifacts = {a.path for a in client.list_artifacts(second["evaluate"].info.run_id)}
    assert {"metrics.json", "plots", "validation.json"} <= artifacts

    promotion = json.loads((project / "reports" / "promotion.json").read_text())
    assert promotion["promoted"] and promotion["challenger_version"] == "1"
    assert str(client.get_model_version_by_alias("tqc-admc", "champion").version) == "1"
    # promote's cached record of it: what a fresh clone lacks, so its dvc repro registers the model there too
    registered = json.loads((project / "models" / "registered.json").read_text())
    assert registered["version"] == registered["alias_version"] == "1" and registered["registry"].startswith("sqlite:///")


@pytest.mark.slow  # a whole tiny pipeline, ~1.5 min; the collection it relies on is tests/code/test_dvc_yaml.py's
def test_dvc_exp_run_trains_on_the_retrain_flows_data_version_and_keeps_it(project):
    """Under the old `/data/*` + `!/data/raw/` .gitignore DVC never collected data/raw/labeled.jsonl.dvc, so
    `dvc exp run` deleted the committed data version and trained without its rows (ingest read no additions)."""
    from tests.conftest import CLASSES, synthetic_questions

    label = next(iter(CLASSES))
    added = project / "data" / "raw" / "labeled.jsonl"
    added.write_text("".join(json.dumps({"text": f"{text} (added)", "class_id": label}) + "\n"
                             for text, _ in synthetic_questions(7, 3)[:6]))
    run([sys.executable, "-m", "dvc", "add", str(added)], project)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    run(["git", "add", "-A"], project)
    run([*git, "commit", "-qm", "a data version"], project)
    run([sys.executable, "-m", "dvc", "exp", "run", "-S", "evaluate.top_k=3"], project)
    assert added.is_file()
    assert json.loads((project / "reports" / "ingest.json").read_text())["read"]["additions"] == 6
