import numpy as np
import pytest

from tqc.config import PromoteParams
from tqc.promotion import class_changes, decide, macro_f1_over, one_answers_weight, paired_bootstrap, tail_classes


def test_paired_bootstrap_interval_brackets_the_observed_difference():
    rng = np.random.default_rng(0)
    champion = rng.random(400) < 0.7
    challenger = champion | (rng.random(400) < 0.3)  # fixes some errors, breaks none
    result = paired_bootstrap(challenger, champion, samples=2000, confidence=0.95)
    assert result.difference == pytest.approx(challenger.mean() - champion.mean())
    assert 0.0 < result.low < result.difference < result.high


def test_the_bootstrap_draws_as_a_resample_of_questions_does_without_holding_one():
    """Counts of −1, 0 and +1 drawn at once have a resample's distribution; the (S, N) resample it replaces took
    611 MiB at 20,000 validation questions."""
    rng = np.random.default_rng(1)
    champion = rng.random(300) < 0.7
    challenger = np.where(rng.random(300) < 0.2, ~champion, champion)  # fixes some errors, makes others
    differences = challenger.astype(float) - champion.astype(float)
    resampled = differences[rng.integers(0, 300, size=(4000, 300))].mean(axis=1)  # (S,) the resample itself
    result = paired_bootstrap(challenger, champion, samples=4000, confidence=0.9)
    assert result.low == pytest.approx(np.quantile(resampled, 0.05), abs=0.005)
    assert result.high == pytest.approx(np.quantile(resampled, 0.95), abs=0.005)


def test_identical_models_have_a_zero_width_interval_and_are_not_promoted():
    correct = np.array([True, False, True, True])
    result = paired_bootstrap(correct, correct, samples=500, confidence=0.9)
    assert result.low == result.high == result.difference == 0.0
    gold, predicted = np.array([0, 1, 2, 2]), np.array([0, 0, 2, 2])
    decision = decide(gold, predicted, predicted.copy(), np.array([1]), ["1"], PromoteParams())
    assert not decision.promote and "lower bound not above +0.0000" in decision.reasons[0]


def test_the_tail_is_the_rarest_third_of_classes_by_training_count():
    train = ["a"] * 10 + ["b"] * 1 + ["c"] * 5 + ["d"] * 2 + ["e"] * 8 + ["f"] * 9
    assert tail_classes(train, ["a", "b", "c", "d", "e", "f"], 1 / 3) == ["b", "d"]
    assert tail_classes(train, ["a", "b", "c", "d", "e", "f", "g"], 0.1) == ["g"]  # never seen in train: rarest
    assert tail_classes(train, [], 1 / 3) == []  # no class to judge: no tail


def test_a_tail_of_classes_validation_can_judge_vetoes_what_one_of_unjudged_classes_passed():
    """The gate's tail is drawn from the classes its validation questions hold. Drawn from the whole catalog, it was
    the two classes of 2 and 1 training rows, which have no validation row: 0 vs 0, and a challenger wrong on every
    question of C and D passed."""
    train = ["A"] * 100 + ["B"] * 100 + ["C"] * 50 + ["D"] * 6 + ["E"] * 2 + ["F"] * 1
    catalog = ["A", "B", "C", "D", "E", "F"]
    gold = np.array([0] * 10 + [1] * 10 + [2] * 5 + [3] * 2)  # (27,) no E or F question
    challenger = np.where(gold >= 2, 0, gold)  # every C and D question answered A
    lenient = PromoteParams(min_improvement=-1.0)
    judged = [catalog[c] for c in sorted(set(gold.tolist()))]
    for judged_from, promoted in ((catalog, True), (judged, False)):
        tail = tail_classes(train, judged_from, 1 / 3)
        decision = decide(gold, challenger, gold.copy(), np.array([catalog.index(c) for c in tail]), tail, lenient)
        assert decision.promote is promoted, (tail, decision.reasons)


def test_tail_macro_f1_counts_only_the_tail_labels():
    gold, predicted = np.array([0, 0, 1, 2]), np.array([0, 0, 2, 2])
    assert macro_f1_over(gold, predicted, np.array([0])) == 1.0
    assert macro_f1_over(gold, predicted, np.array([1, 2])) == pytest.approx((0.0 + 2 / 3) / 2)


GOLD = np.array([0] * 40 + [1] * 40 + [2] * 10)
TAIL = np.array([2])


def test_a_clearly_better_challenger_is_promoted():
    champion = GOLD.copy()
    champion[:30] = 1  # 30 errors on the head class
    decision = decide(GOLD, GOLD.copy(), champion, TAIL, ["2"], PromoteParams())
    assert decision.promote and decision.bootstrap.low > 0


