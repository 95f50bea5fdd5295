"""Data-parallel training on CPU (gloo): two processes take the single process's steps.

Stage two's loss is per question (its mined negatives; with in-batch ones, the whole batch's classes), so two
processes that each take half of every batch and average their gradients must end with the weights one process gets
from the whole batch. Stage one and NC are run the way `distributed.nproc_per_node: 2` runs them,
through the CLI and torchrun, and must write one model; so must docs/scaling.md's two-node command.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as multiprocessing
from torch import nn

import yaml

from tests.conftest import CLASSES, synthetic_questions, tiny_params, write_custom_dataset
from tests.processes import ended as _ended
from tests.servers import free_port
from tqc import distributed
from tqc.config import ModelParams, StageTwoParams
from tqc.model.encoder import BiEncoder
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion


def _always_better(*_):
    """A validator whose macro-F1 rises every epoch."""
    epochs = iter(range(1000))
    return lambda: {"accuracy": 0.0, "macro_f1": next(epochs) / 1000}


def _stage_two_weights(model_dir: str, batch_size: int = 16, device: str = "cpu", negatives: str = "mined",
                       k: int = 2) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], float]:
    """One epoch of stage two on synthetic rows, dropout off so runs are comparable; the weights before and after,
    and the epoch's training loss as its history records it."""
    from tqc.mining import mine
    from tqc.schema import gold_indices
    from tqc.stages import stage_two

    torch.manual_seed(0)
    catalog = Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()])
    rows = [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 16)]  # 48 rows: 3 batches of 16, halves of 8
    validation = [LabeledQuestion(t, c) for t, c in synthetic_questions(1, 4)]
    model = BiEncoder.from_params(ModelParams(pretrained=model_dir)).to(device)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    mined, _ = mine(model.question.encode([q.text for q in rows]).numpy(), model.standard.encode(catalog.texts).numpy(),
                    gold_indices(rows, catalog), k=k)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    params = StageTwoParams(epochs=1, batch_size=batch_size, learning_rate=1e-3, patience=1, warmup_ratio=0.0,
                            negatives=negatives)
    real_validator, stage_two.bi_encoder_validator = stage_two.bi_encoder_validator, _always_better  # keep the trained epoch
    try:
        fitted = stage_two.train(model, rows, torch.as_tensor(mined), validation, catalog, params, seed=0)
    finally:
        stage_two.bi_encoder_validator = real_validator
    return before, {k: v.detach().clone() for k, v in model.state_dict().items()}, fitted.history[1].train_loss


