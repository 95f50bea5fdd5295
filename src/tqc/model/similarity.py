"""Pairwise similarity between question and standard-question embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pairwise_scores(questions: torch.Tensor, standards: torch.Tensor, kind: str) -> torch.Tensor:
    """questions (B, D), standards (C, D) → scores (B, C)."""
    if kind == "cosine":
        questions, standards = F.normalize(questions, dim=-1), F.normalize(standards, dim=-1)
    elif kind != "inner":
        raise ValueError(f"unknown similarity {kind!r}")
    return questions @ standards.T


def rowwise_scores(questions: torch.Tensor, candidates: torch.Tensor, kind: str) -> torch.Tensor:
    """questions (B, D), candidates (B, C, D) → scores (B, C): each row against its own candidates."""
    if kind == "cosine":
        questions, candidates = F.normalize(questions, dim=-1), F.normalize(candidates, dim=-1)
    elif kind != "inner":
        raise ValueError(f"unknown similarity {kind!r}")
    return torch.einsum("bd,bcd->bc", questions, candidates)
