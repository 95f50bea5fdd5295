"""Evaluate: ADMC (stage two) against its baselines on the test split, plus plots.

Baselines: zero-shot (the pretrained encoder, no training), AC (stage one alone) and NC
(encoder + linear head). Beside them, `exemplars`: ADMC's question encoder deciding by each
class's nearest labeled training questions instead of its standard question. Each trained
model is scored with the class-prior shift the prior stage fitted for it on validation
(metrics.json also keeps its figures without it).
Nothing here chooses anything: validation is reported beside test.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
import time
import unicodedata
from pathlib import Path

import numpy as np

from tqc import prior
from tqc.config import STAGE_PARAMS, Params, selected
from tqc.device import pick_device
from tqc.exemplars import exemplar_scorer
from tqc.io import atomic_path, write_json, write_jsonl
from tqc.metrics import DivergedScores, confused_pairs, per_class_prf, seed_std, summary
from tqc.model.encoder import BiEncoder, LastEncodings, TextEncoder, catalog_scores
from tqc.pipeline import ChainOutputs, train_chain
from tqc.prior import PriorShift
from tqc.schema import Catalog, LabeledQuestion, gold_indices, load_questions, save_questions
from tqc.scoring import Scorer, scorer_for, trained_folders, trained_models
from tqc.stages import augment
from tqc.stages import prior as prior_stage
from tqc.stages.ingest import stratified_split
from tqc.text import compared_text
from tqc.tracking import CODE, git_commit
from tqc.warn_once import each_warning_once

log = logging.getLogger(__name__)

MODELS = ("admc", "stage_one", "nc", "zero_shot", "exemplars")


def load_models(models: ChainOutputs, params: Params, exemplars: list[LabeledQuestion] | None = None) -> dict[str, Scorer]:
    """Every evaluated model as a scorer: the run's trained ones, the pretrained encoder untrained, and
    ADMC's encoder by its nearest `exemplars` (the labeled training rows) where given and `exemplar_k` > 0."""
    zero_shot = BiEncoder(TextEncoder.from_pretrained(params.model.pretrained, params.model.pooling, params.model.max_length),
                          None, params.model.similarity).to(pick_device())
    trained = trained_models(models.stage_one, models.stage_two, models.nc)
    scorers = {name: scorer_for(model, params.evaluate.batch_size) for name, model in trained.items()}
    scorers["zero_shot"] = lambda qs, c: catalog_scores(zero_shot, qs, c, params.evaluate.batch_size)
    if exemplars and params.evaluate.exemplar_k > 0:  # ADMC's own question encoder, not a second copy ...
        admc, admc_questions = trained["admc"], LastEncodings(trained["admc"].question)  # ... whose encodings both reuse
        scorers["admc"] = lambda qs, c: catalog_scores(admc, qs, c, params.evaluate.batch_size, admc_questions)
        scorers["exemplars"] = exemplar_scorer(admc_questions, exemplars, params.evaluate.exemplar_k,
                                               params.evaluate.batch_size)
    return {name: scorers[name] for name in MODELS if name in scorers}


def evaluate_models(models: ChainOutputs, params: Params, splits: dict[str, list[LabeledQuestion]], catalog: Catalog,
                    shifts: dict[str, PriorShift], exemplars: list[LabeledQuestion] | None = None) -> dict:
    """{model: {split: metrics}}, the scores (N, P) per split and model with and without the shift,
    and each shifted model's metrics without it. A model in `shifts` is scored with its class-prior shift
    applied (the zero-shot encoder has none: it learned nothing from the labeled rows, and the exemplar
    rule none either: no shift was fitted for it)."""
    scorers = load_models(models, params, exemplars)
    results: dict[str, dict] = {name: {} for name in scorers}
    unshifted: dict[str, dict] = {}
    scores_by_split, raw_by_split = {}, {}
    for split, questions in splits.items():
        gold = gold_indices(questions, catalog)
        raw = raw_by_split[split] = {name: scorer(questions, catalog) for name, scorer in scorers.items()}
        scores_by_split[split] = {name: shifts[name].apply(s) if name in shifts else s for name, s in raw.items()}
        for name, scores in scores_by_split[split].items():
            try:
                results[name][split] = summary(scores, gold)
            except DivergedScores as exc:
                raise DivergedScores(f"{name} on {split}: {exc}") from None
            if name in shifts:
                unshifted.setdefault(name, {})[split] = summary(raw[name], gold)
    return {"metrics": results, "scores": scores_by_split, "raw_scores": raw_by_split, "unshifted": unshifted}


