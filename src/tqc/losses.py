"""Contrastive losses as small pure functions over a score matrix.

Every loss takes scores (B, C) of each question against C candidate standard questions,
the target column of each row (B,), and an optional `excluded` mask (B, C) of columns that
must count neither as positive nor as negative (other copies of the row's own class).
Scores are similarities (higher = closer); temperature τ divides them (scale = 1/τ).
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
SCALE_FREE_LOSSES = frozenset({"hinge"})  # losses that never divide the scores by τ: their logit scale is unknown


def same_class_mask(row_labels: torch.Tensor, column_labels: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B,) row classes, (C,) column classes, (B,) target columns → (B, C) bool.

    True where a column holds the row's own class but is not its target column: such a
    column is a false negative and must not push the question away from its own class.
    """
    same = row_labels.unsqueeze(1) == column_labels.unsqueeze(0)  # (B, C)
    is_target = F.one_hot(target, num_classes=column_labels.shape[0]).bool()  # (B, C)
    return same & ~is_target


def _masked(scores: torch.Tensor, excluded: torch.Tensor | None) -> torch.Tensor:
    return scores if excluded is None else scores.masked_fill(excluded, float("-inf"))


def nt_xent(scores: torch.Tensor, target: torch.Tensor, excluded: torch.Tensor | None = None, *, temperature: float = 0.1) -> torch.Tensor:
    """ADMC Eq. 1/3: −log softmax(scores/τ)[target], averaged over rows."""
    logits = _masked(scores / temperature, excluded)  # (B, C)
    return F.cross_entropy(logits, target)


def decoupled(scores: torch.Tensor, target: torch.Tensor, excluded: torch.Tensor | None = None, *, temperature: float = 0.1) -> torch.Tensor:
    """ADMC Eq. 1/3 as printed: −log(exp(s⁺/τ) / Σ over negatives only of exp(s⁻/τ)).

    The positive is left out of the denominator (decoupled contrastive learning, Yeh et al.
    2022). With it in (`nt_xent`), a row whose positive already wins gets a vanishing gradient
    (softmax → 1); here every row keeps pulling its positive up with weight 1/τ, and the
    negatives are pushed in proportion to their softmax among themselves, so the hardest
    mined negatives still get most of the push once the row is classified right.
    A row with no negative column contributes nothing.
    """
    positive, negative = _positive_and_negatives(scores, target, excluded)  # (B, 1), (B, C)
    has_negative = negative.any(dim=1)  # (B,)
    # Rows without negatives get finite dummy logits so that logsumexp and its gradient stay finite.
    logits = (scores / temperature).masked_fill(~negative, float("-inf")).masked_fill(~has_negative.unsqueeze(1), 0.0)
    row_loss = torch.logsumexp(logits, dim=1) - positive.squeeze(1) / temperature  # (B,)
    return torch.where(has_negative, row_loss, torch.zeros_like(row_loss)).sum() / has_negative.sum().clamp(min=1)


def sdml(scores: torch.Tensor, target: torch.Tensor, excluded: torch.Tensor | None = None, *, temperature: float = 0.1, smoothing: float = 0.3) -> torch.Tensor:
    """SDML: softmax over scores/τ with a smoothed target (1−ε)·onehot + ε/N over valid columns."""
    logits = _masked(scores / temperature, excluded)  # (B, C)
    valid = torch.isfinite(logits)  # (B, C)
    log_probs = logits.log_softmax(dim=-1).masked_fill(~valid, 0.0)
    smooth = valid.float() / valid.sum(dim=-1, keepdim=True)  # uniform ε/N over valid columns
    target_dist = (1 - smoothing) * F.one_hot(target, scores.shape[1]).float() + smoothing * smooth
    return -(target_dist * log_probs).sum(dim=-1).mean()


def _positive_and_negatives(scores, target, excluded):
    positive = scores.gather(1, target.unsqueeze(1))  # (B, 1)
    negative = ~F.one_hot(target, scores.shape[1]).bool()  # (B, C)
    if excluded is not None:
        negative &= ~excluded
    return positive, negative


