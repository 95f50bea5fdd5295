import math
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from tqc.config import ConfigError, Params, SearchDimension, load_params, read_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_repository_params_are_valid():
    params = load_params("params.yaml")
    assert params.data.dataset == "trec6" and params.stage_one.temperature > 0


def test_unknown_keys_are_rejected_with_the_sections_keys_spelt_like_them(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("stage_one:\n  temprature: 0.1\n")
    with pytest.raises(ConfigError, match=r"stage_one.temprature: Extra inputs are not permitted \(got 0.1\); did you "
                                          r"mean temperature\?"):
        load_params(path)
    # nested sections, the aliased one (validate), the top level, and a key like none: no guess
    for overrides, said in (({"data": {"custom": {"text_colum": "q"}}}, "did you mean text_column?"),
                            ({"validate": {"critcal": []}}, "validate.critcal: Extra inputs are not permitted; did you mean critical?"),
                            ({"seeed": 1}, "seeed: Extra inputs are not permitted (got 1); did you mean seed?"),
                            ({"data": {"zzz": 1}}, "data.zzz: Extra inputs are not permitted (got 1)\n"),
                            # sections of named sections: the name is skipped, its section's keys suggested
                            ({"tune": {"space": {"stage_one.temperature": {"hgih": 1}}}}, "did you mean high?"),
                            ({"ablate": {"grids": {"augmentation": {"varaints": {}}}}}, "did you mean variants?")):
        with pytest.raises(ConfigError) as refused:
            load_params(ROOT / "params.yaml", overrides)
        assert said in str(refused.value) + "\n"


def test_overrides_reach_the_params(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("mine:\n  k: 3\n")
    params = load_params(path, {"mine": {"k": 7}, "stage_two": {"temperature": 0.05}})
    assert params.mine.k == 7 and params.stage_two.temperature == 0.05


def test_custom_dataset_needs_its_files():
    with pytest.raises(ValueError, match="custom"):
        Params.model_validate({"data": {"dataset": "custom"}})


def test_deferred_rebalancing_needs_a_rebalance_target():
    with pytest.raises(ValueError, match="augment.deferred .* augment.rebalance is 'none'"):
        Params.model_validate({"augment": {"rebalance": "none", "deferred": True}})
    assert Params.model_validate({"augment": {"rebalance": "sqrt", "deferred": True}}).augment.deferred


def test_serving_the_exemplar_rule_needs_a_k():
    with pytest.raises(ValueError, match="promote.rule is 'exemplars' but evaluate.exemplar_k is 0"):
        Params.model_validate({"promote": {"rule": "exemplars"}, "evaluate": {"exemplar_k": 0}})
    assert Params.model_validate({"promote": {"rule": "exemplars"}}).evaluate.exemplar_k == 2
    with pytest.raises(ValueError, match="promote.rule is 'auto' but evaluate.exemplar_k is 0"):
        Params.model_validate({"promote": {"rule": "auto"}, "evaluate": {"exemplar_k": 0}})


def test_a_refresh_refuses_the_standard_rule_and_needs_a_registry():
    with pytest.raises(ValueError, match="retrain.mode is 'refresh' .* but promote.rule is 'standard'"):
        Params.model_validate({"retrain": {"mode": "refresh"}})
    with pytest.raises(ValueError, match="tracking.enabled is false: there is no registry"):
        Params.model_validate({"retrain": {"mode": "refresh"}, "promote": {"rule": "exemplars"}, "tracking": {"enabled": False}})
    assert Params.model_validate({"retrain": {"mode": "refresh"}, "promote": {"rule": "exemplars"}}).retrain.mode == "refresh"
    # auto: a refresh serves the exemplar rule, and must win the gate where the champion serves the standard rule
    assert Params.model_validate({"retrain": {"mode": "refresh"}, "promote": {"rule": "auto"}}).retrain.mode == "refresh"


def test_a_registered_model_name_with_a_quote_is_refused(tmp_path):
    # the name is quoted inside MLflow's search filter, which cannot escape it
    path = tmp_path / "params.yaml"
    for name in ("tqc's model", 'say "hi"', "back\\slash", ""):
        path.write_text(f"promote:\n  model_name: '{name.replace(chr(39), chr(39) * 2)}'\n")
        with pytest.raises(ConfigError, match="model_name"):
            load_params(path)
    assert Params.model_validate({"promote": {"model_name": "bank FAQ matcher-v2.1"}}).promote.model_name


def test_a_search_space_must_name_real_params_and_ranges_or_choices():
    from tqc.config import ConfigError, Params

    with pytest.raises(ValidationError, match="'stage_one.temprature' is not a parameter"):
        Params.model_validate({"tune": {"space": {"stage_one.temprature": {"low": 0.01, "high": 0.1}}}})
    with pytest.raises(ValidationError, match="either low and high, or choices"):
        Params.model_validate({"tune": {"space": {"mine.k": {"low": 1}}}})
    with pytest.raises(ConfigError, match="invalid parameter overrides"):
        Params().with_overrides({"mine": {"k": 0}})


def test_set_overrides_are_read_as_yaml_values():
    from tqc.arguments import parse_overrides
    from tqc.config import ConfigError

    assert parse_overrides(["stage_one.epochs=5", "data.dataset=trec50", "augment.implicit=[dropout]"]) == {
        "stage_one": {"epochs": 5}, "data": {"dataset": "trec50"}, "augment": {"implicit": ["dropout"]}}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_overrides(["stage_one.epochs"])
    with pytest.raises(ConfigError, match=r"--set 'stage_one.epochs=\[1': the value is not YAML"):
        parse_overrides(["stage_one.epochs=[1"])  # was PyYAML's traceback
    # a search dimension's name is itself a dotted param path: one key under tune.space, merged into the shipped space
    dimension = parse_overrides(["tune.space.stage_two.loss={choices: [nt_xent, bpr]}", "tune.trials=3"])
    assert dimension == {"tune": {"trials": 3, "space": {"stage_two.loss": {"choices": ["nt_xent", "bpr"]}}}}
    params = load_params("params.yaml", dimension)
    assert params.tune.space["stage_two.loss"].choices == ["nt_xent", "bpr"] and "mine.k" in params.tune.space


def test_maps_keyed_by_param_paths_take_a_dotted_key_whole():
    """ablate's budgets, a grid's base, matrix and variants, like tune.space, are keyed by dotted param paths:
    `--set ablate.budget.stage_one.epochs=1` is one budget entry, not ablate.budget.stage_one = {epochs: 1}."""
    from tqc.arguments import parse_overrides
    from tqc.config import ConfigError

    overrides = parse_overrides(["ablate.budget.stage_one.epochs=1", "ablate.grids.rebalancing.budget.stage_two.epochs=1",
                                 "ablate.grids.rebalancing.variants.sqrt.augment.max_factor=4", "ablate.seeds=[0]"])
    assert overrides == {"ablate": {"seeds": [0], "budget": {"stage_one.epochs": 1}, "grids": {"rebalancing": {
        "budget": {"stage_two.epochs": 1}, "variants": {"sqrt": {"augment.max_factor": 4}}}}}}
    params = load_params("params.yaml", overrides)
    assert params.ablate.budget["stage_one.epochs"] == 1 and "stage_two.epochs" in params.ablate.budget  # merged
    rebalancing = params.ablate.grids["rebalancing"]
    assert rebalancing.budget["stage_two.epochs"] == 1 and rebalancing.budget["stage_one.epochs"] == 5
    assert rebalancing.variants["sqrt"] == {"augment.rebalance": "sqrt", "augment.max_factor": 4}
    with pytest.raises(ConfigError, match="ablate.budget is also set to None"):
        parse_overrides(["ablate.budget=null", "ablate.budget.stage_one.epochs=1"])


def test_counts_on_the_command_line_are_at_least_one(capsys):
    from tqc.cli import main

    for argv in (["tune", "--trials", "0"], ["bench", "epochs", "--steps", "0"]):
        with pytest.raises(SystemExit) as exited:  # argparse's usage error, before any params are read or work starts
            main(argv)
        assert exited.value.code == 2 and "must be at least 1" in capsys.readouterr().err
    for argv, said in ((["bench", "epochs", "--batch-size", "1"], "--batch-size: 1: must be at least 2"),  # no negative
                       (["bench", "read", "--rows", "abc"], "--rows: 'abc': not a whole number"),  # no "at_least_one"
                       (["ablate", "--seeds", "-1"], "--seeds: -1: must be at least 0"),  # not an overrides dict
                       (["bench", "validate", "--dataset", "nope"], "--dataset: invalid choice: 'nope' (choose from 'trec6'")):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2 and said in capsys.readouterr().err


def test_a_where_key_given_twice_is_refused_and_a_malformed_one_is_named_as_where():
    """Two --where values of one key kept the last alone: the slice of the first was dropped unsaid."""
    from tqc.arguments import where_filters

    with pytest.raises(ConfigError, match="--where data.imbalance_ratio is given more than once"):
        where_filters(["data.imbalance_ratio=50", "data.imbalance_ratio=20"])
    with pytest.raises(ConfigError, match="--where 'imbalance': expected KEY=VALUE, e.g. --where data.imbalance_ratio=50"):
        where_filters(["imbalance"])
    assert where_filters(["data.imbalance_ratio=50", "augment.rebalance=none"]) == {"data.imbalance_ratio": 50,
                                                                                  "augment.rebalance": "none"}


def test_a_misspelt_key_of_the_common_ablation_budget_is_named_as_the_budgets():
    with pytest.raises(ValidationError, match="ablate.budget: 'stage_one.epoch' is not a parameter a cell may set"):
        Params.model_validate({"ablate": {"budget": {"stage_one.epoch": 1}}})


@pytest.mark.parametrize("grid,said", [
    ({"variants": {"a": {"stage_one.epochs": "two"}}}, r"ablate.grids.g.variants.a: stage_one.epochs = 'two': Input should be a valid integer"),
    ({"base": {"model.pooling": "maxx"}}, r"ablate.grids.g.base: model.pooling = 'maxx': Input should be 'mean', 'cls' or 'attention'"),
    ({"matrix": {"stage_one.temperature": [0.1, 0]}}, r"ablate.grids.g.matrix.stage_one.temperature: stage_one.temperature = 0: "
                                                      r"Input should be greater than 0"),
    ({"budget": {"stage_two.epochs": 1.5}}, r"ablate.grids.g.budget: stage_two.epochs = 1.5: Input should be a valid integer"),
])
def test_an_ablation_cell_value_no_param_takes_is_refused_at_load(grid, said):
    """Only the `tqc ablate` that ran the grid said so (ablate.check_cells): `dvc repro`, and every other grid's run,
    loaded such params without a word."""
    with pytest.raises(ValidationError, match=said):
        Params.model_validate({"ablate": {"grids": {"g": {"title": "t", **grid}}}})


def test_a_value_of_the_common_ablation_budget_its_param_refuses_is_named_as_the_budgets_at_load():
    """Only its keys were checked at load: `stage_one.epochs: 0` loaded, and `tqc ablate` blamed each grid's cells."""
    with pytest.raises(ValidationError, match=r"ablate.budget: stage_one.epochs = 0: Input should be greater than or "
                                              r"equal to 1"):
        Params.model_validate({"ablate": {"budget": {"stage_one.epochs": 0}}})


@pytest.mark.parametrize("dimension,stray", [({"choices": [8, 16], "low": 4}, "low"),
                                             ({"choices": [8, 16], "log": True}, "log"),
                                             ({"choices": [8, 16], "high": 40, "log": True}, "high, log")])
def test_a_bound_or_log_beside_choices_is_refused_not_ignored(dimension, stray):
    with pytest.raises(ValidationError, match=f"choices with {stray}: a dimension is a range or a set of choices"):
        SearchDimension.model_validate(dimension)


def test_ablation_cell_values_of_the_right_types_load():
    grid = {"title": "t", "base": {"augment.rebalance": "none", "data.custom.train": "x.csv"},
            "variants": {"a": {"stage_one.epochs": 4, "stage_one.temperature": 1}}, "matrix": {"data.imbalance_ratio": [10, 50]}}
    assert Params.model_validate({"ablate": {"grids": {"g": grid}}}).ablate.grids["g"].variants["a"]["stage_one.epochs"] == 4


def test_the_tuner_refuses_knobs_the_augment_stage_reads():
    """The tuner prepares data once: a knob of the augment stage would silently do nothing."""
    import pytest

    from tqc.config import ConfigError, Params
    from tqc.tuning.space import check_space

    from tqc.config import AugmentParams

    # every augment knob but those that act in training; a new one lands here by default
    in_training = {"implicit", "rate", "implicit_at", "prototype_mixup", "cross_encoding", "deferred"}
    sections = {"seq2seq"}  # its keys, e.g. augment.seq2seq.top_p below
    names = [f"augment.{field}" for field in AugmentParams.model_fields if field not in in_training | sections]
    assert "augment.max_factor" in names
    for name in [*names, "augment.seq2seq.top_p"]:
        params = Params.model_validate({"tune": {"space": {name: {"low": 0.1, "high": 0.9}}}})
        with pytest.raises(ConfigError, match="changes the prepared data"):
            check_space(params)
    check_space(Params.model_validate({"tune": {"space": {"augment.rate": {"low": 0.0, "high": 0.2}}}}))


def test_a_log_scaled_search_range_must_start_above_zero():
    with pytest.raises(ValueError, match="log-scaled range needs low > 0"):
        Params.model_validate({"tune": {"space": {"stage_two.smoothing": {"low": 0.0, "high": 0.3, "log": True}}}})


def test_every_command_of_the_parser_has_a_handler():
    import argparse

    from tqc.cli import WITH_PARAMS, WITHOUT_PARAMS, build_parser

    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == set(WITH_PARAMS) | set(WITHOUT_PARAMS)
    assert not set(WITH_PARAMS) & set(WITHOUT_PARAMS)


def test_tune_apply_through_the_cli_writes_params_without_loading_them(tmp_path, capsys):
    """`tqc tune --apply` runs before params.yaml is loaded (it writes into it), so it works on a file whose
    current values would not validate."""
    from pathlib import Path

    from tqc.cli import main

    params_file = tmp_path / "params.yaml"
    shipped = (Path(__file__).resolve().parents[2] / "params.yaml").read_text()
    params_file.write_text(shipped.replace("  k: 5\n", "  k: 0\n", 1))  # mine.k: 0 does not validate
    best = tmp_path / "best_params.yaml"
    best.write_text("mine:\n  k: 7\n")
    assert main(["--params", str(params_file), "tune", "--apply", str(best)]) in (0, None)
    assert f"{params_file}: mine.k = 7" in capsys.readouterr().out
    assert load_params(params_file).mine.k == 7
    assert main(["--params", str(params_file), "tune", "--apply", str(best)]) in (0, None)  # again: nothing to change
    assert f"{params_file}: already holds every value of {best}; left as it was" in capsys.readouterr().out


def test_a_key_left_out_of_params_yaml_gets_the_value_params_yaml_ships():
    """The code's defaults are the shipped params: a params file that leaves a key out (a user's own, or an
    older one) trains as params.yaml says, not on a second set of numbers kept in config.py."""
    shipped, defaults = dict(_leaves(_shipped_params().model_dump())), dict(_leaves(Params().model_dump()))
    differing = {key: (defaults[key], value) for key, value in shipped.items() if key in defaults
                 and not _same(defaults[key], value)}
    assert differing == {}, "config.py default vs params.yaml"


def _shipped_params() -> Params:
    """params.yaml as committed: a user's edits, or `dvc exp run` writing its -S values back, are not what ships."""
    import subprocess

    shown = subprocess.run(["git", "show", "HEAD:params.yaml"], capture_output=True, text=True)
    if shown.returncode != 0:  # not a git checkout (an unpacked sdist): the file is what ships
        return load_params("params.yaml")
    return Params.model_validate(read_yaml(shown.stdout))


def _same(default, shipped) -> bool:
    if isinstance(default, float) and isinstance(shipped, float):
        return math.isclose(default, shipped, rel_tol=1e-3)  # 1/3 in code is 0.3333 in YAML
    return default == shipped


def _leaves(tree: dict, prefix: str = "") -> list[tuple[str, object]]:
    """Dotted keys of the scalar settings; the collections (ablation grids, the search space) have no defaults."""
    leaves = []
    for key, value in tree.items():
        if isinstance(value, dict):
            leaves += _leaves(value, f"{prefix}{key}.")
        elif not isinstance(value, list):
            leaves.append((f"{prefix}{key}", value))
    return leaves


def test_an_invalid_override_names_itself_and_each_problem_without_pydantics_input_dump():
    with pytest.raises(ConfigError) as raised:
        load_params("params.yaml", {"retrain": {"mode": "refresh"}, "mine": {"k": 0}})
    message = str(raised.value)
    assert message.startswith("params.yaml with {'retrain.mode': 'refresh', 'mine.k': 0} set on top: invalid parameters:")
    assert "- mine.k: Input should be greater than or equal to 1 (got 0)" in message
    assert "input_value" not in message


@pytest.mark.parametrize("override, problem", [
    ({"stage_one": {"temperature": math.inf}}, "stage_one.temperature: Input should be a finite number"),
    ({"stage_one": {"logit_adjustment": math.nan}}, "stage_one.logit_adjustment: Input should be a finite number"),
    ({"stage_two": {"learning_rate": math.inf}}, "stage_two.learning_rate: Input should be a finite number"),
    ({"stage_one": {"head_learning_rate": 0.0}}, "stage_one.head_learning_rate: Input should be greater than 0"),
    ({"stage_two": {"head_learning_rate": "fast"}}, "stage_two.head_learning_rate: Input should be a valid number"),
    ({"stage_two": {"head_learning_rate": math.inf}}, "stage_two.head_learning_rate: Input should be a finite number"),
    ({"ablate": {"seeds": [0, 0, 1]}}, r"seeds \[0\] are listed more than once"),
    ({"distributed": {"nproc_per_node": 4}, "stage_two": {"batch_size": 6}},
     r"each process needs at least two rows: raise stage_two.batch_size \(6\) to at least 8"),
    ({"distributed": {"nproc_per_node": 4}, "warmup": {"enabled": True, "batch_size": 6}},
     r"each process needs at least two rows: raise warmup.batch_size \(6\) to at least 8"),
    # pydantic's lax mode read `true` as 1 epoch and 2.5 as a cut-off count; `-S stage_one.epochs=true` is a slip
    ({"stage_one": {"epochs": True}}, "stage_one.epochs: Input should be a valid integer"),
    ({"mine": {"k": 2.5}}, "mine.k: Input should be a valid integer"),
    ({"stage_one": {"temperature": True}}, "stage_one.temperature: Input should be a valid number"),
    ({"augment": {"deferred": 1}}, "augment.deferred: Input should be a valid boolean"),
    # the bounds themselves: half of train as validation, a seed NumPy refuses, a confidence no better than a coin,
    # a timeout past what a timedelta holds
    ({"data": {"validation_fraction": 0.5}}, r"data.validation_fraction: Input should be less than 0.5 \(got 0.5\)"),
    ({"tune": {"seed": 2**32}}, "tune.seed: Input should be less than or equal to 4294967295"),
    ({"ablate": {"seeds": [2**32]}}, "ablate.seeds.0: Input should be less than or equal to 4294967295"),
    ({"promote": {"confidence": 0.5}}, r"promote.confidence: Input should be greater than 0.5 \(got 0.5\)"),
    ({"distributed": {"timeout_minutes": 1e10}}, "distributed.timeout_minutes: Input should be less than or equal to 1000000000"),
    ({"data": {"dataset": "custom", "custom": {"train": "train.csv"}}},
     "data.dataset is 'custom' but data.custom.train and data.custom.test are not both set"),
])
def test_values_that_would_train_nonsense_are_refused_with_their_reason(override, problem):
    with pytest.raises(ConfigError, match=problem):
        Params().with_overrides(override)


def test_a_training_section_that_is_off_batches_nothing_so_its_batch_size_is_not_held_to_the_process_count():
    """Off, the warm-up and NC each write their marker in one process: a small batch_size of theirs is no problem."""
    off = {"distributed": {"nproc_per_node": 4}, "warmup": {"enabled": False, "batch_size": 4},
           "baseline_nc": {"enabled": False, "batch_size": 4}}
    assert Params().with_overrides(off).trained_sections() == ("stage_one", "stage_two")
    with pytest.raises(ConfigError, match=r"raise baseline_nc.batch_size \(4\) to at least 8"):
        Params().with_overrides({**off, "baseline_nc": {"enabled": True, "batch_size": 4}})


def test_a_batch_of_exactly_two_rows_per_process_is_enough():
    """Two rows a process is the least that gives each one an in-batch negative: the bound itself is accepted."""
    sections = {name: {"batch_size": 8} for name in ("stage_one", "stage_two", "baseline_nc")}
    assert Params().with_overrides({"distributed": {"nproc_per_node": 4}, **sections}).stage_two.batch_size == 8


def test_params_and_their_sections_cannot_be_changed_in_place():
    """Every change goes through with_overrides, which validates it: a section changed in place (a trial's
    `params.mine.k = 0`) would skip each bound and check, and change the params every other holder of them reads."""
    from pydantic import ValidationError

    params = Params()
    with pytest.raises(ValidationError, match="Instance is frozen"):
        params.mine.k = 0
    with pytest.raises(ValidationError, match="Instance is frozen"):
        params.seed = 1
    assert params.with_overrides({"mine": {"k": 3}}).mine.k == 3 and params.mine.k == 5


def test_the_tuner_can_search_a_head_learning_rate_whose_base_value_is_null():
    """Its base value null (the stage's learning_rate), a range draws floats, and the baseline trial keeps null."""
    import optuna

    from tqc.tuning.space import check_space, default_values, flat_base, sample_overrides

    space = {"model.similarity": {"choices": ["cosine", "mlp"]},
             "stage_one.head_learning_rate": {"low": 1e-4, "high": 1e-2, "log": True, "when": {"model.similarity": "mlp"}},
             "stage_two.head_learning_rate": {"low": 1e-4, "high": 1e-2, "log": True}}
    params = Params.model_validate({"tune": {"space": space}})
    check_space(params)
    base = flat_base(params)
    drawn = sample_overrides(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask(), params.tune.space, base)
    assert isinstance(drawn["stage_two.head_learning_rate"], float) and 1e-4 <= drawn["stage_two.head_learning_rate"] <= 1e-2
    assert default_values(params.tune.space, base)["stage_two.head_learning_rate"] is None
    assert params.with_overrides({"stage_one": {"head_learning_rate": 3e-3}}).stage_one.head_learning_rate == 3e-3


def test_the_tuner_refuses_a_dimension_no_trial_could_use_before_any_work():
    from tqc.tuning.space import check_space

    def space(dimension: dict) -> Params:
        return Params.model_validate({"tune": {"space": dimension}})

    refused = {
        "prior.target": ({"prior.target": {"choices": ["labeled", "uniform"]}}, "does not change what a trial is judged by"),
        "baseline_nc": ({"baseline_nc.learning_rate": {"low": 1e-5, "high": 1e-3}}, "does not change what a trial"),
        "encoding chunk": ({"mine.batch_size": {"low": 32, "high": 512}}, "does not change what a trial"),
        "bounds": ({"mine.k": {"low": -3, "high": 0}}, r"mine.k = -3 is not a value the params accept"),
        # searched epochs under the default median pruner (tqc.tuning.space.check_space), before their bounds are read
        "epochs": ({"stage_one.epochs": {"low": -3, "high": 0}}, r"stage_one.epochs searched under tune.pruner median"),
        "choice": ({"stage_one.loss": {"choices": ["nt_xent", "typo_loss"]}}, "stage_one.loss = 'typo_loss' is not a value"),
        "empty": ({"stage_one.loss": {"choices": []}}, "choices is empty"),
        "when": ({"stage_two.margin": {"low": 0.1, "high": 0.5, "when": {"stage_two.loss": "hinj"}}},
                 r"tune.space.stage_two.margin.when: stage_two.loss = 'hinj' is not a value"),
    }
    for name, (dimension, problem) in refused.items():
        with pytest.raises(ConfigError, match=problem):
            check_space(space(dimension))
    with pytest.raises(ConfigError, match=r"stage_two.loss is 'nt_xent' in every trial \(it is not searched\), never 'hinge'"):
        check_space(space({"stage_two.margin": {"low": 0.1, "high": 0.5, "when": {"stage_two.loss": "hinge"}}}))
    check_space(Params.model_validate({"stage_two": {"loss": "hinge"},
                                       "tune": {"space": {"stage_two.margin": {"low": 0.1, "high": 0.5,
                                                                               "when": {"stage_two.loss": "hinge"}}}}}))


@pytest.mark.parametrize("alias", ["latest", "Latest", "v1", "V12"])
def test_an_alias_the_mlflow_registry_reserves_is_refused_by_name(alias):
    # `latest` read as the newest version made every challenger its own champion; `v1` failed at the alias write,
    # after promotion.json had said promoted
    with pytest.raises(ConfigError, match="promote.alias.*reserved by MLflow"):
        Params().with_overrides({"promote": {"alias": alias}})
    assert Params().with_overrides({"promote": {"alias": "v1-candidate"}}).promote.alias == "v1-candidate"


@pytest.mark.parametrize("name", ["team/tqc", "tqc:v2"])
def test_a_model_name_the_mlflow_registry_refuses_is_refused_before_training(name):
    # MLflow checks a name only when the model is first registered: in promote, after every training stage
    with pytest.raises(ConfigError, match="promote.model_name.*'/' or ':'"):
        Params().with_overrides({"promote": {"model_name": name}})
    assert Params().with_overrides({"promote": {"model_name": "team-tqc@eu"}}).promote.model_name == "team-tqc@eu"


@pytest.mark.parametrize("name", ["", " ", ".", "..", "..v2", "tqc//v2", "tqc/."])
def test_a_blank_model_name_or_one_that_reads_as_a_path_is_refused_before_training(name):
    # a reviewer's run: '..' and ' ' loaded, and promote failed in MLflow's registration after every training stage
    with pytest.raises(ConfigError, match="promote.model_name"):
        Params().with_overrides({"promote": {"model_name": name}})
    assert Params().with_overrides({"promote": {"model_name": "v2..final"}}).promote.model_name == "v2..final"


def test_mlflow_refuses_the_model_names_the_config_refuses(tmp_path):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    for name in ("team/tqc", "tqc:v2"):
        with pytest.raises(MlflowException, match="Names cannot contain"):
            client.create_registered_model(name)
    for name in (" ", ".", "..", "..v2"):
        with pytest.raises(MlflowException):
            client.create_registered_model(name)
        with pytest.raises(ConfigError, match="promote.model_name"):
            Params().with_overrides({"promote": {"model_name": name}})
    client.create_registered_model("v2..final")
    client.create_registered_model("team-tqc@eu")  # '@' is taken, and models:/team-tqc@eu@champion parses


@pytest.mark.parametrize("items", [["data.custom=null", "data.custom.train=x"], ["data.custom.train=x", "data.custom=null"],
                                   ["seed=1", "seed.value=2"]])
def test_set_paths_that_set_a_value_inside_each_other_are_one_line_errors(items, tmp_path, capsys):
    from tqc import cli

    (tmp_path / "params.yaml").write_text("seed: 0\n")
    arguments = [item for pair in (("--set", i) for i in items) for item in pair]
    assert cli.main(["--params", str(tmp_path / "params.yaml"), *arguments, "ingest", "--out", str(tmp_path / "o"),
                     "--quarantine", str(tmp_path / "q.jsonl"), "--report", str(tmp_path / "r.json")]) == 2  # was a TypeError
    error = capsys.readouterr().err
    assert error.startswith("tqc ingest: error:") and "one sets a value inside the other" in error


def test_a_mapping_given_with_set_replaces_the_one_there():
    # merged key by key, tune.space={} changed nothing, a dimension given whole kept the shipped one's `when`,
    # and a range could not become choices
    from pathlib import Path

    from tqc.arguments import parse_overrides

    shipped_yaml = Path(__file__).resolve().parents[2] / "params.yaml"
    shipped = load_params(shipped_yaml)
    assert shipped.tune.space and shipped.tune.space["stage_two.margin"].when  # what the overrides below replace
    assert load_params(shipped_yaml, parse_overrides(["tune.space={}"])).tune.space == {}
    margin = load_params(shipped_yaml, parse_overrides(["tune.space.stage_two.margin={low: 0.1, high: 0.3}"]))
    assert not margin.tune.space["stage_two.margin"].when and margin.tune.space["stage_two.margin"].high == 0.3
    assert len(margin.tune.space) == len(shipped.tune.space)  # the other dimensions stay
    k = load_params(shipped_yaml, parse_overrides(["tune.space.mine.k={choices: [3, 5]}"])).tune.space["mine.k"]
    assert k.choices == [3, 5] and k.low is None
    scalar = load_params(shipped_yaml, parse_overrides(["stage_one.epochs=7"]))  # a scalar in a section: merged
    assert scalar.stage_one.epochs == 7 and scalar.stage_one.batch_size == shipped.stage_one.batch_size


@pytest.mark.parametrize("content, message", [
    (None, "cannot read the parameters file: Is a directory"),
    (b"seed: 1\ndata:\n  dataset: trec\xe96\n", "line 3: not UTF-8 text \\(byte 0xe9\\)"),
    (b"- seed\n- data\n", "the parameters file must be a mapping of sections .* not a list"),
    (b"seed: [1\n", "not valid YAML"),
    (b"", "the parameters file is empty: it sets no section"),  # was every default: a truncated params.yaml ran
    (b"# seed: 3\n", "the parameters file is empty"),
])
def test_a_params_file_that_cannot_be_params_is_one_line_naming_it(tmp_path, content, message):
    import re

    from tqc.config import ConfigError

    path = tmp_path / "params.yaml"
    path.mkdir() if content is None else path.write_bytes(content)
    for overrides in (None, {"seed": 2}):  # with --set on top too: that used to fail inside the merge instead
        with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: {message}"):
            load_params(path, overrides)
    with pytest.raises(ConfigError, match="parameters file not found"):
        load_params(tmp_path / "nothing.yaml")


def test_a_section_spelt_as_its_python_field_is_refused_as_the_set_option_refuses_it(tmp_path):
    """`validate_:` (the Params field) was read as `validate:` (populate_by_name), so the stage took its settings while
    DVC's `params: [validate]` found no such section; `--set validate_.…` was already refused."""
    from tqc.config import ConfigError

    path = tmp_path / "params.yaml"
    path.write_text("validate_:\n  max_text_chars: 3\n")
    with pytest.raises(ConfigError, match=r"invalid parameters:\n- validate_: Extra inputs are not permitted; did you "
                                          r"mean validate\?$"):
        load_params(path)
    path.write_text("validate:\n  max_text_chars: 3\n")
    assert load_params(path).validate_.max_text_chars == 3


def test_a_password_in_a_database_url_is_redacted_in_what_is_logged():
    from tqc.config import redact_secrets, redact_text

    assert redact_text("postgresql+psycopg://tuner:s%40cret@db:5432/optuna") == "postgresql+psycopg://tuner:***@db:5432/optuna"
    assert redact_text("postgresql:///optuna?user=tuner&Password=s3cret&sslmode=require") == \
        "postgresql:///optuna?user=tuner&Password=***&sslmode=require"  # libpq's keyword form
    for unchanged in ("sqlite:///optuna.db", "http://mlflow:5000", "postgresql://tuner@db/optuna", "not a url", "http://h:x/"):
        assert redact_text(unchanged) == unchanged
    assert redact_text("postgresql://u:p@ss@db/optuna") == "postgresql://u:***@db/optuna"  # an @ in the password
    # a slash in the password (SQLAlchemy reads pa/ss as one), and a scheme with one slash (a typo): printed whole
    assert redact_text("tracking.uri postgresql://u:pa/s3cret@127.0.0.1:1/db: no connection") == \
        "tracking.uri postgresql://u:***@127.0.0.1:1/db: no connection"
    assert redact_text("tune.storage 'postgresql:/u:s3cret@h/db': not a database URL") == \
        "tune.storage 'postgresql:/u:***@h/db': not a database URL"
    assert redact_secrets({"tune": {"storage": "postgresql:/u:s3cret@h/db"}}) == {"tune": {"storage": "postgresql:/u:***@h/db"}}
    dumped = {"tracking": {"uri": "mysql://u:p@h/mlflow"}, "tune": {"storage": "sqlite:///o.db", "trials": 3},
              "weights": [0.0, "https://u:p@h/x"]}
    assert redact_secrets(dumped) == {"tracking": {"uri": "mysql://u:***@h/mlflow"},
                                      "tune": {"storage": "sqlite:///o.db", "trials": 3},
                                      "weights": [0.0, "https://u:***@h/x"]}


def test_tokens_and_other_secrets_are_redacted_as_passwords_are():
    from tqc.config import holds_password, redact_secrets, redact_text

    assert redact_text("https://ghp_s3cret@mlflow.example/") == "https://***@mlflow.example/"  # a bare token
    assert redact_text("postgresql:///db?sslpassword=k3y&user=u") == "postgresql:///db?sslpassword=***&user=u"
    for key in ("passwd", "pwd", "token", "access_token", "client_secret", "api_key", "APIKEY"):
        assert redact_text(f"x://h/db?{key}=s3cret&a=1") == f"x://h/db?{key}=***&a=1", key
    # a string with no scheme in a params dump is redacted too, where before only those with :/ were looked at
    assert redact_secrets({"note": "token=s3cret"}) == {"note": "token=***"}
    assert holds_password("postgresql://u:p@h/db") and holds_password("https://tok@h/")
    for plain in ("sqlite:///optuna.db", "postgresql://tuner@db/optuna", "http://mlflow:5000", "stage_one.temperature=0.05"):
        assert not holds_password(plain), plain


def test_an_invalid_override_beside_a_database_url_does_not_print_its_password(tmp_path, capsys):
    """A typo in one --set value printed every override raw, a tracking.uri's password with them."""
    from tqc import cli

    url = "postgresql://alice:S3cret@db.internal/mlflow"
    with pytest.raises(ConfigError) as refused:
        load_params(Path(__file__).resolve().parents[2] / "params.yaml", {"tracking": {"uri": url}, "mine": {"k": 0}})
    assert "S3cret" not in str(refused.value) and "alice:***@db.internal" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        Params().with_overrides({"tune": {"storage": url}, "mine": {"k": 0}})
    assert "S3cret" not in str(refused.value) and "mine" in str(refused.value)
    with pytest.raises(ConfigError) as refused:  # the refused value itself
        Params().with_overrides({"seed": url})
    assert "S3cret" not in str(refused.value) and "seed: " in str(refused.value) and "alice:***@" in str(refused.value)
    assert cli.main(["--set", f"tracking.uri={url}", "fetch", "--dest", str(tmp_path / "d")]) == 2
    assert cli.main(["--set", f"tracking.uri={url}", "predict", "--model", str(tmp_path), "x"]) == 2
    error = capsys.readouterr().err
    assert "S3cret" not in error and error.count("alice:***@db.internal") == 2


def test_every_stage_run_logs_its_params_with_database_passwords_redacted():
    from tqc.config import Params
    from tqc.tracking import _stage_params

    params = Params.model_validate({"tracking": {"uri": "postgresql://u:s3cret@db/mlflow"}})
    for stage in ("ingest", "evaluate", "prior", "stage_one", "promote"):
        assert "s3cret" not in str(_stage_params(stage, params))
    assert _stage_params("promote", params)["tracking"]["uri"] == "postgresql://u:***@db/mlflow"


def test_set_values_read_as_yaml_1_2_and_text_stays_text():
    """As `dvc exp run -S` reads them: YAML 1.1 made 010 eight, left 1e-4 a string and made yes true; a `#` was a
    comment, and params.yaml's own example prefix `paraphrase: ` became a mapping."""
    from tqc.arguments import parse_overrides

    assert parse_overrides(["seed=010", "stage_one.learning_rate=1e-4", "tracking.experiment=trec6 #2",
                            "augment.seq2seq.paraphrase_prefix=paraphrase: ", "evaluate.exemplar_k=no",
                            "data.validation_file=null", "tracking.uri=sqlite:///a=b.db"]) == {
        "seed": 10, "stage_one": {"learning_rate": 1e-4}, "tracking": {"experiment": "trec6 #2", "uri": "sqlite:///a=b.db"},
        "augment": {"seq2seq": {"paraphrase_prefix": "paraphrase: "}}, "evaluate": {"exemplar_k": "no"},
        "data": {"validation_file": None}}
    assert parse_overrides(["augment.prototype_mixup={enabled: true}"]) == {"augment": {"prototype_mixup": {"enabled": True}}}
    # a quoted # is YAML's: the quotes go, the # stays, in a scalar and in a list
    assert parse_overrides(["tracking.experiment='file #1'", "augment.implicit=[dropout, 'b #c']"]) == {
        "tracking": {"experiment": "file #1"}, "augment": {"implicit": ["dropout", "b #c"]}}


@pytest.mark.parametrize("overrides, reason", [
    ({"seed": -1}, "seed: Input should be greater than or equal to 0"),
    ({"tune": {"seed": -5}}, "tune.seed: Input should be greater than or equal to 0"),
    ({"ablate": {"seeds": [-1, 0]}}, "ablate.seeds.0: Input should be greater than or equal to 0"),
    ({"seed": 2**32 - 1, "evaluate": {"seeds": 2}}, "trains up to seed 4294967296"),
    ({"ablate": {"grids": {"g": {"title": "t", "matrix": {"seed": [7, 8]}}}}}, "'seed' is set per cell from ablate.seeds"),
    ({"ablate": {"grids": {"g": {"title": "t", "matrix": {"data.imbalance_ratio": []}}}}}, "matrix data.imbalance_ratio: no values"),
    ({"ablate": {"grids": {"g": {"title": "t", "variants": {}}}}},
     "ablate.grids.g: no variants (a grid without one has no cell; e.g. variants: {default: {}})"),  # was {{default: …
    ({"ablate": {"grids": {"g": {"title": "t", "matrix": {"data.imbalance_ratio": [50]},  # the matrix's 50 ran, unsaid
                               "variants": {"a": {"data.imbalance_ratio": 5}}}}}},
     "ablate.grids.g.variants.a: sets data.imbalance_ratio, which the grid's matrix sets for every cell"),
])
def test_params_that_would_fail_late_or_do_nothing_are_refused_at_load(tmp_path, overrides, reason):
    """Each of these loaded, then crashed a later stage (a negative seed, in stage one after ingest, validate and
    augment), ran every experiment of a grid to fail, or was silently without effect (EDA with no row to make)."""
    with pytest.raises(ConfigError, match=re.escape(reason)):
        load_params("params.yaml", overrides)


def test_an_ablation_cell_whose_params_no_run_takes_is_named_before_any_runs(tmp_path):
    """Checked against the project's params.yaml, which the experiments read: a `tqc --set` reaches no experiment."""
    import shutil

    from tqc.ablate import check_cells, select_cells

    shutil.copy("params.yaml", tmp_path / "params.yaml")
    # a value no param takes alone is refused at load (above); one the cell's other params refuse, only joined
    params = load_params("params.yaml", {"ablate": {"grids": {"covidq": {"variants": {"tied": {"augment.explicit": "file"}}}}}})
    with pytest.raises(ConfigError, match=r"ablate.grids.covidq, cell tied: .*\n- params: augment.explicit is 'file' but "
                                          r"data.generated.path is not set"):
        check_cells(tmp_path, select_cells(params, ["covidq"], [0], {}), params)
    file_params = load_params("params.yaml")
    check_cells(tmp_path, select_cells(file_params, list(file_params.ablate.grids), [0], {}), file_params)  # own grids
    set_only = load_params("params.yaml", {"augment": {"explicit": "eda"}})  # what `tqc --set` changes for ablate alone
    check_cells(tmp_path, select_cells(set_only, ["ac_vs_admc"], [0], {}), set_only)


def test_fetch_verify_only_fails_on_a_missing_file_and_set_is_refused_where_no_params_are_read(tmp_path, capsys):
    from tqc import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["fetch", "--verify-only", "--dest", str(tmp_path)])
    captured = capsys.readouterr()
    assert exited.value.code == 1 and "MISSING OR CHANGED" in captured.out and "--dest" not in captured.err
    for dest, said in ((tmp_path / "none", "no such folder"), (tmp_path / "afile", "a file")):  # each file listed missing
        (tmp_path / "afile").write_text("")                                                     # and not why
        with pytest.raises(SystemExit) as exited:
            cli.main(["fetch", "--verify-only", "--dest", str(dest)])
        assert exited.value.code == 1 and f"tqc fetch: --dest {dest}: {said}" in capsys.readouterr().err
    assert cli.main(["--set", "evaluate.exemplar_k=5", "predict", "--model", str(tmp_path), "where is it"]) == 2
    assert "`tqc predict` takes no params from --set, so evaluate.exemplar_k=5 would change nothing" in capsys.readouterr().err


def test_set_is_refused_by_tune_apply_but_reaches_a_tune_search(tmp_path, capsys):
    from tqc import cli

    best = tmp_path / "best_params.yaml"
    best.write_text("stage_one:\n  temperature: 0.07\n")
    assert cli.main(["--params", str(tmp_path / "params.yaml"), "--set", "tune.trials=1", "tune", "--apply", str(best)]) == 2
    assert "`tqc tune --apply` reads no params" in capsys.readouterr().err
    parsed = cli.build_parser().parse_args(["--set", "tune.trials=1", "tune", "--trials", "1"])
    assert not parsed.apply and parsed.overrides == ["tune.trials=1"]  # a search reads them: not refused


def test_set_is_read_before_and_after_the_command_in_order(tmp_path, capsys):
    """`tqc ingest --set seed=3` was an unrecognised argument: --set had to come before the command."""
    from tqc import cli

    paths = ["--out", "o", "--quarantine", "q", "--report", "r"]
    assert cli.parse_arguments(["ingest", *paths, "--set", "seed=3"]).overrides == ["seed=3"]
    assert cli.parse_arguments(["--set", "seed=1", "ingest", "--set", "seed=2", *paths, "--set", "data.dataset=trec50"]
                               ).overrides == ["seed=1", "seed=2", "data.dataset=trec50"]  # the last of a key wins
    assert cli.parse_arguments(["ingest", *paths]).overrides == []
    assert cli.main(["predict", "--set", "seed=1", "q"]) == 2  # a command that reads no params still refuses it
    error = capsys.readouterr().err
    assert "`tqc predict` takes no params from --set, so seed=1 would change nothing" in error
    assert "registry is --tracking-uri, else tracking.uri in --params's file" in error  # which it does read


def test_the_help_of_a_command_that_reads_no_params_offers_no_set():
    """`tqc predict --help` and `tqc fetch --help` listed --set as "override a param for this command", which both
    refuse."""
    from tqc import cli

    commands = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    for name in ("predict", "fetch"):
        assert "--set" not in commands[name].format_help(), name
    assert "override a param for this command" in commands["ingest"].format_help()  # a command that reads them


def test_set_on_ablate_is_refused_for_params_no_cell_reads(tmp_path, capsys):
    """Each cell is `dvc exp run` on params.yaml under the cell's values: `--set stage_one.learning_rate=…` reached
    no experiment, and the cells kept their names, so the report read as if trained at it."""
    from tqc import cli

    assert cli.main(["--set", "stage_one.learning_rate=3e-4", "ablate", "--report-only", "--out", str(tmp_path)]) == 2
    assert "stage_one.learning_rate would reach no experiment" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="reach no experiment"):
        cli._refuse_what_no_cell_reads(["ablate.seeds=[0]", "tracking.uri=sqlite:///x.db"])
    cli._refuse_what_no_cell_reads(["ablate.seeds=[0, 1]", "data.data_dir=/data"])  # what ablate itself reads


