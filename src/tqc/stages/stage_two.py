"""Stage two: continue from stage one against each question's K mined negatives (ADMC Eq. 3).

The batch's distinct standard questions (gold ∪ mined) are encoded once, never K+1 times
per row; each row then gathers its own [gold, negatives] columns.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from tqc import distributed
from tqc.config import AugmentParams, StageTwoParams
from tqc.device import pick_device, seed_everything
from tqc.losses import class_log_prior, prior_offsets
from tqc.model.encoder import BiEncoder
from tqc.schema import Catalog, LabeledQuestion, gold_indices, load_questions
from tqc.stages.mine import load_negatives
from tqc.training import (FitResult, OnEpoch, bi_encoder_parameter_groups, bi_encoder_validator, fit, stage_loss,
                          twin_columns, write_outputs)
from tqc.twins import standard_text_groups

log = logging.getLogger(__name__)


def candidate_columns(batch_gold: torch.Tensor, batch_negatives: torch.Tensor, n_classes: int,
                      whole_batch: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """batch_gold (B,), batch_negatives (B, K) → (distinct classes (U,) ascending, per-row columns (B, K+1)).

    Column 0 of each row is its gold class, so the target is always 0. Under torchrun B is this process's share;
    `whole_batch` (in-batch negatives) makes U the whole batch's distinct classes (`distributed.union_over_processes`
    over the catalog's `n_classes`), so every share is scored against the columns one process scores.
    """
    per_row = torch.cat([batch_gold.unsqueeze(1), batch_negatives], dim=1)  # (B, K+1)
    present = torch.zeros(n_classes, dtype=torch.bool)  # (P,)
    present[per_row.reshape(-1)] = True
    if whole_batch:
        present = distributed.union_over_processes(present)
    distinct = torch.nonzero(present).reshape(-1)  # (U,)
    return distinct, torch.searchsorted(distinct, per_row)  # columns (B, K+1): each class's place in `distinct`


def train(
    model: BiEncoder,
    train_rows: list[LabeledQuestion],
    negatives: torch.Tensor,
    validation: list[LabeledQuestion],
    catalog: Catalog,
    params: StageTwoParams,
    seed: int,
    on_epoch: OnEpoch | None = None,
) -> FitResult:
    gold = torch.as_tensor(gold_indices(train_rows, catalog))
    texts = [q.text for q in train_rows]
    loss_fn = stage_loss(params, "stage_two")
    column_offsets = prior_offsets(class_log_prior(gold, len(catalog)), params.logit_adjustment, params.temperature)  # (P,)
    groups = standard_text_groups(catalog)  # None unless classes share a standard question

    def batch_loss(rows: list[int]) -> torch.Tensor:
        distinct, columns = candidate_columns(gold[rows], negatives[rows], len(catalog),
                                              whole_batch=params.negatives == "mined_and_in_batch")
        questions = model.embed_questions([texts[i] for i in rows])  # (B, D)
        standards = model.embed_standards([catalog.texts[c] for c in distinct.tolist()])  # (U, D)
        scores = model.score(questions, standards)  # (B, U)
        if params.logit_adjustment:
            scores = scores + column_offsets[distinct].to(scores.device)  # (B, U)
        columns = columns.to(questions.device)
        if params.negatives == "mined_and_in_batch":
            twins = twin_columns(groups, gold[rows], distinct, columns[:, 0].cpu())  # (B, U) or None
            # each class appears once in U: label-aware, and a class that shares the gold's standard question is no negative
            return loss_fn(scores, columns[:, 0], None if twins is None else twins.to(scores.device))
        return loss_fn(scores.gather(1, columns), torch.zeros_like(columns[:, 0]), None)  # (B, K+1), gold first

    return fit(
        model,
        bi_encoder_parameter_groups(model, params, "stage_two"),
        batch_loss,
        len(train_rows),
        bi_encoder_validator(model, validation, catalog),
        params,
        seed=seed,
        description="stage two",
        on_epoch=on_epoch,
    )


def run(
    data_dir: Path,
    train_path: Path,
    negatives_path: Path,
    stage_one_dir: Path,
    augment_params: AugmentParams,
    params: StageTwoParams,
    seed: int,
    out_dir: Path,
    history_path: Path,
    on_epoch: OnEpoch | None = None,
) -> FitResult:
    seed_everything(seed)
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    train_rows, validation = load_questions(train_path), load_questions(data_dir / "validation.jsonl")
    negatives = torch.as_tensor(load_negatives(negatives_path, catalog, [q.class_id for q in train_rows]))
    model = BiEncoder.load(stage_one_dir).to(pick_device())
    model.set_augmentation(augment_params)
    log.info("stage two: %d training rows × %d negatives, %d validation", len(train_rows), negatives.shape[1], len(validation))
    result = train(model, train_rows, negatives, validation, catalog, params, seed, on_epoch)
    metadata = result.model_record("stage_two", params)
    return write_outputs("stage two", lambda: model.save(out_dir, metadata), out_dir, history_path, result)
