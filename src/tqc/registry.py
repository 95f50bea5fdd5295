"""The MLflow model registry's side of serving: a version is logged (models-from-code, `served_model.py`, with the
model's safetensors folder, the catalog, and the prior file's entry or the exemplar rule's rows and vectors) and
registered once per content (`content_digest`, a version tag), and keeps the questions it learnt from (`TRAINED_ON`),
which promote needs to judge a champion fairly. What a version answers is `tqc.serving`'s matcher.

MLflow is imported where it is used, each time with its usage records off first (`_mlflow`), so importing this module
imports no MLflow.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from tqc.exemplar_cache import cache_key, encoded_exemplars, json_sha256
from tqc.text import normalise
from tqc.tracking import mlflow_without_telemetry

if TYPE_CHECKING:
    from mlflow.models import ModelSignature

log = logging.getLogger(__name__)

# The model version tag holding `content_digest`: a version serving the same content is not registered again.
DIGEST_TAG = "content_digest"
# The tag holding `content_digest` without how answers are served (top_k): a version whose answers are the champion's
# differs from it only in serving, and takes its place without a validation gate it could never pass.
ANSWERS_TAG = "answers_digest"
# What of a prior entry decides the answers: the fitted λ's grid figures, τ and the folder name only record the fit.
SERVED_PRIOR_KEYS = ("shift", "weight", "target")
# The artifact listing the questions a version learnt from, as `question_hash`es. Promote judges a champion only on
# validation questions neither model learnt from: a later split (grown data, a changed seed or rule) can put questions
# an older champion trained on into validation, where it answers them from memory.
TRAINED_ON = "trained_on"
# A version registered before versions kept that artifact gets its record afterwards (`record_trained_on`): logged into
# the version's own run, and named by this model version tag (its artifact URI), since a version's files are fixed.
TRAINED_ON_TAG = "trained_on_record"
EXEMPLAR_VECTORS = "exemplar_vectors"  # a version's artifact: its exemplar rows encoded by its weights, as a cache entry
# What the registry answers when the model or its alias is not there; any other error is the registry failing.
NOT_FOUND_CODES = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def _mlflow():
    """The `mlflow` module, imported with MLflow's usage records off (`mlflow_without_telemetry`), as the entry points
    import it; a script or notebook calling this module's functions would otherwise send them."""
    mlflow_without_telemetry()
    import mlflow
    import mlflow.pyfunc

    return mlflow


def alias_version(client, model_name: str, alias: str):
    """The registry's `model_name@alias` version, or None where the model or the alias does not exist.

    A registry that fails (unreachable, overloaded) raises: read as "no champion", it would let a
    challenger take the alias unjudged."""
    _mlflow()
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(model_name, alias)
    except MlflowException as exc:
        if exc.error_code in NOT_FOUND_CODES:
            return None
        raise


def registered_artifacts(model_name: str, version: str, destination: Path) -> tuple[dict[str, Path], dict]:
    """A registered version downloaded to `destination`: ({artifact name: its local path}, its model_config)."""
    return version_artifacts(f"models:/{model_name}/{version}", destination)


@contextlib.contextmanager
def _quiet_download():
    """No MLflow download bar on stderr, where a command's own lines (a one-line error) are read, as
    `mlflow.pyfunc.load_model` loads a version without one; a user's own MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR stands."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    if key in os.environ:
        yield
        return
    os.environ[key] = "false"
    try:
        yield
    finally:
        os.environ.pop(key, None)


def version_artifacts(uri: str, destination: Path) -> tuple[dict[str, Path], dict]:
    """The version `uri` names (models:/NAME/VERSION or models:/NAME@ALIAS) downloaded to `destination`: ({artifact
    name: its local path}, its model_config). Its files are only read: no code stored with it is run. An artifact
    whose path leads out of the download (`..`, an absolute path) is an error, so a version cannot have a local file
    read as its catalog."""
    _mlflow()
    import mlflow.artifacts
    from mlflow.models import Model

    links = _links_in_local_source(uri)
    if links:  # MLflow's download of a local store copies what a link leads to, so the check below would not see it
        raise ValueError(f"{uri}: its file(s) {', '.join(links[:5])} are links in the artifact store, which could lead "
                         "to any file this user can read: not loaded")
    with _quiet_download():
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(destination)))
    flavor = Model.load(local).flavors.get("python_function") or {}
    artifacts = {name: local / artifact["path"] for name, artifact in (flavor.get("artifacts") or {}).items()}
    outside = sorted(name for name, path in artifacts.items() if not path.resolve().is_relative_to(local.resolve()))
    if outside:
        raise ValueError(f"{uri}: its artifact(s) {', '.join(outside)} lie outside the version's own files")
    return artifacts, flavor.get("config") or {}


def _links_in_local_source(uri: str) -> list[str]:
    """The links (relative paths) among a version's files where its artifact store is a local folder (a file: store,
    or a folder given as the URI); none where it is a server, which reads its own files."""
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    if uri.startswith("models:/"):
        from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository

        uri = ModelsArtifactRepository.get_underlying_uri(uri)
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return []
    source = Path(url2pathname(parsed.path) if parsed.scheme else uri)
    links = []
    for folder, folders, files in os.walk(source):  # links to folders are listed, never walked into
        links += [str((Path(folder) / name).relative_to(source)) for name in [*folders, *files]
                  if (Path(folder) / name).is_symlink()]
    return sorted(links)


def signature(top_k: int) -> ModelSignature:
    """The registry's contract: a "question" column in; ranked answers out; `top_k` defaulting to the version's own
    (MLflow fills a param a request leaves out with the signature's default, before `predict` sees it)."""
    _mlflow()
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("string", "question")]),
        outputs=Schema([ColSpec("string", "question"), ColSpec("long", "rank"), ColSpec("string", "class_id"),
                        ColSpec("string", "standard_question"), ColSpec("double", "score")]),
        params=ParamSchema([ParamSpec("top_k", "long", int(top_k))]),
    )


