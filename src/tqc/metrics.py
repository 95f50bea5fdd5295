"""Classification and retrieval metrics from a score matrix, as fractions in [0, 1]."""

from __future__ import annotations

from collections import Counter

import numpy as np


def gold_ranks(scores: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """scores (N, P), gold (N,) → 1-based rank of the gold class in each row. A tie is ranked as `argmax`
    predicts it, the lower class index first, so rank 1 is exactly a correct prediction (hits@1 = accuracy).
    A gold class scored −inf (the exemplar rule's class without exemplars) ranks after every other −inf class: by
    index, Hits@k and MRR counted it found by chance of its place in the catalog."""
    require_finite_or_minus_inf(scores)
    rows = np.arange(len(gold))
    gold_scores = scores[rows, gold][:, None]  # (N, 1)
    ahead = (scores > gold_scores) | ((scores == gold_scores) & (np.arange(scores.shape[1]) < gold[:, None]))  # (N, P)
    unfound = np.isneginf(gold_scores[:, 0]) & np.isfinite(scores).any(axis=1)  # (N,) rows argmax gets wrong anyway
    ahead |= unfound[:, None] & (scores == gold_scores)
    ahead[rows, gold] = False
    return 1 + ahead.sum(axis=1)


class DivergedScores(ValueError):
    """Scores with NaN or +inf: the model diverged, and no figure of them would mean anything."""


def require_finite_or_minus_inf(scores: np.ndarray) -> None:
    """NaN or +inf scores (a diverged model) would rank nothing and make MRR infinite: an error, not a figure.
    −inf is a score: the exemplar rule gives it to a class without exemplars, which then ranks last."""
    if np.isnan(scores).any() or np.isposinf(scores).any():
        rows = sorted(set(np.argwhere(np.isnan(scores) | np.isposinf(scores))[:, 0].tolist()))
        raise DivergedScores(f"scores hold NaN or +inf in {len(rows)} row(s) (first: {rows[:5]}): the model diverged")


def per_class_prf(gold: np.ndarray, predicted: np.ndarray, labels: np.ndarray) -> dict[int, dict[str, float]]:
    """Precision, recall, F1 and support for each label; 0 where undefined (as scikit-learn). The counts are taken in
    one pass over the N rows, not one a label: evaluate's and promote's per-class reports, and every macro-F1, run it
    over a catalog's every class (O(N + P), where a pass a label was O(N · P))."""
    seen, inverse = np.unique(np.concatenate([np.asarray(gold), np.asarray(predicted)]), return_inverse=True)
    gold_at, predicted_at = inverse[:len(gold)], inverse[len(gold):]  # (N,) each row's index into `seen`
    supports = np.bincount(gold_at, minlength=len(seen))  # (len(seen),)
    predicted_counts = np.bincount(predicted_at, minlength=len(seen))
    true_positives = np.bincount(gold_at[gold_at == predicted_at], minlength=len(seen))
    result = {}
    for label in labels:
        at = int(np.searchsorted(seen, label))
        found = at < len(seen) and seen[at] == label  # a label in neither gold nor predicted counts 0 of each
        true_positive = int(true_positives[at]) if found else 0
        predicted_count, support = (int(predicted_counts[at]), int(supports[at])) if found else (0, 0)
        precision = true_positive / predicted_count if predicted_count else 0.0
        recall = true_positive / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        result[int(label)] = {"precision": precision, "recall": recall, "f1": f1, "support": support}
    return result


def _mean_f1(gold: np.ndarray, predicted: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean([v["f1"] for v in per_class_prf(gold, predicted, labels).values()])) if len(labels) else 0.0


def macro_f1(gold: np.ndarray, predicted: np.ndarray) -> float:
    """Mean F1 over the labels in gold ∪ predicted, as scikit-learn's default."""
    return _mean_f1(gold, predicted, np.union1d(gold, predicted))


def macro_f1_gold_classes(gold: np.ndarray, predicted: np.ndarray) -> float:
    """Mean F1 over the labels in gold only (scikit-learn's `labels=np.unique(gold)`).

    With many classes and a small test set (TREC-50: 42 of 50 classes in test) a wrong
    prediction of a class absent from gold adds an F1 of 0 to `macro_f1`'s mean; this variant
    leaves such classes out (their false positives still cost the gold classes' recall).
    """
    return _mean_f1(gold, predicted, np.unique(gold))


def summary(scores: np.ndarray, gold: np.ndarray, hits_at: tuple[int, ...] = (1, 3, 10)) -> dict[str, float | None]:
    """The headline metrics, in a fixed key order. Hits@k is null where k reaches the class count:
    every gold class is then within k, and a 1.0 there would read as a result (TREC-6's Hits@10)."""
    ranks = gold_ranks(scores, gold)  # (N,)
    predicted = scores.argmax(axis=1)  # (N,)
    metrics = {
        "accuracy": float(np.mean(predicted == gold)),
        "macro_f1": macro_f1(gold, predicted),
        "macro_f1_gold_classes": macro_f1_gold_classes(gold, predicted),
        "mrr": float(np.mean(1.0 / ranks)),
    }
    for k in hits_at:
        metrics[f"hits_at_{k}"] = float(np.mean(ranks <= k)) if k < scores.shape[1] else None
    metrics["n"] = int(len(gold))
    return metrics


def confused_pairs(gold: np.ndarray, predicted: np.ndarray, top: int) -> list[tuple[int, int, int]]:
    """The `top` most frequent (gold, predicted, count) errors, most frequent first."""
    errors = Counter((int(g), int(p)) for g, p in zip(gold, predicted) if g != p)
    return [(g, p, n) for (g, p), n in sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]


def seed_std(values: list[float]) -> float | None:
    """The sample standard deviation over seeds (ddof = 1: a few seeds estimate the spread, they are not
    all of it); None (JSON null) for a single seed, whose spread is unknown, not 0."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else None
