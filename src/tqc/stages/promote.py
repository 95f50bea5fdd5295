"""Promote: register the stage-two model; move the champion alias only if it wins on validation.

A model whose content (model files, catalog, prior entry or exemplar rows and k, top_k, tqc version) is in the registry
already is not registered again: its version is the challenger, and if that is the champion the
report says so and nothing moves.

Runs inside an active MLflow run (the entry point sets tracking up). The challenger and the
champion answer the validation questions through the same pyfunc the registry serves, so the
gate compares what would really be deployed. The decision and its figures go to
`reports/promotion.json` and to the run.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tqc.config import ConfigError, PromoteParams, redact_text
from tqc.errors import RegistryError
from tqc.io import write_json
from tqc.promotion import Decision, class_changes, decide, refresh_changes_rule, tail_classes
from tqc.schema import Catalog, LabeledQuestion, load_questions
from tqc.text import first_of
from tqc.tracking import Tracker, offline_mlflow

log = logging.getLogger(__name__)


class ChampionUnavailable(RegistryError, RuntimeError):
    """The registry's champion cannot answer, so no challenger can be judged against it."""


@dataclass(frozen=True)
class _Champion:
    """The registry's alias holder when promote starts, and what it learnt from."""
    holder: Any  # the MLflow model version holding the alias; None: no champion yet
    version: str | None
    learnt: set[str] | None  # its `registry.question_hash`es; None without a record, or one that cannot be read
    unreadable: Exception | None  # why its artifacts could not be read: raised once the challenger is registered


@dataclass(frozen=True)
class _Challenger:
    """The version registered for this model, and the rule it serves."""
    version: str
    registered_before: bool  # found by its content digest
    answers_digest: str  # `registry.ANSWERS_TAG`: what it answers, however it is served
    rule: str
    rule_figures: dict | None  # under auto, what chose the rule (`_served_rule`)
    exemplars: tuple[Path, int] | None  # the exemplar rule's rows and k; None for the standard rule
    refresh: bool  # the champion's encoder refreshed with grown labeled questions: its bound is `_refresh_gate`'s


@dataclass(frozen=True)
class _Standing:
    """Where the challenger stands against the champion before the gate: the cases the gate cannot judge
    (`_overridden`)."""
    is_champion: bool  # the same content as the champion: its tags and alias stay
    rolled_back: tuple[str, str] | None  # (the version a person took the alias from, when): `_taken_by_hand`
    same_answers: bool  # it gives the champion's answers, served otherwise (`_gives_champions_answers`)

    @classmethod
    def of(cls, client, params: PromoteParams, champion: _Champion, challenger: _Challenger, model_dir: Path,
           data_dir: Path, prior_path: Path | None) -> _Standing:
        is_champion = champion.version == challenger.version
        # A version a person took the alias from (a rollback) found again by its digest, as any re-run of promote on
        # unchanged weights finds it, or registered again with its answers (another top_k): the gate, which it passed
        # once, would hand the alias back unasked
        rolled_back = None if is_champion else _taken_by_hand(client, params, challenger.version,
                                                               challenger.answers_digest)
        return cls(is_champion, rolled_back, not is_champion and _gives_champions_answers(
            client, params, champion, challenger, model_dir, data_dir, prior_path))


@dataclass(frozen=True)
class _Asked:
    """What the gate asks: the catalog answers are indices into, the training questions (their classes name the
    tail), the validation split, and of it the questions neither model learnt from, which alone are judged on."""
    catalog: Catalog
    train: list[LabeledQuestion]
    validation: list[LabeledQuestion]
    unseen: list[LabeledQuestion]  # in validation order
    gold: np.ndarray  # (N,) the unseen questions' catalog indices

    @classmethod
    def of(cls, catalog: Catalog, train: list[LabeledQuestion], validation: list[LabeledQuestion],
           unseen: list[LabeledQuestion]) -> _Asked:
        return cls(catalog, train, validation, unseen, np.array([catalog.index(q.class_id) for q in unseen], dtype=int))


@dataclass(frozen=True)
class _Contest:
    """What `_contest` gathers for the gate: the two versions, where the challenger stands, and what is asked."""
    champion: _Champion
    challenger: _Challenger
    standing: _Standing
    asked: _Asked


class _Judged(NamedTuple):
    """The gate's answer (`_judge`): each version's (N,) first answers to `_Asked.unseen`, and its decision."""
    challenger: np.ndarray
    champion: np.ndarray | None  # None where there is no champion, or none comparable
    incomparable: bool  # the champion answers with classes this catalog lacks (`_incomparable`)
    decision: Decision


