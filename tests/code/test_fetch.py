"""`tqc fetch`'s errors: each names the file on disk it concerns, as well as the URL."""

from __future__ import annotations

import hashlib
import io

import pytest

from tqc.fetch import ChecksumMismatch, RemoteFile, fetch


def test_a_checksum_mismatch_names_the_local_file_and_the_url_in_one_line(tmp_path):
    """It named the URL alone: which file on disk to delete or fetch again was left to guess."""
    files = [RemoteFile("trec/x.label", "https://example.invalid/x", hashlib.sha256(b"good").hexdigest())]
    with pytest.raises(ChecksumMismatch) as raised:
        fetch(tmp_path, files, opener=lambda url, timeout: io.BytesIO(b"changed"))
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'trec/x.label'}: ") and "https://example.invalid/x" in message
    assert hashlib.sha256(b"changed").hexdigest() in message and "\n" not in message
    assert not (tmp_path / "trec/x.label").exists()  # as the message says: nothing written in its place


def test_a_checksum_mismatch_says_whether_a_file_was_kept_or_nothing_written(tmp_path):
    """It said '… was not replaced' where no file was there to replace."""
    files = [RemoteFile("trec/x.label", "https://example.invalid/x", hashlib.sha256(b"good").hexdigest())]
    changed = lambda url, timeout: io.BytesIO(b"changed")  # noqa: E731
    with pytest.raises(ChecksumMismatch, match=r"; nothing was written$"):
        fetch(tmp_path, files, opener=changed)
    (tmp_path / "trec/x.label").write_bytes(b"stale")  # a file of another checksum, fetched again
    with pytest.raises(ChecksumMismatch, match=r"x\.label was not replaced$"):
        fetch(tmp_path, files, opener=changed)
    assert (tmp_path / "trec/x.label").read_bytes() == b"stale"
