"""scripts/gpu_grid.py: the ablation cells run without DVC, on a GPU box, then reported in `tqc ablate`'s layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_script
from tqc.ablate import FIGURES
from tqc.config import load_params

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_grid():
    return load_script("gpu_grid")


@pytest.fixture(scope="module")
def params():
    return load_params(ROOT / "params.yaml")


def test_the_gpu_budget_replaces_every_cpu_budget_and_renames_the_cells(gpu_grid, params):
    budget = {"stage_one.epochs": 10, "stage_two.epochs": 5}
    on_gpu = gpu_grid.gpu_params(params, budget)
    assert all(grid.budget == {} for grid in on_gpu.ablate.grids.values())
    assert on_gpu.ablate.budget == {**params.ablate.budget, **budget}
    assert "GPU budget" in on_gpu.ablate.grids["rebalancing"].title  # its CPU title names 5 / 2 epochs
    cells = gpu_grid.cells(on_gpu, ["rebalancing"])
    assert all(c.overrides["stage_one.epochs"] == 10 and c.overrides["stage_two.epochs"] == 5 for c in cells)
    cpu_names = {c.name for c in gpu_grid.cells(params, ["rebalancing"])}
    assert cpu_names.isdisjoint(c.name for c in cells)  # never mistaken for the DVC experiments of the CPU budget


def test_cells_that_differ_only_in_training_share_their_prepared_data(gpu_grid, params):
    cells = {(c.variant, c.seed): c for c in gpu_grid.cells(params, ["loss_distance", "augmentation"])}
    key = lambda cell, local=None: gpu_grid.preparation_key(gpu_grid.cell_params(params, cell, local))
    nt_xent = cells[("default · loss=nt_xent · similarity=cosine", 0)]
    assert key(nt_xent) == key(cells[("default · loss=hinge · similarity=mlp", 0)])
    assert key(nt_xent) != key(cells[("default · loss=nt_xent · similarity=cosine", 1)])  # the seed splits validation
    assert key(cells[("none · ir=50", 0)]) != key(cells[("eda · ir=50", 0)])  # EDA rows are data
    assert key(nt_xent) == key(nt_xent, {"data.data_dir": "/elsewhere"})  # a machine's path is not the data
    placement = {(c.variant, c.seed): c for c in gpu_grid.cells(params, ["implicit_placement"])}
    assert key(placement[("input", 0)]) == key(placement[("output", 0)])  # where dropout acts is training, not data


def test_the_report_shows_finished_cells_and_marks_the_rest_missing(gpu_grid, params, tmp_path):
    on_gpu = gpu_grid.gpu_params(params, {"stage_one.epochs": 10})
    cells = gpu_grid.cells(on_gpu, ["ac_vs_admc"])
    finished = [c for c in cells if c.variant == "trec50"]
    records = [{"experiment": c.name, "grid": c.grid, "variant": c.variant, "seed": c.seed, "generated_rows": 7,
                "seconds": 60.0 + c.seed, "figures": {name: 0.8 + 0.01 * c.seed for name in FIGURES}} for c in finished]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    gpu_grid.main(["report", "--params", str(ROOT / "params.yaml"), "--grid", "ac_vs_admc", "-B", "stage_one.epochs=10",
                   "--done", str(results), "--out", str(tmp_path / "out"), "--where-it-ran", "a test box"])
    markdown = (tmp_path / "out" / "ablations.md").read_text()
    assert "| trec50 | 81.00 ± 1.00 |" in markdown  # mean ± sample std of 0.80, 0.81, 0.82
    assert "(missing [0, 1, 2])" in markdown and "a test box" in markdown and "median 61" in markdown
    assert "not DVC experiments" in markdown
    rows = json.loads((tmp_path / "out" / "ablations.json").read_text())["rows"]
    assert [r["seeds_done"] for r in rows if r["variant"] == "trec50"] == [[0, 1, 2]]


def _tiny_project(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A params.yaml on the synthetic custom data and the tiny BERT, with a two-variant grid that differs in training only."""
    import yaml

    from tests.conftest import tiny_params, write_custom_dataset

    write_custom_dataset(tmp_path / "raw")
    params = tiny_params(tmp_path / "raw", tiny_model_dir)
    params["tracking"]["enabled"] = False
    params["ablate"] = {"seeds": [0], "budget": {"baseline_nc.enabled": False},
                        "grids": {"tiny": {"title": "tiny", "variants": {"nt-xent": {}, "bpr": {"stage_two.loss": "bpr"}}}}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_prepare_then_train_runs_every_cell_once_and_a_stale_claim_does_not_block_it(gpu_grid, tiny_model_dir, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)  # data.additions (data/raw) is read relative to the project
    params_path = _tiny_project(tmp_path, tiny_model_dir)
    common = ["--params", str(params_path), "--grid", "tiny", "--prepared", str(tmp_path / "prepared")]
    budget = ["-B", "stage_one.epochs=1", "-B", "stage_two.epochs=1"]
    gpu_grid.main(["prepare", *common])
    index = json.loads((tmp_path / "prepared" / "index.json").read_text())
    assert len(index) == 1  # the two variants differ in training only: one preparation
    folder = tmp_path / "prepared" / next(iter(index.values()))
    assert (folder / "augmented" / "train.jsonl").exists() and (folder / "validated" / "test.jsonl").exists()

    on_gpu = gpu_grid.gpu_params(load_params(params_path), {"stage_one.epochs": 1, "stage_two.epochs": 1})
    names = [c.name for c in gpu_grid.cells(on_gpu, ["tiny"])]
    claims = tmp_path / "out" / "claims"
    claims.mkdir(parents=True)
    (claims / names[0]).touch()  # left by a worker of an earlier run that was killed
    gpu_grid.main(["train", *common, *budget, "--out", str(tmp_path / "out"), "--workers", "1", "--minutes", "3"])
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["experiment"] for r in records) == sorted(names)
    for record in records:
        assert all(0.0 <= record["figures"][f] <= 1.0 for f in ("admc_macro_f1", "ac_macro_f1", "admc_accuracy"))
        assert record["figures"]["nc_macro_f1"] is None  # baseline_nc.enabled false: no NC figures
        assert record["epochs_trained"] == {"stage_one": 1, "stage_two": 1}


