"""training.fit: early stopping on validation macro-F1, and a model that diverges mid-run."""

import logging
import random

import numpy as np
import pytest
import torch
from torch import nn

from tqc.config import Schedule, StageTwoParams
from tqc.metrics import summary
from tqc.device import autocast
from tqc.training import adamw, batches, fit, linear_warmup, stage_loss, steps_per_epoch


def test_an_epoch_whose_validation_scores_are_nan_counts_as_zero_and_the_best_epoch_is_kept(caplog):
    """A diverged model (NaN scores) no longer ends the stage or the tuning trial: the epoch scores 0 and
    early stopping keeps the weights of the best epoch before it."""
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    gold = np.array([0, 1])
    epoch_scores = iter([np.array([[0.9, 0.1], [0.2, 0.8]]),  # epoch 0: right
                         np.array([[np.nan, 0.1], [0.2, 0.8]])])  # epoch 1: diverged

    def validate():
        return summary(next(epoch_scores), gold)

    weights_before = model.weight.detach().clone()
    with caplog.at_level(logging.WARNING):
        result = fit(model, [{"params": model.parameters(), "lr": 0.1}], lambda rows: model(torch.ones(len(rows), 2)).sum(),
                     4, validate, Schedule(epochs=1, batch_size=2, patience=1), seed=0, description="toy")
    assert [r.validation_macro_f1 for r in result.history] == [1.0, 0.0]
    assert result.best_epoch == 0 and torch.equal(model.weight, weights_before)
    assert "toy: epoch 1: validation scores hold NaN or +inf in 1 row(s)" in caplog.text


def test_a_fit_leaves_its_kept_weights_in_eval_mode_whatever_trained_last():
    """Training switches dropout on; the model handed back is the kept epoch's, as it scores (dropout off), so a
    caller that embeds without `encode()` gets no random drops."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    scores = iter([np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([[0.1, 0.9], [0.8, 0.2]])])  # epoch 1 worse: 0 kept
    fit(model, [{"params": model.parameters(), "lr": 0.1}], lambda rows: model(torch.ones(len(rows), 2)).sum(), 4,
        lambda: summary(next(scores), np.array([0, 1])), Schedule(epochs=1, batch_size=2, patience=1), seed=0,
        description="toy")
    assert not model.training and not any(module.training for module in model.modules())


def test_keep_last_runs_every_epoch_and_keeps_the_last_weights_however_validation_went():
    """The warm-up's fit: validation only reports on it (it learns no classes), so a worse epoch neither stops it
    early nor brings back an earlier one's weights."""
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    figures = iter([0.9, 0.5, 0.4, 0.3])  # every epoch worse than the start

    def validate():
        return {"accuracy": 0.5, "macro_f1": next(figures)}

    before = model.weight.detach().clone()
    result = fit(model, [{"params": model.parameters(), "lr": 0.1}], lambda rows: model(torch.ones(len(rows), 2)).sum(),
                 4, validate, Schedule(epochs=3, batch_size=2, patience=1), seed=0, description="toy", keep="last")
    assert [r.epoch for r in result.history] == [0, 1, 2, 3]  # patience 1 would have stopped after epoch 1
    assert (result.best_epoch, result.best_validation_macro_f1) == (3, 0.3)
    assert not torch.equal(model.weight, before) and not model.training


def test_a_stage_loss_says_a_smoothing_its_loss_never_reads(caplog):
    with caplog.at_level(logging.WARNING):
        loss_fn = stage_loss(StageTwoParams(loss="hinge", smoothing=0.2), "stage_two")
    assert "stage two: stage_two.smoothing is 0.2, and only loss sdml reads it: loss hinge trains without it" in caplog.text
    assert loss_fn.func.__name__ == "hinge" and loss_fn.keywords == {"margin": 0.2}


