"""Dynamic negative mining (ADMC Algorithm 1, lines 7–10), split into small steps:
index → retrieve → exclude the gold class → report statistics.
"""

from __future__ import annotations

import logging
from collections import Counter

import faiss
import numpy as np

log = logging.getLogger(__name__)


def build_index(standards: np.ndarray) -> faiss.Index:
    """Exact inner-product index over L2-normalised standard questions (P, D), on a GPU when present."""
    vectors = np.ascontiguousarray(standards, dtype=np.float32)
    faiss.normalize_L2(vectors)
    index = faiss.IndexFlatIP(vectors.shape[1])
    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    index.add(vectors)
    return index


def retrieve(index: faiss.Index, questions: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """questions (N, D) → (similarities (N, depth), class indices (N, depth)), nearest first."""
    vectors = np.ascontiguousarray(questions, dtype=np.float32)
    faiss.normalize_L2(vectors)
    return index.search(vectors, depth)


def exclude_gold(neighbours: np.ndarray, gold: np.ndarray, k: int) -> np.ndarray:
    """neighbours (N, depth ≥ k+1), gold (N,) → the k nearest wrong classes (N, k).

    Retrieving k+1 guarantees k wrong classes remain whether or not gold was retrieved.
    """
    if neighbours.shape[1] < k + 1:
        raise ValueError(f"need at least k+1={k + 1} neighbours per row, got {neighbours.shape[1]}")
    wrong = neighbours != gold[:, None]  # (N, depth)
    # A stable sort on "is gold" keeps the wrong classes in nearest-first order ahead of gold.
    order = np.argsort(~wrong, axis=1, kind="stable")
    return np.take_along_axis(neighbours, order, axis=1)[:, :k]


def mine(questions: np.ndarray, standards: np.ndarray, gold: np.ndarray, k: int) -> tuple[np.ndarray, dict]:
    """The k hardest wrong standard questions for each question, and mining statistics."""
    n_classes = standards.shape[0]
    if k > n_classes - 1:
        log.warning("mine.k=%d but only %d wrong classes exist; mining %d", k, n_classes - 1, n_classes - 1)
        k = n_classes - 1
    similarities, neighbours = retrieve(build_index(standards), questions, min(k + 1, n_classes))
    negatives = exclude_gold(neighbours, gold, k)
    return negatives, statistics(similarities, neighbours, negatives, gold)


def statistics(similarities: np.ndarray, neighbours: np.ndarray, negatives: np.ndarray, gold: np.ndarray) -> dict:
    gold_found = neighbours == gold[:, None]  # (N, depth)
    gold_rank = np.where(gold_found.any(axis=1), gold_found.argmax(axis=1) + 1, 0)  # 0: beyond depth
    hardest = np.where(neighbours[:, 0] == gold, similarities[:, 1], similarities[:, 0])
    most_mined = Counter(negatives.ravel().tolist()).most_common(10)
    return {
        "questions": int(len(gold)),
        "k": int(negatives.shape[1]),
        "gold_is_nearest": float(np.mean(gold_rank == 1)),
        "gold_within_depth": float(np.mean(gold_rank > 0)),
        "hardest_negative_similarity_mean": float(np.mean(hardest)),
        "most_mined_classes": [[int(c), int(n)] for c, n in most_mined],
    }
