"""`tqc predict`: questions from the command line, a file or stdin, answered by a trained model folder or a registered
version, one JSON record an answer. It reads no params.yaml but for a registry's tracking.uri."""

from __future__ import annotations

import argparse
import codecs
import json
import logging
import os
import sys
from pathlib import Path
from typing import Callable

from tqc.config import ConfigError, EvaluateParams, load_params, redact_text
from tqc.text import first_of, has_words
from tqc.tracking import LOCAL_STORE, chosen_by, offline_mlflow

# Questions `tqc predict` scores at a time: a multiple of the encoder's batch of 256, so that batches fill
PREDICT_CHUNK = 8192
DEFAULT_QUESTION_COLUMN = "text"  # --file's column of questions in a .csv or .jsonl: data.custom.text_column's default
REGISTERED = "models:/"  # MLflow's scheme for a registered version
LOCAL_TOP_K = 3  # a model folder's answers per question, where --top-k is not given
# file suffixes of tables `--file` does not read as one (only .csv and .jsonl are): refused, not read a line a question
UNREAD_TABLE_SUFFIXES = frozenset({".json", ".tsv", ".tab", ".xlsx", ".xls", ".parquet"})

log = logging.getLogger(__name__)


def add_parser(commands: argparse._SubParsersAction) -> None:
    predict = commands.add_parser("predict", help="the top-k standard questions for questions, from a trained model "
                                  "(the registry's pyfunc code, loaded locally); JSON lines")
    predict.add_argument("questions", nargs="*", help="questions to match")
    predict.add_argument("--file", type=Path, help="more questions: plain text, one a line ('-': standard input), or a "
                         ".csv (with a header) or .jsonl file, read from its --column")
    predict.add_argument("--column", default=None, help="with a .csv or .jsonl --file: the column holding the questions "
                         f"(default {DEFAULT_QUESTION_COLUMN!r}, data.custom.text_column's default); refused with any "
                         "other --file, which is read a question a line")
    predict.add_argument("--encoding", default=None,
                         help="the codec of --file, standard input and a .csv --catalog, as data.custom.encoding names "
                              "one (e.g. gbk, big5, shift_jis, cp1251); default UTF-8, a stray byte read as "
                              "Windows-1252 with a warning")
    _add_model_options(predict)
    _add_exemplar_options(predict)


def _add_model_options(predict: argparse.ArgumentParser) -> None:
    """predict's model: which one, and what it answers with (catalog, class-prior shift, how many answers)."""
    predict.add_argument("--model", default="models/stage_two",
                         help="a trained model folder (default models/stage_two), or a registered version as the registry "
                              "serves it, with its own catalog, shift or exemplars: models:/NAME@ALIAS (e.g. "
                              "models:/tqc-admc@champion) or models:/NAME/VERSION")
    predict.add_argument("--tracking-uri", default=None,
                         help=f"with a models:/ --model: the registry (default: tracking.uri of --params, else "
                              f"$MLFLOW_TRACKING_URI, else {LOCAL_STORE})")
    predict.add_argument("--catalog", type=Path, default=None, help="with a model folder: the catalog it answers with "
                         "(default data/validated/catalog.jsonl): the pipeline's JSONL, or a CSV with class_id and text "
                         "columns, as data.custom.catalog is written")
    predict.add_argument("--prior", default="auto",
                         help="the prior stage's file with --model's class-prior shift; auto (default): the prior.json "
                              "beside --model when one of its entries was fitted for it; none: rank by similarity alone")
    predict.add_argument("--top-k", type=int, help="answers per question (default: a registered version's own "
                         "promote.top_k, 3 for a model folder)")


