"""Atomic writes: all or nothing, and files as readable as any other the user writes."""

import os
import pickle
import stat

import pytest

from tqc.io import DataFileError, atomic_directory, atomic_path, name_within_limit, read_json, read_jsonl, write_json, write_jsonl, write_text


@pytest.mark.parametrize("umask, file_mode, folder_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750),
                                                          (0o002, 0o664, 0o775)])  # a shared group's: writable by it
def test_atomic_files_and_folders_follow_the_umask_not_the_temp_file_mode(tmp_path, umask, file_mode, folder_mode):
    previous = os.umask(umask)
    try:
        write_json(tmp_path / "report.json", {"a": 1})
        with atomic_directory(tmp_path / "model") as staging:
            (staging / "weights.safetensors").write_bytes(b"x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "report.json").stat().st_mode) == file_mode  # mkstemp alone gives 0o600
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == folder_mode  # mkdtemp alone gives 0o700


@pytest.mark.parametrize("umask, readable", [(0o022, 0o644), (0o027, 0o640)])
def test_files_a_writer_makes_private_are_readable_as_the_umask_allows(tmp_path, umask, readable):
    """safetensors' save_file (exemplar cache entries) and save_pretrained (model.safetensors) write 0600 files:
    other users of a shared cache, registry or DVC cache could not read the weights."""
    import torch
    from safetensors.torch import save_file

    from tqc.io import atomic_path

    previous = os.umask(umask)
    try:
        with atomic_path(tmp_path / "entry.safetensors") as tmp:
            save_file({"vectors": torch.zeros(2, 3)}, str(tmp))
        with atomic_directory(tmp_path / "model") as staging:
            (staging / "encoder").mkdir()
            save_file({"w": torch.zeros(2)}, str(staging / "encoder" / "model.safetensors"))
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "entry.safetensors").stat().st_mode) == readable
    assert stat.S_IMODE((tmp_path / "model" / "encoder" / "model.safetensors").stat().st_mode) == readable


def test_a_rewritten_file_or_folder_keeps_its_mode_and_group(tmp_path, monkeypatch):
    """A rewrite renamed a new file in with the umask's mode and the writer's group: a 0600 file was left 0644, readable
    by every user, and a file shared through its group (0660, group g) lost that group."""
    private, shared, model = tmp_path / "private.json", tmp_path / "shared.json", tmp_path / "model"
    write_json(private, {"a": 1})
    private.chmod(0o600)
    write_json(shared, {"a": 1})
    os.chown(shared, -1, 4321)  # the tests run as root, which may set any group
    shared.chmod(0o660)
    model.mkdir()
    os.chown(model, -1, 4321)
    model.chmod(0o2770)  # setgid: files made in it take its group
    previous = os.umask(0o022)
    try:
        write_json(private, {"a": 2})
        write_json(shared, {"a": 2})
        with atomic_directory(model) as staging:
            (staging / "weights.safetensors").write_bytes(b"x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and read_json(private) == {"a": 2}
    assert (stat.S_IMODE(shared.stat().st_mode), shared.stat().st_gid) == (0o660, 4321)
    assert (stat.S_IMODE(model.stat().st_mode), model.stat().st_gid) == (0o2770, 4321)
    assert (model / "weights.safetensors").read_bytes() == b"x"

    def not_yours(*arguments):
        raise PermissionError(1, "Operation not permitted")

    readable = tmp_path / "readable.json"
    write_json(readable, {"a": 1})
    os.chown(readable, -1, 4321)
    readable.chmod(0o644)
    monkeypatch.setattr(os, "chown", not_yours)  # a group the writer is not in: the mode is still kept
    write_json(readable, {"a": 3})
    assert stat.S_IMODE(readable.stat().st_mode) == 0o644 and read_json(readable) == {"a": 3}
    # but not the group's write: 0660 for group 4321 is not 0660 for the writer's own group, which may be every user's
    write_json(shared, {"a": 3})
    assert (stat.S_IMODE(shared.stat().st_mode), shared.stat().st_gid) == (0o600, os.getgid())
    assert read_json(shared) == {"a": 3}
    previous = os.umask(0o022)
    try:
        write_json(tmp_path / "new.json", {"a": 1})  # a file written for the first time still follows the umask
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644


def test_a_rewritten_file_never_keeps_a_setuid_or_setgid_bit(tmp_path):
    """A rewrite copied every mode bit of the file it replaced: another user's setuid file, rewritten by root, came
    back a setuid file owned by root. The rewrite is the writer's file, so its setuid and setgid bits go."""
    tool = tmp_path / "tool.json"
    write_json(tool, {"a": 1})
    os.chown(tool, 1234, 1234)  # the tests run as root, which may give a file to any user
    tool.chmod(0o6755)
    write_json(tool, {"a": 2})
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755 and read_json(tool) == {"a": 2}


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path):
    write_jsonl(tmp_path / "rows.jsonl", [{"a": 1}])

    def rows_then_crash():
        yield {"a": 2}
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_jsonl(tmp_path / "rows.jsonl", rows_then_crash())
    assert read_jsonl(tmp_path / "rows.jsonl") == [{"a": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]


def test_an_atomic_folder_replaces_the_old_one_whole_and_leaves_nothing_beside_it(tmp_path):
    with atomic_directory(tmp_path / "model") as staging:
        (staging / "old.safetensors").write_bytes(b"old")
    with atomic_directory(tmp_path / "model") as staging:
        (staging / "new.safetensors").write_bytes(b"new")
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["new.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    with pytest.raises(RuntimeError):
        with atomic_directory(tmp_path / "model") as staging:
            (staging / "half.safetensors").write_bytes(b"x")
            raise RuntimeError("killed mid-save")
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["new.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_an_atomic_write_reaches_the_disk_before_the_rename_and_the_rename_after(tmp_path, monkeypatch):
    import os

    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(b))), real_replace(a, b))[1])
    path = tmp_path / "manifest.jsonl"

    write_text(path, "new\n")

    assert path.read_text() == "new\n"
    kinds = [kind for kind, _ in events]
    assert kinds == ["fsync", "replace", "fsync"]
    assert events[0][1].startswith(str(tmp_path / ".manifest.jsonl.")) and events[2][1] == str(tmp_path)


