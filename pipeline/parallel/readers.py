"""Reading a worker's rows from a file (``.npz``, parquet, CSV) and the files' metadata.

One reading rule for every data file: :data:`SUFFIX_READERS` maps a file's suffix to its
reader, and the metadata readers check what a fit needs (the label column or array, numeric
features, X and y of the same length, rows). :func:`~hmdspt.parallel.shards.stage` reads
each worker's rows by it, and :func:`read_file` (the command line's ``--data``) all rows, so
both give the same errors. One difference, on purpose: staging keeps NaN as it is (it moves
values; data/README.md), where :func:`read_file`, whose rows are trained on at once, refuses
NaN and infinite features naming the first.

The worker-side readers (``_read_npz_shard``, ``_read_parquet_shard``, ``_read_csv_shard``)
run as tasks on the workers, module level so that they pickle by reference: each opens the
file itself and keeps only its own rows, streaming through it so that a worker never holds
more than its shard plus one chunk (parquet: one row group; CSV: ``csv_chunksize`` rows;
npz: about 16 MB of the member). The metadata readers (``_npz_meta``, ``_parquet_meta``,
``_csv_meta``) run on the driver and read headers and row counts only. No Dask here: the
tasks are submitted by :func:`hmdspt.parallel.shards.stage`.
"""

from __future__ import annotations

import glob
import os
import threading
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hmdspt.core.shard import (
    DataError,
    Shard,
    _as_features,
    _shard_ids,
    _sorted_order,
    _unsort,
    as_rows,
    first_non_finite,
)

if TYPE_CHECKING:  # pandas is imported where a file is read: `hmdspt --help` needs none
    import pandas as pd

__all__ = [
    "NPZ_KEY_PAIRS",
    "SUFFIX_READERS",
    "FileData",
    "check_file_source",
    "file_meta",
    "read_file",
    "reader_kind",
    "source_kind",
]


#: (X key, y key) pairs tried in order when an ``.npz`` file's keys are not given.
NPZ_KEY_PAIRS = (("X", "y"), ("X_train", "y_train"), ("x", "y"), ("data", "target"))
#: File suffix -> reader (``"npz"``, ``"parquet"`` or ``"csv"``): the file types a data path
#: may name. A directory is read as a folder of parquet files.
SUFFIX_READERS = {
    ".npz": "npz",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".csv.gz": "csv",
    ".csv.bz2": "csv",
    ".csv.xz": "csv",
    ".csv.zst": "csv",
}
_ACCEPTED = (*SUFFIX_READERS, "a directory of parquet files", "a glob of parquet files")
# Bytes of an .npz member decompressed at a time by a worker (bounds its extra memory).
_NPZ_CHUNK_BYTES = 16 * 2**20
#: Rows of a CSV file in one partition of its data frame (:func:`frame_parts`).
CSV_PART_ROWS = 1_000_000
# Rows of a CSV file parsed at a time by read_file (stage's csv_chunksize default).
_CSV_CHUNK_ROWS = 65_536


def reader_kind(path: str | os.PathLike) -> str:
    """The reader of a data path by :data:`SUFFIX_READERS`.

    A directory is a folder of parquet files, unless named like an ``.npz`` or CSV file
    (whose reader then refuses it as not a file). A glob (``*``, ``?``, ``[``) names
    parquet files only: it is read as the folder of the files it matches.

    Raises
    ------
    ValueError
        A suffix the table does not hold.
    """
    path = os.fspath(path)
    low = path.lower().rstrip(os.sep)
    kind = next((k for suffix, k in SUFFIX_READERS.items() if low.endswith(suffix)), None)
    if os.path.isdir(path) and kind is None:
        return "parquet"
    if glob.has_magic(path) and kind != "parquet":
        raise ValueError(
            f"{path}: a glob may name parquet files only (e.g. 'data/part-*.parquet'); "
            "name a CSV or .npz file by its own path"
        )
    if kind is None:
        suffix = os.path.splitext(low)[1]
        raise ValueError(
            f"{path}: unsupported data format {suffix!r}, an unknown file type; accepted: "
            f"{', '.join(_ACCEPTED)}"
        )
    return kind


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message (some libraries write paragraphs)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _check_file(path: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"data file not found: {path}")
    if os.path.isdir(path):
        raise ValueError(f"cannot read {path}: not a file but a directory")


