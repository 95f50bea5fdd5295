"""`tqc`: one sub-command per pipeline stage (what dvc.yaml runs), plus the tools around it: `fetch`, `tune`,
`ablate`, `predict` and `bench`.

Each sub-command reads `params.yaml`, takes its input and output paths from the command
line (dvc.yaml names them), calls the stage's `run()`, and turns known errors into a
one-line message and a non-zero exit code instead of a stack trace. `tqc predict` is `tqc.predict_command`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import typing
from pathlib import Path
from typing import Callable

from tqc.config import ConfigError, DatasetName, Params, load_params, redact_text
from tqc.errors import input_errors, registry_errors
from tqc.launched import LOG_FORMAT, record_input_error
from tqc import predict_command
from tqc.arguments import at_least_one, at_least_two, at_least_zero, parse_overrides, where_filters
from tqc.text import first_of
from tqc.tracking import offline_mlflow, stage_run
from tqc.training_commands import BASELINE_NC, STAGE_ONE, STAGE_TWO, TRAINING_COMMANDS, WARMUP, TrainingCommand


def _paths(parser: argparse.ArgumentParser, *names: str, required: bool = True) -> None:
    for name in names:
        parser.add_argument(f"--{name}", type=Path, required=required)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tqc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a param for this command, e.g. --set data.dataset=covidq-categories (before or "
                             "after the command; --params and -v go before it)")
    parser.add_argument("-v", "--verbose", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True)
    # In the order `tqc --help` lists them: the stages as dvc.yaml runs them, then the tools around them
    _add_ingest(commands)
    _add_validate(commands)
    _add_augment(commands)
    _add_training_stages(commands)
    _add_scoring_stages(commands)
    _add_registry_commands(commands)
    _add_check_inputs(commands)
    _add_fetch(commands)
    _add_tune(commands)
    _add_ablate(commands)
    predict_command.add_parser(commands)
    _add_bench(commands)
    _add_set_after_command(commands)
    return parser


def _add_ingest(commands: argparse._SubParsersAction) -> None:
    _paths(commands.add_parser("ingest", help="read raw data, split validation, quarantine bad lines"), "out", "quarantine", "report")


def _add_validate(commands: argparse._SubParsersAction) -> None:
    validate = commands.add_parser("validate", help="the validate stage (with --data …), or check new FILEs of labeled "
                                   "questions (and catalog files) as the retrain flow would judge them in its inbox")
    validate.add_argument("file", type=Path, nargs="*", help="new CSV/JSONL files to check against the current data, "
                          "with the retrain flow's merged additions (a file named catalog* adds classes)")
    validate.add_argument("--against", type=Path, default=None, help="with FILE: judge each file alone against this "
                          "validated folder instead (e.g. data/validated, the last dvc repro's)")
    # The stage's paths, optional as a FILE check reads none: _validate names those the stage misses
    _paths(validate, "data", "out", "quarantine", "report", "docs", required=False)


def _add_augment(commands: argparse._SubParsersAction) -> None:
    augment = commands.add_parser("augment", help="rebalance tail classes")
    _paths(augment, "train", "out", "report")
    augment.add_argument("--generated", type=Path, help="validated rows made offline (augment.explicit: file)")
    # Required: without it a row EDA or a rewrite made equal to a validation or test question joined train unseen (no
    # later stage compares augmented rows with held-out ones), inflating the scores on it.
    augment.add_argument("--held-out", type=Path, nargs="+", required=True,
                         help="validation and test files (data/validated/validation.jsonl data/validated/test.jsonl): "
                              "a generated row equal to one of their questions is dropped")
    augment.add_argument("--catalog", type=Path, help="the catalog: a generated row equal to another class's standard "
                         "question is dropped")


def _add_training_stages(commands: argparse._SubParsersAction) -> None:
    """warmup, stage-one, mine, stage-two and baseline-nc: each trains (or mines for) a model from the validated data;
    the training ones take the path arguments of their `training_commands` entry."""
    def training(command: TrainingCommand, description: str) -> None:
        parser = commands.add_parser(command.name, help=description)
        _paths(parser, *command.paths)
        for name in command.optional:
            parser.add_argument(f"--{name}", type=Path, help=OPTIONAL_PATHS[name])

    training(WARMUP, "EBSIM's warm-up on weak triplets of unlabelled questions (warmup section; off by default: writes "
                     "only its skip record)")
    training(STAGE_ONE, "train both encoders with in-batch NT-Xent")
    _paths(commands.add_parser("mine", help="mine the K hardest wrong standard questions"), "data", "train", "model", "out", "report")
    training(STAGE_TWO, "retrain against the mined negatives")
    training(BASELINE_NC, "train the NC (encoder + linear head) baseline")


# What a training command's optional path argument is (`training_commands`: which command takes which)
OPTIONAL_PATHS = {"warmup": "the warm-up stage's folder (models/warmup): start from its model where it wrote one, else "
                            "from model.pretrained"}


def _add_scoring_stages(commands: argparse._SubParsersAction) -> None:
    """prior and evaluate: the stages that score the trained models on held-out data."""
    _paths(commands.add_parser("prior", help="fit each trained model's class-prior shift on validation"),
           "data", "stage-one", "stage-two", "nc", "out")
    evaluate = commands.add_parser("evaluate", help="score ADMC and its baselines; write metrics and plots")
    _paths(evaluate, "data", "train", "stage-one", "stage-two", "nc", "prior", "metrics", "classes", "plots", "predictions")
    evaluate.add_argument("--validation-report", type=Path, help="the validate stage's report, logged with the run")


def _add_registry_commands(commands: argparse._SubParsersAction) -> None:
    """promote (the stage), trained-on and set-champion: what the registry holds and which version is champion."""
    promote = commands.add_parser("promote", help="register the stage-two model; move the champion alias if it wins")
    _paths(promote, "data", "model", "prior", "report")
    promote.add_argument("--registered", type=Path, help="also write which registry holds the model, as which version "
                         "(dvc.yaml: a cached output, never in git, so a fresh clone's dvc repro registers it there)")
    trained_on = commands.add_parser("trained-on", help="give a registered version from before versions recorded what "
                                     "they learnt from that record, so promote leaves those questions out of its judging")
    trained_on.add_argument("--version", required=True, type=_version_number,
                            help="the version of promote.model_name in the registry")
    trained_on.add_argument("--train", type=Path, action="append", required=True,
                            help="a labeled questions file it learnt from (JSONL, e.g. data/validated/train.jsonl of the "
                                 "commit it was trained at: dvc get . data/validated/train.jsonl --rev COMMIT); repeatable: "
                                 "a version made by a refresh learnt from its champion's questions too, so give both")
    set_champion = commands.add_parser("set-champion", help="move promote.alias to a registered version by hand, with "
                                       "no gate (a rollback, or a rejected version you have judged); the tags follow")
    set_champion.add_argument("version", type=_version_number, help="the version of promote.model_name in the registry")


def _add_check_inputs(commands: argparse._SubParsersAction) -> None:
    commands.add_parser("check-inputs", help="the folders dvc.yaml's ingest stage depends on through params.yaml "
                        "(data.data_dir, data.additions) exist, a relative one from the params file's folder as DVC reads it "
                        "from dvc.yaml's: `make run` checks them before `dvc repro`, which would stop on a missing one "
                        "naming its path but not the setting")


def _add_fetch(commands: argparse._SubParsersAction) -> None:
    fetch = commands.add_parser("fetch", help="download the public datasets (needs network), verified by SHA-256")
    fetch.add_argument("--dest", type=Path, required=True)
    fetch.add_argument("--verify-only", action="store_true", help="check the files already in --dest; no network")


def _add_tune(commands: argparse._SubParsersAction) -> None:
    tune = commands.add_parser("tune", help="Optuna search on validation macro-F1 (tune section of params.yaml)")
    tune.add_argument("--trials", type=at_least_one, help="trials for this worker (default tune.trials)")
    tune.add_argument("--worker", type=at_least_zero, default=0, help="this worker's index: its sampler seed is tune.seed + index")
    tune.add_argument("--out", type=Path, default=Path("reports/tuning"))
    tune.add_argument("--work", type=Path, default=Path("tuning"), help="trial folders and prepared data")
    tune.add_argument("--parent-pid", type=at_least_one, default=None, metavar="PID",
                      help="stop (the running trial failed, 'interrupted') once process PID is no longer this one's "
                           "parent: the tune flow passes its own, so its workers end with a cancelled run")
    tune.add_argument("--apply", type=Path, metavar="BEST_PARAMS", help="write a best_params.yaml into --params; no search")


def _add_ablate(commands: argparse._SubParsersAction) -> None:
    ablate = commands.add_parser("ablate", help="the ablation grids of params.yaml as DVC experiments; writes reports/ablations.md")
    ablate.add_argument("--grid", action="append", help="a grid of ablate.grids (repeatable; default all)")
    ablate.add_argument("--variant", action="append", help="only these variants (repeatable)")
    ablate.add_argument("--seeds", type=at_least_zero, nargs="+", help="default ablate.seeds")
    ablate.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                        help="of the cells that set this param, only those with this value (cells that do not set it stay), "
                             "e.g. --where data.imbalance_ratio=50")
    ablate.add_argument("--report-only", action="store_true", help="train nothing; tabulate the experiments that exist")
    ablate.add_argument("--rerun", action="store_true", help="run cells again even when their experiment exists")
    ablate.add_argument("--out", type=Path, default=Path("reports"),
                        help="the folder its report goes to: ablations.md, ablations.json, ablations.png (default reports)")


def _add_bench(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="benchmarks that print figures")
    bench.add_argument("what", choices=["epochs", "passes", "validate", "read", "serve"], help="epochs: seconds per epoch, stage one vs stage "
                       "two at the same batch size; passes: stage-one steps and encoding in one backbone pass per batch vs "
                       "passes by length, and AdamW fused vs not; validate: seconds the validate stage adds on --dataset; "
                       "read: seconds and peak memory to read a CSV of --rows questions; serve: loading and answering "
                       "through the served matcher (as tqc predict), the standard-question rule against the exemplar rule")
    # Defaults are BENCH_DEFAULTS', applied once the benchmark is known: a flag it does not read is refused, not ignored
    _add_bench_sizes(bench)
    _add_bench_inputs(bench)


def _add_bench_sizes(bench: argparse.ArgumentParser) -> None:
    """bench's counts: how long each benchmark runs, and how big its batches are."""
    bench.add_argument("--steps", type=at_least_one,
                       help="epochs: timed steps per stage and round, after 3 untimed warm-up steps; passes: steps per round "
                       "(default 20)")
    bench.add_argument("--rounds", type=at_least_one, help="epochs, passes: rounds, alternating the stages or "
                       "the settings; each figure is the median of its rounds (default 3)")
    bench.add_argument("--batch-size", type=at_least_two, help="epochs: both stages' batch size (default 32); "
                       "passes: stage one's, which must exceed the rows per pass (32) for there to be passes (default "
                       "64); serve: questions a frame (default 256)")
    bench.add_argument("--calls", type=at_least_one, help="serve: timed calls of one question each, per rule "
                       "(default 50)")


