"""SharpReCL's rebalancing in embedding space, for the bi-encoder (METHOD.md, SharpReCL).

Prototypes: the encoded standard question of every class, added to every batch so every
class is seen at every step. For each class c, its *hard positives* are its batch members
least similar to the prototype, its *hard negatives* the other classes' members most similar
to it. A balanced set of `per_class` rows per class mixes simple samples (real members) with
synthetic vectors made by mixup of two hard vectors, α ~ Beta(λ, λ), renormalised (on the
unit sphere, where cosine and mlp similarities score; raw under inner product, whose scores
are the vectors' own lengths too); the
synthetic share rises from 0.5 to 1.0 over training. Every row of class c's share is labelled
c: the hard-negative half of its mixups pairs c's members that are hard negatives of another
class's prototype (c's rows nearest a wrong prototype), so every synthetic row has a label and
the set stays balanced, `per_class` rows of each class however skewed the batch.
Logit compensation adds w·log π_y (the class prior of the training rows) to the logits of the batch's own rows, the
anchors that keep the long tail's mix; not to the balanced set's, whose labels are uniform (the stage, stage_one.py).

Pure functions of tensors and a torch.Generator; the stage supplies the encoded vectors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class BalancedSet:
    vectors: torch.Tensor  # (M, D), unit-norm unless built with unit_norm=False
    labels: torch.Tensor  # (M,) class indices
    synthetic: torch.Tensor  # (M,) bool: made by mixup rather than sampled


def synthetic_share(step: int, total_steps: int, start: float = 0.5, end: float = 1.0) -> float:
    """SharpReCL's schedule: start + (t / T)·(end − start), t the step, T the total steps."""
    return start + (end - start) * min(1.0, step / max(1, total_steps))


def hard_sets(similarity: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """similarity (B, P) of each row to each prototype, labels (B,) → per class c:
    (hard positives: ≤k rows of c least similar to prototype c,
     hard negatives: ≤k rows of other classes most similar to prototype c), as row indices."""
    positives, negatives = [], []
    for c in range(similarity.shape[1]):
        members = (labels == c).nonzero().squeeze(1)
        others = (labels != c).nonzero().squeeze(1)
        column = similarity[:, c]
        positives.append(members[column[members].argsort()[:k]])  # ascending: least similar first
        negatives.append(others[column[others].argsort(descending=True)[:k]])
    return positives, negatives


def mixup(vectors: torch.Tensor, first: torch.Tensor, second: torch.Tensor, alpha: torch.Tensor,
          unit_norm: bool = True) -> torch.Tensor:
    """vectors (N, D), pair indices (M,), (M,), weights α (M,) → α·v_i + (1−α)·v_j (M, D), normalised if `unit_norm`."""
    mixed = alpha.unsqueeze(1) * vectors[first] + (1 - alpha.unsqueeze(1)) * vectors[second]
    return F.normalize(mixed, dim=-1) if unit_norm else mixed


def _draw(pool: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    return pool[torch.randint(len(pool), (n,), generator=generator)] if n and len(pool) else pool[:0]


def _confusable_members(negatives: list[torch.Tensor], labels: torch.Tensor) -> list[torch.Tensor]:
    """Per class c, its rows among the hard negatives of every prototype (`hard_sets`): c's members nearest a
    wrong prototype. A prototype's own hard negatives hold no row of its class, so all of them can be pooled."""
    near_wrong = torch.cat(negatives).unique()  # sorted row indices
    return [near_wrong[labels[near_wrong] == c] for c in range(len(negatives))]


def balanced_set(questions: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor, per_class: int, share: float,
                 hard_k: int, beta: float, generator: torch.Generator, unit_norm: bool = True) -> BalancedSet:
    """questions (B, D), labels (B,), prototypes (P, D) → `per_class` rows of every class, each labelled with it.

    round(share·per_class) rows of each class c are synthetic: half mix two of c's hard positives,
    half two of c's members that are hard negatives of another prototype (c's hard positives when
    none is); the rest are real members of c drawn with replacement. A class with no member in the
    batch gets its prototype as its one member (SharpReCL's replenishing), so it is never left out.
    `unit_norm` False (inner-product similarity): the vectors keep their lengths, hardness is
    the inner product, and mixups are not renormalised, so every row is scored as the model scores.
    """
    if unit_norm:
        questions, prototypes = F.normalize(questions, dim=-1), F.normalize(prototypes, dim=-1)
    n_classes = prototypes.shape[0]
    absent = torch.tensor([c for c in range(n_classes) if not (labels == c).any()], dtype=torch.long)
    pool = torch.cat([questions, prototypes[absent]])  # (B + A, D)
    pool_labels = torch.cat([labels.cpu(), absent]).to(labels.device)
    with torch.autocast(device_type=pool.device.type, enabled=False):  # bf16 under CUDA's autocast: ranks would tie
        positives, negatives = hard_sets(pool.float() @ prototypes.float().T, pool_labels, hard_k)
    confusable = _confusable_members(negatives, pool_labels)
    beta_distribution = torch.distributions.Beta(torch.tensor(beta), torch.tensor(beta))

    n_synthetic = round(share * per_class)
    n_positive_mix = math.ceil(n_synthetic / 2)
    parts, part_labels, part_synthetic = [], [], []
    for c in range(n_classes):
        members = (pool_labels == c).nonzero().squeeze(1)
        real = _draw(members, per_class - n_synthetic, generator)
        pos_i, pos_j = _draw(positives[c], n_positive_mix, generator), _draw(positives[c], n_positive_mix, generator)
        near_wrong = confusable[c] if len(confusable[c]) else positives[c]
        neg_i = _draw(near_wrong, n_synthetic - n_positive_mix, generator)
        neg_j = _draw(near_wrong, n_synthetic - n_positive_mix, generator)
        first, second = torch.cat([pos_i, neg_i]), torch.cat([pos_j, neg_j])
        alpha = beta_distribution.sample((len(first),)).to(pool.device)
        parts += [pool[real], mixup(pool, first, second, alpha, unit_norm)]
        part_labels.append(torch.full((len(real) + len(first),), c, dtype=pool_labels.dtype, device=pool_labels.device))
        part_synthetic += [torch.zeros(len(real), dtype=torch.bool), torch.ones(len(first), dtype=torch.bool)]
    return BalancedSet(torch.cat(parts), torch.cat(part_labels), torch.cat(part_synthetic))