def seed_statistics(per_seed: list[dict], resplit: bool) -> dict:
    """Mean ± sample std over seeds of every model's test figures (`summary`'s, but its count, and a Hits@k that is
    null, k reaching the class count); `std_ddof` says which std."""
    # std_ddof: seed_std's ddof, named here rather than in metrics.py, which every training stage depends on
    # (tests/code/test_metrics.py holds the two together)
    stats = {"n": len(per_seed), "resplit": resplit, "std_ddof": 1}
    for name in (name for name in MODELS if name in per_seed[0]):
        stats[name] = {}
        for metric, first in per_seed[0][name]["test"].items():
            if metric == "n" or first is None:
                continue
            values = [run[name]["test"][metric] for run in per_seed]
            stats[name][metric] = {"mean": float(np.mean(values)), "std": seed_std(values), "values": values}
    return stats


def run(data_dir: Path, models: ChainOutputs, prior_path: Path, params: Params, metrics_path: Path,
        classes_path: Path, plots_dir: Path, predictions_path: Path) -> dict:
    started = time.perf_counter()
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    splits = {"test": load_questions(data_dir / "test.jsonl"), "validation": load_questions(data_dir / "validation.jsonl")}
    shifts = {name: prior.load_for(prior_path, folder, catalog.class_ids)
              for name, folder in trained_folders(models.stage_one, models.stage_two, models.nc).items()}
    # The labeled training rows as they were validated: no rebalancing copies or generated rows
    evaluated = evaluate_models(models, params, splits, catalog, shifts, load_questions(data_dir / "train.jsonl"))
    per_seed = [evaluated["metrics"]] + _extra_seeds(params, data_dir, splits, catalog)

    metrics = metrics_document(params, evaluated, shifts, seed_statistics(per_seed, params.evaluate.resplit))
    write_json(metrics_path, metrics)
    test_scores = evaluated["scores"]["test"]
    write_json(classes_path, {name: _class_report(scores, splits["test"], catalog, params.evaluate.confused_pairs)
                              for name, scores in test_scores.items()})  # every model, as metrics.json has them
    _write_predictions(predictions_path, test_scores["admc"], splits["test"], catalog, params.evaluate.top_k)
    _write_confusion(plots_dir / "confusion.csv", test_scores["admc"], splits["test"], catalog)
    # Figure 3 shows similarities: the scores before any class-prior shift
    _write_similarity_profile(plots_dir, evaluated["raw_scores"]["test"], splits["test"], catalog, params)
    nc = f"{metrics['nc']['test']['macro_f1']:.4f}" if metrics["nc"] else "not trained"  # baseline_nc.enabled: false
    log.info("evaluate: test accuracy %.4f macro-F1 %.4f (AC %.4f, NC %s, zero-shot %.4f); wrote %s, %s, %s (%.1fs)",
             metrics["test"]["accuracy"], metrics["test"]["macro_f1"], metrics["stage_one"]["test"]["macro_f1"],
             nc, metrics["zero_shot"]["test"]["macro_f1"], metrics_path, classes_path, plots_dir,
             time.perf_counter() - started)
    log.info("evaluate: %s", rule_on_validation(metrics))
    return metrics


def rule_on_validation(metrics: dict) -> str:
    """Which rule validation prefers, by the promotion gate's figure (accuracy, each rule as it would be
    served: ADMC with its shift, the exemplar rule without one), and the key that serves it. All of validation:
    promote.rule auto chooses on the part of it a standing champion did not learn from (tqc.stages.promote)."""
    exemplars = metrics.get("exemplars")
    if not exemplars:
        return "the exemplar rule was not scored (evaluate.exemplar_k: 0)"
    # Validation chose ADMC's checkpoint and fitted its shift, and the exemplar rule shares only the checkpoint,
    # so this comparison leans toward the standard rule: a preference for the exemplar rule is the firmer one.
    standard, nearest = metrics["validation"]["accuracy"], exemplars["validation"]["accuracy"]
    if nearest > standard:
        return (f"validation prefers the exemplar rule (accuracy {nearest:.4f} against the standard questions' "
                f"{standard:.4f}): promote.rule: exemplars would serve it, if it passes the gate (auto chooses on "
                "the validation questions the champion did not learn from, which may prefer the other)")
    return (f"validation keeps the standard-question rule (accuracy {standard:.4f}, the exemplar rule "
            f"{nearest:.4f}): promote.rule: standard")


