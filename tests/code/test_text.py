"""How a message names the first few of many."""

from tqc.text import first_of


def test_a_message_names_the_first_few_and_counts_the_rest():
    assert first_of([3, 8, 12]) == "3, 8, 12"
    assert first_of(list(range(1, 15)), 3) == "1, 2, 3 and 11 more"
    assert first_of(["a: x", "b: y", "c: z"], 2, "; ") == "a: x; b: y and 1 more"
    assert first_of([], 5) == ""
