"""`tqc bench`: seconds per epoch of stage one and stage two at the same batch size; what the backbone's
passes by length and the fused optimizer save; what the validate stage adds; what reading a large file costs; what
answering costs, by either rule.

Both stages train the same model on the same rows for the same number of steps; the
figure that matters is the ratio, measured in one run, since these machines are noisy.
With `--out` a benchmark also writes its figures, with the machine and the code they were
measured on, so that a figure quoted in the README or docs/ has a report behind it.
"""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch
import yaml
from torch import nn

from tqc.config import ConfigError, Params, StageOneParams
from tqc.device import pick_device, seed_everything, wait_for
from tqc.mining import mine
from tqc.model.encoder import PASS_ROWS, BiEncoder
from tqc.schema import Catalog, LabeledQuestion, gold_indices, load_questions
from tqc.stages import stage_one, stage_two
from tqc.training import adamw, parameter_groups, steps_per_epoch
from tqc.twins import standard_text_groups

log = logging.getLogger(__name__)


Timed = Callable[[int], float]  # one setting's figure in the round (or call) it is given


def _in_turn(items, round_index: int):
    """`items` in order in even rounds and reversed in odd ones: each goes first in every other round, so a slow
    spell of a loaded machine falls on none of them alone."""
    return items[:: 1 if round_index % 2 == 0 else -1]


def _alternating_rounds(rounds: int, groups: list[list[tuple[str, Timed]]]) -> dict[str, list[float]]:
    """Each named setting's figure in each of `rounds` rounds: within a round each group's settings run one after
    another, in turn (`_in_turn`), so that a slow spell of the machine falls on no setting alone."""
    figures: dict[str, list[float]] = {name: [] for group in groups for name, _ in group}
    for round_index in range(rounds):
        for group in groups:
            for name, timed in _in_turn(group, round_index):
                figures[name].append(timed(round_index))
    return figures


def _summarised(header: dict, figures: dict[str, list[float]], unit: str, ratios: dict[str, tuple[str, str]]) -> dict:
    """`header`, each setting's median over its rounds as `<setting>_<unit>`, then each ratio of `ratios` (its
    name: the settings over and under the line) of those medians, and the ratio's smallest and largest in a single
    round (`<ratio>_range`); printed a line a figure. The report ends with every round's figures (`rounds_<unit>`):
    a ratio whose rounds spread wider than its distance from a bar has not shown which side of the bar it is on."""
    report = {**header, **{f"{name}_{unit}": float(np.median(values)) for name, values in figures.items()}}
    for ratio, (over, under) in ratios.items():
        report[ratio] = report[f"{over}_{unit}"] / report[f"{under}_{unit}"]
        in_rounds = [o / u for o, u in zip(figures[over], figures[under])]
        report[f"{ratio}_range"] = [min(in_rounds), max(in_rounds)]
    _print_figures(report, 3)
    report[f"rounds_{unit}"] = {name: list(values) for name, values in figures.items()}
    return report


def _print_figures(report: dict, decimals: int) -> None:
    """A line a figure, `key: value`, floats to `decimals` places."""
    for key, value in report.items():
        if isinstance(value, list) and all(isinstance(item, float) for item in value):
            value = "[" + ", ".join(f"{item:.{decimals}f}" for item in value) + "]"
        print(f"{key}: {value:.{decimals}f}" if isinstance(value, float) else f"{key}: {value}")


class _TrainingSetup(NamedTuple):
    """What a training benchmark starts from (`_training_setup`)."""

    catalog: Catalog
    train_rows: list[LabeledQuestion]
    validation: list[LabeledQuestion]
    model: BiEncoder


def _training_setup(params: Params, data_dir: Path, train_path: Path) -> _TrainingSetup:
    """The catalog, the training rows, a few validation rows and a fresh model, as stage one would start."""
    seed_everything(params.seed)
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    train_rows = load_questions(train_path)
    if not train_rows:  # said before the model loads, not as a division by zero after the warm-up
        raise ConfigError(f"{train_path}: no training rows to time")
    validation = load_questions(data_dir / "validation.jsonl")[:8]  # validation is not what is timed
    model = BiEncoder.from_params(params.model).to(pick_device())
    model.set_augmentation(params.augment)
    return _TrainingSetup(catalog, train_rows, validation, model)


def _one_epoch(batch_size: int, max_steps: int) -> dict:
    """A stage's schedule overrides: one epoch of `batch_size` rows a step, cut at `max_steps` steps."""
    return {"epochs": 1, "batch_size": batch_size, "max_steps": max_steps}


