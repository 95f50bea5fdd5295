"""The optional warm-up before stage one: EBSIM's weakly supervised triplets on unlabelled questions (§3.2-3.3).

A pool of questions (a file of unlabelled ones, and the training questions with their labels dropped) is ranked
against every standard question by the pretrained model; the triplets it gives (`tqc.warmup_triplets`) train both
encoders with the margin triplet loss, ξ the model's own similarity. Stage one then starts from these weights
(`tqc.model.warm_start`). Held-out questions never enter the pool: a row whose text is a validation or test
question's (as validate compares texts) is quarantined, with its file, line and reason, as are rows with no text
or no letter or digit.

Off (`warmup.enabled: false`, the default) it trains nothing and writes only its skip record, so stage one starts
from model.pretrained as before.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from tqc import distributed
from tqc.config import ConfigError, DataParams, ModelParams, WarmupParams
from tqc.device import pick_device, seed_everything
from tqc.io import atomic_directory, write_json, write_jsonl
from tqc.losses import triplet_margin
from tqc.model.encoder import BiEncoder
from tqc.model.warm_start import SKIP_RECORD
from tqc.readers import ReaderError, read_texts, read_unlabelled, unusable_data_file
from tqc.schema import Catalog, LabeledQuestion, load_questions, split_source
from tqc.text import LETTER_OR_DIGIT, compared_text, first_control_character
from tqc.training import FitResult, OnEpoch, bi_encoder_validator, fit, parameter_groups
from tqc.warmup_triplets import Triplet, WordVectors, build_triplets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolRow:
    text: str
    file: str
    line: int | None


@dataclass
class Pool:
    """The questions the warm-up ranks, each text once, and what was kept out of them."""

    texts: list[str] = field(default_factory=list)
    quarantined: list[dict] = field(default_factory=list)
    duplicates: int = 0  # rows whose text an earlier row has (as validate compares texts): merged into it


def question_pool(rows: list[PoolRow], held_out: dict[str, str]) -> Pool:
    """The usable rows' texts, each once; the others quarantined with their file, line and reason. `held_out`: each
    validation and test question's `compared_text` → its split."""
    pool, seen = Pool(), set()
    for row in rows:
        key = compared_text(row.text)
        reason = _unusable(row.text, key, held_out)
        if reason:
            pool.quarantined.append({"stage": "warmup", "file": row.file, "line": row.line, "reason": reason,
                                     "content": {"text": row.text}})
        elif key in seen:
            pool.duplicates += 1
        else:
            seen.add(key)
            pool.texts.append(row.text)
    return pool


def _unusable(text: str, key: str, held_out: dict[str, str]) -> str:
    """Why a row of `text` (its compared text `key`) cannot join the pool ("" when it can): validate's rules for a
    question on its own, bar its length bound (validate's param), and no held-out question."""
    if control := first_control_character(text):
        return f"no_control_characters: U+{ord(control.group()):04X} at character {control.start() + 1}"  # as validate says
    if not key:
        return "non_empty_text: no text (empty, or no character a tokenizer reads)"
    if not re.search(LETTER_OR_DIGIT, key):
        return "has_letter_or_digit: no letter or digit, so no question"
    if key in held_out:
        return (f"no_leakage: the same question as a {held_out[key]} question (as validate compares texts): held-out "
                "questions never reach the warm-up")
    return ""


def pool_rows(params: WarmupParams, data_params: DataParams,
              train_rows: list[LabeledQuestion]) -> tuple[list[PoolRow], int]:
    """The unlabelled file's rows, then the training questions' (labels dropped) when `include_train`; and how many
    of the file's rows carried a label in `warmup.label_column`, left out."""
    rows, labelled = _unlabelled_rows(params, data_params) if params.unlabelled else ([], 0)
    if params.include_train:
        for question in train_rows:
            rows.append(PoolRow(question.text, *split_source(question.source)))
    return rows, labelled


def _unlabelled_rows(params: WarmupParams, data_params: DataParams) -> tuple[list[PoolRow], int]:
    """warmup.unlabelled's rows (with `label_column`, those without a label) and how many rows carried a label; a file
    that is not there, or does not parse, is an error naming the setting. It is read in data.custom.encoding, as the
    user's other files under data_dir are (a Chinese Excel's export of unlabelled questions is GBK as its labeled one)."""
    path = Path(data_params.data_dir) / params.unlabelled
    problem = unusable_data_file("warmup.unlabelled", params.unlabelled, data_params.data_dir)
    if problem:
        raise ConfigError(problem)
    try:
        if params.label_column is None:
            texts, labelled = read_texts(path, params.text_column, data_params.custom.encoding), 0
        else:
            texts, labelled = read_unlabelled(path, params.text_column, params.label_column, data_params.custom.encoding)
        return [PoolRow(text, str(path), line) for line, text in texts], labelled
    except ReaderError as exc:
        columns = f"warmup.text_column {params.text_column!r}" + (
            f", warmup.label_column {params.label_column!r}" if params.label_column else "")
        raise ReaderError(f"warmup.unlabelled ({columns}): {exc}") from None


