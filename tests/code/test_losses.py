import math

import pytest
import torch

from tqc.losses import (bpr, class_log_prior, decoupled, hinge, make_loss, nt_xent, prior_offsets, same_class_mask, sdml,
                        standard_contrast, supervised_contrastive, triplet_margin)
from tqc.stages.stage_one import candidate_classes
from tqc.stages.stage_two import candidate_columns


def test_same_class_mask_hides_other_copies_of_own_class_only():
    row_labels = torch.tensor([0, 1, 0])
    column_labels = torch.tensor([0, 1, 0])  # per-row standard questions, as in a naive in-batch setup
    target = torch.tensor([0, 1, 2])
    mask = same_class_mask(row_labels, column_labels, target)
    assert mask.tolist() == [[False, False, True], [False, False, False], [True, False, False]]


def test_masked_in_batch_loss_equals_deduplicated_loss():
    torch.manual_seed(0)
    labels = torch.tensor([2, 0, 2, 1])  # class 2 twice, the others once
    # Unit vectors, as the cosine model scores: raw randn's scores/τ ran to ±100
    class_vectors = torch.nn.functional.normalize(torch.randn(3, 8), dim=-1)  # (3, 8)
    questions = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)  # (4, 8)
    # Naive in-batch: one standard-question column per row. Masked: the own class's other copies (same_class_mask)
    # and every later copy of another class, so each row sees each distinct class once.
    per_row_scores = questions @ class_vectors[labels].T  # (4, 4)
    own_copies = same_class_mask(labels, labels, torch.arange(4))  # (4, 4)
    first_copy = torch.tensor([bool(labels[:j].ne(labels[j]).all()) for j in range(4)])  # (4,)
    other_repeats = ~first_copy[None, :] & (labels[:, None] != labels[None, :])  # (4, 4)
    masked = nt_xent(per_row_scores, torch.arange(4), own_copies | other_repeats)
    # Deduplicated, as stage one trains: one column per distinct class in the batch.
    candidates, target = candidate_classes(labels, 3, "in_batch")
    assert candidates.tolist() == [0, 1, 2]
    deduplicated = nt_xent(questions @ class_vectors[candidates].T, target)
    assert torch.allclose(masked, deduplicated, atol=1e-6)
    # A class counted twice changes the loss, so the comparison can tell (with raw randn vectors the softmax was
    # one-hot and it could not: the test passed with no deduplication at all).
    assert not torch.allclose(deduplicated, nt_xent(per_row_scores, torch.arange(4), own_copies), atol=1e-3)
    assert not torch.allclose(deduplicated, nt_xent(per_row_scores, torch.arange(4)), atol=1e-3)


def test_unmasked_duplicates_would_push_a_question_from_its_own_class():
    labels = torch.tensor([0, 0])
    scores = torch.tensor([[1.0, 1.0], [1.0, 1.0]], requires_grad=True)  # both columns are class 0
    nt_xent(scores, torch.arange(2)).backward()
    assert scores.grad[0, 1] > 0  # without the mask, the same-class column is a negative
    scores.grad = None
    nt_xent(scores, torch.arange(2), same_class_mask(labels, labels, torch.arange(2))).backward()
    assert scores.grad[0, 1] == 0


@pytest.mark.parametrize("name", ["nt_xent", "decoupled", "bpr", "hinge", "sdml"])
def test_gradients_pull_the_positive_up_and_push_negatives_down(name):
    loss_fn = make_loss(name, temperature=0.1, margin=1.0, smoothing=0.0)
    scores = torch.tensor([[0.3, 0.2, 0.1], [0.0, 0.5, 0.4]], requires_grad=True)
    target = torch.tensor([0, 1])
    loss_fn(scores, target, None).backward()
    grad = scores.grad
    # Gradient descent moves scores by −grad: the positive must rise, the negatives fall.
    assert grad[0, 0] < 0 and grad[1, 1] < 0
    assert (grad[0, 1:] > 0).all() and grad[1, 0] > 0 and grad[1, 2] > 0


