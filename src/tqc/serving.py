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
"""

from __future__ import annotations

import hashlib
import json
import logging
import numbers
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

from tqc.tracking import mlflow_without_telemetry

# The matcher subclasses MLflow's PythonModel, so MLflow is imported with this module; a library user importing it (a
# script, a notebook) would otherwise have MLflow send usage records and write ~/.config/mlflow, as the CLI never lets.
# Only that: the entry points' retry bound (`offline_mlflow`) would change the importer's own MLflow client.
mlflow_without_telemetry()
import mlflow.pyfunc  # noqa: E402
import pandas as pd  # noqa: E402
from mlflow.models import ModelSignature  # noqa: E402
from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema  # noqa: E402

from tqc.text import first_of, has_words, normalise, sharing_a_key  # noqa: E402

# The model version tag holding `content_digest`: a version serving the same content is not registered again.
DIGEST_TAG = "content_digest"
# The tag holding `content_digest` without how answers are served (top_k): a version whose answers are the champion's
# differs from it only in serving, and takes its place without a validation gate it could never pass.
ANSWERS_TAG = "answers_digest"
# What of a prior entry decides the answers: the fitted λ's grid figures, τ and the folder name only record the fit.
SERVED_PRIOR_KEYS = ("shift", "weight", "target")
OUTPUT_COLUMNS = ["question", "rank", "class_id", "standard_question", "score"]
# Versions registered before model_config named their prior file's entry always carried ADMC's.
FIRST_REGISTERED_ENTRY = "admc"
# The artifact listing the questions a version learnt from, as `question_hash`es. Promote judges a champion only on
# validation questions neither model learnt from: a later split (grown data, a changed seed or rule) can put questions
# an older champion trained on into validation, where it answers them from memory.
TRAINED_ON = "trained_on"
# A version registered before versions kept that artifact gets its record afterwards (`record_trained_on`): logged into
# the version's own run, and named by this model version tag (its artifact URI), since a version's files are fixed.
TRAINED_ON_TAG = "trained_on_record"


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
        self.exemplars = _exemplar_bank(self.model, digest, self.catalog, context.artifacts.get("exemplars"), config,
                                        self.exemplar_cache, shipped)
        # (P, D), encoded once per load; the exemplar rule never reads them
        self.standards = self.model.standard.encode(self.catalog.texts) if self.exemplars is None else None
        if self.exemplars is None:
            _say_shared_standard_questions(self.catalog, context.artifacts["catalog"])
        if prior_file:  # the entry `_model_config` found for this model when it was logged
            name = config.get("prior_model", FIRST_REGISTERED_ENTRY)
            entry = prior.read_file(Path(prior_file))[name]
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


def _exemplar_bank(model, model_digest: dict | None, catalog, exemplars_file: str | None, config: dict,
                   cache_dir: Path | None, shipped: str | None = None):
    """The exemplar rule's encoded labeled questions (None: the standard-question rule); `model_digest`: the loaded
    weights' folder digest, the cache's key (None: encoded, not cached); `shipped`: the vectors registered with the
    version, if any."""
    if exemplars_file is None:
        return None
    from tqc.exemplars import ExemplarBank, catalog_indices, load_exemplars

    rows = load_exemplars(Path(exemplars_file))  # a registered version reads its own copy of the file
    classes = catalog_indices(rows, catalog, exemplars_file)  # (M,) before encoding: a bad class costs no encode
    vectors = _encoded_exemplars(model, rows, model_digest, Path(exemplars_file), cache_dir,
                                 Path(shipped) if shipped else None)  # (M, D)
    return ExemplarBank(vectors, classes, len(catalog), int(config["exemplar_k"]))


def _encoded_exemplars(model, rows, model_digest: dict | None, exemplars_file: Path, cache_dir: Path | None,
                       shipped: Path | None = None, key: tuple[str, str] | None = None):
    """(M, D) question-encoder vectors of `rows`; with `model_digest`, read from `shipped` (the entry registered
    with a version, never written to) or `cache_dir` when this model folder encoded these very questions before,
    else encoded, and written to `cache_dir` when there is one. `key`: their `_cache_key`, where the caller has it
    already (it hashes every question).

    The key is the sha256 of the model folder and of the questions `rows` holds, not of the file: a file
    appended to after `rows` were read would otherwise key the old rows' vectors under its new content. A new
    entry replaces the one this model made of the same file before, so the folder keeps one per model and file, and
    only the `EXEMPLAR_CACHE_ENTRIES` used last: each retrain is a new model, whose entries would otherwise pile up
    (TREC-50's rows take 7.7 MB an entry)."""
    if model_digest is None:
        return _encode_exemplars(model, rows)
    slot, entry = key or _cache_key(model_digest, rows, exemplars_file)
    vectors = _registered_entry(shipped, entry, model, rows)
    if vectors is not None:
        return vectors
    if cache_dir is None:
        return _encode_exemplars(model, rows)
    path = Path(cache_dir) / f"{slot}-{entry}.safetensors"
    vectors = _whole_entry(path, model, rows) if path.exists() else None
    if vectors is not None:
        _touch(path)  # used: kept over entries used longer ago
        return vectors
    vectors = _encode_exemplars(model, rows)
    _write_entry(cache_dir, path, slot, vectors)
    return vectors


def _encode_exemplars(model, rows):
    return model.question.encode([q.text for q in rows], description="encoding exemplars")  # (M, D)


def _registered_entry(shipped: Path | None, entry: str, model, rows):
    """The (M, D) vectors registered with a version under `entry`'s key, or None: none registered, or damaged (said)."""
    if shipped is None:
        return None
    # The registered entry's slot named the file where it was registered; a version's rows are its own copy, so
    # the entry's key alone says they are the same questions encoded by the same weights and code
    registered = sorted(shipped.glob(f"*-{entry}.safetensors")) if shipped.is_dir() else []
    vectors = _whole_entry(registered[0], model, rows) if registered else None
    if vectors is None:  # another torch or transformers where it is served, say: said, since it costs the load time
        logging.getLogger(__name__).info("%s: no registered vectors for these weights, rows and encoding code; the "
                                         "exemplars are encoded", shipped)
    return vectors


def _whole_entry(path: Path, model, rows):
    """The entry's (M, D) vectors, or None where it is damaged or does not fit `rows` and `model` (encoded again, and
    replaced in a cache)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        vectors = load_file(path)["vectors"]
    except (SafetensorError, KeyError, OSError):
        return None
    whole = (vectors.ndim == 2 and vectors.shape == (len(rows), model.question.hidden_size)
             and vectors.dtype == torch.float32 and bool(torch.isfinite(vectors).all()))
    return vectors if whole else None


def _write_entry(cache_dir: Path, path: Path, slot: str, vectors) -> None:
    """`vectors` (M, D) written to the cache as its entry `path`, atomically, in place of the one `slot` held before;
    then only the `EXEMPLAR_CACHE_ENTRIES` used last are kept."""
    from safetensors.torch import save_file

    from tqc.io import atomic_path

    try:
        with atomic_path(path) as tmp:
            save_file({"vectors": vectors.contiguous()}, str(tmp))
        for older in _cache_entries(Path(cache_dir)):
            if older.name.startswith(f"{slot}-") and older != path:
                older.unlink(missing_ok=True)
        _keep_the_last_used(Path(cache_dir), EXEMPLAR_CACHE_ENTRIES)
    except OSError as exc:  # a cache that cannot be written (read-only home, full disk) costs time, never the answers
        logging.getLogger(__name__).warning("exemplar cache %s not written (%s): the questions are encoded again next time; "
                                            "--exemplar-cache none skips the cache", cache_dir, exc)


def _cache_key(model_digest: dict, rows, exemplars_file: Path) -> tuple[str, str]:
    """(slot, entry) of `rows` encoded by the weights of `model_digest`: an entry is `{slot}-{entry}.safetensors`. The
    slot names the model and file, so that a new entry replaces the one it made of the file before; the entry names
    the weights, the questions themselves and the code that encodes them."""
    entry = _sha256({"model": model_digest, "questions": [q.text for q in rows], "code": encoding_code()})
    return _sha256({"model": model_digest, "file": str(Path(exemplars_file).resolve())})[:16], entry


EXEMPLAR_CACHE_ENTRIES = 16  # models × exemplar files whose vectors `tqc predict` keeps, the ones used last


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:  # a read-only cache still serves; it only forgets what was used last
        pass


def _keep_the_last_used(cache_dir: Path, kept: int) -> None:
    """Deletes all but the `kept` entries used (written or read) last. Another process may delete one first."""
    def last_used(entry: Path) -> float:
        try:
            return entry.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    for stale in sorted(_cache_entries(cache_dir), key=last_used, reverse=True)[kept:]:
        stale.unlink(missing_ok=True)


CACHE_ENTRY = re.compile(r"[0-9a-f]{16}-[0-9a-f]{64}\.safetensors")  # slot-entry, as `_encoded_exemplars` names them


def _cache_entries(cache_dir: Path) -> list[Path]:
    """The cache's own entries: a folder given as --exemplar-cache may hold other .safetensors files, never touched."""
    return [path for path in cache_dir.glob("*.safetensors") if CACHE_ENTRY.fullmatch(path.name)]


def encoding_code() -> dict[str, str]:
    """What turns a question into a vector besides the weights: tqc's encoder and the libraries under it. Vectors
    cached by another version of them (a pooling fix, say) are encoded again, not served."""
    import hashlib

    import torch
    import transformers

    from tqc.model import encoder

    return {"encoder": hashlib.sha256(Path(encoder.__file__).read_bytes()).hexdigest(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def _sha256(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


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
    matcher.load_context(SimpleNamespace(artifacts=_artifacts(model_dir, catalog_path, prior_path, exemplars),
                                         model_config=_model_config(model_dir, prior_path, top_k, exemplars)))
    return matcher


def served_first_answers(uri: str, questions: list[str]) -> tuple[list[str], list[str]]:
    """(N,) the class id of each question's first answer, from a registered version's pyfunc as it is served; and the
    classes it can answer with (`answerable_class_ids`)."""
    served = mlflow.pyfunc.load_model(uri)
    matcher = served.unwrap_python_model()
    matcher.says_cut = False  # validation questions, which evaluate scores cut as silently
    answers = served.predict(pd.DataFrame({"question": questions}), params={"top_k": 1})
    return answers[answers["rank"] == 1]["class_id"].tolist(), matcher.answerable_class_ids()  # in question order


# What the registry answers when the model or its alias is not there; any other error is the registry failing.
NOT_FOUND_CODES = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def alias_version(client, model_name: str, alias: str):
    """The registry's `model_name@alias` version, or None where the model or the alias does not exist.

    A registry that fails (unreachable, overloaded) raises: read as "no champion", it would let a
    challenger take the alias unjudged."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(model_name, alias)
    except MlflowException as exc:
        if exc.error_code in NOT_FOUND_CODES:
            return None
        raise


def registered_artifacts(model_name: str, version: str, destination: Path) -> tuple[dict[str, Path], dict]:
    """A registered version downloaded to `destination`: ({artifact name: its local path}, its model_config)."""
    import mlflow.artifacts
    from mlflow.models import Model

    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{model_name}/{version}", dst_path=str(destination)))
    flavor = Model.load(local).flavors["python_function"]
    return {name: local / artifact["path"] for name, artifact in flavor["artifacts"].items()}, flavor.get("config") or {}


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
    return asked


def signature(top_k: int) -> ModelSignature:
    """The registry's contract: a "question" column in; ranked answers out; `top_k` defaulting to the version's own
    (MLflow fills a param a request leaves out with the signature's default, before `predict` sees it)."""
    return ModelSignature(
        inputs=Schema([ColSpec("string", "question")]),
        outputs=Schema([ColSpec("string", "question"), ColSpec("long", "rank"), ColSpec("string", "class_id"),
                        ColSpec("string", "standard_question"), ColSpec("double", "score")]),
        params=ParamSchema([ParamSpec("top_k", "long", int(top_k))]),
    )


def _model_config(model_dir: Path, prior_path: Path | None, top_k: int, exemplars: tuple[Path, int] | None = None) -> dict:
    """top_k, and the prior file's entry fitted for `model_dir` (an error naming the file if it has none),
    or the exemplar rule's k (it has no shift: one was fitted for the standard-question scores only)."""
    from tqc import prior

    if exemplars is not None:
        if prior_path is not None:
            raise ValueError(f"{prior_path}: a class-prior shift was fitted for the standard-question rule, and the "
                             "exemplar rule has none: serve one of them")
        return {"top_k": top_k, "rule": "exemplars", "exemplar_k": int(exemplars[1])}
    if prior_path is None:
        return {"top_k": top_k}
    entry = prior.entry_for(prior_path, model_dir)
    if entry is None:  # an input error, said in one line: a ValueError was a traceback from `tqc promote --model typo`
        raise prior.PriorFileError(f"{prior_path}: none of its entries was fitted for {model_dir} (run the prior stage "
                                   "for it)")
    return {"top_k": top_k, "prior_model": entry}


def _artifacts(model_dir: Path, catalog_path: Path, prior_path: Path | None,
               exemplars: tuple[Path, int] | None = None) -> dict[str, str]:
    artifacts = {"model": str(model_dir), "catalog": str(catalog_path)}
    if prior_path is not None:
        artifacts["prior"] = str(prior_path)
    if exemplars is not None:
        artifacts["exemplars"] = str(exemplars[0])
    return artifacts


def folder_digest(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under a model folder, linked sub-folders included."""
    from tqc.io import tree_digests

    return tree_digests(folder)


def served_files_digest(model_dir: Path) -> dict[str, str]:
    """`folder_digest`, with only what loading reads of tqc_model.json (`SERVED_MODEL_KEYS`): the rest records how
    the model was trained, so the weights stage two kept from stage one under other params are the same content."""
    from tqc.model.encoder import MODEL_CONFIG, SERVED_MODEL_KEYS

    files = folder_digest(model_dir)
    if MODEL_CONFIG in files:
        config = json.loads((Path(model_dir) / MODEL_CONFIG).read_text())
        files[MODEL_CONFIG] = json.dumps({key: config[key] for key in SERVED_MODEL_KEYS if key in config}, sort_keys=True)
    return files


def content_digest(model_dir: Path, catalog_path: Path, config: dict, prior_entry: dict | None,
                   exemplars_path: Path | None = None, legacy: str | None = None) -> str:
    """sha256 of all that a registered version serves: the model folder's files (`served_files_digest`), the
    catalog, its model_config (top_k, the prior entry's name or the rule's k), the shift the prior entry serves
    (`SERVED_PRIOR_KEYS`), the exemplar rule's labeled questions and the tqc version (whose pyfunc code answers). A
    standard-question version has no exemplars key, so its digest is the one it had before the exemplar rule could be
    served. `legacy`: the digests of versions registered before (`LEGACY_DIGESTS`), found by them and re-tagged."""
    import tqc
    from tqc.io import file_digest

    parts = {
        "model": folder_digest(model_dir) if legacy == "whole_model_config" else served_files_digest(model_dir),
        "catalog": file_digest(Path(catalog_path), "sha256"),
        "prior": _prior_part(prior_entry, whole=legacy is not None),
        "config": config,
        "tqc": tqc.__version__,
        **({"exemplars": file_digest(Path(exemplars_path), "sha256")} if exemplars_path is not None else {}),
    }
    return _sha256(parts)


# Older digests, newest first: the prior entry hashed whole (its grid figures too, so a re-fit that chose the same
# shift registered the same answers again); before that, tqc_model.json hashed whole as well.
LEGACY_DIGESTS = ("whole_prior", "whole_model_config")


def _prior_part(entry: dict | None, whole: bool) -> dict | None:
    if entry is None:
        return None
    if whole:  # the weights are hashed with the model; without the entry's record of them, as versions before it had
        return {k: v for k, v in entry.items() if k != "weights_digest"}
    return {k: entry[k] for k in SERVED_PRIOR_KEYS if k in entry}


def answers_digest(model_dir: Path, catalog_path: Path, config: dict, prior_entry: dict | None,
                   exemplars_path: Path | None = None) -> str:
    """`content_digest` without `top_k`: two versions with one answers digest give every question the same ranking."""
    return content_digest(model_dir, catalog_path, {k: v for k, v in config.items() if k != "top_k"}, prior_entry,
                          exemplars_path)


def register(model_dir: Path, catalog_path: Path, prior_path: Path | None, model_name: str, top_k: int,
             exemplars: tuple[Path, int] | None = None, trained_on: set[str] | None = None,
             encoded_in: Path | None = None) -> tuple[str, bool, str]:
    """The registry version serving exactly this content → (version, whether it was there already, its answers digest).

    A `dvc repro` that re-runs promote without changing the model (a code or report change
    upstream) finds its version by the content digest tag, so the registry gains no copies.
    `exemplars`: (labeled questions JSONL, k) to serve the exemplar rule; `prior_path` is then None.
    `trained_on`: the `question_hash`es of what the model learnt from, kept with a new version (`TRAINED_ON`); a
    version found registered keeps the record it was registered with.
    `encoded_in`: an exemplar cache folder where these weights may have encoded the exemplar rows already (promote's
    choice of rule under auto): a new version's vectors are taken from there rather than encoded again.
    """
    client = mlflow.MlflowClient()
    config, entry, exemplar_rows = _served_content(model_dir, prior_path, top_k, exemplars)
    digest = content_digest(model_dir, catalog_path, config, entry, exemplar_rows)
    answers = answers_digest(model_dir, catalog_path, config, entry, exemplar_rows)
    existing = _servable(model_name, _tagged_with(client, model_name, digest))
    for legacy in LEGACY_DIGESTS:  # a registry filled before knows it by an older digest: its tags move to this one
        if existing:
            break
        existing = _servable(model_name, _tagged_with(client, model_name, content_digest(
            model_dir, catalog_path, config, entry, exemplar_rows, legacy=legacy)))
        for version in existing:
            client.set_model_version_tag(model_name, version.version, DIGEST_TAG, digest)
    if existing:
        for version in existing:
            if version.tags.get(ANSWERS_TAG) != answers:
                client.set_model_version_tag(model_name, version.version, ANSWERS_TAG, answers)
        return str(min(int(v.version) for v in existing)), True, answers
    tags = {DIGEST_TAG: digest, ANSWERS_TAG: answers, "rule": config.get("rule", "standard"), **_prior_tags(entry)}
    return (log_and_register(model_dir, catalog_path, prior_path, model_name, config, exemplars, tags, trained_on,
                             encoded_in), False, answers)


def question_hash(text: str) -> str:
    """A question's key in a `TRAINED_ON` record: the first 64 bits of the sha256 of its normalised text, the form
    ingest's split and validate's leakage check compare, so a question written another way is the same question."""
    return hashlib.sha256(normalise(text).encode("utf-8")).hexdigest()[:16]


def trained_on_record(model_name: str, version: str, destination: Path) -> set[str] | None:
    """The `question_hash`es a registered version learnt from; None for one registered before versions kept them and
    never given one (`record_trained_on`)."""
    import mlflow.artifacts

    uri = _trained_on_uri(model_name, version)
    if uri is None:
        return None
    local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(destination))
    return set(json.loads(Path(local).read_text(encoding="utf-8"))["questions"])


def _trained_on_uri(model_name: str, version: str, registered=None) -> str | None:
    """Where a version's record of what it learnt from is: its own artifact, or the one `record_trained_on` gave it
    (`registered`: the version's `ModelVersion`, where the caller has it); None where it has neither."""
    from mlflow.models import get_model_info

    artifacts = get_model_info(f"models:/{model_name}/{version}").flavors["python_function"].get("artifacts") or {}
    if TRAINED_ON in artifacts:
        return f"models:/{model_name}/{version}/{artifacts[TRAINED_ON]['path']}"
    registered = registered or mlflow.MlflowClient().get_model_version(model_name, version)
    return registered.tags.get(TRAINED_ON_TAG)


def record_trained_on(model_name: str, version: str, questions: list[str]) -> tuple[str, str, int, str | None]:
    """Give a version registered before versions kept a record of what they learnt from (`TRAINED_ON`) that record:
    the `question_hash`es of `questions`, its training questions as its owner knows them (the training file of the
    commit it was trained at). Logged into the version's own run and named by `TRAINED_ON_TAG`; a version that has a
    record is refused, so none is ever replaced. → (the version as the registry spells it, "2" for "02"; the record's
    artifact URI; how many distinct questions it holds; the commit its pipeline run recorded, if any: nothing here can
    tell whether `questions` are that commit's)."""
    import tempfile

    from tqc.config import ConfigError

    client = mlflow.MlflowClient()
    registered = client.get_model_version(model_name, version)  # MLflow's own error names a version that is not there
    version = str(registered.version)
    if _trained_on_uri(model_name, version, registered) is not None:  # asked, not downloaded
        raise ConfigError(f"{model_name} v{version} has a record of the questions it learnt from already; "
                          "a record is never replaced")
    if not registered.run_id:
        raise ConfigError(f"{model_name} v{version} was not registered from a run, so there is no run to keep "
                          "its record in")
    with tempfile.TemporaryDirectory(prefix="tqc-trained-on-") as scratch:
        hashes = {question_hash(text) for text in questions}
        record = _write_record(Path(scratch), hashes)
        folder = f"{TRAINED_ON}-v{version}"
        client.log_artifact(registered.run_id, str(record), artifact_path=folder)
    uri = f"runs:/{registered.run_id}/{folder}/{record.name}"
    client.set_model_version_tag(model_name, version, TRAINED_ON_TAG, uri)
    return version, uri, len(hashes), _pipeline_commit(client, registered.run_id)


def _pipeline_commit(client, run_id: str) -> str | None:
    """The commit (`tracking.COMMIT_TAG`) of the run that registered a version, or of the pipeline run it is nested in."""
    from tqc.tracking import COMMIT_TAG

    run = client.get_run(run_id)
    parent = run.data.tags.get("mlflow.parentRunId")
    return run.data.tags.get(COMMIT_TAG) or (client.get_run(parent).data.tags.get(COMMIT_TAG) if parent else None)


def _write_record(folder: Path, hashes: set[str]) -> Path:
    from tqc.io import write_json

    record = folder / f"{TRAINED_ON}.json"
    write_json(record, {"hash": "sha256 of tqc.text.normalise(question), first 16 hex digits", "questions": sorted(hashes)})
    return record


def _served_content(model_dir: Path, prior_path: Path | None, top_k: int,
                    exemplars: tuple[Path, int] | None) -> tuple[dict, dict | None, Path | None]:
    """(model_config, the prior entry it serves, the exemplar rule's rows file): what the digests hash besides the
    folder and catalog; the prior file is read once, for all of them."""
    from tqc import prior

    config = _model_config(model_dir, prior_path, top_k, exemplars)
    entry = prior.read_file(prior_path)[config["prior_model"]] if prior_path is not None else None
    return config, entry, exemplars[0] if exemplars else None


def answers_of(client, model_name: str, holder, model_dir: Path, catalog_path: Path, prior_path: Path | None,
               exemplars: tuple[Path, int] | None = None) -> str | None:
    """`holder`'s answers digest (a registered version). One registered before versions carried it gets it here when
    its content digest is this content's served with its own top_k, the one thing an answers digest leaves out;
    else None: its answers are not known to be these."""
    if ANSWERS_TAG in holder.tags:
        return holder.tags[ANSWERS_TAG]
    from mlflow.models import get_model_info

    served = get_model_info(f"models:/{model_name}/{holder.version}").flavors.get("python_function", {})
    top_k = (served.get("config") or {}).get("top_k")  # the pyfunc flavor keeps model_config as `config`
    if top_k is None:
        return None
    config, entry, rows = _served_content(model_dir, prior_path, int(top_k), exemplars)
    digests = {content_digest(model_dir, catalog_path, config, entry, rows, legacy=form) for form in (None, *LEGACY_DIGESTS)}
    if holder.tags.get(DIGEST_TAG) not in digests:
        return None
    answers = answers_digest(model_dir, catalog_path, config, entry, rows)
    client.set_model_version_tag(model_name, str(holder.version), ANSWERS_TAG, answers)
    return answers


def _tagged_with(client, model_name: str, digest: str) -> list:
    return client.search_model_versions(f"name='{model_name}' and tags.{DIGEST_TAG}='{digest}'")


def _servable(model_name: str, versions: list) -> list:
    """`versions` whose model folder the artifact store still holds. One whose files are gone (a store cleaned up or
    moved) is that content no more, whatever its digest tag says: found again, it would stand in for the new model and
    fail every load, so the content is registered anew beside it."""
    kept = [version for version in versions if _model_config_present(model_name, str(version.version))]
    for version in versions:
        if version not in kept:
            logging.getLogger(__name__).warning("%s v%s has this content's digest, but its model folder is gone from the "
                                                "artifact store: the content is registered again as a new version",
                                                model_name, version.version)
    return kept


def _model_config_present(model_name: str, version: str) -> bool:
    """Whether registered `version`'s model folder still has its config (`tqc_model.json`), fetched alone: a cheap
    sign that its files are there, where loading the version would read its weights."""
    import tempfile

    import mlflow.artifacts
    from mlflow.exceptions import MlflowException
    from mlflow.models import get_model_info

    from tqc.model.encoder import MODEL_CONFIG

    try:
        model = get_model_info(f"models:/{model_name}/{version}").flavors["python_function"]["artifacts"]["model"]["path"]
        with tempfile.TemporaryDirectory(prefix="tqc-registered-config-") as scratch:
            mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{model_name}/{version}/{model}/{MODEL_CONFIG}",
                                                dst_path=scratch)
    except (MlflowException, OSError, KeyError, TypeError):
        return False
    return True


def _prior_tags(entry: dict | None) -> dict[str, str]:
    """The class-prior shift a version serves, for a registry listing: its target mix and λ ("none": similarity alone)."""
    if entry is None:
        return {"prior_target": "none", "prior_weight": "0"}
    return {"prior_target": entry.get("target", "labeled"), "prior_weight": str(entry["weight"])}


def log_and_register(model_dir: Path, catalog_path: Path, prior_path: Path | None, model_name: str, config: dict,
                     exemplars: tuple[Path, int] | None = None, tags: dict[str, str] | None = None,
                     trained_on: set[str] | None = None, encoded_in: Path | None = None) -> str:
    """Log the model in the active run and register it, serving with `config` (`_model_config`); returns the new version.

    `tags` are the version's from its creation on: a version without its content digest, which a retry would then
    not find and register again, never exists. `trained_on`: `question_hash`es, kept as the `TRAINED_ON` artifact.
    `encoded_in`: an exemplar cache folder that may hold the exemplar rows' vectors (`register`)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tqc-trained-on-") as scratch:
        artifacts = _artifacts(model_dir, catalog_path, prior_path, exemplars)
        if trained_on is not None:
            artifacts[TRAINED_ON] = str(_write_record(Path(scratch), trained_on))
        if exemplars is not None:
            artifacts[EXEMPLAR_VECTORS] = str(_registered_vectors(model_dir, exemplars[0], Path(scratch) / EXEMPLAR_VECTORS,
                                                                  encoded_in))
        with warnings.catch_warnings():
            # The signature is given (`_log_served_model`); an input example would also run the model once as it is logged
            warnings.filterwarnings("ignore", message=".*An input example was not provided", category=UserWarning)
            info = _log_served_model(artifacts, config)
    return str(mlflow.register_model(info.model_uri, model_name, tags=tags).version)


EXEMPLAR_VECTORS = "exemplar_vectors"  # a version's artifact: its exemplar rows encoded by its weights, as a cache entry


def _registered_vectors(model_dir: Path, exemplars_file: Path, folder: Path, encoded_in: Path | None = None) -> Path:
    """`folder` holding `exemplars_file`'s rows encoded by the model in `model_dir`, keyed as the exemplar cache keys
    them: a server loading the version reads them rather than encode every row at each start (a minute for TREC-6's
    4,816 on a 2-core CPU), and encodes them after all where its weights, rows or encoding code differ. Only this
    key's entry of `encoded_in` is taken, and read as any cache entry is (its shape checked), so nothing else in that
    folder is registered."""
    import shutil

    from tqc.exemplars import load_exemplars
    from tqc.model.encoder import BiEncoder

    digest, rows = folder_digest(model_dir), load_exemplars(exemplars_file)
    slot, entry = _cache_key(digest, rows, exemplars_file)
    encoded = Path(encoded_in) / f"{slot}-{entry}.safetensors" if encoded_in is not None else None
    if encoded is not None and encoded.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(encoded, folder / encoded.name)
    _encoded_exemplars(BiEncoder.load(model_dir).eval(), rows, digest, exemplars_file, folder, key=(slot, entry))
    return folder


def _log_served_model(artifacts: dict[str, str], config: dict):
    """The served pyfunc (`served_model.py` with `artifacts` and `config`) logged in the active run; its model info."""
    import tqc

    return mlflow.pyfunc.log_model(
        name="model",
        # Models-from-code: the version stores served_model.py, which builds the matcher when loaded; an instance
        # passed here would be stored as a cloudpickle, which loading would unpickle.
        python_model=str(Path(__file__).with_name("served_model.py")),
        artifacts=artifacts,
        model_config=config,
        signature=signature(config["top_k"]),
        # Listed, not inferred: inference would load the model in a subprocess to trace imports.
        pip_requirements=[f"tqc=={tqc.__version__}", "torch", "transformers", "safetensors", "pandas"],
    )