def _as_torchrun_rank(rank: int, world: int, port: int) -> None:
    """This spawned process's environment as torchrun gives rank `rank` of `world` on one host."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def _worker(rank: int, world: int, port: int, model_dir: str, out_dir: str, batch_size: int = 16,
            negatives: str = "mined", k: int = 2) -> None:
    _as_torchrun_rank(rank, world, port)
    distributed.setup("gloo")
    try:
        assert distributed.active() and distributed.shard(list(range(6))) == list(range(rank, 6, world))
        seen, real_shard = [], distributed.shard
        distributed.shard = lambda rows: seen.extend(real_shard(rows)) or real_shard(rows)  # rows this process trains on
        try:
            _, weights, loss = _stage_two_weights(model_dir, batch_size, negatives=negatives, k=k)
        finally:
            distributed.shard = real_shard
        torch.save({"weights": weights, "rows_seen": len(seen), "loss": loss}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def test_without_torchrun_everything_is_one_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not distributed.active() and distributed.is_main()
    assert distributed.shard([3, 1, 2]) == [3, 1, 2]
    assert distributed.mean_over_processes(1.5) == 1.5
    assert distributed.relaunch_command(1, ["stage-one"]) is None
    command = distributed.relaunch_command(2, ["stage-one", "--out", "m"])
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert command[-4:] == ["tqc.cli", "stage-one", "--out", "m"]
    monkeypatch.setenv("WORLD_SIZE", "2")  # already launched: never launch again
    assert distributed.relaunch_command(2, ["stage-one"]) is None


def test_no_process_of_one_seeds_run_draws_the_stream_of_a_process_of_another(monkeypatch):
    """evaluate.seeds trains with seeds 0, 1, 2, ...: with seed + rank, rank 1 of seed 0 drew rank 0 of seed 1's
    dropout. Rank 0 keeps the seed itself (a one-GPU torchrun draws as one process), and every other (seed, rank) its
    own seed."""
    monkeypatch.setattr(distributed, "active", lambda: True)
    seeds = {}
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        for seed in range(10):
            seeds[seed, rank] = distributed.own_seed(seed)
    assert all(seeds[seed, 0] == seed for seed in range(10))
    assert len(set(seeds.values())) == len(seeds) and all(0 <= value < 2**63 for value in seeds.values())
    monkeypatch.setenv("RANK", "1")
    assert distributed.own_seed(3) == seeds[3, 1]  # the same in every run


@pytest.mark.parametrize("batch_size, rows_seen, negatives, k", [(16, [24, 24], "mined", 2), (13, [26, 22], "mined", 2),
                                                                (4, [24, 24], "mined_and_in_batch", 1)])
def test_two_processes_end_with_the_weights_of_one_process_on_the_whole_batch(tiny_model_dir, tmp_path, batch_size, rows_seen,
                                                                             negatives, k):
    # 13: batches of 13, 13, 13 and 9 rows, so shares of 7 and 6 (5 and 4): each must weigh as many rows as it has.
    # In-batch negatives at shares of 2 rows and K = 1: a share holds fewer of the batch's classes than the batch does,
    # and each process must still score its rows against all of the batch's
    start, single, single_loss = _stage_two_weights(str(tiny_model_dir), batch_size, negatives=negatives, k=k)
    assert any(not torch.equal(start[name], single[name]) for name in single)  # the epoch trained something
    multiprocessing.spawn(_worker, args=(2, free_port(), str(tiny_model_dir), str(tmp_path), batch_size, negatives, k),
                          nprocs=2, join=True)
    saved = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    assert [r["rows_seen"] for r in saved] == rows_seen  # each process trained on its share of the 48 rows
    # the history's loss is the mean over each whole batch, as one process records it: a share's mean weighs its rows
    assert saved[0]["loss"] == saved[1]["loss"] == pytest.approx(single_loss, rel=1e-5)
    replicas = [r["weights"] for r in saved]
    for name, tensor in single.items():
        assert torch.equal(replicas[0][name], replicas[1][name]), f"replicas drifted apart at {name}"
        assert torch.allclose(replicas[0][name], tensor, atol=2e-5), f"{name}: two processes differ from one"
    untouched = [name for name in single if torch.equal(start[name], single[name])]
    assert any("pooler" in name for name in untouched)  # BERT's pooler: no gradient under mean pooling
    for name in untouched:  # was decayed by AdamW in every replica, its gradient an all-reduced zero
        assert torch.equal(replicas[0][name], start[name]), f"{name}: no process reached it, and it moved"


def _ingested_project(tmp_path: Path, tiny_model_dir: Path) -> tuple[Path, dict]:
    """A scratch project on the tiny model and synthetic data, ingested; and an environment not yet under torchrun."""
    project = tmp_path / "project"
    project.mkdir()
    write_custom_dataset(tmp_path / "raw")
    (project / "params.yaml").write_text(yaml.safe_dump(tiny_params(tmp_path / "raw", tiny_model_dir)))
    subprocess.run([sys.executable, "-m", "tqc.cli", "ingest", "--out", "data/ingested", "--quarantine", "q.jsonl",
                    "--report", "ingest.json"], cwd=project, check=True)
    return project, {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}


def _tqc_in_two_processes(project: Path, environment: dict, *arguments: str) -> subprocess.CompletedProcess:
    """`tqc ARGUMENTS` in `project` with distributed.nproc_per_node 2: a training command relaunches itself as two
    gloo processes under torchrun."""
    return subprocess.run([sys.executable, "-m", "tqc.cli", "--set", "distributed.nproc_per_node=2", *arguments],
                          cwd=project, env=environment, capture_output=True, text=True, timeout=300)


def test_the_cli_relaunches_a_training_stage_under_torchrun_and_rank_0_writes(tiny_model_dir, tmp_path):
    """`distributed.nproc_per_node: 2` → `tqc stage-one` runs as two gloo processes; one model folder, one history."""
    project, environment = _ingested_project(tmp_path, tiny_model_dir)
    finished = _tqc_in_two_processes(
        project, environment, "--set", "tracking.enabled=false", "--set", "stage_one.smoothing=0.1", "stage-one",
        "--data", "data/ingested", "--train", "data/ingested/train.jsonl", "--out", "models/stage_one", "--history",
        "history.csv")
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "distributed: 2 processes, backend gloo" in finished.stderr
    # a warning every process would give (a loss setting nt_xent ignores) is said once, by rank 0: it was said twice
    assert finished.stderr.count("stage_one.smoothing is 0.1, and only loss sdml reads it") == 1, finished.stderr[-3000:]
    assert (project / "models/stage_one/tqc_model.json").exists()
    assert len((project / "history.csv").read_text().splitlines()) >= 2


def test_a_relaunched_stage_one_starts_from_the_warm_up_model_in_every_process(tiny_model_dir, tmp_path):
    """`tqc stage-one --warmup` relaunched under torchrun starts from a one-process `tqc warmup`'s model, as
    `dvc repro` and `pipeline.train_chain` pass it, and says so once (rank 0)."""
    import json

    project, environment = _ingested_project(tmp_path, tiny_model_dir)
    settings = ["--set", "tracking.enabled=false", "--set", "warmup.enabled=true", "--set", "warmup.max_steps=2",
                "--set", "warmup.candidates=4", "--set", "warmup.batch_size=8"]
    subprocess.run([sys.executable, "-m", "tqc.cli", *settings, "warmup", "--data", "data/ingested", "--out",
                    "models/warmup", "--report", "warmup.json", "--quarantine", "warmup-quarantine.jsonl"], cwd=project,
                   env=environment, check=True, capture_output=True, timeout=300)
    finished = _tqc_in_two_processes(
        project, environment, *settings, "stage-one", "--data", "data/ingested", "--train", "data/ingested/train.jsonl",
        "--warmup", "models/warmup", "--out", "models/stage_one", "--history", "history.csv")
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "distributed: 2 processes, backend gloo" in finished.stderr
    assert finished.stderr.count("starting from the warm-up's model in models/warmup") == 1, finished.stderr[-3000:]
    saved = json.loads((project / "models/stage_one/tqc_model.json").read_text())
    assert saved["warmed_up_from"] == "models/warmup"


def _without_dropout(model_dir: Path, folder: Path) -> Path:
    """A copy of the tiny model with its dropout off, so that runs in one process and in two compare weight for weight
    (each process draws its own dropout)."""
    import json
    import shutil

    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.0,
                                                    "attention_probs_dropout_prob": 0.0}))
    return folder


WARM_UP_SETTINGS = {"tracking": {"enabled": False},
                    "warmup": {"enabled": True, "max_steps": 2, "candidates": 4, "batch_size": 8, "learning_rate": 1e-3}}


def test_the_cli_relaunches_the_warm_up_under_torchrun_and_two_processes_end_with_one_processs_weights(
        tiny_model_dir, tmp_path):
    """`tqc warmup` trained in one process whatever distributed.nproc_per_node said. It is relaunched as two gloo
    processes now, rank 0 writes its model and report once, and since its triplet loss is per triplet, two processes
    that each take half of every batch end where one process ends on the whole batch (dropout off). To float error,
    which AdamW's first steps magnify where a gradient is near zero (each divides by the gradient's own size): a
    word's embedding ended 8.5e-5 apart on this machine, where a step is up to 1e-3 (learning_rate)."""
    import json

    from safetensors.torch import load_file

    from tqc.config import load_params
    from tqc.stages import warmup

    project, environment = _ingested_project(tmp_path, _without_dropout(tiny_model_dir, tmp_path / "no-dropout"))
    settings = [part for key, value in (("tracking.enabled", "false"), *(
        (f"warmup.{name}", str(value).lower()) for name, value in WARM_UP_SETTINGS["warmup"].items()))
        for part in ("--set", f"{key}={value}")]
    finished = _tqc_in_two_processes(
        project, environment, *settings, "warmup", "--data", "data/ingested", "--out", "models/warmup", "--report",
        "warmup.json", "--quarantine", "warmup-quarantine.jsonl")
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "distributed: 2 processes, backend gloo" in finished.stderr
    assert finished.stderr.count("warm-up: wrote models/warmup and warmup.json") == 1, finished.stderr[-3000:]
    report = json.loads((project / "warmup.json").read_text())
    assert report["epochs"] == 1 and report["triplets"]["token"] > 0

    params = load_params(project / "params.yaml", WARM_UP_SETTINGS)
    data = project / "data/ingested"
    warmup.run(data, params.model, params.warmup, params.data, params.seed, tmp_path / "one", tmp_path / "one.json",
               tmp_path / "one-quarantine.jsonl")
    assert json.loads((tmp_path / "one.json").read_text())["triplets"] == report["triplets"]  # rank 0's, trained by both
    for encoder in ("question_encoder", "standard_encoder"):
        one, two = (load_file(folder / encoder / "model.safetensors") for folder in (tmp_path / "one", project / "models/warmup"))
        for name, tensor in one.items():
            assert torch.allclose(two[name], tensor, atol=2e-4), f"{encoder} {name}: two processes differ from one"
    start = load_file(tmp_path / "no-dropout" / "model.safetensors")
    assert any(not torch.equal(one[name], start[name.removeprefix("bert.")]) for name in one)  # it trained something