def test_nt_xent_matches_hand_computation():
    scores = torch.tensor([[0.5, 0.1, -0.2]])
    tau = 0.1
    expected = -torch.log(torch.exp(torch.tensor(5.0)) / torch.exp(scores[0] / tau).sum())
    assert torch.allclose(nt_xent(scores, torch.tensor([0]), temperature=tau), expected)


def test_decoupled_leaves_the_positive_out_of_the_denominator():
    scores = torch.tensor([[0.5, 0.1, -0.2], [0.0, 0.3, 0.4]])
    tau = 0.1
    expected = torch.stack([-5.0 + torch.logsumexp(torch.tensor([1.0, -2.0]), 0),
                            -3.0 + torch.logsumexp(torch.tensor([0.0, 4.0]), 0)]).mean()
    assert torch.allclose(decoupled(scores, torch.tensor([0, 1]), temperature=tau), expected)


def test_decoupled_keeps_pulling_a_positive_that_already_wins():
    easy = torch.tensor([[0.9, -0.9, -0.9]], requires_grad=True)  # the positive wins by far
    nt_xent(easy, torch.tensor([0])).backward()
    assert abs(easy.grad[0, 0]) < 1e-6  # softmax ≈ 1: NT-Xent has nothing left to say
    easy.grad = None
    decoupled(easy, torch.tensor([0]), temperature=0.1).backward()
    assert torch.isclose(easy.grad[0, 0], torch.tensor(-10.0))  # −1/τ, whatever the margin


def test_decoupled_masks_same_class_columns_and_skips_rows_without_negatives():
    scores = torch.tensor([[0.2, 0.9, 0.1], [0.4, 0.3, 0.0]], requires_grad=True)
    excluded = torch.tensor([[False, True, False], [False, True, True]])  # row 1 keeps only its target
    loss = decoupled(scores, torch.tensor([0, 0]), excluded, temperature=0.1)
    assert torch.allclose(loss, -2.0 + torch.tensor(1.0))  # row 0 only: −s⁺/τ + log exp(s₂/τ)
    loss.backward()
    assert torch.isfinite(scores.grad).all()
    assert scores.grad[0, 1] == 0 and (scores.grad[1] == 0).all()


def test_sdml_smoothing_still_pulls_the_positive_and_pushes_the_hardest_negative():
    scores = torch.tensor([[0.3, 0.25, -0.5]], requires_grad=True)
    sdml(scores, torch.tensor([0]), smoothing=0.3).backward()
    assert scores.grad[0, 0] < 0 and scores.grad[0, 1] > 0


def test_sdml_without_smoothing_is_nt_xent():
    scores = torch.randn(4, 6)
    target = torch.tensor([0, 3, 5, 1])
    assert torch.allclose(sdml(scores, target, smoothing=0.0), nt_xent(scores, target), atol=1e-6)


def test_hinge_and_bpr_by_hand():
    scores = torch.tensor([[1.0, 0.2, 0.1]])
    assert hinge(scores, torch.tensor([0]), margin=0.5).item() == 0.0
    assert hinge(scores, torch.tensor([0]), margin=0.9).item() == pytest.approx(0.1 + 0.0)  # max(0, 0.9 − 1 + 0.2)
    assert hinge(scores, torch.tensor([0]), margin=1.0).item() == pytest.approx(0.2 + 0.1)  # summed over negatives
    by_hand = (math.log1p(math.exp(-0.8 / 0.1)) + math.log1p(math.exp(-0.9 / 0.1))) / 2  # −log σ(x) = log(1 + e^−x)
    assert bpr(scores, torch.tensor([0]), temperature=0.1).item() == pytest.approx(by_hand, rel=1e-5)


def test_hinge_and_bpr_average_over_rows_whatever_each_row_masks():
    """Two rows, the second with one negative masked: each row's loss counts once (Eq. 4 and 5's 1/N over rows)."""
    scores = torch.tensor([[1.0, 0.2, 0.1], [0.5, 0.4, 0.9]])
    target, excluded = torch.tensor([0, 0]), torch.tensor([[False, False, False], [False, False, True]])
    hinge_rows = [max(0, 1.0 - 1.0 + 0.2) + max(0, 1.0 - 1.0 + 0.1), max(0, 1.0 - 0.5 + 0.4)]  # margin 1: 0.3, 0.9
    assert hinge(scores, target, excluded, margin=1.0).item() == pytest.approx(sum(hinge_rows) / 2)
    softplus = lambda x: math.log1p(math.exp(-x / 0.1))  # −log σ(x/τ)
    bpr_rows = [(softplus(0.8) + softplus(0.9)) / 2, softplus(0.1)]
    assert bpr(scores, target, excluded, temperature=0.1).item() == pytest.approx(sum(bpr_rows) / 2, rel=1e-5)


