from pathlib import Path

import pytest
import torch

from tqc.config import AugmentParams, ModelParams, StageOneParams
from tqc.model.encoder import BiEncoder, EmbeddingAugmentation, TextEncoder, resolve_pretrained
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion
from tqc.stages import stage_one
from tqc.training import bi_encoder_parameter_groups, parameter_groups
from tests.conftest import CLASSES, synthetic_questions

TEXTS = ["where is paris", "who invented chess", "how many people like tea"]


def tiny_bi_encoder(model_dir, **overrides) -> BiEncoder:
    return BiEncoder.from_params(ModelParams(pretrained=str(model_dir), **overrides))


@pytest.mark.parametrize("pooling", ["mean", "cls", "attention"])
@pytest.mark.parametrize("tied", [False, True])
def test_save_and_load_round_trip_with_safetensors_only(tiny_model_dir, tmp_path, pooling, tied):
    torch.manual_seed(0)
    model = tiny_bi_encoder(tiny_model_dir, pooling=pooling, tied=tied)
    if pooling == "attention":  # make the pooling weights non-trivial so the round trip is tested
        torch.nn.init.normal_(model.question.pooling.attention.weight)
    model.save(tmp_path / "m")
    loaded = BiEncoder.load(tmp_path / "m")
    assert loaded.tied == tied
    assert torch.allclose(model.question.encode(TEXTS), loaded.question.encode(TEXTS), atol=1e-6)
    assert torch.allclose(model.standard.encode(TEXTS), loaded.standard.encode(TEXTS), atol=1e-6)
    files = {p.suffix for p in (tmp_path / "m").rglob("*") if p.is_file()}
    assert ".safetensors" in files and not files & {".bin", ".pt", ".pkl", ".pth"}


def test_the_mlp_scorer_trains_and_round_trips(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    catalog = Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()])
    rows = [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 20)]
    model = tiny_bi_encoder(tiny_model_dir, similarity="mlp")
    before = model.scorer.layers[-1].weight.detach().clone()
    params = StageOneParams(epochs=1, batch_size=16, learning_rate=2e-3, warmup_ratio=0.0)
    stage_one.train(model, rows, rows[:6], catalog, params, seed=0)
    assert not torch.equal(model.scorer.layers[-1].weight, before)  # the scorer is trained with the encoders
    model.save(tmp_path / "m")
    loaded = BiEncoder.load(tmp_path / "m")
    q, s = model.question.encode(TEXTS), model.standard.encode(catalog.texts)
    assert torch.allclose(model.score(q, s), loaded.score(q, s), atol=1e-6)
    assert (tmp_path / "m" / "scorer.safetensors").is_file()


def test_tied_shares_one_encoder_and_untied_has_two(tiny_model_dir):
    tied, untied = tiny_bi_encoder(tiny_model_dir, tied=True), tiny_bi_encoder(tiny_model_dir, tied=False)
    assert tied.standard is tied.question and untied.standard is not untied.question
    assert sum(p.numel() for p in untied.parameters()) == 2 * sum(p.numel() for p in tied.parameters())


def test_a_kept_checkpoint_of_a_tied_model_copies_its_one_encoder_once(tiny_model_dir):
    from tqc.training import _snapshot

    model = tiny_bi_encoder(tiny_model_dir, tied=True)
    snapshot = _snapshot(model)
    # the state dict names each weight twice (question.… and standard.…): a reviewer saw 78 copies of 39 weights
    assert len({t.data_ptr() for t in snapshot.values()}) == len({t.data_ptr() for t in model.state_dict().values()})
    assert snapshot.keys() == model.state_dict().keys()
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # training on after the snapshot leaves it as it was
    model.load_state_dict(snapshot)
    assert all(torch.equal(snapshot[name], tensor) for name, tensor in model.state_dict().items())
    assert model.standard is model.question


def test_cutoff_zeroes_whole_feature_dimensions_per_sentence():
    torch.manual_seed(0)
    augmentation = EmbeddingAugmentation(["cutoff"], 0.5).train()
    out = augmentation(torch.ones(4, 5, 64))  # (B, T, D)
    zero_dims = (out == 0).all(dim=1)  # (B, D): a dim is cut at every token or at none
    assert ((out == 0).any(dim=1) == zero_dims).all()
    assert 0.3 < zero_dims.float().mean() < 0.7
    assert torch.equal(augmentation.eval()(torch.ones(4, 5, 64)), torch.ones(4, 5, 64))
    assert set(out.unique().tolist()) == {0.0, 1.0}  # on the input the layers' LayerNorms follow: no rescaling
    at_output = EmbeddingAugmentation(["cutoff"], 0.5, at="output").train()(torch.ones(4, 5, 64))
    assert set(at_output.unique().tolist()) == {0.0, 2.0}  # the kept dims × 1/(1 − rate): the same expected vector


def test_implicit_augmentation_perturbs_questions_in_training_only(tiny_model_dir):
    model = tiny_bi_encoder(tiny_model_dir)
    model.set_augmentation(AugmentParams(implicit=["dropout", "cutoff"], rate=0.1))
    model.eval()
    assert torch.equal(model.question(TEXTS), model.question(TEXTS))
    model.train()
    for module in model.modules():  # isolate the embedding augmentation from the backbone's own dropout
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    assert not torch.equal(model.question(TEXTS), model.question(TEXTS))
    assert torch.equal(model.standard(TEXTS), model.standard(TEXTS))  # the catalog side is never augmented


@pytest.mark.parametrize("at", ["input", "output"])
def test_implicit_augmentation_perturbs_the_token_matrix_it_is_placed_at(tiny_model_dir, at):
    torch.manual_seed(0)
    model = tiny_bi_encoder(tiny_model_dir)
    model.set_augmentation(AugmentParams(implicit=["cutoff"], rate=0.5, implicit_at=at))
    encoder = model.question.train()
    seen = {}
    encoder.backbone.register_forward_pre_hook(lambda _, args, kwargs: seen.update(given=kwargs["inputs_embeds"]), with_kwargs=True)
    encoder.backbone.register_forward_hook(lambda _, args, kwargs, out: seen.update(produced=out.last_hidden_state), with_kwargs=True)
    encoder.pooling.register_forward_pre_hook(lambda _, args: seen.update(pooled=args[0]))
    encoder(TEXTS[:1])
    word_embeddings = encoder.backbone.get_input_embeddings()(encoder.tokenize(TEXTS[:1])["input_ids"])  # (1, T, D)
    cut_given = (seen["given"] == 0).all(dim=1) & (word_embeddings != 0).any(dim=1)  # (1, D): dims zero at every token
    cut_pooled = (seen["pooled"] == 0).all(dim=1) & (seen["produced"] != 0).any(dim=1)
    if at == "input":  # the layers read the cut embeddings; their output reaches pooling as it is
        assert 0.3 < cut_given.float().mean() < 0.7
        assert torch.equal(seen["pooled"], seen["produced"])
    else:  # the layers read the embeddings as they are; whole feature dims of their output are cut before pooling
        assert torch.equal(seen["given"], word_embeddings)
        assert 0.3 < cut_pooled.float().mean() < 0.7
    encoder.eval()
    seen.clear()
    encoder(TEXTS[:1])
    assert torch.equal(seen["given"], word_embeddings) and torch.equal(seen["pooled"], seen["produced"])


