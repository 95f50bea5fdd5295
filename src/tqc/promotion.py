"""The champion/challenger gate, as pure functions of validation predictions.

A challenger replaces the champion only when both hold, on the validation split:
1. a paired bootstrap over validation questions puts the lower bound of the confidence
   interval of (challenger − champion) accuracy above `min_improvement`;
2. on the tail classes (the rarest `tail_fraction` of classes by training count) its
   macro-F1 is no more than `tail_tolerance` below the champion's (`tail_check: point`), or is not shown to be
   by a paired bootstrap at `confidence` (`tail_check: bootstrap`: the interval's upper bound not below
   −`tail_tolerance`).
Pairing matters: both models answer the same questions, so the per-question difference
cancels the questions' own difficulty and the interval is far tighter than two unpaired ones.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from tqc.config import PromoteParams
from tqc.metrics import per_class_prf


def refresh_changes_rule(asked: str, champion_rule: str) -> bool:
    """Whether a refresh, which serves the exemplar rule, would switch a champion serving `champion_rule` to that
    rule without `promote.rule` (`asked`) asking for it outright. Such a change must win the gate
    (`min_improvement`), as a training must, not only be no worse (`refresh_min_improvement`)."""
    return champion_rule != "exemplars" and asked != "exemplars"


@dataclass(frozen=True)
class BootstrapResult:
    difference: float  # challenger − champion accuracy on the observed questions
    low: float
    high: float
    confidence: float
    samples: int


@dataclass(frozen=True)
class Decision:
    promote: bool
    reasons: list[str]
    bootstrap: BootstrapResult | None
    tail_classes: list[str]
    challenger_tail_macro_f1: float
    champion_tail_macro_f1: float | None
    tail_bootstrap: BootstrapResult | None = None  # of challenger − champion tail macro-F1

    def to_dict(self) -> dict:
        return asdict(self)


def paired_bootstrap(challenger_correct: np.ndarray, champion_correct: np.ndarray, samples: int, confidence: float,
                     seed: int = 0) -> BootstrapResult:
    """Both (N,) booleans over the same questions → the accuracy difference and its percentile CI."""
    if challenger_correct.shape != champion_correct.shape or challenger_correct.ndim != 1:
        raise ValueError("paired bootstrap needs two (N,) arrays over the same questions")
    differences = challenger_correct.astype(int) - champion_correct.astype(int)  # (N,) in {-1, 0, 1}
    n = len(differences)
    # A resample of N differences is fixed by how many −1, 0 and +1 it draws: multinomial counts, (S, 3) instead of an
    # (S, N) resample (611 MiB at 20,000 validation questions, a size the retrain flow's growing validation reaches)
    shares = np.array([np.sum(differences == value) for value in (-1, 0, 1)]) / n  # (3,)
    counts = np.random.default_rng(seed).multinomial(n, shares, size=samples)  # (S, 3)
    resampled = (counts[:, 2] - counts[:, 0]) / n  # (S,)
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(resampled, [alpha, 1.0 - alpha])
    return BootstrapResult(float(differences.mean()), float(low), float(high), confidence, samples)


def paired_bootstrap_macro_f1(gold: np.ndarray, challenger: np.ndarray, champion: np.ndarray, labels: np.ndarray,
                              samples: int, confidence: float, seed: int = 0) -> BootstrapResult:
    """(challenger − champion) macro-F1 over exactly `labels` (`macro_f1_over`) and its percentile CI, the validation
    questions resampled with both models' answers to each.

    Only questions whose gold or either answer is one of `labels` move these F1s, and a resample is fixed by how many
    of each (gold, challenger, champion) triple it draws: multinomial counts over the U distinct triples and one bucket
    for every other question, (S, U + 1), never an (S, N) resample."""
    relevant = np.isin(gold, labels) | np.isin(challenger, labels) | np.isin(champion, labels)  # (N,)
    triples, counts = np.unique(np.stack([gold[relevant], challenger[relevant], champion[relevant]], axis=1), axis=0,
                                return_counts=True)  # (U, 3), (U,)
    n = len(gold)
    shares = np.append(counts, n - counts.sum()) / n  # (U + 1,)
    drawn = np.random.default_rng(seed).multinomial(n, shares, size=samples)[:, :-1]  # (S, U)
    observed = _macro_f1_of_counts(counts[None, :], triples, labels)[0]
    resampled = _macro_f1_of_counts(drawn, triples, labels)  # (S, 2)
    differences = resampled[:, 0] - resampled[:, 1]
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(differences, [alpha, 1.0 - alpha])
    return BootstrapResult(float(observed[0] - observed[1]), float(low), float(high), confidence, samples)


def _macro_f1_of_counts(counts: np.ndarray, triples: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(S, U) counts of the (gold, challenger, champion) `triples` → (S, 2) macro-F1 over `labels` of the challenger and
    the champion; a label with no question and no answer counts as 0, as in `macro_f1_over`."""
    # float64, not integers or booleans: numpy multiplies those without BLAS, about 50 times slower (27.7 s against
    # 0.59 s at 2,000 samples, 5,000 questions, 667 tail classes); counts far below 2^53 stay exact
    counts = counts.astype(np.float64)
    gold = triples[:, 0][:, None] == labels[None, :]  # (U, L)
    scores = []
    for column in (1, 2):
        answered = triples[:, column][:, None] == labels[None, :]  # (U, L)
        true_positives = counts @ (gold & answered).astype(np.float64)  # (S, L)
        wrong = counts @ (gold ^ answered).astype(np.float64)  # false positives + false negatives
        denominator = 2 * true_positives + wrong
        f1 = np.divide(2 * true_positives, denominator, out=np.zeros(denominator.shape), where=denominator > 0)
        scores.append(f1.mean(axis=1) if len(labels) else np.zeros(len(counts)))
    return np.stack(scores, axis=1)