def test_bpr_row_without_negatives_adds_zero_not_nan():
    """A row whose other columns are all masked (every one its own class) has no pair: it adds 0 to Eq. 4's mean over
    rows, as the docstring says. Its mean over no negatives is 0/0, which made the whole batch's loss NaN."""
    scores = torch.tensor([[1.0, 0.2, 0.1], [0.5, 0.4, 0.9]], requires_grad=True)
    target, excluded = torch.tensor([0, 0]), torch.tensor([[False, False, False], [False, True, True]])
    loss = bpr(scores, target, excluded, temperature=0.1)
    softplus = lambda x: math.log1p(math.exp(-x / 0.1))  # −log σ(x/τ)
    assert loss.item() == pytest.approx((softplus(0.8) + softplus(0.9)) / 2 / 2, rel=1e-5)  # row 1 counts as 0
    loss.backward()
    assert torch.isfinite(scores.grad).all() and (scores.grad[1] == 0).all()


@pytest.mark.parametrize("name, direct", [
    ("nt_xent", lambda s, t, e: nt_xent(s, t, e, temperature=0.5)),
    ("decoupled", lambda s, t, e: decoupled(s, t, e, temperature=0.5)),
    ("sdml", lambda s, t, e: sdml(s, t, e, temperature=0.5, smoothing=0.2)),
    ("bpr", lambda s, t, e: bpr(s, t, e, temperature=0.5)),
    ("hinge", lambda s, t, e: hinge(s, t, e, margin=0.3)),
])
def test_make_loss_builds_the_named_loss_with_the_stages_settings(name, direct):
    """The gradient-direction test runs every name through make_loss, but at τ = 0.1 (every loss's default) and with
    checks any contrastive loss passes: a name wired to another loss (decoupled to nt_xent), or a setting not passed
    on (bpr at its default τ), went unnoticed. Here τ, margin and ε differ from the defaults."""
    scores = torch.tensor([[0.3, 0.2, 0.1, 0.9], [0.0, 0.5, 0.4, -0.2]])
    target = torch.tensor([0, 1])
    excluded = torch.tensor([[False, False, False, True], [False, False, False, False]])
    built = make_loss(name, temperature=0.5, margin=0.3, smoothing=0.2)
    assert built(scores, target, excluded).item() == pytest.approx(direct(scores, target, excluded).item(), rel=1e-6)
    with pytest.raises(ValueError, match="unknown loss 'infonce'"):
        make_loss("infonce", temperature=0.5, margin=0.3, smoothing=0.2)


def test_stage_two_columns_put_gold_first_and_encode_each_class_once():
    gold = torch.tensor([3, 1])
    negatives = torch.tensor([[1, 4], [3, 4]])
    distinct, columns = candidate_columns(gold, negatives, n_classes=5)
    assert distinct.tolist() == [1, 3, 4]  # 6 slots, 3 distinct standard questions
    assert distinct[columns].tolist() == [[3, 1, 4], [1, 3, 4]]


def test_stage_two_in_batch_variant_targets_each_rows_gold_among_distinct_classes():
    gold = torch.tensor([3, 1, 3])
    negatives = torch.tensor([[1, 4], [3, 4], [0, 1]])
    distinct, columns = candidate_columns(gold, negatives, n_classes=5)
    assert distinct.tolist() == [0, 1, 3, 4]
    assert distinct[columns[:, 0]].tolist() == [3, 1, 3]  # the target column holds the row's own class


