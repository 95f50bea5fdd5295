"""`tqc predict`: a saved model and catalog answer questions through the registry's own pyfunc code."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.model.test_encoder import tiny_bi_encoder
from tqc.cli import main
from tqc.schema import Catalog, StandardQuestion

@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    """--exemplars keeps vectors in the user's cache folder by default: here, one of the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    return tmp_path / "user-cache" / "tqc" / "exemplars"


CATALOG = Catalog([StandardQuestion("loc", "Where is it?"), StandardQuestion("hum", "Who is it?"),
                   StandardQuestion("num", "How many are there?")])


def test_predict_prints_each_questions_top_k_ranked_as_the_model_scores_them(tiny_model_dir, tmp_path, capsys):
    torch.manual_seed(0)
    model = tiny_bi_encoder(tiny_model_dir).eval()
    model.save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    (tmp_path / "more.txt").write_text("who wrote it\n\n  how many cats  \n", encoding="utf-8")
    questions = ["where is paris", "who wrote it", "how many cats"]

    code = main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
                 "--top-k", "2", questions[0], "--file", str(tmp_path / "more.txt")])

    assert code == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in records] == questions  # arguments first, then the file's non-blank lines, stripped
    with torch.no_grad():
        scores = model.score(model.question.encode(questions), model.standard.encode(CATALOG.texts))  # (3, P)
    for record, row in zip(records, scores):
        expected = [CATALOG.class_ids[i] for i in row.argsort(descending=True)[:2].tolist()]
        assert [a["class_id"] for a in record["top_k"]] == expected
        assert record["top_k"][0]["score"] >= record["top_k"][1]["score"]
        assert record["top_k"][0]["standard_question"] == CATALOG.texts[CATALOG.class_ids.index(expected[0])]


def test_predict_without_a_model_or_questions_is_a_clear_error(tmp_path, capsys):
    CATALOG.save(tmp_path / "catalog.jsonl")
    assert main(["predict", "--model", str(tmp_path / "nowhere"), "--catalog", str(tmp_path / "catalog.jsonl"), "q"]) == 2
    assert "nowhere: not a tqc model folder" in capsys.readouterr().err
    assert main(["predict", "--model", str(tmp_path / "nowhere"), " "]) == 2
    assert "no questions: give them as arguments or with --file" in capsys.readouterr().err
    (tmp_path / "empty.txt").write_text("\n \n")
    assert main(["predict", "--model", str(tmp_path / "nowhere"), "--file", str(tmp_path / "empty.txt")]) == 2
    assert f"no questions: --file {tmp_path / 'empty.txt'} holds none" in capsys.readouterr().err
    # the pyfunc as a server calls it, with an empty frame: one line, not an IndexError
    from tqc.serving import _questions

    with pytest.raises(ValueError, match='no questions: the frame has no columns; give a "question" column'):
        _questions(__import__("pandas").DataFrame())
    (tmp_path / "utf16-no-mark.txt").write_bytes("where is it?\n".encode("utf-16-le"))
    assert main(["predict", "--file", str(tmp_path / "utf16-no-mark.txt")]) == 2
    assert "utf16-no-mark.txt: a quarter or more of its bytes are NUL" in capsys.readouterr().err
    import gzip

    (tmp_path / "questions.txt.gz").write_bytes(gzip.compress(b"where is paris\nwho wrote it\n"))
    assert main(["predict", "--file", str(tmp_path / "questions.txt.gz")]) == 2  # not its bytes answered as questions
    assert "questions.txt.gz: gzip-compressed data, not text: decompress it" in capsys.readouterr().err