def _check_numeric(kinds: Mapping[str, bool], where: str, labels_known: bool) -> None:
    """Refuse non-numeric feature columns; ``labels_known``: a target column was named or
    the labels were given apart (then naming the label column is no remedy)."""
    bad = [name for name, ok in kinds.items() if not ok]
    if bad:
        remedy = "encode or drop these columns first"
        if not labels_known:
            remedy = f"name the label column with target= (--target) or {remedy}"
        raise ValueError(f"non-numeric feature column(s) in {where}: {bad}; {remedy}")


def _check_finite(X: np.ndarray, row_ids: np.ndarray, source: str, whole: bool = True) -> None:
    """Refuse NaN or infinite features, naming the bad value of the lowest row id.

    ``whole``: ``X`` holds every row of ``source`` (the message says "first"), else a part
    of them (the lowest row of that part is named).
    """
    found = first_non_finite(X, row_ids)
    if found is not None:
        raise non_finite_error(source, found, whole)


def check_labels_present(
    labels: Any,
    row_ids: np.ndarray,
    source: str | None,
    whole: bool = True,
    numeric: bool = False,
) -> None:
    """Refuse a missing label (None or NA) among non-numeric labels, naming the lowest row
    id: np.unique fails on one with "'<' not supported between 'NoneType' and 'str'".

    ``numeric``: a NaN among numeric labels is one too (classification; else a NaN target
    is refused as such where it is trained). ``whole``: ``labels`` are all of ``source``'s
    (the message says "first"), else a part of them ("e.g."). ``source`` None: labels
    given in memory.
    """
    labels = np.asarray(labels)
    if labels.dtype.kind not in ("OUSf" if numeric else "OUS") or not len(labels):
        return
    missing = missing_labels(labels)
    if missing.any():
        raise missing_label_error(source, int(row_ids[missing].min()), whole)


def missing_labels(labels: np.ndarray) -> np.ndarray:
    """Per row of ``labels``, whether it misses a label (None, NaN or NA)."""
    import pandas as pd

    return as_rows(pd.isna(labels)).any(axis=1)


def missing_label_error(source: str | None, row: int, whole: bool = True) -> DataError:
    """The error for a missing label at ``row`` (see :func:`check_labels_present`)."""
    where = f"{source}: " if source else ""
    return DataError(
        f"{where}y has a missing label (None, NaN or NA), {'first' if whole else 'e.g.'} at "
        f"row {row}; drop those rows or label them first"
    )


def non_finite_error(
    source: str | None, found: tuple[int, int, float], whole: bool, part: str = "X"
) -> DataError:
    """The error for the value :func:`first_non_finite` found in ``part`` (X or y);
    ``source`` None: values given in memory or as Dask collections."""
    row, col, value = found
    kind = "a NaN" if np.isnan(value) else "an infinite value"
    where = f"row {row}, column {col}" if part == "X" else f"row {row}"
    origin = f"{source}: " if source else ""
    return DataError(
        f"{origin}{part} has NaN/infinite value(s), {'first' if whole else 'e.g.'} {kind} "
        f"at {where}; drop or impute them first"
    )


def _is_numeric_dtype(dtype: Any) -> bool:
    import pandas as pd

    return pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)


def non_numeric_columns(dtypes: Mapping[Any, Any]) -> list[str]:
    """Names of the columns (name -> dtype) that are neither numeric nor boolean.

    The rule the readers refuse feature columns by, for in-memory frames too.
    """
    return [str(name) for name, dtype in dtypes.items() if not _is_numeric_dtype(dtype)]


# --------------------------------------------------------------------------------------
# Worker-side readers (module level so tasks pickle by reference)
# --------------------------------------------------------------------------------------