def test_a_fit_read_back_from_its_history_file_is_the_fit_that_wrote_it(tmp_path):
    """A stage trained under torchrun reaches its caller (retrain, evaluate's extra seeds) as its history file:
    read back, it gives the same records, best epoch (the first of the highest, fit's own rule) and seconds."""
    from tqc.training import FitResult, read_history, write_history

    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    figures = iter([0.5, 0.75, 0.75, 0.6])  # epochs 1 and 2 tie: fit keeps epoch 1

    def validate():
        return {"accuracy": 0.5, "macro_f1": next(figures)}

    result = fit(model, [{"params": model.parameters(), "lr": 0.1}], lambda rows: model(torch.ones(len(rows), 2)).sum(),
                 4, validate, Schedule(epochs=3, batch_size=2, patience=5), seed=0, description="toy")
    assert result.best_epoch == 1
    write_history(tmp_path / "history.csv", result.history)
    read = read_history(tmp_path / "history.csv")
    assert read[1:] == result.history[1:] and np.isnan(read[0].train_loss)  # epoch 0 trained nothing: no loss
    assert (read[0].epoch, read[0].validation_macro_f1) == (0, 0.5)
    # "NaN", which Vega leaves out of the training-loss plot; an empty cell, which it drew as a loss of 0, is gone
    assert (tmp_path / "history.csv").read_text().splitlines()[1].split(",")[:2] == ["0", "NaN"]
    (tmp_path / "before.csv").write_text("epoch,train_loss,validation_accuracy,validation_macro_f1,seconds\n0,,0.5,0.5,0.0\n")
    assert np.isnan(read_history(tmp_path / "before.csv")[0].train_loss)  # histories written before still read
    again = FitResult.of(read)
    assert (again.best_epoch, again.best_validation_macro_f1, again.seconds_per_epoch) == (
        result.best_epoch, result.best_validation_macro_f1, result.seconds_per_epoch)
    assert FitResult.of([]).best_epoch == 0 and np.isnan(FitResult.of([]).best_validation_macro_f1)
    (tmp_path / "other.csv").write_text("epoch,loss\n1,0.5\n")
    with pytest.raises(ValueError, match="other.csv: not a training history"):
        read_history(tmp_path / "other.csv")


class _Events(logging.Handler):
    """Collects tqc.training's log lines into a list that on_epoch writes to as well, so their order shows."""

    def __init__(self, events: list):
        super().__init__(logging.INFO)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(("log", record.getMessage()))


def _scripted_fit(figures: list[float], schedule: Schedule, keep: str = "best", validated: list | None = None):
    """`fit` on a small model with dropout, whose validation macro-F1 is `figures`, epoch by epoch. Returns the result,
    the log lines and on_epoch calls in their order, each epoch's weights as on_epoch saw them, the losses of each
    epoch's steps, the rows each step trained on, and the model. `validated` gets the weights each validation scored."""
    torch.manual_seed(0)
    model, inputs = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.3)), torch.randn(7, 3)  # (rows, features)
    events, weights, losses, steps, scripted = [], {}, {}, [], iter(figures)

    def batch_loss(rows):
        steps.append(rows)
        loss = model(inputs[rows]).pow(2).mean()
        losses.setdefault(len(weights), []).append(loss.item())  # the epoch on_epoch sees next
        return loss

    def validate():
        if validated is not None:
            validated.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"accuracy": 0.25, "macro_f1": next(scripted)}

    def on_epoch(record):
        events.append(("on_epoch", record))
        weights[record.epoch] = {k: v.clone() for k, v in model.state_dict().items()}

    handler, logger = _Events(events), logging.getLogger("tqc.training")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        result = fit(model, [{"params": model.parameters(), "lr": 0.05}], batch_loss, len(inputs), validate, schedule,
                     seed=3, description="toy", on_epoch=on_epoch, keep=keep)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return result, events, weights, losses, steps, model


def _epoch_line(record) -> tuple[str, str]:
    return ("log", f"toy: epoch {record.epoch} loss {record.train_loss:.4f} validation accuracy 0.2500 "
                   f"macro-F1 {record.validation_macro_f1:.4f} ({record.seconds:.1f}s)")


