"""The class-prior shift: log π, the choice of λ on validation, and its file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tqc import prior
from tqc.io import write_json

CLASSES = ["common", "rare"]


def test_log_prior_is_the_smoothed_training_class_mix():
    log_pi = prior.log_prior(["common"] * 8 + ["rare"] * 2, CLASSES, smoothing=1.0)
    assert np.exp(log_pi) == pytest.approx([9 / 12, 3 / 12])  # add-one
    assert np.exp(log_pi).sum() == pytest.approx(1.0)


def test_a_class_without_training_rows_takes_the_mean_log_prior_of_the_others():
    """A class added by its standard question alone has no validation rows to hold λ back: at 1/(N+C) the shift put it
    far below every class, and no test question of it was answered with it."""
    log_pi = prior.log_prior(["common"] * 8 + ["rare"] * 2, CLASSES + ["added"], smoothing=1.0)
    assert log_pi[2] == pytest.approx(np.mean(np.log([9 / 13, 3 / 13])))

    rng = np.random.default_rng(0)
    gold = np.repeat([0, 1, 2], 20)
    scores = rng.normal(0.0, 0.05, (60, 3)) + 0.3 * np.eye(3)[gold]  # (60, 3) similarity knows every class
    validation = gold < 2  # validation is drawn from train: no question of the added class
    shift = prior.fit(scores[validation], gold[validation], log_pi, temperature=0.1, weights=[1.5])  # a strong shift
    assert (shift.apply(scores).argmax(axis=1)[gold == 2] == 2).mean() > 0.9  # at 1/(N+C): 0.35


def ambiguous_validation() -> tuple[np.ndarray, np.ndarray]:
    """Ten questions: eight common, two rare. The rare ones score clearly rare; six common ones lean
    slightly rare (similarity alone gets them wrong), two are clearly common."""
    scores = np.array([[0.50, 0.52]] * 6 + [[0.9, 0.1]] * 2 + [[0.1, 0.9]] * 2)  # (10, 2)
    gold = np.array([0] * 8 + [1] * 2)
    return scores, gold


def test_fit_keeps_the_most_likely_weight_and_the_prior_settles_near_ties(caplog):
    scores, gold = ambiguous_validation()
    log_pi = np.log([0.8, 0.2])
    weights = [0.0, 0.5, 1.0, 2.0]
    with caplog.at_level("WARNING", logger="tqc.prior"):
        shift = prior.fit(scores, gold, log_pi, temperature=0.1, weights=weights)
    assert "prior: λ = 2, the edge of prior.weights (0 to 2): the validation likelihood may be higher" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tqc.prior"):  # the likelihood is highest at 3 of a grid reaching 8
        assert prior.fit(scores, gold, log_pi, temperature=0.1, weights=weights + [3.0, 4.0, 8.0]).weight == 3.0
        assert prior.fit(scores, gold, log_pi, temperature=0.1, weights=[2.0]).weight == 2.0  # a λ fixed on purpose
    assert "edge of prior.weights" not in caplog.text

    nll = {w: prior.gold_nll((scores + 0.1 * w * log_pi) / 0.1, gold) for w in weights}
    assert shift.weight == min(weights, key=nll.get) > 0.0
    assert {w: v["nll"] for w, v in shift.validation_by_weight.items()} == pytest.approx({f"{w:g}": v for w, v in nll.items()})
    assert shift.shift == pytest.approx(0.1 * shift.weight * log_pi)
    assert shift.apply(scores).argmax(axis=1).tolist() == gold.tolist()  # the six near-ties go to the common class
    assert shift.validation_by_weight["0"]["macro_f1"] < shift.validation_by_weight[f"{shift.weight:g}"]["macro_f1"] == 1.0


def test_gold_nll_is_cross_entropy():
    import torch

    logits = np.random.default_rng(0).normal(size=(7, 4)) * 20  # large logits: the log-sum-exp must stay finite
    gold = np.array([0, 1, 2, 3, 0, 1, 2])
    expected = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(gold)).item()
    assert prior.gold_nll(logits, gold) == pytest.approx(expected)


def test_fit_keeps_no_shift_when_the_prior_is_flat_or_hurts():
    scores, gold = ambiguous_validation()
    flat = prior.fit(scores, gold, np.log([0.5, 0.5]), 0.1, [1.0, 0.0, 0.5])
    assert flat.weight == 0.0 and np.all(flat.shift == 0)  # every λ ties: the smallest shift is kept
    # A prior that favours the wrong class only makes the gold classes less likely: λ stays 0.
    clear = np.array([[0.9, 0.1]] * 8 + [[0.3, 0.7]] * 2)
    assert prior.fit(clear, gold, np.log([0.01, 0.99]), 0.1, [0.0, 1.0]).weight == 0.0


def test_the_prior_file_round_trips_names_its_models_and_refuses_another_catalog(tmp_path, monkeypatch):
    scores, gold = ambiguous_validation()
    fitted = prior.fit(scores, gold, np.log([0.8, 0.2]), 0.1, [0.0, 0.5])
    path = tmp_path / "models" / "prior.json"
    write_json(path, {"weights": [0.0, 0.5], "models": {"admc": {"model": "stage_two", **fitted.to_json(CLASSES)}}})
    monkeypatch.chdir(tmp_path)  # not the file's folder: its entries are relative to the file, not to here

    loaded = prior.load_for(path, tmp_path / "models" / "stage_two", list(reversed(CLASSES)))
    assert loaded.weight == 0.5 and loaded.shift == pytest.approx(fitted.shift[::-1])  # the catalog's order decides
    assert prior.entry_for(path, tmp_path / "models" / "stage_one") is None
    with pytest.raises(ValueError, match="prior.json: none of its entries was fitted for .*stage_one"):
        prior.load_for(path, tmp_path / "models" / "stage_one", CLASSES)
    with pytest.raises(ValueError, match=r"prior.json, entry 'admc': fitted on another catalog \(no shift for \['new'\]"):
        prior.load_for(path, tmp_path / "models" / "stage_two", CLASSES + ["new"])
    with pytest.raises(ValueError, match=r"shifts for classes the catalog lacks: \['rare'\]"):
        prior.load_for(path, tmp_path / "models" / "stage_two", ["common"])


@pytest.mark.parametrize("key, value, said", [
    ("rare", None, "the shift of class 'rare' is None"),  # NaN scores blamed the model's weights: "train it again"
    ("rare", float("nan"), "the shift of class 'rare' is nan"),
    ("rare", "oops", "the shift of class 'rare' is 'oops'"),  # float()'s "could not convert string", no file named
    ("rare", True, "the shift of class 'rare' is True"),
    ("temperature", float("inf"), "temperature is inf"),
])
def test_a_prior_entry_with_a_value_that_is_no_finite_number_is_named_by_file_entry_and_class(tmp_path, key, value, said):
    scores, gold = ambiguous_validation()
    entry = {"model": "stage_two", **prior.fit(scores, gold, np.log([0.8, 0.2]), 0.1, [0.0, 0.5]).to_json(CLASSES)}
    if key == "temperature":
        entry["temperature"] = value
    else:
        entry["shift"][key] = value
    path = tmp_path / "models" / "prior.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"weights": [0.0, 0.5], "models": {"admc": entry}}))  # NaN and Infinity as json writes them
    with pytest.raises(prior.PriorFileError, match=rf"prior.json, entry 'admc': {re.escape(said)}, not a finite number "
                                                   r"\(1 such value\(s\)\); run the prior stage again"):
        prior.load_for(path, tmp_path / "models" / "stage_two", CLASSES)


def test_an_entry_fitted_for_other_weights_is_refused_and_one_without_a_digest_is_taken(tmp_path):
    from safetensors.numpy import save_file

    models = tmp_path / "models"
    (models / "stage_two" / "question_encoder").mkdir(parents=True)
    weights = models / "stage_two" / "question_encoder" / "model.safetensors"
    save_file({"w": np.zeros(3, dtype=np.float32)}, weights)
    (models / "stage_two" / "tqc_model.json").write_text("{}", encoding="utf-8")
    fitted = prior.fit(*ambiguous_validation(), np.log([0.8, 0.2]), 0.1, [0.0, 0.5]).to_json(CLASSES)
    entry = {"model": "stage_two", "weights_digest": prior.weights_digest(models / "stage_two"), **fitted}
    write_json(models / "prior.json", {"models": {"admc": entry}})
    write_json(models / "older.json", {"models": {"admc": {"model": "stage_two", **fitted}}})  # before the digest

    (models / "stage_two" / "tqc_model.json").write_text('{"trained": "again"}', encoding="utf-8")
    assert prior.entry_for(models / "prior.json", models / "stage_two") == "admc"  # only the weights count
    save_file({"w": np.ones(3, dtype=np.float32)}, weights)  # trained again
    with pytest.raises(prior.StaleEntry, match=r"prior.json: its entry 'admc' was fitted for earlier weights in .*stage_two"):
        prior.load_for(models / "prior.json", models / "stage_two", CLASSES)
    assert prior.load_for(models / "older.json", models / "stage_two", CLASSES).weight == fitted["weight"]


def test_the_weights_check_reads_linked_sub_folders_and_leaves_a_folder_without_weights_to_its_loader(tmp_path):
    from safetensors.numpy import save_file

    models, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    (models / "stage_two" / "question_encoder").mkdir(parents=True)
    elsewhere.mkdir()
    save_file({"w": np.zeros(3, dtype=np.float32)}, models / "stage_two" / "question_encoder" / "model.safetensors")
    save_file({"w": np.zeros(3, dtype=np.float32)}, elsewhere / "model.safetensors")
    (models / "stage_two" / "standard_encoder").symlink_to(elsewhere, target_is_directory=True)
    fitted = prior.fit(*ambiguous_validation(), np.log([0.8, 0.2]), 0.1, [0.0, 0.5]).to_json(CLASSES)
    write_json(models / "prior.json", {"models": {"admc": {"model": "stage_two", **fitted,
                                                           "weights_digest": prior.weights_digest(models / "stage_two")}}})

    save_file({"w": np.ones(3, dtype=np.float32)}, elsewhere / "model.safetensors")  # the linked encoder trained again
    with pytest.raises(prior.StaleEntry, match="was fitted for earlier weights"):
        prior.entry_for(models / "prior.json", models / "stage_two")
    for path in sorted((models / "stage_two").rglob("*"), reverse=True):
        path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
    # gone (a stage re-running, a folder deleted): not "trained again"; loading it says what is wrong
    assert prior.entry_for(models / "prior.json", models / "stage_two") == "admc"


def test_a_file_that_is_not_a_prior_stages_says_so(tmp_path):
    write_json(tmp_path / "other.json", {"test": {}})
    with pytest.raises(ValueError, match=r"other.json: not a prior stage's file"):
        prior.entry_for(tmp_path / "other.json", tmp_path / "stage_two")
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken.json: not a prior stage's file"):
        prior.read_file(tmp_path / "broken.json")
    write_json(tmp_path / "partial.json", {"models": {"admc": {"model": "stage_two", "weight": 1.0}}})
    with pytest.raises(ValueError, match=r"partial.json: entry 'admc' lacks \['temperature', 'shift'\]"):
        prior.read_file(tmp_path / "partial.json")
    whole = {"model": "stage_two", "weight": 1.0, "temperature": 0.1, "shift": {"a": 0.0}}
    for key, value, said in (("shift", None, "shift is NoneType, not dict"), ("model", None, "model is NoneType, not str"),
                             ("validation_by_weight", [1], "validation_by_weight is list, not dict")):
        write_json(tmp_path / "edited.json", {"models": {"admc": {**whole, key: value}}})  # a TypeError, naming nothing
        with pytest.raises(ValueError, match=rf"^{tmp_path / 'edited.json'}: entry 'admc': {said}$"):
            prior.read_file(tmp_path / "edited.json")
    (tmp_path / "bom.json").write_text("\ufeff" + json.dumps({"models": {"admc": whole}}), encoding="utf-8")
    assert prior.read_file(tmp_path / "bom.json") == {"admc": whole}  # saved by a Windows editor


def test_the_shift_keeps_the_scores_dtype():
    shift = prior.PriorShift(1.0, 0.1, np.array([0.1, 0.2]), {})
    assert shift.apply(np.zeros((3, 2), dtype=np.float32)).dtype == np.float32  # as serving adds it


def test_weights_must_be_finite():
    from tqc.config import ConfigError, Params

    with pytest.raises(ConfigError, match=r"prior.weights.1: Input should be a finite number"):  # every float param alike
        Params().with_overrides({"prior": {"weights": [0.0, float("nan")]}})


def test_the_uniform_target_undoes_a_lean_toward_the_common_class_for_macro_f1():
    """Eight common questions score common, six of them by a little; the two rare ones lean common too
    (the scores carry the training mix). Over questions, a shift toward the common class is most
    likely; over classes, a shift away from it (negative λ) wins the rare questions without losing
    the common ones, and macro-F1 follows."""
    scores = np.array([[0.58, 0.50]] * 6 + [[0.9, 0.1]] * 2 + [[0.53, 0.50]] * 2)  # (10, 2)
    gold = np.array([0] * 8 + [1] * 2)
    log_pi = np.log([0.8, 0.2])
    weights = [-1.0, -0.5, 0.0, 0.5, 1.0]

    labeled = prior.fit(scores, gold, log_pi, 0.1, weights, target="labeled")
    uniform = prior.fit(scores, gold, log_pi, 0.1, weights, target="uniform")
    assert labeled.weight > 0.0 and labeled.target == "labeled"
    assert uniform.weight < 0.0 and uniform.target == "uniform"
    balanced = {w: prior.gold_nll((scores + 0.1 * w * log_pi) / 0.1, gold, np.array([1 / 8] * 8 + [1 / 2] * 2)) for w in weights}
    assert uniform.weight == min(weights, key=balanced.get)
    assert uniform.apply(scores).argmax(axis=1).tolist() == gold.tolist()
    assert uniform.validation_by_weight[f"{uniform.weight:g}"]["macro_f1"] == 1.0 > labeled.validation_by_weight[f"{labeled.weight:g}"]["macro_f1"]


def test_class_balanced_weights_give_each_class_the_same_total():
    gold = np.array([2, 0, 0, 0, 2, 1])
    weights = prior.class_balanced_weights(gold)
    assert weights.tolist() == pytest.approx([1 / 2, 1 / 3, 1 / 3, 1 / 3, 1 / 2, 1.0])
    assert [weights[gold == c].sum() for c in (0, 1, 2)] == pytest.approx([1.0, 1.0, 1.0])


def test_an_unknown_target_is_refused():
    scores, gold = ambiguous_validation()
    with pytest.raises(ValueError, match="unknown prior target 'traffic'"):
        prior.fit(scores, gold, np.log([0.8, 0.2]), 0.1, [0.0], target="traffic")


def test_the_prior_stage_fits_each_model_for_the_target_mix_and_writes_it(tmp_path, monkeypatch):
    from tqc.config import Params
    from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, save_questions
    from tqc.stages import prior as prior_stage

    data = tmp_path / "validated"
    data.mkdir()
    Catalog([StandardQuestion(c, f"a {c} question?") for c in CLASSES]).save(data / "catalog.jsonl")
    save_questions(data / "train.jsonl", [LabeledQuestion(f"train {i}", "common") for i in range(8)]
                   + [LabeledQuestion(f"train rare {i}", "rare") for i in range(2)])  # π = (0.8, 0.2), add-one: 9/12, 3/12
    gold = ["common"] * 8 + ["rare"] * 2
    save_questions(data / "validation.jsonl", [LabeledQuestion(f"validation {i}", c) for i, c in enumerate(gold)])
    scores = np.array([[0.58, 0.50]] * 6 + [[0.9, 0.1]] * 2 + [[0.53, 0.50]] * 2)  # (10, 2): leaning to the common class
    def validation_scores(questions, catalog):  # λ is fitted on validation's questions, never on training's
        assert [q.text for q in questions] == [f"validation {i}" for i in range(len(gold))]
        return scores

    monkeypatch.setattr(prior_stage, "trained_scorers", lambda *args: {"admc": validation_scores, "stage_one": validation_scores})
    models = tmp_path / "models"
    params = Params().with_overrides({"prior": {"target": "uniform", "weights": [-1.0, -0.5, 0.0, 0.5, 1.0]}})

    document = prior_stage.run(data, models / "stage_one", models / "stage_two", None, params, models / "prior.json")
    assert document["target"] == "uniform" and set(document["models"]) == {"admc", "stage_one"}  # no NC: none for it
    assert document["models"]["admc"]["model"] == "stage_two" and document["models"]["admc"]["target"] == "uniform"
    assert document["models"]["admc"]["weights_digest"] == prior.weights_digest(models / "stage_two")
    loaded = prior.load_for(models / "prior.json", models / "stage_two", CLASSES)
    assert loaded.weight < 0.0 and loaded.target == "uniform"
    assert loaded.shift == pytest.approx(params.stage_two.temperature * loaded.weight * np.log([9 / 12, 3 / 12]))


def test_ties_keep_the_smaller_then_the_positive_weight_and_an_empty_split_is_refused():
    scores, gold = ambiguous_validation()
    flat = np.log([0.5, 0.5])  # every λ ties
    assert prior.fit(scores, gold, flat, 0.1, [-0.5, 0.5, -1.0]).weight == 0.5
    with pytest.raises(ValueError, match="no validation questions"):
        prior.fit(np.zeros((0, 2)), np.zeros(0, dtype=int), flat, 0.1, [0.0])


def test_a_model_trained_without_a_temperature_gets_its_scale_fitted_on_validation():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4000, 5)) * 2.0  # (N, C) the true logits
    gold = np.array([rng.choice(5, p=np.exp(row) / np.exp(row).sum()) for row in logits])  # drawn from softmax(logits)
    scores = logits * 0.05  # a scorer whose logits are scores / 0.05, which training never said
    assert prior.fit_temperature(scores, gold) == pytest.approx(0.05, rel=0.15)
    shift = prior.fit(scores, gold, np.log(np.full(5, 0.2)), temperature=None, weights=[0.0, 1.0])
    assert shift.temperature == pytest.approx(0.05, rel=0.15)
    # Raw inner products run orders of magnitude larger than cosines: the grid follows the scores' spread.
    assert prior.fit_temperature(scores * 2000, gold) == pytest.approx(100.0, rel=0.15)


def test_a_temperature_at_the_grids_edge_is_logged(caplog):
    scores, gold = np.array([[1.0, 0.0], [0.0, 1.0]] * 5), np.array([0, 1] * 5)  # separable: the likelihood wants τ → 0
    with caplog.at_level("WARNING", logger="tqc.prior"):
        fitted = prior.fit_temperature(scores, gold)
    assert fitted == pytest.approx(np.std(scores) * 1e-3) and "edge of the temperature grid" in caplog.text


def test_a_temperature_at_the_grids_upper_edge_is_logged_too(caplog):
    """Validation whose gold classes score lowest wants τ → ∞ (the flattest softmax): the grid's other edge, just as
    uncertain a scale as τ → 0, and said alike."""
    scores, gold = np.array([[1.0, 0.0], [0.0, 1.0]] * 5), np.array([1, 0] * 5)
    with caplog.at_level("WARNING", logger="tqc.prior"):
        fitted = prior.fit_temperature(scores, gold)
    assert fitted == pytest.approx(np.std(scores) * 100) and "edge of the temperature grid" in caplog.text


def test_validation_scores_without_spread_get_a_finite_positive_temperature():
    """Scores all alike (a collapsed model) give the grid no spread to scale by: it takes unit spread instead. At a
    spread of 0 every candidate τ was 0, τ came back 0, and the λ fit divided the scores by it (NaN likelihoods)."""
    scores, gold = np.full((6, 3), 0.5), np.array([0, 1, 2, 0, 1, 2])  # 0.5: exact in binary, so the spread is 0
    tau = prior.fit_temperature(scores, gold)
    assert np.isfinite(tau) and tau > 0
    shift = prior.fit(scores, gold, np.log([0.5, 0.3, 0.2]), temperature=None, weights=[0.0, 1.0])
    assert shift.temperature == tau and np.isfinite(shift.shift).all()
    assert all(np.isfinite(figures["nll"]) for figures in shift.validation_by_weight.values())


def test_no_shift_at_the_edge_of_the_weights_is_not_a_reason_to_widen_them(caplog):
    """λ = 0 at the low end of prior.weights (0 to 2, the usual grid) says the prior does not help; the warning to
    widen the grid is for a shift that might help more beyond its edge, not for none."""
    gold = np.array([0] * 8 + [1] * 2)
    clear = np.array([[0.9, 0.1]] * 8 + [[0.3, 0.7]] * 2)
    with caplog.at_level("WARNING", logger="tqc.prior"):
        assert prior.fit(clear, gold, np.log([0.01, 0.99]), 0.1, [0.0, 1.0, 2.0]).weight == 0.0
    assert "edge of prior.weights" not in caplog.text


def test_a_prior_with_no_training_row_at_all_is_uniform():
    """No class has a row (the rule's "mean of the classes with rows" has none to take): add-one smoothing alone
    gives every class the same prior, not a NaN from the mean of nothing."""
    assert np.exp(prior.log_prior([], CLASSES)) == pytest.approx([0.5, 0.5])


def test_the_runs_models_leave_out_an_nc_baseline_that_is_disabled_or_absent(tmp_path):
    """baseline_nc.enabled false still writes its folder, holding only the disabled marker: prior and evaluate must
    not try to load a linear classifier from it (nor fit a shift for one)."""
    from tqc.scoring import trained_folders
    from tqc.stages.baseline_nc import DISABLED_MARKER

    one, two, nc = tmp_path / "stage_one", tmp_path / "stage_two", tmp_path / "nc"
    nc.mkdir()
    assert trained_folders(one, two, nc) == {"admc": two, "stage_one": one, "nc": nc}
    (nc / DISABLED_MARKER).write_text("{}\n")
    assert trained_folders(one, two, nc) == {"admc": two, "stage_one": one}
    assert trained_folders(one, two, None) == {"admc": two, "stage_one": one}


def test_hinge_trained_models_have_no_training_temperature_to_reuse():
    from tqc.config import Params
    from tqc.scoring import logit_temperatures

    params = Params.model_validate({"stage_one": {"temperature": 0.07}, "stage_two": {"loss": "hinge", "temperature": 0.2}})
    assert logit_temperatures(params) == {"admc": None, "stage_one": 0.07, "nc": 1.0}


@pytest.mark.parametrize("best_epoch, admc", [(0, 0.07), (1, 0.2)])
def test_admc_scores_at_stage_ones_temperature_where_stage_two_kept_stage_ones_weights(tmp_path, best_epoch, admc):
    """Stage two's early stopping may keep its starting weights (epoch 0), trained at stage one's τ; tuning draws the
    two τ apart, and the prior's λ was chosen on scores scaled by the τ those weights never trained at."""
    import json

    from tqc.config import Params
    from tqc.scoring import logit_temperatures

    (tmp_path / "tqc_model.json").write_text(json.dumps({"tied": False, "similarity": "cosine", "best_epoch": best_epoch}))
    params = Params.model_validate({"stage_one": {"temperature": 0.07}, "stage_two": {"temperature": 0.2}})
    assert logit_temperatures(params, tmp_path)["admc"] == admc


def test_the_trained_models_are_scored_on_the_device_they_trained_on(tiny_model_dir, tmp_path, monkeypatch):
    """prior and evaluate score where training validated (a GPU under bf16 autocast, where there is one): on the
    CPU in float32 the validation figure in metrics.json would not be the one the checkpoint was kept by."""
    import torch

    from tqc import scoring
    from tqc.config import ModelParams
    from tqc.model.encoder import BiEncoder

    for stage in ("stage_one", "stage_two"):
        BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir))).save(tmp_path / stage)
    monkeypatch.setattr(scoring, "pick_device", lambda: torch.device("meta"))  # a device no load lands on by itself
    models = scoring.trained_models(tmp_path / "stage_one", tmp_path / "stage_two", None)
    assert set(models) == {"stage_one", "admc"}
    assert {p.device.type for model in models.values() for p in model.parameters()} == {"meta"}


