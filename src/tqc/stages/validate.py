"""Validate: a Great Expectations contract over the ingested splits and the catalog.

Row-level expectations quarantine the rows they reject, so the pipeline trains on clean
rows; table-level ones (schema, class counts, imbalance, the catalog) judge a whole table.
Each expectation is critical or a warning (`validate.critical`). A critical table-level
failure stops the stage; a critical row-level one stops it when more than
`max_quarantined_fraction` of a split fails it: a few bad rows are routine, a wholesale
failure means the input is wrong (a bad column mapping, a foreign catalog).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from tqc.config import ValidateParams
from tqc.errors import InputError
from tqc.io import atomic_directory, write_json, write_jsonl
from tqc.schema import (Catalog, LabeledQuestion, file_and_line, load_questions, quarantine_reason, save_questions,
                        split_source)
from tqc.text import (ALIKE, CONTROL_CHARACTERS, LETTER_OR_DIGIT, catalog_label_key, compared_text, faulty_text,
                      first_control_character, ids_by_label_key)

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
GENERATED = "generated"  # data.generated's attributed rows, when configured: checked like a split
COLUMNS = ["text", "class_id", "source", "generated"]
# Leakage: a row of the first split whose text also appears in the second is quarantined.
LEAKAGE_PAIRS = {"train": ("validation", "test"), "validation": ("test",), "test": (), GENERATED: ("validation", "test")}
# Label conflicts: a row of these splits is also compared with train's rows. A made row that is another class's
# training question would teach it both labels; a validation or test row labelled otherwise in train would be judged
# by a disputed label (its train copy goes as leakage).
CONFLICTS_WITH_TRAIN = (GENERATED, "validation", "test")


class ValidationFailed(InputError, RuntimeError):
    pass


@dataclass(frozen=True)
class ExpectationOutcome:
    name: str
    table: str  # a split, "class_counts" or "catalog"
    success: bool
    failing_rows: list[int]
    row_level: bool
    critical: bool
    observed: dict


def annotate(splits: dict[str, list[LabeledQuestion]], catalog: Catalog, normalised: dict[str, list[str]],
             firsts: dict[str, dict[str, int]], leak_targets: dict[str, dict[str, str]],
             train: list[LabeledQuestion] | None = None) -> dict[str, pd.DataFrame]:
    """One frame per split of `splits` with the derived columns the row-level expectations test. `normalised`: each
    split's rows' normalised texts (train's too); `firsts`: each split's `first_copies`; `leak_targets`: split → the
    normalised texts a row of an earlier split leaks into (`LEAKAGE_PAIRS`); `train`: the rows a split of
    CONFLICTS_WITH_TRAIN is compared with (default: `splits`' own train, where it has one)."""
    train = splits.get("train") if train is None else train
    # A row that is word for word a standard question of classes other than its own is labelled against the catalog
    owners = _standard_question_owners(catalog)
    frames = {}
    for split, rows in splits.items():
        frame = pd.DataFrame([{c: getattr(q, c) for c in COLUMNS} for q in rows], columns=COLUMNS)
        keys = normalised[split]
        labels_per_text: dict[str, set[str]] = {}
        if split in CONFLICTS_WITH_TRAIN and train is not None:  # `tqc validate` of a test file alone has none
            for key, q in zip(normalised["train"], train):
                labels_per_text.setdefault(key, set()).add(q.class_id)
        for key, q in zip(keys, rows):
            labels_per_text.setdefault(key, set()).add(q.class_id)
        first = firsts[split]
        repeated = [key in first and first[key] < index for index, key in enumerate(keys)]
        later_splits = [leak_targets[other] for other in LEAKAGE_PAIRS[split]]
        # an empty text fails non_empty_text; it is no copy of another empty text, nor a question that leaks
        has_text = [bool(key) for key in keys]
        frame["normalised_text"] = keys  # zero-width and other invisible characters do not count as text
        frame["is_repeat"] = [r and t for r, t in zip(repeated, has_text)]
        frame["label_conflict"] = [t and _is_label_conflict(labels_per_text[key], owners.get(key))
                                   for key, t in zip(keys, has_text)]
        frame["leaks"] = [any(key in other for other in later_splits) and t for key, t in zip(keys, has_text)]
        # A test question that is its own class's standard question word for word is answered by matching its own
        # text: every model scores it, so it flatters them all. Train and validation rows may be (it is a question).
        frame["is_own_standard_question"] = [split == "test" and q.class_id in owners.get(key, ())
                                             for key, q in zip(keys, rows)]
        frames[split] = frame.reset_index(drop=True)
    return frames


def first_copies(rows: list[LabeledQuestion], keys: list[str], catalog: Catalog,
                 max_text_chars: int | None = None) -> dict[str, int]:
    """Normalised text → the index of its first copy that passes the checks judging a row alone (no control
    characters, a catalog label, within the length bound): the copy a later one duplicates. A first copy quarantined
    for a fault of its own (a mis-decoded byte) leaves the next one to stand, so the clean question is not lost too."""
    class_ids = set(catalog.class_ids)
    firsts: dict[str, int] = {}
    for index, (key, question) in enumerate(zip(keys, rows)):
        if key and key not in firsts and question.class_id in class_ids and not faulty_text(question.text, max_text_chars):
            firsts[key] = index
    return firsts


def _is_label_conflict(labels: set[str], owners: set[str] | None) -> bool:
    """Two labels for one text, or a label that is none of the text's standard question owners: twins' shared text
    (catalog_unique_texts demoted) is either's, and a row of a third class conflicts with both."""
    return len(labels) > 1 or (owners is not None and not labels <= owners)


def _standard_question_owners(catalog: Catalog) -> dict[str, set[str]]:
    """Normalised standard question → the classes it is the standard question of: one, or twins under a demoted
    catalog_unique_texts (a row of either with it is no conflict; one of any other class conflicts with both), as
    augment's `label_conflicts` reads them."""
    owners: dict[str, set[str]] = {}
    for question in catalog.questions:
        owners.setdefault(compared_text(question.text), set()).add(question.class_id)
    return {key: labels for key, labels in owners.items() if key}


def row_expectations(catalog: Catalog, params: ValidateParams) -> list:
    import great_expectations as gx

    e = gx.expectations
    return [
        e.ExpectTableColumnsToMatchSet(column_set=COLUMNS + ["normalised_text", "is_repeat", "label_conflict", "leaks",
                                                            "is_own_standard_question"],
                                       exact_match=True, meta={"name": "schema"}),
        e.ExpectColumnValuesToBeOfType(column="text", type_="str", meta={"name": "schema"}),
        e.ExpectColumnValuesToNotBeNull(column="class_id", meta={"name": "schema"}),
        e.ExpectColumnValueLengthsToBeBetween(column="normalised_text", min_value=1, meta={"name": "non_empty_text"}),
        # "???" or "—": a text the tokenizer reads, but no word of a question
        e.ExpectColumnValuesToMatchRegex(column="normalised_text", regex=LETTER_OR_DIGIT, meta={"name": "has_letter_or_digit"}),
        e.ExpectColumnValueLengthsToBeBetween(column="text", max_value=params.max_text_chars, meta={"name": "text_length"}),
        e.ExpectColumnValuesToNotMatchRegex(column="text", regex=CONTROL_CHARACTERS, meta={"name": "no_control_characters"}),
        e.ExpectColumnValuesToBeInSet(column="class_id", value_set=catalog.class_ids, meta={"name": "label_in_catalog"}),
        e.ExpectColumnValuesToBeInSet(column="is_repeat", value_set=[False], meta={"name": "no_duplicates"}),
        e.ExpectColumnValuesToBeInSet(column="label_conflict", value_set=[False], meta={"name": "no_label_conflicts"}),
        e.ExpectColumnValuesToBeInSet(column="leaks", value_set=[False], meta={"name": "no_leakage"}),
        e.ExpectColumnValuesToBeInSet(column="is_own_standard_question", value_set=[False],
                                      meta={"name": "not_own_standard_question"}),
    ]


def class_count_expectations(params: ValidateParams) -> list:
    import great_expectations as gx

    return [
        gx.expectations.ExpectColumnValuesToBeBetween(
            column="count", min_value=params.min_examples_per_class, meta={"name": "min_examples_per_class"}),
        gx.expectations.ExpectColumnMaxToBeBetween(
            column="imbalance_ratio", max_value=params.max_imbalance_ratio, meta={"name": "class_imbalance"}),
    ]


def catalog_expectations() -> list:
    import great_expectations as gx

    e = gx.expectations
    return [
        e.ExpectColumnValuesToBeUnique(column="class_id", meta={"name": "catalog_unique_ids"}),
        e.ExpectColumnValueLengthsToBeBetween(column="normalised_text", min_value=1, meta={"name": "catalog_non_empty_texts"}),
        e.ExpectColumnValuesToBeUnique(column="normalised_text", meta={"name": "catalog_unique_texts"}),
    ]


# A test row that fails these cannot be scored, whatever their severity; any other warning leaves it in
# test (flagged), since dropping it would change what every model is measured on.
UNSCORABLE = {"non_empty_text", "label_in_catalog"}

ROW_LEVEL = {"non_empty_text", "has_letter_or_digit", "text_length", "no_control_characters", "label_in_catalog",
             "no_duplicates", "no_label_conflicts", "no_leakage", "not_own_standard_question"}


class Validator:
    """One ephemeral Great Expectations context; each table is validated by a checkpoint
    whose results also feed the HTML data docs when `docs_dir` is given."""

    def __init__(self, docs_dir: Path | None):
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        # That module sets its logger to INFO at import, so the level the CLI gives "great_expectations" did not reach
        # it: every run printed the path of a scratch folder for docs. NOTSET: it inherits its parent's level again
        logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.NOTSET)
        self.gx = gx
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        self.source = self.context.data_sources.add_pandas("tqc")
        self.actions = []
        if docs_dir is not None:
            self.context.add_data_docs_site(site_name="tqc", site_config={
                "class_name": "SiteBuilder",
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir.resolve())},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}})
            self.actions = [gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=["tqc"])]

    def validate(self, table: str, frame: pd.DataFrame, expectations: list, critical: set[str]) -> list[ExpectationOutcome]:
        gx = self.gx
        batch_definition = self.source.add_dataframe_asset(name=table).add_batch_definition_whole_dataframe("all")
        suite = self.context.suites.add(gx.ExpectationSuite(name=f"tqc_{table}", expectations=expectations))
        definition = self.context.validation_definitions.add(gx.ValidationDefinition(name=table, data=batch_definition, suite=suite))
        checkpoint = self.context.checkpoints.add(gx.Checkpoint(
            name=f"{table}_checkpoint", validation_definitions=[definition], actions=self.actions, result_format="COMPLETE"))
        result = checkpoint.run(batch_parameters={"dataframe": frame})
        outcomes = []
        for validation in result.run_results.values():
            for r in validation.results:
                name = r.expectation_config.meta["name"]
                _stop_if_unevaluated(r, name, table)
                failing = [int(i) for i in r.result.get("unexpected_index_list") or []]
                observed = {k: _plain(v) for k, v in r.result.items() if k in ("observed_value", "unexpected_count", "element_count")}
                outcomes.append(ExpectationOutcome(name, table, bool(r.success), failing, name in ROW_LEVEL, name in critical, observed))
        return outcomes


