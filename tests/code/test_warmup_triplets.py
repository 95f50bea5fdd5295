"""EBSIM's weak triplets (tqc.warmup_triplets) and the warm-up's question pool, without a model."""

import numpy as np
import pytest
import torch

from tqc.stages.warmup import PoolRow, question_pool
from tqc.warmup_triplets import (WordVectors, build_triplets, masked, ranked_candidates, structure_triplet,
                                 token_triplets, words, words_to_mask)

# A toy embedding table: "where" and "wherever" are one direction (cosine 1), "place" and "spot" close (0.8 < cos < 1),
# "city" and "paris" apart from everything
VOCABULARY = {"where": 0, "is": 1, "the": 2, "place": 3, "spot": 4, "city": 5, "paris": 6, "##ever": 7}
TABLE = torch.tensor([[1.0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0], [0, 0, 1.0, 0, 0], [0, 0, 0, 1.0, 0],
                      [0, 0, 0.3, 1.0, 0], [0, 0, 0, 0, 1.0], [0, 0.2, 0, -0.3, -1.0], [1.0, 0, 0, 0, 0]])


def pieces(word: str) -> list[int]:
    word = word.lower()
    if word == "wherever":
        return [VOCABULARY["where"], VOCABULARY["##ever"]]
    return [VOCABULARY[word]] if word in VOCABULARY else []


def vectors() -> WordVectors:
    return WordVectors(pieces, TABLE)


def test_candidates_are_ranked_best_first_with_ties_in_pool_order():
    scores = np.array([[0.1, 0.9, 0.5, 0.9], [0.3, 0.2, 0.1, 0.0]])  # (2 titles, 4 questions)
    assert ranked_candidates(scores, 3) == [[1, 3, 2], [0, 1, 2]]


def test_token_triplets_put_the_higher_ranked_question_closer_for_every_pair():
    pool = ["q0", "q1", "q2", "q3"]
    triplets = token_triplets(7, [2, 0, 3], pool)
    assert [(t.closer, t.farther) for t in triplets] == [("q2", "q0"), ("q2", "q3"), ("q0", "q3")]
    assert {(t.title, t.kind) for t in triplets} == {(7, "token")}


def test_words_above_the_threshold_are_masked_most_alike_first_up_to_the_fraction():
    similarity = [0.95, 0.1, 0.85, 0.99, 0.81]
    assert words_to_mask(similarity, 0.8, 1.0) == [0, 2, 3, 4]
    assert words_to_mask(similarity, 0.8, 0.5) == [0, 3]  # ⌊0.5 × 5⌋ = 2: the two most alike, in reading order
    assert words_to_mask(similarity, 0.9, 0.5) == [0, 3]
    assert words_to_mask(similarity, 0.999, 0.5) == []  # none above: nothing to mask
    assert words_to_mask([0.9, 0.9, 0.1, 0.1], 0.8, 0.5) == [0, 1]  # 0.5 × 4 is 2, rounding aside
    assert words_to_mask([0.9], 0.8, 0.5) == []  # half of one word is no word
    assert words_to_mask([0.99999994, 1.0000001, 1.0, 0.2], 0.8, 0.5) == [0, 1]  # a word's own cosine to 6 decimals


def test_masking_replaces_whole_words_and_keeps_the_rest_of_the_text():
    text = "Where's the place, exactly?"
    spans = words(text)
    assert [text[a:b] for a, b in spans] == ["Where", "s", "the", "place", "exactly"]
    assert masked(text, spans, [0, 3], "[MASK]") == "[MASK]'s the [MASK], exactly?"


def test_word_vectors_are_the_mean_of_the_word_pieces_rows():
    closeness = vectors().closeness(["wherever", "city", "unknown"], ["where"])
    assert closeness[0] == pytest.approx(1.0)  # where + ##ever: both rows are "where"'s direction
    assert closeness[1] == pytest.approx(0.0) and closeness[2] == 0.0  # a word of no pieces is like nothing


def test_a_structure_triplet_masks_the_words_a_title_shares_and_none_is_made_without_one():
    dropped = structure_triplet(0, "Where is the place?", "where is the spot in paris", vectors(), 0.8, 0.5, "[MASK]")
    # where, is, the: cosine 1; spot to place: 1/√1.09 ≈ 0.96; 6 words, so at most 3 masked, the most alike first
    assert dropped.closer == "where is the spot in paris" and dropped.kind == "structure"
    assert dropped.farther == "[MASK] [MASK] [MASK] spot in paris"
    assert structure_triplet(0, "Where is the place?", "paris city", vectors(), 0.8, 0.5, "[MASK]") is None
    # a threshold above every likeness masks nothing either
    assert structure_triplet(0, "the place", "the spot paris city", vectors(), 1.0, 0.5, "[MASK]") is None


def test_build_triplets_is_deterministic_and_keeps_to_the_top_candidates():
    titles = ["Where is the place?", "city"]
    pool = ["paris city", "where is the spot", "the place is paris", "city paris"]
    scores = np.array([[0.1, 0.9, 0.8, 0.0], [0.9, 0.0, 0.1, 0.8]])
    first = build_triplets(titles, pool, scores, vectors(), 2, 0.8, 0.5, "[MASK]")
    assert first == build_triplets(titles, pool, scores, vectors(), 2, 0.8, 0.5, "[MASK]")
    token = [(t.title, t.closer, t.farther) for t in first if t.kind == "token"]
    assert token == [(0, "where is the spot", "the place is paris"), (1, "paris city", "city paris")]
    structure = [(t.title, t.closer, t.farther) for t in first if t.kind == "structure"]
    assert structure == [(0, "where is the spot", "[MASK] [MASK] the spot"),
                         (0, "the place is paris", "[MASK] [MASK] is paris"),
                         (1, "paris city", "paris [MASK]"), (1, "city paris", "[MASK] paris")]


