"""The paper's ablations as DVC experiments: one `dvc exp run --temp` per cell and seed.

A cell is the ordinary pipeline up to `evaluate`, with its params set by `-S`, so every
figure in `reports/ablations.md` is what `dvc repro` trains with those params, and each run
stays in DVC as a named experiment (`dvc exp show`, `dvc exp apply <name>`). A cell whose
experiment already exists is read back, never trained again, so an interrupted grid resumes.
Names carry a hash of the cell's params: change the budget or a variant and the cell is new.

Experiments live in one repository's git refs, but a report is committed and outlives the
machine that ran its cells. So a cell that has no experiment here and is recorded, under the
same name, in the `ablations.json` the report replaces is read from that record ("recorded",
marked in the table), not trained again; `--rerun` trains it here. Records of cells outside a
narrowed run (`--grid`, `--variant`, `--where`, `--seeds`) stay in the JSON (`other_cells`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

from tqc.config import AblationGrid, ConfigError, Params, flatten, load_params, unflatten
from tqc.io import atomic_path, write_json, write_text
from tqc.metrics import seed_std

log = logging.getLogger(__name__)

# What a cell reports: ADMC (stage two) and AC (stage one alone) on test, NC where the cell
# trained it (baseline_nc.enabled), ADMC's validation figure beside; the table's column names.
FIGURES = {  # name: (column, keys in metrics.json)
    "admc_accuracy": ("ADMC accuracy", ("test", "accuracy")),
    "admc_macro_f1": ("ADMC macro-F1", ("test", "macro_f1")),
    "ac_accuracy": ("AC accuracy", ("stage_one", "test", "accuracy")),
    "ac_macro_f1": ("AC macro-F1", ("stage_one", "test", "macro_f1")),
    "nc_accuracy": ("NC accuracy", ("nc", "test", "accuracy")),
    "nc_macro_f1": ("NC macro-F1", ("nc", "test", "macro_f1")),
    "admc_validation_macro_f1": ("ADMC validation macro-F1", ("validation", "macro_f1")),
}


LABEL_JOIN = " · "  # a cell's label: its variant's name, then its matrix values ("oversample · ir=50")


def label_parts(label: str) -> tuple[str, list[str]]:
    """A cell's (or a report row's) label as its variant's name and its matrix values."""
    name, *point = label.split(LABEL_JOIN)
    return name, point


def label_of(name: str, point: list[str]) -> str:
    return LABEL_JOIN.join([name, *point])


@dataclass(frozen=True)
class Cell:
    grid: str
    variant: str  # the variant name, then any matrix values, e.g. "oversample · ir=50"
    seed: int
    overrides: dict  # dotted param path → value, in the order they apply
    local: dict = field(default_factory=dict, compare=False)  # this machine's paths: not part of the name
    # Its variant (or matrix value) sets the class-prior shift's params: the shift is the cell's point,
    # so it is read after it (`read_cell`); not part of the name (the overrides are)
    about_prior_shift: bool = field(default=False, compare=False)

    @property
    def variant_name(self) -> str:
        """The variant without its matrix values: "oversample" of "oversample · ir=50"."""
        return label_parts(self.variant)[0]

    @property
    def name(self) -> str:
        """A DVC experiment name (a git ref component): grid, variant, hash of its params, seed."""
        shared = {path: value for path, value in self.overrides.items() if path != "seed"}  # one hash for all seeds
        digest = hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:8]
        slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{self.grid}-{self.variant}").strip("-").lower()
        return f"abl-{slug}-{digest}-s{self.seed}"


@dataclass
class CellResult:
    cell: Cell
    status: str  # done (an experiment here) | recorded (in the report this one replaces) | missing
    figures: dict = field(default_factory=dict)
    generated_rows: int | None = None
    experiment_rev: str | None = None
    code_version: str | None = None  # the commit its metrics.json says it ran (None: recorded before it was kept)


def grid_cells(name: str, grid: AblationGrid, seeds: list[int], budget: dict, local: dict) -> list[Cell]:
    """Every (variant × matrix combination × seed) cell; later overrides win over earlier ones."""
    axes = list(grid.matrix.items())
    cells = []
    for variant, variant_overrides in grid.variants.items():
        for values in itertools.product(*(choices for _, choices in axes)):
            combination = {path: value for (path, _), value in zip(axes, values)}
            label = label_of(variant, [f"{_short(path)}={value}" for path, value in combination.items()])
            # what sets this cell apart (not the grid's common params) decides whether it is about the shift
            about_prior_shift = any(path.startswith("prior.") for path in {**variant_overrides, **combination})
            for seed in seeds:
                overrides = {**budget, **grid.budget, **grid.base, **variant_overrides, **combination, "seed": seed}
                cells.append(Cell(name, label, seed, overrides, local, about_prior_shift))
    return cells