def bpr(scores: torch.Tensor, target: torch.Tensor, excluded: torch.Tensor | None = None, *, temperature: float = 0.1) -> torch.Tensor:
    """ADMC Eq. 4: −log σ((s⁺ − s⁻)/τ), the mean over each row's negatives, then over rows (Eq. 4's 1/N):
    a row with masked columns weighs as much as the others. A row without negatives adds 0."""
    positive, negative = _positive_and_negatives(scores, target, excluded)
    pair_loss = -F.logsigmoid((positive - scores) / temperature)  # (B, C)
    return ((pair_loss * negative).sum(dim=1) / negative.sum(dim=1).clamp(min=1)).mean()


def hinge(scores: torch.Tensor, target: torch.Tensor, excluded: torch.Tensor | None = None, *, margin: float = 0.2) -> torch.Tensor:
    """ADMC Eq. 5: Σ over negatives of max(0, m − s⁺ + s⁻), averaged over rows."""
    positive, negative = _positive_and_negatives(scores, target, excluded)
    pair_loss = F.relu(margin - positive + scores)  # (B, C)
    return (pair_loss * negative).sum(dim=1).mean()


def triplet_margin(closer: torch.Tensor, farther: torch.Tensor, *, margin: float = 1.0) -> torch.Tensor:
    """EBSIM Eq. 5: mean over triplets of max(ξ(t, s_n) − ξ(t, s_p) + β, 0), from each anchor t's similarity to its
    closer sentence s_p, `closer` (B,), and to its farther one s_n, `farther` (B,); β = `margin`.

    It is `hinge` (ADMC Eq. 5) on the two-column scores [ξ(t, s_p), ξ(t, s_n)] with the closer one the target: one
    negative a row, so hinge's sum over negatives is this max."""
    scores = torch.stack([closer, farther], dim=1)  # (B, 2)
    target = torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device)  # (B,) column 0, the closer
    return hinge(scores, target, margin=margin)


def supervised_contrastive(vectors: torch.Tensor, labels: torch.Tensor, *, temperature: float = 0.1) -> torch.Tensor:
    """SCL among a batch's own questions (Khosla et al. 2020; SharpReCL Eq. 2): vectors (B, D), labels (B,) → scalar.

    Each row is pulled toward every other row of its class, −log of its share of the softmax over all other rows
    (itself never in the denominator), averaged over its classmates, then over the rows that have one; a row alone
    with its class in the batch adds nothing. Scored by cosine whatever the model's similarity, on the unit sphere
    as SharpReCL's projections are: the MLP scorer compares a question with a standard question, not two questions.
    """
    # in float32 even under the training step's bf16 autocast (CUDA), which casts a matmul's inputs whatever their
    # dtype: bf16's ~3 significant digits put a 16% error into this loss's gradient (a reviewer's run), as BiEncoder.score
    # keeps its scores out of autocast for the same reason
    with torch.autocast(device_type=vectors.device.type, enabled=False):
        unit = F.normalize(vectors.float(), dim=-1)  # (B, D)
        is_self = torch.eye(unit.shape[0], dtype=torch.bool, device=unit.device)  # (B, B)
        classmates = (labels.unsqueeze(1) == labels.unsqueeze(0)) & ~is_self  # (B, B)
        n_classmates = classmates.sum(dim=1)  # (B,)
        has_classmate = n_classmates > 0  # (B,)
        if not has_classmate.any():
            return unit.sum() * 0.0  # nothing to pull together; a zero that keeps the graph for backward
        logits = (unit @ unit.T / temperature).masked_fill(is_self, float("-inf"))  # (B, B)
        log_share = logits - torch.logsumexp(logits, dim=1, keepdim=True)  # (B, B), −inf on the diagonal
        row_loss = -log_share.masked_fill(~classmates, 0.0).sum(dim=1) / n_classmates.clamp(min=1)  # (B,)
        return row_loss[has_classmate].mean()


