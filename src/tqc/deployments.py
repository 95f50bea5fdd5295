"""The build step of prefect.yaml: `prefect deploy` refuses parameters that a deployment's flow does not take.

Prefect checks a schedule's parameters nowhere before the schedule fires: a misspelt one (`mode: trian`, `mdoe: train`)
deployed, and the nightly run failed at 02:00. The step checks every deployment of the file being deployed, its own
`parameters` and each schedule's, against its entrypoint flow's parameters, and names the file, the deployment, the
schedule and the parameter of each problem. Not checked: parameters given on the command line (`--param`), values Prefect
fills in from a template (`{{ prefect.variables.… }}`, `{{ $ENV }}`), and a deployment with a `build:` of its own, which
replaces this one (tests/flows/test_deployments.py holds the shipped file to that).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_FILE = "prefect.yaml"


class DeploymentParametersError(ValueError):
    """A deployment's or a schedule's parameters that its flow does not take."""


def check_parameters(prefect_file: str | None = None) -> dict[str, str]:
    """The build step. `prefect_file`: the file to check, by default the one `prefect deploy --prefect-file` names (the
    step runs in that command's process, and Prefect tells a step nothing of the file), else prefect.yaml."""
    import yaml

    path = Path(prefect_file or _deployed_file(sys.argv))
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    problems = [problem for deployment in (config.get("deployments") or []) if isinstance(deployment, dict)
                for problem in _deployment_problems(deployment)]
    if problems:
        raise DeploymentParametersError("\n".join(f"{path}: {problem}" for problem in problems))
    return {"checked": str(path)}


def _deployed_file(argv: list[str]) -> str:
    """The --prefect-file of a `prefect deploy` command line, else prefect.yaml."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--prefect-file", default=DEFAULT_FILE)
    return parser.parse_known_args(argv[1:])[0].prefect_file


def _deployment_problems(deployment: dict) -> list[str]:
    """Every problem of one deployment's parameters and its schedules'; none where it names no entrypoint (given on the
    command line instead, and loaded by Prefect itself)."""
    where = f"deployment {deployment.get('name')!r}"
    entrypoint = deployment.get("entrypoint")
    if not entrypoint:
        return []
    try:
        schema = _parameter_schema(entrypoint)
    except Exception as error:  # a file or function that is not there: Prefect's error names no deployment
        return [f"{where}: entrypoint {entrypoint!r} does not load ({type(error).__name__}: {error})"]
    schedules = deployment.get("schedules") or []
    if deployment.get("schedule"):  # the older single schedule, which Prefect 3 still deploys
        schedules = [*schedules, deployment["schedule"]]
    given = [(where, deployment.get("parameters"))]
    given += [(f"{where}, schedule {schedule.get('slug') or index}", schedule.get("parameters"))
              for index, schedule in enumerate(schedules) if isinstance(schedule, dict)]
    return [problem for place, parameters in given for problem in _refused(place, parameters, schema)]


def _parameter_schema(entrypoint: str) -> dict:
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    return parameter_schema(load_flow_from_entrypoint(entrypoint)).model_dump(exclude_none=True)


def _refused(place: str, parameters, schema: dict) -> list[str]:
    from prefect.utilities.schema_tools.validation import validate

    if parameters is None:
        return []
    if not isinstance(parameters, dict):
        return [f"{place}: parameters must be a mapping of name to value, not {type(parameters).__name__}"]
    taken = schema["properties"]
    unknown = [f"{place}: parameter {name!r}: the flow takes no such parameter (it takes {', '.join(taken)})"
               for name in parameters if name not in taken]
    # a template is filled in by Prefect after this step has read the file: its value is not known here
    known = {name: value for name, value in parameters.items() if name in taken and not _templated(value)}
    wrong = [f"{place}: parameter {'.'.join(map(str, error.absolute_path)) or '?'}: {_reason(error)}"
             for error in validate(known, schema, ignore_required=True)]
    return unknown + wrong


def _templated(value) -> bool:
    if isinstance(value, str):
        return "{{" in value
    if isinstance(value, dict):
        return any(map(_templated, value.values()))
    if isinstance(value, list):
        return any(map(_templated, value))
    return False


def _reason(error) -> str:
    """jsonschema's message, from the branch that matters where a parameter may also be None (`str | None` is anyOf
    string or null): "'x=1' is not of type 'array'", not "is not valid under any of the given schemas"."""
    branches = [branch for branch in error.context or () if branch.validator_value != "null"]
    return "; ".join(dict.fromkeys(branch.message for branch in branches)) or error.message
