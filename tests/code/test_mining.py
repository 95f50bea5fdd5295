import numpy as np
import pytest

from tqc.mining import exclude_gold, mine


def random_unit(rows: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_gold_is_never_mined_and_k_is_respected(k):
    standards = random_unit(8, 16, 0)
    gold = np.random.default_rng(1).integers(0, 8, size=200)
    # Questions near their gold class, so gold is usually the nearest neighbour.
    questions = standards[gold] + 0.3 * random_unit(200, 16, 2)
    negatives, stats = mine(questions, standards, gold, k)
    assert negatives.shape == (200, k)
    assert not (negatives == gold[:, None]).any()
    assert all(len(set(row)) == k for row in negatives.tolist())  # k distinct classes
    assert stats["k"] == k and stats["questions"] == 200


def test_mined_negatives_are_the_nearest_wrong_classes_in_order():
    standards = random_unit(6, 8, 3)
    questions = random_unit(50, 8, 4)
    gold = np.random.default_rng(5).integers(0, 6, size=50)
    negatives, _ = mine(questions, standards, gold, 3)
    similarities = questions @ standards.T
    for i in range(50):
        ranked_wrong = [c for c in np.argsort(-similarities[i]) if c != gold[i]]
        assert negatives[i].tolist() == ranked_wrong[:3]


def test_k_above_the_wrong_class_count_is_capped():
    standards = random_unit(4, 8, 6)
    negatives, _ = mine(random_unit(10, 8, 7), standards, np.zeros(10, dtype=int), k=10)
    assert negatives.shape == (10, 3)


def test_exclude_gold_handles_gold_outside_the_retrieved_list():
    neighbours = np.array([[4, 2, 1], [0, 3, 2]])
    assert exclude_gold(neighbours, np.array([9, 3]), 2).tolist() == [[4, 2], [0, 2]]
