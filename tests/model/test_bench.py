"""`tqc bench epochs`: seconds per epoch of both stages at one batch size, warm-up steps untimed."""

from __future__ import annotations

import statistics

import pytest

from tests.conftest import CLASSES, synthetic_questions, tiny_params
from tqc import bench
from tqc.config import Params
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, load_questions, save_questions
from tqc.stages import stage_one, stage_two
from tqc.training import steps_per_epoch


def printed(report: dict, decimals: int) -> list[str]:
    """The lines a benchmark prints of its figures: one a key, in the report's order, floats to `decimals` places (a
    list of floats too), the rounds' own figures (`rounds_*`, written to the report only) left out."""
    def shown(value):
        if isinstance(value, list):
            return "[" + ", ".join(f"{item:.{decimals}f}" for item in value) + "]"
        return f"{value:.{decimals}f}" if isinstance(value, float) else value

    return [f"{key}: {shown(value)}" for key, value in report.items() if not key.startswith("rounds_")]


def assert_rounds_behind_the_figures(report: dict, unit: str, ratios: dict[str, tuple[str, str]]) -> None:
    """Each setting's figure is the median of its rounds, and each ratio's range the least and most of the ratio
    round by round: what shows whether a ratio near a bar is on one side of it in every round."""
    rounds = report[f"rounds_{unit}"]
    for name, values in rounds.items():
        assert report[f"{name}_{unit}"] == pytest.approx(statistics.median(values)) and len(values) == report["rounds"]
    for ratio, (over, under) in ratios.items():
        in_rounds = [o / u for o, u in zip(rounds[over], rounds[under])]
        assert report[f"{ratio}_range"] == pytest.approx([min(in_rounds), max(in_rounds)]), ratio


def test_both_stages_are_timed_after_untimed_warm_up_steps(tiny_model_dir, tmp_path, monkeypatch, capsys):
    data = tmp_path / "validated"
    Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()]).save(data / "catalog.jsonl")
    rows = [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 20)]  # 60 rows
    save_questions(data / "train.jsonl", rows)
    save_questions(data / "validation.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(1, 3)])
    params = Params.model_validate(tiny_params(tmp_path / "unused", tiny_model_dir))
    calls = []
    for name, module in (("stage one", stage_one), ("stage two", stage_two)):
        real = module.train

        def recording(*args, _real=real, _name=name, **kwargs):
            calls.append((_name, args[-2].max_steps))  # the schedule each call trains with
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, "train", recording)

    report = bench.epochs(params, steps=4, batch_size=8, data_dir=data, train_path=data / "train.jsonl", rounds=3)
    # warm-up first, then rounds in which each stage goes first in every other one: a slow spell charged to neither
    assert calls == [("stage one", 3), ("stage two", 3), ("stage one", 4), ("stage two", 4), ("stage two", 4),
                     ("stage one", 4), ("stage one", 4), ("stage two", 4)]
    assert report["rows"] == 60 and report["timed_steps"] == 4 and report["k"] == 2 and report["rounds"] == 3
    assert report["stage_one_seconds_per_epoch"] > 0 and report["stage_two_seconds_per_epoch"] > 0
    assert report["stage_two_over_stage_one"] == pytest.approx(
        report["stage_two_seconds_per_epoch"] / report["stage_one_seconds_per_epoch"])
    assert list(report) == ["rows", "batch_size", "timed_steps", "rounds", "k", "stage_one_seconds_per_epoch",
                            "stage_two_seconds_per_epoch", "stage_two_over_stage_one", "stage_two_over_stage_one_range",
                            "rounds_seconds_per_epoch"]
    assert_rounds_behind_the_figures(report, "seconds_per_epoch",
                                     {"stage_two_over_stage_one": ("stage_two", "stage_one")})
    assert capsys.readouterr().out.splitlines()[-len(report) + 1:] == printed(report, 3)


def test_the_validate_benchmark_reads_the_params_it_is_given_with_their_overrides(tmp_path):
    from tqc.config import load_params
    from tqc.readers import ReaderError

    elsewhere = load_params("params.yaml", {"data": {"data_dir": str(tmp_path / "nowhere")}})  # as --set gives them
    with pytest.raises(ReaderError, match="nowhere/trec/train_5500.label: file not found"):  # before: params.yaml read again, so the shipped data timed
        bench.validate_stage(elsewhere, "trec6")


