"""Which weights stage one starts from: the warm-up's model where the warm-up stage wrote one, else model.pretrained.

The warm-up stage's folder holds either a saved bi-encoder (MODEL_CONFIG beside the encoders) or, when
`warmup.enabled` is false, only SKIP_RECORD, which says so: stage one then loads model.pretrained, as it always did.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tqc.config import ConfigError, ModelParams
from tqc.model.encoder import MODEL_CONFIG, BiEncoder

log = logging.getLogger(__name__)

SKIP_RECORD = "warmup_skipped.json"  # the warm-up's folder when it trained nothing


def warmed_model(warmup_dir: Path | None) -> Path | None:
    """The warm-up's saved model folder, or None where there is none to start from (no folder given, or the
    warm-up's record that it was skipped); a folder holding neither is an error naming it."""
    if warmup_dir is None:
        return None
    warmup_dir = Path(warmup_dir)
    if (warmup_dir / MODEL_CONFIG).is_file():
        return warmup_dir
    if (warmup_dir / SKIP_RECORD).is_file():
        return None
    raise FileNotFoundError(f"{warmup_dir}: neither a warm-up model ({MODEL_CONFIG}) nor the warm-up's skip record "
                            f"({SKIP_RECORD}); run `tqc warmup` for it")


def starting_model(params: ModelParams, warmup_dir: Path | None = None) -> BiEncoder:
    """The bi-encoder a training stage starts from: the warm-up's (trained from the same model settings) or
    model.pretrained's."""
    warmed = warmed_model(warmup_dir)
    if warmed is None:
        return BiEncoder.from_params(params)
    from tqc.io import read_json

    recorded = read_json(warmed / MODEL_CONFIG).get("model")
    if recorded != params.model_dump(mode="json"):  # a warm-up of another checkpoint, pooling or similarity
        raise ConfigError(f"{warmed}: the warm-up was trained with model settings {recorded}, and the model section is "
                          f"now {params.model_dump(mode='json')}: run `tqc warmup` again (dvc repro does)")
    log.info("starting from the warm-up's model in %s (warmed from %s)", warmed, params.pretrained)
    return BiEncoder.load(warmed)