def run(data_dir: Path, model_dir: Path, prior_path: Path | None, params: PromoteParams, report_path: Path, tracker: Tracker,
        seed: int = 0, exemplar_k: int = 2, refresh: bool = False, refreshed_from: str | None = None,
        registered_path: Path | None = None) -> dict:
    """`prior_path`: the prior stage's file, registered with the model so that it serves with its class-prior shift.
    With `params.rule` exemplars the version serves the exemplar rule instead: the validated training rows
    (`data_dir`/train.jsonl, what evaluate scored it with) and `exemplar_k` (evaluate's), and no shift. With auto it
    serves whichever of the two answers more validation questions right (`_served_rule`); the report says which and why.
    `refresh`: the challenger is the champion's encoder refreshed with grown labeled questions, judged against
    `params.refresh_min_improvement` (no worse) instead of `min_improvement`, where the champion serves the
    exemplar rule already or `params.rule` asks for it (else the refresh changes the rule, which must win). `refreshed_from`: the version whose
    encoder it serves (default: the alias holder now), whose training questions its encoder learnt from; the alias can
    have moved since the refresh downloaded it.

    The gate judges on the validation questions neither model learnt from: each version registers the questions it
    learnt from (`registry.TRAINED_ON`), and a champion's may be in this validation split (data grown, or a split
    drawn another way since), where it would answer them from memory.

    `registered_path`: where to write which registry holds the challenger, and as which version (`_write_registered`)."""
    if not tracker.active:
        return _tracking_disabled(params, report_path, registered_path)
    offline_mlflow()
    import mlflow

    catalog = Catalog.load(data_dir / "catalog.jsonl")
    train = load_questions(data_dir / "train.jsonl")
    client = mlflow.MlflowClient()
    contest = _contest(client, params, catalog, train, data_dir, model_dir, prior_path, exemplar_k, refresh,
                       refreshed_from)
    holder_now, judged = _unless_the_champion_moved(client, params, contest.champion.version,
                                                    _decided(client, params, seed, contest))
    report = _report(params, contest.challenger, contest.champion.version, holder_now, judged.decision, contest.asked,
                     judged.challenger, judged.champion)
    _publish(client, params, contest, judged, report, report_path, registered_path, tracker)
    return report


def _contest(client, params: PromoteParams, catalog: Catalog, train: list[LabeledQuestion], data_dir: Path,
             model_dir: Path, prior_path: Path | None, exemplar_k: int, refresh: bool,
             refreshed_from: str | None) -> _Contest:
    """The champion; the challenger, registered with the rule it serves (`_register_challenger`); where it stands
    against the champion; and what the gate asks the two. A champion that cannot be read is raised once the
    challenger is registered, and one that can has its tags put right first (`_tags_follow_the_alias`)."""
    champion = _champion(client, params)
    learnt, record = _challenger_learnt(train, params.model_name, champion, refresh, refreshed_from)
    validation = load_questions(data_dir / "validation.jsonl")
    challenger = _register_challenger(params, model_dir, data_dir, prior_path, exemplar_k, refresh, record,
                                      _unseen(validation, learnt, champion.learnt))
    _raise_if_unreadable(params.model_name, champion, challenger.version)
    if champion.holder is not None:  # the holder read again: the alias may have moved while the challenger registered
        _tags_follow_the_alias(client, params.model_name, _holder_now(client, params) or champion.holder)
    standing = _Standing.of(client, params, champion, challenger, model_dir, data_dir, prior_path)
    asked = _Asked.of(catalog, train, validation,
                      _unseen(validation, learnt, None if standing.is_champion else champion.learnt))
    return _Contest(champion, challenger, standing, asked)


def _holder_now(client, params: PromoteParams):
    """The version holding `params.alias` now, or None. A failing registry raises: never "no champion"."""
    from tqc.registry import alias_version

    return alias_version(client, params.model_name, params.alias)


def _holder_version(client, params: PromoteParams) -> str | None:
    holder = _holder_now(client, params)
    return str(holder.version) if holder is not None else None


def _unless_the_champion_moved(client, params: PromoteParams, judged_against: str | None,
                               judged: _Judged) -> tuple[str | None, _Judged]:
    """The alias holder now, and `judged` with its promotion withdrawn where the alias moved while the gate judged
    (`tqc set-champion`, a rollback, or another promote: the retrain flow's beside `dvc repro`'s): moving it then would
    overwrite, unsaid, a champion the challenger was never judged against. The challenger is tagged incomparable, not
    rejected. MLflow sets an alias with no compare-and-set, so the window left is the report's writing between this
    read and the move."""
    now = _holder_version(client, params)
    if now == judged_against or not judged.decision.promote:
        return now, judged
    moved = (f"{params.alias} moved from {_named(judged_against)} to {_named(now)} while the gate judged against "
             f"{_named(judged_against)}: not promoted; run promote again to judge against the new holder")
    return now, judged._replace(incomparable=True, decision=replace(
        judged.decision, promote=False, reasons=[moved, *judged.decision.reasons]))


def _named(version: str | None) -> str:
    return f"v{version}" if version is not None else "no version"


def _decided(client, params: PromoteParams, seed: int, contest: _Contest) -> _Judged:
    """The gate's answers (`_judge`), its decision replaced where a case it cannot judge decides (`_overridden`)."""
    champion, challenger, standing = contest.champion, contest.challenger, contest.standing
    judged = _judge(client, params, seed, champion, challenger, standing, contest.asked)
    return judged._replace(decision=_overridden(judged.decision, params, challenger.version, champion.version, standing,
                                                judged.incomparable))


def _publish(client, params: PromoteParams, contest: _Contest, judged: _Judged, report: dict, report_path: Path,
             registered_path: Path | None, tracker: Tracker) -> None:
    """The report to its file and the run, then the registry (the alias moved, or the challenger tagged why not),
    then the registered file and the outcome's log line."""
    import mlflow

    version, decision = contest.challenger.version, judged.decision
    _write_and_log(report_path, report, decision, tracker)
    # The registry last: a step before it that fails leaves the champion where it was, so a retry judges the
    # same two versions again instead of finding the challenger already holding the alias.
    try:
        _move_alias_or_tag(client, params, version, decision.promote, contest.standing, judged.incomparable)
    except BaseException as exc:
        if decision.promote:  # the report already said promoted: say who holds the alias now, then fail the stage
            after = _alias_after_failure(client, params, report, exc)
            _write_and_log(report_path, after, replace(decision, promote=after["promoted"]), tracker)
        raise
    _write_registered(registered_path, mlflow.get_tracking_uri(), report)
    _log_outcome(params, version, report["champion_version_after"], decision)