def test_progress_counts_the_cells_of_this_run_not_earlier_records_in_the_folder(gpu_grid):
    # a warm box kept an earlier call's 9 records in the folder; this run was given 6 cells and finished 5
    earlier = {f"old-{i}" for i in range(9)}
    chosen = [f"new-{i}" for i in range(6)]
    line = gpu_grid.progress(chosen, earlier | set(chosen[:5]))
    assert line.startswith("5 of 6 chosen cells finished, 1 left")
    assert "9 record(s) of earlier runs" in line
    assert gpu_grid.progress(chosen, set(chosen)) == "6 of 6 chosen cells finished, 0 left"


def test_changed_input_files_make_a_new_preparation(gpu_grid, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params_path = _tiny_project(tmp_path, tiny_model_dir)
    command = ["prepare", "--params", str(params_path), "--grid", "tiny", "--prepared", str(tmp_path / "prepared")]
    gpu_grid.main(command)
    before = json.loads((tmp_path / "prepared" / "index.json").read_text())
    catalog = tmp_path / "raw" / "catalog.csv"
    catalog.write_text(catalog.read_text().replace("Where is the place?", "Where is this place located?"))
    gpu_grid.main(command)
    after = json.loads((tmp_path / "prepared" / "index.json").read_text())
    assert before.keys() == after.keys() and before != after  # same params, new data: a new folder
    old_catalog, new_catalog = (tmp_path / "prepared" / index[next(iter(index))] / "validated" / "catalog.jsonl"
                                for index in (before, after))
    assert "this place located" in new_catalog.read_text() and "this place located" not in old_catalog.read_text()


def test_the_inputs_digest_reads_linked_sub_folders_of_the_data_directory(gpu_grid, tmp_path):
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    data.mkdir()
    elsewhere.mkdir()
    (elsewhere / "train.txt").write_text("DESC:def What is a question ?\n")
    (data / "trec").symlink_to(elsewhere, target_is_directory=True)
    params = load_params(ROOT / "params.yaml", {"data": {"data_dir": str(data)}})
    before = gpu_grid.inputs_digest(params, tmp_path)
    (elsewhere / "train.txt").write_text("DESC:def What is another question ?\n")  # a file behind the link changed
    assert gpu_grid.inputs_digest(params, tmp_path) != before


@pytest.mark.parametrize("command", ["train", "report"])
def test_train_and_report_need_the_gpu_budget(gpu_grid, tmp_path, capsys, command):
    with pytest.raises(SystemExit) as exited:
        gpu_grid.main([command, "--params", str(ROOT / "params.yaml"), "--grid", "rebalancing", "--out", str(tmp_path)])
    assert exited.value.code == 2 and "give the GPU budget" in capsys.readouterr().err


def test_variant_narrows_the_cells_of_every_grid_and_reaches_the_workers(gpu_grid, params):
    import argparse

    narrowed = gpu_grid.cells(params, ["rebalancing", "augmentation"], variants=["prototype-mixup"])
    assert {c.variant.split(" · ")[0] for c in narrowed} == {"prototype-mixup"}
    ratios = len(params.ablate.grids["augmentation"].matrix["data.imbalance_ratio"])
    assert len(narrowed) == len(params.ablate.seeds) * (1 + ratios)  # the augmentation grid's at every ratio
    assert gpu_grid.cells(params, ["rebalancing"], variants=[]) == gpu_grid.cells(params, ["rebalancing"])
    args = argparse.Namespace(params=Path("p.yaml"), prepared=Path("prep"), out=Path("out"), grid=["rebalancing"],
                              variant=["none", "prototype-mixup"], seed=[], where=[], budget=["stage_one.epochs=10"], device_set=[], done=[])
    arguments = gpu_grid._worker_arguments(args)
    assert [arguments[i + 1] for i, a in enumerate(arguments) if a == "--variant"] == ["none", "prototype-mixup"]


def test_seed_replaces_the_params_seeds_in_the_report_and_the_workers(gpu_grid, params, tmp_path):
    import argparse

    on_gpu = gpu_grid.gpu_params(params, {"stage_one.epochs": 10}).with_overrides({"ablate": {"seeds": [3, 4]}})
    finished = [c for c in gpu_grid.cells(on_gpu, ["ac_vs_admc"]) if c.variant == "trec50"]
    assert sorted(c.seed for c in finished) == [3, 4]
    records = [{"experiment": c.name, "grid": c.grid, "variant": c.variant, "seed": c.seed, "generated_rows": 0,
                "seconds": 60.0, "figures": {name: 0.8 for name in FIGURES}} for c in finished]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    gpu_grid.main(["report", "--params", str(ROOT / "params.yaml"), "--grid", "ac_vs_admc", "-B", "stage_one.epochs=10",
                   "--seed", "3", "--seed", "4", "--done", str(results), "--out", str(tmp_path / "out")])
    document = json.loads((tmp_path / "out" / "ablations.json").read_text())
    assert document["seeds"] == [3, 4]
    assert [r["seeds_done"] for r in document["rows"] if r["variant"] == "trec50"] == [[3, 4]]
    args = argparse.Namespace(params=Path("p.yaml"), prepared=Path("prep"), out=Path("out"), grid=["rebalancing"],
                              variant=[], seed=[3, 4], where=[], budget=["stage_one.epochs=10"], device_set=[], done=[])
    arguments = gpu_grid._worker_arguments(args)
    assert [arguments[i + 1] for i, a in enumerate(arguments) if a == "--seed"] == ["3", "4"]


def test_train_takes_the_cells_seed_by_seed_so_a_cut_run_leaves_whole_seeds(gpu_grid, params):
    on_gpu = params.with_overrides({"ablate": {"seeds": [0, 1, 2]}})
    variants = ["none", "sqrt", "all-prototypes"]
    done = {c.name: {} for c in gpu_grid.cells(on_gpu, ["rebalancing"], variants=variants) if c.seed == 0}
    todo = gpu_grid.cells_to_train(on_gpu, ["rebalancing"], variants, done)
    assert [c.seed for c in todo] == [1, 1, 1, 2, 2, 2]  # seed 0 done; each later seed's variants side by side
    assert {c.variant for c in todo[:3]} == set(variants)


def test_where_narrows_the_cells_as_tqc_ablate_does_and_reaches_the_workers(gpu_grid, params):
    import argparse

    from tqc.config import ConfigError

    hinge = gpu_grid.cells(params, ["loss_distance"], where={"stage_two.loss": "hinge"})
    assert {c.overrides["stage_two.loss"] for c in hinge} == {"hinge"}
    assert len(hinge) == 3 * len(params.ablate.seeds)  # one loss, its three distances
    todo = gpu_grid.cells_to_train(params, ["loss_distance"], [], {}, {"stage_two.loss": "hinge"})
    assert sorted(c.name for c in todo) == sorted(c.name for c in hinge)
    with pytest.raises(ConfigError, match="no such param"):
        gpu_grid.cells(params, ["loss_distance"], where={"stage_two.los": "hinge"})
    args = argparse.Namespace(params=Path("p.yaml"), prepared=Path("prep"), out=Path("out"), grid=["loss_distance"], variant=[],
                              seed=[], where=["stage_two.loss=hinge"], budget=["stage_one.epochs=10"], device_set=[], done=[])
    arguments = gpu_grid._worker_arguments(args)
    assert arguments[arguments.index("--where") + 1] == "stage_two.loss=hinge"


def test_the_commit_given_to_train_reaches_the_records_and_the_report(gpu_grid, params, tmp_path):
    import argparse

    on_gpu = gpu_grid.gpu_params(params, {"stage_one.epochs": 10}).with_overrides({"ablate": {"seeds": [0]}})
    chosen = gpu_grid.cells(on_gpu, ["rebalancing"], variants=["none", "sqrt"])
    versions = {"none": "0123456789abcdef-dirty", "sqrt": "unknown"}  # unknown: a box without git, no --code-version
    records = [{"experiment": c.name, "grid": c.grid, "variant": c.variant, "seed": c.seed, "generated_rows": 0, "seconds": 60.0,
                "code_version": versions[c.variant_name], "figures": {name: 0.9 for name in FIGURES}} for c in chosen]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    gpu_grid.main(["report", "--params", str(ROOT / "params.yaml"), "--grid", "rebalancing", "--variant", "none", "--variant", "sqrt",
                   "--seed", "0", "-B", "stage_one.epochs=10", "--done", str(results), "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "ablations.md").read_text()
    assert "`0123456789-dirty` (1)" in text and "`not recorded` (1)" in text
    args = argparse.Namespace(params=Path("p.yaml"), prepared=Path("prep"), out=Path("out"), grid=["rebalancing"], variant=[],
                              seed=[], where=[], budget=["stage_one.epochs=10"], device_set=[], done=[], code_version="abc")
    arguments = gpu_grid._worker_arguments(args)
    assert arguments[arguments.index("--code-version") + 1] == "abc"


def test_a_grid_named_twice_gives_each_cell_once_and_a_selection_of_nothing_is_refused(gpu_grid, params, tmp_path):
    from tqc.config import ConfigError

    assert gpu_grid.cells(params, ["ac_vs_admc", "ac_vs_admc"]) == gpu_grid.cells(params, ["ac_vs_admc"])
    with pytest.raises(ConfigError, match=r"unknown variant\(s\) \['nonee'\]"):
        gpu_grid.cells(params, ["rebalancing"], variants=["nonee"])
    with pytest.raises(ConfigError, match="no cell of grid"):
        gpu_grid.cells(params, ["rebalancing"], where={"data.dataset": "trec5O"})
    with pytest.raises(ConfigError, match="unknown ablation grid"):
        gpu_grid.cells(params, ["rebalance"])
    # a report that would be empty leaves the one there as it was
    out = tmp_path / "out"
    out.mkdir()
    (out / "ablations.md").write_text("the earlier report")
    with pytest.raises(ConfigError, match=r"unknown variant\(s\) \['nonee'\]"):
        gpu_grid.main(["report", "--params", str(ROOT / "params.yaml"), "--grid", "rebalancing", "--variant", "nonee",
                       "-B", "stage_one.epochs=10", "--out", str(out)])
    assert (out / "ablations.md").read_text() == "the earlier report"


def test_train_with_every_cell_done_starts_no_worker(gpu_grid, params, tmp_path, monkeypatch):
    on_gpu = gpu_grid.gpu_params(params, {"stage_one.epochs": 10}).with_overrides({"ablate": {"seeds": [0]}})
    done = tmp_path / "done.jsonl"
    done.write_text("".join(json.dumps({"experiment": c.name}) + "\n" for c in gpu_grid.cells(on_gpu, ["ac_vs_admc"])))
    popen = gpu_grid.subprocess.Popen  # also what git_commit's subprocess.run starts git with

    def no_worker(command, *arguments, **keywords):
        assert "worker" not in command, "a worker was started"
        return popen(command, *arguments, **keywords)

    monkeypatch.setattr(gpu_grid.subprocess, "Popen", no_worker)
    gpu_grid.main(["train", "--params", str(ROOT / "params.yaml"), "--grid", "ac_vs_admc", "--seed", "0", "-B", "stage_one.epochs=10",
                   "--done", str(done), "--out", str(tmp_path / "grid")])
    assert not (tmp_path / "grid").exists()  # it returned before making its results and claims folders


def test_the_report_gives_the_median_seconds_of_an_even_number_of_cells(gpu_grid, params, tmp_path):
    on_gpu = gpu_grid.gpu_params(params, {"stage_one.epochs": 10}).with_overrides({"ablate": {"seeds": [0]}})
    chosen = gpu_grid.cells(on_gpu, ["rebalancing"], variants=["none", "sqrt"])
    records = [{"experiment": c.name, "grid": c.grid, "variant": c.variant, "seed": c.seed, "generated_rows": 0, "seconds": seconds,
                "figures": {name: 0.9 for name in FIGURES}} for c, seconds in zip(chosen, (10.0, 100.0))]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    gpu_grid.main(["report", "--params", str(ROOT / "params.yaml"), "--grid", "rebalancing", "--variant", "none", "--variant", "sqrt",
                   "--seed", "0", "-B", "stage_one.epochs=10", "--done", str(results), "--out", str(tmp_path / "out")])
    assert "median 55, max 100" in (tmp_path / "out" / "ablations.md").read_text(encoding="utf-8")


def test_a_gpu_budget_value_is_read_as_tqc_set_reads_it(gpu_grid):
    assert gpu_grid._budget(["stage_two.learning_rate=5e-5", "augment.implicit=[]", "seed=010"]) == {
        "stage_two.learning_rate": 5e-5, "augment.implicit": [], "seed": 10}  # YAML 1.1 read '5e-05' and 8
