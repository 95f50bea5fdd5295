"""The code version recorded with every result: dirty only when the code or config is."""

import subprocess

from tqc.tracking import CODE, git_commit


def git(*arguments):
    subprocess.run(["git", *arguments], check=True, capture_output=True)


def test_outputs_rewritten_by_a_run_do_not_make_the_code_dirty(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    git("init", "-q")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text("x = 1\n")
    (tmp_path / "dvc.lock").write_text("a\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git_commit()
    assert len(head) == 40 and not head.endswith("-dirty")
    (tmp_path / "dvc.lock").write_text("b\n")  # what dvc repro does on its way to evaluate
    assert git_commit() == head
    (tmp_path / "params.yaml").write_text("seed: 1\n")
    git("add", "params.yaml")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "two")
    head = git_commit()
    (tmp_path / "params.yaml").write_text("seed: 2\n")  # what `dvc exp run -S` does: the config, not the code
    assert git_commit() == f"{head}-dirty" and git_commit(CODE) == head
    (tmp_path / "src" / "model.py").write_text("x = 2\n")
    assert git_commit() == git_commit(CODE) == f"{head}-dirty"
