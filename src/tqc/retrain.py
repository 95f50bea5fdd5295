"""The retrain flow's steps, as plain functions (flows/retrain.py makes them Prefect tasks).

New labeled questions arrive as files in an inbox. A retrain:

1. `pick_up`: lists the inbox; a file that the archive manifest records, by sha256, as having
   added rows or classes is a repeat delivery and is archived as such, adding nothing. One that
   nothing was taken from (unusable, or every row quarantined) is judged again: its reason may
   have been fixed since, and rows it shares with the current data are quarantined as duplicates.
   So is a labeled file some of whose rows were quarantined, when a catalog file comes with it:
   the quarantine asks for the classes its rows lacked in just that way.
2. `stage`: copies the current additions (data/raw) into a staging folder and merges the new
   files into the copy: catalog files first (new standard questions, i.e. new classes), then
   labeled files, each judged by the validate stage's own contract against the current data
   (`tqc.incoming.check_batch`). Rejected rows go to quarantine with file, line and reason.
   Each file is read once: the bytes parsed are the bytes hashed, which `commit` archives by.
3. `train` / `judge`: the pipeline's stage functions on the staged data, then the promotion
   gate against the registry's champion. With `retrain.mode: refresh` (it serves the exemplar rule; promote.rule exemplars or auto)
   `refresh` replaces `train`: the champion's encoder, untrained, serves the grown data's
   labeled questions, and the same gate judges it.
4. `commit`: the staged additions replace data/raw atomically, `dvc add` records the new data
   version (`dvc push` when a remote is configured, tried again a few times; a push that still fails
   is left to be redone, the commit kept, and with `retrain.on_push_failure: fail` the flow fails the run once
   its challenger is judged: `push_failure`), then the inbox files move to the archive and the manifest, and
   last the challenger is marked for the gate (`PENDING_JUDGE`; an unpushed version with it, which the next run
   pushes again first: `push_pending_version`). Refused,
   changing nothing, when data/raw changed since `stage` copied it (an edit or a checkout during
   the run), which writing the copy back would undo. Until this
   step nothing outside the staging folder has changed, so a failed or killed retrain leaves
   the raw data as it was; a commit that fails is rolled back at once, and one killed midway
   from its journal when the next run starts. The champion
   alias moves only in `judge`, after a model is fully trained.

Each concern is a module of `tqc.retraining` (inbox, staging, renew, pending, commit, data_versions, summary,
errors); this module is the flows' view of them, the steps above and what they return or raise.

A label is never lost: a file stays in the inbox until its rows are committed. A label is
never counted twice: a repeated file is recognised by hash, and a repeated row is
quarantined as a duplicate of the current data by the validate contract.
"""

from __future__ import annotations

from tqc.retraining.commit import commit, roll_back_interrupted_commit
from tqc.retraining.errors import JudgeFailedUnpushed, PushFailed, RefreshError, RetrainBusy, RetrainCommitError
from tqc.retraining.inbox import Incoming, pick_up, retrain_lock
from tqc.retraining.pending import (Trained, clear_pending_judge, pending_judge, pending_judge_path,
                                    push_pending_version)
from tqc.retraining.renew import refresh, tag_refresh, train
from tqc.retraining.staging import Staged, stage
from tqc.retraining.summary import closing_line, push_failure, summary_markdown, why_nothing_was_accepted

__all__ = ["Incoming", "JudgeFailedUnpushed", "PushFailed", "RefreshError", "RetrainBusy",
           "RetrainCommitError", "Staged", "Trained", "clear_pending_judge", "closing_line", "commit", "pending_judge",
           "pending_judge_path", "pick_up", "push_failure", "push_pending_version", "refresh", "retrain_lock",
           "roll_back_interrupted_commit", "stage", "summary_markdown", "tag_refresh", "train", "why_nothing_was_accepted"]