def _add_bench_inputs(bench: argparse.ArgumentParser) -> None:
    """bench's files: what each benchmark reads, and where it writes its figures."""
    bench.add_argument("--model", type=Path, help="serve: the model folder (default models/stage_two)")
    bench.add_argument("--prior", type=Path, help="serve: the standard rule's class-prior shift (default "
                       "models/prior.json, none where it is not there)")
    bench.add_argument("--rows", type=at_least_one, help="read: synthetic questions in the CSV read "
                       "(default 500000)")
    bench.add_argument("--dataset", choices=typing.get_args(DatasetName),
                       help="validate: the dataset to validate (default trec50)")
    bench.add_argument("--data", type=Path, help="epochs, passes, serve: validated data folder (default data/validated; "
                       "serve: its catalog, its test questions to answer, its training rows as exemplars)")
    bench.add_argument("--train", type=Path, help="epochs, passes: training rows (default data/augmented/train.jsonl)")
    bench.add_argument("--out", type=Path, help="also write the figures, with the machine and code version, to this JSON file")


def _add_set_after_command(commands: argparse._SubParsersAction) -> None:
    """`tqc ingest --set …` as well as `tqc --set … ingest`: every command takes --set after its name too."""
    for name, command in commands.choices.items():
        # fetch and predict read no params: their --set is parsed only to be refused in a line, so their help omits it
        command.add_argument("--set", dest="overrides_after_command", action="append", default=argparse.SUPPRESS,
                             metavar="KEY=VALUE", help=argparse.SUPPRESS if name in WITHOUT_PARAMS else
                             "override a param for this command (as tqc --set)")


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    """The command line, with the --set overrides given after the command joined to those before it, in order."""
    args = build_parser().parse_args(argv)
    args.overrides = args.overrides + vars(args).pop("overrides_after_command", [])
    return args


