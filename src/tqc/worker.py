"""The pull step of prefect.yaml's deployments: a worker runs each flow in the project checkout that its own
`TQC_PROJECT_DIR` names (each machine's own path, so it is read when the run starts, not when it is deployed)."""

from __future__ import annotations

import os
from pathlib import Path

VARIABLE = "TQC_PROJECT_DIR"


class ProjectDirError(RuntimeError):
    """The worker's TQC_PROJECT_DIR is unset or names no checkout."""


def project_checkout() -> dict[str, str]:
    """Prefect's `set_working_directory` on `TQC_PROJECT_DIR` (a relative path is the worker's own folder's, as there),
    first checking it. With it unset, Prefect's placeholder `{{ $TQC_PROJECT_DIR }}` became an empty directory, the
    step 'completed successfully' in the run's temporary folder, and the run crashed on "No such file or directory:
    '/tmp/tmp…prefect/flows/retrain.py'", naming no variable. The error here is one line naming it."""
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