def tail_classes(train_class_ids: list[str], judged_ids: list[str], fraction: float) -> list[str]:
    """The rarest ⌈fraction · P⌉ of the P classes `judged_ids` by training count (ties broken by id, for stability).
    The gate passes the classes its validation questions hold: a class with none scores F1 0 for either model
    whatever they answer, so a tail of such classes (ingest draws no validation row from a class of under 3
    training rows, the rarest) read "0.0000 vs 0.0000: within the tolerance" and could never veto."""
    counts = Counter(train_class_ids)
    ranked = sorted(judged_ids, key=lambda c: (counts.get(c, 0), c))
    return ranked[: max(1, math.ceil(fraction * len(judged_ids)))]


def class_changes(gold: np.ndarray, challenger: np.ndarray, champion: np.ndarray, class_ids: list[str],
                  top: int = 10) -> list[dict]:
    """The classes whose validation F1 moved most between champion and challenger (N,) answers (catalog indices, −1
    for a class the catalog lacks): the figure a reviewer of a retrain reads to see what got worse, which accuracy
    and the tail's mean can hide. Unmoved classes are left out."""
    labels = np.unique(np.concatenate([gold, challenger, champion]))
    labels = labels[labels >= 0]
    before, after = per_class_prf(gold, champion, labels), per_class_prf(gold, challenger, labels)
    moved = [{"class_id": class_ids[label], "support": after[label]["support"], "champion_f1": before[label]["f1"],
              "challenger_f1": after[label]["f1"], "difference": after[label]["f1"] - before[label]["f1"]}
             for label in map(int, labels) if after[label]["f1"] != before[label]["f1"]]
    return sorted(moved, key=lambda c: (-abs(c["difference"]), c["class_id"]))[:top]