def test_tqc_warmup_is_launched_under_torchrun_as_the_other_stages_only_when_it_is_on(tmp_path, monkeypatch):
    """On, it checks its inputs and relaunches itself as the training stages do; off, it launches nothing and makes no
    tracked run: it writes its skip record, once, in this process (another rank of a user's torchrun writes none)."""
    from tqc import cli
    from tqc.config import WarmupParams
    from tqc.model.warm_start import SKIP_RECORD
    from tqc.stages import warmup

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    launched = []
    monkeypatch.setattr(cli, "_launch", lambda command, processes: launched.append((command, processes)) or 0)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"distributed": {"nproc_per_node": 2},
                                                          "warmup": {"enabled": True}, "tracking": {"enabled": False}}))
    paths = ["--out", str(tmp_path / "warmup"), "--report", str(tmp_path / "warmup.json"), "--quarantine",
             str(tmp_path / "quarantine.jsonl")]
    argv = ["--params", str(tmp_path / "params.yaml"), "warmup", "--data", str(tmp_path), *paths]
    with pytest.raises(SystemExit) as ended:
        cli.main(argv)
    assert ended.value.code == 0 and launched == [(distributed.relaunch_command(2, argv), 2)]
    launched.clear()
    missing = ["--params", str(tmp_path / "params.yaml"), "warmup", "--data", str(tmp_path / "nowhere"), *paths]
    assert cli.main(missing) == 2 and launched == []  # said once here, not as every process's traceback

    monkeypatch.setattr(cli, "stage_run", lambda *args: pytest.fail("a tracked run of a warm-up that trained nothing"))
    assert cli.main(["--set", "warmup.enabled=false", *argv]) == 0 and launched == []
    assert [p.name for p in (tmp_path / "warmup").iterdir()] == [SKIP_RECORD]

    monkeypatch.setattr(distributed, "rank", lambda: 1)
    warmup.run(tmp_path, None, WarmupParams(), None, 0, tmp_path / "rank-1", tmp_path / "rank-1.json", tmp_path / "rank-1.jsonl")
    assert not any((tmp_path / name).exists() for name in ("rank-1", "rank-1.json", "rank-1.jsonl"))


def test_an_input_error_in_a_relaunched_stage_ends_the_command_on_its_line_with_status_2(tiny_model_dir, tmp_path):
    """Found once torchrun had started (a training row of a class the catalog lacks), it exited 1, as a crash does,
    after torchrun's 30-line summary; one process says it and exits 2."""
    import json

    project, environment = _ingested_project(tmp_path, tiny_model_dir)
    with (project / "data/ingested/train.jsonl").open("a") as train:
        train.write(json.dumps({"text": "a stray question", "class_id": "nowhere", "source": "x:1", "generated": False}) + "\n")
    finished = _tqc_in_two_processes(
        project, environment, "--set", "tracking.enabled=false", "stage-one", "--data", "data/ingested", "--train",
        "data/ingested/train.jsonl", "--out", "models/stage_one", "--history", "history.csv")
    assert finished.returncode == 2, finished.stderr[-3000:]
    assert finished.stderr.strip().splitlines()[-1].startswith("tqc stage-one: error: UnknownClass: question "), \
        finished.stderr[-3000:]
    assert not (project / "models/stage_one").exists()


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_relaunched_stage_stopped_with_sigterm_stops_its_torchrun_and_its_processes(tiny_model_dir, tmp_path):
    """`kill` of `tqc stage-one` (distributed.nproc_per_node: 2) ended it alone: its torchrun, left to init, and both
    processes trained on and wrote the model after it. It now asks torchrun to stop them (SIGTERM), and exits 143."""
    import signal

    project, environment = _ingested_project(tmp_path, tiny_model_dir)
    said = tmp_path / "stderr.txt"  # a file, not a pipe: processes that outlive the command would hold a pipe open
    with said.open("w") as stderr:
        stage = subprocess.Popen(
            [sys.executable, "-m", "tqc.cli", "--set", "distributed.nproc_per_node=2", "--set", "tracking.enabled=false",
             "--set", "stage_one.epochs=100000", "--set", "stage_one.patience=100000", "stage-one", "--data",
             "data/ingested", "--train", "data/ingested/train.jsonl", "--out", "models/stage_one", "--history", "history.csv"],
            cwd=project, env={**environment, "PYTHONUNBUFFERED": "1"}, stderr=stderr)
    launched = []
    try:
        deadline = time.monotonic() + 240
        while "stage one: epoch 1 loss" not in said.read_text() and stage.poll() is None:  # until the processes train
            assert time.monotonic() < deadline, said.read_text()[-3000:]
            time.sleep(0.2)
        launched = [pid for torchrun in _children(stage.pid) for pid in (torchrun, *_children(torchrun))]
        assert len(launched) == 3, said.read_text()[-3000:]  # torchrun and its two processes
        stage.send_signal(signal.SIGTERM)
        stage.wait(timeout=120)
        deadline = time.monotonic() + 60  # torchrun's own grace for its processes is 30 s
        while not all(_ended(pid) for pid in launched) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(_ended(pid) for pid in launched), "torchrun or a process of its trained on without its command"
        assert stage.returncode == 128 + signal.SIGTERM
        assert not (project / "models/stage_one").exists()
    finally:
        stage.kill()
        for pid in launched:
            if not _ended(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_readmes_multi_node_command_trains_as_one_job_of_two_nodes(tiny_model_dir, tmp_path):
    """docs/scaling.md "Several GPUs": two nodes rendezvous through c10d (here two torchruns on one host, one process each);
    each gets its own rank, they train as one job of two processes, and global rank 0 alone writes."""
    project, environment = _ingested_project(tmp_path, tiny_model_dir)
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
            "--rdzv_backend", "c10d", "--rdzv_id", "tqc", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
            "-m", "tqc.cli", "--set", "tracking.enabled=false", "stage-one", "--data", "data/ingested",
            "--train", "data/ingested/train.jsonl", "--out", "models/stage_one", "--history", "history.csv"]
    nodes = [subprocess.Popen(node, cwd=project, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        logs = [process.communicate(timeout=300)[1] for process in nodes]
    finally:
        for process in nodes:
            process.kill()
    assert [process.returncode for process in nodes] == [0, 0], "\n".join(log[-2000:] for log in logs)
    assert sum("distributed: 2 processes, backend gloo" in log for log in logs) == 1  # logged by global rank 0 only
    assert (project / "models/stage_one/tqc_model.json").exists()
    assert len((project / "history.csv").read_text().splitlines()) >= 2


def test_what_would_fail_in_every_process_is_one_line_before_torchrun_starts(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import pytest

    from tqc import cli

    write_custom_dataset(tmp_path / "raw")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(tmp_path / "raw", tiny_model_dir)))
    monkeypatch.setattr(cli, "_launch", lambda command, processes: pytest.fail(f"torchrun started: {command}"))
    stage_one = ["--params", str(tmp_path / "params.yaml"), "--set", "distributed.nproc_per_node=2", "stage-one",
                 "--train", str(tmp_path / "nope.jsonl"), "--data", str(tmp_path), "--out", str(tmp_path / "m"),
                 "--history", str(tmp_path / "h.csv")]
    assert cli.main(stage_one) == 2  # was torchrun's 48-line ChildFailedError around the one line below
    assert f"--train {tmp_path / 'nope.jsonl'}: no such file or folder" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli.main(stage_one[:4] + ["--set", "distributed.backend=nccl"] + stage_one[4:]) == 2
        assert "distributed.backend is 'nccl', which needs a CUDA device" in capsys.readouterr().err
    # On a one-GPU machine two processes would both need a GPU of their own (the second: "invalid device ordinal")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert cli.main(stage_one) == 2
    assert "distributed.nproc_per_node is 2, and this machine has 1 CUDA device(s)" in capsys.readouterr().err


def test_a_process_other_than_rank_0_logs_only_errors_and_draws_no_progress_bar(tiny_model_dir, monkeypatch, capsys):
    """Every rank warned rank 0's warnings again and drew its bars again (loading the weights, encoding for validation)."""
    import logging

    import torch.distributed as dist
    from transformers.utils import logging as transformers_logging

    from tqc.model.encoder import TextEncoder

    encoder = TextEncoder.from_pretrained(str(tiny_model_dir), "mean", 16)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal's: a bar is drawn on no other
    encoder.encode(["a question", "another one", "a third"], batch_size=1, description="encoding as rank 0")
    assert "encoding as rank 0" in capsys.readouterr().err  # the bar as one process, or rank 0, draws it
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: None)  # joined, as torchrun's rank 1 would be
    tqc_logger, level = logging.getLogger("tqc"), logging.getLogger("tqc").level
    try:
        distributed.setup("gloo")
        assert not logging.getLogger("tqc.training").isEnabledFor(logging.WARNING)
        assert logging.getLogger("tqc.training").isEnabledFor(logging.ERROR)
        assert not transformers_logging.is_progress_bar_enabled()  # "Loading weights", once a model
        encoder.encode(["a question", "another one", "a third"], batch_size=1, description="encoding as rank 1")
        assert "encoding as rank 1" not in capsys.readouterr().err
    finally:
        tqc_logger.setLevel(level)
        transformers_logging.enable_progress_bar()