def test_a_small_float_as_dvc_exp_run_writes_it_is_a_number(tmp_path):
    """`dvc exp run -S stage_two.learning_rate=5e-5` writes `5e-05` (ruamel, YAML 1.2); PyYAML's YAML 1.1 read it as the
    string '5e-05', which the strict params refused: every stage of that experiment failed."""
    from dvc.utils.hydra import apply_overrides

    params_file = tmp_path / "params.yaml"
    params_file.write_text((ROOT / "params.yaml").read_text())
    apply_overrides(params_file, ["stage_two.learning_rate=5e-5", "stage_one.temperature=0.00005"])
    assert "5e-05" in params_file.read_text()
    params = load_params(params_file)
    assert params.stage_two.learning_rate == 5e-5 and params.stage_one.temperature == 5e-5


def test_yaml_problems_are_said_for_a_params_files_author():
    from tqc.config import YAMLError, read_yaml

    with pytest.raises(YAMLError, match='found duplicate key "seed"') as duplicate:
        read_yaml("seed: 0\nseed: 1\n")
    assert "suppress" not in str(duplicate.value)  # ruamel's advice to its own callers
    with pytest.raises(YAMLError, match="unhashable"):
        read_yaml("? [a, [b]]\n: 1\n")  # a TypeError escaped before
    with pytest.raises(ConfigError, match="reads yes/no/on/off as words: write true or false"):
        Params().with_overrides({"augment": {"deferred": "yes"}})


