"""MLflow tracking, set up by the entry points only (the CLI, the tuner, the flows), never at import.

One `dvc repro` is one *parent* run; each stage that trains or evaluates is a nested run in
it. DVC runs every stage as its own process, so a stage finds its parent by the `dvc`
process above it (its pid and start time, tagged on the parent run): the first tracked stage
of a repro creates the parent, the others join it. `TQC_PARENT_RUN_ID` pins the parent
explicitly, for a caller that owns a run and starts the stage commands under it (a scheduler of its own); the
Prefect flows call the stage functions in their own process and nest under their own runs, so they need none.

The store is `tracking.uri`, else `$MLFLOW_TRACKING_URI`, else the local `sqlite:///mlflow.db`:
no server to start, and the same runs go to a shared server by configuration alone.

A process killed with SIGKILL (or by the OOM killer) never ends its runs, and MLflow would show them
RUNNING for good. Each run is tagged with its process (`this_process`: host, boot and pid namespace,
pid, start); whenever a run starts, RUNNING runs of the same host, boot and namespace whose process is
gone are ended as KILLED. Others are left alone: nothing here can tell whether their process lives.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import socket
import subprocess
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import quote

from tqc import distributed
from tqc.config import (STAGE_PARAMS, ConfigError, Params, TrackingParams, flatten, redact_secrets, redact_text,
                        selected)
from tqc.io import file_digest

log = logging.getLogger(__name__)

LOCAL_STORE = "sqlite:///mlflow.db"
PARENT_ENV = "TQC_PARENT_RUN_ID"
PIPELINE_TAG, REPRO_TAG, PARAMS_TAG, COMMIT_TAG = "tqc.kind", "tqc.repro", "tqc.params_hash", "tqc.git_commit"
OWNER_TAG = "tqc.process"  # this_process() of the process a run is RUNNING in
FAILED_STAGE_TAG = "tqc.failed_stage"  # on a pipeline run: a stage of its repro that failed (the last such)


def tracking_uri(params: TrackingParams) -> str:
    return params.uri or os.environ.get("MLFLOW_TRACKING_URI") or LOCAL_STORE


def chosen_by(params: TrackingParams, where: str = "tracking.uri") -> str:
    """The setting that chose `tracking_uri(params)`, which an error about that store names: `where` (tracking.uri,
    of which file), else $MLFLOW_TRACKING_URI; neither chose the local store, which either would replace."""
    if params.uri:
        return where
    return "$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else f"{where} (or $MLFLOW_TRACKING_URI)"


def sqlite_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///` store (None for any other store)."""
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0]) if uri.startswith("sqlite:///") else None


def existing_registry(uri: str, setting: str) -> str:
    """`uri`, where it names a store that is there to read: MLflow would create an empty SQLite database (and its
    folders) in place of a missing one, and then report every version missing. A database that does not answer is
    said at once (`answering`). Errors name `setting`, what chose the URI (`--tracking-uri`, `tracking.uri`,
    `$MLFLOW_TRACKING_URI`), which is what a user changes."""
    database = sqlite_file(uri)
    if database is not None and not database.is_file():
        raise ConfigError(f"no registry at {uri}: no file {database} (promote registers models there; {setting} "
                          "chose it)")
    return answering(uri, way_out=f"point {setting} at the registry promote registers in", setting=setting)


SETTING = "tracking.uri (or $MLFLOW_TRACKING_URI)"
TRACKING_OFF = "or turn tracking off with tracking.enabled=false"
STORE_WAY_OUT = f"point tracking.uri at a store that answers, {TRACKING_OFF}"  # what a stage or tune is told
CONNECT_SECONDS = 10  # a database's answer to a connection; a closed port answers at once


