"""Typed, strict configuration: one section per stage of `params.yaml`.

Unknown keys are errors (`extra="forbid"`), so a typo or a tuner's stray value never
silently vanishes. Each stage loads only the sections it needs.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from tqc.errors import InputError

DatasetName = Literal["trec6", "trec50", "covidq-categories", "covidq-classes", "custom"]
ImplicitAugmentation = Literal["dropout", "cutoff"]
RetrainMode = Literal["train", "refresh"]


# What NumPy, torch and Optuna take as a seed: a negative one failed in stage one, after ingest, validate and augment
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]


class Strict(BaseModel):
    # A NaN or infinite float (a temperature, a learning rate, a loss weight) trains nonsense without an error
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class CustomData(Strict):
    """A user's own CSV or JSONL files, read through a column mapping."""

    train: str | None = None
    test: str | None = None
    catalog: str | None = None  # CSV or JSONL with class_id and text; None derives texts from labels
    text_column: str = "text"
    label_column: str = "label"
    catalog_id_column: str = "class_id"
    catalog_text_column: str = "text"
    # the files' encoding: null reads UTF-8 (a stray byte as Windows-1252, with a warning); a codec name (gbk, big5,
    # shift_jis, euc_kr, cp1251, …) reads train, test, catalog and the retrain inbox's files in it, strictly
    encoding: str | None = None
    # a training label the catalog lacks: derive (a new class, its text derived from the label, with a warning)
    # or quarantine (the row, with its file and line: a misspelt label never becomes a class)
    unknown_labels: Literal["derive", "quarantine"] = "derive"

    @field_validator("encoding")
    @classmethod
    def _known_codec(cls, encoding: str | None) -> str | None:
        """A misspelt codec failed only when ingest read the first file, as a LookupError's traceback."""
        import codecs

        try:
            return None if encoding is None else codecs.lookup(encoding).name
        except LookupError:
            raise ValueError(f"data.custom.encoding {encoding!r}: no codec of that name (e.g. gbk, big5, shift_jis, "
                             "euc_kr, cp1251; null: UTF-8)") from None

    @model_validator(mode="after")
    def _quarantine_needs_a_catalog(self) -> "CustomData":
        if self.unknown_labels == "quarantine" and not self.catalog:
            raise ValueError("data.custom.unknown_labels is 'quarantine' but data.custom.catalog is not set: "
                             "there is no catalog to check the labels against")
        return self

    @model_validator(mode="after")
    def _columns_differ(self) -> "CustomData":
        """One column as both text and label read every question as its own class (a derived class each, one warning
        each), then stopped on an unrelated "validation split is empty"."""
        for what, a, b in (("text_column and label_column", self.text_column, self.label_column),
                           ("catalog_id_column and catalog_text_column", self.catalog_id_column, self.catalog_text_column)):
            if a == b:
                raise ValueError(f"data.custom.{what.replace(' and ', ' and data.custom.')} are both {a!r}: a row's text and "
                                 "its label (its class id) must come from two columns")
        return self


class GeneratedData(Strict):
    """Rows made offline from the training questions (paraphrases from another machine, or a
    dataset's own expansion such as COVID-Q's train20_augmented.csv); `augment.explicit: file`
    draws its extra rows from them. Each row is attributed to the training question(s) it was
    made from, so rows made from a validation question never enter train."""

    path: str | None = None  # under data_dir, in the dataset's own format (COVID-Q: headerless question,label)
    # A row's origins: the same-class training questions whose word overlap (Jaccard of the
    # lowercased word sets) is within `margin` of its best, which must be at least `min_overlap`;
    # augment uses a row only when every origin is in train. Rows under min_overlap are quarantined.
    min_overlap: float = Field(0.5, gt=0.0, le=1.0)
    margin: float = Field(0.1, ge=0.0, le=1.0)
    # `custom` only: the file's column holding the text of the training question each row was
    # made from. Attribution is then exact (the same-class training question with that text, case
    # and spaces aside), and the overlap rule above is not used; a row naming no such question is quarantined.
    source_column: str | None = None


class DataParams(Strict):
    dataset: DatasetName = "trec6"
    data_dir: str = "../shared/datasets"
    validation_fraction: float = Field(0.1, gt=0.0, lt=0.5)
    # A train or test file with more of its rows rejected than this (unreadable, no text, wrong column count) stops
    # ingest: a file in another format, or unquoted commas in its texts, would otherwise train on what is left
    max_rejected_fraction: float = Field(0.05, ge=0.0, le=1.0)
    # A file of labeled questions under data_dir, in the dataset's format, used whole as the validation
    # split instead of carving validation_fraction out of train (which then trains whole): a larger,
    # steadier judge for early stopping and every selection where train is small, e.g. COVID-Q's own
    # second test set, covid-q/categories/testB.csv. Never the test file.
    validation_file: str | None = None
    custom: CustomData = CustomData()
    # Labeled questions and standard questions accepted by the retrain flow, merged on top of
    # the dataset: <additions>/labeled.jsonl and <additions>/catalog.jsonl (DVC-tracked).
    # Relative to the project, not data_dir. Missing files mean no additions.
    additions: str | None = "data/raw"
    # SharpReCL's long tail: the i-th largest class keeps n·ir^(−i/(C−1)) training rows (n: the
    # largest class). None keeps the dataset as it is. Test is never subsampled.
    imbalance_ratio: float | None = Field(None, ge=1.0)
    generated: GeneratedData = GeneratedData()

    @model_validator(mode="after")
    def _custom_needs_files(self) -> "DataParams":
        if self.dataset == "custom" and not (self.custom.train and self.custom.test):
            raise ValueError("data.dataset is 'custom' but data.custom.train and data.custom.test are not both set")
        return self


ExpectationName = Literal[
    "schema", "non_empty_text", "has_letter_or_digit", "text_length", "no_control_characters", "label_in_catalog",
    "no_duplicates", "no_label_conflicts", "no_leakage", "not_own_standard_question", "min_examples_per_class",
    "class_imbalance",
    "catalog_unique_ids", "catalog_non_empty_texts", "catalog_unique_texts",
]


class ValidateParams(Strict):
    # Failing rows are always quarantined. A critical expectation also stops the stage: a
    # table-level one whenever it fails, a row-level one when more than
    # `max_quarantined_fraction` of a split fails it. A warning is logged and reported.
    critical: list[ExpectationName] = ["schema", "non_empty_text", "label_in_catalog", "no_leakage",
                                       "catalog_unique_ids", "catalog_non_empty_texts", "catalog_unique_texts"]
    max_quarantined_fraction: float = Field(0.05, ge=0.0, le=1.0)
    max_text_chars: int = Field(1000, gt=0)
    min_examples_per_class: int = Field(5, ge=0)  # in train, after quarantine
    max_imbalance_ratio: float = Field(50.0, ge=1.0)  # largest / smallest class in train