def test_a_csv_or_jsonl_file_gives_its_question_column_not_its_header_or_raw_json(tiny_model_dir, tmp_path, capsys, caplog,
                                                                                  monkeypatch):
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    (tmp_path / "batch.csv").write_text("utterance,intent\nwhere is paris,loc\nwho wrote it,hum\n")
    (tmp_path / "batch.jsonl").write_text('{"utterance": "how many cats", "intent": "num"}\n')
    ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"), "--column", "utterance"]

    for file, expected in (("batch.csv", ["where is paris", "who wrote it"]), ("batch.jsonl", ["how many cats"])):
        assert main(ask + ["--file", str(tmp_path / file)]) == 0
        assert [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()] == expected

    (tmp_path / "gappy.csv").write_text("utterance,intent\nwhere is paris,loc\n,hum\n")
    with caplog.at_level("WARNING", logger="tqc.predict_command"):
        assert main(ask + ["--file", str(tmp_path / "gappy.csv")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert "gappy.csv: line(s) 3 have no question: not scored" in caplog.text
    with caplog.at_level("WARNING", logger="tqc.predict_command"):
        assert main(ask[:-2] + ["where is paris", " ", "who wrote it"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert "question argument(s) 2 have no question: not scored" in caplog.text

    assert main(ask[:-2] + ["--file", str(tmp_path / "batch.csv")]) == 2  # the default column, text, is not there
    assert "batch.csv, line 1: missing column(s) ['text']: the header has ['utterance', 'intent']" in capsys.readouterr().err
    (tmp_path / "odd.jsonl").write_text('{"utterance": "fine"}\n{"utterance": 3}\n')
    assert main(ask + ["--file", str(tmp_path / "odd.jsonl")]) == 2
    assert "odd.jsonl, line 2: 'utterance' is a JSON int, not a string" in capsys.readouterr().err

    # A table piped in, or in a file of another ending, is read a question a line: its header and each raw row would
    # be answered as questions, so a --column asked for is refused, not ignored
    (tmp_path / "batch.txt").write_text("utterance,intent\nwhere is paris,loc\n")
    assert main(ask + ["--file", str(tmp_path / "batch.txt")]) == 2
    assert (f"--column 'utterance': --file {tmp_path / 'batch.txt'} is read a question a line, so it has no columns"
            in capsys.readouterr().err)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"utterance,intent\nwhere is paris,loc\n")))
    assert main(ask + ["--file", "-"]) == 2
    assert "--column 'utterance': --file - is read a question a line" in capsys.readouterr().err
    assert main(ask[:-2] + ["--file", str(tmp_path / "batch.txt")]) == 0  # no --column: its lines, as asked
    assert len(capsys.readouterr().out.splitlines()) == 2

    # A .tsv or .json file, with --column or without, is refused: read a line at a time, its header and each raw
    # row or record were answered as questions, exit 0 (a header "text\tid" got a class)
    (tmp_path / "batch.tsv").write_text("utterance\tintent\nwhere is paris\tloc\n")
    (tmp_path / "batch.json").write_text('{"utterance": "where is paris"}\n')
    for name in ("batch.tsv", "batch.json"):
        for asked in (ask, ask[:-2]):
            assert main(asked + ["--file", str(tmp_path / name)]) == 2
            assert (f"--file {tmp_path / name}: a {name[5:]} file is no plain text and is not read as a table"
                    in capsys.readouterr().err)
    # and JSON Lines under another name, or piped in, is named by its first record's line, not answered record by record
    (tmp_path / "records.txt").write_text('where is paris\n{"utterance": "who wrote it", "intent": "hum"}\n')
    assert main(ask[:-2] + ["--file", str(tmp_path / "records.txt")]) == 2
    assert (f"{tmp_path / 'records.txt'}, line 2: a JSON record, not a question: a JSON Lines file is read as a table"
            in capsys.readouterr().err)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"text": "where is paris"}\n')))
    assert main(ask[:-2] + ["--file", "-"]) == 2
    assert "stdin, line 1: a JSON record, not a question" in capsys.readouterr().err
    (tmp_path / "braces.txt").write_text("what does {x} stand for\n{not json}\n")  # braces alone are still questions
    assert main(ask[:-2] + ["--file", str(tmp_path / "braces.txt")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_top_k_beyond_the_catalog_gives_every_standard_question_once(tiny_model_dir, tmp_path, capsys):
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    assert main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
                 "--top-k", "10", "where is it", "who is it"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [sorted(a["class_id"] for a in r["top_k"]) for r in records] == [sorted(CATALOG.class_ids)] * 2


def test_the_served_model_declares_its_input_so_mlflow_imports_it_without_a_warning():
    import subprocess
    import sys

    imported = subprocess.run([sys.executable, "-c", "import tqc.serving"], capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr
    assert "type hints" not in imported.stderr  # MLflow warns when predict's input has no hint


def test_a_registered_models_database_that_is_down_is_said_naming_the_setting_that_chose_it(tmp_path, capsys,
                                                                                                  monkeypatch):
    """`--tracking-uri` of a database that does not answer was said as tracking.uri (or $MLFLOW_TRACKING_URI), which
    the command had not read: the way out names what chose the URI."""
    pytest.importorskip("psycopg2")
    down = "postgresql://tqc:secret@127.0.0.1:1/mlflow"  # port 1: nothing listens, the connection is refused at once
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    served = ["predict", "--model", "models:/tqc-admc@champion", "q"]
    (tmp_path / "team.yaml").write_text(f"tracking:\n  uri: {down}\n")
    for flags, setting in ((["predict", "--tracking-uri", down], "--tracking-uri"),
                           (["--params", "team.yaml", "predict"], "tracking.uri of team.yaml")):
        assert main([*flags, *served[1:]]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith(f"tqc predict: error from mlflow: {setting} postgresql://tqc:***@127.0.0.1:1/mlflow: no "
                                "connection to the database (tqc gives a database 10 s to answer: ")
        assert error.endswith(f"start it, or point {setting} at the registry promote registers in")
        assert "\n" not in error and "MLFLOW_TRACKING_URI" not in error and "secret" not in error
    monkeypatch.setenv("MLFLOW_TRACKING_URI", down)  # no params file: the variable chose it
    assert main(["--params", "none.yaml", *served]) == 2
    assert "point $MLFLOW_TRACKING_URI at the registry promote registers in" in capsys.readouterr().err


def test_predict_refuses_options_that_do_not_fit_its_kind_of_model_and_says_how_to_pick_a_column(tmp_path, capsys,
                                                                                                 monkeypatch):
    """A registered version serves its own catalog and shift; a folder is read from disk, not from a registry."""
    for flags in (["--catalog", "c.jsonl"], ["--prior", "none"], ["--exemplars", "train.jsonl"], ["--exemplar-k", "3"],
                  ["--exemplar-cache", "none"]):
        assert main(["predict", "--model", "models:/tqc-admc@champion", *flags, "q"]) == 2
        assert (f"{flags[0]} with --model models:/tqc-admc@champion: a registered version serves its own catalog"
                in capsys.readouterr().err)
    assert main(["predict", "--model", str(tmp_path / "model"), "--tracking-uri", "sqlite:///x.db", "q"]) == 2
    assert "--tracking-uri with --model" in capsys.readouterr().err

    # A registry file that is not there is said, not created empty (MLflow would make one): named, or the default
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    missing = tmp_path / "mlfow.db"
    assert main(["predict", "--model", "models:/tqc-admc@champion", "--tracking-uri", f"sqlite:///{missing}", "q"]) == 2
    assert f"no registry at sqlite:///{missing}: no file {missing}" in capsys.readouterr().err
    assert main(["--params", str(tmp_path / "none.yaml"), "predict", "--model", "models:/tqc-admc@champion", "q"]) == 2
    assert "no registry at sqlite:///mlflow.db: no file mlflow.db" in capsys.readouterr().err
    # ... and the project's tracking.uri is the registry asked by default, as promote registers there
    (tmp_path / "params.yaml").write_text(f"tracking:\n  uri: sqlite:///{tmp_path / 'team.db'}\n")
    assert main(["predict", "--model", "models:/tqc-admc@champion", "q"]) == 2
    assert f"no registry at sqlite:///{tmp_path / 'team.db'}" in capsys.readouterr().err
    assert not missing.exists() and not (tmp_path / "mlflow.db").exists() and not (tmp_path / "team.db").exists()

    (tmp_path / "questions.csv").write_text("question,intent\nwhere is it,loc\n", encoding="utf-8")
    (tmp_path / "questions.jsonl").write_text('{"question": "where is it"}\n', encoding="utf-8")
    assert main(["predict", "--file", str(tmp_path / "questions.csv")]) == 2
    assert ("missing column(s) ['text']: the header has ['question', 'intent']: --column names the column holding the "
            "questions") in capsys.readouterr().err
    assert main(["predict", "--file", str(tmp_path / "questions.jsonl")]) == 2
    assert "questions.jsonl, line 1: no 'text' field: --column names the column" in capsys.readouterr().err


def test_predict_adds_the_class_prior_shift_fitted_for_its_model(tiny_model_dir, tmp_path, capsys):
    from tqc.io import write_json

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "models" / "stage_two")
    CATALOG.save(tmp_path / "catalog.jsonl")
    shift = {"loc": 0.0, "hum": 0.0, "num": 100.0}  # large enough to outrank any similarity
    write_json(tmp_path / "models" / "prior.json", {"weights": [0.0, 1.0], "models": {
        "admc": {"model": "stage_two", "weight": 1.0, "temperature": 0.1, "shift": shift}}})
    ask = ["predict", "--model", str(tmp_path / "models" / "stage_two"), "--catalog", str(tmp_path / "catalog.jsonl"),
           "--top-k", "1", "where is paris", "who wrote it"]

    assert main(ask) == 0  # --prior auto: the prior.json beside the model, whose entry names it
    shifted = [json.loads(line)["top_k"][0] for line in capsys.readouterr().out.splitlines()]
    assert [a["class_id"] for a in shifted] == ["num", "num"] and all(a["score"] > 99 for a in shifted)
    assert main(ask + ["--prior", "none"]) == 0
    plain = [json.loads(line)["top_k"][0] for line in capsys.readouterr().out.splitlines()]
    assert all(a["score"] <= 1.0 + 1e-6 for a in plain)  # cosine alone
    assert main(ask + ["--prior", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such file" in capsys.readouterr().err

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "models" / "other")  # beside the file, but not fitted in it
    other = ["predict", "--model", str(tmp_path / "models" / "other"), "--catalog", str(tmp_path / "catalog.jsonl"), "q"]
    assert main(other) == 0
    assert "has no class-prior shift fitted for" in capsys.readouterr().err  # auto: said, then similarity alone
    assert main(other + ["--prior", str(tmp_path / "models" / "prior.json")]) == 2
    assert "none of its entries was fitted for" in capsys.readouterr().err

    # A standard question added to the catalog since the prior stage ran: auto says so and ranks by similarity alone;
    # the file named is refused, as for a stale entry.
    Catalog([*CATALOG.questions, StandardQuestion("date", "When was it?")]).save(tmp_path / "grown.jsonl")
    grown = ask[:3] + ["--catalog", str(tmp_path / "grown.jsonl"), "--top-k", "4", "when was it"]
    assert main(grown) == 0
    assert "fitted on another catalog (no shift for ['date']" in capsys.readouterr().err
    assert main(grown + ["--prior", str(tmp_path / "models" / "prior.json")]) == 2
    assert "fitted on another catalog" in capsys.readouterr().err

    # A catalog with a standard question retired keeps the others' shifts, auto or named: the ranking among them is
    # the full catalog's (before, the fit's extra class dropped every shift and "hum" outranked "num" by similarity)
    Catalog([q for q in CATALOG.questions if q.class_id != "loc"]).save(tmp_path / "retired.jsonl")
    retired = ask[:3] + ["--catalog", str(tmp_path / "retired.jsonl"), "--top-k", "2", "who wrote it"]
    for prior_option in ([], ["--prior", str(tmp_path / "models" / "prior.json")]):
        assert main(retired + prior_option) == 0
        captured = capsys.readouterr()
        answers = json.loads(captured.out)["top_k"]
        assert [a["class_id"] for a in answers] == ["num", "hum"] and answers[0]["score"] > 99
        assert "fitted on another catalog" not in captured.err


def test_a_shift_fitted_for_earlier_weights_in_the_same_folder_is_not_applied(tiny_model_dir, tmp_path, capsys):
    """The model folder was trained again after the prior stage ran: its path still matches the entry, its weights
    do not. `--prior auto` says so and ranks by similarity; a named file is refused."""
    from tqc import prior
    from tqc.io import write_json

    model, folder = tiny_bi_encoder(tiny_model_dir), tmp_path / "models" / "stage_two"
    model.save(folder)
    CATALOG.save(tmp_path / "catalog.jsonl")
    write_json(tmp_path / "models" / "prior.json", {"weights": [0.0, 1.0], "models": {"admc": {
        "model": "stage_two", "weights_digest": prior.weights_digest(folder), "weight": 1.0, "temperature": 0.1,
        "shift": {"loc": 0.0, "hum": 0.0, "num": 100.0}}}})
    ask = ["predict", "--model", str(folder), "--catalog", str(tmp_path / "catalog.jsonl"), "--top-k", "1", "where is paris"]
    assert main(ask) == 0
    assert json.loads(capsys.readouterr().out)["top_k"][0]["score"] > 99  # the weights it was fitted for: shifted

    with torch.no_grad():
        next(model.question.parameters()).add_(0.01)  # trained again, in the same folder
    model.save(folder)
    assert main(ask) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["top_k"][0]["score"] <= 1.0 + 1e-6  # similarity alone
    assert "its entry 'admc' was fitted for earlier weights in" in captured.err and "run the prior stage again" in captured.err
    assert main(ask + ["--prior", str(tmp_path / "models" / "prior.json")]) == 2
    assert "was fitted for earlier weights in" in capsys.readouterr().err


def test_evaluate_with_a_shift_fitted_for_earlier_weights_stops_in_one_line(tmp_path, capsys, monkeypatch):
    """Evaluate reads each model's shift before it loads a model, so a stale entry stops it there: one line naming
    the file and the entry, exit 2, no traceback. Promote reads the same entries through the same error type."""
    from safetensors.numpy import save_file

    from tqc.io import write_json
    from tqc.schema import LabeledQuestion, save_questions

    monkeypatch.chdir(tmp_path)
    CATALOG.save(tmp_path / "data" / "catalog.jsonl")
    for split in ("train", "validation", "test"):
        save_questions(tmp_path / "data" / f"{split}.jsonl", [LabeledQuestion("where is paris", "loc", f"{split}:1")])
    for name in ("stage_one", "stage_two"):
        (tmp_path / "models" / name).mkdir(parents=True)
        save_file({"w": np.zeros(2, dtype=np.float32)}, tmp_path / "models" / name / "model.safetensors")
    write_json(tmp_path / "models" / "nc" / "disabled.json", {})  # baseline_nc.enabled: false
    shift = {"weight": 1.0, "temperature": 0.1, "shift": {c: 0.0 for c in CATALOG.class_ids}}
    write_json(tmp_path / "models" / "prior.json", {"models": {"admc": {"model": "stage_two", "weights_digest": "0" * 64, **shift},
                                                             "stage_one": {"model": "stage_one", **shift}}})
    params = Path(__file__).resolve().parents[2] / "params.yaml"
    assert main(["--params", str(params), "--set", "tracking.enabled=false", "evaluate", "--data", "data", "--train", "data/train.jsonl",
                 "--stage-one", "models/stage_one", "--stage-two", "models/stage_two", "--nc", "models/nc", "--prior", "models/prior.json",
                 "--metrics", "metrics.json", "--classes", "classes.json", "--plots", "plots",
                 "--predictions", "predictions.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "tqc evaluate: error: models/prior.json: its entry 'admc' was fitted for earlier weights in" in err
    assert "Traceback" not in err and not (tmp_path / "metrics.json").exists()


def test_prior_auto_finds_the_models_prior_file_however_the_model_folder_is_named(tiny_model_dir, tmp_path, capsys,
                                                                                   monkeypatch):
    from tqc.io import write_json

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "models" / "stage_two")
    CATALOG.save(tmp_path / "catalog.jsonl")
    write_json(tmp_path / "models" / "prior.json", {"weights": [0.0, 1.0], "models": {
        "admc": {"model": "stage_two", "weight": 1.0, "temperature": 0.1, "shift": {"loc": 0.0, "hum": 0.0, "num": 100.0}}}})
    (tmp_path / "link").symlink_to(tmp_path / "models" / "stage_two")
    monkeypatch.chdir(tmp_path / "models" / "stage_two")
    for model in (".", str(tmp_path / "link")):  # `.` has the parent `.`: it looked for prior.json inside the model
        assert main(["predict", "--model", model, "--catalog", str(tmp_path / "catalog.jsonl"), "--top-k", "1", "where"]) == 0
        assert json.loads(capsys.readouterr().out)["top_k"][0]["class_id"] == "num"  # shifted, as from its own path


def test_a_question_file_keeps_unicode_line_separators_inside_its_questions_and_drops_a_bom(tiny_model_dir, tmp_path, capsys,
                                                                                           monkeypatch):
    import io

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    text = "\ufeffwhere is\u2028paris\r\nwho wrote it\x85today\n"
    (tmp_path / "questions.txt").write_text(text, encoding="utf-8", newline="")
    ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl")]
    assert main([*ask, "--file", str(tmp_path / "questions.txt")]) == 0
    expected = ["where is\u2028paris", "who wrote it\x85today"]  # str.splitlines made four questions of two
    answers = lambda: [json.loads(line)["text"] for line in capsys.readouterr().out.split("\n") if line]  # noqa: E731 (JSON Lines: \n)
    assert answers() == expected
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8"))
    assert main([*ask, "--file", "-"]) == 0
    assert answers() == expected
    assert main([*ask, "--file", str(tmp_path)]) == 2  # a folder: one line, not IsADirectoryError's traceback
    assert f"--file {tmp_path}: not a file" in capsys.readouterr().err


def test_a_catalog_or_exemplar_file_saved_with_a_bom_reads_as_without(tiny_model_dir, tmp_path, capsys):
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "plain.jsonl")
    (tmp_path / "catalog.jsonl").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "plain.jsonl").read_bytes())  # Notepad's UTF-8
    exemplars = '{"text": "where", "class_id": "loc"}\n{"text": "who", "class_id": "hum"}\n'
    (tmp_path / "exemplars.jsonl").write_text("\ufeff" + exemplars, encoding="utf-8")
    (tmp_path / "plain-exemplars.jsonl").write_text(exemplars, encoding="utf-8")

    def answers(catalog: str, *more: str) -> str:
        ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / catalog), "where is it", *more]
        assert main(ask) == 0, capsys.readouterr().err
        return capsys.readouterr().out

    by_standard_question = answers("catalog.jsonl")
    assert by_standard_question == answers("plain.jsonl") and '"class_id"' in by_standard_question
    by_exemplars = answers("catalog.jsonl", "--exemplars", str(tmp_path / "exemplars.jsonl"))
    assert by_exemplars == answers("plain.jsonl", "--exemplars", str(tmp_path / "plain-exemplars.jsonl"))


