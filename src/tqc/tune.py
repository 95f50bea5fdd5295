"""Optuna search over the ADMC chain, scored on validation macro-F1 (test is never used to choose).

Each trial merges its sampled values into the base params, re-validates them (so a bad
search space fails like a bad params.yaml), and runs `pipeline.train_chain`, the same stage
functions `dvc repro` runs. Every epoch's validation macro-F1 (the best so far, which is what
the trial would return if stopped there) is reported to the pruner: stage one's epochs are
steps 1..E₁, stage two's E₁+1.. . Storage is any database URL; workers pointed at one study
share it, each sampling with its own seed.

    tqc --set data.dataset=covidq-categories tune --trials 12
    python -c "from tqc.tune import tune; from tqc.config import load_params; tune(load_params())"
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import re
import shutil
import socket
import tempfile
import textwrap
import time
import typing
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import yaml
from pydantic import BaseModel, ValidationError

from tqc.config import (ConfigError, Params, SearchDimension, YAMLError, flatten, params_of, problems,
                        read_params_mapping, read_yaml, redact_secrets, redact_text, unflatten, utf8_text_of)
from tqc.io import atomic_path, write_json, write_text
from tqc.metrics import DivergedScores
from tqc.mining import largest_group
from tqc.pipeline import PreparedData, prepare_data, train_chain
from tqc.schema import Catalog
from tqc.text import first_of
from tqc.tracking import Tracker, check_store, code_version, nested_run, run_params, same_code, standalone_run
from tqc.training import each_warning_once, standard_text_groups

log = logging.getLogger(__name__)

# Knobs that change the prepared data: the tuner prepares data once, so it cannot search them.
# Every key the augment stage reads is one of them (implicit, rate and the in-batch options act in training).
DATA_PREPARATION = ("seed", "data.", "validate.", "augment.rebalance", "augment.target_count", "augment.max_factor",
                    "augment.explicit", "augment.eda_alpha", "augment.seq2seq.")


def sample_overrides(trial, space: dict[str, SearchDimension], base: dict) -> dict:
    """The trial's values, as flat 'section.key' overrides. A dimension whose `when` does not
    hold (on the values sampled so far, else the base params) is not sampled at all."""
    values: dict = {}
    for name, dimension in _conditions_first(space):
        if _applies(dimension, values, base):
            values[name] = _suggest(trial, name, dimension, base.get(name))
    return values


def _listed(wanted) -> list:
    """A `when` value as the values it accepts: a list's, or the one given."""
    return wanted if isinstance(wanted, list) else [wanted]


def _applies(dimension: SearchDimension, values: dict, base: dict) -> bool:
    """Whether a trial that has drawn `values` so far (the base params' value elsewhere) draws `dimension`: every param
    its `when` names is the value given there, or one of the values listed."""
    return all(values.get(path, base.get(path)) in _listed(wanted) for path, wanted in dimension.when.items())


def _each_condition(when: dict) -> list[dict]:
    """Every set of values a `when` accepts, one value from each param's list: {} for none."""
    return [dict(zip(when, values)) for values in itertools.product(*map(_listed, when.values()))]


def _conditions_first(space: dict[str, SearchDimension]) -> list[tuple[str, SearchDimension]]:
    """Each dimension before every one whose `when` names it, so `when` reads this trial's value of them wherever
    they are listed (else a margin listed before its loss would read the base loss, and the last link of a chain,
    C when B when A, B's value decided on the base A)."""
    named_by = {name: [other for other, dimension in space.items() if name in dimension.when] for name in space}

    def height(name: str, seen: frozenset = frozenset()) -> int:  # the longest chain of `when`s that lead to it
        if name in seen:  # a cycle: no order serves it; it ends the chain
            return 0
        return max((1 + height(other, seen | {name}) for other in named_by[name]), default=0)

    return sorted(space.items(), key=lambda item: -height(item[0]))  # stable: the order as listed otherwise


def _suggest(trial, name: str, dimension: SearchDimension, base_value=None):
    """An integer knob (its base value an int, e.g. mine.k) gets integers, any other range floats,
    whatever the YAML bounds look like (low: 0 for a margin, high: 12.0 for K)."""
    if dimension.choices is not None:
        return trial.suggest_categorical(name, dimension.choices)
    if _samples_integers(name, base_value):
        return trial.suggest_int(name, math.ceil(dimension.low), math.floor(dimension.high), log=dimension.log)
    return trial.suggest_float(name, float(dimension.low), float(dimension.high), log=dimension.log)


def _samples_integers(name: str, base_value) -> bool:
    """An int param (mine.k, not a bool) is searched over integers, also where its base value is null
    (stage_one.max_steps: `int | None`); every other range over floats."""
    if base_value is not None:
        return isinstance(base_value, int) and not isinstance(base_value, bool)
    kinds = set(typing.get_args(_annotation(name))) - {type(None)}
    return kinds == {int}


def _annotation(name: str):
    """The declared type of a 'section.key' parameter (aliases such as `validate` included)."""
    model, annotation = Params, None
    for part in name.split("."):
        fields = {field.alias or key: field for key, field in model.model_fields.items()}
        if part not in fields:
            return None
        annotation = fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if model is None:
            break
    return annotation


def flat_base(params: Params) -> dict:
    """params as flat 'section.key' values, the study's own settings left out: what trials start from."""
    return flatten(params.model_dump(mode="json", by_alias=True, exclude={"tune"}))


def default_values(space: dict[str, SearchDimension], base: dict) -> dict:
    """The base params' own value of every dimension that applies to them: trial 0."""
    values: dict = {}
    for name, dimension in _conditions_first(space):
        if _applies(dimension, values, base):
            values[name] = base[name]
    return values


def check_space(params: Params) -> None:
    """Refuse, before any data is prepared or trial trained, a dimension no trial can use: one that changes the
    prepared data, one the objective never reads, or a bound, choice or `when` value the params would refuse."""
    for name in params.tune.space:
        if name.startswith(DATA_PREPARATION) or name == "seed":
            raise ConfigError(f"tune.space: {name!r} changes the prepared data; tune it with separate studies")
        if name.startswith(NOT_TUNED_ON):
            raise ConfigError(f"tune.space: {name!r} does not change what a trial is judged by (stage two's validation "
                              "macro-F1, before any class-prior shift; no NC baseline): its best value would be chance")
    if not params.tune.space:
        raise ConfigError("tune.space is empty: nothing to tune")
    epochs = [name for name in ("stage_one.epochs", "stage_two.epochs") if name in params.tune.space]
    if epochs and params.tune.pruner != "none":
        raise ConfigError(f"tune.space: {', '.join(epochs)} searched under tune.pruner {params.tune.pruner}: the pruner "
                          "compares trials step by step, and a trial's step n is stage two's epoch n − stage_one.epochs, "
                          "so searched epochs set one trial's stage-two epoch beside another's stage-one epoch (and "
                          "past hyperband's last step); search them with tune.pruner: none")
    base = flat_base(params)
    space = params.tune.space
    for name, dimension in space.items():
        for path, wanted in dimension.when.items():
            _check_condition(params, name, path, wanted, base)
        values = _values_to_check(name, dimension, base)
        # with the values its `when` needs, as a trial has them: a listed value no trial has never acts
        for needed in _each_condition(_had_by_trials(dimension.when, space, base)):
            for value in values:
                _accepted(params, {**needed, name: value}, name, value, f"tune.space.{name}")
        _acts_in_some_trial(name, dimension, space, base)
        _switched_on_in_some_trial(name, space, base)
    _combinations_accepted(params, space, base)


