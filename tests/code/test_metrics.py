import numpy as np
import pytest
from sklearn.metrics import (accuracy_score, f1_score, label_ranking_average_precision_score, precision_recall_fscore_support,
                             top_k_accuracy_score)

from tqc.metrics import confused_pairs, gold_ranks, macro_f1, macro_f1_gold_classes, per_class_prf, summary


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(300, 7))
    gold = rng.integers(0, 7, size=300)
    scores[np.arange(300), gold] += rng.uniform(0, 2, size=300)  # better than chance
    predicted = scores.argmax(axis=1)
    metrics = summary(scores, gold)
    assert metrics["accuracy"] == pytest.approx(accuracy_score(gold, predicted))
    assert metrics["macro_f1"] == pytest.approx(f1_score(gold, predicted, average="macro"))
    precision, recall, f1, support = precision_recall_fscore_support(gold, predicted, labels=np.arange(7), zero_division=0)
    ours = per_class_prf(gold, predicted, np.arange(7))
    assert [ours[c]["precision"] for c in range(7)] == pytest.approx(precision.tolist())
    assert [ours[c]["recall"] for c in range(7)] == pytest.approx(recall.tolist())
    assert [ours[c]["f1"] for c in range(7)] == pytest.approx(f1.tolist())
    assert [ours[c]["support"] for c in range(7)] == support.tolist()
    # Hits@k is top-k accuracy; with one relevant class, MRR is label-ranking average precision (1 / its rank)
    assert metrics["hits_at_3"] == pytest.approx(top_k_accuracy_score(gold, scores, k=3, labels=np.arange(7)))
    assert metrics["mrr"] == pytest.approx(label_ranking_average_precision_score(np.eye(7)[gold], scores))


def test_macro_f1_counts_predicted_only_labels_like_scikit_learn():
    gold, predicted = np.array([0, 0, 1]), np.array([0, 2, 1])
    assert macro_f1(gold, predicted) == pytest.approx(f1_score(gold, predicted, average="macro"))


def test_macro_f1_over_gold_classes_leaves_out_predicted_only_labels_like_scikit_learn_with_labels():
    gold, predicted = np.array([0, 0, 1, 1]), np.array([0, 2, 1, 3])
    expected = f1_score(gold, predicted, average="macro", labels=np.unique(gold))
    assert macro_f1_gold_classes(gold, predicted) == pytest.approx(expected)
    assert macro_f1_gold_classes(gold, predicted) > macro_f1(gold, predicted)  # labels 2 and 3 add zeros there
    assert summary(np.eye(4)[predicted], gold)["macro_f1_gold_classes"] == pytest.approx(expected)


def test_ranks_hits_and_mrr_by_hand():
    scores = np.array([[0.9, 0.1, 0.0], [0.2, 0.5, 0.9], [0.1, 0.3, 0.2]])
    gold = np.array([0, 0, 2])  # ranks 1, 3, 2
    assert gold_ranks(scores, gold).tolist() == [1, 3, 2]
    metrics = summary(scores, gold, hits_at=(1, 2))
    assert metrics["hits_at_1"] == pytest.approx(1 / 3)
    assert metrics["hits_at_2"] == pytest.approx(2 / 3)
    assert metrics["mrr"] == pytest.approx((1 + 1 / 3 + 1 / 2) / 3)


def test_hits_at_k_is_null_where_k_reaches_the_class_count():
    scores = np.array([[0.9, 0.1, 0.0], [0.2, 0.5, 0.9]])  # (2, 3): gold ranks 1 and 3
    metrics = summary(scores, np.array([0, 0]), hits_at=(1, 2, 3, 10))
    assert metrics["hits_at_2"] == pytest.approx(1 / 2)
    assert metrics["hits_at_3"] is None and metrics["hits_at_10"] is None  # every gold is within 3 of 3 classes


def test_ties_rank_as_argmax_predicts_so_hits_at_1_is_accuracy():
    scores = np.array([[0.5, 0.5, 0.1], [0.5, 0.5, 0.1], [0.2, 0.7, 0.7], [0.3, -np.inf, -np.inf]])  # (4, 3)
    gold = np.array([1, 0, 2, 2])
    assert gold_ranks(scores, gold).tolist() == [2, 1, 2, 3]  # a class without exemplars (−inf) ranks last
    metrics = summary(scores, gold)
    assert metrics["hits_at_1"] == metrics["accuracy"] == 0.25

    # a −inf gold ranks after every −inf class, whatever its index (gold 1 ranked 2 before, by index alone)
    assert gold_ranks(scores[3:].repeat(2, axis=0), np.array([1, 2])).tolist() == [3, 3]
    everything_unknown = np.full((1, 3), -np.inf)  # argmax says class 0: hits@1 stays accuracy
    assert gold_ranks(everything_unknown, np.array([0])).tolist() == [1]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_infinite_scores_are_an_error_not_a_figure(bad):
    with pytest.raises(ValueError, match=r"NaN or \+inf in 1 row\(s\) \(first: \[1\]\)"):
        summary(np.array([[0.1, 0.9], [bad, 0.2]]), np.array([1, 0]))


