"""The training loop shared by stage one, stage two and the NC baseline.

Each caller supplies `batch_loss(row_indices) -> loss` and `validate() -> metrics`; this
module owns the optimiser, schedule, progress bar, early stopping on validation macro-F1
and keeping the best weights. The same loop runs on CPU and CUDA (bf16 autocast).
"""

from __future__ import annotations

import logging
import math
import random
import re
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from tqc import distributed
from tqc.config import ConfigError, Schedule, TrainParams
from tqc.device import autocast, wait_for
from tqc.io import atomic_path
from tqc.losses import LossFn, make_loss, same_class_mask
from tqc.metrics import DivergedScores, summary
from tqc.model.encoder import BiEncoder, catalog_scores
from tqc.schema import Catalog, LabeledQuestion, gold_indices
from tqc.text import first_of
from tqc.warn_once import ALIKE_EVERY_TRAINING

log = logging.getLogger(__name__)


def stage_loss(params: TrainParams, section: str) -> LossFn:
    """A training stage's loss, once what its settings would not do is said (`TrainParams.loss_notes`)."""
    for note in params.loss_notes(section):
        log.warning("%s: %s", section.replace("_", " "), note, extra=ALIKE_EVERY_TRAINING)
    return make_loss(params.loss, params.temperature, params.margin, params.smoothing)


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    train_loss: float
    validation_accuracy: float
    validation_macro_f1: float
    seconds: float


OnEpoch = Callable[[EpochRecord], None]  # a stage's hook, called on rank 0 with each epoch's record (epoch 0 first)


@dataclass
class FitResult:
    history: list[EpochRecord]
    best_epoch: int
    best_validation_macro_f1: float
    seconds_per_epoch: float

    @classmethod
    def of(cls, history: list[EpochRecord]) -> "FitResult":
        """The fit a history records: the first epoch with the highest validation macro-F1 (fit's rule), and the
        mean seconds of the trained epochs; an empty history (a stage that trained nothing) has neither."""
        if not history:
            return cls([], 0, math.nan, 0.0)
        best_epoch = 0
        for epoch, record in enumerate(history):
            if record.validation_macro_f1 > history[best_epoch].validation_macro_f1:
                best_epoch = epoch
        trained = [record.seconds for record in history[1:]]
        return cls(history, best_epoch, history[best_epoch].validation_macro_f1,
                   float(np.mean(trained)) if trained else 0.0)

    def model_record(self, stage: str, params, pretrained: str | None = None) -> dict:
        """What a trained model's tqc_model.json says of how it was trained: the stage, the encoder it started from,
        the kept epoch and its validation macro-F1, and the stage's params (`params`, a pydantic model)."""
        return {"stage": stage, **({"pretrained": pretrained} if pretrained is not None else {}),
                "best_epoch": self.best_epoch, "validation_macro_f1": self.best_validation_macro_f1,
                "params": params.model_dump(mode="json")}


def batches(n_rows: int, batch_size: int, rng: random.Random, max_steps: int | None) -> list[list[int]]:
    order = list(range(n_rows))
    rng.shuffle(order)
    chunks = [order[i : i + batch_size] for i in range(0, n_rows, batch_size)]
    # A trailing batch with under two rows per process has no in-batch negatives; fold it into the previous one.
    if len(chunks) > 1 and len(chunks[-1]) < 2 * distributed.world_size():
        chunks[-2].extend(chunks.pop())
    return chunks[:max_steps] if max_steps else chunks


def steps_per_epoch(n_rows: int, batch_size: int, max_steps: int | None) -> int:
    """How many optimizer steps one epoch of `batches` takes (the shuffle does not change it)."""
    return len(batches(n_rows, batch_size, random.Random(0), max_steps))


def parameter_groups(module: nn.Module, learning_rate: float) -> list[dict]:
    """AdamW groups for `module`: weight decay on matrices only.

    Biases and LayerNorm scales (every parameter under two dimensions) are left undecayed, as
    BERT and the Hugging Face Trainer do: decaying a norm's scale toward zero shrinks its
    activations rather than regularising a mapping.
    """
    return _decay_groups(list(module.parameters()), learning_rate)