def _short(path: str) -> str:
    return {"data.imbalance_ratio": "ir"}.get(path, path.rsplit(".", 1)[-1])


def local_overrides(params: Params, project: Path) -> dict:
    """Paths that must survive the copy DVC runs an experiment in (.dvc/tmp/exps/…)."""
    overrides = {"data.data_dir": str((project / params.data.data_dir).resolve())}
    if params.tracking.enabled and not params.tracking.uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        overrides["tracking.uri"] = f"sqlite:///{(project / 'mlflow.db').resolve()}"
    return overrides


def hydra_literal(value) -> str:
    """A param value in Hydra's override grammar, which `dvc exp run -S` parses: strings single-quoted.

    Bare, a path such as /home/josé/a,b would be read as an escape and a sweep, and '1e3' as a float.
    """
    if isinstance(value, str):
        # OmegaConf, under Hydra, reads ${…} as an interpolation unless a backslash precedes it
        # (and a backslash of the text before it is then doubled), or -S '/data/${USER}' fails.
        value = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", value)
        # Hydra escapes a quote with a backslash, and doubles only backslashes that precede a quote.
        escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
        return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped) + "'"
    if isinstance(value, list):
        return "[" + ",".join(hydra_literal(v) for v in value) + "]"
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def set_arguments(overrides: dict) -> list[str]:
    """{"augment.implicit": ["dropout"]} → ["-S", "++augment.implicit=['dropout']"] (++: add the key when params.yaml lacks it)."""
    return [argument for path, value in overrides.items() for argument in ("-S", f"++{path}={hydra_literal(value)}")]


def experiment_refs(project: Path) -> dict[str, str]:
    """Experiment name → its git ref, over every baseline commit (refs/exps/<ab>/<baseline rest>/<name>).

    A name run under several baselines (--rerun after a commit) reads the one under HEAD, else the
    most recently committed: later entries win, so refs go by date, those under HEAD last.
    """
    listing = _git(project, "for-each-ref", "--sort=committerdate", "--format=%(refname)", "refs/exps")
    head = subprocess.run(["git", "rev-parse", "-q", "--verify", "HEAD"], cwd=project, capture_output=True, text=True).stdout.strip()
    by_date = [ref.split("/") for ref in listing.splitlines() if ref.count("/") == 4]  # not refs/exps/exec/… and the like
    ordered = sorted(by_date, key=lambda parts: parts[2] + parts[3] == head)  # stable: by date, HEAD's last
    return {parts[4]: "/".join(parts) for parts in ordered}


def experiment_overrides(cell: Cell, project: Path) -> dict:
    """The cell's params for its experiment: this machine's paths, then the cell's own values over them (a grid
    of its own data sets data.data_dir), each path made absolute so it holds in DVC's copy of the project."""
    overrides = {**cell.local, **cell.overrides}
    if "data.data_dir" in cell.overrides:
        overrides["data.data_dir"] = str((project / cell.overrides["data.data_dir"]).resolve())
    return overrides


def cell_environment() -> dict[str, str]:
    """The environment of a cell's `dvc exp run`, whose stages run in DVC's copy of the project.

    dvc.yaml's stages call `tqc`: this environment's scripts go first on PATH even when the venv
    is not active. And `src` (relative: each stage's working directory, the copy) goes first on
    PYTHONPATH: an editable install imports the checkout's live `src`, so code edited while a grid
    runs would reach its later cells while DVC records the copy's hashes for them.
    """
    return {**os.environ,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join(filter(None, ["src", os.environ.get("PYTHONPATH", "")]))}


def run_cell(cell: Cell, project: Path, force: bool = False) -> bool:
    """`dvc exp run --temp -n NAME -S … evaluate`: the pipeline up to evaluate, promote skipped.

    force (--rerun): -f, which replaces an experiment of the same name and reruns every stage.
    """
    command = [sys.executable, "-m", "dvc", "exp", "run", "--temp", *(["-f"] if force else []), "-n", cell.name,
               *set_arguments(experiment_overrides(cell, project)), "evaluate"]
    log.info("ablate: %s (%s, seed %d): %s", cell.name, cell.variant, cell.seed, " ".join(command))
    started = time.perf_counter()
    finished = subprocess.run(command, cwd=project, env=cell_environment())
    log.info("ablate: %s %s in %.0fs", cell.name, "finished" if finished.returncode == 0 else "FAILED",
             time.perf_counter() - started)
    return finished.returncode == 0


