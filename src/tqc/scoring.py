"""Each trained model as a scorer: questions → scores (N, P) against the whole catalog.

Shared by the prior stage (which fits a class-prior shift per model on validation) and
evaluate (which applies it), so both score a model the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from tqc.config import Params
from tqc.model.encoder import BiEncoder
from tqc.schema import Catalog, LabeledQuestion
from tqc.stages.baseline_nc import LinearClassifier, is_disabled
from tqc.training import catalog_scores

Scorer = Callable[[list[LabeledQuestion], Catalog], np.ndarray]  # (questions, catalog) → scores (N, P)


def trained_folders(stage_one: Path, stage_two: Path, nc: Path | None) -> dict[str, Path]:
    """The run's trained models by the names metrics.json uses: ADMC (stage two), AC (stage one), and NC
    when it was trained (None, or its disabled marker: not)."""
    folders = {"admc": stage_two, "stage_one": stage_one}
    return {**folders, "nc": nc} if nc is not None and not is_disabled(nc) else folders


def trained_scorers(stage_one: Path, stage_two: Path, nc: Path | None, batch_size: int) -> dict[str, Scorer]:
    """Scorers of the run's trained models (`trained_folders`)."""
    folders = trained_folders(stage_one, stage_two, nc)
    scorers: dict[str, Scorer] = {}
    for name in ("admc", "stage_one"):
        model = BiEncoder.load(folders[name])
        scorers[name] = lambda qs, c, m=model: catalog_scores(m, qs, c, batch_size)
    if "nc" in folders:
        classifier = LinearClassifier.load(folders["nc"])
        scorers["nc"] = lambda qs, c: classifier.logits([q.text for q in qs], batch_size)
    return scorers


def logit_temperatures(params: Params) -> dict[str, float]:
    """τ with which each model's scores became logits in training (scores / τ); NC's are logits already."""
    return {"admc": params.stage_two.temperature, "stage_one": params.stage_one.temperature, "nc": 1.0}
