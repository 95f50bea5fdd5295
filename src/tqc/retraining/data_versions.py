"""DVC: `dvc add` of the committed additions, and `dvc push` tried again a few times where a remote is configured."""

from __future__ import annotations

import logging
import shlex
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from tqc.retraining.errors import RetrainCommitError

log = logging.getLogger("tqc.retrain")  # one logger for the retrain steps, whichever module says it

DVC = (sys.executable, "-m", "dvc")  # the dvc beside this Python, whatever PATH a worker starts with
# Seconds between `dvc push` tries: a network blip passes in these ~20 s; an outage longer than that leaves the commit
# made and the push to be redone, rather than throwing the run's training away with a roll-back
PUSH_RETRY_WAITS = (5.0, 15.0)
# Seconds between tries while another dvc command holds a file of the commit in DVC's rwlock (`dvc repro`'s ingest
# reading data/raw, which runs with the repo lock released, so --wait-for-lock does not wait for it), and how long in
# all: a stage that reads data/raw takes seconds to minutes
BUSY_WAIT, BUSY_PATIENCE = 1.0, 3600.0
BUSY = "is busy, it is being blocked by"


def dvc_record(paths: list[Path], push: bool) -> dict:
    """`dvc add` the additions (the new data version); `dvc push` them when a remote exists, tried again a few times
    (`push_with_retries`). A push that still fails leaves the version committed, `pushed` false and `push_failed` its
    reason."""
    if not paths:
        return {"added": [], "pushed": False}
    if not _in_dvc_repo():
        log.warning("retrain: not inside a DVC repository; %s not versioned", ", ".join(map(str, paths)))
        return {"added": [], "pushed": False}
    pushing = push and _has_default_remote()  # before the add: a push bound to fail refuses the commit first
    _dvc("add", *map(str, paths))
    added = [f"{p}.dvc" for p in paths]
    failure = push_with_retries(added) if pushing else None
    if failure is None:
        return {"added": added, "pushed": pushing}
    log.warning("retrain: %s, %d tries; the new data version is recorded in this checkout and its DVC cache but is not "
                "on the remote: push it by hand with `%s` before another retrain changes those files (a later "
                "retrain pushes its own version, not this one)", failure, len(PUSH_RETRY_WAITS) + 1, push_command(added))
    return {"added": added, "pushed": False, "push_failed": failure}



def push_with_retries(dvc_files: list[str]) -> str | None:
    """`dvc push` the new data version, tried again after each of PUSH_RETRY_WAITS; None once pushed, else the last
    failure's line. The data is in the DVC cache already (the add), so a push that never got through loses nothing."""
    waits = iter(PUSH_RETRY_WAITS)
    while True:
        try:
            _dvc("push", *dvc_files)
            return None
        except RetrainCommitError as error:
            wait = next(waits, None)
            if wait is None:
                return str(error)
            log.warning("retrain: %s; trying again in %g s", error, wait)
            time.sleep(wait)


def _dvc(command: str, *arguments: str) -> str:
    """One dvc command's output; a failure is one line with DVC's own reason (its last error line), not an exit status.
    It waits for DVC's lock where another dvc command holds it (a `dvc status`, an editor's DVC extension, a `dvc repro`
    in this checkout): DVC's own 3 s and a failure would throw this run's training away. The lock is the OS's, so a
    holder that dies frees it."""
    waiting = f"retrain: dvc {command} waits for another dvc command using {' '.join(arguments)}"
    for _ in _tries_while_busy(waiting):
        done = subprocess.run([*DVC, "--wait-for-lock", command, *arguments], capture_output=True, text=True)
        if done.returncode == 0 or BUSY not in done.stderr + done.stdout:
            break
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "no output")
        raise RetrainCommitError(f"dvc {command} failed (exit {done.returncode}): {reason}")
    return done.stdout