def held_out_texts(splits: dict[str, list[LabeledQuestion]]) -> dict[str, str]:
    """Each held-out question's compared text → its split (the later split where two have it: test, after validation)."""
    return {compared_text(q.text): split for split, questions in splits.items() for q in questions}


def mask_token_of(model: BiEncoder, pretrained: str) -> str:
    token = model.question.tokenizer.mask_token
    if not token:
        raise ConfigError(f"warmup.enabled: model.pretrained {pretrained!r} has no mask token, which the warm-up's "
                          "structure-level triplets put in place of a question's shared words; set warmup.enabled: false")
    return token


@torch.no_grad()
def weak_triplets(model: BiEncoder, catalog: Catalog, pool: list[str], params: WarmupParams, mask_token: str,
                  batch_size: int = 256) -> list[Triplet]:
    """The triplets of `tqc.warmup_triplets`, ranked by `model` as it is (the pretrained one)."""
    titles = model.standard.encode(catalog.texts, batch_size, "encoding catalog")  # (P, D)
    questions = model.question.encode(pool, batch_size, "encoding the warm-up pool")  # (N, D)
    scores = model.score(questions, titles).float().cpu().numpy().T  # (P, N)
    tokenizer = model.question.tokenizer
    vectors = WordVectors(lambda word: tokenizer(word, add_special_tokens=False)["input_ids"],
                          model.question.backbone.get_input_embeddings().weight)
    return build_triplets(catalog.texts, pool, np.asarray(scores), vectors, params.candidates, params.mask_threshold,
                          params.max_mask_fraction, mask_token)


def train(model: BiEncoder, triplets: list[Triplet], validation: list[LabeledQuestion], catalog: Catalog,
          params: WarmupParams, seed: int, on_epoch: OnEpoch | None = None) -> FitResult:
    """Every epoch of the triplets, the last weights kept: validation (zero-shot, against the catalog) is reported,
    and chooses nothing, since the warm-up learns no classes."""

    def batch_loss(rows: list[int]) -> torch.Tensor:
        batch = [triplets[i] for i in rows]
        titles, column = np.unique([t.title for t in batch], return_inverse=True)  # (U,), (B,) each row's title column
        anchors = model.embed_standards([catalog.texts[c] for c in titles.tolist()])  # (U, D)
        sentences = model.embed_questions([t.closer for t in batch] + [t.farther for t in batch])  # (2B, D)
        scores = model.score(sentences, anchors)  # (2B, U): ξ of each sentence against each title
        rows_of = torch.arange(len(batch), device=scores.device)  # (B,)
        columns = torch.as_tensor(column, device=scores.device)  # (B,)
        closer = scores[rows_of, columns]  # (B,) ξ(t, s_p)
        farther = scores[rows_of + len(batch), columns]  # (B,) ξ(t, s_n)
        return triplet_margin(closer, farther, margin=params.margin)

    return fit(model, parameter_groups(model, params.learning_rate), batch_loss, len(triplets),
               bi_encoder_validator(model, validation, catalog), params.schedule(), seed=seed, description="warm-up",
               on_epoch=on_epoch, keep="last")


def run(data_dir: Path, model_params: ModelParams, params: WarmupParams, data_params: DataParams, seed: int,
        out_dir: Path, report_path: Path, quarantine_path: Path, on_epoch: OnEpoch | None = None) -> FitResult:
    if not params.enabled:
        return _write_skipped(out_dir, report_path, quarantine_path)
    started = time.perf_counter()
    seed_everything(seed)
    catalog = Catalog.load(data_dir / "catalog.jsonl")
    rows, labelled = _read_pool_rows(data_dir, params, data_params)
    validation = load_questions(data_dir / "validation.jsonl")
    pool = _quarantined_pool(rows, validation, load_questions(data_dir / "test.jsonl"), quarantine_path)
    model = BiEncoder.from_params(model_params).to(pick_device())
    triplets, kinds = _ranked_triplets(model, catalog, pool, len(rows), params,
                                       mask_token_of(model, model_params.pretrained))
    result = train(model, triplets, validation, catalog, params, seed, on_epoch)
    if distributed.is_main():
        model.save(out_dir, _metadata(model_params, params, kinds))
        write_json(report_path, _report(params, rows, labelled, pool, kinds, result, time.perf_counter() - started))
        log.info("warm-up: wrote %s and %s", out_dir, report_path)
    return result


