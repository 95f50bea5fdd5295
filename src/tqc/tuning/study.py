"""The Optuna study a worker joins: its storage opened (heartbeats on), checked against this worker's params, space and
data, its baseline queued, its pruner, and why its failed trials failed."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tqc.config import ConfigError, Params, SearchDimension, redact_text
from tqc.pipeline import PreparedData
from tqc.schema import Catalog
from tqc.tracking import same_code
from tqc.tuning.space import NOT_TUNED_ON, distribution, flat_base, samples_integers

log = logging.getLogger("tqc.tune")  # one logger for tuning, whichever module says it


def study_base(params: Params, base: dict) -> dict:
    """The params every trial of a study shares: all but the searched ones and the ones no trial depends on."""
    return {key: value for key, value in base.items()
            if key not in params.tune.space and not key.startswith(NOT_TUNED_ON)}


def data_digest(data: PreparedData) -> str:
    """sha256 over what the trials train and are scored on: the catalog, and the training, validation and generated
    rows (text and class), not where each was read from, since workers may keep the data in other folders."""
    from tqc.schema import load_questions

    catalog = Catalog.load(data.directory / "catalog.jsonl")
    content = {"catalog": [[q.class_id, q.text] for q in catalog.questions]}
    for name in ("train.jsonl", "validation.jsonl", "generated.jsonl"):
        if (data.directory / name).exists():
            content[name] = [[q.text, q.class_id] for q in load_questions(data.directory / name)]
    return hashlib.sha256(json.dumps(content, ensure_ascii=False).encode()).hexdigest()


def study_name(settings, digest: str) -> str:
    """The Optuna study to open: tune.study, or with `on_new_data: new_study` one study per data set."""
    return settings.study if settings.on_new_data == "refuse" else f"{settings.study}-data-{digest[:12]}"


class _HeldRecords:
    """A study as the checks see it, what they record held back: a worker refused by a later check (its data, its
    fixed params) would else leave its dimensions recorded as searched there, and a right worker refused for them."""

    def __init__(self, study):
        self.study, self.records = study, {}

    @property
    def study_name(self) -> str:
        return self.study.study_name

    @property
    def user_attrs(self) -> dict:
        return {**self.study.user_attrs, **self.records}

    def set_user_attr(self, key: str, value) -> None:
        self.records[key] = value

    def get_trials(self, **kwargs) -> list:
        return self.study.get_trials(**kwargs)


def join_study(study, params: Params, base: dict, digest: str) -> None:
    """Every check of a worker against the study it opens (space, fixed params, data); the study records this
    worker's space, params and data only once all have passed."""
    held = _HeldRecords(study)
    check_study_base(held, params, base)
    check_study_data(held, params, digest)
    for key, value in held.records.items():
        study.set_user_attr(key, value)


