"""The `tune` flow: the Optuna study of `tqc tune`, its workers run in parallel as Prefect tasks.

    python flows/tune.py                          # locally: 2 workers share the study in tune.storage
    python flows/tune.py --workers 1 --trials 2   # a first, small try (--set KEY=VALUE, --params, --out, --work too)

Each task is one `tqc tune --worker i` process (separate processes, so trials really run in
parallel); they share one study through `tune.storage`, and each writes the reports from the whole study
under a file lock beside `out` (`tqc.tuning.reports.reports_lock`), so the last writer's reports hold every worker's trials.
"""

from __future__ import annotations

import logging
import os
import sys

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError
from prefect.states import Failed

from tqc.arguments import parse_overrides
from tqc.config import ConfigError, holds_password, load_params, redact_text
from tqc.launched import run_logging_lines


@task(cache_policy=NO_CACHE)
def tune_worker(params_path: str, worker: int, trials: int, overrides: list[str], out: str, work: str) -> str:
    command = [sys.executable, "-m", "tqc.cli", "--params", params_path, *sum((["--set", o] for o in overrides), []),
               "tune", "--worker", str(worker), "--trials", str(trials), "--out", out, "--work", work,
               "--parent-pid", str(os.getpid())]  # it ends with this process (a cancelled run's), its trial failed
    returncode, stdout, stderr = run_logging_lines(command, _logger(), f"tune worker {worker}", worker_environment(worker))
    if returncode != 0:
        raise RuntimeError(f"tune worker {worker} failed:\n" + "\n".join(stderr))
    return stdout[-1] if stdout else ""


def worker_environment(worker: int, gpus: int | None = None) -> dict[str, str] | None:
    """Worker i's environment on a machine with several GPUs: GPU i mod count alone visible to it, so the workers
    spread over the machine's GPUs instead of all training on the first (None: this process's environment).
    Where the worker's starter listed GPUs (CUDA_VISIBLE_DEVICES=2,3 under Slurm or Kubernetes), they spread over
    those; one listed GPU, or none (the CPU), is kept as it is."""
    listed = [device for device in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if device.strip()]
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return {**os.environ, "CUDA_VISIBLE_DEVICES": listed[worker % len(listed)].strip()} if len(listed) > 1 else None
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    if gpus <= 1:
        return None
    return {**os.environ, "CUDA_VISIBLE_DEVICES": str(worker % gpus)}


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:  # the task's function called outside a flow run, as a script or test may
        return logging.getLogger(__name__)


@flow(name="tune", log_prints=True)
def tune(params_path: str = "params.yaml", workers: int = 2, trials_per_worker: int | None = None,
         overrides: list[str] | None = None, out: str = "reports/tuning", work: str = "tuning") -> list[str]:
    """`overrides`: KEY=VALUE params for the study, as `tqc --set` takes them; each worker runs
    `trials_per_worker` trials, by default `tune.trials` (a per-worker count, as for `tqc tune`). A count below 1 fails
    the run in one line naming it, before any worker starts, as the script and `tqc tune --trials` refuse it."""
    try:
        _no_credentials(overrides or [])
        _at_least_one("workers", workers)
        if trials_per_worker is not None:
            _at_least_one("trials_per_worker", trials_per_worker)
        params = load_params(params_path, parse_overrides(overrides or []))  # as each worker reads them: study, trials
    except ConfigError as error:  # the run fails with the key and the reason as its message, as the retrain flow's
        get_run_logger().error("tune: %s", error)
        return Failed(message=str(error), data=error)
    trials = params.tune.trials if trials_per_worker is None else trials_per_worker
    futures = [tune_worker.submit(params_path, i, trials, overrides or [], out, work) for i in range(workers)]
    results = [f.result() for f in futures]
    # each worker's last line names the study it ran (with tune.on_new_data new_study, one named by the data's digest)
    get_run_logger().info("tune: %d workers × %d trials: %s", workers, trials, results)
    return results


def _no_credentials(overrides: list[str]) -> None:
    """A flow run's parameters are Prefect's: its server keeps and shows them as given, and each worker's --set would
    put them on a command line any user of the machine can list. An override holding a password or token is refused,
    shown redacted, with where to put it instead."""
    held = [redact_text(override) for override in overrides if holds_password(override)]
    if held:
        raise ConfigError(f"overrides {held}: a password or token in a flow's parameters is kept and shown by Prefect "
                          "as given; set it in params.yaml, in the environment (MLFLOW_TRACKING_URI, "
                          "MLFLOW_TRACKING_TOKEN) or in the database client's own store (PGPASSWORD, ~/.pgpass), "
                          "and name the server without it")


def _at_least_one(name: str, count: int) -> None:
    """A count as `python flows/tune.py` and `tqc tune --trials` take it (tqc.arguments.at_least_one): a deployment's 0 workers
    would run nothing and succeed, and 0 trials a worker fall back to tune.trials, neither what was asked."""
    import argparse

    from tqc.arguments import at_least_one

    try:
        at_least_one(str(count))
    except argparse.ArgumentTypeError as error:
        raise ConfigError(f"{name}: {error}") from None


def _arguments(argv: list[str] | None = None):
    """The flow's parameters from the command line, as the deployment gives them (defaults: the flow's own)."""
    import argparse

    from tqc.arguments import at_least_one

    parser = argparse.ArgumentParser(description="the Optuna study of tqc tune, its workers in parallel")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--workers", type=at_least_one, default=2, help="worker processes sharing the study (default 2)")
    parser.add_argument("--trials", type=at_least_one, help="trials per worker (default tune.trials)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a param for the study, as tqc --set")
    parser.add_argument("--out", default="reports/tuning")
    parser.add_argument("--work", default="tuning")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """`python flows/tune.py`: bad params or --set values exit with their reason alone, not a traceback."""
    # Offline, the embedded server's usage report logs an ERROR at each start; a user's own setting stands
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    arguments = _arguments(argv)
    try:
        tune(arguments.params, arguments.workers, arguments.trials, arguments.overrides, arguments.out, arguments.work)
    except ConfigError as error:  # said in the run's log already
        raise SystemExit(f"tune failed: {error}") from None


if __name__ == "__main__":
    main()
