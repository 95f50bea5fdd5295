import pytest

from tqc.config import ConfigError, Params, load_params


def test_repository_params_are_valid():
    params = load_params("params.yaml")
    assert params.data.dataset == "trec6" and params.stage_one.temperature > 0


def test_unknown_keys_are_rejected(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("stage_one:\n  temprature: 0.1\n")
    with pytest.raises(ConfigError, match="temprature"):
        load_params(path)


def test_overrides_reach_the_params(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("mine:\n  k: 3\n")
    params = load_params(path, {"mine": {"k": 7}, "stage_two": {"temperature": 0.05}})
    assert params.mine.k == 7 and params.stage_two.temperature == 0.05


def test_custom_dataset_needs_its_files():
    with pytest.raises(ValueError, match="custom"):
        Params.model_validate({"data": {"dataset": "custom"}})
