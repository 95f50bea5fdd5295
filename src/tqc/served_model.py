"""The code of every registered model version (MLflow's models-from-code): MLflow stores this file with the version
and runs it when the version is loaded, so a version holds code and safetensors, never a pickled Python object.

Not imported by tqc itself: running it is what tells MLflow which model the version serves.
"""

import mlflow.models

from tqc.serving import StandardQuestionMatcher

mlflow.models.set_model(StandardQuestionMatcher())
