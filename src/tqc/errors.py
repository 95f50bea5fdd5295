"""The failures that bad input, or a registry's state, cause: the base classes the entry points (`tqc`, the retrain flow) catch.

A leaf module, importing nothing of tqc's: every module whose errors derive from InputError imports it.
"""

from __future__ import annotations


class InputError(Exception):
    """The base of every failure that bad params, data files or a prior file cause (ConfigError, ReaderError,
    ValidationFailed, DataFileError, …): each message names the file and what is wrong with it, and running again
    unchanged fails the same way. A new such error derives from it, and `tqc` and the retrain flow treat it so; a list
    of classes here was one more place to forget it, and a forgotten one was a traceback, retried three times."""


def input_errors() -> tuple[type[Exception], ...]:
    """The failures bad input causes (`InputError`): `tqc` says them in one line, and the retrain flow does not retry
    them."""
    return (InputError,)


class RegistryError(Exception):
    """The base of the failures of a registry whose state stops a command (ChampionUnavailable: a champion that cannot
    answer), each message naming the version and the way out: repair it, or move the alias."""


def registry_errors() -> tuple[type[Exception], ...]:
    """The registry's failures (`RegistryError`): said in one line, as a passing fault (exit 1), since the same
    command passes once the registry is put right."""
    return (RegistryError,)