def read_cell(cell: Cell, project: Path, refs: dict[str, str]) -> CellResult:
    ref = refs.get(cell.name)
    if ref is None:
        return CellResult(cell, "missing")
    metrics = json.loads(_git(project, "show", f"{ref}:reports/metrics.json"))
    metrics = metrics if cell.about_prior_shift else without_prior_shift(metrics)
    augment = json.loads(_git(project, "show", f"{ref}:reports/augment.json"))
    figures = {name: dig(metrics, keys) for name, (_, keys) in FIGURES.items()}
    run = metrics.get("run") or {}
    code_version = run.get("code_version")  # evaluate's record of the commit it ran
    # the commit, and '-dirty' where the code itself was edited (`code_edited`): inside `dvc exp run -S` params.yaml
    # always differs from the commit, so code_version's own '-dirty' says nothing
    known = code_version and code_version != "unknown"
    version = code_version[:10] + ("-dirty" if run.get("code_edited") else "") if known else None
    return CellResult(cell, "done", figures, augment["rows"]["generated"], _git(project, "rev-parse", ref).strip()[:10],
                      version)


def without_prior_shift(metrics: dict) -> dict:
    """A cell's metrics.json with each model's figures from before its class-prior shift.

    The grids compare training variants, and their recorded cells ran before the prior stage
    existed, so cells are read without the post-hoc shift to keep them comparable (all but
    those whose variant sets the shift's params: `Cell.about_prior_shift`).
    """
    shifted = metrics.get("prior_shift") or {}
    unshifted = dict(metrics)
    if "admc" in shifted:
        unshifted.update(test=shifted["admc"]["test_unshifted"], validation=shifted["admc"]["validation_unshifted"])
    for name in ("stage_one", "nc"):
        if name in shifted:
            unshifted[name] = {"test": shifted[name]["test_unshifted"], "validation": shifted[name]["validation_unshifted"]}
    return unshifted