def test_a_model_registered_before_its_config_named_the_prior_entry_serves_admcs_shift(tiny_model_dir, tmp_path):
    from types import SimpleNamespace

    from tqc.io import write_json
    from tqc.serving import StandardQuestionMatcher

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "stage_two")
    CATALOG.save(tmp_path / "catalog.jsonl")
    zero = {"loc": 0.0, "hum": 0.0, "num": 0.0}
    write_json(tmp_path / "prior.json", {"weights": [1.0], "models": {
        "stage_one": {"model": "stage_one", "weight": 1.0, "temperature": 0.1, "shift": {**zero, "loc": 100.0}},
        "admc": {"model": "stage_two", "weight": 1.0, "temperature": 0.1, "shift": {**zero, "num": 100.0}}}})
    matcher = StandardQuestionMatcher()
    matcher.load_context(SimpleNamespace(artifacts={"model": str(tmp_path / "stage_two"), "catalog": str(tmp_path / "catalog.jsonl"),
                                                    "prior": str(tmp_path / "prior.json")}, model_config={"top_k": 1}))
    assert matcher.predict(None, ["who wrote it"])["class_id"].tolist() == ["num"]


def test_a_registered_prior_file_without_the_entry_its_config_serves_is_named_not_a_key_error(tiny_model_dir, tmp_path):
    """A version's prior file lacking the entry its model_config names (or `admc`, for one registered before configs
    named it) was a bare KeyError: a traceback out of `tqc predict --model models:/…`."""
    from types import SimpleNamespace

    from tqc.io import write_json
    from tqc.prior import PriorFileError
    from tqc.serving import StandardQuestionMatcher

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "stage_two")
    CATALOG.save(tmp_path / "catalog.jsonl")
    zero = {"loc": 0.0, "hum": 0.0, "num": 0.0}
    write_json(tmp_path / "prior.json", {"weights": [1.0], "models": {
        "stage_one": {"model": "stage_one", "weight": 1.0, "temperature": 0.1, "shift": zero}}})
    artifacts = {"model": str(tmp_path / "stage_two"), "catalog": str(tmp_path / "catalog.jsonl"),
                 "prior": str(tmp_path / "prior.json")}
    for config, entry in (({"top_k": 1}, "admc"), ({"top_k": 1, "prior_model": "nc"}, "nc")):
        with pytest.raises(PriorFileError, match=f"prior.json: no entry '{entry}' .*only \\['stage_one'\\]"):
            StandardQuestionMatcher().load_context(SimpleNamespace(artifacts=artifacts, model_config=config))


def test_the_served_model_refuses_a_top_k_below_one_or_not_whole(tiny_model_dir, tmp_path):
    from types import SimpleNamespace

    from tqc.serving import StandardQuestionMatcher

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "stage_two")
    CATALOG.save(tmp_path / "catalog.jsonl")
    matcher = StandardQuestionMatcher()
    matcher.load_context(SimpleNamespace(artifacts={"model": str(tmp_path / "stage_two"), "catalog": str(tmp_path / "catalog.jsonl")},
                                         model_config={"top_k": 1}))
    for bad in (0, -1, 2.5, True, "2"):  # -1 was torch's "index k out of range", 0 an empty answer
        with pytest.raises(ValueError, match="top_k must be a whole number of at least 1"):
            matcher.predict(None, ["who wrote it"], {"top_k": bad})
    assert len(matcher.predict(None, ["who wrote it"], {"top_k": np.int64(2)})) == 2  # MLflow may pass numpy ints


def test_predict_with_exemplars_ranks_as_evaluate_scores_the_exemplar_rule(tiny_model_dir, tmp_path, capsys):
    from tqc.exemplars import exemplar_scorer
    from tqc.schema import LabeledQuestion, save_questions

    torch.manual_seed(0)
    model = tiny_bi_encoder(tiny_model_dir).eval()
    model.save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    exemplars = [LabeledQuestion("where is paris", "loc"), LabeledQuestion("where was it found", "loc"),
                 LabeledQuestion("who wrote it", "hum")]  # num has none: the rule cannot answer it
    save_questions(tmp_path / "train.jsonl", exemplars)
    questions = ["who wrote it", "where is the louvre", "how many cats"]

    code = main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
                 "--exemplars", str(tmp_path / "train.jsonl"), "--exemplar-k", "2", "--top-k", "3", *questions])

    assert code == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = exemplar_scorer(model.question, exemplars, k=2, batch_size=8)([LabeledQuestion(q, "loc") for q in questions],
                                                                            CATALOG)  # (3, P): evaluate's scorer
    for record, row in zip(records, expected):
        assert [a["class_id"] for a in record["top_k"]] == [CATALOG.class_ids[i] for i in np.argsort(-row)[:2]]
        assert [a["score"] for a in record["top_k"]] == pytest.approx(sorted(row[np.isfinite(row)], reverse=True), abs=1e-5)
        assert record["top_k"][0]["standard_question"] == CATALOG.texts[CATALOG.class_ids.index(record["top_k"][0]["class_id"])]
    assert records[0]["top_k"][0] == {"class_id": "hum", "standard_question": "Who is it?", "score": pytest.approx(1.0, abs=1e-5)}
    assert all(len(r["top_k"]) == 2 for r in records)  # --top-k 3, but only two classes have exemplars


def test_predict_with_a_bad_exemplar_file_names_the_file_and_line(tiny_model_dir, tmp_path, capsys):
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"), "where is it"]
    (tmp_path / "no_label.jsonl").write_text('{"text": "where", "class_id": "loc"}\n\n\n{"text": "who"}\n', encoding="utf-8")
    (tmp_path / "unknown.jsonl").write_text('{"text": "where", "class_id": "loc"}\n{"text": "when", "class_id": "date"}\n',
                                            encoding="utf-8")
    (tmp_path / "latin1.jsonl").write_bytes('{"text": "caf\xe9", "class_id": "loc"}\n'.encode("latin-1"))

    assert main([*ask, "--exemplars", str(tmp_path / "no_label.jsonl")]) == 2
    assert "no_label.jsonl, line 4: an exemplar needs non-empty string fields text and class_id" in capsys.readouterr().err
    assert main([*ask, "--exemplars", str(tmp_path / "unknown.jsonl")]) == 2
    assert "unknown.jsonl:2: class 'date' is not in the catalog" in capsys.readouterr().err
    assert main([*ask, "--exemplars", str(tmp_path / "latin1.jsonl")]) == 2
    assert "latin1.jsonl, line 1: not UTF-8 text (invalid continuation byte, byte 0xe9" in capsys.readouterr().err
    assert main([*ask, "--exemplars", str(tmp_path / "nowhere.jsonl")]) == 2
    assert "nowhere.jsonl: no labeled questions there" in capsys.readouterr().err
    assert main([*ask, "--exemplars", str(tmp_path / "unknown.jsonl"), "--prior", str(tmp_path / "prior.json")]) == 2
    assert "the exemplar rule has none" in capsys.readouterr().err
    assert main([*ask, "--exemplar-k", "3"]) == 2
    assert "--exemplar-k or --exemplar-cache without --exemplars" in capsys.readouterr().err


def test_predict_keeps_encoded_exemplars_between_calls_keyed_by_model_and_file(tiny_model_dir, tmp_path, capsys, monkeypatch,
                                                                               user_cache):
    from tqc.model.encoder import TextEncoder
    from tqc.schema import LabeledQuestion, save_questions

    torch.manual_seed(0)
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "train.jsonl", [LabeledQuestion("where is paris", "loc"), LabeledQuestion("who wrote it", "hum")])
    ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
           "--exemplars", str(tmp_path / "train.jsonl"), "--top-k", "2", "where is the louvre", "who painted it"]

    assert main(ask) == 0
    first = capsys.readouterr().out
    assert len(list(user_cache.glob("*.safetensors"))) == 1  # the default folder: $XDG_CACHE_HOME/tqc/exemplars

    encode = TextEncoder.encode

    def questions_only(self, texts, batch_size=256, description="encoding"):
        assert description != "encoding exemplars", "the cached vectors should have been read"
        return encode(self, texts, batch_size, description)

    monkeypatch.setattr(TextEncoder, "encode", questions_only)
    assert main(ask) == 0
    assert capsys.readouterr().out == first  # the same answers from the cached vectors

    monkeypatch.setattr(TextEncoder, "encode", encode)
    entry = next(user_cache.glob("*.safetensors"))
    with (tmp_path / "train.jsonl").open("a", encoding="utf-8") as rows:  # other questions: encoded anew
        rows.write('{"text": "how many cats", "class_id": "num"}\n')
    assert main(ask) == 0
    assert [path.name for path in user_cache.glob("*.safetensors")] != [entry.name]  # its entry replaced the file's last
    assert len(list(user_cache.glob("*.safetensors"))) == 1  # one entry per model and file, however often it grows
    assert main([*ask, "--exemplar-cache", "none"]) == 0 and len(list(user_cache.glob("*.safetensors"))) == 1