def test_confused_pairs_are_sorted_by_count():
    gold = np.array([0, 0, 0, 1, 1, 2])
    predicted = np.array([1, 1, 0, 0, 2, 2])
    assert confused_pairs(gold, predicted, 2) == [(0, 1, 2), (1, 0, 1)]


def test_confused_pairs_of_one_count_are_in_gold_then_predicted_order_not_first_seen():
    """Ties in (gold, predicted) order, so metrics.json's list is the same whatever the test rows' order."""
    gold = np.array([2, 1, 1, 0])
    predicted = np.array([0, 2, 0, 2])
    assert confused_pairs(gold, predicted, 3) == [(0, 2, 1), (1, 0, 1), (1, 2, 1)]


def test_evaluate_names_the_rule_validation_prefers_by_the_gates_figure():
    from tqc.stages.evaluate import rule_on_validation

    def metrics(standard: float, nearest: float | None) -> dict:
        exemplars = {"validation": {"accuracy": nearest, "macro_f1": 0.0}} if nearest is not None else None
        return {"validation": {"accuracy": standard, "macro_f1": 1.0}, "exemplars": exemplars}

    assert "prefers the exemplar rule (accuracy 0.7300 against the standard questions' 0.7200)" in rule_on_validation(metrics(0.72, 0.73))
    assert "promote.rule: exemplars would serve it" in rule_on_validation(metrics(0.72, 0.73))
    assert "auto chooses on the validation questions the champion did not learn from" in rule_on_validation(metrics(0.72, 0.73))
    assert rule_on_validation(metrics(0.7342, 0.7300)).startswith("validation keeps the standard-question rule")
    assert rule_on_validation(metrics(0.73, 0.73)).endswith("promote.rule: standard")  # a tie keeps the headline rule
    assert "not scored" in rule_on_validation(metrics(0.73, None))


def test_one_seed_has_no_spread_rather_than_a_spread_of_zero():
    """metrics.json said std 0.0 for the default single seed, which reads as "no spread" rather than "not measured"."""
    from tqc.metrics import seed_std

    assert seed_std([0.9]) is None
    assert seed_std([0.9, 0.8]) == pytest.approx(0.1 / 2 ** 0.5)


