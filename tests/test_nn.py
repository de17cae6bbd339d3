"""The numpy core: gradients, initialisation, optimizers, flat-vector layout."""

import pickle

import numpy as np
import pytest
from sklearn.neural_network._stochastic_optimizers import AdamOptimizer as SkAdam
from sklearn.neural_network._stochastic_optimizers import SGDOptimizer as SkSGD

from hmdspt.core.nn import (
    MLP,
    AdamOptimizer,
    SGDOptimizer,
    make_optimizer,
    minibatch_pass,
    weighted_targets,
)
from hmdspt.core.shard import as_rows

HIDDEN = ["identity", "logistic", "tanh", "relu"]
OUTPUTS = ["softmax", "logistic", "identity"]


def _targets(out_activation, rng, n, k):
    if out_activation == "softmax":
        return np.eye(k)[rng.randint(0, k, n)]
    if out_activation == "logistic":
        return (rng.rand(n, k) > 0.5).astype(float)
    return rng.randn(n, k)


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("out", OUTPUTS)
@pytest.mark.parametrize("alpha", [0.0, 0.3])
def test_gradient_matches_finite_differences(hidden, out, alpha):
    rng = np.random.RandomState(0)
    model = MLP((5, 7, 4, 3), hidden, out, alpha=alpha, dtype=np.float64)
    model.initialize(rng)
    X = rng.randn(11, 5)
    Y = _targets(out, rng, 11, 3)
    model.loss_and_grad(X, Y)
    analytic = model.grad.copy()
    p0 = model.params.copy()
    numeric = np.empty_like(p0)
    h = 1e-6
    for j in range(p0.size):
        model.params[:] = p0
        model.params[j] += h
        up = model.loss(X, Y)
        model.params[j] -= 2 * h
        down = model.loss(X, Y)
        numeric[j] = (up - down) / (2 * h)
    model.params[:] = p0
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("out", [*OUTPUTS, "softmax-1"])
@pytest.mark.parametrize("alpha", [0.0, 0.3])
def test_integer_weights_are_repeated_rows(out, alpha):
    """Weights 0, 1, 2, 3 give the loss and gradient of rows dropped or repeated."""
    rng = np.random.RandomState(2)
    k = 1 if out == "softmax-1" else 3
    act = out.split("-")[0]
    model = MLP((5, 6, k), "tanh", act, alpha=alpha, dtype=np.float64)
    model.initialize(rng)
    X = rng.randn(8, 5)
    Y = _targets(act, rng, 8, k) if k > 1 else (rng.rand(8, 1) > 0.5).astype(float)
    weights = np.array([0, 1, 2, 3, 1, 0, 2, 1], dtype=float)
    repeated = np.repeat(np.arange(8), weights.astype(int))

    weighted_loss = model.loss_and_grad(X, weighted_targets(Y, weights))
    weighted_grad = model.grad.copy()
    loss = model.loss_and_grad(X[repeated], Y[repeated])
    assert weighted_loss == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(weighted_grad, model.grad, rtol=1e-10, atol=1e-14)
    assert model.loss(X, weighted_targets(Y, weights)) == pytest.approx(loss, rel=1e-12)
    # n_total=1: sums over the rows, which a caller divides by the total weight.
    model.loss_and_grad(X, weighted_targets(Y, weights), n_total=1)
    if alpha == 0:
        np.testing.assert_allclose(model.grad / weights.sum(), weighted_grad, rtol=1e-10)


def test_a_batch_of_zero_weights_moves_only_by_the_penalty():
    rng = np.random.RandomState(3)
    model = MLP((4, 3, 2), "relu", "softmax", alpha=0.5, dtype=np.float64)
    model.initialize(rng)
    X, Y = rng.randn(5, 4), np.eye(2)[rng.randint(0, 2, 5)]
    loss = model.loss_and_grad(X, weighted_targets(Y, np.zeros(5)))
    expected = np.zeros_like(model.params)
    penalty = model.add_l2_gradient(expected)  # alpha * W, weights only
    np.testing.assert_allclose(model.grad, expected / 5)  # per row, as an unweighted batch
    assert loss == pytest.approx(penalty / 5)