def test_exemplar_vectors_are_keyed_by_the_questions_encoded_not_by_a_file_that_changed_since(tmp_path):
    """A question appended between reading the rows and keying the cache must not file the old rows' vectors
    under the grown file: every later call would read 4 vectors for 5 rows."""
    import json
    from types import SimpleNamespace

    from tqc.exemplars import load_exemplars
    from tqc.exemplar_cache import encoded_exemplars
    from tqc.registry import folder_digest

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights").write_bytes(b"w")
    exemplars, cache = tmp_path / "train.jsonl", tmp_path / "cache"
    exemplars.write_text("".join(json.dumps({"text": f"q{i}", "class_id": "loc"}) + "\n" for i in range(4)))
    encoded = []

    def encode(texts, description=""):
        encoded.append(list(texts))
        return torch.randn(len(texts), 8)  # (M, D)

    model = SimpleNamespace(question=SimpleNamespace(encode=encode, hidden_size=8))
    read_before = load_exemplars(exemplars)
    with exemplars.open("a", encoding="utf-8") as rows:
        rows.write(json.dumps({"text": "q4", "class_id": "loc"}) + "\n")
    digest = folder_digest(tmp_path / "model")
    assert encoded_exemplars(model, read_before, digest, exemplars, cache).shape == (4, 8)
    read_after = load_exemplars(exemplars)
    assert encoded_exemplars(model, read_after, digest, exemplars, cache).shape == (5, 8)
    assert encoded_exemplars(model, read_after, digest, exemplars, cache).shape == (5, 8)
    assert [len(texts) for texts in encoded] == [4, 5]  # the third call read the second's entry


def _counting_encoder(width: int = 8):
    """A stand-in for a BiEncoder whose question encoder counts the rows it encodes: (M, width) random vectors."""
    from types import SimpleNamespace

    encoded = []

    def encode(texts, description=""):
        encoded.append(len(texts))
        return torch.randn(len(texts), width)  # (M, D)

    return SimpleNamespace(question=SimpleNamespace(encode=encode, hidden_size=width)), encoded


def test_exemplar_vectors_are_read_from_a_whole_registered_entry_else_a_whole_cache_entry_else_encoded(tmp_path, caplog):
    """Where `_encoded_exemplars` reads its vectors: not cached without the weights' digest; a version's registered
    entry (any slot, this entry's key), never written to; else the cache's entry; else encoded and written to the
    cache. An entry that is damaged or does not fit (cut short, no vectors, NaN, another shape) is encoded again."""
    from safetensors.torch import load_file, save_file

    from tqc.schema import LabeledQuestion
    from tqc.exemplar_cache import cache_key, encoded_exemplars

    model, encoded = _counting_encoder()
    rows = [LabeledQuestion("where is paris", "loc"), LabeledQuestion("who wrote it", "hum")]
    digest, exemplars, cache, shipped = {"weights": "w"}, tmp_path / "train.jsonl", tmp_path / "cache", tmp_path / "shipped"
    slot, entry = cache_key(digest, rows, exemplars)
    cached = cache / f"{slot}-{entry}.safetensors"

    assert encoded_exemplars(model, rows, None, exemplars, cache).shape == (2, 8)  # no digest: encoded, not cached
    assert encoded == [2] and not cache.exists()

    shipped.mkdir()
    registered = torch.randn(2, 8)
    save_file({"vectors": registered}, str(shipped / f"{'0' * 16}-{entry}.safetensors"))  # slot: another file's path
    assert torch.equal(encoded_exemplars(model, rows, digest, exemplars, cache, shipped), registered)
    assert encoded == [2] and not cache.exists()

    said = f"{shipped}: no registered vectors for these weights, rows and encoding code; the exemplars are encoded"
    damaged = (shipped / f"{'0' * 16}-{entry}.safetensors").read_bytes()[:-9]
    (shipped / f"{'0' * 16}-{entry}.safetensors").write_bytes(damaged)
    with caplog.at_level("INFO", logger="tqc.exemplar_cache"):
        vectors = encoded_exemplars(model, rows, digest, exemplars, cache, shipped)
    assert encoded == [2, 2] and [r.getMessage() for r in caplog.records] == [said]
    assert (shipped / f"{'0' * 16}-{entry}.safetensors").read_bytes() == damaged  # the registered entry is never written
    assert [path.name for path in cache.iterdir()] == [cached.name] and torch.equal(load_file(cached)["vectors"], vectors)

    caplog.clear()
    with caplog.at_level("INFO", logger="tqc.exemplar_cache"):  # no registered folder: said, and the cache's entry is read
        assert torch.equal(encoded_exemplars(model, rows, digest, exemplars, cache, tmp_path / "nowhere"), vectors)
    assert encoded == [2, 2] and [r.getMessage() for r in caplog.records] == [said.replace(str(shipped), str(tmp_path / "nowhere"))]
    assert torch.equal(encoded_exemplars(model, rows, digest, exemplars, cache), vectors) and encoded == [2, 2]

    for bad in ({"vectors": torch.full((2, 8), float("nan"))}, {"other": torch.zeros(2, 8)}, {"vectors": torch.zeros(16)},
                {"vectors": torch.zeros(3, 8)}, {"vectors": torch.zeros(2, 8, dtype=torch.float64)}, None):
        if bad is None:
            cached.write_bytes(cached.read_bytes()[:-9])  # cut short
        else:
            save_file(bad, str(cached))
        again = encoded_exemplars(model, rows, digest, exemplars, cache)
        assert again.shape == (2, 8) and torch.equal(load_file(cached)["vectors"], again)  # encoded again, replaced
    assert encoded == [2, 2] + [2] * 6

    assert encoded_exemplars(model, rows, digest, exemplars, None).shape == (2, 8)  # no cache: encoded every call
    assert encoded[-1] == 2 and len(encoded) == 9


def test_registering_exemplar_vectors_hashes_the_exemplar_questions_once(tiny_model_dir, tmp_path, monkeypatch):
    """Promote's `_registered_vectors` keyed its entry, then `_encoded_exemplars` keyed it again: every exemplar
    question hashed twice. The key is passed along; the entry registered is the one a cache of the same rows holds."""
    from tqc import exemplar_cache, registry
    from tqc.schema import LabeledQuestion, save_questions

    torch.manual_seed(0)
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    save_questions(tmp_path / "train.jsonl", [LabeledQuestion("where is paris", "loc"), LabeledQuestion("who wrote it", "hum")])
    keyed = []
    real = exemplar_cache.cache_key
    for keys_in in (exemplar_cache, registry):  # where the entry is keyed to register it, and where it is written
        monkeypatch.setattr(keys_in, "cache_key", lambda *args: keyed.append(args) or real(*args))

    folder = registry._registered_vectors(tmp_path / "model", tmp_path / "train.jsonl", tmp_path / "registered")

    assert len(keyed) == 1
    slot, entry = real(*keyed[0])
    assert [path.name for path in folder.glob("*.safetensors")] == [f"{slot}-{entry}.safetensors"]


def test_a_model_folder_replaced_while_it_loads_keys_no_cache_entry(tiny_model_dir, tmp_path, user_cache, monkeypatch):
    """The key was the folder's digest taken after loading: a retrain replacing the folder meanwhile filed the old
    weights' vectors under the new weights, and every later call compared new questions with old exemplars."""
    from tqc.model.encoder import BiEncoder
    from tqc.schema import LabeledQuestion, save_questions

    torch.manual_seed(0)
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "train.jsonl", [LabeledQuestion("where is paris", "loc"), LabeledQuestion("who wrote it", "hum")])
    load = BiEncoder.load.__func__

    def load_then_retrain(cls, directory):
        model = load(cls, directory)
        (Path(directory) / "retrained.txt").write_text("new weights")  # the folder changes under the loaded model
        return model

    monkeypatch.setattr(BiEncoder, "load", classmethod(load_then_retrain))
    ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
           "--exemplars", str(tmp_path / "train.jsonl"), "where is the louvre"]
    assert main(ask) == 0
    assert not list(user_cache.glob("*.safetensors"))  # encoded, answered, and not cached


def test_an_exemplar_of_an_unknown_class_is_named_before_any_encoding_and_a_folder_is_no_file(tiny_model_dir, tmp_path,
                                                                                                  user_cache, capsys,
                                                                                                  monkeypatch):
    from tqc.model.encoder import TextEncoder

    torch.manual_seed(0)
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    (tmp_path / "train.jsonl").write_text('{"text": "where is paris", "class_id": "loc"}\n'
                                          '{"text": "what colour", "class_id": "colour"}\n')
    encode = TextEncoder.encode

    def no_exemplars(self, texts, batch_size=256, description="encoding"):
        assert description != "encoding exemplars", "the exemplars were encoded before their classes were checked"
        return encode(self, texts, batch_size, description)

    monkeypatch.setattr(TextEncoder, "encode", no_exemplars)
    ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
           "--exemplars", str(tmp_path / "train.jsonl"), "where is the louvre"]
    assert main(ask) == 2
    assert "train.jsonl:2: class 'colour' is not in the catalog" in capsys.readouterr().err
    assert not list(user_cache.glob("*.safetensors"))
    assert main([*ask[:3], "--catalog", str(tmp_path), "where is the louvre"]) == 2  # was IsADirectoryError's traceback
    assert f"{tmp_path}: no catalog there" in capsys.readouterr().err
    assert main([*ask, "--exemplar-cache", ""]) == 2  # Path("") was the working folder: entries landed there
    assert "--exemplar-cache is empty" in capsys.readouterr().err


