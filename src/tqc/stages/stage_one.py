"""Stage one: both encoders trained with NT-Xent against in-batch standard questions (ADMC Eq. 1).

Label-aware negatives: a batch's standard questions are deduplicated by class before they
are encoded, so a question is never pushed away from its own standard question appearing
elsewhere in the batch, and each standard question is encoded once per batch.

In-batch augmentations (augment section): `prototype_mixup` (SharpReCL) puts every class's
standard question in every batch, adds a balanced set of mixed-up hard vectors and shifts the
logits by the class prior; `cross_encoding` (CEAA) adds "question [SEP] standard question"
inputs whose target is an "is relevant" / "is not relevant" text.

`stage_one.question_contrast: w` adds w × supervised contrast among the batch's own questions (SharpReCL Eq. 2):
each question is also pulled toward its classmates in the batch, which the exemplar rule ranks by. Under torchrun
each process contrasts its own share of the batch.

`stage_one.standard_contrast: w` adds w × the reverse direction of the batch's loss (CLIP's symmetric half): each of
the batch's standard questions against the batch's questions, its own class's questions the positives. ADMC's loss
asks each question to find its standard question; this asks each standard question to sit nearer its own questions
than the batch's others. It scores the same embeddings, so it encodes nothing more; under torchrun each process
contrasts its own share of the batch.
"""

from __future__ import annotations

import itertools
import logging
import random
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from tqc import distributed
from tqc.config import AugmentParams, CrossEncodingParams, ModelParams, PrototypeMixupParams, StageOneParams
from tqc.device import pick_device, seed_everything
from tqc.losses import (LossFn, class_log_prior, prior_offsets, same_class_mask, standard_contrast,
                        supervised_contrastive)
from tqc.model.cross_encoding import joined_inputs, question_that_fits
from tqc.model.encoder import BiEncoder
from tqc.model.prototype_mixup import balanced_set, synthetic_share
from tqc.model.similarity import scores_directions_only
from tqc.model.warm_start import starting_model, warmed_model
from tqc.schema import Catalog, LabeledQuestion, gold_indices, load_questions
from tqc.training import (FitResult, OnEpoch, bi_encoder_parameter_groups, bi_encoder_validator, fit, stage_loss,
                          steps_per_epoch, twin_columns, write_outputs)
from tqc.twins import standard_text_groups

log = logging.getLogger(__name__)


def candidate_classes(batch_gold: torch.Tensor, n_classes: int, negatives: str) -> tuple[torch.Tensor, torch.Tensor]:
    """batch_gold (B,) → (candidate class ids (U,), each row's target column (B,)).

    in_batch: the batch's distinct classes; all_classes: the whole catalog.
    """
    if negatives == "all_classes":
        return torch.arange(n_classes), batch_gold
    candidates, target = torch.unique(batch_gold, return_inverse=True)
    return candidates, target


def stage_one_rows(train_rows: list[LabeledQuestion], deferred: bool) -> list[LabeledQuestion]:
    """The rows stage one trains on: all of augment's, or with `augment.deferred` only the original ones."""
    return [q for q in train_rows if not q.generated] if deferred else train_rows


def train(
    model: BiEncoder,
    train_rows: list[LabeledQuestion],
    validation: list[LabeledQuestion],
    catalog: Catalog,
    params: StageOneParams,
    seed: int,
    on_epoch: OnEpoch | None = None,
    augment: AugmentParams | None = None,
) -> FitResult:
    without_negatives = _BatchesWithoutNegatives()
    batch_loss = _batch_loss(model, train_rows, catalog, params, seed, augment or AugmentParams(), without_negatives)
    result = fit(
        model,
        bi_encoder_parameter_groups(model, params, "stage_one"),
        batch_loss,
        len(train_rows),
        bi_encoder_validator(model, validation, catalog),
        params,
        seed=seed,
        description="stage one",
        on_epoch=on_epoch,
    )
    without_negatives.report()
    return result


