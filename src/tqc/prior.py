"""The class-prior shift: add τ·λ·log π_c to every question's score for class c.

Why: in-batch contrastive training (NT-Xent and its kin) learns a score whose optimum is the
density ratio p(question | class) / p(question), with no class prior in it (InfoNCE's optimal
critic), and rebalancing flattens the prior a classifier could have learned. Where incoming
questions follow the labeled questions' class frequencies π, the Bayes decision on the
logits s/τ adds log π_c ("logit adjustment", Menon et al. 2021). λ = 1 is that theory; λ = 0
is no shift. λ is fitted on validation (the likelihood of the gold class, over a grid of
candidates), never on test.

Where every class should count alike instead (macro-F1 on a long-tailed training set whose
traffic is not long-tailed: SharpReCL's setting), the target mix is uniform. For scores with no
prior in them that is λ = 0; in practice in-batch negatives leave some of the training mix in
the scores (frequent classes are in nearly every batch, rare ones seldom), and the decision
for a uniform mix subtracts it: a negative λ. The `uniform` target fits λ on the class-balanced
likelihood (each class present in validation weighs the same), the likelihood under a uniform
mix over those classes. Post-hoc rebalancing, applied to decisions instead of rows.

The shift is in score units (τ·λ·log π_c), so a shifted score ranks exactly as s/τ + λ·log π_c.
Pure functions over numpy arrays; the `prior` stage fits it and evaluate and serving apply it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tqc.errors import InputError
from tqc.io import UnreadableJson, read_json, tree_digests
from tqc.metrics import macro_f1, require_finite_or_minus_inf

log = logging.getLogger(__name__)


class PriorFileError(InputError, ValueError):
    """A prior stage's file that cannot serve a model: not such a file, no entry fitted for the model, an entry fitted
    for earlier weights, or for another catalog. The CLI says it in one line."""


@dataclass(frozen=True)
class PriorShift:
    """One model's fitted shift: `shift` (C,) in the catalog's class order."""

    weight: float  # λ
    temperature: float  # τ: the scale of the model's logits (scores / τ)
    shift: np.ndarray  # (C,) τ·λ·log π
    validation_by_weight: dict[str, dict[str, float]]  # λ → validation {"nll", "balanced_nll", "macro_f1"}
    target: str = "labeled"  # the class mix λ was fitted for (TARGETS)

    def apply(self, scores: np.ndarray) -> np.ndarray:
        """scores (N, C) → shifted scores (N, C), in the scores' own dtype (as serving adds it)."""
        return scores + self.shift.astype(scores.dtype)[None, :]

    def to_json(self, class_ids: list[str]) -> dict:
        return {"weight": self.weight, "temperature": self.temperature, "target": self.target,
                "validation_by_weight": self.validation_by_weight,
                "shift": {class_id: float(value) for class_id, value in zip(class_ids, self.shift)}}

    @classmethod
    def from_json(cls, record: dict, class_ids: list[str], source: str = "prior file",
                  catalog_may_drop_classes: bool = False) -> "PriorShift":
        """The shift of `class_ids`' classes, in their order. A catalog with a class the fit never saw is refused; so
        is one that lacks fitted classes, unless `catalog_may_drop_classes` (serving a catalog with standard questions
        retired: each class's shift is its own, so the ranking among the rest is the full catalog's, restricted)."""
        missing = [c for c in class_ids if c not in record["shift"]]
        extra = [] if catalog_may_drop_classes else sorted(set(record["shift"]) - set(class_ids))
        if missing or extra:
            raise PriorFileError(f"{source}: fitted on another catalog (no shift for {missing[:5]}, {len(missing)} in all; "
                                 f"shifts for classes the catalog lacks: {extra[:5]}, {len(extra)} in all); run the prior stage again")
        numbers = {**{f"the shift of class {c!r}": record["shift"][c] for c in class_ids},
                   "weight": record["weight"], "temperature": record["temperature"]}
        damaged = [f"{what} is {value!r}" for what, value in numbers.items() if not _finite_number(value)]
        if damaged:  # NaN scores were blamed on the model's weights ("train it again"), a string was float()'s error
            raise PriorFileError(f"{source}: {damaged[0]}, not a finite number ({len(damaged)} such value(s)); run the "
                                 "prior stage again")
        shift = np.array([record["shift"][c] for c in class_ids], dtype=np.float64)
        return cls(float(record["weight"]), float(record["temperature"]), shift,
                   dict(record.get("validation_by_weight", {})), record.get("target", "labeled"))  # files before targets: labeled


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and bool(np.isfinite(value))