def _join_or_launch(params, args: argparse.Namespace) -> None:
    """`distributed.nproc_per_node > 1`: run this very command under torchrun and exit with its
    status; under torchrun (ours or the user's): join the process group."""
    from tqc import distributed

    command = distributed.relaunch_command(params.distributed.nproc_per_node, args.argv)
    if command is not None:
        # What would fail in every process, said once here: under torchrun it comes back as its traceback
        distributed.check_launch(params.distributed.backend, params.distributed.nproc_per_node)
        for name in TRAINING_COMMANDS[args.command].inputs:  # the stage's own input arguments
            path = getattr(args, name)
            if not Path(path).exists():
                raise FileNotFoundError(f"--{name} {path}: no such file or folder")
        # the command repeats the user's --set values: a database URL's password is not logged
        logging.getLogger(__name__).info("distributed: launching %s", redact_text(" ".join(command)))
        raise SystemExit(_launch(command, params.distributed.nproc_per_node))
    launched = distributed.world_size()
    if params.distributed.nproc_per_node > launched and distributed.is_main():  # said once, not by every rank
        # WORLD_SIZE already set (a job launcher's, a torchrun of fewer processes): nothing is launched
        logging.getLogger(__name__).warning(
            "distributed: distributed.nproc_per_node is %d, and this process is already one of a launcher's %d "
            "(WORLD_SIZE): it trains in those", params.distributed.nproc_per_node, launched)
    distributed.setup(params.distributed.backend, params.distributed.timeout_minutes)
    problem = params.rows_per_process_problem(launched, "the world size (WORLD_SIZE)",
                                              (TRAINING_COMMANDS[args.command].stage,))  # its own batches
    if problem:  # a user's own torchrun, over several nodes, is not what distributed.nproc_per_node says
        raise ConfigError(problem)


def _launch(command: list[str], processes: int) -> int:
    """torchrun's exit status, its processes writing to this command's streams. An input error they stopped on is
    raised here as one, so the command ends on its line and exits 2 as in one process, not 1 after torchrun's summary;
    stopped itself, this command asks torchrun to stop them first (`launched.run_torchrun`)."""
    import tempfile

    from tqc.launched import run_torchrun

    with tempfile.TemporaryDirectory(prefix="tqc-launch-") as folder:
        return run_torchrun(command, processes, Path(folder) / "input-error").status


