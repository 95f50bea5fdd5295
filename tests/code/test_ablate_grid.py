"""tqc ablate without running anything: cells, names, -S arguments, and the table."""

from __future__ import annotations

import pytest

import json
from pathlib import Path
from types import SimpleNamespace

from tqc.ablate import (Cell, CellResult, _or_recorded, experiment_overrides, grid_cells, matches, paired_difference,
                        paired_differences, recorded_cells, render_markdown, set_arguments, summarise)
from tqc.config import AblationGrid, ConfigError, Params, read_yaml

GRID = AblationGrid(title="Options on long tails", base={"data.dataset": "trec6"},
                    variants={"none": {"augment.rebalance": "none"}, "eda": {"augment.rebalance": "mean", "augment.explicit": "eda"}},
                    matrix={"data.imbalance_ratio": [50, 10]})


def test_cells_are_variants_times_matrix_times_seeds_with_later_overrides_winning():
    cells = grid_cells("aug", GRID, [0, 1], {"stage_one.epochs": 2, "augment.rebalance": "max"}, {"data.data_dir": "/x"})
    assert len(cells) == 2 * 2 * 2
    eda = [c for c in cells if c.variant == "eda · ir=10" and c.seed == 1][0]
    assert eda.overrides == {"stage_one.epochs": 2, "augment.rebalance": "mean", "data.dataset": "trec6",
                             "augment.explicit": "eda", "data.imbalance_ratio": 10, "seed": 1}


def test_a_grid_budget_overrides_the_common_budget_and_names_new_cells():
    longer = GRID.model_copy(update={"budget": {"stage_one.epochs": 5}})
    common = {"stage_one.epochs": 2, "stage_two.epochs": 1}
    cells = grid_cells("aug", longer, [0], common, {})
    assert all(c.overrides["stage_one.epochs"] == 5 and c.overrides["stage_two.epochs"] == 1 for c in cells)
    assert {c.name for c in cells}.isdisjoint(c.name for c in grid_cells("aug", GRID, [0], common, {}))
    params = Params.model_validate({"ablate": {"grids": {"aug": longer.model_dump()}}})
    assert "this grid's budget: `stage_one.epochs=5`" in render_markdown(params, ["aug"], [])


def test_names_share_one_hash_over_seeds_ignore_local_paths_and_change_with_params():
    cells = grid_cells("aug", GRID, [0, 1], {}, {"data.data_dir": "/here"})
    elsewhere = grid_cells("aug", GRID, [0, 1], {}, {"data.data_dir": "/there"})
    assert [c.name for c in cells] == [c.name for c in elsewhere]
    assert cells[0].name.rsplit("-", 1)[0] == cells[1].name.rsplit("-", 1)[0] and cells[0].name.endswith("-s0")
    longer = grid_cells("aug", GRID, [0, 1], {"stage_one.epochs": 9}, {})
    assert longer[0].name != cells[0].name
    assert all(part.replace("-", "").isalnum() for part in [c.name for c in cells])  # a valid git ref component
    assert Cell("g", "v", 0, {"a.b": 1, "c.d": 2}).name == Cell("g", "v", 0, {"c.d": 2, "a.b": 1}).name  # key order aside


def test_set_arguments_are_override_values_that_add_missing_keys():
    assert set_arguments({"augment.implicit": [], "baseline_nc.enabled": False, "data.imbalance_ratio": 50,
                          "augment.seq2seq.paraphrase_model": "/m/t5"}) == [
        "-S", "++augment.implicit=[]", "-S", "++baseline_nc.enabled=false", "-S", "++data.imbalance_ratio=50",
        "-S", "++augment.seq2seq.paraphrase_model='/m/t5'"]


def test_a_cells_own_data_dir_wins_over_this_machines_and_holds_in_dvcs_copy(tmp_path):
    local = {"data.data_dir": "/work/datasets", "tracking.uri": "sqlite:////work/p/mlflow.db"}
    own_data = Cell("g", "v", 0, {"data.dataset": "custom", "data.data_dir": "mine/raw", "seed": 0}, local)
    assert experiment_overrides(own_data, tmp_path) == {"data.data_dir": str((tmp_path / "mine" / "raw").resolve()),
                                                        "tracking.uri": "sqlite:////work/p/mlflow.db",
                                                        "data.dataset": "custom", "seed": 0}
    absolute = Cell("g", "v", 0, {"data.data_dir": "/data/x", "tracking.uri": "http://mlflow:5000"}, local)
    assert experiment_overrides(absolute, tmp_path) == {"data.data_dir": "/data/x", "tracking.uri": "http://mlflow:5000"}
    assert experiment_overrides(Cell("g", "v", 0, {"seed": 1}, local), tmp_path) == {**local, "seed": 1}


@pytest.mark.parametrize("text", ["/home/josé/a,b/(copy) #1 [x] {y}", "it's", "1e3", "C:\\data\\", "a=b", "",
                                  "/data/${USER}/q", "C:\\${x}", "it's ${a.b} and ${c}"])  # ${…}: OmegaConf's interpolation
def test_strings_reach_params_yaml_unchanged_through_dvc_overrides(tmp_path, text):
    # dvc exp run -S parses Hydra's grammar: bare, a comma is a sweep, \x an escape, 1e3 a float
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    path.write_text("data: {data_dir: x}\n")
    apply_overrides(str(path), set_arguments({"data.data_dir": text, "augment.implicit": [text, "cutoff"]})[1::2])
    written = read_yaml(path.read_text())
    assert written["data"]["data_dir"] == text and written["augment"]["implicit"] == [text, "cutoff"]