def test_a_local_rank_without_a_gpu_of_its_own_is_named(monkeypatch):
    import pytest

    from tqc import distributed
    from tqc.config import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: pytest.fail(f"set_device({index}) reached"))
    with pytest.raises(ConfigError, match="LOCAL_RANK is 2, and this node has 2 CUDA device"):
        distributed.setup("auto")


def _hanging_peer_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Joined through the stage commands' own path (`cli._join_or_launch`) with distributed.timeout_minutes 0.05 (3 s):
    rank 1 hangs (alive, in no collective, as a stuck process of another node), rank 0 all-reduces."""
    import argparse

    from tqc import cli
    from tqc.config import Params

    _as_torchrun_rank(rank, world, port)
    said = Path(out_dir) / "rank0.txt"
    cli._join_or_launch(Params().with_overrides({"distributed": {"backend": "gloo", "timeout_minutes": 0.05}}),
                        argparse.Namespace(argv=["stage-one"], command="stage-one"))
    if rank == 0:
        try:
            distributed.mean_over_processes(1.0)
            said.write_text("returned")
        except Exception as exc:  # noqa: BLE001 (whatever gloo raises: its type and message are what is checked)
            said.write_text(f"{type(exc).__name__}: {exc}")
    else:
        deadline = time.monotonic() + 120
        while not said.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    os._exit(0)  # no teardown: the group is broken, and its barrier would wait again


def test_a_collective_fails_after_distributed_timeout_minutes_where_another_process_hangs(tmp_path):
    """tqc passed init_process_group 30 minutes, whatever the run: a process of a multi-node job whose peer died or hung
    waited that long (NCCL's own default is 10). distributed.timeout_minutes sets it; gloo keeps to it too."""
    context = multiprocessing.spawn(_hanging_peer_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 120
    try:
        while not context.join(timeout=5):
            assert time.monotonic() < deadline, "rank 0 still waits for its hanging peer"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    said = (tmp_path / "rank0.txt").read_text()
    assert said != "returned" and "timed out" in said.lower(), said


def test_distributed_timeout_minutes_is_the_process_groups_timeout(monkeypatch):
    from datetime import timedelta

    import torch.distributed as dist

    from tqc.config import ConfigError, Params

    assert Params().distributed.timeout_minutes == 30  # as before, torch's own default for gloo
    for wrong in (0, -1, "soon", 1e13):  # 1e13: more than a timedelta holds, OverflowError in every process's setup
        with pytest.raises(ConfigError, match="timeout_minutes"):
            Params().with_overrides({"distributed": {"timeout_minutes": wrong}})
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    joined = []
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **options: joined.append((backend, options)))
    distributed.setup("auto", 2.5)
    assert joined == [("gloo", {"timeout": timedelta(minutes=2.5)})]


def _early_stopping_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """`fit` on a linear model whose validation figures differ by process: rank 0's rise every epoch,
    rank 1's fall (its own would stop it after epoch 1, patience 1)."""
    from tqc.config import Schedule
    from tqc.training import fit

    _as_torchrun_rank(rank, world, port)
    distributed.setup("gloo")
    try:
        torch.manual_seed(0)
        model, inputs = nn.Linear(4, 1), torch.randn(8, 4)  # (rows, features)
        epochs = iter(range(1000))
        validate = lambda: {"accuracy": 0.0, "macro_f1": (1 if rank == 0 else -1) * next(epochs) / 1000}  # noqa: E731
        result = fit(model, [{"params": list(model.parameters()), "lr": 0.1}], lambda rows: model(inputs[rows]).pow(2).mean(),
                     len(inputs), validate, Schedule(epochs=3, batch_size=4, patience=1), seed=0, description="toy")
        torch.save({"epochs_run": len(result.history) - 1, "best_epoch": result.best_epoch}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def test_every_process_takes_rank_0s_early_stopping_choice(tmp_path):
    """Each process's own validation figure may differ (kernels not bitwise reproducible across GPUs); a process
    that stopped alone would leave the others waiting in their next all-reduce. Rank 0's figures decide for all."""
    context = multiprocessing.spawn(_early_stopping_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 120
    try:
        while not context.join(timeout=5):  # False while a process still runs (join returns as each one exits)
            assert time.monotonic() < deadline, "the processes hung: one stopped training while another went on"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    saved = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    assert saved[0] == saved[1] == {"epochs_run": 3, "best_epoch": 3}  # rank 0's rising figures: every epoch kept


def _non_finite_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """`fit` on a linear model whose loss is NaN in rank 1 alone, at its second step: rank 0's is finite there."""
    from tqc.config import Schedule
    from tqc.training import fit

    _as_torchrun_rank(rank, world, port)
    distributed.setup("gloo")
    try:
        torch.manual_seed(0)
        model, inputs, calls = nn.Linear(4, 1), torch.randn(8, 4), []  # (rows, features)

        def batch_loss(rows):
            calls.append(rows)
            loss = model(inputs[rows]).pow(2).mean()
            return loss * float("nan") if rank == 1 and len(calls) == 2 else loss

        epochs = iter(range(1000))  # a gain every epoch: the last epoch's weights are kept
        fit(model, [{"params": list(model.parameters()), "lr": 0.1}], batch_loss, len(inputs),
            lambda: {"accuracy": 0.0, "macro_f1": next(epochs) / 1000}, Schedule(epochs=2, batch_size=4, patience=5),
            seed=0, description="toy")
        torch.save({"weights": model.state_dict(), "steps": len(calls)}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def test_a_step_whose_loss_is_not_finite_in_one_process_is_skipped_by_every_process(tmp_path):
    """A process that skipped a step alone would pair its next gradient all-reduce with the others' current one (or
    spread its NaN into every process's weights, had it stepped): every process skips it, and all end alike."""
    multiprocessing.spawn(_non_finite_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    saved = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    assert saved[0]["steps"] == saved[1]["steps"] == 4  # 2 epochs of 8 rows in batches of 4
    assert all(torch.isfinite(v).all() for v in saved[0]["weights"].values())
    assert all(torch.equal(v, saved[1]["weights"][k]) for k, v in saved[0]["weights"].items())


def test_a_training_set_too_small_to_give_every_process_two_rows_is_one_line_before_training(monkeypatch):
    """Batch sizes are checked at load, but 3 rows on 2 processes made one batch of 3: a process trained on one row (no
    negative, a loss of 0) without a word; 1 row left rank 1 none, and it failed alone with the tokenizer's IndexError
    inside torchrun's summary."""
    from tqc.config import ConfigError, Schedule
    from tqc.training import fit

    model, inputs = nn.Linear(4, 1), torch.randn(4, 4)  # (rows, features)
    steps = []

    def train(rows: int):
        return fit(model, [{"params": list(model.parameters()), "lr": 0.1}],
                   lambda share: steps.append(share) or model(inputs[share]).pow(2).mean(), rows, _always_better(),
                   Schedule(epochs=1, batch_size=16), seed=0, description="stage one")

    monkeypatch.setenv("WORLD_SIZE", "2")  # checked first, before any collective: no process group needed
    for rows in (1, 3):
        with pytest.raises(ConfigError, match=rf"^stage one: {rows} training row\(s\) for 2 processes \(the world size\): "
                                              r".* at least 4 rows; train on more rows, or in at most 1 process"):
            train(rows)
    assert steps == []
    train(4)  # two rows each
    monkeypatch.setenv("WORLD_SIZE", "1")
    train(1)  # one process: as before
    assert [len(share) for share in steps] == [4, 1]


def _dropout_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """`fit` one step on a linear model with dropout, every process seeded alike (as `seed_everything(seed)` leaves
    them); the dropout mask each process drew on its share."""
    from tqc.config import Schedule
    from tqc.training import fit

    _as_torchrun_rank(rank, world, port)
    distributed.setup("gloo")
    try:
        torch.manual_seed(0)
        model, inputs, masks = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5)), torch.randn(8, 16), []  # (rows, features)

        def batch_loss(rows):
            out = model(inputs[rows])  # (share, 16)
            masks.append(out == 0)
            return out.pow(2).mean()

        fit(model, [{"params": list(model.parameters()), "lr": 0.1}], batch_loss, len(inputs), _always_better(),
            Schedule(epochs=1, batch_size=8), seed=0, description="toy")
        torch.save(masks[0], Path(out_dir) / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def test_each_process_draws_its_own_dropout(tmp_path):
    """Every process was seeded alike, so the two halves of a batch got the same dropout masks, row for row (and the
    same embedding cutoff): half the noise one process gives a batch. Each process now draws from a stream of its own."""
    multiprocessing.spawn(_dropout_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    masks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    assert masks[0].shape == masks[1].shape == (4, 16) and masks[0].any()
    assert not torch.equal(masks[0], masks[1])


class _Drawn(Exception):
    """Stops a term once it handed its random stream over."""


def _first_draws(monkeypatch, rank: int, world: int, seed: int = 7) -> tuple[list[int], list[float]]:
    """The first draws of stage one's prototype mixup generator and cross-encoding rng, as process `rank` of `world`
    seeds them: each term is built and called once, its stream caught where it is handed on."""
    from types import SimpleNamespace

    from tqc.config import CrossEncodingParams, PrototypeMixupParams
    from tqc.schema import Catalog, StandardQuestion
    from tqc.stages import stage_one

    monkeypatch.setattr(distributed, "active", lambda: world > 1)
    monkeypatch.setattr(distributed, "rank", lambda: rank)
    drawn = {}

    def balanced_set(*args, **options):  # (questions, gold, prototypes, per_class, share, hard_k, beta, generator)
        drawn["mixup"] = torch.randint(0, 2**30, (4,), generator=args[7]).tolist()
        raise _Drawn

    def joined_inputs(*args, **options):  # (texts, gold, candidates, standards, separator, share, negatives, rng, fit)
        drawn["cross"] = [args[7].random() for _ in range(4)]
        raise _Drawn

    monkeypatch.setattr(stage_one, "balanced_set", balanced_set)
    monkeypatch.setattr(stage_one, "joined_inputs", joined_inputs)
    encoder = SimpleNamespace(tokenizer=SimpleNamespace(sep_token="[SEP]"), max_length=16)
    model = SimpleNamespace(similarity="cosine", question=encoder)
    mixup = stage_one._prototype_mixup_term(model, None, PrototypeMixupParams(enabled=True), 10, seed)
    cross = stage_one._cross_encoding_term(model, None, CrossEncodingParams(enabled=True),
                                           Catalog([StandardQuestion("a", "A?"), StandardQuestion("b", "B?")]), seed)
    with pytest.raises(_Drawn):
        mixup(torch.randn(4, 8), torch.tensor([0, 1, 0, 1]), torch.randn(2, 8))  # (B, D), (B,), (P, D)
    with pytest.raises(_Drawn):
        cross(["a?", "b?"], torch.tensor([0, 1]), torch.tensor([0, 1]), torch.randn(2, 8))
    return drawn["mixup"], drawn["cross"]


def test_each_process_draws_its_own_mixup_partners_and_joined_pairs(monkeypatch):
    """Prototype mixup's generator and cross-encoding's rng were seeded alike in every process, so each drew the same
    partners and joined pairs for its share as the others did for theirs. Each process now draws from its own seed (own_seed);
    one process, and rank 0, draw exactly what one process drew before (the seed's own streams)."""
    import random

    one = _first_draws(monkeypatch, 0, 1)
    assert one == (torch.randint(0, 2**30, (4,), generator=torch.Generator().manual_seed(7)).tolist(),
                   [stream.random() for stream in [random.Random(7)] for _ in range(4)])
    assert _first_draws(monkeypatch, 0, 2) == one
    own = _first_draws(monkeypatch, 1, 2)
    assert own[0] != one[0] and own[1] != one[1]


def test_a_disabled_nc_baseline_is_not_launched_under_torchrun_and_only_rank_0_writes_its_marker(tmp_path, monkeypatch):
    """Every process used to write the marker folder at once: two renames of one folder, and one process failed. It
    makes no tracked run either, as the disabled warm-up makes none: it trained nothing (it made an empty one)."""
    from tqc import cli
    from tqc.config import BaselineNCParams
    from tqc.stages import baseline_nc

    monkeypatch.setattr(cli, "_launch", lambda command, processes: pytest.fail(f"launched {command}"))
    monkeypatch.setattr(cli, "stage_run", lambda *args: pytest.fail("a tracked run of an NC baseline that trained nothing"))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"distributed": {"nproc_per_node": 2},
                                                          "baseline_nc": {"enabled": False}, "tracking": {"enabled": False}}))
    cli.main(["--params", str(tmp_path / "params.yaml"), "baseline-nc", "--data", str(tmp_path), "--train",
              str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "nc"), "--history", str(tmp_path / "nc.csv")])
    assert (tmp_path / "nc" / baseline_nc.DISABLED_MARKER).exists()

    monkeypatch.setattr(distributed, "rank", lambda: 1)  # another process of a user's own torchrun
    baseline_nc.run(tmp_path, tmp_path / "train.jsonl", None, None, BaselineNCParams(enabled=False), 0,
                    tmp_path / "nc-rank-1", tmp_path / "nc-rank-1.csv")
    assert not (tmp_path / "nc-rank-1").exists() and not (tmp_path / "nc-rank-1.csv").exists()


def test_a_users_torchrun_over_several_nodes_is_checked_for_two_rows_a_process(monkeypatch):
    """distributed.nproc_per_node stays 1 under a torchrun the user starts over nodes: 16 processes of a batch of 16
    left each one row, and a one-row stage-one process has no in-batch negative."""
    import argparse

    import pytest

    from tqc import cli, distributed
    from tqc.config import ConfigError, Params

    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setattr(distributed, "setup", lambda backend, timeout_minutes: None)  # joined, as torchrun's processes would be
    params = Params().with_overrides({"stage_one": {"batch_size": 16}})
    with pytest.raises(ConfigError, match=r"the world size \(WORLD_SIZE\) is 16, .* stage_one.batch_size \(16\) to at least 32"):
        cli._join_or_launch(params, argparse.Namespace(argv=["stage-one"], command="stage-one"))
    monkeypatch.setenv("WORLD_SIZE", "32")
    # each command is checked on its own batches: a stage-one launch of 32 processes with 64 rows is fine, whatever
    # stage two's 32 would need under a launch of its own
    cli._join_or_launch(Params().with_overrides({"stage_one": {"batch_size": 64}, "stage_two": {"batch_size": 32}}),
                        argparse.Namespace(argv=["stage-one"], command="stage-one"))


def test_a_stage_asked_for_more_processes_than_its_launcher_gave_says_so(monkeypatch, caplog):
    """WORLD_SIZE=1 in the environment (a job launcher's) made `tqc stage-one` under distributed.nproc_per_node: 2
    train in one process without a word, where the retrain chain says it."""
    import argparse

    from tqc import cli, distributed
    from tqc.config import Params

    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(distributed, "setup", lambda backend, timeout_minutes: None)
    with caplog.at_level("WARNING"):
        cli._join_or_launch(Params().with_overrides({"distributed": {"nproc_per_node": 2}}),
                            argparse.Namespace(argv=["stage-one"], command="stage-one"))
    assert "distributed.nproc_per_node is 2, and this process is already one of a launcher's 1 (WORLD_SIZE)" in caplog.text
    caplog.clear()
    monkeypatch.setenv("WORLD_SIZE", "4")  # a launcher's 4 processes of 8 asked: rank 0 says it, the others do not
    monkeypatch.setenv("RANK", "3")
    cli._join_or_launch(Params().with_overrides({"distributed": {"nproc_per_node": 8}}),
                        argparse.Namespace(argv=["stage-one"], command="stage-one"))
    assert "nproc_per_node" not in caplog.text
    monkeypatch.setenv("RANK", "0")
    cli._join_or_launch(Params().with_overrides({"distributed": {"nproc_per_node": 8}}),
                        argparse.Namespace(argv=["stage-one"], command="stage-one"))
    assert "nproc_per_node is 8, and this process is already one of a launcher's 4" in caplog.text
    caplog.clear()
    monkeypatch.setenv("WORLD_SIZE", "16")  # a user's torchrun over nodes, 8 a node: as asked
    cli._join_or_launch(Params().with_overrides({"distributed": {"nproc_per_node": 8}}),
                        argparse.Namespace(argv=["stage-one"], command="stage-one"))
    assert "nproc_per_node" not in caplog.text


def test_the_chain_of_a_retrain_or_an_extra_seed_trains_each_stage_as_torchrun_processes(tiny_model_dir, tmp_path, monkeypatch,
                                                                                           caplog):
    """`distributed.nproc_per_node: 2` used to reach only the dvc stages: the retrain flow and evaluate's extra seeds
    trained in one process and warned. Their chain now launches each training stage's CLI command under torchrun
    with the chain's own seed, and its caller gets the fit and every epoch back from the stage's history file, and
    the processes' lines in its own log (a flow run's logs, not only the worker's console). The warm-up too: it trained
    in the chain's one process; launched, it reads its pool file under data.data_dir from the chain's params file."""
    import json

    from tqc.config import Params
    from tqc.pipeline import prepare_data, train_chain
    from tqc.stages import baseline_nc
    from tqc.training import read_history

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    write_custom_dataset(tmp_path / "raw")
    (tmp_path / "raw" / "unlabelled.csv").write_text("text\nwhere is the old castle\nwho invented tea\n")
    # data.data_dir relative, as params.yaml ships it: the launched commands read params.launched.yaml from the chain's
    # folder, and once read warmup.unlabelled from there (`tqc --params` resolves a relative folder from its file's)
    monkeypatch.chdir(tmp_path)
    params = Params.model_validate(tiny_params(Path("raw"), tiny_model_dir)).with_overrides(
        {"distributed": {"nproc_per_node": 2}, "tracking": {"enabled": False, "uri": "postgresql://user:secret@db/mlflow"},
         "baseline_nc": {"enabled": False}, **WARM_UP_SETTINGS,
         "warmup": {**WARM_UP_SETTINGS["warmup"], "unlabelled": "unlabelled.csv"}})
    data = prepare_data(params, tmp_path / "work")
    epochs_seen = []
    with caplog.at_level("INFO", logger="tqc.pipeline"):
        outputs = train_chain(params, data.directory, data.train, tmp_path / "chain", seed=3,
                              on_epoch=lambda stage, record: epochs_seen.append((stage, record.epoch)))
    said = [r.getMessage() for r in caplog.records if r.name == "tqc.pipeline"]
    for command in ("warmup", "stage-one", "stage-two"):  # the disabled NC: never launched
        assert sum(line.startswith(f"{command}: ") and "distributed: 2 processes, backend gloo" in line
                   for line in said) == 1, said
    assert any(line.startswith("stage-two: ") and "stage two: kept epoch" in line for line in said), said
    assert (outputs.stage_one / "tqc_model.json").exists() and (outputs.stage_two / "tqc_model.json").exists()
    assert (outputs.nc / baseline_nc.DISABLED_MARKER).exists()
    assert json.loads((tmp_path / "chain" / "reports" / "warmup.json").read_text())["rows_read"] == 2 + len(
        (data.directory / "train.jsonl").read_text().splitlines())  # the pool file's rows, and the training questions
    assert json.loads((outputs.stage_one / "tqc_model.json").read_text())["warmed_up_from"] == str(tmp_path / "chain" / "warmup")
    assert epochs_seen == [("stage_one", 0), ("stage_one", 1), ("stage_two", 0), ("stage_two", 1)]
    written = read_history(tmp_path / "chain" / "stage_two.csv")  # by rank 0
    assert outputs.fits["stage_two"].best_validation_macro_f1 == max(record.validation_macro_f1 for record in written)
    launched = json.loads((tmp_path / "chain" / "params.launched.yaml").read_text())
    assert launched["data"]["data_dir"] == str(tmp_path / "raw")
    assert launched["seed"] == 3 and launched["tracking"]["enabled"] is False  # the chain's seed; its caller tracks
    assert "secret" not in json.dumps(launched)  # no tracking URI or tune storage written to disk


def test_a_launch_that_fails_says_its_processes_last_lines_and_logs_every_line(tmp_path, monkeypatch, caplog):
    """It used to point at "this process's standard error", which in a flow run on a worker nobody reads."""
    import sys

    from tqc import distributed
    from tqc.pipeline import StageLaunchFailed, _Launcher
    from tqc.training_commands import STAGE_ONE

    # as torchrun writes it: a rank's traceback, then 25 lines of torchrun's own summary after it
    crash = ("import sys\nprint('stage one: epoch 1', flush=True)\n"
             "sys.stderr.write('Traceback (most recent call last):\\n  File x\\nRuntimeError: out of memory\\n')\n"
             "sys.stderr.flush(); print('a rank writing on', flush=True)\n"
             "sys.stderr.write('torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \\n')\n"
             "sys.stderr.write(''.join(f'summary line {i}\\n' for i in range(25)))\nsys.stderr.flush()\n"
             "print('the last line, on stdout', flush=True)\nsys.exit(1)")
    monkeypatch.setattr(distributed, "relaunch_command", lambda processes, arguments: [sys.executable, "-c", crash])
    with caplog.at_level("INFO", logger="tqc.pipeline"), pytest.raises(StageLaunchFailed) as failed:
        _Launcher(tmp_path / "params.launched.yaml", 2)(STAGE_ONE, {"history": tmp_path / "h.csv"}, None)
    message = str(failed.value)
    # stdout's lines too, in the order written: the message's last lines were standard error's alone
    assert "exited with status 1" in message and message.endswith("summary line 24\nthe last line, on stdout")
    assert "their errors:\n  RuntimeError: out of memory\n  torch.distributed.elastic" in message  # the rank's cause
    said = [r.getMessage() for r in caplog.records if r.name == "tqc.pipeline"]
    assert "stage-one: stage one: epoch 1" in said and "stage-one: RuntimeError: out of memory" in said
    # stdout and stderr in one stream: in the order written, in the log as in the message
    order = [line for line in said if line in ("stage-one: stage one: epoch 1", "stage-one: RuntimeError: out of memory",
                                               "stage-one: a rank writing on")]
    assert order == ["stage-one: stage one: epoch 1", "stage-one: RuntimeError: out of memory", "stage-one: a rank writing on"]


def test_launched_processes_share_the_cores_unless_the_user_set_omp_num_threads(tmp_path, monkeypatch):
    """torchrun sets OMP_NUM_THREADS=1 where it is unset: 2 gloo processes on 8 cores trained on 2 of them. The stage
    command's launch and the chain's both start torchrun with each process's share of one process's threads."""
    from tqc import cli
    from tqc.pipeline import StageLaunchFailed, _Launcher
    from tqc.training_commands import STAGE_ONE

    said = tmp_path / "threads"
    launched = [sys.executable, "-c", f"import os, sys; open({str(said)!r}, 'w').write(os.environ['OMP_NUM_THREADS']); sys.exit(1)"]
    monkeypatch.setattr(distributed, "relaunch_command", lambda processes, arguments: launched)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)  # a thread a core, as one process would use
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for threads, processes in (("4", 2), ("2", 3), ("1", 16)):  # at least one
        assert cli._launch(launched, processes) == 1 and said.read_text() == threads
        said.unlink()  # the stage's launch writes it anew: the command's value left there would pass for it
        with pytest.raises(StageLaunchFailed):
            _Launcher(tmp_path / "params.launched.yaml", processes)(STAGE_ONE, {"history": tmp_path / "h.csv"}, None)
        assert said.read_text() == threads
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's, even torchrun's own choice: kept
    assert cli._launch(launched, 2) == 1 and said.read_text() == "1"
    said.unlink()
    with pytest.raises(StageLaunchFailed):
        _Launcher(tmp_path / "params.launched.yaml", 2)(STAGE_ONE, {"history": tmp_path / "h.csv"}, None)
    assert said.read_text() == "1"