def test_plot_tables_quote_class_ids_holding_commas_quotes_and_line_breaks(tmp_path):
    """A quoted catalog id may hold any of them; joined by hand, the confusion table's rows were cut in two."""
    import csv

    from tqc.schema import Catalog, LabeledQuestion, StandardQuestion
    from tqc.stages.evaluate import _write_confusion

    ids = ["a\nb", "c,d", 'e"f', "g\rh", "plain"]
    catalog = Catalog([StandardQuestion(class_id, f"What is {i}?") for i, class_id in enumerate(ids)])
    questions = [LabeledQuestion(f"q{i}", class_id) for i, class_id in enumerate(ids)]
    scores = np.eye(len(ids))[::-1]  # (N, P): each question predicted as the class at the other end
    _write_confusion(tmp_path / "confusion.csv", scores, questions, catalog)
    with open(tmp_path / "confusion.csv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["actual"], row["predicted"]) for row in rows] == list(zip(ids, ids[::-1]))

    from tqc.config import Params
    from tqc.stages.evaluate import _write_similarity_profile

    params = Params.model_validate({"evaluate": {"profile_questions": 2}})
    _write_similarity_profile(tmp_path, {"zero_shot": scores, "admc": scores}, questions, catalog, params)
    with open(tmp_path / "similarity_profile.csv", encoding="utf-8", newline="") as handle:
        profile = list(csv.DictReader(handle))
    assert len(profile) == 2 * len(ids) and {row["class"] for row in profile} == set(ids)


def test_similarity_profile_draws_dollar_signs_as_text_not_mathtext(tmp_path):
    """matplotlib read a title or tick label with two `$` as mathtext: "$5 or $10" lost its dollars to italics, and
    one that is not valid mathtext ("$_$", "$\\x$") failed savefig, so evaluate stopped after all its training."""
    from tqc.config import Params
    from tqc.schema import Catalog, LabeledQuestion, StandardQuestion
    from tqc.stages.evaluate import _write_similarity_profile

    ids = ["$\\x$", "plain"]
    catalog = Catalog([StandardQuestion(class_id, f"What is {i}?") for i, class_id in enumerate(ids)])
    questions = [LabeledQuestion("How do I type $_$ in a template ?", ids[0]), LabeledQuestion("Is it $5 or $10 ?", ids[1])]
    scores = np.eye(2)  # (N, P)
    params = Params.model_validate({"evaluate": {"profile_questions": 2}})
    _write_similarity_profile(tmp_path, {"zero_shot": scores, "admc": scores}, questions, catalog, params)
    assert (tmp_path / "similarity_profile.png").stat().st_size > 0  # "$_$" as mathtext failed savefig


def test_similarity_profile_titles_and_ticks_are_drawn_as_text_not_mathtext(tmp_path, monkeypatch):
    """The figure saved above could still draw "$5 or $10" as italic mathtext: each text must say it is not parsed."""
    import matplotlib.figure

    from tqc.config import Params
    from tqc.schema import Catalog, LabeledQuestion, StandardQuestion
    from tqc.stages.evaluate import _write_similarity_profile

    texts = []

    def savefig(figure, *args, **kwargs):
        for axis in figure.axes:
            texts.extend([axis.title, *axis.get_xticklabels()])

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    catalog = Catalog([StandardQuestion(class_id, f"What is {class_id}?") for class_id in ("$a$", "b")])
    questions = [LabeledQuestion("Is it $5 or $10 ?", "b"), LabeledQuestion("q", "$a$")]
    params = Params.model_validate({"evaluate": {"profile_questions": 2}})
    _write_similarity_profile(tmp_path, {"zero_shot": np.eye(2), "admc": np.eye(2)}, questions, catalog, params)
    dollars = [text for text in texts if "$" in text.get_text()]
    assert any("$5 or $10" in text.get_text() for text in dollars) and any(t.get_text() == "$a$" for t in dollars)
    assert all(text.get_parse_math() is False for text in dollars)


def test_similarity_profile_names_its_axes_and_the_gold_line(tmp_path, monkeypatch):
    """Figure 3's bars had no y-axis label (cosine? logits?) and nothing said the dotted line is the gold class."""
    import matplotlib.figure

    from tqc.config import Params
    from tqc.schema import Catalog, LabeledQuestion, StandardQuestion
    from tqc.stages.evaluate import _write_similarity_profile

    drawn = {}

    def savefig(figure, *args, **kwargs):
        drawn["ylabels"] = [axis.get_ylabel() for axis in figure.axes]
        drawn["xlabel"] = figure.axes[-1].get_xlabel()
        drawn["legend"] = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    catalog = Catalog([StandardQuestion(class_id, f"What is {class_id}?") for class_id in ("A", "B", "C")])
    questions = [LabeledQuestion("q0", "A"), LabeledQuestion("q1", "C")]
    params = Params.model_validate({"evaluate": {"profile_questions": 2}, "model": {"similarity": "cosine"}})
    _write_similarity_profile(tmp_path, {"zero_shot": np.eye(3)[:2], "admc": np.eye(3)[:2]}, questions, catalog, params)
    assert drawn["ylabels"] == ["similarity (cosine)"] * 2  # model.similarity
    assert drawn["xlabel"] == "standard question (class id)"
    assert drawn["legend"] == ["gold class", "before (zero-shot)", "after (ADMC)"]


def test_similarity_profile_labels_show_control_characters_as_escapes(tmp_path, monkeypatch):
    """A quoted catalog id's "\\r" drew as a missing glyph (matplotlib's "Glyph 13 missing from font(s)" warning), its
    "\\n" broke the tick label in two, and a question's line break its title."""
    import unicodedata

    import matplotlib.figure

    from tqc.config import Params
    from tqc.schema import Catalog, LabeledQuestion, StandardQuestion
    from tqc.stages.evaluate import _write_similarity_profile

    drawn = {}

    def savefig(figure, *args, **kwargs):
        drawn["titles"] = [axis.get_title() for axis in figure.axes]
        drawn["ticks"] = [label.get_text() for label in figure.axes[0].get_xticklabels()]

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    ids = ["a\nb", "g\rh", "tab\tbell\x07", "line\u2028sep", "plain"]
    catalog = Catalog([StandardQuestion(class_id, f"What is {i}?") for i, class_id in enumerate(ids)])
    questions = [LabeledQuestion("What is\r\nthis ?", ids[0]), LabeledQuestion("Is it café ?", ids[4])]
    params = Params.model_validate({"evaluate": {"profile_questions": 2}})
    _write_similarity_profile(tmp_path, {"zero_shot": np.eye(5)[:2], "admc": np.eye(5)[:2]}, questions, catalog, params)
    assert drawn["ticks"] == ["a\\nb", "g\\rh", "tab\\tbell\\x07", "line\\u2028sep", "plain"]
    assert drawn["titles"] == ["What is\\r\\nthis ?", "Is it café ?"]
    for label in drawn["ticks"] + drawn["titles"]:
        assert not any(unicodedata.category(character) in ("Cc", "Zl", "Zp") for character in label), label


def test_seed_statistics_say_which_standard_deviation_they_give():
    """metrics.json's seeds block gave a "std" without saying it is the sample one (ddof = 1), not the population's."""
    from tqc.stages.evaluate import seed_statistics

    runs = [{"admc": {"test": {"accuracy": a, "macro_f1": a, "macro_f1_gold_classes": a}}} for a in (0.90, 0.92, 0.95)]
    stats = seed_statistics(runs, resplit=False)
    assert list(stats)[:4] == ["n", "resplit", "std_ddof", "admc"] and stats["std_ddof"] == 1
    assert list(stats["admc"]) == ["accuracy", "macro_f1", "macro_f1_gold_classes"]  # each figure the runs gave
    assert stats["admc"]["accuracy"]["std"] == pytest.approx(np.std([0.90, 0.92, 0.95], ddof=stats["std_ddof"]))
    assert stats["admc"]["accuracy"]["mean"] == pytest.approx(np.mean([0.90, 0.92, 0.95]))  # the mean, not the median


def test_seed_statistics_cover_every_figure_of_the_summary_but_its_count_and_a_null_hits_at_k():
    """MRR and Hits@k had their first seed's figure only; the spread was given for accuracy and macro-F1 alone."""
    from tqc.stages.evaluate import seed_statistics

    scores = np.array([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1], [0.1, 0.3, 0.6]])  # (3, 3): Hits@3 and @10 reach the classes
    runs = [{"admc": {"test": summary(scores, gold)}} for gold in (np.array([0, 1, 2]), np.array([0, 2, 2]))]
    stats = seed_statistics(runs, resplit=False)["admc"]
    assert list(stats) == ["accuracy", "macro_f1", "macro_f1_gold_classes", "mrr", "hits_at_1"]
    assert stats["mrr"]["values"] == [1.0, pytest.approx((1 + 1 / 3 + 1) / 3)]  # the second row's gold ranks third
    assert stats["hits_at_1"]["mean"] == pytest.approx((1 + 2 / 3) / 2)