def test_implicit_augmentation_refuses_an_unknown_place():
    with pytest.raises(ValueError, match="'input' or 'output'"):
        EmbeddingAugmentation(["dropout"], 0.1, at="middle")


def test_a_tied_encoder_augments_questions_but_not_the_catalog(tiny_model_dir):
    model = tiny_bi_encoder(tiny_model_dir, tied=True)
    model.set_augmentation(AugmentParams(implicit=["dropout", "cutoff"], rate=0.3))
    model.train()
    for module in model.modules():  # only the embedding augmentation may differ between calls
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    assert not torch.equal(model.embed_questions(TEXTS), model.embed_questions(TEXTS))
    assert torch.equal(model.embed_standards(TEXTS), model.embed_standards(TEXTS))  # one module, two roles
    model.eval()
    assert torch.equal(model.embed_questions(TEXTS), model.embed_standards(TEXTS))


def test_scores_are_float32_under_bf16_autocast(tiny_model_dir):
    model = tiny_bi_encoder(tiny_model_dir)
    questions, standards = torch.randn(3, 32, dtype=torch.bfloat16), torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        scores = model.score(questions, standards)  # (3, 4)
    assert scores.dtype == torch.float32
    assert torch.allclose(scores, model.score(questions.float(), standards.float()))


def test_local_folders_resolve_to_themselves_and_the_packaged_id_to_the_package(tiny_model_dir):
    assert resolve_pretrained(str(tiny_model_dir)) == str(tiny_model_dir)
    packaged = resolve_pretrained("sentence-transformers/all-MiniLM-L6-v2")
    assert (Path(packaged) / "config.json").is_file()
    assert resolve_pretrained("some-org/some-model") == "some-org/some-model"


def test_a_max_length_beyond_the_models_positions_is_refused_naming_both(tiny_model_dir, tmp_path):
    """The tiny BERT has 64 positions: at max_length 100 the first question over 64 tokens failed mid-training with
    torch's "size of tensor a (94) must match the size of tensor b (64)". The tokenizer's model_max_length is only its
    default cut-off (tokenize passes max_length), so it bounds nothing; nor is a saved model refused at load."""
    import json
    import shutil

    from tqc.config import ConfigError, ModelParams
    from tqc.model.encoder import BiEncoder

    with pytest.raises(ConfigError, match=r"^model.max_length 100: .* reads at most 64 tokens .*set model.max_length "
                                          r"to 64 or less$"):
        BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir), max_length=100))
    with pytest.raises(ConfigError, match=r"^model.max_length 100: .* reads at most 64 tokens"):
        TextEncoder.from_pretrained(str(tiny_model_dir), max_length=100)  # the NC baseline's and zero-shot's: unchecked
    long_question = " ".join(["where"] * 200)
    assert BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir), max_length=64)).question.encode(
        [long_question]).shape[0] == 1

    cut_short = tmp_path / "cut-short"  # a tokenizer whose own default cut-off is below the length asked
    shutil.copytree(tiny_model_dir, cut_short)
    config = json.loads((cut_short / "tokenizer_config.json").read_text())
    (cut_short / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 16}))
    encoder = BiEncoder.from_params(ModelParams(pretrained=str(cut_short), max_length=32)).question
    assert encoder.tokenize([long_question])["input_ids"].shape[1] == 32
    assert encoder.encode([long_question]).shape[0] == 1


def test_readable_tokens_counts_from_where_roberta_like_backbones_number_positions():
    from transformers import RobertaConfig, RobertaModel

    from tqc.model.encoder import TextEncoder

    backbone = RobertaModel(RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=32, max_position_embeddings=66, pad_token_id=1))
    assert TextEncoder(backbone, None, "mean", 48).readable_tokens() == 64  # 66 − (padding index 1 + 1)


def test_an_unloadable_encoder_says_which_param_and_why_in_one_line(tmp_path):
    from tqc.config import ConfigError

    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"x")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    for name, why in ((str(tmp_path / "missing" / "x"), "the folder '.*missing/x' does not exist"),
                      (str(tmp_path / "not-a-model"), "the folder '.*not-a-model' holds no config.json"),
                      (str(tmp_path / "broken"), "the folder '.*broken' holds no model that loads"),
                      (str(tmp_path / "weights.bin"), "'.*weights.bin' is a file; give the model's folder"),
                      ("some-org-that-is-not-cached/model", "'some-org-that-is-not-cached/model' is no local folder, .* neither cached here nor reachable")):
        with pytest.raises(ConfigError, match=f"^model.pretrained: {why}") as raised:
            TextEncoder.from_pretrained(name)
        assert "\n" not in str(raised.value)


def test_stage_one_learns_the_synthetic_classes(tiny_model_dir):
    """Minimum functionality: a few epochs of stage one beat the untrained start on validation."""
    torch.manual_seed(0)
    catalog = Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()])
    rows = [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 40)]
    validation = [LabeledQuestion(t, c) for t, c in synthetic_questions(1, 10)]
    model = tiny_bi_encoder(tiny_model_dir)
    params = StageOneParams(epochs=4, batch_size=16, learning_rate=2e-3, patience=4, warmup_ratio=0.0)
    result = stage_one.train(model, rows, validation, catalog, params, seed=0)
    assert result.best_validation_macro_f1 > result.history[0].validation_macro_f1
    assert result.best_validation_macro_f1 >= 0.9


def test_nc_classifier_round_trip_keeps_its_classes_and_refuses_another_catalog_order(tiny_model_dir, tmp_path):
    import json

    from tqc.model.linear import LinearClassifier
    from tqc.schema import StaleClassifier
    from tqc.scoring import scorer_for

    torch.manual_seed(0)
    model = LinearClassifier(TextEncoder.from_pretrained(str(tiny_model_dir)), ["a", "b", "c"])
    model.save(tmp_path / "nc")
    loaded = LinearClassifier.load(tmp_path / "nc")
    assert loaded.class_ids == ["a", "b", "c"]
    assert loaded.logits(TEXTS).shape == (3, 3)
    assert torch.allclose(torch.as_tensor(model.logits(TEXTS)), torch.as_tensor(loaded.logits(TEXTS)), atol=1e-6)

    questions = [LabeledQuestion(t, "a") for t in TEXTS]
    in_order = Catalog([StandardQuestion(c, f"what is {c}?") for c in "abc"])
    assert scorer_for(loaded, 8)(questions, in_order).shape == (3, 3)
    reordered = Catalog([StandardQuestion(c, f"what is {c}?") for c in "bac"])
    with pytest.raises(StaleClassifier, match=r"nc: .*row 0 is 'a' in the head, 'b' in the catalog"):
        scorer_for(loaded, 8)(questions, reordered)  # its logits would have answered b for a
    larger = Catalog([StandardQuestion(c, f"what is {c}?") for c in "abcd"])
    with pytest.raises(StaleClassifier, match=r"row 3, 'd', is only in the catalog"):
        scorer_for(loaded, 8)(questions, larger)

    config_path = tmp_path / "nc" / "tqc_model.json"  # a folder saved with only a count cannot be checked
    config_path.write_text(json.dumps({"kind": "linear_classifier", "classes": 3}))
    with pytest.raises(StaleClassifier, match="only a count, 3"):
        LinearClassifier.load(tmp_path / "nc")


