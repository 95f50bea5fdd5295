"""The one notion of "the same question" that every stage and serving share.

Ingest draws validation by `compared_text` and attributes generated rows by `normalise`, validate's duplicate,
conflict, leakage and non-empty checks compare `compared_text`, augment drops generated rows that match a held-out
question, and serving refuses a question that holds no word a tokenizer reads (`has_words`), as validate would have
quarantined it. `first_of` is how a message names the first few of many rows, lines or classes.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

# Typographic quotes as the plain ones a keyboard types: "what’s" and "what's" are the same question.
PLAIN_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
                              "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"'})


# Tokenised corpora (TREC's "Aspen ?", "Australia 's", "does n't") and typed text ("Aspen?", "Australia's") spell one
# question two ways: a space before closing punctuation or a clitic, or after an opening bracket, is not compared.
DETACHED = re.compile(r" (?=[?.!,;:)\]}]|'(?:s|re|ve|ll|d|m)\b|n't\b)|(?<=[(\[{]) ")

# Compatibility forms that NFKC would fold into other text: 10² is not 102, nor ½ "1/2" beside a 1 (H₂O is not H2O).
KEEP_FORMS = ("<super>", "<sub>", "<fraction>")


def normalise(text: str) -> str:
    """The form duplicate, conflict and leakage checks compare: insensitive to case, whitespace (spaces before
    punctuation too, `DETACHED`), Unicode composition and width (NFKC but for `KEEP_FORMS`: "é" composed or not,
    full-width letters), invisible format characters (zero-width spaces, category Cf) and typographic quotes. Texts
    that read the same are the same question."""
    # Invisible characters go first, so the letters and accents they separated compose ("e", U+200B, U+0301 is "é"),
    # and NFC goes last, over what casefold decomposed: else normalise(normalise(t)) could differ from normalise(t).
    visible = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    folded = _compatibility_folded(visible).translate(PLAIN_QUOTES).casefold()
    if not folded.isascii():
        folded = unicodedata.normalize("NFC", folded)
    return DETACHED.sub("", " ".join(folded.split()))


def catalog_label_key(label: str) -> str:
    """What a label is matched to a catalog id by when it is not one exactly: case, width, invisible characters and
    spacing aside (`normalise`), and a whole number written as a float (pandas writes 1.0 for 1, a spreadsheet 1.00)."""
    key = normalise(label)
    whole = WHOLE_FLOAT.fullmatch(key)
    return whole.group(1) if whole else key


WHOLE_FLOAT = re.compile(r"(-?\d+)\.0+")
ALIKE = "alike but for case, width or a float's .0"  # how messages say two ids share a `catalog_label_key`


def ids_by_label_key(class_ids: Iterable[str]) -> dict[str, list[str]]:
    """`catalog_label_key` → the ids of that key, in their order. A label alike exactly one id is read as it; one
    alike several (`hum` and `HUM` both ids) as none of them."""
    by_key: dict[str, list[str]] = {}
    for class_id in class_ids:
        by_key.setdefault(catalog_label_key(class_id), []).append(class_id)
    return by_key


def sharing_a_key(names: Iterable[str], keys: Iterable[str]) -> list[list[str]]:
    """The groups of `names` whose `keys` are equal, each of two or more names: the groups in the order their first
    name comes, each group's names in theirs (classes whose standard questions are one text, as validate compares them)."""
    by_key: dict[str, list[str]] = {}
    for name, key in zip(names, keys):
        by_key.setdefault(key, []).append(name)
    return [group for group in by_key.values() if len(group) > 1]


def _compatibility_folded(text: str) -> str:
    if text.isascii():  # nearly every question: nothing to fold
        return text
    composed = unicodedata.normalize("NFC", text)
    return unicodedata.normalize("NFC", "".join(
        ch if unicodedata.decomposition(ch).startswith(KEEP_FORMS) else unicodedata.normalize("NFKC", ch)
        for ch in composed))


