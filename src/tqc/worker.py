"""The pull step of prefect.yaml's deployments: a worker runs each flow in the project checkout that its own
`TQC_PROJECT_DIR` names (each machine's own path, so it is read when the run starts, not when it is deployed)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

VARIABLE = "TQC_PROJECT_DIR"
# How long marking the run Crashed may hold up the step's own error: one try, no Prefect client retries (6 tries of
# 60 s each by default, some 6 minutes against a server that accepts connections but does not answer)
MARK_SECONDS = 10.0


class ProjectDirError(RuntimeError):
    """The worker's TQC_PROJECT_DIR is unset or names no checkout."""


def project_checkout() -> dict[str, str]:
    """Prefect's `set_working_directory` on `TQC_PROJECT_DIR` (a relative path is the worker's own folder's, as there),
    first checking it. With it unset, Prefect's placeholder `{{ $TQC_PROJECT_DIR }}` became an empty directory, the
    step 'completed successfully' in the run's temporary folder, and the run crashed on "No such file or directory:
    '/tmp/tmp…prefect/flows/retrain.py'", naming no variable. The error here is one line naming it, and the run's
    state says it too (`_crash_this_run`)."""
    try:
        return _checked_checkout()
    except ProjectDirError as error:
        _crash_this_run(str(error))
        raise


def _checked_checkout() -> dict[str, str]:
    from prefect.deployments.steps import set_working_directory

    value = os.environ.get(VARIABLE, "").strip()
    what = (f"set {VARIABLE} on this worker to the tqc checkout the flows run in (the folder with params.yaml and "
            f"flows/), e.g. `{VARIABLE}=$PWD prefect worker start --pool gpu` from it")
    if not value:
        raise ProjectDirError(f"{VARIABLE} is not set: {what}")
    try:
        directory = set_working_directory(value)
    except OSError as error:  # no such folder, or not one
        raise ProjectDirError(f"{VARIABLE}={value}: {error.strerror or error}: {what}") from None
    if not (Path(directory["directory"]) / "flows").is_dir():
        raise ProjectDirError(f"{VARIABLE}={value}: no flows/ folder there, so no tqc checkout: {what}")
    return directory


def _crash_this_run(message: str) -> None:
    """The flow run this step runs for (PREFECT__FLOW_RUN_ID, which the worker sets) Crashed with `message`. Prefect
    3.8 runs pull steps in a supervisor process that prints their error to its stderr, the worker's console, and the
    run's state, all the UI and an automation see, became the runner's "Process exited with status code: 1", naming
    nothing. The runner still proposes that Crashed state when the process exits; the server refuses it to a run in a
    final state already, so this message stays. Outside a run (`run_steps` by hand) there is no run to mark; a server
    that cannot be reached, or does not answer within MARK_SECONDS, leaves the runner's state, and the step's own error
    is raised all the same."""
    from prefect.runtime import flow_run

    if not flow_run.id:
        return
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings
    from prefect.states import Crashed

    try:
        with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}), \
                get_client(sync_client=True, httpx_settings={"timeout": MARK_SECONDS}) as client:
            client.set_flow_run_state(flow_run.id, Crashed(message=message))
    except Exception as error:  # the ProjectDirError is the failure to report, not this
        log.warning("could not mark flow run %s crashed: %s: %s", flow_run.id, type(error).__name__, error)
