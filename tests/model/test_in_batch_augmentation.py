"""Stage one with SharpReCL prototype mixup and CEAA cross-encoding: what the encoders see."""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest
import torch

from tests.conftest import CLASSES, synthetic_questions
from tqc.config import AugmentParams, ModelParams, StageOneParams
from tqc.model.encoder import BiEncoder
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion
from tqc.stages import stage_one

CATALOG = Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()])
PARAMS = StageOneParams(epochs=1, batch_size=8, learning_rate=1e-3, warmup_ratio=0.0, max_steps=4)


def long_tail_rows() -> list[LabeledQuestion]:
    rows = [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 16)]
    return [r for r in rows if r.class_id != "NUM"] + [r for r in rows if r.class_id == "NUM"][:2]  # NUM: 2 rows


class Recorder:
    """Wraps an encoder's forward to record the texts of every call."""

    def __init__(self, encoder):
        self.calls: list[list[str]] = []
        original = encoder.forward

        def forward(texts, **options):
            self.calls.append(list(texts))
            return original(texts, **options)

        encoder.forward = forward


def train_recording(tiny_model_dir, augment: AugmentParams):
    torch.manual_seed(0)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
    questions, standards = Recorder(model.question), Recorder(model.standard)
    rows = long_tail_rows()
    result = stage_one.train(model, rows, rows[:4], CATALOG, PARAMS, seed=0, augment=augment)
    return result, questions.calls, standards.calls


def test_prototype_mixup_puts_every_class_in_every_batch(tiny_model_dir):
    _, _, plain = train_recording(tiny_model_dir, AugmentParams())
    result, _, mixed = train_recording(tiny_model_dir, AugmentParams(prototype_mixup={"enabled": True, "per_class": 3}))
    # Batches of 8 from a long tail: without prototypes, some batch misses the rare class.
    assert any(CLASSES["NUM"][0] not in call for call in plain)
    assert mixed and all(sorted(call) == sorted(CATALOG.texts) for call in mixed)
    assert result.history[-1].train_loss > 0


def test_prototype_mixup_adds_the_balanced_term_and_prior_to_the_loss(tiny_model_dir):
    def first_loss(augment: AugmentParams) -> float:
        torch.manual_seed(0)
        model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
        params = PARAMS.model_copy(update={"learning_rate": 1e-12, "negatives": "all_classes"})  # same columns, no step
        return stage_one.train(model, long_tail_rows(), long_tail_rows()[:4], CATALOG, params, seed=0, augment=augment).history[1].train_loss

    base = first_loss(AugmentParams(implicit=[]))
    prior_only = first_loss(AugmentParams(implicit=[], prototype_mixup={"enabled": True, "weight": 0.0}))
    with_mixup = first_loss(AugmentParams(implicit=[], prototype_mixup={"enabled": True, "prior_weight": 0.0}))
    assert prior_only != base  # the class prior shifts the logits
    assert with_mixup > base  # the balanced set adds a positive term


def test_the_balanced_set_is_scored_without_the_prior_and_its_synthetic_share_reaches_its_end(tiny_model_dir, monkeypatch):
    """Its labels are uniform: a prior there biased scores toward the tail (its minimiser is −w·log π). Its share
    follows SharpReCL's t / T for t = 1 … T, so the last step is all synthetic, not (T−1)/T."""
    shares = []
    real_balanced_set, real_stage_loss = stage_one.balanced_set, stage_one.stage_loss

    def recording_set(questions, labels, prototypes, per_class, share, *args, **kwargs):
        shares.append(share)
        return real_balanced_set(questions, labels, prototypes, per_class, share, *args, **kwargs)

    def balanced_scores(weight: float) -> list[torch.Tensor]:
        seen = []

        def recording_loss(*args):
            loss = real_stage_loss(*args)
            return lambda scores, target, excluded: seen.append(scores.detach().clone()) or loss(scores, target, excluded)

        monkeypatch.setattr(stage_one, "stage_loss", recording_loss)
        torch.manual_seed(0)
        model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
        params = PARAMS.model_copy(update={"max_steps": 3, "learning_rate": 1e-12})
        stage_one.train(model, long_tail_rows(), long_tail_rows()[:4], CATALOG, params, seed=0,
                        augment=AugmentParams(implicit=[], prototype_mixup={"enabled": True, "per_class": 4, "prior_weight": weight}))
        return [scores for scores in seen if scores.shape[0] == 4 * len(CATALOG)]  # the balanced set's (P·per_class, P)

    monkeypatch.setattr(stage_one, "balanced_set", recording_set)
    plain, weighted = balanced_scores(0.0), balanced_scores(50.0)
    assert len(plain) == len(weighted) == 3
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(plain, weighted))  # the prior's weight moves none of them
    assert shares[-3:] == pytest.approx([0.5 + 0.5 / 3, 0.5 + 1.0 / 3, 1.0])


