"""The challenger a commit leaves for the gate (`PENDING_JUDGE`), with the data version its push left unpushed, if
any."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from tqc.config import RetrainParams
from tqc.io import read_json, write_text
from tqc.retraining.data_versions import push_with_retries
from tqc.retraining.errors import RetrainCommitError

log = logging.getLogger("tqc.retrain")  # one logger for the retrain steps, whichever module says it


@dataclass(frozen=True)
class Trained:
    data: Path  # the staged validated data
    model: Path  # the stage-two model
    prior: Path | None  # its class-prior shift (the prior stage's file); None for a refresh
    validation_macro_f1: float | None  # stage two's best; None for a refresh, which trains nothing
    refreshed_from: Champion | None = None  # a refresh: the champion whose encoder it serves


# In work_dir, written by the commit as its last change (inside its journal, so a roll-back removes it): the
# challenger trained on the grown data still awaits the gate. A judge that failed (its retries spent, the registry
# down) or a run killed before it leaves the file, and the next run judges that challenger first: its inbox files are
# archived, so nothing else would ever bring the grown data before the gate (on a first delivery, no champion would
# ever exist).
PENDING_JUDGE = "judge-pending.json"


def pending_judge_path(params: RetrainParams) -> Path:
    """The challenger's mark (`PENDING_JUDGE`) in the retrain's work folder."""
    return Path(params.work_dir) / PENDING_JUDGE


def mark_judge_pending(params: RetrainParams, trained: Trained, dvc: dict | None = None) -> None:
    """Mark `trained` for the gate; with `dvc` (`dvc_record`'s result) where its push failed, the mark also records
    that data version as unpushed, which the next run pushes again (`push_pending_version`)."""
    unpushed = ({"unpushed": {"added": dvc["added"], "push_failed": dvc["push_failed"]}}
                if dvc and dvc.get("push_failed") else {})
    _write_pending(params, {**asdict(trained), **unpushed})  # asdict takes the champion of a refresh along


def _write_pending(params: RetrainParams, record: dict) -> None:
    write_text(pending_judge_path(params), json.dumps(record, default=str, indent=2) + "\n")  # paths as text


def _pending_record(params: RetrainParams) -> dict | None:
    path = pending_judge_path(params)
    return read_json(path) if path.exists() else None


def pending_judge(params: RetrainParams) -> Trained | None:
    """The committed challenger the last run did not judge, or None."""
    path = pending_judge_path(params)
    record = _pending_record(params)
    if record is None:
        return None
    record.pop("unpushed", None)  # push_pending_version's
    champion = record.pop("refreshed_from")
    trained = Trained(**{**record, "data": Path(record["data"]), "model": Path(record["model"]),
                         "prior": Path(record["prior"]) if record["prior"] else None},
                      refreshed_from=Champion(**{**champion, "model": Path(champion["model"])}) if champion else None)
    missing = [str(folder) for folder in (trained.data, trained.model) if not folder.exists()]
    if missing:
        raise RetrainCommitError(f"{path}: the last run committed its data but did not judge its challenger, and "
                                 f"{', '.join(missing)} is gone; retrain the current data (dvc repro, then tqc promote) "
                                 f"and delete {path}")
    return trained


def clear_pending_judge(params: RetrainParams) -> None:
    pending_judge_path(params).unlink(missing_ok=True)


def push_pending_version(params: RetrainParams) -> dict | None:
    """Push again the data version whose push failed in the run that committed it and whose challenger still awaits
    the gate (the mark records it): its .dvc files name it still, since a retrain commits nothing until that challenger
    is judged (a change made to them by hand since is what gets pushed). `{"added", "pushed": True}` and the mark's
    record dropped; `pushed` false with `push_failed` where it fails again (the mark keeps it); None where nothing waits
    (or retrain.push is off)."""
    record = _pending_record(params)
    unpushed = (record or {}).get("unpushed")
    if not unpushed or not params.push:
        return None
    failure = push_with_retries(unpushed["added"])
    if failure is not None:
        log.warning("retrain: the data version the last run committed (%s) is still not on the DVC remote: %s",
                    ", ".join(unpushed["added"]), failure)
        return {"added": unpushed["added"], "pushed": False, "push_failed": failure}
    _write_pending(params, {key: value for key, value in record.items() if key != "unpushed"})
    log.info("retrain: the data version the last run committed but could not push (%s) is on the DVC remote now",
             ", ".join(unpushed["added"]))
    return {"added": unpushed["added"], "pushed": True}


@dataclass(frozen=True)
class Champion:
    version: str
    model: Path  # its model folder, downloaded
    rule: str  # standard | exemplars (the version's `rule` tag)
    exemplar_k: int | None  # what the exemplar rule served with; None for the standard rule