def _at_most_one_epoch(steps: int, rows: int, batch_size: int) -> int:
    """`steps`, or the steps of one epoch of `rows` rows where those are fewer, with a warning: an epoch ends there,
    so its steps, not `steps`, would be timed, and its time divided by `steps` under-report it."""
    epoch = steps_per_epoch(rows, batch_size, None)
    if steps > epoch:
        log.warning("bench: --steps %d is more than one epoch of %d rows at batch size %d (%d steps): timing %d",
                    steps, rows, batch_size, epoch, epoch)
        return epoch
    return steps


def _stage_one_seconds(params: Params, setup: _TrainingSetup, rows: list[LabeledQuestion], schedule: dict) -> float:
    """Stage one's seconds an epoch, trained on `rows` with `schedule`'s overrides of params.stage_one."""
    # With augment's in-batch terms (prototype mixup, cross-encoding), as the pipeline trains stage one: their
    # cost is part of its epoch
    stage_params = params.stage_one.model_copy(update=schedule)
    return stage_one.train(setup.model, rows, setup.validation, setup.catalog, stage_params, params.seed,
                           augment=params.augment).seconds_per_epoch


def epochs(params: Params, steps: int, batch_size: int, data_dir: Path = Path("data/validated"),
           train_path: Path = Path("data/augmented/train.jsonl"), rounds: int = 3) -> dict:
    """Seconds per epoch of stage one and stage two, from `steps` steps of each at `batch_size`.

    The stages alternate in `rounds` rounds, each going first in every other one, and each figure is the median of its
    rounds: a slow spell of a loaded machine would otherwise fall on one stage and move the ratio."""
    setup = _training_setup(params, data_dir, train_path)
    negatives = _mined_negatives(params, setup)
    # Stage one's rows as the pipeline trains it: with augment.deferred, the original rows only
    rows = {"stage_one": stage_one.stage_one_rows(setup.train_rows, params.augment.deferred),
            "stage_two": setup.train_rows}
    train = _stage_trainers(params, setup, rows, negatives)
    # Warm-up steps of both stages first, untimed: on a GPU the first steps load kernels and
    # allocate optimizer state, which would otherwise be charged to whichever stage runs first.
    for train_stage in train.values():
        train_stage(_one_epoch(batch_size, 3))
    # Stage one's rows are never more than stage two's: its epoch is the shorter (under augment.deferred, else both)
    steps = _at_most_one_epoch(steps, len(rows["stage_one"]), batch_size)
    seconds = _alternating_rounds(rounds, [[(stage, _seconds_per_epoch(train_stage, len(rows[stage]), steps, batch_size))
                                            for stage, train_stage in train.items()]])
    n_stage_one, n_train = len(rows["stage_one"]), len(setup.train_rows)
    header = {"rows": n_train, **({"stage_one_rows": n_stage_one} if n_stage_one != n_train else {}),  # augment.deferred
              "batch_size": batch_size, "timed_steps": steps, "rounds": rounds, "k": int(negatives.shape[1])}
    return _summarised(header, seconds, "seconds_per_epoch", {"stage_two_over_stage_one": ("stage_two", "stage_one")})


def _mined_negatives(params: Params, setup: _TrainingSetup) -> torch.Tensor:
    """Stage two's hard negatives of the training rows (N, k), mined with the fresh model."""
    model, catalog, train_rows = setup.model, setup.catalog, setup.train_rows
    questions = model.question.encode([q.text for q in train_rows]).numpy()
    # as the mine stage does: classes sharing one standard question are no negatives of each other
    negatives, _ = mine(questions, model.standard.encode(catalog.texts).numpy(), gold_indices(train_rows, catalog),
                        params.mine.k, model.similarity, model.score, standard_text_groups(catalog))
    return torch.as_tensor(negatives)


def _stage_trainers(params: Params, setup: _TrainingSetup, rows: dict[str, list[LabeledQuestion]],
                    negatives: torch.Tensor) -> dict[str, Callable[[dict], float]]:
    """Each stage's seconds an epoch on its `rows`, trained with a schedule's overrides (`_one_epoch`)."""
    def train_two(schedule: dict) -> float:
        return stage_two.train(setup.model, rows["stage_two"], negatives, setup.validation, setup.catalog,
                               params.stage_two.model_copy(update=schedule), params.seed).seconds_per_epoch

    return {"stage_one": partial(_stage_one_seconds, params, setup, rows["stage_one"]), "stage_two": train_two}


def _seconds_per_epoch(train: Callable[[dict], float], rows: int, steps: int, batch_size: int) -> Timed:
    """A stage's seconds a full epoch of `rows` rows, from the time of its first `steps` steps."""
    full_epoch = steps_per_epoch(rows, batch_size, None)
    return lambda _: train(_one_epoch(batch_size, steps)) / steps * full_epoch


