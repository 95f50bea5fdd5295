"""The `retrain` flow: new labeled questions from the inbox → validated, merged, trained (or, with
`retrain.mode: refresh`, served by the champion's encoder as exemplars), judged, committed.

    python flows/retrain.py                      # once, locally, on Prefect's embedded default (--mode, --params)
    python flows/retrain.py --serve --cron "0 2 * * *"   # on a schedule, run by this process: no work pool (a server)
    prefect deploy --all                         # the cron deployment in prefect.yaml (GPU work pool)

Each step is a function of `tqc.retrain` (the pipeline's own stage functions underneath);
this file only makes them Prefect tasks, with retries where a step can flake.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

from prefect import flow, get_run_logger, serve, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed, State

from tqc import retrain as steps
from tqc.config import Params, RetrainMode, load_params
from tqc.errors import input_errors, registry_errors
from tqc.tracking import COMMIT_TAG, git_commit, nested_run, offline_mlflow, run_params, standalone_run


def user_errors() -> tuple[type[Exception], ...]:
    """Failures whose message is the whole story: bad params, data or a prior file (`tqc.errors.input_errors`, each
    naming the file and what is wrong: the current dataset's file gone, say), a champion the gate cannot read or ask
    (`registry_errors`, naming the version and the way out), no champion to refresh, a dvc step of the commit."""
    return (*input_errors(), *registry_errors(), steps.RefreshError, steps.RetrainCommitError,
            steps.JudgeFailedUnpushed)  # the gate's task has logged its own traceback


@task(cache_policy=NO_CACHE)
def pick_up(params: Params):
    return steps.pick_up(params.retrain)


@task(cache_policy=NO_CACHE)
def stage(files, params: Params, staging: Path) -> steps.Staged:
    return steps.stage(files, params, staging)


@task(cache_policy=NO_CACHE)
def train(params: Params, staged: steps.Staged, staging: Path) -> steps.Trained:
    with nested_run("train", tags={"tqc.stage": "retrain.train"}) as tracker:
        # each stage's curves at step = epoch, as a dvc repro's stage runs have them
        trained = steps.train(params, staged, staging, on_epoch=lambda stage, record: tracker.on_epoch(stage)(record))
        tracker.log_metrics({"stage_two.best_validation_macro_f1": trained.validation_macro_f1})
    return trained


@task(cache_policy=NO_CACHE)
def refresh(params: Params, staged: steps.Staged, staging: Path) -> steps.Trained:
    return steps.refresh(params, staged, staging)


@task(cache_policy=NO_CACHE)
def judge(params: Params, trained: steps.Trained, staging: Path) -> dict:
    from tqc.stages import promote

    source = trained.refreshed_from.version if trained.refreshed_from else None  # the version a refresh serves
    with nested_run("promote", tags={"tqc.stage": "promote"}) as tracker:
        report = promote.run(trained.data, trained.model, trained.prior, params.promote, staging / "promotion.json", tracker,
                             params.seed, params.evaluate.exemplar_k, refresh=source is not None, refreshed_from=source)
    if source is not None and report.get("challenger_version"):  # also when a retry found it registered
        steps.tag_refresh(params.promote.model_name, report["challenger_version"], source)
    return report


def retry_unless_permanent(task, task_run, state) -> bool:
    """Prefect's retry condition: a step that failed for a reason a retry cannot change is not retried: no champion
    to refresh, bad params, unreadable or invalid data, a prior file that cannot serve the model, a package the
    worker lacks (FAISS, which the train step loads first: a failed import fails again in the same process), a
    champion the registry cannot serve (`registry_errors`: its artifacts gone or unloadable). Each would fail again
    the same way, after `retry_delay_seconds` each time. The last may also be an artifact store that stayed
    unreachable, but the registry's clients (MLflow's HTTP requests, boto3) have retried the connection for minutes
    before it fails, so a retry 10 s later, promote's whole judging again, would not change it either; the challenger
    stays pending (judge-pending.json) and the next run judges it first, once the champion is repaired or the store
    is back."""
    return not isinstance(state.result(raise_on_failure=False),
                          (steps.RefreshError, ImportError, *input_errors(), *registry_errors()))


@task(cache_policy=NO_CACHE)
def commit(params: Params, staged: steps.Staged, files, repeats, challenger: steps.Trained | None = None) -> dict:
    return steps.commit(params, staged, files, repeats, challenger)


@flow(name="retrain", log_prints=True)
def retrain(params_path: str = "params.yaml", mode: RetrainMode | None = None) -> dict:
    """Returns what happened: {"status": "nothing to do" | "retrained" | "no rows accepted" | "busy", …}; a run whose
    new data version did not reach the DVC remote fails (`retrain.on_push_failure: fail`) with `steps.PushFailed`,
    whose `result` is that dict; so does one whose push of the version the last run could not push failed again
    (`pending_dvc`), and one whose gate also raised fails with `steps.JudgeFailedUnpushed`, naming both.

    `mode`: "train" or "refresh" for this run, instead of params.yaml's `retrain.mode` (one deployment
    can then refresh often and train now and then: `prefect deployment run … -p mode=refresh`)."""
    offline_mlflow()
    logger = get_run_logger()
    with stage_logs_in_this_run():
        return _retrain(params_path, mode, logger)


def _retrain(params_path: str, mode: RetrainMode | None, logger) -> dict:
    try:
        params = load_params(params_path, {"retrain": {"mode": mode}} if mode else None)
        retries = {"retries": params.retrain.retries, "retry_delay_seconds": params.retrain.retry_delay_seconds,
                   "retry_condition_fn": retry_unless_permanent}
        with steps.retrain_lock(params.retrain):
            result = _retrain_locked(params, retries, logger)
    except steps.RetrainBusy as busy:  # not a failure: the files wait in the inbox for the next run
        logger.warning("retrain: %s; this run did nothing", busy)
        return {"status": "busy"}
    except user_errors() as error:
        # The flow run fails with the reason as its message, not a second traceback through Prefect's flow engine
        # (a task that raised it has logged its own); a caller (a test, `python flows/retrain.py`) still gets it.
        logger.error("retrain: %s", error)
        return Failed(message=str(error), data=error)
    return _unless_unpushed(result, params.retrain.on_push_failure, logger)


def _unless_unpushed(result: dict, on_push_failure: str, logger) -> dict | State:
    """The run's result; or, where its new data version did not reach the DVC remote and `retrain.on_push_failure` is
    `fail`, a Failed state that says so and carries the result (`steps.PushFailed`). Nothing is undone: the data stays
    committed, the gate's decision stands. A run that completed with the data unpushed went unnoticed by cron and by a
    Prefect automation on failed runs, while other checkouts could not `dvc pull` what the challenger was trained on."""
    failure = steps.push_failure(result)
    if failure is None or on_push_failure == "warn":
        return result
    logger.error("retrain: %s", failure)
    return Failed(message=failure, data=steps.PushFailed(failure, result))


@contextlib.contextmanager
def stage_logs_in_this_run():
    """The stages' own lines (rows read and quarantined, each epoch's validation figures, where they wrote) in this
    flow run's logs, on the console and in Prefect's API. Under Prefect's logging config the root logger is at
    WARNING, so the `tqc` logger, its level unset, dropped every INFO line, and only loggers Prefect knows send to its
    API. For this run only: a level set on `tqc` before is kept, and a handler already sending `tqc` to the API
    (PREFECT_LOGGING_EXTRA_LOGGERS=tqc) is not doubled. A line logged from a thread with no run context is still this
    run's (the readers of a launched stage's lines run in a copy of the flow's context: tqc.launched)."""
    from prefect.context import get_run_context
    from prefect.logging.handlers import APILogHandler

    stage_logger, flow_run_id = logging.getLogger("tqc"), get_run_context().flow_run.id
    level = stage_logger.level
    if level == logging.NOTSET:
        stage_logger.setLevel(logging.INFO)
    added = None
    if not any(isinstance(handler, APILogHandler) for handler in stage_logger.handlers):
        added = APILogHandler()
        added.addFilter(_of_run(flow_run_id))
        stage_logger.addHandler(added)
    try:
        yield
    finally:
        if added is not None:
            stage_logger.removeHandler(added)
        stage_logger.setLevel(level)