def test_cross_encoding_feeds_joined_inputs_and_relevance_targets(tiny_model_dir):
    _, plain_questions, _ = train_recording(tiny_model_dir, AugmentParams())
    _, questions, standards = train_recording(tiny_model_dir, AugmentParams(cross_encoding={"enabled": True, "share": 0.5}))
    assert not any("[SEP]" in text for call in plain_questions for text in call)
    joined = [text for call in questions for text in call if " [SEP] " in text.upper()]
    assert joined, "the question encoder never saw a joined input"
    standard_texts = {s.lower() for s in CATALOG.texts}
    assert all(text.split(" [SEP] ")[1].lower() in standard_texts for text in joined)
    assert any(call == ["is relevant", "is not relevant"] for call in standards)


class LossCall(NamedTuple):
    """One call of a stage's loss, on the CPU."""
    scores: torch.Tensor  # (B, U)
    target: torch.Tensor  # (B,) each row's column
    excluded: torch.Tensor | None  # (B, U) the columns left out of each row's negatives
    value: float


def _record_loss_calls(monkeypatch, stage) -> list[LossCall]:
    """Every call of `stage`'s loss from here on."""
    calls = []
    stage_loss = stage.stage_loss

    def recording(*args):
        loss_fn = stage_loss(*args)

        def loss(scores, target, excluded):
            value = loss_fn(scores, target, excluded)
            calls.append(LossCall(scores.detach().cpu(), target.cpu(), None if excluded is None else excluded.cpu(),
                                  value.item()))
            return value
        return loss

    monkeypatch.setattr(stage, "stage_loss", recording)
    return calls


def test_cross_encoding_never_pushes_a_joined_question_away_from_its_own_standard_question(tiny_model_dir, monkeypatch):
    calls = _record_loss_calls(monkeypatch, stage_one)
    train_recording(tiny_model_dir, AugmentParams(cross_encoding={"enabled": True, "share": 0.5}))
    # (J, U+2) of each cross-encoding call; the bi-encoder's own calls pass None (their columns are distinct)
    masks = [call.excluded for call in calls if call.excluded is not None]
    assert masks, "the cross-encoding term excluded nothing"
    for mask in masks:  # one own-class column per joined input, never a relevance text (the target)
        assert mask[:, :-2].sum(dim=1).tolist() == [1] * mask.shape[0] and not mask[:, -2:].any()


def test_deferred_rebalancing_keeps_generated_rows_out_of_stage_one_only(tiny_model_dir, tmp_path, monkeypatch):
    from collections import Counter

    from tqc.config import MineParams, StageTwoParams
    from tqc.schema import save_questions
    from tqc.stages import augment, mine, stage_two

    rows = long_tail_rows()
    rebalanced = augment.oversample(rows, augment.class_targets(Counter(q.class_id for q in rows), "mean"), seed=0)
    assert len(rebalanced) > len(rows)
    CATALOG.save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "validation.jsonl", rows[:4])
    save_questions(tmp_path / "train.jsonl", rebalanced)
    trained_on: dict[str, list[list[LabeledQuestion]]] = {"one": [], "two": []}  # each call's rows, per stage

    def recording(stage: str, train):
        def record(model, train_rows, *args, **kwargs):
            trained_on[stage].append(train_rows)
            return train(model, train_rows, *args, **kwargs)
        return record

    monkeypatch.setattr(stage_one, "train", recording("one", stage_one.train))
    monkeypatch.setattr(stage_two, "train", recording("two", stage_two.train))
    model_params = ModelParams(pretrained=str(tiny_model_dir))
    for deferred in (False, True):
        stage_one.run(tmp_path, tmp_path / "train.jsonl", model_params, AugmentParams(rebalance="mean", deferred=deferred),
                      PARAMS, 0, tmp_path / f"one-{deferred}", tmp_path / "h1.csv")
    # Not deferred: augment's rows; deferred: the original long tail, in its order (NUM keeps its 2 rows).
    assert trained_on["one"] == [rebalanced, rows]
    # Mining and stage two read augment's rows as they are: the rebalanced set joins there.
    mine.run(tmp_path, tmp_path / "train.jsonl", tmp_path / "one-True", MineParams(k=1), tmp_path / "neg.jsonl", tmp_path / "mine.json")
    stage_two.run(tmp_path, tmp_path / "train.jsonl", tmp_path / "neg.jsonl", tmp_path / "one-True",
                  AugmentParams(rebalance="mean", deferred=True), StageTwoParams(epochs=1, batch_size=8, max_steps=2),
                  0, tmp_path / "two", tmp_path / "h2.csv")
    assert trained_on["two"] == [rebalanced]