def _extra_seeds(params: Params, data_dir: Path, splits, catalog) -> list[dict]:
    """Seeds 2..N: the whole training chain again, through the same stage functions.

    Every seed is scored on the same test split. With `evaluate.resplit` each seed also draws
    its own validation split (and so its own training rows and early stopping), so the spread
    includes the split's share of the variance, which dominates on small datasets.
    """
    runs = []
    with each_warning_once():  # every seed trains on the same catalog: its warnings are said once, not at every seed
        for offset in range(1, params.evaluate.seeds):
            runs.append(_extra_seed(params, data_dir, splits, catalog, offset))
    return runs


def _extra_seed(params: Params, data_dir: Path, splits, catalog, offset: int) -> dict:
    """Seed `offset` + 1 of evaluate.seeds: the chain trained and scored in a folder of its own → its figures."""
    seed = params.seed + offset
    log.info("evaluate: full training %d/%d with seed %d%s", offset + 1, params.evaluate.seeds, seed,
             " on its own validation split" if params.evaluate.resplit else "")
    try:
        with tempfile.TemporaryDirectory(prefix=f"tqc-seed{seed}-") as work:
            seed_dir, seed_splits = data_dir, splits
            if params.evaluate.resplit:  # its own validation split; test stays the one every seed is scored on
                seed_dir = resplit(params, data_dir, seed, Path(work) / "data")
                seed_splits = {**splits, "validation": load_questions(seed_dir / "validation.jsonl")}
            seed_train = augmented_again(params, seed_dir, data_dir, seed, Path(work))  # its own copies or rewrites
            outputs = train_chain(params, seed_dir, seed_train, Path(work), seed)
            return score_chain(outputs, params, seed_dir, seed_splits, catalog)[0]["metrics"]
    except DivergedScores as exc:  # NaN vectors in mining, NaN scores in the prior fit or here: the seed said in
        # the error itself, whose line a CI log shows without the log line above
        raise DivergedScores(f"full training {offset + 1}/{params.evaluate.seeds} with seed {seed}: {exc}") from None


def score_chain(outputs: ChainOutputs, params: Params, data_dir: Path, splits: dict[str, list[LabeledQuestion]],
                catalog: Catalog) -> tuple[dict, dict[str, PriorShift]]:
    """A freshly trained chain as the prior and evaluate stages score it: each model's class-prior shift fitted
    on `data_dir`'s validation rows, then `evaluate_models` with `data_dir`'s training rows as exemplars."""
    shifts = prior_stage.fit_shifts(data_dir, outputs.stage_one, outputs.stage_two, outputs.nc, params)
    return evaluate_models(outputs, params, splits, catalog, shifts, load_questions(data_dir / "train.jsonl")), shifts


def resplit(params: Params, data_dir: Path, seed: int, out_dir: Path) -> Path:
    """The validated train ∪ validation rows split again with `seed` (ingest's stratified split) → the data folder,
    with the catalog and test as they were.
    Held out from the draw as ingest holds them: the catalog's standard questions, compared as ingest compares them
    (validated train holds no test question, which validate quarantines). The retrain flow's added rows, which
    ingest splits by their text alone so a delivery never moves an earlier row, are drawn with the rest here: each
    seed's split is meant to differ."""
    rows = load_questions(data_dir / "train.jsonl") + load_questions(data_dir / "validation.jsonl")
    standard_questions = frozenset(compared_text(text) for text in Catalog.load(data_dir / "catalog.jsonl").texts)
    train, validation = stratified_split(rows, params.data.validation_fraction, seed, standard_questions)
    out_dir.mkdir(parents=True)
    # test too, unchanged: the warm-up keeps its questions out of the pool (it failed to find the file)
    for unchanged in ("catalog.jsonl", "test.jsonl"):
        shutil.copyfile(data_dir / unchanged, out_dir / unchanged)
    save_questions(out_dir / "train.jsonl", train)
    save_questions(out_dir / "validation.jsonl", validation)
    return out_dir