def test_fit_keeps_the_first_best_epoch_stops_after_patience_epochs_without_a_gain_and_says_so_in_order():
    """Pins fit's early stopping: a tie is no gain, the run stops `patience` epochs after the best one, the model ends
    with the best epoch's weights, and the log lines and on_epoch calls come in their order, one record per epoch."""
    figures = [0.2, 0.5, 0.4, 0.6, 0.55, 0.6, 0.9, 0.9]  # best at 3; 4 and 5 (a tie) no gain: stops after 5
    result, events, weights, losses, _, model = _scripted_fit(figures, Schedule(epochs=7, batch_size=2, patience=2))
    history = result.history
    assert [r.epoch for r in history] == [0, 1, 2, 3, 4, 5]
    assert [r.validation_macro_f1 for r in history] == figures[:6] and {r.validation_accuracy for r in history} == {0.25}
    assert (result.best_epoch, result.best_validation_macro_f1) == (3, 0.6)
    assert np.isnan(history[0].train_loss) and history[0].seconds == 0.0
    assert [r.train_loss for r in history[1:]] == [float(np.mean(losses[epoch])) for epoch in range(1, 6)]
    assert [len(losses[epoch]) for epoch in range(1, 6)] == [3] * 5  # 7 rows in twos: the lone seventh joins the third
    assert result.seconds_per_epoch == float(np.mean([r.seconds for r in history[1:]]))
    assert events == [("log", "toy: epoch 0 (start) validation macro-F1 0.2000"), ("on_epoch", history[0])] + [
        event for record in history[1:] for event in (("on_epoch", record), _epoch_line(record))] + [
        ("log", "toy: no validation gain for 2 epochs; stopping early"),
        ("log", "toy: kept epoch 3 (validation macro-F1 0.6000)")]
    kept = model.state_dict()
    assert all(torch.equal(kept[k], weights[3][k]) for k in kept)
    assert not torch.equal(kept["0.weight"], weights[5]["0.weight"])  # the last epoch's weights differ
    assert not model.training


def test_fit_that_never_gains_keeps_the_starting_weights_and_stops_after_patience():
    result, events, weights, _, _, model = _scripted_fit([0.5, 0.5, 0.4, 0.9], Schedule(epochs=5, batch_size=2, patience=2))
    assert [r.epoch for r in result.history] == [0, 1, 2] and result.best_epoch == 0
    assert all(torch.equal(v, weights[0][k]) for k, v in model.state_dict().items())
    assert events[-1] == ("log", "toy: kept epoch 0 (validation macro-F1 0.5000)")


def test_fit_keep_last_calls_on_epoch_for_every_epoch_and_says_it_kept_the_last():
    figures = [0.9, 0.5, 0.4, 0.3]
    result, events, weights, _, _, model = _scripted_fit(figures, Schedule(epochs=3, batch_size=2, patience=1), keep="last")
    history = result.history
    assert [r.validation_macro_f1 for r in history] == figures
    assert (result.best_epoch, result.best_validation_macro_f1) == (3, 0.3)
    assert events == [("log", "toy: epoch 0 (start) validation macro-F1 0.9000"), ("on_epoch", history[0])] + [
        event for record in history[1:] for event in (("on_epoch", record), _epoch_line(record))] + [
        ("log", "toy: kept the last epoch, 3 (validation macro-F1 0.3000)")]
    assert all(torch.equal(v, weights[3][k]) for k, v in model.state_dict().items()) and not model.training


def test_batches_shuffle_every_row_once_fold_a_lone_trailing_row_and_stop_at_max_steps():
    """fit's other tests build their expected runs with `batches` and `linear_warmup` themselves, so a change to either
    moved both sides alike: these pin them by hand. One process: a trailing batch of one row (no in-batch negative)
    joins the one before; a trailing two stays its own batch; max_steps keeps that many batches."""
    order = list(range(7))
    random.Random(5).shuffle(order)
    assert batches(7, 3, random.Random(5), None) == [order[:3], order[3:]]  # 3 + 1: the lone row folded in
    order = list(range(8))
    random.Random(5).shuffle(order)
    assert batches(8, 3, random.Random(5), None) == [order[:3], order[3:6], order[6:]]  # 3 + 3 + 2
    assert batches(8, 3, random.Random(5), 2) == [order[:3], order[3:6]]
    assert steps_per_epoch(7, 3, None) == 2 and steps_per_epoch(8, 3, None) == 3 and steps_per_epoch(8, 3, 2) == 2


