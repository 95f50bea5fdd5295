"""The code of every registered model version (MLflow's models-from-code): MLflow stores this file with the version
and runs it when the version is loaded, so a version holds code and safetensors, never a pickled Python object.

Not imported by tqc itself: running it is what tells MLflow which model the version serves.
"""

# tqc.serving first: it turns MLflow's usage records off before MLflow is imported, which would otherwise send them
# and write ~/.config/mlflow when this file is imported outside MLflow's own loading
from tqc.serving import StandardQuestionMatcher

import mlflow.models  # noqa: E402  (after tqc.serving, on purpose)

mlflow.models.set_model(StandardQuestionMatcher())
