"""The CUDA paths (marker `gpu`): skipped where no GPU is present, run with `pytest -m gpu` on a GPU machine.

The code has no CUDA fork (`tqc.device` picks the device and bf16 autocast), so these check that
the same stage functions train, mine, score and save on a GPU: weights stay float32 under
autocast, a model trained on the GPU scores alike on the CPU, and FAISS's GPU index (faiss-gpu,
the `gpu` extra) ranks as the CPU index does. They build on the tiny random BERT and write the
pipeline's data files directly, so they need neither DVC nor Great Expectations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import CLASSES, synthetic_questions, tiny_params
from tqc.config import AugmentParams, ModelParams, Params, StageOneParams, StageTwoParams
from tqc.device import autocast, pick_device
from tqc.mining import build_index, mine, retrieve
from tqc.model.encoder import BiEncoder, catalog_scores
from tqc.schema import Catalog, LabeledQuestion, StandardQuestion, gold_indices, save_questions
from tqc.stages import stage_one, stage_two

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CATALOG = Catalog([StandardQuestion(c, s) for c, (s, _) in CLASSES.items()])


def _rows(seed: int, per_class: int) -> list[LabeledQuestion]:
    return [LabeledQuestion(t, c) for t, c in synthetic_questions(seed, per_class)]


def _float_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}


def test_the_device_is_the_gpu_and_autocast_runs_matmuls_in_bf16():
    device = pick_device()
    assert device.type == "cuda"
    a, b = torch.randn(8, 8, device=device), torch.randn(8, 8, device=device)
    with autocast(device):
        assert (a @ b).dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32  # outside the context: float32 again


@pytest.mark.parametrize("similarity", ["cosine", "mlp"])
def test_both_stages_train_on_the_gpu_keep_float32_weights_and_score_alike_on_the_cpu(tiny_model_dir, tmp_path, similarity):
    torch.manual_seed(0)
    train, validation = _rows(0, 16), _rows(1, 4)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir), similarity=similarity)).to(pick_device())
    before = _float_weights(model)
    one = stage_one.train(model, train, validation, CATALOG,
                          StageOneParams(epochs=2, batch_size=8, learning_rate=1e-3, patience=2), seed=0)
    questions = model.question.encode([q.text for q in train]).numpy()  # (N, D) float32 on the CPU
    assert questions.dtype == np.float32 and np.isfinite(questions).all()
    negatives, stats = mine(questions, model.standard.encode(CATALOG.texts).numpy(), gold_indices(train, CATALOG), 2,
                            model.similarity, model.score)
    assert negatives.shape == (len(train), 2)
    assert not (negatives == gold_indices(train, CATALOG)[:, None]).any()  # gold never mined, on the GPU's vectors too
    two = stage_two.train(model, train, torch.as_tensor(negatives), validation, CATALOG,
                          StageTwoParams(epochs=1, batch_size=8, learning_rate=1e-3, patience=1), seed=0)

    after = _float_weights(model)
    assert all(v.dtype == torch.float32 and v.device.type == "cuda" for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in after)  # it trained
    # epoch 0: before training; stage one ran its 2 epochs (patience 2), stage two its 1
    assert [r.epoch for r in one.history] == [0, 1, 2] and [r.epoch for r in two.history] == [0, 1]
    assert all(np.isfinite(r.train_loss) for r in one.history + two.history if r.epoch > 0)

    model.save(tmp_path / "model")
    on_cpu = BiEncoder.load(tmp_path / "model")
    assert on_cpu.question.device.type == "cpu"
    gpu_scores = catalog_scores(model, validation, CATALOG)  # (N, P): bf16 encoders on the GPU
    cpu_scores = catalog_scores(on_cpu, validation, CATALOG)  # float32 on the CPU
    assert np.abs(gpu_scores - cpu_scores).max() < 0.05  # bf16 has ~3 significant digits
    assert (gpu_scores.argmax(1) == cpu_scores.argmax(1)).mean() >= 0.9


def test_weight_averaging_keeps_its_average_on_the_gpu_and_trains_there(tiny_model_dir):
    from tqc.training import WeightAverage

    layer = torch.nn.Linear(4, 4).to(pick_device())
    start = layer.weight.detach().clone()
    average = WeightAverage(layer, 0.9)
    assert all(a.device.type == "cuda" and a.dtype == torch.float32 for a in average.average)
    with torch.no_grad():
        layer.weight.add_(1.0)
    average.update()  # step 1: the ramp's decay is min(0.9, 2 / 11), so the average moves 9 / 11 of the way
    with average.applied():
        torch.testing.assert_close(layer.weight, start + 9 / 11)
    torch.testing.assert_close(layer.weight, start + 1.0)  # the own weights back after the block

    torch.manual_seed(0)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir))).to(pick_device())
    before = _float_weights(model)
    one = stage_one.train(model, _rows(0, 16), _rows(1, 4), CATALOG,
                          StageOneParams(epochs=2, batch_size=8, learning_rate=1e-3, patience=2, weight_averaging=0.9),
                          seed=0)
    after = _float_weights(model)
    assert all(v.dtype == torch.float32 and v.device.type == "cuda" and torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in after)
    assert [r.epoch for r in one.history] == [0, 1, 2] and all(np.isfinite(r.validation_macro_f1) for r in one.history)


def _gpu_faiss():
    from tqc.mining import FAISS_BUILDS, _installed, load_faiss

    faiss = load_faiss()
    gpu_build = any(_installed(name) for name in FAISS_BUILDS if name != "faiss-cpu")
    if not gpu_build:
        pytest.skip("faiss-cpu is installed, not a GPU build (make run FAISS=gpu)")
    assert hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0, "a GPU build is installed, yet faiss has no GPU"
    return faiss


def test_a_faiss_build_whose_kernels_cannot_run_on_this_gpu_mines_on_the_cpu_index():
    """PyPI's faiss-gpu-cu12 stops at compute capability 8.9: on an H200 its first search aborted the process."""
    from tqc.mining import gpu_index_runs

    _gpu_faiss()
    if gpu_index_runs():
        pytest.skip("this faiss build's GPU index runs on this GPU")
    standards = np.random.default_rng(0).normal(size=(6, 8))  # (P, D)
    assert type(build_index(standards)).__name__ == "IndexFlatIP"
    gold = np.arange(60) % 6
    negatives, _ = mine(standards[gold] + 0.1, standards, gold, 2)
    assert negatives.shape == (60, 2) and not (negatives == gold[:, None]).any()