def dispatch(args: argparse.Namespace) -> None:
    """Run one command: those that need no params.yaml first, then the rest with the loaded params."""
    applying = args.command == "tune" and args.apply  # writes a best_params.yaml into --params, which it does not load
    if args.overrides and (args.command in WITHOUT_PARAMS or applying):
        if args.command == "predict":  # it reads tracking.uri of --params's file, and nothing else of params
            given = redact_text(", ".join(args.overrides))  # a URL given may hold a password
            raise ConfigError(f"--set: `tqc predict` takes no params from --set, so {given} would change nothing "
                              "(a models:/ URI's registry is --tracking-uri, else tracking.uri in "
                              "--params's file, then $MLFLOW_TRACKING_URI; its other options: tqc predict --help)")
        raise ConfigError(f"--set: `tqc {args.command}{' --apply' if applying else ''}` reads no params, "
                          f"so {redact_text(', '.join(args.overrides))} would change nothing")
    if applying:
        _apply_tuned(args)
        return
    if args.command in WITHOUT_PARAMS:
        WITHOUT_PARAMS[args.command](args)
        return
    if args.command == "ablate":
        _refuse_what_no_cell_reads(args.overrides)
    params = load_params(args.params, parse_overrides(args.overrides))
    if args.command != "check-inputs":  # which names each setting as written, resolving it itself
        params = _data_paths_from_params_folder(params, args.params)
    if args.command in ("stage-one", "mine", "tune"):  # mining needs FAISS after stage one: said before an hour of
        # training; where this process mines (mine, tune's trials), its GPU index is tried before CUDA starts
        _check_faiss(_similarities(params, args.command), mines_here=args.command != "stage-one")
    # A disabled warm-up or NC baseline trains nothing: its record is written once, by this one process, not raced by
    # torchrun's, and nothing is launched
    if args.command in TRAINING_COMMANDS and not TRAINING_COMMANDS[args.command].is_off(params):
        _join_or_launch(params, args)
    WITH_PARAMS[args.command](args, params)


# What `tqc ablate` itself reads: the grids, seeds and budget, and the data folder each cell's experiment is pointed
# at. Every other param an experiment reads from params.yaml under the cell's own values, never from `--set`.
ABLATE_SET_KEYS = ("ablate.", "data.data_dir")


def _refuse_what_no_cell_reads(overrides: list[str]) -> None:
    from tqc.config import flatten

    unread = [key for key in flatten(parse_overrides(overrides)) if not key.startswith(ABLATE_SET_KEYS)]
    if unread:
        raise ConfigError(f"--set: `tqc ablate` runs each cell as `dvc exp run` on params.yaml and the cell's values, "
                          f"so {', '.join(unread)} would reach no experiment; set it in params.yaml or in a grid's "
                          "`base` or `budget` (only ablate.* and data.data_dir are read from --set)")


def _similarities(params: Params, command: str) -> set[str]:
    """The similarities this command's models are mined under: the params', and for tune those its space may pick."""
    searched = params.tune.space.get("model.similarity") if command == "tune" else None
    return {params.model.similarity, *(searched.choices or [] if searched else [])}


def _check_faiss(similarities: set[str], mines_here: bool) -> None:
    from tqc.mining import check_faiss_for

    try:
        for similarity in sorted(similarities):
            check_faiss_for(similarity, mines_here)
    except (ImportError, RuntimeError) as exc:
        raise ConfigError(str(exc)) from None


def _data_paths_from_params_folder(params: Params, params_path: Path) -> Params:
    """data.data_dir and data.additions, where relative, as DVC reads them: from the params file's folder. Run from
    another folder (`tqc --params elsewhere/params.yaml ingest`), a stage read them from the working folder instead,
    unlike check-inputs and dvc.yaml's deps. From the params file's own folder (`dvc repro`, `make run`) they are kept
    as written, so what a stage records is unchanged."""
    folder = params_path.absolute().parent  # not resolve(), as in _check_inputs
    if folder == Path.cwd():
        return params
    data = params.data
    moved = {name: str(folder / value) for name, value in (("data_dir", data.data_dir), ("additions", data.additions))
             if value is not None and not Path(value).is_absolute()}
    return params.model_copy(update={"data": data.model_copy(update=moved)}) if moved else params


def _check_inputs(args: argparse.Namespace, params: Params) -> None:
    """dvc.yaml's ingest depends on `${data.data_dir}` and `${data.additions}`: DVC stops on a missing one before any
    stage runs, with "failed to reproduce 'ingest': [Errno 2] No such file or directory: PATH" (on a null additions,
    "unexpected error"), which names neither the setting nor the way out, and deletes ingest's report on the way."""
    data, missing = params.data, []
    # DVC resolves a dependency from dvc.yaml's folder, the one params.yaml is in, wherever `dvc repro` is started
    folder = args.params.absolute().parent  # not resolve(): a params.yaml that links elsewhere is read beside dvc.yaml
    data_dir = folder / data.data_dir
    if not data_dir.exists():
        fetch = (f", or fetch the public datasets there: {_this_tqc()} fetch --dest {_as_given(data.data_dir, data_dir)}"
                 if data.dataset != "custom" else "")
        missing.append(f"data.data_dir {data.data_dir!r}: no folder {data_dir.resolve()} (point it at your "
                       f"data{fetch})")
    if data.additions is None:
        missing.append("data.additions is not set (the retrain flow's merged rows: data/raw, as in git)")
    elif not (additions := folder / data.additions).exists():
        missing.append(f"data.additions {data.additions!r}: no folder {additions.resolve()} (the retrain "
                       f"flow's merged rows: mkdir -p {_as_given(data.additions, additions)}, or data/raw, as in git)")
    if missing:
        raise ConfigError(f"{args.params}: {'; '.join(missing)}: dvc.yaml's ingest depends on {'it' if len(missing) == 1 else 'both'}, so `dvc repro` would "
                          "stop before any stage runs, naming only the path")


