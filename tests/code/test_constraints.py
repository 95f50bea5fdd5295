"""constraints.txt, the versions `make run` and `make test` install, against what pyproject.toml asks for.

A pin that pyproject's range no longer allows would make pip refuse the install (ResolutionImpossible) on a fresh
clone, and a dependency missing from the file would be installed at whatever version is newest that day: both are
caught here, before CI's clean checkout meets them.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def pins(text: str) -> dict[str, Version]:
    """name → version of each `name==version` line; comments and blank lines skipped."""
    pinned = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, separator, version = line.partition("==")
        if not (separator and name and version):
            raise ValueError(f"constraints.txt line {number}: {line!r} is not name==version")
        if canonicalize_name(name) in pinned:
            raise ValueError(f"constraints.txt line {number}: {name} pinned twice")
        pinned[canonicalize_name(name)] = Version(version)
    return pinned


def locked_requirements() -> list[Requirement]:
    """pyproject's dependencies and the extras `make lock` resolves (the gpu extra's FAISS build is never locked)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    return [Requirement(text) for text in [*project["dependencies"], *extras["cpu"], *extras["test"], *extras["server"]]]


def test_every_dependency_but_torch_is_pinned_within_pyprojects_range():
    pinned = pins((ROOT / "constraints.txt").read_text(encoding="utf-8"))
    assert "torch" not in pinned, "torch is the Makefile's TORCH (a CPU or CUDA wheel), never the lock's"
    for requirement in locked_requirements():
        name = canonicalize_name(requirement.name)
        if name == "torch":
            continue
        assert name in pinned, f"{requirement.name} is not in constraints.txt: run make lock"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {requirement.name}=={pinned[name]}, outside pyproject's {requirement}: run make lock")


def test_pins_reads_name_version_lines_and_refuses_anything_else():
    assert pins("# header\n\nfoo==1.2\nBar_Baz==0.1.post1  # why\n") == {"foo": Version("1.2"),
                                                                          "bar-baz": Version("0.1.post1")}
    for bad, reason in (("foo>=1.0\n", "line 1: 'foo>=1.0' is not name==version"), ("-e .\n", "is not name==version"),
                        ("foo==1\nFOO==2\n", "line 2: FOO pinned twice")):
        with pytest.raises(ValueError, match=reason):
            pins(bad)


def test_the_makefile_installs_through_the_constraints_and_make_lock_writes_them_atomically():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "CONSTRAINTS ?= constraints.txt" in makefile
    installs = [line.strip() for line in makefile.splitlines()  # the project, and the project with its tests
                if line.strip().startswith("$(BIN)/pip install") and '-e ".[' in line]
    assert len(installs) == 2 and all("$(PIN)" in line for line in installs), installs
    lock = makefile.split("\nlock:\n")[1]
    assert lock.index("> constraints.txt.tmp") < lock.index("mv constraints.txt.tmp constraints.txt")


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_a_venv_installed_with_other_settings_is_installed_again(tmp_path):
    """The install stamps depended on the files alone: `make run CONSTRAINTS=` (the newest versions) or another
    TORCH in a venv made with the pins installed nothing, and a plain `make test` after `CONSTRAINTS=` kept the
    unpinned versions. Run on a copy of the Makefile with a pip that only says what it was asked."""
    import subprocess
    import time

    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "constraints.txt").write_text("")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("")
    (bin_dir / "pip").write_text('#!/bin/sh\necho PIP "$@"\n')
    (bin_dir / "pip").chmod(0o755)

    def installs(*settings: str) -> list[str]:
        time.sleep(1.1)  # make compares modification times, to the second on some file systems
        done = subprocess.run(["make", "-s", "install", *settings], cwd=tmp_path, capture_output=True, text=True,
                              check=True)
        return [line for line in done.stdout.splitlines() if line.startswith("PIP install")]

    assert installs() == ["PIP install -q torch==2.13.0", "PIP install -q -c constraints.txt -e .[cpu]"]
    assert installs() == []  # nothing changed: nothing installed
    assert installs("CONSTRAINTS=") == ["PIP install -q torch==2.13.0", "PIP install -q -e .[cpu]"]
    assert installs("CONSTRAINTS=") == []
    assert installs()[-1] == "PIP install -q -c constraints.txt -e .[cpu]"  # the pins back
    assert installs("TORCH=torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")[0] == (
        "PIP install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")
