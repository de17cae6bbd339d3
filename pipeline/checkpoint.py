"""Atomic, checksummed checkpoints of a fit (no pickle, no Dask).

A checkpoint is one ``.npz`` file (``numpy.savez``, read back with ``allow_pickle=False``):
every array of the state under its own name, plus two ``uint8`` arrays, ``__meta__`` (the
UTF-8 JSON of the scalars) and ``__sha256__`` (the hex SHA-256 of the payload: every array's
name, dtype, shape and bytes, in name order, then the JSON). Files are named
``ckpt-<seq>.npz`` with a sequence number that only grows, so "newest" is the highest.

Writes are atomic: the file is written to a temporary file in the same folder, flushed and
fsynced, then renamed over its final name with :func:`os.replace` (and the folder is
fsynced), so a reader sees either the whole file or none of it. A file that is damaged
anyway (a disk error, a copy cut short) fails the checksum and is skipped in favour of the
previous good one; only the newest ``keep`` files are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1
META_KEY = "__meta__"
SHA_KEY = "__sha256__"
_NAME = re.compile(r"^ckpt-(\d{8,})\.npz$")
_TMP_PREFIX = ".ckpt-tmp-"


class CheckpointError(ValueError):
    """A checkpoint cannot be used (damaged, or it belongs to another model)."""


@dataclass
class Checkpoint:
    """A checkpoint read back.

    Attributes
    ----------
    arrays : dict of str to ndarray
        The saved arrays.
    meta : dict
        The saved scalars (JSON-native).
    path : pathlib.Path
        The file it was read from.
    """

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def _digest(arrays: Mapping[str, np.ndarray], meta_bytes: bytes) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())
    h.update(meta_bytes)
    return h.hexdigest()


def _files(directory: Path) -> list[tuple[int, Path]]:
    """The checkpoint files of ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the folder's entry is; not possible on Windows.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(
    directory: str | os.PathLike,
    arrays: Mapping[str, np.ndarray],
    meta: Mapping[str, Any],
    *,
    keep: int = 2,
) -> Path:
    """Write a checkpoint atomically and keep only the newest ``keep`` files.

    Parameters
    ----------
    directory : str or path
        Folder of the checkpoints (created if missing).
    arrays : mapping of str to ndarray
        Numeric arrays to save (object arrays are refused: no pickle).
    meta : mapping
        JSON-serialisable scalars (no NaN or infinity).
    keep : int, default=2
        How many checkpoint files to keep, newest first.

    Returns
    -------
    path : pathlib.Path
        The file written.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    payload: dict[str, np.ndarray] = {}
    for name, value in arrays.items():
        if name in (META_KEY, SHA_KEY) or not isinstance(name, str):
            raise ValueError(f"array name {name!r} is reserved or not a string")
        a = np.ascontiguousarray(value)
        if a.dtype.hasobject:
            raise ValueError(f"array {name!r} has dtype object; checkpoints hold no pickles")
        payload[name] = a
    meta_bytes = json.dumps(
        {"format_version": FORMAT_VERSION, **meta}, allow_nan=False, sort_keys=True
    ).encode()
    sha = _digest(payload, meta_bytes)
    payload[META_KEY] = np.frombuffer(meta_bytes, dtype=np.uint8)
    payload[SHA_KEY] = np.frombuffer(sha.encode(), dtype=np.uint8)

    existing = _files(directory)
    seq = existing[-1][0] + 1 if existing else 1
    final = directory / f"ckpt-{seq:08d}.npz"
    # Leftovers of a writer killed mid-write are never read; remove them.
    for stale in directory.glob(_TMP_PREFIX + "*"):
        with contextlib.suppress(OSError):
            stale.unlink()
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    for _, old in _files(directory)[:-keep]:
        with contextlib.suppress(OSError):
            old.unlink()
    return final


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read one checkpoint file and verify its checksum.

    Raises
    ------
    CheckpointError
        If the file is unreadable, incomplete or fails the checksum.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            data = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from exc
    if META_KEY not in data or SHA_KEY not in data:
        raise CheckpointError(f"checkpoint {path} lacks its header or checksum")
    meta_bytes = data.pop(META_KEY).tobytes()
    stored = data.pop(SHA_KEY).tobytes().decode("ascii", errors="replace")
    if _digest(data, meta_bytes) != stored:
        raise CheckpointError(f"checkpoint {path} fails its SHA-256 check (torn or damaged)")
    try:
        meta = json.loads(meta_bytes)
    except ValueError as exc:  # cannot happen with a matching checksum, but be explicit
        raise CheckpointError(f"checkpoint {path} has a bad header: {exc}") from exc
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {meta.get('format_version')}, "
            f"this code reads {FORMAT_VERSION}"
        )
    return Checkpoint(arrays=data, meta=meta, path=path)


def load_latest_checkpoint(directory: str | os.PathLike) -> Checkpoint | None:
    """The newest checkpoint of ``directory`` that passes its checksum, or None.

    Damaged files are skipped with a :class:`RuntimeWarning` naming them; None when the
    folder is missing, empty, or holds no good checkpoint.
    """
    for _, path in reversed(_files(Path(directory))):
        try:
            return read_checkpoint(path)
        except CheckpointError as exc:
            warnings.warn(f"skipping {exc}", RuntimeWarning, stacklevel=2)
    return None


def check_fingerprint(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse to resume into a model of another shape.

    Parameters
    ----------
    saved, current : mapping
        Fingerprints (layer sizes, parameter count, dtype, ...) of the checkpoint and of
        the model about to be trained.

    Raises
    ------
    CheckpointError
        Naming every field that differs.
    """
    diffs = [
        f"{key}: checkpoint has {saved.get(key)!r}, this fit has {current.get(key)!r}"
        for key in sorted(set(saved) | set(current))
        if saved.get(key) != current.get(key)
    ]
    if diffs:
        raise CheckpointError(
            "cannot resume: the checkpoint belongs to a different model ("
            + "; ".join(diffs)
            + "). Use another checkpoint_dir or resume=False."
        )
