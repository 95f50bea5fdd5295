"""The scripts under scripts/ import tqc's names inside their functions, which no test runs: a renamed function
(`serving.served_top1`, now `served_first_answers`) left scripts/score_registered.py failing at its first call."""

import ast
import importlib
import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def tqc_imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) of every `from tqc… import name` in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tqc":
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
    return found


def test_every_name_a_script_imports_from_tqc_is_there():
    scripts = sorted(SCRIPTS.glob("*.py"))
    assert scripts, "no scripts found: this test checks nothing"
    missing = [f"{path.name}:{line}: {module}.{name}" for path in scripts for module, name, line in tqc_imports(path)
               if not hasattr(importlib.import_module(module), name)
               and importlib.util.find_spec(f"{module}.{name}") is None]
    assert missing == []