def _of_run(flow_run_id):
    """A line from a thread with no run context of its own is this run's; one with a context (a task's) keeps it, so
    the UI shows it under its task."""
    from prefect.context import get_run_context
    from prefect.exceptions import MissingContextError

    def mark(record: logging.LogRecord) -> bool:
        if getattr(record, "flow_run_id", None) is None:
            try:
                get_run_context()
            except MissingContextError:
                record.flow_run_id = flow_run_id
        return True
    return mark


@contextlib.contextmanager
def retrain_run(params: Params, tags: dict):
    """The flow run's MLflow run, with the params it ran with and its code's commit, as a `dvc repro`'s parent run has
    them: without them nothing told what a retrain's challenger was trained with."""
    with standalone_run("retrain", params.tracking, tags={"tqc.kind": "retrain", **tags}) as run:
        if run.active:
            run.set_tags({COMMIT_TAG: git_commit()})
            run.log_params(run_params(params))
        yield run


def _retrain_locked(params: Params, retries: dict, logger) -> dict:
    """The flow's steps, under the retrain lock: first a commit a killed run left half made is put back (its
    challenger's mark with it), then a challenger the last run committed but did not judge is judged."""
    steps.roll_back_interrupted_commit(params.retrain)
    # Before the gate, which may fail again or give its challenger up: the version's push is owed either way
    repushed = steps.push_pending_version(params.retrain)
    pending = {"pending_dvc": repushed} if repushed else {}
    unjudged = _judge_pending(params, retries, logger, pending)
    result = {**_retrain_new_files(params, retries, logger), **pending}
    return {**result, "pending_challenger_promoted": unjudged["promoted"]} if unjudged else result


