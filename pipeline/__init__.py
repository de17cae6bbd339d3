"""HMDSPT: heterogeneous micro-difference synchronous parallel training of BP networks.

The import package ``hmdspt`` is built from two folders of the repository (setuptools'
``package-dir``): ``pipeline/`` is ``hmdspt`` and ``app/`` is ``hmdspt.app``. Its layers,
imports pointing down only (``tests/test_layers.py`` checks them):

- :mod:`hmdspt.core` (``pipeline/core/``): the numeric core, numpy only: the network, merging,
  partitioning, speed estimates, the shard, checkpoints and the run log;
- :mod:`hmdspt.parallel` (``pipeline/parallel/``): the Dask layer: clusters, staging and
  moving rows, the worker side, the probe and the trainer;
- the faces: :mod:`hmdspt.estimator`, :mod:`hmdspt.cli` and :mod:`hmdspt.compare`, with the
  simulator :mod:`hmdspt.simulate` (core only) beside them;
- :mod:`hmdspt.app` (``app/``): the Panel monitor, which reads run logs through the core.

The names in ``__all__`` are imported on first use, so that ``import hmdspt.core.runlog``
(the monitor's way in) loads neither scikit-learn nor Dask.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from hmdspt.estimator import BPNNClassifier, BPNNRegressor
    from hmdspt.parallel.cluster import local_cluster
    from hmdspt.parallel.scoring import score_workers

__all__ = ["BPNNClassifier", "BPNNRegressor", "local_cluster", "score_workers"]

# pyproject.toml holds the version; the installation's metadata carries it here.
try:
    __version__ = version("hmdspt")
except PackageNotFoundError:  # put on the path by hand, never installed
    __version__ = "0+unknown"

_LAZY = {
    "BPNNClassifier": "hmdspt.estimator",
    "BPNNRegressor": "hmdspt.estimator",
    "local_cluster": "hmdspt.parallel.cluster",
    "score_workers": "hmdspt.parallel.scoring",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hmdspt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
