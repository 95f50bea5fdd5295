"""The tuner: sampled values reach the stage functions, pruning, shared studies, applying the best."""

from __future__ import annotations

import json
import logging
import re
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml

from tqc.config import ConfigError, Params, SearchDimension, load_params, unflatten
from tqc.schema import Catalog, StandardQuestion
from tqc.tracking import run_params
from tqc.tuning.apply import apply_best
from tqc.tuning.space import default_values, flat_base, sample_overrides, within_wrong_classes
from tqc.tuning.trials import EpochReporter
from tqc.tune import tune
from tests.conftest import tiny_params, write_custom_dataset

SPACE = {
    "stage_one.temperature": {"low": 0.05, "high": 0.5, "log": True},
    "stage_two.temperature": {"low": 0.05, "high": 0.5},
    "mine.k": {"low": 1, "high": 40},  # above the synthetic data's 2 wrong classes: the tuner cuts it to 1..2
    "stage_two.loss": {"choices": ["hinge", "sdml"]},
    "stage_two.margin": {"low": 0.1, "high": 0.9, "when": {"stage_two.loss": "hinge"}},
    "stage_two.smoothing": {"low": 0.05, "high": 0.3, "when": {"stage_two.loss": "sdml"}},
    "stage_one.learning_rate": {"low": 1e-4, "high": 3e-3, "log": True},
    "stage_two.learning_rate": {"low": 1e-4, "high": 3e-3, "log": True},
}


def tuning_params(tmp_path: Path, model_dir: Path, **tune) -> dict:
    write_custom_dataset(tmp_path / "raw")
    raw = tiny_params(tmp_path / "raw", model_dir)
    for stage in ("stage_one", "stage_two"):
        raw[stage].update(epochs=2, patience=2)
    raw["tracking"] = {"enabled": True, "uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "tune-test"}
    raw["tune"] = {"study": "test", "storage": f"sqlite:///{tmp_path / 'optuna.db'}", "trials": 3, "pruner": "none",
                   "space": SPACE, **tune}
    return raw


def test_every_sampled_value_reaches_the_training_run(tmp_path, tiny_model_dir):
    params = Params.model_validate(tuning_params(tmp_path, tiny_model_dir, keep_models=True, trials=5))
    result = tune(params, tmp_path / "reports", tmp_path / "work", trials=3)  # --trials 3

    study = optuna.load_study(study_name="test", storage=params.tune.storage)
    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(trials) == 3 and trials[0].user_attrs["baseline"] and trials[0].params == {}
    assert trials[0].user_attrs["base_values"]["stage_two.loss"] == "nt_xent"  # the base, though outside the choices
    for trial in trials:
        trial_dir = tmp_path / "work" / "test" / f"trial-{trial.number:04d}"
        # What the stage functions themselves recorded about the run they trained:
        one = json.loads((trial_dir / "stage_one" / "tqc_model.json").read_text())["params"]
        two = json.loads((trial_dir / "stage_two" / "tqc_model.json").read_text())["params"]
        mined = json.loads((trial_dir / "mining.json").read_text())
        expected = trial.user_attrs["base_values"] if trial.number == 0 else trial.params
        assert one["temperature"] == pytest.approx(expected["stage_one.temperature"])
        assert one["learning_rate"] == pytest.approx(expected["stage_one.learning_rate"])
        assert two["temperature"] == pytest.approx(expected["stage_two.temperature"])
        assert two["learning_rate"] == pytest.approx(expected["stage_two.learning_rate"])
        assert mined["k"] == expected["mine.k"]  # so no trial sampled a K that mining clipped
        assert two["loss"] == expected["stage_two.loss"]
        if expected["stage_two.loss"] == "hinge":
            assert two["margin"] == pytest.approx(expected["stage_two.margin"]) and "stage_two.smoothing" not in expected
        elif expected["stage_two.loss"] == "sdml":
            assert two["smoothing"] == pytest.approx(expected["stage_two.smoothing"]) and "stage_two.margin" not in expected

    # In MLflow, each trial's run has the values it trained with, the baseline's (which draws none) too, beside every
    # other param as a pipeline run logs them; the study's run has every param too, and the trials it made, not
    # tune.trials: a tuning run compares with a training run column by column
    runs = tracked_runs(params.tracking.uri)
    logged = {int(run["tags"]["optuna.trial"]): run["params"] for run in runs if "optuna.trial" in run["tags"]}
    for trial in trials:
        expected = trial.user_attrs["base_values"] if trial.number == 0 else trial.params
        draws = {name: str(value) for name, value in expected.items()}
        assert {name: logged[trial.number][name] for name in draws} == draws, trial.number
        assert logged[trial.number] == {**as_logged(run_params(params.with_overrides(unflatten(expected)))), **draws}
        assert logged[trial.number]["stage_one.epochs"] == "2" and "tune.trials" not in logged[trial.number]
    (study_run,) = [run for run in runs if run["tags"].get("tqc.kind") == "tune"]
    assert study_run["params"]["tune.trials"] == "3"
    pipeline = as_logged(run_params(params))  # what a `dvc repro` parent run logs
    assert {name: study_run["params"].get(name) for name in pipeline} == pipeline
    assert study_run["params"]["model.pretrained"] == str(params.model.pretrained)

    reports = tmp_path / "reports"
    best = yaml.safe_load((reports / "best_params.yaml").read_text())
    best_values = study.best_trial.params or study.best_trial.user_attrs["base_values"]
    assert best == result.best_params and best["stage_one"]["temperature"] == best_values["stage_one.temperature"]
    summary = json.loads((reports / "summary.json").read_text())
    assert summary["best"]["validation_macro_f1"] == pytest.approx(study.best_value)
    assert "test" in summary["best"] and "test" in summary["baseline"]
    # what the trials trained with besides the searched values, which `--apply` holds params.yaml to
    assert summary["trained_with"]["stage_one.epochs"] == params.stage_one.epochs
    assert summary["trained_with"]["model.pretrained"] == params.model.pretrained and "data.data_dir" not in summary["trained_with"]
    assert (reports / "history.png").stat().st_size > 0 and (reports / "trials.csv").exists()
    assert (reports / "best_params.yaml").read_text().splitlines()[1] == f"# apply with: tqc tune --apply {reports / 'best_params.yaml'}"

    from mlflow import MlflowClient

    client = MlflowClient(params.tracking.uri)
    runs = client.search_runs([client.get_experiment_by_name("tune-test").experiment_id])
    parent = [r for r in runs if r.data.tags.get("tqc.kind") == "tune"]
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    assert len(parent) == 1 and len(nested) == 3
    assert {r.data.tags["optuna.state"] for r in nested} == {"COMPLETE"}


def test_the_baseline_trial_uses_the_base_params_own_values():
    base = {"stage_two.loss": "nt_xent", "stage_two.margin": 0.2, "stage_one.temperature": 0.1}
    space = {k: SearchDimension(**v) for k, v in SPACE.items() if k in ("stage_two.margin", "stage_one.temperature")}
    assert default_values(space, base) == {"stage_one.temperature": 0.1}  # margin only applies to hinge
    shipped = load_params(Path(__file__).resolve().parents[2] / "params.yaml")
    assert {"stage_one.temperature", "stage_two.temperature", "mine.k", "stage_two.loss", "stage_two.margin",
            "stage_two.smoothing", "stage_one.learning_rate"} <= set(shipped.tune.space)


def test_conditional_dimensions_are_sampled_only_with_their_loss():
    space = {k: SearchDimension(**v) for k, v in SPACE.items()}
    for loss, present, absent in (("hinge", "stage_two.margin", "stage_two.smoothing"),
                                  ("sdml", "stage_two.smoothing", "stage_two.margin")):
        trial = optuna.trial.FixedTrial({"stage_one.temperature": 0.1, "stage_two.temperature": 0.1, "mine.k": 2,
                                         "stage_two.loss": loss, present: 0.2, "stage_one.learning_rate": 1e-3,
                                         "stage_two.learning_rate": 1e-3})
        values = sample_overrides(trial, space, {})
        assert values["stage_two.loss"] == loss and present in values and absent not in values


def test_a_log_dimension_is_sampled_on_a_log_scale_and_an_int_params_as_integers():
    """Only the config's loading checked `log`: had it not reached the sampler, a learning rate searched over
    1e-5..1e-1 would draw from the top decade nine times in ten."""
    trial = optuna.create_study().ask()
    values = sample_overrides(trial, {"stage_one.learning_rate": SearchDimension(low=1e-5, high=1e-1, log=True),
                                      "mine.k": SearchDimension(low=1, high=64, log=True)},
                              {"stage_one.learning_rate": 1e-3, "mine.k": 5})
    assert trial.distributions["stage_one.learning_rate"].log and trial.distributions["mine.k"].log
    assert isinstance(values["mine.k"], int) and isinstance(trial.distributions["mine.k"], optuna.distributions.IntDistribution)


def test_a_condition_reads_this_trials_value_wherever_its_dimension_is_listed():
    # margin listed before the loss it depends on, and a base loss that is not hinge
    space = {"stage_two.margin": SearchDimension(low=0.1, high=0.5, when={"stage_two.loss": "hinge"}),
             "stage_two.loss": SearchDimension(choices=["hinge", "bpr"])}
    base = {"stage_two.loss": "nt_xent", "stage_two.margin": 0.2}
    hinge = sample_overrides(optuna.trial.FixedTrial({"stage_two.loss": "hinge", "stage_two.margin": 0.3}), space, base)
    assert hinge == {"stage_two.loss": "hinge", "stage_two.margin": 0.3}
    assert sample_overrides(optuna.trial.FixedTrial({"stage_two.loss": "bpr"}), space, {**base, "stage_two.loss": "hinge"}) == {
        "stage_two.loss": "bpr"}


def test_a_chain_of_conditions_reads_this_trials_value_at_every_link():
    # smoothing when the loss is sdml, the loss searched only with cosine: listed last link first
    space = {"stage_two.smoothing": SearchDimension(low=0.0, high=0.3, when={"stage_two.loss": "sdml"}),
             "stage_two.loss": SearchDimension(choices=["nt_xent", "sdml"], when={"model.similarity": "cosine"}),
             "model.similarity": SearchDimension(choices=["cosine", "inner"])}
    base = {"stage_two.loss": "nt_xent", "model.similarity": "inner", "stage_two.smoothing": 0.0}
    cosine = optuna.trial.FixedTrial({"model.similarity": "cosine", "stage_two.loss": "sdml", "stage_two.smoothing": 0.1})
    assert sample_overrides(cosine, space, base) == {"model.similarity": "cosine", "stage_two.loss": "sdml",
                                                     "stage_two.smoothing": 0.1}
    inner = optuna.trial.FixedTrial({"model.similarity": "inner"})
    assert sample_overrides(inner, space, {**base, "model.similarity": "cosine"}) == {"model.similarity": "inner"}


def test_integer_or_float_sampling_follows_the_param_not_the_yaml_bounds():
    space = {"stage_two.margin": SearchDimension(low=0, high=1), "mine.k": SearchDimension(low=2, high=12.0)}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    sampled = [sample_overrides(study.ask(), space, {"stage_two.margin": 0.2, "mine.k": 5}) for _ in range(20)]
    assert all(isinstance(s["mine.k"], int) and 2 <= s["mine.k"] <= 12 for s in sampled)
    margins = {s["stage_two.margin"] for s in sampled}
    assert all(isinstance(m, float) for m in margins) and len(margins) > 2  # not just {0, 1}
    # an int knob whose base value is null (no step limit) is still searched over integers
    steps = [sample_overrides(study.ask(), {"stage_one.max_steps": SearchDimension(low=5, high=50)},
                              {"stage_one.max_steps": None}) for _ in range(5)]
    assert all(isinstance(s["stage_one.max_steps"], int) for s in steps)


def test_mine_k_is_searched_only_up_to_the_wrong_classes_there_are():
    space = {"mine.k": SearchDimension(low=2, high=12), "stage_two.margin": SearchDimension(low=0.1, high=0.9)}
    six_classes = within_wrong_classes(space, 6)
    assert (six_classes["mine.k"].low, six_classes["mine.k"].high) == (2, 5) and six_classes["stage_two.margin"] == space["stage_two.margin"]
    assert within_wrong_classes(space, 16) == space  # 15 wrong classes: the range fits
    assert (within_wrong_classes(space, 2)["mine.k"].low, within_wrong_classes(space, 2)["mine.k"].high) == (1, 1)
    choices = {"mine.k": SearchDimension(choices=[3, 8])}
    assert within_wrong_classes(choices, 6) == choices  # a list of choices is the user's to keep
    assert space["mine.k"].high == 12  # the params' own space is left as it is
    # twins (a demoted catalog_unique_texts): 6 classes, 2 sharing a standard question, leave 4 wrong ones to mine, as
    # mining clips K (mining.largest_group); the tuner stopped at 5, and K = 5 trained what K = 4 did
    twins = within_wrong_classes(space, 6, largest_group=2)["mine.k"]
    assert (twins.low, twins.high) == (2, 4)


def test_the_reported_baseline_is_the_one_of_the_params_as_they_are_now():
    from tqc.tuning.reports import current_baseline

    def params(temperature: float) -> Params:
        return Params.model_validate({"stage_one": {"temperature": temperature},
                                      "tune": {"space": {"stage_one.temperature": {"low": 0.05, "high": 0.2}}}})

    study = optuna.create_study(direction="maximize")
    for value, attrs in [(0.80, {"baseline": True, "base_values": {"stage_one.temperature": 0.1}}),
                         (0.86, {}),  # a sampled trial at 0.07, then applied: --apply requeues a baseline
                         (0.86, {"baseline": True, "base_values": {"stage_one.temperature": 0.07}})]:
        study.add_trial(optuna.trial.create_trial(value=value, params={}, distributions={}, user_attrs=attrs))
    complete = study.get_trials(states=[optuna.trial.TrialState.COMPLETE])
    assert current_baseline(complete, params(0.07)).number == 2
    assert current_baseline(complete, params(0.1)).number == 0  # its values, though not the newest
    # None of these values: no baseline. The newest, of other values, stood in, won the tie below with a trial of
    # the values it ran, and `tune` said the params' values stood, though they had scored worse
    assert current_baseline(complete[:2], params(0.07)) is None


def test_a_trial_that_only_ties_the_current_baseline_is_not_the_best_to_apply():
    """A review ran a study again after changing stage_one.temperature: its new baseline (trial 2) scored what the old
    one (trial 0) had, Optuna's best was trial 0 by order, and `tune` said to apply it, setting the old value back."""
    from tqc.tuning.reports import best_trial

    def params(temperature: float) -> Params:
        return Params.model_validate({"stage_one": {"temperature": temperature},
                                      "tune": {"space": {"stage_one.temperature": {"low": 0.02, "high": 0.2}}}})

    study = optuna.create_study(direction="maximize")
    for value, attrs in [(0.9048, {"baseline": True, "base_values": {"stage_one.temperature": 0.0211}}), (0.85, {}),
                         (0.9048, {"baseline": True, "base_values": {"stage_one.temperature": 0.1}})]:
        study.add_trial(optuna.trial.create_trial(value=value, params={}, distributions={}, user_attrs=attrs))
    assert study.best_trial.number == 0 and best_trial(study, params(0.1)).number == 2  # the tie: the params stand
    assert best_trial(study, params(0.0211)).number == 0
    study.add_trial(optuna.trial.create_trial(value=0.91, params={}, distributions={}, user_attrs={}))
    assert best_trial(study, params(0.1)).number == 3  # a gain is the best

    # The params changed to values no baseline has run yet (worker 1 queues none): the newest baseline, of other
    # values, tied the best, and `tune` said "the params' values stand" of values that scored 0.80
    study = optuna.create_study(direction="maximize")
    for value, attrs in [(0.888, {}), (0.80, {}),
                         (0.888, {"baseline": True, "base_values": {"stage_one.temperature": 0.1}})]:
        study.add_trial(optuna.trial.create_trial(value=value, params={}, distributions={}, user_attrs=attrs))
    assert best_trial(study, params(0.05)).number == 0 and best_trial(study, params(0.1)).number == 2


def test_the_reporter_prunes_when_the_pruner_says_so():
    from tqc.tracking import Tracker
    from tqc.training import EpochRecord

    class Trial:
        reported: list = []
        user_attrs: dict = {}

        def report(self, value, step):
            self.reported.append((step, value))

        def should_prune(self):
            return len(self.reported) >= 2

    trial = Trial()
    reporter = EpochReporter(trial, Params(), Tracker(None))
    reporter("stage_one", EpochRecord(0, float("nan"), 0.1, 0.1, 0.0))  # the start is not reported
    reporter("stage_one", EpochRecord(1, 1.0, 0.5, 0.6, 1.0))
    with pytest.raises(optuna.TrialPruned):
        reporter("stage_two", EpochRecord(1, 1.0, 0.5, 0.4, 1.0))
    assert trial.reported == [(1, 0.6), (Params().stage_one.epochs + 1, 0.6)]  # the best so far, on one step axis

    baseline = Trial()
    baseline.reported, baseline.user_attrs = [], {"baseline": True}
    reporter = EpochReporter(baseline, Params(), Tracker(None))
    for epoch in (1, 2, 3):  # reported, never pruned: it is queued once, and the summary measures the search by it
        reporter("stage_one", EpochRecord(epoch, 1.0, 0.5, 0.6, 1.0))
    assert len(baseline.reported) == 3


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.server)])
def shared_stores(request, tmp_path) -> tuple[str, str | None]:
    """(Optuna storage, MLflow tracking URI or None): local SQLite untracked, and what a team shares,
    a study on PostgreSQL with every trial tracked on an MLflow server that is on PostgreSQL too."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'optuna.db'}", None
    from tests.servers import create_database

    optuna_url = create_database(request.getfixturevalue("postgres"), f"optuna_{tmp_path.name}")
    return optuna_url, request.getfixturevalue("mlflow_on_postgres")


def test_two_worker_processes_share_one_study(tmp_path, tiny_model_dir, shared_stores):
    storage, tracking_uri = shared_stores
    raw = tuning_params(tmp_path, tiny_model_dir, trials=2, enqueue_defaults=False, storage=storage)
    raw["tracking"].update(enabled=tracking_uri is not None, uri=tracking_uri)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    # Workers as a scheduler starts them: no MLFLOW_* left over from earlier tests to stand in for their params.
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    workers = [subprocess.Popen([sys.executable, "-m", "tqc.cli", "--params", str(tmp_path / "params.yaml"), "tune",
                                 "--worker", str(i), "--out", str(tmp_path / f"reports-{i}"), "--work", str(tmp_path / "work")],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    try:
        outputs = [w.communicate(timeout=600)[0] for w in workers]
    finally:
        for worker in workers:
            worker.kill()
    assert all(w.returncode == 0 for w in workers), "\n".join(o[-2000:] for o in outputs)

    study = optuna.load_study(study_name="test", storage=storage)
    by_worker: dict[str, list[int]] = {}
    for trial in study.trials:
        by_worker.setdefault(trial.user_attrs["worker"], []).append(trial.number)
    assert len(study.trials) == 4 and len(by_worker) == 2 and all(len(n) == 2 for n in by_worker.values())
    if tracking_uri:  # every trial tracked once, nested in a study run and in its experiment (not in "Default")
        runs = tracked_runs(tracking_uri)
        studies = {run["id"]: run["experiment"] for run in runs if run["tags"].get("tqc.kind") == "tune"}
        trials = [run for run in runs if "optuna.trial" in run["tags"]]
        assert len(studies) == 2 and len(set(studies.values())) == 1, runs
        assert sorted(int(run["tags"]["optuna.trial"]) for run in trials) == sorted(t.number for t in study.trials), runs
        assert all(studies.get(run["tags"].get("mlflow.parentRunId")) == run["experiment"] for run in trials), runs


def as_logged(params: dict) -> dict:
    """`params` as a run's MLflow params read back: flat keys, text values."""
    from tqc.tracking import param_chunks

    return {name: value for chunk in param_chunks(params) for name, value in chunk.items()}