def passes(params: Params, steps: int, batch_size: int, train_path: Path, rounds: int = 3, encoded: int = 2000,
           data_dir: Path = Path("data/validated")) -> dict:
    """Seconds of stage-one steps and of encoding with one backbone pass per batch against passes of PASS_ROWS
    questions of similar length, and of AdamW steps with torch's fused kernel against its default one.

    The two settings alternate in `rounds` rounds and each figure is the median of its rounds, so a slow spell of
    the machine does not fall on one side; the ratios are the figures to read.
    """
    if batch_size <= PASS_ROWS:
        raise ConfigError(f"bench passes: --batch-size {batch_size} fits in one pass of {PASS_ROWS} rows, so both "
                          f"settings would time the same thing; give more than {PASS_ROWS}, e.g. 64")
    setup = _training_setup(params, data_dir, train_path)
    texts = [q.text for q in setup.train_rows][:encoded]
    steps = _at_most_one_epoch(steps, len(setup.train_rows), batch_size)
    settings = [*_pass_settings(params, setup, texts, steps, batch_size),
                [(f"adamw_{name}", lambda _, fused=fused: _optimizer_seconds(setup.model, params.stage_one, steps, fused))
                 for name, fused in (("default", False), ("fused", True))]]
    _alternating_rounds(1, settings)  # untimed: the first autograd, allocator and kernel loads charged to neither setting
    timings = _alternating_rounds(rounds, settings)
    header = {"rows_per_pass": PASS_ROWS, "batch_size": batch_size, "timed_steps": steps, "encoded_questions": len(texts),
              "rounds": rounds}
    return _summarised(header, timings, "seconds", {"train_passes_over_one_pass": ("train_passes", "train_one_pass"),
                                                    "encode_passes_over_one_pass": ("encode_passes", "encode_one_pass"),
                                                    "adamw_fused_over_default": ("adamw_fused", "adamw_default")})


def _pass_settings(params: Params, setup: _TrainingSetup, texts: list[str], steps: int,
                   batch_size: int) -> list[list[tuple[str, Timed]]]:
    """Two pairs of settings: `steps` stage-one steps at `batch_size`, and encoding `texts`, each with every row of a
    batch in one backbone pass and in passes of PASS_ROWS."""
    def encode() -> float:
        started = time.perf_counter()
        setup.model.question.encode(texts, params.evaluate.batch_size)
        return time.perf_counter() - started

    # "One pass": every row of a batch at once, the standard questions of stage one's all-classes negatives or
    # prototype mixup too (there can be more of them than rows)
    catalog_rows = len(setup.catalog)
    timed = {"train": (partial(_stage_one_seconds, params, setup, setup.train_rows, _one_epoch(batch_size, steps)),
                       max(batch_size, catalog_rows)),
             "encode": (encode, max(params.evaluate.batch_size, catalog_rows))}
    return [[(f"{what}_one_pass", _with_pass_rows(setup.model, one_pass, run)),
             (f"{what}_passes", _with_pass_rows(setup.model, PASS_ROWS, run))]
            for what, (run, one_pass) in timed.items()]


def _with_pass_rows(model: BiEncoder, rows: int, timed: Callable[[], float]) -> Timed:
    """`timed`, run with the model's encoders (one when tied) at `rows` rows a backbone pass."""
    def run(_round: int) -> float:
        for encoder in {model.question, model.standard}:
            encoder.pass_rows = rows
        return timed()

    return run


def _optimizer_seconds(model: BiEncoder, schedule: StageOneParams, steps: int, fused: bool) -> float:
    """Seconds of `steps` AdamW steps over a copy of the model's parameters, with made-up gradients."""
    copy = [nn.Parameter(p.detach().clone()) for p in model.parameters()]
    for p in copy:
        p.grad = torch.randn_like(p) * 1e-3
    optimizer = adamw(parameter_groups(nn.ParameterList(copy), schedule.learning_rate), schedule.weight_decay, fused)
    optimizer.step()  # allocates the moments: not timed
    wait_for(copy[0].device)
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    wait_for(copy[0].device)  # a CUDA step returns once queued: the time is the updates', not their launches'
    return time.perf_counter() - started