def test_scores_that_are_nan_are_an_error_not_a_first_answer(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """torch.topk ranks NaN first, and json writes it as NaN, which no JSON reader accepts."""
    from tqc.model.encoder import BiEncoder
    from tqc.serving import local_matcher

    torch.manual_seed(0)
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    matcher = local_matcher(tmp_path / "model", tmp_path / "catalog.jsonl")
    monkeypatch.setattr(BiEncoder, "score", lambda self, q, s: torch.full((len(q), len(s)), float("nan")))
    with pytest.raises(ValueError, match=r"the model scores NaN for 2 question\(s\) \(row 0 first\)"):
        matcher.predict(None, ["where is it", "who is it"])
    # tqc predict says it in one line naming the model, not in a traceback
    assert main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"), "where is it"]) == 2
    assert f"tqc predict: error: --model {tmp_path / 'model'}: the model scores NaN" in capsys.readouterr().err


def test_a_file_that_is_no_catalog_is_an_error_naming_its_line_under_either_rule(tiny_model_dir, tmp_path, capsys):
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    (tmp_path / "questions.jsonl").write_text('{"text": "where is paris", "class_id": "loc", "source": "a.csv:2"}\n')
    (tmp_path / "twice.jsonl").write_text('{"class_id": "loc", "text": "Where?"}\n{"class_id": "loc", "text": "Where is it?"}\n')
    ask = ["predict", "--model", str(tmp_path / "model"), "where is paris"]
    for rule in ([], ["--exemplars", str(tmp_path / "questions.jsonl")]):
        assert main(ask + rule + ["--catalog", str(tmp_path / "questions.jsonl")]) == 2  # labeled questions, not a catalog
        assert "questions.jsonl, line 1: not a catalog line (unexpected source)" in capsys.readouterr().err
        assert main(ask + rule + ["--catalog", str(tmp_path / "twice.jsonl")]) == 2
        assert "twice.jsonl, line 2: class id 'loc' again (first on line 1)" in capsys.readouterr().err
        (tmp_path / "empty.jsonl").write_text("\n")
        assert main(ask + rule + ["--catalog", str(tmp_path / "empty.jsonl")]) == 2  # not an empty ranking for each question
        assert "empty.jsonl: no standard questions, so no question can be answered" in capsys.readouterr().err


def test_a_jsonl_catalog_row_with_no_words_is_refused_by_line_as_its_csv_twin_is(tiny_model_dir, tmp_path, capsys):
    """The CSV form was refused; the JSONL one answered with the class '' and the standard question '   '."""
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    ask = ["predict", "--model", str(tmp_path / "model"), "--prior", "none", "where is paris", "--catalog"]
    blank_text = '{"class_id": "loc", "text": "Where is it?"}\n\n{"class_id": "num", "text": "   "}\n'  # a blank line 2
    no_id = '{"class_id": "\\u200b", "text": "Who is it?"}\n'  # a zero-width space alone
    for text, said in ((blank_text, "line 3: catalog row unusable: text empty (no character a tokenizer reads): 'num'"),
                       (no_id, "line 1: catalog row unusable: class_id empty")):
        (tmp_path / "catalog.jsonl").write_text(text)
        assert main(ask + [str(tmp_path / "catalog.jsonl")]) == 2
        assert f"catalog.jsonl, {said}" in capsys.readouterr().err


def test_a_catalog_csv_written_as_data_custom_catalog_is_answered_with_as_its_jsonl_is(tiny_model_dir, tmp_path, capsys):
    """`--catalog my/catalog.csv` stopped at "line 1: not valid JSON": the CSV users write for data.custom.catalog is
    read by ingest's catalog reader, and a bad row of it is an error naming the file and the line."""
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    rows = "".join(f'{question.class_id},"{question.text}"\n' for question in CATALOG.questions)
    (tmp_path / "catalog.csv").write_text("class_id,text\n" + rows)
    ask = ["predict", "--model", str(tmp_path / "model"), "--top-k", "3", "where is paris", "who wrote it"]
    answers = []
    for catalog in ("catalog.jsonl", "catalog.csv"):
        assert main(ask + ["--catalog", str(tmp_path / catalog)]) == 0
        answers.append([json.loads(line) for line in capsys.readouterr().out.splitlines()])
    CATALOG.save(tmp_path / "catalog.json")  # the pipeline's JSONL under another name reads as it did
    assert main(ask + ["--catalog", str(tmp_path / "catalog.json")]) == 0
    answers.append([json.loads(line) for line in capsys.readouterr().out.splitlines()])
    assert answers[0] == answers[1] == answers[2] and len(answers[0]) == 2
    (tmp_path / "bad.csv").write_text("class_id,text\nloc,Where is it?\nhum,\n")
    assert main(ask + ["--catalog", str(tmp_path / "bad.csv")]) == 2
    assert f"{tmp_path / 'bad.csv'}, line 3: catalog row unusable" in capsys.readouterr().err
    # under data.custom's own column names, which predict does not read: said, with the ways out
    (tmp_path / "mine.csv").write_text("intent,standard\n" + rows)
    assert main(ask + ["--catalog", str(tmp_path / "mine.csv")]) == 2
    error = capsys.readouterr().err
    assert f"{tmp_path / 'mine.csv'}, line 1: missing column(s)" in error
    assert "not data.custom.catalog_id_column or catalog_text_column): rename them, or give the catalog the pipeline " \
           "wrote, data/validated/catalog.jsonl" in error
    (tmp_path / "exemplars.jsonl").write_text(json.dumps({"text": "where is the tower", "class_id": "loc"}) + "\n")
    assert main(ask + ["--catalog", str(tmp_path / "mine.csv"), "--exemplars", str(tmp_path / "exemplars.jsonl")]) == 2
    assert "rename them, or give the catalog the pipeline wrote" in capsys.readouterr().err  # the exemplar rule's too


def test_a_long_question_is_searched_for_a_word_a_piece_at_a_time_with_the_answer_normalising_it_whole_gives(
        monkeypatch):
    """`tqc predict` asks twice whether a question has a word, and normalised a 5 MB one whole each time (10 s): a
    piece cut before a space says as much, since normalising carries nothing across a space."""
    import random

    from tqc import text as text_module

    whole = lambda text: text_module._reads_a_word(text_module.normalise(text))  # noqa: E731, what has_words did
    rng = random.Random(0)
    tricky = [" ", " ", "\u0301", "\u0308", "\u00a8", "\u200b", "\ufffd", "\x01", "\ue000", "\u00a0", "\u3000", "e", "?",
              "'", "s", "\u1100", "\u1161", "\u00b2", "\ufb01", "\u2019"]
    monkeypatch.setattr(text_module, "WORD_SEARCH_CHARS", 1, raising=False)  # a piece at every space
    for _ in range(3000):
        sample = "".join(rng.choice(tricky) for _ in range(rng.randint(0, 10)))
        assert text_module.has_words(sample) == whole(sample), repr(sample)
    monkeypatch.undo()

    normalised, real = [], text_module.normalise
    monkeypatch.setattr(text_module, "normalise", lambda text: normalised.append(len(text)) or real(text))
    question = "where is paris " * 300_000  # 4.5 MB
    assert text_module.has_words(question) and max(normalised) < 5_000
    normalised.clear()
    no_word = "\u200b " * 100_000 + "\u0301 " * 100_000
    assert not text_module.has_words(no_word) and sum(normalised) == len(no_word)  # all of it searched, a piece at a time
    assert text_module.has_words(no_word + "why")


def test_the_served_model_refuses_a_missing_or_blank_question_and_names_its_row(tiny_model_dir, tmp_path):
    import pandas as pd

    from tqc.serving import local_matcher

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    matcher = local_matcher(tmp_path / "model", tmp_path / "catalog.jsonl", 1)
    asked = pd.DataFrame({"question": ["where is paris", None, float("nan"), "  ", 7, "\u200b \u2060"]})
    with pytest.raises(ValueError, match=r"row 1 \(None\), row 2 \(nan\), row 3 \('  '\), row 4 \(7\), row 5"):
        matcher.predict(None, asked)  # str() would have answered "None" and "nan" as questions
    assert matcher.predict(None, asked[:1])["class_id"].size == 1


# control characters, lone accents, U+FFFD, private use
TOKENLESS = ["\x00\x01", "\u0301\u0301", "\ufffd", "\x07 \u0301", "\ue000 \U000f0000"]


def test_a_question_with_no_character_the_tokenizer_reads_is_no_question(tiny_model_dir, tmp_path, caplog):
    """Not blank once normalised, yet tokenised as [CLS] [SEP] alone, as "" is: each was answered, all with one
    ranking and one confident score, the empty question's. The served model refuses them as blank ones, naming the
    row; `tqc predict` leaves them unscored with a warning naming the line; an exemplar file refuses such a text."""
    import pandas as pd

    from tqc.serving import local_matcher

    torch.manual_seed(0)
    model = tiny_bi_encoder(tiny_model_dir).eval()
    model.save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    with torch.no_grad():  # the premise: the tokenizer reads nothing in them
        assert torch.allclose(model.question.encode(TOKENLESS), model.question.encode([""] * len(TOKENLESS)).float())
    matcher = local_matcher(tmp_path / "model", tmp_path / "catalog.jsonl", 1)
    with pytest.raises(ValueError, match=r"non-blank text: row 1 \('\\x00\\x01'\), row 2 .*row 3 .*row 4"):
        matcher.predict(None, pd.DataFrame({"question": ["where is paris", *TOKENLESS, "où est-ce é"]}))

    (tmp_path / "odd.txt").write_text("\n".join(["where is paris", *TOKENLESS, "who wrote it"]) + "\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="tqc.predict_command"):
        assert main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
                     "--file", str(tmp_path / "odd.txt")]) == 0
    assert "odd.txt: line(s) 2, 3, 4, 5, 6 have no question: not scored" in caplog.text

    (tmp_path / "exemplars.jsonl").write_text('{"text": "where is paris", "class_id": "loc"}\n'
                                              '{"text": "\\u0007", "class_id": "hum"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="exemplars.jsonl, line 2: an exemplar needs non-empty string fields"):
        local_matcher(tmp_path / "model", tmp_path / "catalog.jsonl", 1, None, (tmp_path / "exemplars.jsonl", 1))


def test_a_question_past_the_length_bound_is_refused_by_row_or_line_before_it_is_tokenised(tiny_model_dir, tmp_path,
                                                                                           capsys, monkeypatch):
    """A 2 MB question was tokenised whole, twice, to be cut to max_length tokens: 9 s and 1.1 GB of a served process.
    The matcher refuses one past MAX_QUESTION_CHARS naming its row, and `tqc predict` names the argument or the line
    before any model is loaded (the model path below is no model at all)."""
    import pandas as pd

    from tqc import serving
    from tqc.serving import local_matcher

    monkeypatch.setattr(serving, "MAX_QUESTION_CHARS", 50)
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    matcher = local_matcher(tmp_path / "model", tmp_path / "catalog.jsonl", 1)
    long = "where " * 9  # 54 characters
    with pytest.raises(ValueError, match=r"at most 50 characters \(the model reads only its first tokens\): row 1 \(54 "):
        matcher.predict(None, pd.DataFrame({"question": ["where is paris", long]}))
    assert len(matcher.predict(None, pd.DataFrame({"question": ["where is paris", long[:50]]}))) == 2

    (tmp_path / "asked.txt").write_text(f"where is paris\n{long}\nwho wrote it\n{long}\n", encoding="utf-8")
    assert main(["predict", "--model", str(tmp_path / "nowhere"), "--file", str(tmp_path / "asked.txt"), "who", long]) == 2
    said = capsys.readouterr().err
    assert "at most 50 characters" in said and "question argument(s) 2; " in said and "asked.txt: line(s) 2, 4" in said
    assert "nowhere" not in said  # refused before the model was looked for


def test_an_exemplar_cache_that_cannot_be_written_costs_time_not_the_answers(tiny_model_dir, tmp_path, capsys, caplog):
    from tqc.schema import LabeledQuestion, save_questions

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "train.jsonl", [LabeledQuestion("where is paris", "loc"), LabeledQuestion("who wrote it", "hum")])
    (tmp_path / "a-file").write_text("not a folder")  # so no cache folder can be made under it, root or not
    ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
           "--exemplars", str(tmp_path / "train.jsonl"), "where is the louvre"]
    assert main([*ask, "--exemplar-cache", "none"]) == 0
    uncached = capsys.readouterr().out
    with caplog.at_level("WARNING", logger="tqc.exemplar_cache"):
        assert main([*ask, "--exemplar-cache", str(tmp_path / "a-file" / "cache")]) == 0
    assert capsys.readouterr().out == uncached
    assert "a-file/cache not written" in caplog.text