def _alias_after_failure(client, params: PromoteParams, report: dict, exc: BaseException) -> dict:
    """`report` of a promotion whose registry writes failed part way: the alias holder read back (the alias may have
    moved before a tag write failed), whether that is the challenger, and why."""
    try:
        after, read = _holder_version(client, params), True
    except Exception:  # the registry is down: nothing can be said of the alias
        after, read = None, False
    promoted = read and after == report["challenger_version"]
    said = (f"{params.alias} is v{after} after it" if read and after else
            f"no version holds {params.alias} after it" if read else f"{params.alias} could not be read back after it")
    return {**report, "promoted": promoted, "champion_version_after": after,
            "reasons": [*report["reasons"], f"a registry write failed ({type(exc).__name__}: {redact_text(str(exc))}): "
                                            f"{said}, and the stage failed"]}


def _log_outcome(params: PromoteParams, version: str, champion_version: str | None, decision: Decision) -> None:
    log.info("promote: %s v%s %s; %s", params.model_name, version,
             f"is now {params.alias}" if decision.promote else f"not promoted ({params.alias} stays {_named(champion_version)})",
             "; ".join(decision.reasons))


def _tracking_disabled(params: PromoteParams, report_path: Path, registered_path: Path | None) -> dict:
    """The report, and the registered file, where tracking is off and there is no registry."""
    # promotion.json's usual keys, nothing registered: a reviewer's diff shows what changed, not a new layout
    report = {"model_name": params.model_name, "alias": params.alias, "challenger_version": None, "rule": params.rule,
              "challenger_registered_before": False, "champion_version_before": None, "champion_version_after": None,
              "promoted": False,
              "reasons": ["tracking is disabled (tracking.enabled: false): no registry to promote in"]}
    write_json(report_path, report)
    _write_registered(registered_path, None, report)
    log.warning("promote: %s", report["reasons"][0])
    return report


def _champion(client, params: PromoteParams) -> _Champion:
    """The alias holder and the questions it learnt from; artifacts it cannot read are kept to raise later."""
    holder = _holder_now(client, params)
    version = str(holder.version) if holder is not None else None
    try:
        return _Champion(holder, version, _learnt_from(params.model_name, version), None)
    except Exception as exc:  # the champion's artifacts: raised as ChampionUnavailable once the challenger is registered
        return _Champion(holder, version, None, exc)


def _challenger_learnt(train: list[LabeledQuestion], model_name: str, champion: _Champion, refresh: bool,
                       refreshed_from: str | None) -> tuple[set[str], set[str] | None]:
    """(the questions the challenger learnt from, the record it registers of them: None where they are unknown in
    part), as `registry.question_hash`es."""
    from tqc.registry import question_hash

    learnt = {question_hash(q.text) for q in train}  # the training questions; the exemplar rule's rows too
    if not refresh:
        return learnt, learnt
    # a refresh serves the champion's encoder, which learnt from the champion's questions too
    source_learnt = _source_learnt(model_name, refreshed_from, champion.version, champion.learnt)
    learnt = learnt | (source_learnt or set())
    return learnt, (learnt if source_learnt is not None else None)  # unknown in part: no record rather than a short one


def _register_challenger(params: PromoteParams, model_dir: Path, data_dir: Path, prior_path: Path | None,
                         exemplar_k: int, refresh: bool, record: set[str] | None,
                         questions: list[LabeledQuestion]) -> _Challenger:
    """The rule the challenger serves, chosen on `questions` (`_served_rule`), and its registered version, which
    records `record` as the questions it learnt from."""
    from tqc.registry import register

    # A refresh is the exemplar rule by what it is (the champion's encoder, grown exemplars, no prior stage), whatever
    # the params of the run that judges it say: a retrain run judging the last run's refresh may train, with `standard`
    with tempfile.TemporaryDirectory(prefix="tqc-promote-exemplars-") as encoded:  # auto's choice encodes them once
        rule, rule_figures = _served_rule("exemplars" if refresh else params.rule, model_dir, data_dir, prior_path,
                                          exemplar_k, questions, Path(encoded))
        exemplars = (data_dir / "train.jsonl", exemplar_k) if rule == "exemplars" else None
        version, registered_before, answers = register(model_dir, data_dir / "catalog.jsonl",
                                                       None if exemplars else prior_path, params.model_name, params.top_k,
                                                       exemplars, trained_on=record, encoded_in=Path(encoded))
    return _Challenger(version, registered_before, answers, rule, rule_figures, exemplars, refresh)


def _raise_if_unreadable(model_name: str, champion: _Champion, version: str) -> None:
    """A champion whose artifacts cannot be read judges nothing, unless it is the challenger `version` itself."""
    if champion.unreadable is not None and champion.version != version:
        raise ChampionUnavailable(
            f"{model_name} v{champion.version}, the champion, cannot be read ({type(champion.unreadable).__name__}: "
            f"{champion.unreadable}); challenger v{version} is registered and not judged. Repair the champion's "
            "artifacts, or move the alias by hand, then run promote again (a retrain flow judges it first at its next run)"
        ) from champion.unreadable