def test_the_table_gives_mean_and_std_over_finished_seeds_and_names_missing_ones():
    def result(variant, seed, f1, status="done"):
        cell = Cell("aug", variant, seed, {"seed": seed})
        figures = {"admc_accuracy": 0.9, "admc_macro_f1": f1, "ac_accuracy": 0.8, "ac_macro_f1": f1 - 0.1,
                   "nc_accuracy": 0.7 if variant == "none" and seed == 0 else None,  # NC trained in one cell only
                   "nc_macro_f1": 0.6 if variant == "none" and seed == 0 else None, "admc_validation_macro_f1": 0.5}
        return CellResult(cell, status, figures if status == "done" else {}, 10 if status == "done" else None)

    rows = summarise([result("none", 0, 0.5), result("none", 1, 0.7), result("eda", 0, 0.8), result("eda", 1, 0, "missing")])
    none = rows[0]
    assert none["admc_macro_f1"]["mean"] == pytest.approx(0.6) and none["admc_macro_f1"]["std"] == pytest.approx(0.1 * 2 ** 0.5)  # sample std
    assert rows[1]["seeds_missing"] == [1]
    params = Params.model_validate({"ablate": {"grids": {"aug": GRID.model_dump()}}})
    table = render_markdown(params, ["aug"], rows)
    assert none["nc_accuracy"]["values"] == [0.7] and rows[1]["nc_accuracy"]["mean"] is None
    assert "| variant | ADMC accuracy | ADMC macro-F1 | AC accuracy | AC macro-F1 | NC accuracy | NC macro-F1 |" in table
    # NC's figures are over one of the row's two seeds, and say so
    assert ("| none | 90.00 ± 0.00 | 60.00 ± 14.14 | 80.00 ± 0.00 | 50.00 ± 14.14 | 70.00 (n = 1) | 60.00 (n = 1) | 50.00 ± 0.00 "
            "| 10 | 0, 1 |") in table
    assert "A figure marked (n = k) is over k of its row's seeds" in table
    assert "Code versions its cells ran (cells): `not recorded` (3)." in table
    assert "(missing [1])" in table
    without_nc = render_markdown(params, ["aug"], summarise([result("eda", 0, 0.8)]))
    assert "NC accuracy" not in without_nc and "| eda | 90.00 | 80.00 | 80.00 | 70.00 | 50.00 | 10 | 0 |" in without_nc
    assert "| eda | 90.00 | 80.00 | 80.00 | 70.00 | — | — | 50.00 | 10 | 0 (missing [1]) |" in table  # one seed: no ± 0.00
    assert ('Variants: `none`: `augment.rebalance="none"`; `eda`: `augment.rebalance="mean"`, `augment.explicit="eda"`.'
            in table)  # what each variant sets


def test_a_two_axis_matrix_is_also_laid_out_as_the_paper_does():
    grid = AblationGrid(title="Loss × distance", base={"data.dataset": "trec50"},
                        matrix={"stage_two.loss": ["nt_xent", "bpr"], "model.similarity": ["cosine", "mlp"]})
    cells = grid_cells("ld", grid, [0, 1], {}, {})
    f1 = {("nt_xent", "cosine", 0): 0.80, ("nt_xent", "cosine", 1): 0.82, ("bpr", "mlp", 0): 0.70}
    results = []
    for cell in cells:
        key = (cell.overrides["stage_two.loss"], cell.overrides["model.similarity"], cell.seed)
        figures = {name: f1.get(key, 0.0) for name in ("admc_accuracy", "admc_macro_f1", "ac_accuracy", "ac_macro_f1",
                                                       "admc_validation_macro_f1")}
        results.append(CellResult(cell, "done" if key in f1 else "missing", figures if key in f1 else {}))
    params = Params.model_validate({"ablate": {"grids": {"ld": grid.model_dump()}}})
    table = render_markdown(params, ["ld"], summarise(results))
    assert "| loss \\ similarity | cosine | mlp |" in table
    assert "| nt_xent | 81.00 ± 1.41 (2) | — |" in table  # mean ± sample std, and how many seeds
    assert "| bpr | — | 70.00 (1) |" in table  # one seed: no spread to show


def test_generated_rows_that_differ_between_seeds_show_as_a_range():
    figures = {"admc_accuracy": 0.9, "admc_macro_f1": 0.8, "ac_accuracy": 0.8, "ac_macro_f1": 0.7, "admc_validation_macro_f1": 0.5}
    rows = summarise([CellResult(Cell("aug", "eda", seed, {"seed": seed}), "done", figures, count)
                      for seed, count in ((0, 952), (1, 940), (2, 952))])
    params = Params.model_validate({"ablate": {"grids": {"aug": GRID.model_dump()}}})
    assert "| 50.00 ± 0.00 | 940–952 | 0, 1, 2 |" in render_markdown(params, ["aug"], rows)


def test_grid_keys_must_be_real_params():
    with pytest.raises(ValueError, match="augment.rebalanse"):
        Params.model_validate({"ablate": {"grids": {"x": {"title": "t", "variants": {"a": {"augment.rebalanse": "mean"}}}}}})


