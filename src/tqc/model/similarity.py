"""Pairwise similarity between question and standard-question embeddings: small scorer modules.

Each scorer maps questions (B, D) and standard questions (C, D) to scores (B, C).
`cosine` and `inner` have no weights; `mlp` is a 2-layer MLP over the pair features
[q; s; q⊙s; |q−s|] of the normalised vectors, added to their cosine. Its last layer starts
at zero, so an untrained MLP scorer *is* cosine: training starts from the pretrained
geometry instead of from random scores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SIMILARITIES = ("cosine", "inner", "mlp")
WEIGHT_FREE = ("cosine", "inner")  # scored by a formula alone: FAISS can rank them


def scores_directions_only(kind: str) -> bool:
    """Whether `kind` normalises the vectors before scoring (cosine, mlp): their lengths carry nothing.

    The one answer for code that builds or indexes vectors outside the scorer (mining, prototype mixup).
    """
    if kind not in SIMILARITIES:
        raise ValueError(f"unknown similarity {kind!r}; expected one of {', '.join(SIMILARITIES)}")
    return kind != "inner"


class CosineScorer(nn.Module):
    kind = "cosine"

    def forward(self, questions: torch.Tensor, standards: torch.Tensor) -> torch.Tensor:
        return F.normalize(questions, dim=-1) @ F.normalize(standards, dim=-1).T


class InnerProductScorer(nn.Module):
    kind = "inner"

    def forward(self, questions: torch.Tensor, standards: torch.Tensor) -> torch.Tensor:
        return questions @ standards.T


class MLPScorer(nn.Module):
    """cosine(q, s) + MLP([q; s; q⊙s; |q−s|]) on the normalised vectors."""

    kind = "mlp"

    def __init__(self, dim: int, hidden: int | None = None, chunk_rows: int = 256, pair_elements: int = 2 ** 25):
        super().__init__()
        hidden = hidden or dim
        self.layers = nn.Sequential(nn.Linear(4 * dim, hidden), nn.GELU(), nn.Linear(hidden, 1))
        nn.init.zeros_(self.layers[-1].weight)
        nn.init.zeros_(self.layers[-1].bias)
        # Bound the (rows, C, 4D) pair tensor when scoring a whole catalog: at most `chunk_rows` questions, and fewer
        # for a large catalog, so that it holds at most `pair_elements` (128 MiB in float32). 256 rows alone held
        # 3 GiB at C = 2,000 and D = 384.
        self.chunk_rows, self.pair_elements = chunk_rows, pair_elements

    def forward(self, questions: torch.Tensor, standards: torch.Tensor) -> torch.Tensor:
        questions, standards = F.normalize(questions, dim=-1), F.normalize(standards, dim=-1)
        pair_row = 4 * standards.shape[0] * standards.shape[1]  # elements a question's pairs take; 0: no catalog
        rows = min(self.chunk_rows, max(1, self.pair_elements // max(1, pair_row)))
        return torch.cat([self._score(chunk, standards) for chunk in questions.split(rows)])

    def _score(self, questions: torch.Tensor, standards: torch.Tensor) -> torch.Tensor:
        q = questions.unsqueeze(1).expand(-1, standards.shape[0], -1)  # (B, C, D)
        s = standards.unsqueeze(0).expand(questions.shape[0], -1, -1)  # (B, C, D)
        pairs = torch.cat([q, s, q * s, (q - s).abs()], dim=-1)  # (B, C, 4D)
        return (q * s).sum(-1) + self.layers(pairs).squeeze(-1)  # (B, C)


def make_scorer(kind: str, dim: int) -> nn.Module:
    if kind == "cosine":
        return CosineScorer()
    if kind == "inner":
        return InnerProductScorer()
    if kind == "mlp":
        return MLPScorer(dim)
    raise ValueError(f"unknown similarity {kind!r}; expected one of {', '.join(SIMILARITIES)}")