def _gives_champions_answers(client, params: PromoteParams, champion: _Champion, challenger: _Challenger,
                             model_dir: Path, data_dir: Path, prior_path: Path | None) -> bool:
    """Whether the challenger gives the champion's answers, served otherwise (top_k): no validation gate can tell the
    two apart, so none judges it."""
    from tqc.registry import answers_of

    return champion.holder is not None and challenger.answers_digest == answers_of(
        client, params.model_name, champion.holder, model_dir, data_dir / "catalog.jsonl",
        None if challenger.exemplars else prior_path, challenger.exemplars)


def _judge(client, params: PromoteParams, seed: int, champion: _Champion, challenger: _Challenger, standing: _Standing,
           asked: _Asked) -> _Judged:
    """The gate on `asked.unseen` (`asked.gold`: their (N,) catalog indices)."""
    gold = asked.gold
    judged = {q.class_id for q in asked.unseen}  # the classes a validation question asked here can tell apart
    tail_ids = tail_classes([q.class_id for q in asked.train], [c for c in asked.catalog.class_ids if c in judged],
                            params.tail_fraction)
    if not asked.unseen and champion.version is not None:  # every validation question is one the champion or the challenger learnt from
        return _Judged(gold, gold, False, _nothing_unseen(len(asked.validation), tail_ids))
    challenger_served, champion_served = (
        _answers_on_validation(client, params.model_name, challenger.version, champion.version, asked.unseen,
                               asked.catalog)
        if asked.unseen else (_Served(gold, frozenset(asked.catalog.class_ids)), None))  # no question to ask: the first model still becomes champion
    challenger_answers = challenger_served.answers
    champion_answers = None if champion_served is None else champion_served.answers
    # A champion answering with classes this catalog lacks has no accuracy here that means anything: none is reported
    incomparable = not standing.is_champion and champion_answers is not None and bool(np.any(champion_answers < 0))
    if incomparable:
        champion_answers = None
    gate, refresh_reason = _refresh_gate(params, challenger.refresh, champion)
    new_classes = (challenger_served.answerable - champion_served.answerable
                   if champion_answers is not None and not standing.is_champion else frozenset())
    if new_classes and not _switches_rule(params, challenger.refresh, champion):
        decision = _judged_on_shared_classes(asked, judged, tail_ids, challenger_answers, champion_answers,
                                             champion_served.answerable, new_classes, gate, params, champion.version, seed)
    else:
        decision = decide(gold, challenger_answers, champion_answers,
                          np.array([asked.catalog.index(c) for c in tail_ids]), tail_ids, gate, seed)
        if new_classes:  # a change of rule must still win: said, with the classes only the challenger answers
            decision = replace(decision, reasons=[_new_classes_said(asked.catalog, new_classes, champion.version)
                                                  + "; it changes the rule too, so it must still win"] + decision.reasons)
    decision = replace(decision, reasons=decision.reasons + _unjudged_reasons(asked.catalog.class_ids, judged) +
                       _left_out_reasons(len(asked.validation), len(asked.unseen),
                                         None if standing.is_champion else champion.version, champion.learnt))
    if refresh_reason is not None and champion_answers is not None:
        decision = replace(decision, reasons=[refresh_reason] + decision.reasons)
    return _Judged(challenger_answers, champion_answers, incomparable, decision)


def _judged_on_shared_classes(asked: _Asked, judged: set[str], tail_ids: list[str], challenger: np.ndarray,
                              champion: np.ndarray, champion_classes: frozenset[str], new_classes: frozenset[str],
                              gate: PromoteParams, params: PromoteParams, champion_version: str, seed: int) -> Decision:
    """The gate where the challenger answers classes of this catalog the champion cannot (the catalog grew since the
    champion was registered, or the exemplar rule has rows for them now): judged on the validation questions of the
    classes both answer, where it needs only to be no worse (promote.refresh_min_improvement), its tail drawn from
    those classes. Under min_improvement a new intent was served only once the challenger won by a margin its few
    validation questions could rarely show, so the alias stayed on a model that can never answer it; judged on every
    question, the champion's certain misses on the new classes would hide a loss on the others."""
    lenient = gate.model_copy(update={"min_improvement": min(gate.min_improvement, params.refresh_min_improvement)})
    gold = asked.gold
    shared = np.isin(gold, [asked.catalog.index(c) for c in champion_classes])  # (N,) questions both can answer right
    said = _new_classes_said(asked.catalog, new_classes, champion_version)
    if not shared.any():  # every question asked is of a class only the challenger answers
        decision = decide(gold, challenger, champion, np.array([asked.catalog.index(c) for c in tail_ids]), tail_ids,
                          lenient, seed)
        return replace(decision, reasons=[f"{said}; no validation question asked is of a class both answer, so it is "
                                          "judged on them all"] + decision.reasons)
    shared_ids = [c for c in asked.catalog.class_ids if c in judged and c in champion_classes]
    shared_tail = tail_classes([q.class_id for q in asked.train], shared_ids, params.tail_fraction)
    decision = decide(gold[shared], challenger[shared], champion[shared],
                      np.array([asked.catalog.index(c) for c in shared_tail]), shared_tail, lenient, seed)
    return replace(decision, reasons=[
        f"{said}: judged on the {int(shared.sum())} validation question(s) of the classes both answer, where it needs "
        f"only to be no worse (promote.refresh_min_improvement); the other {int((~shared).sum())} only it can answer"]
        + decision.reasons)