def _stop_if_unevaluated(result, name: str, table: str) -> None:
    """An expectation Great Expectations could not evaluate (a missing column, a metric that raised) comes back as a
    failure with no failing rows: read as such, a critical check would quarantine nothing and only warn. Critical or
    not, the suite did not check the data, so the stage stops, naming the expectation, the table and the cause."""
    info = result.exception_info or {}
    raised = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]  # GX: per metric
    causes = sorted({entry.get("exception_message") or "raised" for entry in raised if entry.get("raised_exception")})
    if causes:
        raise ValidationFailed(f"expectation {name} on {table} could not be evaluated: {'; '.join(causes)}")
    if name in ROW_LEVEL and not result.success and not result.result.get("unexpected_index_list"):
        raise ValidationFailed(f"expectation {name} on {table} failed without naming its rows "
                               f"({ {k: _plain(v) for k, v in result.result.items() if k != 'unexpected_index_list'} }), "
                               "so none could be quarantined")


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def class_counts(questions: list[LabeledQuestion], catalog: Catalog) -> pd.DataFrame:
    counts = Counter(q.class_id for q in questions)
    frame = pd.DataFrame({"class_id": catalog.class_ids, "count": [counts.get(c, 0) for c in catalog.class_ids]})
    present = frame["count"][frame["count"] > 0]
    frame["imbalance_ratio"] = float(present.max() / present.min()) if len(present) else 0.0
    return frame


