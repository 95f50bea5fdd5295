"""Explicit rewrites through local sequence-to-sequence models: paraphrase and back-translation.

Any Hugging Face seq2seq folder (or hub id, where the hub is reachable) works: a T5 or
Pegasus paraphraser for `paraphrase`, a Marian pair such as opus-mt-en-de / opus-mt-de-en for
`backtranslate` (source → pivot → source). Nothing is downloaded unless a hub id is given.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import torch
from tqdm.auto import tqdm

from tqc.config import ConfigError, Seq2SeqParams
from tqc.device import pick_device
from tqc.model.encoder import unloadable

log = logging.getLogger(__name__)


class Seq2SeqModel:
    """One seq2seq checkpoint: texts in, one generated text out per input (sampled, or a beam: see `generate`)."""

    def __init__(self, name: str, params: Seq2SeqParams, prefix: str = "", param: str = "paraphrase_model"):
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name)
            self.model = AutoModelForSeq2SeqLM.from_pretrained(name).eval().to(pick_device())  # a GPU when there is one
        except (OSError, ValueError) as exc:  # ValueError: a folder whose tokenizer files transformers cannot use
            raise unloadable(f"augment.seq2seq.{param}", name, exc) from None
        except ImportError as exc:  # a Marian (opus-mt) tokenizer needs sentencepiece, which tqc does not install
            raise ConfigError(f"augment.seq2seq.{param}: {name!r} needs a package that is not installed ({exc}); "
                              "pip install sentencepiece (Marian and T5 tokenizers) into this environment") from None
        self.name, self.params, self.prefix = name, params, prefix

    @torch.no_grad()
    def generate(self, texts: list[str], seed: int) -> list[str]:
        if not texts:  # every row's earlier step made nothing: a tokenizer refuses an empty batch
            return []
        torch.manual_seed(seed)  # sampling is reproducible per call
        self._say_cut(texts)
        if self.params.sample:
            return self._decoded(texts, 1)
        # Beam search is deterministic, and augment rewrites an original once per extra row it makes from it: every copy
        # would get the same best beam, so the k-th copy of a text gets its k-th distinct beam (cycling through them).
        distinct = list(dict.fromkeys(texts))
        per_text = min(self.params.num_beams, max(Counter(texts).values()))  # 1 (the best beam) where none repeats
        decoded = self._decoded(distinct, per_text)
        beams = {text: list(dict.fromkeys(decoded[i * per_text : (i + 1) * per_text])) for i, text in enumerate(distinct)}
        used: Counter = Counter()
        outputs = []
        for text in texts:
            outputs.append(beams[text][used[text] % len(beams[text])])
            used[text] += 1
        return outputs

    def _decoded(self, texts: list[str], per_text: int) -> list[str]:
        """`per_text` generated texts for each of `texts` (beam search: its best `per_text` beams, best first)."""
        outputs = []
        size = self.params.batch_size
        for start in tqdm(range(0, len(texts), size), desc=f"rewriting with {Path(self.name).name}", leave=False,
                          disable=True if len(texts) <= size else None):  # None: off where stderr is no terminal
            batch = self.tokenizer([self.prefix + t for t in texts[start : start + size]], padding=True, truncation=True,
                                   max_length=self.params.max_input_tokens, return_tensors="pt").to(self.model.device)
            batch.pop("token_type_ids", None)
            generated = self.model.generate(**batch, max_new_tokens=self.params.max_new_tokens, do_sample=self.params.sample,
                                            top_p=self.params.top_p if self.params.sample else None,
                                            num_beams=1 if self.params.sample else self.params.num_beams,
                                            num_return_sequences=per_text)
            outputs += [t.strip() for t in self.tokenizer.batch_decode(generated, skip_special_tokens=True)]
        return outputs

    def _say_cut(self, texts: list[str]) -> None:
        """Warn of inputs longer than `max_input_tokens`: the model rewrites only their beginning."""
        lengths = [len(ids) for ids in self.tokenizer([self.prefix + t for t in texts], truncation=False)["input_ids"]]
        cut = [i for i, length in enumerate(lengths) if length > self.params.max_input_tokens]
        if cut:
            log.warning("%s: %d of %d inputs are longer than augment.seq2seq.max_input_tokens (%d tokens; the longest "
                        "%d) and are cut there, so their rewrites lose their ends; raise max_input_tokens",
                        self.name, len(cut), len(texts), self.params.max_input_tokens, max(lengths[i] for i in cut))


class Rewriter:
    """paraphrase: one model; backtranslate: the forward model, then the backward model."""

    def __init__(self, method: str, params: Seq2SeqParams):
        if method == "paraphrase":
            self.models = [Seq2SeqModel(params.paraphrase_model, params, params.paraphrase_prefix)]
        elif method == "backtranslate":
            self.models = [Seq2SeqModel(params.forward_model, params, param="forward_model"),
                           Seq2SeqModel(params.backward_model, params, param="backward_model")]
        else:
            raise ValueError(f"no seq2seq rewriter for {method!r}")
        self.method = method

    def rewrite(self, texts: list[str], seed: int) -> list[str]:
        """One rewrite per text, "" where a step made nothing: the next model would make a question of nothing (a
        back-translation's backward model from an empty pivot), and the caller keeps the original instead."""
        rewrites, going = list(texts), list(range(len(texts)))  # the indices every step so far rewrote into something
        for model in self.models:
            for i, text in zip(going, model.generate([rewrites[i] for i in going], seed)):
                rewrites[i] = text
            going = [i for i in going if rewrites[i]]
        return rewrites
