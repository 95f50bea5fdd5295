"""The exemplar rule's labeled questions, encoded: read from the vectors registered with a version or from a cache
folder (`tqc predict --exemplar-cache`) when the same weights encoded the same questions with the same code before,
else encoded, and kept. Only the `EXEMPLAR_CACHE_ENTRIES` used last stay in a cache folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

def exemplar_bank(model, model_digest: dict | None, catalog, exemplars_file: str | None, config: dict,
                   cache_dir: Path | None, shipped: str | None = None):
    """The exemplar rule's encoded labeled questions (None: the standard-question rule); `model_digest`: the loaded
    weights' folder digest, the cache's key (None: encoded, not cached); `shipped`: the vectors registered with the
    version, if any."""
    if exemplars_file is None:
        return None
    from tqc.exemplars import ExemplarBank, catalog_indices, load_exemplars

    rows = load_exemplars(Path(exemplars_file))  # a registered version reads its own copy of the file
    classes = catalog_indices(rows, catalog, exemplars_file)  # (M,) before encoding: a bad class costs no encode
    vectors = encoded_exemplars(model, rows, model_digest, Path(exemplars_file), cache_dir,
                                 Path(shipped) if shipped else None)  # (M, D)
    return ExemplarBank(vectors, classes, len(catalog), int(config["exemplar_k"]))


def encoded_exemplars(model, rows, model_digest: dict | None, exemplars_file: Path, cache_dir: Path | None,
                       shipped: Path | None = None, key: tuple[str, str] | None = None):
    """(M, D) question-encoder vectors of `rows`; with `model_digest`, read from `shipped` (the entry registered
    with a version, never written to) or `cache_dir` when this model folder encoded these very questions before,
    else encoded, and written to `cache_dir` when there is one. `key`: their `cache_key`, where the caller has it
    already (it hashes every question).

    The key is the sha256 of the model folder and of the questions `rows` holds, not of the file: a file
    appended to after `rows` were read would otherwise key the old rows' vectors under its new content. A new
    entry replaces the one this model made of the same file before, so the folder keeps one per model and file, and
    only the `EXEMPLAR_CACHE_ENTRIES` used last: each retrain is a new model, whose entries would otherwise pile up
    (TREC-50's rows take 7.7 MB an entry)."""
    if model_digest is None:
        return _encode_exemplars(model, rows)
    slot, entry = key or cache_key(model_digest, rows, exemplars_file)
    vectors = _registered_entry(shipped, entry, model, rows)
    if vectors is not None:
        return vectors
    if cache_dir is None:
        return _encode_exemplars(model, rows)
    path = Path(cache_dir) / f"{slot}-{entry}.safetensors"
    vectors = _whole_entry(path, model, rows) if path.exists() else None
    if vectors is not None:
        _touch(path)  # used: kept over entries used longer ago
        return vectors
    vectors = _encode_exemplars(model, rows)
    _write_entry(cache_dir, path, slot, vectors)
    return vectors


def _encode_exemplars(model, rows):
    return model.question.encode([q.text for q in rows], description="encoding exemplars")  # (M, D)


def _registered_entry(shipped: Path | None, entry: str, model, rows):
    """The (M, D) vectors registered with a version under `entry`'s key, or None: none registered, or damaged (said)."""
    if shipped is None:
        return None
    # The registered entry's slot named the file where it was registered; a version's rows are its own copy, so
    # the entry's key alone says they are the same questions encoded by the same weights and code
    registered = sorted(shipped.glob(f"*-{entry}.safetensors")) if shipped.is_dir() else []
    vectors = _whole_entry(registered[0], model, rows) if registered else None
    if vectors is None:  # another torch or transformers where it is served, say: said, since it costs the load time
        log.info("%s: no registered vectors for these weights, rows and encoding code; the "
                                         "exemplars are encoded", shipped)
    return vectors


def _whole_entry(path: Path, model, rows):
    """The entry's (M, D) vectors, or None where it is damaged or does not fit `rows` and `model` (encoded again, and
    replaced in a cache)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        vectors = load_file(path)["vectors"]
    except (SafetensorError, KeyError, OSError):
        return None
    whole = (vectors.ndim == 2 and vectors.shape == (len(rows), model.question.hidden_size)
             and vectors.dtype == torch.float32 and bool(torch.isfinite(vectors).all()))
    return vectors if whole else None


def _write_entry(cache_dir: Path, path: Path, slot: str, vectors) -> None:
    """`vectors` (M, D) written to the cache as its entry `path`, atomically, in place of the one `slot` held before;
    then only the `EXEMPLAR_CACHE_ENTRIES` used last are kept."""
    from safetensors.torch import save_file

    from tqc.io import atomic_path

    try:
        with atomic_path(path) as tmp:
            save_file({"vectors": vectors.contiguous()}, str(tmp))
        for older in _cache_entries(Path(cache_dir)):
            if older.name.startswith(f"{slot}-") and older != path:
                older.unlink(missing_ok=True)
        _keep_the_last_used(Path(cache_dir), EXEMPLAR_CACHE_ENTRIES)
    except OSError as exc:  # a cache that cannot be written (read-only home, full disk) costs time, never the answers
        log.warning("exemplar cache %s not written (%s): the questions are encoded again next time; "
                                            "--exemplar-cache none skips the cache", cache_dir, exc)


def cache_key(model_digest: dict, rows, exemplars_file: Path) -> tuple[str, str]:
    """(slot, entry) of `rows` encoded by the weights of `model_digest`: an entry is `{slot}-{entry}.safetensors`. The
    slot names the model and file, so that a new entry replaces the one it made of the file before; the entry names
    the weights, the questions themselves and the code that encodes them."""
    entry = json_sha256({"model": model_digest, "questions": [q.text for q in rows], "code": encoding_code()})
    return json_sha256({"model": model_digest, "file": str(Path(exemplars_file).resolve())})[:16], entry


EXEMPLAR_CACHE_ENTRIES = 16  # models × exemplar files whose vectors `tqc predict` keeps, the ones used last


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:  # a read-only cache still serves; it only forgets what was used last
        pass


def _keep_the_last_used(cache_dir: Path, kept: int) -> None:
    """Deletes all but the `kept` entries used (written or read) last. Another process may delete one first."""
    def last_used(entry: Path) -> float:
        try:
            return entry.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    for stale in sorted(_cache_entries(cache_dir), key=last_used, reverse=True)[kept:]:
        stale.unlink(missing_ok=True)


CACHE_ENTRY = re.compile(r"[0-9a-f]{16}-[0-9a-f]{64}\.safetensors")  # slot-entry, as `encoded_exemplars` names them


def _cache_entries(cache_dir: Path) -> list[Path]:
    """The cache's own entries: a folder given as --exemplar-cache may hold other .safetensors files, never touched."""
    return [path for path in cache_dir.glob("*.safetensors") if CACHE_ENTRY.fullmatch(path.name)]


def encoding_code() -> dict[str, str]:
    """What turns a question into a vector besides the weights: tqc's encoder and the libraries under it (tokenizers
    too, whose releases transformers takes a range of). Vectors cached by another version of them (a pooling fix, say)
    are encoded again, not served."""
    import hashlib

    import tokenizers
    import torch
    import transformers

    from tqc.model import encoder

    return {"encoder": hashlib.sha256(Path(encoder.__file__).read_bytes()).hexdigest(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def json_sha256(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
