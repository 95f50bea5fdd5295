"""Paraphrase and back-translation through tiny random seq2seq models built here (no download)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import synthetic_questions, tiny_vocabulary
from tqc.config import AugmentParams, Seq2SeqParams
from tqc.schema import LabeledQuestion
from tqc.seq2seq import Rewriter
from tqc.stages.augment import oversample


def build_tiny_seq2seq(directory: Path, seed: int) -> Path:
    """A 1-layer, 16-wide random BART with the tests' word-level vocabulary, saved as an HF folder."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration, BertTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    vocab = tiny_vocabulary()
    tokenizer = BertTokenizerFast(vocab={word: i for i, word in enumerate(vocab)}, do_lower_case=True)
    ids = {token: vocab.index(token) for token in ("[PAD]", "[CLS]", "[SEP]")}
    config = BartConfig(vocab_size=len(vocab), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
                        pad_token_id=ids["[PAD]"], bos_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"],
                        decoder_start_token_id=ids["[CLS]"], forced_bos_token_id=None, forced_eos_token_id=None)
    torch.manual_seed(seed)
    BartForConditionalGeneration(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_seq2seq(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("seq2seq")
    return build_tiny_seq2seq(root / "forward", 1), build_tiny_seq2seq(root / "backward", 2)


def imbalanced_rows() -> list[LabeledQuestion]:
    rows = synthetic_questions(0, 6)
    kept, seen = [], Counter()
    for text, label in rows:
        if label != "LOC" or seen[label] < 2:  # LOC: 2 rows, the others 6
            kept.append(LabeledQuestion(text=text, class_id=label, source="train"))
            seen[label] += 1
    return kept


def test_paraphrase_rewrites_the_generated_rows_of_tail_classes_only(tiny_seq2seq):
    params = Seq2SeqParams(paraphrase_model=str(tiny_seq2seq[0]), max_new_tokens=8)
    rows = imbalanced_rows()
    augmented = oversample(rows, {"LOC": 6}, seed=0, explicit="paraphrase", seq2seq=params)
    generated = [q for q in augmented if q.generated]
    assert Counter(q.class_id for q in generated) == {"LOC": 4}
    originals = {q.text for q in rows}
    assert all(q.source.startswith("paraphrase:") for q in generated)
    assert sum(q.text not in originals for q in generated) >= 3  # the random model rewrites, not copies
    vocabulary = set(tiny_vocabulary())
    assert all(set(re.findall(r"\w+|[?,.]", q.text)) <= vocabulary for q in generated)  # the model's words
    assert augmented[: len(rows)] == rows  # originals untouched and first


def test_backtranslate_is_the_forward_model_then_the_backward_model(tiny_seq2seq):
    forward, backward = tiny_seq2seq
    # sampled (seeded per call): greedy, the random forward model emits nothing for these, a failed rewrite
    params = Seq2SeqParams(forward_model=str(forward), backward_model=str(backward), sample=True, max_new_tokens=8)
    texts = ["where is paris", "who invented chess"]
    through_both = Rewriter("backtranslate", params).rewrite(texts, seed=0)
    one_way = Rewriter("paraphrase", params.model_copy(update={"paraphrase_model": str(forward)})).rewrite(texts, seed=0)
    back = Rewriter("paraphrase", params.model_copy(update={"paraphrase_model": str(backward)})).rewrite(one_way, seed=0)
    assert all(one_way) and through_both == back and through_both != one_way


def test_beam_search_gives_the_copies_of_one_original_its_distinct_beams(tmp_path):
    """Beam search is deterministic: each extra row made from one original got the same best beam, so a class raised
    by 3 rows a question held 3 identical "rewrites". The k-th copy gets the k-th distinct beam; the first, the best."""
    model = build_tiny_seq2seq(tmp_path / "beams", 3)  # a random model whose 4 beams differ (seeds 1 and 2 emit nothing)
    params = Seq2SeqParams(paraphrase_model=str(model), max_new_tokens=8, sample=False, num_beams=4)
    rows = imbalanced_rows()
    made = [q for q in oversample(rows, {"LOC": 8}, seed=0, explicit="paraphrase", seq2seq=params) if q.generated]
    # two originals, three rows each, none alike (the random model ignores its input: each original's beams are alike)
    assert len(made) == 6 and max(Counter(q.text for q in made).values()) == 2
    rewriter = Rewriter("paraphrase", params)
    text = next(q.text for q in rows if q.class_id == "LOC")
    assert len(set(rewriter.rewrite([text] * 3, seed=0))) == 3
    assert rewriter.rewrite([text], seed=0)[0] == rewriter.rewrite([text, "where is paris", text], seed=0)[0]  # the best
    assert rewriter.rewrite(["where is paris", "who invented chess"], seed=0) == [  # no copies: each its best beam
        rewriter.rewrite(["where is paris"], seed=0)[0], rewriter.rewrite(["who invented chess"], seed=0)[0]]


def test_explicit_seq2seq_without_a_model_is_a_clear_config_error():
    with pytest.raises(ValueError, match="augment.seq2seq.paraphrase_model"):
        AugmentParams(explicit="paraphrase")
    with pytest.raises(ValueError, match="forward_model and backward_model"):
        AugmentParams(explicit="backtranslate", seq2seq={"forward_model": "x"})


def test_a_missing_or_unusable_model_folder_is_a_config_error_naming_the_param(tmp_path, tiny_seq2seq):
    from tqc.config import ConfigError

    with pytest.raises(ConfigError, match="^augment.seq2seq.paraphrase_model: the folder .*nowhere' does not exist$"):
        Rewriter("paraphrase", Seq2SeqParams(paraphrase_model=str(tmp_path / "nowhere")))
    (tmp_path / "empty").mkdir()  # a folder, but no model
    with pytest.raises(ConfigError, match="^augment.seq2seq.backward_model: the folder .*empty' holds no config.json"):
        Rewriter("backtranslate", Seq2SeqParams(forward_model=str(tiny_seq2seq[0]), backward_model=str(tmp_path / "empty")))




def test_a_tokenizer_that_needs_an_uninstalled_package_is_a_config_error_naming_the_param(tiny_seq2seq, monkeypatch):
    """opus-mt's Marian tokenizer needs sentencepiece, which tqc does not install: an ImportError's traceback, which
    the retrain flow would also have retried."""
    import transformers

    from tqc.config import ConfigError

    def needs_sentencepiece(*_, **__):
        raise ImportError("MarianTokenizer requires the SentencePiece library but it was not found in your environment")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", needs_sentencepiece)
    with pytest.raises(ConfigError, match="^augment.seq2seq.forward_model: .* needs a package that is not installed .*"
                                          "pip install sentencepiece"):
        Rewriter("backtranslate", Seq2SeqParams(forward_model=str(tiny_seq2seq[0]), backward_model=str(tiny_seq2seq[1])))


def test_a_backtranslation_whose_pivot_is_empty_is_a_failed_rewrite_not_the_backward_models_guess(tiny_seq2seq,
                                                                                                   monkeypatch):
    """The backward model makes something of an empty pivot; that is no rewrite of the question, so the row is ""
    (augment then keeps the original) and the backward model never sees it."""
    from tqc import seq2seq

    forward, backward = tiny_seq2seq
    params = Seq2SeqParams(forward_model=str(forward), backward_model=str(backward), sample=False, max_new_tokens=8)
    rewriter = Rewriter("backtranslate", params)
    pivots = {"where is paris": "", "who invented chess": "paris chess"}
    monkeypatch.setattr(rewriter.models[0], "generate", lambda texts, seed: [pivots[t] for t in texts])
    backward_saw = []
    real = seq2seq.Seq2SeqModel.generate
    monkeypatch.setattr(rewriter.models[1], "generate",
                        lambda texts, seed: backward_saw.append(list(texts)) or real(rewriter.models[1], texts, seed))
    rewrites = rewriter.rewrite(["where is paris", "who invented chess"], seed=0)
    assert backward_saw == [["paris chess"]]
    assert rewrites[0] == "" and rewrites[1] == real(rewriter.models[1], ["paris chess"], 0)[0]


def test_inputs_cut_at_max_input_tokens_are_said(tiny_seq2seq, caplog):
    params = Seq2SeqParams(paraphrase_model=str(tiny_seq2seq[0]), max_input_tokens=8, max_new_tokens=4, sample=False)
    with caplog.at_level("WARNING", logger="tqc.seq2seq"):
        Rewriter("paraphrase", params).rewrite(["where is paris", "who invented chess in the city of paris on the river"], seed=0)
    assert "1 of 2 inputs are longer than augment.seq2seq.max_input_tokens (8 tokens" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tqc.seq2seq"):
        Rewriter("paraphrase", params.model_copy(update={"max_input_tokens": 64})).rewrite(["where is paris"], seed=0)
    assert "max_input_tokens" not in caplog.text


@pytest.fixture(scope="module")
def beam_seq2seq(tmp_path_factory) -> Path:
    """A random model whose beams differ (seeds 1 and 2 emit nothing under beam search)."""
    return build_tiny_seq2seq(tmp_path_factory.mktemp("beams") / "model", 3)


def test_the_copies_of_an_original_get_distinct_beams_beside_an_original_that_is_not_repeated(beam_seq2seq):
    """Beams are per text: a repeated original takes its next beam even where another input appears once, and
    each original's first rewrite is its own best beam, not a neighbour's."""
    rewriter = Rewriter("paraphrase", Seq2SeqParams(paraphrase_model=str(beam_seq2seq), max_new_tokens=8, sample=False,
                                                    num_beams=4))
    text, other = "where is paris", "who invented chess"
    rewrites = rewriter.rewrite([text, other, text], seed=0)
    assert rewrites[0] != rewrites[2]
    assert rewrites[:2] == [rewriter.rewrite([text], seed=0)[0], rewriter.rewrite([other], seed=0)[0]]


def test_copies_beyond_the_distinct_beams_cycle_through_them_again(beam_seq2seq):
    """5 copies of a question, 2 beams: best, second, best, second, best."""
    rewriter = Rewriter("paraphrase", Seq2SeqParams(paraphrase_model=str(beam_seq2seq), max_new_tokens=8, sample=False,
                                                    num_beams=2))
    rewrites = rewriter.rewrite(["where is paris"] * 5, seed=0)
    assert rewrites[0] != rewrites[1] and rewrites == [rewrites[0], rewrites[1]] * 2 + [rewrites[0]]


def test_inputs_rewritten_over_several_batches_each_get_their_own_rewrite(beam_seq2seq):
    """batch_size 1: three inputs are three generate calls, and every one of them is rewritten, in its place."""
    rewriter = Rewriter("paraphrase", Seq2SeqParams(paraphrase_model=str(beam_seq2seq), max_new_tokens=8, sample=False,
                                                    num_beams=2, batch_size=1))
    texts = ["where is paris", "who invented chess", "where is the city"]
    assert rewriter.rewrite(texts, seed=0) == [rewriter.rewrite([text], seed=0)[0] for text in texts]


def test_an_input_of_exactly_max_input_tokens_is_not_said_to_be_cut(tiny_seq2seq, caplog):
    params = Seq2SeqParams(paraphrase_model=str(tiny_seq2seq[0]), max_input_tokens=8, max_new_tokens=4, sample=False)
    rewriter = Rewriter("paraphrase", params)
    fits, one_more = "who invented chess in the city", "who invented chess in the city of"
    assert [len(rewriter.models[0].tokenizer(t)["input_ids"]) for t in (fits, one_more)] == [8, 9]  # [CLS] … [SEP]
    with caplog.at_level("WARNING", logger="tqc.seq2seq"):
        rewriter.rewrite([fits], seed=0)
    assert "max_input_tokens" not in caplog.text
    with caplog.at_level("WARNING", logger="tqc.seq2seq"):
        rewriter.rewrite([one_more], seed=0)
    assert "1 of 1 inputs are longer than augment.seq2seq.max_input_tokens (8 tokens; the longest 9)" in caplog.text


def test_the_paraphrase_prefix_is_given_to_the_model_and_counted_in_the_inputs_length(tiny_seq2seq, monkeypatch, caplog):
    """A T5 paraphraser reads "paraphrase: <question>": the prefix goes into every input, and into its length."""
    params = Seq2SeqParams(paraphrase_model=str(tiny_seq2seq[0]), paraphrase_prefix="paraphrase: ", max_input_tokens=8,
                           max_new_tokens=4, sample=False)
    model = Rewriter("paraphrase", params).models[0]
    seen, real = [], model.model.generate
    monkeypatch.setattr(model.model, "generate", lambda **inputs: seen.append(inputs["input_ids"].tolist()) or real(**inputs))
    with caplog.at_level("WARNING", logger="tqc.seq2seq"):
        model.generate(["who invented chess in"], seed=0)  # 4 words: 8 tokens with the prefix's 2, [CLS] and [SEP]
    assert seen == [[model.tokenizer("paraphrase: who invented chess in")["input_ids"]]]
    assert "max_input_tokens" not in caplog.text
    with caplog.at_level("WARNING", logger="tqc.seq2seq"):
        model.generate(["who invented chess in the"], seed=0)  # 7 tokens without the prefix, 9 with it
    assert "1 of 1 inputs are longer than augment.seq2seq.max_input_tokens (8 tokens; the longest 9)" in caplog.text


def test_a_backtranslation_whose_every_pivot_is_empty_gives_every_row_no_rewrite(tiny_seq2seq, monkeypatch):
    """No pivot to translate back: the backward model is asked for nothing (a tokenizer, and beam search's count of
    copies, refuse an empty batch) and every row is "", which augment replaces by its original."""
    forward, backward = tiny_seq2seq
    rewriter = Rewriter("backtranslate", Seq2SeqParams(forward_model=str(forward), backward_model=str(backward),
                                                       sample=False, max_new_tokens=8))
    monkeypatch.setattr(rewriter.models[0], "generate", lambda texts, seed: ["" for _ in texts])
    assert rewriter.rewrite(["where is paris", "who invented chess"], seed=0) == ["", ""]