def catalog_frame(catalog: Catalog) -> pd.DataFrame:
    return pd.DataFrame({"class_id": catalog.class_ids, "text": catalog.texts,
                         "normalised_text": [compared_text(t) for t in catalog.texts]})


def check(splits: dict[str, list[LabeledQuestion]], catalog: Catalog, params: ValidateParams,
          docs_dir: Path | None = None) -> tuple[dict[str, list[LabeledQuestion]], list[dict], list[dict], list[ExpectationOutcome]]:
    """Run the whole contract: (accepted rows per split, quarantine records, flagged test rows, outcomes)."""
    validator = Validator(docs_dir)
    critical = set(params.critical)
    outcomes = [_naming_classes(outcome, catalog)
                for outcome in validator.validate("catalog", catalog_frame(catalog), catalog_expectations(), critical)]
    accepted: dict[str, list[LabeledQuestion]] = {}
    quarantined: list[dict] = []
    flagged: list[dict] = []  # test rows kept despite a warning
    keys = {split: [compared_text(q.text) for q in rows] for split, rows in splits.items()}
    firsts = {split: first_copies(rows, keys[split], catalog, params.max_text_chars) for split, rows in splits.items()}
    # Test is judged first: a train, validation or generated row leaks into the test rows that stay, not into one
    # test itself drops (unscorable: a label the catalog lacks), which took a clean training question with it.
    # Validation's rows all count: a validation row labelled otherwise in train takes its train copy with it.
    verdicts: dict[str, _Verdicts] = {}
    if "test" in splits:  # test leaks into nothing: no other split's verdict decides its frame
        test_only = ({"test": splits["test"]}, catalog, keys, {"test": firsts["test"]}, {})
        # its label conflicts with train's rows are said too, as for validation (a test row stays, flagged)
        with_train = ({"test": splits["test"], **({"train": splits["train"]} if "train" in splits else {})}, *test_only[1:])
        verdicts["test"] = _judged_split("test", annotate(*test_only, train=splits.get("train"))["test"], splits["test"],
                                         catalog, params, validator, RowReasons(*with_train), critical)
    standing = {split: verdicts[split].kept if split in verdicts else range(len(rows)) for split, rows in splits.items()}
    leak_targets = {split: first_sources(splits[split], keys[split], standing[split]) for split in splits}
    rest = {split: rows for split, rows in splits.items() if split not in verdicts}
    frames = annotate(rest, catalog, keys, firsts, leak_targets)
    explain = RowReasons(splits, catalog, keys, firsts, leak_targets)
    for split in rest:
        verdicts[split] = _judged_split(split, frames[split], splits[split], catalog, params, validator, explain, critical)
    for split, rows in splits.items():  # in the splits' order: the report's and the quarantine file's
        outcomes += verdicts[split].outcomes
        accepted[split] = [rows[i] for i in verdicts[split].kept]
        quarantined += verdicts[split].quarantined
        flagged += verdicts[split].flagged
    outcomes += [_naming_classes(outcome, catalog)  # class_counts has one row per catalog class, in catalog order
                 for outcome in validator.validate("class_counts", class_counts(accepted["train"], catalog),
                                                   class_count_expectations(params), critical)]
    return accepted, quarantined, flagged, outcomes