def validate_stage(params: Params, dataset: str) -> dict:
    """Wall-clock seconds the validate stage adds to `dvc repro` (process start included) on `dataset`."""
    from tqc.stages import ingest

    params = params.with_overrides({"data": {"dataset": dataset}})
    with tempfile.TemporaryDirectory(prefix="tqc-bench-") as work:
        work = Path(work)
        (work / "params.yaml").write_text(yaml.safe_dump(params.to_dict()))
        ingest.run(params.data, params.seed, work / "ingested", work / "q.jsonl", work / "ingest.json",
                   params.validate_.max_text_chars)
        started = time.perf_counter()
        finished = subprocess.run([sys.executable, "-m", "tqc.cli", "--params", str(work / "params.yaml"), "validate",
                                   "--data", str(work / "ingested"), "--out", str(work / "validated"), "--quarantine",
                                   str(work / "vq.jsonl"), "--report", str(work / "validation.json"), "--docs",
                                   str(work / "docs")])
        seconds = time.perf_counter() - started
    if finished.returncode != 0:  # its own one line is above; then CalledProcessError's traceback followed it
        raise ConfigError(f"tqc bench validate: the validate stage it times stopped (exit {finished.returncode}, said "
                          f"above) on {dataset}, so there is no time to report")
    report = {"dataset": dataset, "validate_stage_seconds": seconds}
    print(f"dataset: {dataset}\nvalidate_stage_seconds: {seconds:.2f}")
    return report


def reading(rows: int) -> dict:
    """Seconds and peak memory to read a CSV of `rows` synthetic questions, in a fresh process: readers hold a file's
    text while they read it a record at a time, and all its rows, so this is what a user's own data costs ingest
    before any training."""
    with tempfile.TemporaryDirectory(prefix="tqc-bench-") as work:
        path = Path(work) / "train.csv"
        _write_questions_csv(path, rows)
        # The peak is the kernel's VmHWM, which exec resets: getrusage's ru_maxrss carries the parent's peak over a
        # fork, and made the figure that much too small (224 MiB for 428)
        probe = ("import json, re, time; from pathlib import Path; from tqc.readers import read_table; "
                 "peak = lambda: int(re.search(r'VmHWM:\\s+(\\d+)', Path('/proc/self/status').read_text()).group(1)); "
                 "before = peak(); started = time.perf_counter(); "
                 f"read = read_table(Path({str(path)!r}), 'question', 'label'); seconds = time.perf_counter() - started; "
                 "print(json.dumps({'rows_read': len(read.rows), 'seconds': seconds, "
                 "'peak_mib_over_imports': (peak() - before) / 1024}))")  # VmHWM: KiB
        finished = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        if finished.returncode != 0:  # its own reason, not a traceback quoting the probe's code
            said = finished.stderr.strip().splitlines()
            reason = said[-1] if said else f"ended by signal {-finished.returncode}" if finished.returncode < 0 else \
                f"exit status {finished.returncode}"
            raise ConfigError(f"bench read: reading {rows} rows failed in its process: {reason}")
        report = {"rows": rows, "file_mib": path.stat().st_size / 2**20, **json.loads(finished.stdout.splitlines()[-1])}
    _print_figures(report, 2)
    return report