def tracked_runs(tracking_uri: str) -> list[dict]:
    """Every run the tracking server holds, in every experiment, with its name, parent and tags."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return [{"id": run.info.run_id, "experiment": run.info.experiment_id, "name": run.info.run_name, "status": run.info.status,
             "params": run.data.params,
             "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.") or k == "mlflow.parentRunId"}}
            for run in client.search_runs(experiments, max_results=1000)]


def test_apply_writes_the_best_values_and_keeps_the_comments(tmp_path):
    params_file = tmp_path / "params.yaml"
    params_file.write_text((Path(__file__).resolve().parents[2] / "params.yaml").read_text())
    best = tmp_path / "best_params.yaml"
    shipped = params_file.read_text().splitlines()
    best.write_text("stage_one:\n  temperature: 0.05\n  learning_rate: 1.0e-05\nmine:\n  k: 7\n")
    apply_best(best, params_file)
    text = params_file.read_text()
    assert "# Every knob of the pipeline" in text and "# in_batch | all_classes" in text
    # only the three values' lines change: no re-wrapped lists, nulls and quotes kept, floats PyYAML reads as floats
    changed = [(a, b) for a, b in zip(shipped, text.splitlines()) if a != b]
    assert len(text.splitlines()) == len(shipped) and len(changed) == 3, changed
    assert any(b.strip().startswith("learning_rate: 1.0e-05") for _, b in changed)
    params = load_params(params_file)
    assert params.stage_one.temperature == 0.05 and params.mine.k == 7 and params.stage_one.learning_rate == 1e-5

    before = params_file.read_text()
    best.write_text("stage_one:\n  temperature: 0.05\n  learning_rate: 0.00001\nmine:\n  k: 7\n")  # the same values
    assert apply_best(best, params_file) == {} and params_file.read_text() == before  # nothing rewritten, nothing said
    params_file.write_text(before + 'note: "caf\\xE9"\n')  # an escape a round trip would write out as é
    written = params_file.stat().st_mtime_ns
    assert apply_best(best, params_file) == {} and params_file.stat().st_mtime_ns == written  # not even touched
    params_file.write_text(before)

    best.write_text("mine:\n  k: 0\n")  # invalid: k ≥ 1
    with pytest.raises(ConfigError, match="would make"):
        apply_best(best, params_file)
    assert load_params(params_file).mine.k == 7
    best.write_text("mine:\n  kk: 3\n")
    with pytest.raises(ConfigError, match="is not in"):
        apply_best(best, params_file)


def test_apply_writes_through_a_params_file_that_links_to_a_shared_one(tmp_path):
    """It replaced the link with an edited copy: the shared file kept its old values, and the link was gone."""
    shared = tmp_path / "shared" / "params.yaml"
    shared.parent.mkdir()
    shared.write_text((Path(__file__).resolve().parents[2] / "params.yaml").read_text())
    (tmp_path / "params.yaml").symlink_to(shared)
    best = tmp_path / "best_params.yaml"
    best.write_text("mine:\n  k: 7\n")
    assert apply_best(best, tmp_path / "params.yaml") == {"mine.k": 7}
    assert (tmp_path / "params.yaml").is_symlink() and load_params(shared).mine.k == 7


def test_apply_names_the_file_and_line_that_is_not_utf8(tmp_path):
    """A file saved in Latin-1 was a bare UnicodeDecodeError, a traceback from `tqc tune --apply`."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text((Path(__file__).resolve().parents[2] / "params.yaml").read_text())
    best = tmp_path / "best_params.yaml"
    best.write_bytes(b"# tuned\nmine:\n  k: 4 # caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(best))}: line 3: not UTF-8 text \(byte 0xe9\)"):
        apply_best(best, params_file)
    best.write_text("mine:\n  k: 4\n")
    params_file.write_bytes(params_file.read_bytes() + b"# \xe9\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(params_file))}: line \d+: not UTF-8 text"):
        apply_best(best, params_file)


@pytest.mark.parametrize("content, message", [
    ("seed: 0\ndata:\n\tdataset: trec6\n", "not valid YAML"),
    ("stage_one:\n  epochs: 2\n  epochs: 5\n", "not valid YAML: .*duplicate key"),
    ("", "the parameters file is empty"),
    ("- seed: 0\n", "the parameters file must be a mapping of sections .* not a list"),
])
def test_apply_refuses_a_params_file_that_is_no_params_in_a_line_naming_it(tmp_path, content, message):
    """Its layout-keeping reader had no such checks: a traceback (a tab, a duplicate key, an AttributeError on an
    empty file or a list), where load_params names the file."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text(content)
    best = tmp_path / "best_params.yaml"
    best.write_text("mine:\n  k: 4\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(params_file))}: {message}"):
        apply_best(best, params_file)
    params_file.write_text("data: null\nmine:\n  k: 5\n")  # was 'NoneType' object has no attribute 'get'
    with pytest.raises(ConfigError, match=r"applying it would make .* invalid:\n- data: Input should be a valid dictionary"):
        apply_best(best, params_file)


def test_apply_refuses_values_tuned_on_another_dataset(tmp_path):
    """`tqc --set data.dataset=… tune` leaves params.yaml's dataset as it was: applying its values there would have
    `dvc repro` train that dataset with them. The study's summary.json beside the file says where it was tuned."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text((Path(__file__).resolve().parents[2] / "params.yaml").read_text())
    before = params_file.read_text()
    best = tmp_path / "tuned" / "best_params.yaml"
    best.parent.mkdir()
    best.write_text("mine:\n  k: 4\n")
    (best.parent / "summary.json").write_text(json.dumps({"study": "s", "dataset": "covidq-categories"}))
    with pytest.raises(ConfigError, match="tuned on data.dataset 'covidq-categories'.*trains 'trec6'.*first"):
        apply_best(best, params_file)
    assert params_file.read_text() == before
    (best.parent / "summary.json").write_text(json.dumps({"study": "s", "dataset": "trec6"}))
    assert apply_best(best, params_file) == {"mine.k": 4}


def test_apply_says_which_params_it_did_not_search_differ_from_those_the_study_trained_with(tmp_path, caplog):
    """Values tuned at 5 epochs and cosine, applied to a params.yaml at 2 epochs, were never measured there: only the
    dataset was checked, so `dvc repro` trained them beside other values unsaid."""
    from tqc.tuning.reports import trained_with

    params_file = tmp_path / "params.yaml"
    params_file.write_text((Path(__file__).resolve().parents[2] / "params.yaml").read_text())
    shipped = load_params(params_file)
    tuned_under = trained_with(shipped.with_overrides({"stage_one": {"epochs": shipped.stage_one.epochs + 3},
                                                       "mine": {"k": 9}}))
    best = tmp_path / "tuned" / "best_params.yaml"
    best.parent.mkdir()
    best.write_text("mine:\n  k: 4\n")
    (best.parent / "summary.json").write_text(json.dumps({"dataset": "trec6", "trained_with": tuned_under}))
    with caplog.at_level("WARNING", logger="tqc.tune"):
        assert apply_best(best, params_file) == {"mine.k": 4}
    said = caplog.text
    assert f"stage_one.epochs: {shipped.stage_one.epochs + 3} there, {shipped.stage_one.epochs} here" in said
    assert "mine.k" not in said  # searched: applied, not a difference

    caplog.clear()  # the same params: nothing to say
    (best.parent / "summary.json").write_text(json.dumps({"dataset": "trec6", "trained_with": trained_with(shipped)}))
    with caplog.at_level("WARNING", logger="tqc.tune"):
        apply_best(best, params_file)
    assert "did not search" not in caplog.text


def test_a_median_pruner_that_can_never_prune_is_named_at_the_start(caplog):
    from tqc.tuning.study import _pruner

    short = Params().with_overrides({"stage_one": {"epochs": 2}, "stage_two": {"epochs": 1}, "tune": {"warmup_epochs": 3}})
    with caplog.at_level("WARNING", logger="tqc.tune"):
        _pruner(short)  # steps 1..3 are reported, and step 3 is the trial's last: nothing left to save
    assert "can save no epoch: tune.warmup_epochs is 3, and a trial reports 3 epochs" in caplog.text

    caplog.clear()
    longer = short.with_overrides({"stage_two": {"epochs": 2}})
    with caplog.at_level("WARNING", logger="tqc.tune"):
        assert isinstance(_pruner(longer), optuna.pruners.MedianPruner)
    assert "can save no epoch" not in caplog.text


def test_a_hyperband_study_runs_and_reports(tmp_path, tiny_model_dir):
    raw = tuning_params(tmp_path, tiny_model_dir, trials=2, pruner="hyperband", keep_models=True,
                        space={"stage_one.temperature": SPACE["stage_one.temperature"],
                               "model.similarity": {"choices": ["cosine", "inner", "mlp"]}})
    raw["tracking"]["enabled"] = False
    params = Params.model_validate(raw)
    result = tune(params, tmp_path / "reports", tmp_path / "work")
    from tqc.tuning.study import _pruner

    assert isinstance(_pruner(params), optuna.pruners.HyperbandPruner)
    study = optuna.load_study(study_name="test", storage=params.tune.storage)
    assert len(study.trials) == 2 and sum(result.summary["trials"].values()) == 2
    sampled = study.trials[1].params["model.similarity"]  # trial 0 is the baseline (cosine)
    saved = json.loads((tmp_path / "work" / "test" / "trial-0001" / "stage_two" / "tqc_model.json").read_text())
    assert saved["similarity"] == sampled  # the distance the tuner chose is the one the model was trained with
    from tqc.tracking import code_version

    # each trial keeps the code it trained with, this checkout's, and the summary counts no trial of other code
    assert {t.user_attrs["code_version"] for t in study.trials} == {code_version()} == {result.summary["code_version"]}
    assert result.summary["other_code_version"] == 0 and result.summary["best"]["code_version"] == code_version()


