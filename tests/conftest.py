"""Shared fixtures: a tiny random BERT built on the spot (no download), tiny synthetic data, and throwaway
shared servers (PostgreSQL, and MLflow on it) for the `server` tests.

The synthetic questions below are made up for tests only; they are not a dataset.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from hypothesis import settings as hypothesis_settings


def _threads_per_xdist_worker() -> str | None:
    """The cores each pytest-xdist worker has to itself, at least 1; None outside xdist (a serial run keeps torch's
    default, a thread a core)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # Linux; macOS
    return str(max(1, cores // workers)) if workers else None


# `make test` runs two xdist workers on two cores: torch's default of one OpenMP thread per core gave four spinning
# threads on two cores, and the tiny models' steps, which a thread does in milliseconds, waited on the barrier of a
# descheduled one: a 4-step stage-one test took 5-17 s, 0.45 s on one thread. So each worker, and the stages,
# torchrun workers and flows it starts (they inherit it), takes its share of the cores, where the caller has not
# chosen a number. Set before torch is imported.
if _threads_per_xdist_worker() and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = _threads_per_xdist_worker()
    if "torch" in sys.modules:  # imported before this conftest (a plugin): its pool is sized already
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# Hypothesis draws its examples from a fresh random seed each run by default: a property test could then fail on one
# run and pass on the next at the same commit. Derandomized, each test draws the same examples every run (the seed is
# the test's own), and no database of earlier runs' failing examples is replayed into a later one.
hypothesis_settings.register_profile("tqc", derandomize=True, database=None)
hypothesis_settings.load_profile("tqc")


CLASSES = {
    "LOC": ("Where is the place?", ["where is {}", "where can i find {}", "in which country is {}"]),
    "HUM": ("Who is the person?", ["who is {}", "who invented {}", "who wrote about {}"]),
    "NUM": ("How many are there?", ["how many {} are there", "how much does {} cost", "how many people like {}"]),
}
NOUNS = ["paris", "the tower", "a river", "the moon", "music", "bread", "a bridge", "the lake", "chess", "tea",
         "the museum", "gold", "a castle", "the island", "coffee", "a planet"]


def load_script(name: str) -> ModuleType:
    """A module of the repository's scripts/ folder (not a package), loaded from its file."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synthetic_questions(seed: int, per_class: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for label, (_, templates) in CLASSES.items():
        for _ in range(per_class):
            rows.append((rng.choice(templates).format(rng.choice(NOUNS)), label))
    rng.shuffle(rows)
    return rows


def tiny_vocabulary() -> list[str]:
    words = set()
    for standard, templates in CLASSES.values():
        words.update(standard.lower().replace("?", " ?").split())
        for template in templates:
            words.update(template.replace("{}", "").split())
    for noun in NOUNS:
        words.update(noun.split())
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "?", ",", "."] + sorted(words)


def build_tiny_bert(directory: Path) -> Path:
    """A 2-layer, 32-wide random BERT with a word-level vocabulary, saved as an HF folder."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    vocab = tiny_vocabulary()
    tokenizer = BertTokenizerFast(vocab={word: i for i, word in enumerate(vocab)}, do_lower_case=True)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    import torch

    torch.manual_seed(0)
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(autouse=True, scope="session")
def hugging_face_hub_offline():
    """Tests never reach for the Hugging Face hub, in this process or in the pipelines they start as
    subprocesses. Online, an id that is not cached fails only after about 45 s of connection retries on a
    machine without network; offline, huggingface_hub fails at once with the same error to the caller."""
    import huggingface_hub.constants

    patch = pytest.MonkeyPatch()
    patch.setenv("HF_HUB_OFFLINE", "1")  # subprocesses read it when they import huggingface_hub
    patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # this process imported it already
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def seeded_generators():
    """Each test starts from the same global random state, whichever tests ran before it in its xdist worker: a test
    drawing from Python's, NumPy's or torch's global generator otherwise drew what the earlier tests had left, and so
    could pass or fail by the order xdist gave it (a loss test's unseeded scores met every hinge margin in 15 of 2,000
    draws). Seeded only where imported already: a test that imports torch itself gets torch's fixed default seed."""
    random.seed(0)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(0)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(0)


@pytest.fixture(autouse=True)
def mlflow_left_as_found():
    """A test's MLflow state stays its own. `mlflow.set_tracking_uri` and `set_experiment` also export
    MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_ID, which every later subprocess (a `dvc repro`, a tune worker)
    would inherit: logging to another store, or finding an experiment it should have been given. Every
    MLFLOW_* variable and MLflow's own globals are put back after each test that touched MLflow."""
    exported = {key: value for key, value in os.environ.items() if key.startswith("MLFLOW_")}
    yield
    if "mlflow" in sys.modules:
        import mlflow

        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(None)
        mlflow.tracking.fluent._active_experiment_id = None  # no public way to clear it
    # after any test, MLflow imported or not: `tqc.cli.main` sets MLFLOW_* defaults without importing it
    for key in [key for key in os.environ if key.startswith("MLFLOW_")]:
        del os.environ[key]
    os.environ.update(exported)


_MLFLOW_SCHEMA_TEMPLATE: dict = {}


@pytest.fixture(autouse=True)
def mlflow_sqlite_schema_from_a_template(tmp_path_factory):
    """A new MLflow SQLite store gets its tables by copying those of the first one this process made. MLflow builds
    an empty database's schema by running its ~60 alembic migrations, 3 to 6 s on these machines, and about 80 tests
    each make a fresh `sqlite:///…/mlflow.db` in this process. The first one is made by MLflow itself and kept (as
    it was before its store wrote anything); every later empty SQLite database is filled from it with SQLite's
    backup API: the same tables, indexes and alembic revision, and the store then goes on as MLflow always does
    (the default experiment, the test's own experiments). A database that already has tables, and every other
    backend (PostgreSQL, in-memory SQLite), still goes through MLflow's own code, as does every subprocess.
    Installed once MLflow's db utils are imported, so tests that never touch MLflow do not import it."""
    if "patched" not in _MLFLOW_SCHEMA_TEMPLATE and "mlflow.store.db.utils" in sys.modules:
        _install_mlflow_schema_template(tmp_path_factory.mktemp("mlflow-schema") / "template.db")
    yield


def _install_mlflow_schema_template(template: Path) -> None:
    import sqlite3
    import threading

    import mlflow.store.db.utils as db_utils

    _MLFLOW_SCHEMA_TEMPLATE["patched"] = True
    if not all(hasattr(db_utils, name) for name in ("_is_empty_database", "_initialize_tables")):
        return  # another MLflow: leave its code alone
    initialize = db_utils._initialize_tables
    lock = threading.Lock()

    def initialize_from_template(engine):
        database = engine.url.database or ""
        if engine.dialect.name != "sqlite" or database in ("", ":memory:") or database.startswith("file:") \
                or not db_utils._is_empty_database(engine):
            return initialize(engine)
        with lock:
            made = template.exists()
            if not made:
                initialize(engine)  # MLflow's own migrations, once
            raw = engine.raw_connection()
            try:
                with contextlib.closing(sqlite3.connect(template)) as kept:
                    if made:
                        kept.backup(raw.driver_connection)
                    else:
                        raw.driver_connection.backup(kept)
            finally:
                raw.close()

    db_utils._initialize_tables = initialize_from_template


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def write_custom_dataset(directory: Path, seed: int = 0, per_class: int = 12, test_per_class: int = 4) -> None:
    """Synthetic custom-format files: train.csv, test.csv, catalog.csv."""
    directory.mkdir(parents=True, exist_ok=True)
    train = synthetic_questions(seed, per_class)
    train_texts = {t for t, _ in train}
    test = [(t, l) for t, l in synthetic_questions(seed + 1000, test_per_class * 3) if t not in train_texts][: test_per_class * 3]
    for name, rows in (("train.csv", train), ("test.csv", test)):
        lines = ["question,label"] + [f"{t},{l}" for t, l in rows]
        (directory / name).write_text("\n".join(lines) + "\n")
    catalog = ["class_id,text"] + [f"{c},{s}" for c, (s, _) in CLASSES.items()]
    (directory / "catalog.csv").write_text("\n".join(catalog) + "\n")


def dvc_init(project: Path) -> None:
    """`dvc init` in `project`, a git repository, through DVC's own API in this process: the same files, without
    the second a `dvc` process takes to start, which about sixty scratch projects paid."""
    from dvc.repo import Repo

    Repo.init(project).close()


def tiny_params(data_dir: Path, model_dir: Path) -> dict:
    """The repository's params.yaml shrunk to the tiny model and the synthetic custom dataset."""
    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    params["data"].update(dataset="custom", data_dir=str(data_dir),
                          custom={**params["data"]["custom"], "train": "train.csv", "test": "test.csv",
                                  "catalog": "catalog.csv", "text_column": "question"})
    params["model"].update(pretrained=str(model_dir), max_length=16)
    for stage in ("stage_one", "stage_two", "baseline_nc"):
        params[stage].update(epochs=1, batch_size=8, learning_rate=1e-3)
    params["mine"]["k"] = 2
    params["evaluate"]["profile_questions"] = 2
    return params


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster's base URL (tests/servers.py); skips where the machine has none."""
    from tests.servers import ServerUnavailable, postgres_cluster

    with contextlib.ExitStack() as stack:
        try:
            base_url = stack.enter_context(postgres_cluster())
        except ServerUnavailable as reason:
            pytest.skip(str(reason))
        yield base_url


@pytest.fixture
def mlflow_on_postgres(postgres, tmp_path) -> Iterator[str]:
    """The URL of an `mlflow server` on a fresh PostgreSQL database, with its artifacts under tmp_path."""
    from tests.servers import create_database, mlflow_server

    backend = create_database(postgres, f"mlflow_{tmp_path.name}")
    with mlflow_server(backend, tmp_path / "mlflow-artifacts") as url:
        yield url