def test_the_nc_stage_records_how_its_model_was_trained_as_the_contrastive_stages_do(tiny_model_dir, tmp_path):
    """Its tqc_model.json held only the class ids: nothing said which encoder, params or epoch the baseline in
    metrics.json came from, as stage one's and stage two's folders say of theirs."""
    from tqc.config import BaselineNCParams
    from tqc.io import read_json
    from tqc.schema import save_questions
    from tqc.stages import baseline_nc

    catalog = Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()])
    catalog.save(tmp_path / "catalog.jsonl")
    save_questions(tmp_path / "train.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 4)])
    save_questions(tmp_path / "validation.jsonl", [LabeledQuestion(t, c) for t, c in synthetic_questions(1, 2)])
    params = BaselineNCParams(epochs=1, batch_size=8, max_steps=1)
    result = baseline_nc.run(tmp_path, tmp_path / "train.jsonl", ModelParams(pretrained=str(tiny_model_dir)),
                             AugmentParams(), params, 0, tmp_path / "nc", tmp_path / "nc.csv")
    config = read_json(tmp_path / "nc" / "tqc_model.json")
    assert config["class_ids"] == catalog.class_ids and config["stage"] == "baseline_nc"
    assert config["pretrained"] == str(tiny_model_dir) and config["params"] == params.model_dump(mode="json")
    assert (config["best_epoch"], config["validation_macro_f1"]) == (result.best_epoch, result.best_validation_macro_f1)
    assert baseline_nc.LinearClassifier.load(tmp_path / "nc").class_ids == catalog.class_ids


def test_a_damaged_or_missing_nc_head_is_an_error_naming_its_file(tiny_model_dir, tmp_path):
    """head.safetensors was read by a bare load_file: a damaged one stopped prior and evaluate with safetensors'
    traceback, naming no file, and a missing one with a FileNotFoundError."""
    from tqc.config import ConfigError
    from tqc.model.linear import LinearClassifier

    LinearClassifier(TextEncoder.from_pretrained(str(tiny_model_dir)), ["a", "b"]).save(tmp_path / "nc")
    head = tmp_path / "nc" / "head.safetensors"
    head.write_bytes(head.read_bytes()[: head.stat().st_size // 2])
    with pytest.raises(ConfigError, match=r"head\.safetensors: damaged"):
        LinearClassifier.load(tmp_path / "nc")
    head.unlink()
    with pytest.raises(ValueError, match=r"head\.safetensors: missing, so the model's linear head would start untrained"):
        LinearClassifier.load(tmp_path / "nc")


@pytest.mark.parametrize("negatives", ["mined", "mined_and_in_batch"])
def test_stage_two_trains_against_mined_negatives(tiny_model_dir, negatives):
    from tqc.config import StageTwoParams
    from tqc.mining import mine
    from tqc.schema import gold_indices
    from tqc.stages import stage_two

    torch.manual_seed(0)
    catalog = Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()])
    rows = [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 40)]
    validation = [LabeledQuestion(t, c) for t, c in synthetic_questions(1, 10)]
    model = tiny_bi_encoder(tiny_model_dir)
    mined, _ = mine(model.question.encode([q.text for q in rows]).numpy(), model.standard.encode(catalog.texts).numpy(),
                    gold_indices(rows, catalog), k=1)
    params = StageTwoParams(epochs=4, batch_size=16, learning_rate=2e-3, patience=4, warmup_ratio=0.0, negatives=negatives)
    encoded, embed_standards = [], model.embed_standards
    model.embed_standards = lambda texts: encoded.append(list(texts)) or embed_standards(texts)  # each training batch's
    result = stage_two.train(model, rows, torch.as_tensor(mined), validation, catalog, params, seed=0)
    assert result.best_validation_macro_f1 > result.history[0].validation_macro_f1
    assert encoded and all(len(set(texts)) == len(texts) for texts in encoded)  # each standard question once a batch