def test_a_cut_standard_question_and_a_clipped_mine_k_are_said_once_a_study_not_at_every_trial(tmp_path, tiny_model_dir,
                                                                                                  caplog):
    """Each trial's stage one and stage two said the cut again (16 trials, 32 times the same warning), and each
    trial's mining its "only N wrong classes" (mine.k not searched but above the catalog's wrong classes). One tune
    checks both: a study is the expensive part."""
    raw = tuning_params(tmp_path, tiny_model_dir, trials=2, space={"stage_one.temperature": SPACE["stage_one.temperature"]})
    raw["tracking"]["enabled"] = False
    raw["model"]["max_length"] = 8
    raw["mine"]["k"] = 5  # the synthetic data's 3 classes: 2 wrong ones
    for stage in ("stage_one", "stage_two"):
        raw[stage]["epochs"] = 1
    catalog = tmp_path / "raw" / "catalog.csv"  # LOC's standard question: 11 tokens
    catalog.write_text(catalog.read_text().replace("Where is the place?", "Where is the place where is the place where?"))
    with caplog.at_level("WARNING", logger="tqc"):
        tune(Params.model_validate(raw), tmp_path / "reports", tmp_path / "work")
    assert len(optuna.load_study(study_name="test", storage=raw["tune"]["storage"]).trials) == 2
    said = [r.getMessage() for r in caplog.records if "standard question(s)" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("1 standard question(s) longer than model.max_length (8 tokens)")
    assert "class(es) 'LOC';" in said[0]
    clipped = [r.getMessage() for r in caplog.records if "wrong classes exist" in r.getMessage()]
    assert clipped == ["mine.k=5 but only 2 wrong classes exist; mining 2"]


def test_the_tuner_refuses_to_run_under_torchrun(tmp_path, tiny_model_dir, monkeypatch):
    params = Params(**tuning_params(tmp_path, tiny_model_dir))
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets in each process
    with pytest.raises(ConfigError, match="torchrun"):
        tune(params, tmp_path / "reports", tmp_path / "work")
    assert not (tmp_path / "optuna.db").exists()  # refused before the study was opened


def test_a_study_refuses_other_base_params_and_requeues_its_baseline_when_the_base_values_change(tmp_path, tiny_model_dir):
    from tqc.config import flatten
    from tqc.tuning.study import check_study_base, enqueue_baseline

    params = Params.model_validate(tuning_params(tmp_path, tiny_model_dir))
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    base = flatten(params.model_dump(mode="json", by_alias=True, exclude={"tune"}))
    check_study_base(study, params, base)
    check_study_base(study, params, {**base, "data.data_dir": "/elsewhere", "stage_one.temperature": 0.3})  # not fixed params
    # No trial runs the prior stage (the objective is before any shift): its params do not fix a study
    check_study_base(study, params, {**base, "prior.target": "uniform", "prior.weights": [0.0]})
    # nor trains the NC baseline: a worker that turned it off for a quicker `dvc repro` joins the same study
    check_study_base(study, params, {**base, "baseline_nc.enabled": not base["baseline_nc.enabled"], "baseline_nc.epochs": 9})
    older = optuna.create_study(study_name="older", storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    older.set_user_attr("base_params", {**study.user_attrs["base_params"], "baseline_nc.enabled": True})  # as recorded before
    check_study_base(older, params, {**base, "baseline_nc.enabled": False})
    with pytest.raises(ConfigError, match="data.dataset: 'custom' there, 'trec50' here"):
        check_study_base(study, params, {**base, "data.dataset": "trec50"})

    # a changed set of choices, or int / float, is refused before any work (Optuna would fail mid-trial)
    space = params.tune.space
    grown = params.model_copy(update={"tune": params.tune.model_copy(update={"space": {
        **space, "stage_two.loss": SearchDimension(choices=["nt_xent", "hinge", "bpr", "sdml", "decoupled"])}})})
    with pytest.raises(ConfigError, match="stage_two.loss: .* there, .* here"):
        check_study_base(study, grown, base)
    with pytest.raises(ConfigError, match="mine.k: 'int' there, 'float' here"):
        check_study_base(study, params, {**base, "mine.k": 5.0})
    rebounded = {**space, "mine.k": SearchDimension(low=3, high=20)}  # new bounds: fine for Optuna
    check_study_base(study, params.model_copy(update={"tune": params.tune.model_copy(update={"space": rebounded})}), base)

    values = default_values(params.tune.space, base)
    enqueue_baseline(study, values, CODE)
    enqueue_baseline(study, values, CODE)
    assert len(study.get_trials()) == 1  # the same base values: one baseline
    enqueue_baseline(study, {**values, "stage_one.temperature": 0.2}, CODE)  # after --apply: a new baseline
    assert [t.user_attrs["base_values"]["stage_one.temperature"] for t in study.get_trials()] == [values["stage_one.temperature"], 0.2]


def test_report_writers_on_one_out_dir_wait_for_each_other_and_leave_no_lock_file_there(tmp_path):
    import threading

    from tqc.tuning.reports import reports_lock

    out = tmp_path / "reports" / "tuning"
    order: list[str] = []
    def second_writer() -> None:
        with reports_lock(out):
            order.append("second")

    with reports_lock(out):
        other = threading.Thread(target=second_writer)
        other.start()
        other.join(timeout=0.5)
        assert other.is_alive() and order == []  # the second writer waits while the first holds the lock
        order.append("first")
    other.join(timeout=10)
    assert order == ["first", "second"]
    assert not out.exists() or not any(out.iterdir())  # nothing left in the (git-tracked) reports folder


def test_the_reports_lock_lies_beside_the_reports_and_a_held_one_is_an_error_naming_it(tmp_path):
    """The lock was a name in the system temp folder: each machine's own, so workers on two machines sharing the
    reports folder did not exclude each other, and any user could take the name first; a held lock was waited on
    forever. It lies beside the reports (git-ignored), and a wait past the timeout names the file."""
    import threading

    from tqc.config import ConfigError
    from tqc.tuning.reports import reports_lock, reports_lock_path

    out = tmp_path / "reports" / "tuning"
    assert reports_lock_path(out) == tmp_path / "reports" / ".tuning.tune-reports.lock"
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", "reports/.tuning.tune-reports.lock"],
                             cwd=Path(__file__).resolve().parents[2])
    assert ignored.returncode == 0  # git-ignored, in the repository's own reports folder
    said: list[str] = []

    def waiting_worker() -> None:
        try:
            with reports_lock(out, timeout_s=0.2):
                said.append("got it")
        except ConfigError as error:
            said.append(str(error))

    with reports_lock(out):
        assert reports_lock_path(out).exists()
        other = threading.Thread(target=waiting_worker)
        other.start()
        other.join(timeout=10)
    assert len(said) == 1 and said[0].startswith(f"{reports_lock_path(out)}: another tune worker has held the reports")
    with reports_lock(out, timeout_s=0.2):  # released: the next takes it at once
        pass


def test_a_worker_that_comes_back_to_a_study_draws_anew_and_a_new_study_draws_as_before(tmp_path):
    from tqc.tuning.study import open_study

    params = Params().with_overrides({"tune": {"study": "again", "storage": f"sqlite:///{tmp_path / 'optuna.db'}"}})
    space = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}

    def draw(study, worker: int) -> float:
        trial = study.ask(space)
        trial.set_user_attr("worker", f"host:1:{worker}")  # as the objective tags each trial
        return trial.params["x"]

    first = draw(open_study(params, worker=0), 0)  # the study now holds one trial of worker 0
    assert draw(open_study(params, worker=0), 0) != first  # before: the same seed, so the same draw, trial for trial

    fresh = params.with_overrides({"tune": {"study": "fresh", "storage": f"sqlite:///{tmp_path / 'other.db'}"}})
    assert draw(open_study(fresh, worker=0), 0) == first  # reproducible from an empty study
    worker_1 = draw(open_study(fresh, worker=1), 1)  # opened after worker 0's trial: its draw is still seed + 1
    alone = params.with_overrides({"tune": {"study": "alone", "storage": f"sqlite:///{tmp_path / 'third.db'}"}})
    assert draw(open_study(alone, worker=1), 1) == worker_1


def test_a_baseline_that_failed_or_whose_worker_was_killed_is_queued_again(tmp_path, monkeypatch):
    import time

    from tqc.tuning import study as tuning_study
    from tqc.tuning.study import enqueue_baseline, open_study

    params = Params().with_overrides({"tune": {"study": "killed", "storage": f"sqlite:///{tmp_path / 'optuna.db'}"}})
    study = open_study(params, worker=0)
    values = {"stage_one.temperature": 0.1}
    enqueue_baseline(study, values, CODE)
    interrupted = study.ask()  # the baseline: Ctrl-C in its first epoch marks it FAIL
    study.tell(interrupted, state=optuna.trial.TrialState.FAIL)
    enqueue_baseline(study, values, CODE)
    killed = study.ask()  # queued again; this time its worker is killed: it stays RUNNING, its heartbeat stops
    study._storage.record_heartbeat(killed._trial_id)  # as optimize's heartbeat thread does
    assert killed.user_attrs["baseline"] and killed.number == 1
    enqueue_baseline(study, values, CODE)
    assert len(study.get_trials()) == 2  # a running baseline counts: no second one while it may still be alive

    monkeypatch.setattr(tuning_study, "GRACE_SECONDS", 1)
    time.sleep(2)  # silent for longer than the grace period
    study = open_study(params, worker=0)  # a worker that comes back fails the silent trial
    assert study.get_trials()[1].state == optuna.trial.TrialState.FAIL
    enqueue_baseline(study, values, CODE)
    waiting = study.get_trials()[-1]
    assert len(study.get_trials()) == 3 and waiting.state == optuna.trial.TrialState.WAITING and waiting.user_attrs["baseline"]


def test_a_trial_whose_worker_was_killed_keeps_a_reason_that_the_reports_name(tmp_path, monkeypatch):
    """Optuna's heartbeat check fails a killed worker's trial but keeps no reason, and lets no one set a user attribute
    on it once failed: the study keeps it, and the one-line error and trials.csv name it as they name the others'."""
    import time

    import pandas

    from tqc.tuning import study as tuning_study
    from tqc.tuning.reports import write_reports
    from tqc.tuning.study import enqueue_baseline, open_study

    params = Params().with_overrides({"tune": {"study": "lost", "storage": f"sqlite:///{tmp_path / 'optuna.db'}"}})
    monkeypatch.setattr(tuning_study, "GRACE_SECONDS", 1)
    study = open_study(params, worker=0)
    values = {"stage_one.temperature": 0.1}
    enqueue_baseline(study, values, CODE)
    killed = study.ask()  # the baseline, whose worker is then killed: its heartbeat stops
    killed.set_user_attr("worker", "gpu-7:4242:0")  # as the objective tags each trial
    study._storage.record_heartbeat(killed._trial_id)
    time.sleep(2)  # silent for longer than the grace period
    study = open_study(params, worker=1)  # another worker fails it
    assert study.get_trials()[0].state == optuna.trial.TrialState.FAIL
    enqueue_baseline(study, values, CODE)  # the reason leaves the killed baseline's queueing again as it was
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING]
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # failed without a reason (Ctrl-C): not named
    with pytest.raises(ConfigError) as refused:
        write_reports(study, params, None, tmp_path / "work", tmp_path / "reports")
    assert "(FAIL: 2; trial 0: worker lost: gpu-7:4242:0 sent no heartbeat for over 1 s mid-trial (killed, or its " \
           "machine lost)). " in str(refused.value)

    study.enqueue_trial({}, user_attrs={"baseline": True, "base_values": values})
    study.tell(study.ask(), 0.5)
    write_reports(study, params, None, tmp_path / "work", tmp_path / "reports")
    table = pandas.read_csv(tmp_path / "reports" / "trials.csv")
    assert table["user_attrs_failed"].fillna("").tolist() == [
        "worker lost: gpu-7:4242:0 sent no heartbeat for over 1 s mid-trial (killed, or its machine lost)", "", ""]


def test_a_pruned_trial_ends_its_mlflow_run_finished_and_tagged_pruned(tmp_path, monkeypatch):
    from tqc.tuning import trials
    from tqc.pipeline import PreparedData
    from tqc.tracking import standalone_run

    params = Params.model_validate({"tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "pruned"},
                                    "tune": {"space": {"stage_one.temperature": {"low": 0.05, "high": 0.2}}}})

    def pruned(*_, **__):
        raise optuna.TrialPruned("pruned at stage_one epoch 1")

    monkeypatch.setattr(trials, "train_chain", pruned)
    study = optuna.create_study(direction="maximize")
    with standalone_run("tune", params.tracking):
        study.optimize(trials.make_objective(params, params.tune.space, flat_base(params),
                                         PreparedData(tmp_path, tmp_path / "train.jsonl"), tmp_path, 0, CODE),
                       n_trials=1)
    assert study.trials[0].state == optuna.trial.TrialState.PRUNED
    (trial_run,) = [run for run in tracked_runs(params.tracking.uri) if "optuna.trial" in run["tags"]]
    assert trial_run["status"] == "FINISHED" and trial_run["tags"]["optuna.state"] == "PRUNED"  # not FAILED


def test_a_study_refuses_trials_on_other_data_unless_it_opens_one_study_per_data_set(tmp_path):
    """New labeled questions between two runs change the validation rows trials are scored on: trials of both runs
    in one study are not comparable, and its best may be a model of the old data. `on_new_data: new_study` opens
    one study per data set instead (a weekly tune beside nightly retrains)."""
    from tqc.pipeline import PreparedData
    from tqc.tuning.study import check_study_data, data_digest, study_name

    from tqc.schema import LabeledQuestion, save_questions

    def prepared(folder: str, source_dir: str, validation: int) -> PreparedData:
        data = PreparedData(tmp_path / folder, tmp_path / folder / "augmented.jsonl")
        data.directory.mkdir()
        Catalog([StandardQuestion("LOC", "Where is it?"), StandardQuestion("HUM", "Who is it?")]).save(
            data.directory / "catalog.jsonl")
        for name, count in (("train", 3), ("validation", validation), ("test", 2 + validation)):
            save_questions(data.directory / f"{name}.jsonl", [
                LabeledQuestion(f"{name} question {i}", "LOC", source=f"{source_dir}/train.csv:{i + 2}") for i in range(count)])
        return data

    first = data_digest(prepared("a", "../shared/datasets", 2))
    # the same rows read from another spelling of the data folder (another machine, an absolute path), and another
    # test split, which trials are never scored on: the same data
    assert data_digest(prepared("b", "/work/shared/datasets", 2)) == first
    grown = data_digest(prepared("c", "../shared/datasets", 3))  # a new validation question
    assert grown != first
    generated = prepared("d", "../shared/datasets", 2)
    save_questions(generated.directory / "generated.jsonl", [LabeledQuestion("made offline", "LOC")])
    assert data_digest(generated) != first  # augment.explicit: file trains on them

    params = Params.model_validate({"tune": {"study": "s", "storage": "postgresql://tuner:s3cret@db/optuna"}})
    study = optuna.create_study(study_name="s", direction="maximize")
    check_study_data(study, params, first)
    check_study_data(study, params, first)  # the same data: joins
    with pytest.raises(ConfigError, match=r"'s' in postgresql://tuner:\*\*\*@db/optuna holds trials trained and "
                                          r"scored on other data .* tune.on_new_data: new_study") as refused:
        check_study_data(study, params, grown)
    assert "s3cret" not in str(refused.value)

    assert study_name(params.tune, grown) == "s"
    per_data = params.tune.model_copy(update={"on_new_data": "new_study"})
    assert study_name(per_data, first) == f"s-data-{first[:12]}" != study_name(per_data, grown)


def test_a_dimension_added_to_or_removed_from_a_study_is_named_as_such(tmp_path, tiny_model_dir):
    from tqc.config import flatten
    from tqc.tuning.study import check_study_base

    params = Params.model_validate(tuning_params(tmp_path, tiny_model_dir))
    study = optuna.create_study(study_name="s", direction="maximize")
    base = flatten(params.model_dump(mode="json", by_alias=True, exclude={"tune"}))
    check_study_base(study, params, base)
    searched = {**params.tune.space, "stage_two.weight_decay": SearchDimension(low=0.0, high=0.1)}
    wider = params.model_copy(update={"tune": params.tune.model_copy(update={"space": searched})})
    with pytest.raises(ConfigError, match=r"stage_two.weight_decay: fixed at .* there, searched here"):
        check_study_base(study, wider, base)
    narrower = {k: v for k, v in params.tune.space.items() if k != "mine.k"}
    fewer = params.model_copy(update={"tune": params.tune.model_copy(update={"space": narrower})})
    with pytest.raises(ConfigError, match=r"mine.k: searched there, fixed at .* here"):
        check_study_base(study, fewer, base)

    # A param tqc gained after the study began (data.max_rejected_fraction) is not in its record: at its default the
    # study goes on; set otherwise, it is a difference like any other
    older = optuna.create_study(study_name="older", direction="maximize")
    older.set_user_attr("base_params", {k: v for k, v in study.user_attrs["base_params"].items()
                                        if k != "data.max_rejected_fraction"})
    older.set_user_attr("space_kinds", study.user_attrs["space_kinds"])
    check_study_base(older, params, base)
    with pytest.raises(ConfigError, match=r"data.max_rejected_fraction: None there, 0.5 here"):
        check_study_base(older, params, {**base, "data.max_rejected_fraction": 0.5})