class Seq2SeqParams(Strict):
    """Local seq2seq models for `paraphrase` and `backtranslate` (folders, or hub ids where reachable)."""

    paraphrase_model: str | None = None  # e.g. a T5/Pegasus paraphraser folder
    paraphrase_prefix: str = ""  # prepended to each input, e.g. "paraphrase: " for T5 paraphrasers
    forward_model: str | None = None  # backtranslate: source → pivot, e.g. a Helsinki-NLP/opus-mt-en-de folder
    backward_model: str | None = None  # pivot → source, e.g. opus-mt-de-en
    # nucleus sampling gives varied rewrites of the same question; false: beam search, where the copies of one question
    # take its num_beams best distinct beams in turn
    sample: bool = True
    top_p: float = Field(0.9, gt=0.0, le=1.0)
    num_beams: int = Field(4, ge=1)  # beam search only
    max_input_tokens: int = Field(128, ge=8)
    max_new_tokens: int = Field(64, ge=1)
    batch_size: int = Field(16, ge=1)


class PrototypeMixupParams(Strict):
    """SharpReCL in stage one: prototypes in every batch, hard mixup, a balanced set, class prior."""

    enabled: bool = False
    per_class: int = Field(4, ge=1)  # balanced-set rows per class and batch
    hard_k: int = Field(20, ge=1)  # hard positives / negatives per class (SharpReCL: 20)
    beta: float = Field(0.5, gt=0.0)  # mixup weight α ~ Beta(beta, beta)
    synthetic_start: float = Field(0.5, ge=0.0, le=1.0)  # synthetic share of the balanced set, rising ...
    synthetic_end: float = Field(1.0, ge=0.0, le=1.0)  # ... linearly to this over training
    prior_weight: float = Field(1.0, ge=0.0)  # logit compensation w·log π_y (0: off)
    weight: float = Field(1.0, ge=0.0)  # the balanced set's loss weight (SharpReCL's μ)

    @model_validator(mode="after")
    def _synthetic_share_rises(self) -> "PrototypeMixupParams":
        if self.synthetic_start > self.synthetic_end:
            raise ValueError(f"synthetic_start ({self.synthetic_start}) is above synthetic_end ({self.synthetic_end}): "
                             "SharpReCL's synthetic share rises over training (0.5 to 1.0); equal values keep it fixed")
        return self


class CrossEncodingParams(Strict):
    """CEAA in stage one: "question [SEP] standard question" inputs with an "is relevant" target."""

    enabled: bool = False
    share: float = Field(0.25, gt=0.0, le=1.0)  # batch rows that also enter joined
    negatives: int = Field(1, ge=0)  # joins with other batch classes per row, target "is not relevant"
    relevant_text: str = "is relevant"
    irrelevant_text: str = "is not relevant"
    weight: float = Field(1.0, ge=0.0)

    @model_validator(mode="after")
    def _two_targets(self) -> "CrossEncodingParams":
        """The target texts are what the joined input is scored against: a blank one, or one text for both, is no target."""
        if not self.relevant_text.strip() or not self.irrelevant_text.strip():
            raise ValueError("relevant_text and irrelevant_text must each hold words (the joined input's two targets)")
        if " ".join(self.relevant_text.split()).casefold() == " ".join(self.irrelevant_text.split()).casefold():
            raise ValueError(f"relevant_text and irrelevant_text are the same text ({self.relevant_text!r}): "
                             "the joined inputs would have one target for relevant and irrelevant pairs alike")
        return self


class AugmentParams(Strict):
    # Which classes get extra rows: none; mean (ADMC §3.2.1: every class up to the mean count
    # per class); max (up to the largest class); count (up to target_count); sqrt (class c up
    # to ⌈√(n_c·n_max)⌉: square-root rebalancing, gentler on the rarest classes).
    rebalance: Literal["none", "mean", "max", "count", "sqrt"] = "mean"
    target_count: int | None = Field(None, ge=1)  # rebalance: count
    # A class grows to at most max_factor × its own count, whatever the target (null: no cap):
    # a handful of questions copied many times shifts the boundary toward their class.
    max_factor: float | None = Field(None, ge=1.0)
    # Deferred re-balancing (DRW, Cao et al. 2019): stage one learns the representation from the
    # original rows only, and the generated ones join in stage two, at its lower learning rate.
    deferred: bool = False
    # How the extra rows are made: none (copies), eda (swap/delete/insert of same-class words),
    # paraphrase or backtranslate (through the seq2seq models below), file (rows made offline:
    # data.generated, attributed to their training questions at ingest).
    explicit: Literal["none", "eda", "paraphrase", "backtranslate", "file"] = "none"
    eda_alpha: float = Field(0.1, gt=0.0, le=0.5)  # share of a question's words one EDA operation touches
    seq2seq: Seq2SeqParams = Seq2SeqParams()
    implicit: list[ImplicitAugmentation] = ["dropout", "cutoff"]
    rate: float = Field(0.1, ge=0.0, lt=1.0)  # dropout / cutoff rate on token embeddings
    # Which token matrix they perturb: input (the backbone's input embeddings) or output (its last
    # hidden states, before pooling: where ADMC §3.2.1's text puts dropout)
    implicit_at: Literal["input", "output"] = "input"
    prototype_mixup: PrototypeMixupParams = PrototypeMixupParams()
    cross_encoding: CrossEncodingParams = CrossEncodingParams()

    @model_validator(mode="after")
    def _explicit_needs_its_models(self) -> "AugmentParams":
        if self.rebalance == "count" and self.target_count is None:
            raise ValueError("augment.rebalance is 'count' but augment.target_count is not set")
        if self.deferred and self.rebalance == "none":
            raise ValueError("augment.deferred keeps the rebalanced rows for stage two, but augment.rebalance is 'none': "
                             "there are none (set a rebalance target)")
        if self.explicit == "paraphrase" and not self.seq2seq.paraphrase_model:
            raise ValueError("augment.explicit is 'paraphrase' but augment.seq2seq.paraphrase_model is not set "
                             "(a local seq2seq folder, see docs/augmentation.md)")
        if self.explicit == "backtranslate" and not (self.seq2seq.forward_model and self.seq2seq.backward_model):
            raise ValueError("augment.explicit is 'backtranslate' but augment.seq2seq.forward_model and backward_model "
                             "are not both set (a Marian pair such as opus-mt-en-de / opus-mt-de-en)")
        return self


class ModelParams(Strict):
    pretrained: str = "sentence-transformers/all-MiniLM-L6-v2"
    tied: bool = False
    pooling: Literal["mean", "cls", "attention"] = "mean"
    similarity: Literal["cosine", "inner", "mlp"] = "cosine"  # mlp: cosine + a 2-layer MLP on pair features
    max_length: int = Field(48, ge=8, le=512)


LossName = Literal["nt_xent", "decoupled", "bpr", "hinge", "sdml"]


class Optimisation(Strict):
    """How many epochs, how large a step's batch, and AdamW's rate, decay and warm-up: every training loop's."""

    epochs: int = Field(3, ge=1)
    batch_size: int = Field(64, ge=2)
    learning_rate: float = Field(5e-5, gt=0.0)
    weight_decay: float = Field(0.01, ge=0.0)
    warmup_ratio: float = Field(0.1, ge=0.0, lt=1.0)


