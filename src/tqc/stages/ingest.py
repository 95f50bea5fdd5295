"""Ingest: read the raw dataset, carve a stratified validation split, quarantine unparseable rows."""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from tqc.config import DataParams
from tqc.io import write_json, write_jsonl
from tqc.readers import RejectedRow, read_additions, read_dataset, with_added_classes
from tqc.schema import LabeledQuestion, save_questions

log = logging.getLogger(__name__)


def stratified_split(
    questions: list[LabeledQuestion], fraction: float, seed: int
) -> tuple[list[LabeledQuestion], list[LabeledQuestion]]:
    """Seeded per-class split into (train, validation).

    Each class with at least 3 rows gives max(1, round(fraction·n)) rows to validation, so
    early stopping sees every class; rarer classes stay whole in train.
    """
    by_class: dict[str, list[LabeledQuestion]] = defaultdict(list)
    for question in questions:
        by_class[question.class_id].append(question)
    rng = random.Random(seed)
    train, validation = [], []
    for class_id in sorted(by_class):
        members = list(by_class[class_id])
        rng.shuffle(members)
        n_validation = max(1, round(fraction * len(members))) if len(members) >= 3 else 0
        validation.extend(members[:n_validation])
        train.extend(members[n_validation:])
    return train, validation


def long_tail(questions: list[LabeledQuestion], ratio: float, seed: int) -> list[LabeledQuestion]:
    """SharpReCL's imbalanced version: classes ranked by size (then id), the i-th keeps
    ⌊n · ratio^(−i/(C−1))⌋ rows (at least one), n being the largest class; seeded choice."""
    by_class: dict[str, list[LabeledQuestion]] = defaultdict(list)
    for question in questions:
        by_class[question.class_id].append(question)
    ranked = sorted(by_class, key=lambda c: (-len(by_class[c]), c))
    largest, rng, kept = len(by_class[ranked[0]]), random.Random(seed), []
    for i, class_id in enumerate(ranked):
        exponent = i / (len(ranked) - 1) if len(ranked) > 1 else 0.0
        keep = max(1, min(len(by_class[class_id]), int(largest * ratio ** -exponent)))
        kept.extend(rng.sample(by_class[class_id], keep))
    return kept


def stable_split(questions: list[LabeledQuestion], fraction: float, seed: int) -> tuple[list, list]:
    """Each added question's split is a hash of its text: it never changes as more data arrives,
    so a champion is never judged on validation questions it was trained on."""
    def in_validation(question: LabeledQuestion) -> bool:
        digest = hashlib.sha256(f"{seed}:{question.text}".encode("utf-8")).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < fraction

    return [q for q in questions if not in_validation(q)], [q for q in questions if in_validation(q)]


def run(params: DataParams, seed: int, out_dir: Path, quarantine_path: Path, report_path: Path) -> dict:
    started = time.perf_counter()
    splits = read_dataset(params)
    added, added_classes = read_additions(Path(params.additions) if params.additions else None)
    official_train = long_tail(splits.train.rows, params.imbalance_ratio, seed) if params.imbalance_ratio else splits.train.rows
    train, validation = stratified_split(official_train, params.validation_fraction, seed)
    added_train, added_validation = stable_split(added.rows, params.validation_fraction, seed)
    train, validation = train + added_train, validation + added_validation
    catalog = with_added_classes(splits.catalog, added_classes)

    out_dir.mkdir(parents=True, exist_ok=True)
    catalog.save(out_dir / "catalog.jsonl")
    save_questions(out_dir / "train.jsonl", train)
    save_questions(out_dir / "validation.jsonl", validation)
    save_questions(out_dir / "test.jsonl", splits.test.rows)
    rejected: list[RejectedRow] = splits.train.rejected + splits.test.rejected + added.rejected
    write_jsonl(quarantine_path, (dict(asdict(r), stage="ingest") for r in rejected))

    report = {
        "dataset": params.dataset,
        "classes": len(catalog),
        "derived_classes": sum(q.derived for q in catalog.questions),
        "added": {"questions": len(added.rows), "classes": len(catalog) - len(splits.catalog)},
        "read": {"train": len(splits.train.rows) + len(splits.train.rejected), "test": len(splits.test.rows) + len(splits.test.rejected)},
        "rows": {"train": len(train), "validation": len(validation), "test": len(splits.test.rows)},
        "quarantined": len(rejected),
        "seconds": round(time.perf_counter() - started, 2),
    }
    write_json(report_path, report)
    log.info(
        "ingest %s: %d classes; train %d, validation %d, test %d; %d rows quarantined to %s; wrote %s in %.1fs",
        params.dataset, report["classes"], len(train), len(validation), len(splits.test.rows),
        len(rejected), quarantine_path, out_dir, report["seconds"],
    )
    for row in rejected:
        log.warning("quarantined %s, line %d: %s", row.file, row.line, row.reason)
    return report
