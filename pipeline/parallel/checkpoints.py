"""A fit's checkpointable state and the checkpoint files that hold it.

:meth:`hmdspt.parallel.trainer.Trainer.state_dict` is the one definition of what a fit
can be continued from; :func:`state_to_checkpoint` and :func:`checkpoint_to_state` turn
it into the arrays and metadata of a checkpoint file (:mod:`hmdspt.core.checkpoint`) and
back. The file format is unchanged by this split.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hmdspt.core.checkpoint import Checkpoint, model_fingerprint
from hmdspt.core.nn import MLP

__all__ = ["checkpoint_to_state", "fingerprint", "state_to_checkpoint"]


def fingerprint(model: MLP, optimizer_kwargs: dict) -> dict[str, Any]:
    """What a checkpoint must match to be resumed into ``model``."""
    return model_fingerprint(model, optimizer_kwargs.get("solver"))


def state_to_checkpoint(state: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and the metadata of a checkpoint holding ``state`` (a ``state_dict``)."""
    arrays: dict[str, np.ndarray] = {"params": state["params"]}
    for name, vector in state["optimizer"]["vectors"].items():
        arrays[f"optimizer.{name}"] = vector
    if state["momentum"].get("velocity") is not None:
        arrays["momentum.velocity"] = state["momentum"]["velocity"]
    for key, value in state["extra_arrays"].items():
        arrays[f"extra.{key}"] = value
    meta = {
        "run_id": state["run_id"],
        "round_index": state["round_index"],
        "epoch": state["epoch"],
        "epoch_complete": state["epoch_complete"],
        "fingerprint": state["fingerprint"],
        "optimizer": {
            "learning_rate": state["optimizer"]["learning_rate"],
            "t": state["optimizer"]["t"],
        },
        "scores": state["scores"],
        "extra": state["extra"],
    }
    return arrays, meta


def checkpoint_to_state(ckpt: Checkpoint) -> dict[str, Any]:
    """The ``state_dict`` a checkpoint holds (the inverse of :func:`state_to_checkpoint`)."""
    meta, arrays = ckpt.meta, ckpt.arrays
    return {
        "run_id": meta.get("run_id"),
        "fingerprint": meta.get("fingerprint", {}),
        "params": arrays["params"],
        "optimizer": {
            "vectors": {
                k[len("optimizer.") :]: v for k, v in arrays.items() if k.startswith("optimizer.")
            },
            "learning_rate": float(meta["optimizer"]["learning_rate"]),
            "t": meta["optimizer"].get("t"),
        },
        "momentum": {"velocity": arrays.get("momentum.velocity")},
        "round_index": int(meta["round_index"]),
        "epoch": int(meta["epoch"]),
        "epoch_complete": bool(meta["epoch_complete"]),
        "scores": dict(meta.get("scores", {})),
        "extra": dict(meta.get("extra", {})),
        "extra_arrays": {
            k[len("extra.") :]: v for k, v in arrays.items() if k.startswith("extra.")
        },
    }