def _record(monkeypatch, stage, name: str, seen: list):
    """Wrap `stage.name` so each call's return value is appended to `seen`."""
    original = getattr(stage, name)

    def recording(*args, **kwargs):
        seen.append(original(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(stage, name, recording)


def _scores_and_columns(monkeypatch, stage, columns_function: str, train):
    """The score matrices `stage`'s loss receives during `train()`, and the column helper's result for each."""
    columns = []
    with monkeypatch.context() as patch:
        calls = _record_loss_calls(patch, stage)
        _record(patch, stage, columns_function, columns)
        train()
    return [call.scores for call in calls], columns


def test_logit_adjusted_loss_offsets_each_column_by_its_own_class_prior_in_both_stages(tiny_model_dir, monkeypatch):
    from tqc.config import StageTwoParams
    from tqc.losses import class_log_prior
    from tqc.schema import gold_indices
    from tqc.stages import stage_two

    # Three distinct class sizes, so each has its own log π, and two catalog classes first with no rows, so a
    # batch's columns are never simply 0..U−1: a column given another class's offset shows.
    catalog = Catalog([StandardQuestion("ABBR", "What does it stand for?"), StandardQuestion("DESC", "What does it mean?"),
                       *CATALOG.questions])
    rows = [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 12)]
    rows = [r for r in rows if r.class_id == "LOC"] + [r for r in rows if r.class_id == "HUM"][:6] + \
        [r for r in rows if r.class_id == "NUM"][:2]
    gold = torch.as_tensor(gold_indices(rows, catalog))
    offsets = 0.1 * 1.0 * class_log_prior(gold, len(catalog))  # (P,) τ·w·log π
    assert len(set(offsets[2:].tolist())) == 3

    def model():
        torch.manual_seed(0)
        return BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))

    def one(negatives: str, weight: float):
        params = PARAMS.model_copy(update={"learning_rate": 1e-12, "negatives": negatives, "logit_adjustment": weight})
        scores, columns = _scores_and_columns(monkeypatch, stage_one, "candidate_classes",
                                              lambda: stage_one.train(model(), rows, rows[:4], catalog, params, seed=0))
        return scores, [offsets[candidates].expand_as(s) for s, (candidates, _) in zip(scores, columns)]  # (B, U) each

    def two(negatives: str, weight: float):
        mined = torch.tensor([[2 + (g - 1) % 3] for g in gold.tolist()])  # (N, K = 1): another class with rows
        params = StageTwoParams(epochs=1, batch_size=8, learning_rate=1e-12, warmup_ratio=0.0, max_steps=2,
                                negatives=negatives, logit_adjustment=weight)
        scores, columns = _scores_and_columns(monkeypatch, stage_two, "candidate_columns",
                                              lambda: stage_two.train(model(), rows, mined, rows[:4], catalog, params, seed=0))
        if negatives == "mined":  # (B, K+1): each row's gold and mined class
            return scores, [offsets[distinct[per_row]] for distinct, per_row in columns]
        return scores, [offsets[distinct].expand_as(s) for s, (distinct, _) in zip(scores, columns)]  # (B, U)

    for train, negatives in ((one, "in_batch"), (one, "all_classes"), (two, "mined"), (two, "mined_and_in_batch")):
        plain, _ = train(negatives, 0.0)
        adjusted, expected = train(negatives, 1.0)
        assert plain and len(plain) == len(adjusted) == len(expected)
        for before, after, offset in zip(plain, adjusted, expected):
            assert after.shape == offset.shape
            assert torch.allclose(after - before, offset, atol=1e-5), (train.__name__, negatives)
    assert offsets[catalog.class_ids.index("NUM")] == offsets[2:].min()  # the tail starts furthest behind


