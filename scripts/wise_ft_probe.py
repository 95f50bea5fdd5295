"""A probe, no training: do weights between the pretrained encoder and ADMC's rank better than either?

WiSE-FT (Wortsman et al. 2022): θ(α) = (1 − α) · θ_pretrained + α · θ_ADMC, for both encoders, α = 0 the zero-shot
encoder and α = 1 ADMC's (α > 1 goes past it). For one trained workspace, scores every validation and test question by
the standard-question rule (before its class-prior shift) and by the exemplar rule (`evaluate.exemplar_k` nearest
training questions), with the evaluate stage's own scorers. Validation would choose α; test is printed beside it to
see whether that choice carries.

    python scripts/wise_ft_probe.py --workspace . [--alphas 0,0.5,0.8,0.9,1,1.1,1.2] > wise.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from tqc.config import load_params
from tqc.exemplars import exemplar_scorer
from tqc.metrics import summary
from tqc.model.encoder import BiEncoder, TextEncoder, catalog_scores
from tqc.schema import Catalog, gold_indices, load_questions


def interpolated(pretrained: dict[str, torch.Tensor], trained: dict[str, torch.Tensor], alpha: float) -> dict:
    """The trained state with each float weight the pretrained encoder also has moved to (1 − α) · pretrained +
    α · trained: attention pooling's too, which starts at zero, so it is scaled by α. The MLP scorer is outside the
    encoders and stays as trained. θ_pretrained is model.pretrained's, not a warm-up's model where the warm-up ran."""
    return {name: (1 - alpha) * pretrained[name] + alpha * weight
            if name in pretrained and weight.is_floating_point() else weight
            for name, weight in trained.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, default=Path("."))
    parser.add_argument("--alphas", default="0,0.3,0.5,0.6,0.7,0.8,0.9,1,1.1,1.2,1.4")
    args = parser.parse_args()
    params = load_params(args.workspace / "params.yaml")
    data = args.workspace / "data" / "validated"
    catalog = Catalog.load(data / "catalog.jsonl")
    splits = {split: load_questions(data / f"{split}.jsonl") for split in ("validation", "test")}
    exemplars = load_questions(data / "train.jsonl")  # the labeled rows as validated, as evaluate's exemplar rule

    model = BiEncoder.load(args.workspace / "models" / "stage_two").eval()
    pretrained = TextEncoder.from_pretrained(params.model.pretrained, params.model.pooling,
                                             params.model.max_length).state_dict()
    trained = {side: {k: v.clone() for k, v in getattr(model, side).state_dict().items()}
               for side in ("question", "standard")}
    rows = []
    for alpha in (float(a) for a in args.alphas.split(",")):
        for side, state in trained.items():
            getattr(model, side).load_state_dict(interpolated(pretrained, state, alpha))
        row = {"alpha": alpha}
        for split, questions in splits.items():
            gold = gold_indices(questions, catalog)
            standard = summary(catalog_scores(model, questions, catalog, params.evaluate.batch_size), gold)
            nearest = summary(exemplar_scorer(model.question, exemplars, params.evaluate.exemplar_k,
                                              params.evaluate.batch_size)(questions, catalog), gold)
            row[split] = {rule: {"accuracy": figures["accuracy"], "macro_f1": figures["macro_f1"]}
                          for rule, figures in (("standard", standard), ("exemplars", nearest))}
        rows.append(row)
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
