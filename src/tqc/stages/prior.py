"""Prior: fit each trained model's class-prior shift on validation (tqc.prior).

For ADMC, AC and NC alike: λ from `prior.weights` with the best validation likelihood
(`prior.target`: over questions, or class-balanced), and π from the validated training
rows before augmentation (the labeled traffic's own class mix, not the rebalanced one).
τ is the model's training temperature (its own record's), or fitted on validation for a hinge-trained model.
Evaluate applies the shifts; promote registers the promoted model's with it, so the
registry serves what evaluate measured.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from tqc import prior
from tqc.config import Params
from tqc.io import write_json
from tqc.prior import PriorShift
from tqc.schema import Catalog, gold_indices, load_questions
from tqc.scoring import logit_temperatures, trained_folders, trained_scorers

log = logging.getLogger(__name__)


def fit_shifts(data_dir: Path, stage_one: Path, stage_two: Path, nc: Path | None, params: Params) -> dict[str, PriorShift]:
    """{model: its shift}, each fitted on `data_dir`'s validation split."""
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    train, validation = load_questions(data_dir / "train.jsonl"), load_questions(data_dir / "validation.jsonl")
    log_pi = prior.log_prior([q.class_id for q in train], catalog.class_ids)  # (P,)
    gold = gold_indices(validation, catalog)
    temperatures = logit_temperatures(params, stage_two, stage_one)
    return {name: prior.fit(scorer(validation, catalog), gold, log_pi, temperatures[name], params.prior.weights,
                           params.prior.target)
            for name, scorer in trained_scorers(stage_one, stage_two, nc, params.evaluate.batch_size).items()}


def run(data_dir: Path, stage_one: Path, stage_two: Path, nc: Path | None, params: Params, out_path: Path) -> dict:
    """Fit the shifts of the run's models (NC: None or its disabled marker, none for it) and write them to `out_path`."""
    started = time.perf_counter()
    class_ids = Catalog.load(data_dir / "catalog.jsonl").class_ids
    shifts = fit_shifts(data_dir, stage_one, stage_two, nc, params)
    folders = trained_folders(stage_one, stage_two, nc)
    # Each entry names its model folder relative to this file's, so evaluate, promote and `tqc predict`
    # find a model's own shift from any working directory.
    # ... and the digest of the weights it was fitted for, so a folder trained again since is refused, not shifted.
    document = {"target": params.prior.target, "weights": list(params.prior.weights),
                "models": {name: {"model": os.path.relpath(folders[name], Path(out_path).parent),
                                  "weights_digest": prior.weights_digest(folders[name]), **s.to_json(class_ids)}
                           for name, s in shifts.items()}}
    write_json(out_path, document)
    for name, shift in shifts.items():
        criterion = prior.TARGETS[shift.target]
        kept, unshifted = shift.validation_by_weight[f"{shift.weight:g}"], shift.validation_by_weight.get("0", {})
        log.info("prior: %s keeps λ = %g at τ = %g for the %s mix (validation %s %.4f, macro-F1 %.4f; unshifted %.4f, %.4f)",
                 name, shift.weight, shift.temperature, shift.target, criterion, kept[criterion], kept["macro_f1"],
                 unshifted.get(criterion, float("nan")), unshifted.get("macro_f1", float("nan")))
    log.info("prior: wrote %s (%.1fs)", out_path, time.perf_counter() - started)
    return document