def test_prototype_mixup_mixes_on_the_sphere_only_where_the_similarity_scores_there(tiny_model_dir, monkeypatch):
    calls = []  # the unit_norm of every balanced set stage one builds
    build = stage_one.balanced_set

    def recording(*args, **kwargs):
        calls.append(kwargs["unit_norm"])
        return build(*args, **kwargs)

    monkeypatch.setattr(stage_one, "balanced_set", recording)
    rows = long_tail_rows()
    for similarity in ("cosine", "inner"):
        torch.manual_seed(0)
        model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir), similarity=similarity))
        stage_one.train(model, rows, rows[:4], CATALOG, PARAMS, seed=0, augment=AugmentParams(prototype_mixup={"enabled": True}))
    steps = len(calls) // 2
    assert steps and calls == [True] * steps + [False] * steps


def test_every_training_stage_places_the_implicit_augmentation_where_params_say(tiny_model_dir, tmp_path, monkeypatch):
    """augment.implicit_at reaches the question encoder of stage one, stage two and the NC baseline: a stage that
    dropped it would silently train at the default place."""
    from tqc.config import BaselineNCParams, MineParams, StageTwoParams
    from tqc.schema import save_questions
    from tqc.stages import baseline_nc, mine, stage_two

    rows = long_tail_rows()
    CATALOG.save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "validation.jsonl", rows[:4])
    save_questions(tmp_path / "train.jsonl", rows)
    model_params = ModelParams(pretrained=str(tiny_model_dir))
    BiEncoder.from_params(model_params).save(tmp_path / "one")
    mine.run(tmp_path, tmp_path / "train.jsonl", tmp_path / "one", MineParams(k=1), tmp_path / "neg.jsonl", tmp_path / "mine.json")

    class Placed(Exception):
        pass

    def stop_with_placement(encoder_of):
        def train(model, *args, **kwargs):
            raise Placed(encoder_of(model).augmentation.at, encoder_of(model).augmentation.kinds)
        return train

    monkeypatch.setattr(stage_one, "train", stop_with_placement(lambda model: model.question))
    monkeypatch.setattr(stage_two, "train", stop_with_placement(lambda model: model.question))
    monkeypatch.setattr(baseline_nc, "train", stop_with_placement(lambda model: model.encoder))
    augment_params = AugmentParams(implicit=["dropout"], implicit_at="output")
    runs = {
        "stage one": lambda: stage_one.run(tmp_path, tmp_path / "train.jsonl", model_params, augment_params, PARAMS, 0,
                                           tmp_path / "out1", tmp_path / "h1.csv"),
        "stage two": lambda: stage_two.run(tmp_path, tmp_path / "train.jsonl", tmp_path / "neg.jsonl", tmp_path / "one",
                                           augment_params, StageTwoParams(epochs=1, batch_size=8), 0, tmp_path / "out2",
                                           tmp_path / "h2.csv"),
        "NC": lambda: baseline_nc.run(tmp_path, tmp_path / "train.jsonl", model_params, augment_params, BaselineNCParams(epochs=1),
                                      0, tmp_path / "nc", tmp_path / "h3.csv"),
    }
    for stage, run in runs.items():
        with pytest.raises(Placed) as placed:
            run()
        assert placed.value.args == ("output", ["dropout"]), stage