def _new_classes_said(catalog: Catalog, new_classes: frozenset[str], champion_version: str) -> str:
    named = [c for c in catalog.class_ids if c in new_classes]
    return (f"the challenger answers {len(named)} class(es) of this catalog that the champion, v{champion_version}, "
            f"cannot ({first_of(named)})")


def _unjudged_reasons(class_ids: list[str], judged: set[str]) -> list[str]:
    """Said where some classes have no validation question the gate asked: neither check can judge them, and the tail
    is drawn from the others."""
    unjudged = [c for c in class_ids if c not in judged]
    if not unjudged:
        return []
    return [f"{len(unjudged)} class(es) have no validation question judged here, so neither check judges them and "
            f"the tail is drawn from the other {len(class_ids) - len(unjudged)}: {first_of(unjudged)}"]


def _switches_rule(params: PromoteParams, refresh: bool, champion: _Champion) -> bool:
    """Whether the challenger is a refresh that would switch a standard-rule champion to the exemplar rule, which,
    under auto (or standard, in a run judging an earlier run's refresh), must win."""
    return refresh and champion.holder is not None and refresh_changes_rule(
        params.rule, champion.holder.tags.get("rule", "standard"))


def _refresh_gate(params: PromoteParams, refresh: bool, champion: _Champion) -> tuple[PromoteParams, str | None]:
    """The params the gate judges with, and where the challenger is a refresh, the reason that names its bound."""
    switches_rule = _switches_rule(params, refresh, champion)
    lenient = refresh and not switches_rule
    if lenient:
        return (params.model_copy(update={"min_improvement": params.refresh_min_improvement}),
                "a refresh of the champion's encoder needs only to be no worse: the bound is "
                "promote.refresh_min_improvement")
    if switches_rule:
        return params, (f"promote.rule {params.rule}: the champion, v{champion.version}, serves the standard-question "
                        "rule, and this refresh the exemplar rule: a change of rule must win (promote.min_improvement), "
                        "not only be no worse")
    return params, None


def _overridden(decision: Decision, params: PromoteParams, version: str, champion_version: str | None,
                standing: _Standing, incomparable: bool) -> Decision:
    """The gate's decision, unless a case it cannot judge decides instead, the first that holds of: the challenger
    is the champion, was rolled back, gives the champion's answers, or the champion's answers are incomparable."""
    if standing.is_champion:
        return _already_champion(decision, version)
    if standing.rolled_back is not None:
        return _taken_back(decision, version, *standing.rolled_back, params)
    if standing.same_answers:
        return _same_answers(decision, champion_version)
    if incomparable:
        return _incomparable(decision, champion_version, params)
    return decision


def _write_and_log(report_path: Path, report: dict, decision: Decision, tracker: Tracker) -> None:
    """promotion.json, and its figures and the file in the run."""
    write_json(report_path, report)
    tracker.log_metrics({"promoted": int(decision.promote), **report["validation"],
                         **_rule_metrics(report.get("rule_on_validation")),
                         **({"ci_low": decision.bootstrap.low, "ci_high": decision.bootstrap.high,
                             "difference": decision.bootstrap.difference} if decision.bootstrap else {})}, prefix="promotion.")
    tracker.log_artifact(report_path)


def _move_alias_or_tag(client, params: PromoteParams, version: str, promote: bool, standing: _Standing,
                       incomparable: bool) -> None:
    """A promoted challenger takes the alias; one not promoted is tagged why, unless it is the champion already."""
    rolled_back = standing.rolled_back
    if promote:
        _move_alias(client, params, version)
    elif not standing.is_champion and (rolled_back is None or rolled_back[0] != version):  # one rolled back keeps its tags:
        # superseded, and by whom
        client.set_model_version_tag(params.model_name, version, "promotion", "incomparable" if incomparable else "rejected")


def _write_registered(path: Path | None, registry_uri: str | None, report: dict) -> None:
    """The registry this run registered the challenger in, its version and the alias holder after: a DVC output in
    neither git nor DVC's cache (cached, `dvc pull` brought it back and a fresh clone skipped promote too). The
    registry lives outside DVC, so `reports/promotion.json` (in git) alone would let `dvc repro` in a fresh clone,
    whose inputs all match dvc.lock, skip promote and leave that machine's registry empty; this file is missing
    there, so promote runs. A second `dvc repro` on the same machine finds it and skips."""
    if path is not None:
        write_json(path, {"registry": redact_text(registry_uri) if registry_uri else None,
                          "model_name": report["model_name"], "version": report["challenger_version"],
                          "alias": report["alias"], "alias_version": report["champion_version_after"]})