class Schedule(Optimisation):
    """How long and how fast a model trains; shared by both stages and the NC baseline."""

    patience: int = Field(2, ge=1)  # epochs without a validation macro-F1 gain before stopping
    max_steps: int | None = Field(None, ge=1)  # cap per epoch, for quick runs and benchmarks
    # Polyak averaging: validation scores, and early stopping keeps, an exponential moving average of the weights
    # with this decay a step (tqc.training.WeightAverage) instead of the last step's weights. 0: off.
    weight_averaging: float = Field(0.0, ge=0.0, lt=1.0)
    # Layer-wise learning-rate decay (ELECTRA, BEiT; Zhang et al. 2021 for few-sample fine-tuning): the pretrained
    # backbone's top block trains at learning_rate × d, each block below it × d once more, the embeddings at
    # d^(blocks + 1); the heads keep theirs. The lower layers hold general language, which a few hundred labeled
    # questions should move least. 1: every layer at learning_rate.
    layer_decay: float = Field(1.0, gt=0.0, le=1.0)


class TrainParams(Schedule):
    """A contrastive stage: the schedule plus its loss."""

    temperature: float = Field(0.1, gt=0.0)
    loss: LossName = "nt_xent"
    margin: float = Field(0.2, ge=0.0)  # hinge only
    smoothing: float = Field(0.0, ge=0.0, lt=1.0)  # sdml only
    # The logit-adjusted loss (Menon et al. 2021): + τ·w·log π_c on each column's training score, π the
    # class mix of the rows the stage trains on; scoring after training adds nothing. 0: off.
    logit_adjustment: float = 0.0
    # The layers on top of the pretrained encoders (model.pooling attention, model.similarity mlp) start at zero, so
    # training starts from mean pooling and cosine; at the encoders' rate they move little in a few epochs (AdamW
    # moves a weight about one learning rate a step). null: they train at learning_rate, as the encoders do.
    head_learning_rate: float | None = Field(None, gt=0.0)

    @model_validator(mode="after")
    def _adjusts_logits_only(self) -> "TrainParams":
        if self.loss == "hinge" and self.logit_adjustment != 0.0:
            raise ValueError(HINGE_HAS_NO_LOGITS.format(named="logit_adjustment"))
        return self

    def loss_notes(self, section: str) -> list[str]:
        """What a training run would not do as its settings read: smoothing that its loss never reads, or SDML at
        smoothing 0, which is NT-Xent exactly (an ablation row once compared the two unknowingly). Said when the
        stage trains rather than refused: a tuning study may draw a loss that leaves its base smoothing unread."""
        if self.smoothing > 0.0 and self.loss != "sdml":
            return [f"{section}.smoothing is {self.smoothing:g}, and only loss sdml reads it: loss {self.loss} trains "
                    "without it"]
        if self.smoothing == 0.0 and self.loss == "sdml":
            return [f"{section}.loss sdml at {section}.smoothing 0 is NT-Xent exactly: set a smoothing (0.1 to 0.3) "
                    "for SDML's label smoothing"]
        return []


# The offsets are τ·w·log π in score units: a softmax or sigmoid loss divides them by τ again, hinge never reads τ
HINGE_HAS_NO_LOGITS = ("{named} shifts logits (score/τ) by w·log π, but loss hinge compares raw scores with a margin and "
                       "has no τ: set {named} to 0, or use nt_xent, decoupled, bpr or sdml")


class StageOneParams(TrainParams):
    # a missing key gets what params.yaml ships (tests/code/test_config.py holds the two together)
    epochs: int = Field(2, ge=1)
    learning_rate: float = Field(1e-4, gt=0.0)
    # in_batch: the paper's Eq. 1, over the batch's distinct standard questions;
    # all_classes: score against the whole catalog (exact and cheap when P is small).
    negatives: Literal["in_batch", "all_classes"] = "in_batch"
    # w of supervised contrast among the batch's own questions (SharpReCL Eq. 2, at the stage's τ): each question also
    # pulled toward its classmates in the batch, which the exemplar rule ranks by. 0: off (ADMC's loss alone).
    question_contrast: float = Field(0.0, ge=0.0)
    # w of the reverse direction of the batch's loss (CLIP's other half, at the stage's τ): each of the batch's standard
    # questions picks its own questions out of the batch's. 0: off (ADMC's loss alone).
    standard_contrast: float = Field(0.0, ge=0.0)


class WarmupParams(Optimisation):
    """EBSIM's weakly supervised warm-up (§3.2-3.3), before stage one: triplets (a standard question, a closer
    question, a farther one) made from unlabelled questions, trained with a margin triplet loss. Off by default."""

    enabled: bool = False
    # A file of unlabelled questions (CSV with a header, or JSONL), under data_dir as data.custom's files are; null: none
    unlabelled: str | None = None
    text_column: str = "text"
    # A partly labelled file: only its rows with this column empty are the pool (null: every row is unlabelled)
    label_column: str | None = None
    include_train: bool = True  # the training questions' texts, their labels dropped, join the pool
    candidates: int = Field(20, ge=2)  # R: the pool questions ranked closest to each standard question (two make a pair)
    mask_threshold: float = Field(0.8, gt=-1.0, le=1.0)  # a word more like a title word than this is masked
    max_mask_fraction: float = Field(0.5, gt=0.0, le=1.0)  # of a question's words
    margin: float = Field(1.0, ge=0.0)  # β of max(ξ(t, s_n) − ξ(t, s_p) + β, 0)
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=2)  # triplets a step
    max_steps: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _has_questions(self) -> "WarmupParams":
        if self.enabled and self.unlabelled is None and not self.include_train:
            raise ValueError("warmup.enabled is true but warmup.unlabelled is not set and warmup.include_train is false: "
                             "the warm-up has no questions to learn from")
        return self

    def schedule(self) -> Schedule:
        """The training loop's schedule. Every epoch runs (the warm-up keeps its last weights, `fit(keep="last")`), so
        patience reads nothing; it is set to the epochs."""
        return Schedule(**{name: getattr(self, name) for name in Optimisation.model_fields},
                        patience=self.epochs, max_steps=self.max_steps)


class MineParams(Strict):
    k: int = Field(5, ge=1)
    batch_size: int = Field(256, ge=1)


class StageTwoParams(TrainParams):
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=2)
    # mined: the paper's Eq. 3, gold against its K mined negatives only;
    # mined_and_in_batch: gold against every distinct class the batch encodes (all rows'
    # gold and mined classes), so the hard negatives sharpen without losing the rest.
    negatives: Literal["mined", "mined_and_in_batch"] = "mined"


class BaselineNCParams(Schedule):
    # false: the stage writes a marker instead of a model and evaluate reports no NC figures
    # (ablation grids compare ADMC variants with each other and skip the NC training).
    enabled: bool = True
    # null: stage_one.epochs + stage_two.epochs, ADMC's passes over the same data (the equal budget NC is compared
    # at), followed when either changes; a number: a budget of NC's own (`Params.nc_schedule`)
    epochs: int | None = Field(None, ge=1)
    learning_rate: float = Field(1e-4, gt=0.0)
    head_learning_rate: float = Field(1e-3, gt=0.0)