def _add_exemplar_options(predict: argparse.ArgumentParser) -> None:
    """predict's exemplar rule: rank each class by its nearest labeled questions instead of its standard question."""
    predict.add_argument("--exemplars", type=Path, default=None,
                         help="labeled questions (JSONL of text, class_id, e.g. data/validated/train.jsonl): rank each "
                              "class by its --exemplar-k nearest ones instead of its standard question (no shift)")
    predict.add_argument("--exemplar-k", type=int, default=None, help=f"with --exemplars: k (default {EvaluateParams().exemplar_k}, evaluate.exemplar_k's)")
    predict.add_argument("--exemplar-cache", default=None,
                         help="with --exemplars: a folder keeping their encoded vectors between calls, keyed by the "
                              "sha256 of the model and of the questions read from the file, so an edited file "
                              "encodes again (default $XDG_CACHE_HOME/tqc/exemplars, or "
                              "~/.cache/tqc/exemplars; none: encode every call)")


def run(args: argparse.Namespace) -> None:
    """Answer the questions of the arguments, then of --file, a JSON record per answer, streamed a chunk at a time."""
    import pandas as pd

    from tqc.serving import ranked_records

    args.encoding = _codec(args.encoding)
    # (where, position, question): the questions of the arguments, then of the file
    asked = [("question argument(s)", position, text)
             for position, text in _scored(_argument_questions(args.questions), "question argument(s)", "arguments")]
    asked += [(f"{_file_name(args.file)}: line(s)", line, text) for line, text in _file_questions(args.file, args.column, args.encoding)]
    questions = [text for _, _, text in asked]
    if not questions:
        raise ConfigError(f"no questions: --file {args.file} holds none" if args.file is not None
                          else "no questions: give them as arguments or with --file")
    if args.top_k is not None and args.top_k < 1:
        raise ConfigError(f"--top-k {args.top_k}: must be at least 1")
    _refuse_too_long(asked)
    answer, matcher = _registered_answers(args) if args.model.startswith(REGISTERED) else _local_answers(args)
    _say_cut(matcher, asked)
    # JSON's \u escapes where stdout is not UTF-8 (a Latin-1 locale): a character it cannot encode was a traceback
    escaped = codecs.lookup(getattr(sys.stdout, "encoding", None) or "ascii").name != "utf-8"
    # In chunks: the (chunk, P) scores and the answers' rows are what grows with a file, and each chunk's answers are
    # printed before the next is encoded, so a long file streams out
    for start in range(0, len(questions), PREDICT_CHUNK):
        chunk = questions[start:start + PREDICT_CHUNK]
        try:
            answers = answer(pd.DataFrame({"question": chunk}))
        except ValueError as exc:  # the questions were checked above: the model's own fault (NaN scores), named in a line
            raise ConfigError(f"--model {args.model}: {exc}") from None
        for record in ranked_records(chunk, answers):
            print(json.dumps(record, ensure_ascii=escaped))
        sys.stdout.flush()


def _refuse_too_long(asked: list[tuple[str, int, str]]) -> None:
    """Questions past serving's MAX_QUESTION_CHARS, named by argument or line before the model is loaded: the matcher
    would refuse them by their row in a chunk."""
    from tqc.serving import said_too_long, too_long

    long_ones = too_long([text for _, _, text in asked])
    if long_ones:
        raise ConfigError(said_too_long(_where(asked, long_ones)))


def _where(asked: list[tuple[str, int, str]], indexes: list[int]) -> str:
    """The questions `indexes` of `asked` (where, position, text), named by argument or line."""
    positions: dict[str, list[int]] = {}
    for i in indexes:
        positions.setdefault(asked[i][0], []).append(asked[i][1])
    return "; ".join(f"{source} {first_of(numbers)}" for source, numbers in positions.items())


def _say_cut(matcher, asked: list[tuple[str, int, str]]) -> None:
    """One warning for the questions (where, position, text) the model cuts at its max_length, named by argument or
    line: the matcher, which would name them by their row in each chunk it is given, says none."""
    from tqc.serving import say_cut

    matcher.says_cut = False
    say_cut(matcher.model.question, [text for _, _, text in asked], lambda cut: _where(asked, cut))