def test_a_range_whose_log_changed_since_the_study_sampled_it_is_refused_when_joining(tmp_path, tiny_model_dir):
    """space_kinds records choices and int/float, not `log`: the edited space joined, and the first trial's draw failed
    with Optuna's "Cannot set different log configuration" after the data was prepared. Re-bounding stays fine."""
    from tqc.config import flatten
    from tqc.tuning.space import sample_overrides
    from tqc.tuning.study import join_study

    params = Params.model_validate(tuning_params(tmp_path, tiny_model_dir))
    study = optuna.create_study(study_name="s", direction="maximize")
    base = flatten(params.model_dump(mode="json", by_alias=True, exclude={"tune"}))
    join_study(study, params, base, "digest")
    trial = study.ask()
    sample_overrides(trial, params.tune.space, base)
    study.tell(trial, 0.5)

    def with_temperature(**dimension) -> Params:
        space = {**params.tune.space, "stage_one.temperature": SearchDimension(**dimension)}
        return params.model_copy(update={"tune": params.tune.model_copy(update={"space": space})})

    join_study(study, with_temperature(low=0.01, high=0.9, log=True), base, "digest")  # re-bounded: the same kind
    with pytest.raises(ConfigError, match=r"tune.space.stage_one.temperature: study 's' .* drew it from "
                                          r"FloatDistribution\(.*log=True.*\(trial 0\), here .*log=False"):
        join_study(study, with_temperature(low=0.05, high=0.5, log=False), base, "digest")


def test_a_refused_worker_leaves_the_study_as_it_found_it(tmp_path, tiny_model_dir):
    """A worker with a dimension the study never searched, refused for its dataset, recorded that dimension as
    searched there first: a right worker was then refused ("searched there, fixed here")."""
    from tqc.config import flatten
    from tqc.tuning.study import join_study

    params = Params.model_validate(tuning_params(tmp_path, tiny_model_dir))
    study = optuna.create_study(study_name="s", direction="maximize")
    base = flatten(params.model_dump(mode="json", by_alias=True, exclude={"tune"}))
    join_study(study, params, base, "digest")
    recorded = dict(study.user_attrs)
    searched = {**params.tune.space, "stage_two.weight_decay": SearchDimension(low=0.0, high=0.1)}
    mistaken = params.model_copy(update={"tune": params.tune.model_copy(update={"space": searched})})
    with pytest.raises(ConfigError, match="searched here"):
        join_study(study, mistaken, {**base, "data.dataset": "trec50"}, "digest")
    with pytest.raises(ConfigError, match="other data"):
        join_study(study, params, base, "other digest")
    assert study.user_attrs == recorded
    join_study(study, params, base, "digest")  # the right worker still joins


def test_reports_are_replaced_only_once_every_figure_is_in_hand(tmp_path, monkeypatch):
    """The test evaluation of the best trial can fail (a model folder gone, memory): best_params.yaml must not then
    sit beside the previous study's summary.json, whose dataset `tqc tune --apply` checks."""
    from tqc.tuning import reports

    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=0.9, params={"mine.k": 3},
                                              distributions={"mine.k": optuna.distributions.IntDistribution(1, 5)}))
    out = tmp_path / "reports"
    out.mkdir()
    (out / "best_params.yaml").write_text("mine:\n  k: 7\n")
    (out / "summary.json").write_text('{"dataset": "trec6"}')

    def evaluation_fails(*args, **kwargs):
        raise MemoryError("out of memory")

    monkeypatch.setattr(reports, "_trial_summary", evaluation_fails)
    with pytest.raises(MemoryError):
        reports.write_reports(study, Params(), None, tmp_path / "study", out)
    assert (out / "best_params.yaml").read_text() == "mine:\n  k: 7\n"  # the pair as it was
    assert (out / "summary.json").read_text() == '{"dataset": "trec6"}'


def test_a_second_process_with_a_running_workers_index_is_refused(tmp_path, tiny_model_dir):
    """A manual `tqc tune` beside the scheduled one, both worker 0: they would rewrite one data folder at once and
    seed their samplers alike (the same trials drawn twice). The second is refused before any work."""
    from filelock import FileLock

    params = Params.model_validate(tuning_params(tmp_path, tiny_model_dir))
    (tmp_path / "work" / "test").mkdir(parents=True)
    with FileLock(str(tmp_path / "work" / "test" / "worker-0.lock")):  # another process's worker 0, running
        with pytest.raises(ConfigError, match=r"worker 0 of study 'test' is running already on this machine .*--worker"):
            tune(params, tmp_path / "out", tmp_path / "work", worker=0)
    assert not (tmp_path / "work" / "test" / "data-worker-0").exists()  # refused before preparing anything


