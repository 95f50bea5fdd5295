"""The promotion gate against a real MLflow registry (local SQLite; and an MLflow server on PostgreSQL, as a
team shares one), with tiny models."""

import contextlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tqc.config import ModelParams, PromoteParams, StageOneParams, TrackingParams
from tqc.model.encoder import BiEncoder
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, load_questions, save_questions
from tqc.stages import promote, stage_one
from tqc.tracking import standalone_run
from tests.conftest import CLASSES, synthetic_questions


@pytest.fixture
def registry(tmp_path):
    return TrackingParams(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="promotion-test")


@pytest.fixture
def data_dir(tmp_path):
    directory = tmp_path / "validated"
    catalog = Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()])
    catalog.save(directory / "catalog.jsonl")
    save_questions(directory / "train.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 40)])
    save_questions(directory / "validation.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(1, 20)])
    return directory


def untrained(tiny_model_dir, out):
    torch.manual_seed(1)
    BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir))).save(out)
    return out


def trained(tiny_model_dir, data_dir, out):
    torch.manual_seed(0)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    params = StageOneParams(epochs=4, batch_size=16, learning_rate=2e-3, patience=4, warmup_ratio=0.0)
    stage_one.train(model, load_questions(data_dir / "train.jsonl"), load_questions(data_dir / "validation.jsonl")[:9],
                    catalog, params, seed=0)
    model.save(out)
    return out


@pytest.fixture(params=["sqlite", pytest.param("server-on-postgres", marks=pytest.mark.server)])
def local_or_shared_registry(request, registry):
    """The local store, and the shared one a team moves to: the same promote code against both."""
    if request.param == "sqlite":
        return registry
    return TrackingParams(uri=request.getfixturevalue("mlflow_on_postgres"), experiment="promotion-test")


def test_the_alias_moves_to_a_better_challenger_and_stays_for_a_worse_one(tiny_model_dir, data_dir, tmp_path,
                                                                          local_or_shared_registry, caplog):
    registry = local_or_shared_registry
    import mlflow

    weak, strong = untrained(tiny_model_dir, tmp_path / "weak"), trained(tiny_model_dir, data_dir, tmp_path / "strong")
    params = PromoteParams(bootstrap_samples=500, top_k=2)
    reports = []
    tags_of_v1 = []
    for model_dir in (weak, strong, weak):
        with standalone_run("promote", registry) as tracker, caplog.at_level("INFO", logger="tqc.stages.promote"):
            reports.append(promote.run(data_dir, model_dir, None, params, tmp_path / "promotion.json", tracker))
        tags_of_v1.append(mlflow.MlflowClient().get_model_version("tqc-admc", "1").tags)

    first, better, worse = reports
    assert first["promoted"] and first["champion_version_after"] == "1"
    assert better["promoted"] and better["champion_version_before"] == "1" and better["champion_version_after"] == "2"
    assert better["bootstrap"]["low"] > 0
    # which classes moved, from the same served answers the gate judged; nothing to compare the first version with
    assert first["class_changes"] == [] and better["class_changes"]
    assert sum(c["difference"] for c in better["class_changes"]) > 0  # the trained model is better on the whole
    assert not worse["promoted"] and worse["champion_version_after"] == "2"
    assert worse["bootstrap"]["high"] < 0
    # The weak model again: its content is v1's, so v1 is judged again rather than registered as v3.
    assert json.loads((tmp_path / "promotion.json").read_text())["challenger_version"] == "1"
    assert worse["challenger_registered_before"] and not better["challenger_registered_before"]
    assert len(mlflow.MlflowClient().search_model_versions("name='tqc-admc'")) == 2
    # v1's tag follows the alias: champion, then superseded by v2, then (judged again) rejected against v2.
    assert [t["promotion"] for t in tags_of_v1] == ["champion", "superseded", "rejected"]
    assert tags_of_v1[1]["superseded_by"] == "2"
    # promote's last line: the version, where the alias is now, and every reason
    said = [r.getMessage() for r in caplog.records if r.name == "tqc.stages.promote" and r.getMessage().startswith(
        "promote: tqc-admc v")]
    assert said == [f"promote: tqc-admc v{version} {where}; " + "; ".join(report["reasons"])
                    for version, where, report in zip(("1", "2", "1"), ("is now champion", "is now champion",
                                                                        "not promoted (champion stays v2)"), reports)]
    assert mlflow.MlflowClient().get_model_version("tqc-admc", "2").tags["promotion"] == "champion"
    assert str(mlflow.MlflowClient().get_model_version_by_alias("tqc-admc", "champion").version) == "2"

    served = mlflow.pyfunc.load_model("models:/tqc-admc@champion")
    answers = served.predict(pd.DataFrame({"question": ["where is paris", "who invented chess"]}), params={"top_k": 2})
    assert list(answers.columns) == ["question", "rank", "class_id", "standard_question", "score"]
    assert len(answers) == 4 and answers.groupby("question")["rank"].apply(list).tolist() == [[1, 2], [1, 2]]
    top = answers[answers["rank"] == 1].set_index("question")["class_id"]
    assert top["where is paris"] == "LOC" and top["who invented chess"] == "HUM"
    asked_for_none = served.predict(pd.DataFrame({"question": ["where is paris"]}))
    assert asked_for_none["rank"].tolist() == [1, 2]  # promote.top_k, not MLflow's signature default, when a request names none

    # v1 made champion again (a gate that takes anything: a rollback, say) is no longer "superseded by" anyone
    with standalone_run("promote", registry) as tracker:
        rollback = promote.run(data_dir, weak, None, params.model_copy(update={"min_improvement": -1.0, "tail_tolerance": 1.0}),
                               tmp_path / "promotion.json", tracker)
    v1, v2 = (mlflow.MlflowClient().get_model_version("tqc-admc", v).tags for v in ("1", "2"))
    assert rollback["promoted"] and v1["promotion"] == "champion" and "superseded_by" not in v1
    assert v2["promotion"] == "superseded" and v2["superseded_by"] == "1"


def test_the_tail_check_judges_the_rarest_classes_validation_can_judge(tiny_model_dir, data_dir, tmp_path, registry):
    """Ingest draws no validation row from a class of under 3 training rows, the rarest: the tail was those classes,
    each F1 0 for either model whatever it answered, and the check read "0.0000 vs 0.0000: within the tolerance",
    able to veto nothing. The tail is now drawn from the classes the asked questions hold, and the others named."""
    rare = list(CLASSES)[-1]
    rows = load_questions(data_dir / "train.jsonl")
    save_questions(data_dir / "train.jsonl", [q for q in rows if q.class_id != rare] +
                   [q for q in rows if q.class_id == rare][:2])
    save_questions(data_dir / "validation.jsonl",
                   [q for q in load_questions(data_dir / "validation.jsonl") if q.class_id != rare])
    with standalone_run("promote", registry) as tracker:
        promote.run(data_dir, untrained(tiny_model_dir, tmp_path / "old"), None, PromoteParams(), tmp_path / "p.json", tracker)
    with standalone_run("promote", registry) as tracker:
        report = promote.run(data_dir, trained(tiny_model_dir, data_dir, tmp_path / "new"), None,
                             PromoteParams(bootstrap_samples=200), tmp_path / "p.json", tracker)
    judged = {q.class_id for q in load_questions(data_dir / "validation.jsonl")}
    assert report["tail_classes"] and set(report["tail_classes"]) <= judged and rare not in report["tail_classes"]
    assert any("1 class(es) have no validation question judged here" in r and rare in r for r in report["reasons"])


def test_promote_without_tracking_says_so(data_dir, tmp_path):
    from tqc.tracking import Tracker

    report = promote.run(data_dir, tmp_path / "unused", None, PromoteParams(), tmp_path / "promotion.json", Tracker(None))
    assert not report["promoted"] and "tracking is disabled" in report["reasons"][0]
    assert {"model_name", "alias", "challenger_version", "rule", "champion_version_after"} <= report.keys()  # the usual layout


def test_promote_writes_which_registry_holds_the_model_as_which_version(tiny_model_dir, data_dir, tmp_path, registry):
    """dvc.yaml's uncached, git-ignored record of the registration (`--registered`): the registry (its URI's password
    redacted), the version registered and the alias holder; with tracking off, that none holds it."""
    from tqc.tracking import Tracker

    model_dir = untrained(tiny_model_dir, tmp_path / "model")
    with standalone_run("promote", registry) as tracker:
        promote.run(data_dir, model_dir, None, PromoteParams(bootstrap_samples=100), tmp_path / "promotion.json", tracker,
                    registered_path=tmp_path / "registered.json")
    assert json.loads((tmp_path / "registered.json").read_text()) == {
        "registry": registry.uri, "model_name": "tqc-admc", "version": "1", "alias": "champion", "alias_version": "1"}
    promote.run(data_dir, model_dir, None, PromoteParams(), tmp_path / "promotion.json", Tracker(None),
                registered_path=tmp_path / "off.json")
    assert json.loads((tmp_path / "off.json").read_text())["registry"] is None


def test_a_fresh_clone_s_dvc_repro_runs_promote_so_its_registry_holds_the_model():
    """Every input of promote matched dvc.lock in a fresh clone (training is deterministic, promotion.json is in git),
    so `make run` skipped promote and left the clone's registry empty: `tqc predict --model models:/tqc-admc@champion`
    found nothing. An output in neither git nor DVC's cache is missing in a fresh clone, so promote runs there.
    (Cached, as it first was, a target-less `dvc push` sent it and `dvc pull` brought it back: promote skipped again.)"""
    import subprocess

    import yaml

    root = Path(__file__).resolve().parents[2]
    stage = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["promote"]
    outs = dict(next(iter(out.items())) if isinstance(out, dict) else (out, {}) for out in stage["outs"])
    assert outs["models/registered.json"] == {"cache": False} and "--registered models/registered.json" in stage["cmd"]
    assert all(options.get("cache", True) is False for options in outs.values())  # nothing of promote's is pulled
    ignored = subprocess.run(["git", "check-ignore", "-q", "models/registered.json"], cwd=root)
    assert ignored.returncode == 0  # never in git, so missing in a fresh clone


def test_the_promote_stage_reruns_when_tracking_changes():
    import yaml

    stages = yaml.safe_load((Path(__file__).resolve().parents[2] / "dvc.yaml").read_text())["stages"]
    assert "tracking" in stages["promote"]["params"]  # turned back on, or another registry: promote again