def test_the_gpu_index_ranks_as_the_cpu_index_does():
    from tqc.mining import gpu_index_runs

    faiss = _gpu_faiss()
    if not gpu_index_runs():
        pytest.skip("this faiss build's GPU index cannot run on this GPU: see the test above")
    rng = np.random.default_rng(0)
    standards, questions = rng.normal(size=(50, 32)), rng.normal(size=(200, 32))  # (P, D), (N, D)
    index = build_index(standards)
    assert "Gpu" in type(index).__name__
    cpu_index = faiss.IndexFlatIP(32)
    normalised = (standards / np.linalg.norm(standards, axis=1, keepdims=True)).astype(np.float32)
    cpu_index.add(normalised)
    gpu_similarities, gpu_neighbours = retrieve(index, questions, 5)
    cpu_similarities, cpu_neighbours = retrieve(cpu_index, questions, 5)
    np.testing.assert_allclose(gpu_similarities, cpu_similarities, atol=1e-4)
    assert (gpu_neighbours == cpu_neighbours).mean() > 0.99  # ties aside


def test_the_chain_trains_every_model_on_the_gpu_and_evaluates(tiny_model_dir, tmp_path):
    """stage one → mine → stage two → NC → prior → evaluate through the functions the DVC stages call."""
    from tqc.pipeline import train_chain
    from tqc.stages import evaluate
    from tqc.stages import prior as prior_stage

    data = tmp_path / "validated"
    CATALOG.save(data / "catalog.jsonl")
    for split, rows in (("train", _rows(0, 12)), ("validation", _rows(1, 4)), ("test", _rows(2, 4))):
        save_questions(data / f"{split}.jsonl", rows)
    params = Params.model_validate(tiny_params(tmp_path / "unused", tiny_model_dir))
    torch.cuda.reset_peak_memory_stats()
    outputs = train_chain(params, data, data / "train.jsonl", tmp_path / "work", seed=0)
    assert torch.cuda.max_memory_allocated() > 0  # the three trainings ran on the GPU, not beside it
    for folder in (outputs.stage_one, outputs.stage_two, outputs.nc):
        assert any(Path(folder).glob("**/*.safetensors")) and not any(Path(folder).glob("**/*.bin"))
    shifts = prior_stage.fit_shifts(data, outputs.stage_one, outputs.stage_two, outputs.nc, params)
    splits = {"test": _rows(2, 4)}
    evaluated = evaluate.evaluate_models(outputs, params, splits, CATALOG, shifts)
    for name in ("admc", "stage_one", "nc", "zero_shot"):
        figures = evaluated["metrics"][name]["test"]
        assert 0.0 <= figures["accuracy"] <= 1.0 and 0.0 <= figures["macro_f1"] <= 1.0


def test_torchrun_is_refused_more_processes_than_this_machine_has_gpus():
    from tqc import distributed
    from tqc.config import ConfigError

    distributed.check_launch("nccl", torch.cuda.device_count())  # one process per GPU: fine
    with pytest.raises(ConfigError, match=f"has {torch.cuda.device_count()} CUDA device"):
        distributed.check_launch("auto", torch.cuda.device_count() + 1)


def test_the_seq2seq_rewriter_generates_on_the_gpu(tmp_path):
    """Paraphrase and back-translation ran on the CPU even on a GPU worker: the model now moves, its inputs with it."""
    from tests.model.test_seq2seq_augment import build_tiny_seq2seq
    from tqc.config import Seq2SeqParams
    from tqc.seq2seq import Rewriter

    folder = build_tiny_seq2seq(tmp_path / "paraphraser", 1)
    rewriter = Rewriter("paraphrase", Seq2SeqParams(paraphrase_model=str(folder), max_new_tokens=8))
    assert rewriter.models[0].model.device.type == "cuda"
    rewritten = rewriter.rewrite(["where is paris", "who wrote the song"], seed=0)
    assert len(rewritten) == 2 and all(isinstance(text, str) for text in rewritten)


