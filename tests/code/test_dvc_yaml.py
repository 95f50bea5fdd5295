"""What dvc.yaml declares, read as DVC reads it."""

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
NOT_DEPENDENCIES = {"src/tqc/__init__.py", "src/tqc/stages/__init__.py", "src/tqc/config.py"}


def module_file(module: str) -> Path | None:
    path = SRC.joinpath(*module.split("."))
    return next((p for p in (path / "__init__.py", path.with_suffix(".py")) if p.is_file()), None)


def imported_modules(module: str) -> set[str]:
    """The tqc modules one module imports, at its top or inside a function (stages import heavy ones lazily)."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(module_file(module).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
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
        code = code_of("tqc.stages." + command[1].replace("-", "_")) - NOT_DEPENDENCIES
        missing = sorted(f for f in code if not any(f == dep or f.startswith(dep + "/") for dep in deps))
        if missing:
            undeclared[name] = missing
    assert undeclared == {}, undeclared