def test_logit_adjusted_nt_xent_is_menons_loss_and_favours_the_rare_class_less_in_training():
    log_pi = class_log_prior(torch.tensor([0] * 90 + [1] * 9), 2)  # (2,) head 0, tail 1
    scores = torch.tensor([[0.30, 0.25], [0.30, 0.25]])  # (B=2, U=2) both rows' raw scores
    offsets = prior_offsets(log_pi, weight=1.0, temperature=0.1)  # (2,)
    assert torch.allclose(offsets, 0.1 * log_pi)
    adjusted = nt_xent(scores + offsets, torch.tensor([0, 1]), temperature=0.1)
    menon = torch.nn.functional.cross_entropy(scores / 0.1 + log_pi, torch.tensor([0, 1]))  # Menon et al. (2021), Eq. 10
    assert torch.allclose(adjusted, menon)
    # Training with the offsets: the head row's loss drops, the tail row's rises, so the encoder is asked
    # for a larger raw margin on the tail class than on the head one.
    plain_rows = torch.nn.functional.cross_entropy(scores / 0.1, torch.tensor([0, 1]), reduction="none")
    adjusted_rows = torch.nn.functional.cross_entropy(scores / 0.1 + log_pi, torch.tensor([0, 1]), reduction="none")
    assert adjusted_rows[0] < plain_rows[0] and adjusted_rows[1] > plain_rows[1]
    assert torch.equal(prior_offsets(log_pi, 0.0, 0.1)[torch.tensor([1, 0, 1])], torch.zeros(3))  # w = 0: off


def test_sdml_spreads_its_smoothing_over_the_valid_columns_only():
    """p' = (1 − ε)·onehot + ε/N over the N columns a row may be compared with (METHOD.md): a masked column (the row's
    own class elsewhere in the batch) gets no share and is not in the softmax. Computed by hand over the three valid
    columns: the target 0.7 + 0.1, each other 0.1."""
    scores = torch.tensor([[0.3, 0.25, -0.5, 0.9]])
    excluded = torch.tensor([[False, False, False, True]])
    log_p = torch.log_softmax(torch.tensor([0.3, 0.25, -0.5]) / 0.1, dim=0)
    expected = -(0.8 * log_p[0] + 0.1 * log_p[1] + 0.1 * log_p[2])
    assert torch.allclose(sdml(scores, torch.tensor([0]), excluded, temperature=0.1, smoothing=0.3), expected)


def test_triplet_margin_matches_ebsim_eq_5_by_hand():
    """EBSIM Eq. 5 with β = 1: mean of max(ξ(t,s_n) − ξ(t,s_p) + 1, 0) over the triplets."""
    closer, farther = torch.tensor([0.9, 0.2, 0.5]), torch.tensor([0.1, 0.4, 0.5])
    # rows: 0.1 − 0.9 + 1 = 0.2; 0.4 − 0.2 + 1 = 1.2; 0.5 − 0.5 + 1 = 1.0 → mean 0.8
    assert triplet_margin(closer, farther, margin=1.0).item() == pytest.approx(0.8)
    # the same as hinge on the two-column scores with the closer one the target
    assert triplet_margin(closer, farther, margin=0.3) == pytest.approx(
        hinge(torch.stack([closer, farther], dim=1), torch.zeros(3, dtype=torch.long), margin=0.3).item())


def test_triplet_margin_pushes_the_closer_up_and_the_farther_down():
    closer = torch.tensor([0.2, 0.0], requires_grad=True)
    farther = torch.tensor([0.1, 0.3], requires_grad=True)
    triplet_margin(closer, farther, margin=1.0).backward()
    # gradient descent moves each by −grad: ξ(t, s_p) rises, ξ(t, s_n) falls, each by 1/B
    assert closer.grad.tolist() == pytest.approx([-0.5, -0.5]) and farther.grad.tolist() == pytest.approx([0.5, 0.5])


def test_triplet_margin_is_zero_with_no_gradient_once_the_margin_is_met():
    closer = torch.tensor([0.9, 0.7], requires_grad=True)
    farther = torch.tensor([-0.2, 0.1], requires_grad=True)  # gaps 1.1 and 0.6, both at least β = 0.5
    loss = triplet_margin(closer, farther, margin=0.5)
    loss.backward()
    assert loss.item() == 0.0 and closer.grad.abs().sum() == 0 and farther.grad.abs().sum() == 0
    # a triplet short of the margin is the only one that trains
    closer.grad = farther.grad = None
    triplet_margin(closer, farther, margin=0.8).backward()
    assert closer.grad.tolist() == pytest.approx([0.0, -0.5]) and farther.grad.tolist() == pytest.approx([0.0, 0.5])