def _argument_questions(arguments: list[str]) -> list[tuple[int, str]]:
    """(position, text) of the question arguments. Bytes of one that are not UTF-8 (a Latin-1 terminal's "é") reach
    Python as lone surrogates (argv's surrogateescape), which the tokenizer refuses with a TypeError: they are read
    as `--file` reads such bytes, as Windows-1252 with a warning naming the argument (`decode_argument`)."""
    from tqc.readers import decode_argument

    return [(position, decode_argument(text, f"question argument {position}"))
            for position, text in enumerate(arguments, start=1)]


def _file_name(path: Path | None) -> str:
    return "stdin" if str(path) == "-" else str(path)


def _codec(encoding: str | None) -> str | None:
    """--encoding's codec, by Python's own name for it; a misspelt one is refused before any file is read."""
    try:
        return None if encoding is None else codecs.lookup(encoding).name
    except LookupError:
        raise ConfigError(f"--encoding {encoding!r}: no codec of that name (e.g. gbk, big5, shift_jis, euc_kr, cp1251; "
                          "leave it out for UTF-8)") from None


def _file_questions(path: Path | None, column: str, encoding: str | None = None) -> list[tuple[int, str]]:
    """`--file`'s (line, question) pairs, blank lines said and left out (`_scored`)."""
    if path is None:
        return []
    return _scored(_question_file_lines(path, column, encoding), f"{_file_name(path)}: line(s)", "lines")


def _scored(numbered: list[tuple[int, str]], where: str, others: str) -> list[tuple[int, str]]:
    """The (position, question) pairs of (position, text) ones, stripped. A blank one (whitespace, invisible or control
    characters alone, which the model would still answer: `has_words`) is not scored, and said with its position, since
    the answers then no longer line up with the arguments or the file's lines."""
    worded = [has_words(text) for _, text in numbered]
    blank = [position for (position, _), words in zip(numbered, worded) if not words]
    if blank:
        log.warning("%s %s have no question: not scored, so the answers follow the other %s", where, first_of(blank),
                    others)
    return [(position, text.strip()) for (position, text), words in zip(numbered, worded) if words]


def _question_file_lines(path: Path, column: str | None, encoding: str | None = None) -> list[tuple[int, str]]:
    """(line, text) of `--file`: a .csv or .jsonl file's `column` (never its header or raw JSON as questions), else
    each line, stdin's for `-`; in `encoding` (None: UTF-8)."""
    from tqc.readers import TABLE_SUFFIXES, MissingColumns, ReaderError, decode_bytes, read_texts, split_lines

    if str(path) != "-" and path.suffix.lower() in TABLE_SUFFIXES:
        try:  # --column "" names no column: refused, not read as the default one
            return read_texts(path, DEFAULT_QUESTION_COLUMN if column is None else column, encoding)
        except MissingColumns as exc:  # a CSV's header, a JSONL record
            raise ConfigError(f"{exc}: --column names the column holding the questions") from None
    if str(path) != "-" and path.suffix.lower() in UNREAD_TABLE_SUFFIXES:  # read a line at a time, each was answered
        raise ConfigError(f"--file {path}: a {path.suffix} file is no plain text and is not read as a table (only .csv "
                          "with a header and .jsonl are), so its header, columns or records would be answered as "
                          "questions; save it as one of those, or give its questions alone, a question a line")
    if column is not None:  # else a table piped in would have its header and every raw line answered as questions
        raise ConfigError(f"--column {column!r}: --file {path} is read a question a line, so it has no columns; "
                          "only a --file ending .csv or .jsonl is read as a table (save stdin to one)")
    if str(path) == "-":
        name, raw = "stdin", sys.stdin.buffer.read()  # bytes: the locale's decoder would let bad bytes through or crash
    # a pipe is read (the shell's `--file <(cut -f1 batch.tsv)` names one); a device is not: /dev/zero never ends
    elif not (path.is_file() or path.is_fifo()):
        raise ConfigError(f"--file {path}: not a file" if path.exists() else f"--file {path}: no such file")
    else:
        name, raw = str(path), path.read_bytes()
    try:  # decoded as the readers decode training files (stray bytes as Windows-1252, with a warning; a UTF-16 mark)
        text = decode_bytes(raw, name, encoding)
    except ReaderError as exc:  # mostly NUL bytes, or a byte-order mark the bytes belie
        raise ConfigError(str(exc)) from None
    # the readers' line breaks: \n, \r\n or \r only, never U+2028 or U+0085 inside a question (str.splitlines),
    # so the answers line up with the file's lines; a BOM is no part of a question
    lines = list(enumerate(split_lines(text), start=1))
    record = next((number for number, line in lines if _is_json_record(line)), None)
    if record is not None:  # JSON Lines under another name (a .json, a .txt, stdin): each raw record was answered
        raise ConfigError(f"{name}, line {record}: a JSON record, not a question: a JSON Lines file is read as a table, "
                          "its --column (default text) the questions, when its name ends .jsonl")
    return lines


