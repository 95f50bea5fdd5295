"""The study's reports: best_params.yaml (what `tqc tune --apply` writes into params.yaml), summary.json with the best
and baseline trials' test figures (reported, never chosen by), trials.csv and the plots."""

from __future__ import annotations

import logging
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

from tqc.config import ConfigError, Params, flatten, unflatten
from tqc.io import atomic_path, write_json, write_text
from tqc.pipeline import PreparedData
from tqc.tracking import code_version
from tqc.tuning.space import default_values, flat_base
from tqc.tuning.study import failure_reasons, first_line, lost_worker_key, other_code_trials
from tqc.tuning.trials import first_of_its_values, trial_dir_of

log = logging.getLogger("tqc.tune")  # one logger for tuning, whichever module says it


@dataclass(frozen=True)
class TuneResult:
    study_name: str
    best_params: dict  # nested, in params.yaml's layout
    summary: dict


# How long a worker waits for another's reports: writing them takes seconds to a few minutes (the plots); a holder
# gone for this long is stuck, and a worker waiting forever would hide it
REPORTS_LOCK_TIMEOUT_S = 30 * 60


def reports_lock_path(out_dir: Path) -> Path:
    """`<parent>/.<name>.tune-reports.lock`, beside out_dir: shared by workers on every machine that sees the folder
    (not the system temp folder, which is each machine's own, and where any user could take the name first), and
    outside out_dir, whose reports git tracks (the name is in .gitignore)."""
    out_dir = out_dir.resolve()
    return out_dir.parent / f".{out_dir.name}.tune-reports.lock"


@contextmanager
def reports_lock(out_dir: Path, timeout_s: float = REPORTS_LOCK_TIMEOUT_S) -> Iterator[None]:
    """One writer at a time for the reports in `out_dir`, across the workers sharing it.

    Workers that share a study and an out_dir finish at nearly the same time; without it, one that
    read the study before another's last trial completed could write its stale summary last. Each
    reads the study inside the lock, so the last writer has seen every trial finished before it.
    """
    from tqc.locks import exclusive

    path = reports_lock_path(out_dir)
    held = ConfigError(f"{path}: another tune worker has held the reports of {out_dir} for {timeout_s:.0f} s; if none "
                       "is running (a worker killed on another machine may leave it held on a network folder), delete "
                       "the file and run again")
    with exclusive(path, held, "the tune reports lock", timeout_s):
        yield


def current_baseline(complete: list, params: Params):
    """The completed baseline of params.yaml's values as they are now (after `--apply` there is a newer one than
    trial 0), else None: not yet trained (only worker 0 queues one, and it may still run or have failed). Another
    values' baseline is no mark for these: the newest one stood in, tied the best and had `tune` say "the params'
    values stand, nothing to apply" of values that had scored worse."""
    now = default_values(params.tune.space, flat_base(params))
    return next((t for t in reversed(complete) if t.user_attrs.get("baseline") and t.user_attrs.get("base_values") == now),
                None)


def baseline_missing(complete: list, params: Params) -> str:
    """summary.json's word where no baseline of the params' current values has completed."""
    others = [t.number for t in complete if t.user_attrs.get("baseline")]
    return ("no baseline of the params' current values has completed yet (worker 0 queues one when they change): "
            "nothing here says how they score" + (f"; baseline trial(s) {', '.join(map(str, others))} ran other "
                                                  "values" if others else ""))


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
               **({} if baseline else {"baseline_missing": baseline_missing(complete, params)}),
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
        best = best_trial(study, params)
        summary = _trial_summary(best, study_dir, data, params)
        if summary.get("test") is not None or best_trial(study, params).number == best.number:
            return best, summary


def best_trial(study, params: Params):
    """The study's best trial, or the baseline of the params as they are now where that one ties it: a tie beats
    nothing, and `--apply` of another trial's values would change params.yaml for no measured gain (Optuna breaks a
    tie by trial order, so an older baseline, or any trial, ahead of the current one was the best)."""
    import optuna

    best = first_of_its_values(study, study.best_trial)
    baseline = current_baseline(study.get_trials(deepcopy=False, states=[optuna.trial.TrialState.COMPLETE]), params)
    return baseline if baseline is not None and baseline.value >= best.value else best


def _no_completed_trial(study) -> str:
    """Why there is nothing to report, in one line: how the study's trials ended, the last failed one's reason, and
    what to change (every trial diverged, ran out of memory, drew refused values, or was pruned)."""
    ended = _trial_states(study)
    number, reason = max(failure_reasons(study).items(), default=(None, None))
    return (f"study {study.study_name!r} has no completed trial, so nothing to report "
            f"({', '.join(f'{k}: {v}' for k, v in ended.items() if v)}"
            + (f"; trial {number}: {first_line(reason)}" if reason else "") + "). Diverged or refused trials: narrow "
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
    from tqc.model.encoder import BiEncoder, catalog_scores
    from tqc.schema import Catalog, gold_indices, load_questions

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


def _file_backend_unless_chosen() -> None:
    """Optuna draws its plots with pyplot, which needs a backend: Agg (files only, no display) where nothing in this
    process has chosen one (`tqc tune`, a flow's worker). A notebook's or a script's own choice (MPLBACKEND, as
    Jupyter sets it, or pyplot already in use) is left as it is: switching it would change how their figures show."""
    import os
    import sys

    if "MPLBACKEND" in os.environ or "matplotlib.pyplot" in sys.modules:
        return
    import matplotlib

    matplotlib.use("Agg")


def apply_command(params_file: Path, out_dir: Path) -> str:
    """The command that applies `out_dir`'s best values to `params_file` (params.yaml needs no --params)."""
    option = "" if params_file == Path("params.yaml") else f" --params {params_file}"
    return f"tqc{option} tune --apply {out_dir / 'best_params.yaml'}"


def _plots(study, out_dir: Path) -> None:
    import warnings

    _file_backend_unless_chosen()
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