def test_tune_apply_leaves_ruamels_own_float_and_null_writing_alone():
    """add_representer writes to its class: tune's `1.0e-05` and `null` were every ruamel user's in the process after
    a `tune --apply`, DVC's `exp run -S` included."""
    import io

    from ruamel.yaml import YAML

    from tqc.tuning.apply import _layout_keeping_yaml

    tuned = io.StringIO()
    _layout_keeping_yaml().dump({"lr": 5e-5, "cap": None}, tuned)
    plain = io.StringIO()
    YAML().dump({"lr": 5e-5, "cap": None}, plain)
    assert tuned.getvalue() == "lr: 5.0e-05\ncap: null\n" and plain.getvalue() == "lr: 5e-05\ncap:\n"


def test_stage_one_says_a_missing_or_doubled_faiss_before_training(monkeypatch, capsys):
    from tqc import cli, mining

    monkeypatch.setattr(mining, "_installed", lambda name: name in ("faiss-cpu", "faiss-gpu-cu12"))
    assert cli.main(["stage-one", "--data", "data/validated", "--train", "t.jsonl", "--out", "m", "--history", "h.csv"]) == 2
    assert "faiss-cpu and faiss-gpu-cu12 are both installed" in capsys.readouterr().err


def test_tune_checks_faiss_for_every_similarity_its_space_may_pick(monkeypatch, capsys):
    """A study whose params score with the mlp (no index) may still sample cosine trials, which mine with FAISS:
    a doubled FAISS is said before the first trial, not after its training."""
    from tqc import cli, mining

    monkeypatch.setattr(mining, "_installed", lambda name: name in ("faiss-cpu", "faiss-gpu-cu12"))
    assert cli.main(["--set", "model.similarity=mlp", "tune", "--trials", "1"]) == 2
    assert "faiss-cpu and faiss-gpu-cu12 are both installed" in capsys.readouterr().err
    mlp_only = Params.model_validate({"model": {"similarity": "mlp"},
                                      "tune": {"space": {"stage_one.temperature": {"low": 0.05, "high": 0.2}}}})
    assert cli._similarities(mlp_only, "tune") == {"mlp"}
    searched = Params.model_validate({"model": {"similarity": "mlp"},
                                      "tune": {"space": {"model.similarity": {"choices": ["mlp", "cosine", "inner"]}}}})
    assert cli._similarities(searched, "tune") == {"mlp", "cosine", "inner"}
    assert cli._similarities(searched, "stage-one") == {"mlp"}


