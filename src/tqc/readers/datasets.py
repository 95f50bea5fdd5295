"""What ingest reads, as params.yaml's data section names it: a shipped dataset's official splits and catalog, a
user's custom files through their column mapping, the generated and validation files, and the retrain flow's
additions."""

from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path
from typing import Callable, TypeVar

from tqc.config import CustomData, DataParams
from tqc.readers.catalogs import (alike_id_in, labels_read_as_catalog, read_catalog_file, shipped_catalog,
                                  with_added_classes, with_derived_classes)
from tqc.readers.results import DatasetSplits, MissingColumns, ReaderError, ReadResult, RejectedRow, require_rows
from tqc.readers.tables import read_headerless_pairs, read_table, read_trec, row_as_csv
from tqc.schema import Catalog, StandardQuestion, split_source
from tqc.text import ALIKE

log = logging.getLogger(__package__)  # "tqc.readers" for every reader: incoming filters that one logger
T = TypeVar("T")  # what a reader wrapped by `_naming_settings` returns


def official_files(params: DataParams) -> tuple[Path, Path, Callable[[Path], ReadResult]]:
    """(train file, test file, reader) of a shipped dataset."""
    root = Path(params.data_dir)
    if params.dataset in ("trec6", "trec50"):
        granularity = "coarse" if params.dataset == "trec6" else "fine"
        return root / "trec" / "train_5500.label", root / "trec" / "TREC_10.label", partial(read_trec, granularity=granularity)
    folder, train_file = {"covidq-categories": ("categories", "train20.csv"), "covidq-classes": ("classes", "train3.csv")}[params.dataset]
    return root / "covid-q" / folder / train_file, root / "covid-q" / folder / "testA.csv", read_headerless_pairs


def read_dataset(params: DataParams) -> DatasetSplits:
    """Read the configured dataset's official train and test splits and its catalog."""
    if params.dataset == "custom":
        return _read_custom(params)
    train_path, test_path, reader = official_files(params)
    own = [f"data.custom.{key}" for key in ("train", "test") if getattr(params.custom, key)]
    if own:  # a user's files set, and dataset left at trec6: it trained on TREC-6 without a word
        log.warning("%s set, but data.dataset is %r, so %s and %s are read instead; data.dataset: custom reads your files",
                    " and ".join(own), params.dataset, train_path, test_path)
    for path in (train_path, test_path):
        if not path.exists():  # said as the setting that chose it: own files with dataset left at trec6 end here
            ignored = "; data.custom.train is set, which only data.dataset: custom reads" if params.custom.train else ""
            raise ReaderError(f"{path}: file not found (data.dataset {params.dataset!r} reads it under data.data_dir{ignored})")
    limit = params.max_rejected_fraction
    return DatasetSplits(require_rows(reader(train_path), train_path, limit), require_rows(reader(test_path), test_path, limit),
                         shipped_catalog(params.dataset))


def read_generated(params: DataParams, catalog: Catalog | None = None) -> ReadResult:
    """`data.generated.path`'s rows made offline, read in the dataset's own format; none when unset. `catalog`: the
    classes a label is read as when alike (`_labels_as_train_labels`)."""
    if not params.generated.path:
        return ReadResult()
    path = Path(params.data_dir) / params.generated.path
    return _labels_as_train_labels(params, require_rows(_dataset_reader(params, params.generated.source_column)(path),
                                                        path, params.max_rejected_fraction), catalog)


def read_validation(params: DataParams, catalog: Catalog | None = None) -> ReadResult | None:
    """`data.validation_file`'s labeled questions, read in the dataset's own format; None when unset
    (ingest then carves validation out of train)."""
    if not params.validation_file:
        return None
    path, (train_path, test_path) = Path(params.data_dir) / params.validation_file, _split_files(params)
    resolved = path.resolve()
    if resolved == test_path.resolve():
        raise ReaderError(f"data.validation_file {path} is the test split ({test_path}): selecting checkpoints on it "
                          "would make the test figures meaningless; name another file")
    if resolved == train_path.resolve():
        raise ReaderError(f"data.validation_file {path} is the training split ({train_path}): validation must be "
                          "questions the model is not trained on; name another file, or unset it to carve one from train")
    problem = unusable_data_file("data.validation_file", params.validation_file, params.data_dir)
    if problem:
        raise ReaderError(problem)
    return _labels_as_train_labels(params, require_rows(_dataset_reader(params)(path), path, params.max_rejected_fraction),
                                   catalog)