def test_the_registry_serves_the_model_with_the_class_prior_shift_fitted_for_it(tiny_model_dir, data_dir, tmp_path, registry,
                                                                                capsys, recwarn):
    import mlflow

    from tqc.cli import main

    from tqc.io import write_json

    models = tmp_path / "models"
    strong = trained(tiny_model_dir, data_dir, models / "stage_two")
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    shift = {c: (100.0 if c == "NUM" else 0.0) for c in catalog.class_ids}  # outranks any similarity
    write_json(models / "prior.json", {"weights": [0.0, 1.0], "models": {
        "stage_one": {"model": "stage_one", "weight": 0.0, "temperature": 0.1, "shift": {c: 0.0 for c in catalog.class_ids}},
        "admc": {"model": "stage_two", "weight": 1.0, "temperature": 0.1, "shift": shift}}})
    with standalone_run("promote", registry) as tracker:
        report = promote.run(data_dir, strong, models / "prior.json", PromoteParams(bootstrap_samples=500), tmp_path / "p.json",
                             tracker)
    (models / "prior.json").unlink()  # the registry keeps its own copy
    # The signature is given, so MLflow's warning that no input example was is not shown (it colours its text)
    assert not [w for w in recwarn if "input example" in str(w.message)]

    assert report["promoted"] and report["validation"]["challenger_accuracy"] < 0.5  # NUM for every question
    answers = mlflow.pyfunc.load_model("models:/tqc-admc@champion").predict(
        pd.DataFrame({"question": ["where is paris", "who invented chess"]}), params={"top_k": 1})
    assert answers["class_id"].tolist() == ["NUM", "NUM"] and (answers["score"] > 99).all()
    # MLflow's schema check passes a column of mixed values on, so tqc's own check names the bad rows; it refuses a
    # column with no text at all, or none named "question", itself, naming the column (every row is then bad)
    served = mlflow.pyfunc.load_model("models:/tqc-admc@champion")
    with pytest.raises(ValueError, match=r"non-blank text: row 1 \(7\), row 2 \(None\)"):
        served.predict(pd.DataFrame({"question": ["where is paris", 7, None]}))
    with pytest.raises(mlflow.exceptions.MlflowException, match="column question"):
        served.predict(pd.DataFrame({"question": [1, 2]}))
    with pytest.raises(mlflow.exceptions.MlflowException, match=r"missing inputs \['question'\]"):
        served.predict(pd.DataFrame({"text": ["where is paris"]}))
    # tqc predict asks the registry the same, with the version's own catalog and shift (the local prior.json is gone)
    capsys.readouterr()
    assert main(["predict", "--model", "models:/tqc-admc@champion", "--tracking-uri", registry.uri, "--top-k", "1",
                 "where is paris", "who invented chess"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in records] == ["where is paris", "who invented chess"]
    assert [r["top_k"][0]["class_id"] for r in records] == ["NUM", "NUM"] and all(r["top_k"][0]["score"] > 99 for r in records)
    assert main(["predict", "--model", "models:/tqc-admc/1", "--tracking-uri", registry.uri, "where is paris"]) == 0
    assert main(["predict", "--model", "models:/no-such-model@champion", "--tracking-uri", registry.uri, "q"]) == 2
    assert (f"--model models:/no-such-model@champion: cannot be loaded from the registry at {registry.uri} (Registered "
            "Model with name=no-such-model not found)") in capsys.readouterr().err
    # The version holds code and safetensors: loading it unpickles nothing
    stored = Path(mlflow.artifacts.download_artifacts("models:/tqc-admc@champion", dst_path=str(tmp_path / "stored")))
    assert not [p for p in stored.rglob("*") if p.suffix in (".pkl", ".pickle", ".bin", ".pt")]
    assert (stored / "served_model.py").is_file() and "loader_module: mlflow.pyfunc.loaders.code_model" in (stored / "MLmodel").read_text()

    write_json(models / "prior.json", {"weights": [0.0], "models": {}})
    with standalone_run("promote", registry) as tracker, pytest.raises(ValueError, match=r"prior.json: none of its entries"):
        promote.run(data_dir, strong, models / "prior.json", PromoteParams(), tmp_path / "p.json", tracker)


def test_promote_refuses_a_model_folder_that_is_not_there_before_any_run_is_opened(tmp_path, capsys, monkeypatch):
    """`tqc promote --model typo` was a traceback ending in the prior file's ValueError, exit 1, after a FAILED
    `dvc repro` / `promote` run pair had been left in the store."""
    from tqc.cli import main

    monkeypatch.setattr("tqc.cli.stage_run", lambda *a, **k: pytest.fail("a run was opened"))
    assert main(["promote", "--data", str(tmp_path), "--model", str(tmp_path / "nope"), "--prior",
                 str(tmp_path / "prior.json"), "--report", str(tmp_path / "p.json")]) == 2
    assert (f"tqc promote: error: --model {tmp_path / 'nope'}: not a tqc model folder (no tqc_model.json; `dvc repro` "
            "writes models/stage_two)") in capsys.readouterr().err


def test_a_version_that_could_not_be_judged_is_tagged_failed(tiny_model_dir, data_dir, tmp_path, registry, monkeypatch):
    import mlflow

    def unreachable(*_):
        raise RuntimeError("the champion's artifacts are gone")

    monkeypatch.setattr(promote, "_validation_predictions", unreachable)
    with standalone_run("promote", registry) as tracker, pytest.raises(RuntimeError, match="artifacts are gone"):
        promote.run(data_dir, untrained(tiny_model_dir, tmp_path / "model"), None, PromoteParams(), tmp_path / "p.json", tracker)
    assert mlflow.MlflowClient().get_model_version("tqc-admc", "1").tags["promotion"] == "failed"


def test_a_champion_of_another_catalog_is_not_comparable_and_stays(tiny_model_dir, data_dir, tmp_path, registry):
    """After a dataset switch the champion answers with classes this catalog lacks: no accuracy of 0 for it, a
    version tagged `incomparable` (not `rejected`, which would say it lost), and what to do."""
    import mlflow

    other = tmp_path / "other"  # the same questions under other class ids: another dataset's catalog
    Catalog([StandardQuestion(f"old-{c}", s) for c, (s, _) in CLASSES.items()]).save(other / "catalog.jsonl")
    for split, seed, n in (("train", 0, 40), ("validation", 1, 20)):
        save_questions(other / f"{split}.jsonl", [LabeledQuestion(t, f"old-{c}") for t, c in synthetic_questions(seed, n)])
    model = untrained(tiny_model_dir, tmp_path / "model")
    with standalone_run("promote", registry) as tracker:
        assert promote.run(other, model, None, PromoteParams(), tmp_path / "p.json", tracker)["promoted"]
    with standalone_run("promote", registry) as tracker:
        report = promote.run(data_dir, trained(tiny_model_dir, data_dir, tmp_path / "new"), None, PromoteParams(),
                             tmp_path / "p.json", tracker)
    assert not report["promoted"] and report["champion_version_after"] == "1"
    assert report["validation"]["champion_accuracy"] is None and report["bootstrap"] is None
    assert len(report["reasons"]) == 1 and "not comparable" in report["reasons"][0] and "promote.model_name" in report["reasons"][0]
    assert mlflow.MlflowClient().get_model_version("tqc-admc", report["challenger_version"]).tags["promotion"] == "incomparable"


def test_a_challenger_answering_a_class_the_champion_cannot_is_judged_no_worse_on_the_classes_both_answer(
        tiny_model_dir, data_dir, tmp_path, registry, monkeypatch):
    """A class added to the catalog since the champion was registered: the champion can never answer it, yet under
    min_improvement the challenger, right on one more of its validation questions and alike elsewhere, never cleared
    the bound (CI [0, ...]), so the alias stayed on a model that cannot serve the new intent, and no reason said so.
    It is judged on the questions of the classes both answer, where it needs only to be no worse: on every question,
    the champion's certain misses on the new class would hide a loss on the others."""
    from tqc import serving

    added = "NUM"
    before = tmp_path / "before"  # the catalog and rows before the class was added
    Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items() if c != added]).save(before / "catalog.jsonl")
    for split in ("train", "validation"):
        save_questions(before / f"{split}.jsonl", [q for q in load_questions(data_dir / f"{split}.jsonl") if q.class_id != added])
    gold = {q.text: q.class_id for q in load_questions(data_dir / "validation.jsonl")}
    challenger = {"right_on_added": 1, "wrong_on_shared": 0}

    def served(uri, questions):  # the champion right on every question but the added class's, which it cannot answer
        if uri.endswith("/1"):
            return ["LOC" if gold[text] == added else gold[text] for text in questions], [c for c in CLASSES if c != added]
        added_seen = shared_seen = 0
        answers = []
        for text in questions:
            if gold[text] == added:
                added_seen += 1
                answers.append(added if added_seen <= challenger["right_on_added"] else "LOC")
            else:
                shared_seen += 1
                answers.append(added if shared_seen <= challenger["wrong_on_shared"] else gold[text])
        return answers, list(CLASSES)

    model = untrained(tiny_model_dir, tmp_path / "model")
    with standalone_run("promote", registry) as tracker:
        assert promote.run(before, model, None, PromoteParams(), tmp_path / "p.json", tracker)["promoted"]
    monkeypatch.setattr(serving, "served_first_answers", served)

    def judged(name: str, gate: PromoteParams, right_on_added: int, wrong_on_shared: int) -> dict:
        challenger.update(right_on_added=right_on_added, wrong_on_shared=wrong_on_shared)
        grown = Path(shutil.copytree(model, tmp_path / name))
        (grown / "NOTE.txt").write_text(name)  # other content: a new version
        with standalone_run("promote", registry) as tracker:
            return promote.run(data_dir, grown, None, gate, tmp_path / "p.json", tracker)

    # better on the whole, worse on the classes both answer: not promoted
    worse = judged("worse", PromoteParams(), right_on_added=len(gold), wrong_on_shared=3)
    assert not worse["promoted"] and worse["bootstrap"]["difference"] < 0, worse["reasons"]
    assert worse["validation"]["challenger_accuracy"] > worse["validation"]["champion_accuracy"]
    # alike on the classes both answer: promoted under the no-worse bound, not under a bound of 0
    assert not judged("tie-at-0", PromoteParams(refresh_min_improvement=0.0), 1, 0)["promoted"]
    alike = judged("alike", PromoteParams(), 1, 0)
    assert alike["promoted"] and alike["champion_version_after"] == alike["challenger_version"], alike["reasons"]
    assert re.fullmatch(
        r"the challenger answers 1 class\(es\) of this catalog that the champion, v1, cannot \(NUM\): judged on the "
        r"[1-9]\d* validation question\(s\) of the classes both answer, where it needs only to be no worse "
        r"\(promote.refresh_min_improvement\); the other [1-9]\d* only it can answer", alike["reasons"][0]), alike["reasons"]
    assert alike["bootstrap"]["difference"] == 0.0 and alike["bootstrap"]["low"] == 0.0


def test_the_same_weights_with_another_training_record_are_the_same_version(tiny_model_dir, data_dir, tmp_path, registry,
                                                                          monkeypatch):
    """tqc_model.json also records how a model was trained: stage two keeping stage one's weights under other params
    serves what the champion serves, so it is the champion, not a new version rejected at a difference of 0."""
    import mlflow

    from tqc import registry as model_registry

    torch.manual_seed(1)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
    model.save(tmp_path / "a", {"stage": "stage_two", "params": {"learning_rate": 5e-5}})
    model.save(tmp_path / "b", {"stage": "stage_two", "params": {"learning_rate": 1e-4}})

    def promote_model(folder):
        with standalone_run("promote", registry) as tracker:
            return promote.run(data_dir, folder, None, PromoteParams(), tmp_path / "p.json", tracker)

    with monkeypatch.context() as before:  # a registry filled by the code that hashed tqc_model.json whole
        before.setattr(model_registry, "served_files_digest", model_registry.folder_digest)
        assert promote_model(tmp_path / "a")["challenger_version"] == "1"
    again = promote_model(tmp_path / "a")
    assert again["challenger_version"] == "1" and again["challenger_registered_before"]  # found by the old digest
    other_record = promote_model(tmp_path / "b")
    assert other_record["challenger_version"] == "1" and other_record["challenger_registered_before"]
    assert other_record["reasons"][0].startswith("the challenger is the champion, v1")
    assert len(mlflow.MlflowClient().search_model_versions("name='tqc-admc'")) == 1
    assert promote_model(trained(tiny_model_dir, data_dir, tmp_path / "c"))["challenger_version"] == "2"  # other weights