def test_logit_adjustment_is_refused_with_the_hinge_loss_which_has_no_logits():
    """The offsets are τ·w·log π: hinge never reads τ, so w's effect would hang on an unused knob."""
    with pytest.raises(ValueError, match="logit_adjustment shifts logits .* loss hinge"):
        Params.model_validate({"stage_two": {"loss": "hinge", "logit_adjustment": 1.0}})
    with pytest.raises(ValueError, match="stage_one.loss is hinge: augment.prototype_mixup.prior_weight shifts logits"):
        Params.model_validate({"stage_one": {"loss": "hinge"}, "augment": {"prototype_mixup": {"enabled": True}}})
    Params.model_validate({"stage_one": {"loss": "hinge"}, "augment": {"prototype_mixup": {"enabled": True, "prior_weight": 0.0}}})
    Params.model_validate({"stage_two": {"loss": "bpr", "logit_adjustment": 1.0}})


@pytest.mark.parametrize("section, message", [
    ({"cross_encoding": {"relevant_text": "same", "irrelevant_text": " Same "}}, "are the same text"),
    ({"cross_encoding": {"irrelevant_text": "  "}}, "must each hold words"),
    ({"prototype_mixup": {"synthetic_start": 1.0, "synthetic_end": 0.5}}, "synthetic share rises"),
])
def test_cross_encoding_targets_and_the_mixup_schedule_that_cannot_work_are_refused(section, message):
    with pytest.raises(ValueError, match=message):
        Params.model_validate({"augment": section})
    Params.model_validate({"augment": {"prototype_mixup": {"synthetic_start": 0.7, "synthetic_end": 0.7}}})  # fixed share