class EvaluateParams(Strict):
    seeds: int = Field(1, ge=1)  # N > 1 retrains the whole pipeline N-1 more times for mean ± std
    resplit: bool = False  # each extra seed also draws its own validation split (small data: the split's variance)
    top_k: int = Field(10, ge=1)
    confused_pairs: int = Field(10, ge=1)
    profile_questions: int = Field(4, ge=1)  # Figure 3 similarity profiles
    batch_size: int = Field(256, ge=1)
    # Also score ADMC's question encoder by each class's k nearest labeled training questions (0: not):
    # reported beside ADMC as `exemplars`; the headline stays the standard-question rule
    exemplar_k: int = Field(2, ge=0)


class PriorParams(Strict):
    """The class-prior shift (tqc.prior): scores + τ·λ·log π, λ fitted on the validation likelihood."""

    # The class mix decisions should serve: labeled (traffic like the labeled questions: the likelihood
    # over validation questions) or uniform (every class alike, as macro-F1 counts them: the
    # class-balanced likelihood; post-hoc rebalancing for a long tail).
    target: Literal["labeled", "uniform"] = "labeled"
    # Candidate λ: 0 is no shift, 1 the Bayes correction toward the training rows' class mix, −1 away from it.
    weights: list[float] = Field([-1.5, -1.25, -1.0, -0.875, -0.75, -0.625, -0.5, -0.375, -0.25, -0.125, 0.0,
                                  0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0, 1.25, 1.5], min_length=1)


class TrackingParams(Strict):
    """MLflow. The URI: this value, else $MLFLOW_TRACKING_URI, else a local SQLite store."""

    enabled: bool = True
    uri: str | None = None  # e.g. http://mlflow.internal:5000 or postgresql://…; None = env or local
    experiment: str = Field("tqc", min_length=1)