@dataclass(frozen=True)
class _Verdicts:
    """One split judged: its outcomes, the indices of the rows it keeps, its quarantine records, its flagged test rows."""
    outcomes: list[ExpectationOutcome]
    kept: list[int]
    quarantined: list[dict]
    flagged: list[dict]


def _judged_split(split: str, frame: pd.DataFrame, rows: list[LabeledQuestion], catalog: Catalog,
                  params: ValidateParams, validator: "Validator", explain: "RowReasons", critical: set[str]) -> _Verdicts:
    outcomes = validator.validate(split, frame, row_expectations(catalog, params), critical)
    reasons: dict[int, list[str]] = {}
    for outcome in outcomes:
        for row in outcome.failing_rows:
            reasons.setdefault(row, []).append(outcome.name)
    flagged = []
    if split == "test":  # kept despite a warning: dropping it would change what every model is measured on
        kept_flagged = {i: names for i, names in reasons.items() if not set(names) & (critical | UNSCORABLE)}
        flagged = [quarantine_record(rows[i], split, names, explain(split, i, names)) for i, names in sorted(kept_flagged.items())]
        reasons = {i: names for i, names in reasons.items() if i not in kept_flagged}
    return _Verdicts(outcomes, [i for i in range(len(rows)) if i not in reasons],
                     [quarantine_record(rows[i], split, names, explain(split, i, names)) for i, names in sorted(reasons.items())],
                     flagged)


