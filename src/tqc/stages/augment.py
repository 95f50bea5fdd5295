"""Augment / rebalance: give tail classes extra rows (ADMC §3.2.1), made one of several ways.

`rebalance` picks the count every class is raised to (the mean count per class by default);
`explicit` picks how each extra row is made from an original of its class: a copy, EDA, a
rewrite by local seq2seq models (paraphrase, back-translation), or a row made offline
(`file`: data.generated, attributed to its originals at ingest). Extra rows are marked
`generated` and only ever join train (validation and test are split before this stage).
The implicit augmentations (dropout, cutoff) and the in-batch ones (prototype mixup, cross-
encoding) act inside stage one's training; this stage records them in its report.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from tqc.config import AugmentParams, Seq2SeqParams
from tqc.io import write_json
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, load_questions, save_questions, usable_generated
from tqc.text import normalise

log = logging.getLogger(__name__)


def rebalance_target(counts: Counter, rebalance: str = "mean", target_count: int | None = None) -> int:
    """The one count every class is raised to (0: no rebalancing); `sqrt` has none (see class_targets)."""
    if not counts or rebalance == "none":
        return 0
    if rebalance == "max":
        return max(counts.values())
    if rebalance == "count":
        return int(target_count)
    return math.ceil(sum(counts.values()) / len(counts))  # mean, rounded up


def class_targets(counts: Counter, rebalance: str = "mean", target_count: int | None = None,
                  max_factor: float | None = None) -> dict[str, int]:
    """class id → the rows it should end with (never fewer than it has).

    sqrt: ⌈√(n_c · n_max)⌉, square-root rebalancing: a class 1/r the size of the largest is
    raised to 1/√r of it, so the rarest classes are repeated far less than with `mean` or
    `max`, where a handful of questions copied many times invites over-prediction.
    max_factor caps any target at ⌊max_factor · n_c⌋: 21 questions raised to a mean of 340
    are each seen 16 times an epoch, which widens their standard question's neighbourhood
    more than it adds evidence.
    """
    if rebalance == "sqrt":
        largest = max(counts.values(), default=0)
        targets = {c: math.ceil(math.sqrt(n * largest)) for c, n in counts.items()}
    else:
        target = rebalance_target(counts, rebalance, target_count)
        targets = {c: target for c in counts}
    if max_factor is not None:
        # a small tolerance: 1.15 × 100 is 114.99999999999999 in floats, and the cap is 115 rows
        targets = {c: min(t, math.floor(max_factor * counts[c] + 1e-9)) for c, t in targets.items()}
    return {c: max(counts[c], t) for c, t in targets.items()}


def pick_originals(questions: list[LabeledQuestion], targets: dict[str, int], rng: random.Random) -> list[LabeledQuestion]:
    """For every class under its target, the originals the extra rows start from: a shuffled
    cycle through its rows, so every original is used about equally often."""
    by_class: dict[str, list[LabeledQuestion]] = defaultdict(list)
    for question in questions:
        by_class[question.class_id].append(question)
    picks = []
    for class_id in sorted(by_class):
        order = list(by_class[class_id])
        rng.shuffle(order)
        picks += [order[i % len(order)] for i in range(max(0, targets.get(class_id, 0) - len(order)))]
    return picks


def make_texts(originals: list[LabeledQuestion], questions: list[LabeledQuestion], explicit: str, rng: random.Random,
               seed: int, alpha: float, seq2seq: Seq2SeqParams | None) -> list[str]:
    """The text of each extra row, by the `explicit` method."""
    if explicit == "none":
        return [q.text for q in originals]
    if explicit == "eda":
        from tqc.eda import augment_text, class_vocabularies

        vocabularies = class_vocabularies(questions)
        return [augment_text(q.text, vocabularies[q.class_id], rng, alpha) for q in originals]
    from tqc.seq2seq import Rewriter

    rewrites = Rewriter(explicit, seq2seq or Seq2SeqParams()).rewrite([q.text for q in originals], seed) if originals else []
    # An empty rewrite is no question: keep the original's text rather than train on nothing.
    return [rewrite or original.text for rewrite, original in zip(rewrites, originals)]


SOURCE_PREFIX = {"none": "oversample", "eda": "eda", "paraphrase": "paraphrase", "backtranslate": "backtranslate",
                 "file": "file"}


def drawable_generated(questions: list[LabeledQuestion], generated: list[LabeledQuestion],
                       held_out: frozenset[str] = frozenset()) -> list[LabeledQuestion]:
    """The usable offline rows (`usable_generated`) whose text (as validate compares texts) is no validation or test
    question: after `evaluate.resplit` one can be, and drawn, it would be dropped for a copy while rows were left."""
    return [row for row in usable_generated(questions, generated) if normalise(row.text) not in held_out]


def draw_generated(questions: list[LabeledQuestion], targets: dict[str, int], generated: list[LabeledQuestion],
                   rng: random.Random, held_out: frozenset[str] = frozenset()) -> list[LabeledQuestion]:
    """Extra rows from the drawable offline rows of each class (`drawable_generated`), seeded, up to its target; a
    class whose offline rows run out is topped up with copies (marked `oversample`)."""
    have = Counter(q.class_id for q in questions)
    pool: dict[str, list[LabeledQuestion]] = defaultdict(list)
    for row in drawable_generated(questions, generated, held_out):
        pool[row.class_id].append(row)
    drawn, short = [], {}
    for class_id in sorted(have):
        need = max(0, targets.get(class_id, 0) - have[class_id])
        rows = sorted(pool[class_id], key=lambda r: r.source)  # a fixed order (by source), then a seeded shuffle
        rng.shuffle(rows)
        drawn += [replace(row, generated=True, source=f"{SOURCE_PREFIX['file']}:{row.source}") for row in rows[:need]]
        short[class_id] = have[class_id] + max(0, need - len(rows))
    copies = pick_originals(questions, short, rng)
    return drawn + [replace(q, generated=True, source=f"{SOURCE_PREFIX['none']}:{q.source}") for q in copies]


def oversample(questions: list[LabeledQuestion], targets: dict[str, int], seed: int, explicit: str = "none",
               alpha: float = 0.1, seq2seq: Seq2SeqParams | None = None,
               generated: list[LabeledQuestion] = (), held_out: frozenset[str] = frozenset()) -> list[LabeledQuestion]:
    """The rows, then seeded extra rows until every class has at least its target (`class_targets`).

    New rows are marked `generated`, with `source` naming the method and the original's source
    (for `file`, the offline row's own file and line; one whose text is in `held_out` is not drawn).
    """
    rng = random.Random(seed)
    if explicit == "file":
        return questions + draw_generated(questions, targets, list(generated), rng, held_out)
    originals = pick_originals(questions, targets, rng)
    texts = make_texts(originals, questions, explicit, rng, seed, alpha, seq2seq)
    prefix = SOURCE_PREFIX[explicit]
    return questions + [replace(original, text=text, generated=True, source=f"{prefix}:{original.source}")
                        for original, text in zip(originals, texts)]


def load_generated(path: Path | None, explicit: str) -> list[LabeledQuestion]:
    """The validated offline rows `explicit: file` draws from (ingest's generated.jsonl after validate)."""
    if explicit != "file":
        return []
    if path is None or not path.exists():
        what = f"{path} does not exist" if path else "no file of offline rows was given (tqc augment --generated)"
        raise FileNotFoundError(f"augment.explicit is 'file' but {what}: ingest writes it when data.generated.path "
                                "is set, and validate passes it on (run both again)")
    return load_questions(path)


def _file_report(questions: list[LabeledQuestion], generated: list[LabeledQuestion], extra: list[LabeledQuestion],
                 held_out: frozenset[str]) -> dict:
    usable = usable_generated(questions, generated)
    return {"offline_rows": len(generated), "usable": len(usable), "made_from_held_out_questions": len(generated) - len(usable),
            "usable_but_a_held_out_question": sum(normalise(row.text) in held_out for row in usable),  # not drawable
            "drawn": sum(q.source.startswith(f"{SOURCE_PREFIX['file']}:") for q in extra),
            "copies_where_too_few": sum(q.source.startswith(f"{SOURCE_PREFIX['none']}:") for q in extra)}


def without_texts(made: list[LabeledQuestion], texts: set[str]) -> tuple[list[LabeledQuestion], int]:
    """The made rows whose text (as validate compares texts) is not in `texts`, and how many were dropped."""
    kept = [q for q in made if normalise(q.text) not in texts]
    return kept, len(made) - len(kept)


def label_conflicts(questions: list[LabeledQuestion], made: list[LabeledQuestion],
                    standard_questions: list[StandardQuestion] = ()) -> set[str]:
    """Texts (as validate compares them) that training rows, made rows and the catalog's standard questions give to
    two or more classes. EDA can delete a question down to another class's ("what is?"), or to another class's
    standard question, and two classes' rows can be rewritten into one text; train would then teach both labels for
    it, which validate refuses in training and offline rows. A standard question twin classes share (under a demoted
    catalog_unique_texts) is either's, as validate reads it: a row of one of them with its text is no conflict."""
    classes: dict[str, set[str]] = defaultdict(set)
    for question in [*questions, *made]:
        classes[normalise(question.text)].add(question.class_id)
    owners: dict[str, set[str]] = defaultdict(set)
    for question in standard_questions:
        owners[normalise(question.text)].add(question.class_id)
    return {text for text, ids in classes.items() if len(ids) > 1 or (text in owners and not ids <= owners[text])}


def held_out_texts(paths: list[Path]) -> frozenset[str]:
    return frozenset(normalise(q.text) for path in paths for q in load_questions(path))


def _warn_of_unread_params(params: AugmentParams) -> None:
    """Said, not refused: a leftover from a switch of `rebalance` (`-S augment.rebalance=mean` after `count`) is
    harmless, but a user who set it expects it to do something."""
    if params.explicit != "none" and params.rebalance == "none":
        log.warning("augment: augment.explicit is %r, but augment.rebalance is 'none': no class gets a row more, so "
                    "nothing is made (set a rebalance target, e.g. mean)", params.explicit)
    if params.target_count is not None and params.rebalance != "count":
        log.warning("augment: augment.target_count (%d) is read only by rebalance: count, not %r", params.target_count,
                    params.rebalance)
    if params.max_factor is not None and params.rebalance == "none":
        log.warning("augment: augment.max_factor (%g) caps a rebalance target, and augment.rebalance is 'none': it caps "
                    "nothing", params.max_factor)


def copies_for_dropped(questions: list[LabeledQuestion], made: list[LabeledQuestion], targets: dict[str, int],
                       held_out: set[str], seed: int) -> list[LabeledQuestion]:
    """Copies of training rows (marked as `none`'s are, none a held-out question) for the classes that dropped made
    rows left under their target: the rebalancing target holds whatever the method made."""
    have, made_per_class = Counter(q.class_id for q in questions), Counter(q.class_id for q in made)
    copyable, _ = without_texts(questions, held_out)
    copyable_per_class = Counter(q.class_id for q in copyable)
    short = {c: copyable_per_class[c] + max(0, target - have[c] - made_per_class[c]) for c, target in targets.items()}
    copies = pick_originals(copyable, short, random.Random(seed + 1))  # a stream of its own: `made` stays as drawn
    return [replace(q, generated=True, source=f"{SOURCE_PREFIX['none']}:{q.source}") for q in copies]


@dataclass(frozen=True)
class _Made:
    """The extra rows augment keeps, and what became of those the method made."""
    rows: list[LabeledQuestion]  # the made rows kept, then the copies that took the dropped ones' place
    dropped: int  # made rows whose text is a validation or test question
    conflicting: int  # made rows whose text another class has too (`label_conflicts`)
    refilled: int  # copies of training rows in their place (`copies_for_dropped`)


def _made_rows(questions: list[LabeledQuestion], targets: dict[str, int], params: AugmentParams, seed: int,
               generated: list[LabeledQuestion], held_out: frozenset[str], catalog_path: Path | None) -> _Made:
    """The rows the method makes (`oversample`), less those equal to a held-out question or another class's text, and
    copies of training rows where that left a class under its target."""
    made = oversample(questions, targets, seed, params.explicit, params.eda_alpha, params.seq2seq, generated,
                      held_out)[len(questions):]  # no class short: none
    made, dropped = without_texts(made, held_out)
    standard_questions = Catalog.load(catalog_path).questions if catalog_path else []
    made, conflicting = without_texts(made, label_conflicts(questions, made, standard_questions))
    refilled = copies_for_dropped(questions, made, targets, held_out, seed) if dropped or conflicting else []
    if dropped or conflicting:
        log.warning("augment: dropped %d generated row(s) whose text is a validation or test question and %d whose text "
                    "is another class's too; %d copies of training rows took their place", dropped, conflicting,
                    len(refilled))
    return _Made(made + refilled, dropped, conflicting, len(refilled))


def _warn_of_classes_under_target(augmented: list[LabeledQuestion], targets: dict[str, int]) -> None:
    after = Counter(q.class_id for q in augmented)
    under = [f"{c} ({after[c]} of {target})" for c, target in sorted(targets.items()) if after[c] < target]
    if under:  # every training row of the class is a held-out question too (validate quarantines those as leakage)
        log.warning("augment: %d class(es) under their target: %s", len(under), ", ".join(under[:10]))


def _same_as_an_original(questions: list[LabeledQuestion], made: list[LabeledQuestion]) -> int:
    originals = {(q.class_id, normalise(q.text)) for q in questions}  # as validate compares texts
    return sum((q.class_id, normalise(q.text)) in originals for q in made)


def run(train_path: Path, params: AugmentParams, seed: int, out_path: Path, report_path: Path,
        generated_path: Path | None = None, held_out_paths: list[Path] = (), catalog_path: Path | None = None) -> dict:
    """`held_out_paths`: the validation and test files; a generated row equal to one of their questions is dropped,
    and so is one equal to another class's standard question in `catalog_path`."""
    started = time.perf_counter()
    questions = load_questions(train_path)
    generated = load_generated(generated_path, params.explicit)
    targets = class_targets(Counter(q.class_id for q in questions), params.rebalance, params.target_count,
                            params.max_factor)
    _warn_of_unread_params(params)
    held_out = held_out_texts(list(held_out_paths))
    made = _made_rows(questions, targets, params, seed, generated, held_out, catalog_path)
    augmented = questions + made.rows
    _warn_of_classes_under_target(augmented, targets)
    save_questions(out_path, augmented)
    # the draw's own rows: the copies that took dropped rows' place (last in made.rows) are reported beside them
    drawn = made.rows[:len(made.rows) - made.refilled]
    file_report = _file_report(questions, generated, drawn, held_out) if params.explicit == "file" else None
    report = _report(params, targets, questions, augmented, made, file_report, started)
    write_json(report_path, report)
    log.info(
        "augment: %d → %d training rows (%d generated, rebalance %s); implicit %s at %.2f on the %s; wrote %s and %s "
        "(%.1fs)", len(questions), len(augmented), len(augmented) - len(questions), params.rebalance, params.implicit,
        params.rate, params.implicit_at, out_path, report_path, report["seconds"],
    )
    return report


def _report(params: AugmentParams, targets: dict[str, int], questions: list[LabeledQuestion],
            augmented: list[LabeledQuestion], made: _Made, file_report: dict | None, started: float) -> dict:
    """augment.json: the params that shaped the rows, the rows before and after, and `file_report` where the rows
    were drawn from offline ones."""
    before, after = Counter(q.class_id for q in questions), Counter(q.class_id for q in augmented)
    return {
        "rebalance": params.rebalance,
        "max_factor": params.max_factor,
        "explicit": params.explicit,
        "targets": targets,  # per class; `after` may exceed it where a class already had more
        "implicit": list(params.implicit),
        "rate": params.rate,
        "implicit_at": params.implicit_at,  # the input or the output token matrix
        "in_batch": {"prototype_mixup": params.prototype_mixup.enabled, "cross_encoding": params.cross_encoding.enabled},
        "deferred": params.deferred,  # stage one trains the original rows alone; stage two these
        "rows": {"before": len(questions), "after": len(augmented), "generated": len(augmented) - len(questions),
                 "generated_same_as_an_original": _same_as_an_original(questions, made.rows),
                 "generated_dropped_as_held_out": made.dropped, "generated_dropped_as_label_conflict": made.conflicting,
                 "copies_in_place_of_dropped": made.refilled},
        **({"file": file_report} if file_report is not None else {}),
        "per_class": {c: {"before": before[c], "after": after[c], "generated": after[c] - before[c]} for c in sorted(after)},
        "seconds": round(time.perf_counter() - started, 2),
    }
