"""The retrain flow's own failures, which the flow tells apart: a busy lock, a commit rolled back, a push that
failed."""

from __future__ import annotations


class RetrainCommitError(RuntimeError):
    """A dvc step of the data commit failed; the commit was rolled back."""


class RetrainBusy(RuntimeError):
    pass


class JudgeFailedUnpushed(RuntimeError):
    """The gate raised in a run whose data version is not on the DVC remote either (`push_failure`): the message is
    the gate's error and that line, where the gate's alone hid the unpushed data from cron; `__cause__` is the gate's
    error. The challenger's mark keeps both for the next run (`mark_judge_pending`)."""


class PushFailed(RuntimeError):
    """A run that committed its new data version, and judged its challenger, but could not push the data to the DVC
    remote, or could not push again the version the last run left unpushed (`push_failure`'s line is the message;
    `retrain.on_push_failure: fail`). `result` is what the run did, as a run that completes returns it: the commit and
    the gate's decision stand."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result

    def __reduce__(self):  # pickled as a failed run's data: the default would call __init__ without `result`
        return type(self), (str(self), self.result)


class RefreshError(RuntimeError):
    """A refresh that cannot start (no champion): permanent, so the flow does not retry it."""