class _BatchesWithoutNegatives:
    """Counts the batches in which no question had a negative column: in-batch negatives of a batch of one class
    (or of classes that share one standard question). The main loss is 0 there with no gradient, so such a batch
    trains nothing but the optional terms, which a small batch over few classes makes common. Under torchrun each
    process counts the shares of the batches it scored, and rank 0 says its own."""

    def __init__(self):
        self.batches = self.without = 0

    def count(self, batch: "_Batch") -> None:
        self.batches += 1
        negative = ~F.one_hot(batch.target, len(batch.candidates)).bool()  # (B, U) columns not the row's target
        if batch.twins is not None:
            negative &= ~batch.twins.cpu()
        self.without += not bool(negative.any())

    def report(self) -> None:
        if self.without:
            log.warning("stage one: %d of its %d batches had no negative for any question (one class, or classes "
                        "sharing one standard question), so the main loss trained nothing on them; a larger "
                        "stage_one.batch_size, or stage_one.negatives: all_classes, gives every batch negatives",
                        self.without, self.batches)


class _Batch(NamedTuple):
    """A batch's rows, their encodings and scores, which every term of the loss reads."""

    texts: list[str]
    gold: torch.Tensor  # (B,) each row's class
    candidates: torch.Tensor  # (U,) the classes of the standard questions scored
    target: torch.Tensor  # (B,) each row's column among them
    questions: torch.Tensor  # (B, D)
    standards: torch.Tensor  # (U, D)
    scores: torch.Tensor  # (B, U) each question against each standard question, no offsets
    twins: torch.Tensor | None  # (B, U) a row's columns of classes sharing its standard question, on the scores' device


_Term = Callable[[_Batch], torch.Tensor]


def _batch_loss(model: BiEncoder, train_rows: list[LabeledQuestion], catalog: Catalog, params: StageOneParams,
                seed: int, augment: AugmentParams,
                without_negatives: _BatchesWithoutNegatives | None = None) -> Callable[[list[int]], torch.Tensor]:
    """rows → the main loss, plus each optional term in the order `_optional_terms` gives (float addition is not
    associative: that order is the figures'). `without_negatives` counts the batches whose main loss had none."""
    gold = torch.as_tensor(gold_indices(train_rows, catalog))
    texts = [q.text for q in train_rows]
    loss_fn = stage_loss(params, "stage_one")
    groups = standard_text_groups(catalog)  # None unless classes share a standard question
    mixup = augment.prototype_mixup
    column_offsets = _column_offsets(gold, len(catalog), params, mixup)
    negatives = "all_classes" if mixup.enabled else params.negatives  # prototypes of every class in every batch
    total_steps = params.epochs * steps_per_epoch(len(train_rows), params.batch_size, params.max_steps)
    terms = _optional_terms(model, loss_fn, params, augment, catalog, total_steps, seed, groups)

    def batch_loss(rows: list[int]) -> torch.Tensor:
        batch = _encoded_batch(model, rows, texts, gold, catalog, negatives, groups)
        if without_negatives is not None:
            without_negatives.count(batch)
        loss = _main_loss(loss_fn, batch, column_offsets)
        for term in terms:
            loss = loss + term(batch)
        return loss

    return batch_loss


def _column_offsets(gold: torch.Tensor, n_classes: int, params: StageOneParams,
                    mixup: PrototypeMixupParams) -> torch.Tensor | None:
    """(P,) what each class's column adds to the scores, or None where nothing: the logit-adjusted loss, plus
    SharpReCL's logit compensation (+ w·log π_y on the logits, i.e. τ·w·log π_y on the scores) when mixup is on.
    The batch's rows, its anchors, keep the long tail's mix."""
    column_weight = params.logit_adjustment + (mixup.prior_weight if mixup.enabled else 0.0)
    if not column_weight:
        return None
    log_pi = class_log_prior(gold, n_classes)  # (P,) the mix of the rows this stage trains on
    return prior_offsets(log_pi, column_weight, params.temperature)  # (P,)