@contextlib.contextmanager
def naming_unpushed(result: dict):
    """A gate that raises in a run whose data version is not on the DVC remote (`steps.push_failure` of `result`)
    fails the run naming both (`steps.JudgeFailedUnpushed`): the gate's error alone hid the unpushed data, and the next
    run, judging the challenger, completed without a word of it, so cron never learnt the remote lacked the data."""
    try:
        yield
    except Exception as error:
        unpushed = steps.push_failure(result)
        if unpushed is None:
            raise
        raise steps.JudgeFailedUnpushed(f"{error}; and {unpushed}") from error


def _judge_pending(params: Params, retries: dict, logger, pending: dict) -> dict | None:
    """The challenger the last run committed but did not judge, judged; `pending`: `pending_dvc`, its data version
    pushed again (`steps.push_pending_version`), which a failure names."""
    unjudged = steps.pending_judge(params.retrain)
    if unjudged is None:
        return None
    logger.warning("retrain: the last run committed its data but did not judge its challenger (%s); judging it first",
                   unjudged.model)
    with naming_unpushed(pending):
        try:
            with retrain_run(params, {"tqc.retrain.judge": "pending"}):
                promotion = judge.with_options(**retries)(params, unjudged, Path(params.retrain.work_dir))
        except input_errors() as error:
            # It would fail the same way every run, and block every delivery after it: given up, said, and the run goes
            # on (a later delivery trains on the committed data anyway)
            steps.clear_pending_judge(params.retrain)
            logger.error("retrain: the pending challenger %s cannot be judged, and is given up: %s", unjudged.model, error)
            return None
        except Exception as error:  # the registry down again: kept for the next run, which tries it first
            logger.error("retrain: judging the pending challenger failed; %s keeps it for the next run: %s",
                         steps.pending_judge_path(params.retrain), error)
            raise
    steps.clear_pending_judge(params.retrain)
    shutil.rmtree(params.retrain.work_dir, ignore_errors=True)  # before new files are staged there
    logger.info("retrain: the pending challenger was %s", "promoted" if promotion["promoted"] else "not promoted")
    return promotion


def _retrain_new_files(params: Params, retries: dict, logger) -> dict:
    files, repeats = pick_up(params)
    if not files and not repeats:
        logger.info("retrain: no new files in %s; nothing to do", params.retrain.inbox)
        return {"status": "nothing to do"}
    staging = Path(params.retrain.work_dir)
    staged = stage(files, params, staging) if files else steps.Staged(staging / "raw")
    if not staged.accepted:
        result = commit(params, staged, files, repeats)  # archives the files; the data is unchanged
        logger.info("retrain: no row accepted from %d file(s) (%s); nothing to train", len(files) + len(repeats),
                    steps.why_nothing_was_accepted(staged, repeats, Path(params.retrain.quarantine)))
        create_markdown_artifact(steps.summary_markdown(staged, None, None, repeats), key="retrain-summary")
        return {"status": "no rows accepted", "new_files": len(files), "repeats": len(repeats), **result}
    with retrain_run(params, {"tqc.retrain.mode": params.retrain.mode}):
        renew = refresh if params.retrain.mode == "refresh" else train  # refresh: the exemplar rule, no training
        trained = renew.with_options(**retries)(params, staged, staging)
        # The data version before the champion: a commit that fails leaves both as they were. One that completes
        # leaves the challenger marked for the gate (judge-pending.json), so a run killed from here on (the
        # commit task's end reported to Prefect's server, the judge) has the next run judge it.
        result = commit(params, staged, files, repeats, trained)
        with naming_unpushed(result):
            promotion = judge.with_options(**retries)(params, trained, staging)
        steps.clear_pending_judge(params.retrain)
    create_markdown_artifact(steps.summary_markdown(staged, promotion, trained, repeats, result), key="retrain-summary",
                             description="rows accepted and the challenger against the champion")
    shutil.rmtree(staging, ignore_errors=True)
    logger.info("%s", steps.closing_line(staged, promotion, result, Path(params.retrain.quarantine)))
    return {"status": "retrained", "mode": params.retrain.mode, "accepted": staged.accepted - staged.new_classes,
            "new_classes": staged.new_classes, "promoted": promotion["promoted"], **result}


