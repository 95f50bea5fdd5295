"""Seconds to load a version serving the exemplar rule, with the vectors registered beside it against encoding its
rows at load (what every load did before versions carried them), in one run, the two alternating.

    python scripts/registered_exemplar_load.py --rounds 2 > load.json

Registers models/stage_two with data/validated/train.jsonl in a throwaway SQLite registry under a temporary folder."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

from tqc.registry import log_and_register

from tqc.serving import local_matcher


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=Path("models/stage_two"))
    parser.add_argument("--data", type=Path, default=Path("data/validated"))
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    exemplars = (args.data / "train.jsonl", args.k)
    config = {"top_k": 3, "rule": "exemplars", "exemplar_k": args.k}
    questions = pd.DataFrame({"question": [json.loads(line)["text"] for line in
                                           (args.data / "test.jsonl").read_text(encoding="utf-8").splitlines()[:50]]})
    with tempfile.TemporaryDirectory() as scratch:
        mlflow.set_tracking_uri(f"sqlite:///{scratch}/mlflow.db")
        # artifacts in the scratch folder too: by default MLflow puts them in ./mlruns, a model copy a run
        mlflow.set_experiment(experiment_id=mlflow.create_experiment("load", artifact_location=(Path(scratch) / "artifacts").as_uri()))
        started = time.perf_counter()
        with mlflow.start_run():
            version = log_and_register(args.model, args.data / "catalog.jsonl", None, "load-bench", config, exemplars, {})
        registering = time.perf_counter() - started
        seconds = {"registered_vectors": [], "encoded_at_load": []}
        answers = {}
        for round_ in range(args.rounds):
            for how in (seconds if round_ % 2 == 0 else reversed(list(seconds))):
                started = time.perf_counter()
                if how == "registered_vectors":
                    matcher = mlflow.pyfunc.load_model(f"models:/load-bench/{version}")
                    seconds[how].append(time.perf_counter() - started)
                    answers[how] = matcher.predict(questions)
                else:
                    matcher = local_matcher(args.model, args.data / "catalog.jsonl", 3, None, exemplars)
                    seconds[how].append(time.perf_counter() - started)
                    answers[how] = matcher.predict(None, questions)
    pd.testing.assert_frame_equal(answers["registered_vectors"], answers["encoded_at_load"])  # the same answers
    medians = {how: float(np.median(values)) for how, values in seconds.items()}
    print(json.dumps({"model": str(args.model), "exemplar_rows": sum(1 for _ in exemplars[0].open(encoding="utf-8")),
                      "registering_seconds": registering, "load_seconds": seconds, "median": medians,
                      "registered_over_encoded": medians["registered_vectors"] / medians["encoded_at_load"]}, indent=2))


if __name__ == "__main__":
    main()
