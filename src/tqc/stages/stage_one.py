"""Stage one: both encoders trained with NT-Xent against in-batch standard questions (ADMC Eq. 1).

Label-aware negatives: a batch's standard questions are deduplicated by class before they
are encoded, so a question is never pushed away from its own standard question appearing
elsewhere in the batch, and each standard question is encoded once per batch.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from tqc.config import AugmentParams, ModelParams, StageOneParams
from tqc.device import pick_device, seed_everything
from tqc.losses import make_loss
from tqc.model.encoder import BiEncoder
from tqc.schema import Catalog, LabeledQuestion, load_questions
from tqc.training import FitResult, bi_encoder_validator, fit, gold_indices, write_history

log = logging.getLogger(__name__)


def candidate_classes(batch_gold: torch.Tensor, n_classes: int, negatives: str) -> tuple[torch.Tensor, torch.Tensor]:
    """batch_gold (B,) → (candidate class ids (U,), each row's target column (B,)).

    in_batch: the batch's distinct classes; all_classes: the whole catalog.
    """
    if negatives == "all_classes":
        return torch.arange(n_classes), batch_gold
    candidates, target = torch.unique(batch_gold, return_inverse=True)
    return candidates, target


def train(
    model: BiEncoder,
    train_rows: list[LabeledQuestion],
    validation: list[LabeledQuestion],
    catalog: Catalog,
    params: StageOneParams,
    seed: int,
    on_epoch=None,
) -> FitResult:
    gold = torch.as_tensor(gold_indices(train_rows, catalog))
    texts = [q.text for q in train_rows]
    loss_fn = make_loss(params.loss, params.temperature, params.margin, params.smoothing)

    def batch_loss(rows: list[int]) -> torch.Tensor:
        candidates, target = candidate_classes(gold[rows], len(catalog), params.negatives)
        questions = model.question([texts[i] for i in rows])  # (B, D)
        standards = model.standard([catalog.texts[c] for c in candidates.tolist()])  # (U, D)
        return loss_fn(model.score(questions, standards), target.to(questions.device), None)

    return fit(
        model,
        [{"params": model.parameters(), "lr": params.learning_rate}],
        batch_loss,
        len(train_rows),
        bi_encoder_validator(model, validation, catalog),
        params,
        seed=seed,
        description="stage one",
        on_epoch=on_epoch,
    )


def run(
    data_dir: Path,
    train_path: Path,
    model_params: ModelParams,
    augment_params: AugmentParams,
    params: StageOneParams,
    seed: int,
    out_dir: Path,
    history_path: Path,
    on_epoch=None,
) -> FitResult:
    seed_everything(seed)
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    train_rows, validation = load_questions(train_path), load_questions(data_dir / "validation.jsonl")
    model = BiEncoder.from_params(model_params).to(pick_device())
    model.set_augmentation(augment_params.implicit, augment_params.rate)
    log.info("stage one: %d training rows, %d validation, %d classes on %s", len(train_rows), len(validation), len(catalog), pick_device())
    result = train(model, train_rows, validation, catalog, params, seed, on_epoch)
    model.save(out_dir, {"stage": "stage_one", "pretrained": model_params.pretrained, "best_epoch": result.best_epoch,
                         "validation_macro_f1": result.best_validation_macro_f1, "params": params.model_dump(mode="json")})
    write_history(history_path, result.history)
    log.info("stage one: wrote %s and %s", out_dir, history_path)
    return result
