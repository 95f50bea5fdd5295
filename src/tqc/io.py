"""Atomic file writes and the JSONL row format every stage exchanges."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from stat import S_ISDIR, S_ISGID, S_ISUID
from typing import Iterable, Iterator

from tqc.errors import InputError


class DataFileError(InputError, ValueError):
    """A file that cannot be read as the data it should hold; the message names the file and the line. An input
    error (`tqc.errors.input_errors`): said in one line, and never retried, since reading again fails the same way."""


class UnreadableJson(DataFileError):
    """A JSON file that is no UTF-8 JSON (`read_json`): the message names the file, `reason` says why alone, for a
    caller that names the file itself with what it should have held."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason

    def __reduce__(self):  # made again from both (a worker process's error pickled to the flow that runs it)
        return type(self), (self.path, self.reason)


def file_digest(path: str | Path, algorithm: str) -> str:
    """Hex digest of a file's bytes, read in blocks (md5 for DVC's hashes, sha256 for checksums)."""
    with Path(path).open("rb") as handle:
        return hashlib.file_digest(handle, algorithm).hexdigest()


def tree_digests(root: str | Path, suffix: str = "") -> dict[str, str]:
    """{path relative to root: sha256} of every file under `root` whose name ends with `suffix`, sorted by path.

    Linked sub-folders are walked (`Path.rglob` does not descend into them), so a model folder that links its
    encoder's folder hashes that encoder too. A link that leads back into the walk's own path (to a folder on the
    way to it or above one, through any number of links) is not followed: that walk would never end."""
    root = Path(root)
    files = {}
    chains = {os.fspath(root): (os.path.realpath(root),)}  # each folder to walk: the real folders on its way from root
    for folder, subfolders, names in os.walk(root, followlinks=True):
        chain = chains.pop(folder)
        subfolders[:] = [name for name in subfolders if _off_the_chain(os.path.join(folder, name), chain, chains)]
        files.update({str(Path(folder, name).relative_to(root)): Path(folder, name) for name in names if name.endswith(suffix)})
    return {relative: file_digest(path, "sha256") for relative, path in sorted(files.items()) if path.is_file()}


def _off_the_chain(folder: str, chain: tuple[str, ...], chains: dict[str, tuple[str, ...]]) -> bool:
    """Whether the walk may enter `folder`: its real path neither is nor holds a folder already on the way to it.
    If it may, its own chain is recorded, for the walk to read when it gets there."""
    real = os.path.realpath(folder)
    if any(os.path.commonpath([real, seen]) == real for seen in chain):
        return False
    chains[folder] = (*chain, real)
    return True