def test_binary_softmax_single_column_loss_matches_sklearn():
    """A one-column log loss appends the complement column, as scikit-learn does."""
    from sklearn.neural_network._base import log_loss

    rng = np.random.RandomState(1)
    model = MLP((3, 4, 1), "tanh", "softmax", dtype=np.float64)
    model.initialize(rng)
    X = rng.randn(6, 3)
    Y = (rng.rand(6, 1) > 0.5).astype(float)
    out = model.forward(X)
    assert model.loss(X, Y) == pytest.approx(log_loss(Y, out))


def test_parameters_are_views_into_one_vector():
    model = MLP((4, 3, 2))
    assert model.n_params == 4 * 3 + 3 + 3 * 2 + 2
    for arr in model.coefs + model.intercepts:
        assert np.shares_memory(arr, model.params)
    model.params[:] = np.arange(model.n_params)
    assert model.coefs[0][0, 0] == 0 and model.intercepts[0][0] == 12
    model.set_params(np.ones(model.n_params))
    assert (model.coefs[1] == 1).all()
    with pytest.raises(ValueError, match="expected a vector of 23"):
        model.set_params(np.ones(3))


def test_views_survive_pickling():
    model = MLP((4, 3, 2))
    model.initialize(np.random.RandomState(0))
    clone = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(clone.params, model.params)
    clone.params[:] = 0
    assert (clone.coefs[0] == 0).all()  # still views after unpickling


def test_initialization_draws_like_sklearn():
    """Glorot-uniform with the same bounds and draw order as scikit-learn."""
    for activation, factor in [("relu", 6.0), ("logistic", 2.0)]:
        model = MLP((6, 5, 3), activation, "softmax", dtype=np.float64)
        model.initialize(np.random.RandomState(3))
        rs = np.random.RandomState(3)
        for coef, intercept in zip(model.coefs, model.intercepts):
            bound = np.sqrt(factor / sum(coef.shape))
            np.testing.assert_array_equal(coef, rs.uniform(-bound, bound, coef.shape))
            np.testing.assert_array_equal(intercept, rs.uniform(-bound, bound, coef.shape[1]))


def test_float32_and_float64_agree():
    rng = np.random.RandomState(0)
    m32 = MLP((5, 8, 3), "tanh", "softmax", dtype=np.float32)
    m64 = MLP((5, 8, 3), "tanh", "softmax", dtype=np.float64)
    m32.initialize(np.random.RandomState(0))
    m64.initialize(np.random.RandomState(0))
    X = rng.randn(20, 5)
    Y = np.eye(3)[rng.randint(0, 3, 20)]
    l32 = m32.loss_and_grad(X.astype(np.float32), Y.astype(np.float32))
    l64 = m64.loss_and_grad(X, Y)
    assert l32 == pytest.approx(l64, rel=1e-5)
    np.testing.assert_allclose(m32.grad, m64.grad, rtol=1e-3, atol=1e-5)
    assert m32.grad.dtype == np.float32


def _sk_layout(model):
    return [c.copy() for c in model.coefs] + [b.copy() for b in model.intercepts]


def _flat_from_sk(model, arrays):
    n = len(model.coefs)
    flat = []
    for c, b in zip(arrays[:n], arrays[n:]):
        flat += [c.ravel(), b]
    return np.concatenate(flat)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (
            lambda n: SGDOptimizer(n, 0.1, "constant", 0.9, True, dtype=np.float64),
            lambda p: SkSGD(p, 0.1, "constant", 0.9, True),
        ),
        (
            lambda n: SGDOptimizer(n, 0.1, "invscaling", 0.5, False, power_t=0.3, dtype=np.float64),
            lambda p: SkSGD(p, 0.1, "invscaling", 0.5, False, power_t=0.3),
        ),
        (
            lambda n: AdamOptimizer(n, 0.01, 0.8, 0.99, 1e-7, dtype=np.float64),
            lambda p: SkAdam(p, 0.01, 0.8, 0.99, 1e-7),
        ),
    ],
)
def test_optimizers_match_sklearn_step_for_step(ours, theirs):
    rng = np.random.RandomState(0)
    model = MLP((4, 5, 3), dtype=np.float64)
    model.initialize(rng)
    sk_params = _sk_layout(model)
    opt, sk_opt = ours(model.n_params), theirs(sk_params)
    for step in range(5):
        grad = rng.randn(model.n_params)
        sk_grads = [g.copy() for g in _sk_layout_from_flat(model, grad)]
        opt.update(model.params, grad)
        sk_opt.update_params(sk_params, sk_grads)
        opt.iteration_ends(step * 10)
        sk_opt.iteration_ends(step * 10)
        np.testing.assert_allclose(model.params, _flat_from_sk(model, sk_params), rtol=1e-12)


