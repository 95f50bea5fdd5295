"""SharpReCL prototype mixup and CEAA cross-encoding: what each adds to what the encoder sees."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from tqc.losses import class_log_prior, make_loss, same_class_mask
from tqc.model.cross_encoding import joined_inputs, question_that_fits
from tqc.model.prototype_mixup import balanced_set, hard_sets, mixup, synthetic_share


def test_synthetic_share_rises_from_half_to_one():
    assert synthetic_share(0, 100) == 0.5
    assert synthetic_share(50, 100) == pytest.approx(0.75)
    assert synthetic_share(100, 100) == 1.0 and synthetic_share(150, 100) == 1.0


def test_hard_positives_are_least_similar_members_and_hard_negatives_most_similar_others():
    # 5 rows, 2 prototypes; similarity to prototype 0 and 1 given directly.
    similarity = torch.tensor([[0.9, 0.1], [0.2, 0.3], [0.5, 0.8], [0.7, 0.6], [0.1, 0.95]])
    labels = torch.tensor([0, 0, 0, 1, 1])
    positives, negatives = hard_sets(similarity, labels, k=2)
    assert positives[0].tolist() == [1, 2]  # class 0 members by ascending similarity: rows 1 (0.2), 2 (0.5)
    assert negatives[0].tolist() == [3, 4]  # others most similar to prototype 0: rows 3 (0.7), 4 (0.1)
    assert positives[1].tolist() == [3, 4]
    assert negatives[1].tolist() == [2, 1]  # 0.8, then 0.3


def test_mixup_lies_between_its_two_vectors_and_is_unit_norm():
    vectors = F.normalize(torch.randn(4, 8), dim=-1)
    mixed = mixup(vectors, torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([1.0, 0.3]))
    assert torch.allclose(mixed.norm(dim=-1), torch.ones(2), atol=1e-6)
    assert torch.allclose(mixed[0], vectors[0], atol=1e-6)  # α = 1 keeps the first vector
    expected = F.normalize(0.3 * vectors[1] + 0.7 * vectors[3], dim=0)
    assert torch.allclose(mixed[1], expected, atol=1e-6)


def test_balanced_set_gives_every_class_the_same_rows_even_a_class_missing_from_the_batch():
    torch.manual_seed(0)
    questions = F.normalize(torch.randn(10, 16), dim=-1)
    labels = torch.tensor([0] * 8 + [1] * 2)  # class 2 has no member in this batch
    prototypes = F.normalize(torch.randn(3, 16), dim=-1)
    generator = torch.Generator().manual_seed(0)
    early = balanced_set(questions, labels, prototypes, per_class=4, share=0.5, hard_k=3, beta=0.5, generator=generator)
    assert early.vectors.shape == (12, 16)
    assert torch.bincount(early.labels[~early.synthetic], minlength=3).tolist() == [2, 2, 2]  # simple samples
    assert early.synthetic.sum() == 6  # share 0.5 of 4 rows × 3 classes
    late = balanced_set(questions, labels, prototypes, per_class=4, share=1.0, hard_k=3, beta=0.5, generator=generator)
    assert late.synthetic.all()
    assert torch.allclose(late.vectors.norm(dim=-1), torch.ones(12), atol=1e-5)
    # The absent class is present through its prototype: its simple samples are the prototype itself.
    class_two_real = early.vectors[(early.labels == 2) & ~early.synthetic]
    assert torch.allclose(class_two_real, prototypes[2].expand_as(class_two_real), atol=1e-6)


@pytest.mark.parametrize("share", [0.0, 0.5, 0.75, 1.0])
def test_every_class_gets_per_class_rows_labelled_with_it_however_skewed_the_batch(share):
    # A head class crowds the batch, so it fills every other class's hard negatives; its mixups
    # must not take the other classes' places in the set (SharpReCL: a balanced set per class).
    torch.manual_seed(0)
    prototypes = F.normalize(torch.randn(5, 16), dim=-1)
    labels = torch.tensor([0] * 24 + [1, 2, 3, 4])
    questions = F.normalize(prototypes[labels] + 0.6 * torch.randn(len(labels), 16), dim=-1)  # (28, 16)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        result = balanced_set(questions, labels, prototypes, per_class=4, share=share, hard_k=20, beta=0.5, generator=generator)
        assert torch.bincount(result.labels, minlength=5).tolist() == [4] * 5


def test_a_class_hard_negative_mixups_are_its_members_nearest_a_wrong_prototype():
    prototypes = torch.eye(4)[:2]  # class 0 along e1, class 1 along e2
    questions = torch.tensor([[1.0, 0.0, 0.0, 0.0],      # class 0, on its prototype
                              [0.6, 0.8, 0.0, 0.0],      # class 0, nearest prototype 1: its hard negative
                              [0.5, 0.0, 0.866, 0.0],    # class 0, farthest from prototype 0: its hard positive
                              [0.0, 1.0, 0.0, 0.0]])     # class 1
    labels = torch.tensor([0, 0, 0, 1])
    # hard_k 1: each mixup pairs a row with itself, so the synthetic rows are the hard rows themselves
    result = balanced_set(questions, labels, prototypes, per_class=2, share=1.0, hard_k=1, beta=0.5,
                          generator=torch.Generator().manual_seed(0))
    class_zero = result.vectors[result.labels == 0]
    assert torch.allclose(class_zero, F.normalize(questions[[2, 1]], dim=-1), atol=1e-6)  # hard positive, then hard negative
    assert result.labels.tolist() == [0, 0, 1, 1]


def _hard_rows_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Class 0's rows: 0 on its prototype, 1 nearest prototype 1 (its hard negative), 2 farthest from prototype 0
    (its hard positive); row 3 is class 1's."""
    prototypes = torch.eye(4)[:2]
    questions = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.6, 0.8, 0.0, 0.0], [0.5, 0.0, 0.866, 0.0], [0.0, 1.0, 0.0, 0.0]])
    return questions, torch.tensor([0, 0, 0, 1]), prototypes


