"""The training chain (stage one → mine → stage two, plus the NC baseline) as one call.

DVC runs these stages one by one; the evaluate stage's extra seeds, the tuner and the
flows call this to run the *same* stage functions end to end in a working folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tqc.config import Params
from tqc.stages import baseline_nc, mine, stage_one, stage_two


@dataclass(frozen=True)
class ChainOutputs:
    stage_one: Path
    stage_two: Path
    nc: Path


def train_chain(params: Params, data_dir: Path, train_path: Path, work_dir: Path, seed: int, with_nc: bool = True) -> ChainOutputs:
    outputs = ChainOutputs(work_dir / "stage_one", work_dir / "stage_two", work_dir / "nc")
    stage_one.run(data_dir, train_path, params.model, params.augment, params.stage_one, seed,
                  outputs.stage_one, work_dir / "stage_one.csv")
    mine.run(data_dir, train_path, outputs.stage_one, params.mine, work_dir / "negatives.jsonl", work_dir / "mining.json")
    stage_two.run(data_dir, train_path, work_dir / "negatives.jsonl", outputs.stage_one, params.augment, params.stage_two,
                  seed, outputs.stage_two, work_dir / "stage_two.csv")
    if with_nc:
        baseline_nc.run(data_dir, train_path, params.model, params.augment, params.baseline_nc, seed,
                        outputs.nc, work_dir / "nc.csv")
    return outputs