def _labels_as_train_labels(params: DataParams, result: ReadResult, catalog: Catalog | None = None) -> ReadResult:
    """A custom dataset's extra files (data.generated, data.validation_file) read their labels as train and test do:
    under `derive`, `hum` is the catalog's `HUM` there too. Else their rows kept labels that train's had lost, and
    were all quarantined (generated: no training question of class 'hum'; validation: label not in the catalog).
    `catalog`: the dataset's classes, the ones derived from train's labels included (ingest passes them: `billing`
    is then train's derived `Billing`); the catalog file's and the added ones without it."""
    if params.dataset != "custom" or params.custom.unknown_labels != "derive":
        return result
    return labels_read_as_catalog(result, catalog if catalog is not None else _known_classes(params, _custom_catalog(params)))


def _custom_catalog(params: DataParams) -> Catalog:
    custom = params.custom
    if not custom.catalog:
        return Catalog()
    read = _naming_settings(partial(read_catalog_file, id_column=custom.catalog_id_column,
                                    text_column=custom.catalog_text_column, encoding=custom.encoding),
                            {custom.catalog_id_column: "data.custom.catalog_id_column",
                             custom.catalog_text_column: "data.custom.catalog_text_column"})
    return read(_custom_file(params, "catalog"))


def _custom_file(params: DataParams, key: str) -> Path:
    """`data.custom.<key>`'s file. One that is not there is named by its setting, as a missing data.validation_file
    is: the reader's own "file not found" says neither which setting to fix nor that the path is under data_dir."""
    named = getattr(params.custom, key)
    problem = unusable_data_file(f"data.custom.{key}", named, params.data_dir)
    if problem:
        raise ReaderError(problem)
    return Path(params.data_dir) / named


def unusable_data_file(setting: str, named: str, data_dir: str) -> str:
    """Why the file a setting names (`named`, relative to data.data_dir) cannot be read, named by that setting ("" when
    it is a file): a reader's own "file not found" or "a folder, not a file" says neither which setting to fix nor
    that the path is under data_dir."""
    path = Path(data_dir) / named
    if path.is_file():
        return ""
    what = "a folder, not a file:" if path.is_dir() else "no file"
    return f"{setting} {named!r}: {what} {path} (the path is relative to data.data_dir, {data_dir})"


def _naming_settings(read: Callable[[Path], T], settings: dict[str, str]) -> Callable[[Path], T]:
    """`read`, whose error for a column the file lacks also names the setting that named the column (`settings`:
    column → setting)."""
    def reading(path: Path) -> T:
        try:
            return read(path)
        except MissingColumns as exc:
            named = list(dict.fromkeys(settings[c] for c in exc.columns if c in settings))
            if not named:
                raise
            raise MissingColumns(f"{exc} (named by {', '.join(named)})", exc.columns) from None
    return reading


def _known_classes(params: DataParams, catalog: Catalog) -> Catalog:
    """The catalog's classes and the retrain flow's added ones: what a label is read as when alike."""
    return with_added_classes(catalog, added_standard_questions(Path(params.additions) if params.additions else None))


def _split_files(params: DataParams) -> tuple[Path, Path]:
    """(train file, test file) the dataset is read from."""
    if params.dataset == "custom":
        return Path(params.data_dir) / params.custom.train, Path(params.data_dir) / params.custom.test
    return official_files(params)[:2]


def _dataset_reader(params: DataParams, source_column: str | None = None) -> Callable[[Path], ReadResult]:
    """The reader of the dataset's own file format: a shipped dataset's, or custom's column mapping."""
    if params.dataset == "custom":
        return partial(read_custom_table, custom=params.custom, source_column=source_column)
    return official_files(params)[2]


def read_custom_table(path: Path, custom: CustomData, source_column: str | None = None,
                      content: bytes | None = None) -> ReadResult:
    """`read_table` through data.custom's column mapping (`source_column`: data.generated's). A column the file lacks
    is an error that also names the setting that named it: the header's own columns show the misspelling, not where
    it was made."""
    settings = {custom.text_column: "data.custom.text_column", custom.label_column: "data.custom.label_column"}
    if source_column is not None:
        settings[source_column] = "data.generated.source_column"
    read = partial(read_table, text_column=custom.text_column, label_column=custom.label_column,
                   source_column=source_column, content=content, encoding=custom.encoding)
    return _naming_settings(read, settings)(path)


ADDED_QUESTIONS, ADDED_CATALOG = "labeled.jsonl", "catalog.jsonl"


