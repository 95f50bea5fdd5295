"""Each DVC stage declares every param its command reads: one it reads undeclared leaves its output stale when only
that param changes, as `dvc repro` then runs nothing. Each stage's command from dvc.yaml runs here in this process, in
the order `dvc repro` runs them, with every field read of the loaded params recorded by its dotted key."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from tqc import cli
from tqc.config import Strict, deep_merge

pytestmark = pytest.mark.e2e

# read undeclared on purpose: MLflow's logging alone (no output follows from it), and a collective's wait bound
NO_OUTPUT_FOLLOWS = ("tracking.enabled", "tracking.uri", "tracking.experiment", "distributed.timeout_minutes")
# stage → keys read only to refuse early, with an output that follows from a declared dep instead: mine checks that
# FAISS can rank by model.similarity, and ranks by the similarity models/stage_one was trained and saved with
CHECKED_ONLY = {"mine": ("model.similarity",)}
# stage → keys read with an output that follows from a declared dep: evaluate's extra seeds warm up again from the
# pool file the warmup stage reads, whose change changes models/warmup, so models/stage_one, which evaluate depends on
FOLLOWS_FROM_A_DEP = {"evaluate": ("data.data_dir", "data.custom.encoding")}
# the options that reach further code, each off by default: the warm-up, more seeds on their own splits, EDA rows,
# SharpReCL's prototype mixup, CEAA's cross-encoding, question and standard contrast, in-batch negatives in stage two,
# the MLP scorer
OPTIONS_ON = {"warmup": {"enabled": True, "unlabelled": "unlabelled.csv", "candidates": 4, "batch_size": 8, "max_steps": 1},
              "evaluate": {"seeds": 2, "resplit": True},
              "augment": {"explicit": "eda", "prototype_mixup": {"enabled": True, "per_class": 2},
                          "cross_encoding": {"enabled": True}},
              "stage_one": {"question_contrast": 1.0, "standard_contrast": 1.0, "max_steps": 2},
              "stage_two": {"negatives": "mined_and_in_batch", "max_steps": 2},
              "model": {"similarity": "mlp"}}


class ReadRecorder:
    """Records `params.<section>.<field>` for each field read on a registered Params tree."""

    def __init__(self) -> None:
        self.keys_of: dict[int, str] = {}  # id(model) → its dotted prefix
        self.registered: list[Strict] = []  # kept alive: a freed model's id is given to the next object made
        self.read: set[str] = set()

    def register(self, model: Strict, prefix: str = "") -> None:
        self.keys_of[id(model)] = prefix
        self.registered.append(model)
        for name, field in type(model).model_fields.items():
            value = model.__dict__.get(name)
            if isinstance(value, Strict):
                self.register(value, f"{prefix}{field.alias or name}.")

    def getattribute(self, model: Strict, name: str):
        value = object.__getattribute__(model, name)
        fields = type(model).model_fields
        # leaves only: a section read to be handed on is counted by the fields then read of it (a dump of a whole
        # section, as MLflow's logging makes, reads no field and is not seen)
        if name in fields and id(model) in self.keys_of and not isinstance(value, Strict):
            self.read.add(f"{self.keys_of[id(model)]}{fields[name].alias or name}")
        return value


def covered(key: str, declared: list[str]) -> bool:
    return any(key == d or key.startswith(f"{d}.") for d in declared)


@pytest.mark.parametrize("options", [{}, OPTIONS_ON], ids=["defaults", "options-on"])
def test_every_param_a_stage_reads_is_declared_in_dvc_yaml(project, monkeypatch, options):
    params = deep_merge(yaml.safe_load((project / "params.yaml").read_text()), options)
    params["tracking"]["enabled"] = False  # MLflow off: what the stages read to log is allowed undeclared anyway
    Path(params["data"]["data_dir"], "unlabelled.csv").write_text("text\nwhere is the old castle\nwho invented tea\n")
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    stages = yaml.safe_load((Path(project) / "dvc.yaml").read_text())["stages"]
    monkeypatch.chdir(project)

    recorder = ReadRecorder()
    load_params = cli.load_params

    def recorded_load(*args, **kwargs):
        loaded = load_params(*args, **kwargs)
        recorder.register(loaded)
        return loaded

    monkeypatch.setattr(cli, "load_params", recorded_load)
    monkeypatch.setattr(Strict, "__getattribute__", lambda model, name: recorder.getattribute(model, name))
    undeclared, everything = {}, set()
    for name, stage in stages.items():
        recorder.read.clear()
        command = shlex.split(stage["cmd"])
        assert command[0] == "tqc"
        assert cli.main(command[1:]) == 0, name
        everything |= recorder.read
        # a dep path templated from a param (${data.data_dir}) declares it: a new value is a new dep
        declared = [str(key) for key in stage.get("params", [])] + re.findall(r"\$\{([^}]+)\}", str(stage["deps"]))
        allowed = (*NO_OUTPUT_FOLLOWS, *CHECKED_ONLY.get(name, ()), *FOLLOWS_FROM_A_DEP.get(name, ()))
        missing = sorted(key for key in recorder.read if not covered(key, declared) and key not in allowed)
        if missing:
            undeclared[name] = missing
    assert not undeclared, f"params read but not declared in dvc.yaml: {undeclared}"
    seeds = json.loads((project / "reports" / "metrics.json").read_text()).get("seeds", {})
    assert seeds.get("n", 1) == (2 if options else 1)  # the options reached the code they are for
    assert (project / "models" / "warmup" / "warmup_skipped.json").exists() == (not options)
    reached = {"augment.cross_encoding.share", "augment.prototype_mixup.per_class", "augment.eda_alpha", "warmup.margin"}
    assert (reached <= everything) == bool(options), reached - everything