def _check_condition(params: Params, name: str, path: str, wanted, base: dict) -> None:
    """`name`'s `when` on `path`: each value it gives is one the params accept, and some trial has one of them
    (drawn by tune.space.`path`, or `path`'s base value where it is not searched), else `name` is never tuned. A
    list may also name values no trial has (the losses that read a knob, beside a space that draws fewer of them):
    they never act, and narrowing `path`'s choices needs no edit of the list."""
    where = f"tune.space.{name}.when"
    listed = _listed(wanted)
    if not listed:
        raise ConfigError(f"{where}: {path} lists no value, so no trial would tune {name}")
    for value in listed:
        _accepted(params, {path: value}, path, value, where)
    space = params.tune.space
    if any(_some_trial_can_have(space, path, value, base) for value in listed):
        return
    unmet = f"so no trial would tune {name}"
    reasons = [_why_no_trial_has(space, path, value, base) for value in listed]
    raise ConfigError(f"{where}: {reasons[0]}, {unmet}" if len(reasons) == 1 else
                      f"{where}: no trial has {path} in {listed!r}, {unmet} ({'; '.join(reasons)})")


def _why_no_trial_has(space: dict[str, SearchDimension], path: str, value, base: dict) -> str:
    """Why no trial has `path` = `value`: tune.space.`path` never draws it, or nothing draws `path` and the base
    value decides, for every trial."""
    if path not in space:
        return f"{path} is {base.get(path)!r} in every trial (it is not searched), never {value!r}"
    dimension = space[path]
    drawn = dimension.choices if dimension.choices is not None else f"[{dimension.low}, {dimension.high}]"
    return f"{path} = {value!r} is never drawn (tune.space.{path} draws from {drawn})"


def _some_trial_can_have(space: dict[str, SearchDimension], path: str, value, base: dict) -> bool:
    """Whether some trial has `path` = `value`: tune.space.`path` draws it, or `path` is not searched and its base
    value is `value`."""
    return _drawn(space[path], path, value, base) if path in space else base.get(path) == value


def _had_by_trials(when: dict, space: dict[str, SearchDimension], base: dict) -> dict:
    """`when` with each list cut to the values some trial has (`_check_condition` has made sure one is left)."""
    return {path: [value for value in _listed(wanted) if _some_trial_can_have(space, path, value, base)]
            for path, wanted in when.items()}


# A loss's own knob: it changes nothing under the other losses (`losses.make_loss`)
KNOB_OF_LOSS = {"margin": "hinge", "smoothing": "sdml"}
# A knob every loss reads but one: hinge compares raw scores with a margin, and has no temperature
UNREAD_BY_LOSS = {"temperature": "hinge"}


def _losses_drawn_with(dimension: SearchDimension, space: dict[str, SearchDimension], base: dict, loss: str) -> set:
    """The values of `loss` in the trials that draw `dimension`: those tune.space draws (else the base one), less
    any its `when` leaves out."""
    possible = set(space[loss].choices or []) if loss in space else {base.get(loss)}
    return possible & set(_listed(dimension.when[loss])) if loss in dimension.when else possible


def _unread_in_some_trials(name: str, dimension: SearchDimension, space: dict[str, SearchDimension], base: dict,
                           loss: str, unread_by: str) -> None:
    """A knob searched beside a loss that never reads it: said, since those trials' draws of it are chance (Optuna
    learns from a value that did nothing), and a best trial of that loss carries one into best_params.yaml."""
    losses = _losses_drawn_with(dimension, space, base, loss)
    if losses == {unread_by}:
        raise ConfigError(f"tune.space.{name}: {loss} is {unread_by} in every trial, which never reads it (hinge has no "
                          "temperature): its best value would be chance")
    if unread_by in losses:
        readers = ", ".join(sorted(map(str, losses - {unread_by})))
        log.warning("tune: tune.space.%s is not read where %s is %s (hinge has no temperature): those trials draw it for "
                    "nothing, and a best one of them leaves it at chance; draw it only with the others: "
                    "when: {%s: [%s]}", name, loss, unread_by, loss, readers)


def _acts_in_some_trial(name: str, dimension: SearchDimension, space: dict[str, SearchDimension], base: dict) -> None:
    """A loss's knob searched where no trial trains that loss is refused: its best value would be chance, and
    best_params.yaml would carry it. Searched beside other losses (no `when` on the loss, or one that lists them too),
    it is said."""
    stage, _, knob = name.rpartition(".")
    if f"{stage}.loss" not in base:  # a section with no choice of loss: warmup.margin is its triplet loss's own
        return
    if knob in UNREAD_BY_LOSS:
        _unread_in_some_trials(name, dimension, space, base, f"{stage}.loss", UNREAD_BY_LOSS[knob])
    if knob not in KNOB_OF_LOSS:
        return
    loss, needed = f"{stage}.loss", KNOB_OF_LOSS[knob]
    losses = _losses_drawn_with(dimension, space, base, loss)
    if needed not in losses:
        raise ConfigError(f"tune.space.{name}: acts only with {loss}: {needed}, and {loss} is "
                          f"{' or '.join(sorted(map(str, losses)))} in every trial; search {loss} too, with "
                          f"when: {{{loss}: {needed}}} on {name}")
    if len(losses) > 1:
        log.warning("tune: tune.space.%s acts only with %s: %s; drawn where %s is %s too, the other losses' trials draw "
                    "it for nothing: give it when: {%s: %s}", name, loss, needed, loss,
                    " or ".join(sorted(map(str, losses - {needed}))), loss, needed)


def _switched_on_in_some_trial(name: str, space: dict[str, SearchDimension], base: dict) -> None:
    """A knob of a feature that is off in every trial (the warm-up, prototype mixup, cross-encoding: its section's
    `enabled`) is refused: no trial reads it, so its best value would be chance, and best_params.yaml would carry it."""
    section = name.rpartition(".")[0]
    while section:
        switch = f"{section}.enabled"
        if switch in base and name != switch:
            if not _some_trial_can_have(space, switch, True, base):
                raise ConfigError(f"tune.space.{name}: {switch} is false in every trial, so no trial reads it; set "
                                  f"{switch}: true, or search {switch} too, with when: {{{switch}: true}} on {name}")
            return
        section = section.rpartition(".")[0]


def _values_to_check(name: str, dimension: SearchDimension, base: dict) -> list:
    """The values a trial can sample at the edges of a dimension: every choice, or both bounds as sampled."""
    if dimension.choices is not None:
        if not dimension.choices:
            raise ConfigError(f"tune.space.{name}: choices is empty")
        return list(dimension.choices)
    if _samples_integers(name, base.get(name)):
        low, high = math.ceil(dimension.low), math.floor(dimension.high)
        if low > high:  # Optuna would refuse it at the first trial, naming no dimension
            raise ConfigError(f"tune.space.{name}: {name} takes integers, and none lies in [{dimension.low}, {dimension.high}]")
        return [low, high]
    return [float(dimension.low), float(dimension.high)]


