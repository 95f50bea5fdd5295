"""Fetch the public dataset files into a data directory, verified by SHA-256.

Nothing in the pipeline calls this: the pipeline reads `data.data_dir`, which on these
machines already holds the files. Use `tqc fetch --dest DIR` on a machine with network
access to rebuild that folder from the original public repositories.
"""

from __future__ import annotations

import http.client
import logging
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqc.io import atomic_path, file_digest

log = logging.getLogger(__name__)

TREC = "https://raw.githubusercontent.com/tmadhuri/TREC-HindiData/15f8c5b"
COVIDQ = "https://raw.githubusercontent.com/JerryWeiAI/COVID-Q/73dfa47"


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative to the data directory
    url: str
    sha256: str


FILES = [
    RemoteFile("trec/train_5500.label", f"{TREC}/train_5500.label", "514cade7af76429013796abd78a7bfdc8f4b0500dfeb5cf8da3b74f44c424b0d"),
    RemoteFile("trec/TREC_10.label", f"{TREC}/TREC_10.en.label", "edb2e413c306dc9b37defbfeb1706bc332461f2b0d2651ac5c43569c74c89ca9"),
    RemoteFile("covid-q/final_master_dataset.csv", f"{COVIDQ}/data/final_master_dataset.csv", "4de0989656bb3a8a52bc1215ef73e6f498405036c91fcf9d30c61bc704f6f089"),
    RemoteFile("covid-q/categories/train20.csv", f"{COVIDQ}/dataset_categories/train20.csv", "dd5cecc52fdfd1f2f8cbed73051cba4df444a1823928274e99eed45d48c5d053"),
    # the authors' own EDA expansion of train20, for the `authors-eda200` ablation variants
    RemoteFile("covid-q/categories/train20_augmented.csv", f"{COVIDQ}/dataset_categories/train20_augmented.csv", "a85d19bc139918d8567b7c14f032da71b75d64f33c3878b835e06ad71c05d06a"),
    RemoteFile("covid-q/categories/testA.csv", f"{COVIDQ}/dataset_categories/testA.csv", "e38aaccec3bb09fe83851fc259c9857a5de85fa9e356d25b40d2b8952f1c9a91"),
    RemoteFile("covid-q/categories/testB.csv", f"{COVIDQ}/dataset_categories/testB.csv", "be74faa20ac6a98844c7baf414b5057b837786188662fde1066ed3b2c3157c37"),
    RemoteFile("covid-q/classes/train3.csv", f"{COVIDQ}/dataset_classes/train3.csv", "b19f8603d0a54a37a53bea936248665107c0211d509b97b1d02d9b19680df391"),
    RemoteFile("covid-q/classes/train3_augmented.csv", f"{COVIDQ}/dataset_classes/train3_augmented.csv", "0780d2dd8fb0e739922e9be42cad8300a51d81dc2ecd22ac836137cf00b4a19c"),
    RemoteFile("covid-q/classes/testA.csv", f"{COVIDQ}/dataset_classes/testA.csv", "78fd83f0a16c25ced5f7e0f731cb0163a685ad7881e333034cdad1458b73d2e6"),
    RemoteFile("covid-q/classes/testB.csv", f"{COVIDQ}/dataset_classes/testB.csv", "069e5d4b22f5f5aecc0c2426155997d03f1f8b6f602bc68cff7fbd7b47dafbbd"),
]


class ChecksumMismatch(ValueError):
    pass


def sha256_of(path: Path) -> str:
    return file_digest(path, "sha256")


def verify(data_dir: Path, files: list[RemoteFile] = FILES) -> dict[str, bool]:
    """Which expected files are present with the expected checksum; no network."""
    return {f.path: (data_dir / f.path).is_file() and sha256_of(data_dir / f.path) == f.sha256 for f in files}


def fetch(dest: Path, files: list[RemoteFile] = FILES, opener=None, timeout_s: float = 60.0) -> list[Path]:
    """Download each missing or mismatching file; a bad checksum never replaces a good file. A connection silent for
    `timeout_s` is an error, not a `tqc fetch` that waits for ever. `opener`: urllib's urlopen unless given."""
    opener = opener or urllib.request.urlopen
    written = []
    for remote in files:
        target = dest / remote.path
        if target.is_file() and sha256_of(target) == remote.sha256:
            continue
        log.info("fetching %s → %s", remote.url, target)
        with atomic_path(target) as tmp:
            try:
                with opener(remote.url, timeout=timeout_s) as response:
                    tmp.write_bytes(response.read())
            except (OSError, http.client.HTTPException) as exc:  # URLError, HTTPError, a timeout, a body cut short
                # (IncompleteRead): their own text names no file
                raise OSError(f"{remote.url} (for {target}): {exc}") from exc
            if (actual := sha256_of(tmp)) != remote.sha256:
                # the file on disk first: it is what a user deletes or fetches again (left as it was: missing or changed)
                kept = f"{target} was not replaced" if target.is_file() else "nothing was written"
                raise ChecksumMismatch(f"{target}: the download from {remote.url} has SHA-256 {actual}, not the expected "
                                       f"{remote.sha256}; {kept}")
        written.append(target)
    return written