def _is_json_record(line: str) -> bool:
    """Whether a line is a JSON object (a JSON Lines record), which no question is."""
    stripped = line.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return False
    try:
        return isinstance(json.loads(stripped), dict)
    except ValueError:
        return False


def _registered_answers(args: argparse.Namespace) -> tuple[Callable, object]:
    """A registered version's answers (a frame of questions → its ranked answers), from its matcher as the registry
    serves it, built from its files (`registered_matcher`: no code stored with the version runs): its catalog, and its
    class-prior shift or exemplar rows, are its own, so none is given here; and the `StandardQuestionMatcher` that
    answers."""
    given = [flag for flag, value in (("--catalog", args.catalog), ("--exemplars", args.exemplars),
                                      ("--exemplar-k", args.exemplar_k), ("--exemplar-cache", args.exemplar_cache))
             if value is not None] + (["--prior"] if args.prior != "auto" else [])
    if given:
        raise ConfigError(f"{' and '.join(given)} with --model {args.model}: a registered version serves its own catalog, "
                          "shift or exemplars, as it was promoted")
    offline_mlflow()
    import mlflow
    from mlflow.exceptions import MlflowException

    from tqc.serving import registered_matcher

    uri = _registry_uri(args)
    mlflow.set_tracking_uri(uri)
    try:
        matcher = registered_matcher(args.model)  # built from its files: no code stored with the version is run
    except MlflowException as exc:  # no such model, version or alias, or its artifacts unreadable: MLflow says which
        missing = "No such artifact" in exc.message
        hint = ("the version's files may be gone from its artifact store; --tracking-uri names another registry" if missing
                else "--tracking-uri names another registry")
        raise ConfigError(f"--model {args.model}: cannot be loaded from the registry at {redact_text(uri)} "
                          f"({redact_text(exc.message)}); {hint}") from None
    except OSError as exc:  # a file of the version's artifacts gone (prior.json, say), which MLflow does not check
        raise ConfigError(f"--model {args.model}: a file of the registered version is missing or unreadable ({exc}); "
                          "register it again, or serve another version") from None
    except ValueError as exc:  # a file of the version that is there but damaged (tqc_model.json no JSON, an empty catalog)
        reason = " ".join(str(exc).split())  # one line, as transformers' messages are not
        raise ConfigError(f"--model {args.model}: the registered version does not load ({reason}); "
                          "register it again, or serve another version") from None
    # no --top-k: the version's own top_k, as it is served
    return (lambda questions: matcher.predict(None, questions, params=None if args.top_k is None else {"top_k": args.top_k}),
            matcher)


