"""The training stages' one table of path arguments: what the CLI parses, the chain hands over and a launch passes."""

from dataclasses import replace
from pathlib import Path

import pytest

from tqc.cli import parse_arguments
from tqc.config import Params
from tqc.training_commands import BASELINE_NC, STAGE_ONE, TRAINING_COMMANDS, WARMUP


@pytest.mark.parametrize("command", TRAINING_COMMANDS.values(), ids=lambda command: command.name)
def test_the_command_line_a_launch_passes_parses_back_to_the_same_paths(command):
    paths = {name: Path("work") / name for name in (*command.paths, *command.optional)}
    args = parse_arguments([command.name, *command.arguments(paths)])
    assert command.given(vars(args)) == paths


def test_a_path_argument_left_out_of_the_command_line_is_an_error_of_the_parser():
    paths = {name: Path(name) for name in STAGE_ONE.paths if name != "history"}
    with pytest.raises(SystemExit):
        parse_arguments([STAGE_ONE.name, *STAGE_ONE.arguments(paths)])


def test_an_optional_path_not_given_is_not_handed_on():
    args = parse_arguments([STAGE_ONE.name, *STAGE_ONE.arguments({name: Path(name) for name in STAGE_ONE.paths})])
    assert "warmup" not in STAGE_ONE.given(vars(args))


def test_a_caller_that_leaves_out_or_adds_a_path_is_stopped_before_the_stage_runs():
    def never(*_):
        raise AssertionError("the stage ran")

    command = replace(BASELINE_NC, call=never)
    paths = {name: Path(name) for name in command.paths}
    with pytest.raises(TypeError, match=r"missing path arguments \['history'\], unknown ones \[\]"):
        command.run({name: path for name, path in paths.items() if name != "history"}, Params(), 0)
    with pytest.raises(TypeError, match=r"missing path arguments \[\], unknown ones \['negatives'\]"):
        command.run({**paths, "negatives": Path("n.jsonl")}, Params(), 0)


def test_only_the_stages_with_an_enabled_switch_are_ever_off():
    params = Params().with_overrides({"warmup": {"enabled": False}, "baseline_nc": {"enabled": False}})
    assert {name for name, command in TRAINING_COMMANDS.items() if command.is_off(params)} == {"warmup", "baseline-nc"}
    assert not WARMUP.is_off(params.with_overrides({"warmup": {"enabled": True, "include_train": True}}))
    assert not any(command.is_off(Params().with_overrides({"warmup": {"enabled": True}}))
                   for command in (STAGE_ONE, WARMUP))


def test_the_chain_checks_a_stages_paths_before_it_launches_one():
    """Under torchrun a wrong set of paths would fail as each process's argparse error, after the launch."""
    from tqc.pipeline import _Trainer

    launched = []
    trainer = _Trainer(Params(), 0, launcher=lambda command, paths, on_epoch: launched.append(command.name))
    with pytest.raises(TypeError, match=r"tqc stage-one: missing path arguments \['out', 'history'\]"):
        trainer(STAGE_ONE, {"data": Path("d"), "train": Path("t.jsonl")}, None)
    assert launched == []
    trainer(STAGE_ONE, {name: Path(name) for name in STAGE_ONE.paths}, None)
    assert launched == ["stage-one"]


@pytest.mark.parametrize(("overrides", "epochs"), [
    ({}, 3),  # stage one's 2 and stage two's 1
    ({"stage_one": {"epochs": 15}, "stage_two": {"epochs": 10}}, 25),  # NC followed neither: 3 against 25
    ({"stage_one": {"epochs": 15}, "baseline_nc": {"epochs": 6}}, 6),  # a budget of its own
])
def test_nc_trains_with_admc_s_budget_unless_given_its_own(monkeypatch, overrides, epochs):
    """The issue's NC is fine-tuned "on the same data and budget": baseline_nc.epochs was a fixed 3, equal to stage
    one + stage two only at their defaults, so gains_on_test's ADMC − NC compared unequal budgets, said nowhere."""
    from tqc.stages import baseline_nc

    handed = []
    monkeypatch.setattr(baseline_nc, "run", lambda data, train, model, augment, params, seed, *rest, **kw:
                        handed.append(params.epochs))
    params = Params().with_overrides(overrides)
    paths = {"data": Path("d"), "train": Path("t"), "out": Path("o"), "history": Path("h")}
    BASELINE_NC.call(paths, params, 0, None)
    assert handed == [epochs] and params.nc_schedule().epochs == epochs
    assert Params().baseline_nc.epochs is None  # params.yaml's default, as the class's


def test_an_nc_schedule_left_unresolved_is_refused_by_name(tmp_path):
    from tqc.config import BaselineNCParams
    from tqc.stages import baseline_nc

    with pytest.raises(ValueError, match="baseline_nc.epochs is null.*Params.nc_schedule"):
        baseline_nc.run(tmp_path, tmp_path / "t.jsonl", None, None, BaselineNCParams(), 0, tmp_path / "o", tmp_path / "h")


def test_a_launched_warm_ups_curves_read_back_with_epoch_0s_loss_as_nan(tmp_path):
    """The warm-up's report is JSON, which has no NaN: its epoch 0 loss (no step taken) is written as null, and the
    launched stage's curves, read back for its MLflow run, must give the record it had."""
    import math
    from dataclasses import asdict

    from tqc.io import write_json
    from tqc.pipeline import _launched_history
    from tqc.training import EpochRecord
    from tqc.training_commands import WARMUP

    history = [EpochRecord(0, math.nan, 0.5, 0.4, 0.0), EpochRecord(1, 0.7, 0.6, 0.5, 2.0)]
    write_json(tmp_path / "warmup.json", {"history": [asdict(record) for record in history]})
    first, second = _launched_history(WARMUP, {"report": tmp_path / "warmup.json"})
    assert math.isnan(first.train_loss) and (first.epoch, first.validation_macro_f1) == (0, 0.4)
    assert second == history[1]


def test_a_tracked_warm_up_logs_its_unlabelled_file_with_its_inputs(monkeypatch, tmp_path):
    """The warm-up reads warmup.unlabelled, a file its params name under data.data_dir rather than a path argument:
    its MLflow run tagged the data folder alone, so two runs on different pools looked alike."""
    from contextlib import contextmanager

    from tqc import cli

    logged = []

    @contextmanager
    def stage_run(stage, params, inputs=()):
        logged.append((stage, list(inputs)))
        yield type("Tracker", (), {"on_epoch": lambda self, stage: None})()

    monkeypatch.setattr(cli, "stage_run", stage_run)
    monkeypatch.setattr(cli, "_log_fit", lambda *args: None)
    params = Params().with_overrides({"data": {"data_dir": str(tmp_path / "raw")},
                                      "warmup": {"enabled": True, "unlabelled": "pool/questions.csv"}})
    paths = {name: tmp_path / name for name in WARMUP.paths}
    cli._training_stage(replace(WARMUP, call=lambda *args: None))(parse_arguments(
        [WARMUP.name, *WARMUP.arguments(paths)]), params)
    assert logged == [("warmup", [tmp_path / "data", tmp_path / "raw" / "pool" / "questions.csv"])]
    assert STAGE_ONE.params_inputs(params) == [] and WARMUP.params_inputs(Params()) == []