@pytest.mark.parametrize("failure", ["out of memory", "diverged"])
def test_a_trial_out_of_gpu_memory_or_diverged_fails_alone_and_the_worker_samples_on(tmp_path, tiny_model_dir,
                                                                                     monkeypatch, failure):
    """Sampled values too large for the GPU, or a learning rate that made the model diverge (mining meets NaN
    vectors), fail their trial, not the worker's remaining trials and its reports."""
    import torch

    from tqc.tuning import trials
    from tqc.metrics import DivergedScores

    real_chain, calls = trials.train_chain, []

    def second_runs_out_of_memory(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2 and failure == "out of memory":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if len(calls) == 2:
            raise DivergedScores("1 training question vector(s) hold NaN or inf (rows [3] first): the model diverged")
        return real_chain(*args, **kwargs)

    monkeypatch.setattr(trials, "train_chain", second_runs_out_of_memory)
    params = Params.model_validate(tuning_params(tmp_path, tiny_model_dir))
    tune(params, tmp_path / "reports", tmp_path / "work")

    study = optuna.load_study(study_name="test", storage=params.tune.storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert study.trials[1].user_attrs["failed"].startswith(("OutOfMemoryError: CUDA out of memory",
                                                            "DivergedScores: 1 training question vector(s)"))
    assert not (tmp_path / "work" / "test" / "trial-0001").exists()  # its partial models dropped
    assert json.loads((tmp_path / "reports" / "summary.json").read_text())["trials"] == {"COMPLETE": 2, "FAIL": 1}


def test_a_worker_whose_trials_all_failed_says_why_in_one_line(tmp_path):
    """Every trial out of GPU memory, diverged or pruned: the worker stopped on a traceback ending in RuntimeError
    "has no completed trial", which said neither how its trials ended nor what to change."""
    from tqc.metrics import DivergedScores
    from tqc.tuning.reports import write_reports

    def diverges(trial):
        trial.set_user_attr("failed", "DivergedScores: 3 training question vector(s) hold NaN or inf\n(rows [1] first)")
        raise DivergedScores("diverged")

    study = optuna.create_study(study_name="s", direction="maximize")
    study.optimize(diverges, n_trials=2, catch=(DivergedScores,))
    study.optimize(lambda trial: (_ for _ in ()).throw(optuna.TrialPruned()), n_trials=1)
    with pytest.raises(ConfigError) as refused:
        write_reports(study, Params(), None, tmp_path / "work", tmp_path / "reports")
    assert str(refused.value).startswith("study 's' has no completed trial, so nothing to report (PRUNED: 1, FAIL: 2; "
                                         "trial 1: DivergedScores: 3 training question vector(s) hold NaN or inf). ")
    assert "\n" not in str(refused.value) and not (tmp_path / "reports").exists()


def test_a_trial_that_draws_params_the_config_refuses_fails_alone_and_counts_for_its_worker(tmp_path, tiny_model_dir,
                                                                                            monkeypatch):
    """check_space sees the edges; a clash inside the ranges (none the shipped config has) fails its trial only."""
    from tqc.tuning import trials

    real, calls = trials.sample_overrides, []

    def second_draws_a_clash(trial, space, base):
        calls.append(trial.number)
        drawn = real(trial, space, base)
        return {**drawn, "stage_two.loss": "hinge", "stage_two.logit_adjustment": 0.5} if len(calls) == 1 else drawn

    monkeypatch.setattr(trials, "sample_overrides", second_draws_a_clash)
    params = Params.model_validate(tuning_params(tmp_path, tiny_model_dir))
    tune(params, tmp_path / "reports", tmp_path / "work")

    study = optuna.load_study(study_name="test", storage=params.tune.storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE"]  # the baseline, the clash, one more
    failed = study.trials[1]
    assert "loss hinge" in failed.user_attrs["refused"] and failed.user_attrs["worker"].endswith(":0")
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert summary["trials"] == {"COMPLETE": 2, "FAIL": 1}


def test_a_trial_whose_draw_the_model_refuses_fails_alone_and_the_worker_samples_on(tmp_path, tiny_model_dir, monkeypatch):
    """model.max_length 100 on a backbone of 64 positions is refused when the model is built, inside training: that
    ConfigError stopped the worker, with the study's other trials never run and no reports written."""
    from tqc.tuning import trials

    draws = iter([100, 32])
    monkeypatch.setattr(trials, "sample_overrides", lambda trial, space, base: {"model.max_length": next(draws)})
    params = Params.model_validate(tuning_params(tmp_path, tiny_model_dir,
                                                 space={"model.max_length": {"low": 16, "high": 128}}))
    tune(params, tmp_path / "reports", tmp_path / "work")

    study = optuna.load_study(study_name="test", storage=params.tune.storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert "model.max_length 100" in study.trials[1].user_attrs["refused"]
    assert json.loads((tmp_path / "reports" / "summary.json").read_text())["trials"] == {"COMPLETE": 2, "FAIL": 1}


def test_a_baseline_queued_for_earlier_base_values_trains_those_values(tmp_path, tiny_model_dir, monkeypatch):
    """A baseline left waiting by a worker that stopped, then run after the params changed (an --apply, an edit),
    trained the new values under its old label: best_params.yaml could then name a value no trial trained."""
    from tqc.tuning import trials

    raw = tuning_params(tmp_path, tiny_model_dir, trials=1, space={"stage_one.temperature": {"low": 0.05, "high": 0.5}})
    tune(Params.model_validate(raw), tmp_path / "reports", tmp_path / "work")  # the study, and its baseline at 0.1
    stale = {"stage_one.temperature": 0.07}
    optuna.load_study(study_name="test", storage=raw["tune"]["storage"]).enqueue_trial(
        {}, user_attrs={"baseline": True, "base_values": stale})  # as a stopped worker leaves it
    trained, real = [], trials.train_chain

    def recording(trial_params, *args, **kwargs):
        trained.append(trial_params.stage_one.temperature)
        return real(trial_params, *args, **kwargs)

    monkeypatch.setattr(trials, "train_chain", recording)
    raw["stage_one"]["temperature"], raw["tune"]["trials"] = 0.2, 2
    tune(Params.model_validate(raw), tmp_path / "reports", tmp_path / "work")

    study = optuna.load_study(study_name="test", storage=raw["tune"]["storage"])
    labelled = [t.user_attrs["base_values"]["stage_one.temperature"] for t in study.trials[1:]]
    assert labelled == [0.07, 0.2] and trained == labelled  # each baseline trains the values it is recorded with


def test_searched_epochs_under_a_pruner_and_a_temperature_hinge_never_reads_are_said():
    """A pruner compares trials step by step, and a searched stage_one.epochs moves every stage-two step; hinge
    reads no temperature, so a temperature searched beside it is drawn for nothing in those trials."""
    from tqc.tuning.space import check_space

    epochs = {"stage_one.epochs": {"low": 1, "high": 3}}
    with pytest.raises(ConfigError, match=r"stage_one.epochs searched under tune.pruner median: the pruner compares"):
        check_space(Params.model_validate({"tune": {"space": epochs, "pruner": "median"}}))
    check_space(Params.model_validate({"tune": {"space": epochs, "pruner": "none"}}))
    with pytest.raises(ConfigError, match=r"tune.space.stage_two.temperature: stage_two.loss is hinge in every trial"):
        check_space(Params.model_validate({"stage_two": {"loss": "hinge"},
                                           "tune": {"space": {"stage_two.temperature": {"low": 0.05, "high": 0.3}}}}))


def test_a_knob_of_a_feature_off_in_every_trial_is_refused_and_searched_with_its_switch_it_is_not():
    """warmup.margin with the warm-up off (the default), or prototype mixup's beta with mixup off, passed and would
    train: no trial reads them, so their best values were chance, carried into best_params.yaml."""
    from tqc.tuning.space import check_space

    def space(dimensions: dict, **sections) -> Params:
        return Params.model_validate({**sections, "tune": {"space": dimensions, "pruner": "none"}})

    margin = {"warmup.margin": {"low": 0.1, "high": 1.0}}
    with pytest.raises(ConfigError, match=r"tune.space.warmup.margin: warmup.enabled is false in every trial, so no "
                                          r"trial reads it; set warmup.enabled: true, or search warmup.enabled too"):
        check_space(space(margin))
    with pytest.raises(ConfigError, match=r"tune.space.augment.prototype_mixup.beta: augment.prototype_mixup.enabled "
                                          r"is false in every trial"):
        check_space(space({"augment.prototype_mixup.beta": {"low": 0.2, "high": 1.0}}))
    check_space(space(margin, warmup={"enabled": True, "unlabelled": "pool.csv"}))  # on: read by every trial
    check_space(space({**margin, "warmup.enabled": {"choices": [False, True]}}))  # on in some trials
    check_space(space({"augment.prototype_mixup.enabled": {"choices": [False, True]}}))  # the switch itself


def test_a_knob_no_trial_reads_beside_the_settings_every_trial_has_is_refused():
    """augment.rate with augment.implicit empty (the augmentation grids' base), or a stage's head_learning_rate with
    mean pooling and cosine (the defaults), passed: chance values written into best_params.yaml."""
    from tqc.tuning.space import check_space

    def space(dimensions: dict, **sections) -> Params:
        return Params.model_validate({**sections, "tune": {"space": dimensions, "pruner": "none"}})

    rate, placement = {"augment.rate": {"low": 0.0, "high": 0.3}}, {"augment.implicit_at": {"choices": ["input", "output"]}}
    for dimension, name in ((rate, "augment.rate"), (placement, "augment.implicit_at")):
        with pytest.raises(ConfigError, match=f"tune.space.{name}: augment.implicit is empty, so no trial augments"):
            check_space(space(dimension, augment={"implicit": []}))
        check_space(space(dimension))  # the default augments: read by every trial
    head = {"stage_one.head_learning_rate": {"low": 1e-4, "high": 1e-2, "log": True}}
    with pytest.raises(ConfigError, match=r"tune.space.stage_one.head_learning_rate: it trains the heads, and no trial "
                                          r"has one \(model.pooling: attention or model.similarity: mlp\)"):
        check_space(space(head))
    check_space(space(head, model={"pooling": "attention"}))
    check_space(space({**head, "model.similarity": {"choices": ["cosine", "mlp"]}}))  # a head in some trials


def test_a_listed_when_is_checked_value_by_value_and_says_a_knob_drawn_with_a_loss_that_never_reads_it(caplog):
    """`when: {stage_two.loss: [nt_xent, bpr]}`: each listed value is one the params accept and a trial can have; a
    temperature listed with every loss but hinge is drawn only where it acts, so nothing is said; listed with hinge,
    it is said (with hinge alone, refused) as a temperature searched beside hinge without a `when` is."""
    from tqc.tuning.space import check_space

    def space(dimensions: dict, **base) -> Params:
        return Params.model_validate({"tune": {"space": dimensions}, **base})

    losses = {"stage_two.loss": {"choices": ["nt_xent", "bpr", "hinge"]}}

    def temperature(*listed) -> dict:
        return {**losses, "stage_two.temperature": {"low": 0.05, "high": 0.3, "when": {"stage_two.loss": list(listed)}}}

    refused = {
        (): r"^tune.space.stage_two.temperature.when: stage_two.loss lists no value, so no trial would tune "
            r"stage_two.temperature$",
        ("sdml",): r"^tune.space.stage_two.temperature.when: stage_two.loss = 'sdml' is never drawn "
                   r"\(tune.space.stage_two.loss draws from \['nt_xent', 'bpr', 'hinge'\]\), so no trial would tune "
                   r"stage_two.temperature$",
        ("sdml", "decoupled"): r"^tune.space.stage_two.temperature.when: no trial has stage_two.loss in \['sdml', "
                               r"'decoupled'\], so no trial would tune stage_two.temperature \(",
        ("hinge",): r"tune.space.stage_two.temperature: stage_two.loss is hinge in every trial, which never reads it",
    }
    for listed, problem in refused.items():
        with pytest.raises(ConfigError, match=problem):
            check_space(space(temperature(*listed)))
    unsearched = {"stage_two.temperature": {"low": 0.05, "high": 0.3, "when": {"stage_two.loss": ["nt_xent", "hinj"]}}}
    with pytest.raises(ConfigError, match=r"stage_two.temperature.when: stage_two.loss = 'hinj' is not a value the params"):
        check_space(space(unsearched))
    # Values no trial has, beside one that some trial has, never act: the losses that read a knob, listed once,
    # stay right when the space draws fewer of them
    unsearched["stage_two.temperature"]["when"]["stage_two.loss"] = ["nt_xent", "bpr"]
    check_space(space(unsearched))
    unsearched["stage_two.temperature"]["when"]["stage_two.loss"] = ["bpr", "sdml"]
    with pytest.raises(ConfigError, match=r"no trial has stage_two.loss in \['bpr', 'sdml'\].*stage_two.loss is "
                                          r"'nt_xent' in every trial \(it is not searched\), never 'bpr'"):
        check_space(space(unsearched))
    with caplog.at_level(logging.WARNING, logger="tqc.tune"):
        check_space(space(temperature("nt_xent", "sdml")))  # sdml is never drawn here: no trial with hinge draws it
    assert "tune.space" not in caplog.text
    margin = {"low": 0.05, "high": 0.5}
    with pytest.raises(ConfigError, match=r"stage_two.margin: acts only with stage_two.loss: hinge, and stage_two.loss "
                                          r"is bpr or nt_xent in every trial"):
        check_space(space({**losses, "stage_two.margin": {**margin, "when": {"stage_two.loss": ["nt_xent", "bpr"]}}}))
    with caplog.at_level(logging.WARNING, logger="tqc.tune"):
        check_space(space(temperature("nt_xent", "bpr")))
    assert "tune.space" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="tqc.tune"):
        check_space(space(temperature("nt_xent", "hinge")))
        check_space(space({**losses, "stage_two.margin": {**margin, "when": {"stage_two.loss": ["hinge", "bpr"]}}}))
    assert "tune.space.stage_two.temperature is not read where stage_two.loss is hinge" in caplog.text
    assert "when: {stage_two.loss: [nt_xent]}" in caplog.text
    assert "stage_two.margin acts only with stage_two.loss: hinge; drawn where stage_two.loss is bpr too" in caplog.text
    # the edge values are checked with each listed value: logit_adjustment above 0 clashes with hinge alone
    adjustment = {"low": 0.0, "high": 1.0}
    check_space(space({**losses, "stage_two.logit_adjustment": {**adjustment, "when": {"stage_two.loss": ["nt_xent", "bpr"]}}}))
    with pytest.raises(ConfigError, match=r"stage_two.logit_adjustment = 1.0 is not a value the params accept"):
        check_space(space({**losses, "stage_two.logit_adjustment": {**adjustment,
                                                                    "when": {"stage_two.loss": ["nt_xent", "hinge"]}}}))
    # and every combination a trial may draw: a prior weight drawn with a listed similarity, beside a hinge stage one
    mixup = {"prototype_mixup": {"enabled": True, "prior_weight": 0.0}}
    with pytest.raises(ConfigError, match=r"may draw stage_one.loss = 'hinge', augment.prototype_mixup.prior_weight = 2.0"):
        check_space(space({"model.similarity": {"choices": ["cosine", "inner", "mlp"]}, "stage_one.loss": {"choices": ["bpr", "hinge"]},
                           "augment.prototype_mixup.prior_weight": {"low": 0.0, "high": 2.0,
                                                                    "when": {"model.similarity": ["cosine", "inner"]}}},
                          augment=mixup))


def test_the_tuner_refuses_values_that_clash_together_or_can_never_be_drawn_before_any_work():
    from tqc.config import ConfigError
    from tqc.tuning.space import check_space

    def space(dimensions: dict, **base) -> Params:
        return Params.model_validate({"tune": {"space": dimensions}, **base})

    losses = {"stage_two.loss": {"choices": ["nt_xent", "hinge"]}}
    with pytest.raises(ConfigError, match=r"may draw stage_two.loss = 'hinge', stage_two.logit_adjustment = 1.0 together"):
        check_space(space({**losses, "stage_two.logit_adjustment": {"low": 0.0, "high": 1.0}}))
    check_space(space({**losses, "stage_two.logit_adjustment": {"low": 0.0, "high": 1.0,  # only with nt_xent: fine
                                                                "when": {"stage_two.loss": "nt_xent"}}}))
    with pytest.raises(ConfigError, match=r"stage_one.loss = 'hinge', augment.prototype_mixup.prior_weight = 2.0 together"):
        check_space(space({"stage_one.loss": {"choices": ["bpr", "hinge"]},
                           "augment.prototype_mixup.prior_weight": {"low": 0.0, "high": 2.0}},
                          augment={"prototype_mixup": {"enabled": True, "prior_weight": 0.0}}))
    with pytest.raises(ConfigError, match=r"stage_two.loss = 'hinge' is never drawn \(tune.space.stage_two.loss draws"):
        check_space(space({"stage_two.loss": {"choices": ["nt_xent", "bpr"]},
                           "stage_two.margin": {"low": 0.1, "high": 0.5, "when": {"stage_two.loss": "hinge"}}}))
    # the base loss is hinge: logit_adjustment's values are checked with the loss its `when` needs, not the base's
    check_space(space({"stage_two.loss": {"choices": ["hinge", "nt_xent"]},
                       "stage_two.logit_adjustment": {"low": 0.0, "high": 1.0, "when": {"stage_two.loss": "nt_xent"}}},
                      stage_two={"loss": "hinge"}))
    with pytest.raises(ConfigError, match=r"stage_two.temperature = 0.1 is never drawn"):  # a float range's draws
        check_space(space({"stage_two.temperature": {"low": 0.05, "high": 0.2},
                           "stage_two.margin": {"low": 0.1, "high": 0.5, "when": {"stage_two.temperature": 0.1}}}))
    with pytest.raises(ConfigError, match=r"mine.k takes integers, and none lies in \[2.2, 2.8\]"):
        check_space(space({"mine.k": {"low": 2.2, "high": 2.8}}))
    from tqc.config import load_params

    check_space(load_params(Path(__file__).resolve().parents[2] / "params.yaml"))  # the shipped space: all accepted


def test_a_trial_that_ties_the_best_keeps_its_models_and_a_best_without_models_says_so(tmp_path):
    """Optuna breaks no tie by trial order: a later trial tied with the best may be reported as best, so it keeps its
    models; a best trial whose models are not here (another machine, or dropped) has test: null and the reason."""

    from tqc.pipeline import PreparedData
    from tqc.tuning.reports import _trial_summary
    from tqc.tuning.trials import _worth_keeping

    study = SimpleNamespace(best_value=0.8)
    assert _worth_keeping(SimpleNamespace(user_attrs={}, study=study), 0.8)  # a tie
    assert not _worth_keeping(SimpleNamespace(user_attrs={}, study=study), 0.79)
    trial = SimpleNamespace(number=3, value=0.8, params={"mine.k": 4}, user_attrs={})
    summary = _trial_summary(trial, tmp_path, PreparedData(tmp_path, tmp_path / "train.jsonl"), Params())
    assert summary["test"] is None and "trial-0003" in summary["test_missing"]


def test_a_best_whose_models_another_worker_drops_while_it_is_read_is_reported_without_test(tmp_path, monkeypatch):
    """Two workers on one study: one writes its reports while the other's new best drops the models of the best the
    first one read (tune.keep_models false). The report says so, and the worker does not stop on the vanished file."""
    import shutil

    from tqc.tuning import reports
    from tqc.pipeline import PreparedData

    model_dir = tmp_path / "trial-0003" / "stage_two"
    model_dir.mkdir(parents=True)
    (model_dir / "tqc_model.json").write_text("{}", encoding="utf-8")

    def dropped_meanwhile(model_dir, data, params):
        shutil.rmtree(model_dir.parent)  # the other worker's _drop_former_bests
        raise FileNotFoundError(model_dir / "model.safetensors")

    monkeypatch.setattr(reports, "_test_metrics", dropped_meanwhile)
    trial = SimpleNamespace(number=3, value=0.8, params={"mine.k": 4}, user_attrs={})
    summary = reports._trial_summary(trial, tmp_path, PreparedData(tmp_path, tmp_path / "train.jsonl"), Params())
    assert summary["test"] is None and "dropped while it was read" in summary["test_missing"]


def test_a_worker_whose_best_another_worker_outdid_while_it_was_read_reports_the_new_best(tmp_path, monkeypatch):
    """Two workers on one study (tune.keep_models false): the other worker's trial 2 was recorded above the best one
    worker had read, and dropped that best's models while its reports scored them. Its summary, best_params.yaml and
    MLflow metric named the older best, without test figures; the best is now read again, and the new one reported."""
    from tqc.tuning import reports, trials

    study, objective, params = _study_of_stub_trials(tmp_path, monkeypatch, [0.6, 0.7, 0.8])
    callback = trials.dropping_former_bests(tmp_path / "study", params)
    study.optimize(objective, n_trials=2, callbacks=[callback])  # the baseline, then trial 1: the best, its models kept
    models = lambda number: tmp_path / "study" / f"trial-{number:04d}" / "stage_two" / "tqc_model.json"
    for number in (0, 1):
        models(number).write_text("{}", encoding="utf-8")  # the stand-in chain writes empty model folders
    scored = []

    def the_other_worker_outdoes_it(model_dir, data, params):
        if model_dir.parent.name == "trial-0001":  # its best is read: the other worker's trial 2 ends meanwhile
            other = study.ask()
            study.tell(other, objective(other))
            models(2).write_text("{}", encoding="utf-8")
            callback(study, study.trials[2])  # its new best drops trial 1's models
            raise FileNotFoundError(model_dir / "model.safetensors")
        scored.append(model_dir.parent.name)
        return {"accuracy": 0.9, "macro_f1": 0.85, "n": 10}

    monkeypatch.setattr(reports, "_test_metrics", the_other_worker_outdoes_it)
    result = reports.write_reports(study, params, None, tmp_path / "study", tmp_path / "reports")
    assert result.summary["best"]["number"] == 2 and result.summary["best"]["test"]["macro_f1"] == 0.85
    assert "trial 2: validation macro-F1 0.8000" in (tmp_path / "reports" / "best_params.yaml").read_text()
    assert scored == ["trial-0002", "trial-0000"]  # the new best, then the baseline


CODE = "c0de" * 10  # the code version the stub trials are trained by (`tqc.tracking.code_version`'s)


def _study_of_stub_trials(tmp_path: Path, monkeypatch, values: list, space: dict | None = None, pruner=None):
    """An in-memory study with its baseline queued, and tune's own objective over a stand-in training chain: each
    trial writes its two model folders and scores the next of `values` (the baseline's first; an exception is raised
    instead; a list is a curve, each epoch's validation macro-F1 reported as stage one's, the best returned).
    → (study, objective, params), the study's folder tmp_path/study, its trials trained by code CODE; `objective_of`
    gives the objective of other code."""
    from tqc.tuning import trials

    scores = iter(values)

    def chain(params, data_dir, train, trial_dir, *args, on_epoch, **kwargs):
        for name in ("stage_one", "stage_two"):
            (trial_dir / name).mkdir(parents=True)
        score = next(scores)
        if isinstance(score, BaseException):
            raise score
        for epoch, value in enumerate(score if isinstance(score, list) else [], start=1):
            on_epoch("stage_one", SimpleNamespace(epoch=epoch, validation_macro_f1=value, validation_accuracy=value))
        best = max(score) if isinstance(score, list) else score
        return SimpleNamespace(fits={"stage_two": SimpleNamespace(best_validation_macro_f1=best)})

    monkeypatch.setattr(trials, "train_chain", chain)
    # by default a float range, whose draws never repeat one another (a repeat would train nothing)
    space = space or {"stage_one.temperature": {"low": 0.05, "high": 0.5}}
    params = Params.model_validate({"tracking": {"enabled": False}, "tune": {"space": space}})
    study = optuna.create_study(direction="maximize", pruner=pruner or optuna.pruners.NopPruner())
    base_values = default_values(params.tune.space, flat_base(params))
    study.enqueue_trial({}, user_attrs={"baseline": True, "base_values": base_values})
    return study, objective_of(tmp_path, params, CODE), params


def objective_of(tmp_path: Path, params: Params, version: str):
    """tune's objective for a worker whose code is `version`, the study's folder tmp_path/study."""
    from tqc.tuning import trials
    from tqc.pipeline import PreparedData

    return trials.make_objective(params, params.tune.space, flat_base(params),
                                 PreparedData(tmp_path, tmp_path / "train.jsonl"), tmp_path / "study", 0, version)


def test_a_trial_stopped_by_ctrl_c_or_by_an_error_that_stops_the_worker_keeps_its_reason(tmp_path, monkeypatch):
    """Optuna fails a trial whose objective raised anything outside TRIAL_FAILURES (KeyboardInterrupt too) and keeps
    no reason: the study showed it FAIL with nothing to say why, where a heartbeat-failed trial keeps one."""
    from tqc.tuning.study import failure_reasons

    study, objective, _ = _study_of_stub_trials(tmp_path, monkeypatch, [KeyboardInterrupt(), ValueError("a bug\nhere")])
    with pytest.raises(KeyboardInterrupt):  # still stops the tuner
        study.optimize(objective, n_trials=2)
    with pytest.raises(ValueError, match="a bug"):  # still stops the worker, loudly
        study.optimize(objective, n_trials=2)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL] * 2
    assert failure_reasons(study) == {0: "interrupted (KeyboardInterrupt)", 1: "ValueError: a bug"}
    assert _part_trained(tmp_path, 0, 1) == []  # dropped, as a failed trial's are


def test_a_refusal_in_training_fails_its_trial_alone_only_where_it_names_a_param_the_trial_drew(tmp_path, monkeypatch,
                                                                                              caplog):
    """A ConfigError raised once the model is built is the draw's fault only where it names a param the trial drew;
    the baseline's (it draws nothing), or one naming no drawn param (a model folder unreadable), would fail every
    trial alike: it stops the worker, loudly, with its reason kept, where the draw's fails its trial alone."""
    from tqc.tuning.study import failure_reasons
    from tqc.tuning.trials import TRIAL_FAILURES

    study, objective, _ = _study_of_stub_trials(tmp_path, monkeypatch, [
        ConfigError("stage_one.temperature 0.1: refused by the model"),  # the baseline's: the base params' fault
        ConfigError("model.model_dir: not a model folder"),  # names no param the trial drew
        # names another key that begins with the drawn one's name: a substring match read it as the trial's
        ConfigError("stage_one.temperature_floor 0.05: refused by the model"),
        ConfigError("stage_one.temperature 0.3: refused by the model"),  # names the trial's draw
        0.7])
    for _ in range(3):
        with pytest.raises(ConfigError):  # the worker stops
            study.optimize(objective, n_trials=1, catch=TRIAL_FAILURES)
    with caplog.at_level(logging.WARNING, logger="tqc.tune"):
        study.optimize(objective, n_trials=2, catch=TRIAL_FAILURES)  # the refused trial fails, the next one runs

    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL", "FAIL", "FAIL", "COMPLETE"]
    assert failure_reasons(study) == {0: "ConfigError: stage_one.temperature 0.1: refused by the model",
                                      1: "ConfigError: model.model_dir: not a model folder",
                                      2: "ConfigError: stage_one.temperature_floor 0.05: refused by the model",
                                      3: "stage_one.temperature 0.3: refused by the model"}
    assert "refused" in study.trials[3].user_attrs and "failed" not in study.trials[3].user_attrs
    assert "refused" not in study.trials[2].user_attrs
    assert "tune: trial 3 drew params the model refuses, and fails: stage_one.temperature 0.3: refused by the model" \
        in caplog.messages
    assert _part_trained(tmp_path, 0, 1, 2, 3) == []  # the trials that stopped the worker drop theirs too


def _part_trained(tmp_path: Path, *trials: int) -> list[str]:
    """The model folders these trials of _study_of_stub_trials' study left."""
    from tqc.tuning.trials import trial_dir_of

    return [f"{number}/{name}" for number in trials for name in ("stage_one", "stage_two")
            if (trial_dir_of(tmp_path / "study", number) / name).exists()]


def test_a_tuned_warm_up_margin_reaches_each_trials_warm_up_whose_models_are_dropped_with_the_others(tmp_path,
                                                                                                   tiny_model_dir):
    """With warmup.enabled, every trial warms up first (pipeline.train_chain), with the margin it drew; its warm-up
    model is dropped with its encoders where tune.keep_models says so."""
    from tqc.tuning.trials import _drop_models

    raw = tuning_params(tmp_path, tiny_model_dir, keep_models=True, trials=2)
    raw["tune"]["space"] = {"warmup.margin": {"low": 0.2, "high": 0.9}}
    raw["warmup"] = {"enabled": True, "candidates": 3, "max_steps": 1}
    params = Params.model_validate(raw)
    tune(params, tmp_path / "reports", tmp_path / "work")
    study = optuna.load_study(study_name="test", storage=params.tune.storage)
    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(trials) == 2
    for trial in trials:
        trial_dir = tmp_path / "work" / "test" / f"trial-{trial.number:04d}"
        expected = trial.user_attrs["base_values"] if trial.number == 0 else trial.params
        warmed = json.loads((trial_dir / "warmup" / "tqc_model.json").read_text())
        assert warmed["params"]["margin"] == pytest.approx(expected["warmup.margin"])
        assert json.loads((trial_dir / "stage_one" / "tqc_model.json").read_text())["warmed_up_from"] == str(
            trial_dir / "warmup")
    _drop_models(trial_dir, params.with_overrides({"tune": {"keep_models": False}}))
    assert not any((trial_dir / name).exists() for name in ("warmup", "stage_one", "stage_two"))


def test_a_new_best_drops_the_models_of_the_bests_it_outdid_and_the_baseline_keeps_its_own(tmp_path, monkeypatch):
    """With tune.keep_models false, each trial that became the best kept its two encoders to the end, though only
    the final best and the baseline are scored on test: a long study kept every successive best."""
    from tqc.tuning.trials import dropping_former_bests

    # the baseline, then trials 1..4
    study, objective, params = _study_of_stub_trials(tmp_path, monkeypatch, [0.6, 0.5, 0.7, 0.8, 0.75])
    study.optimize(objective, n_trials=5, callbacks=[dropping_former_bests(tmp_path / "study", params)])
    kept = sorted(path.parent.name for path in (tmp_path / "study").glob("trial-*/stage_two"))
    assert kept == ["trial-0000", "trial-0003"]  # the baseline below the best, and the best; not 0.7's trial 2


def test_a_trial_another_worker_outdid_while_it_ran_drops_its_models_once_recorded(tmp_path, monkeypatch):
    """Two workers on one study: trial 1 ended above the best, so kept its models, but trial 2 (the other worker's)
    was recorded complete above it first, and dropped only the trials complete by then. Trial 1 is never scored."""
    from tqc.tuning.trials import dropping_former_bests

    # the baseline, then trial 1, then trial 2
    study, objective, params = _study_of_stub_trials(tmp_path, monkeypatch, [0.6, 0.7, 0.8])
    callback = dropping_former_bests(tmp_path / "study", params)
    study.optimize(objective, n_trials=1, callbacks=[callback])
    first, second = study.ask(), study.ask()
    first_value = objective(first)  # 0.7 beats the baseline: kept
    study.tell(second, objective(second))  # the other worker's 0.8, recorded first
    callback(study, study.trials[2])
    study.tell(first, first_value)
    callback(study, study.trials[1])
    kept = sorted(path.parent.name for path in (tmp_path / "study").glob("trial-*/stage_two"))
    assert kept == ["trial-0000", "trial-0002"]


def test_a_new_best_stopped_before_it_is_recorded_leaves_the_best_it_would_have_outdone_its_models(tmp_path,
                                                                                                  monkeypatch):
    """A worker stopped (cancelled, killed, its storage gone) once a new best's objective returned but before Optuna
    recorded it complete: the study's best is still the former best, whose models are scored on test at the end."""
    from tqc.tuning.trials import dropping_former_bests

    # the baseline, then trial 1 (the best), then trial 2, which is never recorded
    study, objective, params = _study_of_stub_trials(tmp_path, monkeypatch, [0.6, 0.7, 0.8])
    callbacks = [dropping_former_bests(tmp_path / "study", params)]
    study.optimize(objective, n_trials=2, callbacks=callbacks)
    trial = study.ask()
    objective(trial)  # trial 2 ends, and the worker stops before study.tell
    assert study.best_trial.number == 1 and (tmp_path / "study" / "trial-0001" / "stage_two").is_dir()


@pytest.mark.parametrize("storage, said", [
    ("notaurl", "not a database URL"),
    ("sqlite:/one/slash.db", "not a database URL"),
    ("sqlite:////nonexistent/dir/optuna.db", "no folder /nonexistent/dir to keep the study's database in"),
])
def test_a_storage_that_cannot_hold_a_study_is_refused_by_its_setting_before_any_data_is_prepared(storage, said):
    """SQLAlchemy's own words ("Could not parse SQLAlchemy URL", "unable to open database file") came after the data was
    prepared, and named neither tune.storage nor the URL; MLflow uses SQLAlchemy too."""
    from tqc.tuning.study import check_storage

    with pytest.raises(ConfigError, match=rf"tune.storage {re.escape(repr(storage))}: {said}"):
        check_storage(storage)
    check_storage("sqlite:///optuna.db")
    check_storage("postgresql://tqc@db.example/optuna")  # a server is not reached here


def test_a_password_in_a_refused_storage_url_is_not_said():
    from tqc.tuning.study import check_storage

    with pytest.raises(ConfigError) as refused:
        check_storage("postgresql://tqc:hunter2@db.example:notaport/optuna")
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize("storage, said", [
    ("sqlite:///{tmp}/not-a-database.db", "file is not a database"),
    ("postgresql://tqc:hunter2@127.0.0.1:1/optuna", "Connection refused"),  # tried again, as a race would be
    ("nosuchengine://tqc@localhost/optuna", "Can't load plugin: sqlalchemy.dialects:nosuchengine"),
])
def test_a_storage_that_cannot_be_opened_is_said_in_one_line_naming_it_before_any_data_is_prepared(
        tmp_path, monkeypatch, storage, said):
    """Opened only after the data was prepared, it stopped with SQLAlchemy's own lines (SQL, a link) as `error from
    sqlalchemy`, naming neither tune.storage nor its URL."""
    from tqc import tune as tune_entry
    from tqc.tuning import study as tuning_study

    (tmp_path / "not-a-database.db").write_text("question,label\n")
    storage = storage.format(tmp=tmp_path)
    monkeypatch.setattr(tune_entry, "prepare_data", lambda *_: pytest.fail("the data was prepared first"))
    monkeypatch.setattr(tuning_study, "time", SimpleNamespace(sleep=lambda _: None), raising=False)  # no waits between tries
    params = Params.model_validate({"tune": {"storage": storage, "space": {"mine.k": {"low": 1, "high": 3}}}})
    with pytest.raises(ConfigError) as refused:
        tune(params, tmp_path / "reports", tmp_path / "work")
    message = str(refused.value)
    assert message.startswith(f"tune.storage {storage.replace('hunter2', '***')!r}: cannot open the study's database: ")
    assert said in message and "\n" not in message and "hunter2" not in message


def test_a_database_server_that_takes_the_connection_and_never_answers_is_given_up_on(monkeypatch):
    """libpq waits for ever by default: a server half up (or a proxy in front of one that is down) held the tuning
    worker, and the weekly flow's runs queued behind it. Now the driver's connect timeout is tracking's bound
    (CONNECT_SECONDS, made 1 s here) and the worker stops with one line naming tune.storage."""
    import time

    from tests.servers import silent_server
    from tqc import tracking
    from tqc.tuning import study as tuning_study

    assert tuning_study.connect_bound("postgresql://u@h/db") == {"connect_args": {"connect_timeout": tracking.CONNECT_SECONDS}}
    assert tuning_study.connect_bound("sqlite:///optuna.db") is None  # SQLite's timeout is its wait on a locked file
    monkeypatch.setattr(tracking, "CONNECT_SECONDS", 1)
    with silent_server() as port:
        params = Params.model_validate({"tune": {"storage": f"postgresql://optuna:hunter2@127.0.0.1:{port}/optuna",
                                                 "space": {"mine.k": {"low": 1, "high": 3}}}})
        started = time.monotonic()
        with pytest.raises(ConfigError, match=r"^tune.storage 'postgresql://optuna:\*\*\*@127.0.0.1:\d+/optuna': cannot "
                                              r"open the study's database: .*timeout expired"):
            tuning_study.open_storage(params, 0, attempts=1)
    assert time.monotonic() - started < 30


def test_a_tracking_store_that_cannot_be_made_is_said_before_any_data_is_prepared(tmp_path, monkeypatch):
    """It was opened with the study's MLflow run, after the data was prepared: minutes of ingest, validate and augment
    before the misspelt folder was said."""
    from tqc import tune as tune_entry

    monkeypatch.setattr(tune_entry, "prepare_data", lambda *_: pytest.fail("the data was prepared first"))
    params = Params.model_validate({
        "tune": {"storage": f"sqlite:///{tmp_path}/optuna.db", "space": {"mine.k": {"low": 1, "high": 3}}},
        "tracking": {"enabled": True, "uri": f"sqlite:///{tmp_path}/no-such-folder/mlflow.db"}})
    with pytest.raises(ConfigError, match=r"^tracking.uri \(or \$MLFLOW_TRACKING_URI\) sqlite:///.*/no-such-folder/mlflow.db: "
                                         "no folder .*no-such-folder to keep the MLflow database in$"):
        tune(params, tmp_path / "reports", tmp_path / "work")


def test_tuning_for_several_processes_says_its_stage_one_trains_with_other_in_batch_negatives(tmp_path, caplog):
    """Each process of a dvc repro run draws stage one's in-batch negatives from its share of the batch
    (docs/scaling.md), a trial from the whole batch: the warning said only that a trial trains in one process."""
    (tmp_path / "not-a-database.db").write_text("x\n")  # stops the worker once the warning is said
    params = Params.model_validate({"distributed": {"nproc_per_node": 4},
                                    "tune": {"storage": f"sqlite:///{tmp_path / 'not-a-database.db'}",
                                             "space": {"mine.k": {"low": 1, "high": 3}}}})
    with caplog.at_level(logging.WARNING, logger="tqc.tune"), pytest.raises(ConfigError):
        tune(params, tmp_path / "reports", tmp_path / "work")
    assert "draws in-batch negatives from the whole batch, where dvc repro's processes each draw them from their share " \
           "(a 1/4)" in caplog.text


def test_a_losss_own_knob_searched_where_no_trial_trains_that_loss_is_refused(caplog):
    """stage_two.margin acts only under hinge and smoothing only under sdml (`losses.make_loss`): searched with the
    loss fixed at nt_xent, half the dimensions did nothing and best_params.yaml carried chance values."""
    from tqc.tuning.space import check_space

    def space(dimensions: dict, **base) -> Params:
        return Params.model_validate({"tune": {"space": dimensions}, **base})

    margin = {"low": 0.05, "high": 0.5}
    with pytest.raises(ConfigError, match=r"tune.space.stage_two.margin: acts only with stage_two.loss: hinge, and "
                                          r"stage_two.loss is nt_xent in every trial"):
        check_space(space({"stage_two.margin": margin}))
    with pytest.raises(ConfigError, match=r"stage_one.smoothing: acts only with stage_one.loss: sdml, and "
                                          r"stage_one.loss is bpr or hinge in every trial"):
        check_space(space({"stage_one.loss": {"choices": ["bpr", "hinge"]}, "stage_one.smoothing": {"low": 0.0, "high": 0.2}}))
    check_space(space({"stage_two.margin": margin}, stage_two={"loss": "hinge"}))  # the loss every trial trains
    with caplog.at_level(logging.WARNING, logger="tqc.tune"):
        check_space(space({"stage_two.loss": {"choices": ["nt_xent", "hinge"]}, "stage_two.margin": margin}))
    assert ("tune.space.stage_two.margin acts only with stage_two.loss: hinge; drawn where stage_two.loss is nt_xent too"
            in caplog.text)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tqc.tune"):  # the shipped space: margin, smoothing and temperature
        check_space(load_params(Path(__file__).resolve().parents[2] / "params.yaml"))  # drawn only where they act
    assert "tune.space" not in caplog.text


@pytest.mark.parametrize("best_number, said", [
    (4, "best validation macro-F1 0.8100 (trial 4; the baseline, trial 0: 0.8000) in study 's'; apply with: tqc --params "),
    (0, "best validation macro-F1 0.8000 (trial 0) in study 's'; the baseline is best: the params' values stand, nothing "
        "to apply"),
])
def test_tune_ends_with_the_best_against_the_baseline_and_how_to_apply_it(tmp_path, monkeypatch, capsys, best_number, said):
    """It printed the tuned values as a Python dict; where they are and how to apply them was in the log only."""
    from tqc import cli
    from tqc import tune as tune_entry
    from tqc.tuning import reports

    baseline = {"number": 0, "validation_macro_f1": 0.80, "params": {"mine.k": 2}}
    best = baseline if best_number == 0 else {"number": best_number, "validation_macro_f1": 0.81, "params": {"mine.k": 5}}
    monkeypatch.setattr(tune_entry, "tune", lambda *_, **__: reports.TuneResult("s", {}, {"best": best, "baseline": baseline}))
    params_file = tmp_path / "team.yaml"
    params_file.write_text("tracking: {enabled: false}\n")
    assert cli.main(["--params", str(params_file), "tune", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert said in out
    if best_number:
        assert out.strip().endswith(f"--params {params_file} tune --apply {tmp_path / 'out' / 'best_params.yaml'}")


def test_a_registered_version_that_is_not_a_number_is_refused_by_the_parser(capsys):
    from tqc import cli

    with pytest.raises(SystemExit) as ended:
        cli.main(["set-champion", "abc"])
    assert ended.value.code == 2 and "'abc': a registered version is a number" in capsys.readouterr().err


def test_an_importance_plot_from_fewer_than_ten_trials_says_it_is_noise(tmp_path, caplog, monkeypatch):
    """fANOVA ranks a study's knobs from its trials; from three it draws a confident bar chart out of noise."""
    import matplotlib.figure

    from tqc.tuning.reports import _plots, importance_caveat, IMPORTANCE_MIN_TRIALS

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1) + trial.suggest_float("y", 0, 1) / 10, n_trials=3)
    titles = {}
    savefig = matplotlib.figure.Figure.savefig

    def saving(figure, *args, **kwargs):
        titles[len(titles)] = {loc: figure.axes[0].get_title(loc=loc) for loc in ("left", "center")}
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", saving)
    with caplog.at_level(logging.WARNING, logger="tqc.tune"):
        _plots(study, tmp_path)
    assert (tmp_path / "importance.png").stat().st_size > 0
    # one title, Optuna's (left), the caveat under it: a centred one was drawn over it
    assert titles[1]["center"] == "" and titles[1]["left"].startswith("Hyperparameter Importances\n(importance from 3")
    assert "tune: importance from 3 complete trials is noise, not a ranking: read it from 10 trials on" in caplog.text
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=IMPORTANCE_MIN_TRIALS - 3)
    assert importance_caveat(study) is None


PLOTS_IN_A_PROCESS = """
import os, sys
import optuna
optuna.logging.set_verbosity(optuna.logging.ERROR)
if sys.argv[2] == "pyplot in use":  # a backend of the caller's, drawing as Agg does (Jupyter's inline one does)
    import matplotlib
    matplotlib.use("module://notebook_like")
    import matplotlib.pyplot
from pathlib import Path
from tqc.tuning.reports import _plots
study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
_plots(study, Path(sys.argv[1]))
import matplotlib
print(matplotlib.get_backend().lower())
"""


@pytest.mark.parametrize("chosen, backend", [("nothing", "agg"), ("pyplot in use", "module://notebook_like")])
def test_the_study_plots_choose_a_file_backend_only_where_nothing_chose_one(tmp_path, chosen, backend):
    """The plots switched every caller to Agg, a notebook's inline figures included."""
    import subprocess

    (tmp_path / "notebook_like.py").write_text(
        "from matplotlib.backends.backend_agg import FigureCanvasAgg\n\n\nclass FigureCanvas(FigureCanvasAgg):\n    pass\n")
    environment = {key: value for key, value in os.environ.items() if key != "MPLBACKEND"}
    environment["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
    ran = subprocess.run([sys.executable, "-c", PLOTS_IN_A_PROCESS, str(tmp_path), chosen], env=environment,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split()[-1] == backend and (tmp_path / "history.png").stat().st_size > 0


def test_the_apply_command_names_a_params_file_other_than_params_yaml():
    """best_params.yaml's comment said `tqc tune --apply …` for a study run with `--params team.yaml`, which would
    have written the values into params.yaml."""
    from tqc.tuning.reports import apply_command

    out = Path("reports/tuning")
    assert apply_command(Path("params.yaml"), out) == "tqc tune --apply reports/tuning/best_params.yaml"
    assert apply_command(Path("conf/team.yaml"), out) == "tqc --params conf/team.yaml tune --apply reports/tuning/best_params.yaml"


def test_a_study_run_with_another_params_file_writes_its_apply_command(tmp_path, monkeypatch):
    from tqc.tuning import reports

    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=0.9, params={"mine.k": 3},
                                              distributions={"mine.k": optuna.distributions.IntDistribution(1, 5)}))
    monkeypatch.setattr(reports, "_trial_summary", lambda trial, *_: {"number": trial.number, "validation_macro_f1": trial.value})
    monkeypatch.setattr(reports, "_plots", lambda *_: None)
    out = tmp_path / "reports"
    reports.write_reports(study, Params(), None, tmp_path / "study", out, params_file=Path("conf/team.yaml"))
    assert (out / "best_params.yaml").read_text().splitlines()[1] == (
        f"# apply with: tqc --params conf/team.yaml tune --apply {out / 'best_params.yaml'}")


def test_a_hinge_trial_of_the_shipped_space_draws_no_temperature_hinge_never_reads():
    """hinge compares raw scores with a margin (`losses.make_loss`): a stage_two.temperature drawn in its trials did
    nothing, and Optuna learnt from it. The shipped space draws it only with the losses that read it."""
    shipped = load_params(Path(__file__).resolve().parents[2] / "params.yaml")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    draws = [sample_overrides(study.ask(), shipped.tune.space, {}) for _ in range(40)]
    losses = {draw["stage_two.loss"]: "stage_two.temperature" in draw for draw in draws}
    assert losses == {"nt_xent": True, "bpr": True, "sdml": True, "hinge": False}


def test_a_when_may_list_the_values_its_condition_takes():
    """`when: {stage_two.loss: [nt_xent, sdml]}`: the dimension is drawn where the loss is any of them, its trial's
    value of the loss read wherever the loss is listed, and trial 0 takes the base value where the base loss is one."""
    space = {"stage_two.temperature": SearchDimension(low=0.05, high=0.3, when={"stage_two.loss": ["nt_xent", "sdml"]}),
             "stage_two.loss": SearchDimension(choices=["nt_xent", "hinge", "sdml"])}
    base = {"stage_two.loss": "hinge", "stage_two.temperature": 0.1}
    for loss in ("nt_xent", "sdml"):
        trial = optuna.trial.FixedTrial({"stage_two.loss": loss, "stage_two.temperature": 0.2})
        assert sample_overrides(trial, space, base) == {"stage_two.loss": loss, "stage_two.temperature": 0.2}
    assert sample_overrides(optuna.trial.FixedTrial({"stage_two.loss": "hinge"}), space, {**base, "stage_two.loss": "sdml"}
                            ) == {"stage_two.loss": "hinge"}
    assert default_values(space, base) == {"stage_two.loss": "hinge"}
    assert default_values(space, {**base, "stage_two.loss": "sdml"}) == {"stage_two.loss": "sdml",
                                                                          "stage_two.temperature": 0.1}


def test_a_trial_that_draws_what_a_complete_trial_trained_takes_its_value_and_trains_nothing(tmp_path, monkeypatch,
                                                                                              caplog):
    """Every trial trains at params.seed: one whose values equal a complete trial's (the sampler redraws a point of a
    small discrete space) trained the same model again, at full cost. Only complete trials count: a failed one's
    values train again, and the baseline, the mark to beat, always trains."""
    from tqc.metrics import DivergedScores
    from tqc.tuning.reports import repeated_trials
    from tqc.tuning.trials import dropping_former_bests, TRIAL_FAILURES

    # trained: the baseline (K = 5), K = 2, K = 3 (fails), K = 3 again; the second K = 2 and the K = 5 are repeats
    study, objective, params = _study_of_stub_trials(tmp_path, monkeypatch, [0.6, 0.7, DivergedScores("nan"), 0.65],
                                                     space={"mine.k": {"low": 1, "high": 6}})
    for k in (2, 2, 5, 3, 3):
        study.enqueue_trial({"mine.k": k})
    with caplog.at_level(logging.INFO, logger="tqc.tune"):
        study.optimize(objective, n_trials=6, catch=TRIAL_FAILURES, callbacks=[dropping_former_bests(tmp_path / "study",
                                                                                                     params)])
    assert [t.value for t in study.trials] == [0.6, 0.7, 0.7, 0.6, None, 0.65]
    assert [t.user_attrs.get("repeats") for t in study.trials] == [None, None, 1, 0, None, None]
    assert repeated_trials(study) == 2  # summary.json's `repeated`: 5 complete trials, 3 trained
    assert sorted(path.name for path in (tmp_path / "study").glob("trial-*")) == [
        "trial-0000", "trial-0001", "trial-0004", "trial-0005"]  # a repeat trains nothing: no folder of its own
    assert "trial 2 draws the values complete trial 1 trained with" in caplog.text
    # the bests' models are kept (the baseline's, and trial 1's, which trial 2 repeats)
    assert sorted(path.parent.name for path in (tmp_path / "study").glob("trial-*/stage_two")) == [
        "trial-0000", "trial-0001"]


def test_a_hinge_trial_repeats_another_whatever_temperature_hinge_never_reads(tmp_path, monkeypatch):
    """Compared as trained, `when` applied: the temperature is drawn only with the losses that read it, so two hinge
    trials with one margin are one configuration; two nt_xent trials at two temperatures are two."""
    space = {"stage_two.loss": {"choices": ["nt_xent", "hinge"]},
             "stage_two.temperature": {"low": 0.05, "high": 0.3, "when": {"stage_two.loss": ["nt_xent"]}},
             "stage_two.margin": {"low": 0.1, "high": 0.5, "when": {"stage_two.loss": "hinge"}}}
    study, objective, _ = _study_of_stub_trials(tmp_path, monkeypatch, [0.6, 0.7, 0.8], space=space)
    for values in ({"stage_two.loss": "hinge", "stage_two.margin": 0.2}, {"stage_two.loss": "hinge", "stage_two.margin": 0.2},
                   {"stage_two.loss": "nt_xent", "stage_two.temperature": 0.1},
                   {"stage_two.loss": "nt_xent", "stage_two.temperature": 0.1 + 1e-12}):
        study.enqueue_trial(values)
    study.optimize(objective, n_trials=5)
    assert [t.value for t in study.trials] == [0.6, 0.7, 0.7, 0.6, 0.8]
    # the baseline trained nt_xent at the base temperature 0.1: trial 3 draws it, and repeats it
    assert [t.user_attrs.get("repeats") for t in study.trials] == [None, None, 1, 0, None]


def test_a_repeat_asks_the_pruner_at_each_step_so_hyperband_counts_its_rungs():
    """Hyperband (successive halving) records a trial's rung only when the trial asks `should_prune`; a repeat that
    only reported its epochs was left out of the rungs later trials are compared with (helper 123's point)."""
    from tqc.tuning.trials import _repeat

    # hyperband runs this pruner in each of its brackets, a trial's bracket drawn from the study's random name
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1))
    k = {"mine.k": optuna.distributions.IntDistribution(1, 5)}
    study.add_trial(optuna.trial.create_trial(value=0.9, params={"mine.k": 3}, distributions=k,
                                              intermediate_values={0: 0.5, 1: 0.7, 2: 0.9}))
    repeat = study.ask()
    assert _repeat(repeat, study.trials[0]) == 0.9
    rungs = {key: value for key, value in study._storage.get_trial(repeat._trial_id).system_attrs.items()
             if key.startswith("completed_rung_")}
    assert rungs == {"completed_rung_0": 0.7}  # min_resource 1: rung 0 at step 1


