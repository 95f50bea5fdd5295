"""The commit: staged additions replace data/raw, `dvc add`, the inbox files archived, the challenger marked, all or
nothing, journaled so that a commit killed midway is rolled back when the next run starts."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tqc.config import Params, RetrainParams
from tqc.io import atomic_directory, atomic_path, write_jsonl
from tqc.readers import ADDED_CATALOG, ADDED_QUESTIONS
from tqc.retraining.data_versions import dvc_record, held_from_dvc
from tqc.retraining.errors import RetrainCommitError
from tqc.retraining.inbox import MANIFEST, Incoming, archive, free_name, repeat_outcome, rows_of, sha256
from tqc.retraining.pending import Trained, mark_judge_pending, pending_judge_path
from tqc.retraining.staging import Staged, additions_digests, additions_dir

log = logging.getLogger("tqc.retrain")  # one logger for the retrain steps, whichever module says it


def commit(params: Params, staged: Staged, files: list[Incoming], repeats: list[Incoming],
           challenger: Trained | None = None) -> dict:
    """The commit point: staged additions → data/raw (atomic), dvc add (+ push), the quarantine, then archive, then
    `challenger` (the model trained on the staged data) marked as awaiting the gate (`PENDING_JUDGE`).

    All or nothing: when a step fails (dvc add, a full disk while archiving), data/raw with its .dvc files
    (and their git index entries), the quarantine and the manifest are put back as they were, archived files
    return to the inbox and no challenger is pending, so the next run sees exactly what this one saw. The mark is the
    commit's last change, made before its journal closes: a commit that completed always leaves its challenger to be
    judged, even when the run is killed the moment after, and one killed before is rolled back with its mark. A dvc
    push that fails after its retries is no failure of the commit (`dvc_record`): the data is in the DVC cache, and
    the push is left to be redone.
    """
    raw = additions_dir(params)
    raw.mkdir(parents=True, exist_ok=True)
    names = _names_to_commit(raw, staged)
    committed = [raw / name for name in names]
    dvc_written = [*(Path(f"{p}.dvc") for p in committed), raw / ".gitignore"]  # what dvc add writes beside the data
    before = _as_they_are(_touched_by_commit(params.retrain, committed, dvc_written, marks=challenger is not None))
    with _journaled(journal_dir(params.retrain), before, dvc_written) as moves:
        with held_from_dvc(committed):  # not under a `dvc repro` reading data/raw
            _replace_data(staged.raw, committed)
        dvc = dvc_record(committed, params.retrain.push)
        if staged.quarantined_rows:
            _quarantine(Path(params.retrain.quarantine), staged.quarantined_rows)
        entries = _archive_delivered(staged, files, repeats, params.retrain, moves)
        if challenger is not None:
            mark_judge_pending(params.retrain, challenger, dvc)
    return {"committed": [str(p) for p in committed], "dvc": dvc, "archived": entries}


@contextmanager
def _journaled(directory: Path, before: dict[Path, bytes | None], dvc_written: list[Path]) -> Iterator[JournaledMoves]:
    """The changes made inside, all or nothing: the journal is written before anything changes, and a failure rolls
    them back. A commit killed midway runs no except clause, and the next run rolls it back from the journal
    (`roll_back_interrupted_commit`) before it judges or picks anything up. → the moves, for `archive` to record."""
    journal = CommitJournal.begin(directory, before, dvc_written)
    try:
        yield journal.moves  # (inbox path, archived as, sha256), to move back; each one journaled before it is made
    except BaseException as failure:
        try:
            journal.roll_back()  # if this fails too, the journal stays for the next run
        except RetrainCommitError as unfinished:  # both said: why the commit failed, and what is left to put back
            raise RetrainCommitError(f"{failure}; and {unfinished}") from failure
        raise
    journal.close()


def _names_to_commit(raw: Path, staged: Staged) -> list[str]:
    """The staged additions' names to write over data/raw's, refused where data/raw changed since it was staged.
    Nothing accepted (repeats only, or every row quarantined): the data stays as it is. The staging folder may then
    hold anything, a failed earlier run's rows say, and must not be copied."""
    names = [name for name in (ADDED_QUESTIONS, ADDED_CATALOG) if staged.accepted and (staged.raw / name).exists()]
    if names:
        _require_unchanged_since_staged(raw, staged)
    return names


def _touched_by_commit(params: RetrainParams, committed: list[Path], dvc_written: list[Path], marks: bool) -> list[Path]:
    """What a commit may change, in the order its journal restores them: the manifest first, so that a roll-back
    stopped by a full disk after it leaves no file recorded as merged whose rows are not in the data (the next run
    would take it for a repeat)."""
    touched = [Path(params.archive) / MANIFEST, *committed, *dvc_written, Path(params.quarantine)]
    if marks:  # the journal keeps the mark's absence: a roll-back removes it
        touched.append(pending_judge_path(params))
    return touched


