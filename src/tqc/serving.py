"""The stage-two model as an MLflow pyfunc: questions in, top-k standard questions with scores out.

    model = mlflow.pyfunc.load_model("models:/tqc-admc@champion")
    model.predict(pd.DataFrame({"question": ["how do I reset my PIN?"]}), params={"top_k": 3})

returns one row per (question, rank): question, rank, class_id, standard_question, score.
The artifacts are the model's safetensors folder, the catalog and, where the prior stage ran,
its file: the score is then the similarity plus the class-prior shift fitted on validation
(tqc.prior), which is what evaluate measured as ADMC. A version registered with the exemplar
rule (`promote.rule: exemplars`) carries labeled questions instead of a prior file: each class
scores the mean similarity of its k nearest ones (tqc.exemplars), what evaluate reports as
`exemplars`, and the answer is still that class's standard question. The `tqc` package must be
installed where the model is loaded.

How a version is logged and registered is `tqc.registry`; where the exemplar rule's encoded questions are kept
between loads, `tqc.exemplar_cache`.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable
from pathlib import Path

from tqc.tracking import mlflow_without_telemetry

# The matcher subclasses MLflow's PythonModel, so MLflow is imported with this module; a library user importing it (a
# script, a notebook) would otherwise have MLflow send usage records and write ~/.config/mlflow, as the CLI never lets.
# Only that: the entry points' retry bound (`offline_mlflow`) would change the importer's own MLflow client.
mlflow_without_telemetry()
import mlflow.pyfunc  # noqa: E402
import pandas as pd  # noqa: E402

from tqc.exemplar_cache import exemplar_bank  # noqa: E402
from tqc.registry import EXEMPLAR_VECTORS, folder_digest, served_artifacts, served_config  # noqa: E402
from tqc.text import first_of, has_words, normalise, sharing_a_key  # noqa: E402

OUTPUT_COLUMNS = ["question", "rank", "class_id", "standard_question", "score"]
# Versions registered before model_config named their prior file's entry always carried ADMC's.
FIRST_REGISTERED_ENTRY = "admc"
# A question is read to the model's max_length tokens (128 by default), but the tokenizer reads it whole first, twice
# (the cut said, then encoded): a 2 MB question held a served process 9 s and 1.1 GB. Far above any question asked.
MAX_QUESTION_CHARS = 100_000


class StandardQuestionMatcher(mlflow.pyfunc.PythonModel):
    # `tqc predict` sets a folder where the exemplar rule's encoded questions are kept between calls; a registered
    # version leaves it None and reads the vectors registered with it (`EXEMPLAR_VECTORS`), else encodes them per load.
    exemplar_cache: Path | None = None
    # `tqc predict --encoding`: the codec of a catalog given as CSV (None: UTF-8). A registered version's catalog is the
    # pipeline's JSONL, which is UTF-8.
    catalog_encoding: str | None = None
    # Whether `predict` warns of the questions it cuts at the model's max_length, by their rows. `tqc predict` says them
    # itself, once for all its chunks, by their arguments and lines.
    says_cut: bool = True

    def load_context(self, context) -> None:
        import torch

        from tqc import prior
        from tqc.model.encoder import BiEncoder
        from tqc.prior import PriorShift
        from tqc.readers.catalogs import load_catalog

        model_dir = Path(context.artifacts["model"])
        # The exemplar cache's key: the weights as loaded, so a folder replaced during the load (a retrain) is not
        # keyed under what it became
        shipped = context.artifacts.get(EXEMPLAR_VECTORS)
        wants_digest = (self.exemplar_cache is not None or shipped is not None) and context.artifacts.get("exemplars")
        digest = folder_digest(model_dir) if wants_digest else None
        self.model = BiEncoder.load(model_dir).eval()
        if digest is not None and folder_digest(model_dir) != digest:
            digest = None  # the folder changed while loading: its vectors are encoded, not cached
        self.catalog = load_catalog(context.artifacts["catalog"], self.catalog_encoding)
        if not len(self.catalog):  # else every question would get an empty ranking, and a caller no error
            raise ValueError(f"{context.artifacts['catalog']}: no standard questions, so no question can be answered")
        prior_file, config = context.artifacts.get("prior"), context.model_config or {}
        self.exemplars = exemplar_bank(self.model, digest, self.catalog, context.artifacts.get("exemplars"), config,
                                        self.exemplar_cache, shipped)
        # (P, D), encoded once per load; the exemplar rule never reads them
        self.standards = self.model.standard.encode(self.catalog.texts) if self.exemplars is None else None
        if self.exemplars is None:
            _say_shared_standard_questions(self.catalog, context.artifacts["catalog"])
        if prior_file:  # the entry `_model_config` found for this model when it was logged
            name = config.get("prior_model", FIRST_REGISTERED_ENTRY)
            entries = prior.read_file(Path(prior_file))
            if name not in entries:  # was a KeyError naming the entry alone: a traceback from `tqc predict`
                named_by = "its model_config's prior_model" if "prior_model" in config else "registered before prior_model"
                raise prior.PriorFileError(f"{prior_file}: no entry {name!r} ({named_by}), only {sorted(entries)}: "
                                           "this version's files do not belong together; register the model again")
            entry = entries[name]
            shift = PriorShift.from_json(entry, self.catalog.class_ids, f"{prior_file}, entry {name!r}",
                                         catalog_may_drop_classes=True).shift
        else:
            shift = prior.no_shift(len(self.catalog)).shift
        self.shift = torch.as_tensor(shift, dtype=torch.float32)  # (P,): 0 for a model registered without one
        self.default_top_k = int(config.get("top_k", 5))

    def answerable_class_ids(self) -> list[str]:
        """The catalog's classes this model can answer with: every one under the standard rule, those with an exemplar
        under the exemplar rule. In catalog order."""
        if self.exemplars is None:
            return list(self.catalog.class_ids)
        with_exemplars = set(self.exemplars.classes.tolist())
        return [c for i, c in enumerate(self.catalog.class_ids) if i in with_exemplars]

    # The hint is the registry's contract (`signature`: a "question" column); MLflow infers no schema
    # from a DataFrame hint, so it keeps the logged signature, and without a hint it warns on every import.
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        import torch

        asked_k = (params or {}).get("top_k", self.default_top_k)
        if isinstance(asked_k, bool) or not isinstance(asked_k, numbers.Integral) or asked_k < 1:  # before any encoding
            raise ValueError(f"params top_k must be a whole number of at least 1, not {asked_k!r}")
        questions = _questions(model_input)
        if self.says_cut:
            say_cut(self.model.question, questions, lambda rows: f"row(s) {first_of(rows)}")
        with torch.no_grad():
            asked = self.model.question.encode(questions)  # (N, D)
            if self.exemplars is None:
                scores = self.model.score(asked, self.standards).float().cpu() + self.shift  # (N, P)
            else:  # classes without an exemplar score −inf: they are left out of the ranking below
                scores = torch.as_tensor(self.exemplars.scores(asked), dtype=torch.float32)  # (N, P)
        diverged = torch.isnan(scores).any(dim=1).nonzero().flatten().tolist()
        if diverged:  # topk would rank NaN first, and the answer's JSON would hold a NaN no reader accepts
            raise ValueError(f"the model scores NaN for {len(diverged)} question(s) (row {diverged[0]} first): its weights "
                             "or its exemplars' vectors are not finite; train it again")
        answerable = len(self.catalog) if self.exemplars is None else self.exemplars.answerable
        top_k = min(int(asked_k), answerable)
        # a stable sort, not topk: tied classes in catalog order, as evaluate ranks them (topk keeps no order among ties)
        values, indices = (t[:, :top_k] for t in scores.sort(dim=1, descending=True, stable=True))  # (N, k)
        rows = [
            (question, rank + 1, self.catalog.class_ids[i], self.catalog.texts[i], float(v))
            for question, row_values, row_indices in zip(questions, values.tolist(), indices.tolist())
            for rank, (v, i) in enumerate(zip(row_values, row_indices))
        ]
        return pd.DataFrame(rows, columns=OUTPUT_COLUMNS)


def _say_shared_standard_questions(catalog, catalog_path) -> None:
    """One warning where classes share one standard question (as validate compares texts, `normalise`): the standard
    rule scores them alike, so only one of each such group can ever be a first answer (the first in catalog order, or
    the one the class-prior shift favours). Validate refuses such a catalog unless `catalog_unique_texts` is demoted;
    a catalog handed to `tqc predict --catalog` was never validated."""
    shared = sharing_a_key(catalog.class_ids, map(normalise, catalog.texts))
    if shared:
        logging.getLogger(__name__).warning(
            "%s: %d group(s) of classes share one standard question, so the standard rule scores each group's classes "
            "alike and only one of them can be a first answer: %s; give each class its own text, or serve the exemplar "
            "rule (--exemplars), which tells them apart by their labeled questions", catalog_path, len(shared),
            first_of([" = ".join(ids) for ids in shared], 5, "; "))


def say_cut(encoder, questions: list[str], where: Callable[[list[int]], str]) -> None:
    """One warning for the questions (N,) that `encoder` cuts at its max_length, if any: they are answered from their
    first tokens alone, which a user would not otherwise know. `where` names them, given their positions in `questions`."""
    cut = encoder.overlong(questions)
    if cut:
        logging.getLogger(__name__).warning(
            "%d question(s) longer than model.max_length (%d tokens, the model's setting when it was trained) are cut to "
            "their first %d tokens, and answered from those alone: %s", len(cut), encoder.max_length, encoder.max_length,
            where(cut))


def local_matcher(model_dir: Path, catalog_path: Path, top_k: int = 5, prior_path: Path | None = None,
                  exemplars: tuple[Path, int] | None = None, exemplar_cache: Path | None = None,
                  catalog_encoding: str | None = None) -> StandardQuestionMatcher:
    """The matcher the registry serves, loaded from local folders (`tqc predict`): the same code answers.

    `prior_path`: a prior stage's file with an entry fitted for `model_dir` (None: similarity alone).
    `exemplars`: (labeled questions JSONL, k) to serve the exemplar rule instead, which has no shift;
    `exemplar_cache`: a folder keeping their encoded vectors between calls (None: encode every time).
    `catalog_encoding`: the codec of a CSV `catalog_path` (None: UTF-8)."""
    from types import SimpleNamespace

    from tqc.model.encoder import MODEL_CONFIG

    if not (Path(model_dir) / MODEL_CONFIG).exists():
        raise FileNotFoundError(f"{model_dir}: not a tqc model folder (no {MODEL_CONFIG}; `dvc repro` writes models/stage_two)")
    if not Path(catalog_path).is_file():  # a folder too: said here, not as IsADirectoryError's traceback
        raise FileNotFoundError(f"{catalog_path}: no catalog there (`dvc repro` writes data/validated/catalog.jsonl)")
    if exemplars is not None and not Path(exemplars[0]).is_file():
        raise FileNotFoundError(f"{exemplars[0]}: no labeled questions there (`dvc repro` writes data/validated/train.jsonl)")
    matcher = StandardQuestionMatcher()
    matcher.exemplar_cache = exemplar_cache
    matcher.catalog_encoding = catalog_encoding
    matcher.load_context(SimpleNamespace(artifacts=served_artifacts(model_dir, catalog_path, prior_path, exemplars),
                                         model_config=served_config(model_dir, prior_path, top_k, exemplars)))
    return matcher


def registered_matcher(uri: str) -> StandardQuestionMatcher:
    """The matcher a registered version serves (models:/NAME@ALIAS or models:/NAME/VERSION), built by this installed
    tqc from the version's files and model_config, as its `served_model.py` builds it where MLflow serves it.

    Not through `mlflow.pyfunc.load_model`, which runs the code stored with a version: `served_model.py` for one tqc
    registered, but a pickle for one logged with a Python object, which unpickling runs. Whoever can register a version
    in a shared registry and move the alias could otherwise run code wherever tqc loads the champion (predict,
    promote, set-champion). A version without tqc's artifacts is refused, its files never read as a model."""
    import tempfile
    from types import SimpleNamespace

    from tqc.registry import version_artifacts

    with tempfile.TemporaryDirectory(prefix="tqc-registered-") as scratch:
        artifacts, config = version_artifacts(uri, Path(scratch))
        missing = [name for name in ("model", "catalog") if name not in artifacts]
        if missing:
            raise ValueError(f"{uri} is not a version tqc registered (it has no {' or '.join(missing)} artifact), so it "
                             "is not loaded: tqc never runs the code or pickle another tool stored with a version")
        matcher = StandardQuestionMatcher()
        # Everything is read here (weights, tokenizer, catalog, shift, exemplar vectors), so the download can go
        matcher.load_context(SimpleNamespace(artifacts={name: str(path) for name, path in artifacts.items()},
                                             model_config=config))
    return matcher