def test_weight_decay_reaches_matrices_but_not_biases_or_layer_norms(tiny_model_dir):
    model = tiny_bi_encoder(tiny_model_dir, similarity="mlp")
    groups = parameter_groups(model, learning_rate=1e-2)
    grouped = [p for group in groups for p in group["params"]]
    assert sorted(map(id, grouped)) == sorted(id(p) for p in model.parameters())  # each parameter once
    names = {id(p): name for name, p in model.named_parameters()}
    undecayed = {names[id(p)] for g in groups if g.get("weight_decay") == 0.0 for p in g["params"]}
    assert undecayed and all(n.endswith("bias") or "LayerNorm" in n for n in undecayed)

    # With zero gradients, one AdamW step is pure decay: matrices shrink, biases and norms stay.
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(groups, weight_decay=0.5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for name, p in model.named_parameters():
        if name in undecayed:
            assert torch.equal(p, before[name]), name
        elif before[name].any():  # the MLP scorer's last layer starts at zero
            assert p.norm() < before[name].norm(), name


MIXED_LENGTHS = ["why", "what is the capital of a very large country far away from here", "who", "how far",
                 "which river runs through the oldest town in the northern part of the land", "when", "where is it"]


def _rates(groups: list[dict], model: BiEncoder) -> list[tuple[float, float | None, list[str]]]:
    """Each group's learning rate, weight decay (None: AdamW's) and parameter names, in the optimizer's order."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [(group["lr"], group.get("weight_decay"), [names[id(p)] for p in group["params"]]) for group in groups]


@pytest.mark.parametrize("tied", [False, True])
def test_the_heads_train_at_head_learning_rate_and_the_encoders_at_learning_rate(tiny_model_dir, tied):
    model = tiny_bi_encoder(tiny_model_dir, pooling="attention", similarity="mlp", tied=tied)
    params = StageOneParams(learning_rate=1e-4, head_learning_rate=1e-2)
    rates = _rates(bi_encoder_parameter_groups(model, params, "stage_one"), model)
    grouped = [name for _, _, names in rates for name in names]
    assert sorted(grouped) == sorted(name for name, _ in model.named_parameters())  # each parameter once
    heads = {name for name, _ in model.named_parameters() if ".backbone." not in name}  # every layer on top of them
    assert heads == {f"{encoder}.pooling.attention.{kind}" for encoder in (["question"] if tied else ["question", "standard"])
                     for kind in ("weight", "bias")} | {f"scorer.layers.{i}.{kind}" for i in (0, 2) for kind in ("weight", "bias")}
    assert [(lr, decay) for lr, decay, _ in rates] == [(1e-4, None), (1e-4, 0.0), (1e-2, None), (1e-2, 0.0)]
    assert set(rates[2][2] + rates[3][2]) == heads and all(name.endswith("weight") for name in rates[2][2])
    assert all(name.endswith("bias") for name in rates[3][2])  # the heads' biases undecayed, as the encoders' are


@pytest.mark.parametrize("pooling, similarity", [("attention", "mlp"), ("mean", "cosine")])
def test_a_null_head_learning_rate_gives_the_optimizer_the_groups_it_had_before_the_key(tiny_model_dir, pooling, similarity):
    """The same groups in the same order, each with the same tensors in the same order: a default run trains as before."""
    model = tiny_bi_encoder(tiny_model_dir, pooling=pooling, similarity=similarity)
    params = StageOneParams(learning_rate=3e-4)
    before = parameter_groups(model, 3e-4)  # what stage one and stage two passed to the optimizer before
    assert _rates(bi_encoder_parameter_groups(model, params, "stage_one"), model) == _rates(before, model)
    assert len(before) == 2


def test_a_head_learning_rate_with_no_head_layers_changes_nothing_and_says_so(tiny_model_dir, caplog):
    model = tiny_bi_encoder(tiny_model_dir)  # mean pooling, cosine: nothing on top of the backbones
    groups = bi_encoder_parameter_groups(model, StageOneParams(head_learning_rate=1e-3), "stage_one")
    assert _rates(groups, model) == _rates(parameter_groups(model, StageOneParams().learning_rate), model)
    assert "stage_one.head_learning_rate is 0.001" in caplog.text and "has no head layers" in caplog.text


def _groups_handed_to_the_optimizer(monkeypatch, stage: str, model, **schedule) -> list[dict]:
    """One step of `stage` ("stage_one", "stage_two" or "baseline_nc") on `model` with `schedule`'s params: the
    parameter groups it gave AdamW."""
    from tqc import training
    from tqc.config import BaselineNCParams, StageTwoParams
    from tqc.stages import baseline_nc, stage_two

    handed = []
    adamw = training.adamw
    monkeypatch.setattr(training, "adamw", lambda groups, *args, **kwargs: handed.append(groups) or adamw(groups, *args, **kwargs))
    catalog = Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()])
    rows = [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 8)]
    schedule = dict(epochs=1, batch_size=4, max_steps=1, **schedule)
    if stage == "stage_one":
        stage_one.train(model, rows, rows[:4], catalog, StageOneParams(**schedule), seed=0)
    elif stage == "stage_two":
        negatives = torch.as_tensor([[(c + 1) % len(catalog)] for c in training.gold_indices(rows, catalog)])
        stage_two.train(model, rows, negatives, rows[:4], catalog, StageTwoParams(**schedule), seed=0)
    else:
        baseline_nc.train(model, rows, rows[:4], catalog, BaselineNCParams(**schedule), seed=0)
    return handed[0]


@pytest.mark.parametrize("stage", ["stage_one", "stage_two"])
def test_each_stage_hands_its_head_learning_rate_to_the_optimizer(tiny_model_dir, monkeypatch, stage):
    model = tiny_bi_encoder(tiny_model_dir, similarity="mlp")
    handed = _groups_handed_to_the_optimizer(monkeypatch, stage, model, learning_rate=1e-4, head_learning_rate=5e-3)
    heads = {id(p) for p in model.scorer.parameters()}
    assert [(group["lr"], all(id(p) in heads for p in group["params"])) for group in handed] == [
        (1e-4, False), (1e-4, False), (5e-3, True), (5e-3, True)]


@pytest.mark.parametrize("tied", [False, True])
def test_layer_decay_gives_each_depth_of_the_backbones_its_rate_and_the_heads_theirs(tiny_model_dir, tied):
    """The tiny BERT has 2 blocks: its embeddings train at lr·d³, block 0 at lr·d², block 1 at lr·d, its pooler (after
    the blocks) at lr; both backbones' layers of one depth share a group; the heads keep head_learning_rate."""
    model = tiny_bi_encoder(tiny_model_dir, pooling="attention", similarity="mlp", tied=tied)
    params = StageOneParams(learning_rate=1e-4, head_learning_rate=1e-2, layer_decay=0.5)
    rates = _rates(bi_encoder_parameter_groups(model, params, "stage_one"), model)
    grouped = [name for _, _, names in rates for name in names]
    assert sorted(grouped) == sorted(name for name, _ in model.named_parameters())  # each parameter once
    rate_of = {name: lr for lr, _, names in rates for name in names}
    expected_factor = {"embeddings": 0.125, "encoder.layer.0": 0.25, "encoder.layer.1": 0.5, "pooler": 1.0}
    for name, rate in rate_of.items():
        if ".backbone." not in name:
            assert rate == 1e-2, name
            continue
        part = name.split(".backbone.")[1]
        factor = next(f for prefix, f in expected_factor.items() if part.startswith(prefix + "."))
        assert rate == pytest.approx(1e-4 * factor), name
    encoders = ["question"] if tied else ["question", "standard"]
    block_zero = next(names for _, _, names in rates if any(".encoder.layer.0." in n for n in names))
    assert {n.split(".backbone.")[0] for n in block_zero} == set(encoders)  # one group for a depth, both encoders in it


def test_layer_decay_of_1_leaves_the_groups_as_they_were(tiny_model_dir):
    model = tiny_bi_encoder(tiny_model_dir, pooling="attention", similarity="mlp")
    with_key = StageOneParams(learning_rate=1e-4, head_learning_rate=1e-2, layer_decay=1.0)
    without = StageOneParams(learning_rate=1e-4, head_learning_rate=1e-2)
    assert _rates(bi_encoder_parameter_groups(model, with_key, "s"), model) == _rates(
        bi_encoder_parameter_groups(model, without, "s"), model)
    assert len(bi_encoder_parameter_groups(model, with_key, "s")) == 4  # encoders decayed and not, heads decayed and not


def test_layer_depths_reads_gpt2_and_t5_style_names_and_what_comes_after_the_blocks():
    from torch import nn

    from tqc.training import layer_depths

    class Decoder(nn.Module):  # GPT-2's layout: wte, wpe, h.0 … h.2, ln_f
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(5, 4), nn.Embedding(5, 4)
            self.h = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
            self.ln_f = nn.LayerNorm(4)

    decoder = Decoder()
    depths, top = layer_depths(decoder)
    names = {id(p): name for name, p in decoder.named_parameters()}
    assert top == 4
    assert {names[id(p)]: d for p, d in depths} == {"wte.weight": 0, "wpe.weight": 0, "h.0.weight": 1, "h.0.bias": 1,
                                                    "h.1.weight": 2, "h.1.bias": 2, "h.2.weight": 3, "h.2.bias": 3,
                                                    "ln_f.weight": 4, "ln_f.bias": 4}


def test_layer_decay_on_a_backbone_with_no_numbered_blocks_is_refused_by_name():
    from torch import nn

    from tqc.config import ConfigError
    from tqc.training import backbone_groups

    with pytest.raises(ConfigError, match="layer_decay needs numbered transformer blocks.*Sequential.*set layer_decay to 1"):
        backbone_groups([nn.Sequential(nn.Linear(2, 2))], 1e-4, 0.8)


@pytest.mark.parametrize("stage", ["stage_one", "stage_two", "baseline_nc"])
def test_each_stage_hands_its_layer_decay_to_the_optimizer(tiny_model_dir, monkeypatch, stage):
    from tqc.stages import baseline_nc

    if stage == "baseline_nc":
        classes = Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()]).class_ids
        model = baseline_nc.LinearClassifier(TextEncoder.from_pretrained(str(tiny_model_dir), "mean", 32), classes)
        backbone, more = model.encoder.backbone, {"head_learning_rate": 1e-2}
    else:
        model = tiny_bi_encoder(tiny_model_dir)
        backbone, more = model.question.backbone, {}
    handed = _groups_handed_to_the_optimizer(monkeypatch, stage, model, learning_rate=1e-4, layer_decay=0.5, **more)
    rate_of = {id(p): group["lr"] for group in handed for p in group["params"]}
    assert rate_of[id(backbone.embeddings.word_embeddings.weight)] == pytest.approx(1e-4 * 0.5**3)
    assert rate_of[id(backbone.encoder.layer[1].output.dense.weight)] == pytest.approx(1e-4 * 0.5)
    if stage == "baseline_nc":
        assert rate_of[id(model.head.weight)] == 1e-2