def _registry_uri(args: argparse.Namespace) -> str:
    """--tracking-uri, else the registry the pipeline registers in (`tracking.uri` of --params where that file is,
    then $MLFLOW_TRACKING_URI, then the local store), whose errors name the setting that chose it. A local SQLite file
    that is not there is an error: MLflow would create an empty registry in its place."""
    from tqc.config import TrackingParams
    from tqc.tracking import existing_registry, tracking_uri

    if args.tracking_uri:
        return existing_registry(args.tracking_uri, "--tracking-uri")
    tracking = load_params(args.params).tracking if args.params.is_file() else TrackingParams()
    return existing_registry(tracking_uri(tracking), chosen_by(tracking, f"tracking.uri of {args.params}"))


def _local_answers(args: argparse.Namespace) -> tuple[Callable, object]:
    """A model folder's answers (a frame of questions → its ranked answers), through the registry's pyfunc code; and
    the `StandardQuestionMatcher` that answers."""
    if args.tracking_uri is not None:
        raise ConfigError(f"--tracking-uri with --model {args.model}: a model folder is read from disk, not a registry "
                          f"(a registered version is {REGISTERED}NAME@ALIAS)")
    if _is_nc_baseline(Path(args.model)):
        raise ConfigError(f"--model {args.model}: the NC baseline (a linear head over the encoder), which tqc predict "
                          "does not serve; give a bi-encoder folder, such as models/stage_two")
    top_k = LOCAL_TOP_K if args.top_k is None else args.top_k
    matcher = _matcher(argparse.Namespace(**{**vars(args), "model": Path(args.model), "top_k": top_k,
                                             "catalog": args.catalog or Path("data/validated/catalog.jsonl")}))
    return lambda questions: matcher.predict(None, questions, {"top_k": top_k}), matcher


def _is_nc_baseline(folder: Path) -> bool:
    """Whether `folder` is the baseline_nc stage's model, whose config the bi-encoder's loader would call broken."""
    from tqc.io import read_json

    try:
        return read_json(folder / "tqc_model.json").get("kind") == "linear_classifier"
    except (OSError, ValueError, AttributeError):  # no such file, or not JSON: the loader names what is wrong
        return False


def _matcher(args: argparse.Namespace):
    """`tqc predict`'s matcher: the standard-question rule with --model's class-prior shift, or with
    --exemplars the exemplar rule, which has no shift."""
    from tqc.serving import local_matcher

    if args.exemplars is None:
        if args.exemplar_k is not None or args.exemplar_cache is not None:
            raise ConfigError("--exemplar-k or --exemplar-cache without --exemplars: the standard-question rule has neither")
        try:
            # a model folder or catalog that is not there (or a folder with no model: `--model models`): the loader
            # names it, with no word on a prior first
            whole = (Path(args.model) / "tqc_model.json").is_file() and Path(args.catalog).is_file()
            return local_matcher(args.model, args.catalog, args.top_k,
                                 _prior_for(args.model, args.prior, args.catalog, args.encoding) if whole else None,
                                 catalog_encoding=args.encoding)
        except ValueError as exc:  # e.g. a catalog's bad line, or a prior file with no entry for the model: each names its file
            raise _said(exc, args.catalog) from None
    # predict reads no params.yaml: evaluate.exemplar_k's default, not the project's setting
    k = EvaluateParams().exemplar_k if args.exemplar_k is None else args.exemplar_k
    if k < 1:
        raise ConfigError(f"--exemplar-k {k}: must be at least 1")
    if args.prior not in ("auto", "none"):
        raise ConfigError(f"--prior {args.prior} with --exemplars: the class-prior shift was fitted for the "
                          "standard-question rule, and the exemplar rule has none")
    try:
        return local_matcher(args.model, args.catalog, args.top_k, None, (args.exemplars, k),
                             _exemplar_cache(args.exemplar_cache), args.encoding)
    except ValueError as exc:  # e.g. an exemplar file's bad line or unknown class: each message names its file
        raise _said(exc, args.catalog) from None


