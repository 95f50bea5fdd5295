"""Python snippets of the docs, run as written against the code's real signatures (the long calls stubbed)."""

import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_block_after(doc: Path, words: str) -> str:
    """The first ```python block after `words` in `doc`."""
    text = doc.read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", text[text.index(words):], re.S).group(1)


def test_tracking_md_tunes_from_python_as_written(monkeypatch, capsys):
    """`tqc.tune.tune(tqc.config.load_params("params.yaml"))` imported neither module: a NameError as written."""
    import tqc.tune
    from tqc.config import Params

    called = []

    def tune(*args, **kwargs):  # the real one trains for minutes a trial: its arguments are checked against it
        bound = inspect.signature(real).bind(*args, **kwargs)
        assert isinstance(bound.arguments["params"], Params)
        called.append(bound.arguments)
        return tqc.tune.TuneResult("tqc-admc", {"mine": {"k": 7}}, {})

    real = tqc.tune.tune
    monkeypatch.setattr(tqc.tune, "tune", tune)
    monkeypatch.chdir(ROOT)
    exec(python_block_after(ROOT / "docs" / "tracking.md", "From Python, without DVC"), {})
    assert len(called) == 1 and called[0]["trials"] == 2
    assert capsys.readouterr().out == "{'mine': {'k': 7}}\n"
