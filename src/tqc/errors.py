"""The failures that bad input causes, for the entry points that report them (`tqc`, the retrain flow).

Not in config.py: every stage imports config, and this list reaches into the readers, validate and prior.
"""

from __future__ import annotations


def input_errors() -> tuple[type[Exception], ...]:
    """The failures that bad params, data files or a prior file cause. Each message names the file and what is wrong
    with it, and running again unchanged fails the same way: `tqc` says them in one line, and the retrain flow does
    not retry them. Imported when called, so importing this module costs nothing."""
    from tqc.config import ConfigError
    from tqc.incoming import UnreadableReference
    from tqc.io import DataFileError
    from tqc.launched import LaunchedInputError
    from tqc.prior import PriorFileError
    from tqc.readers import ReaderError
    from tqc.schema import StaleClassifier, StaleNegatives, UnknownClass
    from tqc.stages.validate import ValidationFailed

    return (ConfigError, ReaderError, ValidationFailed, PriorFileError, UnreadableReference, UnknownClass, StaleNegatives,
            StaleClassifier, DataFileError, LaunchedInputError)


def registry_errors() -> tuple[type[Exception], ...]:
    """The failures of a registry whose state stops a command, each message naming the version and the way out (a
    champion that cannot answer: repair it, or move the alias): said in one line, as a passing fault (exit 1), since
    the same command passes once the registry is put right. Imported when called."""
    from tqc.stages.promote import ChampionUnavailable

    return (ChampionUnavailable,)
