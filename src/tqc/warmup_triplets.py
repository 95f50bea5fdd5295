"""EBSIM's weakly supervised triplets (§3.2) from unlabelled questions, as pure functions.

The catalog's standard questions play EBSIM's titles and a pool of questions its sentences. Each title's pool
questions are ranked by the pretrained model's similarity and the top R kept:
- token level (§3.2.1): ⟨title, relevant_i, relevant_j⟩ for every pair of ranks i < j among them, the higher-ranked
  question the closer one;
- structure level (§3.2.2): ⟨title, relevant_i, relevant_i(drop)⟩, relevant_i with each word that is more like some
  title word than the threshold replaced by the tokenizer's mask token (at most a share of its words, the most alike
  first); a question with no such word makes no such triplet. EBSIM drops words of relevant_1 only; here every
  relevant_i is dropped alike, which gives each title up to R of them beside the R(R−1)/2 token-level ones.
Nothing here draws at random: the same scores and texts make the same triplets in the same order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from tqc.eda import UNSPACED, VOICING_MARKS

# A word: a run of letters, digits or underscores, but each character of a script written without spaces (Chinese,
# Japanese) a word of its own, as EDA splits them (`eda.words_of`): a whole unspaced question was one word, which
# the ⌊half of the words⌋ cap never masks, so such a pool made no structure triplet. What lies between (spaces,
# punctuation) is kept as it is.
WORD = re.compile(rf"(?=\w)[{UNSPACED}][{VOICING_MARKS}]*|(?:(?![{UNSPACED}])\w)+")


@dataclass(frozen=True)
class Triplet:
    title: int  # the anchor: a catalog index
    closer: str  # s_p, ranked closer to the title
    farther: str  # s_n
    kind: Literal["token", "structure"]


def ranked_candidates(scores: np.ndarray, candidates: int) -> list[list[int]]:
    """scores (P titles, N questions) → for each title its `candidates` best questions' indices, best first; equal
    scores keep the pool's order. Each row's best are found by partition, not by sorting the whole pool: with
    `warmup.include_train` the pool holds every training question (O(P · N) for P titles, where a sort of each row
    was O(P · N log N) and held an (P, N) index array besides)."""
    if candidates >= scores.shape[1]:
        return [row[:candidates].tolist() for row in np.argsort(-scores, axis=1, kind="stable")]
    least = -np.partition(-scores, candidates - 1, axis=1)[:, candidates - 1]  # (P,) each row's candidates-th best
    return [_best_in_pool_order(row, bound, candidates) for row, bound in zip(scores, least)]


def _best_in_pool_order(row: np.ndarray, bound: float, candidates: int) -> list[int]:
    """The `candidates` best of one title's (N,) scores, best first, ties in pool order: those scoring at least
    `bound` (the candidates-th best, so every tie at the edge is among them), sorted stably. A row with fewer finite
    scores than `candidates` (NaN ranks last) is sorted whole."""
    kept = np.arange(len(row)) if np.isnan(bound) else np.flatnonzero(row >= bound)  # ascending: the pool's order
    return kept[np.argsort(-row[kept], kind="stable")][:candidates].tolist()


def token_triplets(title: int, ranked: list[int], pool: list[str]) -> list[Triplet]:
    """⟨title, relevant_i, relevant_j⟩ for every i < j of one title's ranked questions."""
    return [Triplet(title, pool[ranked[i]], pool[ranked[j]], "token")
            for i in range(len(ranked)) for j in range(i + 1, len(ranked))]


def words(text: str) -> list[tuple[int, int]]:
    """The (start, end) character span of each word of `text`, in order."""
    return [match.span() for match in WORD.finditer(text)]


def words_to_mask(similarity: list[float], threshold: float, max_fraction: float) -> list[int]:
    """Which of a question's words to mask: those whose `similarity` (one a word: its highest to any title word)
    exceeds `threshold`, the most alike first (equal ones in reading order), at most ⌊max_fraction × words⌋ of them;
    returned in reading order. Alike to 6 decimals is equal: a word of several pieces is as alike to itself as a word
    of one, though its normalised mean's cosine with itself may come out 1 − 6e-8."""
    above = [i for i, value in enumerate(similarity) if value > threshold]
    most = math.floor(max_fraction * len(similarity) + 1e-9)  # 0.5 × 4 words is 2, not 1 by a rounding error
    kept = sorted(above, key=lambda i: (-round(similarity[i], 6), i))[:most]
    return sorted(kept)


def masked(text: str, spans: list[tuple[int, int]], chosen: list[int], mask_token: str) -> str:
    """`text` with the words at `chosen` (indices into `spans`) each replaced by `mask_token`."""
    pieces, end = [], 0
    for index in chosen:
        start, stop = spans[index]
        pieces += [text[end:start], mask_token]
        end = stop
    return "".join(pieces) + text[end:]


class WordVectors:
    """Word vectors from the encoder's own input token-embedding table: a word is the mean of its word pieces' rows.
    EBSIM trains word2vec for this; no word2vec model is at hand offline, and the table is what the encoder reads
    words with, so two words it spells with the same pieces are one word to it, which is what masking must hide."""

    def __init__(self, pieces: Callable[[str], list[int]], table: torch.Tensor):
        self.pieces = pieces  # a word → its token ids, no special tokens
        self.table = table.detach().float().cpu()  # (V, D)
        self._cache: dict[str, torch.Tensor] = {}

    def of(self, text_words: list[str]) -> torch.Tensor:
        """(W,) words → (W, D) unit vectors; a word of no pieces is the zero vector, like no word."""
        return torch.stack([self._vector(word) for word in text_words]) if text_words else torch.empty(0, self.table.shape[1])

    def _vector(self, word: str) -> torch.Tensor:
        if word not in self._cache:
            ids = self.pieces(word)
            mean = self.table[ids].mean(dim=0) if ids else torch.zeros(self.table.shape[1])  # (D,)
            self._cache[word] = F.normalize(mean, dim=0)
        return self._cache[word]

    def closeness(self, question_words: list[str], title_words: list[str]) -> list[float]:
        """(Wq,) each question word's highest cosine to any title word (−1 where the title has no word)."""
        if not title_words:
            return [-1.0] * len(question_words)
        if not question_words:
            return []
        return (self.of(question_words) @ self.of(title_words).T).max(dim=1).values.tolist()  # (Wq, Wt) → (Wq,)


def structure_triplet(title: int, title_text: str, question: str, vectors: WordVectors, threshold: float,
                      max_fraction: float, mask_token: str) -> Triplet | None:
    """⟨title, question, question(drop)⟩, or None where no word of the question is masked."""
    spans = words(question)
    question_words = [question[start:end] for start, end in spans]
    title_words = [title_text[start:end] for start, end in words(title_text)]
    chosen = words_to_mask(vectors.closeness(question_words, title_words), threshold, max_fraction)
    return Triplet(title, question, masked(question, spans, chosen, mask_token), "structure") if chosen else None


def build_triplets(titles: list[str], pool: list[str], scores: np.ndarray, vectors: WordVectors, candidates: int,
                   threshold: float, max_fraction: float, mask_token: str) -> list[Triplet]:
    """Every title's token-level triplets, then its structure-level ones, title by title in catalog order.
    scores (P, N): the pretrained model's similarity of each title to each pool question."""
    triplets = []
    for title, ranked in enumerate(ranked_candidates(scores, candidates)):
        triplets += token_triplets(title, ranked, pool)
        for index in ranked:
            dropped = structure_triplet(title, titles[title], pool[index], vectors, threshold, max_fraction, mask_token)
            if dropped is not None:
                triplets.append(dropped)
    return triplets
