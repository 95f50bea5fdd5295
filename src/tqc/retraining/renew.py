"""Train or refresh: the pipeline's stage functions on the staged data, or the champion's encoder serving the grown
data's labeled questions as its exemplars."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from tqc.config import Params, redact_text
from tqc.retraining.errors import RefreshError
from tqc.retraining.pending import Champion, Trained
from tqc.retraining.staging import Staged, with_additions

if TYPE_CHECKING:
    from tqc.pipeline import EpochHook

log = logging.getLogger("tqc.retrain")  # one logger for the retrain steps, whichever module says it


def train(params: Params, staged: Staged, staging: Path, on_epoch: EpochHook | None = None) -> Trained:
    """The pipeline's own stage functions on the staged data (ingest → … → stage two → prior); `on_epoch` sees each
    training stage's epochs (the flow's MLflow run logs them)."""
    from tqc.mining import check_faiss_for
    from tqc.pipeline import prepare_data, train_chain
    from tqc.stages import prior

    check_faiss_for(params.model.similarity)
    staged_params = with_additions(params, staged.raw)
    data = prepare_data(staged_params, staging / "data")
    outputs = train_chain(staged_params, data.directory, data.train, staging / "models", staged_params.seed, with_nc=False,
                          on_epoch=on_epoch)
    prior_path = staging / "models" / "prior.json"
    prior.run(data.directory, outputs.stage_one, outputs.stage_two, None, staged_params, prior_path)
    return Trained(data.directory, outputs.stage_two, prior_path, outputs.fits["stage_two"].best_validation_macro_f1)


def refresh(params: Params, staged: Staged, staging: Path) -> Trained:
    """The exemplar rule's light path (`retrain.mode: refresh`): no training. The champion's encoder, as
    registered, with the staged data's validated labeled questions as its exemplars; the gate then judges
    that version against the champion on the grown validation split like any challenger."""
    from tqc.pipeline import validated_data

    champion = champion_model(params.promote.model_name, params.promote.alias, staging / "champion")  # first: it may not exist
    if champion.rule != "exemplars" or champion.exemplar_k != params.evaluate.exemplar_k:
        from tqc.promotion import refresh_changes_rule

        must_win = refresh_changes_rule(params.promote.rule, champion.rule)  # promote's bound for it
        log.warning("retrain: refresh: %s v%s serves the %s rule%s; this refresh serves the exemplar rule with k = %d, "
                    "so the gate also judges that change%s", params.promote.model_name, champion.version, champion.rule,
                    f" with k = {champion.exemplar_k}" if champion.exemplar_k else "", params.evaluate.exemplar_k,
                    f" (promote.rule {params.promote.rule}: a change of rule must win, by promote.min_improvement)"
                    if must_win else "")
    data = validated_data(with_additions(params, staged.raw), staging / "data")
    log.info("retrain: refresh: the encoder of %s v%s with %s's labeled questions as exemplars, no training",
             params.promote.model_name, champion.version, data / "train.jsonl")
    return Trained(data, champion.model, None, None, refreshed_from=champion)


def champion_model(model_name: str, alias: str, destination: Path) -> Champion:
    """The registry's `alias` version, its model folder downloaded to `destination`."""
    import mlflow

    from tqc.registry import alias_version, registered_artifacts

    version = alias_version(mlflow.MlflowClient(), model_name, alias)
    if version is None:
        raise RefreshError(f"retrain.mode refresh: the registry ({redact_text(mlflow.get_tracking_uri())}) has no {model_name}@{alias} "
                           "to refresh; train one first (retrain.mode: train, or dvc repro)")
    if destination.exists():
        shutil.rmtree(destination)
    artifacts, config = registered_artifacts(model_name, str(version.version), destination)
    return Champion(str(version.version), artifacts["model"], version.tags.get("rule", "standard"),
                    int(config["exemplar_k"]) if "exemplar_k" in config else None)


def tag_refresh(model_name: str, version: str, champion_version: str) -> None:
    """Say in the registry that `version` is a refresh (no training) of `champion_version`'s encoder.

    Nothing when `version` is that champion (the refresh changed nothing it serves) or already says where it
    came from: so a retried judge, which finds its version registered, still tags it, and never re-tags an older one."""
    import mlflow

    client = mlflow.MlflowClient()
    if version == champion_version or "refreshed_from" in client.get_model_version(model_name, version).tags:
        return
    client.set_model_version_tag(model_name, version, "refreshed_from", champion_version)

