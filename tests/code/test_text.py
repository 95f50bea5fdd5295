"""How a message names the first few of many."""

from tqc.text import first_of, ids_by_label_key


def test_a_message_names_the_first_few_and_counts_the_rest():
    assert first_of([3, 8, 12]) == "3, 8, 12"
    assert first_of(list(range(1, 15)), 3) == "1, 2, 3 and 11 more"
    assert first_of(["a: x", "b: y", "c: z"], 2, "; ") == "a: x; b: y and 1 more"
    assert first_of([], 5) == ""


def test_ids_alike_but_for_case_width_or_a_float_s_0_share_one_key_in_their_order():
    assert ids_by_label_key(["HUM", "1", "hum", "\uff2coc", "2.00", "LOC"]) == {
        "hum": ["HUM", "hum"], "1": ["1"], "loc": ["\uff2coc", "LOC"], "2": ["2.00"]}


def test_names_sharing_a_key_are_grouped_in_the_order_they_come_and_a_name_alone_is_no_group():
    from tqc.text import normalise, sharing_a_key

    texts = ["Who?", "What?", " who ?", "Where?", "what?", "WHO?"]
    assert sharing_a_key("abcdef", map(normalise, texts)) == [["a", "c", "f"], ["b", "e"]]
    assert sharing_a_key(["x", "y"], ["1", "2"]) == []
