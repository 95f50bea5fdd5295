"""What dvc.yaml declares, read as DVC reads it."""

import shutil
import subprocess
from pathlib import Path

import yaml

DVC_YAML = Path(__file__).resolve().parents[2] / "dvc.yaml"


def declared_plots() -> dict[str, dict]:
    plots: dict[str, dict] = {}
    for stage in yaml.safe_load(DVC_YAML.read_text())["stages"].values():
        for entry in stage.get("plots", []):
            (path, options), = (entry.items() if isinstance(entry, dict) else [(entry, {})])
            plots[path] = options or {}
    return plots


def test_every_table_plot_names_its_x_and_y():
    """`dvc plots show` draws a table with no x or y as row index against the last column: for the
    similarity profile that was a line through every (question, class) row, which means nothing."""
    tables = {path: options for path, options in declared_plots().items() if path.endswith((".csv", ".json", ".tsv"))}
    assert tables, "dvc.yaml declares no table plots"
    assert {path for path, options in tables.items() if not {"x", "y"} <= options.keys()} == set()


SRC = DVC_YAML.parent / "src"
# Imported by every stage, yet no stage's outputs follow from their code: the version string, a docstring, and the
# params' schema (each stage declares the params it reads, so their values are deps; a new knob in config.py
# would otherwise re-run the whole pipeline).
# config.py: DVC tracks the params themselves; errors.py: the base class of the input errors, which no output depends on
NOT_DEPENDENCIES = {"src/tqc/__init__.py", "src/tqc/stages/__init__.py", "src/tqc/config.py", "src/tqc/errors.py"}


def module_file(module: str) -> Path | None:
    path = SRC.joinpath(*module.split("."))
    return next((p for p in (path / "__init__.py", path.with_suffix(".py")) if p.is_file()), None)