def answering(uri: str, way_out: str, setting: str = SETTING) -> str:
    """`uri`, where it names a database (SQLite, PostgreSQL, MySQL, SQL Server) that takes a connection within
    CONNECT_SECONDS. MLflow's own engine retries a failed connection 10 times with a growing wait (~100 s, no setting
    bounds it; each try also waits on the driver's own timeout, none for a host that drops packets) before its error,
    which names neither the setting nor the way out: a command against a server that is down hung that long. Another
    store (an MLflow server) is left to MLflow, whose retries tqc bounds (`offline_mlflow`). Errors name `setting`,
    what chose `uri`."""
    from mlflow.exceptions import MlflowException

    engine_name = _engine_name(uri)
    if engine_name is None:
        return uri
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    said = redact_text(uri)
    try:
        engine = sqlalchemy.create_engine(uri, poolclass=NullPool)
        bound = connect_timeout_args(engine.dialect.driver)  # the driver is known once the engine is made
        if bound:
            engine = sqlalchemy.create_engine(uri, poolclass=NullPool, connect_args=bound)
    except ImportError as exc:  # the URL is right, its driver not installed: installing it is the way out
        raise ConfigError(f"{setting} {said}: its database driver is not installed ({exc}); for PostgreSQL "
                          f"pip install -e '.[server]', else {way_out}") from None
    except Exception as exc:  # a URL SQLAlchemy cannot read (a port that is not a number, an unknown dialect)
        raise ConfigError(f"{setting} {said}: not a database URL SQLAlchemy reads ({_one_line(exc)}); {way_out}") from None
    try:
        with engine.connect():
            pass
    except Exception as exc:  # refused, timed out, a wrong password, a SQLite file that cannot be opened
        # MlflowException, as MLflow's own error was: a server that is down may be up when the command runs again
        start = "" if engine_name == "sqlite" else "start it, or "
        # "gives", not "waited": a closed port refuses at once, a host that drops packets takes the whole time
        raise MlflowException(f"{setting} {said}: no connection to the database (tqc gives a database "
                              f"{CONNECT_SECONDS} s to answer: {_one_line(getattr(exc, 'orig', None) or exc)}); "
                              f"{start}{way_out}") from exc
    finally:
        engine.dispose()
    return uri


def _engine_name(uri: str) -> str | None:
    """The database `uri` names, which MLflow opens itself (sqlite, postgresql, mysql, mssql: a `+driver` aside); None
    for a tracking server or a path."""
    from mlflow.store.db.db_types import DATABASE_ENGINES

    name = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else None
    return name if name in DATABASE_ENGINES else None


# The connect_args key of each driver's connection timeout, in seconds (SQLite's waits on a locked file)
CONNECT_TIMEOUT = {"psycopg2": "connect_timeout", "psycopg": "connect_timeout", "pg8000": "timeout",
                   "mysqldb": "connect_timeout", "pymysql": "connect_timeout", "mysqlconnector": "connection_timeout",
                   "pyodbc": "timeout", "pymssql": "login_timeout", "pysqlite": "timeout"}


def connect_timeout_args(driver: str) -> dict:
    """The connect_args that give a database CONNECT_SECONDS to answer, for a SQLAlchemy driver name ({} for one
    not in CONNECT_TIMEOUT): each driver names its timeout its own way."""
    key = CONNECT_TIMEOUT.get(driver)
    return {key: CONNECT_SECONDS} if key else {}


def _one_line(error: BaseException) -> str:
    return redact_text(" ".join(str(error).split()))[:500]


def _store_that_can_be_made(uri: str) -> str:
    """`uri`, where a store can be made there: a SQLite file's folder must exist (a misspelt path would otherwise get
    a new, empty store, and `mlruns/` beside it, wherever it points), and a folder (MLflow's file store, a misspelt
    URI such as `notaurl` read as one) only where MLFLOW_ALLOW_FILE_STORE keeps it open: MLflow's own refusal names
    neither the key nor the value."""
    database = sqlite_file(uri)
    if database is not None and not database.parent.is_dir():
        raise ConfigError(f"{SETTING} {uri}: no folder {database.parent} to keep the MLflow database in")
    if _file_store(uri) and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        # redacted: a URI MLflow reads as a folder may be a database URL with a typo (postgresql:/user:secret@host)
        raise ConfigError(f"{SETTING} {redact_text(uri)!r}: a folder, MLflow's file store, which MLflow 3 "
                          "opens only with MLFLOW_ALLOW_FILE_STORE=true; give sqlite:///mlflow.db for a file here, "
                          "postgresql://user@host/db, or http://host:5000 for a server")
    return uri