@pytest.mark.parametrize("warmup_ratio, factors", [
    (0.3, [1 / 3, 2 / 3, 1.0, 1.0, 6 / 7, 5 / 7, 4 / 7, 3 / 7, 2 / 7, 1 / 7, 0.0]),  # 3 warm-up steps, then 7 of decay
    (0.0, [1.0, 1.0, 8 / 9, 7 / 9, 6 / 9, 5 / 9, 4 / 9, 3 / 9, 2 / 9, 1 / 9, 0.0]),  # at least one warm-up step
])
def test_linear_warmup_rises_from_the_first_step_and_decays_to_zero_at_the_last(warmup_ratio, factors):
    """The learning rate at each of 10 steps (and after the last), as a fraction of the set one: the first step
    already trains (1/warm-up, not 0), the peak is reached at the end of warm-up, and it falls linearly to 0."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = linear_warmup(optimizer, total_steps=10, warmup_ratio=warmup_ratio)
    seen = []
    for _ in range(11):
        seen.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx(factors)


@pytest.mark.parametrize("keep", ["best", "last"])
def test_fit_trains_exactly_as_a_plain_loop_over_its_seeded_batches(keep):
    """Pins fit's random draws and their order: one random.Random(seed) shuffles every epoch's batches in turn,
    dropout draws from torch's global stream (one process: fit does not reseed it), nothing else draws, and AdamW and
    the linear warm-up schedule are built over the whole run's steps. The weights match a plain loop bit for bit."""
    schedule = Schedule(epochs=3, batch_size=2, warmup_ratio=0.3, weight_decay=0.1, patience=5)
    rising = [0.1, 0.2, 0.3, 0.4]  # every epoch a gain: keep="best" keeps the last one too
    result, _, _, _, steps, model = _scripted_fit(rising, schedule, keep=keep)
    assert result.best_epoch == 3

    torch.manual_seed(0)
    plain, inputs = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.3)), torch.randn(7, 3)
    optimizer = adamw([{"params": plain.parameters(), "lr": 0.05}], schedule.weight_decay)
    scheduler = linear_warmup(optimizer, 3 * steps_per_epoch(7, 2, None), schedule.warmup_ratio)
    rng, order = random.Random(3), []
    plain.train()
    for _ in range(3):
        for rows in batches(7, 2, rng, None):
            order.append(rows)
            with autocast(torch.device("cpu")):
                (plain(inputs[rows]).pow(2).mean() * 1.0).backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
    assert steps == order
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("keep", ["best", "last"])
def test_fit_with_weight_averaging_validates_and_keeps_the_average_while_its_own_weights_train_on(keep):
    """Polyak averaging (Schedule.weight_averaging): each epoch validates the moving average of the weights, with the
    decay ramped as min(d, (1 + t) / (10 + t)) at step t, and early stopping keeps the best epoch's average; the
    optimizer steps the model's own weights throughout, exactly as without it. keep="last" ends with the last average."""
    decay = 0.3  # the ramp binds for the first two steps ((1 + t) / (10 + t) < 0.3), the decay after
    schedule = Schedule(epochs=4, batch_size=2, warmup_ratio=0.3, patience=5, weight_averaging=decay)
    figures = [0.1, 0.2, 0.5, 0.4, 0.3]  # best at epoch 2
    validated = []
    result, _, seen, _, steps, model = _scripted_fit(figures, schedule, keep=keep, validated=validated)

    torch.manual_seed(0)
    plain, inputs = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.3)), torch.randn(7, 3)
    optimizer = adamw([{"params": plain.parameters(), "lr": 0.05}], schedule.weight_decay)
    scheduler = linear_warmup(optimizer, 4 * steps_per_epoch(7, 2, None), schedule.warmup_ratio)
    average = {k: v.clone() for k, v in plain.state_dict().items()}
    rng, order, averages, step = random.Random(3), [], {0: dict(average)}, 0
    plain.train()
    for epoch in range(1, 5):
        for rows in batches(7, 2, rng, None):
            order.append(rows)
            plain(inputs[rows]).pow(2).mean().backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            d = min(decay, (1 + step) / (10 + step))
            average = {k: d * average[k] + (1 - d) * v.detach() for k, v in plain.state_dict().items()}
        averages[epoch] = dict(average)

    assert steps == order and result.best_epoch == (2 if keep == "best" else 4)
    for epoch in range(5):  # what each epoch's validation scored, and on_epoch saw
        assert all(torch.allclose(validated[epoch][k], averages[epoch][k], atol=1e-6) for k in average), epoch
        assert all(torch.equal(seen[epoch][k], validated[epoch][k]) for k in average), epoch
    assert not torch.allclose(seen[4]["0.weight"], plain.state_dict()["0.weight"], atol=1e-3)  # not the own weights
    kept = model.state_dict()
    assert all(torch.equal(kept[k], seen[result.best_epoch][k]) for k in kept) and not model.training