def test_a_best_that_repeats_a_trial_is_reported_as_the_trial_it_repeats(tmp_path, monkeypatch):
    """A database breaks no tie by trial order, so the study's best may be a repeat, which trained no model: the report
    names the trial that did, whose models are kept and scored on test."""
    from tqc.tuning import reports

    study = optuna.create_study(direction="maximize")
    k = {"mine.k": optuna.distributions.IntDistribution(1, 5)}
    for attrs in ({}, {"repeats": 0}):
        study.add_trial(optuna.trial.create_trial(value=0.9, params={"mine.k": 3}, distributions=k, user_attrs=attrs))
    monkeypatch.setattr(optuna.Study, "best_trial", property(lambda self: self.trials[1]))  # as a database may answer
    monkeypatch.setattr(reports, "_trial_summary", lambda trial, *_: {"number": trial.number, "validation_macro_f1": trial.value})
    monkeypatch.setattr(reports, "_plots", lambda *_: None)
    result = reports.write_reports(study, Params(), None, tmp_path / "study", tmp_path / "reports")
    assert result.summary["best"]["number"] == 0 and result.best_params == {"mine": {"k": 3}}
    assert "trial 0: validation macro-F1 0.9000" in (tmp_path / "reports" / "best_params.yaml").read_text()


def test_narrowing_the_shipped_loss_choices_as_the_docs_show_passes_the_space_check():
    """docs/tracking.md's `--set` example: the shipped temperature's `when` lists bpr, which this space no longer
    draws, beside losses it does; before lists could name such values, the shipped space refused it."""
    from tqc.arguments import parse_overrides
    from tqc.tuning.space import check_space

    shipped = Path(__file__).resolve().parents[2] / "params.yaml"
    narrowed = load_params(shipped, parse_overrides(["tune.space.stage_two.loss={choices: [nt_xent, sdml, hinge]}"]))
    check_space(narrowed)
    assert narrowed.tune.space["stage_two.temperature"].when == {"stage_two.loss": ["nt_xent", "bpr", "sdml"]}