def test_passes_by_length_give_each_question_the_vector_of_one_padded_pass(tiny_model_dir):
    torch.manual_seed(0)
    encoder = TextEncoder.from_pretrained(str(tiny_model_dir), "mean", 32).eval()
    with torch.no_grad():
        encoder.pass_rows = len(MIXED_LENGTHS)
        one_pass = encoder(MIXED_LENGTHS)  # (7, D), every question padded to the longest
        encoder.pass_rows = 2
        in_passes = encoder(MIXED_LENGTHS)  # four passes, the short questions together
        alone = torch.cat([encoder([text]) for text in MIXED_LENGTHS])  # no padding at all
    assert in_passes.shape == one_pass.shape
    assert torch.allclose(in_passes, one_pass, atol=1e-5)  # and in the order of the texts
    assert torch.allclose(in_passes, alone, atol=1e-5)
    assert not torch.allclose(in_passes[0], in_passes[2], atol=1e-3)  # different questions, different rows


@pytest.mark.parametrize("pass_rows", [1, 64])
def test_a_left_padded_question_encodes_as_it_does_alone(tiny_model_dir, pass_rows):
    # In one pass of 64 the shorter questions are padded on the left: their positions count from their first
    # real token (position ids), not from the padding, or their vectors would change with their neighbours
    encoder = TextEncoder.from_pretrained(str(tiny_model_dir), "mean", 32).eval()
    encoder.tokenizer.padding_side = "left"
    encoder.pass_rows = pass_rows
    assert encoder.takes_position_ids
    with torch.no_grad():
        in_passes = encoder(MIXED_LENGTHS)
        alone = torch.cat([encoder([text]) for text in MIXED_LENGTHS])
    assert torch.allclose(in_passes, alone, atol=1e-5)