NO_SHIFT_WEIGHT = 0.0
# The class mix a shift aims at → the validation criterion λ minimises.
TARGETS = {"labeled": "nll", "uniform": "balanced_nll"}


def log_prior(train_class_ids: list[str], class_ids: list[str], smoothing: float = 1.0) -> np.ndarray:
    """log π (C,): the training rows' class frequencies, add-`smoothing` (`losses.log_prior_of_counts`)."""
    from tqc.losses import log_prior_of_counts

    index = {c: i for i, c in enumerate(class_ids)}
    return log_prior_of_counts(np.bincount([index[c] for c in train_class_ids], minlength=len(class_ids)), smoothing)



def fit(validation_scores: np.ndarray, gold: np.ndarray, log_pi: np.ndarray, temperature: float | None,
        weights: list[float], target: str = "labeled") -> PriorShift:
    """The λ of `weights` under which validation's gold classes are most likely (ties: the smallest |λ|, then the positive).

    `temperature` None (a model trained without one, e.g. hinge): τ is first fitted on
    validation with no shift (`fit_temperature`), so λ's scale means what it means elsewhere.

    The likelihood is that of softmax(scores / τ + λ·log π). For the `labeled` target it is the
    mean over validation questions, so classes weigh as the labeled mix has them; for `uniform`
    it is the mean over classes of each class's mean (the likelihood of a class-balanced set).
    The likelihood, not macro-F1, because λ is a calibration parameter: the likelihood moves
    smoothly with it (it is convex in λ), while macro-F1 on a validation split with one or two
    questions in many classes jumps by points with each question (TREC-50: 544 questions, 50 classes).
    validation_scores (N, C), gold (N,), log_pi (C,).
    """
    if target not in TARGETS:
        raise ValueError(f"unknown prior target {target!r}; expected one of {sorted(TARGETS)}")
    if len(gold) == 0:
        raise ValueError("no validation questions to fit the class-prior shift on")
    require_finite_or_minus_inf(validation_scores)  # a diverged model's: refused here, not fitted into NaN likelihoods
    if temperature is None:
        temperature = fit_temperature(validation_scores, gold)
    balanced = class_balanced_weights(gold)  # (N,)
    by_weight: dict[str, dict[str, float]] = {}
    best_value, best = np.inf, NO_SHIFT_WEIGHT
    for weight in sorted(weights, key=lambda w: (abs(w), w < 0)):  # smallest |λ| first, so a tie keeps the smaller shift
        shifted = validation_scores + temperature * weight * log_pi[None, :]  # (N, C)
        nlls = question_nlls(shifted / temperature, gold)  # (N,), once for both criteria
        figures = {"nll": float(np.mean(nlls)), "balanced_nll": float(np.average(nlls, weights=balanced)),
                   "macro_f1": macro_f1(gold, shifted.argmax(axis=1))}  # summary's, without its ranks
        by_weight[f"{weight:g}"] = figures
        if figures[TARGETS[target]] < best_value - 1e-12:
            best_value, best = figures[TARGETS[target]], weight
    if best != NO_SHIFT_WEIGHT and len(set(weights)) > 1 and best in (min(weights), max(weights)):  # as τ's edge is
        log.warning("prior: λ = %g, the edge of prior.weights (%g to %g): the validation likelihood may be higher "
                    "beyond it; widen prior.weights", best, min(weights), max(weights))
    return PriorShift(float(best), temperature, temperature * best * log_pi, by_weight, target)


# candidate τ for scores a loss never scaled, in units of the scores' own spread (cosines and raw inner
# products differ by orders of magnitude): 1e-3 to 100 spreads, 20 a decade
TEMPERATURES_IN_SPREADS = np.logspace(-3, 2, 101)


def fit_temperature(validation_scores: np.ndarray, gold: np.ndarray) -> float:
    """The τ whose softmax(scores / τ) gives validation's gold classes the highest likelihood (temperature
    scaling, Guo et al. 2017); validation_scores (N, C), gold (N,). The likelihood is concave in 1/τ,
    so the grid's best is the optimum to within its spacing (12 %); a best at the grid's edge is logged."""
    spread = float(np.std(validation_scores)) or 1.0
    temperatures = spread * TEMPERATURES_IN_SPREADS  # (T,)
    nlls = [gold_nll(validation_scores / temperature, gold) for temperature in temperatures]
    best = int(np.argmin(nlls))
    if best in (0, len(temperatures) - 1):
        log.warning("prior: the validation likelihood is best at the edge of the temperature grid (τ = %g; scores' "
                    "spread %g): validation is separable or flat there, and λ's scale is uncertain", temperatures[best], spread)
    return float(temperatures[best])


