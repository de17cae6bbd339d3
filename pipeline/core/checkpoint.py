"""Atomic, checksummed checkpoints of a fit (no pickle, no Dask).

A checkpoint is one ``.npz`` file (a zip of ``.npy`` members, read back with
``allow_pickle=False``): every array of the state under its own name, plus a ``uint8``
array ``__meta__`` holding the UTF-8 JSON of the scalars. The zip's archive comment, the
last bytes of the file, is a fixed-size trailer ``HMDSPT checkpoint 2 sha256:`` followed by
the hex SHA-256 of every byte of the file before those 64 hex digits. The reader checks
that trailer on the raw bytes before anything is parsed, so a damaged file is refused
before numpy, zipfile or json see it. Files are named ``ckpt-<seq>.npz`` with a sequence
number that only grows, so "newest" is the highest.

Writes are atomic: the file is written to a temporary file in the same folder, flushed and
fsynced, then renamed over its final name with :func:`os.replace` (and the folder is
fsynced), so a reader sees either the whole file or none of it. A file that is damaged
anyway (a disk error, a copy cut short) fails the checksum and is skipped in favour of the
previous good one; only the newest ``keep`` files are kept. Files of the previous format
(format 1: no trailer) are refused the same way, as not a checkpoint of this version.

A folder holds one fit's checkpoints at a time: :func:`held_for_one_fit` takes an
exclusive ``flock`` on its ``.hmdspt-fit.lock`` for the fit's duration (the kernel lets it
go when the process dies), so a second fit on the same folder is refused at its start.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tempfile
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hmdspt.core.callers import user_stacklevel

try:
    import fcntl
except ImportError:  # not POSIX: folders are not held (one fit per folder is then the user's)
    fcntl = None

FORMAT_VERSION = 2
META_KEY = "__meta__"
# The zip comment: this tag, then the hex SHA-256 of every byte of the file before the hex.
_TRAILER_TAG = f"HMDSPT checkpoint {FORMAT_VERSION} sha256:".encode()
_HEX_LEN = 64
_TRAILER_LEN = len(_TRAILER_TAG) + _HEX_LEN
_CHUNK = 1 << 20
_NAME = re.compile(r"^ckpt-(\d{8,})\.npz$")
_TMP_PREFIX = ".ckpt-tmp-"


class CheckpointError(ValueError):
    """A checkpoint cannot be used (damaged, or it belongs to another model)."""


LOCK_NAME = ".hmdspt-fit.lock"


@contextlib.contextmanager
def held_for_one_fit(directory: str | os.PathLike, name: str = "checkpoint_dir") -> Iterator[None]:
    """Hold ``directory`` (created if missing) for one fit's checkpoints.

    Fits that wrote into one folder at once (a search on joblib's threading backend) removed
    each other's temporary files as a dead writer's leftovers and took each other's sequence
    numbers: the fits failed with ``FileNotFoundError`` after training, and what a resume
    would take was any of theirs.

    Raises
    ------
    CheckpointError
        Another fit, in this process or another, holds the folder.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK_NAME, "a") as handle:  # closing it lets the lock go
        if fcntl is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CheckpointError(
                    f"{name} {directory}: another fit is writing its checkpoints there; "
                    "give each fit a folder of its own"
                ) from None
            except OSError:  # a file system without locks (some NFS mounts): not held
                pass
        yield


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