def test_a_refresh_that_ties_the_champion_is_promoted_and_a_training_that_ties_is_not(tiny_model_dir, data_dir, tmp_path,
                                                                                      registry):
    """A refresh adds labeled questions to the champion's own encoder: on a validation split they leave as it was,
    a tie (difference 0, CI [0, 0]) never cleared min_improvement 0, so such a refresh was never served."""
    import shutil

    model = untrained(tiny_model_dir, tmp_path / "model")

    def copy_with_a_note(name: str) -> Path:  # other content (the folder's files), the same answers
        copy = Path(shutil.copytree(model, tmp_path / name))
        (copy / "NOTE.txt").write_text(name)
        return copy

    def promote_with(model_dir: Path, refresh: bool, top_k: int = 5) -> dict:  # the exemplar rule, as a refresh serves
        with standalone_run("promote", registry) as tracker:
            return promote.run(data_dir, model_dir, None, PromoteParams(top_k=top_k, rule="exemplars"), tmp_path / "p.json",
                               tracker, refresh=refresh)

    assert promote_with(model, refresh=False)["promoted"]
    trained_tie = promote_with(copy_with_a_note("trained"), refresh=False)
    assert not trained_tie["promoted"] and trained_tie["bootstrap"]["low"] == 0.0
    refreshed_tie = promote_with(copy_with_a_note("refreshed"), refresh=True)
    assert refreshed_tie["promoted"] and refreshed_tie["champion_version_after"] == refreshed_tie["challenger_version"]
    assert "refresh_min_improvement" in refreshed_tie["reasons"][0]

    # promote.top_k alone changed: the champion's answers, served otherwise; no gate could pass it, and none judges it
    served_otherwise = promote_with(tmp_path / "refreshed", refresh=False, top_k=3)
    assert served_otherwise["promoted"] and served_otherwise["challenger_version"] not in ("1", "2", "3")
    assert served_otherwise["reasons"][0].startswith(f"the champion's answers, v{refreshed_tie['challenger_version']}'s")

    # a champion registered before versions carried an answers digest gets it when its content is this one's
    import mlflow

    client = mlflow.MlflowClient()
    client.delete_model_version_tag("tqc-admc", served_otherwise["challenger_version"], "answers_digest")
    from_before = promote_with(tmp_path / "refreshed", refresh=False, top_k=2)
    assert from_before["promoted"] and from_before["reasons"][0].startswith("the champion's answers"), from_before["reasons"]
    assert "answers_digest" in client.get_model_version("tqc-admc", served_otherwise["challenger_version"]).tags


def test_an_unchanged_model_is_not_registered_again_and_a_changed_shift_is(tiny_model_dir, data_dir, tmp_path, registry):
    import mlflow

    from tqc.io import write_json

    models = tmp_path / "models"
    model_dir = untrained(tiny_model_dir, models / "stage_two")
    catalog = Catalog.load(data_dir / "catalog.jsonl")

    def prior_file(num_shift: float, target: str | None, temperature: float = 0.1):
        shift = {c: (num_shift if c == "NUM" else 0.0) for c in catalog.class_ids}
        entry = {"model": "stage_two", "weight": 1.0, "temperature": temperature, "shift": shift,
                 "validation_by_weight": {"0": {"nll": temperature}}, **({"target": target} if target else {})}
        write_json(models / "prior.json", {"weights": [0.0, 1.0], "models": {"admc": entry}})
        return models / "prior.json"

    reports = []
    # again: the same shift fitted anew (another λ grid or τ moves the fit's record, not what is served)
    for num_shift, target, temperature in ((0.0, None, 0.1), (0.0, None, 0.2), (0.5, "uniform", 0.1)):  # None: before targets
        with standalone_run("promote", registry) as tracker:
            reports.append(promote.run(data_dir, model_dir, prior_file(num_shift, target, temperature),
                                       PromoteParams(bootstrap_samples=200), tmp_path / "p.json", tracker))

    first, again, shifted = reports
    assert first["promoted"] and first["challenger_version"] == "1" and not first["challenger_registered_before"]
    assert again["challenger_version"] == "1" and again["challenger_registered_before"]
    assert not again["promoted"] and again["champion_version_after"] == "1"
    assert again["reasons"][0].startswith("the challenger is the champion, v1")
    assert shifted["challenger_version"] == "2" and not shifted["challenger_registered_before"]  # other shift, other content
    client = mlflow.MlflowClient()
    assert client.get_model_version("tqc-admc", "1").tags["promotion"] == "champion"  # not turned into "rejected"
    first_tags, shifted_tags = client.get_model_version("tqc-admc", "1").tags, client.get_model_version("tqc-admc", "2").tags
    assert first_tags["content_digest"] != shifted_tags["content_digest"]
    assert first_tags["prior_target"] == "labeled" and first_tags["prior_weight"] == "1.0"  # what each version serves
    assert shifted_tags["prior_target"] == "uniform"


def test_a_version_registered_under_the_whole_prior_entrys_digest_is_found_again(tiny_model_dir, data_dir, tmp_path,
                                                                                 registry, monkeypatch):
    from tqc import registry as model_registry
    from tqc.io import write_json

    models = tmp_path / "models"
    model_dir = untrained(tiny_model_dir, models / "stage_two")
    shift = {c: 0.0 for c in Catalog.load(data_dir / "catalog.jsonl").class_ids}
    write_json(models / "prior.json", {"weights": [0.0, 1.0], "models": {"admc": {
        "model": "stage_two", "weight": 1.0, "temperature": 0.1, "shift": shift, "validation_by_weight": {}}}})

    def promote_model() -> dict:
        with standalone_run("promote", registry) as tracker:
            return promote.run(data_dir, model_dir, models / "prior.json", PromoteParams(bootstrap_samples=200),
                               tmp_path / "p.json", tracker)

    with monkeypatch.context() as before:  # the digest as the last version of tqc computed it
        whole_prior = model_registry._prior_part
        before.setattr(model_registry, "_prior_part", lambda entry, whole: whole_prior(entry, whole=True))
        assert promote_model()["challenger_version"] == "1"
    again = promote_model()
    assert again["challenger_version"] == "1" and again["challenger_registered_before"]


def test_the_registry_serves_the_exemplar_rule_with_the_training_rows_and_no_shift(tiny_model_dir, data_dir, tmp_path, registry):
    import mlflow

    from tqc.io import write_json
    from tqc.serving import local_matcher

    models = tmp_path / "models"
    model_dir = untrained(tiny_model_dir, models / "stage_two")
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    write_json(models / "prior.json", {"weights": [0.0, 1.0], "models": {"admc": {  # a shift the exemplar rule must not serve
        "model": "stage_two", "weight": 1.0, "temperature": 0.1, "shift": {c: (100.0 if c == "NUM" else 0.0) for c in catalog.class_ids}}}})

    def promote_with(rule: str) -> dict:
        with standalone_run("promote", registry) as tracker:
            return promote.run(data_dir, model_dir, models / "prior.json", PromoteParams(bootstrap_samples=200, rule=rule),
                               tmp_path / "p.json", tracker, exemplar_k=1)

    standard, exemplars, again = promote_with("standard"), promote_with("exemplars"), promote_with("exemplars")
    first_rows = (data_dir / "train.jsonl").read_text(encoding="utf-8")
    with (data_dir / "train.jsonl").open("a", encoding="utf-8") as rows:  # a newly labeled question: other content
        rows.write('{"text": "where is the eiffel tower", "class_id": "LOC"}\n')
    grown = promote_with("exemplars")

    assert (standard["rule"], exemplars["rule"]) == ("standard", "exemplars")
    assert standard["validation"]["challenger_accuracy"] < 0.5  # NUM for every question, through the shift
    assert exemplars["challenger_version"] == "2" and not exemplars["challenger_registered_before"]  # the same model, other content
    assert exemplars["validation"]["challenger_accuracy"] > standard["validation"]["challenger_accuracy"]
    assert exemplars["promoted"]  # judged on validation like any challenger
    assert again["challenger_version"] == "2" and again["challenger_registered_before"]  # unchanged: found by its digest
    assert grown["challenger_version"] == "3" and not grown["challenger_registered_before"]
    client = mlflow.MlflowClient()
    assert client.get_model_version("tqc-admc", "2").tags["rule"] == "exemplars"
    assert client.get_model_version("tqc-admc", "2").tags["prior_target"] == "none"
    questions = pd.DataFrame({"question": ["where is paris", "who invented chess", "how many moons"]})
    (tmp_path / "first_rows.jsonl").write_text(first_rows, encoding="utf-8")
    served = mlflow.pyfunc.load_model("models:/tqc-admc/2").predict(questions, params={"top_k": 2})
    local = local_matcher(model_dir, data_dir / "catalog.jsonl", 2, None, (tmp_path / "first_rows.jsonl", 1)).predict(None, questions)
    pd.testing.assert_frame_equal(served, local)  # v2 serves its registered copy of the rows as they were, k = 1


def test_a_version_serving_the_exemplar_rule_loads_the_vectors_registered_with_it(tiny_model_dir, data_dir, tmp_path,
                                                                                   registry, monkeypatch, caplog):
    """Every load of such a version encoded all its exemplar rows: a minute of a server's start for TREC-6's 4,816 on
    a 2-core CPU. Registered with it, their vectors are read instead, and encoded after all where they do not fit."""
    import mlflow

    from tqc.model.encoder import TextEncoder
    from tqc.registry import EXEMPLAR_VECTORS, registered_artifacts
    from tqc.serving import local_matcher

    model_dir = untrained(tiny_model_dir, tmp_path / "models" / "stage_two")
    with standalone_run("promote", registry) as tracker:
        promote.run(data_dir, model_dir, None, PromoteParams(bootstrap_samples=200, rule="exemplars"), tmp_path / "p.json",
                    tracker, exemplar_k=2)
    encoded = []
    real = TextEncoder.encode

    def counting(self, texts, batch_size=256, description="encoding"):
        encoded.append((description, len(texts)))
        return real(self, texts, batch_size, description)

    monkeypatch.setattr(TextEncoder, "encode", counting)
    questions = pd.DataFrame({"question": ["where is paris", "who invented chess", "how many moons"]})
    served = mlflow.pyfunc.load_model("models:/tqc-admc/1").predict(questions, params={"top_k": 2})
    assert [what for what, _ in encoded] == ["encoding"]  # the questions asked; no exemplar row encoded
    local = local_matcher(model_dir, data_dir / "catalog.jsonl", 2, None, (data_dir / "train.jsonl", 2)).predict(None, questions)
    pd.testing.assert_frame_equal(served, local)  # the registered vectors answer as freshly encoded ones do

    # vectors that do not fit these weights (another encoding code where it is served, say) are encoded after all
    artifacts, _ = registered_artifacts("tqc-admc", "1", tmp_path / "download")
    (entry,) = artifacts[EXEMPLAR_VECTORS].glob("*.safetensors")
    entry.rename(entry.with_name(entry.name[:17] + "0" * 64 + ".safetensors"))
    encoded.clear()
    from types import SimpleNamespace

    from tqc.serving import StandardQuestionMatcher

    matcher = StandardQuestionMatcher()
    with caplog.at_level("INFO", logger="tqc.exemplar_cache"):
        matcher.load_context(SimpleNamespace(artifacts={k: str(v) for k, v in artifacts.items()},
                                             model_config={"top_k": 2, "rule": "exemplars", "exemplar_k": 2}))
    assert ("encoding exemplars", len(load_questions(data_dir / "train.jsonl"))) in encoded
    assert "no registered vectors for these weights" in caplog.text
    pd.testing.assert_frame_equal(matcher.predict(None, questions, params={"top_k": 2}), served)


