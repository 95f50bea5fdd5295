"""One trial: labelled, its values drawn, a complete trial of the same values repeated or a pruned one's epochs
replayed, else its chain trained as `dvc repro` trains it, each epoch reported to the pruner; the models of trials a
better one outdid are dropped."""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from tqc.config import ConfigError, Params, SearchDimension, flatten, unflatten
from tqc.metrics import DivergedScores
from tqc.pipeline import PreparedData, train_chain
from tqc.tracking import Tracker, nested_run, run_params, same_code
from tqc.tuning.space import same_value, sample_overrides
from tqc.tuning.study import first_line

log = logging.getLogger("tqc.tune")  # one logger for tuning, whichever module says it


class EpochReporter:
    """Reports each epoch to the trial (and MLflow) and raises TrialPruned when the pruner says so."""

    def __init__(self, trial, params: Params, tracker: Tracker, replayed: set[int] = frozenset()):
        # replayed: the steps the trial reported already, the pruner asked at each (`_replay_pruned`), not again
        self.trial, self.tracker, self.replayed = trial, tracker, replayed
        self.offsets = {"stage_one": 0, "stage_two": params.stage_one.epochs}
        self.best = -np.inf

    def __call__(self, stage: str, record) -> None:
        import optuna

        step = self.offsets[stage] + record.epoch
        self.tracker.log_metrics({f"{stage}.validation_macro_f1": record.validation_macro_f1,
                                  f"{stage}.validation_accuracy": record.validation_accuracy}, step=step)
        if record.epoch == 0:
            return  # the starting point: the pretrained encoder, or stage one's result again
        self.best = max(self.best, record.validation_macro_f1)
        if step in self.replayed:
            return
        self.trial.report(self.best, step)
        # The baseline is the mark the search must beat, and is queued once per base values: pruned, it would never
        # run again and the summary would show an older one
        if not self.trial.user_attrs.get("baseline") and self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at {stage} epoch {record.epoch} (best so far {self.best:.4f})")


class TrialRefused(Exception):
    """Params a trial drew that the config refuses: check_space rules out every combination of edge values it can
    see, so this is a combination inside the ranges, and it fails that trial alone."""


# What fails one trial but not the worker: sampled values too large for the GPU's memory, refused together, or that
# made the model diverge (a learning rate too high: mining or evaluation meets NaN scores) are the trial's fault, not
# the study's (Optuna records it FAIL and samples on). Anything else stops the worker, loudly.
TRIAL_FAILURES = (torch.OutOfMemoryError, TrialRefused, DivergedScores)


@dataclass(frozen=True)
class _Worker:
    """What each of one worker's trials shares: the params a draw is merged into, the space it is drawn from, the
    prepared data, where the trials' models go, and the code that trains them."""
    params: Params
    space: dict[str, SearchDimension]
    base: dict  # flat_base(params): what a searched param a trial does not draw trains with
    data: PreparedData
    study_dir: Path
    index: int  # the worker's index (tqc tune --worker N)
    version: str  # the code that trains its trials (`code_version`)


@dataclass(frozen=True)
class _Draw:
    """What one trial trains with."""
    baseline: bool  # a queued baseline: it trains the base values it was queued with, never a former trial's
    overrides: dict  # flat: the values drawn (a baseline's: its base values), merged into the worker's params
    params: Params  # the worker's params with `overrides`, validated
    trained_values: dict  # every searched param, `when` applied (one not drawn trains its base value)


@dataclass(frozen=True)
class _Training:
    """One trial's training under way: the MLflow run it logs to and the folder its models go to."""
    trial: object  # optuna.Trial
    worker: _Worker
    draw: _Draw
    trial_dir: Path
    tracker: Tracker

    def end_unfinished(self, state: str) -> None:
        """Tag its run `state` (PRUNED, FAIL) and drop the models it left part-trained."""
        self.tracker.set_tags({"optuna.state": state})
        _drop_models(self.trial_dir, self.worker.params)


def make_objective(params: Params, space: dict[str, SearchDimension], base: dict, data: PreparedData, study_dir: Path,
               worker: int, version: str):
    """Optuna's objective for this worker's trials, each recorded as trained by code `version` (`code_version`)."""
    import optuna

    shared = _Worker(params, space, base, data, study_dir, worker, version)

    def objective(trial) -> float:
        try:
            return _run_trial(trial, shared)
        except (optuna.TrialPruned, *TRIAL_FAILURES):  # each keeps its own reason (refused, failed), or is no failure
            raise
        except BaseException as error:  # Ctrl-C, or an error that stops the worker: Optuna fails the trial and keeps no
            _record_stop(trial, error)  # reason; re-raised, so Ctrl-C still stops the tuner and the error is said
            raise

    return objective