def test_a_listed_when_value_no_trial_has_is_not_checked_with_the_dimensions_edges():
    """Such a value never acts (4be81d1): a logit adjustment listed with hinge, where no trial draws hinge, was refused
    as hinge with logit_adjustment 1.0, a pair no trial can draw. One a trial can have is still checked."""
    from tqc.tuning.space import check_space

    def space(losses: list[str]) -> Params:
        return Params.model_validate({"tune": {"space": {
            "stage_two.loss": {"choices": losses},
            "stage_two.logit_adjustment": {"low": 0.0, "high": 1.0,
                                           "when": {"stage_two.loss": ["nt_xent", "sdml", "hinge"]}}}}})

    check_space(space(["nt_xent", "sdml"]))
    with pytest.raises(ConfigError, match=r"stage_two.logit_adjustment = 1.0 is not a value the params accept"):
        check_space(space(["nt_xent", "hinge"]))


def test_a_space_refused_at_tune_time_names_its_params_file_and_the_problem_alone(tmp_path):
    """It named no file, and said the drawn value as "invalid parameter overrides {'mine': {'k': 'abc'}}": a user set no
    override. Nothing is prepared or trained before the refusal."""
    from tqc.tune import tune

    params = Params.model_validate({"tune": {"space": {"mine.k": {"choices": [2, "abc"]}}}})
    with pytest.raises(ConfigError) as raised:
        tune(params, tmp_path / "out", tmp_path / "work", params_file=tmp_path / "mine.yaml")
    assert str(raised.value) == (f"{tmp_path / 'mine.yaml'}: tune.space.mine.k: mine.k = 'abc' is not a value the params "
                                 "accept:\n- mine.k: Input should be a valid integer (got 'abc')")
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_a_trial_repeats_only_a_trial_its_own_code_trained(tmp_path, monkeypatch):
    """A study resumed after a fix in training: a trial that drew what an older code's trial trained took its value,
    which the current code never produced. It trains; a later draw repeats the trial this code trained. An edited
    tree's version is its edits' (`code_version`): one edit run twice repeats itself; 'unknown' never repeats."""
    from tqc.tuning.reports import repeated_trials

    study, objective, params = _study_of_stub_trials(tmp_path, monkeypatch, [0.6, 0.7, 0.65, 0.5, 0.4, 0.45],
                                                     space={"mine.k": {"low": 1, "high": 6}})
    study.optimize(objective, n_trials=1)  # the baseline
    for version in (CODE, "fixed" * 8, "fixed" * 8, f"{CODE}-dirty:0123", f"{CODE}-dirty:0123", "unknown", "unknown"):
        study.enqueue_trial({"mine.k": 2})
        study.optimize(objective_of(tmp_path, params, version), n_trials=1)
    assert [t.user_attrs["code_version"] for t in study.trials][1:] == [
        CODE, "fixed" * 8, "fixed" * 8, f"{CODE}-dirty:0123", f"{CODE}-dirty:0123", "unknown", "unknown"]
    assert [t.user_attrs.get("repeats") for t in study.trials] == [None, None, None, 2, None, 4, None, None]
    assert [t.value for t in study.trials] == [0.6, 0.7, 0.65, 0.65, 0.5, 0.5, 0.4, 0.45]
    assert repeated_trials(study) == 2


def test_a_worker_joining_a_study_of_other_code_says_how_many_and_the_summary_counts_them(tmp_path, monkeypatch,
                                                                                          caplog):
    """Resumed after the code changed, a study mixed two codes' trials silently, its best maybe an old one: said in
    one line as a worker joins (not refused: a docs-only commit is another version too), and counted in summary.json."""
    from tqc.tuning import reports, study as tuning_study

    study = optuna.create_study(direction="maximize")
    k = {"mine.k": optuna.distributions.IntDistribution(1, 5)}
    older = "0123456789" + "a" * 30
    for value, attrs in ((0.9, {}), (0.8, {"code_version": older}), (0.7, {"code_version": older}),
                         (0.6, {"code_version": CODE})):
        study.add_trial(optuna.trial.create_trial(value=value, params={"mine.k": 3}, distributions=k, user_attrs=attrs))
    with caplog.at_level(logging.WARNING, logger="tqc.tune"):
        tuning_study.warn_of_other_code(study, CODE)
    (said,) = [record.getMessage() for record in caplog.records if record.name == "tqc.tune"]
    assert ("holds 3 complete trials of other code than this worker's c0dec0dec0 (2 of 0123456789, 1 of not recorded): "
            "their validation macro-F1 came from that code, not this; the study's best, trial 0, is one of them") in said
    monkeypatch.setattr(reports, "_trial_summary", lambda trial, *_: {"number": trial.number})
    monkeypatch.setattr(reports, "_plots", lambda *_: None)
    summary = reports.write_reports(study, Params(), None, tmp_path / "study", tmp_path / "reports", version=CODE).summary
    assert summary["code_version"] == CODE and summary["other_code_version"] == 3
    assert json.loads((tmp_path / "reports" / "summary.json").read_text())["other_code_version"] == 3
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tqc.tune"):
        tuning_study.warn_of_other_code(study, older)  # its best is still other code's: the one without a version
    assert "holds 2 complete trials of other code than this worker's 0123456789 (1 of not recorded, 1 of c0dec0dec0)" \
           in caplog.text and "the study's best, trial 0, is one of them" in caplog.text