def test_the_pool_quarantines_held_out_empty_and_wordless_rows_and_merges_repeats():
    rows = [PoolRow("Where is Paris ?", "u.csv", 2), PoolRow("  ", "u.csv", 3), PoolRow("?!", "u.csv", 4),
            PoolRow("WHERE is paris?", "u.csv", 5), PoolRow("who is the  person", "u.csv", 6),
            PoolRow("how many moons", "train.csv", 9), PoolRow("how many\x00 suns", "u.csv", 7)]
    held_out = {"who is the person": "test"}
    pool = question_pool(rows, held_out)
    assert pool.texts == ["Where is Paris ?", "how many moons"] and pool.duplicates == 1
    assert [(q["file"], q["line"], q["reason"].split(":")[0]) for q in pool.quarantined] == [
        ("u.csv", 3, "non_empty_text"), ("u.csv", 4, "has_letter_or_digit"), ("u.csv", 6, "no_leakage"),
        ("u.csv", 7, "no_control_characters")]  # validate quarantines it in a training question too
    assert "a test question" in pool.quarantined[2]["reason"]
    assert pool.quarantined[2]["content"] == {"text": "who is the  person"}


def test_the_mask_share_is_not_cut_by_a_rounding_error():
    # 0.29 * 100 == 28.999999999999996 in floats: the share allows 29 words
    assert len(words_to_mask([1.0] * 100, 0.0, 0.29)) == 29


def test_words_are_letters_and_digits_of_any_script_not_only_ascii():
    text = "Où est la tour Eiffel, n° 42?"
    assert [text[a:b] for a, b in words(text)] == ["Où", "est", "la", "tour", "Eiffel", "n", "42"]
    assert masked(text, words(text), [0, 6], "[MASK]") == "[MASK] est la tour Eiffel, n° [MASK]?"


def test_each_character_of_an_unspaced_script_is_a_word_so_a_chinese_question_gets_a_structure_triplet():
    """A Chinese question was one word (a run of \\w), which ⌊0.5 × 1⌋ = 0 masks: a Chinese pool made no structure
    triplet, unsaid. Each character is a word now, as EDA splits such scripts; spaced words keep their runs."""
    question, title = "我的银行卡丢了怎么办？", "银行卡丢失怎么办？"
    assert [question[a:b] for a, b in words(question)] == list("我的银行卡丢了怎么办")
    assert [t[a:b] for t in ["我的card丢了"] for a, b in words(t)] == ["我", "的", "card", "丢", "了"]
    one_hot = {ch: i for i, ch in enumerate(dict.fromkeys((question + title).replace("？", "")))}
    alike = WordVectors(lambda word: [one_hot[word]] if word in one_hot else [], torch.eye(len(one_hot)))
    dropped = structure_triplet(0, title, question, alike, 0.8, 0.5, "[MASK]")
    # 银 行 卡 丢 怎 么 办 are the title's (cosine 1): 7 of 10 words, at most 5 masked, in reading order
    assert dropped is not None and dropped.farther == "我的[MASK][MASK][MASK][MASK]了[MASK]么办？"


def test_closeness_is_a_cosine_whatever_the_length_of_the_embedding_rows():
    """The threshold is on cosines: an encoder whose embedding rows are three times as long makes the same words
    alike, not every word 9 times as alike."""
    question, title = ["where", "spot", "paris", "wherever"], ["place", "where"]
    long_rows = WordVectors(pieces, 3 * TABLE).closeness(question, title)
    assert long_rows == pytest.approx(vectors().closeness(question, title), abs=1e-6)
    assert max(long_rows) == pytest.approx(1.0) and long_rows[1] == pytest.approx(1 / 1.09 ** 0.5)


def test_a_title_with_no_word_makes_no_word_alike_and_no_structure_triplet():
    assert vectors().closeness(["where", "is"], []) == [-1.0, -1.0]
    assert structure_triplet(0, "?!", "where is the spot", vectors(), 0.8, 1.0, "[MASK]") is None


def test_a_half_precision_embedding_table_is_read_in_float32():
    """An encoder loaded in float16: its table's values, compared in float32 (float16 sums and norms are ~1e-3 off,
    which moves likeness across the threshold and reorders words that are alike to 6 decimals)."""
    question, title = ["where", "spot", "paris", "wherever", "city"], ["place", "where", "city"]
    half = TABLE.half()
    assert WordVectors(pieces, half).closeness(question, title) == WordVectors(pieces, half.float()).closeness(question, title)


def test_the_partition_ranks_as_a_stable_sort_of_the_whole_pool_with_ties_at_the_edge_and_nan():
    """Each title's best are found by partition, not a sort of the whole pool; they must be what the sort gave."""
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, size=(40, 30)).astype(float)  # many ties, some at each row's edge
    scores[3, :28] = np.nan  # fewer finite scores than candidates: NaN ranks last, as the sort put it
    for candidates in (1, 5, 29, 30, 31):
        expected = [row[:candidates].tolist() for row in np.argsort(-scores, axis=1, kind="stable")]
        assert ranked_candidates(scores, candidates) == expected