def imported_modules(module: str) -> set[str]:
    """The tqc modules one module imports, at its top or inside a function (stages import heavy ones lazily),
    relative imports resolved against its package. An import by a computed name would escape this reading, so
    none is allowed in the package."""
    import ast

    path = module_file(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
            source = ".".join(part for part in (base, node.module) if part)
            found |= {source} | {f"{source}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__"):
            raise AssertionError(f"{path}:{node.lineno}: an import by computed name, which no dvc.yaml dep check can follow")
    return {name for name in found if name.split(".")[0] == "tqc" and module_file(name) is not None}


def code_of(module: str) -> set[str]:
    """Every tqc source file `module` reaches through its imports."""
    reached, pending = set(), [module]
    while pending:
        name = pending.pop()
        if name not in reached:
            reached.add(name)
            pending += imported_modules(name)
    return {str(module_file(name).relative_to(DVC_YAML.parent)) for name in reached}


def test_the_import_reading_resolves_relative_imports(tmp_path, monkeypatch):
    package = tmp_path / "tqc" / "stages"
    package.mkdir(parents=True)
    for name in ("tqc/__init__.py", "tqc/text.py", "tqc/io.py", "tqc/stages/__init__.py"):
        (tmp_path / name).write_text("", encoding="utf-8")
    (package / "ingest.py").write_text("from ..text import normalise\nfrom . import validate\nfrom .. import io\n", encoding="utf-8")
    (package / "validate.py").write_text("", encoding="utf-8")
    monkeypatch.setitem(globals(), "SRC", tmp_path)  # module_file reads the package from here
    assert imported_modules("tqc.stages.ingest") == {"tqc", "tqc.text", "tqc.stages", "tqc.stages.validate", "tqc.io"}


def test_every_stage_declares_the_code_it_runs():
    """A stage whose code changes must run again: a source file its module reaches (through any import) and no dep
    covers would leave `dvc repro` serving outputs of the old code. Ingest once drew validation through validate.py's
    `normalise` undeclared, and mine encoded with the model package undeclared."""
    stages = yaml.safe_load(DVC_YAML.read_text())["stages"]
    undeclared = {}
    for name, stage in stages.items():
        command = stage["cmd"].split()
        assert command[0] == "tqc", f"{name}: not a tqc command"
        deps = [str(dep).rstrip("/") for dep in stage.get("deps", [])]
        module = "tqc.stages." + command[1].replace("-", "_")
        assert module_file(module) is not None, f"{name}: `{stage['cmd']}` runs no module {module}"
        code = code_of(module) - NOT_DEPENDENCIES
        missing = sorted(f for f in code if not any(f == dep or f.startswith(dep + "/") for dep in deps))
        if missing:
            undeclared[name] = missing
    assert undeclared == {}, undeclared


def test_each_stage_reads_and_logs_the_params_dvc_yaml_declares_for_it():
    """Which params a stage reads was written in dvc.yaml and again in tracking, and the two disagreed: stage two's
    MLflow run logged all of augment, promote's none of the tracking it registers to, prior's every section."""
    from tqc.config import STAGE_PARAMS, Params
    from tqc.tracking import _stage_params

    stages = yaml.safe_load(DVC_YAML.read_text(encoding="utf-8"))["stages"]
    assert {name: tuple(stage.get("params", ())) for name, stage in stages.items()} == STAGE_PARAMS
    logged = _stage_params("stage_two", Params())
    assert set(logged["augment"]) == {"implicit", "rate", "implicit_at"} and "model" not in logged
    assert set(_stage_params("promote", Params())) == {"seed", "promote", "evaluate", "tracking"}


def test_metrics_json_records_the_params_evaluate_declares_and_no_others():
    """evaluate recorded every pipeline section, validate's thresholds and data's paths too: a change to one of those
    that left the validated data as it was ran no evaluate, and the record kept the old value."""
    from tqc.config import load_params
    from tqc.stages.evaluate import RECORDED_PARAMS, recorded_params

    declared = yaml.safe_load(DVC_YAML.read_text(encoding="utf-8"))["stages"]["evaluate"]["params"]
    assert tuple(declared) == RECORDED_PARAMS
    recorded = recorded_params(load_params(DVC_YAML.parent / "params.yaml"))
    assert set(recorded["data"]) == {"dataset", "validation_fraction"} and "validate" not in recorded
    assert recorded["stage_two"]["loss"] == "nt_xent"


def test_every_table_plot_says_what_it_draws():
    """Without a title `dvc plots show` heads a plot with its file's path: the confusion matrix did not say it is
    ADMC's (class-prior shifted) test predictions, nor a training curve what its y is over."""
    tables = {path: options for path, options in declared_plots().items() if path.endswith((".csv", ".json", ".tsv"))}
    assert {path for path, options in tables.items() if not options.get("title")} == set()


def test_make_run_checks_the_folders_ingest_depends_on_through_params_before_dvc_repro(tmp_path, monkeypatch, capsys):
    """DVC stops on a missing `${data.data_dir}` before any stage runs, with "failed to reproduce 'ingest': [Errno 2]
    No such file or directory: PATH": the path, not the setting. `make run` asks `tqc check-inputs` first, which
    checks every such dependency: each is pointed at a folder that is not there, and must be named. (A constant
    listing them was checked against dvc.yaml, but the check itself never read it.)"""
    import re

    from tqc.cli import main

    interpolated = {name for stage in yaml.safe_load(DVC_YAML.read_text())["stages"].values()
                    for dep in stage.get("deps", []) for name in re.findall(r"\$\{([^}]+)\}", str(dep))}
    assert interpolated, "dvc.yaml names no dependency through params.yaml: this test then checks nothing"
    shutil.copy(DVC_YAML.parent / "params.yaml", tmp_path / "params.yaml")
    for name in interpolated:
        (tmp_path / "there" / name).mkdir(parents=True)
    there = [arg for name in interpolated for arg in ("--set", f"{name}={tmp_path / 'there' / name}")]
    params = ["--params", str(tmp_path / "params.yaml")]
    assert main([*params, *there, "check-inputs"]) == 0, capsys.readouterr().err
    for name in sorted(interpolated):
        assert main([*params, *there, "--set", f"{name}=nowhere", "check-inputs"]) == 2
        assert f"{name} 'nowhere': no folder {tmp_path / 'nowhere'}" in capsys.readouterr().err, name
    recipe = (DVC_YAML.parent / "Makefile").read_text().split("\nrun: install\n")[1].split("\n\n")[0]
    assert recipe.index("tqc check-inputs") < recipe.index("dvc repro")


def test_check_inputs_names_the_setting_of_a_missing_folder_and_passes_when_there(tmp_path, monkeypatch, capsys):

    from tqc.cli import main

    shutil.copy(DVC_YAML.parent / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)  # as `make run` runs it: in the folder of params.yaml and dvc.yaml
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "tqc").write_text("")
    monkeypatch.setattr("sys.argv", [".venv/bin/tqc", "check-inputs"])  # as `make run` starts it
    params = ["--params", "params.yaml"]
    assert main([*params, "--set", "data.data_dir=../datasetz", "check-inputs"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("tqc check-inputs: error: params.yaml: data.data_dir '../datasetz': no "
                            f"folder {tmp_path.parent / 'datasetz'} (point it at your data, or fetch the public datasets "
                            "there: .venv/bin/tqc fetch --dest ../datasetz); data.additions 'data/raw': no folder ")
    assert error.endswith("dvc.yaml's ingest depends on both, so `dvc repro` would stop before any stage runs, naming "
                          "only the path\n")
    (tmp_path / "data" / "raw").mkdir(parents=True)
    assert main([*params, "--set", "data.data_dir=../datasetz", "check-inputs"]) == 2
    assert "data.additions" not in capsys.readouterr().err
    assert main([*params, "--set", f"data.data_dir={tmp_path}", "check-inputs"]) == 0
    assert not capsys.readouterr().err


def test_check_inputs_resolves_relative_folders_from_the_params_files_folder_as_dvc_does(tmp_path, monkeypatch, capsys):
    """DVC resolves `${data.data_dir}` from dvc.yaml's folder, beside params.yaml, wherever `dvc repro` is started;
    check-inputs resolved it from the working directory: run from elsewhere it refused folders that are there and
    passed ones DVC would not find, and its `mkdir -p` hint made the folder in the wrong place."""

    from tqc.cli import main

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    for folder in (project / "datasets", project / "data" / "raw", elsewhere):
        folder.mkdir(parents=True)
    shutil.copy(DVC_YAML.parent / "params.yaml", project / "params.yaml")
    monkeypatch.chdir(elsewhere)
    params = ["--params", str(project / "params.yaml"), "--set", "data.data_dir=datasets"]
    assert main([*params, "check-inputs"]) == 0
    assert not capsys.readouterr().err
    shutil.rmtree(project / "data")
    (elsewhere / "data" / "raw").mkdir(parents=True)  # where the working directory would find it, and DVC would not
    assert main([*params, "check-inputs"]) == 2
    error = capsys.readouterr().err
    assert f"data.additions 'data/raw': no folder {project / 'data' / 'raw'} " in error
    assert f"mkdir -p {project / 'data' / 'raw'}," in error


def test_ingest_reads_relative_data_folders_from_the_params_files_folder_as_check_inputs_does(tmp_path, monkeypatch):
    """`tqc --params project/params.yaml ingest`, run from another folder, read a relative data.data_dir and
    data.additions from the working folder, while check-inputs and DVC read them from the params file's folder: the
    check passed and ingest then found no dataset (or another one, or no additions)."""
    import json

    from tests.conftest import write_custom_dataset
    from tqc.cli import main

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    write_custom_dataset(project / "raw")
    (project / "additions").mkdir()
    (project / "additions" / "labeled.jsonl").write_text(
        json.dumps({"text": "an added question from the additions folder", "class_id": "LOC"}) + "\n")
    elsewhere.mkdir()
    (project / "params.yaml").write_text(yaml.safe_dump({"data": {
        "dataset": "custom", "data_dir": "raw", "additions": "additions",
        "custom": {"train": "train.csv", "test": "test.csv", "catalog": "catalog.csv", "text_column": "question"}}}))
    monkeypatch.chdir(elsewhere)
    out = ["--out", str(tmp_path / "out"), "--quarantine", str(tmp_path / "q.jsonl"), "--report", str(tmp_path / "r.json")]
    assert main(["--params", str(project / "params.yaml"), "check-inputs"]) == 0
    assert main(["--params", str(project / "params.yaml"), "ingest", *out]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["read"]["additions"] == 1, report["read"]
    written = [json.loads(line)["text"] for name in ("train.jsonl", "validation.jsonl")
               for line in (tmp_path / "out" / name).read_text().splitlines()]
    assert "an added question from the additions folder" in written
    assert not list(elsewhere.iterdir())  # nothing read or made where the command was started


def test_check_inputs_hint_names_the_tqc_that_ran_wherever_it_ran(tmp_path, monkeypatch, capsys):
    """The fetch hint said `.venv/bin/tqc fetch`, a path from the project: run from another folder, no such command."""

    from tqc.cli import main

    project, elsewhere = tmp_path / "my project", tmp_path / "elsewhere"
    (project / ".venv" / "bin").mkdir(parents=True)
    elsewhere.mkdir()
    shutil.copy(DVC_YAML.parent / "params.yaml", project / "params.yaml")
    (project / ".venv" / "bin" / "tqc").write_text("")
    monkeypatch.chdir(elsewhere)
    params = ["--params", str(project / "params.yaml"), "--set", "data.data_dir=datasets", "check-inputs"]
    monkeypatch.setattr("sys.argv", [str(project / ".venv" / "bin" / "tqc"), *params])  # as the shell gave it
    assert main(params) == 2
    assert f"there: '{project / '.venv' / 'bin' / 'tqc'}' fetch --dest {project / 'datasets'});" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", ["/usr/lib/python3/site-packages/pytest/__main__.py"])  # main called by another program
    assert main(params) == 2
    assert f"there: tqc fetch --dest {project / 'datasets'});" in capsys.readouterr().err


def test_check_inputs_reads_a_linked_params_file_from_where_the_link_stands(tmp_path, monkeypatch, capsys):
    """A params.yaml beside dvc.yaml that links to a file kept elsewhere is read by DVC there, beside dvc.yaml."""

    from tqc.cli import main

    project, kept = tmp_path / "project", tmp_path / "kept"
    for folder in (project / "datasets", project / "data" / "raw", kept):
        folder.mkdir(parents=True)
    shutil.copy(DVC_YAML.parent / "params.yaml", kept / "params.yaml")
    (project / "params.yaml").symlink_to(kept / "params.yaml")
    monkeypatch.chdir(project)
    assert main(["--params", "params.yaml", "--set", "data.data_dir=datasets", "check-inputs"]) == 0
    assert not capsys.readouterr().err


def test_the_collective_timeout_re_runs_no_stage_and_is_not_recorded_in_metrics_json():
    """distributed.timeout_minutes only bounds how long a process waits for the others; no output follows from it.
    Declared through the whole `distributed` section, a change to it re-ran stage one, stage two, NC and evaluate (a
    full training each), and metrics.json recorded it (a new figure in `dvc metrics diff`). The settings that shape
    the models (the process count, the backend) stay declared."""
    from tqc.config import load_params
    from tqc.stages.evaluate import recorded_params

    def covers(declared: str, key: str) -> bool:
        return key == declared or key.startswith(declared + ".")

    stages = yaml.safe_load(DVC_YAML.read_text(encoding="utf-8"))["stages"]
    declaring = {name for name, stage in stages.items() for declared in stage.get("params", [])
                 if covers(str(declared), "distributed.timeout_minutes")}
    assert declaring == set()
    for name in ("warmup", "stage_one", "stage_two", "baseline_nc", "evaluate"):
        for key in ("distributed.nproc_per_node", "distributed.backend"):
            assert any(covers(str(declared), key) for declared in stages[name]["params"]), (name, key)
    recorded = recorded_params(load_params(DVC_YAML.parent / "params.yaml"))
    assert recorded["distributed"] == {"nproc_per_node": 1, "backend": "auto"}


def test_each_training_stage_in_dvc_yaml_passes_the_path_arguments_its_command_takes():
    """The training stages' path arguments are one table (`training_commands`), which the CLI's parser and the chain
    (in process and under torchrun) both read; dvc.yaml writes them out once more, held to it here."""
    from tqc.training_commands import TRAINING_COMMANDS

    stages = yaml.safe_load(DVC_YAML.read_text())["stages"]
    for command in TRAINING_COMMANDS.values():
        words = stages[command.stage]["cmd"].split()
        assert words[:2] == ["tqc", command.name]
        given = [word[2:] for word in words[2:] if word.startswith("--")]
        assert set(command.paths) <= set(given) <= set(command.paths) | set(command.optional), (command.stage, given)
        # what the table hands run() decides the stage's outputs, and no import of the stage's module reaches it
        assert "src/tqc/training_commands.py" in [str(dep) for dep in stages[command.stage]["deps"]], command.stage


def test_bytecode_caches_in_a_code_folder_dvc_yaml_depends_on_are_not_part_of_its_hash():
    """src/tqc/model and src/tqc/readers are folder deps. DVC does not read .gitignore, so the __pycache__ that the
    first import writes there (wherever PYTHONDONTWRITEBYTECODE is unset) made every stage that depends on them stale:
    a second `dvc repro` then ran ten of eleven stages again."""
    import sys

    folders = sorted({str(dep).rstrip("/") for stage in yaml.safe_load(DVC_YAML.read_text())["stages"].values()
                      for dep in stage.get("deps", []) if (DVC_YAML.parent / str(dep)).is_dir() and str(dep).startswith("src/")})
    assert folders, "no code folder among dvc.yaml's deps: this test guards nothing"
    caches = [f"{folder}/__pycache__/module.cpython-311.pyc" for folder in folders]
    dvc = Path(sys.executable).with_name("dvc")
    checked = subprocess.run([str(dvc), "check-ignore", *caches, f"{folders[0]}/__init__.py"], cwd=DVC_YAML.parent,
                             capture_output=True, text=True)
    assert checked.stdout.split() == caches, checked.stdout + checked.stderr  # the bytecode ignored, the code not



def declared_outputs() -> dict[str, bool]:
    """Each output dvc.yaml declares, and whether DVC caches it (a `cache: false` one is git's, as metrics.json)."""
    outputs: dict[str, bool] = {}
    for stage in yaml.safe_load(DVC_YAML.read_text())["stages"].values():
        for entry in stage.get("outs", []):
            (path, options), = (entry.items() if isinstance(entry, dict) else [(entry, {})])
            outputs[path] = (options or {}).get("cache", True)
    return outputs


def test_git_ignores_every_output_dvc_caches_and_nothing_a_commit_needs():
    cached = sorted(path for path, cache in declared_outputs().items() if cache)
    kept = ["data/raw/labeled.jsonl.dvc", "data/raw/.gitignore", "data/raw/README.md", "reports/metrics.json"]
    checked = subprocess.run(["git", "check-ignore", "--no-index", *cached, *kept], cwd=DVC_YAML.parent,
                             capture_output=True, text=True)
    ignored = set(checked.stdout.split())
    assert set(cached) <= ignored and not ignored & set(kept), checked.stdout + checked.stderr


def test_dvc_collects_the_data_versions_the_retrain_flow_adds_under_data_raw(tmp_path):
    """DVC reads .gitignore through dulwich, which took the old `/data/*` with `!/data/raw/` to ignore data/ whole:
    it never collected data/raw/labeled.jsonl.dvc, the retrain flow's data version, so a target-less `dvc push` left
    its data off the remote and `dvc exp run` deleted it. Here, in a project with the repository's .gitignore, the
    .dvc file is one of the project's stages and a target-less push sends its data."""
    from dvc.repo import Repo

    from tests.conftest import dvc_init

    project = tmp_path / "project"
    (project / "data" / "raw").mkdir(parents=True)
    shutil.copy(DVC_YAML.parent / ".gitignore", project)
    added = project / "data" / "raw" / "labeled.jsonl"
    added.write_text('{"text": "How do I reset my card PIN?", "label": "pin"}\n')
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    dvc_init(project)
    with Repo(project) as repo:
        repo.add(str(added))
        with repo.config.edit() as config:
            config["remote"]["store"] = {"url": str(tmp_path / "remote")}
            config["core"]["remote"] = "store"
    with Repo(project) as repo:  # read afresh, as the next dvc command would
        assert f"{added}.dvc" in [stage.path for stage in repo.index.stages]
        repo.push()
    pushed = [path.read_bytes() for path in (tmp_path / "remote").rglob("*") if path.is_file()]
    assert pushed == [added.read_bytes()]