def _drawn(dimension: SearchDimension, path: str, value, base: dict) -> bool:
    """Whether `dimension` (tune.space.`path`) can draw `value`: a choice, or an integer in an integer range (a float
    range's draws never equal one value)."""
    if dimension.choices is not None:
        return value in dimension.choices
    integer = isinstance(value, int) and not isinstance(value, bool)
    return integer and _samples_integers(path, base.get(path)) and dimension.low <= value <= dimension.high


# Past this many combinations of edge values, check_space checks every pair of dimensions instead
MOST_COMBINATIONS = 20_000


def _combinations_accepted(params: Params, space: dict[str, SearchDimension], base: dict) -> None:
    """Every combination a trial may draw of the dimensions' edge values, `when` applied as a trial applies it,
    is params the config accepts. Each value alone may be fine while two together are not (loss hinge with a
    searched logit_adjustment above 0): a trial that drew them would stop its worker, not just fail."""
    ordered = _conditions_first(space)
    combinations = _edge_combinations(ordered, base)
    if combinations is None:  # too many: every pair of dimensions, each pair with its own conditions
        combinations = [combo for i, first in enumerate(ordered) for second in ordered[i + 1:]
                        for combo in _edge_combinations([first, second], base)]
    for combination in combinations:
        if _refusal(params, combination) is not None:
            smallest = _smallest_refused(params, combination)
            drawn = ", ".join(f"{name} = {value!r}" for name, value in smallest.items())
            raise ConfigError(f"tune.space: a trial may draw {drawn} together, which the params refuse:\n"
                              f"{_refusal(params, smallest)}\n(narrow the space, or add a `when` so they are never drawn "
                              "together)")


def _edge_combinations(ordered: list[tuple[str, SearchDimension]], base: dict) -> list[dict] | None:
    """The combinations of edge values a trial can draw (a dimension whose `when` fails keeps the base value);
    None when there are more than MOST_COMBINATIONS."""
    combinations: list[dict] = [{}]
    for name, dimension in ordered:
        values = _values_to_check(name, dimension, base)
        grown = []
        for combination in combinations:
            if _applies(dimension, combination, base):
                grown += [{**combination, name: value} for value in values]
            else:
                grown.append(combination)
        if len(grown) > MOST_COMBINATIONS:
            return None
        combinations = grown
    return combinations


def _refusal(params: Params, overrides: dict) -> str | None:
    """The params' problems, a line each, with the flat `overrides` (a trial's drawn values) set; None: accepted."""
    try:
        params.validated_with(unflatten(overrides))
    except ValidationError as exc:
        return problems(exc)
    return None


def _smallest_refused(params: Params, combination: dict) -> dict:
    """A refused combination with every value left out whose absence keeps it refused: the ones that clash."""
    smallest = dict(combination)
    for name in combination:
        fewer = {key: value for key, value in smallest.items() if key != name}
        if fewer and _refusal(params, fewer) is not None:
            smallest = fewer
    return smallest


def _accepted(params: Params, overrides: dict, name: str, value, where: str) -> None:
    """`name` is a parameter (Params' own validator said so); whether `value` is one it takes (in `overrides`)."""
    refused = _refusal(params, overrides)
    if refused is not None:
        raise ConfigError(f"{where}: {name} = {value!r} is not a value the params accept:\n{refused}")


def within_wrong_classes(space: dict[str, SearchDimension], n_classes: int, largest_group: int = 1
                         ) -> dict[str, SearchDimension]:
    """The space with mine.k's range cut to the wrong classes there are: mining clips K to C − 1 anyway (C minus
    the largest group of classes sharing one standard question, `mining.largest_group`, where twins are), so every K
    above it would train the same model (on TREC-6, 6 of the default 2..12 would be one trial repeated)."""
    dimension, wrong = space.get("mine.k"), n_classes - largest_group
    if dimension is None or dimension.choices is not None or dimension.high <= wrong:
        return space
    low = min(dimension.low, wrong)
    twins = f", {largest_group} of them sharing one standard question," if largest_group > 1 else ""
    log.info("tune: mine.k searched over %s..%s, not %s..%s: these data have %d classes%s so at most %d wrong ones "
             "to mine", low, wrong, dimension.low, dimension.high, n_classes, twins, wrong)
    return {**space, "mine.k": dimension.model_copy(update={"low": low, "high": wrong})}


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


@dataclass(frozen=True)
class TuneResult:
    study_name: str
    best_params: dict  # nested, in params.yaml's layout
    summary: dict


def tune(params: Params, out_dir: Path = Path("reports/tuning"), work_dir: Path = Path("tuning"), worker: int = 0,
         trials: int | None = None, data: PreparedData | None = None, params_file: Path = Path("params.yaml")) -> TuneResult:
    """Run `trials` (default tune.trials) trials of this worker in the shared study; write the reports. `params_file`:
    where `params` came from, which best_params.yaml's apply command names."""
    from tqc import distributed

    if distributed.world_size() > 1:
        # A pruned trial raises on rank 0 alone (its callback runs there), which would leave the
        # other ranks waiting in a collective; tuning scales out by workers on one storage instead.
        raise ConfigError("tqc tune runs each trial in one process and does not run under torchrun; "
                          "start more workers (tqc tune --worker N) on a shared tune.storage instead")
    try:
        check_space(params)
    except ConfigError as exc:  # the file it is in: tune.space's problems were said with no file
        raise ConfigError(f"{params_file}: {exc}") from None
    check_storage(params.tune.storage)
    if params.distributed.nproc_per_node > 1:  # said, not silently ignored
        # not the same training: each process draws stage one's in-batch negatives from its share of the batch
        log.warning("tune: distributed.nproc_per_node is %d, and each trial trains in one process, so its stage one "
                    "draws in-batch negatives from the whole batch, where dvc repro's processes each draw them from "
                    "their share (a 1/%d): the stage-one values it tunes are measured with more negatives than dvc "
                    "repro trains with. Tuning scales out by workers on one tune.storage, one a GPU (flows/tune.py "
                    "spreads them over CUDA_VISIBLE_DEVICES)", params.distributed.nproc_per_node,
                    params.distributed.nproc_per_node)
    with worker_lock(work_dir / params.tune.study, worker):
        return _tune(params, out_dir, work_dir, worker, trials, data, params_file)