def _umask() -> int:
    """The process umask, read without changing it where Linux says it (threads may be creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)  # elsewhere: set and restore; a file made in between is private, never world-writable
    os.umask(mask)
    return mask


def name_within_limit(folder: str | Path, name: str, spare: int = 0) -> str:
    """`name`, or where its bytes (with `spare` more) would pass `folder`'s limit on one name (NAME_MAX: 255 bytes
    on Linux's file systems) its stem cut short and tagged with a hash of the whole name, the suffix kept. A name
    made from another (an archive's stamp before a delivered file's name) would else fail with ENAMETOOLONG only
    when the file is moved; the tag keeps two long names that share a start apart."""
    limit = _name_max(Path(folder)) - spare
    if len(os.fsencode(name)) <= limit:
        return name
    stem, suffix = os.path.splitext(name)
    if len(os.fsencode(suffix)) > 16:  # no extension, only a dot in a long name
        stem, suffix = name, ""
    tag = "~" + hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
    budget = limit - len(os.fsencode(tag + suffix))
    while stem and len(os.fsencode(stem)) > budget:  # by characters: a cut inside one's UTF-8 bytes is no name
        stem = stem[:-1]
    return stem + tag + suffix


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):  # a folder not made yet, or a system with no such setting
        return 255


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; it replaces `path` only if the block succeeds.

    The new bytes reach the disk (fsync) before the rename and the rename before returning
    (fsync of the folder), so after a power loss `path` holds the old content or the new,
    never an empty file: the retrain's manifest and data commit rely on it.
    """
    path = Path(path)
    if path.is_dir():  # before a temporary file is made beside it, in its parent: the replace would fail only at the end
        raise IsADirectoryError(errno.EISDIR, "a folder, where a file is to be written", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp adds a dot, 8 random characters and .tmp: a target name near the limit would else be unwritable
    fd, tmp = tempfile.mkstemp(prefix=f".{name_within_limit(path.parent, path.name, spare=14)}.", suffix=".tmp",
                               dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    tmp_path.chmod(0o666 & ~_umask())  # mkstemp makes it 0600; the file should read like any other the user writes
    try:
        yield tmp_path
        replaced = _stat_or_none(path)
        if replaced:  # a file rewritten keeps who may read it: a 0600 file of secrets stays 0600, a shared one its group
            _take_mode_and_group(tmp_path, replaced)
        else:
            _readable(tmp_path)  # again: a writer that replaced the file (safetensors' save_file) made it 0600
        _fsync(tmp_path, os.O_RDONLY)
        os.replace(tmp_path, path)
        _fsync(path.parent, _FOLDER)
    finally:
        tmp_path.unlink(missing_ok=True)


def _stat_or_none(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def _take_mode_and_group(path: Path, replaced: os.stat_result) -> None:
    """Give `path` the permission bits and group of the file or folder it replaces: a rename would else put the new
    one's (the umask's, the writer's primary group) in its place, widening a file kept private or taking a shared
    one from its group. A group the writer may not set (not one of its own) is left as made, and given no more than
    others may do: the bits the old file gave its group were not meant for the writer's."""
    mode = replaced.st_mode & 0o7777
    if path.stat().st_gid != replaced.st_gid:
        try:
            os.chown(path, -1, replaced.st_gid)
        except PermissionError:  # the group bits were given to that group, not the writer's: it gets no more than others
            mode &= ~0o070 | (mode & 0o007) << 3
    if not S_ISDIR(replaced.st_mode):  # a folder's setgid (its files take its group) is kept; a file's is not:
        mode &= ~(S_ISUID | S_ISGID)  # the new file is the writer's, and a setuid file replaced would run as it
    path.chmod(mode)  # after the chown, which clears setuid and setgid bits


def _readable(path: Path) -> None:
    """Add the read bits the umask allows: a model, cache entry or report is read by other users of a shared cache,
    registry or server, as any file the user writes would be."""
    mode = path.stat().st_mode & 0o7777
    wanted = mode | (0o444 & ~_umask())
    if wanted != mode:
        path.chmod(wanted)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)


def _fsync_tree(root: Path) -> None:
    """Every file under `root`, then its folder, to disk (deepest folders last: os.walk is top-down, each folder
    is synced after its own files)."""
    for folder, _, files in os.walk(root):
        for name in files:
            _fsync(Path(folder) / name, os.O_RDONLY)
        _fsync(Path(folder), _FOLDER)


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a staging folder beside `path`; it replaces `path` only if the block succeeds,
    so a crash mid-save never leaves a half-written model folder. As in `atomic_path`, the files
    reach the disk before the rename and the rename before returning, so a power loss never
    leaves `path` holding empty weights."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    staging.chmod(0o777 & ~_umask())  # mkdtemp makes it 0700: shared caches, registries and servers must read it
    try:
        yield staging
        for folder, _, files in os.walk(staging):  # save_pretrained's model.safetensors comes out 0600
            for name in files:
                _readable(Path(folder) / name)
        replaced = _stat_or_none(path)
        if replaced:  # as atomic_path: the folder keeps its mode and group
            _take_mode_and_group(staging, replaced)
        _fsync_tree(staging)
        # Rename the old folder aside, the new one in, then delete the old: a crash or a failed delete
        # leaves the old model beside `path` (`.name.….old`), never neither model.
        retired = path.with_name(f"{staging.name}.old") if path.exists() else None
        if retired:
            path.rename(retired)
        try:
            staging.rename(path)
        except BaseException:
            if retired:  # the new model could not take its place: the old one goes back to it
                retired.rename(path)
            raise
        _fsync(path.parent, _FOLDER)
        if retired:
            shutil.rmtree(retired, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj) -> None:
    # Insertion order is kept (no sort_keys): writers build dicts in a fixed, readable order.
    write_text(path, json.dumps(finite(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n")


def finite(value):
    """`value` with every NaN or infinite float as None (JSON's null): Python writes them as `NaN` and `Infinity`,
    which no JSON parser but Python's reads (a warm-up curve's epoch 0 loss, before any step, is NaN), and DVC's
    metrics files are read by other tools too."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def read_json(path: str | Path):
    """A JSON file's value; UnreadableJson naming the file where it is no UTF-8 JSON (a BOM is taken, as an editor
    on Windows writes it). json's own errors named neither file nor, for a BOM, what to do."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise UnreadableJson(path, f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise UnreadableJson(path, f"not valid JSON ({exc})") from None


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    count = 0
    with atomic_path(path) as tmp:
        with tmp.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
    return count


def read_jsonl(path: str | Path) -> list[dict]:
    return [record for _, record in numbered_jsonl(path)]


def numbered_jsonl(path: str | Path) -> list[tuple[int, object]]:
    """(line number, record) of every non-blank line, so callers can name the line of a record they
    refuse; a line that is not JSON, or not UTF-8, is an error naming the file and the line."""
    path = Path(path)
    records = []
    try:
        with path.open(encoding="utf-8-sig") as f:  # -sig: a BOM (Notepad's UTF-8) is not part of the first record
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    records.append((line_number, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise DataFileError(f"{path}, line {line_number}: not valid JSON: {exc}") from None
    except UnicodeDecodeError:  # a text-mode read decodes in chunks, so its error's position is within a chunk
        utf8_text(path.read_bytes(), str(path))  # raises, naming the line
        raise
    return records


def utf8_text(data: bytes, name: str) -> str:
    """`data` as UTF-8 text, or a ValueError naming `name`, and the line and byte of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataFileError(f"{name}, line {line}: not UTF-8 text ({exc.reason}, byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start})") from None