def recorded_cells(report: Path) -> dict[str, CellResult]:
    """Experiment name → what an earlier `ablations.json` recorded of it, seed by seed.

    Reports since this format list each finished seed under `cells`; older ones only kept each
    figure's values in `experiments` order, which can be paired with the names only where a
    figure has a value for every seed (or none), so other rows are not read back.
    """
    if not report.exists():
        return {}
    try:
        content = json.loads(report.read_text(encoding="utf-8"))
        entries = [{"grid": row["grid"], "variant": row["variant"], **entry}
                   for row in content["rows"] for entry in (row.get("cells") or _cells_of_old_row(row))]
        recorded = {}
        for entry in entries + content.get("other_cells", []):
            cell = Cell(entry["grid"], entry["variant"], entry["seed"], {})
            figures = {name: entry["figures"].get(name) for name in FIGURES}
            recorded[entry["experiment"]] = CellResult(cell, "recorded", figures, entry["generated_rows"],
                                                       entry.get("rev"), entry.get("code_version"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # cut short, or not this command's: a traceback
        said = f"no {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())
        raise ConfigError(f"{report}: not a report tqc ablate wrote ({said}); move it aside, or give another "
                          "--out") from None
    return recorded


def _record(name: str, result: CellResult) -> dict:
    """One finished seed as ablations.json keeps it (a row's `cells`, and `other_cells` with grid and variant)."""
    return {"experiment": name, "seed": result.cell.seed, "status": result.status, "rev": result.experiment_rev,
            "code_version": result.code_version, "generated_rows": result.generated_rows, "figures": result.figures}


def _cells_of_old_row(row: dict) -> list[dict]:
    names, count = row["experiments"], len(row["experiments"])
    lengths = {len(row[name]["values"]) for name in FIGURES if name in row}
    if not lengths <= {0, count} or len(row["generated_rows"]) != count:
        log.warning("ablate: %s · %s: its recorded figures cannot be paired with seeds; not read back", row["grid"], row["variant"])
        return []
    return [{"experiment": name, "seed": seed, "generated_rows": row["generated_rows"][i],
             "figures": {f: row[f]["values"][i] if f in row and row[f]["values"] else None for f in FIGURES}}
            for i, (name, seed) in enumerate(zip(names, row["seeds_done"]))]


def dig(tree: dict, keys: tuple[str, ...]):
    """The value at `keys` down a metrics tree; None below a section the run wrote as null."""
    for key in keys:
        if tree is None:  # a section the cell did not produce (nc: null when NC was not trained)
            return None
        tree = tree[key]
    return tree


def _git(project: Path, *arguments: str) -> str:
    return subprocess.run(["git", *arguments], cwd=project, check=True, capture_output=True, text=True).stdout


def matches(cell: Cell, where: dict) -> bool:
    """`where` narrows the cells that set a path; a cell that leaves it at the pipeline's value stays.

    So `--where data.imbalance_ratio=50` keeps the ir = 50 slice of the augmentation grid and
    every TREC-50 cell of the other grids, and one report can hold both.
    """
    return all(cell.overrides[path] == value for path, value in where.items() if path in cell.overrides)


def check_where(where: dict, params: Params, cells: list[Cell]) -> None:
    """A --where key must be a param: a misspelt one narrows nothing (every cell leaves it at the pipeline's value),
    and with training on, the whole grid would run."""
    paths = set(flatten(params.model_dump(mode="json", by_alias=True))) | {path for cell in cells for path in cell.overrides}
    unknown = sorted(path for path in where if path not in paths)
    if unknown:
        raise ConfigError(f"--where {', '.join(unknown)}: no such param (a misspelling would narrow nothing)")


def select_cells(params: Params, grids: list[str], seeds: list[int], local: dict, variants: list[str] | None = None,
                 where: dict | None = None) -> list[Cell]:
    """The grids' cells, in order, that `variants` and `where` leave (see `matches`). Refused: an unknown grid or
    variant, a misspelt `where` key, and a selection of no cell (an empty table would replace a report)."""
    grids = list(dict.fromkeys(grids))  # a grid named twice would count each seed twice
    unknown = [g for g in grids if g not in params.ablate.grids]
    if unknown:
        raise ConfigError(f"unknown ablation grid(s) {unknown}; params.yaml has {sorted(params.ablate.grids)}")
    known = {variant for grid in grids for variant in params.ablate.grids[grid].variants}
    unknown = sorted(set(variants or []) - known)
    if unknown:
        raise ConfigError(f"unknown variant(s) {unknown} in grid(s) {grids}; they have {sorted(known)}")
    every_cell = [cell for grid in grids
                  for cell in grid_cells(grid, params.ablate.grids[grid], seeds, params.ablate.budget, local)]
    check_where(where or {}, params, every_cell)
    cells = [cell for cell in every_cell
             if (not variants or cell.variant_name in variants) and matches(cell, where or {})]
    if not cells:
        raise ConfigError(f"no cell of grid(s) {grids} is left by --variant {variants or 'any'} and --where {where or 'none'}")
    return cells


def check_cells(project: Path, cells: list[Cell], params: Params) -> None:
    """Each cell's params as its experiment reads them (the project's params.yaml, not `tqc --set`'s, which no
    experiment gets, under the cell's overrides): a value the cell's other params refuse (`explicit: file` with no
    file) fails here, named by its cell, instead of in the first stage of every experiment. A value no param takes on
    its own (a bool written `maybe`, 0 epochs) was refused already, when the params loaded (`config.value_problem`).
    `params`: what is checked where the project has no params.yaml of its own."""
    if (project / "params.yaml").exists():
        params = load_params(project / "params.yaml")
    problems = []
    for cell in {(cell.grid, cell.variant): cell for cell in cells}.values():  # every seed of a cell shares its params
        try:
            params.with_overrides(unflatten(experiment_overrides(cell, project)))
        except ConfigError as exc:
            problems.append(f"ablate.grids.{cell.grid}, cell {cell.variant}: {exc}")
    if problems:
        raise ConfigError(f"{len(problems)} ablation cell(s) have params no run takes:\n" + "\n".join(problems))


def ablate(params: Params, project: Path, out_dir: Path, grids: list[str] | None = None, variants: list[str] | None = None,
           seeds: list[int] | None = None, run: bool = True, rerun: bool = False, where: dict | None = None) -> list[CellResult]:
    """Run the missing cells of the chosen grids (all by default), then write the report.

    `variants` and `where` ({"data.imbalance_ratio": 50}, see `matches`) narrow the cells; the order is the
    grid's, variants first, so the first cells of a long grid finish all their seeds early.
    """
    chosen = list(dict.fromkeys(grids or params.ablate.grids))
    seeds_to_run = params.with_overrides({"ablate": {"seeds": seeds}}).ablate.seeds if seeds else params.ablate.seeds  # --seeds as strict
    cells = select_cells(params, chosen, seeds_to_run, local_overrides(params, project), variants, where)
    recorded = recorded_cells(out_dir / "ablations.json")
    failed: set[str] = set()
    if run:  # not for --report-only: tabulating what ran checks nothing it would run
        check_cells(project, cells, params)
        refs = experiment_refs(project)
        for cell in cells:
            if (rerun or (cell.name not in refs and cell.name not in recorded)) and not run_cell(cell, project, rerun):
                failed.add(cell.name)
    refs = experiment_refs(project)
    # A cell asked to train here (--rerun, or a failed run) is not stood in for by an old record.
    fallback = {} if rerun and run else {name: r for name, r in recorded.items() if name not in failed}
    # A cell that failed here is missing, not read from an older experiment of its name.
    results = [CellResult(cell, "missing") if cell.name in failed else _or_recorded(read_cell(cell, project, refs), fallback)
               for cell in cells]
    shown = {r.cell.name for r in results if r.status != "missing"}
    kept = [{"grid": r.cell.grid, "variant": r.cell.variant, **_record(name, r)} for name, r in recorded.items() if name not in shown]
    if kept:
        log.info("ablate: %d recorded cell(s) not in this report's table stay in its ablations.json", len(kept))
    # the report's header and ablations.json name the seeds these cells ran (--seeds), not params.yaml's
    write_report(params.with_overrides({"ablate": {"seeds": seeds_to_run}}), chosen, results, out_dir, kept)
    return results


def _or_recorded(result: CellResult, recorded: dict[str, CellResult]) -> CellResult:
    """The experiment here wins; without one, the earlier report's record of the same name."""
    if result.status != "missing" or result.cell.name not in recorded:
        return result
    return replace(recorded[result.cell.name], cell=result.cell)


def summarise(results: list[CellResult]) -> list[dict]:
    """Cells grouped by (grid, variant): mean and std over the seeds that finished."""
    groups: dict[tuple[str, str], list[CellResult]] = {}
    for result in results:
        groups.setdefault((result.cell.grid, result.cell.variant), []).append(result)
    rows = []
    for (grid, variant), members in groups.items():
        done = [m for m in members if m.status in ("done", "recorded")]
        row = {"grid": grid, "variant": variant, "seeds_done": [m.cell.seed for m in done],
               "seeds_missing": [m.cell.seed for m in members if m.status not in ("done", "recorded")],
               "seeds_recorded": [m.cell.seed for m in done if m.status == "recorded"],
               "generated_rows": [m.generated_rows for m in done], "experiments": [m.cell.name for m in done],
               "settings": {path: value for path, value in members[0].cell.overrides.items() if path != "seed"},
               "cells": [_record(m.cell.name, m) for m in done]}
        for figure in FIGURES:
            values = [m.figures[figure] for m in done if m.figures.get(figure) is not None]
            row[figure] = {"mean": float(np.mean(values)) if values else None,
                           "std": seed_std(values) if values else None, "values": values}
        rows.append(row)
    return rows


def write_report(params: Params, grids: list[str], results: list[CellResult], out_dir: Path,
                 other_cells: list[dict] | None = None) -> None:
    """`other_cells`: records of earlier cells this report does not show, kept so that none is lost."""
    rows = summarise(results)
    grids = [grid for grid in grids if any(row["grid"] == grid for row in rows)]  # none of whose cells were selected
    markdown = render_markdown(params, grids, rows)  # before any write: a failure leaves the three files as they were
    plot(rows, grids, out_dir / "ablations.png")
    write_json(out_dir / "ablations.json", {"seeds": params.ablate.seeds, "budget": params.ablate.budget, "rows": rows,
                                            "paired": [d for grid in grids for d in paired_differences(params, grid, rows)],
                                            "other_cells": other_cells or []})
    write_text(out_dir / "ablations.md", markdown)
    log.info("ablate: %d of %d cells done here, %d read from records; wrote %s", sum(r.status == "done" for r in results),
             len(results), sum(r.status == "recorded" for r in results), out_dir / "ablations.md")


def paired_difference(values: dict[int, float], reference: dict[int, float]) -> dict | None:
    """`values` − `reference` over the seeds both have (seed → figure): the mean, a 95% t-interval (None for
    one seed), and in how many of those seeds `values` is higher. Seeds pair cells that drew the same validation
    split and started from the same weights, so the difference of a pair is far less noisy than either figure:
    two means a std apart can still be a consistent gain, or none."""
    from scipy import stats

    seeds = sorted(set(values) & set(reference))
    if not seeds:
        return None
    differences = np.array([values[seed] - reference[seed] for seed in seeds])  # (seeds,)
    mean = float(differences.mean())
    low = high = None
    if len(seeds) > 1:
        half = float(stats.t.ppf(0.975, len(seeds) - 1) * differences.std(ddof=1) / np.sqrt(len(seeds)))
        low, high = mean - half, mean + half
    return {"seeds": seeds, "mean": mean, "ci95": [low, high] if low is not None else None,
            "higher_in": int((differences > 0).sum())}


def paired_differences(params: Params, grid: str, rows: list[dict], figure: str = "admc_macro_f1") -> list[dict]:
    """Each variant of `grid` against the grid's `reference` variant at the same matrix point, paired by seed
    (nothing when the grid names no reference)."""
    reference_name = params.ablate.grids[grid].reference
    if reference_name is None:
        return []
    by_label = {row["variant"]: row for row in rows if row["grid"] == grid}
    found = []
    for label, row in by_label.items():
        name, point = label_parts(label)
        reference = by_label.get(label_of(reference_name, point))
        if name == reference_name or reference is None:
            continue
        difference = paired_difference(_by_seed(row, figure), _by_seed(reference, figure))
        if difference:
            across = _across_code_versions(row, reference, difference["seeds"])
            found.append({"grid": grid, "variant": label, "reference": reference["variant"], "figure": figure, **difference,
                          "across_code_versions": across})
    return found


def _across_code_versions(row: dict, reference: dict, seeds: list[int]) -> int:
    """How many of the pairs are not known to be two cells of one code: two commits that differ, or a cell whose
    commit was not recorded (read from a record). Such a pair's difference may also hold a code change."""
    version = lambda r: {cell["seed"]: cell.get("code_version") for cell in r["cells"]}  # noqa: E731
    mine, theirs = version(row), version(reference)
    return sum(mine.get(seed) is None or mine.get(seed) != theirs.get(seed) for seed in seeds)


def _by_seed(row: dict, figure: str) -> dict[int, float]:
    return {cell["seed"]: cell["figures"][figure] for cell in row["cells"] if cell["figures"].get(figure) is not None}


def seeds_text(seeds: list[int], recorded: list[int]) -> str:
    """`0–39` for a run of four or more consecutive seeds alike in being read from records (†) or not (the
    usual three seeds stay `0, 1, 2`)."""
    runs: list[list[int]] = []
    for seed in sorted(seeds):
        if runs and seed == runs[-1][-1] + 1 and (seed in recorded) == (runs[-1][-1] in recorded):
            runs[-1].append(seed)
        else:
            runs.append([seed])
    mark = lambda seed: f"{seed}†" if seed in recorded else str(seed)  # noqa: E731
    return ", ".join(f"{mark(run[0])}–{mark(run[-1])}" if len(run) >= 4 else ", ".join(map(mark, run)) for run in runs)


def _paired_lines(params: Params, grid: str, rows: list[dict]) -> list[str]:
    differences = paired_differences(params, grid, rows)
    reference_name = params.ablate.grids[grid].reference
    if not differences:
        others = [row for row in rows if row["grid"] == grid and label_parts(row["variant"])[0] != reference_name]
        if reference_name is not None and others:  # a selection (--variant, --where) that left the reference out
            return [f"No paired differences: `{reference_name}`, the variant the others are measured against, has no "
                    "finished cell at their matrix points in this report (select it too, or run it).", ""]
        return []
    lines = [f"ADMC test macro-F1 minus `{reference_name}`'s at the same matrix point, paired by seed (a seed draws the "
             "validation split and the starting weights, unless a variant sets them), in points: the mean, its 95% t-interval "
             "over the seeds both finished, and in how many of them the variant is higher. An interval that holds 0 is no "
             "evidence of a difference either way. A pair whose two cells ran different code, or code not recorded, is "
             "counted as *across or without code versions*: its difference may also hold a code change.", "",
             "| variant | against | difference | 95% interval | higher in |", "|---|---|---|---|---|"]
    for d in differences:
        interval = "—" if d["ci95"] is None else f"[{100 * d['ci95'][0]:+.2f}, {100 * d['ci95'][1]:+.2f}]"
        lines.append(f"| {d['variant']} | {d['reference']} | {100 * d['mean']:+.2f} | {interval} | "
                     f"{d['higher_in']} of {len(d['seeds'])}{_across_text(d.get('across_code_versions', 0))} |")
    return lines + [""]


def _across_text(count: int) -> str:
    return f"; {count} across or without code versions" if count else ""


def _cell_text(figure: dict, seeds: int | None = None) -> str:
    """mean ± std in %; `seeds`: the row's seeds, so a figure over fewer of them (a record without it) says so."""
    if figure["mean"] is None:
        return "—"
    fewer = f" (n = {len(figure['values'])})" if seeds is not None and len(figure["values"]) < seeds else ""
    if len(figure["values"]) == 1:  # one seed has no spread to show
        return f"{100 * figure['mean']:.2f}{fewer}"
    return f"{100 * figure['mean']:.2f} ± {100 * figure['std']:.2f}{fewer}"


def _overrides_text(overrides: dict) -> str:
    return ", ".join(f"`{k}={json.dumps(v)}`" for k, v in overrides.items())


def render_markdown(params: Params, grids: list[str], rows: list[dict]) -> str:
    """ablations.md: what its figures are, then each grid's table, paired differences, code versions and variants."""
    lines = _preamble(params, rows)
    for grid in grids:
        lines += _grid_section(params, grid, [r for r in rows if r["grid"] == grid])
    return "\n".join(lines)


def _preamble(params: Params, rows: list[dict]) -> list[str]:
    """How to read every table below, and what the marks some of its rows carry mean."""
    budget = _overrides_text(params.ablate.budget) or "the params as they are"
    lines = ["# Ablations", "",
             "Written by `tqc ablate` from DVC experiments (`dvc exp show` lists them by the names below). "
             f"Test figures in %, mean ± sample std (ddof = 1) over seeds; budget: {budget}. AC is stage one alone, ADMC stage two, "
             "both from the same run, each before its class-prior shift (the `prior` stage; the grids compare training), "
             "except in variants that set `prior.*`, whose point is the shift (their validation figure is on the split "
             "their λ was fitted on). "
             "Nothing was chosen on test.", ""]
    if any(len(row[f]["values"]) < len(row["seeds_done"]) for row in rows for f in FIGURES if row[f]["mean"] is not None):
        lines += ["A figure marked (n = k) is over k of its row's seeds: the others' records lack it.", ""]
    if any(row["seeds_recorded"] for row in rows):
        lines += ["Seeds marked † were read from the report this one replaced: their experiments are not among this "
                  "repository's (they ran in another clone; `tqc ablate --rerun` trains them here).", ""]
    return lines


def _grid_section(params: Params, grid: str, grid_rows: list[dict]) -> list[str]:
    """One grid: its table, its variants against the reference, the code its cells ran, what each variant sets, and
    a two-axis matrix's pivot."""
    spec = params.ablate.grids[grid]
    # NC's columns only where some cell of the grid trained it (most grids compare ADMC variants alone)
    shown = [f for f in FIGURES if not f.startswith("nc_") or any(r[f]["mean"] is not None for r in grid_rows)]
    lines = [f"## {spec.title}", "", f"Grid `{grid}`; common params: {_overrides_text(spec.base) or 'none'}"
             + (f"; this grid's budget: {_overrides_text(spec.budget)}" if spec.budget else "") + ".", "",
             "| variant | " + " | ".join(FIGURES[f][0] for f in shown) + " | generated rows | seeds |",
             "|---" * (len(shown) + 3) + "|"]
    lines += [_table_row(row, shown) for row in grid_rows] + [""]
    lines += _paired_lines(params, grid, grid_rows)
    lines += [_code_versions_text(grid_rows), ""]
    settings = [f"`{name}`: {_overrides_text(overrides)}" for name, overrides in spec.variants.items() if overrides]
    if settings:  # what each variant sets over the common params, so the table explains itself
        lines += ["Variants: " + "; ".join(settings) + ".", ""]
    if len(spec.matrix) == 2:
        lines += pivot_tables(spec, grid_rows)
    return lines


def _table_row(row: dict, shown: list[str]) -> str:
    """A variant's line of its grid's table: the `shown` figures, the rows it generated, and its seeds."""
    counts = sorted(set(row["generated_rows"]) - {None})  # seeds may draw other splits, so other counts
    generated = "—" if not counts else str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    figures = [_cell_text(row[figure], len(row["seeds_done"])) for figure in shown]
    return f"| {row['variant']} | " + " | ".join(figures) + f" | {generated} | {_seeds_cell(row)} |"


def _seeds_cell(row: dict) -> str:
    """The seeds a row finished († where read from a record), those missing, and how many code versions ran them."""
    seeds = seeds_text(row["seeds_done"], row["seeds_recorded"])
    seeds += f" (missing {row['seeds_missing']})" if row["seeds_missing"] else ""
    versions = {_version_text(cell) for cell in row["cells"]}
    return seeds + (f" (at {len(versions)} code versions)" if len(versions) > 1 else "")  # its mean mixes them


def _code_versions_text(rows: list[dict]) -> str:
    """Which code the grid's cells ran: a cell's name fixes the params it overrides, not the code or the rest of
    params.yaml, so cells trained at other commits are read as they are and said to be."""
    versions = Counter(_version_text(cell) for row in rows for cell in row["cells"])
    if not versions:
        return "No cell of this grid has finished yet."
    listed = ", ".join(f"`{version}` ({count})" for version, count in sorted(versions.items()))
    return (f"Code versions its cells ran (cells): {listed}. A cell's name fixes only the params it sets; "
            "`tqc ablate --rerun` trains a row again at this commit.")


def _version_text(cell: dict) -> str:
    """The commit a cell of a report row ran, as the report shows it."""
    return cell.get("code_version") or "not recorded"


def _pivot_text(row: dict) -> str:
    figure = row["admc_macro_f1"]
    return f"{_cell_text(figure)} ({len(figure['values'])})"


def pivot_tables(spec: AblationGrid, rows: list[dict]) -> list[str]:
    """A two-axis matrix as the paper lays it out: first axis down, second across, ADMC macro-F1 in the cells."""
    (down, down_values), (across, across_values) = spec.matrix.items()
    lines = []
    for variant in spec.variants:
        cells = {(_key(r["settings"].get(down)), _key(r["settings"].get(across))): r for r in rows
                 if label_parts(r["variant"])[0] == variant}
        lines += [f"ADMC test macro-F1 ({variant}; seeds per cell in brackets):", "",
                  f"| {_short(down)} \\ {_short(across)} | " + " | ".join(map(str, across_values)) + " |",
                  "|---" * (len(across_values) + 1) + "|"]
        for value in down_values:
            texts = []
            for other in across_values:
                row = cells.get((_key(value), _key(other)))
                texts.append(_pivot_text(row) if row and row["seeds_done"] else "—")
            lines.append(f"| {value} | " + " | ".join(texts) + " |")
        lines.append("")
    return lines


def _key(value) -> str:
    """A matrix value as a dict key: a list axis (augment.implicit: [[], [dropout]]) is not hashable."""
    return json.dumps(value, sort_keys=True)


def plot(rows: list[dict], grids: list[str], path: Path) -> None:
    """One panel per grid: macro-F1 (mean ± std over seeds) of ADMC and AC per variant."""
    from matplotlib.figure import Figure  # not pyplot: no global backend switched, no figure left open

    figure = Figure(figsize=(10, 3.2 * len(grids)))
    axes = figure.subplots(len(grids), 1, squeeze=False)
    for axis, grid in zip(axes[:, 0], grids):
        members = [r for r in rows if r["grid"] == grid and r["admc_macro_f1"]["mean"] is not None]
        axis.set_title(grid)
        if not members:  # say so, rather than draw empty axes with a legend of nothing
            axis.text(0.5, 0.5, "no finished cells", ha="center", va="center", transform=axis.transAxes)
            axis.set_axis_off()
            continue
        positions = np.arange(len(members))
        for offset, (figure_name, label) in enumerate((("ac_macro_f1", "AC"), ("admc_macro_f1", "ADMC"))):
            means = [100 * r[figure_name]["mean"] for r in members]
            stds = [100 * (r[figure_name]["std"] or 0.0) for r in members]  # one seed: no error bar
            axis.bar(positions + (offset - 0.5) * 0.4, means, 0.4, yerr=stds, capsize=3, label=label)
        axis.set_xticks(positions, [r["variant"] for r in members], rotation=20, ha="right", fontsize=8)
        axis.set_ylabel("test macro-F1 (%)")
        low = min(100 * min(r["ac_macro_f1"]["mean"], r["admc_macro_f1"]["mean"]) for r in members)
        axis.set_ylim(max(0.0, low - 10), 100)
        axis.legend(fontsize=8)
    figure.tight_layout()
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=110)