def test_an_atomic_folder_reaches_the_disk_before_the_rename_and_the_rename_after(tmp_path, monkeypatch):
    """A model folder saved just before a power loss must not come back holding empty weights."""
    import os
    from pathlib import Path

    events = []
    real_fsync, real_rename = os.fsync, Path.rename
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1])
    monkeypatch.setattr(Path, "rename", lambda self, target: (events.append(("rename", str(target))), real_rename(self, target))[1])
    (tmp_path / "model").mkdir()  # an older model: renamed aside, then deleted

    with atomic_directory(tmp_path / "model") as staging:
        (staging / "encoder").mkdir()
        (staging / "encoder" / "model.safetensors").write_bytes(b"weights")
        (staging / "tqc_model.json").write_text("{}")

    assert (tmp_path / "model" / "encoder" / "model.safetensors").read_bytes() == b"weights"
    first_rename = next(i for i, (kind, _) in enumerate(events) if kind == "rename")
    synced_before = {Path(p).name for kind, p in events[:first_rename] if kind == "fsync"}
    assert {"model.safetensors", "tqc_model.json", "encoder"} <= synced_before  # every file, and its folder
    assert events[-1] == ("fsync", str(tmp_path))  # the renames themselves, before returning


def test_tree_digests_walk_linked_sub_folders_follow_no_cycle_and_filter_by_suffix(tmp_path):
    from tqc.io import file_digest, tree_digests

    model, elsewhere = tmp_path / "model", tmp_path / "elsewhere"
    (model / "question_encoder").mkdir(parents=True)
    elsewhere.mkdir()
    (model / "question_encoder" / "model.safetensors").write_bytes(b"question")
    (model / "config.json").write_text("{}")
    (elsewhere / "model.safetensors").write_bytes(b"standard")
    (model / "standard_encoder").symlink_to(elsewhere, target_is_directory=True)
    (model / "question_encoder" / "loop").symlink_to(model, target_is_directory=True)  # a cycle of one link
    (elsewhere / "back").symlink_to(model, target_is_directory=True)  # and of two: model → elsewhere → model

    every_file = tree_digests(model)
    assert list(every_file) == ["config.json", "question_encoder/model.safetensors", "standard_encoder/model.safetensors"]
    assert every_file["standard_encoder/model.safetensors"] == file_digest(elsewhere / "model.safetensors", "sha256")
    assert list(tree_digests(model, ".safetensors")) == ["question_encoder/model.safetensors",
                                                        "standard_encoder/model.safetensors"]
    assert tree_digests(tmp_path / "absent") == {}