def _file_store(uri: str) -> bool:
    """Whether MLflow reads `uri` as its file store: a path, or a file: URI (not a scheme such as sqlite, http,
    postgresql, or databricks, which takes a profile after a colon)."""
    return uri.startswith("file:") or ("://" not in uri and not uri.startswith("databricks"))


# What makes a result: a run that rewrites dvc.lock or reports/ on its way is not "dirty" for that.
CODE = ("src", "flows", "dvc.yaml", "pyproject.toml")
CODE_AND_CONFIG = (*CODE, "params.yaml")


def git_commit(paths: tuple[str, ...] = CODE_AND_CONFIG) -> str:
    """HEAD, with '-dirty' when `paths` (the code and config) differ from it; 'unknown' outside a git checkout.
    `CODE` alone asks about the code: inside `dvc exp run -S`, params.yaml always differs (the values it sets)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *paths],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def code_version() -> str:
    """The code's version as the tuner records it with each trial: `git_commit(CODE)`, and where that is '-dirty' a
    digest of the edits (`git diff HEAD` of CODE's paths), since '-dirty' alone names no code: one edited tree run twice
    is one version, two edits of one commit are two. Untracked files count no more than git_commit counts them."""
    version = git_commit(CODE)
    if not version.endswith("-dirty"):
        return version
    try:
        edits = subprocess.run(["git", "diff", "--binary", "HEAD", "--", *CODE], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{version}:{hashlib.sha256(edits).hexdigest()[:12]}"


COMMIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # sha1 or sha256 repositories; what git is given, never an option


@functools.lru_cache(maxsize=256)  # a pair's answer never changes: commits are immutable
def same_code(recorded, current: str) -> bool:
    """Whether code of version `recorded` (`code_version`'s, as a trial kept it) trains as `current`'s does: the same
    version, or two commits whose code (CODE's paths) does not differ, since a docs-only commit moves HEAD, not the
    code. Never where either is 'unknown' or not recorded, nor a commit this checkout does not hold."""
    if not isinstance(recorded, str) or "unknown" in (recorded, current):
        return False
    if recorded == current:
        return True
    if not (COMMIT_ID.fullmatch(recorded) and COMMIT_ID.fullmatch(current)):  # an edited tree matches itself alone
        return False
    try:
        return subprocess.run(["git", "diff", "--quiet", recorded, current, "--", *CODE],
                              capture_output=True).returncode == 0
    except OSError:
        return False


def dvc_md5(path: Path) -> str:
    """The hash DVC records for `path` in dvc.lock: md5 of a file, or of a directory's listing + '.dir'."""
    path = Path(path)
    if path.is_file():
        return _file_md5(path)
    entries = sorted(({"md5": _file_md5(f), "relpath": f.relative_to(path).as_posix()} for f in path.rglob("*") if f.is_file()),
                     key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode("utf-8")).hexdigest() + ".dir"


def _file_md5(path: Path) -> str:
    return file_digest(path, "md5")


def run_params(params: Params) -> dict:
    """What a run records as its params: every section but the search space, database passwords as `***`."""
    return redact_secrets(params.model_dump(mode="json", by_alias=True, exclude={"tune"}))


def params_hash(params: Params) -> str:
    tracked = params.model_dump(mode="json", by_alias=True, exclude={"tracking", "tune"})
    return hashlib.sha256(json.dumps(tracked, sort_keys=True).encode()).hexdigest()[:16]


class Tracker:
    """What a stage logs; the no-op version (tracking disabled) has the same interface."""

    def __init__(self, mlflow_module=None):
        self._mlflow = mlflow_module

    @property
    def active(self) -> bool:
        return self._mlflow is not None

    def on_epoch(self, prefix: str):
        """A `fit` callback that logs each epoch's loss and validation metrics at step=epoch."""

        def log_epoch(record) -> None:
            values = {k: v for k, v in asdict(record).items() if k != "epoch" and v == v}  # NaN loss at epoch 0
            self.log_metrics({f"{prefix}.{k}": v for k, v in values.items()}, step=record.epoch)

        return log_epoch

    def log_metrics(self, metrics: dict, step: int | None = None, prefix: str = "") -> None:
        if self._mlflow:
            numeric = {mlflow_key(f"{prefix}{k}"): float(v) for k, v in flatten(metrics).items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            self._mlflow.log_metrics(numeric, step=step)

    def log_params(self, params: dict) -> None:
        if self._mlflow:
            for chunk in param_chunks(params):
                self._mlflow.log_params(chunk)

    def log_inputs(self, paths: list[Path]) -> None:
        """DVC's hash of each input, as tags `dvc.<path>`: the exact data a run read."""
        if self._mlflow:
            self.set_tags({f"dvc.{Path(p).as_posix()}": dvc_md5(Path(p)) for p in paths if Path(p).exists()})

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if self._mlflow and Path(path).exists():
            path = Path(path)
            if path.is_dir():
                self._mlflow.log_artifacts(str(path), artifact_path or path.name)
            else:
                self._mlflow.log_artifact(str(path), artifact_path)

    def set_tags(self, tags: dict) -> None:
        if self._mlflow:
            self._mlflow.set_tags({mlflow_key(k): str(v) for k, v in tags.items()})


def mlflow_key(name: str) -> str:
    """`name` as MLflow accepts a param, metric or tag key on any OS: letters, digits, `_ - . /` and spaces; anything else
    becomes `_`. Keys carry a user's names (an input folder `data (v2)`, an ablation variant `eda+mixup`), and one
    MLflow refuses stopped the whole stage before it did any work."""
    return re.sub(r"[^\w\-. /]", "_", name)


def param_chunks(params: dict, size: int = 100) -> list[dict[str, str]]:
    """Nested params as flat 'section.key' strings, in chunks of MLflow's batch limit."""
    items = [(mlflow_key(k), json.dumps(v) if isinstance(v, (list, dict)) else str(v)) for k, v in flatten(params).items()]
    return [dict(items[start : start + size]) for start in range(0, len(items), size)]


def mlflow_without_telemetry() -> None:
    """MLflow 3 sends usage records to its own servers unless told not to, and writes ~/.config/mlflow on import: tqc
    never needs the network, so it says not to before MLflow is imported. A user's own MLFLOW_DISABLE_TELEMETRY or
    DO_NOT_TRACK setting stands."""
    if "DO_NOT_TRACK" not in os.environ:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def offline_mlflow() -> None:
    """What every entry point (the CLI, the flows, the first tracked call) sets before MLflow is imported: no telemetry
    (`mlflow_without_telemetry`), and a bound on how long a tracking server that does not answer is retried. Not at
    import: the retry bound would change a notebook's own MLflow client."""
    mlflow_without_telemetry()
    # A tracking server that is down: MLflow's own default (7 retries, back-off to 120 s) held a command for minutes
    # before its one-line error. Two quick retries ride out a server's restart; a user's own settings stand
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")


def _client_and_experiment(params: TrackingParams):
    offline_mlflow()
    import mlflow

    uri = answering(_store_that_can_be_made(tracking_uri(params)), way_out=STORE_WAY_OUT)
    mlflow.set_tracking_uri(uri)
    first_call(lambda: mlflow.get_experiment_by_name(params.experiment), uri, SETTING, "the store could not be opened",
               f"point tracking.uri at one that opens, {TRACKING_OFF}")
    _create_beside_the_database(mlflow, params.experiment, uri)
    experiment = mlflow.set_experiment(params.experiment)
    client = mlflow.MlflowClient()
    try:
        end_orphaned_runs(client, experiment.experiment_id)
    except Exception as exc:  # housekeeping: a store that refuses it (the filter, another user's run) stops no stage
        log.warning("mlflow: could not end the runs of killed processes: %s", redact_text(" ".join(str(exc).split()))[:300])
    return mlflow, client, experiment.experiment_id


def first_call(call: Callable[[], object], uri: str, setting: str, failed: str, way_out: str) -> None:
    """A command's first call to the store at `uri`, whose failure is the store's (a server that is down, a scheme
    MLflow has no store for, a database MLflow cannot set up): said in one line naming `setting`, the one that chose
    the URI, and `way_out`, which MLflow's own error, quoting the URI alone, left the user to find. Still an
    MlflowException, as MLflow's was: a server that is down may be up when the command runs again."""
    from mlflow.exceptions import MlflowException

    try:
        call()
    except Exception as exc:
        raise MlflowException(f"{setting} {redact_text(uri)}: {failed} ({_one_line(exc)}); {way_out}") from exc


def _create_beside_the_database(mlflow, experiment: str, uri: str) -> None:
    """A new experiment of a SQLite store keeps its artifacts (logged models, reports) in `mlruns/<experiment>/` beside
    the database file. MLflow's own default is `./mlruns/<id>` of whatever folder the process runs in: a store in another
    folder (a test's, a second project's) wrote its models into this checkout's `mlruns/`. An experiment made before
    keeps its location. Servers and other stores choose their own artifact root."""
    if not uri.startswith("sqlite:///") or mlflow.get_experiment_by_name(experiment) is not None:
        return
    from mlflow.exceptions import MlflowException

    database = sqlite_file(uri)
    artifacts = (database.parent.resolve() / "mlruns" / quote(experiment, safe="")).as_uri()
    try:
        mlflow.create_experiment(experiment, artifact_location=artifacts)
    except MlflowException:  # another process created it first: its location stands
        if mlflow.get_experiment_by_name(experiment) is None:
            raise


def this_process() -> str:
    """The OWNER_TAG value of this process: `host:space:pid:start`. On Linux `space` is the boot id and the pid
    namespace (two containers may share a hostname, never both) and `start` the process's start in clock ticks
    since boot (a pid alone is reused; a wall-clock start time moves when the clock is stepped). Elsewhere
    `space` is empty and `start` psutil's create time in seconds."""
    return f"{_host_and_space()}:{os.getpid()}:{_start_of(os.getpid())}"


def _host_and_space() -> str:
    return f"{socket.gethostname()}:{_process_space()}"


@functools.cache  # fixed for the life of a process; asked at every run start and for every run it judges
def _process_space() -> str:
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot_id}.{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _start_of(pid: int) -> int:
    """Raises OSError (or psutil's errors) when the process cannot be seen."""
    if _process_space():
        # /proc/<pid>/stat: field 22, starttime; the command name (field 2) may hold spaces, so split after ")"
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    import psutil

    return int(psutil.Process(pid).create_time())


def _process_gone(owner: str) -> bool:
    """True only when this process can tell that the owner's process has ended: same host and space, and no process
    with that pid, or one with another start (the pid reused). Anything it cannot see is taken to be alive."""
    try:
        host, space, pid, start = owner.rsplit(":", 3)
        pid, start = int(pid), int(start)
    except ValueError:
        return False
    if f"{host}:{space}" != _host_and_space():
        return False
    try:
        os.kill(pid, 0)  # signal 0 only asks whether the pid exists, even where /proc hides other users' processes
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, another user's
    try:
        started = _start_of(pid)
    except Exception:  # gone since, or not ours to read: a start we cannot read is no evidence of death
        return False
    # psutil's create time follows the wall clock; elsewhere allow a step of the clock
    return started != start if space else abs(started - start) > 2


def _last_sign_of_life(client, run) -> int:
    """A killed run's end time (ms): its last logged metric, else its start. Nothing records when the process
    died, and the time it was found would make its duration the time until the next run started."""
    logged = [point.timestamp for key in run.data.metrics for point in client.get_metric_history(run.info.run_id, key)]
    return max([run.info.start_time, *logged])


def end_orphaned_runs(client, experiment_id: str) -> list[str]:
    """End as KILLED the RUNNING runs of this experiment whose process, on this host, is gone; returns their ids.
    Their end time is their last logged metric (or their start)."""
    running = client.search_runs([experiment_id], max_results=1000, filter_string=(
        f"attributes.status = 'RUNNING' and tags.`{OWNER_TAG}` LIKE '{_host_and_space().replace(chr(39), '_')}:%'"))
    orphans = [run for run in running if _process_gone(run.data.tags.get(OWNER_TAG, ""))]
    for run in orphans:
        client.set_terminated(run.info.run_id, status="KILLED", end_time=_last_sign_of_life(client, run))
    orphans = [run.info.run_id for run in orphans]
    if orphans:
        log.warning("mlflow: %d run(s) of a process that is gone (killed) were still RUNNING; ended as KILLED: %s",
                    len(orphans), ", ".join(orphans))
    return orphans


def repro_id() -> str:
    """Who ran this stage: the `dvc` process above us (one `dvc repro`), else this process.

    DVC runs each stage as a child process, so every stage of one repro shares that ancestor;
    its pid and start time identify the repro without any state of our own.
    """
    import psutil

    for process in psutil.Process().parents():
        try:
            argv = process.cmdline()
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if _is_dvc(argv):
            return f"dvc-{process.pid}-{int(process.create_time())}"
    me = psutil.Process()
    return f"process-{me.pid}-{int(me.create_time())}"


def _is_dvc(argv: list[str]) -> bool:
    """`dvc …`, `python …/dvc …` or `python -m dvc …`."""
    head = [Path(a).name for a in argv[:2]]
    return "dvc" in head or argv[1:3] == ["-m", "dvc"]


def _pipeline_parent(client, experiment_id: str, params: Params, commit: str) -> str:
    """The run id of this repro's parent run: pinned by the environment, found, or created."""
    if os.environ.get(PARENT_ENV):
        return os.environ[PARENT_ENV]
    repro = repro_id()
    found = client.search_runs([experiment_id], filter_string=f"tags.`{REPRO_TAG}` = '{repro}'", max_results=1)
    if found:
        return found[0].info.run_id
    # Owned from its creation: a process killed before it logs its params leaves a RUNNING run the next repro ends
    run = client.create_run(experiment_id, run_name=f"dvc repro {params.data.dataset}",
                            tags={PIPELINE_TAG: "pipeline", REPRO_TAG: repro, PARAMS_TAG: params_hash(params),
                                  COMMIT_TAG: commit, "dataset": params.data.dataset, OWNER_TAG: this_process()})
    from mlflow.entities import Param

    try:
        for chunk in param_chunks(run_params(params)):
            client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in chunk.items()])
    except BaseException:
        client.set_terminated(run.info.run_id, status="FAILED")
        raise
    log.info("mlflow: new pipeline run %s for %s", run.info.run_id, repro)
    return run.info.run_id


@contextmanager
def stage_run(stage: str, params: Params, inputs: list[Path] = ()) -> Iterator[Tracker]:
    """A nested MLflow run for one pipeline stage, under this repro's parent run.

    The parent is RUNNING while a stage runs and FINISHED after it, so after the repro it is FINISHED, whichever
    stages DVC chose to run; once a stage failed it is FAILED, and stays so when `dvc repro --keep-going` runs an
    independent stage after the failure.
    """
    if not params.tracking.enabled or not distributed.is_main():  # under torchrun, rank 0 records the run
        yield Tracker(None)
        return
    mlflow, client, experiment_id = _client_and_experiment(params.tracking)
    commit = git_commit()
    parent_id = _pipeline_parent(client, experiment_id, params, commit)
    owns_parent = not os.environ.get(PARENT_ENV)
    if owns_parent:  # the owner first: RUNNING with the last stage's (ended) process would look orphaned
        client.set_tag(parent_id, OWNER_TAG, this_process())
        client.update_run(parent_id, status="RUNNING")
    status = "FAILED"
    try:
        with mlflow.start_run(run_name=stage, experiment_id=experiment_id, parent_run_id=parent_id,
                              tags={"tqc.stage": stage, COMMIT_TAG: commit, OWNER_TAG: this_process()}):
            tracker = Tracker(mlflow)
            tracker.log_params(_stage_params(stage, params))
            tracker.log_inputs(list(inputs))
            yield tracker
        status = "FINISHED"
    finally:
        if owns_parent:
            client.set_terminated(parent_id, status=_parent_status(client, parent_id, stage, status))


def _parent_status(client, parent_id: str, stage: str, status: str) -> str:
    """The pipeline run's status after `stage` ended with `status`: a failure marks it, and a marked run stays FAILED."""
    if status == "FAILED":
        client.set_tag(parent_id, FAILED_STAGE_TAG, stage)
        return status
    return "FAILED" if FAILED_STAGE_TAG in client.get_run(parent_id).data.tags else status


def _stage_params(stage: str, params: Params) -> dict:
    """The params a stage's run logs: those it reads (`STAGE_PARAMS`, dvc.yaml's), so that runs compared in MLflow
    differ only in params that could change them (stage two logged all of augment, and promote none of the tracking
    it registers to). The pipeline's run above them logs every section."""
    chosen = selected(run_params(params), STAGE_PARAMS[stage])
    if stage == "baseline_nc":  # the budget it trained with: a null baseline_nc.epochs is ADMC's
        chosen["baseline_nc"] = {**chosen["baseline_nc"], "epochs": params.nc_schedule().epochs}
    if "distributed" in chosen:
        # The processes that trained, which shape the result (stage one's in-batch negatives come from each process's
        # share): under a torchrun the user started (several nodes), distributed.nproc_per_node does not say them
        chosen["distributed"] = {**chosen["distributed"], "world_size": distributed.world_size()}
    return chosen


def check_store(params: TrackingParams) -> None:
    """The store a command will log to can be made or answers (when tracking is on): said before the command's work,
    not after it (tuning prepares its data for minutes before its run opens). It only reads: no database file, table
    or experiment is made here, so workers that start together do not race MLflow's migrations of a new store (the
    run that opens later makes it, as before), and a command that then fails leaves no store behind."""
    if not params.enabled:
        return
    offline_mlflow()  # before MLflow is imported (`_engine_name`)
    uri = _store_that_can_be_made(tracking_uri(params))
    database = sqlite_file(uri)
    if database is not None and not database.exists():  # the folder is there; the run will make the file
        return
    if _engine_name(uri):
        answering(uri, STORE_WAY_OUT)
    elif uri.startswith(("http://", "https://")):  # a tracking server: one read, which makes nothing
        import mlflow

        with _request_timeout(CONNECT_SECONDS):
            first_call(lambda: mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1), uri, SETTING,
                       "the store could not be read", STORE_WAY_OUT)


@contextmanager
def _request_timeout(seconds: int) -> Iterator[None]:
    """MLflow's HTTP read timeout bounded to `seconds` for the probe alone (a user's own MLFLOW_HTTP_REQUEST_TIMEOUT
    stands): its default of 120 s a try made a server that takes the connection and never answers hold every command
    for six minutes before the one-line error. Not set for the run's own calls, whose artifact uploads take time."""
    name = "MLFLOW_HTTP_REQUEST_TIMEOUT"
    if name in os.environ:
        yield
        return
    os.environ[name] = str(seconds)
    try:
        yield
    finally:
        os.environ.pop(name, None)


@contextmanager
def standalone_run(name: str, params: TrackingParams, tags: dict | None = None) -> Iterator[Tracker]:
    """A top-level run outside the pipeline (a tuning study, a flow); nested runs go under it."""
    if not params.enabled:
        yield Tracker(None)
        return
    mlflow, _, experiment_id = _client_and_experiment(params)
    with mlflow.start_run(run_name=name, experiment_id=experiment_id, tags={**(tags or {}), OWNER_TAG: this_process()}):
        yield Tracker(mlflow)


@contextmanager
def nested_run(name: str, tags: dict | None = None) -> Iterator[Tracker]:
    """A run nested in the active one (a tuning trial); no-op when no run is active."""
    try:
        import mlflow
    except ImportError:  # pragma: no cover - mlflow is a dependency
        yield Tracker(None)
        return
    parent = mlflow.active_run()
    if parent is None:
        yield Tracker(None)
        return
    # The parent's experiment, named rather than left to MLflow's active one: a `set_experiment` that loses
    # the race to create the experiment (tune workers starting together on a fresh one) returns without
    # making it active, and a nested run would then land in "Default", apart from its parent.
    with mlflow.start_run(run_name=name, nested=True, experiment_id=parent.info.experiment_id,
                          tags={**(tags or {}), OWNER_TAG: this_process()}):
        yield Tracker(mlflow)
