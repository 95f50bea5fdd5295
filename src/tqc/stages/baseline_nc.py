"""NC baseline (the paper's naive classification): one encoder + a linear head, cross-entropy.

Trained on the same augmented data as ADMC, with the budget `Params.nc_schedule` gives (by default
the epochs of stage one and stage two together), and the same early stopping.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from tqc import distributed
from tqc.config import AugmentParams, BaselineNCParams, ModelParams
from tqc.device import pick_device, seed_everything
from tqc.io import atomic_directory
from tqc.metrics import summary
from tqc.model.encoder import EmbeddingAugmentation, TextEncoder, load_weights, outside_backbones
from tqc.schema import Catalog, LabeledQuestion, StaleClassifier, load_questions
from tqc.training import (FitResult, OnEpoch, backbone_groups, fit, gold_indices, parameter_groups, write_history,
                          write_outputs)

log = logging.getLogger(__name__)

DISABLED_MARKER = "disabled.json"


def is_disabled(directory: Path) -> bool:
    """True for the marker folder the stage writes when `baseline_nc.enabled` is false."""
    return (Path(directory) / DISABLED_MARKER).exists()


class LinearClassifier(nn.Module):
    """An encoder and a linear head whose i-th output is the class `class_ids[i]`."""

    def __init__(self, encoder: TextEncoder, class_ids: list[str]):
        super().__init__()
        self.encoder = encoder
        self.class_ids = list(class_ids)
        self.head = nn.Linear(encoder.hidden_size, len(self.class_ids))
        self.loaded_from: Path | None = None  # named in errors

    def forward(self, texts: list[str]) -> torch.Tensor:
        return self.head(self.encoder(texts))  # (B, P) logits

    def check_catalog(self, catalog: Catalog) -> None:
        """Scores are read by catalog index: a head trained on other classes, or on the same ones in
        another order, would answer with the wrong class without an error."""
        if self.class_ids != catalog.class_ids:
            raise StaleClassifier(
                f"{self.loaded_from or 'the NC model'}: its head's {len(self.class_ids)} classes are not the catalog's {len(catalog)} in its "
                f"order (first difference: {_first_difference(self.class_ids, catalog.class_ids)}); train it again")

    @torch.no_grad()
    def logits(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        embeddings = self.encoder.encode(texts, batch_size, "NC: encoding")  # (N, D)
        return self.head(embeddings.to(self.head.weight.device)).float().cpu().numpy()  # (N, P)

    def save(self, directory: Path, metadata: dict | None = None) -> None:
        """The encoder's Hugging Face folder, the head as safetensors, and tqc_model.json: the class ids the head
        scores, in order, then `metadata` (how it was trained, as the contrastive stages record theirs)."""
        with atomic_directory(directory) as staging:
            self.encoder.save(staging)
            save_file({k: v.contiguous().cpu() for k, v in self.head.state_dict().items()}, staging / "head.safetensors")
            config = {"kind": "linear_classifier", "classes": len(self.class_ids), "class_ids": self.class_ids,
                      **(metadata or {})}
            (staging / "tqc_model.json").write_text(json.dumps(config, indent=2))

    @classmethod
    def load(cls, directory: Path) -> "LinearClassifier":
        config = json.loads((directory / "tqc_model.json").read_text())
        if "class_ids" not in config:
            raise StaleClassifier(f"{directory}: saved before NC models recorded their class ids (tqc_model.json has "
                                  f"only a count, {config.get('classes')}); train it again")
        model = cls(TextEncoder.load(directory), config["class_ids"])
        model.head.load_state_dict(load_weights(directory / "head.safetensors", "linear head"))
        model.loaded_from = directory
        return model


def _first_difference(saved: list[str], catalog: list[str]) -> str:
    for i, (a, b) in enumerate(zip(saved, catalog)):
        if a != b:
            return f"row {i} is {a!r} in the head, {b!r} in the catalog"
    longer, which = (saved, "head") if len(saved) > len(catalog) else (catalog, "catalog")
    return f"row {min(len(saved), len(catalog))}, {longer[min(len(saved), len(catalog))]!r}, is only in the {which}"


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