def test_seed_statistics_list_the_models_in_one_order_whatever_order_a_run_gave_them():
    from tqc.stages.evaluate import seed_statistics

    figures = {"test": {"accuracy": 0.9, "macro_f1": 0.8, "macro_f1_gold_classes": 0.85}}
    runs = [{"exemplars": figures, "zero_shot": figures, "nc": figures, "stage_one": figures, "admc": figures}] * 2
    assert list(seed_statistics(runs, resplit=True))[3:] == ["admc", "stage_one", "nc", "zero_shot", "exemplars"]


def test_the_headline_metrics_and_metrics_json_keep_their_key_order(monkeypatch):
    """Reviewers diff metrics.json in pull requests: a reordered key reads as a change of every figure below it."""
    from tqc.config import Params
    from tqc.stages import evaluate

    scores = np.array([[0.9, 0.1, 0.0, 0.0], [0.2, 0.7, 0.1, 0.0]])  # (2, 4)
    figures = summary(scores, np.array([0, 2]))
    assert list(figures) == ["accuracy", "macro_f1", "macro_f1_gold_classes", "mrr", "hits_at_1", "hits_at_3",
                             "hits_at_10", "n"]
    monkeypatch.setattr(evaluate, "git_commit", lambda *_: "0" * 40)
    splits = {"test": figures, "validation": figures}
    evaluated = {"metrics": {"admc": splits, "stage_one": splits, "zero_shot": splits}, "unshifted": {}}
    document = evaluate.metrics_document(Params(), evaluated, {}, {})
    assert list(document) == ["dataset", "test", "validation", "stage_one", "nc", "zero_shot", "exemplars",
                              "gains_on_test", "prior_shift", "seeds", "run"]
    assert list(document["run"]) == ["code_version", "code_edited", "params"]


@pytest.mark.parametrize("diverged_in", ["mining", "scoring"])
def test_an_extra_seed_whose_model_diverged_is_named_in_the_error_itself(monkeypatch, diverged_in):
    """With evaluate.seeds > 1, the seed whose model scored NaN was named only in the log line before the error
    ("full training 3/3 with seed 44"), which the error's own line in a CI log leaves out."""
    from pathlib import Path

    from tqc.config import Params
    from tqc.metrics import DivergedScores
    from tqc.stages import evaluate

    chains = []

    def train_chain(*_, **__):
        chains.append(1)
        if diverged_in == "mining" and len(chains) == 2:
            raise DivergedScores("1 training question vector(s) hold NaN or inf (rows [3] first): the model diverged")

    def score_chain(*_):
        if diverged_in == "scoring" and len(chains) == 2:
            raise DivergedScores("admc on test: scores hold NaN or +inf in 3 row(s) (first: [0, 1, 2]): the model diverged")
        return {"metrics": {}}, {}

    monkeypatch.setattr(evaluate, "augmented_again", lambda *_: Path("augmented.jsonl"))
    monkeypatch.setattr(evaluate, "train_chain", train_chain)
    monkeypatch.setattr(evaluate, "score_chain", score_chain)
    said = "1 training question vector" if diverged_in == "mining" else "admc on test: scores hold NaN"
    with pytest.raises(DivergedScores, match=rf"^full training 3/3 with seed 44: {said}[^\n]*diverged$"):
        evaluate._extra_seeds(Params.model_validate({"seed": 42, "evaluate": {"seeds": 3}}), Path("data"), {}, None)