def test_rule_auto_serves_the_rule_right_more_often_on_validation_and_says_so(tiny_model_dir, data_dir, tmp_path, registry,
                                                                               monkeypatch):
    """The shift sends every question to NUM under the standard rule, so validation prefers the exemplar rule: the
    version registered serves it, and the gate's answers (through the registry) are the ones that chose it. The
    exemplar rows are encoded once: the version registers the vectors its choice encoded."""
    import mlflow

    from tqc.io import write_json
    from tqc.model.encoder import TextEncoder

    encoded = []
    real = TextEncoder.encode

    def counting(self, texts, batch_size=256, description="encoding"):
        encoded.append(description)
        return real(self, texts, batch_size, description)

    monkeypatch.setattr(TextEncoder, "encode", counting)

    models = tmp_path / "models"
    model_dir = untrained(tiny_model_dir, models / "stage_two")
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    write_json(models / "prior.json", {"weights": [0.0, 1.0], "models": {"admc": {
        "model": "stage_two", "weight": 1.0, "temperature": 0.1, "shift": {c: (100.0 if c == "NUM" else 0.0) for c in catalog.class_ids}}}})
    with standalone_run("promote", registry) as tracker:
        report = promote.run(data_dir, model_dir, models / "prior.json", PromoteParams(bootstrap_samples=200, rule="auto"),
                             tmp_path / "p.json", tracker, exemplar_k=1)

    from tqc.registry import question_hash

    learnt = {question_hash(q.text) for q in load_questions(data_dir / "train.jsonl")}
    validation = [q for q in load_questions(data_dir / "validation.jsonl") if question_hash(q.text) not in learnt]
    chose = report["rule_on_validation"]  # judged on the validation questions the challenger did not learn from
    assert report["rule"] == "exemplars" and chose["asked"] == "auto" and chose["n"] == len(validation)
    assert chose["standard_accuracy"] < chose["exemplars_accuracy"]
    assert chose["standard_accuracy"] == pytest.approx(sum(q.class_id == "NUM" for q in validation) / len(validation))
    assert report["validation"]["challenger_accuracy"] == pytest.approx(chose["exemplars_accuracy"])  # what the registry serves
    assert mlflow.MlflowClient().get_model_version("tqc-admc", report["challenger_version"]).tags["rule"] == "exemplars"
    assert json.loads((tmp_path / "p.json").read_text())["rule_on_validation"] == chose
    assert encoded.count("encoding exemplars") == 1  # twice before: once to choose the rule, once to register them


def test_under_auto_a_refresh_that_would_change_a_standard_champions_rule_must_win(tiny_model_dir, data_dir, tmp_path,
                                                                                    registry):
    """A refresh serves the exemplar rule. Against a champion serving the standard rule it is a change of rule, which
    auto makes only where the exemplar rule wins; with promote.rule exemplars, asked for, it need only be no worse.
    The bounds are set so that only the no-worse one can pass: which one judged shows in the decision."""
    model = untrained(tiny_model_dir, tmp_path / "model")
    bounds = {"bootstrap_samples": 200, "min_improvement": 1.0, "refresh_min_improvement": -1.0, "tail_tolerance": 1.0}

    def promote_with(rule: str, refresh: bool, exemplar_k: int = 1) -> dict:
        with standalone_run("promote", registry) as tracker:
            return promote.run(data_dir, model, None, PromoteParams(rule=rule, **bounds), tmp_path / "p.json", tracker,
                               exemplar_k=exemplar_k, refresh=refresh)

    assert promote_with("standard", refresh=False)["rule"] == "standard"  # v1, the champion
    under_auto = promote_with("auto", refresh=True)
    assert under_auto["rule"] == "exemplars" and not under_auto["promoted"]  # judged by min_improvement: must win
    assert under_auto["reasons"][0].startswith("promote.rule auto: the champion, v1, serves the standard-question rule")
    asked_for = promote_with("exemplars", refresh=True)  # the same exemplar-rule version, asked for: no worse will do
    assert asked_for["challenger_version"] == under_auto["challenger_version"] and asked_for["promoted"]
    assert asked_for["reasons"][0].startswith("a refresh of the champion's encoder needs only to be no worse")
    # The champion serves the exemplar rule now: under auto a refresh (other k, other content) changes no rule
    exemplar_champion_refreshed = promote_with("auto", refresh=True, exemplar_k=2)
    assert exemplar_champion_refreshed["promoted"]
    assert exemplar_champion_refreshed["reasons"][0].startswith("a refresh of the champion's encoder needs only to be no worse")


def test_a_refresh_that_changes_the_rule_must_win_though_it_answers_a_class_the_champion_cannot(tiny_model_dir, data_dir,
                                                                                               tmp_path, registry):
    """The catalog grew since a standard-rule champion was registered, and a refresh under auto serves the exemplar
    rule with the new class's rows: the lenient bound of a challenger answering new classes overrode the guard that
    a change of rule must win, and the reason that said so was dropped."""
    added = "NUM"
    before = tmp_path / "before"
    Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items() if c != added]).save(before / "catalog.jsonl")
    for split in ("train", "validation"):
        save_questions(before / f"{split}.jsonl", [q for q in load_questions(data_dir / f"{split}.jsonl") if q.class_id != added])
    model = untrained(tiny_model_dir, tmp_path / "model")
    bounds = {"bootstrap_samples": 200, "min_improvement": 1.0, "refresh_min_improvement": -1.0, "tail_tolerance": 1.0}
    with standalone_run("promote", registry) as tracker:
        assert promote.run(before, model, None, PromoteParams(rule="standard", **bounds), tmp_path / "p.json", tracker)["promoted"]
    with standalone_run("promote", registry) as tracker:
        refreshed = promote.run(data_dir, model, None, PromoteParams(rule="auto", **bounds), tmp_path / "p.json", tracker,
                                exemplar_k=1, refresh=True)
    assert refreshed["rule"] == "exemplars" and not refreshed["promoted"], refreshed["reasons"]  # min_improvement judged
    assert refreshed["reasons"][0].startswith("promote.rule auto: the champion, v1, serves the standard-question rule")
    assert ("the challenger answers 1 class(es) of this catalog that the champion, v1, cannot (NUM); it changes the rule "
            "too, so it must still win") in refreshed["reasons"]


def test_rule_auto_keeps_the_standard_rule_on_a_tie_and_with_nothing_to_judge(monkeypatch, tmp_path):
    questions = [LabeledQuestion("what is a", "DESC"), LabeledQuestion("who is b", "HUM")]
    answers = {"standard": ["DESC", "LOC"], "exemplars": ["DESC", "LOC"]}
    monkeypatch.setattr(promote, "_local_top1", lambda model_dir, data_dir, prior_path, exemplars, asked, *cache:
                        np.array(answers["exemplars" if exemplars else "standard"]))
    assert promote._served_rule("auto", tmp_path, tmp_path, None, 2, questions)[0] == "standard"  # 0.5 against 0.5
    answers["exemplars"] = ["DESC", "HUM"]
    rule, figures = promote._served_rule("auto", tmp_path, tmp_path, None, 2, questions)
    assert rule == "exemplars" and (figures["standard_accuracy"], figures["exemplars_accuracy"]) == (0.5, 1.0)
    assert promote._served_rule("auto", tmp_path, tmp_path, None, 2, []) == (
        "standard", {"asked": "auto", "n": 0, "standard_accuracy": None, "exemplars_accuracy": None})
    assert promote._served_rule("exemplars", tmp_path, tmp_path, None, 2, questions) == ("exemplars", None)  # asked: not judged


# A gate that promotes any challenger: the tests of rollbacks need one promotion to roll back
TAKE_ANYTHING = PromoteParams(bootstrap_samples=200, min_improvement=-1.0, tail_tolerance=1.0)


def write_params_for(registry, path: Path) -> None:
    """The shipped params.yaml, its tracking.uri the test's registry: what `tqc set-champion` reads."""
    import yaml

    params = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text())
    params["tracking"]["uri"] = registry.uri
    path.write_text(yaml.safe_dump(params))


def _champion_v1(tiny_model_dir, data_dir, tmp_path, registry):
    """v1 (an untrained model) holds the alias; returns the directory of a better challenger."""
    with standalone_run("promote", registry) as tracker:
        assert promote.run(data_dir, untrained(tiny_model_dir, tmp_path / "weak"), None, PromoteParams(bootstrap_samples=200),
                           tmp_path / "p.json", tracker)["promoted"]
    return trained(tiny_model_dir, data_dir, tmp_path / "strong")


def _alias_version() -> str:
    import mlflow

    return str(mlflow.MlflowClient().get_model_version_by_alias("tqc-admc", "champion").version)


def test_a_failing_registry_is_never_read_as_no_champion(tiny_model_dir, data_dir, tmp_path, registry, monkeypatch):
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

    challenger = _champion_v1(tiny_model_dir, data_dir, tmp_path, registry)

    def overloaded(*_):
        raise MlflowException("the registry timed out", error_code=TEMPORARILY_UNAVAILABLE)

    with monkeypatch.context() as patched:
        patched.setattr(mlflow.MlflowClient, "get_model_version_by_alias", overloaded)
        with standalone_run("promote", registry) as tracker, pytest.raises(MlflowException, match="timed out"):
            promote.run(data_dir, challenger, None, PromoteParams(bootstrap_samples=200), tmp_path / "p.json", tracker)
    assert _alias_version() == "1"  # not handed to v2 unjudged as if there were no champion


def test_a_champion_that_cannot_answer_is_named_and_the_challenger_is_not_blamed(tiny_model_dir, data_dir, tmp_path,
                                                                                  registry, monkeypatch):
    import mlflow

    challenger = _champion_v1(tiny_model_dir, data_dir, tmp_path, registry)
    served = promote._validation_predictions

    def champion_gone(uri, validation, catalog):
        if uri.endswith("/1"):
            raise FileNotFoundError("tqc_model.json")
        return served(uri, validation, catalog)

    monkeypatch.setattr(promote, "_validation_predictions", champion_gone)
    with standalone_run("promote", registry) as tracker, \
            pytest.raises(promote.ChampionUnavailable, match=r"tqc-admc v1, the champion, cannot answer .*challenger v2.*"
                                                            r"run promote again \(a retrain flow judges it first at its next run\)$"):
        promote.run(data_dir, challenger, None, PromoteParams(bootstrap_samples=200), tmp_path / "p.json", tracker)
    assert "promotion" not in mlflow.MlflowClient().get_model_version("tqc-admc", "2").tags  # not tagged failed
    assert _alias_version() == "1"


