"""EDA-style explicit augmentation: random swap, deletion and insertion of words.

Insertion draws from the words of questions of the *same class* (no outside thesaurus), so a
generated question stays in its class's vocabulary. Pure functions of (text, rng).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict

OPERATIONS = ("swap", "delete", "insert")

# Chinese and Japanese are written without spaces between words: there a character (an ideograph or a kana, each
# whole, with no combining marks) is the unit EDA moves, since a whole question would otherwise be one "word" that
# no swap or deletion can change and that an insertion only doubles. Their punctuation (、。「」) and the full-width
# forms (，？！) are units of their own too, joined without spaces, or an edited question would come back with
# spaces its held-out copy lacks and escape augment's comparisons with validation and test. Scripts whose characters
# carry combining marks (Thai, Khmer, …) keep whitespace words: moving a vowel sign off its consonant makes no text.
UNSPACED = "\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
UNITS = re.compile(f"[{UNSPACED}]|[^\\s{UNSPACED}]+")
IS_UNSPACED = re.compile(f"[{UNSPACED}]")


def words_of(text: str) -> list[str]:
    """A question's units: its space-separated words, with each character of an unspaced script a unit of its own."""
    return UNITS.findall(text)


def joined(words: list[str]) -> str:
    """Units back into text: a space between two units unless both are characters of an unspaced script."""
    text = ""
    for word in words:
        spaced = text and not (IS_UNSPACED.match(word) and IS_UNSPACED.match(text[-1]))
        text += (" " if spaced else "") + word
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
    augmentation. A question nothing changes (one word, and no vocabulary to insert from) stays."""
    words = words_of(text)
    for _ in range(attempts):
        changed = joined(_one_operation(words, vocabulary, rng, alpha))
        if changed != joined(words):
            return changed
    return text  # as it came, not re-spaced


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