class PromoteParams(Strict):
    """The champion/challenger gate on the *validation* split (never test)."""

    # Registered model name and alias. No quotes or backslashes: the name goes into MLflow's
    # search filter (name='…' and tags.content_digest='…'), which has no escape for them.
    model_name: str = Field("tqc-admc", min_length=1)
    alias: str = Field("champion", pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    bootstrap_samples: int = Field(2000, ge=100)
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    # Promote when the lower confidence bound of (challenger − champion) accuracy exceeds this.
    min_improvement: float = Field(0.0, ge=-1.0, le=1.0)
    # The same for a refresh (retrain.mode refresh: the champion's own encoder serving the grown labeled questions),
    # which needs only to be no worse: below zero, a tie on validation promotes it and its new questions are served.
    # Not where it would switch a standard-rule champion to the exemplar rule and `rule` is not exemplars: min_improvement.
    # A challenger that answers classes the champion cannot (the catalog grew since) needs only this bound too, on the
    # validation questions of the classes both answer (unless it is a refresh that changes the rule).
    refresh_min_improvement: float = Field(-0.01, ge=-1.0, le=1.0)
    tail_fraction: float = Field(1 / 3, gt=0.0, le=1.0)  # the rarest classes in train, by count
    tail_tolerance: float = Field(0.02, ge=0.0, le=1.0)  # allowed drop of tail-class macro-F1
    # point: the observed drop must be within tail_tolerance (one answer of a class with few validation questions can
    # veto); bootstrap: vetoes only a drop beyond it that the paired bootstrap shows at `confidence` (the interval's
    # upper bound below −tail_tolerance). Both report that interval.
    tail_check: Literal["point", "bootstrap"] = "point"
    top_k: int = Field(5, ge=1)  # what the served model returns per question
    # How the registered version decides: standard (each class by its standard question, with the prior
    # stage's shift: evaluate's ADMC), exemplars (by its evaluate.exemplar_k nearest labeled training
    # questions, no shift: evaluate's `exemplars`) or auto (whichever answers more validation questions right,
    # a tie the standard rule). The gate judges either on validation alike.
    rule: Literal["standard", "exemplars", "auto"] = "standard"

    @field_validator("alias")
    @classmethod
    def _not_reserved_by_mlflow(cls, alias: str) -> str:
        # MLflow reads `latest` as the newest version (every challenger would be its own champion) and refuses
        # `v<N>`, which names version N, only when the alias is written: after promotion.json said promoted
        if alias.lower() == "latest" or re.fullmatch(r"[vV]\d+", alias):
            raise ValueError(f"{alias!r} is reserved by MLflow's registry ('latest' names the newest version, "
                             "'v<N>' version N): choose another name, e.g. champion")
        return alias

    @field_validator("model_name")
    @classmethod
    def _filter_safe(cls, name: str) -> str:
        if any(c in name for c in "'\"\\"):
            raise ValueError(f"{name!r} has a quote or backslash, which MLflow's search filter cannot escape")
        if any(c in name for c in "/:"):  # MLflow's rule, which it enforces only at the first registration: after training
            raise ValueError(f"{name!r} has '/' or ':', which MLflow's registry refuses in a model name")
        # MLflow's rules too (its path_not_unique): a name becomes a folder of its artifact store
        if not name.strip() or name == "." or name.startswith("..") or posixpath.normpath(name) != name:
            raise ValueError(f"{name!r} is blank or reads as a path ('.', '..'), which MLflow's registry refuses in a "
                             "model name")
        return name


class SearchDimension(Strict):
    """One tuned knob: a float/int range (log-scaled or not) or a set of choices.

    `when` makes it conditional, e.g. the hinge margin only when the loss is hinge: each named param equals its
    value, or is one of a list of them (a temperature with every loss that reads one: [nt_xent, bpr, sdml]).
    """

    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    choices: list[str | int | float | bool] | None = None
    when: dict[str, str | int | float | bool | list[str | int | float | bool]] = {}

    @model_validator(mode="after")
    def _range_or_choices(self) -> "SearchDimension":
        if (self.choices is None) == (self.low is None or self.high is None):
            raise ValueError("give either low and high, or choices")
        if self.choices is not None and (self.low is not None or self.high is not None or self.log):
            # a stray bound or log beside choices was read as nothing: the choices alone were drawn
            stray = [key for key in ("low", "high") if getattr(self, key) is not None] + (["log"] if self.log else [])
            raise ValueError(f"choices with {', '.join(stray)}: a dimension is a range or a set of choices, not both")
        if self.choices is None and self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        if self.choices is None and self.log and self.low <= 0:
            raise ValueError(f"a log-scaled range needs low > 0, not {self.low}")
        return self


class TuneParams(Strict):
    study: str = "tqc-admc"
    storage: str = "sqlite:///optuna.db"  # any SQLAlchemy URL; workers sharing it share the study
    trials: int = Field(12, ge=1)  # per worker process
    pruner: Literal["median", "hyperband", "none"] = "median"
    startup_trials: int = Field(4, ge=0)  # median: trials that always run in full
    warmup_epochs: int = Field(5, ge=0)  # median: epochs before a trial may be pruned
    seed: Seed = 0
    enqueue_defaults: bool = True  # trial 0 runs the base params: the baseline the search must beat
    # keep each trial's model folders (disk: two encoders per trial); false: only the baselines' and the best's
    keep_models: bool = False
    # The data changed since the study began (new labeled questions): refuse, or open a study per data set,
    # named tune.study-data-<digest> (scheduled tuning beside scheduled retrains)
    on_new_data: Literal["refuse", "new_study"] = "refuse"
    space: dict[str, SearchDimension] = {}

    @field_validator("study")
    @classmethod
    def _a_folder_name(cls, study: str) -> str:
        """It names the study's folder under --work too: '../x' wrote trials outside it."""
        if not study.strip() or study in (".", "..") or "/" in study or "\\" in study or "\0" in study:
            raise ValueError(f"{study!r} is not a name a folder can have (it names the study's folder under --work)")
        return study


class RetrainParams(Strict):
    """The retrain flow: an inbox of new labeled questions, merged into data.additions."""

    inbox: str = "data/incoming"  # drop *.csv / *.jsonl here; catalog*.csv / catalog*.jsonl add standard questions
    archive: str = "data/archive"  # processed files, with manifest.jsonl (sha256, counts, outcome)
    quarantine: str = "data/quarantine/incoming.jsonl"  # rejected rows with file, line and reason
    work_dir: str = "data/retrain"  # staging: nothing outside it changes until the commit step
    lock: str = "data/retrain.lock"  # two retrains never run at once
    retries: int = Field(2, ge=0)  # for steps that can flake (training, the registry)
    retry_delay_seconds: float = Field(10.0, ge=0.0)
    push: bool = True  # dvc push after the commit when a DVC remote is configured
    # a push that still fails after its retries: fail the run (the commit and the gate's decision kept; the flow run
    # Failed, `python flows/retrain.py` exits 1, so cron or an automation notices the remote lacks the data) or warn
    on_push_failure: Literal["fail", "warn"] = "fail"
    # train: the pipeline's stages on the grown data. refresh (promote.rule exemplars or auto): no training;
    # the champion's encoder serves the grown data's labeled questions as its exemplars, judged by the gate.
    mode: RetrainMode = "train"

    @model_validator(mode="after")
    def _places_apart(self) -> "RetrainParams":
        """The places the flow reads, writes and empties, where one would undo another: an archive that is the inbox
        has its own manifest picked up as a delivery and archived away (the record of what was merged lost); a
        quarantine file in the inbox (whose files, not sub-folders, are read) comes back as new questions; and
        work_dir is emptied at each run, anything kept inside it with it (the lock while it is held)."""
        if _same(self.archive, self.inbox):
            raise ValueError(f"retrain.archive {self.archive!r} is retrain.inbox: archived files and the manifest would "
                             "be read again as deliveries; give the archive a folder of its own")
        if _same(Path(self.quarantine).parent, self.inbox):
            raise ValueError(f"retrain.quarantine {self.quarantine!r} is in retrain.inbox, whose files are read as "
                             "deliveries: keep it outside")
        for name in ("inbox", "archive", "quarantine", "lock"):
            if _same(getattr(self, name), self.work_dir) or _within(getattr(self, name), self.work_dir):
                raise ValueError(f"retrain.{name} {getattr(self, name)!r} is inside retrain.work_dir {self.work_dir!r}, "
                                 "which each run empties: keep it outside")
        return self


def _same(path: str | Path, other: str | Path) -> bool:
    """Whether two paths name one place, relative ones taken from the working directory and links followed."""
    return Path(os.path.realpath(path)) == Path(os.path.realpath(other))


def _within(path: str | Path, folder: str | Path) -> bool:
    """Whether `path` lies inside `folder` (not `folder` itself), as `_same` reads paths."""
    return Path(os.path.realpath(folder)) in Path(os.path.realpath(path)).parents


ParamValue = str | int | float | bool | None | list


class AblationGrid(Strict):
    """One ablation: cells = variants × the cartesian product of `matrix`, each on `base`.

    Keys are dotted param paths (`augment.rebalance`); every cell is `dvc exp run -S` of them.
    """

    title: str
    budget: dict[str, ParamValue] = {}  # over ablate.budget for this grid's cells (e.g. more epochs)
    base: dict[str, ParamValue] = {}
    variants: dict[str, dict[str, ParamValue]] = {"default": {}}
    matrix: dict[str, list[ParamValue]] = {}
    # The variant the others are measured against, paired by seed at the same matrix point (a menu's `none`);
    # None: the variants are not alternatives to one baseline (AC vs ADMC on different datasets), no pairing
    reference: str | None = None

    @field_validator("matrix")
    @classmethod
    def _distinct_values(cls, matrix: dict[str, list]) -> dict[str, list]:
        for path, values in matrix.items():
            if not values:  # no value: the grid would have no cell at all
                raise ValueError(f"matrix {path}: no values (list at least one, or leave the key out)")
            texts = [json.dumps(value, sort_keys=True) for value in values]  # lists and mappings are values too
            repeated = sorted({text for text in texts if texts.count(text) > 1})
            if repeated:  # the same cells twice: each seed counted twice, a smaller std
                raise ValueError(f"matrix {path}: {', '.join(repeated)} listed more than once")
        return matrix

    @model_validator(mode="after")
    def _reference_is_a_variant(self) -> "AblationGrid":
        if self.reference is not None and self.reference not in self.variants:
            raise ValueError(f"reference {self.reference!r} is not one of the grid's variants {sorted(self.variants)}")
        return self


class AblateParams(Strict):
    """tqc ablate: the paper's ablations as DVC experiments, several seeds per cell."""

    seeds: list[Seed] = Field([0, 1, 2], min_length=1)
    budget: dict[str, ParamValue] = {}  # applied to every cell first: what fits this machine
    grids: dict[str, AblationGrid] = {}

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
        if repeated:  # one experiment counted twice would shrink the std it reports
            raise ValueError(f"seeds {repeated} are listed more than once; each seed is one run")
        return seeds


class DistributedParams(Strict):
    """Data-parallel training (stage one, stage two, NC) through torchrun; see tqc.distributed."""

    nproc_per_node: int = Field(1, ge=1)  # >1: the training stages re-launch themselves with torchrun
    backend: Literal["auto", "nccl", "gloo"] = "auto"  # auto: nccl on CUDA, gloo on CPU
    # How long a process waits in a collective for the others before it fails (init_process_group's timeout): what a
    # node's survivors wait when a process of another node died or hangs. It also bounds the waits between
    # collectives (the slowest process's start, rank 0's model write and tracking upload at the end), hence 30.
    # At most 1e9 (some 1,900 years, as good as never): a timedelta holds no more than about 1.4e12 minutes, and
    # beyond that every process's setup stopped on OverflowError, not on this key
    timeout_minutes: float = Field(30.0, gt=0, le=1e9)


# The params each DVC stage reads, as dvc.yaml's `params:` lists them (a test keeps the two equal): what the stage's
# MLflow run logs, and what evaluate records in metrics.json. A dotted key is one key of its section.
STAGE_PARAMS: dict[str, tuple[str, ...]] = {
    "ingest": ("seed", "data", "validate.max_text_chars"),
    "validate": ("validate",),
    "augment": ("seed", "augment"),
    "warmup": ("seed", "model", "warmup", "data.custom.encoding", "distributed.nproc_per_node", "distributed.backend"),
    "stage_one": ("seed", "model", "augment.deferred", "augment.implicit", "augment.rate", "augment.implicit_at",
                  "augment.prototype_mixup", "augment.cross_encoding", "stage_one", "distributed.nproc_per_node",
                  "distributed.backend"),
    "mine": ("mine",),
    "stage_two": ("seed", "augment.implicit", "augment.rate", "augment.implicit_at", "stage_two",
                  "distributed.nproc_per_node", "distributed.backend"),
    "baseline_nc": ("seed", "model.pretrained", "model.pooling", "model.max_length", "augment.implicit", "augment.rate",
                    "augment.implicit_at", "baseline_nc", "stage_one.epochs", "stage_two.epochs",
                    "distributed.nproc_per_node", "distributed.backend"),
    "prior": ("prior", "stage_one.temperature", "stage_two.temperature", "stage_one.loss", "stage_two.loss",
              "evaluate.batch_size"),
    "evaluate": ("seed", "data.dataset", "data.validation_fraction", "model", "augment", "warmup", "stage_one", "mine",
                 "stage_two", "baseline_nc", "prior", "evaluate", "distributed.nproc_per_node", "distributed.backend"),
    "promote": ("seed", "promote", "evaluate.exemplar_k", "tracking"),
}


def selected(nested: dict, keys: tuple[str, ...]) -> dict:
    """`keys` (sections, or dotted section.key paths, as STAGE_PARAMS names them) of a params dict, nested as
    params.yaml nests them, in the order of `keys`."""
    chosen: dict = {}
    for path in keys:
        *sections, key = path.split(".")
        source, target = nested, chosen
        for section in sections:
            source, target = source[section], target.setdefault(section, {})
        target[key] = source[key]
    return chosen


class Params(Strict):
    seed: Seed = 0
    data: DataParams = DataParams()
    validate_: ValidateParams = Field(ValidateParams(), alias="validate")
    augment: AugmentParams = AugmentParams()
    model: ModelParams = ModelParams()
    warmup: WarmupParams = WarmupParams()
    stage_one: StageOneParams = StageOneParams()
    mine: MineParams = MineParams()
    stage_two: StageTwoParams = StageTwoParams()
    baseline_nc: BaselineNCParams = BaselineNCParams()
    distributed: DistributedParams = DistributedParams()
    prior: PriorParams = PriorParams()
    evaluate: EvaluateParams = EvaluateParams()
    tracking: TrackingParams = TrackingParams()
    promote: PromoteParams = PromoteParams()
    tune: TuneParams = TuneParams()
    retrain: RetrainParams = RetrainParams()
    ablate: AblateParams = AblateParams()

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, protected_namespaces=())

    def to_dict(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)

    def with_overrides(self, overrides: dict) -> "Params":
        """A new, re-validated Params with a nested dict merged on top."""
        try:
            return self.validated_with(overrides)
        except ValidationError as exc:
            # redacted: an override may be a database URL with its password (tracking.uri, tune.storage)
            raise ConfigError(f"invalid parameter overrides {redact_secrets(overrides)}:\n{problems(exc)}") from None

    def validated_with(self, overrides: dict) -> "Params":
        """`with_overrides`, its refusal pydantic's ValidationError (`problems` says it a line a problem)."""
        return params_of(deep_merge(self.to_dict(), overrides))

    @model_validator(mode="after")
    def _two_rows_per_process(self) -> "Params":
        problem = self.rows_per_process_problem(self.distributed.nproc_per_node, "distributed.nproc_per_node",
                                                self.trained_sections())
        if problem:
            raise ValueError(problem)
        return self

    def nc_schedule(self) -> BaselineNCParams:
        """baseline_nc as NC trains: its epochs, or where null ADMC's, stage one's and stage two's together."""
        if self.baseline_nc.epochs is not None:
            return self.baseline_nc
        return self.baseline_nc.model_copy(update={"epochs": self.stage_one.epochs + self.stage_two.epochs})

    def trained_sections(self) -> tuple[str, ...]:
        """The sections of the training stages, each batched under torchrun: the warm-up's and NC's when they are on
        (off, each writes its marker in one process and batches nothing)."""
        return ((("warmup",) if self.warmup.enabled else ()) + ("stage_one", "stage_two")
                + (("baseline_nc",) if self.baseline_nc.enabled else ()))

    def rows_per_process_problem(self, processes: int, named: str, sections: tuple[str, ...]) -> str:
        """Why batches split `processes` ways leave a process with fewer than two rows ("" when none does): such a
        process has no in-batch negative, or no loss at all. Checked at load for `distributed.nproc_per_node` (every
        training section), and again once joined, for the world size of a torchrun the user started (several nodes),
        for the one section that command trains."""
        small = {name: getattr(self, name).batch_size for name in sections
                 if getattr(self, name).batch_size < 2 * processes}
        if processes <= 1 or not small:
            return ""
        return (f"{named} is {processes}, so every batch is split {processes} ways, and each process needs at least two "
                f"rows: raise {', '.join(f'{n}.batch_size ({b})' for n, b in small.items())} to at least {2 * processes}")

    @model_validator(mode="after")
    def _mixup_prior_needs_logits(self) -> "Params":
        mixup = self.augment.prototype_mixup
        if mixup.enabled and mixup.prior_weight != 0.0 and self.stage_one.loss == "hinge":
            raise ValueError("stage_one.loss is hinge: " + HINGE_HAS_NO_LOGITS.format(named="augment.prototype_mixup.prior_weight"))
        return self

    @model_validator(mode="after")
    def _file_augmentation_needs_its_file(self) -> "Params":
        if self.augment.explicit == "file" and not self.data.generated.path:
            raise ValueError("augment.explicit is 'file' but data.generated.path is not set (a file of rows made "
                             "offline, under data.data_dir, e.g. covid-q/categories/train20_augmented.csv)")
        return self

    @model_validator(mode="after")
    def _source_column_needs_a_custom_file(self) -> "Params":
        if self.data.generated.source_column and self.data.dataset != "custom":
            raise ValueError(f"data.generated.source_column is set but data.dataset is {self.data.dataset!r}: only a custom "
                             "file (data.custom's columns) can name each row's source question")
        return self

    @model_validator(mode="after")
    def _every_seed_is_a_seed(self) -> "Params":
        last = self.seed + self.evaluate.seeds - 1
        if last > 2**32 - 1:
            raise ValueError(f"seed {self.seed} with evaluate.seeds {self.evaluate.seeds} trains up to seed {last}, past "
                             f"{2**32 - 1}, the largest NumPy and torch take")
        return self

    @model_validator(mode="after")
    def _fixed_validation_is_not_resplit(self) -> "Params":
        if self.data.validation_file and self.evaluate.resplit:
            raise ValueError(f"evaluate.resplit is true but data.validation_file ({self.data.validation_file}) is the "
                             "validation split: re-splitting would train on it. Set one of them, not both")
        return self

    @model_validator(mode="after")
    def _served_exemplars_have_a_k(self) -> "Params":
        if self.promote.rule in ("exemplars", "auto") and self.evaluate.exemplar_k == 0:
            raise ValueError(f"promote.rule is {self.promote.rule!r} but evaluate.exemplar_k is 0: the exemplar rule scores "
                             "each class by its exemplar_k nearest labeled questions, so set it (e.g. 2)")
        return self

    @model_validator(mode="after")
    def _refresh_serves_exemplars(self) -> "Params":
        if self.retrain.mode != "refresh":
            return self
        if self.promote.rule == "standard":  # auto: a refresh serves the exemplar rule, and must win to change the rule
            raise ValueError("retrain.mode is 'refresh' (new labeled questions join the served exemplars, no training) but "
                             "promote.rule is 'standard', whose answers only training changes: set promote.rule: exemplars "
                             "(or auto), or retrain.mode: train")
        if not self.tracking.enabled:
            raise ValueError("retrain.mode is 'refresh', which refreshes the registry's champion, but tracking.enabled is "
                             "false: there is no registry; set tracking.enabled: true, or retrain.mode: train")
        return self

    @model_validator(mode="after")
    def _search_space_names_real_params(self) -> "Params":
        known = self._tunable_paths()
        for name, dimension in self.tune.space.items():
            for path in (name, *dimension.when):
                if path not in known:
                    raise ValueError(f"tune.space: {path!r} is not a parameter (e.g. stage_one.temperature)")
        return self

    @model_validator(mode="after")
    def _ablation_keys_are_params(self) -> "Params":
        known = self._tunable_paths()
        for path, value in self.ablate.budget.items():  # every grid's: said as the budget's, not the first grid's
            if path == "seed" or path not in known:
                raise ValueError(f"ablate.budget: {path!r} is not a parameter a cell may set (e.g. stage_one.epochs)")
            problem = value_problem(path, value)
            if problem:  # was said once a cell, as each grid's cell's, by the `tqc ablate` that ran them
                raise ValueError(f"ablate.budget: {path} = {value!r}: {problem}")
        for grid_name, grid in self.ablate.grids.items():
            overrides = [grid.budget, grid.base, grid.matrix, *grid.variants.values()]
            for path in (path for override in overrides for path in override):
                if path == "seed":  # each cell runs every seed of ablate.seeds: a grid's own seed was overwritten
                    raise ValueError(f"ablate.grids.{grid_name}: 'seed' is set per cell from ablate.seeds (or --seeds)")
                if path not in known:
                    raise ValueError(f"ablate.grids.{grid_name}: {path!r} is not a parameter (e.g. augment.rebalance)")
            if not grid.variants:
                raise ValueError(f"ablate.grids.{grid_name}: no variants (a grid without one has no cell; e.g. "
                                 "variants: {default: {}})")
            settings_of = {"budget": grid.budget, "base": grid.base, **{f"variants.{v}": o for v, o in grid.variants.items()},
                           **{f"matrix.{path}": {path: value} for path, values in grid.matrix.items() for value in values}}
            for where, settings in settings_of.items():  # said at load, not only by the `tqc ablate` that runs the grid
                for path, value in settings.items():
                    problem = value_problem(path, value)
                    if problem:
                        raise ValueError(f"ablate.grids.{grid_name}.{where}: {path} = {value!r}: {problem}")
            for variant, settings in grid.variants.items():  # the matrix's value was the one every cell ran, unsaid
                both = sorted(set(settings) & set(grid.matrix))
                if both:
                    raise ValueError(f"ablate.grids.{grid_name}.variants.{variant}: sets {', '.join(both)}, which the "
                                     "grid's matrix sets for every cell; set it in one of them")
        return self

    def _tunable_paths(self) -> set[str]:
        """Dotted paths of every training/data param (a list or empty dict counts as a leaf)."""
        return set(flatten(self.model_dump(mode="json", by_alias=True, exclude={"tune", "retrain", "ablate"})))