def first_sources(rows: list[LabeledQuestion], keys: list[str], indices: Iterable[int]) -> dict[str, str]:
    """Normalised text (`keys`, one a row) → the source of its first row among those of `rows` at `indices`."""
    first: dict[str, str] = {}
    for index in indices:
        first.setdefault(keys[index], rows[index].source)
    return first


def _naming_classes(outcome: ExpectationOutcome, catalog: Catalog) -> ExpectationOutcome:
    """A failed catalog expectation's observation with the class ids that fail it (the first 10), so its
    error says which classes to fix, not only how many."""
    if outcome.success or not outcome.failing_rows:
        return outcome
    return replace(outcome, observed={**outcome.observed, "classes": [catalog.class_ids[i] for i in outcome.failing_rows[:10]],
                                      "failing_classes": len(outcome.failing_rows)})


def quarantine_record(question: LabeledQuestion, split: str, expectations: list[str], reason: str | None = None) -> dict:
    file, line = split_source(question.source)
    return {
        "stage": "validate",
        "split": split,
        "file": file,
        "line": line,
        "expectations": expectations,
        "reason": quarantine_reason(expectations, reason),
        "content": {"text": question.text, "class_id": question.class_id},
    }


NO_FILE = "a row of no file"  # how a reason names the other row of a pair when it was read from no file


