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


def commit(message: str) -> str:
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return git_commit(CODE)


def test_the_tuners_code_version_names_an_edited_trees_edits_and_a_docs_only_commit_is_the_same_code(tmp_path,
                                                                                                     monkeypatch):
    """A trial keeps the code version it trained with, and a repeat reuses only a trial of the same code: '-dirty' alone
    names no code (two edits of one commit), and a commit of docs alone moves HEAD, not the code."""
    from tqc.tracking import code_version, same_code

    monkeypatch.chdir(tmp_path)
    git("init", "-q")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text("x = 1\n")
    first = commit("one")
    assert code_version() == first and same_code(first, first)
    (tmp_path / "src" / "model.py").write_text("x = 2\n")
    edited = code_version()
    assert edited.startswith(f"{first}-dirty:") and code_version() == edited  # one edit: one version
    (tmp_path / "src" / "model.py").write_text("x = 3\n")
    assert code_version().startswith(f"{first}-dirty:") and code_version() != edited
    assert not same_code(edited, first) and not same_code(first, code_version())
    (tmp_path / "src" / "model.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("docs\n")
    docs = commit("docs")
    assert docs != first and same_code(first, docs) and same_code(docs, first)
    (tmp_path / "src" / "model.py").write_text("x = 4\n")
    fixed = commit("a fix")
    assert not same_code(docs, fixed)
    # not a version: not recorded, outside a checkout, one this checkout lacks, one git would read as an option
    assert not same_code(None, fixed) and not same_code("unknown", "unknown")
    assert not same_code("f" * 40, fixed) and not same_code("--output=x", fixed)