def test_where_narrows_the_cells_that_set_the_path_and_keeps_the_others():
    imbalanced = grid_cells("aug", GRID, [0], {}, {})
    trec50 = grid_cells("t5", AblationGrid(title="AC vs ADMC", variants={"trec50": {"data.dataset": "trec50"}}), [0], {}, {})
    kept = [c.variant for c in imbalanced + trec50 if matches(c, {"data.imbalance_ratio": 50})]
    assert kept == ["none · ir=50", "eda · ir=50", "trec50"]
    assert [c.variant for c in imbalanced if matches(c, {"data.imbalance_ratio": 50, "augment.rebalance": "mean"})] == ["eda · ir=50"]


def _figures(f1: float, nc: float | None = None) -> dict:
    return {"admc_accuracy": 0.9, "admc_macro_f1": f1, "ac_accuracy": 0.8, "ac_macro_f1": f1 - 0.1,
            "nc_accuracy": nc, "nc_macro_f1": nc, "admc_validation_macro_f1": 0.5}


def test_a_cell_recorded_by_the_replaced_report_is_read_back_seed_by_seed_and_marked(tmp_path):
    cells = grid_cells("aug", GRID, [0, 1], {}, {})
    none_50 = [c for c in cells if c.variant == "none · ir=50"]
    earlier = summarise([CellResult(none_50[0], "done", _figures(0.5, nc=0.7), 10, "abc"),
                         CellResult(none_50[1], "done", _figures(0.7), 12, "def")])
    (tmp_path / "ablations.json").write_text(json.dumps({"rows": earlier}))

    recorded = recorded_cells(tmp_path / "ablations.json")
    assert set(recorded) == {c.name for c in none_50}
    assert recorded[none_50[0].name].figures["nc_accuracy"] == 0.7 and recorded[none_50[1].name].figures["nc_accuracy"] is None
    # An experiment here wins over the record; a cell in neither stays missing.
    here = _or_recorded(CellResult(none_50[0], "done", _figures(0.6), 10), recorded)
    results = [here, _or_recorded(CellResult(none_50[1], "missing"), recorded),
               _or_recorded(CellResult(cells[-1], "missing"), recorded)]
    assert [r.status for r in results] == ["done", "recorded", "missing"]
    assert results[1].generated_rows == 12 and results[1].experiment_rev == "def"
    row = summarise(results)[0]
    assert row["seeds_done"] == [0, 1] and row["seeds_recorded"] == [1]
    assert row["admc_macro_f1"]["values"] == [0.6, 0.7]
    params = Params.model_validate({"ablate": {"grids": {"aug": GRID.model_dump()}}})
    table = render_markdown(params, ["aug"], summarise(results))
    assert "| 0, 1† |" in table and "Seeds marked † were read from the report this one replaced" in table
    assert "†" not in render_markdown(params, ["aug"], summarise([here]))


def test_a_report_from_before_per_cell_records_is_read_back_where_its_values_pair_with_seeds(tmp_path):
    def old_row(variant, values_by_figure):  # the format before `cells`: values in `experiments` order, None left out
        row = {"grid": "aug", "variant": variant, "seeds_done": [0, 1], "experiments": [f"abl-{variant}-s0", f"abl-{variant}-s1"],
               "generated_rows": [5, 5]}
        for name in _figures(0.0):
            values = values_by_figure.get(name, [0.9, 0.8])
            row[name] = {"mean": None, "std": None, "values": values}
        return row

    rows = [old_row("paired", {"nc_accuracy": [], "nc_macro_f1": []}), old_row("ambiguous", {"nc_accuracy": [0.7]})]
    (tmp_path / "ablations.json").write_text(json.dumps({"rows": rows}))
    recorded = recorded_cells(tmp_path / "ablations.json")
    assert set(recorded) == {"abl-paired-s0", "abl-paired-s1"}  # NC trained in one seed of two: which one is unknown
    assert recorded["abl-paired-s1"].figures["admc_macro_f1"] == 0.8 and recorded["abl-paired-s1"].figures["nc_accuracy"] is None
    assert recorded["abl-paired-s1"].cell.seed == 1 and recorded_cells(tmp_path / "none.json") == {}


def test_a_narrowed_or_failed_run_keeps_every_earlier_record_in_the_json(tmp_path, monkeypatch):
    import subprocess

    from tqc import ablate as ablate_module

    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    params = Params.model_validate({"ablate": {"seeds": [0], "budget": {}, "grids": {"aug": GRID.model_dump()}},
                                    "data": {"data_dir": str(tmp_path)}, "tracking": {"enabled": False}})
    cells = {c.variant: c for c in grid_cells("aug", GRID, [0], {}, {})}
    earlier = summarise([CellResult(cells["none · ir=50"], "done", _figures(0.5), 0, "r1"),
                         CellResult(cells["eda · ir=50"], "done", _figures(0.7), 9, "r2")])
    out = tmp_path / "reports"
    out.mkdir()
    (out / "ablations.json").write_text(json.dumps({"rows": earlier}))

    narrowed = ablate_module.ablate(params, project, out, variants=["none"], where={"data.imbalance_ratio": 50}, run=False)
    assert [r.status for r in narrowed] == ["recorded"]
    report = json.loads((out / "ablations.json").read_text())
    assert [row["variant"] for row in report["rows"]] == ["none · ir=50"]
    assert [c["experiment"] for c in report["other_cells"]] == [cells["eda · ir=50"].name]  # not in the table, not lost

    # training on, without --rerun: a recorded cell is read back, not trained again
    monkeypatch.setattr(ablate_module, "run_cell", lambda *_, **__: pytest.fail("a recorded cell was trained again"))
    trained = ablate_module.ablate(params, project, out, variants=["none"], where={"data.imbalance_ratio": 50})
    assert [r.status for r in trained] == ["recorded"]

    # --rerun asks for training here: a failed run shows as missing, not as the old figures, and its record stays.
    monkeypatch.setattr(ablate_module, "run_cell", lambda cell, project, force=False: False)
    rerun = ablate_module.ablate(params, project, out, variants=["none"], where={"data.imbalance_ratio": 50}, rerun=True)
    assert [r.status for r in rerun] == ["missing"]
    whole = ablate_module.ablate(params, project, out, where={"data.imbalance_ratio": 50}, run=False)
    assert {r.cell.variant: r.status for r in whole} == {"none · ir=50": "recorded", "eda · ir=50": "recorded"}
    assert [r.figures["admc_macro_f1"] for r in whole] == [0.5, 0.7]


