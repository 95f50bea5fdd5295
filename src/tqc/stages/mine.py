"""Mine: after stage one, each training question's K most confusable wrong standard questions."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from tqc.config import MineParams
from tqc.device import pick_device
from tqc.io import write_json, write_jsonl
from tqc.mining import mine
from tqc.model.encoder import BiEncoder
from tqc.schema import Catalog, load_questions
from tqc.training import gold_indices

log = logging.getLogger(__name__)


def run(data_dir: Path, train_path: Path, model_dir: Path, params: MineParams, out_path: Path, report_path: Path) -> dict:
    started = time.perf_counter()
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    train_rows = load_questions(train_path)
    model = BiEncoder.load(model_dir).to(pick_device())

    # Oversampled copies repeat texts: encode each distinct text once.
    distinct = sorted({q.text for q in train_rows})
    position = {text: i for i, text in enumerate(distinct)}
    encoded = model.question.encode(distinct, params.batch_size, "mining: encoding questions").numpy()  # (T, D)
    questions = encoded[[position[q.text] for q in train_rows]]  # (N, D)
    standards = model.standard.encode(catalog.texts, params.batch_size, "mining: encoding catalog").numpy()  # (P, D)

    negatives, stats = mine(questions, standards, gold_indices(train_rows, catalog), params.k)
    write_jsonl(out_path, ({"row": i, "class_id": q.class_id, "negatives": [catalog.class_ids[c] for c in negatives[i]]}
                           for i, q in enumerate(train_rows)))
    stats["most_mined_classes"] = [[catalog.class_ids[c], n] for c, n in stats["most_mined_classes"]]
    stats["seconds"] = round(time.perf_counter() - started, 2)
    write_json(report_path, stats)
    log.info("mine: %d questions × %d negatives; gold nearest for %.1f%%; wrote %s and %s (%.1fs)",
             stats["questions"], stats["k"], 100 * stats["gold_is_nearest"], out_path, report_path, stats["seconds"])
    return stats


def load_negatives(path: Path, catalog: Catalog, n_rows: int) -> np.ndarray:
    """The mined negatives as class indices (N, K), checked to align row by row with training."""
    from tqc.io import read_jsonl

    rows = read_jsonl(path)
    if len(rows) != n_rows or any(r["row"] != i for i, r in enumerate(rows)):
        raise ValueError(f"{path}: mined negatives do not align with the {n_rows} training rows; re-run mining")
    return np.array([[catalog.index(c) for c in r["negatives"]] for r in rows], dtype=np.int64)