def test_exemplar_vectors_cached_by_other_encoding_code_are_not_served(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """The cache was keyed by the weights and the questions alone: after a change to how tqc encodes (f3f0ddc's cls
    pooling), `tqc predict --exemplars` answered from vectors the old code made."""
    from tqc import exemplar_cache
    from tqc.schema import LabeledQuestion, save_questions

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "train.jsonl", [LabeledQuestion("where is paris", "loc"), LabeledQuestion("who wrote it", "hum")])
    ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"), "--exemplars",
           str(tmp_path / "train.jsonl"), "--exemplar-cache", str(tmp_path / "cache"), "where is the louvre"]
    assert main(ask) == 0
    first, = (tmp_path / "cache").glob("*.safetensors")
    code = exemplar_cache.encoding_code()
    monkeypatch.setattr(exemplar_cache, "encoding_code", lambda: {**code, "encoder": "another version of encoder.py"})
    assert main(ask) == 0
    second, = (tmp_path / "cache").glob("*.safetensors")  # encoded again, in place of the old entry
    assert second.name != first.name and second.name.split("-")[0] == first.name.split("-")[0]
    capsys.readouterr()


def test_the_exemplar_cache_key_names_the_tokenizers_library_too(monkeypatch):
    """A fast tokenizer's ids come from the `tokenizers` library, which upgrades apart from transformers (within the
    range transformers takes): vectors encoded under another release of it were served from the cache and from a
    version's registered vectors, keyed as if nothing had changed."""
    import tokenizers

    from tqc import exemplar_cache

    before = exemplar_cache.encoding_code()
    monkeypatch.setattr(tokenizers, "__version__", "0.0.1-another")
    assert exemplar_cache.encoding_code() != before


def test_blank_lines_of_a_question_file_are_named_and_stdin_is_read_as_utf8_bytes(tiny_model_dir, tmp_path, capsys, caplog,
                                                                                monkeypatch):
    """A line of whitespace or invisible characters alone is no question (the served model refuses one), so it is not
    scored, and said with its line, since the answers then no longer line up with the file's lines. stdin is decoded
    as UTF-8 whatever the locale says; a stray byte is read as the readers read one in a training file (Windows-1252),
    with a warning naming its line, and a UTF-16 file with its byte-order mark is read as UTF-16: it was an error
    ("not UTF-8 text") for plain text, while a .csv --file was read."""
    import io
    import sys

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl")]
    (tmp_path / "gappy.txt").write_text("where is paris\n\n\u200b \u2060\nwho wrote it\n", encoding="utf-8")

    with caplog.at_level("WARNING", logger="tqc.predict_command"):
        assert main([*ask, "--file", str(tmp_path / "gappy.txt")]) == 0
    assert [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()] == ["where is paris", "who wrote it"]
    assert "gappy.txt: line(s) 2, 3 have no question: not scored" in caplog.text

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("où est-ce\n".encode()), encoding="ascii"))  # a C locale
    assert main([*ask, "--file", "-"]) == 0
    assert [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()] == ["où est-ce"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("fine\ncaf\xe9 \u00e9\n".encode("utf-8").replace(b"\xc3\xa9 ", b"\xe9 ", 1)),
                                                     encoding="utf-8"))  # a stray Latin-1 é beside a UTF-8 one
    caplog.clear()
    with caplog.at_level("WARNING", logger="tqc.readers"):
        assert main([*ask, "--file", "-"]) == 0
    assert [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()] == ["fine", "caf\u00e9 \u00e9"]
    assert "stdin: line(s) 2 not valid UTF-8" in caplog.text
    (tmp_path / "notepad-unicode.txt").write_bytes("\ufeffwhere is paris\r\nwho wrote it\r\n".encode("utf-16-le"))
    assert main([*ask, "--file", str(tmp_path / "notepad-unicode.txt")]) == 0
    assert [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()] == ["where is paris", "who wrote it"]


def test_prior_auto_says_when_the_model_folder_has_no_prior_file_beside_it(tiny_model_dir, tmp_path, capsys):
    """A model folder copied without the prior.json beside it ranks unlike the version served with its shift:
    said on stderr, not silently."""
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "copied" / "stage_two")
    CATALOG.save(tmp_path / "catalog.jsonl")
    assert main(["predict", "--model", str(tmp_path / "copied" / "stage_two"), "--catalog", str(tmp_path / "catalog.jsonl"),
                 "where is paris"]) == 0
    assert "no prior.json beside" in capsys.readouterr().err


def test_predict_scores_a_long_file_in_chunks_with_the_answers_of_one_pass(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """A file is scored PREDICT_CHUNK questions at a time (bounded memory, streamed output); the answers are the
    one-pass answers, in the file's order, for each rule."""
    from tqc import predict_command

    torch.manual_seed(0)
    tiny_bi_encoder(tiny_model_dir).eval().save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    questions = [f"{w} is number {i}" for i, w in enumerate(["where", "who", "how many"] * 4)]
    (tmp_path / "questions.txt").write_text("\n".join(questions) + "\n", encoding="utf-8")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": t, "class_id": c}) + "\n" for t, c in
                                                  [("where is rome", "loc"), ("who is she", "hum"), ("how many dogs", "num")]))
    base = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"), "--top-k", "3",
            "--file", str(tmp_path / "questions.txt")]
    from tqc.serving import StandardQuestionMatcher

    scored = []
    one_call = StandardQuestionMatcher.predict
    monkeypatch.setattr(StandardQuestionMatcher, "predict",
                        lambda self, context, frame, params=None: scored.append(len(frame)) or one_call(self, context, frame, params))
    for rule in ([], ["--exemplars", str(tmp_path / "train.jsonl"), "--exemplar-k", "1", "--exemplar-cache", "none"]):
        answers = {}
        for chunk in (len(questions), 5):  # one pass, then chunks of 5, 5 and 2
            monkeypatch.setattr(predict_command, "PREDICT_CHUNK", chunk)
            scored.clear()
            assert main(base + rule) == 0
            assert scored == ([12] if chunk == len(questions) else [5, 5, 2])
            answers[chunk] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [r["text"] for r in answers[5]] == questions
        for one_pass, chunked in zip(answers[len(questions)], answers[5]):
            assert [a["class_id"] for a in chunked["top_k"]] == [a["class_id"] for a in one_pass["top_k"]]
            assert [a["score"] for a in chunked["top_k"]] == pytest.approx([a["score"] for a in one_pass["top_k"]], abs=1e-5)


def test_the_exemplar_cache_keeps_the_entries_used_last_and_forgets_older_models(tiny_model_dir, tmp_path, monkeypatch):
    """Each retrain is a new model folder, so its entries are new ones: the folder once grew by one entry a model for
    good. It keeps the EXEMPLAR_CACHE_ENTRIES used last; an entry read is used, so it outlives older writes."""
    import os

    from tqc import exemplar_cache
    from tqc.schema import LabeledQuestion

    monkeypatch.setattr(exemplar_cache, "EXEMPLAR_CACHE_ENTRIES", 3)
    cache = tmp_path / "cache"
    torch.manual_seed(0)
    model = tiny_bi_encoder(tiny_model_dir).eval()
    rows = [LabeledQuestion("where is paris", "loc"), LabeledQuestion("who wrote it", "hum")]
    for n in range(4):  # four models' entries, each a second later than the one before
        exemplar_cache.encoded_exemplars(model, rows, {"weights": f"model {n}"}, tmp_path / "train.jsonl", cache)
        for entry in cache.glob("*.safetensors"):
            os.utime(entry, (entry.stat().st_mtime - 1, entry.stat().st_mtime - 1))
    assert len(list(cache.glob("*.safetensors"))) == 3  # model 0's went
    first_kept = min(cache.glob("*.safetensors"), key=lambda entry: entry.stat().st_mtime)
    read = exemplar_cache.encoded_exemplars(model, rows, {"weights": "model 1"}, tmp_path / "train.jsonl", cache)
    assert read.shape == (2, model.question.encode(["x"]).shape[1])
    exemplar_cache.encoded_exemplars(model, rows, {"weights": "model 4"}, tmp_path / "train.jsonl", cache)
    kept = {entry.name for entry in cache.glob("*.safetensors")}
    assert len(kept) == 3 and first_kept.name in kept  # model 1's was read last-but-one, so model 2's went instead


def test_the_exemplar_cache_touches_no_file_of_its_folder_but_its_own_and_replaces_an_entry_of_another_width(
        tiny_model_dir, tmp_path, capsys):
    """Its clean-up globbed *.safetensors, so a folder given as --exemplar-cache lost its checkpoints; an entry that
    loaded but did not fit the model (another width, integers) failed every call with a traceback, or scored 0."""
    from safetensors.torch import load_file, save_file

    from tqc.schema import LabeledQuestion, save_questions

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "train.jsonl", [LabeledQuestion("where is paris", "loc"), LabeledQuestion("who wrote it", "hum")])
    cache = tmp_path / "cache"
    cache.mkdir()
    others = [cache / f"checkpoint-{i:02d}.safetensors" for i in range(20)]  # more than the cache keeps
    for other in others:
        save_file({"w": torch.zeros(1)}, str(other))
    ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"), "--exemplars",
           str(tmp_path / "train.jsonl"), "--exemplar-cache", str(cache), "where is the louvre"]
    assert main(ask) == 0
    first = capsys.readouterr().out
    assert all(other.exists() for other in others)
    (entry,) = [path for path in cache.glob("*.safetensors") if path not in others]
    save_file({"vectors": torch.zeros(2, 10)}, str(entry))  # loads, finite, 2 rows: another model's width
    assert main(ask) == 0 and capsys.readouterr().out == first
    assert load_file(entry)["vectors"].shape[1] == 32  # encoded again and replaced
    save_file({"vectors": torch.zeros(2, 32, dtype=torch.int64)}, str(entry))
    assert main(ask) == 0 and capsys.readouterr().out == first