def test_a_promote_that_fails_after_deciding_moves_nothing_and_its_retry_promotes(tiny_model_dir, data_dir, tmp_path,
                                                                                   registry, monkeypatch):
    from tqc.tracking import Tracker

    challenger = _champion_v1(tiny_model_dir, data_dir, tmp_path, registry)
    log_artifact, failures = Tracker.log_artifact, [RuntimeError("the artifact store dropped the upload")]

    def flaky(self, path, *args, **kwargs):
        if failures:
            raise failures.pop()
        return log_artifact(self, path, *args, **kwargs)

    monkeypatch.setattr(Tracker, "log_artifact", flaky)
    params = PromoteParams(bootstrap_samples=200)
    with standalone_run("promote", registry) as tracker, pytest.raises(RuntimeError, match="dropped the upload"):
        promote.run(data_dir, challenger, None, params, tmp_path / "p.json", tracker)
    assert _alias_version() == "1"  # the alias moves last: a failure before it leaves the champion where it was
    with standalone_run("promote", registry) as tracker:  # what a Prefect retry of `judge` does
        retried = promote.run(data_dir, challenger, None, params, tmp_path / "p.json", tracker)
    assert retried["challenger_registered_before"] and retried["champion_version_before"] == "1"
    assert retried["promoted"] and _alias_version() == "2"


def test_a_refresh_tag_is_set_once_and_never_on_the_champion_it_came_from(tiny_model_dir, data_dir, tmp_path, registry):
    import mlflow

    from tqc.retrain import tag_refresh

    challenger = _champion_v1(tiny_model_dir, data_dir, tmp_path, registry)
    with standalone_run("promote", registry) as tracker:
        promote.run(data_dir, challenger, None, PromoteParams(bootstrap_samples=200), tmp_path / "p.json", tracker)
    tag_refresh("tqc-admc", "1", "1")  # a refresh that changed nothing is the champion itself
    tag_refresh("tqc-admc", "2", "1")
    tag_refresh("tqc-admc", "2", "3")  # a later retry against another champion does not rewrite where v2 came from
    client = mlflow.MlflowClient()
    assert "refreshed_from" not in client.get_model_version("tqc-admc", "1").tags
    assert client.get_model_version("tqc-admc", "2").tags["refreshed_from"] == "1"


def test_tags_follow_the_alias_when_a_registry_write_fails_mid_promotion(tiny_model_dir, data_dir, tmp_path, registry,
                                                                       monkeypatch):
    """The alias is what serving reads. A failed alias move must not leave the challenger tagged champion, and a
    champion tag that failed after the alias moved is put right by the next promote."""
    import mlflow

    challenger = _champion_v1(tiny_model_dir, data_dir, tmp_path, registry)
    params = PromoteParams(bootstrap_samples=200)
    client = mlflow.MlflowClient
    move_alias, set_tag = client.set_registered_model_alias, client.set_model_version_tag

    def alias_write_dropped(self, *args, **kwargs):
        raise RuntimeError("the registry dropped the alias write")

    monkeypatch.setattr(client, "set_registered_model_alias", alias_write_dropped)
    with standalone_run("promote", registry) as tracker, pytest.raises(RuntimeError, match="alias write"):
        promote.run(data_dir, challenger, None, params, tmp_path / "p.json", tracker)
    assert _alias_version() == "1"
    assert client().get_model_version("tqc-admc", "2").tags.get("promotion") != "champion"  # v1 still is
    # the report was written before the registry: it said v2 promoted and champion, with the alias on v1
    said = json.loads((tmp_path / "p.json").read_text())
    assert not said["promoted"] and said["champion_version_after"] == "1"
    assert said["reasons"][-1] == ("a registry write failed (RuntimeError: the registry dropped the alias write): "
                                   "champion is v1 after it, and the stage failed")

    def champion_tag_of_v2_dropped(self, name, version, key, value):
        if str(version) == "2" and value == "champion":
            raise RuntimeError("the registry dropped the tag write")
        return set_tag(self, name, version, key, value)

    monkeypatch.setattr(client, "set_registered_model_alias", move_alias)
    monkeypatch.setattr(client, "set_model_version_tag", champion_tag_of_v2_dropped)
    with standalone_run("promote", registry) as tracker, pytest.raises(RuntimeError, match="tag write"):
        promote.run(data_dir, challenger, None, params, tmp_path / "p.json", tracker)
    assert _alias_version() == "2"  # the retry judged v2 against v1 again, promoted it, and its tag write failed
    said = json.loads((tmp_path / "p.json").read_text())
    assert said["promoted"] and said["champion_version_after"] == "2" and "tag write" in said["reasons"][-1]

    monkeypatch.setattr(client, "set_model_version_tag", set_tag)
    with standalone_run("promote", registry) as tracker:
        again = promote.run(data_dir, challenger, None, params, tmp_path / "p.json", tracker)
    assert not again["promoted"] and again["champion_version_before"] == "2"
    v1, v2 = (client().get_model_version("tqc-admc", v).tags for v in ("1", "2"))
    assert v2["promotion"] == "champion" and "superseded_by" not in v2
    assert v1["promotion"] == "superseded" and v1["superseded_by"] == "2"


def test_an_alias_moved_by_hand_leaves_one_version_tagged_champion(tiny_model_dir, data_dir, tmp_path, registry):
    """A rollback (docs/tracking.md: the alias moved by hand); the version that lost it was still tagged champion, and after
    the next promote two versions said champion."""
    import mlflow

    challenger = _champion_v1(tiny_model_dir, data_dir, tmp_path, registry)
    with standalone_run("promote", registry) as tracker:
        assert promote.run(data_dir, challenger, None, TAKE_ANYTHING, tmp_path / "p.json", tracker)["promoted"]
    client = mlflow.MlflowClient()
    client.set_registered_model_alias("tqc-admc", "champion", "1")  # the rollback, by hand
    with standalone_run("promote", registry) as tracker:
        promote.run(data_dir, tmp_path / "weak", None, PromoteParams(bootstrap_samples=200), tmp_path / "p.json", tracker)
    v1, v2 = (client.get_model_version("tqc-admc", v).tags for v in ("1", "2"))
    assert v1["promotion"] == "champion" and "superseded_by" not in v1
    assert v2["promotion"] == "superseded" and v2["superseded_by"] == "1"  # was still champion


def test_a_champion_moved_while_the_gate_judged_is_not_overwritten(tiny_model_dir, data_dir, tmp_path, registry,
                                                                     monkeypatch):
    """The champion was read once, before minutes of judging, and the alias then set without looking again: a rollback
    by hand (`tqc set-champion 1`) made meanwhile was overwritten by a challenger judged only against v2, and the
    report said promoted over v2. The promotion is withdrawn, said first, the alias stays where it was moved, and the
    challenger is tagged incomparable, not rejected."""
    import mlflow

    params = PromoteParams(bootstrap_samples=200, top_k=2, min_improvement=-1.0)  # any challenger wins
    strong = trained(tiny_model_dir, data_dir, tmp_path / "strong")
    torch.manual_seed(0)
    other = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
    stage_one.train(other, load_questions(data_dir / "train.jsonl")[:32], load_questions(data_dir / "validation.jsonl")[:9],
                    Catalog.load(data_dir / "catalog.jsonl"), StageOneParams(epochs=1, batch_size=16, warmup_ratio=0.0),
                    seed=0)
    other.save(tmp_path / "other")
    for model_dir in (untrained(tiny_model_dir, tmp_path / "weak"), tmp_path / "other"):  # v1, then v2 champion
        with standalone_run("promote", registry) as tracker:
            promote.run(data_dir, model_dir, None, params, tmp_path / "promotion.json", tracker)
    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias("tqc-admc", "champion").version) == "2"
    judged_then = promote._decided

    def rolled_back_meanwhile(*arguments):
        judged = judged_then(*arguments)
        client.set_registered_model_alias("tqc-admc", "champion", "1")  # tqc set-champion 1, while the gate judged
        return judged

    monkeypatch.setattr(promote, "_decided", rolled_back_meanwhile)
    with standalone_run("promote", registry) as tracker:
        report = promote.run(data_dir, strong, None, params, tmp_path / "promotion.json", tracker)
    assert report["challenger_version"] == "3" and not report["promoted"]
    assert report["reasons"][0] == ("champion moved from v2 to v1 while the gate judged against v2: not promoted; "
                                    "run promote again to judge against the new holder")
    assert (report["champion_version_before"], report["champion_version_after"]) == ("2", "1")
    assert str(client.get_model_version_by_alias("tqc-admc", "champion").version) == "1"
    assert client.get_model_version("tqc-admc", "3").tags["promotion"] == "incomparable"
    monkeypatch.setattr(promote, "_decided", judged_then)
    with standalone_run("promote", registry) as tracker:  # judged again, against the new holder
        again = promote.run(data_dir, strong, None, params, tmp_path / "promotion.json", tracker)
    assert again["challenger_version"] == "3" and again["champion_version_before"] == "1" and again["promoted"]


def test_set_champion_rolls_back_by_hand_with_the_tags_following_at_once(tiny_model_dir, data_dir, tmp_path, registry,
                                                                          capsys):
    """`tqc set-champion`: the documented rollback, so that no hand-moved alias leaves the tags saying otherwise until
    the next promote."""
    import mlflow

    from tqc.cli import main

    challenger = _champion_v1(tiny_model_dir, data_dir, tmp_path, registry)
    with standalone_run("promote", registry) as tracker:
        assert promote.run(data_dir, challenger, None, TAKE_ANYTHING, tmp_path / "p.json", tracker)["promoted"]
    write_params_for(registry, tmp_path / "params.yaml")

    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "1"]) == 0
    assert "tqc-admc@champion: v1 (was v2; tagged superseded)" in capsys.readouterr().out
    client = mlflow.MlflowClient()
    assert _alias_version() == "1"
    v1, v2 = (client.get_model_version("tqc-admc", v).tags for v in ("1", "2"))
    assert v1["promotion"] == "champion" and "superseded_by" not in v1 and "alias_set_by_hand" in v1
    assert v2["promotion"] == "superseded" and v2["superseded_by"] == "1"

    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "1"]) == 0
    assert "v1 (it held the alias already)" in capsys.readouterr().out
    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "01"]) == 0  # as the registry spells it
    assert "tqc-admc@champion: v1 (it held the alias already)" in capsys.readouterr().out
    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "9"]) == 2
    assert "tqc-admc v9: no such registered version" in capsys.readouterr().err
    client.set_model_version_tag("tqc-admc", "2", "promotion", "failed")  # could not answer when judged: never served
    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "02"]) == 2
    assert "tqc-admc v2 is tagged promotion: failed" in capsys.readouterr().err
    assert _alias_version() == "1"



