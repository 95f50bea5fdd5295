"""The warm-up stage (EBSIM's weak triplets) on the tiny random BERT: off, on, its bad input, and stage one after it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_params, write_custom_dataset
from tqc.config import ConfigError, Params
from tqc.model.warm_start import SKIP_RECORD
from tqc.readers import ReaderError
from tqc.schema import load_questions
from tqc.stages import stage_one, warmup


@pytest.fixture
def validated(tiny_model_dir, tmp_path) -> tuple[Params, Path]:
    from tqc.pipeline import validated_data

    write_custom_dataset(tmp_path / "raw")
    params = Params.model_validate(tiny_params(tmp_path / "raw", tiny_model_dir)).with_overrides(
        {"warmup": {"enabled": True, "candidates": 4, "batch_size": 8, "learning_rate": 1e-3}})
    return params, validated_data(params, tmp_path / "work")


def run_warmup(params: Params, data: Path, out: Path):
    return warmup.run(data, params.model, params.warmup, params.data, params.seed, out / "warmup", out / "warmup.json",
                      out / "quarantine.jsonl")


def backbone_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "question_encoder" / "model.safetensors")


def test_off_it_writes_only_its_skip_record_and_stage_one_starts_from_the_pretrained_model(validated, tmp_path):
    params, data = validated
    params = params.with_overrides({"warmup": {"enabled": False}})
    result = run_warmup(params, data, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out" / "warmup").iterdir()] == [SKIP_RECORD]
    assert json.loads((tmp_path / "out" / "warmup.json").read_text())["enabled"] is False
    assert (tmp_path / "out" / "quarantine.jsonl").read_text() == "" and result.history == []
    from tqc.model.warm_start import warmed_model

    assert warmed_model(tmp_path / "out" / "warmup") is None and warmed_model(None) is None
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a warm-up model"):
        warmed_model(tmp_path / "empty")


def test_on_it_trains_the_encoders_and_stage_one_starts_from_its_weights(validated, tmp_path, tiny_model_dir, monkeypatch):
    from safetensors.torch import load_file

    params, data = validated
    test_question = load_questions(data / "test.jsonl")[0].text
    (tmp_path / "raw" / "unlabelled.csv").write_text(
        f"text\nwhere is the old castle\n\n???\n{test_question.upper()}\nwho invented tea\n")
    params = params.with_overrides({"warmup": {"unlabelled": "unlabelled.csv"}})
    result = run_warmup(params, data, tmp_path / "out")

    report = json.loads((tmp_path / "out" / "warmup.json").read_text())
    assert report["triplets"]["token"] == 3 * 6  # 3 standard questions, C(4, 2) pairs of their top 4 each
    assert report["triplets"]["structure"] > 0 and report["epochs"] == 1 == len(result.history) - 1
    assert report["rows_read"] == 4 + len(load_questions(data / "train.jsonl"))  # the blank line is no row
    quarantined = [json.loads(line) for line in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()]
    assert [(q["line"], q["reason"].split(":")[0]) for q in quarantined] == [(4, "has_letter_or_digit"), (5, "no_leakage")]
    assert all(q["file"].endswith("unlabelled.csv") for q in quarantined) and report["quarantined"] == 2

    warmed = backbone_weights(tmp_path / "out" / "warmup")
    pretrained = load_file(tiny_model_dir / "model.safetensors")
    changed = [name for name in warmed if not torch.equal(warmed[name], pretrained[name.removeprefix("bert.")])]
    assert changed, "the warm-up left every weight of the question encoder as it was"

    started_from = {}
    real_train = stage_one.train

    def spying(model, *args, **kwargs):
        started_from.update({k: v.detach().clone() for k, v in model.question.backbone.state_dict().items()})
        return real_train(model, *args, **kwargs)

    monkeypatch.setattr(stage_one, "train", spying)
    stage_one.run(data, data / "train.jsonl", params.model, params.augment, params.stage_one, params.seed,
                  tmp_path / "one", tmp_path / "one.csv", warmup_dir=tmp_path / "out" / "warmup")
    assert all(torch.equal(started_from[name], warmed[name]) for name in warmed)
    assert json.loads((tmp_path / "one" / "tqc_model.json").read_text())["warmed_up_from"] == str(tmp_path / "out" / "warmup")


def test_a_warm_up_of_other_model_settings_is_refused_by_stage_one(validated, tmp_path):
    from tqc.model.warm_start import starting_model

    params, data = validated
    run_warmup(params.with_overrides({"warmup": {"max_steps": 1}}), data, tmp_path / "out")
    other = params.model.model_copy(update={"max_length": 20})
    with pytest.raises(ConfigError, match="the warm-up was trained with model settings .* run `tqc warmup` again"):
        starting_model(other, tmp_path / "out" / "warmup")


def test_a_partly_labelled_file_gives_only_its_unlabelled_rows_with_label_column(tmp_path):
    """COVID-Q's master file is such a file: its rows with no Category are questions no split holds."""
    (tmp_path / "export.csv").write_text("Question,Category\nwhere is tea,\nwho is she,Person\nwhen is noon,  \n")
    (tmp_path / "export.jsonl").write_text('{"q": "where is tea"}\n{"q": "who is she", "c": "Person"}\n'
                                           '{"q": "when is noon", "c": null}\n')
    data = Params().data.model_copy(update={"data_dir": str(tmp_path)})
    for file, text, label, first in (("export.csv", "Question", "Category", 2), ("export.jsonl", "q", "c", 1)):
        params = Params().warmup.model_copy(update={"enabled": True, "unlabelled": file, "text_column": text,
                                                    "label_column": label, "include_train": False})
        rows, labelled = warmup.pool_rows(params, data, [])
        assert [(row.text, row.line) for row in rows] == [("where is tea", first), ("when is noon", first + 2)], file
        assert labelled == 1
        everything, none = warmup.pool_rows(params.model_copy(update={"label_column": None}), data, [])
        assert len(everything) == 3 and none == 0
    params = Params().warmup.model_copy(update={"enabled": True, "unlabelled": "export.csv", "text_column": "Question",
                                                "label_column": "Label", "include_train": False})
    with pytest.raises(ReaderError, match=r"^warmup.unlabelled \(warmup.text_column 'Question', warmup.label_column "
                                          r"'Label'\): .*export.csv"):
        warmup.pool_rows(params, data, [])