def test_a_trial_that_draws_what_a_pruned_trial_trained_is_pruned_on_its_epochs_and_trains_nothing(tmp_path,
                                                                                                   monkeypatch, caplog):
    """Same values, seed and code: the same epochs, which the pruner pruned. Reported again, the pruner asked at each,
    the trial is pruned without training them again; a pruned trial of other code is trained again."""
    from tqc.tuning.reports import repeated_trials

    # the baseline, K = 2 (pruned at its first epoch, below the baseline's), K = 3; then K = 2 under other code
    study, objective, params = _study_of_stub_trials(
        tmp_path, monkeypatch, [[0.5, 0.6, 0.7], [0.1, 0.9, 0.9], [0.6, 0.65, 0.8], [0.1, 0.2, 0.3]],
        space={"mine.k": {"low": 1, "high": 6}}, pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    for k in (2, 2, 3):
        study.enqueue_trial({"mine.k": k})
    with caplog.at_level(logging.INFO, logger="tqc.tune"):
        study.optimize(objective, n_trials=4)
    study.enqueue_trial({"mine.k": 2})
    study.optimize(objective_of(tmp_path, params, "fixed" * 8), n_trials=1)
    pruned, complete = optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.COMPLETE
    assert [t.state for t in study.trials] == [complete, pruned, pruned, complete, pruned]
    assert [t.user_attrs.get("repeats") for t in study.trials] == [None, None, 1, None, None]
    assert study.trials[2].intermediate_values == {1: 0.1} and repeated_trials(study, "PRUNED") == 1
    assert sorted(path.name for path in (tmp_path / "study").glob("trial-*")) == [
        "trial-0000", "trial-0001", "trial-0003", "trial-0004"]  # trial 2 trained nothing; trial 4, other code, did
    assert "trial 2 draws the values pruned trial 1 trained with: pruned at step 1 on its epochs" in caplog.text


def test_a_pruned_trials_values_drawn_where_the_pruner_now_lets_its_epochs_through_train_past_them(tmp_path,
                                                                                                    monkeypatch, caplog):
    """The study changed since (lower complete trials moved the median): the replayed epochs are not pruned, so the
    trial trains from scratch, and reports only the epochs past them, which the replay did not."""
    study, objective, _ = _study_of_stub_trials(
        tmp_path, monkeypatch, [[0.5, 0.6, 0.7], [0.4, 0.4, 0.4], [0.4, 0.45, 0.75]],
        space={"mine.k": {"low": 1, "high": 6}}, pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    study.enqueue_trial({"mine.k": 2})
    study.optimize(objective, n_trials=2)  # the baseline, then K = 2, pruned at its first epoch (0.4 below 0.5)
    for _ in range(2):  # two trials below it at every epoch: the median of the first is now 0.2
        study.add_trial(optuna.trial.create_trial(value=0.3, intermediate_values={1: 0.2, 2: 0.25, 3: 0.3}))
    study.enqueue_trial({"mine.k": 2})
    with caplog.at_level(logging.INFO, logger="tqc.tune"), warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna warns of a step reported twice, and ignores it
        study.optimize(objective, n_trials=1)
    trial = study.trials[4]
    assert trial.state == optuna.trial.TrialState.COMPLETE and trial.value == 0.75
    assert trial.intermediate_values == {1: 0.4, 2: 0.45, 3: 0.75} and "repeats" not in trial.user_attrs
    assert "trial 4 draws the values pruned trial 1 trained with, and the pruner lets its 1 epochs through now" \
           in caplog.text


def test_a_baseline_other_code_trained_is_queued_again_and_the_reports_compare_with_the_new_one(tmp_path, monkeypatch):
    """The baseline is the mark the search must beat: resumed after a fix in training, the study compared this code's
    best with the old code's baseline. A waiting one counts, whatever code will run it: one is queued, not one a worker."""
    from tqc.tuning.reports import current_baseline
    from tqc.tuning.study import enqueue_baseline

    study, objective, params = _study_of_stub_trials(tmp_path, monkeypatch, [0.6, 0.65])
    study.optimize(objective, n_trials=1)
    values = study.trials[0].user_attrs["base_values"]
    enqueue_baseline(study, values, CODE)
    assert len(study.trials) == 1
    for _ in range(2):
        enqueue_baseline(study, values, "fixed" * 8)
    assert len(study.trials) == 2 and study.trials[1].user_attrs["baseline"]
    study.optimize(objective_of(tmp_path, params, "fixed" * 8), n_trials=1)
    assert study.trials[1].value == 0.65 and study.trials[1].user_attrs["code_version"] == "fixed" * 8
    assert current_baseline(study.trials, params).number == 1


def test_a_replayed_pruned_trial_is_judged_on_hyperbands_rungs_as_a_trained_one_would_be():
    """Hyperband's brackets run successive halving, which judges a trial at each rung step against the others there, and
    records its rung only when asked: the replay asks at each epoch, as training does."""
    from tqc.tuning.trials import _replay_pruned

    study = optuna.create_study(direction="maximize",
                                pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2))
    for value in (0.9, 0.8, 0.7):
        study.add_trial(optuna.trial.create_trial(value=value, intermediate_values={1: value, 2: value},
                                                  system_attrs={"completed_rung_0": value}))
    values = {"mine.k": 2}
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, intermediate_values={1: 0.1},
                                              user_attrs={"trained_values": values, "code_version": CODE},
                                              system_attrs={"completed_rung_0": 0.1}))
    replay = study.ask()
    with pytest.raises(optuna.TrialPruned, match="pruned at step 1 on the epochs of pruned trial 3"):
        _replay_pruned(replay, values, CODE)
    rungs = {key: value for key, value in study._storage.get_trial(replay._trial_id).system_attrs.items()
             if key.startswith("completed_rung_")}
    assert rungs == {"completed_rung_0": 0.1} and replay.user_attrs["repeats"] == 3
    assert _replay_pruned(study.ask(), values, "fixed" * 8) == set()  # other code's pruned trial: trained again


def _study_of_every_trial_state(params: Params):
    """A finished study as write_reports reads it: the baseline, a better trial, a repeat of it, one of other code, a
    pruned one and a failed one, from two workers."""
    k = {"mine.k": optuna.distributions.IntDistribution(1, 5)}
    base = default_values(params.tune.space, flat_base(params))
    study = optuna.create_study(study_name="pinned", direction="maximize")
    for state, value, values, attrs in (
            ("COMPLETE", 0.8, {}, {"baseline": True, "base_values": base, "worker": "a:1:0", "code_version": CODE}),
            ("COMPLETE", 0.9, {"mine.k": 3}, {"worker": "a:1:0", "code_version": CODE}),
            ("COMPLETE", 0.9, {"mine.k": 3}, {"worker": "b:2:1", "code_version": CODE, "repeats": 1}),
            ("COMPLETE", 0.7, {"mine.k": 4}, {"worker": "b:2:1", "code_version": "0123456789" + "a" * 30}),
            ("PRUNED", None, {"mine.k": 2}, {"worker": "b:2:1", "code_version": CODE, "repeats": 9}),
            ("FAIL", None, {"mine.k": 1}, {"worker": "a:1:0", "code_version": CODE, "failed": "DivergedScores: NaN"})):
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState[state], value=value, params=values,
                                                  distributions={name: k[name] for name in values}, user_attrs=attrs,
                                                  intermediate_values={1: 0.5} if state == "PRUNED" else None))
    return study


def test_the_reports_are_pinned_file_for_file(tmp_path, monkeypatch, caplog):
    """Every file write_reports writes, whole, and nothing else: a refactoring that changes a byte of them fails."""
    from tqc.tuning import reports

    params = Params.model_validate({"tracking": {"enabled": False},
                                    "tune": {"study": "pinned", "space": {"mine.k": {"low": 1, "high": 5}}}})
    study = _study_of_every_trial_state(params)
    plotted = []
    monkeypatch.setattr(reports, "_plots", lambda study, out_dir: plotted.append(out_dir))  # matplotlib's PNG bytes vary
    out = tmp_path / "new" / "reports"
    with caplog.at_level(logging.INFO, logger="tqc.tune"):
        result = reports.write_reports(study, params, None, tmp_path / "study", out, Path("conf/team.yaml"), CODE)

    missing = lambda number: (f"no model in {tmp_path / 'study' / f'trial-{number:04d}' / 'stage_two'}: the trial ran on "
                              "another machine, or its models were dropped (tune.keep_models: false) before it became "
                              "the best")
    summary = {
        "study": "pinned", "dataset": "trec6", "trained_with": reports.trained_with(params),
        "objective": "validation macro-F1 of stage two (the best epoch)",
        "trials": {"COMPLETE": 4, "PRUNED": 1, "FAIL": 1}, "repeated": 1, "repeated_pruned": 1, "code_version": CODE,
        "other_code_version": 1, "workers": ["a:1:0", "b:2:1"],
        "best": {"number": 1, "validation_macro_f1": 0.9, "params": {"mine.k": 3}, "code_version": CODE, "test": None,
                 "test_missing": missing(1)},
        "baseline": {"number": 0, "validation_macro_f1": 0.8, "params": {"mine.k": 5}, "code_version": CODE,
                     "test": None, "test_missing": missing(0)},
        "note": "test figures are reported for the best and baseline trials only; they never choose anything",
    }
    assert sorted(p.name for p in out.iterdir()) == ["best_params.yaml", "summary.json", "trials.csv"]
    assert plotted == [out]
    assert (out / "best_params.yaml").read_text(encoding="utf-8") == (
        "# Optuna study 'pinned', trial 1: validation macro-F1 0.9000\n"
        f"# apply with: tqc --params conf/team.yaml tune --apply {out / 'best_params.yaml'}\n"
        "mine:\n  k: 3\n")
    assert list(result.summary.items()) == list(summary.items())  # the keys' order too: summary.json keeps it
    assert (out / "summary.json").read_text(encoding="utf-8") == json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    assert (out / "trials.csv").read_text(encoding="utf-8") == reports._trials_table(study).to_csv(index=False)
    assert result == reports.TuneResult("pinned", {"mine": {"k": 3}}, summary)
    assert [r.getMessage() for r in caplog.records if r.name == "tqc.tune"] == [
        f"tune: best trial 1 validation macro-F1 0.9000 (baseline 0.8000); wrote {out}"]


PINNED_PARAMS = """\
# A team's params: every comment, quote, null and flow list below survives --apply
seed: 0

data:
  dataset: trec6            # the study's
  data_dir: "data/raw"      # quoted, and stays so

augment:
  target_count: null
  seq2seq:
    paraphrase_prefix: ""
  implicit: [dropout, cutoff, dropout, cutoff, dropout, cutoff, dropout, cutoff, dropout, cutoff, dropout, cutoff, dropout]

stage_one:
  epochs: 2                 # short
  learning_rate: 1.0e-4
  temperature: 0.1
  loss: nt_xent             # nt_xent | decoupled | bpr | hinge | sdml
  margin: 0.2
  max_steps: null

mine:                       # ranked by model.similarity
  k: 5

stage_two:
  learning_rate: 5.0e-5
"""


def test_apply_is_pinned_byte_for_byte_with_its_refusals(tmp_path):
    """What `tqc tune --apply` writes, whole, what it returns, and each refusal's message, the file left as it was."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text(PINNED_PARAMS, encoding="utf-8")
    best = tmp_path / "tuned" / "best_params.yaml"
    best.parent.mkdir()
    best.write_text("stage_one:\n  temperature: 0.05\n  learning_rate: 1.0e-05\n  loss: hinge\n  margin: 0.3\n"
                    "  max_steps: 40\nmine:\n  k: 7\nstage_two:\n  learning_rate: 0.00005\n", encoding="utf-8")
    changed = apply_best(best, params_file)
    assert list(changed.items()) == [("stage_one.temperature", 0.05), ("stage_one.learning_rate", 1e-05),
                                     ("stage_one.loss", "hinge"), ("stage_one.margin", 0.3), ("stage_one.max_steps", 40),
                                     ("mine.k", 7)]  # stage_two's learning rate is the one there, written otherwise
    applied = PINNED_PARAMS
    for before, after in (("  learning_rate: 1.0e-4\n", "  learning_rate: 1.0e-05\n"),
                          ("  temperature: 0.1\n", "  temperature: 0.05\n"),
                          ("  loss: nt_xent             #", "  loss: hinge               #"),
                          ("  margin: 0.2\n", "  margin: 0.3\n"), ("  max_steps: null\n", "  max_steps: 40\n"),
                          ("  k: 5\n", "  k: 7\n")):
        assert applied.count(before) == 1
        applied = applied.replace(before, after)
    assert params_file.read_text(encoding="utf-8") == applied

    def refused(best_text: str, summary: dict | None = None) -> str:
        best.write_text(best_text, encoding="utf-8")
        (best.parent / "summary.json").write_text(json.dumps(summary or {}), encoding="utf-8")
        with pytest.raises(ConfigError) as raised:
            apply_best(best, params_file)
        assert params_file.read_text(encoding="utf-8") == applied
        return str(raised.value)

    assert refused("mine: [").startswith(f"{best}: not YAML (")
    assert refused("- 1\n") == f"{best}: expected params.yaml's layout (section: {{key: value}}), not a list"
    assert refused("mine:\n  kk: 3\n") == f"{best}: 'mine.kk' is not in {params_file}"
    assert refused("mine:\n  k: 0\n").startswith(f"{best}: applying it would make {params_file} invalid:\n")
    # the dataset is checked before any value: a study of another dataset is refused as such, whatever it holds
    assert refused("mine:\n  kk: 3\n", {"dataset": "covidq-categories"}) == (
        f"{best}: tuned on data.dataset 'covidq-categories' ({best.parent / 'summary.json'}), but {params_file} "
        f"trains 'trec6': set data.dataset: covidq-categories in {params_file} first, or tune on 'trec6'")


def test_ctrl_c_in_a_trial_leaves_no_optuna_traceback_and_other_failures_keep_theirs():
    """Ctrl-C during `tqc tune` ended with tqc's one line and exit 130, after Optuna's warning with the interrupt's
    traceback, ~100 lines through torch (the CLI's own test stubs out the study). A real failure keeps its traceback."""
    import logging

    from tqc.tune import optuna_quiet_on_interrupt

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("optuna.study._optimize")
    logger.addHandler(handler)
    try:
        study = optuna.create_study()

        def interrupted(trial):
            raise KeyboardInterrupt

        with optuna_quiet_on_interrupt(), pytest.raises(KeyboardInterrupt):
            study.optimize(interrupted, n_trials=1)
        assert records == [] and study.trials[0].state == optuna.trial.TrialState.FAIL

        def broken(trial):
            raise ValueError("a real failure")

        with optuna_quiet_on_interrupt():
            study.optimize(broken, n_trials=1, catch=(ValueError,))
        assert records[0].exc_info[0] is ValueError and "failed with value" in records[1].getMessage()
    finally:
        logger.removeHandler(handler)


def test_a_refusal_is_the_trials_only_where_it_names_a_drawn_key_whole():
    """A substring match read a refusal of `stage_one.temperature_floor` as one of a drawn `stage_one.temperature`:
    the trial failed, where a refusal the draw did not cause must stop the worker."""
    from tqc.tuning.trials import names_a_key

    drawn = {"stage_one.temperature": 0.01, "mine.k": 3}
    assert names_a_key("stage_one.temperature 0.01 is below …", drawn)
    assert names_a_key("refused: mine.k.", drawn) and names_a_key("(mine.k)", drawn)
    assert not names_a_key("stage_one.temperature_floor is 0.05", drawn)
    assert not names_a_key("xmine.k is 3", drawn) and not names_a_key("submine.k is 3", drawn)
    assert not names_a_key("model.max_length 600 is beyond the model's 512 positions", drawn)