def _as_they_are(paths: list[Path]) -> dict[Path, bytes | None]:
    """Each file's bytes, or None where there is none."""
    return {path: path.read_bytes() if path.exists() else None for path in paths}


def _replace_data(staged_raw: Path, committed: list[Path]) -> None:
    """Each of data/raw's `committed` files replaced, atomically, by its staged copy of the same name."""
    for path in committed:
        with atomic_path(path) as tmp:
            shutil.copy2(staged_raw / path.name, tmp)


def _archive_delivered(staged: Staged, files: list[Incoming], repeats: list[Incoming], params: RetrainParams,
                       archived: list[tuple[Path, Path, str]]) -> list[dict]:
    """Archive the files `staged` judged, then the repeats; each move recorded in `archived` for the roll-back. A file
    that changed after pick-up was not judged, and stays in the inbox."""
    by_file = {o.file: o for o in staged.outcomes}
    entries = [archive(f, by_file[str(f.path)], params, archived) for f in files if str(f.path) not in staged.still_changing]
    return entries + [archive(f, repeat_outcome(f), params, archived) for f in repeats]


def _require_unchanged_since_staged(raw: Path, staged: Staged) -> None:
    """Refuse to write the staged additions over a data/raw that changed during the run (a label fixed by hand, a
    `dvc checkout`): the staged copy holds the old version, and writing it back would undo that change unsaid."""
    if not staged.base:  # a Staged made by hand, with nothing copied to compare
        return
    now = additions_digests(raw)
    changed = [str(raw / name) for name, digest in staged.base.items() if now.get(name) != digest]
    if changed:
        raise RetrainCommitError(f"{', '.join(changed)} changed during this run (edited, or checked out): nothing is "
                                 "committed, so that change stands; the delivered files stay in the inbox, and the "
                                 "next run merges them into the data as it is then")


def journal_dir(params: RetrainParams) -> Path:
    return Path(params.work_dir) / "commit-journal"