def test_the_pool_file_is_read_in_data_custom_encoding_as_the_users_other_files_are(tmp_path):
    """A GBK export of unlabelled questions was read as Windows-1252 mojibake with a warning, though
    data.custom.encoding named gbk for the labeled ones beside it."""
    questions = ["如何预防感染？", "疫苗安全吗？", "症状有哪些？"]
    (tmp_path / "export.csv").write_bytes(("问题,类别\n" + f"{questions[0]},\n{questions[1]},预防\n{questions[2]},\n")
                                          .encode("gbk"))
    (tmp_path / "export.jsonl").write_bytes("".join(json.dumps({"q": q}, ensure_ascii=False) + "\n" for q in questions)
                                            .encode("gbk"))
    data = Params().with_overrides({"data": {"data_dir": str(tmp_path), "custom": {"encoding": "gbk"}}}).data
    for file, text, label, expected in (("export.csv", "问题", "类别", [questions[0], questions[2]]),
                                        ("export.jsonl", "q", None, questions)):
        params = Params().warmup.model_copy(update={"enabled": True, "unlabelled": file, "text_column": text,
                                                    "label_column": label, "include_train": False})
        rows, _ = warmup.pool_rows(params, data, [])
        assert [row.text for row in rows] == expected, file


def test_a_missing_or_unparsable_pool_file_is_one_line_naming_the_setting(validated, tmp_path):
    params, data = validated
    with pytest.raises(ConfigError, match=r"^warmup.unlabelled 'nowhere.csv': no file .*nowhere.csv \(the path is "
                                          r"relative to data.data_dir"):
        run_warmup(params.with_overrides({"warmup": {"unlabelled": "nowhere.csv"}}), data, tmp_path / "out")
    (tmp_path / "raw" / "bad.jsonl").write_text('{"text": "where is tea"}\n{"text": \n')
    with pytest.raises(ReaderError, match=r"^warmup.unlabelled \(warmup.text_column 'text'\): .*bad.jsonl, line 2: not "
                                          "valid JSON"):
        run_warmup(params.with_overrides({"warmup": {"unlabelled": "bad.jsonl"}}), data, tmp_path / "out")
    (tmp_path / "raw" / "other.csv").write_text("question\nwhere is tea\n")
    with pytest.raises(ReaderError, match=r"^warmup.unlabelled \(warmup.text_column 'text'\): "):
        run_warmup(params.with_overrides({"warmup": {"unlabelled": "other.csv"}}), data, tmp_path / "out")
    assert not (tmp_path / "out" / "warmup").exists()