def served_config(model_dir: Path, prior_path: Path | None, top_k: int, exemplars: tuple[Path, int] | None = None) -> dict:
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


def served_artifacts(model_dir: Path, catalog_path: Path, prior_path: Path | None,
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
    return json_sha256(parts)


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
    client = _mlflow().MlflowClient()
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
    _mlflow()
    import mlflow.artifacts

    uri = _trained_on_uri(model_name, version)
    if uri is None:
        return None
    local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(destination))
    return set(json.loads(Path(local).read_text(encoding="utf-8"))["questions"])


def _trained_on_uri(model_name: str, version: str, registered=None) -> str | None:
    """Where a version's record of what it learnt from is: its own artifact, or the one `record_trained_on` gave it
    (`registered`: the version's `ModelVersion`, where the caller has it); None where it has neither."""
    _mlflow()
    from mlflow.models import get_model_info

    artifacts = get_model_info(f"models:/{model_name}/{version}").flavors["python_function"].get("artifacts") or {}
    if TRAINED_ON in artifacts:
        return f"models:/{model_name}/{version}/{artifacts[TRAINED_ON]['path']}"
    registered = registered or _mlflow().MlflowClient().get_model_version(model_name, version)
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

    client = _mlflow().MlflowClient()
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

    config = served_config(model_dir, prior_path, top_k, exemplars)
    entry = prior.read_file(prior_path)[config["prior_model"]] if prior_path is not None else None
    return config, entry, exemplars[0] if exemplars else None


def answers_of(client, model_name: str, holder, model_dir: Path, catalog_path: Path, prior_path: Path | None,
               exemplars: tuple[Path, int] | None = None) -> str | None:
    """`holder`'s answers digest (a registered version). One registered before versions carried it gets it here when
    its content digest is this content's served with its own top_k, the one thing an answers digest leaves out;
    else None: its answers are not known to be these."""
    if ANSWERS_TAG in holder.tags:
        return holder.tags[ANSWERS_TAG]
    _mlflow()
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
            log.warning("%s v%s has this content's digest, but its model folder is gone from the "
                                                "artifact store: the content is registered again as a new version",
                                                model_name, version.version)
    return kept


def _model_config_present(model_name: str, version: str) -> bool:
    """Whether registered `version`'s model folder still has its config (`tqc_model.json`), fetched alone: a cheap
    sign that its files are there, where loading the version would read its weights."""
    import tempfile

    _mlflow()
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
        artifacts = served_artifacts(model_dir, catalog_path, prior_path, exemplars)
        if trained_on is not None:
            artifacts[TRAINED_ON] = str(_write_record(Path(scratch), trained_on))
        if exemplars is not None:
            artifacts[EXEMPLAR_VECTORS] = str(_registered_vectors(model_dir, exemplars[0], Path(scratch) / EXEMPLAR_VECTORS,
                                                                  encoded_in))
        with warnings.catch_warnings():
            # The signature is given (`_log_served_model`); an input example would also run the model once as it is logged
            warnings.filterwarnings("ignore", message=".*An input example was not provided", category=UserWarning)
            info = _log_served_model(artifacts, config)
    return str(_mlflow().register_model(info.model_uri, model_name, tags=tags).version)


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
    slot, entry = cache_key(digest, rows, exemplars_file)
    encoded = Path(encoded_in) / f"{slot}-{entry}.safetensors" if encoded_in is not None else None
    if encoded is not None and encoded.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(encoded, folder / encoded.name)
    encoded_exemplars(BiEncoder.load(model_dir).eval(), rows, digest, exemplars_file, folder, key=(slot, entry))
    return folder


def _log_served_model(artifacts: dict[str, str], config: dict):
    """The served pyfunc (`served_model.py` with `artifacts` and `config`) logged in the active run; its model info."""
    import tqc

    return _mlflow().pyfunc.log_model(
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