def test_the_weights_digest_changes_when_two_encoders_swap_weights(tmp_path):
    """The digest covers each file's path with its bytes: the question and standard encoders' weights exchanged are
    other weights."""
    for name, data in (("question", b"Q"), ("standard", b"S")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(data)
    before = prior.weights_digest(tmp_path)
    (tmp_path / "question" / "model.safetensors").write_bytes(b"S")
    (tmp_path / "standard" / "model.safetensors").write_bytes(b"Q")
    assert prior.weights_digest(tmp_path) != before


def test_each_models_temperature_is_the_one_its_record_says_it_trained_at(tmp_path):
    """`tqc prior` on models trained before params.yaml's τ or loss changed scaled their scores by the current τ,
    one they never trained at. A model's tqc_model.json keeps its stage's params: its τ and loss are read there, and
    the params' only where a folder keeps none."""
    import json

    from tqc.config import Params
    from tqc.scoring import logit_temperatures

    def folder(name: str, record: dict) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "tqc_model.json").write_text(json.dumps({"tied": False, "similarity": "cosine", **record}))
        return tmp_path / name

    params = Params.model_validate({"stage_one": {"temperature": 0.07}, "stage_two": {"temperature": 0.2}})
    one = folder("one", {"best_epoch": 3, "params": {"loss": "nt_xent", "temperature": 0.05}})
    two = folder("two", {"best_epoch": 2, "params": {"loss": "nt_xent", "temperature": 0.3}})
    assert logit_temperatures(params, two, one) == {"admc": 0.3, "stage_one": 0.05, "nc": 1.0}
    hinge = folder("hinge", {"best_epoch": 1, "params": {"loss": "hinge", "temperature": 0.3}})
    assert logit_temperatures(params, hinge, one)["admc"] is None  # params say nt_xent: the record says hinge
    kept = folder("kept", {"best_epoch": 0, "params": {"loss": "nt_xent", "temperature": 0.3}})
    assert logit_temperatures(params, kept, one)["admc"] == 0.05  # stage one's weights, at stage one's own τ
    bare = folder("bare", {"best_epoch": 2})  # a record without params: the params' τ
    assert logit_temperatures(params, bare, bare) == {"admc": 0.2, "stage_one": 0.07, "nc": 1.0}


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_diverged_models_scores_are_refused_by_name_not_fitted_into_nan_likelihoods(bad):
    """fit took its macro-F1 from `summary`, whose check refused them; recording macro-F1 alone, it wrote a prior.json
    of NaN likelihoods, and the failure came later, in evaluate or in the retrain flow's judging."""
    from tqc.metrics import DivergedScores

    scores = np.random.default_rng(0).normal(size=(8, 4))
    scores[2, 1] = bad
    with pytest.raises(DivergedScores, match=r"1 row\(s\) \(first: \[2\]\)"):
        prior.fit(scores, np.arange(8) % 4, np.log(np.full(4, 0.25)), temperature=0.1, weights=[0.0, 0.5])
    scores[2, 1] = -np.inf  # a score, which ranks last: fitted
    assert prior.fit(scores, np.arange(8) % 4, np.log(np.full(4, 0.25)), temperature=0.1, weights=[0.0, 0.5]).weight == 0.0