def test_a_model_without_a_mask_token_is_refused_in_one_line(validated, tmp_path, monkeypatch):
    from tqc.model.encoder import BiEncoder

    params, data = validated
    loaded = BiEncoder.from_params

    def without_mask(model_params):
        model = loaded(model_params)
        model.question.tokenizer.mask_token = None
        return model

    monkeypatch.setattr(BiEncoder, "from_params", without_mask)
    with pytest.raises(ConfigError, match="has no mask token"):
        run_warmup(params, data, tmp_path / "out")


def test_params_refuse_a_warm_up_with_no_questions():
    with pytest.raises(ValueError, match="the warm-up has no questions"):
        Params.model_validate({"warmup": {"enabled": True, "include_train": False}})


def test_the_chain_warms_up_first_and_hands_stage_one_its_folder_in_process_and_to_a_launched_stage_one(
        validated, tmp_path, monkeypatch):
    """pipeline.train_chain (the tuner, evaluate's extra seeds, the flows) runs the warm-up in its work folder when
    warmup.enabled, and stage one starts from it: in this process, and as `--warmup` to a torchrun-launched stage-one.
    With processes > 1 the warm-up is launched too, as `tqc warmup` (it trained in the chain's one process)."""
    from tqc import pipeline
    from tqc.cli import parse_arguments
    from tqc.pipeline import train_chain

    params, data = validated
    params = params.with_overrides({"warmup": {"max_steps": 1}, "stage_two": {"max_steps": 1}, "tracking": {"enabled": False}})
    outputs = train_chain(params, data, data / "train.jsonl", tmp_path / "chain", seed=0, with_nc=False)
    saved = json.loads((outputs.stage_one / "tqc_model.json").read_text())
    assert saved["warmed_up_from"] == str(tmp_path / "chain" / "warmup")
    assert (tmp_path / "chain" / "reports" / "warmup.json").is_file()

    launched = []

    def launcher_for(chain_params, seed, work_dir, processes):
        def launcher(command, paths, on_epoch):
            launched.append((command.name, command.arguments(paths)))  # the command line _Launcher would give torchrun
            return command.run(paths, chain_params, seed, on_epoch)
        return launcher

    monkeypatch.setattr(pipeline, "_launcher", launcher_for)
    train_chain(params, data, data / "train.jsonl", tmp_path / "launched", seed=0, with_nc=False, processes=2)
    assert [command for command, _ in launched] == ["warmup", "stage-one", "stage-two"]
    assert parse_arguments(["warmup", *dict(launched)["warmup"]]).out == tmp_path / "launched" / "warmup"  # tqc warmup's own
    stage_one = parse_arguments(["stage-one", *dict(launched)["stage-one"]])
    assert stage_one.warmup == tmp_path / "launched" / "warmup"  # as _Launcher passes it
    off = params.with_overrides({"warmup": {"enabled": False}})
    launched.clear()
    train_chain(off, data, data / "train.jsonl", tmp_path / "off", seed=0, with_nc=False, processes=2)
    assert "warmup" not in dict(launched) and "--warmup" not in dict(launched)["stage-one"]
    assert not (tmp_path / "off" / "warmup").exists()


def test_an_extra_evaluate_seed_on_its_own_split_warms_up_too(validated):
    """evaluate.seeds > 1 with resplit: the seed's data folder had no test.jsonl, which the warm-up reads to keep test
    questions out of its pool, and evaluate failed after the main chain was trained and scored (two reviewers' runs)."""
    from tqc.schema import Catalog
    from tqc.stages.evaluate import _extra_seed

    params, data = validated
    params = params.with_overrides({"warmup": {"max_steps": 1}, "evaluate": {"seeds": 2, "resplit": True},
                                    "stage_one": {"max_steps": 1}, "stage_two": {"max_steps": 1},
                                    "baseline_nc": {"enabled": False}})
    splits = {"test": load_questions(data / "test.jsonl"), "validation": load_questions(data / "validation.jsonl")}
    metrics = _extra_seed(params, data, splits, Catalog.load(data / "catalog.jsonl"), 1)
    assert 0.0 <= metrics["admc"]["test"]["accuracy"] <= 1.0


def test_a_launched_chains_params_file_carries_the_warm_up_and_the_data_folder_its_pool_file_is_under(validated, tmp_path,
                                                                                                      monkeypatch):
    """The launched `tqc warmup` reads the chain's params from the file the chain writes: without the warmup section it
    would read warmup.enabled false, write its skip record, and stage one would start from model.pretrained unsaid;
    warmup.unlabelled is relative to data.data_dir."""
    from tqc.config import load_params
    from tqc.pipeline import _launcher

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    params, _ = validated
    params = params.with_overrides({"warmup": {"unlabelled": "unlabelled.csv", "margin": 0.5},
                                    "tracking": {"enabled": False}})
    launcher = _launcher(params, 7, tmp_path / "chain", processes=2)
    launched = load_params(launcher.params_file)
    assert launched.warmup == params.warmup and launched.data.data_dir == params.data.data_dir


