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