MIXED_LENGTHS = ["where is paris", "who invented the tower in the lake", "how many", "where can i find a castle on the island"]


@pytest.mark.parametrize("pooling, padding_side", [("cls", "left"), ("cls", "right"), ("attention", "right"), ("mean", "left")])
def test_every_pooling_encodes_on_the_gpu_as_on_the_cpu(tiny_model_dir, pooling, padding_side):
    """cls indexes each row's first real token with indices made on the states' device; attention pooling's
    learned scorer must move with the encoder. Mixed lengths, so padding sits inside the batch."""
    from tqc.model.encoder import TextEncoder

    torch.manual_seed(0)
    encoder = TextEncoder.from_pretrained(str(tiny_model_dir), pooling, 32)
    encoder.tokenizer.padding_side = padding_side
    if encoder.pooling.attention is not None:  # zero init is mean pooling: give it a scorer that is not
        torch.nn.init.normal_(encoder.pooling.attention.weight)
    on_cpu = encoder.encode(MIXED_LENGTHS)  # (4, D) float32
    on_gpu = encoder.to(pick_device()).encode(MIXED_LENGTHS)  # (4, D): bf16 autocast, back to float32 on the CPU
    assert on_gpu.device.type == "cpu" and on_gpu.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(on_cpu, on_gpu).min() > 0.99


@pytest.mark.parametrize("at", ["input", "output"])
def test_implicit_augmentation_trains_on_the_gpu_at_either_placement(tiny_model_dir, at):
    """Dropout and cutoff under bf16 autocast: the output placement cuts the last hidden states, which are bf16 there."""
    torch.manual_seed(0)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir))).to(pick_device())
    model.set_augmentation(AugmentParams(implicit=["dropout", "cutoff"], rate=0.3, implicit_at=at))
    model.train()
    with autocast(pick_device()):
        augmented = model.embed_questions(MIXED_LENGTHS)  # (4, D)
    assert augmented.device.type == "cuda" and torch.isfinite(augmented).all()
    model.eval()
    with torch.no_grad(), autocast(pick_device()):
        clean = model.embed_questions(MIXED_LENGTHS)  # (4, D): no augmentation outside training
    assert not torch.allclose(augmented.detach().float(), clean.float(), atol=1e-3)
    one = stage_one.train(model, _rows(0, 8), _rows(1, 2), CATALOG,
                          StageOneParams(epochs=1, batch_size=8, learning_rate=1e-3, patience=1), seed=0)
    assert [r.epoch for r in one.history] == [0, 1] and np.isfinite(one.history[1].train_loss)


def test_evaluate_and_prior_score_the_trained_models_on_the_gpu(tiny_model_dir, tmp_path):
    """Evaluate and the prior stage load the saved models onto the device they trained on, not the CPU."""
    from tqc import scoring

    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir)))
    for name in ("one", "two"):
        model.save(tmp_path / name)
    models = scoring.trained_models(tmp_path / "one", tmp_path / "two", None)
    assert {name: next(m.parameters()).device.type for name, m in models.items()} == {"stage_one": "cuda", "admc": "cuda"}
    scores = scoring.scorer_for(models["admc"], 8)(_rows(1, 2), CATALOG)  # (6, P) float32 on the CPU
    assert scores.shape == (6, len(CATALOG.texts)) and np.isfinite(scores).all()


def test_twin_classes_and_cross_encoding_train_on_the_gpu(tiny_model_dir):
    """The twin mask and CEAA's exclusions are built on the CPU and meet the scores on the GPU, in both stages."""
    from tqc.twins import standard_text_groups

    twins = Catalog([StandardQuestion("LOC", "Where is the place?"), StandardQuestion("HUM", "Who is the person?"),
                     StandardQuestion("NUM", "where is the place?")])
    assert standard_text_groups(twins).tolist() == [0, 1, 0]  # LOC and NUM share a text
    torch.manual_seed(0)
    model = BiEncoder.from_params(ModelParams(pretrained=str(tiny_model_dir))).to(pick_device())
    train = _rows(0, 8)
    augment = AugmentParams(cross_encoding={"enabled": True, "share": 0.5})
    one = stage_one.train(model, train, _rows(1, 2), twins, StageOneParams(epochs=1, batch_size=8, learning_rate=1e-3,
                                                                           patience=1), seed=0, augment=augment)
    negatives = torch.tensor([[1] if q.class_id != "HUM" else [0] for q in train])  # (N, 1)
    two = stage_two.train(model, train, negatives, _rows(1, 2), twins,
                          StageTwoParams(epochs=1, batch_size=8, learning_rate=1e-3, patience=1,
                                         negatives="mined_and_in_batch"), seed=0)
    assert [r.epoch for r in one.history] == [r.epoch for r in two.history] == [0, 1]
    assert all(np.isfinite(r.train_loss) for r in one.history + two.history if r.epoch > 0)
