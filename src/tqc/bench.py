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
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

from tqc.config import ConfigError, Params, StageOneParams
from tqc.device import pick_device, seed_everything
from tqc.mining import mine
from tqc.model.encoder import PASS_ROWS, BiEncoder
from tqc.schema import Catalog, load_questions
from tqc.stages import stage_one, stage_two
from tqc.training import adamw, gold_indices, parameter_groups, steps_per_epoch

log = logging.getLogger(__name__)


def _in_turn(items, round_index: int):
    """`items` in order in even rounds and reversed in odd ones: each goes first in every other round, so a slow
    spell of a loaded machine falls on none of them alone."""
    return items[:: 1 if round_index % 2 == 0 else -1]


def _training_setup(params: Params, data_dir: Path, train_path: Path):
    """The catalog, the training rows, a few validation rows and a fresh model, as stage one would start."""
    seed_everything(params.seed)
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    train_rows = load_questions(train_path)
    if not train_rows:  # said before the model loads, not as a division by zero after the warm-up
        raise ConfigError(f"{train_path}: no training rows to time")
    validation = load_questions(data_dir / "validation.jsonl")[:8]  # validation is not what is timed
    model = BiEncoder.from_params(params.model).to(pick_device())
    model.set_augmentation(params.augment)
    return catalog, train_rows, validation, model


def epochs(params: Params, steps: int, batch_size: int, data_dir: Path = Path("data/validated"),
           train_path: Path = Path("data/augmented/train.jsonl"), rounds: int = 3) -> dict:
    """Seconds per epoch of stage one and stage two, from `steps` steps of each at `batch_size`.

    The stages alternate in `rounds` rounds, each going first in every other one, and each figure is the median of its
    rounds: a slow spell of a loaded machine would otherwise fall on one stage and move the ratio."""
    catalog, train_rows, validation, model = _training_setup(params, data_dir, train_path)

    questions = model.question.encode([q.text for q in train_rows]).numpy()
    negatives, _ = mine(questions, model.standard.encode(catalog.texts).numpy(), gold_indices(train_rows, catalog), params.mine.k,
                        model.similarity, model.score)
    negatives = torch.as_tensor(negatives)
    # Stage one's rows as the pipeline trains it: with augment.deferred, the original rows only
    one_rows = stage_one.stage_one_rows(train_rows, params.augment.deferred)

    def train_one(schedule: dict) -> float:
        # With augment's in-batch terms (prototype mixup, cross-encoding), as the pipeline trains stage one: their
        # cost is part of its epoch
        return stage_one.train(model, one_rows, validation, catalog, params.stage_one.model_copy(update=schedule),
                               params.seed, augment=params.augment).seconds_per_epoch

    def train_two(schedule: dict) -> float:
        return stage_two.train(model, train_rows, negatives, validation, catalog,
                               params.stage_two.model_copy(update=schedule), params.seed).seconds_per_epoch

    # Warm-up steps of both stages first, untimed: on a GPU the first steps load kernels and
    # allocate optimizer state, which would otherwise be charged to whichever stage runs first.
    warm_up = {"epochs": 1, "batch_size": batch_size, "max_steps": 3}
    train_one(warm_up)
    train_two(warm_up)
    full_one, full_two = (steps_per_epoch(len(rows), batch_size, None) for rows in (one_rows, train_rows))
    shorter = min(full_one, full_two)  # stage one's under augment.deferred, else both stages'
    if steps > shorter:  # an epoch ends there: dividing its time by `steps` would under-report it
        log.warning("bench: --steps %d is more than one epoch of %d rows at batch size %d (%d steps): timing %d",
                    steps, len(one_rows), batch_size, shorter, shorter)
        steps = shorter
    common = {"epochs": 1, "batch_size": batch_size, "max_steps": steps}
    stages = (("stage_one", train_one, full_one), ("stage_two", train_two, full_two))
    seconds: dict[str, list[float]] = {"stage_one": [], "stage_two": []}
    for round_index in range(rounds):
        for name, train, full_epoch in _in_turn(stages, round_index):
            seconds[name].append(train(common) / steps * full_epoch)
    report = {
        "rows": len(train_rows),
        **({"stage_one_rows": len(one_rows)} if len(one_rows) != len(train_rows) else {}),  # augment.deferred
        "batch_size": batch_size,
        "timed_steps": steps,
        "rounds": rounds,
        "k": int(negatives.shape[1]),
        "stage_one_seconds_per_epoch": float(np.median(seconds["stage_one"])),
        "stage_two_seconds_per_epoch": float(np.median(seconds["stage_two"])),
    }
    report["stage_two_over_stage_one"] = report["stage_two_seconds_per_epoch"] / report["stage_one_seconds_per_epoch"]
    for key, value in report.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    return report


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
    catalog, train_rows, validation, model = _training_setup(params, data_dir, train_path)
    texts = [q.text for q in train_rows][:encoded]
    epoch = steps_per_epoch(len(train_rows), batch_size, None)
    if steps > epoch:  # an epoch ends there: its steps, not `steps`, would be timed, and the report say `steps`
        log.warning("bench: --steps %d is more than one epoch of %d rows at batch size %d (%d steps): timing %d",
                    steps, len(train_rows), batch_size, epoch, epoch)
        steps = epoch
    training = params.stage_one.model_copy(update={"epochs": 1, "batch_size": batch_size, "max_steps": steps})
    encoders = {model.question, model.standard}  # one encoder when tied

    def with_pass_rows(rows: int, timed) -> float:
        for encoder in encoders:
            encoder.pass_rows = rows
        return timed()

    def train_steps() -> float:
        return stage_one.train(model, train_rows, validation, catalog, training, params.seed,
                               augment=params.augment).seconds_per_epoch

    def encode() -> float:
        started = time.perf_counter()
        model.question.encode(texts, params.evaluate.batch_size)
        return time.perf_counter() - started

    # "One pass": every row of a batch at once, the standard questions of stage one's all-classes negatives or
    # prototype mixup too (there can be more of them than rows)
    one_pass = max(batch_size, len(catalog))
    pairs = [(("train_one_pass", one_pass, train_steps), ("train_passes", PASS_ROWS, train_steps)),
             (("encode_one_pass", max(params.evaluate.batch_size, len(catalog)), encode), ("encode_passes", PASS_ROWS, encode))]
    optimizers = (("adamw_default", False), ("adamw_fused", True))
    for first, second in pairs:  # untimed: the first autograd, allocator and kernel loads charged to neither setting
        for _, rows, timed in (first, second):
            with_pass_rows(rows, timed)
    for _, fused in optimizers:
        _optimizer_seconds(model, params.stage_one, steps, fused)
    timings: dict[str, list[float]] = {}
    for round_index in range(rounds):
        for pair in pairs:
            for name, rows, timed in _in_turn(pair, round_index):
                timings.setdefault(name, []).append(with_pass_rows(rows, timed))
        for name, fused in _in_turn(optimizers, round_index):
            timings.setdefault(name, []).append(_optimizer_seconds(model, params.stage_one, steps, fused))
    report = {"rows_per_pass": PASS_ROWS, "batch_size": batch_size, "timed_steps": steps, "encoded_questions": len(texts),
              "rounds": rounds, **{f"{name}_seconds": float(np.median(values)) for name, values in timings.items()}}
    report["train_passes_over_one_pass"] = report["train_passes_seconds"] / report["train_one_pass_seconds"]
    report["encode_passes_over_one_pass"] = report["encode_passes_seconds"] / report["encode_one_pass_seconds"]
    report["adamw_fused_over_default"] = report["adamw_fused_seconds"] / report["adamw_default_seconds"]
    for key, value in report.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    return report