# Characters no tokenizer reads as part of a word: control characters (WordPiece's cleaning drops them, NUL too),
# combining marks with no letter of the text to sit on (uncased WordPiece strips accents), private-use characters
# (dropped by the same cleaning: MiniLM reads "\ue000" as "") and U+FFFD (a byte a decoder could not read). A text of
# them alone is tokenised as the empty question, [CLS] [SEP].
UNREAD_CATEGORIES = frozenset({"Cc", "Mn", "Me", "Co"})


# Characters of a text `has_words` normalises at a time, to the next space. A space is a boundary `normalise` carries
# nothing across: NFC and NFKC compose nothing with U+0020 and reorder nothing over it, its other steps go a character
# at a time, and its whitespace ones only drop spaces. So a text has words where a piece of it cut before a space has,
# and the first piece of a question nearly always does: a 5 MB one was normalised whole, twice, for 10 s.
WORD_SEARCH_CHARS = 4096


def has_words(text: str) -> bool:
    """Whether `text` holds a question once `normalise`d: a character besides whitespace that a tokenizer reads
    (not `UNREAD_CATEGORIES`, not U+FFFD). "\\x01", a lone accent or "\\ufffd" have none: the model would encode each as
    it encodes "", and answer it as confidently as any real question."""
    start = 0
    while start < len(text):
        end = text.find(" ", start + WORD_SEARCH_CHARS)
        end = len(text) if end < 0 else end
        if _reads_a_word(normalise(text[start:end])):
            return True
        start = end
    return False


def _reads_a_word(normalised: str) -> bool:
    return any(not ch.isspace() and ch != "\ufffd" and unicodedata.category(ch) not in UNREAD_CATEGORIES
               for ch in normalised)


def compared_text(text: str) -> str:
    """The text validate's checks and ingest's validation draw compare: `normalise`d, and empty where no character of
    it is one a tokenizer reads (`has_words`), since the encoder would read it as the empty question, and the served
    model refuses it. Ingest never draws an empty one for validation, where validate would stop on it."""
    normalised = normalise(text)  # once: validate and ingest's split call this on every row
    return normalised if _reads_a_word(normalised) else ""


# Validate's checks of a row alone, whatever its split (its no_control_characters, has_letter_or_digit and text_length);
# ingest's validation draw passes over a row that fails one, which validate would take out of validation
CONTROL_CHARACTERS = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"  # C0 but tab and line breaks, DEL, C1 (mis-decoded bytes)
# A letter or digit of any script ([^\W_] is str.isalnum), or the empty text, which non_empty_text says already
LETTER_OR_DIGIT = r"^$|[^\W_]"


_CONTROL_CHARACTER = re.compile(CONTROL_CHARACTERS)
_LETTER_OR_DIGIT = re.compile(LETTER_OR_DIGIT)


def first_control_character(text: str) -> re.Match[str] | None:
    """The first character of `text` that no_control_characters quarantines (not a tab or a line break), or None."""
    return _CONTROL_CHARACTER.search(text)


def faulty_text(text: str, max_text_chars: int | None) -> bool:
    """Whether `text` itself has a fault validate quarantines: a control character, or more than `max_text_chars`
    characters (None: no bound)."""
    return bool(first_control_character(text)) or (max_text_chars is not None and len(text) > max_text_chars)


def fails_alone(text: str, key: str, max_text_chars: int | None) -> bool:
    """Whether validate quarantines a row of `text` (its `compared_text` `key`) wherever it stands: `faulty_text`, or
    no letter or digit."""
    return faulty_text(text, max_text_chars) or not _LETTER_OR_DIGIT.search(key)


def first_of(items: Sequence, most: int = 10, separator: str = ", ") -> str:
    """The first `most` of `items`, and how many more there are: "3, 8, 12 and 4 more". A message names enough of what
    failed to find it, and a file that fails on every row still makes one line."""
    shown = separator.join(map(str, items[:most]))
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")
