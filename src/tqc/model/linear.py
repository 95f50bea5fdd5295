"""The NC baseline's model: an encoder and a linear head over the catalog's classes, saved as a Hugging Face folder
with the head in safetensors. Here, not in the stage, since the prior, evaluate and the registry load it too."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from tqc.io import atomic_directory
from tqc.model.encoder import TextEncoder, load_weights
from tqc.schema import Catalog, StaleClassifier

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
