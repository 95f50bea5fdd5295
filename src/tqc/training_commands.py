"""The training stages as commands: each one's path arguments, and how those and the params make its `run()` call.

`tqc warmup | stage-one | stage-two | baseline-nc` take these paths from the command line (dvc.yaml names them), and
`pipeline.train_chain` hands the same paths to the same call in its own process, or to the same command under
torchrun. One table, so that a stage run by DVC, by the chain and by a launched process gets the same arguments (a
test holds dvc.yaml's commands to it). Light to import: the stage modules (torch) load when a stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:
    from tqc.config import Params
    from tqc.training import FitResult, OnEpoch

StagePaths = Mapping[str, Path]  # path argument (without its "--") → path


@dataclass(frozen=True)
class TrainingCommand:
    """A training stage as `tqc <name> --<path> PATH …`: which path arguments it takes, and its run() on them."""

    name: str  # `tqc <name>`
    stage: str  # its params section, its MLflow run's stage and its fit's name in the chain: stage_one
    paths: tuple[str, ...]  # the path arguments it needs, `--data PATH` …
    inputs: tuple[str, ...]  # those it reads: checked before a torchrun launch, logged as its run's inputs
    call: Callable[[StagePaths, Params, int, OnEpoch | None], FitResult]  # the stage's run() on them
    optional: tuple[str, ...] = ()  # path arguments it may be given
    curves: str = "history"  # the path argument its epochs' curves are written to
    switch: str | None = None  # the params section whose `enabled: false` turns it off; None: always on
    # files its params name that it reads too (the warm-up's unlabelled file), logged with its inputs
    params_inputs: Callable[[Params], list[Path]] = lambda params: []

    def is_off(self, params: Params) -> bool:
        """Its switch is off (the warm-up, the NC baseline): it writes only its skip record, and trains nothing."""
        return self.switch is not None and not getattr(params, self.switch).enabled

    def check(self, paths: StagePaths) -> None:
        """A caller's paths are the command's: a missing or unknown one is the caller's mistake, said as the
        programming error it is, before anything runs or is launched."""
        missing = [name for name in self.paths if paths.get(name) is None]
        unknown = sorted(set(paths) - set(self.paths) - set(self.optional))
        if missing or unknown:
            raise TypeError(f"tqc {self.name}: missing path arguments {missing}, unknown ones {unknown}")

    def run(self, paths: StagePaths, params: Params, seed: int, on_epoch: OnEpoch | None = None) -> FitResult:
        self.check(paths)
        return self.call(paths, params, seed, on_epoch)

    def arguments(self, paths: StagePaths) -> list[str]:
        """The command line's path arguments for `paths`, as a launched process is given them."""
        return [part for name, path in paths.items() for part in (f"--{name}", str(path))]

    def given(self, arguments: Mapping[str, object]) -> dict[str, Path]:
        """Its path arguments among a parsed command line's (`vars(args)`), those not given left out."""
        return {name: arguments[name] for name in (*self.paths, *self.optional) if arguments.get(name) is not None}


def _warmup(paths: StagePaths, params: Params, seed: int, on_epoch: OnEpoch | None) -> FitResult:
    from tqc.stages import warmup

    return warmup.run(paths["data"], params.model, params.warmup, params.data, seed, paths["out"], paths["report"],
                      paths["quarantine"], on_epoch=on_epoch)


def _stage_one(paths: StagePaths, params: Params, seed: int, on_epoch: OnEpoch | None) -> FitResult:
    from tqc.stages import stage_one

    return stage_one.run(paths["data"], paths["train"], params.model, params.augment, params.stage_one, seed,
                         paths["out"], paths["history"], on_epoch=on_epoch, warmup_dir=paths.get("warmup"))


def _stage_two(paths: StagePaths, params: Params, seed: int, on_epoch: OnEpoch | None) -> FitResult:
    from tqc.stages import stage_two

    return stage_two.run(paths["data"], paths["train"], paths["negatives"], paths["model"], params.augment,
                         params.stage_two, seed, paths["out"], paths["history"], on_epoch=on_epoch)


def _baseline_nc(paths: StagePaths, params: Params, seed: int, on_epoch: OnEpoch | None) -> FitResult:
    from tqc.stages import baseline_nc

    return baseline_nc.run(paths["data"], paths["train"], params.model, params.augment, params.nc_schedule(), seed,
                           paths["out"], paths["history"], on_epoch=on_epoch)


def _warmup_inputs(params: Params) -> list[Path]:
    """The unlabelled file the warm-up reads beside its data folder, if warmup.unlabelled names one."""
    unlabelled = params.warmup.unlabelled
    return [Path(params.data.data_dir) / unlabelled] if unlabelled else []


WARMUP = TrainingCommand(name="warmup", stage="warmup", paths=("data", "out", "report", "quarantine"), inputs=("data",),
                        call=_warmup, curves="report", switch="warmup",  # its report holds its curves
                        params_inputs=_warmup_inputs)
STAGE_ONE = TrainingCommand(name="stage-one", stage="stage_one", paths=("data", "train", "out", "history"),
                            inputs=("data", "train"), call=_stage_one,
                            optional=("warmup",))  # the warm-up's folder: it starts from the model there, if any
STAGE_TWO = TrainingCommand(name="stage-two", stage="stage_two",
                            paths=("data", "train", "negatives", "model", "out", "history"),
                            inputs=("data", "train", "negatives", "model"), call=_stage_two)
BASELINE_NC = TrainingCommand(name="baseline-nc", stage="baseline_nc", paths=("data", "train", "out", "history"),
                              inputs=("data", "train"), call=_baseline_nc, switch="baseline_nc")

TRAINING_COMMANDS: dict[str, TrainingCommand] = {command.name: command for command in
                                                 (WARMUP, STAGE_ONE, STAGE_TWO, BASELINE_NC)}