def value_problem(path: str, value: object) -> str:
    """Why `value` is no value of the param at dotted `path` on its own ("" when it is one): a word for a number, a
    pooling no encoder has. Rules across params (an epoch count against a budget, a file a setting needs) are checked
    where a cell's params are joined (`ablate.check_cells`), and a path inside a mapping is not checked here."""
    adapter = _leaf_adapter(path)
    if adapter is None:
        return ""
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        return "; ".join(error["msg"] for error in exc.errors())
    return ""


@functools.lru_cache(maxsize=None)  # a grid sets the same few paths in many cells: each adapter is built once
def _leaf_adapter(path: str) -> TypeAdapter | None:
    """The check of the param at `path` alone, as its model declares it (None: no model field there)."""
    model: type[BaseModel] = Params
    *sections, leaf = path.split(".")
    for section in sections:
        field = _field_named(model, section)
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        model = field.annotation
    field = _field_named(model, leaf)
    if field is None:
        return None
    annotated = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    return TypeAdapter(annotated, config=None if _holds_a_model(field.annotation) else Strict.model_config)


def _field_named(model: type[BaseModel], key: str):
    return next((field for name, field in model.model_fields.items() if (field.alias or name) == key), None)


def _holds_a_model(annotation: object) -> bool:
    """A model's own config applies to it: TypeAdapter refuses another for a model type."""
    return isinstance(annotation, type) and issubclass(annotation, BaseModel) or any(
        _holds_a_model(argument) for argument in getattr(annotation, "__args__", ()))