def test_tied_scores_are_ranked_in_catalog_order_as_evaluate_ranks_them(tiny_model_dir, tmp_path, caplog):
    """torch.topk keeps no order among ties (at 50 classes it put the later class first); evaluate's argmax and
    stable sort put the first in catalog order. Two classes with one standard question tie exactly, and the matcher
    says so when it loads: a catalog handed to `tqc predict --catalog` was never validated."""
    import pandas as pd

    from tqc.serving import local_matcher

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    texts = [f"question number {i} about topic {i}" for i in range(60)]
    texts[3] = texts[49] = "who is it"
    Catalog([StandardQuestion(f"c{i:02d}", text) for i, text in enumerate(texts)]).save(tmp_path / "catalog.jsonl")
    with caplog.at_level(logging.WARNING, logger="tqc.serving"):
        matcher = local_matcher(tmp_path / "model", tmp_path / "catalog.jsonl", top_k=2)
    shared = [r.getMessage() for r in caplog.records if "share one standard question" in r.getMessage()]
    assert len(shared) == 1 and f"{tmp_path / 'catalog.jsonl'}: 1 group(s)" in shared[0] and ": c03 = c49; " in shared[0]
    answers = matcher.predict(None, pd.DataFrame({"question": ["who is it"]}), {"top_k": 2})
    ranked = answers["class_id"].tolist()
    scores = dict(zip(answers["class_id"], answers["score"]))
    assert scores["c03"] == scores["c49"]  # an exact tie
    assert ranked == ["c03", "c49"]  # the catalog's first first
    # every class tied: an unstable sort of 60 equal scores put c45 first, where one tied pair kept its order by chance
    import torch

    matcher.model.score = lambda questions, standards: torch.zeros(questions.shape[0], standards.shape[0])  # (N, P)
    everything = matcher.predict(None, pd.DataFrame({"id": [7], "question": ["who is it"]}), {"top_k": 60})
    assert everything["class_id"].tolist() == [f"c{i:02d}" for i in range(60)]
    assert set(everything["question"]) == {"who is it"}  # the "question" column, not the first (the request's id)


def test_classes_whose_standard_questions_read_alike_are_named_when_the_matcher_loads(tiny_model_dir, tmp_path, caplog):
    """As validate compares texts (case, spacing aside), each group once; a catalog of distinct texts says nothing."""
    from tqc.serving import local_matcher

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    alike = Catalog([StandardQuestion("a", "Who is it?"), StandardQuestion("b", "What is it?"),
                     StandardQuestion("c", "  who  is IT ?"), StandardQuestion("d", "what is it?"),
                     StandardQuestion("e", "Where is it?")])
    alike.save(tmp_path / "alike.jsonl")
    CATALOG.save(tmp_path / "catalog.jsonl")
    with caplog.at_level(logging.WARNING, logger="tqc.serving"):
        local_matcher(tmp_path / "model", tmp_path / "catalog.jsonl")
        assert not [r for r in caplog.records if "share one standard question" in r.getMessage()]
        local_matcher(tmp_path / "model", tmp_path / "alike.jsonl")
    shared = [r.getMessage() for r in caplog.records if "share one standard question" in r.getMessage()]
    assert len(shared) == 1 and "2 group(s)" in shared[0] and ": a = c; b = d; give each class its own text" in shared[0]


def test_a_model_folder_whose_tokenizer_files_are_gone_is_refused_not_answered_with_unknown_words(tiny_model_dir, tmp_path):
    """Without tokenizer.json and vocab.txt a tokenizer of its special tokens alone still loaded, every word [UNK], and
    the model answered wrongly with exit 0."""
    import shutil

    from tqc.config import ConfigError
    from tqc.model.encoder import TextEncoder

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    TextEncoder.from_pretrained(str(folder))  # whole: loads
    for name in ("tokenizer.json", "vocab.txt"):
        (folder / name).unlink(missing_ok=True)
    with pytest.raises(ConfigError, match=r"its tokenizer has \d+ tokens where the model has \d+: the tokenizer files "
                                          r"\(tokenizer.json, vocab.txt\) are missing or not this model's"):
        TextEncoder.from_pretrained(str(folder))


def test_answers_piped_into_a_reader_that_stops_early_end_without_an_error(tiny_model_dir, tmp_path):
    """`tqc predict --file … | head -1` printed `error: [Errno 32] Broken pipe` and exited 1 after every answer it
    could write."""
    import subprocess
    import sys

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    (tmp_path / "questions.txt").write_text("".join(f"where is city number {i}\n" for i in range(3000)))
    command = (f"{sys.executable} -m tqc.cli predict --model {tmp_path / 'model'} --catalog {tmp_path / 'catalog.jsonl'} "
               f"--file {tmp_path / 'questions.txt'} | head -1")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
    assert len(done.stdout.splitlines()) == 1 and json.loads(done.stdout)["text"] == "where is city number 0"
    assert "Broken pipe" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_nc_baselines_folder_is_named_as_such_not_as_a_broken_model(tmp_path, capsys):
    """It said "tqc_model.json: not a saved model's config (no tied, similarity)" of the baseline_nc stage's folder."""
    (tmp_path / "nc").mkdir()
    (tmp_path / "nc" / "tqc_model.json").write_text('{"kind": "linear_classifier", "classes": 3, "class_ids": ["a", "b", "c"]}')
    CATALOG.save(tmp_path / "catalog.jsonl")
    assert main(["predict", "--model", str(tmp_path / "nc"), "--catalog", str(tmp_path / "catalog.jsonl"), "q"]) == 2
    assert "the NC baseline (a linear head over the encoder), which tqc predict does not serve" in capsys.readouterr().err


def test_a_model_folder_the_system_fails_to_read_is_said_in_a_line_not_ended_silently(tiny_model_dir, tmp_path, capsys,
                                                                                     monkeypatch):
    """A broken pipe while loading the model was said as a folder with "no model that loads"; kept a BrokenPipeError,
    `tqc predict` would end silently, taking it for a reader of its answers that stopped early."""
    import transformers

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")

    def fails(*_, **__):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", fails)
    capsys.readouterr()
    assert main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"), "q"]) == 1
    error = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(error) == 1 and error[0].startswith("tqc predict: error: model.pretrained: ")
    assert "question_encoder' could not be read (BrokenPipeError: [Errno 32] Broken pipe)" in error[0]


EIGHT_TOKENS = "where is paris where is paris"  # [CLS], six words, [SEP]: exactly model.max_length 8, so not cut
NINE_TOKENS = EIGHT_TOKENS + " where"


def _cut_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "longer than model.max_length" in r.getMessage()]


def test_the_served_model_says_once_which_questions_it_cuts_at_max_length(tiny_model_dir, tmp_path, caplog):
    """A question longer than model.max_length was cut to its first tokens without a word: one warning per call
    names how many and their rows, and the setting with its value; a question of exactly max_length tokens is not cut."""
    import pandas as pd

    from tqc.serving import local_matcher

    torch.manual_seed(0)
    tiny_bi_encoder(tiny_model_dir, max_length=8).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    matcher = local_matcher(tmp_path / "model", tmp_path / "catalog.jsonl", 1)
    tokens = matcher.model.question.tokenizer([EIGHT_TOKENS, NINE_TOKENS])["input_ids"]
    assert [len(t) for t in tokens] == [8, 9]  # the premise, untruncated
    asked = ["where is paris", NINE_TOKENS, EIGHT_TOKENS, NINE_TOKENS + " is paris"]
    with caplog.at_level("WARNING", logger="tqc.serving"):
        answers = matcher.predict(None, pd.DataFrame({"question": asked}))
    assert len(answers) == 4
    assert _cut_warnings(caplog) == ["2 question(s) longer than model.max_length (8 tokens, the model's setting when it "
                                     "was trained) are cut to their first 8 tokens, and answered from those alone: "
                                     "row(s) 1, 3"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="tqc.serving"):
        matcher.predict(None, pd.DataFrame({"question": ["where is paris", EIGHT_TOKENS]}))
    assert _cut_warnings(caplog) == []


def test_predict_says_once_which_arguments_and_lines_it_cuts_at_max_length(tiny_model_dir, tmp_path, capsys, caplog,
                                                                          monkeypatch):
    """By their arguments and the file's lines, across all the chunks a file is scored in, and not again by rows."""
    from tqc import predict_command

    torch.manual_seed(0)
    tiny_bi_encoder(tiny_model_dir, max_length=8).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    (tmp_path / "long.txt").write_text("\n".join(["who wrote it", NINE_TOKENS, "", EIGHT_TOKENS, NINE_TOKENS,
                                                  "how many cats"]) + "\n", encoding="utf-8")
    monkeypatch.setattr(predict_command, "PREDICT_CHUNK", 2)
    with caplog.at_level("WARNING"):
        assert main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
                     NINE_TOKENS, "where is paris", "--file", str(tmp_path / "long.txt")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 7
    assert _cut_warnings(caplog) == ["3 question(s) longer than model.max_length (8 tokens, the model's setting when it "
                                     "was trained) are cut to their first 8 tokens, and answered from those alone: "
                                     f"question argument(s) 1; {tmp_path / 'long.txt'}: line(s) 2, 5"]