def _decay_groups(parameters: list[nn.Parameter], learning_rate: float) -> list[dict]:
    """`parameter_groups` of a list of parameters, in their order: the matrices decayed, then the rest undecayed."""
    trainable = [p for p in parameters if p.requires_grad]
    decayed = [p for p in trainable if p.ndim >= 2]
    undecayed = [p for p in trainable if p.ndim < 2]
    groups = [{"params": decayed, "lr": learning_rate}, {"params": undecayed, "lr": learning_rate, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def bi_encoder_parameter_groups(model: BiEncoder, params: TrainParams, section: str) -> list[dict]:
    """A contrastive stage's AdamW groups: the backbones' at `learning_rate` (by depth under `layer_decay`), then the
    heads' (`BiEncoder.head_parameters`: attention pooling, the MLP scorer) at `head_learning_rate`. Both at their
    defaults, `parameter_groups` of the whole model: the same groups in the same order as before either key existed,
    so the stage trains as it did."""
    if params.head_learning_rate is None and params.layer_decay == 1.0:
        return parameter_groups(model, params.learning_rate)
    heads = model.head_parameters()
    if params.head_learning_rate is not None and not heads:
        log.warning("%s.head_learning_rate is %g, and model.pooling %s with model.similarity %s has no head layers: it "
                    "trains nothing", section, params.head_learning_rate, model.question.pooling.kind, model.similarity)
    backbones = [model.question.backbone] if model.tied else [model.question.backbone, model.standard.backbone]
    head_rate = params.learning_rate if params.head_learning_rate is None else params.head_learning_rate
    return backbone_groups(backbones, params.learning_rate, params.layer_decay) + _decay_groups(heads, head_rate)


# A transformer block's index in a parameter's name: BERT's encoder.layer.3., GPT-2's h.3., T5's block.3., others' layers.3.
BLOCK_INDEX = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.")


def backbone_groups(backbones: list[nn.Module], learning_rate: float, layer_decay: float) -> list[dict]:
    """AdamW groups for pretrained backbones, with layer-wise learning-rate decay: depth 0 (what comes before the first
    block: the embeddings) at learning_rate × d^(L + 1), block i at × d^(L − i), what comes after the last block (a
    pooler, a final norm) at learning_rate, for L blocks (BEiT's and ELECTRA's rule). At d = 1, `_decay_groups` of
    all their parameters: one rate, the same groups as `parameter_groups`."""
    if layer_decay == 1.0:
        return _decay_groups([p for backbone in backbones for p in backbone.parameters()], learning_rate)
    by_depth: dict[int, list[nn.Parameter]] = {}
    for backbone in backbones:
        depths, top = layer_depths(backbone)
        for parameter, depth in depths:
            by_depth.setdefault(top - depth, []).append(parameter)
    return [group for steps_below_top in sorted(by_depth)
            for group in _decay_groups(by_depth[steps_below_top], learning_rate * layer_decay**steps_below_top)]


def layer_depths(backbone: nn.Module) -> tuple[list[tuple[nn.Parameter, int]], int]:
    """Each parameter of `backbone` with its depth: 0 before its first numbered block (the embeddings), i + 1 in block
    i, and `top` = blocks + 1 after the last block (a pooler, a final norm); and `top`. Parameters come in registration
    order, which is the forward order in Hugging Face models."""
    named = list(backbone.named_parameters())
    blocks = [int(match.group(1)) for name, _ in named if (match := BLOCK_INDEX.search(name))]
    if not blocks:
        raise ConfigError(f"layer_decay needs numbered transformer blocks, and no parameter of {type(backbone).__name__} "
                          "is named like one (layer.0., layers.0., h.0., block.0.): set layer_decay to 1")
    top, depth, depths = max(blocks) + 2, 0, []
    for name, parameter in named:
        match = BLOCK_INDEX.search(name)
        depth = int(match.group(1)) + 1 if match else (0 if depth == 0 else top)
        depths.append((parameter, depth))
    return depths, top


def adamw(param_groups: list[dict], weight_decay: float, fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW, with torch's fused kernel where the parameters' device has one (CPU, CUDA) unless `fused` says.

    Fused, it computes the same update up to float rounding. The default loops over the parameters a tensor at
    a time: on the 2-core CPU its step over the two MiniLM encoders' 45 M parameters took 0.25 s, about a
    sixth of a stage-one step at batch size 64, and the fused one 0.24 × that (`tqc bench passes`).
    """
    param_groups = [{**group, "params": list(group["params"])} for group in param_groups]  # torch takes any iterable
    if fused is None:
        fused = all(p.device.type in ("cpu", "cuda") for group in param_groups for p in group["params"])
    return torch.optim.AdamW(param_groups, weight_decay=weight_decay, fused=fused)


def linear_warmup(optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float):
    warmup = max(1, int(total_steps * warmup_ratio))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def fit(
    model: nn.Module,
    param_groups: list[dict],
    batch_loss: Callable[[list[int]], torch.Tensor],
    n_rows: int,
    validate: Callable[[], dict],
    schedule: Schedule,
    *,
    seed: int,
    description: str,
    on_epoch: OnEpoch | None = None,
    keep: Literal["best", "last"] = "best",
) -> FitResult:
    """Train with early stopping on validation macro-F1; `model` ends holding its best weights.

    Epoch 0 is the starting point, validated before any step, so a stage never ends worse on
    validation than it began (stage two starts from stage one's weights). `keep="last"` (the warm-up, which
    learns no classes, so validation only reports on it): every epoch runs and `model` keeps its last weights,
    and the result's best epoch is the last. Under torchrun each
    process takes its share of every batch and the gradients are averaged (tqc.distributed);
    every process validates and all of them go by rank 0's figures, so they make the same
    early-stopping choice.
    """
    check_rows_per_process(n_rows, description)
    rng = random.Random(seed)  # the batches' order: alike in every process
    optimizer, scheduler = _optimizer_and_schedule(param_groups, schedule, n_rows)
    device = next(model.parameters()).device
    distributed.broadcast_parameters(model)
    distributed.seed_own_stream(seed)  # dropout, unlike the batches' order, is each process's own
    on_epoch = on_epoch if distributed.is_main() else None  # tracking and callbacks: rank 0 only

    history = [_record(0, math.nan, _validated(validate, description, 0), 0.0)]
    kept = _KeptEpoch(model, keep, schedule.patience, history[0])
    average = WeightAverage(model, schedule.weight_averaging)
    _report_start(history[0], description, on_epoch)
    for epoch in range(1, schedule.epochs + 1):
        started = time.perf_counter()
        progress = _epoch_batches(n_rows, schedule, rng, description, epoch)
        losses = _train_epoch(model, batch_loss, progress, optimizer, scheduler, device, average.update)
        wait_for(device)  # on a GPU the last step may still be queued: its time is the epoch's
        train_seconds = time.perf_counter() - started  # the epoch's training steps only, not validation
        if losses.skipped_every_step(description, epoch):
            break
        with average.applied():  # what is validated, and kept when best, is the average
            history.append(_record(epoch, losses.mean, _validated(validate, description, epoch), train_seconds))
            _report_epoch(history[-1], description, on_epoch)
            stops = kept.stops_after(history[-1], model, description)
        if stops:
            break
    if keep == "last":  # the last average; "best" restores the kept epoch's
        average.install()
    return kept.restore(model, history, description)


def _optimizer_and_schedule(param_groups: list[dict], schedule: Schedule, n_rows: int):
    """AdamW over `param_groups` and its linear warm-up and decay over the whole run's steps, in that order."""
    optimizer = adamw(param_groups, schedule.weight_decay)
    total_steps = steps_per_epoch(n_rows, schedule.batch_size, schedule.max_steps) * schedule.epochs
    return optimizer, linear_warmup(optimizer, total_steps, schedule.warmup_ratio)


def _epoch_batches(n_rows: int, schedule: Schedule, rng: random.Random, description: str, epoch: int) -> tqdm:
    """The epoch's batches (`rng`'s next shuffle) behind a progress bar, shown by rank 0 only."""
    return tqdm(batches(n_rows, schedule.batch_size, rng, schedule.max_steps),
                desc=f"{description} epoch {epoch}/{schedule.epochs}", leave=False,
                # None: tqdm's own test, off where stderr is no terminal (a log file, a pipe, a test)
                disable=True if not distributed.is_main() else None)


def _report_start(record: EpochRecord, description: str, on_epoch: OnEpoch | None) -> None:
    log.info("%s: epoch 0 (start) validation macro-F1 %.4f", description, record.validation_macro_f1)
    if on_epoch:
        on_epoch(record)


def _report_epoch(record: EpochRecord, description: str, on_epoch: OnEpoch | None) -> None:
    if on_epoch:
        on_epoch(record)
    log.info(
        "%s: epoch %d loss %.4f validation accuracy %.4f macro-F1 %.4f (%.1fs)",
        description, record.epoch, record.train_loss, record.validation_accuracy, record.validation_macro_f1,
        record.seconds,
    )


class WeightAverage:
    """Polyak averaging: an exponential moving average of the trainable weights, updated after every optimizer step.
    Its decay ramps up as min(decay, (1 + t) / (10 + t)) at step t (TensorFlow's ExponentialMovingAverage with
    num_updates), so the starting weights do not dominate a short run's average. Decay 0: off, and nothing is copied.
    Every process of a torchrun steps the same averaged gradients, so each holds the same average."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay, self.steps = decay, 0
        self.weights = [p for p in model.parameters() if p.requires_grad]
        self.average = [p.detach().clone() for p in self.weights] if decay > 0 else None

    def update(self) -> None:
        if self.average is None:
            return
        self.steps += 1
        decay = min(self.decay, (1 + self.steps) / (10 + self.steps))
        with torch.no_grad():
            for average, weight in zip(self.average, self.weights):
                average.lerp_(weight, 1.0 - decay)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The model holds the average inside the block, its own weights again after it."""
        if self.average is None:
            yield
            return
        own = [p.detach().clone() for p in self.weights]
        self.install()
        try:
            yield
        finally:
            _copy_into(self.weights, own)

    def install(self) -> None:
        """The model holds the average from now on."""
        if self.average is not None:
            _copy_into(self.weights, self.average)


def _copy_into(weights: list[nn.Parameter], values: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for weight, value in zip(weights, values):
            weight.copy_(value)


class _KeptEpoch:
    """Which epoch's weights `fit` hands back, and when it stops. keep="best": the first epoch with the highest
    validation macro-F1, its weights copied as it ends; training stops once `patience` epochs passed without a gain (a
    tie is none). keep="last": every epoch runs and the model keeps its last weights, so nothing is copied."""

    def __init__(self, model: nn.Module, keep: Literal["best", "last"], patience: int, start: EpochRecord):
        self.keep, self.patience = keep, patience
        self.best_f1, self.best_epoch = start.validation_macro_f1, start.epoch
        self.best_state = _snapshot(model) if keep == "best" else None

    def stops_after(self, record: EpochRecord, model: nn.Module, description: str) -> bool:
        """Whether training stops after `record`'s epoch, whose weights `model` holds; a gain copies them."""
        if self.keep == "last":
            return False
        if record.validation_macro_f1 > self.best_f1:
            self.best_f1, self.best_epoch, self.best_state = record.validation_macro_f1, record.epoch, _snapshot(model)
            return False
        if record.epoch - self.best_epoch >= self.patience:
            log.info("%s: no validation gain for %d epochs; stopping early", description, self.patience)
            return True
        return False

    def restore(self, model: nn.Module, history: list[EpochRecord], description: str) -> FitResult:
        """`model` with the kept epoch's weights, in eval mode (dropout and cutoff off for whoever calls it next), and
        the fit `history` records, whose best epoch is the kept one."""
        if self.keep == "last":
            model.eval()
            last = history[-1]
            log.info("%s: kept the last epoch, %d (validation macro-F1 %.4f)", description, last.epoch,
                     last.validation_macro_f1)
            return replace(FitResult.of(history), best_epoch=last.epoch,
                           best_validation_macro_f1=last.validation_macro_f1)
        model.load_state_dict(self.best_state)
        model.eval()
        log.info("%s: kept epoch %d (validation macro-F1 %.4f)", description, self.best_epoch, self.best_f1)
        return FitResult.of(history)


def check_rows_per_process(n_rows: int, description: str) -> None:
    """Under torchrun each process takes its share of every batch, and needs at least two rows of it (an in-batch
    negative; a loss at all). `batch_size` is checked for that at load (`Params.rows_per_process_problem`), but a
    training set under 2 × the world size makes a smaller batch: a process got one row (a loss of 0, trained on
    silently) or none (the tokenizer's IndexError in that process alone, inside torchrun's summary). Said in one line,
    before any step. One process is left as it was."""
    processes = distributed.world_size()
    if processes > 1 and n_rows < 2 * processes:
        raise ConfigError(f"{description}: {n_rows} training row(s) for {processes} processes (the world size): every batch "
                          f"is split {processes} ways and each process needs at least two rows, so at least {2 * processes} "
                          f"rows; train on more rows, or in at most {max(1, n_rows // 2)} process(es) "
                          "(distributed.nproc_per_node, or your torchrun's)")


@dataclass(frozen=True)
class EpochLoss:
    """What an epoch's steps came to: the mean loss of the steps taken, and how many of its steps were skipped for
    a non-finite loss (`_train_epoch`)."""

    mean: float
    steps: int
    skipped: int

    def skipped_every_step(self, description: str, epoch: int) -> bool:
        """Whether no step of the epoch was taken, and training stops there. Says how many were skipped, if any. A
        few (a bf16 overflow in one batch) cost those steps alone, so a long run is not lost over them; a whole epoch
        of them is a diverged model (too high a learning rate) or a broken input, and further epochs would skip
        alike, so training ends and keeps the best epoch before it, as a diverged validation does (`_validated`)."""
        if self.skipped == 0:
            return False
        if self.skipped < self.steps:
            log.warning("%s: epoch %d: %d of its %d steps had a non-finite loss (NaN or inf) and were skipped",
                        description, epoch, self.skipped, self.steps)
            return False
        log.warning("%s: epoch %d: every one of its %d steps had a non-finite loss (NaN or inf), so none was taken; "
                    "training stops and keeps its best epoch so far (a lower learning_rate may train)",
                    description, epoch, self.steps)
        return True


def _train_epoch(model: nn.Module, batch_loss: Callable[[list[int]], torch.Tensor], progress, optimizer, scheduler,
                 device: torch.device, after_step: Callable[[], None]) -> EpochLoss:
    """One pass over the epoch's batches (`progress`: row indices per batch, with a progress bar); each process
    takes its share of a batch and the gradients are averaged; `after_step` runs after each optimizer step (the weight
    average's update). A batch whose loss is not finite in some process is skipped by every process: no backward
    pass, no step (one NaN step would make every weight NaN), but the schedule moves on as if it were taken, so the
    learning rate stays where the run's length puts it. The mean loss is over the steps taken, each batch's the mean
    over all its rows (as one process records it), whatever the processes' shares."""
    model.train()
    losses, weighted, skipped = [], [], 0
    for rows in progress:
        share = distributed.shard(rows)
        with autocast(device):
            loss = batch_loss(share)
        value = loss.item()
        if not distributed.true_in_every_process(math.isfinite(value)):
            skipped += 1
            with warnings.catch_warnings():  # torch's "scheduler stepped before the optimizer", if the first is skipped
                warnings.simplefilter("ignore", UserWarning)
                scheduler.step()
            continue
        # Each process's mean, weighted by its share of the batch: averaged over the processes, the
        # gradient is the mean over the batch's rows even where the shares differ in size (64 rows on 3 GPUs)
        weight = distributed.share_weight(len(share), len(rows))
        (loss * weight).backward()
        distributed.average_gradients(model)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        after_step()
        losses.append(value)
        weighted.append(losses[-1] * weight)  # so is the loss: the share means' plain mean would not be the batch's
        progress.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
    mean = distributed.mean_over_processes(float(np.mean(weighted))) if weighted else math.nan
    return EpochLoss(mean, len(losses) + skipped, skipped)


def _validated(validate: Callable[[], dict], description: str, epoch: int) -> dict:
    """The epoch's validation figures, rank 0's in every process. A model that diverged (NaN scores) scores 0, so
    early stopping keeps the best earlier epoch and the stage (or a tuning trial with too high a learning rate) finishes."""
    try:
        figures = validate()
    except DivergedScores as exc:
        log.warning("%s: epoch %d: validation %s; the epoch counts as accuracy and macro-F1 0", description, epoch, exc)
        figures = {"accuracy": 0.0, "macro_f1": 0.0}
    return distributed.from_main(figures)


def _record(epoch: int, loss: float, metrics: dict, seconds: float) -> EpochRecord:
    return EpochRecord(epoch, loss, metrics["accuracy"], metrics["macro_f1"], round(seconds, 3))


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the weights; a tensor the state dict names twice (tied encoders: one module as `question` and
    `standard`) is copied once, not a second model's worth of memory on the training device."""
    copies: dict[tuple, torch.Tensor] = {}
    snapshot = {}
    for name, tensor in model.state_dict().items():
        same = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())  # the very tensor, not a view of it
        if same not in copies:
            copies[same] = tensor.detach().clone()
        snapshot[name] = copies[same]
    return snapshot


def twin_columns(groups: np.ndarray | None, row_classes: torch.Tensor, column_classes: torch.Tensor,
                 target: torch.Tensor) -> torch.Tensor | None:
    """(B, C) True where a column is another class with the row's standard question (`standard_text_groups`), for
    the loss to leave out; None where there are no such classes. A column class of −1 (no class) is never one."""
    if groups is None:
        return None
    lookup = torch.as_tensor(groups)
    grouped = lambda classes: torch.where(classes >= 0, lookup[classes.clamp(min=0)], -1)  # noqa: E731
    return same_class_mask(grouped(row_classes), grouped(column_classes), target)


def warn_cut_standards(model: BiEncoder, catalog: Catalog, most: int = 5) -> None:
    """Say how many standard questions the catalog's encoder cuts at model.max_length, and the first `most` of their
    classes: training, mining, evaluate and serving all read only their first max_length tokens. Tokenized once more
    (`TextEncoder.overlong`), once per call, off the training steps: the catalog is small, and no figure changes."""
    if not distributed.is_main():  # said once, not by every rank of a launch
        return
    cut = model.standard.overlong(catalog.texts)
    if cut:
        classes = first_of([repr(catalog.class_ids[i]) for i in cut], most)
        log.warning("%d standard question(s) longer than model.max_length (%d tokens) are cut to their first %d tokens, "
                    "in training and wherever the model matches them: class(es) %s; shorten them or raise model.max_length",
                    len(cut), model.standard.max_length, model.standard.max_length, classes, extra=ALIKE_EVERY_TRAINING)


def bi_encoder_validator(model: BiEncoder, validation: list[LabeledQuestion], catalog: Catalog) -> Callable[[], dict]:
    """Validation macro-F1 and accuracy against the catalog. Stage one and stage two build it once, before their first
    step: there they are told of the standard questions cut at model.max_length (`warn_cut_standards`)."""
    warn_cut_standards(model, catalog)
    gold = gold_indices(validation, catalog)
    return lambda: summary(catalog_scores(model, validation, catalog), gold)


def _csv_value(value) -> str:
    # "NaN", not an empty cell: DVC hands a cell to Vega as a string, and Vega reads "" as 0 (the training-loss plot
    # drew every curve from a loss of 0 at epoch 0, below its axis) but "NaN" as no value, which it leaves out
    return "NaN" if isinstance(value, float) and math.isnan(value) else str(value)


def write_outputs(stage: str, save_model: Callable[[], None], out_dir, history_path, result: FitResult) -> FitResult:
    """A training stage's outputs: its best weights (`save_model`) and its curves, written by rank 0 only.

    Under torchrun every replica holds the same weights, so one writer is enough and no two race
    on the same DVC output.
    """
    if distributed.is_main():
        save_model()
        write_history(history_path, result.history)
        log.info("%s: wrote %s and %s", stage, out_dir, history_path)
    return result


def read_history(path) -> list[EpochRecord]:
    """What write_history wrote ("NaN", or the empty cell histories before it wrote, is no value)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    fields = list(EpochRecord.__dataclass_fields__)
    if not lines or lines[0].split(",") != fields:
        raise ValueError(f"{path}: not a training history (its header is not {','.join(fields)})")
    return [EpochRecord(int(cells[0]), *(float(cell) if cell else math.nan for cell in cells[1:]))
            for cells in (line.split(",") for line in lines[1:])]


def write_history(path, history: list[EpochRecord]) -> None:
    """Training curves as CSV, the format DVC plots read."""
    fields = list(EpochRecord.__dataclass_fields__)
    with atomic_path(path) as tmp:
        lines = [",".join(fields)] + [",".join(_csv_value(v) for v in asdict(r).values()) for r in history]
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