def other_code_trials(study, version: str) -> Counter:
    """The complete trials trained by other code than `version` (`same_code`), counted by the version each kept ('not
    recorded': trained before tqc kept one): their validation macro-F1 is not what this code would score."""
    import optuna

    versions = (t.user_attrs.get("code_version") for t in study.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    return Counter(recorded or "not recorded" for recorded in versions if not same_code(recorded, version))


def short_version(version: str) -> str:
    """A code version as people read a commit: its first 10 digits, and what follows them ('-dirty:<edits>')."""
    commit = re.match(r"[0-9a-f]{40,64}", version)
    return version[:10] + version[commit.end():] if commit else version


def warn_of_other_code(study, version: str) -> None:
    """One line as a worker joins a study holding complete trials of other code (resumed after a fix in training):
    said, not refused, since a commit that changes nothing a trial runs (docs) is another version too, and the trials
    stay comparable where the fix changed nothing they measured. summary.json counts them (`other_code_version`)."""
    other = other_code_trials(study, version)
    if not other:
        return
    best = study.best_trial
    which = (f"the study's best, trial {best.number}, is one of them"
             if not same_code(best.user_attrs.get("code_version"), version) else "the study's best is not one of them")
    log.warning("tune: study %r holds %d complete trials of other code than this worker's %s (%s): their validation "
                "macro-F1 came from that code, not this; %s", study.study_name, sum(other.values()),
                short_version(version), ", ".join(f"{count} of {short_version(recorded)}"
                                                  for recorded, count in other.most_common()), which)


def check_study_data(study, params: Params, digest: str) -> None:
    """A study holds trials trained and scored on one data set: the validation macro-F1 of trials on two (new
    labeled questions arrived between two runs) are not comparable, nor is the best of them the best now."""
    recorded = study.user_attrs.get("data_digest")
    if recorded is None:  # a new study, or one begun before the digest was recorded
        study.set_user_attr("data_digest", digest)
    elif recorded != digest:
        raise ConfigError(f"study {study.study_name!r} in {redact_text(params.tune.storage)} holds trials trained and "
                          f"scored on other data (its catalog, training or validation rows differ: new labeled questions "
                          f"since it began?); name another study with tune.study, or set tune.on_new_data: new_study")


def check_study_base(study, params: Params, base: dict) -> None:
    """A study holds trials of one base configuration: the first worker records it, later ones must match it,
    so a study name reused for another dataset (or other fixed params) is refused instead of mixed."""
    check_study_space(study, params, base)
    mine = study_base(params, base)
    recorded = study.user_attrs.get("base_params")
    if recorded is None:
        study.set_user_attr("base_params", mine)
        return
    # Keys that fix no study are left out of what older versions recorded too, so their studies stay open
    recorded = {key: value for key, value in recorded.items() if not key.startswith(NOT_TUNED_ON)}
    searched_there = study.user_attrs.get("space_kinds") or {}
    # A param tqc gained after the study began is not in its record: at its default it changes nothing the trials did
    defaults = study_base(params, flat_base(Params()))
    differing = sorted(key for key in recorded.keys() | mine.keys() if recorded.get(key) != mine.get(key)
                       and not (key not in recorded and key not in searched_there and key in defaults
                                and mine[key] == defaults[key]))
    if differing:
        shown = ", ".join(_difference(key, recorded, mine, params.tune.space, searched_there) for key in differing[:5])
        raise ConfigError(f"study {study.study_name!r} in {redact_text(params.tune.storage)} holds trials of other params "
                          f"({shown}{' …' if len(differing) > 5 else ''}); name another study with tune.study")


def _difference(key: str, recorded: dict, mine: dict, space: dict, searched_there: dict) -> str:
    if key in space and key in recorded:  # a fixed param of the study's trials is searched now
        return f"{key}: fixed at {recorded[key]!r} there, searched here"
    if key in searched_there and key in mine:  # a dimension of the study's trials is fixed now
        return f"{key}: searched there, fixed at {mine[key]!r} here"
    return f"{key}: {recorded.get(key)!r} there, {mine.get(key)!r} here"


def space_kinds(space: dict[str, SearchDimension], base: dict) -> dict:
    """What Optuna cannot change under a parameter name once a study has sampled it: the choices
    of a categorical dimension, or whether a range is sampled as integers (see _suggest)."""
    return {name: list(dimension.choices) if dimension.choices is not None
            else ("int" if samples_integers(name, base.get(name)) else "float")
            for name, dimension in space.items()}


def check_study_space(study, params: Params, base: dict) -> None:
    """Refuse, before any work, a dimension whose choices or kind changed since the study sampled it:
    Optuna would fail mid-trial ("dynamic value space"). Re-bounded ranges are fine; a dimension added or removed
    changes the params the study's trials share, which `check_study_base` refuses."""
    mine = space_kinds(params.tune.space, base)
    recorded = study.user_attrs.get("space_kinds") or {}
    changed = sorted(name for name in mine.keys() & recorded.keys() if mine[name] != recorded[name])
    if changed:
        shown = ", ".join(f"{name}: {recorded[name]!r} there, {mine[name]!r} here" for name in changed)
        raise ConfigError(f"study {study.study_name!r} in {redact_text(params.tune.storage)} sampled other values for {shown}; "
                          "Optuna cannot change them within a study: name another study with tune.study")
    _check_sampled_distributions(study, params, base)
    if mine.keys() - recorded.keys():
        study.set_user_attr("space_kinds", {**recorded, **mine})


def _check_sampled_distributions(study, params: Params, base: dict) -> None:
    """What `space_kinds` does not hold (a range's `log`, and a study recorded before it did) checked against the
    distributions the study's trials were drawn from: a changed `log` passed, and the first trial's draw failed
    ("Cannot set different log configuration") after the data was prepared."""
    from optuna.distributions import check_distribution_compatibility

    wanted = {name: distribution(name, dimension, base.get(name)) for name, dimension in params.tune.space.items()}
    for trial in study.get_trials(deepcopy=False):
        for name, drawn_from in trial.distributions.items():
            if name not in wanted:
                continue
            try:
                check_distribution_compatibility(drawn_from, wanted[name])
            except ValueError as exc:
                raise ConfigError(f"tune.space.{name}: study {study.study_name!r} in {redact_text(params.tune.storage)} "
                                  f"drew it from {drawn_from} (trial {trial.number}), here {wanted[name]}: {exc} Optuna "
                                  "cannot change that within a study: name another study with tune.study, or undo "
                                  "the change") from None
            del wanted[name]  # one trial's draw says what the study holds for the name


def enqueue_baseline(study, base_values: dict, version: str) -> None:
    """Trial 0 of these params: it samples nothing (its values may lie outside the space) and runs the base
    params. Enqueued again whenever the searched params' base values change (e.g. after `tune --apply`), and when the
    code changed since it trained (`version`, `same_code`): the mark to beat is this code's figure."""
    import optuna

    # A waiting, running or finished baseline counts (a finished one of this code); a failed one (interrupted with
    # Ctrl-C, or a killed worker's, failed by the heartbeat check) is queued again, or the study would have no baseline
    states = optuna.trial.TrialState
    for trial in study.get_trials(deepcopy=False):
        if (trial.user_attrs.get("baseline") and trial.user_attrs.get("base_values") == base_values
                and (trial.state in (states.WAITING, states.RUNNING)
                     or trial.state != states.FAIL and same_code(trial.user_attrs.get("code_version"), version))):
            return
    study.enqueue_trial({}, user_attrs={"baseline": True, "base_values": base_values})


HEARTBEAT_SECONDS, GRACE_SECONDS = 60, 240  # a running trial says it is alive every minute; 4 silent minutes fail it


@contextmanager
def _heartbeats_are_experimental() -> Iterator[None]:
    """Optuna warns that heartbeats are "experimental" (since 2.9) at each use; tqc relies on them knowingly."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def check_storage(storage: str) -> None:
    """A `tune.storage` that cannot be a study's database, refused before any data is prepared: a URL SQLAlchemy cannot
    parse, or a SQLite file whose folder is not there (said by SQLAlchemy only as "unable to open database file")."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(storage)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigError(f"tune.storage {redact_text(storage)!r}: not a database URL (sqlite:///optuna.db for a file "
                          "here, sqlite:////abs/path/optuna.db, postgresql://user@host/db for a server)") from None
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            and not Path(url.database).parent.is_dir():
        raise ConfigError(f"tune.storage {redact_text(storage)!r}: no folder {Path(url.database).parent} to keep the "
                          "study's database in")


def open_storage(params: Params, worker: int, attempts: int = 5):
    """tune.storage opened, its tables made, or a ConfigError naming it in one line: a server that cannot be reached,
    a file that is not a database, a driver not installed, a schema of another Optuna. The engines' own messages
    span lines (SQL, a link) and name no setting."""
    import optuna
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError

    # worth another try: a race between workers creating the tables at once (SQLite's "table already exists" or
    # "database is locked", PostgreSQL's duplicate key), a server not up yet; not a file that is no database
    retried = (OperationalError, IntegrityError, ProgrammingError)
    url = params.tune.storage
    for attempt in range(attempts):
        try:
            # Heartbeats: a trial whose worker was killed (no Ctrl-C to mark it) is failed once it has been silent
            # for the grace period, instead of staying RUNNING for ever
            with _heartbeats_are_experimental():
                return optuna.storages.RDBStorage(url, engine_kwargs=connect_bound(url),
                                                  heartbeat_interval=HEARTBEAT_SECONDS, grace_period=GRACE_SECONDS,
                                                  **{_stale_trial_callback_keyword(): _record_lost_worker})
        except (SQLAlchemyError, ImportError, RuntimeError) as error:  # RuntimeError: Optuna's, of its schema's version
            if not isinstance(error, retried) or attempt == attempts - 1:
                said = first_line(str(error)) or type(error).__name__
                raise ConfigError(f"tune.storage {redact_text(url)!r}: cannot open the study's database: "
                                  f"{redact_text(said)}") from None
            time.sleep(1.0 + worker)


def connect_bound(url: str) -> dict | None:
    """The engine arguments that bound how long a database server has to answer a connection (tracking's
    CONNECT_SECONDS): libpq's default is to wait for ever, so a server that takes the connection and never answers
    held a tuning worker, and the weekly flow's runs queued behind it. SQLite's timeout is its wait on a locked file
    between workers: left as Optuna sets it."""
    from sqlalchemy.engine import make_url

    from tqc.tracking import connect_timeout_args

    driver = make_url(url).get_driver_name()
    bound = connect_timeout_args(driver) if driver != "pysqlite" else {}
    return {"connect_args": bound} if bound else None


def _stale_trial_callback_keyword() -> str:
    """RDBStorage's argument for the callback on each trial its heartbeat check fails: `heartbeat_stale_trial_callback`
    from Optuna 4.9 on, `failed_trial_callback` before (deprecated since, and gone in 6; pyproject allows 4.0)."""
    import inspect

    import optuna

    accepted = inspect.signature(optuna.storages.RDBStorage).parameters
    return "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in accepted else "failed_trial_callback"


def _record_lost_worker(study, trial) -> None:
    """The reason of a trial the heartbeat check failed, kept in the study under `lost_worker_key`: Optuna calls this
    once the trial is FAIL, and refuses a user attribute on a finished trial, so it cannot keep `failed` as others do."""
    study.set_user_attr(lost_worker_key(trial.number),
                        f"worker lost: {trial.user_attrs.get('worker', 'its worker')} sent no heartbeat for over "
                        f"{GRACE_SECONDS} s mid-trial (killed, or its machine lost)")


def lost_worker_key(number: int) -> str:
    """The study's user attribute for trial `number` failed by the heartbeat check: one key a trial, so two workers
    failing two trials at once write two keys, where one shared dict would keep the last writer's alone."""
    return f"trial {number} failed"


def failure_reasons(study) -> dict[int, str]:
    """Why each failed trial failed, where it was said: its `refused` or `failed` attribute, or the study's record of
    a trial whose worker was lost."""
    recorded = study.user_attrs
    reasons = {t.number: t.user_attrs.get("refused") or t.user_attrs.get("failed") or
               recorded.get(lost_worker_key(t.number)) for t in study.get_trials(deepcopy=False)}
    return {number: reason for number, reason in reasons.items() if reason}


def first_line(text: str) -> str:
    """The first line of `text` that says something."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def open_study(params: Params, worker: int, name: str | None = None, attempts: int = 5, storage=None):
    """Create or join the study `name` (default tune.study) in `storage` (default: tune.storage, opened). Workers
    starting together race to create the storage's tables; the loser of that race simply tries again."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    settings = params.tune
    storage = open_storage(params, worker, attempts) if storage is None else storage
    for attempt in range(attempts):
        try:
            study = optuna.create_study(study_name=name or settings.study, storage=storage, direction="maximize",
                                        load_if_exists=True, pruner=_pruner(params))
            break
        except SQLAlchemyError:
            if attempt == attempts - 1:
                raise
            time.sleep(1.0 + worker)
    with _heartbeats_are_experimental():
        optuna.storages.fail_stale_trials(study)  # before the baseline is looked for: a killed one is queued again
    # Seeded by this worker index's own earlier trials too: one that comes back to a study (a second `tqc tune`)
    # would otherwise replay its earlier random draws, trial for trial. Only its own, so that workers starting
    # together on a new study seed as seed + worker whatever order they open it in.
    own = sum(t.user_attrs.get("worker", "").endswith(f":{worker}") for t in study.get_trials(deepcopy=False))
    # constant_liar: workers sharing the study see one another's running trials as poor, so they do not all sample the
    # same promising point (Optuna 5's default, not 4's, which pyproject allows)
    study.sampler = optuna.samplers.TPESampler(seed=(settings.seed + worker + 1009 * own) % 2**32, n_startup_trials=4,
                                               constant_liar=True)
    return study


def _pruner(params: Params):
    import optuna

    settings = params.tune
    reported = params.stage_one.epochs + params.stage_two.epochs  # the last step a trial reports
    if settings.pruner == "median":
        if settings.warmup_epochs >= reported:
            # Optuna prunes from step == warmup on: at best at a trial's last epoch, when pruning saves nothing
            # and only marks a trained trial PRUNED
            log.warning("tune: the median pruner can save no epoch: tune.warmup_epochs is %d, and a trial reports "
                        "%d epochs (stage_one.epochs + stage_two.epochs); lower warmup_epochs or train longer",
                        settings.warmup_epochs, reported)
        return optuna.pruners.MedianPruner(n_startup_trials=settings.startup_trials, n_warmup_steps=settings.warmup_epochs)
    if settings.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=reported)
    return optuna.pruners.NopPruner()