def test_a_download_that_fails_or_comes_changed_is_one_line_and_exit_code_2(tmp_path, capsys, monkeypatch):
    import http.client
    import io
    import urllib.error

    from tqc import cli, fetch

    def unreachable(url, timeout):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    class CutShort(io.BytesIO):
        def read(self, *args):
            raise http.client.IncompleteRead(b"half", 100)

    for opener, said in ((unreachable, "Name or service not known"), (lambda url, timeout: io.BytesIO(b"changed"),
                                                                        "not the expected"),
                         (lambda url, timeout: CutShort(), "IncompleteRead")):
        monkeypatch.setattr(fetch.urllib.request, "urlopen", opener)  # the first file fails, as a real one would
        with pytest.raises(SystemExit) as exited:
            cli.main(["fetch", "--dest", str(tmp_path)])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and said in err and fetch.FILES[0].url in err and "Traceback" not in err


@pytest.mark.parametrize("custom, named", [({"text_column": "q", "label_column": "q"}, "text_column and data.custom.label_column"),
                                           ({"catalog_id_column": "text"}, "catalog_id_column and data.custom.catalog_text_column")])
def test_one_column_as_both_text_and_label_is_refused_by_name(custom, named):
    """It read every question as a class of its own, one warning each, then stopped on "validation split is empty"."""
    with pytest.raises(ConfigError, match=f"data.custom.{named} are both"):
        Params().with_overrides({"data": {"custom": custom}})