def _optimizer_seconds(model: BiEncoder, schedule: StageOneParams, steps: int, fused: bool) -> float:
    """Seconds of `steps` AdamW steps over a copy of the model's parameters, with made-up gradients."""
    copy = [nn.Parameter(p.detach().clone()) for p in model.parameters()]
    for p in copy:
        p.grad = torch.randn_like(p) * 1e-3
    optimizer = adamw(parameter_groups(nn.ParameterList(copy), schedule.learning_rate), schedule.weight_decay, fused)
    optimizer.step()  # allocates the moments: not timed
    _wait_for_the_device(copy[0])
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    _wait_for_the_device(copy[0])  # a CUDA step returns once queued: the time is the updates', not their launches'
    return time.perf_counter() - started


def _wait_for_the_device(tensor: torch.Tensor) -> None:
    if tensor.device.type == "cuda":
        torch.cuda.synchronize(tensor.device)


def validate_stage(params: Params, dataset: str) -> dict:
    """Wall-clock seconds the validate stage adds to `dvc repro` (process start included) on `dataset`."""
    from tqc.stages import ingest

    params = params.with_overrides({"data": {"dataset": dataset}})
    with tempfile.TemporaryDirectory(prefix="tqc-bench-") as work:
        work = Path(work)
        (work / "params.yaml").write_text(yaml.safe_dump(params.to_dict()))
        ingest.run(params.data, params.seed, work / "ingested", work / "q.jsonl", work / "ingest.json")
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tqc.cli", "--params", str(work / "params.yaml"), "validate",
                        "--data", str(work / "ingested"), "--out", str(work / "validated"), "--quarantine",
                        str(work / "vq.jsonl"), "--report", str(work / "validation.json"), "--docs", str(work / "docs")], check=True)
        seconds = time.perf_counter() - started
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
        finished = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
        report = {"rows": rows, "file_mib": path.stat().st_size / 2**20, **json.loads(finished.stdout.splitlines()[-1])}
    for key, value in report.items():
        print(f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}")
    return report