@contextmanager
def held_from_dvc(paths: list[Path]) -> Iterator[None]:
    """`paths` held as DVC's own commands hold what they write (its rwlock, `.dvc/tmp/rwlock`), waiting while another
    dvc command reads or writes them: a `dvc repro` whose ingest is reading data/raw (its stages run with DVC's repo lock
    released) must not have the file replaced under it, or dvc.lock records the new data's md5 beside outputs made
    from the old, and `dvc status` calls them up to date. Outside a DVC repository, nothing to hold."""
    if not paths or not _in_dvc_repo():
        yield
        return
    import os

    from dvc.config import Config
    from dvc.exceptions import DvcException
    from dvc.fs import LocalFileSystem
    from dvc.lock import LockError
    from dvc.repo import Repo
    from dvc.rwlock import rwlock

    tmp_dir = os.path.join(Repo.find_root(), Repo.DVC_DIR, "tmp")
    os.makedirs(tmp_dir, exist_ok=True)
    hardlink = Config.from_cwd()["core"].get("hardlink_lock", False)
    written = [os.path.abspath(p) for p in paths]
    waiting = f"retrain: waiting for another dvc command using {', '.join(map(str, paths))}"
    with ExitStack() as held:
        for _ in _tries_while_busy(waiting):
            try:
                held.enter_context(rwlock(tmp_dir, LocalFileSystem(), "tqc retrain commit", [], written, hardlink))
                break
            except LockError as error:
                busy = error
            except DvcException as error:  # its rwlock file unreadable, say: one line, as a failed dvc command says it
                raise RetrainCommitError(f"dvc: {error}") from None
        else:
            raise RetrainCommitError(f"dvc: {str(busy).splitlines()[0]} for over {BUSY_PATIENCE:g} s")
        yield


def _tries_while_busy(waiting: str) -> Iterator[None]:
    """Paces tries at a file another dvc command holds: the first at once, each later one BUSY_WAIT s after the last,
    saying `waiting` once (not each second); it ends, the last try failed, once BUSY_PATIENCE s have passed."""
    given_up_at = time.monotonic() + BUSY_PATIENCE
    yield
    log.info(waiting)
    while time.monotonic() <= given_up_at:
        time.sleep(BUSY_WAIT)
        yield

# The two checks below, and _restage's, read DVC's files in this process, as `dvc root`, `dvc remote list` and `dvc
# config` would: a dvc process for each took about a second of every data commit. `dvc add` and `dvc push`, which do
# the work, stay processes.
def _in_dvc_repo() -> bool:
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        Repo.find_root()
    except NotDvcRepoError:
        return False
    return True


def _has_default_remote() -> bool:
    """Whether `dvc push` has a remote to send to; False where no remote is named at any of DVC's config levels
    (system, global, project, local). Remotes with none of them the default: `dvc push` would stop on "no remote
    specified" once the data is added, so the commit is refused here, saying how to choose one."""
    from dvc.config import Config
    from dvc.exceptions import DvcException

    try:
        config = Config.from_cwd()
    except DvcException as error:  # an unreadable config: one line, as _dvc says a failed command
        raise RetrainCommitError(f"dvc remote list failed: {error}") from None
    remotes, default = sorted(config["remote"]), config["core"].get("remote")
    if remotes and not default:
        raise RetrainCommitError(f"retrain.push is true and DVC names remote(s) {', '.join(remotes)} but no default one, "
                                 "so dvc push would not know where to send the data: make one the default with "
                                 "`dvc remote default NAME`, or set retrain.push: false")
    if default and default not in config["remote"]:  # e.g. defined in a .dvc/config.local this checkout lacks
        defined = f" (it defines {', '.join(remotes)})" if remotes else ""
        raise RetrainCommitError(f"retrain.push is true and DVC's default remote is {default!r}, which no DVC config "
                                 f"here defines{defined}, so dvc push would fail: define it (`dvc remote add --local "
                                 f"{default} URL`, as on the machines that push), or set retrain.push: false")
    return bool(remotes)


def push_command(versions: list[str]) -> str:
    """The command that pushes a data version whose push failed: its .dvc files, as every message about it gives it,
    quoted for a shell (a folder with a space was two targets)."""
    return f"dvc push {shlex.join(versions)}"