@pytest.mark.parametrize("study", ["../../escape", "a/b", "..", "", "  "])
def test_a_study_name_that_is_not_a_folder_name_is_refused(study):
    """tune.study names the study's folder under --work: '../../escape' wrote its trials outside it."""
    with pytest.raises(ValidationError, match="is not a name a folder can have"):
        Params.model_validate({"tune": {"study": study}})
    Params.model_validate({"tune": {"study": "tqc-admc.2026-11"}})


def test_loss_settings_the_loss_does_not_read_are_said():
    """stage_one.smoothing 0.3 with NT-Xent trained plain NT-Xent, and SDML at smoothing 0 is NT-Xent exactly: each
    run read as something it was not."""
    from tqc.config import StageOneParams, StageTwoParams

    assert StageOneParams(smoothing=0.3).loss_notes("stage_one") == [
        "stage_one.smoothing is 0.3, and only loss sdml reads it: loss nt_xent trains without it"]
    assert StageTwoParams(loss="sdml").loss_notes("stage_two")[0].startswith(
        "stage_two.loss sdml at stage_two.smoothing 0 is NT-Xent exactly")
    assert StageTwoParams(loss="sdml", smoothing=0.3).loss_notes("stage_two") == []
    assert StageOneParams().loss_notes("stage_one") == []  # the shipped settings