def gold_nll(logits: np.ndarray, gold: np.ndarray, question_weights: np.ndarray | None = None) -> float:
    """Mean −log softmax(logits)[gold], weighted by `question_weights` (N,) if given; logits (N, C), gold (N,)."""
    return float(np.average(question_nlls(logits, gold), weights=question_weights))


def question_nlls(logits: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """(N,) −log softmax(logits)[gold] per question; logits (N, C), gold (N,)."""
    top = logits.max(axis=1, keepdims=True)  # (N, 1), for a stable log-sum-exp
    log_normaliser = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))  # (N,)
    return log_normaliser - logits[np.arange(len(gold)), gold]


def class_balanced_weights(gold: np.ndarray) -> np.ndarray:
    """(N,) weights, 1 / (the question's class count), so each class present weighs the same."""
    _, inverse, counts = np.unique(gold, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def no_shift(n_classes: int) -> PriorShift:
    return PriorShift(NO_SHIFT_WEIGHT, 1.0, np.zeros(n_classes), {})


ENTRY_KEYS = ("model", "weight", "temperature", "shift")
ENTRY_TYPES = {"model": str, "shift": dict, "validation_by_weight": dict}  # numbers are checked where they are read


def read_file(path: Path) -> dict[str, dict]:
    """A prior stage's file → its entries {name: {model, weight, temperature, shift, …}}, checked.

    Each entry's `model` is its model folder relative to the file's own folder, so the file
    names its models from wherever it is read.
    """
    try:
        document = read_json(path)
    except UnreadableJson as exc:  # not JSON at all
        raise PriorFileError(f"{path}: not a prior stage's file ({exc.reason})") from None
    entries = document.get("models") if isinstance(document, dict) else None
    if not isinstance(entries, dict):
        raise PriorFileError(f"{path}: not a prior stage's file (no 'models')")
    for name, entry in entries.items():
        absent = [key for key in ENTRY_KEYS if not isinstance(entry, dict) or key not in entry]
        if absent:
            raise PriorFileError(f"{path}: entry {name!r} lacks {absent}")
        # the types the readers rely on: a hand-edited null or list was a TypeError naming neither file nor entry
        wrong = [f"{key} is {type(entry[key]).__name__}, not {kind.__name__}" for key, kind in ENTRY_TYPES.items()
                 if key in entry and not isinstance(entry[key], kind)]
        if wrong:
            raise PriorFileError(f"{path}: entry {name!r}: {'; '.join(wrong)}")
    return entries


def entry_for(path: Path, model_dir: Path) -> str | None:
    """The name of the entry in a prior stage's file fitted for the model in `model_dir`, if any
    (`StaleEntry` if it was fitted for weights the folder no longer holds)."""
    return _entry_in(read_file(path), path, model_dir)


def load_for(path: Path, model_dir: Path, class_ids: list[str]) -> PriorShift:
    """The shift a prior stage's file holds for the model in `model_dir`; an error naming both if it has none."""
    entries = read_file(path)
    name = _entry_in(entries, path, model_dir)
    if name is None:
        raise PriorFileError(f"{path}: none of its entries was fitted for {model_dir} (run the prior stage for it)")
    return PriorShift.from_json(entries[name], class_ids, f"{path}, entry {name!r}")


class StaleEntry(PriorFileError):
    """A prior file's entry names a model folder whose weights changed after the entry was fitted."""


def weights_digest(model_dir: Path) -> str | None:
    """sha256 over every safetensors file under a model folder (its relative path and bytes), linked sub-folders
    included: the weights a shift was fitted for. None for a folder with no weights (absent, or not a model).
    Tokenizer and config files are left out: retraining rewrites the weights, not them."""
    files = tree_digests(model_dir, ".safetensors")
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest() if files else None


def _entry_in(entries: dict[str, dict], path: Path, model_dir: Path) -> str | None:
    wanted = Path(model_dir).resolve()
    name = next((name for name, entry in entries.items() if (Path(path).parent / entry["model"]).resolve() == wanted), None)
    # Why: a folder trained again (a stage run by hand, `dvc repro` cut short before the prior stage) keeps its path,
    # and a shift fitted for its earlier weights would be applied to the new ones unnoticed. Entries written before
    # the digest was recorded carry none and are taken as they are.
    # A folder with no weights is left to the model's loader, whose error says what is wrong with it.
    recorded = entries[name].get("weights_digest") if name is not None else None
    if recorded is not None and (current := weights_digest(model_dir)) is not None and recorded != current:
        raise StaleEntry(f"{path}: its entry '{name}' was fitted for earlier weights in {model_dir}, which were trained "
                         f"again since; run the prior stage again")
    return name
