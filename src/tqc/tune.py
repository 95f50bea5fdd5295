"""Optuna search over the ADMC chain, scored on validation macro-F1 (test is never used to choose).

Each trial merges its sampled values into the base params, re-validates them (so a bad
search space fails like a bad params.yaml), and runs `pipeline.train_chain`, the same stage
functions `dvc repro` runs. Every epoch's validation macro-F1 (the best so far, which is what
the trial would return if stopped there) is reported to the pruner: stage one's epochs are
steps 1..E₁, stage two's E₁+1.. . Storage is any database URL; workers pointed at one study
share it, each sampling with its own seed.

Its parts are in `tqc.tuning`: the search space (`space`), the study a worker joins (`study`), one trial
(`trials`), the reports (`reports`) and `tqc tune --apply` (`apply`).

    tqc --set data.dataset=covidq-categories tune --trials 12
    python -c "from tqc.tune import tune; from tqc.config import load_params; tune(load_params())"
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tqc.config import ConfigError, Params, redact_secrets
from tqc.mining import largest_group
from tqc.pipeline import PreparedData, prepare_data
from tqc.schema import Catalog
from tqc.tracking import check_store, code_version, run_params, standalone_run
from tqc.twins import standard_text_groups
from tqc.warn_once import each_warning_once
from tqc.tuning.reports import TuneResult, reports_lock, write_reports
from tqc.tuning.space import check_space, default_values, flat_base, within_wrong_classes
from tqc.tuning.study import (check_storage, data_digest, enqueue_baseline, join_study, open_storage, open_study,
                              study_name, warn_of_other_code)
from tqc.tuning.trials import TRIAL_FAILURES, dropping_former_bests, make_objective, worker_lock

log = logging.getLogger(__name__)


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
    study = open_study(params, worker, study_name(settings, digest), storage=storage)
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
        objective = make_objective(params, space, base, data, study_dir, worker, version)
        # gc after each trial: a pruned trial's exception holds its frames (model, optimizer state, on a GPU too)
        # until a full collection, which the next trial's allocations would otherwise wait on. Every trial trains on
        # the same catalog, so its warnings are said once a worker
        with each_warning_once(), optuna_quiet_on_interrupt():
            study.optimize(objective, n_trials=trials, catch=TRIAL_FAILURES, gc_after_trial=True,
                           callbacks=[dropping_former_bests(study_dir, params)])
        with reports_lock(out_dir):  # the reports this run logs are the ones it wrote, whole
            result = write_reports(study, params, data, study_dir, out_dir, params_file, version)
            parent.log_metrics({"best_validation_macro_f1": result.summary["best"]["validation_macro_f1"]})
            parent.log_artifact(out_dir)
    return result


class _InterruptedTrialFilter(logging.Filter):
    """Drops Optuna's two warnings about a trial Ctrl-C stopped: the first carries the interrupt's traceback (~100
    lines through torch) ahead of tqc's one line ("interrupted", exit 130), the second says the trial "failed with
    value None". The trial is still marked failed, with the interrupt as its reason; other failures keep theirs."""

    def __init__(self) -> None:
        super().__init__()
        self.after_an_interrupt = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[0] is not None and issubclass(record.exc_info[0], KeyboardInterrupt):
            self.after_an_interrupt = True
            return False
        if self.after_an_interrupt and "failed with value" in record.getMessage():
            self.after_an_interrupt = False
            return False
        return True


@contextmanager
def optuna_quiet_on_interrupt() -> Iterator[None]:
    """`_InterruptedTrialFilter` on the logger Optuna's optimize loop reports failed trials with, while inside."""
    logger = logging.getLogger("optuna.study._optimize")
    interrupted = _InterruptedTrialFilter()
    logger.addFilter(interrupted)
    try:
        yield
    finally:
        logger.removeFilter(interrupted)