@pytest.mark.parametrize("retrain, problem", [
    ({"archive": "data/incoming"}, "retrain.archive 'data/incoming' is retrain.inbox"),
    ({"archive": "data/incoming/"}, "retrain.archive 'data/incoming/' is retrain.inbox"),
    ({"quarantine": "data/incoming/rejected.jsonl"}, "retrain.quarantine 'data/incoming/rejected.jsonl' is in "
                                                     "retrain.inbox"),
    ({"work_dir": "data"}, "retrain.inbox 'data/incoming' is inside retrain.work_dir 'data', which each run empties"),
    ({"lock": "data/retrain/retrain.lock"}, "retrain.lock 'data/retrain/retrain.lock' is inside retrain.work_dir"),
    ({"work_dir": "data/incoming"}, "retrain.inbox 'data/incoming' is inside retrain.work_dir 'data/incoming'"),  # the same
])
def test_retrain_places_that_would_undo_each_other_are_refused_at_load(retrain, problem):
    """An archive that was the inbox had its manifest picked up as a delivery and archived away: the record of what
    had been merged, which keeps a file from being merged twice, was lost. work_dir is emptied at each run."""
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_params("params.yaml", {"retrain": retrain})
    for harmless in ({"archive": "data/incoming-archive"},  # a name that only begins alike
                     {"archive": "data/incoming/archived"},  # a sub-folder: the inbox's files are read, not its folders
                     {"quarantine": "data/incoming/rejected/incoming.jsonl"}):
        load_params("params.yaml", {"retrain": harmless})