def test_tqc_warmup_off_writes_its_record_and_a_bad_pool_file_is_one_line(validated, tmp_path, capsys):
    import yaml

    from tqc.cli import main

    params, data = validated
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params.with_overrides({"tracking": {"enabled": False}}).to_dict()))
    paths = ["--data", str(data), "--out", str(tmp_path / "models" / "warmup"), "--report", str(tmp_path / "warmup.json"),
             "--quarantine", str(tmp_path / "quarantine.jsonl")]
    assert main(["--params", str(params_file), "--set", "warmup.enabled=false", "warmup", *paths]) == 0
    assert [p.name for p in (tmp_path / "models" / "warmup").iterdir()] == [SKIP_RECORD]
    assert main(["--params", str(params_file), "--set", "warmup.unlabelled=missing.jsonl", "warmup", *paths]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("tqc warmup: error: warmup.unlabelled 'missing.jsonl': no file ")


PINNED_WARMUP = Path(__file__).parents[1] / "code" / "pinned" / "warmup"  # each case's outputs as the code wrote them


def _warmup_outputs(params: Params, data: Path, tmp_path: Path, tiny_model_dir: Path, monkeypatch, caplog,
                    triplets: list) -> dict[str, str]:
    """warmup.run's outputs as text, its paths put as TMP and TINY, its report's seconds as 0: the report, the
    quarantine, the model folder's files and config, the log lines, and what it asked of `weak_triplets` and `train`
    (both stood in for, so that nothing here hangs on a model's floats)."""
    import logging
    import re

    from tqc.training import EpochRecord, FitResult

    asked = []

    def ranked(model, catalog, pool, warmup_params, mask_token):
        asked.append(f"weak_triplets: {len(catalog)} standard questions, mask {mask_token!r}, pool {pool}\n")
        return list(triplets)

    def trained(model, triplets, validation, catalog, warmup_params, seed, on_epoch):
        asked.append(f"train: {triplets}, {len(validation)} validation questions, {len(catalog)} standard questions, "
                     f"params as given {warmup_params == params.warmup}, seed {seed}, on_epoch {on_epoch}\n")
        return FitResult.of([EpochRecord(0, float("nan"), 0.25, 0.2, 0.0), EpochRecord(1, 0.5, 0.5, 0.4, 1.5)])

    monkeypatch.setattr(warmup, "weak_triplets", ranked)
    monkeypatch.setattr(warmup, "train", trained)
    caplog.clear()
    out = tmp_path / "out"
    with caplog.at_level(logging.DEBUG, logger="tqc.stages.warmup"):
        result = warmup.run(data, params.model, params.warmup, params.data, params.seed, out / "warmup",
                            out / "warmup.json", out / "quarantine.jsonl", on_epoch="ON_EPOCH")
    texts = {"result.txt": f"{result}\n", "asked.txt": "".join(asked),
             "log.txt": "".join(f"{r.name} {r.levelname} {r.getMessage()}\n" for r in caplog.records
                                if r.name == "tqc.stages.warmup"),
             "files.txt": "".join(f"{p.relative_to(out)}\n" for p in sorted(out.rglob("*")))}
    for name in ("warmup.json", "quarantine.jsonl", "warmup/tqc_model.json", f"warmup/{SKIP_RECORD}"):
        if (out / name).is_file():
            texts[name.replace("/", "_")] = (out / name).read_text(encoding="utf-8")
    texts["warmup.json"] = re.sub(r'\n  "seconds": [0-9.e-]+,\n', '\n  "seconds": 0,\n', texts["warmup.json"])
    return {name: text.replace(str(tiny_model_dir), "TINY").replace(str(tmp_path), "TMP") for name, text in texts.items()}


def _pinned_warmup_case(case: str, validated, tmp_path, tiny_model_dir, monkeypatch, caplog) -> dict[str, str]:
    from tqc.warmup_triplets import Triplet

    params, data = validated
    if case == "off":
        return _warmup_outputs(params.with_overrides({"warmup": {"enabled": False}}), data, tmp_path, tiny_model_dir,
                               monkeypatch, caplog, [])
    test_question = load_questions(data / "test.jsonl")[0].text
    (tmp_path / "raw" / "unlabelled.csv").write_text(  # a duplicate, no letter, a test question, a labelled row
        f"text,label\nwhere is the old castle,\n\n???,\n{test_question.upper()},\nWhere is the  old castle,\n"
        "who invented tea,\nwhen is noon,HUM\n")
    params = params.with_overrides({"warmup": {"unlabelled": "unlabelled.csv", "label_column": "label", "margin": 0.3}})
    triplets = [Triplet(0, "where is the old castle", "who invented tea", "token"),
                Triplet(2, "who invented tea", "where is the [MASK] castle", "structure"),
                Triplet(1, "who invented tea", "where is the old castle", "token")]
    return _warmup_outputs(params, data, tmp_path, tiny_model_dir, monkeypatch, caplog, triplets)


@pytest.mark.parametrize("case", ["on", "off"])
def test_the_warm_up_stage_is_pinned_file_for_file(case, validated, tmp_path, tiny_model_dir, monkeypatch, caplog):
    """Every output of warmup.run, whole (report in its key order, quarantine, model config, log lines, what it
    returns and what it hands its training): a refactoring that changes a byte of them fails."""
    outputs = _pinned_warmup_case(case, validated, tmp_path, tiny_model_dir, monkeypatch, caplog)
    assert sorted(outputs) == sorted(p.name for p in (PINNED_WARMUP / case).iterdir())
    for name, text in outputs.items():
        assert text == (PINNED_WARMUP / case / name).read_text(encoding="utf-8"), f"{case}/{name}"


def test_a_warm_up_with_no_triplets_is_refused_after_its_quarantine_is_written(validated, tmp_path, tiny_model_dir,
                                                                                 monkeypatch, caplog):
    params, data = validated
    with pytest.raises(ConfigError) as refused:
        _warmup_outputs(params, data, tmp_path, tiny_model_dir, monkeypatch, caplog, [])
    pool = len({q.text for q in load_questions(data / "train.jsonl")})
    assert str(refused.value) == (
        f"warmup: no triplets: {pool} pool question(s) make no pair for any standard question (warmup.candidates needs "
        "at least two); add unlabelled questions or set warmup.enabled: false")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["quarantine.jsonl"]
    assert [r.getMessage() for r in caplog.records if r.name == "tqc.stages.warmup"] == [
        f"warm-up: {pool} pool questions ({pool} rows read, 0 duplicates merged, 0 quarantined) → 0 token-level and 0 "
        "structure-level triplets against 3 standard questions"]


def test_a_held_out_question_is_kept_out_of_the_pool_as_validate_compares_texts():
    from tqc.schema import LabeledQuestion
    from tqc.stages.warmup import PoolRow, held_out_texts, question_pool

    held_out = held_out_texts({"validation": [LabeledQuestion("  Is it  safe?  ", "c1")], "test": []})
    pool = question_pool([PoolRow("Is it safe?", "pool.csv", 1)], held_out)
    assert pool.texts == [] and len(pool.quarantined) == 1
    assert pool.quarantined[0]["reason"].startswith("no_leakage")


def test_the_warmup_loss_compares_the_closer_with_the_farther_sentence(monkeypatch):
    import torch
    from tqc.stages import warmup
    from tqc.config import WarmupParams
    from tqc.warmup_triplets import Triplet

    vectors = {"close": [1.0, 0.0], "far": [0.0, 1.0]}

    class Fake:
        def embed_standards(self, texts):
            return torch.tensor([[1.0, 0.0] for _ in texts])

        def embed_questions(self, texts):
            return torch.tensor([vectors[t] for t in texts])

        def score(self, questions, standards):
            return questions @ standards.T

    seen = {}
    monkeypatch.setattr(warmup, "parameter_groups", lambda model, lr: [])
    monkeypatch.setattr(warmup, "bi_encoder_validator", lambda *a: None)
    monkeypatch.setattr(warmup, "fit", lambda model, groups, batch_loss, n, *a, **k: batch_loss(list(range(n))))
    monkeypatch.setattr(warmup, "triplet_margin",
                        lambda closer, farther, margin: seen.update(closer=closer, farther=farther) or closer.sum())
    catalog = type("C", (), {"texts": ["title"]})()
    warmup.train(Fake(), [Triplet(0, "close", "far", "token")], [], catalog, WarmupParams(), seed=0)
    assert seen["closer"].tolist() == [1.0] and seen["farther"].tolist() == [0.0]