class ConfigError(InputError, ValueError):
    pass


class YAMLError(ValueError):
    """Text that is not YAML; the message says where."""


def read_yaml(text: str):
    """YAML 1.2, as DVC reads and writes params.yaml: `5e-05` (how `dvc exp run -S` writes a small learning rate)
    is a number, where PyYAML's YAML 1.1 reads it as a string, which the strict params refuse; `yes` is text."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError as RuamelError

    try:
        return YAML(typ="safe", pure=True).load(text)
    except (RuamelError, TypeError) as exc:  # TypeError: a key YAML allows and Python does not (`? [a, [b]]`)
        # ruamel's advice on how to allow duplicate keys is for its own callers, not for a params file's author
        message = re.sub(r"\s*To suppress this check.*$", "", " ".join(str(exc).split()))
        raise YAMLError(message) from None


def utf8_text_of(path: Path) -> str:
    """A config file's text; ConfigError naming the line where it is not UTF-8 (OSError as it comes)."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text (byte {raw[exc.start]:#04x})") from None


def load_params(path: str | Path = "params.yaml", overrides: dict | None = None) -> Params:
    """Read and check `params.yaml`; `overrides` is a nested dict merged on top."""
    path = Path(path)
    raw = read_params_mapping(path)
    if overrides:
        raw = deep_merge(raw, overrides)
    try:
        return params_of(raw)
    except ValidationError as exc:
        # e.g. a Prefect run's parameter; redacted, as another override may be a database URL with its password
        given = f" with {redact_secrets(flatten(overrides))} set on top" if overrides else ""
        raise ConfigError(f"{path}{given}: invalid parameters:\n{problems(exc)}") from None


