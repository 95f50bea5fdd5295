"""A retrain's commit beside a `dvc repro` in the same checkout."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from tqc import retrain as steps
from tqc.config import load_params
from tests.flows.conftest import drop, unseen_questions
from tests.flows.test_retrain_steps import deliver


class ReleasedOnceWaited(logging.Handler):
    """Calls `release` when the retrain says it waits for another dvc command: the holder holds until then, so a test
    cannot pass with the holder gone before the commit came (a loaded machine), and passing says the wait happened."""

    def __init__(self, release):
        super().__init__()
        self.release, self.waited = release, False

    def emit(self, record):
        if not self.waited and "wait" in record.getMessage():
            self.waited = True
            self.release()


@contextmanager
def released_once_waited(release):
    """The retrain's log watched for its wait; a wait that is never said ends in a minute, not BUSY_PATIENCE's hour."""
    from tqc.retraining import data_versions

    patience = data_versions.BUSY_PATIENCE
    data_versions.BUSY_PATIENCE = 60.0
    logger = logging.getLogger("tqc.retrain")
    handler, level = ReleasedOnceWaited(release), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        data_versions.BUSY_PATIENCE = patience


READS_RAW_SLOWLY = """stages:
  ingest:
    cmd: python -c "import os, shutil, time; shutil.copy('data/raw/labeled.jsonl', 'ingested.jsonl'); [time.sleep(0.05) for _ in iter(lambda:os.path.exists('RELEASE'), True)]"
    deps:
      - data/raw
    outs:
      - ingested.jsonl
"""


def test_a_commit_waits_for_a_dvc_repro_reading_data_raw_and_leaves_dvc_lock_true(project, tmp_path):
    """`dvc repro` runs a stage's command with DVC's repo lock released, holding only its rwlock on the stage's files,
    which `--wait-for-lock` does not wait for: a commit while ingest read data/raw failed in `dvc add` ("is busy"),
    the run's training thrown away, after replacing the data under the stage (whose dvc.lock could then record the new
    data's md5 beside outputs made from the old). The commit waits for the stage, and `dvc status` then says the
    ingested data is out of date, as it is."""
    params = load_params(project / "params.yaml")
    drop(project, "first.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    steps.commit(params, *deliver(project), [])
    release = tmp_path / "release"
    (project / "dvc.yaml").write_text(READS_RAW_SLOWLY.replace("RELEASE", str(release)))
    drop(project, "second.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])
    staged, files = deliver(project)
    repro = subprocess.Popen([sys.executable, "-m", "dvc", "repro"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        while not (project / "ingested.jsonl").exists() and repro.poll() is None:
            time.sleep(0.05)  # ingest has read data/raw
        with released_once_waited(release.touch) as wait:
            steps.commit(params, staged, files, [])
    finally:
        release.touch()
        output = repro.communicate(timeout=120)[0]
    assert repro.returncode == 0, output
    assert wait.waited
    raw = (project / "data" / "raw" / "labeled.jsonl").read_text().splitlines()
    assert len(raw) == 4 and len((project / "ingested.jsonl").read_text().splitlines()) == 2
    status = subprocess.run([sys.executable, "-m", "dvc", "status", "ingest"], capture_output=True, text=True, check=True)
    assert "changed deps" in status.stdout and "data/raw" in status.stdout, status.stdout


HOLDS_RAW = """import os, sys, time
from dvc.fs import LocalFileSystem
from dvc.rwlock import rwlock
with rwlock(os.path.join('.dvc', 'tmp'), LocalFileSystem(), 'dvc repro', [os.path.abspath('data/raw')], [], False):
    print('held', flush=True)
    sys.stdin.read()  # until the test closes it