def _arguments(argv: list[str] | None = None):
    """The flow's parameters from the command line (defaults: the flow's own). They were not read: `--mode refresh`
    trained, and `--help` ran a retrain."""
    import argparse
    from typing import get_args

    parser = argparse.ArgumentParser(description="one retrain of the inbox's new files (docs/retrain.md)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--mode", choices=get_args(RetrainMode),
                        help="this run's retrain.mode (default: the params file's)")
    parser.add_argument("--serve", action="store_true", help="run the flow on a schedule (--cron or --interval) in this "
                        "process until stopped, with no work pool or worker; needs a Prefect server (PREFECT_API_URL)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--cron", help="with --serve: a cron expression, UTC (e.g. '0 2 * * *', nightly at 02:00)")
    when.add_argument("--interval", type=float, help="with --serve: seconds from one run's start to the next's")
    arguments = parser.parse_args(argv)
    if arguments.serve != (arguments.cron is not None or arguments.interval is not None):
        parser.error("--serve takes a schedule, --cron or --interval, and they mean nothing without it")
    if arguments.interval is not None and not _schedulable(arguments.interval):
        parser.error(f"--interval {arguments.interval:g}: the seconds between runs must be more than 0, and finite")
    if arguments.cron is not None and not _valid_cron(arguments.cron):
        parser.error(f"--cron {arguments.cron!r}: not a cron expression (five fields, e.g. '0 2 * * *')")
    return arguments


def _valid_cron(expression: str) -> bool:
    """Whether Prefect's schedule takes `expression`: its ValidationError was a traceback in place of the usage's line."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=expression)
    except ValidationError:
        return False
    return True


def _schedulable(seconds: float) -> bool:
    """Whether `seconds` is an interval a schedule holds: more than 0, and a timedelta (nan, inf or 1e300 raised
    timedelta's own error out of Prefect, a traceback in place of the usage's line)."""
    from datetime import timedelta

    try:
        return timedelta(seconds=seconds) > timedelta(0)
    except (ValueError, OverflowError):
        return False


SERVED = "retrain-served"  # the deployment `--serve` registers, beside prefect.yaml's retrain-nightly


def serve_on_schedule(arguments) -> None:
    """`--serve`: Prefect's `serve`, this process running each scheduled run itself (one at a time), no work pool or
    worker. The runs are made by a Prefect server's scheduler, which the embedded default lacks (Prefect would only
    warn, and serve forever with nothing scheduled), so without PREFECT_API_URL it stops, saying what to do."""
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise SystemExit("retrain --serve: PREFECT_API_URL is not set, and a schedule needs a Prefect server's scheduler: "
                         "start one (prefect server start) and export PREFECT_API_URL=http://127.0.0.1:4200/api, or "
                         "run `python flows/retrain.py` from cron instead (docs/retrain.md)")
    parameters = {"params_path": arguments.params, **({"mode": arguments.mode} if arguments.mode else {})}
    serve(retrain.to_deployment(name=SERVED, cron=arguments.cron, interval=arguments.interval, parameters=parameters),
          limit=1)


def main(argv: list[str] | None = None) -> None:
    """`python flows/retrain.py`: one run; a failure whose message is the whole story exits with that line alone.
    With --serve, runs on a schedule until stopped (`serve_on_schedule`)."""
    arguments = _arguments(argv)
    # Offline, the embedded server's usage report logs an ERROR at each start; a user's own setting stands
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if arguments.serve:
        return serve_on_schedule(arguments)
    try:
        outcome = retrain(arguments.params, arguments.mode)
    except user_errors() as error:  # said in the run's log already
        raise SystemExit(f"retrain failed: {error}") from None
    except steps.PushFailed as unpushed:  # the run's work stands; the remote lacks its data (said in the log too)
        raise SystemExit(f"retrain: {unpushed}") from None
    if outcome["status"] == "no rows accepted" and outcome["new_files"]:  # new files that added nothing want a look:
        # a non-zero exit for cron (a delivery of repeats only is no fault)
        raise SystemExit("retrain: no row of the delivery was accepted; data/archive/manifest.jsonl and the quarantine "
                         "say why")


if __name__ == "__main__":
    main()