def _said(error: ValueError, catalog: Path) -> ConfigError:
    """A loader's error as one line; a .csv --catalog without the class_id and text columns is told why: it may hold
    data.custom's own column names, which predict, reading no params.yaml, does not know."""
    from tqc.readers import MissingColumns

    if isinstance(error, MissingColumns) and Path(catalog).suffix.lower() == ".csv" and str(error).startswith(str(catalog)):
        return ConfigError(f"{error}: a .csv --catalog is read by its class_id and text columns (tqc predict reads no "
                           "params.yaml, so not data.custom.catalog_id_column or catalog_text_column): rename them, or "
                           "give the catalog the pipeline wrote, data/validated/catalog.jsonl")
    return ConfigError(str(error))


def _exemplar_cache(choice: str | None) -> Path | None:
    """`--exemplar-cache`: the folder (default: the user's cache folder), or None for `none`."""
    if choice == "none":
        return None
    if choice is not None and not choice.strip():  # Path("") is the working folder: entries would land there
        raise ConfigError("--exemplar-cache is empty: give a folder, or none for no cache")
    if choice is not None:
        return Path(choice)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tqc" / "exemplars"


def _prior_for(model_dir: Path, choice: str, catalog_path: Path, catalog_encoding: str | None = None) -> Path | None:
    """`tqc predict --prior`: the prior file with an entry for `model_dir` that covers the catalog's classes, or None
    for no shift. `auto` falls back to similarity alone, saying why; a named file that cannot serve is an error."""
    from tqc.prior import StaleEntry, entry_for

    if choice == "none":
        return None
    # resolved: `--model .` (or a link) names the same folder, whose parent holds the stage's prior.json
    path = Path(model_dir).resolve().parent / "prior.json" if choice == "auto" else Path(choice)
    if not path.exists():
        if choice == "auto":  # said: a model folder copied without its prior.json would rank unlike the one served
            print(f"tqc predict: no {path.name} beside {model_dir}: ranking by similarity alone", file=sys.stderr)
            return None
        raise ConfigError(f"--prior {path}: no such file (`dvc repro` writes models/prior.json; --prior none: no shift)")
    if not path.is_file():  # a folder: reading it was "[Errno 21] Is a directory", exit 1, naming no option
        raise ConfigError(f"--prior {path}: not a file (`dvc repro` writes models/prior.json; --prior none: no shift)")
    try:
        entry = entry_for(path, model_dir)
    except StaleEntry as exc:
        if choice != "auto":
            raise ConfigError(str(exc)) from None
        print(f"tqc predict: {exc}. Ranking by similarity alone", file=sys.stderr)
        return None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if entry is None:
        if choice != "auto":
            raise ConfigError(f"--prior {path}: none of its entries was fitted for {model_dir}")
        print(f"tqc predict: {path} has no class-prior shift fitted for {model_dir}: ranking by similarity alone",
              file=sys.stderr)
        return None
    if choice == "auto" and (misfit := _shift_misfit(path, entry, catalog_path, catalog_encoding)):
        # a catalog grown since the prior stage ran (a new standard question served before retraining)
        print(f"tqc predict: {misfit}. Ranking by similarity alone", file=sys.stderr)
        return None
    return path


def _shift_misfit(path: Path, entry: str, catalog_path: Path, catalog_encoding: str | None = None) -> str | None:
    """Why the prior file's `entry` cannot shift the scores of the catalog's classes (None: it can). `_matcher` asks only
    once the catalog file is there."""
    from tqc.prior import PriorFileError, PriorShift, read_file
    from tqc.readers.catalogs import load_catalog

    try:
        class_ids = load_catalog(catalog_path, catalog_encoding).class_ids
        PriorShift.from_json(read_file(path)[entry], class_ids, f"{path}, entry {entry!r}", catalog_may_drop_classes=True)
    except PriorFileError as exc:
        return str(exc)
    return None