def standard_contrast(scores: torch.Tensor, target: torch.Tensor, excluded: torch.Tensor | None = None, *,
                      temperature: float = 0.1) -> torch.Tensor:
    """The reverse direction of the batch's loss (CLIP's other half): each standard question picks its own questions
    out of the batch's. scores (B, C), target (B,), excluded (B, C) as the other losses take them → scalar.

    Column c's positives are the rows whose target it is; each is −log of its softmax share among itself and the
    column's negatives (scores[:, c] / τ), averaged over the column's positives, then over the columns that are some
    row's target. Its other positives are not in the denominator: as a question is never pushed from its own standard
    question, a standard question never pushes one of its questions away from it for another (Khosla et al.'s L_out,
    with all positives in the denominator, pushes a positive already ahead back toward an equal share). An excluded
    cell (a row of a class whose standard question is the column's text; never a row's own target, as
    `same_class_mask` and `twin_columns` make them) is neither positive nor negative; a column
    with no negative adds 0. A constant added down a column (a class's prior offset) cancels, so the term needs none.
    """
    logits = _masked(scores / temperature, excluded).T  # (C, B)
    positives = F.one_hot(target, scores.shape[1]).bool().T  # (C, B)
    negatives = torch.isfinite(logits) & ~positives  # (C, B)
    has_negative = negatives.any(dim=1, keepdim=True)  # (C, 1)
    # a column without negatives gets finite dummy logits, so that logsumexp and its gradient stay finite
    negative_logits = logits.masked_fill(~negatives, float("-inf")).masked_fill(~has_negative, 0.0)  # (C, B)
    negatives_lse = torch.logsumexp(negative_logits, dim=1, keepdim=True)  # (C, 1)
    pair_loss = F.softplus(negatives_lse - logits.masked_fill(~positives, 0.0))  # (C, B): log(1 + Σ_neg e^(l_n − l_p))
    pair_loss = pair_loss.masked_fill(~(positives & has_negative), 0.0)
    n_positives = positives.sum(dim=1)  # (C,)
    column_loss = pair_loss.sum(dim=1) / n_positives.clamp(min=1)  # (C,)
    return column_loss[n_positives > 0].mean()


def class_log_prior(gold: torch.Tensor, n_classes: int) -> torch.Tensor:
    """(N,) training rows' class indices → (P,) float32 log π, by the prior stage's rule (`log_prior_of_counts`):
    one pseudo-count so no class is −∞, and a class with no row at the mean of the others."""
    counts = torch.bincount(gold.cpu(), minlength=n_classes).numpy()  # (P,)
    return torch.from_numpy(log_prior_of_counts(counts)).float()


def log_prior_of_counts(counts: np.ndarray, smoothing: float = 1.0) -> np.ndarray:
    """(C,) training rows per class → (C,) log π, add-`smoothing`: the one rule of the prior stage's shift and of the
    logit-adjusted loss's offsets (`class_log_prior`), so training and serving treat a class alike.

    A class with no training row (one added by its standard question alone, or whose rows were all quarantined) has
    no mix to follow: it takes the mean log π of the classes with rows, neither favoured nor silenced. Smoothing alone
    left it at 1/(N+C): the shift then put it a quarter of a cosine behind every other class on TREC-6, and in
    training its offset made the loss push a question away from it as a negative about 30 times more weakly."""
    counts = np.asarray(counts, dtype=np.float64)
    log_pi = np.log((counts + smoothing) / (counts + smoothing).sum())
    rowless = counts == 0
    if rowless.any() and not rowless.all():
        log_pi[rowless] = log_pi[~rowless].mean()
    return log_pi


def prior_offsets(log_prior: torch.Tensor, weight: float, temperature: float) -> torch.Tensor:
    """The logit-adjusted loss's offsets in score units (Menon et al. 2021): (P,) log π → (P,) τ·w·log π_c.

    Added to the training scores only (a batch's columns take their classes' entries), so a head
    class's column starts with a head start that the encoder need not learn, and the raw scores
    it is later judged by carry less of the training mix: rebalancing in the loss rather than in
    the rows. τ·w·log π_c ranks as s/τ + w·log π_c, the paper's form; w = 0 is the plain loss.
    """
    return temperature * weight * log_prior


def make_loss(name: str, temperature: float, margin: float, smoothing: float) -> LossFn:
    if name == "nt_xent":
        return partial(nt_xent, temperature=temperature)
    if name == "decoupled":
        return partial(decoupled, temperature=temperature)
    if name == "sdml":
        return partial(sdml, temperature=temperature, smoothing=smoothing)
    if name == "bpr":
        return partial(bpr, temperature=temperature)
    if name == "hinge":
        return partial(hinge, margin=margin)
    raise ValueError(f"unknown loss {name!r}")
