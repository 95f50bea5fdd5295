"""Values read from a command line, shared by the tqc CLI and the flows' scripts: `--set` and `--where` overrides,
read as YAML 1.2 as `dvc exp run -S` reads them, and whole numbers with a floor (argparse types)."""

from __future__ import annotations

import argparse
import datetime
import json
import re

from tqc.config import ConfigError

# Mappings whose own keys are dotted param paths: tune.space.stage_two.loss={choices: [...]} is one search
# dimension, ablate.budget.stage_one.epochs=1 one budget entry. Below these, a --set key is not split further.
PATH_KEYED = re.compile(r"(tune\.space|ablate\.budget|ablate\.grids\.[^.]+\.(?:budget|base|matrix)"
                        r"|ablate\.grids\.[^.]+\.variants\.[^.]+)\.(.+)")


def override_value(item: str, value: str):
    """A `--set` value as YAML 1.2 reads it, as `dvc exp run -S` and Hydra do (YAML 1.1 read 010 as 8, 1e-4 as text
    and yes as true). Text stays text where YAML would read more into it: a `#` (a comment to YAML: `trec6 #2` lost
    its `#2`), a mapping not written {…} (`paraphrase: ` is a prefix, not a key), a date."""
    from tqc.config import YAMLError, read_yaml

    commented = re.search(r"(^|\s)#", value) is not None
    try:
        parsed = read_yaml(value)  # params.yaml's own reader
    except YAMLError as exc:
        if commented:
            return value
        raise ConfigError(f"--set {item!r}: the value is not YAML ({exc})") from None
    if commented and "#" not in json.dumps(parsed, ensure_ascii=False, default=str):  # YAML dropped it as a comment
        return value
    if isinstance(parsed, dict) and not value.lstrip().startswith("{") or isinstance(parsed, (datetime.date, datetime.time)):
        return value
    return parsed


def where_filters(items: list[str]) -> dict:
    """`--where KEY=VALUE …` → {dotted key: value}, the cells a command keeps. A key given twice is refused: the last
    value alone was kept, so a slice asked for was dropped unsaid."""
    from tqc.config import flatten

    keys = [item.partition("=")[0].strip() for item in items]
    repeated = sorted({key for key in keys if key and keys.count(key) > 1})
    if repeated:
        raise ConfigError(f"--where {repeated[0]} is given more than once: a cell has one value of it (run once per value)")
    return flatten(parse_overrides(items, option="--where"))


def parse_overrides(items: list[str], option: str = "--set") -> dict:
    """['stage_one.epochs=5', …] → nested overrides; values are read as YAML 1.2 (5 → int, [a] → list; `override_value`)."""
    from tqc.config import Replace, unflatten

    flat, keyed = {}, []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            example = "data.imbalance_ratio=50" if option == "--where" else "stage_one.epochs=5"
            raise ConfigError(f"{option} {item!r}: expected KEY=VALUE, e.g. {option} {example}")
        parsed = override_value(item, value)
        if isinstance(parsed, dict):  # a mapping given whole replaces the one there, as `key=value` reads
            parsed = Replace(parsed)
        if match := PATH_KEYED.fullmatch(key):
            keyed.append((match.group(1), match.group(2), parsed))
        else:
            flat[key] = parsed
    overrides = unflatten(flat)
    for mapping, param_path, value in keyed:
        node = overrides
        for part in mapping.split("."):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {mapping}.{param_path}: {mapping} is also set to {node!r}; give one of them")
        node[param_path] = value
    return overrides


def at_least_zero(text: str) -> int:
    """argparse type for indices: a negative worker index would make a negative sampler seed."""
    return _at_least(text, 0)


def at_least_one(text: str) -> int:
    """argparse type for counts: 0 would mean 'no cap' or 'the default' further down, never what was asked."""
    return _at_least(text, 1)


def at_least_two(text: str) -> int:
    """argparse type for batch sizes: a batch of one has no in-batch negative (the stages' params refuse it too)."""
    return _at_least(text, 2)


def _at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:  # argparse would say "invalid at_least_one value", naming this function
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value}: must be at least {low}")
    return value