def test_set_champion_moves_the_alias_then_tags_by_hand_in_order_and_logs_one_line(tiny_model_dir, data_dir, tmp_path,
                                                                                    registry, monkeypatch, caplog):
    """What `set_champion` writes, in order: the alias (its tags following it), then the version tagged
    alias_set_by_hand, its own alias_taken_by_hand tag gone, and the version that lost the alias tagged
    alias_taken_by_hand, one time for both; then one log line. A version that holds the alias already writes nothing."""
    import mlflow

    from tqc.cli import main

    challenger = _champion_v1(tiny_model_dir, data_dir, tmp_path, registry)
    with standalone_run("promote", registry) as tracker:
        assert promote.run(data_dir, challenger, None, TAKE_ANYTHING, tmp_path / "p.json", tracker)["promoted"]
    write_params_for(registry, tmp_path / "params.yaml")
    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "1"]) == 0  # v2 tagged taken by hand
    writes = []
    for method in ("set_registered_model_alias", "set_model_version_tag", "delete_model_version_tag"):
        def recorded(client, *args, _method=method, _real=getattr(mlflow.MlflowClient, method)):
            writes.append((_method, *args))
            return _real(client, *args)
        monkeypatch.setattr(mlflow.MlflowClient, method, recorded)

    with caplog.at_level("INFO", logger="tqc.stages.promote"):
        assert promote.set_champion(PromoteParams(), "02") == ("2", "1")
        assert promote.set_champion(PromoteParams(), "2") == ("2", "2")  # held already: nothing written, nothing said

    when = writes[5][4]  # one time for both tags
    assert writes == [("set_registered_model_alias", "tqc-admc", "champion", "2"),  # the tags follow it (_move_alias)
                      ("delete_model_version_tag", "tqc-admc", "2", "superseded_by"),
                      ("set_model_version_tag", "tqc-admc", "2", "promotion", "champion"),
                      ("set_model_version_tag", "tqc-admc", "1", "promotion", "superseded"),
                      ("set_model_version_tag", "tqc-admc", "1", "superseded_by", "2"),
                      ("set_model_version_tag", "tqc-admc", "2", "alias_set_by_hand", when),
                      ("delete_model_version_tag", "tqc-admc", "2", "alias_taken_by_hand.champion"),
                      ("set_model_version_tag", "tqc-admc", "1", "alias_taken_by_hand.champion", when)]
    assert [r.getMessage() for r in caplog.records if r.name == "tqc.stages.promote"] == [
        "set-champion: tqc-admc@champion is v2 (was v1), set by hand"]


def test_a_version_rolled_back_by_hand_is_not_handed_the_alias_back_by_the_next_promote(tiny_model_dir, data_dir, tmp_path,
                                                                                        registry, capsys):
    """After `tqc set-champion 1`, a `dvc repro` that re-ran promote on v2's unchanged weights (any change upstream of
    promote does) found v2 by its digest and judged it against v1 again: it won, as it had, and took the alias back
    unasked. Set by hand again, the gate judges it again."""
    import mlflow

    from tqc.cli import main

    challenger = _champion_v1(tiny_model_dir, data_dir, tmp_path, registry)

    def promote_v2() -> dict:
        with standalone_run("promote", registry) as tracker:
            return promote.run(data_dir, challenger, None, TAKE_ANYTHING, tmp_path / "p.json", tracker)

    assert promote_v2()["promoted"]
    write_params_for(registry, tmp_path / "params.yaml")
    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "1"]) == 0
    capsys.readouterr()

    again = promote_v2()
    assert again["challenger_version"] == "2" and again["challenger_registered_before"]
    assert not again["promoted"] and _alias_version() == "1"
    assert again["reasons"][0].startswith("v2 lost champion by hand at ") and "`tqc set-champion 2`" in again["reasons"][0]
    v2 = mlflow.MlflowClient().get_model_version("tqc-admc", "2").tags
    assert v2["promotion"] == "superseded" and v2["superseded_by"] == "1"  # not retagged rejected

    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "2"]) == 0  # a person's choice again
    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "1"]) == 0
    client = mlflow.MlflowClient()
    assert "alias_taken_by_hand.champion" in client.get_model_version("tqc-admc", "2").tags
    assert "alias_taken_by_hand.champion" not in client.get_model_version("tqc-admc", "1").tags  # served again

    # v3 wins over v1 through the gate; v1's weights win the alias back through the gate; v3 is judged, not refused
    third, other = tmp_path / "third", BiEncoder.load(tmp_path / "weak")
    with torch.no_grad():
        next(other.parameters()).add_(0.01)  # other weights: another version
    other.save(third)
    with standalone_run("promote", registry) as tracker:
        first_three = promote.run(data_dir, third, None, TAKE_ANYTHING, tmp_path / "p.json", tracker)
    assert first_three["champion_version_after"] == "3", first_three["reasons"]
    with standalone_run("promote", registry) as tracker:
        assert promote.run(data_dir, tmp_path / "weak", None, TAKE_ANYTHING, tmp_path / "p.json", tracker)["promoted"]
    with standalone_run("promote", registry) as tracker:
        back = promote.run(data_dir, third, None, TAKE_ANYTHING, tmp_path / "p.json", tracker)
    assert back["challenger_registered_before"] and back["promoted"] and _alias_version() == "3"

    mlflow.MlflowClient().set_model_version_tag("tqc-admc", "3", "alias_taken_by_hand.champion", "2026-01-01T00:00:00+00:00")
    with standalone_run("promote", registry) as tracker:  # the mark is the champion alias's: another alias judges v3
        staging = promote.run(data_dir, third, None, TAKE_ANYTHING.model_copy(update={"alias": "staging"}),
                              tmp_path / "s.json", tracker)
    assert staging["promoted"] and staging["champion_version_after"] == "3"


def split_of(directory: Path, train: list[tuple[str, str]], validation: list[tuple[str, str]]) -> Path:
    """A validated data folder with the fixture's catalog and these rows."""
    Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()]).save(directory / "catalog.jsonl")
    save_questions(directory / "train.jsonl", [LabeledQuestion(t, c) for t, c in train])
    save_questions(directory / "validation.jsonl", [LabeledQuestion(t, c) for t, c in validation])
    return directory


def test_the_gate_leaves_out_validation_questions_the_champion_learnt_from(tiny_model_dir, tmp_path, registry):
    """A later split can put an older champion's training questions into validation (session 43's repro did: a new
    split drew 15 of them), where it answers from memory. Each version records what it learnt from; the gate
    judges on the rest, a question written another way (case, spaces) counting as the same question."""
    import mlflow

    from tqc.registry import question_hash, trained_on_record

    first_train = synthetic_questions(0, 40)
    first = split_of(tmp_path / "first", first_train, [(t + " again", c) for t, c in synthetic_questions(1, 5)])
    champion_model = untrained(tiny_model_dir, tmp_path / "champion")
    with standalone_run("promote", registry) as tracker:
        assert promote.run(first, champion_model, None, PromoteParams(), tmp_path / "p.json", tracker)["promoted"]
    assert trained_on_record("tqc-admc", "1", tmp_path / "record") == {question_hash(t) for t, _ in first_train}

    learnt = list(dict.fromkeys(first_train))[:10]  # ten of the champion's training questions, shouted
    unseen = [(f"{t} asked anew {i}", c) for i, (t, c) in enumerate(synthetic_questions(3, 2))]  # 12 new questions
    second_train = [(t + " now", c) for t, c in synthetic_questions(2, 30)]
    second = split_of(tmp_path / "second", second_train, [(f"  {t.upper()} ", c) for t, c in learnt] + unseen)
    challenger_model = trained(tiny_model_dir, second, tmp_path / "challenger")
    with standalone_run("promote", registry) as tracker:
        judged = promote.run(second, challenger_model, None, PromoteParams(), tmp_path / "p.json", tracker)
    assert judged["challenger_version"] == "2" and judged["champion_version_before"] == "1"
    assert judged["validation"]["n"] == len(unseen) and judged["validation"]["left_out_as_learnt_from"] == len(learnt)
    assert f"judged on {len(unseen)} of the {len(learnt) + len(unseen)} validation questions" in " ".join(judged["reasons"])
    assert trained_on_record("tqc-admc", "2", tmp_path / "record2") == {question_hash(t) for t, _ in second_train}

    # A refresh serves the champion's encoder: its record holds what that encoder learnt from, and its own rows.
    # v1 is made champion by hand, so that its record (first_train) is not the refresh's own rows.
    mlflow.MlflowClient().set_registered_model_alias("tqc-admc", "champion", "1")
    refreshed = Path(shutil.copytree(champion_model, tmp_path / "refreshed"))
    (refreshed / "NOTE.txt").write_text("refreshed")
    with standalone_run("promote", registry) as tracker:
        refresh = promote.run(second, refreshed, None, PromoteParams(), tmp_path / "p.json", tracker, refresh=True)
    assert trained_on_record("tqc-admc", refresh["challenger_version"], tmp_path / "record3") == {
        question_hash(t) for t, _ in first_train + second_train}


def test_a_validation_split_the_champion_learnt_whole_judges_nothing_and_the_alias_stays(tiny_model_dir, tmp_path, registry):
    import mlflow

    train = synthetic_questions(0, 40)
    first = split_of(tmp_path / "first", train, [(t + " again", c) for t, c in synthetic_questions(1, 5)])
    with standalone_run("promote", registry) as tracker:
        promote.run(first, untrained(tiny_model_dir, tmp_path / "champion"), None, PromoteParams(), tmp_path / "p.json",
                    tracker)
    memorised = split_of(tmp_path / "memorised", [(t + " now", c) for t, c in synthetic_questions(2, 30)], train[:20])
    with standalone_run("promote", registry) as tracker:
        report = promote.run(memorised, trained(tiny_model_dir, first, tmp_path / "challenger"), None, PromoteParams(),
                             tmp_path / "p.json", tracker)
    assert not report["promoted"] and report["champion_version_after"] == "1"
    assert report["validation"] == {"n": 0, "left_out_as_learnt_from": 20, "challenger_accuracy": None,
                                    "champion_accuracy": None}
    assert report["reasons"][0].startswith("all 20 validation questions are questions the champion or the challenger")
    assert mlflow.MlflowClient().get_model_version("tqc-admc", "2").tags["promotion"] == "rejected"
    assert json.loads((tmp_path / "p.json").read_text()) == report  # valid JSON: no NaN for the figures it has not


def test_a_first_model_with_no_unseen_validation_question_still_becomes_champion(tiny_model_dir, tmp_path, registry):
    """Validation within train (a custom validation file, say): nothing to ask, and no champion to keep."""
    train = synthetic_questions(0, 40)
    within = split_of(tmp_path / "within", train, train[:10])
    with standalone_run("promote", registry) as tracker:
        report = promote.run(within, untrained(tiny_model_dir, tmp_path / "first"), None, PromoteParams(),
                             tmp_path / "p.json", tracker)
    assert report["promoted"] and report["champion_version_after"] == "1"
    assert report["validation"]["n"] == 0 and report["validation"]["left_out_as_learnt_from"] == 10


def _remove_model_folder(registry, version: str) -> None:
    """Registered `version`'s logged model, gone from the local artifact store (a store cleaned up, say)."""
    import mlflow

    model_id = mlflow.MlflowClient().get_model_version("tqc-admc", version).source.removeprefix("models:/")  # m-…
    assert model_id.startswith("m-")
    folders = [p for p in Path(registry.uri.removeprefix("sqlite:///")).parent.rglob(model_id) if p.is_dir()]
    assert folders, model_id
    for folder in folders:  # the logged model's own folder, and any copy of it the store keeps by its id
        shutil.rmtree(folder, ignore_errors=True)