def test_evaluates_extra_seeds_say_each_training_warning_once(monkeypatch, caplog):
    """Each extra seed trains on the same catalog, and its stages said the same warnings (a cut standard question)
    again at every seed."""
    import logging
    from pathlib import Path

    from tqc.config import Params
    from tqc.stages import evaluate

    from tqc.warn_once import ALIKE_EVERY_TRAINING

    def train_chain(*_, **__):  # as warn_cut_standards says it
        logging.getLogger("tqc.training").warning("1 standard question(s) longer than model.max_length (8 tokens)",
                                                  extra=ALIKE_EVERY_TRAINING)
        logging.getLogger("tqc.training").info("stage one: epoch 1")

    monkeypatch.setattr(evaluate, "augmented_again", lambda *_: Path("augmented.jsonl"))
    monkeypatch.setattr(evaluate, "train_chain", train_chain)
    monkeypatch.setattr(evaluate, "score_chain", lambda *_: ({"metrics": {}}, {}))
    with caplog.at_level("INFO", logger="tqc.training"):
        evaluate._extra_seeds(Params.model_validate({"evaluate": {"seeds": 3}}), Path("data"), {}, None)
    said = [r.getMessage() for r in caplog.records if r.name == "tqc.training"]
    assert said == ["1 standard question(s) longer than model.max_length (8 tokens)", "stage one: epoch 1",
                    "stage one: epoch 1"]


def test_a_diverged_epoch_is_said_at_every_training_that_has_it_within_each_warning_once(caplog):
    """each_warning_once dropped every repeated warning of tqc.training: a second tuning trial (or evaluate seed)
    whose stage diverged at the same epoch, with the same message, was not said, where the first was."""
    from tqc.metrics import DivergedScores
    from tqc.training import _validated
    from tqc.warn_once import each_warning_once

    def diverged():
        raise DivergedScores("scores hold NaN or +inf in 40 row(s) (first: [0, 1, 2, 3, 4]): the model diverged")

    with caplog.at_level("WARNING", logger="tqc.training"), each_warning_once():
        for _ in range(2):  # two trainings, the same news
            assert _validated(diverged, "stage one", 3) == {"accuracy": 0.0, "macro_f1": 0.0}
    said = [r.getMessage() for r in caplog.records if r.name == "tqc.training"]
    assert said == ["stage one: epoch 3: validation scores hold NaN or +inf in 40 row(s) (first: [0, 1, 2, 3, 4]): the "
                    "model diverged; the epoch counts as accuracy and macro-F1 0"] * 2


def test_recall_of_a_class_with_no_gold_row_is_zero_and_macro_f1_counts_a_gold_class_never_predicted():
    per_class = per_class_prf(np.array([0, 0]), np.array([0, 1]), np.array([0, 1, 2]))
    assert per_class[1]["recall"] == per_class[2]["recall"] == 0.0  # undefined: 0, as scikit-learn (classes.json)
    gold, predicted = np.array([0, 1, 2]), np.array([0, 0, 1])  # class 2 in gold, never predicted
    assert macro_f1(gold, predicted) == pytest.approx(f1_score(gold, predicted, average="macro")) == pytest.approx(2 / 9)


def test_evaluate_scores_each_shifted_model_with_its_shift_and_keeps_its_figures_without_it(monkeypatch):
    """A trained model is reported as it is served, its class-prior shift applied; `unshifted` keeps its figures from
    the raw scores, and the zero-shot encoder, which has no shift, is scored as it is (and has no `unshifted`)."""
    from tqc.config import Params
    from tqc.prior import PriorShift
    from tqc.schema import Catalog, LabeledQuestion, StandardQuestion
    from tqc.stages import evaluate

    catalog = Catalog([StandardQuestion(c, f"What is {c}?") for c in ("A", "B")])
    questions = [LabeledQuestion("q0", "A"), LabeledQuestion("q1", "B")]
    raw = np.array([[0.7, 0.2], [0.55, 0.45]])  # (N, P): q1 answered A, wrongly, until A is shifted down
    monkeypatch.setattr(evaluate, "load_models", lambda *_: {"admc": lambda qs, c: raw, "zero_shot": lambda qs, c: raw})
    shift = PriorShift(weight=1.0, temperature=0.1, shift=np.array([-0.2, 0.0]), validation_by_weight={})
    evaluated = evaluate.evaluate_models(None, Params(), {"test": questions}, catalog, {"admc": shift})
    assert evaluated["metrics"]["admc"]["test"]["accuracy"] == 1.0  # shifted: [[0.5, 0.2], [0.35, 0.45]]
    assert evaluated["unshifted"]["admc"]["test"]["accuracy"] == 0.5
    assert evaluated["metrics"]["zero_shot"]["test"]["accuracy"] == 0.5 and "zero_shot" not in evaluated["unshifted"]
    np.testing.assert_allclose(evaluated["scores"]["test"]["admc"], raw + [-0.2, 0.0])
    np.testing.assert_array_equal(evaluated["raw_scores"]["test"]["admc"], raw)  # Figure 3 plots these