class RowReasons:
    """Why a row failed each expectation, naming the other row at stake: the split's first copy (`no_duplicates`; the
    split's order is ingest's), a row or standard question with another label (`no_label_conflicts`), the split it
    leaks into, by file and line. Every lookup is built once, so a split of many conflicts costs no scan each."""

    def __init__(self, splits: dict[str, list[LabeledQuestion]], catalog: Catalog, keys: dict[str, list[str]],
                 firsts: dict[str, dict[str, int]], leak_targets: dict[str, dict[str, str]]):
        """`keys`, `firsts` and `leak_targets`: each split's rows' normalised texts, `first_copies` and the texts a row
        leaks into with their first sources, as `annotate` compared them."""
        self.splits, self.keys = splits, keys
        # split → normalised text → the source of the copy a later one duplicates
        self.kept = {split: {key: splits[split][index].source for key, index in first.items()}
                     for split, first in firsts.items()}
        self.labeled: dict[str, dict[str, dict[str, str]]] = {}  # split → normalised text → label → first source
        for split, rows in splits.items():
            labeled = self.labeled.setdefault(split, {})
            for key, question in zip(self.keys[split], rows):
                labeled.setdefault(key, {}).setdefault(question.class_id, question.source)
        self.leak_targets = leak_targets
        self.standard = _standard_question_owners(catalog)  # as annotate compares: a text's owner classes
        self.alike_ids = ids_by_label_key(catalog.class_ids)  # as ingest matches labels to ids

    def __call__(self, split: str, index: int, expectations: list[str]) -> str:
        return "; ".join(self._one(split, index, name) for name in expectations)

    def _one(self, split: str, index: int, name: str) -> str:
        key, question = self.keys[split][index], self.splits[split][index]
        if name == "no_duplicates":
            return f"no_duplicates: duplicate of {file_and_line(self.kept[split][key], NO_FILE)}"
        if name == "no_label_conflicts":
            return f"no_label_conflicts: conflicts with {self._other_label(split, key, question.class_id)}"
        if name == "no_leakage":
            into = [other for other in LEAKAGE_PAIRS[split] if key in self.leak_targets.get(other, {})]
            return "no_leakage: also " + ", ".join(f"in {other} at {file_and_line(self.leak_targets[other][key], NO_FILE)}"
                                                   f"{self._labeled_otherwise(other, key, question.class_id)}"
                                                   for other in into)
        if name == "not_own_standard_question":
            return (f"not_own_standard_question: word for word the standard question of its class {question.class_id!r}, "
                    "so it is scored against its own text")
        if name == "has_letter_or_digit":
            return "has_letter_or_digit: no letter or digit, so no question to classify"
        if name == "no_control_characters":  # which one, and where: a tab or a line break is allowed, a bell is not
            found = first_control_character(question.text)
            return f"{name}: U+{ord(found.group()):04X} at character {found.start() + 1}" if found else name
        if name == "text_length":
            return f"text_length: {len(question.text)} characters, over validate.max_text_chars"
        if name == "label_in_catalog":
            return f"label_in_catalog: {question.class_id!r} is no class of the catalog{self._alike_hint(question.class_id)}"
        return name

    def _alike_hint(self, label: str) -> str:
        """The catalog id a label is alike but for case, width or a float's .0; several such ids (`hum` and `HUM`) are
        all named, since ingest took neither: the hint named the last, as if the label were just misspelt."""
        like = [class_id for class_id in self.alike_ids.get(catalog_label_key(label), []) if class_id != label]
        if len(like) > 1:
            return f" (the catalog has {' and '.join(map(repr, like))}, each {ALIKE}, so it was read as neither)"
        return f" (the catalog has {like[0]!r}, {ALIKE})" if like else ""

    def _labeled_otherwise(self, split: str, key: str, label: str) -> str:
        """", labeled 'X'" where `split`'s rows of this text carry no `label`, the first other label; else ""."""
        labels = self.labeled.get(split, {}).get(key, {})
        return "" if not labels or label in labels else f", labeled {next(iter(labels))!r}"

    def _other_label(self, split: str, key: str, label: str) -> str:
        owners = sorted(self.standard.get(key, {label}))
        if label not in owners:
            return f"the standard question of class{'es' if len(owners) > 1 else ''} {', '.join(map(repr, owners))}"
        for other in (split, "train") if split in CONFLICTS_WITH_TRAIN else (split,):  # as annotate compares
            found = next(((lab, source) for lab, source in self.labeled.get(other, {}).get(key, {}).items() if lab != label),
                         None)
            if found:
                return f"{file_and_line(found[1], NO_FILE)}{f' ({other})' if other != split else ''}, labeled {found[0]!r}"
        return "a row labeled otherwise"


def run(in_dir: Path, params: ValidateParams, out_dir: Path, quarantine_path: Path, report_path: Path,
        docs_dir: Path | None = None) -> dict:
    started = time.perf_counter()
    catalog, splits = _load(in_dir)
    accepted, quarantined, flagged, outcomes = check(splits, catalog, params, docs_dir)

    report = summarise(catalog, splits, accepted, quarantined, outcomes, params, time.perf_counter() - started)
    report["test_rows_kept_with_warnings"] = flagged
    for split, consequence in (("validation", ", so no selection sees them"), ("train", "")):
        report[f"classes_without_{split}_rows"] = _classes_emptied(split, consequence, splits, accepted)
    report["test_classes_without_train_rows"] = _test_classes_never_trained(accepted, report["classes_without_train_rows"])
    if flagged:
        log.warning("validate: %d test rows fail a warning-level expectation and stay in test (listed in %s)",
                    len(flagged), report_path)
    write_jsonl(quarantine_path, quarantined)  # what failed and why, kept whether or not the stage stops
    write_json(report_path, report)
    log.info("validate: accepted %s, quarantined %d rows to %s; report %s%s (%.1fs)",
             report["accepted"], len(quarantined), quarantine_path, report_path,
             f", data docs {docs_dir}" if docs_dir else "", report["seconds"])
    raise_on_critical(report, params, quarantined, quarantine_path, flagged)
    _require_rows_in_every_split(accepted, report, in_dir, quarantine_path)
    _save_validated(out_dir, catalog, accepted)
    return report