def _supervised_contrastive_by_hand(vectors, labels, temperature):
    """Khosla et al.'s L_out written as loops, the oracle for the vectorised loss."""
    unit = torch.nn.functional.normalize(vectors, dim=-1)
    row_losses = []
    for i in range(len(labels)):
        others = [k for k in range(len(labels)) if k != i]
        classmates = [p for p in others if labels[p] == labels[i]]
        if not classmates:
            continue
        denominator = sum(math.exp(float(unit[i] @ unit[k]) / temperature) for k in others)
        row_losses.append(sum(-math.log(math.exp(float(unit[i] @ unit[p]) / temperature) / denominator)
                              for p in classmates) / len(classmates))
    return sum(row_losses) / len(row_losses)


def test_supervised_contrastive_equals_khosla_et_al_written_as_loops():
    torch.manual_seed(0)
    vectors = torch.randn(7, 5)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 3])  # class 2 and 3 have no classmate: their rows add nothing
    loss = supervised_contrastive(vectors, labels, temperature=0.5)
    assert loss.item() == pytest.approx(_supervised_contrastive_by_hand(vectors, labels, 0.5), rel=1e-5)


def test_supervised_contrastive_pulls_classmates_together_and_pushes_other_classes_apart():
    vectors = torch.tensor([[1.0, 0.2], [0.6, 0.8], [0.9, -0.3]], requires_grad=True)  # rows 0 and 1 share a class
    supervised_contrastive(vectors, torch.tensor([5, 5, 7]), temperature=0.1).backward()
    step = -vectors.grad  # the direction gradient descent moves each vector
    unit = torch.nn.functional.normalize(vectors.detach(), dim=-1)
    moved = torch.nn.functional.normalize(vectors.detach() + 1e-3 * step, dim=-1)
    assert (moved[0] @ moved[1]) > (unit[0] @ unit[1])  # classmates closer
    assert (moved[0] @ unit[2]) < (unit[0] @ unit[2])  # row 0 away from the other class's row


def test_supervised_contrastive_is_zero_with_a_graph_when_no_row_has_a_classmate():
    vectors = torch.randn(3, 4, requires_grad=True)
    loss = supervised_contrastive(vectors, torch.tensor([0, 1, 2]))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(vectors.grad, torch.zeros_like(vectors))


def _standard_contrast_by_hand(scores, target, excluded, temperature):
    """Each column's positives (its target rows), each against the column's negatives, written as loops: the oracle."""
    column_losses = []
    for c in range(scores.shape[1]):
        positives = [b for b in range(len(target)) if target[b] == c]
        if not positives:
            continue
        negatives = [b for b in range(len(target)) if b not in positives and not excluded[b, c]]
        if not negatives:
            column_losses.append(0.0)
            continue
        pushed = sum(math.exp(float(scores[n, c]) / temperature) for n in negatives)
        column_losses.append(sum(-math.log(math.exp(float(scores[p, c]) / temperature)
                                           / (math.exp(float(scores[p, c]) / temperature) + pushed))
                                 for p in positives) / len(positives))
    return sum(column_losses) / len(column_losses)


def test_standard_contrast_equals_its_loops_with_cells_excluded_and_a_column_no_row_targets():
    torch.manual_seed(0)
    scores = torch.rand(6, 4) * 2 - 1  # (B, C) cosines
    target = torch.tensor([0, 2, 0, 1, 2, 0])  # column 3 is no row's target: it adds nothing
    excluded = torch.zeros(6, 4, dtype=torch.bool)
    excluded[3, 0] = excluded[1, 3] = True  # row 3 neither positive nor negative for column 0
    loss = standard_contrast(scores, target, excluded, temperature=0.5)
    assert loss.item() == pytest.approx(_standard_contrast_by_hand(scores, target, excluded, 0.5), rel=1e-5)
    nothing_excluded = torch.zeros_like(excluded)
    assert standard_contrast(scores, target, temperature=0.5).item() == pytest.approx(
        _standard_contrast_by_hand(scores, target, nothing_excluded, 0.5), rel=1e-5)
    assert standard_contrast(scores, target, excluded, temperature=0.5) != standard_contrast(scores, target, temperature=0.5)


