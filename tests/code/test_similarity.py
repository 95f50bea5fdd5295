import pytest
import torch
import torch.nn.functional as F

from tqc.model.similarity import SIMILARITIES, MLPScorer, make_scorer, scores_directions_only


def vectors(seed: int, rows: int, dim: int = 8) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))


def test_cosine_and_inner_product_match_their_definitions():
    q, s = vectors(0, 3), vectors(1, 5)  # (B, D), (C, D)
    assert torch.allclose(make_scorer("cosine", 8)(q, s), F.cosine_similarity(q[:, None], s[None], dim=-1), atol=1e-6)
    assert torch.allclose(make_scorer("inner", 8)(q, s), q @ s.T)


def test_an_untrained_mlp_scorer_is_exactly_cosine():
    q, s = vectors(0, 3), vectors(1, 5)
    assert torch.allclose(MLPScorer(8)(q, s), make_scorer("cosine", 8)(q, s), atol=1e-6)


def test_the_mlp_scorer_is_chunked_without_changing_scores():
    torch.manual_seed(0)
    scorer = MLPScorer(8)
    torch.nn.init.normal_(scorer.layers[-1].weight)
    q, s = vectors(0, 7), vectors(1, 5)
    whole = scorer(q, s)
    scorer.chunk_rows = 2
    assert whole.shape == (7, 5) and torch.allclose(scorer(q, s), whole, atol=1e-6)


def test_the_mlp_scorer_reads_the_pair_features_q_s_their_product_and_absolute_difference():
    """The MLP's input is [q; s; q⊙s; |q−s|] of the normalised vectors (the module docstring). An untrained scorer is
    cosine whatever its features (its last layer starts at zero), and the learning test passes with other features:
    a feature swapped (q for q⊙s) or its absolute value dropped changed no test. Here the MLP is replaced by a
    recorder of what it is given."""
    seen = []

    class Recorder(torch.nn.Module):
        def forward(self, pairs):
            seen.append(pairs)
            return torch.zeros(*pairs.shape[:-1], 1)

    scorer = MLPScorer(8)
    scorer.layers = Recorder()
    q, s = vectors(0, 3), vectors(1, 5)
    scores = scorer(q, s)
    qn, sn = F.normalize(q, dim=-1)[:, None].expand(3, 5, 8), F.normalize(s, dim=-1)[None].expand(3, 5, 8)
    expected = torch.cat([qn, sn, qn * sn, (qn - sn).abs()], dim=-1)  # (3, 5, 32)
    assert len(seen) == 1 and torch.allclose(seen[0], expected, atol=1e-6)
    assert torch.allclose(scores, (qn * sn).sum(-1), atol=1e-6)  # plus cosine: the recorder adds nothing


def test_the_mlp_scorer_learns_a_relation_cosine_cannot_express():
    """Target: score high when the pair is *far apart* in cosine; only a trained MLP can rank that."""
    torch.manual_seed(0)
    scorer = MLPScorer(8, hidden=32)
    q, s = vectors(0, 16), vectors(1, 16)
    target = (-F.normalize(q, dim=-1) @ F.normalize(s, dim=-1).T).argmax(dim=1)  # the least similar column
    optimizer = torch.optim.Adam(scorer.parameters(), lr=1e-2)
    for _ in range(300):
        loss = F.cross_entropy(scorer(q, s) / 0.1, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert (scorer(q, s).argmax(dim=1) == target).float().mean() > 0.9


def test_an_unknown_similarity_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown similarity 'l2'"):
        make_scorer("l2", 8)


@pytest.mark.parametrize("kind", SIMILARITIES)
def test_directions_only_says_whether_the_scorer_ignores_vector_lengths(kind):
    # mining and prototype mixup normalise (or not) by this flag: it must agree with the scorer itself
    torch.manual_seed(0)
    questions, standards = vectors(0, 3), vectors(1, 4)  # (B, D), (C, D)
    scorer = make_scorer(kind, 8)
    if kind == "mlp":
        torch.nn.init.normal_(scorer.layers[-1].weight)  # a trained MLP, not cosine in disguise
    lengths = torch.tensor([[0.5], [2.0], [7.0]])  # (3, 1) a different stretch per question
    unchanged = torch.allclose(scorer(questions * lengths, standards), scorer(questions, standards), atol=1e-5)
    assert unchanged == scores_directions_only(kind)


def test_directions_only_rejects_an_unknown_similarity():
    with pytest.raises(ValueError, match="unknown similarity 'dot'"):
        scores_directions_only("dot")


def test_the_mlp_scorer_scores_fewer_rows_at_once_for_a_large_catalog():
    """256 questions at once against 2,000 standard questions of 384 dimensions was a 3 GiB pair tensor: the chunk
    is bounded by `pair_elements` too, and the scores do not change."""
    torch.manual_seed(0)
    scorer = MLPScorer(8, pair_elements=4 * 5 * 8 * 3)  # 3 rows of pairs against 5 standard questions
    torch.nn.init.normal_(scorer.layers[-1].weight)
    chunks, score = [], scorer._score
    scorer._score = lambda questions, standards: chunks.append(len(questions)) or score(questions, standards)
    q, s = vectors(0, 7), vectors(1, 5)
    bounded = scorer(q, s)
    assert chunks == [3, 3, 1]
    # equal to float32's precision, not always to its last digit: a GEMM over 3 rows need not sum as one over 7 does
    assert torch.allclose(bounded, MLPScorer.forward(_unbounded(scorer), q, s), atol=1e-6)


def _unbounded(scorer: MLPScorer) -> MLPScorer:
    scorer.pair_elements, scorer._score = 2 ** 25, MLPScorer._score.__get__(scorer)
    return scorer


def test_the_mlp_scorer_against_an_empty_catalog_gives_no_columns():
    assert MLPScorer(8)(vectors(0, 3), torch.empty(0, 8)).shape == (3, 0)
