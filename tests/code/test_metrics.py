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
    assert stats["admc"]["accuracy"]["std"] == pytest.approx(np.std([0.90, 0.92, 0.95], ddof=stats["std_ddof"]))
    assert stats["admc"]["accuracy"]["mean"] == pytest.approx(np.mean([0.90, 0.92, 0.95]))  # the mean, not the median


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

    from tqc.training import ALIKE_EVERY_TRAINING

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
    from tqc.training import _validated, each_warning_once

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