def read_additions(directory: Path | None) -> tuple[ReadResult, list[StandardQuestion]]:
    """The retrain flow's accepted labeled questions and new standard questions, if any. A folder that is not there
    adds nothing, and is said: a misspelt `data.additions` would otherwise leave the merged questions out unnoticed."""
    result = ReadResult([], [])
    if directory is not None and not directory.is_dir():
        log.warning("data.additions %s: no such folder, so no question or class is added (the retrain flow merges into "
                    "it; under dvc repro it must exist, as data/raw does)", directory)
    if directory is not None and (directory / ADDED_QUESTIONS).exists():
        result = read_table(directory / ADDED_QUESTIONS, "text", "class_id")
    return result, added_standard_questions(directory)


def added_standard_questions(directory: Path | None) -> list[StandardQuestion]:
    """The retrain flow's new standard questions (new classes), if any."""
    if directory is None or not (directory / ADDED_CATALOG).exists():
        return []
    return read_catalog_file(directory / ADDED_CATALOG).questions


def _read_custom(params: DataParams) -> DatasetSplits:
    custom, root = params.custom, Path(params.data_dir)  # relative paths are under data_dir (a DVC dependency)
    train_path, test_path, reader = _custom_file(params, "train"), _custom_file(params, "test"), _dataset_reader(params)
    if train_path.resolve() == test_path.resolve():  # else ingest's later "validation is empty" would be its reason
        raise ReaderError(f"data.custom.train and data.custom.test are one file, {train_path}: test questions must be "
                          "ones the model never trains on; split the file, or name a separate test file")
    _warn_if_untracked(root, [train_path, test_path] + ([root / custom.catalog] if custom.catalog else []))
    limit = params.max_rejected_fraction
    train, test = require_rows(reader(train_path), train_path, limit), require_rows(reader(test_path), test_path, limit)
    # The retrain flow's new classes are known labels with their own standard questions, never derived ones; ingest
    # appends them after the derived classes (with_added_classes), so no class index moves.
    catalog = _custom_catalog(params)
    known = _known_classes(params, catalog)
    if custom.unknown_labels == "derive":  # `quarantine` is exact by choice: it names the likely id in the reason
        train = labels_read_as_catalog(train, known)
    if custom.unknown_labels == "quarantine":
        train = require_rows(_unknown_labels_rejected(train, known, root / custom.catalog), train_path, limit,
                             "add the labels to data.custom.catalog, set data.custom.unknown_labels: "
                             "derive, or raise the fraction")
    # Only training labels may create classes: a test label outside them is the validate stage's business.
    derived = [q for q in with_derived_classes(known, train.rows, catalog_given=bool(custom.catalog)).questions if q.derived]
    if custom.unknown_labels == "derive":  # test's `billing` is train's derived `Billing` too, not a class of its own
        test = labels_read_as_catalog(test, Catalog(known.questions + derived))
    return DatasetSplits(train, test, Catalog(catalog.questions + derived))


def _warn_if_untracked(data_dir: Path, paths: list[Path]) -> None:
    """dvc.yaml tracks data.data_dir: a file named outside it (an absolute or ../ path) can change without `dvc repro`
    noticing, so its results would silently go stale. A link under data_dir counts as under it wherever it points:
    DVC hashes what the link reads, so a change of its target re-runs ingest."""
    def spellings(path: Path) -> tuple[Path, Path]:  # as written (.. collapsed), and with every link followed
        return Path(os.path.abspath(path)), path.resolve()

    roots = spellings(data_dir)
    for path in paths:
        if not any(spelt.is_relative_to(root) for spelt in spellings(path) for root in roots):
            log.warning("%s is outside data.data_dir (%s), which is what DVC tracks: `dvc repro` will not notice when "
                        "it changes; put it under data.data_dir", path, data_dir)


def _unknown_labels_rejected(result: ReadResult, catalog: Catalog, catalog_path: Path) -> ReadResult:
    """`unknown_labels: quarantine`: a row whose label the catalog lacks is rejected by file and line."""
    known, alike = set(catalog.class_ids), alike_id_in(catalog)
    rejected = []
    for row in result.rows:
        if row.class_id not in known:
            file, line = split_source(row.source)
            like = alike(row.class_id)
            hint = f"; the catalog has {like!r}, {ALIKE}" if like else ""
            rejected.append(RejectedRow(file, line or 0, f"label {row.class_id!r} is not in the catalog {catalog_path} "
                                        f"(data.custom.unknown_labels: quarantine){hint}", row_as_csv(row)))
    return ReadResult([r for r in result.rows if r.class_id in known], result.rejected + rejected, result.named_sources)