def serving(model_dir: Path, data_dir: Path, prior_path: Path | None, exemplar_k: int, calls: int = 50,
            batch_size: int = 256, rounds: int = 3, top_k: int = 3) -> dict:
    """What answering costs on this machine, through the matcher `tqc predict` and the registry serve: seconds to
    load each rule after an untimed first load (the exemplar rule encoding its labeled questions, as `tqc predict
    --exemplar-cache none` does: a registered version reads the vectors registered with it), milliseconds for one question a call
    (median and 95th percentile of `calls`), and per question in frames of `batch_size` (median of `rounds`).

    The two rules alternate call by call, so a slow spell of a loaded machine falls on both; the ratios within this
    one run are the figures to quote."""
    questions = [q.text for q in load_questions(data_dir / "test.jsonl")]
    if not questions:
        raise ConfigError(f"{data_dir / 'test.jsonl'}: no questions to answer")
    batch = (questions * (batch_size // len(questions) + 1))[:batch_size]  # the questions cycled to fill a frame
    matchers, load_seconds = _loaded_rules(model_dir, data_dir, prior_path, exemplar_k, top_k)
    for rule in matchers:  # warm-up, untimed: the first calls allocate what later ones reuse
        _ms_a_question(matchers[rule], questions[:3], top_k)
    single = _alternating_rounds(calls, [_answering(matchers, top_k, lambda call: [questions[call % len(questions)]])])
    batched = _alternating_rounds(rounds, [_answering(matchers, top_k, lambda _: batch)])
    figures = {rule: _rule_figures(load_seconds[rule], single[rule], batched[rule]) for rule in matchers}
    report = {"model": str(model_dir), "catalog_classes": len(matchers["standard"].catalog), "calls": calls,
              "batch_size": batch_size, "rounds": rounds, "exemplar_k": exemplar_k,
              "exemplar_rows": int(matchers["exemplars"].exemplars.vectors.shape[0]), **figures, **_rule_ratios(figures)}
    _print_serving(report, list(matchers), batch_size)
    return report


def _loaded_rules(model_dir: Path, data_dir: Path, prior_path: Path | None, exemplar_k: int,
                  top_k: int) -> tuple[dict, dict[str, float]]:
    """Each rule's matcher, loaded as `tqc predict` loads it, and the seconds its load took."""
    from tqc.serving import local_matcher

    rules = {"standard": (prior_path, None), "exemplars": (None, (data_dir / "train.jsonl", exemplar_k))}
    local_matcher(model_dir, data_dir / "catalog.jsonl", top_k, prior_path)  # untimed: the first load pays the imports
    matchers, load_seconds = {}, {}
    for rule, (prior, exemplars) in rules.items():  # the exemplar rule with no cache: it encodes every row at load
        started = time.perf_counter()
        matchers[rule] = local_matcher(model_dir, data_dir / "catalog.jsonl", top_k, prior, exemplars)
        load_seconds[rule] = time.perf_counter() - started
    return matchers, load_seconds


def _answering(matchers: dict, top_k: int, texts_of: Callable[[int], list[str]]) -> list[tuple[str, Timed]]:
    """Each rule's milliseconds a question answering `texts_of(call)`, to be timed in turn (`_alternating_rounds`)."""
    return [(rule, lambda call, matcher=matcher: _ms_a_question(matcher, texts_of(call), top_k))
            for rule, matcher in matchers.items()]


def _ms_a_question(matcher, texts: list[str], top_k: int) -> float:
    """Milliseconds a question of `matcher` answering `texts` in one call."""
    import pandas as pd

    started = time.perf_counter()
    matcher.predict(None, pd.DataFrame({"question": texts}), params={"top_k": top_k})
    return (time.perf_counter() - started) * 1000 / len(texts)


def _rule_figures(load_seconds: float, single_ms: list[float], batched_ms: list[float]) -> dict[str, float]:
    """One rule's figures: its load, one question a call (median, 95th percentile) and a question in frames (median)."""
    return {"load_seconds": load_seconds, "single_ms_median": float(np.median(single_ms)),
            "single_ms_p95": float(np.percentile(single_ms, 95)), "batched_ms_per_question": float(np.median(batched_ms))}


def _rule_ratios(figures: dict[str, dict[str, float]]) -> dict[str, float]:
    """The exemplar rule's cost over the standard rule's, one question a call and in frames, and frames' over one a
    call for the standard rule."""
    standard, exemplars = figures["standard"], figures["exemplars"]
    return {"exemplars_over_standard_single": exemplars["single_ms_median"] / standard["single_ms_median"],
            "exemplars_over_standard_batched": exemplars["batched_ms_per_question"] / standard["batched_ms_per_question"],
            "batched_over_single_standard": standard["batched_ms_per_question"] / standard["single_ms_median"]}


def _print_serving(report: dict, rules: list[str], batch_size: int) -> None:
    """A line a rule, then the ratios."""
    for rule in rules:
        figures = report[rule]
        print(f"{rule}: load {figures['load_seconds']:.2f} s; one question a call {figures['single_ms_median']:.1f} ms "
              f"(p95 {figures['single_ms_p95']:.1f}); in frames of {batch_size} {figures['batched_ms_per_question']:.2f} ms "
              "a question")
    print(f"exemplar rule / standard rule: {report['exemplars_over_standard_single']:.2f} one a call, "
          f"{report['exemplars_over_standard_batched']:.2f} in frames; frames / one a call (standard): "
          f"{report['batched_over_single_standard']:.3f}")


def _write_questions_csv(path: Path, rows: int) -> None:
    words = "what where who how many is the of capital river city first largest country name".split()
    rng = random.Random(0)
    with path.open("w", encoding="utf-8") as out:
        out.write("question,label\n")
        for row in range(rows):
            out.write(f"{' '.join(rng.choices(words, k=10))} {row}?,c{row % 50}\n")


def write_report(path: Path, report: dict) -> None:
    """The figures with what they were measured on: device, cores, torch, the code's commit, the date."""
    import os
    import platform
    from datetime import datetime, timezone

    from tqc.io import write_json
    from tqc.tracking import git_commit

    device = pick_device()
    cpu = f"cpu ({platform.processor() or platform.machine()})"
    write_json(path, {**report, "measured_on": {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu,
        "cpu_cores": os.cpu_count(), "torch": torch.__version__, "code_version": git_commit(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}})
    print(f"wrote {path}")