def _tune(params: Params, out_dir: Path, work_dir: Path, worker: int, trials: int | None,
          data: PreparedData | None, params_file: Path) -> TuneResult:
    settings = params.tune
    # before the data: a server down or a wrong URL is said in minutes less
    storage = open_storage(params, worker)
    check_store(params.tracking)
    data = data or prepare_data(params, work_dir / settings.study / f"data-worker-{worker}")
    digest = data_digest(data)
    study = _open_study(params, worker, study_name(settings, digest), storage=storage)
    base = flat_base(params)
    join_study(study, params, base, digest)
    version = code_version()  # once: the code this process imported, whatever is edited while it runs
    warn_of_other_code(study, version)
    if settings.enqueue_defaults and worker == 0:  # one enqueuer: workers starting together would each add one
        enqueue_baseline(study, default_values(settings.space, base), version)
    study_dir = work_dir / study.study_name
    catalog = Catalog.load(data.directory / "catalog.jsonl")
    space = within_wrong_classes(settings.space, len(catalog.class_ids), largest_group(standard_text_groups(catalog)))

    with standalone_run(f"tune {study.study_name} worker {worker}", params.tracking,
                        tags={"tqc.kind": "tune", "optuna.study": study.study_name}) as parent:
        trials = settings.trials if trials is None else trials
        # every param, as a pipeline run has them (run_params), so the two compare in MLflow, and the tune section with
        # the trials this run makes: --trials, else tune.trials
        parent.log_params({**run_params(params),
                           "tune": redact_secrets({**params.tune.model_dump(mode="json"), "trials": trials})})
        objective = _objective(params, space, base, data, study_dir, worker, version)
        # gc after each trial: a pruned trial's exception holds its frames (model, optimizer state, on a GPU too)
        # until a full collection, which the next trial's allocations would otherwise wait on
        with each_warning_once():  # every trial trains on the same catalog: its warnings are said once a worker
            study.optimize(objective, n_trials=trials, catch=TRIAL_FAILURES, gc_after_trial=True,
                           callbacks=[dropping_former_bests(study_dir, params)])
        with reports_lock(out_dir):  # the reports this run logs are the ones it wrote, whole
            result = write_reports(study, params, data, study_dir, out_dir, params_file, version)
            parent.log_metrics({"best_validation_macro_f1": result.summary["best"]["validation_macro_f1"]})
            parent.log_artifact(out_dir)
    return result


# Params a study's trials do not depend on: where things are, how they are logged, what runs around them
# (a trial's objective is stage two's validation macro-F1 before any class-prior shift: no trial runs the prior stage,
# nor trains the NC baseline).
NOT_TUNED_ON = ("data.data_dir", "tracking.", "promote.", "retrain.", "ablate.", "distributed.", "evaluate.", "prior.",
                "baseline_nc.")


def study_base(params: Params, base: dict) -> dict:
    """The params every trial of a study shares: all but the searched ones and the ones no trial depends on."""
    return {key: value for key, value in base.items()
            if key not in params.tune.space and not key.startswith(NOT_TUNED_ON)}


def data_digest(data: PreparedData) -> str:
    """sha256 over what the trials train and are scored on: the catalog, and the training, validation and generated
    rows (text and class), not where each was read from, since workers may keep the data in other folders."""
    from tqc.schema import load_questions

    catalog = Catalog.load(data.directory / "catalog.jsonl")
    content = {"catalog": [[q.class_id, q.text] for q in catalog.questions]}
    for name in ("train.jsonl", "validation.jsonl", "generated.jsonl"):
        if (data.directory / name).exists():
            content[name] = [[q.text, q.class_id] for q in load_questions(data.directory / name)]
    return hashlib.sha256(json.dumps(content, ensure_ascii=False).encode()).hexdigest()


def study_name(settings, digest: str) -> str:
    """The Optuna study to open: tune.study, or with `on_new_data: new_study` one study per data set."""
    return settings.study if settings.on_new_data == "refuse" else f"{settings.study}-data-{digest[:12]}"


class _HeldRecords:
    """A study as the checks see it, what they record held back: a worker refused by a later check (its data, its
    fixed params) would else leave its dimensions recorded as searched there, and a right worker refused for them."""

    def __init__(self, study):
        self.study, self.records = study, {}

    @property
    def study_name(self) -> str:
        return self.study.study_name

    @property
    def user_attrs(self) -> dict:
        return {**self.study.user_attrs, **self.records}

    def set_user_attr(self, key: str, value) -> None:
        self.records[key] = value


def join_study(study, params: Params, base: dict, digest: str) -> None:
    """Every check of a worker against the study it opens (space, fixed params, data); the study records this
    worker's space, params and data only once all have passed."""
    held = _HeldRecords(study)
    check_study_base(held, params, base)
    check_study_data(held, params, digest)
    for key, value in held.records.items():
        study.set_user_attr(key, value)