def _run_trial(trial, worker: _Worker) -> float:
    """One trial: labelled, its params drawn, then the value of a complete trial that trained them taken, or a pruned
    one's epochs replayed, or its chain trained."""
    _label(trial, worker)
    draw = _draw(trial, worker)
    former = None if draw.baseline else _trained_before(trial.study, draw.trained_values, worker.version)
    if former is not None:
        return _repeat(trial, former)
    # the epochs a pruned trial of these values reported, reported again; pruned at one, the trial trains nothing
    replayed = set() if draw.baseline else _replay_pruned(trial, draw.trained_values, worker.version)
    return _train(trial, worker, draw, replayed)


def _label(trial, worker: _Worker) -> None:
    # first: the sampler's seed counts this worker's trials by it, failed ones too
    trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}:{worker.index}")
    # the code that trains it (or whose trial it repeats): a study resumed after a fix holds trials of two codes
    trial.set_user_attr("code_version", worker.version)


def _draw(trial, worker: _Worker) -> _Draw:
    """The trial's values merged into the worker's params; a combination the config refuses fails the trial alone."""
    # a baseline trains the base values it was queued with: params changed since (an --apply, an edit) queue a
    # new one, and this one must not train today's values under its old label
    baseline = trial.user_attrs.get("baseline", False)
    overrides = (dict(trial.user_attrs.get("base_values", {})) if baseline
                 else sample_overrides(trial, worker.space, worker.base))
    try:
        trial_params = worker.params.with_overrides(unflatten(overrides))
    except ConfigError as error:
        raise _refused(trial, "config", error) from None
    trained_values = {**{name: worker.base.get(name) for name in worker.space}, **overrides}
    trial.set_user_attr("trained_values", trained_values)
    return _Draw(baseline, overrides, trial_params, trained_values)


def names_a_key(message: str, keys) -> bool:
    """Whether `message` names one of the params `keys` whole: `stage_one.temperature` in "stage_one.temperature 0.01
    is …", not inside `stage_one.temperature_floor` or `xstage_one.temperature` (a substring match read another key's
    refusal as the trial's, and the trial failed where the worker should have stopped)."""
    return any(re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message) for key in keys)


def _refused(trial, refuser: str, error: ConfigError) -> TrialRefused:
    """Said and kept as the trial's `refused` reason: the failure to raise for params the `refuser` refuses."""
    log.warning("tune: trial %d drew params the %s refuses, and fails: %s", trial.number, refuser, error)
    trial.set_user_attr("refused", str(error))
    return TrialRefused(str(error))


def _train(trial, worker: _Worker, draw: _Draw, replayed: set[int]) -> float:
    """Train the trial's chain in an MLflow run of its own, each epoch reported to the pruner (but the `replayed`
    ones); → its validation macro-F1. Its models are dropped unless it is worth keeping them."""
    import optuna

    trial_dir = trial_dir_of(worker.study_dir, trial.number)
    pruned = None
    with nested_run(f"trial {trial.number}", tags={"optuna.trial": str(trial.number)}) as tracker:
        _log_trial_params(tracker, draw)
        training = _Training(trial, worker, draw, trial_dir, tracker)
        try:
            value = _train_chain(training, replayed)
        except optuna.TrialPruned as stop:
            training.end_unfinished("PRUNED")
            pruned = stop
        except BaseException:  # its own failure (TRIAL_FAILURES, a refusal of its draw), or an error or Ctrl-C that
            training.end_unfinished("FAIL")  # stops the worker: its run says FAIL, its part-trained models go alike
            raise
    if pruned is not None:  # raised once its MLflow run has ended: a pruned trial is a finished run, not a failed one
        raise pruned
    if not _worth_keeping(trial, value):
        _drop_models(trial_dir, worker.params)
    return value  # the bests it outdid are dropped once it is recorded complete (dropping_former_bests)


def _log_trial_params(tracker: Tracker, draw: _Draw) -> None:
    # every param it trains with, as a pipeline run has them, then its draws as before (the baseline draws
    # nothing: its run gets the values it trains with), so runs compare column by column
    tracker.log_params({key: value for key, value in flatten(run_params(draw.params)).items()
                        if key not in draw.overrides})
    tracker.log_params(draw.overrides)


