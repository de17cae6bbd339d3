"""Micro-difference merges, block momentum and delta compression (pure numpy).

One HMDSPT round ends with every worker ``i`` sending ``Δ_i = w_i − w_t``, the change its
local mini-batch passes made to the broadcast parameters ``w_t`` (one flat vector). The
driver then

1. merges the deltas with :func:`merge_deltas`, weighting each by its share of the rows and
   normalising by the number of local steps (FedNova, Wang et al., NeurIPS 2020), and
2. applies the merged delta through :class:`BlockMomentum` (BMUF, Chen & Huo, ICASSP 2016).

What a worker sends may be compressed with :func:`compress` (dense, float16 or top-k) and
restored with :func:`decompress`; :class:`ErrorFeedback` keeps on the worker what top-k or
float16 left out and adds it to the next round's delta, so compression delays information
but never loses it.

Everything works in place on the flat vectors' own dtype (float32 in this project), and
this module must not import Dask: it is the core layer the orchestration builds on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "COMPRESSION_METHODS",
    "BlockMomentum",
    "CompressedDelta",
    "ErrorFeedback",
    "compress",
    "decompress",
    "merge_deltas",
    "merge_weights",
    "topk_count",
]

COMPRESSION_METHODS = ("none", "float16", "topk")

# float16 keeps full relative precision (11 bits) for |x| in [2**-14, 65504]. Scaling the
# vector so that its largest entry lies just below 2**15 keeps 29 binades of the delta's
# range in that window (deltas are often ~1e-5, which unscaled float16 would flush to
# subnormals) and leaves headroom below the float16 maximum.
_F16_TOP_EXPONENT = 15


# --------------------------------------------------------------------------------------
# Merging
# --------------------------------------------------------------------------------------


def merge_weights(
    rows: Sequence[int], steps: Sequence[int], normalize_steps: bool = True
) -> np.ndarray:
    """Coefficients ``c_i`` such that the merged delta is ``Σ c_i Δ_i``.

    With ``p_i = n_i / Σ n`` (the sum over contributing workers) and ``τ_i`` the local step
    count, ``c_i = τ_eff p_i / τ_i`` with ``τ_eff = Σ p_i τ_i`` when ``normalize_steps``,
    else ``c_i = p_i``. Workers with 0 rows or 0 steps contribute nothing (``c_i = 0``).

    Parameters
    ----------
    rows : sequence of int
        Rows ``n_i`` each worker trained on in the round.
    steps : sequence of int
        Local optimizer steps ``τ_i`` each worker took in the round.
    normalize_steps : bool, default=True
        Apply the FedNova step normalisation.

    Returns
    -------
    weights : ndarray of shape (n_workers,), dtype float64
        The coefficients; they sum to 1 without normalisation. With it they sum to
        ``τ_eff Σ p_i / τ_i ≥ 1`` (equality iff all contributing ``τ_i`` are equal).

    Raises
    ------
    ValueError
        If the inputs are empty, of different lengths, negative or non-finite, or if no
        worker has both rows and steps.
    """
    n_rows = np.asarray(rows, dtype=np.float64)
    n_steps = np.asarray(steps, dtype=np.float64)
    if n_rows.ndim != 1 or n_steps.ndim != 1:
        raise ValueError("rows and steps must be flat sequences of numbers")
    if n_rows.size == 0:
        raise ValueError("nothing to merge: rows and steps are empty")
    if n_rows.size != n_steps.size:
        raise ValueError(
            f"rows has {n_rows.size} entries but steps has {n_steps.size}; "
            "one of each per worker is required"
        )
    for name, values in (("rows", n_rows), ("steps", n_steps)):
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ValueError(f"{name} must be finite and non-negative, got {values.tolist()}")
    active = (n_rows > 0) & (n_steps > 0)
    if not np.any(active):
        # A merged delta of zero would silently turn a broken round into a no-op round.
        raise ValueError("no worker contributed to the round (every worker has 0 rows or 0 steps)")
    weights = np.zeros_like(n_rows)
    p = n_rows[active] / n_rows[active].sum()
    if normalize_steps:
        tau = n_steps[active]
        tau_eff = float(np.dot(p, tau))
        weights[active] = tau_eff * p / tau
    else:
        weights[active] = p
    return weights


def merge_deltas(
    deltas: Sequence[np.ndarray],
    rows: Sequence[int],
    steps: Sequence[int],
    normalize_steps: bool = True,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Merge the workers' parameter deltas of one round (docs/design.md, "The round", step 4).

    Computes ``Δ = τ_eff Σ p_i Δ_i / τ_i`` with ``p_i = n_i / Σ n`` and
    ``τ_eff = Σ p_i τ_i`` (FedNova); with ``normalize_steps=False`` the plain row-weighted
    average ``Σ p_i Δ_i``. Without the normalisation a worker that took more local steps
    pulls the model towards its own shard's objective; the normalisation averages the
    per-step progress instead and rescales it to the mean step count. When every ``τ_i``
    is equal both forms coincide.

    Parameters
    ----------
    deltas : sequence of ndarray
        One delta per worker, all of the same shape (flat parameter vectors).
    rows : sequence of int
        Rows each worker trained on in the round.
    steps : sequence of int
        Local optimizer steps each worker took in the round.
    normalize_steps : bool, default=True
        Apply the step normalisation.
    out : ndarray, optional
        Buffer for the result, of the deltas' shape and a floating dtype. It must not
        overlap any delta. Allocated when not given.

    Returns
    -------
    merged : ndarray
        The merged delta (``out`` when given), in the deltas' dtype.

    Raises
    ------
    ValueError
        On empty input, sequences of different lengths, deltas of different shapes, a
        bad ``out`` or when no worker has both rows and steps.

    Notes
    -----
    Workers with 0 rows or 0 steps are skipped and ``p_i`` is renormalised over the
    others. Identical deltas merge to themselves when the step counts are equal (or
    ``normalize_steps=False``); with unequal step counts they do not, because equal deltas
    from unequal step counts mean unequal progress per step.

    The sum is accumulated in ``out`` without any temporary vector, by nested scaling:
    with the coefficients sorted ascending, ``out ← (out · c_{j-1}/c_j) + Δ_j`` and a final
    ``out *= c_last``. Every ratio is at most 1, so nothing overflows.
    """
    if len(deltas) == 0:
        raise ValueError("nothing to merge: deltas is empty")
    if len(rows) != len(deltas) or len(steps) != len(deltas):
        raise ValueError(
            f"got {len(deltas)} deltas, {len(rows)} row counts and {len(steps)} step "
            "counts; one of each per worker is required"
        )
    arrays = [np.asarray(d) for d in deltas]
    shape = arrays[0].shape
    for i, a in enumerate(arrays):
        if a.shape != shape:
            raise ValueError(f"delta {i} has shape {a.shape}, delta 0 has shape {shape}")
    weights = merge_weights(rows, steps, normalize_steps)

    dtype = np.result_type(*arrays)
    if not np.issubdtype(dtype, np.floating):
        dtype = np.dtype(np.float64)
    if out is None:
        out = np.empty(shape, dtype=dtype)
    else:
        if not isinstance(out, np.ndarray) or out.shape != shape:
            raise ValueError(f"out must be an ndarray of shape {shape}")
        if not np.issubdtype(out.dtype, np.floating):
            raise ValueError(f"out must have a floating dtype, got {out.dtype}")
        if any(np.may_share_memory(out, a) for a in arrays):
            raise ValueError("out must not overlap any of the deltas")

    order = sorted((i for i in range(len(arrays)) if weights[i] > 0), key=lambda i: weights[i])
    np.copyto(out, arrays[order[0]], casting="same_kind")
    previous = weights[order[0]]
    for i in order[1:]:
        ratio = previous / weights[i]
        if ratio != 1.0:
            out *= ratio
        out += arrays[i]
        previous = weights[i]
    if previous != 1.0:
        out *= previous
    return out