def test_a_class_that_shares_its_standard_question_is_no_negative_in_either_stage(tiny_model_dir, monkeypatch):
    """Twins encode alike: each stage's loss leaves the other's column out, or it would push a question away from a
    vector equal to its target's."""
    from tqc.config import StageTwoParams
    from tqc.stages import stage_two

    twins = Catalog([StandardQuestion("LOC", "Where is the place?"), StandardQuestion("HUM", "Who is the person?"),
                     StandardQuestion("NUM", "where is the place?")])  # NUM's text is LOC's, as validate compares texts
    rows = long_tail_rows()
    torch.manual_seed(0)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
    calls = _record_loss_calls(monkeypatch, stage_one)
    stage_one.train(model, rows, rows[:4], twins, PARAMS.model_copy(update={"negatives": "all_classes"}), seed=0)
    masks = [call.excluded for call in calls]
    assert masks and all(m is not None and m.shape[1] == 3 for m in masks)
    assert all(m[:, 1].sum() == 0 for m in masks)  # HUM shares no text: never left out
    assert all(m[:, [0, 2]].sum(1).le(1).all() for m in masks) and any(m[:, [0, 2]].any() for m in masks)

    calls = _record_loss_calls(monkeypatch, stage_one)  # prototype mixup: the balanced set against every prototype
    stage_one.train(model, rows, rows[:4], twins, PARAMS, seed=0,
                    augment=AugmentParams(prototype_mixup={"enabled": True, "per_class": 2}))
    balanced = [call.excluded for call in calls if call.scores.shape[0] == 3 * 2]  # (P·per_class, P)
    assert balanced and all(m is not None and m[:, 1].sum() == 0 and m[:, [0, 2]].any(1).sum() == 4 for m in balanced)

    calls = _record_loss_calls(monkeypatch, stage_two)
    negatives = torch.tensor([[1, 2] if r.class_id != "HUM" else [0, 2] for r in rows])  # (N, 2), as mining may give
    stage_two.train(model, rows, negatives, rows[:4], twins, StageTwoParams(epochs=1, batch_size=8, max_steps=2,
                                                                             negatives="mined_and_in_batch"), seed=0)
    assert calls and any(call.excluded.any() for call in calls)
    # the twin's column, never the row's own: a mask built on another column left each target out (an infinite
    # loss every step, and a "trained" model), and one that masks anything passed `any()`
    for call in calls:
        assert math.isfinite(call.value)
        assert not call.excluded[torch.arange(len(call.target)), call.target].any()
        assert call.excluded.sum(1).le(1).all()  # one twin a row at most: NUM's for LOC, LOC's for NUM, none for HUM


def test_cross_encoding_never_joins_a_class_sharing_the_gold_standard_question_as_not_relevant(tiny_model_dir, monkeypatch):
    """A LOC question joined with NUM's standard question is its "is relevant" text again: never "is not relevant"."""
    from tqc.model.cross_encoding import joined_inputs

    twins = Catalog([StandardQuestion("LOC", "Where is the place?"), StandardQuestion("HUM", "Who is the person?"),
                     StandardQuestion("NUM", "where is the place?")])  # NUM's text is LOC's, as validate compares texts
    made = []

    def recording(*args, **options):
        made.append(joined_inputs(*args, **options))
        return made[-1]

    monkeypatch.setattr(stage_one, "joined_inputs", recording)
    torch.manual_seed(0)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
    stage_one.train(model, long_tail_rows(), long_tail_rows()[:4], twins, PARAMS, seed=0,
                    augment=AugmentParams(cross_encoding={"enabled": True, "share": 1.0, "negatives": 2}))
    by_row = {}  # (call, row) → {joined text (lowercased): its targets}
    for call, inputs in enumerate(made):
        for text, relevant, row in zip(inputs.texts, inputs.relevant, inputs.rows):
            by_row.setdefault((call, row), {}).setdefault(text.lower(), set()).add(relevant)
    assert any(False in targets for joins in by_row.values() for targets in joins.values())  # negatives were joined
    assert all(len(targets) == 1 for joins in by_row.values() for targets in joins.values())  # no text with both targets


