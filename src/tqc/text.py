"""The one notion of "the same question" that every stage and serving share.

Ingest draws validation and attributes generated rows by it, validate's duplicate, conflict, leakage
and non-empty checks compare it, augment drops generated rows that match a held-out question, and
serving refuses a question that is empty under it, as validate would have quarantined it.
"""

from __future__ import annotations

import unicodedata

# Typographic quotes as the plain ones a keyboard types: "what’s" and "what's" are the same question.
PLAIN_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
                              "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"'})


def normalise(text: str) -> str:
    """The form duplicate, conflict and leakage checks compare: insensitive to case, whitespace, Unicode
    composition and width (NFKC: "é" composed or not, full-width letters), invisible format characters
    (zero-width spaces, category Cf) and typographic quotes. Texts that read the same are the same question."""
    folded = unicodedata.normalize("NFKC", text).translate(PLAIN_QUOTES).casefold()
    return " ".join("".join(ch for ch in folded if unicodedata.category(ch) != "Cf").split())