def test_a_worse_challenger_is_not_promoted():
    challenger = GOLD.copy()
    challenger[:30] = 1
    decision = decide(GOLD, challenger, GOLD.copy(), TAIL, ["2"], PromoteParams())
    assert not decision.promote and "not above" in decision.reasons[0]


def test_a_better_overall_challenger_that_loses_the_tail_is_not_promoted():
    champion = GOLD.copy()
    champion[:30] = 1
    challenger = GOLD.copy()
    challenger[80:86] = 0  # 6 of the 10 tail questions lost, still +24 questions overall
    decision = decide(GOLD, challenger, champion, TAIL, ["2"], PromoteParams(tail_tolerance=0.05))
    assert decision.bootstrap.low > 0 and not decision.promote and "beyond" in decision.reasons[1]


def test_a_tail_verdict_one_answer_can_swing_says_so():
    """30 tail classes of one validation question each: one changed answer moves their macro-F1 by 1/30, more than
    the default tolerance, so the veto comes from one answer, and the reason says what to do about it."""
    gold = np.concatenate([np.zeros(60, dtype=int), np.arange(1, 31)])  # a head class, 30 one-question tail classes
    champion, challenger = gold.copy(), gold.copy()
    challenger[60] = 0  # one tail question lost
    tail = np.arange(1, 31)
    assert one_answers_weight(gold, tail) == pytest.approx(1 / 30)
    decision = decide(gold, challenger, champion, tail, [str(t) for t in tail], PromoteParams())
    assert not decision.promote and ("beyond the tolerance 0.0200 (one answer moves it by about 0.0333 here, more than "
                                     "the tolerance: the rarest tail classes have few validation questions") in decision.reasons[1]
    collapsed = gold.copy()
    collapsed[60:75] = 0  # half the tail lost: no matter of resolution, and not said to be
    assert "one answer" not in decide(gold, collapsed, champion, tail, [str(t) for t in tail], PromoteParams()).reasons[1]
    # with thirty questions a tail class, one answer weighs less than the tolerance: no such remark
    many = np.repeat(np.arange(3), 30)
    assert one_answers_weight(many, np.array([1, 2])) == pytest.approx(1 / (59 * 2))
    lost = many.copy()
    lost[30:45] = 0
    assert "one answer" not in decide(many, lost, many.copy(), np.array([1, 2]), ["1", "2"], PromoteParams()).reasons[1]


def test_the_first_model_becomes_champion():
    decision = decide(GOLD, GOLD.copy(), None, TAIL, ["2"], PromoteParams())
    assert decision.promote and decision.bootstrap is None


def test_class_changes_name_the_classes_whose_validation_f1_moved_most_and_leave_the_others_out():
    gold = np.array([0, 0, 1, 1, 2, 2])
    champion = np.array([0, 0, 1, 1, 2, 0])
    challenger = np.array([0, 0, 2, 1, 2, 2])  # class 1 loses a question to class 2; class 2 gains its own back
    changes = class_changes(gold, challenger, champion, ["A", "B", "C"])
    assert [c["class_id"] for c in changes] == ["B", "A", "C"]  # A's F1 rises too: it no longer takes C's question
    b = changes[0]
    assert b["support"] == 2 and b["champion_f1"] == 1.0 and b["challenger_f1"] == pytest.approx(2 / 3)
    assert b["difference"] == pytest.approx(-1 / 3)
    assert class_changes(gold, champion, champion, ["A", "B", "C"]) == []
    # a class the catalog lacks (−1, a champion of another catalog) is not a class here
    assert all(c["class_id"] in "ABC" for c in class_changes(gold, challenger, np.array([0, 0, 1, 1, -1, -1]), ["A", "B", "C"]))


def test_the_tail_bootstrap_draws_as_a_resample_of_questions_and_starts_from_the_observed_macro_f1():
    """The (S, U + 1) multinomial counts stand for an (S, N) resample of the validation questions, each with both
    models' answers; at the observed counts they give macro_f1_over's figures."""
    from tqc.promotion import paired_bootstrap_macro_f1

    rng = np.random.default_rng(2)
    gold = rng.integers(0, 8, size=240)
    champion = np.where(rng.random(240) < 0.75, gold, rng.integers(0, 8, size=240))
    challenger = np.where(rng.random(240) < 0.2, rng.integers(0, 8, size=240), champion)
    tail = np.array([5, 6, 7, 9])  # 9: a tail class no question has nor any answer gives, an F1 of 0 in both
    result = paired_bootstrap_macro_f1(gold, challenger, champion, tail, samples=3000, confidence=0.9)
    assert result.difference == pytest.approx(macro_f1_over(gold, challenger, tail) - macro_f1_over(gold, champion, tail))
    draws = rng.integers(0, 240, size=(3000, 240))  # (S, N) the resample itself
    resampled = [macro_f1_over(gold[d], challenger[d], tail) - macro_f1_over(gold[d], champion[d], tail) for d in draws]
    assert result.low == pytest.approx(np.quantile(resampled, 0.05), abs=0.01)
    assert result.high == pytest.approx(np.quantile(resampled, 0.95), abs=0.01)