def test_a_benchmark_report_says_what_it_was_measured_on(tmp_path):
    from tqc.io import read_json

    bench.write_report(tmp_path / "bench" / "epochs.json", {"stage_two_over_stage_one": 1.01})
    report = read_json(tmp_path / "bench" / "epochs.json")
    assert report["stage_two_over_stage_one"] == 1.01
    measured_on = report["measured_on"]
    assert set(measured_on) == {"device", "cpu_cores", "torch", "code_version", "date"}
    assert measured_on["cpu_cores"] >= 1 and measured_on["code_version"] != "unknown"


def test_steps_beyond_one_epoch_time_one_epoch_and_say_so(tiny_model_dir, tmp_path, monkeypatch, caplog):
    data = tmp_path / "validated"
    Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()]).save(data / "catalog.jsonl")
    save_questions(data / "train.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 20)])  # 60 rows
    save_questions(data / "validation.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(1, 3)])
    params = Params.model_validate(tiny_params(tmp_path / "unused", tiny_model_dir))
    timed = []
    real = stage_one.train

    def recording(*args, **kwargs):
        result = real(*args, **kwargs)
        timed.append((args[-2].max_steps, result.seconds_per_epoch))
        return result

    monkeypatch.setattr(stage_one, "train", recording)
    report = bench.epochs(params, steps=20, batch_size=8, data_dir=data, train_path=data / "train.jsonl", rounds=1)
    (max_steps, seconds), one_epoch = timed[-1], 8  # 60 rows at 8 a batch: 7 full batches, the 4 left folded in
    assert max_steps == one_epoch and report["timed_steps"] == one_epoch  # was 20, and the time divided by 20
    assert report["stage_one_seconds_per_epoch"] == pytest.approx(seconds)  # was 0.40 of the epoch it measured
    assert "--steps 20 is more than one epoch" in caplog.text


def test_with_deferred_augmentation_stage_one_is_timed_on_the_rows_it_trains_on(tiny_model_dir, tmp_path, monkeypatch):
    """augment.deferred: stage one trains on the original rows only; it was timed on every row, so its seconds an
    epoch were overstated and the ratio understated."""
    data = tmp_path / "validated"
    Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()]).save(data / "catalog.jsonl")
    rows = [LabeledQuestion(t, c, generated=i >= 36) for i, (t, c) in enumerate(synthetic_questions(0, 20))]  # 36 + 24
    save_questions(data / "train.jsonl", rows)
    save_questions(data / "validation.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(1, 3)])
    params = Params.model_validate(tiny_params(tmp_path / "unused", tiny_model_dir)).with_overrides(
        {"augment": {"deferred": True}})
    rows_seen = {"stage one": set(), "stage two": set()}
    for name, module in (("stage one", stage_one), ("stage two", stage_two)):
        real = module.train

        def recording(*args, _real=real, _name=name, **kwargs):
            rows_seen[_name].add(len(args[1]))  # the training rows each call trains on
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, "train", recording)
    report = bench.epochs(params, steps=2, batch_size=8, data_dir=data, train_path=data / "train.jsonl")
    assert rows_seen == {"stage one": {36}, "stage two": {60}}
    assert (report["rows"], report["stage_one_rows"]) == (60, 36)
    assert list(report)[:3] == ["rows", "stage_one_rows", "batch_size"]