def test_a_left_padded_question_encodes_as_alone_in_a_backbone_that_counts_positions_from_its_padding_index(tiny_model_dir):
    """RoBERTa, XLM-R, MPNet number positions from padding_idx + 1: ids counted from 0 moved every question."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tokenizer.padding_side = "left"
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id)
    encoder = TextEncoder(RobertaModel(config), tokenizer, "mean", 32).eval()
    assert encoder.position_padding_idx == tokenizer.pad_token_id
    with torch.no_grad():
        together = encoder(MIXED_LENGTHS)
        tokenizer.padding_side = "right"  # alone, as the backbone numbers positions itself (no ids passed)
        alone = torch.cat([encoder([text]) for text in MIXED_LENGTHS])
    assert torch.allclose(together, alone, atol=1e-5)


def test_passes_take_right_padding_from_a_tokenizer_that_does_not_name_its_side(tiny_model_dir):
    class BareTokenizer:  # a callable tokenizer with no padding_side attribute, padding on the right
        def __init__(self, tokenizer):
            self.tokenizer = tokenizer

        def __call__(self, *args, **kwargs):
            return self.tokenizer(*args, **kwargs)

    encoder = TextEncoder.from_pretrained(str(tiny_model_dir), "mean", 32).eval()
    with torch.no_grad():
        named = encoder(MIXED_LENGTHS)
        encoder.tokenizer = BareTokenizer(encoder.tokenizer)
        assert not hasattr(encoder.tokenizer, "padding_side")
        encoder.pass_rows = 2
        bare = encoder(MIXED_LENGTHS)
    assert torch.allclose(bare, named, atol=1e-5)


def test_forward_reads_every_width_on_the_cpu_and_copies_the_batch_to_the_device_once(tiny_model_dir, monkeypatch):
    # On a GPU a width read from a device tensor, or a plain copy per pass, would wait for the queued kernels
    import tqc.model.encoder as encoder_module

    encoder = TextEncoder.from_pretrained(str(tiny_model_dir), "mean", 32)
    encoder.pass_rows = 2  # four passes
    copied = []
    to_device = encoder_module._to_device

    def recording(tensor, device):
        copied.append((tensor.device.type, tuple(tensor.shape)))
        return to_device(tensor, device)

    monkeypatch.setattr(encoder_module, "_to_device", recording)
    assert {value.device.type for value in encoder.tokenize(MIXED_LENGTHS).values()} == {"cpu"}
    with torch.no_grad():
        encoder(MIXED_LENGTHS)
    keys = len(encoder.tokenize(MIXED_LENGTHS))  # ids, mask (and token types)
    assert len(copied) == keys + 1  # the sorted batch, key by key, and the order to restore: not a copy a pass
    assert {where for where, _ in copied} == {"cpu"}
    assert copied[-1][1] == (len(MIXED_LENGTHS),)


def test_passes_cut_the_padding_a_long_question_forces_on_short_ones(tiny_model_dir, monkeypatch):
    encoder = TextEncoder.from_pretrained(str(tiny_model_dir), "mean", 32)
    widths = []
    backbone_forward = encoder.backbone.forward

    def recording(*args, **kwargs):
        widths.append(tuple(kwargs["inputs_embeds"].shape[:2]))  # (rows, tokens) of each pass
        return backbone_forward(*args, **kwargs)

    monkeypatch.setattr(encoder.backbone, "forward", recording)
    encoder.pass_rows = 4
    encoder(MIXED_LENGTHS)
    lengths = sorted(int(n) for n in encoder.tokenize(MIXED_LENGTHS)["attention_mask"].sum(1))
    assert widths == [(4, lengths[3]), (3, lengths[6])]  # the four shortest padded to the 4th, not the 7th


def test_encode_returns_vectors_in_the_order_of_the_texts_whatever_their_lengths(tiny_model_dir):
    encoder = TextEncoder.from_pretrained(str(tiny_model_dir), "mean", 32)
    encoded = encoder.encode(MIXED_LENGTHS, batch_size=3)  # sorted by length into batches of 3, then put back
    with torch.no_grad():
        alone = torch.cat([encoder.eval()([text]) for text in MIXED_LENGTHS])
    assert torch.allclose(encoded, alone, atol=1e-5)
    assert encoder.encode([]).shape == (0, encoder.hidden_size)


def test_adamw_is_fused_on_cpu_and_takes_the_default_step(tiny_model_dir):
    from tqc.training import adamw

    torch.manual_seed(0)
    steps = {}
    for fused in (None, False):
        model = tiny_bi_encoder(tiny_model_dir)
        model.load_state_dict(tiny_bi_encoder(tiny_model_dir).state_dict())
        optimizer = adamw(parameter_groups(model, learning_rate=1e-2), weight_decay=0.1, fused=fused)
        assert optimizer.defaults["fused"] is (fused is None)  # None: fused where the device has the kernel
        for step in range(3):
            generator = torch.Generator().manual_seed(step)
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=generator)
            optimizer.step()
        steps[fused] = [p.detach() for p in model.parameters()]
    moved = [not torch.equal(p, q) for p, q in zip(steps[None], tiny_bi_encoder(tiny_model_dir).parameters())]
    assert any(moved)
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(steps[None], steps[False]))


def test_a_batch_in_passes_sends_each_question_its_own_gradient(tiny_model_dir):
    # Eval mode: no dropout, so the two settings compute the same function of the weights
    encoder = TextEncoder.from_pretrained(str(tiny_model_dir), "mean", 32).eval()
    weights = torch.randn(len(MIXED_LENGTHS), encoder.hidden_size, generator=torch.Generator().manual_seed(0))  # (7, D)
    gradients = {}
    for rows in (len(MIXED_LENGTHS), 2):
        encoder.zero_grad(set_to_none=True)
        encoder.pass_rows = rows
        (encoder(MIXED_LENGTHS) * weights).sum().backward()  # a loss that tells the questions apart
        gradients[rows] = {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}
    assert gradients[2].keys() == gradients[len(MIXED_LENGTHS)].keys() and gradients[2]
    for name, gradient in gradients[2].items():
        assert torch.allclose(gradient, gradients[len(MIXED_LENGTHS)][name], atol=1e-5), name


def test_a_partial_or_edited_model_folder_is_an_error_naming_the_file_not_an_untrained_part(tiny_model_dir, tmp_path):
    """Loading a copy that lost the MLP scorer's or attention pooling's weights would start that part untrained and
    rank silently worse (the scorer's last layer starts at zero: cosine alone); a config cut short or missing a key
    would be a bare JSONDecodeError or KeyError."""
    import shutil

    tiny_bi_encoder(tiny_model_dir, similarity="mlp", pooling="attention").save(tmp_path / "whole")
    damaged = {
        "scorer": lambda d: (d / "scorer.safetensors").unlink(),
        "pooling": lambda d: (d / "question_encoder" / "pooling.safetensors").unlink(),
        "cut": lambda d: (d / "tqc_model.json").write_text('{"tied": fal'),
        "key": lambda d: (d / "tqc_model.json").write_text('{"similarity": "mlp"}'),
        "bytes": lambda d: (d / "question_encoder" / "tqc_encoder.json").write_bytes(b'{"pooling": "\xe9"}'),
        "no-encoder-config": lambda d: (d / "question_encoder" / "tqc_encoder.json").unlink(),
        "no-model-config": lambda d: (d / "tqc_model.json").unlink(),
    }
    expected = {
        "scorer": r"scorer\.safetensors: missing, so the model's mlp scorer would start untrained",
        "pooling": r"question_encoder/pooling\.safetensors: missing, so the model's attention pooling would start untrained",
        "cut": r"tqc_model\.json: not a saved model's config \(",
        "key": r"tqc_model\.json: not a saved model's config \(no tied\)",
        "bytes": r"tqc_encoder\.json: not a saved model's config \(",
        "no-encoder-config": r"question_encoder/tqc_encoder\.json: missing, so this is not a whole saved model folder",
        "no-model-config": r"tqc_model\.json: missing, so this is not a whole saved model folder",
    }
    for name, damage in damaged.items():
        shutil.copytree(tmp_path / "whole", tmp_path / name)
        damage(tmp_path / name)
        with pytest.raises(FileNotFoundError if name.startswith("no-") else ValueError, match=expected[name]):
            BiEncoder.load(tmp_path / name)
    assert BiEncoder.load(tmp_path / "whole").similarity == "mlp"  # the undamaged folder loads


def test_a_saved_folder_whose_weights_are_pickled_is_refused_not_unpickled(tiny_model_dir, tmp_path):
    """A folder with pytorch_model.bin in place of model.safetensors (swapped, or copied by hand) loaded: transformers
    unpickled it, and the prior's weights digest, which hashes safetensors alone, skipped its staleness check."""
    import shutil

    from tqc.config import ConfigError

    tiny_bi_encoder(tiny_model_dir).save(tmp_path / "whole")
    shutil.copytree(tmp_path / "whole", tmp_path / "pickled")
    encoder_dir = tmp_path / "pickled" / "question_encoder"
    weights = TextEncoder.load(encoder_dir).backbone.state_dict()
    (encoder_dir / "model.safetensors").unlink()
    torch.save(weights, encoder_dir / "pytorch_model.bin")
    with pytest.raises(ConfigError, match=r"question_encoder: no model.safetensors; it holds pytorch_model.bin, pickled "
                                          r"weights, which tqc never loads"):
        BiEncoder.load(tmp_path / "pickled")
    (encoder_dir / "pytorch_model.bin").unlink()
    with pytest.raises(ConfigError, match=r"question_encoder: no model.safetensors: a model folder tqc saved"):
        BiEncoder.load(tmp_path / "pickled")
    assert BiEncoder.load(tmp_path / "whole").similarity == "cosine"


def test_cls_pooling_takes_each_rows_first_real_token_on_either_padding_side():
    """With left padding, position 0 of a shorter row is a [PAD]: cls pooled the padding."""
    from tqc.model.encoder import Pooling

    states = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)  # (B=2, T=3, D=2)
    left, right = torch.tensor([[0, 1, 1], [1, 1, 1]]), torch.tensor([[1, 1, 0], [1, 1, 1]])
    pooling = Pooling("cls", 2)
    assert torch.equal(pooling(states, left), torch.stack([states[0, 1], states[1, 0]]))
    assert torch.equal(pooling(states, right), states[:, 0])


def test_a_checkpoint_saved_in_half_precision_loads_and_trains_in_float32(tiny_model_dir, tmp_path):
    """transformers 5 keeps a folder's saved dtype: an fp16 backbone met float32 attention pooling (a dtype error),
    and with mean pooling trained in fp16, its small updates lost to rounding."""
    from transformers import AutoModel, AutoTokenizer

    half = tmp_path / "tiny-fp16"
    AutoModel.from_pretrained(str(tiny_model_dir)).half().save_pretrained(half)
    AutoTokenizer.from_pretrained(str(tiny_model_dir)).save_pretrained(half)
    encoder = TextEncoder.from_pretrained(str(half), "attention", 32)
    assert {p.dtype for p in encoder.parameters()} == {torch.float32}
    assert encoder.encode(TEXTS).dtype == torch.float32


@pytest.mark.parametrize("failure", [BrokenPipeError(32, "Broken pipe"),
                                     PermissionError(13, "Permission denied", "model.safetensors"),
                                     OSError(28, "No space left on device")])
def test_a_model_the_system_fails_to_read_keeps_its_reason_not_no_model_that_loads(tiny_model_dir, monkeypatch, failure):
    """Every OSError of a loader was said as "holds no model that loads", a bad-config error: a broken pipe, a
    permission error or a full disk keep their own reason, in one line naming the path, and stay an OSError (a
    failure that may pass later), never a BrokenPipeError, which `tqc` would take for a reader that stopped early."""
    import transformers

    from tqc.config import ConfigError

    def fails(*_, **__):
        raise failure

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", fails)
    with pytest.raises(OSError) as raised:
        TextEncoder.from_pretrained(str(tiny_model_dir))
    message = str(raised.value)
    assert type(raised.value) is OSError and not isinstance(raised.value, ConfigError)
    assert message.startswith(f"model.pretrained: {str(tiny_model_dir)!r} could not be read ({type(failure).__name__}: ")
    assert failure.strerror in message and "no model that loads" not in message and "\n" not in message