@pytest.mark.parametrize("per_class, share, synthetic", [(3, 1.0, [2, 2, 1]), (4, 0.7, [2, 2, 1])])
def test_a_class_gets_round_share_synthetic_rows_the_odd_one_a_hard_positive_mix(per_class, share, synthetic):
    """round(share·per_class) rows of each class are synthetic (0.7 of 4 is 3, not int's 2), and of an odd count the
    hard-positive mixups take the larger half (ceil), the hard-negative ones the rest. hard_k 1: each mixup pairs a
    row with itself, so a synthetic row is the hard row itself."""
    questions, labels, prototypes = _hard_rows_batch()
    result = balanced_set(questions, labels, prototypes, per_class=per_class, share=share, hard_k=1, beta=0.5,
                          generator=torch.Generator().manual_seed(0))
    own = result.labels == 0
    assert result.synthetic[own].sum().item() == len(synthetic) and (~result.synthetic[own]).sum() == per_class - 3
    expected = F.normalize(questions[synthetic], dim=-1)  # hard positive twice, then the hard negative
    assert torch.allclose(result.vectors[own & result.synthetic], expected, atol=1e-6)


def test_under_cosine_hardness_is_by_direction_and_every_row_is_unit_norm_whatever_the_encoders_lengths():
    """unit_norm (cosine, mlp) normalises the batch and the prototypes first: the encoder's vectors come in at their
    own lengths, and a long row must not look less hard (more similar to its prototype) by its length alone, nor a real
    row enter the set at it. Row 2, the hard positive, is 4× as long as the others: by inner product it was the most
    similar, and row 1 the hard positive."""
    questions, labels, prototypes = _hard_rows_batch()
    long = questions * torch.tensor([[1.0], [1.0], [4.0], [2.0]])
    mixed = balanced_set(long, labels, prototypes * 3.0, per_class=2, share=1.0, hard_k=1, beta=0.5,
                         generator=torch.Generator().manual_seed(0))
    assert torch.allclose(mixed.vectors[mixed.labels == 0], F.normalize(questions[[2, 1]], dim=-1), atol=1e-6)
    real = balanced_set(long, labels, prototypes * 3.0, per_class=3, share=0.0, hard_k=1, beta=0.5,
                        generator=torch.Generator().manual_seed(0))
    assert torch.allclose(real.vectors.norm(dim=-1), torch.ones(6), atol=1e-6)