"""


def test_dvc_add_waits_while_a_stage_started_after_the_replace_reads_data_raw(project):
    """A `dvc repro` whose ingest starts between the data's replacement and `dvc add` reads the new data, and dvc.lock
    will say so: the add waits for it (DVC's rwlock, which `--wait-for-lock` does not cover) instead of failing, which
    rolled the data back under the stage that had read it."""
    from tqc.retraining import data_versions

    params = load_params(project / "params.yaml")
    drop(project, "first.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    steps.commit(params, *deliver(project), [])
    raw = project / "data" / "raw" / "labeled.jsonl"
    with raw.open("a") as file:
        file.write(raw.read_text().splitlines()[0] + "\n")
    holder = subprocess.Popen([sys.executable, "-c", HOLDS_RAW], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with released_once_waited(holder.stdin.close) as wait:
            assert data_versions.dvc_record([raw], push=False)["added"] == [f"{raw}.dvc"]
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert wait.waited
    status = subprocess.run([sys.executable, "-m", "dvc", "status", f"{raw}.dvc"], capture_output=True, text=True)
    assert "up to date" in status.stdout, status.stdout


READS_RAW_AT_START_AND_END = """import os, sys, time
from dvc.fs import LocalFileSystem
from dvc.rwlock import rwlock
raw = 'data/raw/labeled.jsonl'
with rwlock(os.path.join('.dvc', 'tmp'), LocalFileSystem(), 'dvc repro', [os.path.abspath('data/raw')], [], False):
    print(len(open(raw).read().splitlines()), flush=True)  # what ingest reads
    sys.stdin.read()  # until the test closes it
    print(len(open(raw).read().splitlines()), flush=True)  # what its dvc.lock entry hashes when it ends
"""


def test_a_roll_back_waits_for_a_dvc_repro_stage_reading_data_raw(project, monkeypatch):
    """A commit that fails after its data replaced data/raw (archiving, on a full disk) puts the old data back; a
    `dvc repro` stage that began reading data/raw in between read the new rows, and the data put back under it had
    its dvc.lock record the old data's md5 beside outputs holding rows that went back to the inbox. The roll-back
    waits for the stage, as the commit does."""
    from tqc.retraining import commit as retrain_commit

    params = load_params(project / "params.yaml")
    drop(project, "first.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    steps.commit(params, *deliver(project), [])
    drop(project, "second.csv", [(q, "LOC") for q in unseen_questions(project, "LOC", 2)])
    staged, files = deliver(project)
    stage = []

    def a_stage_starts_then_the_disk_fills(*_):
        stage.append(subprocess.Popen([sys.executable, "-c", READS_RAW_AT_START_AND_END], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True))
        stage.append(stage[0].stdout.readline().strip())
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(retrain_commit, "_archive_delivered", a_stage_starts_then_the_disk_fills)
    try:
        with released_once_waited(lambda: stage[0].stdin.close()) as wait:
            with pytest.raises(OSError, match="No space left"):
                steps.commit(params, staged, files, [])
        if not stage[0].stdin.closed:  # no wait said: the stage is let go all the same, and the test fails below
            stage[0].stdin.close()
        at_end = stage[0].stdout.read().strip()  # its stdin closed: communicate would flush it
        stage[0].wait(timeout=60)
    finally:
        if stage:
            stage[0].kill()
    assert wait.waited
    assert (stage[1], at_end) == ("4", "4")  # the stage saw one version of data/raw throughout
    assert len((project / "data" / "raw" / "labeled.jsonl").read_text().splitlines()) == 2  # then it was put back


def test_a_dvc_command_holding_the_data_past_the_patience_ends_the_wait_with_a_named_error(project, monkeypatch,
                                                                                            caplog):
    """Both waits (holding data/raw for the commit, and `dvc add` itself) give up after BUSY_PATIENCE with DVC's own
    reason, and say that they wait once, not each second."""
    from tqc.retraining import data_versions
    from tqc.retraining.errors import RetrainCommitError

    params = load_params(project / "params.yaml")
    drop(project, "first.csv", [(q, "HUM") for q in unseen_questions(project, "HUM", 2)])
    steps.commit(params, *deliver(project), [])
    raw = project / "data" / "raw" / "labeled.jsonl"
    monkeypatch.setattr(data_versions, "BUSY_WAIT", 0.05)
    monkeypatch.setattr(data_versions, "BUSY_PATIENCE", 0.5)
    holder = subprocess.Popen([sys.executable, "-c", HOLDS_RAW], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # held past both waits, however slowly dvc starts
    try:
        assert holder.stdout.readline().strip() == "held"
        with caplog.at_level("INFO", logger="tqc.retrain"):
            with pytest.raises(RetrainCommitError, match=r"^dvc: .*for over 0.5 s"):
                with data_versions.held_from_dvc([raw]):
                    pytest.fail("held while another dvc command holds it")
            with pytest.raises(RetrainCommitError, match=r"^dvc add failed .*busy"):
                data_versions.dvc_record([raw], push=False)
    finally:
        holder.kill()
        holder.wait(timeout=60)
    waits = [r.getMessage() for r in caplog.records if "wait" in r.getMessage()]
    assert waits == [f"retrain: waiting for another dvc command using {raw}",
                     f"retrain: dvc add waits for another dvc command using {raw}"], waits