def _served_rule(asked: str, model_dir: Path, data_dir: Path, prior_path: Path | None, exemplar_k: int,
                 questions: list[LabeledQuestion], exemplar_cache: Path | None = None) -> tuple[str, dict | None]:
    """The rule the challenger serves, and with `promote.rule` auto what chose it: each rule's accuracy on the
    validation questions the gate judges on (neither model learnt from them), each answered by the code the registry
    serves (the standard questions with the class-prior shift, the exemplar rule without one). The exemplar rule must
    be right more often to be chosen: a tie keeps the method's own rule. (Validation also chose the checkpoint and
    fitted the shift, which the standard rule alone uses, so the comparison leans its way, and a choice of exemplars
    is firm.) The gate then judges the better of two on the questions that chose it, so under auto its figure for the
    challenger leans a little high; the report gives both rules' figures. `exemplar_cache`: where the exemplar rule's
    encoded rows are kept for the registration that follows."""
    if asked != "auto":
        return asked, None
    if not questions:
        log.warning("promote: rule auto, and no validation question is left to choose by: the standard-question rule")
        return "standard", {"asked": "auto", "n": 0, "standard_accuracy": None, "exemplars_accuracy": None}
    gold = np.array([q.class_id for q in questions])
    accuracy = {rule: float(np.mean(_local_top1(model_dir, data_dir, prior_path, exemplars, questions,
                                                exemplar_cache) == gold))
                for rule, exemplars in (("standard", None), ("exemplars", (data_dir / "train.jsonl", exemplar_k)))}
    chosen = "exemplars" if accuracy["exemplars"] > accuracy["standard"] else "standard"
    log.info("promote: rule auto: the %s rule (validation accuracy: standard questions %.4f, exemplar rule %.4f, "
             "on %d questions)", chosen, accuracy["standard"], accuracy["exemplars"], len(questions))
    return chosen, {"asked": "auto", "n": len(questions), "standard_accuracy": accuracy["standard"],
                    "exemplars_accuracy": accuracy["exemplars"]}


def _local_top1(model_dir: Path, data_dir: Path, prior_path: Path | None, exemplars: tuple[Path, int] | None,
                questions: list[LabeledQuestion], exemplar_cache: Path | None = None) -> np.ndarray:
    """(N,) each question's first answer (a class id) from the matcher a version would serve, loaded locally."""
    import pandas as pd

    from tqc.serving import local_matcher

    matcher = local_matcher(model_dir, data_dir / "catalog.jsonl", 1, None if exemplars else prior_path, exemplars,
                            exemplar_cache)
    matcher.says_cut = False  # validation questions, which evaluate scores cut as silently (as `served_first_answers`)
    answers = matcher.predict(None, pd.DataFrame({"question": [q.text for q in questions]}), params={"top_k": 1})
    return answers[answers["rank"] == 1]["class_id"].to_numpy()  # in question order


def _rule_metrics(figures: dict | None) -> dict[str, float]:
    if not figures or figures["n"] == 0:
        return {}
    return {"rule_standard_accuracy": figures["standard_accuracy"], "rule_exemplars_accuracy": figures["exemplars_accuracy"]}


def set_champion(params: PromoteParams, version: str) -> tuple[str, str | None]:
    """Move `params.alias` to registered `version` by hand, with no gate: a rollback to an earlier champion, or a
    version the gate rejected that a person has judged. The tags follow the alias at once (`_move_alias`), and the
    version is tagged `alias_set_by_hand` with the time. Returns (the version as the registry spells it, the version
    that held the alias before: None where none did). Runs against the registry MLflow is set to."""
    offline_mlflow()
    import mlflow

    client = mlflow.MlflowClient()
    chosen = _servable_version(client, params, version)
    version = str(chosen.version)  # "01" is v1
    before = _holder_version(client, params)
    if before == version:
        return version, before
    _move_alias(client, params, version)
    _tag_set_by_hand(client, params, chosen, before)
    log.info("set-champion: %s@%s is v%s (was %s), set by hand", params.model_name, params.alias, version,
             f"v{before}" if before else "unset")
    return version, before


def _servable_version(client, params: PromoteParams, version: str):
    """Registered `version` of `params.model_name` (a ModelVersion), refused with a ConfigError where it is not
    registered, failed its judging, or cannot be loaded."""
    chosen = _registered_version(client, params.model_name, version)
    version = str(chosen.version)
    if chosen.tags.get("promotion") == "failed":  # registered, but it could not answer the validation questions
        raise ConfigError(f"{params.model_name} v{version} is tagged promotion: failed: it could not answer the "
                          "validation questions when it was judged, so it is not served")
    _require_loadable(params, version)
    return chosen


def _registered_version(client, model_name: str, version: str):
    """The registry's `model_name` `version`; one it does not hold is a ConfigError, any other failure its own."""
    from mlflow.exceptions import MlflowException

    from tqc.registry import NOT_FOUND_CODES

    try:
        return client.get_model_version(model_name, version)
    except MlflowException as exc:
        if exc.error_code in NOT_FOUND_CODES:
            raise ConfigError(f"{model_name} v{version}: no such registered version ({exc.message})") from None
        raise


def _require_loadable(params: PromoteParams, version: str) -> None:
    """Loaded as serving loads it: an alias on a version whose files are gone would serve nothing."""
    from mlflow.exceptions import MlflowException

    from tqc.serving import registered_matcher

    try:
        registered_matcher(f"models:/{params.model_name}/{version}")
    except (MlflowException, OSError, ValueError) as exc:
        raise ConfigError(f"{params.model_name} v{version} cannot be loaded, so it cannot be served "
                          f"({type(exc).__name__}: {exc}); {params.alias} stays where it is") from None