def test_cells_are_read_before_their_class_prior_shift():
    from tqc.ablate import FIGURES, dig, without_prior_shift

    def figures(accuracy: float) -> dict:
        return {"accuracy": accuracy, "macro_f1": accuracy - 0.1, "macro_f1_gold_classes": accuracy}

    metrics = {"test": figures(0.9), "validation": figures(0.8), "stage_one": {"test": figures(0.85), "validation": figures(0.8)},
               "nc": None, "prior_shift": {"admc": {"weight": 0.5, "test_unshifted": figures(0.7), "validation_unshifted": figures(0.6)},
                                           "stage_one": {"weight": 0.0, "test_unshifted": figures(0.85),
                                                         "validation_unshifted": figures(0.8)}}}
    read = {name: dig(without_prior_shift(metrics), keys) for name, (_, keys) in FIGURES.items()}
    assert read["admc_accuracy"] == 0.7 and read["admc_validation_macro_f1"] == pytest.approx(0.5)
    assert read["ac_accuracy"] == 0.85 and read["nc_accuracy"] is None
    assert without_prior_shift({"test": figures(0.9)})["test"]["accuracy"] == 0.9  # a cell from before the prior stage


def test_a_variant_that_sets_the_prior_shift_is_read_after_it(monkeypatch):
    from tqc import ablate as ablate_module

    def figures(accuracy: float) -> dict:
        return {"accuracy": accuracy, "macro_f1": accuracy - 0.1}

    metrics = {"test": figures(0.9), "validation": figures(0.8), "stage_one": {"test": figures(0.85), "validation": figures(0.8)},
               "nc": None, "prior_shift": {"admc": {"weight": -0.5, "test_unshifted": figures(0.7), "validation_unshifted": figures(0.6)}},
               "run": {"code_version": "4004902ed30875873001dc387f3b1245b3828602", "params": {}}}
    shown = {"reports/metrics.json": json.dumps(metrics), "reports/augment.json": json.dumps({"rows": {"generated": 0}})}
    monkeypatch.setattr(ablate_module, "_git", lambda project, *arguments: shown.get(arguments[-1].split(":")[-1], "abc123\n"))
    # The grid's common params set the shift too: that does not make every cell about it, only the variant's own do.
    grid = AblationGrid(title="t", base={"data.imbalance_ratio": 50, "prior.weights": [0.0, -1.0]},
                        variants={"none": {}, "logit-adjusted": {"prior.target": "uniform"}})
    cells = {c.variant: c for c in grid_cells("rebalancing", grid, [0], {}, {})}
    assert not cells["none"].about_prior_shift and cells["logit-adjusted"].about_prior_shift
    refs = {c.name: f"refs/exps/ab/cd/{c.name}" for c in cells.values()}

    plain, adjusted = (ablate_module.read_cell(cells[v], None, refs) for v in ("none", "logit-adjusted"))
    assert plain.figures["admc_accuracy"] == 0.7  # the training variant: before its shift
    assert adjusted.figures["admc_accuracy"] == 0.9 and adjusted.figures["ac_accuracy"] == 0.85  # the shift's variant: after
    assert plain.code_version == adjusted.code_version == "4004902ed3"  # the commit evaluate recorded (metrics.json's run)


def test_a_rerun_forces_dvc_and_a_failed_cell_is_not_read_from_its_old_experiment(monkeypatch, tmp_path):
    from tqc import ablate as ablate_module

    params = Params.model_validate({"ablate": {"grids": {"aug": GRID.model_dump()}, "seeds": [0]},
                                    "data": {"data_dir": str(tmp_path)}, "tracking": {"enabled": False}})
    commands = []
    # ablate's own name for the module, not subprocess.run itself: another thread's call in this process stays out
    failing_run = SimpleNamespace(run=lambda command, **_: commands.append(command) or SimpleNamespace(returncode=1))
    monkeypatch.setattr(ablate_module, "subprocess", failing_run)
    monkeypatch.setattr(ablate_module, "experiment_refs", lambda project: {c.name: "refs/exps/ab/cd/" + c.name
                                                                           for c in grid_cells("aug", GRID, [0], {}, {})})
    monkeypatch.setattr(ablate_module, "read_cell", lambda cell, project, refs: CellResult(cell, "done", _figures(0.9), 0, "old"))
    results = ablate_module.ablate(params, tmp_path, tmp_path, variants=["none"], where={"data.imbalance_ratio": 50}, rerun=True)
    assert "-f" in commands[0] and commands[0].index("-f") < commands[0].index("-n")
    assert [r.status for r in results] == ["missing"]  # not the old experiment's figures