def test_with_tail_check_bootstrap_only_a_tail_loss_the_bootstrap_shows_vetoes():
    """One lost answer of 30 one-question tail classes vetoed a challenger 20 questions better; under the bootstrap
    check it does not, and a tail that lost half its questions is still vetoed."""
    gold = np.concatenate([np.zeros(60, dtype=int), np.arange(1, 31)])  # a head class, 30 one-question tail classes
    champion = gold.copy()
    champion[:20] = 31  # 20 head questions wrong (answered as another head class)
    challenger = gold.copy()
    challenger[60] = 0  # one tail question lost, the 20 head questions right
    tail, ids = np.arange(1, 31), [str(t) for t in range(1, 31)]
    point = decide(gold, challenger, champion, tail, ids, PromoteParams())
    lenient = decide(gold, challenger, champion, tail, ids, PromoteParams(tail_check="bootstrap"))
    assert point.bootstrap.low > 0 and not point.promote
    assert lenient.promote and lenient.tail_bootstrap.high >= -0.02
    assert "no loss beyond the tolerance 0.0200 shown (tail_check: bootstrap)" in lenient.reasons[1]
    assert "CI of the difference [" in point.reasons[1]  # the point check reports the interval too
    collapsed = challenger.copy()
    collapsed[60:75] = 0  # half the tail lost
    vetoed = decide(gold, collapsed, champion, tail, ids, PromoteParams(tail_check="bootstrap"))
    assert not vetoed.promote and vetoed.tail_bootstrap.high < -0.02 and "a loss beyond the tolerance" in vetoed.reasons[1]


def test_a_challenger_ahead_by_a_point_difference_the_interval_does_not_clear_is_not_promoted():
    """The lower bound decides, not the point difference or the upper bound: 1 question of 40 better, CI [0, +0.075]."""
    gold = np.arange(40) % 4
    champion, challenger = gold.copy(), gold.copy()
    champion[:3] = (gold[:3] + 1) % 4
    challenger[:2] = (gold[:2] + 1) % 4
    decision = decide(gold, challenger, champion, np.array([3]), ["3"], PromoteParams())
    assert decision.bootstrap.difference > 0 and decision.bootstrap.low <= 0 < decision.bootstrap.high
    assert not decision.promote and "not above" in decision.reasons[0]


def test_a_tail_exactly_as_good_as_the_champions_is_within_a_zero_tolerance():
    champion = GOLD.copy()
    champion[:30] = 1  # head errors only: the tail answers are the same
    decision = decide(GOLD, GOLD.copy(), champion, TAIL, ["2"], PromoteParams(tail_tolerance=0.0))
    assert decision.challenger_tail_macro_f1 == decision.champion_tail_macro_f1
    assert decision.promote and "within the tolerance 0.0000" in decision.reasons[1]


def test_under_tail_check_bootstrap_a_challenger_no_better_overall_is_not_promoted_though_its_tail_passes():
    same = GOLD.copy()
    decision = decide(GOLD, same, same.copy(), TAIL, ["2"], PromoteParams(tail_check="bootstrap"))
    assert "no loss beyond" in decision.reasons[1] and not decision.promote


def test_promote_s_closing_line_says_no_version_holds_the_alias_not_v_none(caplog):
    """A challenger not promoted while no version holds the alias (it moved off while the gate judged) was said as
    "champion stays vNone"."""
    from tqc.promotion import Decision
    from tqc.stages.promote import _log_outcome

    params = PromoteParams()
    with caplog.at_level("INFO", logger="tqc.stages.promote"):
        _log_outcome(params, "3", None, Decision(False, ["the alias moved"], None, [], 0.0, None))
        _log_outcome(params, "4", "2", Decision(False, ["worse"], None, [], 0.0, None))
    assert "vNone" not in caplog.text and f"not promoted ({params.alias} stays no version)" in caplog.text
    assert f"not promoted ({params.alias} stays v2)" in caplog.text
