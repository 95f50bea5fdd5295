"""The end-to-end tests' scratch project: the repository's dvc.yaml and code, tiny synthetic data and a tiny model."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import dvc_init, tiny_params, write_custom_dataset

REPO = Path(__file__).resolve().parents[2]


def run(command: list[str], cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


@pytest.fixture
def project(tmp_path, tiny_model_dir) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "dvc.yaml", project)
    shutil.copy(REPO / ".gitignore", project)  # what git and DVC ignore there, as in a checkout
    shutil.copytree(REPO / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(REPO / "data" / "raw", project / "data" / "raw", ignore=shutil.ignore_patterns("*.jsonl", "*.dvc"))
    write_custom_dataset(tmp_path / "raw")
    (project / "params.yaml").write_text(yaml.safe_dump(tiny_params(tmp_path / "raw", tiny_model_dir)))
    run(["git", "init", "-q"], project)
    dvc_init(project)
    return project
