"""HMDSPT: heterogeneous micro-difference synchronous parallel training of BP networks.

Layering (imports point down only):

- core, pure numpy: :mod:`hmdspt.core.nn`, :mod:`hmdspt.core.merge`, :mod:`hmdspt.core.partition`,
  :mod:`hmdspt.core.speed` (estimators), :mod:`hmdspt.core.runlog`;
- orchestration, Dask: :mod:`hmdspt.parallel.cluster`, :mod:`hmdspt.parallel.shards`,
  :mod:`hmdspt.parallel.worker`, :mod:`hmdspt.parallel.trainer`;
- faces: :mod:`hmdspt.estimator`, :mod:`hmdspt.cli`.
"""

__version__ = "0.1.0"
