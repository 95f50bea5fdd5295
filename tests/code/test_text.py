"""How a message names the first few of many, and what counts as the same question."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tqc.text import compared_text, first_of, ids_by_label_key, normalise


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


def test_an_invisible_character_between_a_letter_and_its_accent_does_not_make_another_question():
    """It was removed after composition, so "cafe", U+200B, U+0301 stayed e + accent beside the composed "é"."""
    for invisible in ("\u200b", "\u00ad", "\u2060"):  # zero-width space, soft hyphen, word joiner
        assert compared_text(f"cafe{invisible}\u0301 ?") == compared_text("café ?")


# letters, accents, invisible characters and those casefold decomposes (ẞ, İ, ǰ, ΐ): where the order of the steps shows
TRICKY = st.sampled_from(list("aeiIjs ?\u0130\u0301\u0307\u0345\u0308\u00b4\uff76\uff9e\u1100\u1161\u03b9\u1e9e\u01f0"
                              "\u0342\u03c5\u03a5\u200b\u00ad\u2019"))


@settings(max_examples=3000, deadline=None)
@given(st.lists(TRICKY, max_size=8).map("".join))
def test_normalising_twice_changes_nothing(text):
    assert normalise(normalise(text)) == normalise(text)  # a normalised copy of a question is that question