def test_a_version_whose_files_are_gone_is_not_found_again_nor_set_champion_by_hand(tiny_model_dir, data_dir, tmp_path,
                                                                                    registry, capsys):
    """v1's files gone, the same content promoted again stood in as v1 by its digest and failed every load, with
    `tqc predict`'s "register it again" no way out; and `tqc set-champion` moved the alias onto a version that could not
    be loaded. The content is registered anew, and set-champion loads a version before it moves the alias."""
    import mlflow

    from tqc.cli import main

    weak = untrained(tiny_model_dir, tmp_path / "weak")
    with standalone_run("promote", registry) as tracker:
        assert promote.run(data_dir, weak, None, PromoteParams(bootstrap_samples=200), tmp_path / "p.json", tracker)["promoted"]
    _remove_model_folder(registry, "1")

    with standalone_run("promote", registry) as tracker, pytest.raises(promote.ChampionUnavailable,
                                                                       match=r"v1, the champion.*a retrain flow judges it first"):
        promote.run(data_dir, weak, None, PromoteParams(bootstrap_samples=200), tmp_path / "p.json", tracker)
    client = mlflow.MlflowClient()
    assert sorted(str(v.version) for v in client.search_model_versions("name='tqc-admc'")) == ["1", "2"]  # v2: anew

    write_params_for(registry, tmp_path / "params.yaml")
    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "2"]) == 0
    capsys.readouterr()
    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "1"]) == 2
    assert "tqc-admc v1 cannot be loaded, so it cannot be served" in capsys.readouterr().err
    assert _alias_version() == "2"


def test_the_same_weights_registered_for_another_top_k_are_not_handed_an_alias_taken_by_hand(tiny_model_dir, data_dir,
                                                                                              tmp_path, registry, capsys):
    """After `tqc set-champion 1` took the alias from v2, v2's weights under another `promote.top_k` (a new version: the
    digest holds top_k) won the gate as v2 had and took the alias back unasked."""
    import mlflow

    from tqc.cli import main

    challenger = _champion_v1(tiny_model_dir, data_dir, tmp_path, registry)
    with standalone_run("promote", registry) as tracker:
        assert promote.run(data_dir, challenger, None, TAKE_ANYTHING, tmp_path / "p.json", tracker)["promoted"]
    write_params_for(registry, tmp_path / "params.yaml")
    assert main(["--params", str(tmp_path / "params.yaml"), "set-champion", "1"]) == 0
    capsys.readouterr()

    with standalone_run("promote", registry) as tracker:
        report = promote.run(data_dir, challenger, None, TAKE_ANYTHING.model_copy(update={"top_k": 3}), tmp_path / "p.json",
                             tracker)

    assert report["challenger_version"] == "3" and not report["promoted"] and _alias_version() == "1"
    assert report["reasons"][0].startswith("v3 gives the answers of v2, which lost champion by hand at ")
    assert mlflow.MlflowClient().get_model_version("tqc-admc", "3").tags["promotion"] == "rejected"


def test_a_champion_whose_artifacts_cannot_be_read_is_named_and_the_challenger_is_registered(tiny_model_dir, data_dir,
                                                                                           tmp_path, registry):
    """Its record is read before the challenger is registered; a champion that cannot be read is still the champion's
    fault (ChampionUnavailable, as when it cannot answer), and the challenger is registered for the next try."""
    import mlflow

    with standalone_run("promote", registry) as tracker:
        promote.run(data_dir, untrained(tiny_model_dir, tmp_path / "champion"), None, PromoteParams(), tmp_path / "p.json",
                    tracker)
    for model_file in list(Path(registry.uri.removeprefix("sqlite:///")).parent.rglob("MLmodel")):
        shutil.rmtree(model_file.parent)  # v1's logged model, gone from the artifact store
    with standalone_run("promote", registry) as tracker, pytest.raises(promote.ChampionUnavailable,
                                                                       match=r"v1, the champion.*a retrain flow judges it first"):
        promote.run(data_dir, trained(tiny_model_dir, data_dir, tmp_path / "challenger"), None, PromoteParams(),
                    tmp_path / "p.json", tracker)
    assert sorted(str(v.version) for v in mlflow.MlflowClient().search_model_versions("name='tqc-admc'")) == ["1", "2"]


def test_a_refresh_of_a_champion_without_a_record_registers_none_rather_than_a_short_one(tiny_model_dir, data_dir,
                                                                                         tmp_path, registry):
    import mlflow

    from tqc import registry as model_registry

    with standalone_run("register", registry):
        version, _, _ = model_registry.register(untrained(tiny_model_dir, tmp_path / "old"), data_dir / "catalog.jsonl",
                                                None, "tqc-admc", 5)
    mlflow.MlflowClient().set_registered_model_alias("tqc-admc", "champion", version)
    refreshed = Path(shutil.copytree(tmp_path / "old", tmp_path / "refreshed"))
    (refreshed / "NOTE.txt").write_text("refreshed")
    with standalone_run("promote", registry) as tracker:
        report = promote.run(data_dir, refreshed, None, PromoteParams(), tmp_path / "p.json", tracker, refresh=True)
    assert report["challenger_version"] != version
    # A refresh serves the exemplar rule whatever promote.rule says (a run that trains judging the last run's refresh):
    # registered as `standard`, it was the champion's encoder without its class-prior shift
    assert report["rule"] == "exemplars"
    assert mlflow.MlflowClient().get_model_version("tqc-admc", report["challenger_version"]).tags["rule"] == "exemplars"
    assert model_registry.trained_on_record("tqc-admc", report["challenger_version"], tmp_path / "record") is None


def test_a_champion_registered_without_a_record_is_named_as_such(tiny_model_dir, data_dir, tmp_path, registry):
    """Versions registered before records were kept: the gate cannot leave their training questions out, and says so."""
    import mlflow

    from tqc import registry as model_registry

    with standalone_run("register", registry):
        version, _, _ = model_registry.register(untrained(tiny_model_dir, tmp_path / "old"), data_dir / "catalog.jsonl",
                                                None, "tqc-admc", 5)
    mlflow.MlflowClient().set_registered_model_alias("tqc-admc", "champion", version)
    assert model_registry.trained_on_record("tqc-admc", version, tmp_path / "record") is None
    with standalone_run("promote", registry) as tracker:
        report = promote.run(data_dir, trained(tiny_model_dir, data_dir, tmp_path / "new"), None, PromoteParams(),
                             tmp_path / "p.json", tracker)
    assert any(r.startswith(f"v{version} was registered before versions recorded the questions") for r in report["reasons"])


def test_a_champion_given_its_record_afterwards_is_judged_without_its_training_questions(tiny_model_dir, tmp_path,
                                                                                       registry, capsys):
    """`tqc trained-on`: a version registered before versions kept a record gets one from its training file; promote
    then leaves its training questions out as it does for a version registered with one, and a record stays as given."""
    import mlflow
    import yaml

    from tqc import cli
    from tqc import registry as model_registry

    first_train = synthetic_questions(0, 40)
    first = split_of(tmp_path / "first", first_train, [(t + " again", c) for t, c in synthetic_questions(1, 5)])
    with standalone_run("register", registry):  # as versions were registered before records were kept
        version, _, _ = model_registry.register(untrained(tiny_model_dir, tmp_path / "old"), first / "catalog.jsonl",
                                                None, "tqc-admc", 5)
    mlflow.MlflowClient().set_registered_model_alias("tqc-admc", "champion", version)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"tracking": {"uri": registry.uri, "experiment": registry.experiment}}))

    record = ["--params", str(params), "trained-on", "--version", version, "--train", str(first / "train.jsonl")]
    (tmp_path / "empty.jsonl").write_text("")
    assert cli.main(record[:-1] + [str(tmp_path / "empty.jsonl")]) == 2  # an empty record would stand for good
    assert "empty.jsonl: no labeled questions to record" in capsys.readouterr().err
    assert cli.main(record[:4] + ["0" + version] + record[5:]) == 0  # "01": MLflow reads it as 1
    distinct = {model_registry.question_hash(t) for t, _ in first_train}
    said = capsys.readouterr().out
    assert said.startswith(f"tqc-admc v{version}: recorded") and f"/trained_on-v{version}/" in said  # as the registry spells it
    assert f"recorded {len(distinct)} distinct questions of {len(first_train)} rows" in said
    assert "its pipeline run was at commit unknown" in said  # a standalone run outside a pipeline records none
    assert model_registry.trained_on_record("tqc-admc", version, tmp_path / "record") == distinct
    assert cli.main(record[:-1] + [str(first / "validation.jsonl")]) == 2  # never replaced, whatever file is given
    assert "has a record of the questions it learnt from already" in capsys.readouterr().err
    assert cli.main(record[:4] + ["7"] + record[5:]) == 2  # no such version: one line, not a traceback
    assert "error from mlflow" in capsys.readouterr().err

    learnt = list(dict.fromkeys(first_train))[:10]
    unseen = [(f"{t} asked anew {i}", c) for i, (t, c) in enumerate(synthetic_questions(3, 2))]
    second = split_of(tmp_path / "second", [(t + " now", c) for t, c in synthetic_questions(2, 30)],
                      [(t.upper(), c) for t, c in learnt] + unseen)
    with standalone_run("promote", registry) as tracker:
        judged = promote.run(second, trained(tiny_model_dir, second, tmp_path / "challenger"), None, PromoteParams(),
                             tmp_path / "p.json", tracker)
    assert judged["validation"]["n"] == len(unseen) and judged["validation"]["left_out_as_learnt_from"] == len(learnt)
    assert not any("registered before versions recorded" in r for r in judged["reasons"])

    # A refresh of that champion serves its encoder: its record holds the champion's given record and its own rows
    mlflow.MlflowClient().set_registered_model_alias("tqc-admc", "champion", version)
    refreshed = Path(shutil.copytree(tmp_path / "old", tmp_path / "refreshed"))
    (refreshed / "NOTE.txt").write_text("refreshed")
    with standalone_run("promote", registry) as tracker:
        refresh = promote.run(second, refreshed, None, PromoteParams(), tmp_path / "p.json", tracker, refresh=True)
    assert model_registry.trained_on_record("tqc-admc", refresh["challenger_version"], tmp_path / "record2") == distinct | {
        model_registry.question_hash(t + " now") for t, _ in synthetic_questions(2, 30)}


def test_a_refresh_records_what_its_source_learnt_from_even_when_the_alias_moved_since(tiny_model_dir, data_dir, tmp_path,
                                                                                     registry):
    """The retrain flow downloads the champion's encoder, then refreshes; the alias can move in between. The refresh's
    record takes its source's questions (`refreshed_from`), not those of whoever holds the alias when it is judged."""
    import mlflow

    from tqc import registry as model_registry

    source_questions, other_questions = {"a" * 16, "b" * 16}, {"c" * 16}
    with standalone_run("register", registry):
        source, _, _ = model_registry.register(untrained(tiny_model_dir, tmp_path / "source"),
                                               data_dir / "catalog.jsonl", None, "tqc-admc", 5,
                                               trained_on=source_questions)
        moved_to, _, _ = model_registry.register(trained(tiny_model_dir, data_dir, tmp_path / "other"),
                                                 data_dir / "catalog.jsonl", None, "tqc-admc", 5,
                                                 trained_on=other_questions)
    mlflow.MlflowClient().set_registered_model_alias("tqc-admc", "champion", moved_to)  # after the refresh took `source`
    refreshed = Path(shutil.copytree(tmp_path / "source", tmp_path / "refreshed"))
    (refreshed / "NOTE.txt").write_text("refreshed")
    with standalone_run("promote", registry) as tracker:
        report = promote.run(data_dir, refreshed, None, PromoteParams(), tmp_path / "p.json", tracker, refresh=True,
                             refreshed_from=source)
    own = {model_registry.question_hash(q.text) for q in load_questions(data_dir / "train.jsonl")}
    assert model_registry.trained_on_record("tqc-admc", report["challenger_version"], tmp_path / "record") == own | source_questions