def _load(in_dir: Path) -> tuple[Catalog, dict[str, list[LabeledQuestion]]]:
    """The catalog and each split in `in_dir`, with the generated rows where there are any."""
    catalog = Catalog.load(in_dir / "catalog.jsonl")
    splits = {split: load_questions(in_dir / f"{split}.jsonl") for split in SPLITS}
    if (in_dir / f"{GENERATED}.jsonl").exists():
        splits[GENERATED] = load_questions(in_dir / f"{GENERATED}.jsonl")
    return catalog, splits


def _classes_emptied(split: str, consequence: str, splits: dict[str, list[LabeledQuestion]],
                     accepted: dict[str, list[LabeledQuestion]]) -> list[str]:
    """The classes whose every `split` row was quarantined, said in a warning. A class without validation rows is
    judged by nothing when checkpoints are chosen; one without train rows stays in the catalog, answered by an
    encoder that never trained on it."""
    emptied = sorted({q.class_id for q in splits[split]} - {q.class_id for q in accepted[split]})
    if emptied:
        log.warning("validate: %d class(es) lost every %s row to quarantine%s: %s", len(emptied), split, consequence,
                    ", ".join(emptied[:10]))
    return emptied


def _test_classes_never_trained(accepted: dict[str, list[LabeledQuestion]], emptied: list[str]) -> dict[str, int]:
    """{class: its test questions} for each class with test questions and no training question: every test question
    of it is scored against a standard question the encoder never trained on. Those with none in the file at all
    (not lost to quarantine: `emptied` said those) are said in a warning."""
    trained = {q.class_id for q in accepted["train"]}
    untrained = Counter(q.class_id for q in accepted["test"] if q.class_id not in trained)
    never_had = sorted(set(untrained) - set(emptied))
    if never_had:
        log.warning("validate: %d class(es) have test questions but no training question: %s", len(never_had),
                    ", ".join(f"{c} ({untrained[c]} test question{'s' if untrained[c] != 1 else ''})" for c in never_had[:10]))
    return {class_id: untrained[class_id] for class_id in sorted(untrained)}


def _require_rows_in_every_split(accepted: dict[str, list[LabeledQuestion]], report: dict, in_dir: Path,
                                 quarantine_path: Path) -> None:
    """No train rows: stage one would take no step and "train" nothing; no validation rows: early stopping would score
    0 every epoch and keep the starting weights; no test rows: evaluate would write NaN figures, then fail."""
    for split in ("train", "validation", "test"):
        if not accepted[split]:
            raise ValidationFailed(f"no {split} rows left in {in_dir / f'{split}.jsonl'} ({report['read'][split]} read, "
                                   f"{report['quarantined'][split]} quarantined to {quarantine_path})")


def _save_validated(out_dir: Path, catalog: Catalog, accepted: dict[str, list[LabeledQuestion]]) -> None:
    """Only data that passed replaces the last validated data (`tqc validate FILE` judges batches against it)."""
    with atomic_directory(out_dir) as staging:
        catalog.save(staging / "catalog.jsonl")
        for split, questions in accepted.items():
            save_questions(staging / f"{split}.jsonl", questions)


def summarise(catalog, splits, accepted, quarantined, outcomes, params, seconds) -> dict:
    expectations = []
    for outcome in outcomes:
        total = len(splits[outcome.table]) if outcome.table in splits else 0
        expectations.append({
            "name": outcome.name,
            "table": outcome.table,
            "severity": "critical" if outcome.critical else "warning",
            "success": outcome.success,
            "failing_rows": len(outcome.failing_rows) if outcome.row_level else None,
            "failing_fraction": round(len(outcome.failing_rows) / total, 6) if outcome.row_level and total else None,
            "observed": outcome.observed,
        })
    train_counts = class_counts(accepted["train"], catalog)
    return {
        "classes": len(catalog),
        "read": {split: len(rows) for split, rows in splits.items()},
        "accepted": {split: len(rows) for split, rows in accepted.items()},
        "quarantined": {split: sum(1 for q in quarantined if q["split"] == split) for split in splits},
        "quarantined_by_expectation": dict(sorted(Counter(n for q in quarantined for n in q["expectations"]).items())),
        "class_imbalance_ratio": round(float(train_counts["imbalance_ratio"].iloc[0]), 4) if len(train_counts) else None,
        "classes_below_min_examples": train_counts.loc[train_counts["count"] < params.min_examples_per_class, "class_id"].tolist(),
        "expectations": expectations,
        "seconds": round(seconds, 2),
    }