def weighted_term_calls(tiny_model_dir, monkeypatch, loss_name: str, weight_name: str) -> list:
    """Stage one's first epoch (no optimizer step) with `weight_name` at 0, then at 0.5, recording each call of
    stage_one's `loss_name` as (arguments, keyword options, value): at 0 it is never called, at 0.5 once a step, and the
    epoch's mean loss grows by 0.5 × the mean of its values. The calls at 0.5 are returned for the caller's checks."""
    calls = []
    real = getattr(stage_one, loss_name)

    def recording(*arguments, **options):
        value = real(*arguments, **options)
        calls.append((arguments, options, value.item()))
        return value

    monkeypatch.setattr(stage_one, loss_name, recording)

    def first_loss(weight: float) -> float:
        torch.manual_seed(0)  # the same dropout draws in both runs: the optional terms draw no random numbers
        model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
        params = PARAMS.model_copy(update={"learning_rate": 1e-12, weight_name: weight})  # no step
        return stage_one.train(model, long_tail_rows(), long_tail_rows()[:4], CATALOG, params, seed=0,
                               augment=AugmentParams(implicit=[])).history[1].train_loss

    base = first_loss(0.0)
    assert calls == []  # off: never computed
    weighted = first_loss(0.5)
    assert len(calls) == PARAMS.max_steps
    assert weighted == pytest.approx(base + 0.5 * sum(value for *_, value in calls) / len(calls), rel=1e-5)
    assert weighted > base
    return calls


def test_question_contrast_adds_supervised_contrast_among_each_batchs_own_questions(tiny_model_dir, monkeypatch):
    trained_on = {CATALOG.index(r.class_id) for r in long_tail_rows()}
    for (vectors, labels), options, _ in weighted_term_calls(tiny_model_dir, monkeypatch, "supervised_contrastive",
                                                             "question_contrast"):
        assert vectors.shape[0] == len(labels) == PARAMS.batch_size and options["temperature"] == PARAMS.temperature
        assert set(labels.tolist()) <= trained_on  # the batch's own gold classes


def test_standard_contrast_adds_the_reverse_direction_on_the_batchs_own_scores(tiny_model_dir, monkeypatch):
    for (scores, target, excluded), options, _ in weighted_term_calls(tiny_model_dir, monkeypatch, "standard_contrast",
                                                                      "standard_contrast"):
        assert scores.shape[0] == len(target) == PARAMS.batch_size and options["temperature"] == PARAMS.temperature
        assert sorted(set(target.tolist())) == list(range(scores.shape[1]))  # in-batch: each column is some row's class
        assert excluded is None  # no two classes share a standard question


def test_standard_contrast_term_scores_each_row_by_its_column_at_the_stages_temperature(monkeypatch):
    """A batch without the catalog's first class: its columns are classes 1 and 2, so a row's column (its target)
    is not its class index (its gold)."""
    seen = []
    monkeypatch.setattr(stage_one, "standard_contrast", lambda scores, target, excluded, *, temperature:
                        seen.append((scores.shape, target.tolist(), excluded, temperature)) or scores.sum())

    class Encoder:
        def embed_questions(self, texts):
            return torch.randn(len(texts), 4)

        embed_standards = embed_questions

        def score(self, questions, standards):
            return questions @ standards.T

    gold = torch.tensor([0, 1, 2, 2])  # (N,) the training rows' classes
    batch = stage_one._encoded_batch(Encoder(), [1, 2, 3], ["a", "b", "c", "d"], gold, CATALOG, "in_batch", None)
    stage_one._standard_contrast_term(batch, 0.05)
    assert seen == [((3, 2), [0, 1, 1], None, 0.05)]


def test_standard_contrast_leaves_out_a_class_that_shares_the_columns_standard_question(tiny_model_dir, monkeypatch):
    twins = Catalog([StandardQuestion("DESC", "what is it?"), StandardQuestion("LOC", "where is the place?"),
                     StandardQuestion("NUM", "where is the place?")])  # NUM's text is LOC's
    rows = [LabeledQuestion(f"{text} {i}", label) for i in range(4)
            for text, label in (("what is a bat", "DESC"), ("where is rome", "LOC"), ("how far is rome", "NUM"))]
    masks = []

    def recording_contrast(scores, target, excluded, *, temperature):
        masks.append((target.tolist(), excluded))
        return scores.sum() * 0.0

    monkeypatch.setattr(stage_one, "standard_contrast", recording_contrast)
    torch.manual_seed(0)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
    stage_one.train(model, rows, rows[:3], twins, PARAMS.model_copy(update={"standard_contrast": 1.0}), seed=0,
                    augment=AugmentParams(implicit=[]))
    whole = [(target, excluded) for target, excluded in masks if set(target) == {0, 1, 2}]  # columns DESC, LOC, NUM
    assert whole
    twin_of = {0: set(), 1: {2}, 2: {1}}  # a LOC row's twin column is NUM's, a NUM row's LOC's; DESC has none
    for target, excluded in whole:
        assert [set(torch.nonzero(excluded[row]).flatten().tolist()) for row in range(len(target))] == \
            [twin_of[own] for own in target]


