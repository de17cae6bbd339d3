"""Reading a worker's rows from a file (``.npz``, parquet, CSV) and the files' metadata.

The worker-side readers (``_read_npz_shard``, ``_read_parquet_shard``, ``_read_csv_shard``)
run as tasks on the workers, module level so that they pickle by reference: each opens the
file itself and keeps only its own rows, streaming through it so that a worker never holds
more than its shard plus one chunk (parquet: one row group; CSV: ``csv_chunksize`` rows;
npz: about 16 MB of the member). The metadata readers (``_npz_meta``, ``_parquet_meta``,
``_csv_meta``) run on the driver and read headers and row counts only. No Dask here: the
tasks are submitted by :func:`hmdspt.parallel.shards.stage`.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from hmdspt.core.shard import Shard, _as_features, _shard_ids, _sorted_order, _unsort

__all__ = ["NPZ_KEY_PAIRS"]


#: (X key, y key) pairs tried in order when an ``.npz`` file's keys are not given.
NPZ_KEY_PAIRS = (("X", "y"), ("X_train", "y_train"), ("x", "y"), ("data", "target"))
_CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.xz", ".csv.zst")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_ACCEPTED = (".npz", *_PARQUET_SUFFIXES, *_CSV_SUFFIXES, "a directory of parquet files")
# Bytes of an .npz member decompressed at a time by a worker (bounds its extra memory).
_NPZ_CHUNK_BYTES = 16 * 2**20


def _suffix_kind(path: str) -> str:
    if os.path.isdir(path):
        return "parquet"
    low = path.lower()
    if low.endswith(".npz"):
        return "npz"
    if low.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    if low.endswith(_CSV_SUFFIXES):
        return "csv"
    raise ValueError(f"cannot stage {path!r}: unknown file type; accepted: {', '.join(_ACCEPTED)}")


def _check_numeric(kinds: Mapping[str, bool], where: str) -> None:
    bad = [name for name, ok in kinds.items() if not ok]
    if bad:
        raise TypeError(
            f"{where}: feature columns must be numeric, but {bad} are not; name the label "
            "column with target= or encode these columns first"
        )


def _is_numeric_dtype(dtype: Any) -> bool:
    return pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)


# --------------------------------------------------------------------------------------
# Worker-side readers (module level so tasks pickle by reference)
# --------------------------------------------------------------------------------------


def _npz_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """Read an ``.npy`` header from a stream; None when the format version is unknown."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)
    return None