def augmented_again(params: Params, seed_dir: Path, data_dir: Path, seed: int, out_dir: Path) -> Path:
    """`seed_dir`'s training rows augmented with `seed` (the augment stage's run) → the training rows' file, so each
    seed's spread holds the augmentation's draws too (the copies rebalancing picks, EDA's edits, sampled rewrites)."""
    augment.run(seed_dir / "train.jsonl", params.augment, seed, out_dir / "augmented.jsonl", out_dir / "augment.json",
                data_dir / "generated.jsonl",  # offline rows are used only where all their origins are in this train
                [path for path in (seed_dir / "validation.jsonl", data_dir / "test.jsonl") if path.exists()],
                data_dir / "catalog.jsonl")
    return out_dir / "augmented.jsonl"


UNSHIFTED_FIGURES = ("accuracy", "macro_f1", "macro_f1_gold_classes")
# The params evaluate's DVC stage declares (tests/code/test_dvc_yaml.py holds the two together): a change to any of
# them runs evaluate again, so its record in metrics.json is never stale. The others (validate's thresholds, data's
# paths and columns) shape the validated data, whose hash dvc.lock records; recorded here, a change that left the data
# as it was would leave their values stale.
RECORDED_PARAMS = STAGE_PARAMS["evaluate"]


def recorded_params(params: Params) -> dict:
    """`RECORDED_PARAMS` of `params`, nested as params.yaml nests them, in its order."""
    return selected(params.to_dict(), RECORDED_PARAMS)


def metrics_document(params: Params, evaluated: dict, shifts: dict[str, PriorShift], seeds: dict) -> dict:
    """metrics.json in a fixed key order, so `git diff` and `dvc metrics diff` read well."""
    metrics = evaluated["metrics"]
    admc, stage_one, nc = metrics["admc"], metrics["stage_one"], metrics.get("nc")  # nc: None when disabled
    return {
        "dataset": params.data.dataset,
        "test": admc["test"],
        "validation": admc["validation"],
        "stage_one": stage_one,
        "nc": nc,
        "zero_shot": metrics["zero_shot"],
        "exemplars": metrics.get("exemplars"),  # None when evaluate.exemplar_k is 0
        "gains_on_test": {
            "macro_f1_stage_two_minus_stage_one": admc["test"]["macro_f1"] - stage_one["test"]["macro_f1"],
            **({"macro_f1_admc_minus_nc": admc["test"]["macro_f1"] - nc["test"]["macro_f1"],
                "accuracy_admc_minus_nc": admc["test"]["accuracy"] - nc["test"]["accuracy"]} if nc else {}),
        },
        # Each trained model's class-prior shift (λ, fitted on validation; τ, its logits' scale: the training
        # temperature, or fitted on validation for a loss without one) and its figures without it.
        "prior_shift": {name: {"weight": shifts[name].weight, "temperature": shifts[name].temperature, "target": shifts[name].target,
                               **{f"{split}_unshifted": {k: evaluated["unshifted"][name][split][k] for k in UNSHIFTED_FIGURES}
                                  for split in ("test", "validation")}}
                        for name in MODELS if name in evaluated["unshifted"]},
        "seeds": seeds,
        # The params evaluate's stage declares (`RECORDED_PARAMS`): those that shaped these models and scores from
        # the validated data on, each of which runs evaluate again when it changes, so none is ever stale here.
        # code_edited: the code (not params.yaml) differed from that commit, as in a `dvc exp run` of edited code
        "run": {"code_version": git_commit(), "code_edited": git_commit(CODE).endswith("-dirty"),
                "params": recorded_params(params)},
    }