def _optional_terms(model: BiEncoder, loss_fn: LossFn, params: StageOneParams, augment: AugmentParams,
                    catalog: Catalog, total_steps: int, seed: int, groups: np.ndarray | None) -> list[_Term]:
    """The weighted terms that are on, in the order the loss adds them: question contrast, standard contrast,
    prototype mixup, cross encoding. Mixup's generator is seeded before cross encoding's; each term encodes (if at
    all) in that order."""
    terms: list[_Term] = []
    if params.question_contrast:
        terms.append(lambda batch: params.question_contrast * supervised_contrastive(
            batch.questions, batch.gold.to(batch.questions.device), temperature=params.temperature))
    if params.standard_contrast:
        terms.append(lambda batch: params.standard_contrast * _standard_contrast_term(batch, params.temperature))
    mixup, cross = augment.prototype_mixup, augment.cross_encoding
    if mixup.enabled:
        mixup_term = _prototype_mixup_term(model, loss_fn, mixup, total_steps, seed, groups)
        terms.append(lambda batch: mixup.weight * mixup_term(batch.questions, batch.gold, batch.standards))
    if cross.enabled:
        cross_term = _cross_encoding_term(model, loss_fn, cross, catalog, seed, groups)
        terms.append(lambda batch: cross.weight * cross_term(batch.texts, batch.gold, batch.candidates,
                                                             batch.standards))
    return terms


def _encoded_batch(model: BiEncoder, rows: list[int], texts: list[str], gold: torch.Tensor, catalog: Catalog,
                   negatives: str, groups: np.ndarray | None) -> _Batch:
    """The rows' questions, then their candidate classes' standard questions, encoded in that order, and scored once
    for every term that reads the scores (the main loss, standard contrast)."""
    batch_gold = gold[rows]
    candidates, target = candidate_classes(batch_gold, len(catalog), negatives)
    batch_texts = [texts[i] for i in rows]
    questions = model.embed_questions(batch_texts)  # (B, D)
    standards = model.embed_standards([catalog.texts[c] for c in candidates.tolist()])  # (U, D)
    scores = model.score(questions, standards)  # (B, U)
    twins = twin_columns(groups, batch_gold, candidates, target)  # (B, U) or None
    return _Batch(batch_texts, batch_gold, candidates, target, questions, standards, scores,
                  None if twins is None else twins.to(scores.device))


def _main_loss(loss_fn: LossFn, batch: _Batch, column_offsets: torch.Tensor | None) -> torch.Tensor:
    """The stage's loss (NT-Xent unless `loss` says otherwise) of the batch's questions against its standard
    questions, each column shifted by its class's offset; a question's own class is its target."""
    scores = batch.scores  # (B, U)
    if column_offsets is not None:
        scores = scores + column_offsets[batch.candidates].to(scores.device)  # (B, U)
    return loss_fn(scores, batch.target.to(scores.device), batch.twins)


def _standard_contrast_term(batch: _Batch, temperature: float) -> torch.Tensor:
    """The batch's standard questions, each against the batch's questions (`losses.standard_contrast`), on the main
    loss's scores without their offsets (a column's offset cancels in it); a question of a class that shares the
    column's standard question is neither its positive nor its negative."""
    return standard_contrast(batch.scores, batch.target.to(batch.scores.device), batch.twins, temperature=temperature)