def test_the_exemplar_rule_is_scored_only_with_training_rows_and_a_k_above_zero(monkeypatch):
    """evaluate.exemplar_k 0 means "not scored" (metrics.json's exemplars: null); with it the exemplar scorer was asked
    for each class's 0 nearest questions."""
    from types import SimpleNamespace

    from tqc.config import Params
    from tqc.schema import LabeledQuestion
    from tqc.stages import evaluate

    class Model:
        question = None

        def to(self, device):
            return self

    monkeypatch.setattr(evaluate.TextEncoder, "from_pretrained", lambda *_: None)
    monkeypatch.setattr(evaluate, "BiEncoder", lambda *_: Model())
    monkeypatch.setattr(evaluate, "trained_models", lambda *_: {"admc": Model(), "stage_one": Model()})
    monkeypatch.setattr(evaluate, "scorer_for", lambda *_: "trained scorer")
    monkeypatch.setattr(evaluate, "exemplar_scorer", lambda *_: "exemplar scorer")
    models, rows = SimpleNamespace(stage_one=None, stage_two=None, nc=None), [LabeledQuestion("q", "A")]

    def scored(exemplar_k: int, exemplars) -> list[str]:
        return list(evaluate.load_models(models, Params.model_validate({"evaluate": {"exemplar_k": exemplar_k}}), exemplars))

    assert scored(2, rows) == ["admc", "stage_one", "zero_shot", "exemplars"]
    assert scored(0, rows) == scored(2, None) == ["admc", "stage_one", "zero_shot"]


def test_each_extra_seed_splits_augments_and_trains_with_its_own_seed(monkeypatch, tmp_path):
    """seed + offset must reach every draw of an extra training: with the base seed in one of them, every seed repeats
    that draw (one validation split, one augmentation, one initialisation), and the spread leaves its variance out."""
    from tqc.config import Params
    from tqc.schema import LabeledQuestion, save_questions
    from tqc.stages import evaluate

    save_questions(tmp_path / "validation.jsonl", [LabeledQuestion("q", "A")])
    drawn = []

    def resplit(params, data_dir, seed, out_dir):
        drawn.append(("resplit", seed))
        return tmp_path

    monkeypatch.setattr(evaluate, "resplit", resplit)
    monkeypatch.setattr(evaluate, "augmented_again", lambda _, __, ___, seed, ____: drawn.append(("augment", seed)))
    monkeypatch.setattr(evaluate, "train_chain", lambda _, __, ___, ____, seed: drawn.append(("train", seed)))
    monkeypatch.setattr(evaluate, "score_chain", lambda *_: ({"metrics": {}}, {}))
    params = Params.model_validate({"seed": 42, "evaluate": {"seeds": 3, "resplit": True}})
    evaluate._extra_seeds(params, tmp_path, {"test": []}, None)
    assert drawn == [(step, seed) for seed in (43, 44) for step in ("resplit", "augment", "train")]


