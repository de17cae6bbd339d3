"""The numeric core of HMDSPT: numpy only, no Dask, no scikit-learn.

The network and its training loop (:mod:`hmdspt.core.nn`), merging and compression of the
workers' deltas (:mod:`hmdspt.core.merge`), row shares and move plans
(:mod:`hmdspt.core.partition`), speed estimates (:mod:`hmdspt.core.speed`), round cost
models (:mod:`hmdspt.core.costs`), the rows one worker holds (:mod:`hmdspt.core.shard`),
checkpoints (:mod:`hmdspt.core.checkpoint`) and the run log (:mod:`hmdspt.core.runlog`).
Everything here runs and is tested without a cluster.
"""