def _sk_layout_from_flat(model, flat):
    saved = model.params.copy()
    model.params[:] = flat
    arrays = _sk_layout(model)
    model.params[:] = saved
    return arrays


def test_adaptive_learning_rate_divides_by_five_then_stops():
    opt = SGDOptimizer(3, 0.01, "adaptive")
    assert opt.trigger_stopping("stall", verbose=False) is False
    assert opt.learning_rate == pytest.approx(0.002)
    opt.learning_rate = 1e-7
    assert opt.trigger_stopping("stall", verbose=False) is True


def test_make_optimizer_rejects_unknown_solver():
    with pytest.raises(ValueError, match="unknown solver 'lbfgs'"):
        make_optimizer("lbfgs", 3, learning_rate_init=0.1)


def test_minibatch_pass_visits_every_row_once_and_counts_steps():
    rng = np.random.RandomState(0)
    model = MLP((3, 4, 2), out_activation="identity", dtype=np.float64)
    model.initialize(rng)
    X = rng.randn(10, 3)
    Y = rng.randn(10, 2)
    opt = SGDOptimizer(model.n_params, 0.0, momentum=0.0, dtype=np.float64)  # lr 0: no change
    order = rng.permutation(10)
    loss_sum, steps = minibatch_pass(model, opt, X, Y, order, batch_size=4)
    assert steps == 3  # 4 + 4 + 2
    assert loss_sum / 10 == pytest.approx(model.loss(X, Y))


def test_training_loop_allocates_nothing_per_batch():
    """Work buffers are allocated once per batch size, not once per mini-batch."""
    import tracemalloc

    rng = np.random.RandomState(0)
    model = MLP((50, 64, 32, 10))
    model.initialize(rng)
    X = rng.randn(4096, 50).astype(np.float32)
    Y = np.eye(10, dtype=np.float32)[rng.randint(0, 10, 4096)]
    opt = AdamOptimizer(model.n_params)
    order = rng.permutation(4096)
    minibatch_pass(model, opt, X, Y, order, 256)  # warm up: buffers for this size
    from hmdspt.core.nn import BatchBuffers

    buffers = BatchBuffers(256, 50, 10, np.float32)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    minibatch_pass(model, opt, X, Y, order, 256, buffers)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename") if s.size_diff > 0)
    # One batch of activations alone is 256 * (64 + 32 + 10) * 4 bytes = 108 KiB; 16 batches
    # allocating would be well over 1 MiB.
    assert grown < 64 * 1024, grown


@pytest.mark.parametrize("bad", [(3,), (3, 0, 2)])
def test_bad_layer_sizes(bad):
    with pytest.raises(ValueError, match="layer_sizes"):
        MLP(bad)


def test_softmax_rows_far_below_the_batch_maximum_stay_exact():
    """The global-max shift falls back to a per-row shift where a row would underflow."""
    from scipy.special import softmax

    from hmdspt.core.nn import _activate_inplace

    logits = np.array([[1000.0, 0.0, -1.0], [0.0, 1.0, 2.0], [-2000.0, -2001.0, -1999.0]])
    for dtype in (np.float32, np.float64):
        z = logits.astype(dtype)
        _activate_inplace("softmax", z)
        np.testing.assert_allclose(z, softmax(logits, axis=1), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("out", ["softmax", "logistic", "identity"])
def test_an_empty_batch_gives_an_empty_output(out):
    # A Dask block a filter emptied: the softmax took the maximum of no values.
    model = MLP((4, 3, 5), out_activation=out)
    model.initialize(np.random.RandomState(0))
    assert model.forward(np.empty((0, 4), model.dtype)).shape == (0, 5)


def test_rows_of_any_array_even_an_empty_one():
    assert as_rows(np.arange(3)).shape == (3, 1)
    assert as_rows(np.empty((0, 4))).shape == (0, 4)
    assert as_rows(np.empty(0)).shape == (0, 1)
    assert as_rows(np.zeros((0, 2, 3))).shape == (0, 6)  # reshape(0, -1) raised here
    assert as_rows(np.zeros((2, 2, 3))).shape == (2, 6)