def test_each_extra_seed_augments_trains_and_is_scored_in_its_own_split_s_folder(monkeypatch, tmp_path):
    """With evaluate.resplit, the seed's folder (its validation rows) must reach augment, training and scoring: given
    the validated folder instead, its early stopping and prior shift would be fitted on rows it trained on."""
    from tqc.config import Params
    from tqc.schema import LabeledQuestion, load_questions, save_questions
    from tqc.stages import evaluate

    test = [LabeledQuestion("the test question", "A")]
    save_questions(tmp_path / "validation.jsonl", [LabeledQuestion("the first draw's question", "A")])
    folders, seen = {}, []

    def resplit(params, data_dir, seed, out_dir):
        folders[seed] = tmp_path / f"seed{seed}"
        save_questions(folders[seed] / "validation.jsonl", [LabeledQuestion(f"seed {seed}'s question", "A")])
        return folders[seed]

    def score_chain(outputs, params, data_dir, splits, catalog):
        seen.append(("score", data_dir, [q.text for q in splits["validation"]], splits["test"]))
        return {"metrics": {}}, {}

    monkeypatch.setattr(evaluate, "resplit", resplit)
    monkeypatch.setattr(evaluate, "augmented_again",
                        lambda params, seed_dir, validated, seed, work: seen.append(("augment", seed_dir, validated)))
    monkeypatch.setattr(evaluate, "train_chain",
                        lambda params, seed_dir, train, work, seed: seen.append(("train", seed_dir)))
    monkeypatch.setattr(evaluate, "score_chain", score_chain)
    params = Params.model_validate({"seed": 0, "evaluate": {"seeds": 3, "resplit": True}})
    splits = {"test": test, "validation": load_questions(tmp_path / "validation.jsonl")}
    evaluate._extra_seeds(params, tmp_path, splits, None)

    assert seen == [step for seed in (1, 2) for step in (
        ("augment", folders[seed], tmp_path), ("train", folders[seed]),
        ("score", folders[seed], [f"seed {seed}'s question"], test))]


def test_each_seeds_augmentation_holds_out_its_own_validation_split_and_test(monkeypatch, tmp_path):
    """augment drops a made row equal to a held-out question: an extra seed's are its own validation rows (resplit's,
    in its folder) and the one test split, which stays in the validated data folder."""
    from tqc.config import Params
    from tqc.stages import evaluate

    seed_dir, data_dir = tmp_path / "seed", tmp_path / "validated"
    for path in (seed_dir / "validation.jsonl", data_dir / "validation.jsonl", data_dir / "test.jsonl"):
        path.parent.mkdir(exist_ok=True)
        path.write_text("")
    calls = []
    monkeypatch.setattr(evaluate.augment, "run", lambda *args: calls.append(args))
    written = evaluate.augmented_again(Params(), seed_dir, data_dir, 7, tmp_path / "work")
    (train, _, seed, out, _, generated, held_out, catalog), = calls
    assert (train, seed, out, written) == (seed_dir / "train.jsonl", 7, tmp_path / "work" / "augmented.jsonl", out)
    assert held_out == [seed_dir / "validation.jsonl", data_dir / "test.jsonl"]
    assert (generated, catalog) == (data_dir / "generated.jsonl", data_dir / "catalog.jsonl")


def test_metrics_json_gains_are_admc_minus_each_baseline_and_each_shift_is_recorded_as_fitted(monkeypatch):
    """The gains read as ADMC's improvement (a sign flip reads as a loss), each by its own figure; prior_shift holds
    each shifted model's fitted λ, τ and target beside its unshifted figures; code_edited says the code differed."""
    from tqc.config import Params
    from tqc.prior import PriorShift
    from tqc.stages import evaluate

    def figures(accuracy: float, f1: float) -> dict:
        return {"accuracy": accuracy, "macro_f1": f1, "macro_f1_gold_classes": f1, "mrr": 1.0}

    splits = lambda accuracy, f1: {"test": figures(accuracy, f1), "validation": figures(accuracy - 0.1, f1 - 0.1)}  # noqa: E731
    evaluated = {"metrics": {"admc": splits(0.9, 0.8), "stage_one": splits(0.7, 0.6), "nc": splits(0.85, 0.5),
                             "zero_shot": splits(0.3, 0.2)},
                 "unshifted": {"admc": splits(0.88, 0.78)}}
    shifts = {"admc": PriorShift(weight=0.5, temperature=0.05, shift=np.zeros(2), validation_by_weight={}, target="uniform")}
    monkeypatch.setattr(evaluate, "git_commit", lambda paths=None: "abc123-dirty" if paths == evaluate.CODE else "abc123")
    document = evaluate.metrics_document(Params(), evaluated, shifts, {})
    assert document["gains_on_test"] == pytest.approx({"macro_f1_stage_two_minus_stage_one": 0.2,
                                                       "macro_f1_admc_minus_nc": 0.3, "accuracy_admc_minus_nc": 0.05})
    unshifted = {"accuracy": 0.88, "macro_f1": 0.78, "macro_f1_gold_classes": 0.78}
    assert document["prior_shift"] == {"admc": {
        "weight": 0.5, "temperature": 0.05, "target": "uniform", "test_unshifted": unshifted,
        "validation_unshifted": pytest.approx({k: v - 0.1 for k, v in unshifted.items()})}}
    assert document["run"]["code_version"] == "abc123" and document["run"]["code_edited"] is True