def _tag_set_by_hand(client, params: PromoteParams, chosen, before: str | None) -> None:
    """`chosen` tagged alias_set_by_hand, its alias_taken_by_hand tag gone; `before`, the version that lost the
    alias, tagged alias_taken_by_hand: both with the same time."""
    import datetime

    version = str(chosen.version)
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    client.set_model_version_tag(params.model_name, version, "alias_set_by_hand", when)
    taken = taken_by_hand_tag(params.alias)
    if taken in chosen.tags:  # served again by a person's choice: a gate may judge it again
        client.delete_model_version_tag(params.model_name, version, taken)
    if before is not None:  # the next promote finding it again by its digest must not hand the alias back
        client.set_model_version_tag(params.model_name, before, taken, when)


def _move_alias(client, params: PromoteParams, version: str) -> None:
    """`version` becomes `params.alias`; once the alias, what serving reads, has moved, the tags follow it: `version`
    champion, the version it replaced superseded by it. A tag write that fails after the alias moved leaves tags
    the next promote puts right (`_tags_follow_the_alias`)."""
    client.set_registered_model_alias(params.model_name, params.alias, version)
    _tags_follow_the_alias(client, params.model_name, client.get_model_version(params.model_name, version))


def _tags_follow_the_alias(client, model_name: str, holder) -> None:
    """The alias holder's tags say champion, and no `superseded_by` (a version champion again: a rollback); any
    other version tagged champion is tagged superseded by it. A promotion whose registry writes broke off can have
    tagged the holder superseded before its alias moved, or moved the alias to it before tagging it; an alias moved
    by hand (a rollback, docs/tracking.md) leaves the version that lost it tagged champion."""
    if "superseded_by" in holder.tags:
        client.delete_model_version_tag(model_name, str(holder.version), "superseded_by")
    if holder.tags.get("promotion") != "champion":
        client.set_model_version_tag(model_name, str(holder.version), "promotion", "champion")
    for stale in client.search_model_versions(f"name='{model_name}' and tags.promotion='champion'"):
        if str(stale.version) != str(holder.version):
            client.set_model_version_tag(model_name, str(stale.version), "promotion", "superseded")
            client.set_model_version_tag(model_name, str(stale.version), "superseded_by", str(holder.version))


def _answers_on_validation(client, model_name: str, version: str, champion_version: str | None, validation,
                           catalog: Catalog) -> tuple[_Served, _Served | None]:
    """(challenger's, champion's) first answers (N,) through the served pyfunc, each with the classes it can answer;
    the champion's None when there is none. A challenger that cannot answer is tagged `promotion: failed`
    (registered, never judged) and the error raised; a champion that cannot answer raises an error naming it, and the
    challenger is left untagged."""
    try:
        challenger = _validation_predictions(f"models:/{model_name}/{version}", validation, catalog)
    except Exception:
        # Registered but never judged: the tag says so, so that a registry listing does not read it as a candidate.
        if champion_version != version:
            client.set_model_version_tag(model_name, version, "promotion", "failed")
        raise
    if champion_version is None:
        return challenger, None
    if champion_version == version:  # the challenger is the champion: nothing to predict again
        return challenger, challenger
    try:
        return challenger, _validation_predictions(f"models:/{model_name}/{champion_version}", validation, catalog)
    except Exception as exc:  # the champion is what is broken: the challenger is not to blame, and nothing moves
        raise ChampionUnavailable(
            f"{model_name} v{champion_version}, the champion, cannot answer the validation questions "
            f"({type(exc).__name__}: {exc}); challenger v{version} is registered and not judged. Repair the champion's "
            f"artifacts, or move the alias by hand, then run promote again (a retrain flow judges it first at its next "
            "run)") from exc


def _learnt_from(model_name: str, version: str | None) -> set[str] | None:
    """The questions registered `version` learnt from (`registry.question_hash`es); None without a version or a record."""
    if version is None:
        return None
    from tqc.registry import trained_on_record

    with tempfile.TemporaryDirectory(prefix="tqc-promote-") as scratch:
        return trained_on_record(model_name, version, Path(scratch))


def _source_learnt(model_name: str, refreshed_from: str | None, champion_version: str | None,
                   champion_learnt: set[str] | None) -> set[str] | None:
    """What the encoder a refresh serves learnt from: its source version's record (the champion's when it is the
    source); None when that is unknown, a source that cannot be read included (its refresh then records nothing)."""
    if refreshed_from is None or refreshed_from == champion_version:
        return champion_learnt
    try:
        return _learnt_from(model_name, refreshed_from)
    except Exception as exc:  # the source's artifacts: a record unknown in part, said, not a failed promotion
        log.warning("promote: the record of v%s, the refresh's source, cannot be read (%s): the refresh records none",
                    refreshed_from, exc)
        return None


def _unseen(validation: list[LabeledQuestion], challenger_learnt: set[str],
            champion_learnt: set[str] | None) -> list[LabeledQuestion]:
    """The validation questions neither model learnt from, in order."""
    from tqc.registry import question_hash

    learnt = challenger_learnt | (champion_learnt or set())
    return [q for q in validation if question_hash(q.text) not in learnt]


def _left_out_reasons(total: int, judged: int, champion_version: str | None, champion_learnt: set[str] | None) -> list[str]:
    """What the gate's figures leave out, or cannot: said beside the decision."""
    reasons = []
    if judged < total:
        reasons.append(f"judged on {judged} of the {total} validation questions: the other {total - judged} are "
                       "questions one of the two models learnt from")
    if champion_version is not None and champion_learnt is None:
        reasons.append(f"v{champion_version} was registered before versions recorded the questions they learnt from: "
                       "any of them in this validation split count as questions it answers from memory (`tqc "
                       f"trained-on --version {champion_version} --train FILE` records them)")
    return reasons