def _this_tqc() -> str:
    """tqc as this process was started, for a hint's command to run from the same working directory: the script's path
    as the shell gave it (`make run`'s .venv/bin/tqc, relative to the project it runs in; the full path of one found
    on PATH), else `tqc` (main called in a process of another program)."""
    import shlex

    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    return shlex.quote(sys.argv[0]) if script is not None and script.stem == "tqc" and script.is_file() else "tqc"


def _as_given(setting: str, path: Path) -> str:
    """A folder for a command to run here: the setting as written where it means the same from the working directory
    (`make run`, in the project), else the folder itself."""
    return setting if Path(setting).resolve() == path.resolve() else str(path.resolve())


def _fetch(args: argparse.Namespace) -> None:
    from tqc import fetch

    try:
        if not args.verify_only:
            fetch.fetch(args.dest)
    except (fetch.ChecksumMismatch, OSError) as exc:  # a download that failed or came changed: one line, as input errors
        print(f"tqc fetch: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    verified = fetch.verify(args.dest)
    for path, ok in verified.items():
        print(f"{'ok' if ok else 'MISSING OR CHANGED'}  {path}")
    if not args.dest.is_dir():  # each file listed missing, and not why: the folder itself is not there
        print(f"tqc fetch: --dest {args.dest}: {'a file' if args.dest.exists() else 'no such folder'}", file=sys.stderr)
    if not all(verified.values()):  # a script or CI step reads the status, not the listing
        raise SystemExit(1)


def _apply_tuned(args: argparse.Namespace) -> None:
    from tqc.tuning.apply import apply_best

    changed = apply_best(args.apply, args.params)
    for key, value in changed.items():
        print(f"{args.params}: {key} = {value}")
    if not changed:
        print(f"{args.params}: already holds every value of {args.apply}; left as it was")


def _ingest(args: argparse.Namespace, params: Params) -> None:
    from tqc.stages import ingest

    ingest.run(params.data, params.seed, args.out, args.quarantine, args.report, params.validate_.max_text_chars)


def _validate(args: argparse.Namespace, params: Params) -> None:
    """The validate stage, or with FILE a check of a new batch against the current data (its exit code)."""
    if args.file:
        from tqc import incoming

        if args.against is None:
            raise SystemExit(incoming.check_delivery(args.file, params))
        raise SystemExit(max(incoming.main(path, args.against, params) for path in args.file))
    from tqc.stages import validate

    missing = [f"--{n}" for n in ("data", "out", "quarantine", "report") if getattr(args, n) is None]
    if missing:
        raise ConfigError(f"the validate stage needs {', '.join(missing)} (or give a FILE to check)")
    validate.run(args.data, params.validate_, args.out, args.quarantine, args.report, args.docs)


def _augment(args: argparse.Namespace, params: Params) -> None:
    from tqc.stages import augment

    augment.run(args.train, params.augment, params.seed, args.out, args.report, args.generated, args.held_out, args.catalog)


def _training_stage(command: TrainingCommand) -> Callable[[argparse.Namespace, Params], None]:
    """A training command: its stage's run() in a tracked run, its fit and its curves file logged. A stage that is off
    writes only its skip record, with no run: nothing trained."""
    def run(args: argparse.Namespace, params: Params) -> None:
        paths = command.given(vars(args))
        if command.is_off(params):
            command.run(paths, params, params.seed)
            return
        # an optional path given is read too (stage one starts from the warm-up's model), and a file its params name
        # (the warm-up's unlabelled questions): logged with the inputs
        read = [paths[name] for name in (*command.inputs, *command.optional) if name in paths]
        read += command.params_inputs(params)
        with stage_run(command.stage, params, read) as tracker:
            result = command.run(paths, params, params.seed, tracker.on_epoch(command.stage))
            _log_fit(tracker, command.stage, result, paths[command.curves])
    return run


def _mine(args: argparse.Namespace, params: Params) -> None:
    from tqc.stages import mine

    with stage_run("mine", params, [args.data, args.train, args.model]) as tracker:
        tracker.log_metrics(mine.run(args.data, args.train, args.model, params.mine, args.out, args.report), prefix="mine.")


def _prior(args: argparse.Namespace, params: Params) -> None:
    from tqc.stages import prior

    with stage_run("prior", params, [args.data, args.stage_one, args.stage_two, args.nc]) as tracker:
        document = prior.run(args.data, args.stage_one, args.stage_two, args.nc, params, args.out)
        tracker.log_metrics({f"{name}.weight": model["weight"] for name, model in document["models"].items()},
                            prefix="prior.")
        tracker.log_artifact(args.out)


def _evaluate(args: argparse.Namespace, params: Params) -> None:
    from tqc.pipeline import ChainOutputs
    from tqc.stages import evaluate

    models = ChainOutputs(args.stage_one, args.stage_two, args.nc)
    # --train is only recorded with the run, as the models' input: each extra seed augments its own training rows
    # the prior's shift decides the headline figures: two shifts must not log the same inputs
    inputs = [args.data, args.train, args.stage_one, args.stage_two, args.nc, args.prior]
    with stage_run("evaluate", params, [path for path in inputs if path is not None]) as tracker:
        metrics = evaluate.run(args.data, models, args.prior, params, args.metrics, args.classes,
                               args.plots, args.predictions)
        # not `run`: its params are the stage's MLflow params already, and as metrics they would crowd the figures
        tracker.log_metrics({key: value for key, value in metrics.items() if key != "run"})
        for artifact in (args.metrics, args.classes, args.plots, args.validation_report):
            if artifact is not None:
                tracker.log_artifact(artifact)


def _promote(args: argparse.Namespace, params: Params) -> None:
    from tqc.model.encoder import MODEL_CONFIG
    from tqc.stages import promote

    if not (args.model / MODEL_CONFIG).is_file():  # before a run is opened: it was a traceback, and a FAILED run pair
        raise ConfigError(f"--model {args.model}: not a tqc model folder (no {MODEL_CONFIG}; `dvc repro` writes "
                          "models/stage_two)")
    with stage_run("promote", params, [args.data, args.model, args.prior]) as tracker:
        promote.run(args.data, args.model, args.prior, params.promote, args.report, tracker, params.seed,
                    params.evaluate.exemplar_k, registered_path=args.registered)


def _trained_on(args: argparse.Namespace, params: Params) -> None:
    from tqc.schema import load_questions
    from tqc.registry import record_trained_on

    _use_the_registry(params, "record into")
    questions = [q.text for path in args.train for q in load_questions(path)]
    if not questions:  # an empty record would stand for good: a record is never replaced
        raise ConfigError(f"{', '.join(map(str, args.train))}: no labeled questions to record")
    version, uri, distinct, commit = record_trained_on(params.promote.model_name, args.version, questions)
    print(f"{params.promote.model_name} v{version}: recorded {distinct} distinct questions of {len(questions)} rows "
          f"as what it learnt from ({uri}); its pipeline run was at commit {commit or 'unknown'}, whose training file "
          "these should be")


def _use_the_registry(params: Params, to_do: str) -> None:
    """MLflow set to `tracking.uri`'s registry, for a command that works on it; refused where tracking is off."""
    import mlflow

    from tqc.tracking import chosen_by, existing_registry, tracking_uri

    if not params.tracking.enabled:
        raise ConfigError(f"tracking.enabled is false: there is no registry to {to_do}")
    setting = chosen_by(params.tracking)
    uri = existing_registry(tracking_uri(params.tracking), setting)
    mlflow.set_tracking_uri(uri)
    _registry_answers(uri, setting)


def _registry_answers(uri: str, setting: str) -> None:
    """The registry's first call, said in one line naming `setting` and the URI where it fails (`tracking.first_call`),
    as a stage run's first call is: inside the command it came from a version's lookup and named only MLflow's
    endpoint."""
    import mlflow

    from tqc.tracking import first_call

    start = "start it, or " if uri.startswith(("http://", "https://")) else ""
    first_call(lambda: mlflow.MlflowClient().search_registered_models(max_results=1), uri, setting,
               "the registry could not be read", f"{start}point {setting} at the registry promote registers in")


def _version_number(text: str) -> str:
    """A registered version's number as given ("02" stays "02": the registry says how it spells it)."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: a registered version is a number (1, 2, …)")
    return text.strip()


def _set_champion(args: argparse.Namespace, params: Params) -> None:
    from tqc.stages.promote import set_champion

    _use_the_registry(params, "set a champion in")
    version, before = set_champion(params.promote, args.version)  # "02" is v2
    print(f"{params.promote.model_name}@{params.promote.alias}: v{version}"
          + (f" (was v{before}; tagged superseded)" if before not in (None, version) else
             " (it held the alias already)" if before == version else " (no version held it)"))


def _tune(args: argparse.Namespace, params: Params) -> None:
    from tqc.tune import tune
    from tqc.tuning.reports import apply_command

    from tqc.tuning.parent_watch import ending_with

    with ending_with(args.parent_pid):
        result = tune(params, args.out, args.work, args.worker, args.trials, params_file=args.params)
    best, baseline = result.summary["best"], result.summary["baseline"]
    against = (f"; the baseline, trial {baseline['number']}: {baseline['validation_macro_f1']:.4f}"
               if baseline and baseline["number"] != best["number"] else
               "; no baseline of the params' current values has completed yet" if not baseline else "")
    apply = ("the baseline is best: the params' values stand, nothing to apply"
             if baseline and baseline["number"] == best["number"] else
             f"apply with: {apply_command(args.params, args.out)}")
    print(f"best validation macro-F1 {best['validation_macro_f1']:.4f} (trial {best['number']}{against}) in study "
          f"{result.study_name!r}; {apply}")


def _ablate(args: argparse.Namespace, params: Params) -> None:
    from tqc.ablate import ablate

    where = where_filters(args.where)
    writable_out(args.out, "ablate writes its report into a folder", folder=True)  # before any cell trains
    if args.rerun and args.report_only:
        raise ConfigError("--rerun with --report-only: --report-only trains nothing, so there is nothing to run again")
    if not args.report_only:  # each cell's `dvc exp run` stopped at ingest on a missing data_dir, naming the path alone
        _check_inputs(args, params)
    results = ablate(params, Path.cwd(), args.out, args.grid, args.variant, args.seeds, not args.report_only, args.rerun,
                     where)
    missing = [r.cell.name for r in results if r.status == "missing"]
    if not missing:
        return
    shown = first_of(missing, 5)
    if args.report_only:  # tabulating what has run: cells that have not are expected, and marked in the table
        print(f"tqc ablate: {len(missing)} cell(s) have no experiment here and no record in {args.out / 'ablations.json'}: "
              f"marked missing in the table ({shown}); name the grids whose cells ran (--grid, --where), or another --out",
              file=sys.stderr)
        return
    print(f"tqc ablate: {len(missing)} cell(s) without a finished experiment: {shown}", file=sys.stderr)
    raise SystemExit(1)


def _bench_inputs_are_what_they_should_be(args: argparse.Namespace) -> None:
    """--data a folder and --train a file, where the benchmark reads them: the other way round, the OS's one line
    ("Not a directory", "Is a directory") named no option, exit 1 as for a passing fault."""
    reads = BENCH_FLAGS[args.what]
    if "data" in reads and args.data.exists() and not args.data.is_dir():
        raise ConfigError(f"--data {args.data}: a file; the benchmark reads a validated folder (data/validated)")
    if "train" in reads and args.train.is_dir():
        raise ConfigError(f"--train {args.train}: a folder; the benchmark reads a training file "
                          "(data/augmented/train.jsonl)")


def writable_out(path: Path, what: str, folder: bool) -> None:
    """An --out a command writes at its end: a folder (`folder`) or a file there, or one that can be made, in a
    folder this process may write. Said before the work, as ConfigError naming --out: found at the end, the error
    was the OS's (`[Errno 20] Not a directory`, or a temporary file's name), after every cell or round had run."""
    if path.exists() and path.is_dir() != folder:
        raise ConfigError(f"--out {path}: {'a file' if folder else 'a folder'}; {what}")
    folder_of_it = path.absolute() if folder else path.absolute().parent  # where the atomic write puts its files
    existing = next(parent for parent in [folder_of_it, *folder_of_it.parents] if parent.exists())
    if not existing.is_dir():
        raise ConfigError(f"--out {path}: {existing} is a file, so nothing can be written under it; {what}")
    if not os.access(existing, os.W_OK):
        raise ConfigError(f"--out {path}: {existing} is not writable by this user; {what}")


# Each benchmark's flags and their defaults (batch_size: 64 for passes, 256 for serve, `_with_bench_defaults`)
BENCH_DEFAULTS = {"steps": 20, "rounds": 3, "batch_size": 32, "calls": 50, "model": Path("models/stage_two"),
                  "prior": Path("models/prior.json"), "rows": 500_000, "dataset": "trec50", "data": Path("data/validated"),
                  "train": Path("data/augmented/train.jsonl")}
BENCH_FLAGS = {"epochs": ("steps", "rounds", "batch_size", "data", "train"),
               "passes": ("steps", "rounds", "batch_size", "data", "train"),
               "serve": ("calls", "rounds", "batch_size", "model", "prior", "data"), "read": ("rows",), "validate": ("dataset",)}


def _with_bench_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with each unset flag at its default, once a flag the benchmark does not read is refused by name (it
    was ignored: `bench read --steps 5` read 500,000 rows, as asked of no one), and so is a --prior not there."""
    unread = [name for name in BENCH_DEFAULTS if getattr(args, name) is not None and name not in BENCH_FLAGS[args.what]]
    if unread:
        flags = ", ".join("--" + name.replace("_", "-") for name in unread)
        raise ConfigError(f"tqc bench {args.what} does not read {flags}: it reads "
                          + (", ".join("--" + name.replace("_", "-") for name in BENCH_FLAGS[args.what]) or "no option"))
    if args.prior is not None and not args.prior.is_file():  # the default may be absent (no shift); one asked for not
        raise ConfigError(f"--prior {args.prior}: no such file (leave --prior out to time the rule without a shift "
                          "where models/prior.json is not there)")
    # passes needs batches of more than one pass (PASS_ROWS, 32): 32 was refused as its own default
    defaults = {**BENCH_DEFAULTS, **{"serve": {"batch_size": 256}, "passes": {"batch_size": 64}}.get(args.what, {})}
    return argparse.Namespace(**{**vars(args), **{name: default for name, default in defaults.items()
                                                  if getattr(args, name) is None}})