def test_classes_json_names_each_confusion_gold_first_and_predictions_list_the_top_k_best_first(tmp_path):
    """most_confused's "gold" is the class a question belongs to and "predicted" the one it was answered as;
    predictions.jsonl lists exactly top_k standard questions, highest score first."""
    import json

    from tqc.schema import Catalog, LabeledQuestion, StandardQuestion
    from tqc.stages.evaluate import _class_report, _write_predictions

    catalog = Catalog([StandardQuestion(c, f"What is {c}?") for c in ("A", "B", "C")])
    questions = [LabeledQuestion("q0", "A"), LabeledQuestion("q1", "A"), LabeledQuestion("q2", "C")]
    scores = np.array([[0.1, 0.7, 0.2], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6]])  # q0 and q1 (A) answered B
    report = _class_report(scores, questions, catalog, 10)
    assert report["most_confused"] == [{"gold": "A", "predicted": "B", "count": 2}]
    _write_predictions(tmp_path / "p.jsonl", scores, questions, catalog, 2)
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [[(t["class_id"], t["score"]) for t in row["top_k"]] for row in rows] == [
        [("B", 0.7), ("C", 0.2)], [("B", 0.5), ("C", 0.3)], [("C", 0.6), ("B", 0.3)]]
    assert rows[0]["top_k"][0]["standard_question"] == "What is B?" and rows[2]["gold"] == "C"


def test_similarity_profile_puts_zero_shot_before_and_admc_after_and_samples_by_the_seed(tmp_path):
    """Figure 3 is before (the untrained encoder) against after (ADMC): swapped, it shows training undoing itself. The
    sampled questions are drawn with params.seed, so a re-run of evaluate draws the same figure."""
    import csv

    from tqc.config import Params
    from tqc.schema import Catalog, LabeledQuestion, StandardQuestion
    from tqc.stages.evaluate import _write_similarity_profile

    catalog = Catalog([StandardQuestion(c, f"What is {c}?") for c in ("A", "B")])
    questions = [LabeledQuestion(f"q{i}", "AB"[i % 2]) for i in range(30)]
    zero_shot, admc = np.full((30, 2), 0.25), np.full((30, 2), 0.75)
    params = Params.model_validate({"seed": 3, "evaluate": {"profile_questions": 3}})

    def profile(folder):
        folder.mkdir()
        _write_similarity_profile(folder, {"zero_shot": zero_shot, "admc": admc}, questions, catalog, params)
        with open(folder / "similarity_profile.csv", encoding="utf-8", newline="") as handle:
            return list(csv.DictReader(handle))

    first = profile(tmp_path / "one")
    assert {(row["before"], row["after"]) for row in first} == {("0.250000", "0.750000")}
    assert profile(tmp_path / "two") == first and len({row["question"] for row in first}) == 3


def test_per_class_figures_count_labels_absent_or_negative_as_scikit_learn_does():
    """One pass over the rows for every label: a label in neither gold nor predicted scores 0 with support 0, and
    promote's −1 (a class the catalog lacks) is a label like any other."""
    rng = np.random.default_rng(0)
    gold, predicted = rng.integers(-1, 5, size=200), rng.integers(-1, 5, size=200)
    labels = np.array([4, -1, 0, 7, 2])  # 7 in neither; not in order
    precision, recall, f1, support = precision_recall_fscore_support(gold, predicted, labels=labels, zero_division=0)
    ours = per_class_prf(gold, predicted, labels)
    assert list(ours) == labels.tolist()
    assert [ours[c]["precision"] for c in labels] == pytest.approx(precision.tolist())
    assert [ours[c]["recall"] for c in labels] == pytest.approx(recall.tolist())
    assert [ours[c]["f1"] for c in labels] == pytest.approx(f1.tolist())
    assert [ours[c]["support"] for c in labels] == support.tolist()
    assert per_class_prf(np.array([], dtype=int), np.array([], dtype=int), np.array([3]))[3]["f1"] == 0.0
    assert per_class_prf(gold, predicted, labels) == _per_label_reference(gold, predicted, labels)  # to the last digit


def _per_label_reference(gold, predicted, labels):
    """The pass a label that per_class_prf's one pass replaced: the figures evaluate and promote recorded before."""
    result = {}
    for label in labels:
        true_positive = int(np.sum((predicted == label) & (gold == label)))
        predicted_count, support = int(np.sum(predicted == label)), int(np.sum(gold == label))
        precision = true_positive / predicted_count if predicted_count else 0.0
        recall = true_positive / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        result[int(label)] = {"precision": precision, "recall": recall, "f1": f1, "support": support}
    return result


@pytest.mark.parametrize("seed", range(3))
def test_per_class_figures_are_the_per_label_passes_to_the_last_digit(seed):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 50, size=500)
    predicted = np.where(rng.random(500) < 0.7, gold, rng.integers(0, 60, size=500))  # some classes only predicted
    labels = np.union1d(gold, predicted)
    assert per_class_prf(gold, predicted, labels) == _per_label_reference(gold, predicted, labels)
    assert macro_f1(gold, predicted) == float(np.mean([v["f1"] for v in _per_label_reference(gold, predicted, labels).values()]))