def _train_chain(training: _Training, replayed: set[int]) -> float:
    """`train_chain` for the trial, as `dvc repro` trains; → stage two's best validation macro-F1, the run tagged
    COMPLETE. A failure that is the trial's alone (TRIAL_FAILURES, a refusal of what it drew) keeps its reason; the
    caller ends the run of any that stops it."""
    trial, draw, data = training.trial, training.draw, training.worker.data
    try:
        # One process a trial, whatever distributed.nproc_per_node says: the pruner must see each epoch as it
        # ends, and tuning scales out by workers, one a GPU (flows/tune.py), not by ranks.
        outputs = train_chain(draw.params, data.directory, data.train, training.trial_dir, draw.params.seed,
                              with_nc=False, on_epoch=EpochReporter(trial, draw.params, training.tracker, replayed),
                              processes=1)
    except ConfigError as error:  # refused once the model is there (model.max_length beyond its positions)
        # The draw's fault only where the refusal names a param the trial drew (tqc's refusals name their
        # key); the base params', or another fault said as one (a model folder unreadable), would fail every
        # trial alike: the worker stops, loudly
        if draw.baseline or not names_a_key(str(error), draw.overrides):
            raise
        raise _refused(trial, "model", error) from None
    except TRIAL_FAILURES as error:  # Optuna logs the reason but keeps none: the study's reports name it
        trial.set_user_attr("failed", _error_line(error))
        raise
    value = outputs.fits["stage_two"].best_validation_macro_f1
    training.tracker.set_tags({"optuna.state": "COMPLETE"})
    training.tracker.log_metrics({"validation_macro_f1": value})
    return value


def _error_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {first_line(str(error))}"


def _record_stop(trial, error: BaseException) -> None:
    """Keep why a trial stopped that no TRIAL_FAILURES ended (`failed`, as theirs), as trials the heartbeat check
    fails keep theirs: a study showed it FAIL with nothing to say why. A storage that cannot take it (the database gone
    too) is said, and the trial's own error still raised."""
    reason = f"interrupted ({type(error).__name__})" if isinstance(error, KeyboardInterrupt) else _error_line(error)
    try:
        trial.set_user_attr("failed", reason)
    except Exception as unrecorded:
        log.warning("tune: trial %d stopped (%s), and the study could not record it: %s", trial.number, reason,
                    first_line(str(unrecorded)) or type(unrecorded).__name__)


def _trained_before(study, trained_values: dict, version: str):
    """The first complete trial that trained what this one would (`_trials_like`), else None."""
    import optuna

    return next(iter(_trials_like(study, trained_values, version, optuna.trial.TrialState.COMPLETE)), None)


def _trials_like(study, trained_values: dict, version: str, state) -> list:
    """The trials in `state` that code `version` trained with `trained_values` (equal, and of the same kind, value for
    value: a float drawn from a range matches only itself). Every trial trains at params.seed, so each trained the model
    a trial of these values would. Trials recorded without their values do not count, nor ones of other code
    (`same_code`): their figures are not this code's."""
    return [trial for trial in study.get_trials(deepcopy=False, states=[state])
            if _same_values(trial.user_attrs.get("trained_values"), trained_values)
            and same_code(trial.user_attrs.get("code_version"), version)]


def _same_values(recorded: dict | None, trained_values: dict) -> bool:
    return recorded is not None and recorded.keys() == trained_values.keys() and all(
        same_value(recorded[name], value) for name, value in trained_values.items())


def _repeat(trial, former) -> float:
    """`trial` drew what `former` trained: its value and epochs (to the pruner, as if trained again), no model of its
    own. The sampler redraws points of a small discrete space (K, a loss, a similarity), each a full training."""
    _report_again(trial, former, until_pruned=False)  # the pruner's answers are moot: the value is known
    trial.set_user_attr("repeats", former.number)
    log.info("tune: trial %d draws the values complete trial %d trained with: it takes its validation macro-F1 %.4f, "
             "and trains nothing", trial.number, former.number, former.value)
    return former.value


def _report_again(trial, former, until_pruned: bool) -> int | None:
    """Report `former`'s epochs as `trial`'s, asking the pruner at each as EpochReporter does (hyperband records a rung
    only where it is asked); `until_pruned`: stop at the first step it prunes at, → that step; else None."""
    for step, value in sorted(former.intermediate_values.items()):
        trial.report(value, step)
        if trial.should_prune() and until_pruned:  # asked at every step, whatever the flag
            return step
    return None


