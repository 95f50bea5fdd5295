"""The pipeline's stage functions chained in a working folder, for callers other than DVC.

DVC runs the stages one by one; the evaluate stage's extra seeds, the tuner and the flows
call these to run the *same* stage functions end to end, never a copy of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tqc import distributed
from tqc.config import Params
from tqc.stages import augment, baseline_nc, ingest, mine, stage_one, stage_two, validate
from tqc.training import EpochRecord, FitResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedData:
    directory: Path  # catalog.jsonl, train/validation/test.jsonl after validation
    train: Path  # the augmented training rows


@dataclass(frozen=True)
class ChainOutputs:
    stage_one: Path
    stage_two: Path
    nc: Path | None  # None: not trained (train_chain's with_nc=False)
    fits: dict[str, FitResult] = field(default_factory=dict, compare=False)


EpochHook = Callable[[str, EpochRecord], None]  # (stage name, epoch record)


def ingested_data(params: Params, work_dir: Path) -> Path:
    """ingest into `work_dir`, as `dvc repro` does into data/; returns the ingested folder."""
    ingest.run(params.data, params.seed, work_dir / "ingested", work_dir / "quarantine" / "ingest.jsonl",
               work_dir / "reports" / "ingest.json")
    return work_dir / "ingested"


def validated_data(params: Params, work_dir: Path) -> Path:
    """ingest → validate into `work_dir`, as `dvc repro` does into data/; returns the validated folder."""
    ingested_data(params, work_dir)
    validate.run(work_dir / "ingested", params.validate_, work_dir / "validated", work_dir / "quarantine" / "validate.jsonl",
                 work_dir / "reports" / "validation.json")
    return work_dir / "validated"


def prepare_data(params: Params, work_dir: Path) -> PreparedData:
    """ingest → validate → augment into `work_dir`, as `dvc repro` does into data/."""
    validated = validated_data(params, work_dir)
    augment.run(validated / "train.jsonl", params.augment, params.seed, work_dir / "augmented" / "train.jsonl",
                work_dir / "reports" / "augment.json", validated / "generated.jsonl",
                [validated / "validation.jsonl", validated / "test.jsonl"])
    return PreparedData(validated, work_dir / "augmented" / "train.jsonl")


def train_chain(params: Params, data_dir: Path, train_path: Path, work_dir: Path, seed: int, with_nc: bool = True,
                on_epoch: EpochHook | None = None) -> ChainOutputs:
    """stage one → mine → stage two (→ the NC baseline) in `work_dir`; `on_epoch` sees every epoch."""
    if params.distributed.nproc_per_node > 1 and distributed.world_size() == 1:
        # Only the CLI's stage commands relaunch themselves under torchrun; said once, not silently ignored.
        log.warning("distributed.nproc_per_node=%d: this chain (retrain, tune or evaluate's extra seeds) trains in "
                    "one process; the dvc stages (tqc stage-one / stage-two / baseline-nc) are the ones that use "
                    "torchrun", params.distributed.nproc_per_node)
    outputs = ChainOutputs(work_dir / "stage_one", work_dir / "stage_two", work_dir / "nc" if with_nc else None)

    def hook(stage: str):
        return (lambda record: on_epoch(stage, record)) if on_epoch else None

    outputs.fits["stage_one"] = stage_one.run(data_dir, train_path, params.model, params.augment, params.stage_one, seed,
                                              outputs.stage_one, work_dir / "stage_one.csv", on_epoch=hook("stage_one"))
    mine.run(data_dir, train_path, outputs.stage_one, params.mine, work_dir / "negatives.jsonl", work_dir / "mining.json")
    outputs.fits["stage_two"] = stage_two.run(data_dir, train_path, work_dir / "negatives.jsonl", outputs.stage_one,
                                              params.augment, params.stage_two, seed, outputs.stage_two,
                                              work_dir / "stage_two.csv", on_epoch=hook("stage_two"))
    if outputs.nc is not None:
        outputs.fits["baseline_nc"] = baseline_nc.run(data_dir, train_path, params.model, params.augment, params.baseline_nc,
                                                      seed, outputs.nc, work_dir / "nc.csv", on_epoch=hook("baseline_nc"))
    return outputs