def test_a_model_folder_with_damaged_weights_stops_predict_and_mine_in_one_line(tiny_model_dir, tmp_path, capsys,
                                                                                 monkeypatch):
    """A model.safetensors cut short was safetensors' traceback from `tqc predict` and from every stage that loads it."""
    from tqc.schema import LabeledQuestion, save_questions

    monkeypatch.chdir(tmp_path)
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    weights = tmp_path / "model" / "question_encoder" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    CATALOG.save(tmp_path / "data" / "catalog.jsonl")
    save_questions(tmp_path / "data" / "train.jsonl", [LabeledQuestion("where is paris", "loc", "train:1")])
    params = Path(__file__).resolve().parents[2] / "params.yaml"
    for command in (["predict", "--model", "model", "--catalog", "data/catalog.jsonl", "where is paris"],
                    ["--params", str(params), "--set", "tracking.enabled=false", "mine", "--data", "data", "--train",
                     "data/train.jsonl", "--model", "model", "--out", "negatives.jsonl", "--report", "mine.json"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert f"error: {weights.relative_to(tmp_path)}: damaged, not a whole safetensors file (" in err
        assert "Traceback" not in err and len([line for line in err.splitlines() if "error" in line]) == 1


def test_a_folder_that_is_no_model_is_named_with_no_word_on_a_prior_first(tmp_path, capsys):
    """`--model models` (the folder above the model) said "no prior.json beside models: ranking by similarity alone",
    and then that it was no model folder: a ranking it never made, said before the error that stopped it."""
    (tmp_path / "models").mkdir()
    CATALOG.save(tmp_path / "catalog.jsonl")
    assert main(["predict", "--model", str(tmp_path / "models"), "--catalog", str(tmp_path / "catalog.jsonl"), "q"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"tqc predict: error: {tmp_path / 'models'}: not a tqc model folder (no tqc_model.json; `dvc repro` writes "
        "models/stage_two)"]


def test_a_question_argument_that_is_not_utf8_is_read_as_a_files_line_would_be(tiny_model_dir, tmp_path, capsys, caplog):
    """A Latin-1 terminal's "é" reaches Python as a lone surrogate (argv's surrogateescape), which the tokenizer
    refused with a TypeError and a traceback; the same bytes in a --file were read as Windows-1252, with a warning."""
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    arguments = [b.decode("utf-8", "surrogateescape") for b in (b"where is caf\xe9", b"\xff\xfe where")]  # as sys.argv
    with caplog.at_level("WARNING", logger="tqc.readers"):
        assert main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
                     "who wrote it", *arguments]) == 0
    assert [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()] == [
        "who wrote it", "where is café", "ÿþ where"]  # FF FE: Latin-1 text, not a file's UTF-16 byte-order mark
    assert "question argument 2: not valid UTF-8; read its invalid bytes as Windows-1252" in caplog.text
    assert "question argument 3: not valid UTF-8" in caplog.text


def test_answers_reach_a_stdout_whose_encoding_cannot_hold_them_as_json_escapes(tiny_model_dir, tmp_path, monkeypatch):
    """Under a Latin-1 locale (or PYTHONIOENCODING=latin-1) a question in Chinese ended in a UnicodeEncodeError and a
    traceback, after the answers before it were printed; the JSON lines now escape what the stream cannot encode."""
    import io
    import sys

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    latin1 = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    monkeypatch.setattr(sys, "stdout", latin1)
    assert main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
                 "where is café", "巴黎在哪里 where"]) == 0
    latin1.flush()
    lines = latin1.buffer.getvalue().decode("latin-1").splitlines()
    assert [json.loads(line)["text"] for line in lines] == ["where is café", "巴黎在哪里 where"]


def test_a_prior_that_is_a_folder_is_refused_in_a_line_naming_the_option(tiny_model_dir, tmp_path, capsys):
    """`--prior models` said "[Errno 21] Is a directory: 'models'" and exited 1, as a passing fault; a --file,
    --catalog or --exemplars that is a folder is an input error naming its option or what it should hold (exit 2)."""
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    capsys.readouterr()  # building the model's progress bars
    assert main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
                 "--prior", str(tmp_path), "where is it"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"tqc predict: error: --prior {tmp_path}: not a file (`dvc repro` "
                                                     "writes models/prior.json; --prior none: no shift)"]


def test_an_empty_column_is_refused_not_read_as_the_default_one(tmp_path, capsys):
    """`--column "$COL"` with COL unset read the `text` column, another than the one asked for, and said nothing.
    Refused with the header, before any model is loaded."""
    (tmp_path / "batch.csv").write_text("text,utterance\nwhere is paris,who wrote it\n")
    assert main(["predict", "--model", str(tmp_path / "nowhere"), "--file", str(tmp_path / "batch.csv"),
                 "--column", ""]) == 2
    assert "batch.csv, line 1: missing column(s) ['']: the header has ['text', 'utterance']" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/dev/fd").is_dir(), reason="no /dev/fd: the shell's process substitution names one")
def test_a_question_file_that_is_a_pipe_is_read(tiny_model_dir, tmp_path, capsys):
    """`--file <(cut -f1 batch.tsv)`, the shell's process substitution, names a pipe (/dev/fd/63), which was refused
    as "not a file"; a folder still is."""
    import os

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    read_end, write_end = os.pipe()
    os.write(write_end, b"where is paris\nwho wrote it\n")
    os.close(write_end)
    try:
        assert main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
                     "--file", f"/dev/fd/{read_end}"]) == 0
    finally:
        os.close(read_end)
    assert [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()] == ["where is paris", "who wrote it"]


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_question_file_that_is_a_device_is_refused_before_it_is_read(tmp_path, monkeypatch, capsys):
    """Reading a pipe let any path that is neither a folder nor missing be read: `--file /dev/zero` read until memory
    ran out (a MemoryError traceback). A device is refused as "not a file", as before pipes were read."""
    def never(self):
        raise AssertionError(f"read {self}")

    monkeypatch.setattr(Path, "read_bytes", never)  # the old code's endless read, stopped at once
    for device in ("/dev/zero", "/dev/null"):
        assert main(["predict", "--model", str(tmp_path / "nowhere"), "--file", device]) == 2, device
        assert capsys.readouterr().err.splitlines() == [f"tqc predict: error: --file {device}: not a file"]


def test_encoding_reads_a_file_stdin_and_a_csv_catalog_in_another_codec_as_their_utf8_copies_read(
        tiny_model_dir, tmp_path, capsys, monkeypatch):
    """A GBK file from a Chinese Excel was answered as Windows-1252 mojibake with a warning: `--encoding` names its
    codec, as data.custom.encoding does for training files, for --file, stdin and a .csv --catalog."""
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    questions = ["如何预防感染？", "疫苗安全吗？"]
    catalog = "class_id,text\nprevention,怎样保护自己免受感染？\nvaccine,疫苗安全吗？\n"
    for codec in ("utf-8", "gbk"):
        (tmp_path / codec).mkdir()
        (tmp_path / codec / "asked.txt").write_bytes("\n".join(questions).encode(codec))
        (tmp_path / codec / "asked.csv").write_bytes(("text\n" + "\n".join(questions) + "\n").encode(codec))
        (tmp_path / codec / "catalog.csv").write_bytes(catalog.encode(codec))

    def answers(codec: str, file: str, *encoding: str) -> list[dict]:
        folder = tmp_path / codec
        ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(folder / "catalog.csv"), *encoding]
        assert main(ask + ["--file", str(folder / file)]) == 0, capsys.readouterr().err
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    for file in ("asked.txt", "asked.csv"):
        expected = answers("utf-8", file)
        assert [record["text"] for record in expected] == questions
        assert answers("gbk", file, "--encoding", "gbk") == expected
        assert [record["text"] for record in answers("gbk", file)] != questions  # undeclared: read as UTF-8 with strays
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("\n".join(questions).encode("gbk"))))
    assert main(["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "gbk" / "catalog.csv"),
                 "--encoding", "GBK", "--file", "-"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == answers("utf-8", "asked.txt")


def test_encoding_misspelt_or_a_byte_its_codec_cannot_read_is_an_error_naming_the_option_or_the_line(
        tiny_model_dir, tmp_path, capsys):
    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    (tmp_path / "asked.txt").write_bytes("where is it?\n".encode() + b"who \x80 is it?\n")
    ask = ["predict", "--model", str(tmp_path / "model"), "--catalog", str(tmp_path / "catalog.jsonl"),
           "--file", str(tmp_path / "asked.txt")]
    assert main(ask + ["--encoding", "gkb"]) == 2
    assert "--encoding 'gkb': no codec of that name" in capsys.readouterr().err
    assert main(ask + ["--encoding", "gbk"]) == 2  # 0x80 starts no GBK character
    assert f"{tmp_path / 'asked.txt'}, line 2" in capsys.readouterr().err


def _args(**overrides):
    """`tqc predict`'s arguments, as its parser gives them."""
    import argparse

    base = dict(questions=["is it safe?"], file=None, column=None, encoding=None, model="no-such-model",
                tracking_uri=None, catalog=None, prior="auto", top_k=None, exemplars=None, exemplar_k=None,
                exemplar_cache=None)
    return argparse.Namespace(**{**base, **overrides})


def test_a_model_folder_answers_three_by_default(monkeypatch):
    from tqc import predict_command

    seen = {}
    monkeypatch.setattr(predict_command, "_matcher", lambda ns: seen.setdefault("args", ns))
    predict_command._local_answers(_args())
    assert seen["args"].top_k == 3


def test_top_k_zero_is_refused_before_any_model_is_read():
    from tqc import predict_command
    from tqc.config import ConfigError

    with pytest.raises(ConfigError, match="--top-k 0: must be at least 1"):
        predict_command.run(_args(top_k=0))


def test_a_table_suffix_in_upper_case_is_refused_as_a_table(tmp_path):
    from tqc import predict_command
    from tqc.config import ConfigError

    path = tmp_path / "batch.JSON"
    path.write_text('[{"text": "hi"}]\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="no plain text"):
        predict_command._question_file_lines(path, None)


def test_an_empty_column_with_a_plain_file_is_refused(tmp_path):
    from tqc import predict_command
    from tqc.config import ConfigError

    path = tmp_path / "q.txt"
    path.write_text("is it safe?\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="--column ''"):
        predict_command._question_file_lines(path, "")


def test_a_matcher_says_which_classes_it_can_answer_with_under_either_rule(tiny_model_dir, tmp_path):
    """The promotion gate judges a challenger that answers classes the champion cannot on the classes both answer:
    every catalog class under the standard rule, only those with an exemplar under the exemplar rule."""
    from tqc.schema import LabeledQuestion, save_questions
    from tqc.serving import local_matcher

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "model")
    CATALOG.save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "train.jsonl", [LabeledQuestion("where is the tower", "loc"),
                                              LabeledQuestion("who wrote it", "hum")])
    standard = local_matcher(tmp_path / "model", tmp_path / "catalog.jsonl")
    assert standard.answerable_class_ids() == CATALOG.class_ids
    exemplars = local_matcher(tmp_path / "model", tmp_path / "catalog.jsonl", exemplars=(tmp_path / "train.jsonl", 1))
    assert exemplars.answerable_class_ids() == ["loc", "hum"] != CATALOG.class_ids