def test_weight_averaging_is_a_decay_below_one():
    assert Schedule().weight_averaging == 0.0
    with pytest.raises(ValueError, match="weight_averaging"):
        Schedule(weight_averaging=1.0)


def test_seed_everything_seeds_python_numpy_and_torch_alike():
    """Each library draws from its own generator (shuffles from `random`, EDA and mixup from NumPy, initialisation
    and dropout from torch): one left unseeded makes a run unrepeatable at the same seed."""
    from tqc.device import seed_everything

    def draws() -> tuple:
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    seed_everything(7)
    first = draws()
    draws()  # the generators move on ...
    seed_everything(7)  # ... and the seed brings each one back
    assert draws() == first
    seed_everything(8)
    assert all(a != b for a, b in zip(draws(), first))


def test_each_torchrun_process_picks_its_own_gpu_by_local_rank(monkeypatch):
    """Under torchrun every process of a node sees every GPU: on GPU 0, each would train on the first one."""
    from tqc.device import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert pick_device() == torch.device("cuda", 3)
    monkeypatch.delenv("LOCAL_RANK")
    assert pick_device() == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device() == torch.device("cpu")


def _fit_with_non_finite_steps(non_finite_calls: set[int], schedule: Schedule, figures: list[float]):
    """`fit` of a linear model whose loss is NaN at the given calls of `batch_loss` (0 first), inf at none."""
    torch.manual_seed(0)
    model, inputs = nn.Linear(3, 3), torch.randn(7, 3)  # (rows, features)
    calls, losses, scripted = [], [], iter(figures)

    def batch_loss(rows):
        calls.append(rows)
        loss = model(inputs[rows]).pow(2).mean()
        if len(calls) - 1 in non_finite_calls:
            return loss * float("nan")
        losses.append(loss.item())
        return loss

    result = fit(model, [{"params": model.parameters(), "lr": 0.05}], batch_loss, len(inputs),
                 lambda: {"accuracy": 0.25, "macro_f1": next(scripted)}, schedule, seed=3, description="toy")
    return result, model, inputs, calls, losses


def test_a_step_whose_loss_is_not_finite_is_skipped_while_the_schedule_moves_on(caplog):
    """One NaN batch (a bf16 overflow on a GPU) no longer makes every weight NaN and ends a long run: its step is
    skipped, the schedule keeps its place as if it were taken, the epoch's loss is the mean of the steps taken, and
    the log says how many were skipped. The weights match a plain loop that skips that one step."""
    schedule = Schedule(epochs=2, batch_size=2, warmup_ratio=0.3, patience=5)
    with caplog.at_level(logging.WARNING, logger="tqc.training"):
        result, model, inputs, calls, losses = _fit_with_non_finite_steps({1}, schedule, [0.1, 0.2, 0.3])
    assert "toy: epoch 1: 1 of its 3 steps had a non-finite loss (NaN or inf) and were skipped" in caplog.text
    assert "epoch 2:" not in caplog.text and len(calls) == 6

    torch.manual_seed(0)
    plain = nn.Linear(3, 3)
    optimizer = adamw([{"params": plain.parameters(), "lr": 0.05}], schedule.weight_decay)
    scheduler = linear_warmup(optimizer, 2 * steps_per_epoch(7, 2, None), schedule.warmup_ratio)
    for step, rows in enumerate(calls):
        if step != 1:
            plain(inputs[rows]).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in model.state_dict().items())
    assert result.history[1].train_loss == pytest.approx(np.mean(losses[:2]))  # steps 0 and 2 of epoch 1


