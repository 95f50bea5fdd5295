"""EDA-style explicit augmentation: random swap, deletion and insertion of words.

Insertion draws from the words of questions of the *same class* (no outside thesaurus), so a
generated question stays in its class's vocabulary. Pure functions of (text, rng).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass

from tqc.text import compared_text, normalise

OPERATIONS = ("swap", "delete", "insert")

# Chinese and Japanese are written without spaces between words: there a character (an ideograph or a kana, with the
# kana voicing marks that follow it) is the unit EDA moves, since a whole question would otherwise be one "word" that
# no swap or deletion can change and that an insertion only doubles. Their punctuation (、。「」) and the full-width
# punctuation (，？！) are units of their own too. Full-width letters and digits (Ｗｈａｔ, ３) are written with spaces
# between words, as their ASCII forms are, and stay whitespace words. Scripts whose characters carry combining marks
# (Thai, Khmer, …) keep whitespace words: moving a vowel sign off its consonant makes no text.
UNSPACED = ("\u3000-\u303f\u3041-\u3096\u309b-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
            "\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65")
VOICING_MARKS = "\u3099\u309a"  # combining: they stay with the kana before them
UNITS = re.compile(f"[{UNSPACED}][{VOICING_MARKS}]*|[^\\s{UNSPACED}]+")
IS_UNSPACED = re.compile(f"[{UNSPACED}]")


@dataclass(frozen=True)
class Spacing:
    """Where a question puts spaces beside the characters of an unspaced script. An edited question is written as its
    original was: re-spaced ("我有3张卡" as "我有 3 张卡"), it would escape augment's comparisons with validation and
    test, which compare texts as validate does (spaces count)."""

    between_unspaced: bool = False  # "我 有" (a corpus segmented into words) or "我有"
    across_scripts: bool = True  # "我有 3 张" or "我有3张": beside a word of another script, or a digit


def words_of(text: str) -> list[str]:
    """A question's units: its space-separated words, with each character of an unspaced script a unit of its own."""
    return UNITS.findall(text)


def spacing_of(text: str) -> Spacing:
    """The question's own spacing: for each kind of neighbouring units it has, whether most of them have a space
    between; a kind it lacks (an insertion may bring one) keeps `Spacing`'s default."""
    votes: dict[str, list[bool]] = {"between_unspaced": [], "across_scripts": []}
    units = list(UNITS.finditer(text))
    for before, after in zip(units, units[1:]):
        unspaced = [bool(IS_UNSPACED.match(unit.group())) for unit in (before, after)]
        if any(unspaced):
            kind = "between_unspaced" if all(unspaced) else "across_scripts"
            votes[kind].append(before.end() != after.start())  # only whitespace lies between two units
    default = Spacing()
    return Spacing(**{kind: _majority(spaced, getattr(default, kind)) for kind, spaced in votes.items()})


def _majority(votes: list[bool], tie: bool) -> bool:
    """True when most `votes` are; `tie` when they split evenly (none included)."""
    return tie if 2 * sum(votes) == len(votes) else 2 * sum(votes) > len(votes)


def joined(words: list[str], spacing: Spacing = Spacing()) -> str:
    """Units back into text: a space between two whitespace words, and beside an unspaced script's character as
    `spacing` says."""
    text = ""
    for word in words:
        if text:
            unspaced = (bool(IS_UNSPACED.match(text[-1]) or text[-1] in VOICING_MARKS), bool(IS_UNSPACED.match(word)))
            spaced = (True if not any(unspaced) else spacing.between_unspaced if all(unspaced) else spacing.across_scripts)
            text += " " if spaced else ""
        text += word
    return text


def class_vocabularies(questions) -> dict[str, list[str]]:
    """class id → the sorted distinct words of its questions."""
    words: dict[str, set[str]] = defaultdict(set)
    for question in questions:
        words[question.class_id].update(words_of(question.text))
    return {class_id: sorted(ws) for class_id, ws in words.items()}


def random_swap(words: list[str], n: int, rng: random.Random) -> list[str]:
    words = list(words)
    for _ in range(n if len(words) > 1 else 0):
        i, j = rng.sample(range(len(words)), 2)
        words[i], words[j] = words[j], words[i]
    return words


def random_delete(words: list[str], n: int, rng: random.Random) -> list[str]:
    if len(words) <= 1:
        return list(words)
    drop = set(rng.sample(range(len(words)), min(n, len(words) - 1)))  # never delete every word
    return [w for i, w in enumerate(words) if i not in drop]


def random_insert(words: list[str], n: int, vocabulary: list[str], rng: random.Random) -> list[str]:
    words = list(words)
    for _ in range(n if vocabulary else 0):
        words.insert(rng.randint(0, len(words)), rng.choice(vocabulary))
    return words


def augment_text(text: str, vocabulary: list[str], rng: random.Random, alpha: float = 0.1, attempts: int = 4) -> str:
    """One random operation on round(alpha · words) positions (at least one), of those that can change the question, drawn
    again (up to `attempts` times) while it leaves the question as it was (a swap of two equal words): a copy is no
    augmentation, nor is a question left with characters no tokenizer reads alone ("\u200b", "\ufffd", a lone accent),
    which validate would refuse as empty, nor one left with no letter or digit ("Why ?" cut to "?"), which teaches
    nothing. A question nothing changes (one word, and no vocabulary to insert from) stays."""
    words, spacing, original = words_of(text), spacing_of(text), normalise(text)
    for _ in range(attempts):
        changed = joined(_one_operation(words, vocabulary, rng, alpha), spacing)
        # a new question as validate compares; with a letter or digit (validate reads unread characters alone as empty)
        if compared_text(changed) != original and has_a_letter_or_digit(changed):
            return changed
    return text  # as it came, not re-spaced


def has_a_letter_or_digit(text: str) -> bool:
    """Whether some character of `text` is a letter or a digit, of any script (not punctuation, a symbol, or a character
    no tokenizer reads, which `compared_text` empties)."""
    return any(ch.isalnum() for ch in text)


def _one_operation(words: list[str], vocabulary: list[str], rng: random.Random, alpha: float) -> list[str]:
    n = max(1, round(alpha * len(words)))
    # only operations that can change the question: a swap needs two different words, a deletion two words
    can = {"swap": len(set(words)) > 1, "delete": len(words) > 1, "insert": bool(vocabulary)}
    operation = rng.choice([name for name in OPERATIONS if can[name]] or OPERATIONS)
    if operation == "swap":
        return random_swap(words, n, rng)
    if operation == "delete":
        return random_delete(words, n, rng)
    return random_insert(words, n, vocabulary, rng)
