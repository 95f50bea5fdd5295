"""Validate: a Great Expectations suite over the ingested splits; failing rows are quarantined.

Row-level expectations (non-empty text, label in catalog, no train/test overlap) quarantine
the rows they reject, so the pipeline trains on clean rows. An expectation named in
`validate.critical` stops the stage when more than `max_quarantined_fraction` of a split
fails it: a few bad rows are routine, a wholesale failure means the input is wrong.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from tqc.config import ValidateParams
from tqc.io import write_json, write_jsonl
from tqc.schema import Catalog, LabeledQuestion, load_questions, save_questions

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
COLUMNS = ["text", "class_id", "source", "generated"]


class ValidationFailed(RuntimeError):
    pass


def normalise(text: str) -> str:
    """Case- and whitespace-insensitive form used for overlap checks."""
    return " ".join(text.casefold().split())


@dataclass(frozen=True)
class ExpectationOutcome:
    name: str
    split: str
    success: bool
    failing_rows: list[int]
    critical: bool


def build_suite(catalog: Catalog, params: ValidateParams, check_overlap: bool):
    """The expectations for one split, each tagged in `meta.name` with its params name."""
    import great_expectations as gx

    suite = gx.ExpectationSuite(name="tqc_questions")
    suite.add_expectation(
        gx.expectations.ExpectTableColumnsToMatchSet(column_set=COLUMNS + ["seen_in_test"], exact_match=True, meta={"name": "schema"})
    )
    suite.add_expectation(
        gx.expectations.ExpectColumnValuesToBeOfType(column="text", type_="str", meta={"name": "schema"})
    )
    suite.add_expectation(
        gx.expectations.ExpectColumnValueLengthsToBeBetween(
            column="text", min_value=1, max_value=params.max_text_chars, meta={"name": "non_empty_text"}
        )
    )
    suite.add_expectation(
        gx.expectations.ExpectColumnValuesToBeInSet(column="class_id", value_set=catalog.class_ids, meta={"name": "label_in_catalog"})
    )
    if check_overlap:
        suite.add_expectation(
            gx.expectations.ExpectColumnValuesToBeInSet(column="seen_in_test", value_set=[False], meta={"name": "no_train_test_overlap"})
        )
    return suite


def validate_split(frame: pd.DataFrame, split: str, catalog: Catalog, params: ValidateParams) -> list[ExpectationOutcome]:
    import great_expectations as gx

    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    asset = context.data_sources.add_pandas("tqc").add_dataframe_asset(name=split)
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})
    result = batch.validate(build_suite(catalog, params, check_overlap=split != "test"), result_format="COMPLETE")
    outcomes = []
    for expectation_result in result.results:
        name = expectation_result.expectation_config.meta["name"]
        failing = [int(i) for i in expectation_result.result.get("unexpected_index_list") or []]
        outcomes.append(ExpectationOutcome(name, split, bool(expectation_result.success), failing, name in params.critical))
    return outcomes


def to_frame(questions: list[LabeledQuestion], test_texts: set[str]) -> pd.DataFrame:
    frame = pd.DataFrame([asdict(q) for q in questions], columns=COLUMNS)
    frame["seen_in_test"] = [normalise(q.text) in test_texts for q in questions]
    return frame.reset_index(drop=True)


def run(in_dir: Path, params: ValidateParams, out_dir: Path, quarantine_path: Path, report_path: Path) -> dict:
    started = time.perf_counter()
    catalog = Catalog.load(in_dir / "catalog.jsonl")
    splits = {split: load_questions(in_dir / f"{split}.jsonl") for split in SPLITS}
    test_texts = {normalise(q.text) for q in splits["test"]}

    accepted: dict[str, list[LabeledQuestion]] = {}
    quarantined: list[dict] = []
    outcomes: list[ExpectationOutcome] = []
    for split, questions in splits.items():
        split_outcomes = validate_split(to_frame(questions, test_texts), split, catalog, params)
        outcomes += split_outcomes
        reasons: dict[int, list[str]] = {}
        for outcome in split_outcomes:
            for row in outcome.failing_rows:
                reasons.setdefault(row, []).append(outcome.name)
        accepted[split] = [q for i, q in enumerate(questions) if i not in reasons]
        quarantined += [_quarantine_record(questions[i], split, names) for i, names in sorted(reasons.items())]

    report = _report(catalog, splits, accepted, quarantined, outcomes, params, time.perf_counter() - started)
    out_dir.mkdir(parents=True, exist_ok=True)
    catalog.save(out_dir / "catalog.jsonl")
    for split, questions in accepted.items():
        save_questions(out_dir / f"{split}.jsonl", questions)
    write_jsonl(quarantine_path, quarantined)
    write_json(report_path, report)
    log.info(
        "validate: accepted %s, quarantined %d rows to %s; report %s (%.1fs)",
        report["accepted"], len(quarantined), quarantine_path, report_path, report["seconds"],
    )
    _raise_on_critical(report, params)
    return report


def _quarantine_record(question: LabeledQuestion, split: str, expectations: list[str]) -> dict:
    file, _, line = question.source.rpartition(":")
    return {
        "stage": "validate",
        "split": split,
        "file": file,
        "line": int(line) if line.isdigit() else None,
        "expectations": expectations,
        "text": question.text,
        "class_id": question.class_id,
    }


def _report(catalog, splits, accepted, quarantined, outcomes, params, seconds) -> dict:
    expectations = []
    for outcome in outcomes:
        total = len(splits[outcome.split]) or 1
        expectations.append(
            {
                "name": outcome.name,
                "split": outcome.split,
                "severity": "critical" if outcome.critical else "warning",
                "success": outcome.success,
                "failing_rows": len(outcome.failing_rows),
                "failing_fraction": round(len(outcome.failing_rows) / total, 6),
            }
        )
    return {
        "classes": len(catalog),
        "read": {split: len(rows) for split, rows in splits.items()},
        "accepted": {split: len(rows) for split, rows in accepted.items()},
        "quarantined": {split: sum(1 for q in quarantined if q["split"] == split) for split in splits},
        "expectations": expectations,
        "seconds": round(seconds, 2),
    }


def _raise_on_critical(report: dict, params: ValidateParams) -> None:
    failures = []
    for e in report["expectations"]:
        if e["success"]:
            continue
        row_level = e["failing_rows"] > 0
        too_many = not row_level or e["failing_fraction"] > params.max_quarantined_fraction
        if e["severity"] == "critical" and too_many:
            failures.append(f"{e['name']} on {e['split']} ({e['failing_rows']} rows, {e['failing_fraction']:.1%})")
        else:
            log.warning("expectation %s failed on %s for %d rows: rows quarantined", e["name"], e["split"], e["failing_rows"])
    if failures:
        raise ValidationFailed("critical expectation(s) failed: " + "; ".join(failures))