def macro_f1_over(gold: np.ndarray, predicted: np.ndarray, labels: np.ndarray) -> float:
    """Mean F1 over exactly `labels` (tail classes with no validation row still count, as 0)."""
    per_class = per_class_prf(gold, predicted, labels)
    return float(np.mean([v["f1"] for v in per_class.values()])) if len(labels) else 0.0


def decide(gold: np.ndarray, challenger: np.ndarray, champion: np.ndarray | None, tail_labels: np.ndarray,
           tail_ids: list[str], params: PromoteParams, seed: int = 0) -> Decision:
    """gold, challenger, champion: (N,) class indices on the validation split."""
    challenger_tail = macro_f1_over(gold, challenger, tail_labels)
    if champion is None:
        return Decision(True, ["no champion yet: the first model becomes champion"], None, tail_ids, challenger_tail, None)
    bootstrap = paired_bootstrap(challenger == gold, champion == gold, params.bootstrap_samples, params.confidence, seed)
    champion_tail = macro_f1_over(gold, champion, tail_labels)
    reasons = []
    better = bootstrap.low > params.min_improvement
    reasons.append(
        f"accuracy difference {bootstrap.difference:+.4f}, {bootstrap.confidence:.0%} CI [{bootstrap.low:+.4f}, "
        f"{bootstrap.high:+.4f}]: lower bound {'above' if better else 'not above'} {params.min_improvement:+.4f}"
    )
    tail = paired_bootstrap_macro_f1(gold, challenger, champion, tail_labels, params.bootstrap_samples, params.confidence,
                                     seed)
    interval = f"{tail.confidence:.0%} CI of the difference [{tail.low:+.4f}, {tail.high:+.4f}]"
    if params.tail_check == "bootstrap":
        tail_ok = tail.high >= -params.tail_tolerance
        reasons.append(f"tail-class macro-F1 {challenger_tail:.4f} vs champion {champion_tail:.4f}, {interval}: "
                       f"{'no' if tail_ok else 'a'} loss beyond the tolerance {params.tail_tolerance:.4f} shown "
                       "(tail_check: bootstrap)")
        return Decision(better and tail_ok, reasons, bootstrap, tail_ids, challenger_tail, champion_tail, tail)
    tail_ok = challenger_tail >= champion_tail - params.tail_tolerance
    one_answer = one_answers_weight(gold, tail_labels)
    # Said only where the drop is within about one answer or two (a wrong answer can also cost another tail class
    # precision): a tail that collapsed is no matter of resolution
    decided_by_an_answer = champion_tail - challenger_tail <= 2 * one_answer
    coarse = "" if tail_ok or one_answer <= params.tail_tolerance or not decided_by_an_answer else (
        f" (one answer moves it by about {one_answer:.4f} here, more than the tolerance: the rarest tail classes have "
        "few validation questions; give them more, raise promote.tail_tolerance, or veto only a loss the bootstrap "
        "shows, promote.tail_check: bootstrap)")
    reasons.append(
        f"tail-class macro-F1 {challenger_tail:.4f} vs champion {champion_tail:.4f} ({interval}): "
        f"{'within' if tail_ok else 'beyond'} the tolerance {params.tail_tolerance:.4f}{coarse}"
    )
    return Decision(better and tail_ok, reasons, bootstrap, tail_ids, challenger_tail, champion_tail, tail)


def one_answers_weight(gold: np.ndarray, tail_labels: np.ndarray) -> float:
    """About how far one wrong answer moves the tail macro-F1 from a right one's: a tail class with n validation
    questions, all answered right, falls from F1 1 to 2(n−1)/(2n−1), by 1/(2n−1) of one class's share of the mean
    (the answer given instead can cost another tail class some precision too). The rarest tail class with a question
    sets it (0 where no tail class has one)."""
    counts = [int(np.sum(gold == label)) for label in tail_labels]
    fewest = min((n for n in counts if n > 0), default=0)
    return 1.0 / ((2 * fewest - 1) * len(tail_labels)) if fewest else 0.0
