"""The ablation grids on a GPU machine that has no DVC, no Great Expectations and no network.

`tqc ablate` is the product's way to run the grids: one `dvc exp run` per cell, which works
as is on a GPU machine with the project installed. This script is for a lent GPU box that has
torch and transformers but none of the pipeline's other tools. It runs the *same* cells
(`ablate.grid_cells`) through the *same* stage functions (`pipeline.prepare_data`,
`pipeline.train_chain`, the prior stage's `fit_shifts`, evaluate's `evaluate_models` and
metrics document), split where the tools are:

    prepare  (here, with GE)  ingest → validate → augment of every cell's data, into one folder
    train    (the GPU box)    stage one → mine → stage two → prior → evaluate of each cell, several
                              worker processes sharing the GPU, until a deadline; resumable
    report   (here)           ablations.md / .json / .png in `tqc ablate`'s layout

A GPU budget (`-B stage_one.epochs=10 …`) replaces the CPU budgets of params.yaml (the common
one and each grid's), so the cells' names differ from the CPU cells' and the report says so.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqc.ablate import FIGURES, CellResult, dig, local_overrides, select_cells, without_prior_shift, write_report
from tqc.arguments import where_filters
from tqc.config import ConfigError, Params, load_params, unflatten
from tqc.io import file_digest, tree_digests, write_json, write_text
from tqc.tracking import git_commit

log = logging.getLogger("gpu_grid")

PREPARATION_SECTIONS = ("seed", "data", "validate_", "augment")  # what ingest → validate → augment read
PREPARATION_CODE = ("readers", "schema.py", "text.py", "io.py", "stages/ingest.py", "stages/validate.py", "stages/augment.py", "eda.py",
                    "seq2seq.py")  # their code (dvc.yaml's deps of those stages): files, and folders (.py files within)


def gpu_params(params: Params, budget: dict) -> Params:
    """params with the GPU budget as the grids' only budget (each grid's CPU budget dropped)."""
    def on_gpu(grid):
        title = f"{grid.title} (here at the GPU budget instead)" if grid.budget else grid.title
        return grid.model_copy(update={"budget": {}, "title": title})

    ablate = params.ablate.model_copy(update={"budget": {**params.ablate.budget, **budget},
                                              "grids": {name: on_gpu(grid) for name, grid in params.ablate.grids.items()}})
    return params.model_copy(update={"ablate": ablate})


def cells(params: Params, grids: list[str], seeds: list[int] | None = None, local: dict | None = None,
          variants: list[str] | None = None, where: dict | None = None):
    """The grids' cells in order; with `variants` and `where`, only those they leave (as `tqc ablate --variant
    --where`: `where` narrows the cells that set a path)."""
    return select_cells(params, grids, seeds or params.ablate.seeds, local or {}, variants, where)


def cells_to_train(params: Params, grids: list[str], variants: list[str], done: dict, where: dict | None = None) -> list:
    """The cells not in `done`, seed by seed: a deadline that cuts the run then leaves whole seeds (every
    variant of a seed, so each can be paired with the grid's reference), not whole variants."""
    return sorted((cell for cell in cells(params, grids, variants=variants, where=where) if cell.name not in done),
                  key=lambda cell: cell.seed)


def cell_params(base: Params, cell, extra: dict | None = None) -> Params:
    return base.with_overrides(unflatten({**cell.local, **cell.overrides, **(extra or {})}))


def preparation_key(params: Params) -> str:
    """A digest of the params sections data preparation reads: cells that share it share their data."""
    sections = {name: getattr(params, name).model_dump(mode="json") if name != "seed" else params.seed
                for name in PREPARATION_SECTIONS}
    sections["data"].pop("data_dir", None)  # a machine's path, not what the data is
    sections["augment"].pop("implicit_at", None)  # acts in training only; left out, keys made before it stay valid
    return hashlib.sha256(json.dumps(sections, sort_keys=True).encode()).hexdigest()[:12]


def inputs_digest(params: Params, project: Path) -> str:
    """A digest of what data preparation reads besides params: every file of the data directory and
    of the additions, and the preparation code. DVC tracks the same as the stages' deps."""
    code = Path(__file__).resolve().parents[1] / "src" / "tqc"
    roots = {"data": Path(params.data.data_dir), "catalogs": code / "catalogs",
             "additions": project / params.data.additions if params.data.additions else None}
    # each file by its path in its root (linked sub-folders included), not the machine's path to the root
    inputs = {name: tree_digests(root) if root else {} for name, root in roots.items()}
    inputs["code"] = {name: tree_digests(code / name, ".py") if (code / name).is_dir() else file_digest(code / name, "sha256")
                      for name in PREPARATION_CODE}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]


def prepare(base: Params, grids: list[str], out: Path, project: Path, variants: list[str] | None = None,
            where: dict | None = None) -> None:
    """Each distinct preparation into `out/<params key>-<inputs digest>`; `out/index.json` maps the
    params key to the folder, so the GPU box, which has neither the raw files nor this project's
    data, finds each cell's data by its params alone. Changed inputs make new folders."""
    from tqc.pipeline import prepare_data

    local = local_overrides(base, project)
    todo = {}
    for cell in cells(base, grids, local=local, variants=variants, where=where):
        params = cell_params(base, cell)
        todo.setdefault(preparation_key(params), params)
    log.info("prepare: %d data preparations for %d grids", len(todo), len(grids))
    index_path = out / "index.json"
    index = json.loads(index_path.read_text(encoding="utf-8")) if index_path.exists() else {}
    for number, (key, params) in enumerate(todo.items(), 1):
        folder = f"{key}-{inputs_digest(params, project)}"
        index[key] = folder
        if (out / folder / "augmented" / "train.jsonl").exists():
            continue
        work = out / f".{folder}.partial"
        shutil.rmtree(work, ignore_errors=True)
        prepare_data(params, work)
        for leftover in ("ingested", "quarantine"):  # not read by training: keep what travels small
            shutil.rmtree(work / leftover, ignore_errors=True)
        work.rename(out / folder)
        log.info("prepare: %d/%d %s", number, len(todo), folder)
    write_json(index_path, index)


def train_cell(base: Params, cell, prepared: Path, work: Path, device_overrides: dict, code_version: str = "unknown") -> dict:
    """One cell on this machine: the chain, the prior shifts, the evaluate stage's metrics document."""
    from tqc.pipeline import train_chain
    from tqc.schema import Catalog, load_questions
    from tqc.stages import evaluate

    params = cell_params(base, cell, device_overrides)
    data = prepared / json.loads((prepared / "index.json").read_text(encoding="utf-8"))[preparation_key(params)]
    started = time.perf_counter()
    # NC as the DVC stage runs it: baseline_nc.enabled false leaves a marker that scoring skips
    # one process a cell: the grid's workers share the GPUs already (distributed.nproc_per_node is for dvc repro)
    outputs = train_chain(params, data / "validated", data / "augmented" / "train.jsonl", work, cell.seed, processes=1)
    catalog = Catalog.load(data / "validated" / "catalog.jsonl")
    splits = {"test": load_questions(data / "validated" / "test.jsonl"),
              "validation": load_questions(data / "validated" / "validation.jsonl")}
    evaluated, shifts = evaluate.score_chain(outputs, params, data / "validated", splits, catalog)
    metrics = evaluate.metrics_document(params, evaluated, shifts, evaluate.seed_statistics([evaluated["metrics"]], False))
    metrics = metrics if cell.about_prior_shift else without_prior_shift(metrics)
    augment_report = json.loads((data / "reports" / "augment.json").read_text(encoding="utf-8"))
    return {"experiment": cell.name, "grid": cell.grid, "variant": cell.variant, "seed": cell.seed,
            "figures": {name: dig(metrics, keys) for name, (_, keys) in FIGURES.items()},
            "generated_rows": augment_report["rows"]["generated"], "seconds": time.perf_counter() - started,
            "code_version": code_version,
            "epochs_trained": {stage: len(fit.history) - 1 for stage, fit in outputs.fits.items() if fit.history}}


def worker(base: Params, todo: list, prepared: Path, results: Path, claims: Path, deadline: float, device_overrides: dict,
           code_version: str = "unknown") -> None:
    """Take unclaimed cells in order (a claim is a file created exclusively) until the deadline nears."""
    import torch

    torch.set_num_threads(2)
    longest = 0.0
    for cell in todo:
        if time.time() + 1.2 * longest > deadline:
            return
        try:
            os.close(os.open(claims / cell.name, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        work = results.parent / "work" / cell.name
        try:
            record = train_cell(base, cell, prepared, work, device_overrides, code_version)
        except Exception:  # one broken cell is reported, not the end of this worker's share
            log.exception("failed %s", cell.name)
            continue
        shutil.rmtree(work, ignore_errors=True)
        longest = max(longest, record["seconds"])
        write_json(results / f"{cell.name}.json", record)  # atomic: a worker killed mid-write leaves no half record
        log.info("done %s in %.0fs: ADMC macro-F1 %.4f", cell.name, record["seconds"], record["figures"]["admc_macro_f1"])


def read_results(paths: list[Path]) -> dict[str, dict]:
    records = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
            if line.strip():
                record = json.loads(line)
                records[record["experiment"]] = record
    return records


def report(base: Params, grids: list[str], result_files: list[Path], out_dir: Path, where_it_ran: str,
           variants: list[str] | None = None, where: dict | None = None) -> None:
    chosen = cells(base, grids, variants=variants, where=where)
    shown = {cell.name for cell in chosen}
    records = {name: record for name, record in read_results(result_files).items() if name in shown}
    results = [CellResult(cell, "done", records[cell.name]["figures"], records[cell.name]["generated_rows"],
                          code_version=_known(records[cell.name].get("code_version")))
               if cell.name in records else CellResult(cell, "missing") for cell in chosen]
    write_report(base, grids, results, out_dir)
    markdown = (out_dir / "ablations.md").read_text(encoding="utf-8")
    markdown = markdown.replace("Written by `tqc ablate` from DVC experiments (`dvc exp show` lists them by the names below).",
                                "Written by `scripts/gpu_grid.py report` from cells trained on a GPU by `scripts/gpu_grid.py train` "
                                "(the stage functions `dvc repro` runs, without DVC; not DVC experiments).")
    seconds = sorted(r["seconds"] for r in records.values())
    markdown += (f"\n## Where this ran\n\n{where_it_ran}\n\n{len(records)} cells in these tables; seconds per cell (one of several "
                 f"worker processes sharing the GPU): median {statistics.median(seconds):.0f}, "
                 f"max {seconds[-1]:.0f}.\n" if seconds else "")
    write_text(out_dir / "ablations.md", markdown)


def progress(chosen: list[str], recorded: set[str]) -> str:
    """How far a train run got with the cells it was given. Its --out folder may also hold records of earlier runs
    (a warm box keeps /tmp between calls); results.jsonl keeps them, but they are not this run's progress."""
    finished = sum(name in recorded for name in chosen)
    earlier = len(recorded - set(chosen))
    return (f"{finished} of {len(chosen)} chosen cells finished, {len(chosen) - finished} left"
            + (f"; results.jsonl also holds {earlier} record(s) of earlier runs into this folder" if earlier else ""))


def _worker_arguments(args: argparse.Namespace) -> list[str]:
    """`train`'s own arguments for its workers, rebuilt from the parsed values (not filtered text)."""
    arguments = ["--params", str(args.params), "--prepared", str(args.prepared), "--out", str(args.out)]
    arguments += ["--code-version", args.code_version] if getattr(args, "code_version", None) else []
    for flag, values in (("--grid", args.grid), ("--variant", args.variant), ("--seed", args.seed), ("--where", args.where), ("-B", args.budget), ("-D", args.device_set), ("--done", args.done)):
        arguments += [item for value in values for item in (flag, str(value))]
    return arguments


def _known(code_version: str | None) -> str | None:
    """A record's commit, shortened as `tqc ablate` shows them; None (not recorded) for 'unknown'."""
    if not code_version or code_version == "unknown":
        return None
    head, dirty = code_version.removesuffix("-dirty"), code_version.endswith("-dirty")
    return head[:10] + ("-dirty" if dirty else "")


def _budget(pairs: list[str]) -> dict:
    """-B / -D KEY=VALUE pairs, each value read as `tqc --set` reads it (YAML 1.2: 5e-5 is a number)."""
    from tqc.arguments import override_value

    return {key: override_value(f"{key}={value}", value) for key, value in (pair.split("=", 1) for pair in pairs)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["prepare", "train", "worker", "report"])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--grid", action="append", required=True)
    parser.add_argument("--variant", action="append", default=[], help="only these variants' cells (all when none)")
    parser.add_argument("--where", action="append", default=[], help="only cells with path=value, where they set the path "
                        "(as `tqc ablate --where`)")
    parser.add_argument("--seed", type=int, action="append", default=[], help="these seeds instead of ablate.seeds (as `tqc ablate --seeds`)")
    parser.add_argument("-B", "--budget", action="append", default=[], help="GPU budget: dotted.key=value")
    parser.add_argument("-D", "--device-set", action="append", default=[], help="this machine's params, e.g. model.pretrained=/x")
    parser.add_argument("--prepared", type=Path, default=Path(".devcarry/prepared"))
    parser.add_argument("--out", type=Path, default=Path("gpu-grid"))
    parser.add_argument("--done", type=Path, action="append", default=[], help="results.jsonl of earlier runs: skipped")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--deadline", type=float, default=0.0)
    parser.add_argument("--where-it-ran", default="")
    parser.add_argument("--code-version", default=None, help="the commit the cells train at, for their records: a GPU box "
                        "given a copy of the working tree has no git to ask (default: this checkout's, or unknown)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.command != "prepare" and not args.budget:
        parser.error("give the GPU budget (-B stage_one.epochs=… …): it names the cells and heads the report")
    base = gpu_params(load_params(args.params), _budget(args.budget))
    if args.seed:  # every command reads the seeds from params, the report's header included
        base = base.with_overrides({"ablate": {"seeds": args.seed}})
    device_overrides = _budget(args.device_set)  # read here: a mistake in it stops train before its workers start
    args.code_version = args.code_version or git_commit()
    where = where_filters(args.where)
    if args.command == "prepare":
        prepare(base, args.grid, args.prepared, Path.cwd(), args.variant, where)
        return
    if args.command == "report":
        report(base, args.grid, args.done, args.out, args.where_it_ran, args.variant, where)
        return
    todo = cells_to_train(base, args.grid, args.variant, read_results(args.done), where)
    if not todo:
        log.info("%s: every chosen cell is in --done: nothing to train", args.command)
    elif args.command == "worker":
        worker(base, todo, args.prepared, args.out / "results", args.out / "claims", args.deadline,
               device_overrides, args.code_version)
    else:
        train(todo, args)


def train(todo: list, args: argparse.Namespace) -> None:
    """`args.workers` worker processes share the cells until `args.minutes` have passed; then results.jsonl."""
    results, claims = args.out / "results", args.out / "claims"
    results.mkdir(parents=True, exist_ok=True)
    claims.mkdir(parents=True, exist_ok=True)
    # One `train` per --out: a claim without a result is a cell an earlier, ended run never finished
    for claim in claims.iterdir():
        if not (results / f"{claim.name}.json").exists():
            claim.unlink()
    deadline = time.time() + 60 * args.minutes
    log.info("train: %d cells to do, %d workers, until %s", len(todo), args.workers, time.ctime(deadline))
    logs = [args.out / f"worker{number}.log" for number in range(args.workers)]
    with contextlib.ExitStack() as open_logs:
        workers = [subprocess.Popen([sys.executable, __file__, "worker", *_worker_arguments(args), "--deadline", str(deadline)],
                                    stdout=open_logs.enter_context(log_file.open("w")), stderr=subprocess.STDOUT)
                   for log_file in logs]
        for process, log_file in zip(workers, logs):
            _wait_until(process, deadline + 30)
            if process.returncode:
                log.warning("train: a worker ended with exit code %d (see %s)", process.returncode, log_file)
    finished = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(results.glob("*.json"))]
    write_text(args.out / "results.jsonl", "".join(json.dumps(r) + "\n" for r in finished))
    done_here = {r["experiment"] for r in finished}
    unfinished = sorted(c.name for c in claims.iterdir() if c.name not in done_here)
    if unfinished:
        log.warning("train: %d cell(s) started but not finished (killed at the deadline or failed): %s",
                    len(unfinished), ", ".join(unfinished))
    log.info("train: %s", progress([cell.name for cell in todo], done_here))


def _wait_until(process: subprocess.Popen, deadline: float) -> None:
    """Wait for `process` until the wall-clock `deadline`; kill it past that (a worker stuck in a cell)."""
    try:
        process.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:  # a mistake in the command or params: one line, not a traceback
        sys.exit(f"gpu_grid: error: {exc}")
