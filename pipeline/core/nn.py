"""Flat-parameter multi-layer perceptron, losses and optimizers (pure numpy).

Every parameter of the network lives in ONE contiguous vector ``MLP.params``; each
layer's weight matrix and bias vector are views into it. A delta between two models,
a merge of many deltas or a transfer over the network is therefore a single array
operation, and the optimizers update the whole network with a handful of in-place
vector operations.

The numerics follow scikit-learn's ``MLPClassifier`` / ``MLPRegressor``
(``sklearn/neural_network/_base.py`` and ``_multilayer_perceptron.py``): the same
Glorot-uniform initialisation, losses, L2 penalty and gradient scaling, so a model
here and a scikit-learn model with the same hyper-parameters learn the same function.
Where we differ on purpose: float32 by default, and work buffers allocated once per
batch size so the training loop allocates nothing per mini-batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

__all__ = [
    "ACTIVATIONS",
    "HIDDEN_ACTIVATIONS",
    "LOSSES",
    "OUTPUT_ACTIVATIONS",
    "MLP",
    "SGDOptimizer",
    "AdamOptimizer",
    "make_optimizer",
    "BatchBuffers",
    "divergence_message",
    "minibatch_pass",
    "split_weights",
    "training_speed",
    "weighted_targets",
]

ACTIVATIONS = ("identity", "logistic", "tanh", "relu", "softmax")
LOSSES = ("squared_error", "log_loss", "binary_log_loss")

# Output activation -> the loss whose gradient w.r.t. the pre-activation is (out - y).
_MATCHING_LOSS = {
    "identity": "squared_error",
    "softmax": "log_loss",
    "logistic": "binary_log_loss",
}
#: The activations :class:`MLP` takes for its hidden layers and for its output layer.
HIDDEN_ACTIVATIONS = ("identity", "logistic", "tanh", "relu")
OUTPUT_ACTIVATIONS = tuple(_MATCHING_LOSS)


def _activate_inplace(name: str, z: np.ndarray) -> None:
    """Apply activation ``name`` to ``z`` in place."""
    if name == "identity":
        return
    if name == "relu":
        np.maximum(z, 0, out=z)
    elif name == "tanh":
        np.tanh(z, out=z)
    elif name == "logistic":
        # 1 / (1 + exp(-z)), computed in place; exp overflow to inf gives 0, as wanted.
        with np.errstate(over="ignore"):
            np.negative(z, out=z)
            np.exp(z, out=z)
            z += 1
            np.reciprocal(z, out=z)
    elif name == "softmax":  # outside a workspace (allocates its buffers)
        _softmax_inplace(
            z, np.ones(z.shape[1], z.dtype), np.empty(len(z), z.dtype), np.empty_like(z)
        )
    else:  # pragma: no cover - guarded by MLP.__init__
        raise ValueError(f"unknown activation {name!r}")


def _softmax_inplace(
    z: np.ndarray, ones_cols: np.ndarray, row_sums: np.ndarray, logits: np.ndarray
) -> None:
    """Row-wise softmax of ``z`` in place, using the given buffers.

    Shifting every row by the *global* maximum is as exact as the textbook per-row
    shift unless a row lies so far below the maximum that its exponentials underflow;
    such rows are redone from a copy of the logits with their own maximum. A row-wise
    ``max(axis=1)`` over ten columns costs numpy several times more than all the rest
    of the softmax, and the row sums are a BLAS matrix-vector product.
    """
    np.copyto(logits, z)
    if len(z):  # an empty batch (a block a filter emptied) has no maximum
        z -= z.max()
    np.exp(z, out=z)
    np.matmul(z, ones_cols, out=row_sums)
    weak = row_sums < np.finfo(z.dtype).tiny * 1e8
    if weak.any():
        rows = logits[weak]
        rows -= rows.max(axis=1, keepdims=True)
        np.exp(rows, out=rows)
        z[weak] = rows
        row_sums[weak] = rows.sum(axis=1)
    np.divide(z, row_sums[:, None], out=z)


def _backprop_activation_inplace(
    name: str, a: np.ndarray, delta: np.ndarray, scratch: np.ndarray
) -> None:
    """Multiply ``delta`` in place by the derivative of activation ``name`` at output ``a``.

    ``scratch`` is a buffer of ``a``'s shape and dtype that may be overwritten.
    """
    if name == "identity":
        return
    if name == "relu":
        # d relu = 1 where the output is positive, else 0.
        np.greater(a, 0, out=scratch)
        delta *= scratch
    elif name == "tanh":
        np.multiply(a, a, out=scratch)
        np.subtract(1, scratch, out=scratch)
        delta *= scratch
    elif name == "logistic":
        np.subtract(1, a, out=scratch)
        scratch *= a
        delta *= scratch
    else:  # pragma: no cover
        raise ValueError(f"activation {name!r} has no derivative here")


class MLP:
    """A multi-layer perceptron whose parameters are one flat vector.

    Parameters
    ----------
    layer_sizes : sequence of int
        Units per layer, input first and output last, e.g. ``(64, 100, 10)``.
    hidden_activation : {"identity", "logistic", "tanh", "relu"}, default="relu"
        Activation of every hidden layer.
    out_activation : {"identity", "logistic", "softmax"}, default="softmax"
        Activation of the output layer. It fixes the loss: identity -> squared error,
        softmax -> cross-entropy, logistic -> binary log loss (binary and multilabel).
    alpha : float, default=0.0
        L2 penalty, scaled as in scikit-learn: ``0.5 * alpha * ||W||^2 / n_samples``.
    dtype : numpy dtype, default=np.float32
        Floating point type of parameters, activations and gradients.

    Attributes
    ----------
    params : ndarray of shape (n_params,)
        All weights and biases, contiguous.
    coefs : list of ndarray
        ``coefs[i]`` is a view of shape ``(layer_sizes[i], layer_sizes[i + 1])`` into
        ``params``.
    intercepts : list of ndarray
        ``intercepts[i]`` is a view of shape ``(layer_sizes[i + 1],)`` into ``params``.
    grad : ndarray of shape (n_params,)
        Gradient buffer written by :meth:`loss_and_grad`; ``coef_grads`` and
        ``intercept_grads`` are views into it.
    """

    def __init__(
        self,
        layer_sizes: Sequence[int],
        hidden_activation: str = "relu",
        out_activation: str = "softmax",
        alpha: float = 0.0,
        dtype=np.float32,
    ) -> None:
        layer_sizes = tuple(int(s) for s in layer_sizes)
        if len(layer_sizes) < 2 or min(layer_sizes) < 1:
            raise ValueError(
                f"layer_sizes needs at least an input and an output layer of >= 1 unit, "
                f"got {layer_sizes}"
            )
        if hidden_activation not in HIDDEN_ACTIVATIONS:
            raise ValueError(f"unknown hidden activation {hidden_activation!r}")
        if out_activation not in _MATCHING_LOSS:
            raise ValueError(f"unknown output activation {out_activation!r}")
        self.layer_sizes = layer_sizes
        self.hidden_activation = hidden_activation
        self.out_activation = out_activation
        self.loss_name = _MATCHING_LOSS[out_activation]
        self.alpha = float(alpha)
        self.dtype = np.dtype(dtype)
        self.n_layers = len(layer_sizes)

        # Offsets of each layer's weights then bias inside the flat vector.
        self._slices: list[tuple[slice, slice]] = []
        offset = 0
        for fan_in, fan_out in zip(layer_sizes[:-1], layer_sizes[1:]):
            w = slice(offset, offset + fan_in * fan_out)
            offset += fan_in * fan_out
            b = slice(offset, offset + fan_out)
            offset += fan_out
            self._slices.append((w, b))
        self.n_params = offset
        self.params = np.zeros(self.n_params, dtype=self.dtype)
        self.grad = np.zeros(self.n_params, dtype=self.dtype)
        self._bind_views()
        self._workspaces: dict[int, _Workspace] = {}

    # ------------------------------------------------------------------ params
    def _bind_views(self) -> None:
        shapes = list(zip(self.layer_sizes[:-1], self.layer_sizes[1:]))
        self.coefs = [self.params[w].reshape(shape) for (w, _), shape in zip(self._slices, shapes)]
        self.intercepts = [self.params[b] for _, b in self._slices]
        self.coef_grads = [
            self.grad[w].reshape(shape) for (w, _), shape in zip(self._slices, shapes)
        ]
        self.intercept_grads = [self.grad[b] for _, b in self._slices]
        # alpha at the weights, 0 at the biases: the L2 term is one vector product.
        self._penalty = np.zeros(self.n_params, dtype=self.dtype)
        for w, _ in self._slices:
            self._penalty[w] = self.alpha
        self._penalty_buf = np.empty(self.n_params, dtype=self.dtype)

    def set_params(self, flat: np.ndarray) -> None:
        """Copy ``flat`` into the parameter vector (the views stay valid)."""
        flat = np.asarray(flat)
        if flat.shape != (self.n_params,):
            raise ValueError(f"expected a vector of {self.n_params} parameters, got {flat.shape}")
        self.params[...] = flat

    def initialize(self, random_state: np.random.RandomState) -> None:
        """Glorot-uniform initialisation exactly as scikit-learn's MLP draws it.

        Layer by layer, weights then biases, ``U(-b, b)`` with
        ``b = sqrt(factor / (fan_in + fan_out))``, ``factor`` 2 for a logistic network,
        else 6. Draws in float64 and casts, so float32 and float64 models start from the
        same point.
        """
        factor = 2.0 if self.hidden_activation == "logistic" else 6.0
        for coef, intercept in zip(self.coefs, self.intercepts):
            fan_in, fan_out = coef.shape
            bound = np.sqrt(factor / (fan_in + fan_out))
            coef[...] = random_state.uniform(-bound, bound, (fan_in, fan_out))
            intercept[...] = random_state.uniform(-bound, bound, fan_out)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        # Views and work buffers are rebuilt after unpickling; only the vectors travel.
        for key in (
            "coefs",
            "intercepts",
            "coef_grads",
            "intercept_grads",
            "_penalty",
            "_penalty_buf",
        ):
            state.pop(key, None)
        state["_workspaces"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._bind_views()

    # ----------------------------------------------------------------- forward
    def _workspace(self, n: int) -> _Workspace:
        ws = self._workspaces.get(n)
        if ws is None:
            # Keep at most a few sizes: the batch size and the epoch's last partial batch.
            if len(self._workspaces) >= 4:
                self._workspaces.clear()
            ws = _Workspace(n, self.layer_sizes, self.dtype)
            self._workspaces[n] = ws
        return ws

    def _forward(self, X: np.ndarray, ws: _Workspace) -> np.ndarray:
        """Forward pass of ``X`` into the workspace activations; returns the output."""
        a_prev = X
        last = self.n_layers - 2
        for i, (coef, intercept) in enumerate(zip(self.coefs, self.intercepts)):
            z = ws.activations[i]
            if isinstance(a_prev, np.ndarray):
                np.matmul(a_prev, coef, out=z)
            else:  # scipy sparse input on the first layer
                z[...] = a_prev @ coef
            z += intercept
            if i == last and self.out_activation == "softmax":
                _softmax_inplace(z, ws.ones_out, ws.row_sums, ws.loss_buf)
            else:
                _activate_inplace(self.out_activation if i == last else self.hidden_activation, z)
            a_prev = z
        return a_prev

    def forward(self, X) -> np.ndarray:
        """Output of the network for ``X`` (a new array; safe for any batch size)."""
        # A fresh workspace: the result must not alias the training buffers.
        return self._forward(X, _Workspace(X.shape[0], self.layer_sizes, self.dtype))

    # ---------------------------------------------------------------- backward
    def loss_and_grad(self, X, Y: np.ndarray, n_total: float | None = None) -> float:
        """Loss of the batch and its gradient, written into :attr:`grad`.

        Parameters
        ----------
        X : ndarray or sparse matrix of shape (n, n_features)
            The batch. Must have this model's dtype (dense input).
        Y : ndarray of shape (n, n_outputs) or (n, n_outputs + 1)
            Targets: one-hot for softmax, 0/1 for logistic, values for identity. One
            more column makes them weighted targets (:func:`weighted_targets`): its
            values are the rows' sample weights.
        n_total : float, optional
            Divisor of the gradient and the L2 term; defaults to ``n`` (weighted: the
            batch's sum of weights, as scikit-learn's ``sw_sum``). ``1`` returns sums
            over the rows, for a caller that divides by a total over several batches.

        Returns
        -------
        loss : float
            Data loss plus L2 penalty, as scikit-learn's ``_backprop`` returns it.
        """
        n = X.shape[0]
        Y, weights = split_weights(Y, self.layer_sizes[-1])
        mass = n if weights is None else float(weights.sum())
        if n_total is None:
            # A batch whose weights are all 0 holds no data: only the L2 term, per row.
            n_total = mass if mass > 0 else n
        ws = self._workspace(n)
        out = self._forward(X, ws)
        loss = self._data_loss(Y, out, ws.loss_buf, weights) * (mass / n_total)

        # Output delta: (out - y) for each matching output/loss pair, times the weights.
        delta = ws.deltas[-1]
        np.subtract(out, Y, out=delta)
        if weights is not None:
            delta *= weights[:, None]
        inv_n = 1.0 / n_total
        for i in range(self.n_layers - 2, -1, -1):
            a_in = X if i == 0 else ws.activations[i - 1]
            cg = self.coef_grads[i]
            if isinstance(a_in, np.ndarray):
                np.matmul(a_in.T, delta, out=cg)
            else:
                cg[...] = a_in.T @ delta
            # Column sums as a BLAS product with a ones vector: faster than np.sum(axis=0).
            np.matmul(ws.ones_rows, delta, out=self.intercept_grads[i])
            if i > 0:
                prev = ws.deltas[i - 1]
                np.matmul(delta, self.coefs[i].T, out=prev)
                _backprop_activation_inplace(
                    self.hidden_activation, ws.activations[i - 1], prev, ws.scratch[i - 1]
                )
                delta = prev
        # grad = (grad + alpha * W) / n, with the penalty on weights only.
        if self.alpha:
            loss += self.add_l2_gradient(self.grad) / n_total
        self.grad *= self.dtype.type(inv_n)
        return loss

    def add_l2_gradient(self, grad: np.ndarray) -> float:
        """Add ``alpha * W`` (weights only, not biases) to ``grad`` in place.

        Returns the matching penalty ``0.5 * alpha * ||W||^2``, not yet divided by the
        number of samples.
        """
        np.multiply(self.params, self._penalty, out=self._penalty_buf)
        grad += self._penalty_buf
        return 0.5 * float(np.dot(self._penalty_buf, self.params))

    def _data_loss(
        self, Y: np.ndarray, out: np.ndarray, buf: np.ndarray, weights: np.ndarray | None = None
    ) -> float:
        """Mean data loss of a batch, as scikit-learn's LOSS_FUNCTIONS compute it.

        ``buf`` is scratch of ``out``'s shape and dtype. With ``weights``, the mean is
        weighted by them (scikit-learn's ``np.average(..., weights=sample_weight)``).
        """
        if weights is not None:
            return self._weighted_data_loss(Y, out, weights)
        n = out.shape[0]
        if self.loss_name == "squared_error":
            diff = buf
            np.subtract(Y, out, out=diff)
            return float(np.vdot(diff, diff)) / (2.0 * n)  # sklearn: ((y-p)**2).mean() / 2
        eps = np.finfo(self.dtype).eps
        clipped = buf
        np.clip(out, eps, 1 - eps, out=clipped)
        if self.loss_name == "log_loss":
            if out.shape[1] == 1:  # sklearn appends the complement column
                lp = np.log(clipped)
                lq = np.log1p(-clipped)
                return -float(np.vdot(Y, lp) + np.vdot(1 - Y, lq)) / n
            np.log(clipped, out=clipped)
            return -float(np.vdot(Y, clipped)) / n
        # binary log loss: -(y log p + (1-y) log(1-p)), summed over outputs, mean over rows.
        lq = np.log1p(-clipped)
        np.log(clipped, out=clipped)
        return -float(np.vdot(Y, clipped) + np.vdot(1 - Y, lq)) / n

    def _weighted_data_loss(self, Y: np.ndarray, out: np.ndarray, weights: np.ndarray) -> float:
        """Weighted mean over the rows of each row's data loss (summed over outputs)."""
        total = float(weights.sum())
        if total <= 0:
            return 0.0
        if self.loss_name == "squared_error":
            per_element = 0.5 * (Y - out) ** 2
        else:
            eps = np.finfo(self.dtype).eps
            p = np.clip(out, eps, 1 - eps)
            if self.loss_name == "log_loss" and out.shape[1] > 1:
                per_element = -Y * np.log(p)
            else:  # one logistic output, or binary log loss summed over outputs
                per_element = -(Y * np.log(p) + (1 - Y) * np.log1p(-p))
        return float(np.dot(weights, per_element.sum(axis=1))) / total

    def loss(self, X, Y: np.ndarray) -> float:
        """Loss (with L2) of a whole data set without touching :attr:`grad`.

        ``Y`` may be weighted targets (:func:`weighted_targets`).
        """
        Y, weights = split_weights(Y, self.layer_sizes[-1])
        out = self.forward(X)
        loss = self._data_loss(Y, out, np.empty_like(out), weights)
        if self.alpha:
            mass = X.shape[0] if weights is None else float(weights.sum())
            penalty = np.dot(self.params * self._penalty, self.params)
            loss += 0.5 * float(penalty) / (mass if mass > 0 else X.shape[0])
        return loss


def weighted_targets(Y: np.ndarray, sample_weight: np.ndarray) -> np.ndarray:
    """Encoded targets with the rows' sample weights as one more, last column.

    Weighted targets travel as targets do (staged with their rows, moved with them when
    shares are re-balanced, read again when a lost worker's rows are re-staged), so the
    weights never part from their rows. :meth:`MLP.loss_and_grad` and
    :func:`split_weights` recognise them by their one extra column.

    Parameters
    ----------
    Y : ndarray of shape (n, n_outputs)
        Encoded targets.
    sample_weight : ndarray of shape (n,)
        Non-negative weights.

    Returns
    -------
    weighted : ndarray of shape (n, n_outputs + 1), ``Y``'s dtype, C-contiguous
    """
    return np.ascontiguousarray(np.column_stack([Y, sample_weight]), dtype=Y.dtype)


def split_weights(Y: np.ndarray, n_outputs: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``(targets, weights)`` of targets that may be weighted (:func:`weighted_targets`).

    ``weights`` is None for plain targets of ``n_outputs`` columns; both are views.
    """
    if Y.shape[1] == n_outputs:
        return Y, None
    if Y.shape[1] != n_outputs + 1:
        raise ValueError(
            f"targets have {Y.shape[1]} columns; the model has {n_outputs} outputs "
            f"(or {n_outputs + 1} columns with sample weights)"
        )
    return Y[:, :n_outputs], Y[:, n_outputs]


class _Workspace:
    """Activation, delta and scratch buffers for one batch size (allocated once)."""

    def __init__(self, n: int, layer_sizes: tuple[int, ...], dtype: np.dtype) -> None:
        outs = layer_sizes[1:]
        self.activations = [np.empty((n, k), dtype=dtype) for k in outs]
        self.deltas = [np.empty((n, k), dtype=dtype) for k in outs]
        # Scratch for activation derivatives of the hidden layers.
        self.scratch = [np.empty((n, k), dtype=dtype) for k in outs[:-1]]
        self.loss_buf = np.empty((n, outs[-1]), dtype=dtype)
        self.ones_rows = np.ones(n, dtype=dtype)
        self.ones_out = np.ones(outs[-1], dtype=dtype)
        self.row_sums = np.empty(n, dtype=dtype)


# --------------------------------------------------------------------- optimizers
class _Optimizer:
    """Base of the flat-vector optimizers.

    Parameters
    ----------
    n_params : int
        Length of the parameter vector.
    learning_rate_init : float
        Initial step size.
    dtype : numpy dtype
        Dtype of the state vectors (that of the parameters).
    """

    #: Whether ``sync="hmdspt"`` may scale the workers' local steps
    #: (``TrainerConfig.local_lr_scale``): only where a step is bounded by the learning rate.
    scales_local_steps: bool = False

    def __init__(self, n_params: int, learning_rate_init: float, dtype) -> None:
        self.learning_rate_init = float(learning_rate_init)
        self.learning_rate = float(learning_rate_init)
        self.dtype = np.dtype(dtype)
        self._tmp = np.empty(n_params, dtype=self.dtype)

    def update(self, params: np.ndarray, grad: np.ndarray) -> None:
        raise NotImplementedError

    def iteration_ends(self, time_step: int) -> None:
        """Called at the end of an epoch; ``time_step`` is samples seen so far."""

    def trigger_stopping(self, msg: str, verbose: bool) -> bool:
        """Whether to stop when no improvement was seen (True stops)."""
        if verbose:
            print(msg + " Stopping.")
        return True

    def state_vectors(self) -> dict[str, np.ndarray]:
        """The optimizer's state as named vectors (for checkpoints and transfers)."""
        return {}


class SGDOptimizer(_Optimizer):
    """Stochastic gradient descent with momentum on a flat vector.

    Parameters
    ----------
    n_params : int
        Length of the parameter vector.
    learning_rate_init : float, default=0.1
        Initial step size.
    lr_schedule : {"constant", "adaptive", "invscaling"}, default="constant"
        As scikit-learn's ``learning_rate``.
    momentum : float, default=0.9
        Momentum factor.
    nesterov : bool, default=True
        Use Nesterov's momentum.
    power_t : float, default=0.5
        Exponent of the ``invscaling`` schedule.
    dtype : numpy dtype, default=np.float32
        Dtype of the velocity.
    """

    def __init__(
        self,
        n_params: int,
        learning_rate_init: float = 0.1,
        lr_schedule: str = "constant",
        momentum: float = 0.9,
        nesterov: bool = True,
        power_t: float = 0.5,
        dtype=np.float32,
    ) -> None:
        super().__init__(n_params, learning_rate_init, dtype)
        self.lr_schedule = lr_schedule
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.power_t = float(power_t)
        self.velocity = np.zeros(n_params, dtype=self.dtype)

    def iteration_ends(self, time_step: int) -> None:
        if self.lr_schedule == "invscaling":
            self.learning_rate = self.learning_rate_init / (time_step + 1) ** self.power_t

    def trigger_stopping(self, msg: str, verbose: bool) -> bool:
        if self.lr_schedule != "adaptive":
            if verbose:
                print(msg + " Stopping.")
            return True
        if self.learning_rate <= 1e-6:
            if verbose:
                print(msg + " Learning rate too small. Stopping.")
            return True
        self.learning_rate /= 5.0
        if verbose:
            print(msg + f" Setting learning rate to {self.learning_rate:f}")
        return False

    def update(self, params: np.ndarray, grad: np.ndarray) -> None:
        """``v = m v - lr g``; ``params += v`` (Nesterov: ``params += m v - lr g``)."""
        lr = self.dtype.type(self.learning_rate)
        v, tmp = self.velocity, self._tmp
        v *= self.dtype.type(self.momentum)
        np.multiply(grad, lr, out=tmp)
        v -= tmp
        if self.nesterov:
            # tmp still holds lr * grad: params += m * v - lr * grad.
            params -= tmp
            np.multiply(v, self.dtype.type(self.momentum), out=tmp)
            params += tmp
        else:
            params += v

    def state_vectors(self) -> dict[str, np.ndarray]:
        return {"velocity": self.velocity}


class AdamOptimizer(_Optimizer):
    """Adam (Kingma & Ba 2014) on a flat vector, as scikit-learn's ``AdamOptimizer``.

    Parameters
    ----------
    n_params : int
        Length of the parameter vector.
    learning_rate_init : float, default=0.001
        Step size.
    beta_1, beta_2 : float
        Decay rates of the first and second moment estimates.
    epsilon : float, default=1e-8
        Numerical stability term.
    dtype : numpy dtype, default=np.float32
        Dtype of the moment vectors.
    """

    # A step moves each parameter by about the learning rate whatever the gradient's size,
    # so a larger local step stays bounded (SGD's grows with the gradient and momentum).
    scales_local_steps = True

    def __init__(
        self,
        n_params: int,
        learning_rate_init: float = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-8,
        dtype=np.float32,
    ) -> None:
        super().__init__(n_params, learning_rate_init, dtype)
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.t = 0
        self.ms = np.zeros(n_params, dtype=self.dtype)
        self.vs = np.zeros(n_params, dtype=self.dtype)

    def update(self, params: np.ndarray, grad: np.ndarray) -> None:
        self.t += 1
        b1, b2 = self.beta_1, self.beta_2
        ms, vs, tmp = self.ms, self.vs, self._tmp
        f = self.dtype.type
        ms *= f(b1)
        np.multiply(grad, f(1 - b1), out=tmp)
        ms += tmp
        vs *= f(b2)
        np.multiply(grad, grad, out=tmp)
        tmp *= f(1 - b2)
        vs += tmp
        self.learning_rate = self.learning_rate_init * np.sqrt(1 - b2**self.t) / (1 - b1**self.t)
        # params -= lr_t * m / (sqrt(v) + eps)
        np.sqrt(vs, out=tmp)
        tmp += f(self.epsilon)
        np.divide(ms, tmp, out=tmp)
        tmp *= f(self.learning_rate)
        params -= tmp

    def state_vectors(self) -> dict[str, np.ndarray]:
        return {"ms": self.ms, "vs": self.vs}


def make_optimizer(
    solver: str,
    n_params: int,
    *,
    learning_rate_init: float,
    dtype=np.float32,
    learning_rate: str = "constant",
    momentum: float = 0.9,
    nesterovs_momentum: bool = True,
    power_t: float = 0.5,
    beta_1: float = 0.9,
    beta_2: float = 0.999,
    epsilon: float = 1e-8,
) -> _Optimizer:
    """Build the optimizer named by ``solver`` ("sgd" or "adam") for ``n_params``."""
    if solver == "sgd":
        return SGDOptimizer(
            n_params,
            learning_rate_init,
            lr_schedule=learning_rate,
            momentum=momentum,
            nesterov=nesterovs_momentum,
            power_t=power_t,
            dtype=dtype,
        )
    if solver == "adam":
        return AdamOptimizer(
            n_params, learning_rate_init, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, dtype=dtype
        )
    raise ValueError(f"unknown solver {solver!r}; expected 'sgd' or 'adam'")


class BatchBuffers:
    """Reusable buffers that gather shuffled rows of a batch without allocating.

    Parameters
    ----------
    batch_size : int
        Largest batch the buffers hold.
    n_features, n_outputs : int
        Row widths of the inputs and targets.
    dtype : numpy dtype
        Dtype of both buffers.
    """

    def __init__(self, batch_size: int, n_features: int, n_outputs: int, dtype) -> None:
        self.X = np.empty((batch_size, n_features), dtype=dtype)
        self.Y = np.empty((batch_size, n_outputs), dtype=dtype)

    def fits(self, batch_size: int, n_features: int, n_outputs: int, dtype) -> bool:
        return (
            self.X.shape == (batch_size, n_features)
            and self.Y.shape[1] == n_outputs
            and (self.X.dtype == np.dtype(dtype))
        )


def minibatch_pass(
    model: MLP,
    optimizer: _Optimizer,
    X,
    Y: np.ndarray,
    order: np.ndarray | None,
    batch_size: int,
    buffers: BatchBuffers | None = None,
) -> tuple[float, int]:
    """One pass of mini-batch updates over the rows ``order`` of ``X``, ``Y``.

    The same loop trains in-process (one pass is an epoch) and inside a worker's round
    (one pass is the worker's part of the round).

    Parameters
    ----------
    model : MLP
        Updated in place.
    optimizer : SGDOptimizer or AdamOptimizer
        Updated in place.
    X : ndarray of model.dtype or scipy sparse matrix, shape (n, n_features)
        Inputs.
    Y : ndarray of model.dtype, shape (n, n_outputs)
        Targets, encoded for the model's output (one-hot, 0/1 or values).
    order : ndarray of int or None
        Row indices in the order to visit them; ``None`` visits ``0..n-1`` in order.
    batch_size : int
        Rows per update; the last batch may be smaller.
    buffers : BatchBuffers, optional
        Gather buffers to reuse across calls; allocated here when absent or unfit.

    Returns
    -------
    loss_sum : float
        Sum over batches of ``batch_loss * batch_rows`` (divide by rows for the mean).
    n_steps : int
        Number of optimizer steps taken.
    """
    n = X.shape[0] if order is None else len(order)
    dense = isinstance(X, np.ndarray)
    if dense and order is not None:
        if buffers is None or not buffers.fits(batch_size, X.shape[1], Y.shape[1], X.dtype):
            buffers = BatchBuffers(batch_size, X.shape[1], Y.shape[1], X.dtype)
    loss_sum = 0.0
    n_steps = 0
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        if order is None:
            xb, yb = X[start:stop], Y[start:stop]
        elif dense:
            rows = order[start:stop]
            m = stop - start
            xb, yb = buffers.X[:m], buffers.Y[:m]
            np.take(X, rows, axis=0, out=xb)
            np.take(Y, rows, axis=0, out=yb)
        else:  # sparse rows are gathered by scipy (allocates; dense is the fast path)
            rows = order[start:stop]
            xb, yb = X[rows], Y[rows]
        loss_sum += model.loss_and_grad(xb, yb) * (stop - start)
        optimizer.update(model.params, model.grad)
        n_steps += 1
    return loss_sum, n_steps


def divergence_message(loss_curve: Sequence[float]) -> str | None:
    """A one-line warning when the epoch losses show the fit diverging, else None.

    Diverging means: the last epoch's loss is not finite, or it rose in each of the last
    two epochs and is above the first epoch's loss. A converging fit's loss rises now and
    then from noise, but far below where the first epoch left it (the first epoch's mean
    includes the untrained start); a step size that is too large drives it up and keeps
    it there (Adam with ``learning_rate_init=1e6``: 2.3e9, 1.3e10, 2.4e10, ...).

    Parameters
    ----------
    loss_curve : sequence of float
        Mean training loss of each epoch so far, first epoch first.

    Returns
    -------
    message : str or None

    Examples
    --------
    >>> divergence_message([0.9, 0.5, 0.4]) is None
    True
    >>> print(divergence_message([2.3e9, 1.3e10, 2.4e10]))  # doctest: +ELLIPSIS
    the training loss is diverging: it rose for 2 epochs to 2.4e+10, above the first ...
    """
    if not len(loss_curve):
        return None
    last = float(loss_curve[-1])
    if not math.isfinite(last):
        return (
            f"the training loss is {last} after epoch {len(loss_curve)}: training diverged; "
            "lower learning_rate_init"
        )
    if len(loss_curve) >= 3:
        before, previous, first = (float(loss_curve[i]) for i in (-3, -2, 0))
        if before < previous < last and last > first:
            return (
                f"the training loss is diverging: it rose for 2 epochs to {last:.3g}, above the "
                f"first epoch's {first:.3g}; lower learning_rate_init"
            )
    return None


def training_speed(
    layer_sizes: Sequence[int],
    batch_size: int,
    *,
    hidden_activation: str = "relu",
    out_activation: str = "softmax",
    dtype=np.float32,
    budget_s: float = 0.02,
    seed: int = 0,
) -> float:
    """Rows per second this process trains a network of ``layer_sizes`` at.

    Mini-batch steps on synthetic rows, timed until ``budget_s`` has passed (at least one
    step). The first step's allocations are inside the time, so a network whose one step
    outlasts the budget reads a little slow.

    Parameters
    ----------
    layer_sizes : sequence of int
        Units per layer, input first.
    batch_size : int
        Rows per step.
    hidden_activation, out_activation : str
        As in :class:`MLP`.
    dtype : numpy dtype, default=np.float32
        Of the parameters and rows.
    budget_s : float, default=0.02
        Seconds to time steps for.
    seed : int, default=0
        Seed of the weights and rows.

    Returns
    -------
    rows_per_s : float
    """
    model = MLP(layer_sizes, hidden_activation, out_activation, dtype=dtype)
    model.initialize(np.random.RandomState(seed))
    X = np.random.default_rng(seed).standard_normal((batch_size, model.layer_sizes[0]))
    X = X.astype(model.dtype)
    Y = np.zeros((batch_size, model.layer_sizes[-1]), dtype=model.dtype)
    Y[:, 0] = 1
    steps, start = 0, time.perf_counter()
    while True:
        model.loss_and_grad(X, Y)
        model.params -= model.dtype.type(1e-3) * model.grad  # an SGD step's memory traffic
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s:
            return steps * batch_size / elapsed
