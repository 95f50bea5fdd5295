"""NC baseline (the paper's naive classification): one encoder + a linear head, cross-entropy.

Trained on the same augmented data as ADMC, with the budget `Params.nc_schedule` gives (by default
the epochs of stage one and stage two together), and the same early stopping.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tqc import distributed
from tqc.config import AugmentParams, BaselineNCParams, ModelParams
from tqc.device import pick_device, seed_everything
from tqc.io import atomic_directory
from tqc.metrics import summary
from tqc.model.encoder import EmbeddingAugmentation, TextEncoder, outside_backbones
from tqc.model.linear import DISABLED_MARKER, LinearClassifier
from tqc.schema import Catalog, LabeledQuestion, gold_indices, load_questions
from tqc.training import FitResult, OnEpoch, backbone_groups, fit, parameter_groups, write_history, write_outputs

log = logging.getLogger(__name__)


def train(model: LinearClassifier, train_rows: list[LabeledQuestion], validation: list[LabeledQuestion], catalog: Catalog,
          params: BaselineNCParams, seed: int, on_epoch: OnEpoch | None = None) -> FitResult:
    gold = torch.as_tensor(gold_indices(train_rows, catalog))
    texts = [q.text for q in train_rows]
    validation_gold = gold_indices(validation, catalog)

    def batch_loss(rows: list[int]) -> torch.Tensor:
        logits = model([texts[i] for i in rows])  # (B, P)
        return F.cross_entropy(logits, gold[rows].to(logits.device))

    return fit(
        model,
        encoder_groups(model.encoder, params) + parameter_groups(model.head, params.head_learning_rate),
        batch_loss,
        len(train_rows),
        lambda: summary(model.logits([q.text for q in validation]), validation_gold),
        params,
        seed=seed,
        description="NC baseline",
        on_epoch=on_epoch,
    )


def encoder_groups(encoder: TextEncoder, params: BaselineNCParams) -> list[dict]:
    """The encoder's AdamW groups at `learning_rate`: its backbone's by depth under `layer_decay`, then its pooling's.
    At d = 1, `parameter_groups` of the whole encoder, as before the key existed."""
    if params.layer_decay == 1.0:
        return parameter_groups(encoder, params.learning_rate)
    pooling = nn.ParameterList(outside_backbones(encoder, [encoder]))
    return (backbone_groups([encoder.backbone], params.learning_rate, params.layer_decay)
            + parameter_groups(pooling, params.learning_rate))


def run(data_dir: Path, train_path: Path, model_params: ModelParams, augment_params: AugmentParams,
        params: BaselineNCParams, seed: int, out_dir: Path, history_path: Path,
        on_epoch: OnEpoch | None = None) -> FitResult:
    if not params.enabled:
        return _write_disabled(out_dir, history_path)
    if params.epochs is None:
        raise ValueError("baseline_nc.epochs is null, ADMC's budget: pass Params.nc_schedule(), which resolves it")
    seed_everything(seed)
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    train_rows, validation = load_questions(train_path), load_questions(data_dir / "validation.jsonl")
    encoder = TextEncoder.from_pretrained(model_params.pretrained, model_params.pooling, model_params.max_length)
    encoder.augmentation = EmbeddingAugmentation.from_params(augment_params)
    model = LinearClassifier(encoder, catalog.class_ids).to(pick_device())
    log.info("NC baseline: %d training rows, %d classes, %d epochs", len(train_rows), len(catalog), params.epochs)
    result = train(model, train_rows, validation, catalog, params, seed, on_epoch)
    metadata = result.model_record("baseline_nc", params, model_params.pretrained)
    return write_outputs("NC baseline", lambda: model.save(out_dir, metadata), out_dir, history_path, result)


def _write_disabled(out_dir: Path, history_path: Path) -> FitResult:
    if not distributed.is_main():  # under a user's own torchrun: rank 0 writes, as for a trained model
        return FitResult.of([])
    with atomic_directory(out_dir) as staging:
        (staging / DISABLED_MARKER).write_text(json.dumps({"reason": "baseline_nc.enabled is false"}) + "\n")
    write_history(history_path, [])
    log.info("NC baseline: disabled (baseline_nc.enabled: false); wrote the marker %s", out_dir / DISABLED_MARKER)
    return FitResult.of([])