def test_a_loaders_own_no_model_error_is_still_said_as_no_model_that_loads(tiny_model_dir, monkeypatch):
    import transformers

    from tqc.config import ConfigError

    def fails(*_, **__):
        raise OSError("Error no file named model.safetensors, or pytorch_model.bin, found in directory x.")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", fails)
    with pytest.raises(ConfigError, match="holds no model that loads .*no file named model.safetensors"):
        TextEncoder.from_pretrained(str(tiny_model_dir))


def test_a_damaged_weights_file_is_an_error_naming_it_not_a_safetensors_traceback(tiny_model_dir, tmp_path):
    """A copy or a save cut short, or bytes overwritten: safetensors' SafetensorError named no file, and came as a
    traceback from every command that loads a model. Now one line naming the file, and what to do."""
    import shutil

    from tqc.config import ConfigError

    tiny_bi_encoder(tiny_model_dir, similarity="mlp", pooling="attention", tied=False).save(tmp_path / "whole")
    damaged = {"question_encoder/model.safetensors": lambda data: data[: len(data) // 2],  # cut short
               "standard_encoder/model.safetensors": lambda data: b"\x00garbage" * 64,
               "question_encoder/pooling.safetensors": lambda data: b"",
               "scorer.safetensors": lambda data: data[:-4]}
    for i, (file, damage) in enumerate(damaged.items()):
        folder = tmp_path / f"damaged-{i}"
        shutil.copytree(tmp_path / "whole", folder)
        (folder / file).write_bytes(damage((folder / file).read_bytes()))
        with pytest.raises(ConfigError, match=f"^{folder / file}: damaged, not a whole safetensors file \\(.+\\); "
                                              "train the model again or copy its whole folder again$") as raised:
            BiEncoder.load(folder)
        assert "\n" not in str(raised.value)
    pretrained = tmp_path / "pretrained"  # a backbone that is no tqc model: copied or downloaded again, not trained
    shutil.copytree(tiny_model_dir, pretrained)
    (pretrained / "model.safetensors").write_bytes((pretrained / "model.safetensors").read_bytes()[:100])
    with pytest.raises(ConfigError, match=f"^{pretrained / 'model.safetensors'}: damaged, .*; copy or download the model again$"):
        TextEncoder.from_pretrained(str(pretrained))
    assert BiEncoder.load(tmp_path / "whole").similarity == "mlp"  # the undamaged folder loads


def test_each_training_stage_says_once_which_standard_questions_it_cuts_at_max_length(tiny_model_dir, caplog):
    """A standard question over model.max_length tokens was cut in training, mining, evaluate and serving without a
    word. Stage one and stage two now say it once each, before their first step, by count and class; one of exactly
    max_length tokens is not cut, so not said."""
    from tqc.config import StageTwoParams
    from tqc.stages import stage_two

    torch.manual_seed(0)
    texts = {"LOC": "where is the place where is the place where",  # [CLS], nine words, [SEP]: 11 tokens, over 8
             "HUM": "who is the person who is",  # 8 tokens: exactly model.max_length, so not cut
             "NUM": CLASSES["NUM"][0]}
    catalog = Catalog([StandardQuestion(c, t) for c, t in texts.items()])
    rows = [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 4)]
    model = tiny_bi_encoder(tiny_model_dir, max_length=8)
    assert model.standard.overlong(catalog.texts) == [0]
    expected = ("1 standard question(s) longer than model.max_length (8 tokens) are cut to their first 8 tokens, in "
                "training and wherever the model matches them: class(es) 'LOC'; shorten them or raise model.max_length")
    with caplog.at_level("WARNING", logger="tqc.training"):
        stage_one.train(model, rows, rows, catalog, StageOneParams(epochs=1, batch_size=8, max_steps=2), seed=0)
        negatives = torch.as_tensor([[(catalog.index(q.class_id) + 1) % 3] for q in rows])  # (N, 1) a wrong class each
        stage_two.train(model, rows, negatives, rows, catalog, StageTwoParams(epochs=1, batch_size=8, max_steps=2), seed=0)
    assert [r.getMessage() for r in caplog.records if "standard question(s)" in r.getMessage()] == [expected, expected]


def test_the_cut_standard_questions_are_said_by_rank_0_alone(tiny_model_dir, caplog, monkeypatch):
    """Under a launch every rank built its validator and logged the same warning."""
    from tqc.training import warn_cut_standards

    catalog = Catalog([StandardQuestion("LOC", "where is the place where is the place where"),  # 11 tokens, over 8
                       StandardQuestion("NUM", CLASSES["NUM"][0])])
    model = tiny_bi_encoder(tiny_model_dir, max_length=8)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with caplog.at_level("WARNING", logger="tqc.training"):
        monkeypatch.setenv("RANK", "1")
        warn_cut_standards(model, catalog)
        assert "standard question(s)" not in caplog.text
        monkeypatch.setenv("RANK", "0")
        warn_cut_standards(model, catalog)
    assert "1 standard question(s) longer than model.max_length (8 tokens)" in caplog.text


def test_a_long_question_is_tokenized_only_as_far_as_max_length_reads_and_encodes_as_it_did_whole(tiny_model_dir,
                                                                                                monkeypatch):
    """A fast tokenizer tokenizes a text whole before it truncates: a 5 MB question took 12 s and 700 MB each of the
    two times `tqc predict` tokenized it. Cut before a space past what max_length reads, it gives the same tokens; a
    text whose start holds too few tokens (zero-width spaces) is still tokenized whole."""
    import random

    from tqc.model import encoder as encoder_module
    from tests.conftest import tiny_vocabulary

    rng = random.Random(0)
    words = tiny_vocabulary()[5:] + ["Paris,", "café", "naïve", "e\u0301", "東京", "x" * 150, "\u200b", "\tzz", "don't"]
    long = " ".join(rng.choice(words) + " " * rng.randint(0, 2) for _ in range(40_000))
    sparse = "\u200b " * 20_000 + long[:2_000]  # its first 6,272 characters (the budget) give no token
    texts = [long, "where is paris", sparse]
    model = TextEncoder.from_pretrained(str(tiny_model_dir), max_length=48).eval()
    # no cut: each text tokenized whole, as before
    monkeypatch.setattr(encoder_module, "READ_CHARS_PER_TOKEN", 10 ** 9, raising=False)
    whole = model.tokenize(texts), model.overlong(texts), model.encode(texts)
    monkeypatch.undo()

    tokenizer_class, seen = type(model.tokenizer), []
    real = tokenizer_class.__call__

    def recording(self, text, *args, **kwargs):
        seen.extend([text] if isinstance(text, str) else text)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(tokenizer_class, "__call__", recording)
    cut = model.tokenize(texts), model.overlong(texts), model.encode(texts)
    assert {key: value.tolist() for key, value in cut[0].items()} == {key: value.tolist() for key, value in whole[0].items()}
    assert cut[1] == whole[1] == [0, 2]
    assert torch.equal(cut[2], whole[2])
    # each text stripped first, as the readers strip
    assert long.strip() not in seen and max(len(text) for text in seen if text != sparse.strip()) < 128 * 49
    assert sparse.strip() in seen  # tokenized whole