def _bench(args: argparse.Namespace, params: Params) -> None:
    from tqc import bench

    args = _with_bench_defaults(args)
    _bench_inputs_are_what_they_should_be(args)
    if args.out:  # before minutes of timing, not when the report is written
        writable_out(args.out, "bench writes its report to a JSON file", folder=False)
    if args.what == "epochs":
        report = bench.epochs(params, args.steps, args.batch_size, args.data, args.train, args.rounds)
    elif args.what == "passes":
        report = bench.passes(params, args.steps, args.batch_size, args.train, args.rounds, data_dir=args.data)
    elif args.what == "serve":
        if params.evaluate.exemplar_k < 1:
            raise ConfigError("tqc bench serve: evaluate.exemplar_k is 0, and it times the exemplar rule with that k; "
                              "--set evaluate.exemplar_k=2")
        report = bench.serving(args.model, args.data, args.prior if args.prior.is_file() else None,
                               params.evaluate.exemplar_k, args.calls, args.batch_size, args.rounds)
    elif args.what == "read":
        report = bench.reading(args.rows)
    else:
        report = bench.validate_stage(params, args.dataset)
    if args.out:
        # epochs: the folders it read (params.yaml's dataset need not be theirs)
        bench.write_report(args.out, {"data": str(args.data), "train": str(args.train), **report}
                           if args.what in ("epochs", "passes") else report)


