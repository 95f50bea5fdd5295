"""Mine: after stage one, each training question's K most confusable wrong standard questions."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from tqc.config import MineParams
from tqc.device import pick_device
from tqc.io import DataFileError, write_json, write_jsonl
from tqc.mining import mine
from tqc.model.encoder import BiEncoder
from tqc.schema import Catalog, StaleNegatives, gold_indices, load_questions
from tqc.twins import standard_text_groups, standard_text_keys

log = logging.getLogger(__name__)


def run(data_dir: Path, train_path: Path, model_dir: Path, params: MineParams, out_path: Path, report_path: Path) -> dict:
    started = time.perf_counter()
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    groups = standard_text_groups(catalog)
    distinct_standard_questions = len(catalog) if groups is None else len(set(groups.tolist()))
    if distinct_standard_questions < 2:
        raise DataFileError(f"{data_dir / 'catalog.jsonl'}: {len(catalog)} class(es), one standard question: there is "
                            "no wrong class to mine, and nothing for the model to tell apart")
    train_rows = load_questions(train_path)
    model = BiEncoder.load(model_dir).to(pick_device())

    # Oversampled copies repeat texts: encode each distinct text once.
    distinct = sorted({q.text for q in train_rows})
    position = {text: i for i, text in enumerate(distinct)}
    encoded = model.question.encode(distinct, params.batch_size, "mining: encoding questions").numpy()  # (T, D)
    questions = encoded[[position[q.text] for q in train_rows]]  # (N, D)
    standards = model.standard.encode(catalog.texts, params.batch_size, "mining: encoding catalog").numpy()  # (P, D)

    gold = gold_indices(train_rows, catalog)
    negatives, stats = mine(questions, standards, gold, params.k, model.similarity, model.score, groups)
    stats["similarity"] = model.similarity
    write_jsonl(out_path, ({"row": i, "class_id": q.class_id, "negatives": [catalog.class_ids[c] for c in negatives[i]]}
                           for i, q in enumerate(train_rows)))
    stats["most_mined_classes"] = [[catalog.class_ids[c], n] for c, n in stats["most_mined_classes"]]
    stats["seconds"] = round(time.perf_counter() - started, 2)
    write_json(report_path, stats)
    log.info("mine: %d questions × %d negatives; gold nearest for %.1f%%; wrote %s and %s (%.1fs)",
             stats["questions"], stats["k"], 100 * stats["gold_is_nearest"], out_path, report_path, stats["seconds"])
    return stats


def load_negatives(path: Path, catalog: Catalog, train_class_ids: list[str]) -> np.ndarray:
    """The mined negatives as class indices (N, K), checked row by row against the training rows' classes; each
    refusal names the file's own line (a blank line between records shifts none)."""
    from tqc.io import numbered_jsonl

    records = numbered_jsonl(path)
    if len(records) != len(train_class_ids):
        raise StaleNegatives(f"{path}: {len(records)} rows of mined negatives for {len(train_class_ids)} training rows; "
                             "re-run mining")
    for line, mined in records:
        if not isinstance(mined, dict):
            raise StaleNegatives(f"{path}, line {line}: a JSON {type(mined).__name__}, not an object; re-run mining")
    k = len(records[0][1].get("negatives") or []) if records else 0  # every row mined the same K
    if records and k == 0:  # stage two's scores would be the gold column alone: every loss 0, nothing learnt
        raise StaleNegatives(f"{path}, line {records[0][0]}: no negatives; re-run mining")
    standard_text = dict(zip(catalog.class_ids, standard_text_keys(catalog)))
    for row, ((line, mined), class_id) in enumerate(zip(records, train_class_ids)):
        where = f"{path}, line {line}"
        _check_mined_row(where, row, mined, class_id, catalog, k)
        _check_no_twin(where, row, mined["negatives"], class_id, standard_text)
    indices = [[catalog.index(c) for c in mined["negatives"]] for _, mined in records]
    return np.array(indices, dtype=np.int64).reshape(len(records), k)  # (N, K), two axes for an empty file too


def _check_mined_row(where: str, i: int, mined: dict, class_id: str, catalog: Catalog, k: int) -> None:
    missing = [key for key in ("row", "class_id", "negatives") if key not in mined]
    if missing or not isinstance(mined["negatives"], list):
        raise StaleNegatives(f"{where}: {'no ' + ', '.join(missing) if missing else 'negatives is not a list'}; "
                             "re-run mining")
    if mined["row"] != i or mined["class_id"] != class_id:
        raise StaleNegatives(f"{where}: mined for row {mined['row']} (class {mined['class_id']!r}), but training row "
                             f"{i} is class {class_id!r}: the negatives are stale; re-run mining")
    if class_id in mined["negatives"]:
        raise StaleNegatives(f"{where}: row {i} lists its own class {class_id!r} as a negative")
    twice = sorted({c for c in mined["negatives"] if mined["negatives"].count(c) > 1})
    if twice:  # mining never repeats a class: a hand-edited file, which would weigh that column twice in the loss
        raise StaleNegatives(f"{where}: row {i} lists {twice} more than once as a negative; re-run mining")
    unknown = [c for c in mined["negatives"] if c not in catalog]
    if unknown:
        raise StaleNegatives(f"{where}: negatives {unknown} are not in the catalog ({len(catalog)} classes): mined "
                             "against another catalog; re-run mining")
    if len(mined["negatives"]) != k:
        raise StaleNegatives(f"{where}: {len(mined['negatives'])} negatives where the first record has {k}; re-run mining")


def _check_no_twin(where: str, i: int, negatives: list[str], class_id: str, standard_text: dict[str, str]) -> None:
    """Mining never returns a class sharing the gold's standard question (`standard_text_groups`): stage two's
    `mined` columns have no twin mask of their own, so a hand-edited or other catalog's file would push a question
    away from its own standard question's text. A gold class the catalog lacks is `gold_indices`' to name, with its
    training row's source."""
    twins = [c for c in negatives if standard_text[c] == standard_text.get(class_id)]
    if twins:
        raise StaleNegatives(f"{where}: row {i} lists {twins} as negatives, which share class "
                             f"{class_id!r}'s standard question; re-run mining")