# numpy parses an .npy header with ast.literal_eval, and CPython 3.11 keeps the AST
# constructor's recursion count per interpreter, not per thread: in-process workers
# (threads) reading shards of one .npz at once failed a fresh-venv test run with "SystemError:
# AST constructor recursion depth mismatch". One header at a time per process (a few hundred
# bytes each).
_HEADER_LOCK = threading.Lock()


def _npz_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """Read an ``.npy`` header from a stream; None when the format version is unknown."""
    version = np.lib.format.read_magic(f)
    with _HEADER_LOCK:
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
    return _npz_shard(path, x_key, y_key, _shard_ids(seed, n_rows, start, stop), n_rows, dtype)


def _npz_shard(
    path: str, x_key: str, y_key: str | None, ids: np.ndarray, n_rows: int, dtype: np.dtype
) -> Shard:
    """Rows ``ids`` of an ``.npz`` file, in that order."""
    order, sorted_ids = _sorted_order(ids)
    X = _as_features(_npz_rows(path, x_key, sorted_ids, n_rows, order), dtype)
    y = None
    if y_key is not None:
        y = np.ascontiguousarray(_npz_rows(path, y_key, sorted_ids, n_rows, order))
    return Shard(X=X, y=y, row_ids=ids)


def npz_member(path: str, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of array ``key`` of an ``.npz`` file, from its header only."""
    with zipfile.ZipFile(path) as zf, zf.open(f"{key}.npy") as f:
        header = _npz_header(f)
    if header is None:
        raise ValueError(f"{path}: {key} has an unknown .npy format version")
    return tuple(header[0]), np.dtype(header[2])


def npz_part(path: str, x_key: str, y_key: str | None, start: int, stop: int, n_rows: int,
             dtype: np.dtype) -> Shard:  # fmt: skip
    """Rows ``start..stop`` of an ``.npz`` file (a block of :func:`shards.npz_arrays`)."""
    return _npz_shard(path, x_key, y_key, np.arange(start, stop), n_rows, dtype)


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
    ids: np.ndarray,
    n_rows: int,
    dtype: np.dtype,
    source: str,
) -> Shard:
    """Assemble the shard of rows ``ids`` from a file read block by block, in file order.

    ``blocks`` yields ``(block_rows, take)`` where ``take(positions)`` returns the
    features and target of those rows of the block; ``take`` is only called for blocks
    holding rows of this shard, so readers may defer the actual read to it.
    """
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
    ids = _shard_ids(seed, n_rows, start, stop)
    return _parquet_shard(files, features, target, ids, n_rows, dtype)


def _parquet_shard(
    files: Sequence[str],
    features: Sequence[str],
    target: str | None,
    ids: np.ndarray,
    n_rows: int,
    dtype: np.dtype,
) -> Shard:
    """Rows ``ids`` of parquet ``files`` (in order, as one table), in that order."""
    import pyarrow.parquet as pq

    # The file, or the folder of the files: what the user named, in staging and read_file.
    source = files[0] if len(files) == 1 else os.path.commonpath(files)

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

    return _shard_from_blocks(row_groups(), features, target, ids, n_rows, dtype, source)


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
    ids = _shard_ids(seed, n_rows, start, stop)
    return _csv_shard(path, features, target, ids, n_rows, dtype, chunksize)


def _csv_shard(
    path: str,
    features: Sequence[str],
    target: str | None,
    ids: np.ndarray,
    n_rows: int,
    dtype: np.dtype,
    chunksize: int,
) -> Shard:
    """Rows ``ids`` of a CSV file, in that order, parsed ``chunksize`` rows at a time."""
    columns = [*features, target] if target is not None else list(features)

    def chunks():
        import pandas as pd

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

    try:
        return _shard_from_blocks(chunks(), features, target, ids, n_rows, dtype, path)
    except (ValueError, TypeError) as exc:
        if str(exc).startswith(path):  # already names the file
            raise
        # A value pandas cannot parse as a number (past the rows _csv_meta looked at): bad
        # rows, raised as such (a ValueError), not as a failure of the cluster.
        raise DataError(f"cannot read {path}: {_first_line(exc)}") from None


def _unique_target(
    kind: str, path: str, meta: Mapping[str, Any], target: str | None, n_rows: int
) -> np.ndarray:
    """Distinct labels of a file (the label column or key only), read on a worker."""
    ids = np.arange(n_rows, dtype=np.int64)
    if kind == "npz":
        if meta["y_key"] is None:
            raise ValueError(f"{path} has no labels for {meta['x_key']}")
        labels = _npz_rows(path, meta["y_key"], ids, n_rows)
    elif kind == "parquet":
        labels = _parquet_shard(meta["files"], [], target, ids, n_rows, np.dtype(np.float32)).y
    else:
        labels = _csv_shard(path, [], target, ids, n_rows, np.dtype(np.float32), 65_536).y
    # Classes: a NaN is a missing label too (a float label column of a parquet file),
    # which np.unique kept as a class and scikit-learn refused as "Input y contains NaN."
    check_labels_present(labels, ids, path, numeric=True)
    return np.unique(labels)


# --------------------------------------------------------------------------------------
# Driver side: metadata only
# --------------------------------------------------------------------------------------


def _npz_meta(path: str, x_key: str | None, y_key: str | None) -> dict[str, Any]:
    """Keys, row count and width of an ``.npz``, from the member headers only."""
    _check_file(path)
    if not zipfile.is_zipfile(path):
        raise ValueError(f"cannot read {path}: not a valid .npz file (corrupted or not a zip)")
    with zipfile.ZipFile(path) as zf:
        keys = [n[: -len(".npy")] for n in zf.namelist() if n.endswith(".npy")]
        if x_key is None:
            x_key = next((xk for xk, _ in NPZ_KEY_PAIRS if xk in keys), None)
            if x_key is None:
                pairs = ", ".join(f"{xk}/{yk}" for xk, yk in NPZ_KEY_PAIRS)
                raise ValueError(
                    f"{path} has none of the arrays {pairs} (has {keys}); save its arrays "
                    "under one of these names (or pass the reader x_key=)"
                )
        elif x_key not in keys:
            raise ValueError(f"{path}: x_key {x_key!r} not found; keys are {keys}")
        if y_key is None:
            guesses = [yk for xk, yk in NPZ_KEY_PAIRS if xk == x_key] + ["y" + x_key[1:]]
            y_key = next((g for g in guesses if g in keys and g != x_key), None)
        elif y_key not in keys:
            raise ValueError(f"{path}: target key {y_key!r} not found; keys are {keys}")
        shapes, dtypes = {}, {}
        for key in (x_key, y_key):
            if key is None:
                continue
            try:
                with zf.open(key + ".npy") as f:
                    header = _npz_header(f)
                if header is None:  # unknown header version: let numpy parse this member
                    with np.load(path, allow_pickle=False) as npz:
                        member = npz[key]
                    shapes[key], dtypes[key] = member.shape, member.dtype
                else:
                    shapes[key], dtypes[key] = header[0], header[2]
            except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
                raise ValueError(f"cannot read {path} as .npz: {_first_line(exc)}") from None
    x_shape = shapes[x_key]
    if len(x_shape) == 0:
        raise ValueError(f"{path}: {x_key} is a scalar, not a data set")
    if dtypes[x_key].kind not in "biuf":
        raise TypeError(f"{path}: {x_key} is not numeric (dtype {dtypes[x_key]}); encode it first")
    if y_key is not None and dtypes[y_key].hasobject:
        raise TypeError(
            f"{path}: {y_key} holds Python objects (dtype object), which are not loaded"
        )
    if y_key is not None and shapes[y_key][:1] != x_shape[:1]:
        y_rows = shapes[y_key][0] if shapes[y_key] else "none (a scalar)"
        raise ValueError(f"{path}: {x_key} has {x_shape[0]} rows but {y_key} has {y_rows}")
    n_features = int(np.prod(x_shape[1:], dtype=np.int64)) if len(x_shape) > 1 else 1
    return {"x_key": x_key, "y_key": y_key, "n_rows": int(x_shape[0]), "n_features": n_features}


def _other_kind_in_folder(folder: str) -> tuple[str, str] | None:
    """The first file of ``folder`` (as pyarrow lists it) that names another reader, and
    that reader: a folder of CSV files fails in pyarrow with 'Parquet magic bytes not found'."""
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))  # pyarrow skips these
        for name in sorted(files):
            kind = next(
                (k for suffix, k in SUFFIX_READERS.items() if name.lower().endswith(suffix)), None
            )
            if kind not in (None, "parquet") and not name.startswith((".", "_")):
                return os.path.join(root, name), kind
    return None


def _parquet_meta(path: str, target: str | None) -> dict[str, Any]:
    """Files, row count and feature columns of a parquet file or directory (metadata only)."""
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    if glob.has_magic(path):  # the folder of the files the glob matches
        source = sorted(glob.glob(path))
        if not source:
            raise FileNotFoundError(f"no data files match {path}")
    else:
        source = path
    try:
        dataset = pads.dataset(source, format="parquet")
    except (pa.ArrowException, OSError) as exc:
        other = _other_kind_in_folder(path) if os.path.isdir(path) else None
        if other is not None:
            raise ValueError(
                f"{path}: a folder is read as parquet files, and {other[0]} is a {other[1]} "
                "file; name a CSV or .npz file by its own path"
            ) from None
        raise ValueError(f"cannot read {path} as parquet: {_first_line(exc)}") from None
    files = list(dataset.files)
    if not files:
        raise ValueError(f"{path}: no parquet files found")
    schema = dataset.schema
    # A frame's index that pandas stored as a column (``__index_level_0__``, not a plain
    # range) is read back as the index by pandas and Dask: no column to train on.
    index = {
        c for c in (schema.pandas_metadata or {}).get("index_columns", []) if isinstance(c, str)
    }
    columns = [c for c in schema.names if c not in index]
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

    _check_numeric({c: numeric(schema.field(c).type) for c in features}, path, target is not None)
    n_rows = 0
    for file in files:
        footer = pq.ParquetFile(file)
        n_rows += footer.metadata.num_rows
        # The dataset's schema is its first file's: a column text in another file failed
        # on the workers, mid-read, with "unsupported operand type(s) for +", and one
        # missing there with "No match for FieldRef.Name(b)" (in-process, a traceback).
        types = footer.schema_arrow
        absent = [c for c in columns if c not in types.names]
        if absent:
            raise ValueError(
                f"{file}: column(s) {absent} missing, which {files[0]} has; give every file "
                "of a folder the same columns"
            )
        _check_numeric(
            {c: numeric(types.field(c).type) for c in features}, file, target is not None
        )
    return {"files": files, "features": features, "n_rows": n_rows}


def _csv_meta(path: str, target: str | None) -> dict[str, Any]:
    """Columns and row count of a CSV file, read in chunks (never the whole file at once)."""
    import pandas as pd

    _check_file(path)
    try:
        peek = pd.read_csv(path, nrows=1000)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path} is empty (no columns, no rows)") from None
    except UnicodeDecodeError:
        raise ValueError(f"cannot read {path}: not a text CSV file (corrupted?)") from None
    except (ValueError, OSError, EOFError) as exc:  # pandas' ParserError is a ValueError
        raise ValueError(f"cannot read {path}: {_first_line(exc)}") from None
    columns = [str(c) for c in peek.columns]
    if target is not None and target not in columns:
        raise ValueError(f"{path}: target column {target!r} not found; columns are {columns}")
    features = [c for c in columns if c != target]
    if peek.empty:  # a header only: no dtypes to check, and nothing to read
        return {"features": features, "n_rows": 0}
    _check_numeric(
        {c: _is_numeric_dtype(peek[c].dtype) for c in features}, path, target is not None
    )
    # CSV has no row count in a header: count by parsing the first column chunk by chunk.
    with pd.read_csv(path, usecols=[0], chunksize=1 << 20) as reader:
        n_rows = sum(len(chunk) for chunk in reader)
    return {"features": features, "n_rows": n_rows}


def frame_parts(kind: str, path: str, meta: Mapping[str, Any]) -> list[tuple]:
    """The partitions a parquet or CSV source is read in as a data frame.

    One per parquet file; CSV rows in ranges of :data:`CSV_PART_ROWS` (a compressed file
    is decompressed from its start by every part, so parts are large).
    """
    if kind == "parquet":
        return [(f, 0, -1) for f in meta["files"]]
    n = meta["n_rows"]
    return [(path, a, min(a + CSV_PART_ROWS, n)) for a in range(0, n, CSV_PART_ROWS)]


def read_frame_part(
    part: tuple,
    kind: str,
    columns: Sequence[str],
    features: Sequence[str] = (),
    target: str | None = None,
    numeric_labels: bool = False,
) -> pd.DataFrame:
    """One partition of :func:`frame_parts` as a data frame of ``columns``, in file order.

    The ``features`` columns, when all are read, are checked as staging checks a file's
    rows: a NaN or an infinite value is refused, named by its file and row there; so is a
    missing label in the ``target`` column, when read (a NaN of a numeric one too with
    ``numeric_labels``: see :func:`check_labels_present`).
    """
    import pandas as pd

    path, start, stop = part
    if kind == "parquet":
        import pyarrow.parquet as pq

        frame = pq.read_table(path, columns=list(columns)).to_pandas()
        start = 0  # a part is a whole file
    else:
        names = [str(c) for c in pd.read_csv(path, nrows=0).columns]  # the header alone
        # An int skiprows skips lines in the parser (a list of row numbers would be a set
        # of millions of ints in memory for a late part).
        frame = pd.read_csv(
            path, header=None, names=names, skiprows=start + 1, nrows=stop - start,
            usecols=list(columns),
        )[list(columns)]  # fmt: skip
    # Dask passes fewer columns where a computation needs fewer (the labels alone).
    rows = np.arange(start, start + len(frame))
    if len(features) and len(frame) and set(features) <= set(frame.columns):
        # As floats: a bool column beside float ones made an object array, which the
        # check passed (an NA of an Int64 column then failed the score in a traceback).
        X = frame[list(features)].to_numpy(np.float64, na_value=np.nan)
        _check_finite(X, rows, path, whole=False)
    if target is not None and target in frame.columns:
        labels = frame[target].to_numpy()
        check_labels_present(labels, rows, path, whole=False, numeric=numeric_labels)
    return frame


def empty_frame(kind: str, part: tuple, columns: Sequence[str]) -> pd.DataFrame:
    """A data frame of ``columns`` with no rows, typed as :func:`read_frame_part` reads
    ``part``: from the parquet schema (no row read), or a CSV's first 1,000 rows."""
    path, start, stop = part
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.read_schema(path).empty_table().select(list(columns)).to_pandas()
    return read_frame_part((path, start, min(stop, start + 1000)), kind, columns).iloc[:0]


# --------------------------------------------------------------------------------------
# A whole file on the driver
# --------------------------------------------------------------------------------------


@dataclass
class FileData:
    """All rows of a data file, in file order (see :func:`read_file`).

    Attributes
    ----------
    X : ndarray of shape (n_rows, n_features)
        The features, in the dtype asked for.
    y : ndarray of shape (n_rows,) or None
        The labels (the ``target`` column, or the ``.npz`` label array), None without.
    features : list of str or None
        Feature column names of parquet and CSV data; None for ``.npz``.
    x_key, y_key : str or None
        The ``.npz`` arrays read (None for parquet and CSV; ``y_key`` None without labels).
    keys : list of str
        The ``.npz`` file's arrays (empty for parquet and CSV).
    """

    X: np.ndarray
    y: np.ndarray | None
    features: list[str] | None = None
    x_key: str | None = None
    y_key: str | None = None
    keys: list[str] = field(default_factory=list)


def check_file_source(path: str | os.PathLike, target: str | None = None) -> None:
    """Check a data file as :func:`read_file` and staging would, from its metadata alone
    (an ``.npz``'s member headers, a parquet schema, a CSV's first rows): its kind, its
    arrays or ``target`` column, its feature columns' types.

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`read_file` raises them, before any row is read.
    """
    file_meta(*source_kind(path), None, target)


def file_meta(path: str, kind: str, x_key: str | None, target: str | None) -> dict[str, Any]:
    """The metadata of a data file of reader ``kind`` (:func:`source_kind`), checked: an
    ``.npz``'s arrays (``x_key``, ``target`` the y array's), or a table's ``target`` and
    feature columns."""
    if kind == "npz":
        return _npz_meta(path, x_key, target)
    return _parquet_meta(path, target) if kind == "parquet" else _csv_meta(path, target)


def source_kind(path: str | os.PathLike, x_key: str | None = None) -> tuple[str, str]:
    """The absolute path of a data file and its reader's kind, checked as every reader wants.

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        An unsupported suffix, or ``x_key`` for a file that is not ``.npz``.
    """
    path = os.path.abspath(os.fspath(path))
    kind = reader_kind(path)
    if glob.has_magic(path):
        if not glob.glob(path):
            raise FileNotFoundError(f"no data files match {path}")
    elif not os.path.exists(path):
        raise FileNotFoundError(f"data file not found: {path}")
    if kind != "npz" and x_key is not None:
        raise ValueError("x_key= applies to .npz paths only")
    return path, kind


def read_file(
    path: str | os.PathLike,
    target: str | None = None,
    *,
    x_key: str | None = None,
    dtype: Any = np.float32,
) -> FileData:
    """All rows of a data file, in file order, read as staging reads a worker's rows.

    The same suffixes (:data:`SUFFIX_READERS`), metadata checks and row readers as
    :func:`hmdspt.parallel.shards.stage`, so a file refused there is refused here with the
    same message, and one read here is read there alike.

    Parameters
    ----------
    path : str or path
        An ``.npz`` file, a parquet file, folder or glob of parquet files, or a CSV file
        (optionally compressed).
    target : str, optional
        The label column of parquet and CSV data, or the label array of an ``.npz`` file
        (default there: the partner of ``x_key`` in :data:`NPZ_KEY_PAIRS`, if present).
    x_key : str, optional
        The feature array of an ``.npz`` file (default: the first of :data:`NPZ_KEY_PAIRS`
        present).
    dtype : dtype, default=np.float32
        dtype of ``X``.

    Returns
    -------
    data : FileData

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        With one line naming the problem, as staging words it: an unknown suffix, an
        unreadable or corrupted file, a missing target column or array, X and y of
        different lengths, no rows, non-numeric features; and, which staging lets
        through, NaN or infinite features or a missing label (the first is named).
    """
    path, kind = source_kind(path, x_key)
    dtype = np.dtype(dtype)
    meta = file_meta(path, kind, x_key, target)
    n_rows = meta["n_rows"]
    if n_rows == 0:
        raise ValueError(f"{path} has no rows")
    ids = np.arange(n_rows, dtype=np.int64)
    if kind == "npz":
        with zipfile.ZipFile(path) as zf:
            keys = [n[: -len(".npy")] for n in zf.namelist() if n.endswith(".npy")]
        shard = _npz_shard(path, meta["x_key"], meta["y_key"], ids, n_rows, dtype)
        data = FileData(shard.X, shard.y, None, meta["x_key"], meta["y_key"], keys)
    elif kind == "parquet":
        shard = _parquet_shard(meta["files"], meta["features"], target, ids, n_rows, dtype)
        data = FileData(shard.X, shard.y, list(meta["features"]))
    else:
        shard = _csv_shard(path, meta["features"], target, ids, n_rows, dtype, _CSV_CHUNK_ROWS)
        data = FileData(shard.X, shard.y, list(meta["features"]))
    _check_finite(data.X, ids, path)
    if data.y is not None:
        check_labels_present(data.y, ids, path)
    return data