def test_deferred_keeps_every_generated_row_out_of_stage_one_whatever_made_it():
    """The test above uses oversampled copies alone: EDA's and an offline file's rows are generated rows too."""
    from dataclasses import replace

    from tqc.stages.stage_one import stage_one_rows

    original = LabeledQuestion("where is paris", "LOC", "train.csv:1")
    made = [replace(original, generated=True, source=source) for source in ("oversample:x", "eda:x", "file:y")]
    assert stage_one_rows([original, *made], deferred=True) == [original]
    assert stage_one_rows([original, *made], deferred=False) == [original, *made]


def test_the_cross_encoding_term_is_added_to_the_loss_at_its_weight(tiny_model_dir, monkeypatch):
    """The joined inputs and their targets were tested, not that the term reaches the loss: 0 × the term passed
    every test. At weight 0.5 the epoch's loss is the loss at weight 0 plus half the term's mean (no step is taken,
    and both runs draw alike: the term is computed, and its rows drawn, whatever its weight)."""
    values = []
    real = stage_one._cross_encoding_term

    def recording(*args, **kwargs):
        term = real(*args, **kwargs)

        def recorded(*term_args):
            value = term(*term_args)
            values.append(value.item())
            return value
        return recorded

    monkeypatch.setattr(stage_one, "_cross_encoding_term", recording)

    def first_loss(weight: float) -> float:
        values.clear()
        torch.manual_seed(0)
        model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
        params = PARAMS.model_copy(update={"learning_rate": 1e-12})  # no step
        augment = AugmentParams(implicit=[], cross_encoding={"enabled": True, "share": 0.5, "weight": weight})
        return stage_one.train(model, long_tail_rows(), long_tail_rows()[:4], CATALOG, params, seed=0,
                               augment=augment).history[1].train_loss

    base, base_values = first_loss(0.0), list(values)
    weighted = first_loss(0.5)
    assert len(values) == PARAMS.max_steps and values == pytest.approx(base_values)  # the same term in both runs
    assert weighted == pytest.approx(base + 0.5 * sum(values) / len(values), rel=1e-5) and weighted > base


def test_prototype_mixup_shifts_each_main_loss_column_by_its_classs_prior_with_the_sign_of_the_logit_adjusted_loss(
        tiny_model_dir, monkeypatch):
    """SharpReCL's logit compensation adds τ·w·log π_y to each class's score in the main loss (the tail's column
    lowest). Only "the loss moved" was asserted: the compensation's sign flipped passed every test."""
    from tqc.losses import class_log_prior
    from tqc.schema import gold_indices

    rows = long_tail_rows()
    offsets = PARAMS.temperature * 1.0 * class_log_prior(torch.as_tensor(gold_indices(rows, CATALOG)), len(CATALOG))

    def main_scores(prior_weight: float) -> list[torch.Tensor]:
        with monkeypatch.context() as patch:
            calls = _record_loss_calls(patch, stage_one)
            torch.manual_seed(0)
            model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
            params = PARAMS.model_copy(update={"learning_rate": 1e-12})
            stage_one.train(model, rows, rows[:4], CATALOG, params, seed=0, augment=AugmentParams(
                implicit=[], prototype_mixup={"enabled": True, "weight": 0.0, "prior_weight": prior_weight}))
        return [call.scores for call in calls if call.scores.shape[0] == PARAMS.batch_size]  # (B, P): the main loss's

    plain, compensated = main_scores(0.0), main_scores(1.0)
    assert len(plain) == len(compensated) == PARAMS.max_steps
    for before, after in zip(plain, compensated):
        assert torch.allclose(after - before, offsets.expand_as(after), atol=1e-5)
    assert offsets[CATALOG.index("NUM")] == offsets.min() < 0  # NUM, the tail, is held back most
