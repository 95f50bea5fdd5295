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


def test_docs_force_one_stage_only_with_single_item():
    """`dvc repro -f promote` reruns every stage upstream of promote too (DVC forces the whole pipeline up to its
    target unless -s): docs/tracking.md told a user to register in a local registry that way, which retrains all."""
    forced = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for span in re.findall(r"`(dvc repro[^`]*)`", doc.read_text(encoding="utf-8")):
            words = span.split()  # an inline span may break across lines
            if {"-f", "--force"} & set(words) and any(not w.startswith("-") for w in words[2:]):
                forced.append((doc.name, " ".join(words)))
    assert forced  # the docs do force single stages; each must say -s
    assert [f for f in forced if not {"-s", "--single-item"} & set(f[1].split())] == []


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", re.sub(r"```.*?```", "", markdown, flags=re.S), re.M):
        base = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, repeat = base, 0
        while anchor in anchors:
            repeat += 1
            anchor = f"{base}-{repeat}"
        anchors.add(anchor)
    return anchors


def test_every_link_to_a_docs_heading_finds_it():
    # The docs' sections are renamed as results come in; a README row's link must not go dead silently.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    dead = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
            linked = (page.parent / target).resolve() if target else page
            if linked.suffix == ".md" and anchor not in github_anchors(linked.read_text(encoding="utf-8")):
                dead.append(f"{page.relative_to(ROOT)} → {target or page.name}#{anchor}")
    assert dead == []