def test_standard_contrast_of_a_column_without_negatives_is_zero_with_a_finite_gradient():
    scores = torch.rand(3, 2, requires_grad=True)
    target = torch.tensor([0, 0, 1])
    excluded = torch.tensor([[False, False], [False, False], [True, False]])  # column 0's one other row is its twin's
    loss = standard_contrast(scores, target, excluded)
    loss.backward()
    # column 0 adds 0 and pulls nothing; column 1 (rows 0 and 1 its negatives) alone trains
    assert loss.item() == pytest.approx(_standard_contrast_by_hand(scores.detach(), target, excluded, 0.1), rel=1e-5)
    assert torch.isfinite(scores.grad).all() and scores.grad[:, 0].abs().sum() == 0 and scores.grad[:, 1].abs().sum() > 0


def test_standard_contrast_with_one_question_a_class_is_nt_xent_of_the_transposed_scores():
    """One row a class, one column a row: each standard question's softmax over the questions is NT-Xent with the
    roles swapped (CLIP's two halves)."""
    torch.manual_seed(2)
    scores = torch.rand(4, 4)
    permutation = torch.tensor([2, 0, 3, 1])  # row b's class is column permutation[b]
    inverse = torch.argsort(permutation)  # column c's row
    assert standard_contrast(scores, permutation, temperature=0.1).item() == pytest.approx(
        nt_xent(scores.T, inverse, temperature=0.1).item(), rel=1e-6)


def test_standard_contrast_raises_each_columns_own_rows_and_lowers_the_others_and_ignores_column_offsets():
    scores = torch.tensor([[0.5, 0.1], [0.2, 0.4], [0.3, 0.3]], requires_grad=True)  # (3, 2)
    target = torch.tensor([0, 1, 0])
    standard_contrast(scores, target, temperature=0.1).backward()
    step = -scores.grad  # gradient descent's move of each score
    assert step[0, 0] > 0 and step[2, 0] > 0 and step[1, 0] < 0  # column 0: its rows 0 and 2 up, row 1 down
    assert step[1, 1] > 0 and step[0, 1] < 0 and step[2, 1] < 0
    offsets = torch.tensor([[0.7, -0.4]])  # a class's prior offset, the same down its column
    assert standard_contrast(scores + offsets, target, temperature=0.1).item() == pytest.approx(
        standard_contrast(scores, target, temperature=0.1).item(), rel=1e-6)


def test_supervised_contrastive_ignores_vector_length():
    torch.manual_seed(1)
    vectors, labels = torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2])
    lengths = torch.tensor([[0.5], [3.0], [1.0], [7.0], [0.1], [2.0]])
    assert torch.allclose(supervised_contrastive(vectors, labels), supervised_contrastive(vectors * lengths, labels))


def test_supervised_contrastive_is_float32_under_the_training_steps_bf16_autocast():
    """On CUDA the training step runs under bf16 autocast, which casts a matmul's inputs whatever their dtype: this
    loss's gradient was 16% off its float32 one (a reviewer's run; here the same autocast on the CPU)."""
    torch.manual_seed(0)
    centres = torch.nn.functional.normalize(torch.randn(6, 384), dim=-1)  # (6, D)
    labels = torch.randint(0, 6, (64,))  # (B,)
    vectors = (centres[labels] * 3 + 0.6 * torch.randn(64, 384) / 384**0.5 * 3).requires_grad_(True)  # (B, D) clustered
    supervised_contrastive(vectors, labels, temperature=0.1).backward()
    reference, vectors.grad = vectors.grad.clone(), None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = supervised_contrastive(vectors, labels, temperature=0.1)
    loss.backward()  # outside autocast, as _train_epoch does
    assert loss.dtype == torch.float32
    assert (vectors.grad - reference).norm() / reference.norm() < 1e-4