def other_code_trials(study, version: str) -> Counter:
    """The complete trials trained by other code than `version` (`same_code`), counted by the version each kept ('not
    recorded': trained before tqc kept one): their validation macro-F1 is not what this code would score."""
    import optuna

    versions = (t.user_attrs.get("code_version") for t in study.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    return Counter(recorded or "not recorded" for recorded in versions if not same_code(recorded, version))


def short_version(version: str) -> str:
    """A code version as people read a commit: its first 10 digits, and what follows them ('-dirty:<edits>')."""
    commit = re.match(r"[0-9a-f]{40,64}", version)
    return version[:10] + version[commit.end():] if commit else version


def warn_of_other_code(study, version: str) -> None:
    """One line as a worker joins a study holding complete trials of other code (resumed after a fix in training):
    said, not refused, since a commit that changes nothing a trial runs (docs) is another version too, and the trials
    stay comparable where the fix changed nothing they measured. summary.json counts them (`other_code_version`)."""
    other = other_code_trials(study, version)
    if not other:
        return
    best = study.best_trial
    which = (f"the study's best, trial {best.number}, is one of them"
             if not same_code(best.user_attrs.get("code_version"), version) else "the study's best is not one of them")
    log.warning("tune: study %r holds %d complete trials of other code than this worker's %s (%s): their validation "
                "macro-F1 came from that code, not this; %s", study.study_name, sum(other.values()),
                short_version(version), ", ".join(f"{count} of {short_version(recorded)}"
                                                  for recorded, count in other.most_common()), which)


def check_study_data(study, params: Params, digest: str) -> None:
    """A study holds trials trained and scored on one data set: the validation macro-F1 of trials on two (new
    labeled questions arrived between two runs) are not comparable, nor is the best of them the best now."""
    recorded = study.user_attrs.get("data_digest")
    if recorded is None:  # a new study, or one begun before the digest was recorded
        study.set_user_attr("data_digest", digest)
    elif recorded != digest:
        raise ConfigError(f"study {study.study_name!r} in {redact_text(params.tune.storage)} holds trials trained and "
                          f"scored on other data (its catalog, training or validation rows differ: new labeled questions "
                          f"since it began?); name another study with tune.study, or set tune.on_new_data: new_study")


def check_study_base(study, params: Params, base: dict) -> None:
    """A study holds trials of one base configuration: the first worker records it, later ones must match it,
    so a study name reused for another dataset (or other fixed params) is refused instead of mixed."""
    check_study_space(study, params, base)
    mine = study_base(params, base)
    recorded = study.user_attrs.get("base_params")
    if recorded is None:
        study.set_user_attr("base_params", mine)
        return
    # Keys that fix no study are left out of what older versions recorded too, so their studies stay open
    recorded = {key: value for key, value in recorded.items() if not key.startswith(NOT_TUNED_ON)}
    searched_there = study.user_attrs.get("space_kinds") or {}
    # A param tqc gained after the study began is not in its record: at its default it changes nothing the trials did
    defaults = study_base(params, flat_base(Params()))
    differing = sorted(key for key in recorded.keys() | mine.keys() if recorded.get(key) != mine.get(key)
                       and not (key not in recorded and key not in searched_there and key in defaults
                                and mine[key] == defaults[key]))
    if differing:
        shown = ", ".join(_difference(key, recorded, mine, params.tune.space, searched_there) for key in differing[:5])
        raise ConfigError(f"study {study.study_name!r} in {redact_text(params.tune.storage)} holds trials of other params "
                          f"({shown}{' …' if len(differing) > 5 else ''}); name another study with tune.study")


def _difference(key: str, recorded: dict, mine: dict, space: dict, searched_there: dict) -> str:
    if key in space and key in recorded:  # a fixed param of the study's trials is searched now
        return f"{key}: fixed at {recorded[key]!r} there, searched here"
    if key in searched_there and key in mine:  # a dimension of the study's trials is fixed now
        return f"{key}: searched there, fixed at {mine[key]!r} here"
    return f"{key}: {recorded.get(key)!r} there, {mine.get(key)!r} here"


def space_kinds(space: dict[str, SearchDimension], base: dict) -> dict:
    """What Optuna cannot change under a parameter name once a study has sampled it: the choices
    of a categorical dimension, or whether a range is sampled as integers (see _suggest)."""
    return {name: list(dimension.choices) if dimension.choices is not None
            else ("int" if _samples_integers(name, base.get(name)) else "float")
            for name, dimension in space.items()}


def check_study_space(study, params: Params, base: dict) -> None:
    """Refuse, before any work, a dimension whose choices or kind changed since the study sampled it:
    Optuna would fail mid-trial ("dynamic value space"). Re-bounded ranges are fine; a dimension added or removed
    changes the params the study's trials share, which `check_study_base` refuses."""
    mine = space_kinds(params.tune.space, base)
    recorded = study.user_attrs.get("space_kinds") or {}
    changed = sorted(name for name in mine.keys() & recorded.keys() if mine[name] != recorded[name])
    if changed:
        shown = ", ".join(f"{name}: {recorded[name]!r} there, {mine[name]!r} here" for name in changed)
        raise ConfigError(f"study {study.study_name!r} in {redact_text(params.tune.storage)} sampled other values for {shown}; "
                          "Optuna cannot change them within a study: name another study with tune.study")
    if mine.keys() - recorded.keys():
        study.set_user_attr("space_kinds", {**recorded, **mine})


def enqueue_baseline(study, base_values: dict, version: str) -> None:
    """Trial 0 of these params: it samples nothing (its values may lie outside the space) and runs the base
    params. Enqueued again whenever the searched params' base values change (e.g. after `tune --apply`), and when the
    code changed since it trained (`version`, `same_code`): the mark to beat is this code's figure."""
    import optuna

    # A waiting, running or finished baseline counts (a finished one of this code); a failed one (interrupted with
    # Ctrl-C, or a killed worker's, failed by the heartbeat check) is queued again, or the study would have no baseline
    states = optuna.trial.TrialState
    for trial in study.get_trials(deepcopy=False):
        if (trial.user_attrs.get("baseline") and trial.user_attrs.get("base_values") == base_values
                and (trial.state in (states.WAITING, states.RUNNING)
                     or trial.state != states.FAIL and same_code(trial.user_attrs.get("code_version"), version))):
            return
    study.enqueue_trial({}, user_attrs={"baseline": True, "base_values": base_values})


HEARTBEAT_SECONDS, GRACE_SECONDS = 60, 240  # a running trial says it is alive every minute; 4 silent minutes fail it


@contextmanager
def _heartbeats_are_experimental() -> Iterator[None]:
    """Optuna warns that heartbeats are "experimental" (since 2.9) at each use; tqc relies on them knowingly."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def check_storage(storage: str) -> None:
    """A `tune.storage` that cannot be a study's database, refused before any data is prepared: a URL SQLAlchemy cannot
    parse, or a SQLite file whose folder is not there (said by SQLAlchemy only as "unable to open database file")."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(storage)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigError(f"tune.storage {redact_text(storage)!r}: not a database URL (sqlite:///optuna.db for a file "
                          "here, sqlite:////abs/path/optuna.db, postgresql://user@host/db for a server)") from None
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            and not Path(url.database).parent.is_dir():
        raise ConfigError(f"tune.storage {redact_text(storage)!r}: no folder {Path(url.database).parent} to keep the "
                          "study's database in")


def open_storage(params: Params, worker: int, attempts: int = 5):
    """tune.storage opened, its tables made, or a ConfigError naming it in one line: a server that cannot be reached,
    a file that is not a database, a driver not installed, a schema of another Optuna. The engines' own messages
    span lines (SQL, a link) and name no setting."""
    import optuna
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError

    # worth another try: a race between workers creating the tables at once (SQLite's "table already exists" or
    # "database is locked", PostgreSQL's duplicate key), a server not up yet; not a file that is no database
    retried = (OperationalError, IntegrityError, ProgrammingError)
    url = params.tune.storage
    for attempt in range(attempts):
        try:
            # Heartbeats: a trial whose worker was killed (no Ctrl-C to mark it) is failed once it has been silent
            # for the grace period, instead of staying RUNNING for ever
            with _heartbeats_are_experimental():
                return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_SECONDS, grace_period=GRACE_SECONDS,
                                                  **{_stale_trial_callback_keyword(): _record_lost_worker})
        except (SQLAlchemyError, ImportError, RuntimeError) as error:  # RuntimeError: Optuna's, of its schema's version
            if not isinstance(error, retried) or attempt == attempts - 1:
                said = _first_line(str(error)) or type(error).__name__
                raise ConfigError(f"tune.storage {redact_text(url)!r}: cannot open the study's database: "
                                  f"{redact_text(said)}") from None
            time.sleep(1.0 + worker)


def _stale_trial_callback_keyword() -> str:
    """RDBStorage's argument for the callback on each trial its heartbeat check fails: `heartbeat_stale_trial_callback`
    from Optuna 4.9 on, `failed_trial_callback` before (deprecated since, and gone in 6; pyproject allows 4.0)."""
    import inspect

    import optuna

    accepted = inspect.signature(optuna.storages.RDBStorage).parameters
    return "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in accepted else "failed_trial_callback"


def _record_lost_worker(study, trial) -> None:
    """The reason of a trial the heartbeat check failed, kept in the study under `lost_worker_key`: Optuna calls this
    once the trial is FAIL, and refuses a user attribute on a finished trial, so it cannot keep `failed` as others do."""
    study.set_user_attr(lost_worker_key(trial.number),
                        f"worker lost: {trial.user_attrs.get('worker', 'its worker')} sent no heartbeat for over "
                        f"{GRACE_SECONDS} s mid-trial (killed, or its machine lost)")


def lost_worker_key(number: int) -> str:
    """The study's user attribute for trial `number` failed by the heartbeat check: one key a trial, so two workers
    failing two trials at once write two keys, where one shared dict would keep the last writer's alone."""
    return f"trial {number} failed"


def failure_reasons(study) -> dict[int, str]:
    """Why each failed trial failed, where it was said: its `refused` or `failed` attribute, or the study's record of
    a trial whose worker was lost."""
    recorded = study.user_attrs
    reasons = {t.number: t.user_attrs.get("refused") or t.user_attrs.get("failed") or
               recorded.get(lost_worker_key(t.number)) for t in study.get_trials(deepcopy=False)}
    return {number: reason for number, reason in reasons.items() if reason}


