"""Slow: the packaged all-MiniLM-L6-v2 loads offline and gives meaningful sentence vectors."""

import pytest
import torch.nn.functional as F

from tqc.model.encoder import TextEncoder

pytestmark = pytest.mark.slow


def test_packaged_minilm_loads_offline_and_ranks_a_paraphrase_first(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    encoder = TextEncoder.from_pretrained("sentence-transformers/all-MiniLM-L6-v2")
    vectors = F.normalize(encoder.encode([
        "How can I protect myself from a covid infection?",
        "what can i do to avoid catching covid",
        "Which city hosted the 1988 Olympics?",
    ]), dim=-1)  # (3, 384)
    assert vectors.shape == (3, 384)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > similarity[0, 2] + 0.2