def test_tracking_settings_mlflow_would_refuse_are_refused_naming_the_key(monkeypatch):
    """MLflow's own refusals ("the filesystem tracking backend is in maintenance mode", "Invalid experiment name: ''")
    named neither the key nor its value. A URI is judged where a store is opened, so tracking turned off reads none."""
    from tqc.tracking import _store_that_can_be_made

    with pytest.raises(ConfigError, match=re.escape("tracking.experiment: String should have at least 1 character")):
        load_params("params.yaml", {"tracking": {"experiment": ""}})
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    for uri in ("notaurl", "file:///tmp/mlruns"):
        with pytest.raises(ConfigError, match=re.escape(f"tracking.uri (or $MLFLOW_TRACKING_URI) {uri!r}: a folder, "
                                                        "MLflow's file store")):
            _store_that_can_be_made(uri)
    for uri in ("sqlite:///mlflow.db", "http://mlflow.internal:5000", "postgresql://u@db/mlflow", "databricks"):
        assert _store_that_can_be_made(uri) == uri
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's own way to keep a file store
    assert _store_that_can_be_made("file:///tmp/mlruns") == "file:///tmp/mlruns"
    assert load_params("params.yaml", {"tracking": {"enabled": False, "uri": "mlruns"}}).tracking.uri == "mlruns"


def test_a_when_takes_one_value_or_a_list_of_them_and_nothing_else():
    # the list lets a temperature be drawn with every loss that reads one (hinge reads none)
    from pathlib import Path

    from tqc.arguments import parse_overrides

    shipped_yaml = Path(__file__).resolve().parents[2] / "params.yaml"
    assert load_params(shipped_yaml).tune.space["stage_two.temperature"].when == {
        "stage_two.loss": ["nt_xent", "bpr", "sdml"]}
    listed = load_params(shipped_yaml, parse_overrides(
        ["tune.space.stage_two.temperature={low: 0.05, high: 0.2, when: {stage_two.loss: [nt_xent, sdml]}}"]))
    assert listed.tune.space["stage_two.temperature"].when == {"stage_two.loss": ["nt_xent", "sdml"]}
    for wanted in ("{sdml: 1}", "[[sdml]]", "[sdml, null]"):
        with pytest.raises(ConfigError, match=r"tune.space.*stage_two.temperature.*when"):
            load_params(shipped_yaml, parse_overrides(
                [f"tune.space.stage_two.temperature={{low: 0.05, high: 0.2, when: {{stage_two.loss: {wanted}}}}}"]))


def test_hinge_refuses_a_negative_logit_adjustment_as_a_positive_one():
    """hinge has no temperature for the adjustment to scale: any weight but 0 is refused, not only a positive one."""
    from pydantic import ValidationError

    from tqc.config import TrainParams

    with pytest.raises(ValidationError, match="hinge"):
        TrainParams(loss="hinge", logit_adjustment=-0.5)


def test_an_ablation_budget_may_not_set_the_seed_each_cell_gets_from_ablate_seeds():
    from pydantic import ValidationError

    from tqc.config import Params

    with pytest.raises(ValidationError, match="'seed' is not a parameter a cell may set"):
        Params.model_validate({"ablate": {"budget": {"seed": 3}}})


def test_a_date_given_with_set_stays_text_and_ablate_refuses_data_keys_no_cell_reads():
    """YAML 1.2 as dvc exp run -S reads it: 2024-01-01 is a study's name, not a datetime.date."""
    from tqc import cli
    from tqc.arguments import override_value, parse_overrides
    from tqc.config import ConfigError

    assert override_value("tune.study=2024-01-01", "2024-01-01") == "2024-01-01"
    assert parse_overrides(["tune.study=2024-01-01"]) == {"tune": {"study": "2024-01-01"}}
    with pytest.raises(ConfigError, match="data.dataset would reach no experiment"):
        cli._refuse_what_no_cell_reads(["data.dataset=trec50"])  # ablate takes data.data_dir alone