def test_a_chain_already_inside_torchrun_or_asked_for_one_process_launches_nothing(monkeypatch, tmp_path, caplog):
    from tqc.config import Params
    from tqc.pipeline import _launcher

    params = Params.model_validate({"distributed": {"nproc_per_node": 2}, "tracking": {"enabled": False}})
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert _launcher(params, 0, tmp_path, processes=1) is None  # the tuner's trials
    monkeypatch.setenv("WORLD_SIZE", "1")  # a job launcher's, say: said, not silently one process
    with caplog.at_level("WARNING"):
        assert _launcher(params, 0, tmp_path, processes=2) is None
    assert "2 processes asked for, and this process is already one of a torchrun's (WORLD_SIZE=1)" in caplog.text
    assert not (tmp_path / "params.launched.yaml").exists()


@pytest.mark.parametrize("processes", [1, 2])
def test_a_chain_in_a_rank_of_a_torchrun_that_joined_no_group_is_refused(monkeypatch, tmp_path, processes):
    """evaluate.seeds > 1 under a torchrun the user started: each rank trained the whole chain unsharded (no group was
    joined), and every rank but 0 saved no stage-one model, so its mining failed to load one."""
    from tqc.config import ConfigError, Params
    from tqc.pipeline import _launcher

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    params = Params.model_validate({"distributed": {"nproc_per_node": processes}, "tracking": {"enabled": False}})
    with pytest.raises(ConfigError, match=r"one of a torchrun's \(WORLD_SIZE=2\), and a training chain runs in one "
                                          r"process: run this command without torchrun"):
        _launcher(params, 0, tmp_path, processes=processes)