class BlockMomentum:
    """Block momentum on the merged delta (BMUF, Chen & Huo 2016).

    Each round ``v ← μ v + Δ`` and ``w ← w + η_g v``, in place on the flat vector.
    ``momentum=0, lr=1`` is the plain update ``w ← w + Δ``.

    Parameters
    ----------
    momentum : float, default=0.0
        Block momentum ``μ`` in ``[0, 1)``. Chen & Huo suggest ``μ ≈ 1 − 1/K`` for ``K``
        workers with ``lr=1``.
    lr : float, default=1.0
        Block learning rate ``η_g > 0``.

    Attributes
    ----------
    velocity : ndarray or None
        The block velocity ``v``; None until the first :meth:`step`.
    """

    def __init__(self, momentum: float = 0.0, lr: float = 1.0) -> None:
        momentum = float(momentum)
        lr = float(lr)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if not (lr > 0.0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive finite number, got {lr}")
        self.momentum = momentum
        self.lr = lr
        self.velocity: np.ndarray | None = None
        # Holds η_g·v so the update allocates nothing per round.
        self._scratch: np.ndarray | None = None

    def step(self, params: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """Apply one merged delta to ``params`` in place.

        Parameters
        ----------
        params : ndarray
            The global parameters ``w_t``, updated in place to ``w_{t+1}``.
        delta : ndarray of the shape of ``params``
            The merged delta of the round.

        Returns
        -------
        params : ndarray
            The same array, for chaining.
        """
        delta = np.asarray(delta)
        if delta.shape != params.shape:
            raise ValueError(f"delta has shape {delta.shape}, params has shape {params.shape}")
        v = self.velocity
        if v is not None and v.shape != params.shape:
            raise ValueError(
                f"params has shape {params.shape} but the velocity has shape {v.shape}; "
                "call reset() when the model changes"
            )
        if v is None:
            v = self.velocity = np.array(delta, dtype=params.dtype, copy=True)
        elif self.momentum == 0.0:
            # Overwrite rather than multiply by 0 so a non-finite old velocity cannot leak.
            np.copyto(v, delta, casting="same_kind")
        else:
            v *= self.momentum
            v += delta
        if self.lr == 1.0:
            params += v
        else:
            if self._scratch is None or self._scratch.shape != v.shape:
                self._scratch = np.empty_like(v)
            np.multiply(v, self.lr, out=self._scratch)
            params += self._scratch
        return params

    def reset(self) -> None:
        """Forget the velocity (e.g. after re-initialising the model)."""
        self.velocity = None
        self._scratch = None

    def state_dict(self) -> dict:
        """Hyper-parameters and a copy of the velocity, for checkpoints."""
        return {
            "momentum": self.momentum,
            "lr": self.lr,
            "velocity": None if self.velocity is None else self.velocity.copy(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (the velocity is copied)."""
        restored = BlockMomentum(state["momentum"], state["lr"])  # validates
        self.momentum = restored.momentum
        self.lr = restored.lr
        velocity = state.get("velocity")
        self.velocity = None if velocity is None else np.array(velocity, copy=True)
        self._scratch = None


# --------------------------------------------------------------------------------------
# Compression
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompressedDelta:
    """What a worker sends instead of its dense delta.

    Attributes
    ----------
    method : {"none", "float16", "topk"}
        How ``values`` encode the delta.
    size : int
        Length ``n`` of the dense delta.
    dtype : str
        Dtype of the dense delta (restored by :func:`decompress`).
    values : ndarray
        Dense values (``"none"``), scaled float16 values (``"float16"``) or the kept
        values (``"topk"``).
    indices : ndarray of int32 or None
        Positions of the kept values, ascending (``"topk"`` only; int64 beyond 2**31
        entries).
    scale : float
        Power of two the float16 values are multiplied by on decompression; 1.0 otherwise.
    """

    method: str
    size: int
    dtype: str
    values: np.ndarray
    indices: np.ndarray | None = None
    scale: float = 1.0

    @property
    def nbytes(self) -> int:
        """Bytes of payload data (arrays, plus the float16 scale), without framing."""
        n = self.values.nbytes
        if self.indices is not None:
            n += self.indices.nbytes
        if self.method == "float16":
            n += 4  # the scale, sent as a float32
        return int(n)


def topk_count(n: int, k: float) -> int:
    """Number of entries top-k keeps of a vector of length ``n``.

    ``round(k · n)``, at least 1 (unless ``n == 0``) and at most ``n``.
    """
    if not 0.0 < k <= 1.0:
        raise ValueError(f"top-k fraction k must be in (0, 1], got {k}")
    if n == 0:
        return 0
    return min(n, max(1, int(round(k * n))))


def compress(delta: np.ndarray, method: str = "none", *, k: float = 0.1) -> CompressedDelta:
    """Encode a delta for sending.

    Parameters
    ----------
    delta : ndarray
        The delta; it is read as a flat vector.
    method : {"none", "float16", "topk"}, default="none"
        ``"none"`` sends the array itself (no copy); ``"float16"`` casts after scaling by
        a power of two (half the bytes of float32, about 3 significant digits);
        ``"topk"`` sends the ``round(k·n)`` entries of largest magnitude with their int32
        positions.
    k : float, default=0.1
        Fraction of entries top-k keeps, in ``(0, 1]``.

    Returns
    -------
    payload : CompressedDelta
        Its ``nbytes`` is what goes over the network (without framing).

    Notes
    -----
    Top-k uses :func:`numpy.argpartition` (linear time), not a full sort; only the kept
    positions are sorted, which makes decompression a sequential scatter. Without error
    feedback (:class:`ErrorFeedback`) what top-k drops is lost.
    """
    delta = np.asarray(delta)
    flat = delta.reshape(-1)
    n = flat.size
    dtype = str(flat.dtype)
    if method == "none":
        return CompressedDelta("none", n, dtype, flat)
    if method == "float16":
        amax = float(max(flat.max(), -flat.min())) if n else 0.0
        exponent = 0
        if amax > 0.0 and math.isfinite(amax):
            # amax < 2**e, so every scaled entry is below 2**_F16_TOP_EXPONENT. Clipped so
            # that 2**±exponent stays a normal float32.
            exponent = max(-100, min(100, math.frexp(amax)[1] - _F16_TOP_EXPONENT))
        values = np.empty(n, dtype=np.float16)
        # Power-of-two scaling is exact; the only rounding is the cast to float16, done
        # by the ufunc in chunks (no float32 temporary of the whole vector).
        np.multiply(flat, 2.0**-exponent, out=values, casting="same_kind")
        return CompressedDelta("float16", n, dtype, values, scale=2.0**exponent)
    if method == "topk":
        count = topk_count(n, k)
        index_dtype = np.int32 if n <= np.iinfo(np.int32).max else np.int64
        if count == n:
            indices = np.arange(n, dtype=index_dtype)
        else:
            indices = np.argpartition(np.abs(flat), n - count)[n - count :]
            indices.sort()
            indices = indices.astype(index_dtype, copy=False)
        return CompressedDelta("topk", n, dtype, flat[indices], indices=indices)
    raise ValueError(f"unknown compression method {method!r}; choose from {COMPRESSION_METHODS}")


def decompress(
    payload: CompressedDelta, n: int | None = None, *, out: np.ndarray | None = None
) -> np.ndarray:
    """Restore the dense flat delta from a :class:`CompressedDelta`.

    Parameters
    ----------
    payload : CompressedDelta
        What :func:`compress` returned.
    n : int, optional
        Expected length; checked against the payload when given.
    out : ndarray of shape (n,), optional
        Buffer for the result. Without it, ``"none"`` returns the payload's own array
        (no copy) and the other methods allocate.

    Returns
    -------
    delta : ndarray of shape (n,)
        In the dtype the delta had before compression (``out``'s when given).
    """
    if n is not None and int(n) != payload.size:
        raise ValueError(f"payload holds a delta of length {payload.size}, expected {n}")
    size = payload.size
    if out is not None and out.shape != (size,):
        raise ValueError(f"out has shape {out.shape}, expected ({size},)")
    dtype = np.dtype(payload.dtype)
    if payload.method == "none":
        if out is None:
            return payload.values
        np.copyto(out, payload.values, casting="same_kind")
        return out
    if out is None:
        out = np.empty(size, dtype=dtype)
    if payload.method == "float16":
        np.multiply(payload.values, np.float32(payload.scale), out=out, casting="same_kind")
        return out
    if payload.method == "topk":
        out[...] = 0
        out[payload.indices] = payload.values
        return out
    raise ValueError(f"unknown compression method {payload.method!r}")


class ErrorFeedback:
    """Worker-side residual that makes lossy compression lossless over rounds.

    Each round the residual is added to the delta, the sum is compressed, and what was
    not sent (sum − decompressed payload) becomes the new residual. Summed over rounds,
    what was sent plus the final residual equals the sum of the true deltas
    (Seide et al. 2014; Stich et al. 2018; Karimireddy et al. 2019).

    Parameters
    ----------
    method : {"none", "float16", "topk"}, default="topk"
        Compression method (see :func:`compress`).
    k : float, default=0.1
        Fraction top-k keeps.

    Attributes
    ----------
    residual : ndarray or None
        What has not been sent yet; None before the first round.
    """

    def __init__(self, method: str = "topk", k: float = 0.1) -> None:
        if method not in COMPRESSION_METHODS:
            raise ValueError(
                f"unknown compression method {method!r}; choose from {COMPRESSION_METHODS}"
            )
        if method == "topk":
            topk_count(1, k)  # validates k
        self.method = method
        self.k = float(k)
        self.residual: np.ndarray | None = None

    def compress(self, delta: np.ndarray) -> CompressedDelta:
        """Compress ``delta`` plus the residual and keep what was left out.

        ``delta`` itself is not modified.
        """
        flat = np.asarray(delta).reshape(-1)
        if self.residual is None:
            acc = self.residual = np.array(flat, copy=True)
        else:
            if self.residual.shape != flat.shape:
                raise ValueError(
                    f"delta has {flat.size} entries but the residual has "
                    f"{self.residual.size}; call reset() when the model changes"
                )
            acc = self.residual
            acc += flat
        if self.method == "none":
            payload = compress(acc.copy(), "none")
            acc[...] = 0
        elif self.method == "topk":
            payload = compress(acc, "topk", k=self.k)
            # The kept values are exact copies, so what remains is exactly acc elsewhere.
            acc[payload.indices] = 0
        else:
            payload = compress(acc, "float16")
            acc -= decompress(payload)
        return payload

    def reset(self) -> None:
        """Drop the residual (e.g. when the model is re-initialised)."""
        self.residual = None

    def state_dict(self) -> dict:
        """Method, fraction and a copy of the residual, for checkpoints."""
        return {
            "method": self.method,
            "k": self.k,
            "residual": None if self.residual is None else self.residual.copy(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (the residual is copied)."""
        restored = ErrorFeedback(state["method"], state["k"])  # validates
        self.method, self.k = restored.method, restored.k
        residual = state.get("residual")
        self.residual = None if residual is None else np.array(residual, copy=True)