def _class_report(scores: np.ndarray, questions: list[LabeledQuestion], catalog: Catalog, top: int) -> dict:
    """One model's per-class precision, recall, F1 and support on `questions`, and its `top` most-confused pairs."""
    gold, predicted = gold_indices(questions, catalog), scores.argmax(axis=1)
    per_class = per_class_prf(gold, predicted, np.arange(len(catalog)))
    return {
        "per_class": {catalog.class_ids[i]: v for i, v in per_class.items()},
        "most_confused": [{"gold": catalog.class_ids[g], "predicted": catalog.class_ids[p], "count": n}
                          for g, p, n in confused_pairs(gold, predicted, top)],
    }


def _write_predictions(path: Path, scores: np.ndarray, questions: list[LabeledQuestion], catalog: Catalog, top_k: int) -> None:
    """ADMC's top-k standard questions with scores for every test question (Algorithm 1, lines 16–19)."""
    top = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]  # (N, k)
    write_jsonl(path, ({"text": q.text, "gold": q.class_id,
                        "top_k": [{"class_id": catalog.class_ids[c], "standard_question": catalog.texts[c], "score": round(float(scores[i, c]), 6)}
                                  for c in top[i]]} for i, q in enumerate(questions)))


def _write_confusion(path: Path, scores: np.ndarray, questions: list[LabeledQuestion], catalog: Catalog) -> None:
    predicted = scores.argmax(axis=1)
    _write_csv(path, [["actual", "predicted"]] + [[q.class_id, catalog.class_ids[p]] for q, p in zip(questions, predicted)])


def _write_similarity_profile(plots_dir: Path, scores: dict[str, np.ndarray], questions: list[LabeledQuestion],
                              catalog: Catalog, params: Params) -> None:
    """The paper's Figure 3: each sampled question's similarity to every standard question, before and after training."""
    from matplotlib.figure import Figure  # not pyplot: no global backend switched, no figure left open

    sample = sorted(random.Random(params.seed).sample(range(len(questions)), min(params.evaluate.profile_questions, len(questions))))
    rows = [["question", "gold", "class", "before", "after"]]
    figure = Figure(figsize=(max(6, 0.25 * len(catalog) + 2), 2.2 * len(sample)))
    axes = figure.subplots(len(sample), 1, squeeze=False)
    for axis, i in zip(axes[:, 0], sample):
        before, after = scores["zero_shot"][i], scores["admc"][i]
        for c, class_id in enumerate(catalog.class_ids):
            rows.append([i, questions[i].class_id, class_id, f"{before[c]:.6f}", f"{after[c]:.6f}"])
        x = np.arange(len(catalog))
        axis.bar(x - 0.2, before, 0.4, label="before (zero-shot)")
        axis.bar(x + 0.2, after, 0.4, label="after (ADMC)")
        axis.axvline(catalog.index(questions[i].class_id), color="black", linestyle=":", linewidth=1, label="gold class")
        axis.set_ylabel(f"similarity ({params.model.similarity})", fontsize=7)
        # parse_math=False: a question or class id is text, and two `$` in it would be read as mathtext
        # (garbled, or an error that stops evaluate after its training where it is not valid mathtext)
        axis.set_title(_drawn(questions[i].text[:90]), fontsize=8, parse_math=False)
        axis.set_xticks(x, [_drawn(c) for c in catalog.class_ids] if len(catalog) <= 20 else [""] * len(catalog),
                        fontsize=6, rotation=45, parse_math=False)
    axes[-1, 0].set_xlabel("standard question (class id)" if len(catalog) <= 20 else "standard question (catalog order)", fontsize=7)
    axes[0, 0].legend(fontsize=7)
    figure.tight_layout()
    _write_csv(plots_dir / "similarity_profile.csv", rows)
    with atomic_path(plots_dir / "similarity_profile.png") as tmp:
        figure.savefig(tmp, format="png", dpi=110)


def _drawn(text: str) -> str:
    """A question or class id as a plot label shows it: each control character or line separator as its escape
    ("g\\rh"), which the font has no glyph for (matplotlib warned and drew a box) or which broke the label in two."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in text)


def _write_csv(path: Path, rows: list[list]) -> None:
    """A plot's data as CSV, each field quoted where it needs to be (`csv_record`): a class id may hold a comma, a
    quote or a line break (a quoted catalog id), which joined by hand would cut its row in two."""
    from tqc.readers import csv_record

    with atomic_path(path) as tmp:
        tmp.write_text("".join(csv_record(row) + "\n" for row in rows), encoding="utf-8")