def test_an_unknown_variant_is_refused(tmp_path):
    from tqc import ablate as ablate_module

    params = Params.model_validate({"ablate": {"grids": {"aug": GRID.model_dump()}}, "tracking": {"enabled": False}})
    with pytest.raises(ValueError, match="unknown variant.*oversampel"):
        ablate_module.ablate(params, tmp_path, tmp_path, variants=["oversampel"], run=False)


def test_a_misspelt_where_key_or_a_selection_of_no_cell_is_refused_before_the_report_is_written(tmp_path, monkeypatch):
    from tqc import ablate as ablate_module

    monkeypatch.setattr(ablate_module, "experiment_refs", lambda project: {})

    params = Params.model_validate({"ablate": {"grids": {"aug": GRID.model_dump()}}, "tracking": {"enabled": False}})
    with pytest.raises(ConfigError, match="--where augment.rebalanse: no such param"):
        ablate_module.ablate(params, tmp_path, tmp_path, where={"augment.rebalanse": "mean"}, run=False)
    with pytest.raises(ConfigError, match="no cell of grid"):
        ablate_module.ablate(params, tmp_path, tmp_path, where={"data.imbalance_ratio": 7}, run=False)
    assert not (tmp_path / "ablations.md").exists()
    # a real param that no cell sets narrows nothing, as documented: every cell stays
    kept = ablate_module.ablate(params, tmp_path, tmp_path, where={"stage_two.loss": "bpr"}, run=False)
    assert len(kept) == len(grid_cells("aug", GRID, params.ablate.seeds, {}, {}))


def test_a_matrix_axis_of_lists_pivots(tmp_path):
    grid = AblationGrid(title="t", matrix={"augment.implicit": [[], ["dropout"]], "data.imbalance_ratio": [50, 10]})
    cells = grid_cells("g", grid, [0], {}, {})
    params = Params.model_validate({"ablate": {"grids": {"g": grid.model_dump()}}})
    text = render_markdown(params, ["g"], summarise([CellResult(c, "done", _figures(0.5), 1) for c in cells]))
    assert "| ['dropout'] | 50.00 (1) | 50.00 (1) |" in text


def test_a_name_run_under_several_baselines_reads_the_one_under_head_else_the_newest(tmp_path):
    import subprocess

    from tqc.ablate import experiment_refs

    def git(*arguments, date="2026-01-01T00:00:00"):
        env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
        return subprocess.run(["git", *arguments], cwd=tmp_path, check=True, capture_output=True, text=True, env=env).stdout.strip()

    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "old")
    old_base = git("rev-parse", "HEAD")
    git("commit", "-q", "--allow-empty", "-m", "head", date="2026-02-01T00:00:00")
    head = git("rev-parse", "HEAD")
    tree = git("rev-parse", "HEAD^{tree}")
    experiment = {day: git("commit-tree", tree, "-m", day, date=f"2026-03-{day}T00:00:00") for day in ("01", "02", "03")}

    def ref(base, name):
        return f"refs/exps/{base[:2]}/{base[2:]}/{name}"

    # fake baselines that sort first and last, so the refs' order by name decides nothing
    first, last = "0" * 40, "f" * 40
    git("update-ref", ref(last, "cell"), experiment["03"])  # newer, but not under HEAD
    git("update-ref", ref(head, "cell"), experiment["01"])
    git("update-ref", ref(first, "elsewhere"), experiment["02"])
    git("update-ref", ref(old_base, "elsewhere"), experiment["01"])
    refs = experiment_refs(tmp_path)
    assert refs["cell"] == ref(head, "cell") and refs["elsewhere"] == ref(first, "elsewhere")