def test_the_registry_digest_of_a_model_folder_changes_with_a_linked_encoder(tmp_path):
    from tqc.registry import folder_digest

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.safetensors").write_bytes(b"before")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "standard_encoder").symlink_to(elsewhere, target_is_directory=True)
    before = folder_digest(tmp_path / "model")
    (elsewhere / "model.safetensors").write_bytes(b"after")  # the linked encoder trained again
    assert before and folder_digest(tmp_path / "model") != before


def test_a_jsonl_file_that_is_not_utf8_is_an_error_naming_the_line_of_its_first_bad_byte(tmp_path):
    """A text-mode read fails on a chunk, so its own error's position says nothing of the line."""
    from tqc.io import numbered_jsonl

    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"text": "fine"}\n' * 3000 + b'{"text": "caf\xe9"}\n')  # the bad byte past the first chunk
    with pytest.raises(ValueError, match=r"mixed\.jsonl, line 3001: not UTF-8 text \(invalid continuation byte, byte 0xe9"):
        numbered_jsonl(path)


def test_a_folder_that_cannot_take_its_place_leaves_the_old_one_where_it_was(tmp_path, monkeypatch):
    """The old model is renamed aside before the new one is renamed in: if that second rename fails, the old
    one must be back at its path, not left hidden beside it with nothing at the path."""
    from pathlib import Path

    with atomic_directory(tmp_path / "model") as staging:
        (staging / "old.safetensors").write_bytes(b"old")
    real_rename = Path.rename

    def refuse_the_new_folder(self, target):
        if self.name.startswith(".model.") and not self.name.endswith(".old") and Path(target) == tmp_path / "model":
            raise OSError("disk went read-only")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", refuse_the_new_folder)
    with pytest.raises(OSError, match="read-only"):
        with atomic_directory(tmp_path / "model") as staging:
            (staging / "new.safetensors").write_bytes(b"new")
    assert (tmp_path / "model" / "old.safetensors").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_jsonl_file_that_is_not_json_is_an_input_error_said_in_one_line(tmp_path, capsys):
    """A bad line in a pipeline file is the user's data, not a crash: exit 2 and the file and line, no traceback."""
    from tqc import cli

    (tmp_path / "train.jsonl").write_text('{"text": "where is it?", "class_id": "LOC"}\n{"text": broken\n')
    (tmp_path / "test.jsonl").write_text('{"text": "who is it?", "class_id": "HUM"}\n')
    code = cli.main(["augment", "--train", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "out.jsonl"),
                     "--report", str(tmp_path / "augment.json"), "--held-out", str(tmp_path / "test.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and f"{tmp_path / 'train.jsonl'}, line 2: not valid JSON" in err and "Traceback" not in err


def test_a_file_written_where_a_folder_is_fails_first_and_leaves_nothing_beside_it(tmp_path):
    """`--out /tmp`: the temporary file was made in the folder's parent, and the write failed only at the rename."""
    from tqc.io import atomic_path

    folder = tmp_path / "reports"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match="a folder, where a file is to be written"):
        with atomic_path(folder):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports"]


def test_an_os_error_is_one_line_and_exit_1_not_a_traceback(tmp_path, capsys, monkeypatch):
    from tqc import bench
    from tqc.cli import main

    out = tmp_path / "report.json"

    def reading(rows: int) -> dict:  # --out is checked before the benchmark; a folder made there while it ran
        out.mkdir()
        return {"rows": rows}

    monkeypatch.setattr(bench, "reading", reading)
    assert main(["--set", "tracking.enabled=false", "bench", "read", "--rows", "1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"tqc bench: error: [Errno 21] a folder, where a file is to be written: '{out}'" in err
    assert "Traceback" not in err


def test_a_champion_that_cannot_answer_is_one_line_and_exit_1_not_a_traceback(capsys, monkeypatch):
    """`tqc promote` against a broken champion: the message already names the version and the way out."""
    from tqc import cli
    from tqc.stages.promote import ChampionUnavailable

    def unavailable(args):
        raise ChampionUnavailable("tqc-admc v1, the champion, cannot answer the validation questions (…); challenger "
                                  "v2 is registered and not judged")

    monkeypatch.setattr(cli, "dispatch", unavailable)
    assert cli.main(["promote", "--data", "d", "--model", "m", "--prior", "p", "--report", "r"]) == 1
    err = capsys.readouterr().err
    assert "tqc promote: error: tqc-admc v1, the champion, cannot answer" in err and "Traceback" not in err



def test_a_name_past_the_folders_limit_is_cut_short_by_characters_keeping_its_suffix_and_apart_from_its_neighbours(tmp_path):
    assert name_within_limit(tmp_path, "short.csv") == "short.csv"
    first, second = (name_within_limit(tmp_path, "质" * 100 + end + ".csv") for end in ("a", "b"))
    assert first != second  # the same start: kept apart by the hash of the whole name
    for name in (first, second):
        assert len(name.encode()) <= 255 and name.endswith(".csv") and name.startswith("质")
        (tmp_path / name).write_text("x")  # a name the system takes
    assert len(name_within_limit(tmp_path, "a" * 250, spare=14).encode()) <= 241


def test_an_atomic_write_to_a_name_near_the_limit_succeeds(tmp_path):
    target = tmp_path / ("a" * 250)  # mkstemp's dot, random part and .tmp took it past 255
    with atomic_path(target) as tmp:
        tmp.write_text("whole")
    assert target.read_text() == "whole" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_json_file_that_cannot_be_read_is_named_and_a_bom_is_taken(tmp_path):
    (tmp_path / "bad.json").write_text('{"a": 1,}')
    with pytest.raises(DataFileError, match=rf"^{tmp_path / 'bad.json'}: not valid JSON \(Expecting property name"):
        read_json(tmp_path / "bad.json")
    (tmp_path / "latin.json").write_bytes('{"a": "é"}'.encode("latin-1"))
    with pytest.raises(DataFileError, match=rf"^{tmp_path / 'latin.json'}: not UTF-8 text \(byte 7: "):
        read_json(tmp_path / "latin.json")
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + b'{"a": 1}')
    assert read_json(tmp_path / "bom.json") == {"a": 1}
    with pytest.raises(DataFileError) as failure:
        read_json(tmp_path / "bad.json")
    # the reason alone, for callers that name the file with what it should hold; whole again once pickled
    assert failure.value.reason.startswith("not valid JSON (")
    assert str(pickle.loads(pickle.dumps(failure.value))) == str(failure.value)


def test_a_link_to_a_folder_above_the_root_is_not_followed(tmp_path):
    """Not only a link back to a folder on the walk's path: one to any folder above the root would walk the root again."""
    from tqc.io import tree_digests

    outer = tmp_path / "outer"
    root = outer / "root"
    root.mkdir(parents=True)
    (outer / "other.safetensors").write_bytes(b"o")
    (root / "w.safetensors").write_bytes(b"w")
    (root / "up").symlink_to(outer, target_is_directory=True)
    assert list(tree_digests(root, ".safetensors")) == ["w.safetensors"]


def test_json_files_are_valid_json_with_nan_and_infinity_written_as_null(tmp_path):
    """Python wrote NaN (a warm-up curve's epoch 0 loss) as `NaN`, which strict JSON parsers refuse: the file is a DVC
    metrics file that other tools read."""
    import json
    import math

    import numpy as np

    write_json(tmp_path / "report.json", {"loss": math.nan, "nested": [{"high": math.inf, "low": -math.inf}],
                                          "kept": 0.5, "pair": (1.0, np.float64("nan"))})
    text = (tmp_path / "report.json").read_text(encoding="utf-8")
    assert "NaN" not in text and "Infinity" not in text

    def refuse(constant):
        raise ValueError(constant)

    assert json.loads(text, parse_constant=refuse) == {"loss": None, "nested": [{"high": None, "low": None}],
                                                        "kept": 0.5, "pair": [1.0, None]}


def test_the_errors_bad_input_causes_share_one_base_that_tqc_and_the_retrain_flow_catch():
    """`tqc.errors.input_errors` was a list of ten classes: one more place a new input error had to be added, else
    `tqc` printed its traceback (exit 1) and the retrain flow retried it three times."""
    from tqc.config import ConfigError
    from tqc.errors import InputError, input_errors
    from tqc.incoming import UnreadableReference
    from tqc.io import DataFileError
    from tqc.launched import LaunchedInputError
    from tqc.prior import PriorFileError
    from tqc.readers import MissingColumns, ReaderError, RowsRejected
    from tqc.schema import StaleClassifier, StaleNegatives, UnknownClass
    from tqc.stages.validate import ValidationFailed

    for error in (ConfigError, UnreadableReference, DataFileError, LaunchedInputError, PriorFileError, ReaderError,
                  MissingColumns, RowsRejected, StaleClassifier, StaleNegatives, UnknownClass, ValidationFailed):
        assert issubclass(error, input_errors()), error
    assert input_errors() == (InputError,)