def test_under_inner_product_the_balanced_set_keeps_the_vectors_lengths():
    torch.manual_seed(0)
    questions = torch.randn(10, 16) * torch.linspace(0.5, 3.0, 10).unsqueeze(1)  # (10, 16) lengths differ
    labels = torch.tensor([0] * 8 + [1] * 2)  # class 2 is absent: its prototype stands in
    prototypes = torch.randn(3, 16) * 2.0

    def build(share: float):
        return balanced_set(questions, labels, prototypes, per_class=4, share=share, hard_k=3, beta=0.5,
                            generator=torch.Generator().manual_seed(0), unit_norm=False)

    real = build(0.0)  # every row a real member, as it came
    pool = torch.cat([questions, prototypes[2:]])
    assert all(any(torch.equal(row, member) for member in pool) for row in real.vectors)
    mixed = build(1.0)  # every row a mixup: between its two vectors, never pulled onto the unit sphere
    assert not torch.allclose(mixed.vectors.norm(dim=-1), torch.ones(12), atol=1e-2)
    assert (mixed.vectors.norm(dim=-1) <= pool.norm(dim=-1).max() + 1e-5).all()


def test_balanced_set_carries_gradients_back_to_the_encoded_questions():
    questions = torch.randn(6, 8, requires_grad=True)
    prototypes = torch.randn(2, 8, requires_grad=True)
    result = balanced_set(questions, torch.tensor([0, 0, 0, 0, 0, 1]), prototypes, 3, 1.0, 2, 0.5, torch.Generator().manual_seed(1))
    (result.vectors @ F.normalize(prototypes, dim=-1).T).sum().backward()
    assert questions.grad.abs().sum() > 0 and prototypes.grad.abs().sum() > 0


def test_log_prior_ranks_rare_classes_lower_and_a_class_with_no_row_at_the_others_mean_as_the_prior_stage_does():
    """A class with no row was ranked lowest in training (plain smoothing) and at the mean by the prior stage: its
    offset made the loss push questions away from it as a negative ~30× more weakly than the shift served it."""
    from tqc.prior import log_prior

    prior = class_log_prior(torch.tensor([0] * 100 + [1] * 10 + [3] * 5), 4)  # (4,) class 2 has no row
    assert prior[0] > prior[1] > prior[3] > float("-inf")
    assert prior[2].item() == pytest.approx(prior[[0, 1, 3]].mean().item())
    served = log_prior(["a"] * 100 + ["b"] * 10 + ["d"] * 5, ["a", "b", "c", "d"])
    assert prior.tolist() == pytest.approx(served.tolist(), abs=1e-6)
    assert prior.dtype == torch.float32
    assert torch.exp(class_log_prior(torch.tensor([0] * 100 + [1] * 10), 2)).sum() == pytest.approx(1.0)


def test_joined_inputs_pair_questions_with_gold_as_relevant_and_other_batch_classes_as_not():
    questions = ["where is paris", "who wrote it", "how many cats", "where is rome"]
    gold = [0, 1, 2, 0]
    catalog = ["Where is the place?", "Who is the person?", "How many are there?"]
    joined = joined_inputs(questions, gold, [0, 1, 2], catalog, "[SEP]", share=0.5, negatives=2, rng=random.Random(0))
    assert len(set(joined.rows)) == 2 and len(joined.texts) == 2 * 3  # two rows, each 1 relevant + 2 not
    for text, relevant, row in zip(joined.texts, joined.relevant, joined.rows):
        question, standard = text.split(" [SEP] ")
        assert question == questions[row]
        assert (standard == catalog[gold[row]]) == relevant
    assert sum(joined.relevant) == 2


def test_joined_inputs_take_at_least_one_row_and_no_more_negatives_than_the_batch_has():
    joined = joined_inputs(["a"], [0], [0, 1], ["A", "B"], "[SEP]", share=0.1, negatives=5, rng=random.Random(0))
    assert joined.texts == ["a [SEP] A", "a [SEP] B"] and joined.relevant == [True, False]


