"""Classes whose standard questions are one text ("twins"), as validate compares texts. Such classes encode alike, so
no training can tell them apart by their standard question (the exemplar rule still can, by their questions): neither
is a negative of the other's questions, in mining or in a loss."""

from __future__ import annotations

import logging

import numpy as np

from tqc.schema import Catalog
from tqc.text import normalise, sharing_a_key
from tqc.warn_once import ALIKE_EVERY_TRAINING

log = logging.getLogger(__name__)


def standard_text_keys(catalog: Catalog) -> list[str]:
    """(P,) each class's standard question as classes are compared for sharing one (as validate compares texts)."""
    return [normalise(text) for text in catalog.texts]


def standard_text_groups(catalog: Catalog) -> np.ndarray | None:
    """(P,) one group id per class, shared by classes whose standard questions are one text, or None where each has
    its own, as validate's critical `catalog_unique_texts` ensures unless demoted."""
    keys = standard_text_keys(catalog)
    if len(set(keys)) == len(keys):
        return None
    first = {}
    groups = np.array([first.setdefault(key, index) for index, key in enumerate(keys)])  # (P,) the group's first class
    log.warning("classes that share a standard question are never each other's negatives: %s",
                "; ".join(" = ".join(ids) for ids in sharing_a_key(catalog.class_ids, keys)), extra=ALIKE_EVERY_TRAINING)
    return groups