class JournaledMoves(list):
    """The commit's archive moves, (inbox path, archived as, the file's sha256); each appended to the journal's file,
    flushed to disk, before `archive` makes it."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def append(self, move: tuple[Path, Path, str]) -> None:
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps({"inbox": str(move[0]), "archived_as": str(move[1]), "sha256": move[2]}) + "\n")
            file.flush()
            os.fsync(file.fileno())
        super().append(move)


@dataclass
class CommitJournal:
    """What a commit changes, as it was before: each file's bytes (or that it did not exist), the .dvc files
    `dvc add` writes, and the archive moves as they are made. It exists from the commit's first change until
    its last (or its roll-back) is done."""

    directory: Path
    before: dict[Path, bytes | None]
    dvc_written: list[Path]
    moves: JournaledMoves

    @classmethod
    def begin(cls, directory: Path, before: dict[Path, bytes | None], dvc_written: list[Path]) -> "CommitJournal":
        if directory.exists():  # a journal the next run has not rolled back yet: never overwritten
            raise RetrainCommitError(f"{directory}: an interrupted commit's journal is still there; "
                                     "roll_back_interrupted_commit must put its changes back first")
        with atomic_directory(directory) as staging:  # whole or not at all: a kill while writing it changed nothing
            files = []
            for number, (path, content) in enumerate(before.items()):
                if content is not None:
                    (staging / f"before-{number}").write_bytes(content)
                files.append({"path": str(path), "before": None if content is None else f"before-{number}"})
            (staging / "journal.json").write_text(json.dumps({"files": files, "dvc_written": list(map(str, dvc_written))}))
        return cls(directory, before, dvc_written, JournaledMoves(directory / "moves.jsonl"))

    @classmethod
    def found(cls, directory: Path) -> "CommitJournal | None":
        if not (directory / "journal.json").exists():
            return None
        recorded = json.loads((directory / "journal.json").read_text())
        before = {Path(f["path"]): None if f["before"] is None else (directory / f["before"]).read_bytes()
                  for f in recorded["files"]}
        moves = JournaledMoves(directory / "moves.jsonl")
        lines = (directory / "moves.jsonl").read_text(encoding="utf-8").splitlines() if moves.path.exists() else []
        for line in lines:
            try:
                move = json.loads(line)
            except json.JSONDecodeError:  # cut by the kill while it was written: that move was not made yet
                continue
            # a journal written before moves carried their sha256: None, and the roll-back moves the file back
            list.append(moves, (Path(move["inbox"]), Path(move["archived_as"]), move.get("sha256")))
        return cls(directory, before, [Path(p) for p in recorded["dvc_written"]], moves)

    def roll_back(self) -> None:
        """Put back what the commit changed, then close: the journal stays while the roll-back is not done."""
        _roll_back(self.before, self.moves, self.dvc_written)
        self.close()

    def close(self) -> None:
        """Gone at once (renamed, then deleted): a kill while deleting it leaves a folder `found` and `begin` do
        not mistake for a journal, not half of one."""
        closed = self.directory.with_name(f"{self.directory.name}.closed")
        shutil.rmtree(closed, ignore_errors=True)
        self.directory.rename(closed)
        shutil.rmtree(closed)


def roll_back_interrupted_commit(params: RetrainParams) -> bool:
    """Put back what a commit killed midway (SIGKILL, a cancelled flow run, a lost worker) changed, from its journal:
    the data, its .dvc files, the quarantine and the manifest as they were, its files back in the inbox. Else the
    next run would judge the delivered rows against themselves, quarantine them as duplicates and archive their
    files, and no challenger pending for the gate (its data is no longer committed). True when there was one. Call it
    under the retrain lock, before `pending_judge` and `pick_up`."""
    journal = CommitJournal.found(journal_dir(params))
    if journal is None:
        return False
    log.warning("retrain: %s: a commit was interrupted (the process was killed); putting back what it changed",
                journal.directory)
    journal.roll_back()
    return True


def _roll_back(before: dict[Path, bytes | None], archived: list[tuple[Path, Path, str]], dvc_files: list[Path]) -> None:
    # The data first: a move that cannot be undone (its journal kept, the next run tries again) then leaves the data
    # as it was, not holding rows the manifest never recorded.
    # Under DVC's rwlock, as the commit replaced them: not under a `dvc repro` stage reading data/raw (one that started
    # after the replacement read the new rows, and its dvc.lock would record the old data's md5 beside them)
    with held_from_dvc(list(before)):
        for path, content in before.items():
            if content is None:
                path.unlink(missing_ok=True)
            else:
                with atomic_path(path) as tmp:
                    tmp.write_bytes(content)
    for inbox_path, archived_as, digest in reversed(archived):
        # lexists: False for a name the system refuses (exists() raised ENAMETOOLONG, and every later run with it)
        if not os.path.lexists(archived_as):  # the move was journaled and then not made, or already undone
            continue
        if digest and inbox_path.exists() and sha256(inbox_path) == digest:  # a copy to another disk cut short: it stayed
            archived_as.unlink()
        else:
            shutil.move(str(archived_as), free_name(inbox_path))
    _restage(dvc_files)
    log.error("retrain: the commit failed; the data, its .dvc files, the quarantine, the manifest and the inbox are "
              "as they were")


def _restage(paths: list[Path]) -> None:
    """DVC's autostage git-added what `dvc add` wrote: the index follows the files put back."""
    from dvc.config import Config
    from dvc.exceptions import DvcException

    try:
        if not Config.from_cwd()["core"].get("autostage"):
            return
    except DvcException:  # an unreadable config: `dvc add` could not have staged anything either
        return
    present, absent = [str(p) for p in paths if p.exists()], [str(p) for p in paths if not p.exists()]
    if present:
        _git_index("add", "--", *present)
    if absent:
        _git_index("rm", "-q", "--cached", "--ignore-unmatch", "--", *absent)


# Seconds between tries of a git command the roll-back needs while another git process holds .git/index.lock (an
# editor's `git status`, a commit in another terminal): such holders let go within a second or two
INDEX_LOCK_WAITS = (0.5, 1.0, 2.0, 4.0)


def _git_index(*arguments: str) -> None:
    """`git ARGUMENTS` on the index, tried again while another git process holds its lock. A failure raises: a roll-back
    that left the rolled-back .dvc files staged would have the next `git commit` record a data version whose rows went
    back to the inbox. The journal then stays, and the next run rolls back again (`roll_back_interrupted_commit`)."""
    waits = iter(INDEX_LOCK_WAITS)
    while True:
        done = subprocess.run(["git", *arguments], capture_output=True, text=True)
        if done.returncode == 0:
            return
        wait = next(waits, None) if "index.lock" in done.stderr else None
        if wait is None:
            reason = next((line for line in done.stderr.splitlines() if line.strip()), f"exit {done.returncode}")
            raise RetrainCommitError(f"the roll-back put the files back but could not set git's index to match (git "
                                     f"{arguments[0]}: {reason}); the next retrain run rolls back again, or run "
                                     f"`git {' '.join(arguments)}` yourself")
        time.sleep(wait)


def _quarantine(path: Path, rows: list[dict]) -> None:
    """Append the rows the quarantine lacks: a file delivered again with nothing taken from it (its reason not yet
    fixed) is judged again to the same rows, which one copy records."""
    existing = rows_of(path)
    recorded = {json.dumps(row, sort_keys=True) for row in existing}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(path, existing + [row for row in rows if json.dumps(row, sort_keys=True) not in recorded])