def test_an_epoch_in_which_no_loss_was_finite_ends_training_and_keeps_the_best_epoch_before_it(caplog):
    """A whole epoch of non-finite losses (a diverged model, a broken input) would be skipped alike epoch after
    epoch: training ends there, as a diverged validation does, with the best epoch before it kept and the reason said."""
    schedule = Schedule(epochs=4, batch_size=2, patience=5)
    with caplog.at_level(logging.WARNING, logger="tqc.training"):
        result, model, _, calls, _ = _fit_with_non_finite_steps({3, 4, 5}, schedule, [0.1, 0.5, 0.9])
    assert len(calls) == 6 and [r.epoch for r in result.history] == [0, 1]  # epoch 2 was not validated, 3 not run
    assert result.best_epoch == 1 and result.best_validation_macro_f1 == 0.5
    assert ("toy: epoch 2: every one of its 3 steps had a non-finite loss (NaN or inf), so none was taken; training "
            "stops and keeps its best epoch so far") in caplog.text
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())


def test_an_epochs_seconds_are_read_once_the_device_has_done_its_queued_work(monkeypatch):
    """A CUDA call returns once its kernels are queued: the clock was read with the epoch's last step possibly still
    queued, short by up to a step (the bench's ratio read it too). fit waits for the device before reading it, and
    waiting is a no-op on the CPU."""
    from tqc import device as device_module
    from tqc import training

    waited = []
    monkeypatch.setattr(training, "wait_for", lambda device: waited.append(device.type))
    model = nn.Linear(2, 1)
    fit(model, [{"params": model.parameters(), "lr": 0.1}], lambda rows: model(torch.ones(len(rows), 2)).sum(), 4,
        lambda: {"accuracy": 0.0, "macro_f1": 0.0}, Schedule(epochs=2, batch_size=2, patience=5), seed=0,
        description="toy")
    assert waited == ["cpu", "cpu"]  # once an epoch
    synchronized = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: synchronized.append(device))
    device_module.wait_for(torch.device("cpu"))
    device_module.wait_for(torch.device("cuda", 1))
    assert synchronized == [torch.device("cuda", 1)]


def test_an_epochs_progress_bar_shows_on_a_terminal_and_not_in_a_log_file_or_pipe(monkeypatch):
    """Shown whatever stderr was: a `dvc repro 2> log` or a cron job's log file got a frame of every epoch's bar a
    tenth of a second, carriage returns and all."""
    import io
    import sys

    from tqc.training import _epoch_batches

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stderr, shown in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stderr)
        bar = _epoch_batches(8, Schedule(epochs=1, batch_size=2), random.Random(0), "toy", 1)
        assert bool(bar.disable) is not shown and len(list(bar)) == 4
        bar.close()
        assert ("toy epoch 1/1" in stderr.getvalue()) is shown


LIBRARY_BARS = """import os, sys
from tqc.cli import _no_library_bars_unless_on_a_terminal
_no_library_bars_unless_on_a_terminal()
from transformers.utils import logging
print(logging.is_progress_bar_enabled(), os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS'))
"""


@pytest.mark.parametrize("terminal, users_setting, shown", [(False, None, False), (True, None, True),
                                                             (False, "0", True)])
def test_hugging_faces_bars_are_off_where_stderr_is_no_terminal_unless_the_user_says(terminal, users_setting, shown):
    """transformers drew its "Loading weights" bar at each model load into a `dvc repro` logged to a file. The CLI turns
    Hugging Face's bars off there, before transformers is imported; on a terminal, or where the user set
    HF_HUB_DISABLE_PROGRESS_BARS, they are as they were."""
    import os
    import pty
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    if users_setting is not None:
        env["HF_HUB_DISABLE_PROGRESS_BARS"] = users_setting
    main_side, terminal_side = pty.openpty() if terminal else (None, None)
    try:
        done = subprocess.run([sys.executable, "-c", LIBRARY_BARS], stdout=subprocess.PIPE, text=True, env=env,
                              stderr=terminal_side if terminal else subprocess.DEVNULL, check=True)
    finally:
        for end in (main_side, terminal_side):
            if end is not None:
                os.close(end)
    enabled, setting = done.stdout.split()
    assert enabled == str(shown)
    assert setting == (users_setting or ("None" if terminal else "1"))