def _encode(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The bytes of the checkpoint file: an ``.npz`` ending in its checksum trailer."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, a in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, a, allow_pickle=False)
        zf.comment = _TRAILER_TAG + b"0" * _HEX_LEN  # same length as the real digest
    data = bytearray(buffer.getbuffer())
    if data[-_TRAILER_LEN:-_HEX_LEN] != _TRAILER_TAG:  # zipfile writes the comment last
        raise RuntimeError("zipfile did not end the archive with its comment")
    data[-_HEX_LEN:] = hashlib.sha256(data[:-_HEX_LEN]).hexdigest().encode()
    return bytes(data)


def _verify(fh: io.BufferedReader, path: Path) -> None:
    """Check the trailer of the open file ``fh`` on its raw bytes, before any parsing."""
    size = os.fstat(fh.fileno()).st_size
    if size < _TRAILER_LEN:
        raise CheckpointError(f"checkpoint {path} is too short ({size} bytes) to be one")
    fh.seek(size - _TRAILER_LEN)
    trailer = fh.read(_TRAILER_LEN)
    if trailer[: len(_TRAILER_TAG)] != _TRAILER_TAG:
        raise CheckpointError(
            f"checkpoint {path} is not a checkpoint of format {FORMAT_VERSION} (no checksum "
            "trailer: written by an older version, or damaged)"
        )
    fh.seek(0)
    h = hashlib.sha256()
    remaining = size - _HEX_LEN
    while remaining > 0:
        chunk = fh.read(min(_CHUNK, remaining))
        if not chunk:
            raise CheckpointError(f"checkpoint {path} shrank while it was read")
        h.update(chunk)
        remaining -= len(chunk)
    if h.hexdigest().encode() != trailer[len(_TRAILER_TAG) :]:
        raise CheckpointError(f"checkpoint {path} fails its SHA-256 check (torn or damaged)")


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
        if name == META_KEY or not isinstance(name, str):
            raise ValueError(f"array name {name!r} is reserved or not a string")
        a = np.ascontiguousarray(value)
        if a.dtype.hasobject:
            raise ValueError(f"array {name!r} has dtype object; checkpoints hold no pickles")
        payload[name] = a
    meta_bytes = json.dumps(
        {"format_version": FORMAT_VERSION, **meta}, allow_nan=False, sort_keys=True
    ).encode()
    payload[META_KEY] = np.frombuffer(meta_bytes, dtype=np.uint8)
    data = _encode(payload)

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
            fh.write(data)
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
    """Read one checkpoint file, verifying its checksum before parsing anything.

    Parameters
    ----------
    path : str or path
        A ``ckpt-<seq>.npz`` file written by :func:`save_checkpoint`.

    Returns
    -------
    checkpoint : Checkpoint
        Its arrays and scalars.

    Raises
    ------
    CheckpointError
        If the file is unreadable, incomplete, fails its SHA-256 check, or is not of this
        format version (files of format 1, which had no checksum trailer, are refused this
        way, so :func:`load_latest_checkpoint` skips them). Nothing else escapes: a file
        that passes the checksum but cannot be parsed is a CheckpointError too.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            _verify(fh, path)
            # The same open file is parsed, so it is the bytes just verified.
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as npz:
                data = {name: npz[name] for name in npz.files}
            if META_KEY not in data:
                raise CheckpointError(f"checkpoint {path} lacks its {META_KEY} header")
            meta = json.loads(data.pop(META_KEY).tobytes())
            if not isinstance(meta, dict):
                raise CheckpointError(f"checkpoint {path} has a header that is not an object")
    except CheckpointError:
        raise
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from exc
    except MemoryError:  # not a damaged file: falling back to an older one would be wrong
        raise
    except Exception as exc:  # only a file forged with a matching checksum gets here
        raise CheckpointError(
            f"checkpoint {path} passed its checksum but cannot be parsed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {meta.get('format_version')}, "
            f"this code reads {FORMAT_VERSION}"
        )
    return Checkpoint(arrays=data, meta=meta, path=path)


def load_latest_checkpoint(directory: str | os.PathLike) -> Checkpoint | None:
    """The newest checkpoint of ``directory`` that passes its checksum, or None.

    Files that :func:`read_checkpoint` refuses (damaged, or of an older format) are
    skipped with a :class:`RuntimeWarning` naming them; None when the folder is missing,
    empty, or holds no good checkpoint.
    """
    for _, path in reversed(_files(Path(directory))):
        try:
            return read_checkpoint(path)
        except CheckpointError as exc:
            warnings.warn(f"skipping {exc}", RuntimeWarning, stacklevel=user_stacklevel())
    return None


#: Fingerprint fields added after checkpoints were first written: a checkpoint without one
#: is not refused for it (a classifier's ``classes``, the estimator's ``early_stopping``).
ADDED_KEYS = frozenset({"classes", "early_stopping"})


def model_fingerprint(model: Any, solver: str | None) -> dict[str, Any]:
    """What a checkpoint must match to be resumed into ``model`` (an ``hmdspt.core.nn.MLP``)
    trained by ``solver``; in-process and cluster fits add what tells them apart."""
    return {
        "layer_sizes": [int(s) for s in model.layer_sizes],
        "n_params": int(model.n_params),
        "dtype": model.dtype.name,
        "hidden_activation": model.hidden_activation,
        "out_activation": model.out_activation,
        "solver": solver,
    }


def _difference(key: str, saved: Any, current: Any) -> str:
    if key == "fit":  # only an in-process fit's fingerprint has it ("fit: ... None" before)
        ran = {True: "in-process", False: "on a cluster"}
        return (
            f"the checkpoint's fit ran {ran[saved == 'in-process']}, "
            f"this one runs {ran[current == 'in-process']}"
        )
    return f"{key}: checkpoint has {saved!r}, this fit has {current!r}"


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
        _difference(key, saved.get(key), current.get(key))
        for key in sorted(set(saved) | set(current))
        if saved.get(key) != current.get(key) and (key in saved or key not in ADDED_KEYS)
    ]
    if diffs:
        raise CheckpointError(
            "cannot resume: the checkpoint belongs to a different model ("
            + "; ".join(diffs)
            + "). Use another checkpoint_dir or resume=False."
        )
