"""training.fit: early stopping on validation macro-F1, and a model that diverges mid-run."""

import logging

import numpy as np
import pytest
import torch
from torch import nn

from tqc.config import Schedule, StageTwoParams
from tqc.metrics import summary
from tqc.training import fit, stage_loss


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
    again = FitResult.of(read)
    assert (again.best_epoch, again.best_validation_macro_f1, again.seconds_per_epoch) == (
        result.best_epoch, result.best_validation_macro_f1, result.seconds_per_epoch)
    assert FitResult.of([]).best_epoch == 0 and np.isnan(FitResult.of([]).best_validation_macro_f1)
    (tmp_path / "other.csv").write_text("epoch,loss\n1,0.5\n")
    with pytest.raises(ValueError, match="other.csv: not a training history"):
        read_history(tmp_path / "other.csv")
