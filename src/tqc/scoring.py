"""Each trained model as a scorer: questions → scores (N, P) against the whole catalog.

Shared by the prior stage (which fits a class-prior shift per model on validation) and
evaluate (which applies it), so both score a model the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from tqc.config import Params
from tqc.device import pick_device
from tqc.losses import SCALE_FREE_LOSSES
from tqc.model.encoder import BiEncoder, catalog_scores
from tqc.model.linear import LinearClassifier, is_disabled
from tqc.schema import Catalog, LabeledQuestion

Scorer = Callable[[list[LabeledQuestion], Catalog], np.ndarray]  # (questions, catalog) → scores (N, P)


def trained_folders(stage_one: Path, stage_two: Path, nc: Path | None) -> dict[str, Path]:
    """The run's trained models by the names metrics.json uses: ADMC (stage two), AC (stage one), and NC
    when it was trained (None, or its disabled marker: not)."""
    folders = {"admc": stage_two, "stage_one": stage_one}
    return {**folders, "nc": nc} if nc is not None and not is_disabled(nc) else folders


def trained_models(stage_one: Path, stage_two: Path, nc: Path | None) -> dict[str, BiEncoder | LinearClassifier]:
    """The run's trained models (`trained_folders`), each loaded once."""
    # On the device they trained and were validated on (a GPU, bf16 autocast, where there is one)
    return {name: (LinearClassifier if name == "nc" else BiEncoder).load(folder).to(pick_device())
            for name, folder in trained_folders(stage_one, stage_two, nc).items()}


def scorer_for(model: BiEncoder | LinearClassifier, batch_size: int) -> Scorer:
    """A bi-encoder scores against the standard questions; NC's linear head gives its logits, one per
    catalog class in the catalog's order (checked: its head is indexed by it)."""
    if isinstance(model, LinearClassifier):
        def nc_logits(questions: list[LabeledQuestion], catalog: Catalog) -> np.ndarray:
            model.check_catalog(catalog)
            return model.logits([q.text for q in questions], batch_size)

        return nc_logits
    return lambda qs, c: catalog_scores(model, qs, c, batch_size)


def trained_scorers(stage_one: Path, stage_two: Path, nc: Path | None, batch_size: int) -> dict[str, Scorer]:
    """Scorers of the run's trained models (`trained_folders`)."""
    return {name: scorer_for(model, batch_size) for name, model in trained_models(stage_one, stage_two, nc).items()}


def logit_temperatures(params: Params, stage_two: Path | None = None,
                       stage_one: Path | None = None) -> dict[str, float | None]:
    """τ with which each model's scores became logits in training (scores / τ); NC's are logits already.

    None where the model's last stage trained with a loss that has no τ (hinge): its scale is
    then fitted on validation (tqc.prior.fit), not taken from a temperature training never used.
    ADMC's are stage one's where stage two kept its starting weights (`best_epoch` 0 in `stage_two`'s
    tqc_model.json): those were trained at stage one's τ, which tuning draws apart from stage two's.
    Each model's loss and τ are its own record's (the `params` its tqc_model.json keeps), where a folder is given
    and its record has them: `tqc prior` on models trained before params.yaml changed scaled their scores by a τ
    they never trained at. `params`' sections otherwise.
    """
    one = _trained_with(stage_one, params.stage_one.loss, params.stage_one.temperature)
    kept_stage_one = stage_two is not None and _record(stage_two).get("best_epoch") == 0
    admc = one if kept_stage_one else _trained_with(stage_two, params.stage_two.loss, params.stage_two.temperature)
    return {"admc": _logit_scale(*admc), "stage_one": _logit_scale(*one), "nc": 1.0}


def _trained_with(model_dir: Path | None, loss: str, temperature: float) -> tuple[str, float]:
    """(loss, τ) the model in `model_dir` trained with, by its record; `loss` and `temperature` where it says none."""
    trained = (_record(model_dir).get("params") or {}) if model_dir is not None else {}
    if "loss" in trained and "temperature" in trained:
        return trained["loss"], float(trained["temperature"])
    return loss, temperature


def _logit_scale(loss: str, temperature: float) -> float | None:
    return None if loss in SCALE_FREE_LOSSES else temperature


def _record(model_dir: Path) -> dict:
    """A model folder's tqc_model.json, or {} where it has none (its absence is loading's error to say)."""
    import json

    from tqc.model.encoder import MODEL_CONFIG

    config = Path(model_dir) / MODEL_CONFIG
    return json.loads(config.read_text(encoding="utf-8")) if config.exists() else {}