def _read_pool_rows(data_dir: Path, params: WarmupParams, data_params: DataParams) -> tuple[list[PoolRow], int]:
    """`pool_rows` from the unlabelled file and the validated training questions, saying how many were left out as
    labelled."""
    train_rows = load_questions(data_dir / "train.jsonl") if params.include_train else []
    rows, labelled = pool_rows(params, data_params, train_rows)
    if labelled:
        log.info("warm-up: left out %d row(s) of %s that carry a label in %r (labelled questions belong in the training "
                 "data)", labelled, params.unlabelled, params.label_column)
    return rows, labelled


def _quarantined_pool(rows: list[PoolRow], validation: list[LabeledQuestion], test: list[LabeledQuestion],
                      quarantine_path: Path) -> Pool:
    """`question_pool` with the held-out splits kept out; what it kept out written to `quarantine_path` (by rank 0)."""
    pool = question_pool(rows, held_out_texts({"validation": validation, "test": test}))
    if distributed.is_main():
        write_jsonl(quarantine_path, pool.quarantined)
    if pool.quarantined:
        log.warning("warm-up: %d pool row(s) quarantined to %s (no text, no letter or digit, or a held-out question)",
                    len(pool.quarantined), quarantine_path)
    return pool


def _ranked_triplets(model: BiEncoder, catalog: Catalog, pool: Pool, rows_read: int, params: WarmupParams,
                     mask_token: str) -> tuple[list[Triplet], dict[str, int]]:
    """`weak_triplets`, ranked by rank 0 and handed to every process, and how many of each kind; none is an error."""
    # Under torchrun rank 0 ranks the pool, and every process trains on its triplets: each ranking its own, a score
    # a last digit apart on another device (kernels are not bitwise reproducible across devices) could give a process
    # other triplets, or another number of them, and so of steps, which would hang the others in an all-reduce.
    # Everything before is read from the same files alike in every process (the pool, its quarantine, rank 0 writing it).
    triplets = distributed.from_main(weak_triplets(model, catalog, pool.texts, params, mask_token)
                                     if distributed.is_main() else None)
    kinds = {kind: sum(t.kind == kind for t in triplets) for kind in ("token", "structure")}
    log.info("warm-up: %d pool questions (%d rows read, %d duplicates merged, %d quarantined) → %d token-level and %d "
             "structure-level triplets against %d standard questions", len(pool.texts), rows_read, pool.duplicates,
             len(pool.quarantined), kinds["token"], kinds["structure"], len(catalog))
    if not triplets:
        raise ConfigError(f"warmup: no triplets: {len(pool.texts)} pool question(s) make no pair for any standard question "
                          "(warmup.candidates needs at least two); add unlabelled questions or set warmup.enabled: false")
    return triplets, kinds


def _metadata(model_params: ModelParams, params: WarmupParams, kinds: dict[str, int]) -> dict:
    """What the warmed-up model folder says made it (stage one checks its model settings against them)."""
    return {"stage": "warmup", "pretrained": model_params.pretrained, "model": model_params.model_dump(mode="json"),
            "params": params.model_dump(mode="json"), "triplets": kinds}


def _report(params: WarmupParams, rows: list[PoolRow], labelled: int, pool: Pool, kinds: dict[str, int], result: FitResult,
            seconds: float) -> dict:
    return {"enabled": True, "rows_read": len(rows), "labelled_rows_left_out": labelled, "pool": len(pool.texts), "duplicates_merged": pool.duplicates,
            "quarantined": len(pool.quarantined), "triplets": kinds, "epochs": len(result.history) - 1,
            "loss": result.history[-1].train_loss,
            "validation_macro_f1": {"start": result.history[0].validation_macro_f1,
                                    "end": result.history[-1].validation_macro_f1},
            "history": [asdict(record) for record in result.history], "seconds": round(seconds, 1),
            "params": params.model_dump(mode="json")}


def _write_skipped(out_dir: Path, report_path: Path, quarantine_path: Path) -> FitResult:
    """The skip record alone in the model folder (stage one then starts from model.pretrained), an empty quarantine and
    a report saying so: every output dvc.yaml declares, no weights."""
    if not distributed.is_main():
        return FitResult.of([])
    reason = {"enabled": False, "reason": "warmup.enabled is false: stage one starts from model.pretrained"}
    with atomic_directory(out_dir) as staging:
        (staging / SKIP_RECORD).write_text(json.dumps(reason) + "\n", encoding="utf-8")
    write_json(report_path, reason)
    write_jsonl(quarantine_path, [])
    log.info("warm-up: skipped (warmup.enabled: false); wrote the record %s", out_dir / SKIP_RECORD)
    return FitResult.of([])
