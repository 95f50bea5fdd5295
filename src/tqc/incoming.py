"""`tqc validate FILE`: check a new batch of labeled questions before it enters the pipeline.

The batch is judged by the validate stage's own contract, against the current catalog and
splits: the new rows join the current training rows (so a repeat of a known question or a
label conflicting with one is caught), and leakage into validation or test is checked.
Exit code 0: clean; 1: some rows would be quarantined; 2: the file is unusable.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from pathlib import Path

from tqc.config import Params
from tqc.readers import ReaderError, read_table, require_rows
from tqc.schema import Catalog, load_questions
from tqc.stages.validate import ExpectationOutcome, ValidationFailed, check, raise_on_critical, summarise

log = logging.getLogger(__name__)

CLEAN, QUARANTINED, UNUSABLE = 0, 1, 2


def check_batch(path: Path, against: Path, params: Params) -> dict:
    """What would be accepted and what quarantined, and why. Raises ReaderError or ValidationFailed.

    A critical row-level expectation makes the file unusable when it fails for more than
    `max_quarantined_fraction` of the file's own rows (a wrong column mapping, a foreign label set);
    below that its failing rows are quarantined and the others accepted, as the validate stage does."""
    catalog = Catalog.load(against / "catalog.jsonl")
    current = {split: load_questions(against / f"{split}.jsonl") for split in ("train", "validation", "test")}
    parsed = require_rows(read_table(path, params.data.custom.text_column, params.data.custom.label_column), path)
    splits = {"train": current["train"] + parsed.rows, "validation": current["validation"], "test": current["test"]}
    accepted, quarantined, _, outcomes = check(splits, catalog, params.validate_)
    mine = f"{path}:"
    batch_quarantined = [q for q in quarantined if q["split"] == "train" and f"{q['file']}:" == mine]
    batch = {**splits, "train": parsed.rows}  # fractions of the file's rows, not of the grown training set
    report = summarise(catalog, batch, accepted, batch_quarantined, _batch_rows(outcomes, len(current["train"])),
                       params.validate_, 0.0)
    raise_on_critical(report, params.validate_, batch_quarantined)
    rejected = [{"file": r.file, "line": r.line, "expectations": ["parse"], "reason": r.reason, "content": r.content}
                for r in parsed.rejected]
    rejected += batch_quarantined
    return {
        "file": str(path),
        "read": len(parsed.rows) + len(parsed.rejected),
        "accepted": [asdict(q) for q in accepted["train"] if q.source.startswith(mine)],
        "quarantined": sorted(rejected, key=lambda q: q["line"] or 0),
    }


def _batch_rows(outcomes: list[ExpectationOutcome], first: int) -> list[ExpectationOutcome]:
    """The training split's row-level outcomes narrowed to the batch's rows (from index `first`, renumbered
    from 0): the current rows passed the contract when they were validated."""
    narrowed = []
    for outcome in outcomes:
        if outcome.table == "train" and outcome.row_level:
            rows = [i - first for i in outcome.failing_rows if i >= first]
            outcome = replace(outcome, failing_rows=rows, success=not rows)
        narrowed.append(outcome)
    return narrowed


def main(path: Path, against: Path, params: Params) -> int:
    try:
        report = check_batch(path, against, params)
    except (ReaderError, ValidationFailed, FileNotFoundError) as exc:
        print(f"{path}: unusable: {exc}")
        return UNUSABLE
    print(f"{path}: {report['read']} rows read, {len(report['accepted'])} would be accepted, "
          f"{len(report['quarantined'])} quarantined")
    for row in report["quarantined"]:
        why = row.get("reason") or ", ".join(row["expectations"])
        print(f"  line {row['line']}: {why}: {row['content']!r}")
    return QUARANTINED if report["quarantined"] else CLEAN
