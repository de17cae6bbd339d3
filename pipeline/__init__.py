"""HMDSPT: heterogeneous micro-difference synchronous parallel training of BP networks.

Layering (imports point down only):

- core, pure numpy: :mod:`pipeline.nn`, :mod:`pipeline.merge`, :mod:`pipeline.partition`,
  :mod:`pipeline.scoring` (estimators), :mod:`pipeline.runlog`;
- orchestration, Dask: :mod:`pipeline.cluster`, :mod:`pipeline.staging`,
  :mod:`pipeline.worker_tasks`, :mod:`pipeline.trainer`;
- faces: :mod:`pipeline.estimator`, :mod:`pipeline.cli`.
"""

__version__ = "0.1.0"
