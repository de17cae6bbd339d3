"""The Dask layer of HMDSPT: clusters, staging and moving rows, the round loop.

Getting a cluster (:mod:`hmdspt.parallel.cluster`, :mod:`hmdspt.parallel.pools`), what the
client asks of it (:mod:`hmdspt.parallel.client`), reading data on the workers
(:mod:`hmdspt.parallel.readers`), what runs on each block of a user's Dask input
(:mod:`hmdspt.parallel.blocks`), staging shards (:mod:`hmdspt.parallel.shards`) and moving
them (:mod:`hmdspt.parallel.rebalance`), what runs on a worker (:mod:`hmdspt.parallel.worker`),
probing speeds (:mod:`hmdspt.parallel.scoring`), the run's life on the cluster
(:mod:`hmdspt.parallel.lifecycle`) and the trainer (:mod:`hmdspt.parallel.trainer`). It
imports the core and itself, never the faces (estimator, CLI) or the app.
"""
