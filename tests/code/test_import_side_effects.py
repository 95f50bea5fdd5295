"""No side effects at import: importing any tqc module writes no file and leaves the environment as it was.

The one exception is documented (docs/tracking.md): `tqc.serving`'s model class subclasses MLflow's PythonModel, so it
imports MLflow, and first turns MLflow's usage records off (MLFLOW_DISABLE_TELEMETRY), and nothing else: not the
entry points' bound on MLflow's retries, which would change an importing notebook's own MLflow client.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import tqc

# In a fresh process: each module imported in turn, the files under cwd and HOME and the environment compared after each
PROBE = """
import importlib, json, os, sys
from pathlib import Path
def files():
    return sorted(str(p) for root in (Path.cwd(), Path(os.environ["HOME"])) for p in root.rglob("*"))
found = {}
for name in sys.argv[1:]:
    environment, before = dict(os.environ), files()
    importlib.import_module(name)
    changed = {k: v for k, v in os.environ.items() if environment.get(k) != v}
    written = sorted(set(files()) - set(before))
    if changed or written:
        found[name] = {"environment": changed, "files": written}
print(json.dumps(found))
"""


TEST_OR_CI = {"PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "CIRCLECI", "GITLAB_CI", "JENKINS_URL", "TRAVIS", "TF_BUILD",
              "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "BUILDKITE", "TEAMCITY_VERSION", "CLOUD_RUN_EXECUTION"}
MLFLOW_DEFAULTS = {"MLFLOW_DISABLE_TELEMETRY"}


def imported_in_a_fresh_process(tmp_path: Path, modules: list[str]) -> dict:
    """Module → what importing it changed (environment variables, files under cwd and HOME), for those that changed any."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(exist_ok=True), cwd.mkdir(exist_ok=True)
    # MLflow sends no usage records, and writes no ~/.config/mlflow, where it sees a test or a CI run: a user's
    # machine is neither, so the child process is not told it is one
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("MLFLOW_", "DO_NOT_TRACK", "_MLFLOW", "RUNBOT_")) and k not in TEST_OR_CI}
    environment.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), PYTHONDONTWRITEBYTECODE="1")
    completed = subprocess.run([sys.executable, "-c", PROBE, *modules], cwd=cwd, env=environment,
                               capture_output=True, text=True, timeout=600, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_importing_a_tqc_module_writes_no_file_and_sets_only_the_documented_mlflow_defaults(tmp_path):
    # tqc.serving first, so that what it sets is said under its name, not under the first module importing it
    others = sorted(m.name for m in pkgutil.walk_packages(tqc.__path__, prefix="tqc.") if m.name != "tqc.serving")
    found = imported_in_a_fresh_process(tmp_path, ["tqc.serving", *others])
    assert list(found) == ["tqc.serving"], found
    assert found["tqc.serving"]["files"] == [] and set(found["tqc.serving"]["environment"]) == MLFLOW_DEFAULTS


def test_the_served_model_file_turns_mlflow_telemetry_off_before_mlflow_is_imported(tmp_path):
    """It imported mlflow.models before tqc.serving: MLflow then wrote ~/.config/mlflow/telemetry.json at import."""
    found = imported_in_a_fresh_process(tmp_path, ["tqc.served_model"])
    assert found["tqc.served_model"]["files"] == []
    assert set(found["tqc.served_model"]["environment"]) == MLFLOW_DEFAULTS