def _first_line(text: str) -> str:
    """The first line of `text` that says something."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _open_study(params: Params, worker: int, name: str | None = None, attempts: int = 5, storage=None):
    """Create or join the study `name` (default tune.study) in `storage` (default: tune.storage, opened). Workers
    starting together race to create the storage's tables; the loser of that race simply tries again."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    settings = params.tune
    storage = open_storage(params, worker, attempts) if storage is None else storage
    for attempt in range(attempts):
        try:
            study = optuna.create_study(study_name=name or settings.study, storage=storage, direction="maximize",
                                        load_if_exists=True, pruner=_pruner(params))
            break
        except SQLAlchemyError:
            if attempt == attempts - 1:
                raise
            time.sleep(1.0 + worker)
    with _heartbeats_are_experimental():
        optuna.storages.fail_stale_trials(study)  # before the baseline is looked for: a killed one is queued again
    # Seeded by this worker index's own earlier trials too: one that comes back to a study (a second `tqc tune`)
    # would otherwise replay its earlier random draws, trial for trial. Only its own, so that workers starting
    # together on a new study seed as seed + worker whatever order they open it in.
    own = sum(t.user_attrs.get("worker", "").endswith(f":{worker}") for t in study.get_trials(deepcopy=False))
    # constant_liar: workers sharing the study see one another's running trials as poor, so they do not all sample the
    # same promising point (Optuna 5's default, not 4's, which pyproject allows)
    study.sampler = optuna.samplers.TPESampler(seed=(settings.seed + worker + 1009 * own) % 2**32, n_startup_trials=4,
                                               constant_liar=True)
    return study


def _pruner(params: Params):
    import optuna

    settings = params.tune
    reported = params.stage_one.epochs + params.stage_two.epochs  # the last step a trial reports
    if settings.pruner == "median":
        if settings.warmup_epochs >= reported:
            # Optuna prunes from step == warmup on: at best at a trial's last epoch, when pruning saves nothing
            # and only marks a trained trial PRUNED
            log.warning("tune: the median pruner can save no epoch: tune.warmup_epochs is %d, and a trial reports "
                        "%d epochs (stage_one.epochs + stage_two.epochs); lower warmup_epochs or train longer",
                        settings.warmup_epochs, reported)
        return optuna.pruners.MedianPruner(n_startup_trials=settings.startup_trials, n_warmup_steps=settings.warmup_epochs)
    if settings.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=reported)
    return optuna.pruners.NopPruner()


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


def _objective(params: Params, space: dict[str, SearchDimension], base: dict, data: PreparedData, study_dir: Path,
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
        if draw.baseline or not any(name in str(error) for name in draw.overrides):
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
    return f"{type(error).__name__}: {_first_line(str(error))}"


def _record_stop(trial, error: BaseException) -> None:
    """Keep why a trial stopped that no TRIAL_FAILURES ended (`failed`, as theirs), as trials the heartbeat check
    fails keep theirs: a study showed it FAIL with nothing to say why. A storage that cannot take it (the database gone
    too) is said, and the trial's own error still raised."""
    reason = f"interrupted ({type(error).__name__})" if isinstance(error, KeyboardInterrupt) else _error_line(error)
    try:
        trial.set_user_attr("failed", reason)
    except Exception as unrecorded:
        log.warning("tune: trial %d stopped (%s), and the study could not record it: %s", trial.number, reason,
                    _first_line(str(unrecorded)) or type(unrecorded).__name__)


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
        _same_value(recorded[name], value) for name, value in trained_values.items())


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


def _first_of_its_values(study, trial):
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


@contextmanager
def reports_lock(out_dir: Path) -> Iterator[None]:
    """One writer at a time for the reports in `out_dir`, across this machine's workers.

    Workers that share a study and an out_dir finish at nearly the same time; without it, one that
    read the study before another's last trial completed could write its stale summary last. Each
    reads the study inside the lock, so the last writer has seen every trial finished before it.
    The lock file lives in the system's temp folder (named by out_dir), not in the git-tracked reports.
    """
    from filelock import FileLock

    key = hashlib.sha256(str(out_dir.resolve()).encode()).hexdigest()[:16]
    with FileLock(str(Path(tempfile.gettempdir()) / f"tqc-tune-reports-{key}.lock")):
        yield


def current_baseline(complete: list, params: Params):
    """The completed baseline of params.yaml's values as they are now (after `--apply` there is a
    newer one than trial 0), else the newest baseline."""
    baselines = [t for t in complete if t.user_attrs.get("baseline")]
    now = default_values(params.tune.space, flat_base(params))
    return next((t for t in reversed(baselines) if t.user_attrs.get("base_values") == now), baselines[-1] if baselines else None)


def write_reports(study, params: Params, data: PreparedData, study_dir: Path, out_dir: Path,
                  params_file: Path = Path("params.yaml"), version: str | None = None) -> TuneResult:
    """best_params.yaml (what dvc repro consumes after `tqc tune --apply`), summary.json, trials.csv, plots. `version`:
    the code this worker's trials ran (`code_version`), the checkout's now where not given."""
    import optuna

    version = version or code_version()

    complete = study.get_trials(deepcopy=False, states=[optuna.trial.TrialState.COMPLETE])
    if not complete:
        raise ConfigError(_no_completed_trial(study))
    best, best_summary = _best_and_its_summary(study, study_dir, data, params)
    baseline = current_baseline(complete, params)
    best_params = unflatten(_values(best))
    summary = {**_study_record(study, params, version), "best": best_summary,
               "baseline": _trial_summary(baseline, study_dir, data, params) if baseline else None,
               "note": "test figures are reported for the best and baseline trials only; they never choose anything"}
    # Both files written only once every figure is in hand (the test evaluations above can fail), so that
    # best_params.yaml never sits beside another study's summary.json, whose dataset `--apply` checks
    _write_report_files(study, best, best_params, summary, out_dir, params_file)
    log.info("tune: best trial %d validation macro-F1 %.4f (baseline %s); wrote %s", best.number, best.value,
             f"{baseline.value:.4f}" if baseline else "n/a", out_dir)
    return TuneResult(study.study_name, best_params, summary)


def _study_record(study, params: Params, version: str) -> dict:
    """summary.json's account of the study, before its best and baseline trials: what it trained, on what, how its
    trials ended, and which code and workers ran them."""
    return {
        "study": study.study_name,
        "dataset": params.data.dataset,
        "trained_with": trained_with(params),
        "objective": "validation macro-F1 of stage two (the best epoch)",
        "trials": {state: count for state, count in _trial_states(study).items() if count},
        "repeated": repeated_trials(study),
        "repeated_pruned": repeated_trials(study, "PRUNED"),
        "code_version": version,  # this worker's; the complete trials other code trained, counted beside it
        "other_code_version": sum(other_code_trials(study, version).values()),
        "workers": sorted({t.user_attrs.get("worker", "?") for t in study.trials}),
    }