def _npz_rows(
    path: str,
    key: str,
    sorted_ids: np.ndarray,
    n_rows: int,
    order: np.ndarray | None = None,
    chunk_bytes: int = _NPZ_CHUNK_BYTES,
) -> np.ndarray:
    """Rows ``sorted_ids`` (ascending) of member ``key`` of an ``.npz``, streamed.

    Row ``sorted_ids[i]`` lands at ``out[order[i]]`` (at ``out[i]`` when ``order`` is
    None), so the rows come out in shard order without a second copy.

    The member is decompressed chunk by chunk; only the wanted rows are kept. Members
    in Fortran order, with object dtype or an unknown header version fall back to
    loading the whole member on this worker and keeping the wanted rows.
    """
    with zipfile.ZipFile(path) as zf, zf.open(key + ".npy") as f:
        header = _npz_header(f)
        if header is not None:
            shape, fortran, dtype = header
        if header is None or fortran or dtype.hasobject or len(shape) == 0:
            with np.load(path, allow_pickle=False) as npz:
                rows = np.asarray(npz[key])[sorted_ids]
            return rows if order is None else _unsort(rows, order)
        if shape[0] != n_rows:
            raise ValueError(f"{path}: member {key!r} has {shape[0]} rows, expected {n_rows}")
        row_shape = tuple(shape[1:])
        row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize)
        chunk = max(1, chunk_bytes // row_bytes)
        out = np.empty((len(sorted_ids), *row_shape), dtype=dtype)
        done = 0
        for lo in range(0, n_rows, chunk):
            hi = min(n_rows, lo + chunk)
            buf = f.read((hi - lo) * row_bytes)
            if len(buf) != (hi - lo) * row_bytes:
                raise ValueError(f"{path}: member {key!r} is truncated")
            block = np.frombuffer(buf, dtype=dtype).reshape((hi - lo, *row_shape))
            upto = int(np.searchsorted(sorted_ids, hi, side="left"))
            dest = slice(done, upto) if order is None else order[done:upto]
            out[dest] = block[sorted_ids[done:upto] - lo]
            done = upto
        return out


def _read_npz_shard(
    path: str,
    x_key: str,
    y_key: str | None,
    seed: int,
    n_rows: int,
    start: int,
    stop: int,
    dtype: np.dtype,
) -> Shard:
    """Worker side of :func:`~hmdspt.parallel.shards.stage` for ``.npz`` files."""
    ids = _shard_ids(seed, n_rows, start, stop)
    order, sorted_ids = _sorted_order(ids)
    X = _as_features(_npz_rows(path, x_key, sorted_ids, n_rows, order), dtype)
    y = None
    if y_key is not None:
        y = np.ascontiguousarray(_npz_rows(path, y_key, sorted_ids, n_rows, order))
    return Shard(X=X, y=y, row_ids=ids)


def _table_matrix(table: Any, features: Sequence[str], dtype: np.dtype) -> np.ndarray:
    """Numeric columns of a pyarrow table as one C-contiguous ``(n, n_features)`` array."""
    out = np.empty((table.num_rows, len(features)), dtype=dtype)
    for j, name in enumerate(features):
        out[:, j] = table.column(name).to_numpy(zero_copy_only=False)
    return out


def _shard_from_blocks(
    blocks: Iterable[tuple[int, Callable[[np.ndarray], tuple[np.ndarray, Any]]]],
    features: Sequence[str],
    target: str | None,
    seed: int,
    n_rows: int,
    start: int,
    stop: int,
    dtype: np.dtype,
    source: str,
) -> Shard:
    """Assemble this worker's shard from a file read block by block, in file order.

    ``blocks`` yields ``(block_rows, take)`` where ``take(positions)`` returns the
    features and target of those rows of the block; ``take`` is only called for blocks
    holding rows of this shard, so readers may defer the actual read to it.
    """
    ids = _shard_ids(seed, n_rows, start, stop)
    order, sorted_ids = _sorted_order(ids)
    X = np.empty((len(ids), len(features)), dtype=dtype)
    y_parts: list[np.ndarray] = []
    done = 0
    offset = 0
    for block_rows, take in blocks:
        upto = int(np.searchsorted(sorted_ids, offset + block_rows, side="left"))
        if upto > done:
            features_part, target_part = take(sorted_ids[done:upto] - offset)
            # Written straight to shard order: no second full-size copy.
            X[order[done:upto]] = features_part
            if target is not None:
                y_parts.append(target_part)
            done = upto
        offset += block_rows
    if offset != n_rows or done != len(ids):
        raise ValueError(f"{source} changed since staging began: {offset} rows, not {n_rows}")
    y = _unsort(np.concatenate(y_parts), order) if target is not None else None
    return Shard(X=X, y=y, row_ids=ids)


def _read_parquet_shard(
    files: Sequence[str],
    features: Sequence[str],
    target: str | None,
    seed: int,
    n_rows: int,
    start: int,
    stop: int,
    dtype: np.dtype,
) -> Shard:
    """Worker side of :func:`~hmdspt.parallel.shards.stage` for parquet: one row group at a
    time, ``take`` of ids."""
    import pyarrow.parquet as pq

    columns = [*features, target] if target is not None else list(features)

    def row_groups():
        for path in files:
            pf = pq.ParquetFile(path)
            for g in range(pf.num_row_groups):

                def take(positions, pf=pf, g=g):
                    table = pf.read_row_group(g, columns=columns).take(positions)
                    y = None
                    if target is not None:
                        y = table.column(target).to_numpy(zero_copy_only=False)
                    return _table_matrix(table, features, dtype), y

                yield pf.metadata.row_group(g).num_rows, take

    return _shard_from_blocks(
        row_groups(), features, target, seed, n_rows, start, stop, dtype, "parquet data"
    )


def _read_csv_shard(
    path: str,
    features: Sequence[str],
    target: str | None,
    seed: int,
    n_rows: int,
    start: int,
    stop: int,
    dtype: np.dtype,
    chunksize: int,
) -> Shard:
    """Worker side of :func:`~hmdspt.parallel.shards.stage` for CSV: chunked reading, keeping
    only own rows."""
    columns = [*features, target] if target is not None else list(features)

    def chunks():
        reader = pd.read_csv(
            path, usecols=columns, dtype={c: dtype for c in features}, chunksize=chunksize
        )
        with reader:
            for chunk in reader:

                def take(positions, chunk=chunk):
                    part = chunk.iloc[positions]
                    y = part[target].to_numpy() if target is not None else None
                    return part[list(features)].to_numpy(dtype=dtype), y

                yield len(chunk), take

    return _shard_from_blocks(chunks(), features, target, seed, n_rows, start, stop, dtype, path)


# --------------------------------------------------------------------------------------
# Driver side: metadata only
# --------------------------------------------------------------------------------------


def _npz_meta(path: str, x_key: str | None, y_key: str | None) -> dict[str, Any]:
    """Keys, row count and width of an ``.npz``, from the member headers only."""
    with zipfile.ZipFile(path) as zf:
        keys = [n[: -len(".npy")] for n in zf.namelist() if n.endswith(".npy")]
        if x_key is None:
            x_key = next((xk for xk, _ in NPZ_KEY_PAIRS if xk in keys), None)
            if x_key is None:
                raise ValueError(
                    f"{path}: none of the feature keys {[p[0] for p in NPZ_KEY_PAIRS]} found "
                    f"(keys: {keys}); pass x_key="
                )
        elif x_key not in keys:
            raise ValueError(f"{path}: x_key {x_key!r} not found; keys are {keys}")
        if y_key is None:
            guesses = [yk for xk, yk in NPZ_KEY_PAIRS if xk == x_key] + ["y" + x_key[1:]]
            y_key = next((g for g in guesses if g in keys and g != x_key), None)
        elif y_key not in keys:
            raise ValueError(f"{path}: target key {y_key!r} not found; keys are {keys}")
        shapes = {}
        for key in (x_key, y_key):
            if key is None:
                continue
            with zf.open(key + ".npy") as f:
                header = _npz_header(f)
            if header is None:  # unknown header version: let numpy parse this member
                with np.load(path, allow_pickle=False) as npz:
                    shapes[key] = npz[key].shape
            else:
                shapes[key] = header[0]
    x_shape = shapes[x_key]
    if len(x_shape) == 0:
        raise ValueError(f"{path}: {x_key!r} is a scalar, not a data set")
    if y_key is not None and shapes[y_key][:1] != x_shape[:1]:
        raise ValueError(
            f"{path}: {x_key!r} has {x_shape[0]} rows but {y_key!r} has {shapes[y_key][0]}"
        )
    n_features = int(np.prod(x_shape[1:], dtype=np.int64)) if len(x_shape) > 1 else 1
    return {"x_key": x_key, "y_key": y_key, "n_rows": int(x_shape[0]), "n_features": n_features}


def _parquet_meta(path: str, target: str | None) -> dict[str, Any]:
    """Files, row count and feature columns of a parquet file or directory (metadata only)."""
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    dataset = pads.dataset(path, format="parquet")
    files = list(dataset.files)
    if not files:
        raise ValueError(f"{path}: no parquet files found")
    schema = dataset.schema
    columns = list(schema.names)
    if target is not None and target not in columns:
        raise ValueError(f"{path}: target column {target!r} not found; columns are {columns}")
    features = [c for c in columns if c != target]

    def numeric(t: Any) -> bool:
        return (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or pa.types.is_boolean(t)
            or pa.types.is_decimal(t)
        )

    _check_numeric({c: numeric(schema.field(c).type) for c in features}, path)
    n_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return {"files": files, "features": features, "n_rows": n_rows}


def _csv_meta(path: str, target: str | None) -> dict[str, Any]:
    """Columns and row count of a CSV file, read in chunks (never the whole file at once)."""
    peek = pd.read_csv(path, nrows=1000)
    columns = [str(c) for c in peek.columns]
    if target is not None and target not in columns:
        raise ValueError(f"{path}: target column {target!r} not found; columns are {columns}")
    features = [c for c in columns if c != target]
    _check_numeric({c: _is_numeric_dtype(peek[c].dtype) for c in features}, path)
    # CSV has no row count in a header: count by parsing the first column chunk by chunk.
    with pd.read_csv(path, usecols=[0], chunksize=1 << 20) as reader:
        n_rows = sum(len(chunk) for chunk in reader)
    return {"features": features, "n_rows": n_rows}