def _observation(observed: dict) -> str:
    """A table expectation's observation in words: how many of its rows fail and, for the catalog and the class
    counts, which classes (the first 10), e.g. "3 of 90 fail: classes 'a', 'b', 'c'"."""
    said = []
    if "unexpected_count" in observed and "element_count" in observed:
        said.append(f"{observed['unexpected_count']} of {observed['element_count']} fail")
    if observed.get("observed_value") is not None:
        said.append(f"observed {observed['observed_value']}")
    classes = observed.get("classes") or []
    more = observed.get("failing_classes", observed.get("unexpected_count") or 0) - len(classes)
    named = f"classes {', '.join(map(repr, classes))}" + (f" and {more} more" if classes and more > 0 else "")
    return ": ".join(filter(None, ["; ".join(said), named if classes else ""])) or "no observation"


def raise_on_critical(report: dict, params: ValidateParams, quarantined: list[dict] | None = None,
                      quarantine_path: Path | None = None, flagged: list[dict] | None = None) -> None:
    """Stop on a critical expectation that failed for a table, or for more than `max_quarantined_fraction` of
    a split's rows; the error names the first failing rows (file and line, from `quarantined`) and where
    every one of them is. Any other failure is a warning naming its first rows (from `flagged` for test rows kept)."""
    failures = []
    for e in report["expectations"]:
        if e["success"]:
            continue
        where = f"{e['name']} on {e['table']}"
        row_level = e["failing_rows"] is not None
        too_many = not row_level or e["failing_fraction"] > params.max_quarantined_fraction
        if e["severity"] == "critical" and too_many:
            # the knob that decides, as ingest names data.max_rejected_fraction: raise it, or fix the rows
            detail = (f" ({e['failing_rows']} row(s), {e['failing_fraction']:.1%}, more than validate.max_quarantined_"
                      f"fraction ({params.max_quarantined_fraction}){_first_rows(quarantined or [], e)})"
                      if row_level else f" ({_observation(e['observed'])})")
            failures.append(where + detail)
        elif row_level and e["table"] == "test" and e["severity"] != "critical" and e["name"] not in UNSCORABLE:
            # such test rows stay in test, flagged (check's test policy): "quarantined" would be untrue of them. A
            # critical one's (under the fraction) leave test, as unscorable ones do, and are said quarantined below
            log.warning("expectation %s failed for %d row(s)%s: kept in test (the report's test_rows_kept_with_warnings) "
                        "unless another expectation quarantined them", where, e["failing_rows"],
                        _first_rows([*(quarantined or []), *(flagged or [])], e))
        elif row_level:
            log.warning("expectation %s failed for %d row(s)%s: rows quarantined", where, e["failing_rows"],
                        _first_rows(quarantined or [], e))
        else:
            log.warning("expectation %s failed (warning): %s", where, _observation(e["observed"]))
    if failures:
        every = f"; every failing row, with its reasons, is in {quarantine_path}" if quarantine_path and quarantined else ""
        raise ValidationFailed("critical expectation(s) failed: " + "; ".join(failures) + every)


def _first_rows(quarantined: list[dict], expectation: dict, shown: int = 3) -> str:
    """", e.g. test.csv line 8 (label_in_catalog: 'ABBREV' is no class of the catalog), test.csv line 9": where the
    first rows failing `expectation` were read, by file and line (the rows come in ingest's order, which shuffles each
    class), the first with its reason where that says more than the expectations' names (which label, which copy)."""
    rows = sorted((q for q in quarantined
                   if q.get("split") == expectation["table"] and expectation["name"] in q.get("expectations", ())),
                  key=lambda q: (str(q["file"]), q.get("line") if q.get("line") is not None else -1))
    places = [f"{q['file']} line {q['line']}" if q.get("line") is not None else q["file"] for q in rows[:shown]]
    if places and rows[0].get("reason") and rows[0]["reason"] != quarantine_reason(rows[0].get("expectations", [])):
        places[0] += f" ({rows[0]['reason']})"
    return f", e.g. {', '.join(places)}" if places else ""
