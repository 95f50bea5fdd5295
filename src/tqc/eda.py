"""EDA-style explicit augmentation: random swap, deletion and insertion of words.

Insertion draws from the words of questions of the *same class* (no outside thesaurus), so a
generated question stays in its class's vocabulary. Pure functions of (text, rng).
"""

from __future__ import annotations

import random
from collections import defaultdict

OPERATIONS = ("swap", "delete", "insert")


def class_vocabularies(questions) -> dict[str, list[str]]:
    """class id → the sorted distinct words of its questions."""
    words: dict[str, set[str]] = defaultdict(set)
    for question in questions:
        words[question.class_id].update(question.text.split())
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
    words = text.split()
    for _ in range(attempts):
        changed = " ".join(_one_operation(words, vocabulary, rng, alpha))
        if changed != " ".join(words):
            break
    return changed


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