def _nothing_unseen(total: int, tail_ids: list[str]) -> Decision:
    return Decision(False, [f"all {total} validation questions are questions the champion or the challenger learnt "
                            "from: nothing is left to judge on, so the alias stays. Judge the two on other questions and "
                            "move the alias by hand"], None, tail_ids, None, None)


def _report(params: PromoteParams, registered: _Challenger, champion_version: str | None, holder_now: str | None,
            decision: Decision, asked: _Asked, challenger: np.ndarray, champion: np.ndarray | None) -> dict:
    """promotion.json: `registered` is the challenger's version and rule; `champion_version` the version judged
    against, `holder_now` the alias holder once judged (another, where the alias moved meanwhile); `challenger` and
    `champion` are the two versions' (N,) answers to the `asked.gold` questions."""
    gold = asked.gold
    judged = len(gold) > 0
    return {
        "model_name": params.model_name,
        "alias": params.alias,
        "challenger_version": registered.version,
        "rule": registered.rule,
        "challenger_registered_before": registered.registered_before,  # the same content (tag content_digest) was there: not registered again
        "champion_version_before": champion_version,
        "champion_version_after": registered.version if decision.promote else holder_now,
        "promoted": decision.promote,
        "validation": {
            "n": len(gold),  # the questions judged on
            "left_out_as_learnt_from": len(asked.validation) - len(gold),
            "challenger_accuracy": float(np.mean(challenger == gold)) if judged else None,
            "champion_accuracy": float(np.mean(champion == gold)) if champion is not None and judged else None,
        },
        **{k: v for k, v in decision.to_dict().items() if k != "promote"},  # "promoted" above says it
        "class_changes": class_changes(gold, challenger, champion, asked.catalog.class_ids) if champion is not None and judged else [],
        **({"rule_on_validation": registered.rule_figures} if registered.rule_figures is not None else {}),
    }


class _Served(NamedTuple):
    """A registered version's first answers to the validation questions asked, and the classes it can answer with."""
    answers: np.ndarray  # (N,) catalog indices; -1 for a class the catalog lacks
    answerable: frozenset[str]


def _validation_predictions(uri: str, validation, catalog: Catalog) -> _Served:
    from tqc.serving import served_first_answers

    first, answerable = served_first_answers(uri, [q.text for q in validation])
    return _Served(np.array([catalog.index(c) if c in catalog else -1 for c in first]), frozenset(answerable))


def taken_by_hand_tag(alias: str) -> str:
    """A version's tag, one per alias: when `tqc set-champion` moved that alias off it."""
    return f"alias_taken_by_hand.{alias}"


def _taken_by_hand(client, params: PromoteParams, version: str, answers: str) -> tuple[str, str] | None:
    """(the version a person moved `params.alias` off with `tqc set-champion`, when) for `version`, or for any version
    giving its answers (`answers_digest`: the same weights registered again for another `promote.top_k`), or None.
    (An alias moved in MLflow's own UI or client leaves no such mark, and a rollback made before the tag existed none
    either: the holder's `alias_set_by_hand` outlives a later gate promotion, so it cannot tell which version a person
    took it from.)"""
    from tqc.registry import ANSWERS_TAG

    tag = taken_by_hand_tag(params.alias)
    same = client.search_model_versions(f"name='{params.model_name}' and tags.{ANSWERS_TAG}='{answers}'")
    # `version` is among them (`register` tags every version it finds or makes with its answers): it is named first
    for candidate in sorted(same, key=lambda found: str(found.version) != version):
        if tag in candidate.tags:
            return str(candidate.version), candidate.tags[tag]
    return None


def _taken_back(decision, version: str, taken_from: str, when: str, params: PromoteParams):
    whose = f"v{version}" if taken_from == version else f"v{version} gives the answers of v{taken_from}, which"
    return replace(decision, promote=False, reasons=[
        f"{whose} lost {params.alias} by hand at {when} (tqc set-champion): a gate does not hand it back; "
        f"`tqc set-champion {version}` serves it again"] + decision.reasons)


def _already_champion(decision, version: str):
    return replace(decision, promote=False,
                   reasons=[f"the challenger is the champion, v{version}: the same content digest (model, catalog, "
                            "prior entry or exemplar rows and k, top_k, tqc version)"] + decision.reasons)


def _same_answers(decision, champion_version: str):
    return replace(decision, promote=True, reasons=[
        f"the champion's answers, v{champion_version}'s (the same model, catalog, shift or exemplar rows and k, and tqc "
        "version): only how they are served changed (promote.top_k), so the new serving replaces the old"]
        + decision.reasons)


def _incomparable(decision, champion_version: str, params: PromoteParams):
    """The champion serves another catalog (another dataset, say): its accuracy here would only count its
    answers wrong. Nothing moves, and the report says why and what to do."""
    return replace(decision, promote=False, reasons=[
        f"not comparable: the champion, v{champion_version}, answers with classes this catalog lacks, so it serves "
        f"another catalog (another dataset, say) and the alias stays. A new catalog wants its own registered model "
        f"(promote.model_name, now {params.model_name!r}); or move the alias by hand once you have judged the two"])