def serving(model_dir: Path, data_dir: Path, prior_path: Path | None, exemplar_k: int, calls: int = 50,
            batch_size: int = 256, rounds: int = 3, top_k: int = 3) -> dict:
    """What answering costs on this machine, through the matcher `tqc predict` and the registry serve: seconds to
    load each rule after an untimed first load (the exemplar rule encoding its labeled questions, as `tqc predict
    --exemplar-cache none` does: a registered version reads the vectors registered with it), milliseconds for one question a call
    (median and 95th percentile of `calls`), and per question in frames of `batch_size` (median of `rounds`).

    The two rules alternate call by call, so a slow spell of a loaded machine falls on both; the ratios within this
    one run are the figures to quote."""
    import pandas as pd

    from tqc.serving import local_matcher

    questions = [q.text for q in load_questions(data_dir / "test.jsonl")]
    if not questions:
        raise ConfigError(f"{data_dir / 'test.jsonl'}: no questions to answer")
    batch = (questions * (batch_size // len(questions) + 1))[:batch_size]
    rules = {"standard": (prior_path, None), "exemplars": (None, (data_dir / "train.jsonl", exemplar_k))}
    local_matcher(model_dir, data_dir / "catalog.jsonl", top_k, prior_path)  # untimed: the first load pays the imports
    matchers, load_seconds = {}, {}
    for rule, (prior, exemplars) in rules.items():  # the exemplar rule with no cache: it encodes every row at load
        started = time.perf_counter()
        matchers[rule] = local_matcher(model_dir, data_dir / "catalog.jsonl", top_k, prior, exemplars)
        load_seconds[rule] = time.perf_counter() - started

    def answer(rule: str, texts: list[str]) -> float:
        started = time.perf_counter()
        matchers[rule].predict(None, pd.DataFrame({"question": texts}), params={"top_k": top_k})
        return time.perf_counter() - started

    def ms_a_question(turns: int, texts_of) -> dict[str, list[float]]:
        """Each rule's milliseconds a question in each turn, answering `texts_of(turn)`, the rules in turn."""
        figures = {rule: [] for rule in rules}
        for turn in range(turns):
            texts = texts_of(turn)
            for rule in _in_turn(list(rules), turn):
                figures[rule].append(answer(rule, texts) * 1000 / len(texts))
        return figures

    for rule in rules:  # warm-up, untimed: the first calls allocate what later ones reuse
        answer(rule, questions[:3])
    single = ms_a_question(calls, lambda call: [questions[call % len(questions)]])
    batched = ms_a_question(rounds, lambda _: batch)

    report = {"model": str(model_dir), "catalog_classes": len(matchers["standard"].catalog), "calls": calls,
              "batch_size": batch_size, "rounds": rounds, "exemplar_k": exemplar_k,
              "exemplar_rows": int(matchers["exemplars"].exemplars.vectors.shape[0])}
    for rule in rules:
        report[rule] = {"load_seconds": load_seconds[rule],
                        "single_ms_median": float(np.median(single[rule])),
                        "single_ms_p95": float(np.percentile(single[rule], 95)),
                        "batched_ms_per_question": float(np.median(batched[rule]))}
    report["exemplars_over_standard_single"] = report["exemplars"]["single_ms_median"] / report["standard"]["single_ms_median"]
    report["exemplars_over_standard_batched"] = (report["exemplars"]["batched_ms_per_question"]
                                                 / report["standard"]["batched_ms_per_question"])
    report["batched_over_single_standard"] = (report["standard"]["batched_ms_per_question"]
                                              / report["standard"]["single_ms_median"])
    for rule in rules:
        figures = report[rule]
        print(f"{rule}: load {figures['load_seconds']:.2f} s; one question a call {figures['single_ms_median']:.1f} ms "
              f"(p95 {figures['single_ms_p95']:.1f}); in frames of {batch_size} {figures['batched_ms_per_question']:.2f} ms "
              "a question")
    print(f"exemplar rule / standard rule: {report['exemplars_over_standard_single']:.2f} one a call, "
          f"{report['exemplars_over_standard_batched']:.2f} in frames; frames / one a call (standard): "
          f"{report['batched_over_single_standard']:.3f}")
    return report


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