def read_params_mapping(path: Path) -> dict:
    """A parameters file's sections, unchecked; ConfigError naming the file where it cannot be read, is not YAML, is
    empty (comments alone) or is not a mapping. Empty, it was read as every default: a truncated params.yaml ran."""
    try:
        raw = read_yaml(utf8_text_of(path))
    except FileNotFoundError:
        raise ConfigError(f"{path}: parameters file not found") from None
    except OSError as exc:  # a folder, or no permission to read it
        raise ConfigError(f"{path}: cannot read the parameters file: {exc.strerror}") from None
    except YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if raw is None:
        raise ConfigError(f"{path}: the parameters file is empty: it sets no section (seed, data, …)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the parameters file must be a mapping of sections (seed, data, …), "
                          f"not a {type(raw).__name__}")
    return raw


def params_of(raw: dict) -> Params:
    """A parameters file's sections checked (ValidationError). A section spelt as its Python field (`validate_`) rather
    than its key (`validate`) is refused as an unknown one: `populate_by_name` let it through, so the stage took its
    settings while DVC's `params: [validate]` found no such section."""
    by_field_name = [name for name, field in Params.model_fields.items() if field.alias not in (None, name) and name in raw]
    if by_field_name:
        raise ValidationError.from_exception_data(Params.__name__, [
            {"type": "extra_forbidden", "loc": (name,), "input": raw[name]} for name in by_field_name])
    return Params.model_validate(raw)


YAML_1_1_BOOLEANS = {"yes", "no", "on", "off", "y", "n"}


def problems(exc: ValidationError) -> str:
    """One line a problem, `key.path: message`, without pydantic's dump of the whole input."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "params"
        given = error.get("input")
        value = f" (got {given!r})" if error["loc"] and not isinstance(given, (dict, list)) else ""  # not a whole section
        if error["type"] == "bool_type" and str(given).lower() in YAML_1_1_BOOLEANS:
            value += "; YAML 1.2, as DVC reads params.yaml, reads yes/no/on/off as words: write true or false"
        if error["type"] == "extra_forbidden":
            value += _did_you_mean(error["loc"])
        lines.append(f"- {where}: {error['msg'].removeprefix('Value error, ')}{value}")
    return redact_text("\n".join(lines))  # a refused value, or its message, may be a database URL with its password


def _did_you_mean(loc: tuple) -> str:
    """For a key no section has, the section's keys spelt most like it (a typo: `text_colum`), or nothing."""
    from difflib import get_close_matches
    from typing import get_args, get_origin

    section: type[BaseModel] | None = Params
    parts = iter(loc[:-1])
    for part in parts:
        field = next((f for name, f in section.model_fields.items() if (f.alias or name) == str(part)), None)
        if field is None:
            return ""
        annotation = field.annotation
        if get_origin(annotation) is dict:  # a section of named sections (tune.space, ablate.grids): skip the name
            annotation = get_args(annotation)[1]
            if next(parts, None) is None:
                return ""
        section = next((t for t in (annotation, *get_args(annotation)) if isinstance(t, type) and issubclass(t, BaseModel)),
                       None)
        if section is None:
            return ""
    keys = [f.alias or name for name, f in section.model_fields.items()]
    close = get_close_matches(str(loc[-1]), keys, n=2, cutoff=0.75)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} → {"a.b": 1}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def unflatten(flat: dict) -> dict:
    """{"a.b": 1} → {"a": {"b": 1}}. Two paths where one sets a value inside the other's (`data.custom=null` and
    `data.custom.train=x`) are refused: merged, either order would silently drop or mangle one."""
    tree: dict = {}
    paths = list(flat)
    for number, path in enumerate(paths):
        for other in paths[:number]:
            if other.startswith(f"{path}.") or path.startswith(f"{other}."):
                raise ConfigError(f"{other!r} and {path!r}: one sets a value inside the other; give one of them")
        *parents, leaf = path.split(".")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = flat[path]
    return tree


class Replace(dict):
    """A mapping that takes the place of the one it lands on instead of being merged into it key by key: what
    `--set key={...}` means. Merged, `--set tune.space={}` changed nothing, and a search dimension given whole kept
    the shipped one's other fields (its `when`)."""


def deep_merge(base: dict, update: dict) -> dict:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Replace):
            merged[key] = dict(value)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def redact_text(text: str) -> str:
    """Text with every URL's password, an http(s) URL's bare token and the value of `password=`, `token=`, `secret=`
    and the like replaced by ***, for logs, MLflow params and messages: a database URL in tune.storage or tracking.uri
    may carry one (postgresql://user:secret@host/db, or libpq's and SQLAlchemy's ?password=…), an MLflow server's URL a
    token (https://TOKEN@mlflow.example/, as git hosts take it), and MLflow's and SQLAlchemy's errors quote the URL
    they failed to reach. Edited in place, not parsed and rebuilt, so the rest of the text stays as written
    (urlunsplit turns sqlite:///x into sqlite:/x)."""
    text = URL_PASSWORD.sub(r"\1***@", text)
    return TEXT_SECRET.sub(r"\1***", URL_TOKEN.sub(r"\1***@", text))


def holds_password(text: str) -> bool:
    """Whether `text` holds something `redact_text` hides: a password, token or secret written into it."""
    return redact_text(text) != text


# user:password@ after a scheme and one slash or more (postgresql:/u:… is a typo that still holds a password); the
# password runs to the last @ before a space or a quote, slashes and @s in it (pa/ss, p@ss@host: SQLAlchemy reads a
# slash as part of it), so a later @ in the same word is hidden too, which is the side to err on
URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*:/+[^\s:/@]*:)[^\s'\"]*@")
# http(s)://TOKEN@host: a user part alone is a token there (a database URL's user@ is only a name, and stays)
URL_TOKEN = re.compile(r"(\bhttps?:/+)(?!\*\*\*@)[^\s:/@'\"]+@", re.IGNORECASE)
# password=…, passwd, pwd, token, secret, api_key and their prefixed forms (sslpassword, access_token, client_secret)
TEXT_SECRET = re.compile(r"(\b[A-Za-z_]*(?:password|passwd|pwd|token|secret|api_?key)=)[^&\s'\"]*", re.IGNORECASE)


def redact_secrets(value):
    """`value` (a params dump: dicts, lists, strings) with every password or token in its strings redacted
    (`redact_text`)."""
    if isinstance(value, dict):
        return {key: redact_secrets(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_secrets(item) for item in value]
    return redact_text(value) if isinstance(value, str) else value