def served_first_answers(uri: str, questions: list[str]) -> tuple[list[str], list[str]]:
    """(N,) the class id of each question's first answer, from a registered version's matcher as it is served; and the
    classes it can answer with (`answerable_class_ids`)."""
    matcher = registered_matcher(uri)
    matcher.says_cut = False  # validation questions, which evaluate scores cut as silently
    answers = matcher.predict(None, pd.DataFrame({"question": questions}), params={"top_k": 1})
    return answers[answers["rank"] == 1]["class_id"].tolist(), matcher.answerable_class_ids()  # in question order


def ranked_records(questions: list[str], answers: pd.DataFrame) -> list[dict]:
    """`predict`'s rows (question, rank, …) → one record per question, as evaluate writes its predictions."""
    per_question = len(answers) // len(questions) if questions else 0
    return [{"text": question,
             "top_k": [{"class_id": row.class_id, "standard_question": row.standard_question, "score": round(row.score, 6)}
                       for row in answers.iloc[i * per_question:(i + 1) * per_question].itertuples()]}
            for i, question in enumerate(questions)]


def _questions(model_input) -> list[str]:
    """The questions asked, in order: a DataFrame's "question" column (else its first), a string, or a list.

    A row with no question (null, NaN, blank) or one that is not text is an error naming the row: str() would
    turn it into "nan" or "None", which the model answers as confidently as any real question."""
    if isinstance(model_input, pd.DataFrame):
        if len(model_input.columns) == 0:  # DataFrame(): no column to read, as no question to answer
            raise ValueError('no questions: the frame has no columns; give a "question" column')
        column = "question" if "question" in model_input.columns else model_input.columns[0]
        asked = model_input[column].tolist()
    else:
        asked = [model_input] if isinstance(model_input, str) else list(model_input)
    # No word once normalised (blank, zero-width or control characters, a lone accent): the tokenizer would turn it
    # into [CLS] [SEP] alone, which the model would still answer.
    bad = [(row, q) for row, q in enumerate(asked) if not isinstance(q, str) or not has_words(q)]
    if bad:
        raise ValueError(f"every question must be non-blank text: {first_of([f'row {row} ({q!r})' for row, q in bad], 5)}")
    long_rows = too_long(asked)
    if long_rows:
        raise ValueError(said_too_long(first_of([f"row {row} ({len(asked[row]):,} characters)" for row in long_rows], 5)))
    return asked


def too_long(questions: list[str]) -> list[int]:
    """The indexes of the questions past MAX_QUESTION_CHARS, which serving refuses (`said_too_long`)."""
    return [i for i, question in enumerate(questions) if len(question) > MAX_QUESTION_CHARS]


def said_too_long(named: str) -> str:
    return f"a question may be at most {MAX_QUESTION_CHARS:,} characters (the model reads only its first tokens): {named}"