def test_a_grid_without_finished_cells_gets_a_panel_that_says_so(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from tqc.ablate import plot

    drawn, savefig = [], Figure.savefig

    def saved(figure, *args, **kwargs):
        drawn.append(figure)
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", saved)
    figure = {"mean": 0.9, "std": 0.01, "values": [0.9, 0.91]}
    rows = [{"grid": "done", "variant": "none", "admc_macro_f1": figure, "ac_macro_f1": figure}]
    plot(rows, ["done", "empty"], tmp_path / "ablations.png")
    done, empty = drawn[0].axes
    assert len(done.patches) == 2 and done.get_legend() is not None  # AC and ADMC bars
    assert [t.get_text() for t in empty.texts] == ["no finished cells"] and not empty.patches
    assert (tmp_path / "ablations.png").stat().st_size > 0


def test_report_only_marks_cells_that_never_ran_and_exits_0_while_a_run_that_fails_cells_exits_1(tmp_path, monkeypatch, capsys):
    import subprocess

    import yaml

    from tqc import ablate as ablate_module
    from tqc.cli import main

    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    raw = {"ablate": {"seeds": [0], "budget": {}, "grids": {"aug": GRID.model_dump()}},
           "data": {"data_dir": str(tmp_path)}, "tracking": {"enabled": False}}
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    (project / "data" / "raw").mkdir(parents=True)  # data.additions, as git holds it
    monkeypatch.chdir(project)

    assert main(["ablate", "--report-only", "--out", "reports"]) == 0  # nothing has run: a table of missing cells
    err = capsys.readouterr().err
    assert "4 cell(s) have no experiment here and no record in reports/ablations.json: marked missing" in err
    report = (project / "reports" / "ablations.md").read_text()
    assert "(missing [0])" in report and "No cell of this grid has finished yet." in report  # not "(cells): ."


    monkeypatch.setattr(ablate_module, "run_cell", lambda cell, project, force=False: False)  # training fails
    with pytest.raises(SystemExit) as exited:
        main(["ablate", "--out", "reports"])
    assert exited.value.code == 1
    assert "4 cell(s) without a finished experiment" in capsys.readouterr().err

    # --variant alone: a grid it leaves no cell of gets no empty table
    raw["ablate"]["grids"]["other"] = AblationGrid(title="Another grid", variants={"sqrt": {"augment.rebalance": "sqrt"}}).model_dump()
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    assert main(["ablate", "--report-only", "--variant", "none", "--out", "reports"]) == 0
    capsys.readouterr()
    report = (project / "reports" / "ablations.md").read_text()
    assert "## Options on long tails" in report and "Another grid" not in report
    (project / "file").write_text("")
    assert main(["ablate", "--out", "file"]) == 2  # said before any cell trains, not when the report is written
    assert "--out file: a file; ablate writes its report into a folder" in capsys.readouterr().err
    # under a file: every cell trained, then "[Errno 20] Not a directory" naming no option
    monkeypatch.setattr(ablate_module, "run_cell", lambda *a, **k: pytest.fail("a cell ran before --out was checked"))
    assert main(["ablate", "--out", "file/sub"]) == 2
    assert f"--out file/sub: {project / 'file'} is a file, so nothing can be written under it" in capsys.readouterr().err
    # a data_dir that is not there: each cell's dvc exp run stopped at ingest, naming the path alone
    (project / "params.yaml").write_text(yaml.safe_dump({**raw, "data": {"data_dir": str(tmp_path / "none")}}))
    assert main(["ablate", "--out", "reports"]) == 2
    assert f"data.data_dir '{tmp_path / 'none'}': no folder" in capsys.readouterr().err
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    # a report cut short, or not this command's: one line naming it, not a JSONDecodeError or KeyError traceback
    for damaged, said in (("", "Expecting value"), ("{}", "no 'rows'"), ("[1, 2]", "list indices must be integers")):
        (project / "reports" / "ablations.json").write_text(damaged)
        assert main(["ablate", "--report-only", "--out", "reports"]) == 2
        assert (f"reports/ablations.json: not a report tqc ablate wrote ({said}" in capsys.readouterr().err)
    assert main(["ablate", "--report-only", "--rerun", "--out", "reports"]) == 2
    assert "--rerun with --report-only" in capsys.readouterr().err


def test_a_cells_stages_import_dvcs_copy_of_the_code_not_the_live_checkout(tmp_path):
    import subprocess
    import sys

    from tqc.ablate import cell_environment

    copy = tmp_path / "copy"  # as DVC's --temp copy of the project: a stage runs with it as working directory
    (copy / "src" / "tqc").mkdir(parents=True)
    (copy / "src" / "tqc" / "__init__.py").write_text("SNAPSHOT = True\n")
    imported = subprocess.run([sys.executable, "-c", "import tqc; print(tqc.__file__, tqc.SNAPSHOT)"], cwd=copy,
                              env=cell_environment(), capture_output=True, text=True, check=True).stdout.split()
    assert imported == [str(copy / "src" / "tqc" / "__init__.py"), "True"]


def test_a_paired_difference_is_over_the_seeds_both_finished_with_a_t_interval():
    from scipy import stats

    variant = {0: 0.95, 1: 0.93, 2: 0.96, 3: 0.90}
    reference = {0: 0.94, 1: 0.94, 2: 0.93, 5: 0.99}  # seed 3 and seed 5 have no partner
    found = paired_difference(variant, reference)
    differences = [0.01, -0.01, 0.03]
    low, high = stats.ttest_rel([0.95, 0.93, 0.96], [0.94, 0.94, 0.93]).confidence_interval(0.95)
    assert found["seeds"] == [0, 1, 2] and found["higher_in"] == 2
    assert found["mean"] == pytest.approx(sum(differences) / 3)
    assert found["ci95"] == pytest.approx([low, high])
    assert paired_difference({0: 0.9}, {0: 0.8})["ci95"] is None  # one pair has no spread
    assert paired_difference({0: 0.9}, {1: 0.8}) is None


def test_the_report_pairs_each_variant_with_the_first_at_the_same_matrix_point():
    figures = lambda f1: {"admc_accuracy": 0.9, "admc_macro_f1": f1, "ac_accuracy": 0.8, "ac_macro_f1": f1,
                          "admc_validation_macro_f1": 0.5}
    f1 = {("none", 50): [0.90, 0.92, 0.91], ("eda", 50): [0.92, 0.93, 0.94], ("none", 10): [0.95, 0.95, 0.95],
          ("eda", 10): [0.94, 0.96, 0.95]}
    results = [CellResult(cell, "done", figures(f1[(cell.variant_name, cell.overrides["data.imbalance_ratio"])][cell.seed]), 10,
                          code_version="abc")
               for cell in grid_cells("aug", GRID, [0, 1, 2], {}, {})]
    unpaired = Params.model_validate({"ablate": {"grids": {"aug": GRID.model_dump()}}})
    assert "paired by seed" not in render_markdown(unpaired, ["aug"], summarise(results))  # no reference named
    params = Params.model_validate({"ablate": {"grids": {"aug": {**GRID.model_dump(), "reference": "none"}}}})
    table = render_markdown(params, ["aug"], summarise(results))
    assert "ADMC test macro-F1 minus `none`'s at the same matrix point, paired by seed" in table
    assert "| eda · ir=50 | none · ir=50 | +2.00 | [-0.48, +4.48] | 3 of 3 |" in table  # 2, 1, 3 points: t(2) = 4.30
    assert "| eda · ir=10 | none · ir=10 | +0.00 | [-2.48, +2.48] | 1 of 3 |" in table
    paired = table.split("paired by seed")[1].split("Code versions")[0]
    assert not any(line.startswith("| none ·") for line in paired.splitlines())  # the reference has no row of its own
    # a selection that leaves the reference out (--variant eda) says why the paired table is missing
    selected = render_markdown(params, ["aug"], summarise([r for r in results if r.cell.variant_name == "eda"]))
    assert "paired by seed" not in selected
    assert "No paired differences: `none`, the variant the others are measured against, has no finished cell" in selected


def test_a_pair_of_cells_of_different_code_is_said_to_be_across_code_versions():
    """A recorded cell (code not recorded) paired with one trained at a commit: the difference holds the code change."""
    figures = lambda f1: {"admc_accuracy": 0.9, "admc_macro_f1": f1, "ac_accuracy": 0.8, "ac_macro_f1": f1,
                          "admc_validation_macro_f1": 0.5}
    version = {(0, "none"): "abc", (0, "eda"): "abc", (1, "none"): None, (1, "eda"): "abc", (2, "none"): "abc",
               (2, "eda"): "def"}
    results = [CellResult(cell, "done", figures(0.9 + cell.seed / 100), 10,
                          code_version=version[(cell.seed, cell.variant_name)])
               for cell in grid_cells("aug", GRID, [0, 1, 2], {}, {}) if cell.overrides["data.imbalance_ratio"] == 50]
    params = Params.model_validate({"ablate": {"grids": {"aug": {**GRID.model_dump(), "reference": "none"}}}})
    rows = summarise(results)
    assert [d["across_code_versions"] for d in paired_differences(params, "aug", rows)] == [2]  # seeds 1 and 2
    unknown = [CellResult(result.cell, "recorded", result.figures, 10, code_version=None) for result in results]
    assert [d["across_code_versions"] for d in paired_differences(params, "aug", summarise(unknown))] == [3]  # both unknown
    table = render_markdown(params, ["aug"], rows)
    assert "| eda · ir=50 | none · ir=50 | +0.00 | [+0.00, +0.00] | 0 of 3; 2 across or without code versions |" in table
    # each row says where its seeds ran at more than one code version, since its mean mixes them
    lines = {line.split(" | ")[0]: line for line in table.split("paired by seed")[0].splitlines() if line.startswith("| ")}
    assert lines["| none · ir=50"].endswith("| 0, 1, 2 (at 2 code versions) |")
    assert lines["| eda · ir=50"].endswith("| 0, 1, 2 (at 2 code versions) |")


def test_a_grids_reference_must_be_one_of_its_variants():
    with pytest.raises(ValueError, match="reference 'nnone' is not one of the grid's variants"):
        Params.model_validate({"ablate": {"grids": {"aug": {**GRID.model_dump(), "reference": "nnone"}}}})


def test_runs_of_seeds_print_as_ranges_and_recorded_seeds_keep_their_mark():
    from tqc.ablate import seeds_text

    assert seeds_text(list(range(40)), []) == "0–39"
    assert seeds_text([0, 1, 2], []) == "0, 1, 2"
    assert seeds_text([0, 1, 3, 4, 5, 6, 9], []) == "0, 1, 3–6, 9"
    assert seeds_text(list(range(8)), [4, 5, 6, 7]) == "0–3, 4†–7†"  # a run never mixes marked and unmarked seeds
    assert seeds_text([2, 0, 1], [1]) == "0, 1†, 2"


def test_a_grid_named_twice_runs_and_counts_each_cell_once_and_the_header_names_the_seeds_run(tmp_path, monkeypatch):
    from tqc import ablate as ablate_module

    params = Params.model_validate({"ablate": {"grids": {"aug": GRID.model_dump()}, "seeds": [0, 1, 2]},
                                    "data": {"data_dir": str(tmp_path)}, "tracking": {"enabled": False}})
    started = []
    monkeypatch.setattr(ablate_module, "experiment_refs", lambda project: {})
    monkeypatch.setattr(ablate_module, "run_cell", lambda cell, project, force=False: started.append(cell.name) or True)
    monkeypatch.setattr(ablate_module, "read_cell", lambda cell, project, refs: CellResult(cell, "done", _figures(0.8 + cell.seed / 100), 0))
    results = ablate_module.ablate(params, tmp_path, tmp_path, ["aug", "aug"], ["none"], seeds=[7, 8], where={"data.imbalance_ratio": 50})
    assert len(started) == len(set(started)) == len(results) == 2  # each cell once (twice, it counted each seed twice)
    report = json.loads((tmp_path / "ablations.json").read_text())
    assert report["seeds"] == [7, 8]  # the seeds these cells ran (--seeds), not params.yaml's [0, 1, 2]
    assert [row["seeds_done"] for row in report["rows"]] == [[7, 8]]
    assert (tmp_path / "ablations.md").read_text().count("## Options on long tails") == 1


def test_a_matrix_value_listed_twice_is_refused():
    with pytest.raises(ValueError, match="matrix data.imbalance_ratio: 50 listed more than once"):
        AblationGrid(title="t", variants={"none": {}}, matrix={"data.imbalance_ratio": [50, 10, 50]})
    with pytest.raises(ValueError, match="listed more than once"):
        AblationGrid(title="t", variants={"none": {}}, matrix={"augment.implicit": [["dropout"], [], ["dropout"]]})
    AblationGrid(title="t", variants={"none": {}}, matrix={"augment.implicit": [["dropout"], ["cutoff"], []]})


def test_a_code_version_evaluate_could_not_read_is_not_recorded_as_a_commit(monkeypatch):
    from tqc import ablate as ablate_module

    figures = {"accuracy": 0.9, "macro_f1": 0.8}
    metrics = {"test": figures, "validation": figures, "stage_one": {"test": figures, "validation": figures}, "nc": None,
               "run": {"code_version": "unknown", "params": {}}}
    shown = {"reports/metrics.json": json.dumps(metrics), "reports/augment.json": json.dumps({"rows": {"generated": 0}})}
    monkeypatch.setattr(ablate_module, "_git", lambda project, *arguments: shown.get(arguments[-1].split(":")[-1], "abc123\n"))
    cell = grid_cells("aug", GRID, [0], {}, {})[0]
    assert ablate_module.read_cell(cell, None, {cell.name: "refs/exps/x"}).code_version is None  # shown as "not recorded"
    # a cell whose experiment ran edited code (dvc exp run carries the workspace's edits) is not the clean commit's
    metrics["run"] = {"code_version": "4004902ed30875873001dc387f3b1245b3828602-dirty", "code_edited": True}
    shown["reports/metrics.json"] = json.dumps(metrics)
    assert ablate_module.read_cell(cell, None, {cell.name: "refs/exps/x"}).code_version == "4004902ed3-dirty"
    metrics["run"]["code_edited"] = False  # params.yaml alone differed: the values the cell sets
    shown["reports/metrics.json"] = json.dumps(metrics)
    assert ablate_module.read_cell(cell, None, {cell.name: "refs/exps/x"}).code_version == "4004902ed3"


PINNED = Path(__file__).parent / "pinned"  # whole reports as the code wrote them: a moved, dropped or reworded line fails


def _report_of_every_kind_of_row() -> tuple[Params, list[dict]]:
    """Three grids whose rows take every branch of the table: NC in one seed of three (n = k), a seed read from a
    record (†), missing seeds, cells at two code versions, generated rows as a range, one count and none, a paired
    difference across code versions, a two-axis pivot, a reference left out of the selection, budgets of both kinds."""
    aug = GRID.model_copy(update={"reference": "none", "budget": {"stage_one.epochs": 5}})
    ld = AblationGrid(title="Loss × distance", matrix={"stage_two.loss": ["nt_xent", "bpr"],
                                                        "model.similarity": ["cosine", "mlp"]})
    sel = AblationGrid(title="Selected", variants={"none": {}, "eda": {"augment.explicit": "eda"}}, reference="none")
    params = Params.model_validate({"ablate": {"budget": {"stage_two.epochs": 1}, "grids": {
        "aug": aug.model_dump(), "ld": ld.model_dump(), "sel": sel.model_dump()}}})
    outcomes = {  # (variant, seed): (status, ADMC macro-F1, NC, generated rows, code version); any other: missing
        ("none · ir=50", 0): ("done", 0.50, 0.70, 10, "aaa"), ("none · ir=50", 1): ("done", 0.60, None, 12, "aaa"),
        ("none · ir=50", 2): ("recorded", 0.55, None, 12, None), ("eda · ir=50", 0): ("done", 0.62, None, 20, "aaa"),
        ("eda · ir=50", 1): ("done", 0.64, None, 20, "bbb"), ("none · ir=10", 0): ("done", 0.40, None, 5, "aaa"),
        ("default · loss=nt_xent · similarity=cosine", 0): ("done", 0.80, None, None, "aaa"),
        ("default · loss=nt_xent · similarity=cosine", 1): ("done", 0.82, None, None, "aaa"),
        ("default · loss=bpr · similarity=mlp", 0): ("done", 0.70, None, None, "aaa"), ("eda", 0): ("done", 0.9, None, 3, "aaa"),
    }
    results = []
    for name, seeds in (("aug", [0, 1, 2]), ("ld", [0, 1]), ("sel", [0, 1])):
        for cell in grid_cells(name, params.ablate.grids[name], seeds, {}, {}):
            status, f1, nc, generated, version = outcomes.get((cell.variant, cell.seed), ("missing", None, None, None, None))
            results.append(CellResult(cell, status, _figures(f1, nc) if f1 is not None else {}, generated, None, version))
    return params, summarise(results)


def test_the_whole_report_is_pinned_line_for_line():
    """The checks above look for a line each; this one holds the whole text, so that a refactoring of render_markdown
    that moves, drops or rewords a line, or a blank one, fails."""
    params, rows = _report_of_every_kind_of_row()
    assert render_markdown(params, ["aug", "ld", "sel"], rows) == (PINNED / "ablations.md").read_text(encoding="utf-8")
    nothing_yet = Params.model_validate({"ablate": {"grids": {"ld": params.ablate.grids["ld"].model_dump()}}})
    assert render_markdown(nothing_yet, ["ld"], []) == (PINNED / "ablations_none_finished.md").read_text(encoding="utf-8")
