"""The pipeline's stage functions chained in a working folder, for callers other than DVC.

DVC runs the stages one by one; the evaluate stage's extra seeds, the tuner and the flows
call these to run the *same* stage functions end to end, never a copy of them.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tqc import distributed
from tqc.config import Params
from tqc.launched import run_torchrun
from tqc.io import write_text
from tqc.stages import augment, ingest, mine, validate
from tqc.training import EpochRecord, FitResult, OnEpoch, read_history
from tqc.training_commands import BASELINE_NC, STAGE_ONE, STAGE_TWO, WARMUP, StagePaths, TrainingCommand

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
               work_dir / "reports" / "ingest.json", params.validate_.max_text_chars)
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
                [validated / "validation.jsonl", validated / "test.jsonl"], validated / "catalog.jsonl")
    return PreparedData(validated, work_dir / "augmented" / "train.jsonl")


def train_chain(params: Params, data_dir: Path, train_path: Path, work_dir: Path, seed: int, with_nc: bool = True,
                on_epoch: EpochHook | None = None, processes: int | None = None) -> ChainOutputs:
    """(the warm-up, when warmup.enabled →) stage one → mine → stage two (→ the NC baseline) in `work_dir`; `on_epoch`
    sees every epoch of stage one, stage two and the NC baseline (the warm-up's are not reported).

    `processes` (default distributed.nproc_per_node) above 1: each training stage, the warm-up's too, runs as that
    many torchrun processes, through the stage's own CLI command, as `dvc repro` runs it; `on_epoch` then sees a
    stage's epochs when the stage has ended (they come from its history file).
    """
    processes = params.distributed.nproc_per_node if processes is None else processes
    train = _Trainer(params, seed, _launcher(params, seed, work_dir, processes))
    outputs = ChainOutputs(work_dir / "stage_one", work_dir / "stage_two", work_dir / "nc" if with_nc else None)

    def hook(stage: str) -> OnEpoch | None:
        return (lambda record: on_epoch(stage, record)) if on_epoch else None

    one = {"data": data_dir, "train": train_path, "out": outputs.stage_one, "history": work_dir / "stage_one.csv"}
    if params.warmup.enabled:  # stage one starts from the warm-up's model; off, from model.pretrained as ever
        one["warmup"] = warmed_up(data_dir, work_dir, train)
    outputs.fits[STAGE_ONE.stage] = train(STAGE_ONE, one, hook(STAGE_ONE.stage))
    mine.run(data_dir, train_path, outputs.stage_one, params.mine, work_dir / "negatives.jsonl", work_dir / "mining.json")
    outputs.fits[STAGE_TWO.stage] = train(STAGE_TWO, {
        "data": data_dir, "train": train_path, "negatives": work_dir / "negatives.jsonl", "model": outputs.stage_one,
        "out": outputs.stage_two, "history": work_dir / "stage_two.csv"}, hook(STAGE_TWO.stage))
    if outputs.nc is not None:
        outputs.fits[BASELINE_NC.stage] = train(BASELINE_NC, {
            "data": data_dir, "train": train_path, "out": outputs.nc, "history": work_dir / "nc.csv"}, hook(BASELINE_NC.stage))
    return outputs


def warmed_up(data_dir: Path, work_dir: Path, train: _Trainer) -> Path:
    """The warm-up stage into `work_dir` as `dvc repro` runs it into models/warmup, through `train` as the other
    training stages (`tqc warmup` under torchrun, or in this process); returns its model folder."""
    paths = {"data": data_dir, "out": work_dir / "warmup", "report": work_dir / "reports" / "warmup.json",
             "quarantine": work_dir / "quarantine" / "warmup.jsonl"}
    train(WARMUP, paths, None)
    return paths["out"]


# The params sections a launched training command reads (data: for the checks that tie augment to it, and the folder
# warmup.unlabelled is under); the rest default.
LAUNCHED_SECTIONS = ("seed", "data", "validate", "augment", "model", "warmup", "stage_one", "mine", "stage_two",
                     "baseline_nc", "distributed")


@dataclass(frozen=True)
class _Trainer:
    """Runs a training command of the chain: in this process, or through `launcher` when there is one. A stage that
    is off (a disabled NC baseline) writes its skip record here: nothing to launch."""
    params: Params
    seed: int
    launcher: _Launcher | None

    def __call__(self, command: TrainingCommand, paths: StagePaths, on_epoch: OnEpoch | None) -> FitResult:
        if self.launcher is None or command.is_off(self.params):
            return command.run(paths, self.params, self.seed, on_epoch)  # run() checks the paths itself
        command.check(paths)  # here, not as the launched processes' argparse error after torchrun started
        return self.launcher(command, paths, on_epoch)


class StageLaunchFailed(RuntimeError):
    """A training stage's torchrun processes failed other than on an input error; it says their last lines."""


LAST_LINES_SAID = 20  # of the launched processes' output, in StageLaunchFailed's message (all of it is logged)


@dataclass(frozen=True)
class _Launcher:
    """Runs a training stage as `processes` torchrun processes through its CLI command, with the chain's params
    (its seed, tracking off: the chain's caller records the run) in a file of their own."""
    params_file: Path
    processes: int

    def __call__(self, command: TrainingCommand, paths: StagePaths, on_epoch: OnEpoch | None) -> FitResult:
        launch = distributed.relaunch_command(self.processes, ["--params", str(self.params_file), command.name,
                                                               *command.arguments(paths)])
        _release_cuda_cache()  # this process's cached blocks (mining's model, say) would crowd rank 0's GPU
        log.info("distributed: launching %s", " ".join(launch))
        # its lines in this process's log (a flow run's, say); an input error its processes stopped on is raised as
        # one, which the retrain flow does not retry
        ended = run_torchrun(launch, self.processes, self.params_file.with_name(f"input-error.{command.name}"),
                             followed_by=log, name=command.name)
        if ended.status != 0:
            errors = "".join(f"\n  {line}" for line in ended.errors) or " none recognised"
            raise StageLaunchFailed(f"{command.name}: its {self.processes} torchrun processes exited with status "
                                    f"{ended.status}; their errors:{errors}\nthe last lines they wrote:\n"
                                    + "\n".join(ended.last_lines[-LAST_LINES_SAID:]))
        history = _launched_history(command, paths)
        for record in history if on_epoch else ():
            on_epoch(record)
        return FitResult.of(history)


def _launched_history(command: TrainingCommand, paths: StagePaths) -> list[EpochRecord]:
    """The epochs a launched stage's rank 0 recorded: in its --history file, the warm-up's in its --report."""
    curves = paths[command.curves]
    if command.curves == "history":
        return read_history(curves)
    # JSON has no NaN: write_json wrote epoch 0's loss (no step taken yet) as null
    return [EpochRecord(**{key: math.nan if value is None else value for key, value in record.items()})
            for record in json.loads(curves.read_text(encoding="utf-8"))["history"]]


def _release_cuda_cache() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _launcher(params: Params, seed: int, work_dir: Path, processes: int) -> _Launcher | None:
    """The torchrun launcher for `processes` > 1, or None: one process asked for, or this one is already a rank."""
    if distributed.world_size() > 1 and not distributed.active():
        # a rank of a torchrun the user started (evaluate.seeds > 1, the retrain flow) that joined no group: each rank
        # trained the whole chain unsharded, and those but rank 0 saved no model, so their mining failed to load it
        from tqc.config import ConfigError

        raise ConfigError(f"this process is one of a torchrun's (WORLD_SIZE={distributed.world_size()}), and a training "
                          "chain runs in one process: run this command without torchrun, and set "
                          "distributed.nproc_per_node to have each training stage launch its own")
    if processes <= 1:
        return None
    if distributed.relaunch_command(processes, []) is None:  # said, not silently one process
        log.warning("distributed: %d processes asked for, and this process is already one of a torchrun's (WORLD_SIZE=%s): "
                    "this chain trains in it", processes, os.environ.get("WORLD_SIZE"))
        return None
    distributed.check_launch(params.distributed.backend, processes)  # once here, not as each rank's traceback
    # What the training commands read, with this chain's seed; tracking off (the chain's caller records the run), and
    # no section that may hold a secret (tracking.uri, tune.storage) written to disk.
    read = {name: value for name, value in params.to_dict().items() if name in LAUNCHED_SECTIONS}
    # The launched commands resolve a relative data folder from their params file's folder (work_dir), as DVC does:
    # written absolute, they read the folders this process reads, from its working folder
    read["data"] = {**read["data"], **{name: str(Path(read["data"][name]).absolute()) for name in ("data_dir", "additions")
                                       if read["data"][name] is not None}}
    launched = Params.model_validate({**read, "seed": seed, "distributed": {**read["distributed"], "nproc_per_node": processes},
                                       "tracking": {"enabled": False}})
    params_file = work_dir / "params.launched.yaml"
    work_dir.mkdir(parents=True, exist_ok=True)
    write_text(params_file, json.dumps(launched.to_dict(), indent=1) + "\n")  # JSON is YAML 1.2: load_params reads it
    return _Launcher(params_file, processes)
