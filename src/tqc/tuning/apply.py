"""`tqc tune --apply`: a study's best values written into params.yaml in place, its comments and layout kept, refused
where they were tuned on another dataset or would make the params invalid."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import ValidationError

from tqc.config import ConfigError, Params, YAMLError, flatten, params_of, problems, read_params_mapping, read_yaml, utf8_text_of
from tqc.io import write_text
from tqc.text import first_of
from tqc.tuning.reports import trained_with
from tqc.tuning.space import same_value

log = logging.getLogger("tqc.tune")  # one logger for tuning, whichever module says it


def _layout_keeping_yaml():
    """ruamel round-trip YAML that rewrites nothing but the values set: no re-wrapping of long flow
    lists, quotes and `null` kept, floats with a dot (1.0e-05: YAML 1.1 readers, PyYAML among them, read 1e-05
    as a string)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.representer import RoundTripRepresenter

    class Representer(RoundTripRepresenter):  # add_representer writes to its class: this one's, not every ruamel user's
        pass                                   # in the process (DVC's `exp run -S` writes params.yaml with it too)

    editor = YAML()
    editor.Representer = Representer
    editor.width = 1_000_000
    editor.preserve_quotes = True
    editor.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))

    def represent_float(representer, value: float):
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if e and "." not in mantissa:
            text = f"{mantissa}.0e{exponent}"
        return representer.represent_scalar("tag:yaml.org,2002:float", text)

    editor.representer.add_representer(float, represent_float)
    return editor


def _study_summary(best_params_file: Path) -> dict:
    """The study's summary.json beside `best_params_file`, {} where there is none (a file written by hand, or copied
    alone) or it is unreadable: then nothing says where or with what it was tuned."""
    try:
        summary = json.loads((best_params_file.parent / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _check_tuned_dataset(best_params_file: Path, params_file: Path, summary: dict, dataset: str | None) -> None:
    """Refuse values tuned on another dataset (the study's `summary` says which): a study run with
    `--set data.dataset=…` leaves params.yaml's dataset as it was, and `dvc repro` would train that one with them."""
    tuned_on = summary.get("dataset")
    if tuned_on is not None and tuned_on != dataset:
        summary_file = best_params_file.parent / "summary.json"
        raise ConfigError(f"{best_params_file}: tuned on data.dataset {tuned_on!r} ({summary_file}), but {params_file} "
                          f"trains {dataset!r}: set data.dataset: {tuned_on} in {params_file} first, or tune on {dataset!r}")


def _warn_of_untuned_changes(best_params_file: Path, params_file: Path, summary: dict, current: dict,
                             tuned: dict) -> None:
    """Say which of the other params the study trained with (`summary`'s trained_with) `params_file` now holds
    otherwise (an epoch count, a similarity): the tuned values were chosen beside those, and `dvc repro` will train
    them beside these. Said, not refused, since a change can be meant (more epochs for the final run)."""
    trained = summary.get("trained_with")
    if not isinstance(trained, dict):  # an older study's summary
        return
    differ = [f"{key}: {value!r} there, {current.get(key)!r} here" for key, value in sorted(trained.items())
              if key not in tuned and key in current and not same_value(current[key], value)]
    if differ:
        log.warning("tune --apply: %s was tuned with other values of params it did not search than %s holds (%s): "
                    "its validation figures measured them, not these", best_params_file, params_file,
                    first_of(differ, 8, "; "))


def apply_best(best_params_file: Path, params_file: Path = Path("params.yaml")) -> dict:
    """Write the tuned values into params.yaml in place, keeping its comments and layout; returns those that changed
    (a value equal to the current one, `0.0001` for `1.0e-4` say, is left as written)."""
    best = _tuned_values(best_params_file)
    sections = read_params_mapping(params_file)  # not YAML, empty or no mapping: one line naming it, as load_params says
    editor = _layout_keeping_yaml()
    document = editor.load(utf8_text_of(params_file))  # the same file, read again to keep its layout in the edit
    _check_against_the_study(best_params_file, params_file, sections, best)
    changed = _set_tuned_values(document, best, best_params_file, params_file)
    if changed:  # else left as it was, as said: a round trip would re-wrap a long line, unescape a "\xD7"
        _write_if_valid(editor, document, best_params_file, params_file)
    return changed


def _tuned_values(best_params_file: Path) -> dict:
    """best_params.yaml's values as flat 'section.key' ones, refused in one line where it is not params.yaml's layout."""
    try:
        best = read_yaml(utf8_text_of(best_params_file)) or {}
    except YAMLError as exc:
        raise ConfigError(f"{best_params_file}: not YAML ({exc})") from None
    if not isinstance(best, dict):
        raise ConfigError(f"{best_params_file}: expected params.yaml's layout (section: {{key: value}}), "
                          f"not a {type(best).__name__}")
    return flatten(best)


def _check_against_the_study(best_params_file: Path, params_file: Path, sections: dict, best: dict) -> None:
    """Hold `best` against the study's summary.json beside it: values tuned on another dataset are refused, and the
    params the study trained with that `params_file` (its `sections`, as read) holds otherwise are said."""
    summary = _study_summary(best_params_file)
    data = sections.get("data")  # `data: null` or a scalar is refused with the other problems once the values are in
    _check_tuned_dataset(best_params_file, params_file, summary, data.get("dataset") if isinstance(data, dict) else None)
    try:  # params.yaml's values, defaults filled in, as the study's were recorded
        current = trained_with(Params.model_validate(sections))
    except ValidationError:  # refused with its problems below, once the tuned values are in
        current = {}
    _warn_of_untuned_changes(best_params_file, params_file, summary, current, best)


def _set_tuned_values(document, best: dict, best_params_file: Path, params_file: Path) -> dict:
    """Set each flat 'section.key' value of `best` in the loaded params `document`; returns those that changed. A key
    `params_file` does not hold is refused: nothing is added."""
    changed = {}
    for path, value in best.items():
        node = document
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.get(key) if hasattr(node, "get") else None
        if not hasattr(node, "get") or leaf not in node:
            raise ConfigError(f"{best_params_file}: {path!r} is not in {params_file}")
        if not same_value(node[leaf], value):
            node[leaf] = changed[path] = value
    return changed


def _write_if_valid(editor, document, best_params_file: Path, params_file: Path) -> None:
    """Write `document` to `params_file` with `editor` (its layout kept), refused before touching the file where the
    params it holds are invalid."""
    from io import StringIO

    text = StringIO()
    editor.dump(document, text)
    try:
        params_of(read_yaml(text.getvalue()))
    except ValidationError as exc:  # refuse before touching params.yaml
        raise ConfigError(f"{best_params_file}: applying it would make {params_file} invalid:\n{problems(exc)}") from None
    # through a link to its target: replacing the link itself would leave the shared file untouched, a copy in its place
    write_text(params_file.resolve(), text.getvalue())

