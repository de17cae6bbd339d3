"""``Trainer.state_dict`` / ``load_state_dict``: the one definition of a checkpoint's state
(issue 16.6), on an in-process cluster with equal shares (a fit that repeats exactly)."""

from __future__ import annotations

import numpy as np
import pytest

from hmdspt.core.checkpoint import CheckpointError
from hmdspt.core.nn import MLP
from hmdspt.parallel.trainer import Trainer, TrainerConfig


def _data(n=600):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 6)).astype(np.float32)
    Y = np.eye(3, dtype=np.float32)[(X[:, 0] > 0).astype(int) + (X[:, 1] > 1)]
    return X, Y


def _trainer(client, layers=(6, 8, 3), **config):
    model = MLP(layers)
    model.initialize(np.random.RandomState(0))
    cfg = TrainerConfig(
        partition="equal", ramp_rounds=0, rounds_per_epoch=2, seed=1, warm_start_rows=200, **config
    )
    return Trainer(client, model, {"solver": "adam", "learning_rate_init": 0.01}, 16, cfg)


def test_a_state_dict_continues_the_fit_as_its_checkpoint_file_does(client, tmp_path):
    X, Y = _data()
    first = _trainer(client, checkpoint_dir=str(tmp_path))
    first.fit(X, Y, max_epochs=2)
    state = first.state_dict()
    assert (state["epoch"], state["epoch_complete"], state["round_index"]) == (2, True, 4)

    from_file = _trainer(client, checkpoint_dir=str(tmp_path), resume=True)
    from_file.fit(X, Y, max_epochs=4)

    from_state = _trainer(client)
    from_state.load_state_dict(state)
    np.testing.assert_array_equal(from_state.model.params, first.model.params)
    np.testing.assert_array_equal(from_state.momentum.velocity, first.momentum.velocity)
    assert from_state.driver_optimizer.learning_rate == first.driver_optimizer.learning_rate
    from_state.fit(X, Y, max_epochs=4)

    assert [r.round for r in from_state.history] == [r.round for r in from_file.history]
    assert [r.round for r in from_file.history] == [5, 6, 7, 8]
    assert from_state.model.params.tobytes() == from_file.model.params.tobytes()
    assert from_state.state_dict()["epoch"] == 4


def test_a_state_dict_is_a_copy_and_refuses_another_model(client):
    trainer = _trainer(client)
    state = trainer.state_dict()
    state["params"][...] = 0
    assert trainer.model.params.any()
    with pytest.raises(CheckpointError, match="layer_sizes"):
        _trainer(client, layers=(6, 5, 3)).load_state_dict(trainer.state_dict())
