"""One-line checks, before any work, that a file or a folder can be created at a path.

A run log, a checkpoint folder or a chart below a *file* would otherwise fail only when it is
first written, after the cluster has started, the data has been read or every run compared.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["check_file_path", "check_folder_path", "check_folder_writable"]


def _nearest_existing(path: Path) -> Path | None:
    """``path`` or the nearest of its parents that exists (None if none does)."""
    return next((p for p in (path, *path.parents) if p.exists()), None)


def check_file_path(path: str | os.PathLike, what: str) -> None:
    """Fail with one line, naming ``what``, when a file cannot be created at ``path``.

    Raises
    ------
    ValueError
        When ``path`` is a folder, or the nearest of its parents that exists is a file.

    Examples
    --------
    >>> check_file_path("/etc/passwd/run.jsonl", "run_log")
    Traceback (most recent call last):
    ...
    ValueError: run_log /etc/passwd/run.jsonl: /etc/passwd is a file, not a folder
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path}: it is a folder, not a file")
    _check_parents(path, what)


def check_folder_path(path: str | os.PathLike, what: str) -> None:
    """Fail with one line, naming ``what``, when a folder cannot be created at ``path``.

    Raises
    ------
    ValueError
        When ``path``, or the nearest of its parents that exists, is a file.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path}: it is a file, not a folder")
    _check_parents(path, what)


def check_folder_writable(path: str | os.PathLike, what: str) -> None:
    """Fail with one line, naming ``what``, when files cannot be written in a folder at
    ``path``; nothing is left behind.

    The folders missing on the way are made, a file is written in the last and removed,
    and the folders this made are removed again: only trying tells, for a read-only or
    virtual file system (``/proc``) or a folder the user may not write in.

    Raises
    ------
    ValueError
        When ``path`` or one of its parents is a file, or the folder cannot be made or
        written in.
    """
    path = Path(path)
    check_folder_path(path, what)
    missing = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ValueError(f"{what} {path}: cannot write there ({reason})") from None
    finally:
        for folder in missing:
            try:
                folder.rmdir()
            except OSError:
                pass  # not made here, or no longer empty: not ours to remove


def _check_parents(path: Path, what: str) -> None:
    parent = _nearest_existing(path.parent)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"{what} {path}: {parent} is a file, not a folder")