def test_the_passes_benchmark_times_both_settings_of_each_in_every_round(tiny_model_dir, tmp_path, capsys, monkeypatch,
                                                                        caplog):
    from tqc.config import ConfigError
    from tqc.model.encoder import PASS_ROWS, TextEncoder

    data = tmp_path / "validated"
    Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()]).save(data / "catalog.jsonl")
    save_questions(data / "train.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 20)])
    save_questions(data / "validation.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(1, 3)])
    params = Params.model_validate(tiny_params(tmp_path / "unused", tiny_model_dir))
    with pytest.raises(ConfigError, match="--batch-size 32 fits in one pass"):
        bench.passes(params, steps=2, batch_size=PASS_ROWS, train_path=data / "train.jsonl", data_dir=data)
    pass_rows_trained = []
    real = stage_one.train

    def recording(model, *args, **kwargs):
        pass_rows_trained.append(model.question.pass_rows)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(stage_one, "train", recording)
    pass_rows_encoded = []
    real_encode = TextEncoder.encode

    def recording_encode(self, texts, *args, **kwargs):
        if len(texts) == 30:  # the benchmark's own encoding (`encoded`), not stage one's of its validation rows
            pass_rows_encoded.append(self.pass_rows)
        return real_encode(self, texts, *args, **kwargs)

    monkeypatch.setattr(TextEncoder, "encode", recording_encode)
    fused_timed = []
    real_optimizer = bench._optimizer_seconds

    def recording_optimizer(model, schedule, steps, fused):
        fused_timed.append(fused)
        return real_optimizer(model, schedule, steps, fused)

    monkeypatch.setattr(bench, "_optimizer_seconds", recording_optimizer)
    rows = len(load_questions(data / "train.jsonl"))
    with caplog.at_level("WARNING", logger="tqc.bench"):
        report = bench.passes(params, steps=50, batch_size=40, train_path=data / "train.jsonl", rounds=2, encoded=30,
                              data_dir=data)
    # an epoch of these rows is a few steps of 40: 50 were reported, an epoch's timed
    epoch = steps_per_epoch(rows, 40, None)
    assert report["timed_steps"] == epoch < 50 and f"--steps 50 is more than one epoch of {rows} rows" in caplog.text
    # an untimed warm-up of both, then each setting first in every other round: a cold start charged to neither
    assert pass_rows_trained == [40, PASS_ROWS, 40, PASS_ROWS, PASS_ROWS, 40]
    one_pass = max(params.evaluate.batch_size, len(CLASSES))  # every question at once, the catalog's too
    assert pass_rows_encoded == [one_pass, PASS_ROWS, one_pass, PASS_ROWS, PASS_ROWS, one_pass]
    assert fused_timed == [False, True, False, True, True, False]
    assert report["rows_per_pass"] == PASS_ROWS and report["rounds"] == 2 and report["encoded_questions"] == 30
    for setting in ("train_one_pass", "train_passes", "encode_one_pass", "encode_passes", "adamw_default", "adamw_fused"):
        assert report[f"{setting}_seconds"] > 0, setting
    assert report["adamw_fused_over_default"] == pytest.approx(report["adamw_fused_seconds"] / report["adamw_default_seconds"])
    ratios = {"train_passes_over_one_pass": ("train_passes", "train_one_pass"),
              "encode_passes_over_one_pass": ("encode_passes", "encode_one_pass"),
              "adamw_fused_over_default": ("adamw_fused", "adamw_default")}
    assert list(report) == ["rows_per_pass", "batch_size", "timed_steps", "encoded_questions", "rounds",
                            "train_one_pass_seconds", "train_passes_seconds", "encode_one_pass_seconds",
                            "encode_passes_seconds", "adamw_default_seconds", "adamw_fused_seconds",
                            *(part for ratio in ratios for part in (ratio, f"{ratio}_range")), "rounds_seconds"]
    assert_rounds_behind_the_figures(report, "seconds", ratios)
    assert capsys.readouterr().out.splitlines()[-len(report) + 1:] == printed(report, 3)


def test_the_reading_benchmark_reads_every_row_it_wrote_in_a_fresh_process(capsys):
    from tqc.bench import reading

    report = reading(300)
    assert report["rows_read"] == 300 and report["seconds"] > 0 and report["peak_mib_over_imports"] >= 0
    assert report["file_mib"] > 0
    assert list(report) == ["rows", "file_mib", "rows_read", "seconds", "peak_mib_over_imports"]
    assert capsys.readouterr().out.splitlines() == printed(report, 2)


def test_an_empty_training_file_is_refused_before_any_model_is_loaded(tmp_path, monkeypatch):
    """It was a ZeroDivisionError after the slow warm-up."""
    from tqc.config import ConfigError

    Catalog([StandardQuestion("A", "What is a?")]).save(tmp_path / "catalog.jsonl")
    (tmp_path / "train.jsonl").write_text("")
    monkeypatch.setattr(bench.BiEncoder, "from_params", lambda *_: pytest.fail("the model was loaded"))
    with pytest.raises(ConfigError, match=r"train.jsonl: no training rows to time"):
        bench.epochs(Params(), 1, 2, tmp_path, tmp_path / "train.jsonl")


def test_the_serving_benchmark_times_both_rules_alternating_through_the_served_matcher(tiny_model_dir, tmp_path, monkeypatch,
                                                                                      capsys):
    """Each rule is loaded as `tqc predict` loads it and answers the same questions; the rules alternate call by call,
    so a slow spell of the machine falls on both, and the ratios are of figures from this one run."""
    from tests.model.test_encoder import tiny_bi_encoder
    from tqc.serving import StandardQuestionMatcher

    data = tmp_path / "validated"
    Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()]).save(data / "catalog.jsonl")
    save_questions(data / "train.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 4)])  # 12 rows
    save_questions(data / "test.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(1, 2)])
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    frames = []
    real = StandardQuestionMatcher.predict

    def recording(self, context, model_input, params=None):
        frames.append(("exemplars" if self.exemplars is not None else "standard", len(model_input)))
        return real(self, context, model_input, params)

    monkeypatch.setattr(StandardQuestionMatcher, "predict", recording)
    report = bench.serving(tmp_path / "model", data, None, exemplar_k=2, calls=4, batch_size=10, rounds=2)

    warm_up, single, batched = frames[:2], frames[2:10], frames[10:]
    assert warm_up == [("standard", 3), ("exemplars", 3)]
    assert [rule for rule, _ in single] == ["standard", "exemplars", "exemplars", "standard"] * 2
    assert {size for _, size in single} == {1}
    assert batched == [("standard", 10), ("exemplars", 10), ("exemplars", 10), ("standard", 10)]  # 6 questions, cycled
    assert report["exemplar_rows"] == 12 and report["catalog_classes"] == len(CLASSES)
    for rule in ("standard", "exemplars"):
        figures = report[rule]
        assert figures["load_seconds"] > 0 and 0 < figures["single_ms_median"] <= figures["single_ms_p95"]
    assert report["exemplars_over_standard_single"] == pytest.approx(
        report["exemplars"]["single_ms_median"] / report["standard"]["single_ms_median"])
    assert list(report) == ["model", "catalog_classes", "calls", "batch_size", "rounds", "exemplar_k", "exemplar_rows",
                            "standard", "exemplars", "exemplars_over_standard_single", "exemplars_over_standard_batched",
                            "batched_over_single_standard"]
    assert list(report["standard"]) == list(report["exemplars"]) == ["load_seconds", "single_ms_median", "single_ms_p95",
                                                                   "batched_ms_per_question"]
    assert report["exemplars_over_standard_batched"] == pytest.approx(
        report["exemplars"]["batched_ms_per_question"] / report["standard"]["batched_ms_per_question"])
    assert report["batched_over_single_standard"] == pytest.approx(
        report["standard"]["batched_ms_per_question"] / report["standard"]["single_ms_median"])
    lines = [f"{rule}: load {f['load_seconds']:.2f} s; one question a call {f['single_ms_median']:.1f} ms "
             f"(p95 {f['single_ms_p95']:.1f}); in frames of 10 {f['batched_ms_per_question']:.2f} ms a question"
             for rule, f in (("standard", report["standard"]), ("exemplars", report["exemplars"]))]
    lines.append(f"exemplar rule / standard rule: {report['exemplars_over_standard_single']:.2f} one a call, "
                 f"{report['exemplars_over_standard_batched']:.2f} in frames; frames / one a call (standard): "
                 f"{report['batched_over_single_standard']:.3f}")
    assert capsys.readouterr().out.splitlines()[-3:] == lines


def test_the_serving_benchmark_refuses_a_test_file_without_questions_before_loading_a_model(tmp_path, monkeypatch):
    from tqc.config import ConfigError

    (tmp_path / "test.jsonl").write_text("")
    monkeypatch.setattr("tqc.serving.local_matcher", lambda *_: pytest.fail("a model was loaded"))
    with pytest.raises(ConfigError, match=r"test.jsonl: no questions to answer"):
        bench.serving(tmp_path / "model", tmp_path, None, exemplar_k=2)


def test_the_serving_benchmark_needs_an_exemplar_k(tmp_path, capsys):
    from tqc.cli import main

    assert main(["--set", "evaluate.exemplar_k=0", "bench", "serve", "--data", str(tmp_path)]) == 2
    assert "evaluate.exemplar_k is 0" in capsys.readouterr().err


def test_a_flag_the_benchmark_does_not_read_is_refused_by_name(tmp_path, capsys):
    """`bench read --steps 5` read its 500,000 rows and said nothing; `bench serve --prior typo.json` timed the standard
    rule without a shift, as if none had been asked for."""
    from tqc.cli import main

    assert main(["bench", "read", "--steps", "5", "--calls", "2"]) == 2
    assert "tqc bench read does not read --steps, --calls: it reads --rows" in capsys.readouterr().err
    assert main(["bench", "validate", "--data", str(tmp_path)]) == 2
    assert "tqc bench validate does not read --data: it reads --dataset" in capsys.readouterr().err
    assert main(["bench", "serve", "--prior", str(tmp_path / "typo.json"), "--data", str(tmp_path)]) == 2
    assert f"--prior {tmp_path / 'typo.json'}: no such file" in capsys.readouterr().err


def test_an_out_that_cannot_be_written_is_refused_before_the_benchmark_runs(tmp_path, capsys, monkeypatch):
    """`--out` under a file, or a folder, was found when the report was written, after the timing: `[Errno 17] File
    exists` or a temporary file's name, exit 1, naming no option."""
    from tqc.cli import main

    monkeypatch.setattr(bench, "reading", lambda rows: pytest.fail("the benchmark ran before --out was checked"))
    (tmp_path / "afile").write_text("")
    assert main(["bench", "read", "--rows", "10", "--out", str(tmp_path / "afile" / "x.json")]) == 2
    assert (f"--out {tmp_path / 'afile' / 'x.json'}: {tmp_path / 'afile'} is a file, so nothing can be written under it; "
            "bench writes its report to a JSON file") in capsys.readouterr().err
    assert main(["bench", "read", "--rows", "10", "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path}: a folder; bench writes its report to a JSON file" in capsys.readouterr().err
    # --data a file, --train a folder: the OS's "Not a directory" or "Is a directory", exit 1, naming no option
    assert main(["bench", "epochs", "--data", str(tmp_path / "afile"), "--train", str(tmp_path / "afile")]) == 2
    assert f"--data {tmp_path / 'afile'}: a file; the benchmark reads a validated folder" in capsys.readouterr().err
    assert main(["bench", "passes", "--data", str(tmp_path), "--train", str(tmp_path)]) == 2
    assert f"--train {tmp_path}: a folder; the benchmark reads a training file" in capsys.readouterr().err


def test_a_validate_stage_that_stops_ends_the_benchmark_in_its_line_not_a_traceback(capsys):
    """Its child said why in one line; then CalledProcessError's traceback followed, exit 1."""
    from tqc.cli import main

    assert main(["--set", "validate.max_quarantined_fraction=0", "bench", "validate", "--dataset", "trec6"]) == 2
    err = capsys.readouterr().err
    assert "tqc bench validate: the validate stage it times stopped (exit 2, said above) on trec6" in err
    assert "Traceback" not in err


def test_a_few_timed_steps_are_scaled_up_to_a_whole_epoch():
    """2 s for 2 steps of an 8-step epoch (64 rows, batches of 8) is 8 s an epoch; the test above timed a whole one."""
    timed = bench._seconds_per_epoch(lambda schedule: 2.0, rows=64, steps=2, batch_size=8)
    assert timed(0) == pytest.approx(8.0)


def test_bench_passes_runs_at_its_own_default_batch_size():
    """Its default was the epochs benchmark's 32, which passes refuses (one pass of 32 rows times nothing else)."""
    from tqc.cli import _with_bench_defaults, parse_arguments
    from tqc.model.encoder import PASS_ROWS

    assert _with_bench_defaults(parse_arguments(["bench", "passes"])).batch_size == 64 > PASS_ROWS
    assert _with_bench_defaults(parse_arguments(["bench", "epochs"])).batch_size == 32
    assert _with_bench_defaults(parse_arguments(["bench", "passes", "--batch-size", "48"])).batch_size == 48


def test_a_reading_process_that_fails_is_one_line_with_its_own_reason(monkeypatch):
    """The child's failure (a memory limit on a large --rows) was CalledProcessError quoting the probe's code, its
    reason dropped."""
    import subprocess

    from tqc.config import ConfigError

    def failing(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "Traceback (most recent call last):\n  ...\nMemoryError\n")

    monkeypatch.setattr(bench.subprocess, "run", failing)
    with pytest.raises(ConfigError, match=r"^bench read: reading 10 rows failed in its process: MemoryError$"):
        bench.reading(10)
    monkeypatch.setattr(bench.subprocess, "run", lambda command, **kwargs: subprocess.CompletedProcess(command, -9, "", ""))
    with pytest.raises(ConfigError, match=r"failed in its process: ended by signal 9$"):
        bench.reading(10)


def test_the_benchmarks_negatives_are_mined_as_the_mine_stage_mines_them(monkeypatch):
    """Classes sharing one standard question are no negatives of each other in the mine stage; the benchmark mined
    without that, so with such a catalog its stage two trained on other negatives than the pipeline's."""
    import numpy as np
    import torch

    catalog = Catalog([StandardQuestion("A", "Same?"), StandardQuestion("B", "Same?"), StandardQuestion("C", "Other?")])
    seen = {}

    def mine(*args):
        seen["groups"] = args[6]
        return np.zeros((1, 1), dtype=int), {}

    class Encoder:
        def encode(self, texts):
            return torch.zeros(len(texts), 2)

    model = type("Model", (), {"question": Encoder(), "standard": Encoder(), "similarity": "cosine", "score": None})()
    monkeypatch.setattr(bench, "mine", mine)
    bench._mined_negatives(Params(), bench._TrainingSetup(catalog, [LabeledQuestion("q", "A")], [], model))
    assert seen["groups"].tolist() == [0, 0, 2]  # A and B one group, C its own