def _replay_pruned(trial, trained_values: dict, version: str) -> set[int]:
    """A trial that draws what a pruned trial of this code trained would report that trial's epochs (same params, seed
    and code: the same model) up to where it was pruned, and be judged on them; the study may have changed since (more
    complete trials, another hyperband bracket for this trial's number). So they are reported again, the pruner asked at
    each: pruned at one, the trial ends there, training nothing; else → the steps reported, which it then trains past
    (from scratch: the pruned trial kept no model). The pruned trial that went furthest is replayed."""
    import optuna

    pruned = _trials_like(trial.study, trained_values, version, optuna.trial.TrialState.PRUNED)
    if not pruned:
        return set()
    former = max(pruned, key=lambda t: (len(t.intermediate_values), -t.number))
    step = _report_again(trial, former, until_pruned=True)
    if step is None:
        log.info("tune: trial %d draws the values pruned trial %d trained with, and the pruner lets its %d epochs "
                 "through now: it trains", trial.number, former.number, len(former.intermediate_values))
        return set(former.intermediate_values)
    trial.set_user_attr("repeats", former.number)
    log.info("tune: trial %d draws the values pruned trial %d trained with: pruned at step %d on its epochs, it trains "
             "nothing", trial.number, former.number, step)
    raise optuna.TrialPruned(f"pruned at step {step} on the epochs of pruned trial {former.number}, which drew its values")


def first_of_its_values(study, trial):
    """The trial that `trial` repeats (the same values, value and models), else `trial`: a database breaks no tie by
    trial order, so the study's best may be a repeat, which has no models to score on test."""
    number = trial.user_attrs.get("repeats")
    return trial if number is None else next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def _worth_keeping(trial, value: float) -> bool:
    """The baseline trial and a new best keep their models, to score them on test at the end."""
    if trial.user_attrs.get("baseline"):
        return True
    try:
        return value >= trial.study.best_value  # a tie may become the study's best: Optuna breaks none by trial order
    except ValueError:  # no completed trial yet
        return True


def dropping_former_bests(study_dir: Path, params: Params):
    """study.optimize's callback, run once Optuna has recorded a trial: a complete one (baselines aside) drops the
    models of the trials it outdid. Not from the objective: a worker stopped (cancelled, killed, the storage gone)
    after the drop but before the trial was recorded complete left the study's best without its models."""
    import optuna

    def callback(study, trial) -> None:
        if trial.state != optuna.trial.TrialState.COMPLETE or trial.user_attrs.get("baseline"):
            return
        if trial.value < study.best_value:  # another worker's trial outdid it while it ran: kept by _worth_keeping
            _drop_models(trial_dir_of(study_dir, trial.number), params)
        else:
            _drop_former_bests(study, trial.value, study_dir, params)

    return callback


def _drop_former_bests(study, value: float, study_dir: Path, params: Params) -> None:
    """The models of the completed trials below `value`, baselines' aside: each was kept as the best when it ended,
    and with tune.keep_models false a study of 50 trials kept every one of its successive bests (two encoders each)."""
    import optuna

    for former in study.get_trials(deepcopy=False, states=[optuna.trial.TrialState.COMPLETE]):
        if former.value < value and not former.user_attrs.get("baseline"):
            _drop_models(trial_dir_of(study_dir, former.number), params)


def trial_dir_of(study_dir: Path, number: int) -> Path:
    """Where trial `number` writes its models: the objective, the droppers and the report all find them here."""
    return study_dir / f"trial-{number:04d}"


def _drop_models(trial_dir: Path, params: Params) -> None:
    if not params.tune.keep_models:
        for name in ("warmup", "stage_one", "stage_two"):  # warmup: the trial's warm-up, where warmup.enabled
            shutil.rmtree(trial_dir / name, ignore_errors=True)


@contextmanager
def worker_lock(study_dir: Path, worker: int) -> Iterator[None]:
    """One process a worker index on this machine: two (a manual run beside the scheduled one) would rewrite one
    data folder at once and seed their samplers alike, so drawing the same trials. An OS-level lock, released by the
    kernel even when its holder is killed (`tqc.locks.exclusive`)."""
    from tqc.locks import exclusive

    path = study_dir / f"worker-{worker}.lock"
    with exclusive(path, ConfigError(f"worker {worker} of study {study_dir.name!r} is running already on this machine "
                                     f"({path} is held): give this run another --worker index, or wait for it")):
        yield