def test_a_class_sharing_the_gold_standard_question_is_never_joined_as_not_relevant():
    """Twins' joins are one text: labelled "is not relevant" beside the gold's "is relevant", the two targets contradict."""
    catalog = ["Where is the place?", "Who is the person?", "Where is the place?"]  # class 2 shares class 0's text
    joined = joined_inputs(["where is paris"], [0], [0, 1, 2], catalog, "[SEP]", share=1.0, negatives=5,
                           rng=random.Random(0), groups=[0, 1, 0])
    assert joined.texts == ["where is paris [SEP] Where is the place?", "where is paris [SEP] Who is the person?"]
    assert joined.relevant == [True, False]


def test_a_long_question_is_shortened_so_its_joined_standard_question_stays_whole():
    """The encoder cuts from the right at max_length: the standard question went, its relevance target stayed."""
    count_words = lambda text: len(text.split()) + 2  # noqa: E731 - a stand-in tokenizer: a token a word, [CLS] and [SEP]
    fit = question_that_fits(count_words, 12)
    long_question = "where on earth is the city that people in the old days called paris"
    joined = joined_inputs([long_question], [0], [0, 1], ["Where is the place?", "Who is it?"], "[SEP]", share=1.0,
                           negatives=1, rng=random.Random(0), fit=fit)
    assert joined.texts == ["where on earth is the [SEP] Where is the place?", "where on earth is the city [SEP] Who is it?"]
    assert all(count_words(text) <= 12 for text in joined.texts)
    assert fit("where is paris", " [SEP] Where is the place?") == "where is paris"  # what fits stays as it is
    count_characters = lambda text: len(text.replace(" ", "")) + 2  # noqa: E731 - a token a character, as in Chinese
    assert question_that_fits(count_characters, 12)("我的银行卡丢了怎么办", " [SEP] 挂失") == "我的银"  # 3 + 7 + 2 = 12


def test_a_joined_input_is_never_pushed_away_from_its_own_questions_standard_question():
    # Two joins of a class-0 question (with its gold, then with class 2), one of a class-1 question; batch classes [0, 1, 2].
    # stage one's cross-encoding term: the batch's classes, then the two relevance texts, which are no class (−1)
    target = torch.tensor([3, 4, 3])  # is relevant, is not relevant, is relevant
    excluded = same_class_mask(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 2, -1, -1]), target)
    assert excluded.tolist() == [[True, False, False, False, False],
                                 [True, False, False, False, False],
                                 [False, True, False, False, False]]
    # (3, 5) scores seeded, and closer than the hinge's margin (0.2): unseeded, they drew from whatever the tests run
    # before had left of torch's global generator, and some draws met every margin, so hinge had no gradient at all
    scores = (0.01 * torch.randn(3, 5, generator=torch.Generator().manual_seed(0))).requires_grad_()
    for name in ("nt_xent", "bpr", "hinge", "sdml"):
        loss_fn = make_loss(name, 0.1, 0.2, 0.3)
        loss = loss_fn(scores, target, excluded)
        (gradient,) = torch.autograd.grad(loss, scores)
        assert torch.isfinite(loss) and gradient[excluded].abs().sum() == 0, name  # no push on the own-class column
        assert gradient[~excluded].abs().sum() > 0, name


def test_a_question_that_fits_exactly_is_kept_as_it_is():
    """At max_length to the token the join fits: the question is not re-spaced through its words."""
    count_words = lambda text: len(text.split()) + 2  # noqa: E731 - a token a word, [CLS] and [SEP]
    tail = " [SEP] Where is the place?"
    assert count_words("where  is paris" + tail) == 10
    assert question_that_fits(count_words, 10)("where  is paris", tail) == "where  is paris"


def test_a_join_whose_standard_question_alone_is_too_long_keeps_the_questions_first_word():
    """Nothing of the question fits beside a standard question this long; it is not emptied to nothing before
    [SEP], its first word stays (the encoder's truncation cuts what is left)."""
    count_words = lambda text: len(text.split()) + 2  # noqa: E731
    fit = question_that_fits(count_words, 6)
    assert fit("where is paris", " [SEP] Where on earth is the place?") == "where"