def test_a_registered_version_whose_model_config_is_damaged_is_a_one_line_error(tiny_model_dir, data_dir, tmp_path,
                                                                                 registry, capsys, caplog):
    """A version whose tqc_model.json is no longer JSON fails its load with a ValueError, which `tqc predict` let
    through as a traceback where a missing file of the version was one line."""
    import mlflow

    from tqc.cli import main

    with standalone_run("promote", registry) as tracker:
        assert promote.run(data_dir, untrained(tiny_model_dir, tmp_path / "weak"), None, PromoteParams(bootstrap_samples=200),
                           tmp_path / "p.json", tracker)["promoted"]
    # Whole, it answers, and says which question it cuts at model.max_length (48 tokens here) by its argument
    capsys.readouterr()
    long = " ".join(["where is paris"] * 20)  # 62 tokens
    assert main(["predict", "--model", "models:/tqc-admc/1", "--tracking-uri", registry.uri, "who is it", long]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    cut = [r.getMessage() for r in caplog.records if "longer than model.max_length" in r.getMessage()]
    assert len(cut) == 1 and cut[0].startswith("1 question(s) longer than model.max_length (48 tokens")
    assert cut[0].endswith(": question argument(s) 2")  # by its argument, not again by its row
    model_id = mlflow.MlflowClient().get_model_version("tqc-admc", "1").source.removeprefix("models:/")
    stored = [p for p in Path(registry.uri.removeprefix("sqlite:///")).parent.rglob("tqc_model.json")
              if model_id in p.parts]
    assert stored, model_id
    for config in stored:
        config.write_text("{not json")
    capsys.readouterr()
    assert main(["predict", "--model", "models:/tqc-admc/1", "--tracking-uri", registry.uri, "where is paris"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tqc predict: error: --model models:/tqc-admc/1: the registered version does not load (")
    assert "tqc_model.json: not a saved model's config" in err and "\n" not in err


def test_rule_auto_judges_validation_questions_over_max_length_without_a_cut_warning(tiny_model_dir, data_dir, tmp_path,
                                                                                     caplog):
    """The served model says the questions it cuts at model.max_length; promote's judging is of validation questions,
    which evaluate scores cut as silently, so it says none (served_first_answers, named served_top1 then, did not; rule auto's two rules each did, by
    rows of a frame the user never sees)."""
    model_dir = untrained(tiny_model_dir, tmp_path / "model")
    long = " ".join(["where is paris"] * 20)  # 62 tokens, over the 48 of model.max_length
    questions = [LabeledQuestion(long, "LOC"), LabeledQuestion("who is it", "HUM")]
    with caplog.at_level("WARNING"):
        rule, figures = promote._served_rule("auto", model_dir, data_dir, None, 1, questions)
    assert figures["n"] == 2
    assert not [r.getMessage() for r in caplog.records if "longer than model.max_length" in r.getMessage()]


PINNED_PROMOTE = Path(__file__).parents[1] / "code" / "pinned" / "promote"  # each step's outputs as the code wrote them


def _promote_steps(tiny_model_dir, data_dir, tmp_path, registry, monkeypatch, caplog) -> dict[str, str]:
    """promote.run's outputs, step by step on one registry, as text (tmp paths put as TMP, digests and run ids as *):
    its report (the written file, and whether the one returned is it, key for key), the registered file, its log
    lines, what it logged to the run, and the registry after (alias holder, each version's tags). The served answers
    are stood in for by each version's share right, so that nothing hangs on a model's floats; the steps take
    tracking off, a first champion chosen under auto, a better challenger, a worse one found registered, the champion
    again, the champion's answers served otherwise (top_k) and a refresh."""
    import logging

    import mlflow

    from tqc.tracking import Tracker

    catalog = Catalog.load(data_dir / "catalog.jsonl")
    right = {"1": 0.5, "2": 0.9, "3": 0.9, "4": 0.85}  # the share of the questions each version answers right

    def answers(uri, validation, catalog_):
        gold = np.array([catalog.index(q.class_id) for q in validation])
        wrong = (gold + 1) % len(catalog)
        first = np.where(np.arange(len(gold)) < round(right[uri.rsplit("/", 1)[1]] * len(gold)), gold, wrong)
        return promote._Served(first, frozenset(catalog.class_ids))  # every version answers every class

    monkeypatch.setattr(promote, "_validation_predictions", answers)
    monkeypatch.setattr(promote, "_local_top1", lambda model_dir, data_dir_, prior, exemplars, questions, *cache:
                        np.array([q.class_id for q in questions]))  # a tie: auto keeps the standard rule
    weak, strong = untrained(tiny_model_dir, tmp_path / "weak"), trained(tiny_model_dir, data_dir, tmp_path / "strong")
    steps = {"off": (weak, PromoteParams(), {}), "first": (weak, PromoteParams(bootstrap_samples=200, rule="auto"), {}),
             "better": (strong, PromoteParams(bootstrap_samples=200), {}),
             "worse": (weak, PromoteParams(bootstrap_samples=200), {}),
             "again": (strong, PromoteParams(bootstrap_samples=200), {}),
             "top_k": (strong, PromoteParams(bootstrap_samples=200, top_k=3), {}),
             "refresh": (strong, PromoteParams(bootstrap_samples=200), {"refresh": True, "exemplar_k": 1})}
    outputs = {}
    for step, (model_dir, params, options) in steps.items():
        logged, out = [], tmp_path / step
        caplog.clear()
        with (standalone_run("promote", registry) if step != "off" else contextlib.nullcontext(Tracker(None))) as tracker, \
                caplog.at_level(logging.DEBUG, logger="tqc.stages.promote"):
            tracker.log_metrics = lambda metrics, *args, **kw: logged.append(f"metrics {metrics} {args} {kw}")
            tracker.log_artifact = lambda path, *args: logged.append(f"artifact {Path(path).relative_to(tmp_path)} {args}")
            report = promote.run(data_dir, model_dir, None, params, out / "promotion.json", tracker, seed=3,
                                 registered_path=out / "registered.json", **options)
        written = (out / "promotion.json").read_text(encoding="utf-8")
        assert written == json.dumps(report, indent=2, ensure_ascii=False) + "\n"  # returned as written, in its order
        client = mlflow.MlflowClient(registry.uri)
        versions = sorted(client.search_model_versions("name='tqc-admc'"), key=lambda v: int(v.version))
        holder = [str(client.get_model_version_by_alias("tqc-admc", "champion").version)] if versions else []
        tags = [f"v{v.version} " + json.dumps({k: "*" if k in ("content_digest", "answers_digest", "trained_on_record")
                                               else v.tags[k] for k in sorted(v.tags)}) + "\n" for v in versions]
        outputs[step] = "".join([
            "promotion.json\n", written, "registered.json\n", (out / "registered.json").read_text(encoding="utf-8"),
            "\nlog\n", *(f"{r.levelname} {r.getMessage()}\n" for r in caplog.records if r.name == "tqc.stages.promote"),
            "run\n", *(f"{line}\n" for line in logged), f"registry: champion {holder}\n", *tags,
        ]).replace(str(tmp_path), "TMP")
    return outputs


def test_promote_is_pinned_step_for_step(tiny_model_dir, data_dir, tmp_path, registry, monkeypatch, caplog):
    """Every output of promote.run, whole, step after step on one registry: a refactoring that changes a byte of its
    report, registered file, log lines, run metrics, alias or tags fails."""
    outputs = _promote_steps(tiny_model_dir, data_dir, tmp_path, registry, monkeypatch, caplog)
    assert sorted(outputs) == sorted(p.stem for p in PINNED_PROMOTE.iterdir())
    for step, text in outputs.items():
        assert text == (PINNED_PROMOTE / f"{step}.txt").read_text(encoding="utf-8"), step


class _RunsWhenUnpickled:
    """Writes `marker` when unpickled: what a pickled model in a shared registry could do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.write_text, (self.marker, "ran")


def test_a_version_holding_a_pickle_is_refused_and_never_unpickled(tmp_path, registry, capsys):
    """`tqc predict`, promote and set-champion loaded a registered version with `mlflow.pyfunc.load_model`, which
    unpickles a version logged with a Python object: whoever could register one in a shared registry and move the
    alias ran code on the machine that loaded the champion. tqc builds the matcher from a version's files instead."""
    import mlflow
    import mlflow.pyfunc

    from tqc.config import ConfigError
    from tqc.cli import main

    class PickledModel(mlflow.pyfunc.PythonModel):
        def __init__(self, marker: Path):
            self.payload = _RunsWhenUnpickled(marker)

        def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
            return model_input

    marker = tmp_path / "code-ran"
    with standalone_run("register", registry):  # no requirements inferred: that would load (unpickle) it at once
        info = mlflow.pyfunc.log_model(name="model", python_model=PickledModel(marker), pip_requirements=[])
    version = mlflow.register_model(info.model_uri, "tqc-admc").version
    mlflow.MlflowClient().set_registered_model_alias("tqc-admc", "champion", version)
    assert not marker.exists()

    capsys.readouterr()
    assert main(["predict", "--model", "models:/tqc-admc@champion", "--tracking-uri", registry.uri, "where is paris"]) == 2
    assert "models:/tqc-admc@champion is not a version tqc registered (it has no model or catalog artifact)" in \
        capsys.readouterr().err
    with pytest.raises(ConfigError, match="cannot be loaded, so it cannot be served"):
        promote.set_champion(PromoteParams(), str(version))
    assert not marker.exists()
    mlflow.pyfunc.load_model("models:/tqc-admc@champion")  # what loading through MLflow does: the pickle's code runs
    assert marker.read_text() == "ran"


def test_a_version_whose_artifact_lies_outside_its_files_is_refused(tmp_path):
    import yaml

    from tqc.registry import version_artifacts

    version = tmp_path / "version"
    version.mkdir()
    (tmp_path / "secret.txt").write_text("not the version's")
    (version / "MLmodel").write_text(yaml.safe_dump({"flavors": {"python_function": {
        "loader_module": "mlflow.pyfunc.loaders.code_model",
        "artifacts": {"model": {"path": "artifacts/model"}, "catalog": {"path": "../secret.txt"}}}}}))
    with pytest.raises(ValueError, match="its artifact.s. catalog lie outside the version's own files"):
        version_artifacts(str(version), tmp_path / "download")


def test_a_version_holding_a_link_in_a_local_store_is_refused(tmp_path):
    """The path check saw only the downloaded copy: MLflow's download from a local store copies what a link leads to,
    so a version whose catalog was a link to another user's file had that file read as its catalog."""
    import yaml

    from tqc.registry import version_artifacts

    version = tmp_path / "version"
    (version / "artifacts" / "model").mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("db:5432:*:alice:hunter2")
    (version / "artifacts" / "catalog.jsonl").symlink_to(tmp_path / "secret.txt")
    (version / "MLmodel").write_text(yaml.safe_dump({"flavors": {"python_function": {
        "loader_module": "mlflow.pyfunc.loaders.code_model",
        "artifacts": {"model": {"path": "artifacts/model"}, "catalog": {"path": "artifacts/catalog.jsonl"}}}}}))
    with pytest.raises(ValueError, match="artifacts/catalog.jsonl are links in the artifact store"):
        version_artifacts(str(version), tmp_path / "download")
    assert not (tmp_path / "download").exists() or "hunter2" not in "".join(
        p.read_text() for p in (tmp_path / "download").rglob("*") if p.is_file())