def _trial_states(study) -> dict[str, int]:
    """How many of the study's trials are in each state, by the state's name (COMPLETE, PRUNED, …), none left out."""
    import optuna

    return {state.name: len(study.get_trials(deepcopy=False, states=[state])) for state in optuna.trial.TrialState}


def _write_report_files(study, best, best_params: dict, summary: dict, out_dir: Path, params_file: Path) -> None:
    """best_params.yaml, headed by the trial it is and how to apply it, summary.json, trials.csv and the plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "best_params.yaml",
               f"# Optuna study {study.study_name!r}, trial {best.number}: validation macro-F1 {best.value:.4f}\n"
               f"# apply with: {apply_command(params_file, out_dir)}\n" + yaml.safe_dump(best_params))
    write_json(out_dir / "summary.json", summary)
    with atomic_path(out_dir / "trials.csv") as tmp:
        _trials_table(study).to_csv(tmp, index=False)
    _plots(study, out_dir)


def _trials_table(study):
    """Optuna's table of the study's trials, with the reason of a trial whose worker was lost in its `failed` column
    beside the others' (the study keeps it, not the trial)."""
    table, recorded = study.trials_dataframe(), study.user_attrs
    lost = [recorded.get(lost_worker_key(number)) for number in table["number"]]
    if any(lost):
        failed = table.get("user_attrs_failed", [None] * len(table))
        table["user_attrs_failed"] = [reason or said for reason, said in zip(lost, failed)]
    return table


def _best_and_its_summary(study, study_dir: Path, data: PreparedData, params: Params) -> tuple:
    """The study's best trial and its summary, read again while the best changed as its models were scored: another
    worker's trial recorded above it meanwhile dropped them (tune.keep_models false), and this worker's reports (its
    summary, best_params.yaml, its MLflow run) would name the older best. Each pass finds a trial recorded since."""
    while True:
        best = _first_of_its_values(study, study.best_trial)
        summary = _trial_summary(best, study_dir, data, params)
        if summary.get("test") is not None or _first_of_its_values(study, study.best_trial).number == best.number:
            return best, summary


def _no_completed_trial(study) -> str:
    """Why there is nothing to report, in one line: how the study's trials ended, the last failed one's reason, and
    what to change (every trial diverged, ran out of memory, drew refused values, or was pruned)."""
    ended = _trial_states(study)
    number, reason = max(failure_reasons(study).items(), default=(None, None))
    return (f"study {study.study_name!r} has no completed trial, so nothing to report "
            f"({', '.join(f'{k}: {v}' for k, v in ended.items() if v)}"
            + (f"; trial {number}: {_first_line(reason)}" if reason else "") + "). Diverged or refused trials: narrow "
            "tune.space (lower learning rates); out of memory: smaller batch sizes; pruned: tune.pruner none, or more "
            "tune.startup_trials")


# What shapes a trial's figure besides the values it searched: values tuned under these and applied under others were
# never measured together. data's paths are left out (the same files can lie elsewhere on another machine).
TRAINING_KEYS = ("seed", "data.validation_fraction", "data.validation_file", "data.imbalance_ratio",
                 "data.generated.path", "model", "augment", "stage_one", "mine", "stage_two")


def trained_with(params: Params) -> dict:
    """The flat `section.key` values of `TRAINING_KEYS` the study's trials trained with, summary.json's record."""
    flat = flatten(params.model_dump(mode="json", by_alias=True))
    return {key: value for key, value in flat.items()
            if any(key == prefix or key.startswith(prefix + ".") for prefix in TRAINING_KEYS)}


def _values(trial) -> dict:
    """A trial's tuned values: sampled, or the base params' own for the baseline trial."""
    return trial.params or trial.user_attrs.get("base_values", {})


def _trial_summary(trial, study_dir: Path, data: PreparedData, params: Params) -> dict:
    summary = {"number": trial.number, "validation_macro_f1": trial.value,
               "params": _values(trial), "code_version": trial.user_attrs.get("code_version")}
    model_dir = trial_dir_of(study_dir, trial.number) / "stage_two"
    if (model_dir / "tqc_model.json").exists():
        try:
            summary["test"] = _test_metrics(model_dir, data, params)
        except (OSError, ConfigError):
            # Another worker's trial that outdid this one while it was read dropped its models (_drop_former_bests
            # takes no lock): this best is stale, and write_reports reads the new one (_best_and_its_summary)
            if (model_dir / "tqc_model.json").exists():
                raise
            summary["test"] = None
            summary["test_missing"] = (f"the model in {model_dir} was dropped while it was read: another worker's "
                                       "trial outdid it (tune.keep_models: false); that worker's reports name it")
    else:  # said, not left out: a reader would otherwise look for figures that were never computed
        summary["test"] = None
        summary["test_missing"] = (f"no model in {model_dir}: the trial ran on another machine, or its models were "
                                   "dropped (tune.keep_models: false) before it became the best")
    return summary


def _test_metrics(model_dir: Path, data: PreparedData, params: Params) -> dict:
    """A trial's stage-two test figures, reported only (nothing is chosen by them), and before any class-prior
    shift, since a trial fits none: compare them with metrics.json's `prior_shift.admc.test_unshifted`, not its
    headline `test`."""
    from tqc.metrics import summary
    from tqc.model.encoder import BiEncoder
    from tqc.schema import Catalog, load_questions
    from tqc.training import catalog_scores, gold_indices

    catalog = Catalog.load(data.directory / "catalog.jsonl")
    test = load_questions(data.directory / "test.jsonl")
    scores = catalog_scores(BiEncoder.load(model_dir), test, catalog, params.evaluate.batch_size)
    metrics = summary(scores, gold_indices(test, catalog))
    return {k: metrics[k] for k in ("accuracy", "macro_f1", "n")}


IMPORTANCE_MIN_TRIALS = 10  # below this, fANOVA's ranking of a few knobs moves from one added trial to the next


def repeated_trials(study, state: str = "COMPLETE") -> int:
    """How many trials in `state` repeated a trial's values and trained nothing (`repeats`): complete ones took a
    complete trial's value, pruned ones were pruned on a pruned trial's epochs. summary.json says both beside the
    states' counts, which alone overstate the models a study trained."""
    import optuna

    return sum("repeats" in t.user_attrs for t in study.get_trials(deepcopy=False,
                                                                   states=(optuna.trial.TrialState[state],)))


def importance_caveat(study) -> str | None:
    """What the importance plot cannot show, where the study has too few complete trials to rank its knobs."""
    import optuna

    complete = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    if complete >= IMPORTANCE_MIN_TRIALS:
        return None
    return (f"importance from {complete} complete trials is noise, not a ranking: read it from "
            f"{IMPORTANCE_MIN_TRIALS} trials on")


def apply_command(params_file: Path, out_dir: Path) -> str:
    """The command that applies `out_dir`'s best values to `params_file` (params.yaml needs no --params)."""
    option = "" if params_file == Path("params.yaml") else f" --params {params_file}"
    return f"tqc{option} tune --apply {out_dir / 'best_params.yaml'}"


