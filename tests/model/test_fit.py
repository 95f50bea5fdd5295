"""training.fit: early stopping on validation macro-F1, and a model that diverges mid-run."""

import logging

import numpy as np
import torch
from torch import nn

from tqc.config import Schedule
from tqc.metrics import summary
from tqc.training import fit


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