def test_a_launched_stage_stopped_by_an_input_error_raises_it_as_one_so_the_retrain_flow_does_not_retry_it(
        tiny_model_dir, tmp_path, monkeypatch):
    """torchrun exits 1 whatever stopped its processes: a class the catalog lacks read as a crash, retried twice."""
    import json

    from tqc.config import Params
    from tqc.errors import input_errors
    from tqc.launched import LaunchedInputError
    from tqc.pipeline import prepare_data, train_chain

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    write_custom_dataset(tmp_path / "raw")
    params = Params.model_validate(tiny_params(tmp_path / "raw", tiny_model_dir)).with_overrides(
        {"distributed": {"nproc_per_node": 2}, "tracking": {"enabled": False}})
    data = prepare_data(params, tmp_path / "work")
    with data.train.open("a") as train:  # a row of a class the catalog lacks: stage one stops on it in every process
        train.write(json.dumps({"text": "a stray question", "class_id": "nowhere", "source": "x:1", "generated": False}) + "\n")
    with pytest.raises(LaunchedInputError, match="UnknownClass: .*nowhere") as stopped:
        train_chain(params, data.directory, data.train, tmp_path / "chain", seed=0, with_nc=False)
    assert isinstance(stopped.value, input_errors())


def test_an_interrupted_launch_asks_torchrun_to_stop_its_processes_before_killing_it():
    """Its processes run in sessions of their own: a torchrun SIGKILLed at once (what subprocess.call does when
    interrupted) leaves them training on the GPUs; SIGTERM makes torchrun stop them."""
    from tqc.launched import wait_for_torchrun

    class Launched:
        calls = []

        def wait(self, timeout=None):
            self.calls.append(("wait", timeout))
            if timeout is None:
                raise KeyboardInterrupt  # a cancelled flow run, Ctrl-C
            return -15

        def terminate(self):
            self.calls.append("terminate")

        def kill(self):
            self.calls.append("kill")

    launched = Launched()
    with pytest.raises(KeyboardInterrupt):
        wait_for_torchrun(launched)
    assert launched.calls == [("wait", None), "terminate", ("wait", 30)]  # stopped within the grace: no kill


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_rank_ends_when_its_torchrun_is_killed_outright():
    """A SIGKILLed torchrun passes nothing on: each rank asked at start for a SIGTERM of its own when its launcher
    ends. The stand-in launcher starts a 'rank' (TORCHELASTIC_RUN_ID set, as torchrun sets it) that asks
    (end_with_launcher) and sleeps, then is SIGKILLed."""
    rank = ("import time; from tqc.distributed import end_with_launcher; end_with_launcher(); "
            "print('asked', flush=True); time.sleep(120)")
    launcher = ("import os, subprocess, sys, time; "
                f"child = subprocess.Popen([sys.executable, '-c', {rank!r}], stdout=subprocess.PIPE, start_new_session=True, "
                "env={**os.environ, 'TORCHELASTIC_RUN_ID': 'test'}); "
                "child.stdout.readline(); print(child.pid, flush=True); time.sleep(120)")
    started = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    rank_pid = None
    try:
        rank_pid = int(started.stdout.readline())
        assert not _ended(rank_pid)
        started.kill()
        started.wait()
        deadline = time.monotonic() + 20
        while not _ended(rank_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _ended(rank_pid), "the rank outlived its SIGKILLed launcher"
    finally:
        started.kill()
        if rank_pid is not None and not _ended(rank_pid):
            os.kill(rank_pid, 9)


@pytest.mark.parametrize(("parents", "ended"), [([1, 1], False), ([4321, 4321], False), ([4321, 1], True)])
def test_a_rank_ends_at_start_only_where_its_launcher_ended_not_where_the_launcher_is_pid_1(monkeypatch, parents, ended):
    """torchrun as a container's entrypoint (Kubernetes, `CMD ["torchrun", …]`) is PID 1: "my parent is init" read
    as "torchrun has died", and every rank sent itself SIGTERM at start. A parent that changed while the request was
    made is the one sign."""
    from tqc import distributed

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    seen = iter(parents)
    monkeypatch.setattr(distributed.os, "getppid", lambda: next(seen))
    killed, asked = [], []
    monkeypatch.setattr(distributed.os, "kill", lambda pid, sig: killed.append(sig))
    # prctl itself stood in for: made in pytest's process, it would tie it to its parent
    monkeypatch.setattr("ctypes.CDLL", lambda *_, **__: types.SimpleNamespace(prctl=lambda *args: asked.append(args) or 0))
    distributed.end_with_launcher()
    assert asked and bool(killed) == ended


def test_every_tqc_command_asks_to_end_with_its_launcher_before_anything_else(monkeypatch, tmp_path):
    """cli.main asks first, so that a torchrun killed while a rank imports and reads its params takes the rank along;
    outside torchrun the request is not made (a test's or a user's own process is not tied to its parent)."""
    from tqc import cli

    asked = []
    monkeypatch.setattr(distributed, "end_with_launcher", lambda: asked.append("asked"))
    assert cli.main(["--params", str(tmp_path / "none.yaml"), "ingest", "--out", str(tmp_path / "out"),
                     "--quarantine", str(tmp_path / "q.jsonl"), "--report", str(tmp_path / "r.json")]) == 2  # no params file
    assert asked == ["asked"]
    monkeypatch.undo()
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    import ctypes

    distributed.end_with_launcher()
    libc, signal_number = ctypes.CDLL(None, use_errno=True), ctypes.c_int(-1)
    libc.prctl(2, ctypes.byref(signal_number), 0, 0, 0)  # PR_GET_PDEATHSIG
    assert signal_number.value == 0  # this (pytest's) process is not tied to its parent


def test_as_many_processes_as_gpus_may_be_launched_and_one_more_may_not(monkeypatch):
    """One process per GPU is the intended launch (tests/gpu checks it on a real machine, skipped without CUDA): the
    limit is the device count itself, not one below it."""
    from tqc.config import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    distributed.check_launch("auto", 2)
    distributed.check_launch("nccl", 1)
    with pytest.raises(ConfigError, match="distributed.nproc_per_node is 3, and this machine has 2 CUDA device"):
        distributed.check_launch("auto", 3)


def test_on_a_gpu_node_each_process_takes_its_local_gpu_and_the_backend_asked_for(monkeypatch):
    """Rank 3 of a two-node job of 2 GPUs a node is the second process on its node: GPU 1 (LOCAL_RANK), not GPU 3,
    which the node lacks. `auto` is NCCL there; a backend named in distributed.backend is the one joined."""
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed, "_quiet", lambda: None)  # rank 3 would quieten this test process's loggers
    devices, joined = [], []
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **options: joined.append(backend))
    for backend in ("auto", "gloo", "nccl"):
        distributed.setup(backend)
    assert devices == [1, 1, 1] and joined == ["nccl", "gloo", "nccl"]