def _plots(study, out_dir: Path) -> None:
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna marks its matplotlib plots experimental
        for name, plot in (("history", optuna_plots.plot_optimization_history),
                           ("importance", optuna_plots.plot_param_importances)):
            try:
                axes = plot(study)
            except (ValueError, RuntimeError) as exc:  # e.g. importance needs two completed trials
                log.warning("tune: no %s plot: %s", name, exc)
                continue
            figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
            caveat = importance_caveat(study) if name == "importance" else None
            if caveat:
                log.warning("tune: %s", caveat)
                # Optuna's title is the left one: a centred one was drawn over it, and ran off the figure
                title = figure.axes[0].get_title(loc="left")
                figure.axes[0].set_title(f"{title}\n({textwrap.fill(caveat, 60)})", loc="left", fontsize="small")
            figure.tight_layout()
            with atomic_path(out_dir / f"{name}.png") as tmp:
                figure.savefig(tmp, format="png", dpi=110)
            plt.close(figure)


def _layout_keeping_yaml():
    """ruamel round-trip YAML that rewrites nothing but the values set: no re-wrapping of long flow
    lists, quotes and `null` kept, floats with a dot (1.0e-05: YAML 1.1 readers, PyYAML among them, read 1e-05
    as a string)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.representer import RoundTripRepresenter

    class Representer(RoundTripRepresenter):  # add_representer writes to its class: this one's, not every ruamel user's
        pass                                   # in the process (DVC's `exp run -S` writes params.yaml with it too)

    editor = YAML()
    editor.Representer = Representer
    editor.width = 1_000_000
    editor.preserve_quotes = True
    editor.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))

    def represent_float(representer, value: float):
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if e and "." not in mantissa:
            text = f"{mantissa}.0e{exponent}"
        return representer.represent_scalar("tag:yaml.org,2002:float", text)

    editor.representer.add_representer(float, represent_float)
    return editor


def _same_value(current, new) -> bool:
    """Equal, and of the same kind: 5 against 5.0, or 1 against true, would change what the param reads as."""
    return current == new and all(isinstance(current, kind) == isinstance(new, kind) for kind in (float, bool))


def _study_summary(best_params_file: Path) -> dict:
    """The study's summary.json beside `best_params_file`, {} where there is none (a file written by hand, or copied
    alone) or it is unreadable: then nothing says where or with what it was tuned."""
    try:
        summary = json.loads((best_params_file.parent / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _check_tuned_dataset(best_params_file: Path, params_file: Path, summary: dict, dataset: str | None) -> None:
    """Refuse values tuned on another dataset (the study's `summary` says which): a study run with
    `--set data.dataset=…` leaves params.yaml's dataset as it was, and `dvc repro` would train that one with them."""
    tuned_on = summary.get("dataset")
    if tuned_on is not None and tuned_on != dataset:
        summary_file = best_params_file.parent / "summary.json"
        raise ConfigError(f"{best_params_file}: tuned on data.dataset {tuned_on!r} ({summary_file}), but {params_file} "
                          f"trains {dataset!r}: set data.dataset: {tuned_on} in {params_file} first, or tune on {dataset!r}")


def _warn_of_untuned_changes(best_params_file: Path, params_file: Path, summary: dict, current: dict,
                             tuned: dict) -> None:
    """Say which of the other params the study trained with (`summary`'s trained_with) `params_file` now holds
    otherwise (an epoch count, a similarity): the tuned values were chosen beside those, and `dvc repro` will train
    them beside these. Said, not refused, since a change can be meant (more epochs for the final run)."""
    trained = summary.get("trained_with")
    if not isinstance(trained, dict):  # an older study's summary
        return
    differ = [f"{key}: {value!r} there, {current.get(key)!r} here" for key, value in sorted(trained.items())
              if key not in tuned and key in current and not _same_value(current[key], value)]
    if differ:
        log.warning("tune --apply: %s was tuned with other values of params it did not search than %s holds (%s): "
                    "its validation figures measured them, not these", best_params_file, params_file,
                    first_of(differ, 8, "; "))


def apply_best(best_params_file: Path, params_file: Path = Path("params.yaml")) -> dict:
    """Write the tuned values into params.yaml in place, keeping its comments and layout; returns those that changed
    (a value equal to the current one, `0.0001` for `1.0e-4` say, is left as written)."""
    best = _tuned_values(best_params_file)
    sections = read_params_mapping(params_file)  # not YAML, empty or no mapping: one line naming it, as load_params says
    editor = _layout_keeping_yaml()
    document = editor.load(utf8_text_of(params_file))  # the same file, read again to keep its layout in the edit
    _check_against_the_study(best_params_file, params_file, sections, best)
    changed = _set_tuned_values(document, best, best_params_file, params_file)
    if changed:  # else left as it was, as said: a round trip would re-wrap a long line, unescape a "\xD7"
        _write_if_valid(editor, document, best_params_file, params_file)
    return changed


def _tuned_values(best_params_file: Path) -> dict:
    """best_params.yaml's values as flat 'section.key' ones, refused in one line where it is not params.yaml's layout."""
    try:
        best = read_yaml(utf8_text_of(best_params_file)) or {}
    except YAMLError as exc:
        raise ConfigError(f"{best_params_file}: not YAML ({exc})") from None
    if not isinstance(best, dict):
        raise ConfigError(f"{best_params_file}: expected params.yaml's layout (section: {{key: value}}), "
                          f"not a {type(best).__name__}")
    return flatten(best)


def _check_against_the_study(best_params_file: Path, params_file: Path, sections: dict, best: dict) -> None:
    """Hold `best` against the study's summary.json beside it: values tuned on another dataset are refused, and the
    params the study trained with that `params_file` (its `sections`, as read) holds otherwise are said."""
    summary = _study_summary(best_params_file)
    data = sections.get("data")  # `data: null` or a scalar is refused with the other problems once the values are in
    _check_tuned_dataset(best_params_file, params_file, summary, data.get("dataset") if isinstance(data, dict) else None)
    try:  # params.yaml's values, defaults filled in, as the study's were recorded
        current = trained_with(Params.model_validate(sections))
    except ValidationError:  # refused with its problems below, once the tuned values are in
        current = {}
    _warn_of_untuned_changes(best_params_file, params_file, summary, current, best)


def _set_tuned_values(document, best: dict, best_params_file: Path, params_file: Path) -> dict:
    """Set each flat 'section.key' value of `best` in the loaded params `document`; returns those that changed. A key
    `params_file` does not hold is refused: nothing is added."""
    changed = {}
    for path, value in best.items():
        node = document
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.get(key) if hasattr(node, "get") else None
        if not hasattr(node, "get") or leaf not in node:
            raise ConfigError(f"{best_params_file}: {path!r} is not in {params_file}")
        if not _same_value(node[leaf], value):
            node[leaf] = changed[path] = value
    return changed


def _write_if_valid(editor, document, best_params_file: Path, params_file: Path) -> None:
    """Write `document` to `params_file` with `editor` (its layout kept), refused before touching the file where the
    params it holds are invalid."""
    from io import StringIO

    text = StringIO()
    editor.dump(document, text)
    try:
        params_of(read_yaml(text.getvalue()))
    except ValidationError as exc:  # refuse before touching params.yaml
        raise ConfigError(f"{best_params_file}: applying it would make {params_file} invalid:\n{problems(exc)}") from None
    write_text(params_file, text.getvalue())