def test_within_each_warning_once_a_cut_warning_is_said_once_and_another_max_length_again(tiny_model_dir, caplog):
    """tune's trials (and evaluate's seeds) train in one process, and said the same warning twice a training chain:
    within `each_warning_once` it is said once, another max_length (which cuts other classes) is said too, and
    outside the block every call says it."""
    from tqc.training import warn_cut_standards
    from tqc.warn_once import each_warning_once

    catalog = Catalog([StandardQuestion("LOC", "where is the place where is the place where"),  # 11 tokens
                       StandardQuestion("HUM", "who is the person who is"),  # 8 tokens
                       StandardQuestion("NUM", CLASSES["NUM"][0])])
    with caplog.at_level("WARNING", logger="tqc.training"):
        with each_warning_once():
            for max_length in (8, 8, 10, 8):
                warn_cut_standards(tiny_bi_encoder(tiny_model_dir, max_length=max_length), catalog)
        warn_cut_standards(tiny_bi_encoder(tiny_model_dir, max_length=8), catalog)
    assert [r.getMessage()[:64] for r in caplog.records] == [
        "1 standard question(s) longer than model.max_length (8 tokens) a",
        "1 standard question(s) longer than model.max_length (10 tokens) ",
        "1 standard question(s) longer than model.max_length (8 tokens) a"]


def test_overlong_tokenizes_a_long_list_in_chunks_and_names_positions_in_the_whole_list(tiny_model_dir, monkeypatch):
    """`tqc predict --file` asks of the whole file at once: tokenized in one call, a fast tokenizer's encodings of
    300,000 lines held 1.2 GB more before the first answer. Chunks give the same positions."""
    from tqc.model import encoder as encoder_module

    model = TextEncoder.from_pretrained(str(tiny_model_dir), max_length=8)
    long = "where is the place where is the place where"  # 11 tokens, over 8
    texts = ["where is paris", long, "who is it", "who is", long, "what"]
    real, sizes = model.tokenizer, []

    def counting(batch, **kwargs):
        sizes.append(len(batch))
        return real(batch, **kwargs)

    monkeypatch.setattr(encoder_module, "OVERLONG_CHUNK", 4, raising=False)
    monkeypatch.setattr(model, "tokenizer", counting)
    assert model.overlong(texts) == [1, 4]
    assert sizes == [4, 2]
    assert model.overlong([]) == [] and sizes == [4, 2]  # no text, no call


def _byte_level_bpe():
    """A byte-level BPE of single characters (GPT-2's and RoBERTa's kind: a space is part of a token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for character in [chr(i) for i in range(33, 127)] + ["Ġ"]:
        vocab.setdefault(character, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    return tokenizer, len(vocab)


@pytest.fixture
def tiny_gpt2(tmp_path):
    from transformers import GPT2Config, GPT2Model, PreTrainedTokenizerFast

    tokenizer, size = _byte_level_bpe()
    GPT2Model(GPT2Config(vocab_size=size, n_embd=32, n_layer=2, n_head=2, n_positions=64)).save_pretrained(tmp_path / "gpt2")
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",  # no pad token, as GPT-2's
                            unk_token="<unk>").save_pretrained(tmp_path / "gpt2")
    return tmp_path / "gpt2"


def test_a_gpt2_style_backbone_with_no_pad_token_pads_with_its_end_token_and_round_trips(tiny_gpt2, tmp_path):
    """It loaded, then the first batch failed with transformers' "Asking to pad but the tokenizer does not have a
    padding token", naming neither folder nor setting."""
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_gpt2)))
    questions = ["where is paris", "who invented the game of chess in india"]
    together = model.question.encode(questions)  # (2, D): the shorter one padded
    alone = torch.cat([model.question.encode([question]) for question in questions])
    assert torch.allclose(together, alone, atol=1e-5)  # the padding is masked out
    model.save(tmp_path / "saved")
    assert torch.equal(BiEncoder.load(tmp_path / "saved").question.encode(questions), together)


def test_spaces_around_a_question_do_not_change_its_vector_under_a_byte_level_tokenizer(tiny_gpt2):
    """The readers strip every training text; a question served over REST was encoded with its spaces, which a
    byte-level BPE reads as tokens: another vector, and at times another answer than `tqc predict` gave."""
    encoder = TextEncoder.from_pretrained(str(tiny_gpt2))
    assert torch.equal(encoder.encode(["  where is paris \n"]), encoder.encode(["where is paris"]))


def test_an_encoder_decoder_backbone_is_loaded_as_its_encoder_alone(tmp_path):
    """AutoModel built T5's whole encoder-decoder, whose decoder had no input: the first batch failed with "You must
    specify exactly one of input_ids or inputs_embeds". Saved and loaded again, it stays the encoder."""
    from transformers import PreTrainedTokenizerFast, T5Config, T5Model

    tokenizer, size = _byte_level_bpe()
    T5Model(T5Config(vocab_size=size, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, pad_token_id=1,
                     decoder_start_token_id=1)).save_pretrained(tmp_path / "t5")
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(tmp_path / "t5")
    model = BiEncoder.from_params(ModelParams(pretrained=str(tmp_path / "t5")))
    assert model.question.readable_tokens() is None  # relative positions: any length
    vectors = model.question.encode(["where is paris", "who invented chess"])  # (2, D)
    assert vectors.shape == (2, 32)
    model.save(tmp_path / "saved")
    assert torch.equal(BiEncoder.load(tmp_path / "saved").question.encode(["where is paris", "who invented chess"]), vectors)


@pytest.mark.parametrize("shared_standard", [False, True])
def test_stage_one_says_how_many_batches_had_no_in_batch_negative(tiny_model_dir, caplog, shared_standard):
    """A batch of one class (or of classes sharing one standard question, masked as twins) gives every question no
    negative: the main loss is 0 with no gradient, and the stage trained nothing on it. It says how many, and
    says nothing where every batch had one."""
    import logging

    texts = {"LOC": "Where is the place?", "HUM": "Where is the place?" if shared_standard else "Who is the person?",
             "NUM": "How many are there?"}
    catalog = Catalog([StandardQuestion(c, t) for c, t in texts.items()])
    rows = [LabeledQuestion(t, c) for t, c in synthetic_questions(0, 8)]
    narrow = [q for q in rows if q.class_id in ({"LOC", "HUM"} if shared_standard else {"LOC"})]
    params = StageOneParams(epochs=2, batch_size=4, max_steps=2)
    with caplog.at_level(logging.WARNING, logger="tqc.stages.stage_one"):
        stage_one.train(tiny_bi_encoder(tiny_model_dir), narrow, rows[:6], catalog, params, seed=0)
    assert ("stage one: 4 of its 4 batches had no negative for any question (one class, or classes sharing one "
            "standard question), so the main loss trained nothing on them") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tqc.stages.stage_one"):
        stage_one.train(tiny_bi_encoder(tiny_model_dir), rows, rows[:6], catalog,
                        params.model_copy(update={"negatives": "all_classes"}), seed=0)
    assert "had no negative" not in caplog.text