def _broadcast_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """A linear model initialised from each rank's own seed, then `broadcast_parameters`: what each replica holds."""
    _as_torchrun_rank(rank, world, port)
    distributed.setup("gloo")
    try:
        torch.manual_seed(rank)  # replicas that start apart, as heads drawn from streams that differ would
        model = nn.Linear(4, 3)
        distributed.broadcast_parameters(model)
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def test_every_replica_starts_from_rank_0s_weights(tmp_path):
    """The stage tests seed every process alike, so their replicas start equal with or without the broadcast; here
    they do not, and after it each holds rank 0's weights (its own seed's)."""
    multiprocessing.spawn(_broadcast_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    replicas = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    torch.manual_seed(0)
    expected = nn.Linear(4, 3).state_dict()
    for name, tensor in expected.items():
        assert torch.equal(replicas[0][name], tensor) and torch.equal(replicas[1][name], tensor), name


def test_the_relaunch_command_is_logged_without_a_database_password_given_with_set(tmp_path, monkeypatch, caplog):
    """The launched command repeats the user's --set values: a tracking.uri's password was logged in clear."""
    from tqc import cli

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    launched = []
    monkeypatch.setattr(cli, "_launch", lambda command, processes: launched.append(command) or 0)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"distributed": {"nproc_per_node": 2},
                                                          "warmup": {"enabled": True}, "tracking": {"enabled": False}}))
    argv = ["--params", str(tmp_path / "params.yaml"), "--set", "tracking.uri=postgresql://mlflow:s3cret@db.internal/mlflow",
            "warmup", "--data", str(tmp_path), "--out", str(tmp_path / "warmup"), "--report", str(tmp_path / "warmup.json"),
            "--quarantine", str(tmp_path / "quarantine.jsonl")]
    with caplog.at_level(logging.INFO, logger="tqc.cli"), pytest.raises(SystemExit):
        cli.main(argv)
    assert any("s3cret" in part for part in launched[0])  # the processes are given the setting as it was written
    said = [m for m in caplog.messages if m.startswith("distributed: launching")]
    assert len(said) == 1 and "s3cret" not in said[0] and "postgresql://mlflow:***@db.internal/mlflow" in said[0]