def _prototype_mixup_term(model: BiEncoder, loss_fn: LossFn, params: PrototypeMixupParams, total_steps: int,
                          seed: int, groups=None) -> Callable:
    """The balanced set's loss against every prototype; its synthetic share rises with the steps taken, to
    `synthetic_end` at the last (SharpReCL's t / T, t = 1 … T).

    No class prior on its scores: the set has `per_class` rows of every class, so its labels are uniform, and the
    logit-adjusted loss on uniform labels is minimised by scores biased by −w·log π, toward the tail (the prior corrects
    the imbalanced anchors, the batch's own columns above, SharpReCL Eq. 11)."""
    # Each process its own draws (distributed.own_seed): seeded alike, every process drew the same partners for its share
    generator = torch.Generator().manual_seed(distributed.own_seed(seed))
    step_numbers = itertools.count(1)  # t of t / T: the call's step, 1 at the first

    def term(questions: torch.Tensor, batch_gold: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
        share = synthetic_share(next(step_numbers), total_steps, params.synthetic_start, params.synthetic_end)
        balanced = balanced_set(questions, batch_gold.to(questions.device), prototypes, params.per_class, share,
                                params.hard_k, params.beta, generator,
                                unit_norm=scores_directions_only(model.similarity))  # (P·per_class, D), lengths kept for inner
        scores = model.score(balanced.vectors, prototypes)  # (M, P)
        labels = balanced.labels.cpu()  # (M,)
        twins = twin_columns(groups, labels, torch.arange(prototypes.shape[0]), labels)  # a twin's prototype: no negative
        return loss_fn(scores, labels.to(scores.device), None if twins is None else twins.to(scores.device))

    return term


def _cross_encoding_term(model: BiEncoder, loss_fn: LossFn, params: CrossEncodingParams, catalog: Catalog, seed: int,
                         groups=None) -> Callable:
    """Joined inputs scored against the batch's standard questions plus the two relevance texts."""
    rng = random.Random(distributed.own_seed(seed))  # each process its own joined pairs, as for mixup above
    separator = model.question.tokenizer.sep_token or "[SEP]"
    encoder = model.question
    shortened_to_fit = question_that_fits(lambda text: len(encoder.tokenizer(text)["input_ids"]), encoder.max_length)

    def term(batch_texts: list[str], batch_gold: torch.Tensor, candidates: torch.Tensor, standards: torch.Tensor) -> torch.Tensor:
        joined = joined_inputs(batch_texts, batch_gold.tolist(), candidates.tolist(), catalog.texts, separator,
                               params.share, params.negatives, rng, shortened_to_fit, None if groups is None else groups.tolist())
        relevance = model.embed_standards([params.relevant_text, params.irrelevant_text])  # (2, D)
        scores = model.score(model.embed_questions(joined.texts), torch.cat([standards, relevance.to(standards.device)]))  # (J, U+2)
        target = torch.tensor([standards.shape[0] + (0 if r else 1) for r in joined.relevant])  # (J,)
        columns = torch.cat([candidates, torch.full((2,), -1)])  # (U+2,) each column's class; the relevance texts none
        # a joined input holds its question: its own class's column is no negative of it (label-aware, as above)
        excluded = same_class_mask(batch_gold[joined.rows], columns, target)  # (J, U+2)
        twins = twin_columns(groups, batch_gold[joined.rows], columns, target)  # and its standard question's twins
        excluded = excluded if twins is None else excluded | twins
        return loss_fn(scores, target.to(scores.device), excluded.to(scores.device))

    return term


def run(
    data_dir: Path,
    train_path: Path,
    model_params: ModelParams,
    augment_params: AugmentParams,
    params: StageOneParams,
    seed: int,
    out_dir: Path,
    history_path: Path,
    on_epoch: OnEpoch | None = None,
    warmup_dir: Path | None = None,
) -> FitResult:
    """`warmup_dir`: the warm-up stage's folder; where it holds a model, training starts from it, else (None, or the
    warm-up's skip record) from model.pretrained."""
    seed_everything(seed)
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    train_rows = stage_one_rows(load_questions(train_path), augment_params.deferred)
    validation = load_questions(data_dir / "validation.jsonl")
    model = starting_model(model_params, warmup_dir).to(pick_device())
    model.set_augmentation(augment_params)
    log.info("stage one: %d training rows%s, %d validation, %d classes on %s", len(train_rows),
             " (deferred re-balancing: generated rows wait for stage two)" if augment_params.deferred else "",
             len(validation), len(catalog), pick_device())
    result = train(model, train_rows, validation, catalog, params, seed, on_epoch, augment_params)
    metadata = result.model_record("stage_one", params, model_params.pretrained)
    if warmed_model(warmup_dir) is not None:  # only then: without a warm-up the saved config is what it always was
        metadata["warmed_up_from"] = str(warmup_dir)
    return write_outputs("stage one", lambda: model.save(out_dir, metadata), out_dir, history_path, result)