# Commands that need no params.yaml: predict reads a model folder and a catalog, fetch the network
WITHOUT_PARAMS: dict[str, Callable[[argparse.Namespace], None]] = {"fetch": _fetch, "predict": predict_command.run}
WITH_PARAMS: dict[str, Callable[[argparse.Namespace, Params], None]] = {
    "ingest": _ingest, "validate": _validate, "augment": _augment,
    # warmup, stage-one, stage-two, baseline-nc: each its stage's run() in a tracked run (training_commands)
    **{name: _training_stage(command) for name, command in TRAINING_COMMANDS.items()},
    "mine": _mine,
    "prior": _prior, "evaluate": _evaluate, "promote": _promote, "trained-on": _trained_on, "set-champion": _set_champion, "tune": _tune,
    "ablate": _ablate, "bench": _bench, "check-inputs": _check_inputs,
}


def _log_fit(tracker, stage: str, result, history: Path) -> None:
    tracker.log_metrics({"best_epoch": result.best_epoch, "best_validation_macro_f1": result.best_validation_macro_f1,
                         "seconds_per_epoch": result.seconds_per_epoch}, prefix=f"{stage}.")
    tracker.log_artifact(history)


def main(argv: list[str] | None = None) -> int:
    from tqc import distributed

    distributed.end_with_launcher()  # first: a torchrun killed while this rank starts up takes it along
    argv = sys.argv[1:] if argv is None else list(argv)
    offline_mlflow()  # before any command imports MLflow
    args = parse_arguments(argv)
    args.argv = argv  # what a torchrun relaunch repeats
    _escape_what_stdout_cannot_encode()
    _no_library_bars_unless_on_a_terminal()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format=LOG_FORMAT)
    for noisy in ("httpx", "urllib3", "filelock", "great_expectations", "faiss", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        dispatch(args)
        from tqc import distributed

        distributed.teardown()  # under torchrun: every process leaves the group together
    except (*input_errors(), FileNotFoundError) as exc:
        print(f"tqc {args.command}: error: {exc}", file=sys.stderr)
        record_input_error(exc)  # for a parent that launched this under torchrun, which reports only "failed"
        return 2
    except registry_errors() as exc:  # `tqc promote` against a champion that cannot answer: the message says what to do
        print(f"tqc {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `tqc predict … | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error as Python flushes stdout at exit
        return 1
    except OSError as exc:  # an --out that is a folder or under a file, a full disk: one line, exit 1 (may pass later)
        print(f"tqc {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: what the stage had written is as atomic writes leave it
        print(f"tqc {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a tracking server or study database that cannot be reached, said in one line
        engine = _engine_of(exc)
        if engine is None:
            raise
        print(f"tqc {args.command}: error from {engine}: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    return 0


def _escape_what_stdout_cannot_encode() -> None:
    """Under a Latin-1 or ASCII locale (or PYTHONIOENCODING) a character stdout cannot encode, in a question, a label
    or a file's name, was a UnicodeEncodeError and a traceback: exit 1, which `tqc validate` means as "rows
    quarantined". It is written as a backslash escape instead, as Python writes it to stderr."""
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")


def _no_library_bars_unless_on_a_terminal() -> None:
    """Hugging Face's bars (transformers' "Loading weights" at each model load) are drawn whatever stderr is, so a
    `dvc repro` logged to a file or a pipe got a frame of carriage returns at each load; tqc's own bars are off there
    already (tqdm's own test). huggingface_hub reads this at import, which is why it is set before any command runs; a
    user's own setting stands, and a torchrun relaunch inherits it."""
    if not sys.stderr.isatty():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


ENGINES = ("mlflow", "optuna", "sqlalchemy", "alembic")


def _engine_of(exc: Exception) -> str | None:
    """The engine (MLflow, Optuna, their databases) an exception comes from, by its type's module, else by where it was
    raised: Optuna raises a plain RuntimeError for an MLflow database given as its storage, say. None for tqc's own."""
    raised_in = exc.__traceback__
    while raised_in is not None and raised_in.tb_next is not None:
        raised_in = raised_in.tb_next
    modules = [type(exc).__module__, raised_in.tb_frame.f_globals.get("__name__", "") if raised_in else ""]
    return next((module.split(".")[0] for module in modules if module.split(".")[0] in ENGINES), None)


if __name__ == "__main__":
    sys.exit(main())
